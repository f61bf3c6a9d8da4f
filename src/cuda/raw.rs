//! The raw device entry points, for foreign callers (the NCCL ABI, the
//! Python package): device pointers, a `CUstream` and a `DataType` instead
//! of cudarc's typed slices, checked with the driver (pointer attributes,
//! the stream's context) before anything is enqueued, then run by the same
//! device path as [`super::OnStream`]. The `unsafe` entry points
//! (`Communicator::*_raw`) are here, and only here: the safe API of
//! `super` never takes a pointer.

use super::{coll_call, from_cuda, DeviceWork};
use crate::coll::{CollCall, CollKind};
use crate::comm::device::{Keep, OnDevice};
use crate::element::{DataType, Element, ReduceOp};
use crate::error::{Error, Result};
use crate::Communicator;
use ferroccl_cuda::cuda_engine::{self as engine, CudaEngine};
use ferroccl_cuda::device::{self, DeviceBuf, Engine, Stream};
use ferroccl_cuda::CudaError;
use std::ffi::c_void;
use std::sync::Arc;

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

/// The scalar of a PreMulSum reduction (NCCL's
/// `ncclRedOpCreatePreMulSum`): one element of the call's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreMulScalar {
    /// The value: the element's bytes in memory order (the first
    /// `size_of` of the type are used; `8.0f64.to_ne_bytes()`, or
    /// `u32::to_ne_bytes` padded with zeroes).
    Value([u8; 8]),
    /// The device address of the element, read when the stream reaches
    /// the call (NCCL's `ncclScalarDevice`): it may be written by earlier
    /// work on the stream.
    Device(u64),
}

/// The reduction of a raw reducing call (`all_reduce_raw`,
/// `reduce_scatter_raw`, `reduce_raw`). A [`ReduceOp`] converts into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawOp {
    /// A built-in operator.
    Builtin(ReduceOp),
    /// NCCL's PreMulSum: every rank's input multiplied by the scalar (in
    /// the type's arithmetic, as [`ReduceOp::Prod`] multiplies: integers
    /// wrap, f16 and bf16 round once), then summed. The caller's input is
    /// left as it was: the products go to a device temporary the size of
    /// the input, made on the stream before the call.
    PreMulSum(PreMulScalar),
}

impl From<ReduceOp> for RawOp {
    fn from(op: ReduceOp) -> Self {
        RawOp::Builtin(op)
    }
}

/// A raw call as NCCL describes it: counts in NCCL's meaning.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Raw {
    pub(crate) kind: CollKind,
    pub(crate) send: u64,
    pub(crate) recv: u64,
    /// allreduce, broadcast, reduce: the count; reduce-scatter: the
    /// receive count; allgather: the send count; all-to-all: the count
    /// to and from each rank.
    pub(crate) count: usize,
    pub(crate) dtype: DataType,
    pub(crate) op: Option<ReduceOp>,
    /// PreMulSum's scalar (then `op` is `Sum`).
    pub(crate) premul: Option<PreMulScalar>,
    pub(crate) root: Option<usize>,
    /// Send or receive: (peer, sending); the one buffer is `send`.
    pub(crate) p2p: Option<(usize, bool)>,
    pub(crate) stream: u64,
}

impl Raw {
    /// `kind` on `count` elements of `dtype` at `send` and `recv`, on
    /// `stream`: without a reduction, a root or a peer.
    fn new(
        kind: CollKind,
        send: *const c_void,
        recv: *const c_void,
        count: usize,
        dtype: DataType,
        stream: *mut c_void,
    ) -> Raw {
        Raw {
            kind,
            send: send as u64,
            recv: recv as u64,
            count,
            dtype,
            op: None,
            premul: None,
            root: None,
            p2p: None,
            stream: stream as u64,
        }
    }

    /// With the reduction `op` (PreMulSum: a sum, and its scalar).
    fn reducing(self, op: RawOp) -> Raw {
        let (op, premul) = match op {
            RawOp::Builtin(op) => (op, None),
            RawOp::PreMulSum(s) => (ReduceOp::Sum, Some(s)),
        };
        Raw {
            op: Some(op),
            premul,
            ..self
        }
    }

    fn rooted(self, root: usize) -> Raw {
        Raw {
            root: Some(root),
            ..self
        }
    }

    /// A send to (`sending`) or receive from `peer`.
    fn p2p(self, peer: usize, sending: bool) -> Raw {
        Raw {
            p2p: Some((peer, sending)),
            ..self
        }
    }
}

