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
//!
//! The layer is cut where its work is: `spec` what a user describes,
//! `unit` what is kept per unit, `pool` the buffers in flight and kept,
//! `gather` the gathering side of a step (limit, prefetch), `grad` the
//! gradient side (reduction, accumulation, optimizer step); this file
//! holds [`Fsdp`], its construction and the per-unit protocol calls.

mod gather;
mod grad;
mod optim;
mod pool;
mod spec;
mod unit;

pub use optim::Optimizer;
pub use spec::{FsdpConfig, Precision, Strategy, TensorSpec, UnitSpec};

use crate::Work;
use crate::{Communicator, Error, Result};
use pool::Pool;
use unit::{Fault, Full, Layout, Phase, Reducing, Unit};

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

    /// Go on after a failure with the survivors' communicator `survivors`
    /// (from [`Communicator::shrink`]). Under [`Strategy::NoShard`] every
    /// rank holds the whole model: it is re-made over `survivors` from
    /// this rank's parameters (optimizer state starts afresh, as after
    /// [`load_full_state`](Fsdp::load_full_state)). Under every sharded
    /// strategy the failed ranks held the only copy of their shards
    /// (parameters under `FullShard`, optimizer state under `ShardGradOp`;
    /// `HybridShard`'s copies in other groups are not recovered from): an
    /// error names the ranks and the lost elements of each unit, before
    /// anything moves. A collective of `survivors` where it succeeds.
    pub fn rebind<'d>(self, survivors: &'d Communicator) -> Result<Fsdp<'d>>
    where
        'c: 'd,
    {
        let mut lost = self.comm.failed_ranks();
        if lost.is_empty() && survivors.size() < self.world {
            // Left out by the caller: which ones is not known here.
            lost = (survivors.size()..self.world).collect();
        }
        if self.config.strategy != Strategy::NoShard {
            let what = match self.config.strategy {
                Strategy::FullShard => "parameters and optimizer state",
                Strategy::ShardGradOp => "optimizer state",
                _ => "parameters and optimizer state (copies in other groups are not used)",
            };
            let units: Vec<String> = self
                .units
                .iter()
                .map(|u| {
                    let ranges: Vec<String> = lost
                        .iter()
                        .filter(|&&r| r < self.world)
                        .map(|&r| {
                            let at = (r % self.shard_ranks) * u.layout.shard;
                            let end = (at + u.layout.shard).min(u.layout.numel);
                            format!("{}..{}", at.min(end), end)
                        })
                        .collect();
                    format!("'{}' elements {}", u.spec.name, ranges.join(", "))
                })
                .collect();
            return Err(Error::InvalidArgument(format!(
                "fsdp on rank {}: cannot go on without rank(s) {lost:?}: under {:?} they held \
                 the only copy of their shards' {what} ({}); restart the survivors from a \
                 checkpoint (full_state, then load_full_state) or use Strategy::NoShard",
                self.rank,
                self.config.strategy,
                units.join("; ")
            )));
        }
        let full: Vec<Vec<f32>> = self
            .units
            .iter()
            .map(|u| u.shard[..u.layout.numel].to_vec())
            .collect();
        let units: Vec<UnitSpec> = self.units.iter().map(|u| u.spec.clone()).collect();
        Fsdp::from_full(survivors, units, self.config.clone(), &full)
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
