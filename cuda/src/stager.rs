//! [`Stager`]: the pipeline of one call that carries a collective on
//! device buffers through pinned host memory over any host transport (shm,
//! TCP, in-process): a ring of pinned bounce buffers, each with a slot of
//! device scratch; outgoing chunks copied device-to-host into a bounce
//! buffer and handed to the transport from there, incoming frames received
//! into one and copied host-to-device (and reduced on the device).
//! [`StagePool`] keeps the buffers between calls.
//!
//! It knows nothing of schedules or transports (ferroccl's `exec::staged`
//! walks a schedule over it) and nothing of which engine it runs on: only
//! the [`Engine`] trait. The design, and the rules for reusing buffers, are
//! in docs/staging.md.

use crate::device::{DeviceBuf, DevicePtr, Engine, Event, PinnedBuf, Retired, Stream};
use crate::error::Result;
use crate::{bad, lock, DataType, ReduceOp};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One bounce buffer: pinned host memory the transport reads and writes,
/// and the slot of device scratch a received chunk lands in to be reduced.
struct Bounce {
    host: PinnedBuf,
    scratch: DevicePtr,
    /// Recorded after the last copy that uses `host` (and, for a landed
    /// chunk, `scratch`'s copy in): the host waits for it before it
    /// touches or hands out the buffer again.
    free: Event,
    /// Handed out as an [`Outgoing`] or [`Incoming`] not yet consumed.
    held: bool,
}

/// A chunk being copied device-to-host into a bounce buffer, for sending.
#[derive(Debug)]
#[must_use = "an outgoing chunk holds a bounce buffer until it is sent"]
pub struct Outgoing {
    slot: usize,
    bytes: usize,
}

/// A chunk received into a bounce buffer, to land in device memory.
#[derive(Debug)]
#[must_use = "an incoming chunk holds a bounce buffer until it lands"]
pub struct Incoming {
    slot: usize,
    bytes: usize,
}

/// The shape of a staging pipeline.
#[derive(Debug, Clone, Copy)]
pub struct StageConfig {
    /// Bytes of each bounce buffer: the largest chunk (frame) it carries.
    pub chunk_bytes: usize,
    /// Bounce buffers: chunks in flight at once (at least 2).
    pub depth: usize,
    /// Bound of every host wait.
    pub timeout: Duration,
}

/// What a pipeline allocates: two streams, two events, the device
/// scratch and the bounce buffers with their events. A [`StagePool`]
/// keeps them between calls: pinned allocation takes milliseconds, a
/// call's staging microseconds.
struct Kit {
    inbound: Stream,
    outbound: Stream,
    wrote: Event,
    read: Event,
    scratch: DeviceBuf,
    /// (pinned buffer, its event), `depth` of them.
    bounce: Vec<(PinnedBuf, Event)>,
    /// Bytes of each bounce buffer (and scratch slot).
    chunk: usize,
}

impl Kit {
    fn new(engine: &dyn Engine, chunk: usize, depth: usize) -> Result<Kit> {
        // Built up step by step; what was made is freed if a step fails.
        let mut kit = Kit {
            inbound: engine.stream()?,
            outbound: Stream(0),
            wrote: Event(0),
            read: Event(0),
            scratch: DeviceBuf(0),
            bounce: Vec::with_capacity(depth),
            chunk,
        };
        let made = (|| {
            kit.outbound = engine.stream()?;
            kit.wrote = engine.event()?;
            kit.read = engine.event()?;
            kit.scratch = engine.alloc_device(chunk * depth)?;
            for _ in 0..depth {
                let host = engine.alloc_pinned(chunk)?;
                match engine.event() {
                    Ok(e) => kit.bounce.push((host, e)),
                    Err(e) => {
                        engine.free_pinned(host);
                        return Err(e);
                    }
                }
            }
            Ok(())
        })();
        match made {
            Ok(()) => Ok(kit),
            Err(e) => {
                kit.free(engine);
                Err(e)
            }
        }
    }

    /// Free everything (the work that used it has finished, or the
    /// streams' queues run out first: freeing a stream waits for them).
    /// What waits for every stream is retired: freed once no gate is
    /// held, as a call that fails or a pool that evicts may be under one.
    fn free(self, engine: &dyn Engine) {
        for s in [self.inbound, self.outbound] {
            if s != Stream(0) {
                engine.retire(Retired::Stream(s));
            }
        }
        for (host, e) in self.bounce {
            engine.retire(Retired::Pinned(host));
            engine.free_event(e);
        }
        for e in [self.wrote, self.read] {
            if e != Event(0) {
                engine.free_event(e);
            }
        }
        if self.scratch != DeviceBuf(0) {
            engine.retire(Retired::Device(self.scratch));
        }
    }
}

