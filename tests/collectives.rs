//! Every collective x every element type x every op x ranks {1,2,3,4,5,8} x
//! counts {0, 1, ranks-1, 1000003, 4 MiB/elem + 7}, in place and out of
//! place, against an f64 reference (see common/mod.rs for why the inputs make
//! every result exact but Avg's final rounding).
//!
//! One communicator per rank count runs the whole matrix, so the test also
//! shows that hundreds of calls in a row stay in step. The matrix runs over
//! the default transports (shared memory between these thread ranks, with
//! the tuner picking algorithms); TCP runs the small counts for every rank
//! count and the whole matrix for 3 ranks; the in-process transport runs
//! the small counts.

mod common;

use common::{
    check, check_moving_collectives, check_reduce, check_reduce_scatter, input_value, make,
    reference, tag, tolerance,
};
use ferroccl::testing::{run_ranks, run_ranks_with};
use ferroccl::{Algorithm, Communicator, Element, ReduceOp};
use half::{bf16, f16};

fn counts(n: usize, elem: usize, large: bool) -> Vec<usize> {
    let mut c = vec![0, 1, n.saturating_sub(1)];
    if large {
        c.push(1_000_003);
        c.push((4 << 20) / elem + 7);
    }
    c.dedup();
    c
}

fn reducing<T: Element>(comm: &Communicator, count: usize) {
    let (rank, n, dt) = (comm.rank(), comm.size(), T::DTYPE);
    for op in ReduceOp::ALL {
        let what = |name: &str| format!("{name} {dt} {op} n={n} count={count} rank={rank}");
        let tol = |w: f64| tolerance(dt, op, w);
        // References computed once, independently of the library, and
        // shared by every check of this (type, op, count).
        let want: Vec<f64> = (0..count).map(|i| reference(dt, op, n, i)).collect();
        let want = |i: usize| want[i];
        let input: Vec<T> = make(count, |i| input_value(dt, op, rank, n, i));

        // all_reduce, out of place and in place.
        let mut out = vec![T::from_f64(-99.0); count];
        comm.all_reduce(&input, &mut out, op).unwrap();
        check(&what("all_reduce"), &out, want, tol);
        let mut buf = input.clone();
        comm.all_reduce_in_place(&mut buf, op).unwrap();
        check(&what("all_reduce_in_place"), &buf, want, tol);

        check_reduce_scatter::<T>(comm, count, op, tol, &what);

        // reduce, to a root that moves with the count.
        check_reduce(comm, &input, op, (count + 1) % n, want, tol, &what);
    }
}

fn moving<T: Element>(comm: &Communicator, count: usize) {
    let (rank, n, dt) = (comm.rank(), comm.size(), T::DTYPE);
    let what = |name: &str| format!("{name} {dt} n={n} count={count} rank={rank}");
    let exact = |_: f64| 0.0;
    check_moving_collectives::<T>(comm, count, &what);

    let mine: Vec<T> = make(count, |i| tag(rank, i));
    // send/recv between pairs (0,1), (2,3), ...; an odd last rank sits out.
    let partner = rank ^ 1;
    if partner < n {
        let mut got = vec![T::from_f64(-1.0); count];
        if rank % 2 == 0 {
            comm.send(&mine, partner).unwrap();
            comm.recv(&mut got, partner).unwrap();
        } else {
            comm.recv(&mut got, partner).unwrap();
            comm.send(&mine, partner).unwrap();
        }
        check(&what("send/recv"), &got, |i| tag(partner, i), exact);
    }
    comm.barrier().unwrap();
}

fn every_type(comm: &Communicator, large: bool) {
    macro_rules! each {
        ($($t:ty),*) => {$(
            for count in counts(comm.size(), std::mem::size_of::<$t>(), large) {
                reducing::<$t>(comm, count);
                moving::<$t>(comm, count);
            }
        )*};
    }
    each!(f32, f64, f16, bf16, i8, u8, i32, u32, i64, u64);
}

fn matrix(n: usize, transport: Option<&str>, large: bool) {
    matrix_with(n, transport, None, large);
}

fn matrix_with(n: usize, transport: Option<&str>, algorithm: Option<Algorithm>, large: bool) {
    run_ranks_with(
        n,
        |c| {
            if let Some(t) = transport {
                c.transport = Some(t.to_string());
            }
            if algorithm.is_some() {
                c.algorithm = algorithm;
            }
            c.timeout = std::time::Duration::from_secs(120);
        },
        |comm| every_type(&comm, large),
    );
}

