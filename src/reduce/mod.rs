//! CPU reduction kernels, one generic definition for every element type and
//! op (f16 and bf16 combine in f32). Public for benchmarks and for callers
//! that reduce locally, such as gradient accumulation.
//!
//! The files form layers, each importing only those below it: `simd` (which
//! vector level runs) and `nt` (streaming stores); `arith` (the generic
//! elementwise loops); `half` (f16 and bf16) and `stream` (the fused
//! streaming kernel); `kernels` (those compiled per level, and the dispatch
//! to them); `impls` (`Element` for each type); and this file, the entry
//! points the executor and callers use. Nothing here knows of
//! communicators, schedules or transports, and `crate::element` (the
//! vocabulary) must not import from here.

mod arith;
mod half;
mod impls;
mod kernels;
mod nt;
mod simd;
#[cfg(target_arch = "x86_64")]
mod stream;
#[cfg(test)]
mod tests;

pub use simd::SimdLevel;

use crate::element::{Element, ReduceOp};

/// Reduce `src` into `dst` elementwise for a runtime-chosen op (Avg acts as
/// Sum); the single entry point the executor uses.
#[inline]
pub fn reduce_into<T: Element>(op: ReduceOp, dst: &mut [T], src: &[T]) {
    T::reduce_into(op.combining(), dst, src)
}

/// `out = a op b` elementwise (Avg acts as Sum).
#[inline]
pub fn reduce_to<T: Element>(op: ReduceOp, out: &mut [T], a: &[T], b: &[T]) {
    T::reduce_to(op.combining(), out, a, b)
}

/// Elements per block of the two-destination kernels: small enough that a
/// block just written is still in L1 when it is copied to the second
/// destination.
const PAIR_BLOCK: usize = 1024;

/// How a kernel writes the collective's output (see `nt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    /// Ordinary stores: the output stays in cache.
    Cached,
    /// Streaming stores: for a large output that will not be read soon.
    Streaming,
}

/// `dst.copy_from_slice(src)` through the transport core's byte copy,
/// which keeps its speed whatever the two slices' alignment
/// (`ferroccl_transport::copy_bytes`: glibc's copy crawls on some CPUs
/// when they are not aligned alike).
#[inline]
pub(crate) fn copy<T: Element>(dst: &mut [T], src: &[T]) {
    ferroccl_transport::copy_bytes(bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src));
}

/// `dst = src` in the given store mode.
pub(crate) fn store<T: Element>(mode: Store, dst: &mut [T], src: &[T]) {
    match mode {
        Store::Cached => copy(dst, src),
        Store::Streaming => nt::copy_nt(bytemuck::cast_slice_mut(dst), bytemuck::cast_slice(src)),
    }
}

/// `out = a op b` (Avg acts as Sum), writing `out` in the given mode.
pub(crate) fn reduce_to_output<T: Element>(
    mode: Store,
    op: ReduceOp,
    out: &mut [T],
    a: &[T],
    b: &[T],
) {
    if mode == Store::Cached {
        return reduce_to(op, out, a, b);
    }
    let mut tmp = [<T as bytemuck::Zeroable>::zeroed(); PAIR_BLOCK];
    let blocks = out
        .chunks_mut(PAIR_BLOCK)
        .zip(a.chunks(PAIR_BLOCK).zip(b.chunks(PAIR_BLOCK)));
    for (out, (a, b)) in blocks {
        let tmp = &mut tmp[..out.len()];
        reduce_to(op, tmp, a, b);
        store(mode, out, tmp);
    }
}

/// `out = a op b` and `copy = out`, where `copy` is a slot the peer reads
/// next (Avg acts as Sum): see [`into_slot_after`] for the two ways.
pub(crate) fn reduce_to_both<T: Element>(
    mode: Store,
    op: ReduceOp,
    out: &mut [T],
    copy: &mut [T],
    a: &[T],
    b: &[T],
) {
    reduce_to_both_by(into_slot_after(mode), mode, op, out, copy, a, b);
}

