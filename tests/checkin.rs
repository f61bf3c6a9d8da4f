//! The check-in on shared control pages for plain buffers: every collective
//! with an input of at most 4 KiB (on 2 ranks 16 KiB for every
//! collective but all-to-all, 32 KiB for all-to-all; on 3 to 8 ranks
//! 16 KiB for every collective but allreduce and all-to-all, 8 KiB for
//! allreduce, up to 24 KiB for all-to-all) runs
//! inline in it (one exchange) on ranks of one host,
//! larger ones go through slots; results against the f64
//! reference, how many calls ran inline counted, the switch
//! (FERROCCL_CHECKIN=0, a forced algorithm) honoured, and calls that differ
//! between ranks caught as mismatches whichever way each rank sends them.

mod common;

use common::{
    check, check_moving_collectives, check_reduce_scatter, input_value, make, reference, tolerance,
    SplitMix,
};
use ferroccl::testing::run_ranks_with;
use ferroccl::{Algorithm, Communicator, Config, Element, Error, ReduceOp};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The largest input, in bytes, of a `kind` call that runs inline on `n`
/// ranks (docs/architecture.md, the check-in): 4 KiB; on 2 ranks 16 KiB
/// for every collective but all-to-all, 32 KiB for all-to-all (each rank
/// puts half its input on its page); on 3 to 8 ranks 16 KiB for every
/// collective but allreduce and all-to-all, 8 KiB for allreduce, and for
/// all-to-all `n / (n - 1)` times 24 KiB (what a rank puts on its page,
/// its peers' blocks, fills 24 KiB; 16 KiB on 2 ranks).
fn inline_limit(kind: &str, n: usize) -> usize {
    match (n, kind) {
        (2, "all_to_all") => 32 << 10,
        (3..=8, "all_to_all") => (24 << 10) * n / (n - 1),
        (2..=8, "reduce" | "broadcast" | "reduce_scatter" | "all_gather") | (2, "all_reduce") => {
            16 << 10
        }
        (3..=8, "all_reduce") => 8 << 10,
        _ => 4096,
    }
}

fn quick(c: &mut Config) {
    c.timeout = Duration::from_secs(20);
}

/// Every collective once at `count` (all reducing ops), against the
/// reference; returns how many of the calls should have run without
/// slots (inline, or through the staging areas).
fn every_collective<T: Element>(comm: &Communicator, count: usize) -> u64 {
    let (rank, n, dt) = (comm.rank(), comm.size(), T::DTYPE);
    let elem = std::mem::size_of::<T>();
    let small = |kind: &str, elements: usize| u64::from(elements * elem <= inline_limit(kind, n));
    let mut inline = 0;
    for op in ReduceOp::ALL {
        let what = |name: &str| format!("{name} {dt} {op} n={n} count={count} rank={rank}");
        let tol = |w: f64| tolerance(dt, op, w);
        let want: Vec<f64> = (0..count).map(|i| reference(dt, op, n, i)).collect();
        let input: Vec<T> = make(count, |i| input_value(dt, op, rank, n, i));

        let mut out = vec![T::from_f64(-99.0); count];
        comm.all_reduce(&input, &mut out, op).unwrap();
        check(&what("all_reduce"), &out, |i| want[i], tol);
        let mut buf = input.clone();
        comm.all_reduce_in_place(&mut buf, op).unwrap();
        check(&what("all_reduce_in_place"), &buf, |i| want[i], tol);
        // 16 KiB to 8 MiB on 4 to 8 ranks: the staging areas (counted too).
        inline += 2 * (small("all_reduce", count) + u64::from(staged_allreduce(n, count * elem)));

        check_reduce_scatter::<T>(comm, count, op, tol, &what);
        inline += 2 * small("reduce_scatter", count * n);

        let root = (count + 1) % n;
        let mut out = vec![T::from_f64(-99.0); if rank == root { count } else { 0 }];
        comm.reduce(&input, &mut out, op, root).unwrap();
        let mut buf = input.clone();
        comm.reduce_in_place(&mut buf, op, root).unwrap();
        if rank == root {
            check(&what("reduce"), &out, |i| want[i], tol);
            check(&what("reduce_in_place"), &buf, |i| want[i], tol);
        } else {
            assert!(
                buf == input,
                "{}: a non-root buffer changed",
                what("reduce")
            );
        }
        inline += 2 * small("reduce", count);
    }
    let what = |name: &str| format!("{name} {dt} n={n} count={count} rank={rank}");
    check_moving_collectives::<T>(comm, count, &what);
    // all_gather twice and broadcast at `count`, all_to_all at `count * n`;
    // a broadcast past the inline limit on 4 to 8 ranks goes through the
    // root's staging area, an allgather with blocks up to 2 MiB and an
    // all-to-all up to 8 MiB through every rank's (counted too; on 3 ranks
    // a broadcast only from 8 MiB).
    let staged = |kind: &str| {
        let bytes = count * elem;
        u64::from((4..=8).contains(&n) && bytes > inline_limit(kind, n) && bytes <= 2 << 20)
    };
    inline += 2 * (small("all_gather", count) + staged("all_gather"))
        + small("broadcast", count)
        + staged("broadcast")
        + small("all_to_all", count * n)
        + u64::from(staged_alltoall(n, count * n * elem));

    comm.barrier().unwrap();
    inline + 1
}

