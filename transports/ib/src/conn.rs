//! The RDMA data path of one connection, over the verbs traits: a slot
//! FIFO in each direction, driven by the receiver as NCCL's network
//! transport is.
//!
//! Each direction (this rank sending to `peer`) has its own queue pairs,
//! `qps` of them, so that each end's completions belong to one half only.
//! Memory, all registered on the end's own device:
//!
//! | region     | owner    | written by                | holds                                   |
//! |------------|----------|---------------------------|-----------------------------------------|
//! | `slots`    | receiver | the sender (RDMA WRITE)   | `steps` slots: 40-byte header, payload  |
//! | `stage`    | sender   | the sender's CPU          | the frame being posted, per slot        |
//! | `cts`      | sender   | the receiver (RDMA WRITE) | `steps` clear-to-send entries           |
//! | `cts_src`  | receiver | the receiver's CPU        | the entries being posted                |
//! | `fail`     | each end | the peer (RDMA WRITE)     | a failure report: rank and reason       |
//! | `fail_src` | each end | its CPU                   | the report being posted                 |
//!
//! - **Clear to send.** The receiver owns the slots. For frame `s` it
//!   writes a 32-byte entry `(s, address, rkey, size)` of the slot the
//!   frame is to land in into the sender's `cts` entry `s % steps`, with
//!   an immediate, so the sender learns of it from its completion queue.
//!   It posts entries for frames `0..steps` at once, then the entry for
//!   `s + steps` as it releases frame `s`. A sender without an entry
//!   waits: that is the FIFO's push-back (credits).
//! - **Data.** The sender writes the header and payload into its staging
//!   slot, then RDMA-writes them to the address of the entry, each write
//!   carrying an immediate `(kind, s mod 2^18, pieces, piece)`. A frame of
//!   at least [`STRIPE_MIN_BYTES`] is cut into one piece per queue pair
//!   (FERROCCL_IB_QPS_PER_CONNECTION); the receiver takes the frame once
//!   every piece's immediate has arrived. Per queue pair, writes complete
//!   in order (RC), so a piece's bytes are in place when its immediate is
//!   seen.
//! - **Ending.** A half that is dropped or closed writes a `CLOSE`
//!   immediate: from a sender it carries the number of frames sent, after
//!   which the receiver reports a clean close; from a receiver it tells
//!   the sender that no entry will come again. A failure report
//!   ([`ConnectionCloser::close_with_failure`]) is written into the peer's
//!   `fail` region with a `FAIL` immediate on both directions, so it
//!   reaches whichever half is waiting, ahead of queued data.
//! - **Errors.** Every immediate, entry and header from the wire is
//!   checked before use (a wrong one is a `Protocol` error naming the
//!   peer, never a panic). A queue pair in error without a `CLOSE` (the
//!   peer's process died, a key was wrong) is `PeerFailed` naming the
//!   peer. Every wait ends at its deadline (a `Timeout` naming the peer),
//!   on abort, on a local close, or on a failure report.
//!
//! - **Zero copy (sending).** A frame of at least
//!   [`ZeroCopyConfig::min_bytes`] whose bytes a live [`MemoryLease`]
//!   covers (e.g. a [`crate::UserBuffer`]) is not staged: its header is
//!   staged and written on the first queue pair, then its payload is
//!   written straight from the caller's memory, registered through the
//!   sender's [`RegCache`], striped as above; `send_from` returns once
//!   every write has completed, so the caller may reuse the buffer. Other
//!   frames are staged. The receiver does not change: it cannot tell.
//! - **No zero copy when receiving.** A receiver posts the entry for frame
//!   `s + steps` when it releases frame `s`, long before `recv_into` says
//!   where frame `s + steps` should go; landing frames in the caller's
//!   buffer needs its address in the entry, so either a rendezvous per
//!   frame (an entry posted when `recv_into` is called, costing a round
//!   trip) or destinations known ahead (an API that hands the transport a
//!   call's receive buffers before its frames arrive). See docs/ib.md.

use crate::regcache::{CacheStats, RegCache, ZeroCopyConfig};
use crate::verbs::{
    Completion, CompletionKind, Device, LocalSlice, MemoryRegion, QpState, QueuePair, RemoteSlice,
    VerbsError, WriteRequest,
};
#[cfg(doc)]
use crate::MemoryLease;
use ferroccl_transport::{
    elapsed_ms, lock, AbortSignal, ConnectionCloser, Consume, FrameHeader, SlotReceiver,
    SlotSender, TransportError, HEADER_BYTES,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most bytes of a failure reason carried (as the other transports keep).
pub const MAX_REASON_BYTES: usize = 256;
/// Bytes of one clear-to-send entry.
pub const CTS_ENTRY_BYTES: usize = 32;
/// Bytes of the failure region: a valid word, the rank, the reason's
/// length, the reason.
pub const FAIL_BYTES: usize = 12 + MAX_REASON_BYTES;
/// Frames (header and payload) of at least this many bytes are striped
/// across the connection's queue pairs; smaller ones go on the first.
pub const STRIPE_MIN_BYTES: usize = 64 << 10;
/// Most queue pairs per direction (four bits of the immediate).
pub const MAX_QPS: usize = 16;
/// What a receiver says of a sender that closed cleanly.
pub const CLEAN_CLOSE: &str = "peer shut down cleanly";

/// Longest single wait on a completion queue between looks at the abort
/// signal, the local close and the deadline.
const WAIT_SLICE: Duration = Duration::from_millis(2);
/// How long a half being dropped waits for its last writes to complete.
const DRAIN: Duration = Duration::from_secs(1);
/// Completions taken per poll.
const POLL_BATCH: usize = 64;

/// The immediates of the protocol: two bits of kind, 30 of argument.
mod imm {
    pub(super) const DATA: u32 = 0;
    pub(super) const CTS: u32 = 1;
    pub(super) const FAIL: u32 = 2;
    pub(super) const CLOSE: u32 = 3;
    /// Low bits of a frame number in a data immediate.
    pub(super) const DATA_SEQ_BITS: u32 = 18;
    pub(super) const ARG_MASK: u32 = (1 << 30) - 1;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(super) enum Imm {
        /// Piece `index` of `pieces` of the frame whose number is `seq`
        /// modulo 2^18.
        Data { seq: u32, pieces: u32, index: u32 },
        /// Entry for the frame whose number is `seq` modulo 2^30.
        Cts { seq: u32 },
        /// A failure report is in the `fail` region.
        Fail,
        /// The peer's half closed; `arg` is frames sent modulo 2^30 (from
        /// a sender).
        Close { arg: u32 },
    }

    pub(super) fn data(seq: u64, pieces: usize, index: usize) -> u32 {
        let seq = (seq as u32) & ((1 << DATA_SEQ_BITS) - 1);
        (DATA << 30) | (seq << 8) | (((pieces - 1) as u32) << 4) | index as u32
    }

    pub(super) fn with_arg(kind: u32, arg: u64) -> u32 {
        (kind << 30) | ((arg as u32) & ARG_MASK)
    }

    pub(super) fn decode(v: u32) -> Imm {
        let arg = v & ARG_MASK;
        match v >> 30 {
            DATA => Imm::Data {
                seq: arg >> 8,
                pieces: ((arg >> 4) & 0xf) + 1,
                index: arg & 0xf,
            },
            CTS => Imm::Cts { seq: arg },
            FAIL => Imm::Fail,
            _ => Imm::Close { arg },
        }
    }
}

/// The full frame number nearest above `from` whose low `bits` bits are
/// `low`: how a receiver widens a number carried in an immediate.
fn widen(from: u64, low: u32, bits: u32) -> u64 {
    let modulus = 1u64 << bits;
    let ahead = (u64::from(low).wrapping_sub(from)) & (modulus - 1);
    from + ahead
}

/// A region of the peer's, as it was described at set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Its remote key.
    pub rkey: u32,
    /// Its first byte's address.
    pub addr: u64,
    /// Its length.
    pub len: usize,
}

