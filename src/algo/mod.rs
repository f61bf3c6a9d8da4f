//! Schedules as plain data: which primitive each rank runs at each step, on
//! which part of which buffer, to and from which peer.
//!
//! Nothing here performs I/O, holds a clock or uses `unsafe`: a schedule for
//! any rank count can be built and checked on a laptop (`sim`, which the
//! tests run on every builder's schedules and the checker of user-written
//! algorithms, `user`, runs when a communicator is created). The executor
//! (`exec`) interprets schedules over connections.
//!
//! The builders: `ring`, `tree`, `direct` (one-shot, two-shot, recursive
//! doubling), `hier` (over several hosts); `user`, algorithms written by
//! users (the builder, the checker, the lowering to a schedule), and `text`
//! their text format. Over a built schedule: `channels` cuts it over
//! several channels, `encode` turns it into the device program the device
//! executor's kernel reads, and `sim` runs it on f64 data. This file holds
//! the vocabulary (`Schedule`, `Step`, `Prim`, `Operand`) and `Timeline`,
//! the tick order the pipelined builders share.

pub mod channels;
pub mod direct;
pub mod encode;
pub mod hier;
pub mod ring;
pub mod text;
pub mod tree;
pub mod user;

/// The algorithms a collective can run on. Each collective supports a
/// subset (see `coll`); a forced algorithm a collective does not support
/// falls back to [`Algorithm::Ring`] for that collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Pipelined ring (every collective): bandwidth-optimal, latency grows
    /// with the rank count.
    Ring,
    /// Double binary tree for allreduce, one binary tree for broadcast and
    /// reduce: latency grows with the log of the rank count.
    Tree,
    /// Allreduce by direct exchange of whole buffers: one step of latency,
    /// for small messages.
    OneShot,
    /// Allreduce by direct reduce-scatter then direct allgather: two steps
    /// of latency, a 1/n of the bytes of one-shot per peer.
    TwoShot,
    /// Allreduce by recursive doubling: `log2 n` rounds of one exchange
    /// each, the whole buffer every time: for small messages where
    /// one-shot's `n - 1` messages a rank cost more than its one round.
    RecursiveDoubling,
    /// Allreduce, allgather and reduce-scatter over hosts (`hier`): the
    /// steps inside a host on its fast links, each byte over the network
    /// once per host.
    /// Only for communicators that span several hosts with several ranks
    /// on some host; elsewhere, and for other collectives, the ring.
    Hierarchical,
}

impl Algorithm {
    /// Every algorithm, in declaration order.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::RecursiveDoubling,
        Algorithm::Hierarchical,
    ];

    /// The name used in logs and by FERROCCL_ALGO.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::OneShot => "one_shot",
            Algorithm::TwoShot => "two_shot",
            Algorithm::RecursiveDoubling => "recursive_doubling",
            Algorithm::Hierarchical => "hierarchical",
        }
    }

    /// Parse a name in any case (NCCL spells them `Ring`, `Tree`); `-`, `_`
    /// and spaces are ignored, so `one_shot`, `OneShot` and `one-shot` all
    /// name [`Algorithm::OneShot`]; `hier` is short for `hierarchical`.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        let key: String = name
            .chars()
            .filter(|c| !matches!(c, '-' | '_' | ' '))
            .map(|c| c.to_ascii_lowercase())
            .collect();
        if key == "hier" {
            return Some(Algorithm::Hierarchical);
        }
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().replace('_', "") == key)
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The primitive vocabulary (NCCL's, in snake case). "Input" is the caller's
/// send buffer, "output" its receive buffer (the same buffer in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prim {
    /// Send `input[input..+len]` to `send_to`.
    Send,
    /// Receive `len` elements from `recv_from` into `output[output..]`.
    Recv,
    /// Receive, combine with `input[input..]`, send the result on.
    RecvReduceSend,
    /// Receive, combine with `input[input..]`, store in `output[output..]`
    /// and send the result on.
    RecvReduceCopySend,
    /// Receive, store in `output[output..]` and send on.
    RecvCopySend,
    /// Receive, combine with `input[input..]`, store in `output[output..]`.
    RecvReduceCopy,
    /// Copy `input[input..]` to `output[output..]` and send it.
    CopySend,
    /// Copy `input[input..]` to `output[output..]` (no communication).
    Copy,
    /// `output[output..] = output[output..] op input[input..]` (no
    /// communication): adds this rank's contribution to a partial result at
    /// its place in a fixed reduction order. `local` is always `Input`.
    Reduce,
}

