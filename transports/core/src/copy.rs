//! The byte copy that fills and drains slots, and that the executors use
//! for every other copy of a call's data: [`copy_bytes`].
//!
//! Why not `copy_from_slice` alone: it calls the C library's `memcpy`, and
//! glibc copies blocks of a few KiB up to its non-temporal threshold with
//! `rep movsb` on CPUs that advertise fast `rep movsb` (ERMS, FSRM). On AMD
//! EPYC processors that instruction crawls when source and destination are
//! not aligned alike modulo 64 bytes. Measured on the build machine (AMD
//! EPYC, glibc 2.36; docs/performance-log.md, "Copies that crawl"): 1.8-2.0
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
//! architectures, stay `copy_from_slice`. The copy into a slot another
//! process reads next is the exception ([`copy_into_shared`]): there the
//! loop's stores must fetch each line from the other process's cache
//! first, and on the AMD EPYC VM of 2026-11-30 it was 3-5x slower than
//! `memcpy` (`bench/bound/handover.c`), whose `rep movsb` did not crawl on
//! pairs aligned differently there (98-115 GB/s at 4-64 KiB for offsets of
//! 8, 16 and 48 bytes). But inside a real broadcast, with both CPUs
//! sharing a cache, the loop was 1.7-1.8x faster at 32-128 KiB. So the
//! way of that copy (and of the copy out of a slot,
//! [`copy_from_shared`], which follows the same choice) is chosen where
//! it runs: by a communicator's
//! calibration, which times both through its own slots
//! ([`choose_shared_copy`]), and until then by a measurement made once
//! per process ([`memcpy_keeps_pace`]; FERROCCL_COPY=memcpy or `loop`
//! decides instead). Copies of 32-512 KiB out of slots go by
//! [`copy_pages`] instead, eight pages side by side (FERROCCL_COPY_PAGES=0
//! turns that off), except where the caller asks for line after line
//! ([`copy_from_shared_by_lines`]: readers that share their cores, which
//! copy by [`copy_bytes`] whatever the choice). The
//! loops, with [`prefetch_for_write`], are this crate's `unsafe`: the vector loads and stores, and PREFETCHW, are
//! hardware instructions with no safe wrapper.

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

/// [`copy_bytes`] for a copy into memory another process reads next (a
/// slot of a shared-memory connection): `memcpy` whatever the alignment
/// where that was chosen ([`memcpy_keeps_pace`]). Its stores write whole
/// lines without fetching them first, which the loop's cannot, and a
/// slot's lines sit in the other process's cache: alone, 95-104 against
/// 34-36 GB/s on the EPYC VM, 38-45 against 7-8 with its two CPUs in
/// different core complexes (`bench/bound/handover.c`).
#[inline]
pub fn copy_into_shared(dst: &mut [u8], src: &[u8]) {
    if dst.len() >= VECTOR_MIN && memcpy_keeps_pace() {
        dst.copy_from_slice(src);
    } else {
        copy_bytes(dst, src);
    }
}

/// [`copy_bytes`] for a copy out of memory another process wrote (a slot
/// of a shared-memory connection, on its receiving side): the same way as
/// [`copy_into_shared`], chosen by the same calibration, which times a
/// broadcast through slots and so both copies. The executor takes it for
/// outputs that stay in cache: with `memcpy` on the EPYC VM in the fast
/// state the 2-rank broadcast was 1.09-1.21x the loop from 64 KiB to
/// 4 MiB, but 0.43x at 8 MiB, where the output's lines are cold
/// (docs/performance-log.md, "A slot written by the transport's copy").
#[inline]
pub fn copy_from_shared(dst: &mut [u8], src: &[u8]) {
    copy_out(dst, src, pages_enabled());
}

