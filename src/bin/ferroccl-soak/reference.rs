//! The inputs of every call and the reference its results are checked
//! against: functions of (seed, call, rank, element), computed in f64 (or
//! i128 for integers) with `half` and `as`, never with the library's own
//! conversions or reductions, so that a bug there cannot hide itself.

use crate::random::hash;
use crate::sequence::Call;
use ferroccl::{DataType, ReduceOp};
use half::{bf16, f16};

pub(crate) fn is_float(dt: DataType) -> bool {
    matches!(
        dt,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
    )
}

/// The integers every value of `dt` in this soak lies in: exact in the type
/// and in f64.
pub(crate) fn int_range(dt: DataType) -> (i128, i128) {
    match dt {
        DataType::I8 => (-128, 127),
        DataType::U8 => (0, 255),
        DataType::I32 => (i128::from(i32::MIN), i128::from(i32::MAX)),
        DataType::U32 => (0, i128::from(u32::MAX)),
        DataType::I64 | DataType::F64 => (-(1 << 53), 1 << 53),
        DataType::U64 => (0, 1 << 53),
        DataType::F32 => (-(1 << 24), 1 << 24),
        DataType::F16 => (-2048, 2048),
        DataType::Bf16 => (-256, 256),
    }
}

/// `v` rounded to `dt` (done here with `half` and `as`, not with the
/// library's conversions).
fn quantize(dt: DataType, v: f64) -> f64 {
    match dt {
        DataType::F64 => v,
        DataType::F32 => f64::from(v as f32),
        DataType::F16 => f16::from_f64(v).to_f64(),
        DataType::Bf16 => bf16::from_f64(v).to_f64(),
        _ => v.trunc(),
    }
}

/// Unit roundoff of one step of a reduction in `dt`: f16 and bf16 combine
/// in f32 and round back, so both roundings count.
fn unit_roundoff(dt: DataType) -> f64 {
    match dt {
        DataType::F64 => 2f64.powi(-53),
        DataType::F32 => 2f64.powi(-24),
        DataType::F16 => 2f64.powi(-11) + 2f64.powi(-24),
        DataType::Bf16 => 2f64.powi(-8) + 2f64.powi(-24),
        _ => 0.0,
    }
}

/// Uniform integer in `lo..=hi` from `h`.
fn in_range(h: u64, lo: i128, hi: i128) -> i128 {
    lo + (i128::from(h) % (hi - lo + 1))
}

/// Uniform in [-1, 1) with a full 53-bit mantissa.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Element `i` of the data rank `r` moves (gather, broadcast, send,
/// all-to-all): anything the type holds exactly.
pub(crate) fn moved(c: &Call, r: usize, i: usize) -> f64 {
    let h = hash(&[c.salt, 1, r as u64, i as u64]);
    if is_float(c.dtype) {
        quantize(c.dtype, unit(h) * 1000.0)
    } else {
        let (lo, hi) = int_range(c.dtype);
        in_range(h, lo, hi) as f64
    }
}

/// What a receive buffer holds before the call: anything the type holds,
/// unlikely to equal the result.
pub(crate) fn garbage(c: &Call, i: usize) -> f64 {
    let h = hash(&[c.salt, 2, i as u64]);
    if is_float(c.dtype) {
        quantize(c.dtype, unit(h) * 777.0)
    } else {
        let (lo, hi) = int_range(c.dtype);
        in_range(h, lo, hi) as f64
    }
}

