//! Configuration of the InfiniBand / RoCE transport, and the pure decisions
//! made from it: which ports to use, which GID, whether to fall back to
//! TCP. Nothing here touches a device, so all of it is tested without one
//! (`tests/config.rs`); [`crate::probe`] gathers the ports it filters.
//!
//! Environment variables (each also read under its `NCCL_` name when ours
//! is unset or empty, so existing NCCL settings carry over):
//!
//! | variable                          | default | meaning |
//! |-----------------------------------|---------|---------|
//! | `FERROCCL_IB_HCA`                 | all     | which devices / ports, see [`HcaSpec`] |
//! | `FERROCCL_IB_GID_INDEX`           | auto    | GID table index, see [`choose_gid`] |
//! | `FERROCCL_IB_TIMEOUT`             | 20      | local ACK timeout exponent, 1..=31 (4.096 µs × 2^t) |
//! | `FERROCCL_IB_RETRY_CNT`           | 7       | transport retries, 0..=7 |
//! | `FERROCCL_IB_QPS_PER_CONNECTION`  | 1       | queue pairs per connection, 1..=16 |

use std::fmt;

/// A configuration value that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {why}")]
pub struct ConfigError {
    /// The variable read (ours or its NCCL alias).
    pub var: String,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

/// One item of an HCA list: a device name (or name prefix) and, maybe, a
/// port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaItem {
    /// Device name, or its prefix unless the list asks for exact names.
    pub name: String,
    /// The one port of that device to use; all its ports when `None`.
    pub port: Option<u8>,
}

/// A parsed `FERROCCL_IB_HCA` (NCCL's `NCCL_IB_HCA` syntax).
///
/// `name[:port],name[:port],...` lists the devices to use; a leading `^`
/// lists those to leave out instead; a leading `=` (after the `^` if
/// both: `^=`) asks for exact names, otherwise a name matches every
/// device it is a prefix of (`mlx5` matches `mlx5_0` and `mlx5_1`). Unset
/// or empty: every device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcaSpec {
    /// Leave the listed devices out instead of using only them.
    pub exclude: bool,
    /// Names must match exactly (not as prefixes).
    pub exact: bool,
    /// The items; empty means no filter.
    pub items: Vec<HcaItem>,
}

impl HcaSpec {
    /// Parses a value of the variable `var` (named in errors).
    pub fn parse(var: &str, value: &str) -> Result<Self, ConfigError> {
        let err = |why: String| ConfigError {
            var: var.to_string(),
            value: value.to_string(),
            why,
        };
        let mut rest = value.trim();
        if rest.is_empty() {
            return Ok(Self::default());
        }
        let mut spec = Self::default();
        if let Some(r) = rest.strip_prefix('^') {
            spec.exclude = true;
            rest = r;
        }
        if let Some(r) = rest.strip_prefix('=') {
            spec.exact = true;
            rest = r;
        }
        if rest.trim().is_empty() {
            return Err(err("no device listed after the prefix".to_string()));
        }
        for raw in rest.split(',') {
            let item = raw.trim();
            let (name, port) = match item.split_once(':') {
                Some((n, p)) => (n.trim(), Some(p.trim())),
                None => (item, None),
            };
            if name.is_empty() {
                return Err(err(format!("item {raw:?}: empty device name")));
            }
            let port = match port {
                None => None,
                Some(p) => match p.parse::<u8>() {
                    Ok(0) => return Err(err(format!("item {raw:?}: ports are numbered from 1"))),
                    Ok(n) => Some(n),
                    Err(_) => {
                        return Err(err(format!(
                            "item {raw:?}: port {p:?} is not a number from 1 to 255"
                        )))
                    }
                },
            };
            spec.items.push(HcaItem {
                name: name.to_string(),
                port,
            });
        }
        Ok(spec)
    }

