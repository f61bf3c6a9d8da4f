//! The device API every device path of ferroccl goes through: the
//! [`Engine`] trait (device buffers, pinned host buffers, streams,
//! asynchronous copies and reduction kernels, events, the gates a caller's
//! stream waits at, and the device executor's kernels) and the handles it
//! deals in ([`DeviceBuf`], [`DevicePtr`], [`PinnedBuf`], [`Stream`],
//! [`Event`], [`Gate`], [`Retired`], [`LEGACY_STREAM`]).
//!
//! Two engines implement it: `crate::cuda_engine::CudaEngine` on a GPU
//! (driver API) and `crate::host_engine::HostEngine`, the host stand-in the
//! tests run every device path on. This file holds no implementation, so
//! that neither engine's needs leak into what the library may ask.

use crate::error::{CudaError, Result};
use crate::executor::{ExecLaunch, Protocol};
use crate::{DataType, ReduceOp};
use std::time::Duration;

/// A device allocation (opaque to the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceBuf(pub u64);

/// A place in device memory: an allocation and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevicePtr {
    /// The allocation.
    pub buf: DeviceBuf,
    /// Bytes from its start.
    pub offset: usize,
}

impl DevicePtr {
    /// The start of `buf`.
    pub const fn new(buf: DeviceBuf) -> Self {
        DevicePtr { buf, offset: 0 }
    }

    /// `bytes` further on.
    pub const fn add(self, bytes: usize) -> Self {
        DevicePtr {
            buf: self.buf,
            offset: self.offset + bytes,
        }
    }

    /// Whether `[self, self + a)` and `[other, other + b)` share a byte.
    pub fn overlaps(self, a: usize, other: DevicePtr, b: usize) -> bool {
        self.buf == other.buf
            && a > 0
            && b > 0
            && self.offset < other.offset + b
            && other.offset < self.offset + a
    }
}

/// A pinned (page-locked) host allocation, which copies to and from the
/// device run asynchronously against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PinnedBuf(pub u64);

/// A stream: work enqueued on it runs in order, asynchronously to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream(pub u64);

/// An event: a point in a stream's work that other streams and the host
/// can wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event(pub u64);

/// A gate: a 32-bit word that streams can wait for and the host raises
/// (`Engine::gate`). A device call makes the caller's stream wait at its
/// gate for the call's number, and the thread that carries the call out
/// raises the gate to that number when the call ends, however it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gate(pub u64);

/// What waits for every stream of the device when it is freed, handed to
/// [`Engine::retire`]: freed at once where no gate is held, else at the
/// first moment none is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retired {
    /// Device memory from [`Engine::alloc_device`] (`cuMemFree`).
    Device(DeviceBuf),
    /// Pinned memory (`cuMemFreeHost`).
    Pinned(PinnedBuf),
    /// A stream (`cuStreamDestroy`).
    Stream(Stream),
}

/// The legacy default stream (CUDA's stream 0, PyTorch's default): its
/// work waits for the work enqueued before on every blocking stream, and
/// blocking streams' work waits for its work enqueued before.
pub const LEGACY_STREAM: Stream = Stream(0);

/// Whether a gate at `word` has reached `value`: a cyclic comparison (as
/// CUDA's `CU_STREAM_WAIT_VALUE_GEQ`), so numbers may wrap around.
pub const fn gate_reached(word: u32, value: u32) -> bool {
    (word.wrapping_sub(value) as i32) >= 0
}

