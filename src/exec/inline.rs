//! Small calls all in one check-in: each rank puts its input (at most
//! `plan::inline_limit`, 4 to 16 KiB; a broadcast's root only) on its control page with
//! its announcement (up to 8 bytes in the announcement's own cache line,
//! else in the page's inline area), reads every peer's announcement, then
//! takes what it needs from the peers' pages: allreduce reduces every input
//! in rank order, reduce-scatter its block of each, reduce does so on the
//! root, allgather copies every block, broadcast the root's, all-to-all its
//! block of each. Nobody touches another rank's buffers, so there is no
//! completion wait: one exchange in all; a barrier is the check-in alone.

use super::checkin::{
    all_read, announce, entry_words, left_early, lock, read_announcement, Ctx, Deadline, Place,
    CHECKIN_SLOTS, E_SMALL, INLINE_WORDS, W_INLINE,
};
use super::io::HostIo;
use super::Call;
use crate::algo::{Operand, Prim, Step};
use crate::coll::CollKind;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::plan;
use crate::reduce::{copy, reduce_into, reduce_to, Store};
use std::sync::atomic::Ordering;

/// The smallest broadcast whose root copies its input onto its page as
/// into a slot (see `write_inline`).
const SHARED_COPY_MIN: usize = 8 << 10;

fn inline_at(turn: u64) -> usize {
    (W_INLINE + (turn % CHECKIN_SLOTS) as usize * INLINE_WORDS) * 8
}

/// Copy a small input into this rank's announcement slot of check-in
/// `turn`. A broadcast's root of at least [`SHARED_COPY_MIN`] bytes, the
/// page's one writer, copies as into a slot (`copy_into_shared`: the way
/// the calibration chose for buffers not aligned like the page): 1.6-1.8x
/// at 8-16 KiB on 2 ranks of the EPYC VM with memcpy. Where every rank
/// writes its page (allreduce, allgather, reduce-scatter) the same copy
/// lost 0.73-0.91x at 4-8 KiB, and below 8 KiB the broadcast gained
/// nothing (docs/performance-log.md, "The copy into a slot, chosen by the
/// calibration").
fn write_inline(ctx: &Ctx<'_>, turn: u64, bytes: &[u8], one_writer: bool) -> Result<()> {
    if bytes.len() <= 8 {
        let mut w = [0u8; 8];
        w[..bytes.len()].copy_from_slice(bytes);
        let words = entry_words(ctx.control.pages.words(ctx.rank), turn)?;
        words[E_SMALL].store(u64::from_ne_bytes(w), Ordering::Relaxed);
        return Ok(());
    }
    let mut own = lock(&ctx.control.own);
    own.slice_mut(inline_at(turn), bytes.len())
        .map_err(|e| Error::Io(format!("window control page: {e}")))
        .map(|slot| {
            if one_writer && bytes.len() >= SHARED_COPY_MIN {
                ferroccl_transport::copy_into_shared(slot, bytes);
            } else {
                copy(slot, bytes);
            }
        })?;
    Ok(())
}

/// Elements `off..off + len` of rank `j`'s inline input of check-in
/// `turn` (`total` elements in all); an input of at most 8 bytes is read
/// from the announcement's line into `small`.
fn peer_inline<'x, T: Element>(
    ctx: &'x Ctx<'_>,
    j: usize,
    turn: u64,
    total: usize,
    (off, len): (usize, usize),
    small: &'x mut [u64; 1],
) -> Result<&'x [T]> {
    let elem = std::mem::size_of::<T>();
    if total * elem <= 8 {
        small[0] = entry_words(ctx.control.pages.words(j), turn)?[E_SMALL].load(Ordering::Relaxed);
        let all: &[T] = bytemuck::cast_slice(&small[..]);
        return all
            .get(off..off + len)
            .ok_or_else(|| Error::Io(format!("inline input {off}+{len} of {total}")));
    }
    let raw = ctx
        .control
        .pages
        .page(j)
        .slice(inline_at(turn) + off * elem, len * elem)
        .map_err(|e| Error::Io(format!("window control page: {e}")))?;
    bytemuck::try_cast_slice(raw).map_err(|e| Error::Io(format!("window control page: {e:?}")))
}

