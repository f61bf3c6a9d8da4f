//! Sharded data parallel (FSDP, ZeRO): each rank keeps 1/N of every unit's
//! parameters, gradients and optimizer state, and gathers a unit's
//! parameters only while it is used.
//!
//! The model is an ordered list of *units* ([`UnitSpec`]), each a flat
//! parameter made of several tensors (FSDP's wrapping). A rank holds one
//! shard of each unit's flat parameter, padded so that every shard has the
//! same length. A training step drives [`Fsdp`] unit by unit:
//!
//! ```no_run
//! use ferroccl::fsdp::{Fsdp, FsdpConfig, Optimizer, TensorSpec, UnitSpec};
//! let comm = ferroccl::Communicator::from_env()?;
//! let units = vec![
//!     UnitSpec::new("layer1", vec![TensorSpec::new("w", &[64, 32]), TensorSpec::new("b", &[64])]),
//!     UnitSpec::new("layer2", vec![TensorSpec::new("w", &[10, 64]), TensorSpec::new("b", &[10])]),
//! ];
//! // Every rank fills its own shard (offsets are into the unit's flat parameter).
//! let mut fsdp = Fsdp::new(&comm, units, FsdpConfig::default(), |_unit, start, shard| {
//!     for (i, w) in shard.iter_mut().enumerate() {
//!         *w = ((start + i) as f32 * 0.37).sin() * 0.1;
//!     }
//! })?;
//! for _step in 0..10 {
//!     for u in 0..2 {
//!         fsdp.pre_forward(u)?; // gathers (or finds prefetched) the unit
//!         let _w = fsdp.params(u)?; // the whole flat parameter
//!         // ... the unit's forward ...
//!         fsdp.post_forward(u)?; // frees the full copy
//!     }
//!     for u in (0..2).rev() {
//!         fsdp.pre_backward(u)?; // gathers again
//!         let grad = vec![0.0f32; fsdp.unit_len(u)]; // ... the unit's backward ...
//!         fsdp.post_backward(u, &grad)?; // reduce-scatters, async
//!     }
//!     fsdp.finish_backward()?; // the local gradient shards are averaged
//!     fsdp.step(&Optimizer::adam(1e-3))?;
//! }
//! # Ok::<(), ferroccl::Error>(())
//! ```
//!
//! Everything moves through the public [`Communicator`] API (in-place
//! [`Communicator::all_gather_async`] and
//! [`Communicator::reduce_scatter_async`], `all_reduce_async`, `split`):
//! no unsafe code, nothing of transports. `docs/fsdp.md` is the guide.

mod optim;

pub use optim::Optimizer;

