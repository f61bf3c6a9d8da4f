//! Bytes on one socket: the frame encoding, a resumable frame reader for
//! nonblocking sockets, writes bounded by a deadline and stop conditions,
//! and `poll(2)`. Nothing here knows which thread reads or writes, nor which
//! socket carries which frame: that is `connection`'s business.
//!
//! The reader is a state machine ([`Partial`]) that keeps whatever part of
//! a frame has arrived (header bytes, payload progress, a failure reason),
//! so that a read that would block can be given up and resumed later by
//! another thread: the receiving half's caller or the background reader.

use crate::slot::Slot;
use ferroccl_transport::{elapsed_ms, FrameHeader, FrameKind, TransportError, HEADER_BYTES};
use socket2::Socket;
use std::io::{ErrorKind, IoSlice, Read};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Longest failure reason kept from a Failure frame; longer payloads are
/// read and dropped.
pub(crate) const MAX_REASON_BYTES: usize = 4096;

/// Longest single `poll(2)` wait: between waits, blocked readers and writers
/// look at the abort signal and the connection's failure state.
pub(crate) const POLL_SLICE: Duration = Duration::from_millis(50);

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

/// Wait until `socket` is readable (`POLLIN`) or writable (`POLLOUT`), at
/// most `timeout` (rounded up to a millisecond). Returns whether it is;
/// hang-ups and errors count as ready, so that the next read or write
/// reports them.
pub(crate) fn poll_ready(socket: &Socket, writable: bool, timeout: Duration) -> bool {
    let events = if writable {
        libc::POLLOUT
    } else {
        libc::POLLIN
    };
    let mut fd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events,
        revents: 0,
    };
    let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    // SAFETY: `fd` is one valid, initialised pollfd that outlives the call,
    // and nfds is 1; poll(2) only writes its `revents`.
    let n = unsafe { libc::poll(&mut fd, 1, ms) };
    n > 0
}

/// Why a bounded write stopped before all its bytes were out.
#[derive(Debug)]
pub(crate) enum WriteStop {
    /// The socket would not take more bytes before the deadline, or `stop`
    /// said to give up; the stream is intact up to what was written.
    Stalled(TransportError),
    /// The socket failed.
    Io(std::io::Error),
}

/// Write `parts` (from byte `*written` of their concatenation on) to the
/// nonblocking `socket`, advancing `*written`. When the socket is full, it
/// waits in `poll(2)` slices of at most [`POLL_SLICE`], asking `stop` before
/// each wait and giving up once `deadline` has passed (`what` and `start`
/// then describe the timeout). Never raises SIGPIPE.
pub(crate) fn write_bounded(
    socket: &Socket,
    parts: [&[u8]; 2],
    written: &mut usize,
    deadline: Instant,
    timeout: (usize, &'static str, Instant),
    stop: &mut dyn FnMut() -> Option<TransportError>,
) -> Result<(), WriteStop> {
    let total = parts[0].len() + parts[1].len();
    while *written < total {
        let result = if *written < parts[0].len() {
            socket.send_vectored_with_flags(
                &[IoSlice::new(&parts[0][*written..]), IoSlice::new(parts[1])],
                libc::MSG_NOSIGNAL,
            )
        } else {
            socket.send_vectored_with_flags(
                &[IoSlice::new(&parts[1][*written - parts[0].len()..])],
                libc::MSG_NOSIGNAL,
            )
        };
        match result {
            Ok(0) => return Err(WriteStop::Io(ErrorKind::WriteZero.into())),
            Ok(n) => *written += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if let Some(err) = stop() {
                    return Err(WriteStop::Stalled(err));
                }
                let now = Instant::now();
                if now >= deadline {
                    let (peer, what, start) = timeout;
                    return Err(WriteStop::Stalled(TransportError::Timeout {
                        peer,
                        what,
                        waited_ms: elapsed_ms(start),
                    }));
                }
                poll_ready(socket, true, POLL_SLICE.min(deadline - now));
            }
            Err(e) => return Err(WriteStop::Io(e)),
        }
    }
    Ok(())
}