impl RemoteRegion {
    fn at(&self, offset: usize) -> RemoteSlice {
        RemoteSlice {
            rkey: self.rkey,
            addr: self.addr.wrapping_add(offset as u64),
        }
    }
}

impl From<&MemoryRegion> for RemoteRegion {
    fn from(mr: &MemoryRegion) -> Self {
        RemoteRegion {
            rkey: mr.rkey,
            addr: mr.addr,
            len: mr.len,
        }
    }
}

/// What one end tells the other at set-up: where its peer-written regions
/// are. (The queue pairs' own endpoints travel beside it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndInfo {
    /// The slots the peer's frames land in.
    pub slots: RemoteRegion,
    /// The clear-to-send entries the peer writes.
    pub cts: RemoteRegion,
    /// The failure report the peer writes.
    pub fail: RemoteRegion,
}

impl EndInfo {
    /// Bytes of [`EndInfo::to_bytes`].
    pub const BYTES: usize = 3 * 20;

    /// The wire form: per region rkey (u32), address (u64), length (u64),
    /// little-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::BYTES);
        for r in [self.slots, self.cts, self.fail] {
            out.extend_from_slice(&r.rkey.to_le_bytes());
            out.extend_from_slice(&r.addr.to_le_bytes());
            out.extend_from_slice(&(r.len as u64).to_le_bytes());
        }
        out
    }

    /// Reads [`EndInfo::to_bytes`]; anything else is an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, String> {
        if bytes.len() != Self::BYTES {
            return Err(format!(
                "region description of {} bytes (expected {})",
                bytes.len(),
                Self::BYTES
            ));
        }
        let region = |i: usize| {
            let b = &bytes[i * 20..(i + 1) * 20];
            let mut rkey = [0u8; 4];
            let mut addr = [0u8; 8];
            let mut len = [0u8; 8];
            rkey.copy_from_slice(&b[..4]);
            addr.copy_from_slice(&b[4..12]);
            len.copy_from_slice(&b[12..]);
            RemoteRegion {
                rkey: u32::from_le_bytes(rkey),
                addr: u64::from_le_bytes(addr),
                len: usize::try_from(u64::from_le_bytes(len)).unwrap_or(usize::MAX),
            }
        };
        Ok(EndInfo {
            slots: region(0),
            cts: region(1),
            fail: region(2),
        })
    }
}

/// The geometry both ends of a connection agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Payload bytes per slot.
    pub chunk_bytes: usize,
    /// Slots per direction.
    pub steps: usize,
    /// Queue pairs per direction (1..=[`MAX_QPS`]).
    pub qps: usize,
}

impl Geometry {
    /// Bytes from one slot to the next: header and payload, rounded up to
    /// 64.
    pub fn stride(&self) -> usize {
        (HEADER_BYTES + self.chunk_bytes).div_ceil(64) * 64
    }

    /// Checks the bounds the protocol needs.
    pub fn check(&self) -> Result<(), String> {
        if self.steps == 0 || self.steps > (1 << (imm::DATA_SEQ_BITS - 1)) {
            return Err(format!("{} slots per direction (1..=131072)", self.steps));
        }
        if self.qps == 0 || self.qps > MAX_QPS {
            return Err(format!(
                "{} queue pairs per connection (1..={MAX_QPS})",
                self.qps
            ));
        }
        if self.chunk_bytes == 0 || self.chunk_bytes > u32::MAX as usize - HEADER_BYTES {
            return Err(format!("slots of {} bytes", self.chunk_bytes));
        }
        Ok(())
    }

    /// Send-queue depth each queue pair needs: a slot's write per frame in
    /// flight, the clear-to-send entries, and the ending's writes.
    pub fn queue_depth(&self) -> usize {
        2 * self.steps + 4
    }
}

/// This end's registered regions (see the module doc).
#[derive(Debug, Clone, Copy)]
pub struct LocalRegions {
    /// Frames from the peer land here.
    pub slots: MemoryRegion,
    /// Frames to the peer are staged here.
    pub stage: MemoryRegion,
    /// Clear-to-send entries from the peer land here.
    pub cts: MemoryRegion,
    /// Clear-to-send entries to the peer are posted from here.
    pub cts_src: MemoryRegion,
    /// A failure report from the peer lands here.
    pub fail: MemoryRegion,
    /// A failure report to the peer is posted from here.
    pub fail_src: MemoryRegion,
}