use crate::Work;
use crate::{Communicator, Element, Error, ReduceOp, Result};
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
    fn code(self) -> u64 {
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
    fn code(self) -> u64 {
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

/// How [`Fsdp`] shards and communicates. Every rank must use the same
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

/// Bytes a rank holds for the model, by the layer's own accounting
/// ([`Fsdp::memory`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Parameter shards (f32), and whole parameters kept on every rank
    /// (`ShardGradOp`, `NoShard`).
    pub params: usize,
    /// Gradient shards (f32).
    pub grads: usize,
    /// Optimizer state (f32).
    pub optim: usize,
    /// Gathered parameters alive now (in `param_dtype` while in flight,
    /// f32 once ready), of strategies that free them.
    pub gathered: usize,
    /// Most `gathered` since construction.
    pub peak_gathered: usize,
    /// Most units gathered at once since construction.
    pub peak_gathered_units: usize,
    /// Most `gathered + reducing + pooled` since construction: the
    /// whole-unit buffers `limit_gathered` bounds.
    pub peak_working: usize,
    /// Most whole-unit buffers (gathered, reducing and pooled) at once
    /// since construction.
    pub peak_working_buffers: usize,
    /// Gradients accumulated outside synchronisation (`no_sync`).
    pub accumulated: usize,
    /// Gradient buffers being reduced (from `post_backward` until each
    /// reduction is folded in), in `reduce_dtype`; under `HybridShard`
    /// also the reduced f32 shards being summed across the groups.
    pub reducing: usize,
    /// Buffers of finished collectives kept for the next ones, as many as
    /// `limit_gathered` leaves room for.
    pub pooled: usize,
}

impl Memory {
    /// Everything together.
    pub fn total(&self) -> usize {
        self.params
            + self.grads
            + self.optim
            + self.gathered
            + self.accumulated
            + self.reducing
            + self.pooled
    }
}

/// A flat buffer in flight, in the type it travels in.
enum Pending {
    F32(Work<Vec<f32>>),
    F16(Work<Vec<f16>>),
    Bf16(Work<Vec<bf16>>),
}

impl Pending {
    fn bytes(&self, len: usize) -> usize {
        len * match self {
            Pending::F32(_) => 4,
            Pending::F16(_) | Pending::Bf16(_) => 2,
        }
    }

    fn is_complete(&self) -> bool {
        match self {
            Pending::F32(w) => w.is_complete(),
            Pending::F16(w) => w.is_complete(),
            Pending::Bf16(w) => w.is_complete(),
        }
    }

    /// Wait, and give the whole buffer as f32: an f32 one as it is (padded
    /// length), a 16-bit one converted into a pooled f32 buffer of `len`
    /// and handed back to the pool.
    fn into_f32(self, pool: &mut Pool, len: usize) -> Result<Vec<f32>> {
        match self {
            Pending::F32(w) => w.wait(),
            sixteen => sixteen.block(pool, 0..len),
        }
    }

    /// Wait, add elements `range` times `scale` into `into`, and give the
    /// whole buffer back to the pool (no copy of the block is made).
    fn add_block(
        self,
        pool: &mut Pool,
        range: std::ops::Range<usize>,
        into: &mut [f32],
        scale: f32,
    ) -> Result<()> {
        fn add<T: Pooled>(
            v: Vec<T>,
            pool: &mut Pool,
            r: std::ops::Range<usize>,
            into: &mut [f32],
            scale: f32,
        ) {
            for (g, x) in into.iter_mut().zip(&v[r]) {
                *g += x.to_f64() as f32 * scale;
            }
            pool.give(v);
        }
        match self {
            Pending::F32(w) => add(w.wait()?, pool, range, into, scale),
            Pending::F16(w) => add(w.wait()?, pool, range, into, scale),
            Pending::Bf16(w) => add(w.wait()?, pool, range, into, scale),
        }
        Ok(())
    }

    /// Wait, and give elements `range` as a pooled f32 buffer; the whole
    /// buffer goes back to the pool.
    fn block(self, pool: &mut Pool, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        fn cut<T: Pooled>(v: Vec<T>, pool: &mut Pool, range: std::ops::Range<usize>) -> Vec<f32> {
            let mut out = pool.take::<f32>(range.len());
            for (o, x) in out.iter_mut().zip(&v[range]) {
                *o = x.to_f64() as f32;
            }
            pool.give(v);
            out
        }
        Ok(match self {
            Pending::F32(w) => cut(w.wait()?, pool, range),
            Pending::F16(w) => cut(w.wait()?, pool, range),
            Pending::Bf16(w) => cut(w.wait()?, pool, range),
        })
    }
}

/// Buffers of finished collectives, kept for the next ones. A fresh zeroed
/// buffer for every gather and reduction made the allocator hand whole
/// units' memory back to the kernel and fault it in again every step
/// (1.6 million minor page faults in a 20-step FullShard run of
/// `mlp_fsdp`, docs/performance.md). The owner trims it to the room its
/// limit leaves ([`Pool::trim`]); `memory()` counts it.
struct Pool {
    f32: Vec<Vec<f32>>,
    f16: Vec<Vec<f16>>,
    bf16: Vec<Vec<bf16>>,
    /// Most buffers to keep while a new one is taken (set by the owner).
    spare: usize,
}

/// The element types the pool keeps.
trait Pooled: Element {
    fn list(pool: &mut Pool) -> &mut Vec<Vec<Self>>;
}

impl Pooled for f32 {
    fn list(pool: &mut Pool) -> &mut Vec<Vec<Self>> {
        &mut pool.f32
    }
}

impl Pooled for f16 {
    fn list(pool: &mut Pool) -> &mut Vec<Vec<Self>> {
        &mut pool.f16
    }
}

impl Pooled for bf16 {
    fn list(pool: &mut Pool) -> &mut Vec<Vec<Self>> {
        &mut pool.bf16
    }
}

impl Pool {
    /// A buffer of `len` elements, contents unspecified (zero if new).
    /// The pool keeps at most `spare` buffers besides: it drops buffers
    /// before a new one is allocated, so the owner's count holds even then.
    fn take<T: Pooled>(&mut self, len: usize) -> Vec<T> {
        let list = T::list(self);
        let found = list
            .iter()
            .position(|v| v.len() == len)
            .map(|i| list.swap_remove(i));
        self.trim(self.spare);
        found.unwrap_or_else(|| vec![T::from_f64(0.0); len])
    }

    fn give<T: Pooled>(&mut self, v: Vec<T>) {
        T::list(self).push(v);
    }

    fn len(&self) -> usize {
        self.f32.len() + self.f16.len() + self.bf16.len()
    }

    /// Keep at most `keep` buffers, dropping the smallest first (the large
    /// ones are the costly ones to fault in again).
    fn trim(&mut self, keep: usize) {
        fn smallest<T>(list: &[Vec<T>], size: usize, kind: u8) -> Option<(usize, u8, usize)> {
            let (i, v) = list.iter().enumerate().min_by_key(|(_, v)| v.len())?;
            Some((size * v.len(), kind, i))
        }
        while self.len() > keep {
            let least = [
                smallest(&self.f32, 4, 0),
                smallest(&self.f16, 2, 1),
                smallest(&self.bf16, 2, 2),
            ]
            .into_iter()
            .flatten()
            .min();
            match least {
                Some((_, 0, i)) => drop(self.f32.swap_remove(i)),
                Some((_, 1, i)) => drop(self.f16.swap_remove(i)),
                Some((_, _, i)) => drop(self.bf16.swap_remove(i)),
                None => break,
            }
        }
    }

    fn bytes(&self) -> usize {
        self.f32.iter().map(|v| 4 * v.capacity()).sum::<usize>()
            + self.f16.iter().map(|v| 2 * v.capacity()).sum::<usize>()
            + self.bf16.iter().map(|v| 2 * v.capacity()).sum::<usize>()
    }
}

/// Where a unit's whole parameter is.
enum Full {
    Absent,
    Pending(Pending),
    Ready(Vec<f32>),
}

/// Where a unit is in the step's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Forward,
    AfterForward,
    Backward,
}

/// A misuse of the protocol on this rank, remembered for the step's end
/// so that every rank can name it (`finish_backward`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    GatheredTwice,
    NotGatheredForBackward,
    WrongLength,
    ParamsOutside,
    PostForwardWithout,
}

impl Fault {
    const ALL: [Fault; 5] = [
        Fault::GatheredTwice,
        Fault::NotGatheredForBackward,
        Fault::WrongLength,
        Fault::ParamsOutside,
        Fault::PostForwardWithout,
    ];

    fn what(self) -> &'static str {
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
    fn encode(self, unit: usize) -> u64 {
        let code = Fault::ALL.iter().position(|&f| f == self).unwrap_or(0) as u64;
        (code << 32 | (unit as u64 & 0xffff_ffff)) + 1
    }

    fn decode(v: u64) -> Option<(Fault, usize)> {
        let v = v.checked_sub(1)?;
        let fault = *Fault::ALL.get((v >> 32) as usize)?;
        Some((fault, (v & 0xffff_ffff) as usize))
    }
}

/// Sizes of one unit's flat parameter.
#[derive(Debug, Clone, Copy)]
struct Layout {
    numel: usize,
    /// Elements of each rank's shard (the flat parameter padded to a
    /// multiple of the sharding group).
    shard: usize,
}

impl Layout {
    /// The elements of the flat parameter that the shard at place
    /// `shard_rank` holds, without the padding (empty past the end).
    fn own(&self, shard_rank: usize) -> std::ops::Range<usize> {
        let start = (shard_rank * self.shard).min(self.numel);
        start..(start + self.shard).min(self.numel)
    }
}

struct Unit {
    spec: UnitSpec,
    layout: Layout,
    /// This rank's shard of the parameters (the whole padded parameter
    /// under `NoShard`).
    shard: Vec<f32>,
    grad: Vec<f32>,
    state: Vec<f32>,
    full: Full,
    phase: Phase,
    /// Gradients kept while synchronisation is off (`set_sync(false)`).
    acc: Option<Vec<f32>>,
}

