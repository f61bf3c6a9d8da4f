//! A large broadcast of ordinary buffers on 3 or more ranks of one host,
//! through one staging area that every receiver reads (`plan::Direct::Spread`):
//! the root copies its input chunk by chunk into the staging area at the end
//! of its control page, and every other rank copies each chunk out of it
//! into its output. The buffer is copied N times on N ranks, where a chain
//! through pairwise slots copies it 2(N - 1) times (each rank but the last
//! copies it out of one slot and into the next): six times on 4 ranks
//! against four, which is what decides the time once the processes share
//! cores (`bench/bound/spread.c` does only this traffic, both ways).
//!
//! The staging area holds [`SPREAD_SLOTS`] chunks of [`SPREAD_CHUNK`]
//! bytes. Chunks are numbered per communicator (`Control::spread_chunks`,
//! the same count on every rank, since every rank takes part in every such
//! call), and chunk `g` takes slot `g % SPREAD_SLOTS` of its root's area.
//! Each rank's page says how many chunks its root wrote (`W_SPREAD_WRITTEN`)
//! and how many it is done with (`W_SPREAD_READ`; the root counts its own
//! as done once written): the root writes chunk `g` once every receiver is
//! done with chunk `g - SPREAD_SLOTS`, a receiver reads it once the root
//! says it is there.
//!
//! It runs after a check-in in which every rank read every announcement
//! (a mismatch is found there, before any byte moves) and needs no
//! completion wait: no rank touches another's buffers, and a root writes
//! its staging area again only in another such call, chunk by chunk once
//! the receivers are done with what it replaces. Waits end on abort, at
//! the deadline, or when the peer's process is gone, as every check-in
//! wait (`checkin::wait`).

use super::checkin::{wait, word, Ctx, Deadline};
use super::io::HostIo;
use super::Call;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::plan;
use crate::reduce::Store;
use std::sync::atomic::Ordering;

/// Bytes of a chunk of the staging area.
pub(crate) const SPREAD_CHUNK: usize = 256 << 10;
/// Chunks the staging area holds.
pub(crate) const SPREAD_SLOTS: u64 = 8;
/// Bytes of the staging area at the end of every control page.
pub(crate) const SPREAD_BYTES: usize = SPREAD_CHUNK * SPREAD_SLOTS as usize;

/// Word of a page: chunks its rank wrote into its staging area so far
/// (the number of the last one plus one), stored with Release once the
/// chunk is there; in a cache line of its own.
pub(super) const W_SPREAD_WRITTEN: usize = 24;
/// Word of a page: every chunk before this number its rank is done with
/// (read out of its root's area, or written as the root); in a cache line
/// of its own.
pub(super) const W_SPREAD_READ: usize = 32;

/// Where the staging area starts in a page (bytes): after the inline areas
/// (`checkin::W_INLINE`), on a page boundary.
pub(crate) const SPREAD_AT: usize =
    super::checkin::W_INLINE * 8 + super::checkin::CHECKIN_SLOTS as usize * plan::INLINE_MAX_BYTES;
const _: () = assert!(SPREAD_AT.is_multiple_of(4096));

/// Byte offset in a page of the staging slot of chunk `g`.
fn slot_at(g: u64) -> usize {
    SPREAD_AT + (g % SPREAD_SLOTS) as usize * SPREAD_CHUNK
}

/// Broadcast `count` elements from the call's root through its staging
/// area (after the check-in).
pub(super) fn run<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    call: &Call,
    count: usize,
    deadline: &Deadline,
) -> Result<()> {
    let elem = std::mem::size_of::<T>();
    let per_chunk = SPREAD_CHUNK / elem;
    let chunks = count.div_ceil(per_chunk) as u64;
    let c = ctx.control;
    // Every rank numbers this call's chunks alike.
    let base = c.spread_chunks.load(Ordering::Relaxed);
    c.spread_chunks.store(base + chunks, Ordering::Relaxed);
    let root = call.fingerprint.root as usize;
    let part = |k: u64| {
        let from = k as usize * per_chunk;
        (from, per_chunk.min(count - from))
    };
    if ctx.rank == root {
        write_chunks(ctx, io, call, (base, chunks), &part, deadline)?;
        if matches!(io, HostIo::OutOfPlace { .. }) {
            // The root's own output last: the receivers copy meanwhile.
            let own = crate::algo::Step::local(
                crate::algo::Prim::Copy,
                crate::algo::Operand::Input,
                0,
                0,
                count,
            );
            io.copy_input_to_output(Store::Cached, &own);
        }
        return Ok(());
    }
    read_chunks(ctx, io, call, (root, base, chunks), &part, deadline)
}

