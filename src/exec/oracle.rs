//! The test oracle of the device executor (compiled for tests only): the
//! host interpreter of device programs (`algo::encode`). It runs the
//! decoded programs of every rank of a call in one thread, each channel of
//! each rank a stream of its own (as each thread block will be on the
//! device), over bounded in-memory FIFOs per (sender, receiver, channel),
//! on real element types with the host executor's kernels and order of
//! combination. CI runs it against the host executor (`interp`) on the
//! same inputs: equal bits prove that the encoding carries everything a
//! schedule says, without a GPU.
//!
//! Why one file of about 1,580 lines: compiled for tests only, it is one
//! interpreter (its FIFOs, per-channel streams and the launcher decisions
//! around a program) whose parts share one state; its kernel runners,
//! which are separable, are already in `oracle/`.
//!
//! It also holds, for these tests, what a launcher decides around a
//! program (how a call's buffers are laid out for its schedule, Avg's
//! division), as the communicator decides it for the host executor; the
//! real device launcher decides the same in `comm::device` and
//! `comm::device_exec`. The files of `oracle/` run the executor's kernel
//! source against the same results: built for the host (`kernel_host`,
//! `host_launch`) or on a GPU (`kernel_gpu`). No transport, no clock, no
//! `unsafe` in this file.

use crate::algo::encode::{Layout, Program, ProgramMeta};
use crate::algo::{Operand, Prim, Step};
use crate::coll::{self, CollCall, Plan};
use crate::element::{Element, ReduceOp};
use crate::reduce::{reduce_into, reduce_to};
use std::collections::{HashMap, VecDeque};

/// A rank's buffers, laid out as its program's header says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Buffers<T> {
    /// Input and output apart.
    Separate {
        /// The input.
        input: Vec<T>,
        /// The output.
        output: Vec<T>,
    },
    /// One buffer; the program's header says where input and output
    /// start.
    Shared {
        /// The buffer.
        buf: Vec<T>,
    },
}

/// A call's buffers as the caller hands them over.
#[derive(Debug, Clone)]
pub(crate) enum Caller<T> {
    /// Send and receive buffers.
    OutOfPlace { send: Vec<T>, recv: Vec<T> },
    /// One buffer.
    InPlace { buf: Vec<T> },
}

/// Which buffers a call's schedule runs on, its program's layout, and
/// where Avg's division lands in them, as `Communicator::collective` and
/// `run_slots` decide it for the host executor: a temporary output where
/// the plan asks for one, a copy of the input where the schedule reads it
/// after writing the output, else the caller's buffers.
pub(crate) fn launch<T: Element>(
    call: &CollCall,
    plan: &Plan,
    (rank, size): (usize, usize),
    caller: Caller<T>,
) -> Result<(ProgramMeta, Buffers<T>), String> {
    let (layout, bufs) = match caller {
        Caller::OutOfPlace { send, recv: _ } if plan.scratch_output > 0 => (
            Layout::Separate,
            Buffers::Separate {
                input: send,
                output: vec![T::zeroed(); plan.scratch_output],
            },
        ),
        Caller::OutOfPlace { send, recv } => (
            Layout::Separate,
            Buffers::Separate {
                input: send,
                output: recv,
            },
        ),
        Caller::InPlace { buf } if plan.scratch_output > 0 => (
            Layout::Separate,
            Buffers::Separate {
                input: buf,
                output: vec![T::zeroed(); plan.scratch_output],
            },
        ),
        Caller::InPlace { buf }
            if plan.copies_input && plan.input_base == 0 && plan.output_base == 0 =>
        {
            (
                Layout::Separate,
                Buffers::Separate {
                    input: buf.clone(),
                    output: buf,
                },
            )
        }
        Caller::InPlace { buf } => (
            Layout::Shared {
                input_base: plan.input_base,
                output_base: plan.output_base,
            },
            Buffers::Shared { buf },
        ),
    };
    let finish = coll::avg_finish(call, plan, rank, size, layout)?;
    let meta = ProgramMeta {
        rank,
        ranks: size,
        dtype: T::DTYPE,
        op: call.op,
        layout,
        finish,
    };
    Ok((meta, bufs))
}

/// In which order the streams take turns.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Turns {
    /// One step per stream, rank by rank, channel by channel.
    RoundRobin,
    /// Streams in a new pseudo-random order every round, each running a
    /// pseudo-random burst of one to three steps (seeded).
    Shuffled(u64),
}

/// Why a set of programs could not run to the end.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InterpretError {
    /// The programs or buffers do not belong together.
    #[error("programs and buffers do not fit together: {0}")]
    Inconsistent(String),
    /// A frame's tag is not the one the step expects.
    #[error("rank {rank} channel {channel} step {index} ({prim:?}): expected tag {want} from rank {from}, got {got}")]
    Tag {
        rank: usize,
        channel: usize,
        index: usize,
        prim: Prim,
        from: usize,
        want: u32,
        got: u32,
    },
    /// A frame's length is not the step's.
    #[error("rank {rank} channel {channel} step {index} ({prim:?}): expected {want} elements from rank {from}, got {got}")]
    Length {
        rank: usize,
        channel: usize,
        index: usize,
        prim: Prim,
        from: usize,
        want: usize,
        got: usize,
    },
    /// No stream can move and some have steps left.
    #[error("deadlock, no stream can move: {0}")]
    Deadlock(String),
    /// Every stream ended with frames left in FIFOs.
    #[error("frames never received: {0}")]
    Unreceived(String),
}

/// A rank's buffers with its program's bases, addressed as the host
/// executor's `HostIo` addresses them.
struct View<'a, T> {
    mem: &'a mut Buffers<T>,
    input_base: usize,
    output_base: usize,
}

impl<T: Element> View<'_, T> {
    fn input(&self, off: usize, len: usize) -> Vec<T> {
        match &*self.mem {
            Buffers::Separate { input, .. } => input[off..off + len].to_vec(),
            Buffers::Shared { buf } => {
                buf[self.input_base + off..self.input_base + off + len].to_vec()
            }
        }
    }

    fn output(&mut self, off: usize, len: usize) -> &mut [T] {
        match &mut *self.mem {
            Buffers::Separate { output, .. } => &mut output[off..off + len],
            Buffers::Shared { buf } => {
                &mut buf[self.output_base + off..self.output_base + off + len]
            }
        }
    }

    fn local(&mut self, step: &Step) -> Vec<T> {
        match step.local {
            Operand::Input => self.input(step.input, step.len),
            Operand::Output => self.output(step.output, step.len).to_vec(),
        }
    }

    /// Whether the step's local operand is its output's memory: the
    /// executor then combines into the output (`output op frame`), else
    /// it writes `frame op local`.
    fn aliased(&self, step: &Step) -> bool {
        step.local == Operand::Output
            || (matches!(self.mem, Buffers::Shared { .. })
                && self.input_base + step.input == self.output_base + step.output)
    }

    /// Run `step` with the frame it received; returns the frame it sends.
    fn run(&mut self, op: ReduceOp, step: &Step, frame: Option<Vec<T>>) -> Option<Vec<T>> {
        let (len, data) = (step.len, frame.unwrap_or_default());
        match step.prim {
            Prim::Copy => {
                if step.local == Operand::Input {
                    let v = self.input(step.input, len);
                    self.output(step.output, len).copy_from_slice(&v);
                }
                None
            }
            Prim::Reduce => {
                let v = self.input(step.input, len);
                reduce_into(op, self.output(step.output, len), &v);
                None
            }
            Prim::Send => Some(self.local(step)),
            Prim::CopySend => {
                let v = self.local(step);
                if step.local == Operand::Input {
                    self.output(step.output, len).copy_from_slice(&v);
                }
                Some(v)
            }
            Prim::Recv => {
                self.output(step.output, len).copy_from_slice(&data);
                None
            }
            Prim::RecvCopySend => {
                self.output(step.output, len).copy_from_slice(&data);
                Some(data)
            }
            Prim::RecvReduceSend => {
                let local = self.local(step);
                let mut out = vec![T::zeroed(); len];
                reduce_to(op, &mut out, &data, &local);
                Some(out)
            }
            Prim::RecvReduceCopy | Prim::RecvReduceCopySend => {
                if self.aliased(step) {
                    reduce_into(op, self.output(step.output, len), &data);
                } else {
                    let input = self.input(step.input, len);
                    reduce_to(op, self.output(step.output, len), &data, &input);
                }
                step.prim
                    .sends()
                    .then(|| self.output(step.output, len).to_vec())
            }
        }
    }
}

