//! [`HostEngine`]: the [`Engine`] stand-in the tests run every device
//! path on, with no GPU.
//!
//! "Device" memory is host memory, each allocation at a real, 64-byte
//! aligned host address that is its [`DeviceBuf`], so that the device
//! executor's kernel source, built for the host, can run on it
//! ([`HostEngine::with_executor`]); each stream runs its queue in order on
//! a worker thread of its own, with optional random delays, so that a
//! missing dependency gives wrong data (or an error, for pinned memory the
//! host touches while a stream still uses it) instead of passing by luck.
//! Its synchronizing calls check that no stream is parked at a gate or
//! inside an executor kernel the caller may be the one to release (the
//! deadlock a GPU would hang in), and name the caller when one is.
//! Its kernels are the element-at-a-time ones of [`crate::scalar`].
//!
//! Why one file of about 1,150 lines (before its tests): it is one model
//! of a GPU, whose memory, streams, events, gates and the synchronizing
//! check share one state (`State`) and its lock order; cut by concern, each
//! part would reach into the others' fields.

use crate::device::{
    gate_reached, no_executor, DeviceBuf, DevicePtr, Engine, Event, Gate, PinnedBuf, Retired,
    Stream, LEGACY_STREAM,
};
use crate::error::{CudaError, Result};
use crate::executor::{ExecLaunch, Protocol};
use crate::{bad, lock, scalar, DataType, ReduceOp};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A job on a stand-in stream.
type Job = Box<dyn FnOnce() + Send>;
/// A job as enqueued: its argument says "started" (`HostEngine::enqueue`).
type StartedJob = Box<dyn FnOnce(&dyn Fn()) + Send>;

/// How long a stand-in stream waits for an event before it gives up and
/// marks the engine failed (a wait enqueued on an event that is never
/// completed is a bug of the caller; the host hears of it at its next
/// `host_wait`).
const STREAM_WAIT_LIMIT: Duration = Duration::from_secs(60);

struct EventState {
    /// (records, completions): record number n completes when the stream
    /// reaches it.
    counts: Mutex<(u64, u64)>,
    done: Condvar,
}

/// A gate: its word at a stable address (inside the `Arc`), which a
/// kernel reads as its abort word and may write itself; the lock and the
/// condition variable only wake the stand-in's waiters early, who also
/// read the word every [`GATE_POLL`] to see writes made outside them.
struct GateState {
    word: AtomicU32,
    lock: Mutex<()>,
    raised: Condvar,
}

/// How often a stand-in stream waiting at a gate reads its word again.
const GATE_POLL: Duration = Duration::from_millis(1);

/// How often a host wait looks for the engine's fault.
const FAULT_POLL: Duration = Duration::from_millis(5);

/// Who made a call, for the device rule's reports: the innermost frames
/// of the workspace's sources (not the standard library's or other
/// crates'), the stand-in's own left out, innermost first.
fn callers() -> String {
    let trace = format!("{:#}", std::backtrace::Backtrace::force_capture());
    let mut frames = Vec::new();
    let mut name = "";
    for line in trace.lines().map(str::trim) {
        if let Some(path) = line.strip_prefix("at ") {
            let ours = !path.contains("/rustc/") && !path.contains("/.cargo/");
            let own = matches!(name, "callers" | "synchronizing") || name.contains("HostEngine");
            if let (true, false, Some(at)) = (ours, own, path.rfind("/src/")) {
                frames.push(format!("{name} ({})", &path[at + 5..]));
            }
        } else if let Some((_, n)) = line.split_once(" - ") {
            // Without generic arguments: closures' are long.
            name = n.split('<').next().unwrap_or(n);
        }
        if frames.len() == 6 {
            break;
        }
    }
    if frames.is_empty() {
        "(no symbols)".into()
    } else {
        frames.join(" <- ")
    }
}

impl GateState {
    /// Raise the word to `value` unless it has reached it.
    fn raise(&self, value: u32) {
        let _held = lock(&self.lock);
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (!gate_reached(w, value)).then_some(value)
            });
        self.raised.notify_all();
    }

    /// Wait until the word has reached `value`, at most `limit`.
    fn wait(&self, value: u32, limit: Duration) -> std::result::Result<(), ()> {
        let deadline = Instant::now() + limit;
        let mut held = lock(&self.lock);
        while !gate_reached(self.word.load(Ordering::Acquire), value) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(());
            }
            held = self
                .raised
                .wait_timeout(held, left.min(GATE_POLL))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }
}

/// 64 bytes of stand-in device memory: allocations are made of these so
/// that they start 64-byte aligned, as a GPU's do (kernels rely on it).
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Block([u8; 64]);

/// A stand-in device allocation. Its blocks never move (a boxed slice),
/// so their address, the [`DeviceBuf`], stays valid for kernels built for
/// the host until the allocation is freed. The stand-in's own copies take
/// the lock; a kernel reads and writes through the address without it,
/// ordered against the copies by streams and events, as on a GPU.
struct DeviceAlloc {
    blocks: Mutex<Box<[Block]>>,
    /// Bytes asked for: what bounds checks use (the blocks round it up).
    len: usize,
}

impl DeviceAlloc {
    /// `len` bytes (at least one block), each `fill`, and their address.
    fn new(len: usize, fill: u8) -> (u64, DeviceAlloc) {
        let mut blocks = vec![Block([fill; 64]); len.div_ceil(64).max(1)].into_boxed_slice();
        let address = blocks.as_mut_ptr().expose_provenance() as u64;
        let alloc = DeviceAlloc {
            blocks: Mutex::new(blocks),
            len,
        };
        (address, alloc)
    }

    /// `f` on bytes `[offset, offset + bytes)`, or why they are out of
    /// bounds.
    fn with<R>(&self, offset: usize, bytes: usize, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        let end = checked_end(offset, bytes, self.len)?;
        let mut blocks = lock(&self.blocks);
        let mem: &mut [u8] = bytemuck::cast_slice_mut(&mut blocks[..]);
        Ok(f(&mut mem[offset..end]))
    }
}

/// What the stand-in runs for [`Engine::launch_executor`]: in ferroccl's
/// tests, the executor's kernel source built for the host and run with a
/// host thread per GPU thread. An `Err` becomes the engine's fault, which
/// the next `host_wait` reports.
pub type ExecutorHook = Arc<dyn Fn(&ExecLaunch) -> std::result::Result<(), String> + Send + Sync>;

struct PinnedState {
    bytes: Mutex<Vec<u8>>,
    /// Enqueued copies that use the buffer and have not finished.
    in_use: AtomicUsize,
}

struct StreamWorker {
    queue: mpsc::Sender<Job>,
    /// The hardware queue the stream shares with others
    /// ([`HostEngine::with_hardware_queues`]); `None`: not modelled.
    hw: Option<Arc<HwQueue>>,
    thread: JoinHandle<()>,
    /// Jobs enqueued and run, which synchronizing calls and the legacy
    /// default stream wait on.
    progress: Arc<Progress>,
    /// A blocking stream (CUDA's default flag): it and the legacy default
    /// stream wait for each other's earlier work.
    blocking: bool,
}

/// A hardware queue of the stand-in ([`HostEngine::with_hardware_queues`]):
/// work of every stream that shares it starts in the order it was
/// enqueued, as a GPU's front end takes a queue's commands in order; a
/// command that must wait (for an event, a gate, its own stream's previous
/// work) holds back every later one. Counts (tickets given, work
/// started).
#[derive(Default)]
struct HwQueue {
    counts: Mutex<(u64, u64)>,
    moved: Condvar,
    /// Set once a wait in the queue passed the sync limit (reported as the
    /// engine's fault): the queue keeps no order after that, so the host
    /// side can end.
    broken: std::sync::atomic::AtomicBool,
}

impl HwQueue {
    fn ticket(&self) -> u64 {
        let mut c = lock(&self.counts);
        c.0 += 1;
        c.0 - 1
    }

    /// Wait until the work before ticket `t` has started; false where that
    /// took past `limit` (the queue is then broken).
    fn wait_turn(&self, t: u64, limit: Duration) -> bool {
        if self.broken.load(Ordering::Acquire) {
            return true;
        }
        let ok = wait_until(&self.counts, &self.moved, limit, |c| {
            c.1 >= t || self.broken.load(Ordering::Acquire)
        })
        .is_ok();
        if !ok {
            self.broken.store(true, Ordering::Release);
            let _c = lock(&self.counts);
            self.moved.notify_all();
        }
        ok
    }

    /// Ticket `t`'s work has started: the next may start.
    fn start(&self, t: u64) {
        let mut c = lock(&self.counts);
        if c.1 == t {
            c.1 = t + 1;
            self.moved.notify_all();
        }
    }
}