/// What comes after the bytes being skipped.
#[derive(Debug)]
pub(crate) enum Then {
    /// Nothing: the frame was dropped (its consumer refused it).
    Nothing,
    /// The frame was a Goodbye.
    Goodbye,
    /// The frame was a Failure report.
    Failure { rank: usize, reason: String },
}

/// How far the next frame of a socket has been read.
#[derive(Debug)]
pub(crate) enum Partial {
    /// Reading the header; `got == 0` is the boundary between frames.
    Header { buf: [u8; HEADER_BYTES], got: usize },
    /// A data header has been read; its payload waits for a destination.
    Pending(FrameHeader),
    /// Reading a data payload into `slot`, or (when `slot` is `None`) into
    /// the buffer its current reader passes to [`Partial::advance`].
    Payload {
        header: FrameHeader,
        slot: Option<Slot>,
        got: usize,
    },
    /// Reading the kept part of a failure reason; `skip` bytes follow.
    Reason {
        rank: usize,
        buf: Vec<u8>,
        got: usize,
        skip: usize,
    },
    /// Dropping `left` bytes, then reporting `then`.
    Skip { left: usize, then: Then },
}

/// One step of a frame stream, as [`Partial::advance`] reports it.
#[derive(Debug)]
pub(crate) enum Progress {
    /// The socket has nothing more for now.
    WouldBlock,
    /// A data header arrived (the state is now [`Partial::Pending`]): the
    /// caller picks where its payload goes with [`Partial::set_payload`] or
    /// drops it with [`Partial::drop_payload`].
    Header(FrameHeader),
    /// A data frame is complete: its payload is in the slot, or (`None`) in
    /// the buffer passed to `advance`.
    Frame(FrameHeader, Option<Slot>),
    /// The peer reports that rank `rank` failed.
    Failure { rank: usize, reason: String },
    /// The peer shut down cleanly.
    Goodbye,
    /// The stream ended at a frame boundary without a Goodbye.
    Eof,
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
    pub(crate) fn into_transport(self, peer: usize) -> TransportError {
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

/// Fill `buf` from a blocking `input`; returns how many bytes were read
/// before EOF (`buf.len()` unless the stream ended). Used by the handshake.
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

/// One `read`, retried on EINTR; `None` when it would block.
fn read_once<R: Read>(input: &mut R, buf: &mut [u8]) -> Result<Option<usize>, StreamError> {
    loop {
        match input.read(buf) {
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(StreamError::Io(e)),
        }
    }
}

impl Partial {
    /// Between frames.
    pub(crate) fn idle() -> Self {
        Partial::Header {
            buf: [0; HEADER_BYTES],
            got: 0,
        }
    }

    /// Whether the state is a payload being read into the caller's buffer.
    pub(crate) fn reads_into_caller(&self) -> bool {
        matches!(self, Partial::Payload { slot: None, .. })
    }

    /// Whether reading on needs a destination for a data payload first.
    pub(crate) fn is_pending(&self) -> bool {
        matches!(self, Partial::Pending(_))
    }

    /// Read the pending payload into `slot`, or into the caller's buffer.
    pub(crate) fn set_payload(&mut self, slot: Option<Slot>) {
        if let Partial::Pending(header) = *self {
            *self = Partial::Payload {
                header,
                slot,
                got: 0,
            };
        }
    }

    /// Drop the pending (or caller-bound) payload: its remaining bytes are
    /// read and thrown away. Returns the slot it was bound to, if any.
    pub(crate) fn drop_payload(&mut self) -> Option<Slot> {
        let (left, slot) = match std::mem::replace(self, Partial::idle()) {
            Partial::Pending(header) => (header.len as usize, None),
            Partial::Payload { header, slot, got } => (header.len as usize - got, slot),
            other => {
                *self = other;
                return None;
            }
        };
        *self = Partial::Skip {
            left,
            then: Then::Nothing,
        };
        slot
    }

    /// Turn a payload being read into the caller's buffer `dst` (whose
    /// first bytes have arrived) into one read into `slot`, so that another
    /// reader can finish it.
    pub(crate) fn move_to_slot(&mut self, dst: &[u8], mut slot: Slot) {
        if let Partial::Payload {
            slot: into @ None,
            got,
            ..
        } = self
        {
            slot.bytes_mut(*got).copy_from_slice(&dst[..*got]);
            *into = Some(slot);
        }
    }

    /// Read on from `input` as far as it goes without blocking, up to the
    /// next thing to report. `dst` is the payload buffer when the state is
    /// [`Partial::Payload`] without a slot (ignored otherwise). Wire lengths
    /// are bounded by `chunk_bytes` before use; nothing is allocated from
    /// them beyond [`MAX_REASON_BYTES`].
    pub(crate) fn advance<R: Read>(
        &mut self,
        input: &mut R,
        chunk_bytes: usize,
        mut dst: Option<&mut [u8]>,
    ) -> Result<Progress, StreamError> {
        loop {
            match self {
                Partial::Header { buf, got } => {
                    let Some(n) = read_once(input, &mut buf[*got..])? else {
                        return Ok(Progress::WouldBlock);
                    };
                    if n == 0 {
                        return if *got == 0 {
                            Ok(Progress::Eof)
                        } else {
                            Err(StreamError::Truncated("header"))
                        };
                    }
                    *got += n;
                    if *got < HEADER_BYTES {
                        continue;
                    }
                    let header =
                        FrameHeader::decode(buf, chunk_bytes).map_err(StreamError::Protocol)?;
                    let len = header.len as usize;
                    match header.kind {
                        FrameKind::Data => {
                            *self = Partial::Pending(header);
                            return Ok(Progress::Header(header));
                        }
                        FrameKind::Failure => {
                            let keep = len.min(MAX_REASON_BYTES);
                            *self = Partial::Reason {
                                rank: header.aux as usize,
                                buf: vec![0; keep],
                                got: 0,
                                skip: len - keep,
                            };
                        }
                        FrameKind::Goodbye => {
                            *self = Partial::Skip {
                                left: len,
                                then: Then::Goodbye,
                            };
                        }
                    }
                }
                Partial::Pending(header) => return Ok(Progress::Header(*header)),
                Partial::Payload { header, slot, got } => {
                    let len = header.len as usize;
                    if *got == len {
                        let (header, slot) = (*header, slot.take());
                        *self = Partial::idle();
                        return Ok(Progress::Frame(header, slot));
                    }
                    let buf = match slot {
                        Some(slot) => &mut slot.bytes_mut(len)[*got..],
                        None => match dst.as_deref_mut() {
                            Some(dst) => &mut dst[*got..len],
                            None => return Ok(Progress::WouldBlock),
                        },
                    };
                    let Some(n) = read_once(input, buf)? else {
                        return Ok(Progress::WouldBlock);
                    };
                    if n == 0 {
                        return Err(StreamError::Truncated("payload"));
                    }
                    *got += n;
                }
                Partial::Reason {
                    rank,
                    buf,
                    got,
                    skip,
                } => {
                    if *got == buf.len() {
                        let then = Then::Failure {
                            rank: *rank,
                            reason: String::from_utf8_lossy(buf).into_owned(),
                        };
                        *self = Partial::Skip { left: *skip, then };
                        continue;
                    }
                    let Some(n) = read_once(input, &mut buf[*got..])? else {
                        return Ok(Progress::WouldBlock);
                    };
                    if n == 0 {
                        return Err(StreamError::Truncated("failure reason"));
                    }
                    *got += n;
                }
                Partial::Skip { left, then } => {
                    if *left == 0 {
                        let then = std::mem::replace(then, Then::Nothing);
                        *self = Partial::idle();
                        match then {
                            Then::Nothing => continue,
                            Then::Goodbye => return Ok(Progress::Goodbye),
                            Then::Failure { rank, reason } => {
                                return Ok(Progress::Failure { rank, reason })
                            }
                        }
                    }
                    let mut sink = [0u8; 4096];
                    let want = (*left).min(sink.len());
                    let Some(n) = read_once(input, &mut sink[..want])? else {
                        return Ok(Progress::WouldBlock);
                    };
                    if n == 0 {
                        return Err(StreamError::Truncated(match then {
                            Then::Nothing => "payload",
                            Then::Goodbye => "goodbye",
                            Then::Failure { .. } => "failure reason",
                        }));
                    }
                    *left -= n;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::{Cursor, Write};

    /// Write a frame to a Vec the way a sender does.
    fn put(wire: &mut Vec<u8>, header: &[u8], payload: &[u8]) {
        wire.write_all(header).unwrap();
        wire.write_all(payload).unwrap();
    }

    /// Reads one byte at a time and says "would block" between bytes, to
    /// exercise every resume point.
    struct Trickle<'a> {
        bytes: &'a [u8],
        pos: usize,
        block_next: bool,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.block_next = !self.block_next;
            if self.block_next {
                return Err(ErrorKind::WouldBlock.into());
            }
            if self.pos == self.bytes.len() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.bytes[self.pos];
            self.pos += 1;
            Ok(1)
        }
    }

    #[derive(Debug)]
    enum Event {
        Data(FrameHeader, Vec<u8>),
        Failure { rank: usize, reason: String },
        Goodbye,
    }

    /// Read a whole byte string as a frame stream with an unlimited supply
    /// of slots, resuming after every "would block".
    fn read_all<R: Read>(input: &mut R, chunk: usize) -> (Vec<Event>, Option<StreamError>) {
        let mut state = Partial::idle();
        let mut events = Vec::new();
        loop {
            match state.advance(input, chunk, None) {
                Ok(Progress::WouldBlock) => {}
                Ok(Progress::Header(h)) => {
                    assert!(h.len as usize <= chunk);
                    state.set_payload(Some(Slot::new(chunk)));
                }
                Ok(Progress::Frame(h, slot)) => {
                    let slot = slot.expect("read into a slot");
                    events.push(Event::Data(h, slot.bytes(h.len as usize).to_vec()));
                }
                Ok(Progress::Failure { rank, reason }) => {
                    events.push(Event::Failure { rank, reason })
                }
                Ok(Progress::Goodbye) => events.push(Event::Goodbye),
                Ok(Progress::Eof) => return (events, None),
                Err(e) => return (events, Some(e)),
            }
        }
    }

    fn sample_wire() -> (Vec<u8>, FrameHeader, Vec<u8>) {
        let mut wire = Vec::new();
        let mut h = FrameHeader::data(Default::default(), 5);
        let payload: Vec<u8> = (0..50u8).collect();
        h.len = 50;
        put(&mut wire, &h.encode(), &payload);
        put(
            &mut wire,
            &control_frame(FrameKind::Failure, 7, b"boom"),
            &[],
        );
        put(&mut wire, &control_frame(FrameKind::Goodbye, 0, &[]), &[]);
        (wire, h, payload)
    }

    #[test]
    fn frames_round_trip_whole_and_byte_by_byte() {
        let (wire, h, payload) = sample_wire();
        let whole = read_all(&mut Cursor::new(&wire[..]), 64);
        let trickled = read_all(
            &mut Trickle {
                bytes: &wire,
                pos: 0,
                block_next: false,
            },
            64,
        );
        for (events, err) in [whole, trickled] {
            assert!(err.is_none(), "{err:?}");
            assert_eq!(events.len(), 3, "{events:?}");
            assert!(
                matches!(&events[0], Event::Data(got, bytes) if *got == h && bytes == &payload)
            );
            assert!(matches!(&events[1], Event::Failure { rank: 7, reason } if reason == "boom"));
            assert!(matches!(events[2], Event::Goodbye));
        }
    }

    #[test]
    fn payload_into_the_callers_buffer_can_move_to_a_slot_midway() {
        let (wire, h, payload) = sample_wire();
        let mut input = Trickle {
            bytes: &wire,
            pos: 0,
            block_next: false,
        };
        let mut state = Partial::idle();
        let mut dst = vec![0u8; 50];
        loop {
            match state.advance(&mut input, 64, Some(&mut dst)).unwrap() {
                Progress::Header(got) => {
                    assert_eq!(got, h);
                    state.set_payload(None);
                    assert!(state.reads_into_caller());
                }
                Progress::WouldBlock => {
                    if let Partial::Payload { got: 20.., .. } = state {
                        break;
                    }
                }
                other => panic!("{other:?}"),
            }
        }
        state.move_to_slot(&dst, Slot::new(64));
        assert!(!state.reads_into_caller());
        let frame = loop {
            match state.advance(&mut input, 64, None).unwrap() {
                Progress::WouldBlock => {}
                Progress::Frame(got, slot) => break (got, slot.unwrap()),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(frame.0, h);
        assert_eq!(frame.1.bytes(50), &payload[..]);
    }

    #[test]
    fn dropped_payloads_are_skipped() {
        let (wire, _, _) = sample_wire();
        let mut input = Cursor::new(&wire[..]);
        let mut state = Partial::idle();
        assert!(matches!(
            state.advance(&mut input, 64, None),
            Ok(Progress::Header(_))
        ));
        assert!(state.is_pending());
        assert!(state.drop_payload().is_none());
        assert!(matches!(
            state.advance(&mut input, 64, None),
            Ok(Progress::Failure { rank: 7, .. })
        ));
    }

    #[test]
    fn oversized_and_truncated_frames_are_errors() {
        let mut h = FrameHeader::data(Default::default(), 0);
        h.len = 65;
        let (events, err) = read_all(&mut Cursor::new(&h.encode()[..]), 64);
        assert!(events.is_empty());
        assert!(
            matches!(err, Some(StreamError::Protocol(ref d)) if d.contains("65")),
            "{err:?}"
        );
        h.len = 10;
        let mut wire = h.encode().to_vec();
        wire.extend_from_slice(&[1, 2, 3]);
        let (_, err) = read_all(&mut Cursor::new(&wire[..]), 64);
        assert!(
            matches!(err, Some(StreamError::Truncated("payload"))),
            "{err:?}"
        );
        let (_, err) = read_all(&mut Cursor::new(&wire[..20]), 64);
        assert!(
            matches!(err, Some(StreamError::Truncated("header"))),
            "{err:?}"
        );
    }

    proptest! {
        #[test]
        fn random_streams_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), chunk in 1usize..128) {
            let (events, err) = read_all(&mut Cursor::new(&bytes[..]), chunk);
            if !bytes.is_empty() && bytes.len() < HEADER_BYTES {
                prop_assert!(events.is_empty());
                prop_assert!(matches!(err, Some(StreamError::Truncated("header"))));
            }
        }

        #[test]
        fn random_headers_without_magic_are_refused(bytes in proptest::collection::vec(any::<u8>(), HEADER_BYTES..256)) {
            prop_assume!(bytes[0..4] != ferroccl_transport::MAGIC.to_le_bytes());
            let (events, err) = read_all(&mut Cursor::new(&bytes[..]), 1 << 20);
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
                put(&mut wire, &h.encode(), &payload);
            }
            wire.extend_from_slice(&tail);
            let (events, err) = read_all(&mut Trickle { bytes: &wire, pos: 0, block_next: false }, chunk);
            // Every valid frame comes out, in order; the tail then either
            // decodes by chance or is refused, never panics.
            prop_assert!(events.len() >= lens.len());
            for (i, ev) in events.iter().take(lens.len()).enumerate() {
                prop_assert!(matches!(ev, Event::Data(h, b) if h.step == i as u32 && h.len as usize == lens[i] && b.iter().all(|x| *x == i as u8)));
            }
            if tail.len() < HEADER_BYTES {
                prop_assert!(err.is_some());
            }
        }
    }
}
