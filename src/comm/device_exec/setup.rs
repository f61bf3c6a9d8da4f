//! The set-up of the device executor at the first collective device call
//! on an engine: the rounds through the rendezvous, the decision
//! (`plan::device::decide`), this rank's FIFO memory, and the peers'
//! mapped where they are in other processes. The GPU facts the planner
//! decides from are asked of the driver here (`probe`, `peer_access`), or
//! of the host stand-in.

use super::share::{self, FdServer, PeerRegion, Share};
use super::wire::{
    conn_table, fifo_entry, parse_fifo_entry, row_from_bytes, row_to_bytes, FifoEntry,
};
use super::{upload, upload_through, ExecPath, Ready, IMAGE_PIECE, IMAGE_START};
use crate::comm::Inner;
use crate::error::{Error, Result};
use crate::exec::{Call, Links};
use crate::plan::device::{self as device_plan, decide, Allowed, FifoGeometry, Offer};
use crate::plan::gpu_path::{self, GpuIdentity};
use ferroccl_cuda::device::{DevicePtr, Engine};
use ferroccl_cuda::error::CudaError;
use ferroccl_cuda::executor::{self, CONTROL_BYTES, LL_CLEAN_FRAMES};
use std::time::Instant;

/// This process's identity on device `ordinal`. `Error::NoDevice`
/// (with the reason) without a driver or device.
fn probe(ordinal: u32) -> Result<GpuIdentity> {
    let dev = ferroccl_cuda::topo::identity(ordinal).map_err(crate::error::from_cuda)?;
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
/// the peer's GPU is not visible here); one GPU is `Some(true)` within a
/// process (but see `access`: a GPU's streams share hardware queues),
/// and between processes only under MPS (without it their
/// kernels take turns on the GPU, and the executor's kernels, which wait
/// for each other, would wait for a turn: the first GPU run's DDP step on
/// two processes hung; `gpu_path::select` gives the reason). Calls the
/// driver (after its probe).
fn peer_access(me: &GpuIdentity, peer: &GpuIdentity) -> Result<Option<bool>> {
    use ferroccl_cuda::topo;
    if !me.same_host(peer) {
        return Ok(None);
    }
    if me.uuid == peer.uuid {
        if me.pid == peer.pid {
            return Ok(Some(true));
        }
        return topo::mps_enabled(me.ordinal)
            .map(Some)
            .map_err(crate::error::from_cuda);
    }
    let from_cuda = crate::error::from_cuda;
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

/// Peer access between this rank's device and a peer's. Not between two
/// ranks of one process on one device whose streams share hardware
/// queues (a GPU's always do, a stand-in's where modelled): one rank's
/// kernel could wait in a queue behind work that waits for the other's
/// (the third GPU run's thread ranks hung so; `gpu_path::select` says
/// why). Otherwise a stand-in reaches only itself (one stand-in is one
/// GPU), and a GPU answers by `peer_access`.
fn access(engine: &dyn Engine, me: &GpuIdentity, peer: &GpuIdentity) -> Result<Option<bool>> {
    let one = me.same_host(peer) && me.uuid == peer.uuid;
    if one && me.pid == peer.pid && engine.shares_hardware_queues() {
        return Ok(Some(false));
    }
    if engine.stand_in_uuid().is_some() {
        return Ok(Some(one));
    }
    peer_access(me, peer)
}

impl Inner {
    /// The rounds of the first collective device call on `engine` (every
    /// rank is in this call's turn): the decision, and the FIFOs where it
    /// is the executor.
    pub(in crate::comm) fn exec_setup(
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
                .unwrap_or_else(|| device_plan::default_channels(n))
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
        let ordinals: Vec<u32> = gpus.iter().map(|g| g.ordinal).collect();
        let table = conn_table(
            self.rank,
            n,
            channels,
            &addresses,
            &ordinals,
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
    /// out this rank's (`share`). The outer `Err`: a peer did not
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
            let (needs_fd, _) = share::parse_wire(p, wire)?;
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
                asked.push((p, share::ask(p, name, self.rank, during)?));
            }
        }
        if let (Some(server), Some(share)) = (server, &ready.share) {
            let askers: Vec<(usize, u32)> = cross.iter().map(|&r| (r, gpus[r].pid)).collect();
            server.serve(self.rank, share, &askers, deadline, during)?;
        }
        let mut fds = Vec::with_capacity(asked.len());
        for (p, sock) in &asked {
            fds.push((*p, share::answer(*p, sock, deadline, during)?));
        }
        let mut mapped = Vec::with_capacity(wants.len());
        for &(p, wire, _) in &wants {
            let fd = fds.iter().find(|(q, _)| *q == p).map(|(_, fd)| fd);
            match share::map_peer(engine, ordinal, p, wire, fd) {
                Ok(region) => mapped.push((p, region)),
                Err(why) => return Ok(Err(why)),
            }
        }
        Ok(Ok(mapped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
