//! How a rank waits for a peer in shared memory (the transport's slots,
//! ferroccl's check-ins): spin while the peer is likely to answer within
//! microseconds, then yield, then sleep briefly, so that on a machine with
//! fewer cores than ranks a waiter does not keep its peer off the core; and
//! look at the clock (deadline, the peer's liveness) only every 32 spins.
//! Shared by the transports that wait on memory (shm) and by the layer
//! above, whose check-ins wait on memory every rank maps. Policy only: it
//! reads no memory and knows no peer.

use crate::elapsed_ms;
use std::time::{Duration, Instant};

/// How often a waiter asks the OS whether the peer's process still lives.
pub const LIVENESS_INTERVAL: Duration = Duration::from_millis(50);
/// Spins before a waiter starts yielding its core, when every rank can
/// have a core of its own.
const SPINS: u32 = 256;
/// Spins when ranks outnumber cores: the peer a waiter waits for may need
/// this very core, so yield almost at once.
pub const OVERSUBSCRIBED_SPINS: u32 = 8;

/// How long a waiter spins: a job with more ranks than this machine has
/// cores (an upper bound on the ranks that share it) must not spin on a
/// core its peer needs.
pub fn spins_for(ranks: usize) -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if ranks > cores {
        OVERSUBSCRIBED_SPINS
    } else {
        SPINS
    }
}
/// Yields before a waiter starts sleeping.
const YIELDS: u32 = 256;
/// Sleep of a long wait: short enough for latency, long enough that a
/// waiter on a 2-core machine leaves the core to the rank it waits for.
const SLEEP: Duration = Duration::from_micros(50);

/// Spin, then yield, then sleep; and tell the caller when to run the
/// slower checks (deadline, liveness).
///
/// The clock is first read on the first clock round, not when the wait
/// starts: most waits of a small collective end within a few rounds, and a
/// clock read costs as much as a small frame's whole trip on some virtual
/// machines (~30 ns). A wait therefore measures from its first clock round,
/// at most 32 spins after it began.
///
/// Its methods are `#[inline]`: they run in every round of a spin loop of
/// another crate (shm's slots, ferroccl's check-ins), where a call each
/// would cost as much as the round.
pub struct Waiter {
    /// When the first clock round was (None before it).
    start: Option<Instant>,
    spins: u32,
    rounds: u32,
    last_liveness: Option<Instant>,
}

impl Waiter {
    /// A wait that spins `spins` rounds before it yields.
    #[inline]
    pub fn new(spins: u32) -> Self {
        Waiter {
            start: None,
            spins,
            rounds: 0,
            last_liveness: None,
        }
    }

    /// Whether this round should look at the clock (every round once
    /// spinning is over; every 32nd while spinning, not the first).
    #[inline]
    pub fn clock_round(&self) -> bool {
        self.rounds >= self.spins || self.rounds % 32 == 31
    }

    /// Note the time of a clock round.
    #[inline]
    pub fn at(&mut self, now: Instant) {
        self.start.get_or_insert(now);
        self.last_liveness.get_or_insert(now);
    }

    /// Milliseconds since the first clock round (0 before it).
    #[inline]
    pub fn elapsed_ms(&self) -> u64 {
        self.start.map_or(0, elapsed_ms)
    }

    /// Whether the peer's liveness is due a look: `LIVENESS_INTERVAL`
    /// after the first clock round, and as often after that.
    #[inline]
    pub fn liveness_due(&mut self, now: Instant) -> bool {
        match self.last_liveness {
            Some(last) if now.duration_since(last) >= LIVENESS_INTERVAL => {
                self.last_liveness = Some(now);
                true
            }
            _ => false,
        }
    }

    /// Spin, yield or sleep once, by how long the wait has gone on.
    #[inline]
    pub fn pause(&mut self) {
        if self.rounds < self.spins {
            std::hint::spin_loop();
        } else if self.rounds < self.spins + YIELDS {
            std::thread::yield_now();
        } else {
            std::thread::sleep(SLEEP);
        }
        self.rounds = self.rounds.saturating_add(1);
    }
}
