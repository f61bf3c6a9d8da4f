//! A fire-once wake-up that can sit in a `crossbeam_channel::select!` next to
//! data channels: its receiver becomes disconnected when it fires (the same
//! trick as the communicator's abort signal). Owns nothing else.

use crossbeam_channel::{Receiver, Sender};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Wakes every waiter that selects on [`Latch::receiver`], once.
#[derive(Debug)]
pub(crate) struct Latch {
    sender: Mutex<Option<Sender<()>>>,
    receiver: Receiver<()>,
    fired: AtomicBool,
}

impl Latch {
    pub(crate) fn new() -> Self {
        let (sender, receiver) = crossbeam_channel::bounded(1);
        Latch {
            sender: Mutex::new(Some(sender)),
            receiver,
            fired: AtomicBool::new(false),
        }
    }

    /// Fire; idempotent.
    pub(crate) fn fire(&self) {
        self.fired.store(true, Ordering::SeqCst);
        let mut guard = match self.sender.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        guard.take();
    }

    pub(crate) fn is_fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }

    /// Include in a `select!`: ready (disconnected) once fired.
    pub(crate) fn receiver(&self) -> &Receiver<()> {
        &self.receiver
    }
}

/// Lock a mutex, ignoring poisoning: the data guarded here (error slots,
/// socket lists) stays consistent even if a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
