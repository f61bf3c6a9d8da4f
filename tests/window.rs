//! Windows (`Communicator::alloc_window`): collectives straight between
//! shared buffers against the f64 reference, for several rank counts,
//! types, ops and counts, in place and out of place and at offsets; the
//! fallback to slots whenever a rank's buffers are not in the common window;
//! mismatches caught at the check-in; private windows where memory cannot
//! be shared; nothing left in /dev/shm.

mod common;

use common::{check, input_value, make, reference, tolerance, SplitMix};
use ferroccl::testing::run_ranks_with;
use ferroccl::{Communicator, Config, Element, Error, ReduceOp};
use half::bf16;
use std::time::Duration;

/// A token per test, so that its files can be told from other tests'.
fn token(seed: u64) -> u64 {
    0x5749_4e00_0000_0000 | (u64::from(std::process::id()) << 8) | seed
}

fn with_token(seed: u64) -> impl Fn(&mut Config) + Sync {
    move |c: &mut Config| {
        c.token = token(seed);
        c.timeout = Duration::from_secs(20);
    }
}

/// Files of this test's windows still in /dev/shm.
fn leftovers(seed: u64) -> Vec<String> {
    let prefix = format!("ferroccl-win-{:016x}", token(seed));
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Every reducing and gathering collective and the all-to-all with their
/// buffers in windows (so directly), checked against the reference;
/// returns how many calls ran directly and how many should have.
fn windowed<T: Element>(comm: &Communicator, counts: &[usize]) -> (u64, u64) {
    let (rank, n, dt) = (comm.rank(), comm.size(), T::DTYPE);
    let most = counts.iter().copied().max().unwrap_or(0) * n + 16;
    let mut a = comm.alloc_window::<T>(most).unwrap();
    let mut b = comm.alloc_window::<T>(most).unwrap();
    assert_eq!(a.is_shared(), n > 1, "rank {rank}: window sharing");
    assert_eq!(a.len(), most);
    assert!(a.iter().all(|v| v.to_f64() == 0.0), "windows start zeroed");
    let before = comm.direct_window_calls();
    let mut direct = 0;
    for &count in counts {
        for op in ReduceOp::ALL {
            let what = |name: &str| format!("{name} {dt} {op} n={n} count={count} rank={rank}");
            let tol = |w: f64| tolerance(dt, op, w);
            let want: Vec<f64> = (0..count).map(|i| reference(dt, op, n, i)).collect();
            let input: Vec<T> = make(count, |i| input_value(dt, op, rank, n, i));

            // Out of place, the input at an offset that differs per rank.
            let at = rank % 3;
            a[at..at + count].copy_from_slice(&input);
            b[..count].fill(T::from_f64(-99.0));
            comm.all_reduce(&a[at..at + count], &mut b[..count], op)
                .unwrap();
            check(&what("all_reduce"), &b[..count], |i| want[i], tol);
            // Out of place with the output at an offset that differs per
            // rank: with streaming stores, outputs that lie differently
            // against cache lines take the block path.
            let to = 1 + rank % 2;
            b[to..to + count].fill(T::from_f64(-99.0));
            comm.all_reduce(&a[at..at + count], &mut b[to..to + count], op)
                .unwrap();
            check(
                &what("all_reduce, offset output"),
                &b[to..to + count],
                |i| want[i],
                tol,
            );
            direct += 1;
            // In place.
            a[..count].copy_from_slice(&input);
            comm.all_reduce_in_place(&mut a[..count], op).unwrap();
            check(&what("all_reduce_in_place"), &a[..count], |i| want[i], tol);
            direct += 2;

            // reduce_scatter from a window into a plain vector, and in place.
            let big: Vec<T> = make(count * n, |i| input_value(dt, op, rank, n, i));
            let want_block = |i: usize| reference(dt, op, n, rank * count + i);
            a[..count * n].copy_from_slice(&big);
            let mut out = vec![T::from_f64(-99.0); count];
            comm.reduce_scatter(&a[..count * n], &mut out, op).unwrap();
            check(&what("reduce_scatter"), &out, want_block, tol);
            b[..count * n].copy_from_slice(&big);
            comm.reduce_scatter_in_place(&mut b[..count * n], op)
                .unwrap();
            check(
                &what("reduce_scatter_in_place"),
                &b[rank * count..(rank + 1) * count],
                want_block,
                tol,
            );
            direct += 2;
        }
        // all_gather from a plain vector into a window, and in place.
        let tag = |r: usize, i: usize| ((r * 31 + i * 7) % 100) as f64;
        let gathered = |j: usize| tag(j / count.max(1), j % count.max(1));
        let what = |name: &str| format!("{name} {dt} n={n} count={count} rank={rank}");
        let mine: Vec<T> = make(count, |i| tag(rank, i));
        b[..count * n].fill(T::from_f64(-1.0));
        comm.all_gather(&mine, &mut b[..count * n]).unwrap();
        check(&what("all_gather"), &b[..count * n], gathered, |_| 0.0);
        a[..count * n].fill(T::from_f64(-1.0));
        a[rank * count..(rank + 1) * count].copy_from_slice(&mine);
        comm.all_gather_in_place(&mut a[..count * n]).unwrap();
        check(
            &what("all_gather_in_place"),
            &a[..count * n],
            gathered,
            |_| 0.0,
        );
        direct += 2;

        // all_to_all from a plain vector into a window at an offset that
        // differs per rank: block r of rank j's output holds block j of
        // rank r's input.
        let sent = |r: usize, i: usize| ((r * 17 + i * 5) % 101) as f64;
        let send: Vec<T> = make(count * n, |i| sent(rank, i));
        let at = rank % 3;
        b[at..at + count * n].fill(T::from_f64(-1.0));
        comm.all_to_all(&send, &mut b[at..at + count * n]).unwrap();
        let c = count.max(1);
        check(
            &what("all_to_all"),
            &b[at..at + count * n],
            |i| sent(i / c, rank * count + i % c),
            |_| 0.0,
        );
        direct += 1;
    }
    let got = comm.direct_window_calls() - before;
    (got, if n == 1 { 0 } else { direct })
}

/// `streaming`: every out-of-place call writes with streaming stores
/// (FERROCCL_NT_STORE_BYTES of 1), so the fused kernels carry them.
fn matrix(n: usize, seed: u64, streaming: bool) {
    let counts = [0usize, 1, 7, 1000, 100_003];
    let config = |c: &mut Config| {
        with_token(seed)(c);
        if streaming {
            c.nt_store_bytes = 1;
        }
    };
    let results = run_ranks_with(n, config, |comm| {
        let (mut got, mut want) = (0, 0);
        for (g, w) in [
            windowed::<f32>(&comm, &counts),
            windowed::<f64>(&comm, &[1, 5003]),
            windowed::<bf16>(&comm, &[3, 4099]),
            windowed::<i32>(&comm, &[1, 5003]),
            windowed::<u8>(&comm, &[2, 9000]),
        ] {
            got += g;
            want += w;
        }
        // Other collectives still work once windows exist.
        let mut x = vec![comm.rank() as f32; 10];
        comm.broadcast(&mut x, n - 1).unwrap();
        assert!(x.iter().all(|&v| v == (n - 1) as f32));
        comm.barrier().unwrap();
        (got, want)
    });
    for (rank, (got, want)) in results.into_iter().enumerate() {
        assert_eq!(got, want, "rank {rank}: calls run directly between windows");
    }
    assert_eq!(leftovers(seed), Vec::<String>::new());
}

#[test]
fn one_rank_gets_a_private_window() {
    matrix(1, 1, false);
}

#[test]
fn two_ranks() {
    matrix(2, 2, false);
}

#[test]
fn three_ranks() {
    matrix(3, 3, false);
}

#[test]
fn two_ranks_streaming() {
    matrix(2, 20, true);
}

#[test]
fn three_ranks_streaming() {
    matrix(3, 21, true);
}

#[test]
fn four_ranks() {
    matrix(4, 4, false);
}

#[test]
fn five_ranks() {
    matrix(5, 5, false);
}

/// Any rank whose buffers are not in the common window sends the call
/// through slots, on every rank, with the same results.
#[test]
fn calls_outside_the_common_window_fall_back_to_slots() {
    let n = 3;
    let results = run_ranks_with(n, with_token(6), |comm| {
        let rank = comm.rank();
        let count = 4099;
        let op = ReduceOp::Sum;
        let want = |i: usize| reference(ferroccl::DataType::F32, op, n, i);
        let input: Vec<f32> = make(count, |i| {
            input_value(ferroccl::DataType::F32, op, rank, n, i)
        });
        let mut w1 = comm.alloc_window::<f32>(count).unwrap();
        let mut w2 = comm.alloc_window::<f32>(count).unwrap();
        let before = comm.direct_window_calls();
        // Rank 1 uses a plain vector, the others their window.
        let mut plain = input.clone();
        w1.copy_from_slice(&input);
        if rank == 1 {
            comm.all_reduce_in_place(&mut plain, op).unwrap();
            check("plain", &plain, want, |_| 0.0);
        } else {
            comm.all_reduce_in_place(&mut w1, op).unwrap();
            check("window", &w1, want, |_| 0.0);
        }
        // Each rank its own window, but not the same one.
        w1.copy_from_slice(&input);
        w2.copy_from_slice(&input);
        let target = if rank % 2 == 0 { &mut w1 } else { &mut w2 };
        comm.all_reduce_in_place(target, op).unwrap();
        check("mixed windows", target, want, |_| 0.0);
        // Async calls (their buffers are never windows) between direct ones.
        let work = comm.all_reduce_async(input.clone(), op).unwrap();
        w1.copy_from_slice(&input);
        let got = work.wait().unwrap();
        check("async", &got, want, |_| 0.0);
        comm.all_reduce_in_place(&mut w1, op).unwrap();
        check("window after async", &w1, want, |_| 0.0);
        comm.direct_window_calls() - before
    });
    assert_eq!(results, vec![1; n], "only the last call runs directly");
    assert_eq!(leftovers(6), Vec::<String>::new());
}

/// An all-to-all above the inline limit runs between windows only where
/// every rank's output lies in the common window (its input need not):
/// where one rank's does not, every rank sends it through slots, with the
/// same results, and where they all do, every rank writes its blocks
/// straight into the peers' outputs. 4 ranks, blocks of 5,000 floats.
#[test]
fn an_all_to_all_runs_between_windows_only_where_every_output_is_in_one() {
    let n = 4;
    let results = run_ranks_with(n, with_token(40), |comm| {
        let rank = comm.rank();
        let block = 5000;
        let sent = |r: usize, i: usize| (r * 100_000 + i) as f32;
        let send: Vec<f32> = (0..block * n).map(|i| sent(rank, i)).collect();
        let want = |i: usize| f64::from(sent(i / block, rank * block + i % block));
        let mut w = comm.alloc_window::<f32>(block * n + 3).unwrap();
        let before = comm.direct_window_calls();
        let mut counted = Vec::new();
        for plain_rank in [Some(2), None] {
            let what = format!("rank {rank}, rank {plain_rank:?} not in the window");
            if plain_rank == Some(rank) {
                let mut out = vec![-1f32; block * n];
                comm.all_to_all(&send, &mut out).unwrap();
                check(&what, &out, want, |_| 0.0);
            } else {
                let at = rank % 4;
                w[at..at + block * n].fill(-1.0);
                comm.all_to_all(&send, &mut w[at..at + block * n]).unwrap();
                check(&what, &w[at..at + block * n], want, |_| 0.0);
            }
            counted.push(comm.direct_window_calls() - before);
        }
        counted
    });
    for (rank, counted) in results.into_iter().enumerate() {
        // Pulled by cross-memory attach (which counts too) where the
        // calibration chose it for 20,000-byte blocks; else through slots.
        assert!(counted[0] <= 1, "rank {rank}: {counted:?}");
        assert_eq!(counted[1], counted[0] + 1, "rank {rank}: between windows");
    }
    assert_eq!(leftovers(40), Vec::<String>::new());
}

/// On 2 ranks with a window, small allgathers, allreduces and
/// all-to-alls of ordinary buffers check in (the windows lowered their
/// inline limit) and, since no rank's buffers can take the path between
/// windows, run inline after the check-in, every rank's input on its
/// page before it announced: counted with the calls that skip the slots
/// (as inline calls are). Where one rank's buffers lie in a window and
/// the other's do not, and above the inline limit without windows (16
/// KiB of input for both, 32 KiB for the all-to-alls), through slots.
/// Every result checked element by element.
#[test]
fn small_calls_of_ordinary_buffers_run_inline_after_the_check_in() {
    let n = 2;
    let results = run_ranks_with(n, with_token(8), |comm| {
        let rank = comm.rank();
        let op = ReduceOp::Sum;
        let dt = ferroccl::DataType::F32;
        let most = 5000;
        let mut w = comm.alloc_window::<f32>(2 * most).unwrap();
        let mut skipped = Vec::new();
        // (elements, inline after the check-in)
        for (count, small) in [
            (300, true),
            (1000, true),
            (2048, true),
            (4096, true),
            (5000, false),
        ] {
            let want = |i: usize| reference(dt, op, n, i);
            let input: Vec<f32> = make(count, |i| input_value(dt, op, rank, n, i));
            let before = comm.direct_window_calls();
            let mut out = vec![-99f32; count];
            comm.all_reduce(&input, &mut out, op).unwrap();
            check(&format!("all_reduce {count}"), &out, want, |v| {
                tolerance(dt, op, v)
            });
            let mut buf = input.clone();
            comm.all_reduce_in_place(&mut buf, op).unwrap();
            check(&format!("all_reduce_in_place {count}"), &buf, want, |v| {
                tolerance(dt, op, v)
            });
            let ran = comm.direct_window_calls() - before;
            skipped.push((
                format!("all_reduce {count}"),
                ran,
                if small { 2 } else { 0 },
            ));
            // Allgathers of `count / 2` elements a rank (up to 10,000 bytes:
            // inline after the check-in to 16 KiB).
            let block = count / 2;
            let tag = |r: usize, i: usize| ((r * 31 + i * 7) % 100) as f32;
            let mine: Vec<f32> = (0..block).map(|i| tag(rank, i)).collect();
            let before = comm.direct_window_calls();
            let mut got = vec![-1f32; n * block];
            comm.all_gather(&mine, &mut got).unwrap();
            let mut inplace = vec![-1f32; n * block];
            inplace[rank * block..(rank + 1) * block].copy_from_slice(&mine);
            comm.all_gather_in_place(&mut inplace).unwrap();
            for (what, v) in [("all_gather", &got), ("all_gather_in_place", &inplace)] {
                for (j, x) in v.iter().enumerate() {
                    assert_eq!(
                        *x,
                        tag(j / block, j % block),
                        "{what} {count} rank {rank} at {j}"
                    );
                }
            }
            let ran = comm.direct_window_calls() - before;
            // Up to 1 KiB inline without a check-in; up to 16 KiB inline
            // after it: counted either way.
            let inline = block * 4 <= 16 << 10;
            skipped.push((
                format!("all_gather {block}"),
                ran,
                if inline { 2 } else { 0 },
            ));
            // Reduce-scatters of `count` elements (inline up to 16 KiB
            // without windows, so after the check-in up to 4096).
            let before = comm.direct_window_calls();
            let mut block_out = vec![-99f32; block];
            comm.reduce_scatter(&input, &mut block_out, op).unwrap();
            let mine_of = |i: usize| want(rank * block + i);
            check(
                &format!("reduce_scatter {count}"),
                &block_out,
                mine_of,
                |v| tolerance(dt, op, v),
            );
            let mut buf = input.clone();
            comm.reduce_scatter_in_place(&mut buf, op).unwrap();
            check(
                &format!("reduce_scatter_in_place {count}"),
                &buf[rank * block..(rank + 1) * block],
                mine_of,
                |v| tolerance(dt, op, v),
            );
            let ran = comm.direct_window_calls() - before;
            skipped.push((
                format!("reduce_scatter {count}"),
                ran,
                if small { 2 } else { 0 },
            ));
        }
        // Rank 0's buffers in the window, rank 1's not: through slots
        // (8 KB: above the 4 KiB that runs inline whatever the windows).
        let count = 2000;
        let want = |i: usize| reference(dt, op, n, i);
        let input: Vec<f32> = make(count, |i| input_value(dt, op, rank, n, i));
        let before = comm.direct_window_calls();
        if rank == 0 {
            w[..count].copy_from_slice(&input);
            comm.all_reduce_in_place(&mut w[..count], op).unwrap();
            check("mixed, window", &w[..count], want, |v| tolerance(dt, op, v));
        } else {
            let mut buf = input.clone();
            comm.all_reduce_in_place(&mut buf, op).unwrap();
            check("mixed, plain", &buf, want, |v| tolerance(dt, op, v));
        }
        skipped.push(("mixed".into(), comm.direct_window_calls() - before, 0));
        // All-to-alls of ordinary buffers: inline up to 16 KiB of input,
        // inline after the check-in up to 32 KiB (each rank puts the
        // peer's half on its page), through slots past it; with rank 0's
        // output in the window and rank 1's not, through slots.
        let sent = |r: usize, i: usize| (r * 100_000 + i) as f32;
        for (count, skips, windowed) in [
            (4096, true, false),
            (6002, true, false),
            (8192, true, false),
            (8194, false, false),
            (6002, false, true),
        ] {
            let block = count / n;
            let send: Vec<f32> = (0..count).map(|i| sent(rank, i)).collect();
            let want = |i: usize| f64::from(sent(i / block, rank * block + i % block));
            let what = format!("all_to_all {count}, rank 0 in the window {windowed}");
            let before = comm.direct_window_calls();
            if windowed && rank == 0 {
                w[..count].fill(-1.0);
                comm.all_to_all(&send, &mut w[..count]).unwrap();
                check(&what, &w[..count], want, |_| 0.0);
            } else {
                let mut out = vec![-1f32; count];
                comm.all_to_all(&send, &mut out).unwrap();
                check(&what, &out, want, |_| 0.0);
            }
            skipped.push((what, comm.direct_window_calls() - before, u64::from(skips)));
        }
        skipped
    });
    for (rank, calls) in results.iter().enumerate() {
        for (what, ran, want) in calls {
            assert_eq!(
                ran, want,
                "rank {rank}: {what}: calls that skipped the slots"
            );
        }
    }
    assert_eq!(leftovers(8), Vec::<String>::new());
}

/// Ranks that disagree on a call find out at the check-in, before any byte
/// moves, and every rank names the other side.
#[test]
fn a_mismatch_is_caught_at_the_check_in() {
    let results = run_ranks_with(
        2,
        |c| {
            c.token = token(7);
            c.timeout = Duration::from_secs(5);
        },
        |comm| {
            let mut w = comm.alloc_window::<f32>(100).unwrap();
            let count = 50 + comm.rank();
            let started = std::time::Instant::now();
            let err = comm
                .all_reduce_in_place(&mut w[..count], ReduceOp::Sum)
                .unwrap_err();
            (err, started.elapsed())
        },
    );
    for (rank, (err, took)) in results.into_iter().enumerate() {
        match &err {
            Error::Mismatch {
                peer,
                local,
                remote,
            } => {
                assert_eq!(*peer, 1 - rank, "rank {rank}: {err}");
                assert!(local.contains(&format!("{} elements", 50 + rank)), "{err}");
                assert!(remote.contains(&format!("{} elements", 51 - rank)), "{err}");
            }
            other => panic!("rank {rank}: expected a mismatch, got {other}"),
        }
        assert!(took < Duration::from_secs(4), "rank {rank} took {took:?}");
    }
}

/// Broadcast and reduce have no path between windows: with their buffers
/// in a window they go through slots as with ordinary buffers, without a
/// check-in (the count of calls that skipped the slots does not move), with
/// the reference's results, on 2 and 3 ranks from every root. A windowed
/// broadcast against a windowed allreduce is still an error on both ranks
/// (the allreduce's check-in finds the broadcast's note: a mismatch).
/// Broadcasts and reduces from every root with their buffers in windows
/// (so directly: each rank moves one piece), against the reference;
/// returns how many calls ran directly and how many should have. The
/// non-roots' reduce outputs must stay as they were, and only the root's
/// output need lie in a window (the others pass plain vectors).
fn rooted<T: Element>(comm: &Communicator, counts: &[usize]) -> (u64, u64) {
    let (rank, n, dt) = (comm.rank(), comm.size(), T::DTYPE);
    let most = counts.iter().copied().max().unwrap_or(0) + 4;
    let mut a = comm.alloc_window::<T>(most).unwrap();
    let mut b = comm.alloc_window::<T>(most).unwrap();
    let before = comm.direct_window_calls();
    let mut direct = 0;
    let value = |r: usize, i: usize| ((r * 31 + i * 7) % 100) as f64;
    for &count in counts {
        for root in 0..n {
            let what =
                |name: &str| format!("{name} {dt} n={n} count={count} root={root} rank={rank}");
            // In place, at an offset that differs per rank.
            let at = rank % 3;
            let mine: Vec<T> = make(count, |i| if rank == root { value(root, i) } else { -1.0 });
            a[at..at + count].copy_from_slice(&mine);
            comm.broadcast(&mut a[at..at + count], root).unwrap();
            check(
                &what("broadcast"),
                &a[at..at + count],
                |i| value(root, i),
                |_| 0.0,
            );
            direct += 1;
            // In place at one offset on every rank: the outputs lie alike
            // against cache lines, so with streaming stores the root's
            // piece streams to every output in one pass.
            a[1..1 + count].copy_from_slice(&mine);
            comm.broadcast(&mut a[1..1 + count], root).unwrap();
            check(
                &what("broadcast at one offset"),
                &a[1..1 + count],
                |i| value(root, i),
                |_| 0.0,
            );
            direct += 1;
            for op in ReduceOp::ALL {
                let what = |name: &str| format!("{} {op}", what(name));
                let tol = |w: f64| tolerance(dt, op, w);
                let input: Vec<T> = make(count, |i| input_value(dt, op, rank, n, i));
                let want = |i: usize| reference(dt, op, n, i);
                // Out of place: the root's output in window b at an offset,
                // the others' in plain vectors that must stay untouched.
                a[at..at + count].copy_from_slice(&input);
                let to = 1 + rank % 2;
                let mut plain = vec![T::from_f64(99.0); count];
                b[to..to + count].fill(T::from_f64(99.0));
                let out = if rank == root {
                    &mut b[to..to + count]
                } else {
                    &mut plain[..]
                };
                comm.reduce(&a[at..at + count], out, op, root).unwrap();
                if rank == root {
                    check(&what("reduce"), &b[to..to + count], want, tol);
                } else {
                    check(&what("reduce, non-root output"), &plain, |_| 99.0, |_| 0.0);
                }
                direct += 1;
                // In place in window a.
                a[at..at + count].copy_from_slice(&input);
                comm.reduce_in_place(&mut a[at..at + count], op, root)
                    .unwrap();
                if rank == root {
                    check(&what("reduce_in_place"), &a[at..at + count], want, tol);
                } else {
                    check(
                        &what("reduce_in_place, non-root"),
                        &a[at..at + count],
                        |i| input[i].to_f64(),
                        |_| 0.0,
                    );
                }
                direct += 1;
            }
        }
    }
    let got = comm.direct_window_calls() - before;
    (got, if n == 1 { 0 } else { direct })
}

/// Counts above every inline limit (16 KiB on 2 ranks) and the path's
/// thresholds: the path between windows, not the check-in's inline
/// exchange or the slots.
fn rooted_matrix(n: usize, seed: u64, streaming: bool) {
    let results = run_ranks_with(
        n,
        |c: &mut Config| {
            with_token(seed)(c);
            if streaming {
                c.nt_store_bytes = 1;
            }
        },
        |comm| {
            let (mut got, mut want) = (0, 0);
            // On more than 2 ranks from 32 KiB (the broadcast's and the
            // reduce's threshold, `plan::host::window_path_from`; 32,800
            // bytes here); on 2 from the inline limit.
            let small = if n == 2 { 5003 } else { 8_200 };
            for (g, w) in [
                rooted::<f32>(&comm, &[small, 100_003]),
                rooted::<f64>(&comm, &[16_411]),
                rooted::<bf16>(&comm, &[65_601]),
                rooted::<i32>(&comm, &[32_771]),
                rooted::<u8>(&comm, &[131_075]),
            ] {
                got += g;
                want += w;
            }
            (got, want)
        },
    );
    for (rank, (got, want)) in results.into_iter().enumerate() {
        assert_eq!(
            got, want,
            "rank {rank}: broadcasts and reduces run directly between windows"
        );
    }
    assert_eq!(leftovers(seed), Vec::<String>::new());
}

#[test]
fn broadcast_and_reduce_between_windows_two_ranks() {
    rooted_matrix(2, 30, false);
}

#[test]
fn broadcast_and_reduce_between_windows_three_ranks_streaming() {
    rooted_matrix(3, 31, true);
}

#[test]
fn broadcast_and_reduce_between_windows_four_ranks() {
    rooted_matrix(4, 32, false);
}

/// Ranks that disagree on the call both check in (both have a path between
/// windows) and both hear of the mismatch there.
#[test]
fn a_windowed_broadcast_against_an_allreduce_is_a_mismatch_on_both_ranks() {
    let count = 100_000;
    let results = run_ranks_with(2, with_token(34), |comm| {
        let mut w = comm.alloc_window::<f32>(count).unwrap();
        if comm.rank() == 0 {
            comm.broadcast(&mut w[..], 0)
        } else {
            comm.all_reduce_in_place(&mut w[..], ReduceOp::Sum)
        }
    });
    assert!(results[0].is_err(), "rank 0: {:?}", results[0]);
    match &results[1] {
        Err(Error::Mismatch { peer, .. }) => assert_eq!(*peer, 0, "{:?}", results[1]),
        other => panic!("rank 1: expected a mismatch with rank 0, got {other:?}"),
    }
    assert_eq!(leftovers(34), Vec::<String>::new());
}

/// Over TCP (forced) the ranks do not share memory: private windows, the
/// usual path, the same results.
#[test]
fn forced_tcp_gives_private_windows() {
    let results = run_ranks_with(
        2,
        |c| {
            c.token = token(8);
            c.transport = Some("tcp".into());
        },
        |comm| {
            let mut w = comm.alloc_window::<i64>(1000).unwrap();
            assert!(!w.is_shared());
            assert_eq!(w.id(), 0);
            for (i, v) in w.iter_mut().enumerate() {
                *v = (i * (comm.rank() + 1)) as i64;
            }
            comm.all_reduce_in_place(&mut w, ReduceOp::Sum).unwrap();
            check("tcp", &w, |i| (i * 3) as f64, |_| 0.0);
            comm.direct_window_calls()
        },
    );
    assert_eq!(results, vec![0, 0]);
}

/// A window dropped on every rank can be replaced by another; many
/// windows can live at once.
#[test]
fn windows_come_and_go() {
    let n = 2;
    run_ranks_with(n, with_token(9), |comm| {
        let mut keep = Vec::new();
        for round in 0..20usize {
            let mut w = comm.alloc_window::<u32>(64 + round).unwrap();
            w.fill(comm.rank() as u32 + round as u32);
            comm.all_reduce_in_place(&mut w, ReduceOp::Sum).unwrap();
            let want = (2 * round + 1) as f64;
            check("round", &w, |_| want, |_| 0.0);
            if round % 4 == 0 {
                keep.push(w);
            }
        }
        for w in &mut keep {
            comm.all_reduce_in_place(w, ReduceOp::Max).unwrap();
        }
    });
    assert_eq!(leftovers(9), Vec::<String>::new());
}

/// A call of a size routed inline before the communicator had a window
/// (8 KiB of allreduce on 2 ranks) and routed to the path between windows
/// once it has one (`comm::routes`: the first window moves the facts'
/// epoch on) is right before, between windows, and of ordinary buffers
/// after.
#[test]
fn a_repeated_call_is_right_before_and_after_the_first_window() {
    let n = 2;
    let count = 2048;
    run_ranks_with(n, with_token(41), |comm| {
        let (rank, op, dt) = (comm.rank(), ReduceOp::Sum, ferroccl::DataType::F32);
        let want = |i: usize| reference(dt, op, n, i);
        let tol = |v: f64| tolerance(dt, op, v);
        let input: Vec<f32> = make(count, |i| input_value(dt, op, rank, n, i));
        let mut out = vec![0f32; count];
        for round in 0..3 {
            out.fill(-99.0);
            comm.all_reduce(&input, &mut out, op).unwrap();
            check(
                &format!("before the window, round {round}"),
                &out,
                want,
                tol,
            );
        }
        let mut w = comm.alloc_window::<f32>(2 * count).unwrap();
        for round in 0..3 {
            let (a, b) = w.split_at_mut(count);
            a.copy_from_slice(&input);
            b.fill(-99.0);
            comm.all_reduce(a, b, op).unwrap();
            check(&format!("between windows, round {round}"), b, want, tol);
            out.fill(-99.0);
            comm.all_reduce(&input, &mut out, op).unwrap();
            check(
                &format!("ordinary buffers after, round {round}"),
                &out,
                want,
                tol,
            );
        }
    });
    assert_eq!(leftovers(41), Vec::<String>::new());
}

/// A long random sequence of calls on 4 ranks in which each rank, per
/// call, picks window or plain buffers and offsets from a shared seed
/// (so ranks sometimes agree on the direct path and sometimes not), mixed
/// with calls that never go direct: every result is checked, and the count
/// of direct calls matches what the choices imply.
#[test]
fn random_mixtures_of_direct_and_slot_calls_stay_in_step() {
    let n = 4;
    let results = run_ranks_with(n, with_token(10), |comm| {
        let rank = comm.rank();
        let dt = ferroccl::DataType::F32;
        let mut a = comm.alloc_window::<f32>(40_000).unwrap();
        let mut b = comm.alloc_window::<f32>(40_000).unwrap();
        let before = comm.direct_window_calls();
        let mut rng = SplitMix(10);
        let mut next = move |m: u64| rng.below(m);
        let mut direct = 0u64;
        for call in 0..300 {
            let count = [1usize, 3, 64, 1000, 9000][next(5) as usize];
            // Per rank: in a window or not (the same draws on every rank).
            let windowed: Vec<bool> = (0..n).map(|_| next(4) != 0).collect();
            let all = windowed.iter().all(|&w| w);
            let at = next(7) as usize + rank;
            let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min][next(3) as usize];
            let what = format!("call {call} count {count} rank {rank} {windowed:?}");
            let input: Vec<f32> = make(count * n, |i| input_value(dt, op, rank, n, i));
            match next(4) {
                0 => {
                    let want = |i: usize| reference(dt, op, n, i);
                    if windowed[rank] {
                        a[at..at + count].copy_from_slice(&input[..count]);
                        comm.all_reduce_in_place(&mut a[at..at + count], op)
                            .unwrap();
                        check(&what, &a[at..at + count], want, |_| 0.0);
                    } else {
                        let mut v = input[..count].to_vec();
                        comm.all_reduce_in_place(&mut v, op).unwrap();
                        check(&what, &v, want, |_| 0.0);
                    }
                    // Up to 4 KiB an allreduce travels inline in the
                    // check-in, windows or not; from 16 KiB to 8 MiB on 4
                    // ranks it goes through the staging areas where not
                    // every rank's buffer lies in the window.
                    let staged = n >= 4 && (16 << 10..=8 << 20).contains(&(count * 4));
                    direct += u64::from(all || count * 4 <= 4096 || staged);
                }
                1 => {
                    let want = |i: usize| reference(dt, op, n, rank * count + i);
                    let mut out = vec![-1f32; count];
                    if windowed[rank] {
                        b[at..at + count * n].copy_from_slice(&input);
                        comm.reduce_scatter(&b[at..at + count * n], &mut out, op)
                            .unwrap();
                    } else {
                        comm.reduce_scatter(&input, &mut out, op).unwrap();
                    }
                    check(&what, &out, want, |_| 0.0);
                    // On 4 ranks a reduce-scatter with an input of at most
                    // 16 KiB runs inline in the check-in, windows or not.
                    direct += u64::from(all || count * n * 4 <= 16 << 10);
                }
                2 => {
                    let mine = &input[..count];
                    let want = |j: usize| input_value(dt, op, j / count, n, j % count);
                    if windowed[rank] {
                        comm.all_gather(mine, &mut a[at..at + count * n]).unwrap();
                        check(&what, &a[at..at + count * n], want, |_| 0.0);
                    } else {
                        let mut out = vec![-1f32; count * n];
                        comm.all_gather(mine, &mut out).unwrap();
                        check(&what, &out, want, |_| 0.0);
                    }
                    // Inline, between windows, or through the staging
                    // areas (plain buffers past 16 KiB on 4 ranks).
                    direct += u64::from(all || count * 4 <= 4096 || count * 4 > 16 << 10);
                }
                _ => {
                    let root = next(n as u64) as usize;
                    let mut v: Vec<f32> = make(count, |i| input_value(dt, op, rank, n, i));
                    comm.broadcast(&mut v, root).unwrap();
                    check(&what, &v, |i| input_value(dt, op, root, n, i), |_| 0.0);
                    // Plain buffers: inline up to 16 KiB, through the
                    // root's staging area past it (4 ranks).
                    direct += u64::from(count * 4 <= 4096 || count * 4 > 16 << 10);
                }
            }
        }
        (comm.direct_window_calls() - before, direct)
    });
    for (rank, (got, want)) in results.into_iter().enumerate() {
        assert_eq!(got, want, "rank {rank}: direct calls");
        assert!(want > 50, "the draws should give direct calls too");
    }
}

