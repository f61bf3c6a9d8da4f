//! Rendezvous and rank discovery: the store through which ranks find each
//! other, the failure broadcast, liveness (heartbeats on the TCP store) and
//! the reading of launcher environments. Nothing here moves collective data.

pub mod env;
mod memory;
pub(crate) mod recovery;
mod tcp_store;

use crate::error::Result;
use crossbeam_channel::{unbounded, Receiver, Sender};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

pub use env::{detect, detect_process_env, LaunchInfo};
pub use memory::MemoryStore;
#[doc(hidden)]
pub use tcp_store::fuzz_store_bytes;
use tcp_store::HOST_GONE_REASON;
pub use tcp_store::{
    free_port, TcpStore, TcpStoreServer, DEFAULT_HEARTBEAT, MAX_KEY_LEN, MAX_VALUE_LEN,
    MISSED_HEARTBEATS,
};

/// A report that a rank of the job failed, broadcast to every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureReport {
    /// Global rank (rank in the job, not in a split communicator).
    pub rank: usize,
    /// What is known about it.
    pub reason: String,
    /// The communicator the failure concerns: `Some(id)` where the rank
    /// failed (or left) one communicator, whose other members end it while
    /// the rank's other communicators go on (an abort, a timeout, a broken
    /// connection of that communicator); `None` where the rank's process is
    /// gone or cut off from the job, which ends every communicator it
    /// belongs to. A mismatch report concerns its own communicator.
    pub comm: Option<u64>,
    /// Set when the failure is a collective mismatch that `rank` found: the
    /// ranks of that communicator end their call with `Error::Mismatch`
    /// instead of blaming `rank`; other communicators are not concerned.
    pub mismatch: Option<MismatchReport>,
}

/// Two ranks of one communicator called different collectives (or the same
/// one with other arguments) at the same position of its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MismatchReport {
    /// The communicator.
    pub comm_id: u64,
    /// Position of the reporter's call among every collective call of the
    /// communicator (the library's own calls included), from 1: the same
    /// on every rank for the same call.
    pub seq: u64,
    /// Global rank of the peer whose frame disagreed with the reporter.
    pub peer: usize,
    /// The reporter's call, described ("all_reduce #3 (float, sum, 10
    /// elements)").
    pub local: String,
    /// The peer's call, as its frame described it; for a refusal, why the
    /// reporter refused its call.
    pub remote: String,
    /// The reporter refused its own call at that position for a bad
    /// argument (`peer` is the reporter itself): the ranks that accepted
    /// the call end it with `PeerFailed` naming the reporter; the ranks
    /// that refused it too go on.
    pub refused: bool,
}

impl FailureReport {
    /// A report that `rank` failed for `reason`.
    pub fn failed(rank: usize, reason: impl Into<String>) -> FailureReport {
        FailureReport {
            rank,
            reason: reason.into(),
            comm: None,
            mismatch: None,
        }
    }

    /// A report that `rank` failed in communicator `comm` only.
    pub fn failed_in(comm: u64, rank: usize, reason: impl Into<String>) -> FailureReport {
        FailureReport {
            comm: Some(comm),
            ..FailureReport::failed(rank, reason)
        }
    }

    /// Whether this report concerns communicator `comm_id`: a report about
    /// the process does, one scoped to a communicator only concerns that one.
    pub fn concerns(&self, comm_id: u64) -> bool {
        match (&self.mismatch, self.comm) {
            (Some(m), _) => m.comm_id == comm_id,
            (None, Some(c)) => c == comm_id,
            (None, None) => true,
        }
    }

    /// Whether this only says that the rendezvous host (rank 0) went away:
    /// often the echo of another rank's failure (rank 0 exits on it), so
    /// the report naming the cause may still be on its way.
    pub fn is_rendezvous_loss(&self) -> bool {
        self.rank == 0
            && self.reason == HOST_GONE_REASON
            && self.mismatch.is_none()
            && self.comm.is_none()
    }
}

/// How far each member of a communicator has come, as answered to
/// [`Store::ask_progress`]: the sequence number of the last collective it
/// issued, or `None` where no answer came before the deadline.
pub type Progress = Vec<Option<u64>>;

