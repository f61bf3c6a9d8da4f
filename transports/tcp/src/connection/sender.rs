//! The sending half of a TCP connection: frames written on the calling
//! thread (header and payload in one gather write), the backlog that keeps
//! a stream framed when a send gives up midway, and the goodbye on drop.
//! It never reads a socket.

use super::{flush_backlog, ConnShared, TxSocket, TxState, DRAIN_TIMEOUT, SEND_WAIT};
use crate::slot::Slot;
use crate::wire::{self, WriteStop};
use ferroccl_transport::{
    lock, AbortSignal, FrameHeader, FrameKind, SlotSender, TransportError, HEADER_BYTES,
};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// The sending half: writes frames on the calling thread.
pub(super) struct TcpSender {
    shared: Arc<ConnShared>,
    /// Socket of the next frame.
    next: usize,
    abort: AbortSignal,
    /// Where `send_with` lets its closure fill a frame.
    scratch: Slot,
}

impl TcpSender {
    pub(super) fn new(shared: Arc<ConnShared>, abort: AbortSignal) -> Self {
        let scratch = Slot::new(shared.chunk_bytes);
        TcpSender {
            shared,
            next: 0,
            abort,
            scratch,
        }
    }

    fn ready(&self) -> Result<(), TransportError> {
        if self.abort.is_fired() {
            return Err(TransportError::Aborted);
        }
        match self.shared.send_failure() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

/// Put one data frame on socket `*next` and move `*next` on once any byte
/// of it is on the wire.
fn put_frame(
    shared: &ConnShared,
    next: &mut usize,
    abort: &AbortSignal,
    mut header: FrameHeader,
    payload: &[u8],
    deadline: Instant,
) -> Result<(), TransportError> {
    let start = Instant::now();
    let peer = shared.peer;
    // Slots are at most u32::MAX bytes (checked when listening).
    header.len = payload.len() as u32;
    let encoded = header.encode();
    let k = *next;
    let tx = &shared.tx[k];
    let mut st = lock(&tx.state);
    if st.closed {
        return Err(shared
            .send_failure()
            .unwrap_or_else(|| TransportError::PeerClosed {
                peer,
                detail: "connection closed".into(),
            }));
    }
    let mut stop = || {
        if abort.is_fired() {
            Some(TransportError::Aborted)
        } else {
            shared.send_failure()
        }
    };
    let timeout = (peer, SEND_WAIT, start);
    let failed = |st: &mut TxState, stop: WriteStop| match stop {
        WriteStop::Stalled(err) => err,
        WriteStop::Io(e) => {
            st.closed = true;
            shared.set_send_error(wire::peer_io_error(peer, "sending a frame to", &e));
            shared
                .send_failure()
                .unwrap_or_else(|| TransportError::Io(e.to_string()))
        }
    };
    if let Err(e) = flush_backlog(tx, &mut st, deadline, timeout, &mut stop) {
        return Err(failed(&mut st, e));
    }
    if crate::fault::cut_this_frame() {
        return Err(cut_mid_frame(
            shared, &mut st, tx, &encoded, payload, deadline,
        ));
    }
    let mut written = 0;
    let result = wire::write_bounded(
        &tx.socket,
        [&encoded, payload],
        &mut written,
        deadline,
        timeout,
        &mut stop,
    );
    if written > 0 {
        *next = if k + 1 == shared.tx.len() { 0 } else { k + 1 };
    }
    match result {
        Ok(()) => Ok(()),
        Err(e) => {
            if written > 0 && matches!(e, WriteStop::Stalled(_)) {
                // Keep the stream framed: the rest goes out before anything
                // else on this socket.
                st.backlog.clear();
                st.sent = 0;
                if written < HEADER_BYTES {
                    st.backlog.extend_from_slice(&encoded[written..]);
                    st.backlog.extend_from_slice(payload);
                } else {
                    st.backlog
                        .extend_from_slice(&payload[written - HEADER_BYTES..]);
                }
            }
            Err(failed(&mut st, e))
        }
    }
}

/// The `FERROCCL_FAULT=close_mid_frame` hook: put the header and half the
/// payload on the wire, then shut the socket down as a dying network would.
#[cold]
fn cut_mid_frame(
    shared: &ConnShared,
    st: &mut TxState,
    tx: &TxSocket,
    encoded: &[u8],
    payload: &[u8],
    deadline: Instant,
) -> TransportError {
    let mut written = 0;
    let mut never = || None;
    // Half the payload; half the header for a frame without one.
    let parts = if payload.is_empty() {
        [&encoded[..encoded.len() / 2], payload]
    } else {
        [encoded, &payload[..payload.len() / 2]]
    };
    let _ = wire::write_bounded(
        &tx.socket,
        parts,
        &mut written,
        deadline,
        (shared.peer, SEND_WAIT, Instant::now()),
        &mut never,
    );
    tracing::warn!(
        peer = shared.peer,
        "FERROCCL_FAULT: closed the socket after {written} bytes of a {}-byte frame",
        encoded.len() + payload.len()
    );
    st.closed = true;
    shared.shutdown(Shutdown::Both);
    let err = TransportError::Io(format!(
        "fault injection (FERROCCL_FAULT): closed the socket to rank {} mid-frame",
        shared.peer
    ));
    shared.set_send_error(err.clone());
    err
}

impl SlotSender for TcpSender {
    fn chunk_bytes(&self) -> usize {
        self.shared.chunk_bytes
    }

    /// `send_from` writes caller memory to the socket as it is.
    fn send_from_copies(&self) -> bool {
        false
    }

    fn send_with(
        &mut self,
        header: FrameHeader,
        deadline: Instant,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), TransportError> {
        self.ready()?;
        let chunk_bytes = self.shared.chunk_bytes;
        let len = fill(self.scratch.bytes_mut(chunk_bytes));
        if len > chunk_bytes {
            return Err(TransportError::Io(format!(
                "fill wrote {len} bytes into a {chunk_bytes}-byte slot for rank {}",
                self.shared.peer
            )));
        }
        put_frame(
            &self.shared,
            &mut self.next,
            &self.abort,
            header,
            self.scratch.bytes(len),
            deadline,
        )
    }

    fn send_from(
        &mut self,
        header: FrameHeader,
        deadline: Instant,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        self.ready()?;
        if bytes.len() > self.shared.chunk_bytes {
            return Err(TransportError::Io(format!(
                "a frame of {} bytes does not fit a {}-byte slot",
                bytes.len(),
                self.shared.chunk_bytes
            )));
        }
        put_frame(
            &self.shared,
            &mut self.next,
            &self.abort,
            header,
            bytes,
            deadline,
        )
    }
}

impl Drop for TcpSender {
    fn drop(&mut self) {
        let shared = &self.shared;
        // Say goodbye on every socket, after the tail of a cut-short frame
        // (the peer may be reading right now); when the connection is dead
        // or being aborted, only as far as it goes without waiting.
        let start = Instant::now();
        let quick = self.abort.is_fired() || shared.fatal_set.load(Ordering::SeqCst);
        let deadline = if quick { start } else { start + DRAIN_TIMEOUT };
        let goodbye = wire::control_frame(FrameKind::Goodbye, 0, &[]);
        let mut stop = || {
            if self.abort.is_fired() {
                Some(TransportError::Aborted)
            } else {
                shared.fatal_error()
            }
        };
        let mut cut = false;
        for tx in &shared.tx {
            let mut st = lock(&tx.state);
            if st.closed {
                continue;
            }
            st.closed = true;
            let timeout = (shared.peer, SEND_WAIT, start);
            let out = flush_backlog(tx, &mut st, deadline, timeout, &mut stop).and_then(|()| {
                wire::write_bounded(
                    &tx.socket,
                    [&goodbye, &[]],
                    &mut 0,
                    deadline,
                    timeout,
                    &mut stop,
                )
            });
            match out {
                Ok(()) => {}
                Err(WriteStop::Stalled(_)) => cut = true,
                Err(WriteStop::Io(e)) => {
                    tracing::debug!(peer = shared.peer, "goodbye not delivered: {e}")
                }
            }
        }
        if cut && !quick {
            tracing::warn!(
                peer = shared.peer,
                "goodbye not flushed within {DRAIN_TIMEOUT:?}; cutting the connection"
            );
        }
        shared.shutdown(Shutdown::Write);
        shared.half_dropped();
    }
}
