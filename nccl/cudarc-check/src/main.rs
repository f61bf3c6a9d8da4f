//! `cudarc-nccl-check`: a program on `cudarc::nccl`, run against ferroccl's
//! libnccl (docs/nccl.md, "cudarc").
//!
//! ```text
//! cudarc-nccl-check host N   N processes, cudarc's result-level calls on
//!                            host memory (no GPU needed: CI)
//! cudarc-nccl-check gpu N    N processes on the machine's GPU(s) in
//!                            Candle's pattern (Id, Comm::from_rank,
//!                            all_reduce of CudaSlices)
//! ```
//!
//! Each rank is a process started by the first (the launcher), as Candle's
//! multi-process example starts one per GPU. Rank 0 makes the unique id and
//! shares it through a file. Every rank first checks which `libnccl` cudarc's
//! loader mapped (with `FERROCCL_CHECK_EXPECT_LIB=<file>`, it must be that
//! file) and that the NCCL functions cudarc declares resolve in it, then
//! runs its collectives and checks each result against a reference computed
//! in f64 from the inputs' formula. The launcher exits 0 only when every
//! rank did. `CUDARC_CHECK_TIMEOUT` (seconds, default 120) bounds the run.

//!
//! The source follows the run: `main.rs` the command line, `launcher.rs`
//! the first process starting the ranks, `rank.rs` what every rank does
//! first and the helpers both modes use, `symbols.rs` the check of the
//! library cudarc loaded and of the functions it declares, `host.rs` and
//! `gpu.rs` the two modes' collectives.

mod gpu;
mod host;
mod launcher;
mod rank;
mod symbols;

use launcher::launch;
use rank::run_rank;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let outcome = match args.as_slice() {
        [_, mode @ ("host" | "gpu"), world] => parse_world(world).and_then(|w| launch(mode, w)),
        [_, "rank", mode @ ("host" | "gpu"), rank, world, dir] => {
            parse_rank(rank, world).and_then(|(r, w)| run_rank(mode, r, w, Path::new(dir)))
        }
        _ => Err(
            "usage: cudarc-nccl-check host|gpu WORLD   (ranks as processes; see the source's docs)"
                .into(),
        ),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cudarc-nccl-check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_world(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(w) if (1..=64).contains(&w) => Ok(w),
        _ => Err(format!(
            "WORLD must be a number of ranks from 1 to 64, not {s:?}"
        )),
    }
}

fn parse_rank(rank: &str, world: &str) -> Result<(usize, usize), String> {
    let world = parse_world(world)?;
    match rank.parse::<usize>() {
        Ok(r) if r < world => Ok((r, world)),
        _ => Err(format!("RANK must be below WORLD ({world}), not {rank:?}")),
    }
}

pub(crate) fn timeout() -> Duration {
    let secs = std::env::var("CUDARC_CHECK_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(120);
    Duration::from_secs(secs)
}
