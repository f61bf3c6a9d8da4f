//! A rank that its launcher pinned to one CPU (`ferroccl-run`, `mpirun
//! --bind-to core`) has a core of its own: its waits spin before they
//! yield, as an unpinned rank's do, and do not take it for a rank sharing
//! its core with the others.

use ferroccl_transport::wait::{
    count_host_cpus, host_cpus, spins_for, HostCpus, OVERSUBSCRIBED_SPINS,
};

#[test]
fn a_rank_pinned_to_one_cpu_is_not_counted_as_sharing_it() {
    // What this thread, not pinned, would count (`host_cpus` itself is
    // first read below, in the pinned thread: it is read once).
    let unpinned = count_host_cpus(&HostCpus {
        setting: None,
        ..HostCpus::read()
    })
    .unwrap_or(1);
    if unpinned < 2 || std::env::var_os("FERROCCL_HOST_CPUS").is_some() {
        eprintln!(
            "skipped: this process may use {unpinned} CPU (or FERROCCL_HOST_CPUS is set); \
             pinning changes nothing"
        );
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
        let cpus = host_cpus();
        assert_eq!(
            cpus, unpinned,
            "a pinned thread counts the CPUs it would unpinned"
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
