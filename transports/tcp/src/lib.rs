//! TCP transport of ferroccl: the slot FIFO of `ferroccl-transport` carried
//! as framed messages over one or more TCP sockets per peer.
//!
//! - [`TcpTransport`] is the entry point: `listen` binds a socket and starts
//!   the accept thread ([`listener`]).
//! - `iface` picks the address to bind and publish (FERROCCL_SOCKET_IFNAME).
//! - `handshake` is the fixed-size hello a connecting rank sends and the
//!   status byte it gets back; nothing reaches `accept()` before it passes.
//! - `connection` owns the slot buffers and the sender/receiver halves;
//!   `wire` owns the per-socket reader and writer threads.
//!
//! The only `unsafe` is the `getifaddrs` walk in `iface`.
#![warn(missing_docs, unreachable_pub)]

mod connection;
mod handshake;
mod iface;
mod latch;
mod listener;
mod wire;

use ferroccl_transport::{
    AbortSignal, HostInfo, ListenConfig, Listener, Transport, TransportError,
};

pub use listener::TcpListener;

/// Socket send/receive buffer size requested unless configured otherwise.
pub const DEFAULT_SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Most sockets per peer a listener accepts in its configuration.
pub const MAX_NSOCKS: usize = 64;

/// The TCP transport: reaches any peer with a routable address.
#[derive(Debug, Clone)]
pub struct TcpTransport {
    socket_buffer_bytes: Option<usize>,
}

impl TcpTransport {
    /// A transport that asks for [`DEFAULT_SOCKET_BUFFER_BYTES`] of socket
    /// buffers.
    pub fn new() -> Self {
        TcpTransport {
            socket_buffer_bytes: Some(DEFAULT_SOCKET_BUFFER_BYTES),
        }
    }

    /// Set SO_SNDBUF/SO_RCVBUF to `bytes` on every socket, or leave the
    /// kernel's autotuning alone with `None`.
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