// The tree (allreduce, broadcast, reduce) and the direct paths, forced, on
// the whole matrix; other collectives keep their ring.
#[test]
fn matrix_over_the_tree() {
    for n in [2, 3, 5, 8] {
        matrix_with(n, None, Some(Algorithm::Tree), n == 5);
    }
}
#[test]
fn small_counts_over_the_direct_algorithms() {
    for n in [2, 3, 5, 8] {
        matrix_with(n, None, Some(Algorithm::OneShot), false);
        matrix_with(n, None, Some(Algorithm::TwoShot), false);
        matrix_with(n, None, Some(Algorithm::RecursiveDoubling), false);
    }
}

#[test]
fn matrix_1_rank() {
    matrix(1, None, true);
}
#[test]
fn matrix_2_ranks() {
    matrix(2, None, true);
}

/// Two ranks of one host run a piece of at least the whole ring of slots
/// in quarter slots (`Geometry::in_shared_memory`): with slots of 128 KiB
/// (a ring of 1 MiB) and cross-memory attach off, so that every call goes
/// through them, allreduces with pieces from just under the ring to
/// twice it, and the reduce-scatters and allgathers of the same counts,
/// match the f64 reference, in place and out of place.
#[test]
fn two_ranks_run_pieces_that_fill_the_ring_in_quarter_slots() {
    run_ranks_with(
        2,
        |c| {
            c.buffsize = 1 << 20;
            c.cma = false;
            c.timeout = std::time::Duration::from_secs(120);
        },
        |comm| {
            for count in [(1 << 19) - 2, (1 << 19) + 7, (1 << 20) + 3] {
                reducing::<f32>(&comm, count);
                moving::<f32>(&comm, count);
            }
            reducing::<f64>(&comm, (1 << 18) + 5);
            moving::<u8>(&comm, (1 << 20) + 1);
        },
    );
}
#[test]
fn matrix_3_ranks() {
    matrix(3, None, true);
}
#[test]
fn matrix_4_ranks() {
    matrix(4, None, true);
}
#[test]
fn matrix_5_ranks() {
    matrix(5, None, true);
}
#[test]
fn matrix_8_ranks() {
    matrix(8, None, true);
}

// Ranks that share a host pick shared memory; TCP gets its own runs.
#[test]
fn small_counts_over_tcp() {
    for n in [2, 3, 5, 8] {
        matrix(n, Some("tcp"), false);
    }
}
#[test]
fn matrix_3_ranks_over_tcp() {
    matrix(3, Some("tcp"), true);
}

#[test]
fn small_counts_over_the_in_process_transport() {
    for n in [1, 2, 3, 4, 5, 8] {
        matrix(n, Some("mem"), false);
    }
}

// The RDMA transport over emulated verbs (ranks as threads): small counts
// on 2..8 ranks and every size on 4 with one queue pair per direction, and
// every size on 3 ranks with frames of 64 KiB and more striped over 3
// queue pairs.
#[test]
fn small_counts_over_emulated_rdma() {
    for n in [2, 3, 4, 5, 8] {
        matrix(n, Some("ib-emu"), false);
    }
}
#[test]
fn matrix_4_ranks_over_emulated_rdma() {
    matrix(4, Some("ib-emu"), true);
}
#[test]
fn matrix_3_ranks_over_emulated_rdma_striped() {
    run_ranks_with(
        3,
        |c| {
            c.transport = Some("ib-emu".into());
            c.ib.qps_per_connection = 3;
            c.timeout = std::time::Duration::from_secs(120);
        },
        |comm| every_type(&comm, true),
    );
}

