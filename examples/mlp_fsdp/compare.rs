//! `--mode compare`: several variants of the same model (compute only,
//! the DDP layer, FSDP strategies and limits) trained in one job, taking
//! turns step by step on the same data, each step timed from a barrier;
//! rank 0 prints the step times and the memory per rank.

use super::*;

/// What one variant of `--mode compare` is.
#[derive(Clone, Debug)]
enum Kind {
    /// Every rank trains the whole model alone on its rows: no
    /// communication (the compute-only baseline).
    Alone,
    /// The whole model on every rank, gradients averaged by the DDP
    /// reducer (default config): handed over layer by layer during backward
    /// (`overlap`), or all of them once backward is done.
    Ddp { overlap: bool },
    /// Through `Fsdp` with this config; `serial` waits for every collective
    /// as soon as it is issued (see `train_micro_step`).
    Fsdp { config: FsdpConfig, serial: bool },
}

#[derive(Clone, Debug)]
pub(super) struct VariantSpec {
    label: String,
    kind: Kind,
}

/// Every variant, in the order of the tables.
pub(super) const DEFAULT_VARIANTS: &str =
    "none;ddp;ddp-after;full;full-serial;full-keep;grad-op;no-shard";

/// Variants separated by `;`: `none`, `ddp`, `ddp-after`, `full` (FullShard
/// with the default limit of 3), `full-limit1` (limit 1: no prefetch),
/// `full-serial` (limit 1 and every reduction waited for at once),
/// `full-keep` (`reshard_after_forward: false`), `grad-op`, `no-shard`.
pub(super) fn parse_variants(text: &str) -> Result<Vec<VariantSpec>, String> {
    let fsdp = |strategy, limit, keep: bool, serial| Kind::Fsdp {
        config: FsdpConfig {
            strategy,
            limit_gathered: limit,
            reshard_after_forward: !keep,
            ..FsdpConfig::default()
        },
        serial,
    };
    text.split(';')
        .map(|v| {
            let kind = match v {
                "none" => Kind::Alone,
                "ddp" => Kind::Ddp { overlap: true },
                "ddp-after" => Kind::Ddp { overlap: false },
                "full" => fsdp(Strategy::FullShard, 3, false, false),
                "full-limit1" => fsdp(Strategy::FullShard, 1, false, false),
                "full-serial" => fsdp(Strategy::FullShard, 1, false, true),
                "full-keep" => fsdp(Strategy::FullShard, 2, true, false),
                "grad-op" => fsdp(Strategy::ShardGradOp, 2, false, false),
                "no-shard" => fsdp(Strategy::NoShard, 2, false, false),
                other => return Err(format!("unknown variant {other}")),
            };
            Ok(VariantSpec {
                label: v.to_string(),
                kind,
            })
        })
        .collect()
}

/// A variant's model and its running numbers.
struct Variant<'c> {
    spec: VariantSpec,
    state: State<'c>,
    times: Vec<f64>,
    peak: Peak,
    loss: f64,
}

enum State<'c> {
    /// The whole model (one flat parameter per layer), Adam's state
    /// (m then v, per layer) and the step count.
    Whole {
        params: Vec<Vec<f32>>,
        optim: Vec<Vec<f32>>,
        grads: Vec<Vec<f32>>,
        reducer: Option<Box<Reducer<'c, f32>>>,
        steps: u64,
    },
    Sharded(Box<Fsdp<'c>>),
}

/// One step of a whole-model variant: forward, backward (each layer's
/// gradient to the reducer at once with `overlap`, all after backward
/// without), the reducer's finish, the update. Returns the rank's loss.
#[allow(clippy::too_many_arguments)]
fn whole_step(
    params: &mut [Vec<f32>],
    optim: &mut [Vec<f32>],
    grads: &mut [Vec<f32>],
    mut reducer: Option<&mut Reducer<'_, f32>>,
    overlap: bool,
    steps: &mut u64,
    opt: &Optimizer,
    dims: &[Dims],
    x: &[f32],
    t: &[f32],
    rows: usize,
) -> ferroccl::Result<f64> {
    let last = dims.len() - 1;
    let model: &[Vec<f32>] = params;
    let mut inputs = mlp::forward_all(
        dims,
        |l| model[l].split_at(dims[l].weights()),
        x.to_vec(),
        rows,
    );
    let out = inputs.pop().expect("the output");
    let (loss, mut dy) = mse(&out, t, (rows * dims[last].d_out) as f32);
    for l in (0..dims.len()).rev() {
        let d = dims[l];
        let grad = param_grad(d, &inputs[l], &dy, rows);
        if l > 0 {
            let dx = input_grad(d, &params[l][..d.weights()], &dy, rows);
            dy = relu_back(dx, &inputs[l]);
        }
        match reducer.as_mut() {
            Some(r) if overlap => r.mark_ready(l, &grad)?,
            _ => grads[l] = grad, // a move, no copy
        }
    }
    if let Some(r) = reducer.as_mut() {
        if !overlap {
            for (l, g) in grads.iter().enumerate().rev() {
                r.mark_ready(l, g)?;
            }
        }
        r.finish()?;
    }
    *steps += 1;
    for l in 0..dims.len() {
        let g = match reducer.as_ref() {
            Some(r) => r.grad(l).expect("averaged"),
            None => &grads[l][..],
        };
        opt.update(&mut params[l], g, &mut optim[l], *steps);
    }
    Ok(loss)
}

