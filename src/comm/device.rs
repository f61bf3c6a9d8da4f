//! Collectives on device buffers through the communicator: the call takes
//! its place in the order like any other, waits for the earlier work of
//! the caller's stream, and runs its schedule through the staged executor
//! (`exec::staged`), which returns once every copy and kernel has finished.
//! So later work on the caller's stream sees the result; the call blocks
//! the calling thread meanwhile (enqueue-and-return is the next step:
//! docs/staging.md).
//!
//! Crate-internal for now: the public entry points (cudarc slices and a
//! stream, and a raw-pointer one) are built on this.

// Reached from the tests until the public entry points call it.
#![cfg_attr(not(test), allow(dead_code))]

use super::Communicator;
use crate::coll::{self, CollCall};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::{AvgFinish, DeviceBuffers, DeviceIo, Io};
use crate::plan::Memory;
use ferroccl_cuda::staging::{DevicePtr, Engine, Stream};
use std::sync::Arc;

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

impl Communicator {
    /// Run `call` on the device buffers of `on` (see the module docs).
    pub(crate) fn device_collective<T: Element>(
        &self,
        call: &CollCall,
        on: &OnDevice,
    ) -> Result<()> {
        let call = CollCall {
            memory: Memory::Device {
                ordinal: on.ordinal,
            },
            ..*call
        };
        let plan = self.plan::<T>(&call)?;
        let elem = std::mem::size_of::<T>();
        let device_err = |e| Error::Io(format!("{} on device memory: {e}", call.kind.name()));
        // A schedule that keeps partial results in an output the caller did
        // not give (a tree reduce's inner ranks) gets device scratch.
        let scratch = match plan.scratch_output {
            0 => None,
            n => Some(on.engine.alloc_device(n * elem).map_err(device_err)?),
        };
        // A schedule that reads its input after writing its output at the
        // same place runs in place from a copy of the input (as on the
        // host), made on the caller's stream, after its earlier work.
        let copy = if call.in_place
            && scratch.is_none()
            && plan.copies_input
            && plan.input_base == 0
            && plan.output_base == 0
        {
            let bytes = call.send_len * elem;
            let made = on.engine.alloc_device(bytes).map_err(device_err)?;
            if let Err(e) = on
                .engine
                .d2d(on.stream, DevicePtr::new(made), on.send, bytes)
            {
                on.engine.free_device(made);
                return Err(device_err(e));
            }
            Some(made)
        } else {
            None
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
        let io = Io::<T>::Device(DeviceIo {
            ordinal: on.ordinal,
            bufs,
            engine: on.engine.clone(),
            stream: on.stream,
            avg,
        });
        let result = self.run_blocking(self.spec::<T>(&call), &plan, io);
        // The staged run has waited for all its work: nothing uses these.
        for s in scratch.into_iter().chain(copy) {
            on.engine.free_device(s);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::CollKind;
    use crate::element::DataType;
    use crate::testing::run_ranks_with;
    use ferroccl_cuda::staging::HostEngine;
    use std::time::Duration;

    fn config(c: &mut crate::Config) {
        c.transport = Some("mem".into());
        c.timeout = Duration::from_secs(60);
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

    /// Put `data` in device memory by work enqueued on `stream` (a copy
    /// from pinned memory, which the stand-in may delay) without waiting
    /// for it: the call must wait for it itself.
    fn enqueue_write(e: &HostEngine, stream: Stream, at: DevicePtr, data: &[u8]) {
        let pin = e.alloc_pinned(data.len().max(1)).unwrap();
        e.with_pinned(pin, &mut |m| m[..data.len()].copy_from_slice(data))
            .unwrap();
        e.h2d(stream, at, pin, 0, data.len()).unwrap();
    }

    /// Read `bytes` at `at` by work enqueued on `stream` after the call,
    /// waiting only for that work: the call's result must be there.
    fn read_after(e: &HostEngine, stream: Stream, at: DevicePtr, bytes: usize) -> Vec<u8> {
        let pin = e.alloc_pinned(bytes.max(1)).unwrap();
        e.d2h(stream, pin, 0, at, bytes).unwrap();
        let done = e.event().unwrap();
        e.record(done, stream).unwrap();
        e.host_wait(done, Duration::from_secs(30)).unwrap();
        let mut out = Vec::new();
        e.with_pinned(pin, &mut |m| out = m[..bytes].to_vec())
            .unwrap();
        out
    }

    /// Every collective of the staged path through the communicator, in
    /// place and out of place, on 1-4 thread ranks each with its own
    /// stand-in device (random delays), f32 and bf16 and i32, Sum and Avg:
    /// the input is written by work still pending on the caller's stream,
    /// the output read by work enqueued after the call, and both checked
    /// against an f64 reference.
    #[test]
    fn device_calls_order_with_the_callers_stream() {
        fn run<T: Element>(n: usize) {
            run_ranks_with(n, config, |comm| {
                let (rank, size) = (comm.rank(), comm.size());
                let e = Arc::new(HostEngine::with_delays(
                    Duration::from_micros(200),
                    rank as u64 + 1,
                ));
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
                ] {
                    let block = 37; // elements per rank: not a multiple of anything
                    let (send_len, recv_len) = match kind {
                        CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => {
                            (block, block)
                        }
                        CollKind::ReduceScatter => (block * size, block),
                        _ => (block, block * size),
                    };
                    let root = (kind == CollKind::Broadcast || kind == CollKind::Reduce)
                        .then_some(size - 1);
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
                                CollKind::ReduceScatter | CollKind::AllGather => block,
                                _ => block,
                            },
                            if in_place { buf_len } else { send_len },
                            if in_place { buf_len } else { recv_len },
                        )
                    };
                    // This rank's input: in place, where the collective
                    // reads it (an allgather's own block).
                    let input: Vec<T> =
                        (0..send_len).map(|i| T::from_f64(value(rank, i))).collect();
                    let send = DevicePtr::new(e.alloc_device(buf_len * elem).unwrap());
                    let recv = DevicePtr::new(e.alloc_device(buf_len * elem).unwrap());
                    let at = if in_place && kind == CollKind::AllGather {
                        send.add(rank * block * elem)
                    } else {
                        send
                    };
                    enqueue_write(&e, stream, at, &bytes_of(&input));
                    let engine: Arc<dyn Engine> = e.clone();
                    let on = OnDevice {
                        ordinal: 0,
                        engine,
                        stream,
                        send,
                        recv,
                    };
                    comm.device_collective::<T>(&call, &on)
                        .unwrap_or_else(|err| panic!("{kind:?} {op} in place {in_place}: {err}"));
                    // In place, a reduce-scatter leaves this rank's block
                    // where it lay in the input.
                    let out_at = match (in_place, kind) {
                        (false, _) => recv,
                        (true, CollKind::ReduceScatter) => send.add(rank * block * elem),
                        (true, _) => send,
                    };
                    let got = elems::<T>(&read_after(&e, stream, out_at, recv_len * elem));
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
                        CollKind::Broadcast => {
                            Some((0..block).map(|i| value(size - 1, i)).collect())
                        }
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
                    e.free_device(send.buf);
                    e.free_device(recv.buf);
                }
            });
        }
        for n in [1, 2, 3, 4] {
            run::<f32>(n);
            run::<half::bf16>(n);
            run::<i32>(n);
        }
    }
}
