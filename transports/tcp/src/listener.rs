//! The listening endpoint: binding and publishing an address, the accept
//! thread and its handshakes (which file good sockets by peer rank and
//! socket index), and both ends of connection set-up (`connect` opens and
//! handshakes the sockets, `accept` collects them). What happens on an
//! established connection is `connection`'s business.

use crate::connection;
use crate::handshake::{Expected, Hello, Status, HELLO_BYTES};
use crate::iface;
use crate::MAX_NSOCKS;
use crossbeam_channel::{select, Receiver, Sender};
use ferroccl_transport::{
    elapsed_ms, lock, AbortSignal, Connection, ListenConfig, Listener, TransportError,
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest a handshake may take on either side; a silent or slow client
/// holds nothing but its own handshake thread for that long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Handshakes in progress at once; more incoming sockets are dropped.
const MAX_PENDING_HANDSHAKES: usize = 64;
/// Backlog of the listening socket.
const BACKLOG: i32 = 1024;
/// Longest single connect attempt; refused attempts are retried.
const CONNECT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// A handshaken socket waiting for `accept`.
struct Filed {
    index: usize,
    socket: Socket,
}

type PeerQueue = (Sender<Filed>, Receiver<Filed>);

/// What the accept thread, the handshake threads and `accept` share.
struct AcceptShared {
    expected: Expected,
    stopping: AtomicBool,
    queues: Mutex<HashMap<usize, PeerQueue>>,
    pending_handshakes: AtomicUsize,
}

impl AcceptShared {
    fn queue(&self, peer: usize) -> PeerQueue {
        lock(&self.queues)
            .entry(peer)
            .or_insert_with(crossbeam_channel::unbounded)
            .clone()
    }
}

/// A bound TCP endpoint: publishes `ip:port`, accepts handshaken sockets on
/// a background thread, and opens connections to peers.
pub struct TcpListener {
    rank: usize,
    size: usize,
    token: u64,
    comm_id: u64,
    chunk_bytes: usize,
    steps: usize,
    nsocks: usize,
    socket_buffer_bytes: Option<usize>,
    abort: AbortSignal,
    published: SocketAddr,
    /// Where to connect to wake the accept thread if shutting the listening
    /// socket down does not.
    wake_addr: SocketAddr,
    listen_socket: Socket,
    shared: Arc<AcceptShared>,
    accept_thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpListener")
            .field("rank", &self.rank)
            .field("published", &self.published)
            .finish()
    }
}

fn check_config(config: &ListenConfig) -> Result<(), String> {
    if config.size == 0 || config.rank >= config.size {
        return Err(format!("rank {} of {} ranks", config.rank, config.size));
    }
    if config.chunk_bytes == 0 || u32::try_from(config.chunk_bytes).is_err() {
        return Err(format!(
            "chunk_bytes {} must be between 1 and {}",
            config.chunk_bytes,
            u32::MAX
        ));
    }
    if config.steps == 0 || u32::try_from(config.steps).is_err() {
        return Err(format!("steps {} must be at least 1", config.steps));
    }
    if config.nsocks == 0 || config.nsocks > MAX_NSOCKS {
        return Err(format!(
            "nsocks {} must be between 1 and {MAX_NSOCKS}",
            config.nsocks
        ));
    }
    Ok(())
}

/// The address to bind and the address to publish, for `config`'s bind
/// address or interface filter (FERROCCL_SOCKET_IFNAME), else the first
/// up non-loopback interface. Other transports that bootstrap over a
/// socket (ib) use it too, so that every socket of a job picks alike.
pub fn choose_addresses(config: &ListenConfig) -> Result<(IpAddr, IpAddr), TransportError> {
    let interfaces = || {
        iface::interface_addrs()
            .map_err(|e| TransportError::Io(format!("listing network interfaces: {e}")))
    };
    if let Some(ip) = config.bind_addr {
        if ip.is_unspecified() && ip.is_ipv4() {
            return Ok((ip, IpAddr::V4(iface::pick_default(&interfaces()?))));
        }
        return Ok((ip, ip));
    }
    if let Some(spec) = &config.ifname {
        let filter = iface::IfnameFilter::parse(spec);
        let found = iface::pick_by_filter(&interfaces()?, &filter).ok_or_else(|| {
            TransportError::Io(format!(
                "no up interface with an IPv4 address matches FERROCCL_SOCKET_IFNAME={spec:?}"
            ))
        })?;
        return Ok((IpAddr::V4(found), IpAddr::V4(found)));
    }
    Ok((
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V4(iface::pick_default(&interfaces()?)),
    ))
}

