//! The per-socket threads of a connection: a writer that puts frames
//! (header and payload, straight from the slot buffer) on the socket, and a
//! reader that decodes headers and reads payloads straight into free slot
//! buffers. Neither owns the slot FIFO's policy (which socket carries which
//! frame, when a half gives up): that is `connection`'s.

use crate::connection::{ConnShared, Slot};
use crate::latch::lock;
use crossbeam_channel::{select, Receiver, Sender};
use ferroccl_transport::{FrameHeader, FrameKind, TransportError, HEADER_BYTES};
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Longest failure reason kept from a Failure frame; longer payloads are
/// read and dropped.
pub(crate) const MAX_REASON_BYTES: usize = 4096;

/// Work for a writer thread.
pub(crate) enum WriterCmd {
    /// A data frame in a slot buffer; the buffer goes back to the free list
    /// once written (or once writing is known to be impossible).
    Frame {
        header: [u8; HEADER_BYTES],
        slot: Slot,
        len: usize,
    },
    /// A control frame (Goodbye, Failure), encoded with its payload; `done`
    /// is dropped once it has been written or given up on.
    Control { frame: Vec<u8>, done: Sender<()> },
    /// The sending half is gone: say goodbye, half-close, exit.
    Finish,
}

/// What a reader hands to the receiving half.
pub(crate) enum Inbound {
    /// A data frame, its payload in `slot[..header.len]`.
    Frame(FrameHeader, Slot),
    /// This socket ended; no more frames follow on it.
    End(TransportError),
}

/// Encode a control frame: header with `len` set, then `payload`.
pub(crate) fn control_frame(kind: FrameKind, aux: u32, payload: &[u8]) -> Vec<u8> {
    let mut header = FrameHeader::data(Default::default(), 0);
    header.kind = kind;
    header.aux = aux;
    header.len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut frame = Vec::with_capacity(HEADER_BYTES + payload.len());
    frame.extend_from_slice(&header.encode());
    frame.extend_from_slice(payload);
    frame
}

/// Map an I/O error on a peer's socket to the transport error callers see.
pub(crate) fn peer_io_error(peer: usize, doing: &str, e: &std::io::Error) -> TransportError {
    match e.kind() {
        ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe
        | ErrorKind::UnexpectedEof
        | ErrorKind::NotConnected
        | ErrorKind::WriteZero => TransportError::PeerClosed {
            peer,
            detail: format!("{doing}: {e}"),
        },
        _ => TransportError::Io(format!("{doing} rank {peer}: {e}")),
    }
}