/// A stand-in stream's count of jobs (enqueued, run).
#[derive(Default)]
struct Progress {
    counts: Mutex<(u64, u64)>,
    moved: Condvar,
}

impl Progress {
    /// The number of jobs enqueued so far.
    fn enqueued(&self) -> u64 {
        lock(&self.counts).0
    }

    /// Wait until job `target` has run, at most `limit`.
    fn wait_run(&self, target: u64, limit: Duration) -> std::result::Result<(), ()> {
        wait_until(&self.counts, &self.moved, limit, |c| c.1 >= target)
    }
}

type DeviceMem = Arc<DeviceAlloc>;

struct State {
    /// By address.
    device: Mutex<HashMap<u64, DeviceMem>>,
    pinned: Mutex<HashMap<u64, Arc<PinnedState>>>,
    events: Mutex<HashMap<u64, Arc<EventState>>>,
    gates: Mutex<HashMap<u64, Arc<GateState>>>,
    streams: Mutex<HashMap<u64, StreamWorker>>,
    /// Workers of freed streams, reused by the next `stream` (a call
    /// makes and frees two; spawning threads each time dominated the
    /// tests).
    idle: Mutex<Vec<StreamWorker>>,
    next_id: AtomicU64,
    /// Pinned allocations made so far (tests check that pools reuse them).
    pinned_made: AtomicUsize,
    /// The first failure of a stream's work, reported by `host_wait`.
    fault: Mutex<Option<String>>,
    /// The UUID this stand-in stands under ([`Engine::stand_in_uuid`]).
    uuid: [u8; 16],
    /// Per gate, the value the latest stream wait at it waits for.
    waits: Mutex<HashMap<u64, u32>>,
    /// What was retired while a gate was held; the lock also orders
    /// retiring against new waits at gates.
    retired: Mutex<Vec<Retired>>,
    /// Synchronizing calls made while a gate was held (the device rule).
    violations: Mutex<Vec<String>>,
    /// Executor kernels loaded (a module load synchronizes).
    loaded: Mutex<std::collections::HashSet<(Protocol, Option<ReduceOp>, DataType)>>,
    /// Executor kernels launched and not ended: a kernel may wait for a
    /// peer's kernel that a host thread has yet to launch, so while any
    /// is in flight nothing may wait for every stream (the device rule).
    kernels: Arc<AtomicUsize>,
    /// The first synchronizing call that waited past the sync limit (a
    /// deadlock on a GPU): later synchronizing calls fail at once with it
    /// instead of waiting again, so the error reaches every caller soon.
    deadlock: Mutex<Option<String>>,
    /// A synchronizing call the next `host_wait` makes first (tests: a
    /// breach of the device rule forced on the thread that waits).
    forced: Mutex<Option<&'static str>>,
    /// Threads inside [`HostEngine::blocking_read`]: as a thread in a
    /// pageable copy to the host holds a driver lock while it waits for
    /// its stream (measured on an H200, docs/staging.md), event creation
    /// waits until none is left (`driver_lock`).
    in_driver: Mutex<usize>,
    left_driver: Condvar,
    /// Events given back (`free_event`), taken again before any is made.
    free_events: Mutex<Vec<u64>>,
    /// Events made so far; the first `event_pool` count as made with the
    /// engine, as the CUDA engine makes them, and take no lock.
    events_made: AtomicUsize,
}

impl State {
    fn new() -> State {
        // Distinct per engine of the process, and per process.
        static ENGINES: AtomicU64 = AtomicU64::new(0);
        let mut uuid = [0u8; 16];
        uuid[..4].copy_from_slice(b"FCSI");
        uuid[4..8].copy_from_slice(&std::process::id().to_le_bytes());
        uuid[8..].copy_from_slice(&ENGINES.fetch_add(1, Ordering::Relaxed).to_le_bytes());
        State {
            device: Mutex::default(),
            pinned: Mutex::default(),
            events: Mutex::default(),
            gates: Mutex::default(),
            streams: Mutex::default(),
            idle: Mutex::default(),
            next_id: AtomicU64::new(0),
            pinned_made: AtomicUsize::new(0),
            fault: Mutex::default(),
            uuid,
            waits: Mutex::default(),
            retired: Mutex::default(),
            violations: Mutex::default(),
            loaded: Mutex::default(),
            kernels: Arc::default(),
            deadlock: Mutex::default(),
            forced: Mutex::default(),
            in_driver: Mutex::new(0),
            left_driver: Condvar::new(),
            free_events: Mutex::default(),
            events_made: AtomicUsize::new(0),
        }
    }
}

/// The host stand-in of a GPU (module docs). Without delays its streams
/// still run asynchronously to the host, on threads of their own.
pub struct HostEngine {
    state: Arc<State>,
    /// Each job of a stream first sleeps a random time below this (none
    /// when zero), seeded per stream.
    max_delay: Duration,
    seed: u64,
    /// What `launch_executor` runs; `None`: the stand-in has no executor.
    executor: Option<ExecutorHook>,
    /// The UUID given by [`HostEngine::with_stand_in_uuid`].
    uuid: Option<[u8; 16]>,
    /// How long a synchronizing call waits for the streams before it
    /// reports a deadlock (on a GPU it would wait for ever).
    sync_limit: Duration,
    /// Events made with the engine ([`HostEngine::with_event_pool`]).
    event_pool: usize,
    /// Hardware queues its streams share, in turn
    /// ([`HostEngine::with_hardware_queues`]); empty: not modelled.
    hw_queues: Vec<Arc<HwQueue>>,
    /// Streams made so far (which queue the next one takes).
    streams_made: AtomicUsize,
}

/// How long a stand-in's synchronizing call waits for the streams by
/// default: far above any stream's honest work in the tests.
const SYNC_LIMIT: Duration = Duration::from_secs(20);

/// splitmix64: the stand-in's delays.
fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Default for HostEngine {
    fn default() -> Self {
        Self::new()
    }
}

impl HostEngine {
    /// A stand-in whose streams run their work as soon as they reach it.
    pub fn new() -> Self {
        Self::with_delays(Duration::ZERO, 0)
    }

    /// A stand-in whose streams sleep a random time below `max_delay`
    /// before each job (deterministic per `seed` and stream, though the
    /// interleaving with the host is not), so that work missing a
    /// dependency on another stream or on the host runs too early.
    pub fn with_delays(max_delay: Duration, seed: u64) -> Self {
        HostEngine {
            state: Arc::new(State::new()),
            max_delay,
            seed,
            executor: None,
            uuid: None,
            sync_limit: SYNC_LIMIT,
            event_pool: crate::cuda_engine::EVENT_POOL,
            hw_queues: Vec::new(),
            streams_made: AtomicUsize::new(0),
        }
    }

    /// The stand-in whose streams share `n` hardware queues, given in turn
    /// as streams are made (the legacy default stream takes the first), as
    /// a CUDA context shares `CUDA_DEVICE_MAX_CONNECTIONS` (8 by default)
    /// among its streams: in a queue, work starts in the order it was
    /// enqueued, whatever its stream, so work that waits holds back every
    /// later work of the queue. A wait held back past the sync limit is
    /// the engine's fault (a deadlock on a GPU), named. On an H200 a
    /// stream parked at a gate held back, so, the kernel its gate waited
    /// for (docs/staging.md, "Why device calls block"). Thread ranks
    /// sharing such a stand-in are staged, as on a GPU
    /// ([`Engine::shares_hardware_queues`]). 0: not modelled (the default).
    pub fn with_hardware_queues(mut self, n: usize) -> Self {
        self.hw_queues = (0..n).map(|_| Arc::new(HwQueue::default())).collect();
        self
    }

    /// The queue the next stream made takes.
    fn next_hw_queue(&self, legacy: bool) -> Option<Arc<HwQueue>> {
        if self.hw_queues.is_empty() {
            return None;
        }
        let k = match legacy {
            true => 0,
            false => self.streams_made.fetch_add(1, Ordering::Relaxed),
        };
        Some(self.hw_queues[k % self.hw_queues.len()].clone())
    }

    /// The stand-in with `n` events made with it, as the CUDA engine makes
    /// [`EVENT_POOL`](crate::cuda_engine::EVENT_POOL) (the default), and
    /// reused; past them, making one waits while a thread is inside
    /// [`HostEngine::blocking_read`]. 0: no pool and no reuse, every event
    /// made and destroyed under that lock, as the CUDA engine did before
    /// the first GPU run (tests: the deadlock the pool prevents).
    pub fn with_event_pool(mut self, n: usize) -> Self {
        self.event_pool = n;
        self
    }

