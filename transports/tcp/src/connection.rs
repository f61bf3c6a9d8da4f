//! One established TCP connection as the slot FIFO of the transport seam:
//! the slot buffers of both directions, the sending and receiving halves,
//! the closer, the error state they share, and the lifetime of the
//! per-socket threads (started here, run by `wire`).
//!
//! Frame m of a direction travels on socket m % nsocks, so a receiver that
//! takes frame m from that socket's queue sees the sender's order. Errors
//! come in two strengths: a *fatal* one (the peer reported a failure, or the
//! connection was closed locally) ends both halves at once, queued frames or
//! not; a broken or cleanly ended stream ends a half only after the frames
//! that arrived before it have been consumed.

use crate::latch::{lock, Latch};
use crate::wire::{self, Inbound, WriterCmd, MAX_REASON_BYTES};
use crossbeam_channel::{select, Receiver, Sender, TryRecvError};
use ferroccl_transport::{
    elapsed_ms, AbortSignal, Connection, ConnectionCloser, FrameHeader, FrameKind, SlotReceiver,
    SlotSender, TransportError,
};
use socket2::Socket;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long dropping the sending half waits for queued frames to reach the
/// socket before it cuts the connection.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a closer waits for its Goodbye/Failure frame to be written.
const CLOSE_FRAME_TIMEOUT: Duration = Duration::from_millis(100);

/// Stack of the reader and writer threads: they hold a 4 KiB reason buffer
/// at most.
const IO_THREAD_STACK: usize = 256 << 10;

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

/// State shared by the halves, the closer and the threads of a connection.
#[derive(Debug)]
pub(crate) struct ConnShared {
    pub(crate) peer: usize,
    pub(crate) chunk_bytes: usize,
    /// Ends both halves at once; first one wins.
    pub(crate) fatal: Mutex<Option<TransportError>>,
    pub(crate) fatal_latch: Latch,
    /// Why no more frames can be sent.
    send_error: Mutex<Option<TransportError>>,
    /// Fires on a send error or a fatal error.
    tx_latch: Latch,
    /// Why some socket's stream broke (not a clean goodbye).
    rx_broken: Mutex<Option<TransportError>>,
    /// Fires on a broken stream or a fatal error.
    rx_latch: Latch,
    /// Set when the receiving half is dropped: readers then leave quietly.
    pub(crate) rx_dropped: AtomicBool,
    /// One handle per socket, to shut them down from any thread.
    sockets: Mutex<Vec<Socket>>,
    /// The writers' queues, for the closer's control frames.
    writers: Mutex<Vec<Sender<WriterCmd>>>,
    /// Halves still alive; the last one releases the sockets.
    halves: AtomicUsize,
}

impl ConnShared {
    pub(crate) fn set_fatal(&self, err: TransportError) {
        {
            let mut fatal = lock(&self.fatal);
            if fatal.is_none() {
                *fatal = Some(err);
            }
        }
        self.fatal_latch.fire();
        self.tx_latch.fire();
        self.rx_latch.fire();
    }

    pub(crate) fn set_send_error(&self, err: TransportError) {
        {
            let mut slot = lock(&self.send_error);
            if slot.is_none() {
                *slot = Some(err);
            }
        }
        self.tx_latch.fire();
    }

    pub(crate) fn set_rx_broken(&self, err: TransportError) {
        {
            let mut slot = lock(&self.rx_broken);
            if slot.is_none() {
                *slot = Some(err);
            }
        }
        self.rx_latch.fire();
    }

    fn fatal_error(&self) -> Option<TransportError> {
        lock(&self.fatal).clone()
    }

    fn send_failure(&self) -> Option<TransportError> {
        self.fatal_error()
            .or_else(|| lock(&self.send_error).clone())
    }

    fn shutdown(&self, how: Shutdown) {
        for socket in lock(&self.sockets).iter() {
            let _ = socket.shutdown(how);
        }
    }

