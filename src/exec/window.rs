//! The check-in: small collectives inline, and collectives straight
//! between windows (see `crate::window`).
//!
//! Where every rank of a communicator is on one host, each rank has a
//! control page that every rank maps (made at creation; under
//! FERROCCL_CHECKIN=0 with the first window). A call *checks in* when it is
//! small (input of at most `INLINE_BYTES`, any collective but send/recv,
//! unless the config forces an algorithm) or once the communicator has a
//! shared window (then every collective does). Which calls check in is
//! decided from the call alone, so every rank decides alike. Checking in,
//! a rank announces the call on its page: its fingerprint and where its
//! input and output lie (window and offset, or "not in a window"). Each
//! rank then reads every peer's announcement of the same call, which
//!
//! - compares the calls (a mismatch is found here, before any byte moves),
//! - decides, from the same facts on every rank, whether the call runs
//!   inline, directly between the windows, or through slots as usual, and
//! - tells each rank that its peers' buffers are ready to be read/written.
//!
//! **Inline**: a small call carries its input in the announcement (up to
//! 8 bytes in the announcement's own cache line, else in the page's inline
//! area); each rank takes what it needs from the peers' pages (allreduce:
//! reduces all in rank order; allgather: every block; reduce-scatter: its
//! block of each; broadcast: the root's; reduce: the root reduces; all-to-
//! all: its block of each) and returns. Nobody touches another rank's
//! buffers, so there is no completion wait: one exchange in all; a barrier
//! is the check-in alone.
//!
//! **Directly**, each rank moves one share of the data, reading and writing
//! the other ranks' buffers itself, so each byte is copied once:
//!
//! - allreduce: rank r reduces piece r of every input, in rank order, and
//!   writes the result into piece r of every output;
//! - allgather: rank r writes its input into block r of every output;
//! - reduce-scatter: rank r reduces block r of every input, in rank order,
//!   into its own output.
//!
//! Only rank r touches piece (block) r of any buffer, so in place needs no
//! copy. Then each rank marks the call done on its page and waits until
//! every peer has too: nobody returns while another rank may still touch
//! its buffers.
//!
//! **Across processes** (cross-memory attach): where every rank could read
//! every other rank's memory with `process_vm_readv` (probed when the
//! control pages are made; `Control::cma`), an allgather or all-to-all
//! whose blocks have at least `CMA_MIN_BYTES` checks in too, announcing
//! where its input lies in its process. Unless the window path applies (an
//! allgather into one window), each rank copies what it needs straight out
//! of the peers' processes into its output (allgather: every peer's input
//! into the peer's block; all-to-all: block `rank` of every peer's input)
//! and its own part from input to output: one copy per byte, by the
//! kernel, against two through slots (the peer's into a slot, this rank's
//! out of it). Only reads: a rank writes nothing but its own output. Then
//! the same completion wait: no rank returns while a peer may still be
//! reading its input.
//!
//! A call that does not check in (large, and no window yet) goes through
//! slots after one store of its fingerprint on the page (`W_SLOTS`): a peer
//! that checks in for that call instead was given a different call, and
//! reports the mismatch rather than waiting for the timeout.
//!
//! Control page layout (64-bit words, native endianness: one host):
//!
//! ```text
//!  word  0  magic            1  process id
//!  word  2  last call through slots without a check-in:
//!           +0 seq (stored last, Release), +1 fingerprint, +2 count
//!  word  5  non-zero once the rank has dropped its communicator
//!  word  6  the address, in this rank's process, of word 0 of this page
//!           (what a peer reads to probe cross-memory attach)
//!  word  8  done: the last call this rank finished directly
//!  word 16  announcement of even check-ins (counted per communicator)
//!  word 32  announcement of odd check-ins
//!           each: +0 seq (stored last, Release), +1 coll|dtype<<8|op<<16|root<<32,
//!                 +2 count, +3 input window, +4 input offset,
//!                 +5 output window, +6 output offset (window 0: not in one),
//!                 +7 an inline input of at most 8 bytes (same cache line),
//!                 +8 the input's address in the rank's process (only
//!                    for calls peers may copy by cross-memory attach)
//!  word 512   inline input of an even check-in (4 KiB)
//!  word 1024  inline input of an odd check-in (4 KiB)
//! ```
//!
//! Two announcement slots suffice: every check-in waits for every peer's
//! announcement, so when a rank announces check-in t + 2 every rank has
//! announced t + 1 and so has finished reading everything of t. Calls in
//! between that do not check in do not touch the slots.

