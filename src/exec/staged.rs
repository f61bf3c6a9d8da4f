//! The staged executor: runs a schedule (the same primitives the host
//! interpreter runs, `interp`) on buffers in device memory, over the host
//! data path of the connections, through ferroccl-cuda's `Stager`: data
//! leaves the device through pinned bounce buffers (device-to-host copy,
//! then the transport sends from the buffer) and arrives through them
//! (the transport receives into a buffer, a host-to-device copy lands it,
//! the reduction kernel combines it on the device). Sends whose data is
//! already final are copied out ahead of their step, so the copies of
//! later chunks overlap the transfer of earlier ones; landing and reducing
//! a chunk never blocks the host. docs/staging.md has the design.
//!
//! Not wired into the communicator yet: the device entry points are being
//! designed; the tests run it at this level on the host stand-in.

// Only the tests reach it until the device entry points call it.
#![cfg_attr(not(test), allow(dead_code))]

use super::interp::{deadline, finish_recv};
use super::verify;
use super::{Call, Links};
use crate::algo::{Operand, Prim, Schedule, Step, NO_PEER};
use crate::element::{DataType, Element, ReduceOp};
use crate::error::{Error, Result};
use ferroccl_cuda::staging::{DevicePtr, Engine, Outgoing, StageConfig, Stager};
use ferroccl_cuda::{CudaError, Op, Ty};
use ferroccl_transport::{FrameHeader, TransportError};
use std::collections::VecDeque;
use std::ops::Range;

/// Bounce buffers of a call: two for the chunk received and the chunk
/// sent by one step, the rest for sends copied out ahead.
pub(crate) const DEPTH: usize = 6;
/// How many steps ahead a send may be copied out.
const LOOKAHEAD: usize = 16;

/// A call's buffers in device memory: where element 0 of the input and of
/// the output live (in place: the same allocation at the plan's bases).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceBuffers {
    pub(crate) input: DevicePtr,
    pub(crate) output: DevicePtr,
}

/// Avg's end on a rank that holds a result: divide `range` of the output
/// by `ranks`, on the device, after the schedule.
#[derive(Debug, Clone)]
pub(crate) struct AvgFinish {
    pub(crate) range: Range<usize>,
    pub(crate) ranks: usize,
}

/// The kernels' name of an element type.
pub(crate) fn ty(dtype: DataType) -> Ty {
    match dtype {
        DataType::F32 => Ty::F32,
        DataType::F64 => Ty::F64,
        DataType::F16 => Ty::F16,
        DataType::Bf16 => Ty::Bf16,
        DataType::I8 => Ty::I8,
        DataType::U8 => Ty::U8,
        DataType::I32 => Ty::I32,
        DataType::U32 => Ty::U32,
        DataType::I64 => Ty::I64,
        DataType::U64 => Ty::U64,
    }
}

/// The kernels' name of an operator.
pub(crate) fn op(op: ReduceOp) -> Op {
    match op {
        ReduceOp::Sum => Op::Sum,
        ReduceOp::Prod => Op::Prod,
        ReduceOp::Min => Op::Min,
        ReduceOp::Max => Op::Max,
        ReduceOp::Avg => Op::Avg,
    }
}

fn device_error(call: &Call, e: CudaError) -> Error {
    Error::Io(format!("{}: device staging: {e}", call.during()))
}

/// What a step reads as its local operand, in bytes of device memory.
fn local_of(bufs: &DeviceBuffers, step: &Step, elem: usize) -> DevicePtr {
    match step.local {
        Operand::Input => bufs.input.add(step.input * elem),
        Operand::Output => bufs.output.add(step.output * elem),
    }
}

fn output_of(bufs: &DeviceBuffers, step: &Step, elem: usize) -> DevicePtr {
    bufs.output.add(step.output * elem)
}

/// Whether the step's local operand is the output at the same place (a
/// copy to the output is then nothing to do).
fn local_is_output(bufs: &DeviceBuffers, step: &Step, elem: usize) -> bool {
    local_of(bufs, step, elem) == output_of(bufs, step, elem)
}

/// Whether a send step's data is final when the call starts, unless an
/// earlier step writes over it: a plain send or copy-send of data.
fn sends_local(step: &Step) -> bool {
    matches!(step.prim, Prim::Send | Prim::CopySend) && step.len > 0
}