    /// Read `bytes` at `src` after the work enqueued on `stream` so far,
    /// waiting for it, as `cuMemcpyDtoH` into pageable host memory does
    /// (cudarc's `clone_dtoh`, torch's `.item()`): while it waits the
    /// thread holds a driver lock that event creation and destruction take
    /// (measured on an H200, docs/staging.md), which the stand-in keeps
    /// too. Waits at most the sync limit, then reports a deadlock.
    pub fn blocking_read(&self, stream: Stream, src: DevicePtr, bytes: usize) -> Result<Vec<u8>> {
        let got = self.enqueue_read(stream, src, bytes)?;
        *lock(&self.state.in_driver) += 1;
        let waited = got.recv_timeout(self.sync_limit);
        *lock(&self.state.in_driver) -= 1;
        self.state.left_driver.notify_all();
        match waited {
            Ok(read) => read.map_err(|why| CudaError::Driver {
                call: "cuMemcpyDtoH (stand-in)",
                reason: why,
            }),
            Err(_) => {
                let why = format!(
                    "a pageable copy to the host waited {:?} for its stream: a deadlock on a \
                     GPU; called from {}",
                    self.sync_limit,
                    callers()
                );
                self.deadlocked(why);
                Err(CudaError::Timeout {
                    what: "cuMemcpyDtoH (stand-in): the stream".into(),
                    waited_ms: self.sync_limit.as_millis() as u64,
                })
            }
        }
    }

    /// A wait that would never end on a GPU: logged, kept as the device's
    /// deadlock (later synchronizing calls fail at once with it) and as
    /// its fault (host waits report it), the first of each kept.
    fn deadlocked(&self, why: String) {
        tracing::error!("stand-in: {why}");
        lock(&self.state.deadlock).get_or_insert(why.clone());
        lock(&self.state.fault).get_or_insert(why);
    }

