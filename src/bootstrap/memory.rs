//! In-process store: ranks that run as threads of one process meet here.
//!
//! It owns a map and the list of failure reports, nothing else; it never
//! touches sockets or the environment. Tests and `testing::run_ranks` use it.

use super::{
    lock, FailureBook, FailureFeed, FailureReport, KeyBook, Progress, ProgressBook, Store,
};
use crate::error::{Error, Result};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Instant;

/// A [`Store`] held in memory, shared by threads of one process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    values: Mutex<KeyBook>,
    changed: Condvar,
    failures: Mutex<FailureBook>,
    progress: Mutex<ProgressBook>,
}

impl MemoryStore {
    /// A new, empty store.
    pub fn new() -> Arc<MemoryStore> {
        Arc::new(MemoryStore::default())
    }

    /// How many keys the store holds (for tests of [`Store::release`]).
    pub fn key_count(&self) -> usize {
        lock(&self.values).sizes().0
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        lock(&self.values).set(key, value);
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        let start = Instant::now();
        let mut values = lock(&self.values);
        loop {
            if let Some(v) = values.get(key) {
                return Ok(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Bootstrap(format!(
                    "timed out after {} ms waiting for key '{key}'",
                    now.duration_since(start).as_millis()
                )));
            }
            values = self
                .changed
                .wait_timeout(values, deadline - now)
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .0;
        }
    }

    fn report(&self, report: FailureReport) {
        lock(&self.failures).publish(report);
    }

    fn failures(&self) -> FailureFeed {
        lock(&self.failures).subscribe()
    }

    fn goodbye(&self) {}

    fn release(&self, scope: &str, parties: usize) {
        lock(&self.values).release(scope, parties);
    }

    fn register_progress(&self, comm_id: u64, rank: usize, issued: Weak<AtomicU64>) {
        lock(&self.progress).register(comm_id, rank, issued);
    }

    fn ask_progress(&self, comm_id: u64, members: &[usize], _deadline: Instant) -> Progress {
        // Every rank of an in-process job lives here: the answer is at hand.
        let answers = lock(&self.progress).answers(comm_id);
        members
            .iter()
            .map(|m| answers.iter().find(|(r, _)| r == m).map(|&(_, s)| s))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn get_waits_for_a_later_set() {
        let store = MemoryStore::new();
        let s2 = store.clone();
        let t = std::thread::spawn(move || {
            s2.get("k", Instant::now() + Duration::from_secs(10))
                .unwrap()
        });
        std::thread::sleep(Duration::from_millis(50));
        store.set("k", b"v1").unwrap();
        assert_eq!(t.join().unwrap(), b"v1".to_vec());
    }

    #[test]
    fn get_times_out_naming_the_key() {
        let store = MemoryStore::new();
        let err = store
            .get("missing", Instant::now() + Duration::from_millis(30))
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("'missing'"), "{msg}");
        assert!(msg.contains("timed out after"), "{msg}");
    }

    #[test]
    fn failures_replay_earlier_reports_then_new_ones() {
        let store = MemoryStore::new();
        store.report_failure(2, "gone");
        let rx = store.failures();
        store.report_failure(3, "also gone");
        let got: Vec<_> = rx.try_iter().collect();
        assert_eq!(
            got,
            vec![
                FailureReport::failed(2, "gone"),
                FailureReport::failed(3, "also gone")
            ]
        );
    }

    #[test]
    fn dropped_feeds_are_forgotten() {
        let store = MemoryStore::new();
        let kept = store.failures();
        for _ in 0..100 {
            drop(store.failures());
        }
        // The next subscription forgets the dropped ones, not the kept one.
        let other = store.failures();
        assert_eq!(lock(&store.failures).subscribers(), 2);
        store.report_failure(1, "gone");
        assert_eq!(kept.try_recv(), Ok(FailureReport::failed(1, "gone")));
        assert_eq!(other.try_recv(), Ok(FailureReport::failed(1, "gone")));
    }

    #[test]
    fn a_scope_goes_when_its_last_party_releases_it() {
        let store = MemoryStore::new();
        let far = Instant::now() + Duration::from_secs(5);
        for r in 0..3 {
            store.set(&format!("comm/00a1/host/{r}"), b"h").unwrap();
        }
        // A sibling scope that shares the prefix as text, and another.
        store.set("comm/00a10/host/0", b"x").unwrap();
        store.set("comm/00b2/host/0", b"y").unwrap();
        store.release("comm/00a1/", 3);
        store.release("comm/00a1/", 3);
        // Two of three: a late party still reads every key.
        for r in 0..3 {
            assert_eq!(
                store.get(&format!("comm/00a1/host/{r}"), far).unwrap(),
                b"h"
            );
        }
        assert_eq!(store.key_count(), 5);
        store.release("comm/00a1/", 3);
        assert_eq!(store.key_count(), 2);
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(store.get("comm/00a1/host/0", soon).is_err());
        assert_eq!(store.get("comm/00a10/host/0", far).unwrap(), b"x");
        assert_eq!(store.get("comm/00b2/host/0", far).unwrap(), b"y");
        // Nothing is remembered of a scope once released.
        assert_eq!(lock(&store.values).sizes(), (2, 0));
    }
}
