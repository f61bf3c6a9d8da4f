//! Half-precision (f16, bf16) kernels: through f32 blocks at the baseline
//! (the slice conversions here), in registers above it (`regs`).
//!
//! Which of them runs is not decided here: `kernels` picks by SIMD level.

use super::arith::native_reduce_into;
use crate::element::ReduceOp;
use half::{bf16, f16};

/// Half-precision types reduce through f32: each block is widened to f32,
/// combined with the f32 kernel and rounded once, in blocks that stay in L1.
/// The conversions are slice-at-a-time so that they vectorise: f16 through
/// `half`'s slice conversions (F16C when the CPU has it, detected at run
/// time), bf16 through the bit manipulations below.
pub(super) const HALF_BLOCK: usize = 1024;

/// Slice conversions between a half type and f32.
pub(super) trait HalfSlices: Sized {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
    /// `narrow` of values that are exactly of the half type, as every
    /// result of min and max is (an operand, -0 or the canonical NaN):
    /// where the type allows, without the rounding.
    #[inline(always)]
    fn narrow_exact(src: &[f32], dst: &mut [Self]) {
        Self::narrow(src, dst)
    }
}

impl HalfSlices for f16 {
    #[inline(always)]
    fn widen(src: &[Self], dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
}

impl HalfSlices for bf16 {
    #[inline(always)]
    fn widen(src: &[Self], dst: &mut [f32]) {
        // A bf16 is the top half of an f32: widening is exact.
        for (o, v) in dst.iter_mut().zip(src) {
            *o = f32::from_bits(u32::from(v.to_bits()) << 16);
        }
    }
    #[inline(always)]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        for (o, v) in dst.iter_mut().zip(src) {
            *o = bf16::from_bits(f32_to_bf16_bits(*v));
        }
    }
    #[inline(always)]
    fn narrow_exact(src: &[f32], dst: &mut [Self]) {
        // The low halves are zero: the top halves are the rounded values
        // (0x7fc0 for the canonical NaN, as `f32_to_bf16_bits` gives).
        for (o, v) in dst.iter_mut().zip(src) {
            *o = bf16::from_bits((v.to_bits() >> 16) as u16);
        }
    }
}

/// Round an f32 to the nearest bf16 (ties to even), keeping NaNs NaN; the
/// select form (no early return) lets the loop above vectorise.
#[inline(always)]
fn f32_to_bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    let quiet_nan = (x >> 16) | 0x0040;
    // Select on u32 and narrow once (see `f32_to_f16_bits`).
    (if (x & 0x7fff_ffff) > 0x7f80_0000 {
        quiet_nan
    } else {
        rounded
    }) as u16
}

/// Narrow the results of `op` (`HalfSlices::narrow_exact` for min and max).
#[inline(always)]
fn narrow_results<H: HalfSlices>(op: ReduceOp, src: &[f32], dst: &mut [H]) {
    if matches!(op, ReduceOp::Min | ReduceOp::Max) {
        H::narrow_exact(src, dst)
    } else {
        H::narrow(src, dst)
    }
}

/// `dst = dst op src` for a half type, through f32 blocks.
#[inline(always)]
pub(super) fn half_reduce_into<H: HalfSlices + Copy>(op: ReduceOp, dst: &mut [H], src: &[H]) {
    let mut a = [0f32; HALF_BLOCK];
    let mut b = [0f32; HALF_BLOCK];
    for (d, s) in dst.chunks_mut(HALF_BLOCK).zip(src.chunks(HALF_BLOCK)) {
        let n = d.len();
        H::widen(d, &mut a[..n]);
        H::widen(s, &mut b[..n]);
        native_reduce_into(op, &mut a[..n], &b[..n]);
        narrow_results(op, &a[..n], d);
    }
}

