//! One NCCL call, described and checked (before any byte moves), then
//! carried out: on host memory synchronously through the library's host
//! API, on device memory through its raw device entry points on the
//! caller's stream.

pub use crate::abi::{PreMul, Scalar};

use crate::comm::Core;
use crate::status::Failure;
use ferroccl::cuda::{PreMulScalar, RawOp};
use ferroccl::{Communicator, DataType, Element, ReduceOp};
use std::ffi::c_void;

/// Which NCCL function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `ncclAllReduce`
    AllReduce,
    /// `ncclBroadcast` / `ncclBcast`
    Broadcast,
    /// `ncclReduce`
    Reduce,
    /// `ncclAllGather` (count: per rank)
    AllGather,
    /// `ncclReduceScatter` (count: per rank)
    ReduceScatter,
    /// `ncclAlltoAll` (count: per peer)
    AllToAll,
    /// `ncclSend`
    Send,
    /// `ncclRecv`
    Recv,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "ncclAllReduce",
            Kind::Broadcast => "ncclBroadcast",
            Kind::Reduce => "ncclReduce",
            Kind::AllGather => "ncclAllGather",
            Kind::ReduceScatter => "ncclReduceScatter",
            Kind::AllToAll => "ncclAlltoAll",
            Kind::Send => "ncclSend",
            Kind::Recv => "ncclRecv",
        }
    }
}

/// The reduction of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// No reduction (broadcast, gathers, point-to-point).
    None,
    /// A built-in operator.
    Builtin(ReduceOp),
    /// A PreMulSum operator.
    PreMul(PreMul),
}

/// Where a call's buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory: the call runs synchronously, the stream is ignored.
    Host,
    /// CUDA device memory: the call is enqueued on the stream.
    Device,
}

/// One call with NCCL's arguments, checked.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// Which function.
    pub kind: Kind,
    /// `sendbuff` (the buffer of `ncclSend`).
    pub send: usize,
    /// `recvbuff` (the buffer of `ncclRecv`).
    pub recv: usize,
    /// NCCL's count (see [`Kind`]).
    pub count: usize,
    /// Element type.
    pub dtype: DataType,
    /// Reduction.
    pub op: Op,
    /// The root, or the peer of a point-to-point call.
    pub root: usize,
    /// Where the buffers live.
    pub memory: Memory,
    /// The `cudaStream_t`.
    pub stream: usize,
}

fn overlap(a: usize, a_len: usize, b: usize, b_len: usize) -> bool {
    a_len > 0 && b_len > 0 && a < b + b_len && b < a + a_len
}

/// Whether `ptr` is CUDA device memory; without a usable driver nothing is.
fn is_device(ptr: usize) -> bool {
    ptr != 0 && ferroccl_cuda::cuda_engine::pointer_info(ptr as u64).is_ok()
}

impl Call {
    /// Elements of the send and receive buffers this rank uses (0 where
    /// it uses none), or an error for a count whose bytes overflow.
    fn lengths(&self, rank: usize, size: usize) -> Result<(usize, usize), Failure> {
        let c = self.count;
        let all = c.checked_mul(size).filter(|n| {
            n.checked_mul(self.dtype.size())
                .is_some_and(|b| b <= isize::MAX as usize)
        });
        let all = all.ok_or_else(|| {
            Failure::invalid_argument(format!(
                "{}: count {c} of {:?} on {size} ranks overflows the address space",
                self.kind.name(),
                self.dtype
            ))
        })?;
        let is_root = rank == self.root;
        Ok(match self.kind {
            Kind::AllReduce => (c, c),
            Kind::Broadcast => (if is_root { c } else { 0 }, c),
            Kind::Reduce => (c, if is_root { c } else { 0 }),
            Kind::AllGather => (c, all),
            Kind::ReduceScatter => (all, c),
            Kind::AllToAll => (all, all),
            Kind::Send => (c, 0),
            Kind::Recv => (0, c),
        })
    }