impl Prim {
    /// Every primitive, in declaration order.
    pub const ALL: [Prim; 9] = [
        Prim::Send,
        Prim::Recv,
        Prim::RecvReduceSend,
        Prim::RecvReduceCopySend,
        Prim::RecvCopySend,
        Prim::RecvReduceCopy,
        Prim::CopySend,
        Prim::Copy,
        Prim::Reduce,
    ];

    /// Whether the primitive receives a frame.
    pub fn receives(self) -> bool {
        !matches!(
            self,
            Prim::Send | Prim::CopySend | Prim::Copy | Prim::Reduce
        )
    }

    /// Whether the primitive sends a frame.
    pub fn sends(self) -> bool {
        matches!(
            self,
            Prim::Send
                | Prim::RecvReduceSend
                | Prim::RecvReduceCopySend
                | Prim::RecvCopySend
                | Prim::CopySend
        )
    }

    /// Whether the primitive combines received data with its local operand
    /// (`Reduce`, which combines two local operands, does not count).
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Prim::RecvReduceSend | Prim::RecvReduceCopySend | Prim::RecvReduceCopy
        )
    }

    /// Whether the primitive writes the output buffer.
    pub fn writes_output(self) -> bool {
        matches!(
            self,
            Prim::Recv
                | Prim::RecvReduceCopySend
                | Prim::RecvCopySend
                | Prim::RecvReduceCopy
                | Prim::CopySend
                | Prim::Copy
                | Prim::Reduce
        )
    }
}

/// Where a step's local operand lives: the data it sends, or combines with
/// what it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// `input[step.input..]`: the caller's contribution.
    Input,
    /// `output[step.output..]`: a partial result an earlier step stored
    /// (a tree node that combined one child and now adds the other).
    Output,
}

/// First tag of a confirmation's empty frames (`ring::confirmation`,
/// `tree::confirmation`, a call of no elements' barrier): far above any
/// slice or transfer tag of the data steps they follow.
pub const CONFIRM_TAG: u32 = 0xC0F1_0000;

/// An empty frame's step: `prim` (`Send` or `Recv`) to or from `peer`,
/// tagged `tag`.
pub(crate) fn token(prim: Prim, peer: usize, tag: u32) -> Step {
    let sends = prim.sends();
    Step {
        send_to: if sends { peer } else { NO_PEER },
        recv_from: if sends { NO_PEER } else { peer },
        send_tag: tag,
        recv_tag: tag,
        ..Step::local(prim, Operand::Input, 0, 0, 0)
    }
}

/// No peer (for primitives that do not send or do not receive).
pub const NO_PEER: usize = usize::MAX;

/// One step of one rank's schedule. Offsets and lengths count elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// What to do.
    pub prim: Prim,
    /// Where the local operand is read from.
    pub local: Operand,
    /// Peer to send to, or [`NO_PEER`].
    pub send_to: usize,
    /// Peer to receive from, or [`NO_PEER`].
    pub recv_from: usize,
    /// Offset in the input buffer.
    pub input: usize,
    /// Offset in the output buffer.
    pub output: usize,
    /// Elements moved.
    pub len: usize,
    /// Tag carried by the frame this step sends; the matching receive expects
    /// the same tag, which catches two ranks running different schedules.
    pub send_tag: u32,
    /// Tag this step expects on the frame it receives.
    pub recv_tag: u32,
    /// The channel whose connections the step sends and receives on: a
    /// schedule may run several rings (or trees) at once, each over its own
    /// FIFOs to the same peers (NCCL's channels). Today's schedules use
    /// channel 0 alone.
    pub channel: usize,
}

/// A rank's whole schedule for one call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Steps in the order they run.
    pub steps: Vec<Step>,
}

