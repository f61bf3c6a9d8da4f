//! What the layer keeps per unit: its [`Layout`] (length and shard), its
//! shard, gradient and optimizer state, where its whole parameter is
//! ([`Full`]), where it is in a step's protocol ([`Phase`]), and the
//! misuses of that protocol a rank remembers for every rank to name at
//! the step's end ([`Fault`]).

use super::pool::Pending;
use super::UnitSpec;

/// Where a unit's whole parameter is.
pub(super) enum Full {
    Absent,
    Pending(Pending),
    Ready(Vec<f32>),
}

/// Where a unit is in the step's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    Forward,
    AfterForward,
    Backward,
}

/// A misuse of the protocol on this rank, remembered for the step's end
/// so that every rank can name it (`finish_backward`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    GatheredTwice,
    NotGatheredForBackward,
    WrongLength,
    ParamsOutside,
    PostForwardWithout,
}

impl Fault {
    pub(super) const ALL: [Fault; 5] = [
        Fault::GatheredTwice,
        Fault::NotGatheredForBackward,
        Fault::WrongLength,
        Fault::ParamsOutside,
        Fault::PostForwardWithout,
    ];

    pub(super) fn what(self) -> &'static str {
        match self {
            Fault::GatheredTwice => {
                "gathered twice: pre_forward or pre_backward while the unit is still in use \
                 (call post_forward or post_backward first)"
            }
            Fault::NotGatheredForBackward => {
                "gradient for a unit that was not gathered for backward (call pre_backward first)"
            }
            Fault::WrongLength => "gradient of the wrong length",
            Fault::ParamsOutside => {
                "params asked outside pre_forward..post_forward or pre_backward..post_backward"
            }
            Fault::PostForwardWithout => "post_forward without pre_forward",
        }
    }

    /// `code << 32 | unit`, plus one so that 0 means "nothing".
    pub(super) fn encode(self, unit: usize) -> u64 {
        let code = Fault::ALL.iter().position(|&f| f == self).unwrap_or(0) as u64;
        (code << 32 | (unit as u64 & 0xffff_ffff)) + 1
    }

    pub(super) fn decode(v: u64) -> Option<(Fault, usize)> {
        let v = v.checked_sub(1)?;
        let fault = *Fault::ALL.get((v >> 32) as usize)?;
        Some((fault, (v & 0xffff_ffff) as usize))
    }
}

/// Sizes of one unit's flat parameter.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    pub(super) numel: usize,
    /// Elements of each rank's shard (the flat parameter padded to a
    /// multiple of the sharding group).
    pub(super) shard: usize,
}

impl Layout {
    /// The elements of the flat parameter that the shard at place
    /// `shard_rank` holds, without the padding (empty past the end).
    pub(super) fn own(&self, shard_rank: usize) -> std::ops::Range<usize> {
        let start = (shard_rank * self.shard).min(self.numel);
        start..(start + self.shard).min(self.numel)
    }
}

pub(super) struct Unit {
    pub(super) spec: UnitSpec,
    pub(super) layout: Layout,
    /// This rank's shard of the parameters (the whole padded parameter
    /// under `NoShard`).
    pub(super) shard: Vec<f32>,
    pub(super) grad: Vec<f32>,
    pub(super) state: Vec<f32>,
    pub(super) full: Full,
    pub(super) phase: Phase,
    /// Gradients kept while synchronisation is off (`set_sync(false)`).
    pub(super) acc: Option<Vec<f32>>,
}

/// A gradient reduction in flight: the unit, and the collective.
pub(super) struct Reducing {
    pub(super) unit: usize,
    pub(super) work: Pending,
}
