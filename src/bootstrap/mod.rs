//! Rendezvous and rank discovery: the store through which ranks find each
//! other, the failure broadcast, and the reading of launcher environments.
//! Nothing here moves collective data.

pub mod env;
mod memory;
mod tcp_store;

use crate::error::Result;
use std::time::Instant;

pub use memory::MemoryStore;
pub use tcp_store::{TcpStore, TcpStoreServer};

/// A report that a rank of the job failed, broadcast to every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureReport {
    /// Global rank (rank in the job, not in a split communicator).
    pub rank: usize,
    /// What is known about it.
    pub reason: String,
}

/// A key-value rendezvous shared by the ranks of one job.
///
/// Keys are written once; `get` waits until a key exists. Besides the
/// key-value part the store spreads failure reports: any rank may report that
/// a rank failed, and every rank that subscribed hears of it, which is how a
/// rank learns of a failure that happened far from it in the ring.
pub trait Store: Send + Sync {
    /// Set `key` to `value` (overwriting).
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Wait until `key` exists and return its value; error at `deadline`.
    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>>;
    /// Tell every rank that `rank` failed.
    fn report_failure(&self, rank: usize, reason: &str);
    /// Subscribe to failure reports (including ones made before the call).
    fn failures(&self) -> crossbeam_channel::Receiver<FailureReport>;
    /// This rank is leaving cleanly: do not report it as failed when it goes.
    fn goodbye(&self);
}