/// Run `schedule` on device buffers `bufs` over `links`, staging through
/// `engine`; with `avg`, finish Avg on the device. Returns once every copy
/// and kernel has finished (the results are in device memory).
pub(crate) fn run<T: Element>(
    links: &mut Links,
    schedule: &Schedule,
    engine: &dyn Engine,
    bufs: DeviceBuffers,
    call: &Call,
    avg: Option<AvgFinish>,
) -> Result<()> {
    let elem = std::mem::size_of::<T>();
    let chunk_bytes = schedule.steps.iter().map(|s| s.len).max().unwrap_or(0) * elem;
    let config = StageConfig {
        chunk_bytes,
        depth: DEPTH,
        timeout: call.timeout,
    };
    let stager = Stager::new(engine, ty(T::DTYPE), op(call.op.combining()), config)
        .map_err(|e| device_error(call, e))?;
    Walk {
        stager,
        bufs,
        elem,
        ahead: VecDeque::new(),
        scan: 0,
    }
    .run(links, schedule, call, avg)
}

/// The test that proves the stand-in catches a missing dependency runs
/// the executor with one wait dropped.
#[cfg(test)]
fn run_without_write_wait<T: Element>(
    links: &mut Links,
    schedule: &Schedule,
    engine: &dyn Engine,
    bufs: DeviceBuffers,
    call: &Call,
) -> Result<()> {
    let elem = std::mem::size_of::<T>();
    let chunk_bytes = schedule.steps.iter().map(|s| s.len).max().unwrap_or(0) * elem;
    let config = StageConfig {
        chunk_bytes,
        depth: DEPTH,
        timeout: call.timeout,
    };
    let mut stager = Stager::new(engine, ty(T::DTYPE), op(call.op.combining()), config)
        .map_err(|e| device_error(call, e))?;
    stager.drop_write_wait_for_test();
    Walk {
        stager,
        bufs,
        elem,
        ahead: VecDeque::new(),
        scan: 0,
    }
    .run(links, schedule, call, None)
}

struct Walk<'e> {
    stager: Stager<'e>,
    bufs: DeviceBuffers,
    elem: usize,
    /// Sends copied out ahead of their step: (step index, chunk), in step
    /// order.
    ahead: VecDeque<(usize, Outgoing)>,
    /// The next step to consider copying out ahead.
    scan: usize,
}

