//! The receiving half of a TCP connection: frames in order, taken from the
//! background readers' queues or read from the socket on the calling
//! thread (straight into the caller's buffer for `recv_into`), and where
//! each consumed frame's slot goes back to. It never writes a socket.

use super::{clean_goodbye, no_goodbye, ConnShared, Inbound, YIELD};
use crate::slot::Slot;
use crate::wire::{self, Progress, POLL_SLICE};
use ferroccl_transport::{
    elapsed_ms, lock, AbortSignal, Consume, FrameHeader, SlotReceiver, TransportError,
};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The receiving half: frames in order, from the queues of the background
/// readers or read from the sockets on the calling thread.
///
/// The slot of frame m goes back to socket (m + steps) % nsocks, the one
/// that carries frame m + steps, the next frame allowed to use it. Were
/// free slots shared by all sockets, the background reader of a later
/// frame could take every slot while the awaited frame's socket has none.
/// A frame read straight into the caller's buffer passes its unused slot
/// on the same way.
pub(super) struct TcpReceiver {
    shared: Arc<ConnShared>,
    /// Socket whose frame the next consumed frame is.
    next: usize,
    /// Socket that gets the next released slot.
    release_to: usize,
    abort: AbortSignal,
    /// How this half ended, repeated to every later call.
    ended: Option<TransportError>,
    /// The background readers, joined when this half drops: they hold the
    /// connection's slots and sockets, which must not outlive it.
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// Where the consumer wants the next payload.
enum Want<'a, 'b> {
    /// In a slot (`recv_with`).
    Slot,
    /// In the caller's buffer, once `check` accepts the header.
    Into {
        check: &'a mut dyn FnMut(&FrameHeader) -> Result<(), TransportError>,
        dst: &'b mut [u8],
    },
}

/// What the consumer got.
enum Got {
    /// A frame in a slot, to be released after use.
    Slot(FrameHeader, Slot),
    /// The payload is in the caller's buffer.
    Placed,
}

impl TcpReceiver {
    /// The receiving half; the first released slot goes to socket
    /// `release_to` (`steps % nsocks`).
    pub(super) fn new(
        shared: Arc<ConnShared>,
        release_to: usize,
        abort: AbortSignal,
        readers: Vec<std::thread::JoinHandle<()>>,
    ) -> Self {
        TcpReceiver {
            shared,
            next: 0,
            release_to,
            abort,
            ended: None,
            readers,
        }
    }

    fn ready(&self) -> Result<(), TransportError> {
        if self.abort.is_fired() {
            return Err(TransportError::Aborted);
        }
        if let Some(err) = self.shared.fatal_error() {
            return Err(err);
        }
        if let Some(err) = &self.ended {
            return Err(err.clone());
        }
        Ok(())
    }

    fn end_with(&mut self, err: TransportError) -> TransportError {
        self.ended = Some(err.clone());
        err
    }

    fn advance_next(&mut self) {
        let n = self.shared.rx.len();
        self.next = if self.next + 1 == n { 0 } else { self.next + 1 };
    }

    /// Give a consumed frame's slot to the socket of the frame `steps`
    /// later.
    fn release(&mut self, slot: Slot) {
        let rx = &self.shared.rx[self.release_to];
        {
            let mut st = lock(&rx.state);
            st.free.push(slot);
            if st.bg_waiting {
                rx.wake.notify_one();
            }
        }
        let n = self.shared.rx.len();
        self.release_to = if self.release_to + 1 == n {
            0
        } else {
            self.release_to + 1
        };
    }

    /// Why a consumer waiting on its socket should stop waiting.
    fn interrupted(&mut self) -> Option<TransportError> {
        if self.abort.is_fired() {
            return Some(TransportError::Aborted);
        }
        if let Some(err) = self.shared.fatal_error() {
            return Some(err);
        }
        // Some socket broke: the awaited frame will not come.
        let broken = self.shared.rx_broken_error()?;
        Some(self.end_with(broken))
    }