/// Deterministic pseudo-random numbers (splitmix64) for `Turns::Shuffled`.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Check that `programs` (rank r's at index r) and `bufs` belong together.
fn check_fit<T: Element>(
    programs: &[Program],
    bufs: &[Buffers<T>],
) -> Result<Option<ReduceOp>, InterpretError> {
    let bad = |s: String| Err(InterpretError::Inconsistent(s));
    if programs.len() != bufs.len() {
        return bad(format!(
            "{} programs, {} sets of buffers",
            programs.len(),
            bufs.len()
        ));
    }
    let op = programs.first().and_then(|p| p.meta.op);
    for (r, (p, b)) in programs.iter().zip(bufs).enumerate() {
        let m = &p.meta;
        if m.rank != r || m.ranks != programs.len() {
            return bad(format!(
                "program {r} is rank {}'s of {}, with {} programs",
                m.rank,
                m.ranks,
                programs.len()
            ));
        }
        if m.dtype != T::DTYPE {
            return bad(format!(
                "rank {r}'s program is for {}, the buffers hold {}",
                m.dtype,
                T::DTYPE
            ));
        }
        if m.op != op {
            return bad(format!("rank {r}'s op is {:?}, rank 0's {op:?}", m.op));
        }
        fits(p, b).map_err(|e| InterpretError::Inconsistent(format!("rank {r}'s {e}")))?;
    }
    Ok(op)
}

/// Whether `b` holds everything `p` touches, laid out as `p` says.
pub(crate) fn fits<T>(p: &Program, b: &Buffers<T>) -> Result<(), String> {
    let short = |which: &str, have: usize, need: usize| {
        Err(format!(
            "{which} has {have} elements, its program needs {need}"
        ))
    };
    match (p.meta.layout, b) {
        (Layout::Separate, Buffers::Separate { input, output }) => {
            if input.len() < p.input_extent {
                return short("input", input.len(), p.input_extent);
            }
            if output.len() < p.output_extent {
                return short("output", output.len(), p.output_extent);
            }
            Ok(())
        }
        (
            Layout::Shared {
                input_base,
                output_base,
            },
            Buffers::Shared { buf },
        ) => {
            let need = (input_base + p.input_extent).max(output_base + p.output_extent);
            if buf.len() < need {
                return short("buffer", buf.len(), need);
            }
            Ok(())
        }
        (layout, _) => Err(format!(
            "program has layout {layout:?}, its buffers the other"
        )),
    }
}

/// FIFOs of frames (tag, elements) by (sender, receiver, channel).
type Fifos<T> = HashMap<(usize, usize, usize), VecDeque<(u32, Vec<T>)>>;

/// Run `programs` (rank r's at index r) on `bufs` until every channel of
/// every rank has run its last step, then Avg's division where a program
/// says so. Each FIFO holds at most `cap` frames; a step runs once its
/// frame in has come (tag and length checked) and its FIFO out has room.
/// A deadlock (no stream can move) or frames never received end it with
/// an error, never a hang.
pub(crate) fn interpret<T: Element>(
    programs: &[Program],
    bufs: &mut [Buffers<T>],
    cap: usize,
    turns: Turns,
) -> Result<(), InterpretError> {
    let op = check_fit(programs, bufs)?.unwrap_or(ReduceOp::Sum);
    let streams: Vec<(usize, usize)> = programs
        .iter()
        .enumerate()
        .flat_map(|(r, p)| (0..p.channels.len()).map(move |c| (r, c)))
        .collect();
    let mut pc = vec![0usize; streams.len()];
    let mut fifo: Fifos<T> = HashMap::new();
    let mut dice = Dice(match turns {
        Turns::Shuffled(seed) => seed,
        Turns::RoundRobin => 0,
    });
    let mut order: Vec<usize> = (0..streams.len()).collect();
    loop {
        if let Turns::Shuffled(_) = turns {
            for i in (1..order.len()).rev() {
                order.swap(i, dice.below(i + 1));
            }
        }
        let mut moved = false;
        for &s in &order {
            let burst = match turns {
                Turns::RoundRobin => 1,
                Turns::Shuffled(_) => 1 + dice.below(3),
            };
            for _ in 0..burst {
                if try_step(programs, bufs, &mut fifo, streams[s], &mut pc[s], cap, op)? {
                    moved = true;
                } else {
                    break;
                }
            }
        }
        let done = streams
            .iter()
            .zip(&pc)
            .all(|(&(r, c), &i)| i == programs[r].channels[c].len());
        if done {
            break;
        }
        if !moved {
            return Err(InterpretError::Deadlock(stuck(
                programs, &streams, &pc, &fifo, cap,
            )));
        }
    }
    let left: Vec<String> = fifo
        .iter()
        .filter(|(_, q)| !q.is_empty())
        .map(|((from, to, c), q)| format!("{} from rank {from} to {to} on channel {c}", q.len()))
        .collect();
    if !left.is_empty() {
        return Err(InterpretError::Unreceived(left.join(", ")));
    }
    for (p, b) in programs.iter().zip(bufs.iter_mut()) {
        if let Some(f) = p.meta.finish {
            let mut view = view(p, b);
            T::divide(view.output(f.offset, f.len), f.divisor);
        }
    }
    Ok(())
}

fn view<'a, T>(p: &Program, mem: &'a mut Buffers<T>) -> View<'a, T> {
    let (input_base, output_base) = match p.meta.layout {
        Layout::Separate => (0, 0),
        Layout::Shared {
            input_base,
            output_base,
        } => (input_base, output_base),
    };
    View {
        mem,
        input_base,
        output_base,
    }
}

