//! The NCCL C ABI as C programs see it: nccl/tests/c/abi.c, compiled with
//! the system C compiler against our header and linked against the built
//! library under NCCL's names, run as 1 to 4 processes on host memory.
//! Every check is in the C program, against references it computes itself.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

mod common;
use common::{cdylib, profile_dir};

/// A scratch directory of this test process.
fn scratch(name: &str) -> PathBuf {
    let dir = profile_dir()
        .join("nccl-abi-tests")
        .join(format!("{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// The library as libnccl.so / libnccl.so.2 (links to the cdylib, as
/// nccl/link-names.sh makes them) and the C program built against it.
struct Built {
    lib_dir: PathBuf,
    program: PathBuf,
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cdylib = cdylib();
        let dir = scratch("build");
        for name in ["libnccl.so", "libnccl.so.2"] {
            std::os::unix::fs::symlink(&cdylib, dir.join(name)).expect("symlink");
        }
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        let program = dir.join("abi");
        let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            // Warnings are not errors: another compiler version may add
            // some, and must not fail CI for them.
            .args(["-std=gnu11", "-O1", "-Wall", "-o"])
            .arg(&program)
            .arg(here.join("tests/c/abi.c"))
            .arg("-I")
            .arg(here.join("include"))
            .arg("-L")
            .arg(&dir)
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .args(["-lnccl", "-ldl", "-lm"])
            .output()
            .expect("running the C compiler (cc)");
        assert!(
            out.status.success(),
            "compiling abi.c failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Built {
            lib_dir: dir,
            program,
        }
    })
}

/// Settings of every run: loopback, no calibration, small slots (so that
/// the point-to-point tests span many), and a bound on every wait. The
/// loader's path is ours alone: cargo puts target/<profile> on it, where a
/// libnccl.so.2 of an earlier build (nccl/link-names.sh) would win over
/// the program's RUNPATH.
fn command(args: &[&str]) -> Command {
    let mut c = Command::new(&built().program);
    c.args(args)
        .env("LD_LIBRARY_PATH", &built().lib_dir)
        .env("FERROCCL_SOCKET_IFNAME", "lo")
        .env("FERROCCL_CALIBRATE", "0")
        .env("FERROCCL_BUFFSIZE", "65536")
        .env("FERROCCL_TIMEOUT", "20")
        .env_remove("NCCL_COMM_ID")
        .env_remove("FERROCCL_COMM_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Wait for `child`, killing it past `limit` (a hung run fails, not
/// hangs the suite); its exit status (None if killed) and output.
fn finish(child: Child, limit: Duration) -> (Option<i32>, String) {
    let done = common::process::wait_bounded(child, limit);
    let text = format!("{}{}", done.stdout, done.stderr);
    if done.killed {
        (None, format!("killed after {limit:?}\n{text}"))
    } else {
        (done.status.code(), text)
    }
}

/// Start `n` ranks of `mode` meeting in a fresh directory; their results.
fn run_ranks(mode: &str, n: usize, extra_env: &[(&str, &str)]) -> Vec<(Option<i32>, String)> {
    let settings: Vec<String> = extra_env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let dir = scratch(&format!("{mode}-{n}-{}", settings.join(",")));
    let children: Vec<Child> = (0..n)
        .map(|r| {
            let mut c = command(&[
                mode,
                &r.to_string(),
                &n.to_string(),
                dir.to_str().expect("utf-8 path"),
            ]);
            for (k, v) in extra_env {
                c.env(k, v);
            }
            c.spawn().expect("starting a rank")
        })
        .collect();
    let results = children
        .into_iter()
        .map(|c| finish(c, Duration::from_secs(120)))
        .collect();
    // It held only the id file.
    let _ = std::fs::remove_dir_all(&dir);
    results
}

/// Every rank's output, for a failure message.
fn report(results: &[(Option<i32>, String)]) -> String {
    results
        .iter()
        .enumerate()
        .map(|(r, (code, out))| format!("--- rank {r} (exit {code:?}):\n{out}"))
        .collect()
}

#[test]
fn every_collective_type_and_op_on_1_to_4_processes() {
    // The transport chosen for one host (shared memory), then TCP, as
    // between hosts.
    let runs = [(1, None), (2, None), (3, None), (4, None), (3, Some("tcp"))];
    for (n, transport) in runs {
        let env: Vec<(&str, &str)> = transport
            .map(|t| ("FERROCCL_TRANSPORT", t))
            .into_iter()
            .collect();
        let results = run_ranks("collectives", n, &env);
        let all = report(&results);
        for (code, out) in &results {
            assert_eq!(*code, Some(0), "{n} ranks ({transport:?}):\n{all}");
            assert!(
                out.contains("collectives OK"),
                "{n} ranks ({transport:?}):\n{all}"
            );
        }
    }
}

#[test]
fn a_killed_peer_shows_in_comm_get_async_error() {
    let n = 3;
    // The death shows by its closed connections, at once: the timeout only
    // bounds a broken run (and sets the heartbeat, kept slow enough that a
    // busy machine does not pass a live rank for dead).
    let results = run_ranks("peerdeath", n, &[("FERROCCL_TIMEOUT", "10")]);
    let all = report(&results);
    for (rank, (code, out)) in results.iter().enumerate() {
        if rank == n - 1 {
            // It killed itself with SIGKILL: no exit code.
            assert_eq!(*code, None, "the dying rank exited:\n{all}");
            continue;
        }
        assert_eq!(*code, Some(0), "rank {rank}:\n{all}");
        assert!(out.contains("peer death seen, OK"), "rank {rank}:\n{all}");
    }
}

#[test]
fn bad_arguments_configs_and_unsupported_calls_are_refused_by_name() {
    let dir = scratch("errors");
    let child = command(&["errors", dir.to_str().expect("utf-8 path")])
        .spawn()
        .expect("starting the program");
    let (code, out) = finish(child, Duration::from_secs(120));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("errors OK"), "{out}");
}

#[test]
fn splits_in_a_group_run_at_group_end_so_one_thread_splits_every_rank() {
    let child = command(&["groupsplit"])
        .spawn()
        .expect("starting the program");
    let (code, out) = finish(child, Duration::from_secs(120));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("groupsplit OK"), "{out}");
}

#[test]
fn an_init_whose_peer_never_comes_fails_at_the_timeout() {
    let child = command(&["lonely"])
        .env("FERROCCL_TIMEOUT", "2")
        .spawn()
        .expect("starting the program");
    let (code, out) = finish(child, Duration::from_secs(120));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("lonely OK"), "{out}");
}

#[test]
fn the_38_symbols_pytorch_imports_resolve_and_the_soname_is_libnccl_so_2() {
    let lib = built().lib_dir.join("libnccl.so.2");
    let child = command(&["symbols", lib.to_str().expect("utf-8 path")])
        .spawn()
        .expect("starting the program");
    let (code, out) = finish(child, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("SONAME libnccl.so.2"), "{out}");
}
