//! The check-in: how the ranks of one host agree on a call through their
//! control pages, before any byte moves, and how they say they are done.
//!
//! Where every rank of a communicator is on one host, each rank has a
//! control page that every rank maps (made at creation; under
//! FERROCCL_CHECKIN=0 with the first window). Which calls check in is the
//! planner's decision (`plan::route`), taken from the call alone so that
//! every rank takes it alike. Checking in, a rank announces the call on its
//! page: its fingerprint and where its input and output lie (window and
//! offset, or "not in a window"). Each rank then reads every peer's
//! announcement of the same call, which
//!
//! - compares the calls (`verify::same_call`: a mismatch is found here,
//!   before any byte moves),
//! - gives the planner, on every rank, the same facts to decide whether the
//!   call runs inline (`inline`), directly between the windows (`direct`),
//!   out of the peers' processes (`pull`), or through slots as usual, and
//! - tells each rank that its peers' buffers are ready to be read/written.
//!
//! A direct call ends with `finish`: each rank marks the call done on its
//! page and waits until every peer has too, so nobody returns while another
//! rank may still touch its buffers.
//!
//! A call that does not check in but goes through slots while the ranks
//! have pages is noted on the page first (`W_SLOTS`): a peer that checks in
//! for that call instead was given a different call, and reports the
//! mismatch rather than waiting for the timeout.
//!
//! Control page layout (64-bit words, native endianness: one host):
//!
//! ```text
//!  word  0  magic            1  process id
//!  word  5  non-zero once the rank has dropped its communicator
//!  word  6  the address, in this rank's process, of word 0 of this page
//!           (what a peer reads to probe cross-memory attach)
//!  word  8  done: the position of the last call this rank finished directly
//!  word 16  finished: every check-in before this number, this rank reads
//!           nothing of any more (`publish_finished`)
//!  word 24  chunks this rank staged so far as a large broadcast's root
//!           (`spread`)
//!  word 32  every staged chunk before this number, this rank is done with
//!           (`spread`)
//!  word 40  chunks of an allreduce this rank reduced into its staging
//!           area so far (`spread`)
//!  word 48  note of a call through slots at an even position
//!  word 52  note of a call through slots at an odd position
//!           each: +0 position (stored last, Release), +1 coll|dtype<<8|op<<16|root<<32,
//!                 +2 count, +3 number
//!  word 64  announcement of check-in t in slot t % CHECKIN_SLOTS (32),
//!           24 words (three cache lines) each (counted per communicator)
//!           each, first cache line (all an inline call of at most
//!           32 bytes writes and its peers read):
//!                 +0 position (stored last, Release), +1 as in a note,
//!                 +2 count, +3 the call's number (the fingerprint's `seq`),
//!                 +4..+7 an inline input of at most 32 bytes;
//!           an inline call of 33 to 160 bytes: +4..+23 its input (the
//!                 lines it fills);
//!           an inline call of over 160 bytes: +4 where its input lies in
//!                 the rank's inline space (`said_area`);
//!           a call that is not inline, in the first line too (+4 as
//!                 above where it put its input inline after all):
//!                 +5 input window | output window << 32 (0: not in
//!                 one), +6 input offset, +7 output offset; in the
//!                 second line +12 the input's and +13 the output's
//!                 addresses in the rank's process (only for calls
//!                 peers may copy by cross-memory attach)
//!  word 1024 the inline space: inline inputs of 161-512 B of check-in t
//!             in fixed area t % CHECKIN_SLOTS (`INLINE_STEP`, 4 KiB
//!             each), then the 2 MiB region (`INLINE_REGION`) where each
//!             larger one goes after the rank's last, on 4 KiB steps
//!             (`next_area`)
//!  byte SPREAD_AT (after the inline space)
//!             the staging area of a large broadcast's root: chunk g in
//!             slot g % SPREAD_SLOTS, SPREAD_CHUNK bytes each (`spread`)
//! ```
//!
//! Positions (`Call::order`) count every collective call of the
//! communicator, the library's own included, and never go back: a word
//! that holds a position is waited on with `>=`.
//!
//! **Who reads whom.** In a check-in every rank reads every peer's
//! announcement, except in a small (inline) broadcast or reduce
//! (`plan::reads_inline`): a broadcast's receivers read the root's alone,
//! and the root and a reduce's senders read none. They need nothing of
//! their peers, so they leave once their input is on their page and run
//! ahead of ranks that have not come yet, as an MPI root returns once its
//! data is in its eager buffers. The ranks that read such a rank's
//! announcement (a broadcast's receivers, a reduce's root) compare its
//! call with theirs and find a mismatch in the call; the rank that left
//! compares their announcements with its call later (`confirm_left`):
//! before any call but another such one (`settle` for a call that does
//! not check in), and in a loop of them in batches, once the oldest it
//! has not compared is `CHECKIN_SLOTS - 1` check-ins old. A mismatch fails
//! that later call, and the error names the call it concerns.
//!
//! **When a slot comes round again.** A rank takes the slot and fixed
//! inline area of check-in t again at t + `CHECKIN_SLOTS` only once every peer
//! is done with check-in t (`free_slot`): each rank says on its page up to
//! which check-in it is done reading its peers' pages (`publish_finished`;
//! a rank that left one early is not done with it before it compared it),
//! and a rank reads its peers' words only when the last it saw falls
//! short. Calls in between that do not check in do not touch the slots.
//! A place in the inline region comes round only after more than
//! `CHECKIN_SLOTS` check-ins (`INLINE_REGION`), so the same wait covers it.
//!
//! **Two notes suffice**: a rank leaves a call through slots only once
//! every peer has started it (the confirmation of a broadcast or reduce
//! through slots, or the data of every other collective, which depends on
//! every rank), and before such a call every peer has announced this
//! rank's last check-in (`settle`), so while a rank is at position p no
//! peer is behind p - 1 or past p + 1.
//!
//! A broadcast or reduce through slots (`Route::Slots { note: true }`)
//! ends with `confirm`: its data does not reach every rank from every rank,
//! so a rank that only sent would not know whether its receivers accepted
//! the call. Each rank compares every peer's note of that position with its
//! own call instead, so every rank finds a mismatch in the call itself.