    /// The next frame of the connection, queued or read here.
    fn take(
        &mut self,
        deadline: Instant,
        start: Instant,
        want: &mut Want<'_, '_>,
    ) -> Result<Got, TransportError> {
        let shared = self.shared.clone();
        let peer = shared.peer;
        let s = self.next;
        let rx = &shared.rx[s];
        let mut st = lock(&rx.state);
        if let Some(item) = st.queue.pop_front() {
            drop(st);
            return match item {
                Inbound::Frame(header, slot) => {
                    self.advance_next();
                    Ok(Got::Slot(header, slot))
                }
                Inbound::End(err) => Err(self.end_with(err)),
            };
        }
        if st.ended {
            // The background reader ended on a failure or a local close.
            drop(st);
            return Err(self
                .interrupted()
                .unwrap_or_else(|| self.end_with(no_goodbye(peer))));
        }
        st.present = true;
        st.since = Instant::now();
        // Set when a frame was consumed without using this socket's slot.
        let mut slot_unused = false;
        let mut spun_since: Option<Instant> = None;
        let result = loop {
            let dst = match want {
                Want::Slot => None,
                Want::Into { dst, .. } => Some(&mut **dst),
            };
            match st.partial.advance(&mut &rx.socket, shared.chunk_bytes, dst) {
                Ok(Progress::Header(header)) => match want {
                    Want::Slot => {
                        let Some(slot) = st.free.pop() else {
                            break Err(TransportError::Io(format!(
                                "no free receive slot for rank {peer}"
                            )));
                        };
                        st.partial.set_payload(Some(slot));
                    }
                    Want::Into { check, dst } => {
                        let refused = check(&header).err().or_else(|| {
                            (header.len as usize != dst.len()).then(|| TransportError::Protocol {
                                peer,
                                detail: format!(
                                    "frame of {} bytes where {} were expected",
                                    header.len,
                                    dst.len()
                                ),
                            })
                        });
                        if let Some(err) = refused {
                            if let Some(slot) = st.partial.drop_payload() {
                                st.free.push(slot);
                            }
                            self.advance_next();
                            slot_unused = true;
                            break Err(err);
                        }
                        st.partial.set_payload(None);
                    }
                },
                Ok(Progress::Frame(header, Some(slot))) => {
                    self.advance_next();
                    break Ok(Got::Slot(header, slot));
                }
                Ok(Progress::Frame(_, None)) => {
                    self.advance_next();
                    slot_unused = true;
                    break Ok(Got::Placed);
                }
                Ok(Progress::WouldBlock) => {
                    if let Some(err) = self.interrupted() {
                        break Err(err);
                    }
                    let now = Instant::now();
                    let began = *spun_since.get_or_insert(now);
                    if now - began < self.shared.spin && now < deadline {
                        std::hint::spin_loop();
                        continue;
                    }
                    if now - began < self.shared.spin + YIELD && now < deadline {
                        // Give the core to whoever can use it (the rank this
                        // one waits for, where ranks share cores) and look
                        // again as soon as it comes back.
                        std::thread::yield_now();
                        continue;
                    }
                    if now >= deadline {
                        break Err(TransportError::Timeout {
                            peer,
                            what: "data",
                            waited_ms: elapsed_ms(start),
                        });
                    }
                    wire::poll_ready(&rx.socket, false, POLL_SLICE.min(deadline - now));
                }
                Ok(Progress::Failure { rank, reason }) => {
                    tracing::warn!(peer, failed_rank = rank, "peer reports a failure: {reason}");
                    st.ended = true;
                    shared.set_fatal(TransportError::PeerFailed { rank, reason });
                    break Err(shared.fatal_error().unwrap_or(TransportError::Aborted));
                }
                Ok(Progress::Goodbye) => {
                    st.ended = true;
                    break Err(self.end_with(clean_goodbye(peer)));
                }
                Ok(Progress::Eof) => {
                    st.ended = true;
                    if let Some(err) = shared.fatal_error() {
                        break Err(err);
                    }
                    let err = no_goodbye(peer);
                    shared.broken(&err);
                    break Err(self.end_with(err));
                }
                Err(e) => {
                    st.ended = true;
                    let err = e.into_transport(peer);
                    shared.broken(&err);
                    break Err(self.end_with(err));
                }
            }
        };
        if st.partial.reads_into_caller() {
            // Cut short inside a payload bound for the caller's buffer: move
            // what arrived to a slot so that the frame can still be read.
            let slot = match want {
                Want::Into { .. } => st.free.pop(),
                Want::Slot => None,
            };
            match (&*want, slot) {
                (Want::Into { dst, .. }, Some(slot)) => st.partial.move_to_slot(dst, slot),
                _ => {
                    // No slot to keep it in (never expected): the frame is
                    // lost, and so is the order of this half.
                    st.partial.drop_payload();
                    if self.ended.is_none() {
                        if let Err(err) = &result {
                            self.ended = Some(err.clone());
                        }
                    }
                }
            }
        }
        st.present = false;
        st.since = Instant::now();
        if st.bg_waiting {
            rx.wake.notify_one();
        }
        let passed_on = if slot_unused && shared.rx.len() > 1 {
            st.free.pop()
        } else {
            None
        };
        drop(st);
        if let Some(slot) = passed_on {
            self.release(slot);
        }
        result
    }
}

impl SlotReceiver for TcpReceiver {
    fn peer(&self) -> usize {
        self.shared.peer
    }

    /// `recv_into` reads the socket straight into the caller's memory.
    fn recv_into_copies(&self) -> bool {
        false
    }

    fn chunk_bytes(&self) -> usize {
        self.shared.chunk_bytes
    }

    fn recv_with(
        &mut self,
        deadline: Instant,
        consume: &mut Consume<'_>,
    ) -> Result<(), TransportError> {
        let start = Instant::now();
        self.ready()?;
        match self.take(deadline, start, &mut Want::Slot)? {
            Got::Slot(header, slot) => {
                let result = consume(&header, slot.bytes(header.len as usize));
                self.release(slot);
                result
            }
            Got::Placed => unreachable!("recv_with reads into slots"),
        }
    }

    fn recv_into(
        &mut self,
        deadline: Instant,
        check: &mut dyn FnMut(&FrameHeader) -> Result<(), TransportError>,
        dst: &mut [u8],
    ) -> Result<(), TransportError> {
        let start = Instant::now();
        self.ready()?;
        let peer = self.shared.peer;
        let mut want = Want::Into { check, dst };
        let got = self.take(deadline, start, &mut want)?;
        let Want::Into { check, dst } = want else {
            unreachable!()
        };
        match got {
            Got::Placed => Ok(()),
            Got::Slot(header, slot) => {
                let bytes = slot.bytes(header.len as usize);
                let result = ferroccl_transport::deliver_into(peer, &header, bytes, check, dst);
                self.release(slot);
                result
            }
        }
    }
}

impl Drop for TcpReceiver {
    fn drop(&mut self) {
        self.shared.rx_dropped.store(true, Ordering::SeqCst);
        for rx in &self.shared.rx {
            rx.wake.notify_all();
        }
        self.shared.shutdown(Shutdown::Read);
        // Each reader sees the flag at its next look: woken above, or
        // within one poll slice (the shut-down socket ends that poll too).
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        self.shared.half_dropped();
    }
}
