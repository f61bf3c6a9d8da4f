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

/// The torus script's text for rank counts `sizes`.
fn torus_text(sizes: &str) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/algorithms/torus.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(sizes)
        .output()
        .expect("python3 runs examples/algorithms/torus.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
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
