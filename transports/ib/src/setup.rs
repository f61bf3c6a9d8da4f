//! Connection set-up of the RDMA transport over a socket, for any verbs
//! implementation ([`Fabric`]): the real verbs, or the emulation.
//!
//! Each listener binds a TCP socket (the address choice of the TCP
//! transport: FERROCCL_SOCKET_IFNAME, else the first up interface) and
//! publishes `ip:port`. A background thread accepts and answers
//! handshakes at once, as a kernel's accept queue would, so a rank may
//! connect and send before its peer calls `accept`; `accept` takes the
//! finished connection.
//!
//! The handshake, both ways in one shape ([`Hello`]): job token,
//! communicator, ranks, geometry (slot bytes, slots, queue pairs), where
//! the sender's peer-written regions are ([`EndInfo`]), and one endpoint
//! per queue pair (the fabric's own bytes: on real verbs QP number, PSN,
//! LID, GID, MTU). The acceptor checks the connector's hello and answers
//! with its own or a refusal with the reason; each side then brings its
//! queue pairs up against the other's endpoints, and both exchange one
//! ready byte before the first clear-to-send entry is posted, so no write
//! reaches a queue pair that is not ready to receive. The socket is closed
//! afterwards: a dead peer shows as queue pairs in error, and the
//! communicator's heartbeats name a silent one.

use crate::conn::{self, EndInfo, EndParts, Geometry, LocalRegions, MAX_QPS};
use crate::verbs::{Device, QueuePair};
use ferroccl_transport::{
    AbortSignal, Arrivals, Connection, FifoDescriptor, HostInfo, HostPath, ListenConfig, Listener,
    MemoryKind, Transport, TransportError,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What connection set-up needs from a verbs implementation, besides the
/// data path's [`Device`] and [`QueuePair`].
pub trait Fabric: Send + Sync + 'static {
    /// A device's protection domain.
    type Dev: Device + Clone + Send + Sync + 'static;
    /// A connected queue pair's end.
    type Qp: QueuePair + Send + Sync + 'static;
    /// A queue pair created and not connected yet.
    type Prepared: Send + 'static;
    /// The transport's name (in connections, logs, FERROCCL_TRANSPORT).
    fn name(&self) -> &'static str;
    /// The device a listener of `config` uses.
    fn device(&self, config: &ListenConfig) -> Result<Self::Dev, String>;
    /// Creates a queue pair on `dev` with a send queue of `depth`: the
    /// prepared pair and its endpoint, to hand to the peer.
    fn prepare(&self, dev: &Self::Dev, depth: usize) -> Result<(Self::Prepared, Vec<u8>), String>;
    /// Connects a prepared queue pair to the peer's endpoint (on real
    /// verbs: INIT, RTR, RTS). `remote` comes from the wire: anything but
    /// a valid endpoint is an error, never a panic.
    fn connect(&self, prepared: Self::Prepared, remote: &[u8]) -> Result<Self::Qp, String>;
}

/// Magic of a hello.
const MAGIC: u32 = 0x4649_4231;
/// Most bytes of one endpoint on the wire.
const MAX_ENDPOINT: usize = 1024;
/// Answer bytes.
const ACCEPTED: u8 = 1;
const REFUSED: u8 = 0;
const READY: u8 = 0x52;
/// How long the acceptor side gives a handshake.
const ACCEPT_BOUND: Duration = Duration::from_secs(60);

/// One side's hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The sender's rank.
    pub rank: u32,
    /// The communicator's size.
    pub size: u32,
    /// Job token.
    pub token: u64,
    /// Communicator id.
    pub comm_id: u64,
    /// The geometry it uses.
    pub geometry: Geometry,
    /// Its peer-written regions.
    pub regions: EndInfo,
    /// Its queue pairs' endpoints: the `qps` it sends on, then the `qps`
    /// it receives on.
    pub endpoints: Vec<Vec<u8>>,
}

