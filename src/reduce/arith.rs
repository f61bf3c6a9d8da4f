//! The arithmetic of one pair of elements (`Arith`) and the generic
//! elementwise loops over it, which every level's kernels compile.
//!
//! The lowest layer of the kernels: it knows only `ReduceOp`, no SIMD
//! level, no half type and no store mode.
//!
//! # Min and Max of floats
//!
//! IEEE 754-2019 `minimum` and `maximum` (as torch.minimum and
//! torch.maximum), with one NaN:
//!
//! - if either operand is NaN the result is the type's canonical NaN
//!   (`F32_NAN`, `F64_NAN`; f16 and bf16 combine in f32 and narrow it to
//!   0x7e00 and 0x7fc0): positive, quiet, no payload, whatever the sign and
//!   payload of the NaN operands. Which rank's NaN survives, and in which
//!   order a collective combined the ranks, therefore cannot show in the
//!   result: every rank, run, algorithm and SIMD level gives the same bits.
//! - -0 is below +0: min(-0, +0) = -0 and max(-0, +0) = +0 in either order.
//!
//! Both are pure selects and bit operations, no arithmetic, so Rust's
//! freedom over the NaN an arithmetic operation returns does not enter,
//! and the order of the operands does not matter: a collective that
//! combines the ranks in any order gives the same bits. The plain
//! compare-select `if o < self { o } else { self }` (one `minps`) returns
//! its second operand when the two are unordered or equal, so a NaN was
//! kept on one side only (a NaN on the last rank was dropped) and
//! min(+0, -0) depended on the order. Here each op is the compare-select
//! both ways, combined (OR for min: equal operands differ only as -0 and
//! +0, and their OR is -0; AND for max, +0), then the canonical NaN
//! blended in under an unordered compare: `minps`, `minps`, `orps`,
//! `cmpunordps`, `blendvps` (and-andnot-or for the blend at SSE2), for
//! kernels bound by memory (docs/performance-history.md, "NaN in Min and
//! Max").

use crate::element::ReduceOp;

/// Elementwise combination of one pair, generic over the arithmetic of the
/// type; the kernels below are one loop each over this, so the compiler sees
/// a straight-line body it can vectorise.
pub(super) trait Arith: Copy {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
}

/// The canonical f32 NaN Min and Max give (module docs): quiet, positive,
/// no payload.
pub(super) const F32_NAN: f32 = f32::from_bits(0x7fc0_0000);
/// The canonical f64 NaN Min and Max give.
pub(super) const F64_NAN: f64 = f64::from_bits(0x7ff8_0000_0000_0000);

macro_rules! float_arith {
    ($t:ty, $nan:expr) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                // Not f32::min (NaN-ignoring) nor f32::minimum (unstable):
                // see the module docs. Each compare-select is one minps;
                // they differ only where the operands are equal (-0, +0:
                // the OR is -0) or unordered (replaced by the NaN).
                let x = if o < self { o } else { self };
                let y = if self < o { self } else { o };
                let r = <$t>::from_bits(x.to_bits() | y.to_bits());
                if self.is_nan() || o.is_nan() {
                    $nan
                } else {
                    r
                }
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                // As `min`, with maxps; the AND of -0 and +0 is +0.
                let x = if o > self { o } else { self };
                let y = if self > o { self } else { o };
                let r = <$t>::from_bits(x.to_bits() & y.to_bits());
                if self.is_nan() || o.is_nan() {
                    $nan
                } else {
                    r
                }
            }
        }
    };
}

macro_rules! int_arith {
    ($t:ty) => {
        impl Arith for $t {
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                Ord::max(self, o)
            }
        }
    };
}

float_arith!(f32, F32_NAN);
float_arith!(f64, F64_NAN);
int_arith!(i8);
int_arith!(u8);
int_arith!(i32);
int_arith!(u32);
int_arith!(i64);
int_arith!(u64);

#[inline(always)]
fn zip_into<T: Arith>(dst: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f(*d, *s);
    }
}

#[inline(always)]
fn zip_to<T: Arith>(out: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = f(*x, *y);
    }
}

#[inline(always)]
pub(super) fn native_reduce_into<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    debug_assert_eq!(dst.len(), src.len());
    match op {
        ReduceOp::Sum | ReduceOp::Avg => zip_into(dst, src, T::add),
        ReduceOp::Prod => zip_into(dst, src, T::mul),
        ReduceOp::Min => zip_into(dst, src, T::min),
        ReduceOp::Max => zip_into(dst, src, T::max),
    }
}

#[inline(always)]
pub(super) fn native_reduce_to<T: Arith>(op: ReduceOp, out: &mut [T], a: &[T], b: &[T]) {
    debug_assert!(out.len() == a.len() && a.len() == b.len());
    match op {
        ReduceOp::Sum | ReduceOp::Avg => zip_to(out, a, b, T::add),
        ReduceOp::Prod => zip_to(out, a, b, T::mul),
        ReduceOp::Min => zip_to(out, a, b, T::min),
        ReduceOp::Max => zip_to(out, a, b, T::max),
    }
}
