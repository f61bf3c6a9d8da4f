//! Sharded data-parallel (FSDP) training of a multi-layer perceptron with a
//! hand-written forward and backward: each linear layer (weight and bias)
//! is one unit of `ferroccl::fsdp::Fsdp`, so every rank keeps only its
//! shard of each layer and gathers a layer's whole parameters just while
//! that layer runs.
//!
//! ```sh
//! cargo build --release -p ferroccl-run -p ferroccl --bin ferroccl-run --example mlp_fsdp
//! target/release/ferroccl-run -n 2 -- target/release/examples/mlp_fsdp --steps 20
//! target/release/ferroccl-run -n 4 -- target/release/examples/mlp_fsdp --strategy hybrid:2 --precision bf16 --optimizer adam --lr 0.001
//! ```
//!
//! Flags (defaults in brackets): `--steps` [20], `--batch` [16] global
//! batch, split evenly over the ranks, `--in` [64], `--hidden` [256],
//! `--layers` [3] linear layers, `--out` [8], `--lr` [0.05],
//! `--strategy` full | grad-op | none | hybrid:G [full], `--precision`
//! f32 | bf16 | f16 [f32] (the type parameters are gathered in and
//! gradients reduced in), `--optimizer` sgd | adam [sgd], `--limit` [3]
//! units gathered at once, `--keep-after-forward` (keep each layer's
//! gathered parameters from forward to backward instead of gathering them
//! again), `--clip` MAX (clip the gradient norm) [off], `--accumulate` K
//! (K-1 micro-steps without synchronisation before each synchronised one)
//! [1].
//!
//! The initial weights depend only on each element's place in the model,
//! not on the rank count or the strategy, so every strategy on any number
//! of ranks trains the same model. Rank 0 prints the loss of every step
//! (averaged over the ranks), then one line per rank of `Fsdp::memory()`,
//! then a summary line of `key=value` pairs ending with a checksum of the
//! final weights (gathered with `full_state`).
//!
//! `--mode compare` (what `bench/fsdp-bench.sh` runs) trains several
//! variants of the same model in one job against the DDP layer, taking
//! turns step by step on the same data, each with its own model and
//! optimizer state, each step timed from a barrier (`--warmup` [2] steps
//! not timed). `--variants` (`;`-separated) [all but `full-limit1`]:
//! `none` (each rank trains the whole model alone on its rows: compute
//! only), `ddp` (the whole model, `ddp::Reducer` with its default config,
//! each layer's gradient handed over during backward), `ddp-after` (the
//! same reducer, every gradient handed over after backward), `full`
//! (FullShard, limit 3), `full-limit1` (limit 1: no prefetch),
//! `full-serial` (limit 1, and every reduction waited for as soon as it is
//! issued: all communication exposed), `full-keep`
//! (`reshard_after_forward: false`), `grad-op`, `no-shard`. `--precision`
//! and `--optimizer` apply to every variant. Rank 0 prints a table of step
//! times (median and min over the timed steps, the communication time as
//! median minus `none`'s, and the share of it hidden: (serial − variant) /
//! (serial − none), with `ddp-after` the serial twin of `ddp` and
//! `full-serial` that of `full`), a table of memory per rank (the most
//! over the ranks; FSDP from `Fsdp::memory()`, sampled after every
//! `post_backward`; DDP counted the same way: whole f32 parameters, the
//! reducer's gradient buckets, optimizer state), and the same as `csv,`
//! lines.
//!
//! This file holds the model, its arguments and the training run;
//! `compare.rs` the `--mode compare` variants against the DDP layer;
//! `../common/mlp.rs` the MLP's math and data, shared with `mlp_ddp`.

mod compare;
#[path = "../common/mlp.rs"]
mod mlp;

use compare::{parse_variants, VariantSpec, DEFAULT_VARIANTS};
use ferroccl::ddp::{ParamSpec, Reducer, ReducerConfig};
use ferroccl::fsdp::{
    Fsdp, FsdpConfig, Memory, Optimizer, Precision, Strategy, TensorSpec, UnitSpec,
};
use ferroccl::{Communicator, ReduceOp};
use mlp::{batch, forward, input_grad, mse, relu_back, Dims, Flags, Rng};