use super::{Call, Io};
use crate::algo::partition;
use crate::algo::{Operand, Prim, Step};
use crate::coll::CollKind;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::fingerprint;
use crate::reduce::{reduce_into, reduce_to, store, Store};
use crate::window::{Control, WindowMaps, Windows};
use ferroccl_shm::wait::OVERSUBSCRIBED_SPINS;
use ferroccl_shm::{Region, Waiter};
use ferroccl_transport::{AbortSignal, Fingerprint};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// "FCCLWIN1".
pub(crate) const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"FCCLWIN1");
pub(crate) const W_MAGIC: usize = 0;
pub(crate) const W_PID: usize = 1;
/// The last call this rank ran through slots without a check-in: +0 seq
/// (stored last, Release), +1 packed fingerprint, +2 count.
const W_SLOTS: usize = 2;
/// Non-zero once this rank has dropped its communicator.
const W_LEFT: usize = 5;
/// The address, in the page owner's process, of its page's word 0: a peer
/// reads 8 bytes there by cross-memory attach and must find the magic.
pub(crate) const W_PROBE: usize = 6;
const W_DONE: usize = 8;
const W_ENTRY: usize = 16;
const ENTRY_WORDS: usize = 16;
const E_SEQ: usize = 0;
const E_FP: usize = 1;
const E_COUNT: usize = 2;
const E_IN_WIN: usize = 3;
const E_IN_OFF: usize = 4;
const E_OUT_WIN: usize = 5;
const E_OUT_OFF: usize = 6;
/// An inline input of at most 8 bytes: in the announcement's own cache
/// line, so that a peer reads one line.
const E_SMALL: usize = 7;
/// Where the input lies in the announcing rank's process (for
/// cross-memory attach).
const E_IN_ADDR: usize = 8;

/// Allgathers and all-to-alls whose blocks have at least this many bytes
/// copy from the peers by cross-memory attach where the ranks may. Below
/// it the slots win or tie (each `process_vm_readv` pins the peer's pages,
/// and the check-in and completion wait cost a round trip each): measured
/// on 2 ranks from blocks of 64 KiB (allgather 9.4-9.6 against 4.4-6.5
/// GB/s at 128 KiB gathered) and on 4 ranks from about 64 KiB blocks
/// (below that slower; docs/performance.md).
pub(crate) const CMA_MIN_BYTES: usize = 64 << 10;

/// Where the inline data of the two announcement slots start (in words),
/// and how much they hold: allreduces of at most this many bytes travel in
/// the announcement itself.
const W_INLINE: usize = 512;
pub(crate) const INLINE_BYTES: usize = 4096;
const INLINE_WORDS: usize = INLINE_BYTES / 8;

/// Elements reduced per block: a block of each input and the result stay
/// in L1 while the result is written to every output.
const BLOCK_BYTES: usize = 8192;

/// Spins of a check-in wait before it yields, when every rank has a core
/// (the rest of the rhythm is the shm transport's `Waiter`).
const SPINS: u32 = 512;

/// Where a rank's buffers of a call are: (window, byte offset) for input
/// and output; window 0 for a buffer in no window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Place {
    in_win: u64,
    in_off: u64,
    out_win: u64,
    out_off: u64,
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
    pub(crate) windows: &'a Mutex<Windows>,
    pub(crate) abort: &'a AbortSignal,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The element counts of a call's input and output, from its fingerprint.
fn extents(kind: Option<CollKind>, count: usize, size: usize) -> (usize, usize) {
    match kind {
        Some(CollKind::AllGather) => (count, count * size),
        Some(CollKind::ReduceScatter) => (count * size, count),
        _ => (count, count),
    }
}

