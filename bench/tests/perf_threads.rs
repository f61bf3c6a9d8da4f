//! `ferroccl-perf -t N`: ranks as threads of one process (nccl-tests'
//! `--nthreads`), alone and beside `--ranks` processes, run as a user runs
//! it. Host buffers; small sizes, so that each run takes about a second.

mod common;

use common::{perf_binary, text, wrong_cells};
use std::collections::BTreeSet;
use std::process::{Command, Output};

fn perf(args: &[&str]) -> Output {
    Command::new(perf_binary())
        .args(args)
        .output()
        .expect("ferroccl-perf starts")
}

/// A checked allreduce from 8 B to 64 KiB with `extra` arguments: it must
/// succeed, say `ranks (processes x threads)` in its header, count no wrong
/// element in any row, and describe each rank on a line of its own that
/// names its process and thread, every (pid, thread) pair once and every
/// process with threads 0..threads.
fn assert_thread_ranks(extra: &[&str], processes: usize, threads: usize) {
    let mut args = vec![
        "allreduce",
        "-b",
        "8",
        "-e",
        "64K",
        "-f",
        "4",
        "-n",
        "2",
        "-w",
        "1",
        "-c",
        "1",
    ];
    args.extend(extra);
    let out = perf(&args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let context = format!("{args:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(out.status.success(), "{:?}: {context}", out.status);
    let ranks = processes * threads;
    let plural = if processes == 1 { "" } else { "es" };
    let header = format!(
        "# ferroccl-perf: allreduce on {ranks} ranks ({processes} process{plural} x {threads} threads)"
    );
    assert!(
        stdout.lines().any(|l| l == header),
        "no `{header}`: {context}"
    );

    // `#  Rank   2 Pid   12345 Thread  0 on HOST peers ...`
    let mut seen = BTreeSet::new();
    let mut rank_lines = 0;
    for line in stdout.lines().filter(|l| l.starts_with("#  Rank ")) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            (cells[1], cells[3], cells[5]),
            ("Rank", "Pid", "Thread"),
            "{line}: {context}"
        );
        let rank: usize = cells[2].parse().expect("rank number");
        let pid: u32 = cells[4].parse().expect("pid");
        let thread: usize = cells[6].parse().expect("thread number");
        assert_eq!(rank, rank_lines, "ranks in order: {context}");
        assert_eq!(
            rank % threads,
            thread,
            "rank = process x threads + thread: {context}"
        );
        assert!(
            seen.insert((pid, thread)),
            "({pid}, {thread}) twice: {context}"
        );
        rank_lines += 1;
    }
    assert_eq!(rank_lines, ranks, "one line per rank: {context}");
    let pids: BTreeSet<u32> = seen.iter().map(|&(pid, _)| pid).collect();
    assert_eq!(pids.len(), processes, "processes: {context}");

    // Rows of 13 columns, no wrong element out of place or in place.
    let rows = wrong_cells(&stdout);
    // 8 B to 64 KiB by 4: 8, 32, ..., 32 KiB.
    assert_eq!(rows.len(), 7, "{context}");
    for (k, row) in rows.iter().enumerate() {
        assert_eq!(
            (row.0.as_str(), row.1.as_str()),
            ("0", "0"),
            "row {k}: {context}"
        );
    }
    assert!(
        stdout.contains("# Out of bounds values : 0 OK"),
        "{context}"
    );
}

#[test]
fn two_thread_ranks_in_one_process() {
    assert_thread_ranks(&["-t", "2"], 1, 2);
}

#[test]
fn two_processes_of_two_thread_ranks() {
    assert_thread_ranks(&["--ranks", "2", "-t", "2"], 2, 2);
}

/// `--fresh 1` (each call after the buffers are touched, timed alone):
/// every row still checks out against the f64 reference, in place too,
/// where each call's input is rewritten first, and the header says so.
#[test]
fn fresh_rounds_check_out() {
    assert_thread_ranks(&["-t", "2", "--fresh", "1"], 1, 2);
    let out = perf(&[
        "allreduce",
        "-t",
        "2",
        "-b",
        "1K",
        "-e",
        "1K",
        "-n",
        "3",
        "--fresh",
        "1",
    ]);
    assert!(
        text(&out.stdout).contains(" fresh: each call timed alone after the buffers are touched"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn zero_threads_is_refused() {
    for flag in ["-t", "--nthreads"] {
        let out = perf(&[flag, "0"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} 0: {stderr}");
        assert!(
            stderr.contains(&format!("{flag} must be at least 1")),
            "{flag} 0: {stderr}"
        );
        assert!(text(&out.stdout).is_empty(), "{flag} 0 printed a table");
    }
}
