//! The validation of docs/performance-log.md ("Simulator validation"): what the
//! published sources say in words, held against the simulator on the
//! preset of the machine they measured. The numbers compared are in the
//! document; these tests check the shape the sources state, which the
//! model could break. No wall-clock timing is asserted.

use ferroccl::algo::Algorithm;
use ferroccl_bench::coll::Coll;
use ferroccl_bench::sim::engine::simulate;
use ferroccl_bench::sim::model::Cluster;
use ferroccl_bench::sim::schedules::job;

fn time(cluster: &Cluster, algo: Algorithm, ranks: usize, count: usize) -> f64 {
    let j = job(cluster, Coll::AllReduce, algo, ranks, count, 4)
        .expect("the library has the schedule")
        .expect("the schedules fit the job");
    simulate(cluster, &j)
        .unwrap_or_else(|e| panic!("{ranks} ranks {algo}: {e}"))
        .time_us
}

/// NCCL 2.4's blog post (S. Jeaugey, NVIDIA, 2019-02-04), on Summit:
/// a ring's latency "scales linearly with the number of GPUs", double
/// binary trees have "a logarithmic latency", and the gap "increases with
/// the scale". On the summit preset, for an 8-byte allreduce from 96 to
/// 1,536 ranks: doubling the ranks doubles the ring's time (within 10%),
/// adds to the tree's time a step no larger than the first doubling's
/// (so its time is bounded by a multiple of log2 n, not of n), and the
/// ring/tree ratio grows at every doubling.
#[test]
fn summit_ring_latency_is_linear_and_tree_latency_logarithmic() {
    let c = Cluster::preset("summit").unwrap();
    let ranks = [96usize, 192, 384, 768, 1536];
    let ring: Vec<f64> = ranks
        .iter()
        .map(|&n| time(&c, Algorithm::Ring, n, 2))
        .collect();
    let tree: Vec<f64> = ranks
        .iter()
        .map(|&n| time(&c, Algorithm::Tree, n, 2))
        .collect();
    let first_tree_step = tree[1] - tree[0];
    assert!(first_tree_step > 0.0, "tree {tree:?}");
    for i in 1..ranks.len() {
        let r = ring[i] / ring[i - 1];
        assert!(
            (1.9..=2.1).contains(&r),
            "ring {} -> {} ranks: x{r} ({ring:?})",
            ranks[i - 1],
            ranks[i]
        );
        let step = tree[i] - tree[i - 1];
        assert!(
            step > 0.0 && step <= first_tree_step * 1.25,
            "tree {} -> {} ranks: +{step} us against +{first_tree_step} ({tree:?})",
            ranks[i - 1],
            ranks[i]
        );
        assert!(
            ring[i] / tree[i] > ring[i - 1] / tree[i - 1],
            "the ring/tree gap shrank at {} ranks: ring {ring:?} tree {tree:?}",
            ranks[i]
        );
    }
}
