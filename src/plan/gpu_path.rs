//! Which path device data between this rank's GPU and each peer's would
//! take, and why: the same-process path (raw device pointers), cuda-ipc
//! (one host, GPUs that reach each other), or staging through host memory
//! (`exec::staged`). The planner's part for device calls that is per pair
//! of ranks; `plan::device::decide` asks it for every pair.
//!
//! Owns what each rank publishes about its GPU ([`GpuIdentity`] and its
//! wire form), the decision from described facts ([`select`]), the
//! FERROCCL_P2P_DISABLE switch and the INFO line per peer. Pure, as the
//! whole planner: the facts (a GPU's identity, peer access) are asked of
//! the driver by the device executor's set-up (`comm::device_exec`, at the
//! first collective device call), so every topology can be described and
//! tested without a GPU.

use crate::error::{Error, Result};
use ferroccl_cuda::topo::normalize_pci_bus_id;
use ferroccl_transport::HostInfo;

/// The variable that turns the GPU peer-to-peer paths off (`1`).
pub(crate) const P2P_DISABLE: &str = "FERROCCL_P2P_DISABLE";
/// NCCL's name for it, read when [`P2P_DISABLE`] is not set.
pub(crate) const NCCL_P2P_DISABLE: &str = "NCCL_P2P_DISABLE";

/// What one rank publishes about its GPU through the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GpuIdentity {
    /// The device's UUID (`cuDeviceGetUuid_v2`): equal on two ranks means
    /// one GPU.
    pub(crate) uuid: [u8; 16],
    /// PCI bus id in sysfs's form, `0000:1b:00.0`.
    pub(crate) pci_bus_id: String,
    /// The device's NUMA node; `None`: unknown.
    pub(crate) numa_node: Option<u32>,
    /// The device's ordinal in its own process (for messages only: other
    /// processes may number devices differently).
    pub(crate) ordinal: u32,
    /// The host, as the transports identify it (`topo::host_info`: boot
    /// id, hostname, network namespace). Empty: unknown, never equal to
    /// another.
    pub(crate) host: HostInfo,
    /// The process id on that host.
    pub(crate) pid: u32,
}

/// The version of [`GpuIdentity::to_bytes`]'s layout.
pub(crate) const WIRE_VERSION: u8 = 1;
/// Bytes before the variable-length fields: version, flags, ordinal, pid,
/// NUMA node, UUID.
const WIRE_FIXED: usize = 1 + 1 + 4 + 4 + 4 + 16;
/// Flag bit: the NUMA node field holds a node.
const FLAG_NUMA: u8 = 1;
/// The longest PCI bus id on the wire (`ffffffff:ff:1f.7` has 16).
const MAX_BUS_ID: usize = 32;
/// The longest host id on the wire (they are a few hundred bytes).
const MAX_HOST_ID: usize = 4096;

