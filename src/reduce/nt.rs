//! Copies with non-temporal ("streaming") stores, for writing the output of
//! a large collective.
//!
//! An ordinary store to a line that is not in cache first reads the line
//! (read for ownership), so writing a cold output costs a read and a write
//! per byte. Streaming stores skip that read and do not displace the slots
//! and inputs the next steps need. They pay off only when the destination
//! is cold and will not be read again soon: the executor uses them for the
//! output of calls whose output is large (`Config::nt_store_bytes`).
//! Measured on the 2-core build machine (docs/performance-history.md,
//! "Streaming stores", 2026-11-21): a 64 MiB copy
//! in 512 KiB pieces ran at 6.5 GB/s with `copy_from_slice` and 9.1 GB/s
//! with streaming stores.
//!
//! Streaming stores are weakly ordered; every function here ends with a
//! store fence, so what it wrote is visible before any later store (such as
//! the release that publishes a slot).

/// `dst.copy_from_slice(src)` with streaming stores where the target has
/// them (x86-64); a plain copy elsewhere.
pub(crate) fn copy_nt(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_nt: lengths differ");
    #[cfg(target_arch = "x86_64")]
    x86::copy(dst, src);
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};

    /// Bytes per streaming store (SSE2, part of the x86-64 baseline, so no
    /// run-time detection is needed; a memory-bound copy gains nothing from
    /// wider stores).
    const LANE: usize = 16;

    pub(super) fn copy(dst: &mut [u8], src: &[u8]) {
        // Plain copies for the head up to 16-byte alignment and the tail.
        let head = dst.as_ptr().align_offset(LANE).min(dst.len());
        let body = (dst.len() - head) / LANE * LANE;
        let (d_head, d_rest) = dst.split_at_mut(head);
        let (s_head, s_rest) = src.split_at(head);
        d_head.copy_from_slice(s_head);
        let (d_body, d_tail) = d_rest.split_at_mut(body);
        let (s_body, s_tail) = s_rest.split_at(body);
        for (d, s) in d_body.chunks_exact_mut(LANE).zip(s_body.chunks_exact(LANE)) {
            // SAFETY: the hardware's streaming store has no safe wrapper.
            // `s` and `d` are 16 valid bytes each (chunks_exact); the load
            // is unaligned-tolerant, and `d` is 16-byte aligned because the
            // body starts at an aligned address and advances by 16. SSE2 is
            // part of the x86-64 baseline.
            unsafe {
                let v = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
                _mm_stream_si128(d.as_mut_ptr().cast::<__m128i>(), v);
            }
        }
        super::line::fence();
        d_tail.copy_from_slice(s_tail);
    }
}

/// A cache line's worth of bytes, aligned as one.
#[derive(Clone, Copy, Debug, Default, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(64))]
pub(crate) struct Line(pub(crate) [u64; 8]);

/// Bytes of a `Line`.
pub(crate) const LINE: usize = 64;

/// The streaming stores of whole lines, one function per vector width, for
/// the fused kernel of `reduce::stream` (compiled at each `SimdLevel`).
/// Each takes a destination that must start on a 64-byte boundary (checked:
/// the hardware faults otherwise) and leaves the fence to the caller, once
/// per call of the kernel, not per line.
#[cfg(target_arch = "x86_64")]
pub(crate) mod line {
    use super::{Line, LINE};
    use core::arch::x86_64::{
        __m128i, __m256i, __m512i, _mm256_stream_si256, _mm512_stream_si512, _mm_sfence,
        _mm_stream_si128,
    };

    /// The destination as a pointer, after checking what every store below
    /// needs of it: 64 bytes, starting on a 64-byte boundary.
    #[inline(always)]
    fn target(dst: &mut [u8]) -> *mut u8 {
        assert!(
            dst.len() == LINE && (dst.as_ptr() as usize).is_multiple_of(LINE),
            "streaming line store: {} bytes at {:p}",
            dst.len(),
            dst.as_ptr()
        );
        dst.as_mut_ptr()
    }

    /// Four 16-byte streaming stores (SSE2: the x86-64 baseline).
    #[inline(always)]
    pub(crate) fn sse2(dst: &mut [u8], src: &Line) {
        let p = target(dst);
        let v: [__m128i; 4] = bytemuck::cast(*src);
        for (i, v) in v.into_iter().enumerate() {
            // SAFETY: the hardware's streaming store has no safe wrapper.
            // `p` points to 64 writable bytes this function holds
            // exclusively (`dst`), aligned to 64 (checked in `target`), so
            // each 16-byte piece is in bounds and 16-byte aligned.
            unsafe { _mm_stream_si128(p.add(i * 16).cast::<__m128i>(), v) };
        }
    }

    /// Two 32-byte streaming stores.
    #[target_feature(enable = "avx2")]
    #[inline]
    pub(crate) fn avx2(dst: &mut [u8], src: &Line) {
        let p = target(dst);
        let v: [__m256i; 2] = bytemuck::cast(*src);
        for (i, v) in v.into_iter().enumerate() {
            // SAFETY: as in `sse2`; each 32-byte piece is in bounds and
            // 32-byte aligned. AVX2 is enabled on this function, which
            // only runs where the CPU has it (its callers are the AVX2 and
            // AVX-512 kernels).
            unsafe { _mm256_stream_si256(p.add(i * 32).cast::<__m256i>(), v) };
        }
    }

    /// One 64-byte streaming store: a whole line per instruction.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn avx512(dst: &mut [u8], src: &Line) {
        let p = target(dst);
        let v: __m512i = bytemuck::cast(*src);
        // SAFETY: as in `sse2`; the line is in bounds and 64-byte aligned.
        unsafe { _mm512_stream_si512(p.cast::<__m512i>(), v) };
    }

    /// Order the streaming stores before every later store (the release
    /// that says the call is done).
    #[inline]
    pub(crate) fn fence() {
        // SAFETY: a store fence has no memory-safety preconditions.
        unsafe { _mm_sfence() };
    }
}

#[cfg(test)]
mod tests {
    use super::copy_nt;

    #[test]
    fn copies_every_length_and_alignment() {
        let src: Vec<u8> = (0..4200u32).map(|i| (i * 7 + 3) as u8).collect();
        for start in 0..17 {
            for len in [0usize, 1, 15, 16, 17, 31, 64, 100, 4096, 4100] {
                let mut dst = vec![0u8; 4200 + 32];
                let s = &src[..len];
                copy_nt(&mut dst[start..start + len], s);
                assert_eq!(&dst[start..start + len], s, "start {start} len {len}");
                assert!(
                    dst[..start].iter().all(|&b| b == 0),
                    "wrote before the range"
                );
                assert!(
                    dst[start + len..].iter().all(|&b| b == 0),
                    "wrote past the range"
                );
            }
        }
    }
}
