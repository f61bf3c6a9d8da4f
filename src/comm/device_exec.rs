//! The device executor's launcher (issue 16): device calls whose ranks'
//! GPUs reach each other run as one kernel per rank that moves and
//! reduces the data in device memory (docs/device-executor.md), in place
//! of staging through host memory.
//!
//! - **Which path.** At the first collective device call on an engine,
//!   every rank takes part, in the call's turn, in rounds through the
//!   rendezvous store: what it can do (the engine runs the executor, P2P
//!   on, the protocols FERROCCL_PROTO allows) and its GPU's identity
//!   (`plan::gpu_path`); its peer-access answers; and, where the executor is
//!   chosen, its FIFO memory: the device address, and for ranks with peers
//!   in other processes the handle to map it by (`device_share`). The
//!   choice is made from every rank's answers, so every rank makes the
//!   same one: the executor where every pair of ranks has a GPU path
//!   (ranks of one process use each other's pointers; ranks of other
//!   processes whose GPUs reach each other, or share one, map each other's
//!   FIFOs with cuda-ipc, the descriptors passed over Unix sockets, and
//!   say in a last round that they could); else every call stays staged,
//!   with the reason at INFO. Point-to-point calls always stay staged (two
//!   ranks cannot hold the all-rank rounds).
//! - **A call.** The progress thread, in the call's turn: chooses protocol
//!   and chunk (`plan::device::for_call`, its `plan:` line at INFO), plans the schedule with frames of
//!   that chunk, encodes this rank's program (`algo::encode`), and enqueues
//!   on the communicator's own stream: a wait for the caller's earlier
//!   work, the image and a fresh `Control`, the kernel, the raise of the
//!   caller's gate (the caller's stream waits there, so its later work sees
//!   the result with no host thread in between), the `Control` back.
//! - **The watchdog.** The progress thread then waits for that work, and
//!   raises the rank's abort word (a word of mapped host memory that every
//!   spin loop of the kernel reads) on `abort()`, on a failure the
//!   communicator hears of, and at the call's timeout; the kernel ends
//!   with `Aborted`, and the call returns the named error the host path
//!   would: the timeout naming the peer the kernel waited for, the peer's
//!   failure, the abort. A kernel that reports a fault (a frame with
//!   another tag or length) names the peer and the record. A kernel still
//!   running 10 s after its abort word was set is reported as such; the
//!   communicator is failed after any fault (the FIFO counts are out of
//!   step).

use super::device_share::{self, FdServer, PeerRegion, Share};
use super::Inner;
use crate::algo::encode::{self, Layout, ProgramMeta};
use crate::coll::{self, CollCall, Plan};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::exec::{Call, DeviceIo, Links};
use crate::plan::device::{self as device_plan, decide, Allowed, FifoGeometry, Offer};
use crate::plan::gpu_path::{self, GpuIdentity};
use ferroccl_cuda::device::{DeviceBuf, DevicePtr, Engine, Event, Gate, PinnedBuf, Stream};
use ferroccl_cuda::error::CudaError;
use ferroccl_cuda::executor::{
    self, Conn, Control, ExecFault, ExecLaunch, CONTROL_BYTES, LL_CLEAN_FRAMES,
};
use std::time::{Duration, Instant};

/// How long a kernel may go on after its abort word was set before the
/// call gives up on it.
const ABORT_GRACE: Duration = Duration::from_secs(10);
/// How often the watchdog looks at the communicator's state.
const WATCH_SLICE: Duration = Duration::from_millis(1);
/// Spins of a kernel's wait between reads of the abort word.
const SPIN_CHECK: u32 = 1 << 10;
/// The wire version of the rounds.
const ROUND_VERSION: u8 = 2;

/// Counters sit 128 bytes apart: a writer on one GPU and a poller on
/// another never share a line.
const WORD_GAP: u64 = 128;

/// Where each part of a (sender, receiver, channel)'s FIFOs lies in a
/// region, in bytes from its start (the sizes: `plan::device`).
impl FifoGeometry {
    fn meta(&self) -> u64 {
        self.slots as u64 * self.slot_bytes as u64
    }
    fn ll(&self) -> u64 {
        (self.meta() + 8 * self.slots as u64).next_multiple_of(WORD_GAP)
    }
    fn tail(&self) -> u64 {
        (self.ll() + self.ll_slots as u64 * self.ll_lines as u64 * 16).next_multiple_of(WORD_GAP)
    }
    fn head(&self) -> u64 {
        self.tail() + WORD_GAP
    }
    fn ll_head(&self) -> u64 {
        self.head() + WORD_GAP
    }
    /// Bytes of one region.
    pub(crate) fn region(&self) -> u64 {
        self.ll_head() + WORD_GAP
    }
}

/// The `Conn` table of rank `rank` of `n`, `channels * n` entries (zeros
/// for itself), when rank `r`'s FIFO memory starts at `bases[r]`: region
/// `(c * n + p)` of rank `r` holds the frames from `p` to `r` on channel
/// `c` (slots, meta, LL lines, tail) and the words that `p` raises for
/// frames from `r` to `p` (head, LL head). So a sender's `send_*` are the
/// receiver's `recv_*`, each word in the memory of the side that polls
/// it.
pub(crate) fn conn_table(
    rank: usize,
    n: usize,
    channels: usize,
    bases: &[u64],
    g: &FifoGeometry,
    ll_clean: u64,
) -> Vec<Conn> {
    let region =
        |owner: usize, c: usize, p: usize| bases[owner] + ((c * n + p) as u64) * g.region();
    let mut table = vec![Conn::default(); channels * n];
    for c in 0..channels {
        for p in (0..n).filter(|&p| p != rank) {
            let to = region(p, c, rank);
            let from = region(rank, c, p);
            table[c * n + p] = Conn {
                send_slots: to,
                send_meta: to + g.meta(),
                send_tail: to + g.tail(),
                send_head: from + g.head(),
                send_ll: to + g.ll(),
                send_ll_head: from + g.ll_head(),
                recv_slots: from,
                recv_meta: from + g.meta(),
                recv_tail: from + g.tail(),
                recv_head: to + g.head(),
                recv_ll: from + g.ll(),
                recv_ll_head: to + g.ll_head(),
                ll_clean,
                slots: g.slots,
                slot_bytes: g.slot_bytes,
                ll_slots: g.ll_slots,
                ll_lines: g.ll_lines,
                ..Conn::default()
            };
        }
    }
    table
}