/// [`copy_from_shared`] without the copy by pages: line after line, by
/// [`copy_bytes`] (`memcpy` where the two ends are aligned alike, the
/// vector loop elsewhere). For readers that share their cores with the
/// writer's process, where the eight streams of [`copy_pages`] lost: a
/// 4-rank broadcast through one staging area on the 2-core Intel VM ran
/// 1.12-1.23x faster this way from 128 KiB to 2 MiB (level at 256 KiB)
/// and 1.08-1.41x at 8-32 MiB, in turns (docs/performance-log.md,
/// "Staging areas read line after line where ranks share cores").
///
/// Not [`copy_into_shared`]'s way, whose `memcpy` pays where the
/// destination's lines sit in another core's cache: here the destination
/// is the reader's own buffer, and a communicator whose calibration
/// chose `memcpy` (a 128 KiB broadcast through slots, a tie on 4 ranks
/// of the AMD EPYC VM) copied out of the staging areas at the crawl of
/// `rep movsb` on pairs aligned differently: there 1.8 GB/s for 16 and
/// 256 KiB copies 16 bytes apart, against 28-29 by the loop. Taken to the
/// loop, that VM's 4-rank broadcast ran 1.7-2.8x faster from 128 KiB and
/// its allgather 2.0x at 512 KiB-2 MiB (docs/performance-log.md,
/// "Copies out of the staging areas that crawled").
#[inline]
pub fn copy_from_shared_by_lines(dst: &mut [u8], src: &[u8]) {
    copy_bytes(dst, src);
}

/// [`copy_from_shared`], by pages from one block to [`PAGES_MAX`] where
/// `pages`, else as [`copy_into_shared`].
#[inline]
fn copy_out(dst: &mut [u8], src: &[u8], pages: bool) {
    if pages && (PAGES_BLOCK..=PAGES_MAX).contains(&dst.len()) {
        copy_pages(dst, src);
    } else {
        copy_into_shared(dst, src);
    }
}

/// Bytes of one block of [`copy_pages`]: eight 4 KiB pages, read a line
/// from each in turn.
pub const PAGES_BLOCK: usize = 8 << 12;

/// `dst.copy_from_slice(src)`, reading the source eight 4 KiB pages at a
/// time, one line of each in turn, for a source in another core's cache.
///
/// A copy that walks its source line after line keeps one stream of
/// misses in flight, and the core's prefetchers follow a stream within a
/// page: out of the other core's cache each line waits for a snoop, so
/// the copy runs at what one stream's misses allow. Eight pages walked
/// side by side keep eight streams in flight. Intel MPI's shared-memory
/// copy works this way (the multi-page copy of its library reads a line of
/// each of eight pages per step). Measured on the 2-core Intel VM
/// (bench/bound/pages.c, 2026-12-01): 256 KiB just written by the other
/// core copied out in 10.2-10.3 us against 13.1-14.5 by `memcpy`; a bare
/// 2-process 512 KiB allreduce through shared buffers in 41 us against 48
/// with both its copies in and out so. The head up to the destination's
/// next 64-byte boundary goes first, then whole blocks of [`PAGES_BLOCK`]
/// bytes this way, the rest through [`copy_bytes`]. Panics where the
/// lengths differ.
pub fn copy_pages(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_pages: the lengths differ");
    let ((d_body, s_body), (d_tail, s_tail)) = head_then_body(dst, src, PAGES_BLOCK);
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above); `d_body` and
        // `s_body` are whole blocks of PAGES_BLOCK bytes (a multiple of
        // 512), as `copy_streams_avx2` requires.
        unsafe { x86::copy_streams_avx2(d_body, s_body, PAGES_BLOCK) };
        copy_bytes(d_tail, s_tail);
        return;
    }
    for (d, s) in d_body
        .chunks_exact_mut(PAGES_BLOCK)
        .zip(s_body.chunks_exact(PAGES_BLOCK))
    {
        pages_portable(d, s);
    }
    copy_bytes(d_tail, s_tail);
}

