//! The device half of the planner: for a call in device memory, which
//! path it takes (the device executor or staging through host memory,
//! [`takes_executor`], [`decide`]), and, for the executor, the protocol
//! (bulk or low latency), chunk and channels ([`for_call`], [`choose`],
//! [`bulk_channels`]), with the reason at FERROCCL_DEBUG=INFO
//! ([`explain`]); the FIFO sizes every rank must share ([`FifoGeometry`]);
//! and the switches that narrow the choice: FERROCCL_PROTO (NCCL's
//! NCCL_PROTO read as an alias) and FERROCCL_MAX_NCHANNELS
//! (NCCL_MAX_NCHANNELS). The GPU path per peer is `gpu_path::select`'s,
//! which [`decide`] asks for every pair of ranks.
//!
//! The cost model is the one of `tune` for algorithms: a call of `steps`
//! sequential frames of `frame` bytes each costs `steps * (latency +
//! frame / bandwidth)`. The LL protocol has the lower latency (a reader
//! polls the line it wants: no fence, no counter to read first) and half
//! the bandwidth (8 data bytes per 16-byte line); bulk the other way. The
//! numbers are placeholders until the GPU run measures them
//! (docs/device-executor.md): the choice's shape (LL below a crossover
//! that grows with the link's latency gap and bandwidth) is what the tests
//! hold. The algorithm and slices of a device call are chosen by the host
//! half's rule (`plan::host::algorithm`) over the device's own link model
//! ([`links`]: GPU links inside a host, a network model between hosts),
//! never the host's measured links.
//!
//! Pure: no device, no clock, no I/O. The executing code
//! (`comm::execute`, `comm::device_exec`) gathers the facts (every rank's
//! offer, its peer-access answers, the call) and carries out what this
//! module returns.

use super::gpu_path::{self, GpuIdentity, GpuPath, PathChoice};
use super::tune::{HostLinks, Layout, LinkModel};
use crate::call::{CollCall, CollKind};
use crate::error::{Error, Result};
use ferroccl_cuda::executor::Protocol;

/// The variable that narrows the protocols (`LL`, `Simple` or `bulk`, a
/// comma list; a leading `^` excludes the listed ones).
pub(crate) const PROTO: &str = "FERROCCL_PROTO";
/// NCCL's name for it, read when [`PROTO`] is not set.
pub(crate) const NCCL_PROTO: &str = "NCCL_PROTO";

/// The variable that bounds the channels (thread blocks a rank runs a
/// call's bytes on, each over FIFOs of its own).
pub(crate) const MAX_NCHANNELS: &str = "FERROCCL_MAX_NCHANNELS";
/// NCCL's name for it, read when [`MAX_NCHANNELS`] is not set.
pub(crate) const NCCL_MAX_NCHANNELS: &str = "NCCL_MAX_NCHANNELS";
/// The most channels when neither is set. Measured on an H200 (2
/// processes under MPS, allreduce of 1 GiB, docs/hardware.md run 9):
/// 9.9 GB/s busbw on 1 channel, 60 on 8, 146 on 32; NCCL takes 16 to 32
/// on H100 NVLink.
pub(crate) const DEFAULT_CHANNELS: usize = 32;
/// The FIFOs (one a channel and peer, about 4 MiB each at the default
/// FERROCCL_BUFFSIZE) a rank makes at most when the channels are not set:
/// every rank has a FIFO from every other one on every channel, so the
/// default bound falls as ranks grow (32 channels on 2 ranks, 16 on 4,
/// 8 on 8: about 260 MiB of device memory a rank).
pub(crate) const DEFAULT_FIFOS: usize = 64;
/// The most channels one may ask for.
pub(crate) const CHANNEL_LIMIT: usize = 64;
/// Bytes a channel should have of each step before a call takes one
/// more: below this, a block's share is too small to pay for itself.
pub(crate) const MIN_CHANNEL_BYTES: usize = 128 << 10;

/// The most channels on `n` ranks where neither FERROCCL_MAX_NCHANNELS
/// nor NCCL_MAX_NCHANNELS is set: [`DEFAULT_CHANNELS`], fewer where the
/// FIFOs would pass [`DEFAULT_FIFOS`], at least 1. The same on every
/// rank (it depends on `n` only).
pub(crate) fn default_channels(n: usize) -> usize {
    (DEFAULT_FIFOS / n.max(1)).clamp(1, DEFAULT_CHANNELS)
}

