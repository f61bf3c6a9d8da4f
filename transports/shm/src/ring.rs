//! One direction of a connection as a file mapped by two processes: the
//! control block (identity, set-up handshake, counters, close and failure
//! flags) and the slots. This module owns every access to the mapping and
//! is, with `os`, the only place with `unsafe`; it knows nothing of
//! deadlines, peers or errors beyond I/O.
//!
//! Layout (offsets in bytes, native endianness: both ends are on one host):
//!
//! ```text
//!    0  identity   magic u64, version u32, from u32, to u32, steps u32,
//!                  token u64, comm_id u64, chunk_bytes u64, total_len u64
//!   64  set-up     ready u32, attached u32, refused u32, creator_pid u32,
//!                  opener_pid u32
//!  128  tail u64   frames published by the sender (only the sender writes)
//!  192  head u64   frames released by the receiver (only the receiver writes)
//!  256  state      sender_closed u32, receiver_closed u32, failure u32,
//!                  reason_len u32, failed_rank u64
//!  320  reason     256 bytes (UTF-8)
//! 1024  slot 0     published u64, 40-byte frame header, 16 bytes of inline
//!                  payload or, for a larger payload, its placement (one
//!                  cache line), chunk_bytes payload area, padding to a
//!                  multiple of 64
//!       slot 1 ... slot steps-1
//! ```
//!
//! A payload larger than the inline bytes starts `placement` x 64 bytes
//! into the slot's payload area (a u32 in the inline bytes' place). The
//! sender moves a slot's payloads along its area from one use to the next
//! ([`Producer::fill_and_publish`]; only payloads whose length the caller
//! gave beforehand, `SlotSender::send_sized_until`, and not where ranks
//! share CPUs), so that a call of small frames
//! touches every slot's whole area over a few rounds instead of the first
//! bytes of each again and again. Lines the receiver read are then gone
//! from its core's private cache by the time the sender writes them again,
//! and that write no longer waits on the other core to give them up: on
//! the AMD EPYC build VM a 2-rank allreduce of 64 KiB took half the time
//! (docs/performance-log.md, "Payloads spread over the slots").
//!
//! Every field of the control block is an atomic, so the two processes
//! never race on plain memory there. Slots are plain memory (but for their
//! `published` word, an atomic) whose owner is decided by the counters:
//! slot `k % steps` belongs to the sender while `head <= k` and `k == tail`
//! (it is free and next), to the receiver while `head == k < tail` (filled
//! and next). The sender writes a slot, then stores its `published` word =
//! `k + 1` with Release, then `tail`; the receiver loads the `published`
//! word of the slot it expects next with Acquire before reading it. The
//! receiver reads the slot and then stores `head` with Release; the sender
//! loads `head` with Acquire before writing the slot again. Each counter
//! and each `published` word has one writer (single producer, single
//! consumer), so plain stores suffice.
//!
//! The receiver polls the slot itself rather than `tail`: the word, the
//! header and a payload of up to 16 bytes share one cache line, so a small
//! frame costs the receiver one line moved between cores instead of three
//! (counter, header, payload), one after the other. `tail` is still kept
//! (how many frames went out, for the drop of a link).
//!
//! [`Segment::fifo`] states this layout as the transport core's
//! `FifoDescriptor` (what a device writer of the slots would need); a
//! change here changes it there.

use ferroccl_transport::{
    Counter, FifoDescriptor, InlinePayload, Mapping, MemoryKind, PayloadPlacement, SlotLayout,
    HEADER_BYTES,
};
use memmap2::{MmapOptions, MmapRaw};
use std::fs::File;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