use super::{verify, Call};
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::plan;
use crate::window::{Control, Windows};
use ferroccl_transport::wait::{Waiter, OVERSUBSCRIBED_SPINS};
use ferroccl_transport::{AbortSignal, Fingerprint};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// "FCCLWIN3": the layout of 2026-12-07, whose announcements say where a
/// call's buffers lie in their first line (`E_WINS`; before, "FCCLWIN2",
/// whose inline inputs first moved along a 2 MiB region, `INLINE_REGION`,
/// said it in the second); a page of a layout before reads as not a
/// control page of this version.
pub(crate) const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"FCCLWIN3");
pub(crate) const W_MAGIC: usize = 0;
pub(crate) const W_PID: usize = 1;
/// The notes of calls through slots without a check-in, by the parity of
/// their position: +0 position (stored last, Release), +1 packed
/// fingerprint, +2 count, +3 number.
const W_NOTES: usize = 48;
const NOTE_WORDS: usize = 4;
/// Non-zero once this rank has dropped its communicator.
const W_LEFT: usize = 5;
/// The address, in the page owner's process, of its page's word 0: a peer
/// reads 8 bytes there by cross-memory attach and must find the magic.
pub(crate) const W_PROBE: usize = 6;
pub(super) const W_DONE: usize = 8;
/// Every check-in before this number, this rank reads nothing of any more
/// (`publish_finished`); in a cache line of its own.
const W_FINISHED: usize = 16;
const W_ENTRY: usize = 64;
/// Words of an announcement slot: three cache lines, so that an inline
/// input of up to [`ENTRY_INPUT_BYTES`] travels in it (see there).
pub(super) const ENTRY_WORDS: usize = 24;
/// Announcement slots of a page: check-in `t` takes slot `t % CHECKIN_SLOTS`.
/// A rank that leaves a check-in before its peers come (a broadcast's
/// root, a reduce's senders: `exec::inline`) may run that many check-ins
/// minus one ahead of them.
///
/// A power of two, so that a slot's index is a mask (`turn % 24`, worked
/// out several times a call, cost about 30 of a small call's
/// instructions): against 24 slots, 2 ranks in turns, reduces of 8-32 B
/// 1.26-1.39x, broadcasts 1.03-1.05x, the rest level. 16 slots gained
/// less at 8-32 B; at 64 B-4 KiB the reduce on 16 and on 32 moved between
/// 0.73 and 1.15x of each other from run to run
/// (docs/data/2026-12-02/checkin-slots/).
pub(crate) const CHECKIN_SLOTS: u64 = 32;
const _: () = assert!(CHECKIN_SLOTS.is_power_of_two());
const _: () = assert!(W_ENTRY + CHECKIN_SLOTS as usize * ENTRY_WORDS <= W_INLINE);
// One bit a slot in `Control::left_mask`.
const _: () = assert!(CHECKIN_SLOTS <= 64);
const E_SEQ: usize = 0;
const E_FP: usize = 1;
const E_COUNT: usize = 2;
/// The call's number (the fingerprint's `seq`).
const E_NUM: usize = 3;
/// Where an inline input in the announcement starts: one of at most
/// [`SMALL_BYTES`] lies in its first cache line with the call, so that a
/// peer reads one line.
pub(super) const E_SMALL: usize = 4;
/// Words of [`E_SMALL`].
pub(super) const SMALL_WORDS: usize = 4;
/// The largest inline input that travels in the announcement's line.
pub(super) const SMALL_BYTES: usize = SMALL_WORDS * 8;
/// Where a larger inline input lies in its rank's inline space (bytes
/// from its start, [`next_area`]): the first of the words an input of
/// at most [`SMALL_BYTES`] takes, which such a call leaves unused.
const E_AREA: usize = E_SMALL;
const _: () = assert!(E_SMALL + SMALL_WORDS <= 8);
/// Words of the largest inline input that travels in its announcement:
/// every word after the call's (`inline::run_words`).
pub(super) const ENTRY_INPUT_WORDS: usize = ENTRY_WORDS - E_SMALL;
/// The largest inline input that travels in its announcement, 160 bytes:
/// the words after the call's in the first line, then whole lines next to
/// it, which a peer asks for before it waits for the first
/// ([`fetch_entry`]) and a rank that runs ahead claims with it
/// ([`claim_ahead`]). In the page's inline area instead, each of the
/// reader's loads waited for the announcement's line first: two
/// cross-core transfers one after the other. 2 ranks, in turns against
/// the inline area: reduce 1.15-1.43x at 64-160 B, broadcast 1.09-1.2x at
/// 128 B (0.86-1.09x at 64 B), allreduce, allgather and reduce-scatter
/// 1.05-1.16x at 64-128 B (docs/data/2026-12-02/entry-lines/).
pub(super) const ENTRY_INPUT_BYTES: usize = ENTRY_INPUT_WORDS * 8;
/// Where a call that is not inline says where its buffers lie: the input's
/// and output's windows (their numbers, [`pack_windows`]), then their
/// offsets, in the words of the first line that [`E_AREA`] leaves. In the
/// second line each peer's read of them waited for the first line's
/// transfer before it began its own: two cross-core transfers one after
/// the other in every call between windows, where the bare program of
/// the traffic has one (docs/performance-log.md, "Calls between windows
/// without a locked instruction").
const E_WINS: usize = E_AREA + 1;
const E_IN_OFF: usize = E_AREA + 2;
const E_OUT_OFF: usize = E_AREA + 3;
const _: () = assert!(E_OUT_OFF < 8);
/// Where the input lies in the announcing rank's process (for
/// cross-memory attach).
pub(super) const E_IN_ADDR: usize = 12;
/// Where the output lies in the announcing rank's process (for a
/// broadcast's root that pushes into it by cross-memory attach).
pub(super) const E_OUT_ADDR: usize = 13;

/// Where the page's inline space starts (in words): the inline inputs
/// over [`ENTRY_INPUT_BYTES`] lie there ([`next_area`]).
pub(super) const W_INLINE: usize = 1024;
/// The most a rank puts on its page in one inline call: the planner's
/// largest inline input (`plan::INLINE_MAX_BYTES`), or the page area of
/// an all-to-all on 3 to 8 ranks (`plan::WIDE_ALLTOALL_INLINE_AREA`)
/// where that is larger.
pub(super) const INLINE_CAPACITY: usize =
    if plan::WIDE_ALLTOALL_INLINE_AREA > plan::INLINE_MAX_BYTES {
        plan::WIDE_ALLTOALL_INLINE_AREA
    } else {
        plan::INLINE_MAX_BYTES
    };
/// Bytes of the inline region (`window::CONTROL_BYTES` has room for it).
///
/// Each call's input goes where the last one's ended ([`inline_place`]),
/// so a rank writes a line of it again only once 2 MiB of inputs came
/// after it: by then the peer that read it has let it go from its core's
/// L2 (1 MiB on the EPYC VM) to the shared L3, and the store need not
/// wait for that core to give it up. With one 16 KiB area per
/// announcement slot, reused every 32 check-ins, a peer still held the
/// lines of an 8 KiB input there, and the copy onto the page cost 0.9 µs
/// of a 2-rank allgather's 1.8 (`bench/bound/slot_reuse.c 16384 20000
/// 32` against 256 sets: 0.2 µs of 1.1). 2 ranks in turns, against those
/// areas: 1.2-2.1x from 2 to 16 KiB in every inline collective but the
/// all-to-all (level); 4 ranks level within their noise
/// (docs/performance-log.md, "The inline inputs move along a 2 MiB
/// region").
pub(super) const INLINE_REGION: usize = 2 << 20;
/// Where the inline inputs start in the region: on a page of their own,
/// each where the last one's page ends ([`inline_place`]). Against cache
/// lines (64 B), which let the peer that read the last input ask for the
/// lines after it (a core's prefetchers run ahead of its reads within a
/// page) just before this rank writes them, 2 ranks, each in turns
/// against 256 fixed areas: allgather 1.1-1.4x at 512 B-2 KiB, broadcast
/// 1.3x at 2 KiB, allreduce 1.3x at 2 KiB (docs/performance-log.md, "The
/// inline inputs move along a 2 MiB region").
pub(super) const INLINE_STEP: usize = 4096;
/// Inline inputs of at most this many bytes go in a fixed area of their
/// own announcement slot instead (`turn % CHECKIN_SLOTS`, a page each,
/// before the region), written again every `CHECKIN_SLOTS` check-ins:
/// their few lines gain little from the move, and a new page a call cost
/// them some on 4 ranks (in turns against the 32 areas of 16 KiB before:
/// broadcast of 256 B 0.75-0.90x moving, 1.02-1.07x fixed; reduce
/// 0.84-0.95x moving, 1.10-1.25x fixed).
pub(super) const FIXED_AREA_MAX: usize = 512;
/// Bytes of the fixed areas.
const FIXED_BYTES: usize = CHECKIN_SLOTS as usize * INLINE_STEP;
/// Bytes of a page's inline space: the fixed areas, then the region.
/// Where an inline input lies is said in bytes from its start.
pub(super) const INLINE_SPACE: usize = FIXED_BYTES + INLINE_REGION;
// A place is reused only once the cursor went round the region: by then
// more than `CHECKIN_SLOTS` check-ins came after the one that wrote it,
// and every peer is done with that one (`free_slot`).
const _: () =
    assert!(INLINE_REGION >= (CHECKIN_SLOTS as usize + 2) * (INLINE_CAPACITY + INLINE_STEP));
