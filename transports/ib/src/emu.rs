//! An in-process emulation of the verbs of [`crate::verbs`], for testing
//! the protocol on machines without an RDMA device.
//!
//! An [`EmuFabric`] makes devices ([`EmuDevice`]) and connects them
//! pairwise ([`EmuFabric::connect`]) into reliable connected queue pairs
//! ([`EmuQp`]); all of them may be used from any thread of the process.
//!
//! What it enforces, as RC hardware does:
//! - per queue pair, writes are executed and completed in posting order;
//!   a write lands in the peer region's bytes, and a write with immediate
//!   also gives the peer a receive completion with the immediate and the
//!   length;
//! - remote keys: an unknown, other device's or deregistered rkey, or a
//!   write past the region's end, completes with
//!   [`WcError::RemoteAccess`] at the sender and puts the sender's queue
//!   pair in [`QpState::Error`]; a bad local slice likewise gives
//!   [`WcError::LocalProtection`];
//! - a queue pair in error completes what is pending, and whatever is
//!   posted later, with [`WcError::Flushed`]; a write aimed at a peer in
//!   error fails with [`WcError::RetryExceeded`];
//! - dropping one end puts the other in error at once (a dead peer), so
//!   its pending and later work is flushed instead of hanging;
//! - the send queue holds at most `max_outstanding` requests (posted,
//!   send completion not yet polled); posting beyond is refused with
//!   [`VerbsError::SendQueueFull`].
//!
//! The emulated NIC does its work when either end of a queue pair polls
//! or waits, not in a thread of its own: on a fabric made by
//! [`EmuFabric::new`] a request posted and never polled for by anyone
//! stays pending (which is what makes "pending when the peer died"
//! testable); on one made by [`EmuFabric::eager`] it is also done when
//! posted, as a real NIC would do it without being asked. Receive work requests are not modelled:
//! a write with immediate always finds a receive (the real data path
//! keeps receives posted ahead).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::verbs::{
    Completion, CompletionKind, Device, MemoryRegion, MrHandle, QpState, QueuePair, UserMemory,
    VerbsError, WcError, WriteRequest,
};

/// Makes emulated devices and connects them. Keys are unique across the
/// fabric, so one device's rkey is never valid at another.
#[derive(Debug, Default)]
pub struct EmuFabric {
    keys: Arc<AtomicU32>,
    eager: bool,
    stats: Arc<Counters>,
}

/// What crossed an emulated fabric, counted as a NIC would: work requests
/// executed successfully and the bytes they moved (see
/// [`EmuFabric::stats`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FabricStats {
    /// RDMA writes executed, with or without immediate.
    pub writes: u64,
    /// Of those, writes with immediate (each a receive completion).
    pub with_imm: u64,
    /// Payload bytes written.
    pub bytes: u64,
    /// Bytes the CPU copied into or out of registered regions
    /// ([`Device::write_region`] and [`Device::read_region`]): the
    /// staging copies of the data path. What the emulated NIC moves
    /// (writes, and [`Device::present`]ed caller bytes) is not counted.
    pub cpu_bytes: u64,
    /// Calls that copied those bytes.
    pub cpu_copies: u64,
    /// Of the writes, those sent from caller memory
    /// ([`Device::register_user`]): zero-copy payloads.
    pub user_writes: u64,
    /// The bytes they carried.
    pub user_bytes: u64,
}

#[derive(Debug, Default)]
struct Counters {
    writes: AtomicU64,
    with_imm: AtomicU64,
    bytes: AtomicU64,
    cpu_bytes: AtomicU64,
    cpu_copies: AtomicU64,
    user_writes: AtomicU64,
    user_bytes: AtomicU64,
}

impl Counters {
    fn cpu(&self, n: usize) {
        self.cpu_bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.cpu_copies.fetch_add(1, Ordering::Relaxed);
    }
}

impl EmuFabric {
    /// A fabric with no devices whose NICs work only when an end polls or
    /// waits (so that work can be left pending, e.g. when a peer dies).
    pub fn new() -> Self {
        Self::default()
    }

    /// A fabric whose NICs also work when a request is posted, as real
    /// ones do on their own: a write lands, and its completions are
    /// queued, before `post_write` returns (unless the send queue was
    /// already stuck behind an error). The data path runs on this one.
    pub fn eager() -> Self {
        EmuFabric {
            eager: true,
            ..Self::default()
        }
    }

