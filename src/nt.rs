//! Copies with non-temporal ("streaming") stores, for writing the output of
//! a large collective.
//!
//! An ordinary store to a line that is not in cache first reads the line
//! (read for ownership), so writing a cold output costs a read and a write
//! per byte. Streaming stores skip that read and do not displace the slots
//! and inputs the next steps need. They pay off only when the destination
//! is cold and will not be read again soon: the executor uses them for the
//! output of calls whose output is large (`Config::nt_store_bytes`).
//! Measured on the 2-core build machine (docs/performance.md): a 64 MiB copy
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
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

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
        // SAFETY: a store fence has no memory-safety preconditions; it
        // orders the streaming stores above before every later store.
        unsafe { _mm_sfence() };
        d_tail.copy_from_slice(s_tail);
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