    fn item_matches(&self, item: &HcaItem, port: &Port) -> bool {
        let name_ok = if self.exact {
            port.device == item.name
        } else {
            port.device.starts_with(&item.name)
        };
        name_ok && item.port.is_none_or(|p| p == port.port)
    }
}

impl fmt::Display for HcaSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.items.is_empty() {
            return f.write_str("(all devices)");
        }
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        for (i, item) in self.items.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&item.name)?;
            if let Some(p) = item.port {
                write!(f, ":{p}")?;
            }
        }
        Ok(())
    }
}

/// A port's link layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand (addressed by LID; GIDs for routing between subnets).
    Infiniband,
    /// Ethernet: RoCE, addressed by GID.
    Ethernet,
}

/// What a GID table entry is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GidKind {
    /// An InfiniBand GID.
    Ib,
    /// RoCE v1 (Ethernet frames, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
    /// The device did not say (its GID table query is unsupported).
    Unknown,
}

/// One GID table entry of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gid {
    /// Index in the port's GID table.
    pub index: u8,
    /// The 16 bytes, in network order.
    pub raw: [u8; 16],
    /// What it is for.
    pub kind: GidKind,
}

impl Gid {
    /// An IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`).
    pub fn is_ipv4_mapped(&self) -> bool {
        self.raw[..10].iter().all(|&b| b == 0) && self.raw[10] == 0xff && self.raw[11] == 0xff
    }

    /// An IPv6 link-local address (`fe80::/10`).
    pub fn is_link_local(&self) -> bool {
        self.raw[0] == 0xfe && self.raw[1] & 0xc0 == 0x80
    }

    fn is_zero(&self) -> bool {
        self.raw.iter().all(|&b| b == 0)
    }
}

/// A port as probed: what filtering and connecting need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// Device name (`mlx5_0`).
    pub device: String,
    /// Port number, from 1.
    pub port: u8,
    /// Whether the port is ACTIVE (only active ports are used).
    pub active: bool,
    /// InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
    /// The port's LID (InfiniBand; zero on RoCE).
    pub lid: u16,
    /// Active MTU in bytes (256 to 4096).
    pub mtu: u32,
    /// The GID table's valid (non-zero) entries.
    pub gids: Vec<Gid>,
}

impl Port {
    /// A short description: `mlx5_0:1 (InfiniBand, active)`.
    pub fn describe(&self) -> String {
        format!(
            "{}:{} ({}, {})",
            self.device,
            self.port,
            match self.link_layer {
                LinkLayer::Infiniband => "InfiniBand",
                LinkLayer::Ethernet => "Ethernet",
            },
            if self.active { "active" } else { "not active" }
        )
    }
}

