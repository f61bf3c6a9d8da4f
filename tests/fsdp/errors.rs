//! Errors and decisions every rank must take alike: protocol misuse
//! named with the unit and rank, ranks that disagree, one rank's misuse
//! failing the step everywhere, prefetch independent of timing, and
//! rebind after a loss.

use super::*;

fn invalid(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) => m,
        other => panic!("expected InvalidArgument, got {other}"),
    }
}

#[test]
fn protocol_errors_name_the_unit_and_the_rank() {
    run_ranks(2, |comm| {
        let rank = comm.rank();
        let init: Vec<Vec<f32>> = units().iter().map(|u| vec![0.5; u.numel()]).collect();
        let mut fsdp = Fsdp::from_full(&comm, units(), FsdpConfig::default(), &init).unwrap();
        fsdp.pre_forward(1).unwrap();
        let e = invalid(fsdp.pre_forward(1).unwrap_err());
        assert!(
            e.contains("`fc2`")
                && e.contains(&format!("rank {rank}"))
                && e.contains("gathered twice"),
            "{e}"
        );
        fsdp.post_forward(1).unwrap();
        let e = invalid(
            fsdp.post_backward(2, &vec![0.0; fsdp.unit_len(2)])
                .unwrap_err(),
        );
        assert!(
            e.contains("`fc3`")
                && e.contains(&format!("rank {rank}"))
                && e.contains("not gathered"),
            "{e}"
        );
        let e = invalid(fsdp.params(0).unwrap_err());
        assert!(e.contains("`fc1`"), "{e}");
        fsdp.pre_backward(0).unwrap();
        let e = invalid(fsdp.post_backward(0, &[1.0; 3]).unwrap_err());
        assert!(e.contains("3 elements"), "{e}");
        // The errors moved nothing: the communicator still works.
        let mut x = [rank as f32 + 1.0];
        comm.all_reduce_in_place(&mut x, ferroccl::ReduceOp::Sum)
            .unwrap();
        assert_eq!(x[0], 3.0);
    });
}

#[test]
fn ranks_that_disagree_on_units_or_strategy_fail_alike() {
    let errors = run_ranks(3, |comm| {
        let mut u = units();
        if comm.rank() == 2 {
            u[1].tensors[0].shape = vec![H, H + 1];
        }
        let init: Vec<Vec<f32>> = u.iter().map(|x| vec![0.0; x.numel()]).collect();
        invalid(Fsdp::from_full(&comm, u, FsdpConfig::default(), &init).unwrap_err())
    });
    for e in &errors {
        assert!(e.contains("rank 2") && e.contains("names or shapes"), "{e}");
    }
    let errors = run_ranks(2, |comm| {
        let strategy = if comm.rank() == 1 {
            Strategy::NoShard
        } else {
            Strategy::FullShard
        };
        let config = FsdpConfig {
            strategy,
            ..FsdpConfig::default()
        };
        let init: Vec<Vec<f32>> = units().iter().map(|x| vec![0.0; x.numel()]).collect();
        invalid(Fsdp::from_full(&comm, units(), config, &init).unwrap_err())
    });
    for e in &errors {
        assert!(e.contains("rank 1") && e.contains("strategy"), "{e}");
    }
    let e = run_ranks(3, |comm| {
        let config = FsdpConfig {
            strategy: Strategy::HybridShard { group: 2 },
            ..FsdpConfig::default()
        };
        invalid(Fsdp::new(&comm, units(), config, |_, _, _| {}).unwrap_err())
    });
    assert!(e[0].contains("does not divide"), "{}", e[0]);
}

/// One rank misuses the protocol (a unit gathered twice, then a gradient
/// of the wrong length) while the others do not: every rank's
/// `finish_backward` fails naming that rank and unit, nobody waits for a
/// timeout, and the next step trains normally.
#[test]
fn one_ranks_misuse_fails_the_step_on_every_rank() {
    let errors = run_ranks(3, |comm| {
        let rank = comm.rank();
        let init = narrow_all(&init_flat());
        let mut fsdp = Fsdp::from_full(&comm, units(), FsdpConfig::default(), &init).unwrap();
        for x in 0..UNITS {
            fsdp.pre_forward(x).unwrap();
            if rank == 1 && x == 1 {
                let e = invalid(fsdp.pre_forward(x).unwrap_err());
                assert!(e.contains("gathered twice"), "{e}");
            }
            fsdp.post_forward(x).unwrap();
        }
        for x in (0..UNITS).rev() {
            fsdp.pre_backward(x).unwrap();
            let len = fsdp.unit_len(x) - usize::from(rank == 2 && x == 0);
            let r = fsdp.post_backward(x, &vec![1.0; len]);
            assert_eq!(r.is_err(), rank == 2 && x == 0);
        }
        let e = invalid(fsdp.finish_backward().unwrap_err());
        assert!(
            fsdp.grad_shard(0).iter().all(|&g| g == 0.0),
            "the step is dropped"
        );
        // The next step works on every rank, and its gradient is the mean.
        for x in 0..UNITS {
            fsdp.pre_forward(x).unwrap();
            fsdp.post_forward(x).unwrap();
        }
        for x in (0..UNITS).rev() {
            fsdp.pre_backward(x).unwrap();
            fsdp.post_backward(x, &vec![(rank + 1) as f32; fsdp.unit_len(x)])
                .unwrap();
        }
        fsdp.finish_backward().unwrap();
        let r = fsdp.shard_range(1);
        for (i, &g) in fsdp.grad_shard(1).iter().enumerate() {
            let want = if r.start + i < fsdp.unit_len(1) {
                2.0
            } else {
                0.0
            };
            assert_eq!(g, want, "element {}", r.start + i);
        }
        e
    });
    for e in &errors {
        assert!(
            e.contains("rank 1") && e.contains("`fc2`") && e.contains("gathered twice"),
            "{e}"
        );
    }
}

