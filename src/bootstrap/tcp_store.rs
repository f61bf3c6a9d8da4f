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
//! payload, checked before anything is allocated; an unknown opcode, an
//! oversized length, a payload of the wrong shape or a truncated frame ends
//! the connection (with a WARN on the server).
//!
//! Client to server:
//!
//! | op   | name    | payload                                                    |
//! |------|---------|------------------------------------------------------------|
//! | 0x01 | HELLO   | magic `u32` (`"FCCL"`), version `u16`, kind `u8` (0 request, 1 watch), rank `u32`, token `u64` |
//! | 0x02 | SET     | key length `u32`, key, value (the rest; key ≤ 4 KiB, value ≤ 64 MiB) |
//! | 0x03 | GET     | wait in ms `u64`, key (the rest)                           |
//! | 0x04 | REPORT  | failed rank `u32`, reason (UTF-8, the rest, ≤ 64 KiB)     |
//! | 0x05 | GOODBYE | empty; only on a watch connection                          |
//!
//! Server to client:
//!
//! | op   | name    | payload                                              |
//! |------|---------|------------------------------------------------------|
//! | 0x81 | OK      | empty: hello accepted, SET or REPORT done            |
//! | 0x82 | VALUE   | the value asked for by GET                           |
//! | 0x83 | MISSING | empty: the key did not appear within the wait        |
//! | 0x84 | REFUSED | reason (UTF-8): wrong token, version or rank         |
//! | 0x85 | FAILURE | failed rank `u32`, reason (pushed on watch connections) |
//! | 0x86 | CLOSING | empty: the server is shutting down cleanly           |
//!
//! Each client process opens one *watch* connection, on which the server
//! pushes failure reports (first those made before it connected), and one or
//! more *request* connections (one per thread that uses the store at the same
//! time), each carrying one request and its answer at a time. A watch
//! connection that closes without GOODBYE makes the server report its rank
//! as failed to every other watcher.

use super::{lock, FailureBook, FailureReport, Store};
use crate::error::{Error, Result};
use crossbeam_channel::Receiver;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// The largest key, in bytes.
pub const MAX_KEY_LEN: usize = 4 << 10;
/// The largest value, in bytes.
pub const MAX_VALUE_LEN: usize = 64 << 20;
/// The largest failure reason carried on the wire; longer ones are cut.
const MAX_REASON_LEN: usize = 64 << 10;

const MAGIC: u32 = u32::from_be_bytes(*b"FCCL");
const VERSION: u16 = 1;
const HELLO_LEN: usize = 4 + 2 + 1 + 4 + 8;

const OP_HELLO: u8 = 0x01;
const OP_SET: u8 = 0x02;
const OP_GET: u8 = 0x03;
const OP_REPORT: u8 = 0x04;
const OP_GOODBYE: u8 = 0x05;
const OP_OK: u8 = 0x81;
const OP_VALUE: u8 = 0x82;
const OP_MISSING: u8 = 0x83;
const OP_REFUSED: u8 = 0x84;
const OP_FAILURE: u8 = 0x85;
const OP_CLOSING: u8 = 0x86;

const KIND_REQUEST: u8 = 0;
const KIND_WATCH: u8 = 1;

const DEFAULT_GRACE: Duration = Duration::from_secs(10);
const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A watcher that cannot take a push within this time is dropped.
const PUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Extra time a client gives the server to answer beyond the wait it asked.
const REPLY_SLACK: Duration = Duration::from_secs(30);

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
            OP_REPORT => Some(4 + MAX_REASON_LEN),
            OP_GOODBYE => Some(0),
            _ => None,
        }
    } else {
        match op {
            OP_OK | OP_MISSING | OP_CLOSING => Some(0),
            OP_VALUE => Some(MAX_VALUE_LEN),
            OP_REFUSED => Some(MAX_REASON_LEN),
            OP_FAILURE => Some(4 + MAX_REASON_LEN),
            _ => None,
        }
    }
}