/// FERROCCL_MAX_NCHANNELS, else NCCL_MAX_NCHANNELS, through `get`: 1 to
/// [`CHANNEL_LIMIT`]; `None` where neither is set (an empty value counts
/// as unset); anything else is an error naming the variable.
pub(crate) fn max_channels_from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<usize>> {
    for name in [MAX_NCHANNELS, NCCL_MAX_NCHANNELS] {
        let Some(value) = get(name) else { continue };
        let v = value.trim();
        if v.is_empty() {
            continue;
        }
        return match v.parse::<usize>() {
            Ok(c) if (1..=CHANNEL_LIMIT).contains(&c) => Ok(Some(c)),
            _ => Err(Error::Env(format!(
                "{name}='{value}': a channel count from 1 to {CHANNEL_LIMIT}"
            ))),
        };
    }
    Ok(None)
}

/// Bytes of payload in one LL slot (511 lines of 8 bytes after the
/// header line would be 4088; a power of two keeps slices aligned).
pub(crate) const LL_CHUNK_BYTES: usize = 4 << 10;
/// Bytes of one bulk slot: several hundred KiB, so the per-frame fence
/// and counter are paid rarely.
pub(crate) const BULK_CHUNK_BYTES: usize = 512 << 10;

/// What one protocol costs per frame on a link: placeholders for NVLink
/// on H100 until measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DeviceLink {
    /// Microseconds from a frame's last store to the reader's first use,
    /// bulk (fence, counter store, counter poll).
    pub(crate) bulk_latency_us: f64,
    /// The same for LL (the flag rides with the data).
    pub(crate) ll_latency_us: f64,
    /// Payload bandwidth of the bulk protocol, GB/s.
    pub(crate) bulk_gbps: f64,
}

impl Default for DeviceLink {
    fn default() -> Self {
        DeviceLink {
            bulk_latency_us: 4.0,
            ll_latency_us: 1.5,
            bulk_gbps: 150.0,
        }
    }
}

/// Output bandwidth of the GPU's reduction, GB/s: a placeholder of the
/// order of an H100's memory bandwidth (about 3 TB/s, three streams of
/// which an elementwise reduction moves) until the GPU run measures it.
pub(crate) const DEVICE_REDUCE_GBPS: f64 = 1000.0;

/// The network between hosts of GPUs, as the algorithm model reads it: a
/// placeholder of the order of one 200 Gb/s RDMA port (5 us a message,
/// 25 GB/s) until measured.
pub(crate) const DEVICE_NETWORK: LinkModel = LinkModel {
    alpha_us: 5.0,
    beta_gbps: 25.0,
    reduce_gbps: DEVICE_REDUCE_GBPS,
};

impl DeviceLink {
    /// The link as the algorithm model (`tune`) reads it: a message costs
    /// the lower protocol latency (the protocol is chosen per call after
    /// the algorithm), bytes move at the bulk bandwidth, and the GPU
    /// reduces at [`DEVICE_REDUCE_GBPS`].
    pub(crate) fn algorithm_model(&self) -> LinkModel {
        LinkModel {
            alpha_us: self.ll_latency_us.min(self.bulk_latency_us),
            beta_gbps: self.bulk_gbps,
            reduce_gbps: DEVICE_REDUCE_GBPS,
        }
    }
}

/// The links a call in device memory is planned over (its algorithm and
/// slices, `plan::host::algorithm` with these instead of the host's
/// measured ones): GPU to GPU inside a host ([`DeviceLink`]), and
/// [`DEVICE_NETWORK`] between hosts where the ranks span several. The
/// staged fallback runs the same plan, so that the executor's plan and
/// the call's lay the buffers out alike.
pub(crate) fn links(layout: Layout) -> HostLinks {
    let gpu = DeviceLink::default().algorithm_model();
    HostLinks {
        intra: gpu,
        inter: if layout.hosts > 1 {
            DEVICE_NETWORK
        } else {
            gpu
        },
    }
}

/// The protocols a communicator may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allowed {
    pub(crate) bulk: bool,
    pub(crate) ll: bool,
}

impl Default for Allowed {
    fn default() -> Self {
        Allowed {
            bulk: true,
            ll: true,
        }
    }
}

/// Reads FERROCCL_PROTO, else NCCL_PROTO. NCCL's `LL128` is accepted and
/// ignored (ferroccl has no such protocol); any other unknown name is an
/// error naming it, as is a list that leaves nothing.
pub(crate) fn allowed_from_env(get: &dyn Fn(&str) -> Option<String>) -> Result<Allowed> {
    for name in [PROTO, NCCL_PROTO] {
        let Some(value) = get(name) else { continue };
        let v = value.trim();
        if v.is_empty() {
            continue;
        }
        let (exclude, list) = match v.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, v),
        };
        let mut listed = Allowed {
            bulk: false,
            ll: false,
        };
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.to_ascii_lowercase().as_str() {
                "ll" => listed.ll = true,
                "simple" | "bulk" => listed.bulk = true,
                "ll128" => {}
                _ => {
                    return Err(Error::Env(format!(
                        "{name}='{value}': unknown protocol '{item}' (LL, Simple or bulk)"
                    )))
                }
            }
        }
        let allowed = if exclude {
            Allowed {
                bulk: !listed.bulk,
                ll: !listed.ll,
            }
        } else {
            listed
        };
        if !allowed.bulk && !allowed.ll {
            return Err(Error::Env(format!(
                "{name}='{value}' leaves no protocol ferroccl has (LL, Simple)"
            )));
        }
        return Ok(allowed);
    }
    Ok(Allowed::default())
}