impl Walk<'_> {
    fn run(
        mut self,
        links: &mut Links,
        schedule: &Schedule,
        call: &Call,
        avg: Option<AvgFinish>,
    ) -> Result<()> {
        let steps = &schedule.steps;
        for (i, step) in steps.iter().enumerate() {
            self.prefetch(steps, i).map_err(|e| device_error(call, e))?;
            let early = match self.ahead.front() {
                Some((j, _)) if *j == i => self.ahead.pop_front().map(|(_, out)| out),
                _ => None,
            };
            self.step(links, step, early, call)?;
        }
        let result = avg.map_or(Ok(()), |avg| {
            let at = self.bufs.output.add(avg.range.start * self.elem);
            self.stager.avg_finish(at, avg.range.len(), avg.ranks)
        });
        result
            .and_then(|()| self.stager.finish())
            .map_err(|e| device_error(call, e))
    }

    /// Copy out ahead the sends among the next steps whose data no step
    /// before them (from `current` on) writes, while bounce buffers beyond
    /// the two a step needs are free.
    fn prefetch(&mut self, steps: &[Step], current: usize) -> ferroccl_cuda::Result<()> {
        self.scan = self.scan.max(current);
        while self.scan < steps.len()
            && self.scan < current + LOOKAHEAD
            && self.stager.available() > 2
        {
            let j = self.scan;
            let step = &steps[j];
            if sends_local(step) {
                let bytes = step.len * self.elem;
                let src = local_of(&self.bufs, step, self.elem);
                let overwritten = steps[current..j].iter().any(|k| {
                    k.prim.writes_output()
                        && output_of(&self.bufs, k, self.elem).overlaps(
                            k.len * self.elem,
                            src,
                            bytes,
                        )
                });
                if overwritten {
                    break;
                }
                let out = self.stager.stage_out(src, bytes)?;
                self.ahead.push_back((j, out));
            }
            self.scan += 1;
        }
        Ok(())
    }

    fn step(
        &mut self,
        links: &mut Links,
        step: &Step,
        early: Option<Outgoing>,
        call: &Call,
    ) -> Result<()> {
        let header = FrameHeader::data(call.fingerprint, step.send_tag);
        let elem = self.elem;
        let bytes = step.len * elem;
        let bufs = self.bufs;
        let st = &mut self.stager;
        let cuda = |e| device_error(call, e);
        let transport = |e| Error::from_transport(e, &call.during());
        match step.prim {
            Prim::Copy => {
                if !local_is_output(&bufs, step, elem) {
                    let src = bufs.input.add(step.input * elem);
                    st.copy(output_of(&bufs, step, elem), src, bytes)
                        .map_err(cuda)?;
                }
                Ok(())
            }
            Prim::Reduce => {
                let out = output_of(&bufs, step, elem);
                let input = bufs.input.add(step.input * elem);
                st.reduce(out, out, input, step.len).map_err(cuda)
            }
            Prim::Send | Prim::CopySend => {
                if step.prim == Prim::CopySend && !local_is_output(&bufs, step, elem) {
                    let src = bufs.input.add(step.input * elem);
                    st.copy(output_of(&bufs, step, elem), src, bytes)
                        .map_err(cuda)?;
                }
                let sender = links.sender(step.channel, step.send_to, call)?;
                if bytes == 0 {
                    return sender
                        .send_from_until(header, deadline(call), &[])
                        .map_err(transport);
                }
                let out = match early {
                    Some(out) => out,
                    None => st
                        .stage_out(local_of(&bufs, step, elem), bytes)
                        .map_err(cuda)?,
                };
                st.send(out, |data| {
                    sender.send_from_until(header, deadline(call), data)
                })
                .map_err(cuda)?
                .map_err(transport)
            }
            prim => {
                let to = if prim.sends() { step.send_to } else { NO_PEER };
                let (receiver, mut sender) =
                    links.receiver_and_sender(step.channel, step.recv_from, to, call)?;
                let mut found: Option<Error> = None;
                let mut check = |h: &FrameHeader| {
                    verify::frame(call, step, elem, h).map_err(|e| {
                        found = Some(e);
                        TransportError::Aborted
                    })
                };
                let (chunk, received) = st
                    .receive(bytes, |dst| {
                        receiver.recv_into_until(deadline(call), &mut check, dst)
                    })
                    .map_err(cuda)?;
                if let Err(e) = finish_recv(received, found, call) {
                    st.discard(chunk);
                    return Err(e);
                }
                if bytes == 0 {
                    st.discard(chunk);
                    if let Some(sender) = sender {
                        return sender
                            .send_from_until(header, deadline(call), &[])
                            .map_err(transport);
                    }
                    return Ok(());
                }
                let out = output_of(&bufs, step, elem);
                let local = local_of(&bufs, step, elem);
                match prim {
                    Prim::Recv => st.land(chunk, out).map_err(cuda),
                    Prim::RecvReduceCopy => st
                        .land_reduce(chunk, local, Some(out))
                        .map(drop)
                        .map_err(cuda),
                    Prim::RecvCopySend => {
                        // Forward the bytes as they arrived, then land them.
                        let sender = sender.as_mut().expect("schedule step sends");
                        let sent = st.forward(&chunk, |data| {
                            sender.send_from_until(header, deadline(call), data)
                        });
                        match sent {
                            Ok(Ok(())) => st.land(chunk, out).map_err(cuda),
                            Ok(Err(e)) => {
                                st.discard(chunk);
                                Err(transport(e))
                            }
                            Err(e) => {
                                st.discard(chunk);
                                Err(cuda(e))
                            }
                        }
                    }
                    Prim::RecvReduceSend | Prim::RecvReduceCopySend => {
                        let dst = (prim == Prim::RecvReduceCopySend).then_some(out);
                        let result = st.land_reduce(chunk, local, dst).map_err(cuda)?;
                        let staged = st.stage_out(result, bytes).map_err(cuda)?;
                        let sender = sender.as_mut().expect("schedule step sends");
                        st.send(staged, |data| {
                            sender.send_from_until(header, deadline(call), data)
                        })
                        .map_err(cuda)?
                        .map_err(transport)
                    }
                    Prim::Send | Prim::CopySend | Prim::Copy | Prim::Reduce => {
                        unreachable!("handled above")
                    }
                }
            }
        }
    }
}
