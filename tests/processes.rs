//! Real processes: `ferroccl-check` under the `ferroccl-run` launcher (TCP
//! rendezvous, TCP transport), with ranks killed, hung or given the wrong
//! token. Every run is bounded: a launcher that outlives its limit is killed
//! and the test fails instead of hanging CI.

mod common;

use common::process::{clean, run_bounded, Finished};
use std::process::Command;
use std::time::Duration;

const RUN: &str = env!("CARGO_BIN_EXE_ferroccl-run");
const CHECK: &str = env!("CARGO_BIN_EXE_ferroccl-check");

/// `ferroccl-run -n N [env] -- ferroccl-check ARGS`.
fn launch(n: usize, env: &[(&str, &str)], args: &[&str], limit: Duration) -> Finished {
    let mut cmd = clean(RUN);
    let n = n.to_string();
    cmd.args(["-n", &n, "--", CHECK]).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_bounded(cmd, limit)
}

/// Whether `text` names a call with its sequence number (`name #17`).
fn has_numbered_call(text: &str) -> bool {
    text.split('#')
        .skip(1)
        .any(|after| after.chars().next().is_some_and(|c| c.is_ascii_digit()))
}

/// Whether an error blames `rank` (a failure report or a timeout on it).
fn blames(err: &str, rank: usize) -> bool {
    err.contains(&format!("rank {rank} failed"))
        || err.contains(&format!("waiting for rank {rank} "))
}

#[test]
fn every_check_passes_on_four_ranks() {
    let f = launch(
        4,
        &[],
        &["--count", "20011", "--iters", "2"],
        Duration::from_secs(120),
    );
    assert!(f.status.success(), "exit {:?}\n{}", f.status, f.all());
    let lines = f.prefixed();
    let mut passed = Vec::new();
    for r in 0..4 {
        let own = format!("ferroccl-check: rank {r}: ");
        let line = lines
            .iter()
            .find_map(|(pr, rest)| (*pr == r).then(|| rest.strip_prefix(&own)).flatten())
            .unwrap_or_else(|| panic!("rank {r} printed no summary\n{}", f.all()));
        let n: usize = line
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("bad summary of rank {r}: {line}"));
        passed.push(n);
    }
    assert!(
        passed.iter().all(|&n| n == passed[0] && n > 100),
        "ranks passed different numbers of checks: {passed:?}"
    );
    let listed = lines
        .iter()
        .filter(|(r, rest)| *r == 0 && rest.starts_with("ok "))
        .count();
    assert_eq!(listed, passed[0], "rank 0 lists one line per check");
    for kind in [
        "all_reduce ",
        "all_reduce_in_place ",
        "reduce_scatter ",
        "all_gather ",
        "broadcast ",
        "reduce ",
        "send/recv ",
        "all_to_all ",
        "barrier ",
        "split ",
    ] {
        assert!(
            lines
                .iter()
                .any(|(r, rest)| *r == 0 && rest.starts_with(&format!("ok {kind}"))),
            "rank 0 listed no {kind}check"
        );
    }
    assert!(
        lines
            .iter()
            .all(|(r, rest)| *r == 0 || !rest.starts_with("ok ")),
        "only rank 0 lists checks"
    );
    let total = format!("ferroccl-check: {} checks passed on 4 ranks", passed[0]);
    assert!(
        lines.iter().any(|(r, rest)| *r == 0 && rest == &total),
        "no '{total}'\n{}",
        f.all()
    );
}

const KILL_ARGS: [&str; 6] = ["--die-rank", "2", "--die-at", "5", "--iters", "3"];
const KILL_ENV: [(&str, &str); 2] = [("FERROCCL_TIMEOUT", "5"), ("FERROCCL_RUN_GRACE_S", "10")];