fn set_buffers(socket: &Socket, bytes: Option<usize>) {
    if let Some(bytes) = bytes {
        // The kernel caps these at net.core.{w,r}mem_max; a refusal only
        // costs bandwidth.
        if let Err(e) = socket.set_send_buffer_size(bytes) {
            tracing::debug!("SO_SNDBUF {bytes}: {e}");
        }
        if let Err(e) = socket.set_recv_buffer_size(bytes) {
            tracing::debug!("SO_RCVBUF {bytes}: {e}");
        }
    }
}

impl TcpListener {
    pub(crate) fn bind(
        config: &ListenConfig,
        abort: &AbortSignal,
        socket_buffer_bytes: Option<usize>,
    ) -> Result<Self, TransportError> {
        check_config(config)
            .map_err(|e| TransportError::Io(format!("invalid tcp listener configuration: {e}")))?;
        let (bind_ip, publish_ip) = choose_addresses(config)?;
        let io = |what: &str, e: std::io::Error| {
            TransportError::Io(format!("tcp listener on {bind_ip}: {what}: {e}"))
        };
        let bind_addr = SocketAddr::new(bind_ip, 0);
        let socket = Socket::new(
            Domain::for_address(bind_addr),
            Type::STREAM,
            Some(Protocol::TCP),
        )
        .map_err(|e| io("socket", e))?;
        socket
            .set_reuse_address(true)
            .map_err(|e| io("SO_REUSEADDR", e))?;
        // Accepted sockets inherit the buffer sizes, which must be set
        // before the connection opens for the window scale to follow.
        set_buffers(&socket, socket_buffer_bytes);
        socket
            .bind(&SockAddr::from(bind_addr))
            .map_err(|e| io("bind", e))?;
        socket.listen(BACKLOG).map_err(|e| io("listen", e))?;
        let port = socket
            .local_addr()
            .map_err(|e| io("local address", e))?
            .as_socket()
            .map(|a| a.port())
            .ok_or_else(|| TransportError::Io("listener has no IP address".into()))?;
        let published = SocketAddr::new(publish_ip, port);
        let wake_addr = if bind_ip.is_unspecified() {
            SocketAddr::new(
                match bind_ip {
                    IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
                },
                port,
            )
        } else {
            SocketAddr::new(bind_ip, port)
        };

        let shared = Arc::new(AcceptShared {
            expected: Expected {
                token: config.token,
                comm_id: config.comm_id,
                rank: config.rank,
                size: config.size,
                nsocks: config.nsocks,
                chunk_bytes: config.chunk_bytes,
                steps: config.steps,
            },
            stopping: AtomicBool::new(false),
            queues: Mutex::new(HashMap::new()),
            pending_handshakes: AtomicUsize::new(0),
        });
        let accept_socket = socket.try_clone().map_err(|e| io("dup", e))?;
        let thread_shared = shared.clone();
        let accept_thread = std::thread::Builder::new()
            .name("ferroccl-tcp-accept".into())
            .spawn(move || accept_loop(accept_socket, thread_shared))
            .map_err(|e| io("spawning the accept thread", e))?;
        tracing::info!(rank = config.rank, %published, bound = %bind_ip, "tcp listener ready");
        Ok(TcpListener {
            rank: config.rank,
            size: config.size,
            token: config.token,
            comm_id: config.comm_id,
            chunk_bytes: config.chunk_bytes,
            steps: config.steps,
            nsocks: config.nsocks,
            socket_buffer_bytes,
            abort: abort.clone(),
            published,
            wake_addr,
            listen_socket: socket,
            shared,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address peers connect to.
    pub fn published_addr(&self) -> SocketAddr {
        self.published
    }

    fn check_peer(&self, peer: usize) -> Result<(), TransportError> {
        if peer >= self.size || peer == self.rank {
            return Err(TransportError::Connect {
                peer,
                detail: format!(
                    "rank {} of {} cannot connect to rank {peer}",
                    self.rank, self.size
                ),
            });
        }
        Ok(())
    }

    /// Open one socket to `addr`, retrying while the peer is not listening
    /// yet, and handshake it as socket `index`.
    fn open_socket(
        &self,
        peer: usize,
        addr: SocketAddr,
        index: usize,
        deadline: Instant,
    ) -> Result<Socket, TransportError> {
        let start = Instant::now();
        let connect_err = |detail: String| TransportError::Connect { peer, detail };
        let mut backoff = Duration::from_millis(5);
        let socket = loop {
            if self.abort.is_fired() {
                return Err(TransportError::Aborted);
            }
            let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))
                .map_err(|e| TransportError::Io(format!("socket for rank {peer}: {e}")))?;
            set_buffers(&socket, self.socket_buffer_bytes);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(TransportError::Timeout {
                    peer,
                    what: "its listener to take a connection",
                    waited_ms: elapsed_ms(start),
                });
            }
            match socket.connect_timeout(&addr.into(), left.min(CONNECT_ATTEMPT_TIMEOUT)) {
                Ok(()) => break socket,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::ConnectionRefused | ErrorKind::TimedOut | ErrorKind::WouldBlock
                    ) =>
                {
                    tracing::trace!(peer, %addr, "connect attempt failed, retrying: {e}");
                    let pause = backoff.min(deadline.saturating_duration_since(Instant::now()));
                    select! {
                        recv(self.abort.receiver()) -> _ => return Err(TransportError::Aborted),
                        default(pause) => {},
                    }
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Err(e) => return Err(connect_err(format!("connecting to {addr}: {e}"))),
            }
        };
        socket
            .set_tcp_nodelay(true)
            .map_err(|e| connect_err(format!("TCP_NODELAY: {e}")))?;

        let hello = Hello {
            token: self.token,
            comm_id: self.comm_id,
            from_rank: self.rank as u32,
            to_rank: peer as u32,
            index: index as u32,
            nsocks: self.nsocks as u32,
            chunk_bytes: self.chunk_bytes as u64,
            steps: self.steps as u32,
        };
        let limit = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(1), HANDSHAKE_TIMEOUT);
        let set = socket
            .set_read_timeout(Some(limit))
            .and_then(|()| socket.set_write_timeout(Some(limit)));
        set.map_err(|e| connect_err(format!("handshake timeout: {e}")))?;
        let mut stream: TcpStream = socket
            .try_clone()
            .map_err(|e| connect_err(format!("dup: {e}")))?
            .into();
        let timed_out =
            |e: &std::io::Error| matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut);
        if let Err(e) = stream.write_all(&hello.encode()) {
            if timed_out(&e) {
                return Err(TransportError::Timeout {
                    peer,
                    what: "the handshake to be sent",
                    waited_ms: elapsed_ms(start),
                });
            }
            return Err(connect_err(format!("sending the handshake to {addr}: {e}")));
        }
        let mut answer = [0u8; 1];
        match stream.read(&mut answer) {
            Ok(1) => {}
            Ok(_) => {
                return Err(connect_err(format!(
                    "{addr} closed the connection during the handshake"
                )))
            }
            Err(e) if timed_out(&e) => {
                return Err(TransportError::Timeout {
                    peer,
                    what: "the handshake answer",
                    waited_ms: elapsed_ms(start),
                })
            }
            Err(e) => return Err(connect_err(format!("handshake with {addr}: {e}"))),
        }
        match Status::from_code(answer[0]) {
            Some(Status::Ok) => Ok(socket),
            Some(status) => Err(connect_err(format!("peer refused: {}", status.reason()))),
            None => Err(connect_err(format!(
                "{addr} answered the handshake with unknown status {}",
                answer[0]
            ))),
        }
    }
}

