//! Choosing the IPv4 address a listener binds and publishes: the interface
//! list (the one `unsafe` walk of `getifaddrs` in this crate) and the
//! FERROCCL_SOCKET_IFNAME filter, whose syntax follows NCCL_SOCKET_IFNAME:
//! comma-separated name prefixes, a leading `^` to exclude instead of
//! select, a leading `=` (after any `^`) to match names exactly.

use std::ffi::CStr;
use std::net::Ipv4Addr;

/// One IPv4 address of a network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InterfaceAddr {
    pub(crate) name: String,
    pub(crate) ip: Ipv4Addr,
    pub(crate) up: bool,
    pub(crate) loopback: bool,
}

/// The IPv4 addresses of this host's interfaces, in the kernel's order.
pub(crate) fn interface_addrs() -> std::io::Result<Vec<InterfaceAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success getifaddrs stores a
    // list that we release with freeifaddrs below and nowhere else.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cursor = head;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a non-null node of the list getifaddrs built,
        // which stays alive until freeifaddrs; we only read it.
        let entry = unsafe { &*cursor };
        cursor = entry.ifa_next;
        if entry.ifa_addr.is_null() || entry.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points to a sockaddr whose
        // family field is valid to read for every address family.
        let family = unsafe { (*entry.ifa_addr).sa_family };
        if i32::from(family) != libc::AF_INET {
            continue;
        }
        // SAFETY: the family is AF_INET, so the kernel stored a
        // sockaddr_in there; read_unaligned makes no alignment assumption.
        let sin = unsafe { std::ptr::read_unaligned(entry.ifa_addr.cast::<libc::sockaddr_in>()) };
        // SAFETY: `ifa_name` is a non-null, NUL-terminated string owned by
        // the list; it is copied out before the list is freed.
        let name = unsafe { CStr::from_ptr(entry.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let flags = entry.ifa_flags;
        out.push(InterfaceAddr {
            name,
            ip: Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
            up: flags & (libc::IFF_UP as libc::c_uint) != 0,
            loopback: flags & (libc::IFF_LOOPBACK as libc::c_uint) != 0,
        });
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once;
    // no reference into the list outlives this point.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// A parsed FERROCCL_SOCKET_IFNAME value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IfnameFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

impl IfnameFilter {
    pub(crate) fn parse(spec: &str) -> Self {
        let mut rest = spec.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let names = rest
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        IfnameFilter {
            exclude,
            exact,
            names,
        }
    }

    pub(crate) fn matches(&self, ifname: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                ifname == n
            } else {
                ifname.starts_with(n.as_str())
            }
        });
        listed != self.exclude
    }
}

/// First address of an up interface that `filter` selects.
pub(crate) fn pick_by_filter(addrs: &[InterfaceAddr], filter: &IfnameFilter) -> Option<Ipv4Addr> {
    addrs
        .iter()
        .find(|a| a.up && filter.matches(&a.name))
        .map(|a| a.ip)
}

/// The address to publish when nothing is configured: the first up,
/// non-loopback interface (skipping docker bridges, as NCCL does), else the
/// loopback address.
pub(crate) fn pick_default(addrs: &[InterfaceAddr]) -> Ipv4Addr {
    addrs
        .iter()
        .find(|a| a.up && !a.loopback && !a.name.starts_with("docker"))
        .map(|a| a.ip)
        .unwrap_or(Ipv4Addr::LOCALHOST)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(name: &str, ip: [u8; 4], up: bool, loopback: bool) -> InterfaceAddr {
        InterfaceAddr {
            name: name.into(),
            ip: Ipv4Addr::from(ip),
            up,
            loopback,
        }
    }

    fn host() -> Vec<InterfaceAddr> {
        vec![
            addr("lo", [127, 0, 0, 1], true, true),
            addr("docker0", [172, 17, 0, 1], true, false),
            addr("eth0", [10, 0, 0, 5], false, false),
            addr("eth1", [10, 0, 1, 5], true, false),
            addr("ib0", [10, 1, 0, 5], true, false),
        ]
    }

    #[test]
    fn prefix_exclude_and_exact_filters() {
        let h = host();
        assert_eq!(
            pick_by_filter(&h, &IfnameFilter::parse("eth")),
            Some(Ipv4Addr::new(10, 0, 1, 5)),
            "eth0 is down, so the first up eth* wins"
        );
        assert_eq!(
            pick_by_filter(&h, &IfnameFilter::parse("ib,eth")),
            Some(Ipv4Addr::new(10, 0, 1, 5)),
            "interface order, not list order"
        );
        assert_eq!(
            pick_by_filter(&h, &IfnameFilter::parse("^lo,docker,eth")),
            Some(Ipv4Addr::new(10, 1, 0, 5))
        );
        assert_eq!(pick_by_filter(&h, &IfnameFilter::parse("=eth")), None);
        assert_eq!(
            pick_by_filter(&h, &IfnameFilter::parse("=ib0")),
            Some(Ipv4Addr::new(10, 1, 0, 5))
        );
        assert_eq!(
            pick_by_filter(&h, &IfnameFilter::parse("^=lo")),
            Some(Ipv4Addr::new(172, 17, 0, 1))
        );
        assert_eq!(pick_by_filter(&h, &IfnameFilter::parse("wlan")), None);
    }

    #[test]
    fn default_skips_loopback_docker_and_down() {
        assert_eq!(pick_default(&host()), Ipv4Addr::new(10, 0, 1, 5));
        assert_eq!(
            pick_default(&[addr("lo", [127, 0, 0, 1], true, true)]),
            Ipv4Addr::LOCALHOST
        );
        assert_eq!(pick_default(&[]), Ipv4Addr::LOCALHOST);
    }

    #[test]
    fn this_host_lists_loopback() {
        let addrs = interface_addrs().expect("getifaddrs");
        assert!(
            addrs
                .iter()
                .any(|a| a.ip == Ipv4Addr::LOCALHOST && a.loopback),
            "{addrs:?}"
        );
    }
}