/// One call's choice.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeviceChoice {
    pub(crate) protocol: Protocol,
    /// The frame size the planner slices by.
    pub(crate) chunk_bytes: usize,
    /// Channels the call's steps are cut into (`algo::channels`).
    pub(crate) channels: usize,
    /// Why, for the INFO line.
    pub(crate) reason: String,
}

/// Sequential frames and bytes per frame of a call of `bytes` (the
/// caller's count times the element size) on `n` ranks by its ring
/// schedule: what the protocols' costs scale with.
fn shape(kind: CollKind, n: usize, bytes: usize) -> (usize, usize) {
    let n1 = n.saturating_sub(1).max(1);
    match kind {
        // Reduce-scatter then allgather: 2 (n - 1) steps of a 1/n piece.
        CollKind::AllReduce => (2 * n1, bytes.div_ceil(n.max(1))),
        // n - 1 steps of a piece (the call's bytes per rank).
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => (n1, bytes),
        // A chain: n - 1 hops of the whole.
        CollKind::Broadcast | CollKind::Reduce => (n1, bytes),
        CollKind::SendRecv => (1, bytes),
        CollKind::Barrier => (2 * n1, 0),
    }
}

/// Modelled microseconds of a call with `protocol` and frames of at most
/// `chunk` bytes.
fn cost_us(kind: CollKind, n: usize, bytes: usize, protocol: Protocol, m: &DeviceLink) -> f64 {
    let (steps, per_step) = shape(kind, n, bytes);
    let (chunk, latency, gbps) = match protocol {
        Protocol::Bulk => (BULK_CHUNK_BYTES, m.bulk_latency_us, m.bulk_gbps),
        Protocol::LowLatency => (LL_CHUNK_BYTES, m.ll_latency_us, m.bulk_gbps / 2.0),
    };
    // Frames pipeline: the first pays the latency per step, the rest
    // stream behind it.
    let frames = per_step.div_ceil(chunk).max(1);
    steps as f64 * latency
        + (frames - 1) as f64 * latency.min(1.0)
        + (steps * per_step) as f64 / (gbps * 1e3)
}

/// The protocol and chunk of a call of `bytes` on `n` ranks, among those
/// `allowed`.
pub(crate) fn choose(
    kind: CollKind,
    n: usize,
    bytes: usize,
    allowed: Allowed,
    m: &DeviceLink,
) -> DeviceChoice {
    let bulk = cost_us(kind, n, bytes, Protocol::Bulk, m);
    let ll = cost_us(kind, n, bytes, Protocol::LowLatency, m);
    let (protocol, why) = match (allowed.bulk, allowed.ll) {
        (true, false) => (Protocol::Bulk, "LL excluded by FERROCCL_PROTO".to_string()),
        (false, true) => (
            Protocol::LowLatency,
            "bulk excluded by FERROCCL_PROTO".to_string(),
        ),
        _ if ll < bulk => (
            Protocol::LowLatency,
            format!("model: LL {ll:.1} us < bulk {bulk:.1} us"),
        ),
        _ => (
            Protocol::Bulk,
            format!("model: bulk {bulk:.1} us <= LL {ll:.1} us"),
        ),
    };
    let chunk_bytes = match protocol {
        Protocol::Bulk => BULK_CHUNK_BYTES,
        Protocol::LowLatency => LL_CHUNK_BYTES,
    };
    DeviceChoice {
        protocol,
        chunk_bytes,
        channels: 1,
        reason: format!("{kind:?} of {bytes} bytes on {n} ranks: {why}"),
    }
}

impl DeviceChoice {
    /// The choice with its channels, at most `max`: the bulk protocol
    /// takes one per [`MIN_CHANNEL_BYTES`] of a step's bytes; LL, whose
    /// calls are small, one. The same on every rank (it reads the call's
    /// shape only).
    pub(crate) fn with_channels(
        mut self,
        kind: CollKind,
        n: usize,
        bytes: usize,
        max: usize,
    ) -> Self {
        let (_, per_step) = shape(kind, n, bytes);
        self.channels = match self.protocol {
            Protocol::LowLatency => 1,
            Protocol::Bulk => (per_step / MIN_CHANNEL_BYTES).clamp(1, max.max(1)),
        };
        self
    }
}