const _: () = assert!(W_INLINE * 8 + INLINE_SPACE <= crate::window::CONTROL_BYTES);
const _: () = assert!(FIXED_AREA_MAX <= INLINE_STEP);

/// A wait for a peer's announcement looks at its notes too once in this
/// many rounds (`wait_said`).
const FULL_LOOK: u32 = 16;

/// Spins of a check-in wait before it yields, when every rank has a core
/// (the rest of the rhythm is the transport core's `Waiter`).
const SPINS: u32 = 512;

/// Where a rank's buffers of a call are: (window, byte offset) for input
/// and output; window 0 for a buffer in no window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Place {
    pub(super) in_win: u64,
    pub(super) in_off: u64,
    pub(super) out_win: u64,
    pub(super) out_off: u64,
}

fn pack(fp: &Fingerprint) -> u64 {
    u64::from(fp.coll)
        | u64::from(fp.dtype) << 8
        | u64::from(fp.op) << 16
        | u64::from(fp.root) << 32
}

fn unpack(seq: u64, word: u64, count: u64) -> Fingerprint {
    Fingerprint {
        seq,
        coll: word as u8,
        dtype: (word >> 8) as u8,
        op: (word >> 16) as u8,
        count,
        root: (word >> 32) as u32,
    }
}

/// Everything a windowed call needs from the communicator.
pub(crate) struct Ctx<'a> {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) control: &'a Control,
    pub(crate) windows: &'a crate::bias::BiasedLock<Windows>,
    pub(crate) abort: &'a AbortSignal,
}

pub(super) use ferroccl_transport::lock;

/// Word `index` of a control page's words (`Control::pages`, which keeps
/// every page's words so that no read goes through the trait object).
#[inline]
pub(super) fn word(words: &[AtomicU64], index: usize) -> Result<&AtomicU64> {
    match words.get(index) {
        Some(w) => Ok(w),
        None => Err(outside(index, words.len())),
    }
}

/// `len` elements of rank `j`'s control page from byte `at` (its inline
/// areas, its staging area), read in place.
pub(super) fn page_elements<'x, T: bytemuck::Pod>(
    ctx: &'x Ctx<'_>,
    j: usize,
    at: usize,
    len: usize,
) -> Result<&'x [T]> {
    let raw = ctx
        .control
        .pages
        .page(j)
        .slice(at, len * std::mem::size_of::<T>())
        .map_err(|e| Error::Io(format!("window control page: {e}")))?;
    bytemuck::try_cast_slice(raw).map_err(|e| Error::Io(format!("window control page: {e:?}")))
}

#[cold]
fn outside(index: usize, words: usize) -> Error {
    Error::Io(format!(
        "window control page: word {index} is outside its {words} words"
    ))
}

/// Where (bytes from the inline region's start) a rank puts an inline
/// input of `bytes` when the last one it placed ended at `end`: there,
/// rounded up to an [`INLINE_STEP`], or back at the start where the rest
/// of the region is too short.
#[inline(always)]
pub(super) fn inline_place(end: usize, bytes: usize) -> usize {
    let at = end.next_multiple_of(INLINE_STEP);
    if at + bytes > INLINE_REGION {
        0
    } else {
        at
    }
}

/// Where this rank puts its inline input of `bytes` at check-in `turn`
/// (bytes from its inline space's start): up to [`FIXED_AREA_MAX`] in the
/// check-in's fixed area, else in the region, the cursor moved past it.
/// Every rank moves its cursor in every call that may use the region,
/// whether it puts an input there or not (a broadcast's receivers): the
/// calls being the same on every rank, the cursors agree, and a peer
/// asks for a rank's lines where it will put them
/// (`inline::fetch_ahead`) before it said where; what it reads is where
/// that rank said ([`said_area`]).
#[inline(always)]
pub(super) fn next_area(ctx: &Ctx<'_>, turn: u64, bytes: usize) -> usize {
    let end = &ctx.control.inline_end;
    let (at, after) = area_after(end.load(Ordering::Relaxed) as usize, turn, bytes);
    end.store(after as u64, Ordering::Relaxed);
    at
}

/// Where an inline input of `bytes` at check-in `turn` lies (bytes from
/// the inline space's start) when the rank's last input in the region
/// ended at `end` (bytes from the region's start), and where the region's
/// inputs end after it: [`next_area`]'s rule, which [`claim_ahead`]
/// follows forward too.
#[inline(always)]
fn area_after(end: usize, turn: u64, bytes: usize) -> (usize, usize) {
    if bytes <= FIXED_AREA_MAX {
        return (fixed_area(turn), end);
    }
    let bytes = bytes.min(INLINE_CAPACITY);
    let at = inline_place(end, bytes);
    (FIXED_BYTES + at, at + bytes)
}

/// The fixed area of check-in `turn` (bytes from the inline space's start).
#[inline(always)]
fn fixed_area(turn: u64) -> usize {
    (turn % CHECKIN_SLOTS) as usize * INLINE_STEP
}

/// Say in this rank's announcement of check-in `turn` (not made yet: its
/// Release store publishes this) that its inline input lies at byte `at`
/// of its inline space.
#[inline(always)]
pub(super) fn say_area(ctx: &Ctx<'_>, turn: u64, at: usize) -> Result<()> {
    let words = entry_words(ctx.control.pages.words(ctx.rank), turn)?;
    words[E_AREA].store(at as u64, Ordering::Relaxed);
    Ok(())
}

/// Where peer `j` said its inline input of check-in `turn` lies (heard
/// already), checked to hold `bytes` inside its inline space: a place
/// outside it is a protocol error naming the peer, never read.
#[inline(always)]
pub(super) fn said_area(
    ctx: &Ctx<'_>,
    (j, turn): (usize, u64),
    bytes: usize,
    call: &Call,
) -> Result<usize> {
    let words = entry_words(ctx.control.pages.words(j), turn)?;
    let at = words[E_AREA].load(Ordering::Relaxed);
    match usize::try_from(at) {
        Ok(at) if at.checked_add(bytes).is_some_and(|end| end <= INLINE_SPACE) => Ok(at),
        _ => Err(Error::Protocol {
            peer: j,
            during: call.during(),
            detail: format!(
                "its inline input of {bytes} bytes at check-in {turn} lies at byte {at} of its \
                 {INLINE_SPACE}-byte inline space"
            ),
        }),
    }
}