/// Pipelines kept between calls on one engine ([`Stager::new_in`]): a
/// call takes the smallest kept one whose bounce buffers fit its chunks
/// and gives it back when it ends cleanly (a failed call frees its own).
/// Bounce buffers are sized in powers of two from 64 KiB, so calls of
/// nearby sizes share them; at most [`StagePool::KEEP`] are kept.
pub struct StagePool {
    engine: Arc<dyn Engine>,
    kits: Mutex<Vec<Kit>>,
}

impl StagePool {
    /// Pipelines kept at most.
    pub const KEEP: usize = 4;
    /// The smallest bounce buffer a pooled pipeline gets.
    pub const MIN_CHUNK: usize = 64 << 10;

    /// An empty pool of `engine`'s resources.
    pub fn new(engine: Arc<dyn Engine>) -> Self {
        StagePool {
            engine,
            kits: Mutex::new(Vec::new()),
        }
    }

    /// The engine whose resources are kept.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// Pipelines kept now.
    pub fn kept(&self) -> usize {
        lock(&self.kits).len()
    }

    /// Make sure a pipeline of `depth` bounce buffers of at least `chunk`
    /// bytes is kept: at set-up (before a call parks a stream), so that
    /// calls whose chunks fit allocate nothing (the device rule).
    pub fn warm(&self, chunk: usize, depth: usize) -> Result<()> {
        let fits = lock(&self.kits)
            .iter()
            .any(|k| k.chunk >= chunk && k.bounce.len() == depth);
        if !fits {
            let kit = self.take(chunk, depth)?;
            self.give_back(kit);
        }
        Ok(())
    }

    fn take(&self, chunk: usize, depth: usize) -> Result<Kit> {
        {
            let mut kits = lock(&self.kits);
            let best = kits
                .iter()
                .enumerate()
                .filter(|(_, k)| k.chunk >= chunk && k.bounce.len() == depth)
                .min_by_key(|(_, k)| k.chunk)
                .map(|(i, _)| i);
            if let Some(i) = best {
                return Ok(kits.swap_remove(i));
            }
        }
        let size = chunk.max(Self::MIN_CHUNK).next_power_of_two();
        Kit::new(&*self.engine, size, depth)
    }

    fn give_back(&self, kit: Kit) {
        let mut kits = lock(&self.kits);
        kits.push(kit);
        if kits.len() > Self::KEEP {
            // Keep the largest: they serve every smaller call too.
            kits.sort_by_key(|k| std::cmp::Reverse(k.chunk));
            let spare = kits.pop().expect("more than KEEP");
            drop(kits);
            spare.free(&*self.engine);
        }
    }
}

impl Drop for StagePool {
    fn drop(&mut self) {
        for kit in lock(&self.kits).drain(..) {
            kit.free(&*self.engine);
        }
    }
}

/// The staging pipeline of one call over an [`Engine`] (module docs;
/// docs/staging.md). Two streams: `inbound` runs everything that writes
/// device memory (host-to-device copies, kernels, device copies),
/// `outbound` the device-to-host copies. Events order them: a copy out
/// waits for the writes enqueued before it, a write waits for the copies
/// out enqueued before it, so each stream may run ahead of the other only
/// where nothing depends on it.
pub struct Stager<'e> {
    engine: &'e dyn Engine,
    ty: DataType,
    op: ReduceOp,
    timeout: Duration,
    chunk_bytes: usize,
    inbound: Stream,
    outbound: Stream,
    /// Recorded on `inbound` after each write; `outbound` waits for it.
    wrote: Event,
    /// Recorded on `outbound` after each copy out; `inbound` waits for it.
    read: Event,
    /// Whether a write (copy out) was enqueued since `outbound`
    /// (`inbound`) last waited for `wrote` (`read`).
    unseen_writes: bool,
    unseen_reads: bool,
    scratch: DeviceBuf,
    bounce: Vec<Bounce>,
    /// The next bounce buffer to try.
    next: usize,
    /// Test hook: skip the wait of `outbound` on `inbound`'s writes (the
    /// dependency a test drops to show the stand-in catches it).
    skip_write_wait: bool,
    /// Where the resources go back to when the call ends cleanly.
    pool: Option<&'e StagePool>,
    /// Bytes of each bounce buffer as allocated (at least `chunk_bytes`).
    slot_bytes: usize,
    /// `finish` found every copy and kernel done: the resources may be
    /// reused at once.
    clean: bool,
}