/// The root: copy each chunk of its input into its staging area once
/// every receiver is done with the chunk it replaces, and say it is
/// there; then count every chunk of the call as done on its own page.
fn write_chunks<T: Element>(
    ctx: &Ctx<'_>,
    io: &HostIo<'_, T>,
    call: &Call,
    (base, chunks): (u64, u64),
    part: &impl Fn(u64) -> (usize, usize),
    deadline: &Deadline,
) -> Result<()> {
    let c = ctx.control;
    let elem = std::mem::size_of::<T>();
    let own = c.pages.words(ctx.rank);
    let written = word(own, W_SPREAD_WRITTEN)?;
    // The least of the receivers' "done" words when last read.
    let mut done_by_all = 0u64;
    for k in 0..chunks {
        let g = base + k;
        if let Some(needed) = (g + 1).checked_sub(SPREAD_SLOTS) {
            if done_by_all < needed {
                done_by_all = receivers_done(ctx, needed, deadline, call)?;
            }
        }
        let (from, len) = part(k);
        let bytes: &[u8] = bytemuck::cast_slice(io.input(from, len));
        {
            let mut page = super::checkin::lock(&c.own);
            let slot = page
                .slice_mut(slot_at(g), len * elem)
                .map_err(|e| Error::Io(format!("window control page: {e}")))?;
            ferroccl_transport::copy_into_shared(slot, bytes);
        }
        // Release: a receiver that sees the count sees the chunk.
        written.store(g + 1, Ordering::Release);
    }
    word(own, W_SPREAD_READ)?.store(base + chunks, Ordering::Release);
    Ok(())
}

/// Wait until every receiver (every rank but this one) is done with every
/// chunk before `needed`; the least they said.
fn receivers_done(ctx: &Ctx<'_>, needed: u64, deadline: &Deadline, call: &Call) -> Result<u64> {
    let mut least = u64::MAX;
    for peer in (0..ctx.size).filter(|&p| p != ctx.rank) {
        let read = word(ctx.control.pages.words(peer), W_SPREAD_READ)?;
        let mut seen = 0;
        wait(
            ctx,
            peer,
            deadline,
            call,
            "it to read the broadcast's staged chunks",
            || {
                seen = read.load(Ordering::Acquire);
                seen >= needed
            },
        )?;
        least = least.min(seen);
    }
    Ok(least)
}

/// A receiver: copy each chunk out of the root's staging area once the
/// root says it is there, and say it is done with it. Into the output with
/// ordinary stores at every size, unlike the slots' receiver: with
/// streaming stores from `Config::nt_store_bytes` on, a 4-rank broadcast
/// on the 2-core Intel VM ran at 0.95-0.96x the speed at 32 MiB (7.3-7.6
/// against 7.0-7.3 ms), with that bound lowered to 1 MiB at 0.52-0.74x
/// from 2 to 32 MiB, and at 64 MiB 0.94-1.04x (docs/performance-log.md,
/// "Broadcast through one staging area").
fn read_chunks<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    call: &Call,
    (root, base, chunks): (usize, u64, u64),
    part: &impl Fn(u64) -> (usize, usize),
    deadline: &Deadline,
) -> Result<()> {
    let c = ctx.control;
    let elem = std::mem::size_of::<T>();
    let written = word(c.pages.words(root), W_SPREAD_WRITTEN)?;
    let read = word(c.pages.words(ctx.rank), W_SPREAD_READ)?;
    let page = c.pages.page(root);
    let mut there = 0u64;
    for k in 0..chunks {
        let g = base + k;
        if there <= g {
            wait(
                ctx,
                root,
                deadline,
                call,
                "it to stage the broadcast's next chunk",
                || {
                    there = written.load(Ordering::Acquire);
                    there > g
                },
            )?;
        }
        let (to, len) = part(k);
        let raw = page
            .slice(slot_at(g), len * elem)
            .map_err(|e| Error::Io(format!("window control page: {e}")))?;
        ferroccl_transport::copy_from_shared(bytemuck::cast_slice_mut(io.output(to, len)), raw);
        // Release: the root that sees it may overwrite the slot.
        read.store(g + 1, Ordering::Release);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The staging slots lie inside the page, after the inline areas and
    /// apart from each other, and the words the protocol uses lie in the
    /// page's free words, each in a cache line of its own.
    #[test]
    fn the_staging_area_fits_the_page() {
        let inline_end = super::super::checkin::W_INLINE * 8
            + super::super::checkin::CHECKIN_SLOTS as usize * plan::INLINE_MAX_BYTES;
        assert!(slot_at(0) >= inline_end);
        for g in 0..2 * SPREAD_SLOTS {
            assert!(slot_at(g) + SPREAD_CHUNK <= crate::window::CONTROL_BYTES);
            assert_eq!(slot_at(g), slot_at(g + SPREAD_SLOTS));
        }
        let mut starts: Vec<usize> = (0..SPREAD_SLOTS).map(slot_at).collect();
        starts.dedup();
        assert_eq!(starts.len(), SPREAD_SLOTS as usize);
        assert_ne!(W_SPREAD_WRITTEN / 8, W_SPREAD_READ / 8);
    }
}
