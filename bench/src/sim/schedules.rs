//! The schedules a call runs, built by the library's own code
//! (`ferroccl::algo` builders, cut with `ferroccl::planner`'s slice rule
//! and split over channels with `algo::channels::split`), for every rank
//! of a simulated job.

use super::engine::{Job, DEFAULT_MAX_RUNS};
use super::model::Cluster;
use crate::coll::Coll;
use ferroccl::algo::hier::{self, HostMap};
use ferroccl::algo::ring::RingParams;
use ferroccl::algo::{channels, direct, ring, tree, Algorithm, Schedule};
use ferroccl::planner;

/// The algorithms the library has for `coll`, in [`Algorithm::ALL`]'s
/// order (the collectives without a choice run the ring).
pub fn algorithms(coll: Coll) -> &'static [Algorithm] {
    match coll {
        Coll::AllReduce => &Algorithm::ALL,
        Coll::Broadcast | Coll::Reduce => &[Algorithm::Ring, Algorithm::Tree],
        Coll::AllGather => &[Algorithm::Ring, Algorithm::Hierarchical],
        Coll::ReduceScatter => &[Algorithm::Ring, Algorithm::Hierarchical],
        Coll::AllToAll | Coll::SendRecv => &[],
    }
}

/// Rank `rank`'s schedule of `coll` by `algo` on `ranks` ranks, for a
/// block of `count` elements of `elem` bytes (the whole buffer for
/// allreduce, broadcast and reduce; one rank's block for allgather and
/// reduce-scatter), root 0, over slots of `chunk_bytes`, ring passes
/// `depth` slices deep (`RingParams::depth`). `None` where the
/// library has no such schedule. All ranks on one host (the hierarchical
/// algorithm then runs inside it alone): [`schedule_on`] places them.
pub fn schedule(
    coll: Coll,
    algo: Algorithm,
    (rank, ranks): (usize, usize),
    count: usize,
    elem: usize,
    (chunk_bytes, depth): (usize, usize),
) -> Option<Schedule> {
    schedule_on(
        coll,
        algo,
        (rank, ranks),
        count,
        elem,
        (chunk_bytes, depth),
        ranks,
    )
}

/// [`schedule`] with the ranks on hosts of `per_host` ranks (rank `r` on
/// host `r / per_host`, as the cluster model places them), which the
/// hierarchical algorithm follows.
pub fn schedule_on(
    coll: Coll,
    algo: Algorithm,
    (rank, ranks): (usize, usize),
    count: usize,
    elem: usize,
    (chunk_bytes, depth): (usize, usize),
    per_host: usize,
) -> Option<Schedule> {
    let hosts = || {
        let per_host = per_host.max(1);
        let sizes: Vec<usize> = (0..ranks.div_ceil(per_host))
            .map(|h| per_host.min(ranks - h * per_host))
            .collect();
        HostMap::from_sizes(&sizes)
    };
    let slice = match coll {
        Coll::AllReduce => planner::all_reduce_slice(algo, ranks, count, elem, chunk_bytes),
        _ => planner::block_slice(count, elem, chunk_bytes),
    };
    let p = RingParams {
        rank,
        size: ranks,
        slice,
        depth,
    };
    Some(match (coll, algo) {
        (Coll::AllReduce, Algorithm::Ring) => ring::all_reduce(p, count),
        (Coll::AllReduce, Algorithm::Tree) => tree::all_reduce(p, count),
        (Coll::AllReduce, Algorithm::OneShot) => direct::one_shot(p, count),
        (Coll::AllReduce, Algorithm::TwoShot) => direct::two_shot(p, count),
        (Coll::AllReduce, Algorithm::RecursiveDoubling) => direct::recursive_doubling(p, count),
        (Coll::ReduceScatter, Algorithm::Ring) => ring::reduce_scatter(p, count),
        (Coll::AllGather, Algorithm::Ring) => ring::all_gather(p, count),
        (Coll::AllReduce, Algorithm::Hierarchical) => {
            hier::all_reduce(&hosts(), rank, count, (slice, depth))
        }
        (Coll::AllGather, Algorithm::Hierarchical) => {
            hier::all_gather(&hosts(), rank, count, (slice, depth))
        }
        (Coll::ReduceScatter, Algorithm::Hierarchical) => {
            hier::reduce_scatter(&hosts(), rank, count, (slice, depth))
        }
        (Coll::Broadcast, Algorithm::Ring) => ring::broadcast(p, count, 0),
        (Coll::Broadcast, Algorithm::Tree) => tree::broadcast(p, count, 0),
        (Coll::Reduce, Algorithm::Ring) => ring::reduce(p, count, 0),
        (Coll::Reduce, Algorithm::Tree) => tree::reduce(p, count, 0),
        _ => return None,
    })
}

