//! Collectives on CUDA device memory, with NCCL's stream semantics.
//!
//! ```no_run
//! use ferroccl::cuda::cudarc::driver::CudaContext;
//! use ferroccl::{Communicator, ReduceOp};
//! let comm = Communicator::from_env()?;
//! ferroccl::cuda::device_count()?;                 // NoDevice(reason) without CUDA
//! let ctx = CudaContext::new(0).expect("device 0");
//! let stream = ctx.new_stream().expect("a stream");
//! let mut grads = stream.alloc_zeros::<f32>(1 << 20).expect("memory");
//! // Enqueued on `stream`; returns at once. Later work on the stream
//! // (kernels, copies) sees the sum.
//! comm.on_stream(&stream).all_reduce_in_place(&mut grads, ReduceOp::Sum)?;
//! # Ok::<(), ferroccl::Error>(())
//! ```
//!
//! - A call enqueues and returns: it takes its place in the
//!   communicator's order (the same order as host calls), the caller's
//!   stream waits for it, and the communicator's progress thread carries it
//!   out. The returned [`DeviceWork`] lets a host thread wait; dropping it
//!   is fine (a failure also ends the communicator: [`async_error`] and
//!   every later call report it).
//! - The call sees the stream's earlier work (and, through cudarc's event
//!   tracking, earlier writes of the buffers on other streams); work
//!   enqueued on the stream after it sees its result, without a host wait.
//! - Buffers are cudarc's [`CudaSlice`] and views; the stream must belong
//!   to the device's primary context ([`CudaContext::new`]), where every
//!   device call runs. Foreign callers (the NCCL ABI) use the `*_raw`
//!   methods: device pointers and a `CUstream`, checked with the driver
//!   before anything is enqueued.
//! - Data moves through pinned host memory over any host transport (shm,
//!   TCP), with the reductions done by ferroccl's CUDA kernels
//!   (docs/staging.md); every collective but send/recv and all-to-all.
//! - Without CUDA (no driver library, an old driver, no device,
//!   `FERROCCL_CUDA=0`) every device call returns [`Error::NoDevice`] with
//!   the reason before it is issued; host calls never touch CUDA.
//!
//! [`async_error`]: Communicator::async_error
//! [`CudaSlice`]: cudarc::driver::CudaSlice
//! [`CudaContext::new`]: cudarc::driver::CudaContext::new

use crate::coll::{CollCall, CollKind};
use crate::comm::device::OnDevice;
use crate::element::{DataType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::Communicator;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice};
use ferroccl_cuda::engine::{self, CudaEngine};
use ferroccl_cuda::staging::{self, DeviceBuf, Engine, Stream};
use ferroccl_cuda::CudaError;
use std::ffi::c_void;
use std::sync::Arc;

pub use crate::comm::DeviceWork;
/// The cudarc this build uses (0.19, driver API, loaded at run time): make
/// contexts, streams and buffers with it so that the types match.
pub use ferroccl_cuda::cudarc;

/// The number of CUDA devices, or [`Error::NoDevice`] with the reason.
/// Never panics: call it before any cudarc function, which panics where
/// the driver library is missing.
pub fn device_count() -> Result<usize> {
    ferroccl_cuda::probe::driver()
        .map(|d| d.devices)
        .map_err(from_cuda)
}

/// The library's error for an error of the CUDA glue.
pub(crate) fn from_cuda(e: CudaError) -> Error {
    match e {
        CudaError::NoDevice(why) => Error::NoDevice(why),
        CudaError::InvalidArgument(why) => Error::InvalidArgument(why),
        other => Error::Io(other.to_string()),
    }
}

/// A call's description: as the host methods of the same name build it.
fn coll_call(
    kind: CollKind,
    count: usize,
    send_len: usize,
    recv_len: usize,
    op: Option<ReduceOp>,
    root: Option<usize>,
    in_place: bool,
) -> CollCall {
    CollCall {
        op,
        root,
        in_place,
        ..CollCall::new(kind, count, send_len, recv_len)
    }
}

/// Device calls on one stream: [`Communicator::on_stream`].
#[derive(Clone, Copy)]
pub struct OnStream<'a> {
    comm: &'a Communicator,
    stream: &'a Arc<CudaStream>,
}

