//! A one-shot, many-waiter abort signal built on a channel that is never sent
//! to: dropping the handle disconnects it, which wakes every `select!` that
//! includes the signal's receiver at once.

use crossbeam_channel::{Receiver, Sender};
use std::sync::{Arc, Mutex};

/// Held by the owner of a communicator; `abort()` fires the signal.
#[derive(Debug)]
pub struct AbortHandle {
    sender: Mutex<Option<Sender<()>>>,
    signal: AbortSignal,
}

/// A cheap clone given to everything that waits: include `receiver()` in a
/// `crossbeam_channel::select!`; it becomes ready (disconnected) on abort.
#[derive(Debug, Clone)]
pub struct AbortSignal {
    receiver: Receiver<()>,
    fired: Arc<std::sync::atomic::AtomicBool>,
}

impl AbortHandle {
    /// A new, unfired signal.
    pub fn new() -> Self {
        let (sender, receiver) = crossbeam_channel::bounded(1);
        AbortHandle {
            sender: Mutex::new(Some(sender)),
            signal: AbortSignal {
                receiver,
                fired: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            },
        }
    }

    /// Fire the signal; idempotent.
    pub fn abort(&self) {
        self.signal
            .fired
            .store(true, std::sync::atomic::Ordering::SeqCst);
        crate::lock(&self.sender).take();
    }

    /// The signal to hand to waiters.
    pub fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

impl Default for AbortHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl AbortSignal {
    /// Whether the signal has fired.
    pub fn is_fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The receiver to include in a `select!`: it never yields a message and
    /// becomes disconnected when the signal fires.
    pub fn receiver(&self) -> &Receiver<()> {
        &self.receiver
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn abort_wakes_a_waiter_on_another_thread() {
        let handle = AbortHandle::new();
        let signal = handle.signal();
        let waiter = std::thread::spawn(move || {
            let start = std::time::Instant::now();
            crossbeam_channel::select! {
                recv(signal.receiver()) -> _ => {},
                default(Duration::from_secs(10)) => panic!("abort did not wake the waiter"),
            }
            (signal.is_fired(), start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(20));
        handle.abort();
        let (fired, waited) = waiter.join().unwrap();
        assert!(fired);
        assert!(waited < Duration::from_secs(10));
    }
}
