//! The sending half of an RDMA connection ([`IbSender`]): takes
//! clear-to-send entries as credits, stages a frame (or registers a
//! leased buffer for zero copy) and RDMA-writes it striped over the
//! direction's queue pairs.

use super::end::{End, WR_CONTROL};
use super::{imm, widen, CTS_ENTRY_BYTES, POLL_BATCH, STRIPE_MIN_BYTES, WAIT_SLICE};
use crate::regcache::{CacheStats, RegCache, ZeroCopyConfig};
use crate::verbs::{
    Completion, CompletionKind, Device, LocalSlice, MemoryRegion, QueuePair, RemoteSlice,
    VerbsError, WriteRequest,
};
use ferroccl_transport::{FrameHeader, SlotSender, TransportError, HEADER_BYTES};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    /// The sending half of `end`, with zero copy's settings `zcopy`.
    pub(super) fn new(end: Arc<End<D, Q>>, zcopy: ZeroCopyConfig) -> Self {
        let words = end.geometry.chunk_bytes.div_ceil(8);
        let steps = end.geometry.steps;
        IbSender {
            end,
            next: 0,
            credits: VecDeque::new(),
            in_flight: vec![0; steps],
            peer_closed: false,
            broken: None,
            buf: vec![0u64; words],
            zcopy_min: zcopy.min_bytes,
            cache: RegCache::new(zcopy.limits),
        }
    }

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

    /// Why sending cannot go on, if it cannot (what a queue pair in error
    /// left in its queue taken first: `End::take_left`).
    fn refusal(&mut self) -> Option<TransportError> {
        if let Some(e) = self.end.fatal() {
            return Some(e);
        }
        let mut left = Vec::new();
        let errored = self.end.take_left(&self.end.out_qps, &mut left);
        self.absorb(left);
        if self.peer_closed {
            return Some(TransportError::PeerClosed {
                peer: self.end.peer,
                detail: "its receiving end closed".into(),
            });
        }
        if let Some(e) = &self.broken {
            return Some(e.clone());
        }
        errored.then(|| self.end.qp_error("sending to"))
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