impl LocalRegions {
    /// Registers every region for `geometry` on `dev`.
    pub fn register<D: Device>(dev: &D, geometry: &Geometry) -> Result<Self, VerbsError> {
        let slots_len = geometry.steps * geometry.stride();
        let cts_len = geometry.steps * CTS_ENTRY_BYTES;
        Ok(LocalRegions {
            slots: dev.register(slots_len)?,
            stage: dev.register(slots_len)?,
            cts: dev.register(cts_len)?,
            cts_src: dev.register(cts_len)?,
            fail: dev.register(FAIL_BYTES)?,
            fail_src: dev.register(FAIL_BYTES)?,
        })
    }

    /// What the peer needs to know of them.
    pub fn info(&self) -> EndInfo {
        EndInfo {
            slots: (&self.slots).into(),
            cts: (&self.cts).into(),
            fail: (&self.fail).into(),
        }
    }

    /// Deregisters every region (best effort).
    pub fn deregister<D: Device>(&self, dev: &D) {
        for mr in [
            self.slots,
            self.stage,
            self.cts,
            self.cts_src,
            self.fail,
            self.fail_src,
        ] {
            let _ = dev.deregister(mr.handle);
        }
    }
}

/// Everything one end of a connection is made of, however it was set up.
pub struct EndParts<D, Q> {
    /// This rank.
    pub rank: usize,
    /// The rank at the other end.
    pub peer: usize,
    /// The agreed geometry.
    pub geometry: Geometry,
    /// This end's device (protection domain).
    pub dev: D,
    /// This end's registered regions.
    pub regions: LocalRegions,
    /// Where the peer's regions are.
    pub remote: EndInfo,
    /// This end of the queue pairs this rank sends on (`geometry.qps`).
    pub out_qps: Vec<Q>,
    /// This end of the queue pairs this rank receives on.
    pub in_qps: Vec<Q>,
    /// The communicator's abort.
    pub abort: AbortSignal,
}

/// What the halves and the closer of one end share.
struct End<D: Device, Q: QueuePair> {
    rank: usize,
    peer: usize,
    geometry: Geometry,
    dev: D,
    regions: LocalRegions,
    remote: EndInfo,
    out_qps: Vec<Q>,
    in_qps: Vec<Q>,
    abort: AbortSignal,
    /// The first failure reported, by either end.
    failure: Mutex<Option<(usize, String)>>,
    /// Closed locally.
    closed: AtomicBool,
    /// Frames this end's sender has posted.
    frames_sent: AtomicU64,
    /// A `CLOSE` went out on the sending / receiving direction.
    out_bye: AtomicBool,
    in_bye: AtomicBool,
}

impl<D: Device, Q: QueuePair> End<D, Q> {
    /// Errors that end a half at once, whatever is queued.
    fn fatal(&self) -> Option<TransportError> {
        if self.abort.is_fired() {
            return Some(TransportError::Aborted);
        }
        if let Some((rank, reason)) = lock(&self.failure).clone() {
            return Some(TransportError::PeerFailed { rank, reason });
        }
        self.closed.load(Ordering::Acquire).then(|| {
            TransportError::Io(format!(
                "connection to rank {} was closed locally",
                self.peer
            ))
        })
    }

    fn record_failure(&self, rank: usize, reason: String) {
        lock(&self.failure).get_or_insert((rank, reason));
    }

    /// Reads a failure report the peer wrote into `fail` (rank, reason),
    /// if a valid one is there.
    fn landed_failure(&self) -> Option<(usize, String)> {
        let mut head = [0u8; 12];
        self.dev
            .read_region(self.regions.fail.handle, 0, &mut head)
            .ok()?;
        let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        if word(0) != FAIL_VALID {
            return None;
        }
        let len = (word(8) as usize).min(MAX_REASON_BYTES);
        let mut reason = vec![0u8; len];
        self.dev
            .read_region(self.regions.fail.handle, 12, &mut reason)
            .ok()?;
        Some((
            word(4) as usize,
            String::from_utf8_lossy(&reason).into_owned(),
        ))
    }

    fn adopt_landed_failure(&self) {
        match self.landed_failure() {
            Some((rank, reason)) => self.record_failure(rank, reason),
            None => self.record_failure(
                self.peer,
                format!(
                    "rank {} reported a failure that could not be read",
                    self.peer
                ),
            ),
        }
    }

    /// Posts a zero-length write with immediate `imm` on `qp` (a `CLOSE`).
    fn post_signal(&self, qp: &Q, imm: u32) -> Result<(), VerbsError> {
        qp.post_write(&WriteRequest {
            wr_id: WR_CONTROL,
            local: LocalSlice {
                mr: self.regions.fail_src.handle,
                offset: 0,
                len: 0,
            },
            remote: self.remote.fail.at(0),
            imm: Some(imm),
        })
    }

    /// Says `CLOSE` on the sending direction, once.
    fn bye_out(&self) {
        if !self.out_bye.swap(true, Ordering::AcqRel) {
            if let Some(qp) = self.out_qps.first() {
                let frames = self.frames_sent.load(Ordering::Acquire);
                let _ = self.post_signal(qp, imm::with_arg(imm::CLOSE, frames));
            }
        }
    }

    /// Says `CLOSE` on the receiving direction, once.
    fn bye_in(&self) {
        if !self.in_bye.swap(true, Ordering::AcqRel) {
            if let Some(qp) = self.in_qps.first() {
                let _ = self.post_signal(qp, imm::with_arg(imm::CLOSE, 0));
            }
        }
    }

    /// Waits (up to [`DRAIN`]) for the writes posted on `qps` to complete,
    /// so that a half being dropped does not take its last writes with it.
    fn drain(&self, qps: &[Q], mut absorb: impl FnMut(Vec<Completion>)) {
        let until = Instant::now() + DRAIN;
        for qp in qps {
            while qp.outstanding() > 0 && qp.state() == QpState::Ready && Instant::now() < until {
                absorb(qp.wait(POLL_BATCH, WAIT_SLICE));
            }
        }
    }

    fn qp_error(&self, what: &str) -> TransportError {
        TransportError::PeerFailed {
            rank: self.peer,
            reason: format!(
                "the RDMA queue pair {what} rank {} is in error (its process or its link went \
                 away)",
                self.peer
            ),
        }
    }

