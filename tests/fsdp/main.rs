//! Sharded data parallel (`ferroccl::fsdp`): training with every strategy on
//! 1..5 thread ranks against a single-process f64 reference, the memory a
//! rank holds, 16-bit gathers and reductions step by step and over whole
//! trajectories, checkpoints across rank counts, and the errors.
//!
//! The model is the DDP tests' MLP (`tests/ddp/model.rs`, its six
//! parameters W1 b1 W2 b2 W3 b3), wrapped as three units of (weight, bias).
//! The global batch of each step is 60 samples, split evenly over the ranks
//! (60 divides by 1..5), each rank's gradient the mean over its own samples:
//! FSDP's average over ranks is then the mean over the whole batch, so the
//! reference does not depend on the rank count.
//!
//! One test binary in several files, as tests/ddp is: this one holds the
//! f64 reference trainer and the harness every section uses; `training`
//! whole trajectories (every strategy, 16-bit types, against the DDP
//! layer), `steps` step by step (16-bit, checkpoints, accumulation,
//! clipping), `errors` misuse, disagreement, prefetch and rebind.

// Units are indexed alike in several tables; ranges read plainer.
#![allow(clippy::needless_range_loop)]

#[allow(dead_code)]
#[path = "../ddp/model.rs"]
mod model;

mod errors;
mod steps;
mod training;

use ferroccl::fsdp::{Fsdp, FsdpConfig, Optimizer, Precision, Strategy, TensorSpec, UnitSpec};
use ferroccl::testing::run_ranks;
use ferroccl::{Communicator, Error};
use model::{D_IN, D_OUT, H, LENS, U_BF16, U_F32};

const BATCH: usize = 60;
const UNITS: usize = 3;

fn units() -> Vec<UnitSpec> {
    let layer = |name: &str, out: usize, inp: usize| {
        UnitSpec::new(
            name,
            vec![
                TensorSpec::new("weight", &[out, inp]),
                TensorSpec::new("bias", &[out]),
            ],
        )
    };
    vec![
        layer("fc1", H, D_IN),
        layer("fc2", H, H),
        layer("fc3", D_OUT, H),
    ]
}

/// The model's initial weights as each unit's flat parameter.
fn init_flat() -> Vec<Vec<f64>> {
    let p = model::init_params(6);
    (0..UNITS)
        .map(|u| [p[2 * u].clone(), p[2 * u + 1].clone()].concat())
        .collect()
}

