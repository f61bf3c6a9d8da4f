//! The RDMA transport over the emulated verbs ([`crate::emu`]): the
//! data path of [`crate::conn`] with every rank a thread of this process
//! (transport name `ib-emu`). It is how the protocol runs the transport
//! conformance suite and ferroccl's collectives on a machine without an
//! RDMA device; like `mem`, it never crosses a process.
//!
//! Set-up: every listener is a device of one process-wide eager fabric
//! ([`EmuFabric::eager`]) and an entry in a process-wide registry under
//! its address. The connecting rank checks the acceptor's job token,
//! communicator and geometry, registers both ends' regions, connects the
//! queue pairs of both directions, and hands the acceptor its end through
//! the registry; the real transport exchanges the same facts (region keys
//! and addresses, queue-pair endpoints) over a socket instead.

use crate::conn::{self, EndParts, Geometry, LocalRegions, MAX_QPS};
use crate::emu::{EmuDevice, EmuFabric, EmuQp};
use ferroccl_transport::{
    elapsed_ms, lock, AbortSignal, Connection, FifoDescriptor, HostInfo, HostPath, ListenConfig,
    Listener, MemoryKind, Transport, TransportError,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// The transport's name (FERROCCL_TRANSPORT=ib-emu, and in connections).
pub const NAME: &str = "ib-emu";

/// The acceptor's end, made by the connecting rank.
struct Offer {
    from: usize,
    regions: LocalRegions,
    remote: conn::EndInfo,
    out_qps: Vec<EmuQp>,
    in_qps: Vec<EmuQp>,
}

/// What a listener shows connecting ranks.
#[derive(Clone)]
struct Entry {
    inbox: crossbeam_channel::Sender<Offer>,
    dev: EmuDevice,
    token: u64,
    comm_id: u64,
    geometry: Geometry,
}

fn registry() -> &'static Mutex<HashMap<u64, Entry>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u64, Entry>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The `cts` region of `regions` as its peer names it.
fn remote_cts(regions: &LocalRegions) -> conn::RemoteRegion {
    (&regions.cts).into()
}

/// Every listener's device, by job token and rank, for [`kill_rank`].
fn devices() -> &'static Mutex<Vec<(u64, usize, EmuDevice)>> {
    static DEVICES: OnceLock<Mutex<Vec<(u64, usize, EmuDevice)>>> = OnceLock::new();
    DEVICES.get_or_init(|| Mutex::new(Vec::new()))
}

/// Kills the devices of `rank` in the job `token` ([`EmuDevice::kill`]):
/// that rank's host dies as far as its RDMA connections go, without a word
/// to its peers, as a process killed mid-job. For tests of failure; the
/// number of devices killed is returned.
pub fn kill_rank(token: u64, rank: usize) -> usize {
    let list = lock(devices());
    list.iter()
        .filter(|(t, r, _)| *t == token && *r == rank)
        .map(|(_, _, dev)| dev.kill())
        .count()
}

/// The fabric's counters: writes, immediates and bytes that crossed it
/// since the process began.
pub fn stats() -> crate::emu::FabricStats {
    fabric().stats()
}

fn fabric() -> &'static EmuFabric {
    static FABRIC: OnceLock<EmuFabric> = OnceLock::new();
    FABRIC.get_or_init(EmuFabric::eager)
}

/// The RDMA transport over emulated verbs, `qps` queue pairs per
/// direction of each connection.
#[derive(Debug, Clone)]
pub struct EmuTransport {
    qps: usize,
}

impl EmuTransport {
    /// With `qps` queue pairs per direction (1..=16; frames of 64 KiB and
    /// more are striped across them).
    pub fn new(qps: usize) -> Self {
        EmuTransport { qps }
    }
}

impl Transport for EmuTransport {
    fn name(&self) -> &'static str {
        NAME
    }

    fn can_connect(&self, _local: &HostInfo, _peer: &HostInfo) -> bool {
        // Only meaningful when every rank is a thread of this process; the
        // caller opts in by name.
        true
    }

    fn listen(
        &self,
        config: &ListenConfig,
        abort: &AbortSignal,
    ) -> Result<Box<dyn Listener>, TransportError> {
        let geometry = Geometry {
            chunk_bytes: config.chunk_bytes,
            steps: config.steps,
            qps: self.qps,
        };
        geometry.check().map_err(|detail| {
            TransportError::Io(format!(
                "ib-emu: {detail} (queue pairs: FERROCCL_IB_QPS_PER_CONNECTION, 1..={MAX_QPS})"
            ))
        })?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = crossbeam_channel::unbounded();
        let dev = fabric().device();
        {
            let mut list = lock(devices());
            // Forget devices nothing else holds any more.
            list.retain(|(_, _, d)| d.in_use());
            list.push((config.token, config.rank, dev.clone()));
        }
        lock(registry()).insert(
            id,
            Entry {
                inbox: tx,
                dev: dev.clone(),
                token: config.token,
                comm_id: config.comm_id,
                geometry,
            },
        );
        Ok(Box::new(EmuListener {
            id,
            config: config.clone(),
            geometry,
            dev,
            abort: abort.clone(),
            inbox: rx,
            early: Mutex::new(Vec::new()),
        }))
    }
}

