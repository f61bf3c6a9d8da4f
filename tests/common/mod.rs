//! Shared test helpers: inputs whose reductions are exact in every element
//! type, and the f64 reference they are checked against.
#![allow(dead_code)]

pub mod process;

use ferroccl::{Communicator, DataType, Element, ReduceOp};

/// Input of `rank` at element `i` for `op`. Small integers: every sum of up
/// to 8 ranks fits i8/u8 and is exact in bf16 (8 significant bits), and
/// products stay within {-2..2}, so integer results are exact and float
/// results are exact up to the final division of Avg.
pub fn input_value(dtype: DataType, op: ReduceOp, rank: usize, size: usize, i: usize) -> f64 {
    let signed = matches!(
        dtype,
        DataType::I8
            | DataType::I32
            | DataType::I64
            | DataType::F32
            | DataType::F64
            | DataType::F16
            | DataType::Bf16
    );
    let h = (i.wrapping_mul(2654435761) ^ rank.wrapping_mul(40503)) % 9;
    match op {
        ReduceOp::Prod => {
            // One rank (which one depends on i) contributes 2 or -1, the rest 1.
            if rank == i % size {
                if signed && i.is_multiple_of(3) {
                    -1.0
                } else {
                    2.0
                }
            } else {
                1.0
            }
        }
        _ => {
            if signed {
                h as f64 - 4.0
            } else {
                h as f64
            }
        }
    }
}

/// The f64 reference of `op` over ranks of element `i`.
pub fn reference(dtype: DataType, op: ReduceOp, size: usize, i: usize) -> f64 {
    let vals = (0..size).map(|r| input_value(dtype, op, r, size, i));
    match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Avg => {
            let sum: f64 = vals.sum();
            let avg = sum / size as f64;
            if is_float(dtype) {
                avg
            } else {
                avg.trunc()
            }
        }
        ReduceOp::Prod => vals.product(),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
    }
}

pub fn is_float(dtype: DataType) -> bool {
    matches!(
        dtype,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
    )
}

/// Tolerance of a result: exact except Avg on floats, where the one final
/// division rounds once (half an ulp of the type, relative).
pub fn tolerance(dtype: DataType, op: ReduceOp, want: f64) -> f64 {
    if op != ReduceOp::Avg || !is_float(dtype) {
        return 0.0;
    }
    let rel = match dtype {
        DataType::F16 => 2f64.powi(-11),
        DataType::Bf16 => 2f64.powi(-8),
        DataType::F32 => 2f64.powi(-24),
        _ => 2f64.powi(-53),
    };
    want.abs() * rel * 1.01
}

pub fn make<T: Element>(n: usize, f: impl Fn(usize) -> f64) -> Vec<T> {
    (0..n).map(|i| T::from_f64(f(i))).collect()
}

/// Check `got` against `want(i)`, reporting the first difference.
pub fn check<T: Element>(
    what: &str,
    got: &[T],
    want: impl Fn(usize) -> f64,
    tol: impl Fn(f64) -> f64,
) {
    for (i, v) in got.iter().enumerate() {
        let w = want(i);
        let g = v.to_f64();
        assert!(
            (g - w).abs() <= tol(w),
            "{what}: element {i} is {g}, expected {w} ({} elements)",
            got.len()
        );
    }
}

/// Reduce-scatter `count` elements per rank of the reference inputs, out of
/// place and in place: this rank's block must match the reference.
pub fn check_reduce_scatter<T: Element>(
    comm: &Communicator,
    count: usize,
    op: ReduceOp,
    tol: impl Fn(f64) -> f64 + Copy,
    what: &dyn Fn(&str) -> String,
) {
    let (rank, n, dt) = (comm.rank(), comm.size(), T::DTYPE);
    // Block j of the input holds elements j*count..
    let big: Vec<T> = make(count * n, |i| input_value(dt, op, rank, n, i));
    let want_block = |i: usize| reference(dt, op, n, rank * count + i);
    let mut out = vec![T::from_f64(-99.0); count];
    comm.reduce_scatter(&big, &mut out, op).unwrap();
    check(&what("reduce_scatter"), &out, want_block, tol);
    let mut buf = big;
    comm.reduce_scatter_in_place(&mut buf, op).unwrap();
    check(
        &what("reduce_scatter_in_place"),
        &buf[rank * count..(rank + 1) * count],
        want_block,
        tol,
    );
}

/// A value that identifies (rank, i) and is exact in every type.
pub fn tag(r: usize, i: usize) -> f64 {
    ((r * 31 + i * 7) % 100) as f64
}

/// The collectives that move data without reducing it, at `count`
/// elements per rank: all_gather out of place and in place, broadcast from
/// rank `count % size`, all_to_all; every result exact.
pub fn check_moving_collectives<T: Element>(
    comm: &Communicator,
    count: usize,
    what: &dyn Fn(&str) -> String,
) {
    let (rank, n) = (comm.rank(), comm.size());
    let exact = |_: f64| 0.0;
    let gathered = |j: usize| tag(j / count.max(1), j % count.max(1));
    let mine: Vec<T> = make(count, |i| tag(rank, i));
    let mut out = vec![T::from_f64(-1.0); count * n];
    comm.all_gather(&mine, &mut out).unwrap();
    check(&what("all_gather"), &out, gathered, exact);
    let mut buf = vec![T::from_f64(-1.0); count * n];
    buf[rank * count..(rank + 1) * count].copy_from_slice(&mine);
    comm.all_gather_in_place(&mut buf).unwrap();
    check(&what("all_gather_in_place"), &buf, gathered, exact);

    let root = count % n;
    let mut buf: Vec<T> = make(count, |i| tag(rank, i));
    comm.broadcast(&mut buf, root).unwrap();
    check(&what("broadcast"), &buf, |i| tag(root, i), exact);

    // all_to_all: block j of rank r's input is tagged (r, j*count + i).
    let send: Vec<T> = make(count * n, |j| tag(rank, j));
    let mut recv = vec![T::from_f64(-1.0); count * n];
    comm.all_to_all(&send, &mut recv).unwrap();
    check(
        &what("all_to_all"),
        &recv,
        |j| tag(j / count.max(1), rank * count + j % count.max(1)),
        exact,
    );
}

/// Reduce `input` to `root`, out of place and in place: the root's result
/// must match `want`, and an in-place buffer on any other rank must be left
/// as it was.
pub fn check_reduce<T: Element>(
    comm: &Communicator,
    input: &[T],
    op: ReduceOp,
    root: usize,
    want: impl Fn(usize) -> f64 + Copy,
    tol: impl Fn(f64) -> f64 + Copy,
    what: &dyn Fn(&str) -> String,
) {
    let rank = comm.rank();
    let mut out = if rank == root {
        vec![T::from_f64(-99.0); input.len()]
    } else {
        Vec::new()
    };
    comm.reduce(input, &mut out, op, root).unwrap();
    if rank == root {
        check(&what("reduce"), &out, want, tol);
    }
    let mut buf = input.to_vec();
    comm.reduce_in_place(&mut buf, op, root).unwrap();
    if rank == root {
        check(&what("reduce_in_place"), &buf, want, tol);
    } else {
        assert!(
            buf == input,
            "{}: a non-root buffer changed",
            what("reduce_in_place")
        );
    }
}

/// A small deterministic generator (splitmix64), so that a failing case can
/// be replayed from the printed seed.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
