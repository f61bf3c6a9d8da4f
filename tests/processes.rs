//! Real processes: `ferroccl-check` under the `ferroccl-run` launcher (TCP
//! rendezvous, TCP transport), with ranks killed, hung or given the wrong
//! token. Every run is bounded: a launcher that outlives its limit is killed
//! and the test fails instead of hanging CI.
//!
//! Over 800 lines on purpose: every case shares the launcher harness and
//! the checker's expectations, and each file of its own in tests/ would be
//! one more binary to link on CI's two cores.

mod common;

use common::process::{clean, ferroccl_run, run_bounded, Finished};
use common::SplitMix;
use std::process::Command;
use std::time::Duration;

const CHECK: &str = env!("CARGO_BIN_EXE_ferroccl-check");

/// `ferroccl-run -n N [env] -- ferroccl-check ARGS`.
fn launch(n: usize, env: &[(&str, &str)], args: &[&str], limit: Duration) -> Finished {
    launch_via(n, env, &[CHECK], args, limit)
}

/// `ferroccl-run -n N [env] -- PROGRAM... ARGS`: `program` is the command
/// line that runs ferroccl-check (a wrapper's words, then the check).
fn launch_via(
    n: usize,
    env: &[(&str, &str)],
    program: &[&str],
    args: &[&str],
    limit: Duration,
) -> Finished {
    let mut cmd = clean(ferroccl_run());
    let n = n.to_string();
    cmd.args(["-n", &n, "--"]).args(program).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run_bounded(cmd, limit)
}

/// The sizes in `sizes` of at least `lo` bytes.
fn at_least(sizes: Vec<usize>, lo: usize) -> Vec<usize> {
    sizes.into_iter().filter(|&b| b >= lo).collect()
}

/// Whether `text` names a call with its sequence number (`name #17`).
fn has_numbered_call(text: &str) -> bool {
    text.split('#')
        .skip(1)
        .any(|after| after.chars().next().is_some_and(|c| c.is_ascii_digit()))
}