/// "FCCLSHM1" as a little-endian u64.
const SEGMENT_MAGIC: u64 = u64::from_le_bytes(*b"FCCLSHM1");
/// Layout version; bumped on any change of the layout above (2: the
/// `published` word and the inline payload in each slot; 3: the payload's
/// placement).
pub(crate) const LAYOUT_VERSION: u32 = 3;
/// Where slot 0 starts.
const SLOTS_OFFSET: usize = 1024;
/// Where a slot's frame header starts, after its `published` word.
const HEADER_OFFSET: usize = 8;
/// Where the payload of a frame of at most `INLINE_BYTES` starts: right
/// after the header, in the same cache line.
const INLINE_OFFSET: usize = HEADER_OFFSET + HEADER_BYTES;
/// Payloads of at most this many bytes travel in the header's cache line.
pub(crate) const INLINE_BYTES: usize = PAYLOAD_OFFSET - INLINE_OFFSET;
/// Where a larger payload's area starts, from the slot's start (64-aligned).
const PAYLOAD_OFFSET: usize = 64;
/// Where a larger payload's placement (u32, in `PLACEMENT_UNIT`s past
/// `PAYLOAD_OFFSET`) is: in the inline payload's bytes, which it leaves
/// unused.
const PLACEMENT_OFFSET: usize = INLINE_OFFSET;
/// The placement's unit, in bytes.
const PLACEMENT_UNIT: usize = 64;
/// Successive payloads in one slot start this far apart at least (their
/// length rounded up to it): a page, so that a payload keeps its
/// alignment within pages from one use of the slot to the next.
const PLACEMENT_STEP: usize = 4096;
/// Most bytes of a failure reason kept in the segment.
pub(crate) const MAX_REASON_BYTES: usize = 256;

// Counters and slots need real 64-bit atomics shared across processes.
#[cfg(not(target_has_atomic = "64"))]
compile_error!("ferroccl-shm needs 64-bit atomics");

/// The control block at offset 0 of a segment.
#[repr(C)]
struct Control {
    // Identity: written by the creator before `ready`, then read-only.
    magic: AtomicU64,
    version: AtomicU32,
    from: AtomicU32,
    to: AtomicU32,
    steps: AtomicU32,
    token: AtomicU64,
    comm_id: AtomicU64,
    chunk_bytes: AtomicU64,
    total_len: AtomicU64,
    _pad0: [u8; 8],
    // Set-up.
    ready: AtomicU32,
    attached: AtomicU32,
    refused: AtomicU32,
    creator_pid: AtomicU32,
    opener_pid: AtomicU32,
    _pad1: [u8; 44],
    tail: AtomicU64,
    _pad2: [u8; 56],
    head: AtomicU64,
    _pad3: [u8; 56],
    // State.
    sender_closed: AtomicU32,
    receiver_closed: AtomicU32,
    failure: AtomicU32,
    reason_len: AtomicU32,
    failed_rank: AtomicU64,
    _pad4: [u8; 40],
    reason: [AtomicU8; MAX_REASON_BYTES],
}

const _: () = {
    assert!(std::mem::size_of::<Control>() <= SLOTS_OFFSET);
    assert!(std::mem::offset_of!(Control, ready) == 64);
    assert!(std::mem::offset_of!(Control, tail) == 128);
    assert!(std::mem::offset_of!(Control, head) == 192);
    assert!(std::mem::offset_of!(Control, sender_closed) == 256);
    assert!(std::mem::offset_of!(Control, reason) == 320);
    assert!(INLINE_OFFSET <= PAYLOAD_OFFSET);
    assert!(INLINE_BYTES >= 8);
    assert!(PLACEMENT_OFFSET + 4 <= PAYLOAD_OFFSET);
    assert!(PLACEMENT_STEP.is_multiple_of(PLACEMENT_UNIT));
};

/// `failure` values: nobody reported one, one is being written, one is
/// readable.
const FAILURE_NONE: u32 = 0;
const FAILURE_WRITING: u32 = 1;
const FAILURE_SET: u32 = 2;

/// The shape of a segment, from the local `ListenConfig` (never from the
/// file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) chunk_bytes: usize,
    pub(crate) steps: usize,
}

impl Geometry {
    /// Bytes from one slot's start to the next.
    pub(crate) fn stride(&self) -> Option<usize> {
        PAYLOAD_OFFSET.checked_add(self.chunk_bytes.checked_next_multiple_of(64)?)
    }

    /// Bytes of the whole segment, or None if that overflows.
    pub(crate) fn total_len(&self) -> Option<usize> {
        SLOTS_OFFSET.checked_add(self.stride()?.checked_mul(self.steps)?)
    }
}

/// Who a segment is for; written by the creator, checked by the opener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) token: u64,
    pub(crate) comm_id: u64,
    pub(crate) from: u32,
    pub(crate) to: u32,
    pub(crate) chunk_bytes: u64,
    pub(crate) steps: u32,
    pub(crate) total_len: u64,
}

