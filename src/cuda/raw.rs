//! The raw device entry points, for foreign callers (the NCCL ABI, the
//! Python package): device pointers, a `CUstream` and a `DataType` instead
//! of cudarc's typed slices, checked with the driver (pointer attributes,
//! the stream's context) before anything is enqueued, then run by the same
//! device path as [`super::OnStream`]. The `unsafe` entry points
//! (`Communicator::*_raw`) are here, and only here: the safe API of
//! `super` never takes a pointer.

use super::{coll_call, from_cuda, p2p_call, DeviceWork};
use crate::coll::CollKind;
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
    let ty = crate::exec::cuda_ty(T::DTYPE);
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
            ferroccl_cuda::Op::Prod,
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
    let call = p2p_call(raw.count, comm.rank(), peer, sending);
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
        let probe = super::super::device_count();
        run_ranks_with(
            2,
            |c| c.transport = Some("mem".into()),
            move |comm| {
                let host = [1.0f32; 8];
                let mut out = [0.0f32; 8];
                let (s, r) = (host.as_ptr().cast(), out.as_mut_ptr().cast());
                let null = std::ptr::null_mut();
                let mut two = [0u8; 8];
                two[..4].copy_from_slice(&2.0f32.to_ne_bytes());
                let premul = RawOp::PreMulSum(PreMulScalar::Value(two));
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
                        comm.send_raw(s, 8, DataType::F32, 1 - comm.rank(), null),
                        comm.recv_raw(r, 8, DataType::F32, 1 - comm.rank(), null),
                        comm.all_to_all_raw(s, r, 4, DataType::F32, null),
                        comm.all_reduce_raw(s, r, 8, DataType::F32, premul, null),
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

    use ferroccl_cuda::host_engine::HostEngine;
    use std::sync::Mutex;
    use std::time::Duration;

    /// The host stand-in of a GPU behind the raw entry points: pointers
    /// are checked against the allocations made through it, as the
    /// driver checks them against its own.
    struct StandIn {
        engine: Arc<HostEngine>,
        allocs: Mutex<Vec<(u64, usize)>>,
        fill: usize,
    }

    impl StandIn {
        fn new(seed: u64, fill: usize) -> StandIn {
            StandIn {
                engine: Arc::new(HostEngine::with_delays(Duration::from_micros(100), seed)),
                allocs: Mutex::new(Vec::new()),
                fill,
            }
        }

        fn alloc(&self, bytes: usize) -> u64 {
            // In stream order: ranks sharing the stand-in may have streams
            // parked at gates (the device rule holds for callers too).
            let b = self
                .engine
                .alloc_device_async(device::LEGACY_STREAM, bytes)
                .unwrap();
            self.allocs.lock().unwrap().push((b.0, bytes));
            b.0
        }

        fn free(&self, addr: u64) {
            self.allocs
                .lock()
                .unwrap()
                .retain(|&(start, _)| start != addr);
            self.engine
                .free_device_async(device::LEGACY_STREAM, DeviceBuf(addr))
                .unwrap();
        }

        fn ptr(&self, addr: u64) -> device::DevicePtr {
            let info = self.pointer_info(addr).unwrap();
            at(&info, addr)
        }

        /// Write `data` at `addr` by work enqueued on `stream` (a copy
        /// from pinned memory the stand-in may delay), not waited for: the
        /// call must wait for it itself.
        fn enqueue_write(&self, stream: Stream, addr: u64, data: &[u8]) {
            self.engine
                .enqueue_write(stream, self.ptr(addr), data)
                .unwrap();
        }

        /// Read `bytes` at `addr` by work enqueued on `stream` after the
        /// call, waiting only for that work.
        fn read_after(&self, stream: Stream, addr: u64, bytes: usize) -> Vec<u8> {
            let got = self
                .engine
                .enqueue_read(stream, self.ptr(addr), bytes)
                .unwrap();
            let out = got
                .recv_timeout(Duration::from_secs(30))
                .expect("the stream got to the read")
                .unwrap();
            assert_eq!(
                self.engine.violations(),
                Vec::<String>::new(),
                "the device rule"
            );
            out
        }
    }

    impl RawDevice for StandIn {
        fn pointer_info(&self, ptr: u64) -> std::result::Result<engine::PointerInfo, CudaError> {
            self.allocs
                .lock()
                .unwrap()
                .iter()
                .find(|&&(start, size)| ptr >= start && ptr < start + size as u64)
                .map(|&(start, size)| engine::PointerInfo {
                    ordinal: 0,
                    start,
                    size,
                })
                .ok_or_else(|| {
                    CudaError::InvalidArgument(format!(
                        "{ptr:#x} is not CUDA device memory (of the stand-in)"
                    ))
                })
        }

        fn engine(&self, stream: u64, _ordinal: usize) -> Result<(Arc<dyn Engine>, Stream)> {
            Ok((self.engine.clone(), Stream(stream)))
        }

        fn premul_fill(&self) -> usize {
            self.fill
        }
    }

    /// Small integers: exact in every type tested, and their sums too.
    fn value(rank: usize, i: usize) -> f64 {
        ((rank * 7 + i * 3) % 5) as f64
    }

    fn raw(kind: CollKind, send: u64, recv: u64, count: usize, dtype: DataType) -> Raw {
        Raw {
            kind,
            send,
            recv,
            count,
            dtype,
            op: None,
            premul: None,
            root: None,
            p2p: None,
            stream: 0,
        }
    }

    /// One raw call of a rank: its arguments, the buffers it needs
    /// (element counts) and where its input lies in them, where its
    /// output is read, and the f64 reference of that output.
    struct Case {
        name: &'static str,
        raw: Raw,
        /// (buffer index, element offset, this rank's input values).
        inputs: Vec<(usize, usize, Vec<f64>)>,
        /// (buffer index, element offset, reference).
        want: Option<(usize, usize, Vec<f64>)>,
    }

    /// The raw entry points' own logic (NCCL's counts and in-place
    /// layouts, the root's copy of an out-of-place broadcast, the copy of
    /// an in-place all-to-all, PreMulSum's multiplication on the stream)
    /// on the host stand-in, rank r with its own stand-in device: every
    /// collective, in place and out of place, and PreMulSum with a scalar
    /// by value and one in device memory written by work still pending on
    /// the stream, each checked against an f64 reference computed from
    /// the inputs' formula. PreMulSum's scalar fill is cut to 5 elements,
    /// so that its doubling copies and its products in pieces (with a
    /// short last piece) are all used.
    #[test]
    fn raw_calls_on_the_stand_in_match_the_reference() {
        for n in [1, 2, 3, 4] {
            let own = |rank: usize| Arc::new(StandIn::new(rank as u64 + 11, 5));
            raw_calls::<f32>(n, 0.5, &own);
            raw_calls::<half::bf16>(n, 0.5, &own);
            raw_calls::<i32>(n, 3.0, &own);
        }
    }

    /// The same calls where the ranks are threads on one stand-in device
    /// that runs the device executor's kernel (its CUDA source built for
    /// the host): every collective goes to the executor (the launches are
    /// counted), with the in-place all-to-all's copy and PreMulSum's
    /// products made on the stream before it.
    #[test]
    fn raw_calls_run_by_the_executor_on_a_shared_device() {
        let Some(hook) = crate::exec::oracle::host_launch::host_executor() else {
            return;
        };
        for n in [2, 3] {
            let launches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counted = launches.clone();
            let hook = hook.clone();
            let mut dev = StandIn::new(n as u64, 5);
            dev.engine = Arc::new(
                HostEngine::with_delays(Duration::from_micros(100), n as u64).with_executor(
                    Arc::new(move |l: &ferroccl_cuda::executor::ExecLaunch| {
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        hook(l)
                    }),
                ),
            );
            let dev = Arc::new(dev);
            raw_calls::<f32>(n, 0.5, &|_| dev.clone());
            // 13 collectives on every rank (sends and receives are
            // staged), all by the executor.
            assert_eq!(
                launches.load(std::sync::atomic::Ordering::Relaxed),
                13 * n,
                "{n} ranks: the executor did not run every collective"
            );
        }
    }

    fn raw_calls<T: Element>(
        n: usize,
        scalar: f64,
        device: &(dyn Fn(usize) -> Arc<StandIn> + Sync),
    ) {
        let c = 37;
        run_ranks_with(
            n,
            |cfg| {
                cfg.transport = Some("mem".into());
                cfg.timeout = Duration::from_secs(60);
                cfg.calibrate = false;
            },
            |comm| {
                let (rank, size) = (comm.rank(), comm.size());
                let dt = T::DTYPE;
                let dev = device(rank);
                let stream = dev.engine.stream().unwrap();
                let elem = std::mem::size_of::<T>();
                let input = |len: usize| (0..len).map(|i| value(rank, i)).collect::<Vec<f64>>();
                let sum = |i: usize| (0..size).map(|r| value(r, i)).sum::<f64>();
                let last = size - 1;
                let cases = |b: &[u64]| -> Vec<Case> {
                    let off = |k: usize, elems: usize| b[k] + (elems * elem) as u64;
                    let mut v = vec![
                        Case {
                            name: "allreduce sum",
                            raw: Raw {
                                op: Some(ReduceOp::Sum),
                                ..raw(CollKind::AllReduce, b[0], b[1], c, dt)
                            },
                            inputs: vec![(0, 0, input(c))],
                            want: Some((1, 0, (0..c).map(sum).collect())),
                        },
                        Case {
                            name: "allreduce max in place",
                            raw: Raw {
                                op: Some(ReduceOp::Max),
                                ..raw(CollKind::AllReduce, b[0], b[0], c, dt)
                            },
                            inputs: vec![(0, 0, input(c))],
                            want: Some((
                                0,
                                0,
                                (0..c)
                                    .map(|i| (0..size).map(|r| value(r, i)).fold(0.0, f64::max))
                                    .collect(),
                            )),
                        },
                        Case {
                            name: "reduce-scatter sum in place",
                            raw: Raw {
                                op: Some(ReduceOp::Sum),
                                ..raw(CollKind::ReduceScatter, b[0], off(0, rank * c), c, dt)
                            },
                            inputs: vec![(0, 0, input(c * size))],
                            want: Some((0, rank * c, (0..c).map(|i| sum(rank * c + i)).collect())),
                        },
                        Case {
                            name: "reduce-scatter avg",
                            raw: Raw {
                                op: Some(ReduceOp::Avg),
                                ..raw(CollKind::ReduceScatter, b[0], b[1], c, dt)
                            },
                            inputs: vec![(0, 0, input(c * size))],
                            want: Some((
                                1,
                                0,
                                (0..c)
                                    .map(|i| {
                                        let a = sum(rank * c + i) / size as f64;
                                        if dt == DataType::I32 {
                                            a.trunc()
                                        } else {
                                            a
                                        }
                                    })
                                    .collect(),
                            )),
                        },
                        Case {
                            name: "allgather in place",
                            raw: raw(CollKind::AllGather, off(0, rank * c), b[0], c, dt),
                            inputs: vec![(0, rank * c, input(c))],
                            want: Some((
                                0,
                                0,
                                (0..c * size).map(|j| value(j / c, j % c)).collect(),
                            )),
                        },
                        Case {
                            name: "allgather",
                            raw: raw(CollKind::AllGather, b[0], b[1], c, dt),
                            inputs: vec![(0, 0, input(c))],
                            want: Some((
                                1,
                                0,
                                (0..c * size).map(|j| value(j / c, j % c)).collect(),
                            )),
                        },
                        Case {
                            name: "broadcast out of place",
                            raw: Raw {
                                root: Some(last),
                                ..raw(CollKind::Broadcast, b[0], b[1], c, dt)
                            },
                            inputs: vec![(0, 0, input(c))],
                            want: Some((1, 0, (0..c).map(|i| value(last, i)).collect())),
                        },
                        Case {
                            name: "reduce min in place",
                            raw: Raw {
                                op: Some(ReduceOp::Min),
                                root: Some(last),
                                ..raw(CollKind::Reduce, b[0], b[0], c, dt)
                            },
                            inputs: vec![(0, 0, input(c))],
                            want: (rank == last).then(|| {
                                (
                                    0,
                                    0,
                                    (0..c)
                                        .map(|i| {
                                            (0..size).map(|r| value(r, i)).fold(f64::MAX, f64::min)
                                        })
                                        .collect(),
                                )
                            }),
                        },
                        Case {
                            name: "all-to-all",
                            raw: raw(CollKind::AllToAll, b[0], b[1], c, dt),
                            inputs: vec![(0, 0, input(c * size))],
                            want: Some((
                                1,
                                0,
                                (0..c * size)
                                    .map(|j| value(j / c, rank * c + j % c))
                                    .collect(),
                            )),
                        },
                        Case {
                            name: "all-to-all in place",
                            raw: raw(CollKind::AllToAll, b[0], b[0], c, dt),
                            inputs: vec![(0, 0, input(c * size))],
                            want: Some((
                                0,
                                0,
                                (0..c * size)
                                    .map(|j| value(j / c, rank * c + j % c))
                                    .collect(),
                            )),
                        },
                        Case {
                            name: "allreduce premulsum, scalar by value",
                            raw: Raw {
                                op: Some(ReduceOp::Sum),
                                premul: Some(PreMulScalar::Value(scalar_bytes::<T>(scalar))),
                                ..raw(CollKind::AllReduce, b[0], b[1], c, dt)
                            },
                            inputs: vec![(0, 0, input(c))],
                            want: Some((1, 0, (0..c).map(|i| scalar * sum(i)).collect())),
                        },
                        Case {
                            name: "reduce-scatter premulsum in place, scalar on the device",
                            raw: Raw {
                                op: Some(ReduceOp::Sum),
                                premul: Some(PreMulScalar::Device(b[2])),
                                ..raw(CollKind::ReduceScatter, b[0], off(0, rank * c), c, dt)
                            },
                            inputs: vec![(0, 0, input(c * size)), (2, 0, vec![scalar])],
                            want: Some((
                                0,
                                rank * c,
                                (0..c).map(|i| scalar * sum(rank * c + i)).collect(),
                            )),
                        },
                        Case {
                            name: "reduce premulsum, scalar on the device",
                            raw: Raw {
                                op: Some(ReduceOp::Sum),
                                premul: Some(PreMulScalar::Device(off(2, 1))),
                                root: Some(0),
                                ..raw(CollKind::Reduce, b[0], b[1], c, dt)
                            },
                            inputs: vec![(0, 0, input(c)), (2, 1, vec![scalar])],
                            want: (rank == 0)
                                .then(|| (1, 0, (0..c).map(|i| scalar * sum(i)).collect())),
                        },
                    ];
                    if size > 1 {
                        let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
                        let send = Case {
                            name: "send",
                            raw: Raw {
                                p2p: Some((next, true)),
                                ..raw(CollKind::SendRecv, b[0], b[0], c, dt)
                            },
                            inputs: vec![(0, 0, input(c))],
                            want: None,
                        };
                        let recv = Case {
                            name: "recv",
                            raw: Raw {
                                p2p: Some((prev, false)),
                                ..raw(CollKind::SendRecv, b[1], b[1], c, dt)
                            },
                            inputs: vec![],
                            want: Some((1, 0, (0..c).map(|i| value(prev, i)).collect())),
                        };
                        // Rank 0 receives first: no cycle of blocking sends.
                        if rank == 0 {
                            v.extend([recv, send]);
                        } else {
                            v.extend([send, recv]);
                        }
                    }
                    v
                };
                let lens = [c * size, c * size, 2];
                let plan = cases(&[0, 0, 0]).len();
                for k in 0..plan {
                    let bufs: Vec<u64> = lens.iter().map(|&l| dev.alloc(l * elem)).collect();
                    let case = cases(&bufs).swap_remove(k);
                    let what = format!("{} ranks, rank {rank}, {dt}, {}", size, case.name);
                    for (b, at, vals) in &case.inputs {
                        let data: Vec<T> = vals.iter().map(|&x| T::from_f64(x)).collect();
                        let addr = bufs[*b] + (at * elem) as u64;
                        dev.enqueue_write(stream, addr, bytemuck::cast_slice(&data));
                    }
                    let raw = Raw {
                        stream: stream.0,
                        ..case.raw
                    };
                    let work = run_raw_on::<T>(&comm, raw, &*dev)
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let got = case
                        .want
                        .as_ref()
                        .map(|(b, at, w)| read_elems::<T>(&dev, stream, bufs[*b], *at, w.len()));
                    // PreMulSum leaves its input as it was (out of place).
                    let kept = (raw.premul.is_some() && raw.send != raw.recv)
                        .then(|| read_elems::<T>(&dev, stream, bufs[0], 0, c));
                    work.wait().unwrap_or_else(|e| panic!("{what}: {e}"));
                    if let (Some(got), Some((_, _, want))) = (got, &case.want) {
                        for (i, (g, w)) in got.iter().zip(want).enumerate() {
                            assert!(
                                (g - w).abs() <= w.abs() * 1e-2,
                                "{what}: element {i}: {g} != {w}"
                            );
                        }
                    }
                    if let Some(kept) = kept {
                        assert_eq!(kept, input(c), "{what}: the input changed");
                    }
                    for b in bufs {
                        dev.free(b);
                    }
                }
            },
        );
    }

    fn scalar_bytes<T: Element>(x: f64) -> [u8; 8] {
        let mut b = [0u8; 8];
        let v = T::from_f64(x);
        b[..std::mem::size_of::<T>()].copy_from_slice(bytemuck::bytes_of(&v));
        b
    }

    fn read_elems<T: Element>(
        dev: &StandIn,
        stream: Stream,
        buf: u64,
        at: usize,
        len: usize,
    ) -> Vec<f64> {
        let elem = std::mem::size_of::<T>();
        let bytes = dev.read_after(stream, buf + (at * elem) as u64, len * elem);
        bytemuck::pod_collect_to_vec::<u8, T>(&bytes)
            .iter()
            .map(|x| x.to_f64())
            .collect()
    }

    /// Buffers too short for NCCL's counts, overlapping without being in
    /// place, not device memory, or a PreMulSum scalar outside any
    /// allocation: refused with what was wrong, before anything is
    /// issued (a host call afterwards is every rank's first).
    #[test]
    fn raw_calls_with_bad_buffers_are_refused_before_anything_moves() {
        run_ranks_with(
            2,
            |cfg| cfg.transport = Some("mem".into()),
            |comm| {
                let dev = StandIn::new(3, 5);
                let stream = dev.engine.stream().unwrap().0;
                let (one, two) = (dev.alloc(8 * 4), dev.alloc(8 * 4));
                let f32s = DataType::F32;
                let sum = Some(ReduceOp::Sum);
                let host = [0f32; 8];
                let bad = [
                    (raw(CollKind::AllGather, one, two, 8, f32s), "recv buffer"),
                    (
                        raw(CollKind::AllToAll, one, two, 8, f32s),
                        "run past its allocation",
                    ),
                    (
                        Raw {
                            op: sum,
                            ..raw(CollKind::AllReduce, one, one + 4, 4, f32s)
                        },
                        "overlap",
                    ),
                    (
                        Raw {
                            op: sum,
                            ..raw(CollKind::AllReduce, host.as_ptr() as u64, two, 8, f32s)
                        },
                        "not CUDA device memory",
                    ),
                    (
                        Raw {
                            op: sum,
                            premul: Some(PreMulScalar::Device(host.as_ptr() as u64)),
                            ..raw(CollKind::ReduceScatter, one, two, 4, f32s)
                        },
                        "PreMulSum scalar buffer",
                    ),
                    (
                        Raw {
                            op: sum,
                            premul: Some(PreMulScalar::Device(two + 30)),
                            ..raw(CollKind::AllReduce, one, two, 8, f32s)
                        },
                        "PreMulSum scalar buffer",
                    ),
                ];
                for (r, needle) in bad {
                    let r = Raw { stream, ..r };
                    match run_raw_on::<f32>(&comm, r, &dev) {
                        Err(Error::InvalidArgument(why)) => {
                            assert!(why.contains(needle), "{r:?}: {why}")
                        }
                        other => panic!("{r:?}: {other:?}"),
                    }
                }
                let mut buf = [comm.rank() as f32 + 1.0; 3];
                comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
                assert_eq!(buf, [3.0; 3]);
            },
        );
    }
}