impl Listener for TcpListener {
    fn address(&self) -> Vec<u8> {
        self.published.to_string().into_bytes()
    }

    fn connect(
        &self,
        peer: usize,
        address: &[u8],
        deadline: Instant,
    ) -> Result<Connection, TransportError> {
        self.check_peer(peer)?;
        let addr: SocketAddr = std::str::from_utf8(address)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| TransportError::Connect {
                peer,
                detail: format!(
                    "address {:?} is not ip:port text",
                    String::from_utf8_lossy(&address[..address.len().min(64)])
                ),
            })?;
        let mut sockets = Vec::with_capacity(self.nsocks);
        for index in 0..self.nsocks {
            sockets.push(self.open_socket(peer, addr, index, deadline)?);
        }
        tracing::debug!(rank = self.rank, peer, %addr, nsocks = self.nsocks, "tcp connected");
        connection::establish(
            peer,
            sockets,
            self.chunk_bytes,
            self.steps,
            connection::spin_for(self.size),
            &self.abort,
        )
    }

    fn accept(&self, peer: usize, deadline: Instant) -> Result<Connection, TransportError> {
        self.check_peer(peer)?;
        let start = Instant::now();
        let (_, queue) = self.shared.queue(peer);
        let mut sockets: Vec<Option<Socket>> = (0..self.nsocks).map(|_| None).collect();
        let mut missing = self.nsocks;
        while missing > 0 {
            select! {
                recv(queue) -> filed => {
                    let Ok(filed) = filed else { continue };
                    // The handshake bounded the index by nsocks.
                    if sockets[filed.index].replace(filed.socket).is_some() {
                        tracing::warn!(peer, index = filed.index, "second socket with the same index; keeping the newer one");
                    } else {
                        missing -= 1;
                    }
                }
                recv(self.abort.receiver()) -> _ => return Err(TransportError::Aborted),
                default(deadline.saturating_duration_since(Instant::now())) => {
                    return Err(TransportError::Timeout {
                        peer,
                        what: "a connection",
                        waited_ms: elapsed_ms(start),
                    })
                }
            }
        }
        let sockets = sockets.into_iter().flatten().collect();
        tracing::debug!(rank = self.rank, peer, nsocks = self.nsocks, "tcp accepted");
        connection::establish(
            peer,
            sockets,
            self.chunk_bytes,
            self.steps,
            connection::spin_for(self.size),
            &self.abort,
        )
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // On Linux shutting a listening socket down wakes a blocked accept;
        // elsewhere a connection to ourselves does.
        if self.listen_socket.shutdown(Shutdown::Read).is_err() {
            let _ = std::net::TcpStream::connect_timeout(&self.wake_addr, Duration::from_secs(1));
        }
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
        lock(&self.shared.queues).clear();
    }
}