/// Identity fields as the opener finds them, before any is trusted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FoundIdentity {
    pub(crate) magic_ok: bool,
    pub(crate) version: u32,
    pub(crate) id: Identity,
    pub(crate) creator_pid: u32,
}

/// One mapped segment. Its length is fixed at mapping time and is at
/// least `SLOTS_OFFSET`; slot accessors are given the geometry that the
/// mapping was sized for.
#[derive(Debug)]
pub(crate) struct Segment {
    map: MmapRaw,
    geometry: Option<Geometry>,
}

impl Segment {
    /// Map the first `len` bytes of `file` shared and writable. `len` must
    /// be at least the control block; the caller has checked that the file
    /// is that long (a shorter file would fault on access).
    fn map(file: &File, len: usize, geometry: Option<Geometry>) -> std::io::Result<Segment> {
        if len < SLOTS_OFFSET {
            return Err(std::io::Error::other(
                "segment shorter than its control block",
            ));
        }
        let map = MmapOptions::new().len(len).map_raw(file)?;
        if map.len() < len {
            return Err(std::io::Error::other("short mapping"));
        }
        Ok(Segment { map, geometry })
    }

    /// Map just the control block of a file at least that long, to read
    /// its identity before trusting anything else in it.
    pub(crate) fn map_control(file: &File) -> std::io::Result<Segment> {
        Segment::map(file, SLOTS_OFFSET, None)
    }

    /// Map a whole segment of `geometry` (the file is `total_len` long).
    pub(crate) fn map_full(file: &File, geometry: Geometry) -> std::io::Result<Segment> {
        let len = geometry
            .total_len()
            .ok_or_else(|| std::io::Error::other("segment size overflows"))?;
        Segment::map(file, len, Some(geometry))
    }

    /// Smallest file that holds a control block.
    pub(crate) const CONTROL_BYTES: u64 = SLOTS_OFFSET as u64;

    fn ctl(&self) -> &Control {
        // SAFETY: the mapping is page-aligned (so aligned for Control),
        // at least SLOTS_OFFSET >= size_of::<Control>() bytes long (checked
        // in `map`) and lives as long as `self`. Control is made of atomics
        // and padding bytes that nobody reads, for which any bit pattern is
        // valid, and atomics may be written through a shared reference by
        // this and the peer process alike.
        unsafe { &*(self.map.as_mut_ptr() as *const Control) }
    }

    // ---- set-up ----------------------------------------------------------

    /// Creator: write the identity, then mark the segment ready (Release,
    /// so that an opener that sees `ready` sees the identity).
    pub(crate) fn write_identity(&self, id: &Identity, creator_pid: u32) {
        let c = self.ctl();
        c.magic.store(SEGMENT_MAGIC, Ordering::Relaxed);
        c.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        c.token.store(id.token, Ordering::Relaxed);
        c.comm_id.store(id.comm_id, Ordering::Relaxed);
        c.from.store(id.from, Ordering::Relaxed);
        c.to.store(id.to, Ordering::Relaxed);
        c.chunk_bytes.store(id.chunk_bytes, Ordering::Relaxed);
        c.steps.store(id.steps, Ordering::Relaxed);
        c.total_len.store(id.total_len, Ordering::Relaxed);
        c.creator_pid.store(creator_pid, Ordering::Relaxed);
        c.ready.store(1, Ordering::Release);
    }

    /// Opener: the identity, once the creator has marked it ready.
    pub(crate) fn read_identity(&self) -> Option<FoundIdentity> {
        let c = self.ctl();
        if c.ready.load(Ordering::Acquire) != 1 {
            return None;
        }
        Some(FoundIdentity {
            magic_ok: c.magic.load(Ordering::Relaxed) == SEGMENT_MAGIC,
            version: c.version.load(Ordering::Relaxed),
            id: Identity {
                token: c.token.load(Ordering::Relaxed),
                comm_id: c.comm_id.load(Ordering::Relaxed),
                from: c.from.load(Ordering::Relaxed),
                to: c.to.load(Ordering::Relaxed),
                chunk_bytes: c.chunk_bytes.load(Ordering::Relaxed),
                steps: c.steps.load(Ordering::Relaxed),
                total_len: c.total_len.load(Ordering::Relaxed),
            },
            creator_pid: c.creator_pid.load(Ordering::Relaxed),
        })
    }