/// Write `header` then `payload` with as few syscalls as the kernel allows
/// (one `writev` for both in the common case).
pub(crate) fn write_frame<W: Write>(
    out: &mut W,
    header: &[u8],
    payload: &[u8],
) -> std::io::Result<()> {
    let total = header.len() + payload.len();
    let mut written = 0;
    while written < total {
        let result = if written < header.len() {
            out.write_vectored(&[IoSlice::new(&header[written..]), IoSlice::new(payload)])
        } else {
            out.write(&payload[written - header.len()..])
        };
        match result {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The writer thread of one socket.
pub(crate) fn run_writer(
    mut stream: TcpStream,
    shared: Arc<ConnShared>,
    cmds: Receiver<WriterCmd>,
    free: Sender<Slot>,
    _alive: Sender<()>,
) {
    let peer = shared.peer;
    // Once writing failed or a Goodbye/Failure went out, nothing more is
    // written; slot buffers still flow back so that waiters wake.
    let mut failed = false;
    let mut finished = false;
    for cmd in cmds.iter() {
        match cmd {
            WriterCmd::Frame { header, slot, len } => {
                if !failed && !finished {
                    if let Err(e) = write_frame(&mut stream, &header, slot.bytes(len)) {
                        failed = true;
                        shared.set_send_error(peer_io_error(peer, "sending a frame to", &e));
                    }
                }
                let _ = free.send(slot);
            }
            WriterCmd::Control { frame, done } => {
                if !failed && !finished {
                    finished = true;
                    if let Err(e) = write_frame(&mut stream, &frame, &[]) {
                        tracing::debug!(peer, "control frame not delivered: {e}");
                    }
                }
                drop(done);
            }
            WriterCmd::Finish => {
                if !failed && !finished {
                    let goodbye = control_frame(FrameKind::Goodbye, 0, &[]);
                    if let Err(e) = write_frame(&mut stream, &goodbye, &[]) {
                        tracing::debug!(peer, "goodbye not delivered: {e}");
                    }
                }
                let _ = stream.shutdown(Shutdown::Write);
                return;
            }
        }
    }
}

/// Fill `buf` from `input`; returns how many bytes were read before EOF
/// (`buf.len()` unless the stream ended).
pub(crate) fn read_full<R: Read>(input: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Read and drop `len` bytes, through a fixed buffer.
fn skip<R: Read>(input: &mut R, len: usize) -> std::io::Result<()> {
    let copied = std::io::copy(&mut input.take(len as u64), &mut std::io::sink())?;
    if copied < len as u64 {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// One step of a frame stream, as the reader sees it.
#[derive(Debug)]
pub(crate) enum Event {
    /// A data frame; its payload is now in the slot.
    Data(FrameHeader),
    /// The peer reports that rank `rank` failed.
    Failure { rank: usize, reason: String },
    /// The peer shut down cleanly.
    Goodbye,
    /// The stream ended at a frame boundary without a Goodbye.
    Eof,
    /// `take_slot` declined: the receiving side is going away.
    Stopped,
}

/// Why a frame stream could not be read further.
#[derive(Debug)]
pub(crate) enum StreamError {
    /// The header did not decode (bad magic, kind, oversized length).
    Protocol(String),
    /// The stream ended inside a frame.
    Truncated(&'static str),
    /// The socket failed.
    Io(std::io::Error),
}

impl StreamError {
    fn into_transport(self, peer: usize) -> TransportError {
        match self {
            StreamError::Protocol(detail) => TransportError::Protocol { peer, detail },
            StreamError::Truncated(what) => TransportError::PeerClosed {
                peer,
                detail: format!("connection closed in the middle of a frame ({what})"),
            },
            StreamError::Io(e) => peer_io_error(peer, "receiving from", &e),
        }
    }
}

/// Read the next frame of `input`. Data payloads go into the slot that
/// `take_slot` provides (it returns `None` to stop, e.g. when the receiving
/// half is gone); nothing is allocated from a wire length, which is bounded
/// by `chunk_bytes` before use.
pub(crate) fn read_event<R: Read>(
    input: &mut R,
    chunk_bytes: usize,
    take_slot: &mut dyn FnMut() -> Option<Slot>,
    slot_out: &mut Option<Slot>,
) -> Result<Event, StreamError> {
    let mut raw = [0u8; HEADER_BYTES];
    let got = read_full(input, &mut raw).map_err(StreamError::Io)?;
    if got == 0 {
        return Ok(Event::Eof);
    }
    if got < HEADER_BYTES {
        return Err(StreamError::Truncated("header"));
    }
    let header = FrameHeader::decode(&raw, chunk_bytes).map_err(StreamError::Protocol)?;
    let len = header.len as usize;
    match header.kind {
        FrameKind::Data => {
            let Some(mut slot) = take_slot() else {
                return Ok(Event::Stopped);
            };
            let got = read_full(input, slot.bytes_mut(len)).map_err(StreamError::Io)?;
            if got < len {
                return Err(StreamError::Truncated("payload"));
            }
            *slot_out = Some(slot);
            Ok(Event::Data(header))
        }
        FrameKind::Failure => {
            let mut reason = [0u8; MAX_REASON_BYTES];
            let keep = len.min(MAX_REASON_BYTES);
            let got = read_full(input, &mut reason[..keep]).map_err(StreamError::Io)?;
            if got < keep {
                return Err(StreamError::Truncated("failure reason"));
            }
            skip(input, len - keep).map_err(|_| StreamError::Truncated("failure reason"))?;
            Ok(Event::Failure {
                rank: header.aux as usize,
                reason: String::from_utf8_lossy(&reason[..keep]).into_owned(),
            })
        }
        FrameKind::Goodbye => {
            skip(input, len).map_err(|_| StreamError::Truncated("goodbye"))?;
            Ok(Event::Goodbye)
        }
    }
}

/// The reader thread of one socket.
pub(crate) fn run_reader(
    mut stream: TcpStream,
    shared: Arc<ConnShared>,
    filled: Sender<Inbound>,
    free: Receiver<Slot>,
) {
    let peer = shared.peer;
    let chunk_bytes = shared.chunk_bytes;
    let mut take_slot = || {
        select! {
            recv(free) -> slot => slot.ok(),
            recv(shared.fatal_latch.receiver()) -> _ => None,
        }
    };
    loop {
        let mut slot = None;
        let event = read_event(&mut stream, chunk_bytes, &mut take_slot, &mut slot);
        if shared.rx_dropped.load(Ordering::SeqCst) {
            return;
        }
        let end = match event {
            Ok(Event::Data(header)) => {
                let Some(slot) = slot else { return };
                if filled.send(Inbound::Frame(header, slot)).is_err() {
                    return;
                }
                continue;
            }
            Ok(Event::Failure { rank, reason }) => {
                tracing::warn!(peer, failed_rank = rank, "peer reports a failure: {reason}");
                shared.set_fatal(TransportError::PeerFailed { rank, reason });
                return;
            }
            Ok(Event::Goodbye) => {
                let err = TransportError::PeerClosed {
                    peer,
                    detail: "peer shut down cleanly".into(),
                };
                // Only the peer's sending half is gone: its receiving half
                // may still read what we send.
                let _ = filled.send(Inbound::End(err));
                return;
            }
            Ok(Event::Stopped) => return,
            Ok(Event::Eof) => {
                if shared.fatal_latch.is_fired() {
                    return;
                }
                TransportError::PeerClosed {
                    peer,
                    detail: "connection closed without a goodbye".into(),
                }
            }
            Err(e) => e.into_transport(peer),
        };
        if lock(&shared.fatal).is_none() {
            tracing::warn!(peer, "connection broken: {end}");
        }
        // Both halves learn of it before `recv_with` can see it.
        shared.set_send_error(end.clone());
        shared.set_rx_broken(end.clone());
        let _ = filled.send(Inbound::End(end));
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;

    /// Read a whole byte string as a frame stream, the way the reader thread
    /// does, with an unlimited supply of slots.
    fn read_all(bytes: &[u8], chunk: usize) -> (Vec<Event>, Option<StreamError>) {
        let mut input = Cursor::new(bytes);
        let mut events = Vec::new();
        loop {
            let mut slot = None;
            match read_event(&mut input, chunk, &mut || Some(Slot::new(chunk)), &mut slot) {
                Ok(Event::Eof) => return (events, None),
                Ok(ev) => {
                    if let Event::Data(h) = &ev {
                        let slot = slot.expect("data comes with its slot");
                        assert!(h.len as usize <= chunk);
                        assert_eq!(slot.bytes(chunk).len(), chunk);
                    }
                    events.push(ev);
                }
                Err(e) => return (events, Some(e)),
            }
        }
    }

    #[test]
    fn frames_round_trip_through_write_and_read() {
        let chunk = 64;
        let mut wire = Vec::new();
        let mut h = FrameHeader::data(Default::default(), 5);
        let payload: Vec<u8> = (0..50u8).collect();
        h.len = 50;
        write_frame(&mut wire, &h.encode(), &payload).unwrap();
        write_frame(
            &mut wire,
            &control_frame(FrameKind::Failure, 7, b"boom"),
            &[],
        )
        .unwrap();
        write_frame(&mut wire, &control_frame(FrameKind::Goodbye, 0, &[]), &[]).unwrap();
        let mut input = Cursor::new(&wire[..]);
        let mut slot = None;
        let ev = read_event(&mut input, chunk, &mut || Some(Slot::new(chunk)), &mut slot).unwrap();
        assert!(matches!(ev, Event::Data(got) if got == h));
        assert_eq!(slot.unwrap().bytes(50), &payload[..]);
        let ev = read_event(&mut input, chunk, &mut || None, &mut None).unwrap();
        assert!(matches!(ev, Event::Failure { rank: 7, ref reason } if reason == "boom"));
        let ev = read_event(&mut input, chunk, &mut || None, &mut None).unwrap();
        assert!(matches!(ev, Event::Goodbye));
        let ev = read_event(&mut input, chunk, &mut || None, &mut None).unwrap();
        assert!(matches!(ev, Event::Eof));
    }

    #[test]
    fn oversized_and_truncated_frames_are_errors() {
        let mut h = FrameHeader::data(Default::default(), 0);
        h.len = 65;
        let (events, err) = read_all(&h.encode(), 64);
        assert!(events.is_empty());
        assert!(
            matches!(err, Some(StreamError::Protocol(ref d)) if d.contains("65")),
            "{err:?}"
        );
        h.len = 10;
        let mut wire = h.encode().to_vec();
        wire.extend_from_slice(&[1, 2, 3]);
        let (_, err) = read_all(&wire, 64);
        assert!(
            matches!(err, Some(StreamError::Truncated("payload"))),
            "{err:?}"
        );
        let (_, err) = read_all(&wire[..20], 64);
        assert!(
            matches!(err, Some(StreamError::Truncated("header"))),
            "{err:?}"
        );
    }

    proptest! {
        #[test]
        fn random_streams_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), chunk in 1usize..128) {
            let (events, err) = read_all(&bytes, chunk);
            if !bytes.is_empty() && bytes.len() < HEADER_BYTES {
                prop_assert!(events.is_empty());
                prop_assert!(matches!(err, Some(StreamError::Truncated("header"))));
            }
        }

        #[test]
        fn random_headers_without_magic_are_refused(bytes in proptest::collection::vec(any::<u8>(), HEADER_BYTES..256)) {
            prop_assume!(bytes[0..4] != ferroccl_transport::MAGIC.to_le_bytes());
            let (events, err) = read_all(&bytes, 1 << 20);
            prop_assert!(events.is_empty());
            prop_assert!(matches!(err, Some(StreamError::Protocol(_))), "{:?}", err);
        }

        #[test]
        fn valid_frames_then_garbage(lens in proptest::collection::vec(0usize..=32, 0..6), tail in proptest::collection::vec(any::<u8>(), 1..64)) {
            let chunk = 32;
            let mut wire = Vec::new();
            for (i, len) in lens.iter().enumerate() {
                let mut h = FrameHeader::data(Default::default(), i as u32);
                h.len = *len as u32;
                let payload = vec![i as u8; *len];
                write_frame(&mut wire, &h.encode(), &payload).unwrap();
            }
            wire.extend_from_slice(&tail);
            let (events, err) = read_all(&wire, chunk);
            // Every valid frame comes out, in order; the tail then either
            // decodes by chance or is refused, never panics.
            prop_assert!(events.len() >= lens.len());
            for (i, ev) in events.iter().take(lens.len()).enumerate() {
                prop_assert!(matches!(ev, Event::Data(h) if h.step == i as u32 && h.len as usize == lens[i]));
            }
            if tail.len() < HEADER_BYTES {
                prop_assert!(err.is_some());
            }
        }
    }
}
