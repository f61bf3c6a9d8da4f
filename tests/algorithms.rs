//! Every forced algorithm (FERROCCL_ALGO's `Config::algorithm`) end to end
//! through real communicators: allreduce on ring, double binary tree,
//! one-shot and two-shot, broadcast and reduce on the tree (and the ring
//! fallback of the algorithms they lack), against the f64 reference of
//! common/mod.rs; plus checks that the direct algorithms agree bit for bit
//! across ranks and with each other on inputs whose sums round.

mod common;

use common::{check, check_reduce, input_value, make, reference, tolerance};
use ferroccl::algo::Algorithm;
use ferroccl::testing::run_ranks_with;
use ferroccl::{Communicator, Config, Element, ReduceOp};
use half::bf16;
use std::time::Duration;

const OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg];

fn forced(algorithm: Algorithm, transport: Option<&str>) -> impl Fn(&mut Config) + Sync {
    let transport = transport.map(str::to_string);
    move |c: &mut Config| {
        c.algorithm = Some(algorithm);
        c.transport = transport.clone();
        c.timeout = Duration::from_secs(120);
    }
}

fn counts(n: usize, large: bool) -> Vec<usize> {
    let mut c = vec![0, 1, n.saturating_sub(1)];
    if large {
        c.push(1_000_003);
    }
    c.dedup();
    c
}

/// Allreduce (blocking out of place and in place, and async), then
/// broadcast and reduce to a root that moves with the count.
fn collectives<T: Element>(comm: &Communicator, count: usize) {
    let (rank, n, dt) = (comm.rank(), comm.size(), T::DTYPE);
    let algo = comm.config().algorithm;
    for op in OPS {
        let what =
            |name: &str| format!("{name} {algo:?} {dt} {op} n={n} count={count} rank={rank}");
        let want: Vec<f64> = (0..count).map(|i| reference(dt, op, n, i)).collect();
        let want = |i: usize| want[i];
        let tol = |w: f64| tolerance(dt, op, w);
        let input: Vec<T> = make(count, |i| input_value(dt, op, rank, n, i));

        let mut out = vec![T::from_f64(-99.0); count];
        comm.all_reduce(&input, &mut out, op).unwrap();
        check(&what("all_reduce"), &out, want, tol);
        let mut buf = input.clone();
        comm.all_reduce_in_place(&mut buf, op).unwrap();
        check(&what("all_reduce_in_place"), &buf, want, tol);
        let buf = comm
            .all_reduce_async(input.clone(), op)
            .unwrap()
            .wait()
            .unwrap();
        check(&what("all_reduce_async"), &buf, want, tol);

        check_reduce(comm, &input, op, (count + 1) % n, want, tol, &what);
    }
    let root = count % n;
    let tag = |r: usize, i: usize| ((r * 31 + i * 7) % 100) as f64;
    let mut buf: Vec<T> = make(count, |i| tag(rank, i));
    comm.broadcast(&mut buf, root).unwrap();
    check(
        &format!("broadcast {algo:?} {dt} n={n} count={count} rank={rank}"),
        &buf,
        |i| tag(root, i),
        |_| 0.0,
    );
}

fn every_type(comm: &Communicator, large: bool) {
    for count in counts(comm.size(), large) {
        collectives::<f32>(comm, count);
        collectives::<f64>(comm, count);
        collectives::<i32>(comm, count);
        collectives::<bf16>(comm, count);
    }
}

fn matrix(algorithm: Algorithm) {
    for n in [1usize, 2, 3, 4, 5, 8] {
        run_ranks_with(n, forced(algorithm, Some("mem")), |comm| {
            assert_eq!(comm.config().algorithm, Some(algorithm));
            every_type(&comm, true)
        });
    }
}

#[test]
fn ring_forced() {
    matrix(Algorithm::Ring);
}

#[test]
fn tree_forced() {
    matrix(Algorithm::Tree);
}

#[test]
fn one_shot_forced() {
    matrix(Algorithm::OneShot);
}

#[test]
fn two_shot_forced() {
    matrix(Algorithm::TwoShot);
}

#[test]
fn recursive_doubling_forced() {
    matrix(Algorithm::RecursiveDoubling);
}

#[test]
fn every_algorithm_over_tcp() {
    for algorithm in Algorithm::ALL {
        run_ranks_with(3, forced(algorithm, None), |comm| {
            for count in counts(3, true) {
                collectives::<f32>(&comm, count);
            }
        });
    }
}

