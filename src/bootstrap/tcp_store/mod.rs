//! The rendezvous of a real job: a key-value server (run by rank 0) and its
//! clients, over TCP, plus the failure broadcast.
//!
//! This module owns the rendezvous sockets and their wire format; it never
//! carries collective data. `wire` holds the frames, their payloads and the
//! bounds on lengths read from the wire (the table of messages is there),
//! `server` the rank-0 side and `client` the [`Store`](super::Store) of each
//! rank. Server and client both speak through `wire`, never through each
//! other; what they share beyond it (the heartbeat rule, the push timeout)
//! is here.
//!
//! # Connections
//!
//! Each client process opens one *watch* connection, on which the server
//! pushes failure reports (first those made before it connected), and one or
//! more *request* connections (one per thread that uses the store at the same
//! time), each carrying one request and its answer at a time. A watch
//! connection that closes without GOODBYE makes the server report its rank
//! as failed to every other watcher.
//!
//! # Heartbeats
//!
//! A client that announces a heartbeat interval `h` in its hello sends
//! HEARTBEAT on its watch connection every `h`, from the watch thread (which
//! never waits on the communicator), and the server sends BEAT back at the
//! same pace. A side that hears nothing at all from the other for
//! [`MISSED_HEARTBEATS`] intervals takes it for dead: the server reports the
//! rank failed to everyone (a stopped or frozen process sends nothing, but
//! its sockets stay open), and a client reports rank 0, the server's host,
//! to its own process.
//!
//! # Progress questions
//!
//! A rank whose collective timed out asks (ASK) how far the other members of
//! its communicator have come; the server pushes the question to every
//! watch connection, the watch thread of each process that holds a member
//! answers with PROGRESS, and the server stores each answer as the key
//! `ferroccl/progress/<comm>/<question>/<rank>`, which the asking rank reads
//! with GET. A member that has not issued the call everybody waits in is the
//! one to blame; the watch thread answers even while its process is busy in
//! user code.

mod client;
mod server;
mod wire;

use crate::error::{Error, Result};
use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

pub(crate) use client::HOST_GONE_REASON;
pub use client::{TcpStore, DEFAULT_HEARTBEAT};
pub use server::TcpStoreServer;
#[doc(hidden)]
pub use wire::fuzz_store_bytes;
pub use wire::{MAX_KEY_LEN, MAX_VALUE_LEN};

/// Intervals without a word after which a peer of the store is taken for
/// dead.
pub const MISSED_HEARTBEATS: u32 = 4;
/// A watcher that cannot take a push within this time is dropped.
const PUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The heartbeat clock of one end of a watch connection, the same rule on
/// the server and on the client: when the other end was last heard from,
/// and when this end last beat.
#[derive(Debug)]
struct Pulse {
    heard: Instant,
    beat: Instant,
}

/// What a watch loop must do next, by its [`Pulse`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    Nothing,
    /// Send a heartbeat now.
    Beat,
    /// The other end has been silent this long, past [`MISSED_HEARTBEATS`]
    /// intervals: take it for dead.
    Dead(Duration),
}

impl Pulse {
    fn new() -> Pulse {
        Pulse {
            heard: Instant::now(),
            beat: Instant::now(),
        }
    }

    /// Something arrived from the other end.
    fn heard(&mut self) {
        self.heard = Instant::now();
    }

    /// With heartbeats every `h`: whether the other end is dead, else
    /// whether a beat is due (then its clock restarts).
    fn check(&mut self, h: Duration) -> Due {
        let silent = self.heard.elapsed();
        if silent > h * MISSED_HEARTBEATS {
            return Due::Dead(silent);
        }
        if self.beat.elapsed() >= h {
            self.beat = Instant::now();
            return Due::Beat;
        }
        Due::Nothing
    }
}

/// A port on 127.0.0.1 that was free a moment ago (bind port 0, read the
/// port, close). For tests and the launcher; another process may take it in
/// between, so use it soon.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::Io(format!("cannot bind a free port on 127.0.0.1: {e}")))?;
    Ok(l.local_addr()?.port())
}