/// Counts around each limit for each collective's input, and around the
/// inputs that travel in the announcement: 8 bytes, 32 (its first line's
/// room, `exec::checkin::SMALL_BYTES`), 96 (two lines) and 160 (three,
/// `exec::checkin::ENTRY_INPUT_BYTES`).
fn counts(n: usize, elem: usize) -> Vec<usize> {
    let mut c = vec![0, 1, 3];
    for line in [8 / elem, 32 / elem, 96 / elem, 160 / elem] {
        c.extend([line / n, line / n + 1, line, line + 1]);
    }
    let limits: &[usize] = match n {
        2 => &[4096, 16 << 10],
        ..=8 => &[4096, 8 << 10, 16 << 10],
        _ => &[4096],
    };
    for limit in limits.iter().map(|l| l / elem) {
        c.extend([limit / n, limit / n + 1, limit, limit + 1]);
    }
    // An input between the smallest peer block read in eight streams
    // (`exec::inline::STREAMS_MIN_BYTES`, 10 KiB) and the largest (16 KiB),
    // of a length that is no multiple of a line.
    if (2..=8).contains(&n) {
        c.push((12 << 10) / elem + 1);
    }
    // An all-to-all of `count * n` elements at its limit on 3 to 8 ranks
    // (`n / (n - 1)` times 24 KiB), and one block past it.
    if (3..=8).contains(&n) {
        let most = inline_limit("all_to_all", n) / elem / n;
        c.extend([most, most + 1]);
    }
    c.sort_unstable();
    c.dedup();
    c
}

fn run_matrix(n: usize, configure: impl Fn(&mut Config) + Sync, expect_inline: bool) {
    let results = run_ranks_with(
        n,
        |c| {
            quick(c);
            configure(c);
        },
        |comm| {
            let before = comm.direct_window_calls();
            let mut want = 0;
            for count in counts(n, 4) {
                want += every_collective::<f32>(&comm, count);
                want += every_collective::<i32>(&comm, count);
            }
            for count in counts(n, 8) {
                want += every_collective::<f64>(&comm, count);
            }
            for count in counts(n, 1) {
                want += every_collective::<u8>(&comm, count);
            }
            (comm.direct_window_calls() - before, want)
        },
    );
    for (rank, (got, want)) in results.into_iter().enumerate() {
        let want = if expect_inline && n > 1 { want } else { 0 };
        assert_eq!(got, want, "rank {rank} of {n}: calls run inline");
    }
}

#[test]
fn small_calls_run_inline_and_large_ones_through_slots() {
    for n in 1..=5 {
        run_matrix(n, |_| {}, true);
    }
}

#[test]
fn checkin_off_or_a_forced_algorithm_sends_everything_through_slots() {
    for n in [2, 3] {
        run_matrix(n, |c| c.checkin = false, false);
        run_matrix(n, |c| c.algorithm = Some(Algorithm::Ring), false);
    }
}

#[test]
fn checkin_is_off_where_memory_cannot_be_shared() {
    run_matrix(2, |c| c.transport = Some("tcp".into()), false);
}

/// Rank 0 and rank 1 make different calls; both must fail, rank 0 with a
/// mismatch naming rank 1 (found at the check-in) where `first_sees` says.
fn differing_calls(
    rank0: impl Fn(&Communicator) -> ferroccl::Result<()> + Sync,
    rank1: impl Fn(&Communicator) -> ferroccl::Result<()> + Sync,
) -> Vec<ferroccl::Result<()>> {
    run_ranks_with(2, quick, |comm| {
        // Some agreed calls first, so the check-in counters are not at 0.
        let mut x = [comm.rank() as f32; 3];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        let mut y = vec![1f32; 10_000];
        comm.all_reduce_in_place(&mut y, ReduceOp::Sum).unwrap();
        if comm.rank() == 0 {
            rank0(&comm)
        } else {
            rank1(&comm)
        }
    })
}

fn assert_mismatch(result: &ferroccl::Result<()>, rank: usize, peer: usize) {
    match result {
        Err(Error::Mismatch { peer: p, .. }) => assert_eq!(*p, peer, "rank {rank}: {result:?}"),
        other => panic!("rank {rank}: expected a mismatch with rank {peer}, got {other:?}"),
    }
}

