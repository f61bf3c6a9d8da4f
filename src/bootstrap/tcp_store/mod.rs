//! The rendezvous of a real job: a key-value server (run by rank 0) and its
//! clients, over TCP, plus the failure broadcast.
//!
//! This module owns the rendezvous sockets and their wire format; it never
//! carries collective data.
//!
//! # Wire format
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
//! | 0x01 | HELLO     | magic `u32` (`"FCCL"`), version `u16` (2), kind `u8` (0 request, 1 watch), rank `u32`, token `u64`, heartbeat interval in ms `u32` (0: none) |
//! | 0x02 | SET       | key length `u32`, key, value (the rest; key ≤ 4 KiB, value ≤ 64 MiB) |
//! | 0x03 | GET       | wait in ms `u64`, key (the rest)                           |
//! | 0x04 | REPORT    | a failure report (below)                                   |
//! | 0x05 | GOODBYE   | empty; only on a watch connection                          |
//! | 0x06 | HEARTBEAT | empty; only on a watch connection                          |
//! | 0x07 | ASK       | communicator `u64`, question id `u64`: how far are its members? |
//! | 0x08 | PROGRESS  | communicator `u64`, question id `u64`, rank `u32`, last issued call `u64`; only on a watch connection |
//!
//! Server to client:
//!
//! | op   | name    | payload                                              |
//! |------|---------|------------------------------------------------------|
//! | 0x81 | OK      | empty: hello accepted, SET, REPORT or ASK done       |
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
//!
//! Each client process opens one *watch* connection, on which the server
//! pushes failure reports (first those made before it connected), and one or
//! more *request* connections (one per thread that uses the store at the same
//! time), each carrying one request and its answer at a time. A watch
//! connection that closes without GOODBYE makes the server report its rank
//! as failed to every other watcher.
//!
//! # Heartbeats
//!
//! A client that announces a heartbeat interval `h` in its hello sends
//! HEARTBEAT on its watch connection every `h`, from the watch thread (which
//! never waits on the communicator), and the server sends BEAT back at the
//! same pace. A side that hears nothing at all from the other for
//! [`MISSED_HEARTBEATS`] intervals takes it for dead: the server reports the
//! rank failed to everyone (a stopped or frozen process sends nothing, but
//! its sockets stay open), and a client reports rank 0, the server's host,
//! to its own process.
//!
//! # Progress questions
//!
//! A rank whose collective timed out asks (ASK) how far the other members of
//! its communicator have come; the server pushes the question to every
//! watch connection, the watch thread of each process that holds a member
//! answers with PROGRESS, and the server stores each answer as the key
//! `ferroccl/progress/<comm>/<question>/<rank>`, which the asking rank reads
//! with GET. A member that has not issued the call everybody waits in is the
//! one to blame; the watch thread answers even while its process is busy in
//! user code.

use super::ProgressBook;
use super::{lock, FailureBook, FailureReport, Heartbeat, MismatchReport, Progress, Store};
use crate::error::{Error, Result};
use crossbeam_channel::Receiver;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// The largest key, in bytes.
pub const MAX_KEY_LEN: usize = 4 << 10;
/// The largest value, in bytes.
pub const MAX_VALUE_LEN: usize = 64 << 20;
/// The largest failure reason carried on the wire; longer ones are cut.
const MAX_REASON_LEN: usize = 64 << 10;
/// Heartbeat interval of [`TcpStore::connect`].
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// Intervals without a word after which a peer of the store is taken for
/// dead.
pub const MISSED_HEARTBEATS: u32 = 4;
/// Shortest and longest heartbeat intervals accepted from a hello.
const HEARTBEAT_RANGE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(3600));

const MAGIC: u32 = u32::from_be_bytes(*b"FCCL");
const VERSION: u16 = 2;
const HELLO_LEN: usize = 4 + 2 + 1 + 4 + 8 + 4;
/// The longest description of a call in a mismatch report.
const MAX_CALL_LEN: usize = 1 << 10;
/// The longest failure report without its reason (the mismatch part
/// included).
const REPORT_FIXED_LEN: usize = 4 + 1 + 8 + 8 + 4 + 2 * (2 + MAX_CALL_LEN);
const ASK_LEN: usize = 8 + 8;
const PROGRESS_LEN: usize = 8 + 8 + 4 + 8;

const OP_HELLO: u8 = 0x01;
const OP_SET: u8 = 0x02;
const OP_GET: u8 = 0x03;
const OP_REPORT: u8 = 0x04;
const OP_GOODBYE: u8 = 0x05;
const OP_HEARTBEAT: u8 = 0x06;
const OP_ASK: u8 = 0x07;
const OP_PROGRESS: u8 = 0x08;
const OP_OK: u8 = 0x81;
const OP_VALUE: u8 = 0x82;
const OP_MISSING: u8 = 0x83;
const OP_REFUSED: u8 = 0x84;
const OP_FAILURE: u8 = 0x85;
const OP_CLOSING: u8 = 0x86;
const OP_BEAT: u8 = 0x87;
const OP_ASKED: u8 = 0x88;

const KIND_REQUEST: u8 = 0;
const KIND_WATCH: u8 = 1;

const REPORT_FAILED: u8 = 0;
const REPORT_MISMATCH: u8 = 1;

const DEFAULT_GRACE: Duration = Duration::from_secs(10);
const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A watcher that cannot take a push within this time is dropped.
const PUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Extra time a client gives the server to answer beyond the wait it asked.
const REPLY_SLACK: Duration = Duration::from_secs(30);
/// How long a failure report or a progress question may wait for the
/// server's answer: the rank is failing already, and a server that does not
/// answer soon is itself stopped or gone.
const SHORT_REPLY: Duration = Duration::from_secs(3);
/// Memory read at a time from a payload, so that memory follows the bytes
/// that arrived rather than the length a frame claims.
const READ_PIECE: usize = 64 << 10;