/// A key-value rendezvous shared by the ranks of one job.
///
/// Keys are written once; `get` waits until a key exists. Besides the
/// key-value part the store spreads failure reports: any rank may report that
/// a rank failed, and every rank that subscribed hears of it, which is how a
/// rank learns of a failure that happened far from it in the ring. It also
/// answers, for a rank whose collective timed out, how far the other members
/// have come, so that the rank that never called can be named.
pub trait Store: Send + Sync {
    /// Set `key` to `value` (overwriting).
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Wait until `key` exists and return its value; error at `deadline`.
    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>>;
    /// Tell every rank of the job about `report`.
    fn report(&self, report: FailureReport);
    /// Tell every rank that `rank` failed (its process: every communicator
    /// it belongs to).
    fn report_failure(&self, rank: usize, reason: &str) {
        self.report(FailureReport::failed(rank, reason));
    }
    /// Tell every rank that `rank` failed in communicator `comm_id` only.
    fn report_failure_in(&self, comm_id: u64, rank: usize, reason: &str) {
        self.report(FailureReport::failed_in(comm_id, rank, reason));
    }
    /// Subscribe to failure reports (including ones made before the call);
    /// dropping the feed ends the subscription.
    fn failures(&self) -> FailureFeed;
    /// This rank is leaving cleanly: do not report it as failed when it goes.
    fn goodbye(&self);
    /// This rank is done with every key that starts with `scope`, one of
    /// the `parties` ranks that use them (a communicator's members, each
    /// releasing once, when it drops the communicator): when the last has
    /// released, the store removes those keys, so that a job that makes
    /// and drops communicators keeps the keys of the live ones only. Until
    /// then every key stays, so a member whose set-up is late still finds
    /// what the others published. Best effort: a store that cannot be
    /// reached keeps the keys, and the caller goes on.
    fn release(&self, scope: &str, parties: usize);
    /// Let peers ask how far global rank `rank` has come in communicator
    /// `comm_id`: `issued` holds the sequence number of its last issued
    /// collective. Held weakly; a dropped communicator stops answering.
    fn register_progress(&self, comm_id: u64, rank: usize, issued: Weak<AtomicU64>);
    /// Ask the processes of the global ranks `members` how far they have come
    /// in `comm_id`, waiting for answers until `deadline` at most.
    fn ask_progress(&self, comm_id: u64, members: &[usize], deadline: Instant) -> Progress;
    /// The address this process reaches the store from (`None`: the store
    /// is in this process): where peers can reach this process again.
    fn local_ip(&self) -> Option<std::net::IpAddr> {
        None
    }
}

/// How often a client of the TCP store says it is alive, and how often it
/// expects the server to: `None` turns heartbeats off (then only a closed
/// connection tells of a dead rank).
pub type Heartbeat = Option<Duration>;

/// A subscription to a store's failure reports: a receiver of every report
/// made before it and after. Dropping it ends the subscription: the store
/// forgets it at its next report or subscription, whereas a channel alone
/// would be kept (and kept alive) until a report failed to reach it, which
/// in a healthy job is never: every communicator subscribes, so that would
/// be memory per communicator ever made.
#[derive(Debug)]
pub struct FailureFeed {
    reports: Receiver<FailureReport>,
    /// The store holds this weakly: gone once the feed is.
    _alive: Arc<()>,
}

impl FailureFeed {
    /// The channel the reports arrive on (for `select!`).
    pub fn receiver(&self) -> &Receiver<FailureReport> {
        &self.reports
    }
}

impl std::ops::Deref for FailureFeed {
    type Target = Receiver<FailureReport>;
    fn deref(&self) -> &Receiver<FailureReport> {
        &self.reports
    }
}

/// Every failure report seen so far and the channels of those who asked to
/// hear of new ones; shared by the stores so that a late subscriber gets the
/// earlier reports first.
#[derive(Debug, Default)]
pub(crate) struct FailureBook {
    reports: Vec<FailureReport>,
    /// Each feed's sender, with a weak handle on the feed's life.
    subscribers: Vec<(Sender<FailureReport>, Weak<()>)>,
}

