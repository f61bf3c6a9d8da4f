//! Small calls all in one check-in: each rank puts its input (at most
//! `plan::inline_limit`, 4 to 16 KiB, an all-to-all's 27 to 36 KiB; a
//! broadcast's root only; of an all-to-all or an out-of-place
//! reduce-scatter only the blocks its peers read) on its control page
//! with its announcement (up to 160 bytes in the announcement itself, up
//! to 32 of them in its first cache line with the call; else in the
//! page's inline space, `checkin::next_area`), reads every peer's announcement, then
//! takes what it needs from the peers' pages: allreduce reduces every input
//! in rank order, reduce-scatter its block of each, reduce does so on the
//! root, allgather copies every block, broadcast the root's, all-to-all its
//! block of each. Nobody touches another rank's buffers, so there is no
//! completion wait: one exchange in all; a barrier is the check-in alone.

use super::checkin::{
    all_read, announce_inline, claim_ahead, fetch_entry, heard_inline, inline_word, left_early,
    lock, next_area, page_elements, said_area, say_area, small_words, Ctx, Deadline,
    ENTRY_INPUT_BYTES, E_SMALL, INLINE_CAPACITY, SMALL_BYTES, SMALL_WORDS,
};
use super::io::HostIo;
use super::Call;
use crate::algo::{Operand, Prim, Step};
use crate::coll::CollKind;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::plan;
use crate::reduce::{copy, reduce_into, reduce_to, Store};
use std::sync::atomic::{AtomicU64, Ordering};

/// The smallest broadcast whose root copies its input onto its page as
/// into a slot (see `write_inline`).
const SHARED_COPY_MIN: usize = 8 << 10;

/// The inline inputs (up to their last published byte) that go onto the
/// page word by word, without the page's lock (see `write_inline`), and
/// the broadcasts whose ranks claim their lines of the call two check-ins
/// on (`checkin::claim_ahead`): every input over [`ENTRY_INPUT_BYTES`]
/// (which travels in the announcement) up to 4 KiB. From 33 B to 1 KiB they went
/// under the lock without claims until the small call's steps were
/// inlined (the words then measured 0.80-1.09x at 128-512 B); since, 2
/// ranks in turns, 64-512 B: broadcast 1.15-1.36x, reduce 1.04-1.17x,
/// allgather, reduce-scatter and all-to-all 1.03-1.08x, allreduce level
/// (docs/data/2026-12-02/inline-words/); a reduce's senders claiming too
/// lost (0.83-0.95x at 64 B-4 KiB). Above 4 KiB the lock's wait is a
/// small part of the copy, `memcpy`'s wide stores beat a word at a time (a
/// reduce of 8 KiB 0.81-0.84x), and claiming 128 lines lost (a broadcast
/// of 8 KiB 0.92-0.96x).
const WORDS_MIN: usize = ENTRY_INPUT_BYTES + 1;
const WORDS_MAX: usize = 4 << 10;

/// The byte of a page at byte `at` of its inline space.
fn inline_at(at: usize) -> usize {
    inline_word(at) * 8
}

/// Where this rank puts its inline input of `in_len` elements of `T` at
/// the `kind` call now starting, in its inline space (`checkin::next_area`;
/// every rank calls it in every call that may use the region), the
/// cursor moved by the input up to what such a call may put on the page
/// (`plan::inline_page_bytes`: 16 KiB but for an all-to-all on 3 to 8
/// ranks), the same on every rank.
///
/// Not by what a packed all-to-all puts there ([`packs`]): a 2-rank
/// all-to-all of 24 KiB, which writes 12 KiB, took 1.37 µs a call with
/// the cursor moved 12 KiB and 1.38 with it moved 24 KiB, against 1.16-1.24
/// with 16 KiB (in turns on the AMD EPYC VM, 2026-12-07).
pub(super) fn next_place<T>(ctx: &Ctx<'_>, kind: CollKind, turn: u64, in_len: usize) -> usize {
    let bytes = in_len * std::mem::size_of::<T>();
    next_area(
        ctx,
        turn,
        bytes.min(plan::inline_page_bytes(kind, ctx.size)),
    )
}

/// Whether an inline `kind` call of `in_len` elements of `T` packs the
/// blocks it puts on its page ([`on_page`]): an all-to-all of more than
/// `plan::INLINE_MAX_BYTES`.
#[inline(always)]
fn packs<T>(kind: CollKind, in_len: usize) -> bool {
    kind == CollKind::AllToAll && in_len * std::mem::size_of::<T>() > plan::INLINE_MAX_BYTES
}

