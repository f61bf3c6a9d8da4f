//! The tuner: which algorithm a call uses, and its slice size.
//!
//! An alpha-beta cost model: a message costs `alpha` (latency) plus its
//! bytes over `beta` (bandwidth); combining costs bytes over the reduction
//! kernel's speed. The constants are measured on the communicator's own
//! links when it is created (`Communicator::calibrate`) and agreed by every
//! rank (the slowest rank's figures), so every rank picks the same algorithm
//! for the same call. Pure functions of sizes and constants: the
//! measurements themselves are the communicator's (`comm::setup`).

use crate::algo::Algorithm;
use crate::call::CollKind;

/// The slot size given to the model where the cost does not depend on it
/// (every collective but broadcast and reduce).
const ANY_CHUNK: usize = 512 << 10;

/// Smallest slice worth a frame of its own: below this the per-frame cost
/// dominates. 64 KiB since 2026-11-30 (32 KiB before): measured in turns
/// on the 2-core EPYC VM in its steady state (bench/bound/pingpong.c's
/// round trip 47-53 ns), 2 ranks were 1.03-1.18x faster at 128 KiB in
/// every collective and level at 32 KiB and 512 KiB-2 MiB; 4 ranks
/// 1.09-1.25x at 128-512 KiB (allreduce, allgather); TCP 1.08-1.23x at
/// 128-512 KiB in 11 of 20 cells and nowhere slower
/// (docs/performance-log.md, "64 KiB slices"). A bare staged transport
/// (bench/bound/staged.c) is faster with 64 KiB chunks than 32 too.
const MIN_SLICE_BYTES: usize = 64 * 1024;
/// Slices per ring piece we aim for, so that consecutive hops overlap.
const TARGET_SLICES: usize = 4;

/// Largest slice in bytes for a call whose pieces are `piece_bytes`, over
/// slots of `chunk_bytes`.
pub(crate) fn slice_bytes(piece_bytes: usize, chunk_bytes: usize) -> usize {
    (piece_bytes / TARGET_SLICES)
        .clamp(MIN_SLICE_BYTES.min(chunk_bytes), chunk_bytes)
        .max(8)
}

/// Measured constants of a communicator's links.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkModel {
    /// Cost of one message on the slowest link, microseconds.
    pub alpha_us: f64,
    /// Bandwidth of the slowest link, GB/s.
    pub beta_gbps: f64,
    /// Speed of the reduction kernel, GB/s of output.
    pub reduce_gbps: f64,
}

impl LinkModel {
    /// Constants used before calibration and where it is turned off: of
    /// the order of loopback TCP on a small machine (tens of microseconds
    /// a message, about 2 GB/s; docs/performance-history.md has the
    /// measurements).
    pub const DEFAULT: LinkModel = LinkModel {
        alpha_us: 15.0,
        beta_gbps: 2.0,
        reduce_gbps: 5.0,
    };
}

/// Where a communicator's ranks sit: how many hosts, and the rank count
/// of the largest (which sets the hierarchical schedules' classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Hosts the ranks are on.
    pub hosts: usize,
    /// Ranks on the largest host.
    pub largest: usize,
}

impl Layout {
    /// All `n` ranks on one host.
    pub fn one_host(n: usize) -> Layout {
        Layout {
            hosts: 1,
            largest: n,
        }
    }

    /// Whether the hierarchical algorithm applies: several hosts, several
    /// ranks on some host.
    pub fn hierarchical(self) -> bool {
        self.hosts > 1 && self.largest > 1
    }
}

/// The links of a communicator over hosts: `inter`, the slowest link of
/// the whole ring (the network, once the ranks span hosts: what
/// calibration measures), and `intra`, a link inside a host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostLinks {
    /// A link between ranks of one host.
    pub intra: LinkModel,
    /// A link between hosts (and the model of every flat algorithm).
    pub inter: LinkModel,
}