/// Channels the device executor cuts a bulk call into: an allreduce
/// (`all_reduce`) or a call on one block (allgather, reduce-scatter,
/// broadcast, reduce) of `bytes` on `n` ranks, at most `max`
/// (`DeviceChoice::with_channels`'s rule). Public through
/// `ferroccl::planner` so that `ferroccl-sim` splits schedules as the
/// executor does.
pub fn bulk_channels(all_reduce: bool, n: usize, bytes: usize, max: usize) -> usize {
    let kind = if all_reduce {
        CollKind::AllReduce
    } else {
        CollKind::AllGather
    };
    DeviceChoice {
        protocol: Protocol::Bulk,
        chunk_bytes: BULK_CHUNK_BYTES,
        channels: 1,
        reason: String::new(),
    }
    .with_channels(kind, n, bytes, max)
    .channels
}

/// Whether a device call may take the executor: collectives only. The
/// executor's set-up rounds need every rank, and a send or receive
/// involves two: point-to-point calls stay staged.
pub(crate) fn takes_executor(call: &CollCall) -> bool {
    call.p2p.is_none() && call.kind != CollKind::SendRecv
}

/// The FIFOs of one (sender, receiver, channel): their sizes. Every rank
/// uses the same geometry, so a rank finds a part in a peer's memory from
/// the peer's base address alone (where each part lies:
/// `comm::device_exec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FifoGeometry {
    pub(crate) slots: u32,
    pub(crate) slot_bytes: u32,
    pub(crate) ll_slots: u32,
    pub(crate) ll_lines: u32,
}

impl FifoGeometry {
    /// As NCCL_BUFFSIZE and NCCL_STEPS size NCCL's buffers: `steps` bulk
    /// slots (at least two: a schedule may count on two frames of room;
    /// ring passes keep `steps - 1` slices in flight, at most 4, which
    /// these slots and the eight LL ones both hold)
    /// of `slot_bytes` (`Config::chunk_bytes`, FERROCCL_BUFFSIZE /
    /// FERROCCL_STEPS: 8 of 512 KiB by default); eight LL slots of the
    /// tuner's LL chunk, or of a bulk slot where that is smaller (a header
    /// line, then 8 bytes a line).
    pub(crate) fn new(slot_bytes: usize, steps: usize) -> FifoGeometry {
        let slot_bytes = slot_bytes.min(u32::MAX as usize) & !7;
        FifoGeometry {
            slots: steps.clamp(2, 1 << 16) as u32,
            slot_bytes: slot_bytes as u32,
            ll_slots: 8,
            ll_lines: 1 + (LL_CHUNK_BYTES.min(slot_bytes) / 8) as u32,
        }
    }

    /// The largest frame `protocol` carries.
    pub(crate) fn room(&self, protocol: Protocol) -> usize {
        match protocol {
            Protocol::Bulk => self.slot_bytes as usize,
            Protocol::LowLatency => (self.ll_lines as usize - 1) * 8,
        }
    }
}

/// What a rank says it can do in the executor's first set-up round (its
/// wire form: `comm::device_exec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Offer {
    /// Its engine runs the executor's kernels.
    pub(crate) runs: bool,
    /// P2P on (`Config::p2p`).
    pub(crate) p2p: bool,
    /// The protocols FERROCCL_PROTO (or NCCL_PROTO) allows.
    pub(crate) allowed: Allowed,
    /// Its FIFO geometry (from its `Config`): every rank's must be equal.
    pub(crate) geometry: FifoGeometry,
    /// The most channels it allows (FERROCCL_MAX_NCHANNELS): the
    /// communicator takes the fewest of every rank's.
    pub(crate) channels: u8,
    /// Its GPU, where it could be told.
    pub(crate) gpu: Option<GpuIdentity>,
}