/// Why no port can be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// This build has no real verbs.
    #[error("built without the `ib` feature (no real verbs in this build)")]
    NotBuilt,
    /// No RDMA device is visible (no hardware, no kernel support, no
    /// soft-RoCE).
    #[error("no RDMA device found: {0}")]
    NoDevice(String),
    /// A verbs call failed while probing.
    #[error("{call} failed: {detail}")]
    Verbs {
        /// The call.
        call: String,
        /// Its error.
        detail: String,
    },
    /// Devices exist but none of their ports is active.
    #[error("no active RDMA port; found {found}")]
    NoActivePort {
        /// The ports found, described.
        found: String,
    },
    /// Active ports exist but the HCA filter leaves none.
    #[error("no active RDMA port matches FERROCCL_IB_HCA={spec}; found {found}")]
    NoneMatched {
        /// The filter.
        spec: String,
        /// The ports found, described.
        found: String,
    },
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The ports to use, in order, among `candidates` (as probed, in the
/// device list's order): the active ones that the HCA filter lets
/// through. With an include list, ports come in the list's order (the
/// first item's matches first), each once; otherwise in candidate order.
pub fn select_ports(spec: &HcaSpec, candidates: &[Port]) -> Result<Vec<Port>, ProbeError> {
    let found = || {
        candidates
            .iter()
            .map(Port::describe)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if candidates.is_empty() {
        return Err(ProbeError::NoDevice("the device list is empty".to_string()));
    }
    let active: Vec<&Port> = candidates.iter().filter(|p| p.active).collect();
    if active.is_empty() {
        return Err(ProbeError::NoActivePort { found: found() });
    }
    let chosen: Vec<Port> = if spec.items.is_empty() {
        active.into_iter().cloned().collect()
    } else if spec.exclude {
        active
            .into_iter()
            .filter(|p| !spec.items.iter().any(|i| spec.item_matches(i, p)))
            .cloned()
            .collect()
    } else {
        let mut out: Vec<Port> = Vec::new();
        for item in &spec.items {
            for p in &active {
                if spec.item_matches(item, p)
                    && !out.iter().any(|o| o.device == p.device && o.port == p.port)
                {
                    out.push((*p).clone());
                }
            }
        }
        out
    };
    if chosen.is_empty() {
        return Err(ProbeError::NoneMatched {
            spec: spec.to_string(),
            found: found(),
        });
    }
    Ok(chosen)
}

/// The GID to use on `port`.
///
/// With `forced` (`FERROCCL_IB_GID_INDEX`), that index, which must be in
/// the port's table. Otherwise:
/// - InfiniBand: index 0 if present (the port's default GID; routing within
///   a subnet uses the LID anyway), else the lowest valid index;
/// - Ethernet (RoCE), first that exists, lowest index first: a RoCE v2 GID
///   holding an IPv4-mapped address; a RoCE v2 GID that is not link-local;
///   any RoCE v2 GID; a RoCE v1 GID; any GID.
///
/// `Ok(None)` when the table is empty (an InfiniBand port then connects
/// by LID alone).
pub fn choose_gid(port: &Port, forced: Option<u8>) -> Result<Option<Gid>, ConfigError> {
    let gids: Vec<&Gid> = port.gids.iter().filter(|g| !g.is_zero()).collect();
    if let Some(i) = forced {
        return match gids.iter().find(|g| g.index == i) {
            Some(g) => Ok(Some(**g)),
            None => Err(ConfigError {
                var: GID_INDEX.0.to_string(),
                value: i.to_string(),
                why: format!(
                    "{} has no valid GID at index {i} (valid: {:?})",
                    port.describe(),
                    gids.iter().map(|g| g.index).collect::<Vec<_>>()
                ),
            }),
        };
    }
    let lowest = |pred: &dyn Fn(&Gid) -> bool| {
        gids.iter()
            .filter(|g| pred(g))
            .min_by_key(|g| g.index)
            .map(|g| **g)
    };
    let pick = match port.link_layer {
        LinkLayer::Infiniband => lowest(&|g| g.index == 0).or_else(|| lowest(&|_| true)),
        LinkLayer::Ethernet => lowest(&|g| g.kind == GidKind::RoceV2 && g.is_ipv4_mapped())
            .or_else(|| lowest(&|g| g.kind == GidKind::RoceV2 && !g.is_link_local()))
            .or_else(|| lowest(&|g| g.kind == GidKind::RoceV2))
            .or_else(|| lowest(&|g| g.kind == GidKind::RoceV1))
            .or_else(|| lowest(&|_| true)),
    };
    Ok(pick)
}

const HCA: (&str, &str) = ("FERROCCL_IB_HCA", "NCCL_IB_HCA");
const GID_INDEX: (&str, &str) = ("FERROCCL_IB_GID_INDEX", "NCCL_IB_GID_INDEX");
const TIMEOUT: (&str, &str) = ("FERROCCL_IB_TIMEOUT", "NCCL_IB_TIMEOUT");
const RETRY_CNT: (&str, &str) = ("FERROCCL_IB_RETRY_CNT", "NCCL_IB_RETRY_CNT");
const QPS: (&str, &str) = (
    "FERROCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_QPS_PER_CONNECTION",
);

/// The transport's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IbConfig {
    /// Which devices / ports.
    pub hca: HcaSpec,
    /// A forced GID index; `None`: chosen by [`choose_gid`].
    pub gid_index: Option<u8>,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout), 1..=31.
    pub timeout: u8,
    /// Transport retry count, 0..=7.
    pub retry_cnt: u8,
    /// Queue pairs per connection, 1..=16.
    pub qps_per_connection: u8,
}

