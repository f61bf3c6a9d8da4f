//! Waiting on a condition variable that shrugs off poisoning: the data
//! guarded in this crate (error slots, socket lists, per-socket I/O state)
//! stays consistent even if a holder panicked, and a transport must keep
//! tearing down cleanly then. Locking itself is `ferroccl_transport::lock`.

use std::sync::{Condvar, MutexGuard};
use std::time::Duration;

/// Wait on `cv` for at most `timeout`, ignoring poisoning.
pub(crate) fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> MutexGuard<'a, T> {
    match cv.wait_timeout(guard, timeout) {
        Ok((g, _)) => g,
        Err(poisoned) => poisoned.into_inner().0,
    }
}