/// A rank's offer on the wire (the decision from every rank's:
/// `plan::device::decide`).
impl Offer {
    fn to_bytes(&self) -> Result<Vec<u8>> {
        let flags = self.runs as u8
            | (self.p2p as u8) << 1
            | (self.allowed.bulk as u8) << 2
            | (self.allowed.ll as u8) << 3
            | (self.gpu.is_some() as u8) << 4;
        let mut out = vec![ROUND_VERSION, flags];
        let g = &self.geometry;
        for v in [g.slots, g.slot_bytes, g.ll_slots, g.ll_lines] {
            out.extend(v.to_le_bytes());
        }
        out.push(self.channels);
        if let Some(gpu) = &self.gpu {
            out.extend(gpu.to_bytes()?);
        }
        Ok(out)
    }

    fn from_bytes(rank: usize, b: &[u8]) -> Result<Offer> {
        let bad = |why: &str| Error::Bootstrap(format!("rank {rank}'s device offer: {why}"));
        let [version, flags, rest @ ..] = b else {
            return Err(bad("too short"));
        };
        if *version != ROUND_VERSION {
            return Err(bad(&format!(
                "version {version}, this build speaks {ROUND_VERSION}"
            )));
        }
        if flags >> 5 != 0 {
            return Err(bad(&format!("unknown flags {flags:#x}")));
        }
        let Some((g, rest)) = rest.split_first_chunk::<16>() else {
            return Err(bad("too short"));
        };
        let word = |i: usize| u32::from_le_bytes(g[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        let geometry = FifoGeometry {
            slots: word(0),
            slot_bytes: word(1),
            ll_slots: word(2),
            ll_lines: word(3),
        };
        let Some((&channels, rest)) = rest.split_first() else {
            return Err(bad("too short"));
        };
        if channels == 0 || channels as usize > device_plan::CHANNEL_LIMIT {
            return Err(bad(&format!("{channels} channels")));
        }
        let gpu = if flags & 16 != 0 {
            Some(GpuIdentity::from_bytes(rest)?)
        } else if rest.is_empty() {
            None
        } else {
            return Err(bad("bytes after an offer without a GPU"));
        };
        Ok(Offer {
            runs: flags & 1 != 0,
            p2p: flags & 2 != 0,
            geometry,
            channels,
            allowed: Allowed {
                bulk: flags & 4 != 0,
                ll: flags & 8 != 0,
            },
            gpu,
        })
    }
}

/// A rank's peer-access row on the wire: one byte a rank, 0 no, 1 yes,
/// 2 unknown.
fn row_to_bytes(row: &[Option<bool>]) -> Vec<u8> {
    row.iter()
        .map(|a| match a {
            Some(false) => 0,
            Some(true) => 1,
            None => 2,
        })
        .collect()
}

fn row_from_bytes(rank: usize, n: usize, b: &[u8]) -> Result<Vec<Option<bool>>> {
    if b.len() != n {
        return Err(Error::Bootstrap(format!(
            "rank {rank}'s peer-access row has {} entries, not {n}",
            b.len()
        )));
    }
    b.iter()
        .map(|&v| match v {
            0 => Ok(Some(false)),
            1 => Ok(Some(true)),
            2 => Ok(None),
            _ => Err(Error::Bootstrap(format!(
                "rank {rank}'s peer-access row holds {v}"
            ))),
        })
        .collect()
}

/// This process's identity on device `ordinal`. `Error::NoDevice`
/// (with the reason) without a driver or device.
fn probe(ordinal: u32) -> Result<GpuIdentity> {
    let dev = ferroccl_cuda::topo::identity(ordinal).map_err(crate::cuda::from_cuda)?;
    Ok(GpuIdentity {
        uuid: dev.uuid,
        pci_bus_id: dev.pci_bus_id,
        numa_node: dev.numa_node,
        ordinal: dev.ordinal,
        host: crate::topo::host_info(),
        pid: std::process::id(),
    })
}

/// This process's answer to "can `me`'s GPU and `peer`'s access each
/// other's memory", both ways: `None` where it cannot ask (other host, or
/// the peer's GPU is not visible here); one GPU is `Some(true)`. Calls the
/// driver (after its probe).
fn peer_access(me: &GpuIdentity, peer: &GpuIdentity) -> Result<Option<bool>> {
    use ferroccl_cuda::topo;
    if !me.same_host(peer) {
        return Ok(None);
    }
    if me.uuid == peer.uuid {
        return Ok(Some(true));
    }
    let from_cuda = crate::cuda::from_cuda;
    let Some(theirs) = topo::local_ordinal(&peer.uuid).map_err(from_cuda)? else {
        return Ok(None);
    };
    let there = topo::can_access_peer(me.ordinal, theirs).map_err(from_cuda)?;
    let back = topo::can_access_peer(theirs, me.ordinal).map_err(from_cuda)?;
    Ok(Some(there && back))
}

/// The identity of the engine's device: a stand-in's own, a GPU's probed.
fn identity(engine: &dyn Engine, ordinal: u32) -> Result<GpuIdentity> {
    match engine.stand_in_uuid() {
        Some(uuid) => Ok(GpuIdentity {
            uuid,
            pci_bus_id: "0000:00:00.0".into(),
            numa_node: None,
            ordinal,
            host: crate::topo::host_info(),
            pid: std::process::id(),
        }),
        None => probe(ordinal),
    }
}

/// Peer access between this rank's device and a peer's: a stand-in
/// reaches only itself (one stand-in is one GPU).
fn access(engine: &dyn Engine, me: &GpuIdentity, peer: &GpuIdentity) -> Result<Option<bool>> {
    if engine.stand_in_uuid().is_some() {
        return Ok(Some(me.same_host(peer) && me.uuid == peer.uuid));
    }
    peer_access(me, peer)
}

/// A communicator's executor on one engine, once chosen and set up.
pub(super) struct Ready {
    stream: Stream,
    abort: Gate,
    abort_addr: u64,
    conns: DeviceBuf,
    /// What the connection table is uploaded through (made before the
    /// set-up's rounds).
    conns_pinned: PinnedBuf,
    ctl: DeviceBuf,
    ctl_pinned: PinnedBuf,
    /// The program image's device memory (stream-ordered) and its size.
    image: (DeviceBuf, usize),
    /// What images are uploaded through, [`IMAGE_PIECE`] bytes.
    image_pinned: PinnedBuf,
    /// Recorded after each piece of an image is sent.
    image_sent: Event,
    end: Event,
    allowed: Allowed,
    geometry: FifoGeometry,
    /// Channels set up (FIFOs and `Conn` entries for each).
    channels: usize,
    /// Set after a kernel fault: later calls are refused (the
    /// communicator has failed anyway).
    faulted: bool,
    /// This rank's FIFO memory where peers in other processes map it.
    share: Option<Share>,
    /// Those peers' FIFO memory, mapped here.
    peers: Vec<PeerRegion>,
}

/// What a rank publishes of its FIFO memory: its address (for ranks of
/// its process), and, for peers in other processes, the handle to map
/// it by and the socket its descriptor is handed out on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FifoEntry {
    pub(crate) address: u64,
    pub(crate) wire: Option<Vec<u8>>,
    pub(crate) socket: Option<Vec<u8>>,
}

/// A rank's FIFO entry on the wire: `[1]`, the address, the handle and
/// the socket name each with its length (0: none); `[0]` where the rank
/// could not make its FIFOs.
fn fifo_entry(address: u64, wire: Option<Vec<u8>>, socket: Option<&[u8]>) -> Vec<u8> {
    let mut out = vec![1];
    out.extend(address.to_le_bytes());
    let wire = wire.unwrap_or_default();
    out.extend((wire.len() as u16).to_le_bytes());
    out.extend(&wire);
    let socket = socket.unwrap_or_default();
    out.push(socket.len() as u8);
    out.extend(socket);
    out
}

/// Rank `rank`'s FIFO entry: `None` where it could not make its FIFOs.
fn parse_fifo_entry(rank: usize, b: &[u8]) -> Result<Option<FifoEntry>> {
    let bad = || Error::Bootstrap(format!("rank {rank}'s FIFO entry: {} bytes", b.len()));
    let rest = match b {
        [0] => return Ok(None),
        [1, rest @ ..] => rest,
        _ => return Err(bad()),
    };
    let (address, rest) = rest.split_first_chunk::<8>().ok_or_else(bad)?;
    let (len, rest) = rest.split_first_chunk::<2>().ok_or_else(bad)?;
    let len = u16::from_le_bytes(*len) as usize;
    let (wire, rest) = (rest.get(..len).ok_or_else(bad)?, &rest[len..]);
    let (&slen, rest) = rest.split_first().ok_or_else(bad)?;
    if rest.len() != slen as usize {
        return Err(bad());
    }
    let some = |v: &[u8]| (!v.is_empty()).then(|| v.to_vec());
    Ok(Some(FifoEntry {
        address: u64::from_le_bytes(*address),
        wire: some(wire),
        socket: some(rest),
    }))
}

/// What a communicator's device path on one engine is.
pub(super) enum ExecPath {
    /// Staged, for this reason (at INFO once, and on each call's
    /// `plan:` line).
    Staged(String),
    /// The executor.
    Ready(Box<Ready>),
}

impl Inner {
    /// The rounds of the first collective device call on `engine` (every
    /// rank is in this call's turn): the decision, and the FIFOs where it
    /// is the executor.
    pub(super) fn exec_setup(
        &self,
        links: &Links,
        engine: &dyn Engine,
        ordinal: u32,
        setup: u64,
        call: &Call,
    ) -> Result<ExecPath> {
        let during = call.during();
        let n = self.size;
        let deadline = Instant::now() + self.config.timeout;
        let name = |round: &str| format!("gpu-exec/{setup}/{round}");
        let gpu = identity(engine, ordinal);
        let offer = Offer {
            runs: engine.runs_executor(),
            p2p: self.config.p2p,
            allowed: device_plan::allowed_from_env(&|k| std::env::var(k).ok())?,
            geometry: FifoGeometry::new(self.config.chunk_bytes(), self.config.steps),
            channels: self
                .config
                .max_channels
                .clamp(1, device_plan::CHANNEL_LIMIT) as u8,
            gpu: gpu.ok(),
        };
        let offers: Vec<Offer> = links
            .exchange(&name("offer"), &offer.to_bytes()?, deadline, &during)?
            .iter()
            .enumerate()
            .map(|(r, b)| Offer::from_bytes(r, b))
            .collect::<Result<_>>()?;
        // The access rows only where every rank has a GPU identity: the
        // same test on every rank, so every rank holds the same rounds.
        let rows = match offers.iter().all(|o| o.gpu.is_some() && o.runs && o.p2p) {
            false => None,
            true => {
                let me = offers[self.rank].gpu.as_ref().expect("checked above");
                let mut row = Vec::with_capacity(n);
                for o in &offers {
                    row.push(access(engine, me, o.gpu.as_ref().expect("checked above"))?);
                }
                let rows =
                    links.exchange(&name("access"), &row_to_bytes(&row), deadline, &during)?;
                Some(
                    rows.iter()
                        .enumerate()
                        .map(|(r, b)| row_from_bytes(r, n, b))
                        .collect::<Result<Vec<_>>>()?,
                )
            }
        };
        let (decision, mine) = decide(self.rank, &offers, rows.as_deref());
        gpu_path::log_choices(self.rank, &mine);
        let allowed = match decision {
            Ok(allowed) => allowed,
            Err(why) => {
                tracing::info!(
                    rank = self.rank,
                    "device calls staged through host memory: {why}"
                );
                return Ok(ExecPath::Staged(why));
            }
        };
        // The FIFOs: made here, then every rank's base address (and, for
        // ranks with peers in other processes, the handle to map them by).
        // A rank that could not make them says so, and every rank stays
        // staged.
        let geometry = offers[self.rank].geometry;
        let channels = offers
            .iter()
            .map(|o| o.channels as usize)
            .min()
            .unwrap_or(1);
        let gpus: Vec<&GpuIdentity> = offers
            .iter()
            .map(|o| o.gpu.as_ref().expect("decided with every identity"))
            .collect();
        let other_process =
            |i: usize, j: usize| !(gpus[i].same_host(gpus[j]) && gpus[i].pid == gpus[j].pid);
        let cross: Vec<usize> = (0..n)
            .filter(|&r| r != self.rank && other_process(self.rank, r))
            .collect();
        let made = self
            .exec_memory(engine, ordinal, &geometry, channels, !cross.is_empty())
            .and_then(|(ready, base)| {
                let server = match &ready.share {
                    Some(share) if share.carries_fd() => Some(FdServer::bind()?),
                    _ => None,
                };
                Ok((ready, base, server))
            });
        let mine = match &made {
            Ok((ready, base, server)) => fifo_entry(
                *base,
                ready.share.as_ref().map(|s| s.wire()),
                server.as_ref().map(|s| s.name()),
            ),
            Err(_) => vec![0],
        };
        let published = links.exchange(&name("fifo"), &mine, deadline, &during)?;
        let mut entries = Vec::with_capacity(n);
        for (r, b) in published.iter().enumerate() {
            match parse_fifo_entry(r, b)? {
                Some(e) => entries.push(e),
                None => {
                    let why = match (&made, r == self.rank) {
                        (Err(e), true) => format!(": {e}"),
                        _ => String::new(),
                    };
                    let why = format!("rank {r} could not make its executor FIFOs{why}");
                    tracing::info!(
                        rank = self.rank,
                        "device calls staged through host memory: {why}"
                    );
                    return Ok(ExecPath::Staged(why));
                }
            }
        }
        let (mut ready, _, server) = made?;
        let mut addresses: Vec<u64> = entries.iter().map(|e| e.address).collect();
        // Processes partition the ranks, so where any two ranks are in
        // different processes every rank has a peer in another one: every
        // rank takes this branch (and holds the `mapped` round), or none.
        if !cross.is_empty() {
            let mapped = self.map_peers(
                engine,
                ordinal,
                &ready,
                server.as_ref(),
                &entries,
                &cross,
                &gpus,
                deadline,
                &during,
            )?;
            // Whether every rank mapped its peers: where one could not,
            // every rank stays staged, saying which and why.
            let said = match &mapped {
                Ok(_) => vec![1],
                Err(why) => [vec![0], why.as_bytes().to_vec()].concat(),
            };
            let all = links.exchange(&name("mapped"), &said, deadline, &during)?;
            if let Some((r, why)) =
                all.iter()
                    .enumerate()
                    .find_map(|(r, b)| match b.split_first() {
                        Some((1, [])) => None,
                        Some((0, why)) => Some((r, String::from_utf8_lossy(why).into_owned())),
                        _ => Some((r, format!("an answer of {} bytes", b.len()))),
                    })
            {
                let why = format!("rank {r} could not map its peers' executor FIFOs: {why}");
                tracing::info!(
                    rank = self.rank,
                    "device calls staged through host memory: {why}"
                );
                return Ok(ExecPath::Staged(why));
            }
            for (r, region) in mapped.expect("every rank said yes") {
                addresses[r] = region.address();
                ready.peers.push(region);
            }
        }
        let table = conn_table(
            self.rank,
            n,
            channels,
            &addresses,
            &geometry,
            LL_CLEAN_FRAMES,
        );
        // Through pinned memory made before the rounds: a peer sharing the
        // device may have launched its kernel already, and an allocation
        // would wait for it (the device rule).
        upload_through(
            engine,
            ready.stream,
            ready.conns,
            ready.conns_pinned,
            &executor::conns_to_bytes(&table),
        )?;
        ready.allowed = allowed;
        tracing::info!(
            rank = self.rank,
            "device calls run by the device executor ({n} ranks, {} of them in other processes \
             (FIFOs mapped with cuda-ipc), up to {channels} channels, bulk slots {} x {} bytes, LL \
             slots {} x {} lines)",
            cross.len(),
            geometry.slots,
            geometry.slot_bytes,
            geometry.ll_slots,
            geometry.ll_lines
        );
        Ok(ExecPath::Ready(ready))
    }