impl GpuIdentity {
    /// The wire form, version [`WIRE_VERSION`], little endian:
    ///
    /// | bytes | field |
    /// |---|---|
    /// | 1 | version (1) |
    /// | 1 | flags: bit 0 = the NUMA node is known; others 0 |
    /// | 4 | ordinal |
    /// | 4 | pid |
    /// | 4 | NUMA node (0 when unknown) |
    /// | 16 | UUID |
    /// | 1 + n | PCI bus id: n (at most 32), then n ASCII bytes, normalised |
    /// | 2 + m | host id: m (at most 4096), then m UTF-8 bytes |
    ///
    /// Nothing follows. Refuses (`InvalidArgument`) a bus id not in the
    /// normalised form and a host id over the bound.
    pub(crate) fn to_bytes(&self) -> Result<Vec<u8>> {
        if normalize_pci_bus_id(&self.pci_bus_id).as_deref() != Ok(self.pci_bus_id.as_str()) {
            return Err(Error::InvalidArgument(format!(
                "GPU identity: the PCI bus id '{}' is not in the form 0000:1b:00.0",
                self.pci_bus_id
            )));
        }
        let host = self.host.host_id.as_bytes();
        if host.len() > MAX_HOST_ID {
            return Err(Error::InvalidArgument(format!(
                "GPU identity: a host id of {} bytes is over the {MAX_HOST_ID} the wire carries",
                host.len()
            )));
        }
        let bus = self.pci_bus_id.as_bytes();
        let mut out = Vec::with_capacity(WIRE_FIXED + 1 + bus.len() + 2 + host.len());
        out.push(WIRE_VERSION);
        out.push(if self.numa_node.is_some() {
            FLAG_NUMA
        } else {
            0
        });
        out.extend_from_slice(&self.ordinal.to_le_bytes());
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.numa_node.unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&self.uuid);
        out.push(bus.len() as u8);
        out.extend_from_slice(bus);
        out.extend_from_slice(&(host.len() as u16).to_le_bytes());
        out.extend_from_slice(host);
        Ok(out)
    }

    /// Decode [`to_bytes`](Self::to_bytes)'s form. Anything else (short,
    /// long, another version, unknown flags, a bus id not in normal form, a
    /// host id not UTF-8) is `Error::Bootstrap` saying what, never a panic.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Result<GpuIdentity> {
        let bad = |why: String| {
            Error::Bootstrap(format!(
                "a GPU identity of {} bytes does not decode: {why}",
                bytes.len()
            ))
        };
        let mut r = Reader { bytes, at: 0 };
        let version = r.take(1).ok_or_else(|| bad("empty".into()))?[0];
        if version != WIRE_VERSION {
            return Err(bad(format!(
                "version {version}, this build reads {WIRE_VERSION} (ranks of different builds?)"
            )));
        }
        let fixed = r
            .take(WIRE_FIXED - 1)
            .ok_or_else(|| bad(format!("shorter than the {WIRE_FIXED} fixed bytes")))?;
        let flags = fixed[0];
        if flags & !FLAG_NUMA != 0 {
            return Err(bad(format!("unknown flags {flags:#04x}")));
        }
        let word = |at: usize| {
            u32::from_le_bytes([fixed[at], fixed[at + 1], fixed[at + 2], fixed[at + 3]])
        };
        let (ordinal, pid, numa) = (word(1), word(5), word(9));
        let numa_node = match flags & FLAG_NUMA {
            0 if numa != 0 => return Err(bad(format!("NUMA node {numa} without its flag"))),
            0 => None,
            _ => Some(numa),
        };
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&fixed[13..29]);

        let n = r
            .take(1)
            .ok_or_else(|| bad("no PCI bus id length".into()))?[0] as usize;
        if n > MAX_BUS_ID {
            return Err(bad(format!(
                "a PCI bus id of {n} bytes (at most {MAX_BUS_ID})"
            )));
        }
        let bus = r
            .take(n)
            .ok_or_else(|| bad(format!("the PCI bus id is cut short (of {n} bytes)")))?;
        let pci_bus_id = std::str::from_utf8(bus)
            .map_err(|_| bad("the PCI bus id is not text".into()))?
            .to_string();
        match normalize_pci_bus_id(&pci_bus_id) {
            Ok(norm) if norm == pci_bus_id => {}
            Ok(norm) => {
                return Err(bad(format!(
                    "the PCI bus id '{pci_bus_id}' is not in normal form ('{norm}')"
                )))
            }
            Err(why) => return Err(bad(format!("the PCI bus id '{pci_bus_id}': {why}"))),
        }

        let m = r
            .take(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
            .ok_or_else(|| bad("no host id length".into()))?;
        if m > MAX_HOST_ID {
            return Err(bad(format!(
                "a host id of {m} bytes (at most {MAX_HOST_ID})"
            )));
        }
        let host = r
            .take(m)
            .ok_or_else(|| bad(format!("the host id is cut short (of {m} bytes)")))?;
        let host_id = std::str::from_utf8(host)
            .map_err(|_| bad("the host id is not UTF-8".into()))?
            .to_string();
        if r.at != bytes.len() {
            return Err(bad(format!("{} bytes after the end", bytes.len() - r.at)));
        }
        Ok(GpuIdentity {
            uuid,
            pci_bus_id,
            numa_node,
            ordinal,
            host: HostInfo { host_id },
            pid,
        })
    }

    /// One host: equal host ids, neither unknown.
    pub(crate) fn same_host(&self, other: &GpuIdentity) -> bool {
        !self.host.host_id.is_empty() && self.host == other.host
    }
}

/// Bounded reads from a byte slice.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}
impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let out = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(out)
    }
}

/// The path device data between two ranks takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum GpuPath {
    /// Ranks of one process: kernels use each other's device pointers.
    SameProcess,
    /// Processes of one host whose GPUs reach each other (or share one):
    /// device memory shared through CUDA IPC.
    CudaIpc,
    /// Through pinned host memory over a host transport (`exec::staged`).
    Staged,
}

impl GpuPath {
    /// The name in the INFO line.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            GpuPath::SameProcess => "same-process",
            GpuPath::CudaIpc => "cuda-ipc",
            GpuPath::Staged => "staged",
        }
    }
}