/// Elements of the scalar-filled buffer PreMulSum multiplies by: bounds
/// the temporary (16 MiB of f32) and the number of multiplications (one
/// per this many elements of input).
const PRE_MUL_FILL: usize = 1 << 22;

/// What a raw call is checked against and run on: the CUDA driver (its
/// pointer query, the device's engine), or, in the tests, the host
/// stand-in of a GPU.
pub(crate) trait RawDevice {
    /// The device allocation `ptr` lies in; `InvalidArgument` where it is
    /// not device memory, `NoDevice` without a usable driver.
    fn pointer_info(&self, ptr: u64) -> std::result::Result<engine::PointerInfo, CudaError>;
    /// The engine of device `ordinal`, once `stream` is known to be of it.
    fn engine(&self, stream: u64, ordinal: usize) -> Result<(Arc<dyn Engine>, Stream)>;
    /// Elements of PreMulSum's scalar-filled buffer (at most).
    fn premul_fill(&self) -> usize {
        PRE_MUL_FILL
    }
}

/// The CUDA driver.
struct Driver;

impl RawDevice for Driver {
    fn pointer_info(&self, ptr: u64) -> std::result::Result<engine::PointerInfo, CudaError> {
        engine::pointer_info(ptr)
    }

    fn engine(&self, stream: u64, ordinal: usize) -> Result<(Arc<dyn Engine>, Stream)> {
        let engine = CudaEngine::shared(ordinal).map_err(from_cuda)?;
        if !engine.owns_stream(stream).map_err(from_cuda)? {
            return Err(Error::InvalidArgument(format!(
                "stream {stream:#x} is not of device {ordinal}'s primary context, where \
                 ferroccl runs device calls"
            )));
        }
        Ok((engine, Stream(stream)))
    }
}

/// `ptr` as the engines take it: its allocation and the offset in it.
fn at(info: &engine::PointerInfo, ptr: u64) -> device::DevicePtr {
    device::DevicePtr::new(DeviceBuf(info.start)).add((ptr - info.start) as usize)
}

/// The checked allocation of `len` elements of `dtype` at `ptr`, named
/// `what` in errors.
fn checked(
    dev: &dyn RawDevice,
    what: &str,
    ptr: u64,
    len: usize,
    elem: usize,
    dtype: DataType,
) -> Result<engine::PointerInfo> {
    let info = dev.pointer_info(ptr).map_err(|e| named(what, e))?;
    if !len.checked_mul(elem).is_some_and(|b| info.holds(ptr, b)) {
        return Err(Error::InvalidArgument(format!(
            "{what} buffer {ptr:#x}: {len} elements of {dtype} run past its allocation ({} \
             bytes from {:#x})",
            info.size, info.start
        )));
    }
    Ok(info)
}