/// Run the next step of stream `(rank, channel)` if it can run: false
/// when it has ended or waits for a frame or for room.
fn try_step<T: Element>(
    programs: &[Program],
    bufs: &mut [Buffers<T>],
    fifo: &mut Fifos<T>,
    (r, c): (usize, usize),
    pc: &mut usize,
    cap: usize,
    op: ReduceOp,
) -> Result<bool, InterpretError> {
    let Some(step) = programs[r].channels[c].get(*pc) else {
        return Ok(false);
    };
    if step.prim.sends() && fifo.get(&(r, step.send_to, c)).map_or(0, VecDeque::len) >= cap {
        return Ok(false);
    }
    let frame = if step.prim.receives() {
        let Some((tag, data)) = fifo
            .get_mut(&(step.recv_from, r, c))
            .and_then(VecDeque::pop_front)
        else {
            return Ok(false);
        };
        let (prim, from, index) = (step.prim, step.recv_from, *pc);
        if tag != step.recv_tag {
            return Err(InterpretError::Tag {
                rank: r,
                channel: c,
                index,
                prim,
                from,
                want: step.recv_tag,
                got: tag,
            });
        }
        if data.len() != step.len {
            return Err(InterpretError::Length {
                rank: r,
                channel: c,
                index,
                prim,
                from,
                want: step.len,
                got: data.len(),
            });
        }
        Some(data)
    } else {
        None
    };
    let sent = view(&programs[r], &mut bufs[r]).run(op, step, frame);
    if let Some(data) = sent {
        fifo.entry((r, step.send_to, c))
            .or_default()
            .push_back((step.send_tag, data));
    }
    *pc += 1;
    Ok(true)
}

