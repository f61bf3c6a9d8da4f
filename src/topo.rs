//! Who shares a host with whom: a host identity that survives containers
//! (boot id, hostname and network namespace together).

use ferroccl_transport::HostInfo;

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// This process's host identity.
pub(crate) fn host_info() -> HostInfo {
    let boot = read_trimmed("/proc/sys/kernel/random/boot_id");
    let host = read_trimmed("/proc/sys/kernel/hostname");
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    HostInfo {
        host_id: format!("{boot}/{host}/{netns}"),
    }
}