impl Default for IbConfig {
    fn default() -> Self {
        Self {
            hca: HcaSpec::default(),
            gid_index: None,
            timeout: 20,
            retry_cnt: 7,
            qps_per_connection: 1,
        }
    }
}

impl IbConfig {
    /// From the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// From `lookup(name)` (the environment, or a map in tests). Ours is
    /// read first; its `NCCL_` alias when ours is unset or empty.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Self::from_lookup_over(Self::default(), lookup)
    }

    /// `base` with the settings `lookup` has applied over it (those not
    /// set keep `base`'s values).
    pub fn from_lookup_over(
        base: Self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let get = |(ours, nccl): (&'static str, &'static str)| {
            [ours, nccl].into_iter().find_map(|var| {
                lookup(var)
                    .filter(|v| !v.trim().is_empty())
                    .map(|v| (var, v))
            })
        };
        let mut cfg = base;
        if let Some((var, v)) = get(HCA) {
            cfg.hca = HcaSpec::parse(var, &v)?;
        }
        if let Some((var, v)) = get(GID_INDEX) {
            cfg.gid_index = Some(parse_in(var, &v, 0, 255)?);
        }
        if let Some((var, v)) = get(TIMEOUT) {
            cfg.timeout = parse_in(var, &v, 1, 31)?;
        }
        if let Some((var, v)) = get(RETRY_CNT) {
            cfg.retry_cnt = parse_in(var, &v, 0, 7)?;
        }
        if let Some((var, v)) = get(QPS) {
            cfg.qps_per_connection = parse_in(var, &v, 1, 16)?;
        }
        Ok(cfg)
    }
}

fn parse_in(var: &str, value: &str, min: u8, max: u8) -> Result<u8, ConfigError> {
    let err = |why: String| ConfigError {
        var: var.to_string(),
        value: value.to_string(),
        why,
    };
    let n: i64 = value
        .trim()
        .parse()
        .map_err(|_| err(format!("not a whole number (expected {min} to {max})")))?;
    if n < i64::from(min) || n > i64::from(max) {
        return Err(err(format!("out of range {min} to {max}")));
    }
    Ok(n as u8)
}

/// What to do about the InfiniBand transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Use these ports.
    Use(Vec<Port>),
    /// Not asked for and not usable: the caller logs one INFO line with
    /// `reason` and uses TCP.
    FallBack {
        /// Why (the probe's error).
        reason: String,
    },
    /// Asked for (`FERROCCL_TRANSPORT=ib`) but not usable: an error for
    /// the user, saying what is missing.
    Fail {
        /// The message.
        message: String,
    },
}

/// The fallback rule: `forced` is whether `FERROCCL_TRANSPORT=ib` asks
/// for this transport; `probe` is [`crate::probe`]'s answer.
pub fn decide(forced: bool, probe: Result<Vec<Port>, ProbeError>) -> Decision {
    match probe {
        Ok(ports) if !ports.is_empty() => Decision::Use(ports),
        Ok(_) => no_port(forced, "no RDMA port found".to_string()),
        Err(e) => no_port(forced, e.to_string()),
    }
}

fn no_port(forced: bool, why: String) -> Decision {
    if forced {
        Decision::Fail {
            message: format!(
                "FERROCCL_TRANSPORT=ib, but the InfiniBand transport cannot be used: {why}"
            ),
        }
    } else {
        Decision::FallBack {
            reason: format!("InfiniBand transport not used ({why}); using TCP"),
        }
    }
}

