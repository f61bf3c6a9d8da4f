//! The simulator's timing model against results derived by hand here
//! (closed forms of the alpha-beta kind), contention on shared links, the
//! shipped presets, and every schedule of the library completing (no
//! deadlock) on sampled rank counts up to 4,096. No wall-clock timing is
//! asserted anywhere.

use ferroccl::algo::{Algorithm, Prim, Schedule, Step, NO_PEER};
use ferroccl_bench::coll::Coll;
use ferroccl_bench::sim::engine::{simulate, Job};
use ferroccl_bench::sim::model::{Cluster, Intra, PRESETS};
use ferroccl_bench::sim::schedules::{algorithms, job, job_within};

/// A cluster with every cost but the ones a test sets turned off.
fn plain(ranks_per_host: usize, intra: Intra) -> Cluster {
    Cluster {
        name: "test".into(),
        ranks_per_host,
        intra,
        intra_gbytes_per_s: 10.0,
        intra_latency_us: 0.7,
        nics_per_host: 1,
        nic_gbits_per_s: 40.0,
        nic_latency_us: 3.0,
        switch_latency_us: 0.25,
        hosts_per_switch: 64,
        step_us: 1.5,
        reduce_gbytes_per_s: f64::INFINITY,
        copy_gbytes_per_s: f64::INFINITY,
        chunk_bytes: 256 << 10,
        slots: 8,
        channels: 1,
        depth: 0,
    }
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-9 * want.abs().max(1.0)
}

fn time(cluster: &Cluster, coll: Coll, algo: Algorithm, ranks: usize, count: usize) -> f64 {
    let j = job(cluster, coll, algo, ranks, count, 4)
        .expect("the library has the schedule")
        .expect("the schedules fit the job");
    simulate(cluster, &j)
        .unwrap_or_else(|e| panic!("{ranks} ranks {algo}: {e}"))
        .time_us
}

/// A ring allreduce run lockstep (`depth` 1) moves each slice round the
/// ring `2(n-1)` times; a rank receives hop `k` only after its predecessor
/// sent it, and every rank finishes a slice's pass (its last step, a
/// receive) before it starts the next slice. With no contention each hop costs the step, the
/// slice's bytes over the link and the latency; the last receive costs a
/// step. So `T = sum over slices of [2(n-1)(a + s/B + L) + a]`, where the
/// planner cuts a piece of `P` bytes into slices of a quarter of it,
/// within 32 KiB and the slot.
#[test]
fn ring_allreduce_matches_the_closed_form() {
    for (ranks_per_host, hosts) in [(5, 1), (1, 2), (1, 6), (8, 1)] {
        let c = Cluster {
            depth: 1,
            ..plain(ranks_per_host, Intra::Switch)
        };
        let n = ranks_per_host * hosts;
        let (bw, lat) = if hosts == 1 {
            (c.intra_gbytes_per_s * 1e3, c.intra_latency_us)
        } else {
            (
                c.nic_gbits_per_s / 8.0 * 1e3,
                c.nic_latency_us + c.switch_latency_us,
            )
        };
        // piece bytes -> slices: 16 KiB is one slice (a quarter is below
        // 32 KiB, which covers the piece); 1 MiB is four of 256 KiB (the
        // slot); 4 MiB is sixteen of 256 KiB.
        for (piece, slices) in [(16usize << 10, 1usize), (1 << 20, 4), (4 << 20, 16)] {
            let count = n * piece / 4;
            let s = (piece / slices) as f64;
            let a = c.step_us;
            let want = slices as f64 * (2.0 * (n - 1) as f64 * (a + s / bw + lat) + a);
            let got = time(&c, Coll::AllReduce, Algorithm::Ring, n, count);
            assert!(
                close(got, want),
                "{n} ranks ({hosts} hosts), piece {piece}: {got} us, closed form {want} us"
            );
        }
    }
}

/// The ring allgather, lockstep: each slice goes `n - 1` hops (copy-send,
/// then receive-copy-send, the last a receive), `T = sum over slices of
/// [(n-1)(a + s/B + L) + a]` with slices cut from the block.
#[test]
fn ring_allgather_matches_the_closed_form() {
    let c = Cluster {
        depth: 1,
        ..plain(7, Intra::Switch)
    };
    let n = 7;
    let bw = c.intra_gbytes_per_s * 1e3;
    for (block, slices) in [(8usize << 10, 1usize), (1 << 20, 4)] {
        let s = (block / slices) as f64;
        let want = slices as f64
            * ((n - 1) as f64 * (c.step_us + s / bw + c.intra_latency_us) + c.step_us);
        let got = time(&c, Coll::AllGather, Algorithm::Ring, n, block / 4);
        assert!(
            close(got, want),
            "block {block}: {got} us, closed form {want}"
        );
    }
}