/// Whether an error blames `rank` (a failure report or a timeout on it;
/// during a sub-communicator's set-up the rank is named in the job's
/// numbering: "rank 0 of the job, the rendezvous host, failed").
fn blames(err: &str, rank: usize) -> bool {
    err.contains(&format!("rank {rank} failed"))
        || err.contains(&format!("waiting for rank {rank} "))
        || err.contains(&format!("rank {rank} of the job"))
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

/// The sizes of the broadcasts in `f`'s `plan:` lines of rank 0 that say
/// `route`.
fn broadcasts_routed(f: &Finished, route: &str) -> Vec<usize> {
    routed(f, "broadcast", route)
}

/// The sizes of `kind`'s calls rank 0's plan lines sent by `route`.
fn routed(f: &Finished, kind: &str, route: &str) -> Vec<usize> {
    let head = format!("plan: {kind} of ");
    f.prefixed()
        .iter()
        .filter(|(r, rest)| *r == 0 && rest.contains(route))
        .filter_map(|(_, rest)| {
            let after = rest.split(head.as_str()).nth(1)?;
            after.split(' ').next()?.parse().ok()
        })
        .collect()
}

/// On 2 ranks, broadcasts of 64 to 512 KiB of ordinary buffers copy the
/// root's input straight out of its process (cross-memory attach; the
/// fixed range, FERROCCL_CALIBRATE=0), the root pushing the second half
/// into the receiver's output meanwhile: `ferroccl-check`'s broadcasts of
/// 65 536 elements (64 KiB to 512 KiB by element type, from every root),
/// checked element by element against the root's data, must pass routed
/// so, and pass through slots with FERROCCL_CMA=0, with the same number of
/// checks. The same run's allreduces of 512 KiB (8-byte types, every op,
/// in place and out, checked against an f64 reference) run by
/// cross-memory attach too, each rank pulling half of the peer's input
/// and writing the reduced half into the peer's output, while those of
/// 64-256 KiB go through slots; with FERROCCL_CMA_PUSH=0 on rank 1 alone
/// neither writes into the other (the broadcasts pulled whole, every
/// allreduce through slots), with the same checks passing. Where the
/// machine forbids cross-memory attach (Yama, a container profile) the
/// runs take the slots and must agree.
#[test]
fn two_ranks_broadcast_out_of_the_roots_process() {
    let args = ["--count", "65536", "--iters", "2"];
    let limit = Duration::from_secs(120);
    let env = [("FERROCCL_DEBUG", "INFO"), ("FERROCCL_CALIBRATE", "0")];
    let with = launch(2, &env, &args, limit);
    assert!(
        with.status.success(),
        "exit {:?}\n{}",
        with.status,
        with.all()
    );
    let without = launch(2, &[env[0], ("FERROCCL_CMA", "0")], &args, limit);
    assert!(
        without.status.success(),
        "exit {:?}\n{}",
        without.status,
        without.all()
    );
    let total = |f: &Finished| {
        f.prefixed()
            .into_iter()
            .find(|(r, rest)| *r == 0 && rest.ends_with("checks passed on 2 ranks"))
            .unwrap_or_else(|| panic!("no total on rank 0\n{}", f.all()))
            .1
    };
    assert_eq!(total(&with), total(&without));
    let pulled = "-> ring, check-in, then straight out of the peers' processes";
    let slots = "-> ring, through the transport's slots";
    let large = |sizes: Vec<usize>| at_least(sizes, 64 << 10);
    assert!(large(broadcasts_routed(&without, pulled)).is_empty());
    assert!(
        !large(broadcasts_routed(&without, slots)).is_empty(),
        "{}",
        without.all()
    );
    if with
        .all()
        .contains("cross-memory attach between the 2 ranks")
    {
        // Where a rank may read another's memory it may write it too (the
        // same permission), so the root pushes a share of each broadcast
        // while the receiver pulls the rest: the checks above passed with
        // both halves moved that way.
        let log = with.all();
        if log.contains("cross-memory attach reads only") {
            eprintln!("cross-memory writes not permitted here; broadcasts pulled whole");
        } else {
            assert!(
                log.contains("the root pushing a share of each broadcast into the receivers"),
                "{log}"
            );
            // The allreduces of 512 KiB: every one by the pull and push
            // (none through slots), each checked by ferroccl-check; those
            // of 64-256 KiB through slots. (The algorithm named before the
            // route is the tuner's; a plan line is said once per size
            // class.)
            let (pulled, slots) = (
                "check-in, then straight out of the peers' processes",
                "through the transport's slots",
            );
            let reduced = routed(&with, "all_reduce", pulled);
            assert!(
                !reduced.is_empty() && reduced.iter().all(|&b| b >= 512 << 10),
                "allreduces pulled: {reduced:?}\n{log}"
            );
            let through_slots = large(routed(&with, "all_reduce", slots));
            assert!(
                !through_slots.is_empty() && through_slots.iter().all(|&b| b < 512 << 10),
                "allreduces through slots: {through_slots:?}\n{log}"
            );
            assert!(!at_least(routed(&without, "all_reduce", slots), 512 << 10).is_empty());

            // Rank 1 alone forbids writes: the ranks agree to read only,
            // and every check still passes.
            let script = "[ \"$RANK\" = 1 ] && export FERROCCL_CMA_PUSH=0; exec \"$0\" \"$@\"";
            let reads = launch_via(2, &env, &["sh", "-c", script, CHECK], &args, limit);
            assert!(
                reads.status.success(),
                "exit {:?}\n{}",
                reads.status,
                reads.all()
            );
            assert_eq!(total(&reads), total(&without));
            let log = reads.all();
            assert!(
                log.contains("cross-memory attach reads only (FERROCCL_CMA_PUSH=0")
                    && log.contains("cross-memory attach reads only (another rank")
                    && !log.contains("the root pushing a share"),
                "{log}"
            );
            assert!(routed(&reads, "all_reduce", pulled).is_empty(), "{log}");
            assert!(!at_least(routed(&reads, "all_reduce", slots), 512 << 10).is_empty());
            assert!(
                !large(broadcasts_routed(&reads, pulled)).is_empty(),
                "{log}"
            );
        }
        let mut sizes = large(broadcasts_routed(&with, pulled));
        sizes.sort_unstable();
        sizes.dedup();
        assert!(
            sizes.len() >= 3 && sizes.iter().all(|&b| b <= 512 << 10),
            "broadcasts pulled: {sizes:?}\n{}",
            with.all()
        );
        assert!(large(broadcasts_routed(&with, slots)).is_empty());
    } else {
        eprintln!("cross-memory attach not permitted here; both runs used slots");
        assert!(!large(broadcasts_routed(&with, slots)).is_empty());
    }
}

/// On 4 ranks, broadcasts above the inline limit of ordinary buffers go
/// through the root's staging area on its control page, which every
/// receiver reads (`exec::spread`), between real processes:
/// `ferroccl-check`'s broadcasts of 65 536 elements (64 KiB to 512 KiB by
/// element type, from every root), checked element by element against the
/// root's data, must pass routed so, and pass through the chain of slots
/// with FERROCCL_SPREAD=0, with the same number of checks.
#[test]
fn four_ranks_broadcast_through_the_roots_staging_area() {
    let args = ["--count", "65536", "--iters", "2"];
    let limit = Duration::from_secs(120);
    let env = [("FERROCCL_DEBUG", "INFO"), ("FERROCCL_CALIBRATE", "0")];
    let run = |spread: &str| {
        let f = launch(
            4,
            &[env[0], env[1], ("FERROCCL_SPREAD", spread)],
            &args,
            limit,
        );
        assert!(f.status.success(), "exit {:?}\n{}", f.status, f.all());
        f
    };
    let (with, without) = (run("1"), run("0"));
    let total = |f: &Finished| {
        f.prefixed()
            .into_iter()
            .find(|(r, rest)| *r == 0 && rest.ends_with("checks passed on 4 ranks"))
            .unwrap_or_else(|| panic!("no total on rank 0\n{}", f.all()))
            .1
    };
    assert_eq!(total(&with), total(&without));
    let staged = "-> ring, check-in, then through the staging areas";
    let slots = "-> ring, through the transport's slots";
    let large = |sizes: Vec<usize>| at_least(sizes, 64 << 10);
    let mut sizes = large(broadcasts_routed(&with, staged));
    sizes.sort_unstable();
    sizes.dedup();
    assert!(
        sizes.len() >= 3,
        "broadcasts staged: {sizes:?}\n{}",
        with.all()
    );
    assert!(large(broadcasts_routed(&with, slots)).is_empty());
    assert!(large(broadcasts_routed(&without, staged)).is_empty());
    assert!(
        !large(broadcasts_routed(&without, slots)).is_empty(),
        "{}",
        without.all()
    );
}

/// The errors the `survivors` printed: at least one names `victim`, and
/// each names the call it ended, with its number. (The launcher stops the
/// survivors once it sees a rank end, so some may be gone before they
/// print; the first to notice always prints.)
fn survivors_name(f: &Finished, victim: usize, survivors: &[usize]) -> Vec<(usize, String)> {
    let errors: Vec<(usize, String)> = survivors
        .iter()
        .filter_map(|&r| f.error_of(r).map(|e| (r, e)))
        .collect();
    assert!(
        errors.iter().any(|(_, e)| blames(e, victim)),
        "no survivor named rank {victim}\n{}",
        f.all()
    );
    for (r, e) in &errors {
        assert!(
            has_numbered_call(e),
            "rank {r}'s error names no call with its number: {e}"
        );
    }
    errors
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
    let errors = survivors_name(&f, 2, &[0, 1, 3]);
    for (r, e) in &errors {
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
            assert!(
                blames(&e, 2) && has_numbered_call(&e),
                "rank {r}: {e}\n{}",
                f.all()
            );
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
fn the_in_process_transport_is_refused_for_process_ranks() {
    // FERROCCL_TRANSPORT=mem reaches only threads of one process; ranks
    // started by a launcher must say so at once, not wait out the timeout.
    let f = launch(
        2,
        &[("FERROCCL_TRANSPORT", "mem"), ("FERROCCL_TIMEOUT", "60")],
        &[],
        Duration::from_secs(60),
    );
    assert_ne!(f.status.code(), Some(0), "{}", f.all());
    for r in 0..2 {
        let e = f
            .error_of(r)
            .unwrap_or_else(|| panic!("rank {r} printed no error\n{}", f.all()));
        assert!(e.contains("FERROCCL_TRANSPORT=mem"), "rank {r}: {e}");
    }
    assert!(f.elapsed < Duration::from_secs(20), "took {:?}", f.elapsed);
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

// ------------------------------------------------------------ fault suite
//
// Each case runs a real job under the launcher with a fault injected,
// asserts the named error on every survivor within a bounded time, and
// checks that the job left no process and no shared-memory file behind.

/// `launch` with `-- ferroccl-check ARGS` and a marker in every rank's
/// environment, so that leftover processes of this job can be found.
fn launch_marked(
    n: usize,
    env: &[(&str, &str)],
    args: &[&str],
    limit: Duration,
    marker: &str,
) -> Finished {
    let mut env = env.to_vec();
    env.push(("FERROCCL_TEST_JOB", marker));
    launch(n, &env, args, limit)
}

/// Processes still alive that carry `FERROCCL_TEST_JOB=marker`.
fn processes_of(marker: &str) -> Vec<u32> {
    let needle = format!("FERROCCL_TEST_JOB={marker}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

/// A job's private directory for shared-memory segments, removed on drop.
struct ShmDir(std::path::PathBuf);

impl ShmDir {
    fn new(name: &str) -> Option<ShmDir> {
        let dir = std::path::PathBuf::from(format!(
            "/dev/shm/ferroccl-test-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).ok()?;
        Some(ShmDir(dir))
    }

    fn path(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for ShmDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Assert that the job of `marker` left no process and, for shm, no file.
fn assert_nothing_left(marker: &str, shm: Option<&ShmDir>, f: &Finished) {
    // The launcher reaps its ranks before it exits; a rank stopped with
    // SIGSTOP must have been killed, not left behind.
    let left = processes_of(marker);
    assert!(left.is_empty(), "processes left: {left:?}\n{}", f.all());
    if let Some(dir) = shm {
        assert_eq!(
            leftovers(&dir.0),
            Vec::<String>::new(),
            "shared-memory files left\n{}",
            f.all()
        );
    }
    assert!(
        !f.all().contains("panicked"),
        "a process panicked\n{}",
        f.all()
    );
}

/// Every rank in `survivors` printed an error naming `culprit` and its call.
fn assert_named_by(f: &Finished, culprit: usize, survivors: &[usize]) {
    for &r in survivors {
        let e = f
            .error_of(r)
            .unwrap_or_else(|| panic!("rank {r} printed no error\n{}", f.all()));
        assert!(
            blames(&e, culprit) && has_numbered_call(&e),
            "rank {r} does not name rank {culprit} with a numbered call: {e}\n{}",
            f.all()
        );
    }
}

/// The transports a fault case runs over: TCP always, shared memory when
/// /dev/shm is writable here.
fn fault_transports(case: &str) -> Vec<(&'static str, Option<ShmDir>)> {
    let mut out = vec![("tcp", None)];
    match ShmDir::new(case) {
        Some(dir) => out.push(("shm", Some(dir))),
        None => eprintln!("{case}: /dev/shm is not writable here; shm case skipped"),
    }
    out
}

/// A rank stopped with SIGSTOP keeps its sockets open: only its missing
/// heartbeats give it away. Every survivor must name it well before the
/// collective timeout would have, and the launcher must kill it.
fn stopped_rank_case(n: usize, victim: usize) {
    let timeout_s = 6;
    for (transport, shm) in fault_transports(&format!("stop{victim}")) {
        let marker = format!("stop-{victim}-{transport}-{}", std::process::id());
        let timeout = timeout_s.to_string();
        let mut env = vec![
            ("FERROCCL_TIMEOUT", timeout.as_str()),
            ("FERROCCL_RUN_GRACE_S", "1"),
            ("FERROCCL_TRANSPORT", transport),
        ];
        let dir = shm.as_ref().map(ShmDir::path);
        if let Some(d) = &dir {
            env.push(("FERROCCL_SHM_DIR", d));
        }
        let victim_s = victim.to_string();
        let f = launch_marked(
            n,
            &env,
            &["--stop-rank", &victim_s, "--stop-at", "5", "--iters", "3"],
            Duration::from_secs(90),
            &marker,
        );
        assert!(!f.status.success(), "{}", f.all());
        assert!(
            f.error_of(victim)
                .is_some_and(|e| e.contains("with SIGSTOP before collective call 5")),
            "rank {victim} did not announce its stop\n{}",
            f.all()
        );
        let survivors: Vec<usize> = (0..n).filter(|&r| r != victim).collect();
        assert_named_by(&f, victim, &survivors);
        // Named through the missing heartbeats (four intervals of
        // timeout/8), not through the collective timeout.
        assert!(
            survivors
                .iter()
                .filter_map(|&r| f.error_of(r))
                .any(|e| e.contains("no heartbeat")),
            "no survivor heard of the missing heartbeats\n{}",
            f.all()
        );
        // Start-up, the wait for the heartbeats, the launcher's settle and
        // grace times, and a margin for a loaded machine.
        assert!(
            f.elapsed < Duration::from_secs(timeout_s + 30),
            "{transport}: took {:?}",
            f.elapsed
        );
        assert_nothing_left(&marker, shm.as_ref(), &f);
    }
}

#[test]
fn a_stopped_rank_is_named_by_every_survivor() {
    stopped_rank_case(4, 2);
}

#[test]
fn a_stopped_rendezvous_host_is_named_by_every_survivor() {
    // Rank 0 hosts the rendezvous: its server stops with it, and the
    // others notice the server's missing heartbeats.
    stopped_rank_case(3, 0);
}

/// The seed of the randomised fault cases: FERROCCL_FAULT_SEED, or the
/// clock; printed so that a failure can be replayed.
fn fault_seed() -> u64 {
    let seed = std::env::var("FERROCCL_FAULT_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("fault seed {seed} (replay with FERROCCL_FAULT_SEED={seed})");
    seed
}

#[test]
fn a_rank_killed_at_a_random_moment_is_named_by_every_survivor() {
    let seed = fault_seed();
    let mut rng = SplitMix(seed);
    for (transport, shm) in fault_transports("kill") {
        for case in 0..2 {
            let n = 3 + rng.below(2) as usize;
            let victim = rng.below(n as u64) as usize;
            // Somewhere in the first few iterations of every collective,
            // splits included.
            let after_ms = 20 + rng.below(400);
            let what = format!(
                "seed {seed} case {case}: {transport}, {n} ranks, rank {victim} killed \
                 {after_ms} ms after joining{}",
                if case == 1 { ", windows" } else { "" }
            );
            eprintln!("{what}");
            let marker = format!("kill-{transport}-{case}-{}", std::process::id());
            let mut env = vec![
                ("FERROCCL_TIMEOUT", "5"),
                ("FERROCCL_RUN_GRACE_S", "2"),
                ("FERROCCL_TRANSPORT", transport),
            ];
            let dir = shm.as_ref().map(ShmDir::path);
            if let Some(d) = &dir {
                env.push(("FERROCCL_SHM_DIR", d));
            }
            let (v, ms) = (victim.to_string(), after_ms.to_string());
            let mut args = kill_args(&v, &ms, "3001");
            // The second case on windows (shared over shm, private over
            // TCP): the kill lands in window allocations and direct calls.
            if case == 1 {
                args.push("--windows");
            }
            let f = launch_marked(n, &env, &args, Duration::from_secs(90), &marker);
            assert_kill_reported(&f, n, victim, &what, |r, e| {
                // A survivor names the dead rank in the call it was in
                // (split sub-communicators number their own ranks, so the
                // name there is checked on the job's ranks only); a kill
                // before the communicator exists has no call to number.
                assert!(
                    has_numbered_call(e)
                        || e.contains("split")
                        || e.contains("communicator set-up"),
                    "{what}: rank {r}: {e}"
                );
            });
            assert_nothing_left(&marker, shm.as_ref(), &f);
        }
    }
}

/// `ferroccl-check`'s arguments for 1000 iterations of `count` elements
/// with rank `victim` killed `after_ms` after it joins.
fn kill_args<'a>(victim: &'a str, after_ms: &'a str, count: &'a str) -> Vec<&'a str> {
    vec![
        "--kill-rank",
        victim,
        "--kill-after-ms",
        after_ms,
        "--iters",
        "1000",
        "--count",
        count,
    ]
}

/// What a job whose rank `victim` of `n` was killed at a random moment
/// must show: the launcher saw the kill, every survivor printed an error
/// that says a rank failed or timed out (and passes `each`), at least one
/// names `victim`, and all within 60 s.
fn assert_kill_reported(
    f: &Finished,
    n: usize,
    victim: usize,
    what: &str,
    each: impl Fn(usize, &str),
) {
    assert!(
        f.stderr.contains(&format!(
            "ferroccl-run: rank {victim} was killed by signal 9"
        )),
        "{what}\n{}",
        f.all()
    );
    let survivors: Vec<usize> = (0..n).filter(|&r| r != victim).collect();
    for &r in &survivors {
        let e = f
            .error_of(r)
            .unwrap_or_else(|| panic!("{what}: rank {r} printed no error\n{}", f.all()));
        each(r, &e);
        assert!(
            e.contains(" failed") || e.contains("timed out"),
            "{what}: rank {r}: {e}"
        );
    }
    assert!(
        survivors
            .iter()
            .filter_map(|&r| f.error_of(r))
            .any(|e| blames(&e, victim)),
        "{what}: no survivor named rank {victim}\n{}",
        f.all()
    );
    assert!(
        f.elapsed < Duration::from_secs(60),
        "{what}: took {:?}",
        f.elapsed
    );
}

/// Over shared memory on 4 ranks, with counts whose allreduces,
/// allgathers and broadcasts go through the staging areas on the control
/// pages (16 KiB to 8 MiB), and all-to-alls too where the calibration
/// leaves them there rather than pulling, a rank killed at a random
/// moment: every survivor ends with an error in bounded time, and one
/// names the rank.
#[test]
fn a_rank_killed_during_staged_calls_is_named_by_every_survivor() {
    killed_over_shm("staged", 0x5_7a6e, 4, "300000", &[], |_, _| {});
}

/// One of `n` ranks over shared memory (in a fresh directory named after
/// `case`) killed 50-650 ms after joining, while `ferroccl-check` runs
/// calls of up to `count` elements with `env` added: `inspect` sees the
/// run and its description first, then every survivor must end with an
/// error in bounded time, one naming the rank, and nothing may be left.
/// The victim and the moment come from the fault seed mixed with `salt`.
fn killed_over_shm(
    case: &str,
    salt: u64,
    n: usize,
    count: &str,
    env: &[(&str, &str)],
    inspect: impl FnOnce(&Finished, &str),
) {
    let seed = fault_seed();
    let mut rng = SplitMix(seed ^ salt);
    let Some(shm) = ShmDir::new(case) else {
        eprintln!("/dev/shm is not writable here; {case} case skipped");
        return;
    };
    let victim = rng.below(n as u64) as usize;
    let after_ms = 50 + rng.below(600);
    let what = format!("seed {seed}: rank {victim} of {n} killed {after_ms} ms after joining");
    eprintln!("{what}");
    let marker = format!("kill-{case}-{}", std::process::id());
    let dir = shm.path();
    let mut all_env = vec![
        ("FERROCCL_TIMEOUT", "5"),
        ("FERROCCL_RUN_GRACE_S", "2"),
        ("FERROCCL_TRANSPORT", "shm"),
        ("FERROCCL_SHM_DIR", dir.as_str()),
    ];
    all_env.extend_from_slice(env);
    let (v, ms) = (victim.to_string(), after_ms.to_string());
    let args = kill_args(&v, &ms, count);
    let f = launch_marked(n, &all_env, &args, Duration::from_secs(90), &marker);
    inspect(&f, &what);
    assert_kill_reported(&f, n, victim, &what, |_, _| {});
    assert_nothing_left(&marker, Some(&shm), &f);
}

#[test]
fn a_rank_killed_while_ranks_write_into_each_other_is_named() {
    let env = [("FERROCCL_CALIBRATE", "0"), ("FERROCCL_DEBUG", "INFO")];
    killed_over_shm("push", 0x9a55, 2, "131072", &env, |f, what| {
        let log = f.all();
        if log.contains("in halves, each rank pulling its half") {
            eprintln!("{what}: the ranks wrote into each other");
        } else {
            eprintln!("{what}: cross-memory writes not permitted here; reads and slots only");
        }
        assert!(!log.contains("panicked"), "{what}\n{log}");
        for r in 0..2 {
            if let Some(e) = f.error_of(r) {
                eprintln!("{what}: rank {r}: {e}");
            }
        }
    });
}

#[test]
fn a_socket_closed_mid_frame_is_named_by_every_survivor() {
    // Rank 1 writes half of its 40th data frame, then shuts the socket down.
    let marker = format!("cut-{}", std::process::id());
    let f = launch_marked(
        4,
        &[
            ("FERROCCL_TIMEOUT", "5"),
            ("FERROCCL_RUN_GRACE_S", "2"),
            ("FERROCCL_TRANSPORT", "tcp"),
            ("FERROCCL_FAULT", "close_mid_frame:rank=1:after_frames=40"),
        ],
        &["--count", "4001"],
        Duration::from_secs(90),
        &marker,
    );
    assert!(!f.status.success(), "{}", f.all());
    let own = f
        .error_of(1)
        .unwrap_or_else(|| panic!("rank 1 printed no error\n{}", f.all()));
    assert!(own.contains("mid-frame"), "rank 1: {own}");
    assert_named_by(&f, 1, &[0, 2, 3]);
    assert!(f.elapsed < Duration::from_secs(40), "took {:?}", f.elapsed);
    assert_nothing_left(&marker, None, &f);
}

#[test]
fn a_mismatch_ends_every_rank_with_a_mismatch() {
    // Rank 2 issues an extra all_reduce before its 4th call: every rank,
    // not only its ring neighbours, must end with the mismatch.
    let marker = format!("mismatch-{}", std::process::id());
    let f = launch_marked(
        4,
        &[("FERROCCL_TIMEOUT", "10"), ("FERROCCL_RUN_GRACE_S", "2")],
        &["--mismatch-rank", "2", "--mismatch-at", "4"],
        Duration::from_secs(90),
        &marker,
    );
    assert!(!f.status.success(), "{}", f.all());
    let extra = "all_reduce #4 (uint8, max, 7919 elements)";
    for r in 0..4 {
        // The last line: rank 2 announces the extra call first.
        let own = format!("rank {r}: ");
        let e = f
            .prefixed()
            .into_iter()
            .filter(|(pr, _)| *pr == r)
            .filter_map(|(_, rest)| rest.strip_prefix(&own).map(str::to_string))
            .next_back()
            .unwrap_or_else(|| panic!("rank {r} printed no error\n{}", f.all()));
        assert!(
            e.starts_with("collective mismatch with rank ") && e.contains(extra),
            "rank {r}: {e}\n{}",
            f.all()
        );
        // Each rank states its own call (a rank still finishing the call
        // before may end there when the reporter's sockets reset: it then
        // says so).
        assert!(
            e.contains("this rank called ") && !e.contains("called nothing"),
            "rank {r}: {e}"
        );
    }
    assert!(f.elapsed < Duration::from_secs(40), "took {:?}", f.elapsed);
    assert_nothing_left(&marker, None, &f);
}

/// Bytes a stranger might send to the rendezvous port.
fn garbage_variants() -> Vec<Vec<u8>> {
    let mut v = vec![
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0xff; 300],
        vec![0x01, 0xff, 0xff, 0xff, 0xff, 1, 2, 3],
        vec![0x02, 0xff, 0xff, 0xff, 0x7f],
        vec![0x01, 5, 0, 0, 0, 1],
        Vec::new(),
    ];
    // A well-formed hello with a wrong token (the job's is secret).
    let mut hello = vec![0x01, 23, 0, 0, 0];
    hello.extend_from_slice(&u32::from_be_bytes(*b"FCCL").to_le_bytes());
    hello.extend_from_slice(&3u16.to_le_bytes());
    hello.push(1);
    hello.extend_from_slice(&1u32.to_le_bytes());
    hello.extend_from_slice(&0xdead_beef_u64.to_le_bytes());
    hello.extend_from_slice(&10u32.to_le_bytes());
    v.push(hello);
    let mut rng = SplitMix(0x5eed);
    for len in [1, 5, 17, 64, 1000] {
        v.push((0..len).map(|_| rng.next() as u8).collect());
    }
    v
}

#[test]
fn garbage_sent_to_the_rendezvous_of_a_live_job_does_not_disturb_it() {
    let port = ferroccl::bootstrap::free_port().expect("free port");
    let marker = format!("garbage-{}", std::process::id());
    let mut cmd = clean(ferroccl_run());
    let p = port.to_string();
    cmd.args(["-n", "3", "--master-port", &p, "--", CHECK])
        .args(["--iters", "3", "--delay-ms", "2"])
        .env("FERROCCL_TIMEOUT", "20")
        .env("FERROCCL_TEST_JOB", &marker);
    let job = std::thread::spawn(move || run_bounded(cmd, Duration::from_secs(120)));
    let stop = std::time::Instant::now() + Duration::from_secs(3);
    let mut sent = 0;
    while std::time::Instant::now() < stop && !job.is_finished() {
        for g in garbage_variants() {
            use std::io::Write;
            let Ok(mut s) = std::net::TcpStream::connect_timeout(
                &([127, 0, 0, 1], port).into(),
                Duration::from_millis(200),
            ) else {
                continue; // not listening yet, or done
            };
            let _ = s.write_all(&g);
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let f = job.join().expect("job thread");
    assert!(f.status.success(), "exit {:?}\n{}", f.status, f.all());
    assert!(sent > 0, "no garbage could be sent");
    for r in 0..3 {
        assert!(
            f.stdout.contains(&format!("ferroccl-check: rank {r}: ")),
            "rank {r} printed no summary\n{}",
            f.all()
        );
    }
    assert_nothing_left(&marker, None, &f);
}

#[test]
fn a_rank_that_hangs_in_its_own_code_is_named_by_every_survivor() {
    // Not stopped: its heartbeats go on, so only the timeout notices; the
    // ranks then ask how far each member has come and blame the one that
    // never issued the call, instead of each its own ring neighbour.
    let marker = format!("hang-{}", std::process::id());
    let f = launch_marked(
        4,
        &[("FERROCCL_TIMEOUT", "3"), ("FERROCCL_RUN_GRACE_S", "1")],
        &["--hang-rank", "1", "--hang-at", "3"],
        Duration::from_secs(90),
        &marker,
    );
    assert!(!f.status.success());
    assert_named_by(&f, 1, &[0, 2, 3]);
    for r in [0, 2, 3] {
        let e = f.error_of(r).unwrap_or_default();
        assert!(e.contains("has not called"), "rank {r}: {e}");
    }
    assert!(
        f.elapsed < Duration::from_secs(3 + 30),
        "took {:?}",
        f.elapsed
    );
    assert_nothing_left(&marker, None, &f);
}

/// `--windows`: the reducing and gathering checks run on windows, directly
/// between the ranks' buffers; every check passes, and nothing is left in
/// the shared-memory directory. Then a rank killed while the others wait
/// for it at a window check-in is named by them, and again nothing is left.
#[test]
fn windows_pass_every_check_and_a_killed_rank_is_named() {
    let Some(dir) = ShmDir::new("windows") else {
        eprintln!("SKIPPED: /dev/shm is not writable here");
        return;
    };
    let d = dir.path();
    let env = [("FERROCCL_SHM_DIR", d.as_str())];
    let f = launch_marked(
        3,
        &env,
        &["--windows", "--count", "5003"],
        Duration::from_secs(120),
        "windows-ok",
    );
    assert!(f.status.success(), "exit {:?}\n{}", f.status, f.all());
    for r in 0..3 {
        let own = format!("ferroccl-check: rank {r}: ");
        let line = f
            .prefixed()
            .into_iter()
            .find_map(|(pr, rest)| {
                (pr == r)
                    .then(|| rest.strip_prefix(&own).map(String::from))
                    .flatten()
            })
            .unwrap_or_else(|| panic!("rank {r} printed no summary\n{}", f.all()));
        let direct: u64 = line
            .split(", ")
            // Inline in the check-in or directly between windows; with
            // 5003 elements per call (more than inline takes) most are
            // the latter.
            .find_map(|part| part.strip_suffix(" calls without slots"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("rank {r}: no count of direct calls in: {line}"));
        assert!(direct >= 100, "rank {r}: only {direct} calls ran directly");
    }
    assert_nothing_left("windows-ok", Some(&dir), &f);

    let mut kill_env = KILL_ENV.to_vec();
    kill_env.extend(env);
    let mut args = KILL_ARGS.to_vec();
    args.push("--windows");
    let f = launch_marked(4, &kill_env, &args, Duration::from_secs(60), "windows-kill");
    assert!(!f.status.success(), "{}", f.all());
    assert!(f.elapsed < Duration::from_secs(30), "took {:?}", f.elapsed);
    survivors_name(&f, 2, &[0, 1, 3]);
    assert_nothing_left("windows-kill", Some(&dir), &f);
}

/// `ferroccl-check --wrong CASE` on 3 process ranks over `transport`: how
/// each rank's one call ended, as (rank, milliseconds, outcome); every
/// rank must report its call (not an error of `from_env`, not nothing).
fn wrong_call(case: &str, transport: &str, count: usize) -> Vec<(usize, u64, String)> {
    wrong_call_with(case, transport, count, "1")
}

/// `wrong_call` with FERROCCL_EARLY_RETURN set to `early`.
fn wrong_call_with(
    case: &str,
    transport: &str,
    count: usize,
    early: &str,
) -> Vec<(usize, u64, String)> {
    let count = count.to_string();
    let env = [
        ("FERROCCL_TRANSPORT", transport),
        ("FERROCCL_TIMEOUT", "30"),
        ("FERROCCL_RUN_GRACE_S", "40"),
        ("FERROCCL_EARLY_RETURN", early),
    ];
    let f = launch(
        3,
        &env,
        &["--wrong", case, "--count", &count],
        Duration::from_secs(90),
    );
    let mut ended = Vec::new();
    for r in 0..3 {
        let head = format!("rank {r}: wrong call ({case}) ended after ");
        let line = f
            .prefixed()
            .into_iter()
            .filter(|(pr, _)| *pr == r)
            .find_map(|(_, rest)| rest.strip_prefix(&head).map(str::to_string))
            .unwrap_or_else(|| {
                panic!(
                    "{case} over {transport}: rank {r} did not report its call\n{}",
                    f.all()
                )
            });
        let (ms, outcome) = line.split_once(" ms: ").expect("'T ms: outcome'");
        ended.push((r, ms.parse().expect("milliseconds"), outcome.to_string()));
    }
    ended
}

/// Issue 14, items 1 and 2: a broadcast whose rank 1 names another root,
/// and a reduce whose root says Sum where the others say Max, at large
/// counts (through slots: the ranks that only send used to return Ok) and
/// small ones (inline), over shared memory and TCP: every rank's call
/// itself returns the mismatch, and each error names only the user's call
/// #1, never one of the library's own calls of set-up. The exception is
/// the small (inline) call on shared memory with early return (the
/// default): a broadcast's root and a reduce's senders may return `Ok`,
/// and then their next call returns the mismatch naming call #1; with
/// FERROCCL_EARLY_RETURN=0 every rank's call fails itself there too.
#[test]
fn a_mismatched_root_or_op_fails_the_call_on_every_rank() {
    for transport in ["shm", "tcp"] {
        for (case, theirs) in [("root", "root 1)"), ("op", "max, ")] {
            for (count, early) in [(300_000, "1"), (1, "1"), (1, "0")] {
                for _ in 0..2 {
                    for (r, _, outcome) in wrong_call_with(case, transport, count, early) {
                        let what = format!(
                            "{case} over {transport}, {count} elements, early return {early}, \
                             rank {r}"
                        );
                        let later = transport == "shm" && count == 1 && early == "1";
                        let outcome = match outcome.strip_prefix("ok, then: ") {
                            Some(next) if later => next.to_string(),
                            _ => outcome,
                        };
                        assert!(
                            outcome.starts_with("error: collective mismatch with rank "),
                            "{what}: {outcome}"
                        );
                        assert!(
                            outcome.contains(&format!("{count} elements"))
                                && outcome.contains("#1 (")
                                && outcome.contains(theirs),
                            "{what} names the wrong calls: {outcome}"
                        );
                        assert!(!outcome.contains("library's own"), "{what}: {outcome}");
                    }
                }
            }
        }
    }
}

/// Issue 14, item 3: rank 1 passes a root out of range, or an output one
/// element short: it gets InvalidArgument at once, and the others end
/// their call with an error naming rank 1, its call and why, well inside
/// the 30 s timeout (they used to wait it out).
#[test]
fn a_refused_argument_ends_the_call_on_every_rank_at_once() {
    for transport in ["shm", "tcp"] {
        for (case, why) in [
            ("bad-root", "broadcast root 3 is out of range"),
            ("bad-len", "all_gather recv buffer has 2999 elements"),
        ] {
            for (r, ms, outcome) in wrong_call(case, transport, 1000) {
                let what = format!("{case} over {transport}, rank {r}");
                // A small broadcast's root returns once its data is out
                // (early return), and a receiver that agrees with the root
                // once it read the root's call: their next call fails.
                let outcome = match outcome.strip_prefix("ok, then: ") {
                    Some(next) if case == "bad-root" && transport == "shm" => next.to_string(),
                    _ => outcome,
                };
                if r == 1 {
                    assert!(
                        outcome.starts_with("error: invalid argument: ") && outcome.contains(why),
                        "{what}: {outcome}"
                    );
                } else {
                    assert!(
                        outcome.contains("rank 1 failed: it refused its call at this position")
                            && outcome.contains(" #1 (")
                            && outcome.contains(why),
                        "{what}: {outcome}"
                    );
                }
                // A bound against waiting for the timeout, not a speed.
                assert!(ms < 15_000, "{what} ended after {ms} ms: {outcome}");
            }
        }
    }
}

// ---------------------------------------------------------------- shrink

/// `ferroccl-check --survive` with ranks killed (kill -9) before given
/// collective calls (`kills`: job rank, call), one after the other: every
/// survivor names the first victim, shrinks after each kill (renumbered in
/// job-rank order), and every check of ferroccl-check (every collective and
/// type against its f64 reference) passes on the last communicator.
fn survive_case(transport: &str, n: usize, kills: &[(usize, u64)]) {
    let what = format!("{transport}, {n} ranks, kills {kills:?}");
    eprintln!("{what}");
    let shm = if transport == "shm" {
        match ShmDir::new(&format!("survive{n}")) {
            Some(d) => Some(d),
            None => {
                eprintln!("{what}: /dev/shm is not writable here; case skipped");
                return;
            }
        }
    } else {
        None
    };
    let marker = format!("survive-{transport}-{n}-{}", std::process::id());
    let mut env = vec![
        ("FERROCCL_TIMEOUT", "10"),
        // The survivors go on: the launcher must not stop them.
        ("FERROCCL_RUN_SETTLE_S", "100"),
        ("FERROCCL_TRANSPORT", transport),
    ];
    let dir = shm.as_ref().map(ShmDir::path);
    if let Some(d) = &dir {
        env.push(("FERROCCL_SHM_DIR", d));
    }
    let kill_args: Vec<String> = kills
        .iter()
        .flat_map(|(r, k)| {
            [
                "--die-rank".to_string(),
                r.to_string(),
                "--die-at".to_string(),
                k.to_string(),
            ]
        })
        .collect();
    let mut args = vec!["--survive", "--count", "64"];
    args.extend(kill_args.iter().map(String::as_str));
    let f = launch_marked(n, &env, &args, Duration::from_secs(120), &marker);
    let first = kills[0].0;
    assert!(
        f.stderr.contains(&format!(
            "ferroccl-run: rank {first} was killed by signal 9"
        )),
        "{what}\n{}",
        f.all()
    );
    let mut alive: Vec<usize> = (0..n).collect();
    for (round, &(victim, _)) in kills.iter().enumerate() {
        alive.retain(|&r| r != victim);
        for (new_rank, &r) in alive.iter().enumerate() {
            let went = format!("went on as rank {new_rank} of {} ", alive.len());
            let said = f
                .prefixed()
                .into_iter()
                .filter(|(pr, line)| *pr == r && line.starts_with(&format!("rank {r}: went on")))
                .nth(round)
                .map(|(_, line)| line)
                .unwrap_or_else(|| {
                    panic!(
                        "{what}: rank {r} did not go on after kill {round}\n{}",
                        f.all()
                    )
                });
            assert!(
                said.contains(&went),
                "{what}: rank {r}: {said}, expected {went}"
            );
        }
    }
    // Every survivor of the first kill (later victims included) names it
    // first; later victims are named in their communicator's own ranks.
    for r in (0..n).filter(|&r| r != first) {
        let own = format!("rank {r}: ");
        let e = f
            .prefixed()
            .into_iter()
            .filter(|(pr, line)| {
                *pr == r && !line.contains(" went on ") && !line.contains("killing")
            })
            .find_map(|(_, line)| line.strip_prefix(&own).map(str::to_string))
            .unwrap_or_else(|| panic!("{what}: rank {r} printed no error\n{}", f.all()));
        assert!(
            blames(&e, first) && has_numbered_call(&e),
            "{what}: rank {r}: {e}"
        );
    }
    for &r in &alive {
        assert!(
            f.prefixed()
                .iter()
                .any(|(pr, line)| *pr == r && line.contains("checks passed (")),
            "{what}: rank {r} did not pass its checks\n{}",
            f.all()
        );
    }
    assert!(
        f.stdout
            .contains(&format!("checks passed on {} ranks", alive.len())),
        "{what}\n{}",
        f.all()
    );
    assert_nothing_left(&marker, shm.as_ref(), &f);
}

/// The covering set (not every combination; CI has two cores): shared
/// memory with rank 0 (the rendezvous host) killed first and then two more
/// down to one rank, TCP with a middle rank on 3 ranks, TCP with rank 0
/// and another on 5 ranks.
#[test]
fn survivors_of_killed_ranks_shrink_and_pass_every_check() {
    survive_case("shm", 4, &[(0, 5), (2, 100), (1, 200)]);
    survive_case("tcp", 3, &[(1, 5)]);
    survive_case("tcp", 5, &[(0, 5), (3, 100)]);
}
