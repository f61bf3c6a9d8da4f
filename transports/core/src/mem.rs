//! An in-process transport: the slot FIFO as two crossbeam channels per
//! direction (free slots, filled slots). Ranks must live in one process
//! (threads). It exists to test executors and algorithms without sockets and
//! as the reference behaviour of the slot FIFO; it never crosses a process.

use crate::{
    elapsed_ms, AbortSignal, Connection, ConnectionCloser, FrameHeader, FrameKind, HostInfo,
    ListenConfig, Listener, SlotReceiver, SlotSender, Transport, TransportError,
};
use crossbeam_channel::{select, Receiver, Sender};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

type Filled = (FrameHeader, Vec<u64>);

/// The acceptor's halves, handed over by `connect`.
struct Offer {
    from: usize,
    token: u64,
    comm_id: u64,
    /// Connector -> acceptor: filled slots, and where to return them.
    c2a_filled: Receiver<Filled>,
    c2a_free: Sender<Vec<u64>>,
    /// Acceptor -> connector: free slots, and where to publish them.
    a2c_free: Receiver<Vec<u64>>,
    a2c_filled: Sender<Filled>,
}

fn registry() -> &'static Mutex<HashMap<u64, Sender<Offer>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u64, Sender<Offer>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The in-process transport ("mem").
#[derive(Debug, Default, Clone)]
pub struct MemTransport;

impl Transport for MemTransport {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn can_connect(&self, _local: &HostInfo, _peer: &HostInfo) -> bool {
        // Only meaningful when every rank is a thread of this process; the
        // caller opts in explicitly.
        true
    }

    fn listen(
        &self,
        config: &ListenConfig,
        abort: &AbortSignal,
    ) -> Result<Box<dyn Listener>, TransportError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = crossbeam_channel::unbounded();
        lock(registry()).insert(id, tx);
        Ok(Box::new(MemListener {
            id,
            config: config.clone(),
            abort: abort.clone(),
            inbox: rx,
            early: Mutex::new(Vec::new()),
        }))
    }
}

struct MemListener {
    id: u64,
    config: ListenConfig,
    abort: AbortSignal,
    inbox: Receiver<Offer>,
    /// Offers from peers other than the one being accepted right now.
    early: Mutex<Vec<Offer>>,
}

impl Drop for MemListener {
    fn drop(&mut self) {
        lock(registry()).remove(&self.id);
    }
}

/// A direction's free-slot channel, filled with `steps` zeroed slots.
fn new_slots(steps: usize, chunk_bytes: usize) -> (Sender<Vec<u64>>, Receiver<Vec<u64>>) {
    let (tx, rx) = crossbeam_channel::bounded(steps);
    for _ in 0..steps {
        // Cannot fail: the channel has room for `steps` and its receiver lives.
        let _ = tx.send(vec![0u64; chunk_bytes.div_ceil(8)]);
    }
    (tx, rx)
}

impl MemListener {
    fn connection(&self, peer: usize, sender: MemSender, receiver: MemReceiver) -> Connection {
        let closed = sender.closed.clone();
        Connection {
            peer,
            transport: "mem",
            sender: Box::new(sender),
            receiver: Box::new(receiver),
            closer: Arc::new(MemCloser { closed }),
        }
    }
}

impl Listener for MemListener {
    fn address(&self) -> Vec<u8> {
        self.id.to_le_bytes().to_vec()
    }

    fn connect(
        &self,
        peer: usize,
        address: &[u8],
        _deadline: Instant,
    ) -> Result<Connection, TransportError> {
        let id = <[u8; 8]>::try_from(address)
            .map(u64::from_le_bytes)
            .map_err(|_| TransportError::Connect {
                peer,
                detail: format!("bad mem address of {} bytes", address.len()),
            })?;
        let target = lock(registry())
            .get(&id)
            .cloned()
            .ok_or_else(|| TransportError::Connect {
                peer,
                detail: "no such in-process listener".into(),
            })?;
        let (steps, chunk) = (self.config.steps, self.config.chunk_bytes);
        let (c2a_filled_tx, c2a_filled_rx) = crossbeam_channel::bounded(steps);
        let (c2a_free_tx, c2a_free_rx) = new_slots(steps, chunk);
        let (a2c_filled_tx, a2c_filled_rx) = crossbeam_channel::bounded(steps);
        let (a2c_free_tx, a2c_free_rx) = new_slots(steps, chunk);
        let closed = Arc::new(AtomicBool::new(false));
        target
            .send(Offer {
                from: self.config.rank,
                token: self.config.token,
                comm_id: self.config.comm_id,
                c2a_filled: c2a_filled_rx,
                c2a_free: c2a_free_tx,
                a2c_free: a2c_free_rx,
                a2c_filled: a2c_filled_tx,
            })
            .map_err(|_| TransportError::Connect {
                peer,
                detail: "in-process listener is gone".into(),
            })?;
        let sender = MemSender {
            peer,
            chunk,
            free: c2a_free_rx,
            out: c2a_filled_tx,
            abort: self.abort.clone(),
            closed: closed.clone(),
        };
        let receiver = MemReceiver {
            peer,
            chunk,
            filled: a2c_filled_rx,
            free: a2c_free_tx,
            abort: self.abort.clone(),
            closed,
        };
        Ok(self.connection(peer, sender, receiver))
    }

