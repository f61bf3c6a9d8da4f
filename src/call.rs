//! The vocabulary of a call, shared by every layer that describes, plans
//! or carries out one: its kind ([`CollKind`]), the call as the API
//! received it ([`CollCall`]), where its memory lives ([`Memory`]) and the
//! slice geometry the planner gives it ([`Geometry`]). Plain data, and a
//! leaf: it imports nothing above `algo` and `element`, so `coll`, `plan`
//! and `tune` all import it and none of them imports another for it (the
//! cycle `coll <-> plan <-> tune` that holding these in `coll` and `plan`
//! made). No I/O, no clock, no `unsafe`.

use crate::algo::ring::RingParams;
use crate::element::ReduceOp;

/// The kinds of call that carry a fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CollKind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    SendRecv,
    AllToAll,
    Barrier,
}

impl CollKind {
    pub(crate) const ALL: [CollKind; 8] = [
        CollKind::AllReduce,
        CollKind::ReduceScatter,
        CollKind::AllGather,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::SendRecv,
        CollKind::AllToAll,
        CollKind::Barrier,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce => "all_reduce",
            CollKind::ReduceScatter => "reduce_scatter",
            CollKind::AllGather => "all_gather",
            CollKind::Broadcast => "broadcast",
            CollKind::Reduce => "reduce",
            CollKind::SendRecv => "send/recv",
            CollKind::AllToAll => "all_to_all",
            CollKind::Barrier => "barrier",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            CollKind::AllReduce => 1,
            CollKind::ReduceScatter => 2,
            CollKind::AllGather => 3,
            CollKind::Broadcast => 4,
            CollKind::Reduce => 5,
            CollKind::SendRecv => 6,
            CollKind::AllToAll => 7,
            CollKind::Barrier => 8,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }

    /// Elements of a call's input and output per rank, for the count its
    /// fingerprint carries (the caller's `count`) on `size` ranks.
    pub(crate) fn extents(self, count: usize, size: usize) -> (usize, usize) {
        match self {
            CollKind::AllGather => (count, count * size),
            CollKind::ReduceScatter => (count * size, count),
            _ => (count, count),
        }
    }
}

/// One collective call as the API received it: every public collective
/// is described by one of these, then planned by `coll::plan`. Equal
/// calls (with equal element sizes, on one communicator) get equal plans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CollCall {
    pub(crate) kind: CollKind,
    /// The count the caller named (the fingerprint's): an allreduce's
    /// buffer, a reduce-scatter's output block, an allgather's input block,
    /// an all-to-all's whole input.
    pub(crate) count: usize,
    /// Elements of the send buffer (in place: of the one buffer).
    pub(crate) send_len: usize,
    /// Elements of the receive buffer (in place: of the one buffer).
    pub(crate) recv_len: usize,
    pub(crate) op: Option<ReduceOp>,
    /// Broadcast and reduce: the root. Send/recv: the rank the data comes
    /// from (this rank for a send).
    pub(crate) root: Option<usize>,
    /// Send/recv: (peer, sending).
    pub(crate) p2p: Option<(usize, bool)>,
    /// One buffer for input and output.
    pub(crate) in_place: bool,
    /// Where the buffers live (the planner refuses memory it has no path
    /// for before anything else happens).
    pub(crate) memory: Memory,
    /// One of the library's own calls (an agreement of set-up, `split` or
    /// `alloc_window`, the tuner's calibration), numbered apart from the
    /// user's calls.
    pub(crate) internal: bool,
}

impl CollCall {
    /// A call of `kind` on `count` elements; the rest set with struct
    /// update syntax.
    pub(crate) fn new(kind: CollKind, count: usize, send_len: usize, recv_len: usize) -> Self {
        CollCall {
            kind,
            count,
            send_len,
            recv_len,
            op: None,
            root: None,
            p2p: None,
            in_place: false,
            memory: Memory::Host,
            internal: false,
        }
    }

    /// An in-place allreduce by `op` of `count` elements.
    pub(crate) fn all_reduce_in_place(count: usize, op: ReduceOp) -> Self {
        CollCall {
            op: Some(op),
            in_place: true,
            ..Self::new(CollKind::AllReduce, count, count, count)
        }
    }

    /// A send (`sending`) of `count` elements from `rank` to `peer`, or
    /// `rank`'s receive of them from `peer`: one buffer of `count` on the
    /// side that has one, and the sending rank as its root.
    pub(crate) fn p2p(count: usize, rank: usize, peer: usize, sending: bool) -> Self {
        let (send_len, recv_len, root) = if sending {
            (count, 0, rank)
        } else {
            (0, count, peer)
        };
        CollCall {
            p2p: Some((peer, sending)),
            root: Some(root),
            ..CollCall::new(CollKind::SendRecv, count, send_len, recv_len)
        }
    }

    /// Elements each slice of the call is cut from (`plan::geometry`'s
    /// count): an all-to-all moves blocks of `send_len / size`.
    pub(crate) fn slice_count(&self, size: usize) -> usize {
        match self.kind {
            CollKind::AllToAll => self.send_len / size.max(1),
            _ => self.count,
        }
    }
}

/// Where a call's buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Memory {
    /// Host memory the CPU reads and writes (slices, windows).
    Host,
    /// Memory of CUDA device `ordinal`: moved by the staged executor
    /// (through pinned host memory), never by a host route.
    Device {
        /// The device's ordinal.
        ordinal: u32,
    },
}

/// Rank geometry and slice size of a call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// Largest slice, in elements of the call's type.
    pub(crate) slice: usize,
    /// Slices in flight in a ring pass (`RingParams::depth`); 1 runs them
    /// one after the other.
    pub(crate) depth: usize,
}

impl Geometry {
    pub(crate) fn ring(&self) -> RingParams {
        RingParams {
            rank: self.rank,
            size: self.size,
            slice: self.slice,
            depth: self.depth,
        }
    }
}