/// What the library needs from a GPU. Every enqueueing method returns at
/// once; the work runs on the stream in the order enqueued. Offsets and
/// lengths count bytes except `count`, which counts elements of `ty`.
///
/// Events follow CUDA's rules: `record` captures the work enqueued on the
/// stream so far; `stream_wait` and `host_wait` wait for the most recent
/// record at the time they are called (an event never recorded counts as
/// complete).
pub trait Engine: Send + Sync {
    /// Allocate `bytes` of device memory.
    fn alloc_device(&self, bytes: usize) -> Result<DeviceBuf>;
    /// Free a device allocation (the caller has waited for its work).
    fn free_device(&self, buf: DeviceBuf);
    /// Allocate `bytes` of pinned host memory.
    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuf>;
    /// Free a pinned allocation (the caller has waited for its work).
    fn free_pinned(&self, buf: PinnedBuf);
    /// Let the host read and write a pinned buffer. Refused (an error, not
    /// a data race) while an enqueued copy that uses it has not finished:
    /// the caller waits for the copy's event first.
    fn with_pinned(&self, buf: PinnedBuf, f: &mut dyn FnMut(&mut [u8])) -> Result<()>;
    /// Create a stream.
    fn stream(&self) -> Result<Stream>;
    /// Destroy a stream once its work is done.
    fn free_stream(&self, stream: Stream);
    /// Create an event.
    fn event(&self) -> Result<Event>;
    /// Destroy an event.
    fn free_event(&self, event: Event);
    /// Enqueue a copy of `bytes` from device `src` to `dst[dst_off..]`.
    fn d2h(
        &self,
        stream: Stream,
        dst: PinnedBuf,
        dst_off: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()>;
    /// Enqueue a copy of `bytes` from `src[src_off..]` to device `dst`.
    fn h2d(
        &self,
        stream: Stream,
        dst: DevicePtr,
        src: PinnedBuf,
        src_off: usize,
        bytes: usize,
    ) -> Result<()>;
    /// Enqueue a device-to-device copy (the regions must not overlap).
    fn d2d(&self, stream: Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    /// Enqueue a write of `value` (1, 2, 4 or 8 bytes: one element) at
    /// device `dst`, from no host buffer (stream-ordered memsets of its
    /// words): a scalar reaches the device without pinned memory, whose
    /// allocation would wait for every stream, a parked one too.
    fn write_scalar(&self, stream: Stream, dst: DevicePtr, value: &[u8]) -> Result<()>;
    /// Enqueue the reduction kernel: `dst[i] = a[i] op b[i]` for `count`
    /// elements of `ty` (`Avg` combines as `Sum`). `dst` may be `a` or `b`
    /// exactly, but must not overlap them otherwise.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        stream: Stream,
        op: ReduceOp,
        ty: DataType,
        dst: DevicePtr,
        a: DevicePtr,
        b: DevicePtr,
        count: usize,
    ) -> Result<()>;
    /// Enqueue Avg's finishing kernel: divide `count` elements at `buf` by
    /// `ranks` in place (integers: truncated toward zero; f16 and bf16:
    /// in f32, rounded once).
    fn avg_finish(
        &self,
        stream: Stream,
        ty: DataType,
        buf: DevicePtr,
        count: usize,
        ranks: usize,
    ) -> Result<()>;
    /// Record `event` on `stream`.
    fn record(&self, event: Event, stream: Stream) -> Result<()>;
    /// Make later work on `stream` wait for `event` (the host does not wait).
    fn stream_wait(&self, stream: Stream, event: Event) -> Result<()>;
    /// Block the host until `event` completes, or return an error once
    /// `timeout` has passed; never waits longer.
    fn host_wait(&self, event: Event, timeout: Duration) -> Result<()>;
    /// A new gate at 0. Gates live as long as the engine (a stream may
    /// still be waiting at one after its owner has gone; a few bytes each).
    fn gate(&self) -> Result<Gate>;
    /// Make later work on `stream` wait until `gate` has reached `value`
    /// (cyclically: [`gate_reached`]); the host does not wait. A wait that
    /// the device cannot make is still bounded: the engine gives up after
    /// `limit` and lets the stream go on.
    fn stream_wait_gate(
        &self,
        stream: Stream,
        gate: Gate,
        value: u32,
        limit: Duration,
    ) -> Result<()>;
    /// Raise `gate` to `value` from the host, unless it has already
    /// reached it (it never goes back); then free what was retired if no
    /// gate is held any more.
    fn raise_gate(&self, gate: Gate, value: u32);

    // The device rule (docs/staging.md): a stream parked at a gate waits
    // for the host thread that raises it, so that thread, and any other,
    // must not make a call that waits for every stream of the device
    // while a gate is held. These make and free memory without one.

    /// Allocate `bytes` of device memory in `stream`'s order
    /// (`cuMemAllocAsync`): usable by work enqueued on `stream` after
    /// this, or on other streams ordered after it. Waits for no stream.
    fn alloc_device_async(&self, stream: Stream, bytes: usize) -> Result<DeviceBuf>;
    /// Free memory from [`Engine::alloc_device_async`] once the work
    /// enqueued on `stream` so far has run (`cuMemFreeAsync`).
    fn free_device_async(&self, stream: Stream, buf: DeviceBuf) -> Result<()>;
    /// Free `what` now if no gate is held, else once none is (at the next
    /// `raise_gate` or `retire` that finds none held; the engine's end).
    fn retire(&self, what: Retired);
    /// Whether a stream waits at a gate that has not reached the value it
    /// waits for (a gate is held).
    fn gates_held(&self) -> bool;
    /// Wait for all the device's work (`cuCtxSynchronize`); `call` names
    /// who asks. Never while a gate is held.
    fn synchronize(&self, call: &'static str) -> Result<()>;
    /// Load the executor kernel for (`protocol`, `op`, `ty`) now (a module
    /// load waits for the device's streams): at set-up, or before a call
    /// parks its stream, never while the call holds a gate.
    fn prepare_executor(
        &self,
        protocol: Protocol,
        op: Option<ReduceOp>,
        ty: DataType,
    ) -> Result<()> {
        let _ = (protocol, op, ty);
        Ok(())
    }

    // The device executor (docs/device-executor.md): engines that cannot
    // run its kernel keep these defaults, and device calls there stay
    // staged.

    /// Whether [`Engine::launch_executor`] runs the executor's kernels.
    fn runs_executor(&self) -> bool {
        false
    }
    /// The address kernels use for `at`.
    fn device_address(&self, at: DevicePtr) -> u64 {
        at.buf.0.wrapping_add(at.offset as u64)
    }
    /// The address, in kernels' address space, of `gate`'s word: the
    /// executor's abort word, which every spin loop reads.
    fn gate_device_address(&self, gate: Gate) -> Result<u64> {
        Err(no_executor(&format!("gate {:#x}", gate.0)))
    }
    /// Enqueue the executor's kernel described by `launch` on `stream`.
    fn launch_executor(&self, stream: Stream, launch: &ExecLaunch) -> Result<()> {
        let _ = (stream, launch);
        Err(no_executor("launch"))
    }
    /// Raise `gate` to `value` in `stream`'s order: once the work enqueued
    /// on `stream` before has ended, with no host thread involved where
    /// the device can write the word itself.
    fn stream_raise_gate(&self, stream: Stream, gate: Gate, value: u32) -> Result<()> {
        let _ = (stream, gate, value);
        Err(no_executor("stream_raise_gate"))
    }
    /// For a stand-in device, the UUID it stands under (what a GPU's
    /// `cuDeviceGetUuid` gives); `None` for a real GPU, which is probed.
    fn stand_in_uuid(&self) -> Option<[u8; 16]> {
        None
    }
    /// Whether the device's streams share hardware queues, in each of
    /// which work starts in the order it was enqueued whatever its stream:
    /// a CUDA context's do (`CUDA_DEVICE_MAX_CONNECTIONS` of them). Where
    /// they do, two ranks of one process on the device are staged: one's
    /// kernel could wait in a queue behind work that waits for the other's
    /// (docs/staging.md, "Why device calls block").
    fn shares_hardware_queues(&self) -> bool {
        false
    }
}

/// The error of an executor method on an engine without the executor.
pub(crate) fn no_executor(what: &str) -> CudaError {
    CudaError::InvalidArgument(format!(
        "{what}: this engine does not run the device executor"
    ))
}