impl<'e> Stager<'e> {
    /// Allocate the pipeline's streams, events, pinned buffers and device
    /// scratch for chunks of `ty`, reduced with `op` (freed at the end).
    pub fn new(
        engine: &'e dyn Engine,
        ty: DataType,
        op: ReduceOp,
        config: StageConfig,
    ) -> Result<Self> {
        Self::build(engine, None, ty, op, config)
    }

    /// As [`Stager::new`], with the resources taken from `pool` (whose
    /// engine this runs on) and given back when the call ends cleanly.
    pub fn new_in(
        pool: &'e StagePool,
        ty: DataType,
        op: ReduceOp,
        config: StageConfig,
    ) -> Result<Self> {
        Self::build(&**pool.engine(), Some(pool), ty, op, config)
    }

    fn build(
        engine: &'e dyn Engine,
        pool: Option<&'e StagePool>,
        ty: DataType,
        op: ReduceOp,
        config: StageConfig,
    ) -> Result<Self> {
        if config.depth < 2 {
            return Err(bad(format!("staging depth {} < 2", config.depth)));
        }
        // A chunk of no bytes still gets a (one-byte) buffer.
        let chunk = config.chunk_bytes.max(1);
        let kit = match pool {
            Some(pool) => pool.take(chunk, config.depth)?,
            None => Kit::new(engine, chunk, config.depth)?,
        };
        let bounce = kit
            .bounce
            .iter()
            .enumerate()
            .map(|(k, &(host, free))| Bounce {
                host,
                scratch: DevicePtr::new(kit.scratch).add(k * kit.chunk),
                free,
                held: false,
            })
            .collect();
        Ok(Stager {
            engine,
            ty,
            op,
            timeout: config.timeout,
            chunk_bytes: config.chunk_bytes,
            inbound: kit.inbound,
            outbound: kit.outbound,
            wrote: kit.wrote,
            read: kit.read,
            unseen_writes: false,
            unseen_reads: false,
            scratch: kit.scratch,
            bounce,
            next: 0,
            skip_write_wait: false,
            pool,
            slot_bytes: kit.chunk,
            clean: false,
        })
    }

    /// The resources, as a kit again.
    fn kit(&self) -> Kit {
        Kit {
            inbound: self.inbound,
            outbound: self.outbound,
            wrote: self.wrote,
            read: self.read,
            scratch: self.scratch,
            bounce: self.bounce.iter().map(|b| (b.host, b.free)).collect(),
            chunk: self.slot_bytes,
        }
    }

    /// Bounce buffers not handed out.
    pub fn available(&self) -> usize {
        self.bounce.iter().filter(|b| !b.held).count()
    }

    /// Drop the wait of copies out on earlier device writes. Only for the
    /// test that proves a missing dependency is caught.
    #[doc(hidden)]
    pub fn drop_write_wait_for_test(&mut self) {
        self.skip_write_wait = true;
    }

    fn check_len(&self, bytes: usize) -> Result<()> {
        if bytes > self.chunk_bytes {
            return Err(bad(format!(
                "a chunk of {bytes} bytes exceeds the {}-byte bounce buffers",
                self.chunk_bytes
            )));
        }
        Ok(())
    }

    /// Hold the next bounce buffer that is not held, once the copies that
    /// used it last have finished.
    fn take(&mut self) -> Result<usize> {
        let n = self.bounce.len();
        let slot = (0..n)
            .map(|i| (self.next + i) % n)
            .find(|&k| !self.bounce[k].held)
            .ok_or_else(|| bad("every bounce buffer is held".into()))?;
        self.next = (slot + 1) % n;
        self.engine
            .host_wait(self.bounce[slot].free, self.timeout)?;
        self.bounce[slot].held = true;
        Ok(slot)
    }

    /// Before a write to device memory: after the copies out enqueued
    /// before it (which may read what it overwrites).
    fn before_write(&mut self) -> Result<()> {
        if self.unseen_reads {
            self.engine.stream_wait(self.inbound, self.read)?;
            self.unseen_reads = false;
        }
        Ok(())
    }