/// Announce `call`, read every peer's announcement of it, and run it
/// directly between windows if every rank's buffers allow. `Ok(true)`: done
/// (results in place on every rank); `Ok(false)`: run it through slots.
pub(crate) fn run<T: Element>(ctx: &Ctx<'_>, io: &mut Io<'_, T>, call: &Call) -> Result<bool> {
    let fp = call.fingerprint;
    let kind = CollKind::from_code(fp.coll);
    let elem = std::mem::size_of::<T>();
    let (in_len, out_len) = extents(kind, fp.count as usize, ctx.size);
    let inline = kind.filter(|&k| call.inline && runs_inline(k, in_len * elem));
    let cma = call.inline
        && ctx.control.cma
        && kind.is_some_and(|k| runs_cma(k, in_len * elem, ctx.size));
    if inline.is_none() && !cma && !ctx.control.windows.load(Ordering::Relaxed) {
        // No window anywhere: nothing to agree on, the call goes through
        // slots. Said on the page for a peer that checks in for it instead
        // (different calls), so that it reports the mismatch.
        note_slot_call(ctx, &fp)?;
        return Ok(false);
    }
    let turn = ctx.control.checkins.fetch_add(1, Ordering::Relaxed);
    let deadline = Deadline::new(call.timeout);
    if let Some(kind) = inline {
        run_inline(ctx, io, call, kind, in_len, turn, &deadline)?;
        return Ok(true);
    }
    let (in_addr, out_addr) = io.addresses();
    let place = {
        let windows = lock(ctx.windows);
        let locate = |addr: usize, len: usize| {
            windows
                .find(addr, len * elem)
                .filter(|&(_, off)| off % elem == 0)
                .map_or((0, 0), |(id, off)| (id, off as u64))
        };
        let (in_win, in_off) = locate(in_addr, in_len);
        let (out_win, out_off) = locate(out_addr, out_len);
        Place {
            in_win,
            in_off,
            out_win,
            out_off,
        }
    };
    // The input's address only where a peer may read from it: it lies in
    // the announcement's second cache line, which the other check-ins
    // leave alone.
    announce(ctx, turn, &fp, &place, cma.then_some(in_addr as u64))?;
    let mut places = vec![place; ctx.size];
    for peer in (0..ctx.size).filter(|&p| p != ctx.rank) {
        places[peer] = read_announcement(ctx, turn, peer, &fp, &deadline, call)?;
    }
    if kind == Some(CollKind::Barrier) {
        // Every rank has checked in: that was the barrier.
        return Ok(true);
    }
    let same = |w: fn(&Place) -> u64| {
        let first = w(&places[0]);
        (first != 0 && places.iter().all(|p| w(p) == first)).then_some(first)
    };
    let (inputs, outputs) = (same(|p| p.in_win), same(|p| p.out_win));
    let plan = match (kind, inputs, outputs) {
        (Some(CollKind::AllReduce), Some(i), Some(o)) => Direct::AllReduce(i, o),
        (Some(CollKind::AllGather), _, Some(o)) => Direct::AllGather(o),
        (Some(CollKind::AllGather), _, None) if cma => Direct::Pull,
        (Some(CollKind::AllToAll), _, _) if cma => Direct::Pull,
        (Some(CollKind::ReduceScatter), Some(i), _) => Direct::ReduceScatter(i),
        _ => return Ok(false),
    };
    let during = || call.during();
    let get = |id: u64| {
        lock(ctx.windows).get(id).ok_or_else(|| {
            Error::Io(format!(
                "{}: window {id} is not mapped on this rank",
                during()
            ))
        })
    };
    // Streaming stores once the buffers of all ranks together (what the
    // direct kernels stream through) reach twice the threshold: a 2-rank
    // allreduce from 16 MiB (64 MiB of buffers; measured 8.6-10.1 GB/s
    // against 3.6-11.1 with ordinary stores), an allgather from 32 MiB
    // (48 MiB of buffers at 16 MiB measured better with ordinary stores).
    let buffers = (in_len + out_len) * elem * ctx.size;
    let mode = if matches!(io, Io::OutOfPlace { .. })
        && call.nt_store_bytes > 0
        && buffers >= call.nt_store_bytes.saturating_mul(2)
    {
        Store::Streaming
    } else {
        Store::Cached
    };
    let k = Kernel {
        rank: ctx.rank,
        size: ctx.size,
        elem,
        places: &places,
        call,
        op: call.op,
        mode,
    };
    match plan {
        Direct::AllReduce(i, o) => {
            let (inw, outw) = (get(i)?, get(o)?);
            k.check_peers(&inw, &outw, in_len, out_len)?;
            let mut maps = Maps::new(&inw, &outw);
            let (off, len) = partition(fp.count as usize, ctx.size, ctx.rank);
            k.reduce_and_spread(io, &mut maps, off, len)?;
        }
        Direct::AllGather(o) => {
            let outw = get(o)?;
            k.check_peers(&outw, &outw, 0, out_len)?;
            let mut maps = Maps::new(&outw, &outw);
            k.gather(io, &mut maps, in_len)?;
        }
        Direct::ReduceScatter(i) => {
            let inw = get(i)?;
            k.check_peers(&inw, &inw, in_len, 0)?;
            let mut maps = Maps::new(&inw, &inw);
            k.scatter(io, &mut maps, out_len)?;
        }
        Direct::Pull => {
            // Each peer stored its input's address before the sequence
            // number this rank acquired in `read_announcement`.
            let inputs = (0..ctx.size)
                .map(|j| {
                    let at = word(&ctx.control.pages[j], entry(turn) + E_IN_ADDR)?;
                    Ok(at.load(Ordering::Relaxed))
                })
                .collect::<Result<Vec<u64>>>()?;
            let (n, rank, count) = (ctx.size, ctx.rank, in_len);
            let pids = &ctx.control.pids;
            match kind {
                // Every input into its block.
                Some(CollKind::AllGather) => {
                    k.pull(pids, &inputs, io, |j| (0, j * count, count))?
                }
                // Block `rank` of every input into block j.
                _ => {
                    let block = count / n;
                    k.pull(pids, &inputs, io, |j| (rank * block, j * block, block))?
                }
            }
        }
    }
    finish(ctx, fp.seq, &deadline, call)?;
    Ok(true)
}

/// Which collective a fused streaming pass does (`Kernel::spread_streaming`).
#[derive(Clone, Copy)]
enum Fused {
    AllReduce,
    AllGather,
    ReduceScatter,
}

enum Direct {
    AllReduce(u64, u64),
    AllGather(u64),
    ReduceScatter(u64),
    /// Allgather or all-to-all out of the peers' processes (cross-memory
    /// attach).
    Pull,
}

#[inline]
fn word(page: &Region, index: usize) -> Result<&AtomicU64> {
    page.word(index)
        .map_err(|e| Error::Io(format!("window control page: {e}")))
}

/// The announcement slot of check-in number `turn`.
fn entry(turn: u64) -> usize {
    W_ENTRY + (turn % 2) as usize * ENTRY_WORDS
}

/// Whether a call of `kind` whose input has `in_bytes` runs inline in the
/// check-in (where the communicator has control pages and no algorithm is
/// forced): any collective but send/recv, up to `INLINE_BYTES`.
pub(crate) fn runs_inline(kind: CollKind, in_bytes: usize) -> bool {
    !matches!(kind, CollKind::SendRecv) && in_bytes <= INLINE_BYTES
}

