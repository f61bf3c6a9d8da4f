//! Data-parallel training of a multi-layer perceptron with a hand-written
//! backward, so that each layer's gradients reach the reducer the moment
//! they exist and the first buckets are on the wire while the earlier layers
//! are still being differentiated.
//!
//! ```sh
//! cargo build --release -p ferroccl-run -p ferroccl --bin ferroccl-run --example mlp_ddp
//! target/release/ferroccl-run -n 2 -- target/release/examples/mlp_ddp --steps 20
//! ```
//!
//! Flags (defaults in brackets): `--steps` [20], `--warmup` [3] (steps not
//! timed), `--batch` [16] global batch, split evenly over the ranks,
//! `--in` [256], `--hidden` [2048], `--layers` [4] linear layers, `--out`
//! [16], `--lr` [0.01], `--mode` reducer | after-backward | none
//! [reducer], `--bucket-mb` [25], `--first-bucket-mb` [1],
//! `--prefix-chunk-mb` [off], `--hook` allreduce | fp16 | bf16
//! [allreduce], `--no-rebuild`, `--plain-buckets` (buckets in ordinary
//! memory instead of windows), `--accumulate` K (K-1 `no_sync`
//! micro-steps before each synchronised one) [1], `--elastic` (go on
//! after a rank fails; below), `--die-rank R --die-step K` (rank R kills
//! itself with SIGKILL in step K, once its first buckets are on the wire).
//!
//! `--elastic`: when a step fails (a rank died), every survivor drops the
//! step (weights as before it: a survivor whose step completed before it
//! heard rolls it back, so all agree), shrinks the communicator
//! (`Communicator::shrink_failed`), re-shards the global batch over the
//! survivors and trains on from that step. The loss is a mean over the
//! global batch, so the weights equal those of a run with the fewer ranks
//! from that step on (the same for any rank count, up to f32
//! reassociation). Run it under `ferroccl-run` with
//! `FERROCCL_RUN_SETTLE_S` long enough for the survivors to finish.
//!
//! Modes: `reducer` hands each layer's gradients over during backward;
//! `after-backward` hands all of them over once backward is done (the same
//! buckets, no overlap); `none` skips communication (each rank trains on its
//! shard alone: the compute-only baseline). Rank 0 prints one line of
//! `key=value` pairs. `compare` runs several variants in one job, taking
//! turns step by step on the same data (`--variants`, e.g.
//! `none;after:25;red:1;red:25:4` for none, after-backward with 25 MiB
//! buckets, the reducer with 1 MiB buckets, and with 25 MiB buckets and
//! 4 MiB prefix chunks; `/plain` after a variant gives it plain buckets
//! instead of windows), and prints a markdown table: what
//! `bench/ddp-bench.sh` runs.
//!
//! This file holds the arguments, the model and the training run;
//! `compare.rs` the `--mode compare` variants and their table;
//! `elastic.rs` `--elastic` and `--die-rank`; `../common/mlp.rs` the MLP's
//! math and data, shared with `mlp_fsdp`.

mod compare;
mod elastic;
#[path = "../common/mlp.rs"]
mod mlp;

use compare::{parse_variants, VariantSpec, DEFAULT_VARIANTS};
use ferroccl::ddp::{
    broadcast_parameters, AllReduceHook, Bf16CompressHook, CommHook, Fp16CompressHook, ParamSpec,
    Reducer, ReducerConfig,
};
use ferroccl::{Communicator, ReduceOp};
use mlp::{axpy, batch, Dims, Flags, Rng};
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Reducer,
    AfterBackward,
    None,
    Compare,
}