#[test]
fn a_small_call_against_a_large_one_is_a_mismatch() {
    // Rank 0 checks in (4 elements), rank 1 goes through slots (100000).
    let results = differing_calls(
        |comm| comm.all_reduce_in_place(&mut [1f32; 4], ReduceOp::Sum),
        |comm| comm.all_reduce_in_place(&mut vec![1f32; 100_000], ReduceOp::Sum),
    );
    assert_mismatch(&results[0], 0, 1);
    assert!(results[1].is_err(), "rank 1: {:?}", results[1]);
}

#[test]
fn two_small_calls_that_differ_are_a_mismatch_on_both_ranks() {
    let results = differing_calls(
        |comm| comm.all_gather(&[1f32; 4], &mut [0f32; 8]),
        |comm| comm.all_reduce_in_place(&mut [1f32; 4], ReduceOp::Sum),
    );
    assert_mismatch(&results[0], 0, 1);
    assert_mismatch(&results[1], 1, 0);
}

/// On 4 ranks, where a reduce-scatter of up to 16 KiB runs inline: one
/// rank at the limit (inline) against the others just past it (through
/// slots) is a mismatch on every rank (not a wait for the timeout): the
/// others name the inline rank, the inline rank one of them.
#[test]
fn a_call_at_the_wider_inline_limit_against_one_past_it_is_a_mismatch_everywhere() {
    let n = 4;
    let per_rank = inline_limit("reduce_scatter", n) / 4 / n;
    let results = run_ranks_with(n, quick, |comm| {
        let mut x = [comm.rank() as f32; 3];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        let count = if comm.rank() == 2 {
            per_rank
        } else {
            per_rank + 1
        };
        let input = vec![1f32; count * n];
        let mut out = vec![0f32; count];
        comm.reduce_scatter(&input, &mut out, ReduceOp::Sum)
    });
    for (rank, result) in results.iter().enumerate() {
        if rank != 2 {
            assert_mismatch(result, rank, 2);
        } else if let Err(Error::Mismatch { peer, .. }) = result {
            assert_ne!(*peer, 2);
        } else {
            panic!("rank 2: expected a mismatch, got {result:?}");
        }
    }
}

/// A small broadcast's root leaves once its data is on its page, without
/// reading its peers' announcements: a receiver given another call finds
/// the mismatch in its call, and the root in its next one, which names
/// the broadcast.
#[test]
fn a_root_that_left_early_finds_the_mismatch_in_its_next_call() {
    let results = differing_calls(
        |comm| {
            comm.broadcast(&mut [1f32; 4], 0)
                .expect("the root leaves a small broadcast once its data is out");
            // Through slots: every earlier check-in is compared first.
            let next = comm.all_reduce_in_place(&mut vec![1f32; 100_000], ReduceOp::Sum);
            match &next {
                Err(Error::Mismatch { local, .. }) => {
                    assert!(
                        local.starts_with("broadcast"),
                        "names the broadcast: {next:?}"
                    )
                }
                other => panic!("rank 0: expected a mismatch, got {other:?}"),
            }
            next
        },
        |comm| comm.all_reduce_in_place(&mut [1f32; 4], ReduceOp::Sum),
    );
    assert_mismatch(&results[0], 0, 1);
    assert_mismatch(&results[1], 1, 0);
}

/// A root that left several small broadcasts early compares them with
/// its receiver's in one batch (word for word where they agree: the unit
/// test of `same_entry`); one that differs in its count alone, in the
/// middle of the batch, fails the receiver's call and then the root's
/// next, named with the root's own number and count (calls #3 to #8
/// here: two agreed ones came first), and the calls before it delivered
/// their data.
#[test]
fn a_count_that_differs_in_the_middle_of_a_batch_is_found() {
    let results = differing_calls(
        |comm| {
            for i in 0..6 {
                comm.broadcast(&mut [i as f32; 4], 0)
                    .expect("the root leaves a small broadcast once its data is out");
            }
            let next = comm.all_reduce_in_place(&mut vec![1f32; 100_000], ReduceOp::Sum);
            match &next {
                Err(Error::Mismatch { local, remote, .. }) => {
                    assert!(local.starts_with("broadcast #6 "), "{next:?}");
                    assert!(local.contains("4 elements"), "{next:?}");
                    assert!(remote.contains("3 elements"), "{next:?}");
                }
                other => panic!("rank 0: expected a mismatch, got {other:?}"),
            }
            next
        },
        |comm| {
            for i in 0..3 {
                let mut got = [0f32; 4];
                comm.broadcast(&mut got, 0)?;
                assert_eq!(got, [i as f32; 4], "broadcast {i}");
            }
            comm.broadcast(&mut [0f32; 3], 0)
        },
    );
    assert_mismatch(&results[0], 0, 1);
    assert_mismatch(&results[1], 1, 0);
}