/// Modelled time of the hierarchical algorithm for `coll` of `bytes` on
/// `layout` over `links`, in microseconds; `None` where it does not
/// apply (one host, one rank a host, a collective it does not serve).
///
/// Allreduce: reduce-scatter then allgather inside the host (the largest
/// host's `m` ranks, `m - 1` hops each), and between them every class's
/// ring across the `h` hosts; those `m` rings share the host's one
/// network link, so together they move what one ring of the whole buffer
/// would, `2 (h - 1) / h` of it, in `2 (h - 1)` hops. Allgather: the
/// same across hosts (`(h - 1) / h` of the output), then inside.
/// Reduce-scatter (`bytes` the whole input, `n = h m` blocks, as the
/// flat ring's cost reads it): the schedule runs in ticks of one block a
/// rank (`hier::reduce_scatter`), `h - 1` of them across hosts, where all
/// `m` ranks of a host send over its network link at once (`m` blocks),
/// and `n - h` inside; a tick costs the slower of its transfer and its
/// combine, since the two overlap within a tick but the network idles
/// during the ticks inside a host.
pub(crate) fn hier_cost_us(
    coll: CollKind,
    layout: Layout,
    bytes: usize,
    links: &HostLinks,
) -> Option<f64> {
    if !layout.hierarchical() {
        return None;
    }
    let (i, e) = (&links.intra, &links.inter);
    let (h, m) = (layout.hosts as f64, layout.largest as f64);
    let b = bytes as f64;
    let mv = |l: &LinkModel, x: f64| x / (l.beta_gbps * 1e3);
    let red = |l: &LinkModel, x: f64| x / (l.reduce_gbps * 1e3);
    match coll {
        CollKind::AllReduce => {
            let inside = 2.0 * (m - 1.0) * i.alpha_us
                + 2.0 * (m - 1.0) / m * mv(i, b)
                + (m - 1.0) / m * red(i, b);
            let across = 2.0 * (h - 1.0) * e.alpha_us
                + 2.0 * (h - 1.0) / h * mv(e, b)
                + (h - 1.0) / h * red(e, b / m);
            Some(inside + across)
        }
        CollKind::AllGather => Some(
            (h - 1.0) * e.alpha_us
                + (h - 1.0) / h * mv(e, b)
                + (m - 1.0) * i.alpha_us
                + (m - 1.0) / m * mv(i, b),
        ),
        CollKind::ReduceScatter => {
            let n = h * m;
            let block = b / n;
            Some(
                (h - 1.0) * (e.alpha_us + mv(e, m * block).max(red(e, block)))
                    + (n - h) * (i.alpha_us + mv(i, block).max(red(i, block))),
            )
        }
        _ => None,
    }
}

/// [`choose`] on ranks spread as `layout`: the flat candidates under the
/// inter-host model, and where the layout spans hosts with several ranks
/// on one, the hierarchical algorithm too. On one host it is `choose`
/// exactly.
pub(crate) fn choose_on(
    coll: CollKind,
    layout: Layout,
    n: usize,
    sizes: (usize, usize),
    links: &HostLinks,
) -> (Algorithm, Vec<(Algorithm, f64)>) {
    choose_on_with(coll, layout, n, sizes, links, false)
}

/// [`choose_on`], on ranks that share their host's CPUs where
/// `shared_cores` ([`cost_us`]).
pub(crate) fn choose_on_with(
    coll: CollKind,
    layout: Layout,
    n: usize,
    (bytes, chunk_bytes): (usize, usize),
    links: &HostLinks,
    shared_cores: bool,
) -> (Algorithm, Vec<(Algorithm, f64)>) {
    let (flat, mut costs) = choose_with(coll, n, (bytes, chunk_bytes), &links.inter, shared_cores);
    let Some(hier) = hier_cost_us(coll, layout, bytes, links) else {
        return (flat, costs);
    };
    let best = costs
        .iter()
        .find(|c| c.0 == flat)
        .map_or(f64::INFINITY, |c| c.1);
    costs.push((Algorithm::Hierarchical, hier));
    if hier < best {
        (Algorithm::Hierarchical, costs)
    } else {
        (flat, costs)
    }
}

/// Depth of the binary trees over `n` ranks, as the allreduce's double
/// tree is costed (one more than a tree's height).
fn tree_depth(n: usize) -> f64 {
    (usize::BITS - n.max(1).leading_zeros()) as f64
}

/// Height of one binary tree over `n` ranks (`algo::tree::BinaryTree`:
/// at most `floor(log2 n)`), and the children of its root (at most two).
fn tree_shape(n: usize) -> (f64, f64) {
    let height = (usize::BITS - 1 - n.max(1).leading_zeros()) as f64;
    (height, (n.max(1) - 1).min(2) as f64)
}