impl Hello {
    /// The wire form (little-endian).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&self.rank.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        out.extend_from_slice(&self.comm_id.to_le_bytes());
        out.extend_from_slice(&(self.geometry.chunk_bytes as u64).to_le_bytes());
        out.extend_from_slice(&(self.geometry.steps as u32).to_le_bytes());
        out.extend_from_slice(&(self.geometry.qps as u32).to_le_bytes());
        out.extend_from_slice(&self.regions.to_bytes());
        out.extend_from_slice(&(self.endpoints.len() as u32).to_le_bytes());
        for e in &self.endpoints {
            out.extend_from_slice(&(e.len() as u16).to_le_bytes());
            out.extend_from_slice(e);
        }
        out
    }

    /// Reads a hello from `r`, checking every length before it is used.
    pub fn read_from(r: &mut impl Read) -> Result<Self, String> {
        let mut fixed = [0u8; 44];
        read_exact(r, &mut fixed)?;
        let u32_at =
            |i: usize| u32::from_le_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]);
        let u64_at = |i: usize| u64::from(u32_at(i)) | (u64::from(u32_at(i + 4)) << 32);
        if u32_at(0) != MAGIC {
            return Err(format!(
                "not an RDMA set-up hello (magic {:#010x})",
                u32_at(0)
            ));
        }
        let geometry = Geometry {
            chunk_bytes: usize::try_from(u64_at(28)).unwrap_or(usize::MAX),
            steps: u32_at(36) as usize,
            qps: u32_at(40) as usize,
        };
        geometry.check()?;
        let mut regions = [0u8; EndInfo::BYTES];
        read_exact(r, &mut regions)?;
        let regions = EndInfo::from_bytes(&regions)?;
        let mut n = [0u8; 4];
        read_exact(r, &mut n)?;
        let n = u32::from_le_bytes(n) as usize;
        if n != 2 * geometry.qps {
            return Err(format!(
                "{n} queue-pair endpoints for {} queue pairs each way",
                geometry.qps
            ));
        }
        let mut endpoints = Vec::with_capacity(n);
        for _ in 0..n {
            let mut len = [0u8; 2];
            read_exact(r, &mut len)?;
            let len = u16::from_le_bytes(len) as usize;
            if len > MAX_ENDPOINT {
                return Err(format!("an endpoint of {len} bytes"));
            }
            let mut e = vec![0u8; len];
            read_exact(r, &mut e)?;
            endpoints.push(e);
        }
        Ok(Hello {
            rank: u32_at(4),
            size: u32_at(8),
            token: u64_at(12),
            comm_id: u64_at(20),
            geometry,
            regions,
            endpoints,
        })
    }
}

fn read_exact(r: &mut impl Read, buf: &mut [u8]) -> Result<(), String> {
    r.read_exact(buf).map_err(|e| e.to_string())
}

/// The RDMA transport on fabric `F`, with connection set-up over a socket.
pub struct NetTransport<F: Fabric> {
    fabric: Arc<F>,
    qps: usize,
}

impl<F: Fabric> NetTransport<F> {
    /// With `qps` queue pairs per direction of each connection (1..=16).
    pub fn new(fabric: F, qps: usize) -> Self {
        NetTransport {
            fabric: Arc::new(fabric),
            qps,
        }
    }
}

impl<F: Fabric> Transport for NetTransport<F> {
    fn name(&self) -> &'static str {
        self.fabric.name()
    }

    fn can_connect(&self, _local: &HostInfo, _peer: &HostInfo) -> bool {
        true
    }

    fn listen(
        &self,
        config: &ListenConfig,
        abort: &AbortSignal,
    ) -> Result<Box<dyn Listener>, TransportError> {
        let name = self.fabric.name();
        let geometry = Geometry {
            chunk_bytes: config.chunk_bytes,
            steps: config.steps,
            qps: self.qps,
        };
        geometry.check().map_err(|detail| {
            TransportError::Io(format!(
                "{name}: {detail} (queue pairs: FERROCCL_IB_QPS_PER_CONNECTION, 1..={MAX_QPS})"
            ))
        })?;
        let dev = self
            .fabric
            .device(config)
            .map_err(|e| TransportError::Io(format!("{name}: opening the RDMA device: {e}")))?;
        let (bind, publish) = ferroccl_tcp::choose_addresses(config)?;
        let socket = std::net::TcpListener::bind(SocketAddr::new(bind, 0))
            .and_then(|s| s.set_nonblocking(true).map(|()| s))
            .map_err(|e| TransportError::Io(format!("{name}: binding the set-up socket: {e}")))?;
        let port = socket
            .local_addr()
            .map_err(|e| TransportError::Io(e.to_string()))?
            .port();
        let (tx, rx) = crossbeam_channel::unbounded();
        let stop = Arc::new(AtomicBool::new(false));
        let side = Side {
            fabric: Arc::clone(&self.fabric),
            config: config.clone(),
            geometry,
            dev,
            abort: abort.clone(),
        };
        {
            let side = side.clone();
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name(format!("{name}-accept-{}", config.rank))
                .spawn(move || side.serve(socket, &stop, &tx))
                .map_err(|e| TransportError::Io(format!("{name}: set-up thread: {e}")))?;
        }
        Ok(Box::new(NetListener {
            side,
            address: SocketAddr::new(publish, port).to_string(),
            ready: Arrivals::new(rx),
            stop,
        }))
    }
}

