//! A rank that its launcher pinned to one CPU (`ferroccl-run`, `mpirun
//! --bind-to core`) has a core of its own: its waits spin before they
//! yield, as an unpinned rank's do, and do not take it for a rank sharing
//! its core with the others.

use ferroccl_transport::wait::{online_cpus, spins_for, OVERSUBSCRIBED_SPINS};

#[test]
fn a_rank_pinned_to_one_cpu_is_not_counted_as_sharing_it() {
    let cpus = online_cpus();
    if cpus < 2 {
        eprintln!("skipped: this machine has {cpus} CPU online; pinning changes nothing");
        return;
    }
    std::thread::spawn(move || {
        // SAFETY: `set` is a plain bit array, zeroed, then one bit set
        // within CPU_SETSIZE (the CPU this thread runs on); its size goes
        // with it. The call narrows this thread's own affinity (pid 0).
        let pinned = unsafe {
            let cpu = libc::sched_getcpu().max(0) as usize;
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        };
        assert!(
            pinned,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
        // What this thread's mask says now: one CPU.
        assert_eq!(
            std::thread::available_parallelism().map(|n| n.get()).ok(),
            Some(1)
        );
        for ranks in 1..=cpus {
            assert_ne!(
                spins_for(ranks),
                OVERSUBSCRIBED_SPINS,
                "{ranks} ranks on a machine of {cpus} CPUs"
            );
        }
        assert_eq!(spins_for(cpus + 1), OVERSUBSCRIBED_SPINS);
    })
    .join()
    .expect("the pinned thread");
}