/// Copy the `parts` of a small input (as (first element, elements); over
/// [`ENTRY_INPUT_BYTES`]: [`run_words`] takes the others) into this rank's
/// inline space at byte `area` (check-in `turn`'s), each where it lies
/// in the input.
///
/// From [`WORDS_MIN`] to [`WORDS_MAX`] bytes word by word, through the
/// page's atomics ([`store_words`]), without a lock: the page's mutex is
/// only there to hand out a `&mut` view, and its locked instructions wait
/// for the copy's stores, each to a line a peer read the last time round
/// (a cross-core round trip). Against `memcpy` under the lock, 2 ranks,
/// in turns: 0.99-1.25x at 1-4 KiB (allgather, allreduce, reduce-scatter,
/// all-to-all, broadcast; docs/performance-log.md, "Inline inputs without
/// the page's lock"), and since the small call's steps were inlined
/// 1.03-1.36x at 64-512 B (see [`WORDS_MIN`]).
///
/// Otherwise under the lock; a broadcast's root of at least
/// [`SHARED_COPY_MIN`] bytes, the page's one writer, copies as into a
/// slot (`copy_into_shared`: the way the calibration chose for buffers not
/// aligned like the page): 1.6-1.8x at 8-16 KiB on 2 ranks of the EPYC VM
/// with memcpy. Where every rank writes its page (allreduce, allgather,
/// reduce-scatter) the same copy lost 0.73-0.91x at 4-8 KiB, and below 8
/// KiB the broadcast gained nothing (docs/performance-log.md, "The copy
/// into a slot, chosen by the calibration").
fn write_inline<T: Element>(
    ctx: &Ctx<'_>,
    (turn, area): (u64, usize),
    io: &HostIo<'_, T>,
    parts: [Part; 2],
    one_writer: bool,
) -> Result<()> {
    let elem = std::mem::size_of::<T>();
    let end = |at: fn(&Part) -> usize| parts.iter().map(|p| at(p) + p.len).max().unwrap_or(0);
    // The area of one check-in ends where the next one's begins: nothing
    // may be written past it.
    if end(|p| p.at) * elem > INLINE_CAPACITY {
        return Err(Error::Io(format!(
            "window control page: an inline input of {} bytes does not fit the {INLINE_CAPACITY} \
             bytes of check-in {turn}'s area",
            end(|p| p.at) * elem
        )));
    }
    let end = end(|p| p.from);
    // Word by word only where every part lies on the page as in the input
    // (`on_page` moves none of an input this small).
    if (WORDS_MIN..=WORDS_MAX).contains(&(end * elem)) && parts.iter().all(|p| p.at == p.from) {
        let input: &[u8] = bytemuck::cast_slice(io.input(0, end));
        let area = inline_word(area);
        let page = ctx.control.pages.words(ctx.rank);
        for Part { from, len, .. } in parts.into_iter().filter(|p| p.len > 0) {
            let words = (from * elem / 8, ((from + len) * elem).div_ceil(8));
            let at = page
                .get(area + words.0..area + words.1)
                .ok_or_else(|| {
                    Error::Io(format!(
                        "window control page: inline part {from}+{len} of check-in {turn} lies outside it"
                    ))
                })?;
            store_words(at, input, words.0);
        }
        return Ok(());
    }
    let mut own = lock(&ctx.control.own);
    for Part { from, len, at } in parts.into_iter().filter(|p| p.len > 0) {
        let bytes: &[u8] = bytemuck::cast_slice(io.input(from, len));
        let slot = own
            .slice_mut(inline_at(area) + at * elem, bytes.len())
            .map_err(|e| Error::Io(format!("window control page: {e}")))?;
        if one_writer && bytes.len() >= SHARED_COPY_MIN {
            ferroccl_transport::copy_into_shared(slot, bytes);
        } else {
            copy(slot, bytes);
        }
    }
    Ok(())
}

/// Store into `words` the input's 8-byte words `first..first + words.len()`
/// (word k is `input[8k..8k + 8]`, zero-padded past the input's end), with
/// relaxed stores: the announcement's Release store publishes them. A part
/// that starts or ends inside a word also writes the input's bytes beside
/// it there, which are where they lie in the input too; no peer reads them
/// as this rank's part.
fn store_words(words: &[AtomicU64], input: &[u8], first: usize) {
    let whole = input.len() / 8;
    let (mut k, end) = (first, first + words.len());
    for (w, c) in words.iter().zip(
        input
            .get(8 * first.min(whole)..8 * whole.min(end))
            .unwrap_or(&[])
            .chunks_exact(8),
    ) {
        w.store(
            u64::from_ne_bytes(c.try_into().unwrap_or([0; 8])),
            Ordering::Relaxed,
        );
        k += 1;
    }
    if k < end {
        let mut last = [0u8; 8];
        let tail = input.get(8 * k..).unwrap_or(&[]);
        let n = tail.len().min(8);
        last[..n].copy_from_slice(&tail[..n]);
        words[k - first].store(u64::from_ne_bytes(last), Ordering::Relaxed);
    }
}

/// A part of a rank's inline input: elements `from..from + len` of the
/// input, at element `at` of its inline area ([`on_page`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Part {
    from: usize,
    len: usize,
    at: usize,
}

/// The parts of this rank's input that an inline `kind` call of `in_len`
/// elements of `T` reads off its page: an all-to-all's blocks but its
/// own, and an out-of-place reduce-scatter's (peer `j` reads block `j`;
/// this rank takes its own from its buffer), the whole input otherwise
/// (in place a reduce-scatter reads its own block off the page too, its
/// buffer being the output); on 2 ranks half the bytes written, and half
/// the lines taken back from the peer that read them the call before.
/// Each lies on the page where [`on_page`] puts it.
fn published_parts<T>(
    kind: CollKind,
    (rank, size): (usize, usize),
    in_len: usize,
    in_place: bool,
) -> [Part; 2] {
    let part = |from: usize, len: usize| Part {
        from,
        len,
        at: on_page::<T>(kind, (rank, size), in_len, from),
    };
    match kind {
        CollKind::ReduceScatter | CollKind::AllToAll
            if size > 1 && !(in_place && kind == CollKind::ReduceScatter) =>
        {
            let block = in_len / size;
            let after = (rank + 1) * block;
            [part(0, rank * block), part(after, in_len - after)]
        }
        _ => [part(0, in_len), part(in_len, 0)],
    }
}

/// Where element `from` of rank `owner`'s input lies in its inline area
/// (in elements from the area's start) in an inline `kind` call whose
/// inputs have `in_len` elements of `T` (every rank's alike, so each
/// rank tells where a peer put a part as that peer did): where it lies in
/// the input, but in an all-to-all whose input is larger than
/// `plan::INLINE_MAX_BYTES` (up to `size / (size - 1)` times the area on
/// 2 to 8 ranks, `plan::host::alltoall_inline_bytes`) the blocks
/// after the owner's own, which it keeps to itself, move down one block:
/// what it puts on its page, `(size - 1) / size` of its input, then
/// fills the area from its start. Inputs that small never travel word by
/// word ([`WORDS_MAX`]), so the move needs no word alignment. Above 16
/// KiB whatever the page's capacity (24 KiB since an all-to-all on 3 to
/// 8 ranks may put that much there): the 2-rank limit was measured
/// packed from 16 KiB ([`packs`]).
#[inline(always)]
fn on_page<T>(kind: CollKind, (owner, size): (usize, usize), in_len: usize, from: usize) -> usize {
    let block = in_len / size.max(1);
    if packs::<T>(kind, in_len) && from >= (owner + 1) * block {
        from - block
    } else {
        from
    }
}

