//! Step by step: 16-bit gathers and reductions against f64 at the same
//! point, checkpoints across rank counts, accumulation without sync, and
//! gradient clipping over the whole model.

use super::*;

/// bf16 gathers and reductions, step by step against f64 at the same
/// point: the parameters a unit computes with are exactly its f32 shards
/// rounded to bf16, and each rank's gradient shard is the mean of every
/// rank's local gradient (at those parameters, computed here in f64)
/// within (ranks + 2)·u·G for bf16's u. f16 the same with its own u.
#[test]
fn sixteen_bit_gathers_and_reductions_match_step_by_step() {
    for (dtype, u) in [(Precision::Bf16, U_BF16), (Precision::F16, model::U_F16)] {
        for ranks in [2, 3, 5] {
            for strategy in [
                Strategy::FullShard,
                Strategy::ShardGradOp,
                Strategy::NoShard,
            ] {
                let config = FsdpConfig {
                    strategy,
                    param_dtype: dtype,
                    reduce_dtype: dtype,
                    ..FsdpConfig::default()
                };
                run_ranks(ranks, |comm| step_by_step(&comm, config.clone(), u));
            }
        }
    }
}

fn step_by_step(comm: &Communicator, config: FsdpConfig, u: f64) {
    let (rank, ranks) = (comm.rank(), comm.size());
    let init = narrow_all(&init_flat());
    let mut fsdp = Fsdp::from_full(comm, units(), config.clone(), &init).unwrap();
    let dtype = config.param_dtype;
    for step in 0..3 {
        // Every rank's whole f32 parameters, to know what the gather must give.
        let mut master = Vec::new();
        for x in 0..UNITS {
            let r = fsdp.shard_range(x);
            let mut all = vec![0f32; r.len() * ranks];
            match config.strategy {
                Strategy::NoShard => all = fsdp.shard(x).to_vec(),
                _ => comm.all_gather(fsdp.shard(x), &mut all).unwrap(),
            }
            all.truncate(fsdp.unit_len(x));
            master.push(all);
        }
        let mut seen = Vec::new();
        for x in 0..UNITS {
            fsdp.pre_forward(x).unwrap();
            let p = fsdp.params(x).unwrap().to_vec();
            let want: Vec<f32> = master[x].iter().map(|&v| dtype.round(v)).collect();
            assert_eq!(
                p, want,
                "rank {rank} step {step} unit {x}: gathered parameters"
            );
            seen.push(p.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>());
            fsdp.post_forward(x).unwrap();
        }
        let mine = grads(&seen, &samples(step, rank, ranks));
        let mut mean = vec![Vec::new(); UNITS];
        for r in 0..ranks {
            for (x, g) in grads(&seen, &samples(step, r, ranks))
                .into_iter()
                .enumerate()
            {
                if mean[x].is_empty() {
                    mean[x] = vec![0.0; g.len()];
                }
                for (m, v) in mean[x].iter_mut().zip(g) {
                    *m += v / ranks as f64;
                }
            }
        }
        let gmax = mean
            .iter()
            .flatten()
            .chain(mine.iter().flatten())
            .fold(0f64, |a, v| a.max(v.abs()));
        for x in (0..UNITS).rev() {
            fsdp.pre_backward(x).unwrap();
            let g = narrow(&mine[x]);
            fsdp.post_backward(x, &g).unwrap();
        }
        fsdp.finish_backward().unwrap();
        let tol = (ranks as f64 + 2.0) * u * gmax;
        let mut moved = 0f64;
        for x in 0..UNITS {
            let r = fsdp.shard_range(x);
            for (i, &got) in fsdp.grad_shard(x).iter().enumerate() {
                let want = mean[x].get(r.start + i).copied().unwrap_or(0.0);
                moved = moved.max(want.abs());
                let d = (f64::from(got) - want).abs();
                assert!(
                    d <= tol,
                    "rank {rank} step {step} unit {x} element {}: gradient {got}, f64 mean {want} \
                     (difference {d}, tolerance {tol}, {config:?})",
                    r.start + i
                );
            }
        }
        assert!(
            moved > tol,
            "the check can fail: gradients of {moved}, tolerance {tol}"
        );
        let sgd = Optimizer::Sgd {
            lr: model::LR as f32,
        };
        fsdp.step(&sgd).unwrap();
        check_memory(&fsdp, &config, ranks, &sgd);
    }
}

/// Two steps on 3 ranks, the full state gathered on rank 0, loaded on 2
/// ranks (and on 4 with another strategy), two more steps: the same
/// weights as four steps in one process.
#[test]
fn a_checkpoint_reloads_on_another_rank_count() {
    let (want, gmax, wmax) = reference(Opt::Sgd, 4);
    let tol = tolerance(Opt::Sgd, 4, 4, gmax, wmax, U_F32);
    let first = run_ranks(3, |comm| {
        train(&comm, FsdpConfig::default(), Opt::Sgd, 0..2, None).full
    });
    let saved = first[0].clone().expect("rank 0 holds the state");
    let (mid, ..) = reference(Opt::Sgd, 2);
    assert!(
        max_diff(&saved, &mid) <= tol,
        "the saved state is the state after two steps"
    );
    for (ranks, strategy) in [
        (2, Strategy::FullShard),
        (4, Strategy::HybridShard { group: 2 }),
    ] {
        let config = FsdpConfig {
            strategy,
            ..FsdpConfig::default()
        };
        let got = run_ranks(ranks, |comm| {
            train(&comm, config.clone(), Opt::Sgd, 2..4, Some(&saved)).full
        });
        let d = max_diff(got[0].as_ref().unwrap(), &want);
        assert!(
            d <= tol,
            "reloaded on {ranks} ranks ({strategy:?}): {d} from the reference (tolerance {tol})"
        );
    }
}