/// Modelled time of `algo` for a call of `bytes` on `n` ranks over slots
/// of `chunk_bytes`, in microseconds; `None` where the algorithm does not
/// implement the call.
///
/// A broadcast or reduce moves its buffer in slices ([`slice_bytes`] of
/// the whole buffer: one slice up to 32 KiB, four up to four slots), and a
/// slice spends a tick at each hop: the chain's `n - 1` hops and the
/// tree's height `h` fill the pipeline once, then one slice ends a tick,
/// so `(hops - 1 + slices)` ticks of one slice each. A tick of the chain
/// moves and (reduce) combines one slice. In the tree a rank has up to two
/// children: a broadcast's parent sends to each in turn, a reduce's parent
/// gets both slices at once (each child sends its own) and combines both.
/// With one slice the tree's `h` ticks beat the chain's `n - 1` (on 4
/// ranks over TCP, reduce by the tree measured 1.42-1.69x faster from 32
/// to 512 KiB, where the model without the pipeline's fill chose the chain:
/// docs/performance-log.md, "The tuner's broadcast and reduce").
///
/// Where `shared_cores`, the ranks of a host outnumber its CPUs, and a
/// tree's parent does not get its two children's slices at once: the children's copies into their slots take
/// turns on the CPUs with everything else, so a reduce's tick moves and
/// combines a slice per child. On 4 ranks over 2 cores the chain's reduce
/// measured 1.34-1.74x faster than the tree's from 32 KiB to 1 MiB (the
/// Intel VM of 2026-12-01; 1.26-1.41x at 32-64 KiB on the AMD VM), where
/// the model without this chose the tree (docs/performance-log.md,
/// "The tuner's reduce on shared cores").
pub(crate) fn cost_us(
    coll: CollKind,
    algo: Algorithm,
    n: usize,
    (bytes, chunk_bytes): (usize, usize),
    m: &LinkModel,
    shared_cores: bool,
) -> Option<f64> {
    if n <= 1 {
        return Some(0.0);
    }
    let nf = n as f64;
    let a = m.alpha_us;
    // Microseconds to move / to combine `x` bytes.
    let mv = |x: f64| x / (m.beta_gbps * 1e3);
    let red = |x: f64| x / (m.reduce_gbps * 1e3);
    let b = bytes as f64;
    let d = tree_depth(n);
    Some(match (coll, algo) {
        (CollKind::AllReduce, Algorithm::Ring) => {
            2.0 * (nf - 1.0) * a + 2.0 * (nf - 1.0) / nf * mv(b) + (nf - 1.0) / nf * red(b)
        }
        // Up then down two trees, each carrying half; an interior node
        // combines two children's halves.
        (CollKind::AllReduce, Algorithm::Tree) => 2.0 * d * a + 2.0 * mv(b) + red(b),
        // Every rank sends its whole buffer to every peer and combines all.
        (CollKind::AllReduce, Algorithm::OneShot) => (nf - 1.0) * (a + mv(b)) + (nf - 1.0) * red(b),
        // log2 p rounds of one exchange of the whole buffer, plus the fold
        // in and the result back where the rank count is no power of two.
        (CollKind::AllReduce, Algorithm::RecursiveDoubling) => {
            let pow = 1usize << (usize::BITS - 1 - n.leading_zeros());
            let rounds = pow.trailing_zeros() as f64 + if pow < n { 2.0 } else { 0.0 };
            rounds * (a + mv(b)) + rounds * red(b)
        }
        (CollKind::AllReduce, Algorithm::TwoShot) => {
            2.0 * (nf - 1.0) * (a + mv(b / nf)) + (nf - 1.0) / nf * red(b)
        }
        (CollKind::Broadcast | CollKind::Reduce, Algorithm::Ring | Algorithm::Tree) => {
            let slice = slice_bytes(bytes, chunk_bytes).min(bytes.max(1));
            let slices = bytes.div_ceil(slice).max(1) as f64;
            let s = b / slices;
            let reduce = coll == CollKind::Reduce;
            let (hops, tick) = if algo == Algorithm::Ring {
                let r = if reduce { red(s) } else { 0.0 };
                (nf - 1.0, a + mv(s) + r)
            } else {
                let (height, kids) = tree_shape(n);
                let tick = if reduce {
                    let moving = if shared_cores { kids * mv(s) } else { mv(s) };
                    a + moving + kids * red(s)
                } else {
                    a + kids * mv(s)
                };
                (height, tick)
            };
            (hops - 1.0 + slices) * tick
        }
        (CollKind::AllGather, Algorithm::Ring) => (nf - 1.0) * a + (nf - 1.0) / nf * mv(b),
        // Each of the n - 1 hops moves and combines a block; the
        // pipelined slices overlap the two, so the slower one counts (the
        // hierarchical schedule's ticks are costed alike).
        (CollKind::ReduceScatter, Algorithm::Ring) => {
            (nf - 1.0) * a + (nf - 1.0) / nf * mv(b).max(red(b))
        }
        (CollKind::AllToAll, Algorithm::Ring) => (nf - 1.0) * (a + mv(b / nf)),
        (CollKind::SendRecv, Algorithm::Ring) => a + mv(b),
        (CollKind::Barrier, Algorithm::Ring) => 2.0 * nf * a,
        _ => return None,
    })
}