/// Over `ib-emu`, a send from memory under a lease (issue 17's zero copy)
/// leaves from the caller's buffer: the emulated NIC counts every payload
/// byte as read from caller memory, and the peer gets them exactly; the
/// same send from memory under no lease is staged (no byte from caller
/// memory). Slots of 1 MiB, so every frame is over the 256 KiB threshold.
/// (No other test leases memory, so the process-wide count is this
/// test's.)
#[test]
fn leased_memory_is_sent_without_the_staging_copy_over_emulated_rdma() {
    let n = 1usize << 20;
    let value = |i: usize, k: usize| (i * 3 + k) as f32 * 0.5;
    let before = ferroccl_ib::emu_transport::stats();
    let from_caller = run_ranks_with(
        2,
        |c| {
            c.transport = Some("ib-emu".into());
            c.buffsize = 8 << 20;
        },
        |comm| {
            let stats = ferroccl_ib::emu_transport::stats;
            if comm.rank() == 0 {
                let leased: Vec<f32> = (0..n).map(|i| value(i, 1)).collect();
                let lease = ferroccl_ib::MemoryLease::declare(bytemuck::cast_slice(&leased));
                comm.send(&leased, 1).unwrap();
                drop(lease);
                comm.barrier().unwrap();
                let plain: Vec<f32> = (0..n).map(|i| value(i, 2)).collect();
                let mid = stats().user_bytes;
                comm.send(&plain, 1).unwrap();
                comm.barrier().unwrap();
                stats().user_bytes - mid
            } else {
                for k in [1, 2] {
                    let mut got = vec![0f32; n];
                    comm.recv(&mut got, 0).unwrap();
                    assert!(
                        got.iter().enumerate().all(|(i, &v)| v == value(i, k)),
                        "send {k} arrived wrong"
                    );
                    comm.barrier().unwrap();
                }
                0
            }
        },
    );
    let after = ferroccl_ib::emu_transport::stats();
    assert_eq!(from_caller[0], 0, "the send under no lease was not staged");
    assert_eq!(after.user_bytes - before.user_bytes, 4 * n as u64);
}

#[test]
fn async_calls_run_in_issue_order_between_blocking_ones() {
    run_ranks_with(
        3,
        |c| c.transport = Some("mem".into()),
        |comm| {
            let n = comm.size() as f64;
            let works: Vec<_> = (0..5)
                .map(|k| {
                    let buf = vec![(comm.rank() + k) as f64; 10_000];
                    comm.all_reduce_async(buf, ReduceOp::Sum).unwrap()
                })
                .collect();
            // A blocking call issued after the async ones runs after them.
            let mut mid = vec![1u32; 7];
            comm.all_reduce_in_place(&mut mid, ReduceOp::Sum).unwrap();
            assert_eq!(mid, vec![3u32; 7]);
            for (k, w) in works.into_iter().enumerate() {
                let got = w.wait().unwrap();
                let want = (0..3).map(|r| (r + k) as f64).sum::<f64>();
                assert!(
                    got.iter().all(|&v| v == want),
                    "async #{k}: {} != {want} (n={n})",
                    got[0]
                );
            }
        },
    );
}

/// A rank's first thread owns the issue lock (`bias::BiasedLock`) and
/// ends its turns by plain stores; a second thread of the same rank that
/// calls while the first is mid-loop revokes that bias, and calls from
/// both, blocking and async, still take one order (every rank's calls
/// are alike, so any interleaving matches) and lose no turn.
#[test]
fn a_second_thread_calling_mid_loop_takes_the_issue_lock_from_the_first() {
    for ranks in [2, 3] {
        run_ranks(ranks, |comm| {
            let n = comm.size();
            let want = (n * (n + 1) / 2) as f32;
            let mine = (comm.rank() + 1) as f32;
            // One count for every call: the threads' calls interleave
            // differently on each rank.
            let blocking = |k: usize| {
                let mut buf = vec![mine; 3];
                comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                assert!(buf.iter().all(|&v| v == want), "call {k}: {buf:?}");
            };
            // The first thread alone: it takes the bias.
            (0..200).for_each(blocking);
            std::thread::scope(|s| {
                s.spawn(|| {
                    for k in 0..100 {
                        let w = comm.all_reduce_async(vec![mine; 3], ReduceOp::Sum).unwrap();
                        let got = w.wait().unwrap();
                        assert!(got.iter().all(|&v| v == want), "async {k}: {got:?}");
                        let mut buf = vec![mine; 3];
                        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                        assert!(buf.iter().all(|&v| v == want), "second {k}: {buf:?}");
                    }
                });
                (0..300).for_each(blocking);
            });
            // The first thread alone again, through the mutex now.
            (0..50).for_each(blocking);
        });
    }
}

