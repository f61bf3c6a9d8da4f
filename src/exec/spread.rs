//! Large broadcasts, allgathers, all-to-alls and allreduces of ordinary
//! buffers on the ranks of one host through the staging areas at the end
//! of the control pages (`plan::Direct::Spread`, where
//! `plan::takes_spread` says).
//!
//! - **Broadcast** (3 to 8 ranks): the root copies its input chunk by
//!   chunk into its staging area (chunks of 32 KiB up to 1 MiB:
//!   [`chunk_bytes`]), and every other rank copies each chunk out into
//!   its output. The buffer is copied N times on N ranks, where
//!   the chain through pairwise slots copies it 2(N - 1) times (each rank
//!   but the last copies it out of one slot and into the next): four
//!   times on 4 ranks against six, which is what decides the time once the
//!   processes share cores (`bench/bound/spread.c` does only this
//!   traffic, both ways).
//! - **Allgather** (4 to 8 ranks): every rank stages its block chunk by
//!   chunk and copies chunk k of every peer's block after staging its own
//!   chunk k: N + N(N - 1) block copies with the own output's, where the
//!   ring copies each block into and out of a slot at every hop, N(2N - 1).
//! - **All-to-all** (4 to 8 ranks): chunk k of a rank's staging holds
//!   slice k of each block it sends, its peers' in rank order
//!   ([`alltoall_slice`] elements each, the chunk shared among them);
//!   every rank stages its chunk k, then copies its slice of every peer's
//!   chunk k out into its output, then its own block from input to
//!   output: two copies of every byte that travels, where the pairwise
//!   slots take two as well but in N - 1 steps, each pair waiting for the
//!   other, and the pull one in the kernel, which pins the peer's pages
//!   first (`bench/bound/staged_alltoall.c` against `cma_alltoall.c`).
//!   Once the buffers of all ranks together reach `plan::direct_store`'s
//!   threshold the output is written with streaming stores
//!   (`Staging::stream`).
//! - **Allreduce** (4 to 8 ranks), in groups of up to [`SPREAD_GROUP`]
//!   chunks: every rank stages each chunk k of the group from its input,
//!   then reduces its piece of each (a 1/N of it, in whole cache lines)
//!   out of every rank's slot in rank order (every rank gets the same
//!   bits) into its output and back into that piece of its own slot,
//!   which no peer reads, and says so (`W_SPREAD_REDUCED`), then copies
//!   every peer's reduced pieces out of the peer's slots. A rank waits for
//!   every peer's chunk k before it reduces, and for every peer's piece of
//!   chunk k before it copies; its "done" word then covers both reads.
//!
//! A staging area holds [`SPREAD_SLOTS`] chunks of up to
//! [`SPREAD_CHUNK`] bytes. Chunks are numbered per communicator (`Control::spread_chunks`,
//! the same count on every rank, since every rank takes part in every such
//! call), and chunk `g` of a call takes slot `g % SPREAD_SLOTS` of each
//! area that stages it. Each rank's page says how many chunks it staged
//! (`W_SPREAD_WRITTEN`) and up to which chunk it is done reading the
//! others' (`W_SPREAD_READ`; a broadcast's root counts its own chunks as
//! done once staged): a rank stages chunk `g` once every peer is done with
//! chunk `g - SPREAD_SLOTS`, and reads a peer's chunk `g` once the peer
//! says it is there. In an allgather a rank stages its chunk k before it
//! waits for its peers' chunk k, and they wait for it only back to chunk
//! k - SPREAD_SLOTS, which every rank read before it went on: no cycle.
//!
//! It runs after a check-in in which every rank read every announcement
//! (a mismatch is found there, before any byte moves) and needs no
//! completion wait: no rank touches another's buffers, and a rank writes
//! its staging area again only in another such call, chunk by chunk once
//! its peers are done with what it replaces. Waits end on abort, at the
//! deadline, or when the peer's process is gone, as every check-in wait
//! (`checkin::wait`).

use super::checkin::{least_of_peers, page_elements, wait, word, Ctx, Deadline};
use super::io::HostIo;
use super::Call;
use crate::algo::{Operand, Prim, Step};
use crate::coll::CollKind;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::reduce::Store;
use std::sync::atomic::Ordering;