#[test]
fn a_rank_killed_mid_collective_is_named_by_the_survivors() {
    let f = launch(4, &KILL_ENV, &KILL_ARGS, Duration::from_secs(60));
    assert!(!f.status.success(), "{}", f.all());
    // Well under the 5 s timeout: the dead peer's sockets close at once and
    // the failure is broadcast; 30 s leaves room for a loaded machine.
    assert!(f.elapsed < Duration::from_secs(30), "took {:?}", f.elapsed);
    assert!(
        f.error_of(2).is_some_and(
            |e| e.contains("killing this process with SIGKILL before collective call 5")
        ),
        "rank 2 did not announce its death\n{}",
        f.all()
    );
    let errors: Vec<(usize, String)> = [0, 1, 3]
        .into_iter()
        .filter_map(|r| f.error_of(r).map(|e| (r, e)))
        .collect();
    // The launcher stops the survivors once it sees a rank end, so some may
    // be gone before they print; the first to notice always prints.
    assert!(
        errors.iter().any(|(_, e)| blames(e, 2)),
        "no survivor named rank 2\n{}",
        f.all()
    );
    for (r, e) in &errors {
        assert!(
            has_numbered_call(e),
            "rank {r}'s error names no call with its number: {e}"
        );
        assert!(
            e.contains(" failed") || e.contains("timed out"),
            "rank {r}: {e}"
        );
    }
    // The launcher names the rank whose end it saw first: rank 2 (signal 9),
    // or a survivor that had already exited on its error.
    let said = f
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("ferroccl-run: rank "))
        .unwrap_or_else(|| panic!("the launcher named no failed rank\n{}", f.all()));
    if said.starts_with("2 ") {
        assert_eq!(said, "2 was killed by signal 9");
        assert_eq!(f.status.code(), Some(128 + 9));
    } else {
        let r: usize = said.split(' ').next().unwrap().parse().unwrap();
        assert!(
            errors.iter().any(|(er, _)| *er == r) && said.ends_with("exited with code 1"),
            "the launcher blamed rank {r}, which printed no error: {said}\n{}",
            f.all()
        );
    }
}

/// What the design promises and the code does not yet deliver every time
/// (see the report of this branch): the launcher reports the rank that died,
/// and every survivor, including rank 0 (no ring neighbour of rank 2),
/// prints an error that names rank 2.
#[test]
fn a_killed_rank_is_named_everywhere() {
    for _ in 0..10 {
        let f = launch(4, &KILL_ENV, &KILL_ARGS, Duration::from_secs(60));
        assert!(
            f.stderr
                .contains("ferroccl-run: rank 2 was killed by signal 9"),
            "{}",
            f.all()
        );
        for r in [0, 1, 3] {
            let e = f
                .error_of(r)
                .unwrap_or_else(|| panic!("rank {r} printed no error\n{}", f.all()));
            assert!(blames(&e, 2) && has_numbered_call(&e), "rank {r}: {e}");
        }
    }
}

#[test]
fn a_hanging_rank_times_out_with_its_name() {
    // Two ranks: rank 0 waits on rank 1 directly.
    let f = launch(
        2,
        &[("FERROCCL_TIMEOUT", "3"), ("FERROCCL_RUN_GRACE_S", "1")],
        &["--hang-rank", "1", "--hang-at", "3"],
        Duration::from_secs(90),
    );
    assert!(!f.status.success(), "{}", f.all());
    assert!(
        f.elapsed >= Duration::from_secs(3) && f.elapsed < Duration::from_secs(3 + 30),
        "took {:?}\n{}",
        f.elapsed,
        f.all()
    );
    assert!(
        f.error_of(1).is_some_and(|e| e.contains("hanging")),
        "{}",
        f.all()
    );
    let e = f
        .error_of(0)
        .unwrap_or_else(|| panic!("rank 0 printed no error\n{}", f.all()));
    assert!(
        e.contains("timed out after") && blames(&e, 1) && has_numbered_call(&e),
        "rank 0: {e}"
    );
    assert!(
        f.stderr.contains("ferroccl-run: rank 0 exited with code 1"),
        "{}",
        f.all()
    );
}

/// With four ranks every survivor should name the silent rank 1; today the
/// ranks further along the ring time out on their own predecessor at about
/// the same moment and blame it instead (see the report of this branch).
#[test]
#[ignore = "issue 4: with a silent (not dead) rank every healthy rank times out at about the same \
            moment blaming its own predecessor; telling the silent rank apart needs heartbeats"]
fn a_hanging_rank_is_named_by_every_survivor() {
    let f = launch(
        4,
        &[("FERROCCL_TIMEOUT", "3"), ("FERROCCL_RUN_GRACE_S", "10")],
        &["--hang-rank", "1", "--hang-at", "3"],
        Duration::from_secs(90),
    );
    assert!(!f.status.success());
    for r in [0, 2, 3] {
        let e = f
            .error_of(r)
            .unwrap_or_else(|| panic!("rank {r} printed no error\n{}", f.all()));
        assert!(blames(&e, 1) && has_numbered_call(&e), "rank {r}: {e}");
    }
}

