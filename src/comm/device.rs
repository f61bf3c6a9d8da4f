//! Collectives on device buffers through the communicator, with NCCL's
//! stream semantics: a call takes its place in the order like any other
//! and returns at once; the caller's stream waits at the communicator's
//! gate for the call (`Engine::stream_wait_gate`), so later work on it
//! sees the result, and the progress thread carries the call out: it waits
//! for the stream's earlier work (an event recorded at the call), runs the
//! call by the device executor (`device_exec`: a kernel per rank, GPU to
//! GPU, which raises the gate on the device) or through the staged
//! executor (`exec::staged`, which returns once every copy and kernel has
//! finished). The gate is raised however the call ends (an error, a
//! failed communicator, a job dropped unrun), so a stream never waits on a
//! call that will not come. A call that must set something up first (the
//! communicator's first on an engine, or one needing kernels not yet
//! loaded) does not park the stream: its caller waits on the host for it
//! instead, because set-up waits for every stream (the device rule,
//! docs/staging.md).
//!
//! The public entry points (`crate::cuda`: cudarc slices and a stream, and
//! raw pointers) are built on `device_collective`; the tests drive it with
//! the host stand-in of a GPU.

use super::{lock, Communicator, Inner, Work};
use crate::algo::encode::Layout;
use crate::coll::{self, CollCall};
use crate::element::{DataType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::{AvgFinish, DeviceBuffers, DeviceIo, ExecIo, Io};
use crate::plan::Memory;
use ferroccl_cuda::device::{DeviceBuf, DevicePtr, Engine, Event, Gate, Stream};
use ferroccl_cuda::stager::StagePool;
use std::collections::HashSet;
use std::sync::{mpsc, Arc};

/// Where a device call's buffers are, and what moves them.
#[derive(Clone)]
pub(crate) struct OnDevice {
    /// The device's ordinal.
    pub(crate) ordinal: u32,
    /// Its engine (CUDA, or the host stand-in).
    pub(crate) engine: Arc<dyn Engine>,
    /// The caller's stream.
    pub(crate) stream: Stream,
    /// The send buffer (in place: the one buffer).
    pub(crate) send: DevicePtr,
    /// The receive buffer (in place: ignored).
    pub(crate) recv: DevicePtr,
}

/// A communicator's gate on one engine: the callers' streams wait there
/// for the calls' numbers, which count the device calls on that engine.
pub(super) struct DeviceGate {
    engine: Arc<dyn Engine>,
    gate: Gate,
    /// Staging resources kept between this communicator's calls there.
    pool: Arc<StagePool>,
    /// The number of the last call issued on this engine.
    issued: u32,
    /// The executor kernels (op, type) loaded for this communicator's
    /// calls: a call that needs another one does not park its stream.
    prepared: HashSet<(Option<ReduceOp>, DataType)>,
}

/// A host wait for a device call: `wait()` blocks until the progress
/// thread has carried the call out (the caller's stream needs no host
/// wait: its later work already waits for the call). Dropping it is fine:
/// a failure also reaches [`Communicator::async_error`] and every later
/// call.
#[derive(Debug)]
pub struct DeviceWork(Work<()>);

impl DeviceWork {
    /// Wait for the call to end and return how it ended. Bounded: every
    /// wait inside the call is bounded by the communicator's timeout.
    pub fn wait(self) -> Result<()> {
        self.0.wait()
    }

    /// Whether the call has ended (`wait` would not block).
    pub fn is_complete(&self) -> bool {
        self.0.is_complete()
    }
}

/// Buffers that work enqueued on the caller's stream before a device call
/// uses (a raw PreMulSum's scaled input and its scalar), kept until the
/// call ends and then freed with the call's own scratch. Device memory
/// only, allocated in the caller's stream's order: a pinned buffer made
/// for a call would wait for every stream (the device rule).
#[derive(Default)]
pub(crate) struct Keep {
    /// Device buffers, from `Engine::alloc_device_async` on the caller's
    /// stream.
    pub(crate) device: Vec<DeviceBuf>,
}

/// What a device call holds until it ends: its scratch, the event of the
/// caller's earlier work, and its place at the gate, raised when this is
/// dropped (the call ended, or its job was dropped unrun).
///
/// Nothing here waits for other streams (the device rule): this is dropped
/// on the progress thread before the gate is raised, with the caller's
/// stream parked at it. Scratch was allocated in the caller's stream's
/// order and is freed in it (after the gate, or after the call's own work,
/// which has ended).
struct Held {
    engine: Arc<dyn Engine>,
    /// The caller's stream.
    stream: Stream,
    scratch: Vec<DeviceBuf>,
    ready: Option<Event>,
    gate: Option<(Gate, u32)>,
    /// Dropped last: the caller of a call that does not park its stream
    /// waits for this.
    ended: Option<mpsc::Sender<()>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        // Every copy and kernel of the call has finished (the staged run
        // waits for them, also when it fails) or never started.
        for s in self.scratch.drain(..) {
            if let Err(e) = self.engine.free_device_async(self.stream, s) {
                tracing::warn!("device scratch {:#x} not freed: {e}", s.0);
            }
        }
        if let Some(e) = self.ready.take() {
            self.engine.free_event(e);
        }
        if let Some((gate, value)) = self.gate.take() {
            self.engine.raise_gate(gate, value);
        }
        self.ended.take();
    }
}

/// What a device call needs made before it may park the caller's stream.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SetUp {
    /// Nothing: it parks the stream and returns at once.
    None,
    /// The communicator's first call on the engine, which warmed the
    /// staging pool: it does not park the stream (a peer sharing the
    /// device may be warming its own, waiting for every stream).
    First,
    /// The executor's set-up (the communicator's first collective on the
    /// engine) or kernels not yet loaded (`DeviceIo::prepare`): it is
    /// carried out without parking the stream, and the caller waits.
    Executor,
}

