//! One established TCP connection as the slot FIFO of the transport seam.
//!
//! # Design: the caller does the I/O
//!
//! All sockets are nonblocking. A frame crosses no thread on the fast path:
//!
//! - **Sending.** `send_from` writes the 40-byte header and the caller's
//!   bytes with one `sendmsg` (gather list, `MSG_NOSIGNAL`) on the calling
//!   thread; `send_with` lets its fill closure write a scratch slot of the
//!   sending half and writes that. When the socket is full the caller waits
//!   in `poll(POLLOUT)` slices of at most 50 ms, looking at the abort signal
//!   and the connection's failure state between them, until its deadline.
//!   If a send gives up after part of its frame is on the wire, the rest is
//!   kept in that socket's backlog and goes out ahead of the next frame (or
//!   the closer's control frame, or the goodbye), so the byte stream always
//!   stays framed. Each socket's writing state sits behind a mutex so that a
//!   closer on another thread never interleaves its frame with a data frame.
//! - **Receiving.** Each socket has a [`RxState`] behind a mutex: the
//!   resumable frame reader (`wire::Partial`), a queue of frames already
//!   read, the free slots, and whether the consumer is present. A consumer
//!   in `recv_with`/`recv_into` takes queued frames first; otherwise it marks
//!   itself present and reads the socket itself (`poll(POLLIN)` slices of at
//!   most 50 ms, looking at abort, failure and its deadline between them):
//!   `recv_into` reads the payload straight into the caller's buffer after
//!   `check` accepted the header, `recv_with` into a free slot. Before the
//!   first `poll` it retries the read for [`SPIN`] (5 us), which measured
//!   worth it on 2 cores.
//! - **Background reader.** One thread per socket keeps draining while the
//!   consumer is away, so that two ranks blocked in big writes to each other
//!   cannot deadlock. It only reads once the consumer has been away for
//!   [`GRACE`] (so it rarely steals a frame the consumer would have read
//!   itself a moment later), never while the consumer is present, and only
//!   into free slots: at most `steps` frames wait in user space, beyond that
//!   the kernel buffers and then TCP flow control push back. It holds the
//!   lock only for nonblocking reads, never across a wait. Frames it reads
//!   are queued in order ahead of whatever the consumer reads next.
//!
//! Frame m of a direction travels on socket m % nsocks, so a receiver that
//! takes frame m from that socket sees the sender's order. Errors come in
//! two strengths: a *fatal* one (the peer reported a failure, or the
//! connection was closed locally) ends both halves at once, queued frames or
//! not; a broken or cleanly ended stream ends a half only after the frames
//! that arrived before it have been consumed.

use crate::latch::{lock, wait_timeout};
use crate::wire::{self, Partial, Progress, WriteStop, MAX_REASON_BYTES, POLL_SLICE};
use ferroccl_transport::{
    elapsed_ms, AbortSignal, Connection, ConnectionCloser, Consume, FrameHeader, FrameKind,
    SlotReceiver, SlotSender, TransportError, HEADER_BYTES,
};
use socket2::Socket;
use std::collections::VecDeque;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::{Duration, Instant};

/// How long dropping the sending half waits for the goodbye (and the tail
/// of a cut-short frame) to reach the socket before it cuts the connection.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a closer waits for its Goodbye/Failure frame to be written.
const CLOSE_FRAME_TIMEOUT: Duration = Duration::from_millis(100);

/// How long the consumer must have been away before the background reader
/// reads a socket: data arriving between two receives of a busy consumer
/// stays in the kernel for the consumer to read itself.
const GRACE: Duration = Duration::from_millis(1);

/// How long the background reader sleeps while the consumer is present,
/// before it looks again (nobody wakes it: that would cost the consumer a
/// syscall per frame).
const PARK_SHORT: Duration = Duration::from_millis(2);

/// After the consumer has been present this long (waiting for a slow
/// peer), the background reader sleeps [`PARK_LONG`] and asks to be woken
/// when the consumer leaves.
const LONG_PRESENCE: Duration = Duration::from_millis(20);

/// Longest sleep of the background reader when it asked to be woken.
const PARK_LONG: Duration = Duration::from_millis(50);

/// Stack of the background readers: they hold a 4 KiB skip buffer at most.
const READER_STACK: usize = 256 << 10;

