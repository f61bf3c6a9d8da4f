//! User algorithms (`ferroccl::algo::user`) on real communicators: the two
//! shipped examples forced by `Config::user_algorithm` (the builder's
//! halving-doubling) and `Config::algorithm_file` (the torus text file),
//! allreduce of several types and ops against the f64 reference of
//! common/mod.rs on 1..8 ranks; a file the checker refuses fails creation
//! on every rank with the place of the mistake; and the torus generator
//! script's output checked for 1..64 ranks (and sampled to 4,096).

mod common;

use common::{check, input_value, make, reference, tolerance};
use ferroccl::algo::user::examples::halving_doubling;
use ferroccl::algo::{text, user::UserAlgorithm};
use ferroccl::testing::run_ranks_with;
use ferroccl::{Communicator, Config, Element, ReduceOp};
use half::bf16;
use std::path::PathBuf;
use std::time::Duration;

fn torus_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/algorithms/torus.algo")
}

/// Allreduce out of place, in place and async of `count` elements.
fn all_reduces<T: Element>(comm: &Communicator, count: usize, what: &str) {
    let (rank, n, dt) = (comm.rank(), comm.size(), T::DTYPE);
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
        let name = |call: &str| format!("{what} {call} {dt} {op} n={n} count={count} rank={rank}");
        let want: Vec<f64> = (0..count).map(|i| reference(dt, op, n, i)).collect();
        let tol = |w: f64| tolerance(dt, op, w);
        let input: Vec<T> = make(count, |i| input_value(dt, op, rank, n, i));
        let mut out = vec![T::from_f64(-99.0); count];
        comm.all_reduce(&input, &mut out, op).unwrap();
        check(&name("all_reduce"), &out, |i| want[i], tol);
        let mut buf = input.clone();
        comm.all_reduce_in_place(&mut buf, op).unwrap();
        check(&name("all_reduce_in_place"), &buf, |i| want[i], tol);
        let buf = comm.all_reduce_async(input, op).unwrap().wait().unwrap();
        check(&name("all_reduce_async"), &buf, |i| want[i], tol);
    }
}

fn every_type(comm: &Communicator, what: &str) {
    let n = comm.size();
    // 300,007 f64 are 2.4 MB: several blocks of slot-sized frames.
    for count in [0, 1, n + 1, 5000, 300_007] {
        all_reduces::<f32>(comm, count, what);
        all_reduces::<f64>(comm, count, what);
        all_reduces::<i32>(comm, count, what);
        all_reduces::<bf16>(comm, count, what);
    }
}

fn settings(transport: &'static str) -> impl Fn(&mut Config) + Sync {
    move |c: &mut Config| {
        c.transport = Some(transport.into());
        c.timeout = Duration::from_secs(120);
    }
}

#[test]
fn halving_doubling_from_the_builder_on_real_transports() {
    for (n, transport) in [(1, "mem"), (2, "mem"), (4, "mem"), (8, "mem"), (4, "shm")] {
        run_ranks_with(
            n,
            |c| {
                settings(transport)(c);
                c.user_algorithm = Some(halving_doubling(8));
            },
            |comm| every_type(&comm, &format!("halving_doubling {transport}")),
        );
    }
}

#[test]
fn torus_from_the_text_file_on_real_transports() {
    for n in 2..=8 {
        run_ranks_with(
            n,
            |c| {
                settings("mem")(c);
                c.algorithm_file = Some(torus_file());
            },
            |comm| every_type(&comm, "torus mem"),
        );
    }
    run_ranks_with(
        6,
        |c| {
            settings("shm")(c);
            c.algorithm_file = Some(torus_file());
        },
        |comm| every_type(&comm, "torus shm"),
    );
}

