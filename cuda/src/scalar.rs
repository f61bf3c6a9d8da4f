//! The stand-in's kernels: one element at a time, with ferroccl's host
//! semantics (wrapping integers; f16 and bf16 combined in f32 and rounded
//! once per combination; Min and Max IEEE 754-2019 `minimum`/`maximum`
//! with the canonical NaN; Avg combined as Sum and divided once).
//!
//! `crate::host_engine::HostEngine` runs them for its kernels (copy,
//! reduce, divide) so that the stand-in agrees with the host reduce to the
//! bit.

use crate::{DataType, ReduceOp};
use half::{bf16, f16};

/// The canonical NaNs Min and Max give.
const F32_NAN: f32 = f32::from_bits(0x7fc0_0000);
const F64_NAN: f64 = f64::from_bits(0x7ff8_0000_0000_0000);

macro_rules! float_minmax {
    ($min:ident, $max:ident, $t:ty, $nan:expr) => {
        fn $min(x: $t, y: $t) -> $t {
            if x.is_nan() || y.is_nan() {
                $nan
            } else if x == y {
                // -0 and +0: the one with the sign bit.
                <$t>::from_bits(x.to_bits() | y.to_bits())
            } else if x < y {
                x
            } else {
                y
            }
        }
        fn $max(x: $t, y: $t) -> $t {
            if x.is_nan() || y.is_nan() {
                $nan
            } else if x == y {
                <$t>::from_bits(x.to_bits() & y.to_bits())
            } else if x > y {
                x
            } else {
                y
            }
        }
    };
}
float_minmax!(min32, max32, f32, F32_NAN);
float_minmax!(min64, max64, f64, F64_NAN);

fn f32_op(op: ReduceOp, x: f32, y: f32) -> f32 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => x + y,
        ReduceOp::Prod => x * y,
        ReduceOp::Min => min32(x, y),
        ReduceOp::Max => max32(x, y),
    }
}

fn f64_op(op: ReduceOp, x: f64, y: f64) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => x + y,
        ReduceOp::Prod => x * y,
        ReduceOp::Min => min64(x, y),
        ReduceOp::Max => max64(x, y),
    }
}

macro_rules! int_op {
    ($op:expr, $x:expr, $y:expr) => {
        match $op {
            ReduceOp::Sum | ReduceOp::Avg => $x.wrapping_add($y),
            ReduceOp::Prod => $x.wrapping_mul($y),
            ReduceOp::Min => Ord::min($x, $y),
            ReduceOp::Max => Ord::max($x, $y),
        }
    };
}

/// Apply `f` to each element triple of `out`, `a`, `b` (native byte
/// order, `N` bytes each).
fn each<const N: usize>(
    out: &mut [u8],
    a: &[u8],
    b: &[u8],
    f: impl Fn([u8; N], [u8; N]) -> [u8; N],
) {
    for ((o, x), y) in out
        .chunks_exact_mut(N)
        .zip(a.chunks_exact(N))
        .zip(b.chunks_exact(N))
    {
        let x: [u8; N] = x.try_into().expect("chunk of N");
        let y: [u8; N] = y.try_into().expect("chunk of N");
        o.copy_from_slice(&f(x, y));
    }
}

/// `out = a op b` over elements of `ty` (all three of one length).
pub fn reduce(op: ReduceOp, ty: DataType, out: &mut [u8], a: &[u8], b: &[u8]) {
    macro_rules! int {
        ($t:ty, $n:literal) => {
            each::<$n>(out, a, b, |x, y| {
                let (x, y) = (<$t>::from_ne_bytes(x), <$t>::from_ne_bytes(y));
                int_op!(op, x, y).to_ne_bytes()
            })
        };
    }
    match ty {
        DataType::F32 => each::<4>(out, a, b, |x, y| {
            f32_op(op, f32::from_ne_bytes(x), f32::from_ne_bytes(y)).to_ne_bytes()
        }),
        DataType::F64 => each::<8>(out, a, b, |x, y| {
            f64_op(op, f64::from_ne_bytes(x), f64::from_ne_bytes(y)).to_ne_bytes()
        }),
        DataType::F16 => each::<2>(out, a, b, |x, y| {
            let (x, y) = (f16::from_ne_bytes(x), f16::from_ne_bytes(y));
            f16::from_f32(f32_op(op, x.to_f32(), y.to_f32())).to_ne_bytes()
        }),
        DataType::Bf16 => each::<2>(out, a, b, |x, y| {
            let (x, y) = (bf16::from_ne_bytes(x), bf16::from_ne_bytes(y));
            bf16::from_f32(f32_op(op, x.to_f32(), y.to_f32())).to_ne_bytes()
        }),
        DataType::I8 => int!(i8, 1),
        DataType::U8 => int!(u8, 1),
        DataType::I32 => int!(i32, 4),
        DataType::U32 => int!(u32, 4),
        DataType::I64 => int!(i64, 8),
        DataType::U64 => int!(u64, 8),
    }
}

