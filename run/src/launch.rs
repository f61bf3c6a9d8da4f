//! Spawning and supervising the ranks of this node: the environment each
//! rank gets, its process group, parent-death signal and CPU pinning, and
//! the loop that waits for them, stops them all when one fails and turns
//! their ends into the launcher's exit code.

use crate::args::LaunchOptions;
#[cfg(target_os = "linux")]
use crate::cpus::cpu_set;
use crate::cpus::{allowed_cpus, placement};
use crate::error::{Error, Result};
use crate::output::pump_lines;
use crate::rendezvous::{derived_token, free_port, random_u64};
use crate::signals::{signal_group, SignalPipe, LAUNCH_LOCK};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The variable that tells each rank the CPUs this node's ranks run on
/// between them (`ferroccl_transport::wait::HOST_CPUS_VAR`; this crate
/// depends on nothing of ferroccl).
const HOST_CPUS_VAR: &str = "FERROCCL_HOST_CPUS";

/// How long the other ranks may take to stop on their own after one failed,
/// before they get SIGTERM (`FERROCCL_RUN_SETTLE_S`, default 1 s): a rank
/// that sees the failure prints an error naming the failed rank, which is
/// what a person needs to read.
fn settle_time() -> Duration {
    std::env::var("FERROCCL_RUN_SETTLE_S")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(1))
}

/// Grace period between SIGTERM and SIGKILL when `FERROCCL_RUN_GRACE_S` is
/// not set.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// How long the output of exited children is still drained (their own
/// children may hold the pipes open).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long to wait for children after SIGKILL before giving up on them.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// The grace period from `FERROCCL_RUN_GRACE_S` (seconds, fractions allowed).
fn grace_from_env() -> Result<Duration> {
    match std::env::var("FERROCCL_RUN_GRACE_S") {
        Err(_) => Ok(DEFAULT_GRACE),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && (0.0..=3600.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
            _ => Err(Error::Env(format!(
                "FERROCCL_RUN_GRACE_S='{v}' is not a number of seconds between 0 and 3600"
            ))),
        },
    }
}

/// One started rank.
struct RankProcess {
    rank: usize,
    child: Child,
    status: Option<ExitStatus>,
}

/// The exit code a shell would report for `status`.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

fn describe_exit(rank: usize, status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("ferroccl-run: rank {rank} exited with code {c}"),
        (None, Some(s)) => format!("ferroccl-run: rank {rank} was killed by signal {s}"),
        (None, None) => format!("ferroccl-run: rank {rank} ended with status {status}"),
    }
}

