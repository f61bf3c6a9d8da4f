//! What the tests of the tuner against the simulator share: simulated
//! allreduce times, and the fastest algorithm among them.

use ferroccl::algo::Algorithm;
use ferroccl_bench::coll::Coll;
use ferroccl_bench::sim::engine::simulate;
use ferroccl_bench::sim::model::Cluster;
use ferroccl_bench::sim::schedules::job;

/// Simulated time of an f32 allreduce of `bytes` by `algo` on `n` ranks
/// of `c`, microseconds.
pub fn sim_us(c: &Cluster, algo: Algorithm, n: usize, bytes: usize) -> f64 {
    let j = job(c, Coll::AllReduce, algo, n, bytes / 4, 4)
        .expect("allreduce has every algorithm")
        .expect("one channel");
    simulate(c, &j)
        .unwrap_or_else(|e| panic!("{algo} on {n} ranks, {bytes} B: {e}"))
        .time_us
}

/// Every algorithm's simulated allreduce time (`sim_us`), and the fastest
/// (the first listed among equals).
pub fn simulated_all(
    c: &Cluster,
    n: usize,
    bytes: usize,
) -> (Vec<(Algorithm, f64)>, (Algorithm, f64)) {
    let times: Vec<(Algorithm, f64)> = Algorithm::ALL
        .iter()
        .map(|&a| (a, sim_us(c, a, n, bytes)))
        .collect();
    let best = times
        .iter()
        .copied()
        .fold((Algorithm::Ring, f64::INFINITY), |b, x| {
            if x.1 < b.1 {
                x
            } else {
                b
            }
        });
    (times, best)
}
