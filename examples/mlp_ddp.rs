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

use ferroccl::ddp::{
    broadcast_parameters, AllReduceHook, Bf16CompressHook, CommHook, Fp16CompressHook, ParamSpec,
    Reducer, ReducerConfig,
};
use ferroccl::{Communicator, ReduceOp};
use std::time::Instant;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Reducer,
    AfterBackward,
    None,
    Compare,
}

/// One configuration of `--mode compare`.
#[derive(Clone, Debug)]
struct VariantSpec {
    label: String,
    mode: Mode,
    bucket_mb: f64,
    prefix_mb: Option<f64>,
    /// Cap of the first bucket, if not `--first-bucket-mb`.
    first_mb: Option<f64>,
    /// Buckets as windows (`ReducerConfig::windows`, the default).
    windows: bool,
}

/// `none`, `after:CAP`, `one` (the reducer with a single bucket: every
/// gradient reduced in one collective once backward is done) or
/// `red:CAP[:PREFIX]` (MiB), separated by `;`. A `/plain` suffix gives the
/// variant plain buckets instead of windows (`ReducerConfig::windows`).
fn parse_variants(text: &str) -> Result<Vec<VariantSpec>, String> {
    text.split(';')
        .map(|v| {
            let (v, windows) = match v.strip_suffix("/plain") {
                Some(v) => (v, false),
                None => (v, true),
            };
            let tag = |label: String| {
                if windows {
                    label
                } else {
                    format!("{label}, plain buckets")
                }
            };
            let parts: Vec<&str> = v.split(':').collect();
            let num = |i: usize| -> Result<Option<f64>, String> {
                parts
                    .get(i)
                    .map(|p| p.parse::<f64>().map_err(|e| format!("variant {v}: {e}")))
                    .transpose()
            };
            let (mode, label) = match parts[0] {
                "none" => {
                    return Ok(VariantSpec {
                        label: "none".into(),
                        mode: Mode::None,
                        bucket_mb: 25.0,
                        prefix_mb: None,
                        first_mb: None,
                        windows,
                    })
                }
                "one" => {
                    return Ok(VariantSpec {
                        label: tag("one bucket".into()),
                        mode: Mode::Reducer,
                        bucket_mb: 1e6,
                        prefix_mb: None,
                        first_mb: Some(1e6),
                        windows,
                    })
                }
                "after" => (Mode::AfterBackward, "after-backward".to_string()),
                "red" => (Mode::Reducer, String::new()),
                other => return Err(format!("unknown variant kind {other}")),
            };
            let bucket_mb = num(1)?.unwrap_or(25.0);
            let prefix_mb = num(2)?;
            let label = if mode == Mode::Reducer {
                match prefix_mb {
                    Some(p) => format!("reducer, {bucket_mb} MiB + prefix {p} MiB"),
                    None => format!("reducer, {bucket_mb} MiB"),
                }
            } else {
                label
            };
            Ok(VariantSpec {
                label: tag(label),
                mode,
                bucket_mb,
                prefix_mb,
                first_mb: None,
                windows,
            })
        })
        .collect()
}

