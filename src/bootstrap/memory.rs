//! In-process store (temporary minimal version; replaced by the boot branch).
use super::{FailureReport, Store};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// In-process store.
#[derive(Default)]
pub struct MemoryStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    cv: Condvar,
    subs: Mutex<(
        Vec<FailureReport>,
        Vec<crossbeam_channel::Sender<FailureReport>>,
    )>,
}
impl MemoryStore {
    /// New store.
    pub fn new() -> Arc<MemoryStore> {
        Arc::new(MemoryStore::default())
    }
}
impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.map.lock().unwrap().insert(key.into(), value.to_vec());
        self.cv.notify_all();
        Ok(())
    }
    fn get(&self, key: &str, deadline: Instant) -> Result<Vec<u8>> {
        let mut m = self.map.lock().unwrap();
        loop {
            if let Some(v) = m.get(key) {
                return Ok(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Bootstrap(format!(
                    "timed out waiting for key '{key}'"
                )));
            }
            m = self.cv.wait_timeout(m, deadline - now).unwrap().0;
        }
    }
    fn report_failure(&self, rank: usize, reason: &str) {
        let r = FailureReport {
            rank,
            reason: reason.into(),
        };
        let mut s = self.subs.lock().unwrap();
        s.0.push(r.clone());
        s.1.retain(|tx| tx.send(r.clone()).is_ok());
    }
    fn failures(&self) -> crossbeam_channel::Receiver<FailureReport> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let mut s = self.subs.lock().unwrap();
        for r in &s.0 {
            let _ = tx.send(r.clone());
        }
        s.1.push(tx);
        rx
    }
    fn goodbye(&self) {}
}