/// Whether a prefetch is issued must not depend on timing: ranks whose
/// reductions finish at different moments still issue the same
/// collectives in the same order (a divergence is a mismatch error at
/// once) and train what one process trains. Rank 0 pauses before each
/// `post_backward`, so the others reach their next prefetch decision
/// while the reduction rank 0 has not joined yet is still in flight,
/// and rank 0 reaches its own after that reduction is done. Before
/// reductions were counted alike on every rank, this failed with "rank 0
/// called all_gather, rank 1 called reduce_scatter" (as a 4-rank run of
/// `mlp_fsdp` did under load). Eight units of a quadratic loss, so that
/// backward has prefetch decisions to make: rank r's gradient is
/// `w - t_r`, and SGD in f64 on the mean target is the reference.
#[test]
fn prefetch_decisions_do_not_depend_on_timing() {
    const N: usize = 8;
    const LR: f64 = 0.25;
    let steps = 3;
    let spec =
        |u: usize| UnitSpec::new(format!("u{u}"), vec![TensorSpec::new("w", &[37 + 11 * u])]);
    let target = |r: usize, u: usize, i: usize| ((r + 1) * (i + 3) + u) % 7;
    for limit in [2, 3, 4] {
        for ranks in [2, 3] {
            let config = FsdpConfig {
                limit_gathered: limit,
                ..FsdpConfig::default()
            };
            let got = run_ranks(ranks, |comm| {
                let rank = comm.rank();
                let units: Vec<UnitSpec> = (0..N).map(spec).collect();
                let mut fsdp =
                    Fsdp::new(&comm, units, config.clone(), |_, _, shard| shard.fill(1.0)).unwrap();
                let sgd = Optimizer::Sgd { lr: LR as f32 };
                for _ in 0..steps {
                    for u in 0..N {
                        fsdp.pre_forward(u).unwrap();
                        fsdp.params(u).unwrap();
                        fsdp.post_forward(u).unwrap();
                    }
                    for u in (0..N).rev() {
                        fsdp.pre_backward(u).unwrap();
                        let g: Vec<f32> = fsdp
                            .params(u)
                            .unwrap()
                            .iter()
                            .enumerate()
                            .map(|(i, &w)| w - 0.1 * target(rank, u, i) as f32)
                            .collect();
                        if rank == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(15));
                        }
                        fsdp.post_backward(u, &g).unwrap();
                    }
                    fsdp.finish_backward().unwrap();
                    fsdp.step(&sgd).unwrap();
                }
                fsdp.full_state(0).unwrap()
            });
            let full = got[0].as_ref().expect("rank 0 holds the full state");
            for (u, w) in full.iter().enumerate() {
                for (i, &got) in w.iter().enumerate() {
                    let t = (0..ranks)
                        .map(|r| 0.1 * target(r, u, i) as f64)
                        .sum::<f64>()
                        / ranks as f64;
                    let mut want = 1.0f64;
                    for _ in 0..steps {
                        want -= LR * (want - t);
                    }
                    let d = (f64::from(got) - want).abs();
                    assert!(
                        d <= 1e-5,
                        "limit {limit}, {ranks} ranks, unit {u} element {i}: {got} against {want}"
                    );
                }
            }
        }
    }
}

/// After a rank left, the survivors rebind their FSDP state to the
/// shrunken communicator: under FullShard the lost shard is named (rank,
/// unit, elements) before anything moves; under NoShard training goes on
/// with the same parameters (the whole model gathered back on the
/// survivors equals what they held).
#[test]
fn rebind_after_a_loss_names_the_lost_shard_or_goes_on_without_sharding() {
    let init = narrow_all(&init_flat());
    for strategy in [Strategy::FullShard, Strategy::NoShard] {
        let config = FsdpConfig {
            strategy,
            ..FsdpConfig::default()
        };
        run_ranks(3, |comm| {
            let rank = comm.rank();
            let fsdp = Fsdp::from_full(&comm, units(), config.clone(), &init).unwrap();
            if rank == 1 {
                return; // leaves: its communicator goes
            }
            let mut probe = [1f32];
            let err = comm
                .all_reduce_in_place(&mut probe, ferroccl::ReduceOp::Sum)
                .expect_err("rank 1 left");
            assert!(matches!(err, Error::PeerFailed { rank: 1, .. }), "{err:?}");
            let survivors = comm.shrink_failed().expect("shrink");
            match (strategy, fsdp.rebind(&survivors)) {
                (Strategy::FullShard, Err(Error::InvalidArgument(m))) => {
                    assert!(
                        m.contains("rank(s) [1]") && m.contains("'fc1'") && m.contains("FullShard"),
                        "{m}"
                    );
                }
                (Strategy::NoShard, Ok(again)) => {
                    let whole = again.full_state(0).unwrap();
                    if survivors.rank() == 0 {
                        assert_eq!(whole.unwrap(), init, "the parameters are kept");
                    }
                }
                (s, other) => panic!("{s:?}: {:?}", other.map(|_| ())),
            }
        });
    }
}
