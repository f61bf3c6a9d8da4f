//! One file per collective: check the arguments (before any byte moves) and
//! pick the schedule. Nothing here does I/O, holds `unsafe` or reads a clock.

mod all_gather;
mod all_reduce;
mod all_to_all;
mod barrier;
mod broadcast;
mod point_to_point;
mod reduce;
mod reduce_scatter;

pub(crate) use all_gather::{all_gather, all_gather_in_place};
pub(crate) use all_reduce::all_reduce;
pub(crate) use all_to_all::all_to_all;
pub(crate) use barrier::barrier;
pub(crate) use broadcast::broadcast;
pub(crate) use point_to_point::point_to_point;
pub(crate) use reduce::reduce;
pub(crate) use reduce_scatter::{reduce_scatter, reduce_scatter_in_place};

use crate::algo::ring::RingParams;
use crate::algo::Schedule;
use crate::error::{Error, Result};

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
    const ALL: [CollKind; 8] = [
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
}

/// A checked call: its schedule and where its buffers start.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) schedule: Schedule,
    /// In place: where the input starts in the one buffer.
    pub(crate) input_base: usize,
    /// In place: where the output starts in the one buffer.
    pub(crate) output_base: usize,
    /// The schedule reads its input after it has written its output there
    /// (direct allreduce): in place, the caller runs it out of place from a
    /// copy of the buffer.
    pub(crate) copies_input: bool,
    /// Elements of a temporary output the caller runs the schedule on,
    /// because the schedule keeps partial results where the caller gave no
    /// output or wants its buffer unchanged (a non-root rank of a tree
    /// reduce); 0 for none.
    pub(crate) scratch_output: usize,
}

impl Plan {
    fn new(schedule: Schedule) -> Self {
        Plan {
            schedule,
            input_base: 0,
            output_base: 0,
            copies_input: false,
            scratch_output: 0,
        }
    }

    fn copying_input(mut self) -> Self {
        self.copies_input = true;
        self
    }
}

/// Rank geometry and slice size of a call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// Largest slice, in elements of the call's type.
    pub(crate) slice: usize,
}

impl Geometry {
    pub(crate) fn ring(&self) -> RingParams {
        RingParams {
            rank: self.rank,
            size: self.size,
            slice: self.slice,
        }
    }
}

pub(crate) fn check_len(what: &str, got: usize, want: usize, rule: &str) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} has {got} elements but must have {want} ({rule})"
        )))
    }
}

pub(crate) fn check_rank(what: &str, rank: usize, size: usize) -> Result<()> {
    if rank < size {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} {rank} is out of range for a communicator of {size} ranks (0..{size})"
        )))
    }
}