    /// This rank's executor resources, its FIFO memory zeroed (made
    /// shareable with other processes where `shared`); and the FIFO
    /// memory's device address.
    fn exec_memory(
        &self,
        engine: &dyn Engine,
        ordinal: u32,
        g: &FifoGeometry,
        channels: usize,
        shared: bool,
    ) -> Result<(Box<Ready>, u64)> {
        let err = |e: CudaError| Error::Io(format!("device executor set-up: {e}"));
        let n = self.size;
        let fifo_bytes = ((channels * n) as u64 * g.region()) as usize;
        let stream = engine.stream().map_err(err)?;
        let (share, base) = if shared {
            let share = Share::new(engine, ordinal, fifo_bytes)?;
            let base = share.address();
            (Some(share), base)
        } else {
            let fifo = engine.alloc_device(fifo_bytes.max(16)).map_err(err)?;
            upload(engine, stream, fifo, &vec![0u8; fifo_bytes])?;
            (None, engine.device_address(DevicePtr::new(fifo)))
        };
        let abort = engine.gate().map_err(err)?;
        let abort_addr = engine.gate_device_address(abort).map_err(err)?;
        let conns_bytes = (channels * n * executor::CONN_BYTES).max(16);
        let conns = engine.alloc_device(conns_bytes).map_err(err)?;
        let conns_pinned = engine.alloc_pinned(conns_bytes).map_err(err)?;
        let ctl = engine.alloc_device(CONTROL_BYTES).map_err(err)?;
        let ctl_pinned = engine.alloc_pinned(CONTROL_BYTES).map_err(err)?;
        let end = engine.event().map_err(err)?;
        // The program image: device memory in the stream's order (it
        // grows in it too, under a parked stream), uploaded through a
        // pinned buffer made here and never replaced (the device rule).
        let image = engine
            .alloc_device_async(stream, IMAGE_START)
            .map_err(err)?;
        let image_pinned = engine.alloc_pinned(IMAGE_PIECE).map_err(err)?;
        let image_sent = engine.event().map_err(err)?;
        Ok((
            Box::new(Ready {
                stream,
                abort,
                abort_addr,
                conns,
                conns_pinned,
                ctl,
                ctl_pinned,
                image: (image, IMAGE_START),
                image_pinned,
                image_sent,
                end,
                allowed: Allowed::default(),
                geometry: *g,
                channels,
                faulted: false,
                share,
                peers: Vec::new(),
            }),
            base,
        ))
    }

