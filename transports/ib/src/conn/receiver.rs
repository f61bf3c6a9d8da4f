//! The receiving half of an RDMA connection ([`IbReceiver`]): owns the
//! slots, counts each frame's pieces by their immediates, hands a whole
//! frame to the consumer after checking its header, and posts the next
//! clear-to-send entry as it releases a slot.

use super::end::{post_cts_entry, End};
use super::{imm, widen, CLEAN_CLOSE, POLL_BATCH, WAIT_SLICE};
use crate::verbs::{Completion, CompletionKind, Device, QueuePair, VerbsError};
use ferroccl_transport::{Consume, FrameHeader, SlotReceiver, TransportError, HEADER_BYTES};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// The receiving half of `end`; it posts no entry yet.
    pub(super) fn new(end: Arc<End<D, Q>>) -> Self {
        let words = end.geometry.chunk_bytes.div_ceil(8);
        let steps = end.geometry.steps;
        IbReceiver {
            end,
            next: 0,
            arrived: vec![(0, 0); steps],
            peer_total: None,
            broken: None,
            buf: vec![0u64; words],
        }
    }

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
    pub(super) fn post_cts(&mut self, seq: u64, deadline: Instant) -> Result<(), TransportError> {
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

    /// Why receiving cannot go on, given that the next frame is not here
    /// (what a queue pair in error left in its queue taken first:
    /// `End::take_left`).
    fn refusal(&mut self) -> Option<TransportError> {
        let mut left = Vec::new();
        let errored = self.end.take_left(&self.end.in_qps, &mut left);
        self.absorb(left);
        // The next frame may have been among what was left: it is read
        // before the end of the stream or the error is told. (Nothing is
        // left where no queue pair is in error, and the caller found the
        // frame not ready.)
        if errored && self.ready() {
            return None;
        }
        if self.peer_total == Some(self.next) {
            return Some(TransportError::PeerClosed {
                peer: self.end.peer,
                detail: CLEAN_CLOSE.into(),
            });
        }
        if let Some(e) = &self.broken {
            return Some(e.clone());
        }
        errored.then(|| self.end.qp_error("receiving from"))
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
