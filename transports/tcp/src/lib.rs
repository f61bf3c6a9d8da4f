//! TCP transport of ferroccl: the slot FIFO of `ferroccl-transport` carried
//! as framed messages over one or more TCP sockets per peer.
//!
//! - [`TcpTransport`] is the entry point: `listen` binds a socket and starts
//!   the accept thread (`listener`).
//! - `iface` picks the address to bind and publish (FERROCCL_SOCKET_IFNAME).
//! - `handshake` is the fixed-size hello a connecting rank sends and the
//!   status byte it gets back; nothing reaches `accept()` before it passes.
//! - `connection` owns the sender/receiver halves (`sender`, `receiver`,
//!   the background `reader`, in files of their own) and the closer. The
//!   calling thread does the socket I/O: sends write header and payload
//!   from the caller's memory with one gather write, receives read the
//!   socket themselves (straight into the caller's buffer for
//!   `recv_into`); one background reader per socket drains into free slots
//!   only while the consumer is away (see its module docs).
//! - `fault` is the test-only `FERROCCL_FAULT` hook (inert unless set).
//! - `slot` is the slot buffer that `connection` and `wire` hand around.
//! - `wire` owns the bytes of one socket: the resumable frame reader for
//!   nonblocking sockets, deadline-bounded writes, `poll(2)`.
//!
//! The only `unsafe` is the `getifaddrs` walk in `iface` and the `poll(2)`
//! call in `wire`.
#![warn(missing_docs, unreachable_pub)]

mod connection;
mod fault;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod iface;
mod latch;
mod listener;
mod slot;
mod wire;

use ferroccl_transport::{
    AbortSignal, HostInfo, ListenConfig, Listener, Transport, TransportError,
};

pub use listener::{choose_addresses, TcpListener};

/// Bytes per slot that measured best on loopback with 2 cores when the
/// payload is copied in and out (see `examples/tcp_pingpong.rs`); the same
/// as NCCL's default (4 MiB buffer over 8 steps). The layer above owns the
/// choice; this is advice.
pub const RECOMMENDED_CHUNK_BYTES: usize = 512 << 10;

/// Sockets per peer that measured best on a 2-core machine: more sockets
/// add a background reader each and brought no gain once payloads are
/// copied.
pub const RECOMMENDED_NSOCKS: usize = 1;

/// Most sockets per peer a listener accepts in its configuration.
pub const MAX_NSOCKS: usize = 64;

/// The TCP transport: reaches any peer with a routable address.
#[derive(Debug, Clone)]
pub struct TcpTransport {
    socket_buffer_bytes: Option<usize>,
}

impl TcpTransport {
    /// A transport that leaves socket buffer sizes to the kernel's
    /// autotuning: a fixed 4 MiB SO_SNDBUF/SO_RCVBUF measured no better on
    /// loopback, and a fixed size turns autotuning off.
    pub fn new() -> Self {
        TcpTransport {
            socket_buffer_bytes: None,
        }
    }

    /// Set SO_SNDBUF/SO_RCVBUF to `bytes` on every socket (the kernel caps
    /// it at net.core.{w,r}mem_max), or leave autotuning on with `None`.
    pub fn with_socket_buffer_bytes(mut self, bytes: Option<usize>) -> Self {
        self.socket_buffer_bytes = bytes;
        self
    }
}

impl Default for TcpTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn can_connect(&self, _local: &HostInfo, _peer: &HostInfo) -> bool {
        true
    }

    fn listen(
        &self,
        config: &ListenConfig,
        abort: &AbortSignal,
    ) -> Result<Box<dyn Listener>, TransportError> {
        let listener = TcpListener::bind(config, abort, self.socket_buffer_bytes)?;
        Ok(Box::new(listener))
    }
}