/// The reason the server gives for a rank whose watch connection closed.
const LOST_REASON: &str = "lost its rendezvous connection (process died or was killed)";
/// The reason a client gives when its watch connection to the server drops.
pub(crate) const HOST_GONE_REASON: &str = "the rendezvous host (rank 0) went away";

/// The largest payload allowed for `op` in the given direction.
fn max_payload(op: u8, to_server: bool) -> Option<usize> {
    if to_server {
        match op {
            OP_HELLO => Some(HELLO_LEN),
            OP_SET => Some(4 + MAX_KEY_LEN + MAX_VALUE_LEN),
            OP_GET => Some(8 + MAX_KEY_LEN),
            OP_REPORT => Some(REPORT_FIXED_LEN + MAX_REASON_LEN),
            OP_GOODBYE | OP_HEARTBEAT => Some(0),
            OP_ASK => Some(ASK_LEN),
            OP_PROGRESS => Some(PROGRESS_LEN),
            _ => None,
        }
    } else {
        match op {
            OP_OK | OP_MISSING | OP_CLOSING | OP_BEAT => Some(0),
            OP_VALUE => Some(MAX_VALUE_LEN),
            OP_REFUSED => Some(MAX_REASON_LEN),
            OP_FAILURE => Some(REPORT_FIXED_LEN + MAX_REASON_LEN),
            OP_ASKED => Some(ASK_LEN),
            _ => None,
        }
    }
}