    /// What crossed the fabric so far.
    pub fn stats(&self) -> FabricStats {
        FabricStats {
            writes: self.stats.writes.load(Ordering::Relaxed),
            with_imm: self.stats.with_imm.load(Ordering::Relaxed),
            bytes: self.stats.bytes.load(Ordering::Relaxed),
            cpu_bytes: self.stats.cpu_bytes.load(Ordering::Relaxed),
            cpu_copies: self.stats.cpu_copies.load(Ordering::Relaxed),
            user_writes: self.stats.user_writes.load(Ordering::Relaxed),
            user_bytes: self.stats.user_bytes.load(Ordering::Relaxed),
        }
    }

    /// A new device (a NIC with its protection domain).
    pub fn device(&self) -> EmuDevice {
        EmuDevice {
            inner: Arc::new(DevInner {
                dead: AtomicBool::new(false),
                stats: Arc::clone(&self.stats),
                keys: Arc::clone(&self.keys),
                next_mr: AtomicU64::new(1),
                regions: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Connects `a` and `b` by a reliable connected queue pair whose ends
    /// each have a send queue of `max_outstanding` requests. `a` and `b`
    /// may be the same device (loopback).
    ///
    /// # Panics
    /// If `max_outstanding` is zero.
    pub fn connect(&self, a: &EmuDevice, b: &EmuDevice, max_outstanding: usize) -> (EmuQp, EmuQp) {
        assert!(
            max_outstanding > 0,
            "a send queue needs room for one request"
        );
        let side = |dev: &EmuDevice| Side {
            dev: Arc::clone(&dev.inner),
            state: QpState::Ready,
            alive: true,
            sq: VecDeque::new(),
            cq: VecDeque::new(),
            outstanding: 0,
        };
        let shared = Arc::new(Shared {
            link: Mutex::new([side(a), side(b)]),
            cv: Condvar::new(),
            depth: max_outstanding,
            eager: self.eager,
        });
        (
            EmuQp {
                shared: Arc::clone(&shared),
                me: 0,
            },
            EmuQp { shared, me: 1 },
        )
    }
}

#[derive(Debug)]
struct Region {
    /// The region's bytes; for caller memory, the bytes last presented
    /// (from offset `user.presented`).
    bytes: Vec<u8>,
    rkey: u32,
    /// The made-up address of byte 0 (distinct across the fabric); for
    /// caller memory, its real address.
    addr: u64,
    /// Set for caller memory ([`Device::register_user`]).
    user: Option<UserRegion>,
}

/// What the emulation keeps of registered caller memory.
#[derive(Debug, Clone, Copy)]
struct UserRegion {
    /// Bytes registered.
    len: usize,
    /// Offset in the region of `bytes[0]`.
    presented: usize,
}

impl Region {
    /// The range of `bytes` holding region bytes `offset..offset + len`,
    /// for a write's local slice.
    fn local(&self, offset: usize, len: usize) -> Result<std::ops::Range<usize>, VerbsError> {
        match self.user {
            None => bounds(offset, len, self.bytes.len()),
            Some(u) => {
                bounds(offset, len, u.len)?;
                // Only bytes presented for this write can be read.
                let from = offset
                    .checked_sub(u.presented)
                    .ok_or(VerbsError::OutOfBounds {
                        offset,
                        len,
                        region_len: u.len,
                    })?;
                bounds(from, len, self.bytes.len())
            }
        }
    }
}

#[derive(Debug)]
struct DevInner {
    /// The host went away ([`EmuDevice::kill`]).
    dead: AtomicBool,
    stats: Arc<Counters>,
    keys: Arc<AtomicU32>,
    next_mr: AtomicU64,
    regions: Mutex<HashMap<u64, Region>>,
}

impl DevInner {
    fn regions(&self) -> MutexGuard<'_, HashMap<u64, Region>> {
        self.regions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The `len` bytes at `offset` of region `mr`, copied out.
    /// The `len` bytes at `offset` of region `mr`, copied out, and
    /// whether the region is caller memory.
    fn read_local(
        &self,
        mr: MrHandle,
        offset: usize,
        len: usize,
    ) -> Result<(Vec<u8>, bool), VerbsError> {
        let regions = self.regions();
        let region = regions.get(&mr.0).ok_or(VerbsError::UnknownRegion(mr))?;
        let range = region.local(offset, len)?;
        Ok((region.bytes[range].to_vec(), region.user.is_some()))
    }

    /// Writes `data` at address `addr` of the region named by `rkey`.
    fn write_remote(&self, rkey: u32, addr: u64, data: &[u8]) -> Result<(), WcError> {
        let mut regions = self.regions();
        let region = regions
            .values_mut()
            .find(|r| r.rkey == rkey)
            .ok_or_else(|| WcError::RemoteAccess(format!("no region with rkey {rkey:#x}")))?;
        if region.user.is_some() {
            return Err(WcError::RemoteAccess(format!(
                "the region of rkey {rkey:#x} grants no remote write"
            )));
        }
        let offset = addr
            .checked_sub(region.addr)
            .and_then(|o| usize::try_from(o).ok())
            .ok_or_else(|| {
                WcError::RemoteAccess(format!(
                    "address {addr:#x} below the region of rkey {rkey:#x} (at {:#x})",
                    region.addr
                ))
            })?;
        let range = bounds(offset, data.len(), region.bytes.len())
            .map_err(|e| WcError::RemoteAccess(e.to_string()))?;
        region.bytes[range].copy_from_slice(data);
        Ok(())
    }
}

fn bounds(
    offset: usize,
    len: usize,
    region_len: usize,
) -> Result<std::ops::Range<usize>, VerbsError> {
    match offset.checked_add(len) {
        Some(end) if end <= region_len => Ok(offset..end),
        _ => Err(VerbsError::OutOfBounds {
            offset,
            len,
            region_len,
        }),
    }
}

/// An emulated device: registration and CPU access to registered bytes.
/// Clones name the same device.
#[derive(Debug, Clone)]
pub struct EmuDevice {
    inner: Arc<DevInner>,
}

impl EmuDevice {
    /// The device's host dies, as a process killed with its NIC's
    /// resources: every queue pair with an end on this device is in error
    /// from now on at both ends (its peers see it at their next poll, wait
    /// or post), and nothing more executes towards or from it. Nothing is
    /// said to anyone: no ending, no report.
    pub fn kill(&self) {
        self.inner.dead.store(true, Ordering::Release);
    }

    /// Whether another handle of this device exists besides this one.
    pub fn in_use(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// The caller memory registered now ([`Device::register_user`]): per
    /// region its handle, address and length, by address. The device's
    /// own view, for checking a registration cache against.
    pub fn user_regions(&self) -> Vec<(MrHandle, usize, usize)> {
        let mut out: Vec<_> = self
            .inner
            .regions()
            .iter()
            .filter_map(|(h, r)| r.user.map(|u| (MrHandle(*h), r.addr as usize, u.len)))
            .collect();
        out.sort_by_key(|&(_, addr, len)| (addr, len));
        out
    }

    fn keys(&self) -> (MrHandle, u32, u32) {
        let handle = MrHandle(self.inner.next_mr.fetch_add(1, Ordering::Relaxed));
        // Keys from one fabric-wide counter: never reused, so a stale rkey
        // stays invalid.
        let lkey = self
            .inner
            .keys
            .fetch_add(2, Ordering::Relaxed)
            .wrapping_add(0x100);
        (handle, lkey, lkey.wrapping_add(1))
    }
}

impl Device for EmuDevice {
    fn register(&self, len: usize) -> Result<MemoryRegion, VerbsError> {
        let (handle, lkey, rkey) = self.keys();
        // A made-up address, 1 TiB apart per key: never 0, and an address
        // of one region never falls in another.
        let addr = u64::from(rkey) << 40;
        self.inner.regions().insert(
            handle.0,
            Region {
                bytes: vec![0; len],
                rkey,
                addr,
                user: None,
            },
        );
        Ok(MemoryRegion {
            handle,
            lkey,
            rkey,
            len,
            addr,
        })
    }

    fn deregister(&self, mr: MrHandle) -> Result<(), VerbsError> {
        self.inner
            .regions()
            .remove(&mr.0)
            .map(drop)
            .ok_or(VerbsError::UnknownRegion(mr))
    }

    fn write_region(&self, mr: MrHandle, offset: usize, data: &[u8]) -> Result<(), VerbsError> {
        let mut regions = self.inner.regions();
        let region = regions
            .get_mut(&mr.0)
            .ok_or(VerbsError::UnknownRegion(mr))?;
        if region.user.is_some() {
            return Err(VerbsError::UnknownRegion(mr));
        }
        let range = bounds(offset, data.len(), region.bytes.len())?;
        region.bytes[range].copy_from_slice(data);
        self.inner.stats.cpu(data.len());
        Ok(())
    }

    fn read_region(&self, mr: MrHandle, offset: usize, out: &mut [u8]) -> Result<(), VerbsError> {
        let regions = self.inner.regions();
        let region = regions.get(&mr.0).ok_or(VerbsError::UnknownRegion(mr))?;
        if region.user.is_some() {
            return Err(VerbsError::UnknownRegion(mr));
        }
        let range = bounds(offset, out.len(), region.bytes.len())?;
        out.copy_from_slice(&region.bytes[range]);
        self.inner.stats.cpu(out.len());
        Ok(())
    }

    /// Host memory: a region at the memory's own address, holding no
    /// bytes until some are presented. dma-buf: [`VerbsError::Unsupported`]
    /// (the emulated NIC has no device memory to reach).
    fn register_user(&self, mem: UserMemory) -> Result<MemoryRegion, VerbsError> {
        let UserMemory::Host { addr, len } = mem else {
            return Err(VerbsError::Unsupported(
                "the emulated NIC cannot reach device memory (dma-buf)".into(),
            ));
        };
        let (handle, lkey, rkey) = self.keys();
        self.inner.regions().insert(
            handle.0,
            Region {
                bytes: Vec::new(),
                rkey,
                addr: addr as u64,
                user: Some(UserRegion { len, presented: 0 }),
            },
        );
        Ok(MemoryRegion {
            handle,
            lkey,
            rkey,
            len,
            addr: addr as u64,
        })
    }

    /// Checks that `bytes` are the region's bytes at `offset` (by their
    /// address), then keeps a copy for the writes posted next (the NIC's
    /// read, not counted as a CPU copy).
    fn present(&self, mr: MrHandle, offset: usize, bytes: &[u8]) -> Result<(), VerbsError> {
        let mut regions = self.inner.regions();
        let region = regions
            .get_mut(&mr.0)
            .ok_or(VerbsError::UnknownRegion(mr))?;
        let user = region.user.as_mut().ok_or(VerbsError::UnknownRegion(mr))?;
        bounds(offset, bytes.len(), user.len)?;
        let at = (region.addr as usize).checked_add(offset);
        if at != Some(bytes.as_ptr() as usize) {
            return Err(VerbsError::OutOfBounds {
                offset,
                len: bytes.len(),
                region_len: user.len,
            });
        }
        user.presented = offset;
        region.bytes.clear();
        region.bytes.extend_from_slice(bytes);
        Ok(())
    }
}

/// One end's queues and state.
#[derive(Debug)]
struct Side {
    dev: Arc<DevInner>,
    state: QpState,
    /// False once this end was dropped.
    alive: bool,
    /// Posted, not yet executed.
    sq: VecDeque<WriteRequest>,
    cq: VecDeque<Completion>,
    /// Posted and send completion not yet polled.
    outstanding: usize,
}

#[derive(Debug)]
struct Shared {
    link: Mutex<[Side; 2]>,
    /// Signalled on every post and on a drop.
    cv: Condvar,
    depth: usize,
    /// Execute on post (see [`EmuFabric::eager`]).
    eager: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, [Side; 2]> {
        self.link.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Executes everything pending, both directions, in posting order.
fn progress(link: &mut [Side; 2]) {
    mark_dead(link);
    for s in 0..2 {
        let peer = 1 - s;
        while let Some(wr) = link[s].sq.pop_front() {
            let done = if link[s].state == QpState::Error {
                Err(WcError::Flushed)
            } else {
                execute(link, s, &wr)
            };
            let from_user = done == Ok(true);
            let status = done.map(drop);
            if let Err(e) = &status {
                link[s].state = QpState::Error;
                // A responder that refuses an access (a bad or stale key,
                // out of bounds) goes to error too, as an RC responder
                // does after its NAK.
                if matches!(e, WcError::RemoteAccess(_)) {
                    link[peer].state = QpState::Error;
                }
            } else {
                let stats = &link[s].dev.stats;
                stats.writes.fetch_add(1, Ordering::Relaxed);
                stats
                    .bytes
                    .fetch_add(wr.local.len as u64, Ordering::Relaxed);
                if wr.imm.is_some() {
                    stats.with_imm.fetch_add(1, Ordering::Relaxed);
                }
                if from_user {
                    stats.user_writes.fetch_add(1, Ordering::Relaxed);
                    stats
                        .user_bytes
                        .fetch_add(wr.local.len as u64, Ordering::Relaxed);
                }
            }
            if let (Ok(()), Some(imm)) = (&status, wr.imm) {
                if link[peer].alive {
                    link[peer].cq.push_back(Completion {
                        wr_id: 0,
                        kind: CompletionKind::RecvWithImm {
                            imm,
                            len: wr.local.len,
                        },
                        status: Ok(()),
                    });
                }
            }
            link[s].cq.push_back(Completion {
                wr_id: wr.wr_id,
                kind: CompletionKind::SendDone,
                status,
            });
        }
    }
}

/// A queue pair with an end on a killed device is in error at both ends.
fn mark_dead(link: &mut [Side; 2]) {
    if link
        .iter()
        .any(|side| side.dev.dead.load(Ordering::Acquire))
    {
        for side in link.iter_mut() {
            side.state = QpState::Error;
        }
    }
}

/// Executes `wr`; on success, whether its bytes came from caller memory.
fn execute(link: &[Side; 2], s: usize, wr: &WriteRequest) -> Result<bool, WcError> {
    let peer = &link[1 - s];
    let (data, user) = link[s]
        .dev
        .read_local(wr.local.mr, wr.local.offset, wr.local.len)
        .map_err(|e| WcError::LocalProtection(e.to_string()))?;
    if !peer.alive || peer.state == QpState::Error || peer.dev.dead.load(Ordering::Acquire) {
        return Err(WcError::RetryExceeded(
            "peer queue pair in error or gone".into(),
        ));
    }
    peer.dev
        .write_remote(wr.remote.rkey, wr.remote.addr, &data)?;
    Ok(user)
}

/// One end of an emulated RC queue pair. Dropping it is the peer dying:
/// the other end goes to [`QpState::Error`].
#[derive(Debug)]
pub struct EmuQp {
    shared: Arc<Shared>,
    me: usize,
}

impl EmuQp {
    fn take(&self, link: &mut [Side; 2], max: usize) -> Vec<Completion> {
        let side = &mut link[self.me];
        let n = max.min(side.cq.len());
        let out: Vec<Completion> = side.cq.drain(..n).collect();
        let sends = out
            .iter()
            .filter(|c| c.kind == CompletionKind::SendDone)
            .count();
        side.outstanding -= sends;
        out
    }
}

impl QueuePair for EmuQp {
    fn post_write(&self, wr: &WriteRequest) -> Result<(), VerbsError> {
        let mut link = self.shared.lock();
        let side = &mut link[self.me];
        if side.outstanding >= self.shared.depth {
            return Err(VerbsError::SendQueueFull {
                depth: self.shared.depth,
            });
        }
        side.outstanding += 1;
        side.sq.push_back(*wr);
        if self.shared.eager {
            progress(&mut link);
        }
        drop(link);
        self.shared.cv.notify_all();
        Ok(())
    }

    fn poll(&self, max: usize) -> Vec<Completion> {
        let mut link = self.shared.lock();
        progress(&mut link);
        self.take(&mut link, max)
    }

    fn wait(&self, max: usize, timeout: Duration) -> Vec<Completion> {
        let deadline = Instant::now() + timeout;
        let mut link = self.shared.lock();
        loop {
            progress(&mut link);
            if !link[self.me].cq.is_empty() || max == 0 {
                return self.take(&mut link, max);
            }
            let now = Instant::now();
            if now >= deadline {
                return Vec::new();
            }
            link = self
                .shared
                .cv
                .wait_timeout(link, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn state(&self) -> QpState {
        let mut link = self.shared.lock();
        mark_dead(&mut link);
        link[self.me].state
    }

    fn outstanding(&self) -> usize {
        self.shared.lock()[self.me].outstanding
    }
}

impl Drop for EmuQp {
    fn drop(&mut self) {
        let mut link = self.shared.lock();
        let me = &mut link[self.me];
        me.alive = false;
        me.state = QpState::Error;
        me.sq.clear();
        me.cq.clear();
        link[1 - self.me].state = QpState::Error;
        drop(link);
        self.shared.cv.notify_all();
    }
}
