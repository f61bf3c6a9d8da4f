//! The wire format of the rendezvous: frames, opcodes, the payload of each
//! message and the bounds on every length read from the wire.
//!
//! This is encoding and decoding only, over `Read` and `Write`: it holds no
//! socket and no state, and knows nothing of the server or the client (both
//! speak through it). A change here is a change of the protocol, and of
//! [`VERSION`].
//!
//! Every message is one frame: `op: u8`, `len: u32` little-endian, then `len`
//! bytes of payload. Integers are little-endian. Each opcode has a maximum
//! payload, checked before anything is allocated, and payloads are read as
//! they arrive (memory follows the bytes received, never the length
//! claimed); an unknown opcode, an oversized length, a payload of the wrong
//! shape or a truncated frame ends the connection (with a WARN on the
//! server).
//!
//! Client to server:
//!
//! | op   | name      | payload                                                    |
//! |------|-----------|------------------------------------------------------------|
//! | 0x01 | HELLO     | magic `u32` (`"FCCL"`), version `u16` (3), kind `u8` (0 request, 1 watch), rank `u32`, token `u64`, heartbeat interval in ms `u32` (0: none) |
//! | 0x02 | SET       | key length `u32`, key, value (the rest; key ≤ 4 KiB, value ≤ 64 MiB) |
//! | 0x03 | GET       | wait in ms `u64`, key (the rest)                           |
//! | 0x04 | REPORT    | a failure report (below)                                   |
//! | 0x05 | GOODBYE   | empty; only on a watch connection                          |
//! | 0x06 | HEARTBEAT | empty; only on a watch connection                          |
//! | 0x07 | ASK       | communicator `u64`, question id `u64`: how far are its members? |
//! | 0x08 | PROGRESS  | communicator `u64`, question id `u64`, rank `u32`, last issued call `u64`; only on a watch connection |
//! | 0x09 | RELEASE   | parties `u32` (≥ 1), scope (the rest, ≤ 4 KiB): one of `parties` users is done with every key that starts with scope; the last one's RELEASE removes them |
//!
//! Server to client:
//!
//! | op   | name    | payload                                              |
//! |------|---------|------------------------------------------------------|
//! | 0x81 | OK      | empty: hello accepted, SET, REPORT, ASK or RELEASE done |
//! | 0x82 | VALUE   | the value asked for by GET                           |
//! | 0x83 | MISSING | empty: the key did not appear within the wait        |
//! | 0x84 | REFUSED | reason (UTF-8): wrong token, version or rank         |
//! | 0x85 | FAILURE | a failure report (pushed on watch connections)       |
//! | 0x86 | CLOSING | empty: the server is shutting down cleanly           |
//! | 0x87 | BEAT    | empty: the server's heartbeat, on watch connections  |
//! | 0x88 | ASK     | as the client's ASK, pushed on watch connections     |
//!
//! A failure report is: failed rank `u32`, kind `u8` (0 failed, 1
//! mismatch), for a mismatch the communicator `u64`, the call's sequence
//! number `u64`, the peer's rank `u32` and the two calls described (each a
//! length `u16` and UTF-8, ≤ 1 KiB), then the reason (UTF-8, the rest, ≤ 64
//! KiB).

use crate::bootstrap::{FailureReport, Heartbeat, MismatchReport};
use std::io::{self, Read, Write};
use std::time::Duration;

/// The largest key, in bytes.
pub const MAX_KEY_LEN: usize = 4 << 10;
/// The largest value, in bytes.
pub const MAX_VALUE_LEN: usize = 64 << 20;
/// The largest failure reason carried on the wire; longer ones are cut.
const MAX_REASON_LEN: usize = 64 << 10;
/// Shortest and longest heartbeat intervals accepted from a hello.
pub(super) const HEARTBEAT_RANGE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(3600));

const MAGIC: u32 = u32::from_be_bytes(*b"FCCL");
pub(super) const VERSION: u16 = 3;
const HELLO_LEN: usize = 4 + 2 + 1 + 4 + 8 + 4;
/// The longest description of a call in a mismatch report.
const MAX_CALL_LEN: usize = 1 << 10;
/// The longest failure report without its reason (the mismatch part
/// included).
const REPORT_FIXED_LEN: usize = 4 + 1 + 8 + 8 + 4 + 2 * (2 + MAX_CALL_LEN);
/// The longest failure report, reason included.
const MAX_REPORT_LEN: usize = REPORT_FIXED_LEN + MAX_REASON_LEN;
const ASK_LEN: usize = 8 + 8;
const PROGRESS_LEN: usize = 8 + 8 + 4 + 8;