/// Pipelined slices (the library's depth for 8 slots, 4): with one slice
/// a piece nothing changes; with several, a pass no longer waits out the
/// latency of every hop of every slice, so the call is faster than the
/// lockstep closed form above, yet never below what a rank's steps cost
/// without any latency (`slices x 2(n-1)` steps of `a + s/B` each, one
/// after the other on the rank's agent).
#[test]
fn pipelined_slices_hide_latency_and_nothing_more() {
    for (ranks_per_host, hosts) in [(5, 1), (1, 6), (8, 1)] {
        let deep = plain(ranks_per_host, Intra::Switch);
        assert_eq!(deep.ring_depth(), 4);
        let lock = Cluster {
            depth: 1,
            ..deep.clone()
        };
        let n = ranks_per_host * hosts;
        let bw = if hosts == 1 {
            deep.intra_gbytes_per_s * 1e3
        } else {
            deep.nic_gbits_per_s / 8.0 * 1e3
        };
        for (piece, slices) in [(16usize << 10, 1usize), (1 << 20, 4), (4 << 20, 16)] {
            let count = n * piece / 4;
            let (p, l) = (
                time(&deep, Coll::AllReduce, Algorithm::Ring, n, count),
                time(&lock, Coll::AllReduce, Algorithm::Ring, n, count),
            );
            let s = (piece / slices) as f64;
            let floor = (slices * 2 * (n - 1)) as f64 * (deep.step_us + s / bw);
            if slices == 1 {
                assert!(
                    close(p, l),
                    "{n} ranks, one slice: {p} us pipelined, {l} lockstep"
                );
            } else {
                assert!(
                    p < l,
                    "{n} ranks, {slices} slices: {p} us pipelined, {l} lockstep"
                );
            }
            assert!(
                p >= floor,
                "{n} ranks, {slices} slices: {p} us, below the floor {floor}"
            );
        }
    }
}

/// A reduction slower than the link bounds every combining step: with
/// `reduce` at a fifth of the link, a ring reduce-scatter's hops after the
/// first (which only sends) each take `s / reduce` instead of `s / B`, and
/// its last step (a receive that combines) too.
#[test]
fn a_slow_reduction_bounds_the_combining_steps() {
    let mut c = plain(4, Intra::Switch);
    c.reduce_gbytes_per_s = c.intra_gbytes_per_s / 5.0;
    let n = 4;
    let (bw, red) = (c.intra_gbytes_per_s * 1e3, c.reduce_gbytes_per_s * 1e3);
    let block = 16usize << 10;
    let s = block as f64;
    let (a, l) = (c.step_us, c.intra_latency_us);
    // Send, then n - 2 receive-reduce-sends, then the receive-reduce-copy.
    let want = (a + s / bw + l) + (n - 2) as f64 * (a + s / red + l) + (a + s / red);
    let got = time(&c, Coll::ReduceScatter, Algorithm::Ring, n, block / 4);
    assert!(close(got, want), "{got} us, closed form {want}");
}

fn send(to: usize, len: usize) -> Step {
    Step {
        prim: Prim::Send,
        local: ferroccl::algo::Operand::Input,
        send_to: to,
        recv_from: NO_PEER,
        input: 0,
        output: 0,
        len,
        send_tag: 0,
        recv_tag: 0,
        channel: 0,
    }
}

fn recv(from: usize, len: usize) -> Step {
    Step {
        prim: Prim::Recv,
        send_to: NO_PEER,
        recv_from: from,
        ..send(0, len)
    }
}

/// `pairs` of (sender, receiver), each moving `bytes` once, on `ranks`.
fn transfers(c: &Cluster, ranks: usize, pairs: &[(usize, usize)], bytes: usize) -> f64 {
    let mut schedules = vec![Schedule::default(); ranks];
    for &(from, to) in pairs {
        schedules[from].steps.push(send(to, bytes));
        schedules[to].steps.push(recv(from, bytes));
    }
    let mut j = Job::new(ranks, 1);
    for (r, s) in schedules.iter().enumerate() {
        j.add(r, s, 1).unwrap();
    }
    simulate(c, &j).unwrap().time_us
}

