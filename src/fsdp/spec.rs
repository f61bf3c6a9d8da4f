//! What a user describes: the units of a model and their tensors
//! ([`UnitSpec`], [`TensorSpec`]), and how they are sharded and
//! communicated ([`FsdpConfig`]: [`Strategy`], [`Precision`]).

use half::{bf16, f16};

/// One tensor of a unit: a name for errors and its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Shown in errors, e.g. `weight`.
    pub name: String,
    /// Dimensions; the tensor has their product of elements.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// A tensor called `name` of `shape`.
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        TensorSpec {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }

    /// Elements of the tensor.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A unit: tensors flattened one after the other into one flat parameter,
/// gathered and freed together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpec {
    /// Shown in errors, e.g. `encoder.layer3`.
    pub name: String,
    /// The unit's tensors, in flat order.
    pub tensors: Vec<TensorSpec>,
}

impl UnitSpec {
    /// A unit called `name` made of `tensors`.
    pub fn new(name: impl Into<String>, tensors: Vec<TensorSpec>) -> Self {
        UnitSpec {
            name: name.into(),
            tensors,
        }
    }

    /// Elements of the flat parameter.
    pub fn numel(&self) -> usize {
        self.tensors.iter().map(TensorSpec::numel).sum()
    }

    /// Where each tensor lies in the flat parameter.
    pub fn offsets(&self) -> Vec<std::ops::Range<usize>> {
        let mut at = 0;
        self.tensors
            .iter()
            .map(|t| {
                let r = at..at + t.numel();
                at = r.end;
                r
            })
            .collect()
    }
}

/// How parameters, gradients and optimizer state are spread over ranks
/// (PyTorch's `ShardingStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Parameters, gradients and optimizer state sharded over every rank;
    /// parameters gathered before forward and again before backward.
    FullShard,
    /// Gradients and optimizer state sharded; parameters kept whole on
    /// every rank (ZeRO-2): after each step every rank's updated shard is
    /// gathered into the whole copy, once per unit.
    ShardGradOp,
    /// Nothing sharded: plain data parallel through the same interface
    /// (gradients averaged by allreduce).
    NoShard,
    /// Full sharding inside groups of `group` consecutive ranks (a host,
    /// say), replicated across groups: gradients are reduce-scattered
    /// inside the group, then each shard is allreduced across groups.
    /// `group` must divide the number of ranks.
    HybridShard {
        /// Ranks per sharding group.
        group: usize,
    },
}

impl Strategy {
    pub(super) fn code(self) -> u64 {
        match self {
            Strategy::FullShard => 1,
            Strategy::ShardGradOp => 2,
            Strategy::NoShard => 3,
            Strategy::HybridShard { group } => 4 | (group as u64) << 8,
        }
    }
}

/// The type parameters travel in (gathered) or gradients are reduced in;
/// shards and optimizer state are always f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// Full precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl Precision {
    pub(super) fn code(self) -> u64 {
        match self {
            Precision::F32 => 1,
            Precision::F16 => 2,
            Precision::Bf16 => 3,
        }
    }

    /// `v` as this type would hold it.
    pub fn round(self, v: f32) -> f32 {
        match self {
            Precision::F32 => v,
            Precision::F16 => f16::from_f32(v).to_f32(),
            Precision::Bf16 => bf16::from_f32(v).to_f32(),
        }
    }
}

/// How [`Fsdp`](super::Fsdp) shards and communicates. Every rank must use the same
/// settings and units (checked at construction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsdpConfig {
    /// What is sharded.
    pub strategy: Strategy,
    /// Type parameters are gathered in (FSDP's `param_dtype`): the
    /// parameters a unit computes with are the shards rounded to it.
    pub param_dtype: Precision,
    /// Type gradients are reduced in (`reduce_dtype`); the average is
    /// taken in f32 after the reduction.
    pub reduce_dtype: Precision,
    /// Free a unit's gathered parameters after forward and gather again
    /// for backward (FSDP's `reshard_after_forward`); `false` keeps them
    /// from forward to backward, one gather per step.
    pub reshard_after_forward: bool,
    /// Most whole-unit buffers a rank may hold at once (FSDP's
    /// `limit_all_gathers`, widened to every buffer of a unit's size):
    /// gathered parameters, gradients being reduced, and freed buffers kept
    /// for reuse together. A prefetch waits for room; a gather that
    /// `pre_forward`/`pre_backward` needs and a new reduction first wait
    /// for the oldest reductions to end. Only units the caller keeps
    /// (`reshard_after_forward: false`) go past it.
    pub limit_gathered: usize,
}

impl Default for FsdpConfig {
    fn default() -> Self {
        FsdpConfig {
            strategy: Strategy::FullShard,
            param_dtype: Precision::F32,
            reduce_dtype: Precision::F32,
            reshard_after_forward: true,
            // The unit in use, the next one prefetched, and one gradient
            // reduction in flight behind them.
            limit_gathered: 3,
        }
    }
}