    fn accept(&self, peer: usize, deadline: Instant) -> Result<Connection, TransportError> {
        let start = Instant::now();
        loop {
            let found = {
                let mut early = lock(&self.early);
                early
                    .iter()
                    .position(|o| o.from == peer)
                    .map(|i| early.swap_remove(i))
            };
            if let Some(offer) = found {
                if offer.token != self.config.token || offer.comm_id != self.config.comm_id {
                    return Err(TransportError::Connect {
                        peer,
                        detail: "peer presented another job token or communicator".into(),
                    });
                }
                let chunk = self.config.chunk_bytes;
                // Each end has its own flag: closing one end must not hide
                // frames already queued for the other; the other end learns
                // of the close when the channels disconnect, after draining.
                let closed = Arc::new(AtomicBool::new(false));
                let sender = MemSender {
                    peer,
                    chunk,
                    free: offer.a2c_free,
                    out: offer.a2c_filled,
                    abort: self.abort.clone(),
                    closed: closed.clone(),
                };
                let receiver = MemReceiver {
                    peer,
                    chunk,
                    filled: offer.c2a_filled,
                    free: offer.c2a_free,
                    abort: self.abort.clone(),
                    closed,
                };
                return Ok(self.connection(peer, sender, receiver));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            select! {
                recv(self.inbox) -> offer => match offer {
                    Ok(offer) => lock(&self.early).push(offer),
                    Err(_) => return Err(TransportError::Aborted),
                },
                recv(self.abort.receiver()) -> _ => return Err(TransportError::Aborted),
                default(remaining) => return Err(TransportError::Timeout {
                    peer,
                    what: "a connection",
                    waited_ms: elapsed_ms(start),
                }),
            }
        }
    }
}

struct MemCloser {
    closed: Arc<AtomicBool>,
}

impl ConnectionCloser for MemCloser {
    fn close_with_failure(&self, _failed_rank: usize, _reason: &str) {
        self.close();
    }
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

struct MemSender {
    peer: usize,
    chunk: usize,
    free: Receiver<Vec<u64>>,
    out: Sender<Filled>,
    abort: AbortSignal,
    closed: Arc<AtomicBool>,
}

struct MemReceiver {
    peer: usize,
    chunk: usize,
    filled: Receiver<Filled>,
    free: Sender<Vec<u64>>,
    abort: AbortSignal,
    closed: Arc<AtomicBool>,
}

fn closed_error(peer: usize) -> TransportError {
    TransportError::PeerClosed {
        peer,
        detail: "peer dropped the connection".into(),
    }
}

impl SlotSender for MemSender {
    fn chunk_bytes(&self) -> usize {
        self.chunk
    }

    fn send_with(
        &mut self,
        mut header: FrameHeader,
        deadline: Instant,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), TransportError> {
        let start = Instant::now();
        let peer = self.peer;
        if self.closed.load(Ordering::SeqCst) {
            return Err(closed_error(peer));
        }
        let remaining = deadline.saturating_duration_since(start);
        let mut buf = select! {
            recv(self.free) -> b => b.map_err(|_| closed_error(peer))?,
            recv(self.abort.receiver()) -> _ => return Err(TransportError::Aborted),
            default(remaining) => return Err(TransportError::Timeout { peer, what: "a free send slot", waited_ms: elapsed_ms(start) }),
        };
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
        let n = fill(&mut bytes[..self.chunk]).min(self.chunk);
        header.len = n as u32;
        header.kind = FrameKind::Data;
        self.out.send((header, buf)).map_err(|_| closed_error(peer))
    }
}

impl SlotReceiver for MemReceiver {
    fn peer(&self) -> usize {
        self.peer
    }

    fn chunk_bytes(&self) -> usize {
        self.chunk
    }

    fn recv_with(
        &mut self,
        deadline: Instant,
        consume: &mut crate::Consume<'_>,
    ) -> Result<(), TransportError> {
        let start = Instant::now();
        let peer = self.peer;
        if self.closed.load(Ordering::SeqCst) {
            return Err(closed_error(peer));
        }
        let remaining = deadline.saturating_duration_since(start);
        let (header, buf) = select! {
            recv(self.filled) -> f => f.map_err(|_| closed_error(peer))?,
            recv(self.abort.receiver()) -> _ => return Err(TransportError::Aborted),
            default(remaining) => return Err(TransportError::Timeout { peer, what: "data", waited_ms: elapsed_ms(start) }),
        };
        let bytes: &[u8] = bytemuck::cast_slice(&buf);
        let result = consume(&header, &bytes[..header.len as usize]);
        // The peer may be gone; then nobody needs the slot back.
        let _ = self.free.send(buf);
        result
    }
}