/// The word of a page at byte `at` of its inline space.
#[inline(always)]
pub(super) fn inline_word(at: usize) -> usize {
    W_INLINE + at / 8
}

/// The announcement slot of check-in number `turn`.
#[inline(always)]
pub(super) fn entry(turn: u64) -> usize {
    W_ENTRY + (turn % CHECKIN_SLOTS) as usize * ENTRY_WORDS
}

/// The words of check-in `turn`'s announcement slot on a page, as one
/// array: a small call reads and writes several of them, each then
/// without a check of its own.
#[inline(always)]
pub(super) fn entry_words(page: &[AtomicU64], turn: u64) -> Result<&[AtomicU64; ENTRY_WORDS]> {
    let e = entry(turn);
    match page
        .get(e..e + ENTRY_WORDS)
        .map(<&[AtomicU64; ENTRY_WORDS]>::try_from)
    {
        Some(Ok(words)) => Ok(words),
        _ => Err(outside(e + ENTRY_WORDS - 1, page.len())),
    }
}

/// The note of the call at `order` on a page.
fn note(order: u64) -> usize {
    W_NOTES + (order % 2) as usize * NOTE_WORDS
}

/// Say on this rank's page that `call` runs through slots without a
/// check-in (see `read_announcement` and `confirm`).
pub(super) fn note_slot_call(ctx: &Ctx<'_>, call: &Call) -> Result<()> {
    write_note(
        ctx.control.pages.words(ctx.rank),
        call.order,
        &call.fingerprint,
    )
}

fn write_note(page: &[AtomicU64], order: u64, fp: &Fingerprint) -> Result<()> {
    let n = note(order);
    word(page, n + 1)?.store(pack(fp), Ordering::Relaxed);
    word(page, n + 2)?.store(fp.count, Ordering::Relaxed);
    word(page, n + 3)?.store(fp.seq, Ordering::Relaxed);
    // Release: a peer that sees the position sees the fields.
    word(page, n)?.store(order, Ordering::Release);
    Ok(())
}

/// Announce `call` at check-in `turn`, with where its buffers lie and,
/// for a call peers may copy out of (or into) this process, its input's
/// and output's addresses.
pub(super) fn announce(
    ctx: &Ctx<'_>,
    turn: u64,
    call: &Call,
    place: &Place,
    addrs: Option<(u64, u64)>,
) -> Result<()> {
    let words = entry_words(ctx.control.pages.words(ctx.rank), turn)?;
    fill_entry(words, call.order, &call.fingerprint, place, addrs);
    Ok(())
}

/// Announce an inline `call` at check-in `turn`, with the words of its
/// input where it is at most [`ENTRY_INPUT_BYTES`] (`small`; none for a
/// larger input, which goes in the inline area, or for a rank that puts
/// none): up to [`SMALL_BYTES`] the announcement's first cache line
/// alone. This rank's announcement words, for [`heard_inline`] to compare
/// the peers' with.
///
/// Inlined, as every step of a small call's check-in that runs each call
/// (`entry_words`, `heard_inline`, `same_entry`, `claim_ahead`,
/// `free_slot`'s look, `publish_finished`, ...), the waits they may start
/// kept out of line: about 100 of an 8-byte broadcast's 900-1,050
/// instructions a rank, 1.11-1.25x on 2-rank broadcasts and reduces of
/// 8-32 B in turns (docs/data/2026-12-02/inline-checkin/).
#[inline(always)]
pub(super) fn announce_inline<'p>(
    ctx: &Ctx<'p>,
    turn: u64,
    call: &Call,
    small: &[u64],
) -> Result<&'p [AtomicU64; ENTRY_WORDS]> {
    let words = entry_words(ctx.control.pages.words(ctx.rank), turn)?;
    for (w, &v) in words[E_SMALL..].iter().zip(small) {
        w.store(v, Ordering::Relaxed);
    }
    fill_call(words, call.order, &call.fingerprint);
    Ok(words)
}

/// Wait until `peer`'s announcement of check-in `turn` is there and of
/// `call` (this rank's announcement `own`). A peer that is there with the
/// same call word for word (the common case) costs the loads of one line;
/// anything else (not there yet, another call) takes
/// [`read_announcement`]'s wait and names the mismatch.
#[inline(always)]
pub(super) fn heard_inline(
    ctx: &Ctx<'_>,
    (turn, peer): (u64, usize),
    own: &[AtomicU64; ENTRY_WORDS],
    deadline: &Deadline,
    call: &Call,
) -> Result<()> {
    let theirs = entry_words(ctx.control.pages.words(peer), turn)?;
    if !same_entry(own, theirs) {
        read_announcement(ctx, turn, peer, deadline, call)?;
    }
    Ok(())
}

/// The words of peer `j`'s inline input at check-in `turn` (its first
/// `n`), from its announcement (heard already: [`heard_inline`]); `N`:
/// [`SMALL_WORDS`] or [`ENTRY_INPUT_WORDS`], the rest zero.
#[inline(always)]
pub(super) fn small_words<const N: usize>(
    ctx: &Ctx<'_>,
    j: usize,
    turn: u64,
    n: usize,
) -> Result<[u64; N]> {
    const { assert!(E_SMALL + N <= ENTRY_WORDS) };
    let words = entry_words(ctx.control.pages.words(j), turn)?;
    // In the first line all of them, a fixed number of loads: those past
    // the input's are left from earlier calls and never used. A plain
    // loop: `array::from_fn` with a branch in it stayed a call of its own.
    let m = if N == SMALL_WORDS { N } else { n.min(N) };
    let mut out = [0u64; N];
    for (o, w) in out[..m].iter_mut().zip(&words[E_SMALL..E_SMALL + m]) {
        *o = w.load(Ordering::Relaxed);
    }
    Ok(out)
}

/// Write an announcement into its slot's words: the fields, then (last,
/// Release) the position.
fn fill_entry(
    words: &[AtomicU64; ENTRY_WORDS],
    order: u64,
    fp: &Fingerprint,
    place: &Place,
    addrs: Option<(u64, u64)>,
) {
    for (field, value) in [
        (E_WINS, pack_windows(place.in_win, place.out_win)),
        (E_IN_OFF, place.in_off),
        (E_OUT_OFF, place.out_off),
    ] {
        words[field].store(value, Ordering::Relaxed);
    }
    if let Some((input, output)) = addrs {
        words[E_IN_ADDR].store(input, Ordering::Relaxed);
        words[E_OUT_ADDR].store(output, Ordering::Relaxed);
    }
    fill_call(words, order, fp);
}

/// Write the call into an announcement's first line: its fields, then
/// (last, Release) the position.
#[inline(always)]
fn fill_call(words: &[AtomicU64; ENTRY_WORDS], order: u64, fp: &Fingerprint) {
    for (field, value) in [(E_FP, pack(fp)), (E_COUNT, fp.count), (E_NUM, fp.seq)] {
        words[field].store(value, Ordering::Relaxed);
    }
    // Release: a peer that sees the position sees the fields (the
    // announcement's, an inline input) and, in place, this rank's input
    // as the caller left it.
    words[E_SEQ].store(order, Ordering::Release);
}