pub(super) const OP_HELLO: u8 = 0x01;
pub(super) const OP_SET: u8 = 0x02;
pub(super) const OP_GET: u8 = 0x03;
pub(super) const OP_REPORT: u8 = 0x04;
pub(super) const OP_GOODBYE: u8 = 0x05;
pub(super) const OP_HEARTBEAT: u8 = 0x06;
pub(super) const OP_ASK: u8 = 0x07;
pub(super) const OP_PROGRESS: u8 = 0x08;
pub(super) const OP_RELEASE: u8 = 0x09;
pub(super) const OP_OK: u8 = 0x81;
pub(super) const OP_VALUE: u8 = 0x82;
pub(super) const OP_MISSING: u8 = 0x83;
pub(super) const OP_REFUSED: u8 = 0x84;
pub(super) const OP_FAILURE: u8 = 0x85;
pub(super) const OP_CLOSING: u8 = 0x86;
pub(super) const OP_BEAT: u8 = 0x87;
pub(super) const OP_ASKED: u8 = 0x88;

pub(super) const KIND_REQUEST: u8 = 0;
pub(super) const KIND_WATCH: u8 = 1;

const REPORT_FAILED: u8 = 0;
const REPORT_MISMATCH: u8 = 1;
/// Laid out as a mismatch: the reporter refused its call.
const REPORT_REFUSED: u8 = 2;
/// A failure in one communicator: its id (`u64`) follows the kind.
const REPORT_FAILED_IN: u8 = 3;

/// Memory read at a time from a payload, so that memory follows the bytes
/// that arrived rather than the length a frame claims.
const READ_PIECE: usize = 64 << 10;

/// The largest payload allowed for `op` in the given direction.
fn max_payload(op: u8, to_server: bool) -> Option<usize> {
    if to_server {
        match op {
            OP_HELLO => Some(HELLO_LEN),
            OP_SET => Some(4 + MAX_KEY_LEN + MAX_VALUE_LEN),
            OP_GET => Some(8 + MAX_KEY_LEN),
            OP_REPORT => Some(MAX_REPORT_LEN),
            OP_GOODBYE | OP_HEARTBEAT => Some(0),
            OP_ASK => Some(ASK_LEN),
            OP_PROGRESS => Some(PROGRESS_LEN),
            OP_RELEASE => Some(4 + MAX_KEY_LEN),
            _ => None,
        }
    } else {
        match op {
            OP_OK | OP_MISSING | OP_CLOSING | OP_BEAT => Some(0),
            OP_VALUE => Some(MAX_VALUE_LEN),
            OP_REFUSED => Some(MAX_REASON_LEN),
            OP_FAILURE => Some(MAX_REPORT_LEN),
            OP_ASKED => Some(ASK_LEN),
            _ => None,
        }
    }
}

/// Why a frame could not be read.
#[derive(Debug)]
pub(super) enum ReadError {
    /// The peer closed the connection between frames.
    Closed,
    /// The socket failed (including read timeouts of a blocking read).
    Io(io::Error),
    /// The bytes are not a frame of this protocol.
    Bad(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Closed => write!(f, "connection closed"),
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Bad(s) => write!(f, "{s}"),
        }
    }
}

/// Check a frame header: the opcode is known in this direction and the
/// length within its limit. Returns (opcode, payload length).
fn check_header(header: &[u8; 5], to_server: bool) -> std::result::Result<(u8, usize), String> {
    let op = header[0];
    let len = u32::from_le_bytes([header[1], header[2], header[3], header[4]]) as usize;
    let Some(max) = max_payload(op, to_server) else {
        return Err(format!("unknown opcode 0x{op:02x}"));
    };
    if len > max {
        return Err(format!(
            "frame of opcode 0x{op:02x} claims {len} bytes, more than its limit of {max}"
        ));
    }
    Ok((op, len))
}

/// A resumable frame reader: a read that times out keeps what has arrived,
/// so a socket with a read timeout can be polled (for heartbeats) without
/// losing its framing.
#[derive(Debug)]
pub(super) struct FrameReader {
    to_server: bool,
    header: [u8; 5],
    got: usize,
    /// (opcode, length) once the header is complete and checked.
    frame: Option<(u8, usize)>,
    payload: Vec<u8>,
}

