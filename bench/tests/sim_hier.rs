//! Issue 20 item 1 on the simulator: the hierarchical allreduce and
//! reduce-scatter on clusters of several ranks a host, against the flat
//! algorithms, and the
//! tuner's choice between them (`planner::choose_all_reduce_on`, the
//! communicator's rule) against the simulator's fastest.
//!
//! The tuner is given the cluster as the library would calibrate it: the
//! network as the inter-host link (a message's fixed cost, the NIC's
//! bandwidth), and inside a host the bus's bandwidth with the network's
//! latency (as `Communicator::calibrate` does: the intra-host latency is
//! not measured apart).

use ferroccl::algo::Algorithm;
use ferroccl::planner::{choose_all_reduce_on, choose_reduce_scatter_on, HostLinks, Layout};
use ferroccl::LinkModel;
use ferroccl_bench::coll::Coll;
use ferroccl_bench::sim::engine::simulate;
use ferroccl_bench::sim::model::Cluster;
use ferroccl_bench::sim::schedules::job;

mod sim_grid;
use sim_grid::{sim_us, simulated_all};

fn links(c: &Cluster) -> HostLinks {
    let alpha = c.step_us + c.nic_latency_us + c.switch_latency_us;
    HostLinks {
        intra: LinkModel {
            alpha_us: alpha,
            beta_gbps: c.intra_gbytes_per_s,
            reduce_gbps: c.reduce_gbytes_per_s,
        },
        inter: LinkModel {
            alpha_us: alpha,
            beta_gbps: c.nic_gbits_per_s / 8.0,
            reduce_gbps: c.reduce_gbytes_per_s,
        },
    }
}