    /// One slice of a wait for `what` that began at `start`: the
    /// completions `qp` gives within [`WAIT_SLICE`], or the timeout naming
    /// the peer once `deadline` has passed.
    fn wait_slice(
        &self,
        qp: &Q,
        what: &'static str,
        start: Instant,
        deadline: Instant,
    ) -> Result<Vec<Completion>, TransportError> {
        let now = Instant::now();
        if now >= deadline {
            return Err(TransportError::Timeout {
                peer: self.peer,
                what,
                waited_ms: elapsed_ms(start),
            });
        }
        Ok(qp.wait(POLL_BATCH, WAIT_SLICE.min(deadline - now)))
    }

    /// What a work request that completed in error means: the peer (or
    /// the link to it) is gone or refused the access.
    fn failed_write(&self, e: &crate::verbs::WcError) -> TransportError {
        TransportError::PeerFailed {
            rank: self.peer,
            reason: format!(
                "an RDMA write to rank {} failed: {e} (its queue pair is now in error)",
                self.peer
            ),
        }
    }

    fn protocol(&self, detail: String) -> TransportError {
        TransportError::Protocol {
            peer: self.peer,
            detail,
        }
    }
}

/// The valid word of a failure report.
const FAIL_VALID: u32 = 0x4641_494c;
/// `wr_id` of control writes (clear-to-send entries, endings, reports).
const WR_CONTROL: u64 = u64::MAX;

/// Posts, on `qp` (the receiving end of the direction), the clear-to-send
/// entry for frame `seq`: slot `seq % steps` of `regions.slots`, written
/// into the sender's `cts` region with a `CTS` immediate.
fn post_cts_entry<D: Device, Q: QueuePair>(
    dev: &D,
    regions: &LocalRegions,
    cts: &RemoteRegion,
    g: &Geometry,
    qp: &Q,
    seq: u64,
) -> Result<(), VerbsError> {
    let slot = (seq % g.steps as u64) as usize;
    let slots = &regions.slots;
    let mut e = [0u8; CTS_ENTRY_BYTES];
    e[0..8].copy_from_slice(&seq.to_le_bytes());
    e[8..16].copy_from_slice(&(slots.addr + (slot * g.stride()) as u64).to_le_bytes());
    e[16..20].copy_from_slice(&slots.rkey.to_le_bytes());
    e[20..24].copy_from_slice(&(g.stride() as u32).to_le_bytes());
    let at = slot * CTS_ENTRY_BYTES;
    dev.write_region(regions.cts_src.handle, at, &e)?;
    qp.post_write(&WriteRequest {
        wr_id: WR_CONTROL,
        local: LocalSlice {
            mr: regions.cts_src.handle,
            offset: at,
            len: CTS_ENTRY_BYTES,
        },
        remote: cts.at(at),
        imm: Some(imm::with_arg(imm::CTS, seq)),
    })
}

/// Builds one end of a connection from its parts: the sending half, the
/// receiving half and the closer. The receiving half has already posted
/// its first `steps` clear-to-send entries when this returns. Zero copy's
/// settings come from the environment ([`ZeroCopyConfig::from_env`]; a bad
/// one is a `Connect` error naming it).
#[allow(clippy::type_complexity)]
pub fn open<D, Q>(
    parts: EndParts<D, Q>,
) -> Result<(IbSender<D, Q>, IbReceiver<D, Q>, Arc<IbCloser<D, Q>>), TransportError>
where
    D: Device + Send + Sync + 'static,
    Q: QueuePair + Send + Sync + 'static,
{
    let zcopy = ZeroCopyConfig::from_env().map_err(|detail| TransportError::Connect {
        peer: parts.peer,
        detail,
    })?;
    open_with(parts, zcopy)
}

/// [`open`] with zero copy's settings given.
#[allow(clippy::type_complexity)]
pub fn open_with<D, Q>(
    parts: EndParts<D, Q>,
    zcopy: ZeroCopyConfig,
) -> Result<(IbSender<D, Q>, IbReceiver<D, Q>, Arc<IbCloser<D, Q>>), TransportError>
where
    D: Device + Send + Sync + 'static,
    Q: QueuePair + Send + Sync + 'static,
{
    let EndParts {
        rank,
        peer,
        geometry,
        dev,
        regions,
        remote,
        out_qps,
        in_qps,
        abort,
    } = parts;
    geometry.check().map_err(|detail| TransportError::Connect {
        peer,
        detail: format!("bad RDMA connection geometry: {detail}"),
    })?;
    if out_qps.len() != geometry.qps || in_qps.len() != geometry.qps {
        return Err(TransportError::Connect {
            peer,
            detail: format!(
                "{} and {} queue pairs where {} were agreed",
                out_qps.len(),
                in_qps.len(),
                geometry.qps
            ),
        });
    }
    let end = Arc::new(End {
        rank,
        peer,
        geometry,
        dev,
        regions,
        remote,
        out_qps,
        in_qps,
        abort,
        failure: Mutex::new(None),
        closed: AtomicBool::new(false),
        frames_sent: AtomicU64::new(0),
        out_bye: AtomicBool::new(false),
        in_bye: AtomicBool::new(false),
    });
    let words = geometry.chunk_bytes.div_ceil(8);
    let sender = IbSender {
        end: Arc::clone(&end),
        next: 0,
        credits: VecDeque::new(),
        in_flight: vec![0; geometry.steps],
        peer_closed: false,
        broken: None,
        buf: vec![0u64; words],
        zcopy_min: zcopy.min_bytes,
        cache: RegCache::new(zcopy.limits),
    };
    let mut receiver = IbReceiver {
        end: Arc::clone(&end),
        next: 0,
        arrived: vec![(0, 0); geometry.steps],
        peer_total: None,
        broken: None,
        buf: vec![0u64; words],
    };
    for seq in 0..geometry.steps as u64 {
        receiver
            .post_cts(seq, Instant::now() + Duration::from_secs(5))
            .map_err(|e| TransportError::Connect {
                peer,
                detail: format!("posting the first clear-to-send entries: {e}"),
            })?;
    }
    Ok((sender, receiver, Arc::new(IbCloser { end })))
}

