//! An in-process transport: the slot FIFO as two crossbeam channels per
//! direction (free slots, filled slots). Ranks must live in one process
//! (threads). It exists to test executors and algorithms without sockets and
//! as the reference behaviour of the slot FIFO (it passes the same
//! conformance cases as shm and tcp); it never crosses a process.
//!
//! Endings travel as one-shot flags (an [`AbortHandle`] each, which wakes
//! every wait that includes it): a failure report ends both ends of the
//! connection at once; a local close ends this end's halves and tells the
//! peer, whose receiver drains what was sent before it; dropping a half
//! disconnects its channels, which the peer sees after draining.

use crate::{
    elapsed_ms, lock, AbortHandle, AbortSignal, Arrivals, Connection, ConnectionCloser,
    FifoDescriptor, FrameHeader, FrameKind, HostInfo, HostPath, ListenConfig, Listener, MemoryKind,
    SlotReceiver, SlotSender, Transport, TransportError,
};
use crossbeam_channel::{select, Receiver, Sender, TryRecvError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

type Filled = (FrameHeader, Vec<u64>);

/// Most bytes of a failure reason passed on (as shm keeps).
const MAX_REASON_BYTES: usize = 256;

/// A one-shot flag whose firing wakes every wait that includes its
/// receiver. Shared by `Arc` with everything that waits on it: dropping
/// the handle would wake them too, as if it had fired.
#[derive(Debug)]
struct Flag {
    handle: AbortHandle,
    signal: AbortSignal,
}

impl Flag {
    fn new() -> Self {
        let handle = AbortHandle::new();
        Flag {
            signal: handle.signal(),
            handle,
        }
    }

    fn fire(&self) {
        self.handle.abort();
    }

    fn fired(&self) -> bool {
        self.signal.is_fired()
    }

    fn receiver(&self) -> &Receiver<()> {
        self.signal.receiver()
    }
}

/// What both ends of one connection share: the first failure reported on
/// it, by either end.
#[derive(Debug)]
struct Link {
    failure: Mutex<Option<(usize, String)>>,
    /// Fired once `failure` is set.
    failed: Flag,
}

impl Link {
    fn new() -> Self {
        Link {
            failure: Mutex::new(None),
            failed: Flag::new(),
        }
    }

    fn error(&self) -> Option<TransportError> {
        if !self.failed.fired() {
            return None;
        }
        lock(&self.failure)
            .clone()
            .map(|(rank, reason)| TransportError::PeerFailed { rank, reason })
    }
}

/// What the two ends of one direction share: whether either end closed it.
#[derive(Debug)]
struct Direction {
    /// The sending end closed: nothing more comes after what is queued.
    sender_closed: Flag,
    /// The receiving end closed: nothing more will be taken.
    receiver_closed: Flag,
}

impl Direction {
    fn new() -> Arc<Self> {
        Arc::new(Direction {
            sender_closed: Flag::new(),
            receiver_closed: Flag::new(),
        })
    }
}

/// The acceptor's halves, handed over by `connect`.
struct Offer {
    token: u64,
    comm_id: u64,
    link: Arc<Link>,
    /// Connector -> acceptor: filled slots, and where to return them.
    c2a_filled: Receiver<Filled>,
    c2a_free: Sender<Vec<u64>>,
    c2a: Arc<Direction>,
    /// Acceptor -> connector: free slots, and where to publish them.
    a2c_free: Receiver<Vec<u64>>,
    a2c_filled: Sender<Filled>,
    a2c: Arc<Direction>,
}

/// Every listener's inbox of offers (with the connecting rank), by id.
type Registry = Mutex<HashMap<u64, Sender<(usize, Offer)>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
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
            arrivals: Arrivals::new(rx),
        }))
    }
}