impl FailureBook {
    /// Record `report` and pass it to every live subscriber.
    pub(crate) fn publish(&mut self, report: FailureReport) {
        self.forget_dropped();
        // A subscriber whose receiver is gone is dropped from the list.
        self.subscribers
            .retain(|(s, _)| s.send(report.clone()).is_ok());
        self.reports.push(report);
    }

    /// A feed that yields every earlier report, then the new ones.
    pub(crate) fn subscribe(&mut self) -> FailureFeed {
        self.forget_dropped();
        let (tx, rx) = unbounded();
        for r in &self.reports {
            // Cannot fail: `rx` is alive.
            let _ = tx.send(r.clone());
        }
        let alive = Arc::new(());
        self.subscribers.push((tx, Arc::downgrade(&alive)));
        FailureFeed {
            reports: rx,
            _alive: alive,
        }
    }

    /// Let go of the channels of feeds that were dropped.
    fn forget_dropped(&mut self) {
        self.subscribers
            .retain(|(_, alive)| alive.strong_count() > 0);
    }

    /// Whether exactly this report was already published.
    pub(crate) fn contains(&self, report: &FailureReport) -> bool {
        self.reports.contains(report)
    }

    /// How many feeds are subscribed (dropped ones included until the next
    /// report or subscription).
    #[cfg(test)]
    pub(crate) fn subscribers(&self) -> usize {
        self.subscribers.len()
    }
}

/// The keys of a store and the releases of scopes under way: the rule of
/// [`Store::release`], the same for the in-process store and the server.
#[derive(Debug, Default)]
pub(crate) struct KeyBook {
    /// Ordered, so that a scope's keys are one range.
    values: BTreeMap<String, Vec<u8>>,
    /// Scopes that some but not all of their users released: (released,
    /// parties as the first release said).
    releases: HashMap<String, (usize, usize)>,
}

impl KeyBook {
    pub(crate) fn get(&self, key: &str) -> Option<&Vec<u8>> {
        self.values.get(key)
    }

    pub(crate) fn set(&mut self, key: &str, value: &[u8]) {
        self.values.insert(key.to_string(), value.to_vec());
    }

    /// One of `parties` users is done with `scope`; the last removes every
    /// key that starts with it. Returns how many keys were removed.
    pub(crate) fn release(&mut self, scope: &str, parties: usize) -> usize {
        let entry = self
            .releases
            .entry(scope.to_string())
            .or_insert((0, parties.max(1)));
        entry.0 += 1;
        if entry.0 < entry.1 {
            return 0;
        }
        self.releases.remove(scope);
        let doomed: Vec<String> = self
            .values
            .range::<str, _>((std::ops::Bound::Included(scope), std::ops::Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(scope))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &doomed {
            self.values.remove(k);
        }
        doomed.len()
    }

    /// (keys held, scopes partly released).
    pub(crate) fn sizes(&self) -> (usize, usize) {
        (self.values.len(), self.releases.len())
    }
}

// Locks go on with the data if another thread panicked while holding them:
// every update of the stores' state is a single insert or push, so the data
// is consistent even then.
pub(crate) use ferroccl_transport::lock;

/// The progress counters of this process's communicators, by (communicator,
/// global rank), held weakly so that a dropped communicator stops answering.
#[derive(Debug, Default)]
pub(crate) struct ProgressBook {
    entries: Vec<(u64, usize, Weak<AtomicU64>)>,
}

impl ProgressBook {
    pub(crate) fn register(&mut self, comm_id: u64, rank: usize, issued: Weak<AtomicU64>) {
        self.entries.retain(|(_, _, w)| w.strong_count() > 0);
        self.entries.push((comm_id, rank, issued));
    }

    /// (global rank, last issued sequence number) of every live member of
    /// `comm_id` in this process.
    pub(crate) fn answers(&self, comm_id: u64) -> Vec<(usize, u64)> {
        self.entries
            .iter()
            .filter(|(c, _, _)| *c == comm_id)
            .filter_map(|(_, r, w)| {
                w.upgrade()
                    .map(|a| (*r, a.load(std::sync::atomic::Ordering::SeqCst)))
            })
            .collect()
    }
}