/// Every rank's schedule of `coll` by `algo` on `ranks` ranks of
/// `cluster`, for a block of `count` elements of `elem` bytes, split over
/// channels as the device executor splits a bulk call (one per 128 KiB of
/// a step, up to the cluster's `channels`; `channels = 1`, the host
/// executor, keeps one). `None` where the library has no such schedule.
pub fn job(
    cluster: &Cluster,
    coll: Coll,
    algo: Algorithm,
    ranks: usize,
    count: usize,
    elem: usize,
) -> Option<Result<Job, String>> {
    job_within(cluster, coll, algo, (ranks, count, elem), DEFAULT_MAX_RUNS)
}

/// [`job`] held to at most `max_runs` runs of steps ([`Job::max_runs`]).
pub fn job_within(
    cluster: &Cluster,
    coll: Coll,
    algo: Algorithm,
    (ranks, count, elem): (usize, usize, usize),
    max_runs: usize,
) -> Option<Result<Job, String>> {
    let channels = if cluster.channels == 1 {
        1
    } else {
        planner::bulk_channels(
            coll == Coll::AllReduce,
            ranks,
            count * elem,
            cluster.channels,
        )
    };
    let mut job = Job::new(ranks, channels);
    job.max_runs = max_runs;
    for rank in 0..ranks {
        let one = schedule_on(
            coll,
            algo,
            (rank, ranks),
            count,
            elem,
            (cluster.chunk_bytes, cluster.ring_depth()),
            cluster.ranks_per_host,
        )?;
        let split = channels::split(&one, channels);
        if let Err(e) = job.add(rank, &split, elem) {
            return Some(Err(e));
        }
    }
    Some(Ok(job))
}

/// Every rank's schedule of a call of `count` elements of `elem` bytes
/// (an allreduce's buffer, an allgather's or reduce-scatter's block) by
/// the user algorithm `user` (checked for `ranks` ranks), cut as a
/// communicator cuts it (frames of the ring's slice; one channel, as the
/// host executor runs it).
pub fn user_job(
    cluster: &Cluster,
    user: &ferroccl::algo::user::Checked,
    (ranks, count, elem): (usize, usize, usize),
    max_runs: usize,
) -> Result<Job, String> {
    let slice = match user.collective() {
        ferroccl::algo::user::Collective::AllReduce => {
            planner::all_reduce_slice(Algorithm::Ring, ranks, count, elem, cluster.chunk_bytes)
        }
        _ => planner::block_slice(count, elem, cluster.chunk_bytes),
    };
    let mut job = Job::new(ranks, 1);
    job.max_runs = max_runs;
    for rank in 0..ranks {
        job.add(rank, &user.schedule(rank, count, slice), elem)?;
    }
    Ok(job)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::engine::simulate;
    use ferroccl::algo::user::{examples::halving_doubling, Checked};

    /// An allgather and a reduce-scatter written by users are timed too,
    /// each frame cut to the ring's block slice.
    #[test]
    fn user_allgather_and_reduce_scatter_are_timed() {
        use ferroccl::algo::user::examples::{
            pairwise_reduce_scatter, recursive_doubling_allgather,
        };
        let cluster = Cluster::preset("h100").unwrap();
        for algo in [
            recursive_doubling_allgather(16),
            pairwise_reduce_scatter(16),
        ] {
            for n in [2, 8, 16] {
                let user = Checked::new(&algo, n, "test".into()).unwrap();
                for count in [1usize, 1000, 1 << 20] {
                    let job = user_job(&cluster, &user, (n, count, 4), DEFAULT_MAX_RUNS).unwrap();
                    let out = simulate(&cluster, &job).unwrap();
                    let slice = planner::block_slice(count, 4, cluster.chunk_bytes);
                    let schedules: Vec<_> =
                        (0..n).map(|r| user.schedule(r, count, slice)).collect();
                    let steps: usize = schedules.iter().map(|s| s.steps.len()).sum();
                    assert_eq!(
                        out.steps as usize, steps,
                        "{} n {n} count {count}",
                        algo.name
                    );
                    assert!(schedules
                        .iter()
                        .flat_map(|s| &s.steps)
                        .all(|s| s.len <= slice));
                    assert!(out.time_us > 0.0);
                }
            }
        }
    }

    /// A user algorithm's job holds every step of every rank's schedule
    /// (counted from the schedules the library builds) and simulates.
    #[test]
    fn a_user_algorithm_is_timed() {
        let cluster = Cluster::preset("h100").unwrap();
        let algo = halving_doubling(16);
        for n in [2, 8, 16] {
            let user = Checked::new(&algo, n, "test".into()).unwrap();
            for count in [1usize, 1000, 1 << 20] {
                let job = user_job(&cluster, &user, (n, count, 4), DEFAULT_MAX_RUNS).unwrap();
                let out = simulate(&cluster, &job).unwrap();
                let slice =
                    planner::all_reduce_slice(Algorithm::Ring, n, count, 4, cluster.chunk_bytes);
                let steps: usize = (0..n)
                    .map(|r| user.schedule(r, count, slice).steps.len())
                    .sum();
                assert_eq!(out.steps as usize, steps, "n {n} count {count}");
                assert!(out.time_us > 0.0);
            }
        }
    }
}
