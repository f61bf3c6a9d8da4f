//! The kernels compiled per SIMD level (`wide`) and the dispatch that runs
//! the one for the level in use (`at_level!`).
//!
//! Only this file enters functions built for CPU features (the `unsafe`
//! calls in `at_level!`), and only at a level the CPU has
//! (`SimdLevel::detected`). The generic
//! dispatch functions are `#[inline]` so that each type's `Element` method
//! (in `impls`, which may land in another codegen unit) compiles them in,
//! as the compiler did when both were one module; the half ones it kept as
//! calls then, and still does.

use super::arith::{native_reduce_into, native_reduce_to, Arith};
use super::half::{half_reduce_into, half_reduce_to};
use super::simd::SimdLevel;
#[cfg(target_arch = "x86_64")]
use super::stream::stream_kernel;
use crate::element::ReduceOp;
use half::{bf16, f16};

/// The kernels compiled for wider vectors than the target's baseline, one
/// set per `SimdLevel` above it: each is the generic kernel (inlined into a
/// function built with the level's features), so every level computes the
/// same elementwise operations and gives the same bits.
#[cfg(target_arch = "x86_64")]
mod wide {
    use super::{Arith, ReduceOp};
    use half::{bf16, f16};

    macro_rules! kernels {
        (
            $features:literal,
            $into:ident,
            $to:ident,
            $bf16_into:ident,
            $bf16_to:ident,
            $bf16_simd_into:ident,
            $bf16_simd_to:ident,
            $f16_into:ident,
            $f16_to:ident,
            $f16_simd_into:ident,
            $f16_simd_to:ident,
            $streams:ident,
            $line:path
        ) => {
            #[target_feature(enable = $features)]
            pub(super) fn $streams<T: Arith + bytemuck::Pod>(
                op: ReduceOp,
                ins: &[&[T]],
                outs: &mut [&mut [T]],
            ) {
                super::stream_kernel(op, ins, outs, |d, l| $line(d, l))
            }
            #[target_feature(enable = $features)]
            pub(super) fn $into<T: Arith>(op: ReduceOp, dst: &mut [T], src: &[T]) {
                super::native_reduce_into(op, dst, src)
            }
            #[target_feature(enable = $features)]
            pub(super) fn $to<T: Arith>(op: ReduceOp, out: &mut [T], a: &[T], b: &[T]) {
                super::native_reduce_to(op, out, a, b)
            }
            half_kernels!(
                $features,
                bf16,
                $bf16_into,
                $bf16_to,
                $bf16_simd_into,
                $bf16_simd_to
            );
            half_kernels!(
                $features,
                f16,
                $f16_into,
                $f16_to,
                $f16_simd_into,
                $f16_simd_to
            );
        };
    }

    /// A half type's kernels at one level: whole steps in registers
    /// (`half::regs`), the tail (less than one step) through f32
    /// blocks.
    macro_rules! half_kernels {
        ($features:literal, $h:ty, $into:ident, $to:ident, $simd_into:ident, $simd_to:ident) => {
            #[target_feature(enable = $features)]
            pub(super) fn $into(op: ReduceOp, dst: &mut [$h], src: &[$h]) {
                let done = crate::reduce::half::regs::$simd_into(op, dst, src);
                super::half_reduce_into(op, &mut dst[done..], &src[done..])
            }
            #[target_feature(enable = $features)]
            pub(super) fn $to(op: ReduceOp, out: &mut [$h], a: &[$h], b: &[$h]) {
                let done = crate::reduce::half::regs::$simd_to(op, out, a, b);
                super::half_reduce_to(op, &mut out[done..], &a[done..], &b[done..])
            }
        };
    }

    kernels!(
        "avx2,fma,f16c",
        avx2_into,
        avx2_to,
        avx2_bf16_into,
        avx2_bf16_to,
        avx2_bf16_into,
        avx2_bf16_to,
        avx2_f16_into,
        avx2_f16_to,
        avx2_f16_into,
        avx2_f16_to,
        avx2_streams,
        crate::reduce::nt::line::avx2
    );
    kernels!(
        "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c",
        avx512_into,
        avx512_to,
        avx512_bf16_into,
        avx512_bf16_to,
        avx512_bf16_into,
        avx512_bf16_to,
        // f16 at the AVX-512 level takes the 8-lane F16C steps: the 16-lane
        // AVX-512 conversions were no faster here (15-19 against 21-25 GB/s
        // for a 4 KiB f16 sum in two rounds of reduce-bench).
        avx512_f16_into,
        avx512_f16_to,
        avx2_f16_into,
        avx2_f16_to,
        avx512_streams,
        crate::reduce::nt::line::avx512
    );
}