#[test]
fn tree_broadcast_and_reduce_from_every_root() {
    let n = 5;
    run_ranks_with(n, forced(Algorithm::Tree, Some("mem")), |comm| {
        let rank = comm.rank();
        for count in [0usize, 1, 4, 1000, 1_000_003] {
            for root in 0..n {
                let what = format!("root={root} count={count} rank={rank}");
                let tag = |r: usize, i: usize| ((r * 13 + i * 3) % 50) as f64;
                let mut buf: Vec<f32> = make(count, |i| tag(rank, i));
                comm.broadcast(&mut buf, root).unwrap();
                check(
                    &format!("broadcast {what}"),
                    &buf,
                    |i| tag(root, i),
                    |_| 0.0,
                );

                let (dt, op) = (i32::DTYPE, ReduceOp::Sum);
                let input: Vec<i32> = make(count, |i| input_value(dt, op, rank, n, i));
                let mut out = if rank == root {
                    vec![-99; count]
                } else {
                    Vec::new()
                };
                comm.reduce(&input, &mut out, op, root).unwrap();
                let mut buf = input.clone();
                comm.reduce_in_place(&mut buf, op, root).unwrap();
                if rank == root {
                    check(
                        &format!("reduce {what}"),
                        &out,
                        |i| reference(dt, op, n, i),
                        |_| 0.0,
                    );
                    check(
                        &format!("reduce_in_place {what}"),
                        &buf,
                        |i| reference(dt, op, n, i),
                        |_| 0.0,
                    );
                } else {
                    assert!(
                        buf == input,
                        "reduce_in_place {what}: a non-root buffer changed"
                    );
                }
            }
        }
    });
}

/// Non-integer values whose f32 sums depend on the order of the adds.
fn ragged(rank: usize, i: usize) -> f32 {
    ((rank * 7919 + i * 104_729) % 1000) as f32 * 0.1013 + 1e-3 * rank as f32
}

/// Results of an f32 allreduce of `ragged` inputs on every rank, as bits.
fn ragged_sums(algorithm: Algorithm, n: usize, count: usize, in_place: bool) -> Vec<Vec<u32>> {
    run_ranks_with(n, forced(algorithm, Some("mem")), |comm| {
        let input: Vec<f32> = (0..count).map(|i| ragged(comm.rank(), i)).collect();
        let out = if in_place {
            let mut buf = input;
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
            buf
        } else {
            let mut out = vec![0.0; count];
            comm.all_reduce(&input, &mut out, ReduceOp::Sum).unwrap();
            out
        };
        out.iter().map(|v| v.to_bits()).collect()
    })
}

#[test]
fn every_algorithm_gives_every_rank_the_same_bits() {
    let (n, count) = (5, 100_003);
    for algorithm in Algorithm::ALL {
        for in_place in [false, true] {
            let got = ragged_sums(algorithm, n, count, in_place);
            for (rank, bits) in got.iter().enumerate() {
                assert!(
                    *bits == got[0],
                    "{algorithm:?} in_place={in_place}: rank {rank} differs from rank 0"
                );
            }
        }
    }
}

#[test]
fn direct_algorithms_add_in_rank_order() {
    let (n, count) = (6, 4099);
    let want: Vec<u32> = (0..count)
        .map(|i| {
            (1..n)
                .fold(ragged(0, i), |acc, r| acc + ragged(r, i))
                .to_bits()
        })
        .collect();
    let reversed = (0..count)
        .filter(|&i| {
            (0..n - 1)
                .rev()
                .fold(ragged(n - 1, i), |acc, r| acc + ragged(r, i))
                .to_bits()
                != want[i]
        })
        .count();
    assert!(reversed > 0, "the inputs must make the order matter");
    for algorithm in [Algorithm::OneShot, Algorithm::TwoShot] {
        for in_place in [false, true] {
            for (rank, bits) in ragged_sums(algorithm, n, count, in_place)
                .iter()
                .enumerate()
            {
                assert!(
                    *bits == want,
                    "{algorithm:?} in_place={in_place} rank {rank}: not the rank-order sum"
                );
            }
        }
    }
}

#[test]
fn forced_algorithms_match_the_ring_exactly() {
    // Exact inputs: every algorithm must give the ring's bits.
    let (n, count) = (5, 1_000_003);
    let (dt, op) = (f32::DTYPE, ReduceOp::Avg);
    let run = |algorithm: Algorithm| {
        run_ranks_with(n, forced(algorithm, Some("mem")), |comm| {
            let input: Vec<f32> = make(count, |i| input_value(dt, op, comm.rank(), n, i));
            let mut out = vec![0.0; count];
            comm.all_reduce(&input, &mut out, op).unwrap();
            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        })
    };
    let ring = run(Algorithm::Ring);
    for algorithm in [
        Algorithm::Tree,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::RecursiveDoubling,
    ] {
        assert!(
            run(algorithm) == ring,
            "{algorithm:?} differs from the ring"
        );
    }
}