struct MemListener {
    id: u64,
    config: ListenConfig,
    abort: AbortSignal,
    /// Offers by the connecting rank.
    arrivals: Arrivals<Offer>,
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

/// One end's channels and signals, before they become halves.
struct EndParts {
    peer: usize,
    link: Arc<Link>,
    free: Receiver<Vec<u64>>,
    out: Sender<Filled>,
    out_dir: Arc<Direction>,
    filled: Receiver<Filled>,
    release: Sender<Vec<u64>>,
    in_dir: Arc<Direction>,
}

impl MemListener {
    fn connection(&self, parts: EndParts) -> Connection {
        let EndParts {
            peer,
            link,
            free,
            out,
            out_dir,
            filled,
            release,
            in_dir,
        } = parts;
        let chunk = self.config.chunk_bytes;
        let closed = Arc::new(Flag::new());
        let ends = Ends {
            peer,
            abort: self.abort.clone(),
            link: link.clone(),
            closed: closed.clone(),
        };
        let sender = MemSender {
            ends: ends.clone(),
            chunk,
            free,
            out,
            dir: out_dir.clone(),
            spare: None,
        };
        let receiver = MemReceiver {
            ends,
            chunk,
            filled,
            free: release,
            dir: in_dir.clone(),
        };
        // Slots are buffers handed through channels, with no fixed place.
        let fifo = FifoDescriptor::internal(
            MemoryKind::HostPrivate,
            self.config.steps,
            self.config.chunk_bytes,
        );
        Connection {
            peer,
            transport: "mem",
            send_fifo: fifo,
            recv_fifo: fifo,
            host: Some(HostPath {
                sender: Box::new(sender),
                receiver: Box::new(receiver),
            }),
            closer: Arc::new(MemCloser {
                link,
                closed,
                out_dir,
                in_dir,
            }),
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
        let (link, c2a, a2c) = (Arc::new(Link::new()), Direction::new(), Direction::new());
        target
            .send((
                self.config.rank,
                Offer {
                    token: self.config.token,
                    comm_id: self.config.comm_id,
                    link: link.clone(),
                    c2a_filled: c2a_filled_rx,
                    c2a_free: c2a_free_tx,
                    c2a: c2a.clone(),
                    a2c_free: a2c_free_rx,
                    a2c_filled: a2c_filled_tx,
                    a2c: a2c.clone(),
                },
            ))
            .map_err(|_| TransportError::Connect {
                peer,
                detail: "in-process listener is gone".into(),
            })?;
        Ok(self.connection(EndParts {
            peer,
            link,
            free: c2a_free_rx,
            out: c2a_filled_tx,
            out_dir: c2a,
            filled: a2c_filled_rx,
            release: a2c_free_tx,
            in_dir: a2c,
        }))
    }

    fn accept(&self, peer: usize, deadline: Instant) -> Result<Connection, TransportError> {
        let offer = self.arrivals.take(peer, deadline, &self.abort)?;
        if offer.token != self.config.token || offer.comm_id != self.config.comm_id {
            return Err(TransportError::Connect {
                peer,
                detail: "peer presented another job token or communicator".into(),
            });
        }
        Ok(self.connection(EndParts {
            peer,
            link: offer.link,
            free: offer.a2c_free,
            out: offer.a2c_filled,
            out_dir: offer.a2c,
            filled: offer.c2a_filled,
            release: offer.c2a_free,
            in_dir: offer.c2a,
        }))
    }
}

struct MemCloser {
    link: Arc<Link>,
    /// This end's local close.
    closed: Arc<Flag>,
    out_dir: Arc<Direction>,
    in_dir: Arc<Direction>,
}

impl ConnectionCloser for MemCloser {
    fn close_with_failure(&self, failed_rank: usize, reason: &str) {
        let mut cut = reason.len().min(MAX_REASON_BYTES);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        lock(&self.link.failure).get_or_insert_with(|| (failed_rank, reason[..cut].to_owned()));
        self.link.failed.fire();
    }