/// Wait (up to a minute) until `flag` is set by the other rank's thread.
fn wait_for(flag: &AtomicBool, what: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    while !flag.load(Ordering::Acquire) {
        assert!(Instant::now() < until, "{what} never came");
        std::thread::yield_now();
    }
}

/// Ranks that each leave small calls early where nobody reads their
/// announcements (two that each think they are a broadcast's root; a
/// broadcast's root against a reduce's sender) find the mismatch in their
/// next call, also when each compares only after the other has gone past
/// those calls (`exec::checkin::confirm_left`: the case the later
/// comparison is there for, since no reader finds it in the call). Fails
/// with the comparison skipped: both ranks' next call then runs.
#[test]
fn ranks_that_left_differing_calls_early_find_it_after_both_went_on() {
    for case in ["roots", "kinds"] {
        let flags = [AtomicBool::new(false), AtomicBool::new(false)];
        let run = |comm: &Communicator| {
            let rank = comm.rank();
            for i in 0..5 {
                let mut x = [i as f32; 2];
                if case == "roots" || rank == 0 {
                    let root = if case == "roots" { rank } else { 0 };
                    comm.broadcast(&mut x, root)
                } else {
                    comm.reduce(&[i as f32; 2], &mut x, ReduceOp::Sum, 0)
                }
                .expect("a root or sender leaves a small call once its data is out");
            }
            flags[rank].store(true, Ordering::Release);
            wait_for(&flags[1 - rank], "the other rank's calls");
            let next = comm.all_reduce_in_place(&mut vec![1f32; 100_000], ReduceOp::Sum);
            let (mine, theirs) = match (case, rank) {
                ("roots", _) => (format!("root {rank}"), format!("root {}", 1 - rank)),
                (_, 0) => ("broadcast #".to_string(), "reduce #".to_string()),
                _ => ("reduce #".to_string(), "broadcast #".to_string()),
            };
            match &next {
                Err(Error::Mismatch { local, remote, .. }) => {
                    assert!(local.contains(&mine), "{case}, rank {rank}: {next:?}");
                    assert!(remote.contains(&theirs), "{case}, rank {rank}: {next:?}");
                }
                other => panic!("{case}, rank {rank}: expected a mismatch, got {other:?}"),
            }
            next
        };
        let results = differing_calls(run, run);
        assert_mismatch(&results[0], 0, 1);
        assert_mismatch(&results[1], 1, 0);
    }
}

/// A small broadcast's root and a small reduce's senders run ahead of
/// ranks that have not come yet (several calls: the page's announcement
/// slots), and every call still delivers its own data: receivers that
/// start only after the root finished its calls get each call's value,
/// and a reduce's root gets each call's sum, on 2 and 3 ranks, then the
/// ranks go on with calls that read every announcement and through slots.
/// Inputs in the announcement's first line (20 and 24 bytes), in its
/// three lines (120 and 128 bytes: `exec::checkin::ENTRY_INPUT_BYTES`),
/// and in the page's inline area (1,200 and 800 bytes).
#[test]
fn roots_and_senders_run_ahead_and_every_call_keeps_its_data() {
    const AHEAD: usize = 6;
    for (floats, doubles) in [(5, 3), (30, 16), (300, 100)] {
        for n in [2, 3] {
            let gate = std::sync::Barrier::new(n);
            run_ranks_with(n, quick, |comm| {
                let rank = comm.rank();
                let value = |call: usize, i: usize| (call * 10 + i % 7) as f32;
                // Broadcast from rank 0: the others start once it is done.
                let mut got = vec![vec![0f32; floats]; AHEAD];
                for (call, buf) in got.iter_mut().enumerate() {
                    if rank == 0 {
                        *buf = (0..floats).map(|i| value(call, i)).collect();
                    }
                    if rank != 0 && call == 0 {
                        gate.wait();
                    }
                    comm.broadcast(buf, 0).unwrap();
                }
                if rank == 0 {
                    gate.wait();
                }
                for (call, buf) in got.iter().enumerate() {
                    let want: Vec<f32> = (0..floats).map(|i| value(call, i)).collect();
                    assert_eq!(
                        buf, &want,
                        "broadcast {call} of {floats} rank {rank} of {n}"
                    );
                }
                // Reduce to the last rank: it starts once every sender is done.
                let root = n - 1;
                let mine = |r: usize, call: usize, i: usize| (r * 100 + call + i % 5) as f64;
                let mut sums = vec![vec![0f64; doubles]; AHEAD];
                for (call, sum) in sums.iter_mut().enumerate() {
                    let input: Vec<f64> = (0..doubles).map(|i| mine(rank, call, i)).collect();
                    if rank == root && call == 0 {
                        gate.wait();
                    }
                    comm.reduce(&input, sum, ReduceOp::Sum, root).unwrap();
                }
                if rank != root {
                    gate.wait();
                } else {
                    for (call, sum) in sums.iter().enumerate() {
                        let want: Vec<f64> = (0..doubles)
                            .map(|i| (0..n).map(|r| mine(r, call, i)).sum())
                            .collect();
                        assert_eq!(sum, &want, "reduce {call} of {doubles} on {n}");
                    }
                }
                // Then calls that read every announcement, and through slots.
                let mut x = [rank as f32 + 1.0; 3];
                comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                assert_eq!(x, [(n * (n + 1) / 2) as f32; 3]);
                let mut y = vec![1f32; 50_000];
                comm.all_reduce_in_place(&mut y, ReduceOp::Sum).unwrap();
                assert!(y.iter().all(|&v| v == n as f32));
            });
        }
    }
}