    fn after_write(&mut self) -> Result<()> {
        self.engine.record(self.wrote, self.inbound)?;
        self.unseen_writes = true;
        Ok(())
    }

    /// Start copying `bytes` at `src` into a bounce buffer, after every
    /// device write enqueued so far.
    pub fn stage_out(&mut self, src: DevicePtr, bytes: usize) -> Result<Outgoing> {
        self.check_len(bytes)?;
        let slot = self.take()?;
        if self.unseen_writes && !self.skip_write_wait {
            self.engine.stream_wait(self.outbound, self.wrote)?;
            self.unseen_writes = false;
        }
        let b = &self.bounce[slot];
        self.engine.d2h(self.outbound, b.host, 0, src, bytes)?;
        self.engine.record(b.free, self.outbound)?;
        self.engine.record(self.read, self.outbound)?;
        self.unseen_reads = true;
        Ok(Outgoing { slot, bytes })
    }

    /// Wait until an outgoing chunk is in host memory, hand its bytes to
    /// `send` (the transport), and free its buffer. `send`'s own result
    /// (its error type is the caller's) is returned inside.
    pub fn send<R>(&mut self, out: Outgoing, send: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let b = &mut self.bounce[out.slot];
        b.held = false;
        self.engine.host_wait(b.free, self.timeout)?;
        let mut send = Some(send);
        let mut result = None;
        self.engine.with_pinned(b.host, &mut |host| {
            if let Some(send) = send.take() {
                result = Some(send(&host[..out.bytes]));
            }
        })?;
        Ok(result.expect("with_pinned ran the closure"))
    }

    /// Receive a chunk of `bytes` into a free bounce buffer: `recv` (the
    /// transport) fills the slice it is given. Its result is returned with
    /// the chunk; on its error the chunk should be dropped with
    /// [`Stager::discard`].
    pub fn receive<R>(
        &mut self,
        bytes: usize,
        recv: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<(Incoming, R)> {
        self.check_len(bytes)?;
        let slot = self.take()?;
        let mut recv = Some(recv);
        let mut result = None;
        let host = self.bounce[slot].host;
        let access = self.engine.with_pinned(host, &mut |host| {
            if let Some(recv) = recv.take() {
                result = Some(recv(&mut host[..bytes]));
            }
        });
        if let Err(e) = access {
            self.bounce[slot].held = false;
            return Err(e);
        }
        let result = result.expect("with_pinned ran the closure");
        Ok((Incoming { slot, bytes }, result))
    }

    /// Hand a received chunk's bytes to `send` as they arrived (a chunk
    /// forwarded unchanged); the chunk stays held, to land.
    pub fn forward<R>(&mut self, chunk: &Incoming, send: impl FnOnce(&[u8]) -> R) -> Result<R> {
        let mut send = Some(send);
        let mut result = None;
        self.engine
            .with_pinned(self.bounce[chunk.slot].host, &mut |host| {
                if let Some(send) = send.take() {
                    result = Some(send(&host[..chunk.bytes]));
                }
            })?;
        Ok(result.expect("with_pinned ran the closure"))
    }

    /// Give back a received chunk that will not land.
    pub fn discard(&mut self, chunk: Incoming) {
        self.bounce[chunk.slot].held = false;
    }

    /// Copy a received chunk to `dst` on the device (asynchronously).
    pub fn land(&mut self, chunk: Incoming, dst: DevicePtr) -> Result<()> {
        self.before_write()?;
        let b = &mut self.bounce[chunk.slot];
        b.held = false;
        self.engine.h2d(self.inbound, dst, b.host, 0, chunk.bytes)?;
        self.engine.record(b.free, self.inbound)?;
        self.after_write()
    }

    /// Land a received chunk in device scratch and reduce it with `local`
    /// into `dst` (`dst = chunk op local`; `dst` may be `local`). With
    /// `dst` `None` the result stays in the scratch slot, whose place is
    /// returned: valid until the next chunk lands there (the caller stages
    /// it out at once).
    pub fn land_reduce(
        &mut self,
        chunk: Incoming,
        local: DevicePtr,
        dst: Option<DevicePtr>,
    ) -> Result<DevicePtr> {
        let count = chunk.bytes / self.ty.size();
        self.before_write()?;
        let b = &mut self.bounce[chunk.slot];
        b.held = false;
        let scratch = b.scratch;
        self.engine
            .h2d(self.inbound, scratch, b.host, 0, chunk.bytes)?;
        self.engine.record(b.free, self.inbound)?;
        let dst = dst.unwrap_or(scratch);
        self.engine
            .reduce(self.inbound, self.op, self.ty, dst, scratch, local, count)?;
        self.after_write()?;
        Ok(dst)
    }

    /// Copy `bytes` from `src` to `dst` on the device.
    pub fn copy(&mut self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        self.before_write()?;
        self.engine.d2d(self.inbound, dst, src, bytes)?;
        self.after_write()
    }

    /// `dst = a op b` over `count` elements on the device.
    pub fn reduce(
        &mut self,
        dst: DevicePtr,
        a: DevicePtr,
        b: DevicePtr,
        count: usize,
    ) -> Result<()> {
        self.before_write()?;
        self.engine
            .reduce(self.inbound, self.op, self.ty, dst, a, b, count)?;
        self.after_write()
    }

    /// Avg's end: divide `count` elements at `buf` by `ranks`.
    pub fn avg_finish(&mut self, buf: DevicePtr, count: usize, ranks: usize) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        self.before_write()?;
        self.engine
            .avg_finish(self.inbound, self.ty, buf, count, ranks)?;
        self.after_write()
    }