/// `out = x op y` for a half type, through f32 blocks.
#[inline(always)]
pub(super) fn half_reduce_to<H: HalfSlices + Copy>(op: ReduceOp, out: &mut [H], x: &[H], y: &[H]) {
    let mut a = [0f32; HALF_BLOCK];
    let mut b = [0f32; HALF_BLOCK];
    for ((o, x), y) in out
        .chunks_mut(HALF_BLOCK)
        .zip(x.chunks(HALF_BLOCK))
        .zip(y.chunks(HALF_BLOCK))
    {
        let n = o.len();
        H::widen(x, &mut a[..n]);
        H::widen(y, &mut b[..n]);
        native_reduce_into(op, &mut a[..n], &b[..n]);
        narrow_results(op, &a[..n], o);
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod regs {
    //! Half-precision reduction kernels that widen, combine and narrow in
    //! registers: 16 elements a step with AVX-512 (bf16), 8 with AVX2 (bf16 and
    //! f16; f16 uses these at the AVX-512 level too, where they measured
    //! faster than 16-lane conversions). x86-64 only.
    //!
    //! The portable half kernels (above, in `half`) convert a block to f32,
    //! combine it and convert it back, three passes through L1; at best about
    //! 5 GB/s here, a tenth of f32. These do one pass: load the halves, widen
    //! them to f32 lanes, combine, round back and store. They compute exactly
    //! what the portable kernels compute (f16 rounds to nearest even in the
    //! F16C/AVX-512 conversion, bf16 with the same bias-and-shift rounding and
    //! NaN quieting as `f32_to_bf16_bits` above; min and max with the
    //! canonical NaN and signed zeros of `arith`), so every level gives the
    //! same bits (tested in `reduce::tests`). Each function handles the
    //! whole steps of its inputs and returns how many elements it did; the
    //! caller finishes the tail.
    //!
    //! Called only from the AVX2 and AVX-512 kernels of `kernels::wide`, which
    //! run only where the CPU has those features; the intrinsics here need no
    //! `unsafe` (Rust allows calling them inside functions built for the
    //! features) and memory is read and written through bytemuck.

    use crate::element::ReduceOp;
    use crate::reduce::arith::F32_NAN;
    use core::arch::x86_64::*;
    use half::{bf16, f16};

    /// The kernels of one half type at one width: `$into` and `$to` over the
    /// step loops `$steps_into` and `$steps_to`, with the lane ops of that
    /// width. `$narrow` rounds f32 lanes to the half type; `$exact` narrows
    /// the results of min and max, which are always exactly a half value
    /// (an operand, -0, or the canonical NaN), and may skip the rounding.
    macro_rules! kernels {
        (
            $features:literal,
            ($steps_into:ident, $steps_to:ident),
            ($add:ident, $mul:ident, $min:ident, $max:ident),
            $h:ty,
            $into:ident,
            $to:ident,
            $widen:ident,
            ($narrow:ident, $exact:ident)
        ) => {
            #[target_feature(enable = $features)]
            pub(crate) fn $into(op: ReduceOp, dst: &mut [$h], src: &[$h]) -> usize {
                by_op!(
                    op,
                    $steps_into(dst, src, |x| $widen(x)),
                    (|v| $narrow(v), |v| $exact(v)),
                    $add,
                    $mul,
                    $min,
                    $max
                )
            }

            #[target_feature(enable = $features)]
            pub(crate) fn $to(op: ReduceOp, out: &mut [$h], a: &[$h], b: &[$h]) -> usize {
                by_op!(
                    op,
                    $steps_to(out, a, b, |x| $widen(x)),
                    (|v| $narrow(v), |v| $exact(v)),
                    $add,
                    $mul,
                    $min,
                    $max
                )
            }
        };
    }

    // ---- AVX-512: 16 lanes ----

    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    #[inline]
    fn bf16_widen16(x: __m256i) -> __m512 {
        // A bf16 is the top half of an f32.
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x)))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    #[inline]
    fn bf16_narrow16(v: __m512) -> __m256i {
        let x = _mm512_castps_si512(v);
        let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(1));
        let bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb);
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(x, bias));
        let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(x), _mm512_set1_epi32(0x40));
        let abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7fff_ffff));
        let nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f80_0000));
        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet))
    }

    /// bf16 of f32 lanes that are exactly bf16 values (their low 16 bits
    /// zero, as every result of min and max is): the top halves, which is
    /// what `bf16_narrow16` gives for them, canonical NaN included.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    #[inline]
    fn bf16_exact16(v: __m512) -> __m256i {
        _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(_mm512_castps_si512(v)))
    }

    /// The step loops of one vector width: `$to` is `out = f(widen(a),
    /// widen(b))` narrowed, `$into` is `dst = f(widen(dst), widen(src))`,
    /// `$lanes` elements a step (`$half` holds their bits, `$float` the f32
    /// lanes); each returns the elements done.
    macro_rules! steps {
        ($features:literal, $lanes:literal, $half:ty, $float:ty, $to:ident, $into:ident) => {
            #[target_feature(enable = $features)]
            #[inline]
            fn $to<H: bytemuck::Pod>(
                out: &mut [H],
                a: &[H],
                b: &[H],
                widen: impl Fn($half) -> $float,
                narrow: impl Fn($float) -> $half,
                f: impl Fn($float, $float) -> $float,
            ) -> usize {
                let n = out.len().min(a.len()).min(b.len()) / $lanes * $lanes;
                for ((o, x), y) in out[..n]
                    .chunks_exact_mut($lanes)
                    .zip(a.chunks_exact($lanes))
                    .zip(b.chunks_exact($lanes))
                {
                    let vx: $half = bytemuck::pod_read_unaligned(bytemuck::cast_slice(x));
                    let vy: $half = bytemuck::pod_read_unaligned(bytemuck::cast_slice(y));
                    let r = narrow(f(widen(vx), widen(vy)));
                    bytemuck::cast_slice_mut::<H, u8>(o).copy_from_slice(bytemuck::bytes_of(&r));
                }
                n
            }

            #[target_feature(enable = $features)]
            #[inline]
            fn $into<H: bytemuck::Pod>(
                dst: &mut [H],
                src: &[H],
                widen: impl Fn($half) -> $float,
                narrow: impl Fn($float) -> $half,
                f: impl Fn($float, $float) -> $float,
            ) -> usize {
                let n = dst.len().min(src.len()) / $lanes * $lanes;
                for (d, s) in dst[..n]
                    .chunks_exact_mut($lanes)
                    .zip(src.chunks_exact($lanes))
                {
                    let vd: $half = bytemuck::pod_read_unaligned(bytemuck::cast_slice(d));
                    let vs: $half = bytemuck::pod_read_unaligned(bytemuck::cast_slice(s));
                    let r = narrow(f(widen(vd), widen(vs)));
                    bytemuck::cast_slice_mut::<H, u8>(d).copy_from_slice(bytemuck::bytes_of(&r));
                }
                n
            }
        };
    }

    steps!(
        "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c",
        16,
        __m256i,
        __m512,
        steps16_to,
        steps16_into
    );
    steps!("avx2,fma,f16c", 8, __m128i, __m256, steps8_to, steps8_into);

    /// The op on f32 lanes, as the scalar kernels do it (`x` is the left
    /// operand, `self` of `Arith`); min and max are `min16`/`max16` or
    /// `min8`/`max8` below, `Arith`'s rule for floats in registers.
    macro_rules! by_op {
        (
            $op:expr,
            $run:ident($($arg:expr),*),
            ($narrow:expr, $exact:expr),
            $add:ident,
            $mul:ident,
            $min:ident,
            $max:ident
        ) => {
            match $op {
                ReduceOp::Sum | ReduceOp::Avg => $run($($arg),*, $narrow, |x, y| $add(x, y)),
                ReduceOp::Prod => $run($($arg),*, $narrow, |x, y| $mul(x, y)),
                ReduceOp::Min => $run($($arg),*, $exact, |x, y| $min(x, y)),
                ReduceOp::Max => $run($($arg),*, $exact, |x, y| $max(x, y)),
            }
        };
    }

    /// `Arith::min` of f32 on 16 lanes: `vminps` both ways ORed (-0 below
    /// +0, in either order), the canonical NaN where either lane is NaN.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    #[inline]
    fn min16(x: __m512, y: __m512) -> __m512 {
        let r = _mm512_or_ps(_mm512_min_ps(x, y), _mm512_min_ps(y, x));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, y);
        _mm512_mask_blend_ps(nan, r, _mm512_set1_ps(F32_NAN))
    }

    /// `Arith::max` of f32 on 16 lanes: `vmaxps` both ways ANDed (+0 above
    /// -0), the canonical NaN where either lane is NaN.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
    #[inline]
    fn max16(x: __m512, y: __m512) -> __m512 {
        let r = _mm512_and_ps(_mm512_max_ps(x, y), _mm512_max_ps(y, x));
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, y);
        _mm512_mask_blend_ps(nan, r, _mm512_set1_ps(F32_NAN))
    }

    /// `min16` on 8 lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn min8(x: __m256, y: __m256) -> __m256 {
        let r = _mm256_or_ps(_mm256_min_ps(x, y), _mm256_min_ps(y, x));
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, y);
        _mm256_blendv_ps(r, _mm256_set1_ps(F32_NAN), nan)
    }

    /// `max16` on 8 lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn max8(x: __m256, y: __m256) -> __m256 {
        let r = _mm256_and_ps(_mm256_max_ps(x, y), _mm256_max_ps(y, x));
        let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, y);
        _mm256_blendv_ps(r, _mm256_set1_ps(F32_NAN), nan)
    }

    kernels!(
        "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c",
        (steps16_into, steps16_to),
        (_mm512_add_ps, _mm512_mul_ps, min16, max16),
        bf16,
        avx512_bf16_into,
        avx512_bf16_to,
        bf16_widen16,
        (bf16_narrow16, bf16_exact16)
    );

    // ---- AVX2: 8 lanes ----

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn bf16_widen8(x: __m128i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(x)))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn bf16_narrow8(v: __m256) -> __m128i {
        let x = _mm256_castps_si256(v);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
        let bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb);
        let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(x, bias));
        let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(0x40));
        // Both sides are below 2^31, so the signed compare is the unsigned one.
        let abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fff_ffff));
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f80_0000));
        let bits = _mm256_blendv_epi8(rounded, quiet, nan);
        // Every lane is below 2^16: the saturating pack is exact. It packs
        // within 128-bit halves; qwords 0 and 2 hold lanes 0-3 and 4-7.
        let packed = _mm256_packus_epi32(bits, bits);
        _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b00_00_10_00>(packed))
    }

    /// `bf16_exact16` on 8 lanes.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn bf16_exact8(v: __m256) -> __m128i {
        let bits = _mm256_srli_epi32::<16>(_mm256_castps_si256(v));
        // As in `bf16_narrow8`: lanes below 2^16, packed within halves.
        let packed = _mm256_packus_epi32(bits, bits);
        _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b00_00_10_00>(packed))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn f16_widen8(x: __m128i) -> __m256 {
        _mm256_cvtph_ps(x)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    fn f16_narrow8(v: __m256) -> __m128i {
        _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v)
    }

    kernels!(
        "avx2,fma,f16c",
        (steps8_into, steps8_to),
        (_mm256_add_ps, _mm256_mul_ps, min8, max8),
        bf16,
        avx2_bf16_into,
        avx2_bf16_to,
        bf16_widen8,
        (bf16_narrow8, bf16_exact8)
    );
    kernels!(
        "avx2,fma,f16c",
        (steps8_into, steps8_to),
        (_mm256_add_ps, _mm256_mul_ps, min8, max8),
        f16,
        avx2_f16_into,
        avx2_f16_to,
        f16_widen8,
        // The conversion is one instruction, exact for exact values.
        (f16_narrow8, f16_narrow8)
    );
}