/// What `peer` has said on its page about its call at position `order` or
/// later: `Some` once it announced a check-in or noted a call through slots
/// at `order` or after; the call at `order` itself where it is there.
fn said_at_or_after(
    page: &[AtomicU64],
    turn: Option<u64>,
    order: u64,
) -> Result<Option<Fingerprint>> {
    let (exact, later) = scan(page, turn, order)?;
    if exact.is_some() || later.is_none() {
        return Ok(exact);
    }
    // A later call was seen, but the words are read one after the other:
    // the peer may have said `order` and gone on to the next call between
    // the reads. What it said before the later call is visible now (the
    // later position was read with Acquire, and a peer says its calls in
    // order), so a second look finds `order` unless the peer never said it.
    let (exact, _) = scan(page, turn, order)?;
    Ok(exact.or(later))
}

/// Wait until `peer` (with its page) has said something about its call at
/// `call`'s position or later (`said_at_or_after`), and return it; `what`
/// names the wait in a timeout.
fn wait_said(
    ctx: &Ctx<'_>,
    (peer, page): (usize, &[AtomicU64]),
    turn: Option<u64>,
    deadline: &Deadline,
    call: &Call,
    what: &'static str,
) -> Result<Fingerprint> {
    let mut heard = None;
    // Where the check-in is known, most rounds look at its position
    // alone (one word: the round after the peer's store ends sooner); the
    // notes of a peer that runs the call through slots instead (a
    // mismatch) are looked at every `FULL_LOOK` rounds, the first included.
    let position = match turn {
        Some(t) => Some(&entry_words(page, t)?[E_SEQ]),
        None => None,
    };
    let mut round = 0u32;
    wait(ctx, peer, deadline, call, what, || {
        round = round.wrapping_add(1);
        if let Some(at) = position {
            if round % FULL_LOOK != 1 && at.load(Ordering::Acquire) < call.order {
                return false;
            }
        }
        match said_at_or_after(page, turn, call.order) {
            Ok(None) => false,
            other => {
                heard = Some(other);
                true
            }
        }
    })?;
    Ok(heard
        .expect("the wait ended on an answer")?
        .expect("an answer"))
}

/// One look at `peer`'s page for `said_at_or_after`: the call at `order`,
/// and the first said after it.
fn scan(
    page: &[AtomicU64],
    turn: Option<u64>,
    order: u64,
) -> Result<(Option<Fingerprint>, Option<Fingerprint>)> {
    let read = |at: usize| word(page, at).map(|w| w.load(Ordering::Relaxed));
    let mut later: Option<Fingerprint> = None;
    let mut consider = |base: usize, num: usize, count: usize| -> Result<Option<Fingerprint>> {
        let at = word(page, base)?.load(Ordering::Acquire);
        if at < order {
            return Ok(None);
        }
        let fp = unpack(read(num)?, read(base + 1)?, read(count)?);
        if at == order {
            return Ok(Some(fp));
        }
        later.get_or_insert(fp);
        Ok(None)
    };
    // This check-in's own announcement first, then the notes, then (when
    // no turn is known: a call through slots) every announcement.
    let entries = match turn {
        Some(t) => t..t + 1,
        None => 0..CHECKIN_SLOTS,
    };
    for e in entries.map(entry) {
        if let Some(fp) = consider(e + E_SEQ, e + E_NUM, e + E_COUNT)? {
            return Ok((Some(fp), None));
        }
    }
    for parity in [order, order + 1] {
        let n = note(parity);
        if let Some(fp) = consider(n, n + 3, n + 2)? {
            return Ok((Some(fp), None));
        }
    }
    Ok((None, later))
}

/// Wait for `peer`'s announcement of check-in `turn`, which must be of
/// `call`; where the peer's buffers are. The ranks decide alike which
/// calls check in, from the calls alone, so a peer that announces another
/// call at this turn, or runs this call or a later one through slots
/// without checking in, was given a different call: a mismatch.
pub(super) fn read_announcement(
    ctx: &Ctx<'_>,
    turn: u64,
    peer: usize,
    deadline: &Deadline,
    call: &Call,
) -> Result<Place> {
    let page = ctx.control.pages.words(peer);
    let words = entry_words(page, turn)?;
    let read = |at: usize| words[at].load(Ordering::Relaxed);
    // The peer is there already (the common case): its announcement.
    let heard = if words[E_SEQ].load(Ordering::Acquire) == call.order {
        unpack(read(E_NUM), read(E_FP), read(E_COUNT))
    } else {
        wait_said(
            ctx,
            (peer, page),
            Some(turn),
            deadline,
            call,
            "its announcement of the call",
        )?
    };
    verify::same_call(peer, &call.fingerprint, &heard)?;
    let (in_win, out_win) = unpack_windows(read(E_WINS));
    Ok(Place {
        in_win,
        in_off: read(E_IN_OFF),
        out_win,
        out_off: read(E_OUT_OFF),
    })
}

/// The numbers of an input's and an output's window in one word: window
/// numbers stay below 2^32 (`Communicator::alloc_window` refuses more).
fn pack_windows(input: u64, output: u64) -> u64 {
    debug_assert!(input <= u64::from(u32::MAX) && output <= u64::from(u32::MAX));
    input | output << 32
}

/// [`pack_windows`]'s two numbers.
fn unpack_windows(word: u64) -> (u64, u64) {
    (word & u64::from(u32::MAX), word >> 32)
}

/// The end of a call that ran through slots while the ranks share control
/// pages, where its data does not tell every rank that every other ran the
/// same call (a broadcast, a reduce): wait until every peer has started
/// its call at this position and compare it with this rank's, so that a
/// mismatch fails the call itself on every rank, the ranks that only sent
/// included.
pub(crate) fn confirm(ctx: &Ctx<'_>, call: &Call) -> Result<()> {
    let deadline = Deadline::new(call.timeout);
    for peer in (0..ctx.size).filter(|&p| p != ctx.rank) {
        let page = ctx.control.pages.words(peer);
        let heard = wait_said(
            ctx,
            (peer, page),
            None,
            &deadline,
            call,
            "its note of the call",
        )?;
        verify::same_call(peer, &call.fingerprint, &heard)?;
    }
    Ok(())
}

/// Whether this rank has check-ins to compare or peers to wait for before
/// its next call (`confirm_left`, `settle`).
#[inline(always)]
pub(crate) fn unsettled(ctx: &Ctx<'_>) -> bool {
    let c = ctx.control;
    c.all_announced.load(Ordering::Relaxed) < c.checkins.load(Ordering::Relaxed)
        || c.oldest_unconfirmed.load(Ordering::Relaxed) != u64::MAX
}

/// Note that every peer announced check-in `turn` (this rank read every
/// announcement of it).
#[inline(always)]
pub(super) fn all_read(ctx: &Ctx<'_>, turn: u64) {
    ctx.control.all_announced.store(turn + 1, Ordering::Relaxed);
}

/// Remember check-in `turn`, which this rank left without reading the
/// announcements of the ranks that read its own (`confirm_left`). Only
/// the calling thread touches these words (the communicator's calls run
/// one at a time), and no locked instruction: one would wait for the
/// announcement's cross-core write to finish.
#[inline(always)]
pub(super) fn left_early(ctx: &Ctx<'_>, turn: u64) {
    let c = ctx.control;
    let mask = c.left_mask.load(Ordering::Relaxed);
    c.left_mask
        .store(mask | 1 << (turn % CHECKIN_SLOTS), Ordering::Relaxed);
    if c.oldest_unconfirmed.load(Ordering::Relaxed) == u64::MAX {
        c.oldest_unconfirmed.store(turn, Ordering::Relaxed);
    }
}

