//! One established shared-memory connection as the slot FIFO of the
//! transport seam: the sending and receiving halves, the closer, the state
//! they share, and how they wait (spin, yield, sleep; checking abort,
//! deadline, the peer's flags and whether its process lives). No threads.
//!
//! A failure report ends both halves at once, queued frames or not; a
//! goodbye (the peer's sending half dropped or closed) ends the receiving
//! half only after the frames published before it have been consumed.

use crate::os;
use crate::ring::{Consumer, Producer, Segment, MAX_REASON_BYTES};
use ferroccl_transport::wait::{spins_for, Waiter};
use ferroccl_transport::{
    lock, AbortSignal, Connection, ConnectionCloser, Consume, Deadline, FrameHeader, FrameKind,
    HostPath, SlotReceiver, SlotSender, TransportError,
};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the creator of a connection's segments still owes: unlinking them
/// if the peer has not mapped them by the set-up deadline or by drop.
#[derive(Debug)]
pub(crate) struct PendingUnlink {
    pub(crate) paths: Vec<PathBuf>,
    /// (device, inode) of each file, so that we never unlink a later file
    /// that took the same name.
    pub(crate) ids: Vec<(u64, u64)>,
    pub(crate) deadline: Instant,
}

impl PendingUnlink {
    fn unlink(&mut self) {
        use std::os::unix::fs::MetadataExt;
        for (path, id) in self.paths.drain(..).zip(self.ids.drain(..)) {
            if let Ok(meta) = std::fs::symlink_metadata(&path) {
                if (meta.dev(), meta.ino()) == id {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
    }
}

/// State shared by the halves and the closer of one connection.
#[derive(Debug)]
struct Link {
    peer: usize,
    chunk_bytes: usize,
    /// The segment we send on and the one we receive on.
    out: Arc<Segment>,
    inn: Arc<Segment>,
    /// The peer's process id, or None when it is this process (ranks as
    /// threads), whose liveness the closed flags carry instead.
    peer_pid: Option<u32>,
    closed_locally: AtomicBool,
    /// Creator only: set-up not yet confirmed by the peer.
    pending: Mutex<Option<PendingUnlink>>,
    /// No set-up left to watch (`pending` is None): skips its lock.
    settled: AtomicBool,
    /// Set-up failed (refused, or never attached): ends both halves.
    setup_error: Mutex<Option<TransportError>>,
    /// `setup_error` is set: lets every wait round skip its lock.
    setup_failed: AtomicBool,
    abort: AbortSignal,
    /// Spins of a wait before it yields (see `spins_for`).
    spins: u32,
}

/// Why the acceptor refused a segment, by code (0: not refused).
pub(crate) fn refusal_reason(code: u32) -> &'static str {
    match code {
        1 => "wrong job token",
        2 => "another communicator",
        3 => "wrong ranks",
        4 => "chunk size differs",
        5 => "steps differ",
        6 => "layout version or magic differs",
        7 => "segment size differs",
        _ => "unknown reason",
    }
}

impl Link {
    /// Errors that end both halves at once, in order of precedence.
    fn fatal(&self) -> Option<TransportError> {
        if self.abort.is_fired() {
            return Some(TransportError::Aborted);
        }
        for seg in [&self.inn, &self.out] {
            if let Some((rank, reason)) = seg.failure() {
                return Some(TransportError::PeerFailed {
                    rank: usize::try_from(rank).unwrap_or(usize::MAX),
                    reason: String::from_utf8_lossy(&reason).into_owned(),
                });
            }
        }
        if self.closed_locally.load(Ordering::Acquire) {
            return Some(TransportError::Io(format!(
                "connection to rank {} was closed locally",
                self.peer
            )));
        }
        if !self.setup_failed.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.setup_error).clone()
    }

    /// Creator only: settle the set-up once the peer attached, refused, or
    /// missed the deadline. Returns the set-up error if there is one.
    #[inline]
    fn check_setup(&self) -> Option<TransportError> {
        if self.settled.load(Ordering::Acquire) {
            return None;
        }
        self.settle()
    }

    #[cold]
    fn settle(&self) -> Option<TransportError> {
        let mut pending = lock(&self.pending);
        let p = pending.as_mut()?;
        let refused = self.out.refused().max(self.inn.refused());
        let err = if refused != 0 {
            TransportError::Connect {
                peer: self.peer,
                detail: format!("peer refused: {}", refusal_reason(refused)),
            }
        } else if self.out.attached() && self.inn.attached() {
            // The opener unlinked them.
            *pending = None;
            self.settled.store(true, Ordering::Release);
            return None;
        } else if Instant::now() >= p.deadline {
            TransportError::Timeout {
                peer: self.peer,
                what: "the peer to map the shared segments",
                waited_ms: 0,
            }
        } else {
            return None;
        };
        p.unlink();
        *pending = None;
        drop(pending);
        tracing::warn!(peer = self.peer, "shared-memory set-up failed: {err}");
        self.settled.store(true, Ordering::Release);
        let mut slot = lock(&self.setup_error);
        let err = slot.get_or_insert(err).clone();
        self.setup_failed.store(true, Ordering::Release);
        Some(err)
    }

    fn peer_gone(&self) -> Option<TransportError> {
        let pid = self.peer_pid?;
        if !os::process_gone(pid) {
            return None;
        }
        // A peer that died before mapping our segments never will.
        if let Some(mut p) = lock(&self.pending).take() {
            p.unlink();
            self.settled.store(true, Ordering::Release);
        }
        Some(TransportError::PeerClosed {
            peer: self.peer,
            detail: format!("process {pid} is gone"),
        })
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Frames published before the peer mapped the segments are still
        // owed to it: a peer connects when it first needs the link, which
        // may be after this side has sent and gone. Leave it until the
        // set-up deadline to take them, unless the link ended otherwise
        // (refused, failed, aborted, peer process gone); only then unlink.
        if !self.settled.load(Ordering::Acquire) && self.out.published() > 0 {
            while self.check_setup().is_none()
                && !self.settled.load(Ordering::Acquire)
                && self.fatal().is_none()
                && self.peer_gone().is_none()
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if let Some(mut p) = lock(&self.pending).take() {
            p.unlink();
        }
    }
}

/// What a wait round found.
enum Round {
    Ready,
    Wait,
}

/// Wait until `ready` says so, or an error: fatal ones first, then what
/// `ready` reports, then (on clock rounds) the set-up, the deadline and the
/// peer's liveness. Before a dead peer is reported, `ready` gets one more
/// look (a receiver drains what was published before the death).
fn wait_for(
    link: &Link,
    deadline: Deadline,
    what: &'static str,
    ready: &mut dyn FnMut() -> Result<Round, TransportError>,
) -> Result<(), TransportError> {
    let mut w = Waiter::new(link.spins);
    let mut until = None;
    if let Some(err) = link.check_setup() {
        return Err(err);
    }
    loop {
        if let Some(err) = link.fatal() {
            return Err(err);
        }
        if let Round::Ready = ready()? {
            return Ok(());
        }
        if w.clock_round() {
            if let Some(err) = link.check_setup() {
                return Err(err);
            }
            let now = Instant::now();
            w.at(now);
            let until = *until.get_or_insert(match deadline {
                Deadline::At(at) => at,
                Deadline::After(wait) => now + wait,
            });
            if now >= until {
                return Err(TransportError::Timeout {
                    peer: link.peer,
                    what,
                    waited_ms: w.elapsed_ms(),
                });
            }
            if w.liveness_due(now) {
                if let Some(err) = link.peer_gone() {
                    // One last look: what the peer published before it
                    // died is still good.
                    if let Round::Ready = ready()? {
                        return Ok(());
                    }
                    return Err(err);
                }
            }
        }
        w.pause();
    }
}

/// The sending half.
struct ShmSender {
    link: Arc<Link>,
    ring: Producer,
}

impl ShmSender {
    fn wait_for_slot(&mut self, deadline: Deadline) -> Result<(), TransportError> {
        let ShmSender { link, ring } = self;
        let peer = link.peer;
        wait_for(link, deadline, "a free send slot", &mut || {
            if ring.segment().receiver_closed() {
                return Err(TransportError::PeerClosed {
                    peer,
                    detail: "peer dropped its receiving half".into(),
                });
            }
            Ok(if ring.has_free_slot() {
                Round::Ready
            } else {
                Round::Wait
            })
        })
    }
}

impl SlotSender for ShmSender {
    fn chunk_bytes(&self) -> usize {
        self.link.chunk_bytes
    }

    fn send_with(
        &mut self,
        header: FrameHeader,
        deadline: Instant,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), TransportError> {
        self.send_with_until(header, Deadline::At(deadline), fill)
    }

    fn send_from(
        &mut self,
        header: FrameHeader,
        deadline: Instant,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        self.send_from_until(header, Deadline::At(deadline), bytes)
    }

    fn send_with_until(
        &mut self,
        header: FrameHeader,
        deadline: Deadline,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), TransportError> {
        self.send_placed(header, deadline, None, fill)
    }

    fn places_payloads(&self) -> bool {
        self.ring.spreads()
    }

    fn send_sized_until(
        &mut self,
        header: FrameHeader,
        deadline: Deadline,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), TransportError> {
        self.check_fits(len)?;
        self.send_placed(header, deadline, Some(len), &mut |slot| {
            fill(&mut slot[..len]);
            len
        })
    }

    fn send_from_until(
        &mut self,
        header: FrameHeader,
        deadline: Deadline,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        // At the slot's start: a caller that wants the payload placed
        // along the slot sends it by `send_sized_until`.
        let n = bytes.len();
        self.check_fits(n)?;
        self.send_placed(header, deadline, None, &mut |slot| {
            ferroccl_transport::copy_into_shared(&mut slot[..n], bytes);
            n
        })
    }
}

impl ShmSender {
    /// A frame of `n` bytes fits a slot, or the error that says it does not.
    fn check_fits(&self, n: usize) -> Result<(), TransportError> {
        if n > self.link.chunk_bytes {
            return Err(TransportError::Io(format!(
                "a frame of {n} bytes does not fit a {}-byte slot for rank {}",
                self.link.chunk_bytes, self.link.peer
            )));
        }
        Ok(())
    }

    /// Wait for a free slot and fill and publish it; a payload whose
    /// length is known beforehand (`sized`) goes where the ring places it
    /// along the slot (`ring::place`).
    fn send_placed(
        &mut self,
        mut header: FrameHeader,
        deadline: Deadline,
        sized: Option<usize>,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), TransportError> {
        self.wait_for_slot(deadline)?;
        let chunk_bytes = self.link.chunk_bytes;
        let peer = self.link.peer;
        self.ring.fill_and_publish(sized, fill, |len| {
            if len > chunk_bytes {
                return Err(TransportError::Io(format!(
                    "fill wrote {len} bytes into a {chunk_bytes}-byte slot for rank {peer}"
                )));
            }
            // Slots are at most u32::MAX bytes (checked when listening).
            header.len = len as u32;
            // Closing and failure travel in the control block, never in
            // slots.
            header.kind = FrameKind::Data;
            Ok(header.encode())
        })
    }
}

impl Drop for ShmSender {
    fn drop(&mut self) {
        self.ring.segment().set_sender_closed();
    }
}

/// The receiving half.
struct ShmReceiver {
    link: Arc<Link>,
    ring: Consumer,
    /// How this half ended (a protocol error), repeated to later calls.
    ended: Option<TransportError>,
}

impl ShmReceiver {
    fn wait_for_frame(&mut self, deadline: Deadline) -> Result<(), TransportError> {
        if let Some(err) = &self.ended {
            return Err(err.clone());
        }
        let ShmReceiver { link, ring, .. } = self;
        let peer = link.peer;
        wait_for(link, deadline, "data", &mut || {
            if ring.has_filled() {
                return Ok(Round::Ready);
            }
            if ring.segment().sender_closed() {
                // The goodbye was stored after the last tail (Release);
                // having seen it, a reload of tail is complete.
                if ring.has_filled() {
                    return Ok(Round::Ready);
                }
                return Err(TransportError::PeerClosed {
                    peer,
                    detail: "peer shut down cleanly".into(),
                });
            }
            Ok(Round::Wait)
        })
    }

    fn protocol(&mut self, detail: String) -> TransportError {
        let err = TransportError::Protocol {
            peer: self.link.peer,
            detail,
        };
        self.ended = Some(err.clone());
        err
    }

    /// Wait for a frame, decode its header and hand it with its payload to
    /// `take`, then release the slot whatever `take` said.
    fn take_next(
        &mut self,
        deadline: Deadline,
        take: &mut Consume<'_>,
    ) -> Result<(), TransportError> {
        self.wait_for_frame(deadline)?;
        let chunk_bytes = self.link.chunk_bytes;
        let (decoded, result) = match self.ring.peek() {
            Some(filled) => match FrameHeader::decode(&filled.header, chunk_bytes) {
                Ok(h) => match filled.payload(h.len as usize) {
                    Ok(payload) => (Ok(()), take(&h, payload)),
                    Err(at) => (
                        Err(format!(
                            "a frame of {} bytes placed {at} bytes into a {chunk_bytes}-byte slot: \
                             past its end",
                            h.len
                        )),
                        Ok(()),
                    ),
                },
                Err(detail) => (Err(detail), Ok(())),
            },
            None => unreachable!("wait_for_frame saw a filled slot"),
        };
        match decoded {
            Ok(()) => {
                self.ring.release();
                result
            }
            Err(detail) => Err(self.protocol(detail)),
        }
    }
}

impl SlotReceiver for ShmReceiver {
    fn peer(&self) -> usize {
        self.link.peer
    }

    fn chunk_bytes(&self) -> usize {
        self.link.chunk_bytes
    }

    fn recv_with(
        &mut self,
        deadline: Instant,
        consume: &mut Consume<'_>,
    ) -> Result<(), TransportError> {
        self.take_next(Deadline::At(deadline), consume)
    }

    fn recv_into(
        &mut self,
        deadline: Instant,
        check: &mut dyn FnMut(&FrameHeader) -> Result<(), TransportError>,
        dst: &mut [u8],
    ) -> Result<(), TransportError> {
        self.recv_into_until(Deadline::At(deadline), check, dst)
    }

    fn recv_with_until(
        &mut self,
        deadline: Deadline,
        consume: &mut Consume<'_>,
    ) -> Result<(), TransportError> {
        self.take_next(deadline, consume)
    }

    fn recv_into_until(
        &mut self,
        deadline: Deadline,
        check: &mut dyn FnMut(&FrameHeader) -> Result<(), TransportError>,
        dst: &mut [u8],
    ) -> Result<(), TransportError> {
        let peer = self.link.peer;
        self.take_next(deadline, &mut |header, bytes| {
            ferroccl_transport::deliver_into(peer, header, bytes, check, dst)
        })
    }
}

impl Drop for ShmReceiver {
    fn drop(&mut self) {
        self.ring.segment().set_receiver_closed();
    }
}

/// Closes a connection from any thread.
struct ShmCloser {
    link: Arc<Link>,
}

impl ConnectionCloser for ShmCloser {
    fn close_with_failure(&self, failed_rank: usize, reason: &str) {
        let mut cut = reason.len().min(MAX_REASON_BYTES);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        let rank = u64::try_from(failed_rank).unwrap_or(u64::MAX);
        for seg in [&self.link.out, &self.link.inn] {
            seg.set_failure(rank, &reason.as_bytes()[..cut]);
        }
    }

    fn close(&self) {
        self.link.closed_locally.store(true, Ordering::Release);
        self.link.out.set_sender_closed();
        self.link.inn.set_receiver_closed();
    }
}

/// Everything needed to build a connection's halves.
pub(crate) struct Parts {
    pub(crate) peer: usize,
    pub(crate) chunk_bytes: usize,
    pub(crate) out: Arc<Segment>,
    pub(crate) inn: Arc<Segment>,
    pub(crate) peer_pid: Option<u32>,
    pub(crate) pending: Option<PendingUnlink>,
    pub(crate) abort: AbortSignal,
    /// Ranks of the communicator (bounds how many share this machine).
    pub(crate) ranks: usize,
}

/// Assemble a connection over two mapped segments.
pub(crate) fn establish(parts: Parts) -> Connection {
    let link = Arc::new(Link {
        peer: parts.peer,
        chunk_bytes: parts.chunk_bytes,
        out: parts.out.clone(),
        inn: parts.inn.clone(),
        peer_pid: parts.peer_pid,
        closed_locally: AtomicBool::new(false),
        settled: AtomicBool::new(parts.pending.is_none()),
        pending: Mutex::new(parts.pending),
        setup_error: Mutex::new(None),
        setup_failed: AtomicBool::new(false),
        abort: parts.abort,
        spins: spins_for(parts.ranks),
    });
    Connection {
        peer: parts.peer,
        transport: "shm",
        send_fifo: parts.out.fifo(),
        recv_fifo: parts.inn.fifo(),
        host: Some(HostPath {
            sender: Box::new(ShmSender {
                link: link.clone(),
                ring: Producer::new(
                    parts.out,
                    !ferroccl_transport::wait::ranks_share_cpus(parts.ranks),
                ),
            }),
            receiver: Box::new(ShmReceiver {
                link: link.clone(),
                ring: Consumer::new(parts.inn),
                ended: None,
            }),
        }),
        closer: Arc::new(ShmCloser { link }),
    }
}