    /// Check everything that can be checked locally: rank, pointers,
    /// alignment, overlap, the operator's type; and find where the
    /// buffers live.
    pub fn check(mut self, rank: usize, size: usize) -> Result<Call, Failure> {
        let name = self.kind.name();
        let what = if matches!(self.kind, Kind::Send | Kind::Recv) {
            "peer"
        } else {
            "root"
        };
        if matches!(
            self.kind,
            Kind::Broadcast | Kind::Reduce | Kind::Send | Kind::Recv
        ) && self.root >= size
        {
            return Err(Failure::invalid_argument(format!(
                "{name}: {what} {} is out of range for a communicator of {size} ranks",
                self.root as isize
            )));
        }
        if let Op::PreMul(p) = self.op {
            if p.dtype != self.dtype {
                return Err(Failure::invalid_argument(format!(
                    "{name}: the PreMulSum operator was created for {:?}, the call is on {:?}",
                    p.dtype, self.dtype
                )));
            }
        }
        let (s_len, r_len) = self.lengths(rank, size)?;
        let esz = self.dtype.size();
        for (ptr, len, label) in [
            (self.send, s_len, "sendbuff"),
            (self.recv, r_len, "recvbuff"),
        ] {
            if len > 0 && ptr == 0 {
                return Err(Failure::invalid_argument(format!(
                    "{name}: {label} is NULL but {len} elements of {:?} are needed on rank {rank}",
                    self.dtype
                )));
            }
        }
        let used: Vec<usize> = [(self.send, s_len), (self.recv, r_len)]
            .into_iter()
            .filter(|&(p, l)| p != 0 && l > 0)
            .map(|(p, _)| p)
            .collect();
        let device: Vec<bool> = used.iter().map(|&p| is_device(p)).collect();
        self.memory = if device.iter().any(|&d| d) {
            if device.iter().any(|&d| !d) {
                return Err(Failure::invalid_argument(format!(
                    "{name}: one buffer is CUDA device memory and the other host memory"
                )));
            }
            Memory::Device
        } else {
            Memory::Host
        };
        match self.memory {
            Memory::Host => {
                for (ptr, len, label) in [
                    (self.send, s_len, "sendbuff"),
                    (self.recv, r_len, "recvbuff"),
                ] {
                    if len > 0 && ptr % esz != 0 {
                        return Err(Failure::invalid_argument(format!(
                            "{name}: {label} {ptr:#x} is not aligned to its {esz}-byte elements"
                        )));
                    }
                }
                let in_place = match self.kind {
                    Kind::AllReduce | Kind::Broadcast | Kind::Reduce | Kind::AllToAll => {
                        self.send == self.recv
                    }
                    Kind::AllGather => self.send == self.recv + rank * self.count * esz,
                    Kind::ReduceScatter => self.recv == self.send + rank * self.count * esz,
                    Kind::Send | Kind::Recv => false,
                };
                if !in_place && overlap(self.send, s_len * esz, self.recv, r_len * esz) {
                    return Err(Failure::invalid_argument(format!(
                        "{name}: sendbuff and recvbuff overlap without being NCCL's in-place \
                         layout"
                    )));
                }
            }
            Memory::Device => {}
        }
        if let (Memory::Host, Op::PreMul(p)) = (self.memory, self.op) {
            if let Scalar::DevicePtr(at) = p.scalar {
                return Err(Failure::invalid_usage(format!(
                    "{name}: the PreMulSum operator's scalar is in device memory ({at:#x}) and \
                     the buffers in host memory: use a host scalar for host buffers"
                )));
            }
        }
        Ok(self)
    }
}

/// Element types and what PreMulSum needs of them.
pub trait Scale: Element {
    /// `self * s` in the type's arithmetic (integers wrap).
    fn scale(self, s: Self) -> Self;
}

