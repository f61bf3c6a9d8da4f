//! The rendezvous server ([`TcpStoreServer`], run by rank 0): holds the
//! keys, answers GET and SET, spreads failure reports and progress
//! questions to every watch connection, beats to them and reports the rank
//! of a watch connection that closes or falls silent.
//!
//! It must not use the client: what both ends agree on is in [`super::wire`]
//! (the protocol) or in the parent module (the heartbeat rule).

use super::wire::{
    failure_payload, parse_ask, parse_failure, parse_get, parse_hello, parse_progress,
    parse_release, parse_set, progress_key, read_frame, write_frame, FrameReader, Hello, ReadError,
    KIND_REQUEST, KIND_WATCH, OP_ASK, OP_ASKED, OP_BEAT, OP_CLOSING, OP_FAILURE, OP_GET,
    OP_GOODBYE, OP_HEARTBEAT, OP_HELLO, OP_MISSING, OP_OK, OP_PROGRESS, OP_REFUSED, OP_RELEASE,
    OP_REPORT, OP_SET, OP_VALUE, VERSION,
};
use super::{Due, Pulse, PUSH_TIMEOUT};
use crate::bootstrap::{lock, FailureReport, KeyBook};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

const DEFAULT_GRACE: Duration = Duration::from_secs(10);
const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The reason the server gives for a rank whose watch connection closed.
const LOST_REASON: &str = "lost its rendezvous connection (process died or was killed)";

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
    values: Mutex<KeyBook>,
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
            values: Mutex::new(KeyBook::default()),
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

    /// (keys held, scopes released by some but not all of their users):
    /// what the rendezvous keeps, for tests that it keeps only what live
    /// communicators need.
    pub fn held(&self) -> (usize, usize) {
        lock(&self.shared.values).sizes()
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
            OP_RELEASE => parse_release(&p).map(|(parties, scope)| {
                let removed = lock(&sh.values).release(scope, parties);
                if removed > 0 {
                    debug!(scope, removed, "rendezvous: every user released a scope");
                }
                (OP_OK, Vec::new())
            }),
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
    lock(&sh.values).set(key, value);
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
    for w in push_order(&mut book.watchers) {
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

/// The watchers in the order a frame goes to them: by rank, highest first,
/// so that rank 0, the process this server runs in, hears last. A failure
/// report ends that process at once where its rank gives up on it (the
/// launchers' and the tools' way: print, exit); had it heard first, the
/// others' next read could be the end of the connection instead of the
/// report that explains it, and they would blame rank 0 (docs/reliability.md;
/// the host also lingers after such news: `comm::failure`).
fn push_order(watchers: &mut HashMap<u64, Watcher>) -> Vec<&mut Watcher> {
    let mut order: Vec<&mut Watcher> = watchers.values_mut().collect();
    order.sort_by_key(|w| std::cmp::Reverse(w.rank));
    order
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
    let mut pulse = Pulse::new();
    let end = loop {
        match reader.poll(&mut stream) {
            Ok(Some((OP_GOODBYE, _))) => break WatchEnd::Goodbye,
            Ok(Some((OP_HEARTBEAT, _))) => pulse.heard(),
            Ok(Some((OP_PROGRESS, p))) => {
                pulse.heard();
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
            match pulse.check(h) {
                Due::Nothing => {}
                Due::Dead(silent) => break WatchEnd::Silent(silent),
                Due::Beat => {
                    let mut book = lock(&sh.book);
                    if let Some(w) = book.watchers.get_mut(&id) {
                        if write_frame(&mut w.push, OP_BEAT, &[]).is_err() {
                            let _ = w.push.shutdown(Shutdown::Both);
                        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Frames go to rank 0, the server's own process, after every other
    /// watcher, whatever the map's order (ids taken so that the map's
    /// iteration differs from rank order, several watchers of one rank).
    #[test]
    fn rank_zero_hears_last() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut watchers = HashMap::new();
        let mut kept = Vec::new();
        for (id, rank) in [(7u64, 0usize), (3, 2), (11, 1), (1, 3), (5, 0), (9, 2)] {
            kept.push(TcpStream::connect(addr).unwrap());
            let (push, _) = listener.accept().unwrap();
            watchers.insert(id, Watcher { rank, push });
        }
        let ranks: Vec<usize> = push_order(&mut watchers).iter().map(|w| w.rank).collect();
        assert_eq!(ranks.len(), 6);
        assert!(ranks.windows(2).all(|p| p[0] >= p[1]), "{ranks:?}");
        assert_eq!(&ranks[4..], &[0, 0], "{ranks:?}");
    }
}
