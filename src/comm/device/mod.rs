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
            let result = inner.execute(&plan, Io::<T>::Device(Box::new(io)), c);
            drop(held);
            result
        })?;
        let during = work.during.clone();
        let (gate, value) = gated.ok_or_else(|| Error::Io(format!("{during}: no device gate")))?;
        let limit = self.inner.config.timeout.saturating_mul(4);
        if setup != SetUp::None || !self.inner.config.device_async {
            // The device rule: set-up allocates, maps and loads modules,
            // which wait for every stream; so the stream is not parked, and
            // the caller waits for the call (bounded: every wait in it is).
            // Later work on the stream sees the result: the call has ended.
            // So does every call unless `Config::device_async`: a parked
            // stream can hold the progress thread's driver calls back
            // (docs/staging.md, "Why device calls block").
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
mod tests;