/// Why a frame could not be read.
#[derive(Debug)]
enum ReadError {
    /// The peer closed the connection between frames.
    Closed,
    /// The socket failed (including read timeouts).
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

/// Read one frame, bounding its length by opcode before allocating.
fn read_frame(r: &mut impl Read, to_server: bool) -> std::result::Result<(u8, Vec<u8>), ReadError> {
    let mut header = [0u8; 5];
    let mut got = 0;
    while got < header.len() {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => {
                return Err(ReadError::Bad(format!(
                    "truncated frame header ({got} of 5 bytes)"
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let op = header[0];
    let len = u32::from_le_bytes([header[1], header[2], header[3], header[4]]) as usize;
    let Some(max) = max_payload(op, to_server) else {
        return Err(ReadError::Bad(format!("unknown opcode 0x{op:02x}")));
    };
    if len > max {
        return Err(ReadError::Bad(format!(
            "frame of opcode 0x{op:02x} claims {len} bytes, more than its limit of {max}"
        )));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ReadError::Bad(format!(
                "truncated frame: opcode 0x{op:02x} promised {len} bytes"
            ))
        } else {
            ReadError::Io(e)
        }
    })?;
    Ok((op, payload))
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

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Cut a reason to the wire limit on a character boundary.
fn clip_reason(reason: &str) -> &str {
    if reason.len() <= MAX_REASON_LEN {
        return reason;
    }
    &reason[..floor_char_boundary(reason, MAX_REASON_LEN)]
}

fn failure_payload(report: &FailureReport) -> Vec<u8> {
    let mut p = Vec::with_capacity(4 + report.reason.len());
    p.extend_from_slice(&(report.rank as u32).to_le_bytes());
    p.extend_from_slice(clip_reason(&report.reason).as_bytes());
    p
}

fn parse_failure(p: &[u8]) -> Option<FailureReport> {
    if p.len() < 4 {
        return None;
    }
    Some(FailureReport {
        rank: u32_at(p, 0) as usize,
        reason: String::from_utf8_lossy(&p[4..]).into_owned(),
    })
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
    /// Watch connections that have neither said goodbye nor gone: id to
    /// (rank, stream to push on).
    watchers: HashMap<u64, (usize, TcpStream)>,
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
                let ranks: Vec<usize> = book.watchers.values().map(|(r, _)| *r).collect();
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
        for (_, (_, mut stream)) in book.watchers.drain() {
            let _ = write_frame(&mut stream, OP_CLOSING, &[]);
            let _ = stream.shutdown(Shutdown::Both);
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

/// The parsed HELLO of a client.
struct Hello {
    kind: u8,
    rank: usize,
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
        KIND_WATCH => serve_watch(sh, stream, peer, id, hello.rank),
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
    if p.len() != HELLO_LEN || u32_at(p, 0) != MAGIC {
        warn!(%peer, "rendezvous: dropping a connection whose hello is not ferroccl's (bad magic or length)");
        return None;
    }
    let version = u16::from_le_bytes([p[4], p[5]]);
    let kind = p[6];
    let rank = u32_at(p, 7) as usize;
    let token = u64_at(p, 11);
    let refusal = if version != VERSION {
        Some(format!(
            "protocol version {version} is not supported (this server speaks version {VERSION}); \
             all ranks must run the same ferroccl"
        ))
    } else if token != sh.token {
        Some("wrong token".to_string())
    } else if kind != KIND_REQUEST && kind != KIND_WATCH {
        Some(format!("unknown connection kind {kind}"))
    } else if rank >= sh.world_size {
        Some(format!(
            "rank {rank} is not below the world size {}",
            sh.world_size
        ))
    } else {
        None
    };
    if let Some(reason) = refusal {
        warn!(%peer, rank, "rendezvous: refusing a connection: {reason}");
        let _ = write_frame(stream, OP_REFUSED, &[reason.as_bytes()]);
        return None;
    }
    Some(Hello { kind, rank })
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

fn handle_set(sh: &ServerShared, p: &[u8]) -> Option<(u8, Vec<u8>)> {
    if p.len() < 4 {
        return None;
    }
    let key_len = u32_at(p, 0) as usize;
    if key_len > MAX_KEY_LEN || p.len() - 4 < key_len || p.len() - 4 - key_len > MAX_VALUE_LEN {
        return None;
    }
    let key = std::str::from_utf8(&p[4..4 + key_len]).ok()?;
    lock(&sh.values).insert(key.to_string(), p[4 + key_len..].to_vec());
    sh.value_set.notify_all();
    Some((OP_OK, Vec::new()))
}

fn handle_get(sh: &ServerShared, p: &[u8]) -> Option<(u8, Vec<u8>)> {
    if p.len() < 8 {
        return None;
    }
    let wait = Duration::from_millis(u64_at(p, 0));
    let key = std::str::from_utf8(&p[8..]).ok()?;
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

/// Record a report and push it to every watcher; a watcher that cannot take
/// it is cut off (and will be reported lost in turn).
fn broadcast_failure(sh: &ServerShared, report: FailureReport) {
    let payload = failure_payload(&report);
    let mut book = lock(&sh.book);
    book.reports.push(report);
    for (rank, stream) in book.watchers.values_mut() {
        if let Err(e) = write_frame(stream, OP_FAILURE, &[&payload]) {
            warn!("rendezvous: cannot push a failure report to rank {rank}: {e}");
            // Its watch thread sees the shutdown, removes it and reports it.
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn serve_watch(sh: &ServerShared, mut stream: TcpStream, peer: SocketAddr, id: u64, rank: usize) {
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
        book.watchers.insert(id, (rank, push));
    }
    debug!(%peer, rank, "rank connected to the rendezvous");
    let said_goodbye = match read_frame(&mut stream, true) {
        Ok((OP_GOODBYE, _)) => true,
        Ok((op, _)) => {
            warn!(%peer, rank, "rendezvous: unexpected opcode 0x{op:02x} on a watch connection");
            false
        }
        Err(ReadError::Closed) => false,
        Err(e) => {
            if !sh.stopping.load(Ordering::SeqCst) {
                debug!(%peer, rank, "watch connection ended: {e}");
            }
            false
        }
    };
    let was_watching = {
        let mut book = lock(&sh.book);
        let was = book.watchers.remove(&id).is_some();
        sh.watchers_changed.notify_all();
        was
    };
    let _ = stream.shutdown(Shutdown::Both);
    if said_goodbye {
        debug!(%peer, rank, "rank left the rendezvous cleanly");
    } else if was_watching && !sh.stopping.load(Ordering::SeqCst) {
        warn!(%peer, rank, "rendezvous: rank {rank} {LOST_REASON}");
        broadcast_failure(
            sh,
            FailureReport {
                rank,
                reason: LOST_REASON.to_string(),
            },
        );
    }
}

// ---------------------------------------------------------------- client

/// A client of a [`TcpStoreServer`]: the [`Store`] of one rank of a real job.
///
/// Store calls may come from several threads at once: each concurrent call
/// gets a request connection of its own (kept for reuse). A background thread
/// reads failure reports from the watch connection.
#[derive(Debug)]
pub struct TcpStore {
    addr: SocketAddr,
    token: u64,
    rank: usize,
    /// Idle request connections.
    pool: Mutex<Vec<TcpStream>>,
    /// The watch connection (for GOODBYE and for closing).
    watch: TcpStream,
    book: Arc<Mutex<FailureBook>>,
    /// Set before a planned close of the watch connection, so that its
    /// reader does not take it for the server's death.
    leaving: Arc<AtomicBool>,
    reader: Option<JoinHandle<()>>,
}

impl TcpStore {
    /// Connect rank `rank` to the rendezvous at `addr` with the job's
    /// `token`, retrying while the server is not up yet, until `deadline`.
    pub fn connect(
        addr: SocketAddr,
        token: u64,
        rank: usize,
        deadline: Instant,
    ) -> Result<TcpStore> {
        let watch = open(addr, token, rank, KIND_WATCH, deadline, true)?;
        let request = open(addr, token, rank, KIND_REQUEST, deadline, true)?;
        let book = Arc::new(Mutex::new(FailureBook::default()));
        let leaving = Arc::new(AtomicBool::new(false));
        let mut reader_stream = watch.try_clone()?;
        let (b, l) = (book.clone(), leaving.clone());
        let reader = std::thread::Builder::new()
            .name(format!("ferroccl-store-watch-{rank}"))
            .spawn(move || read_watch(&mut reader_stream, &b, &l, addr))
            .map_err(|e| {
                let _ = watch.shutdown(Shutdown::Both);
                Error::Io(format!("cannot start the rendezvous watch thread: {e}"))
            })?;
        // The watch connection is only written by goodbye; no timeout needed
        // beyond a short one so that goodbye never blocks.
        let _ = watch.set_write_timeout(Some(PUSH_TIMEOUT));
        Ok(TcpStore {
            addr,
            token,
            rank,
            pool: Mutex::new(vec![request]),
            watch,
            book,
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

    /// Send one request and read its answer on a request connection of this
    /// thread's own, waiting at most `wait` (plus slack) for the answer.
    fn request(
        &self,
        op: u8,
        parts: &[&[u8]],
        wait: Duration,
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
                Instant::now() + Duration::from_secs(10),
                false,
            )?,
        };
        let lost = |e: &dyn std::fmt::Display| {
            Error::Bootstrap(format!(
                "lost the connection to the rendezvous at {} during {what}: {e}",
                self.addr
            ))
        };
        write_frame(&mut conn, op, parts).map_err(|e| lost(&e))?;
        conn.set_read_timeout(Some(wait.saturating_add(REPLY_SLACK)))
            .map_err(|e| lost(&e))?;
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
    let mut hello = Vec::with_capacity(HELLO_LEN);
    hello.extend_from_slice(&MAGIC.to_le_bytes());
    hello.extend_from_slice(&VERSION.to_le_bytes());
    hello.push(kind);
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&token.to_le_bytes());
    write_frame(&mut stream, OP_HELLO, &[&hello]).map_err(|e| fail(&e))?;
    let left = deadline.saturating_duration_since(Instant::now());
    stream
        .set_read_timeout(Some(left.max(Duration::from_secs(2))))
        .map_err(|e| fail(&e))?;
    match read_frame(&mut stream, false) {
        Ok((OP_OK, _)) => {
            let _ = stream.set_read_timeout(None);
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

/// The watch thread: pass failure reports to the book until the connection
/// ends; an end that was neither planned nor announced means rank 0 is gone.
fn read_watch(
    stream: &mut TcpStream,
    book: &Mutex<FailureBook>,
    leaving: &AtomicBool,
    addr: SocketAddr,
) {
    loop {
        match read_frame(stream, false) {
            Ok((OP_FAILURE, p)) => match parse_failure(&p) {
                Some(report) => lock(book).publish(report),
                None => {
                    warn!(%addr, "rendezvous sent a malformed failure report");
                    break;
                }
            },
            Ok((OP_CLOSING, _)) => {
                debug!(%addr, "rendezvous closing cleanly");
                return;
            }
            Ok((op, _)) => {
                warn!(%addr, "rendezvous sent unexpected opcode 0x{op:02x} on the watch connection");
                break;
            }
            Err(e) => {
                if !leaving.load(Ordering::SeqCst) {
                    debug!(%addr, "watch connection ended: {e}");
                }
                break;
            }
        }
    }
    if !leaving.load(Ordering::SeqCst) {
        lock(book).publish(FailureReport {
            rank: 0,
            reason: HOST_GONE_REASON.to_string(),
        });
    }
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
            Duration::ZERO,
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
        match self.request(OP_GET, &[&wait_ms, key.as_bytes()], wait, &what)? {
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

    fn report_failure(&self, rank: usize, reason: &str) {
        let report = FailureReport {
            rank,
            reason: clip_reason(reason).to_string(),
        };
        let what = format!("report of rank {rank}'s failure");
        let sent = self.request(
            OP_REPORT,
            &[&failure_payload(&report)],
            Duration::ZERO,
            &what,
        );
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
        let _ = write_frame(&mut &self.watch, OP_GOODBYE, &[]);
        let _ = self.watch.shutdown(Shutdown::Write);
    }
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
        let _ = self.watch.shutdown(Shutdown::Both);
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
    fn reasons_are_clipped_on_a_char_boundary() {
        let long = "é".repeat(MAX_REASON_LEN);
        let clipped = clip_reason(&long);
        assert!(clipped.len() <= MAX_REASON_LEN);
        assert!(clipped.chars().all(|c| c == 'é'));
    }
}