/// `dst.copy_from_slice(src)` for a source of some KiB that another core
/// has just written: [`copy_pages`]' way within one block of the whole
/// copy, eight streams of an eighth of it each, a line of each in turn,
/// where [`copy_pages`] needs blocks of [`PAGES_BLOCK`] bytes. The head up
/// to the destination's next 64-byte boundary and a tail of under 512
/// bytes go through [`copy_bytes`], and so does everything off x86-64 or
/// without AVX2. Panics where the lengths differ.
///
/// The inline exchange's reader takes a peer's block of 10-16 KiB this
/// way (`exec::inline` in the main crate): line after line, the 2-rank
/// allgather of 32 KiB gathered took 1.56-1.60 µs a call on the AMD EPYC
/// VM, and 1.38 in eight streams (1.13-1.15x; in place 1.20-1.25x), the
/// 2-rank all-to-all of 32 KiB 1.12-1.32x (docs/performance-log.md, "A
/// peer's inline block read in eight streams").
pub fn copy_streams(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streams: the lengths differ");
    // Eight streams of whole lines each.
    let ((d_body, s_body), (d_tail, s_tail)) = head_then_body(dst, src, STREAMS_UNIT);
    #[cfg(target_arch = "x86_64")]
    if !d_body.is_empty() && std::arch::is_x86_feature_detected!("avx2") {
        let block = d_body.len();
        // SAFETY: the CPU has AVX2 (checked just above); `d_body` and
        // `s_body` are `block` bytes each, a multiple of 512 (eight
        // streams of whole lines), as `copy_streams_avx2` requires.
        unsafe { x86::copy_streams_avx2(d_body, s_body, block) };
        copy_bytes(d_tail, s_tail);
        return;
    }
    copy_bytes(d_body, s_body);
    copy_bytes(d_tail, s_tail);
}

/// The body of [`copy_streams`] is a multiple of this: eight streams of
/// whole 64-byte lines.
const STREAMS_UNIT: usize = 8 * 64;

/// A destination and its source, of one length.
type Halves<'d, 's> = (&'d mut [u8], &'s [u8]);

/// Copy the head of `dst` up to its next 64-byte boundary (by
/// [`copy_bytes`]), so that no store of the body straddles two lines (a
/// split store costs about two; unaligned loads are cheap), and split the
/// rest of both slices (one length) into a body of whole `unit`s and a
/// tail: `((dst body, src body), (dst tail, src tail))`.
fn head_then_body<'d, 's>(
    dst: &'d mut [u8],
    src: &'s [u8],
    unit: usize,
) -> (Halves<'d, 's>, Halves<'d, 's>) {
    let head = dst.as_ptr().align_offset(64).min(dst.len());
    let (d_head, dst) = dst.split_at_mut(head);
    let (s_head, src) = src.split_at(head);
    copy_bytes(d_head, s_head);
    let body = dst.len() / unit * unit;
    let (d_body, d_tail) = dst.split_at_mut(body);
    let (s_body, s_tail) = src.split_at(body);
    ((d_body, s_body), (d_tail, s_tail))
}

/// One block of [`copy_pages`] without vector instructions: 64 bytes of
/// each page in turn (the compiler's copies of 64 bytes).
fn pages_portable(d: &mut [u8], s: &[u8]) {
    const PAGE: usize = PAGES_BLOCK / 8;
    for line in (0..PAGE).step_by(64) {
        for page in 0..8 {
            let at = page * PAGE + line;
            d[at..at + 64].copy_from_slice(&s[at..at + 64]);
        }
    }
}

/// The largest copy out of shared memory that goes by [`copy_pages`]: a
/// 2-rank allreduce of 1 MiB, whose pieces of 512 KiB the executor runs
/// as one slice each between two ranks of one host. Above it the copy's
/// streams outgrow the cache: the 2-rank allreduce and reduce-scatter
/// with every copy of 32 KiB and up by pages, into slots too, were
/// 0.87-0.92x at 2-8 MiB, where the slices are 256-512 KiB
/// (docs/performance-log.md, "Copies by pages").
pub const PAGES_MAX: usize = 512 << 10;