/// The algorithms considered for a collective, in the order ties go.
/// Recursive doubling comes before one-shot: on 2 ranks the model costs
/// both the same (one exchange of the whole buffer, the same bits on
/// every rank), and the butterfly's one receive-and-combine step measured
/// 1.06-1.12x faster than one-shot's copy and combine from 32 to 128 KiB
/// (docs/performance-log.md, "The tuner's 2-rank allreduce between
/// one-shot and recursive doubling"); elsewhere their costs differ.
fn candidates(coll: CollKind) -> &'static [Algorithm] {
    match coll {
        CollKind::AllReduce => &[
            Algorithm::Ring,
            Algorithm::Tree,
            Algorithm::RecursiveDoubling,
            Algorithm::OneShot,
            Algorithm::TwoShot,
        ],
        CollKind::Broadcast | CollKind::Reduce => &[Algorithm::Ring, Algorithm::Tree],
        _ => &[Algorithm::Ring],
    }
}

/// Whether the model chooses between algorithms for `coll` on `layout`
/// (else it runs its one algorithm, the ring).
pub(crate) fn has_choice(coll: CollKind, layout: Layout) -> bool {
    candidates(coll).len() > 1
        || (layout.hierarchical() && matches!(coll, CollKind::AllGather | CollKind::ReduceScatter))
}

/// The cheapest algorithm for a call of `bytes` over slots of
/// `chunk_bytes`, and each candidate's modelled cost.
pub(crate) fn choose(
    coll: CollKind,
    n: usize,
    sizes: (usize, usize),
    m: &LinkModel,
) -> (Algorithm, Vec<(Algorithm, f64)>) {
    choose_with(coll, n, sizes, m, false)
}

/// [`choose`], on ranks that share their host's CPUs where `shared_cores`
/// ([`cost_us`]).
pub(crate) fn choose_with(
    coll: CollKind,
    n: usize,
    (bytes, chunk_bytes): (usize, usize),
    m: &LinkModel,
    shared_cores: bool,
) -> (Algorithm, Vec<(Algorithm, f64)>) {
    let costs: Vec<(Algorithm, f64)> = candidates(coll)
        .iter()
        .filter_map(|&algo| {
            cost_us(coll, algo, n, (bytes, chunk_bytes), m, shared_cores).map(|c| (algo, c))
        })
        .collect();
    let best = costs
        .iter()
        .copied()
        .fold(None::<(Algorithm, f64)>, |best, (algo, c)| match best {
            Some((_, bc)) if bc <= c => best,
            _ => Some((algo, c)),
        })
        .map_or(Algorithm::Ring, |(algo, _)| algo);
    (best, costs)
}

/// The algorithm the tuner picks for an allreduce of `bytes` on `n` ranks
/// under `model` (`choose` for allreduce): public so that a tool can
/// set the tuner's choice beside a simulation of the same cluster
/// (`ferroccl-sim`).
pub fn choose_all_reduce(n: usize, bytes: usize, model: &LinkModel) -> Algorithm {
    // An allreduce's cost does not depend on the slot size.
    choose(CollKind::AllReduce, n, (bytes, ANY_CHUNK), model).0
}