/// A long random sequence of collectives, small (inline) and large (slots)
/// mixed, on 2 and 3 ranks, each result checked: the check-in counters and the
/// slot sequence numbers stay in step however the two ways interleave.
#[test]
fn random_mixtures_of_inline_and_slot_calls_stay_in_step() {
    // 2 ranks: the larger inline limits; 3: 16 KiB for all but allreduce
    // (8 KiB).
    for n in [2, 3] {
        random_mixture(n);
    }
}

fn random_mixture(ranks: usize) {
    let seed = 0x00C0_FFEE_u64;
    run_ranks_with(ranks, quick, |comm| {
        let (rank, n) = (comm.rank(), comm.size());
        let mut rng = SplitMix(seed);
        let op = ReduceOp::Sum;
        let dt = f32::DTYPE;
        for call in 0..300 {
            let count = match rng.below(3) {
                0 => rng.below(8) as usize,
                1 => rng.below(1100) as usize,
                _ => 1000 + rng.below(20_000) as usize,
            };
            let what = format!("call {call} (seed {seed:#x}) count={count} rank={rank}");
            // Now and then one rank comes late, so that those that need
            // nothing of it (a broadcast's root, a reduce's senders) run
            // ahead.
            if rng.below(9) == rank as u64 {
                std::thread::sleep(Duration::from_micros(200));
            }
            let want = |i: usize| reference(dt, op, n, i);
            let tol = |w: f64| tolerance(dt, op, w);
            match rng.below(5) {
                4 => {
                    let root = (call / 2) % n;
                    let input: Vec<f32> = make(count, |i| input_value(dt, op, rank, n, i));
                    let mut out = vec![-99f32; if rank == root { count } else { 0 }];
                    comm.reduce(&input, &mut out, op, root).unwrap();
                    check(&format!("reduce {what}"), &out, want, tol);
                }
                0 => {
                    let mut buf: Vec<f32> = make(count, |i| input_value(dt, op, rank, n, i));
                    comm.all_reduce_in_place(&mut buf, op).unwrap();
                    check(&format!("all_reduce {what}"), &buf, want, tol);
                }
                1 => {
                    let root = call % n;
                    let mut buf: Vec<f32> = make(count, |i| (rank * 1000 + i % 997) as f64);
                    comm.broadcast(&mut buf, root).unwrap();
                    check(
                        &format!("broadcast {what}"),
                        &buf,
                        |i| (root * 1000 + i % 997) as f64,
                        |_| 0.0,
                    );
                }
                2 => {
                    let mine: Vec<f32> = make(count, |i| (rank * 1000 + i % 997) as f64);
                    let mut out = vec![-1f32; count * n];
                    comm.all_gather(&mine, &mut out).unwrap();
                    check(
                        &format!("all_gather {what}"),
                        &out,
                        |j| ((j / count.max(1)) * 1000 + (j % count.max(1)) % 997) as f64,
                        |_| 0.0,
                    );
                }
                _ => {
                    let big: Vec<f32> = make(count * n, |i| input_value(dt, op, rank, n, i));
                    let mut out = vec![-99f32; count];
                    comm.reduce_scatter(&big, &mut out, op).unwrap();
                    check(
                        &format!("reduce_scatter {what}"),
                        &out,
                        |i| reference(dt, op, n, rank * count + i),
                        tol,
                    );
                }
            }
        }
    });
}