/// Avg's end: divide each element of `ty` in `buf` by `ranks`.
pub fn divide(ty: DataType, buf: &mut [u8], ranks: usize) {
    macro_rules! int {
        ($t:ty, $n:literal) => {
            for c in buf.chunks_exact_mut($n) {
                let v = <$t>::from_ne_bytes(c.try_into().expect("chunk of N"));
                // The rank count may not fit the type: divide in i128.
                let q = (v as i128 / ranks as i128) as $t;
                c.copy_from_slice(&q.to_ne_bytes());
            }
        };
    }
    macro_rules! float {
        ($t:ty, $n:literal, $div:expr) => {
            for c in buf.chunks_exact_mut($n) {
                let v = <$t>::from_ne_bytes(c.try_into().expect("chunk of N"));
                let q: $t = ($div)(v);
                c.copy_from_slice(&q.to_ne_bytes());
            }
        };
    }
    let n = ranks;
    match ty {
        DataType::F32 => float!(f32, 4, |v: f32| v / n as f32),
        DataType::F64 => float!(f64, 8, |v: f64| v / n as f64),
        DataType::F16 => float!(f16, 2, |v: f16| f16::from_f32(v.to_f32() / n as f32)),
        DataType::Bf16 => float!(bf16, 2, |v: bf16| bf16::from_f32(v.to_f32() / n as f32)),
        DataType::I8 => int!(i8, 1),
        DataType::U8 => int!(u8, 1),
        DataType::I32 => int!(i32, 4),
        DataType::U32 => int!(u32, 4),
        DataType::I64 => int!(i64, 8),
        DataType::U64 => int!(u64, 8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DataType, ReduceOp};

    #[test]
    fn scalar_semantics() {
        use half::{bf16, f16};
        let mut out = [0u8; 1];
        reduce(ReduceOp::Sum, DataType::U8, &mut out, &[200], &[100]);
        assert_eq!(out, [44]);
        let mut b = [44u8];
        divide(DataType::U8, &mut b, 2);
        assert_eq!(b, [22]);
        let mut i = (-3i8).to_ne_bytes();
        divide(DataType::I8, &mut i, 2);
        assert_eq!(i8::from_ne_bytes(i), -1);
        let nan = f32::from_bits(0xffc0_0001).to_ne_bytes();
        let mut o = [0u8; 4];
        reduce(
            ReduceOp::Min,
            DataType::F32,
            &mut o,
            &nan,
            &1f32.to_ne_bytes(),
        );
        assert_eq!(u32::from_ne_bytes(o), 0x7fc0_0000);
        reduce(
            ReduceOp::Max,
            DataType::F32,
            &mut o,
            &(-0f32).to_ne_bytes(),
            &0f32.to_ne_bytes(),
        );
        assert_eq!(u32::from_ne_bytes(o), 0);
        reduce(
            ReduceOp::Min,
            DataType::F32,
            &mut o,
            &0f32.to_ne_bytes(),
            &(-0f32).to_ne_bytes(),
        );
        assert_eq!(u32::from_ne_bytes(o), 0x8000_0000);
        let mut h = [0u8; 2];
        let x = f16::from_f32(1.0).to_ne_bytes();
        let y = f16::from_f32(f32::NAN).to_ne_bytes();
        reduce(ReduceOp::Max, DataType::F16, &mut h, &x, &y);
        assert_eq!(u16::from_ne_bytes(h), 0x7e00);
        let x = bf16::from_f32(-1.0).to_ne_bytes();
        let y = bf16::from_f32(f32::NAN).to_ne_bytes();
        reduce(ReduceOp::Min, DataType::Bf16, &mut h, &x, &y);
        assert_eq!(u16::from_ne_bytes(h), 0x7fc0);
    }
}