    /// Map the FIFO memory of this rank's peers in other processes
    /// (`cross`), fetching the descriptors their handles need and handing
    /// out this rank's (`device_share`). The outer `Err`: a peer did not
    /// take its part in time, or broke the exchange (named); the inner:
    /// a mapping this rank could not make, and why.
    #[allow(clippy::too_many_arguments)]
    fn map_peers(
        &self,
        engine: &dyn Engine,
        ordinal: u32,
        ready: &Ready,
        server: Option<&FdServer>,
        entries: &[FifoEntry],
        cross: &[usize],
        gpus: &[&GpuIdentity],
        deadline: Instant,
        during: &str,
    ) -> Result<std::result::Result<Vec<(usize, PeerRegion)>, String>> {
        let mut wants = Vec::with_capacity(cross.len());
        for &p in cross {
            let Some(wire) = &entries[p].wire else {
                return Err(Error::Bootstrap(format!(
                    "rank {p} published no FIFO handle for its peers in other processes"
                )));
            };
            let (needs_fd, _) = device_share::parse_wire(p, wire)?;
            let socket = match (&entries[p].socket, needs_fd) {
                (Some(name), true) => Some(name.as_slice()),
                (None, true) => {
                    return Err(Error::Bootstrap(format!(
                        "rank {p}'s FIFO handle needs a descriptor, and it published no socket"
                    )))
                }
                (_, false) => None,
            };
            wants.push((p, wire.as_slice(), socket));
        }
        // Ask every owner first (their sockets listen already), then hand
        // out this rank's descriptor, then read the answers.
        let mut asked = Vec::new();
        for &(p, _, socket) in &wants {
            if let Some(name) = socket {
                asked.push((p, device_share::ask(p, name, self.rank, during)?));
            }
        }
        if let (Some(server), Some(share)) = (server, &ready.share) {
            let askers: Vec<(usize, u32)> = cross.iter().map(|&r| (r, gpus[r].pid)).collect();
            server.serve(self.rank, share, &askers, deadline, during)?;
        }
        let mut fds = Vec::with_capacity(asked.len());
        for (p, sock) in &asked {
            fds.push((*p, device_share::answer(*p, sock, deadline, during)?));
        }
        let mut mapped = Vec::with_capacity(wants.len());
        for &(p, wire, _) in &wants {
            let fd = fds.iter().find(|(q, _)| *q == p).map(|(_, fd)| fd);
            match device_share::map_peer(engine, ordinal, p, wire, fd) {
                Ok(region) => mapped.push((p, region)),
                Err(why) => return Ok(Err(why)),
            }
        }
        Ok(Ok(mapped))
    }