/// The sending half of an RDMA connection.
pub struct IbSender<D: Device, Q: QueuePair> {
    end: Arc<End<D, Q>>,
    /// Number of the next frame.
    next: u64,
    /// Clear-to-send entries not used yet, in frame order.
    credits: VecDeque<Cts>,
    /// Writes posted from each staging slot and not completed.
    in_flight: Vec<u32>,
    /// The peer's receiver said `CLOSE`.
    peer_closed: bool,
    /// Why the queue pairs are unusable, once they are.
    broken: Option<TransportError>,
    buf: Vec<u64>,
    /// Payload bytes from which a leased buffer is sent without staging.
    zcopy_min: usize,
    /// Registrations of leased caller memory.
    cache: RegCache,
}

/// One clear-to-send entry, as read from the `cts` region.
#[derive(Debug, Clone, Copy)]
struct Cts {
    seq: u64,
    addr: u64,
    rkey: u32,
    size: u32,
}

impl<D: Device, Q: QueuePair> IbSender<D, Q> {
    fn absorb(&mut self, done: Vec<Completion>) {
        for c in done {
            if let Err(e) = &c.status {
                let end = &self.end;
                self.broken.get_or_insert_with(|| end.failed_write(e));
                continue;
            }
            match c.kind {
                CompletionKind::SendDone => {
                    if c.wr_id != WR_CONTROL {
                        let slot = (c.wr_id % self.end.geometry.steps as u64) as usize;
                        self.in_flight[slot] = self.in_flight[slot].saturating_sub(1);
                    }
                }
                CompletionKind::RecvWithImm { imm: v, .. } => match imm::decode(v) {
                    imm::Imm::Cts { seq } => {
                        if let Err(e) = self.take_cts(seq) {
                            self.broken.get_or_insert(e);
                        }
                    }
                    imm::Imm::Fail => self.end.adopt_landed_failure(),
                    imm::Imm::Close { .. } => self.peer_closed = true,
                    imm::Imm::Data { .. } => {
                        let e = self
                            .end
                            .protocol("a data write arrived on the sending direction".into());
                        self.broken.get_or_insert(e);
                    }
                },
            }
        }
    }

    /// Reads the entry a `CTS` immediate announced, checking that it is the
    /// one expected next.
    fn take_cts(&mut self, low: u32) -> Result<(), TransportError> {
        let expected = self.next + self.credits.len() as u64;
        let seq = widen(expected, low, 30);
        if seq != expected {
            return Err(self.end.protocol(format!(
                "clear-to-send for frame {seq} where frame {expected} was next"
            )));
        }
        let at = (seq % self.end.geometry.steps as u64) as usize * CTS_ENTRY_BYTES;
        let mut e = [0u8; CTS_ENTRY_BYTES];
        self.end
            .dev
            .read_region(self.end.regions.cts.handle, at, &mut e)
            .map_err(|err| TransportError::Io(format!("reading a clear-to-send entry: {err}")))?;
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&e[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let u32_at = |i: usize| u32::from_le_bytes([e[i], e[i + 1], e[i + 2], e[i + 3]]);
        let cts = Cts {
            seq: u64_at(0),
            addr: u64_at(8),
            rkey: u32_at(16),
            size: u32_at(20),
        };
        if cts.seq != seq {
            return Err(self.end.protocol(format!(
                "clear-to-send entry says frame {} where its immediate said {seq}",
                cts.seq
            )));
        }
        self.credits.push_back(cts);
        Ok(())
    }

    fn pump(&mut self) {
        for i in 0..self.end.out_qps.len() {
            let done = self.end.out_qps[i].poll(POLL_BATCH);
            self.absorb(done);
        }
    }

    /// Why sending cannot go on, if it cannot.
    fn refusal(&self) -> Option<TransportError> {
        if let Some(e) = self.end.fatal() {
            return Some(e);
        }
        if self.peer_closed {
            return Some(TransportError::PeerClosed {
                peer: self.end.peer,
                detail: "its receiving end closed".into(),
            });
        }
        if let Some(e) = &self.broken {
            return Some(e.clone());
        }
        (self.end.out_qps.iter().any(|q| q.state() == QpState::Error))
            .then(|| self.end.qp_error("sending to"))
    }

    /// The next frame's clear-to-send entry (`wait_for_slot` made sure
    /// there is one), checked to hold a frame of `total` bytes.
    fn take_credit(&mut self, total: usize) -> Result<Cts, TransportError> {
        let Some(cts) = self.credits.pop_front() else {
            unreachable!("wait_for_slot returned with a credit");
        };
        if (cts.size as usize) < total {
            return Err(self.end.protocol(format!(
                "its clear-to-send entry offers {} bytes for a frame of {total}",
                cts.size
            )));
        }
        Ok(cts)
    }

    /// Waits until the next frame has an entry and its staging slot is free.
    fn wait_for_slot(&mut self, deadline: Instant) -> Result<(), TransportError> {
        let start = Instant::now();
        let slot = (self.next % self.end.geometry.steps as u64) as usize;
        loop {
            self.pump();
            if let Some(e) = self.refusal() {
                return Err(e);
            }
            if !self.credits.is_empty() && self.in_flight[slot] == 0 {
                return Ok(());
            }
            let done =
                self.end
                    .wait_slice(&self.end.out_qps[0], "a free send slot", start, deadline)?;
            self.absorb(done);
        }
    }

    /// Posts `write`, making room in the send queue as needed.
    fn post(
        &mut self,
        qp: usize,
        write: &WriteRequest,
        deadline: Instant,
    ) -> Result<(), TransportError> {
        loop {
            match self.end.out_qps[qp].post_write(write) {
                Ok(()) => return Ok(()),
                Err(VerbsError::SendQueueFull { .. }) if Instant::now() < deadline => {
                    let done = self.end.out_qps[qp].wait(POLL_BATCH, WAIT_SLICE);
                    self.absorb(done);
                    if let Some(e) = self.refusal() {
                        return Err(e);
                    }
                }
                Err(e) => {
                    return Err(TransportError::Io(format!(
                        "posting an RDMA write to rank {}: {e}",
                        self.end.peer
                    )))
                }
            }
        }
    }
}

impl<D: Device, Q: QueuePair> IbSender<D, Q> {
    /// What the registration cache has done (hits, misses, evictions...).
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The registrations of caller memory this half keeps: address and
    /// length of each.
    pub fn cached_ranges(&self) -> Vec<(usize, usize)> {
        self.cache.ranges()
    }

