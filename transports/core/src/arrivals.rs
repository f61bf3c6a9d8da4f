//! What an acceptor waits on when its peers' connections (or offers of
//! them) come through one queue in any order: [`Arrivals::take`] hands out
//! the one from the peer asked for and keeps the others for later calls.

use crate::{elapsed_ms, lock, AbortSignal, TransportError};
use crossbeam_channel::{select, Receiver};
use std::sync::Mutex;
use std::time::Instant;

/// Arrivals tagged with the rank they come from.
#[derive(Debug)]
pub struct Arrivals<T> {
    inbox: Receiver<(usize, T)>,
    /// Arrived from peers other than the one asked for so far.
    early: Mutex<Vec<(usize, T)>>,
}

impl<T> Arrivals<T> {
    /// Over `inbox`, into which each arrival is sent with its peer's rank.
    pub fn new(inbox: Receiver<(usize, T)>) -> Self {
        Arrivals {
            inbox,
            early: Mutex::new(Vec::new()),
        }
    }

    /// The first arrival from `peer`, waiting until `deadline`: a timeout
    /// naming `peer` ("a connection") then, `Aborted` when `abort` fires
    /// or every sender of the inbox is gone.
    pub fn take(
        &self,
        peer: usize,
        deadline: Instant,
        abort: &AbortSignal,
    ) -> Result<T, TransportError> {
        let start = Instant::now();
        loop {
            {
                let mut early = lock(&self.early);
                if let Some(i) = early.iter().position(|(p, _)| *p == peer) {
                    return Ok(early.swap_remove(i).1);
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            select! {
                recv(self.inbox) -> arrival => match arrival {
                    Ok(arrival) => lock(&self.early).push(arrival),
                    Err(_) => return Err(TransportError::Aborted),
                },
                recv(abort.receiver()) -> _ => return Err(TransportError::Aborted),
                default(remaining) => return Err(TransportError::Timeout {
                    peer,
                    what: "a connection",
                    waited_ms: elapsed_ms(start),
                }),
            }
        }
    }
}