impl FrameReader {
    pub(super) fn new(to_server: bool) -> Self {
        FrameReader {
            to_server,
            header: [0; 5],
            got: 0,
            frame: None,
            payload: Vec::new(),
        }
    }

    /// Read until a frame is complete (`Ok(Some)`), or the socket's read
    /// timeout passes (`Ok(None)`, resumable), or the stream ends or breaks.
    pub(super) fn poll(
        &mut self,
        r: &mut impl Read,
    ) -> std::result::Result<Option<(u8, Vec<u8>)>, ReadError> {
        loop {
            let Some((op, len)) = self.frame else {
                match r.read(&mut self.header[self.got..]) {
                    Ok(0) if self.got == 0 => return Err(ReadError::Closed),
                    Ok(0) => {
                        return Err(ReadError::Bad(format!(
                            "truncated frame header ({} of 5 bytes)",
                            self.got
                        )))
                    }
                    Ok(n) => self.got += n,
                    Err(e) => return would_block(e),
                }
                if self.got == self.header.len() {
                    let (op, len) =
                        check_header(&self.header, self.to_server).map_err(ReadError::Bad)?;
                    self.frame = Some((op, len));
                    self.payload = Vec::with_capacity(len.min(READ_PIECE));
                }
                continue;
            };
            if self.payload.len() == len {
                self.got = 0;
                self.frame = None;
                return Ok(Some((op, std::mem::take(&mut self.payload))));
            }
            let have = self.payload.len();
            let piece = (len - have).min(READ_PIECE);
            self.payload.resize(have + piece, 0);
            match r.read(&mut self.payload[have..]) {
                Ok(0) => {
                    return Err(ReadError::Bad(format!(
                        "truncated frame: opcode 0x{op:02x} promised {len} bytes, {have} came"
                    )))
                }
                Ok(n) => self.payload.truncate(have + n),
                Err(e) => {
                    self.payload.truncate(have);
                    return would_block(e);
                }
            }
        }
    }
}

/// A read error: a timeout (`Ok(None)`: try again), or a real one.
fn would_block<T>(e: io::Error) -> std::result::Result<Option<T>, ReadError> {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted => {
            Ok(None)
        }
        _ => Err(ReadError::Io(e)),
    }
}

/// Read one frame, bounding its length by opcode before allocating; a
/// read timeout on the socket is an error here.
pub(super) fn read_frame(
    r: &mut impl Read,
    to_server: bool,
) -> std::result::Result<(u8, Vec<u8>), ReadError> {
    let mut reader = FrameReader::new(to_server);
    match reader.poll(r)? {
        Some(frame) => Ok(frame),
        None => Err(ReadError::Io(io::Error::new(
            io::ErrorKind::TimedOut,
            "no complete frame within the read timeout",
        ))),
    }
}

/// Write one frame made of `parts` in a single write, so that frames pushed
/// from several threads never interleave.
pub(super) fn write_frame(w: &mut impl Write, op: u8, parts: &[&[u8]]) -> io::Result<()> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let len32 = u32::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut buf = Vec::with_capacity(5 + len);
    buf.push(op);
    buf.extend_from_slice(&len32.to_le_bytes());
    for p in parts {
        buf.extend_from_slice(p);
    }
    w.write_all(&buf)?;
    w.flush()
}

/// The little-endian integer of `N` bytes at `at`; the callers checked the
/// length, and a short slice reads as zeros rather than panicking.
fn le_at<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b.get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .unwrap_or([0; N])
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(le_at(b, at))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(le_at(b, at))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(le_at(b, at))
}

/// The largest char boundary of `s` at or below `at`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
pub(super) fn clip(s: &str, max: usize) -> &str {
    &s[..floor_char_boundary(s, max)]
}

/// Cut a reason to the wire limit on a character boundary.
pub(super) fn clip_reason(reason: &str) -> &str {
    clip(reason, MAX_REASON_LEN)
}