/// Elements `off..off + len` of rank `j`'s inline input of check-in
/// `turn` (over [`ENTRY_INPUT_BYTES`]: [`run_words`] takes the others),
/// where `j` said it lies (`checkin::said_area`).
fn peer_inline<'x, T: Element>(
    ctx: &'x Ctx<'_>,
    (j, turn): (usize, u64),
    (off, len): (usize, usize),
    call: &Call,
) -> Result<&'x [T]> {
    let elem = std::mem::size_of::<T>();
    let area = said_area(ctx, (j, turn), (off + len) * elem, call)?;
    page_elements(ctx, j, inline_at(area) + off * elem, len)
}

/// `output[..len] = input_0 op input_1 op ...` over elements
/// `off..off + len` of the inline inputs of check-in `turn`, in rank
/// order, so that every rank gets the same bits. This rank's own input
/// comes from its buffer out of place, and in an allreduce in place
/// ([`reduce_over_own`]); else from its page, where it put it.
///
/// An allreduce in place read it off the page until 2026-12-06, and took
/// 1.3-1.9x as long as out of place at 8-16 KiB on 2 ranks (likely
/// because its peer reads those lines at the same time; not measured
/// apart). Out of its buffer, in turns, 2 ranks:
/// 1.43-1.65x faster in place at 8-16 KiB. A reduce's root, whose page no
/// peer reads, measured 0.65-0.90x that way from 512 B to 16 KiB, and a
/// reduce-scatter level (0.91-1.19x), so both keep the page
/// (docs/performance-log.md, "An allreduce in place takes its own input
/// from its buffer").
fn reduce_inline<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    call: &Call,
    turn: u64,
    (off, len): (usize, usize),
) -> Result<()> {
    let op = call.op;
    let page = |j: usize| peer_inline(ctx, (j, turn), (off, len), call);
    match io {
        // Out of place this rank's own input comes from its buffer: its
        // page's lines, just written, may still be on their way back from
        // a peer that read them.
        HostIo::OutOfPlace { input, output } => {
            let own = &input[off..off + len];
            let rank = ctx.rank;
            reduce_ranks(&mut output[..len], op, ctx.size, |j| {
                if j == rank {
                    Ok(own)
                } else {
                    page(j)
                }
            })
        }
        HostIo::InPlace {
            input_base,
            output_base,
            ..
        } if call.kind == CollKind::AllReduce && *input_base + off == *output_base => {
            reduce_over_own(io.output(0, len), op, (ctx.rank, ctx.size), page)
        }
        io => reduce_ranks(io.output(0, len), op, ctx.size, page),
    }
}

/// Bytes of the copy of this rank's input that [`reduce_over_own`] takes
/// at a time: a block that stays in L1.
const OWN_BLOCK_BYTES: usize = 4 << 10;

/// [`reduce_ranks`] where `out` holds this rank's own input (`x(rank)` is
/// not called): block by block, the block of `out` is copied aside
/// (into L1) and stands for the own input, so the result has the bits of
/// [`reduce_ranks`] over the same inputs, every op and type alike. On
/// more than `plan::host::INLINE_WIDE_MAX_RANKS` ranks, `x(rank)` is read as
/// the others are.
fn reduce_over_own<'x, T: Element>(
    out: &mut [T],
    op: ReduceOp,
    (rank, size): (usize, usize),
    x: impl Fn(usize) -> Result<&'x [T]>,
) -> Result<()> {
    if size > plan::host::INLINE_WIDE_MAX_RANKS {
        return reduce_ranks(out, op, size, x);
    }
    let total = out.len();
    let mut inputs: [&[T]; plan::host::INLINE_WIDE_MAX_RANKS] =
        [&[]; plan::host::INLINE_WIDE_MAX_RANKS];
    for (j, input) in inputs.iter_mut().enumerate().take(size) {
        if j != rank {
            *input = x(j)?;
            if input.len() != total {
                return Err(Error::Io(format!(
                    "inline reduce: rank {j}'s input has {} elements, not {total}",
                    input.len()
                )));
            }
        }
    }
    let mut aside = [0u64; OWN_BLOCK_BYTES / 8];
    let per = OWN_BLOCK_BYTES / std::mem::size_of::<T>().max(1);
    let mut start = 0;
    while start < total {
        let n = per.min(total - start);
        let own: &mut [T] = &mut bytemuck::cast_slice_mut(&mut aside)[..n];
        let block = &mut out[start..start + n];
        copy(own, block);
        let own: &[T] = own;
        reduce_ranks(block, op, size, |j| {
            Ok(if j == rank {
                own
            } else {
                &inputs[j][start..start + n]
            })
        })?;
        start += n;
    }
    Ok(())
}

/// `out = x(0) op x(1) op ...` over the `size` ranks' inputs `x(j)`, in
/// rank order, written in one pass over the first two, then reduced into
/// with the others.
pub(super) fn reduce_ranks<'x, T: Element>(
    out: &mut [T],
    op: ReduceOp,
    size: usize,
    x: impl Fn(usize) -> Result<&'x [T]>,
) -> Result<()> {
    let x0 = x(0)?;
    if size == 1 {
        copy(out, x0);
        return Ok(());
    }
    reduce_to(op, out, x0, x(1)?);
    for j in 2..size {
        reduce_into(op, out, x(j)?);
    }
    Ok(())
}

/// Whether `rank` puts its input on its page in an inline `kind` call of
/// root `root`: every rank but a barrier's and a broadcast's receivers.
fn publishes(kind: CollKind, rank: usize, root: usize) -> bool {
    match kind {
        CollKind::Barrier => false,
        CollKind::Broadcast => rank == root,
        _ => true,
    }
}

