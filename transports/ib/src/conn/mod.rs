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
//!
//! Files, as transports/tcp's `connection/` is cut: this one the wire
//! layout (immediates, entries, regions, geometry) and [`open`]; `end` what
//! the halves and the closer of one end share; `sender`, `receiver` and
//! `closer` the three parts a connection hands out.

mod closer;
mod end;
mod receiver;
mod sender;

pub use closer::IbCloser;
pub use receiver::IbReceiver;
pub use sender::IbSender;

#[cfg(doc)]
use crate::regcache::RegCache;
use crate::regcache::ZeroCopyConfig;
use crate::verbs::{Device, MemoryRegion, QueuePair, RemoteSlice, VerbsError};
#[cfg(doc)]
use crate::MemoryLease;
use end::End;
#[cfg(doc)]
use ferroccl_transport::ConnectionCloser;
use ferroccl_transport::{AbortSignal, TransportError, HEADER_BYTES};
use std::sync::atomic::{AtomicBool, AtomicU64};
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
    let sender = IbSender::new(Arc::clone(&end), zcopy);
    let mut receiver = IbReceiver::new(Arc::clone(&end));
    for seq in 0..geometry.steps as u64 {
        receiver
            .post_cts(seq, Instant::now() + Duration::from_secs(5))
            .map_err(|e| TransportError::Connect {
                peer,
                detail: format!("posting the first clear-to-send entries: {e}"),
            })?;
    }
    Ok((sender, receiver, Arc::new(IbCloser::new(end))))
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