pub(super) fn failure_payload(report: &FailureReport) -> Vec<u8> {
    let mut p = Vec::with_capacity(64 + report.reason.len());
    p.extend_from_slice(&(report.rank as u32).to_le_bytes());
    match &report.mismatch {
        None => match report.comm {
            None => p.push(REPORT_FAILED),
            Some(comm) => {
                p.push(REPORT_FAILED_IN);
                p.extend_from_slice(&comm.to_le_bytes());
            }
        },
        Some(m) => {
            p.push(if m.refused {
                REPORT_REFUSED
            } else {
                REPORT_MISMATCH
            });
            p.extend_from_slice(&m.comm_id.to_le_bytes());
            p.extend_from_slice(&m.seq.to_le_bytes());
            p.extend_from_slice(&(m.peer as u32).to_le_bytes());
            for call in [&m.local, &m.remote] {
                let call = clip(call, MAX_CALL_LEN);
                p.extend_from_slice(&(call.len() as u16).to_le_bytes());
                p.extend_from_slice(call.as_bytes());
            }
        }
    }
    p.extend_from_slice(clip_reason(&report.reason).as_bytes());
    p
}

/// Take a `u16`-length-prefixed string of at most [`MAX_CALL_LEN`] bytes off
/// the front of `p`.
fn take_call(p: &mut &[u8]) -> Option<String> {
    let len = usize::from(u16_at(p, 0));
    if p.len() < 2 + len || len > MAX_CALL_LEN {
        return None;
    }
    let call = String::from_utf8_lossy(&p[2..2 + len]).into_owned();
    *p = &p[2 + len..];
    Some(call)
}

pub(super) fn parse_failure(p: &[u8]) -> Option<FailureReport> {
    if p.len() < 5 {
        return None;
    }
    let rank = u32_at(p, 0) as usize;
    let mut comm = None;
    let (mismatch, reason) = match p[4] {
        REPORT_FAILED => (None, &p[5..]),
        REPORT_FAILED_IN => {
            if p.len() < 5 + 8 {
                return None;
            }
            comm = Some(u64_at(p, 5));
            (None, &p[13..])
        }
        kind @ (REPORT_MISMATCH | REPORT_REFUSED) => {
            if p.len() < 5 + 8 + 8 + 4 {
                return None;
            }
            let mut rest = &p[25..];
            let local = take_call(&mut rest)?;
            let remote = take_call(&mut rest)?;
            let m = MismatchReport {
                comm_id: u64_at(p, 5),
                seq: u64_at(p, 13),
                peer: u32_at(p, 21) as usize,
                local,
                remote,
                refused: kind == REPORT_REFUSED,
            };
            (Some(m), rest)
        }
        _ => return None,
    };
    if reason.len() > MAX_REASON_LEN {
        return None;
    }
    Some(FailureReport {
        rank,
        reason: String::from_utf8_lossy(reason).into_owned(),
        comm,
        mismatch,
    })
}

/// The parsed HELLO of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) version: u16,
    pub(super) kind: u8,
    pub(super) rank: usize,
    pub(super) token: u64,
    /// The client's heartbeat interval (`None`: it sends none).
    pub(super) heartbeat: Heartbeat,
}

pub(super) fn hello_payload(kind: u8, rank: usize, token: u64, heartbeat: Heartbeat) -> Vec<u8> {
    let mut hello = Vec::with_capacity(HELLO_LEN);
    hello.extend_from_slice(&MAGIC.to_le_bytes());
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.push(kind);
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&token.to_le_bytes());
    let ms = heartbeat.map_or(0, |h| h.as_millis().clamp(1, u32::MAX as u128) as u32);
    hello.extend_from_slice(&ms.to_le_bytes());
    hello
}

/// Parse a hello's payload. Only its shape is checked here; token, version,
/// kind and rank are judged by the server. A hello of another version is
/// parsed as far as its version, so that the refusal can name it.
pub(super) fn parse_hello(p: &[u8]) -> Option<Hello> {
    if p.len() < 6 || u32_at(p, 0) != MAGIC {
        return None;
    }
    let version = u16_at(p, 4);
    if version != VERSION {
        return Some(Hello {
            version,
            kind: 0,
            rank: 0,
            token: 0,
            heartbeat: None,
        });
    }
    if p.len() != HELLO_LEN {
        return None;
    }
    let ms = u32_at(p, 19);
    Some(Hello {
        version,
        kind: p[6],
        rank: u32_at(p, 7) as usize,
        token: u64_at(p, 11),
        heartbeat: (ms > 0).then(|| {
            Duration::from_millis(u64::from(ms)).clamp(HEARTBEAT_RANGE.0, HEARTBEAT_RANGE.1)
        }),
    })
}