/// How many check-ins ahead [`claim_ahead`] claims its lines: far enough
/// that the claim is done by the time that call stores (a call of a few
/// bytes in a loop takes 70-130 ns, a claim a cross-core round trip).
const CLAIM_AHEAD: u64 = 2;

/// The lines this rank will write at check-in `turn + CLAIM_AHEAD` if that
/// is a call like this one (its announcement's first `entry_lines` lines,
/// and the first `inline_bytes` of its inline area), taken for writing now
/// (`ferroccl_transport::prefetch_for_write`). For the small calls whose
/// ranks do not wait for each other ([`plan::leaves_early`]): a peer read
/// those lines of that slot `CHECKIN_SLOTS` check-ins before, so each store
/// to them waited for the peer's core to give them up, and every locked
/// instruction of the call after it waited too; a rank that runs ahead
/// paid that round trip each call. In turns, 2 ranks: broadcast and reduce
/// of 8-32 bytes (announcement only) 1.20-1.47x, broadcast of 1-4 KiB
/// (with its inline area, written without the page's lock) 1.41-2.03x at
/// 2 KiB (docs/performance-log.md, "Lines claimed ahead", "Inline inputs
/// without the page's lock"), and since 2026-12-02 from 33 B (see
/// `inline::WORDS_MIN`); every line of an input in the announcement
/// ([`ENTRY_INPUT_BYTES`]). A reduce's ranks claim their announcement's
/// line above that too (64 B 1.07x, 256 B 1.3x, the rest level), but not
/// a sender's inline area, where it lost: 0.60-0.93x at 64 B-4 KiB
/// (0.72-1.01x when made only where the peers' "finished" word showed
/// the slot free; 0.83-0.95x again on 2026-12-02; level once the root
/// fetched its inputs ahead, `inline::fetch_ahead`). Not made by a
/// broadcast of 8 KiB, and by calls whose ranks meet (an allreduce waits
/// for a round trip anyway, and a claim only adds traffic to it: 8 B 0.23
/// -> 0.24-0.25 µs).
#[inline(always)]
pub(super) fn claim_ahead(ctx: &Ctx<'_>, turn: u64, entry_lines: usize, inline_bytes: usize) {
    let page = ctx.control.pages.words(ctx.rank);
    let ahead = turn + CLAIM_AHEAD;
    if let Some(w) = page.get(entry(ahead)) {
        ferroccl_transport::prefetch_for_write(w);
    }
    for line in 1..entry_lines.min(ENTRY_WORDS.div_ceil(8)) {
        if let Some(w) = page.get(entry(ahead) + 8 * line) {
            ferroccl_transport::prefetch_for_write(w);
        }
    }
    if inline_bytes > 0 {
        // Where the input of a call like this one lies at check-in `ahead`.
        let (mut place, mut end) = (0, ctx.control.inline_end.load(Ordering::Relaxed) as usize);
        for k in 1..=CLAIM_AHEAD {
            (place, end) = area_after(end, turn + k, inline_bytes);
        }
        let at = inline_word(place);
        let words = inline_bytes.min(INLINE_CAPACITY).div_ceil(8);
        for w in page.get(at..at + words).unwrap_or(&[]).iter().step_by(8) {
            ferroccl_transport::prefetch_for_write(w);
        }
    }
}

/// Ask for the lines after the first of peer `j`'s announcement of
/// check-in `turn` that an input of `n` words fills, before this rank
/// waits for it: read after its first line, each would be a cross-core
/// transfer of its own.
#[inline(always)]
pub(super) fn fetch_entry(ctx: &Ctx<'_>, j: usize, turn: u64, n: usize) {
    let page = ctx.control.pages.words(j);
    let e = entry(turn);
    for line in 1..(E_SMALL + n).div_ceil(8) {
        if let Some(w) = page.get(e + 8 * line) {
            ferroccl_transport::prefetch_for_read(w);
        }
    }
}

/// Say on this rank's page up to which check-in it is done with its
/// peers' pages: it will read nothing of a check-in before the first it
/// left early and has not compared yet (`confirm_left`), or else before
/// the next one.
#[inline(always)]
pub(super) fn publish_finished(ctx: &Ctx<'_>) {
    let c = ctx.control;
    let next = c.checkins.load(Ordering::Relaxed);
    let upto = next.min(c.oldest_unconfirmed.load(Ordering::Relaxed));
    if let Some(w) = c.pages.words(ctx.rank).get(W_FINISHED) {
        // Release: a peer that sees it sees that this rank is done reading.
        w.store(upto, Ordering::Release);
    }
}

/// Before check-in `turn` takes its announcement slot and fixed inline
/// area again (and so any place of the inline region it may write): wait
/// until every peer is done with check-in `turn - CHECKIN_SLOTS`
/// (`publish_finished`), unless this rank saw that already.
/// Each peer's word is read again only when what was seen last falls
/// short, so a rank that runs ahead reads its peers' words about once in
/// `CHECKIN_SLOTS` calls; a peer falls that far behind only when it has
/// not run for that many calls.
#[inline(always)]
pub(super) fn free_slot(ctx: &Ctx<'_>, turn: u64, call: &Call) -> Result<()> {
    let Some(needed) = (turn + 1).checked_sub(CHECKIN_SLOTS) else {
        return Ok(());
    };
    if ctx.control.peers_finished.load(Ordering::Relaxed) >= needed {
        return Ok(());
    }
    wait_all_finished(ctx, needed, call)
}

/// Wait until every peer says it is done with every check-in before
/// `needed`, and remember the least they said.
#[cold]
#[inline(never)]
fn wait_all_finished(ctx: &Ctx<'_>, needed: u64, call: &Call) -> Result<()> {
    let deadline = Deadline::new(call.timeout);
    let least = least_of_peers(
        ctx,
        (W_FINISHED, needed),
        &deadline,
        call,
        "it to finish an earlier check-in",
    )?;
    ctx.control.peers_finished.store(least, Ordering::Relaxed);
    Ok(())
}

/// Wait until word `at` of every peer's page is at least `needed`; the
/// least of what they said (`what` names the wait in a timeout).
pub(super) fn least_of_peers(
    ctx: &Ctx<'_>,
    (at, needed): (usize, u64),
    deadline: &Deadline,
    call: &Call,
    what: &str,
) -> Result<u64> {
    let mut least = u64::MAX;
    for peer in (0..ctx.size).filter(|&p| p != ctx.rank) {
        let w = word(ctx.control.pages.words(peer), at)?;
        let mut seen = 0;
        wait(ctx, peer, deadline, call, what, || {
            seen = w.load(Ordering::Acquire);
            seen >= needed
        })?;
        least = least.min(seen);
    }
    Ok(least)
}