/// Broadcasts above the inline limit on 3 to 5 ranks run through the
/// root's staging area (`exec::spread`; on 3 ranks from 8 MiB), and
/// allgathers of blocks over 16 KiB and up to 2 MiB and all-to-alls past
/// their inline limit and up to 8 MiB on 4 and 5 through every rank's: from
/// every root in turn, at sizes around its chunks (a broadcast's 32 KiB
/// up to 1 MiB, 256 KiB above) and past its ring of 8 slots (so that its
/// slots come round again within a call and across calls of different
/// roots), of f32, f64 and u8, each element checked
/// against the root's (or every rank's) data; allreduces inline and
/// through slots between them. Every call through the staging areas is
/// counted as run without slots, and with `Config::spread` off none is
/// (they take the chain or ring through slots, with the same results).
#[test]
fn large_broadcasts_and_allgathers_run_through_the_staging_areas() {
    const CHUNK: usize = 256 << 10;
    let bytes = [
        16 << 10 | 4,
        (128 << 10) - 4,
        128 << 10,
        CHUNK - 8,
        CHUNK,
        CHUNK + 24,
        1 << 20,
        8 * CHUNK + 40,
        (20 * CHUNK) + 16 + 8,
        (32 * CHUNK) + 8,
    ];
    for n in [3, 4, 5] {
        for spread in [true, false] {
            let got = run_ranks_with(
                n,
                |c| {
                    quick(c);
                    c.spread = spread;
                },
                |comm| {
                    let rank = comm.rank();
                    let before = comm.direct_window_calls();
                    let (mut inline, mut staged) = (0u64, 0u64);
                    let mut add = |(i, s): (u64, u64)| {
                        inline += i;
                        staged += s;
                    };
                    for (k, &b) in bytes.iter().enumerate() {
                        for root in 0..n {
                            let tag = (k * n + root) as u64;
                            add(spread_once::<f32>(&comm, b / 4, root, tag));
                            add(spread_once::<f64>(&comm, b / 8, (root + 1) % n, tag));
                            add(spread_once::<u8>(&comm, b + 3, (root + 2) % n, tag));
                            if root == 0 {
                                // An allgather of blocks of these sizes
                                // (every rank's staging area), out of
                                // place and in place.
                                add(gather_once::<f32>(&comm, b / 4, tag));
                                add(gather_once::<u8>(&comm, b + 1, tag));
                                // An allreduce of these sizes (4 to 8
                                // ranks, 16 KiB to 8 MiB: every rank's
                                // staging area), out of place and in place.
                                add(reduce_once::<f32>(&comm, b / 4, ReduceOp::Sum, tag));
                                add(reduce_once::<i32>(&comm, b / 4 + 3, ReduceOp::Max, tag));
                                // An all-to-all of these sizes (4 to 8
                                // ranks, up to 8 MiB: every rank's
                                // staging area, each chunk a slice of
                                // every block; at 8 MiB on 4 and 5 ranks
                                // the output written with streaming
                                // stores, the buffers together reaching
                                // twice the default threshold).
                                add(exchange_once::<f32>(&comm, b / 4, tag));
                                add(exchange_once::<u8>(&comm, b + 5, tag));
                            }
                            // Between them, an inline allreduce and one
                            // through slots on 3 ranks (the staging areas
                            // on 4 and 5, counted there).
                            for count in [7, 70_000] {
                                let mut x: Vec<f32> =
                                    (0..count).map(|i| (rank + i % 5) as f32).collect();
                                comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
                                for (i, v) in x.iter().enumerate() {
                                    let want = (0..n).map(|r| (r + i % 5) as f32).sum::<f32>();
                                    assert_eq!(
                                        *v, want,
                                        "allreduce of {count} at {i}, rank {rank}"
                                    );
                                }
                                add((0, u64::from(staged_allreduce(n, count * 4))));
                            }
                        }
                    }
                    // The small allreduces and broadcasts run inline, and
                    // are counted too.
                    let inline = inline + (bytes.len() * n) as u64;
                    (comm.direct_window_calls() - before - inline, staged)
                },
            );
            for (rank, (direct, staged)) in got.into_iter().enumerate() {
                let want = if spread { staged } else { 0 };
                assert!(staged > 0);
                assert_eq!(
                    direct, want,
                    "{n} ranks, spread {spread}, rank {rank}: broadcasts through the staging area"
                );
            }
        }
    }
}

/// Whether an all-to-all of `bytes` (a rank's whole input) on `n` ranks
/// goes through the staging areas: 4 to 8 ranks, past the inline limit
/// and up to 8 MiB (where it does not pull; ranks that are threads of one
/// process never do).
fn staged_alltoall(n: usize, bytes: usize) -> bool {
    (4..=8).contains(&n) && bytes > inline_limit("all_to_all", n) && bytes <= 8 << 20
}