/// A key as SET and GET carry it: UTF-8 of at most [`MAX_KEY_LEN`] bytes.
fn parse_key(b: &[u8]) -> Option<&str> {
    if b.len() > MAX_KEY_LEN {
        return None;
    }
    std::str::from_utf8(b).ok()
}

/// (key, value) of a SET payload.
pub(super) fn parse_set(p: &[u8]) -> Option<(&str, &[u8])> {
    if p.len() < 4 {
        return None;
    }
    let key_len = u32_at(p, 0) as usize;
    if p.len() - 4 < key_len || p.len() - 4 - key_len > MAX_VALUE_LEN {
        return None;
    }
    let key = parse_key(&p[4..4 + key_len])?;
    Some((key, &p[4 + key_len..]))
}

/// (wait, key) of a GET payload.
pub(super) fn parse_get(p: &[u8]) -> Option<(Duration, &str)> {
    if p.len() < 8 {
        return None;
    }
    Some((Duration::from_millis(u64_at(p, 0)), parse_key(&p[8..])?))
}

/// The payload of a RELEASE: one of `parties` users is done with `scope`.
pub(super) fn release_payload(parties: usize, scope: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(4 + scope.len());
    p.extend_from_slice(&(parties.min(u32::MAX as usize) as u32).to_le_bytes());
    p.extend_from_slice(scope.as_bytes());
    p
}

/// (parties, scope) of a RELEASE; parties is at least 1.
pub(super) fn parse_release(p: &[u8]) -> Option<(usize, &str)> {
    if p.len() < 4 {
        return None;
    }
    let parties = u32_at(p, 0) as usize;
    (parties >= 1).then_some(())?;
    Some((parties, parse_key(&p[4..])?))
}

/// The payload of an ASK (and of the server's pushed copy of it).
pub(super) fn ask_payload(comm_id: u64, question: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(ASK_LEN);
    p.extend_from_slice(&comm_id.to_le_bytes());
    p.extend_from_slice(&question.to_le_bytes());
    p
}

/// (communicator, question id) of an ASK.
pub(super) fn parse_ask(p: &[u8]) -> Option<(u64, u64)> {
    (p.len() == ASK_LEN).then(|| (u64_at(p, 0), u64_at(p, 8)))
}

/// One answer to a progress question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProgressAnswer {
    pub(super) comm_id: u64,
    pub(super) question: u64,
    pub(super) rank: usize,
    pub(super) issued: u64,
}

pub(super) fn progress_payload(a: &ProgressAnswer) -> Vec<u8> {
    let mut p = Vec::with_capacity(PROGRESS_LEN);
    p.extend_from_slice(&a.comm_id.to_le_bytes());
    p.extend_from_slice(&a.question.to_le_bytes());
    p.extend_from_slice(&(a.rank as u32).to_le_bytes());
    p.extend_from_slice(&a.issued.to_le_bytes());
    p
}

pub(super) fn parse_progress(p: &[u8]) -> Option<ProgressAnswer> {
    (p.len() == PROGRESS_LEN).then(|| ProgressAnswer {
        comm_id: u64_at(p, 0),
        question: u64_at(p, 8),
        rank: u32_at(p, 16) as usize,
        issued: u64_at(p, 20),
    })
}

/// Where the server keeps the answer of `rank` to question `question`.
pub(super) fn progress_key(comm_id: u64, question: u64, rank: usize) -> String {
    format!("ferroccl/progress/{comm_id:016x}/{question:016x}/{rank}")
}