    fn close(&self) {
        self.closed.fire();
        self.out_dir.sender_closed.fire();
        self.in_dir.receiver_closed.fire();
    }
}

/// What both halves of one end watch.
#[derive(Clone)]
struct Ends {
    peer: usize,
    abort: AbortSignal,
    link: Arc<Link>,
    /// This end was closed locally.
    closed: Arc<Flag>,
}

impl Ends {
    /// Errors that end a half at once, queued frames or not.
    fn fatal(&self) -> Option<TransportError> {
        if self.abort.is_fired() {
            return Some(TransportError::Aborted);
        }
        if let Some(err) = self.link.error() {
            return Some(err);
        }
        self.closed.fired().then(|| {
            TransportError::Io(format!(
                "connection to rank {} was closed locally",
                self.peer
            ))
        })
    }
}

struct MemSender {
    ends: Ends,
    chunk: usize,
    free: Receiver<Vec<u64>>,
    out: Sender<Filled>,
    /// Its `receiver_closed`: the peer closed its receiving end.
    dir: Arc<Direction>,
    /// A free slot taken for a frame that was refused, used next.
    spare: Option<Vec<u64>>,
}

struct MemReceiver {
    ends: Ends,
    chunk: usize,
    filled: Receiver<Filled>,
    free: Sender<Vec<u64>>,
    /// Its `sender_closed`: the peer closed its sending end.
    dir: Arc<Direction>,
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
        let peer = self.ends.peer;
        if let Some(err) = self.ends.fatal() {
            return Err(err);
        }
        if self.dir.receiver_closed.fired() {
            return Err(closed_error(peer));
        }
        let mut buf = match self.spare.take() {
            Some(buf) => buf,
            None => {
                let remaining = deadline.saturating_duration_since(start);
                let ends = &self.ends;
                let ended = || ends.fatal().unwrap_or_else(|| closed_error(peer));
                select! {
                    recv(self.free) -> b => b.map_err(|_| closed_error(peer))?,
                    // A dropped abort handle reads as an abort.
                    recv(ends.abort.receiver()) -> _ => return Err(TransportError::Aborted),
                    recv(ends.link.failed.receiver()) -> _ => return Err(ended()),
                    recv(ends.closed.receiver()) -> _ => return Err(ended()),
                    recv(self.dir.receiver_closed.receiver()) -> _ => return Err(ended()),
                    default(remaining) => return Err(TransportError::Timeout { peer, what: "a free send slot", waited_ms: elapsed_ms(start) }),
                }
            }
        };
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf);
        let n = fill(&mut bytes[..self.chunk]);
        if n > self.chunk {
            self.spare = Some(buf);
            return Err(TransportError::Io(format!(
                "fill wrote {n} bytes into a {}-byte slot for rank {peer}",
                self.chunk
            )));
        }
        header.len = n as u32;
        header.kind = FrameKind::Data;
        self.out.send((header, buf)).map_err(|_| closed_error(peer))
    }
}

impl MemReceiver {
    /// The next frame: queued ones first (unless a fatal error came), then
    /// waiting for one until `deadline`.
    fn next(&mut self, start: Instant, deadline: Instant) -> Result<Filled, TransportError> {
        let peer = self.ends.peer;
        loop {
            if let Some(err) = self.ends.fatal() {
                return Err(err);
            }
            match self.filled.try_recv() {
                Ok(frame) => return Ok(frame),
                Err(TryRecvError::Disconnected) => return Err(closed_error(peer)),
                Err(TryRecvError::Empty) => {}
            }
            // Set after the sender's last frame was queued: nothing follows.
            if self.dir.sender_closed.fired() {
                return Err(closed_error(peer));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let ends = &self.ends;
            select! {
                recv(self.filled) -> f => return f.map_err(|_| closed_error(peer)),
                // A dropped abort handle reads as an abort.
                recv(ends.abort.receiver()) -> _ => return Err(TransportError::Aborted),
                // Each of these is looked at again at the top of the loop.
                recv(ends.link.failed.receiver()) -> _ => {}
                recv(ends.closed.receiver()) -> _ => {}
                recv(self.dir.sender_closed.receiver()) -> _ => {}
                default(remaining) => return Err(TransportError::Timeout { peer, what: "data", waited_ms: elapsed_ms(start) }),
            }
        }
    }
}

impl SlotReceiver for MemReceiver {
    fn peer(&self) -> usize {
        self.ends.peer
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
        let (header, buf) = self.next(start, deadline)?;
        let bytes: &[u8] = bytemuck::cast_slice(&buf);
        let result = consume(&header, &bytes[..header.len as usize]);
        // The peer may be gone; then nobody needs the slot back.
        let _ = self.free.send(buf);
        result
    }
}