/// How long a receiving caller keeps retrying a nonblocking read before it
/// sleeps in `poll(2)`. On 2 cores this halved small-message allreduce
/// time with 2 ranks (22 -> 11 us at 1 KiB) and cut voluntary context
/// switches tenfold; with 4 ranks on 2 cores it was neutral, while 20 us
/// already cost 50% there.
const SPIN: Duration = Duration::from_micros(5);

/// How long a receiver retries a read before it sleeps in `poll`: [`SPIN`],
/// unless the job has more ranks than this machine has cores (an upper
/// bound on the ranks that share it); then the rank it waits for may need
/// this very core, and spinning measured 10-15% slower at 4 ranks on 2
/// cores (256 KiB-1 MiB allreduce).
pub(crate) fn spin_for(ranks: usize) -> Duration {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if ranks > cores {
        Duration::ZERO
    } else {
        SPIN
    }
}

/// What a send timeout says it waited for.
const SEND_WAIT: &str = "a free send slot";

/// One slot buffer, 8-byte aligned so that the layer above can view it as
/// a slice of 8-byte elements.
#[derive(Debug)]
pub(crate) struct Slot {
    words: Vec<u64>,
}

impl Slot {
    pub(crate) fn new(chunk_bytes: usize) -> Self {
        Slot {
            words: vec![0u64; chunk_bytes.div_ceil(8)],
        }
    }

    /// The first `len` bytes (`len` is at most the slot size).
    pub(crate) fn bytes(&self, len: usize) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..len]
    }

    /// The first `len` bytes, writable.
    pub(crate) fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..len]
    }
}

/// The writing side of one socket.
#[derive(Debug)]
struct TxSocket {
    socket: Socket,
    state: Mutex<TxState>,
}

#[derive(Debug, Default)]
struct TxState {
    /// The unsent tail of a frame whose send gave up midway.
    backlog: Vec<u8>,
    /// Bytes of `backlog` already written.
    sent: usize,
    /// No more frames go on this socket (goodbye or failure sent, or the
    /// socket failed).
    closed: bool,
}

/// What a background reader queues for the consumer.
#[derive(Debug)]
enum Inbound {
    /// A data frame, its payload in `slot[..header.len]`.
    Frame(FrameHeader, Slot),
    /// This socket's stream ended; no more frames follow on it.
    End(TransportError),
}

/// The reading side of one socket.
#[derive(Debug)]
struct RxSocket {
    socket: Socket,
    state: Mutex<RxState>,
    /// Wakes the background reader, when it asked for it (`bg_waiting`).
    wake: Condvar,
}

#[derive(Debug)]
struct RxState {
    /// How far the next unqueued frame has been read.
    partial: Partial,
    /// Frames read by the background reader, oldest first.
    queue: VecDeque<Inbound>,
    /// Slots free for this socket's frames.
    free: Vec<Slot>,
    /// The consumer is reading this socket itself.
    present: bool,
    /// When `present` last changed.
    since: Instant,
    /// The background reader sleeps until woken (not just a short park).
    bg_waiting: bool,
    /// The stream is over: nothing more will be read from it.
    ended: bool,
}

/// State shared by the halves, the closer and the background readers.
#[derive(Debug)]
pub(crate) struct ConnShared {
    peer: usize,
    chunk_bytes: usize,
    /// Ends both halves at once; first one wins.
    fatal: Mutex<Option<TransportError>>,
    fatal_set: AtomicBool,
    /// Why no more frames can be sent.
    send_error: Mutex<Option<TransportError>>,
    send_failed: AtomicBool,
    /// Why some socket's stream broke (not a clean goodbye).
    rx_broken: Mutex<Option<TransportError>>,
    rx_broken_set: AtomicBool,
    /// Set when the receiving half is dropped: readers then leave quietly.
    rx_dropped: AtomicBool,
    /// See `spin_for`.
    spin: Duration,
    tx: Vec<TxSocket>,
    rx: Vec<RxSocket>,
    /// One handle per socket, to shut them down from any thread.
    sockets: Mutex<Vec<Socket>>,
    /// Halves still alive; the last one shuts the sockets down.
    halves: AtomicUsize,
}

impl ConnShared {
    fn set_fatal(&self, err: TransportError) {
        {
            let mut fatal = lock(&self.fatal);
            if fatal.is_none() {
                *fatal = Some(err);
            }
        }
        self.fatal_set.store(true, Ordering::SeqCst);
        for rx in &self.rx {
            rx.wake.notify_all();
        }
    }

