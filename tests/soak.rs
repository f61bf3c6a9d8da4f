//! The randomised soak (`ferroccl-soak`) in real processes under
//! `ferroccl-run`: short runs with fixed seeds over the default transports
//! (about a quarter of the calls in windows), with every out-of-place call
//! between windows streaming (the fused kernels), without windows or
//! check-ins (every call through slots), over TCP and over the forced tree,
//! and a run whose checker is sabotaged
//! to prove that a wrong result fails the run with a replay line. Every run
//! is bounded: a launcher that outlives its limit is killed and the test
//! fails. The runs take turns (a lock), so that a 2-core CI machine is not
//! asked to run several jobs of 3 to 4 ranks at once.

mod common;

use common::process::{clean, ferroccl_run, run_bounded, Finished};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

const SOAK: &str = env!("CARGO_BIN_EXE_ferroccl-soak");

/// Longest a soak run may take before it is killed and the test fails.
const LIMIT: Duration = Duration::from_secs(120);

/// One job at a time.
static TURN: Mutex<()> = Mutex::new(());

/// `ferroccl-run -n N -- ferroccl-soak ARGS` with `env` and no launcher or
/// ferroccl settings from the test's own environment; killed after `LIMIT`.
fn soak(n: usize, env: &[(&str, &str)], args: &[&str]) -> Finished {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let mut cmd = clean(ferroccl_run());
    // A hang becomes an error naming the call well within the limit.
    cmd.env("FERROCCL_TIMEOUT", "60");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(["-n", &n.to_string(), "--", SOAK]).args(args);
    run_bounded(cmd, LIMIT)
}

/// Run the soak (with `extra` options) and require success on every rank.
fn passes_with(n: usize, env: &[(&str, &str)], seed: u64, extra: &[&str]) {
    let seed_s = seed.to_string();
    let mut args = vec!["--seed", &seed_s, "--ops", "150", "--max-count", "20000"];
    args.extend_from_slice(extra);
    let f = soak(n, env, &args);
    assert!(
        f.status.success(),
        "{env:?} -n {n} seed {seed}: exit {:?}\n{}",
        f.status,
        f.all()
    );
    let lines = f.prefixed();
    for r in 0..n {
        let ok = format!("ferroccl-soak: rank {r}: 150 ops ok (seed {seed})");
        assert!(
            lines.iter().any(|(pr, rest)| *pr == r && *rest == ok),
            "{env:?} -n {n} seed {seed}: no '{ok}'\n{}",
            f.all()
        );
    }
    let summary = format!("ferroccl-soak: 150 ops ok on {n} ranks in ");
    assert!(
        lines
            .iter()
            .any(|(r, rest)| *r == 0 && rest.starts_with(&summary)),
        "no summary on rank 0\n{}",
        f.all()
    );
}

fn passes(n: usize, env: &[(&str, &str)], seed: u64) {
    passes_with(n, env, seed, &[]);
}

#[test]
fn three_ranks_with_fixed_seeds() {
    for seed in [1, 17, 2024] {
        passes(3, &[], seed);
    }
}

#[test]
fn four_ranks_with_fixed_seeds() {
    for seed in [2, 31, 4096] {
        passes(4, &[], seed);
    }
}

/// Every out-of-place call between windows takes the fused streaming
/// kernels (the threshold at one byte), at the per-rank offsets the soak
/// draws.
#[test]
fn three_ranks_with_every_window_call_streaming() {
    passes(3, &[("FERROCCL_NT_STORE_BYTES", "1")], 6);
}

/// No windows and no check-ins: every call of every size through slots.
#[test]
fn three_ranks_all_through_slots() {
    passes_with(3, &[("FERROCCL_CHECKIN", "0")], 8, &["--no-windows"]);
}

#[test]
fn four_ranks_over_tcp() {
    passes(4, &[("FERROCCL_TRANSPORT", "tcp")], 5);
}

#[test]
fn four_ranks_over_the_forced_tree() {
    passes(4, &[("FERROCCL_ALGO", "tree")], 9);
}

/// FERROCCL_SOAK_SABOTAGE=1 makes each rank expect one more than the
/// reference for the first element it checks: the run must fail with the
/// operation named and a replay line that reproduces it.
#[test]
fn a_wrong_result_fails_the_run_with_a_replay_line() {
    let f = soak(
        3,
        &[("FERROCCL_SOAK_SABOTAGE", "1")],
        &["--seed", "1", "--ops", "150", "--max-count", "20000"],
    );
    assert_eq!(f.status.code(), Some(1), "{}", f.all());
    let lines = f.prefixed();
    let wrong = lines.iter().find(|(r, rest)| {
        rest.starts_with(&format!("rank {r}: op #")) && rest.contains("): wrong result: ")
    });
    assert!(
        wrong.is_some(),
        "no rank reported a wrong result\n{}",
        f.all()
    );
    let replay = "replay: FERROCCL_SOAK_SABOTAGE=1 ferroccl-run -n 3 -- ferroccl-soak \
                  --seed 1 --ops 150 --max-count 20000";
    assert!(
        lines.iter().any(|(_, rest)| rest == replay),
        "no '{replay}'\n{}",
        f.all()
    );
}