struct Args {
    steps: usize,
    batch: usize,
    d_in: usize,
    hidden: usize,
    layers: usize,
    d_out: usize,
    lr: f32,
    strategy: Strategy,
    precision: Precision,
    adam: bool,
    limit: usize,
    keep_after_forward: bool,
    clip: Option<f64>,
    accumulate: usize,
    /// `--mode compare`: the variants, taking turns step by step.
    compare: Option<Vec<VariantSpec>>,
    warmup: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        steps: 20,
        batch: 16,
        d_in: 64,
        hidden: 256,
        layers: 3,
        d_out: 8,
        lr: 0.05,
        strategy: Strategy::FullShard,
        precision: Precision::F32,
        adam: false,
        limit: 3,
        keep_after_forward: false,
        clip: None,
        accumulate: 1,
        compare: None,
        warmup: 2,
    };
    let mut variants = parse_variants(DEFAULT_VARIANTS)?;
    let mut flags = Flags::from_env();
    while let Some(flag) = flags.flag() {
        let f = flag.as_str();
        match f {
            "--steps" => a.steps = flags.num(f)? as usize,
            "--batch" => a.batch = flags.num(f)? as usize,
            "--in" => a.d_in = flags.num(f)? as usize,
            "--hidden" => a.hidden = flags.num(f)? as usize,
            "--layers" => a.layers = flags.num(f)? as usize,
            "--out" => a.d_out = flags.num(f)? as usize,
            "--lr" => a.lr = flags.num(f)? as f32,
            "--limit" => a.limit = flags.num(f)? as usize,
            "--keep-after-forward" => a.keep_after_forward = true,
            "--clip" => a.clip = Some(flags.num(f)?),
            "--accumulate" => a.accumulate = (flags.num(f)? as usize).max(1),
            "--warmup" => a.warmup = flags.num(f)? as usize,
            "--variants" => variants = parse_variants(&flags.value(f)?)?,
            "--mode" => {
                a.compare = match flags.value(f)?.as_str() {
                    "train" => None,
                    "compare" => Some(Vec::new()),
                    other => return Err(format!("unknown mode {other}")),
                }
            }
            "--strategy" => {
                let v = flags.value(f)?;
                a.strategy = match v.as_str() {
                    "full" => Strategy::FullShard,
                    "grad-op" => Strategy::ShardGradOp,
                    "none" => Strategy::NoShard,
                    _ => match v.strip_prefix("hybrid:").map(str::parse::<usize>) {
                        Some(Ok(group)) => Strategy::HybridShard { group },
                        _ => return Err(format!("unknown strategy {v}")),
                    },
                }
            }
            "--precision" => {
                a.precision = match flags.value(f)?.as_str() {
                    "f32" => Precision::F32,
                    "bf16" => Precision::Bf16,
                    "f16" => Precision::F16,
                    other => return Err(format!("unknown precision {other}")),
                }
            }
            "--optimizer" => {
                a.adam = match flags.value(f)?.as_str() {
                    "sgd" => false,
                    "adam" => true,
                    other => return Err(format!("unknown optimizer {other}")),
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.layers == 0 || a.batch == 0 {
        return Err("--layers and --batch must be positive".into());
    }
    if let Some(c) = a.compare.as_mut() {
        *c = variants;
        if a.accumulate != 1 || a.clip.is_some() {
            return Err("--mode compare takes neither --accumulate nor --clip".into());
        }
    }
    Ok(a)
}

/// The strategy as `--strategy` spells it.
fn strategy_name(s: Strategy) -> String {
    match s {
        Strategy::FullShard => "full".into(),
        Strategy::ShardGradOp => "grad-op".into(),
        Strategy::NoShard => "none".into(),
        Strategy::HybridShard { group } => format!("hybrid:{group}"),
    }
}

/// The gradient of the layer's flat parameter (dW, then db) from the
/// gradient `dy` of its output and its input `x`.
fn param_grad(d: Dims, x: &[f32], dy: &[f32], rows: usize) -> Vec<f32> {
    let mut g = vec![0f32; d.weights() + d.d_out];
    let (gw, gb) = g.split_at_mut(d.weights());
    mlp::param_grad(d, x, dy, rows, gw, gb);
    g
}

/// The initial value of element `i` of layer `l`'s flat parameter: weights
/// uniform in ±sqrt(3 / d_in), biases zero. A function of (l, i) alone, so
/// that any rank can fill any shard.
fn initial(l: usize, d: Dims, i: usize) -> f32 {
    if i >= d.weights() {
        return 0.0;
    }
    let mut rng = Rng(0xface ^ ((l as u64) << 40) ^ i as u64);
    rng.uniform() * (3.0 / d.d_in as f32).sqrt()
}

fn main() {
    mlp::main_of("mlp_fsdp", parse_args, run);
}

fn run(args: &Args) -> ferroccl::Result<()> {
    let comm = Communicator::from_env()?;
    let (rank, size) = (comm.rank(), comm.size());
    if !args.batch.is_multiple_of(size) {
        return Err(ferroccl::Error::InvalidArgument(format!(
            "--batch {} is not divisible by {size} ranks",
            args.batch
        )));
    }
    let rows = args.batch / size;

    // One unit per linear layer: its weight and its bias.
    let dims = mlp::layer_dims(args.layers, args.d_in, args.hidden, args.d_out);
    let units: Vec<UnitSpec> = dims
        .iter()
        .enumerate()
        .map(|(l, d)| {
            UnitSpec::new(
                format!("fc{l}"),
                vec![
                    TensorSpec::new("weight", &[d.d_out, d.d_in]),
                    TensorSpec::new("bias", &[d.d_out]),
                ],
            )
        })
        .collect();
    if let Some(variants) = &args.compare {
        return compare::compare(&comm, args, variants, &dims, &units);
    }
    let config = FsdpConfig {
        strategy: args.strategy,
        param_dtype: args.precision,
        reduce_dtype: args.precision,
        reshard_after_forward: !args.keep_after_forward,
        limit_gathered: args.limit,
    };
    // Each rank fills only its own shard of each unit.
    let mut fsdp = Fsdp::new(&comm, units, config, |l, start, shard| {
        for (i, v) in shard.iter_mut().enumerate() {
            *v = initial(l, dims[l], start + i);
        }
    })?;
    let optimizer = if args.adam {
        Optimizer::adam(args.lr)
    } else {
        Optimizer::Sgd { lr: args.lr }
    };

    let mut losses = Vec::new();
    for step in 0..args.steps {
        let mut loss = 0f64;
        for micro in 0..args.accumulate {
            // Only the last micro-step reduces (the sum of all of them).
            fsdp.set_sync(micro + 1 == args.accumulate);
            let first = (step * args.accumulate + micro) * args.batch + rank * rows;
            let (x, t) = batch(first, rows, args.d_in, args.d_out);
            loss += train_micro_step(
                &mut fsdp,
                &dims,
                x,
                &t,
                rows,
                args.accumulate,
                false,
                &mut Peak::default(),
            )?;
        }
        fsdp.finish_backward()?; // the gradient shards are now averaged over ranks
        let norm = match args.clip {
            Some(max) => Some(fsdp.clip_grad_norm(max)?),
            None => None,
        };
        fsdp.step(&optimizer)?;

        // The mean loss over the ranks (every rank's share is equal).
        let mut mean = [loss];
        comm.all_reduce_in_place(&mut mean, ReduceOp::Avg)?;
        losses.push(mean[0]);
        if rank == 0 {
            match norm {
                Some(n) => println!("step {step} loss {:.6} grad_norm {n:.6}", mean[0]),
                None => println!("step {step} loss {:.6}", mean[0]),
            }
        }
    }

    // What each rank holds, gathered on rank 0.
    let m = fsdp.memory();
    let mine = [
        m.params,
        m.grads,
        m.optim,
        m.gathered,
        m.peak_gathered,
        m.peak_gathered_units,
        m.accumulated,
        m.reducing,
        m.pooled,
        m.peak_working,
        m.peak_working_buffers,
    ]
    .map(|v| v as u64);
    let mut all = vec![0u64; mine.len() * size];
    comm.all_gather(&mine, &mut all)?;

    // The whole model on rank 0 (a checkpoint would save this), and a
    // checksum of it: every weight times 1..7 by its place.
    let full = fsdp.full_state(0)?;
    let Some(full) = full else {
        return Ok(());
    };
    for (r, v) in all.chunks(mine.len()).enumerate() {
        let m = Memory {
            params: v[0] as usize,
            grads: v[1] as usize,
            optim: v[2] as usize,
            gathered: v[3] as usize,
            peak_gathered: v[4] as usize,
            peak_gathered_units: v[5] as usize,
            accumulated: v[6] as usize,
            reducing: v[7] as usize,
            pooled: v[8] as usize,
            peak_working: v[9] as usize,
            peak_working_buffers: v[10] as usize,
        };
        println!(
            "memory rank={r} params={} grads={} optim={} gathered={} peak_gathered={} \
             peak_gathered_units={} accumulated={} pooled={} peak_working={} \
             peak_working_buffers={} total={}",
            m.params,
            m.grads,
            m.optim,
            m.gathered,
            m.peak_gathered,
            m.peak_gathered_units,
            m.accumulated,
            m.pooled,
            m.peak_working,
            m.peak_working_buffers,
            m.total()
        );
    }
    let checksum = mlp::checksum(full.iter().flatten());
    let model_bytes: usize = full.iter().map(|u| 4 * u.len()).sum();
    println!(
        "strategy={} precision={:?} ranks={size} units={} model_bytes={model_bytes} \
         steps={} loss_first={:.6} loss={:.6} checksum={checksum:.6}",
        strategy_name(args.strategy),
        args.precision,
        fsdp.num_units(),
        args.steps,
        losses.first().copied().unwrap_or(f64::NAN),
        losses.last().copied().unwrap_or(f64::NAN),
    );
    Ok(())
}

/// Forward and backward of one micro-step on this rank's rows, unit by unit
/// through `fsdp`; returns the rank's loss (mean squared error, divided by
/// the micro-steps so that their sum is the step's mean). `serial` waits
/// for each gradient's reduction as soon as it is issued (`finish_backward`
/// after every `post_backward`), so that none overlaps the backward of the
/// units before it (the compare mode's baseline with all communication
/// exposed).
#[allow(clippy::too_many_arguments)]
fn train_micro_step(
    fsdp: &mut Fsdp<'_>,
    dims: &[Dims],
    x: Vec<f32>,
    t: &[f32],
    rows: usize,
    micro_steps: usize,
    serial: bool,
    peak: &mut Peak,
) -> ferroccl::Result<f64> {
    let last = dims.len() - 1;

    // Forward, first layer first, keeping each layer's input for backward.
    // pre_forward gathers the unit (or finds it prefetched) and prefetches
    // the next; post_forward frees it again.
    let mut inputs = vec![x];
    for (l, &d) in dims.iter().enumerate() {
        fsdp.pre_forward(l)?;
        let (w, b) = fsdp.params(l)?.split_at(d.weights());
        let mut y = forward(d, w, b, &inputs[l], rows);
        fsdp.post_forward(l)?;
        if l < last {
            mlp::relu(&mut y);
        }
        inputs.push(y);
    }
    let out = inputs.pop().expect("the output");
    let (loss, mut dy) = mse(&out, t, (rows * dims[last].d_out * micro_steps) as f32);

    // Backward, last layer first. pre_backward gathers the unit again;
    // post_backward starts the reduction of its gradient and frees it.
    for l in (0..dims.len()).rev() {
        let d = dims[l];
        fsdp.pre_backward(l)?;
        let grad = param_grad(d, &inputs[l], &dy, rows);
        if l > 0 {
            // Through the ReLU of the layer below.
            let dx = input_grad(d, &fsdp.params(l)?[..d.weights()], &dy, rows);
            dy = relu_back(dx, &inputs[l]);
        }
        fsdp.post_backward(l, &grad)?;
        // Reduction buffers are alive from here to finish_backward.
        peak.note(&fsdp.memory());
        if serial {
            fsdp.finish_backward()?;
        }
    }
    Ok(loss)
}

/// The most seen of what `Fsdp::memory()` reports mid-step: sampled after
/// every `post_backward`, when the unit's reduction buffer has just been
/// added and gathered parameters (a prefetch) may still be alive.
#[derive(Default, Clone, Copy)]
struct Peak {
    reducing: usize,
    total: usize,
}

impl Peak {
    fn note(&mut self, m: &Memory) {
        self.reducing = self.reducing.max(m.reducing);
        self.total = self.total.max(m.total());
    }
}