/// The message a communicator's creation panicked with in
/// `run_ranks_with` (every rank fails alike; the first is reported).
fn creation_error(n: usize, configure: impl Fn(&mut Config) + Sync) -> String {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_ranks_with(n, &configure, |_comm| ());
    }));
    let panic = caught.expect_err("creation should fail");
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn a_refused_file_fails_creation_on_every_rank_naming_the_mistake() {
    let dir = std::env::temp_dir().join(format!("ferroccl-user-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Halving-doubling (1, 2 and 4 ranks) with the last halving receive
    // of rank 1 on 4 ranks gone.
    let good = text::write(&halving_doubling(4));
    let mut lines: Vec<&str> = good.lines().collect();
    let (at, _) = lines
        .iter()
        .enumerate()
        .rfind(|(_, l)| l.starts_with("rank 1: recv_reduce_copy"))
        .map(|(i, l)| (i, *l))
        .unwrap();
    lines.remove(at);
    let bad = dir.join("missing-recv.algo");
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let msg = creation_error(4, |c| {
        settings("mem")(c);
        c.algorithm_file = Some(bad.clone());
    });
    assert!(msg.contains("communicator set-up failed"), "{msg}");
    assert!(msg.contains("missing-recv.algo"), "{msg}");
    assert!(msg.contains("refused"), "{msg}");
    assert!(msg.contains("rank ") && msg.contains("step "), "{msg}");
    assert!(msg.contains("line "), "{msg}");

    // A rank count the file does not claim.
    let msg = creation_error(3, |c| {
        settings("mem")(c);
        c.user_algorithm = Some(halving_doubling(8));
    });
    assert!(msg.contains("no schedule for 3 ranks"), "{msg}");

    // A line the parser refuses.
    let broken = dir.join("broken.algo");
    std::fs::write(
        &broken,
        "collective allreduce\nranks 2\nrank 0: sendd to 1 chunk 0 of 2\n",
    )
    .unwrap();
    let msg = creation_error(2, |c| {
        settings("mem")(c);
        c.algorithm_file = Some(broken.clone());
    });
    assert!(
        msg.contains("line 3") && msg.contains("unknown primitive"),
        "{msg}"
    );

    // A file that is not there.
    let msg = creation_error(2, |c| {
        settings("mem")(c);
        c.algorithm_file = Some(dir.join("absent.algo"));
    });
    assert!(msg.contains("cannot read"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The text the example script `examples/algorithms/<script>` writes for
/// rank counts `sizes`.
fn script_text(script: &str, sizes: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/algorithms")
        .join(script);
    let out = std::process::Command::new("python3")
        .arg(&path)
        .arg(sizes)
        .output()
        .unwrap_or_else(|e| panic!("python3 runs examples/algorithms/{script}: {e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The torus script's text for rank counts `sizes`.
fn torus_text(sizes: &str) -> String {
    script_text("torus.py", sizes)
}

/// The shipped file is what the script writes, and the script's torus
/// passes the whole check on 1..64 ranks, and the matching check on
/// sampled counts up to 4,096 (values on the smaller of them).
#[test]
fn the_torus_script_is_checked_for_1_to_64_ranks_and_sampled_to_4096() {
    assert_eq!(
        torus_text("16"),
        std::fs::read_to_string(torus_file()).unwrap(),
        "examples/algorithms/torus.algo is stale: rerun torus.py > torus.algo"
    );
    let algo: UserAlgorithm = text::parse(&torus_text("64")).unwrap();
    assert_eq!(algo.sizes().count(), 64);
    algo.check().unwrap();
    let sampled = [100usize, 127, 256, 1000, 4096];
    let list: Vec<String> = sampled.iter().map(|n| n.to_string()).collect();
    let big = text::parse(&torus_text(&list.join(","))).unwrap();
    for n in sampled {
        big.check_matching(n).unwrap();
    }
    for n in [100, 127, 256] {
        big.check_values(n).unwrap();
    }
}

// Allgather and reduce-scatter written by users.

use ferroccl::algo::user::examples::{pairwise_reduce_scatter, recursive_doubling_allgather};
use ferroccl::algo::user::{Chunks, Collective};

fn bruck_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/algorithms/bruck.algo")
}

/// Allgather out of place, in place and async of `count` elements a rank,
/// against each rank's input (exact in every type).
fn all_gathers<T: Element>(comm: &Communicator, count: usize, what: &str) {
    let (rank, n, dt) = (comm.rank(), comm.size(), T::DTYPE);
    let name = |call: &str| format!("{what} {call} {dt} n={n} count={count} rank={rank}");
    let exact = |_: f64| 0.0;
    let value = |r: usize, i: usize| input_value(dt, ReduceOp::Max, r, n, i);
    let want = |j: usize| value(j / count.max(1), j % count.max(1));
    let mine: Vec<T> = make(count, |i| value(rank, i));
    let mut out = vec![T::from_f64(-99.0); count * n];
    comm.all_gather(&mine, &mut out).unwrap();
    check(&name("all_gather"), &out, want, exact);
    let mut buf = vec![T::from_f64(-99.0); count * n];
    buf[rank * count..(rank + 1) * count].copy_from_slice(&mine);
    comm.all_gather_in_place(&mut buf).unwrap();
    check(&name("all_gather_in_place"), &buf, want, exact);
    let mut buf = vec![T::from_f64(-99.0); count * n];
    buf[rank * count..(rank + 1) * count].copy_from_slice(&mine);
    let buf = comm.all_gather_async(buf).unwrap().wait().unwrap();
    check(&name("all_gather_async"), &buf, want, exact);
}

/// Reduce-scatter out of place, in place and async of `count` elements a
/// rank, for Sum, Max and Avg, against the f64 reference.
fn reduce_scatters<T: Element>(comm: &Communicator, count: usize, what: &str) {
    let (rank, n, dt) = (comm.rank(), comm.size(), T::DTYPE);
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
        let name = |call: &str| format!("{what} {call} {dt} {op} n={n} count={count} rank={rank}");
        let tol = |w: f64| tolerance(dt, op, w);
        let want = |i: usize| reference(dt, op, n, rank * count + i);
        let big: Vec<T> = make(count * n, |i| input_value(dt, op, rank, n, i));
        let mut out = vec![T::from_f64(-99.0); count];
        comm.reduce_scatter(&big, &mut out, op).unwrap();
        check(&name("reduce_scatter"), &out, want, tol);
        let mut buf = big.clone();
        comm.reduce_scatter_in_place(&mut buf, op).unwrap();
        let mine = &buf[rank * count..(rank + 1) * count];
        check(&name("reduce_scatter_in_place"), mine, want, tol);
        let buf = comm.reduce_scatter_async(big, op).unwrap().wait().unwrap();
        let mine = &buf[rank * count..(rank + 1) * count];
        check(&name("reduce_scatter_async"), mine, want, tol);
    }
}

/// Every type at counts that leave blocks empty, ragged over the chunks,
/// and several slot-sized passes (100,003 f64 a block are 0.8 MB).
fn gather_and_scatter_every_type(comm: &Communicator, what: &str) {
    let n = comm.size();
    for count in [0, 1, n + 1, 5000, 100_003] {
        all_gathers::<f32>(comm, count, what);
        all_gathers::<f64>(comm, count, what);
        all_gathers::<i32>(comm, count, what);
        all_gathers::<bf16>(comm, count, what);
        reduce_scatters::<f32>(comm, count, what);
        reduce_scatters::<f64>(comm, count, what);
        reduce_scatters::<i32>(comm, count, what);
        reduce_scatters::<bf16>(comm, count, what);
    }
}

/// The builder's recursive-doubling allgather and pairwise reduce-scatter
/// given in code (beside the halving-doubling allreduce), and checked
/// that the allreduce still runs.
#[test]
fn allgather_and_reduce_scatter_from_the_builder_on_real_transports() {
    for (n, transport) in [(1, "mem"), (2, "shm"), (4, "shm"), (4, "tcp"), (8, "mem")] {
        run_ranks_with(
            n,
            |c| {
                settings(transport)(c);
                c.user_algorithm = Some(halving_doubling(8));
                c.user_algorithms =
                    vec![recursive_doubling_allgather(8), pairwise_reduce_scatter(8)];
            },
            |comm| {
                let what = format!("recursive doubling / pairwise {transport}");
                gather_and_scatter_every_type(&comm, &what);
                all_reduces::<f32>(&comm, 5000, &what);
            },
        );
    }
}

/// Bruck's allgather from its text file, beside the pairwise
/// reduce-scatter's text, both in one file (FERROCCL_ALGO_FILE holds one
/// algorithm per collective), on shm and TCP at rank counts that are not
/// powers of two.
#[test]
fn bruck_and_pairwise_from_one_text_file_on_real_transports() {
    let dir = std::env::temp_dir().join(format!("ferroccl-user-coll-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let both = dir.join("both.algo");
    let bruck = std::fs::read_to_string(bruck_file()).unwrap();
    let pairwise = text::write(&pairwise_reduce_scatter(8));
    std::fs::write(&both, format!("{bruck}\n{pairwise}")).unwrap();
    for (n, transport) in [(3, "shm"), (5, "tcp"), (6, "shm"), (7, "mem")] {
        run_ranks_with(
            n,
            |c| {
                settings(transport)(c);
                c.algorithm_file = Some(both.clone());
            },
            |comm| gather_and_scatter_every_type(&comm, &format!("bruck / pairwise {transport}")),
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reduce-scatter the checker finds right out of place and wrong in
/// place: the communicator runs it out of place and refuses the in-place
/// call before anything moves, saying why (and stays usable).
#[test]
fn an_algorithm_wrong_in_place_is_refused_in_place_only() {
    let twice = UserAlgorithm::build("twice", Collective::ReduceScatter, [2], |b| {
        let (r, p) = (b.rank(), 1 - b.rank());
        b.send(p, Chunks::one(p, 2)).send(p, Chunks::one(p, 2));
        b.recv_reduce_copy(p, Chunks::one(r, 2));
        b.recv_reduce_copy(p, Chunks::one(r, 2));
    });
    run_ranks_with(
        2,
        |c| {
            settings("mem")(c);
            c.user_algorithm = Some(twice.clone());
        },
        |comm| {
            let rank = comm.rank();
            let big: Vec<f64> = (0..8).map(|i| (rank * 100 + i) as f64).collect();
            let mut out = vec![0.0; 4];
            comm.reduce_scatter(&big, &mut out, ReduceOp::Sum).unwrap();
            let want: Vec<f64> = (0..4)
                .map(|i| (0..2).map(|q| (q * 100 + rank * 4 + i) as f64).sum())
                .collect();
            assert_eq!(out, want);
            let mut buf = big.clone();
            let err = comm
                .reduce_scatter_in_place(&mut buf, ReduceOp::Sum)
                .unwrap_err()
                .to_string();
            assert!(err.contains("wrong results in place"), "{err}");
            assert_eq!(buf, big, "nothing moved");
            comm.reduce_scatter(&big, &mut out, ReduceOp::Sum).unwrap();
            assert_eq!(out, want);
        },
    );
}

/// Files the communicator refuses: two algorithms for one collective,
/// and an allgather step that reads the input outside its block (with
/// the line, rank and step).
#[test]
fn refused_allgather_and_reduce_scatter_files_name_the_mistake() {
    let dir = std::env::temp_dir().join(format!("ferroccl-user-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bruck = std::fs::read_to_string(bruck_file()).unwrap();
    let two = dir.join("two.algo");
    std::fs::write(&two, format!("{bruck}\n{bruck}")).unwrap();
    let msg = creation_error(3, |c| {
        settings("mem")(c);
        c.algorithm_file = Some(two.clone());
    });
    assert!(msg.contains("two user algorithms for allgather"), "{msg}");
    // Rank 1 of 4 sends blocks 1..3 from the input in round 2 (where it
    // sends them from its output).
    let bad = bruck.replacen(
        "rank 1: send to 3 chunks 1..3 of 4 using output",
        "rank 1: send to 3 chunks 1..3 of 4",
        1,
    );
    assert_ne!(bad, bruck);
    let path = dir.join("outside.algo");
    std::fs::write(&path, bad).unwrap();
    let msg = creation_error(4, |c| {
        settings("mem")(c);
        c.algorithm_file = Some(path.clone());
    });
    assert!(msg.contains("outside rank 1's own block"), "{msg}");
    assert!(
        msg.contains("line ") && msg.contains("rank 1, step "),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The Bruck script's text for rank counts `sizes`.
fn bruck_text(sizes: &str) -> String {
    script_text("bruck.py", sizes)
}

/// The shipped file is what the script writes; the script's Bruck passes
/// the whole check on 1..64 ranks and the matching check on sampled
/// counts up to 4,096 (values on the smaller of them); the builder's
/// examples likewise.
#[test]
fn the_allgather_and_reduce_scatter_examples_are_checked_for_1_to_64_ranks_and_sampled_to_4096() {
    assert_eq!(
        bruck_text("16"),
        std::fs::read_to_string(bruck_file()).unwrap(),
        "examples/algorithms/bruck.algo is stale: rerun bruck.py > bruck.algo"
    );
    let algo = text::parse(&bruck_text("64")).unwrap();
    assert_eq!(
        (algo.collective, algo.sizes().count()),
        (Collective::AllGather, 64)
    );
    algo.check().unwrap();
    let sampled = [100usize, 127, 256, 1000, 4096];
    let list: Vec<String> = sampled.iter().map(|n| n.to_string()).collect();
    let big = text::parse(&bruck_text(&list.join(","))).unwrap();
    for n in sampled {
        big.check_matching(n).unwrap();
    }
    for n in [100, 127, 256] {
        big.check_values(n).unwrap();
    }
    pairwise_reduce_scatter(64).check().unwrap();
    recursive_doubling_allgather(64).check().unwrap();
}