impl std::fmt::Debug for OnStream<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnStream")
            .field("comm", self.comm)
            .field("device", &self.stream.context().ordinal())
            .finish()
    }
}

impl Communicator {
    /// Collectives on device buffers, enqueued on `stream` (module docs of
    /// [`crate::cuda`]).
    pub fn on_stream<'a>(&'a self, stream: &'a Arc<CudaStream>) -> OnStream<'a> {
        OnStream { comm: self, stream }
    }
}

impl OnStream<'_> {
    /// The engine of the stream's device, once the stream is known to be
    /// in its primary context and the buffers on its device.
    fn engine(&self, bufs: &[&Arc<CudaStream>]) -> Result<Arc<CudaEngine>> {
        let ctx = self.stream.context();
        let ordinal = ctx.ordinal();
        if !ctx.is_primary() {
            return Err(Error::InvalidArgument(format!(
                "the stream belongs to a context of device {ordinal} that is not its primary \
                 context: ferroccl runs device calls in the primary context \
                 (CudaContext::new)"
            )));
        }
        if let Some(other) = bufs.iter().find(|b| b.context().ordinal() != ordinal) {
            return Err(Error::InvalidArgument(format!(
                "a buffer on device {} given with a stream of device {ordinal}",
                other.context().ordinal()
            )));
        }
        CudaEngine::shared(ordinal).map_err(from_cuda)
    }

    /// Run `call` on `send` and `recv` (in place: `recv` only).
    fn run<T: Element>(
        &self,
        call: CollCall,
        send: Option<&dyn DevicePtrDyn<T>>,
        recv: &mut dyn DevicePtrMutDyn<T>,
    ) -> Result<DeviceWork> {
        let mut streams = vec![recv.slice_stream()];
        streams.extend(send.map(|s| s.slice_stream()));
        let engine = self.engine(&streams)?;
        let stream = &**self.stream;
        // The stream waits for the buffers' earlier writes (and reads, for
        // the one written); the guards, dropped after the call is
        // enqueued, record the call as their latest use.
        let (recv_ptr, _recv_use) = recv.ptr_mut(stream);
        let send_use = send.map(|s| s.ptr(stream));
        let send_ptr = send_use.as_ref().map_or(recv_ptr, |(p, _)| *p);
        let on = OnDevice {
            ordinal: engine.ordinal() as u32,
            engine,
            stream: Stream(stream.cu_stream() as u64),
            send: staging::DevicePtr::new(DeviceBuf(send_ptr)),
            recv: staging::DevicePtr::new(DeviceBuf(recv_ptr)),
        };
        self.comm.device_collective::<T>(&call, &on)
    }

    /// Out-of-place allreduce: `recv[i] = op over ranks of send[i]`.
    pub fn all_reduce<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork> {
        let (n, m) = (send.len(), recv.len());
        let call = coll_call(CollKind::AllReduce, n, n, m, Some(op), None, false);
        self.run(call, Some(send), recv)
    }

    /// In-place allreduce.
    pub fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork> {
        let n = buf.len();
        let call = coll_call(CollKind::AllReduce, n, n, n, Some(op), None, true);
        self.run(call, None, buf)
    }

    /// Reduce-scatter: `send.len() == recv.len() * size`; rank r's `recv`
    /// gets the reduction of block r of every rank's `send`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork> {
        let (n, m) = (send.len(), recv.len());
        let call = coll_call(CollKind::ReduceScatter, m, n, m, Some(op), None, false);
        self.run(call, Some(send), recv)
    }

    /// In-place reduce-scatter on `count * size` elements: block `rank`
    /// of `buf` gets this rank's result.
    pub fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork> {
        let n = buf.len();
        let count = n / self.comm.size();
        let call = coll_call(CollKind::ReduceScatter, count, n, n, Some(op), None, true);
        self.run(call, None, buf)
    }

    /// Allgather: `recv.len() == send.len() * size`, block r from rank r.
    pub fn all_gather<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<DeviceWork> {
        let (n, m) = (send.len(), recv.len());
        let call = coll_call(CollKind::AllGather, n, n, m, None, None, false);
        self.run(call, Some(send), recv)
    }

    /// In-place allgather on `count * size` elements whose block `rank`
    /// holds this rank's input.
    pub fn all_gather_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
    ) -> Result<DeviceWork> {
        let n = buf.len();
        let count = n / self.comm.size();
        let call = coll_call(CollKind::AllGather, count, n, n, None, None, true);
        self.run(call, None, buf)
    }

    /// Broadcast `buf` from `root` to every rank.
    pub fn broadcast<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<DeviceWork> {
        let n = buf.len();
        let call = coll_call(CollKind::Broadcast, n, n, n, None, Some(root), true);
        self.run(call, None, buf)
    }

    /// Reduce to `root`: its `recv` gets the reduction; other ranks'
    /// `recv` is left as it was.
    pub fn reduce<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<DeviceWork> {
        let (n, m) = (send.len(), recv.len());
        let call = coll_call(CollKind::Reduce, n, n, m, Some(op), Some(root), false);
        self.run(call, Some(send), recv)
    }

    /// In-place reduce: `root`'s `buf` gets the reduction; other ranks'
    /// `buf` may be used as scratch (as NCCL's).
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<DeviceWork> {
        let n = buf.len();
        let call = coll_call(CollKind::Reduce, n, n, n, Some(op), Some(root), true);
        self.run(call, None, buf)
    }
}