    /// Sends `bytes` as one frame straight from `mr` (caller memory, the
    /// bytes at `offset` in it): the header is staged and written first,
    /// then the payload from `mr`; returns once every write completed.
    fn send_zero_copy(
        &mut self,
        mut header: FrameHeader,
        deadline: Instant,
        bytes: &[u8],
        mr: MemoryRegion,
        offset: usize,
    ) -> Result<(), TransportError> {
        self.wait_for_slot(deadline)?;
        let geometry = self.end.geometry;
        let n = bytes.len();
        header.len = n as u32;
        let slot = (self.next % geometry.steps as u64) as usize;
        let base = slot * geometry.stride();
        let stage = self.end.regions.stage.handle;
        self.end
            .dev
            .write_region(stage, base, &header.encode())
            .map_err(|e| TransportError::Io(format!("staging a frame header: {e}")))?;
        // The NIC reads the payload where it is; the emulated one takes
        // its copy here (see `Device::present`).
        if let Err(e) = self.end.dev.present(mr.handle, offset, bytes) {
            // A registration gone under the cache (deregistered by someone
            // else): forget it, so the next frame registers afresh.
            let end = Arc::clone(&self.end);
            self.cache.invalidate(&end.dev, bytes.as_ptr() as usize, n);
            return Err(TransportError::Io(format!(
                "sending {n} bytes to rank {} from caller memory: {e}",
                self.end.peer
            )));
        }
        let total = HEADER_BYTES + n;
        let cts = self.take_credit(total)?;
        let post_by = deadline.max(Instant::now() + Duration::from_secs(1));
        // The header first on the first queue pair: RC puts it in place
        // before that queue pair's piece, whose immediate the receiver
        // waits for.
        let head = WriteRequest {
            wr_id: self.next,
            local: LocalSlice {
                mr: stage,
                offset: base,
                len: HEADER_BYTES,
            },
            remote: RemoteSlice {
                rkey: cts.rkey,
                addr: cts.addr,
            },
            imm: None,
        };
        self.post(0, &head, post_by)?;
        self.in_flight[slot] += 1;
        let pieces = if total >= STRIPE_MIN_BYTES {
            geometry.qps
        } else {
            1
        };
        let per = n.div_ceil(pieces).max(1);
        for i in (0..pieces).rev() {
            let from = (i * per).min(n);
            let len = per.min(n - from);
            let write = WriteRequest {
                wr_id: self.next,
                local: LocalSlice {
                    mr: mr.handle,
                    offset: offset + from,
                    len,
                },
                remote: RemoteSlice {
                    rkey: cts.rkey,
                    addr: cts.addr.wrapping_add((HEADER_BYTES + from) as u64),
                },
                imm: Some(imm::data(self.next, pieces, i)),
            };
            self.post(i, &write, post_by)?;
            self.in_flight[slot] += 1;
        }
        self.next += 1;
        self.end.frames_sent.store(self.next, Ordering::Release);
        // The caller may reuse `bytes` once this returns: wait until the
        // NIC has read them all.
        let start = Instant::now();
        while self.in_flight[slot] > 0 {
            self.pump();
            if self.in_flight[slot] == 0 {
                break;
            }
            if let Some(e) = self.refusal() {
                return Err(e);
            }
            match self
                .end
                .wait_slice(&self.end.out_qps[0], "a zero-copy write", start, post_by)
            {
                Ok(done) => self.absorb(done),
                Err(e) => {
                    // Writes from the caller's memory may still be
                    // pending: nothing more goes on this connection.
                    self.broken.get_or_insert_with(|| e.clone());
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

impl<D, Q> SlotSender for IbSender<D, Q>
where
    D: Device + Send + Sync,
    Q: QueuePair + Send + Sync,
{
    fn chunk_bytes(&self) -> usize {
        self.end.geometry.chunk_bytes
    }

    /// Frames of at least the zero-copy size whose bytes a live lease
    /// covers go from the caller's memory; the rest are staged.
    fn send_from(
        &mut self,
        header: FrameHeader,
        deadline: Instant,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        let n = bytes.len();
        if n >= self.zcopy_min.max(1) && n <= self.end.geometry.chunk_bytes {
            let end = Arc::clone(&self.end);
            if let Some((mr, offset)) = self.cache.acquire(&end.dev, bytes.as_ptr() as usize, n) {
                return self.send_zero_copy(header, deadline, bytes, mr, offset);
            }
        }
        ferroccl_transport::send_from_via_slot(self, header, deadline, bytes)
    }

    fn send_with(
        &mut self,
        mut header: FrameHeader,
        deadline: Instant,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), TransportError> {
        self.wait_for_slot(deadline)?;
        let geometry = self.end.geometry;
        let chunk = geometry.chunk_bytes;
        let payload: &mut [u8] = bytemuck::cast_slice_mut(&mut self.buf);
        let n = fill(&mut payload[..chunk]);
        if n > chunk {
            return Err(TransportError::Io(format!(
                "a frame of {n} bytes does not fit a {chunk}-byte slot"
            )));
        }
        header.len = n as u32;
        let slot = (self.next % geometry.steps as u64) as usize;
        let base = slot * geometry.stride();
        let stage = self.end.regions.stage.handle;
        let io = |e: VerbsError| TransportError::Io(format!("staging a frame: {e}"));
        self.end
            .dev
            .write_region(stage, base, &header.encode())
            .map_err(io)?;
        let payload: &[u8] = bytemuck::cast_slice(&self.buf);
        self.end
            .dev
            .write_region(stage, base + HEADER_BYTES, &payload[..n])
            .map_err(io)?;
        let total = HEADER_BYTES + n;
        let cts = self.take_credit(total)?;
        let pieces = if total >= STRIPE_MIN_BYTES {
            geometry.qps
        } else {
            1
        };
        let per = total.div_ceil(pieces);
        // The first queue pair last: a receiver waking on its completion
        // (it waits on that one) finds the other pieces there already.
        for i in (0..pieces).rev() {
            let from = (i * per).min(total);
            let len = per.min(total - from);
            let write = WriteRequest {
                wr_id: self.next,
                local: LocalSlice {
                    mr: stage,
                    offset: base + from,
                    len,
                },
                remote: RemoteSlice {
                    rkey: cts.rkey,
                    addr: cts.addr.wrapping_add(from as u64),
                },
                imm: Some(imm::data(self.next, pieces, i)),
            };
            self.post(
                i,
                &write,
                deadline.max(Instant::now() + Duration::from_secs(1)),
            )?;
            self.in_flight[slot] += 1;
        }
        self.next += 1;
        self.end.frames_sent.store(self.next, Ordering::Release);
        Ok(())
    }
}

impl<D: Device, Q: QueuePair> Drop for IbSender<D, Q> {
    fn drop(&mut self) {
        if self.end.fatal().is_none() && self.broken.is_none() {
            self.end.bye_out();
            let end = Arc::clone(&self.end);
            end.drain(&end.out_qps, |done| self.absorb(done));
        }
        let end = Arc::clone(&self.end);
        self.cache.clear(&end.dev);
    }
}

/// The receiving half of an RDMA connection.
pub struct IbReceiver<D: Device, Q: QueuePair> {
    end: Arc<End<D, Q>>,
    /// Number of the next frame.
    next: u64,
    /// Per slot: pieces arrived, pieces announced.
    arrived: Vec<(u32, u32)>,
    /// Frames the peer's sender sent in all, once it said `CLOSE`.
    peer_total: Option<u64>,
    /// Why the queue pairs are unusable, once they are.
    broken: Option<TransportError>,
    buf: Vec<u64>,
}

impl<D: Device, Q: QueuePair> IbReceiver<D, Q> {
    fn absorb(&mut self, done: Vec<Completion>) {
        for c in done {
            if let Err(e) = &c.status {
                let end = &self.end;
                self.broken.get_or_insert_with(|| end.failed_write(e));
                continue;
            }
            let CompletionKind::RecvWithImm { imm: v, .. } = c.kind else {
                continue;
            };
            match imm::decode(v) {
                imm::Imm::Data { seq, pieces, index } => {
                    if let Err(e) = self.piece(seq, pieces, index) {
                        self.broken.get_or_insert(e);
                    }
                }
                imm::Imm::Fail => self.end.adopt_landed_failure(),
                imm::Imm::Close { arg } => {
                    self.peer_total = Some(widen(self.next, arg, 30));
                }
                imm::Imm::Cts { .. } => {
                    let e = self.end.protocol(
                        "a clear-to-send entry arrived on the receiving direction".into(),
                    );
                    self.broken.get_or_insert(e);
                }
            }
        }
    }

    /// Counts one arrived piece, checking it against the window of frames
    /// the receiver has entries out for.
    fn piece(&mut self, low: u32, pieces: u32, index: u32) -> Result<(), TransportError> {
        let steps = self.end.geometry.steps as u64;
        let seq = widen(self.next, low, imm::DATA_SEQ_BITS);
        if seq >= self.next + steps {
            return Err(self.end.protocol(format!(
                "data for frame {seq}, outside the {steps} frames from {} it may send",
                self.next
            )));
        }
        if pieces as usize > self.end.geometry.qps || index >= pieces {
            return Err(self.end.protocol(format!(
                "piece {index} of {pieces} with {} queue pairs",
                self.end.geometry.qps
            )));
        }
        let slot = (seq % steps) as usize;
        let (got, want) = &mut self.arrived[slot];
        if *got > 0 && *want != pieces {
            return Err(self.end.protocol(format!(
                "frame {seq} announced as {want} pieces, then as {pieces}"
            )));
        }
        if *got >= pieces {
            return Err(self
                .end
                .protocol(format!("more than {pieces} pieces of frame {seq}")));
        }
        *want = pieces;
        *got += 1;
        Ok(())
    }

    fn pump(&mut self) {
        for i in 0..self.end.in_qps.len() {
            let done = self.end.in_qps[i].poll(POLL_BATCH);
            self.absorb(done);
        }
    }

    /// Posts the clear-to-send entry for frame `seq`, making room in the
    /// send queue as needed.
    fn post_cts(&mut self, seq: u64, deadline: Instant) -> Result<(), TransportError> {
        let end = Arc::clone(&self.end);
        loop {
            match post_cts_entry(
                &end.dev,
                &end.regions,
                &end.remote.cts,
                &end.geometry,
                &end.in_qps[0],
                seq,
            ) {
                Ok(()) => return Ok(()),
                Err(VerbsError::SendQueueFull { .. }) if Instant::now() < deadline => {
                    let done = end.in_qps[0].wait(POLL_BATCH, WAIT_SLICE);
                    self.absorb(done);
                }
                Err(e) => {
                    return Err(TransportError::Io(format!(
                        "posting a clear-to-send entry to rank {}: {e}",
                        end.peer
                    )))
                }
            }
        }
    }

    /// Why receiving cannot go on, given that the next frame is not here.
    fn refusal(&self) -> Option<TransportError> {
        if self.peer_total == Some(self.next) {
            return Some(TransportError::PeerClosed {
                peer: self.end.peer,
                detail: CLEAN_CLOSE.into(),
            });
        }
        if let Some(e) = &self.broken {
            return Some(e.clone());
        }
        (self.end.in_qps.iter().any(|q| q.state() == QpState::Error))
            .then(|| self.end.qp_error("receiving from"))
    }

    fn ready(&self) -> bool {
        let (got, want) = self.arrived[(self.next % self.end.geometry.steps as u64) as usize];
        got > 0 && got == want
    }
}

impl<D, Q> SlotReceiver for IbReceiver<D, Q>
where
    D: Device + Send + Sync,
    Q: QueuePair + Send + Sync,
{
    fn peer(&self) -> usize {
        self.end.peer
    }

    fn chunk_bytes(&self) -> usize {
        self.end.geometry.chunk_bytes
    }

    fn recv_with(
        &mut self,
        deadline: Instant,
        consume: &mut Consume<'_>,
    ) -> Result<(), TransportError> {
        let start = Instant::now();
        loop {
            self.pump();
            // A failure report or an abort goes ahead of queued frames.
            if let Some(e) = self.end.fatal() {
                return Err(e);
            }
            if self.ready() {
                break;
            }
            if let Some(e) = self.refusal() {
                return Err(e);
            }
            let done = self
                .end
                .wait_slice(&self.end.in_qps[0], "data", start, deadline)?;
            self.absorb(done);
        }
        let g = self.end.geometry;
        let slot = (self.next % g.steps as u64) as usize;
        let base = slot * g.stride();
        let slots = self.end.regions.slots.handle;
        let io = |e: VerbsError| TransportError::Io(format!("reading a slot: {e}"));
        let mut head = [0u8; HEADER_BYTES];
        self.end
            .dev
            .read_region(slots, base, &mut head)
            .map_err(io)?;
        let header = FrameHeader::decode(&head, g.chunk_bytes)
            .map_err(|detail| self.end.protocol(detail))?;
        let n = header.len as usize;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.buf);
        self.end
            .dev
            .read_region(slots, base + HEADER_BYTES, &mut bytes[..n])
            .map_err(io)?;
        let result = consume(&header, &bytes[..n]);
        self.arrived[slot] = (0, 0);
        let seq = self.next + g.steps as u64;
        self.next += 1;
        self.post_cts(seq, deadline.max(Instant::now() + Duration::from_secs(1)))?;
        result
    }
}

impl<D: Device, Q: QueuePair> Drop for IbReceiver<D, Q> {
    fn drop(&mut self) {
        if self.end.fatal().is_none() && self.broken.is_none() {
            self.end.bye_in();
            let end = Arc::clone(&self.end);
            end.drain(&end.in_qps, |done| self.absorb(done));
        }
    }
}

impl<D: Device, Q: QueuePair> Drop for End<D, Q> {
    fn drop(&mut self) {
        self.regions.deregister(&self.dev);
    }
}

/// Closes one end of an RDMA connection from any thread.
pub struct IbCloser<D: Device, Q: QueuePair> {
    end: Arc<End<D, Q>>,
}

impl<D, Q> ConnectionCloser for IbCloser<D, Q>
where
    D: Device + Send + Sync,
    Q: QueuePair + Send + Sync,
{
    fn close_with_failure(&self, failed_rank: usize, reason: &str) {
        let end = &self.end;
        // A report the peer made first stays the first.
        if end.landed_failure().is_some() {
            end.adopt_landed_failure();
        }
        let mut cut = reason.len().min(MAX_REASON_BYTES);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        end.record_failure(failed_rank, reason[..cut].to_owned());
        let mut report = Vec::with_capacity(12 + cut);
        report.extend_from_slice(&FAIL_VALID.to_le_bytes());
        report.extend_from_slice(&(failed_rank as u32).to_le_bytes());
        report.extend_from_slice(&(cut as u32).to_le_bytes());
        report.extend_from_slice(&reason.as_bytes()[..cut]);
        if end
            .dev
            .write_region(end.regions.fail_src.handle, 0, &report)
            .is_err()
        {
            return;
        }
        // Best effort on both directions: whichever half of the peer is
        // waiting sees it.
        for qp in [end.out_qps.first(), end.in_qps.first()]
            .into_iter()
            .flatten()
        {
            let _ = qp.post_write(&WriteRequest {
                wr_id: WR_CONTROL,
                local: LocalSlice {
                    mr: end.regions.fail_src.handle,
                    offset: 0,
                    len: report.len(),
                },
                remote: end.remote.fail.at(0),
                imm: Some(imm::with_arg(imm::FAIL, 0)),
            });
        }
        end.out_bye.store(true, Ordering::Release);
        end.in_bye.store(true, Ordering::Release);
    }

    fn close(&self) {
        self.end.closed.store(true, Ordering::Release);
        self.end.bye_out();
        self.end.bye_in();
    }
}

impl<D: Device, Q: QueuePair> std::fmt::Debug for IbCloser<D, Q> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbCloser")
            .field("rank", &self.end.rank)
            .field("peer", &self.end.peer)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn immediates_round_trip() {
        for seq in [0u64, 1, 17, (1 << 18) - 1, 1 << 18, 123_456_789] {
            for pieces in 1..=MAX_QPS {
                for index in [0, pieces - 1] {
                    let v = imm::data(seq, pieces, index);
                    assert_eq!(
                        imm::decode(v),
                        imm::Imm::Data {
                            seq: (seq % (1 << 18)) as u32,
                            pieces: pieces as u32,
                            index: index as u32
                        }
                    );
                }
            }
            assert_eq!(
                imm::decode(imm::with_arg(imm::CTS, seq)),
                imm::Imm::Cts {
                    seq: (seq % (1 << 30)) as u32
                }
            );
            assert_eq!(
                imm::decode(imm::with_arg(imm::CLOSE, seq)),
                imm::Imm::Close {
                    arg: (seq % (1 << 30)) as u32
                }
            );
        }
        assert_eq!(imm::decode(imm::with_arg(imm::FAIL, 0)), imm::Imm::Fail);
    }

    #[test]
    fn widening_finds_the_number_at_or_after_the_base() {
        for from in [0u64, 5, (1 << 18) - 2, 1 << 18, (7 << 18) + 99] {
            for ahead in [0u64, 1, 1000, (1 << 18) - 1] {
                let seq = from + ahead;
                assert_eq!(widen(from, (seq % (1 << 18)) as u32, 18), seq);
            }
        }
    }

    #[test]
    fn end_info_round_trips_and_refuses_other_lengths() {
        let info = EndInfo {
            slots: RemoteRegion {
                rkey: 7,
                addr: 0xdead_beef_0000,
                len: 1 << 20,
            },
            cts: RemoteRegion {
                rkey: 9,
                addr: 42,
                len: 256,
            },
            fail: RemoteRegion {
                rkey: u32::MAX,
                addr: u64::MAX,
                len: FAIL_BYTES,
            },
        };
        let bytes = info.to_bytes();
        assert_eq!(bytes.len(), EndInfo::BYTES);
        assert_eq!(EndInfo::from_bytes(&bytes), Ok(info));
        for n in [0, 1, EndInfo::BYTES - 1, EndInfo::BYTES + 1] {
            assert!(EndInfo::from_bytes(&vec![0xab; n]).is_err());
        }
    }
}