    /// The driver lock of a call that makes or destroys an event: waits
    /// until no thread is inside [`HostEngine::blocking_read`], at most
    /// half the sync limit; past it the wait is a deadlock, named as a
    /// breach of the device rule.
    fn driver_lock(&self, call: &str) -> Result<()> {
        // Half the reader's limit: the blocked call is named, not the
        // reader, which gives up later.
        let limit = self.sync_limit / 2;
        let deadline = Instant::now() + limit;
        let mut inside = lock(&self.state.in_driver);
        while *inside > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let why = format!(
                    "{call} waited {limit:?} behind a thread that waits inside the driver for \
                     a stream (a pageable copy to the host): a deadlock on a GPU where that \
                     stream waits for this thread (the device rule); called from {}",
                    callers()
                );
                drop(inside);
                lock(&self.state.violations).push(why.clone());
                self.deadlocked(why);
                return Err(CudaError::Timeout {
                    what: format!("{call}: behind a thread waiting inside the driver"),
                    waited_ms: limit.as_millis() as u64,
                });
            }
            inside = self
                .state
                .left_driver
                .wait_timeout(inside, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// The stand-in whose synchronizing calls give up after `limit` (and
    /// report a deadlock) instead of the default 20 s.
    pub fn with_sync_limit(mut self, limit: Duration) -> Self {
        self.sync_limit = limit;
        self
    }

    /// Synchronizing calls made while a gate was held, each named: the
    /// device rule's check (each is also the engine's fault, which the
    /// next `host_wait` reports).
    pub fn violations(&self) -> Vec<String> {
        lock(&self.state.violations).clone()
    }

    /// Make the next `host_wait` called while a gate is held, on whichever
    /// thread, first make the synchronizing call `call` (as a free or an
    /// allocation would): a
    /// test's way to force a breach of the device rule where the library
    /// makes none, and to see that the deadlock it causes reaches every
    /// rank as an error.
    pub fn force_sync_at_next_host_wait(&self, call: &'static str) {
        *lock(&self.state.forced) = Some(call);
    }

    /// A blocking stream (`cuStreamCreate` with the default flag, as
    /// libraries that create raw streams make them; PyTorch's own
    /// `torch.cuda.Stream()` is non-blocking, as [`Engine::stream`]'s
    /// are): it and the legacy default stream
    /// ([`LEGACY_STREAM`]) wait for each other's earlier work.
    pub fn blocking_stream(&self) -> Result<Stream> {
        self.make_stream(true)
    }

    /// Hold `stream` at a job that runs until `release` is dropped or
    /// sent to: earlier work that is slow, not a gate (tests).
    pub fn hold_stream(&self, stream: Stream) -> Result<mpsc::Sender<()>> {
        let (release, wait) = mpsc::channel::<()>();
        let wait = Mutex::new(wait);
        self.run_on(stream, move || {
            let _ = lock(&wait).recv();
            Ok(())
        })?;
        Ok(release)
    }

    /// A call that waits for every stream's work enqueued so far, as CUDA's
    /// synchronizing calls do (the CUDA programming guide: freeing device
    /// or pinned memory, synchronous copies and sets, module loads). Made
    /// while a gate is held it is a breach of the device rule, named in
    /// [`HostEngine::violations`] and the engine's fault; where the wait
    /// does not end within the sync limit it is a deadlock, reported as a
    /// timeout.
    fn synchronizing(&self, call: &str) -> Result<()> {
        if let Some(earlier) = lock(&self.state.deadlock).clone() {
            return Err(CudaError::Driver {
                call: "stand-in synchronizing call",
                reason: format!("{call} refused: the device deadlocked earlier: {earlier}"),
            });
        }
        let held = self.gates_held();
        let kernels = self.state.kernels.load(Ordering::Acquire);
        if held || kernels > 0 {
            let what = if held {
                "a stream waits at a gate: on a GPU it waits for that stream, and the stream \
                 for the gate"
                    .to_string()
            } else {
                format!(
                    "{kernels} executor kernel(s) are in flight: on a GPU it waits for them, and \
                     a kernel may wait for a peer's kernel that this thread is to launch"
                )
            };
            let why = format!(
                "{call} (which waits for every stream of the device) was called while {what} \
                 (the device rule); called from {}",
                callers()
            );
            lock(&self.state.violations).push(why.clone());
            lock(&self.state.fault).get_or_insert(why);
        }
        let snapshot: Vec<(Arc<Progress>, u64)> = lock(&self.state.streams)
            .values()
            .map(|w| (w.progress.clone(), w.progress.enqueued()))
            .collect();
        let deadline = Instant::now() + self.sync_limit;
        for (progress, target) in snapshot {
            let left = deadline.saturating_duration_since(Instant::now());
            if progress.wait_run(target, left).is_err() {
                let why = format!(
                    "{call} waited {:?} for the device's streams: a deadlock on a GPU; called \
                     from {}",
                    self.sync_limit,
                    callers()
                );
                self.deadlocked(why);
                return Err(CudaError::Timeout {
                    what: format!("{call}: the device's streams (a deadlock on a GPU)"),
                    waited_ms: self.sync_limit.as_millis() as u64,
                });
            }
        }
        Ok(())
    }

    /// Free what was retired, if no gate is held and no stream has work
    /// left (a kernel of a peer sharing the device may wait for this
    /// thread without any gate), so that the frees wait for nothing
    /// (`retired` locked).
    fn free_retired(&self, retired: &mut Vec<Retired>) {
        let busy = || {
            lock(&self.state.streams).values().any(|w| {
                let c = lock(&w.progress.counts);
                c.1 < c.0
            })
        };
        if retired.is_empty()
            || self.gates_held()
            || self.state.kernels.load(Ordering::Acquire) > 0
            || busy()
        {
            return;
        }
        for what in retired.drain(..) {
            match what {
                Retired::Device(b) => self.free_device(b),
                Retired::Pinned(b) => self.free_pinned(b),
                Retired::Stream(s) => self.free_stream(s),
            }
        }
    }

    fn make_stream(&self, blocking: bool) -> Result<Stream> {
        let id = self.id();
        let mut worker = self.worker(id, blocking)?;
        worker.hw = self.next_hw_queue(false);
        lock(&self.state.streams).insert(id, worker);
        Ok(Stream(id))
    }

    /// A worker for stream `id`: an idle one, or a new thread.
    fn worker(&self, id: u64, blocking: bool) -> Result<StreamWorker> {
        if let Some(mut worker) = lock(&self.state.idle).pop() {
            worker.blocking = blocking;
            return Ok(worker);
        }
        let (queue, jobs) = mpsc::channel::<Job>();
        let (max, mut rng) = (self.max_delay, self.seed ^ id.wrapping_mul(0x2545_f491));
        let thread = std::thread::Builder::new()
            .name(format!("standin-stream-{id}"))
            .spawn(move || {
                for job in jobs {
                    if !max.is_zero() {
                        // Half of the jobs run at once, the others late.
                        let r = mix(&mut rng);
                        if r & 1 == 0 {
                            let nanos = (r >> 1) % max.as_nanos() as u64;
                            std::thread::sleep(Duration::from_nanos(nanos));
                        }
                    }
                    job();
                }
            })
            .map_err(|e| CudaError::Driver {
                call: "stand-in stream",
                reason: e.to_string(),
            })?;
        Ok(StreamWorker {
            queue,
            hw: None,
            thread,
            progress: Arc::default(),
            blocking,
        })
    }

    /// The stand-in with the device executor: `launch_executor` enqueues a
    /// job that calls `hook` with the launch (whose addresses are this
    /// process's: the stand-in's device memory and gate words).
    pub fn with_executor(mut self, hook: ExecutorHook) -> Self {
        self.executor = Some(hook);
        self
    }

    /// The stand-in under `uuid` in place of its own: processes that
    /// build their stand-ins with one UUID stand for processes sharing one
    /// GPU (the device executor then maps their FIFOs across processes, as
    /// cuda-ipc does). Call it before the engine is shared.
    pub fn with_stand_in_uuid(mut self, uuid: [u8; 16]) -> Self {
        self.uuid = Some(uuid);
        self
    }

    fn id(&self) -> u64 {
        self.state.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn device(&self, buf: DeviceBuf) -> Result<DeviceMem> {
        lock(&self.state.device)
            .get(&buf.0)
            .cloned()
            .ok_or_else(|| bad(format!("no device buffer {}", buf.0)))
    }

    fn pinned(&self, buf: PinnedBuf) -> Result<Arc<PinnedState>> {
        lock(&self.state.pinned)
            .get(&buf.0)
            .cloned()
            .ok_or_else(|| bad(format!("no pinned buffer {}", buf.0)))
    }

    fn event_state(&self, event: Event) -> Result<Arc<EventState>> {
        lock(&self.state.events)
            .get(&event.0)
            .cloned()
            .ok_or_else(|| bad(format!("no event {}", event.0)))
    }

    /// Enqueue `job` on `stream`. Its argument says "started": a job that
    /// waits (`waits`: for an event, a gate) calls it once its wait is
    /// over; any other has started when it is called. Where hardware
    /// queues are modelled, the job first waits for every earlier job of
    /// its queue to have started.
    fn enqueue(&self, stream: Stream, job: StartedJob, waits: bool) -> Result<()> {
        let mut streams = lock(&self.state.streams);
        if stream == LEGACY_STREAM && !streams.contains_key(&0) {
            // The legacy default stream exists from the start on a GPU.
            let mut worker = self.worker(0, true)?;
            worker.hw = self.next_hw_queue(true);
            streams.insert(0, worker);
        }
        let worker = streams
            .get(&stream.0)
            .ok_or_else(|| bad(format!("no stream {}", stream.0)))?;
        // The legacy default stream's implicit waits: its work after every
        // blocking stream's earlier work, a blocking stream's after its.
        let after: Vec<(Arc<Progress>, u64)> = if stream == LEGACY_STREAM {
            streams
                .iter()
                .filter(|(&id, w)| id != 0 && w.blocking)
                .map(|(_, w)| (w.progress.clone(), w.progress.enqueued()))
                .collect()
        } else if worker.blocking {
            streams
                .get(&0)
                .map(|w| (w.progress.clone(), w.progress.enqueued()))
                .into_iter()
                .collect()
        } else {
            Vec::new()
        };
        let progress = worker.progress.clone();
        lock(&progress.counts).0 += 1;
        let state = Arc::downgrade(&self.state);
        let counted = progress.clone();
        let turn = worker.hw.clone().map(|q| {
            let t = q.ticket();
            (q, t)
        });
        let limit = self.sync_limit;
        let sent = worker.queue.send(Box::new(move || {
            if let Some((q, t)) = &turn {
                if !q.wait_turn(*t, limit) {
                    if let Some(state) = state.upgrade() {
                        lock(&state.fault).get_or_insert(format!(
                            "a stream's work waited {limit:?} in a hardware queue it shares \
                             with other streams, behind work that waits (a deadlock on a GPU)"
                        ));
                    }
                }
            }
            let started = || {
                if let Some((q, t)) = &turn {
                    q.start(*t);
                }
            };
            for (p, target) in after {
                if p.wait_run(target, STREAM_WAIT_LIMIT).is_err() {
                    if let Some(state) = state.upgrade() {
                        lock(&state.fault).get_or_insert(format!(
                            "a stream waited {STREAM_WAIT_LIMIT:?} for the legacy default \
                             stream's order"
                        ));
                    }
                }
            }
            if !waits {
                started();
            }
            job(&started);
            started();
            let mut c = lock(&counted.counts);
            c.1 += 1;
            counted.moved.notify_all();
        }));
        if sent.is_err() {
            let mut c = lock(&progress.counts);
            c.0 -= 1;
            return Err(bad(format!("stream {} has stopped", stream.0)));
        }
        Ok(())
    }

    /// Pinned buffers allocated so far by this engine.
    pub fn pinned_allocations(&self) -> usize {
        self.state.pinned_made.load(Ordering::Relaxed)
    }

    /// Write device memory from the host, synchronously (tests set inputs
    /// with it; a real engine's caller would use a copy).
    pub fn write_device(&self, dst: DevicePtr, data: &[u8]) -> Result<()> {
        self.device(dst.buf)?
            .with(dst.offset, data.len(), |m| m.copy_from_slice(data))
    }

    /// Enqueue on `stream` a write of `data` at `dst`, as a kernel of the
    /// caller's would write it (tests set inputs with it: no pinned memory
    /// is made, which would wait for every stream).
    pub fn enqueue_write(&self, stream: Stream, dst: DevicePtr, data: &[u8]) -> Result<()> {
        let (mem, data) = (self.device(dst.buf)?, data.to_vec());
        self.run_on(stream, move || write_at(&mem, dst.offset, &data))
    }

    /// Enqueue on `stream` a read of `bytes` at `src`, as a kernel of the
    /// caller's would read it; the bytes arrive on the receiver when the
    /// stream gets there (tests read results with it).
    pub fn enqueue_read(
        &self,
        stream: Stream,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<mpsc::Receiver<std::result::Result<Vec<u8>, String>>> {
        let mem = self.device(src.buf)?;
        let (send, got) = mpsc::channel();
        self.run_on(stream, move || {
            let _ = send.send(read_at(&mem, src.offset, bytes));
            Ok(())
        })?;
        Ok(got)
    }

    /// Read device memory from the host, synchronously.
    pub fn read_device(&self, src: DevicePtr, bytes: usize) -> Result<Vec<u8>> {
        self.device(src.buf)?
            .with(src.offset, bytes, |m| m.to_vec())
    }
}

fn checked_end(offset: usize, bytes: usize, len: usize) -> Result<usize> {
    offset
        .checked_add(bytes)
        .filter(|&end| end <= len)
        .ok_or_else(|| bad(format!("{bytes} bytes at {offset} past the end of {len}")))
}

impl Drop for HostEngine {
    fn drop(&mut self) {
        // The engine's end: what was retired goes now, held gates or not.
        let retired: Vec<Retired> = lock(&self.state.retired).drain(..).collect();
        for what in retired {
            match what {
                Retired::Device(b) => {
                    lock(&self.state.device).remove(&b.0);
                }
                Retired::Pinned(b) => {
                    lock(&self.state.pinned).remove(&b.0);
                }
                // Joined with every stream below.
                Retired::Stream(_) => {}
            }
        }
        let workers: Vec<StreamWorker> =
            lock(&self.state.streams).drain().map(|(_, w)| w).collect();
        for worker in workers {
            drop(worker.queue);
            let _ = worker.thread.join();
        }
    }
}

/// Read `bytes` at `src` (a copy: the lock is not held while the caller
/// writes elsewhere, so `dst` may be the same allocation).
fn read_at(mem: &DeviceMem, src: usize, bytes: usize) -> std::result::Result<Vec<u8>, String> {
    mem.with(src, bytes, |m| m.to_vec())
        .map_err(|e| e.to_string())
}

fn write_at(mem: &DeviceMem, dst: usize, data: &[u8]) -> std::result::Result<(), String> {
    mem.with(dst, data.len(), |m| m.copy_from_slice(data))
        .map_err(|e| e.to_string())
}

impl HostEngine {
    /// Enqueue `job` on `stream`; a failure it returns becomes the engine's
    /// fault, which the next `host_wait` reports.
    fn run_on(
        &self,
        stream: Stream,
        job: impl FnOnce() -> std::result::Result<(), String> + Send + 'static,
    ) -> Result<()> {
        self.run_on_waiting(stream, false, move |_| job())
    }

    /// [`HostEngine::run_on`] for a job that waits (`waits`): it calls
    /// its argument once its wait is over (the hardware queue's next work
    /// may start then).
    fn run_on_waiting(
        &self,
        stream: Stream,
        waits: bool,
        job: impl FnOnce(&dyn Fn()) -> std::result::Result<(), String> + Send + 'static,
    ) -> Result<()> {
        let state = Arc::downgrade(&self.state);
        self.enqueue(
            stream,
            Box::new(move |started: &dyn Fn()| {
                if let Err(why) = job(started) {
                    if let Some(state) = state.upgrade() {
                        lock(&state.fault).get_or_insert(why);
                    }
                }
            }),
            waits,
        )
    }
}

impl Engine for HostEngine {
    fn alloc_device(&self, bytes: usize) -> Result<DeviceBuf> {
        // Conservatively synchronizing (cuMemAlloc may be, by the guide).
        self.synchronizing("cuMemAlloc")?;
        self.alloc_now(bytes)
    }

    fn alloc_device_async(&self, stream: Stream, bytes: usize) -> Result<DeviceBuf> {
        // The address is the stream's from its next job on; the stand-in
        // makes it at once (nothing may use it earlier anyway).
        if !lock(&self.state.streams).contains_key(&stream.0) && stream != LEGACY_STREAM {
            return Err(bad(format!("no stream {}", stream.0)));
        }
        self.alloc_now(bytes)
    }

    fn free_device_async(&self, stream: Stream, buf: DeviceBuf) -> Result<()> {
        self.device(buf)?;
        let state = Arc::downgrade(&self.state);
        self.run_on(stream, move || {
            if let Some(state) = state.upgrade() {
                lock(&state.device).remove(&buf.0);
            }
            Ok(())
        })
    }

    fn retire(&self, what: Retired) {
        let mut retired = lock(&self.state.retired);
        retired.push(what);
        self.free_retired(&mut retired);
    }

    fn gates_held(&self) -> bool {
        let waits: Vec<(u64, u32)> = lock(&self.state.waits)
            .iter()
            .map(|(&g, &v)| (g, v))
            .collect();
        waits.into_iter().any(|(g, v)| {
            self.gate_state(Gate(g))
                .is_ok_and(|s| !gate_reached(s.word.load(Ordering::Acquire), v))
        })
    }

    fn synchronize(&self, call: &'static str) -> Result<()> {
        self.synchronizing(call)
    }

    fn prepare_executor(
        &self,
        protocol: Protocol,
        op: Option<ReduceOp>,
        ty: DataType,
    ) -> Result<()> {
        if self.executor.is_none() {
            return Err(no_executor("prepare"));
        }
        if lock(&self.state.loaded).contains(&(protocol, op, ty)) {
            return Ok(());
        }
        self.synchronizing("cuModuleLoadData (the executor kernel)")?;
        lock(&self.state.loaded).insert((protocol, op, ty));
        Ok(())
    }

    fn free_device(&self, buf: DeviceBuf) {
        let _ = self.synchronizing("cuMemFree");
        lock(&self.state.device).remove(&buf.0);
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuf> {
        self.synchronizing("cuMemHostAlloc")?;
        let id = self.id();
        self.state.pinned_made.fetch_add(1, Ordering::Relaxed);
        let state = PinnedState {
            bytes: Mutex::new(vec![0x5A; bytes]),
            in_use: AtomicUsize::new(0),
        };
        lock(&self.state.pinned).insert(id, Arc::new(state));
        Ok(PinnedBuf(id))
    }

    fn free_pinned(&self, buf: PinnedBuf) {
        let _ = self.synchronizing("cuMemFreeHost");
        lock(&self.state.pinned).remove(&buf.0);
    }

    fn with_pinned(&self, buf: PinnedBuf, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let pinned = self.pinned(buf)?;
        if pinned.in_use.load(Ordering::Acquire) > 0 {
            return Err(bad(format!(
                "pinned buffer {} touched by the host while a copy still uses it",
                buf.0
            )));
        }
        f(&mut lock(&pinned.bytes));
        Ok(())
    }

    fn stream(&self) -> Result<Stream> {
        // Non-blocking, as the CUDA engine makes its own streams.
        self.make_stream(false)
    }

    fn free_stream(&self, stream: Stream) {
        if stream == LEGACY_STREAM {
            return;
        }
        // Conservatively synchronizing, as the issue of the device rule
        // lists it.
        let _ = self.synchronizing("cuStreamDestroy");
        let worker = lock(&self.state.streams).remove(&stream.0);
        if let Some(worker) = worker {
            // Its queue runs out first (a wait in it is bounded by
            // STREAM_WAIT_LIMIT), then the worker serves the next stream.
            let (done, drained) = mpsc::channel::<()>();
            let sent = worker.queue.send(Box::new(move || {
                let _ = done.send(());
            }));
            if sent.is_ok() && drained.recv().is_ok() {
                lock(&self.state.idle).push(worker);
            } else {
                drop(worker.queue);
                let _ = worker.thread.join();
            }
        }
    }

    /// A given-back event first, then one of the pool made with the
    /// engine; past those (at once without a pool: nothing is given
    /// back), made under the driver lock.
    fn event(&self) -> Result<Event> {
        let id = match lock(&self.state.free_events).pop() {
            Some(id) => id,
            None => {
                if self.state.events_made.fetch_add(1, Ordering::AcqRel) >= self.event_pool {
                    self.driver_lock("cuEventCreate")?;
                }
                self.id()
            }
        };
        // Fresh: as an event never recorded, complete.
        let state = EventState {
            counts: Mutex::new((0, 0)),
            done: Condvar::new(),
        };
        lock(&self.state.events).insert(id, Arc::new(state));
        Ok(Event(id))
    }

    /// Given back for reuse, never destroyed (as the CUDA engine does).
    /// Without a pool (`with_event_pool(0)`, the CUDA engine before the
    /// first GPU run) every event is made and destroyed under the lock.
    fn free_event(&self, event: Event) {
        if self.event_pool == 0 {
            let _ = self.driver_lock("cuEventDestroy");
            lock(&self.state.events).remove(&event.0);
            return;
        }
        if lock(&self.state.events).remove(&event.0).is_some() {
            lock(&self.state.free_events).push(event.0);
        }
    }

    fn d2h(
        &self,
        stream: Stream,
        dst: PinnedBuf,
        dst_off: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        let (mem, pinned) = (self.device(src.buf)?, self.pinned(dst)?);
        pinned.in_use.fetch_add(1, Ordering::AcqRel);
        self.run_on(stream, move || {
            let result = read_at(&mem, src.offset, bytes).and_then(|data| {
                let mut host = lock(&pinned.bytes);
                let end = checked_end(dst_off, bytes, host.len()).map_err(|e| e.to_string())?;
                host[dst_off..end].copy_from_slice(&data);
                Ok(())
            });
            pinned.in_use.fetch_sub(1, Ordering::AcqRel);
            result
        })
    }

    fn h2d(
        &self,
        stream: Stream,
        dst: DevicePtr,
        src: PinnedBuf,
        src_off: usize,
        bytes: usize,
    ) -> Result<()> {
        let (mem, pinned) = (self.device(dst.buf)?, self.pinned(src)?);
        pinned.in_use.fetch_add(1, Ordering::AcqRel);
        self.run_on(stream, move || {
            let data = {
                let host = lock(&pinned.bytes);
                checked_end(src_off, bytes, host.len())
                    .map(|end| host[src_off..end].to_vec())
                    .map_err(|e| e.to_string())
            };
            let result = data.and_then(|data| write_at(&mem, dst.offset, &data));
            pinned.in_use.fetch_sub(1, Ordering::AcqRel);
            result
        })
    }

    fn write_scalar(&self, stream: Stream, dst: DevicePtr, value: &[u8]) -> Result<()> {
        if !matches!(value.len(), 1 | 2 | 4 | 8) {
            return Err(bad(format!("a scalar of {} bytes", value.len())));
        }
        let (mem, data) = (self.device(dst.buf)?, value.to_vec());
        self.run_on(stream, move || write_at(&mem, dst.offset, &data))
    }

    fn d2d(&self, stream: Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        if dst.overlaps(bytes, src, bytes) {
            return Err(bad("d2d between overlapping regions".into()));
        }
        let (to, from) = (self.device(dst.buf)?, self.device(src.buf)?);
        self.run_on(stream, move || {
            let data = read_at(&from, src.offset, bytes)?;
            write_at(&to, dst.offset, &data)
        })
    }

    fn reduce(
        &self,
        stream: Stream,
        op: ReduceOp,
        ty: DataType,
        dst: DevicePtr,
        a: DevicePtr,
        b: DevicePtr,
        count: usize,
    ) -> Result<()> {
        let bytes = count * ty.size();
        for src in [a, b] {
            if dst != src && dst.overlaps(bytes, src, bytes) {
                return Err(bad("reduce: dst overlaps an operand elsewhere".into()));
            }
        }
        let (to, x, y) = (
            self.device(dst.buf)?,
            self.device(a.buf)?,
            self.device(b.buf)?,
        );
        self.run_on(stream, move || {
            let xa = read_at(&x, a.offset, bytes)?;
            let yb = read_at(&y, b.offset, bytes)?;
            let mut out = vec![0u8; bytes];
            scalar::reduce(op, ty, &mut out, &xa, &yb);
            write_at(&to, dst.offset, &out)
        })
    }

    fn avg_finish(
        &self,
        stream: Stream,
        ty: DataType,
        buf: DevicePtr,
        count: usize,
        ranks: usize,
    ) -> Result<()> {
        if ranks == 0 {
            return Err(bad("avg over 0 ranks".into()));
        }
        let mem = self.device(buf.buf)?;
        self.run_on(stream, move || {
            let mut data = read_at(&mem, buf.offset, count * ty.size())?;
            scalar::divide(ty, &mut data, ranks);
            write_at(&mem, buf.offset, &data)
        })
    }

    fn record(&self, event: Event, stream: Stream) -> Result<()> {
        let state = self.event_state(event)?;
        let n = {
            let mut counts = lock(&state.counts);
            counts.0 += 1;
            counts.0
        };
        self.run_on(stream, move || {
            let mut counts = lock(&state.counts);
            counts.1 = counts.1.max(n);
            state.done.notify_all();
            Ok(())
        })
    }

    fn stream_wait(&self, stream: Stream, event: Event) -> Result<()> {
        let state = self.event_state(event)?;
        let target = lock(&state.counts).0;
        self.run_on_waiting(stream, true, move |started| {
            let waited = wait_for(&state, target, STREAM_WAIT_LIMIT).map_err(|_| {
                format!(
                    "a stream waited {STREAM_WAIT_LIMIT:?} for event {}",
                    event.0
                )
            });
            started();
            waited
        })
    }

    fn host_wait(&self, event: Event, timeout: Duration) -> Result<()> {
        let armed = lock(&self.state.forced).is_some();
        let forced = match armed && self.gates_held() {
            true => lock(&self.state.forced).take(),
            false => None,
        };
        if let Some(call) = forced {
            self.synchronizing(call)?;
        }
        let state = self.event_state(event)?;
        let target = lock(&state.counts).0;
        // In slices: a fault (a deadlock the stand-in found, a breach of
        // the device rule) is reported as soon as it is set, not after
        // work that may never end.
        let deadline = Instant::now() + timeout;
        let waited = loop {
            if lock(&self.state.fault).is_some() {
                break Err(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match wait_for(&state, target, left.min(FAULT_POLL)) {
                Ok(()) => break Ok(()),
                Err(()) if left <= FAULT_POLL => break Err(()),
                Err(()) => {}
            }
        };
        if let Some(fault) = lock(&self.state.fault).clone() {
            return Err(CudaError::Driver {
                call: "stand-in stream",
                reason: fault,
            });
        }
        waited.map_err(|()| CudaError::Timeout {
            what: format!("event {}", event.0),
            waited_ms: timeout.as_millis() as u64,
        })
    }

    fn gate(&self) -> Result<Gate> {
        let id = self.id();
        let state = GateState {
            word: AtomicU32::new(0),
            lock: Mutex::new(()),
            raised: Condvar::new(),
        };
        lock(&self.state.gates).insert(id, Arc::new(state));
        Ok(Gate(id))
    }

    fn stream_wait_gate(
        &self,
        stream: Stream,
        gate: Gate,
        value: u32,
        limit: Duration,
    ) -> Result<()> {
        let state = self.gate_state(gate)?;
        // Under the lock of what is retired: a free that found no gate
        // held ends before a stream parks.
        let _retired = lock(&self.state.retired);
        lock(&self.state.waits).insert(gate.0, value);
        // Bounded like a CUDA engine's fallback: past `limit` the stream
        // goes on (the call's error reaches the host through its result).
        self.run_on_waiting(stream, true, move |started| {
            let _ = state.wait(value, limit);
            started();
            Ok(())
        })
    }

    fn raise_gate(&self, gate: Gate, value: u32) {
        if let Ok(state) = self.gate_state(gate) {
            state.raise(value);
        }
        self.free_retired(&mut lock(&self.state.retired));
    }

    fn runs_executor(&self) -> bool {
        self.executor.is_some()
    }

    fn gate_device_address(&self, gate: Gate) -> Result<u64> {
        let state = self.gate_state(gate)?;
        // The word lives as long as the engine (gates are never freed).
        Ok(state.word.as_ptr().expose_provenance() as u64)
    }

    fn launch_executor(&self, stream: Stream, launch: &ExecLaunch) -> Result<()> {
        let Some(hook) = self.executor.clone() else {
            return Err(no_executor("launch"));
        };
        if launch.channels == 0 {
            return Err(bad("a program has at least one channel".into()));
        }
        // The first launch of a kernel loads its module (synchronizing)
        // unless `prepare_executor` did.
        self.prepare_executor(launch.protocol, launch.op, launch.ty)?;
        let launch = *launch;
        // Counted in flight from here to its end, under the lock of what
        // is retired: a free that found no kernel in flight ends first.
        let _retired = lock(&self.state.retired);
        let kernels = self.state.kernels.clone();
        kernels.fetch_add(1, Ordering::AcqRel);
        let ended = kernels.clone();
        let enqueued = self.run_on(stream, move || {
            let result = hook(&launch);
            ended.fetch_sub(1, Ordering::AcqRel);
            result
        });
        if enqueued.is_err() {
            kernels.fetch_sub(1, Ordering::AcqRel);
        }
        enqueued
    }

    fn stream_raise_gate(&self, stream: Stream, gate: Gate, value: u32) -> Result<()> {
        let state = self.gate_state(gate)?;
        self.run_on(stream, move || {
            state.raise(value);
            Ok(())
        })
    }

    fn stand_in_uuid(&self) -> Option<[u8; 16]> {
        Some(self.uuid.unwrap_or(self.state.uuid))
    }

    fn shares_hardware_queues(&self) -> bool {
        !self.hw_queues.is_empty()
    }
}

impl HostEngine {
    fn alloc_now(&self, bytes: usize) -> Result<DeviceBuf> {
        // Not zeroed on a GPU: fill with a pattern so that reading what
        // was never written shows.
        let (address, alloc) = DeviceAlloc::new(bytes, 0xA5);
        lock(&self.state.device).insert(address, Arc::new(alloc));
        Ok(DeviceBuf(address))
    }

    fn gate_state(&self, gate: Gate) -> Result<Arc<GateState>> {
        lock(&self.state.gates)
            .get(&gate.0)
            .cloned()
            .ok_or_else(|| bad(format!("no gate {}", gate.0)))
    }
}

/// Wait until record `target` of an event has completed, at most `limit`.
fn wait_for(state: &EventState, target: u64, limit: Duration) -> std::result::Result<(), ()> {
    wait_until(&state.counts, &state.done, limit, |c| c.1 >= target)
}

/// Wait on `cv` until `done` holds for the value behind `m`, at most
/// `limit`.
fn wait_until<T>(
    m: &Mutex<T>,
    cv: &Condvar,
    limit: Duration,
    done: impl Fn(&T) -> bool,
) -> std::result::Result<(), ()> {
    let deadline = Instant::now() + limit;
    let mut value = lock(m);
    while !done(&value) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(());
        }
        value = cv
            .wait_timeout(value, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    /// The host may not touch a pinned buffer a queued copy still uses,
    /// and a wait never blocks past its deadline.
    #[test]
    fn pinned_in_use_is_refused_and_waits_are_bounded() {
        let engine = HostEngine::new();
        let s = engine.stream().unwrap();
        let blocker = engine.event().unwrap();
        let never = engine.event().unwrap();
        // Allocated first: an allocation waits for every stream (the
        // device rule), the stuck one too.
        let dev = engine.alloc_device(16).unwrap();
        let pin = engine.alloc_pinned(16).unwrap();
        // A stream stuck on an event recorded on a second stream that
        // itself waits for the host's go.
        let gate = engine.stream().unwrap();
        let (go, wait) = mpsc::channel::<()>();
        let wait = Mutex::new(wait);
        engine
            .run_on(gate, move || {
                let _ = lock(&wait).recv();
                Ok(())
            })
            .unwrap();
        engine.record(blocker, gate).unwrap();
        engine.stream_wait(s, blocker).unwrap();
        engine.d2h(s, pin, 0, DevicePtr::new(dev), 16).unwrap();
        engine.record(never, s).unwrap();
        let err = engine.with_pinned(pin, &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("still uses it"), "{err}");
        let started = Instant::now();
        let err = engine
            .host_wait(never, Duration::from_millis(50))
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
        go.send(()).unwrap();
        engine.host_wait(never, T).unwrap();
        engine
            .with_pinned(pin, &mut |h| assert_eq!(h, &[0xA5; 16][..]))
            .unwrap();
    }

    /// Device allocations sit at distinct, 64-byte aligned host addresses
    /// (in every engine of the process, zero bytes included) that are
    /// their `DeviceBuf`: what a kernel writes there, the engine reads.
    #[test]
    fn device_addresses_are_real_aligned_and_distinct() {
        let (a, b) = (HostEngine::new(), HostEngine::new());
        let mut bufs = Vec::new();
        for (e, bytes) in [(&a, 0), (&a, 0), (&a, 1), (&a, 100), (&b, 0), (&b, 64)] {
            let buf = e.alloc_device(bytes).unwrap();
            assert_eq!(buf.0 % 64, 0, "{bytes} bytes at {:#x}", buf.0);
            bufs.push((e, buf, bytes));
        }
        let mut addresses: Vec<u64> = bufs.iter().map(|(_, b, _)| b.0).collect();
        addresses.sort_unstable();
        addresses.dedup();
        assert_eq!(addresses.len(), bufs.len(), "an address given twice");
        let (e, buf, _) = bufs[3];
        let at = DevicePtr::new(buf).add(5);
        assert_eq!(e.device_address(at), buf.0 + 5);
        let data: Vec<u8> = (1..=40).collect();
        // SAFETY: bytes 5..45 of a live 100-byte allocation of `e`, which
        // nothing else touches meanwhile.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                std::ptr::with_exposed_provenance_mut::<u8>(e.device_address(at) as usize),
                data.len(),
            );
        }
        assert_eq!(e.read_device(at, 40).unwrap(), data);
        assert_eq!(e.read_device(DevicePtr::new(buf), 5).unwrap(), [0xA5; 5]);
        assert_eq!(e.read_device(at.add(40), 55).unwrap(), [0xA5; 55]);
        // The bounds are the bytes asked for, not the blocks behind them.
        assert!(e.read_device(at, 96).is_err());
        assert!(e.read_device(DevicePtr::new(bufs[0].1), 1).is_err());
        for (e, buf, _) in bufs {
            e.free_device(buf);
        }
    }

    /// Reads the word at a gate's device address, as a kernel would.
    fn gate_word(e: &HostEngine, gate: Gate) -> u32 {
        let at = e.gate_device_address(gate).unwrap();
        // SAFETY: the address of a live gate's AtomicU32 (gates live as
        // long as the engine); read atomically.
        unsafe { AtomicU32::from_ptr(std::ptr::with_exposed_provenance_mut(at as usize)) }
            .load(Ordering::Acquire)
    }

    /// A gate's address holds its word: raises show there (never going
    /// back), and a write there (a kernel's abort) releases a stream
    /// waiting at the gate.
    #[test]
    fn the_gate_address_holds_the_word() {
        let e = HostEngine::new();
        let (g, h) = (e.gate().unwrap(), e.gate().unwrap());
        let (ag, ah) = (
            e.gate_device_address(g).unwrap(),
            e.gate_device_address(h).unwrap(),
        );
        assert_ne!(ag, ah);
        assert_eq!(ag % 4, 0);
        assert_eq!(gate_word(&e, g), 0);
        e.raise_gate(g, 5);
        assert_eq!(gate_word(&e, g), 5);
        e.raise_gate(g, 3);
        assert_eq!(gate_word(&e, g), 5, "a gate went back");
        assert_eq!(gate_word(&e, h), 0);
        let s = e.stream().unwrap();
        let done = e.event().unwrap();
        e.stream_wait_gate(s, h, 2, T).unwrap();
        e.record(done, s).unwrap();
        assert!(e.host_wait(done, Duration::from_millis(30)).is_err());
        // SAFETY: as in `gate_word`: a live gate's word, written
        // atomically, as the kernel raises its abort word.
        unsafe { AtomicU32::from_ptr(std::ptr::with_exposed_provenance_mut(ah as usize)) }
            .store(2, Ordering::Release);
        e.host_wait(done, T).unwrap();
        assert!(e.gate_device_address(Gate(u64::MAX)).is_err());
        e.free_event(done);
        e.free_stream(s);
    }

    /// Hardware queues: with one, a stream parked at a gate holds back
    /// another stream's later work (its event never completes, and the
    /// stand-in says why at the sync limit), as on an H200 with
    /// `CUDA_DEVICE_MAX_CONNECTIONS=1`; with two, the streams take one
    /// each, the other stream's work runs at once, and once the gate is
    /// raised the parked stream's later work runs too.
    #[test]
    fn a_wait_holds_back_the_streams_of_its_hardware_queue() {
        for (queues, held_back) in [(1, true), (2, false)] {
            let e = HostEngine::new()
                .with_hardware_queues(queues)
                .with_sync_limit(Duration::from_millis(300));
            assert!(e.shares_hardware_queues());
            let (parked, other) = (e.stream().unwrap(), e.stream().unwrap());
            let gate = e.gate().unwrap();
            e.stream_wait_gate(parked, gate, 1, Duration::from_secs(10))
                .unwrap();
            let ev = e.event().unwrap();
            e.record(ev, other).unwrap();
            let waited = e.host_wait(ev, Duration::from_secs(5));
            match held_back {
                true => {
                    let err = waited.expect_err("held back").to_string();
                    assert!(err.contains("hardware queue"), "{err}");
                }
                false => waited.unwrap(),
            }
            e.raise_gate(gate, 1);
            let after = e.event().unwrap();
            e.record(after, parked).unwrap();
            if !held_back {
                e.host_wait(after, Duration::from_secs(5)).unwrap();
            }
        }
        assert!(!HostEngine::new().shares_hardware_queues());
    }

    /// A stream that waits for the host's go: `go` releases it.
    fn held_stream(e: &HostEngine) -> (Stream, mpsc::Sender<()>) {
        let s = e.stream().unwrap();
        let (go, wait) = mpsc::channel::<()>();
        let wait = Mutex::new(wait);
        e.run_on(s, move || {
            let _ = lock(&wait).recv();
            Ok(())
        })
        .unwrap();
        (s, go)
    }

    /// `stream_raise_gate` raises the gate once the work before it on the
    /// stream has run, not before.
    #[test]
    fn stream_raise_gate_waits_for_the_work_before_it() {
        let e = HostEngine::with_delays(Duration::from_micros(300), 1);
        let g = e.gate().unwrap();
        let (s, go) = held_stream(&e);
        e.stream_raise_gate(s, g, 7).unwrap();
        let done = e.event().unwrap();
        e.record(done, s).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(gate_word(&e, g), 0, "raised before the work before it");
        go.send(()).unwrap();
        e.host_wait(done, T).unwrap();
        assert_eq!(gate_word(&e, g), 7);
        // Never back, in a stream either.
        e.stream_raise_gate(s, g, 6).unwrap();
        e.record(done, s).unwrap();
        e.host_wait(done, T).unwrap();
        assert_eq!(gate_word(&e, g), 7);
        e.free_event(done);
        e.free_stream(s);
    }

    fn launch(channels: u32) -> ExecLaunch {
        ExecLaunch {
            protocol: crate::executor::Protocol::Bulk,
            op: Some(ReduceOp::Sum),
            ty: DataType::F32,
            channels,
            program: 0,
            input: 0,
            output: 0,
            conns: 0,
            ctl: 0,
        }
    }

    /// The executor hook runs on the stream, in its order, once per
    /// launch; its error becomes the engine's fault. Without a hook the
    /// stand-in has no executor.
    #[test]
    fn the_executor_hook_runs_in_stream_order() {
        let plain = HostEngine::new();
        assert!(!plain.runs_executor());
        let s = plain.stream().unwrap();
        assert!(plain.launch_executor(s, &launch(1)).is_err());
        plain.free_stream(s);

        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let hook: ExecutorHook = Arc::new(move |l: &ExecLaunch| {
            lock(&log).push(l.channels);
            if l.channels == 3 {
                return Err("kernel 3 failed".into());
            }
            Ok(())
        });
        let e = HostEngine::with_delays(Duration::from_micros(300), 2).with_executor(hook);
        assert!(e.runs_executor());
        // Memory and the kernel's module first: both wait for every
        // stream, the held one too (the device rule).
        let dev = e.alloc_device(4).unwrap();
        let pin = e.alloc_pinned(4).unwrap();
        let l = launch(1);
        e.prepare_executor(l.protocol, l.op, l.ty).unwrap();
        let (s, go) = held_stream(&e);
        e.with_pinned(pin, &mut |p| p.copy_from_slice(&[1, 2, 3, 4]))
            .unwrap();
        e.launch_executor(s, &launch(1)).unwrap();
        e.h2d(s, DevicePtr::new(dev), pin, 0, 4).unwrap();
        e.launch_executor(s, &launch(2)).unwrap();
        assert!(e.launch_executor(s, &launch(0)).is_err());
        let done = e.event().unwrap();
        e.record(done, s).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            lock(&seen).is_empty(),
            "the hook ran before the work before it"
        );
        go.send(()).unwrap();
        e.host_wait(done, T).unwrap();
        assert_eq!(*lock(&seen), [1, 2]);
        assert_eq!(e.read_device(DevicePtr::new(dev), 4).unwrap(), [1, 2, 3, 4]);
        e.launch_executor(s, &launch(3)).unwrap();
        e.record(done, s).unwrap();
        let err = e.host_wait(done, T).unwrap_err();
        assert!(err.to_string().contains("kernel 3 failed"), "{err}");
        e.free_event(done);
        e.free_pinned(pin);
        e.free_device(dev);
        e.free_stream(s);
    }

    /// The legacy default stream waits for blocking streams' earlier work
    /// and they for its, as CUDA's stream 0 does; a non-blocking stream
    /// waits for neither.
    #[test]
    fn the_legacy_default_stream_orders_with_blocking_streams() {
        let e = HostEngine::with_delays(Duration::from_micros(200), 5);
        let blocking = e.blocking_stream().unwrap();
        let free = e.stream().unwrap();
        let buf = DevicePtr::new(e.alloc_device(4).unwrap());
        e.write_device(buf, &[1, 2, 3, 4]).unwrap();
        let short = Duration::from_millis(50);
        // A blocking stream held: the legacy stream's later work waits.
        let hold = e.hold_stream(blocking).unwrap();
        let legacy = e.enqueue_read(LEGACY_STREAM, buf, 4).unwrap();
        let other = e.enqueue_read(free, buf, 4).unwrap();
        assert_eq!(other.recv_timeout(T).unwrap().unwrap(), [1, 2, 3, 4]);
        assert!(legacy.recv_timeout(short).is_err(), "legacy ran early");
        hold.send(()).unwrap();
        assert_eq!(legacy.recv_timeout(T).unwrap().unwrap(), [1, 2, 3, 4]);
        // The legacy stream held: a blocking stream's later work waits, a
        // non-blocking one's does not.
        let hold = e.hold_stream(LEGACY_STREAM).unwrap();
        let after = e.enqueue_read(blocking, buf, 4).unwrap();
        let other = e.enqueue_read(free, buf, 4).unwrap();
        assert_eq!(other.recv_timeout(T).unwrap().unwrap(), [1, 2, 3, 4]);
        assert!(after.recv_timeout(short).is_err(), "blocking ran early");
        hold.send(()).unwrap();
        assert_eq!(after.recv_timeout(T).unwrap().unwrap(), [1, 2, 3, 4]);
        assert!(e.violations().is_empty(), "{:?}", e.violations());
    }

    /// A call that waits for every stream, made while a stream waits at
    /// a gate, is named by the check and, as on a GPU, waits for the
    /// parked stream (here until the sync limit, then a deadlock error);
    /// retired memory is freed only once no gate is held.
    #[test]
    fn synchronizing_under_a_held_gate_is_named_and_retiring_waits() {
        let e = HostEngine::new().with_sync_limit(Duration::from_millis(300));
        let pin = e.alloc_pinned(8).unwrap();
        let s = e.stream().unwrap();
        let g = e.gate().unwrap();
        assert!(!e.gates_held());
        e.stream_wait_gate(s, g, 1, T).unwrap();
        assert!(e.gates_held());
        // Stream-ordered allocation and retiring are allowed.
        let scratch = e.alloc_device_async(s, 64).unwrap();
        e.free_device_async(s, scratch).unwrap();
        e.retire(Retired::Pinned(pin));
        assert!(
            e.with_pinned(pin, &mut |_| {}).is_ok(),
            "freed under a gate"
        );
        assert!(e.violations().is_empty(), "{:?}", e.violations());
        let err = e.alloc_device(16).unwrap_err();
        assert!(err.to_string().contains("cuMemAlloc"), "{err}");
        let named = e.violations();
        assert_eq!(named.len(), 1, "{named:?}");
        assert!(
            named[0].contains("cuMemAlloc") && named[0].contains("gate"),
            "{named:?}"
        );
        e.raise_gate(g, 1);
        assert!(!e.gates_held());
        // Freed once no gate is held and no stream has work left (the
        // next raise or retire that finds it so).
        let done = e.event().unwrap();
        e.record(done, s).unwrap();
        e.host_wait(done, T).unwrap_err(); // the fault of the breach above
                                           // That reports at once; the stream's work ends a little later.
        let mut freed = false;
        for _ in 0..1000 {
            e.raise_gate(g, 1);
            freed = e.with_pinned(pin, &mut |_| {}).is_err();
            if freed {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(freed, "not freed once quiet");
        // After the deadlock (the breach above waited past the limit),
        // every synchronizing call fails at once, naming it.
        let err = e.alloc_pinned(8).unwrap_err().to_string();
        assert!(
            err.contains("deadlocked earlier") && err.contains("cuMemAlloc waited"),
            "{err}"
        );
        // Without a held gate, a synchronizing call waits for the streams'
        // work and is not named. The limit only has to outlast the release
        // 20 ms away: 300 ms ran out once on the 2-core CI machine under
        // the test suite's load (CI96), so it is far above any scheduling
        // delay; the call returns as soon as the stream is released.
        let e = HostEngine::new().with_sync_limit(Duration::from_secs(30));
        let s = e.stream().unwrap();
        let hold = e.hold_stream(s).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            hold.send(()).unwrap();
        });
        e.alloc_pinned(8).unwrap();
        release.join().unwrap();
        assert!(e.violations().is_empty(), "{:?}", e.violations());
    }

    /// A synchronizing call made while an executor kernel is in flight is
    /// named (the kernel may wait for a peer's kernel this thread is to
    /// launch), and what is retired meanwhile waits for the kernel's end.
    #[test]
    fn synchronizing_under_a_kernel_in_flight_is_named() {
        let (go, wait) = mpsc::channel::<()>();
        let wait = Mutex::new(wait);
        let hook: ExecutorHook = Arc::new(move |_: &ExecLaunch| {
            let _ = lock(&wait).recv();
            Ok(())
        });
        let e = HostEngine::new()
            .with_sync_limit(Duration::from_secs(5))
            .with_executor(hook);
        let pin = e.alloc_pinned(8).unwrap();
        let l = launch(1);
        e.prepare_executor(l.protocol, l.op, l.ty).unwrap();
        let s = e.stream().unwrap();
        e.launch_executor(s, &l).unwrap();
        e.retire(Retired::Pinned(pin));
        assert!(
            e.with_pinned(pin, &mut |_| {}).is_ok(),
            "freed under a kernel"
        );
        assert!(e.violations().is_empty(), "{:?}", e.violations());
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            go.send(()).unwrap();
        });
        // It waits for the kernel (here it ends), and is named.
        e.alloc_device(16).unwrap();
        release.join().unwrap();
        let named = e.violations();
        assert_eq!(named.len(), 1, "{named:?}");
        assert!(
            named[0].contains("cuMemAlloc") && named[0].contains("kernel"),
            "{named:?}"
        );
        // Once the kernel has ended (the host wait reports the breach's
        // fault at once, so the stream's own order tells), the next raise
        // frees what was retired.
        let (ran, ended) = mpsc::channel();
        e.run_on(s, move || {
            let _ = ran.send(());
            Ok(())
        })
        .unwrap();
        ended.recv_timeout(T).unwrap();
        let g = e.gate().unwrap();
        let mut freed = false;
        for _ in 0..1000 {
            e.raise_gate(g, 0);
            freed = e.with_pinned(pin, &mut |_| {}).is_err();
            if freed {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(freed, "not freed once quiet");
    }

    /// Every stand-in has a UUID of its own; one engine shared keeps its.
    #[test]
    fn stand_in_uuids_are_distinct() {
        let a = Arc::new(HostEngine::new());
        let b = HostEngine::new();
        let shared: Arc<dyn Engine> = a.clone();
        let (ua, ub) = (a.stand_in_uuid().unwrap(), b.stand_in_uuid().unwrap());
        assert_ne!(ua, ub);
        assert_eq!(shared.stand_in_uuid(), Some(ua));
    }
}
