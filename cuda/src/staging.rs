//! Host staging of device buffers: the order of copies, transfers and
//! kernels that carries a collective on device buffers through pinned host
//! memory over any host transport (shm, TCP, in-process), over an
//! [`Engine`] that is CUDA on a GPU and [`HostEngine`], a host stand-in,
//! in the tests.
//!
//! - [`Engine`]: what staging needs from a GPU: device buffers, pinned host
//!   buffers, streams, asynchronous copies and reduction kernels, events.
//! - [`HostEngine`]: the stand-in. "Device" memory is host memory, each
//!   allocation at a real, 64-byte aligned host address that is its
//!   [`DeviceBuf`], so that the device executor's kernel source, built for
//!   the host, can run on it ([`HostEngine::with_executor`]); each stream
//!   runs its queue in order on a worker thread of its own, with optional
//!   random delays, so that a missing dependency gives wrong data (or an
//!   error, for pinned memory the host touches while a stream still uses
//!   it) instead of passing by luck.
//! - [`Stager`]: the pipeline of one call: a ring of pinned bounce buffers,
//!   each with a slot of device scratch; outgoing chunks copied
//!   device-to-host into a bounce buffer and handed to the transport from
//!   there, incoming frames received into one and copied host-to-device
//!   (and reduced on the device). It knows nothing of schedules or
//!   transports: ferroccl's `exec::staged` walks a schedule over it.
//!
//! The design, and the rules for reusing buffers, are in docs/staging.md.

use crate::error::{CudaError, Result};
use crate::executor::ExecLaunch;
use crate::{Op, Ty};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A device allocation (opaque to the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceBuf(pub u64);

/// A place in device memory: an allocation and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevicePtr {
    /// The allocation.
    pub buf: DeviceBuf,
    /// Bytes from its start.
    pub offset: usize,
}

impl DevicePtr {
    /// The start of `buf`.
    pub const fn new(buf: DeviceBuf) -> Self {
        DevicePtr { buf, offset: 0 }
    }

    /// `bytes` further on.
    pub const fn add(self, bytes: usize) -> Self {
        DevicePtr {
            buf: self.buf,
            offset: self.offset + bytes,
        }
    }

    /// Whether `[self, self + a)` and `[other, other + b)` share a byte.
    pub fn overlaps(self, a: usize, other: DevicePtr, b: usize) -> bool {
        self.buf == other.buf
            && a > 0
            && b > 0
            && self.offset < other.offset + b
            && other.offset < self.offset + a
    }
}

/// A pinned (page-locked) host allocation, which copies to and from the
/// device run asynchronously against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PinnedBuf(pub u64);

/// A stream: work enqueued on it runs in order, asynchronously to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream(pub u64);

/// An event: a point in a stream's work that other streams and the host
/// can wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event(pub u64);

/// A gate: a 32-bit word that streams can wait for and the host raises
/// (`Engine::gate`). A device call makes the caller's stream wait at its
/// gate for the call's number, and the thread that carries the call out
/// raises the gate to that number when the call ends, however it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gate(pub u64);

/// Whether a gate at `word` has reached `value`: a cyclic comparison (as
/// CUDA's `CU_STREAM_WAIT_VALUE_GEQ`), so numbers may wrap around.
pub const fn gate_reached(word: u32, value: u32) -> bool {
    (word.wrapping_sub(value) as i32) >= 0
}