impl Inner {
    /// Make this communicator's gate on `engine` at its first call there,
    /// with its staging pool warmed for every call's chunks (the device
    /// rule: a call that parks a stream allocates nothing); the pool, and
    /// what the call of `op` on `ty` needs set up first.
    fn open_gate(
        &self,
        engine: &Arc<dyn Engine>,
        collective: bool,
        op: Option<ReduceOp>,
        ty: DataType,
    ) -> Result<(Arc<StagePool>, SetUp)> {
        let mut gates = lock(&self.gates);
        let mut fresh = false;
        let at = match gates.iter().position(|g| Arc::ptr_eq(&g.engine, engine)) {
            Some(at) => at,
            None => {
                fresh = true;
                let gate = engine
                    .gate()
                    .map_err(|e| Error::Io(format!("device gate: {e}")))?;
                let pool = Arc::new(StagePool::new(engine.clone()));
                // Staged chunks are at most a slot (`plan::geometry`).
                pool.warm(self.config.chunk_bytes(), crate::exec::STAGE_DEPTH)
                    .map_err(|e| Error::Io(format!("device staging set-up: {e}")))?;
                gates.push(DeviceGate {
                    engine: engine.clone(),
                    gate,
                    pool,
                    issued: 0,
                    prepared: HashSet::new(),
                });
                gates.len() - 1
            }
        };
        // Decided here, on the caller's thread, in issue order: every rank
        // decides alike whatever its progress thread has done so far.
        let g = &mut gates[at];
        let setup = if collective && g.engine.runs_executor() && g.prepared.insert((op, ty)) {
            SetUp::Executor
        } else if fresh {
            SetUp::First
        } else {
            SetUp::None
        };
        Ok((g.pool.clone(), setup))
    }

    /// The gate on `engine` and the number of the next call there; called
    /// under the issue lock, so numbers follow the order calls are carried
    /// out in.
    fn next_gate(&self, engine: &Arc<dyn Engine>) -> Option<(Gate, u32)> {
        let mut gates = lock(&self.gates);
        let g = gates.iter_mut().find(|g| Arc::ptr_eq(&g.engine, engine))?;
        g.issued = g.issued.wrapping_add(1);
        Some((g.gate, g.issued))
    }

    /// Raise every gate to its last call (tear-down: no stream may wait
    /// for a call that will not run).
    pub(super) fn raise_gates(&self) {
        for g in lock(&self.gates).iter() {
            g.engine.raise_gate(g.gate, g.issued);
        }
    }
}

impl Communicator {
    /// Enqueue `call` on the device buffers of `on` (see the module docs):
    /// returns once the call is issued and the caller's stream waits for
    /// it. A bad argument is refused before anything is enqueued.
    pub(crate) fn device_collective<T: Element>(
        &self,
        call: &CollCall,
        on: &OnDevice,
    ) -> Result<DeviceWork> {
        self.device_collective_keeping::<T>(call, on, Keep::default())
    }