/// Run every decoder of this protocol on `data`, as a frame stream in both
/// directions and as each payload, fed in pieces of varying size; returns
/// how many frames decoded. For the fuzz targets and property tests: any
/// input must come back as errors, never as a panic or an allocation larger
/// than the input (plus one read piece).
#[doc(hidden)]
pub fn fuzz_store_bytes(data: &[u8]) -> usize {
    /// Hands out `data` a few bytes at a time, then times out once, then
    /// the rest: exercises the resumable path.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
        timed_out: bool,
    }
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if !self.timed_out && self.data.len() > 3 {
                self.timed_out = true;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.data.len()).min(self.step.max(1));
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            self.step = self.step % 7 + 1;
            Ok(n)
        }
    }
    let mut frames = 0;
    for to_server in [true, false] {
        let mut reader = FrameReader::new(to_server);
        let mut src = Trickle {
            data,
            step: data.first().map_or(1, |b| usize::from(*b)),
            timed_out: false,
        };
        let mut stalls = 0;
        loop {
            match reader.poll(&mut src) {
                Ok(Some((op, p))) => {
                    frames += 1;
                    match op {
                        OP_HELLO => drop(parse_hello(&p)),
                        OP_SET => drop(parse_set(&p)),
                        OP_GET => drop(parse_get(&p)),
                        OP_REPORT | OP_FAILURE => drop(parse_failure(&p)),
                        OP_ASK | OP_ASKED => drop(parse_ask(&p)),
                        OP_PROGRESS => drop(parse_progress(&p)),
                        OP_RELEASE => drop(parse_release(&p)),
                        _ => {}
                    }
                }
                Ok(None) => {
                    stalls += 1;
                    if stalls > 2 {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    }
    // Every payload parser on the raw bytes too.
    let _ = (parse_hello(data), parse_set(data), parse_get(data));
    let _ = (parse_failure(data), parse_ask(data), parse_progress(data));
    let _ = parse_release(data);
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, OP_SET, &[&3u32.to_le_bytes(), b"key", b"value"]).unwrap();
        let (op, p) = read_frame(&mut buf.as_slice(), true).unwrap();
        assert_eq!(op, OP_SET);
        assert_eq!(&p[..4], &3u32.to_le_bytes());
        assert_eq!(&p[4..], b"keyvalue");
    }

    #[test]
    fn oversized_length_is_refused_before_allocating() {
        let mut buf = vec![OP_GET];
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        match read_frame(&mut buf.as_slice(), true) {
            Err(ReadError::Bad(msg)) => assert!(msg.contains("more than its limit"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_opcode_and_truncation() {
        let buf = [0x7fu8, 0, 0, 0, 0];
        assert!(
            matches!(read_frame(&mut &buf[..], true), Err(ReadError::Bad(m)) if m.contains("unknown opcode"))
        );
        let buf = [OP_SET, 10, 0, 0, 0, 1, 2];
        assert!(
            matches!(read_frame(&mut &buf[..], true), Err(ReadError::Bad(m)) if m.contains("truncated"))
        );
        let buf = [OP_SET, 10];
        assert!(
            matches!(read_frame(&mut &buf[..], true), Err(ReadError::Bad(m)) if m.contains("truncated"))
        );
        assert!(matches!(
            read_frame(&mut &[][..], true),
            Err(ReadError::Closed)
        ));
        // A server-to-client opcode is unknown in the other direction.
        let buf = [OP_VALUE, 0, 0, 0, 0];
        assert!(matches!(
            read_frame(&mut &buf[..], true),
            Err(ReadError::Bad(_))
        ));
    }

    #[test]
    fn reports_hellos_and_progress_round_trip() {
        let plain = FailureReport::failed(3, "gone");
        assert_eq!(parse_failure(&failure_payload(&plain)), Some(plain));
        let scoped = FailureReport::failed_in(0xfeed, 3, "aborted");
        assert_eq!(parse_failure(&failure_payload(&scoped)), Some(scoped));
        let mismatch = FailureReport {
            rank: 1,
            reason: "mismatch".into(),
            comm: None,
            mismatch: Some(MismatchReport {
                comm_id: 9,
                seq: 4,
                peer: 2,
                local: "all_reduce #4 (float, sum, 3 elements)".into(),
                remote: "x".repeat(MAX_CALL_LEN + 10),
                refused: false,
            }),
        };
        let back = parse_failure(&failure_payload(&mismatch)).expect("parses");
        let m = back.mismatch.as_ref().expect("a mismatch");
        assert_eq!(
            m.remote.len(),
            MAX_CALL_LEN,
            "calls are clipped on the wire"
        );
        assert_eq!((back.rank, m.comm_id, m.seq, m.peer), (1, 9, 4, 2));
        let hello = hello_payload(KIND_WATCH, 5, 77, Some(Duration::from_millis(250)));
        assert_eq!(
            parse_hello(&hello),
            Some(Hello {
                version: VERSION,
                kind: KIND_WATCH,
                rank: 5,
                token: 77,
                heartbeat: Some(Duration::from_millis(250)),
            })
        );
        let a = ProgressAnswer {
            comm_id: u64::MAX,
            question: 3,
            rank: 2,
            issued: 17,
        };
        assert_eq!(parse_progress(&progress_payload(&a)), Some(a));
        assert_eq!(parse_ask(&ask_payload(7, u64::MAX)), Some((7, u64::MAX)));
        assert_eq!(
            parse_release(&release_payload(3, "comm/00ab/")),
            Some((3, "comm/00ab/"))
        );
        // No parties, a short payload, a scope past the key limit: refused.
        assert_eq!(parse_release(&release_payload(0, "comm/")), None);
        assert_eq!(parse_release(&[1, 0]), None);
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert_eq!(parse_release(&release_payload(2, &long)), None);
    }

    #[test]
    fn a_read_timeout_keeps_the_partial_frame() {
        // The frame arrives in two parts with a timeout between them.
        struct TwoParts(Vec<Vec<u8>>, bool);
        impl Read for TwoParts {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                self.1 = !self.1;
                if self.1 {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                if self.0.is_empty() {
                    return Ok(0);
                }
                let n = buf.len().min(self.0[0].len());
                buf[..n].copy_from_slice(&self.0[0][..n]);
                self.0[0].drain(..n);
                if self.0[0].is_empty() {
                    self.0.remove(0);
                }
                Ok(n)
            }
        }
        let mut wire = Vec::new();
        write_frame(&mut wire, OP_SET, &[&3u32.to_le_bytes(), b"keyvalue"]).unwrap();
        let mut src = TwoParts(
            vec![wire[..3].to_vec(), wire[3..9].to_vec(), wire[9..].to_vec()],
            false,
        );
        let mut reader = FrameReader::new(true);
        let mut timeouts = 0;
        let frame = loop {
            match reader.poll(&mut src).unwrap() {
                Some(f) => break f,
                None => timeouts += 1,
            }
        };
        assert!(timeouts >= 2);
        assert_eq!(frame.0, OP_SET);
        assert_eq!(&frame.1[4..], b"keyvalue");
        assert!(matches!(reader.poll(&mut src), Ok(None)));
        assert!(matches!(reader.poll(&mut src), Err(ReadError::Closed)));
    }

    proptest::proptest! {
        /// Every decoder of the protocol on arbitrary bytes: errors, never
        /// a panic (the fuzz target `store_frames` runs the same function).
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let _ = fuzz_store_bytes(&bytes);
        }

        /// A valid frame followed by anything: the frame comes out whole.
        #[test]
        fn a_valid_frame_survives_any_tail(
            op in proptest::sample::select(vec![OP_SET, OP_GET, OP_REPORT, OP_HEARTBEAT, OP_ASK]),
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..16),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let payload = if max_payload(op, true) == Some(0) { Vec::new() } else { payload };
            let mut wire = Vec::new();
            write_frame(&mut wire, op, &[&payload]).unwrap();
            wire.extend_from_slice(&tail);
            let (got_op, got) = read_frame(&mut wire.as_slice(), true).unwrap();
            proptest::prop_assert_eq!(got_op, op);
            proptest::prop_assert_eq!(got, payload);
        }

        /// Reports survive the wire with any rank and reason.
        #[test]
        fn reports_round_trip(rank in 0u32..u32::MAX, reason in ".{0,40}", comm in proptest::prelude::any::<u64>(), mismatch in proptest::prelude::any::<bool>(), refused in proptest::prelude::any::<bool>(), scoped in proptest::prelude::any::<bool>()) {
            let report = FailureReport {
                rank: rank as usize,
                reason,
                comm: (scoped && !mismatch).then_some(comm ^ 1),
                mismatch: mismatch.then(|| MismatchReport {
                    comm_id: comm,
                    seq: comm / 3,
                    peer: 1,
                    local: "a".into(),
                    remote: "b".into(),
                    refused,
                }),
            };
            proptest::prop_assert_eq!(parse_failure(&failure_payload(&report)), Some(report));
        }
    }

    #[test]
    fn reasons_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(MAX_REASON_LEN);
        let clipped = clip_reason(&long);
        assert!(clipped.len() <= MAX_REASON_LEN);
        assert!(clipped.chars().all(|c| c == 'é'));
    }
}