    /// Run `call` (of `coll`) by the executor set up in `ready`: see the
    /// module docs.
    pub(super) fn exec_run<T: Element>(
        &self,
        ready: &mut Ready,
        device: &DeviceIo,
        call: &Call,
        coll: &CollCall,
        host_plan: &Plan,
    ) -> Result<()> {
        let engine = &**device.pool.engine();
        let during = call.during();
        let err = |e: CudaError| Error::Io(format!("{during}: device executor: {e}"));
        if ready.faulted {
            return Err(Error::Io(format!(
                "{during}: the device executor faulted in an earlier call"
            )));
        }
        let elem = std::mem::size_of::<T>();
        let n = self.size;
        let bytes = coll.count * elem;
        let choice = device_plan::for_call(
            coll.kind,
            n,
            bytes,
            ready.allowed,
            ready.channels,
            &ready.geometry,
        );
        if tracing::enabled!(tracing::Level::INFO)
            && super::lock(&self.tuned)
                .insert((coll.kind.code() | 0x80, crate::tune::size_class(bytes)))
        {
            let algorithm = self.algorithm_name(coll, bytes);
            tracing::info!(
                rank = self.rank,
                "plan: {}",
                device_plan::explain(coll.kind, bytes, n, &algorithm, &choice)
            );
        }
        // The plan's frames hold `channels` pieces of a chunk each
        // (`algo::channels::split` cuts every step alike).
        let plan = self.build_plan_chunked::<T>(coll, choice.chunk_bytes * choice.channels)?;
        if (
            plan.scratch_output,
            plan.copies_input,
            plan.input_base,
            plan.output_base,
        ) != (
            host_plan.scratch_output,
            host_plan.copies_input,
            host_plan.input_base,
            host_plan.output_base,
        ) {
            return Err(Error::Io(format!(
                "{during}: the device plan lays the buffers out unlike the call's plan"
            )));
        }
        let meta = ProgramMeta {
            rank: self.rank,
            ranks: n,
            dtype: T::DTYPE,
            op: coll.op,
            layout: device.exec.layout,
            finish: coll::avg_finish(coll, &plan, self.rank, n, device.exec.layout)
                .map_err(|why| Error::Io(format!("{during}: {why}")))?,
        };
        let schedule = crate::algo::channels::split(&plan.schedule, choice.channels);
        let image = encode::encode(&schedule, &meta)
            .map_err(|e| Error::Io(format!("{during}: the schedule does not encode: {e}")))?;
        let channels = u16::from_le_bytes([image[20], image[21]]) as u32;
        if channels as usize > ready.channels {
            return Err(Error::Io(format!(
                "{during}: a program of {channels} channels; the executor is set up for {}",
                ready.channels
            )));
        }
        let (input, output) = match device.exec.layout {
            Layout::Shared { .. } => {
                let at = engine.device_address(device.exec.base);
                (at, at)
            }
            Layout::Separate => (
                engine.device_address(device.bufs.input),
                engine.device_address(device.bufs.output),
            ),
        };
        let program = ready.image_for(engine, &image, call.timeout).map_err(err)?;
        let s = ready.stream;
        let ctl = Control {
            abort: ready.abort_addr,
            spin_check: SPIN_CHECK,
            ..Control::default()
        };
        engine
            .with_pinned(ready.ctl_pinned, &mut |p| {
                p.copy_from_slice(&ctl.to_bytes())
            })
            .map_err(err)?;
        let op = coll.op.map(crate::exec::cuda_op);
        let launch = ExecLaunch {
            protocol: choice.protocol,
            op,
            ty: crate::exec::cuda_ty(T::DTYPE),
            channels,
            program,
            input,
            output,
            conns: engine.device_address(DevicePtr::new(ready.conns)),
            ctl: engine.device_address(DevicePtr::new(ready.ctl)),
        };
        (|| {
            engine.stream_wait(s, device.ready)?;
            engine.h2d(
                s,
                DevicePtr::new(ready.ctl),
                ready.ctl_pinned,
                0,
                CONTROL_BYTES,
            )?;
            engine.launch_executor(s, &launch)?;
            if let Some((gate, value)) = device.gate {
                engine.stream_raise_gate(s, gate, value)?;
            }
            engine.d2h(
                s,
                ready.ctl_pinned,
                0,
                DevicePtr::new(ready.ctl),
                CONTROL_BYTES,
            )?;
            engine.record(ready.end, s)
        })()
        .map_err(err)?;
        let watched = self.watch_kernel(engine, ready, call);
        let mut got = [0u8; CONTROL_BYTES];
        let read = engine.with_pinned(ready.ctl_pinned, &mut |p| got.copy_from_slice(p));
        let why = match watched {
            Err(e) => {
                ready.faulted = true;
                return Err(e);
            }
            Ok(why) => why,
        };
        read.map_err(err)?;
        let ctl =
            Control::from_bytes(&got).ok_or_else(|| Error::Io(format!("{during}: control")))?;
        match ExecFault::from_code(ctl.error) {
            None if ctl.error == 0 => Ok(()),
            fault => {
                ready.faulted = true;
                Err(fault_error(fault, &ctl, why, &during, call.timeout))
            }
        }
    }