/// A small call, all in check-in `turn`: each rank puts its input (at most
/// `plan::inline_limit`; a broadcast's root only) on its page with its
/// announcement, reads every peer's announcement, then takes what it needs
/// from the peers' pages. Nobody touches another rank's buffers, so there
/// is no completion wait: one exchange in all.
///
/// For an input over [`ENTRY_INPUT_BYTES`], through the page's inline
/// area: the smaller ones travel in the announcement ([`run_words`]; up to
/// [`SMALL_BYTES`] `checked_in::run` calls it itself, inlined into the
/// blocking call, where the others stay out of line), and every rank
/// decides by [`in_words`] and [`in_entry`] alike.
///
/// Before it waits for a peer's announcement, a rank asks for the lines
/// of that peer's input it will read (`fetch_ahead`): read only after the
/// announcement's line had come, each was a second cross-core transfer
/// after the first. 2 ranks, in turns: reduce 1.28-1.43x at 256 B-4 KiB,
/// broadcast 1.12-1.45x at 256 B-1 KiB, allgather and reduce-scatter
/// 1.02-1.07x at 256-512 B, allreduce level
/// (docs/data/2026-12-02/entry-lines/).
/// Except in a reduce, only up to [`FETCH_ANY_MAX`] bytes of a peer.
pub(super) fn run<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    call: &Call,
    in_len: usize,
    turn: u64,
    deadline: &Deadline,
) -> Result<()> {
    debug_assert!(!in_entry::<T>(in_len), "run_words takes this call");
    let fp = call.fingerprint;
    let kind = call.kind;
    let (rank, size) = (ctx.rank, ctx.size);
    let root = fp.root as usize;
    // Out of place a reduce's root takes its own input from its buffer
    // (`reduce_inline`): nobody reads it off its page (about 210 of its
    // 1,370 instructions a call at 128 B).
    let own_unread =
        kind == CollKind::Reduce && rank == root && matches!(io, HostIo::OutOfPlace { .. });
    // Every rank moves its cursor, whether it puts its input there or not.
    let area = next_place::<T>(ctx, kind, turn, in_len);
    if publishes(kind, rank, root) && !own_unread {
        publish(ctx, io, kind, in_len, (turn, area))?;
    }
    let own = announce_inline(ctx, turn, call, &[])?;
    // A broadcast's receivers read the root's announcement alone, and the
    // root and a reduce's senders none: they leave once their input is on
    // the page, as an MPI root returns once its data is in the eager
    // buffers, and compare the announcements of the ranks that read theirs
    // later (`checkin::confirm_left`).
    let mut every = true;
    if let Some(part) = part_read(kind, rank, size, fp.count as usize).filter(|&(_, len)| {
        kind == CollKind::Reduce || len * std::mem::size_of::<T>() <= FETCH_ANY_MAX
    }) {
        for peer in (0..size).filter(|&p| p != rank) {
            if plan::reads_inline(kind, rank, peer, root, ctx.control.early_return) {
                let at = on_page::<T>(kind, (peer, size), in_len, part.0);
                fetch_ahead::<T>(ctx, peer, area, (at, part.1));
            }
        }
    }
    for peer in (0..size).filter(|&p| p != rank) {
        if plan::reads_inline(kind, rank, peer, root, ctx.control.early_return) {
            heard_inline(ctx, (turn, peer), own, deadline, call)?;
        } else {
            every = false;
        }
    }
    read_all(ctx, call, turn, every);
    if rooted_early(ctx, kind) {
        let bytes = in_len * std::mem::size_of::<T>();
        if (WORDS_MIN..=WORDS_MAX).contains(&bytes) {
            let published = if kind == CollKind::Broadcast && rank == root {
                bytes
            } else {
                0
            };
            claim_ahead(ctx, turn, 1, published);
        }
    }
    take_all(ctx, io, call, turn)
}

/// The elements (first, count) of each peer's input that this rank takes
/// in an inline `kind` call of `count` elements (what [`take_all`] takes,
/// and [`fetch_ahead`] asks for), if any: all of it, or in a
/// reduce-scatter and an all-to-all its block.
#[inline(always)]
fn part_read(kind: CollKind, rank: usize, size: usize, count: usize) -> Option<(usize, usize)> {
    match kind {
        CollKind::AllReduce | CollKind::Reduce | CollKind::AllGather | CollKind::Broadcast => {
            Some((0, count))
        }
        CollKind::ReduceScatter => Some((rank * count, count)),
        CollKind::AllToAll => Some((rank * (count / size), count / size)),
        _ => None,
    }
}

/// Lines of a peer's inline input fetched ahead at most ([`fetch_ahead`]).
const FETCH_LINES: usize = 16;

/// The largest part of a peer's input fetched ahead ([`fetch_ahead`]) in
/// calls other than a reduce. Where the ranks meet (an allreduce, an
/// allgather), a rank that comes first takes the lines from the peer
/// about to write them; from 1 KiB that lost, 2 ranks in turns:
/// allreduce and allgather 0.90-0.94x at 1-4 KiB. A reduce's root, which
/// its senders run ahead of, gained at every size (1.15-1.4x at 1-4 KiB).
const FETCH_ANY_MAX: usize = 512;

/// Ask for the lines of `part` of peer `j`'s inline input of this call
/// (at most [`FETCH_LINES`]) before waiting for its announcement
/// (`ferroccl_transport::prefetch_for_read`): where the peer is there
/// already, they come in parallel with the announcement's line. `area`:
/// where this rank put its own input, and so where the peer put its
/// (`checkin::next_area`); a peer that said otherwise is read where it
/// said, and the lines asked for here are only wasted.
#[inline(always)]
fn fetch_ahead<T>(ctx: &Ctx<'_>, j: usize, area: usize, (off, len): (usize, usize)) {
    let elem = std::mem::size_of::<T>();
    let page = ctx.control.pages.words(j);
    let first = inline_word(area) + off * elem / 8;
    let words = (len * elem).div_ceil(8).min(FETCH_LINES * 8);
    for w in page
        .get(first..first + words)
        .unwrap_or(&[])
        .iter()
        .step_by(8)
    {
        ferroccl_transport::prefetch_for_read(w);
    }
}