/// What each unfinished stream waits for.
fn stuck<T>(
    programs: &[Program],
    streams: &[(usize, usize)],
    pc: &[usize],
    fifo: &Fifos<T>,
    cap: usize,
) -> String {
    let waits: Vec<String> = streams
        .iter()
        .zip(pc)
        .filter_map(|(&(r, c), &i)| {
            let step = programs[r].channels[c].get(i)?;
            let full = step.prim.sends()
                && fifo.get(&(r, step.send_to, c)).map_or(0, VecDeque::len) >= cap;
            let what = if full {
                format!("room toward rank {}", step.send_to)
            } else {
                format!(
                    "a frame tagged {} from rank {}",
                    step.recv_tag, step.recv_from
                )
            };
            Some(format!(
                "rank {r} channel {c} step {i} ({:?}) waits for {what}",
                step.prim
            ))
        })
        .collect();
    waits.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::encode::{decode, encode, HEADER_BYTES, RECORD_BYTES};
    use crate::algo::{ring, tree, Algorithm, Schedule};
    use crate::coll::{CollKind, Geometry};
    use crate::element::DataType;
    use crate::error::{Error, Result};
    use crate::exec::HostIo;
    use crate::Communicator;
    use half::bf16;
    use std::time::{Duration, Instant};

    macro_rules! by_type {
        ($dtype:expr, $f:ident, $($arg:expr),*) => {
            match $dtype {
                DataType::F32 => $f::<f32>($($arg),*),
                DataType::F64 => $f::<f64>($($arg),*),
                DataType::Bf16 => $f::<bf16>($($arg),*),
                DataType::I32 => $f::<i32>($($arg),*),
                other => unreachable!("{other} is not in the grid"),
            }
        };
    }

    /// Slots of 128 bytes: 1013 elements make several slices on most rank
    /// counts, and tails. The kernels' emulated FIFOs have as many slots
    /// (`kernel_host`, `kernel_gpu`): the plans' ring passes are pipelined
    /// as deep as `STEPS` allows, and fewer slots could deadlock them.
    const SLOT: usize = 128;
    pub(super) const STEPS: usize = 4;
    /// The interpreter's FIFOs hold as many frames as the links' slots:
    /// the plans keep `STEPS - 1` ring slices in flight, which fewer could
    /// deadlock (`algo::sim` holds the builders to two frames at depth 1).
    const CAP: usize = STEPS;

    pub(super) fn configure(algo: Algorithm) -> impl Fn(&mut crate::config::Config) + Sync {
        move |config| {
            config.transport = Some("mem".into());
            config.checkin = false;
            config.algorithm = Some(algo);
            config.steps = STEPS;
            config.buffsize = SLOT * STEPS;
            config.timeout = Duration::from_secs(30);
            config.calibrate = false;
        }
    }

    /// One call of the grid.
    #[derive(Debug, Clone, Copy)]
    pub(super) struct Case {
        pub(super) kind: CollKind,
        pub(super) count: usize,
        pub(super) in_place: bool,
        pub(super) dtype: DataType,
        pub(super) op: ReduceOp,
        pub(super) seed: u64,
    }

    /// The (type, op) pairs of a reducing collective: every type of the
    /// grid with Sum, Max and Avg, and f32 with Prod and Min.
    const COMBOS: [(DataType, ReduceOp); 14] = [
        (DataType::F32, ReduceOp::Sum),
        (DataType::F32, ReduceOp::Max),
        (DataType::F32, ReduceOp::Avg),
        (DataType::F32, ReduceOp::Prod),
        (DataType::F32, ReduceOp::Min),
        (DataType::Bf16, ReduceOp::Sum),
        (DataType::Bf16, ReduceOp::Max),
        (DataType::Bf16, ReduceOp::Avg),
        (DataType::I32, ReduceOp::Sum),
        (DataType::I32, ReduceOp::Max),
        (DataType::I32, ReduceOp::Avg),
        (DataType::F64, ReduceOp::Sum),
        (DataType::F64, ReduceOp::Max),
        (DataType::F64, ReduceOp::Avg),
    ];
    /// The types of a collective that moves data without reducing it.
    const TYPES: [DataType; 4] = [DataType::F32, DataType::Bf16, DataType::I32, DataType::F64];

    pub(super) fn reduces(kind: CollKind) -> bool {
        matches!(
            kind,
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
        )
    }

    /// The grid of `kinds` on `n` ranks: every count (and 0 once), in and
    /// out of place where the API has both, every (type, op) pair of a
    /// reducing collective, every type of the others.
    pub(super) fn grid(n: usize, kinds: &[CollKind]) -> Vec<Case> {
        let mut cases = Vec::new();
        for &kind in kinds {
            let placements: &[bool] = match kind {
                CollKind::Broadcast | CollKind::Barrier => &[true],
                CollKind::AllToAll | CollKind::SendRecv => &[false],
                _ => &[false, true],
            };
            let counts: &[usize] = match kind {
                CollKind::Barrier => &[0],
                _ => &[0, 1, 7, 1013],
            };
            let pairs: Vec<(DataType, ReduceOp)> = if reduces(kind) {
                COMBOS.to_vec()
            } else {
                TYPES.iter().map(|&t| (t, ReduceOp::Sum)).collect()
            };
            for &count in counts {
                for &in_place in placements {
                    for (i, &(dtype, op)) in pairs.iter().enumerate() {
                        if count == 0 && i > 0 {
                            continue;
                        }
                        cases.push(Case {
                            kind,
                            count,
                            in_place,
                            dtype,
                            op,
                            seed: (n * 10_000 + cases.len()) as u64,
                        });
                    }
                }
            }
        }
        cases
    }

    /// Pseudo-random element `i` of stream `what` of `rank` for `seed`:
    /// floats of both signs over 2^-8..2^8, so that sums round and their
    /// order shows in the bits; integers over all of i32 (sums wrap).
    fn value<T: Element>(seed: u64, rank: usize, what: u64, i: usize) -> T {
        let mut d = Dice(seed ^ (rank as u64) << 40 ^ what << 56 ^ i as u64);
        let x = d.next();
        match T::DTYPE {
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16 => {
                let m = (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
                T::from_f64(m * 2f64.powi((d.next() % 17) as i32 - 8))
            }
            _ => T::from_f64(f64::from(x as u32 as i32)),
        }
    }

    fn fill<T: Element>(len: usize, seed: u64, rank: usize, what: u64) -> Vec<T> {
        (0..len).map(|i| value(seed, rank, what, i)).collect()
    }

    /// The call `case` makes on `rank` of `n` and the buffers it hands
    /// over: inputs from stream 0, receive buffers poisoned from stream 1.
    /// `None` where the rank takes no part (send/recv pairs ranks 2k and
    /// 2k + 1).
    fn call_of<T: Element>(case: &Case, rank: usize, n: usize) -> Option<(CollCall, Caller<T>)> {
        let (c, s) = (case.count, case.seed);
        let input = |len| fill::<T>(len, s, rank, 0);
        let poison = |len| fill::<T>(len, s, rank, 1);
        let root = (c + s as usize) % n;
        let out = |send, recv| Caller::OutOfPlace { send, recv };
        let (call, caller) = match (case.kind, case.in_place) {
            (CollKind::AllReduce, false) => {
                (CollCall::new(case.kind, c, c, c), out(input(c), poison(c)))
            }
            (CollKind::AllReduce, true) => (
                CollCall::new(case.kind, c, c, c),
                Caller::InPlace { buf: input(c) },
            ),
            (CollKind::ReduceScatter, false) => (
                CollCall::new(case.kind, c, c * n, c),
                out(input(c * n), poison(c)),
            ),
            (CollKind::ReduceScatter, true) => (
                CollCall::new(case.kind, c, c * n, c * n),
                Caller::InPlace { buf: input(c * n) },
            ),
            (CollKind::AllGather, false) => (
                CollCall::new(case.kind, c, c, c * n),
                out(input(c), poison(c * n)),
            ),
            (CollKind::AllGather, true) => {
                let mut buf = poison(c * n);
                buf[rank * c..(rank + 1) * c].copy_from_slice(&input(c));
                (
                    CollCall::new(case.kind, c, c * n, c * n),
                    Caller::InPlace { buf },
                )
            }
            // The API's broadcast is in place; only the root's buffer is
            // an input.
            (CollKind::Broadcast, _) => (
                CollCall {
                    root: Some(root),
                    ..CollCall::new(case.kind, c, c, c)
                },
                Caller::InPlace {
                    buf: if rank == root { input(c) } else { poison(c) },
                },
            ),
            (CollKind::Reduce, false) => {
                let recv = if rank == root { poison(c) } else { Vec::new() };
                (
                    CollCall {
                        root: Some(root),
                        ..CollCall::new(case.kind, c, c, recv.len())
                    },
                    out(input(c), recv),
                )
            }
            (CollKind::Reduce, true) => (
                CollCall {
                    root: Some(root),
                    ..CollCall::new(case.kind, c, c, c)
                },
                Caller::InPlace { buf: input(c) },
            ),
            (CollKind::AllToAll, _) => (
                CollCall::new(case.kind, c * n, c * n, c * n),
                out(input(c * n), poison(c * n)),
            ),
            (CollKind::SendRecv, _) if rank.is_multiple_of(2) && rank + 1 < n => (
                CollCall {
                    root: Some(rank),
                    p2p: Some((rank + 1, true)),
                    ..CollCall::new(case.kind, c, c, 0)
                },
                out(input(c), Vec::new()),
            ),
            (CollKind::SendRecv, _) if rank % 2 == 1 => (
                CollCall {
                    root: Some(rank - 1),
                    p2p: Some((rank - 1, false)),
                    ..CollCall::new(case.kind, c, 0, c)
                },
                out(Vec::new(), poison(c)),
            ),
            (CollKind::SendRecv, _) => return None,
            (CollKind::Barrier, _) => (
                CollCall::new(case.kind, 0, 0, 0),
                Caller::InPlace { buf: Vec::new() },
            ),
        };
        let reduces = matches!(
            case.kind,
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
        );
        let call = CollCall {
            op: reduces.then_some(case.op),
            in_place: matches!(caller, Caller::InPlace { .. }),
            ..call
        };
        Some((call, caller))
    }

    pub(super) fn bytes<T: Element>(b: &Buffers<T>) -> Buffers<u8> {
        match b {
            Buffers::Separate { input, output } => Buffers::Separate {
                input: bytemuck::cast_slice(input).to_vec(),
                output: bytemuck::cast_slice(output).to_vec(),
            },
            Buffers::Shared { buf } => Buffers::Shared {
                buf: bytemuck::cast_slice(buf).to_vec(),
            },
        }
    }

    fn typed<T: Element>(b: &Buffers<u8>) -> Buffers<T> {
        match b {
            Buffers::Separate { input, output } => Buffers::Separate {
                input: bytemuck::pod_collect_to_vec(input),
                output: bytemuck::pod_collect_to_vec(output),
            },
            Buffers::Shared { buf } => Buffers::Shared {
                buf: bytemuck::pod_collect_to_vec(buf),
            },
        }
    }

    /// What one rank brings back from one call: its schedule and program,
    /// and its buffers before and after the host executor ran.
    #[derive(Clone)]
    pub(super) struct RankRun {
        pub(super) schedule: Schedule,
        pub(super) image: Vec<u8>,
        pub(super) before: Buffers<u8>,
        pub(super) after: Buffers<u8>,
    }

    /// Run the schedule of `schedule_of(plan)` through the host executor
    /// on the communicator's connections, on the buffers `caller` hands
    /// over laid out as for the program, and finish Avg as
    /// `Communicator::collective` does; encode the same schedule.
    fn run_executor<T: Element>(
        comm: &Communicator,
        call: &CollCall,
        caller: Caller<T>,
        schedule_of: &dyn Fn(&Plan) -> Schedule,
    ) -> Result<RankRun> {
        let (rank, n) = (comm.rank(), comm.size());
        let mut got = None;
        comm.run_on_links_for_test::<T>(call, |plan, links, exec_call| {
            let schedule = schedule_of(plan);
            let (meta, mut bufs) =
                launch(call, plan, (rank, n), caller).map_err(Error::InvalidArgument)?;
            let image =
                encode(&schedule, &meta).map_err(|e| Error::InvalidArgument(e.to_string()))?;
            let before = bytes(&bufs);
            match &mut bufs {
                Buffers::Separate { input, output } => super::super::run(
                    links,
                    &schedule,
                    HostIo::OutOfPlace { input, output },
                    exec_call,
                )?,
                Buffers::Shared { buf } => super::super::run(
                    links,
                    &schedule,
                    HostIo::InPlace {
                        buf,
                        input_base: plan.input_base,
                        output_base: plan.output_base,
                    },
                    exec_call,
                )?,
            }
            // Avg's division on the caller's buffer, which is the
            // schedule's output unless that is a temporary one.
            match &mut bufs {
                Buffers::Separate { output, .. } if plan.scratch_output == 0 => {
                    coll::finish(call, plan, rank, n, output)
                }
                Buffers::Shared { buf } => coll::finish(call, plan, rank, n, buf),
                Buffers::Separate { .. } => {
                    assert_eq!(
                        coll::result_range(call, plan, rank),
                        None,
                        "a result outside the schedule's buffers"
                    )
                }
            }
            got = Some(RankRun {
                schedule,
                image,
                before,
                after: bytes(&bufs),
            });
            Ok(())
        })?;
        Ok(got.expect("ran"))
    }

    fn run_case<T: Element>(
        comm: &Communicator,
        case: &Case,
    ) -> std::result::Result<Option<RankRun>, String> {
        let Some((call, caller)) = call_of::<T>(case, comm.rank(), comm.size()) else {
            return Ok(None);
        };
        run_executor(comm, &call, caller, &|plan| plan.schedule.clone())
            .map(Some)
            .map_err(|e| format!("{case:?} on rank {}: executor: {e}", comm.rank()))
    }

    /// The program of a rank that takes no part in a call: no steps.
    pub(super) fn idle_image(
        rank: usize,
        ranks: usize,
        dtype: DataType,
        op: Option<ReduceOp>,
    ) -> Vec<u8> {
        let meta = ProgramMeta {
            rank,
            ranks,
            dtype,
            op,
            layout: Layout::Separate,
            finish: None,
        };
        encode(&Schedule::default(), &meta).expect("an empty program encodes")
    }

    /// Decode every rank's program (an empty one for a rank that took no
    /// part), interpret them on the buffers the executor started from,
    /// and compare with what the executor left, bit for bit.
    fn compare<T: Element>(
        what: &str,
        runs: &[Option<RankRun>],
        op: Option<ReduceOp>,
        turns: Turns,
    ) -> std::result::Result<(), String> {
        let n = runs.len();
        let mut programs = Vec::with_capacity(n);
        let mut bufs = Vec::with_capacity(n);
        for (r, run) in runs.iter().enumerate() {
            match run {
                Some(run) => {
                    let program =
                        decode(&run.image).map_err(|e| format!("{what}: rank {r}: decode: {e}"))?;
                    let mut steps: Vec<_> = run.schedule.steps.clone();
                    steps.sort_by_key(|s| s.channel);
                    if program.schedule().steps != steps {
                        return Err(format!("{what}: rank {r}: the decoded schedule differs"));
                    }
                    programs.push(program);
                    bufs.push(typed::<T>(&run.before));
                }
                None => {
                    programs
                        .push(decode(&idle_image(r, n, T::DTYPE, op)).map_err(|e| e.to_string())?);
                    bufs.push(Buffers::Separate {
                        input: Vec::new(),
                        output: Vec::new(),
                    });
                }
            }
        }
        interpret(&programs, &mut bufs, CAP, turns)
            .map_err(|e| format!("{what}: interpreter: {e}"))?;
        for (r, (run, got)) in runs.iter().zip(&bufs).enumerate() {
            let Some(run) = run else { continue };
            let got = bytes(got);
            if got != run.after {
                let (g, w) = match (&got, &run.after) {
                    (Buffers::Separate { output: g, .. }, Buffers::Separate { output: w, .. }) => {
                        (g, w)
                    }
                    (Buffers::Shared { buf: g }, Buffers::Shared { buf: w }) => (g, w),
                    _ => return Err(format!("{what}: rank {r}: layouts differ")),
                };
                let elem = std::mem::size_of::<T>();
                let first = (0..g.len().min(w.len()))
                    .find(|&i| g[i] != w[i])
                    .map(|i| i / elem);
                return Err(format!(
                    "{what}: rank {r}: the interpreter's buffers differ from the executor's (first output element {first:?})"
                ));
            }
        }
        Ok(())
    }

    /// Every case of `cases` on `n` ranks with `algo` forced: each rank
    /// runs them all through the host executor, then each case's programs
    /// run through the interpreter; returns the failures.
    fn sweep(n: usize, algo: Algorithm, cases: &[Case]) -> Vec<String> {
        let (mut failures, runs) = sweep_runs(n, algo, cases);
        for (i, case, runs) in runs {
            let what = format!("{algo} {case:?} on {n} ranks");
            let op = reduces(case.kind).then_some(case.op);
            // Half the cases in a shuffled order of the streams.
            let turns = if i % 2 == 0 {
                Turns::RoundRobin
            } else {
                Turns::Shuffled(case.seed)
            };
            if let Err(e) = by_type!(case.dtype, compare, &what, &runs, op, turns) {
                failures.push(e);
            }
        }
        failures
    }

    /// A case's index in its grid, the case, and each rank's run (`None`
    /// where the rank takes no part).
    pub(super) type CaseRuns = (usize, Case, Vec<Option<RankRun>>);

    /// Every case of `cases` on `n` ranks through the host executor:
    /// the failures, and per case that ran on every rank its index and
    /// the ranks' runs.
    pub(super) fn sweep_runs(
        n: usize,
        algo: Algorithm,
        cases: &[Case],
    ) -> (Vec<String>, Vec<CaseRuns>) {
        let per_rank = crate::testing::run_ranks_with(n, configure(algo), |comm| {
            cases
                .iter()
                .map(|case| by_type!(case.dtype, run_case, &comm, case))
                .collect::<Vec<_>>()
        });
        let mut failures = Vec::new();
        let mut out = Vec::new();
        let mut per_rank: Vec<_> = per_rank.into_iter().map(|v| v.into_iter()).collect();
        for (i, case) in cases.iter().enumerate() {
            let mut runs = Vec::with_capacity(n);
            for rank in &mut per_rank {
                match rank.next().expect("a result per case") {
                    Ok(run) => runs.push(run),
                    Err(e) => failures.push(e),
                }
            }
            if runs.len() == n {
                out.push((i, *case, runs));
            }
        }
        (failures, out)
    }

    /// The collectives `algo` serves (the others fall back to the ring).
    pub(super) fn kinds_of(algo: Algorithm) -> &'static [CollKind] {
        use CollKind::*;
        match algo {
            Algorithm::Ring => &[
                AllReduce,
                ReduceScatter,
                AllGather,
                Broadcast,
                Reduce,
                AllToAll,
                SendRecv,
                Barrier,
            ],
            Algorithm::Tree => &[AllReduce, Broadcast, Reduce],
            Algorithm::OneShot | Algorithm::TwoShot | Algorithm::RecursiveDoubling => &[AllReduce],
            Algorithm::Hierarchical => &[AllReduce, AllGather],
        }
    }

    pub(super) fn check(failures: Vec<String>, started: Instant, what: &str) {
        eprintln!("{what}: {:.1} s", started.elapsed().as_secs_f64());
        assert!(
            failures.is_empty(),
            "{} failures, first ones: {:#?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
    }

    #[test]
    fn ring_allreduce_programs_match_the_executor_on_1_to_16_ranks() {
        let t = Instant::now();
        let failures = (1..=16)
            .flat_map(|n| sweep(n, Algorithm::Ring, &grid(n, &[CollKind::AllReduce])))
            .collect();
        check(failures, t, "ring allreduce");
    }

    #[test]
    fn tree_allreduce_programs_match_the_executor_on_1_to_16_ranks() {
        let t = Instant::now();
        let failures = (1..=16)
            .flat_map(|n| sweep(n, Algorithm::Tree, &grid(n, &[CollKind::AllReduce])))
            .collect();
        check(failures, t, "tree allreduce");
    }

    #[test]
    fn direct_allreduce_programs_match_the_executor_on_1_to_16_ranks() {
        let t = Instant::now();
        let failures = (1..=16)
            .flat_map(|n| {
                let cases = grid(n, &[CollKind::AllReduce]);
                let mut f = sweep(n, Algorithm::OneShot, &cases);
                f.extend(sweep(n, Algorithm::TwoShot, &cases));
                f.extend(sweep(n, Algorithm::RecursiveDoubling, &cases));
                f
            })
            .collect();
        check(
            failures,
            t,
            "one-shot, two-shot and recursive-doubling allreduce",
        );
    }

    /// The planner's schedules cut into 2, 3 and 4 channels
    /// (`algo::channels::split`, as the device launcher cuts them): every
    /// collective on every algorithm that serves it, on 1 to 5 and 8
    /// ranks, encodes (no channel writes what another touches) and, run
    /// by the interpreter with the channels as separate streams, leaves
    /// what the host executor left running the uncut schedule, bit for
    /// bit.
    #[test]
    fn schedules_cut_into_channels_match_the_uncut_executor() {
        use crate::algo::channels::split;
        let t = Instant::now();
        let mut failures = Vec::new();
        for n in [1, 2, 3, 4, 5, 8] {
            for algo in Algorithm::ALL {
                let (f, runs) = sweep_runs(n, algo, &grid(n, kinds_of(algo)));
                failures.extend(f);
                for (i, case, runs) in runs {
                    let op = reduces(case.kind).then_some(case.op);
                    for c in [2, 3, 4] {
                        let what = format!("{algo} {case:?} on {n} ranks, {c} channels");
                        let cut: std::result::Result<Vec<Option<RankRun>>, String> = runs
                            .iter()
                            .map(|run| {
                                let Some(run) = run else { return Ok(None) };
                                let meta = decode(&run.image).map_err(|e| e.to_string())?.meta;
                                let schedule = split(&run.schedule, c);
                                let image = encode(&schedule, &meta)
                                    .map_err(|e| format!("{what}: encode: {e}"))?;
                                Ok(Some(RankRun {
                                    schedule,
                                    image,
                                    ..run.clone()
                                }))
                            })
                            .collect();
                        let turns = if i % 2 == 0 {
                            Turns::RoundRobin
                        } else {
                            Turns::Shuffled(case.seed ^ c as u64)
                        };
                        match cut {
                            Err(e) => failures.push(e),
                            Ok(cut) => {
                                if let Err(e) =
                                    by_type!(case.dtype, compare, &what, &cut, op, turns)
                                {
                                    failures.push(e);
                                }
                            }
                        }
                    }
                }
            }
        }
        check(failures, t, "schedules cut into channels");
    }

    /// Every other collective on the ring (the algorithm of all of them),
    /// and broadcast and reduce on the tree.
    #[test]
    fn other_collective_programs_match_the_executor_on_1_to_16_ranks() {
        use CollKind::*;
        let t = Instant::now();
        let failures = (1..=16)
            .flat_map(|n| {
                let ring = [
                    ReduceScatter,
                    AllGather,
                    Broadcast,
                    Reduce,
                    AllToAll,
                    SendRecv,
                    Barrier,
                ];
                let mut f = sweep(n, Algorithm::Ring, &grid(n, &ring));
                f.extend(sweep(n, Algorithm::Tree, &grid(n, &[Broadcast, Reduce])));
                f
            })
            .collect();
        check(failures, t, "other collectives");
    }

    /// Rank `r`'s schedule of two allreduces over the halves of `2 *
    /// half` elements, the first half on channel 0 by a ring, the second
    /// on channel 1 by a ring (`tree`: false; steps interleaved) or a
    /// tree (after the ring's steps, so that the executor, which runs
    /// them in this order, cannot wait on the tree before the ring ends).
    fn two_channels(r: usize, n: usize, half: usize, tree_on_1: bool) -> Schedule {
        let p = ring::RingParams {
            rank: r,
            size: n,
            slice: 16,
            depth: 1,
        };
        let a = ring::all_reduce(p, half);
        let mut b = if tree_on_1 {
            tree::all_reduce(p, half)
        } else {
            ring::all_reduce(p, half)
        };
        for step in &mut b.steps {
            step.channel = 1;
            step.input += half;
            step.output += half;
        }
        if tree_on_1 {
            return Schedule {
                steps: a.steps.into_iter().chain(b.steps).collect(),
            };
        }
        let mut steps = Vec::new();
        let (mut x, mut y) = (a.steps.into_iter(), b.steps.into_iter());
        loop {
            match (x.next(), y.next()) {
                (None, None) => break,
                (p, q) => steps.extend(p.into_iter().chain(q)),
            }
        }
        Schedule { steps }
    }

    /// Schedules over two channels (today's planner makes none): the
    /// channels run as separate streams in the interpreter, in any order,
    /// and the result is the executor's, which runs them one after the
    /// other in schedule order over two sets of connections.
    #[test]
    fn two_channel_programs_match_the_executor() {
        let t = Instant::now();
        let mut failures = Vec::new();
        for n in [2, 3, 5, 8] {
            for (shape, runs) in two_channel_runs(n) {
                let runs = match runs {
                    Ok(runs) => runs,
                    Err(e) => {
                        failures.push(e);
                        continue;
                    }
                };
                for (r, run) in runs.iter().enumerate() {
                    let program = decode(&run.as_ref().unwrap().image).unwrap();
                    assert_eq!(program.channels.len(), 2, "rank {r}");
                }
                for turns in [
                    Turns::RoundRobin,
                    Turns::Shuffled(n as u64),
                    Turns::Shuffled(99),
                ] {
                    let what = format!("two channels {shape:?} on {n} ranks, {turns:?}");
                    if let Err(e) = compare::<f32>(&what, &runs, Some(ReduceOp::Avg), turns) {
                        failures.push(e);
                    }
                }
            }
        }
        check(failures, t, "two channels");
    }

    /// The two-channel allreduces (Avg of f32, 2 x 301 elements) on `n`
    /// ranks through the host executor, per shape (tree on channel 1, in
    /// place): each rank's run.
    #[allow(clippy::type_complexity)]
    pub(super) fn two_channel_runs(
        n: usize,
    ) -> Vec<(
        (bool, bool),
        std::result::Result<Vec<Option<RankRun>>, String>,
    )> {
        let half = 301;
        let shapes = [(false, false), (false, true), (true, false), (true, true)];
        let runs = crate::testing::run_ranks_with(n, configure(Algorithm::Ring), |comm| {
            let rank = comm.rank();
            shapes
                .iter()
                .map(|&(tree_on_1, in_place)| {
                    let count = 2 * half;
                    let seed = 77 + n as u64;
                    let call = CollCall {
                        op: Some(ReduceOp::Avg),
                        in_place,
                        ..CollCall::new(CollKind::AllReduce, count, count, count)
                    };
                    let caller = if in_place {
                        Caller::InPlace {
                            buf: fill::<f32>(count, seed, rank, 0),
                        }
                    } else {
                        Caller::OutOfPlace {
                            send: fill::<f32>(count, seed, rank, 0),
                            recv: fill::<f32>(count, seed, rank, 1),
                        }
                    };
                    let shape = |_: &Plan| two_channels(rank, n, half, tree_on_1);
                    run_executor(&comm, &call, caller, &shape).map_err(|e| e.to_string())
                })
                .collect::<Vec<_>>()
        });
        shapes
            .iter()
            .enumerate()
            .map(|(i, &shape)| {
                let runs: std::result::Result<Vec<_>, String> =
                    runs.iter().map(|r| r[i].clone().map(Some)).collect();
                (shape, runs)
            })
            .collect()
    }

    /// The comparison can fail: one record of rank 1's program with its
    /// output offset moved by one element (the image still decodes), or a
    /// send's tag changed, and the interpreter's result or run is no
    /// longer the executor's.
    #[test]
    fn a_corrupted_program_breaks_the_match() {
        let case = Case {
            kind: CollKind::AllReduce,
            count: 1013,
            in_place: false,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
            seed: 5,
        };
        let runs = crate::testing::run_ranks_with(3, configure(Algorithm::Ring), |comm| {
            run_case::<f32>(&comm, &case).unwrap()
        });
        let op = Some(ReduceOp::Sum);
        compare::<f32>("intact", &runs, op, Turns::RoundRobin).unwrap();

        let program = decode(&runs[1].as_ref().unwrap().image).unwrap();
        let records = HEADER_BYTES + 16 * program.channels.len();
        let (k, _) = program.channels[0]
            .iter()
            .enumerate()
            .find(|(_, s)| s.prim.writes_output() && s.output > 0)
            .expect("a step that writes the output");
        let mut moved = runs.clone();
        let image = &mut moved[1].as_mut().unwrap().image;
        let at = records + k * RECORD_BYTES + 24;
        let output = u64::from_le_bytes(image[at..at + 8].try_into().unwrap());
        image[at..at + 8].copy_from_slice(&(output - 1).to_le_bytes());
        let changed = decode(image).expect("still a valid program");
        assert_eq!(
            changed.channels[0][k].output,
            program.channels[0][k].output - 1
        );
        // The run's own record of its schedule follows the image, so that
        // only the results can tell.
        moved[1].as_mut().unwrap().schedule = changed.schedule();
        let err = compare::<f32>("moved", &moved, op, Turns::RoundRobin).unwrap_err();
        assert!(err.contains("differ from the executor's"), "{err}");

        let (k, _) = program.channels[0]
            .iter()
            .enumerate()
            .find(|(_, s)| s.prim.sends())
            .expect("a step that sends");
        let mut retagged = runs.clone();
        let image = &mut retagged[1].as_mut().unwrap().image;
        image[records + k * RECORD_BYTES + 8] ^= 1;
        let changed = decode(image).expect("still a valid program").schedule();
        retagged[1].as_mut().unwrap().schedule = changed;
        let err = compare::<f32>("retagged", &retagged, op, Turns::RoundRobin).unwrap_err();
        assert!(err.contains("expected tag"), "{err}");
    }

    fn program(rank: usize, ranks: usize, steps: Vec<Step>) -> Program {
        let meta = ProgramMeta {
            rank,
            ranks,
            dtype: DataType::U32,
            op: None,
            layout: Layout::Separate,
            finish: None,
        };
        decode(&encode(&Schedule { steps }, &meta).unwrap()).unwrap()
    }

    /// Deadlocks, wrong tags and lengths and frames left over end the run
    /// with an error that says where, never a hang.
    #[test]
    fn the_interpreter_reports_what_goes_wrong() {
        let send = |to, tag, len| Step {
            send_to: to,
            send_tag: tag,
            ..Step::local(Prim::Send, Operand::Input, 0, 0, len)
        };
        let recv = |from, tag, len| Step {
            recv_from: from,
            recv_tag: tag,
            ..Step::local(Prim::Recv, Operand::Output, 0, 0, len)
        };
        let run = |steps: [Vec<Step>; 2]| {
            let [a, b] = steps;
            let programs = [program(0, 2, a), program(1, 2, b)];
            let mut bufs = vec![
                Buffers::Separate {
                    input: vec![1u32; 8],
                    output: vec![0u32; 8],
                };
                2
            ];
            interpret(&programs, &mut bufs, CAP, Turns::RoundRobin).map(|()| bufs)
        };
        let ok = run([vec![send(1, 3, 4)], vec![recv(0, 3, 4)]]).unwrap();
        assert_eq!(
            ok[1],
            Buffers::Separate {
                input: vec![1; 8],
                output: vec![1, 1, 1, 1, 0, 0, 0, 0]
            }
        );
        let err = run([
            vec![recv(1, 0, 4), send(1, 0, 4)],
            vec![recv(0, 0, 4), send(0, 0, 4)],
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("deadlock")
                && err.contains(
                    "rank 1 channel 0 step 0 (Recv) waits for a frame tagged 0 from rank 0"
                ),
            "{err}"
        );
        let err = run([vec![send(1, 3, 4)], vec![recv(0, 4, 4)]])
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected tag 4 from rank 0, got 3"), "{err}");
        let err = run([vec![send(1, 3, 4)], vec![recv(0, 3, 5)]])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("expected 5 elements from rank 0, got 4"),
            "{err}"
        );
        let err = run([vec![send(1, 3, 4)], vec![]]).unwrap_err().to_string();
        assert!(err.contains("1 from rank 0 to 1 on channel 0"), "{err}");
        // One frame more than a FIFO holds, never drained: stuck on room.
        let sends = (0..=CAP as u32).map(|t| send(1, t, 1)).collect();
        let err = run([sends, vec![]]).unwrap_err().to_string();
        assert!(err.contains("waits for room toward rank 1"), "{err}");
        // Buffers smaller than the program's extents are refused before
        // anything runs.
        let programs = [program(
            0,
            1,
            vec![Step::local(Prim::Copy, Operand::Input, 0, 0, 9)],
        )];
        let mut bufs = vec![Buffers::Separate {
            input: vec![0u32; 9],
            output: vec![0u32; 8],
        }];
        let err = interpret(&programs, &mut bufs, CAP, Turns::RoundRobin)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("output has 8 elements, its program needs 9"),
            "{err}"
        );
    }

    /// A split the encoder cannot see is wrong (rank 0 moves one receive
    /// to channel 1; its peer still sends on channel 0, and the memory
    /// touched is apart): the interpreter finds the ranks disagree.
    #[test]
    fn channels_that_disagree_across_ranks_fail_in_the_interpreter() {
        let n = 3;
        let p = |r| ring::RingParams {
            rank: r,
            size: n,
            slice: 100,
            depth: 1,
        };
        let programs: Vec<Program> = (0..n)
            .map(|r| {
                let mut s = ring::all_reduce(p(r), 30);
                if r == 0 {
                    let last = s.steps.len() - 1;
                    s.steps[last].channel = 1;
                }
                let meta = ProgramMeta {
                    rank: r,
                    ranks: n,
                    dtype: DataType::F32,
                    op: Some(ReduceOp::Sum),
                    layout: Layout::Separate,
                    finish: None,
                };
                decode(&encode(&s, &meta).unwrap()).unwrap()
            })
            .collect();
        let mut bufs: Vec<Buffers<f32>> = (0..n)
            .map(|_| Buffers::Separate {
                input: vec![1.0; 30],
                output: vec![0.0; 30],
            })
            .collect();
        let err = interpret(&programs, &mut bufs, CAP, Turns::RoundRobin).unwrap_err();
        assert!(
            matches!(
                err,
                InterpretError::Deadlock(_) | InterpretError::Unreceived(_)
            ),
            "{err}"
        );
    }

    /// Every schedule the planner makes (through `coll::plan`, with the
    /// confirmation a call without control pages ends with), for every
    /// rank of 1..16, every collective and algorithm, counts with tails,
    /// in and out of place, small and default slots: encodes, decodes to
    /// the same steps, lies on channel 0 alone, and touches nothing past
    /// the buffers the caller gives.
    #[test]
    fn planner_schedules_round_trip_on_channel_0_within_their_buffers() {
        let t = Instant::now();
        let mut programs = 0usize;
        for n in 1..=16 {
            for algo in Algorithm::ALL {
                let kinds = kinds_of(algo);
                for &kind in kinds {
                    for count in [0, 1, 7, 1013] {
                        for in_place in [false, true] {
                            for chunk in [64, 512 << 10] {
                                let case = Case {
                                    kind,
                                    count,
                                    in_place,
                                    dtype: DataType::F32,
                                    op: ReduceOp::Avg,
                                    seed: 1,
                                };
                                for rank in 0..n {
                                    let Some((call, caller)) = call_of::<f32>(&case, rank, n)
                                    else {
                                        continue;
                                    };
                                    let what = format!("{algo} {kind:?} n={n} rank {rank} count {count} in place {} chunk {chunk}", call.in_place);
                                    let g: Geometry = crate::plan::geometry(
                                        kind,
                                        algo,
                                        (rank, n),
                                        call.slice_count(n),
                                        4,
                                        chunk,
                                    );
                                    let mut plan = coll::plan(&call, g, algo)
                                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                                    if crate::plan::confirms(kind, call.count, n) {
                                        plan.schedule
                                            .steps
                                            .extend(coll::confirmation(&call, g, algo).steps);
                                    }
                                    assert!(
                                        plan.schedule.steps.iter().all(|s| s.channel == 0),
                                        "{what}: a step off channel 0"
                                    );
                                    let (meta, bufs) = launch(&call, &plan, (rank, n), caller)
                                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                                    let image = encode(&plan.schedule, &meta)
                                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                                    let program =
                                        decode(&image).unwrap_or_else(|e| panic!("{what}: {e}"));
                                    assert_eq!(program.schedule(), plan.schedule, "{what}");
                                    assert_eq!(program.meta, meta, "{what}");
                                    fits(&program, &bufs).unwrap_or_else(|e| panic!("{what}: {e}"));
                                    programs += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        eprintln!("{programs} programs in {:.1} s", t.elapsed().as_secs_f64());
    }

    /// The hierarchical schedules over several hosts (which the sweeps
    /// above never build: their ranks share one host) as the device runs
    /// them: every rank's schedule cut into 1 and 3 channels, encoded,
    /// decoded and interpreted with every channel a stream of its own over
    /// FIFOs of `depth + 1` frames, in shuffled turns. Allreduce and
    /// allgather, phases in turn (depth 1) and pipelined (depths 2 and 4),
    /// on even, uneven and interleaved hosts, against the f64 reference
    /// (values small integers, exact in f32).
    #[test]
    fn hierarchical_programs_over_hosts_give_the_reference() {
        use crate::algo::channels::split;
        use crate::algo::hier::{self, HostMap};
        let maps = [
            HostMap::from_sizes(&[2, 2]),
            HostMap::from_sizes(&[4, 4]),
            HostMap::from_sizes(&[3, 1, 2]),
            HostMap::from_sizes(&[2, 3, 5]),
            HostMap::from_ids(&[0, 1, 0, 1, 2, 0, 2]),
        ];
        let value = |r: usize, i: usize| ((r * 31 + i * 7) % 23) as f32 - 11.0;
        for map in &maps {
            let n = map.ranks();
            for (count, slice) in [(100usize, 7usize), (13, 1000)] {
                for depth in [1usize, 2, 4] {
                    for ch in [1usize, 3] {
                        for gather in [false, true] {
                            let what = format!(
                                "{map:?} count {count} slice {slice} depth {depth} channels {ch} {}",
                                if gather { "allgather" } else { "allreduce" }
                            );
                            let out_len = if gather { count * n } else { count };
                            let programs: Vec<Program> = (0..n)
                                .map(|r| {
                                    let s = if gather {
                                        hier::all_gather(map, r, count, (slice, depth))
                                    } else {
                                        hier::all_reduce(map, r, count, (slice, depth))
                                    };
                                    let meta = ProgramMeta {
                                        rank: r,
                                        ranks: n,
                                        dtype: DataType::F32,
                                        op: (!gather).then_some(ReduceOp::Sum),
                                        layout: Layout::Separate,
                                        finish: None,
                                    };
                                    let image = encode(&split(&s, ch), &meta)
                                        .unwrap_or_else(|e| panic!("{what}: encode: {e}"));
                                    decode(&image).unwrap_or_else(|e| panic!("{what}: {e}"))
                                })
                                .collect();
                            let mut bufs: Vec<Buffers<f32>> = (0..n)
                                .map(|r| Buffers::Separate {
                                    input: (0..count).map(|i| value(r, i)).collect(),
                                    output: vec![f32::NAN; out_len],
                                })
                                .collect();
                            interpret(
                                &programs,
                                &mut bufs,
                                depth + 1,
                                Turns::Shuffled(count as u64 + depth as u64),
                            )
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                            for (r, b) in bufs.iter().enumerate() {
                                let Buffers::Separate { output, .. } = b else {
                                    unreachable!("separate buffers")
                                };
                                for (k, got) in output.iter().enumerate() {
                                    let want = if gather {
                                        f64::from(value(k / count, k % count))
                                    } else {
                                        (0..n).map(|q| f64::from(value(q, k))).sum()
                                    };
                                    assert_eq!(
                                        f64::from(*got),
                                        want,
                                        "{what}: rank {r} element {k}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod kernel_host;

#[cfg(test)]
pub(crate) mod host_launch;

#[cfg(test)]
mod kernel_gpu;
