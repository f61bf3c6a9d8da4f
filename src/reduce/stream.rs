//! The fused streaming kernel: a reduction of any number of inputs written
//! to every output with streaming stores, a cache line at a time.
//!
//! Generic over the line store (`nt::line`), so `kernels` compiles it once
//! per SIMD level; the checks of the buffers and the store fence are
//! `kernels::reduce_to_streams_at`'s. x86-64 only, as the line stores are.

use super::arith::Arith;
use crate::element::ReduceOp;

/// The fused kernel: every output gets `ins[0] op ins[1] op ...` (a copy
/// of `ins[0]` when it is alone), computed a cache line at a time in
/// registers and written to each output with streaming stores (`line`), so
/// the loads of the inputs and the stores of the outputs interleave in one
/// pass. Through a buffer instead (reduce a block into L1, then stream it
/// out), a 2-process 64 MiB allreduce ran at 6.6-7.4 GB/s here; fused, at
/// 9.3-13.0 (`bench/bound/direct.c` modes 0 and 2, four turns;
/// docs/performance-history.md, "Fused streaming", 2026-11-22). The lines of
/// every output start at the same element (the caller checks that the
/// outputs lie alike against 64-byte boundaries); the elements before the
/// first boundary and after the last whole line use ordinary stores.
#[inline(always)]
pub(super) fn stream_kernel<T: Arith + bytemuck::Pod>(
    op: ReduceOp,
    ins: &[&[T]],
    outs: &mut [&mut [T]],
    line: impl Fn(&mut [u8], &crate::reduce::nt::Line),
) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => stream_lines(ins, outs, T::add, line),
        ReduceOp::Prod => stream_lines(ins, outs, T::mul, line),
        ReduceOp::Min => stream_lines(ins, outs, T::min, line),
        ReduceOp::Max => stream_lines(ins, outs, T::max, line),
    }
}

#[inline(always)]
fn stream_lines<T: Arith + bytemuck::Pod>(
    ins: &[&[T]],
    outs: &mut [&mut [T]],
    f: impl Fn(T, T) -> T,
    line: impl Fn(&mut [u8], &crate::reduce::nt::Line),
) {
    use crate::reduce::nt::LINE;
    let per_line = LINE / std::mem::size_of::<T>();
    let n = outs[0].len();
    let head = outs[0].as_ptr().align_offset(LINE).min(n);
    let end = head + (n - head) / per_line * per_line;
    let one = |i: usize| ins[1..].iter().fold(ins[0][i], |v, x| f(v, x[i]));
    for i in (0..head).chain(end..n) {
        let v = one(i);
        for out in outs.iter_mut() {
            out[i] = v;
        }
    }
    // Four lines a step (the loop's bookkeeping, bounds and the walk over
    // the outputs, is paid once per group), then the lines left one by one.
    let grouped = head + (end - head) / (4 * per_line) * (4 * per_line);
    stream_group::<T, 4>(ins, outs, head..grouped, &f, &line);
    stream_group::<T, 1>(ins, outs, grouped..end, &f, &line);
}

/// `stream_lines` over `range` (whole lines, a multiple of `G` of them),
/// `G` lines a step, computed in a buffer of `G` lines.
#[inline(always)]
fn stream_group<T: Arith + bytemuck::Pod, const G: usize>(
    ins: &[&[T]],
    outs: &mut [&mut [T]],
    range: std::ops::Range<usize>,
    f: &impl Fn(T, T) -> T,
    line: &impl Fn(&mut [u8], &crate::reduce::nt::Line),
) {
    use crate::reduce::nt::{Line, LINE};
    let span = G * LINE / std::mem::size_of::<T>();
    let mut buf = [Line::default(); G];
    for s in range.step_by(span) {
        let l: &mut [T] = bytemuck::cast_slice_mut(&mut buf);
        l.copy_from_slice(&ins[0][s..s + span]);
        for x in &ins[1..] {
            for (o, v) in l.iter_mut().zip(&x[s..s + span]) {
                *o = f(*o, *v);
            }
        }
        for out in outs.iter_mut() {
            let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut out[s..s + span]);
            for (d, b) in dst.chunks_exact_mut(LINE).zip(&buf) {
                line(d, b);
            }
        }
    }
}