macro_rules! scale_int {
    ($($t:ty),*) => {$(
        impl Scale for $t {
            fn scale(self, s: Self) -> Self { self.wrapping_mul(s) }
        }
    )*};
}
scale_int!(i8, u8, i32, u32, i64, u64);
impl Scale for f32 {
    fn scale(self, s: Self) -> Self {
        self * s
    }
}
impl Scale for f64 {
    fn scale(self, s: Self) -> Self {
        self * s
    }
}
impl Scale for half::f16 {
    fn scale(self, s: Self) -> Self {
        half::f16::from_f32(self.to_f32() * s.to_f32())
    }
}
impl Scale for half::bf16 {
    fn scale(self, s: Self) -> Self {
        half::bf16::from_f32(self.to_f32() * s.to_f32())
    }
}

/// Call `$f::<T>(args)` with `T` the Rust type of `$t`.
macro_rules! with_type {
    ($t:expr, $f:ident, $($a:expr),*) => {
        match $t {
            DataType::I8 => $f::<i8>($($a),*),
            DataType::U8 => $f::<u8>($($a),*),
            DataType::I32 => $f::<i32>($($a),*),
            DataType::U32 => $f::<u32>($($a),*),
            DataType::I64 => $f::<i64>($($a),*),
            DataType::U64 => $f::<u64>($($a),*),
            DataType::F16 => $f::<half::f16>($($a),*),
            DataType::F32 => $f::<f32>($($a),*),
            DataType::F64 => $f::<f64>($($a),*),
            DataType::Bf16 => $f::<half::bf16>($($a),*),
        }
    };
}

/// A slice of `len` elements at `ptr`.
///
/// # Safety
/// `ptr` is aligned and, where `len > 0`, non-NULL and valid for reads
/// of `len` elements that nothing writes while the slice lives.
unsafe fn read<'a, T>(ptr: usize, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: as the caller vouches.
    unsafe { std::slice::from_raw_parts(ptr as *const T, len) }
}

/// A mutable slice of `len` elements at `ptr`.
///
/// # Safety
/// As [`read`], for writes, and nothing else reads or writes the memory
/// while the slice lives.
unsafe fn write<'a, T>(ptr: usize, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: as the caller vouches.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut T, len) }
}

/// The scalar of a PreMulSum operator as a `T`.
///
/// # Safety
/// A `Scalar::HostPtr` points at a readable `T`.
unsafe fn scalar<T: Element>(s: Scalar) -> Result<T, Failure> {
    match s {
        Scalar::Value(bytes) => Ok(bytemuck::pod_read_unaligned(
            &bytes[..std::mem::size_of::<T>()],
        )),
        // SAFETY: as the caller vouches; read unaligned, so any address works.
        Scalar::HostPtr(p) => Ok(unsafe { std::ptr::read_unaligned(p as *const T) }),
        // `check` refuses such an operator on host buffers first.
        Scalar::DevicePtr(p) => Err(Failure::invalid_usage(format!(
            "a PreMulSum scalar in device memory ({p:#x}) on a host call"
        ))),
    }
}

/// Run a checked host call.
///
/// # Safety
/// The buffers of `call` are valid host memory of the lengths NCCL
/// defines for it, untouched by anything else until this returns.
pub unsafe fn run_host(comm: &Communicator, call: &Call) -> Result<(), Failure> {
    // SAFETY: forwarded from the caller.
    with_type!(call.dtype, host_typed, comm, call)
}