/// Wait until every peer has announced check-in `turn` (or a later one);
/// its position is on this rank's page, which keeps it until this rank
/// announces `turn + CHECKIN_SLOTS`.
fn wait_all_announced(ctx: &Ctx<'_>, turn: u64, call: &Call) -> Result<()> {
    let e = entry(turn);
    let order = word(ctx.control.pages.words(ctx.rank), e + E_SEQ)?.load(Ordering::Relaxed);
    let deadline = Deadline::new(call.timeout);
    for peer in (0..ctx.size).filter(|&p| p != ctx.rank) {
        let at = word(ctx.control.pages.words(peer), e + E_SEQ)?;
        wait(
            ctx,
            peer,
            &deadline,
            call,
            "its announcement of a check-in",
            || at.load(Ordering::Acquire) >= order,
        )?;
    }
    all_read(ctx, turn);
    Ok(())
}

/// An error of `confirm_left` or `settle`, with the call it concerns.
pub(crate) type Failed = Box<(Error, Call)>;

/// Compare the check-ins this rank left without reading the announcements
/// of the ranks that read its own (`plan::leaves_early`: a broadcast's
/// root, a reduce's senders) with those ranks' calls (a broadcast's
/// receivers, a reduce's root), as the check-in would have, once the
/// oldest of them is `upto` or older: those up to `upto`, waiting for the
/// readers' announcements, and the later ones whose readers are there
/// already (so that this rank compares in batches, about once in
/// `CHECKIN_SLOTS` calls in a loop of them). The readers compare every
/// announcement of the call with their own, so every rank's call is then
/// compared, and a mismatch is found even where ranks disagree on the
/// root (nobody reads a rank that wrongly thinks it is the root; it
/// finds the mismatch here). An error comes with the call it concerns.
///
/// What is compared is the reader's announcement of that check-in itself:
/// the reader takes its slot again only once every peer is done with the
/// check-in (`free_slot`), and this rank says it is done with a check-in
/// only once it compared it (`publish_finished`).
pub(crate) fn confirm_left(
    ctx: &Ctx<'_>,
    upto: u64,
    now: &Call,
) -> std::result::Result<(), Failed> {
    let c = ctx.control;
    let oldest = c.oldest_unconfirmed.load(Ordering::Relaxed);
    if oldest > upto {
        return Ok(());
    }
    let next = c.checkins.load(Ordering::Relaxed);
    let mut mask = c.left_mask.load(Ordering::Relaxed);
    let bit = |turn: u64| 1u64 << (turn % CHECKIN_SLOTS);
    let mut turn = oldest;
    let result = loop {
        if turn >= next {
            break Ok(());
        }
        if mask & bit(turn) == 0 || readers_agree(ctx, turn) {
            mask &= !bit(turn);
            turn += 1;
            continue;
        }
        // This rank's own announcement of that check-in is still on its
        // page: it takes the slot again only at `turn + CHECKIN_SLOTS`,
        // after comparing.
        let call = match own_call(ctx, turn, now) {
            Ok(call) => call,
            Err(e) => break Err(Box::new((e, now.clone()))),
        };
        let readers = readers_of(ctx, call.kind, call.fingerprint.root);
        if turn > upto
            && !readers.clone().all(|p| {
                entry_words(c.pages.words(p), turn)
                    .is_ok_and(|w| w[E_SEQ].load(Ordering::Acquire) >= call.order)
            })
        {
            break Ok(());
        }
        let deadline = Deadline::new(call.timeout);
        if let Err(e) = readers
            .into_iter()
            .try_for_each(|peer| read_announcement(ctx, turn, peer, &deadline, &call).map(|_| ()))
        {
            break Err(Box::new((e, call)));
        }
        mask &= !bit(turn);
        turn += 1;
    };
    c.left_mask.store(mask, Ordering::Relaxed);
    let oldest = (turn..next)
        .find(|&t| mask & bit(t) != 0)
        .unwrap_or(u64::MAX);
    c.oldest_unconfirmed.store(oldest, Ordering::Relaxed);
    publish_finished(ctx);
    result
}

/// Whether every rank that reads this rank's announcement of check-in
/// `turn` (one it left early) has announced the same call there: the same
/// position, collective, type, operator, root, count and number, word for
/// word (what `verify::same_call` compares). The common case of
/// `confirm_left`, told without rebuilding the call; anything else
/// (a reader not there yet, a mismatch) goes the long way, which waits
/// and names the difference.
fn readers_agree(ctx: &Ctx<'_>, turn: u64) -> bool {
    let pages = &ctx.control.pages;
    let Ok(own) = entry_words(pages.words(ctx.rank), turn) else {
        return false;
    };
    let fp = unpack(0, own[E_FP].load(Ordering::Relaxed), 0);
    readers_of(ctx, left_early_kind(fp.coll), fp.root)
        .all(|p| entry_words(pages.words(p), turn).is_ok_and(|w| same_entry(own, w)))
}

/// The ranks that read this rank's announcement of an inline `kind` call
/// with root `root` (`plan::reads_inline`): those it compares a call it
/// left early with.
fn readers_of(ctx: &Ctx<'_>, kind: CollKind, root: u32) -> impl Iterator<Item = usize> + Clone {
    let (rank, early) = (ctx.rank, ctx.control.early_return);
    (0..ctx.size)
        .filter(move |&p| p != rank && plan::reads_inline(kind, p, rank, root as usize, early))
}

/// The collective of a call this rank left early, from its code on the
/// page: a broadcast or else a reduce (`plan::leaves_early`).
fn left_early_kind(coll: u8) -> CollKind {
    if coll == CollKind::Broadcast.code() {
        CollKind::Broadcast
    } else {
        CollKind::Reduce
    }
}

/// Whether announcement `theirs` is of the call at the position of `own`
/// (this rank's, which stays as it is while it is compared), word for word.
#[inline(always)]
fn same_entry(own: &[AtomicU64; ENTRY_WORDS], theirs: &[AtomicU64; ENTRY_WORDS]) -> bool {
    let said = |w: &[AtomicU64; ENTRY_WORDS], at: usize| w[at].load(Ordering::Relaxed);
    // Acquire: the fields read after it are the ones stored with it.
    theirs[E_SEQ].load(Ordering::Acquire) == said(own, E_SEQ)
        && [E_FP, E_COUNT, E_NUM].map(|at| said(theirs, at))
            == [E_FP, E_COUNT, E_NUM].map(|at| said(own, at))
}

/// The call this rank announced at check-in `turn` (a broadcast or reduce
/// it left early), rebuilt from its page, with `now`'s settings.
fn own_call(ctx: &Ctx<'_>, turn: u64, now: &Call) -> Result<Call> {
    let words = entry_words(ctx.control.pages.words(ctx.rank), turn)?;
    let read = |at: usize| words[at].load(Ordering::Relaxed);
    let fingerprint = unpack(read(E_NUM), read(E_FP), read(E_COUNT));
    Ok(Call {
        kind: left_early_kind(fingerprint.coll),
        fingerprint,
        order: read(E_SEQ),
        ..now.clone()
    })
}

/// Before a call that does not check in: compare every check-in left
/// early (`confirm_left`, which every other call but a small broadcast or
/// reduce left early does too), so that a mismatch fails this call at the
/// latest, and wait until every peer announced this rank's last check-in,
/// so that no peer is more than one call behind (the notes' rule).
pub(crate) fn settle(ctx: &Ctx<'_>, call: &Call) -> std::result::Result<(), Failed> {
    confirm_left(ctx, u64::MAX, call)?;
    let c = ctx.control;
    let checkins = c.checkins.load(Ordering::Relaxed);
    if c.all_announced.load(Ordering::Relaxed) < checkins {
        wait_all_announced(ctx, checkins - 1, call).map_err(|e| Box::new((e, call.clone())))?;
    }
    Ok(())
}

