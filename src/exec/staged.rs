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
//! The communicator runs every device call here that the device executor
//! does not take (`Inner::execute_on_device` in comm/execute.rs: send and
//! receive always, collectives where not every pair of ranks has a GPU
//! path); the tests also run it at this level on the host stand-in.

use super::interp::{deadline, finish_recv};
use super::io::{AvgFinish, DeviceBuffers};
use super::verify;
use super::{Call, Links};
use crate::algo::{Operand, Prim, Schedule, Step, NO_PEER};
use crate::element::Element;
use crate::error::{Error, Result};
use ferroccl_cuda::device::{DevicePtr, Engine};
use ferroccl_cuda::stager::{Outgoing, StageConfig, StagePool, Stager};
use ferroccl_cuda::CudaError;
use ferroccl_transport::{FrameHeader, TransportError};
use std::collections::VecDeque;

/// Bounce buffers of a call: two for the chunk received and the chunk
/// sent by one step, the rest for sends copied out ahead.
pub(crate) const DEPTH: usize = 6;
/// How many steps ahead a send may be copied out.
const LOOKAHEAD: usize = 16;

pub(crate) fn device_error(call: &Call, e: CudaError) -> Error {
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

/// Where a call's staging resources come from: made for the call and freed
/// after it, or kept between calls in a pool (the communicator's).
#[derive(Clone, Copy)]
pub(crate) enum Resources<'e> {
    // The executor's own tests stage without a communicator's pool.
    #[cfg_attr(not(test), allow(dead_code))]
    Fresh(&'e dyn Engine),
    Pooled(&'e StagePool),
}

/// Run `schedule` on device buffers `bufs` over `links`, staging through
/// `engine`'s resources; with `avg`, finish Avg on the device. Returns
/// once every copy and kernel has finished (the results are in device
/// memory).
pub(crate) fn run<T: Element>(
    links: &mut Links,
    schedule: &Schedule,
    engine: Resources<'_>,
    bufs: DeviceBuffers,
    call: &Call,
    avg: Option<AvgFinish>,
) -> Result<()> {
    walk::<T>(schedule, engine, bufs, call)?.run(links, schedule, call, avg)
}

/// The walk of `schedule` over a stager sized for its largest step.
fn walk<'e, T: Element>(
    schedule: &Schedule,
    engine: Resources<'e>,
    bufs: DeviceBuffers,
    call: &Call,
) -> Result<Walk<'e>> {
    let elem = std::mem::size_of::<T>();
    let chunk_bytes = schedule.steps.iter().map(|s| s.len).max().unwrap_or(0) * elem;
    let config = StageConfig {
        chunk_bytes,
        depth: DEPTH,
        timeout: call.timeout,
    };
    let (ty, op) = (T::DTYPE, call.op.combining());
    let stager = match engine {
        Resources::Fresh(engine) => Stager::new(engine, ty, op, config),
        Resources::Pooled(pool) => Stager::new_in(pool, ty, op, config),
    }
    .map_err(|e| device_error(call, e))?;
    Ok(Walk {
        stager,
        bufs,
        elem,
        ahead: VecDeque::new(),
        scan: 0,
    })
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
    let mut walk = walk::<T>(schedule, Resources::Fresh(engine), bufs, call)?;
    walk.stager.drop_write_wait_for_test();
    walk.run(links, schedule, call, None)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Algorithm;
    use crate::coll::{self, CollCall, CollKind, Plan};
    use crate::comm::Communicator;
    use crate::element::{DataType, ReduceOp};
    use ferroccl_cuda::host_engine::HostEngine;
    use half::{bf16, f16};
    use std::time::Duration;

    /// Slots of 64 bytes: a few hundred elements make many chunks and a
    /// tail, and cycle every bounce buffer several times.
    const SLOT: usize = 64;
    const STEPS: usize = 4;
    const COUNTS: [usize; 4] = [0, 1, 7, 301];
    /// The stand-in's streams sleep up to this before half of their jobs.
    const DELAY_US: u64 = 20;

    fn configure(algo: Algorithm) -> impl Fn(&mut crate::config::Config) + Sync {
        move |config| {
            config.transport = Some("mem".into());
            config.checkin = false;
            config.algorithm = Some(algo);
            config.steps = STEPS;
            config.buffsize = SLOT * STEPS;
            config.timeout = Duration::from_secs(20);
            // The tuner's measurements are not what these tests are about
            // (and cost seconds per communicator on 2 cores).
            config.calibrate = false;
        }
    }

    fn signed(dtype: DataType) -> bool {
        !matches!(dtype, DataType::U8 | DataType::U32 | DataType::U64)
    }

    /// Input of `rank` at element `i`: small integers, so every result is
    /// exact in every type (sums of 8 ranks fit i8 and bf16; products stay
    /// in {-2..2}) up to Avg's one rounding.
    fn value(dtype: DataType, op: ReduceOp, rank: usize, size: usize, i: usize) -> f64 {
        let h = (i.wrapping_mul(2654435761) ^ rank.wrapping_mul(40503)) % 9;
        match op {
            ReduceOp::Prod if rank == i % size => {
                if signed(dtype) && i.is_multiple_of(3) {
                    -1.0
                } else {
                    2.0
                }
            }
            ReduceOp::Prod => 1.0,
            _ if signed(dtype) => h as f64 - 4.0,
            _ => h as f64,
        }
    }

    /// The f64 reference of `op` over the ranks' element `i`.
    fn reference(dtype: DataType, op: ReduceOp, size: usize, i: usize) -> f64 {
        let vals = (0..size).map(|r| value(dtype, op, r, size, i));
        let float = matches!(
            dtype,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
        );
        match op {
            ReduceOp::Sum => vals.sum(),
            ReduceOp::Prod => vals.product(),
            ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
            ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
            ReduceOp::Avg if float => vals.sum::<f64>() / size as f64,
            ReduceOp::Avg => (vals.sum::<f64>() / size as f64).trunc(),
        }
    }

    /// Avg on floats rounds once: half an ulp of the type, relative.
    fn tolerance(dtype: DataType, op: ReduceOp, want: f64) -> f64 {
        let rel = match (op, dtype) {
            (ReduceOp::Avg, DataType::F16) => 2f64.powi(-11),
            (ReduceOp::Avg, DataType::Bf16) => 2f64.powi(-8),
            (ReduceOp::Avg, DataType::F32) => 2f64.powi(-24),
            (ReduceOp::Avg, DataType::F64) => 2f64.powi(-53),
            _ => 0.0,
        };
        want.abs() * rel * 1.01
    }

    fn to_bytes<T: Element>(v: &[T]) -> Vec<u8> {
        bytemuck::cast_slice(v).to_vec()
    }

    /// One collective on device buffers of this rank's engine, staged;
    /// returns the output (the whole in-place buffer for broadcast).
    fn staged_call<T: Element>(
        comm: &Communicator,
        engine: &HostEngine,
        call: &CollCall,
        input: &[T],
        drop_wait: bool,
    ) -> Result<Vec<T>> {
        let (rank, size) = (comm.rank(), comm.size());
        let elem = std::mem::size_of::<T>();
        let dev = |e| Error::Io(format!("stand-in: {e}"));
        let mut out = None;
        comm.run_on_links_for_test::<T>(call, |plan: &Plan, links, exec_call| {
            let out_len = call.recv_len.max(plan.scratch_output);
            let (bufs, out_ptr) = if call.in_place {
                let buf = DevicePtr::new(engine.alloc_device(call.recv_len * elem).map_err(dev)?);
                let input_at = buf.add(plan.input_base * elem);
                engine
                    .write_device(input_at, &to_bytes(input))
                    .map_err(dev)?;
                let bufs = DeviceBuffers {
                    input: input_at,
                    output: buf.add(plan.output_base * elem),
                };
                (bufs, buf)
            } else {
                let i = DevicePtr::new(engine.alloc_device(call.send_len * elem).map_err(dev)?);
                let o = DevicePtr::new(engine.alloc_device(out_len * elem).map_err(dev)?);
                engine.write_device(i, &to_bytes(input)).map_err(dev)?;
                (
                    DeviceBuffers {
                        input: i,
                        output: o,
                    },
                    o,
                )
            };
            let avg = (call.op == Some(ReduceOp::Avg))
                .then(|| coll::result_range(call, plan, rank))
                .flatten()
                .filter(|_| plan.scratch_output == 0)
                .map(|range| AvgFinish { range, ranks: size });
            if drop_wait {
                run_without_write_wait::<T>(links, &plan.schedule, engine, bufs, exec_call)?;
            } else {
                run::<T>(
                    links,
                    &plan.schedule,
                    Resources::Fresh(engine),
                    bufs,
                    exec_call,
                    avg,
                )?;
            }
            let bytes = engine
                .read_device(out_ptr, call.recv_len * elem)
                .map_err(dev)?;
            out = Some(bytemuck::pod_collect_to_vec::<u8, T>(&bytes));
            engine.free_device(bufs.input.buf);
            engine.free_device(out_ptr.buf);
            Ok(())
        })?;
        Ok(out.expect("ran"))
    }

    /// Run `kind` of `count` with `op` and check this rank's result against
    /// the f64 reference; an error names the case.
    fn check<T: Element>(
        comm: &Communicator,
        engine: &HostEngine,
        kind: CollKind,
        count: usize,
        op: ReduceOp,
    ) -> std::result::Result<(), String> {
        let (rank, n) = (comm.rank(), comm.size());
        let dtype = T::DTYPE;
        let root = count % n;
        let what = format!("{kind:?} {dtype} {op} count {count} on rank {rank} of {n}");
        let v = |r: usize, i: usize| value(dtype, op, r, n, i);
        let make = |len: usize, f: &dyn Fn(usize) -> f64| -> Vec<T> {
            (0..len).map(|i| T::from_f64(f(i))).collect()
        };
        let (call, input): (CollCall, Vec<T>) = match kind {
            CollKind::AllReduce => (
                CollCall::new(kind, count, count, count),
                make(count, &|i| v(rank, i)),
            ),
            CollKind::ReduceScatter => (
                CollCall::new(kind, count, count * n, count),
                make(count * n, &|i| v(rank, i)),
            ),
            CollKind::AllGather => (
                CollCall::new(kind, count, count, count * n),
                make(count, &|i| v(rank, rank * count + i)),
            ),
            CollKind::Broadcast => (
                CollCall {
                    root: Some(root),
                    in_place: true,
                    ..CollCall::new(kind, count, count, count)
                },
                // Only the root's buffer is an input.
                make(count, &|i| if rank == root { v(root, i) } else { 99.0 }),
            ),
            CollKind::Reduce => (
                CollCall {
                    root: Some(root),
                    ..CollCall::new(kind, count, count, count)
                },
                make(count, &|i| v(rank, i)),
            ),
            other => unreachable!("{other:?}"),
        };
        let call = CollCall {
            op: matches!(
                kind,
                CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
            )
            .then_some(op),
            ..call
        };
        let got = staged_call::<T>(comm, engine, &call, &input, false)
            .map_err(|e| format!("{what}: {e}"))?;
        let want: Box<dyn Fn(usize) -> Option<f64>> = match kind {
            CollKind::AllReduce => Box::new(|i| Some(reference(dtype, op, n, i))),
            CollKind::ReduceScatter => {
                Box::new(move |i| Some(reference(dtype, op, n, rank * count + i)))
            }
            CollKind::AllGather => Box::new(move |i| Some(v(i / count.max(1), i))),
            CollKind::Broadcast => Box::new(move |i| Some(v(root, i))),
            // Non-root ranks' outputs are not results.
            _ if rank != root => Box::new(|_| None),
            _ => Box::new(|i| Some(reference(dtype, op, n, i))),
        };
        for (i, g) in got.iter().enumerate() {
            let Some(w) = want(i) else { continue };
            let g = g.to_f64();
            if (g - w).abs() > tolerance(dtype, op, w) {
                return Err(format!("{what}: element {i} is {g}, want {w}"));
            }
        }
        Ok(())
    }

    /// One case of one type: (collective, count, op) to a failure.
    type Case<'a> = &'a dyn Fn(CollKind, usize, ReduceOp) -> std::result::Result<(), String>;

    fn for_each_type(f: &mut dyn FnMut(Case<'_>), comm: &Communicator, engine: &HostEngine) {
        macro_rules! each {
            ($($t:ty),*) => {$(
                f(&|kind, count, op| check::<$t>(comm, engine, kind, count, op));
            )*};
        }
        each!(f32, f64, f16, bf16, i8, u8, i32, u32, i64, u64);
    }

    /// Every collective staged on `n` ranks with `algo` forced, for every
    /// type and count: allreduce with every op, reduce and reduce-scatter
    /// with the ops in turn, allgather and broadcast.
    fn matrix(n: usize, algo: Algorithm) {
        let failures = crate::testing::run_ranks_with(n, configure(algo), |comm| {
            let engine = HostEngine::with_delays(
                Duration::from_micros(DELAY_US),
                17 * n as u64 + comm.rank() as u64,
            );
            let mut failures = Vec::new();
            let mut record = |r: std::result::Result<(), String>| {
                if let Err(e) = r {
                    failures.push(e);
                }
            };
            for_each_type(
                &mut |case| {
                    for (c, count) in COUNTS.into_iter().enumerate() {
                        // Allreduce: every op. Reduce-scatter and reduce:
                        // one op per count, in turn (every op over the
                        // types and counts). Tree runs only where a
                        // collective has one (the rest would repeat ring).
                        for (o, op) in ReduceOp::ALL.into_iter().enumerate() {
                            record(case(CollKind::AllReduce, count, op));
                            if o == c % ReduceOp::ALL.len() {
                                record(case(CollKind::Reduce, count, op));
                                if algo == Algorithm::Ring {
                                    record(case(CollKind::ReduceScatter, count, op));
                                }
                            }
                        }
                        record(case(CollKind::Broadcast, count, ReduceOp::Sum));
                        if algo == Algorithm::Ring {
                            record(case(CollKind::AllGather, count, ReduceOp::Sum));
                        }
                    }
                },
                &comm,
                &engine,
            );
            failures
        });
        let failures: Vec<String> = failures.into_iter().flatten().collect();
        assert!(
            failures.is_empty(),
            "{} failures, first ones: {:#?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
    }

    #[test]
    fn staged_ring_1_to_4_ranks() {
        for n in 1..=4 {
            matrix(n, Algorithm::Ring);
        }
    }

    #[test]
    fn staged_ring_5_to_8_ranks() {
        for n in 5..=8 {
            matrix(n, Algorithm::Ring);
        }
    }

    #[test]
    fn staged_tree_1_to_4_ranks() {
        for n in 1..=4 {
            matrix(n, Algorithm::Tree);
        }
    }

    #[test]
    fn staged_tree_5_to_8_ranks() {
        for n in 5..=8 {
            matrix(n, Algorithm::Tree);
        }
    }

    /// The tests can fail: with the wait of copies out on the reduction
    /// kernels dropped, a ring allreduce sends partial sums before the
    /// stand-in's kernel wrote them, and some rank ends with a wrong
    /// result (or the call fails), where the same calls with the wait pass.
    #[test]
    fn a_dropped_dependency_is_caught() {
        let count = 301;
        for drop_wait in [false, true] {
            let results = crate::testing::run_ranks_with(3, configure(Algorithm::Ring), |comm| {
                let engine =
                    HostEngine::with_delays(Duration::from_micros(200), comm.rank() as u64);
                let rank = comm.rank();
                let input: Vec<u32> = (0..count as u32).map(|i| i * 3 + rank as u32).collect();
                let call = CollCall {
                    op: Some(ReduceOp::Sum),
                    ..CollCall::new(CollKind::AllReduce, count, count, count)
                };
                let mut bad = 0usize;
                for _ in 0..3 {
                    match staged_call::<u32>(&comm, &engine, &call, &input, drop_wait) {
                        Ok(got) => {
                            let want = (0..count as u32).map(|i| i * 9 + 3);
                            bad += got.iter().zip(want).filter(|(g, w)| **g != *w).count();
                        }
                        Err(_) => return usize::MAX,
                    }
                }
                bad
            });
            let wrong: usize = results.iter().map(|&b| b.min(1 << 20)).sum();
            if drop_wait {
                assert!(wrong > 0, "a missing wait went unnoticed: {results:?}");
            } else {
                assert_eq!(wrong, 0, "{results:?}");
            }
        }
    }
}