/// [`run_host`] for element type `T` (that of `c.dtype`).
///
/// # Safety
/// As [`run_host`].
unsafe fn host_typed<T: Scale>(comm: &Communicator, c: &Call) -> Result<(), Failure> {
    let (rank, size) = (comm.rank(), comm.size());
    let (s_len, r_len) = c.lengths(rank, size)?;
    let esz = std::mem::size_of::<T>();
    // PreMulSum: the caller's input times the scalar, then a sum from
    // that copy (the caller's input stays as it was).
    let (op, scaled) = match c.op {
        Op::PreMul(p) => {
            // SAFETY: a host scalar pointer was checked to be host memory
            // when the operator was made; the input as the caller vouches.
            let (s, input) = unsafe { (scalar::<T>(p.scalar)?, read::<T>(c.send, s_len)) };
            let v: Vec<T> = input.iter().map(|&x| x.scale(s)).collect();
            (ReduceOp::Sum, Some(v))
        }
        Op::Builtin(op) => (op, None),
        Op::None => (ReduceOp::Sum, None),
    };
    // SAFETY (every block below): `check` made sure the pointers are
    // non-NULL where used, aligned, and either exactly NCCL's in-place
    // layout or not overlapping; the caller vouches for the memory.
    let r = match c.kind {
        Kind::AllReduce => match &scaled {
            Some(v) => comm.all_reduce(v, unsafe { write(c.recv, r_len) }, op),
            None if c.send == c.recv => {
                comm.all_reduce_in_place(unsafe { write::<T>(c.recv, r_len) }, op)
            }
            None => comm.all_reduce(
                unsafe { read::<T>(c.send, s_len) },
                unsafe { write(c.recv, r_len) },
                op,
            ),
        },
        Kind::Reduce => {
            // Off the root `r_len` is 0: NCCL's recvbuff is unused there
            // (and may be NULL).
            match &scaled {
                Some(v) => comm.reduce(v, unsafe { write(c.recv, r_len) }, op, c.root),
                None if c.send == c.recv => {
                    comm.reduce_in_place(unsafe { write::<T>(c.send, s_len) }, op, c.root)
                }
                None => comm.reduce(
                    unsafe { read::<T>(c.send, s_len) },
                    unsafe { write(c.recv, r_len) },
                    op,
                    c.root,
                ),
            }
        }
        Kind::ReduceScatter => match &scaled {
            Some(v) => comm.reduce_scatter(v, unsafe { write(c.recv, r_len) }, op),
            None if c.recv == c.send + rank * c.count * esz => {
                comm.reduce_scatter_in_place(unsafe { write::<T>(c.send, s_len) }, op)
            }
            None => comm.reduce_scatter(
                unsafe { read::<T>(c.send, s_len) },
                unsafe { write(c.recv, r_len) },
                op,
            ),
        },
        Kind::AllGather => {
            if c.send == c.recv + rank * c.count * esz {
                comm.all_gather_in_place(unsafe { write::<T>(c.recv, r_len) })
            } else {
                comm.all_gather(unsafe { read::<T>(c.send, s_len) }, unsafe {
                    write(c.recv, r_len)
                })
            }
        }
        Kind::Broadcast => {
            if rank == c.root && c.send != c.recv {
                unsafe { write::<T>(c.recv, r_len) }
                    .copy_from_slice(unsafe { read::<T>(c.send, s_len) });
            }
            comm.broadcast(unsafe { write::<T>(c.recv, r_len) }, c.root)
        }
        Kind::AllToAll => {
            if c.send == c.recv {
                let copy = unsafe { read::<T>(c.send, s_len) }.to_vec();
                comm.all_to_all(&copy, unsafe { write(c.recv, r_len) })
            } else {
                comm.all_to_all(unsafe { read::<T>(c.send, s_len) }, unsafe {
                    write(c.recv, r_len)
                })
            }
        }
        Kind::Send => comm.send(unsafe { read::<T>(c.send, s_len) }, c.root),
        Kind::Recv => comm.recv(unsafe { write::<T>(c.recv, r_len) }, c.root),
    };
    r.map_err(Failure::from)
}