/// Say this rank is done with call `seq`, and wait until every peer is.
pub(super) fn finish(ctx: &Ctx<'_>, seq: u64, deadline: &Deadline, call: &Call) -> Result<()> {
    // Release: a peer that sees it sees every byte this rank wrote into
    // the peer's buffers.
    word(ctx.control.pages.words(ctx.rank), W_DONE)?.store(seq, Ordering::Release);
    for peer in (0..ctx.size).filter(|&p| p != ctx.rank) {
        let done = word(ctx.control.pages.words(peer), W_DONE)?;
        wait(ctx, peer, deadline, call, "it to finish the call", || {
            done.load(Ordering::Acquire) >= seq
        })?;
    }
    Ok(())
}

/// A call's deadline, read from the clock only when a wait first has to
/// (a check-in whose peers are already there reads no clock).
pub(super) struct Deadline {
    timeout: Duration,
    at: std::cell::Cell<Option<Instant>>,
}

impl Deadline {
    pub(super) fn new(timeout: Duration) -> Self {
        Deadline {
            timeout,
            at: std::cell::Cell::new(None),
        }
    }

    /// The deadline, fixed on first use from `now` (the caller's reading
    /// of the clock).
    fn at(&self, now: Instant) -> Instant {
        match self.at.get() {
            Some(at) => at,
            None => {
                let at = now + self.timeout;
                self.at.set(Some(at));
                at
            }
        }
    }
}

/// Say on this rank's page that it has dropped its communicator: a peer
/// waiting for it at a check-in ends with `PeerFailed` naming it.
pub(crate) fn leave(control: &Control, rank: usize) {
    if let Some(w) = control.pages.words(rank).get(W_LEFT) {
        w.store(1, Ordering::Release);
    }
}

/// Wait for `ready`: spin, yield, then sleep; end on abort, at the
/// deadline, or when `peer`'s process is gone.
pub(super) fn wait(
    ctx: &Ctx<'_>,
    peer: usize,
    deadline: &Deadline,
    call: &Call,
    what: &str,
    mut ready: impl FnMut() -> bool,
) -> Result<()> {
    if ready() {
        return Ok(());
    }
    let spins = if ferroccl_transport::wait::ranks_share_cpus(ctx.size) {
        OVERSUBSCRIBED_SPINS
    } else {
        SPINS
    };
    let left = word(ctx.control.pages.words(peer), W_LEFT)?;
    let mut w = Waiter::new(spins);
    loop {
        if ready() {
            return Ok(());
        }
        if w.clock_round() {
            if ctx.abort.is_fired() {
                return Err(Error::Aborted(None));
            }
            if left.load(Ordering::Acquire) != 0 && !ready() {
                return Err(Error::PeerFailed {
                    rank: peer,
                    during: call.during(),
                    reason: "it left the communicator (dropped it) before this call".into(),
                });
            }
            let now = Instant::now();
            w.at(now);
            if now >= deadline.at(now) {
                return Err(Error::Timeout {
                    peer,
                    during: call.during(),
                    what: what.to_string(),
                    waited_ms: w.elapsed_ms(),
                });
            }
            if w.liveness_due(now)
                && ctx.control.memory.process_gone(ctx.control.pids[peer])
                && !ready()
            {
                return Err(Error::PeerFailed {
                    rank: peer,
                    during: call.during(),
                    reason: "its process exited".into(),
                });
            }
        }
        w.pause();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    fn fp(order: u64) -> Fingerprint {
        Fingerprint {
            seq: order,
            coll: 5,
            dtype: 3,
            op: 0,
            count: order * 7,
            root: 0,
        }
    }

    /// A peer that notes call k and at once call k + 1 (as a rank that
    /// only sends in a reduce does) while this rank looks for call k: the
    /// look must find k, never only k + 1 (which reads as a mismatch). The
    /// peer waits for each look before it goes on, as the real one waits
    /// for this rank's note of k + 1.
    #[test]
    fn a_peer_going_on_between_two_reads_is_not_a_mismatch() {
        let page: Arc<Vec<AtomicU64>> =
            Arc::new((0..W_INLINE).map(|_| AtomicU64::new(0)).collect());
        let looked = Arc::new(AtomicU64::new(0));
        const CALLS: u64 = 200_000;
        let writer = {
            let (page, looked) = (page.clone(), looked.clone());
            std::thread::spawn(move || {
                for k in (1..CALLS).step_by(2) {
                    while looked.load(Ordering::Acquire) + 2 < k {
                        std::hint::spin_loop();
                    }
                    write_note(&page, k, &fp(k)).unwrap();
                    write_note(&page, k + 1, &fp(k + 1)).unwrap();
                }
            })
        };
        for k in (1..CALLS).step_by(2) {
            let heard = loop {
                if let Some(heard) = said_at_or_after(&page, None, k).unwrap() {
                    break heard;
                }
                std::hint::spin_loop();
            };
            assert_eq!(heard, fp(k), "looked for call {k}, read a later one");
            looked.store(k, Ordering::Release);
        }
        writer.join().unwrap();
    }

    /// Two announcements are the same word for word exactly when they
    /// are at the same position and `verify::same_call` finds their
    /// calls the same: each field of the fingerprint, and the position,
    /// changed alone, makes them differ.
    #[test]
    fn announcements_agree_word_for_word_exactly_when_the_calls_do() {
        let blank = || -> [AtomicU64; ENTRY_WORDS] { std::array::from_fn(|_| AtomicU64::new(0)) };
        let base = Fingerprint {
            seq: 41,
            coll: CollKind::Broadcast.code(),
            dtype: 3,
            op: 0,
            count: 1000,
            root: 1,
        };
        let variants: [(&str, u64, Fingerprint); 8] = [
            ("the same call", 17, base),
            ("another position", 18, base),
            ("another number", 17, Fingerprint { seq: 42, ..base }),
            (
                "another collective",
                17,
                Fingerprint {
                    coll: CollKind::Reduce.code(),
                    ..base
                },
            ),
            ("another type", 17, Fingerprint { dtype: 4, ..base }),
            ("another operator", 17, Fingerprint { op: 1, ..base }),
            ("another count", 17, Fingerprint { count: 999, ..base }),
            ("another root", 17, Fingerprint { root: 0, ..base }),
        ];
        let place = Place {
            in_win: 2,
            in_off: 64,
            out_win: 3,
            out_off: 128,
        };
        let own = blank();
        fill_entry(&own, 17, &base, &place, None);
        for (what, order, fp) in variants {
            let theirs = blank();
            // Where a peer's buffers are is not part of the call.
            fill_entry(&theirs, order, &fp, &Place::default(), Some((4096, 8192)));
            let same = order == 17 && verify::same_call(1, &base, &fp).is_ok();
            assert_eq!(same_entry(&own, &theirs), same, "{what}");
            assert_eq!(same, what == "the same call", "{what}");
        }
        // Not announced yet: the slot still holds an older position.
        let theirs = blank();
        fill_entry(&theirs, 1, &base, &place, None);
        assert!(!same_entry(&own, &theirs));
    }
}
