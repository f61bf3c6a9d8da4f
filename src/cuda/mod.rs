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
//! - Data moves GPU to GPU by the device executor (one kernel per rank,
//!   docs/device-executor.md) where every pair of ranks has a GPU path
//!   (ranks of one process, or GPUs of one host that reach each other,
//!   their FIFOs mapped with cuda-ipc); else, and for send/recv always,
//!   through pinned host memory over any host transport (shm, TCP), with
//!   the reductions done by ferroccl's CUDA kernels (docs/staging.md).
//!   Every verb of the host API but barrier (which moves no data: call it
//!   on the host).
//! - Without CUDA (no driver library, an old driver, no device,
//!   `FERROCCL_CUDA=0`) every device call returns [`Error::NoDevice`] with
//!   the reason before it is issued; host calls never touch CUDA.
//!
//! This file is the safe API ([`OnStream`] on cudarc's typed slices); the
//! raw entry points for foreign callers (device pointers, `unsafe`) are in
//! `raw.rs`, with the same public paths (`ferroccl::cuda::RawOp`).
//!
//! [`async_error`]: Communicator::async_error
//! [`CudaSlice`]: cudarc::driver::CudaSlice
//! [`CudaContext::new`]: cudarc::driver::CudaContext::new

use crate::coll::{CollCall, CollKind};
use crate::comm::device::OnDevice;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::Communicator;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice};
use ferroccl_cuda::cuda_engine::CudaEngine;
use ferroccl_cuda::device::{self, DeviceBuf, Stream};
use std::sync::Arc;

mod raw;

pub use crate::comm::DeviceWork;
/// The cudarc this build uses (0.19, driver API, loaded at run time): make
/// contexts, streams and buffers with it so that the types match.
pub use ferroccl_cuda::cudarc;
pub use raw::{PreMulScalar, RawOp};

/// The number of CUDA devices, or [`Error::NoDevice`] with the reason.
/// Never panics: call it before any cudarc function, which panics where
/// the driver library is missing.
pub fn device_count() -> Result<usize> {
    ferroccl_cuda::probe::driver()
        .map(|d| d.devices)
        .map_err(from_cuda)
}