/// Whether a call of `kind` whose input has `in_bytes` checks in to run by
/// cross-memory attach on `size` ranks, where the ranks may
/// (`Control::cma`): an allgather or all-to-all whose blocks (an
/// allgather's whole input, one of an all-to-all's `size`) have at least
/// `CMA_MIN_BYTES`. Not a broadcast: through slots the root's copy into a
/// slot and the receiver's copy out of it run at once on two cores, and one
/// kernel copy on the receiver alone was slower from 2 MiB (7-9 against
/// 13-14 GB/s on 2 ranks).
pub(crate) fn runs_cma(kind: CollKind, in_bytes: usize, size: usize) -> bool {
    let block = match kind {
        CollKind::AllGather => in_bytes,
        CollKind::AllToAll => in_bytes / size.max(1),
        _ => return false,
    };
    block >= CMA_MIN_BYTES
}

/// Say on this rank's page that call `fp` runs through slots without a
/// check-in (see `read_announcement`).
fn note_slot_call(ctx: &Ctx<'_>, fp: &Fingerprint) -> Result<()> {
    let page = &ctx.control.pages[ctx.rank];
    word(page, W_SLOTS + 1)?.store(pack(fp), Ordering::Relaxed);
    word(page, W_SLOTS + 2)?.store(fp.count, Ordering::Relaxed);
    word(page, W_SLOTS)?.store(fp.seq, Ordering::Release);
    Ok(())
}

/// Announce call `fp` at check-in `turn`, with where its buffers lie and,
/// for a call peers may copy out of this process, its input's address.
fn announce(
    ctx: &Ctx<'_>,
    turn: u64,
    fp: &Fingerprint,
    place: &Place,
    in_addr: Option<u64>,
) -> Result<()> {
    let page = &ctx.control.pages[ctx.rank];
    let e = entry(turn);
    for (field, value) in [
        (E_FP, pack(fp)),
        (E_COUNT, fp.count),
        (E_IN_WIN, place.in_win),
        (E_IN_OFF, place.in_off),
        (E_OUT_WIN, place.out_win),
        (E_OUT_OFF, place.out_off),
    ] {
        word(page, e + field)?.store(value, Ordering::Relaxed);
    }
    if let Some(addr) = in_addr {
        word(page, e + E_IN_ADDR)?.store(addr, Ordering::Relaxed);
    }
    // Release: a peer that sees the sequence number sees the fields, and
    // (in place) this rank's input as the caller left it.
    word(page, e + E_SEQ)?.store(fp.seq, Ordering::Release);
    Ok(())
}

/// Wait for `peer`'s announcement of check-in `turn`, which must be of
/// call `fp`; where the peer's buffers are. The ranks decide alike which
/// calls check in, from the calls alone, so a peer that announces another
/// call at this turn, or runs this call or a later one through slots
/// without checking in, was given a different call: a mismatch.
fn read_announcement(
    ctx: &Ctx<'_>,
    turn: u64,
    peer: usize,
    fp: &Fingerprint,
    deadline: &Deadline,
    call: &Call,
) -> Result<Place> {
    let page = &ctx.control.pages[peer];
    let e = entry(turn);
    let seq_word = word(page, e + E_SEQ)?;
    let slots_word = word(page, W_SLOTS)?;
    wait(
        ctx,
        peer,
        deadline,
        call,
        "its announcement of the call",
        || {
            seq_word.load(Ordering::Acquire) >= fp.seq
                || slots_word.load(Ordering::Acquire) >= fp.seq
        },
    )?;
    let read = |at: usize| word(page, at).map(|w| w.load(Ordering::Relaxed));
    let seq = seq_word.load(Ordering::Acquire);
    let heard = if seq >= fp.seq {
        unpack(seq, read(e + E_FP)?, read(e + E_COUNT)?)
    } else {
        let seq = slots_word.load(Ordering::Acquire);
        unpack(seq, read(W_SLOTS + 1)?, read(W_SLOTS + 2)?)
    };
    if heard != *fp || seq != fp.seq {
        return Err(Error::Mismatch {
            peer,
            local: fingerprint::describe(fp),
            remote: fingerprint::describe(&heard),
        });
    }
    Ok(Place {
        in_win: read(e + E_IN_WIN)?,
        in_off: read(e + E_IN_OFF)?,
        out_win: read(e + E_OUT_WIN)?,
        out_off: read(e + E_OUT_OFF)?,
    })
}

/// Say this rank is done with call `seq`, and wait until every peer is.
fn finish(ctx: &Ctx<'_>, seq: u64, deadline: &Deadline, call: &Call) -> Result<()> {
    // Release: a peer that sees it sees every byte this rank wrote into
    // the peer's buffers.
    word(&ctx.control.pages[ctx.rank], W_DONE)?.store(seq, Ordering::Release);
    for peer in (0..ctx.size).filter(|&p| p != ctx.rank) {
        let done = word(&ctx.control.pages[peer], W_DONE)?;
        wait(ctx, peer, deadline, call, "it to finish the call", || {
            done.load(Ordering::Acquire) >= seq
        })?;
    }
    Ok(())
}

/// A call's deadline, read from the clock only when a wait first has to
/// (a check-in whose peers are already there reads no clock).
struct Deadline {
    timeout: Duration,
    at: std::cell::Cell<Option<Instant>>,
}