struct EmuListener {
    id: u64,
    config: ListenConfig,
    geometry: Geometry,
    dev: EmuDevice,
    abort: AbortSignal,
    inbox: crossbeam_channel::Receiver<Offer>,
    /// Offers from peers other than the one being accepted right now.
    early: Mutex<Vec<Offer>>,
}

impl Drop for EmuListener {
    fn drop(&mut self) {
        lock(registry()).remove(&self.id);
    }
}

impl EmuListener {
    fn connection(
        &self,
        peer: usize,
        regions: LocalRegions,
        remote: conn::EndInfo,
        out_qps: Vec<EmuQp>,
        in_qps: Vec<EmuQp>,
        first_slots_granted: bool,
    ) -> Result<Connection, TransportError> {
        let g = self.geometry;
        let fifo = |rkey, remote_addr| FifoDescriptor {
            slot_stride: g.stride(),
            ..FifoDescriptor::internal(
                MemoryKind::Registered { rkey, remote_addr },
                g.steps,
                g.chunk_bytes,
            )
        };
        let send_fifo = fifo(remote.slots.rkey, remote.slots.addr);
        let recv_fifo = fifo(regions.slots.rkey, regions.slots.addr);
        let (sender, receiver, closer) = conn::open(EndParts {
            rank: self.config.rank,
            peer,
            geometry: g,
            dev: self.dev.clone(),
            regions,
            remote,
            out_qps,
            in_qps,
            abort: self.abort.clone(),
            first_slots_granted,
        })?;
        Ok(Connection {
            peer,
            transport: NAME,
            send_fifo,
            recv_fifo,
            host: Some(HostPath {
                sender: Box::new(sender),
                receiver: Box::new(receiver),
            }),
            closer,
        })
    }
}

impl Listener for EmuListener {
    fn address(&self) -> Vec<u8> {
        self.id.to_le_bytes().to_vec()
    }

    fn connect(
        &self,
        peer: usize,
        address: &[u8],
        _deadline: Instant,
    ) -> Result<Connection, TransportError> {
        let refuse = |detail: String| TransportError::Connect { peer, detail };
        let id = <[u8; 8]>::try_from(address)
            .map(u64::from_le_bytes)
            .map_err(|_| refuse(format!("bad ib-emu address of {} bytes", address.len())))?;
        let entry = lock(registry())
            .get(&id)
            .cloned()
            .ok_or_else(|| refuse("no such in-process listener".into()))?;
        if entry.token != self.config.token || entry.comm_id != self.config.comm_id {
            return Err(refuse(
                "it belongs to another job token or communicator".into(),
            ));
        }
        if entry.geometry != self.geometry {
            return Err(refuse(format!(
                "its connection geometry {:?} differs from this rank's {:?}",
                entry.geometry, self.geometry
            )));
        }
        let g = self.geometry;
        let register = |dev: &EmuDevice| {
            LocalRegions::register(dev, &g).map_err(|e| refuse(format!("registering memory: {e}")))
        };
        let mine = register(&self.dev)?;
        let theirs = register(&entry.dev)?;
        let (mut my_out, mut my_in, mut their_out, mut their_in) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..g.qps {
            let (a, b) = fabric().connect(&self.dev, &entry.dev, g.queue_depth());
            my_out.push(a);
            their_in.push(b);
            let (a, b) = fabric().connect(&entry.dev, &self.dev, g.queue_depth());
            their_out.push(a);
            my_in.push(b);
        }
        let remote = theirs.info();
        // The acceptor's receiving end says where this rank's first frames
        // go now, not at its `accept`: this rank may send before then.
        conn::grant_first_slots(&entry.dev, &theirs, &remote_cts(&mine), &g, &their_in[0])
            .map_err(|e| refuse(format!("posting the first clear-to-send entries: {e}")))?;
        entry
            .inbox
            .send(Offer {
                from: self.config.rank,
                regions: theirs,
                remote: mine.info(),
                out_qps: their_out,
                in_qps: their_in,
            })
            .map_err(|_| refuse("the in-process listener is gone".into()))?;
        self.connection(peer, mine, remote, my_out, my_in, false)
    }

    fn accept(&self, peer: usize, deadline: Instant) -> Result<Connection, TransportError> {
        let start = Instant::now();
        loop {
            let found = {
                let mut early = lock(&self.early);
                early
                    .iter()
                    .position(|o| o.from == peer)
                    .map(|i| early.swap_remove(i))
            };
            if let Some(o) = found {
                return self.connection(peer, o.regions, o.remote, o.out_qps, o.in_qps, true);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            crossbeam_channel::select! {
                recv(self.inbox) -> offer => match offer {
                    Ok(offer) => lock(&self.early).push(offer),
                    Err(_) => return Err(TransportError::Aborted),
                },
                recv(self.abort.receiver()) -> _ => return Err(TransportError::Aborted),
                default(remaining) => return Err(TransportError::Timeout {
                    peer,
                    what: "a connection",
                    waited_ms: elapsed_ms(start),
                }),
            }
        }
    }
}