/// A gradient reduction in flight: the unit, and the collective.
struct Reducing {
    unit: usize,
    work: Pending,
}

/// The sharded data-parallel state of one rank. See the module docs.
pub struct Fsdp<'c> {
    comm: &'c Communicator,
    /// `HybridShard`: the ranks of this rank's group (sharding), and the
    /// ranks at the same place in every group (replication).
    intra: Option<Communicator>,
    inter: Option<Communicator>,
    config: FsdpConfig,
    units: Vec<Unit>,
    /// Ranks one unit is sharded over, and this rank's place among them.
    shard_ranks: usize,
    shard_rank: usize,
    world: usize,
    rank: usize,
    reducing: Vec<Reducing>,
    /// The reductions in flight as every rank counts them: those issued
    /// and not yet waited for by the limit or `finish_backward`. A rank
    /// also folds in reductions that happen to be done early (fewer in
    /// `reducing`), but that depends on timing, and what decides whether
    /// a collective is issued (a prefetch) must be the same on every rank:
    /// it reads this count, which is never below `reducing.len()`.
    unforced: usize,
    /// `HybridShard`: reduced shards being summed across the groups.
    across: Vec<(usize, Work<Vec<f32>>)>,
    /// Buffers of finished collectives, for the next ones.
    pool: Pool,
    /// This step's first misuse on this rank (unit, what), told to every
    /// rank at `finish_backward`.
    fault: Option<(usize, Fault)>,
    sync: bool,
    steps: u64,
    /// Steps since the optimizer state was last reset (Adam's bias
    /// correction counts these).
    optimizer_steps: u64,
    /// Orders learned in the first step (prefetch follows them after).
    forward_order: Vec<usize>,
    backward_order: Vec<usize>,
    learned: bool,
    peak_gathered: usize,
    peak_gathered_units: usize,
    peak_working: usize,
    peak_working_buffers: usize,
}

impl std::fmt::Debug for Fsdp<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fsdp")
            .field("rank", &self.rank)
            .field("strategy", &self.config.strategy)
            .field("units", &self.units.len())
            .finish()
    }
}

/// The communicator a unit is sharded over under `strategy` (None: not
/// sharded): `intra`, a group's ranks, under `HybridShard` with groups
/// smaller than the job, else the whole `comm`. A function of the fields
/// rather than a method, so that callers can hold it beside `&mut` of
/// another field (the pool).
fn shard_comm<'a>(
    strategy: Strategy,
    comm: &'a Communicator,
    intra: Option<&'a Communicator>,
) -> Option<&'a Communicator> {
    match strategy {
        Strategy::NoShard => None,
        Strategy::HybridShard { .. } => Some(intra.unwrap_or(comm)),
        Strategy::FullShard | Strategy::ShardGradOp => Some(comm),
    }
}

