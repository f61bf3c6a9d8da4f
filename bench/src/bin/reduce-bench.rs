//! `reduce-bench`: throughput of ferroccl's CPU reduction kernel
//! (`ferroccl::reduce::reduce_into`) next to `copy_from_slice` of the same
//! bytes, for the types and ops a CPU collective spends its time in.
//!
//! GB/s here is bytes of the destination array per second (10^9 B/s): a
//! reduction reads two arrays and writes one, a copy reads one and writes
//! one, so at memory speed the reduction is expected at about 2/3 of the
//! copy. Each figure is the best of several trials, which on a shared
//! machine is the least disturbed one.
//!
//! usage: `reduce-bench [TRIALS] [FILTER]` (default 5 trials; FILTER keeps
//! the kernels whose name contains it, e.g. `max`). The kernels run at the
//! widest vector level the CPU has; `FERROCCL_SIMD=baseline|avx2|avx512`
//! lowers it, for comparing levels.

use ferroccl::{
    reduce::{reduce_into, SimdLevel},
    Element, ReduceOp,
};
use half::{bf16, f16};
use std::hint::black_box;
use std::time::Instant;

/// Bytes processed per trial at least, so that small sizes are timed over
/// many calls.
const BYTES_PER_TRIAL: usize = 256 << 20;

/// Array sizes in bytes: in L1/L2, in L2/L3, and far beyond any cache.
const SIZES: [usize; 3] = [4 << 10, 256 << 10, 64 << 20];

/// Best time per call of `f`, in seconds, over `trials` trials of `reps`
/// calls each.
fn best_of(trials: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    f(); // touch the pages and warm the caches
    (0..trials)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// (reduce GB/s, copy GB/s) of `bytes`-byte arrays of `T` under `op`.
fn measure<T: Element>(op: ReduceOp, bytes: usize, trials: usize) -> (f64, f64) {
    let n = bytes / std::mem::size_of::<T>();
    let src: Vec<T> = (0..n).map(|i| T::from_f64((i % 3) as f64)).collect();
    let mut dst: Vec<T> = vec![T::from_f64(1.0); n];
    let reps = (BYTES_PER_TRIAL / bytes).max(1);
    let reduce = best_of(trials, reps, || {
        reduce_into(op, black_box(&mut dst[..]), black_box(&src[..]));
    });
    let copy = best_of(trials, reps, || {
        black_box(&mut dst[..]).copy_from_slice(black_box(&src[..]));
    });
    (bytes as f64 / reduce / 1e9, bytes as f64 / copy / 1e9)
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn main() {
    let trials = match std::env::args().nth(1).map(|a| a.parse::<usize>()) {
        None => 5,
        Some(Ok(t)) if t > 0 => t,
        Some(_) => {
            eprintln!("usage: reduce-bench [TRIALS] [FILTER]   (TRIALS >= 1, default 5)");
            std::process::exit(2);
        }
    };
    type Case = (&'static str, fn(usize, usize) -> (f64, f64));
    let cases: [Case; 9] = [
        ("f32 sum", |b, t| measure::<f32>(ReduceOp::Sum, b, t)),
        ("f64 sum", |b, t| measure::<f64>(ReduceOp::Sum, b, t)),
        ("i32 sum", |b, t| measure::<i32>(ReduceOp::Sum, b, t)),
        ("f16 sum", |b, t| measure::<f16>(ReduceOp::Sum, b, t)),
        ("bf16 sum", |b, t| measure::<bf16>(ReduceOp::Sum, b, t)),
        ("f32 max", |b, t| measure::<f32>(ReduceOp::Max, b, t)),
        ("f32 min", |b, t| measure::<f32>(ReduceOp::Min, b, t)),
        ("bf16 max", |b, t| measure::<bf16>(ReduceOp::Max, b, t)),
        ("bf16 min", |b, t| measure::<bf16>(ReduceOp::Min, b, t)),
    ];
    println!("# reduce_into vs copy_from_slice, GB/s of the destination array (best of {trials})");
    println!(
        "# kernels: {} (the CPU has {}; FERROCCL_SIMD=baseline|avx2|avx512 lowers it)",
        SimdLevel::current(),
        SimdLevel::detected()
    );
    println!(
        "# {:<9} {:>8} {:>10} {:>10} {:>8}",
        "kernel", "size", "reduce", "copy", "ratio"
    );
    let filter = std::env::args().nth(2).unwrap_or_default();
    for (name, run) in cases.into_iter().filter(|(name, _)| name.contains(&filter)) {
        for bytes in SIZES {
            let (reduce, copy) = run(bytes, trials);
            println!(
                "  {:<9} {:>8} {:>10.2} {:>10.2} {:>8.2}",
                name,
                human(bytes),
                reduce,
                copy,
                reduce / copy
            );
        }
    }
}
