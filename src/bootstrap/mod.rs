//! Rendezvous and rank discovery: the store through which ranks find each
//! other, the failure broadcast, and the reading of launcher environments.
//! Nothing here moves collective data.

pub mod env;
mod memory;
mod tcp_store;

use crate::error::Result;
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

pub use env::{detect, detect_process_env, LaunchInfo};
pub use memory::MemoryStore;
use tcp_store::HOST_GONE_REASON;
pub use tcp_store::{free_port, TcpStore, TcpStoreServer, MAX_KEY_LEN, MAX_VALUE_LEN};

/// A report that a rank of the job failed, broadcast to every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureReport {
    /// Global rank (rank in the job, not in a split communicator).
    pub rank: usize,
    /// What is known about it.
    pub reason: String,
}

impl FailureReport {
    /// Whether this only says that the rendezvous host (rank 0) went away:
    /// often the echo of another rank's failure (rank 0 exits on it), so
    /// the report naming the cause may still be on its way.
    pub fn is_rendezvous_loss(&self) -> bool {
        self.rank == 0 && self.reason == HOST_GONE_REASON
    }
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

/// Every failure report seen so far and the channels of those who asked to
/// hear of new ones; shared by the stores so that a late subscriber gets the
/// earlier reports first.
#[derive(Debug, Default)]
pub(crate) struct FailureBook {
    reports: Vec<FailureReport>,
    subscribers: Vec<Sender<FailureReport>>,
}

impl FailureBook {
    /// Record `report` and pass it to every live subscriber.
    pub(crate) fn publish(&mut self, report: FailureReport) {
        // A subscriber whose receiver is gone is dropped from the list.
        self.subscribers.retain(|s| s.send(report.clone()).is_ok());
        self.reports.push(report);
    }

    /// A receiver that yields every earlier report, then the new ones.
    pub(crate) fn subscribe(&mut self) -> Receiver<FailureReport> {
        let (tx, rx) = unbounded();
        for r in &self.reports {
            // Cannot fail: `rx` is alive.
            let _ = tx.send(r.clone());
        }
        self.subscribers.push(tx);
        rx
    }

    /// Whether exactly this report was already published.
    pub(crate) fn contains(&self, report: &FailureReport) -> bool {
        self.reports.contains(report)
    }
}

/// Lock a mutex, going on with the data if another thread panicked while
/// holding it: every update of the stores' state is a single insert or push,
/// so the data is consistent even then.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