/// Two transfers on one link take twice as long as one; on links of
/// their own, as long as one. Inside a host: a bus against a switch.
/// Between hosts: two ranks behind one NIC against a NIC each.
#[test]
fn transfers_that_share_a_link_take_turns() {
    let bytes = 1 << 20;
    let pairs = [(0, 1), (2, 3)];
    let bus = plain(4, Intra::Bus);
    let switch = plain(4, Intra::Switch);
    let b = bus.intra_gbytes_per_s * 1e3;
    let fixed = 2.0 * bus.step_us + bus.intra_latency_us;
    let one = transfers(&switch, 4, &pairs, bytes);
    let two = transfers(&bus, 4, &pairs, bytes);
    assert!(close(one, fixed + bytes as f64 / b), "switch: {one}");
    assert!(close(two, fixed + 2.0 * bytes as f64 / b), "bus: {two}");

    // Ranks 0 and 1 on host 0 send to ranks 2 and 3 on host 1.
    let mut shared = plain(2, Intra::Switch);
    let mut own = shared.clone();
    own.nics_per_host = 2;
    shared.nics_per_host = 1;
    let nb = shared.nic_gbits_per_s / 8.0 * 1e3;
    let fixed = 2.0 * shared.step_us + shared.nic_latency_us + shared.switch_latency_us;
    let pairs = [(0, 2), (1, 3)];
    let one = transfers(&own, 4, &pairs, bytes);
    let two = transfers(&shared, 4, &pairs, bytes);
    assert!(close(one, fixed + bytes as f64 / nb), "a NIC each: {one}");
    assert!(
        close(two, fixed + 2.0 * bytes as f64 / nb),
        "one NIC: {two}"
    );

    // Hosts under different leaves pay two switches more.
    let mut far = own.clone();
    far.hosts_per_switch = 1;
    let t = transfers(&far, 4, &pairs, bytes);
    assert!(
        close(t, fixed + 2.0 * far.switch_latency_us + bytes as f64 / nb),
        "{t}"
    );
}

/// A sender ahead of its receiver stops when the slots are full: rank 0
/// sends three frames to rank 1, which first reduces a large buffer. With
/// two slots the third send waits until rank 1 has consumed the first.
#[test]
fn a_sender_waits_for_a_free_slot() {
    let mut c = plain(2, Intra::Switch);
    c.slots = 2;
    c.reduce_gbytes_per_s = 1.0;
    let (small, big) = (1000usize, 1_000_000usize);
    let b = c.intra_gbytes_per_s * 1e3;
    let (a, l) = (c.step_us, c.intra_latency_us);
    let local = Step {
        prim: Prim::Reduce,
        send_to: NO_PEER,
        ..send(0, big)
    };
    let schedules = [
        Schedule {
            steps: vec![send(1, small), send(1, small), send(1, small)],
        },
        Schedule {
            steps: vec![local, recv(0, small), recv(0, small), recv(0, small)],
        },
    ];
    let mut j = Job::new(2, 1);
    for (r, s) in schedules.iter().enumerate() {
        j.add(r, s, 1).unwrap();
    }
    let got = simulate(&c, &j).unwrap().time_us;
    // Rank 1's reduction ends at r1; the first two frames are there by then,
    // so its receives take a step each from r1. The third frame is sent
    // once the first is released (r1 + a): it starts a step later and
    // arrives s/B + L after that, past the second receive's end.
    let r1 = a + big as f64 / (c.reduce_gbytes_per_s * 1e3);
    let third_arrives = r1 + a + a + small as f64 / b + l;
    assert!(third_arrives > r1 + 2.0 * a);
    let want = third_arrives + a;
    assert!(close(got, want), "{got} us, derived {want}");
    // With eight slots nothing waits: the third frame arrives long before.
    c.slots = 8;
    let got = simulate(&c, &j).unwrap().time_us;
    assert!(close(got, r1 + 3.0 * a), "{got} us with 8 slots");
}

