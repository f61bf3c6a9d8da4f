//! Who shares a host with whom: a host identity that survives containers
//! (boot id, hostname and network namespace together); and the host's
//! last-level cache, which decides how large calls between windows store.

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

/// The size in bytes of the last-level cache of this host's first CPU
/// (the highest cache level sysfs lists for CPU 0, e.g. an L3 that the
/// ranks of this host share); 0 where sysfs does not say. Read once.
pub(crate) fn last_level_cache_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| {
        let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
            return 0;
        };
        dir.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("index"))
            .filter_map(|e| {
                let path = e.path();
                let read = |f: &str| read_trimmed(&path.join(f).to_string_lossy());
                if read("type") == "Instruction" {
                    return None;
                }
                let level: u32 = read("level").parse().ok()?;
                Some((level, ferroccl_transport::size_value(&read("size"))?))
            })
            .max()
            .map_or(0, |(_, bytes)| bytes)
    })
}