pub(crate) use crate::error::from_cuda;

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

    /// Run `call` on `send` and `recv` (in place: `recv` only; a send:
    /// `send` only, which then stands for both, read only).
    fn run<T: Element>(
        &self,
        call: CollCall,
        send: Option<&dyn DevicePtrDyn<T>>,
        recv: Option<&mut dyn DevicePtrMutDyn<T>>,
    ) -> Result<DeviceWork> {
        let streams: Vec<&Arc<CudaStream>> = send
            .map(|s| s.slice_stream())
            .into_iter()
            .chain(recv.as_ref().map(|r| r.slice_stream()))
            .collect();
        let engine = self.engine(&streams)?;
        let stream = &**self.stream;
        // The stream waits for the buffers' earlier writes (and reads, for
        // the one written); the guards, dropped after the call is
        // enqueued, record the call as their latest use.
        let recv_use = recv.map(|r| r.ptr_mut(stream));
        let send_use = send.map(|s| s.ptr(stream));
        let ptr = |u: &Option<(u64, cudarc::driver::SyncOnDrop<'_>)>| u.as_ref().map(|(p, _)| *p);
        let (send_ptr, recv_ptr) = match (ptr(&send_use), ptr(&recv_use)) {
            (Some(s), Some(r)) => (s, r),
            (Some(one), None) | (None, Some(one)) => (one, one),
            (None, None) => {
                return Err(Error::InvalidArgument(
                    "a device call without a buffer".into(),
                ))
            }
        };
        let on = OnDevice {
            ordinal: engine.ordinal() as u32,
            engine,
            stream: Stream(stream.cu_stream() as u64),
            send: device::DevicePtr::new(DeviceBuf(send_ptr)),
            recv: device::DevicePtr::new(DeviceBuf(recv_ptr)),
        };
        self.comm.device_collective::<T>(&call, &on)
    }

    /// Run the collective `verb` on `send` and `recv` (in place: `send`
    /// is `None` and `recv` is the one buffer), described as the host
    /// method of the same name describes it.
    fn coll<T: Element>(
        &self,
        verb: Verb,
        send: Option<&dyn DevicePtrDyn<T>>,
        recv: &mut dyn DevicePtrMutDyn<T>,
    ) -> Result<DeviceWork> {
        let Verb(kind, count, op, root) = verb;
        let m = recv.elems();
        let n = send.map_or(m, |s| s.elems());
        let count = match count {
            Count::Send => n,
            Count::Recv => m,
            Count::Block => n / self.comm.size(),
        };
        let call = coll_call(kind, count, n, m, op, root, send.is_none());
        self.run(call, send, Some(recv))
    }

    /// Out-of-place allreduce: `recv[i] = op over ranks of send[i]`.
    pub fn all_reduce<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork> {
        let verb = Verb(CollKind::AllReduce, Count::Send, Some(op), None);
        self.coll(verb, Some(send), recv)
    }

    /// In-place allreduce.
    pub fn all_reduce_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork> {
        let verb = Verb(CollKind::AllReduce, Count::Send, Some(op), None);
        self.coll(verb, None, buf)
    }

    /// Reduce-scatter: `send.len() == recv.len() * size`; rank r's `recv`
    /// gets the reduction of block r of every rank's `send`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork> {
        let verb = Verb(CollKind::ReduceScatter, Count::Recv, Some(op), None);
        self.coll(verb, Some(send), recv)
    }

    /// In-place reduce-scatter on `count * size` elements: block `rank`
    /// of `buf` gets this rank's result.
    pub fn reduce_scatter_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
    ) -> Result<DeviceWork> {
        let verb = Verb(CollKind::ReduceScatter, Count::Block, Some(op), None);
        self.coll(verb, None, buf)
    }

    /// Allgather: `recv.len() == send.len() * size`, block r from rank r.
    pub fn all_gather<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<DeviceWork> {
        let verb = Verb(CollKind::AllGather, Count::Send, None, None);
        self.coll(verb, Some(send), recv)
    }

    /// In-place allgather on `count * size` elements whose block `rank`
    /// holds this rank's input.
    pub fn all_gather_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
    ) -> Result<DeviceWork> {
        let verb = Verb(CollKind::AllGather, Count::Block, None, None);
        self.coll(verb, None, buf)
    }

    /// Broadcast `buf` from `root` to every rank.
    pub fn broadcast<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        root: usize,
    ) -> Result<DeviceWork> {
        let verb = Verb(CollKind::Broadcast, Count::Send, None, Some(root));
        self.coll(verb, None, buf)
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
        let verb = Verb(CollKind::Reduce, Count::Send, Some(op), Some(root));
        self.coll(verb, Some(send), recv)
    }

    /// All-to-all: `send` and `recv` hold `size` blocks; block j of `send`
    /// goes to rank j, block r of `recv` comes from rank r.
    pub fn all_to_all<T: Element>(
        &self,
        send: &impl DevicePtr<T>,
        recv: &mut impl DevicePtrMut<T>,
    ) -> Result<DeviceWork> {
        let verb = Verb(CollKind::AllToAll, Count::Send, None, None);
        self.coll(verb, Some(send), recv)
    }

    /// Send `buf` to `peer` (which must call `recv` with the same length,
    /// on device or host memory).
    pub fn send<T: Element>(&self, buf: &impl DevicePtr<T>, peer: usize) -> Result<DeviceWork> {
        let call = CollCall::p2p(buf.len(), self.comm.rank(), peer, true);
        self.run(call, Some(buf), None)
    }

    /// Receive `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        peer: usize,
    ) -> Result<DeviceWork> {
        let call = CollCall::p2p(buf.len(), self.comm.rank(), peer, false);
        self.run(call, None, Some(buf))
    }

    /// In-place reduce: `root`'s `buf` gets the reduction; other ranks'
    /// `buf` may be used as scratch (as NCCL's).
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        op: ReduceOp,
        root: usize,
    ) -> Result<DeviceWork> {
        let verb = Verb(CollKind::Reduce, Count::Send, Some(op), Some(root));
        self.coll(verb, None, buf)
    }
}

/// What a collective method states ([`OnStream::coll`]): its kind, the
/// length that is its count, its reduction and its root.
#[derive(Clone, Copy)]
struct Verb(CollKind, Count, Option<ReduceOp>, Option<usize>);

/// Which length a collective's count is.
#[derive(Clone, Copy)]
enum Count {
    /// The send buffer's (in place: the buffer's).
    Send,
    /// The receive buffer's (in place: the buffer's).
    Recv,
    /// One rank's block: the send buffer's over the rank count (in place:
    /// the buffer's).
    Block,
}

/// cudarc's `DevicePtr` as an object (its method is generic over nothing
/// but borrows; this keeps `run` one function for every verb).
trait DevicePtrDyn<T> {
    fn elems(&self) -> usize;
    fn slice_stream(&self) -> &Arc<CudaStream>;
    fn ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, cudarc::driver::SyncOnDrop<'a>);
}

impl<T, S: DevicePtr<T>> DevicePtrDyn<T> for S {
    fn elems(&self) -> usize {
        DeviceSlice::len(self)
    }
    fn slice_stream(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(self)
    }
    fn ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, cudarc::driver::SyncOnDrop<'a>) {
        self.device_ptr(stream)
    }
}

/// cudarc's `DevicePtrMut` as an object.
trait DevicePtrMutDyn<T> {
    fn elems(&self) -> usize;
    fn slice_stream(&self) -> &Arc<CudaStream>;
    fn ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, cudarc::driver::SyncOnDrop<'a>);
}

impl<T, S: DevicePtrMut<T>> DevicePtrMutDyn<T> for S {
    fn elems(&self) -> usize {
        DeviceSlice::len(self)
    }
    fn slice_stream(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(self)
    }
    fn ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, cudarc::driver::SyncOnDrop<'a>) {
        self.device_ptr_mut(stream)
    }
}