pub(crate) fn run_raw_on<T: Element>(
    comm: &Communicator,
    raw: Raw,
    dev: &dyn RawDevice,
) -> Result<DeviceWork> {
    if let Some((peer, sending)) = raw.p2p {
        return run_raw_p2p::<T>(comm, raw, peer, sending, dev);
    }
    let elem = std::mem::size_of::<T>();
    let size = comm.size();
    let rank = comm.rank();
    let (kind, count) = (raw.kind, raw.count);
    let all = count.checked_mul(size).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{}: count {count} of {} on {size} ranks overflows",
            kind.name(),
            raw.dtype
        ))
    })?;
    // Lengths in elements of the send and receive buffers, and where, in
    // NCCL's convention, an in-place call's send buffer lies in the
    // receive buffer (or the receive buffer in the send buffer).
    let (send_len, recv_len) = match kind {
        CollKind::ReduceScatter => (all, count),
        CollKind::AllGather => (count, all),
        CollKind::AllToAll => (all, all),
        _ => (count, count),
    };
    // Check both buffers with the driver: device memory of one device,
    // the extents inside their allocations, no overlap but in place.
    let send_info = checked(dev, "send", raw.send, send_len, elem, raw.dtype)?;
    let recv_info = checked(dev, "recv", raw.recv, recv_len, elem, raw.dtype)?;
    // Where the blocks are `count` elements of a buffer just checked to
    // hold `size` of them, this rank's block offset fits.
    let block = || (rank * count * elem) as u64;
    let in_place = match kind {
        CollKind::ReduceScatter => raw.send.checked_add(block()) == Some(raw.recv),
        CollKind::AllGather => raw.recv.checked_add(block()) == Some(raw.send),
        _ => raw.send == raw.recv,
    };
    if send_info.ordinal != recv_info.ordinal {
        return Err(Error::InvalidArgument(format!(
            "send buffer on device {}, recv buffer on device {}",
            send_info.ordinal, recv_info.ordinal
        )));
    }
    let bytes = |len: usize| len * elem;
    let overlap = raw.send < raw.recv + bytes(recv_len) as u64
        && raw.recv < raw.send + bytes(send_len) as u64;
    if overlap && !in_place {
        return Err(Error::InvalidArgument(format!(
            "send buffer {:#x} and recv buffer {:#x} overlap without being in place",
            raw.send, raw.recv
        )));
    }
    let scalar = match raw.premul {
        None => None,
        Some(PreMulScalar::Value(v)) => Some(Scalar::Value(v)),
        Some(PreMulScalar::Device(p)) => {
            let info = checked(dev, "PreMulSum scalar", p, 1, elem, raw.dtype)?;
            if info.ordinal != send_info.ordinal {
                return Err(Error::InvalidArgument(format!(
                    "the PreMulSum scalar is on device {}, the buffers on device {}",
                    info.ordinal, send_info.ordinal
                )));
            }
            Some(Scalar::Device(at(&info, p)))
        }
    };
    let (engine, stream) = dev.engine(raw.stream, send_info.ordinal)?;
    let send_at = at(&send_info, raw.send);
    let recv_at = at(&recv_info, raw.recv);
    let mut keep = Keep::default();
    // PreMulSum: the scaled input, in a temporary, is the send buffer of
    // an out-of-place sum into the caller's output (in place, the output
    // is where NCCL puts it in the one buffer).
    if let Some(scalar) = scalar.filter(|_| send_len > 0) {
        let scaled = pre_scale::<T>(
            &engine,
            stream,
            send_at,
            send_len,
            scalar,
            dev.premul_fill(),
            &mut keep,
        )
        .map_err(|e| {
            Error::Io(format!(
                "{} with PreMulSum on device memory: {e}",
                kind.name()
            ))
        })?;
        let call = coll_call(kind, count, send_len, recv_len, raw.op, raw.root, false);
        let on = OnDevice {
            ordinal: send_info.ordinal as u32,
            engine,
            stream,
            send: scaled,
            recv: recv_at,
        };
        return comm.device_collective_keeping::<T>(&call, &on, keep);
    }
    // In place, ferroccl's convention names the whole buffer: the receive
    // buffer of an allgather and the send buffer of a reduce-scatter.
    let whole = if kind == CollKind::AllGather {
        recv_at
    } else {
        send_at
    };
    // ferroccl counts an all-to-all by its whole send buffer.
    let call_count = if kind == CollKind::AllToAll {
        all
    } else {
        count
    };
    let mut send = if in_place { whole } else { send_at };
    let recv = if in_place { whole } else { recv_at };
    let mut call = if in_place {
        let n = send_len.max(recv_len);
        coll_call(kind, call_count, n, n, raw.op, raw.root, true)
    } else {
        coll_call(
            kind, call_count, send_len, recv_len, raw.op, raw.root, false,
        )
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

/// Where PreMulSum's scalar is, once checked.
#[derive(Clone, Copy)]
enum Scalar {
    Value([u8; 8]),
    Device(device::DevicePtr),
}

/// PreMulSum's multiplication, enqueued on `stream` (after the caller's
/// earlier work, before the call): `len` elements at `input` times the
/// scalar, into a new device temporary, returned. The scalar is put in
/// one element of a second temporary (a value by stream-ordered memsets,
/// with no pinned buffer, whose allocation would wait for every stream;
/// or copied from the caller's device memory when the stream gets there),
/// spread over up to `fill` elements by copies that double it, and the
/// reduction kernel's product runs against it `fill` elements at a time:
/// no kernel of its own, and the same arithmetic as `ReduceOp::Prod`.
/// Both temporaries go into `keep`, freed when the call ends.
fn pre_scale<T: Element>(
    engine: &Arc<dyn Engine>,
    stream: Stream,
    input: device::DevicePtr,
    len: usize,
    scalar: Scalar,
    fill: usize,
    keep: &mut Keep,
) -> std::result::Result<device::DevicePtr, CudaError> {
    let elem = std::mem::size_of::<T>();
    let ty = T::DTYPE;
    let fill = fill.clamp(1, len);
    // In the stream's order: a plain allocation would wait for every
    // stream, a parked one too (the device rule).
    let scaled = engine.alloc_device_async(stream, len * elem)?;
    keep.device.push(scaled);
    let spread = engine.alloc_device_async(stream, fill * elem)?;
    keep.device.push(spread);
    let (scaled, spread) = (
        device::DevicePtr::new(scaled),
        device::DevicePtr::new(spread),
    );
    match scalar {
        Scalar::Value(v) => engine.write_scalar(stream, spread, &v[..elem])?,
        Scalar::Device(p) => engine.d2d(stream, spread, p, elem)?,
    }
    let mut have = 1;
    while have < fill {
        let n = have.min(fill - have);
        engine.d2d(stream, spread.add(have * elem), spread, n * elem)?;
        have += n;
    }
    for from in (0..len).step_by(fill) {
        let n = fill.min(len - from);
        let off = from * elem;
        engine.reduce(
            stream,
            ReduceOp::Prod,
            ty,
            scaled.add(off),
            input.add(off),
            spread,
            n,
        )?;
    }
    Ok(scaled)
}

/// A raw send or receive: one buffer, checked as the collectives' are.
fn run_raw_p2p<T: Element>(
    comm: &Communicator,
    raw: Raw,
    peer: usize,
    sending: bool,
    dev: &dyn RawDevice,
) -> Result<DeviceWork> {
    let elem = std::mem::size_of::<T>();
    let what = if sending { "send" } else { "recv" };
    let info = checked(dev, what, raw.send, raw.count, elem, raw.dtype)?;
    let (engine, stream) = dev.engine(raw.stream, info.ordinal)?;
    let buf = at(&info, raw.send);
    let call = CollCall::p2p(raw.count, comm.rank(), peer, sending);
    let on = OnDevice {
        ordinal: info.ordinal as u32,
        engine,
        stream,
        send: buf,
        recv: buf,
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
    /// `ncclAllReduce`: `count` elements of `dtype`; `op` a
    /// [`ReduceOp`] or a [`RawOp::PreMulSum`].
    ///
    /// # Safety
    /// See the safety section of the raw entry points above (and, for a
    /// [`PreMulScalar::Device`], the same of its one element).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn all_reduce_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DataType,
        op: impl Into<RawOp>,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        let raw = Raw::new(CollKind::AllReduce, send, recv, count, dtype, stream);
        self.raw(raw.reducing(op.into()))
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
        op: impl Into<RawOp>,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        let kind = CollKind::ReduceScatter;
        let raw = Raw::new(kind, send, recv, recv_count, dtype, stream);
        self.raw(raw.reducing(op.into()))
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
        let raw = Raw::new(CollKind::AllGather, send, recv, send_count, dtype, stream);
        self.raw(raw)
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
        let raw = Raw::new(CollKind::Broadcast, send, recv, count, dtype, stream);
        self.raw(raw.rooted(root))
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
        op: impl Into<RawOp>,
        root: usize,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        let raw = Raw::new(CollKind::Reduce, send, recv, count, dtype, stream);
        self.raw(raw.reducing(op.into()).rooted(root))
    }

    /// `ncclAlltoAll`: `send` and `recv` hold `count` elements of `dtype`
    /// for each rank; block j of `send` goes to rank j, block r of `recv`
    /// comes from rank r. In place (`send == recv`) the input is first
    /// copied to a device temporary on the stream.
    ///
    /// # Safety
    /// See [`Communicator::all_reduce_raw`].
    pub unsafe fn all_to_all_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dtype: DataType,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        let raw = Raw::new(CollKind::AllToAll, send, recv, count, dtype, stream);
        self.raw(raw)
    }

    /// `ncclSend`: `count` elements of `dtype` to `peer`.
    ///
    /// # Safety
    /// See [`Communicator::all_reduce_raw`].
    pub unsafe fn send_raw(
        &self,
        send: *const c_void,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        let raw = Raw::new(CollKind::SendRecv, send, send, count, dtype, stream);
        self.raw(raw.p2p(peer, true))
    }

    /// `ncclRecv`: `count` elements of `dtype` from `peer`.
    ///
    /// # Safety
    /// See [`Communicator::all_reduce_raw`].
    pub unsafe fn recv_raw(
        &self,
        recv: *mut c_void,
        count: usize,
        dtype: DataType,
        peer: usize,
        stream: *mut c_void,
    ) -> Result<DeviceWork> {
        let raw = Raw::new(CollKind::SendRecv, recv, recv, count, dtype, stream);
        self.raw(raw.p2p(peer, false))
    }

    /// Run `raw` as the CUDA driver checks it, on its element type.
    fn raw(&self, raw: Raw) -> Result<DeviceWork> {
        with_element!(raw.dtype, run_raw_on, self, raw, &Driver)
    }
}

#[cfg(test)]
mod tests;
