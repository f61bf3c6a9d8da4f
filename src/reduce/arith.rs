//! The arithmetic of one pair of elements (`Arith`) and the generic
//! elementwise loops over it, which every level's kernels compile.
//!
//! The lowest layer of the kernels: it knows only `ReduceOp`, no SIMD
//! level, no half type and no store mode.

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

macro_rules! float_arith {
    ($t:ty) => {
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
                // Not f32::min: that one is NaN-ignoring and branches; the
                // compare-select form maps to minps/maxps.
                if o < self {
                    o
                } else {
                    self
                }
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                if o > self {
                    o
                } else {
                    self
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

float_arith!(f32);
float_arith!(f64);
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