/// What host staging needs from a GPU. Every enqueueing method returns at
/// once; the work runs on the stream in the order enqueued. Offsets and
/// lengths count bytes except `count`, which counts elements of `ty`.
///
/// Events follow CUDA's rules: `record` captures the work enqueued on the
/// stream so far; `stream_wait` and `host_wait` wait for the most recent
/// record at the time they are called (an event never recorded counts as
/// complete).
pub trait Engine: Send + Sync {
    /// Allocate `bytes` of device memory.
    fn alloc_device(&self, bytes: usize) -> Result<DeviceBuf>;
    /// Free a device allocation (the caller has waited for its work).
    fn free_device(&self, buf: DeviceBuf);
    /// Allocate `bytes` of pinned host memory.
    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuf>;
    /// Free a pinned allocation (the caller has waited for its work).
    fn free_pinned(&self, buf: PinnedBuf);
    /// Let the host read and write a pinned buffer. Refused (an error, not
    /// a data race) while an enqueued copy that uses it has not finished:
    /// the caller waits for the copy's event first.
    fn with_pinned(&self, buf: PinnedBuf, f: &mut dyn FnMut(&mut [u8])) -> Result<()>;
    /// Create a stream.
    fn stream(&self) -> Result<Stream>;
    /// Destroy a stream once its work is done.
    fn free_stream(&self, stream: Stream);
    /// Create an event.
    fn event(&self) -> Result<Event>;
    /// Destroy an event.
    fn free_event(&self, event: Event);
    /// Enqueue a copy of `bytes` from device `src` to `dst[dst_off..]`.
    fn d2h(
        &self,
        stream: Stream,
        dst: PinnedBuf,
        dst_off: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()>;
    /// Enqueue a copy of `bytes` from `src[src_off..]` to device `dst`.
    fn h2d(
        &self,
        stream: Stream,
        dst: DevicePtr,
        src: PinnedBuf,
        src_off: usize,
        bytes: usize,
    ) -> Result<()>;
    /// Enqueue a device-to-device copy (the regions must not overlap).
    fn d2d(&self, stream: Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    /// Enqueue the reduction kernel: `dst[i] = a[i] op b[i]` for `count`
    /// elements of `ty` (`Avg` combines as `Sum`). `dst` may be `a` or `b`
    /// exactly, but must not overlap them otherwise.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        stream: Stream,
        op: Op,
        ty: Ty,
        dst: DevicePtr,
        a: DevicePtr,
        b: DevicePtr,
        count: usize,
    ) -> Result<()>;
    /// Enqueue Avg's finishing kernel: divide `count` elements at `buf` by
    /// `ranks` in place (integers: truncated toward zero; f16 and bf16:
    /// in f32, rounded once).
    fn avg_finish(
        &self,
        stream: Stream,
        ty: Ty,
        buf: DevicePtr,
        count: usize,
        ranks: usize,
    ) -> Result<()>;
    /// Record `event` on `stream`.
    fn record(&self, event: Event, stream: Stream) -> Result<()>;
    /// Make later work on `stream` wait for `event` (the host does not wait).
    fn stream_wait(&self, stream: Stream, event: Event) -> Result<()>;
    /// Block the host until `event` completes, or return an error once
    /// `timeout` has passed; never waits longer.
    fn host_wait(&self, event: Event, timeout: Duration) -> Result<()>;
    /// A new gate at 0. Gates live as long as the engine (a stream may
    /// still be waiting at one after its owner has gone; a few bytes each).
    fn gate(&self) -> Result<Gate>;
    /// Make later work on `stream` wait until `gate` has reached `value`
    /// (cyclically: [`gate_reached`]); the host does not wait. A wait that
    /// the device cannot make is still bounded: the engine gives up after
    /// `limit` and lets the stream go on.
    fn stream_wait_gate(
        &self,
        stream: Stream,
        gate: Gate,
        value: u32,
        limit: Duration,
    ) -> Result<()>;
    /// Raise `gate` to `value` from the host, unless it has already
    /// reached it (it never goes back).
    fn raise_gate(&self, gate: Gate, value: u32);

    // The device executor (docs/device-executor.md): engines that cannot
    // run its kernel keep these defaults, and device calls there stay
    // staged.

    /// Whether [`Engine::launch_executor`] runs the executor's kernels.
    fn runs_executor(&self) -> bool {
        false
    }
    /// The address kernels use for `at`.
    fn device_address(&self, at: DevicePtr) -> u64 {
        at.buf.0.wrapping_add(at.offset as u64)
    }
    /// The address, in kernels' address space, of `gate`'s word: the
    /// executor's abort word, which every spin loop reads.
    fn gate_device_address(&self, gate: Gate) -> Result<u64> {
        Err(no_executor(&format!("gate {:#x}", gate.0)))
    }
    /// Enqueue the executor's kernel described by `launch` on `stream`.
    fn launch_executor(&self, stream: Stream, launch: &ExecLaunch) -> Result<()> {
        let _ = (stream, launch);
        Err(no_executor("launch"))
    }
    /// Raise `gate` to `value` in `stream`'s order: once the work enqueued
    /// on `stream` before has ended, with no host thread involved where
    /// the device can write the word itself.
    fn stream_raise_gate(&self, stream: Stream, gate: Gate, value: u32) -> Result<()> {
        let _ = (stream, gate, value);
        Err(no_executor("stream_raise_gate"))
    }
    /// For a stand-in device, the UUID it stands under (what a GPU's
    /// `cuDeviceGetUuid` gives); `None` for a real GPU, which is probed.
    fn stand_in_uuid(&self) -> Option<[u8; 16]> {
        None
    }
}

/// The error of an executor method on an engine without the executor.
fn no_executor(what: &str) -> CudaError {
    CudaError::InvalidArgument(format!(
        "{what}: this engine does not run the device executor"
    ))
}

// ---------------------------------------------------------------------------
// The host stand-in.

/// A job on a stand-in stream.
type Job = Box<dyn FnOnce() + Send>;

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
    thread: JoinHandle<()>,
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
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn bad(what: String) -> CudaError {
    CudaError::InvalidArgument(what)
}

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
        }
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

    fn enqueue(&self, stream: Stream, job: Job) -> Result<()> {
        let streams = lock(&self.state.streams);
        let worker = streams
            .get(&stream.0)
            .ok_or_else(|| bad(format!("no stream {}", stream.0)))?;
        worker
            .queue
            .send(job)
            .map_err(|_| bad(format!("stream {} has stopped", stream.0)))
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
        let state = Arc::downgrade(&self.state);
        self.enqueue(
            stream,
            Box::new(move || {
                if let Err(why) = job() {
                    if let Some(state) = state.upgrade() {
                        lock(&state.fault).get_or_insert(why);
                    }
                }
            }),
        )
    }
}

impl Engine for HostEngine {
    fn alloc_device(&self, bytes: usize) -> Result<DeviceBuf> {
        // Not zeroed on a GPU: fill with a pattern so that reading what
        // was never written shows.
        let (address, alloc) = DeviceAlloc::new(bytes, 0xA5);
        lock(&self.state.device).insert(address, Arc::new(alloc));
        Ok(DeviceBuf(address))
    }