/// What the choice for one pair of ranks rests on. Build it with
/// [`PathFacts::between`]; every field must be the same on both ranks of
/// the pair, so that both choose the same path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PathFacts {
    /// One host (equal, known host ids).
    pub(crate) same_host: bool,
    /// One process: one host and equal pids.
    pub(crate) same_process: bool,
    /// One GPU: equal UUIDs on one host.
    pub(crate) same_gpu: bool,
    /// Whether each GPU can access the other's memory
    /// (`cuDeviceCanAccessPeer`, both ways: `comm::device_exec`'s
    /// `peer_access`, then
    /// [`agree`] between the two ranks' answers). `None`: unknown (the
    /// GPUs are on other hosts, or a rank does not see the other's GPU).
    pub(crate) can_access_peer: Option<bool>,
    /// P2P turned off (`Config::p2p` false: FERROCCL_P2P_DISABLE=1 or
    /// NCCL_P2P_DISABLE=1).
    pub(crate) p2p_disabled: bool,
    /// Device memory can be shared across processes (the launcher maps
    /// peers' FIFOs with cuda-ipc, `comm::device_exec::share`): the launcher
    /// says true; false describes a build or caller without it, whose
    /// cross-process pairs are staged. The same-process path needs
    /// nothing of it.
    pub(crate) cuda_ipc_available: bool,
}

impl PathFacts {
    /// The facts between `me` and `peer`: the relations from their
    /// identities, the rest as given.
    pub(crate) fn between(
        me: &GpuIdentity,
        peer: &GpuIdentity,
        can_access_peer: Option<bool>,
        p2p_disabled: bool,
        cuda_ipc_available: bool,
    ) -> PathFacts {
        let same_host = me.same_host(peer);
        PathFacts {
            same_host,
            same_process: same_host && me.pid == peer.pid,
            same_gpu: same_host && me.uuid == peer.uuid,
            can_access_peer,
            p2p_disabled,
            cuda_ipc_available,
        }
    }
}

/// One peer's path and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PathChoice {
    /// The peer's rank.
    pub(crate) peer: usize,
    /// The path.
    pub(crate) path: GpuPath,
    /// A sentence for the INFO line: the peer, its GPU and relation, the
    /// path and why.
    pub(crate) reason: String,
}

/// The path between this rank (`me`) and rank `peer_rank` (`peer`), from
/// `facts`, in order: GPUs on other hosts are staged (no RDMA path yet);
/// P2P turned off, staged; GPUs that cannot reach each other (neither one
/// GPU nor peer access), staged; ranks of one process, the same-process
/// path; else cuda-ipc. The last two need the cuda-ipc transport, and
/// without it are staged with the reason saying so.
///
/// The decision reads `facts` only (so both ranks of a pair, given the
/// same facts, choose alike); the identities only name things in the
/// reason.
pub(crate) fn select(
    me: &GpuIdentity,
    peer_rank: usize,
    peer: &GpuIdentity,
    facts: &PathFacts,
) -> PathChoice {
    let who = if !facts.same_host {
        format!("rank {peer_rank} (GPU {}, other host)", peer.pci_bus_id)
    } else {
        format!(
            "rank {peer_rank} (GPU {}, {}, {})",
            peer.pci_bus_id,
            if facts.same_gpu {
                "same GPU"
            } else {
                "other GPU"
            },
            if facts.same_process {
                "same process"
            } else {
                "other process"
            }
        )
    };
    let staged = |why: String| PathChoice {
        peer: peer_rank,
        path: GpuPath::Staged,
        reason: format!("{who}: staged through host memory, {why}"),
    };
    if !facts.same_host {
        return staged("no GPU path between hosts yet".into());
    }
    if facts.p2p_disabled {
        return staged(format!(
            "P2P is off ({P2P_DISABLE}=1, {NCCL_P2P_DISABLE}=1 or Config::p2p)"
        ));
    }
    let reach = if facts.same_gpu {
        if facts.same_process && facts.can_access_peer == Some(false) {
            return staged(
                "ranks of one process on one GPU share its context, whose streams may share a \
                 hardware queue: one rank's kernel can then wait in the queue behind work that \
                 waits for the other rank's kernel (an H200 hung so; one process per GPU, or \
                 processes under MPS, for the executor)"
                    .into(),
            );
        }
        if !facts.same_process && facts.can_access_peer == Some(false) {
            return staged(
                "processes on one GPU without MPS take turns on it, and the device executor's \
                 kernels wait for each other (start the MPS daemon, nvidia-cuda-mps-control -d, \
                 for the executor)"
                    .into(),
            );
        }
        "one GPU needs no peer access".to_string()
    } else {
        match facts.can_access_peer {
            Some(true) => format!(
                "GPUs {} and {} access each other's memory",
                me.pci_bus_id, peer.pci_bus_id
            ),
            Some(false) => {
                return staged(format!(
                    "GPUs {} and {} cannot access each other's memory (cuDeviceCanAccessPeer)",
                    me.pci_bus_id, peer.pci_bus_id
                ))
            }
            None => {
                return staged(format!(
                    "peer access between GPUs {} and {} is unknown (a rank does not see the \
                     other's GPU)",
                    me.pci_bus_id, peer.pci_bus_id
                ))
            }
        }
    };
    let wanted = if facts.same_process {
        GpuPath::SameProcess
    } else {
        GpuPath::CudaIpc
    };
    if wanted == GpuPath::CudaIpc && !facts.cuda_ipc_available {
        return staged(format!(
            "cuda-ipc would serve ({reach}) but the device executor does not map FIFOs \
             across processes yet"
        ));
    }
    PathChoice {
        peer: peer_rank,
        path: wanted,
        reason: format!("{who}: {}, {reach}", wanted.name()),
    }
}