    fn set_send_error(&self, err: TransportError) {
        let mut slot = lock(&self.send_error);
        if slot.is_none() {
            *slot = Some(err);
        }
        self.send_failed.store(true, Ordering::SeqCst);
    }

    fn set_rx_broken(&self, err: TransportError) {
        let mut slot = lock(&self.rx_broken);
        if slot.is_none() {
            *slot = Some(err);
        }
        self.rx_broken_set.store(true, Ordering::SeqCst);
    }

    /// A stream broke: both halves learn of it.
    fn broken(&self, err: &TransportError) {
        if !self.fatal_set.load(Ordering::SeqCst) {
            tracing::warn!(peer = self.peer, "connection broken: {err}");
        }
        self.set_send_error(err.clone());
        self.set_rx_broken(err.clone());
    }

    fn fatal_error(&self) -> Option<TransportError> {
        if !self.fatal_set.load(Ordering::SeqCst) {
            return None;
        }
        lock(&self.fatal).clone()
    }

    fn send_failure(&self) -> Option<TransportError> {
        self.fatal_error().or_else(|| {
            if self.send_failed.load(Ordering::SeqCst) {
                lock(&self.send_error).clone()
            } else {
                None
            }
        })
    }

    fn rx_broken_error(&self) -> Option<TransportError> {
        if !self.rx_broken_set.load(Ordering::SeqCst) {
            return None;
        }
        lock(&self.rx_broken).clone()
    }

    fn shutdown(&self, how: Shutdown) {
        for socket in lock(&self.sockets).iter() {
            let _ = socket.shutdown(how);
        }
    }