impl Schedule {
    pub(crate) fn push(&mut self, step: Step) {
        self.steps.push(step);
    }
}

/// Builds a schedule from steps stamped with a tick and a priority, then
/// runs them in (tick, priority, stream) order; `stream` (a tree, a phase)
/// breaks ties so that equal stamps keep one order on every rank.
///
/// Why this cannot deadlock over FIFOs of two slots, if the schedule keeps
/// three rules: (1) a frame sent at tick `t` is received at tick `t + 1`;
/// (2) a link carries at most two frames per tick, of different kinds (say
/// the frames of tree 0 and of tree 1); (3) for each kind, the step that
/// receives it has a lower priority than the step that sends it, and the
/// receiver's priority is the sender's minus a constant, so both ends of a
/// link meet the kinds in the same order. Take a stuck state and its lowest
/// tick `t`: every frame of tick `t - 1` was sent, so a rank stuck at tick
/// `t` waits for a free slot, on a link whose receiver has not taken some
/// frame of tick `t - 1` yet; by (3) that receiver sits at a step of lower
/// priority than the waiting sender, and waits in turn. Priorities fall
/// along the chain of waits, so the chain ends at a rank that can move.
/// With one frame per link and tick, (3) is not needed: a link then holds at
/// most the one frame of tick `t - 1` when tick `t` sends.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    stamped: Vec<(u64, i64, usize, Step)>,
}

impl Timeline {
    /// Add `step` at `tick` with `priority` within the tick, for `stream`.
    pub(crate) fn at(&mut self, tick: u64, priority: i64, stream: usize, step: Step) {
        self.stamped.push((tick, priority, stream, step));
    }

    /// The steps in (tick, priority, stream) order; steps with equal stamps
    /// keep the order they were added in.
    pub(crate) fn into_schedule(mut self) -> Schedule {
        self.stamped
            .sort_by_key(|&(tick, prio, stream, _)| (tick, prio, stream));
        Schedule {
            steps: self.stamped.into_iter().map(|(.., step)| step).collect(),
        }
    }
}

impl Step {
    /// A step with no peers at `input`/`output` offsets (callers set the
    /// rest with struct update syntax).
    pub(crate) fn local(
        prim: Prim,
        local: Operand,
        input: usize,
        output: usize,
        len: usize,
    ) -> Step {
        Step {
            prim,
            local,
            send_to: NO_PEER,
            recv_from: NO_PEER,
            input,
            output,
            len,
            send_tag: 0,
            recv_tag: 0,
            channel: 0,
        }
    }
}

/// Split `count` elements into `parts` contiguous pieces whose sizes differ
/// by at most one (the first `count % parts` pieces get the extra element).
/// Returns `(offset, len)` of piece `index`.
pub fn partition(count: usize, parts: usize, index: usize) -> (usize, usize) {
    let base = count / parts;
    let extra = count % parts;
    let offset = index * base + index.min(extra);
    let len = base + usize::from(index < extra);
    (offset, len)
}

/// The part of a piece `(offset, len)` that slice `s` of `slice` elements
/// covers; empty past the end.
pub fn slice_of(piece: (usize, usize), s: usize, slice: usize) -> (usize, usize) {
    let start = (s * slice).min(piece.1);
    let len = slice.min(piece.1 - start);
    (piece.0 + start, len)
}

pub(crate) mod sim;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_covers_everything_once() {
        for count in [0usize, 1, 2, 7, 8, 9, 1000003] {
            for parts in 1..=9 {
                let mut next = 0;
                for i in 0..parts {
                    let (off, len) = partition(count, parts, i);
                    assert_eq!(off, next);
                    assert!(len == count / parts || len == count / parts + 1);
                    next += len;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn slices_cover_a_piece() {
        for len in [0usize, 1, 5, 64, 65] {
            let slice = 16;
            let n = len.div_ceil(slice).max(1);
            let mut total = 0;
            for s in 0..n + 2 {
                let (off, l) = slice_of((100, len), s, slice);
                assert!(l <= slice);
                if l > 0 {
                    assert_eq!(off, 100 + total);
                }
                total += l;
            }
            assert_eq!(total, len);
        }
    }
}