fn accept_loop(socket: Socket, shared: Arc<AcceptShared>) {
    loop {
        let accepted = socket.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let (client, from) = match accepted {
            Ok(pair) => pair,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors or a connection reset before accept:
                // pause rather than spin, then go on.
                tracing::warn!("tcp accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let from = from.as_socket();
        if shared.pending_handshakes.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES {
            shared.pending_handshakes.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(
                ?from,
                "too many handshakes in progress; dropping a connection"
            );
            continue;
        }
        let thread_shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("ferroccl-tcp-handshake".into())
            .stack_size(128 << 10)
            .spawn(move || {
                serve_handshake(client, from, &thread_shared);
                thread_shared
                    .pending_handshakes
                    .fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            shared.pending_handshakes.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(?from, "cannot spawn a handshake thread: {e}");
        }
    }
}

/// Read and judge one hello; file the socket if it passes.
fn serve_handshake(client: Socket, from: Option<SocketAddr>, shared: &AcceptShared) {
    let refuse = |status: Status, detail: &str| {
        tracing::warn!(
            ?from,
            "refused a tcp connection: {} {detail}",
            status.reason()
        );
    };
    let prepared = client
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .and_then(|()| client.set_write_timeout(Some(HANDSHAKE_TIMEOUT)))
        .and_then(|()| client.try_clone());
    let mut stream: TcpStream = match prepared {
        Ok(dup) => dup.into(),
        Err(e) => {
            tracing::warn!(?from, "cannot prepare an accepted socket: {e}");
            return;
        }
    };
    let mut raw = [0u8; HELLO_BYTES];
    match crate::wire::read_full(&mut stream, &mut raw) {
        Ok(HELLO_BYTES) => {}
        Ok(n) => {
            refuse(Status::BadMagic, &format!("(hello truncated at {n} bytes)"));
            return;
        }
        Err(e) => {
            refuse(Status::BadMagic, &format!("(no hello: {e})"));
            return;
        }
    }
    let verdict = Hello::decode(&raw).and_then(|hello| {
        hello.validate(&shared.expected)?;
        Ok(hello)
    });
    let status = match &verdict {
        Ok(_) => Status::Ok,
        Err(status) => *status,
    };
    if let Err(e) = stream.write_all(&[status.code()]) {
        tracing::warn!(?from, "cannot answer a handshake: {e}");
        return;
    }
    let hello = match verdict {
        Ok(hello) => hello,
        Err(status) => {
            let detail = Hello::decode(&raw)
                .map(|h| format!("(from rank {} for rank {})", h.from_rank, h.to_rank))
                .unwrap_or_default();
            refuse(status, &detail);
            return;
        }
    };
    if shared.stopping.load(Ordering::SeqCst) {
        return;
    }
    let (queue, _) = shared.queue(hello.from_rank as usize);
    let _ = queue.send(Filed {
        index: hello.index as usize,
        socket: client,
    });
}