/// Why a frame could not be read.
#[derive(Debug)]
enum ReadError {
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
struct FrameReader {
    to_server: bool,
    header: [u8; 5],
    got: usize,
    /// (opcode, length) once the header is complete and checked.
    frame: Option<(u8, usize)>,
    payload: Vec<u8>,
}

impl FrameReader {
    fn new(to_server: bool) -> Self {
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
    fn poll(&mut self, r: &mut impl Read) -> std::result::Result<Option<(u8, Vec<u8>)>, ReadError> {
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
fn read_frame(r: &mut impl Read, to_server: bool) -> std::result::Result<(u8, Vec<u8>), ReadError> {
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
fn write_frame(w: &mut impl Write, op: u8, parts: &[&[u8]]) -> io::Result<()> {
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

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(le_at(b, at))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(le_at(b, at))
}

/// Cut a reason to the wire limit on a character boundary.
fn clip_reason(reason: &str) -> &str {
    if reason.len() <= MAX_REASON_LEN {
        return reason;
    }
    &reason[..floor_char_boundary(reason, MAX_REASON_LEN)]
}

fn failure_payload(report: &FailureReport) -> Vec<u8> {
    let mut p = Vec::with_capacity(64 + report.reason.len());
    p.extend_from_slice(&(report.rank as u32).to_le_bytes());
    match &report.mismatch {
        None => p.push(REPORT_FAILED),
        Some(m) => {
            p.push(REPORT_MISMATCH);
            p.extend_from_slice(&m.comm_id.to_le_bytes());
            p.extend_from_slice(&m.seq.to_le_bytes());
            p.extend_from_slice(&(m.peer as u32).to_le_bytes());
            for call in [&m.local, &m.remote] {
                let call = &call[..floor_char_boundary(call, MAX_CALL_LEN)];
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
    let len = usize::from(u16::from_le_bytes(le_at(p, 0)));
    if p.len() < 2 + len || len > MAX_CALL_LEN {
        return None;
    }
    let call = String::from_utf8_lossy(&p[2..2 + len]).into_owned();
    *p = &p[2 + len..];
    Some(call)
}

fn parse_failure(p: &[u8]) -> Option<FailureReport> {
    if p.len() < 5 {
        return None;
    }
    let rank = u32_at(p, 0) as usize;
    let (mismatch, reason) = match p[4] {
        REPORT_FAILED => (None, &p[5..]),
        REPORT_MISMATCH => {
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
        mismatch,
    })
}

/// The parsed HELLO of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hello {
    version: u16,
    kind: u8,
    rank: usize,
    token: u64,
    /// The client's heartbeat interval (`None`: it sends none).
    heartbeat: Heartbeat,
}

fn hello_payload(kind: u8, rank: usize, token: u64, heartbeat: Heartbeat) -> Vec<u8> {
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
fn parse_hello(p: &[u8]) -> Option<Hello> {
    if p.len() < 6 || u32_at(p, 0) != MAGIC {
        return None;
    }
    let version = u16::from_le_bytes([p[4], p[5]]);
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

/// (key, value) of a SET payload.
fn parse_set(p: &[u8]) -> Option<(&str, &[u8])> {
    if p.len() < 4 {
        return None;
    }
    let key_len = u32_at(p, 0) as usize;
    if key_len > MAX_KEY_LEN || p.len() - 4 < key_len || p.len() - 4 - key_len > MAX_VALUE_LEN {
        return None;
    }
    let key = std::str::from_utf8(&p[4..4 + key_len]).ok()?;
    Some((key, &p[4 + key_len..]))
}

/// (wait, key) of a GET payload.
fn parse_get(p: &[u8]) -> Option<(Duration, &str)> {
    if p.len() < 8 || p.len() - 8 > MAX_KEY_LEN {
        return None;
    }
    Some((
        Duration::from_millis(u64_at(p, 0)),
        std::str::from_utf8(&p[8..]).ok()?,
    ))
}

/// (communicator, question id) of an ASK.
fn parse_ask(p: &[u8]) -> Option<(u64, u64)> {
    (p.len() == ASK_LEN).then(|| (u64_at(p, 0), u64_at(p, 8)))
}

/// One answer to a progress question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProgressAnswer {
    comm_id: u64,
    question: u64,
    rank: usize,
    issued: u64,
}

fn progress_payload(a: &ProgressAnswer) -> Vec<u8> {
    let mut p = Vec::with_capacity(PROGRESS_LEN);
    p.extend_from_slice(&a.comm_id.to_le_bytes());
    p.extend_from_slice(&a.question.to_le_bytes());
    p.extend_from_slice(&(a.rank as u32).to_le_bytes());
    p.extend_from_slice(&a.issued.to_le_bytes());
    p
}

fn parse_progress(p: &[u8]) -> Option<ProgressAnswer> {
    (p.len() == PROGRESS_LEN).then(|| ProgressAnswer {
        comm_id: u64_at(p, 0),
        question: u64_at(p, 8),
        rank: u32_at(p, 16) as usize,
        issued: u64_at(p, 20),
    })
}

/// Where the server keeps the answer of `rank` to question `question`.
fn progress_key(comm_id: u64, question: u64, rank: usize) -> String {
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
    frames
}

/// A port on 127.0.0.1 that was free a moment ago (bind port 0, read the
/// port, close). For tests and the launcher; another process may take it in
/// between, so use it soon.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::Io(format!("cannot bind a free port on 127.0.0.1: {e}")))?;
    Ok(l.local_addr()?.port())
}

// ---------------------------------------------------------------- server

/// The rendezvous server: holds the keys and spreads failure reports.
///
/// Rank 0 usually runs it inside its own process. Dropping it (or calling
/// [`TcpStoreServer::shutdown`]) waits, at most a grace period, until every
/// client has said goodbye or gone, tells the rest that the server is closing
/// cleanly, and stops.
#[derive(Debug)]
pub struct TcpStoreServer {
    shared: Arc<ServerShared>,
    local_addr: SocketAddr,
    accept_thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct ServerShared {
    token: u64,
    world_size: usize,
    values: Mutex<HashMap<String, Vec<u8>>>,
    value_set: Condvar,
    book: Mutex<ServerBook>,
    watchers_changed: Condvar,
    stopping: AtomicBool,
    grace_ms: AtomicU64,
    hello_timeout_ms: AtomicU64,
    /// Every open connection, so that shutdown can close them.
    conns: Mutex<HashMap<u64, TcpStream>>,
    handlers: Mutex<Vec<JoinHandle<()>>>,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct ServerBook {
    reports: Vec<FailureReport>,
    /// Watch connections that have neither said goodbye nor gone, by id.
    watchers: HashMap<u64, Watcher>,
}

#[derive(Debug)]
struct Watcher {
    rank: usize,
    /// Where frames for it are pushed.
    push: TcpStream,
}

impl TcpStoreServer {
    /// Listen on `bind` for the ranks `0..world_size` of the job whose token
    /// is `token`, serving from background threads.
    pub fn start(bind: SocketAddr, token: u64, world_size: usize) -> Result<TcpStoreServer> {
        if world_size == 0 {
            return Err(Error::Bootstrap(
                "a rendezvous for 0 ranks makes no sense".into(),
            ));
        }
        // std sets SO_REUSEADDR on Unix listeners, so a port left in
        // TIME_WAIT by an earlier run can be bound again at once.
        let listener = TcpListener::bind(bind).map_err(|e| {
            if e.kind() == io::ErrorKind::AddrInUse {
                Error::Bootstrap(format!(
                    "cannot listen for the rendezvous on {bind}: the address is already in use \
                     (another job, or an earlier run that is still alive?); choose another \
                     MASTER_PORT"
                ))
            } else {
                Error::Bootstrap(format!("cannot listen for the rendezvous on {bind}: {e}"))
            }
        })?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(ServerShared {
            token,
            world_size,
            values: Mutex::new(HashMap::new()),
            value_set: Condvar::new(),
            book: Mutex::new(ServerBook::default()),
            watchers_changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            grace_ms: AtomicU64::new(DEFAULT_GRACE.as_millis() as u64),
            hello_timeout_ms: AtomicU64::new(DEFAULT_HELLO_TIMEOUT.as_millis() as u64),
            conns: Mutex::new(HashMap::new()),
            handlers: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
        });
        let s = shared.clone();
        let accept_thread = std::thread::Builder::new()
            .name("ferroccl-store-accept".into())
            .spawn(move || accept_loop(listener, s))?;
        debug!(%local_addr, world_size, "rendezvous server listening");
        Ok(TcpStoreServer {
            shared,
            local_addr,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address the server listens on (with the real port when bound to
    /// port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// How long shutdown waits for clients to say goodbye (default 10 s).
    pub fn set_shutdown_grace(&self, grace: Duration) {
        self.shared
            .grace_ms
            .store(grace.as_millis() as u64, Ordering::Relaxed);
    }

    /// How long a new connection may take to send its hello (default 10 s).
    pub fn set_hello_timeout(&self, timeout: Duration) {
        self.shared
            .hello_timeout_ms
            .store(timeout.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    /// Wait (at most the grace period) until every client has said goodbye
    /// or gone, tell the others that the server closes cleanly, and stop.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(accept_thread) = self.accept_thread.take() else {
            return;
        };
        let sh = &self.shared;
        let grace = Duration::from_millis(sh.grace_ms.load(Ordering::Relaxed));
        let until = Instant::now() + grace;
        let mut book = lock(&sh.book);
        while !book.watchers.is_empty() {
            let now = Instant::now();
            if now >= until {
                let ranks: Vec<usize> = book.watchers.values().map(|w| w.rank).collect();
                warn!(
                    ?ranks,
                    "rendezvous closing after {} ms although these ranks are still connected",
                    grace.as_millis()
                );
                break;
            }
            book = sh
                .watchers_changed
                .wait_timeout(book, until - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        // From here on a closing connection is our doing, not a failure.
        sh.stopping.store(true, Ordering::SeqCst);
        for (_, mut w) in book.watchers.drain() {
            let _ = write_frame(&mut w.push, OP_CLOSING, &[]);
            let _ = w.push.shutdown(Shutdown::Both);
        }
        drop(book);
        // Wake the accept loop with a connection of our own.
        let wake = match self.local_addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.local_addr.port())
            }
            IpAddr::V6(ip) if ip.is_unspecified() => {
                SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), self.local_addr.port())
            }
            _ => self.local_addr,
        };
        match TcpStream::connect_timeout(&wake, Duration::from_secs(1)) {
            Ok(_) => {
                let _ = accept_thread.join();
            }
            // Joining would wait for a connection that may never come; the
            // thread exits at the next one instead.
            Err(e) => warn!(%wake, "rendezvous: cannot wake the accept thread: {e}"),
        }
        for (_, stream) in lock(&sh.conns).drain() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        {
            // Take the lock so that no GET is between its check and its wait.
            let _values = lock(&sh.values);
            sh.value_set.notify_all();
        }
        let handlers = std::mem::take(&mut *lock(&sh.handlers));
        for h in handlers {
            let _ = h.join();
        }
        debug!(addr = %self.local_addr, "rendezvous server stopped");
    }
}

impl Drop for TcpStoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, sh: Arc<ServerShared>) {
    loop {
        let accepted = listener.accept();
        if sh.stopping.load(Ordering::SeqCst) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Typically EMFILE or ECONNABORTED: back off, keep serving.
                warn!("rendezvous: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
        match stream.try_clone() {
            Ok(c) => {
                lock(&sh.conns).insert(id, c);
            }
            Err(e) => {
                warn!(%peer, "rendezvous: dropping a connection: {e}");
                continue;
            }
        }
        let s = sh.clone();
        let spawned = std::thread::Builder::new()
            .name("ferroccl-store-conn".into())
            .spawn(move || {
                serve_connection(&s, stream, peer, id);
                lock(&s.conns).remove(&id);
            });
        let mut handlers = lock(&sh.handlers);
        handlers.retain(|h| !h.is_finished());
        match spawned {
            Ok(h) => handlers.push(h),
            Err(e) => {
                warn!(%peer, "rendezvous: cannot start a thread for a connection: {e}");
                if let Some(c) = lock(&sh.conns).remove(&id) {
                    let _ = c.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

fn serve_connection(sh: &ServerShared, mut stream: TcpStream, peer: SocketAddr, id: u64) {
    let _ = stream.set_nodelay(true);
    let hello_timeout = Duration::from_millis(sh.hello_timeout_ms.load(Ordering::Relaxed));
    let _ = stream.set_read_timeout(Some(hello_timeout));
    let hello = match read_frame(&mut stream, true) {
        Ok((OP_HELLO, p)) => p,
        Ok((op, _)) => {
            warn!(%peer, "rendezvous: dropping a connection that began with opcode 0x{op:02x} instead of a hello");
            return;
        }
        Err(ReadError::Closed) => return,
        Err(ReadError::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            warn!(%peer, "rendezvous: dropping a connection that sent no hello within {} ms", hello_timeout.as_millis());
            return;
        }
        Err(e) => {
            if !sh.stopping.load(Ordering::SeqCst) {
                warn!(%peer, "rendezvous: dropping a connection: {e}");
            }
            return;
        }
    };
    let Some(hello) = check_hello(sh, &mut stream, peer, &hello) else {
        return;
    };
    let _ = stream.set_read_timeout(None);
    if write_frame(&mut stream, OP_OK, &[]).is_err() {
        return;
    }
    match hello.kind {
        KIND_WATCH => serve_watch(sh, stream, peer, id, &hello),
        _ => serve_requests(sh, stream, peer, hello.rank),
    }
}

/// Check a hello's payload; answer REFUSED (and log) when it is not for us.
fn check_hello(
    sh: &ServerShared,
    stream: &mut TcpStream,
    peer: SocketAddr,
    p: &[u8],
) -> Option<Hello> {
    let Some(hello) = parse_hello(p) else {
        warn!(%peer, "rendezvous: dropping a connection whose hello is not ferroccl's (bad magic or length)");
        return None;
    };
    let refusal = if hello.version != VERSION {
        Some(format!(
            "protocol version {} is not supported (this server speaks version {VERSION}); \
             all ranks must run the same ferroccl",
            hello.version
        ))
    } else if hello.token != sh.token {
        Some("wrong token".to_string())
    } else if hello.kind != KIND_REQUEST && hello.kind != KIND_WATCH {
        Some(format!("unknown connection kind {}", hello.kind))
    } else if hello.rank >= sh.world_size {
        Some(format!(
            "rank {} is not below the world size {}",
            hello.rank, sh.world_size
        ))
    } else {
        None
    };
    if let Some(reason) = refusal {
        warn!(%peer, rank = hello.rank, "rendezvous: refusing a connection: {reason}");
        let _ = write_frame(stream, OP_REFUSED, &[reason.as_bytes()]);
        return None;
    }
    Some(hello)
}

fn serve_requests(sh: &ServerShared, mut stream: TcpStream, peer: SocketAddr, rank: usize) {
    loop {
        let (op, p) = match read_frame(&mut stream, true) {
            Ok(f) => f,
            Err(ReadError::Closed) => return,
            Err(e) => {
                if !sh.stopping.load(Ordering::SeqCst) {
                    warn!(%peer, rank, "rendezvous: dropping a request connection: {e}");
                }
                return;
            }
        };
        let reply = match op {
            OP_SET => handle_set(sh, &p),
            OP_GET => handle_get(sh, &p),
            OP_REPORT => parse_failure(&p).map(|report| {
                debug!(by = rank, failed = report.rank, reason = %report.reason, "failure reported");
                broadcast_failure(sh, report);
                (OP_OK, Vec::new())
            }),
            OP_ASK => parse_ask(&p).map(|_| {
                push_to_watchers(sh, OP_ASKED, &p);
                (OP_OK, Vec::new())
            }),
            _ => None,
        };
        let Some((rop, payload)) = reply else {
            warn!(%peer, rank, "rendezvous: dropping a request connection: malformed or unexpected frame (opcode 0x{op:02x}, {} bytes)", p.len());
            return;
        };
        if sh.stopping.load(Ordering::SeqCst) {
            return;
        }
        if write_frame(&mut stream, rop, &[&payload]).is_err() {
            return;
        }
    }
}

fn store_value(sh: &ServerShared, key: &str, value: &[u8]) {
    lock(&sh.values).insert(key.to_string(), value.to_vec());
    sh.value_set.notify_all();
}

fn handle_set(sh: &ServerShared, p: &[u8]) -> Option<(u8, Vec<u8>)> {
    let (key, value) = parse_set(p)?;
    store_value(sh, key, value);
    Some((OP_OK, Vec::new()))
}

fn handle_get(sh: &ServerShared, p: &[u8]) -> Option<(u8, Vec<u8>)> {
    let (wait, key) = parse_get(p)?;
    let until = Instant::now().checked_add(wait);
    let mut values = lock(&sh.values);
    loop {
        if let Some(v) = values.get(key) {
            return Some((OP_VALUE, v.clone()));
        }
        if sh.stopping.load(Ordering::SeqCst) {
            return Some((OP_MISSING, Vec::new()));
        }
        let now = Instant::now();
        let left = match until {
            Some(u) if u <= now => return Some((OP_MISSING, Vec::new())),
            Some(u) => u - now,
            None => Duration::from_secs(3600),
        };
        values = sh
            .value_set
            .wait_timeout(values, left)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// Push one frame to every watcher; a watcher that cannot take it is cut
/// off (and will be reported lost in turn). The caller holds no lock.
fn push_to_watchers(sh: &ServerShared, op: u8, payload: &[u8]) {
    let mut book = lock(&sh.book);
    push_locked(&mut book, op, payload);
}

fn push_locked(book: &mut ServerBook, op: u8, payload: &[u8]) {
    for w in book.watchers.values_mut() {
        if let Err(e) = write_frame(&mut w.push, op, &[payload]) {
            warn!(
                "rendezvous: cannot push opcode 0x{op:02x} to rank {}: {e}",
                w.rank
            );
            // Its watch thread sees the shutdown, removes it and reports it.
            let _ = w.push.shutdown(Shutdown::Both);
        }
    }
}

/// Record a report and push it to every watcher.
fn broadcast_failure(sh: &ServerShared, report: FailureReport) {
    let payload = failure_payload(&report);
    let mut book = lock(&sh.book);
    book.reports.push(report);
    push_locked(&mut book, OP_FAILURE, &payload);
}

/// How a watch connection ended.
enum WatchEnd {
    Goodbye,
    Lost,
    /// Nothing arrived for this long although heartbeats were promised.
    Silent(Duration),
    /// The client sent something that is not a watch frame.
    Garbage(String),
}

fn serve_watch(sh: &ServerShared, mut stream: TcpStream, peer: SocketAddr, id: u64, hello: &Hello) {
    let rank = hello.rank;
    let Ok(push) = stream.try_clone() else {
        return;
    };
    let _ = push.set_write_timeout(Some(PUSH_TIMEOUT));
    {
        let mut book = lock(&sh.book);
        if sh.stopping.load(Ordering::SeqCst) {
            return;
        }
        let mut push = push;
        for r in &book.reports {
            if write_frame(&mut push, OP_FAILURE, &[&failure_payload(r)]).is_err() {
                return;
            }
        }
        book.watchers.insert(id, Watcher { rank, push });
    }
    debug!(%peer, rank, heartbeat = ?hello.heartbeat, "rank connected to the rendezvous");
    // Wake up twice per interval: to beat, and to notice silence.
    let _ = stream.set_read_timeout(hello.heartbeat.map(|h| h / 2));
    let mut reader = FrameReader::new(true);
    let (mut heard, mut beat) = (Instant::now(), Instant::now());
    let end = loop {
        match reader.poll(&mut stream) {
            Ok(Some((OP_GOODBYE, _))) => break WatchEnd::Goodbye,
            Ok(Some((OP_HEARTBEAT, _))) => heard = Instant::now(),
            Ok(Some((OP_PROGRESS, p))) => {
                heard = Instant::now();
                match parse_progress(&p) {
                    Some(a) => store_value(
                        sh,
                        &progress_key(a.comm_id, a.question, a.rank),
                        &a.issued.to_le_bytes(),
                    ),
                    None => break WatchEnd::Garbage("a malformed progress answer".into()),
                }
            }
            Ok(Some((op, _))) => {
                break WatchEnd::Garbage(format!("unexpected opcode 0x{op:02x}"));
            }
            Ok(None) => {}
            Err(ReadError::Closed) => break WatchEnd::Lost,
            Err(e) => {
                if !sh.stopping.load(Ordering::SeqCst) {
                    debug!(%peer, rank, "watch connection ended: {e}");
                }
                break WatchEnd::Lost;
            }
        }
        if sh.stopping.load(Ordering::SeqCst) {
            break WatchEnd::Lost;
        }
        if let Some(h) = hello.heartbeat {
            let silent = heard.elapsed();
            if silent > h * MISSED_HEARTBEATS {
                break WatchEnd::Silent(silent);
            }
            if beat.elapsed() >= h {
                beat = Instant::now();
                let mut book = lock(&sh.book);
                if let Some(w) = book.watchers.get_mut(&id) {
                    if write_frame(&mut w.push, OP_BEAT, &[]).is_err() {
                        let _ = w.push.shutdown(Shutdown::Both);
                    }
                }
            }
        }
    };
    let was_watching = {
        let mut book = lock(&sh.book);
        let was = book.watchers.remove(&id).is_some();
        sh.watchers_changed.notify_all();
        was
    };
    let _ = stream.shutdown(Shutdown::Both);
    let reason = match end {
        WatchEnd::Goodbye => {
            debug!(%peer, rank, "rank left the rendezvous cleanly");
            return;
        }
        WatchEnd::Lost => LOST_REASON.to_string(),
        WatchEnd::Silent(d) => format!(
            "sent no heartbeat for {} ms (the process is stopped, frozen or cut off)",
            d.as_millis()
        ),
        WatchEnd::Garbage(what) => {
            warn!(%peer, rank, "rendezvous: {what} on a watch connection");
            format!("its rendezvous connection sent {what}")
        }
    };
    if was_watching && !sh.stopping.load(Ordering::SeqCst) {
        warn!(%peer, rank, "rendezvous: rank {rank} {reason}");
        broadcast_failure(sh, FailureReport::failed(rank, reason));
    }
}

// ---------------------------------------------------------------- client

/// A client of a [`TcpStoreServer`]: the [`Store`] of one rank of a real job.
///
/// Store calls may come from several threads at once: each concurrent call
/// gets a request connection of its own (kept for reuse). A background thread
/// reads failure reports from the watch connection, sends heartbeats on it
/// and answers progress questions.
#[derive(Debug)]
pub struct TcpStore {
    addr: SocketAddr,
    token: u64,
    rank: usize,
    heartbeat: Heartbeat,
    /// Idle request connections.
    pool: Mutex<Vec<TcpStream>>,
    /// The watch connection, for writing (goodbye, heartbeats, answers) and
    /// for closing; the lock keeps frames from several threads whole.
    watch: Arc<Mutex<TcpStream>>,
    book: Arc<Mutex<FailureBook>>,
    progress: Arc<Mutex<ProgressBook>>,
    /// Set before a planned close of the watch connection, so that its
    /// reader does not take it for the server's death.
    leaving: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl TcpStore {
    /// Connect rank `rank` to the rendezvous at `addr` with the job's
    /// `token`, retrying while the server is not up yet, until `deadline`;
    /// heartbeats every [`DEFAULT_HEARTBEAT`].
    pub fn connect(
        addr: SocketAddr,
        token: u64,
        rank: usize,
        deadline: Instant,
    ) -> Result<TcpStore> {
        Self::connect_with_heartbeat(addr, token, rank, deadline, Some(DEFAULT_HEARTBEAT))
    }

    /// [`TcpStore::connect`] with a heartbeat interval of this client's
    /// choice (`None`: no heartbeats; then a stopped process is only found
    /// out by the collectives' timeouts).
    pub fn connect_with_heartbeat(
        addr: SocketAddr,
        token: u64,
        rank: usize,
        deadline: Instant,
        heartbeat: Heartbeat,
    ) -> Result<TcpStore> {
        let heartbeat = heartbeat.map(|h| h.clamp(HEARTBEAT_RANGE.0, HEARTBEAT_RANGE.1));
        let watch = open(addr, token, rank, KIND_WATCH, heartbeat, deadline, true)?;
        let request = open(addr, token, rank, KIND_REQUEST, None, deadline, true)?;
        let book = Arc::new(Mutex::new(FailureBook::default()));
        let progress = Arc::new(Mutex::new(ProgressBook::default()));
        let leaving = Arc::new(AtomicBool::new(false));
        // Writes never block for long: a server that takes nothing for this
        // long is gone, and heartbeats or goodbye must not hang on it.
        let _ = watch.set_write_timeout(Some(PUSH_TIMEOUT));
        let _ = watch.set_read_timeout(heartbeat.map(|h| h / 2));
        let mut reader_stream = watch.try_clone()?;
        let watch = Arc::new(Mutex::new(watch));
        let ctx = WatchContext {
            book: book.clone(),
            progress: progress.clone(),
            writer: Arc::downgrade(&watch),
            leaving: leaving.clone(),
            addr,
            heartbeat,
        };
        let reader = std::thread::Builder::new()
            .name(format!("ferroccl-store-watch-{rank}"))
            .spawn(move || read_watch(&mut reader_stream, &ctx))
            .map_err(|e| {
                let _ = lock(&watch).shutdown(Shutdown::Both);
                Error::Io(format!("cannot start the rendezvous watch thread: {e}"))
            })?;
        Ok(TcpStore {
            addr,
            token,
            rank,
            heartbeat,
            pool: Mutex::new(vec![request]),
            watch,
            book,
            progress,
            leaving,
            reader: Some(reader),
        })
    }

    /// The server's address.
    pub fn server_addr(&self) -> SocketAddr {
        self.addr
    }

    /// This client's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// This client's heartbeat interval.
    pub fn heartbeat(&self) -> Heartbeat {
        self.heartbeat
    }

    /// Send one request and read its answer on a request connection of this
    /// thread's own, waiting at most `reply_within` for the answer.
    fn request(
        &self,
        op: u8,
        parts: &[&[u8]],
        reply_within: Duration,
        what: &str,
    ) -> Result<(u8, Vec<u8>)> {
        let pooled = lock(&self.pool).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => open(
                self.addr,
                self.token,
                self.rank,
                KIND_REQUEST,
                None,
                Instant::now() + reply_within.min(Duration::from_secs(10)),
                false,
            )?,
        };
        let lost = |e: &dyn std::fmt::Display| {
            Error::Bootstrap(format!(
                "lost the connection to the rendezvous at {} during {what}: {e}",
                self.addr
            ))
        };
        let _ = conn.set_write_timeout(Some(reply_within.max(Duration::from_millis(100))));
        write_frame(&mut conn, op, parts).map_err(|e| lost(&e))?;
        conn.set_read_timeout(Some(reply_within.max(Duration::from_millis(1))))
            .map_err(|e| lost(&e))?;
        // A connection whose answer did not come is dropped, not pooled: a
        // late answer would be taken for the next request's.
        let reply = read_frame(&mut conn, false).map_err(|e| lost(&e))?;
        lock(&self.pool).push(conn);
        Ok(reply)
    }
}

/// Open one connection of `kind` and exchange hellos. With `retry`, refused
/// connections are retried until `deadline` (the server may not be up yet).
fn open(
    addr: SocketAddr,
    token: u64,
    rank: usize,
    kind: u8,
    heartbeat: Heartbeat,
    deadline: Instant,
    retry: bool,
) -> Result<TcpStream> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(20);
    let mut stream = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(100)));
        match attempt {
            Ok(s) => break s,
            Err(e) => {
                let transient = matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                );
                if !retry || !transient || Instant::now() + pause >= deadline {
                    return Err(Error::Bootstrap(format!(
                        "could not reach the rendezvous at {addr} (rank {rank}) after waiting {} ms: {e}",
                        start.elapsed().as_millis()
                    )));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
            }
        }
    };
    let _ = stream.set_nodelay(true);
    let fail = |e: &dyn std::fmt::Display| {
        Error::Bootstrap(format!(
            "rendezvous at {addr}: hello of rank {rank} failed: {e}"
        ))
    };
    let hello = hello_payload(kind, rank, token, heartbeat);
    let _ = stream.set_write_timeout(Some(PUSH_TIMEOUT));
    write_frame(&mut stream, OP_HELLO, &[&hello]).map_err(|e| fail(&e))?;
    let left = deadline.saturating_duration_since(Instant::now());
    stream
        .set_read_timeout(Some(left.max(Duration::from_secs(2))))
        .map_err(|e| fail(&e))?;
    match read_frame(&mut stream, false) {
        Ok((OP_OK, _)) => {
            let _ = stream.set_read_timeout(None);
            let _ = stream.set_write_timeout(None);
            Ok(stream)
        }
        Ok((OP_REFUSED, reason)) => {
            let reason = String::from_utf8_lossy(&reason);
            if reason == "wrong token" {
                Err(Error::Bootstrap(format!(
                    "the rendezvous at {addr} refused rank {rank}: wrong job token (FERROCCL_TOKEN \
                     differs between ranks, or another job owns this address)"
                )))
            } else {
                Err(Error::Bootstrap(format!(
                    "the rendezvous at {addr} refused rank {rank}: {reason}"
                )))
            }
        }
        Ok((op, _)) => Err(fail(&format!("unexpected reply opcode 0x{op:02x}"))),
        Err(ReadError::Closed) => Err(fail(
            &"the server closed the connection (is this a ferroccl rendezvous?)",
        )),
        Err(e) => Err(fail(&e)),
    }
}

/// What the watch thread works with.
struct WatchContext {
    book: Arc<Mutex<FailureBook>>,
    progress: Arc<Mutex<ProgressBook>>,
    /// The write side of the watch connection (weak: the store owns it).
    writer: Weak<Mutex<TcpStream>>,
    leaving: Arc<AtomicBool>,
    addr: SocketAddr,
    heartbeat: Heartbeat,
}

impl WatchContext {
    /// Write one frame on the watch connection; false when it failed.
    fn send(&self, op: u8, payload: &[u8]) -> bool {
        match self.writer.upgrade() {
            Some(w) => write_frame(&mut *lock(&w), op, &[payload]).is_ok(),
            None => false,
        }
    }
}

/// The watch thread: pass failure reports to the book, beat, answer
/// progress questions, until the connection ends; an end that was neither
/// planned nor announced, or a server silent past its heartbeats, means
/// rank 0 is gone.
fn read_watch(stream: &mut TcpStream, ctx: &WatchContext) {
    let addr = ctx.addr;
    let leaving = || ctx.leaving.load(Ordering::SeqCst);
    let mut reader = FrameReader::new(false);
    let (mut heard, mut beat) = (Instant::now(), Instant::now());
    let lost = loop {
        match reader.poll(stream) {
            Ok(Some((OP_FAILURE, p))) => match parse_failure(&p) {
                Some(report) => {
                    heard = Instant::now();
                    lock(&ctx.book).publish(report);
                }
                None => {
                    warn!(%addr, "rendezvous sent a malformed failure report");
                    break HOST_GONE_REASON.to_string();
                }
            },
            Ok(Some((OP_BEAT, _))) => heard = Instant::now(),
            Ok(Some((OP_ASKED, p))) => {
                heard = Instant::now();
                let Some((comm_id, question)) = parse_ask(&p) else {
                    break HOST_GONE_REASON.to_string();
                };
                let answers = lock(&ctx.progress).answers(comm_id);
                for (rank, issued) in answers {
                    let a = ProgressAnswer {
                        comm_id,
                        question,
                        rank,
                        issued,
                    };
                    ctx.send(OP_PROGRESS, &progress_payload(&a));
                }
            }
            Ok(Some((OP_CLOSING, _))) => {
                debug!(%addr, "rendezvous closing cleanly");
                return;
            }
            Ok(Some((op, _))) => {
                warn!(%addr, "rendezvous sent unexpected opcode 0x{op:02x} on the watch connection");
                break HOST_GONE_REASON.to_string();
            }
            Ok(None) => {}
            Err(e) => {
                if !leaving() {
                    debug!(%addr, "watch connection ended: {e}");
                }
                break HOST_GONE_REASON.to_string();
            }
        }
        if leaving() {
            return;
        }
        if let Some(h) = ctx.heartbeat {
            let silent = heard.elapsed();
            if silent > h * MISSED_HEARTBEATS {
                break format!(
                    "the rendezvous host (rank 0) sent no heartbeat for {} ms (the process is \
                     stopped, frozen or cut off)",
                    silent.as_millis()
                );
            }
            if beat.elapsed() >= h {
                beat = Instant::now();
                if !ctx.send(OP_HEARTBEAT, &[]) && !leaving() {
                    debug!(%addr, "cannot send a heartbeat to the rendezvous");
                }
            }
        }
    };
    if !leaving() {
        let report = FailureReport::failed(0, lost);
        let mut book = lock(&ctx.book);
        if !book.contains(&report) {
            book.publish(report);
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        check_key(key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(Error::Bootstrap(format!(
                "value for key '{key}' is {} bytes, more than the limit of {MAX_VALUE_LEN}",
                value.len()
            )));
        }
        let key_len = (key.len() as u32).to_le_bytes();
        let what = format!("set of key '{key}'");
        match self.request(
            OP_SET,
            &[&key_len, key.as_bytes(), value],
            REPLY_SLACK,
            &what,
        )? {
            (OP_OK, _) => Ok(()),
            (op, _) => Err(Error::Bootstrap(format!(
                "rendezvous at {}: unexpected reply 0x{op:02x} to {what}",
                self.addr
            ))),
        }
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        check_key(key)?;
        let start = Instant::now();
        let wait = deadline.saturating_duration_since(start);
        let wait_ms = (wait.as_millis() as u64).to_le_bytes();
        let what = format!("get of key '{key}'");
        match self.request(
            OP_GET,
            &[&wait_ms, key.as_bytes()],
            wait.saturating_add(REPLY_SLACK),
            &what,
        )? {
            (OP_VALUE, v) => Ok(v),
            (OP_MISSING, _) => Err(Error::Bootstrap(format!(
                "timed out after {} ms waiting for key '{key}' (rendezvous at {})",
                start.elapsed().as_millis(),
                self.addr
            ))),
            (op, _) => Err(Error::Bootstrap(format!(
                "rendezvous at {}: unexpected reply 0x{op:02x} to {what}",
                self.addr
            ))),
        }
    }

    fn report(&self, report: FailureReport) {
        let report = FailureReport {
            reason: clip_reason(&report.reason).to_string(),
            ..report
        };
        let what = format!("report of rank {}'s failure", report.rank);
        let sent = self.request(OP_REPORT, &[&failure_payload(&report)], SHORT_REPLY, &what);
        if let Err(e) = sent {
            // The server is unreachable: at least this process hears of it.
            warn!("{e}");
            let mut book = lock(&self.book);
            if !book.contains(&report) {
                book.publish(report);
            }
        }
    }

    fn failures(&self) -> Receiver<FailureReport> {
        lock(&self.book).subscribe()
    }

    fn goodbye(&self) {
        if self.leaving.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut watch = lock(&self.watch);
        let _ = write_frame(&mut *watch, OP_GOODBYE, &[]);
        let _ = watch.shutdown(Shutdown::Write);
    }

    fn register_progress(&self, comm_id: u64, rank: usize, issued: Weak<AtomicU64>) {
        lock(&self.progress).register(comm_id, rank, issued);
    }

    fn ask_progress(&self, comm_id: u64, members: &[usize], deadline: Instant) -> Progress {
        let question = question_id(self.rank);
        let mut ask = Vec::with_capacity(ASK_LEN);
        ask.extend_from_slice(&comm_id.to_le_bytes());
        ask.extend_from_slice(&question.to_le_bytes());
        let wait = deadline.saturating_duration_since(Instant::now());
        let asked = self.request(
            OP_ASK,
            &[&ask],
            wait.min(SHORT_REPLY),
            "a progress question",
        );
        if let Err(e) = asked {
            debug!("{e}");
            return vec![None; members.len()];
        }
        members
            .iter()
            .map(|&m| {
                let v = self
                    .get(&progress_key(comm_id, question, m), deadline)
                    .ok()?;
                Some(u64::from_le_bytes(v.get(..8)?.try_into().ok()?))
            })
            .collect()
    }
}

/// A question id unlikely to be used twice in a job: the asking rank, the
/// clock and a counter.
fn question_id(rank: usize) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ ((rank as u64) << 48)).wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) << 32)
}

fn check_key(key: &str) -> Result<()> {
    if key.len() > MAX_KEY_LEN {
        return Err(Error::Bootstrap(format!(
            "key '{}...' is {} bytes, more than the limit of {MAX_KEY_LEN}",
            &key[..floor_char_boundary(key, 32)],
            key.len()
        )));
    }
    Ok(())
}

/// The largest char boundary of `s` at or below `at`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

impl Drop for TcpStore {
    fn drop(&mut self) {
        // Without goodbye this close tells the server that the rank is gone,
        // which is what a crash looks like.
        self.leaving.store(true, Ordering::SeqCst);
        let _ = lock(&self.watch).shutdown(Shutdown::Both);
        for c in lock(&self.pool).drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
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
        let mismatch = FailureReport {
            rank: 1,
            reason: "mismatch".into(),
            mismatch: Some(MismatchReport {
                comm_id: 9,
                seq: 4,
                peer: 2,
                local: "all_reduce #4 (float, sum, 3 elements)".into(),
                remote: "x".repeat(MAX_CALL_LEN + 10),
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
        fn reports_round_trip(rank in 0u32..u32::MAX, reason in ".{0,40}", comm in proptest::prelude::any::<u64>(), mismatch in proptest::prelude::any::<bool>()) {
            let report = FailureReport {
                rank: rank as usize,
                reason,
                mismatch: mismatch.then(|| MismatchReport {
                    comm_id: comm,
                    seq: comm / 3,
                    peer: 1,
                    local: "a".into(),
                    remote: "b".into(),
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