/// f64 values rounded to f32.
fn narrow(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// Every flat parameter rounded to f32.
fn narrow_all(v: &[Vec<f64>]) -> Vec<Vec<f32>> {
    v.iter().map(|f| narrow(f)).collect()
}

/// Every flat parameter widened to f64.
fn widen(v: &[Vec<f32>]) -> Vec<Vec<f64>> {
    v.iter()
        .map(|f| f.iter().map(|&x| f64::from(x)).collect())
        .collect()
}

/// Samples of `step` that `rank` of `ranks` trains on.
fn samples(step: usize, rank: usize, ranks: usize) -> Vec<usize> {
    let per = BATCH / ranks;
    let start = step * BATCH + rank * per;
    (start..start + per).collect()
}

/// Each unit's flat gradient of the mean loss over `samples` at `flat`.
fn grads(flat: &[Vec<f64>], samples: &[usize]) -> Vec<Vec<f64>> {
    let params: Vec<Vec<f64>> = (0..6)
        .map(|p| {
            let (u, at) = (p / 2, if p % 2 == 0 { 0 } else { LENS[p - 1] });
            flat[u][at..at + LENS[p]].to_vec()
        })
        .collect();
    let mut g = vec![Vec::new(); 6];
    model::backward(
        &params,
        samples,
        samples.len() as f64,
        |_| false,
        |p, v| g[p] = v,
    );
    (0..UNITS)
        .map(|u| [g[2 * u].clone(), g[2 * u + 1].clone()].concat())
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Opt {
    Sgd,
    /// Adam with eps 0.1: its update then moves by at most 2·lr/eps per
    /// unit of gradient error (see `tolerance`), small enough for a sharp
    /// comparison, while m, v and the bias correction all take part.
    Adam,
}

const ADAM_LR: f64 = 0.01;
const ADAM_EPS: f64 = 0.1;
const BETAS: (f64, f64) = (0.9, 0.999);

impl Opt {
    fn optimizer(self) -> Optimizer {
        match self {
            Opt::Sgd => Optimizer::Sgd {
                lr: model::LR as f32,
            },
            Opt::Adam => Optimizer::Adam {
                lr: ADAM_LR as f32,
                beta1: BETAS.0 as f32,
                beta2: BETAS.1 as f32,
                eps: ADAM_EPS as f32,
            },
        }
    }
}

/// Single-process f64 training: the master weights, the optimizer state,
/// and the largest gradient and weight components seen so far (for the
/// tolerance).
struct Reference {
    opt: Opt,
    flat: Vec<Vec<f64>>,
    state: Vec<Vec<(f64, f64)>>,
    steps: usize,
    gmax: f64,
    wmax: f64,
}

impl Reference {
    fn new(opt: Opt) -> Self {
        let flat = init_flat();
        let state = flat.iter().map(|f| vec![(0.0, 0.0); f.len()]).collect();
        let wmax = flat.iter().flatten().fold(0f64, |a, w| a.max(w.abs()));
        Reference {
            opt,
            flat,
            state,
            steps: 0,
            gmax: 0.0,
            wmax,
        }
    }

    /// One step of the whole batch, with its gradients taken at `at`
    /// (each unit's flat parameter).
    fn step_at(&mut self, at: &[Vec<f64>]) {
        let g = grads(at, &samples(self.steps, 0, 1));
        self.steps += 1;
        let t = self.steps as i32;
        for u in 0..UNITS {
            for i in 0..self.flat[u].len() {
                let gi = g[u][i];
                self.gmax = self.gmax.max(gi.abs());
                let w = &mut self.flat[u][i];
                match self.opt {
                    Opt::Sgd => *w -= model::LR * gi,
                    Opt::Adam => {
                        let (m, v) = &mut self.state[u][i];
                        *m = BETAS.0 * *m + (1.0 - BETAS.0) * gi;
                        *v = BETAS.1 * *v + (1.0 - BETAS.1) * gi * gi;
                        let mh = *m / (1.0 - BETAS.0.powi(t));
                        let vh = *v / (1.0 - BETAS.1.powi(t));
                        *w -= ADAM_LR * mh / (vh.sqrt() + ADAM_EPS);
                    }
                }
                self.wmax = self.wmax.max(w.abs());
            }
        }
    }
}

/// One process, f64: `steps` steps on the whole batch. Also the largest
/// gradient and weight components seen, for the tolerance.
fn reference(opt: Opt, steps: usize) -> (Vec<Vec<f64>>, f64, f64) {
    let mut r = Reference::new(opt);
    for _ in 0..steps {
        let at = r.flat.clone();
        r.step_at(&at);
    }
    (r.flat, r.gmax, r.wmax)
}

/// Bound on the final weights' distance from the reference, training in
/// f32 on `ranks` ranks for `steps` steps. Per step and component: the
/// averaged gradient differs from the f64 one by the rounding of each
/// rank's gradient and of the partial sums and the scaling, at most
/// (ranks + 2)·u·G; SGD moves a weight by lr times that, Adam by at most
/// 2·lr/eps times it (|d m̂| and |d √v̂| are each at most the gradient
/// error, and |m̂| ≤ √v̂); the f32 weights round once per step (u·W). The
/// weights' differences feed back into later gradients; over 4 steps the
/// growth stays below 2x at these rates (the DDP tests' argument), and
/// the factor 4 covers it with margin.
fn tolerance(opt: Opt, ranks: usize, steps: usize, gmax: f64, wmax: f64, u: f64) -> f64 {
    let per_grad = match opt {
        Opt::Sgd => model::LR,
        Opt::Adam => 2.0 * ADAM_LR / ADAM_EPS,
    };
    4.0 * steps as f64 * (per_grad * (ranks as f64 + 2.0) * u * gmax + U_F32 * wmax)
}

/// What a rank's training gives: the final whole parameters (from
/// `full_state`, on rank 0) and the parameters every unit computed with
/// in each step (`seen[step][unit]`).
struct Trained {
    full: Option<Vec<Vec<f32>>>,
    seen: Vec<Vec<Vec<f32>>>,
}

/// Train on one rank with FSDP; checks the protocol's invariants every
/// step (parameters seen in backward are the forward's, the memory bound).
fn train(
    comm: &Communicator,
    config: FsdpConfig,
    opt: Opt,
    steps: std::ops::Range<usize>,
    start: Option<&[Vec<f32>]>,
) -> Trained {
    let (rank, ranks) = (comm.rank(), comm.size());
    let init = narrow_all(&init_flat());
    let mut fsdp = Fsdp::from_full(comm, units(), config.clone(), &init).unwrap();
    if let Some(start) = start {
        fsdp.load_full_state(0, (rank == 0).then_some(start))
            .unwrap();
    }
    let optimizer = opt.optimizer();
    let group = match config.strategy {
        Strategy::FullShard | Strategy::ShardGradOp => ranks,
        Strategy::NoShard => 1,
        Strategy::HybridShard { group } => group,
    };
    let mut seen_all = Vec::new();
    for step in steps {
        let mut seen = Vec::new();
        for u in 0..UNITS {
            fsdp.pre_forward(u).unwrap();
            seen.push(fsdp.params(u).unwrap().to_vec());
            fsdp.post_forward(u).unwrap();
        }
        let flat = widen(&seen);
        let g = grads(&flat, &samples(step, rank, ranks));
        for u in (0..UNITS).rev() {
            fsdp.pre_backward(u).unwrap();
            assert_eq!(
                fsdp.params(u).unwrap(),
                &seen[u][..],
                "rank {rank} unit {u}: backward's parameters"
            );
            let gu = narrow(&g[u]);
            fsdp.post_backward(u, &gu).unwrap();
            // Reductions in flight share the limit with gathered units.
            let m = fsdp.memory();
            let largest = units()
                .iter()
                .map(|x| 4 * x.numel().div_ceil(group) * group)
                .max()
                .unwrap();
            let kept = if config.reshard_after_forward { 0 } else { u };
            assert!(
                m.gathered + m.reducing
                    <= (config.limit_gathered + kept) * largest + across(&config),
                "{m:?}"
            );
        }
        fsdp.finish_backward().unwrap();
        assert_eq!(fsdp.memory().reducing, 0);
        fsdp.step(&optimizer).unwrap();
        check_memory(&fsdp, &config, ranks, &optimizer);
        seen_all.push(seen);
    }
    Trained {
        full: fsdp.full_state(0).unwrap(),
        seen: seen_all,
    }
}

/// The bytes a rank holds: exactly its shards of parameters, gradients and
/// optimizer state (whole parameters where the strategy keeps them), and
/// never more gathered units than the limit allows.
fn check_memory(fsdp: &Fsdp<'_>, config: &FsdpConfig, ranks: usize, opt: &Optimizer) {
    let m = fsdp.memory();
    let group = match config.strategy {
        Strategy::FullShard | Strategy::ShardGradOp => ranks,
        Strategy::NoShard => 1,
        Strategy::HybridShard { group } => group,
    };
    let shard: usize = units().iter().map(|u| 4 * u.numel().div_ceil(group)).sum();
    let whole: usize = units().iter().map(|u| 4 * u.numel()).sum();
    // Right after `step`, ShardGradOp's whole copies are being gathered,
    // in buffers padded to a multiple of the ranks.
    let padded: usize = units()
        .iter()
        .map(|u| 4 * u.numel().div_ceil(group) * group)
        .sum();
    // (in param_dtype: 16-bit buffers are half the bytes).
    let kept = match config.strategy {
        Strategy::ShardGradOp if config.param_dtype != Precision::F32 => padded / 2,
        Strategy::ShardGradOp => padded,
        Strategy::NoShard => whole,
        _ => 0,
    };
    assert_eq!(m.params, shard + kept, "{m:?}");
    assert_eq!(m.grads, shard, "{m:?}");
    assert_eq!(m.optim, opt.state_per_element() * shard, "{m:?}");
    // Kept from forward to backward, every unit is gathered at the end of
    // forward; otherwise the limit holds.
    let allowed = if config.reshard_after_forward {
        config.limit_gathered
    } else {
        config.limit_gathered.max(UNITS)
    };
    let allowed = if kept > 0 { 0 } else { allowed };
    assert!(m.peak_gathered_units <= allowed, "{m:?}");
    let largest = units()
        .iter()
        .map(|u| 4 * u.numel().div_ceil(group) * group)
        .max()
        .unwrap();
    assert!(m.peak_gathered <= allowed * largest, "{m:?}");
    // Every buffer of a unit's size (gathered, being reduced, pooled for
    // reuse) is within the limit, besides the units kept from forward.
    let buffers = if config.reshard_after_forward || kept > 0 {
        config.limit_gathered
    } else {
        config.limit_gathered + UNITS
    };
    // A 16-bit gather is converted into its f32 copy while its 16-bit
    // buffer still exists: one buffer (half a unit's bytes) more for that
    // moment.
    let (extra, extra_bytes) = match config.param_dtype {
        Precision::F32 => (0, 0),
        Precision::F16 | Precision::Bf16 => (1, largest / 2),
    };
    assert!(m.peak_working_buffers <= buffers + extra, "{m:?}");
    assert!(
        m.peak_working <= buffers * largest + extra_bytes + across(config),
        "{m:?}"
    );
    assert_eq!(m.accumulated, 0, "{m:?}");
}

/// HybridShard's reduced shards summed across the groups, at most one
/// per unit until `finish_backward`: the gradient shards' size again
/// (zero for the other strategies).
fn across(config: &FsdpConfig) -> usize {
    match config.strategy {
        Strategy::HybridShard { group } => {
            units().iter().map(|u| 4 * u.numel().div_ceil(group)).sum()
        }
        _ => 0,
    }
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f64>]) -> f64 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (f64::from(*x) - y).abs())
        .fold(0.0, f64::max)
}

