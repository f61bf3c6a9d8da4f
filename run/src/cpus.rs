//! Where the ranks run: the CPUs each local rank is pinned to (`--bind-to`)
//! and the CPU sets handed to the kernel. It only computes placements; the
//! pinning itself happens in the child, between fork and exec (see
//! `launch.rs`).

use crate::args::Bind;

/// The CPUs each local rank is pinned to (None: not pinned). Two ranks
/// that wait on each other by spinning and find themselves on one CPU (the
/// scheduler likes to move a woken process next to its waker) make each
/// call cost a scheduler slice instead of a microsecond; keeping them on
/// CPUs of their own avoids that, as mpirun's binding does. `cpus`: those
/// the launcher may run on ([`allowed_cpus`]).
pub(crate) fn placement(bind: Bind, nproc: usize, cpus: &[usize]) -> Vec<Option<Vec<usize>>> {
    let c = cpus.len();
    (0..nproc)
        .map(|i| match bind {
            _ if c == 0 => None,
            Bind::None => None,
            Bind::Core => Some(vec![cpus[i % c]]),
            Bind::Share if nproc > c => None,
            Bind::Share => Some(cpus[i * c / nproc..(i + 1) * c / nproc].to_vec()),
        })
        .collect()
}

/// The CPUs this process may run on, in order (empty where unknown).
#[cfg(target_os = "linux")]
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: the set is a plain bit array that the kernel fills; its size
    // is passed with it, and CPU_ISSET reads within it (i < CPU_SETSIZE).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&i| libc::CPU_ISSET(i, &set))
            .collect()
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

/// A CPU set holding `cpus`.
#[cfg(target_os = "linux")]
pub(crate) fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET writes one bit
    // inside it for each CPU below CPU_SETSIZE (others are skipped).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(cpu, &mut set);
        }
        set
    }
}