    /// Wait for the kernel's work to end, raising the abort word on
    /// `abort()`, on a failure the communicator hears of, and at the
    /// timeout: why it was raised, if it was. `Err` where the work did not
    /// end (or the engine failed).
    fn watch_kernel(
        &self,
        engine: &dyn Engine,
        ready: &Ready,
        call: &Call,
    ) -> Result<Option<Raised>> {
        let started = Instant::now();
        let mut raised: Option<(Raised, Instant)> = None;
        loop {
            let slice = match raised {
                Some(_) => WATCH_SLICE * 10,
                None => WATCH_SLICE,
            };
            match engine.host_wait(ready.end, slice) {
                Ok(()) => return Ok(raised.map(|(why, _)| why)),
                Err(CudaError::Timeout { .. }) => {}
                Err(e) => {
                    // The engine failed (a stand-in's deadlock report, a
                    // sticky CUDA error): the kernel is told to stop, so
                    // that it does not spin on for peers that will not
                    // come, and the call ends with the engine's error.
                    engine.raise_gate(ready.abort, 1);
                    return Err(Error::Io(format!(
                        "{}: device executor: {e}",
                        call.during()
                    )));
                }
            }
            match raised {
                Some((_, at)) if at.elapsed() > ABORT_GRACE => {
                    return Err(Error::Io(format!(
                        "{}: the device executor's kernel still runs {} s after its abort word \
                         was set",
                        call.during(),
                        ABORT_GRACE.as_secs()
                    )))
                }
                Some(_) => {}
                None => {
                    let why = if self.abort_signal.is_fired() || self.has_failed() {
                        Some(Raised::Failure)
                    } else if started.elapsed() >= call.timeout {
                        Some(Raised::Timeout(started.elapsed()))
                    } else {
                        None
                    };
                    if let Some(why) = why {
                        engine.raise_gate(ready.abort, 1);
                        raised = Some((why, Instant::now()));
                    }
                }
            }
        }
    }
}

/// Why the watchdog set the abort word.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Raised {
    /// `abort()`, or a failure the communicator heard of.
    Failure,
    /// The call's timeout, after this long.
    Timeout(Duration),
}

/// The call's error for a kernel's report: the named errors of the host
/// path.
pub(crate) fn fault_error(
    fault: Option<ExecFault>,
    ctl: &Control,
    raised: Option<Raised>,
    during: &str,
    timeout: Duration,
) -> Error {
    let what = ExecFault::describe(ctl).unwrap_or_else(|| format!("fault code {}", ctl.error));
    let peer = ctl.peer as usize;
    match (fault, raised) {
        (Some(ExecFault::Aborted), Some(Raised::Timeout(after))) => Error::Timeout {
            peer,
            during: during.to_string(),
            what: format!(
                "a device frame on channel {} (program record {})",
                ctl.channel, ctl.record
            ),
            waited_ms: after.max(timeout).as_millis() as u64,
        },
        // The communicator's own failure (on_error puts the stored one in
        // its place) or abort().
        (Some(ExecFault::Aborted), _) => Error::Aborted(None),
        (Some(ExecFault::Tag | ExecFault::Length | ExecFault::TooBig), _) => Error::Protocol {
            peer,
            during: during.to_string(),
            detail: format!("device executor: {what}"),
        },
        _ => Error::Io(format!("{during}: device executor: {what}")),
    }
}