    /// Opener: say that it has mapped (and unlinked) the segment.
    pub(crate) fn mark_attached(&self, opener_pid: u32) {
        let c = self.ctl();
        c.opener_pid.store(opener_pid, Ordering::Relaxed);
        c.attached.store(1, Ordering::Release);
    }

    /// Opener: refuse the segment with a reason code (non-zero).
    pub(crate) fn mark_refused(&self, code: u32) {
        self.ctl().refused.store(code, Ordering::Release);
    }

    /// Creator: whether the opener attached.
    /// How many frames the sender has published on this segment so far.
    pub(crate) fn published(&self) -> u64 {
        self.ctl().tail.load(Ordering::Acquire)
    }

    pub(crate) fn attached(&self) -> bool {
        self.ctl().attached.load(Ordering::Acquire) == 1
    }

    /// Creator: the opener's refusal code, 0 if none.
    pub(crate) fn refused(&self) -> u32 {
        self.ctl().refused.load(Ordering::Acquire)
    }

    // ---- close and failure flags -----------------------------------------

    /// The sender will publish nothing more (a goodbye). Release: a
    /// receiver that sees it (Acquire) and then loads `tail` sees every
    /// frame published before it.
    pub(crate) fn set_sender_closed(&self) {
        self.ctl().sender_closed.store(1, Ordering::Release);
    }

    pub(crate) fn sender_closed(&self) -> bool {
        self.ctl().sender_closed.load(Ordering::Acquire) == 1
    }

    /// The receiver will release nothing more.
    pub(crate) fn set_receiver_closed(&self) {
        self.ctl().receiver_closed.store(1, Ordering::Release);
    }

    pub(crate) fn receiver_closed(&self) -> bool {
        self.ctl().receiver_closed.load(Ordering::Acquire) == 1
    }