fn fnv(h: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *h ^= u64::from(*b);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

impl<'c> Fsdp<'c> {
    /// Shard `units` over `comm`'s ranks. `init(unit, start, shard)` fills
    /// this rank's part of a unit's flat parameter, elements `start..` (the
    /// padding past the unit's end stays zero). A collective: every rank
    /// calls it with the same units and settings, or every rank gets
    /// `InvalidArgument` naming the first rank that differs.
    pub fn new(
        comm: &'c Communicator,
        units: Vec<UnitSpec>,
        config: FsdpConfig,
        mut init: impl FnMut(usize, usize, &mut [f32]),
    ) -> Result<Self> {
        let (rank, world) = (comm.rank(), comm.size());
        let bad = |what: String| Error::InvalidArgument(format!("fsdp on rank {rank}: {what}"));
        if config.limit_gathered == 0 {
            return Err(bad("limit_gathered must be at least 1".into()));
        }
        let group = match config.strategy {
            Strategy::HybridShard { group } => {
                if group == 0 || world % group != 0 {
                    return Err(bad(format!(
                        "HybridShard group of {group} ranks does not divide {world} ranks"
                    )));
                }
                group
            }
            Strategy::FullShard | Strategy::ShardGradOp => world,
            Strategy::NoShard => 1,
        };
        for (u, spec) in units.iter().enumerate() {
            if spec.numel() == 0 {
                return Err(bad(format!("unit `{}` (#{u}) has no elements", spec.name)));
            }
        }
        Self::agree(comm, &units, &config)?;
        let (intra, inter) = match config.strategy {
            Strategy::HybridShard { group } if group < world => {
                let (g, at) = ((rank / group) as i32, (rank % group) as i32);
                (comm.split(g, at)?, comm.split(at, g)?)
            }
            _ => (None, None),
        };
        let shard_rank = if group == 1 { 0 } else { rank % group };
        let units = units
            .into_iter()
            .enumerate()
            .map(|(u, spec)| {
                let numel = spec.numel();
                let layout = Layout {
                    numel,
                    shard: numel.div_ceil(group),
                };
                let mine = layout.own(shard_rank);
                let mut own = vec![0f32; layout.shard];
                init(u, mine.start, &mut own[..mine.len()]);
                Unit {
                    spec,
                    layout,
                    grad: vec![0f32; layout.shard],
                    shard: own,
                    state: Vec::new(),
                    full: Full::Absent,
                    phase: Phase::Idle,
                    acc: None,
                }
            })
            .collect();
        let config_limit = config.limit_gathered;
        let mut fsdp = Fsdp {
            comm,
            intra,
            inter,
            config,
            units,
            shard_ranks: group,
            shard_rank,
            world,
            rank,
            reducing: Vec::new(),
            unforced: 0,
            across: Vec::new(),
            pool: Pool {
                f32: Vec::new(),
                f16: Vec::new(),
                bf16: Vec::new(),
                spare: config_limit,
            },
            fault: None,
            sync: true,
            steps: 0,
            optimizer_steps: 0,
            forward_order: Vec::new(),
            backward_order: Vec::new(),
            learned: false,
            peak_gathered: 0,
            peak_gathered_units: 0,
            peak_working: 0,
            peak_working_buffers: 0,
        };
        fsdp.refresh_whole()?;
        Ok(fsdp)
    }

    /// Shard whole parameters every rank holds (each unit's flat parameter,
    /// `unit_len(u)` elements): each rank keeps its own part. For models
    /// that fit one rank; [`Fsdp::new`] never needs the whole model.
    pub fn from_full(
        comm: &'c Communicator,
        units: Vec<UnitSpec>,
        config: FsdpConfig,
        full: &[Vec<f32>],
    ) -> Result<Self> {
        let rank = comm.rank();
        if full.len() != units.len() || full.iter().zip(&units).any(|(f, u)| f.len() != u.numel()) {
            return Err(Error::InvalidArgument(format!(
                "fsdp on rank {rank}: from_full got {} flat parameters where the units \
                 need {} of lengths {:?}",
                full.len(),
                units.len(),
                units.iter().map(UnitSpec::numel).collect::<Vec<_>>()
            )));
        }
        Self::new(comm, units, config, |u, start, shard| {
            shard.copy_from_slice(&full[u][start..start + shard.len()]);
        })
    }

    /// Every rank checks that every other has the same units and settings.
    fn agree(comm: &Communicator, units: &[UnitSpec], config: &FsdpConfig) -> Result<()> {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for spec in units {
            fnv(&mut h, spec.name.as_bytes());
            fnv(&mut h, &[0]);
            for t in &spec.tensors {
                fnv(&mut h, t.name.as_bytes());
                fnv(&mut h, &[1]);
                for d in &t.shape {
                    fnv(&mut h, &(*d as u64).to_le_bytes());
                }
            }
        }
        let settings = config.strategy.code()
            ^ config.param_dtype.code() << 40
            ^ config.reduce_dtype.code() << 44
            ^ u64::from(config.reshard_after_forward) << 48
            ^ (config.limit_gathered as u64) << 50;
        let mine = [units.len() as u64, config.strategy.code(), settings, h];
        let mut all = vec![0u64; 4 * comm.size()];
        comm.all_gather(&mine, &mut all)?;
        let first = &all[..4];
        if let Some(r) = (1..comm.size()).find(|&r| &all[4 * r..4 * r + 4] != first) {
            let other = &all[4 * r..4 * r + 4];
            let what = if other[0] != first[0] {
                format!("{} units where rank 0 has {}", other[0], first[0])
            } else if other[1] != first[1] {
                format!(
                    "strategy code {:#x} where rank 0 has {:#x}",
                    other[1], first[1]
                )
            } else if other[2] != first[2] {
                "other settings (precision, reshard_after_forward or limit_gathered) \
                 than rank 0"
                    .to_string()
            } else {
                "units of other names or shapes than rank 0's".to_string()
            };
            return Err(Error::InvalidArgument(format!(
                "fsdp: ranks disagree on the units or the strategy: rank {r} has {what} \
                 (seen on rank {})",
                comm.rank()
            )));
        }
        Ok(())
    }

    /// The communicator a unit is sharded over (None: not sharded).
    fn shard_comm(&self) -> Option<&Communicator> {
        shard_comm(self.config.strategy, self.comm, self.intra.as_ref())
    }

    /// Parameters kept whole between steps (nothing to gather or free
    /// per use).
    fn keeps_whole(&self) -> bool {
        matches!(
            self.config.strategy,
            Strategy::ShardGradOp | Strategy::NoShard
        )
    }

    /// Remember `fault` of unit `u` for the step's end, and give its error.
    fn fault(&mut self, u: usize, fault: Fault, detail: &str) -> Error {
        if self.fault.is_none() {
            self.fault = Some((u, fault));
        }
        let what = if detail.is_empty() {
            fault.what().to_string()
        } else {
            format!("{}: {detail}", fault.what())
        };
        self.err(u, &what)
    }

    fn err(&self, u: usize, what: &str) -> Error {
        let name = self.units.get(u).map_or("?", |x| x.spec.name.as_str());
        Error::InvalidArgument(format!(
            "fsdp: unit `{name}` (#{u}) on rank {}: {what}",
            self.rank
        ))
    }

    fn check_unit(&self, u: usize) -> Result<()> {
        if u >= self.units.len() {
            return Err(Error::InvalidArgument(format!(
                "fsdp on rank {}: no unit #{u} (the model has {})",
                self.rank,
                self.units.len()
            )));
        }
        Ok(())
    }

    /// What a gradient is multiplied by before it is reduced.
    fn pre_scale(&self) -> f32 {
        match self.config.reduce_dtype {
            Precision::F32 => 1.0,
            Precision::F16 | Precision::Bf16 => 1.0 / self.world as f32,
        }
    }

    /// Number of units.
    pub fn num_units(&self) -> usize {
        self.units.len()
    }

    /// Elements of unit `u`'s flat parameter (what `params` gives and
    /// `post_backward` takes).
    pub fn unit_len(&self, u: usize) -> usize {
        self.units[u].layout.numel
    }

    /// The units, as given.
    pub fn units(&self) -> impl Iterator<Item = &UnitSpec> {
        self.units.iter().map(|x| &x.spec)
    }

    /// The settings.
    pub fn config(&self) -> &FsdpConfig {
        &self.config
    }

    /// Elements of each rank's shard of unit `u`, and where this rank's
    /// begins in the flat parameter.
    pub fn shard_range(&self, u: usize) -> std::ops::Range<usize> {
        let l = self.units[u].layout;
        let start = self.shard_rank * l.shard;
        start..start + l.shard
    }

    /// This rank's shard of unit `u`'s parameters (padding included).
    pub fn shard(&self, u: usize) -> &[f32] {
        &self.units[u].shard
    }

    /// This rank's shard of unit `u`'s averaged gradient (after
    /// `finish_backward`; zero after `step`).
    pub fn grad_shard(&self, u: usize) -> &[f32] {
        &self.units[u].grad
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Gather unit `u`'s parameters in `param_dtype`, without waiting.
    fn start_gather(&mut self, u: usize) -> Result<()> {
        let dtype = self.config.param_dtype;
        let Some(comm) = shard_comm(self.config.strategy, self.comm, self.intra.as_ref()) else {
            // Not sharded: the whole copy is the shard, rounded.
            let unit = &mut self.units[u];
            let whole = unit.shard[..unit.layout.numel]
                .iter()
                .map(|&v| dtype.round(v))
                .collect();
            unit.full = Full::Ready(whole);
            return Ok(());
        };
        let (s, n) = (self.units[u].layout.shard, self.shard_ranks);
        let at = self.shard_rank * s;
        self.pool.spare = self.room(1);
        /// A pooled buffer of the whole unit with this rank's shard in
        /// place (the other blocks are overwritten by the allgather).
        fn place<T: Pooled>(pool: &mut Pool, shard: &[f32], n: usize, at: usize) -> Vec<T> {
            let mut buf = pool.take::<T>(shard.len() * n);
            for (d, v) in buf[at..at + shard.len()].iter_mut().zip(shard) {
                *d = T::from_f64(f64::from(*v));
            }
            buf
        }
        let shard = &self.units[u].shard;
        let pool = &mut self.pool;
        let pending = match dtype {
            Precision::F32 => {
                Pending::F32(comm.all_gather_async(place::<f32>(pool, shard, n, at))?)
            }
            Precision::F16 => {
                Pending::F16(comm.all_gather_async(place::<f16>(pool, shard, n, at))?)
            }
            Precision::Bf16 => {
                Pending::Bf16(comm.all_gather_async(place::<bf16>(pool, shard, n, at))?)
            }
        };
        self.units[u].full = Full::Pending(pending);
        self.note();
        Ok(())
    }

    /// Whole-unit buffers in use: gathered units, and gradient reductions
    /// in flight.
    fn alive(&self) -> usize {
        self.gathered_units() + self.reducing.len()
    }

    /// [`Fsdp::alive`] as every rank counts it (reductions done early
    /// still count until the limit or `finish_backward` waits for them):
    /// what decides a prefetch, so that every rank issues the same
    /// collectives in the same order.
    fn alive_on_every_rank(&self) -> usize {
        self.gathered_units() + self.unforced
    }

    /// How many pooled buffers `limit_gathered` leaves room for once
    /// `need` more are in use.
    fn room(&self, need: usize) -> usize {
        self.config
            .limit_gathered
            .saturating_sub(self.alive() + need)
    }

    /// Wait for the oldest reductions until `need` more whole-unit buffers
    /// fit in `limit_gathered` (or none is left in flight). Units kept
    /// from forward to backward by `reshard_after_forward: false` are the
    /// caller's choice and do not take the reductions' room.
    fn make_room(&mut self, need: usize) -> Result<()> {
        let gathered = if self.config.reshard_after_forward {
            self.gathered_units()
        } else {
            0
        };
        let keep = self.config.limit_gathered.saturating_sub(gathered + need);
        self.retire(keep)?;
        // Every rank has now waited for all but `keep` of them.
        self.unforced = self.unforced.min(keep);
        self.pool.spare = self.room(need);
        Ok(())
    }

    /// After a call: trim the pool to the room the limit leaves, and note
    /// the peaks.
    fn note(&mut self) {
        let room = self.room(0);
        self.pool.trim(room);
        let m = self.memory();
        self.peak_gathered = self.peak_gathered.max(m.gathered);
        self.peak_gathered_units = self.peak_gathered_units.max(self.gathered_units());
        let working = m.gathered + m.reducing + m.pooled;
        self.peak_working = self.peak_working.max(working);
        let buffers = self.alive() + self.pool.len();
        self.peak_working_buffers = self.peak_working_buffers.max(buffers);
    }

    /// Note a moment inside a call when `buffers` buffers of `bytes`
    /// together exist besides what `memory()` sees (a buffer being
    /// converted or cut, and its result).
    fn note_transient(&mut self, buffers: usize, bytes: usize) {
        let m = self.memory();
        let working = m.gathered + m.reducing + m.pooled + bytes;
        self.peak_working = self.peak_working.max(working);
        let count = self.alive() + self.pool.len() + buffers;
        self.peak_working_buffers = self.peak_working_buffers.max(count);
    }

    fn gathered_units(&self) -> usize {
        if self.keeps_whole() {
            return 0;
        }
        self.units
            .iter()
            .filter(|x| !matches!(x.full, Full::Absent))
            .count()
    }

    /// Make sure unit `u`'s gather is issued or done, waiting for old
    /// reductions first if the limit is reached.
    fn ensure_gathered(&mut self, u: usize) -> Result<()> {
        if matches!(self.units[u].full, Full::Absent) {
            self.make_room(1)?;
            self.start_gather(u)?;
        }
        Ok(())
    }

    /// Issue the gather of `next` ahead of its use if the limit allows.
    fn prefetch(&mut self, next: Option<usize>) -> Result<()> {
        if self.keeps_whole() {
            return Ok(());
        }
        if let Some(v) = next {
            if matches!(self.units[v].full, Full::Absent)
                && self.units[v].phase != Phase::Backward
                && self.alive_on_every_rank() < self.config.limit_gathered
            {
                self.start_gather(v)?;
            }
        }
        Ok(())
    }

    /// The unit after `u` in `order` (or in `default` before the first
    /// step has taught one).
    fn next_in(order: &[usize], u: usize, default: Option<usize>, learned: bool) -> Option<usize> {
        if !learned {
            return default;
        }
        let i = order.iter().position(|&x| x == u)?;
        order.get(i + 1).copied()
    }

    /// Before unit `u`'s forward: gather its parameters (unless prefetched)
    /// and prefetch the next unit's. `InvalidArgument` if `u` is already in
    /// use (gathered twice without `post_forward`/`post_backward`).
    pub fn pre_forward(&mut self, u: usize) -> Result<()> {
        self.check_unit(u)?;
        match self.units[u].phase {
            Phase::Forward | Phase::Backward => {
                return Err(self.fault(u, Fault::GatheredTwice, "in pre_forward"))
            }
            Phase::Idle | Phase::AfterForward => {}
        }
        if !self.learned && !self.forward_order.contains(&u) {
            self.forward_order.push(u);
        }
        self.ensure_gathered(u)?;
        self.units[u].phase = Phase::Forward;
        let default = (u + 1 < self.units.len()).then_some(u + 1);
        let next = Self::next_in(&self.forward_order, u, default, self.learned);
        self.prefetch(next)
    }

    /// Unit `u`'s whole flat parameter (`unit_len(u)` elements), in
    /// `param_dtype`'s values; waits for its gather. Only between
    /// `pre_forward` and `post_forward`, or `pre_backward` and
    /// `post_backward`.
    pub fn params(&mut self, u: usize) -> Result<&[f32]> {
        self.check_unit(u)?;
        if !matches!(self.units[u].phase, Phase::Forward | Phase::Backward) {
            return Err(self.fault(u, Fault::ParamsOutside, ""));
        }
        self.wait_full(u)?;
        match &self.units[u].full {
            Full::Ready(v) => Ok(&v[..self.units[u].layout.numel]),
            _ => Err(self.err(u, "parameters not gathered (internal)")),
        }
    }

    fn wait_full(&mut self, u: usize) -> Result<()> {
        match std::mem::replace(&mut self.units[u].full, Full::Absent) {
            Full::Pending(p) => {
                let len = self.units[u].layout.shard * self.shard_ranks;
                // A 16-bit gather's f32 copy is one buffer more while both
                // exist (p is no longer counted as alive here): the pool
                // makes what room it can, and the moment counts in the
                // peaks.
                self.pool.spare = self.room(2);
                if !matches!(p, Pending::F32(_)) {
                    self.pool.trim(self.pool.spare);
                    self.note_transient(2, p.bytes(len) + 4 * len);
                }
                self.units[u].full = Full::Ready(p.into_f32(&mut self.pool, len)?);
                self.note();
            }
            other => self.units[u].full = other,
        }
        Ok(())
    }

    /// Free unit `u`'s gathered copy, where the strategy gathers per use.
    fn free_full(&mut self, u: usize) -> Result<()> {
        if !self.keeps_whole() {
            self.release(u)?;
        }
        Ok(())
    }

    /// Drop unit `u`'s whole copy, whatever the strategy, its buffer to
    /// the pool (a gather still in flight ends first).
    fn release(&mut self, u: usize) -> Result<()> {
        self.wait_full(u)?;
        if let Full::Ready(v) = std::mem::replace(&mut self.units[u].full, Full::Absent) {
            self.pool.give(v);
            self.note();
        }
        Ok(())
    }

    /// After unit `u`'s forward: free its gathered parameters
    /// (`reshard_after_forward`) or keep them for backward. The unit
    /// backward begins with (the last of forward in the first step, then
    /// the first of the learned backward order) is always kept.
    pub fn post_forward(&mut self, u: usize) -> Result<()> {
        self.check_unit(u)?;
        if self.units[u].phase != Phase::Forward {
            return Err(self.fault(u, Fault::PostForwardWithout, ""));
        }
        // The unit backward starts with is kept: freeing it would only
        // gather it again at once (PyTorch keeps its root unit the same way).
        let first_backward = if self.learned {
            self.backward_order.first().copied()
        } else {
            self.units.len().checked_sub(1)
        };
        if self.config.reshard_after_forward && first_backward != Some(u) {
            self.free_full(u)?;
        }
        self.units[u].phase = Phase::AfterForward;
        Ok(())
    }

    /// Before unit `u`'s backward: gather its parameters again (unless
    /// kept or prefetched) and prefetch the next unit of backward's order
    /// (learned in the first step; reverse unit order before that).
    pub fn pre_backward(&mut self, u: usize) -> Result<()> {
        self.check_unit(u)?;
        match self.units[u].phase {
            Phase::Forward | Phase::Backward => {
                return Err(self.fault(u, Fault::GatheredTwice, "in pre_backward"))
            }
            Phase::Idle | Phase::AfterForward => {}
        }
        if !self.learned && !self.backward_order.contains(&u) {
            self.backward_order.push(u);
        }
        self.ensure_gathered(u)?;
        self.units[u].phase = Phase::Backward;
        let default = u.checked_sub(1);
        let next = Self::next_in(&self.backward_order, u, default, self.learned);
        self.prefetch(next)
    }

    /// Unit `u`'s gradient (`unit_len(u)` elements, of this rank's local
    /// loss) is ready: start its reduction (reduce-scatter into the
    /// gradient shards, averaged over every rank), free its gathered
    /// parameters. With synchronisation off (`set_sync(false)`) the
    /// gradient is only accumulated here. `InvalidArgument` if `u` was not
    /// gathered for backward.
    pub fn post_backward(&mut self, u: usize, grad: &[f32]) -> Result<()> {
        self.check_unit(u)?;
        if self.units[u].phase != Phase::Backward {
            return Err(self.fault(u, Fault::NotGatheredForBackward, ""));
        }
        let numel = self.units[u].layout.numel;
        let mut wrong = None;
        let zeros;
        let grad = if grad.len() == numel {
            grad
        } else {
            // Still reduce (zeros), so that every rank's collectives stay
            // the same; the step fails everywhere at finish_backward.
            let detail = format!("{} elements where the unit has {numel}", grad.len());
            wrong = Some(self.fault(u, Fault::WrongLength, &detail));
            zeros = vec![0f32; numel];
            &zeros[..]
        };
        self.free_full(u)?;
        self.units[u].phase = Phase::Idle;
        if !self.sync {
            let acc = self.units[u].acc.get_or_insert_with(|| vec![0f32; numel]);
            for (a, g) in acc.iter_mut().zip(grad) {
                *a += g;
            }
            return wrong.map_or(Ok(()), Err);
        }
        let acc = self.units[u].acc.take();
        // 16-bit sums divide by the rank count first, so that a sum over
        // many ranks cannot overflow (f16 ends at 65504); f32 after.
        let pre = self.pre_scale();
        let total = |i: usize| (grad[i] + acc.as_ref().map_or(0.0, |a| a[i])) * pre;
        let s = self.units[u].layout.shard;
        let n = self.shard_ranks;
        /// A pooled buffer of the padded unit: the gradient, then zeros.
        fn flat<T: Pooled>(
            pool: &mut Pool,
            len: usize,
            numel: usize,
            total: impl Fn(usize) -> f32,
        ) -> Vec<T> {
            let mut buf = pool.take::<T>(len);
            for (i, d) in buf[..numel].iter_mut().enumerate() {
                *d = T::from_f64(f64::from(total(i)));
            }
            buf[numel..].fill(T::from_f64(0.0));
            buf
        }
        /// Reduce-scatter over the shard's ranks, or (not sharded) an
        /// allreduce over every rank; a sum either way.
        fn reduce<T: Pooled>(
            shard_comm: Option<&Communicator>,
            comm: &Communicator,
            buf: Vec<T>,
        ) -> Result<Work<Vec<T>>> {
            match shard_comm {
                Some(c) => c.reduce_scatter_async(buf, ReduceOp::Sum),
                None => comm.all_reduce_async(buf, ReduceOp::Sum),
            }
        }
        let len = s * n;
        self.make_room(1)?;
        let by = shard_comm(self.config.strategy, self.comm, self.intra.as_ref());
        let pool = &mut self.pool;
        let work = match self.config.reduce_dtype {
            Precision::F32 => Pending::F32(reduce(by, self.comm, flat(pool, len, numel, total))?),
            Precision::F16 => Pending::F16(reduce(by, self.comm, flat(pool, len, numel, total))?),
            Precision::Bf16 => Pending::Bf16(reduce(by, self.comm, flat(pool, len, numel, total))?),
        };
        self.reducing.push(Reducing { unit: u, work });
        self.unforced += 1;
        // Fold in the reductions that are done (make_room waited for the
        // ones the limit had no room for).
        self.retire(self.reducing.len())?;
        self.note();
        wrong.map_or(Ok(()), Err)
    }

    /// Wait for every gradient reduction of this step and add the averages
    /// into the gradient shards (under `HybridShard`, after an allreduce of
    /// each shard across the groups). A unit without a gradient this step
    /// keeps a zero one. A collective (one small allreduce besides the
    /// reductions): if any rank misused the protocol in this step (a unit
    /// gathered twice, a gradient of the wrong length, ...), every rank
    /// gets `InvalidArgument` naming that rank and unit, and the step's
    /// gradients are dropped everywhere.
    pub fn finish_backward(&mut self) -> Result<()> {
        // Every rank learns every rank's first misuse of this step (one
        // small allreduce, issued after the reductions).
        let size = self.comm.size();
        let mut status = vec![0u64; size];
        status[self.rank] = self.fault.take().map_or(0, |(u, f)| f.encode(u));
        let told = self.comm.all_reduce_in_place(&mut status, ReduceOp::Sum);
        let summed = self.sum_reductions();
        told?;
        if let Some((r, (fault, u))) = status
            .iter()
            .enumerate()
            .find_map(|(r, &v)| Fault::decode(v).map(|f| (r, f)))
        {
            // The step is void on every rank: no gradient of it is kept,
            // and the next step starts with every unit idle.
            for x in 0..self.units.len() {
                self.free_full(x)?;
                let unit = &mut self.units[x];
                unit.grad.iter_mut().for_each(|g| *g = 0.0);
                unit.acc = None;
                unit.phase = Phase::Idle;
            }
            let name = self.units.get(u).map_or("?", |x| x.spec.name.as_str());
            return Err(Error::InvalidArgument(format!(
                "fsdp: rank {r} misused unit `{name}` (#{u}) in this step: {} \
                 (seen on rank {}; the step's gradients are dropped on every rank)",
                fault.what(),
                self.rank
            )));
        }
        summed
    }

    /// Wait for the step's reductions and add them into the gradient shards.
    fn sum_reductions(&mut self) -> Result<()> {
        self.retire(0)?;
        self.unforced = 0;
        for (unit, work) in std::mem::take(&mut self.across) {
            let part = work.wait()?;
            self.fold(unit, part);
        }
        self.note();
        if !self.learned && self.sync {
            self.learned = true;
        }
        Ok(())
    }

    /// Fold finished reductions, oldest first, into the gradient shards
    /// (under `HybridShard`, start their allreduce across the groups
    /// instead), waiting while more than `keep` are in flight.
    fn retire(&mut self, keep: usize) -> Result<()> {
        while let Some(front) = self.reducing.first() {
            if self.reducing.len() <= keep && !front.work.is_complete() {
                break;
            }
            let Reducing { unit, work } = self.reducing.remove(0);
            // This rank's block (the whole buffer, not sharded, is block 0).
            let mine = self.shard_range(unit);
            match &self.inter {
                // Sum the group's shard over the replicas, in f32: the
                // block is copied out (a shard, counted as reducing until
                // it is folded in) while the whole buffer still exists.
                Some(_) => {
                    self.pool.spare = self.room(1);
                    let whole = self.units[unit].layout.shard * self.shard_ranks;
                    self.pool.trim(self.pool.spare);
                    self.note_transient(1, work.bytes(whole) + 4 * mine.len());
                    let part = work.block(&mut self.pool, mine)?;
                    if let Some(inter) = &self.inter {
                        let sum = inter.all_reduce_async(part, ReduceOp::Sum)?;
                        self.across.push((unit, sum));
                    }
                }
                None => {
                    let scale = self.fold_scale();
                    let grad = &mut self.units[unit].grad;
                    work.add_block(&mut self.pool, mine, grad, scale)?;
                }
            }
        }
        Ok(())
    }

    /// Add a reduced sum of this rank's shard of `unit` into its gradient
    /// shard as an average, and pool the buffer.
    fn fold(&mut self, unit: usize, part: Vec<f32>) {
        let scale = self.fold_scale();
        for (g, v) in self.units[unit].grad.iter_mut().zip(&part) {
            *g += v * scale;
        }
        self.pool.give(part);
    }

    /// What a reduced sum is multiplied by to give the average.
    fn fold_scale(&self) -> f32 {
        1.0 / (self.world as f32 * self.pre_scale())
    }

    /// Turn gradient synchronisation off (`false`, PyTorch's `no_sync`) or
    /// back on: while off, `post_backward` only accumulates each unit's
    /// whole gradient on this rank (memory of the unit's size), and the
    /// next synchronised `post_backward` of the unit reduces the sum.
    pub fn set_sync(&mut self, sync: bool) {
        self.sync = sync;
    }

    /// Scale every gradient shard so that the norm of the whole model's
    /// gradient (over all units, all ranks' shards) is at most `max_norm`,
    /// and return the norm before scaling (`clip_grad_norm_`). A
    /// collective: every rank calls it after `finish_backward`.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> Result<f64> {
        if !self.reducing.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "fsdp on rank {}: clip_grad_norm before finish_backward",
                self.rank
            )));
        }
        let local: f64 = self
            .units
            .iter()
            .flat_map(|x| x.grad.iter())
            .map(|&g| f64::from(g) * f64::from(g))
            .sum();
        let mut total = [local];
        if let Some(comm) = self.shard_comm() {
            comm.all_reduce_in_place(&mut total, ReduceOp::Sum)?;
        }
        let norm = total[0].sqrt();
        if norm > max_norm && norm > 0.0 {
            let c = (max_norm / (norm + 1e-6)) as f32;
            for g in self.units.iter_mut().flat_map(|x| x.grad.iter_mut()) {
                *g *= c;
            }
        }
        Ok(norm)
    }

    /// Update every shard from its gradient shard with `optimizer` (its
    /// state is sharded the same way), then zero the gradients. Under
    /// `ShardGradOp` the updated shards are then gathered into the whole
    /// copies (issued here, waited for at the next use).
    pub fn step(&mut self, optimizer: &Optimizer) -> Result<()> {
        if !self.reducing.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "fsdp on rank {}: step with gradient reductions in flight (call finish_backward)",
                self.rank
            )));
        }
        if let Some(u) = self
            .units
            .iter()
            .position(|x| x.phase != Phase::Idle && x.phase != Phase::AfterForward)
        {
            return Err(self.err(u, "step while the unit is still gathered for use"));
        }
        // Gathered copies (a prefetch that was never used, a unit kept
        // from a forward without backward) hold the old values: drop them.
        for u in 0..self.units.len() {
            self.free_full(u)?;
        }
        self.steps += 1;
        self.optimizer_steps += 1;
        let per = optimizer.state_per_element();
        for unit in &mut self.units {
            if unit.state.len() != per * unit.shard.len() {
                unit.state = vec![0f32; per * unit.shard.len()];
            }
            optimizer.update(
                &mut unit.shard,
                &unit.grad,
                &mut unit.state,
                self.optimizer_steps,
            );
            unit.grad.iter_mut().for_each(|g| *g = 0.0);
            unit.phase = Phase::Idle;
        }
        self.refresh_whole()
    }

    /// Under `ShardGradOp` and `NoShard`, bring the whole copies up to the
    /// shards; nothing otherwise.
    fn refresh_whole(&mut self) -> Result<()> {
        if self.keeps_whole() {
            for u in 0..self.units.len() {
                // The old whole copy's buffer serves the new gather.
                self.release(u)?;
                self.start_gather(u)?;
            }
        }
        Ok(())
    }

    /// Bytes this rank holds for the model now.
    pub fn memory(&self) -> Memory {
        let mut m = Memory {
            peak_gathered: self.peak_gathered,
            peak_gathered_units: self.peak_gathered_units,
            peak_working: self.peak_working,
            peak_working_buffers: self.peak_working_buffers,
            ..Memory::default()
        };
        let keeps = self.keeps_whole();
        for unit in &self.units {
            m.params += 4 * unit.shard.len();
            m.grads += 4 * unit.grad.len();
            m.optim += 4 * unit.state.len();
            m.accumulated += unit.acc.as_ref().map_or(0, |a| 4 * a.len());
            let full = match &unit.full {
                Full::Absent => 0,
                Full::Pending(p) => p.bytes(unit.layout.shard * self.shard_ranks),
                Full::Ready(v) => 4 * v.len(),
            };
            if keeps {
                m.params += full;
            } else {
                m.gathered += full;
            }
        }
        m.pooled = self.pool.bytes();
        for r in &self.reducing {
            let l = self.units[r.unit].layout;
            m.reducing += r.work.bytes(l.shard * self.shard_ranks);
        }
        // HybridShard: reduced shards being summed across the groups.
        for (unit, _) in &self.across {
            m.reducing += 4 * self.units[*unit].layout.shard;
        }
        m.peak_gathered = m.peak_gathered.max(m.gathered);
        m.peak_working = m.peak_working.max(m.gathered + m.reducing + m.pooled);
        m
    }

    /// Gather every unit's whole flat parameter on `root` (for a
    /// checkpoint): `Some` there, `None` elsewhere. A collective.
    pub fn full_state(&self, root: usize) -> Result<Option<Vec<Vec<f32>>>> {
        let mut out = Vec::new();
        for unit in &self.units {
            let whole = match self.shard_comm() {
                Some(comm) => {
                    let mut all = vec![0f32; unit.layout.shard * self.shard_ranks];
                    comm.all_gather(&unit.shard, &mut all)?;
                    all.truncate(unit.layout.numel);
                    all
                }
                None => unit.shard[..unit.layout.numel].to_vec(),
            };
            out.push(whole);
        }
        Ok((self.rank == root).then_some(out))
    }

    /// Load whole flat parameters held by `root` (from `full_state`, of
    /// any earlier rank count or strategy): each rank keeps its shard.
    /// Optimizer state starts afresh. A collective; `full` is read on
    /// `root` only, and a wrong one there is `InvalidArgument` on every
    /// rank before anything is loaded.
    pub fn load_full_state(&mut self, root: usize, full: Option<&[Vec<f32>]>) -> Result<()> {
        if !self.reducing.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "fsdp on rank {}: load_full_state with gradient reductions in flight",
                self.rank
            )));
        }
        // Root checks every unit first and says which one is wrong, if any
        // (0: none), so that every rank fails alike.
        let mut verdict = [0u64];
        if self.rank == root {
            let f = full.unwrap_or(&[]);
            if let Some(u) = (0..self.units.len())
                .find(|&u| f.get(u).map(Vec::len) != Some(self.units[u].layout.numel))
            {
                verdict[0] = u as u64 + 1;
            } else if f.len() != self.units.len() {
                verdict[0] = u64::MAX;
            }
        }
        self.comm.broadcast(&mut verdict, root)?;
        if verdict[0] == u64::MAX {
            return Err(Error::InvalidArgument(format!(
                "fsdp on rank {}: load_full_state: rank {root} holds more flat parameters \
                 than the {} units",
                self.rank,
                self.units.len()
            )));
        }
        if verdict[0] > 0 {
            let u = (verdict[0] - 1) as usize;
            let numel = self.units[u].layout.numel;
            return Err(self.err(
                u,
                &format!(
                    "load_full_state: rank {root} has no flat parameter of {numel} elements for it"
                ),
            ));
        }
        for u in 0..self.units.len() {
            let numel = self.units[u].layout.numel;
            let mut whole = match full {
                Some(f) if self.rank == root => f[u].clone(),
                _ => vec![0f32; numel],
            };
            self.comm.broadcast(&mut whole, root)?;
            self.release(u)?;
            let unit = &mut self.units[u];
            let mine = unit.layout.own(self.shard_rank);
            unit.shard.iter_mut().for_each(|v| *v = 0.0);
            unit.shard[..mine.len()].copy_from_slice(&whole[mine]);
            unit.state.clear();
            unit.grad.iter_mut().for_each(|g| *g = 0.0);
            unit.acc = None;
            unit.phase = Phase::Idle;
        }
        self.optimizer_steps = 0;
        self.refresh_whole()
    }
}