/// cudarc's `DevicePtr` as an object (its method is generic over nothing
/// but borrows; this keeps `run` one function for every verb).
trait DevicePtrDyn<T> {
    fn slice_stream(&self) -> &Arc<CudaStream>;
    fn ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, cudarc::driver::SyncOnDrop<'a>);
}

impl<T, S: DevicePtr<T>> DevicePtrDyn<T> for S {
    fn slice_stream(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(self)
    }
    fn ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, cudarc::driver::SyncOnDrop<'a>) {
        self.device_ptr(stream)
    }
}

/// cudarc's `DevicePtrMut` as an object.
trait DevicePtrMutDyn<T> {
    fn slice_stream(&self) -> &Arc<CudaStream>;
    fn ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, cudarc::driver::SyncOnDrop<'a>);
}

impl<T, S: DevicePtrMut<T>> DevicePtrMutDyn<T> for S {
    fn slice_stream(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(self)
    }
    fn ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, cudarc::driver::SyncOnDrop<'a>) {
        self.device_ptr_mut(stream)
    }
}

// ---------------------------------------------------------------------------
// The raw entry points, for foreign callers.

/// Run `f::<T>()` for the element type of `dtype`.
macro_rules! with_element {
    ($dtype:expr, $f:ident, $($arg:expr),*) => {
        match $dtype {
            DataType::F32 => $f::<f32>($($arg),*),
            DataType::F64 => $f::<f64>($($arg),*),
            DataType::F16 => $f::<half::f16>($($arg),*),
            DataType::Bf16 => $f::<half::bf16>($($arg),*),
            DataType::I8 => $f::<i8>($($arg),*),
            DataType::U8 => $f::<u8>($($arg),*),
            DataType::I32 => $f::<i32>($($arg),*),
            DataType::U32 => $f::<u32>($($arg),*),
            DataType::I64 => $f::<i64>($($arg),*),
            DataType::U64 => $f::<u64>($($arg),*),
        }
    };
}

/// A raw call as NCCL describes it: counts in NCCL's meaning.
#[derive(Clone, Copy)]
struct Raw {
    kind: CollKind,
    send: u64,
    recv: u64,
    /// allreduce, broadcast, reduce: the count; reduce-scatter: the
    /// receive count; allgather: the send count.
    count: usize,
    dtype: DataType,
    op: Option<ReduceOp>,
    root: Option<usize>,
    stream: u64,
}