/// Whether the copies out of shared memory take [`copy_pages`] for their
/// whole blocks: yes unless FERROCCL_COPY_PAGES=0 (or `false`, `off`,
/// `no`, as the config's flags; it refuses other values). The copy into a
/// slot stays `memcpy` (or the loop) either way: by pages it took 14.4 us
/// against 12.0 for 256 KiB, its stores fetching the lines the peer
/// holds, where the C library's string copy does not; Intel MPI copies in
/// that way too. Read once per process.
pub fn pages_enabled() -> bool {
    static PAGES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PAGES.get_or_init(|| {
        !std::env::var("FERROCCL_COPY_PAGES").is_ok_and(|v| crate::flag_value(&v) == Some(false))
    })
}

/// The way [`copy_into_shared`] (and [`copy_from_shared`]) copies: not
/// chosen yet, `memcpy`, the loop.
static SHARED_COPY: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(UNSET);
const UNSET: u8 = 0;
const MEMCPY: u8 = 1;
const LOOP: u8 = 2;

/// Whether [`copy_into_shared`] takes `memcpy` on pairs not aligned alike:
/// FERROCCL_COPY=memcpy says yes and `loop` no; otherwise the choice of
/// [`choose_shared_copy`] (a communicator's calibration, which times both
/// through its own slots), and before any such choice a measurement made
/// once per process: whether `memcpy` copies a pair not aligned alike at
/// least 0.8 times as fast as the loop (the best of 16 rounds of eight
/// 16 KiB copies each way, source and destination 16 bytes apart modulo
/// 64, in cache; about 100 us). Always true off x86-64, where there is no
/// loop.
pub fn memcpy_keeps_pace() -> bool {
    use std::sync::atomic::Ordering;
    match SHARED_COPY.load(Ordering::Relaxed) {
        MEMCPY => true,
        LOOP => false,
        _ => {
            let memcpy = match shared_copy_from_env() {
                Some(memcpy) => memcpy,
                None => measure_memcpy(),
            };
            // A calibration's choice made meanwhile stands.
            let _ = SHARED_COPY.compare_exchange(
                UNSET,
                if memcpy { MEMCPY } else { LOOP },
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            SHARED_COPY.load(Ordering::Relaxed) == MEMCPY
        }
    }
}

/// FERROCCL_COPY's choice, if it makes one (`memcpy` or `loop`).
pub fn shared_copy_from_env() -> Option<bool> {
    match std::env::var("FERROCCL_COPY").as_deref() {
        Ok("memcpy") => Some(true),
        Ok("loop") => Some(false),
        _ => None,
    }
}

/// Set how [`copy_into_shared`] copies pairs not aligned alike, for the
/// whole process (`memcpy`: true; the loop: false), unless FERROCCL_COPY
/// chose. Which one is faster depends on where the two processes of a
/// slot run, not on the data: on the AMD EPYC VM a 128 KiB broadcast's
/// root was 1.7x faster with the loop while both CPUs shared a cache, and
/// 3-4.5x slower once they did not. A communicator's calibration times
/// both and calls this.
pub fn choose_shared_copy(memcpy: bool) {
    if shared_copy_from_env().is_none() {
        SHARED_COPY.store(
            if memcpy { MEMCPY } else { LOOP },
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// Ask the CPU to take the cache line holding `word` into this core's
/// cache in the state a store needs (x86's PREFETCHW), ahead of the store:
/// a hint, which changes no value and cannot fault. A store to a line a
/// peer on another core has read waits for that core to give the line up
/// (a cross-core round trip, 100-170 ns on the build VMs), and so does
/// every locked instruction after it; claimed earlier, the line is this
/// core's by the time the store comes. The check-in of a small
/// broadcast or reduce claims the lines of the announcement slot it will
/// write two calls later, and a broadcast's root of 1-4 KiB its inline
/// area's too (`exec::checkin::claim_ahead` in the main crate). Nothing
/// where the CPU lacks the instruction (CPUID 8000_0001h, ECX bit 8,
/// asked once) or on other architectures.
#[inline]
pub fn prefetch_for_write<T>(word: &T) {
    #[cfg(target_arch = "x86_64")]
    if x86::has_prefetchw() {
        // SAFETY: PREFETCHW is a hint: it writes no register or memory,
        // never faults (even on an unmapped address), and `word` is a
        // live reference anyway; the CPU has it (checked just above).
        unsafe {
            core::arch::asm!(
                "prefetchw [{0}]",
                in(reg) (word as *const T),
                options(nostack, readonly, preserves_flags)
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = word;
}

/// Ask the CPU to bring the cache line holding `word` into this core's
/// cache for reading (x86's PREFETCHT0), ahead of the load: a hint, which
/// changes no value and cannot fault. A small call's reader asks for a
/// peer's lines of input before it waits for the peer's announcement
/// (`exec::inline::fetch_ahead`, `exec::checkin::fetch_entry` in the main
/// crate), so that they come with it rather than after it. Nothing on
/// other architectures.
#[inline]
pub fn prefetch_for_read<T>(word: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it writes no register or memory,
    // never faults (even on an unmapped address), every x86-64 CPU has it
    // (SSE), and `word` is a live reference anyway.
    unsafe {
        core::arch::asm!(
            "prefetcht0 [{0}]",
            in(reg) (word as *const T),
            options(nostack, readonly, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = word;
}

#[cfg(target_arch = "x86_64")]
fn measure_memcpy() -> bool {
    use std::time::Instant;
    const N: usize = 16 << 10;
    let src = vec![0x5Au8; N + 128];
    let mut dst = vec![0u8; N + 128];
    // Offsets that put the two 16 bytes apart modulo 64.
    let s_off = (64 - src.as_ptr() as usize % 64) % 64;
    let d_off = (64 - dst.as_ptr() as usize % 64) % 64 + 16;
    let s = &src[s_off..s_off + N];
    let mut best = [f64::MAX; 2];
    for _ in 0..16 {
        for (k, best) in best.iter_mut().enumerate() {
            let d = &mut dst[d_off..d_off + N];
            let t0 = Instant::now();
            for _ in 0..8 {
                if k == 0 {
                    d.copy_from_slice(s);
                } else {
                    x86::copy(d, s);
                }
                std::hint::black_box(&mut *d);
            }
            *best = best.min(t0.elapsed().as_secs_f64());
        }
    }
    best[0] <= best[1] * 1.25
}

#[cfg(not(target_arch = "x86_64"))]
fn measure_memcpy() -> bool {
    true
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::{
        __m128i, __m256i, _mm256_loadu_si256, _mm256_setzero_si256, _mm256_storeu_si256,
        _mm_loadu_si128, _mm_storeu_si128,
    };

    /// Whether the CPU has PREFETCHW: 0 not asked yet, 1 yes, 2 no.
    static HAS_PREFETCHW: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

    /// Whether the CPU has PREFETCHW (CPUID 8000_0001h, ECX bit 8:
    /// PRFCHW), asked once. Inlined (one load), so that a small call's
    /// claim of its lines costs no call.
    #[inline(always)]
    pub(super) fn has_prefetchw() -> bool {
        match HAS_PREFETCHW.load(std::sync::atomic::Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => ask_prefetchw(),
        }
    }

    #[cold]
    #[inline(never)]
    fn ask_prefetchw() -> bool {
        let max = core::arch::x86_64::__cpuid(0x8000_0000).eax;
        let has =
            max >= 0x8000_0001 && core::arch::x86_64::__cpuid(0x8000_0001).ecx & (1 << 8) != 0;
        HAS_PREFETCHW.store(
            if has { 1 } else { 2 },
            std::sync::atomic::Ordering::Relaxed,
        );
        has
    }

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

    /// The blocks of `copy_pages` (`block` = `PAGES_BLOCK`: eight 4 KiB
    /// pages) and the body of `copy_streams` (one block, the whole body):
    /// `dst` and `src` have one length, a multiple of `block`, itself a
    /// multiple of 512. Each step loads a line (two 32-byte vectors) from
    /// each eighth of the block (its streams), then stores them.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy_streams_avx2(dst: &mut [u8], src: &[u8], block: usize) {
        debug_assert!(block > 0 && block.is_multiple_of(super::STREAMS_UNIT));
        let stride = block / 8;
        for (d, s) in dst.chunks_exact_mut(block).zip(src.chunks_exact(block)) {
            let (p, q) = (s.as_ptr(), d.as_mut_ptr());
            for line in (0..stride).step_by(64) {
                // SAFETY: `s` and `d` are `block` valid bytes each
                // (chunks_exact); every offset `page * stride + line + 32`
                // plus the vector's 32 bytes stays below `block` (page <
                // 8, line <= stride - 64, stride a multiple of 64); the
                // loads and stores are the unaligned forms; `d` is
                // borrowed mutably and `s` shared, so they do not overlap.
                // AVX2 is enabled for this function and present (the
                // caller checked).
                unsafe {
                    let mut v = [_mm256_setzero_si256(); 16];
                    for (page, pair) in v.chunks_exact_mut(2).enumerate() {
                        let at = p.add(page * stride + line);
                        pair[0] = _mm256_loadu_si256(at.cast::<__m256i>());
                        pair[1] = _mm256_loadu_si256(at.add(32).cast::<__m256i>());
                    }
                    for (page, pair) in v.chunks_exact(2).enumerate() {
                        let at = q.add(page * stride + line);
                        _mm256_storeu_si256(at.cast::<__m256i>(), pair[0]);
                        _mm256_storeu_si256(at.add(32).cast::<__m256i>(), pair[1]);
                    }
                }
            }
        }
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

    /// The write prefetch is a hint: words it touches (atomics another
    /// thread stores to meanwhile, and ordinary bytes) keep their values;
    /// whether the CPU has the instruction agrees with the kernel's flags.
    #[test]
    fn prefetch_for_write_changes_nothing() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let words: Vec<AtomicU64> = (0..64).map(AtomicU64::new).collect();
        let bytes = pattern(4096, 7);
        let copy_of = bytes.clone();
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..1000u64 {
                    words[(round % 64) as usize].store(round * 64 + round % 64, Ordering::Release);
                }
            });
            for round in 0..1000 {
                prefetch_for_write(&words[round % 64]);
                for b in bytes.iter().step_by(64) {
                    prefetch_for_write(b);
                }
            }
        });
        assert_eq!(bytes, copy_of);
        for (i, w) in words.iter().enumerate() {
            let v = w.load(Ordering::Acquire);
            let last = (0..1000u64).filter(|r| r % 64 == i as u64).max().unwrap();
            assert_eq!(v, last * 64 + i as u64, "word {i}");
        }
        // What the kernel says of the CPU: Linux names the CPUID bit
        // "3dnowprefetch".
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
            let flags = info.lines().find(|l| l.starts_with("flags")).unwrap_or("");
            let named = flags.split_whitespace().any(|f| f == "3dnowprefetch");
            assert_eq!(x86::has_prefetchw(), named, "{flags}");
        }
    }

    /// `copy` of `src` into a buffer at offset `d_off` writes exactly
    /// `src` there and nothing outside it (`at` names the case).
    fn check_copy(copy: fn(&mut [u8], &[u8]), src: &[u8], d_off: usize, at: &str) {
        let n = src.len();
        let mut dst_all = vec![0xA5u8; n + 128];
        copy(&mut dst_all[d_off..d_off + n], src);
        assert_eq!(&dst_all[d_off..d_off + n], src, "{at}");
        assert!(
            dst_all[..d_off].iter().all(|&b| b == 0xA5)
                && dst_all[d_off + n..].iter().all(|&b| b == 0xA5),
            "{at}: bytes outside the destination changed"
        );
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
                check_copy(
                    copy_bytes,
                    src,
                    d_off,
                    &format!("n={n} s={s_off} d={d_off}"),
                );
                #[cfg(target_arch = "x86_64")]
                {
                    // Both loops themselves, whichever copy_bytes chose.
                    let mut dst = vec![0u8; n];
                    x86::copy_sse2(&mut dst, src);
                    assert_eq!(dst, src, "sse2 n={n} s={s_off}");
                    let mut dst = vec![0u8; n + 64];
                    x86::copy(&mut dst[d_off..d_off + n], src);
                    assert_eq!(
                        &dst[d_off..d_off + n],
                        src,
                        "loop n={n} s={s_off} d={d_off}"
                    );
                }
            }
        }
    }

    /// The copies into and out of a slot, each way they can be chosen, equal
    /// `copy_from_slice` at every relative offset and touch nothing else;
    /// a choice stands until the next one (FERROCCL_COPY, where set, wins).
    #[test]
    fn copies_into_shared_memory_equal_copy_from_slice() {
        let env = shared_copy_from_env();
        for memcpy in [true, false, true] {
            choose_shared_copy(memcpy);
            assert_eq!(memcpy_keeps_pace(), env.unwrap_or(memcpy));
            copies_into_shared_memory_are_exact();
        }
    }

    fn copies_into_shared_memory_are_exact() {
        let sizes = [0, 255, 256, 4097, 65_536 + 37, PAGES_MAX, PAGES_MAX + 64];
        for (k, n) in sizes.into_iter().enumerate() {
            let src_all = pattern(n + 64, 100 + k as u64);
            for (s_off, d_off) in [(0, 0), (0, 16), (16, 0), (3, 61)] {
                let src = &src_all[s_off..s_off + n];
                type Copy = fn(&mut [u8], &[u8]);
                let copies: [(&str, Copy); 4] = [
                    ("into", copy_into_shared),
                    ("out of", copy_from_shared),
                    ("out of, by pages", |d, s| copy_out(d, s, true)),
                    ("out of, line after line", copy_from_shared_by_lines),
                ];
                for (way, copy) in copies {
                    let at = format!("{way} shared memory, n={n} s={s_off} d={d_off}");
                    check_copy(copy, src, d_off, &at);
                }
            }
        }
    }

    /// The copy by pages equals `copy_from_slice` for lengths around its
    /// blocks, at relative offsets modulo 64, and touches nothing outside
    /// the destination; so does its portable block.
    #[test]
    fn copies_by_pages_equal_copy_from_slice() {
        let lengths = [
            0,
            PAGES_BLOCK - 1,
            PAGES_BLOCK,
            PAGES_BLOCK + 37,
            3 * PAGES_BLOCK + 4097,
            PAGES_MAX,
            1 << 20,
        ];
        for (k, n) in lengths.into_iter().enumerate() {
            let src_all = pattern(n + 64, 200 + k as u64);
            for (s_off, d_off) in [(0, 0), (0, 16), (8, 40), (63, 1)] {
                let src = &src_all[s_off..s_off + n];
                check_copy(
                    copy_pages,
                    src,
                    d_off,
                    &format!("n={n} s={s_off} d={d_off}"),
                );
            }
        }
        let src = pattern(PAGES_BLOCK, 7);
        let mut dst = vec![0u8; PAGES_BLOCK];
        pages_portable(&mut dst, &src);
        assert_eq!(dst, src, "the portable block");
    }

    /// The copy in eight streams equals `copy_from_slice` for lengths
    /// around its unit and the inline blocks it takes, at relative offsets
    /// modulo 64, and touches nothing outside the destination.
    #[test]
    fn copies_in_streams_equal_copy_from_slice() {
        let lengths = [
            0,
            63,
            STREAMS_UNIT - 1,
            STREAMS_UNIT,
            STREAMS_UNIT + 64 + 1,
            16 << 10,
            (16 << 10) + 37,
            (24 << 10) - 4,
            PAGES_BLOCK + 4097,
        ];
        for (k, n) in lengths.into_iter().enumerate() {
            let src_all = pattern(n + 64, 300 + k as u64);
            for (s_off, d_off) in [(0, 0), (0, 16), (8, 40), (63, 1), (32, 32)] {
                let src = &src_all[s_off..s_off + n];
                check_copy(
                    copy_streams,
                    src,
                    d_off,
                    &format!("n={n} s={s_off} d={d_off}"),
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "the lengths differ")]
    fn different_lengths_panic_as_copy_from_slice_does() {
        copy_bytes(&mut [0u8; 3], &[1u8; 4]);
    }
}