/// Bytes of a chunk of the staging area.
pub(crate) const SPREAD_CHUNK: usize = 256 << 10;
/// Chunks the staging area holds.
pub(crate) const SPREAD_SLOTS: u64 = 8;
/// Bytes of the staging area at the end of every control page.
pub(crate) const SPREAD_BYTES: usize = SPREAD_CHUNK * SPREAD_SLOTS as usize;

/// Chunks of an allreduce a rank stages before it reduces the first of
/// them, reduces before it copies the first piece out, and copies out
/// before it stages the next: half the slots, so that a group's chunks
/// take other slots than the group's before it (a rank stages one without
/// waiting for its peers to read the last group, which they copy out
/// meanwhile), and a call of up to 1 MiB has two meetings with its peers
/// rather than two a chunk.
/// Where ranks share cores a wait that finds the peer not yet there gives
/// the core away, and the fewer meetings paid: on the 2-core AMD EPYC VM,
/// in seven turns against one chunk at a time (`bench/ab.sh`; the group
/// of four's speed): 4 ranks 1.04-1.12x from 512 KiB to 2 MiB, 8 ranks
/// 1.03-1.27x, no size slower (docs/performance-log.md, "The staging
/// areas' allreduce in groups of chunks").
const SPREAD_GROUP: u64 = SPREAD_SLOTS / 2;

/// Word of a page: chunks its rank wrote into its staging area so far
/// (the number of the last one plus one), stored with Release once the
/// chunk is there; in a cache line of its own.
pub(super) const W_SPREAD_WRITTEN: usize = 24;
/// Word of a page: every chunk before this number its rank is done with
/// (read out of its root's area, or written as the root); in a cache line
/// of its own.
pub(super) const W_SPREAD_READ: usize = 32;

/// Word of a page: chunks of an allreduce whose piece its rank reduced
/// into its staging area so far (the number of the last one plus one),
/// stored with Release once the piece is there; in a cache line of its own.
pub(super) const W_SPREAD_REDUCED: usize = 40;

/// Where the staging area starts in a page (bytes): after the inline space
/// (`checkin::W_INLINE`), on a page boundary.
pub(crate) const SPREAD_AT: usize = super::checkin::W_INLINE * 8 + super::checkin::INLINE_SPACE;
const _: () = assert!(SPREAD_AT.is_multiple_of(4096));

/// Bytes of a broadcast's chunk up to [`SMALL_BROADCAST_BYTES`]: the
/// receivers start copying once the root staged the first 32 KiB rather
/// than the whole buffer.
const SMALL_BROADCAST_CHUNK: usize = 32 << 10;

/// The largest broadcast cut into [`SMALL_BROADCAST_CHUNK`]s.
const SMALL_BROADCAST_BYTES: usize = 1 << 20;

/// Bytes of each chunk of a call of `bytes` (a rank's input) of `kind`.
/// A broadcast of up to 1 MiB goes in 32 KiB chunks: on 4 ranks of the
/// 2-core Intel VM 1.16-1.45x the speed of 256 KiB chunks from 64 to 512
/// KiB, 1.07-1.14x at 1 MiB; 16 KiB chunks gained less (1.05-1.17x), and
/// from 2 MiB the 256 KiB chunks won (32 KiB chunks 0.70-0.87x there,
/// 64 KiB 0.85-0.94x: more waits, an eighth or a quarter of the area in flight;
/// docs/performance-log.md, "Small broadcasts through the staging area in
/// 32 KiB chunks"). The rest stage in [`SPREAD_CHUNK`]s, every chunk in a
/// slot of its own whatever its size.
fn chunk_bytes(kind: CollKind, bytes: usize) -> usize {
    if kind == CollKind::Broadcast && bytes <= SMALL_BROADCAST_BYTES {
        SMALL_BROADCAST_CHUNK
    } else {
        SPREAD_CHUNK
    }
}

/// Byte offset in a page of the staging slot of chunk `g`.
fn slot_at(g: u64) -> usize {
    SPREAD_AT + (g % SPREAD_SLOTS) as usize * SPREAD_CHUNK
}

