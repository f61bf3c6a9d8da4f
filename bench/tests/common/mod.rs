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

/// The `#wrong` cells (out-of-place, in-place) of every row of a
/// `ferroccl-perf` table, each row checked to have its 13 columns.
pub fn wrong_cells(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(cells.len(), 13, "a row has 13 columns: {l}");
            (cells[8].to_string(), cells[12].to_string())
        })
        .collect()
}