    /// Record that `rank` failed; the first report wins (the CAS elects
    /// one writer of the reason bytes).
    pub(crate) fn set_failure(&self, rank: u64, reason: &[u8]) {
        let c = self.ctl();
        if c.failure
            .compare_exchange(
                FAILURE_NONE,
                FAILURE_WRITING,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        let n = reason.len().min(MAX_REASON_BYTES);
        for (cell, b) in c.reason.iter().zip(&reason[..n]) {
            cell.store(*b, Ordering::Relaxed);
        }
        c.reason_len.store(n as u32, Ordering::Relaxed);
        c.failed_rank.store(rank, Ordering::Relaxed);
        c.failure.store(FAILURE_SET, Ordering::Release);
    }

    /// The failed rank and reason, once fully written.
    pub(crate) fn failure(&self) -> Option<(u64, Vec<u8>)> {
        let c = self.ctl();
        if c.failure.load(Ordering::Acquire) != FAILURE_SET {
            return None;
        }
        let n = (c.reason_len.load(Ordering::Relaxed) as usize).min(MAX_REASON_BYTES);
        let reason = c.reason[..n]
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        Some((c.failed_rank.load(Ordering::Relaxed), reason))
    }

    fn geometry(&self) -> Geometry {
        self.geometry
            .expect("slot access on a segment mapped for its control block only")
    }

    /// This segment's FIFO as the layout above places it in this process's
    /// mapping (the same for the sending and the receiving end: both see
    /// the whole segment). Only for a segment mapped whole.
    pub(crate) fn fifo(&self) -> FifoDescriptor {
        let g = self.geometry();
        let base = self.map.as_ptr() as usize;
        let c = self.ctl();
        FifoDescriptor {
            memory: MemoryKind::HostShared,
            mapping: Some(Mapping {
                addr: base,
                len: self.map.len(),
            }),
            slots: Some(base + SLOTS_OFFSET),
            slot_count: g.steps,
            slot_bytes: g.chunk_bytes,
            slot_stride: g.stride().expect("checked when mapped"),
            layout: SlotLayout {
                published: Some(0),
                header: Some(HEADER_OFFSET),
                payload: PAYLOAD_OFFSET,
                inline: Some(InlinePayload {
                    offset: INLINE_OFFSET,
                    max_bytes: INLINE_BYTES,
                }),
                placement: Some(PayloadPlacement {
                    offset: PLACEMENT_OFFSET,
                    unit: PLACEMENT_UNIT,
                }),
            },
            head: Counter::Mapped {
                addr: &c.head as *const AtomicU64 as usize,
            },
            tail: Counter::Mapped {
                addr: &c.tail as *const AtomicU64 as usize,
            },
        }
    }
}

/// The sending end of a segment. There is one per segment (it is neither
/// `Clone` nor `Sync`), which makes the sender the single writer of `tail`
/// and of free slots.
#[derive(Debug)]
pub(crate) struct Producer {
    seg: std::sync::Arc<Segment>,
    /// Our own copy of `tail` (we are its only writer).
    tail: u64,
    /// `head` as last loaded: the receiver only moves it forward, so a
    /// stale copy can only under-count free slots.
    head_seen: u64,
    /// Per slot: where in its payload area the next payload may start
    /// (see [`place`]).
    next_at: Vec<usize>,
    /// Whether payloads move along their slots at all: not where the
    /// host's ranks share CPUs, whose ranks on one core find the lines a
    /// peer read last in that core's cache (see [`Producer::new`]).
    spread: bool,
}

/// Where a payload of `len` bytes goes in a slot of `chunk_bytes` whose
/// next payload may start at `*next_at`: there if it fits, else at the
/// area's start; `*next_at` moves past it (its length rounded up to
/// `PLACEMENT_STEP`). A payload that fits inline, or whose length is
/// unknown before it is written (None), goes at the start and leaves
/// `*next_at` alone.
fn place(next_at: &mut usize, len: Option<usize>, chunk_bytes: usize) -> usize {
    let Some(len) = len.filter(|&n| n > INLINE_BYTES && n <= chunk_bytes) else {
        return 0;
    };
    let at = if next_at
        .checked_add(len)
        .is_some_and(|end| end <= chunk_bytes)
    {
        *next_at
    } else {
        0
    };
    *next_at = at + len.next_multiple_of(PLACEMENT_STEP);
    at
}

/// The receiving end of a segment: the single writer of `head`.
#[derive(Debug)]
pub(crate) struct Consumer {
    seg: std::sync::Arc<Segment>,
    head: u64,
}

/// A filled slot as handed out by [`Consumer::peek`].
pub(crate) struct Filled<'a> {
    /// The raw 40 header bytes, copied out of the slot.
    pub(crate) header: [u8; HEADER_BYTES],
    slot: *const u8,
    chunk_bytes: usize,
    _seg: std::marker::PhantomData<&'a Segment>,
}

impl Filled<'_> {
    /// The first `len` payload bytes, straight out of the mapping: in the
    /// header's line for a frame of at most `INLINE_BYTES`, else where the
    /// slot's placement puts them in the payload area. `len` comes from a
    /// header decoded against the slot size, and is clamped to it here all
    /// the same. A placement that would put the payload past the slot's
    /// end (only a peer that broke the protocol writes one) is an error
    /// that gives it, in bytes.
    pub(crate) fn payload(&self, len: usize) -> Result<&[u8], usize> {
        let len = len.min(self.chunk_bytes);
        let offset = if len <= INLINE_BYTES {
            INLINE_OFFSET
        } else {
            let at = self.placement() as usize * PLACEMENT_UNIT;
            if at + len > self.chunk_bytes {
                return Err(at);
            }
            PAYLOAD_OFFSET + at
        };
        // SAFETY: `slot` is the start of a slot inside the mapping; the
        // inline area [INLINE_OFFSET, PAYLOAD_OFFSET) holds INLINE_BYTES >=
        // len bytes, and the payload area at PAYLOAD_OFFSET holds
        // `chunk_bytes` >= at + len bytes (checked above; the mapping was
        // sized from the local geometry); both outlive `self` (the borrow
        // of the Consumer that made it). The slot is the receiver's until
        // `head` moves past it, which only `Consumer::release` does and
        // which needs `&mut Consumer`, so no `&mut` alias exists; the
        // peer's sender does not write it before then (Acquire/Release on
        // head). Neither area overlaps the atomic `published` word. A peer
        // that broke the protocol could change the bytes under us, but not
        // their bounds.
        Ok(unsafe { std::slice::from_raw_parts(self.slot.add(offset), len) })
    }

    /// The slot's placement word (meaningful for a payload larger than
    /// `INLINE_BYTES`).
    fn placement(&self) -> u32 {
        let mut word = [0u8; 4];
        // SAFETY: [PLACEMENT_OFFSET, +4) lies in the slot's inline area,
        // inside the mapping, apart from the `published` word; the slot is
        // the receiver's (as in `payload`); the bytes are copied into a
        // distinct local.
        unsafe {
            std::ptr::copy_nonoverlapping(self.slot.add(PLACEMENT_OFFSET), word.as_mut_ptr(), 4)
        };
        u32::from_ne_bytes(word)
    }
}