/// A window handed to `all_reduce_async` runs directly, like a blocking
/// call on it, and comes back with the result; a barrier needs no slots.
#[test]
fn async_allreduce_on_a_window_runs_directly() {
    let n = 3;
    let results = run_ranks_with(n, with_token(11), |comm| {
        let mut w = comm.alloc_window::<f64>(10_007).unwrap();
        for (i, v) in w.iter_mut().enumerate() {
            *v = (i % 13) as f64 * (comm.rank() + 1) as f64;
        }
        let before = comm.direct_window_calls();
        let work = comm.all_reduce_async(w, ReduceOp::Sum).unwrap();
        let w = work.wait().unwrap();
        check("async window", &w, |i| (i % 13) as f64 * 6.0, |_| 0.0);
        // A barrier is the check-in alone.
        comm.barrier().unwrap();
        comm.direct_window_calls() - before
    });
    assert_eq!(results, vec![2; n]);
    assert_eq!(leftovers(11), Vec::<String>::new());
}

/// Windows of a split communicator are its own: sub-communicators of the
/// same ranks allocate and reduce directly side by side, and the parent
/// (which has no window) still sends a large call through slots.
#[test]
fn split_communicators_have_their_own_windows() {
    let n = 4;
    let results = run_ranks_with(n, with_token(12), |comm| {
        let rank = comm.rank();
        let sub = comm.split((rank % 2) as i32, rank as i32).unwrap().unwrap();
        let mut w = sub.alloc_window::<i32>(1000).unwrap();
        assert!(w.is_shared());
        for (i, v) in w.iter_mut().enumerate() {
            *v = (i + rank) as i32;
        }
        let before = sub.direct_window_calls();
        sub.all_reduce_in_place(&mut w, ReduceOp::Sum).unwrap();
        // The two members of this half are `rank % 2` and `rank % 2 + 2`.
        let half = rank % 2;
        check(
            "split window",
            &w,
            |i| (2 * i + 2 * half + 2) as f64,
            |_| 0.0,
        );
        let parent_before = comm.direct_window_calls();
        // 12 KiB: above the inline limit, below the staging areas' 16 KiB.
        let mut v = vec![1i32; 3000];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        check("parent", &v, |_| n as f64, |_| 0.0);
        (
            sub.direct_window_calls() - before,
            comm.direct_window_calls() - parent_before,
        )
    });
    assert_eq!(results, vec![(1, 0); n]);
    assert_eq!(leftovers(12), Vec::<String>::new());
}
