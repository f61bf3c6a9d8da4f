//! The burn_ddp example as a user runs it, under `ferroccl-run`: Burn
//! models trained on 2 and 3 processes end at the weights of one process
//! trained on the whole batch, through the `Learner` strategy and through
//! the hand-written loop; a rank killed mid-training is named on every
//! other rank.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The workspace's test process helpers (target/<profile>), included
/// rather than written again.
#[path = "../../../tests/common/process.rs"]
#[allow(dead_code)]
mod process;

/// A build artifact of this test's profile (target/<profile>/...): the
/// example and `ferroccl-run`, both built by `cargo test --workspace`
/// before any test runs.
fn artifact(rel: &str) -> PathBuf {
    let path = process::profile_dir().join(rel);
    assert!(
        path.exists(),
        "{} is missing: build it first (`cargo test --workspace` does, or \
         `cargo build -p ferroccl-run -p ferroccl-burn --bin ferroccl-run --example burn_ddp` \
         with this profile)",
        path.display()
    );
    path
}

struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn launch(ranks: usize, args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut cmd = Command::new(artifact("ferroccl-run"));
    cmd.args(["-n", &ranks.to_string(), "--"])
        .arg(artifact("examples/burn_ddp"))
        .args(args)
        .env("FERROCCL_CALIBRATE", "0")
        .env("FERROCCL_TIMEOUT", "60")
        .env_remove("FERROCCL_TOKEN")
        .env_remove("FERROCCL_TRANSPORT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    // Bounded: a hang fails the test (with what the ranks printed)
    // instead of holding CI; each rank's waits end at FERROCCL_TIMEOUT.
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = process::run_bounded(cmd, Duration::from_secs(600));
    Outcome {
        ok: out.status.success(),
        stdout: out.stdout,
        stderr: out.stderr,
    }
}

fn read_weights(path: &std::path::Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .expect("weights dump")
        .lines()
        .map(|l| l.parse().expect("a number"))
        .collect()
}

/// `key=value` of the first line holding `key=`.
fn field(stdout: &str, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    stdout
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(&prefix).map(str::to_string))
}

const EPOCHS: usize = 2;
const STEPS: usize = 3;
const BATCH: usize = 12;
const LR: f64 = 0.05;
/// f32 unit roundoff.
const U: f64 = 5.960_464_477_539_063e-8;
/// The longest sum in a forward or backward pass of either model (the
/// CNN's 144 flattened features into fc1; the batch sums are counted
/// separately).
const FAN_IN: usize = 144;

/// Tolerance of the final weights against one process. A step's averaged
/// gradient differs from one process's through the order of its sums: the
/// sum over the batch (split into per-rank sums and then the allreduce,
/// BATCH + ranks + 2 roundings of terms bounded by `gabs`, the largest
/// mean absolute per-sample gradient the one-process run measured), and
/// the forward and backward passes on smaller matrices (matrix kernels
/// may block a sum of at most FAN_IN terms differently: FAN_IN roundings,
/// relative to the same magnitudes). SGD moves a weight by lr times that
/// per step; the differences feed back into later steps, which a factor
/// of 4 covers at this learning rate over 6 steps (the same argument as
/// tests/ddp). The test checks that training moves the weights by far
/// more than this.
fn tolerance(ranks: usize, gabs: f64) -> f64 {
    let steps = (EPOCHS * STEPS) as f64;
    4.0 * steps * LR * (BATCH + FAN_IN + ranks + 2) as f64 * U * gabs
}

fn common_args<'a>(
    model: &'a str,
    epochs: &'a str,
    steps: &'a str,
    batch: &'a str,
) -> Vec<&'a str> {
    vec![
        "--model", model, "--epochs", epochs, "--steps", steps, "--batch", batch, "--lr", "0.05",
    ]
}