/// The `published` word at the start of the slot at `slot`.
fn published_word<'a>(slot: *mut u8) -> &'a AtomicU64 {
    // SAFETY: `slot` is the start of a slot inside a live mapping
    // (slot_ptr), 64-aligned (the mapping is page-aligned, SLOTS_OFFSET and
    // the stride are multiples of 64), so 8 bytes there are aligned for an
    // AtomicU64 and any bit pattern is a valid one. Both processes only
    // ever access these 8 bytes as this atomic: the header, inline and
    // payload writes and reads start at HEADER_OFFSET = 8 or later. The
    // reference lives no longer than the borrow of the Producer or
    // Consumer that holds the mapping (callers use it at once).
    unsafe { &*(slot as *const AtomicU64) }
}

fn slot_ptr(seg: &Segment, index: u64) -> (*mut u8, Geometry) {
    let g = seg.geometry();
    let stride = g.stride().expect("checked when mapped");
    let k = (index % g.steps as u64) as usize;
    // `k < steps`, so the slot lies within the `total_len` bytes mapped.
    let offset = SLOTS_OFFSET + k * stride;
    // SAFETY: offset + stride <= total_len = the mapping's length, so the
    // result stays inside the mapping.
    (unsafe { seg.map.as_mut_ptr().add(offset) }, g)
}