/// Run `$base` or its `wide` counterpart for `$level` (capped at what the
/// CPU has).
macro_rules! at_level {
    ($level:expr, $base:ident, $avx2:ident, $avx512:ident, ($($arg:expr),*)) => {{
        #[cfg(target_arch = "x86_64")]
        match $level.min(SimdLevel::detected()) {
            // SAFETY: calling a function compiled for CPU features requires
            // that the CPU has them: the level is capped at the detected
            // one, which `is_x86_feature_detected!` found for every feature
            // the `wide` kernels of that level enable.
            SimdLevel::Avx512 => return unsafe { wide::$avx512($($arg),*) },
            // SAFETY: as above, for the AVX2 features.
            SimdLevel::Avx2 => return unsafe { wide::$avx2($($arg),*) },
            SimdLevel::Baseline => {}
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = $level;
        $base($($arg),*)
    }};
}

#[inline]
pub(super) fn reduce_into_at<T: Arith>(level: SimdLevel, op: ReduceOp, dst: &mut [T], src: &[T]) {
    at_level!(
        level,
        native_reduce_into,
        avx2_into,
        avx512_into,
        (op, dst, src)
    )
}

#[inline]
pub(super) fn reduce_to_at<T: Arith>(
    level: SimdLevel,
    op: ReduceOp,
    out: &mut [T],
    a: &[T],
    b: &[T],
) {
    at_level!(level, native_reduce_to, avx2_to, avx512_to, (op, out, a, b))
}

pub(super) fn bf16_reduce_into_at(level: SimdLevel, op: ReduceOp, dst: &mut [bf16], src: &[bf16]) {
    at_level!(
        level,
        half_reduce_into,
        avx2_bf16_into,
        avx512_bf16_into,
        (op, dst, src)
    )
}

pub(super) fn bf16_reduce_to_at(
    level: SimdLevel,
    op: ReduceOp,
    out: &mut [bf16],
    a: &[bf16],
    b: &[bf16],
) {
    at_level!(
        level,
        half_reduce_to,
        avx2_bf16_to,
        avx512_bf16_to,
        (op, out, a, b)
    )
}

pub(super) fn f16_reduce_into_at(level: SimdLevel, op: ReduceOp, dst: &mut [f16], src: &[f16]) {
    at_level!(
        level,
        half_reduce_into,
        avx2_f16_into,
        avx512_f16_into,
        (op, dst, src)
    )
}

pub(super) fn f16_reduce_to_at(
    level: SimdLevel,
    op: ReduceOp,
    out: &mut [f16],
    a: &[f16],
    b: &[f16],
) {
    at_level!(
        level,
        half_reduce_to,
        avx2_f16_to,
        avx512_f16_to,
        (op, out, a, b)
    )
}

/// `stream_kernel` at `level` (capped at the CPU's), then the store fence.
/// False (nothing written) where it cannot run: not x86-64, lengths that
/// differ, or outputs that lie differently against 64-byte boundaries.
#[inline]
pub(super) fn reduce_to_streams_at<T: Arith + bytemuck::Pod>(
    level: SimdLevel,
    op: ReduceOp,
    ins: &[&[T]],
    outs: &mut [&mut [T]],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let Some(n) = outs.first().map(|o| o.len()) else {
            return false;
        };
        let phase = |p: *const T| p as usize % crate::reduce::nt::LINE;
        let first = phase(outs[0].as_ptr());
        if ins.is_empty()
            || ins.iter().any(|x| x.len() != n)
            || outs
                .iter()
                .any(|o| o.len() != n || phase(o.as_ptr()) != first)
        {
            return false;
        }
        let base = |op, ins: &[&[T]], outs: &mut [&mut [T]]| {
            stream_kernel(op, ins, outs, crate::reduce::nt::line::sse2)
        };
        let run = |level: SimdLevel, op, ins, outs| {
            at_level!(level, base, avx2_streams, avx512_streams, (op, ins, outs))
        };
        run(level, op, ins, outs);
        crate::reduce::nt::line::fence();
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, op, ins, outs);
        false
    }
}