    /// Called by each half as it is dropped; the last one cuts the sockets
    /// so that every background reader ends.
    fn half_dropped(&self) {
        if self.halves.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shutdown(Shutdown::Both);
            lock(&self.sockets).clear();
        }
    }

    /// Put `frame` on every socket that is not closed yet (after the tail
    /// of a cut-short frame, if any), waiting at most
    /// [`CLOSE_FRAME_TIMEOUT`] in all, then shut the sockets down.
    fn close_with(&self, err: TransportError, frame: Vec<u8>) {
        // Fatal first: a sender stalled on a full socket gives up and lets
        // go of it.
        self.set_fatal(err);
        let start = Instant::now();
        let deadline = start + CLOSE_FRAME_TIMEOUT;
        for tx in &self.tx {
            let mut st = loop {
                match tx.state.try_lock() {
                    Ok(g) => break Some(g),
                    Err(TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                    Err(TryLockError::WouldBlock) => {
                        if Instant::now() >= deadline {
                            break None;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            };
            let Some(st) = st.as_mut() else { continue };
            if st.closed {
                continue;
            }
            st.closed = true;
            let mut stop = || None;
            let out = flush_backlog(tx, st, deadline, (self.peer, SEND_WAIT, start), &mut stop)
                .and_then(|()| {
                    wire::write_bounded(
                        &tx.socket,
                        [&frame, &[]],
                        &mut 0,
                        deadline,
                        (self.peer, SEND_WAIT, start),
                        &mut stop,
                    )
                });
            if let Err(e) = out {
                tracing::debug!(peer = self.peer, "control frame not delivered: {e:?}");
            }
        }
        self.shutdown(Shutdown::Both);
    }
}

/// Write the unsent tail of an earlier frame, if any.
fn flush_backlog(
    tx: &TxSocket,
    st: &mut TxState,
    deadline: Instant,
    timeout: (usize, &'static str, Instant),
    stop: &mut dyn FnMut() -> Option<TransportError>,
) -> Result<(), WriteStop> {
    if st.sent == st.backlog.len() {
        return Ok(());
    }
    let backlog = std::mem::take(&mut st.backlog);
    let result = wire::write_bounded(
        &tx.socket,
        [&backlog, &[]],
        &mut st.sent,
        deadline,
        timeout,
        stop,
    );
    st.backlog = backlog;
    if result.is_ok() {
        st.backlog.clear();
        st.sent = 0;
    }
    result
}

/// Build a connection over handshaken `sockets` (socket i carries frames
/// i, i + nsocks, ... of each direction) and start its background readers.
pub(crate) fn establish(
    peer: usize,
    sockets: Vec<Socket>,
    chunk_bytes: usize,
    steps: usize,
    spin: Duration,
    abort: &AbortSignal,
) -> Result<Connection, TransportError> {
    let io = |what: &str, e: std::io::Error| {
        TransportError::Io(format!(
            "setting up the connection to rank {peer}: {what}: {e}"
        ))
    };
    let nsocks = sockets.len();
    let now = Instant::now();
    let mut tx = Vec::with_capacity(nsocks);
    let mut rx = Vec::with_capacity(nsocks);
    for socket in &sockets {
        socket
            .set_tcp_nodelay(true)
            .map_err(|e| io("TCP_NODELAY", e))?;
        socket
            .set_read_timeout(None)
            .map_err(|e| io("read timeout", e))?;
        socket
            .set_write_timeout(None)
            .map_err(|e| io("write timeout", e))?;
        // O_NONBLOCK belongs to the open file: the duplicates share it.
        socket
            .set_nonblocking(true)
            .map_err(|e| io("nonblocking mode", e))?;
        tx.push(TxSocket {
            socket: socket.try_clone().map_err(|e| io("dup", e))?,
            state: Mutex::new(TxState::default()),
        });
        rx.push(RxSocket {
            socket: socket.try_clone().map_err(|e| io("dup", e))?,
            state: Mutex::new(RxState {
                partial: Partial::idle(),
                queue: VecDeque::with_capacity(steps),
                free: Vec::with_capacity(steps),
                present: false,
                since: now,
                bg_waiting: false,
                ended: false,
            }),
            wake: Condvar::new(),
        });
    }
    // Receive slots go to the socket whose frame will fill them next (see
    // `TcpReceiver::release_to`): frame i < steps is on socket i % nsocks.
    for i in 0..steps {
        lock(&rx[i % nsocks].state)
            .free
            .push(Slot::new(chunk_bytes));
    }
    let shared = Arc::new(ConnShared {
        peer,
        chunk_bytes,
        fatal: Mutex::new(None),
        fatal_set: AtomicBool::new(false),
        send_error: Mutex::new(None),
        send_failed: AtomicBool::new(false),
        rx_broken: Mutex::new(None),
        rx_broken_set: AtomicBool::new(false),
        rx_dropped: AtomicBool::new(false),
        spin,
        tx,
        rx,
        sockets: Mutex::new(sockets),
        halves: AtomicUsize::new(2),
    });

    for i in 0..nsocks {
        let suffix = if nsocks > 1 {
            format!("/{i}")
        } else {
            String::new()
        };
        let r_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("ferroccl-tcp-rx-{peer}{suffix}"))
            .stack_size(READER_STACK)
            .spawn(move || run_background_reader(&r_shared, i));
        if let Err(e) = spawned {
            // Readers already started end once the connection is fatal.
            let e = io("spawning a reader thread", e);
            shared.set_fatal(e.clone());
            shared.shutdown(Shutdown::Both);
            return Err(e);
        }
    }

    let sender = TcpSender {
        shared: shared.clone(),
        next: 0,
        abort: abort.clone(),
        scratch: Slot::new(chunk_bytes),
    };
    let receiver = TcpReceiver {
        shared: shared.clone(),
        next: 0,
        release_to: steps % nsocks,
        abort: abort.clone(),
        ended: None,
    };
    Ok(Connection {
        peer,
        transport: "tcp",
        sender: Box::new(sender),
        receiver: Box::new(receiver),
        closer: Arc::new(TcpCloser { shared }),
    })
}

/// The background reader of socket `index`: drains it into free slots
/// while the consumer is away (see the module docs).
fn run_background_reader(shared: &ConnShared, index: usize) {
    let peer = shared.peer;
    let rx = &shared.rx[index];
    let mut st = lock(&rx.state);
    loop {
        if shared.rx_dropped.load(Ordering::SeqCst)
            || st.ended
            || shared.fatal_set.load(Ordering::SeqCst)
        {
            return;
        }
        if st.present {
            let long = st.since.elapsed() >= LONG_PRESENCE;
            st.bg_waiting = long;
            st = wait_timeout(&rx.wake, st, if long { PARK_LONG } else { PARK_SHORT });
            st.bg_waiting = false;
            continue;
        }
        if (st.partial.is_pending() && st.free.is_empty()) || st.partial.reads_into_caller() {
            // A data frame waits for a slot; the consumer releases one.
            st.bg_waiting = true;
            st = wait_timeout(&rx.wake, st, PARK_LONG);
            st.bg_waiting = false;
            continue;
        }
        let away = st.since.elapsed();
        if away < GRACE {
            drop(st);
            std::thread::sleep(GRACE - away);
            st = lock(&rx.state);
            continue;
        }
        let progress = st
            .partial
            .advance(&mut &rx.socket, shared.chunk_bytes, None);
        match progress {
            Ok(Progress::WouldBlock) => {
                drop(st);
                wire::poll_ready(&rx.socket, false, POLL_SLICE);
                st = lock(&rx.state);
            }
            Ok(Progress::Header(_)) => {
                if let Some(slot) = st.free.pop() {
                    st.partial.set_payload(Some(slot));
                }
            }
            Ok(Progress::Frame(header, Some(slot))) => {
                st.queue.push_back(Inbound::Frame(header, slot));
            }
            Ok(Progress::Frame(_, None)) => {
                // Never read into a caller's buffer here: see above.
                debug_assert!(false, "background reader finished a caller's frame");
            }
            Ok(Progress::Failure { rank, reason }) => {
                tracing::warn!(peer, failed_rank = rank, "peer reports a failure: {reason}");
                st.ended = true;
                shared.set_fatal(TransportError::PeerFailed { rank, reason });
                return;
            }
            Ok(Progress::Goodbye) => {
                // Only the peer's sending half is gone: its receiving half
                // may still read what we send.
                st.ended = true;
                st.queue.push_back(Inbound::End(clean_goodbye(peer)));
                return;
            }
            Ok(Progress::Eof) => {
                st.ended = true;
                if shared.fatal_set.load(Ordering::SeqCst) {
                    return;
                }
                let err = no_goodbye(peer);
                shared.broken(&err);
                st.queue.push_back(Inbound::End(err));
                return;
            }
            Err(e) => {
                st.ended = true;
                let err = e.into_transport(peer);
                shared.broken(&err);
                st.queue.push_back(Inbound::End(err));
                return;
            }
        }
    }
}

fn clean_goodbye(peer: usize) -> TransportError {
    TransportError::PeerClosed {
        peer,
        detail: "peer shut down cleanly".into(),
    }
}

fn no_goodbye(peer: usize) -> TransportError {
    TransportError::PeerClosed {
        peer,
        detail: "connection closed without a goodbye".into(),
    }
}

/// The sending half: writes frames on the calling thread.
struct TcpSender {
    shared: Arc<ConnShared>,
    /// Socket of the next frame.
    next: usize,
    abort: AbortSignal,
    /// Where `send_with` lets its closure fill a frame.
    scratch: Slot,
}

impl TcpSender {
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

/// The receiving half: frames in order, from the queues of the background
/// readers or read from the sockets on the calling thread.
///
/// The slot of frame m goes back to socket (m + steps) % nsocks, the one
/// that carries frame m + steps, the next frame allowed to use it. Were
/// free slots shared by all sockets, the background reader of a later
/// frame could take every slot while the awaited frame's socket has none.
/// A frame read straight into the caller's buffer passes its unused slot
/// on the same way.
struct TcpReceiver {
    shared: Arc<ConnShared>,
    /// Socket whose frame the next consumed frame is.
    next: usize,
    /// Socket that gets the next released slot.
    release_to: usize,
    abort: AbortSignal,
    /// How this half ended, repeated to every later call.
    ended: Option<TransportError>,
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
        self.shared.half_dropped();
    }
}

/// Closes a connection from any thread.
struct TcpCloser {
    shared: Arc<ConnShared>,
}

impl ConnectionCloser for TcpCloser {
    fn close_with_failure(&self, failed_rank: usize, reason: &str) {
        let keep = reason
            .len()
            .min(MAX_REASON_BYTES)
            .min(self.shared.chunk_bytes);
        let mut cut = keep;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        let reason = &reason[..cut];
        let aux = u32::try_from(failed_rank).unwrap_or(u32::MAX);
        let frame = wire::control_frame(FrameKind::Failure, aux, reason.as_bytes());
        self.shared.close_with(
            TransportError::PeerFailed {
                rank: failed_rank,
                reason: reason.to_owned(),
            },
            frame,
        );
    }

    fn close(&self) {
        let frame = wire::control_frame(FrameKind::Goodbye, 0, &[]);
        self.shared.close_with(
            TransportError::Io(format!(
                "connection to rank {} was closed locally",
                self.shared.peer
            )),
            frame,
        );
    }
}
