//! How a rank waits for a peer in shared memory (the transport's slots,
//! ferroccl's check-ins): spin while the peer is likely to answer within
//! microseconds, then yield (for up to a millisecond where each rank has a
//! core of its own: a sleeper wakes late), then sleep briefly, so that on a
//! machine with fewer cores than ranks a waiter does not keep its peer off
//! the core; and look at the clock (deadline, the peer's liveness) only
//! every 32 spins.
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

/// How long a waiter spins: where ranks may share CPUs
/// ([`ranks_share_cpus`]) it must not spin on a core its peer needs.
pub fn spins_for(ranks: usize) -> u32 {
    if ranks_share_cpus(ranks) {
        OVERSUBSCRIBED_SPINS
    } else {
        SPINS
    }
}

/// Whether `ranks` ranks of one machine may share its CPUs: more of them
/// than it has CPUs ([`online_cpus`], an upper bound on the ranks that
/// share it). The one test of it, for every wait that spins (the shm
/// slots, the TCP receiver, the check-ins) and for the tuner.
///
/// By the machine's CPUs, not this process's affinity mask: a launcher
/// that pins each rank to a CPU of its own (`ferroccl-run`, `mpirun
/// --bind-to core`) leaves each process a mask of one CPU, and counted by
/// that mask 2 pinned ranks looked oversubscribed. Their slot waits then
/// slept after 8 spins and 256 yields (about 80 µs), and two ranks that
/// each slept woke each other late, call after call: the tuner's latency
/// probe, a one-element allreduce, took 171-232 µs a call in 3 of 20
/// start-ups on 2 ranks of the Intel VM, its alpha came out 86-88 µs
/// instead of 0.3-0.5, and it chose recursive doubling for a 512 KiB
/// allreduce, 1.5x slower in place (docs/performance-log.md, "Pinned
/// ranks counted as oversubscribed").
pub fn ranks_share_cpus(ranks: usize) -> bool {
    ranks > online_cpus()
}

/// CPUs of the machine (`/sys/devices/system/cpu/online`; where it cannot
/// be read, this process's available parallelism), read once. Not this
/// process's affinity mask: a launcher that pins each rank to one CPU
/// does not make the ranks share CPUs. Ranks confined together to fewer
/// CPUs than the machine has (`taskset` around the whole job, a cgroup
/// quota) are not seen: they spin a few microseconds before they yield,
/// where a waiter that knew would yield at once.
pub fn online_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        std::fs::read_to_string("/sys/devices/system/cpu/online")
            .ok()
            .and_then(|list| count_cpu_list(&list))
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// How many CPUs a kernel CPU list names ("0-3,8-11\n": 8); `None` for
/// an empty or malformed list.
pub fn count_cpu_list(list: &str) -> Option<usize> {
    let mut count = 0usize;
    for range in list.trim().split(',') {
        count += match range.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                b.checked_sub(a)? + 1
            }
            None => range.parse::<usize>().ok().map(|_| 1)?,
        };
    }
    (count > 0).then_some(count)
}
/// Yields before a waiter starts sleeping.
const YIELDS: u32 = 256;
/// How long a waiter with a core of its own yields before it sleeps. A
/// waiter that sleeps wakes up to a sleep (plus the kernel's timer slack)
/// after its peer came, and the peer then waits for it: on 2 ranks of the
/// Intel VM of 2026-12-01, whose ranks reached each collective some 100 µs
/// apart, 256 yields ran out and the 512 KiB allreduce took 113-130 µs a
/// call instead of 79-80 (docs/performance-log.md, "Fresh rounds"). A
/// millisecond covers such skews; a longer wait (a peer still computing)
/// sleeps, and leaves the core to the process's other threads.
const YIELD_WINDOW: Duration = Duration::from_millis(1);
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
    /// When the latest clock round was (None before the first).
    latest: Option<Instant>,
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
            latest: None,
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
        self.latest = Some(now);
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

    /// Spin, yield or sleep once, by how long the wait has gone on: after
    /// its spins a waiter yields, 256 times where ranks outnumber cores (it
    /// was made with [`OVERSUBSCRIBED_SPINS`]: its peer may need this
    /// core), else for a millisecond from its first clock round; then it
    /// sleeps (50 µs at a time).
    #[inline]
    pub fn pause(&mut self) {
        if self.rounds < self.spins {
            std::hint::spin_loop();
        } else if self.rounds < self.spins + YIELDS || self.yields_on() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(SLEEP);
        }
        self.rounds = self.rounds.saturating_add(1);
    }

    /// Whether a waiter past its `YIELDS` still yields: one with a core of
    /// its own, whose latest clock round was within `YIELD_WINDOW` of its
    /// first. By the clock rounds' times, which the caller reads every round
    /// once spinning is over, so a pause reads no clock of its own.
    #[inline]
    fn yields_on(&self) -> bool {
        self.spins > OVERSUBSCRIBED_SPINS
            && match (self.start, self.latest) {
                (Some(start), Some(latest)) => latest.duration_since(start) < YIELD_WINDOW,
                _ => true,
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU lists as the kernel writes them, and what is not one.
    #[test]
    fn cpu_lists_count_every_cpu_they_name() {
        assert_eq!(count_cpu_list("0\n"), Some(1));
        assert_eq!(count_cpu_list("0-3\n"), Some(4));
        assert_eq!(count_cpu_list("0-3,8-11"), Some(8));
        assert_eq!(count_cpu_list("0,2,4-5"), Some(4));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("0-x"), None);
    }

    /// A waiter started `ago` (its first clock round then, its latest
    /// now).
    fn started(spins: u32, ago: Duration) -> Waiter {
        let mut w = Waiter::new(spins);
        let now = Instant::now();
        w.at(now.checked_sub(ago).expect("the clock goes back that far"));
        w.at(now);
        w
    }

    /// Past its yields, a waiter with a core of its own keeps yielding
    /// within the yield window and sleeps after it; one whose ranks
    /// outnumber the cores sleeps at once, to leave the core to its peer.
    #[test]
    fn only_a_waiter_with_its_own_core_yields_on_within_the_window() {
        assert!(started(SPINS, Duration::ZERO).yields_on());
        assert!(Waiter::new(SPINS).yields_on(), "before any clock round");
        assert!(!started(SPINS, YIELD_WINDOW * 2).yields_on());
        assert!(!started(OVERSUBSCRIBED_SPINS, Duration::ZERO).yields_on());
        assert!(!Waiter::new(OVERSUBSCRIBED_SPINS).yields_on());
    }
}
