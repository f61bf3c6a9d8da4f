//! What the ferroccl-perf tests share.

use std::path::PathBuf;

/// The binary under test: the one beside this test's executable where
/// there is one (the GPU run's folder, `cuda/gpu/collect.sh`, carries the
/// tests there, where cargo's target folder does not exist), else the one
/// cargo built for this test.
pub fn perf_binary() -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("ferroccl-perf")));
    match beside {
        Some(p) if p.is_file() => p,
        _ => PathBuf::from(env!("CARGO_BIN_EXE_ferroccl-perf")),
    }
}

/// A process's output as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