struct Args {
    steps: usize,
    warmup: usize,
    batch: usize,
    d_in: usize,
    hidden: usize,
    layers: usize,
    d_out: usize,
    lr: f32,
    mode: Mode,
    bucket_mb: f64,
    first_bucket_mb: f64,
    prefix_chunk_mb: Option<f64>,
    hook: String,
    rebuild: bool,
    windows: bool,
    accumulate: usize,
    variants: Vec<VariantSpec>,
    elastic: bool,
    /// (job rank, step) at which that rank kills itself mid-step.
    die: Option<(usize, usize)>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        steps: 20,
        warmup: 3,
        batch: 16,
        d_in: 256,
        hidden: 2048,
        layers: 4,
        d_out: 16,
        lr: 0.01,
        mode: Mode::Reducer,
        bucket_mb: 25.0,
        first_bucket_mb: 1.0,
        prefix_chunk_mb: None,
        hook: "allreduce".into(),
        rebuild: true,
        windows: true,
        accumulate: 1,
        variants: parse_variants(DEFAULT_VARIANTS)?,
        elastic: false,
        die: None,
    };
    let mut flags = Flags::from_env();
    while let Some(flag) = flags.flag() {
        let f = flag.as_str();
        match f {
            "--steps" => a.steps = flags.num(f)? as usize,
            "--warmup" => a.warmup = flags.num(f)? as usize,
            "--batch" => a.batch = flags.num(f)? as usize,
            "--in" => a.d_in = flags.num(f)? as usize,
            "--hidden" => a.hidden = flags.num(f)? as usize,
            "--layers" => a.layers = flags.num(f)? as usize,
            "--out" => a.d_out = flags.num(f)? as usize,
            "--lr" => a.lr = flags.num(f)? as f32,
            "--bucket-mb" => a.bucket_mb = flags.num(f)?,
            "--first-bucket-mb" => a.first_bucket_mb = flags.num(f)?,
            "--prefix-chunk-mb" => a.prefix_chunk_mb = Some(flags.num(f)?),
            "--accumulate" => a.accumulate = (flags.num(f)? as usize).max(1),
            "--hook" => a.hook = flags.value(f)?,
            "--no-rebuild" => a.rebuild = false,
            "--plain-buckets" => a.windows = false,
            "--elastic" => a.elastic = true,
            "--die-rank" => {
                let r = flags.num(f)? as usize;
                a.die = Some((r, a.die.map_or(usize::MAX, |d| d.1)));
            }
            "--die-step" => {
                let k = flags.num(f)? as usize;
                a.die = Some((a.die.map_or(usize::MAX, |d| d.0), k));
            }
            "--variants" => a.variants = parse_variants(&flags.value(f)?)?,
            "--mode" => {
                a.mode = match flags.value(f)?.as_str() {
                    "reducer" => Mode::Reducer,
                    "after-backward" => Mode::AfterBackward,
                    "none" => Mode::None,
                    "compare" => Mode::Compare,
                    other => return Err(format!("unknown mode {other}")),
                }
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.layers == 0 || a.batch == 0 {
        return Err("--layers and --batch must be positive".into());
    }
    if matches!(a.die, Some((usize::MAX, _)) | Some((_, usize::MAX))) {
        return Err("--die-rank and --die-step go together".into());
    }
    if a.elastic && (a.mode != Mode::Reducer || a.accumulate != 1) {
        return Err("--elastic runs the reducer mode without --accumulate".into());
    }
    Ok(a)
}

/// One linear layer: `y = W x + b`, W and b each a parameter of the
/// reducer.
#[derive(Clone)]
struct Linear {
    d: Dims,
    w: Vec<f32>,
    b: Vec<f32>,
}

/// Gradients of one layer from the gradient `dy` of its output and its
/// input `x`: (dW, db).
fn layer_backward(l: &Linear, x: &[f32], dy: &[f32], rows: usize) -> (Vec<f32>, Vec<f32>) {
    let mut gw = vec![0f32; l.w.len()];
    let mut gb = vec![0f32; l.d.d_out];
    mlp::param_grad(l.d, x, dy, rows, &mut gw, &mut gb);
    (gw, gb)
}

fn main() {
    mlp::main_of("mlp_ddp", parse_args, run);
}

fn run(args: &Args) -> ferroccl::Result<()> {
    if args.elastic {
        return elastic::run_elastic(args);
    }
    let comm = Communicator::from_env()?;
    let (rank, size) = (comm.rank(), comm.size());
    if !args.batch.is_multiple_of(size) {
        return Err(ferroccl::Error::InvalidArgument(format!(
            "--batch {} is not divisible by {size} ranks",
            args.batch
        )));
    }
    let shard = args.batch / size;

    let (mut layers, specs) = model(&comm, args)?;
    let grad_bytes: usize = specs.iter().map(|s| s.len * 4).sum();
    let hook = || -> ferroccl::Result<Box<dyn CommHook<f32>>> {
        Ok(match args.hook.as_str() {
            "allreduce" => Box::new(AllReduceHook),
            "fp16" => Box::new(Fp16CompressHook),
            "bf16" => Box::new(Bf16CompressHook),
            other => {
                return Err(ferroccl::Error::InvalidArgument(format!(
                    "unknown hook {other}"
                )))
            }
        })
    };
    // What runs: one mode, or (compare) several variants taking turns step
    // by step on the same data, so that a shared machine's load falls on
    // all of them alike.
    let specs_of_variants = match args.mode {
        Mode::Compare => args.variants.clone(),
        mode => vec![VariantSpec::of_args(args, mode)],
    };
    let mut variants = Vec::new();
    for v in specs_of_variants {
        let reducer = match v.mode {
            Mode::None => None,
            _ => Some(Reducer::with_hook(
                &comm,
                &specs,
                reducer_config(args, &v),
                hook()?,
            )?),
        };
        variants.push((v, reducer, Vec::new()));
    }

    let mut last_loss = 0f64;
    let mut grads: Vec<Vec<f32>> = specs.iter().map(|s| vec![0.0; s.len]).collect();
    let total_steps = args.warmup + args.steps;
    let n_variants = variants.len();
    for step in 0..total_steps {
        for k in 0..n_variants {
            // Rotate who goes first, so no variant always follows another.
            let (v, reducer, times) = &mut variants[(k + step) % n_variants];
            comm.barrier()?; // every rank starts the timed step together
            let start = Instant::now();
            last_loss = train_step(
                &mut layers,
                args,
                v.mode,
                reducer.as_mut(),
                &mut grads,
                step,
                rank,
                shard,
            )?;
            if step >= args.warmup {
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }

    // The mean loss of the last step over all ranks, and a checksum of the
    // weights (equal on every rank when training is synchronised).
    let mut loss = [last_loss];
    comm.all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
    let checksum = checksum(&layers);
    if rank != 0 {
        return Ok(());
    }
    let summary: Vec<compare::Row> = variants
        .iter_mut()
        .map(|(v, reducer, times)| {
            let (median, min) = mlp::median_min(times);
            let (b, c) = reducer.as_ref().map_or((0, 0), |r| {
                (r.bucket_layout().len(), r.chunk_layout().len())
            });
            (v.label.clone(), median, min, b, c)
        })
        .collect();
    let grad_mib = grad_bytes as f64 / (1 << 20) as f64;
    if args.mode != Mode::Compare {
        let (_, median, min, buckets, chunks) = &summary[0];
        println!(
            "mode={:?} ranks={size} grad_mib={grad_mib:.1} buckets={buckets} chunks={chunks} \
             step_ms_median={median:.2} step_ms_min={min:.2} loss={:.6} checksum={checksum:.6}",
            args.mode, loss[0],
        );
        return Ok(());
    }
    compare::print_table(&summary);
    println!(
        "ranks={size} grad_mib={grad_mib:.1} steps={} checksum={checksum:.6}",
        args.steps
    );
    Ok(())
}

/// The reducer's configuration for variant `v`.
fn reducer_config(args: &Args, v: &VariantSpec) -> ReducerConfig {
    let mib = |x: f64| (x * (1 << 20) as f64) as usize;
    ReducerConfig {
        bucket_cap_bytes: mib(v.bucket_mb),
        first_bucket_cap_bytes: mib(v.first_mb.unwrap_or(args.first_bucket_mb)),
        prefix_chunk_bytes: v.prefix_mb.map(mib),
        rebuild_buckets: args.rebuild,
        find_unused_parameters: false,
        windows: v.windows,
    }
}

/// The model of `args`, one on every rank of `comm`, and its parameters
/// in registration order: W0 b0 W1 b1 ... (parameter 2l is layer l's W).
/// Each rank draws its own initial weights; the broadcast from rank 0
/// makes them one model, as DDP does at construction.
fn model(comm: &Communicator, args: &Args) -> ferroccl::Result<(Vec<Linear>, Vec<ParamSpec>)> {
    let mut rng = Rng(0xface ^ comm.rank() as u64);
    let mut layers: Vec<Linear> = mlp::layer_dims(args.layers, args.d_in, args.hidden, args.d_out)
        .into_iter()
        .map(|d| {
            let scale = (3.0 / d.d_in as f32).sqrt();
            Linear {
                d,
                w: (0..d.weights()).map(|_| rng.uniform() * scale).collect(),
                b: vec![0.0; d.d_out],
            }
        })
        .collect();
    {
        let mut views: Vec<&mut [f32]> = Vec::new();
        for l in &mut layers {
            views.push(&mut l.w);
            views.push(&mut l.b);
        }
        broadcast_parameters(comm, &mut views)?;
    }
    let specs = layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| {
            [
                ParamSpec::new(format!("fc{i}.weight"), l.w.len()),
                ParamSpec::new(format!("fc{i}.bias"), l.b.len()),
            ]
        })
        .collect();
    Ok((layers, specs))
}

/// `mlp::checksum` of every weight, W0 b0 W1 b1 ...
fn checksum(layers: &[Linear]) -> f64 {
    mlp::checksum(layers.iter().flat_map(|l| l.w.iter().chain(&l.b)))
}

/// One optimizer step (with its micro-steps) of `mode`; returns the loss.
#[allow(clippy::too_many_arguments)]
fn train_step(
    layers: &mut [Linear],
    args: &Args,
    mode: Mode,
    mut reducer: Option<&mut Reducer<'_, f32>>,
    grads: &mut [Vec<f32>],
    step: usize,
    rank: usize,
    shard: usize,
) -> ferroccl::Result<f64> {
    let dims: Vec<Dims> = layers.iter().map(|l| l.d).collect();
    let mut loss_sum = 0f64;
    for micro in 0..args.accumulate {
        if let Some(r) = reducer.as_mut() {
            r.set_sync(micro + 1 == args.accumulate);
        }
        let first = (step * args.accumulate + micro) * args.batch + rank * shard;
        let (x, t) = batch(first, shard, args.d_in, args.d_out);

        // Forward, keeping each layer's input.
        let model: &[Linear] = layers;
        let mut inputs = mlp::forward_all(&dims, |l| (&model[l].w[..], &model[l].b[..]), x, shard);
        let out = inputs.pop().expect("output");
        // Mean squared error over the shard (and the micro-steps).
        let denom = (shard * args.d_out * args.accumulate) as f32;
        let (loss, mut dy) = mlp::mse(&out, &t, denom);
        loss_sum += loss;

        // Backward, last layer first: each layer's gradients go to the
        // reducer as soon as they are computed.
        for l in (0..layers.len()).rev() {
            let (gw, gb) = layer_backward(&layers[l], &inputs[l], &dy, shard);
            if l > 0 {
                // Through the ReLU of the layer below.
                let dx = mlp::input_grad(layers[l].d, &layers[l].w, &dy, shard);
                dy = mlp::relu_back(dx, &inputs[l]);
            }
            match (mode, reducer.as_mut()) {
                (Mode::Reducer, Some(r)) => {
                    r.mark_ready(2 * l, &gw)?;
                    r.mark_ready(2 * l + 1, &gb)?;
                }
                _ => {
                    // Without a reducer, micro-steps accumulate here;
                    // with one (after-backward), in its buckets.
                    let m = if mode == Mode::None { micro } else { 0 };
                    accumulate_into(&mut grads[2 * l], gw, m);
                    accumulate_into(&mut grads[2 * l + 1], gb, m);
                }
            }
        }
        if let (Mode::AfterBackward, Some(r)) = (mode, reducer.as_mut()) {
            // The same buckets, handed over only once backward is done.
            for p in (0..grads.len()).rev() {
                r.mark_ready(p, &grads[p])?;
            }
        }
        if let Some(r) = reducer.as_mut() {
            r.finish()?;
        }
    }
    // SGD.
    for (l, layer) in layers.iter_mut().enumerate() {
        let (gw, gb) = match reducer.as_ref() {
            Some(r) => (
                r.grad(2 * l).expect("averaged"),
                r.grad(2 * l + 1).expect("averaged"),
            ),
            None => (&grads[2 * l][..], &grads[2 * l + 1][..]),
        };
        axpy(&mut layer.w, -args.lr, gw);
        axpy(&mut layer.b, -args.lr, gb);
    }
    Ok(loss_sum)
}

/// `dst = src` on the first micro-step (a move: no copy, so that the
/// baselines pay no copy the reducer mode does not), `dst += src` on the
/// others.
fn accumulate_into(dst: &mut Vec<f32>, src: Vec<f32>, micro: usize) {
    if micro == 0 {
        *dst = src;
    } else {
        axpy(dst, 1.0, &src);
    }
}