/// Without feature `ib` there are no real verbs: always
/// [`ProbeError::NotBuilt`].
#[cfg(not(feature = "ib"))]
pub fn probe(_cfg: &IbConfig) -> Result<Vec<Port>, ProbeError> {
    Err(ProbeError::NotBuilt)
}

/// One end of a queue pair as its peer needs it, exchanged out of band
/// (e.g. over the TCP bootstrap) before connecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First packet sequence number (24 bits).
    pub psn: u32,
    /// The port's LID (InfiniBand; zero on RoCE).
    pub lid: u16,
    /// The GID used (all zero when none).
    pub gid: [u8; 16],
    /// Port number, from 1.
    pub port: u8,
    /// The port's active MTU in bytes: 256, 512, 1024, 2048 or 4096.
    pub mtu: u32,
}

/// Why bytes are not an [`Endpoint`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// Wrong length.
    #[error("endpoint: {got} bytes, expected {expected}")]
    Length {
        /// Bytes given.
        got: usize,
        /// [`Endpoint::LEN`].
        expected: usize,
    },
    /// Not starting with the magic (another protocol or version).
    #[error("endpoint: bad magic {0:02x?} (not a ferroccl IB endpoint, or another version)")]
    Magic([u8; 4]),
    /// A field out of its range.
    #[error("endpoint: {0}")]
    Field(String),
}

/// MTU in bytes from its verbs code (`IBV_MTU_256` = 1 ... `IBV_MTU_4096` = 5).
pub fn mtu_from_code(code: u32) -> Option<u32> {
    (1..=5).contains(&code).then(|| 128 << code)
}

/// The verbs code of an MTU in bytes (see [`mtu_from_code`]).
pub fn mtu_code(bytes: u32) -> Option<u32> {
    (1..=5).find(|c| 128 << c == bytes)
}

impl Endpoint {
    /// Encoded length.
    pub const LEN: usize = 32;
    const MAGIC: [u8; 4] = *b"FIB1";

    /// Encodes: magic, qpn, psn (big endian u32 each), lid (u16), port,
    /// MTU code, GID (16 bytes).
    ///
    /// # Panics
    /// If the MTU is not one of the five valid sizes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let code = mtu_code(self.mtu).expect("endpoint MTU must be 256, 512, 1024, 2048 or 4096");
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&Self::MAGIC);
        b[4..8].copy_from_slice(&self.qpn.to_be_bytes());
        b[8..12].copy_from_slice(&self.psn.to_be_bytes());
        b[12..14].copy_from_slice(&self.lid.to_be_bytes());
        b[14] = self.port;
        b[15] = code as u8;
        b[16..32].copy_from_slice(&self.gid);
        b
    }

    /// Decodes and validates [`to_bytes`](Self::to_bytes)'s output.
    pub fn from_bytes(b: &[u8]) -> Result<Self, EndpointError> {
        if b.len() != Self::LEN {
            return Err(EndpointError::Length {
                got: b.len(),
                expected: Self::LEN,
            });
        }
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != Self::MAGIC {
            return Err(EndpointError::Magic(magic));
        }
        let u32_at = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let (qpn, psn) = (u32_at(4), u32_at(8));
        if qpn >= 1 << 24 {
            return Err(EndpointError::Field(format!(
                "qp number {qpn} over 24 bits"
            )));
        }
        if psn >= 1 << 24 {
            return Err(EndpointError::Field(format!("PSN {psn} over 24 bits")));
        }
        if b[14] == 0 {
            return Err(EndpointError::Field(
                "port 0 (ports count from 1)".to_string(),
            ));
        }
        let mtu = mtu_from_code(u32::from(b[15]))
            .ok_or_else(|| EndpointError::Field(format!("MTU code {} not 1 to 5", b[15])))?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        Ok(Self {
            qpn,
            psn,
            lid: u16::from_be_bytes([b[12], b[13]]),
            gid,
            port: b[14],
            mtu,
        })
    }
}