/// `output[..len] = input_0 op input_1 op ...` over elements
/// `off..off + len` of the inline inputs of check-in `turn` (`total`
/// elements each), in rank order, so that every rank gets the same bits.
/// Every input is read from its rank's page, this rank's own too (it put
/// it there), so the output, which may be this rank's buffer (in place),
/// is no input: it is written in one pass over the first two inputs, then
/// reduced into with the others.
fn reduce_inline<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    op: ReduceOp,
    (turn, total): (u64, usize),
    off: usize,
    len: usize,
) -> Result<()> {
    let (mut s0, mut s1) = ([0u64; 1], [0u64; 1]);
    let x0 = peer_inline(ctx, 0, turn, total, (off, len), &mut s0)?;
    let out = io.output(0, len);
    if ctx.size == 1 {
        copy(out, x0);
        return Ok(());
    }
    let x1 = peer_inline(ctx, 1, turn, total, (off, len), &mut s1)?;
    reduce_to(op, out, x0, x1);
    for j in 2..ctx.size {
        let mut small = [0u64; 1];
        let x = peer_inline(ctx, j, turn, total, (off, len), &mut small)?;
        reduce_into(op, out, x);
    }
    Ok(())
}

/// A small call, all in check-in `turn`: each rank puts its input (at most
/// `plan::inline_limit`; a broadcast's root only) on its page with its
/// announcement, reads every peer's announcement, then takes what it needs
/// from the peers' pages. Nobody touches another rank's buffers, so there
/// is no completion wait: one exchange in all.
pub(super) fn run<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    call: &Call,
    in_len: usize,
    turn: u64,
    deadline: &Deadline,
) -> Result<()> {
    let fp = call.fingerprint;
    let kind = call.kind;
    let (rank, size) = (ctx.rank, ctx.size);
    let root = fp.root as usize;
    let count = fp.count as usize;
    let publishes = match kind {
        CollKind::Barrier => false,
        CollKind::Broadcast => rank == root,
        _ => true,
    };
    if publishes {
        let one_writer = kind == CollKind::Broadcast;
        write_inline(
            ctx,
            turn,
            bytemuck::cast_slice(io.input(0, in_len)),
            one_writer,
        )?;
    }
    announce(ctx, turn, call, &Place::default(), None)?;
    // A broadcast's receivers read the root's announcement alone, and the
    // root and a reduce's senders none: they leave once their input is on
    // the page, as an MPI root returns once its data is in the eager
    // buffers, and compare the announcements of the ranks that read theirs
    // later (`checkin::confirm_left`).
    let mut every = true;
    for peer in (0..size).filter(|&p| p != rank) {
        if plan::reads_inline(kind, rank, peer, root, ctx.control.early_return) {
            read_announcement(ctx, turn, peer, deadline, call)?;
        } else {
            every = false;
        }
    }
    if every {
        all_read(ctx, turn);
    }
    if plan::leaves_early(kind, rank, root, ctx.control.early_return) {
        left_early(ctx, turn);
    }
    let inputs = (turn, in_len);
    // Copy peer `j`'s elements `from` (of its input) into `to` (of the
    // output); this rank's own straight from input to output.
    let take = |io: &mut HostIo<'_, T>, j: usize, from: (usize, usize), to: usize| -> Result<()> {
        if j == rank {
            let own = Step::local(Prim::Copy, Operand::Input, from.0, to, from.1);
            io.copy_input_to_output(Store::Cached, &own);
            return Ok(());
        }
        let mut small = [0u64; 1];
        let x = peer_inline(ctx, j, turn, in_len, from, &mut small)?;
        copy(io.output(to, from.1), x);
        Ok(())
    };
    match kind {
        CollKind::AllReduce => reduce_inline(ctx, io, call.op, inputs, 0, count),
        CollKind::Reduce if rank == root => reduce_inline(ctx, io, call.op, inputs, 0, count),
        CollKind::ReduceScatter => reduce_inline(ctx, io, call.op, inputs, rank * count, count),
        CollKind::AllGather => (0..size).try_for_each(|j| take(io, j, (0, count), j * count)),
        CollKind::Broadcast => take(io, root, (0, count), 0),
        CollKind::AllToAll => {
            let block = count / size;
            (0..size).try_for_each(|j| take(io, j, (rank * block, block), j * block))
        }
        _ => Ok(()),
    }
}
