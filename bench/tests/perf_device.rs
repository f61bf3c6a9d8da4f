//! `ferroccl-perf --device cuda` run as a user runs it, as a process.
//!
//! Without a device (the build machines, CI) it must refuse at once with
//! the reason and status 2, on every rank; with one (the GPU run,
//! `cuda/gpu/run.sh`) its tables must count no wrong element. No timings
//! are asserted.

mod common;

use common::{perf_binary, text, wrong_cells};
use ferroccl::cuda::device_count;
use ferroccl::Error;
use std::process::{Command, Output};

fn perf(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(perf_binary());
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("ferroccl-perf starts")
}

/// Refused without a device: status 2, the reason on stderr once (rank 0
/// only, the other ranks are quiet) and no table.
fn assert_refused(out: &Output, reason: &str) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let line = format!("ferroccl-perf: --device cuda: {reason}");
    assert_eq!(
        stderr.matches(&line).count(),
        1,
        "expected `{line}` once on stderr:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        wrong_cells(&stdout).is_empty(),
        "a table was printed:\n{stdout}"
    );
}

/// `FERROCCL_CUDA=0` hides every device, so the refusal is tested
/// everywhere, a machine with a GPU included.
#[test]
fn hidden_devices_are_refused_with_the_reason() {
    for ranks in ["1", "3"] {
        let out = perf(
            &["--device", "cuda", "--ranks", ranks, "-b", "1K", "-e", "4K"],
            &[("FERROCCL_CUDA", "0")],
        );
        assert_refused(&out, "FERROCCL_CUDA=0");
    }
    // A rank that another launcher started (torchrun-style variables)
    // checks on its own: rank 1 leaves quietly with status 2, before it
    // would look for a rendezvous that nobody serves here.
    let out = perf(
        &["--device", "cuda"],
        &[
            ("FERROCCL_CUDA", "0"),
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "9"),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "", "rank 1 is quiet");
}

/// Collectives perf runs on a device: all of them.
const DEVICE_COLLS: [&str; 7] = [
    "allreduce",
    "reducescatter",
    "allgather",
    "broadcast",
    "reduce",
    "alltoall",
    "sendrecv",
];

/// Without a device, the reason `device_count` gives; with one, small
/// checked runs on 1 and 2 ranks count no wrong element.
/// `FERROCCL_REQUIRE_DEVICE=1` (the GPU run) makes a missing device a
/// failure instead.
#[test]
fn device_runs_are_correct_or_refused_with_the_reason() {
    let require = std::env::var("FERROCCL_REQUIRE_DEVICE").is_ok_and(|v| v == "1");
    let reason = match device_count() {
        Ok(devices) => {
            eprintln!("{devices} CUDA device(s): running ferroccl-perf --device cuda");
            None
        }
        Err(Error::NoDevice(reason)) => Some(reason),
        Err(other) => panic!("device_count: expected a count or NoDevice, got {other}"),
    };
    if let Some(reason) = reason {
        assert!(
            !require,
            "FERROCCL_REQUIRE_DEVICE=1 but no usable device: {reason}"
        );
        eprintln!("no CUDA device ({reason}): checking the refusal");
        assert_refused(&perf(&["--device", "cuda", "--ranks", "1"], &[]), &reason);
        return;
    }
    let mut runs: Vec<Vec<&str>> = vec![
        // nccl-tests' default collective, every size from 1K to 64K.
        vec!["--ranks", "1", "-b", "1K", "-e", "64K"],
        vec!["--ranks", "2", "-b", "1K", "-e", "64K"],
    ];
    // Every device collective, type and op at one size, over staging
    // between two processes; odd element counts through the 3-rank split.
    for coll in DEVICE_COLLS {
        runs.push(vec![
            "--ranks", "2", "-t", coll, "-d", "all", "-o", "all", "-b", "4K", "-e", "4K", "-n",
            "2", "-w", "1",
        ]);
    }
    runs.push(vec![
        "--ranks",
        "3",
        "-t",
        "reducescatter",
        "-b",
        "1000",
        "-e",
        "1000",
        "-d",
        "bf16",
        "-n",
        "2",
    ]);
    for mut args in runs {
        args.extend(["--device", "cuda", "-c", "1"]);
        let out = perf(&args, &[]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(
            out.status.success(),
            "{args:?}: {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
            out.status
        );
        let rows = wrong_cells(&stdout);
        assert!(!rows.is_empty(), "{args:?}: no rows:\n{stdout}");
        for (oop, ip) in &rows {
            assert_eq!(
                (oop.as_str(), ip.as_str()),
                ("0", "0"),
                "{args:?}:\n{stdout}"
            );
        }
        assert!(
            stdout.contains("# Out of bounds values : 0 OK"),
            "{args:?}:\n{stdout}"
        );
        assert!(
            stdout.contains("# pinned copy: d2h "),
            "{args:?}: no pinned copy line:\n{stdout}"
        );
    }
}