/// `--mode compare`: every variant trains its own copy of the same model
/// on the same data, taking turns step by step (the order rotates), each
/// step timed from a barrier. Rank 0 prints a table of step times and one
/// of memory per rank.
pub(super) fn compare(
    comm: &Communicator,
    args: &Args,
    specs: &[VariantSpec],
    dims: &[Dims],
    units: &[UnitSpec],
) -> ferroccl::Result<()> {
    let (rank, size) = (comm.rank(), comm.size());
    let rows = args.batch / size;
    let opt = if args.adam {
        Optimizer::adam(args.lr)
    } else {
        Optimizer::Sgd { lr: args.lr }
    };
    let k = opt.state_per_element();
    let whole: Vec<Vec<f32>> = dims
        .iter()
        .enumerate()
        .map(|(l, &d)| {
            (0..d.weights() + d.d_out)
                .map(|i| initial(l, d, i))
                .collect()
        })
        .collect();
    let model_bytes: usize = whole.iter().map(|p| 4 * p.len()).sum();
    let param_specs: Vec<ParamSpec> = units
        .iter()
        .map(|u| ParamSpec::new(u.name.clone(), u.numel()))
        .collect();
    let mut variants = Vec::new();
    for spec in specs {
        let state = match &spec.kind {
            Kind::Alone | Kind::Ddp { .. } => State::Whole {
                params: whole.clone(),
                optim: whole.iter().map(|p| vec![0f32; k * p.len()]).collect(),
                grads: whole.iter().map(|_| Vec::new()).collect(),
                reducer: match spec.kind {
                    Kind::Ddp { .. } => Some(Box::new(Reducer::new(
                        comm,
                        &param_specs,
                        ReducerConfig::default(),
                    )?)),
                    _ => None,
                },
                steps: 0,
            },
            Kind::Fsdp { config, .. } => {
                let mut config = config.clone();
                config.param_dtype = args.precision;
                config.reduce_dtype = args.precision;
                State::Sharded(Box::new(Fsdp::new(
                    comm,
                    units.to_vec(),
                    config,
                    |l, start, shard| {
                        for (i, v) in shard.iter_mut().enumerate() {
                            *v = initial(l, dims[l], start + i);
                        }
                    },
                )?))
            }
        };
        variants.push(Variant {
            spec: spec.clone(),
            state,
            times: Vec::new(),
            peak: Peak::default(),
            loss: 0.0,
        });
    }

    let n = variants.len();
    for step in 0..args.warmup + args.steps {
        let first = step * args.batch + rank * rows;
        let (x, t) = batch(first, rows, args.d_in, args.d_out);
        for i in 0..n {
            // Rotate who goes first, so that no variant always follows another.
            let v = &mut variants[(i + step) % n];
            comm.barrier()?; // every rank starts the timed step together
            let start = std::time::Instant::now();
            v.loss = match (&mut v.state, &v.spec.kind) {
                (
                    State::Whole {
                        params,
                        optim,
                        grads,
                        reducer,
                        steps,
                    },
                    kind,
                ) => {
                    let overlap = matches!(kind, Kind::Ddp { overlap: true });
                    whole_step(
                        params,
                        optim,
                        grads,
                        reducer.as_deref_mut(),
                        overlap,
                        steps,
                        &opt,
                        dims,
                        &x,
                        &t,
                        rows,
                    )?
                }
                (State::Sharded(fsdp), Kind::Fsdp { serial, config }) => {
                    let loss =
                        train_micro_step(fsdp, dims, x.clone(), &t, rows, 1, *serial, &mut v.peak)?;
                    fsdp.finish_backward()?;
                    fsdp.step(&opt)?;
                    if config.strategy == Strategy::ShardGradOp {
                        // step() issued the gathers that refresh the whole
                        // copies; wait for them inside this step (the next
                        // barrier would otherwise absorb them untimed).
                        for u in 0..fsdp.num_units() {
                            fsdp.pre_forward(u)?;
                            fsdp.params(u)?;
                            fsdp.post_forward(u)?;
                        }
                    }
                    loss
                }
                _ => unreachable!("a sharded state is built for FSDP variants only"),
            };
            if step >= args.warmup {
                v.times.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }

    // Per variant: the mean last loss over the ranks, and memory per rank
    // (the most over the ranks): params, grads, optim, peak gathered,
    // peak reduction buffers, peak total, in bytes.
    let mib = |b: f64| b / f64::from(1u32 << 20);
    let mut rows_out = Vec::new();
    for v in &mut variants {
        let mut loss = [v.loss];
        comm.all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
        let p = model_bytes;
        let mem = match &v.state {
            // The whole parameters, their gradients (the reducer's buckets,
            // or the local gradients of `none`) and k values per element.
            State::Whole { .. } => [p, p, k * p, 0, 0, (2 + k) * p],
            State::Sharded(fsdp) => {
                let m = fsdp.memory();
                // The layer's own peak of its working buffers (gathered,
                // being reduced, pooled), noted after every call, besides
                // the samples taken after each post_backward.
                let kept = m.params + m.grads + m.optim + m.accumulated;
                let peak_total = v.peak.total.max(m.total()).max(kept + m.peak_working);
                [
                    m.params,
                    m.grads,
                    m.optim,
                    m.peak_gathered,
                    v.peak.reducing,
                    peak_total,
                ]
            }
        };
        let mut mem = mem.map(|b| b as f64);
        comm.all_reduce_in_place(&mut mem, ReduceOp::Max)?;
        let (median, min) = mlp::median_min(&mut v.times);
        rows_out.push((v.spec.label.clone(), median, min, loss[0], mem));
    }
    if rank != 0 {
        return Ok(());
    }
    let find = |label: &str| rows_out.iter().find(|r| r.0 == label).map(|r| r.1);
    let none = find("none");
    // Hidden: the share of the exposed communication of the serial twin
    // (serial minus none) that the variant does not pay.
    let hidden = |label: &str, median: f64| {
        let twin = match label {
            "ddp" => "ddp-after",
            "full" | "full-limit1" => "full-serial",
            _ => return "-".to_string(),
        };
        mlp::hidden_share(none, find(twin), median)
    };
    println!(
        "ranks={size} model_mib={:.2} optimizer={} precision={:?} batch={} steps={} warmup={}",
        mib(model_bytes as f64),
        if args.adam { "adam" } else { "sgd" },
        args.precision,
        args.batch,
        args.steps,
        args.warmup
    );
    println!();
    println!(
        "| variant | step ms, median | step ms, min | communication ms (median - none) \
         | hidden | loss after the last step |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (label, median, min, loss, _) in &rows_out {
        let comm_ms = match none {
            Some(z) if label != "none" => format!("{:.1}", median - z),
            _ => "-".into(),
        };
        println!(
            "| {label} | {median:.1} | {min:.1} | {comm_ms} | {} | {loss:.6} |",
            hidden(label, *median)
        );
    }
    println!();
    // The target for FSDP's memory per rank: DDP's params + grads + optim
    // over N, plus the gathered units; FSDP's steady memory (its shards and
    // the most gathered at once) and its peak total (with the reduction
    // buffers) against it.
    let ddp = rows_out
        .iter()
        .find(|r| r.0 == "ddp")
        .map(|r| r.4[0] + r.4[1] + r.4[2]);
    println!(
        "| variant | params MiB | grads MiB | optim MiB | peak gathered MiB \
         | peak reduction buffers MiB | peak total MiB | DDP/N + gathered MiB \
         | shards + gathered, peak total: within it? |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for (label, _, _, _, m) in &rows_out {
        let sharded = variants
            .iter()
            .any(|v| &v.spec.label == label && matches!(v.state, State::Sharded(_)));
        let (target, verdict) = match ddp {
            Some(d) if sharded => {
                let target = d / size as f64 + m[3];
                let steady = m[0] + m[1] + m[2] + m[3];
                // Shards are padded to a multiple of N elements per unit.
                let pad = (units.len() * size * 4 * (2 + k)) as f64;
                let yes = |b: f64| if b <= target + pad { "yes" } else { "no" };
                (
                    format!("{:.2}", mib(target)),
                    format!("{}, {}", yes(steady), yes(m[5])),
                )
            }
            _ => ("-".into(), "-".into()),
        };
        println!(
            "| {label} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {target} | {verdict} |",
            mib(m[0]),
            mib(m[1]),
            mib(m[2]),
            mib(m[3]),
            mib(m[4]),
            mib(m[5]),
        );
    }
    // The same numbers, machine-readable (bench/fsdp-bench.sh collects them).
    for (label, median, min, loss, m) in &rows_out {
        println!(
            "csv,{size},{},{label},{median:.3},{min:.3},{loss:.6},{}",
            if args.adam { "adam" } else { "sgd" },
            m.iter()
                .map(|b| format!("{:.0}", b))
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    Ok(())
}
