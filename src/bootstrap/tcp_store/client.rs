//! The client of the rendezvous ([`TcpStore`]): the [`Store`] of one rank
//! of a real job. It connects with the job's token, runs GET and SET with
//! deadlines on request connections, and keeps one watch connection on
//! which a thread of its own hears failure reports, beats and answers
//! progress questions.
//!
//! It must not use the server: what both ends agree on is in [`super::wire`]
//! (the protocol) or in the parent module (the heartbeat rule).

use super::wire::{
    ask_payload, clip, clip_reason, failure_payload, hello_payload, parse_ask, parse_failure,
    progress_key, progress_payload, read_frame, release_payload, write_frame, FrameReader,
    ProgressAnswer, ReadError, HEARTBEAT_RANGE, KIND_REQUEST, KIND_WATCH, MAX_KEY_LEN,
    MAX_VALUE_LEN, OP_ASK, OP_ASKED, OP_BEAT, OP_CLOSING, OP_FAILURE, OP_GET, OP_GOODBYE,
    OP_HEARTBEAT, OP_HELLO, OP_MISSING, OP_OK, OP_PROGRESS, OP_REFUSED, OP_RELEASE, OP_REPORT,
    OP_SET, OP_VALUE,
};
use super::{Due, Pulse, PUSH_TIMEOUT};
use crate::bootstrap::{
    lock, FailureBook, FailureFeed, FailureReport, Heartbeat, Progress, ProgressBook, Store,
};
use crate::error::{Error, Result};
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Heartbeat interval of [`TcpStore::connect`].
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// Extra time a client gives the server to answer beyond the wait it asked.
const REPLY_SLACK: Duration = Duration::from_secs(30);
/// How long a failure report or a progress question may wait for the
/// server's answer: the rank is failing already, and a server that does not
/// answer soon is itself stopped or gone.
const SHORT_REPLY: Duration = Duration::from_secs(3);

/// The reason a client gives when its watch connection to the server drops.
pub(crate) const HOST_GONE_REASON: &str = "the rendezvous host (rank 0) went away";

/// A client of a [`TcpStoreServer`](super::TcpStoreServer): the [`Store`]
/// of one rank of a real job.
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
    let mut pulse = Pulse::new();
    let lost = loop {
        match reader.poll(stream) {
            Ok(Some((OP_FAILURE, p))) => match parse_failure(&p) {
                Some(report) => {
                    pulse.heard();
                    lock(&ctx.book).publish(report);
                }
                None => {
                    warn!(%addr, "rendezvous sent a malformed failure report");
                    break HOST_GONE_REASON.to_string();
                }
            },
            Ok(Some((OP_BEAT, _))) => pulse.heard(),
            Ok(Some((OP_ASKED, p))) => {
                pulse.heard();
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
            match pulse.check(h) {
                Due::Nothing => {}
                Due::Dead(silent) => {
                    break format!(
                        "the rendezvous host (rank 0) sent no heartbeat for {} ms (the process \
                         is stopped, frozen or cut off)",
                        silent.as_millis()
                    )
                }
                Due::Beat => {
                    if !ctx.send(OP_HEARTBEAT, &[]) && !leaving() {
                        debug!(%addr, "cannot send a heartbeat to the rendezvous");
                    }
                }
            }
        }
    };
    if !leaving() {
        publish_new(&ctx.book, FailureReport::failed(0, lost));
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Publish `report` unless this very report was published already (the
/// server's broadcast of it may have come first).
fn publish_new(book: &Mutex<FailureBook>, report: FailureReport) {
    let mut book = lock(book);
    if !book.contains(&report) {
        book.publish(report);
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
            publish_new(&self.book, report);
        }
    }

    fn failures(&self) -> FailureFeed {
        lock(&self.book).subscribe()
    }

    fn local_ip(&self) -> Option<std::net::IpAddr> {
        lock(&self.watch).local_addr().ok().map(|a| a.ip())
    }

    fn goodbye(&self) {
        if self.leaving.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut watch = lock(&self.watch);
        let _ = write_frame(&mut *watch, OP_GOODBYE, &[]);
        let _ = watch.shutdown(Shutdown::Write);
    }

    fn release(&self, scope: &str, parties: usize) {
        if check_key(scope).is_err() {
            return;
        }
        let what = format!("release of scope '{scope}'");
        let payload = release_payload(parties, scope);
        match self.request(OP_RELEASE, &[&payload], SHORT_REPLY, &what) {
            Ok((OP_OK, _)) => {}
            Ok((op, _)) => debug!("rendezvous: unexpected reply 0x{op:02x} to {what}"),
            // The rendezvous is gone or busy: it keeps the keys, which is
            // all this costs.
            Err(e) => debug!("{e}"),
        }
    }

    fn register_progress(&self, comm_id: u64, rank: usize, issued: Weak<AtomicU64>) {
        lock(&self.progress).register(comm_id, rank, issued);
    }

    fn ask_progress(&self, comm_id: u64, members: &[usize], deadline: Instant) -> Progress {
        let question = question_id(self.rank);
        let ask = ask_payload(comm_id, question);
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
            clip(key, 32),
            key.len()
        )));
    }
    Ok(())
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