/// An all-to-all of `count` elements a rank (`count / n` a block; each
/// element a value of its sender, its receiver, `tag` and its place),
/// checked element by element on every rank; how many ran inline and how
/// many through the staging areas, as [`spread_once`].
fn exchange_once<T: Element>(comm: &Communicator, count: usize, tag: u64) -> (u64, u64) {
    let (rank, n) = (comm.rank(), comm.size());
    let block = count / n;
    let value = |from: usize, to: usize, i: usize| {
        T::from_f64(((from as u64 * 41 + to as u64 * 7 + tag * 3 + i as u64) % 107) as f64)
    };
    let mine: Vec<T> = (0..block * n)
        .map(|i| value(rank, i / block, i % block))
        .collect();
    let mut out = vec![T::from_f64(0.0); block * n];
    comm.all_to_all(&mine, &mut out).unwrap();
    for (i, v) in out.iter().enumerate() {
        let (j, at) = (i / block, i % block);
        assert!(
            *v == value(j, rank, at),
            "all-to-all of {} {} on {n} ranks, rank {rank}: element {at} of block {j} differs",
            block * n,
            T::DTYPE
        );
    }
    let bytes = block * n * std::mem::size_of::<T>();
    (
        u64::from(bytes <= inline_limit("all_to_all", n)),
        u64::from(staged_alltoall(n, bytes)),
    )
}

/// Whether an allreduce of `bytes` on `n` ranks goes through the staging
/// areas: 4 to 8 ranks, 16 KiB to 8 MiB.
fn staged_allreduce(n: usize, bytes: usize) -> bool {
    (4..=8).contains(&n) && (16 << 10..=8 << 20).contains(&bytes)
}

/// An allreduce of `count` elements with `op`, out of place and in place,
/// every element checked on every rank against the value worked out here
/// (small integers: every sum exact in any order); how many ran inline
/// and how many through the staging areas, as [`spread_once`].
fn reduce_once<T: Element>(
    comm: &Communicator,
    count: usize,
    op: ReduceOp,
    tag: u64,
) -> (u64, u64) {
    let (rank, n) = (comm.rank(), comm.size());
    let value = |who: usize, i: usize| ((who as u64 * 13 + tag * 3 + i as u64) % 61) as f64;
    let want = |i: usize| -> f64 {
        let all = (0..n).map(|r| value(r, i));
        match op {
            ReduceOp::Max => all.fold(f64::MIN, f64::max),
            _ => all.sum(),
        }
    };
    let mine: Vec<T> = (0..count).map(|i| T::from_f64(value(rank, i))).collect();
    let mut out = vec![T::from_f64(0.0); count];
    comm.all_reduce(&mine, &mut out, op).unwrap();
    let mut buf = mine.clone();
    comm.all_reduce_in_place(&mut buf, op).unwrap();
    for (what, got) in [("out of place", &out), ("in place", &buf)] {
        for (i, v) in got.iter().enumerate() {
            assert!(
                v.to_f64() == want(i),
                "allreduce {op} {what} of {count} {} on {n} ranks, rank {rank}: element {i} is \
                 {} against {}",
                T::DTYPE,
                v.to_f64(),
                want(i)
            );
        }
    }
    let bytes = count * std::mem::size_of::<T>();
    (
        2 * u64::from(bytes <= inline_limit("all_reduce", n)),
        2 * u64::from(staged_allreduce(n, bytes)),
    )
}

/// An allgather of blocks of `count` elements (each element a value of
/// its rank's, `tag` and its place), out of place and in place, checked
/// element by element on every rank; how many ran inline and how many
/// through the staging areas (4 to 8 ranks, blocks over 16 KiB and up to
/// 2 MiB), as [`spread_once`].
fn gather_once<T: Element>(comm: &Communicator, count: usize, tag: u64) -> (u64, u64) {
    let (rank, n) = (comm.rank(), comm.size());
    let value =
        |who: usize, i: usize| T::from_f64(((who as u64 * 37 + tag * 5 + i as u64) % 103) as f64);
    let mine: Vec<T> = (0..count).map(|i| value(rank, i)).collect();
    let mut out = vec![T::from_f64(0.0); count * n];
    comm.all_gather(&mine, &mut out).unwrap();
    let mut buf = vec![T::from_f64(0.0); count * n];
    buf[rank * count..(rank + 1) * count].copy_from_slice(&mine);
    comm.all_gather_in_place(&mut buf).unwrap();
    for (what, got) in [("out of place", &out), ("in place", &buf)] {
        for (i, v) in got.iter().enumerate() {
            let (j, at) = (i / count, i % count);
            assert!(
                *v == value(j, at),
                "allgather {what} of {count} {} on {n} ranks, rank {rank}: element {at} of \
                 block {j} differs",
                T::DTYPE
            );
        }
    }
    let bytes = count * std::mem::size_of::<T>();
    let staged = (4..=8).contains(&n) && bytes > 16 << 10 && bytes <= 2 << 20;
    (
        2 * u64::from(bytes <= inline_limit("all_gather", n)),
        2 * u64::from(staged),
    )
}