/// The tuner's allreduce choice on ranks spread as `layout` over `links`
/// (`choose_on`), public for the same reason as [`choose_all_reduce`].
pub fn choose_all_reduce_on(
    layout: Layout,
    n: usize,
    bytes: usize,
    links: &HostLinks,
) -> Algorithm {
    choose_on(CollKind::AllReduce, layout, n, (bytes, ANY_CHUNK), links).0
}

/// The tuner's reduce-scatter choice (`choose_on`) for an input of
/// `bytes` (every rank's `n` blocks together) on ranks spread as `layout`
/// over `links`: the ring or the hierarchical schedule; public for the
/// same reason as [`choose_all_reduce`].
pub fn choose_reduce_scatter_on(
    layout: Layout,
    n: usize,
    bytes: usize,
    links: &HostLinks,
) -> Algorithm {
    choose_on(
        CollKind::ReduceScatter,
        layout,
        n,
        (bytes, ANY_CHUNK),
        links,
    )
    .0
}

/// Size class of a call for logging: its power-of-two bucket.
pub(crate) fn size_class(bytes: usize) -> u32 {
    usize::BITS - bytes.leading_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_stay_within_the_slot() {
        for piece in [0usize, 1, 1000, 1 << 20, 1 << 30] {
            for chunk in [64usize, 4096, 1 << 19] {
                let s = slice_bytes(piece, chunk);
                assert!(
                    s <= chunk.max(8) && s >= 8,
                    "piece {piece} chunk {chunk} -> {s}"
                );
            }
        }
    }

    #[test]
    fn latency_bound_calls_avoid_the_ring_and_bandwidth_bound_ones_take_it() {
        let m = LinkModel {
            alpha_us: 10.0,
            beta_gbps: 2.0,
            reduce_gbps: 5.0,
        };
        // 8 ranks, 8 bytes: the ring's 14 hops lose to log-depth or direct.
        let (small, _) = choose(CollKind::AllReduce, 8, (8, 1 << 19), &m);
        assert_ne!(small, Algorithm::Ring);
        // 8 ranks, 256 MiB: the ring moves the fewest bytes per rank.
        let (big, costs) = choose(CollKind::AllReduce, 8, (256 << 20, 1 << 19), &m);
        assert_eq!(big, Algorithm::Ring, "{costs:?}");
        // The choice is the minimum of the listed costs.
        let min = costs.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
        assert_eq!(costs.iter().find(|c| c.0 == big).map(|c| c.1), Some(min));
    }

    /// Broadcast and reduce pay the pipeline's fill: with one slice (up to
    /// 32 KiB) a reduce on 4 ranks takes the tree's 2 ticks, not the
    /// chain's 3 (the cost is the hand formula: 2 ticks of a latency, a
    /// slice's move and two combines); with many slices the chain's single
    /// child per rank wins; on 2 ranks the two are one hop alike and the
    /// tie goes to the chain.
    /// Links where a message's latency counts (20 us) against 2 GB/s
    /// moves and 5 GB/s combines, and the slot size of the tests.
    fn slow_links() -> (LinkModel, usize) {
        let m = LinkModel {
            alpha_us: 20.0,
            beta_gbps: 2.0,
            reduce_gbps: 5.0,
        };
        (m, 512 << 10)
    }

    /// On 2 ranks one-shot and recursive doubling cost the same, and the
    /// tie goes to recursive doubling; on 3 ranks (a fold in and out) and
    /// 4 (two rounds against three messages) their costs decide.
    #[test]
    fn ties_between_one_shot_and_recursive_doubling_go_to_the_butterfly() {
        let m = LinkModel {
            alpha_us: 0.3,
            beta_gbps: 12.0,
            reduce_gbps: 48.0,
        };
        let cost = |costs: &[(Algorithm, f64)], a: Algorithm| {
            costs.iter().find(|c| c.0 == a).map(|c| c.1).unwrap()
        };
        let (two, costs) = choose(CollKind::AllReduce, 2, (8 << 10, 1 << 19), &m);
        assert_eq!(
            cost(&costs, Algorithm::OneShot),
            cost(&costs, Algorithm::RecursiveDoubling),
            "{costs:?}"
        );
        assert_eq!(two, Algorithm::RecursiveDoubling, "{costs:?}");
        let (three, costs) = choose(CollKind::AllReduce, 3, (8 << 10, 1 << 19), &m);
        assert!(
            cost(&costs, Algorithm::OneShot) < cost(&costs, Algorithm::RecursiveDoubling),
            "{costs:?}"
        );
        assert_ne!(three, Algorithm::RecursiveDoubling, "{costs:?}");
        let (_, costs) = choose(CollKind::AllReduce, 4, (8 << 10, 1 << 19), &m);
        assert!(
            cost(&costs, Algorithm::RecursiveDoubling) < cost(&costs, Algorithm::OneShot),
            "{costs:?}"
        );
    }

    #[test]
    fn broadcast_and_reduce_pay_the_pipeline_fill() {
        let (m, chunk) = slow_links();
        let kib32 = 32 << 10;
        let (algo, costs) = choose(CollKind::Reduce, 4, (kib32, chunk), &m);
        assert_eq!(algo, Algorithm::Tree, "{costs:?}");
        let b = kib32 as f64;
        let want = 2.0 * (m.alpha_us + b / 2e3 + 2.0 * b / 5e3);
        let got = costs.iter().find(|c| c.0 == Algorithm::Tree).unwrap().1;
        assert!((got - want).abs() < 1e-9 * want, "{got} against {want}");
        let chain = costs.iter().find(|c| c.0 == Algorithm::Ring).unwrap().1;
        let want = 3.0 * (m.alpha_us + b / 2e3 + b / 5e3);
        assert!((chain - want).abs() < 1e-9 * want, "{chain} against {want}");
        for coll in [CollKind::Broadcast, CollKind::Reduce] {
            let (big, costs) = choose(coll, 4, (256 << 20, chunk), &m);
            assert_eq!(big, Algorithm::Ring, "{coll:?} {costs:?}");
            for bytes in [8, kib32, 1 << 20, 256 << 20] {
                let (two, costs) = choose(coll, 2, (bytes, chunk), &m);
                assert_eq!(two, Algorithm::Ring, "{coll:?} {bytes}: {costs:?}");
                assert_eq!(costs[0].1, costs[1].1, "{coll:?} {bytes}");
            }
        }
    }

    /// On ranks that outnumber their host's CPUs a reduce's tree parent
    /// moves its two children's slices one after the other: the chain
    /// wins where the tree won with a CPU for every rank (the hand
    /// formula: 2 ticks of a latency, two slices' moves and two combines),
    /// and the broadcast, whose parent always sends in turn, keeps its
    /// costs.
    #[test]
    fn a_reduce_on_shared_cores_costs_the_tree_its_children_in_turn() {
        let (m, chunk) = slow_links();
        let kib32 = 32 << 10;
        let b = kib32 as f64;
        let (algo, costs) = choose_with(CollKind::Reduce, 4, (kib32, chunk), &m, true);
        assert_eq!(algo, Algorithm::Ring, "{costs:?}");
        let tree = costs.iter().find(|c| c.0 == Algorithm::Tree).unwrap().1;
        let want = 2.0 * (m.alpha_us + 2.0 * b / 2e3 + 2.0 * b / 5e3);
        assert!((tree - want).abs() < 1e-9 * want, "{tree} against {want}");
        for bytes in [kib32, 1 << 20, 64 << 20] {
            let (algo, costs) = choose_with(CollKind::Reduce, 4, (bytes, chunk), &m, true);
            assert_eq!(algo, Algorithm::Ring, "{bytes}: {costs:?}");
            let alike = |shared| choose_with(CollKind::Broadcast, 4, (bytes, chunk), &m, shared);
            assert_eq!(alike(true), alike(false), "{bytes}");
        }
    }

    #[test]
    fn every_collective_has_a_choice_and_one_rank_costs_nothing() {
        let m = LinkModel::DEFAULT;
        for coll in [
            CollKind::AllReduce,
            CollKind::Broadcast,
            CollKind::Reduce,
            CollKind::AllGather,
        ] {
            for n in [1, 2, 3, 8, 64] {
                for bytes in [0, 8, 1 << 20] {
                    let (algo, costs) = choose(coll, n, (bytes, 1 << 19), &m);
                    assert!(candidates(coll).contains(&algo));
                    assert!(!costs.is_empty());
                    if n == 1 {
                        assert!(costs.iter().all(|c| c.1 == 0.0));
                    }
                }
            }
        }
    }
}