fn model(file: &str) -> Cluster {
    let path = format!("{}/sim/{file}", env!("CARGO_MANIFEST_DIR"));
    Cluster::parse(&std::fs::read_to_string(&path).expect("model file"))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// On the two-namespace model at 1 Gb/s the hierarchical allreduce keeps
/// a third of the flat ring's bytes off the network (1 buffer out of each
/// host instead of 1.5): the simulator must find it at least 1.3x faster
/// at 64 MiB; at 10 Gb/s, where the bus's passes weigh more, still ahead.
#[test]
fn the_hierarchy_saves_the_network_bytes_it_should() {
    let slow = model("veth-1g.conf");
    let ring = sim_us(&slow, Algorithm::Ring, 4, 64 << 20);
    let hier = sim_us(&slow, Algorithm::Hierarchical, 4, 64 << 20);
    assert!(
        ring / hier >= 1.3,
        "1 Gb/s: ring {ring:.0} us, hier {hier:.0} us"
    );
    let fast = model("veth-10g.conf");
    let ring = sim_us(&fast, Algorithm::Ring, 4, 64 << 20);
    let hier = sim_us(&fast, Algorithm::Hierarchical, 4, 64 << 20);
    assert!(ring > hier, "10 Gb/s: ring {ring:.0} us, hier {hier:.0} us");
}

fn rs_us(c: &Cluster, algo: Algorithm, n: usize, count: usize) -> f64 {
    let j = job(c, Coll::ReduceScatter, algo, n, count, 4)
        .expect("reduce-scatter has ring and hierarchical")
        .expect("one channel");
    simulate(c, &j)
        .unwrap_or_else(|e| panic!("{algo} on {n} ranks, {count} a rank: {e}"))
        .time_us
}

/// The hierarchical reduce-scatter on the two-namespace model at 1 Gb/s,
/// 16 MiB a rank: a host sends 2 blocks out instead of the flat ring's 3,
/// so the simulator must find it at least 1.3x faster.
#[test]
fn the_hierarchical_reduce_scatter_saves_a_third_of_the_network() {
    let slow = model("veth-1g.conf");
    let ring = rs_us(&slow, Algorithm::Ring, 4, 4 << 20);
    let hier = rs_us(&slow, Algorithm::Hierarchical, 4, 4 << 20);
    assert!(
        ring / hier >= 1.3,
        "1 Gb/s: ring {ring:.0} us, hier {hier:.0} us"
    );
}

/// The tuner's reduce-scatter choice against the simulator over a grid
/// (the two-namespace models, the cpu preset with 2 and 4 ranks a host;
/// 4 to 16 ranks; 1 KiB to 16 MiB a rank): where the tuner picks the
/// hierarchy it is within 15% of the ring in the simulator; where the
/// simulator finds it more than 10% faster at 256 KiB a rank and above,
/// the tuner picks it; on one host never.
///
/// Where they differ, and why that is accepted: below 256 KiB a rank the
/// simulator's hierarchy gains by latency (a hop inside a host costs 4 us
/// there, across 18 us), which the library does not measure (it costs a
/// hop inside a host like one across, as `links` does here), so the
/// tuner's choice does not change with the size: both have `n - 1` hops.
/// On the cpu preset the bus (10 GB/s) is slower than the NIC (12.5
/// GB/s) and the combine (5 GB/s) slower than both, so the ring keeps
/// large calls and the tuner keeps it for small ones too.
#[test]
fn the_tuner_picks_the_hierarchical_reduce_scatter_where_it_wins() {
    let mut clusters = vec![model("veth-1g.conf"), model("veth-10g.conf")];
    for per in [2, 4] {
        let mut cpu = Cluster::preset("cpu").unwrap();
        cpu.ranks_per_host = per;
        clusters.push(cpu);
    }
    for c in clusters {
        let l = links(&c);
        for n in [4usize, 8, 16] {
            let layout = Layout {
                hosts: n.div_ceil(c.ranks_per_host),
                largest: c.ranks_per_host.min(n),
            };
            for count in [256usize, 64 << 10, 1 << 20, 4 << 20] {
                let bytes = count * 4 * n;
                let ring = rs_us(&c, Algorithm::Ring, n, count);
                let hier = rs_us(&c, Algorithm::Hierarchical, n, count);
                let pick = choose_reduce_scatter_on(layout, n, bytes, &l);
                let line = format!(
                    "{}: {n} ranks, {count} a rank: ring {ring:.1} us, hier {hier:.1} us, tuner {pick}",
                    c.name
                );
                println!("{line}");
                if hier * 1.1 < ring && count >= 64 << 10 {
                    assert_eq!(pick, Algorithm::Hierarchical, "{line}");
                }
                if pick == Algorithm::Hierarchical {
                    assert!(
                        hier <= 1.15 * ring,
                        "the hierarchy picked where it loses: {line}"
                    );
                }
                let one = choose_reduce_scatter_on(Layout::one_host(n), n, bytes, &l);
                assert_eq!(one, Algorithm::Ring, "one host: {line}");
            }
        }
    }
}

/// Over a grid of clusters (the two-namespace models, the cpu preset with
/// 4 ranks a host), rank counts and sizes, the tuner's decision between
/// flat and hierarchical: where the simulator finds the hierarchy faster
/// than every flat algorithm by more than 10%, the tuner picks it; where
/// the tuner picks it, it is within 15% of the simulated best; on one
/// host the tuner never picks it.
///
/// Where they differ, and why that is accepted: at 10 Gb/s on 4 hosts of
/// 2 ranks, 256 KiB, the tuner picks the hierarchy and the simulator finds
/// the ring 5% faster. The network then carries nearly as much either way
/// (8 hosts would send 1.875 buffers out of a host for the ring, 1.75 for
/// the hierarchy), so the call is a near tie decided by the reductions and
/// the fill: the tuner adds every algorithm's combining time after its
/// bytes, and charges the hierarchy's phases one after the other, while
/// the simulated schedules overlap them (the phases pipelined, issue 37;
/// before that, 4 and 64 MiB on 8 and 16 ranks missed by 3-10% too). A
/// tuner change that made this worse than 15% fails here. (Which flat algorithm the tuner picks is
/// sim_tuner.rs's subject: there the 16-rank, 256 KiB call at 10 Gb/s is
/// modelled as a tree and simulated faster as a ring, by the reasons that
/// file gives.)
#[test]
fn the_tuner_picks_the_hierarchy_where_the_simulator_finds_it_faster() {
    let mut cpu = Cluster::preset("cpu").unwrap();
    cpu.ranks_per_host = 4;
    for c in [model("veth-1g.conf"), model("veth-10g.conf"), cpu] {
        let l = links(&c);
        for n in [4usize, 8, 16] {
            let layout = Layout {
                hosts: n.div_ceil(c.ranks_per_host),
                largest: c.ranks_per_host.min(n),
            };
            for bytes in [1usize << 10, 256 << 10, 4 << 20, 64 << 20] {
                let (times, best) = simulated_all(&c, n, bytes);
                let pick = choose_all_reduce_on(layout, n, bytes, &l);
                let t_pick = times.iter().find(|x| x.0 == pick).expect("listed").1;
                let ratio = t_pick / best.1;
                let line = format!(
                    "{}: {n} ranks, {bytes} B: tuner {pick} {t_pick:.1} us, simulated best {} {:.1} us ({ratio:.2}x)",
                    c.name, best.0, best.1
                );
                println!("{line}");
                let hier = times
                    .iter()
                    .find(|x| x.0 == Algorithm::Hierarchical)
                    .expect("listed")
                    .1;
                let flat = times
                    .iter()
                    .filter(|x| x.0 != Algorithm::Hierarchical)
                    .map(|x| x.1)
                    .fold(f64::INFINITY, f64::min);
                if hier * 1.1 < flat {
                    assert_eq!(pick, Algorithm::Hierarchical, "{line}");
                }
                if pick == Algorithm::Hierarchical {
                    assert!(ratio <= 1.15, "the hierarchy picked where it loses: {line}");
                }
                let one = choose_all_reduce_on(
                    Layout {
                        hosts: 1,
                        largest: n,
                    },
                    n,
                    bytes,
                    &l,
                );
                assert_ne!(one, Algorithm::Hierarchical, "one host: {line}");
            }
        }
    }
}
