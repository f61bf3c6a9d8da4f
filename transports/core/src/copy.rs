//! The byte copy that fills and drains slots, and that the executors use
//! for every other copy of a call's data: [`copy_bytes`].
//!
//! Why not `copy_from_slice` alone: it calls the C library's `memcpy`, and
//! glibc copies blocks of a few KiB up to its non-temporal threshold with
//! `rep movsb` on CPUs that advertise fast `rep movsb` (ERMS, FSRM). On AMD
//! EPYC processors that instruction crawls when source and destination are
//! not aligned alike modulo 64 bytes. Measured on the build machine (AMD
//! EPYC, glibc 2.36; docs/performance.md, "Copies that crawl"): 1.8-2.0
//! GB/s at 4 and 64 KiB for relative offsets of 8 and 16 bytes, against
//! 28-63 GB/s for equal alignment, and 33-72 GB/s for a loop of 32-byte
//! vector loads and stores at any offset. A caller's buffer and a slot are
//! aligned alike only by chance (an allocator hands out 16-byte aligned
//! blocks), so a collective ran at 2 GB/s or at 30 depending on where its
//! buffers happened to lie.
//!
//! So copies of at least [`VECTOR_MIN`] bytes whose ends are not aligned
//! alike go through a vector loop (AVX2 where the CPU has it, else SSE2,
//! part of the x86-64 baseline); the others, and every copy on other
//! architectures, stay `copy_from_slice`. The loop is the one `unsafe`
//! of this crate: the vector loads and stores are hardware instructions
//! with no safe wrapper.

/// Copies shorter than this stay `copy_from_slice`: `memcpy` moves them
/// with vector moves, not `rep movsb`.
pub const VECTOR_MIN: usize = 256;

/// `dst.copy_from_slice(src)`, at full speed whatever the two slices'
/// alignment (see the module docs). Panics, as `copy_from_slice` does,
/// where the lengths differ.
#[inline]
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: the lengths differ");
    let alike = (dst.as_ptr() as usize)
        .wrapping_sub(src.as_ptr() as usize)
        .is_multiple_of(64);
    if dst.len() < VECTOR_MIN || alike {
        dst.copy_from_slice(src);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    x86::copy(dst, src);
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{
        __m128i, __m256i, _mm256_loadu_si256, _mm256_storeu_si256, _mm_loadu_si128,
        _mm_storeu_si128,
    };

    /// Bytes per iteration of the AVX2 loop: four 32-byte vectors.
    const AVX2_STEP: usize = 128;
    /// Bytes per iteration of the SSE2 loop: four 16-byte vectors.
    const SSE2_STEP: usize = 64;

    pub(super) fn copy(dst: &mut [u8], src: &[u8]) {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above), the one
            // requirement of a `target_feature(enable = "avx2")` function.
            unsafe { copy_avx2(dst, src) }
        } else {
            copy_sse2(dst, src);
        }
    }

    /// The AVX2 loop; `dst` and `src` have one length.
    #[target_feature(enable = "avx2")]
    unsafe fn copy_avx2(dst: &mut [u8], src: &[u8]) {
        let body = dst.len() / AVX2_STEP * AVX2_STEP;
        let (d_body, d_tail) = dst.split_at_mut(body);
        let (s_body, s_tail) = src.split_at(body);
        for (d, s) in d_body
            .chunks_exact_mut(AVX2_STEP)
            .zip(s_body.chunks_exact(AVX2_STEP))
        {
            let (p, q) = (
                s.as_ptr().cast::<__m256i>(),
                d.as_mut_ptr().cast::<__m256i>(),
            );
            // SAFETY: `s` and `d` are 128 valid bytes each (chunks_exact),
            // four 32-byte vectors; the loads and stores are the unaligned
            // forms, so any address will do; `d` is borrowed mutably and
            // `s` shared, so they do not overlap. AVX2 is enabled for this
            // function and present (the caller checked).
            unsafe {
                let a = _mm256_loadu_si256(p);
                let b = _mm256_loadu_si256(p.add(1));
                let c = _mm256_loadu_si256(p.add(2));
                let e = _mm256_loadu_si256(p.add(3));
                _mm256_storeu_si256(q, a);
                _mm256_storeu_si256(q.add(1), b);
                _mm256_storeu_si256(q.add(2), c);
                _mm256_storeu_si256(q.add(3), e);
            }
        }
        d_tail.copy_from_slice(s_tail);
    }

    /// The SSE2 loop (the x86-64 baseline: no detection needed).
    pub(super) fn copy_sse2(dst: &mut [u8], src: &[u8]) {
        let body = dst.len() / SSE2_STEP * SSE2_STEP;
        let (d_body, d_tail) = dst.split_at_mut(body);
        let (s_body, s_tail) = src.split_at(body);
        for (d, s) in d_body
            .chunks_exact_mut(SSE2_STEP)
            .zip(s_body.chunks_exact(SSE2_STEP))
        {
            let (p, q) = (
                s.as_ptr().cast::<__m128i>(),
                d.as_mut_ptr().cast::<__m128i>(),
            );
            // SAFETY: `s` and `d` are 64 valid bytes each (chunks_exact),
            // four 16-byte vectors; unaligned loads and stores; `d` and `s`
            // do not overlap (one is borrowed mutably). SSE2 is part of the
            // x86-64 baseline.
            unsafe {
                let a = _mm_loadu_si128(p);
                let b = _mm_loadu_si128(p.add(1));
                let c = _mm_loadu_si128(p.add(2));
                let e = _mm_loadu_si128(p.add(3));
                _mm_storeu_si128(q, a);
                _mm_storeu_si128(q.add(1), b);
                _mm_storeu_si128(q.add(2), c);
                _mm_storeu_si128(q.add(3), e);
            }
        }
        d_tail.copy_from_slice(s_tail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes that differ at every position and between calls.
    fn pattern(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Every length around the loop's steps, at every relative offset of
    /// source and destination modulo 64, equals `copy_from_slice` and
    /// touches nothing outside the destination.
    #[test]
    fn copies_equal_copy_from_slice_at_every_offset_and_length() {
        let lengths = (0..=700).chain([1023, 4096, 4097, 65_536 + 37, 1 << 20]);
        for (k, n) in lengths.enumerate() {
            let src_all = pattern(n + 64, k as u64);
            for (s_off, d_off) in [(0, 0), (0, 16), (16, 0), (8, 40), (3, 61), (63, 1), (32, 0)] {
                let src = &src_all[s_off..s_off + n];
                let mut dst_all = vec![0xA5u8; n + 128];
                copy_bytes(&mut dst_all[d_off..d_off + n], src);
                assert_eq!(&dst_all[d_off..d_off + n], src, "n={n} s={s_off} d={d_off}");
                assert!(
                    dst_all[..d_off].iter().all(|&b| b == 0xA5)
                        && dst_all[d_off + n..].iter().all(|&b| b == 0xA5),
                    "n={n} s={s_off} d={d_off}: bytes outside the destination changed"
                );
                #[cfg(target_arch = "x86_64")]
                {
                    let mut dst = vec![0u8; n];
                    x86::copy_sse2(&mut dst, src);
                    assert_eq!(dst, src, "sse2 n={n} s={s_off}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "the lengths differ")]
    fn different_lengths_panic_as_copy_from_slice_does() {
        copy_bytes(&mut [0u8; 3], &[1u8; 4]);
    }
}