/// Start the ranks of this node and supervise them; returns the exit code
/// for the launcher: 0 if every rank exited 0, else the code of the first
/// rank that failed (128 + signal number for a signal).
///
/// When a rank fails, the others get SIGTERM and, after the grace period
/// (`FERROCCL_RUN_GRACE_S`, default 5 s), SIGKILL. SIGINT, SIGTERM and
/// SIGHUP sent to the launcher are forwarded to every rank, and the same
/// grace period then bounds how long the launcher waits for them.
pub fn launch(opts: &LaunchOptions) -> Result<i32> {
    if opts.nproc_per_node == 0 || opts.nnodes == 0 || opts.node_rank >= opts.nnodes {
        return Err(Error::InvalidArgument(format!(
            "cannot launch {} processes per node as node {} of {}",
            opts.nproc_per_node, opts.node_rank, opts.nnodes
        )));
    }
    let grace = grace_from_env()?;
    let master_port =
        match opts.master_port {
            Some(p) => p,
            None if opts.nnodes == 1 => free_port()?,
            None => return Err(Error::InvalidArgument(
                "--master-port is required with --nnodes > 1: every node must use the same port"
                    .into(),
            )),
        };
    let token = match std::env::var("FERROCCL_TOKEN") {
        Ok(t) if !t.trim().is_empty() => t,
        _ if opts.nnodes == 1 => random_u64().to_string(),
        _ => {
            eprintln!(
                "ferroccl-run: note: FERROCCL_TOKEN is not set; deriving the job token from the \
                 master address, port and job shape. Set FERROCCL_TOKEN to the same secret on \
                 every node to keep other jobs out."
            );
            derived_token(
                &opts.master_addr,
                master_port,
                opts.nnodes,
                opts.nproc_per_node,
            )
            .to_string()
        }
    };
    let world_size = opts.nnodes * opts.nproc_per_node;

    let _one_at_a_time = LAUNCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let signals = SignalPipe::install()?;
    let (pump_done_tx, pump_done_rx) = crossbeam_channel::unbounded::<()>();
    let mut pumps = 0usize;
    let mut ranks: Vec<RankProcess> = Vec::with_capacity(opts.nproc_per_node);

    let allowed = allowed_cpus();
    let cpus = placement(opts.bind, opts.nproc_per_node, &allowed);
    // What the ranks are told of the CPUs they run on between them
    // (`ferroccl_transport::wait::host_cpus`), unless the user said it:
    // those this launcher may place them on. Pinned one to a CPU, a rank's
    // own mask names one CPU and says nothing of the others'; under
    // `taskset -c 0` two ranks pinned to CPU 0 share it, and only the
    // launcher knows.
    let told_cpus = Some(allowed.len()).filter(|&c| {
        c > 0
            && std::env::var_os(HOST_CPUS_VAR).is_none()
            && !opts.extra_env.iter().any(|(k, _)| k == HOST_CPUS_VAR)
    });
    for (local, cpu) in cpus.into_iter().enumerate() {
        let rank = opts.node_rank * opts.nproc_per_node + local;
        let mut cmd = Command::new(&opts.program);
        cmd.args(&opts.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world_size.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", opts.nproc_per_node.to_string())
            .env("GROUP_RANK", opts.node_rank.to_string())
            .env("MASTER_ADDR", &opts.master_addr)
            .env("MASTER_PORT", master_port.to_string())
            .env("FERROCCL_LAUNCHER", "ferroccl-run")
            .env("FERROCCL_TOKEN", &token)
            .envs(opts.extra_env.iter().map(|(k, v)| (k, v)))
            .envs(told_cpus.map(|c| (HOST_CPUS_VAR, c.to_string())))
            .stdin(Stdio::null())
            .process_group(0);
        #[cfg(target_os = "linux")]
        {
            let launcher = std::process::id() as libc::pid_t;
            // Built here: the child may not allocate between fork and exec.
            let cpu_set = cpu.as_deref().map(cpu_set);
            // SAFETY: the closure runs in the child between fork and exec and
            // only makes async-signal-safe system calls (prctl, getppid,
            // sched_setaffinity) and fills a CPU set on its stack; it takes
            // no lock and allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    // If the launcher dies (even by SIGKILL), the rank gets
                    // SIGTERM instead of running on as an orphan.
                    let sig = libc::SIGTERM as libc::c_ulong;
                    if libc::prctl(libc::PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::getppid() != launcher {
                        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    if let Some(set) = &cpu_set {
                        // A failure to pin is not worth failing the rank
                        // for (a container may forbid it); it runs unpinned.
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
                    }
                    Ok(())
                });
            }
        }
        if opts.prefix_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for r in &mut ranks {
                    signal_group(r.child.id(), libc::SIGKILL);
                    let _ = r.child.wait();
                }
                return Err(Error::Io(format!(
                    "cannot start rank {rank} ('{}'): {e}",
                    opts.program.to_string_lossy()
                )));
            }
        };
        if opts.prefix_output {
            let pipes: [(Option<Box<dyn Read + Send>>, bool); 2] = [
                (child.stdout.take().map(|s| Box::new(s) as _), false),
                (child.stderr.take().map(|s| Box::new(s) as _), true),
            ];
            for (pipe, to_stderr) in pipes {
                let Some(pipe) = pipe else { continue };
                let done = pump_done_tx.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("ferroccl-run-out-{rank}"))
                    .spawn(move || {
                        pump_lines(rank, pipe, to_stderr);
                        let _ = done.send(());
                    });
                if spawned.is_ok() {
                    pumps += 1;
                }
            }
        }
        ranks.push(RankProcess {
            rank,
            child,
            status: None,
        });
    }
    drop(pump_done_tx);

    let mut first_failure: Option<(usize, ExitStatus)> = None;
    let mut term_at: Option<Instant> = None;
    let mut kill_at: Option<Instant> = None;
    let mut give_up_at: Option<Instant> = None;
    loop {
        for sig in signals.wait(Duration::from_millis(20)) {
            for r in &ranks {
                signal_group(r.child.id(), sig);
            }
            // Whatever the ranks do with it, the launcher ends in bounded
            // time from here.
            kill_at.get_or_insert_with(|| Instant::now() + grace);
        }
        let mut ended = Vec::new();
        for (i, r) in ranks.iter_mut().enumerate() {
            if r.status.is_none() {
                if let Ok(Some(status)) = r.child.try_wait() {
                    r.status = Some(status);
                    ended.push(i);
                }
            }
        }
        let failed: Vec<usize> = ended
            .iter()
            .copied()
            .filter(|&i| ranks[i].status.is_some_and(|s| !s.success()))
            .collect();
        if !failed.is_empty() && first_failure.is_none() {
            // Of the ranks that ended in the same poll, one killed by a
            // signal is the cause; the others most likely exited on the error
            // it caused.
            let cause = failed
                .iter()
                .copied()
                .find(|&i| ranks[i].status.is_some_and(|s| s.signal().is_some()))
                .unwrap_or(failed[0]);
            let status = ranks[cause].status.expect("ended ranks have a status");
            first_failure = Some((ranks[cause].rank, status));
            // Give the survivors a moment to notice and report the failure
            // themselves (they name the failed rank) before stopping them.
            term_at = Some(Instant::now() + settle_time());
        }
        for &i in &failed {
            let status = ranks[i].status.expect("ended ranks have a status");
            eprintln!("{}", describe_exit(ranks[i].rank, status));
        }
        if term_at.is_some_and(|at| Instant::now() >= at) {
            term_at = None;
            // Exited ranks too: their groups may still have members.
            for r in &ranks {
                signal_group(r.child.id(), libc::SIGTERM);
            }
            kill_at.get_or_insert_with(|| Instant::now() + grace);
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        let now = Instant::now();
        if give_up_at.is_none() && kill_at.is_some_and(|at| now >= at) {
            for r in ranks.iter().filter(|r| r.status.is_none()) {
                eprintln!(
                    "ferroccl-run: rank {} did not stop within {:.1} s; sending SIGKILL",
                    r.rank,
                    grace.as_secs_f64()
                );
            }
            for r in &ranks {
                signal_group(r.child.id(), libc::SIGKILL);
            }
            give_up_at = Some(now + KILL_WAIT);
        }
        if give_up_at.is_some_and(|at| now >= at) {
            for r in ranks.iter().filter(|r| r.status.is_none()) {
                eprintln!(
                    "ferroccl-run: rank {} (pid {}) is still there after SIGKILL; leaving it",
                    r.rank,
                    r.child.id()
                );
            }
            break;
        }
    }
    if first_failure.is_some() {
        // Whatever the failed job's ranks left behind in their groups.
        for r in &ranks {
            signal_group(r.child.id(), libc::SIGKILL);
        }
    }
    drop(signals);

    // Let the output threads finish; a rank's own children may hold the
    // pipes open, so this is bounded too.
    let until = Instant::now() + DRAIN_TIMEOUT;
    for _ in 0..pumps {
        if pump_done_rx
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .is_err()
        {
            break;
        }
    }

    if let Some((_, status)) = first_failure {
        return Ok(exit_code(status));
    }
    // No failure seen: all exited 0, or we gave up on some after SIGKILL.
    Ok(ranks
        .iter()
        .map(|r| r.status.map(exit_code).unwrap_or(128 + libc::SIGKILL))
        .find(|&c| c != 0)
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_of_signals() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(
            describe_exit(4, ExitStatus::from_raw(libc::SIGTERM)),
            "ferroccl-run: rank 4 was killed by signal 15"
        );
    }
}
