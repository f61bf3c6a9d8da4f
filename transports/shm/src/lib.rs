//! Shared-memory transport of ferroccl: the slot FIFO of
//! `ferroccl-transport` in a file mapped by both ranks, for ranks on one
//! host (same boot, hostname and network namespace).
//!
//! - [`ShmTransport`] is the entry point; `listen` gives a [`ShmListener`].
//! - `listener` sets connections up through /dev/shm: the connecting
//!   (lower) rank creates one segment per direction, the accepting rank
//!   maps and unlinks them, so that nothing is left to leak once both
//!   sides hold the mapping, even if a process is killed.
//! - `connection` holds the halves, the closer and the waiting policy
//!   (spin, yield, then short sleeps; abort, deadline, peer flags and peer
//!   process liveness checked throughout). There are no threads.
//! - `region` maps files that every rank of a communicator shares, for
//!   memory that peers read and write directly (ferroccl's windows), and
//!   reads another process's memory by cross-memory attach.
//!   [`ShmMemory`] offers them through the transport core's
//!   `SharedMemory` seam.
//! - `wait` is the waiting policy (spin, yield, sleep; when to look at the
//!   clock), which lives in the transport core (shared with ferroccl's
//!   check-ins) and is re-exported here.
//! - `ring` is the segment layout and the single-producer single-consumer
//!   protocol over it; with `os` (four libc calls) and `region` it holds
//!   all the `unsafe` of the crate.
#![warn(missing_docs, unreachable_pub)]

mod connection;
#[doc(hidden)]
pub mod fuzzing;
mod listener;
mod os;
pub mod region;
mod ring;
pub use ferroccl_transport::wait;

use ferroccl_transport::{
    AbortSignal, HostInfo, ListenConfig, Listener, Transport, TransportError,
};
use std::path::{Path, PathBuf};

pub use listener::ShmListener;
pub use region::{process_gone, read_process_memory, write_process_memory, Region, ShmMemory};
pub use wait::Waiter;

/// Where segments live unless told otherwise.
pub const DEFAULT_DIR: &str = "/dev/shm";

/// Start of the name of every segment this transport creates.
pub const SEGMENT_PREFIX: &str = "ferroccl-";

/// Most slots per direction a listener accepts in its configuration.
pub const MAX_STEPS: usize = 4096;

/// The shared-memory transport ("shm"): reaches peers on the same host.
#[derive(Debug, Clone)]
pub struct ShmTransport {
    dir: PathBuf,
}

impl ShmTransport {
    /// A transport whose segments live in /dev/shm.
    pub fn new() -> Self {
        ShmTransport {
            dir: PathBuf::from(DEFAULT_DIR),
        }
    }

    /// A transport whose segments live in `dir` (a tmpfs, for speed; both
    /// ranks must use the same one).
    pub fn with_dir(dir: impl Into<PathBuf>) -> Self {
        ShmTransport { dir: dir.into() }
    }

    /// The directory segments are created in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Start a listener; the typed form of [`Transport::listen`].
    pub fn listen_shm(
        &self,
        config: &ListenConfig,
        abort: &AbortSignal,
    ) -> Result<ShmListener, TransportError> {
        ShmListener::new(self.dir.clone(), config, abort)
    }
}

impl Default for ShmTransport {
    fn default() -> Self {
        Self::new()
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn can_connect(&self, local: &HostInfo, peer: &HostInfo) -> bool {
        !local.host_id.is_empty() && local.host_id == peer.host_id && os::dir_writable(&self.dir)
    }

    fn listen(
        &self,
        config: &ListenConfig,
        abort: &AbortSignal,
    ) -> Result<Box<dyn Listener>, TransportError> {
        Ok(Box::new(self.listen_shm(config, abort)?))
    }
}
