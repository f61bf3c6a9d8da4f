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
/// than the CPUs they may run on ([`host_cpus`]). The one test of it, for
/// every wait that spins (the shm slots, the TCP receiver, the check-ins)
/// and for the tuner.
///
/// Not by this process's affinity mask alone: a launcher that pins each
/// rank to a CPU of its own (`ferroccl-run`, `mpirun --bind-to core`)
/// leaves each process a mask of one CPU, and counted by that mask 2
/// pinned ranks looked oversubscribed. Their slot waits then slept after 8
/// spins and 256 yields (about 80 µs), and two ranks that each slept woke
/// each other late, call after call: the tuner's latency probe, a
/// one-element allreduce, took 171-232 µs a call in 3 of 20 start-ups on
/// 2 ranks of the Intel VM, its alpha came out 86-88 µs instead of
/// 0.3-0.5, and it chose recursive doubling for a 512 KiB allreduce, 1.5x
/// slower in place (docs/performance-log.md, "Pinned ranks counted as
/// oversubscribed").
pub fn ranks_share_cpus(ranks: usize) -> bool {
    ranks > host_cpus()
}

/// The environment variable that says how many CPUs this host's ranks
/// may run on between them ([`host_cpus`]); `ferroccl-run` (and
/// `ferroccl-perf --ranks`) set it for their ranks to the CPUs they
/// placed them on.
pub const HOST_CPUS_VAR: &str = "FERROCCL_HOST_CPUS";

/// The CPUs this host's ranks may run on between them, read once per
/// process ([`count_host_cpus`] of what this machine says):
///
/// - [`HOST_CPUS_VAR`] where it is set to a positive number (the launcher
///   that pinned the ranks knows what it pinned them to; a user who pins
///   them some other way can say it);
/// - else the machine's online CPUs (`/sys/devices/system/cpu/online`),
///   narrowed to this process's affinity mask where it names more than
///   one CPU: `taskset` or a cpuset around a job whose ranks are not
///   pinned one by one gives every rank the job's mask.
///
/// A mask of one CPU is taken for a rank pinned by its launcher, not for a
/// job confined to one CPU: ranks that a plain `taskset -c 0` put on one
/// CPU together, outside `ferroccl-run`, are not seen (set
/// `FERROCCL_HOST_CPUS=1`). Where nothing can be read, this thread's
/// available parallelism.
///
/// A cgroup's CPU quota (`docker --cpus`) is not counted: ranks under a
/// quota still run side by side, on as many CPUs as the mask gives them,
/// until the quota throttles all of them alike. Two ranks under a quota of
/// one CPU that waited as ranks sharing a CPU ran 0.64-1.35x as fast as
/// spinning ones (most cells below 1) and were throttled as often
/// (docs/performance-log.md, "Ranks confined to fewer CPUs").
pub fn host_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| {
        count_host_cpus(&HostCpus::read())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// What [`host_cpus`] decides by (`None`: not set, or not readable).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCpus {
    /// [`HOST_CPUS_VAR`].
    pub setting: Option<usize>,
    /// The machine's online CPUs.
    pub online: Option<usize>,
    /// The CPUs in this process's affinity mask.
    pub mask: Option<usize>,
}

impl HostCpus {
    /// What this process and machine say now: [`HOST_CPUS_VAR`], the
    /// online CPUs (`/sys/devices/system/cpu/online`) and the calling
    /// thread's mask (`/proc/thread-self/status`).
    pub fn read() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        HostCpus {
            setting: std::env::var(HOST_CPUS_VAR)
                .ok()
                .and_then(|v| parse_host_cpus(&v)),
            online: read("/sys/devices/system/cpu/online").and_then(|l| count_cpu_list(&l)),
            mask: read("/proc/thread-self/status").and_then(|s| mask_in_status(&s)),
        }
    }
}

/// [`host_cpus`]'s rule over what it read; `None` where neither a setting
/// nor the online CPUs are known.
pub fn count_host_cpus(facts: &HostCpus) -> Option<usize> {
    match (facts.setting, facts.online) {
        (Some(set), _) => Some(set),
        (None, Some(online)) => Some(match facts.mask {
            Some(mask) if mask > 1 => online.min(mask),
            _ => online,
        }),
        (None, None) => None,
    }
}

/// [`HOST_CPUS_VAR`]'s value: a positive whole number of CPUs.
pub fn parse_host_cpus(value: &str) -> Option<usize> {
    value.trim().parse::<usize>().ok().filter(|&n| n > 0)
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

/// The CPUs of the affinity mask in a `/proc/<pid>/status` text (its
/// `Cpus_allowed_list` line).
fn mask_in_status(status: &str) -> Option<usize> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(count_cpu_list)
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

    /// The rule of `host_cpus`: the launcher's count first, else the
    /// online CPUs narrowed by a mask of more than one CPU (a confined job)
    /// but not by a mask of one (a pinned rank).
    #[test]
    fn host_cpus_are_the_setting_or_the_online_cpus_a_job_mask_allows() {
        let on = |online, mask| HostCpus {
            setting: None,
            online: Some(online),
            mask,
        };
        assert_eq!(count_host_cpus(&on(64, None)), Some(64));
        assert_eq!(count_host_cpus(&on(64, Some(1))), Some(64), "pinned");
        assert_eq!(count_host_cpus(&on(64, Some(8))), Some(8), "taskset");
        assert_eq!(count_host_cpus(&on(64, Some(128))), Some(64));
        let set = HostCpus {
            setting: Some(3),
            online: Some(64),
            mask: Some(1),
        };
        assert_eq!(count_host_cpus(&set), Some(3));
        assert_eq!(count_host_cpus(&HostCpus::default()), None);
        assert_eq!(parse_host_cpus(" 4\n"), Some(4));
        assert_eq!(parse_host_cpus("0"), None);
        assert_eq!(parse_host_cpus("-1"), None);
        assert_eq!(parse_host_cpus("four"), None);
        let status = "Name:\tx\nCpus_allowed:\t5\nCpus_allowed_list:\t0,2\nMems_allowed:\t1\n";
        assert_eq!(mask_in_status(status), Some(2));
        assert_eq!(mask_in_status("Name:\tx\n"), None);
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
