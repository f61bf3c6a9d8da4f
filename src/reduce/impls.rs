//! `Element` for the ten types: each type's entry in the dispatch table
//! the sealed trait declares (`crate::element`), pointing at its kernels.

use super::arith::{native_reduce_into, native_reduce_to};
use super::half::{HalfSlices, HALF_BLOCK};
use super::kernels::{
    bf16_reduce_into_at, bf16_reduce_to_at, f16_reduce_into_at, f16_reduce_to_at, reduce_into_at,
    reduce_to_at, reduce_to_streams_at,
};
use super::simd::SimdLevel;
use crate::element::{sealed, DataType, Element, ReduceOp};
use half::{bf16, f16};

/// Inputs shorter than this many bytes (less than one AVX2 vector) are
/// reduced by the baseline kernel, inlined, without the dispatch to the
/// level's: a wider kernel would only run its scalar tail on them, and
/// the dispatch was about half of an 8-byte call's reduction (every
/// level gives the same bits: `kernels`).
const SHORT_BYTES: usize = 32;

#[inline(always)]
fn short<T>(len: usize) -> bool {
    len * std::mem::size_of::<T>() < SHORT_BYTES
}

macro_rules! native_element {
    ($t:ty, $dt:expr, float) => {
        native_element!(@impl $t, $dt, |buf: &mut [$t], n: usize| {
            let n = n as $t;
            for v in buf.iter_mut() {
                *v /= n;
            }
        });
    };
    ($t:ty, $dt:expr, int) => {
        // Integer Avg truncates toward zero, as NCCL's does. It travels as
        // Sum, so `buf` holds the sum wrapped in the type: this divides
        // the wrapped sum (`ReduceOp::Avg`). The rank count may not fit
        // the type (256 ranks of u8): divide in i128.
        native_element!(@impl $t, $dt, |buf: &mut [$t], n: usize| {
            let n = n as i128;
            for v in buf.iter_mut() {
                *v = (*v as i128 / n) as $t;
            }
        });
    };
    (@impl $t:ty, $dt:expr, $div:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = $dt;
            fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                if short::<$t>(dst.len()) {
                    return native_reduce_into(op, dst, src);
                }
                reduce_into_at(SimdLevel::current(), op, dst, src)
            }
            fn reduce_to(op: ReduceOp, out: &mut [Self], a: &[Self], b: &[Self]) {
                if short::<$t>(out.len()) {
                    return native_reduce_to(op, out, a, b);
                }
                reduce_to_at(SimdLevel::current(), op, out, a, b)
            }
            fn reduce_to_streams(
                op: ReduceOp,
                ins: &[&[Self]],
                outs: &mut [&mut [Self]],
            ) -> bool {
                reduce_to_streams_at(SimdLevel::current(), op, ins, outs)
            }
            fn divide(buf: &mut [Self], n: usize) {
                let div = $div;
                div(buf, n)
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}

native_element!(f32, DataType::F32, float);
native_element!(f64, DataType::F64, float);
native_element!(i8, DataType::I8, int);
native_element!(u8, DataType::U8, int);
native_element!(i32, DataType::I32, int);
native_element!(u32, DataType::U32, int);
native_element!(i64, DataType::I64, int);
native_element!(u64, DataType::U64, int);

macro_rules! half_element {
    ($t:ty, $dt:expr, $into_at:ident, $to_at:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DataType = $dt;
            fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]) {
                $into_at(SimdLevel::current(), op, dst, src)
            }
            fn reduce_to(op: ReduceOp, out: &mut [Self], x: &[Self], y: &[Self]) {
                $to_at(SimdLevel::current(), op, out, x, y)
            }
            fn divide(buf: &mut [Self], n: usize) {
                let n = n as f32;
                let mut a = [0f32; HALF_BLOCK];
                for d in buf.chunks_mut(HALF_BLOCK) {
                    let len = d.len();
                    <$t as HalfSlices>::widen(d, &mut a[..len]);
                    for v in &mut a[..len] {
                        *v /= n;
                    }
                    <$t as HalfSlices>::narrow(&a[..len], d);
                }
            }
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
        }
    };
}

half_element!(f16, DataType::F16, f16_reduce_into_at, f16_reduce_to_at);
half_element!(bf16, DataType::Bf16, bf16_reduce_into_at, bf16_reduce_to_at);
