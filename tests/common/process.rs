//! Running real processes in tests: a command cleared of launcher and
//! ferroccl settings from the test's own environment, run to its end or
//! killed past a limit (so a bug fails the test instead of hanging CI), and
//! what it left; where cargo put this test (target/<profile>) and the
//! `ferroccl-run` launcher.
//!
//! The one runner of the workspace's tests: std only, so that the tests of
//! other crates of the workspace (nccl/) include this file with
//! `#[path]` instead of writing a runner again.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// What a finished process left.
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// It ran past its limit and was killed (`status` is the kill's).
    pub killed: bool,
}

impl Finished {
    pub fn all(&self) -> String {
        format!("--- stdout\n{}--- stderr\n{}", self.stdout, self.stderr)
    }

    /// Lines `[rank R] rest` of both streams, as (R, rest).
    pub fn prefixed(&self) -> Vec<(usize, String)> {
        self.stdout
            .lines()
            .chain(self.stderr.lines())
            .filter_map(|line| {
                let rest = line.strip_prefix("[rank ")?;
                let (r, rest) = rest.split_once("] ")?;
                Some((r.parse().ok()?, rest.to_string()))
            })
            .collect()
    }

    /// The error rank `r` printed (`rank R: ...` after its prefix).
    pub fn error_of(&self, r: usize) -> Option<String> {
        let own = format!("rank {r}: ");
        self.prefixed()
            .into_iter()
            .filter(|(pr, _)| *pr == r)
            .find_map(|(_, rest)| rest.strip_prefix(&own).map(str::to_string))
    }
}

/// A command with no launcher or ferroccl settings from the test's own
/// environment, stdin closed, output captured.
pub fn clean(program: &str) -> Command {
    let mut cmd = Command::new(program);
    let launcher = [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ];
    for (var, _) in std::env::vars() {
        if var.starts_with("FERROCCL_")
            || var.starts_with("OMPI_")
            || var.starts_with("PMI_")
            || var.starts_with("SLURM_")
            || launcher.contains(&var.as_str())
        {
            cmd.env_remove(var);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Run `cmd` to its end; kill it (and fail) if it runs past `limit`.
/// Killing `ferroccl-run` also ends its ranks (their parent-death signal).
pub fn run_bounded(mut cmd: Command, limit: Duration) -> Finished {
    let child = cmd.spawn().expect("cannot start the process");
    let done = wait_bounded(child, limit);
    if done.killed {
        panic!(
            "{cmd:?} still ran after {limit:?}; killed it\n{}",
            done.all()
        );
    }
    done
}

/// Wait for `child` (its output piped) to end, killing it past `limit`
/// (`killed` says so): a hung process fails its test instead of hanging
/// the suite. Both pipes are read on threads of their own, so a child
/// never stops on a full pipe while it is waited for.
pub fn wait_bounded(mut child: Child, limit: Duration) -> Finished {
    let start = Instant::now();
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut b);
            }
            String::from_utf8_lossy(&b).into_owned()
        })
    };
    let out = pipe(child.stdout.take().map(|p| Box::new(p) as _));
    let err = pipe(child.stderr.take().map(|p| Box::new(p) as _));
    let mut killed = false;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            killed = true;
            break child.wait().expect("waiting for the killed process");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = start.elapsed();
    Finished {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        elapsed,
        killed,
    }
}

/// target/<profile>, where cargo put this test: the test executable sits
/// in its deps/.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// The `ferroccl-run` binary. It belongs to another package of the
/// workspace, so cargo gives these tests no `CARGO_BIN_EXE_` for it: it is
/// taken from the profile directory this test was built into
/// (target/<profile>/) and built there with cargo if missing (`cargo test
/// --workspace` has built it already).
pub fn ferroccl_run() -> &'static str {
    static PATH: OnceLock<String> = OnceLock::new();
    PATH.get_or_init(|| {
        let profile_dir = profile_dir();
        let path = profile_dir.join(format!("ferroccl-run{}", std::env::consts::EXE_SUFFIX));
        if !path.exists() {
            let mut cmd = Command::new(env!("CARGO"));
            // From inside the workspace, wherever the test was started.
            cmd.current_dir(env!("CARGO_MANIFEST_DIR")).args([
                "build",
                "-p",
                "ferroccl-run",
                "--bin",
                "ferroccl-run",
            ]);
            if profile_dir.ends_with("release") {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("cannot run cargo");
            assert!(status.success(), "building ferroccl-run failed");
        }
        path.into_os_string()
            .into_string()
            .expect("the target directory's path is UTF-8")
    })
}