/// Copy `bytes` to the start of `dst` through a pinned buffer, and wait.
fn upload(engine: &dyn Engine, stream: Stream, dst: DeviceBuf, bytes: &[u8]) -> Result<()> {
    let err = |e: CudaError| Error::Io(format!("device executor set-up: {e}"));
    if bytes.is_empty() {
        return Ok(());
    }
    let pinned = engine.alloc_pinned(bytes.len()).map_err(err)?;
    let done = upload_through(engine, stream, dst, pinned, bytes);
    engine.free_pinned(pinned);
    done
}

/// Copy `bytes` to the start of `dst` through `pinned` (at least as
/// large), and wait for the copy alone.
fn upload_through(
    engine: &dyn Engine,
    stream: Stream,
    dst: DeviceBuf,
    pinned: PinnedBuf,
    bytes: &[u8],
) -> Result<()> {
    let err = |e: CudaError| Error::Io(format!("device executor set-up: {e}"));
    (|| {
        engine.with_pinned(pinned, &mut |p| p[..bytes.len()].copy_from_slice(bytes))?;
        engine.h2d(stream, DevicePtr::new(dst), pinned, 0, bytes.len())?;
        let ev = engine.event()?;
        engine.record(ev, stream)?;
        let waited = engine.host_wait(ev, Duration::from_secs(60));
        engine.free_event(ev);
        waited
    })()
    .map_err(err)
}

/// Bytes of program image device memory made at set-up.
const IMAGE_START: usize = 4096;
/// Bytes of the pinned buffer images are uploaded through, a piece at a
/// time.
const IMAGE_PIECE: usize = 64 << 10;

