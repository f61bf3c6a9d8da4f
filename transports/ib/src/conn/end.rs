//! What the sending half, the receiving half and the closer of one end
//! of a connection share ([`End`]): the queue pairs and regions, the first
//! failure reported by either end, the local close and the `CLOSE`
//! endings; and the posting of a clear-to-send entry, which the receiver
//! and [`super::open`] both do.

use super::{
    imm, EndInfo, Geometry, LocalRegions, RemoteRegion, CTS_ENTRY_BYTES, DRAIN, MAX_REASON_BYTES,
    POLL_BATCH, WAIT_SLICE,
};
use crate::verbs::{Completion, Device, LocalSlice, QpState, QueuePair, VerbsError, WriteRequest};
use ferroccl_transport::{elapsed_ms, lock, AbortSignal, TransportError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// What the halves and the closer of one end share.
pub(super) struct End<D: Device, Q: QueuePair> {
    pub(super) rank: usize,
    pub(super) peer: usize,
    pub(super) geometry: Geometry,
    pub(super) dev: D,
    pub(super) regions: LocalRegions,
    pub(super) remote: EndInfo,
    pub(super) out_qps: Vec<Q>,
    pub(super) in_qps: Vec<Q>,
    pub(super) abort: AbortSignal,
    /// The first failure reported, by either end.
    pub(super) failure: Mutex<Option<(usize, String)>>,
    /// Closed locally.
    pub(super) closed: AtomicBool,
    /// Frames this end's sender has posted.
    pub(super) frames_sent: AtomicU64,
    /// A `CLOSE` went out on the sending / receiving direction.
    pub(super) out_bye: AtomicBool,
    pub(super) in_bye: AtomicBool,
}

impl<D: Device, Q: QueuePair> End<D, Q> {
    /// Errors that end a half at once, whatever is queued.
    pub(super) fn fatal(&self) -> Option<TransportError> {
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

    pub(super) fn record_failure(&self, rank: usize, reason: String) {
        lock(&self.failure).get_or_insert((rank, reason));
    }

    /// Reads a failure report the peer wrote into `fail` (rank, reason),
    /// if a valid one is there.
    pub(super) fn landed_failure(&self) -> Option<(usize, String)> {
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

    pub(super) fn adopt_landed_failure(&self) {
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
    pub(super) fn post_signal(&self, qp: &Q, imm: u32) -> Result<(), VerbsError> {
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
    pub(super) fn bye_out(&self) {
        if !self.out_bye.swap(true, Ordering::AcqRel) {
            if let Some(qp) = self.out_qps.first() {
                let frames = self.frames_sent.load(Ordering::Acquire);
                let _ = self.post_signal(qp, imm::with_arg(imm::CLOSE, frames));
            }
        }
    }

    /// Says `CLOSE` on the receiving direction, once.
    pub(super) fn bye_in(&self) {
        if !self.in_bye.swap(true, Ordering::AcqRel) {
            if let Some(qp) = self.in_qps.first() {
                let _ = self.post_signal(qp, imm::with_arg(imm::CLOSE, 0));
            }
        }
    }

    /// Waits (up to [`DRAIN`]) for the writes posted on `qps` to complete,
    /// so that a half being dropped does not take its last writes with it.
    pub(super) fn drain(&self, qps: &[Q], mut absorb: impl FnMut(Vec<Completion>)) {
        let until = Instant::now() + DRAIN;
        for qp in qps {
            while qp.outstanding() > 0 && qp.state() == QpState::Ready && Instant::now() < until {
                absorb(qp.wait(POLL_BATCH, WAIT_SLICE));
            }
        }
    }

    /// Whether any of `qps` is in error; if so, every completion left on
    /// those that are, into `left`. What landed before a queue pair went
    /// into error (the peer's `CLOSE` among it) is still in its completion
    /// queue, and says more than the error: a half that polled just before
    /// the peer posted its `CLOSE` and dropped its end, and looks at the
    /// state just after, has not taken it yet (a clean close then read as
    /// a failed peer, now and then, in the conformance suite).
    pub(super) fn take_left(&self, qps: &[Q], left: &mut Vec<Completion>) -> bool {
        let mut errored = false;
        for qp in qps.iter().filter(|q| q.state() == QpState::Error) {
            errored = true;
            // Nothing is posted to a queue pair in error, so its queue
            // only empties; the bound keeps a broken device from holding
            // the caller here.
            for _ in 0..LEFT_BATCHES {
                let done = qp.poll(POLL_BATCH);
                if done.is_empty() {
                    break;
                }
                left.extend(done);
            }
        }
        errored
    }

    pub(super) fn qp_error(&self, what: &str) -> TransportError {
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
    pub(super) fn wait_slice(
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
    pub(super) fn failed_write(&self, e: &crate::verbs::WcError) -> TransportError {
        TransportError::PeerFailed {
            rank: self.peer,
            reason: format!(
                "an RDMA write to rank {} failed: {e} (its queue pair is now in error)",
                self.peer
            ),
        }
    }

    pub(super) fn protocol(&self, detail: String) -> TransportError {
        TransportError::Protocol {
            peer: self.peer,
            detail,
        }
    }
}

/// Batches of completions [`End::take_left`] takes at most from a queue
/// pair in error.
const LEFT_BATCHES: usize = 1024;

/// The valid word of a failure report.
pub(super) const FAIL_VALID: u32 = 0x4641_494c;
/// `wr_id` of control writes (clear-to-send entries, endings, reports).
pub(super) const WR_CONTROL: u64 = u64::MAX;

/// Posts, on `qp` (the receiving end of the direction), the clear-to-send
/// entry for frame `seq`: slot `seq % steps` of `regions.slots`, written
/// into the sender's `cts` region with a `CTS` immediate.
pub(super) fn post_cts_entry<D: Device, Q: QueuePair>(
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

impl<D: Device, Q: QueuePair> Drop for End<D, Q> {
    fn drop(&mut self) {
        self.regions.deregister(&self.dev);
    }
}