fn run_raw<T: Element>(comm: &Communicator, raw: Raw) -> Result<DeviceWork> {
    let elem = std::mem::size_of::<T>();
    let size = comm.size();
    let rank = comm.rank();
    let (kind, count) = (raw.kind, raw.count);
    // Lengths in elements of the send and receive buffers, and where, in
    // NCCL's convention, an in-place call's send buffer lies in the
    // receive buffer (or the receive buffer in the send buffer).
    let (send_len, recv_len) = match kind {
        CollKind::ReduceScatter => (count * size, count),
        CollKind::AllGather => (count, count * size),
        _ => (count, count),
    };
    let in_place = match kind {
        CollKind::ReduceScatter => raw.send + (rank * count * elem) as u64 == raw.recv,
        CollKind::AllGather => raw.recv + (rank * count * elem) as u64 == raw.send,
        _ => raw.send == raw.recv,
    };
    // Check both buffers with the driver: device memory of one device,
    // the extents inside their allocations, no overlap but in place.
    let bytes = |len: usize| len * elem;
    let send_info = engine::pointer_info(raw.send).map_err(|e| named("send", e))?;
    let recv_info = engine::pointer_info(raw.recv).map_err(|e| named("recv", e))?;
    for (what, ptr, info, len) in [
        ("send", raw.send, send_info, send_len),
        ("recv", raw.recv, recv_info, recv_len),
    ] {
        if !info.holds(ptr, bytes(len)) {
            return Err(Error::InvalidArgument(format!(
                "{what} buffer {ptr:#x}: {len} elements of {} run past its allocation \
                 ({} bytes from {:#x})",
                raw.dtype, info.size, info.start
            )));
        }
    }
    if send_info.ordinal != recv_info.ordinal {
        return Err(Error::InvalidArgument(format!(
            "send buffer on device {}, recv buffer on device {}",
            send_info.ordinal, recv_info.ordinal
        )));
    }
    let overlap = raw.send < raw.recv + bytes(recv_len) as u64
        && raw.recv < raw.send + bytes(send_len) as u64;
    if overlap && !in_place {
        return Err(Error::InvalidArgument(format!(
            "send buffer {:#x} and recv buffer {:#x} overlap without being in place",
            raw.send, raw.recv
        )));
    }
    let engine = CudaEngine::shared(send_info.ordinal).map_err(from_cuda)?;
    if !engine.owns_stream(raw.stream).map_err(from_cuda)? {
        return Err(Error::InvalidArgument(format!(
            "stream {:#x} is not of device {}'s primary context, where ferroccl runs device \
             calls",
            raw.stream, send_info.ordinal
        )));
    }
    let stream = Stream(raw.stream);
    // In place, ferroccl's convention names the whole buffer: the receive
    // buffer of an allgather and the send buffer of a reduce-scatter.
    let whole = if kind == CollKind::AllGather {
        raw.recv
    } else {
        raw.send
    };
    let mut send = staging::DevicePtr::new(DeviceBuf(if in_place { whole } else { raw.send }));
    let recv = staging::DevicePtr::new(DeviceBuf(if in_place { whole } else { raw.recv }));
    let mut call = if in_place {
        let n = send_len.max(recv_len);
        coll_call(kind, count, n, n, raw.op, raw.root, true)
    } else {
        coll_call(kind, count, send_len, recv_len, raw.op, raw.root, false)
    };
    // NCCL's broadcast may be out of place: the root copies its send
    // buffer to its receive buffer first, on the stream, and every rank
    // broadcasts in place in its receive buffer.
    if kind == CollKind::Broadcast && !in_place {
        if raw.root == Some(rank) {
            engine
                .d2d(stream, recv, send, bytes(count))
                .map_err(from_cuda)?;
        }
        send = recv;
        call.in_place = true;
    }
    let on = OnDevice {
        ordinal: send_info.ordinal as u32,
        engine,
        stream,
        send,
        recv,
    };
    comm.device_collective::<T>(&call, &on)
}

fn named(what: &str, e: CudaError) -> Error {
    match e {
        CudaError::InvalidArgument(why) => Error::InvalidArgument(format!("{what} buffer: {why}")),
        other => from_cuda(other),
    }
}