impl Ready {
    /// The program image in device memory, copied there on the stream.
    /// Called under a parked stream (the call's gate), so nothing here
    /// waits for other streams (the device rule): the device memory grows
    /// to the next power of two in the stream's order (`cuMemAllocAsync`,
    /// `cuMemFreeAsync`), and an image larger than the pinned buffer goes
    /// up in pieces, each waited for on this stream alone. The previous
    /// call's copy has ended: the call waited for its work.
    fn image_for(
        &mut self,
        engine: &dyn Engine,
        image: &[u8],
        timeout: Duration,
    ) -> ferroccl_cuda::error::Result<u64> {
        let (mut d, cap) = self.image;
        if cap < image.len() {
            let want = image.len().next_power_of_two();
            let grown = engine.alloc_device_async(self.stream, want)?;
            engine.free_device_async(self.stream, d)?;
            self.image = (grown, want);
            d = grown;
        }
        for (k, piece) in image.chunks(IMAGE_PIECE).enumerate() {
            if k > 0 {
                engine.host_wait(self.image_sent, timeout)?;
            }
            engine.with_pinned(self.image_pinned, &mut |m| {
                m[..piece.len()].copy_from_slice(piece)
            })?;
            let at = DevicePtr::new(d).add(k * IMAGE_PIECE);
            engine.h2d(self.stream, at, self.image_pinned, 0, piece.len())?;
            engine.record(self.image_sent, self.stream)?;
        }
        Ok(engine.device_address(DevicePtr::new(d)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::device::tests::offer;
    use ferroccl_cuda::executor::Protocol;
    use std::collections::HashSet;

    /// Every sender's words are its receiver's, each word of each pair
    /// lies in one place, and in the memory of the rank the geometry says.
    #[test]
    fn conn_tables_pair_every_sender_with_its_receiver() {
        let g = FifoGeometry {
            slots: 3,
            slot_bytes: 256,
            ll_slots: 2,
            ll_lines: 33,
        };
        for n in 1..=6 {
            for channels in 1..=2 {
                let span = channels as u64 * n as u64 * g.region();
                let bases: Vec<u64> = (0..n as u64)
                    .map(|r| (1 << 40) + r * (span + 4096))
                    .collect();
                let tables: Vec<Vec<Conn>> = (0..n)
                    .map(|r| conn_table(r, n, channels, &bases, &g, 7))
                    .collect();
                let mut words = HashSet::new();
                for c in 0..channels {
                    for s in 0..n {
                        for r in 0..n {
                            let a = tables[s][c * n + r];
                            if s == r {
                                assert_eq!(a, Conn::default());
                                continue;
                            }
                            let b = tables[r][c * n + s];
                            assert_eq!(
                                (
                                    a.send_slots,
                                    a.send_meta,
                                    a.send_tail,
                                    a.send_head,
                                    a.send_ll,
                                    a.send_ll_head
                                ),
                                (
                                    b.recv_slots,
                                    b.recv_meta,
                                    b.recv_tail,
                                    b.recv_head,
                                    b.recv_ll,
                                    b.recv_ll_head
                                ),
                                "{s} -> {r} on channel {c} of {n}"
                            );
                            let inside = |owner: usize, at: u64| {
                                at >= bases[owner] && at < bases[owner] + span
                            };
                            // The receiver polls tail and LL lines and
                            // holds the slots; the sender polls head.
                            assert!(
                                inside(r, a.send_slots)
                                    && inside(r, a.send_tail)
                                    && inside(r, a.send_ll)
                            );
                            assert!(inside(s, a.send_head) && inside(s, a.send_ll_head));
                            for w in [
                                a.send_slots,
                                a.send_meta,
                                a.send_tail,
                                a.send_head,
                                a.send_ll,
                                a.send_ll_head,
                            ] {
                                assert!(words.insert(w), "{w:#x} twice");
                            }
                            assert_eq!(
                                (a.slots, a.slot_bytes, a.ll_slots, a.ll_lines, a.ll_clean),
                                (3, 256, 2, 33, 7)
                            );
                        }
                    }
                }
            }
        }
    }

    /// FIFO entries cross the wire whole, with and without a handle; a
    /// rank without FIFOs says so; cut or padded entries are refused.
    #[test]
    fn fifo_entries_cross_the_wire() {
        let full = FifoEntry {
            address: 0xdead_beef_0040,
            wire: Some(vec![1, 2, 3]),
            socket: Some(b"ferroccl-fifo-1-2".to_vec()),
        };
        let bytes = fifo_entry(full.address, full.wire.clone(), full.socket.as_deref());
        assert_eq!(parse_fifo_entry(0, &bytes).unwrap(), Some(full));
        let bare = fifo_entry(64, None, None);
        assert_eq!(
            parse_fifo_entry(0, &bare).unwrap(),
            Some(FifoEntry {
                address: 64,
                wire: None,
                socket: None
            })
        );
        assert_eq!(parse_fifo_entry(0, &[0]).unwrap(), None);
        for cut in 0..bytes.len() {
            assert!(parse_fifo_entry(2, &bytes[..cut]).is_err(), "{cut} bytes");
        }
        let long = [bytes.clone(), vec![0]].concat();
        let err = parse_fifo_entry(2, &long).unwrap_err();
        assert!(err.to_string().contains("rank 2"), "{err}");
    }

    #[test]
    fn the_geometry_keeps_parts_apart() {
        let g = FifoGeometry::new(
            crate::config::DEFAULT_BUFFSIZE / ferroccl_transport::DEFAULT_STEPS,
            ferroccl_transport::DEFAULT_STEPS,
        );
        assert_eq!((g.slots, g.slot_bytes), (8, 512 << 10));
        assert_eq!(FifoGeometry::new(256, 1).slots, 2);
        assert_eq!(FifoGeometry::new(256, 4).room(Protocol::LowLatency), 256);
        assert!(g.meta() >= g.slots as u64 * g.slot_bytes as u64);
        assert!(g.ll() >= g.meta() + 8 * g.slots as u64);
        assert!(g.tail() >= g.ll() + g.ll_slots as u64 * g.ll_lines as u64 * 16);
        for w in [g.ll(), g.tail(), g.head(), g.ll_head(), g.region()] {
            assert_eq!(w % WORD_GAP, 0);
        }
        // An LL slot holds the tuner's LL chunk after its header line.
        assert!((g.ll_lines as usize - 1) * 8 >= device_plan::LL_CHUNK_BYTES);
        assert!(g.slot_bytes as usize >= device_plan::BULK_CHUNK_BYTES);
    }

    #[test]
    fn offers_cross_the_wire_and_bad_ones_are_refused() {
        for o in [
            offer(3, 9),
            Offer {
                runs: false,
                p2p: true,
                allowed: Allowed {
                    bulk: false,
                    ll: true,
                },
                geometry: FifoGeometry::new(1 << 20, 8),
                channels: 1,
                gpu: None,
            },
        ] {
            let b = o.to_bytes().unwrap();
            assert_eq!(Offer::from_bytes(0, &b).unwrap(), o);
            for cut in 0..b.len() {
                // Never a panic; a cut offer is refused or (cut after the
                // flags of one without a GPU) equal.
                let _ = Offer::from_bytes(0, &b[..cut]);
            }
        }
        let e = Offer::from_bytes(4, &[ROUND_VERSION + 1, 0])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 4") && e.contains(&format!("version {}", ROUND_VERSION + 1)),
            "{e}"
        );
        let mut zero = offer(1, 2).to_bytes().unwrap();
        zero[18] = 0;
        let e = Offer::from_bytes(4, &zero).unwrap_err().to_string();
        assert!(e.contains("0 channels"), "{e}");
        let mut flags = vec![ROUND_VERSION, 0x20];
        flags.extend([0; 16]);
        let e = Offer::from_bytes(4, &flags).unwrap_err().to_string();
        assert!(e.contains("flags"), "{e}");
        assert!(row_from_bytes(1, 3, &[0, 1, 3]).is_err());
        assert_eq!(
            row_from_bytes(1, 3, &row_to_bytes(&[Some(false), Some(true), None])).unwrap(),
            vec![Some(false), Some(true), None]
        );
    }

    #[test]
    fn kernel_reports_become_the_host_paths_errors() {
        let ctl = Control {
            error: 1,
            channel: 0,
            record: 5,
            peer: 3,
            ..Control::default()
        };
        let t = Duration::from_secs(2);
        match fault_error(
            Some(ExecFault::Aborted),
            &ctl,
            Some(Raised::Timeout(t)),
            "all_reduce #4",
            t,
        ) {
            Error::Timeout {
                peer,
                during,
                what,
                waited_ms,
            } => {
                assert_eq!(
                    (peer, during.as_str(), waited_ms),
                    (3, "all_reduce #4", 2000)
                );
                assert!(what.contains("record 5"), "{what}");
            }
            other => panic!("{other}"),
        }
        assert!(matches!(
            fault_error(
                Some(ExecFault::Aborted),
                &ctl,
                Some(Raised::Failure),
                "x",
                t
            ),
            Error::Aborted(None)
        ));
        let tag = Control {
            error: 2,
            peer: 1,
            want: 9,
            got: 10,
            ..Control::default()
        };
        match fault_error(Some(ExecFault::Tag), &tag, None, "x", t) {
            Error::Protocol {
                peer: 1, detail, ..
            } => assert!(detail.contains("tagged 10"), "{detail}"),
            other => panic!("{other}"),
        }
        let odd = Control {
            error: 99,
            ..Control::default()
        };
        assert!(fault_error(None, &odd, None, "x", t)
            .to_string()
            .contains("fault code 99"));
    }

    /// Here (no driver) the probe says NoDevice; on a GPU it describes
    /// device 0 of this process and host.
    #[test]
    fn probing_says_no_device_or_describes_this_process() {
        match probe(0) {
            Err(Error::NoDevice(why)) => {
                assert!(!why.is_empty());
                assert!(std::env::var("FERROCCL_REQUIRE_DEVICE").as_deref() != Ok("1"));
            }
            Ok(id) => {
                assert_eq!(id.pid, std::process::id());
                assert_eq!(id.host, crate::topo::host_info());
                assert_eq!(
                    GpuIdentity::from_bytes(&id.to_bytes().unwrap()).unwrap(),
                    id
                );
                assert_eq!(peer_access(&id, &id), Ok(Some(true)));
            }
            Err(other) => panic!("expected NoDevice, got {other}"),
        }
    }
}