    /// Wait until every enqueued copy and kernel has finished (the call's
    /// results are in device memory).
    pub fn finish(&mut self) -> Result<()> {
        self.engine.host_wait(self.wrote, self.timeout)?;
        self.engine.host_wait(self.read, self.timeout)?;
        for b in &self.bounce {
            self.engine.host_wait(b.free, self.timeout)?;
        }
        // Everything enqueued has run: nothing is held by a stream (a
        // chunk still handed out would be the caller's bug: not reused).
        self.clean = self.bounce.iter().all(|b| !b.held);
        Ok(())
    }
}

impl Drop for Stager<'_> {
    fn drop(&mut self) {
        let kit = self.kit();
        match self.pool {
            Some(pool) if self.clean => pool.give_back(kit),
            // Whatever is still queued finishes before anything is freed
            // (a failed call gets here without `finish`); freeing a
            // stream waits for its queue.
            _ => kit.free(self.engine),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host_engine::HostEngine;

    const T: Duration = Duration::from_secs(10);

    fn u32s(bytes: &[u8]) -> Vec<u32> {
        bytes
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn bytes(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    /// Chunks of a device buffer go out through bounce buffers, come back
    /// in, and are reduced on the "device" into another: the pipeline's
    /// round trip, with random delays on the streams and more chunks than
    /// bounce buffers.
    #[test]
    fn round_trip_through_bounce_buffers() {
        for seed in 0..4 {
            let engine = HostEngine::with_delays(Duration::from_micros(300), seed);
            let n = 1000usize;
            let chunk = 64usize;
            let src = engine.alloc_device(n * 4).unwrap();
            let dst = engine.alloc_device(n * 4).unwrap();
            let a: Vec<u32> = (0..n as u32).collect();
            let b: Vec<u32> = (0..n as u32).map(|i| i * 7 + 1).collect();
            engine
                .write_device(DevicePtr::new(src), &bytes(&a))
                .unwrap();
            engine
                .write_device(DevicePtr::new(dst), &bytes(&b))
                .unwrap();
            let config = StageConfig {
                chunk_bytes: chunk * 4,
                depth: 3,
                timeout: T,
            };
            let mut stager = Stager::new(&engine, DataType::U32, ReduceOp::Sum, config).unwrap();
            for off in (0..n).step_by(chunk) {
                let len = chunk.min(n - off) * 4;
                let at = off * 4;
                let out = stager.stage_out(DevicePtr::new(src).add(at), len).unwrap();
                let mut wire = Vec::new();
                stager.send(out, |h| wire.extend_from_slice(h)).unwrap();
                let (chunk, ()) = stager.receive(len, |h| h.copy_from_slice(&wire)).unwrap();
                let d = DevicePtr::new(dst).add(at);
                stager.land_reduce(chunk, d, Some(d)).unwrap();
            }
            stager.finish().unwrap();
            let got = u32s(&engine.read_device(DevicePtr::new(dst), n * 4).unwrap());
            let want: Vec<u32> = (0..n).map(|i| a[i] + b[i]).collect();
            assert_eq!(got, want, "seed {seed}");
        }
    }
}