impl Deadline {
    fn new(timeout: Duration) -> Self {
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

fn inline_at(turn: u64) -> usize {
    (W_INLINE + (turn % 2) as usize * INLINE_WORDS) * 8
}

/// Copy a small input into this rank's announcement slot of check-in
/// `turn`.
fn write_inline(ctx: &Ctx<'_>, turn: u64, bytes: &[u8]) -> Result<()> {
    if bytes.len() <= 8 {
        let mut w = [0u8; 8];
        w[..bytes.len()].copy_from_slice(bytes);
        let page = &ctx.control.pages[ctx.rank];
        word(page, entry(turn) + E_SMALL)?.store(u64::from_ne_bytes(w), Ordering::Relaxed);
        return Ok(());
    }
    let mut own = lock(&ctx.control.own);
    own.slice_mut(inline_at(turn), bytes.len())
        .map_err(|e| Error::Io(format!("window control page: {e}")))?
        .copy_from_slice(bytes);
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
        small[0] = word(&ctx.control.pages[j], entry(turn) + E_SMALL)?.load(Ordering::Relaxed);
        let all: &[T] = bytemuck::cast_slice(&small[..]);
        return all
            .get(off..off + len)
            .ok_or_else(|| Error::Io(format!("inline input {off}+{len} of {total}")));
    }
    let raw = ctx.control.pages[j]
        .slice(inline_at(turn) + off * elem, len * elem)
        .map_err(|e| Error::Io(format!("window control page: {e}")))?;
    bytemuck::try_cast_slice(raw).map_err(|e| Error::Io(format!("window control page: {e:?}")))
}

/// `output[..len] = input_0 op input_1 op ...` over elements
/// `off..off + len` of the inline inputs of check-in `turn` (`total`
/// elements each; this rank's own from its buffer), in rank order, so
/// that every rank gets the same bits.
fn reduce_inline<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut Io<'_, T>,
    op: ReduceOp,
    (turn, total): (u64, usize),
    off: usize,
    len: usize,
) -> Result<()> {
    let words = (len * std::mem::size_of::<T>()).div_ceil(8);
    // Zeroing 4 KiB of stack costs more than an 8-byte allreduce.
    let mut small_acc = [0u64; 8];
    let mut big;
    let acc: &mut [u64] = if words <= small_acc.len() {
        &mut small_acc[..words]
    } else {
        big = [0u64; INLINE_WORDS];
        &mut big[..words]
    };
    let sum: &mut [T] = &mut bytemuck::cast_slice_mut(acc)[..len];
    for j in 0..ctx.size {
        let mut small = [0u64; 1];
        let x = if j == ctx.rank {
            io.input(off, len)
        } else {
            peer_inline(ctx, j, turn, total, (off, len), &mut small)?
        };
        if j == 0 {
            sum.copy_from_slice(x);
        } else {
            reduce_into(op, sum, x);
        }
    }
    io.output(0, len).copy_from_slice(sum);
    Ok(())
}

/// A small call, all in check-in `turn`: each rank puts its input (at most
/// `INLINE_BYTES`; a broadcast's root only) on its page with its
/// announcement, reads every peer's announcement, then takes what it needs
/// from the peers' pages. Nobody touches another rank's buffers, so there
/// is no completion wait: one exchange in all.
fn run_inline<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut Io<'_, T>,
    call: &Call,
    kind: CollKind,
    in_len: usize,
    turn: u64,
    deadline: &Deadline,
) -> Result<()> {
    let fp = call.fingerprint;
    let (rank, size) = (ctx.rank, ctx.size);
    let root = fp.root as usize;
    let count = fp.count as usize;
    let publishes = match kind {
        CollKind::Barrier => false,
        CollKind::Broadcast => rank == root,
        _ => true,
    };
    if publishes {
        write_inline(ctx, turn, bytemuck::cast_slice(io.input(0, in_len)))?;
    }
    announce(ctx, turn, &fp, &Place::default(), None)?;
    for peer in (0..size).filter(|&p| p != rank) {
        read_announcement(ctx, turn, peer, &fp, deadline, call)?;
    }
    let inputs = (turn, in_len);
    // Copy peer `j`'s elements `from` (of its input) into `to` (of the
    // output); this rank's own straight from input to output.
    let take = |io: &mut Io<'_, T>, j: usize, from: (usize, usize), to: usize| -> Result<()> {
        if j == rank {
            let own = Step::local(Prim::Copy, Operand::Input, from.0, to, from.1);
            io.copy_input_to_output(Store::Cached, &own);
            return Ok(());
        }
        let mut small = [0u64; 1];
        let x = peer_inline(ctx, j, turn, in_len, from, &mut small)?;
        io.output(to, from.1).copy_from_slice(x);
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

/// Say on this rank's page that it has dropped its communicator: a peer
/// waiting for it at a check-in ends with `PeerFailed` naming it.
pub(crate) fn leave(control: &Control, rank: usize) {
    if let Some(w) = control.pages.get(rank).and_then(|p| p.word(W_LEFT).ok()) {
        w.store(1, Ordering::Release);
    }
}

/// Wait for `ready`: spin, yield, then sleep; end on abort, at the
/// deadline, or when `peer`'s process is gone.
fn wait(
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
    let spins = if ctx.size > online_cpus() {
        OVERSUBSCRIBED_SPINS
    } else {
        SPINS
    };
    let left = word(&ctx.control.pages[peer], W_LEFT)?;
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
            if w.liveness_due(now) && ferroccl_shm::process_gone(ctx.control.pids[peer]) && !ready()
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

/// CPUs of the machine (not of this process's affinity mask: a launcher
/// that pins each rank to one CPU does not make the ranks share CPUs), read
/// once.
fn online_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        // "0-3,8-11"
        let count = std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .map(|list| {
                list.trim()
                    .split(',')
                    .filter_map(|range| match range.split_once('-') {
                        Some((a, b)) => {
                            let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                            Some(b.checked_sub(a)? + 1)
                        }
                        None => range.parse::<usize>().ok().map(|_| 1),
                    })
                    .sum::<usize>()
            })
            .filter(|&n| n > 0);
        count.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// Each peer's part of one window as mapped here, by rank (`None` for this
/// rank's own).
type Parts = Vec<Option<Region>>;

/// The peers' parts of the call's input and output windows (one lock when
/// both are the same window).
struct Maps<'a> {
    input: MutexGuard<'a, Parts>,
    output: Option<MutexGuard<'a, Parts>>,
}

impl<'a> Maps<'a> {
    fn new(input: &'a Arc<WindowMaps>, output: &'a Arc<WindowMaps>) -> Self {
        let same = Arc::ptr_eq(input, output);
        Maps {
            input: lock(&input.peers),
            output: (!same).then(|| lock(&output.peers)),
        }
    }

    fn input_region(&self, peer: usize) -> Option<&Region> {
        self.input.get(peer)?.as_ref()
    }

    fn output_region(&mut self, peer: usize) -> Option<&mut Region> {
        match &mut self.output {
            Some(out) => out.get_mut(peer)?.as_mut(),
            None => self.input.get_mut(peer)?.as_mut(),
        }
    }
}

struct Kernel<'a> {
    rank: usize,
    size: usize,
    elem: usize,
    places: &'a [Place],
    call: &'a Call,
    op: ReduceOp,
    mode: Store,
}