/// The pair's peer-access fact from both ranks' answers: yes only if both
/// say yes, no if either says no, else unknown.
pub(crate) fn agree(mine: Option<bool>, theirs: Option<bool>) -> Option<bool> {
    match (mine, theirs) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

/// The choice for every peer of rank `rank` among `gpus` (every rank's
/// identity, in rank order), with `access(me, peer)` the pair's agreed
/// peer access.
pub(crate) fn select_all(
    rank: usize,
    gpus: &[GpuIdentity],
    access: &dyn Fn(usize, usize) -> Option<bool>,
    p2p_disabled: bool,
    cuda_ipc_available: bool,
) -> Vec<PathChoice> {
    let me = &gpus[rank];
    gpus.iter()
        .enumerate()
        .filter(|&(r, _)| r != rank)
        .map(|(r, peer)| {
            let facts =
                PathFacts::between(me, peer, access(rank, r), p2p_disabled, cuda_ipc_available);
            select(me, r, peer, &facts)
        })
        .collect()
}

/// One INFO line per peer: which path and why.
pub(crate) fn log_choices(rank: usize, choices: &[PathChoice]) {
    for c in choices {
        tracing::info!(rank, "GPU path to {}", c.reason);
    }
}

/// FERROCCL_P2P_DISABLE, else NCCL_P2P_DISABLE, read through `get`:
/// `Some(true)`: off (`1`), `Some(false)`: on (`0`), `None`: neither set
/// (an empty value counts as unset). The FERROCCL_ name wins when both
/// are set, and the other is then not read. NCCL's meaning: `1` turns P2P
/// off; any value but `0` and `1` is an error naming the variable.
pub(crate) fn p2p_disabled_from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<bool>> {
    for name in [P2P_DISABLE, NCCL_P2P_DISABLE] {
        let Some(value) = get(name) else { continue };
        return match value.trim() {
            "" => continue,
            "0" => Ok(Some(false)),
            "1" => Ok(Some(true)),
            _ => Err(Error::Env(format!(
                "{name}='{value}' must be 0 or 1 (1 turns off the GPU peer-to-peer paths)"
            ))),
        };
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const HOST_A: &str = "boot-a/node-a/net:[4026531840]";
    const HOST_B: &str = "boot-b/node-b/net:[4026531840]";

    fn gpu(host: &str, pid: u32, uuid_byte: u8, bus: &str, ordinal: u32) -> GpuIdentity {
        let mut uuid = [0x5au8; 16];
        uuid[0] = uuid_byte;
        GpuIdentity {
            uuid,
            pci_bus_id: bus.into(),
            numa_node: Some(u32::from(uuid_byte % 2)),
            ordinal,
            host: HostInfo {
                host_id: host.into(),
            },
            pid,
        }
    }

    /// The path and reason between `a` and `b` (peer rank 1), with cuda-ipc
    /// built and P2P on, unless said otherwise.
    fn choose(a: &GpuIdentity, b: &GpuIdentity, access: Option<bool>) -> PathChoice {
        choose_with(a, b, access, false, true)
    }

    fn choose_with(
        a: &GpuIdentity,
        b: &GpuIdentity,
        access: Option<bool>,
        disabled: bool,
        ipc: bool,
    ) -> PathChoice {
        let facts = PathFacts::between(a, b, access, disabled, ipc);
        let choice = select(a, 1, b, &facts);
        // Both ranks of the pair, given the same facts, choose alike.
        let back = select(b, 0, a, &PathFacts::between(b, a, access, disabled, ipc));
        assert_eq!(choice.path, back.path, "{choice:?} / {back:?}");
        choice
    }

    #[test]
    fn ranks_of_one_process_take_the_same_process_path() {
        // Two threads on one GPU (a stand-in, which says yes, or unknown).
        let a = gpu(HOST_A, 100, 1, "0000:1b:00.0", 0);
        for access in [None, Some(true)] {
            let c = choose(&a, &a.clone(), access);
            assert_eq!(c.path, GpuPath::SameProcess);
            assert_eq!(
                c.reason,
                "rank 1 (GPU 0000:1b:00.0, same GPU, same process): same-process, one GPU \
                 needs no peer access"
            );
        }
        // A real GPU says no for two ranks of one process (their kernels
        // may wait in one hardware queue): staged, saying why.
        let c = choose(&a, &a.clone(), Some(false));
        assert_eq!(c.path, GpuPath::Staged);
        assert!(c.reason.contains("share a hardware queue"), "{}", c.reason);
        // Two GPUs of one process with peer access.
        let b = gpu(HOST_A, 100, 2, "0000:3d:00.0", 1);
        let c = choose(&a, &b, Some(true));
        assert_eq!(c.path, GpuPath::SameProcess);
        assert!(c.reason.contains("other GPU, same process"), "{}", c.reason);
        // Without it, a kernel cannot dereference the other's pointers.
        assert_eq!(choose(&a, &b, Some(false)).path, GpuPath::Staged);
    }

    #[test]
    fn one_gpu_in_two_processes_takes_cuda_ipc_without_peer_access() {
        let a = gpu(HOST_A, 100, 1, "0000:1b:00.0", 0);
        // The other process numbers the same device differently.
        let b = gpu(HOST_A, 200, 1, "0000:1b:00.0", 3);
        for access in [None, Some(true)] {
            let c = choose(&a, &b, access);
            assert_eq!(c.path, GpuPath::CudaIpc, "{access:?}");
            assert_eq!(
                c.reason,
                "rank 1 (GPU 0000:1b:00.0, same GPU, other process): cuda-ipc, one GPU needs \
                 no peer access"
            );
        }
        // For one GPU the answer between processes is MPS's: without it
        // their kernels take turns, so the pair is staged, saying why.
        let c = choose(&a, &b, Some(false));
        assert_eq!(c.path, GpuPath::Staged);
        assert!(c.reason.contains("without MPS"), "{}", c.reason);
    }

    #[test]
    fn two_gpus_take_cuda_ipc_only_with_peer_access() {
        let a = gpu(HOST_A, 100, 1, "0000:1b:00.0", 0);
        let b = gpu(HOST_A, 200, 2, "0000:3d:00.0", 0);
        let c = choose(&a, &b, Some(true));
        assert_eq!(c.path, GpuPath::CudaIpc);
        assert_eq!(
            c.reason,
            "rank 1 (GPU 0000:3d:00.0, other GPU, other process): cuda-ipc, GPUs 0000:1b:00.0 \
             and 0000:3d:00.0 access each other's memory"
        );
        let c = choose(&a, &b, Some(false));
        assert_eq!(c.path, GpuPath::Staged);
        assert_eq!(
            c.reason,
            "rank 1 (GPU 0000:3d:00.0, other GPU, other process): staged through host memory, \
             GPUs 0000:1b:00.0 and 0000:3d:00.0 cannot access each other's memory \
             (cuDeviceCanAccessPeer)"
        );
        let c = choose(&a, &b, None);
        assert_eq!(c.path, GpuPath::Staged);
        assert!(c.reason.contains("unknown"), "{}", c.reason);
    }

    #[test]
    fn other_hosts_are_staged() {
        let a = gpu(HOST_A, 100, 1, "0000:1b:00.0", 0);
        let b = gpu(HOST_B, 100, 2, "0000:1b:00.0", 0);
        let c = choose(&a, &b, Some(true));
        assert_eq!(c.path, GpuPath::Staged);
        assert_eq!(
            c.reason,
            "rank 1 (GPU 0000:1b:00.0, other host): staged through host memory, no GPU path \
             between hosts yet"
        );
        // Equal pids and UUIDs on other hosts are not one process or GPU.
        let twin = GpuIdentity {
            host: HostInfo {
                host_id: HOST_B.into(),
            },
            ..a.clone()
        };
        let f = PathFacts::between(&a, &twin, Some(true), false, true);
        assert!(!f.same_host && !f.same_process && !f.same_gpu, "{f:?}");
        assert_eq!(choose(&a, &twin, Some(true)).path, GpuPath::Staged);
        // An unknown host is nobody's host, not even another unknown one.
        let (x, y) = (
            gpu("", 100, 1, "0000:1b:00.0", 0),
            gpu("", 100, 1, "0000:1b:00.0", 0),
        );
        assert_eq!(choose(&x, &y, Some(true)).path, GpuPath::Staged);
    }

    #[test]
    fn p2p_disabled_stages_every_pair() {
        let a = gpu(HOST_A, 100, 1, "0000:1b:00.0", 0);
        for (b, access) in [
            (a.clone(), None),                                    // same process and GPU
            (gpu(HOST_A, 200, 1, "0000:1b:00.0", 0), None),       // same GPU
            (gpu(HOST_A, 200, 2, "0000:3d:00.0", 1), Some(true)), // peer access
        ] {
            let c = choose_with(&a, &b, access, true, true);
            assert_eq!(c.path, GpuPath::Staged, "{b:?}");
            assert!(
                c.reason.ends_with(
                    "staged through host memory, P2P is off (FERROCCL_P2P_DISABLE=1, \
                 NCCL_P2P_DISABLE=1 or Config::p2p)"
                ),
                "{}",
                c.reason
            );
        }
    }

    #[test]
    fn without_the_cuda_ipc_transport_what_would_serve_is_staged_and_said() {
        let a = gpu(HOST_A, 100, 1, "0000:1b:00.0", 0);
        let same_process = a.clone();
        let same_gpu = gpu(HOST_A, 200, 1, "0000:1b:00.0", 0);
        // The same-process path needs no mapping across processes.
        let c = choose_with(&a, &same_process, None, false, false);
        assert_eq!(c.path, GpuPath::SameProcess, "{}", c.reason);
        let c = choose_with(&a, &same_gpu, None, false, false);
        assert_eq!(c.path, GpuPath::Staged);
        assert_eq!(
            c.reason,
            "rank 1 (GPU 0000:1b:00.0, same GPU, other process): staged through host memory, \
             cuda-ipc would serve (one GPU needs no peer access) but the device executor does \
             not map FIFOs across processes yet"
        );
        // What is staged anyway says its own reason, not the mapping's.
        let far = gpu(HOST_B, 100, 2, "0000:1b:00.0", 0);
        let c = choose_with(&a, &far, None, false, false);
        assert!(!c.reason.contains("does not map"), "{}", c.reason);
    }

    /// A job of 5 ranks: on host A, process 100 drives two GPUs (ranks 0
    /// and 1, peer access between them), process 200 shares rank 0's GPU
    /// (rank 2), process 300 has a GPU without peer access (rank 3); rank
    /// 4 is on host B.
    #[test]
    fn every_peer_of_a_described_job_gets_its_path() {
        let gpus = vec![
            gpu(HOST_A, 100, 1, "0000:1b:00.0", 0),
            gpu(HOST_A, 100, 2, "0000:3d:00.0", 1),
            gpu(HOST_A, 200, 1, "0000:1b:00.0", 0),
            gpu(HOST_A, 300, 3, "0000:b1:00.0", 0),
            gpu(HOST_B, 100, 4, "0000:1b:00.0", 0),
        ];
        // Peer access between the GPUs of 0/2 (1b) and 1 (3d) only; the
        // GPU that 0 and 2 share runs MPS (one GPU's answer between
        // processes).
        let bus = |r: usize| gpus[r].pci_bus_id.clone();
        let access = |a: usize, b: usize| {
            let pair = [bus(a), bus(b)];
            Some(
                gpus[a].uuid == gpus[b].uuid
                    || pair.contains(&"0000:1b:00.0".into())
                        && pair.contains(&"0000:3d:00.0".into()),
            )
        };
        use GpuPath::*;
        let want: [[Option<GpuPath>; 5]; 5] = [
            [
                None,
                Some(SameProcess),
                Some(CudaIpc),
                Some(Staged),
                Some(Staged),
            ],
            [
                Some(SameProcess),
                None,
                Some(CudaIpc),
                Some(Staged),
                Some(Staged),
            ],
            [
                Some(CudaIpc),
                Some(CudaIpc),
                None,
                Some(Staged),
                Some(Staged),
            ],
            [Some(Staged), Some(Staged), Some(Staged), None, Some(Staged)],
            [Some(Staged); 5],
        ];
        for (rank, row) in want.iter().enumerate() {
            let choices = select_all(rank, &gpus, &access, false, true);
            let peers: Vec<usize> = choices.iter().map(|c| c.peer).collect();
            assert_eq!(peers, (0..5).filter(|&r| r != rank).collect::<Vec<_>>());
            for c in &choices {
                assert_eq!(Some(c.path), row[c.peer], "rank {rank}: {}", c.reason);
            }
            // Without mapping across processes, only the same-process
            // pairs keep their path.
            let choices = select_all(rank, &gpus, &access, false, false);
            for c in &choices {
                let want = match row[c.peer] {
                    Some(SameProcess) => SameProcess,
                    _ => Staged,
                };
                assert_eq!(c.path, want, "rank {rank}: {}", c.reason);
            }
        }
    }

    #[test]
    fn the_pair_agrees_on_peer_access() {
        let (y, n, u) = (Some(true), Some(false), None);
        for (a, b, want) in [
            (y, y, y),
            (y, n, n),
            (y, u, u),
            (n, y, n),
            (n, n, n),
            (n, u, n),
            (u, y, u),
            (u, n, n),
            (u, u, u),
        ] {
            assert_eq!(agree(a, b), want, "{a:?} {b:?}");
        }
    }

    fn env(vars: &[(&str, &str)]) -> Result<Option<bool>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        p2p_disabled_from_env(&|k| map.get(k).cloned())
    }

    #[test]
    fn p2p_disable_reads_either_name_ferroccl_first() {
        assert_eq!(env(&[]).unwrap(), None);
        assert_eq!(env(&[(P2P_DISABLE, "1")]).unwrap(), Some(true));
        assert_eq!(env(&[(P2P_DISABLE, " 0 ")]).unwrap(), Some(false));
        assert_eq!(env(&[(NCCL_P2P_DISABLE, "1")]).unwrap(), Some(true));
        assert_eq!(env(&[(NCCL_P2P_DISABLE, "0")]).unwrap(), Some(false));
        // The FERROCCL_ name wins, both ways, and the other is not read.
        assert_eq!(
            env(&[(P2P_DISABLE, "0"), (NCCL_P2P_DISABLE, "1")]).unwrap(),
            Some(false)
        );
        assert_eq!(
            env(&[(P2P_DISABLE, "1"), (NCCL_P2P_DISABLE, "0")]).unwrap(),
            Some(true)
        );
        assert_eq!(
            env(&[(P2P_DISABLE, "1"), (NCCL_P2P_DISABLE, "garbage")]).unwrap(),
            Some(true)
        );
        // Empty counts as unset.
        assert_eq!(env(&[(P2P_DISABLE, "")]).unwrap(), None);
        assert_eq!(
            env(&[(P2P_DISABLE, ""), (NCCL_P2P_DISABLE, "1")]).unwrap(),
            Some(true)
        );
        for bad in ["yes", "2", "-1", "true", "1x"] {
            for name in [P2P_DISABLE, NCCL_P2P_DISABLE] {
                let err = env(&[(name, bad)]).unwrap_err().to_string();
                assert!(
                    err.contains(&format!("{name}='{bad}'")) && err.contains("0 or 1"),
                    "{err}"
                );
            }
        }
    }

    #[test]
    fn config_p2p_follows_the_environment() {
        let with = |vars: &[(&str, &str)]| -> Result<crate::Config> {
            let map: HashMap<String, String> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let mut c = crate::Config::new(0, 2, "127.0.0.1", 1, 7)?;
            c.p2p = true;
            c.from_env_overrides(&|k| map.get(k).cloned())?;
            Ok(c)
        };
        assert!(with(&[]).unwrap().p2p);
        assert!(!with(&[(P2P_DISABLE, "1")]).unwrap().p2p);
        assert!(!with(&[(NCCL_P2P_DISABLE, "1")]).unwrap().p2p);
        assert!(
            with(&[(P2P_DISABLE, "0"), (NCCL_P2P_DISABLE, "1")])
                .unwrap()
                .p2p
        );
        let err = with(&[(NCCL_P2P_DISABLE, "on")]).unwrap_err();
        assert!(
            matches!(err, Error::Env(ref m) if m.contains(NCCL_P2P_DISABLE)),
            "{err}"
        );
    }

    #[test]
    fn identities_cross_the_wire_unchanged() {
        let a = gpu(HOST_A, 4242, 7, "0000:1b:00.0", 3);
        let b = GpuIdentity {
            numa_node: None,
            pci_bus_id: "10000:db:1f.7".into(),
            host: HostInfo {
                host_id: "é".repeat(MAX_HOST_ID / 2),
            },
            pid: u32::MAX,
            ordinal: 0,
            uuid: [0xff; 16],
        };
        let c = GpuIdentity {
            host: HostInfo {
                host_id: String::new(),
            },
            numa_node: Some(u32::MAX),
            ..a.clone()
        };
        for id in [a, b, c] {
            let bytes = id.to_bytes().unwrap();
            assert_eq!(GpuIdentity::from_bytes(&bytes).unwrap(), id);
        }
    }

    /// The layout, byte by byte, written out from the table in `to_bytes`'s
    /// docs.
    #[test]
    fn the_wire_layout_is_the_documented_one() {
        let id = GpuIdentity {
            uuid: *b"0123456789abcdef",
            pci_bus_id: "0000:1b:00.0".into(),
            numa_node: Some(1),
            ordinal: 2,
            host: HostInfo {
                host_id: "h".into(),
            },
            pid: 0x0102_0304,
        };
        let mut want = vec![1u8, 1, 2, 0, 0, 0, 4, 3, 2, 1, 1, 0, 0, 0];
        want.extend_from_slice(b"0123456789abcdef");
        want.push(12);
        want.extend_from_slice(b"0000:1b:00.0");
        want.extend_from_slice(&[1, 0]);
        want.push(b'h');
        assert_eq!(id.to_bytes().unwrap(), want);
        let unknown = GpuIdentity {
            numa_node: None,
            ..id
        };
        let bytes = unknown.to_bytes().unwrap();
        assert_eq!((bytes[1], &bytes[10..14]), (0, &[0u8, 0, 0, 0][..]));
    }

    #[test]
    fn bad_identities_are_refused_with_the_reason() {
        let id = gpu(HOST_A, 100, 1, "0000:1b:00.0", 0);
        let good = id.to_bytes().unwrap();
        let decode = |b: &[u8]| GpuIdentity::from_bytes(b).unwrap_err().to_string();
        // Every cut is short somewhere; a byte more is too long.
        for n in 0..good.len() {
            let err = decode(&good[..n]);
            assert!(err.contains("does not decode"), "{n}: {err}");
        }
        let mut long = good.clone();
        long.push(0);
        assert!(decode(&long).contains("1 bytes after the end"));
        let with = |at: usize, v: u8| {
            let mut b = good.clone();
            b[at] = v;
            decode(&b)
        };
        assert!(with(0, 2).contains("version 2, this build reads 1"));
        assert!(with(1, 0x80).contains("unknown flags"));
        // Flag clear but a node given.
        let mut b = good.clone();
        b[1] = 0;
        b[10] = 5;
        assert!(decode(&b).contains("without its flag"));
        // The bus id: upper case, bad length, not text.
        let bus_at = WIRE_FIXED + 1;
        assert!(with(bus_at + 6, b'B').contains("not in normal form ('0000:1b:00.0')"));
        assert!(with(bus_at + 6, b'z').contains("not hexadecimal"));
        assert!(with(WIRE_FIXED, 200).contains("at most 32"));
        assert!(with(bus_at, 0xff).contains("not text"));
        // The host id: bound and UTF-8.
        let host_len_at = bus_at + 12;
        assert!(with(host_len_at + 1, 0xff).contains("at most 4096"));
        assert!(with(host_len_at + 2, 0xff).contains("not UTF-8"));
        // And what refuses to encode.
        let bad_bus = GpuIdentity {
            pci_bus_id: "0000:1B:00.0".into(),
            ..id.clone()
        };
        assert!(matches!(bad_bus.to_bytes(), Err(Error::InvalidArgument(_))));
        let big_host = GpuIdentity {
            host: HostInfo {
                host_id: "x".repeat(MAX_HOST_ID + 1),
            },
            ..id
        };
        assert!(matches!(
            big_host.to_bytes(),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn random_bytes_never_panic() {
        let good = gpu(HOST_A, 100, 1, "0000:1b:00.0", 0).to_bytes().unwrap();
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for i in 0..20_000 {
            let mut b = if i % 2 == 0 {
                // Flips in a valid encoding reach the later fields.
                good.clone()
            } else {
                (0..next() % 96).map(|_| next() as u8).collect()
            };
            if i % 2 == 0 {
                for _ in 0..1 + next() % 3 {
                    let at = (next() as usize) % b.len();
                    b[at] ^= 1 << (next() % 8);
                }
            }
            if let Ok(id) = GpuIdentity::from_bytes(&b) {
                // What decodes encodes back to the same bytes.
                assert_eq!(id.to_bytes().unwrap(), b);
            }
        }
    }

    #[test]
    fn one_info_line_per_peer() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let gpus = vec![
            gpu(HOST_A, 100, 1, "0000:1b:00.0", 0),
            gpu(HOST_A, 200, 1, "0000:1b:00.0", 0),
            gpu(HOST_B, 300, 2, "0000:1b:00.0", 0),
        ];
        let choices = select_all(0, &gpus, &|_, _| None, false, true);
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || log_choices(0, &choices));
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let got: Vec<&str> = text.lines().collect();
        assert_eq!(got.len(), 2, "{text}");
        assert!(
            got[0].contains(" INFO ") && got[0].contains("rank=0"),
            "{}",
            got[0]
        );
        assert!(
            got[0].contains(
                "GPU path to rank 1 (GPU 0000:1b:00.0, same GPU, other process): cuda-ipc"
            ),
            "{}",
            got[0]
        );
        assert!(
            got[1].contains("GPU path to rank 2 (GPU 0000:1b:00.0, other host): staged"),
            "{}",
            got[1]
        );
    }
}
