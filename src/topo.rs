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
                Some((level, cache_size_bytes(&read("size"))?))
            })
            .max()
            .map_or(0, |(_, bytes)| bytes)
    })
}

/// A sysfs cache size ("32768K", "1M", "512") in bytes.
fn cache_size_bytes(text: &str) -> Option<usize> {
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let n: usize = digits.parse().ok()?;
    let scale = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes as sysfs writes them; anything else is not a size.
    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(cache_size_bytes("32768K"), Some(32 << 20));
        assert_eq!(cache_size_bytes("1M"), Some(1 << 20));
        assert_eq!(cache_size_bytes("512"), Some(512));
        assert_eq!(cache_size_bytes("2G"), Some(2 << 30));
        assert_eq!(cache_size_bytes(""), None);
        assert_eq!(cache_size_bytes("K"), None);
        assert_eq!(cache_size_bytes("12Q"), None);
        assert_eq!(cache_size_bytes("1 MiB"), None);
    }
}
