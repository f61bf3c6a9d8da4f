//! The RDMA transport over the emulated verbs ([`crate::emu`]): the data
//! path of [`crate::conn`] and the socket set-up of [`crate::setup`], on
//! an emulated fabric shared by the threads of this process (transport
//! name `ib-emu`). It is how the protocol and its set-up run the transport
//! conformance suite and ferroccl's collectives on a machine without an
//! RDMA device; like `mem`, it never crosses a process.
//!
//! [`EmuNet`] is the [`Fabric`] of the emulation: every listener gets a
//! device of one process-wide eager fabric ([`EmuFabric::eager`]); an
//! endpoint is a number naming a prepared queue pair, and the first of the
//! two sides to connect makes the pair and leaves the peer its end.

use crate::emu::{EmuDevice, EmuFabric, EmuQp, FabricStats};
use crate::setup::{Fabric, NetTransport};
use ferroccl_transport::{lock, ListenConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The transport's name (FERROCCL_TRANSPORT=ib-emu, and in connections).
pub const NAME: &str = "ib-emu";

/// The RDMA transport over emulated verbs, `qps` queue pairs per direction
/// of each connection (1..=16; frames of 64 KiB and more are striped
/// across them).
pub fn transport(qps: usize) -> NetTransport<EmuNet> {
    NetTransport::new(EmuNet, qps)
}

/// The emulation as a [`Fabric`].
#[derive(Debug, Clone, Copy, Default)]
pub struct EmuNet;

/// A queue pair prepared by [`EmuNet`]: its number.
#[derive(Debug)]
pub struct EmuPrepared(u64);

/// Queue pairs prepared (device and send-queue depth, by number), and ends
/// made by the first side of a pair to connect, left for the second
/// (keyed by maker and taker); one lock, so two sides connecting at once
/// see each other.
#[derive(Default)]
struct Pairing {
    prepared: HashMap<u64, (EmuDevice, usize)>,
    left: HashMap<(u64, u64), EmuQp>,
}

fn pairing() -> &'static Mutex<Pairing> {
    static PAIRING: OnceLock<Mutex<Pairing>> = OnceLock::new();
    PAIRING.get_or_init(|| Mutex::new(Pairing::default()))
}

impl Fabric for EmuNet {
    type Dev = EmuDevice;
    type Qp = EmuQp;
    type Prepared = EmuPrepared;

    fn name(&self) -> &'static str {
        NAME
    }

    fn device(&self, config: &ListenConfig) -> Result<EmuDevice, String> {
        let dev = fabric().device();
        let mut list = lock(devices());
        // Forget devices nothing else holds any more.
        list.retain(|(_, _, d)| d.in_use());
        list.push((config.token, config.rank, dev.clone()));
        Ok(dev)
    }

    fn prepare(&self, dev: &EmuDevice, depth: usize) -> Result<(EmuPrepared, Vec<u8>), String> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        lock(pairing()).prepared.insert(id, (dev.clone(), depth));
        Ok((EmuPrepared(id), id.to_le_bytes().to_vec()))
    }

    fn connect(&self, me: EmuPrepared, remote: &[u8]) -> Result<EmuQp, String> {
        let peer = <[u8; 8]>::try_from(remote)
            .map(u64::from_le_bytes)
            .map_err(|_| format!("an emulated endpoint of {} bytes", remote.len()))?;
        let id = me.0;
        let mut p = lock(pairing());
        let (mine, depth) = p
            .prepared
            .remove(&id)
            .ok_or_else(|| format!("queue pair {id} is not prepared"))?;
        if let Some(end) = p.left.remove(&(peer, id)) {
            return Ok(end);
        }
        let Some((theirs, _)) = p.prepared.get(&peer).cloned() else {
            return Err(format!("no prepared queue pair {peer} to connect to"));
        };
        let (a, b) = fabric().connect(&mine, &theirs, depth);
        p.left.insert((id, peer), b);
        Ok(a)
    }
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
pub fn stats() -> FabricStats {
    fabric().stats()
}

fn fabric() -> &'static EmuFabric {
    static FABRIC: OnceLock<EmuFabric> = OnceLock::new();
    FABRIC.get_or_init(EmuFabric::eager)
}