/// Enqueue a checked device call on its stream.
///
/// # Safety
/// NCCL's contract for the buffers and the stream (the library's raw
/// entry points say it in full).
pub unsafe fn run_device(core: &Core, call: &Call) -> Result<(), Failure> {
    refuse_capture(call)?;
    let comm = &core.comm;
    let (s, r) = (call.send as *const c_void, call.recv as *mut c_void);
    let stream = call.stream as *mut c_void;
    let dt = call.dtype;
    let op = match call.op {
        Op::Builtin(op) => RawOp::Builtin(op),
        Op::None => RawOp::Builtin(ReduceOp::Sum),
        Op::PreMul(p) => RawOp::PreMulSum(match p.scalar {
            Scalar::Value(v) => PreMulScalar::Value(v),
            // Read now, when the call is enqueued.
            Scalar::HostPtr(at) => {
                let mut v = [0u8; 8];
                let n = call.dtype.size();
                // SAFETY: the operator's creator vouched for a readable
                // element of its type at `at` for every call that uses it.
                unsafe { std::ptr::copy_nonoverlapping(at as *const u8, v.as_mut_ptr(), n) };
                PreMulScalar::Value(v)
            }
            Scalar::DevicePtr(at) => PreMulScalar::Device(at as u64),
        }),
    };
    // SAFETY (each call): forwarded from the caller; the library checks
    // the pointers and stream with the driver before enqueueing.
    let work = unsafe {
        match call.kind {
            Kind::AllReduce => comm.all_reduce_raw(s, r, call.count, dt, op, stream),
            Kind::ReduceScatter => comm.reduce_scatter_raw(s, r, call.count, dt, op, stream),
            Kind::AllGather => comm.all_gather_raw(s, r, call.count, dt, stream),
            Kind::Broadcast => {
                // Off the root NCCL allows a NULL sendbuff; in place there
                // reads nothing.
                let s = if s.is_null() { r as *const c_void } else { s };
                comm.broadcast_raw(s, r, call.count, dt, call.root, stream)
            }
            Kind::Reduce => {
                // Off the root NCCL allows a NULL recvbuff; in place there
                // leaves the input as it is.
                let r = if r.is_null() { s as *mut c_void } else { r };
                comm.reduce_raw(s, r, call.count, dt, op, call.root, stream)
            }
            Kind::Send => comm.send_raw(s, call.count, dt, call.root, stream),
            Kind::Recv => comm.recv_raw(r, call.count, dt, call.root, stream),
            Kind::AllToAll => comm.all_to_all_raw(s, r, call.count, dt, stream),
        }
    }
    .map_err(Failure::from)?;
    *core.pending.lock().unwrap_or_else(|p| p.into_inner()) = Some(work);
    Ok(())
}

/// Refuse a call on a stream that is being captured into a CUDA graph:
/// the device path synchronises with the host, which a graph cannot
/// replay, so such a call would be corrupted rather than captured.
fn refuse_capture(call: &Call) -> Result<(), Failure> {
    use ferroccl::cuda::cudarc::driver::sys;
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: only reached with device buffers, so the driver library is
    // loaded and new enough; the caller vouches that the stream is live
    // (NULL is the legacy default stream); one status is written.
    let rc = unsafe { sys::cuStreamIsCapturing(call.stream as sys::CUstream, &mut status) };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(Failure::invalid_argument(format!(
            "{}: stream {:#x}: cuStreamIsCapturing failed ({rc:?})",
            call.kind.name(),
            call.stream
        )));
    }
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Err(Failure::invalid_usage(format!(
            "{}: stream {:#x} is being captured into a CUDA graph ({status:?}); ferroccl cannot              capture its calls yet: issue them outside the capture",
            call.kind.name(),
            call.stream
        )));
    }
    Ok(())
}

/// Run a checked call where its memory is.
///
/// # Safety
/// As [`run_host`] or [`run_device`].
pub unsafe fn run(core: &Core, call: &Call) -> Result<(), Failure> {
    // SAFETY: forwarded from the caller.
    unsafe {
        match call.memory {
            Memory::Host => run_host(&core.comm, call),
            Memory::Device => run_device(core, call),
        }
    }
}

/// The same call on elements `[from, from + n)` of its buffer: the piece
/// of a point-to-point call that the group schedule sends or receives in
/// one round.
pub fn piece(call: &Call, from: usize, n: usize) -> Call {
    let off = from * call.dtype.size();
    Call {
        send: if call.send != 0 { call.send + off } else { 0 },
        recv: if call.recv != 0 { call.recv + off } else { 0 },
        count: n,
        ..*call
    }
}