#[test]
fn async_in_place_allgather_and_reduce_scatter_match_f64() {
    for ranks in [2, 3, 4] {
        run_ranks(ranks, |comm| {
            let (rank, n) = (comm.rank(), comm.size());
            let count = 1000 + 7;
            let value = |r: usize, i: usize| ((r * 31 + i * 7) % 97) as f64 - 40.0;
            // Allgather: block `rank` holds the input; queued ahead of a
            // reduce-scatter, both waited for afterwards.
            let mut gather = vec![0f32; count * n];
            for i in 0..count {
                gather[rank * count + i] = value(rank, i) as f32;
            }
            let g = comm.all_gather_async(gather).unwrap();
            let scatter: Vec<f64> = (0..count * n).map(|i| value(rank, i)).collect();
            let s = comm.reduce_scatter_async(scatter, ReduceOp::Sum).unwrap();
            let gathered = g.wait().unwrap();
            for r in 0..n {
                for i in 0..count {
                    assert_eq!(
                        f64::from(gathered[r * count + i]),
                        value(r, i),
                        "block {r} element {i}"
                    );
                }
            }
            let reduced = s.wait().unwrap();
            for i in 0..count {
                let want: f64 = (0..n).map(|r| value(r, rank * count + i)).sum();
                assert_eq!(reduced[rank * count + i], want, "{n} ranks, element {i}");
            }
        });
    }
}

#[test]
fn split_makes_independent_communicators() {
    run_ranks_with(
        5,
        |c| c.transport = Some("mem".into()),
        |comm| {
            let color = if comm.rank() == 4 {
                -1
            } else {
                (comm.rank() % 2) as i32
            };
            // Reverse order inside each color through the key.
            let sub = comm.split(color, -(comm.rank() as i32)).unwrap();
            match sub {
                None => assert_eq!(comm.rank(), 4),
                Some(sub) => {
                    assert_eq!(sub.size(), 2);
                    let members: Vec<usize> = (0..4).filter(|r| r % 2 == comm.rank() % 2).collect();
                    // Highest parent rank first.
                    let want_rank = members
                        .iter()
                        .rev()
                        .position(|&r| r == comm.rank())
                        .unwrap();
                    assert_eq!(sub.rank(), want_rank);
                    let mut v = [comm.rank() as i64];
                    sub.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    assert_eq!(v[0], members.iter().map(|&r| r as i64).sum::<i64>());
                }
            }
            // The parent still works after the split.
            let mut v = [1i32];
            comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            assert_eq!(v[0], 5);
        },
    );
}

#[test]
fn non_integer_floats_match_f64_within_rounding() {
    // Ring order of summation differs from the reference's; the bound is
    // the classic (n-1) * eps * sum|x| of recursive summation.
    run_ranks_with(
        4,
        |c| c.transport = Some("mem".into()),
        |comm| {
            let n = comm.size();
            let value = |r: usize, i: usize| ((r * 7919 + i * 104729) % 1000) as f64 / 37.0 - 13.0;
            let count = 100_003;
            let send: Vec<f32> = (0..count).map(|i| value(comm.rank(), i) as f32).collect();
            let mut recv = vec![0f32; count];
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
            for (i, got) in recv.iter().enumerate() {
                let exact: f64 = (0..n).map(|r| value(r, i) as f32 as f64).sum();
                let mag: f64 = (0..n).map(|r| (value(r, i) as f32 as f64).abs()).sum();
                let bound = (n - 1) as f64 * f32::EPSILON as f64 * mag;
                assert!(
                    (*got as f64 - exact).abs() <= bound,
                    "i={i}: {got} vs {exact}"
                );
            }
        },
    );
}

/// A send completes before its receiver has even connected (ranks 0 and 2
/// are not ring neighbours, so their link is made by this call); the sender
/// then drops its communicator. The data must still arrive, as it does over
/// TCP, instead of vanishing with the sender's shared-memory segments.
#[test]
fn a_send_survives_the_sender_leaving_first() {
    for transport in [None, Some("tcp")] {
        let got = run_ranks_with(
            4,
            |c| {
                if let Some(t) = transport {
                    c.transport = Some(t.to_string());
                }
                c.timeout = std::time::Duration::from_secs(20);
            },
            |comm| match comm.rank() {
                0 => {
                    comm.send(&[1.0f32, 2.0, 3.0, 4.0], 2).unwrap();
                    None
                }
                2 => {
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    let mut buf = [0f32; 4];
                    comm.recv(&mut buf, 0).unwrap();
                    Some(buf)
                }
                _ => None,
            },
        );
        assert_eq!(
            got[2],
            Some([1.0, 2.0, 3.0, 4.0]),
            "transport {transport:?}"
        );
    }
}