/// The communicator-wide decision from every rank's offer and, where
/// every rank has a GPU identity, every rank's peer-access row
/// (`access[i][j]`: rank `i`'s answer for rank `j`): `Ok(protocols)` for
/// the executor, `Err(reason)` for staging; and this rank's per-peer
/// choices for the INFO lines. The same on every rank.
pub(crate) fn decide(
    rank: usize,
    offers: &[Offer],
    access: Option<&[Vec<Option<bool>>]>,
) -> (std::result::Result<Allowed, String>, Vec<PathChoice>) {
    let n = offers.len();
    if let Some(r) = offers.iter().position(|o| !o.p2p) {
        return (Err(format!("P2P is off on rank {r}")), Vec::new());
    }
    if let Some(r) = offers.iter().position(|o| !o.runs) {
        return (
            Err(format!(
                "rank {r}'s device does not run the executor's kernels"
            )),
            Vec::new(),
        );
    }
    if let Some(r) = offers.iter().position(|o| o.geometry != offers[0].geometry) {
        let (a, b) = (offers[0].geometry, offers[r].geometry);
        return (
            Err(format!(
                "ranks 0 and {r} size their FIFOs differently ({} x {} bytes against {} x {}: \
                 FERROCCL_BUFFSIZE and FERROCCL_STEPS must be the same on every rank)",
                a.slots, a.slot_bytes, b.slots, b.slot_bytes
            )),
            Vec::new(),
        );
    }
    let allowed = Allowed {
        bulk: offers.iter().all(|o| o.allowed.bulk),
        ll: offers.iter().all(|o| o.allowed.ll),
    };
    if !allowed.bulk && !allowed.ll {
        return (
            Err("the ranks' FERROCCL_PROTO leave no protocol they all allow".into()),
            Vec::new(),
        );
    }
    let gpus: Option<Vec<GpuIdentity>> = offers.iter().map(|o| o.gpu.clone()).collect();
    let (Some(gpus), Some(access)) = (gpus, access) else {
        let r = offers.iter().position(|o| o.gpu.is_none()).unwrap_or(0);
        return (Err(format!("rank {r} could not tell its GPU")), Vec::new());
    };
    let agreed = |i: usize, j: usize| gpu_path::agree(access[i][j], access[j][i]);
    // Ranks of one process use each other's pointers; ranks of other
    // processes map each other's FIFOs (cuda-ipc, `comm::device_exec::share`).
    let choices_of = |r: usize| gpu_path::select_all(r, &gpus, &agreed, false, true);
    let mine = choices_of(rank);
    for i in 0..n {
        if let Some(c) = choices_of(i)
            .into_iter()
            .find(|c| c.path == GpuPath::Staged)
        {
            let lo = i.min(c.peer);
            let hi = i.max(c.peer);
            return (
                Err(format!(
                    "ranks {lo} and {hi} have no GPU path ({})",
                    c.reason
                )),
                mine,
            );
        }
    }
    (Ok(allowed), mine)
}

/// The executor's protocol, chunk and channels for a call of `kind` and
/// `bytes` on `n` ranks, among the protocols `allowed` and at most
/// `max_channels`, over FIFOs of `geometry`: the model's chunk, or the
/// room of one slot where that is smaller (FERROCCL_BUFFSIZE /
/// FERROCCL_STEPS).
pub(crate) fn for_call(
    kind: CollKind,
    n: usize,
    bytes: usize,
    allowed: Allowed,
    max_channels: usize,
    geometry: &FifoGeometry,
) -> DeviceChoice {
    let mut choice = choose(kind, n, bytes, allowed, &DeviceLink::default()).with_channels(
        kind,
        n,
        bytes,
        max_channels,
    );
    choice.chunk_bytes = choice.chunk_bytes.min(geometry.room(choice.protocol));
    choice
}

/// The INFO line for a device call of `kind` and `bytes` on `n` ranks
/// that the executor runs by `algorithm` with `choice`.
pub(crate) fn explain(
    kind: CollKind,
    bytes: usize,
    n: usize,
    algorithm: &str,
    choice: &DeviceChoice,
) -> String {
    format!(
        "device {} of {bytes} bytes on {n} ranks -> device executor, {algorithm}, protocol {}, chunks of {} bytes, {} channel{} ({})",
        kind.name(),
        choice.protocol.name(),
        choice.chunk_bytes,
        choice.channels,
        if choice.channels == 1 { "" } else { "s" },
        choice.reason
    )
}

