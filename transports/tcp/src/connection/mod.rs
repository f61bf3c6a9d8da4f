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
//!   first `poll` it retries the read for [`SPIN`] (5 us, none with more
//!   ranks than cores), which measured worth it on 2 cores, then for up to
//!   [`YIELD`] (1 ms) with a `sched_yield` between reads.
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
//!
//! Files: this one holds the state the halves share, the set-up of a
//! connection and its closer; `sender` the sending half, `receiver` the
//! receiving half, `reader` the background reader threads.

mod reader;
mod receiver;
mod sender;

use crate::slot::Slot;
use crate::wire::{self, Partial, WriteStop, MAX_REASON_BYTES};
use ferroccl_transport::{
    lock, AbortSignal, Connection, ConnectionCloser, FifoDescriptor, FrameHeader, FrameKind,
    HostPath, MemoryKind, TransportError,
};
use reader::run_background_reader;
use receiver::TcpReceiver;
use sender::TcpSender;
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

/// How long a receiving caller keeps yielding its core between
/// nonblocking reads, after [`spin_for`]'s spin and before it sleeps in
/// `poll(2)`: a sleeping receiver needs a wake-up (the scheduler's latency,
/// and with more ranks than cores, a core to run on) before it reads, while
/// a yielding one gives its core to whoever can use it, often the rank it
/// waits for, and reads as soon as it is back. Open MPI's TCP path yields
/// the same way, without a bound. Measured on 2 cores, 4 ranks over TCP
/// (docs/performance-log.md, "yield before sleeping", medians of five
/// rounds): 8 B-2 KiB allreduce 57-61 us -> 41-49 us, large messages up to
/// 2.3x faster; 2 ranks 10.1-10.5 us -> 9.0-9.7 us. Bounded so that a
/// rank whose peers are far behind (a slow step, a stall) goes back to
/// sleeping after 1 ms.
pub(crate) const YIELD: Duration = Duration::from_millis(1);

/// How long a receiver retries a read before it yields: [`SPIN`],
/// unless the ranks may share CPUs (`ferroccl_transport::wait::ranks_share_cpus`);
/// then the rank it waits for may need this very core, and spinning
/// measured 10-15% slower at 4 ranks on 2 cores (256 KiB-1 MiB
/// allreduce).
pub(crate) fn spin_for(ranks: usize) -> Duration {
    if ferroccl_transport::wait::ranks_share_cpus(ranks) {
        Duration::ZERO
    } else {
        SPIN
    }
}

/// What a send timeout says it waited for.
const SEND_WAIT: &str = "a free send slot";

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

    let mut readers = Vec::with_capacity(nsocks);
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
        match spawned {
            Ok(handle) => readers.push(handle),
            Err(e) => {
                // Readers already started end once the connection is fatal.
                let e = io("spawning a reader thread", e);
                shared.set_fatal(e.clone());
                shared.shutdown(Shutdown::Both);
                return Err(e);
            }
        }
    }

    let sender = TcpSender::new(shared.clone(), abort.clone());
    let receiver = TcpReceiver::new(shared.clone(), steps % nsocks, abort.clone(), readers);
    // Receive slots move between free lists, queues and the reader, and
    // the bytes of a frame sit in socket buffers on the way: no slot has a
    // fixed place and no counter lives in memory.
    let fifo = FifoDescriptor::internal(MemoryKind::HostPrivate, steps, chunk_bytes);
    Ok(Connection {
        peer,
        transport: "tcp",
        send_fifo: fifo,
        recv_fifo: fifo,
        host: Some(HostPath {
            sender: Box::new(sender),
            receiver: Box::new(receiver),
        }),
        closer: Arc::new(TcpCloser { shared }),
    })
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
