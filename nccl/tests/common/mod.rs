//! What the ABI's test programs share: where cargo put the library, and
//! the workspace's one bounded process runner (tests/common/process.rs,
//! included rather than written again).

use std::path::PathBuf;

#[path = "../../../tests/common/process.rs"]
#[allow(dead_code)]
pub mod process;

pub use process::profile_dir;

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
