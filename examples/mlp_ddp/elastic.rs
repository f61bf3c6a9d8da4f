//! `--elastic` (train through the loss of ranks; see the module docs of
//! `main.rs`) and `--die-rank`/`--die-step` (the rank that is lost).

use super::*;

/// `--elastic`: train through the loss of ranks (module docs).
pub(super) fn run_elastic(args: &Args) -> ferroccl::Result<()> {
    let mut comm = Communicator::from_env()?;
    let job_rank = comm.rank();
    let (mut layers, specs) = model(&comm, args)?;
    let config = reducer_config(args, &VariantSpec::of_args(args, Mode::Reducer));
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
        input = mlp::forward(layer.d, &layer.w, &layer.b, &input, shard);
    }
    let dy = vec![0f32; shard * layers[l].d.d_out];
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