/// Run a broadcast, allgather, all-to-all or allreduce of `count` input
/// elements per rank through the staging areas (after the check-in); an
/// all-to-all writes its output in `mode` (`plan::direct_store`'s), the
/// others with ordinary stores.
pub(super) fn run<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    call: &Call,
    (count, mode): (usize, Store),
    deadline: &Deadline,
) -> Result<()> {
    let elem = std::mem::size_of::<T>();
    let (rank, size) = (ctx.rank, ctx.size);
    let per_chunk = chunk_bytes(call.kind, count * elem) / elem;
    // An all-to-all's chunk holds a slice of each of the peers' blocks.
    let (block, slice) = (count / size.max(1), alltoall_slice::<T>(size));
    let chunks = if call.kind == CollKind::AllToAll {
        block.div_ceil(slice)
    } else {
        count.div_ceil(per_chunk)
    } as u64;
    let c = ctx.control;
    // Every rank numbers this call's chunks alike.
    let base = c.spread_chunks.load(Ordering::Relaxed);
    c.spread_chunks.store(base + chunks, Ordering::Relaxed);
    let part = |k: u64| {
        let from = k as usize * per_chunk;
        (from, per_chunk.min(count - from))
    };
    let own = |io: &mut HostIo<'_, T>, to: usize| {
        let step = Step::local(Prim::Copy, Operand::Input, 0, to, count);
        io.copy_input_to_output(Store::Cached, &step);
    };
    let page = c.pages.words(rank);
    let (written, read) = (word(page, W_SPREAD_WRITTEN)?, word(page, W_SPREAD_READ)?);
    let stream = call.kind == CollKind::AllToAll && mode == Store::Streaming;
    let mut staging = Staging::new(ctx, call, deadline, stream);
    if call.kind == CollKind::AllReduce {
        // Group by group of chunks (`SPREAD_GROUP`), every rank stages
        // each chunk of its input, reduces its piece of each out of every
        // rank's slot into its output and its own slot, then copies every
        // peer's reduced piece out of theirs.
        let reduced = word(page, W_SPREAD_REDUCED)?;
        for k0 in (0..chunks).step_by(SPREAD_GROUP as usize) {
            let k1 = (k0 + SPREAD_GROUP).min(chunks);
            for k in k0..k1 {
                staging.stage(io, base + k, part(k), written)?;
            }
            for k in k0..k1 {
                let g = base + k;
                let (from, len) = part(k);
                staging.reduce_piece(io, g, from, piece::<T>(len, rank, size))?;
                // Release: a peer that sees it finds the piece in the slot.
                reduced.store(g + 1, Ordering::Release);
            }
            for k in k0..k1 {
                let g = base + k;
                let (from, len) = part(k);
                for j in (1..size).map(|s| (rank + s) % size) {
                    let (off, n) = piece::<T>(len, j, size);
                    if n > 0 {
                        staging.take_at(io, j, g, W_SPREAD_REDUCED, off, (from + off, n))?;
                    }
                }
                // Release: a peer that sees it may overwrite its slot of g.
                read.store(g + 1, Ordering::Release);
            }
        }
        return Ok(());
    }
    if call.kind == CollKind::AllGather {
        // Every rank stages its block and reads every peer's, chunk by
        // chunk in step: chunk k of its own, then chunk k of each peer,
        // nearest first.
        for k in 0..chunks {
            let g = base + k;
            let (from, len) = part(k);
            staging.stage(io, g, (from, len), written)?;
            for j in (1..size).map(|s| (rank + s) % size) {
                staging.take(io, j, g, (j * count + from, len))?;
            }
            // Release: a peer that sees it may overwrite its slot of g.
            read.store(g + 1, Ordering::Release);
        }
        own(io, rank * count);
        return Ok(());
    }
    if call.kind == CollKind::AllToAll {
        // Chunk by chunk in step: slice k of each block this rank sends
        // (its peers', in rank order) into its slot, then slice k of its
        // own block out of each peer's slot, nearest peer first; its own
        // block last, from input to output.
        for k in 0..chunks {
            let g = base + k;
            let from = k as usize * slice;
            let len = slice.min(block - from);
            let sent = (0..size).filter(|&j| j != rank);
            staging.stage_strided(io, g, sent.map(|j| j * block + from), (len, slice), written)?;
            for j in (1..size).map(|s| (rank + s) % size) {
                // This rank's slice lies at its place among j's peers.
                let at = if rank < j { rank } else { rank - 1 } * slice;
                staging.take_at(io, j, g, W_SPREAD_WRITTEN, at, (j * block + from, len))?;
            }
            // Release: a peer that sees it may overwrite its slot of g.
            read.store(g + 1, Ordering::Release);
        }
        let step = Step::local(
            Prim::Copy,
            Operand::Input,
            rank * block,
            rank * block,
            block,
        );
        io.copy_input_to_output(mode, &step);
        return Ok(());
    }
    let root = call.fingerprint.root as usize;
    if rank == root {
        for k in 0..chunks {
            staging.stage(io, base + k, part(k), written)?;
        }
        // The root is done with its own chunks.
        read.store(base + chunks, Ordering::Release);
        if matches!(io, HostIo::OutOfPlace { .. }) {
            // The root's own output last: the receivers copy meanwhile.
            own(io, 0);
        }
        return Ok(());
    }
    for k in 0..chunks {
        let g = base + k;
        staging.take(io, root, g, part(k))?;
        read.store(g + 1, Ordering::Release);
    }
    Ok(())
}