/// [`reduce_to_both`], the way chosen by `after`.
pub(crate) fn reduce_to_both_by<T: Element>(
    after: bool,
    mode: Store,
    op: ReduceOp,
    out: &mut [T],
    copy: &mut [T],
    a: &[T],
    b: &[T],
) {
    debug_assert!(out.len() == copy.len() && out.len() == a.len() && out.len() == b.len());
    if after {
        reduce_to(op, out, a, b);
        copy_into_slot(copy, out);
        return;
    }
    let blocks = out
        .chunks_mut(PAIR_BLOCK)
        .zip(copy.chunks_mut(PAIR_BLOCK))
        .zip(a.chunks(PAIR_BLOCK).zip(b.chunks(PAIR_BLOCK)));
    for ((out, copy), (a, b)) in blocks {
        reduce_to(op, copy, a, b);
        store(mode, out, copy);
    }
}

/// `dst = dst op src` and `copy = dst`, where `copy` is a slot the peer
/// reads next: see [`into_slot_after`] for the two ways.
pub(crate) fn reduce_into_both<T: Element>(
    mode: Store,
    op: ReduceOp,
    dst: &mut [T],
    copy: &mut [T],
    src: &[T],
) {
    reduce_into_both_by(into_slot_after(mode), mode, op, dst, copy, src);
}

/// [`reduce_into_both`], the way chosen by `after`.
pub(crate) fn reduce_into_both_by<T: Element>(
    after: bool,
    mode: Store,
    op: ReduceOp,
    dst: &mut [T],
    copy: &mut [T],
    src: &[T],
) {
    debug_assert!(dst.len() == copy.len() && dst.len() == src.len());
    if after {
        reduce_into(op, dst, src);
        copy_into_slot(copy, dst);
        return;
    }
    let blocks = dst
        .chunks_mut(PAIR_BLOCK)
        .zip(copy.chunks_mut(PAIR_BLOCK))
        .zip(src.chunks(PAIR_BLOCK));
    for ((dst, copy), src) in blocks {
        reduce_to(op, copy, dst, src);
        store(mode, dst, copy);
    }
}

/// How a kernel that writes both the output and a slot the peer reads
/// next goes about it. True: the whole output first, then the slot from
/// it by the transport's copy into shared memory
/// (`ferroccl_transport::copy_into_shared`), where that copy is `memcpy`,
/// whose string copy writes whole lines the peer's cache holds without
/// fetching them first; and the output is written through the cache (it
/// is read again at once). False: block by block, each reduced into the
/// slot and copied from there to the output (one pass over the inputs,
/// but each store into the slot fetches its line from the peer first).
/// 2-rank allreduce, 64-512 KiB: in place 1.2-1.3x, out of place
/// 1.07-1.13x; 4 ranks 1.05-1.3x from 64 KiB.
fn into_slot_after(mode: Store) -> bool {
    mode == Store::Cached && ferroccl_transport::memcpy_keeps_pace()
}

/// `slot = src` by the transport's copy into shared memory.
fn copy_into_slot<T: Element>(slot: &mut [T], src: &[T]) {
    ferroccl_transport::copy_into_shared(bytemuck::cast_slice_mut(slot), bytemuck::cast_slice(src));
}

/// Every output `= ins[0] op ins[1] op ...` (Avg acts as Sum; a copy of
/// `ins[0]` when it is the only input), in one pass with streaming stores:
/// for large outputs that are not read soon (see `nt`). False, and
/// nothing written, where the type or the buffers do not allow it (then use
/// `reduce_to_output` and `store`).
pub(crate) fn reduce_to_streams<T: Element>(
    op: ReduceOp,
    ins: &[&[T]],
    outs: &mut [&mut [T]],
) -> bool {
    T::reduce_to_streams(op.combining(), ins, outs)
}