fn check_model(model: &str) {
    let dir =
        std::env::temp_dir().join(format!("ferroccl-burn-test-{}-{model}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (e, s, b) = (EPOCHS.to_string(), STEPS.to_string(), BATCH.to_string());
    let args = common_args(model, &e, &s, &b);

    // One process, the whole batch, the hand-written loop: the reference.
    let ref_path = dir.join("one.txt");
    let mut one = args.clone();
    one.extend(["--loop", "--bound", "--dump", ref_path.to_str().unwrap()]);
    let out = launch(1, &one, &[]);
    assert!(out.ok, "{}\n{}", out.stdout, out.stderr);
    let want = read_weights(&ref_path);
    let gabs: f64 = field(&out.stdout, "gabs")
        .expect("gabs in the output")
        .parse()
        .unwrap();

    // The initial weights (no step): training must move them by more than
    // any tolerance used below, or the comparison proves nothing.
    let init_path = dir.join("init.txt");
    let mut init = common_args(model, "0", &s, &b);
    init.extend(["--loop", "--dump", init_path.to_str().unwrap()]);
    let out = launch(1, &init, &[]);
    assert!(out.ok, "{}\n{}", out.stdout, out.stderr);
    let moved = max_diff(&read_weights(&init_path), &want);

    for ranks in [2, 3] {
        let tol = tolerance(ranks, gabs);
        assert!(
            moved > 20.0 * tol,
            "{model}: weights moved {moved}, tolerance {tol}"
        );
        for learner in [true, false] {
            let path = dir.join(format!("{ranks}-{learner}.txt"));
            let mut a = args.clone();
            if !learner {
                a.push("--loop");
            }
            a.extend(["--dump", path.to_str().unwrap()]);
            let out = launch(ranks, &a, &[]);
            let how = if learner { "Learner" } else { "loop" };
            assert!(
                out.ok,
                "{model} {how} {ranks} ranks:\n{}\n{}",
                out.stdout, out.stderr
            );
            let d = max_diff(&read_weights(&path), &want);
            assert!(
                d <= tol,
                "{model}, {how}, {ranks} ranks: weights differ from one process by {d} \
                 (tolerance {tol}, training moved them {moved})\n{}",
                out.stdout
            );
            // Every rank holds the same replica, bit for bit.
            let sums: Vec<String> = out
                .stdout
                .lines()
                .filter_map(|l| field(l, "checksum"))
                .collect();
            assert_eq!(sums.len(), ranks, "{}", out.stdout);
            assert!(
                sums.iter().all(|c| c == &sums[0]),
                "{model} {how}: {sums:?}"
            );
            // The loss is printed per epoch.
            let epochs = out.stdout.lines().filter(|l| l.contains("loss ")).count();
            assert!(epochs >= EPOCHS, "{}", out.stdout);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[test]
fn the_mlp_trains_to_the_one_process_weights_on_2_and_3_processes() {
    check_model("mlp");
}

#[test]
fn the_cnn_trains_to_the_one_process_weights_on_2_and_3_processes() {
    check_model("cnn");
}

/// Rank 1 aborts at its third step: ranks 0 and 2 stop with an error
/// naming rank 1, through the Learner (the strategy's result) and through
/// the loop (GradientSync's), instead of hanging.
#[test]
fn a_rank_killed_mid_training_is_named_on_every_other_rank() {
    for mode in [None, Some("--loop")] {
        let mut args = common_args("mlp", "2", "3", "12");
        args.extend(["--die-rank", "1", "--die-step", "3"]);
        args.extend(mode);
        // Survivors get time to report before the launcher stops them.
        let out = launch(3, &args, &[("FERROCCL_RUN_SETTLE_S", "30")]);
        assert!(!out.ok, "the job must fail:\n{}", out.stdout);
        let all = format!("{}{}", out.stdout, out.stderr);
        for survivor in [0, 2] {
            let line = all
                .lines()
                .find(|l| l.starts_with(&format!("[rank {survivor}]")) && l.contains("error:"))
                .unwrap_or_else(|| panic!("rank {survivor} reported no error ({mode:?}):\n{all}"));
            assert!(
                line.contains("rank 1 failed"),
                "rank {survivor} must name rank 1 ({mode:?}): {line}"
            );
        }
    }
}