/// Rank `j`'s piece of an allreduce's chunk of `len` elements on `size`
/// ranks, as (first element, elements): the chunk cut into `size`
/// pieces of whole cache lines, the last ones short or empty.
fn piece<T>(len: usize, j: usize, size: usize) -> (usize, usize) {
    let line = (64 / std::mem::size_of::<T>().max(1)).max(1);
    let per = len.div_ceil(size.max(1)).div_ceil(line) * line;
    let off = (j * per).min(len);
    (off, per.min(len - off))
}

/// Elements of each peer's slice in a chunk of an all-to-all on `size`
/// ranks: the slot shared among the `size - 1` peers, in whole cache
/// lines.
fn alltoall_slice<T>(size: usize) -> usize {
    let elem = std::mem::size_of::<T>().max(1);
    let line = (64 / elem).max(1);
    (SPREAD_CHUNK / elem / size.saturating_sub(1).max(1) / line * line).max(line)
}

/// One call's use of the staging areas, with what it last saw of its
/// peers' words (each read again only when that falls short).
struct Staging<'c, 'a> {
    ctx: &'c Ctx<'a>,
    call: &'c Call,
    deadline: &'c Deadline,
    /// The least of the peers' "done" words when last read.
    done_by_all: u64,
    /// Each peer's "written" word when last read.
    there: Vec<u64>,
    /// Each peer's "reduced" word when last read.
    reduced: Vec<u64>,
    /// Whether the copies out of a peer's slot go by pages
    /// (`ferroccl_transport::copy_from_shared`): only where every rank has
    /// a core of its own. Where the ranks share cores (measured: 4 ranks
    /// on 2), line after line (`copy_from_shared_by_lines`) was faster,
    /// likely because a chunk's writer often ran on this very core: its
    /// lines are then not in another core's cache, where the pages pay
    /// (see that function).
    pages: bool,
    /// Whether the copies out of the peers' slots write the output with
    /// streaming stores: an all-to-all whose buffers, all ranks' together,
    /// reach the threshold of the calls between windows
    /// (`plan::direct_store`: twice `Config::nt_store_bytes`, out of
    /// place). Every rank writes an output it will not read in this call,
    /// and at that size the outputs no longer stay in cache: on the 2-core
    /// AMD EPYC VM, against ordinary stores (staged both, six gated turns),
    /// 4 ranks 1.16x at 8 MiB, 8 ranks 1.32x and 1.23x at 4 and 8 MiB;
    /// at 4 MiB on 4 ranks, below the threshold, streaming measured level
    /// and at 2 MiB 0.94x (docs/performance-log.md, "The 4-rank all-to-all
    /// at its bare program, and through the staging areas"). The other
    /// collectives keep ordinary stores here (see [`Staging::take`]).
    stream: bool,
}

impl<'c, 'a> Staging<'c, 'a> {
    fn new(ctx: &'c Ctx<'a>, call: &'c Call, deadline: &'c Deadline, stream: bool) -> Self {
        Staging {
            ctx,
            call,
            deadline,
            done_by_all: 0,
            there: vec![0; ctx.size],
            reduced: vec![0; ctx.size],
            pages: !ferroccl_transport::wait::ranks_share_cpus(ctx.size),
            stream,
        }
    }