    fn free_device(&self, buf: DeviceBuf) {
        lock(&self.state.device).remove(&buf.0);
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuf> {
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
        let id = self.id();
        if let Some(worker) = lock(&self.state.idle).pop() {
            lock(&self.state.streams).insert(id, worker);
            return Ok(Stream(id));
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
        lock(&self.state.streams).insert(id, StreamWorker { queue, thread });
        Ok(Stream(id))
    }

    fn free_stream(&self, stream: Stream) {
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

    fn event(&self) -> Result<Event> {
        let id = self.id();
        let state = EventState {
            counts: Mutex::new((0, 0)),
            done: Condvar::new(),
        };
        lock(&self.state.events).insert(id, Arc::new(state));
        Ok(Event(id))
    }

    fn free_event(&self, event: Event) {
        lock(&self.state.events).remove(&event.0);
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
        op: Op,
        ty: Ty,
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
        ty: Ty,
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
        self.run_on(stream, move || {
            wait_for(&state, target, STREAM_WAIT_LIMIT).map_err(|_| {
                format!(
                    "a stream waited {STREAM_WAIT_LIMIT:?} for event {}",
                    event.0
                )
            })
        })
    }

    fn host_wait(&self, event: Event, timeout: Duration) -> Result<()> {
        let state = self.event_state(event)?;
        let target = lock(&state.counts).0;
        let waited = wait_for(&state, target, timeout);
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
        // Bounded like a CUDA engine's fallback: past `limit` the stream
        // goes on (the call's error reaches the host through its result).
        self.run_on(stream, move || {
            let _ = state.wait(value, limit);
            Ok(())
        })
    }

    fn raise_gate(&self, gate: Gate, value: u32) {
        if let Ok(state) = self.gate_state(gate) {
            state.raise(value);
        }
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
        let launch = *launch;
        self.run_on(stream, move || hook(&launch))
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
}

impl HostEngine {
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

/// The stand-in's kernels: one element at a time, with ferroccl's host
/// semantics (wrapping integers; f16 and bf16 combined in f32 and rounded
/// once per combination; Min and Max IEEE 754-2019 `minimum`/`maximum`
/// with the canonical NaN; Avg combined as Sum and divided once).
pub mod scalar {
    use crate::{Op, Ty};
    use half::{bf16, f16};

    /// The canonical NaNs Min and Max give.
    const F32_NAN: f32 = f32::from_bits(0x7fc0_0000);
    const F64_NAN: f64 = f64::from_bits(0x7ff8_0000_0000_0000);

    macro_rules! float_minmax {
        ($min:ident, $max:ident, $t:ty, $nan:expr) => {
            fn $min(x: $t, y: $t) -> $t {
                if x.is_nan() || y.is_nan() {
                    $nan
                } else if x == y {
                    // -0 and +0: the one with the sign bit.
                    <$t>::from_bits(x.to_bits() | y.to_bits())
                } else if x < y {
                    x
                } else {
                    y
                }
            }
            fn $max(x: $t, y: $t) -> $t {
                if x.is_nan() || y.is_nan() {
                    $nan
                } else if x == y {
                    <$t>::from_bits(x.to_bits() & y.to_bits())
                } else if x > y {
                    x
                } else {
                    y
                }
            }
        };
    }
    float_minmax!(min32, max32, f32, F32_NAN);
    float_minmax!(min64, max64, f64, F64_NAN);

    fn f32_op(op: Op, x: f32, y: f32) -> f32 {
        match op {
            Op::Sum | Op::Avg => x + y,
            Op::Prod => x * y,
            Op::Min => min32(x, y),
            Op::Max => max32(x, y),
        }
    }

    fn f64_op(op: Op, x: f64, y: f64) -> f64 {
        match op {
            Op::Sum | Op::Avg => x + y,
            Op::Prod => x * y,
            Op::Min => min64(x, y),
            Op::Max => max64(x, y),
        }
    }

    macro_rules! int_op {
        ($op:expr, $x:expr, $y:expr) => {
            match $op {
                Op::Sum | Op::Avg => $x.wrapping_add($y),
                Op::Prod => $x.wrapping_mul($y),
                Op::Min => Ord::min($x, $y),
                Op::Max => Ord::max($x, $y),
            }
        };
    }

    /// Apply `f` to each element triple of `out`, `a`, `b` (native byte
    /// order, `N` bytes each).
    fn each<const N: usize>(
        out: &mut [u8],
        a: &[u8],
        b: &[u8],
        f: impl Fn([u8; N], [u8; N]) -> [u8; N],
    ) {
        for ((o, x), y) in out
            .chunks_exact_mut(N)
            .zip(a.chunks_exact(N))
            .zip(b.chunks_exact(N))
        {
            let x: [u8; N] = x.try_into().expect("chunk of N");
            let y: [u8; N] = y.try_into().expect("chunk of N");
            o.copy_from_slice(&f(x, y));
        }
    }

    /// `out = a op b` over elements of `ty` (all three of one length).
    pub fn reduce(op: Op, ty: Ty, out: &mut [u8], a: &[u8], b: &[u8]) {
        macro_rules! int {
            ($t:ty, $n:literal) => {
                each::<$n>(out, a, b, |x, y| {
                    let (x, y) = (<$t>::from_ne_bytes(x), <$t>::from_ne_bytes(y));
                    int_op!(op, x, y).to_ne_bytes()
                })
            };
        }
        match ty {
            Ty::F32 => each::<4>(out, a, b, |x, y| {
                f32_op(op, f32::from_ne_bytes(x), f32::from_ne_bytes(y)).to_ne_bytes()
            }),
            Ty::F64 => each::<8>(out, a, b, |x, y| {
                f64_op(op, f64::from_ne_bytes(x), f64::from_ne_bytes(y)).to_ne_bytes()
            }),
            Ty::F16 => each::<2>(out, a, b, |x, y| {
                let (x, y) = (f16::from_ne_bytes(x), f16::from_ne_bytes(y));
                f16::from_f32(f32_op(op, x.to_f32(), y.to_f32())).to_ne_bytes()
            }),
            Ty::Bf16 => each::<2>(out, a, b, |x, y| {
                let (x, y) = (bf16::from_ne_bytes(x), bf16::from_ne_bytes(y));
                bf16::from_f32(f32_op(op, x.to_f32(), y.to_f32())).to_ne_bytes()
            }),
            Ty::I8 => int!(i8, 1),
            Ty::U8 => int!(u8, 1),
            Ty::I32 => int!(i32, 4),
            Ty::U32 => int!(u32, 4),
            Ty::I64 => int!(i64, 8),
            Ty::U64 => int!(u64, 8),
        }
    }

    /// Avg's end: divide each element of `ty` in `buf` by `ranks`.
    pub fn divide(ty: Ty, buf: &mut [u8], ranks: usize) {
        macro_rules! int {
            ($t:ty, $n:literal) => {
                for c in buf.chunks_exact_mut($n) {
                    let v = <$t>::from_ne_bytes(c.try_into().expect("chunk of N"));
                    // The rank count may not fit the type: divide in i128.
                    let q = (v as i128 / ranks as i128) as $t;
                    c.copy_from_slice(&q.to_ne_bytes());
                }
            };
        }
        macro_rules! float {
            ($t:ty, $n:literal, $div:expr) => {
                for c in buf.chunks_exact_mut($n) {
                    let v = <$t>::from_ne_bytes(c.try_into().expect("chunk of N"));
                    let q: $t = ($div)(v);
                    c.copy_from_slice(&q.to_ne_bytes());
                }
            };
        }
        let n = ranks;
        match ty {
            Ty::F32 => float!(f32, 4, |v: f32| v / n as f32),
            Ty::F64 => float!(f64, 8, |v: f64| v / n as f64),
            Ty::F16 => float!(f16, 2, |v: f16| f16::from_f32(v.to_f32() / n as f32)),
            Ty::Bf16 => float!(bf16, 2, |v: bf16| bf16::from_f32(v.to_f32() / n as f32)),
            Ty::I8 => int!(i8, 1),
            Ty::U8 => int!(u8, 1),
            Ty::I32 => int!(i32, 4),
            Ty::U32 => int!(u32, 4),
            Ty::I64 => int!(i64, 8),
            Ty::U64 => int!(u64, 8),
        }
    }
}

// ---------------------------------------------------------------------------
// The pipeline.

/// One bounce buffer: pinned host memory the transport reads and writes,
/// and the slot of device scratch a received chunk lands in to be reduced.
struct Bounce {
    host: PinnedBuf,
    scratch: DevicePtr,
    /// Recorded after the last copy that uses `host` (and, for a landed
    /// chunk, `scratch`'s copy in): the host waits for it before it
    /// touches or hands out the buffer again.
    free: Event,
    /// Handed out as an [`Outgoing`] or [`Incoming`] not yet consumed.
    held: bool,
}

/// A chunk being copied device-to-host into a bounce buffer, for sending.
#[derive(Debug)]
#[must_use = "an outgoing chunk holds a bounce buffer until it is sent"]
pub struct Outgoing {
    slot: usize,
    bytes: usize,
}

/// A chunk received into a bounce buffer, to land in device memory.
#[derive(Debug)]
#[must_use = "an incoming chunk holds a bounce buffer until it lands"]
pub struct Incoming {
    slot: usize,
    bytes: usize,
}

/// The shape of a staging pipeline.
#[derive(Debug, Clone, Copy)]
pub struct StageConfig {
    /// Bytes of each bounce buffer: the largest chunk (frame) it carries.
    pub chunk_bytes: usize,
    /// Bounce buffers: chunks in flight at once (at least 2).
    pub depth: usize,
    /// Bound of every host wait.
    pub timeout: Duration,
}

/// What a pipeline allocates: two streams, two events, the device
/// scratch and the bounce buffers with their events. A [`StagePool`]
/// keeps them between calls: pinned allocation takes milliseconds, a
/// call's staging microseconds.
struct Kit {
    inbound: Stream,
    outbound: Stream,
    wrote: Event,
    read: Event,
    scratch: DeviceBuf,
    /// (pinned buffer, its event), `depth` of them.
    bounce: Vec<(PinnedBuf, Event)>,
    /// Bytes of each bounce buffer (and scratch slot).
    chunk: usize,
}

impl Kit {
    fn new(engine: &dyn Engine, chunk: usize, depth: usize) -> Result<Kit> {
        // Built up step by step; what was made is freed if a step fails.
        let mut kit = Kit {
            inbound: engine.stream()?,
            outbound: Stream(0),
            wrote: Event(0),
            read: Event(0),
            scratch: DeviceBuf(0),
            bounce: Vec::with_capacity(depth),
            chunk,
        };
        let made = (|| {
            kit.outbound = engine.stream()?;
            kit.wrote = engine.event()?;
            kit.read = engine.event()?;
            kit.scratch = engine.alloc_device(chunk * depth)?;
            for _ in 0..depth {
                let host = engine.alloc_pinned(chunk)?;
                match engine.event() {
                    Ok(e) => kit.bounce.push((host, e)),
                    Err(e) => {
                        engine.free_pinned(host);
                        return Err(e);
                    }
                }
            }
            Ok(())
        })();
        match made {
            Ok(()) => Ok(kit),
            Err(e) => {
                kit.free(engine);
                Err(e)
            }
        }
    }

    /// Free everything (the work that used it has finished, or the
    /// streams' queues run out first: freeing a stream waits for them).
    fn free(self, engine: &dyn Engine) {
        for s in [self.inbound, self.outbound] {
            if s != Stream(0) {
                engine.free_stream(s);
            }
        }
        for (host, e) in self.bounce {
            engine.free_pinned(host);
            engine.free_event(e);
        }
        for e in [self.wrote, self.read] {
            if e != Event(0) {
                engine.free_event(e);
            }
        }
        if self.scratch != DeviceBuf(0) {
            engine.free_device(self.scratch);
        }
    }
}

/// Pipelines kept between calls on one engine ([`Stager::new_in`]): a
/// call takes the smallest kept one whose bounce buffers fit its chunks
/// and gives it back when it ends cleanly (a failed call frees its own).
/// Bounce buffers are sized in powers of two from 64 KiB, so calls of
/// nearby sizes share them; at most [`StagePool::KEEP`] are kept.
pub struct StagePool {
    engine: Arc<dyn Engine>,
    kits: Mutex<Vec<Kit>>,
}

impl StagePool {
    /// Pipelines kept at most.
    pub const KEEP: usize = 4;
    /// The smallest bounce buffer a pooled pipeline gets.
    pub const MIN_CHUNK: usize = 64 << 10;

    /// An empty pool of `engine`'s resources.
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        StagePool {
            engine,
            kits: Mutex::new(Vec::new()),
        }
    }

    /// The engine whose resources are kept.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// Pipelines kept now.
    pub fn kept(&self) -> usize {
        lock(&self.kits).len()
    }

    fn take(&self, chunk: usize, depth: usize) -> Result<Kit> {
        {
            let mut kits = lock(&self.kits);
            let best = kits
                .iter()
                .enumerate()
                .filter(|(_, k)| k.chunk >= chunk && k.bounce.len() == depth)
                .min_by_key(|(_, k)| k.chunk)
                .map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(kits.swap_remove(i));
            }
        }
        let size = chunk.max(Self::MIN_CHUNK).next_power_of_two();
        Kit::new(&*self.engine, size, depth)
    }

    fn give_back(&self, kit: Kit) {
        let mut kits = lock(&self.kits);
        kits.push(kit);
        if kits.len() > Self::KEEP {
            // Keep the largest: they serve every smaller call too.
            kits.sort_by_key(|k| std::cmp::Reverse(k.chunk));
            let spare = kits.pop().expect("more than KEEP");
            drop(kits);
            spare.free(&*self.engine);
        }
    }
}

impl Drop for StagePool {
    fn drop(&mut self) {
        for kit in lock(&self.kits).drain(..) {
            kit.free(&*self.engine);
        }
    }
}

/// The staging pipeline of one call over an [`Engine`] (module docs;
/// docs/staging.md). Two streams: `inbound` runs everything that writes
/// device memory (host-to-device copies, kernels, device copies),
/// `outbound` the device-to-host copies. Events order them: a copy out
/// waits for the writes enqueued before it, a write waits for the copies
/// out enqueued before it, so each stream may run ahead of the other only
/// where nothing depends on it.
pub struct Stager<'e> {
    engine: &'e dyn Engine,
    ty: Ty,
    op: Op,
    timeout: Duration,
    chunk_bytes: usize,
    inbound: Stream,
    outbound: Stream,
    /// Recorded on `inbound` after each write; `outbound` waits for it.
    wrote: Event,
    /// Recorded on `outbound` after each copy out; `inbound` waits for it.
    read: Event,
    /// Whether a write (copy out) was enqueued since `outbound`
    /// (`inbound`) last waited for `wrote` (`read`).
    unseen_writes: bool,
    unseen_reads: bool,
    scratch: DeviceBuf,
    bounce: Vec<Bounce>,
    /// The next bounce buffer to try.
    next: usize,
    /// Test hook: skip the wait of `outbound` on `inbound`'s writes (the
    /// dependency a test drops to show the stand-in catches it).
    skip_write_wait: bool,
    /// Where the resources go back to when the call ends cleanly.
    pool: Option<&'e StagePool>,
    /// Bytes of each bounce buffer as allocated (at least `chunk_bytes`).
    slot_bytes: usize,
    /// `finish` found every copy and kernel done: the resources may be
    /// reused at once.
    clean: bool,
}

impl<'e> Stager<'e> {
    /// Allocate the pipeline's streams, events, pinned buffers and device
    /// scratch for chunks of `ty`, reduced with `op` (freed at the end).
    pub fn new(engine: &'e dyn Engine, ty: Ty, op: Op, config: StageConfig) -> Result<Self> {
        Self::build(engine, None, ty, op, config)
    }

    /// As [`Stager::new`], with the resources taken from `pool` (whose
    /// engine this runs on) and given back when the call ends cleanly.
    pub fn new_in(pool: &'e StagePool, ty: Ty, op: Op, config: StageConfig) -> Result<Self> {
        Self::build(&**pool.engine(), Some(pool), ty, op, config)
    }

    fn build(
        engine: &'e dyn Engine,
        pool: Option<&'e StagePool>,
        ty: Ty,
        op: Op,
        config: StageConfig,
    ) -> Result<Self> {
        if config.depth < 2 {
            return Err(bad(format!("staging depth {} < 2", config.depth)));
        }
        // A chunk of no bytes still gets a (one-byte) buffer.
        let chunk = config.chunk_bytes.max(1);
        let kit = match pool {
            Some(pool) => pool.take(chunk, config.depth)?,
            None => Kit::new(engine, chunk, config.depth)?,
        };
        let bounce = kit
            .bounce
            .iter()
            .enumerate()
            .map(|(k, &(host, free))| Bounce {
                host,
                scratch: DevicePtr::new(kit.scratch).add(k * kit.chunk),
                free,
                held: false,
            })
            .collect();
        Ok(Stager {
            engine,
            ty,
            op,
            timeout: config.timeout,
            chunk_bytes: config.chunk_bytes,
            inbound: kit.inbound,
            outbound: kit.outbound,
            wrote: kit.wrote,
            read: kit.read,
            unseen_writes: false,
            unseen_reads: false,
            scratch: kit.scratch,
            bounce,
            next: 0,
            skip_write_wait: false,
            pool,
            slot_bytes: kit.chunk,
            clean: false,
        })
    }

    /// The resources, as a kit again.
    fn kit(&self) -> Kit {
        Kit {
            inbound: self.inbound,
            outbound: self.outbound,
            wrote: self.wrote,
            read: self.read,
            scratch: self.scratch,
            bounce: self.bounce.iter().map(|b| (b.host, b.free)).collect(),
            chunk: self.slot_bytes,
        }
    }

    /// Bounce buffers not handed out.
    pub fn available(&self) -> usize {
        self.bounce.iter().filter(|b| !b.held).count()
    }

    /// Drop the wait of copies out on earlier device writes. Only for the
    /// test that proves a missing dependency is caught.
    #[doc(hidden)]
    pub fn drop_write_wait_for_test(&mut self) {
        self.skip_write_wait = true;
    }

    fn check_len(&self, bytes: usize) -> Result<()> {
        if bytes > self.chunk_bytes {
            return Err(bad(format!(
                "a chunk of {bytes} bytes exceeds the {}-byte bounce buffers",
                self.chunk_bytes
            )));
        }
        Ok(())
    }

    /// Hold the next bounce buffer that is not held, once the copies that
    /// used it last have finished.
    fn take(&mut self) -> Result<usize> {
        let n = self.bounce.len();
        let slot = (0..n)
            .map(|i| (self.next + i) % n)
            .find(|&k| !self.bounce[k].held)
            .ok_or_else(|| bad("every bounce buffer is held".into()))?;
        self.next = (slot + 1) % n;
        self.engine
            .host_wait(self.bounce[slot].free, self.timeout)?;
        self.bounce[slot].held = true;
        Ok(slot)
    }

    /// Before a write to device memory: after the copies out enqueued
    /// before it (which may read what it overwrites).
    fn before_write(&mut self) -> Result<()> {
        if self.unseen_reads {
            self.engine.stream_wait(self.inbound, self.read)?;
            self.unseen_reads = false;
        }
        Ok(())
    }

    fn after_write(&mut self) -> Result<()> {
        self.engine.record(self.wrote, self.inbound)?;
        self.unseen_writes = true;
        Ok(())
    }

    /// Start copying `bytes` at `src` into a bounce buffer, after every
    /// device write enqueued so far.
    pub fn stage_out(&mut self, src: DevicePtr, bytes: usize) -> Result<Outgoing> {
        self.check_len(bytes)?;
        let slot = self.take()?;
        if self.unseen_writes && !self.skip_write_wait {
            self.engine.stream_wait(self.outbound, self.wrote)?;
            self.unseen_writes = false;
        }
        let b = &self.bounce[slot];
        self.engine.d2h(self.outbound, b.host, 0, src, bytes)?;
        self.engine.record(b.free, self.outbound)?;
        self.engine.record(self.read, self.outbound)?;
        self.unseen_reads = true;
        Ok(Outgoing { slot, bytes })
    }

    /// Wait until an outgoing chunk is in host memory, hand its bytes to
    /// `send` (the transport), and free its buffer. `send`'s own result
    /// (its error type is the caller's) is returned inside.
    pub fn send<R>(&mut self, out: Outgoing, send: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let b = &mut self.bounce[out.slot];
        b.held = false;
        self.engine.host_wait(b.free, self.timeout)?;
        let mut send = Some(send);
        let mut result = None;
        self.engine.with_pinned(b.host, &mut |host| {
            if let Some(send) = send.take() {
                result = Some(send(&host[..out.bytes]));
            }
        })?;
        Ok(result.expect("with_pinned ran the closure"))
    }

    /// Receive a chunk of `bytes` into a free bounce buffer: `recv` (the
    /// transport) fills the slice it is given. Its result is returned with
    /// the chunk; on its error the chunk should be dropped with
    /// [`Stager::discard`].
    pub fn receive<R>(
        &mut self,
        bytes: usize,
        recv: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<(Incoming, R)> {
        self.check_len(bytes)?;
        let slot = self.take()?;
        let mut recv = Some(recv);
        let mut result = None;
        let host = self.bounce[slot].host;
        let access = self.engine.with_pinned(host, &mut |host| {
            if let Some(recv) = recv.take() {
                result = Some(recv(&mut host[..bytes]));
            }
        });
        if let Err(e) = access {
            self.bounce[slot].held = false;
            return Err(e);
        }
        let result = result.expect("with_pinned ran the closure");
        Ok((Incoming { slot, bytes }, result))
    }

    /// Hand a received chunk's bytes to `send` as they arrived (a chunk
    /// forwarded unchanged); the chunk stays held, to land.
    pub fn forward<R>(&mut self, chunk: &Incoming, send: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let mut send = Some(send);
        let mut result = None;
        self.engine
            .with_pinned(self.bounce[chunk.slot].host, &mut |host| {
                if let Some(send) = send.take() {
                    result = Some(send(&host[..chunk.bytes]));
                }
            })?;
        Ok(result.expect("with_pinned ran the closure"))
    }

    /// Give back a received chunk that will not land.
    pub fn discard(&mut self, chunk: Incoming) {
        self.bounce[chunk.slot].held = false;
    }

    /// Copy a received chunk to `dst` on the device (asynchronously).
    pub fn land(&mut self, chunk: Incoming, dst: DevicePtr) -> Result<()> {
        self.before_write()?;
        let b = &mut self.bounce[chunk.slot];
        b.held = false;
        self.engine.h2d(self.inbound, dst, b.host, 0, chunk.bytes)?;
        self.engine.record(b.free, self.inbound)?;
        self.after_write()
    }

    /// Land a received chunk in device scratch and reduce it with `local`
    /// into `dst` (`dst = chunk op local`; `dst` may be `local`). With
    /// `dst` `None` the result stays in the scratch slot, whose place is
    /// returned: valid until the next chunk lands there (the caller stages
    /// it out at once).
    pub fn land_reduce(
        &mut self,
        chunk: Incoming,
        local: DevicePtr,
        dst: Option<DevicePtr>,
    ) -> Result<DevicePtr> {
        let count = chunk.bytes / self.ty.size();
        self.before_write()?;
        let b = &mut self.bounce[chunk.slot];
        b.held = false;
        let scratch = b.scratch;
        self.engine
            .h2d(self.inbound, scratch, b.host, 0, chunk.bytes)?;
        self.engine.record(b.free, self.inbound)?;
        let dst = dst.unwrap_or(scratch);
        self.engine
            .reduce(self.inbound, self.op, self.ty, dst, scratch, local, count)?;
        self.after_write()?;
        Ok(dst)
    }

    /// Copy `bytes` from `src` to `dst` on the device.
    pub fn copy(&mut self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        self.before_write()?;
        self.engine.d2d(self.inbound, dst, src, bytes)?;
        self.after_write()
    }

    /// `dst = a op b` over `count` elements on the device.
    pub fn reduce(
        &mut self,
        dst: DevicePtr,
        a: DevicePtr,
        b: DevicePtr,
        count: usize,
    ) -> Result<()> {
        self.before_write()?;
        self.engine
            .reduce(self.inbound, self.op, self.ty, dst, a, b, count)?;
        self.after_write()
    }

    /// Avg's end: divide `count` elements at `buf` by `ranks`.
    pub fn avg_finish(&mut self, buf: DevicePtr, count: usize, ranks: usize) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        self.before_write()?;
        self.engine
            .avg_finish(self.inbound, self.ty, buf, count, ranks)?;
        self.after_write()
    }

    /// Wait until every enqueued copy and kernel has finished (the call's
    /// results are in device memory).
    pub fn finish(&mut self) -> Result<()> {
        self.engine.host_wait(self.wrote, self.timeout)?;
        self.engine.host_wait(self.read, self.timeout)?;
        for b in &self.bounce {
            self.engine.host_wait(b.free, self.timeout)?;
        }
        // Everything enqueued has run: nothing is held by a stream (a
        // chunk still handed out would be the caller's bug: not reused).
        self.clean = self.bounce.iter().all(|b| !b.held);
        Ok(())
    }
}

impl Drop for Stager<'_> {
    fn drop(&mut self) {
        let kit = self.kit();
        match self.pool {
            Some(pool) if self.clean => pool.give_back(kit),
            // Whatever is still queued finishes before anything is freed
            // (a failed call gets here without `finish`); freeing a
            // stream waits for its queue.
            _ => kit.free(self.engine),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    fn u32s(bytes: &[u8]) -> Vec<u32> {
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn bytes(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    /// Chunks of a device buffer go out through bounce buffers, come back
    /// in, and are reduced on the "device" into another: the pipeline's
    /// round trip, with random delays on the streams and more chunks than
    /// bounce buffers.
    #[test]
    fn round_trip_through_bounce_buffers() {
        for seed in 0..4 {
            let engine = HostEngine::with_delays(Duration::from_micros(300), seed);
            let n = 1000usize;
            let chunk = 64usize;
            let src = engine.alloc_device(n * 4).unwrap();
            let dst = engine.alloc_device(n * 4).unwrap();
            let a: Vec<u32> = (0..n as u32).collect();
            let b: Vec<u32> = (0..n as u32).map(|i| i * 7 + 1).collect();
            engine
                .write_device(DevicePtr::new(src), &bytes(&a))
                .unwrap();
            engine
                .write_device(DevicePtr::new(dst), &bytes(&b))
                .unwrap();
            let config = StageConfig {
                chunk_bytes: chunk * 4,
                depth: 3,
                timeout: T,
            };
            let mut stager = Stager::new(&engine, Ty::U32, Op::Sum, config).unwrap();
            for off in (0..n).step_by(chunk) {
                let len = chunk.min(n - off) * 4;
                let at = off * 4;
                let out = stager.stage_out(DevicePtr::new(src).add(at), len).unwrap();
                let mut wire = Vec::new();
                stager.send(out, |h| wire.extend_from_slice(h)).unwrap();
                let (chunk, ()) = stager.receive(len, |h| h.copy_from_slice(&wire)).unwrap();
                let d = DevicePtr::new(dst).add(at);
                stager.land_reduce(chunk, d, Some(d)).unwrap();
            }
            stager.finish().unwrap();
            let got = u32s(&engine.read_device(DevicePtr::new(dst), n * 4).unwrap());
            let want: Vec<u32> = (0..n).map(|i| a[i] + b[i]).collect();
            assert_eq!(got, want, "seed {seed}");
        }
    }

    /// The host may not touch a pinned buffer a queued copy still uses,
    /// and a wait never blocks past its deadline.
    #[test]
    fn pinned_in_use_is_refused_and_waits_are_bounded() {
        let engine = HostEngine::new();
        let s = engine.stream().unwrap();
        let blocker = engine.event().unwrap();
        let never = engine.event().unwrap();
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
        let dev = engine.alloc_device(16).unwrap();
        let pin = engine.alloc_pinned(16).unwrap();
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
            op: Some(Op::Sum),
            ty: Ty::F32,
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
        let (s, go) = held_stream(&e);
        let dev = e.alloc_device(4).unwrap();
        let pin = e.alloc_pinned(4).unwrap();
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

    #[test]
    fn scalar_semantics() {
        use half::{bf16, f16};
        let mut out = [0u8; 1];
        scalar::reduce(Op::Sum, Ty::U8, &mut out, &[200], &[100]);
        assert_eq!(out, [44]);
        let mut b = [44u8];
        scalar::divide(Ty::U8, &mut b, 2);
        assert_eq!(b, [22]);
        let mut i = (-3i8).to_ne_bytes();
        scalar::divide(Ty::I8, &mut i, 2);
        assert_eq!(i8::from_ne_bytes(i), -1);
        let nan = f32::from_bits(0xffc0_0001).to_ne_bytes();
        let mut o = [0u8; 4];
        scalar::reduce(Op::Min, Ty::F32, &mut o, &nan, &1f32.to_ne_bytes());
        assert_eq!(u32::from_ne_bytes(o), 0x7fc0_0000);
        scalar::reduce(
            Op::Max,
            Ty::F32,
            &mut o,
            &(-0f32).to_ne_bytes(),
            &0f32.to_ne_bytes(),
        );
        assert_eq!(u32::from_ne_bytes(o), 0);
        scalar::reduce(
            Op::Min,
            Ty::F32,
            &mut o,
            &0f32.to_ne_bytes(),
            &(-0f32).to_ne_bytes(),
        );
        assert_eq!(u32::from_ne_bytes(o), 0x8000_0000);
        let mut h = [0u8; 2];
        let x = f16::from_f32(1.0).to_ne_bytes();
        let y = f16::from_f32(f32::NAN).to_ne_bytes();
        scalar::reduce(Op::Max, Ty::F16, &mut h, &x, &y);
        assert_eq!(u16::from_ne_bytes(h), 0x7e00);
        let x = bf16::from_f32(-1.0).to_ne_bytes();
        let y = bf16::from_f32(f32::NAN).to_ne_bytes();
        scalar::reduce(Op::Min, Ty::Bf16, &mut h, &x, &y);
        assert_eq!(u16::from_ne_bytes(h), 0x7fc0);
    }
}