/// Put this rank's input of an inline `kind` call (`in_len` elements) on
/// its page at check-in `turn`, the parts its peers read, at byte `area`
/// of its inline space ([`next_place`]), and say there in its
/// announcement (made after this) that it lies there.
pub(super) fn publish<T: Element>(
    ctx: &Ctx<'_>,
    io: &HostIo<'_, T>,
    kind: CollKind,
    in_len: usize,
    (turn, area): (u64, usize),
) -> Result<()> {
    let in_place = matches!(io, HostIo::InPlace { .. });
    let parts = published_parts::<T>(kind, (ctx.rank, ctx.size), in_len, in_place);
    write_inline(ctx, (turn, area), io, parts, kind == CollKind::Broadcast)?;
    say_area(ctx, turn, area)
}

/// The inline exchange's second half: once every peer this rank reads has
/// announced check-in `turn` (its input on its page before that), take
/// what this rank needs from the peers' pages into its output.
pub(super) fn take_all<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    call: &Call,
    turn: u64,
) -> Result<()> {
    let fp = call.fingerprint;
    let kind = call.kind;
    let (rank, size) = (ctx.rank, ctx.size);
    let root = fp.root as usize;
    // The part of each input this rank takes, as `fetch_ahead` asked for.
    let count = fp.count as usize;
    let Some(part @ (_, len)) = part_read(kind, rank, size, count) else {
        return Ok(());
    };
    let in_len = kind.extents(count, size).0;
    // Copy peer `j`'s elements `from` (of its input) into `to` (of the
    // output); this rank's own straight from input to output.
    let take = |io: &mut HostIo<'_, T>, j: usize, from: (usize, usize), to: usize| -> Result<()> {
        if j == rank {
            let own = Step::local(Prim::Copy, Operand::Input, from.0, to, from.1);
            io.copy_input_to_output(Store::Cached, &own);
            return Ok(());
        }
        let at = on_page::<T>(kind, (j, size), in_len, from.0);
        let x = peer_inline(ctx, (j, turn), (at, from.1), call)?;
        if in_streams(kind, from.1 * std::mem::size_of::<T>()) {
            ferroccl_transport::copy_streams(
                bytemuck::cast_slice_mut(io.output(to, from.1)),
                bytemuck::cast_slice(x),
            );
        } else {
            copy(io.output(to, from.1), x);
        }
        Ok(())
    };
    match kind {
        CollKind::AllReduce | CollKind::ReduceScatter => reduce_inline(ctx, io, call, turn, part),
        CollKind::Reduce if rank == root => reduce_inline(ctx, io, call, turn, part),
        // Each peer's part to its place in the output.
        CollKind::AllGather | CollKind::AllToAll => {
            (0..size).try_for_each(|j| take(io, j, part, j * len))
        }
        CollKind::Broadcast => take(io, root, part, 0),
        _ => Ok(()),
    }
}

/// The smallest block of a peer's inline input that an allgather or
/// all-to-all takes in eight streams (`ferroccl_transport::copy_streams`)
/// rather than line after line: read as one stream out of the peer's
/// cache, its lines come one miss at a time. On 2 ranks of the AMD EPYC
/// VM, in turns (`bench/ab.sh`, gated, 4-6 turns): the allgather of 32 KiB
/// gathered (16 KiB blocks) 1.13-1.15x out of place and 1.20-1.25x in
/// place, of 20, 24 and 28 KiB gathered 1.05-1.13x; the all-to-all of 32
/// KiB 1.12-1.32x, of 20-28 KiB level (0.97-1.02x); blocks of 8 KiB level
/// (1.00-1.04x), 4 ranks on the 2 CPUs level (1.02x at 64 KiB gathered),
/// and a broadcast's receiver, which reads after its root has left, 0.94x
/// at 16 KiB in place within the noise (docs/performance-log.md, "A
/// peer's inline block read in eight streams"). The largest block an
/// inline call puts on a page is 16 KiB (an allgather's whole input, a
/// 2-rank all-to-all's half).
const STREAMS_MIN_BYTES: usize = 10 << 10;

/// Whether a peer's block of `bytes` in an inline `kind` call goes by
/// [`ferroccl_transport::copy_streams`] ([`STREAMS_MIN_BYTES`]).
#[inline(always)]
fn in_streams(kind: CollKind, bytes: usize) -> bool {
    matches!(kind, CollKind::AllGather | CollKind::AllToAll) && bytes >= STREAMS_MIN_BYTES
}

/// Whether the ranks of an inline `kind` call do not wait for each other
/// (a broadcast or reduce, where `plan::leaves_early` lets its root or
/// senders leave): then every rank of one whose input travels in its
/// announcement's line claims that line two check-ins on
/// (`checkin::claim_ahead`; [`run`] claims for a broadcast alone).
#[inline(always)]
fn rooted_early(ctx: &Ctx<'_>, kind: CollKind) -> bool {
    ctx.control.early_return && matches!(kind, CollKind::Broadcast | CollKind::Reduce)
}

/// After the announcements a rank reads in an inline call (`every`: all
/// its peers'): note that, or that it left the call early.
#[inline(always)]
fn read_all(ctx: &Ctx<'_>, call: &Call, turn: u64, every: bool) {
    if every {
        all_read(ctx, turn);
    }
    let root = call.fingerprint.root as usize;
    if plan::leaves_early(call.kind, ctx.rank, root, ctx.control.early_return) {
        left_early(ctx, turn);
    }
}

/// Elements `from..from + len` of an input that travelled in the
/// announcement's line.
fn elems<T: Element, const N: usize>(words: &[u64; N], from: usize, len: usize) -> &[T] {
    &bytemuck::cast_slice::<u64, T>(words)[from..from + len]
}