const DEFAULT_VARIANTS: &str =
    "none;after:25;one;red:1;red:5;red:25;red:100;red:25:4;red:100:4;red:100:12";

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
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let num = |v: String| v.parse::<f64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--steps" => a.steps = num(value()?)? as usize,
            "--warmup" => a.warmup = num(value()?)? as usize,
            "--batch" => a.batch = num(value()?)? as usize,
            "--in" => a.d_in = num(value()?)? as usize,
            "--hidden" => a.hidden = num(value()?)? as usize,
            "--layers" => a.layers = num(value()?)? as usize,
            "--out" => a.d_out = num(value()?)? as usize,
            "--lr" => a.lr = num(value()?)? as f32,
            "--bucket-mb" => a.bucket_mb = num(value()?)?,
            "--first-bucket-mb" => a.first_bucket_mb = num(value()?)?,
            "--prefix-chunk-mb" => a.prefix_chunk_mb = Some(num(value()?)?),
            "--accumulate" => a.accumulate = (num(value()?)? as usize).max(1),
            "--hook" => a.hook = value()?,
            "--no-rebuild" => a.rebuild = false,
            "--plain-buckets" => a.windows = false,
            "--elastic" => a.elastic = true,
            "--die-rank" => {
                let r = num(value()?)? as usize;
                a.die = Some((r, a.die.map_or(usize::MAX, |d| d.1)));
            }
            "--die-step" => {
                let k = num(value()?)? as usize;
                a.die = Some((a.die.map_or(usize::MAX, |d| d.0), k));
            }
            "--variants" => a.variants = parse_variants(&value()?)?,
            "--mode" => {
                a.mode = match value()?.as_str() {
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

/// splitmix64: a tiny deterministic generator, so every run sees the same
/// data without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// One linear layer: `y = W x + b`, W stored row-major as out × in.
#[derive(Clone)]
struct Linear {
    d_in: usize,
    d_out: usize,
    w: Vec<f32>,
    b: Vec<f32>,
}

/// `x · Wᵀ + b` for a batch of rows.
fn forward(l: &Linear, x: &[f32], rows: usize) -> Vec<f32> {
    let mut y = vec![0f32; rows * l.d_out];
    for r in 0..rows {
        let xr = &x[r * l.d_in..(r + 1) * l.d_in];
        for (o, yo) in y[r * l.d_out..(r + 1) * l.d_out].iter_mut().enumerate() {
            *yo = dot(&l.w[o * l.d_in..(o + 1) * l.d_in], xr) + l.b[o];
        }
    }
    y
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent sums, so the compiler can keep them in one vector.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// Gradients of one layer from the gradient `dy` of its output and its input
/// `x`: dW = dyᵀ x, db = Σ dy; and, unless it is the first layer, dx = dy W.
fn layer_backward(l: &Linear, x: &[f32], dy: &[f32], rows: usize) -> (Vec<f32>, Vec<f32>) {
    let mut gw = vec![0f32; l.w.len()];
    let mut gb = vec![0f32; l.d_out];
    for r in 0..rows {
        let xr = &x[r * l.d_in..(r + 1) * l.d_in];
        for (o, &g) in dy[r * l.d_out..(r + 1) * l.d_out].iter().enumerate() {
            gb[o] += g;
            axpy(&mut gw[o * l.d_in..(o + 1) * l.d_in], g, xr);
        }
    }
    (gw, gb)
}

fn input_grad(l: &Linear, dy: &[f32], rows: usize) -> Vec<f32> {
    let mut dx = vec![0f32; rows * l.d_in];
    for r in 0..rows {
        let dxr = &mut dx[r * l.d_in..(r + 1) * l.d_in];
        for (o, &g) in dy[r * l.d_out..(r + 1) * l.d_out].iter().enumerate() {
            axpy(dxr, g, &l.w[o * l.d_in..(o + 1) * l.d_in]);
        }
    }
    dx
}

/// Sample `i` of the stream: an input and the output of a fixed random
/// "teacher" that the model learns to imitate.
fn batch(first: usize, rows: usize, d_in: usize, d_out: usize) -> (Vec<f32>, Vec<f32>) {
    let mut x = Vec::with_capacity(rows * d_in);
    let mut t = Vec::with_capacity(rows * d_out);
    for i in first..first + rows {
        let mut rng = Rng(0x5eed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let xi: Vec<f32> = (0..d_in).map(|_| rng.uniform()).collect();
        for o in 0..d_out {
            // The teacher: a sparse fixed mix of inputs through tanh.
            let s: f32 = (0..8)
                .map(|k| xi[(o * 37 + k * 11) % d_in] * if k % 2 == 0 { 0.5 } else { -0.3 })
                .sum();
            t.push(s.tanh());
        }
        x.extend(xi);
    }
    (x, t)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mlp_ddp: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("mlp_ddp: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> ferroccl::Result<()> {
    if args.elastic {
        return run_elastic(args);
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

    // Each rank draws its own initial weights; the broadcast from rank 0
    // makes them one model, as DDP does at construction.
    let mut layers = init_layers(args, rank);
    {
        let mut views: Vec<&mut [f32]> = Vec::new();
        for l in &mut layers {
            views.push(&mut l.w);
            views.push(&mut l.b);
        }
        broadcast_parameters(&comm, &mut views)?;
    }
    // Registration order: W0 b0 W1 b1 ...; parameter 2l is layer l's W.
    let specs: Vec<ParamSpec> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| {
            [
                ParamSpec::new(format!("fc{i}.weight"), l.w.len()),
                ParamSpec::new(format!("fc{i}.bias"), l.b.len()),
            ]
        })
        .collect();
    let grad_bytes: usize = specs.iter().map(|s| s.len * 4).sum();
    let mib = |x: f64| (x * (1 << 20) as f64) as usize;
    let config = |v: &VariantSpec| ReducerConfig {
        bucket_cap_bytes: mib(v.bucket_mb),
        first_bucket_cap_bytes: mib(v.first_mb.unwrap_or(args.first_bucket_mb)),
        prefix_chunk_bytes: v.prefix_mb.map(mib),
        rebuild_buckets: args.rebuild,
        find_unused_parameters: false,
        windows: v.windows,
    };
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
        mode => vec![VariantSpec {
            label: format!("{mode:?}"),
            mode,
            bucket_mb: args.bucket_mb,
            prefix_mb: args.prefix_chunk_mb,
            first_mb: None,
            windows: args.windows,
        }],
    };
    let mut variants = Vec::new();
    for v in specs_of_variants {
        let reducer = match v.mode {
            Mode::None => None,
            _ => Some(Reducer::with_hook(&comm, &specs, config(&v), hook()?)?),
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
    let summary: Vec<(String, f64, f64, usize, usize)> = variants
        .iter_mut()
        .map(|(v, reducer, times)| {
            times.sort_by(f64::total_cmp);
            let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
            let min = times.first().copied().unwrap_or(0.0);
            let (b, c) = reducer.as_ref().map_or((0, 0), |r| {
                (r.bucket_layout().len(), r.chunk_layout().len())
            });
            (v.label.clone(), median, min, b, c)
        })
        .collect();
    if args.mode != Mode::Compare {
        let (_, median, min, buckets, chunks) = &summary[0];
        println!(
            "mode={:?} ranks={size} grad_mib={:.1} buckets={buckets} chunks={chunks} \
             step_ms_median={median:.2} step_ms_min={min:.2} loss={:.6} checksum={checksum:.6}",
            args.mode,
            grad_bytes as f64 / (1 << 20) as f64,
            loss[0],
        );
        return Ok(());
    }
    // Compare: a markdown table; "hidden" is the share of the communication
    // time (after-backward minus none) that the variant does not pay.
    let find = |label: &str| summary.iter().find(|s| s.0 == label).map(|s| s.1);
    let (none, after, one) = (find("none"), find("after-backward"), find("one bucket"));
    let hidden = |base: Option<f64>, label: &str, median: f64| match (none, base) {
        (Some(z), Some(a)) if a > z && label != "none" && label != "after-backward" => {
            format!("{:.0}%", 100.0 * (a - median) / (a - z))
        }
        _ => "-".into(),
    };
    println!(
        "| variant | buckets | collectives | step ms, median | step ms, min \
         | hidden vs after-backward | hidden vs one bucket |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, median, min, b, c) in &summary {
        let h1 = hidden(after, label, *median);
        let h2 = if label == "one bucket" {
            "-".into()
        } else {
            hidden(one, label, *median)
        };
        println!("| {label} | {b} | {c} | {median:.1} | {min:.1} | {h1} | {h2} |");
    }
    println!(
        "ranks={size} grad_mib={:.1} steps={} checksum={checksum:.6}",
        grad_bytes as f64 / (1 << 20) as f64,
        args.steps
    );
    Ok(())
}

/// The model of `args`: each rank draws its own weights (the broadcast
/// from rank 0 makes them one model).
fn init_layers(args: &Args, rank: usize) -> Vec<Linear> {
    let mut rng = Rng(0xface ^ rank as u64);
    (0..args.layers)
        .map(|l| {
            let d_in = if l == 0 { args.d_in } else { args.hidden };
            let d_out = if l + 1 == args.layers {
                args.d_out
            } else {
                args.hidden
            };
            let scale = (3.0 / d_in as f32).sqrt();
            Linear {
                d_in,
                d_out,
                w: (0..d_in * d_out).map(|_| rng.uniform() * scale).collect(),
                b: vec![0.0; d_out],
            }
        })
        .collect()
}

/// Weighted sum of every weight: equal on every rank when training is
/// synchronised, and the example tests' measure of "the same model".
fn checksum(layers: &[Linear]) -> f64 {
    layers
        .iter()
        .flat_map(|l| l.w.iter().chain(&l.b))
        .enumerate()
        .map(|(i, &v)| f64::from(v) * (1.0 + (i % 7) as f64))
        .sum()
}

/// `--elastic`: train through the loss of ranks (module docs).
fn run_elastic(args: &Args) -> ferroccl::Result<()> {
    let mut comm = Communicator::from_env()?;
    let job_rank = comm.rank();
    let mut layers = init_layers(args, job_rank);
    {
        let mut views: Vec<&mut [f32]> = Vec::new();
        for l in &mut layers {
            views.push(&mut l.w);
            views.push(&mut l.b);
        }
        broadcast_parameters(&comm, &mut views)?;
    }
    let specs: Vec<ParamSpec> = layers
        .iter()
        .enumerate()
        .flat_map(|(i, l)| {
            [
                ParamSpec::new(format!("fc{i}.weight"), l.w.len()),
                ParamSpec::new(format!("fc{i}.bias"), l.b.len()),
            ]
        })
        .collect();
    let mib = |x: f64| (x * (1 << 20) as f64) as usize;
    let config = ReducerConfig {
        bucket_cap_bytes: mib(args.bucket_mb),
        first_bucket_cap_bytes: mib(args.first_bucket_mb),
        prefix_chunk_bytes: args.prefix_chunk_mb.map(mib),
        rebuild_buckets: args.rebuild,
        find_unused_parameters: false,
        windows: args.windows,
    };
    let total = args.warmup + args.steps;
    let mut grads: Vec<Vec<f32>> = specs.iter().map(|s| vec![0.0; s.len]).collect();
    let mut step = 0;
    let mut last_loss = 0f64;
    let mut recoveries = 0;
    // The weights before the last step this rank completed (see below).
    let mut prev: Option<Vec<Linear>> = None;
    loop {
        let (rank, size) = (comm.rank(), comm.size());
        if !args.batch.is_multiple_of(size) {
            return Err(ferroccl::Error::InvalidArgument(format!(
                "--batch {} is not divisible by the {size} ranks left",
                args.batch
            )));
        }
        let shard = args.batch / size;
        let mut reducer = Reducer::with_hook(&comm, &specs, config.clone(), AllReduceHook)?;
        let mut failed = None;
        while step < total {
            // Kept until the step is known to be done everywhere.
            let before = layers.clone();
            let dies = args.die == Some((job_rank, step));
            let outcome = if dies {
                train_step_then_die(&mut layers, args, &mut reducer, step, rank, shard)
            } else {
                train_step(
                    &mut layers,
                    args,
                    Mode::Reducer,
                    Some(&mut reducer),
                    &mut grads,
                    step,
                    rank,
                    shard,
                )
            };
            match outcome {
                Ok(loss) => {
                    last_loss = loss;
                    prev = Some(before);
                    step += 1;
                }
                Err(e) => {
                    failed = Some((e, before));
                    break;
                }
            }
        }
        let Some((err, before)) = failed else {
            break;
        };
        drop(reducer);
        let since = Instant::now();
        eprintln!("mlp_ddp: rank {job_rank}: step {step} failed: {err}");
        let survivors = comm.shrink_failed()?;
        // A survivor may have finished the failed step before it heard of
        // the failure (its last collective completed): all go back to the
        // earliest step any of them is at, which is this one or the one
        // before.
        let mut at = [step as u64];
        survivors.all_reduce_in_place(&mut at, ReduceOp::Min)?;
        let resume = at[0] as usize;
        layers = match (resume + 1 == step, prev.take()) {
            // This rank completed the step the others dropped: undo it.
            (true, Some(prev)) => prev,
            _ if resume == step => before,
            _ => {
                return Err(ferroccl::Error::InvalidArgument(format!(
                    "elastic: survivors are at steps {resume} and {step}"
                )))
            }
        };
        step = resume;
        recoveries += 1;
        eprintln!(
            "mlp_ddp: rank {job_rank}: went on as rank {} of {} from step {step} ({} ms after \
             the failure)",
            survivors.rank(),
            survivors.size(),
            since.elapsed().as_millis()
        );
        comm = survivors;
    }
    let mut loss = [last_loss];
    comm.all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
    if comm.rank() == 0 {
        println!(
            "mode=elastic ranks={} recoveries={recoveries} steps={step} loss={:.6} \
             checksum={:.6}",
            comm.size(),
            loss[0],
            checksum(&layers)
        );
    }
    Ok(())
}

/// `--die-rank`/`--die-step`: start the step, hand the last layer's
/// gradients to the reducer (its first bucket goes on the wire), then kill
/// this process with SIGKILL: the other ranks are inside that collective.
fn train_step_then_die(
    layers: &mut [Linear],
    args: &Args,
    reducer: &mut Reducer<'_, f32>,
    step: usize,
    rank: usize,
    shard: usize,
) -> ferroccl::Result<f64> {
    let first = step * args.batch + rank * shard;
    let (x, _) = batch(first, shard, args.d_in, args.d_out);
    let l = layers.len() - 1;
    let mut input = x;
    for layer in &layers[..l] {
        input = forward(layer, &input, shard);
    }
    let dy = vec![0f32; shard * layers[l].d_out];
    let (gw, gb) = layer_backward(&layers[l], &input, &dy, shard);
    reducer.mark_ready(2 * l, &gw)?;
    reducer.mark_ready(2 * l + 1, &gb)?;
    eprintln!("mlp_ddp: killing this process (rank {rank}) with SIGKILL in step {step}");
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status();
    std::process::abort();
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
    let mut loss_sum = 0f64;
    for micro in 0..args.accumulate {
        if let Some(r) = reducer.as_mut() {
            r.set_sync(micro + 1 == args.accumulate);
        }
        let first = (step * args.accumulate + micro) * args.batch + rank * shard;
        let (x, t) = batch(first, shard, args.d_in, args.d_out);

        // Forward, keeping each layer's input.
        let mut inputs = vec![x];
        for (l, layer) in layers.iter().enumerate() {
            let mut y = forward(layer, &inputs[l], shard);
            if l + 1 < layers.len() {
                y.iter_mut().for_each(|v| *v = v.max(0.0));
            }
            inputs.push(y);
        }
        let out = inputs.pop().expect("output");
        // Mean squared error over the shard (and the micro-steps).
        let denom = (shard * args.d_out * args.accumulate) as f32;
        let mut dy: Vec<f32> = out
            .iter()
            .zip(&t)
            .map(|(y, t)| (y - t) / denom * 2.0)
            .collect();
        loss_sum += out
            .iter()
            .zip(&t)
            .map(|(y, t)| f64::from((y - t) * (y - t)))
            .sum::<f64>()
            / f64::from(denom);

        // Backward, last layer first: each layer's gradients go to the
        // reducer as soon as they are computed.
        for l in (0..layers.len()).rev() {
            let (gw, gb) = layer_backward(&layers[l], &inputs[l], &dy, shard);
            if l > 0 {
                let mut dx = input_grad(&layers[l], &dy, shard);
                // Through the ReLU of the layer below.
                for (d, a) in dx.iter_mut().zip(&inputs[l]) {
                    if *a <= 0.0 {
                        *d = 0.0;
                    }
                }
                dy = dx;
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