    /// Wait until rank `j`'s word `w` (`W_SPREAD_WRITTEN` or
    /// `W_SPREAD_REDUCED`) passes chunk `g`.
    fn wait_past(&mut self, j: usize, w: usize, g: u64) -> Result<()> {
        let ctx = self.ctx;
        let (seen, what) = if w == W_SPREAD_REDUCED {
            (
                &mut self.reduced[j],
                "it to reduce its piece of the next chunk",
            )
        } else {
            (&mut self.there[j], "it to stage its next chunk")
        };
        if *seen > g {
            return Ok(());
        }
        let word = word(ctx.control.pages.words(j), w)?;
        wait(ctx, j, self.deadline, self.call, what, || {
            *seen = word.load(Ordering::Acquire);
            *seen > g
        })
    }

    /// Reduce this rank's piece (`off`, `len` elements of the chunk) of
    /// chunk `g`, which starts at element `from` of the call, out of every
    /// rank's slot of `g` in rank order (every rank gets the same bits)
    /// into its output, and copy the result into its own slot, where it
    /// read its own part (no peer reads that part of it).
    fn reduce_piece<T: Element>(
        &mut self,
        io: &mut HostIo<'_, T>,
        g: u64,
        from: usize,
        (off, len): (usize, usize),
    ) -> Result<()> {
        let ctx = self.ctx;
        for j in (1..ctx.size).map(|s| (ctx.rank + s) % ctx.size) {
            self.wait_past(j, W_SPREAD_WRITTEN, g)?;
        }
        if len == 0 {
            return Ok(());
        }
        let elem = std::mem::size_of::<T>();
        let at = slot_at(g) + off * elem;
        let out = io.output(from + off, len);
        super::inline::reduce_ranks(out, self.call.op, ctx.size, |j| {
            page_elements(ctx, j, at, len)
        })?;
        let bytes: &[u8] = bytemuck::cast_slice(out);
        let mut page = super::checkin::lock(&ctx.control.own);
        let slot = page
            .slice_mut(at, bytes.len())
            .map_err(|e| Error::Io(format!("window control page: {e}")))?;
        ferroccl_transport::copy_into_shared(slot, bytes);
        Ok(())
    }

    /// Copy elements `from..from + len` of this rank's input into its
    /// slot of chunk `g`, once every peer is done with chunk `g -
    /// SPREAD_SLOTS` (which the slot held), and say it is there.
    fn stage<T: Element>(
        &mut self,
        io: &HostIo<'_, T>,
        g: u64,
        (from, len): (usize, usize),
        written: &std::sync::atomic::AtomicU64,
    ) -> Result<()> {
        self.stage_strided(io, g, std::iter::once(from), (len, len), written)
    }

    /// [`Staging::stage`] of several parts of `len` elements of this
    /// rank's input, each starting at an element `froms` names, into the
    /// slot one after the other, `stride` elements apart.
    fn stage_strided<T: Element>(
        &mut self,
        io: &HostIo<'_, T>,
        g: u64,
        froms: impl Iterator<Item = usize>,
        (len, stride): (usize, usize),
        written: &std::sync::atomic::AtomicU64,
    ) -> Result<()> {
        let ctx = self.ctx;
        if let Some(needed) = (g + 1).checked_sub(SPREAD_SLOTS) {
            if self.done_by_all < needed {
                self.done_by_all = least_of_peers(
                    ctx,
                    (W_SPREAD_READ, needed),
                    self.deadline,
                    self.call,
                    "it to read the staged chunks of this rank",
                )?;
            }
        }
        let elem = std::mem::size_of::<T>();
        {
            let mut page = super::checkin::lock(&ctx.control.own);
            for (i, from) in froms.enumerate() {
                let bytes: &[u8] = bytemuck::cast_slice(io.input(from, len));
                let slot = page
                    .slice_mut(slot_at(g) + i * stride * elem, bytes.len())
                    .map_err(|e| Error::Io(format!("window control page: {e}")))?;
                ferroccl_transport::copy_into_shared(slot, bytes);
            }
        }
        // Release: a peer that sees the count sees the chunk.
        written.store(g + 1, Ordering::Release);
        Ok(())
    }