impl Kernel<'_> {
    fn protocol(&self, peer: usize, detail: String) -> Error {
        Error::Protocol {
            peer,
            during: self.call.during(),
            detail,
        }
    }

    /// Check what the peers announced against their mappings here: their
    /// buffers lie inside their parts of the windows, at offsets aligned
    /// for the type, and an input and an output in one window are the same
    /// bytes (in place) or apart.
    fn check_peers(
        &self,
        inw: &WindowMaps,
        outw: &WindowMaps,
        in_elems: usize,
        out_elems: usize,
    ) -> Result<()> {
        let elem = self.elem as u64;
        let same = std::ptr::eq(inw, outw);
        let ins = lock(&inw.peers);
        let outs = (!same).then(|| lock(&outw.peers));
        let outs = outs.as_deref().unwrap_or(&ins);
        for peer in (0..self.size).filter(|&p| p != self.rank) {
            let p = self.places[peer];
            let span = |off: u64, elems: usize, regions: &[Option<Region>]| -> Result<(u64, u64)> {
                let bytes = elems as u64 * elem;
                match regions.get(peer).and_then(Option::as_ref).map(Region::len) {
                    Some(len)
                        if off.is_multiple_of(elem)
                            && off.checked_add(bytes).is_some_and(|end| end <= len as u64) =>
                    {
                        Ok((off, off + bytes))
                    }
                    Some(len) => Err(self.protocol(
                        peer,
                        format!(
                            "it announced {bytes} bytes at offset {off} of its {len}-byte part \
                             of a window"
                        ),
                    )),
                    None => Err(self.unmapped(peer)),
                }
            };
            let input = (in_elems > 0)
                .then(|| span(p.in_off, in_elems, &ins))
                .transpose()?;
            let output = (out_elems > 0)
                .then(|| span(p.out_off, out_elems, outs))
                .transpose()?;
            if let (Some((a, b)), Some((c, d))) = (input, output) {
                if p.in_win == p.out_win && !(b <= c || d <= a || (a, b) == (c, d)) {
                    return Err(self.protocol(
                        peer,
                        "its input and output overlap without being the same buffer".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Elements `start..start + len` of rank `j`'s input.
    fn input<'x, T: Element>(
        &self,
        io: &'x Io<'_, T>,
        maps: &'x Maps<'_>,
        j: usize,
        start: usize,
        len: usize,
    ) -> Result<&'x [T]> {
        if j == self.rank {
            return Ok(io.input(start, len));
        }
        self.peer_input(maps.input_region(j), j, start, len)
    }

    /// Elements `start..start + len` of peer `j`'s input, in `region` (its
    /// part of the input window as mapped here).
    fn peer_input<'x, T: Element>(
        &self,
        region: Option<&'x Region>,
        j: usize,
        start: usize,
        len: usize,
    ) -> Result<&'x [T]> {
        let off = self.places[j].in_off as usize + start * self.elem;
        let bytes = region
            .ok_or_else(|| self.unmapped(j))?
            .slice(off, len * self.elem)
            .map_err(|e| self.protocol(j, e.to_string()))?;
        bytemuck::try_cast_slice(bytes).map_err(|e| self.protocol(j, format!("{e:?}")))
    }

    fn unmapped(&self, peer: usize) -> Error {
        self.protocol(peer, "its part of the window is not mapped here".into())
    }

    /// Elements `start..start + len` of rank `j`'s output.
    fn output<'x, T: Element>(
        &self,
        io: &'x mut Io<'_, T>,
        maps: &'x mut Maps<'_>,
        j: usize,
        start: usize,
        len: usize,
    ) -> Result<&'x mut [T]> {
        if j == self.rank {
            return Ok(io.output(start, len));
        }
        self.peer_output(maps, j, start, len)
    }

    /// Elements `start..start + len` of peer `j`'s output, in its window.
    fn peer_output<'x, T: Element>(
        &self,
        maps: &'x mut Maps<'_>,
        j: usize,
        start: usize,
        len: usize,
    ) -> Result<&'x mut [T]> {
        self.peer_output_in(maps.output_region(j), j, start, len)
    }

    /// Elements `start..start + len` of peer `j`'s output, in `region` (its
    /// part of the output window as mapped here).
    fn peer_output_in<'x, T: Element>(
        &self,
        region: Option<&'x mut Region>,
        j: usize,
        start: usize,
        len: usize,
    ) -> Result<&'x mut [T]> {
        let off = self.places[j].out_off as usize + start * self.elem;
        let bytes = region
            .ok_or_else(|| self.unmapped(j))?
            .slice_mut(off, len * self.elem)
            .map_err(|e| self.protocol(j, e.to_string()))?;
        bytemuck::try_cast_slice_mut(bytes).map_err(|e| self.protocol(j, format!("{e:?}")))
    }

    /// `tmp = input_0 op input_1 op ... ` over `start..start + tmp.len()`
    /// of the inputs (rank order, so every rank would get the same bits).
    fn reduce_block<T: Element>(
        &self,
        io: &Io<'_, T>,
        maps: &Maps<'_>,
        start: usize,
        tmp: &mut [T],
    ) -> Result<()> {
        let k = tmp.len();
        let first = self.input(io, maps, 0, start, k)?;
        if self.size == 1 {
            tmp.copy_from_slice(first);
            return Ok(());
        }
        reduce_to(self.op, tmp, first, self.input(io, maps, 1, start, k)?);
        for j in 2..self.size {
            reduce_into(self.op, tmp, self.input(io, maps, j, start, k)?);
        }
        Ok(())
    }

    fn block<T>(&self) -> usize {
        (BLOCK_BYTES / std::mem::size_of::<T>().max(1)).max(1)
    }

    /// Reduce elements `from..from + len` of every input block by block
    /// (through an L1-sized buffer) and hand each result to `put` with its
    /// offset from `from`.
    fn reduce_blocks<T: Element>(
        &self,
        io: &mut Io<'_, T>,
        maps: &mut Maps<'_>,
        from: usize,
        len: usize,
        mut put: impl FnMut(&mut Io<'_, T>, &mut Maps<'_>, usize, &[T]) -> Result<()>,
    ) -> Result<()> {
        // The buffer starts on a cache line, so that the AVX-512 kernels'
        // 64-byte stores into it never split across two lines (no
        // difference measured at 64 MiB: memory is the limit there).
        let want = self.block::<T>().min(len);
        let mut buf = vec![T::zeroed(); want + 64 / std::mem::size_of::<T>().max(1)];
        let skip = buf.as_ptr().align_offset(64).min(buf.len() - want);
        let tmp = &mut buf[skip..skip + want];
        let mut done = 0;
        while done < len {
            let k = tmp.len().min(len - done);
            let t = &mut tmp[..k];
            self.reduce_block(io, maps, from + done, t)?;
            put(io, maps, done, t)?;
            done += k;
        }
        Ok(())
    }

    /// With streaming stores, out of place: elements `in_start..in_start +
    /// len` of every rank's input (allreduce, reduce-scatter) or of this
    /// rank's alone (allgather), combined and written into `out_start..
    /// out_start + len` of every rank's output (allreduce, allgather) or of
    /// this rank's alone (reduce-scatter), in one fused pass (see
    /// `reduce::reduce_to_streams`). False where that path does not apply
    /// (cached stores, an allreduce's input and output in one window,
    /// outputs that lie differently against cache lines): the block path
    /// then does the work.
    fn spread_streaming<T: Element>(
        &self,
        io: &mut Io<'_, T>,
        maps: &mut Maps<'_>,
        kind: Fused,
        in_start: usize,
        out_start: usize,
        len: usize,
    ) -> Result<bool> {
        if self.mode != Store::Streaming || len == 0 {
            return Ok(false);
        }
        let Io::OutOfPlace { input, output } = io else {
            return Ok(false);
        };
        // Which maps hold the peers' inputs and outputs: an allgather's
        // input and a reduce-scatter's output need not be in a window, and
        // the window they use is the one set of maps.
        let (in_regions, out_regions): (Option<&Parts>, Option<&mut Parts>) =
            match (kind, maps.output.as_mut()) {
                (Fused::AllReduce, Some(out)) => (Some(&maps.input), Some(&mut **out)),
                (Fused::AllReduce, None) => return Ok(false),
                (Fused::AllGather, out) => (None, Some(out.map_or(&mut *maps.input, |o| &mut **o))),
                (Fused::ReduceScatter, _) => (Some(&maps.input), None),
            };
        let ranks = if in_regions.is_some() {
            0..self.size
        } else {
            self.rank..self.rank + 1
        };
        let mut ins: Vec<&[T]> = Vec::with_capacity(ranks.len());
        for j in ranks {
            ins.push(if j == self.rank {
                &input[in_start..in_start + len]
            } else {
                let region = in_regions.and_then(|r| r.get(j)).and_then(Option::as_ref);
                self.peer_input(region, j, in_start, len)?
            });
        }
        // Every peer's output part at once (distinct regions of one list).
        let mut outs: Vec<&mut [T]> = Vec::with_capacity(self.size);
        if let Some(out_regions) = out_regions {
            let mut regions = out_regions.iter_mut().enumerate();
            for j in (0..self.size).filter(|&j| j != self.rank) {
                let region = regions.find(|(i, _)| *i == j).and_then(|(_, r)| r.as_mut());
                outs.push(self.peer_output_in(region, j, out_start, len)?);
            }
        }
        outs.push(&mut output[out_start..out_start + len]);
        Ok(crate::reduce::reduce_to_streams(self.op, &ins, &mut outs))
    }

    /// Allreduce share: piece `off..off + len` of every input, reduced,
    /// into the same piece of every output.
    fn reduce_and_spread<T: Element>(
        &self,
        io: &mut Io<'_, T>,
        maps: &mut Maps<'_>,
        off: usize,
        len: usize,
    ) -> Result<()> {
        if self.spread_streaming(io, maps, Fused::AllReduce, off, off, len)? {
            return Ok(());
        }
        self.reduce_blocks(io, maps, off, len, |io, maps, done, t| {
            // Peers first: they wait on this rank, it waits on nobody.
            for step in 1..=self.size {
                let j = (self.rank + step) % self.size;
                store(self.mode, self.output(io, maps, j, off + done, t.len())?, t);
            }
            Ok(())
        })
    }

    /// Allgather share: this rank's input (`count` elements) into block
    /// `rank` of every output.
    fn gather<T: Element>(
        &self,
        io: &mut Io<'_, T>,
        maps: &mut Maps<'_>,
        count: usize,
    ) -> Result<()> {
        let base = self.rank * count;
        if self.spread_streaming(io, maps, Fused::AllGather, 0, base, count)? {
            return Ok(());
        }
        let block = self.block::<T>();
        let mut done = 0;
        while done < count {
            let k = block.min(count - done);
            for step in 1..self.size {
                let j = (self.rank + step) % self.size;
                let dst = self.peer_output(maps, j, base + done, k)?;
                store(self.mode, dst, io.input(done, k));
            }
            // This rank's own block while the input block is in cache
            // (nothing to do in place).
            let own = Step::local(Prim::Copy, Operand::Input, done, base + done, k);
            io.copy_input_to_output(self.mode, &own);
            done += k;
        }
        Ok(())
    }

    /// Reduce-scatter share: block `rank` of every input, reduced, into
    /// this rank's output (`count` elements).
    fn scatter<T: Element>(
        &self,
        io: &mut Io<'_, T>,
        maps: &mut Maps<'_>,
        count: usize,
    ) -> Result<()> {
        let from = self.rank * count;
        if self.spread_streaming(io, maps, Fused::ReduceScatter, from, 0, count)? {
            return Ok(());
        }
        self.reduce_blocks(io, maps, from, count, |io, _, done, t| {
            store(self.mode, io.output(done, t.len()), t);
            Ok(())
        })
    }

    /// Copy out of the peers' processes (cross-memory attach): for each
    /// rank `j`, this one first and then the nearest peers, `part(j)` says
    /// which elements (`from`, of `j`'s input, which lies at `inputs[j]` in
    /// process `pids[j]`) go where (`to`, of this rank's output), and how
    /// many. This rank's own part is copied from input to output. Reads
    /// only.
    fn pull<T: Element>(
        &self,
        pids: &[u32],
        inputs: &[u64],
        io: &mut Io<'_, T>,
        part: impl Fn(usize) -> (usize, usize, usize),
    ) -> Result<()> {
        for step in 0..self.size {
            let j = (self.rank + step) % self.size;
            let (from, to, len) = part(j);
            if j == self.rank {
                let own = Step::local(Prim::Copy, Operand::Input, from, to, len);
                io.copy_input_to_output(Store::Cached, &own);
                continue;
            }
            let fail = |reason: String| Error::PeerFailed {
                rank: j,
                during: self.call.during(),
                reason,
            };
            let at = (from as u64)
                .checked_mul(self.elem as u64)
                .and_then(|b| inputs[j].checked_add(b))
                .ok_or_else(|| fail(format!("its announced input address overflows at {from}")))?;
            let dst: &mut [u8] = bytemuck::cast_slice_mut(io.output(to, len));
            let bytes = dst.len();
            ferroccl_shm::read_process_memory(pids[j], at as usize, dst).map_err(|e| {
                fail(format!(
                    "copying {bytes} bytes of its input at {at:#x} in process {} by cross-memory \
                     attach failed: {e}",
                    pids[j]
                ))
            })?;
        }
        Ok(())
    }
}