    /// Called by each half as it is dropped; the last one cuts the sockets
    /// so that every thread of the connection ends.
    fn half_dropped(&self) {
        if self.halves.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shutdown(Shutdown::Both);
            lock(&self.sockets).clear();
            lock(&self.writers).clear();
        }
    }

    /// Put `frame` on every socket, waiting at most [`CLOSE_FRAME_TIMEOUT`]
    /// for the writers to get to it, then shut the sockets down.
    fn close_with(&self, err: TransportError, frame: Vec<u8>) {
        self.set_fatal(err);
        let writers = lock(&self.writers).clone();
        let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
        for writer in &writers {
            let _ = writer.send(WriterCmd::Control {
                frame: frame.clone(),
                done: done_tx.clone(),
            });
        }
        drop(done_tx);
        // Every writer drops its `done` once the frame is out (or given up
        // on); the channel then disconnects.
        let _ = done_rx.recv_timeout(CLOSE_FRAME_TIMEOUT);
        self.shutdown(Shutdown::Both);
    }
}

/// Build a connection over handshaken `sockets` (socket i carries frames
/// i, i + nsocks, ... of each direction) and start its threads.
pub(crate) fn establish(
    peer: usize,
    sockets: Vec<Socket>,
    chunk_bytes: usize,
    steps: usize,
    abort: &AbortSignal,
) -> Result<Connection, TransportError> {
    let io = |what: &str, e: std::io::Error| {
        TransportError::Io(format!(
            "setting up the connection to rank {peer}: {what}: {e}"
        ))
    };
    let nsocks = sockets.len();
    let shared = Arc::new(ConnShared {
        peer,
        chunk_bytes,
        fatal: Mutex::new(None),
        fatal_latch: Latch::new(),
        send_error: Mutex::new(None),
        tx_latch: Latch::new(),
        rx_broken: Mutex::new(None),
        rx_latch: Latch::new(),
        rx_dropped: AtomicBool::new(false),
        sockets: Mutex::new(Vec::with_capacity(nsocks)),
        writers: Mutex::new(Vec::with_capacity(nsocks)),
        halves: AtomicUsize::new(2),
    });

    let (tx_free_tx, tx_free_rx) = crossbeam_channel::bounded(steps);
    for _ in 0..steps {
        let _ = tx_free_tx.send(Slot::new(chunk_bytes));
    }
    // Receive slots are handed to the reader of the socket whose frame will
    // fill them next (see `TcpReceiver::release_to`): frame i < steps starts
    // on socket i % nsocks.
    let (rx_free_txs, rx_free_rxs): (Vec<_>, Vec<_>) = (0..nsocks)
        .map(|_| crossbeam_channel::bounded::<Slot>(steps))
        .unzip();
    for i in 0..steps {
        let _ = rx_free_txs[i % nsocks].send(Slot::new(chunk_bytes));
    }
    let (alive_tx, alive_rx) = crossbeam_channel::bounded::<()>(0);

    let mut writer_queues = Vec::with_capacity(nsocks);
    let mut filled_queues = Vec::with_capacity(nsocks);
    let mut started = Vec::new();
    let result: Result<(), TransportError> = (|| {
        for (i, (socket, r_free)) in sockets.into_iter().zip(rx_free_rxs).enumerate() {
            socket
                .set_tcp_nodelay(true)
                .map_err(|e| io("TCP_NODELAY", e))?;
            socket
                .set_read_timeout(None)
                .map_err(|e| io("read timeout", e))?;
            socket
                .set_write_timeout(None)
                .map_err(|e| io("write timeout", e))?;
            let reader: TcpStream = socket.try_clone().map_err(|e| io("dup", e))?.into();
            let writer: TcpStream = socket.try_clone().map_err(|e| io("dup", e))?.into();
            lock(&shared.sockets).push(socket);
            let suffix = if nsocks > 1 {
                format!("/{i}")
            } else {
                String::new()
            };

            let (cmd_tx, cmd_rx) = crossbeam_channel::unbounded();
            let (w_shared, w_free, w_alive) =
                (shared.clone(), tx_free_tx.clone(), alive_tx.clone());
            let handle = std::thread::Builder::new()
                .name(format!("ferroccl-tcp-tx-{peer}{suffix}"))
                .stack_size(IO_THREAD_STACK)
                .spawn(move || wire::run_writer(writer, w_shared, cmd_rx, w_free, w_alive))
                .map_err(|e| io("spawning the writer thread", e))?;
            started.push(handle);
            lock(&shared.writers).push(cmd_tx.clone());
            writer_queues.push(cmd_tx);

            let (filled_tx, filled_rx) = crossbeam_channel::unbounded();
            let r_shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("ferroccl-tcp-rx-{peer}{suffix}"))
                .stack_size(IO_THREAD_STACK)
                .spawn(move || wire::run_reader(reader, r_shared, filled_tx, r_free))
                .map_err(|e| io("spawning the reader thread", e))?;
            started.push(handle);
            filled_queues.push(filled_rx);
        }
        Ok(())
    })();
    if let Err(e) = result {
        // Whatever threads started end once the sockets are cut and their
        // queues are dropped.
        shared.set_fatal(e.clone());
        shared.shutdown(Shutdown::Both);
        return Err(e);
    }
    drop(started);

    let sender = TcpSender {
        shared: shared.clone(),
        free: tx_free_rx,
        free_return: tx_free_tx,
        writers: writer_queues,
        next: 0,
        abort: abort.clone(),
        writers_alive: alive_rx,
    };
    let receiver = TcpReceiver {
        shared: shared.clone(),
        filled: filled_queues,
        free: rx_free_txs,
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

/// What `recv_with` hands a filled slot to.
use ferroccl_transport::Consume;

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

/// The sending half: takes free slots, hands filled ones to the writers.
struct TcpSender {
    shared: Arc<ConnShared>,
    free: Receiver<Slot>,
    free_return: Sender<Slot>,
    writers: Vec<Sender<WriterCmd>>,
    next: usize,
    abort: AbortSignal,
    /// Disconnects once every writer thread has exited.
    writers_alive: Receiver<()>,
}

impl TcpSender {
    fn take_free_slot(&self, deadline: Instant) -> Result<Slot, TransportError> {
        let start = Instant::now();
        loop {
            if self.abort.is_fired() {
                return Err(TransportError::Aborted);
            }
            if let Some(err) = self.shared.send_failure() {
                return Err(err);
            }
            match self.free.try_recv() {
                Ok(slot) => return Ok(slot),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => {
                    return Err(TransportError::Io(format!(
                        "send slots to rank {} are gone",
                        self.shared.peer
                    )))
                }
            }
            select! {
                recv(self.free) -> slot => {
                    if let Ok(slot) = slot {
                        return Ok(slot);
                    }
                }
                recv(self.abort.receiver()) -> _ => return Err(TransportError::Aborted),
                recv(self.shared.tx_latch.receiver()) -> _ => {}
                default(remaining(deadline)) => {
                    return Err(TransportError::Timeout {
                        peer: self.shared.peer,
                        what: "a free send slot",
                        waited_ms: elapsed_ms(start),
                    })
                }
            }
        }
    }
}

impl SlotSender for TcpSender {
    fn chunk_bytes(&self) -> usize {
        self.shared.chunk_bytes
    }

    fn send_with(
        &mut self,
        mut header: FrameHeader,
        deadline: Instant,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), TransportError> {
        let chunk_bytes = self.shared.chunk_bytes;
        let mut slot = self.take_free_slot(deadline)?;
        let len = fill(slot.bytes_mut(chunk_bytes));
        if len > chunk_bytes {
            let _ = self.free_return.send(slot);
            return Err(TransportError::Io(format!(
                "fill wrote {len} bytes into a {chunk_bytes}-byte slot for rank {}",
                self.shared.peer
            )));
        }
        // Slots are at most u32::MAX bytes (checked when listening).
        header.len = len as u32;
        let cmd = WriterCmd::Frame {
            header: header.encode(),
            slot,
            len,
        };
        let k = self.next;
        self.next = if k + 1 == self.writers.len() {
            0
        } else {
            k + 1
        };
        if let Err(crossbeam_channel::SendError(cmd)) = self.writers[k].send(cmd) {
            if let WriterCmd::Frame { slot, .. } = cmd {
                let _ = self.free_return.send(slot);
            }
            return Err(self.shared.send_failure().unwrap_or_else(|| {
                TransportError::Io(format!("writer to rank {} stopped", self.shared.peer))
            }));
        }
        Ok(())
    }
}

impl Drop for TcpSender {
    fn drop(&mut self) {
        for writer in self.writers.drain(..) {
            let _ = writer.send(WriterCmd::Finish);
        }
        // Let queued frames reach the peer (it may be reading them right
        // now), unless the connection is already dead or being aborted.
        if self.shared.fatal_error().is_none() && !self.abort.is_fired() {
            select! {
                recv(self.writers_alive) -> _ => {},
                recv(self.abort.receiver()) -> _ => {},
                recv(self.shared.fatal_latch.receiver()) -> _ => {},
                default(DRAIN_TIMEOUT) => {
                    tracing::warn!(peer = self.shared.peer, "queued frames not flushed within {DRAIN_TIMEOUT:?}; cutting the connection");
                }
            }
        }
        self.shared.shutdown(Shutdown::Write);
        self.shared.half_dropped();
    }
}

/// The receiving half: takes filled slots from the readers in frame order.
///
/// The slot of frame m goes back to the reader of socket (m + steps) %
/// nsocks, the one that carries frame m + steps, the next frame allowed to
/// use it. Were free slots shared by all readers, readers of later frames
/// could take every slot while the awaited frame's reader waits for one.
struct TcpReceiver {
    shared: Arc<ConnShared>,
    filled: Vec<Receiver<Inbound>>,
    /// Free-slot queue of each socket's reader.
    free: Vec<Sender<Slot>>,
    /// Socket whose frame the next consumed frame is.
    next: usize,
    /// Socket whose reader gets the next released slot.
    release_to: usize,
    abort: AbortSignal,
    /// How this half ended, repeated to every later call.
    ended: Option<TransportError>,
}

impl TcpReceiver {
    fn deliver(&mut self, item: Inbound, consume: &mut Consume<'_>) -> Result<(), TransportError> {
        match item {
            Inbound::Frame(header, slot) => {
                let n = self.filled.len();
                self.next = if self.next + 1 == n { 0 } else { self.next + 1 };
                let result = consume(&header, slot.bytes(header.len as usize));
                let _ = self.free[self.release_to].send(slot);
                self.release_to = if self.release_to + 1 == n {
                    0
                } else {
                    self.release_to + 1
                };
                result
            }
            Inbound::End(err) => {
                self.ended = Some(err.clone());
                Err(err)
            }
        }
    }

    fn end_with(&mut self, err: TransportError) -> Result<(), TransportError> {
        self.ended = Some(err.clone());
        Err(err)
    }
}

impl SlotReceiver for TcpReceiver {
    fn chunk_bytes(&self) -> usize {
        self.shared.chunk_bytes
    }

    fn recv_with(
        &mut self,
        deadline: Instant,
        consume: &mut Consume<'_>,
    ) -> Result<(), TransportError> {
        let start = Instant::now();
        let peer = self.shared.peer;
        loop {
            if self.abort.is_fired() {
                return Err(TransportError::Aborted);
            }
            if let Some(err) = self.shared.fatal_error() {
                return Err(err);
            }
            if let Some(err) = &self.ended {
                return Err(err.clone());
            }
            let queue = &self.filled[self.next];
            let item = match queue.try_recv() {
                Ok(item) => Some(item),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => {
                    return self.end_with(TransportError::PeerClosed {
                        peer,
                        detail: "reader stopped".into(),
                    })
                }
            };
            if let Some(item) = item {
                return self.deliver(item, consume);
            }
            // Another socket broke: the frame awaited here will not come.
            let broken = lock(&self.shared.rx_broken).clone();
            if let Some(err) = broken {
                return self.end_with(err);
            }
            let queue = &self.filled[self.next];
            let item = select! {
                recv(queue) -> item => item.ok(),
                recv(self.abort.receiver()) -> _ => return Err(TransportError::Aborted),
                recv(self.shared.rx_latch.receiver()) -> _ => None,
                default(remaining(deadline)) => {
                    return Err(TransportError::Timeout {
                        peer,
                        what: "data",
                        waited_ms: elapsed_ms(start),
                    })
                }
            };
            if let Some(item) = item {
                return self.deliver(item, consume);
            }
        }
    }
}

impl Drop for TcpReceiver {
    fn drop(&mut self) {
        self.shared.rx_dropped.store(true, Ordering::SeqCst);
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
