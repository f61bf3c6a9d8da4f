//! Errors: clear on the offending rank, and no hang on the others.

use crate::model::{small_buckets, specs, D_OUT, H, LENS};
use ferroccl::ddp::{Bucket, CommHook, PendingBucket, Reducer, ReducerConfig};
use ferroccl::testing::{run_ranks, run_ranks_with};
use ferroccl::{Communicator, Error, ReduceOp};
use std::time::{Duration, Instant};

/// Run 3 ranks with a short timeout; `fault(rank, reducer)` runs the step's
/// backward (possibly wrongly) before finish(). Returns each rank's finish()
/// result, then checks that a clean step afterwards gives the right average.
fn faulty_step(fault: impl Fn(usize, &mut Reducer<'_, f32>) + Sync) -> Vec<Result<(), Error>> {
    let start = Instant::now();
    let results = run_ranks_with(
        3,
        |c| c.timeout = Duration::from_secs(10),
        |comm| {
            let mut r = Reducer::<f32>::new(&comm, &specs(6), small_buckets()).unwrap();
            fault(comm.rank(), &mut r);
            let result = r.finish();
            // The next step starts clean on every rank.
            for p in (0..6).rev() {
                r.mark_ready(p, &vec![comm.rank() as f32; LENS[p]]).unwrap();
            }
            r.finish().unwrap();
            assert!(
                r.grad(0).unwrap().iter().all(|&v| v == 1.0),
                "(0 + 1 + 2) / 3"
            );
            result
        },
    );
    // Errors are found by the status exchange, not by timeouts.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    results
}

fn mark_all_but(r: &mut Reducer<'_, f32>, skip: Option<usize>) {
    for p in (0..6).rev().filter(|&p| Some(p) != skip) {
        r.mark_ready(p, &vec![1.0; LENS[p]]).unwrap();
    }
}

fn expect_blamed(results: &[Result<(), Error>], culprit: usize, local: &str, param: &str) {
    for (rank, res) in results.iter().enumerate() {
        let err = res.clone().expect_err("the step must fail on every rank");
        let text = err.to_string();
        if rank == culprit {
            assert!(
                matches!(err, Error::InvalidArgument(_)),
                "rank {rank}: {err:?}"
            );
            assert!(text.contains(local), "rank {rank}: {text}");
        } else {
            assert!(
                matches!(err, Error::PeerFailed { rank: r, .. } if r == culprit),
                "rank {rank}: {err:?}"
            );
        }
        assert!(text.contains(param), "rank {rank}: {text}");
    }
}

#[test]
fn marking_twice_fails_on_every_rank_and_names_the_parameter() {
    let results = faulty_step(|rank, r| {
        mark_all_but(r, None);
        if rank == 1 {
            let err = r.mark_ready(2, &vec![1.0; LENS[2]]).unwrap_err();
            assert!(
                err.to_string()
                    .contains("parameter 2 (W2) was marked ready twice"),
                "{err}"
            );
        }
    });
    expect_blamed(&results, 1, "marked ready twice", "W2");
}

#[test]
fn a_parameter_never_marked_fails_on_every_rank_without_hanging() {
    let results = faulty_step(|rank, r| mark_all_but(r, (rank == 2).then_some(1)));
    expect_blamed(&results, 2, "never marked ready", "b1");
}

#[test]
fn a_gradient_of_the_wrong_length_is_refused() {
    let results = faulty_step(|rank, r| {
        if rank == 0 {
            let err = r.mark_ready(3, &[1.0; H + 1]).unwrap_err();
            assert!(
                err.to_string().contains("13 elements, expected 12"),
                "{err}"
            );
        }
        mark_all_but(r, (rank == 0).then_some(3));
    });
    expect_blamed(&results, 0, "elements, expected", "b2");
}

#[test]
fn an_unknown_parameter_index_is_refused() {
    let results = faulty_step(|rank, r| {
        if rank == 2 {
            assert!(r.mark_ready(9, &[1.0]).is_err());
        }
        mark_all_but(r, None);
    });
    expect_blamed(&results, 2, "does not exist", "index 9");
}

#[test]
fn a_rank_that_gives_up_does_not_hang_the_others() {
    let start = Instant::now();
    let results = run_ranks_with(
        3,
        |c| c.timeout = Duration::from_secs(3),
        |comm| -> Result<(), Error> {
            // Set-up itself may already fail on the others if rank 1 is
            // gone before they have finished it.
            let mut r = Reducer::<f32>::new(&comm, &specs(6), small_buckets())?;
            if comm.rank() == 1 {
                // Backward fails half way; the rank returns without finish().
                r.mark_ready(5, &[1.0; D_OUT])?;
                return Ok(());
            }
            // Marks may fail too: a bucket's launch reports the
            // communicator's failure once rank 1 is gone.
            for p in (0..6).rev() {
                r.mark_ready(p, &vec![1.0; LENS[p]])?;
            }
            r.finish()
        },
    );
    for (rank, res) in results.iter().enumerate() {
        if rank != 1 {
            let err = res.clone().expect_err("rank 1 never finished the step");
            assert_eq!(err.failed_rank(), Some(1), "rank {rank}: {err}");
        }
    }
    // Bounded by the communicator timeout (3 s) plus set-up.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn ranks_with_different_parameters_are_refused_at_construction() {
    let results = run_ranks(2, |comm| {
        let n = if comm.rank() == 0 { 6 } else { 5 };
        Reducer::<f32>::new(&comm, &specs(n), ReducerConfig::default()).map(|_| ())
    });
    for (rank, res) in results.into_iter().enumerate() {
        let err = res.expect_err("different models must be refused");
        assert!(err.to_string().contains("ranks [1]"), "rank {rank}: {err}");
    }
}

/// A hook that refuses to launch on one rank.
struct FailsOnRank(usize);

impl CommHook<f32> for FailsOnRank {
    fn launch(
        &self,
        comm: &Communicator,
        bucket: Bucket<f32>,
    ) -> ferroccl::Result<PendingBucket<f32>> {
        if comm.rank() == self.0 {
            return Err(Error::InvalidArgument("hook refused".into()));
        }
        Ok(PendingBucket::from_work(
            comm.all_reduce_async(bucket, ReduceOp::Avg)?,
        ))
    }
    fn name(&self) -> &str {
        "fails_on_rank"
    }
}

#[test]
fn a_hook_failing_on_one_rank_fails_the_step_everywhere_within_the_timeout() {
    let start = Instant::now();
    let results = run_ranks_with(
        3,
        |c| c.timeout = Duration::from_secs(2),
        |comm| -> Result<(), Error> {
            let mut r = Reducer::with_hook(&comm, &specs(6), small_buckets(), FailsOnRank(1))?;
            let mut first_err = None;
            for p in (0..6).rev() {
                if let Err(e) = r.mark_ready(p, &vec![1.0; LENS[p]]) {
                    first_err.get_or_insert(e);
                }
            }
            let finished = r.finish();
            match first_err {
                Some(e) => Err(e),
                None => finished,
            }
        },
    );
    let err = results[1].clone().expect_err("rank 1's hook failed");
    assert!(err.to_string().contains("hook refused"), "{err}");
    for rank in [0, 2] {
        assert!(
            results[rank].is_err(),
            "rank {rank} must not report success"
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

/// A rank leaves in the middle of a step: the survivors' step fails naming
/// it, they shrink the communicator and rebind their reducers to it; the
/// next step averages over the survivors (checked against the mean of
/// their inputs), on the same bucket layout.
#[test]
fn a_reducer_rebound_to_the_shrunken_communicator_averages_over_the_survivors() {
    run_ranks_with(
        3,
        |c| c.timeout = Duration::from_secs(10),
        |comm| {
            let rank = comm.rank();
            let mut r = Reducer::<f32>::new(&comm, &specs(6), small_buckets()).unwrap();
            mark_all_but(&mut r, None);
            r.finish().unwrap();
            let layout = r.bucket_layout();
            if rank == 1 {
                // Half a step, then gone: its first buckets are on the wire.
                r.mark_ready(5, &vec![9.0; LENS[5]]).unwrap();
                return;
            }
            for p in (0..6).rev() {
                r.mark_ready(p, &vec![rank as f32; LENS[p]]).unwrap();
            }
            let err = r.finish().expect_err("rank 1 left mid-step");
            assert!(
                matches!(err, Error::PeerFailed { rank: 1, .. }),
                "rank {rank}: {err:?}"
            );
            let survivors = comm.shrink(&[1]).expect("shrink");
            let mut r = r.rebind(&survivors).expect("rebind");
            assert_eq!(r.bucket_layout(), layout, "the layout is kept");
            assert!(r.grad(0).is_none(), "the dropped step's gradients are gone");
            let mine = (rank * 10 + 1) as f32;
            for p in (0..6).rev() {
                r.mark_ready(p, &vec![mine; LENS[p]]).unwrap();
            }
            r.finish().unwrap();
            // Ranks 0 and 2 gave 1 and 21: their mean, not a third's.
            for p in 0..6 {
                assert!(
                    r.grad(p).unwrap().iter().all(|&v| v == 11.0),
                    "rank {rank}: parameter {p}"
                );
            }
        },
    );
}
