//! Runs the Python package's tests (pytest, `python/tests/test_*.py`)
//! against the extension module cargo built with this crate: the cdylib is
//! copied beside `python/ferroccl/*.py` into a temporary package folder,
//! named as Python loads it (`ferroccl/_ferroccl.abi3.so`).
//!
//! The interpreter is FERROCCL_PYTHON, else `python3`. Without torch or
//! pytest there the test prints why and passes, unless
//! FERROCCL_REQUIRE_TORCH=1 (CI sets it after installing them): then it
//! fails, and the C++ torch backend is required too
//! (FERROCCL_TORCH_BACKEND=cpp unless set). FERROCCL_PYTEST_ARGS adds
//! arguments (`-k ddp`, say).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's test process helpers (target/<profile>), included
/// rather than written again.
#[path = "../../tests/common/process.rs"]
#[allow(dead_code)]
mod process;

use process::profile_dir;

/// The cdylib `cargo test` built: in deps/ beside the test executable, else
/// the copy `cargo build` puts in target/<profile>.
fn cdylib() -> PathBuf {
    let name = "lib_ferroccl.so";
    let deps = profile_dir().join("deps").join(name);
    let lib = if deps.exists() {
        deps
    } else {
        profile_dir().join(name)
    };
    assert!(
        lib.exists(),
        "{} is missing: cargo builds it with the crate (crate-type cdylib)",
        lib.display()
    );
    lib
}

fn python() -> String {
    std::env::var("FERROCCL_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A package folder holding `ferroccl/` as `pip install ./python` lays it.
fn package(root: &Path) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferroccl-py-{}", std::process::id()));
    let pkg = dir.join("ferroccl");
    std::fs::create_dir_all(&pkg).expect("creating the package folder");
    for entry in std::fs::read_dir(root.join("ferroccl")).expect("python/ferroccl") {
        let path = entry.expect("listing python/ferroccl").path();
        if path.extension().is_some_and(|e| e == "py" || e == "pyi") || path.ends_with("py.typed") {
            std::fs::copy(&path, pkg.join(path.file_name().expect("a file name")))
                .expect("copying the package's sources");
        }
    }
    // The C++ torch backend's source, which the package builds on first use.
    let csrc = pkg.join("csrc");
    std::fs::create_dir_all(&csrc).expect("creating the package's csrc/");
    for entry in std::fs::read_dir(root.join("ferroccl/csrc")).expect("python/ferroccl/csrc") {
        let path = entry.expect("listing python/ferroccl/csrc").path();
        std::fs::copy(&path, csrc.join(path.file_name().expect("a file name")))
            .expect("copying the C++ backend's source");
    }
    std::fs::copy(cdylib(), pkg.join("_ferroccl.abi3.so")).expect("copying the extension");
    dir
}

#[test]
fn python_package_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let require = std::env::var("FERROCCL_REQUIRE_TORCH").is_ok_and(|v| v == "1");
    let py = python();
    let probe = Command::new(&py)
        .args(["-c", "import torch, pytest, numpy"])
        .output();
    let missing = match &probe {
        Err(e) => Some(format!("{py} cannot run: {e}")),
        Ok(o) if !o.status.success() => Some(format!(
            "{py} lacks torch, pytest or numpy: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    };
    if let Some(why) = missing {
        assert!(
            !require,
            "FERROCCL_REQUIRE_TORCH=1 but {why} (install them: see README, PyTorch)"
        );
        eprintln!("skipping the Python package's tests: {why}");
        return;
    }
    let dir = package(root);
    let tests = root.join("tests");
    let mut cmd = Command::new(&py);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(&tests)
        .current_dir(&tests)
        .env(
            "PYTHONPATH",
            format!("{}:{}", dir.display(), tests.display()),
        )
        .env("FERROCCL_TEST_LOGS", &dir);
    if require && std::env::var_os("FERROCCL_TORCH_BACKEND").is_none() {
        // Where torch is required (CI), so is the C++ backend: its build
        // failing must fail the tests, not fall back to the Python one.
        cmd.env("FERROCCL_TORCH_BACKEND", "cpp");
    }
    if let Ok(extra) = std::env::var("FERROCCL_PYTEST_ARGS") {
        cmd.args(extra.split_whitespace());
    }
    let out = cmd.output().expect("running pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "pytest failed:\n{text}");
}