/// The raw entry points: device pointers, counts and a `CUstream` as
/// NCCL's C API takes them (in place where NCCL says so: `send == recv`;
/// a reduce-scatter's `recv` at block `rank` of `send`; an allgather's
/// `send` at block `rank` of `recv`). Each is checked with the driver
/// (device memory of one device, the extents inside their allocations,
/// the stream in that device's primary context) before it is issued.
///
/// # Safety
///
/// For every raw method: the pointers must stay allocated, and no other
/// work may write them (or, for `recv`, read them) except in the stream's
/// order, until the call has completed on `stream`; `stream` must be a
/// live `CUstream` (or null, the legacy default stream) until then. The
/// driver's checks catch pointers that are not device memory or too
/// short, not memory freed and reused.
impl Communicator {
    /// `ncclAllReduce`: `count` elements of `dtype`.
    ///
    /// # Safety
    /// See the safety section of the raw entry points above.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        self.raw(
            CollKind::AllReduce,
            send,
            recv,
            count,
            dtype,
            Some(op),
            None,
            stream,
        )
    }

    /// `ncclReduceScatter`: `recv_count` elements of `dtype` per rank.
    ///
    /// # Safety
    /// See [`Communicator::all_reduce_raw`].
    pub unsafe fn reduce_scatter_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        recv_count: usize,
        dtype: DataType,
        op: ReduceOp,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        self.raw(
            CollKind::ReduceScatter,
            send,
            recv,
            recv_count,
            dtype,
            Some(op),
            None,
            stream,
        )
    }

    /// `ncclAllGather`: `send_count` elements of `dtype` from each rank.
    ///
    /// # Safety
    /// See [`Communicator::all_reduce_raw`].
    pub unsafe fn all_gather_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        send_count: usize,
        dtype: DataType,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        self.raw(
            CollKind::AllGather,
            send,
            recv,
            send_count,
            dtype,
            None,
            None,
            stream,
        )
    }

    /// `ncclBroadcast`: `count` elements from `root`'s `send` to every
    /// rank's `recv` (`send` is read on the root only).
    ///
    /// # Safety
    /// See [`Communicator::all_reduce_raw`].
    pub unsafe fn broadcast_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        self.raw(
            CollKind::Broadcast,
            send,
            recv,
            count,
            dtype,
            None,
            Some(root),
            stream,
        )
    }

    /// `ncclReduce`: `root`'s `recv` gets the reduction of `count`
    /// elements.
    ///
    /// # Safety
    /// See [`Communicator::all_reduce_raw`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        self.raw(
            CollKind::Reduce,
            send,
            recv,
            count,
            dtype,
            Some(op),
            Some(root),
            stream,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn raw(
        &self,
        kind: CollKind,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DataType,
        op: Option<ReduceOp>,
        root: Option<usize>,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        let raw = Raw {
            kind,
            send: send as u64,
            recv: recv as u64,
            count,
            dtype,
            op,
            root,
            stream: stream as u64,
        };
        with_element!(dtype, run_raw, self, raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::run_ranks_with;

    /// Without a usable driver (this machine and CI), every raw entry
    /// point returns `NoDevice` with the reason, never panics, and issues
    /// nothing: a host call afterwards runs as the first call on every
    /// rank. With a device (the GPU run), the same bogus pointers are
    /// refused as not device memory.
    #[test]
    fn raw_device_calls_without_a_driver_are_no_device() {
        let probe = device_count();
        run_ranks_with(
            2,
            |c| c.transport = Some("mem".into()),
            move |comm| {
                let host = [1.0f32; 8];
                let mut out = [0.0f32; 8];
                let (s, r) = (host.as_ptr().cast(), out.as_mut_ptr().cast());
                let null = std::ptr::null_mut();
                // SAFETY: every call is refused before it touches memory:
                // without a driver by the probe, with one by the pointer
                // check (host memory is not device memory).
                let results = unsafe {
                    [
                        comm.all_reduce_raw(s, r, 8, DataType::F32, ReduceOp::Sum, null),
                        comm.reduce_scatter_raw(s, r, 4, DataType::F32, ReduceOp::Sum, null),
                        comm.all_gather_raw(s, r, 4, DataType::F32, null),
                        comm.broadcast_raw(s, r, 8, DataType::F32, 0, null),
                        comm.reduce_raw(s, r, 8, DataType::F32, ReduceOp::Max, 1, null),
                    ]
                };
                for result in results {
                    match (&probe, result) {
                        (Err(Error::NoDevice(why)), Err(Error::NoDevice(got))) => {
                            assert_eq!(&got, why)
                        }
                        (Ok(_), Err(Error::InvalidArgument(why))) => {
                            assert!(why.contains("not CUDA device memory"), "{why}")
                        }
                        (probe, other) => panic!("probe {probe:?}, call gave {other:?}"),
                    }
                }
                // Nothing was issued: the first host call matches on
                // every rank.
                let mut buf = [comm.rank() as f32 + 1.0; 3];
                comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                assert_eq!(buf, [3.0; 3]);
            },
        );
    }
}