/// What both the listener and its accepting thread know.
struct Side<F: Fabric> {
    fabric: Arc<F>,
    config: ListenConfig,
    geometry: Geometry,
    dev: F::Dev,
    abort: AbortSignal,
}

impl<F: Fabric> Clone for Side<F> {
    fn clone(&self) -> Self {
        Side {
            fabric: Arc::clone(&self.fabric),
            config: self.config.clone(),
            geometry: self.geometry,
            dev: self.dev.clone(),
            abort: self.abort.clone(),
        }
    }
}

type Finished = (usize, Result<Connection, TransportError>);
/// An end's connected queue pairs: those it sends on, those it receives on.
type Pairs<F> = (Vec<<F as Fabric>::Qp>, Vec<<F as Fabric>::Qp>);

impl<F: Fabric> Side<F> {
    fn hello(&self, regions: &LocalRegions, endpoints: Vec<Vec<u8>>) -> Hello {
        Hello {
            rank: self.config.rank as u32,
            size: self.config.size as u32,
            token: self.config.token,
            comm_id: self.config.comm_id,
            geometry: self.geometry,
            regions: regions.info(),
            endpoints,
        }
    }

    /// Why this side refuses `hello`, if it does.
    fn refusal(&self, hello: &Hello) -> Option<String> {
        if hello.token != self.config.token || hello.comm_id != self.config.comm_id {
            return Some("it belongs to another job token or communicator".into());
        }
        if hello.size as usize != self.config.size
            || hello.rank as usize >= self.config.size
            || hello.rank as usize == self.config.rank
        {
            return Some(format!(
                "rank {} of {} does not fit this communicator (rank {} of {})",
                hello.rank, hello.size, self.config.rank, self.config.size
            ));
        }
        (hello.geometry != self.geometry).then(|| {
            format!(
                "its connection geometry {:?} differs from {:?}",
                hello.geometry, self.geometry
            )
        })
    }

    /// Registers this end's regions and prepares its queue pairs: the
    /// `qps` it sends on, then the `qps` it receives on.
    #[allow(clippy::type_complexity)]
    fn prepare(&self) -> Result<(LocalRegions, Vec<F::Prepared>, Vec<Vec<u8>>), String> {
        let regions = LocalRegions::register(&self.dev, &self.geometry)
            .map_err(|e| format!("registering memory: {e}"))?;
        let mut prepared = Vec::new();
        let mut endpoints = Vec::new();
        for _ in 0..2 * self.geometry.qps {
            match self.fabric.prepare(&self.dev, self.geometry.queue_depth()) {
                Ok((p, e)) => {
                    prepared.push(p);
                    endpoints.push(e);
                }
                Err(e) => {
                    regions.deregister(&self.dev);
                    return Err(format!("creating a queue pair: {e}"));
                }
            }
        }
        Ok((regions, prepared, endpoints))
    }

    /// Connects this end's prepared queue pairs to the peer's endpoints:
    /// this end's sending pair `i` to the peer's receiving pair `i`, and
    /// the other way round.
    fn connect_qps(
        &self,
        prepared: Vec<F::Prepared>,
        theirs: &[Vec<u8>],
    ) -> Result<Pairs<F>, String> {
        let q = self.geometry.qps;
        let mut out = Vec::with_capacity(q);
        let mut inq = Vec::with_capacity(q);
        for (i, p) in prepared.into_iter().enumerate() {
            if i < q {
                out.push(self.fabric.connect(p, &theirs[q + i])?);
            } else {
                inq.push(self.fabric.connect(p, &theirs[i - q])?);
            }
        }
        Ok((out, inq))
    }