/// Whether an input of `in_len` elements travels in its announcement's
/// first line ([`run_words`] with [`SMALL_WORDS`]): at most
/// [`SMALL_BYTES`], of elements of at most 8 bytes.
#[inline(always)]
pub(super) fn in_words<T>(in_len: usize) -> bool {
    let elem = std::mem::size_of::<T>();
    elem <= 8 && in_len * elem <= SMALL_BYTES
}

/// Whether an input of `in_len` elements travels in its announcement
/// ([`run_words`]): at most [`ENTRY_INPUT_BYTES`], of elements of at most
/// 8 bytes.
#[inline(always)]
pub(super) fn in_entry<T>(in_len: usize) -> bool {
    let elem = std::mem::size_of::<T>();
    elem <= 8 && in_len * elem <= ENTRY_INPUT_BYTES
}

/// The inline call of an input of at most `N` words (a whole
/// reduce-scatter's, an all-to-all's): each rank's input travels in its
/// announcement (`checkin::announce_inline`). With `N` [`SMALL_WORDS`]
/// (up to [`SMALL_BYTES`]) a peer's announcement and input are one line
/// (`checkin::heard_inline`, `checkin::small_words`); with
/// `checkin::ENTRY_INPUT_WORDS` (up to [`ENTRY_INPUT_BYTES`]) the lines
/// after it come in parallel with it (`checkin::fetch_entry`), and a rank
/// that runs ahead claims them all.
#[inline(always)]
pub(super) fn run_words<T: Element, const N: usize>(
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
    let n = (in_len * std::mem::size_of::<T>()).div_ceil(8);
    let mut mine = [0u64; N];
    let puts = publishes(kind, rank, root);
    if puts {
        bytemuck::cast_slice_mut::<u64, T>(&mut mine)[..in_len]
            .copy_from_slice(io.input(0, in_len));
    }
    let own = announce_inline(ctx, turn, call, if puts { &mine[..n] } else { &[] })?;
    // Who reads whom as in `run`. (The loop and the match below repeat
    // `run`'s: shared through helpers taking closures they measured
    // 0.91-0.98x at 8-32 B on 2 ranks, 0.96-1.01x forced inline;
    // docs/performance-log.md, "A leaner small call".)
    let mut every = true;
    if N > SMALL_WORDS && n > SMALL_WORDS {
        for peer in (0..size).filter(|&p| p != rank) {
            if plan::reads_inline(kind, rank, peer, root, ctx.control.early_return) {
                fetch_entry(ctx, peer, turn, n);
            }
        }
    }
    for peer in (0..size).filter(|&p| p != rank) {
        if plan::reads_inline(kind, rank, peer, root, ctx.control.early_return) {
            heard_inline(ctx, (turn, peer), own, deadline, call)?;
        } else {
            every = false;
        }
    }
    read_all(ctx, call, turn, every);
    if rooted_early(ctx, kind) {
        let lines = if puts { (E_SMALL + n).div_ceil(8) } else { 1 };
        claim_ahead(ctx, turn, lines, 0);
    }
    let words = Words {
        ctx,
        turn,
        mine: &mine,
        n,
    };
    match kind {
        CollKind::AllReduce => words.reduce(io, call.op, (0, count)),
        CollKind::Reduce if rank == root => words.reduce(io, call.op, (0, count)),
        CollKind::ReduceScatter => words.reduce(io, call.op, (rank * count, count)),
        CollKind::AllGather => (0..size).try_for_each(|j| words.take(io, j, (0, count), j * count)),
        // The root's buffer holds its input already.
        CollKind::Broadcast if rank == root && io.in_place_at_one_place() => Ok(()),
        CollKind::Broadcast => words.take(io, root, (0, count), 0),
        CollKind::AllToAll => {
            let block = count / size;
            (0..size).try_for_each(|j| words.take(io, j, (rank * block, block), j * block))
        }
        _ => Ok(()),
    }
}

/// The inputs of a call whose inputs travel in the announcements
/// ([`run_words`]), each rank's as words. Functions, not closures, so
/// that they are inlined into the blocking call (a closure called from
/// several arms stayed a call of its own: 50-75 of an 8-byte call's
/// instructions).
struct Words<'c, 'p, const N: usize> {
    ctx: &'c Ctx<'p>,
    turn: u64,
    /// This rank's own input words.
    mine: &'c [u64; N],
    /// Words of every rank's input.
    n: usize,
}

impl<const N: usize> Words<'_, '_, N> {
    /// Rank `j`'s input words; this rank's own from its copy, not from
    /// its page: a load from the line it has just written waits until the
    /// line is this core's again (the peer reading it took it), a
    /// cross-core round trip (0.90-0.94x at 8 B on 2 ranks).
    #[inline(always)]
    fn of(&self, j: usize) -> Result<[u64; N]> {
        if j == self.ctx.rank {
            Ok(*self.mine)
        } else {
            small_words(self.ctx, j, self.turn, self.n)
        }
    }