#[test]
fn help_and_bad_options() {
    let help = Command::new(SOAK).arg("--help").output().expect("run");
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for opt in [
        "--seed",
        "--ops",
        "--max-count",
        "--splits",
        "--no-windows",
        "FERROCCL_SOAK_SABOTAGE",
    ] {
        assert!(text.contains(opt), "--help names no {opt}: {text}");
    }
    for bad in [&["--ops"][..], &["--seed", "x"], &["--frobnicate"]] {
        let out = Command::new(SOAK).args(bad).output().expect("run");
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("usage:"));
    }
}

/// The number rank 0's summary gives of calls that ran without slots.
fn without_slots(f: &Finished) -> u64 {
    let lines = f.prefixed();
    let summary = lines
        .iter()
        .find(|(r, rest)| *r == 0 && rest.contains(" calls ran without slots"))
        .unwrap_or_else(|| panic!("no summary on rank 0\n{}", f.all()));
    let before = summary.1.split(" calls ran without slots").next().unwrap();
    before
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in '{}'", summary.1))
}

/// Allgathers and all-to-alls of ordinary buffers with large blocks copy
/// straight out of the peers' processes (cross-memory attach) where the
/// ranks may: the same sequence (no windows, buffers up to 200 000
/// elements; with this seed seven of its allgathers and all-to-alls have
/// blocks of 64 KiB or more) must pass with it
/// and with FERROCCL_CMA=0, and with it more calls must run without slots
/// (the large allgathers and all-to-alls). That run keeps the fixed
/// threshold (FERROCCL_CALIBRATE=0: from 64 KiB blocks); a third, with the
/// threshold measured at creation (which may pull from larger blocks, or
/// never, depending on the machine), must pass too and say what it
/// measured. Where the machine forbids cross-memory attach (Yama, a
/// container profile) the runs take the slots and must agree.
#[test]
fn three_ranks_allgather_across_processes_and_without() {
    let args = [
        "--seed",
        "14",
        "--ops",
        "150",
        "--max-count",
        "200000",
        "--no-windows",
    ];
    let info = [("FERROCCL_DEBUG", "INFO"), ("FERROCCL_CALIBRATE", "0")];
    let with = soak(3, &info, &args);
    assert!(with.status.success(), "{}", with.all());
    let calibrated = soak(3, &[("FERROCCL_DEBUG", "INFO")], &args);
    assert!(calibrated.status.success(), "{}", calibrated.all());
    let without = soak(
        3,
        &[("FERROCCL_DEBUG", "INFO"), ("FERROCCL_CMA", "0")],
        &args,
    );
    assert!(without.status.success(), "{}", without.all());
    assert!(
        without
            .all()
            .contains("no cross-memory attach (FERROCCL_CMA=0)"),
        "{}",
        without.all()
    );
    let (a, b) = (without_slots(&without), without_slots(&with));
    if with
        .all()
        .contains("cross-memory attach between the 3 ranks")
    {
        assert!(
            b > a,
            "{b} calls without slots with cross-memory attach, {a} without"
        );
        assert!(
            calibrated
                .all()
                .contains("cross-memory attach calibrated on 3 ranks"),
            "{}",
            calibrated.all()
        );
    } else {
        eprintln!("cross-memory attach not permitted here; both runs used slots");
        assert_eq!(a, b);
    }
}

/// The 2-rank allreduce in halves (each rank pulling half of the peer's
/// input by cross-memory attach and writing the sum into both outputs)
/// runs where the calibration at creation measured it no slower than the
/// slots: a sequence whose allreduces reach 2.4 MB (the halves' range
/// starts at 512 KiB) must pass with the range measured, and with the
/// fixed one (FERROCCL_CALIBRATE=0, where the halves take 512 KiB to
/// 8 MiB), and the calibrated run must say what it measured for them.
/// Where the machine forbids cross-memory writes both runs take the
/// slots.
#[test]
fn two_ranks_allreduce_in_halves_as_calibrated_and_fixed() {
    let args = [
        "--seed",
        "37",
        "--ops",
        "80",
        "--max-count",
        "600000",
        "--no-windows",
    ];
    let fixed = soak(
        2,
        &[("FERROCCL_DEBUG", "INFO"), ("FERROCCL_CALIBRATE", "0")],
        &args,
    );
    assert!(fixed.status.success(), "{}", fixed.all());
    let calibrated = soak(2, &[("FERROCCL_DEBUG", "INFO")], &args);
    assert!(calibrated.status.success(), "{}", calibrated.all());
    if fixed
        .all()
        .contains("allreduces of 524288 to 8388608 bytes in halves")
    {
        assert!(
            calibrated
                .all()
                .contains("allreduces (halves us / slots us) 524288: "),
            "{}",
            calibrated.all()
        );
    } else {
        eprintln!("cross-memory writes not permitted here; both runs used slots");
    }
}