    fn connection(
        &self,
        peer: usize,
        regions: LocalRegions,
        remote: EndInfo,
        out_qps: Vec<F::Qp>,
        in_qps: Vec<F::Qp>,
    ) -> Result<Connection, TransportError> {
        let g = self.geometry;
        let fifo = |rkey, remote_addr| FifoDescriptor {
            slot_stride: g.stride(),
            ..FifoDescriptor::internal(
                MemoryKind::Registered { rkey, remote_addr },
                g.steps,
                g.chunk_bytes,
            )
        };
        let send_fifo = fifo(remote.slots.rkey, remote.slots.addr);
        let recv_fifo = fifo(regions.slots.rkey, regions.slots.addr);
        let (sender, receiver, closer) = conn::open(EndParts {
            rank: self.config.rank,
            peer,
            geometry: g,
            dev: self.dev.clone(),
            regions,
            remote,
            out_qps,
            in_qps,
            abort: self.abort.clone(),
        })?;
        Ok(Connection {
            peer,
            transport: self.fabric.name(),
            send_fifo,
            recv_fifo,
            host: Some(HostPath {
                sender: Box::new(sender),
                receiver: Box::new(receiver),
            }),
            closer,
        })
    }

    /// The accepting thread: answers every handshake on a thread of its
    /// own until the listener is dropped or the communicator aborts.
    fn serve(
        &self,
        socket: std::net::TcpListener,
        stop: &AtomicBool,
        done: &crossbeam_channel::Sender<Finished>,
    ) {
        while !stop.load(Ordering::Acquire) && !self.abort.is_fired() {
            match socket.accept() {
                Ok((stream, _)) => {
                    let side = self.clone();
                    let done = done.clone();
                    let _ = std::thread::Builder::new()
                        .name(format!("{}-handshake", self.fabric.name()))
                        .spawn(move || {
                            if let Some(finished) = side.answer(stream) {
                                let _ = done.send(finished);
                            }
                        });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => {
                    tracing::debug!("{}: accepting a set-up connection: {e}", self.fabric.name());
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// One incoming handshake; None where the peer could not even say who
    /// it is (nothing to report to an `accept`).
    fn answer(&self, mut stream: TcpStream) -> Option<Finished> {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(ACCEPT_BOUND));
        let _ = stream.set_write_timeout(Some(ACCEPT_BOUND));
        let _ = stream.set_nodelay(true);
        let hello = match Hello::read_from(&mut stream) {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!("{}: a bad set-up hello: {e}", self.fabric.name());
                return None;
            }
        };
        let peer = hello.rank as usize;
        if let Some(reason) = self.refusal(&hello) {
            let mut no = vec![REFUSED];
            no.extend_from_slice(&(reason.len() as u16).to_le_bytes());
            no.extend_from_slice(reason.as_bytes());
            let _ = stream.write_all(&no);
            tracing::debug!("{}: refused rank {peer}: {reason}", self.fabric.name());
            return None;
        }
        let fail = |detail: String| Some((peer, Err(TransportError::Connect { peer, detail })));
        let (regions, prepared, endpoints) = match self.prepare() {
            Ok(p) => p,
            Err(e) => return fail(e),
        };
        let mut yes = vec![ACCEPTED];
        yes.extend_from_slice(&self.hello(&regions, endpoints).to_bytes());
        let result = stream
            .write_all(&yes)
            .map_err(|e| format!("answering its hello: {e}"))
            .and_then(|()| self.connect_qps(prepared, &hello.endpoints))
            .and_then(|qps| ready(&mut stream).map(|()| qps));
        match result {
            Ok((out, inq)) => Some((
                peer,
                self.connection(peer, regions, hello.regions, out, inq),
            )),
            Err(e) => {
                regions.deregister(&self.dev);
                fail(e)
            }
        }
    }
}

/// Says ready and waits for the peer's ready.
fn ready(stream: &mut TcpStream) -> Result<(), String> {
    stream
        .write_all(&[READY])
        .map_err(|e| format!("saying ready: {e}"))?;
    let mut b = [0u8; 1];
    stream
        .read_exact(&mut b)
        .map_err(|e| format!("waiting for its ready: {e}"))?;
    if b[0] != READY {
        return Err(format!("a ready byte of {:#04x}", b[0]));
    }
    Ok(())
}

struct NetListener<F: Fabric> {
    side: Side<F>,
    address: String,
    /// Connections the accepting thread finished, by peer.
    ready: Arrivals<Result<Connection, TransportError>>,
    stop: Arc<AtomicBool>,
}

impl<F: Fabric> Drop for NetListener<F> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl<F: Fabric> Listener for NetListener<F> {
    fn address(&self) -> Vec<u8> {
        self.address.as_bytes().to_vec()
    }

    fn connect(
        &self,
        peer: usize,
        address: &[u8],
        deadline: Instant,
    ) -> Result<Connection, TransportError> {
        let side = &self.side;
        let refuse = |detail: String| TransportError::Connect { peer, detail };
        let addr: SocketAddr = std::str::from_utf8(address)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| refuse(format!("bad set-up address {address:?}")))?;
        let remaining = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let mut stream = TcpStream::connect_timeout(&addr, remaining())
            .map_err(|e| refuse(format!("connecting to its set-up socket {addr}: {e}")))?;
        let _ = stream.set_read_timeout(Some(remaining()));
        let _ = stream.set_write_timeout(Some(remaining()));
        let _ = stream.set_nodelay(true);
        let (regions, prepared, endpoints) = side.prepare().map_err(refuse)?;
        let handshake = || -> Result<(Hello, Pairs<F>), String> {
            stream
                .write_all(&side.hello(&regions, endpoints).to_bytes())
                .map_err(|e| format!("sending its hello: {e}"))?;
            let mut answer = [0u8; 1];
            read_exact(&mut stream, &mut answer)?;
            if answer[0] != ACCEPTED {
                let mut len = [0u8; 2];
                read_exact(&mut stream, &mut len)?;
                let mut why = vec![0u8; u16::from_le_bytes(len) as usize];
                read_exact(&mut stream, &mut why)?;
                return Err(format!("refused: {}", String::from_utf8_lossy(&why)));
            }
            let theirs = Hello::read_from(&mut stream)?;
            if theirs.rank as usize != peer {
                return Err(format!("rank {} answered for rank {peer}", theirs.rank));
            }
            if let Some(reason) = side.refusal(&theirs) {
                return Err(reason);
            }
            let pairs = side.connect_qps(prepared, &theirs.endpoints)?;
            ready(&mut stream)?;
            Ok((theirs, pairs))
        };
        match handshake() {
            Ok((theirs, (out, inq))) => side.connection(peer, regions, theirs.regions, out, inq),
            Err(e) => {
                regions.deregister(&side.dev);
                Err(refuse(e))
            }
        }
    }

    fn accept(&self, peer: usize, deadline: Instant) -> Result<Connection, TransportError> {
        self.ready.take(peer, deadline, &self.side.abort)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::RemoteRegion;

    fn hello() -> Hello {
        let r = |k| RemoteRegion {
            rkey: k,
            addr: u64::from(k) << 20,
            len: 4096,
        };
        Hello {
            rank: 3,
            size: 8,
            token: 0xfeed,
            comm_id: 77,
            geometry: Geometry {
                chunk_bytes: 1 << 19,
                steps: 8,
                qps: 2,
            },
            regions: EndInfo {
                slots: r(1),
                cts: r(2),
                fail: r(3),
            },
            endpoints: vec![vec![1, 2, 3], vec![], vec![9; 40], vec![7]],
        }
    }

    #[test]
    fn a_hello_round_trips() {
        let h = hello();
        let bytes = h.to_bytes();
        assert_eq!(Hello::read_from(&mut &bytes[..]), Ok(h));
    }

    #[test]
    fn a_cut_or_wrong_hello_is_an_error_not_a_panic() {
        let bytes = hello().to_bytes();
        for cut in 0..bytes.len() {
            assert!(
                Hello::read_from(&mut &bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut bad = bytes.clone();
        bad[0] ^= 1;
        assert!(Hello::read_from(&mut &bad[..])
            .unwrap_err()
            .contains("magic"));
        // Three endpoints for two queue pairs each way.
        let mut h = hello();
        h.endpoints.pop();
        assert!(Hello::read_from(&mut &h.to_bytes()[..])
            .unwrap_err()
            .contains("endpoints"));
        // A geometry out of bounds.
        let mut h = hello();
        h.geometry.qps = 0;
        h.endpoints.clear();
        assert!(Hello::read_from(&mut &h.to_bytes()[..]).is_err());
        // An endpoint claiming more than the bound.
        let mut h = hello();
        h.endpoints[0] = vec![0; MAX_ENDPOINT + 1];
        assert!(Hello::read_from(&mut &h.to_bytes()[..])
            .unwrap_err()
            .contains("endpoint of"));
    }
}
