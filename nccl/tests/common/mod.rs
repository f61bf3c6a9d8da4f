//! What the ABI's test programs share: where cargo put the library.

use std::path::{Path, PathBuf};

/// target/<profile>: the test executable sits in its deps/.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// The cdylib `cargo test` built. It lies beside the test executable, in
/// deps/, together with the rlib the test links (cargo copies it up to
/// target/<profile> only for `cargo build`, so the copy there may be
/// stale); the copy up there only where deps/ has none.
pub fn cdylib() -> PathBuf {
    let deps = profile_dir().join("deps").join("libferroccl_nccl.so");
    let cdylib = if deps.exists() {
        deps
    } else {
        profile_dir().join("libferroccl_nccl.so")
    };
    assert!(
        cdylib.exists(),
        "{} is missing: cargo builds it with the crate (crate-type cdylib)",
        cdylib.display()
    );
    cdylib
}