impl Producer {
    /// The sending end of `seg`; `spread`: move payloads along their
    /// slots ([`place`]). Off where ranks share CPUs: 4 ranks on the 2-CPU
    /// AMD VM ran reduce-scatters and all-to-alls 0.5-0.9x as fast with it,
    /// against 1.1-2.8x for 2 ranks (docs/performance-log.md, "Payloads
    /// spread over the slots").
    pub(crate) fn new(seg: std::sync::Arc<Segment>, spread: bool) -> Self {
        let tail = seg.ctl().tail.load(Ordering::Relaxed);
        let steps = seg.geometry().steps;
        Producer {
            seg,
            tail,
            head_seen: tail,
            next_at: vec![0; steps],
            spread,
        }
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Whether payloads of known length move along their slots.
    pub(crate) fn spreads(&self) -> bool {
        self.spread
    }

    /// Whether a slot is free, reloading `head` (Acquire) if our copy
    /// says there is none.
    pub(crate) fn has_free_slot(&mut self) -> bool {
        let steps = self.seg.geometry().steps as u64;
        if self.tail.wrapping_sub(self.head_seen) < steps {
            return true;
        }
        self.head_seen = self.seg.ctl().head.load(Ordering::Acquire);
        self.tail.wrapping_sub(self.head_seen) < steps
    }

    /// Let `fill` write the next free slot's payload and return its
    /// length; if `header_for(len)` gives a header, write it and publish
    /// the slot, else leave the slot free. Where the caller knows the
    /// length beforehand (`sized`), the payload goes where [`place`] puts
    /// it and `fill` gets the area from there (at least that long); else
    /// it gets the whole area (`chunk_bytes`). Call only after
    /// `has_free_slot` returned true.
    pub(crate) fn fill_and_publish<E>(
        &mut self,
        sized: Option<usize>,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
        header_for: impl FnOnce(usize) -> Result<[u8; HEADER_BYTES], E>,
    ) -> Result<(), E> {
        debug_assert!(self.tail.wrapping_sub(self.head_seen) < self.seg.geometry().steps as u64);
        let (slot, g) = slot_ptr(&self.seg, self.tail);
        let k = (self.tail % g.steps as u64) as usize;
        let at = if self.spread {
            place(&mut self.next_at[k], sized, g.chunk_bytes)
        } else {
            0
        };
        // SAFETY: the slot lies in the mapping (slot_ptr) with room for
        // PAYLOAD_OFFSET + chunk_bytes bytes, and at <= chunk_bytes
        // (`place`). It is free: tail - head < steps with `head` loaded
        // Acquire, so the receiver finished reading it before it released
        // it; and it is not yet published, so the receiver does not read it
        // until our Release store of tail below. We are the only producer,
        // and `&mut self` rules out a second live slice from this one.
        let payload = unsafe {
            std::slice::from_raw_parts_mut(slot.add(PAYLOAD_OFFSET + at), g.chunk_bytes - at)
        };
        let len = fill(payload);
        let header = header_for(len)?;
        // SAFETY: as above; the header region [8, 48) of the free slot is
        // ours, and `header` is a distinct local array.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), slot.add(HEADER_OFFSET), HEADER_BYTES)
        };
        if len <= INLINE_BYTES {
            // SAFETY: as above; the inline area [48, 64) of the free slot
            // is ours and holds INLINE_BYTES >= len bytes; the payload area
            // (from 64) does not overlap it.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    slot.add(PAYLOAD_OFFSET + at),
                    slot.add(INLINE_OFFSET),
                    len,
                )
            };
        } else {
            // Units of 64 bytes: at < chunk_bytes <= u32::MAX (checked
            // when listening), so the count fits.
            let word = ((at / PLACEMENT_UNIT) as u32).to_ne_bytes();
            // SAFETY: as above; [PLACEMENT_OFFSET, +4) lies in the free
            // slot's inline area, which this frame leaves unused; `word` is
            // a distinct local.
            unsafe { std::ptr::copy_nonoverlapping(word.as_ptr(), slot.add(PLACEMENT_OFFSET), 4) };
        }
        self.tail += 1;
        published_word(slot).store(self.tail, Ordering::Release);
        self.seg.ctl().tail.store(self.tail, Ordering::Release);
        Ok(())
    }
}

impl Consumer {
    pub(crate) fn new(seg: std::sync::Arc<Segment>) -> Self {
        let head = seg.ctl().head.load(Ordering::Relaxed);
        Consumer { seg, head }
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.seg
    }

    /// The next filled slot, if the sender has published it: its
    /// `published` word (Acquire) says frame `head`. A slot holds one frame
    /// number at a time, so a broken peer cannot make more than `steps`
    /// frames appear ahead of `head` either.
    pub(crate) fn peek(&mut self) -> Option<Filled<'_>> {
        if !self.has_filled() {
            return None;
        }
        let (slot, g) = slot_ptr(&self.seg, self.head);
        let mut header = [0u8; HEADER_BYTES];
        // SAFETY: the slot's word (loaded Acquire in has_filled) says it
        // holds frame `head`, so the sender wrote it before its Release
        // store of that word; it will not write it again before we store
        // head. The 40 bytes at HEADER_OFFSET are inside the slot
        // (slot_ptr), apart from the word, and copied into a distinct local.
        unsafe {
            std::ptr::copy_nonoverlapping(
                slot.add(HEADER_OFFSET) as *const u8,
                header.as_mut_ptr(),
                HEADER_BYTES,
            )
        };
        Some(Filled {
            header,
            slot,
            chunk_bytes: g.chunk_bytes,
            _seg: std::marker::PhantomData,
        })
    }

    /// Hand the slot of the last `peek` back to the sender (Release: our
    /// reads of it happen before the sender's next writes).
    pub(crate) fn release(&mut self) {
        self.head += 1;
        self.seg.ctl().head.store(self.head, Ordering::Release);
    }

    /// Whether the next slot is published (Acquire on its word).
    pub(crate) fn has_filled(&mut self) -> bool {
        let (slot, _) = slot_ptr(&self.seg, self.head);
        published_word(slot).load(Ordering::Acquire) == self.head.wrapping_add(1)
    }
}