/// Start rank `rank` of 2 by hand with the given token.
fn by_hand(rank: usize, port: u16, token: &str) -> Command {
    let mut cmd = clean(CHECK);
    cmd.env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("FERROCCL_TOKEN", token)
        .env("FERROCCL_TIMEOUT", "3");
    cmd
}

#[test]
fn a_rank_with_the_wrong_token_is_refused() {
    let port = ferroccl::bootstrap::free_port().expect("free port");
    let rank0 =
        std::thread::spawn(move || run_bounded(by_hand(0, port, "1111"), Duration::from_secs(60)));
    // Let rank 0 open the rendezvous first (rank 1 would retry anyway).
    std::thread::sleep(Duration::from_millis(200));
    let one = run_bounded(by_hand(1, port, "2222"), Duration::from_secs(60));
    let zero = rank0.join().expect("rank 0 thread");
    assert_eq!(one.status.code(), Some(1), "{}", one.all());
    assert!(
        one.stderr.contains("rank 1: ") && one.stderr.contains("token"),
        "{}",
        one.all()
    );
    assert!(one.elapsed < Duration::from_secs(30), "{:?}", one.elapsed);
    assert_eq!(zero.status.code(), Some(1), "{}", zero.all());
    assert!(zero.stderr.contains("rank 0: "), "{}", zero.all());
    assert!(
        zero.elapsed >= Duration::from_secs(2) && zero.elapsed < Duration::from_secs(3 + 30),
        "rank 0 gave up after {:?}\n{}",
        zero.elapsed,
        zero.all()
    );
}

#[test]
fn without_a_launcher_the_variables_are_named() {
    let f = run_bounded(clean(CHECK), Duration::from_secs(30));
    assert_eq!(f.status.code(), Some(1), "{}", f.all());
    for needed in [
        "no launcher environment found",
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        assert!(f.stderr.contains(needed), "no '{needed}' in {}", f.all());
    }
}

#[test]
fn bad_options_and_help() {
    let mut help = clean(CHECK);
    help.arg("--help");
    let f = run_bounded(help, Duration::from_secs(30));
    assert!(f.status.success());
    assert!(f.stdout.contains("--die-rank") && f.stdout.contains("--count"));
    for bad in [
        &["--count"][..],
        &["--count", "many"],
        &["--die-rank", "1"],
        &["--hang-at", "0", "--hang-rank", "1"],
        &["--frobnicate"],
    ] {
        let mut cmd = clean(CHECK);
        cmd.args(bad);
        let f = run_bounded(cmd, Duration::from_secs(30));
        assert_eq!(f.status.code(), Some(2), "{bad:?}: {}", f.all());
        assert!(f.stderr.contains("usage:"), "{bad:?}: {}", f.all());
    }
}

/// Files left in a job's private segment directory.
fn leftovers(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn shared_memory_is_empty_after_a_normal_exit_and_after_a_kill() {
    // A private directory on the same tmpfs, so that other tests' segments
    // do not count.
    let dir = std::path::PathBuf::from(format!("/dev/shm/ferroccl-test-{}", std::process::id()));
    if std::fs::create_dir_all(&dir).is_err() {
        eprintln!("SKIPPED: /dev/shm is not writable here");
        return;
    }
    let d = dir.to_string_lossy().into_owned();
    let env = [
        ("FERROCCL_SHM_DIR", d.as_str()),
        ("FERROCCL_TRANSPORT", "shm"),
    ];
    let f = launch(4, &env, &["--count", "5003"], Duration::from_secs(120));
    assert!(f.status.success(), "exit {:?}\n{}", f.status, f.all());
    assert!(f.stdout.contains("transports: "), "{}", f.all());
    assert_eq!(leftovers(&dir), Vec::<String>::new(), "after a normal exit");

    let mut kill_env = KILL_ENV.to_vec();
    kill_env.extend(env);
    let f = launch(4, &kill_env, &KILL_ARGS, Duration::from_secs(60));
    assert!(!f.status.success(), "{}", f.all());
    assert!(
        f.stderr.contains("rank 2 was killed by signal 9"),
        "{}",
        f.all()
    );
    assert_eq!(
        leftovers(&dir),
        Vec::<String>::new(),
        "after rank 2 was killed"
    );
    let _ = std::fs::remove_dir(&dir);
}