/// One broadcast of `count` elements from `root` (each element a value of
/// the root's, `tag` and its place), checked element by element on every
/// rank; (1, 0) where it runs inline, (0, 1) where it goes through the
/// staging area (by its size and the communicator's), else (0, 0).
fn spread_once<T: Element>(comm: &Communicator, count: usize, root: usize, tag: u64) -> (u64, u64) {
    let (rank, n) = (comm.rank(), comm.size());
    let value =
        |who: usize, i: usize| T::from_f64(((who as u64 * 31 + tag * 7 + i as u64) % 101) as f64);
    let mut buf: Vec<T> = (0..count).map(|i| value(rank, i)).collect();
    comm.broadcast(&mut buf, root).unwrap();
    for (i, v) in buf.iter().enumerate() {
        assert!(
            *v == value(root, i),
            "broadcast of {count} {} from {root} on {n} ranks, rank {rank}: element {i} differs",
            T::DTYPE
        );
    }
    let bytes = count * std::mem::size_of::<T>();
    let min = if n == 3 { 8 << 20 } else { (16 << 10) + 1 };
    let small = inline_limit("broadcast", n);
    (u64::from(bytes <= small), u64::from(bytes >= min && n <= 8))
}

/// An inline allreduce in place reads the rank's own input out of its
/// buffer (block by block, copied aside: `exec::inline::reduce_over_own`)
/// rather than off its page. Every rank's result must still have the
/// bits of the fold in rank order, `((x0 op x1) op x2) ...`, worked out
/// here in the element type, and of the same call out of place; the
/// inputs mix magnitudes so that another order rounds differently. Sizes
/// around the 4 KiB blocks, up to the inline limit, on 2 to 4 ranks (so
/// that the own input is first, in the middle and last), f32 and f64,
/// sum, product, min and max; each call is counted as run inline.
#[test]
fn inline_allreduces_in_place_give_every_rank_the_bits_of_the_rank_order_fold() {
    fn fold<T: Element + Copy>(op: ReduceOp, a: T, b: T) -> T {
        let (x, y) = (a.to_f64(), b.to_f64());
        // Each step in the element type: from_f64 of an exact f64 result
        // rounds as the element type's own operation does (f32 and f64).
        T::from_f64(match op {
            ReduceOp::Sum => x + y,
            ReduceOp::Prod => x * y,
            ReduceOp::Min => x.min(y),
            _ => x.max(y),
        })
    }
    fn once<T: Element + Copy>(comm: &Communicator, count: usize, op: ReduceOp) {
        let (rank, n) = (comm.rank(), comm.size());
        let value = |r: usize, i: usize| -> T {
            let v = match op {
                ReduceOp::Prod => 1.0 + ((r * 7 + i * 3) % 17) as f64 / 1024.0,
                _ => ((r * 13 + i * 7) % 101) as f64 * 0.1 + [1e7, 0.3, -1e7, 7.7][r % 4],
            };
            T::from_f64(v)
        };
        let mine: Vec<T> = (0..count).map(|i| value(rank, i)).collect();
        let mut out = vec![T::from_f64(0.0); count];
        comm.all_reduce(&mine, &mut out, op).unwrap();
        let mut buf = mine.clone();
        comm.all_reduce_in_place(&mut buf, op).unwrap();
        for i in 0..count {
            let want = (1..n).fold(value(0, i), |acc, r| fold(op, acc, value(r, i)));
            let bits = |v: T| v.to_f64().to_bits();
            assert!(
                bits(buf[i]) == bits(want) && bits(out[i]) == bits(want),
                "allreduce {op} of {count} {} on {n} ranks, rank {rank}, element {i}: in place \
                 {}, out of place {}, the rank-order fold {}",
                T::DTYPE,
                buf[i].to_f64(),
                out[i].to_f64(),
                want.to_f64()
            );
        }
    }
    for n in [2, 3, 4] {
        let got = run_ranks_with(n, quick, |comm| {
            let before = comm.direct_window_calls();
            let mut calls = 0u64;
            let limit = inline_limit("all_reduce", n);
            for bytes in [
                8usize,
                1 << 10,
                (4 << 10) - 8,
                4 << 10,
                (4 << 10) + 24,
                8 << 10,
                16 << 10,
            ] {
                if bytes > limit {
                    continue;
                }
                for op in [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max] {
                    once::<f32>(&comm, bytes / 4, op);
                    once::<f64>(&comm, bytes / 8, op);
                    calls += 4;
                }
            }
            (comm.direct_window_calls() - before, calls)
        });
        for (rank, (inline, calls)) in got.into_iter().enumerate() {
            assert_eq!(
                inline, calls,
                "{n} ranks, rank {rank}: allreduces run inline"
            );
        }
    }
}
