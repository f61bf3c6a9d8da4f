//! cudarc's `nccl` module on our library, without a GPU: the program in
//! nccl/cudarc-check (a workspace of its own, so that cudarc's `nccl`
//! feature stays out of the main build) is built here with cargo into its
//! own target directory, then run as 2 and 3 processes with only a
//! `libnccl.so` link to the cdylib cargo just built on the loader's path.
//! Every check is in the program: that cudarc's loader mapped this very
//! file, that every NCCL function cudarc declares (for NCCL 2.30, but
//! 2.30's parameter API) and every one the program uses resolves in it, and that cudarc's
//! result-level calls (NULL stream, host memory) give the f64 references.

use common::process::{run_bounded, Finished};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

mod common;
use common::{cdylib, profile_dir};

/// Past this a run is killed and the test fails: the program bounds every
/// wait of its own (CUDARC_CHECK_TIMEOUT, 120 s), this bounds the program.
const LIMIT: Duration = Duration::from_secs(240);

struct Built {
    /// Holds only `libnccl.so`, a link to the cdylib.
    lib_dir: PathBuf,
    /// The cdylib itself, as the kernel names it in /proc/self/maps.
    cdylib: PathBuf,
    program: PathBuf,
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        // Canonical: the name the kernel shows in /proc/self/maps.
        let cdylib = cdylib();
        let cdylib =
            std::fs::canonicalize(&cdylib).unwrap_or_else(|e| panic!("{}: {e}", cdylib.display()));
        let lib_dir = profile_dir()
            .join("nccl-abi-tests")
            .join(format!("{}-cudarc-lib", std::process::id()));
        let _ = std::fs::remove_dir_all(&lib_dir);
        std::fs::create_dir_all(&lib_dir).expect("scratch directory");
        // The first name cudarc's loader tries.
        std::os::unix::fs::symlink(&cdylib, lib_dir.join("libnccl.so")).expect("symlink");

        // Its own target directory: the outer cargo holds the lock of
        // target/<profile> while tests run. The lock file pins the main
        // workspace's cudarc; nothing is fetched that the main build did
        // not already fetch (libloading, cfg-if).
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("cudarc-check/Cargo.toml");
        let target = profile_dir()
            .parent()
            .expect("target/")
            .join("cudarc-check");
        let out = Command::new(env!("CARGO"))
            .args(["build", "--locked", "--quiet", "--manifest-path"])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .output()
            .expect("running cargo");
        assert!(
            out.status.success(),
            "building nccl/cudarc-check failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Built {
            lib_dir,
            cdylib,
            program: target.join("debug").join("cudarc-nccl-check"),
        }
    })
}

/// `cudarc-nccl-check host <world>`, the loader's path ours alone (cargo
/// puts target/<profile> on it, where nccl/link-names.sh may have left
/// links of an earlier build), loopback, small slots so that the ring of
/// sends spans many, every wait bounded.
fn run_host(world: usize, extra_env: &[(&str, &str)]) -> Finished {
    let b = built();
    let mut c = Command::new(&b.program);
    c.args(["host", &world.to_string()])
        .env("LD_LIBRARY_PATH", &b.lib_dir)
        .env("FERROCCL_CHECK_EXPECT_LIB", &b.cdylib)
        .env("FERROCCL_SOCKET_IFNAME", "lo")
        .env("FERROCCL_CALIBRATE", "0")
        .env("FERROCCL_BUFFSIZE", "65536")
        .env("FERROCCL_TIMEOUT", "20")
        .env("CUDARC_CHECK_TIMEOUT", "120")
        .env_remove("NCCL_COMM_ID")
        .env_remove("FERROCCL_COMM_ID");
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    run_bounded(c, LIMIT)
}

fn assert_every_rank_ok(world: usize, out: &Finished, what: &str) {
    let text = out.all();
    assert!(out.status.success(), "{what}:\n{text}");
    for rank in 0..world {
        assert!(
            text.contains(&format!("rank {rank}: OK")),
            "{what}, rank {rank}:\n{text}"
        );
    }
    assert!(
        text.contains(&format!("cudarc-nccl-check host {world}: every rank OK")),
        "{what}:\n{text}"
    );
}

#[test]
fn cudarc_loads_our_libnccl_and_its_calls_run_collectives_on_host_memory() {
    for world in [2, 3] {
        let out = run_host(world, &[]);
        assert_every_rank_ok(world, &out, &format!("{world} ranks"));
    }
}

#[test]
fn cudarc_on_our_libnccl_over_tcp() {
    let world = 2;
    let out = run_host(world, &[("FERROCCL_TRANSPORT", "tcp")]);
    assert_every_rank_ok(world, &out, "2 ranks over TCP");
}

/// The program itself refuses, by name, a run where cudarc finds no
/// libnccl, instead of letting cudarc's loader panic.
#[test]
fn without_our_library_on_the_path_the_program_says_so() {
    let b = built();
    let empty = b.lib_dir.with_extension("empty");
    std::fs::create_dir_all(&empty).expect("scratch directory");
    let mut c = Command::new(&b.program);
    c.args(["host", "1"])
        .env("LD_LIBRARY_PATH", &empty)
        .env("FERROCCL_CHECK_EXPECT_LIB", &b.cdylib)
        .env("CUDARC_CHECK_TIMEOUT", "30")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = run_bounded(c, LIMIT);
    let text = out.all();
    // Where a real NCCL is installed system-wide, cudarc finds that one,
    // and the program must then refuse it as not ours.
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("cudarc finds no libnccl") || text.contains("not (only)"),
        "{text}"
    );
}