/// The INFO line for a device call of `kind` and `bytes` on `n` ranks
/// staged through host memory, `why`.
pub(crate) fn explain_staged(
    kind: CollKind,
    bytes: usize,
    n: usize,
    algorithm: &str,
    why: &str,
) -> String {
    format!(
        "device {} of {bytes} bytes on {n} ranks -> staged through host memory, {algorithm} \
         ({why})",
        kind.name()
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ferroccl_transport::HostInfo;

    pub(crate) fn gpu(uuid: u8, pid: u32) -> GpuIdentity {
        GpuIdentity {
            uuid: [uuid; 16],
            pci_bus_id: format!("0000:{uuid:02x}:00.0"),
            numa_node: None,
            ordinal: uuid as u32,
            host: HostInfo {
                host_id: "host-a".into(),
            },
            pid,
        }
    }

    /// An offer of a rank that can do everything, on GPU `uuid` in
    /// process `pid` (also the wire tests' in `comm::device_exec::wire`).
    pub(crate) fn offer(uuid: u8, pid: u32) -> Offer {
        Offer {
            runs: true,
            p2p: true,
            allowed: Allowed::default(),
            geometry: FifoGeometry::new(4096, 4),
            channels: 8,
            gpu: Some(gpu(uuid, pid)),
        }
    }

    fn all_yes(n: usize) -> Vec<Vec<Option<bool>>> {
        vec![vec![Some(true); n]; n]
    }

    use std::collections::HashMap;

    #[test]
    fn max_channels_reads_either_name_ferroccl_first() {
        let get = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(max_channels_from_env(&get(&[])).unwrap(), None);
        assert_eq!(
            max_channels_from_env(&get(&[(NCCL_MAX_NCHANNELS, "4")])).unwrap(),
            Some(4)
        );
        assert_eq!(
            max_channels_from_env(&get(&[(MAX_NCHANNELS, "2"), (NCCL_MAX_NCHANNELS, "4")]))
                .unwrap(),
            Some(2)
        );
        assert_eq!(
            max_channels_from_env(&get(&[(MAX_NCHANNELS, " ")])).unwrap(),
            None
        );
        for bad in ["0", "65", "x", "-1"] {
            let pairs: &'static [(&'static str, &'static str)] =
                Box::leak(vec![(MAX_NCHANNELS, bad)].into_boxed_slice());
            let e = max_channels_from_env(&get(pairs)).unwrap_err().to_string();
            assert!(e.contains(MAX_NCHANNELS) && e.contains(bad), "{e}");
        }
    }

    /// The default bound: as many channels as keep a rank's FIFOs
    /// within DEFAULT_FIFOS, at most DEFAULT_CHANNELS, never none.
    #[test]
    fn default_channels_keep_the_fifos_within_the_budget() {
        assert_eq!(default_channels(2), 32);
        assert_eq!(default_channels(4), 16);
        assert_eq!(default_channels(8), 8);
        for n in 1..=130 {
            let c = default_channels(n);
            assert!((1..=DEFAULT_CHANNELS).contains(&c), "{n} ranks: {c}");
            // Within the budget where more than one channel...
            assert!(c == 1 || c * n <= DEFAULT_FIFOS, "{n} ranks: {c}");
            // ...and no channel more would still fit.
            assert!(
                c == DEFAULT_CHANNELS || (c + 1) * n > DEFAULT_FIFOS,
                "{n} ranks: {c}"
            );
        }
    }

    /// Bulk calls take a channel per MIN_CHANNEL_BYTES of a step, up to
    /// the bound; LL calls one; never none.
    #[test]
    fn channels_follow_the_step_size_up_to_the_bound() {
        let m = DeviceLink::default();
        let all = |bytes: usize, max: usize| {
            choose(CollKind::AllReduce, 2, bytes, Allowed::default(), &m).with_channels(
                CollKind::AllReduce,
                2,
                bytes,
                max,
            )
        };
        assert_eq!(all(8, 8).channels, 1);
        assert_eq!(all(8, 8).protocol, Protocol::LowLatency);
        // 2 ranks: a step is half the bytes.
        assert_eq!(all(4 * MIN_CHANNEL_BYTES, 8).channels, 2);
        assert_eq!(all(1 << 30, 8).channels, 8);
        assert_eq!(all(1 << 30, 3).channels, 3);
        assert_eq!(all(1 << 30, 0).channels, 1);
        let ag = choose(CollKind::AllGather, 4, 1 << 20, Allowed::default(), &m).with_channels(
            CollKind::AllGather,
            4,
            1 << 20,
            64,
        );
        assert_eq!(ag.channels, (1 << 20) / MIN_CHANNEL_BYTES);
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn small_calls_take_ll_and_large_ones_bulk() {
        let m = DeviceLink::default();
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
            CollKind::Broadcast,
        ] {
            for n in [2, 4, 8] {
                let small = choose(kind, n, 8, Allowed::default(), &m);
                assert_eq!(small.protocol, Protocol::LowLatency, "{small:?}");
                assert_eq!(small.chunk_bytes, LL_CHUNK_BYTES);
                assert!(small.reason.contains("model: LL"), "{small:?}");
                let large = choose(kind, n, 256 << 20, Allowed::default(), &m);
                assert_eq!(large.protocol, Protocol::Bulk, "{large:?}");
                assert_eq!(large.chunk_bytes, BULK_CHUNK_BYTES);
                // One crossover: once bulk wins it keeps winning.
                let mut bulk_seen = false;
                for shift in 0..30 {
                    let c = choose(kind, n, 1 << shift, Allowed::default(), &m);
                    if bulk_seen {
                        assert_eq!(
                            c.protocol,
                            Protocol::Bulk,
                            "{kind:?} n {n} 2^{shift}: {c:?}"
                        );
                    }
                    bulk_seen |= c.protocol == Protocol::Bulk;
                }
                assert!(bulk_seen);
            }
        }
    }

    #[test]
    fn a_wider_latency_gap_moves_the_crossover_up() {
        let crossover = |m: &DeviceLink| {
            (0..34)
                .find(|&s| {
                    choose(CollKind::AllReduce, 4, 1usize << s, Allowed::default(), m).protocol
                        == Protocol::Bulk
                })
                .unwrap()
        };
        let base = DeviceLink::default();
        let slow_bulk = DeviceLink {
            bulk_latency_us: 20.0,
            ..base
        };
        assert!(crossover(&slow_bulk) > crossover(&base));
    }

    #[test]
    fn the_switch_narrows_the_choice_and_names_what_is_wrong() {
        let m = DeviceLink::default();
        let a = allowed_from_env(&env(&[("FERROCCL_PROTO", "Simple")])).unwrap();
        assert_eq!(
            a,
            Allowed {
                bulk: true,
                ll: false
            }
        );
        let c = choose(CollKind::AllReduce, 2, 8, a, &m);
        assert_eq!(c.protocol, Protocol::Bulk);
        assert!(c.reason.contains("excluded"), "{c:?}");
        // NCCL's name, its exclusion syntax, and LL128 ignored.
        let a = allowed_from_env(&env(&[("NCCL_PROTO", "^LL128,Simple")])).unwrap();
        assert_eq!(
            a,
            Allowed {
                bulk: false,
                ll: true
            }
        );
        assert_eq!(
            choose(CollKind::AllReduce, 2, 1 << 30, a, &m).protocol,
            Protocol::LowLatency
        );
        // Ours wins over NCCL's.
        let a =
            allowed_from_env(&env(&[("FERROCCL_PROTO", "ll"), ("NCCL_PROTO", "Simple")])).unwrap();
        assert_eq!(
            a,
            Allowed {
                bulk: false,
                ll: true
            }
        );
        assert_eq!(allowed_from_env(&env(&[])).unwrap(), Allowed::default());
        assert_eq!(
            allowed_from_env(&env(&[("FERROCCL_PROTO", " ")])).unwrap(),
            Allowed::default()
        );
        let e = allowed_from_env(&env(&[("FERROCCL_PROTO", "LL,fast")])).unwrap_err();
        assert!(e.to_string().contains("'fast'"), "{e}");
        let e = allowed_from_env(&env(&[("NCCL_PROTO", "LL128")])).unwrap_err();
        assert!(e.to_string().contains("leaves no protocol"), "{e}");
        let e = allowed_from_env(&env(&[("FERROCCL_PROTO", "^LL,Simple")])).unwrap_err();
        assert!(e.to_string().contains("FERROCCL_PROTO"), "{e}");
    }

    #[test]
    fn a_calls_chunk_fits_the_fifos_and_its_line_says_why() {
        // Slots of 64 KiB: a large bulk call's frames are a slot, not the
        // model's 512 KiB; slots twice the model's chunk leave it.
        let small = FifoGeometry::new(64 << 10, 8);
        let large = FifoGeometry::new(2 * BULK_CHUNK_BYTES, 8);
        let big = 256 << 20;
        let c = for_call(CollKind::AllReduce, 4, big, Allowed::default(), 8, &small);
        assert_eq!(
            (c.protocol, c.chunk_bytes, c.channels),
            (Protocol::Bulk, 64 << 10, 8)
        );
        let c = for_call(CollKind::AllReduce, 4, big, Allowed::default(), 3, &large);
        assert_eq!((c.chunk_bytes, c.channels), (BULK_CHUNK_BYTES, 3));
        // LL slots of a 1 KiB bulk slot hold 1 KiB a frame.
        let tiny = FifoGeometry::new(1 << 10, 8);
        let c = for_call(CollKind::AllReduce, 4, 8, Allowed::default(), 8, &tiny);
        assert_eq!(
            (c.protocol, c.chunk_bytes, c.channels),
            (Protocol::LowLatency, 1 << 10, 1)
        );
        let c = for_call(CollKind::AllReduce, 4, 8, Allowed::default(), 8, &large);
        assert_eq!(c.chunk_bytes, LL_CHUNK_BYTES);
        let line = explain(CollKind::AllReduce, 8, 4, "ring", &c);
        assert!(
            line.starts_with(
                "device all_reduce of 8 bytes on 4 ranks -> device executor, ring, protocol ll, \
                 chunks of 4096 bytes, 1 channel ("
            ) && line.contains("model: LL"),
            "{line}"
        );
        let line = explain_staged(
            CollKind::SendRecv,
            16,
            2,
            "ring",
            "point-to-point calls stay staged",
        );
        assert_eq!(
            line,
            "device send/recv of 16 bytes on 2 ranks -> staged through host memory, ring \
             (point-to-point calls stay staged)"
        );
    }

    #[test]
    fn only_collectives_take_the_executor() {
        let all_reduce = CollCall::new(CollKind::AllReduce, 4, 4, 4);
        assert!(takes_executor(&all_reduce));
        let send = CollCall {
            p2p: Some((1, true)),
            ..CollCall::new(CollKind::SendRecv, 4, 4, 0)
        };
        assert!(!takes_executor(&send));
        assert!(!takes_executor(&CollCall::new(CollKind::SendRecv, 4, 4, 4)));
    }

    /// Ranks of one process on one GPU, or of processes on GPUs that reach
    /// each other, take the executor; every rank decides the same; a pair
    /// without a GPU path stages every call, with the reason.
    #[test]
    fn the_decision_is_the_communicators_and_says_why() {
        let same: Vec<Offer> = (0..4).map(|_| offer(1, 7)).collect();
        for r in 0..4 {
            let (d, mine) = decide(r, &same, Some(&all_yes(4)));
            assert_eq!(d, Ok(Allowed::default()));
            assert_eq!(mine.len(), 3);
            assert!(mine.iter().all(|c| c.path == GpuPath::SameProcess));
        }
        // Two GPUs of one process with peer access: executor.
        let two = vec![offer(1, 7), offer(2, 7)];
        assert!(decide(0, &two, Some(&all_yes(2))).0.is_ok());
        // Without peer access (rank 1 says no): staged on both ranks.
        let mut rows = all_yes(2);
        rows[1][0] = Some(false);
        for r in 0..2 {
            let why = decide(r, &two, Some(&rows)).0.unwrap_err();
            assert!(
                why.contains("ranks 0 and 1") && why.contains("cannot access"),
                "{why}"
            );
        }
        // Another process on the same GPU: cuda-ipc to it, the
        // same-process path between ranks 0 and 2, and the executor.
        let procs = vec![offer(1, 7), offer(1, 8), offer(1, 7)];
        for r in 0..3 {
            let (d, mine) = decide(r, &procs, Some(&all_yes(3)));
            assert!(d.is_ok(), "{d:?}");
            for c in mine {
                let want = match procs[c.peer].gpu.as_ref().unwrap().pid
                    == procs[r].gpu.as_ref().unwrap().pid
                {
                    true => GpuPath::SameProcess,
                    false => GpuPath::CudaIpc,
                };
                assert_eq!(c.path, want, "rank {r} to {}", c.peer);
            }
        }
        // Other processes on two GPUs without peer access: staged, for
        // every rank.
        let far = vec![offer(1, 7), offer(2, 8)];
        let mut rows = all_yes(2);
        rows[0][1] = Some(false);
        for r in 0..2 {
            let why = decide(r, &far, Some(&rows)).0.unwrap_err();
            assert!(why.contains("ranks 0 and 1 have no GPU path"), "{why}");
        }
        // P2P off on one rank, an engine without the executor, a rank
        // without a GPU identity, protocols that leave nothing.
        let mut off = same.clone();
        off[2].p2p = false;
        assert!(decide(0, &off, None)
            .0
            .unwrap_err()
            .contains("P2P is off on rank 2"));
        let mut runs = same.clone();
        runs[3].runs = false;
        assert!(decide(1, &runs, None).0.unwrap_err().contains("rank 3"));
        let mut blind = same.clone();
        blind[1].gpu = None;
        assert!(decide(0, &blind, None)
            .0
            .unwrap_err()
            .contains("rank 1 could not tell"));
        let mut proto = same.clone();
        proto[0].allowed = Allowed {
            bulk: false,
            ll: true,
        };
        proto[1].allowed = Allowed {
            bulk: true,
            ll: false,
        };
        assert!(decide(0, &proto, Some(&all_yes(4)))
            .0
            .unwrap_err()
            .contains("FERROCCL_PROTO"));
        proto[1].allowed = Allowed::default();
        assert_eq!(
            decide(0, &proto, Some(&all_yes(4))).0,
            Ok(Allowed {
                bulk: false,
                ll: true
            })
        );
        // FIFOs sized differently: staged, saying how.
        let mut sizes = same.clone();
        sizes[3].geometry = FifoGeometry::new(8192, 4);
        let why = decide(2, &sizes, Some(&all_yes(4))).0.unwrap_err();
        assert!(
            why.contains("ranks 0 and 3") && why.contains("FERROCCL_BUFFSIZE"),
            "{why}"
        );
        // One rank alone: the executor, no peers.
        assert!(decide(0, &same[..1], Some(&all_yes(1))).0.is_ok());
    }
}