    /// The output's first `len` elements: every rank's elements `off..off
    /// + len` reduced by `op`, in rank order.
    #[inline(always)]
    fn reduce<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        op: ReduceOp,
        (off, len): (usize, usize),
    ) -> Result<()> {
        let out = io.output(0, len);
        let first = self.of(0)?;
        if self.ctx.size == 1 {
            copy(out, elems(&first, off, len));
            return Ok(());
        }
        let second = self.of(1)?;
        reduce_to(op, out, elems(&first, off, len), elems(&second, off, len));
        for j in 2..self.ctx.size {
            let x = self.of(j)?;
            reduce_into(op, out, elems(&x, off, len));
        }
        Ok(())
    }

    /// Elements `from..from + len` of rank `j`'s input into the output at
    /// `to`.
    #[inline(always)]
    fn take<T: Element>(
        &self,
        io: &mut HostIo<'_, T>,
        j: usize,
        (from, len): (usize, usize),
        to: usize,
    ) -> Result<()> {
        let w = self.of(j)?;
        // At most `ENTRY_INPUT_BYTES`: a plain copy (the transport's, for
        // any alignment, is a call of its own).
        io.output(to, len).copy_from_slice(elems(&w, from, len));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::checkin::{
        inline_place, said_area, say_area, CHECKIN_SLOTS, INLINE_REGION, INLINE_SPACE, INLINE_STEP,
    };
    use super::{on_page, published_parts, store_words, INLINE_CAPACITY};
    use crate::coll::CollKind;
    use crate::element::ReduceOp;
    use crate::error::Error;
    use crate::exec::Call;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    /// Inline inputs of any sizes up to the largest go one after the
    /// other, each on a page boundary and wholly inside the region, and a
    /// byte of the region is written again only after more than
    /// `CHECKIN_SLOTS` inputs came after the one that wrote it: by then
    /// every peer is done with that one's check-in (`checkin::free_slot`).
    #[test]
    fn inline_inputs_move_along_the_region_and_reuse_it_only_after_every_slot_turned() {
        // Sizes from a fixed pseudo-random sequence, with runs of the
        // largest and the smallest.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut sizes = Vec::new();
        for k in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            sizes.push(match (k / 500) % 3 {
                0 => 161 + (x as usize) % (INLINE_CAPACITY - 160),
                1 => INLINE_CAPACITY,
                _ => 161 + (x as usize) % 4096,
            });
        }
        // The input that last wrote each step of the region.
        let mut writer = vec![usize::MAX; INLINE_REGION / INLINE_STEP];
        let mut end = 0;
        let mut wrapped = 0;
        for (k, &bytes) in sizes.iter().enumerate() {
            let at = inline_place(end, bytes);
            assert_eq!(at % INLINE_STEP, 0, "input {k}");
            assert!(at + bytes <= INLINE_REGION, "input {k} of {bytes} at {at}");
            if at < end {
                wrapped += 1;
            } else {
                assert_eq!(at, end.next_multiple_of(INLINE_STEP), "input {k}");
            }
            let steps = at / INLINE_STEP..(at + bytes).div_ceil(INLINE_STEP);
            for (last, step) in writer[steps.clone()].iter_mut().zip(steps) {
                assert!(
                    *last == usize::MAX || k - *last > CHECKIN_SLOTS as usize,
                    "input {k} writes step {step}, which input {last} wrote"
                );
                *last = k;
            }
            end = at + bytes;
        }
        assert!(
            wrapped > 10,
            "the sequence went round the region {wrapped} times"
        );
    }

    fn call_for_test() -> Call {
        Call {
            kind: CollKind::AllGather,
            fingerprint: ferroccl_transport::Fingerprint {
                seq: 3,
                coll: CollKind::AllGather.code(),
                dtype: 0,
                op: 0,
                count: 64,
                root: 0,
            },
            order: 3,
            op: ReduceOp::Sum,
            timeout: Duration::from_secs(5),
            nt_store_bytes: 0,
            place_below: 0,
        }
    }

    /// Where a peer says its inline input lies is read from the wire, as
    /// it were: a place whose input would pass the end of its inline
    /// space (or the address space) is a protocol error that names the
    /// peer, and one that fits is taken as said.
    #[test]
    fn an_inline_input_said_to_lie_past_the_region_is_a_protocol_error_naming_the_peer() {
        // Check-ins far from the ones the calls below take.
        let places = [INLINE_SPACE - 4096, INLINE_SPACE - 64, usize::MAX];
        let turn = |k: usize| 20 + k as u64;
        crate::testing::run_ranks(2, |comm| {
            // A small call makes the control pages.
            let mut out = [0u64; 2];
            comm.all_gather(&[comm.rank() as u64], &mut out).unwrap();
            assert_eq!(out, [0, 1]);
            if comm.rank() == 0 {
                comm.with_control_for_test(|ctx| {
                    for (k, &place) in places.iter().enumerate() {
                        say_area(ctx, turn(k), place).unwrap();
                    }
                })
                .expect("2 ranks of one process share control pages");
            }
            // Its stores before rank 1's loads.
            comm.barrier().unwrap();
            if comm.rank() == 1 {
                comm.with_control_for_test(|ctx| {
                    for (k, &place) in places.iter().enumerate() {
                        let said = said_area(ctx, (0, turn(k)), 4096, &call_for_test());
                        if place
                            .checked_add(4096)
                            .is_some_and(|end| end <= INLINE_SPACE)
                        {
                            assert_eq!(said.unwrap(), place);
                        } else {
                            match said {
                                Err(Error::Protocol {
                                    peer: 0, detail, ..
                                }) => {
                                    assert!(detail.contains("inline space"), "{detail}")
                                }
                                other => panic!("place {place}: {other:?}"),
                            }
                        }
                    }
                })
                .expect("2 ranks of one process share control pages");
            }
        });
    }

    /// Where the ranks' cursors disagree (as after a mismatch, where the
    /// ranks had run different calls), each reads the others' inputs where
    /// they said they put them, not where its own cursor would put them:
    /// every inline collective still gives the reference result.
    #[test]
    fn ranks_whose_inline_cursors_disagree_read_each_input_where_it_was_said_to_lie() {
        crate::testing::run_ranks(2, |comm| {
            let (rank, n) = (comm.rank(), comm.size());
            comm.barrier().unwrap();
            // Rank 1's cursor 7 steps on: until the region wraps, every
            // input of it lies elsewhere than rank 0 expects.
            let ends = [0, 7 * INLINE_STEP];
            comm.with_control_for_test(|ctx| {
                ctx.control
                    .inline_end
                    .store(ends[rank] as u64, Ordering::Relaxed);
            })
            .expect("control pages");
            for count in [40usize, 128, 1000, 2048] {
                let value = |r: usize, i: usize| (r * 1_000_003 + i * 7) as u64;
                let input: Vec<u64> = (0..count).map(|i| value(rank, i)).collect();
                let mut out = vec![0u64; count * n];
                comm.all_gather(&input, &mut out).unwrap();
                for (k, &got) in out.iter().enumerate() {
                    assert_eq!(
                        got,
                        value(k / count, k % count),
                        "all_gather {count} at {k}"
                    );
                }
                let mut sum = vec![0u64; count];
                comm.all_reduce(&input, &mut sum, ReduceOp::Sum).unwrap();
                for (i, &got) in sum.iter().enumerate() {
                    assert_eq!(got, value(0, i) + value(1, i), "all_reduce {count} at {i}");
                }
                let mut buf = if rank == 1 {
                    input.clone()
                } else {
                    vec![0; count]
                };
                comm.broadcast(&mut buf, 1).unwrap();
                assert!(
                    buf.iter().enumerate().all(|(i, &v)| v == value(1, i)),
                    "broadcast {count}"
                );
                let mut mine = vec![0u64; count];
                comm.all_to_all(&input, &mut mine).unwrap();
                let half = count / n;
                for (k, &got) in mine.iter().enumerate() {
                    assert_eq!(
                        got,
                        value(k / half, rank * half + k % half),
                        "all_to_all {count}"
                    );
                }
            }
            // Every call of over 512 bytes went through the region (its
            // cursor moved), each rank's from where it was set.
            comm.with_control_for_test(|ctx| {
                let end = ctx.control.inline_end.load(Ordering::Relaxed) as usize;
                assert!(end > ends[rank], "rank {rank}: the cursor stayed at {end}");
            })
            .expect("control pages");
        });
    }

    /// Every byte of a part lands where it lies in the input, for parts
    /// that start and end inside words and inputs that end inside one;
    /// words outside the part's are not touched.
    #[test]
    fn store_words_puts_each_byte_of_a_part_where_it_lies_in_the_input() {
        for len in 1..=40usize {
            let input: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            for b0 in 0..len {
                for b1 in b0 + 1..=len {
                    let page: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(u64::MAX)).collect();
                    let (k0, k1) = (b0 / 8, b1.div_ceil(8));
                    store_words(&page[k0..k1], &input, k0);
                    let bytes: Vec<u8> = page
                        .iter()
                        .flat_map(|w| w.load(Ordering::Relaxed).to_ne_bytes())
                        .collect();
                    assert_eq!(
                        &bytes[b0..b1],
                        &input[b0..b1],
                        "input {len}, part {b0}..{b1}"
                    );
                    for (k, w) in page.iter().enumerate() {
                        if !(k0..k1).contains(&k) {
                            assert_eq!(w.load(Ordering::Relaxed), u64::MAX, "word {k}");
                        }
                    }
                }
            }
        }
    }

    /// What a rank publishes, with the block it keeps to itself, covers
    /// its input once; in place a reduce-scatter publishes all of it.
    #[test]
    fn published_parts_are_every_block_a_peer_reads() {
        for size in 1..=5 {
            for rank in 0..size {
                for kind in [
                    CollKind::ReduceScatter,
                    CollKind::AllToAll,
                    CollKind::AllReduce,
                ] {
                    for in_place in [false, true] {
                        let in_len = size * 7;
                        let mut covered = vec![0; in_len];
                        for p in published_parts::<f32>(kind, (rank, size), in_len, in_place) {
                            assert_eq!(p.at, p.from, "{kind:?}: a small input does not move");
                            covered[p.from..p.from + p.len]
                                .iter_mut()
                                .for_each(|c| *c += 1);
                        }
                        let keeps_own = size > 1
                            && (kind == CollKind::AllToAll
                                || (kind == CollKind::ReduceScatter && !in_place));
                        for (i, c) in covered.iter().enumerate() {
                            let own = i / 7 == rank;
                            let want = usize::from(!(keeps_own && own));
                            assert_eq!(
                                *c, want,
                                "{kind:?} rank {rank} of {size}, in place {in_place}: element {i}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// An all-to-all input larger than the inline area: on 2 ranks up to
    /// twice the area (and on more ranks up to `size / (size - 1)` times
    /// it), each rank's published blocks fill its area without overlap,
    /// and where a peer looks for a block (`on_page` with the owner's
    /// rank) is where the owner put it, element for element.
    #[test]
    fn all_to_all_blocks_past_the_area_move_down_where_their_readers_look() {
        fn check<T>(size: usize, in_len: usize) {
            let elem = std::mem::size_of::<T>();
            let block = in_len / size;
            for owner in 0..size {
                let parts = published_parts::<T>(CollKind::AllToAll, (owner, size), in_len, false);
                let mut area = vec![None; in_len];
                for p in parts {
                    for i in 0..p.len {
                        assert!(area[p.at + i].is_none(), "{size} ranks: overlap");
                        area[p.at + i] = Some(p.from + i);
                    }
                    assert!(
                        (p.at + p.len) * elem <= INLINE_CAPACITY,
                        "{size} ranks, {in_len}"
                    );
                }
                for reader in (0..size).filter(|&r| r != owner) {
                    let from = reader * block;
                    let at = on_page::<T>(CollKind::AllToAll, (owner, size), in_len, from);
                    for i in 0..block {
                        assert_eq!(area[at + i], Some(from + i), "reader {reader} of {owner}");
                    }
                }
            }
        }
        for in_len in [
            INLINE_CAPACITY + 2,
            3 * INLINE_CAPACITY / 2,
            2 * INLINE_CAPACITY,
        ] {
            check::<u8>(2, in_len);
        }
        check::<u8>(2, 2 * INLINE_CAPACITY - 2);
        check::<f32>(2, 2 * INLINE_CAPACITY / 4);
        check::<f64>(2, 2 * INLINE_CAPACITY / 8 - 2);
        check::<u16>(3, 3 * INLINE_CAPACITY / 2 / 2);
        check::<f32>(4, INLINE_CAPACITY / 4 + 4);
    }
}