/// Schedules that wait for each other forever are refused, naming the
/// ranks.
#[test]
fn a_deadlock_is_reported() {
    let c = plain(2, Intra::Switch);
    let schedules = [
        Schedule {
            steps: vec![recv(1, 8), send(1, 8)],
        },
        Schedule {
            steps: vec![recv(0, 8), send(0, 8)],
        },
    ];
    let mut j = Job::new(2, 1);
    for (r, s) in schedules.iter().enumerate() {
        j.add(r, s, 1).unwrap();
    }
    let e = simulate(&c, &j).unwrap_err();
    assert!(
        e.contains("deadlock") && e.contains("rank 0") && e.contains("rank 1"),
        "{e}"
    );
}

#[test]
fn presets_parse_and_bad_files_are_refused_with_the_line() {
    for (name, file, text) in PRESETS {
        let c = Cluster::preset(name).unwrap();
        assert_eq!(c, Cluster::parse(text).unwrap(), "{file}");
        let on_disk = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("sim")
                .join(file),
        )
        .unwrap();
        assert_eq!(on_disk, text);
    }
    let h100 = PRESETS[0].2;
    let missing: String = h100
        .lines()
        .filter(|l| !l.starts_with("slots"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(Cluster::parse(&missing).unwrap_err().contains("slots"));
    let unknown = format!("{h100}\nnvlink_gen = 4\n");
    assert!(Cluster::parse(&unknown).unwrap_err().contains("nvlink_gen"));
    let bad = h100.replace("step_us = 1.0", "step_us = fast");
    let e = Cluster::parse(&bad).unwrap_err();
    assert!(e.contains("step_us") && e.contains("line"), "{e}");
    let twice = format!("{h100}\nslots = 4\n");
    assert!(Cluster::parse(&twice).unwrap_err().contains("twice"));
    let one_slot = h100.replace("slots = 8", "slots = 1");
    assert!(Cluster::parse(&one_slot).is_err());
}

/// Every schedule the library has, for every collective the simulator
/// runs, completes on every preset (no deadlock over the preset's slots
/// and channels, every frame received) for sampled rank counts; the rank
/// counts past a few hundred take the algorithms whose steps grow slower
/// than n^2 in all (4,096 ranks), the ring to 2,048 (8 million steps; the
/// CLI runs 4,096: docs/sim.md).
#[test]
fn every_schedule_completes_on_every_preset() {
    let small = [1usize, 2, 3, 5, 8, 13, 16, 24, 64];
    for (name, ..) in PRESETS {
        let c = Cluster::preset(name).unwrap();
        for coll in [
            Coll::AllReduce,
            Coll::ReduceScatter,
            Coll::AllGather,
            Coll::Broadcast,
            Coll::Reduce,
        ] {
            for &algo in algorithms(coll) {
                for &n in &small {
                    for count in [1usize, n + 1, 3000] {
                        let t = time(&c, coll, algo, n, count);
                        assert!(t.is_finite() && t >= 0.0, "{name} {coll} {algo} {n}: {t}");
                    }
                }
            }
        }
    }
    let c = Cluster::preset("h100").unwrap();
    for (algo, ranks) in [
        (Algorithm::Tree, &[1000usize, 4096][..]),
        (Algorithm::RecursiveDoubling, &[1000, 4096]),
        (Algorithm::Ring, &[1000, 2048]),
        (Algorithm::TwoShot, &[200]),
        (Algorithm::OneShot, &[200]),
    ] {
        for &n in ranks {
            let t = time(&c, Coll::AllReduce, algo, n, 2 * n + 3);
            assert!(t > 0.0, "{algo} {n}");
        }
    }
}

/// A job that would take more runs of steps than allowed is refused
/// while it is built, not after memory ran out.
#[test]
fn a_job_past_its_memory_budget_is_refused() {
    let c = plain(8, Intra::Switch);
    // A ring allreduce of 8 ranks has 15 steps a rank and slice, in at
    // least 5 runs (send, reduce-sends, reduce-copy-send, copy-sends,
    // receive): 8 ranks need 40 or more.
    let e = job_within(&c, Coll::AllReduce, Algorithm::Ring, (8, 8 * 1000, 4), 30)
        .unwrap()
        .unwrap_err();
    assert!(e.contains("more than 30 runs"), "{e}");
    let j = job_within(&c, Coll::AllReduce, Algorithm::Ring, (8, 8 * 1000, 4), 1000)
        .unwrap()
        .unwrap();
    assert!(simulate(&c, &j).is_ok());
}
