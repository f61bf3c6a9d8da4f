//! `ferroccl-soak`: a randomised soak of every collective.
//!
//! ```text
//! ferroccl-run -n 4 -- ferroccl-soak --seed 42 --ops 2000
//! ```
//!
//! Every rank joins with `Communicator::from_env()` and derives the same
//! random sequence of operations from one seed: which collective (blocking,
//! in place or not, batches of async allreduces, send/recv between a random
//! pair, all-to-all, barrier), element type, reduction operator, count
//! (skewed towards 0, 1, the rank count, odd numbers and powers of two give
//! or take one, sometimes up to `--max-count`), root, and every so often a
//! split into sub-communicators with random colors (negative: left out) and
//! keys, a few operations on them, and back to the parent; and as often a
//! create/drop cycle: a split whose communicators do one operation and are
//! dropped at once (what `new_group`, pipeline stages and recoveries do),
//! so that a communicator's teardown runs amid everything else. About one call
//! in four puts its buffers in windows (`Communicator::alloc_window`, made
//! for the call on every rank, the buffer at an offset of 0 to 64 elements,
//! the same on every rank or not), so the direct paths between windows run
//! in the same sequence as the slot paths; nothing around a buffer in its
//! window may change.
//!
//! Inputs are functions of (seed, operation, rank, element), so every rank
//! computes every other rank's input and checks its result against an f64
//! (or, for integers, i128) reference computed here, independently of the
//! library. Integer-valued inputs are bounded so that every result is exact
//! in every type; float inputs with full mantissas are checked within the
//! rounding bound of a sum of n terms in any order (see `tolerance_frac`).
//!
//! On the first wrong element or error a rank prints
//! `rank R: op #i (<description>): <what went wrong>` and the command that
//! replays the run, and exits 1. Exit status 2: a bad command line.
//!
//! `FERROCCL_SOAK_SABOTAGE=1` exists only to test this checker: it makes
//! each rank expect a wrong value (one more than the reference) for the
//! first element it checks, so that the run must fail.

mod buffers;
mod check;
mod options;
mod random;
mod reference;
mod run;
mod sequence;
// The tools' shared module lives beside the binaries, not in this folder.
#[path = "../tool/mod.rs"]
mod tool;

use check::Soak;
use ferroccl::Communicator;
use options::{parse_options, replay, Options, USAGE};
use random::mix;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Instant;
use tool::{say, say_err};

/// Agree on the seed (rank 0's) and check that every rank runs the same
/// options.
fn agree(comm: &Communicator, opts: &Options) -> Result<u64, String> {
    let mut seed = [opts.seed.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // Short enough to type.
        mix(nanos ^ u64::from(std::process::id())) % 1_000_000_000
    })];
    comm.broadcast(&mut seed, 0).map_err(|e| e.to_string())?;
    let mine = [
        seed[0],
        opts.ops as u64,
        opts.max_count as u64,
        u64::from(opts.splits),
        u64::from(opts.windows),
    ];
    let k = mine.len();
    let mut all = vec![0u64; k * comm.size()];
    comm.all_gather(&mine, &mut all)
        .map_err(|e| e.to_string())?;
    if let Some(r) = (0..comm.size()).find(|&r| all[k * r..k * (r + 1)] != mine) {
        return Err(format!(
            "rank {r} runs with other options (seed, ops, max-count, splits, windows): {:?}, \
             here {mine:?}",
            &all[k * r..k * (r + 1)]
        ));
    }
    Ok(seed[0])
}

fn main() {
    let opts = tool::options_or_exit("ferroccl-soak", USAGE, parse_options);
    let started = Instant::now();
    let comm = tool::join_or_exit("ferroccl-soak");
    let (rank, size) = (comm.rank(), comm.size());
    let seed = match agree(&comm, &opts) {
        Ok(s) => s,
        Err(e) => {
            say_err(&format!("rank {rank}: agreeing on the seed: {e}"));
            std::process::exit(1);
        }
    };
    if rank == 0 {
        say(&format!(
            "ferroccl-soak: seed {seed}{}, {} ops on {size} ranks, max-count {}, splits {}, \
             windows {}",
            if opts.seed.is_some() {
                ""
            } else {
                " (from the clock)"
            },
            opts.ops,
            opts.max_count,
            if opts.splits { "on" } else { "off" },
            if opts.windows { "on" } else { "off" }
        ));
        say(&format!(
            "ferroccl-soak: replay: {}",
            replay(size, seed, &opts)
        ));
    }
    let soak = Soak {
        seed,
        verbose: opts.verbose,
        sabotage: Cell::new(std::env::var("FERROCCL_SOAK_SABOTAGE").is_ok_and(|v| v == "1")),
        direct: Cell::new(0),
    };
    let mut tally = BTreeMap::new();
    let outcome = soak
        .run(&comm, &opts, &mut tally)
        .map_err(|(i, desc, e)| format!("op #{i} ({desc}): {e}"))
        .and_then(|()| {
            // No rank leaves (rank 0 hosts the rendezvous) before all are done.
            comm.barrier().map_err(|e| format!("final barrier: {e}"))
        });
    if let Err(e) = outcome {
        // Print first, then leave at once: the launcher stops the others.
        say_err(&format!("rank {rank}: {e}"));
        say_err(&format!("replay: {}", replay(size, seed, &opts)));
        std::process::exit(1);
    }
    say(&format!(
        "ferroccl-soak: rank {rank}: {} ops ok (seed {seed})",
        opts.ops
    ));
    if rank == 0 {
        let kinds: Vec<String> = tally.iter().map(|(k, v)| format!("{k} {v}")).collect();
        say(&format!(
            "ferroccl-soak: {} ops ok on {size} ranks in {:.1} s (seed {seed}): {}; on rank 0 {} \
             calls ran without slots (inline, between windows or by cross-memory attach)",
            opts.ops,
            started.elapsed().as_secs_f64(),
            kinds.join(", "),
            soak.direct.get()
        ));
    }
}