fn check(ranks: usize, config: FsdpConfig, opt: Opt) {
    let steps = 4;
    let (want, gmax, wmax) = reference(opt, steps);
    // Gradients reduced in a 16-bit type carry its rounding instead of
    // f32's (the gathered parameters stay f32 here; 16-bit gathers are
    // checked step by step below).
    let u = match config.reduce_dtype {
        Precision::F32 => U_F32,
        Precision::F16 => model::U_F16,
        Precision::Bf16 => U_BF16,
    };
    let tol = tolerance(opt, ranks, steps, gmax, wmax, u);
    let moved = max_diff(&narrow_all(&init_flat()), &want);
    assert!(
        moved > 4.0 * tol,
        "training moves the weights by {moved}, tolerance {tol}"
    );
    let got = run_ranks(ranks, |comm| {
        train(&comm, config.clone(), opt, 0..steps, None).full
    });
    let full = got[0].as_ref().expect("rank 0 holds the full state");
    assert!(got[1..].iter().all(Option::is_none));
    let d = max_diff(full, &want);
    assert!(
        d <= tol,
        "{ranks} ranks, {config:?}, {opt:?}: weights differ from the reference by {d} (tolerance {tol})"
    );
}

fn strategies(ranks: usize) -> Vec<Strategy> {
    let mut s = vec![
        Strategy::FullShard,
        Strategy::ShardGradOp,
        Strategy::NoShard,
    ];
    s.extend(
        (1..ranks)
            .filter(|g| ranks.is_multiple_of(*g))
            .map(|group| Strategy::HybridShard { group }),
    );
    s
}

/// Every strategy (hybrid with every group size that divides) on 1..5 ranks.
fn every_strategy(opt: Opt) {
    for ranks in 1..=5 {
        for strategy in strategies(ranks) {
            let config = FsdpConfig {
                strategy,
                ..FsdpConfig::default()
            };
            check(ranks, config, opt);
        }
    }
}