    /// [`Communicator::device_collective`], keeping `keep` until the call
    /// ends (freed then, or at once if the call is refused).
    pub(crate) fn device_collective_keeping<T: Element>(
        &self,
        call: &CollCall,
        on: &OnDevice,
        keep: Keep,
    ) -> Result<DeviceWork> {
        let call = CollCall {
            memory: Memory::Device {
                ordinal: on.ordinal,
            },
            ..*call
        };
        let plan = self.plan::<T>(&call)?;
        let elem = std::mem::size_of::<T>();
        let engine = on.engine.clone();
        let device_err = |e| Error::Io(format!("{} on device memory: {e}", call.kind.name()));
        let (ended, call_ended) = mpsc::channel::<()>();
        let mut held = Held {
            engine: engine.clone(),
            stream: on.stream,
            scratch: keep.device,
            ready: None,
            gate: None,
            ended: Some(ended),
        };
        // A schedule that keeps partial results in an output the caller did
        // not give (a tree reduce's inner ranks) gets device scratch.
        let scratch = match plan.scratch_output {
            0 => None,
            n => {
                let s = engine
                    .alloc_device_async(on.stream, n * elem)
                    .map_err(device_err)?;
                held.scratch.push(s);
                Some(s)
            }
        };
        // A schedule that reads its input after writing its output at the
        // same place runs in place from a copy of the input (as on the
        // host), made on the caller's stream, after its earlier work. An
        // all-to-all in place (NCCL's `sendbuff == recvbuff`, which the
        // host API has no verb for) is such a schedule: a block received
        // may land where a block not yet sent lies.
        let copies_input = plan.copies_input || call.kind == crate::coll::CollKind::AllToAll;
        let copy = if call.in_place
            && scratch.is_none()
            && copies_input
            && plan.input_base == 0
            && plan.output_base == 0
        {
            let bytes = call.send_len * elem;
            let made = engine
                .alloc_device_async(on.stream, bytes)
                .map_err(device_err)?;
            held.scratch.push(made);
            engine
                .d2d(on.stream, DevicePtr::new(made), on.send, bytes)
                .map_err(device_err)?;
            Some(made)
        } else {
            None
        };
        let layout = match (scratch, copy) {
            (None, None) if call.in_place => Layout::Shared {
                input_base: plan.input_base,
                output_base: plan.output_base,
            },
            _ => Layout::Separate,
        };
        let bufs = match (scratch, copy) {
            (Some(s), _) => DeviceBuffers {
                input: on.send,
                output: DevicePtr::new(s),
            },
            (None, Some(c)) => DeviceBuffers {
                input: DevicePtr::new(c),
                output: on.send,
            },
            (None, None) if call.in_place => DeviceBuffers {
                input: on.send.add(plan.input_base * elem),
                output: on.send.add(plan.output_base * elem),
            },
            (None, None) => DeviceBuffers {
                input: on.send,
                output: on.recv,
            },
        };
        // Avg's division, where this rank holds a result: the range is the
        // caller's, the executor's output starts at the output base.
        let base = if call.in_place { plan.output_base } else { 0 };
        let avg = (call.op == Some(ReduceOp::Avg) && scratch.is_none())
            .then(|| coll::result_range(&call, &plan, self.rank()))
            .flatten()
            .map(|range| AvgFinish {
                range: range.start.saturating_sub(base)..range.end.saturating_sub(base),
                ranks: self.size(),
            });
        let collective = crate::plan::device::takes_executor(&call);
        let (kop, kty) = (call.op, T::DTYPE);
        let (pool, setup) = self.inner.open_gate(&engine, collective, kop, kty)?;
        // The caller's work so far (and the input copy above), which the
        // progress thread waits for before the call's first copy.
        let ready = engine.event().map_err(device_err)?;
        held.ready = Some(ready);
        engine.record(ready, on.stream).map_err(device_err)?;
        let io = DeviceIo {
            ordinal: on.ordinal,
            bufs,
            pool,
            ready,
            avg,
            exec: ExecIo {
                coll: call,
                layout,
                base: on.send,
            },
            gate: None,
            prepare: (setup == SetUp::Executor).then_some((kop, kty)),
        };
        // Issue: the job is queued under the issue lock, where the call
        // also gets its number at the gate.
        let mut gated = None;
        let inner = self.inner.clone();
        let at_issue = || {
            held.gate = inner.next_gate(&engine);
            gated = held.gate;
            held
        };
        // `held` goes with the job: dropped when the call has ended (the
        // gate raised before the caller hears), or unrun with the job.
        let work = self.run_async_at(self.spec::<T>(&call), at_issue, move |inner, c, held| {
            let io = DeviceIo {
                gate: held.gate,
                ..io
            };
            let result = inner.execute(&plan, Io::<T>::Device(io), c);
            drop(held);
            result
        })?;
        let during = work.during.clone();
        let (gate, value) = gated.ok_or_else(|| Error::Io(format!("{during}: no device gate")))?;
        let limit = self.inner.config.timeout.saturating_mul(4);
        if setup != SetUp::None {
            // The device rule: set-up allocates, maps and loads modules,
            // which wait for every stream; so the stream is not parked, and
            // the caller waits for the call (bounded: every wait in it is).
            // Later work on the stream sees the result: the call has ended.
            match call_ended.recv_timeout(limit) {
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(DeviceWork(work)),
                Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
        }
        // After the issue: the job may already have raised the gate past
        // this number, and then the wait passes at once. Bounded for
        // engines that wait on the host: every call before this one is.
        engine
            .stream_wait_gate(on.stream, gate, value, limit)
            .map_err(|e| {
                Error::Io(format!(
                    "{during}: the call was issued, but the stream could not be made to wait \
                     for it: {e}"
                ))
            })?;
        Ok(DeviceWork(work))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::CollKind;
    use crate::element::DataType;
    use crate::testing::run_ranks_with;
    use ferroccl_cuda::host_engine::HostEngine;
    use std::time::Duration;

    fn config(c: &mut crate::Config) {
        c.transport = Some("mem".into());
        c.timeout = Duration::from_secs(60);
        c.calibrate = false;
    }

    /// Small integers: exact in every type, sums of up to 4 ranks too.
    fn value(rank: usize, i: usize) -> f64 {
        ((rank * 7 + i * 3) % 5) as f64
    }

    fn bytes_of<T: Element>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    fn elems<T: Element>(b: &[u8]) -> Vec<f64> {
        bytemuck::pod_collect_to_vec::<u8, T>(b)
            .iter()
            .map(|x| x.to_f64())
            .collect()
    }

    /// Put `data` in device memory by work enqueued on `stream` (which
    /// the stand-in may delay) without waiting for it: the call must wait
    /// for it itself.
    fn enqueue_write(e: &HostEngine, stream: Stream, at: DevicePtr, data: &[u8]) {
        e.enqueue_write(stream, at, data).unwrap();
    }

    /// Read `bytes` at `at` by work enqueued on `stream` after the call,
    /// waiting only for that work: the call's result must be there. No
    /// call so far broke the device rule.
    fn read_after(e: &HostEngine, stream: Stream, at: DevicePtr, bytes: usize) -> Vec<u8> {
        let got = e.enqueue_read(stream, at, bytes).unwrap();
        let got = got
            .recv_timeout(Duration::from_secs(30))
            .expect("the stream got to the read")
            .unwrap();
        assert_eq!(e.violations(), Vec::<String>::new(), "the device rule");
        got
    }

    /// Every collective of the staged path through the communicator, in
    /// place and out of place, on 1-4 thread ranks each with its own
    /// stand-in device (random delays), f32 and bf16 and i32, Sum and Avg:
    /// the input is written by work still pending on the caller's stream,
    /// the output read by work enqueued after the call, and both checked
    /// against an f64 reference.
    #[test]
    fn device_calls_order_with_the_callers_stream() {
        for n in [1, 2, 3, 4] {
            let own = |rank: usize| {
                Arc::new(HostEngine::with_delays(
                    Duration::from_micros(200),
                    rank as u64 + 1,
                ))
            };
            every_collective::<f32>(n, &own, 37, &config);
            every_collective::<half::bf16>(n, &own, 37, &config);
            every_collective::<i32>(n, &own, 37, &config);
        }
    }

    /// The same calls where the ranks share one stand-in device that runs
    /// the device executor's kernel (its CUDA source built for the host,
    /// `exec::oracle::host_launch`): every rank of the communicator is a
    /// thread of this process on one "GPU", so the launcher takes the
    /// executor for every collective (the launches are counted) instead of
    /// staging, and the results must be the same.
    #[test]
    fn device_calls_run_by_the_executor_on_a_shared_device() {
        let Some(hook) = crate::exec::oracle::host_launch::host_executor() else {
            return;
        };
        for n in [1, 2, 3, 4] {
            let launches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let widest = Arc::new(std::sync::atomic::AtomicU32::new(0));
            let (counted, wide) = (launches.clone(), widest.clone());
            let hook = hook.clone();
            let e = Arc::new(
                HostEngine::with_delays(Duration::from_micros(100), n as u64).with_executor(
                    Arc::new(move |l: &ferroccl_cuda::executor::ExecLaunch| {
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        wide.fetch_max(l.channels, std::sync::atomic::Ordering::Relaxed);
                        hook(l)
                    }),
                ),
            );
            let shared = |_rank: usize| e.clone();
            every_collective::<f32>(n, &shared, 37, &config);
            every_collective::<i32>(n, &shared, 37, &config);
            // Slots of 128 bytes, two a FIFO, and 1013 elements a rank:
            // frames wrap every FIFO many times, and LL slots are cut to
            // the bulk slot (the tuner picks LL for these sizes).
            let small = |c: &mut crate::Config| {
                config(c);
                c.buffsize = 256;
                c.steps = 2;
            };
            every_collective::<f32>(n, &shared, 1013, &small);
            // 256 KiB a rank: the tuner takes the bulk protocol.
            every_collective::<f32>(n, &shared, 1 << 16, &small);
            // 1 MiB a rank on 32 KiB slots: steps cut into channels (up to
            // 4: each is a block of host threads, and the machine may have
            // two cores), each a block of the kernel over FIFOs of its own.
            let wide = |c: &mut crate::Config| {
                config(c);
                c.buffsize = 64 << 10;
                c.steps = 2;
                c.max_channels = 4;
            };
            every_collective::<f32>(n, &shared, 1 << 18, &wide);
            // 11 calls on every rank for each of the five grids, all by
            // the executor.
            assert_eq!(
                launches.load(std::sync::atomic::Ordering::Relaxed),
                5 * 11 * n,
                "{n} ranks: the executor did not run every call"
            );
            if n > 1 {
                let widest = widest.load(std::sync::atomic::Ordering::Relaxed);
                assert!(widest >= 4, "{n} ranks: at most {widest} channels a call");
            }
        }
    }

    /// An in-place f32 allreduce of `count` zeroes on `e`, on a stream of
    /// its own: the call and where it runs.
    fn small_allreduce(e: &Arc<HostEngine>, count: usize) -> (OnDevice, CollCall) {
        let stream = e.stream().unwrap();
        // In the stream's order: the other rank's stream may be parked.
        let buf = DevicePtr::new(e.alloc_device_async(stream, count * 4).unwrap());
        e.write_device(buf, &vec![0u8; count * 4]).unwrap();
        let on = OnDevice {
            ordinal: 0,
            engine: e.clone(),
            stream,
            send: buf,
            recv: buf,
        };
        let call = CollCall {
            op: Some(ReduceOp::Sum),
            in_place: true,
            ..CollCall::new(CollKind::AllReduce, count, count, count)
        };
        (on, call)
    }

    /// What the test forces the stand-in to call under a held gate.
    const FORCED: &str = "cuMemFreeHost (forced by the test)";

    /// Two thread ranks, each on a stand-in of its own or both on one
    /// (`shared`), staged: after a first call, rank 0's stand-in is made
    /// to free pinned memory on the next host wait made while a gate is
    /// held, which its progress thread makes in the second call, with the
    /// caller's stream parked at the gate that thread is to raise: on a
    /// GPU, a deadlock. Each rank's result of the second call.
    fn forced_deadlock(shared: bool) -> Vec<std::result::Result<(), String>> {
        let sync_limit = Duration::from_millis(500);
        let one = Arc::new(HostEngine::new().with_sync_limit(sync_limit));
        let between = std::sync::Barrier::new(2);
        run_ranks_with(
            2,
            |c| {
                config(c);
                c.timeout = Duration::from_secs(20);
                // Many chunks: the staged call waits on the host often.
                c.buffsize = 256;
                c.steps = 2;
            },
            |comm| {
                let e = match shared {
                    true => one.clone(),
                    false => Arc::new(HostEngine::new().with_sync_limit(sync_limit)),
                };
                let (on, call) = small_allreduce(&e, 4096);
                comm.device_collective::<f32>(&call, &on)
                    .unwrap()
                    .wait()
                    .unwrap();
                between.wait();
                if comm.rank() == 0 {
                    e.force_sync_at_next_host_wait(FORCED);
                }
                between.wait();
                // The call's wait for the stream's earlier work ends only
                // once the stream is parked at the gate.
                let hold = e.hold_stream(on.stream).unwrap();
                let work = comm.device_collective::<f32>(&call, &on);
                drop(hold);
                let result = work.and_then(|w| w.wait()).map_err(|e| e.to_string());
                if comm.rank() == 0 || shared {
                    assert!(
                        e.violations().iter().any(|v| v.contains(FORCED)),
                        "rank {}: {:?}",
                        comm.rank(),
                        e.violations()
                    );
                }
                result
            },
        )
    }

    /// A deadlock the stand-in reports (a synchronizing call under a held
    /// gate waited past its limit) ends as an error on every rank, naming
    /// the call where the rank shares the stand-in, and naming the call or
    /// rank 0 where it has a stand-in of its own; the ranks return
    /// (bounded here so that a hang fails the test).
    #[test]
    fn a_deadlock_the_stand_in_reports_is_an_error_on_every_rank() {
        for shared in [false, true] {
            let (done, results) = mpsc::channel();
            std::thread::spawn(move || {
                let _ = done.send(forced_deadlock(shared));
            });
            let results = results
                .recv_timeout(Duration::from_secs(300))
                .unwrap_or_else(|_| panic!("shared {shared}: the ranks never returned"));
            for (rank, result) in results.iter().enumerate() {
                let err = match result {
                    Ok(()) => panic!("shared {shared}: rank {rank} succeeded"),
                    Err(err) => err,
                };
                let named =
                    err.contains(FORCED) && (rank != 0 || shared || err.contains("deadlock"));
                let names_rank_0 = rank != 0 && !shared && err.contains("rank 0");
                assert!(named || names_rank_0, "shared {shared}: rank {rank}: {err}");
            }
        }
    }

    /// Two thread ranks on one executor device: one call sets the
    /// executor up; in the next, rank 1 never calls (`silent`) or rank 0
    /// is aborted while its kernel waits (`abort`). Rank 0's result and
    /// how long the call took.
    fn executor_failure(abort: bool) -> Option<(Result<()>, Duration)> {
        let hook = crate::exec::oracle::host_launch::host_executor()?;
        let e = Arc::new(HostEngine::new().with_executor(hook));
        // The timeout also bounds the first call's device set-up, which
        // took over 2 s on a loaded 2-core machine (a test binary built
        // beside three others): 8 s leaves it room.
        let timeout = Duration::from_secs(if abort { 60 } else { 8 });
        let stay = if abort {
            Duration::from_secs(5)
        } else {
            timeout + Duration::from_secs(2)
        };
        let results = run_ranks_with(
            2,
            |c| {
                c.transport = Some("mem".into());
                c.timeout = timeout;
            },
            |comm| {
                let (on, call) = small_allreduce(&e, 1024);
                comm.device_collective::<f32>(&call, &on)
                    .unwrap()
                    .wait()
                    .unwrap();
                if comm.rank() == 1 {
                    // Never makes the second call; stays until rank 0 is
                    // done with it (past its timeout, or its abort).
                    std::thread::sleep(stay);
                    return None;
                }
                let t = std::time::Instant::now();
                std::thread::scope(|s| {
                    if abort {
                        s.spawn(|| {
                            std::thread::sleep(Duration::from_millis(300));
                            comm.abort();
                        });
                    }
                    let work = comm.device_collective::<f32>(&call, &on).unwrap();
                    Some((work.wait(), t.elapsed()))
                })
            },
        );
        results.into_iter().next().flatten()
    }

    /// A kernel that waits for a peer that never makes the call ends at
    /// the timeout (its abort word raised by the watchdog), and the call
    /// names the peer, as on the host path.
    #[test]
    fn an_executor_kernel_waiting_for_a_silent_peer_ends_at_the_timeout() {
        let Some((result, took)) = executor_failure(false) else {
            return;
        };
        match result {
            Err(err) => assert_eq!(err.failed_rank(), Some(1), "{err}"),
            Ok(()) => panic!("rank 0's call succeeded without rank 1"),
        }
        assert!(took < Duration::from_secs(30), "took {took:?}");
    }

    /// `abort()` on a rank whose kernel waits ends the kernel and the call
    /// with the abort.
    #[test]
    fn abort_ends_a_waiting_executor_kernel() {
        let Some((result, took)) = executor_failure(true) else {
            return;
        };
        match result {
            Err(Error::Aborted(why)) => {
                assert!(why.is_some_and(|w| w.contains("abort()")), "no reason")
            }
            other => panic!("rank 0: {other:?}"),
        }
        assert!(took < Duration::from_secs(30), "took {took:?}");
    }

    /// What a child process left.
    struct Finished {
        status: std::process::ExitStatus,
        stdout: String,
        stderr: String,
    }

    impl Finished {
        fn all(&self) -> String {
            format!("--- stdout\n{}--- stderr\n{}", self.stdout, self.stderr)
        }
    }

    /// A child with its output read on threads of its own (so that a full
    /// pipe never stops it).
    type Captured = (
        std::process::Child,
        std::thread::JoinHandle<String>,
        std::thread::JoinHandle<String>,
    );

    fn spawn_captured(mut cmd: std::process::Command) -> Captured {
        use std::io::Read;
        use std::process::Stdio;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the child starts");
        let read = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut s = Vec::new();
                let _ = r.read_to_end(&mut s);
                String::from_utf8_lossy(&s).into_owned()
            })
        };
        let out = read(Box::new(child.stdout.take().expect("piped")));
        let err = read(Box::new(child.stderr.take().expect("piped")));
        (child, out, err)
    }

    /// Wait for a child, killing it (and failing) past `limit`.
    fn finish_within((mut child, out, err): Captured, limit: Duration) -> Finished {
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("waitpid") {
                break status;
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "a child rank ran past {limit:?}:\n--- stdout\n{}--- stderr\n{}",
                    out.join().unwrap_or_default(),
                    err.join().unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Finished {
            status,
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        }
    }

    /// The variable that makes this test binary a child rank of
    /// `across_processes`: `MODE,RANK,SIZE,PORT,PORT2,TOKEN` (a second
    /// communicator rendezvouses at `PORT2`).
    const XPROC: &str = "FERROCCL_TEST_XPROC";

    /// Run `size` ranks as child processes of this test binary (the test
    /// `xproc_child`, told its part by `XPROC`), all on one stand-in
    /// "GPU" (one stand-in UUID), the host executor library built once
    /// here and loaded by each; what each child left, by rank. `None`
    /// (skip) without a C++ compiler.
    fn across_processes(mode: &str, size: usize) -> Option<Vec<Finished>> {
        let lib = crate::exec::oracle::host_launch::library_path()?;
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port()
        };
        let (port, port2) = (free(), free());
        let token = std::process::id() as u64 ^ (u64::from(port) << 32) ^ 0x5eed;
        let exe = std::env::current_exe().expect("the test binary");
        let children: Vec<_> = (0..size)
            .map(|rank| {
                let mut cmd = std::process::Command::new(&exe);
                cmd.args([
                    "--exact",
                    "comm::device::tests::xproc_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(
                    XPROC,
                    format!("{mode},{rank},{size},{port},{port2},{token}"),
                )
                .env("FERROCCL_HOST_LAUNCH_LIB", &lib);
                spawn_captured(cmd)
            })
            .collect();
        Some(
            children
                .into_iter()
                .map(|c| finish_within(c, Duration::from_secs(240)))
                .collect(),
        )
    }

    /// A child rank of `across_processes` (does nothing unless `XPROC`
    /// is set). Mode `all`: every collective on four grids, each call by
    /// the executor over FIFOs mapped across processes (the launches are
    /// counted). Mode `kill`: one call, then the last rank exits without a
    /// word while the others' kernels wait in the second call; they must
    /// end with an error naming it.
    #[test]
    fn xproc_child() {
        let Ok(spec) = std::env::var(XPROC) else {
            return;
        };
        let f: Vec<&str> = spec.split(',').collect();
        let [mode, rank, size, port, port2, token] = f[..] else {
            panic!("{XPROC}={spec}");
        };
        let (rank, size): (usize, usize) = (rank.parse().unwrap(), size.parse().unwrap());
        let token: u64 = token.parse().unwrap();
        let hook = crate::exec::oracle::host_launch::host_executor().expect("the library");
        let launches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let widest = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (counted, wide) = (launches.clone(), widest.clone());
        let mut uuid = *b"FCSX\0\0\0\0\0\0\0\0\0\0\0\0";
        uuid[8..].copy_from_slice(&token.to_le_bytes());
        let e = Arc::new(
            HostEngine::with_delays(Duration::from_micros(50), rank as u64)
                .with_executor(Arc::new(move |l: &ferroccl_cuda::executor::ExecLaunch| {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    wide.fetch_max(l.channels, std::sync::atomic::Ordering::Relaxed);
                    hook(l)
                }))
                .with_stand_in_uuid(uuid),
        );
        let mut config =
            crate::Config::new(rank, size, "127.0.0.1", port.parse().unwrap(), token).unwrap();
        config.calibrate = false;
        config.timeout = Duration::from_secs(if mode == "kill" { 20 } else { 60 });
        let mut wide = config.clone();
        // Slots of 128 bytes, two a FIFO: frames wrap the FIFOs often.
        config.buffsize = 256;
        config.steps = 2;
        let comm = Communicator::init(config).unwrap();
        match mode {
            "all" => {
                every_collective_on::<f32>(&comm, &e, 37);
                every_collective_on::<i32>(&comm, &e, 1013);
                every_collective_on::<f32>(&comm, &e, 1 << 14);
                drop(comm);
                // A second communicator of 32 KiB slots and up to 3
                // channels (1 MiB calls take them), each over FIFOs of its
                // own in every peer's mapped memory.
                wide.master_port = port2.parse().unwrap();
                wide.buffsize = 64 << 10;
                wide.max_channels = 3;
                let comm = Communicator::init(wide).unwrap();
                every_collective_on::<f32>(&comm, &e, 1 << 18);
                let n = launches.load(std::sync::atomic::Ordering::Relaxed);
                let w = widest.load(std::sync::atomic::Ordering::Relaxed);
                println!("XPROC rank {rank}: {n} launches, at most {w} channels");
            }
            "kill" => {
                let (on, call) = small_allreduce(&e, 1024);
                comm.device_collective::<f32>(&call, &on)
                    .unwrap()
                    .wait()
                    .unwrap();
                if rank == size - 1 {
                    // Gone without a goodbye, as a killed process is, once
                    // the others' kernels wait in the next call.
                    std::thread::sleep(Duration::from_millis(500));
                    std::process::exit(9);
                }
                let t = std::time::Instant::now();
                let got = comm
                    .device_collective::<f32>(&call, &on)
                    .and_then(|w| w.wait());
                println!(
                    "XPROC rank {rank}: {} launches, after {:?}: {}",
                    launches.load(std::sync::atomic::Ordering::Relaxed),
                    t.elapsed(),
                    match got {
                        Ok(()) => "ok".to_string(),
                        Err(e) => format!("failed rank {:?}: {e}", e.failed_rank()),
                    }
                );
            }
            _ => panic!("{XPROC}: mode {mode}"),
        }
    }

    /// Ranks in separate processes on one (stand-in) GPU: the launcher
    /// maps each other's FIFO memory (shared files, their descriptors
    /// passed over Unix sockets, as VMM handles are) and every collective
    /// runs by the executor, checked against the f64 reference.
    #[test]
    fn device_calls_run_by_the_executor_across_processes() {
        for size in [2, 3] {
            let Some(done) = across_processes("all", size) else {
                return;
            };
            for (rank, f) in done.iter().enumerate() {
                assert!(
                    f.status.success(),
                    "{size} ranks, rank {rank}:\n{}",
                    f.all()
                );
                // Four grids of 11 calls, every one by the executor.
                let want = format!("XPROC rank {rank}: 44 launches, at most 3 channels");
                assert!(
                    f.stdout.contains(&want),
                    "{size} ranks, rank {rank}:\n{}",
                    f.all()
                );
            }
        }
    }

    /// A process killed while its peers' kernels wait for it: every
    /// survivor's call ends with an error naming it, well within the
    /// timeout.
    #[test]
    fn a_killed_process_is_named_by_the_kernels_waiting_for_it() {
        let size = 3;
        let Some(done) = across_processes("kill", size) else {
            return;
        };
        assert_eq!(
            done[size - 1].status.code(),
            Some(9),
            "{}",
            done[size - 1].all()
        );
        for (rank, f) in done[..size - 1].iter().enumerate() {
            assert!(f.status.success(), "rank {rank}:\n{}", f.all());
            let line = f
                .stdout
                .lines()
                .find(|l| l.contains(&format!("XPROC rank {rank}: ")))
                .unwrap_or_else(|| panic!("rank {rank}:\n{}", f.all()));
            // The second call's kernel was launched, and ended by the
            // failure.
            assert!(line.contains(": 2 launches, after"), "rank {rank}: {line}");
            assert!(
                line.contains(&format!("failed rank Some({})", size - 1)),
                "rank {rank}: {line}"
            );
        }
    }

    /// Every collective through `device_collective` on `n` thread ranks,
    /// rank r on the device `engine(r)`, `block` elements a rank (37: not
    /// a multiple of anything), checked against an f64 reference.
    fn every_collective<T: Element>(
        n: usize,
        engine: &(dyn Fn(usize) -> Arc<HostEngine> + Sync),
        block: usize,
        config: &(dyn Fn(&mut crate::Config) + Sync),
    ) {
        run_ranks_with(n, config, |comm| {
            every_collective_on::<T>(&comm, &engine(comm.rank()), block)
        });
    }

    /// `every_collective`'s calls on one rank: `comm`'s, on engine `e`.
    fn every_collective_on<T: Element>(comm: &Communicator, e: &Arc<HostEngine>, block: usize) {
        let (rank, size) = (comm.rank(), comm.size());
        let stream = e.stream().unwrap();
        let elem = std::mem::size_of::<T>();
        for (kind, op, in_place) in [
            (CollKind::AllReduce, ReduceOp::Sum, false),
            (CollKind::AllReduce, ReduceOp::Sum, true),
            (CollKind::AllReduce, ReduceOp::Avg, true),
            (CollKind::ReduceScatter, ReduceOp::Sum, false),
            (CollKind::ReduceScatter, ReduceOp::Avg, true),
            (CollKind::AllGather, ReduceOp::Sum, false),
            (CollKind::AllGather, ReduceOp::Sum, true),
            (CollKind::Broadcast, ReduceOp::Sum, true),
            (CollKind::Reduce, ReduceOp::Sum, false),
            (CollKind::Reduce, ReduceOp::Avg, true),
            (CollKind::AllToAll, ReduceOp::Sum, false),
        ] {
            let (send_len, recv_len) = match kind {
                CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => (block, block),
                CollKind::ReduceScatter => (block * size, block),
                CollKind::AllToAll => (block * size, block * size),
                _ => (block, block * size),
            };
            let root =
                (kind == CollKind::Broadcast || kind == CollKind::Reduce).then_some(size - 1);
            let buf_len = send_len.max(recv_len);
            let call = CollCall {
                op: matches!(
                    kind,
                    CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
                )
                .then_some(op),
                root,
                in_place,
                ..CollCall::new(
                    kind,
                    match kind {
                        CollKind::AllToAll => send_len,
                        _ => block,
                    },
                    if in_place { buf_len } else { send_len },
                    if in_place { buf_len } else { recv_len },
                )
            };
            // This rank's input: in place, where the collective
            // reads it (an allgather's own block).
            let input: Vec<T> = (0..send_len).map(|i| T::from_f64(value(rank, i))).collect();
            // In the stream's order, as PyTorch's caching allocator gives
            // memory: ranks sharing a device may have streams parked at
            // their gates, and a plain allocation would wait for them (the
            // device rule holds for the caller too, as NCCL's for cudaFree).
            let send = DevicePtr::new(e.alloc_device_async(stream, buf_len * elem).unwrap());
            let recv = DevicePtr::new(e.alloc_device_async(stream, buf_len * elem).unwrap());
            let at = if in_place && kind == CollKind::AllGather {
                send.add(rank * block * elem)
            } else {
                send
            };
            enqueue_write(e, stream, at, &bytes_of(&input));
            let engine: Arc<dyn Engine> = e.clone();
            let on = OnDevice {
                ordinal: 0,
                engine,
                stream,
                send,
                recv,
            };
            let work = comm
                .device_collective::<T>(&call, &on)
                .unwrap_or_else(|err| panic!("{kind:?} {op} in place {in_place}: {err}"));
            // In place, a reduce-scatter leaves this rank's block
            // where it lay in the input.
            let out_at = match (in_place, kind) {
                (false, _) => recv,
                (true, CollKind::ReduceScatter) => send.add(rank * block * elem),
                (true, _) => send,
            };
            let got = elems::<T>(&read_after(e, stream, out_at, recv_len * elem));
            work.wait()
                .unwrap_or_else(|err| panic!("{kind:?} {op} in place {in_place}: {err}"));
            let sum = |i: usize| (0..size).map(|r| value(r, i)).sum::<f64>();
            let want: Option<Vec<f64>> = match kind {
                CollKind::AllReduce => Some((0..block).map(sum).collect()),
                CollKind::ReduceScatter => {
                    Some((0..block).map(|i| sum(rank * block + i)).collect())
                }
                CollKind::AllGather => Some(
                    (0..block * size)
                        .map(|j| value(j / block, j % block))
                        .collect(),
                ),
                CollKind::Broadcast => Some((0..block).map(|i| value(size - 1, i)).collect()),
                // Block r of recv: block `rank` of rank r's send.
                CollKind::AllToAll => Some(
                    (0..block * size)
                        .map(|j| value(j / block, rank * block + j % block))
                        .collect(),
                ),
                _ => (rank == size - 1).then(|| (0..block).map(sum).collect()),
            };
            let Some(mut want) = want else { continue };
            if op == ReduceOp::Avg && kind != CollKind::AllGather {
                let int = T::DTYPE == DataType::I32;
                for w in &mut want {
                    *w /= size as f64;
                    if int {
                        *w = w.trunc();
                    }
                }
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= w.abs() * 1e-2,
                    "{} {kind:?} {op} in place {in_place} n={size} rank {rank} \
                     element {i}: {g} != {w}",
                    T::DTYPE
                );
            }
            e.free_device_async(stream, send.buf).unwrap();
            e.free_device_async(stream, recv.buf).unwrap();
        }
    }

    /// A device call returns while the caller's stream is still held by
    /// earlier work, and is carried out only after that work: the stream
    /// is held at a gate of the test's own until the call has returned on
    /// every rank, then let go; the result is right and later work on the
    /// stream sees it. Two calls in a row on the same stream both wait.
    #[test]
    fn device_calls_return_before_the_stream_gets_to_them() {
        run_ranks_with(3, config, |comm| {
            let (rank, size) = (comm.rank(), comm.size());
            let e = Arc::new(HostEngine::with_delays(
                Duration::from_micros(100),
                7 + rank as u64,
            ));
            let stream = e.stream().unwrap();
            let n = 1000;
            let buf = DevicePtr::new(e.alloc_device(n * 4).unwrap());
            let input: Vec<f32> = (0..n).map(|i| value(rank, i) as f32).collect();
            let engine: Arc<dyn Engine> = e.clone();
            let on = OnDevice {
                ordinal: 0,
                engine,
                stream,
                send: buf,
                recv: buf,
            };
            // The communicator's first call on the engine sets up its
            // staging (allocations wait for the device's work, the device
            // rule): made first, so that the calls below allocate nothing.
            let warm = CollCall {
                op: Some(ReduceOp::Sum),
                in_place: true,
                ..CollCall::new(CollKind::AllReduce, 1, 1, 1)
            };
            comm.device_collective::<f32>(&warm, &on)
                .unwrap()
                .wait()
                .unwrap();
            // The stream is held by earlier work that is slow (not a
            // gate: a test's gate would be one the library's calls must
            // not allocate under).
            let hold = e.hold_stream(stream).unwrap();
            enqueue_write(&e, stream, buf, &bytes_of(&input));
            let sum = CollCall {
                op: Some(ReduceOp::Sum),
                in_place: true,
                ..CollCall::new(CollKind::AllReduce, n, n, n)
            };
            let max = CollCall {
                op: Some(ReduceOp::Max),
                ..sum
            };
            let first = comm.device_collective::<f32>(&sum, &on).unwrap();
            let second = comm.device_collective::<f32>(&max, &on).unwrap();
            // Returned with the stream held: neither call can have run.
            assert!(!first.is_complete() && !second.is_complete());
            std::thread::sleep(Duration::from_millis(50));
            assert!(
                !first.is_complete(),
                "the call ran before the stream's earlier work"
            );
            hold.send(()).unwrap();
            let got = elems::<f32>(&read_after(&e, stream, buf, n * 4));
            first.wait().unwrap();
            second.wait().unwrap();
            let made = e.pinned_allocations();
            // Max over ranks of the same sum is the sum.
            for (i, g) in got.iter().enumerate() {
                let want: f64 = (0..size).map(|r| value(r, i)).sum();
                assert_eq!(*g, want, "rank {rank} element {i}");
            }
            // Later calls of the same size reuse the communicator's
            // staging resources: no pinned allocation after the first.
            for _ in 0..8 {
                comm.device_collective::<f32>(&max, &on)
                    .unwrap()
                    .wait()
                    .unwrap();
            }
            assert_eq!(e.pinned_allocations(), made, "pinned buffers not reused");
        });
    }

    /// The device rule on the stand-in that synchronizes as CUDA does:
    /// device calls that need scratch (an all-to-all in place copies its
    /// input; a tree reduce keeps partial results on inner ranks), issued
    /// back to back on one stream without a host wait, so that a call's
    /// stream is parked at its gate while the progress thread carries out
    /// the call before it and sets up its staging. Any call on the
    /// progress thread that waits for every stream (a free, an
    /// allocation, a module load) waits for the parked stream, which waits
    /// for the progress thread: the stand-in gives up after 3 s and says
    /// so, and names any such call made while a gate is held. Every call
    /// must end well, with the right result.
    #[test]
    fn device_calls_under_a_gate_never_wait_for_the_parked_stream() {
        run_ranks_with(3, config, |comm| {
            let (rank, size) = (comm.rank(), comm.size());
            let e = Arc::new(
                HostEngine::with_delays(Duration::from_micros(100), 11 + rank as u64)
                    .with_sync_limit(Duration::from_secs(3)),
            );
            let stream = e.stream().unwrap();
            let n = 64;
            let a2a = DevicePtr::new(e.alloc_device(n * size * 4).unwrap());
            let red = DevicePtr::new(e.alloc_device(n * 4).unwrap());
            let out = DevicePtr::new(e.alloc_device(n * 4).unwrap());
            let input: Vec<f32> = (0..n * size).map(|i| value(rank, i) as f32).collect();
            e.enqueue_write(stream, a2a, &bytes_of(&input)).unwrap();
            e.enqueue_write(stream, red, &bytes_of(&input[..n]))
                .unwrap();
            let engine: Arc<dyn Engine> = e.clone();
            let on = |send, recv| OnDevice {
                ordinal: 0,
                engine: engine.clone(),
                stream,
                send,
                recv,
            };
            let all_to_all = CollCall {
                in_place: true,
                ..CollCall::new(CollKind::AllToAll, n * size, n * size, n * size)
            };
            let reduce = CollCall {
                op: Some(ReduceOp::Sum),
                root: Some(0),
                ..CollCall::new(CollKind::Reduce, n, n, n)
            };
            let mut works = Vec::new();
            for _ in 0..3 {
                works.push(
                    comm.device_collective::<f32>(&all_to_all, &on(a2a, a2a))
                        .unwrap(),
                );
                works.push(
                    comm.device_collective::<f32>(&reduce, &on(red, out))
                        .unwrap(),
                );
            }
            let got = elems::<f32>(&read_after(&e, stream, a2a, n * size * 4));
            let reduced = elems::<f32>(&read_after(&e, stream, out, n * 4));
            for w in works {
                w.wait().unwrap();
            }
            // Three all-to-alls in place: block r of the result is block
            // `rank` of rank r's input, applied three times, which is a
            // transpose of the blocks done an odd number of times.
            let want: Vec<f64> = (0..n * size)
                .map(|j| value(j / n, rank * n + j % n))
                .collect();
            assert_eq!(got, want, "rank {rank}");
            if rank == 0 {
                let want: Vec<f64> = (0..n)
                    .map(|i| (0..size).map(|r| value(r, i)).sum())
                    .collect();
                assert_eq!(reduced, want, "rank {rank}");
            }
            assert_eq!(e.violations(), Vec::<String>::new(), "the device rule");
        });
    }

    /// Device calls on the legacy default stream (PyTorch's default
    /// stream), on a non-blocking stream (`torch.cuda.Stream()`: PyTorch's
    /// pool makes its streams non-blocking) and on a blocking stream
    /// (`cudaStreamCreate`'s default, as other libraries make them), each
    /// after its input was written on another stream: the legacy stream
    /// follows a blocking writer implicitly, a blocking stream follows the
    /// legacy writer implicitly, and the non-blocking stream follows the
    /// legacy writer through an event (`wait_stream`), as PyTorch orders
    /// them. The results are checked against the f64 reference and no
    /// call breaks the device rule.
    #[test]
    fn device_calls_on_the_legacy_and_torch_like_streams() {
        use ferroccl_cuda::device::LEGACY_STREAM;
        run_ranks_with(2, config, |comm| {
            let (rank, size) = (comm.rank(), comm.size());
            let e = Arc::new(HostEngine::with_delays(
                Duration::from_micros(100),
                21 + rank as u64,
            ));
            let blocking = e.blocking_stream().unwrap();
            let torch_side = e.stream().unwrap();
            let n = 257;
            let streams = [LEGACY_STREAM, torch_side, blocking];
            for (k, stream) in streams.into_iter().chain(streams).enumerate() {
                // The writer: a blocking stream for the legacy stream's
                // call, the legacy stream for the others.
                let writer = match stream {
                    LEGACY_STREAM => blocking,
                    _ => LEGACY_STREAM,
                };
                let buf = DevicePtr::new(e.alloc_device_async(writer, n * 4).unwrap());
                let input: Vec<f32> = (0..n).map(|i| value(rank + k, i) as f32).collect();
                e.enqueue_write(writer, buf, &bytes_of(&input)).unwrap();
                // Only the non-blocking stream needs the event; the
                // legacy stream's implicit order covers the others.
                if stream == torch_side {
                    let written = e.event().unwrap();
                    e.record(written, writer).unwrap();
                    e.stream_wait(stream, written).unwrap();
                }
                let engine: Arc<dyn Engine> = e.clone();
                let on = OnDevice {
                    ordinal: 0,
                    engine,
                    stream,
                    send: buf,
                    recv: buf,
                };
                let call = CollCall {
                    op: Some(ReduceOp::Sum),
                    in_place: true,
                    ..CollCall::new(CollKind::AllReduce, n, n, n)
                };
                let work = comm.device_collective::<f32>(&call, &on).unwrap();
                let got = elems::<f32>(&read_after(&e, stream, buf, n * 4));
                work.wait().unwrap();
                let want: Vec<f64> = (0..n)
                    .map(|i| (0..size).map(|r| value(r + k, i)).sum())
                    .collect();
                assert_eq!(got, want, "rank {rank} call {k}");
            }
        });
    }

    /// A call that fails still lets the caller's stream go (the gate is
    /// raised however the call ends), within the timeout, and its
    /// `DeviceWork` names the rank that never called.
    #[test]
    fn a_failed_device_call_lets_the_stream_go() {
        let results = run_ranks_with(
            2,
            |c| {
                c.transport = Some("mem".into());
                c.timeout = Duration::from_secs(2);
            },
            |comm| {
                if comm.rank() == 1 {
                    // Never calls; stays until rank 0 has timed out.
                    std::thread::sleep(Duration::from_secs(4));
                    return None;
                }
                let e = Arc::new(HostEngine::new());
                let (on, call) = small_allreduce(&e, 16);
                let work = comm.device_collective::<f32>(&call, &on).unwrap();
                // The stream's later work runs (read_after waits at most
                // 30 s; the call gives up after 2).
                read_after(&e, on.stream, on.send, 64);
                Some(work.wait())
            },
        );
        match &results[0] {
            Some(Err(err)) => assert_eq!(err.failed_rank(), Some(1), "{err}"),
            other => panic!("rank 0: {other:?}"),
        }
    }

    /// Send and receive on device memory: each rank sends to the next and
    /// receives from the previous (odd length, both orders of posting).
    #[test]
    fn device_send_and_recv() {
        run_ranks_with(3, config, |comm| {
            let (rank, size) = (comm.rank(), comm.size());
            let e = Arc::new(HostEngine::with_delays(
                Duration::from_micros(100),
                rank as u64,
            ));
            let stream = e.stream().unwrap();
            let n = 301;
            let out = DevicePtr::new(e.alloc_device(n * 4).unwrap());
            let inp = DevicePtr::new(e.alloc_device(n * 4).unwrap());
            let data: Vec<f32> = (0..n).map(|i| value(rank, i) as f32).collect();
            enqueue_write(&e, stream, out, &bytes_of(&data));
            let engine: Arc<dyn Engine> = e.clone();
            let on = OnDevice {
                ordinal: 0,
                engine,
                stream,
                send: out,
                recv: inp,
            };
            let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
            let send = CollCall {
                root: Some(rank),
                p2p: Some((next, true)),
                ..CollCall::new(CollKind::SendRecv, n, n, 0)
            };
            let recv = CollCall {
                root: Some(prev),
                p2p: Some((prev, false)),
                ..CollCall::new(CollKind::SendRecv, n, 0, n)
            };
            // Rank 0 receives first, the others send first: no cycle of
            // blocking sends.
            let order = if rank == 0 {
                [recv, send]
            } else {
                [send, recv]
            };
            let works: Vec<DeviceWork> = order
                .iter()
                .map(|c| comm.device_collective::<f32>(c, &on).unwrap())
                .collect();
            let got = elems::<f32>(&read_after(&e, stream, inp, n * 4));
            for w in works {
                w.wait().unwrap();
            }
            let want: Vec<f64> = (0..n).map(|i| value(prev, i)).collect();
            assert_eq!(got, want, "rank {rank}");
        });
    }
}