    /// Copy chunk `g` (`len` elements) out of rank `j`'s staging area into
    /// this rank's output at element `to`, once `j` says it is there.
    /// Into the output with ordinary stores at every size, unlike the
    /// slots' receiver: with streaming stores from
    /// `Config::nt_store_bytes` on, a 4-rank broadcast on the 2-core Intel
    /// VM ran at 0.95-0.96x the speed at 32 MiB (7.3-7.6 against 7.0-7.3
    /// ms), with that bound lowered to 1 MiB at 0.52-0.74x from 2 to 32
    /// MiB, and at 64 MiB 0.94-1.04x (docs/performance-log.md, "Broadcast
    /// through one staging area").
    fn take<T: Element>(
        &mut self,
        io: &mut HostIo<'_, T>,
        j: usize,
        g: u64,
        to_len: (usize, usize),
    ) -> Result<()> {
        self.take_at(io, j, g, W_SPREAD_WRITTEN, 0, to_len)
    }

    /// [`Staging::take`] of `len` elements from element `off` of the
    /// slot, once rank `j`'s word `w` passes `g`.
    fn take_at<T: Element>(
        &mut self,
        io: &mut HostIo<'_, T>,
        j: usize,
        g: u64,
        w: usize,
        off: usize,
        (to, len): (usize, usize),
    ) -> Result<()> {
        let ctx = self.ctx;
        self.wait_past(j, w, g)?;
        let elem = std::mem::size_of::<T>();
        let raw = ctx
            .control
            .pages
            .page(j)
            .slice(slot_at(g) + off * elem, len * elem)
            .map_err(|e| Error::Io(format!("window control page: {e}")))?;
        let out = bytemuck::cast_slice_mut(io.output(to, len));
        if self.stream {
            crate::reduce::store::<u8>(Store::Streaming, out, raw);
        } else if self.pages {
            ferroccl_transport::copy_from_shared(out, raw);
        } else {
            ferroccl_transport::copy_from_shared_by_lines(out, raw);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The staging slots lie inside the page, after the inline space and
    /// apart from each other, and the words the protocol uses lie in the
    /// page's free words, each in a cache line of its own.
    #[test]
    fn the_staging_area_fits_the_page() {
        let inline_end = super::super::checkin::W_INLINE * 8 + super::super::checkin::INLINE_SPACE;
        assert!(slot_at(0) >= inline_end);
        for g in 0..2 * SPREAD_SLOTS {
            assert!(slot_at(g) + SPREAD_CHUNK <= crate::window::CONTROL_BYTES);
            assert_eq!(slot_at(g), slot_at(g + SPREAD_SLOTS));
        }
        let mut starts: Vec<usize> = (0..SPREAD_SLOTS).map(slot_at).collect();
        starts.dedup();
        assert_eq!(starts.len(), SPREAD_SLOTS as usize);
        let lines = [
            W_SPREAD_WRITTEN / 8,
            W_SPREAD_READ / 8,
            W_SPREAD_REDUCED / 8,
        ];
        assert!(lines[0] != lines[1] && lines[1] != lines[2] && lines[0] != lines[2]);
        // Clear of the notes (words 48 to 55) and the announcements (64 on).
        const { assert!(W_SPREAD_REDUCED < 48) };
    }

    /// Every chunk fits its slot, whole elements of every type; a
    /// broadcast of up to 1 MiB goes in small chunks, every other call in
    /// the slot's size.
    #[test]
    fn chunks_fit_their_slots() {
        for kind in [
            CollKind::Broadcast,
            CollKind::AllGather,
            CollKind::AllReduce,
        ] {
            for bytes in [1usize, 4096, 128 << 10, 1 << 20, (1 << 20) + 1, 64 << 20] {
                let c = chunk_bytes(kind, bytes);
                assert!(
                    c <= SPREAD_CHUNK && c.is_multiple_of(64),
                    "{kind:?} {bytes}"
                );
                let small = kind == CollKind::Broadcast && bytes <= SMALL_BROADCAST_BYTES;
                assert_eq!(c == SMALL_BROADCAST_CHUNK, small, "{kind:?} {bytes}");
            }
        }
    }
}