/// Integer input of rank `r` of `n` at element `i` of a reducing call:
/// bounded so that every partial and final result of the op is exact in
/// the type (sums: each rank within 1/n of the type's exact range; products:
/// at most two factors other than 1, of magnitude at most 3 and 2).
pub(crate) fn int_input(c: &Call, n: usize, r: usize, i: usize) -> i128 {
    let signed = int_range(c.dtype).0 < 0;
    if c.op == ReduceOp::Prod {
        let h = hash(&[c.salt, 3, i as u64]);
        let a = (h % n as u64) as usize;
        let b = ((h >> 16) % n as u64) as usize;
        let fa: &[i128] = if signed {
            &[2, 3, -1, -2, 0]
        } else {
            &[2, 3, 0]
        };
        let fb: &[i128] = if signed { &[2, -1, 1] } else { &[2, 1] };
        if r == a {
            return fa[((h >> 32) % fa.len() as u64) as usize];
        }
        if r == b {
            return fb[((h >> 40) % fb.len() as u64) as usize];
        }
        return 1;
    }
    let (lo, hi) = int_range(c.dtype);
    let (lo, hi) = match c.op {
        ReduceOp::Sum | ReduceOp::Avg => (lo / n as i128, hi / n as i128),
        _ => (lo, hi),
    };
    // Small values most of the time, the whole range sometimes.
    let cap = match c.salt % 3 {
        0 => 4,
        1 => 100,
        _ => i128::MAX,
    };
    in_range(
        hash(&[c.salt, 4, r as u64, i as u64]),
        lo.max(-cap),
        hi.min(cap),
    )
}

/// Fractional float input of rank `r` at element `i` (already in the type).
fn frac_input(c: &Call, r: usize, i: usize) -> f64 {
    quantize(c.dtype, unit(hash(&[c.salt, 5, r as u64, i as u64])))
}

/// Input of rank `r` of `n` at element `i` of a reducing call.
pub(crate) fn input(c: &Call, n: usize, r: usize, i: usize) -> f64 {
    if c.frac {
        frac_input(c, r, i)
    } else {
        int_input(c, n, r, i) as f64
    }
}

/// The reference result at element `i` of a reducing call over `n` ranks
/// and the allowed |got - want|.
pub(crate) fn reference(c: &Call, n: usize, i: usize) -> (f64, f64) {
    if c.frac {
        let vals: Vec<f64> = (0..n).map(|r| frac_input(c, r, i)).collect();
        let sum: f64 = vals.iter().sum();
        let abs: f64 = vals.iter().map(|v| v.abs()).sum();
        return match c.op {
            ReduceOp::Min => (vals.iter().copied().fold(f64::INFINITY, f64::min), 0.0),
            ReduceOp::Max => (vals.iter().copied().fold(f64::NEG_INFINITY, f64::max), 0.0),
            ReduceOp::Avg => {
                let want = sum / n as f64;
                (want, tolerance_frac(c.dtype, n, abs, want, true))
            }
            _ => (sum, tolerance_frac(c.dtype, n, abs, sum, false)),
        };
    }
    let vals = (0..n).map(|r| int_input(c, n, r, i));
    let exact: i128 = match c.op {
        ReduceOp::Sum | ReduceOp::Avg => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Min => vals.min().unwrap_or(0),
        ReduceOp::Max => vals.max().unwrap_or(0),
    };
    if c.op != ReduceOp::Avg {
        return (exact as f64, 0.0);
    }
    if !is_float(c.dtype) {
        // Integer Avg truncates toward zero (as i128 division does).
        return ((exact / n as i128) as f64, 0.0);
    }
    // The sum is exact; the one division rounds once (twice for f16/bf16:
    // to f32, then to the type).
    let want = exact as f64 / n as f64;
    (want, 1.01 * unit_roundoff(c.dtype) * want.abs())
}

/// Allowed error of a fractional Sum or Avg of `n` terms whose magnitudes
/// add up to `abs`. Any summation order (ring, tree, one-shot: each a tree
/// of n-1 additions of height at most n-1) computes the sum within
/// γ(n-1)·Σ|x| ≤ 1.01·(n-1)·u·Σ|x| (Higham, Accuracy and Stability of
/// Numerical Algorithms, §4.2); Avg divides that error by n and rounds once
/// more (u·|result|). The f64 reference itself may be off by (n-1)·2⁻⁵³·Σ|x|.
fn tolerance_frac(dt: DataType, n: usize, abs: f64, want: f64, avg: bool) -> f64 {
    let u = unit_roundoff(dt);
    let steps = n.saturating_sub(1) as f64;
    let reference_error = steps * 2f64.powi(-53) * abs;
    let sum_error = 1.01 * steps * u * abs;
    if avg {
        (sum_error / n as f64 + 1.01 * u * (want.abs() + sum_error)) + reference_error
    } else {
        sum_error + reference_error
    }
}