/// `set_sync(false)` for the first half of the batch, then a synchronised
/// second half: the same gradient shards as the whole batch at once.
#[test]
fn accumulation_without_sync_matches_the_whole_batch() {
    let ranks = 3;
    run_ranks(ranks, |comm| {
        let rank = comm.rank();
        let init = narrow_all(&init_flat());
        let mut fsdp = Fsdp::from_full(&comm, units(), FsdpConfig::default(), &init).unwrap();
        let flat = widen(&init);
        let all = samples(0, rank, ranks);
        let halves = [&all[..all.len() / 2], &all[all.len() / 2..]];
        for (i, half) in halves.iter().enumerate() {
            fsdp.set_sync(i == 1);
            let g = grads(&flat, half);
            for x in 0..UNITS {
                fsdp.pre_forward(x).unwrap();
                fsdp.post_forward(x).unwrap();
            }
            for x in (0..UNITS).rev() {
                fsdp.pre_backward(x).unwrap();
                // Each half's mean, halved: their sum is the whole mean.
                let gx: Vec<f32> = g[x].iter().map(|&v| (v / 2.0) as f32).collect();
                fsdp.post_backward(x, &gx).unwrap();
            }
            if i == 0 {
                assert!(fsdp.memory().accumulated > 0);
                assert!(
                    fsdp.grad_shard(0).iter().all(|&v| v == 0.0),
                    "nothing reduced yet"
                );
            }
            fsdp.finish_backward().unwrap();
        }
        let mut mean = vec![Vec::new(); UNITS];
        for r in 0..ranks {
            for (x, g) in grads(&flat, &samples(0, r, ranks)).into_iter().enumerate() {
                mean[x].resize(g.len(), 0.0);
                for (m, v) in mean[x].iter_mut().zip(g) {
                    *m += v / ranks as f64;
                }
            }
        }
        let gmax = mean.iter().flatten().fold(0f64, |a, v| a.max(v.abs()));
        let tol = (ranks as f64 + 4.0) * U_F32 * gmax;
        for x in 0..UNITS {
            let r = fsdp.shard_range(x);
            for (i, &got) in fsdp.grad_shard(x).iter().enumerate() {
                let want = mean[x].get(r.start + i).copied().unwrap_or(0.0);
                assert!(
                    (f64::from(got) - want).abs() <= tol,
                    "unit {x} element {i}: {got} against {want}"
                );
            }
        }
        assert_eq!(fsdp.memory().accumulated, 0);
    });
}

/// Clipping scales every shard by one factor computed from the whole
/// model's norm, which is the f64 norm of the whole averaged gradient.
#[test]
fn gradient_norm_clipping_uses_the_whole_model() {
    for (ranks, strategy) in [
        (3, Strategy::FullShard),
        (4, Strategy::HybridShard { group: 2 }),
        (2, Strategy::NoShard),
    ] {
        let config = FsdpConfig {
            strategy,
            ..FsdpConfig::default()
        };
        run_ranks(ranks, |comm| {
            let rank = comm.rank();
            let init = narrow_all(&init_flat());
            let flat = widen(&init);
            let mut fsdp = Fsdp::from_full(&comm, units(), config.clone(), &init).unwrap();
            let g = grads(&flat, &samples(0, rank, ranks));
            for x in (0..UNITS).rev() {
                fsdp.pre_backward(x).unwrap();
                let gx = narrow(&g[x]);
                fsdp.post_backward(x, &gx).unwrap();
            }
            fsdp.finish_backward().unwrap();
            let whole = grads(&flat, &samples(0, 0, 1));
            let want: f64 = whole.iter().flatten().map(|v| v * v).sum::<f64>().sqrt();
            let before: Vec<Vec<f32>> = (0..UNITS).map(|x| fsdp.grad_shard(x).to_vec()).collect();
            let max_norm = want / 4.0;
            let norm = fsdp.clip_grad_norm(max_norm).unwrap();
            assert!(
                (norm - want).abs() <= 1e-5 * want,
                "{strategy:?}: norm {norm}, f64 {want}"
            );
            let c = max_norm / norm;
            for x in 0..UNITS {
                for (a, b) in fsdp.grad_shard(x).iter().zip(&before[x]) {
                    assert!((f64::from(*a) - c * f64::from(*b)).abs() <= 1e-6 * want);
                }
            }
            let again = fsdp.clip_grad_norm(max_norm).unwrap();
            assert!(
                (again - max_norm).abs() <= 1e-5 * want,
                "clipped norm {again}, wanted {max_norm}"
            );
        });
    }
}
