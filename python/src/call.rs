//! One call of the Python module: what Python named (the collective, the
//! buffers by address and length, the element type, the reduction, the
//! root), checked, its buffers made slices, forwarded to the library's
//! public API (host) or its raw device entry points.

use crate::error::CallError;
use ferroccl::cuda::RawOp;
use ferroccl::{Communicator, DataType, Element, Error, ReduceOp};
use std::ffi::c_void;

/// The collectives a Python caller can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    Send,
    Recv,
    AllToAll,
    Barrier,
}

impl Kind {
    const ALL: [Kind; 9] = [
        Kind::AllReduce,
        Kind::ReduceScatter,
        Kind::AllGather,
        Kind::Broadcast,
        Kind::Reduce,
        Kind::Send,
        Kind::Recv,
        Kind::AllToAll,
        Kind::Barrier,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllGather => "all_gather",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::Send => "send",
            Kind::Recv => "recv",
            Kind::AllToAll => "all_to_all",
            Kind::Barrier => "barrier",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// One call as Python described it: buffers by address and length in
/// elements.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) kind: Kind,
    pub(crate) send: usize,
    pub(crate) send_len: usize,
    pub(crate) recv: usize,
    pub(crate) recv_len: usize,
    pub(crate) dtype: DataType,
    pub(crate) op: ReduceOp,
    /// Root, or the peer of send/recv.
    pub(crate) root: usize,
    /// This call's number on the communicator (from 1), for errors.
    pub(crate) seq: u64,
}

/// How the buffers of a checked host call are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Disjoint send and receive buffers.
    OutOfPlace,
    /// One buffer, NCCL's in-place layout for the collective.
    InPlace,
}

fn overlap(a: usize, a_len: usize, b: usize, b_len: usize) -> bool {
    a_len > 0 && b_len > 0 && a < b + b_len && b < a + a_len
}

impl Call {
    pub(crate) fn what(&self) -> String {
        format!("{} #{}", self.kind.name(), self.seq)
    }

    /// Local checks of a host call: NULL, alignment, overlap that is not
    /// the in-place layout. Lengths against the rank count are the
    /// library's to check.
    fn check_host(&self, rank: usize) -> Result<Layout, String> {
        let esz = self.dtype.size();
        for (ptr, len, label) in [
            (self.send, self.send_len, "input"),
            (self.recv, self.recv_len, "output"),
        ] {
            if len > 0 && ptr == 0 {
                return Err(format!("{}: the {label} is a NULL pointer", self.what()));
            }
            if len > 0 && ptr % esz != 0 {
                return Err(format!(
                    "{}: the {label} at {ptr:#x} is not aligned to its {esz}-byte {} elements",
                    self.what(),
                    self.dtype
                ));
            }
        }
        let in_place = match self.kind {
            Kind::AllReduce | Kind::Broadcast | Kind::Reduce | Kind::AllToAll => {
                self.send == self.recv && self.send_len == self.recv_len
            }
            Kind::AllGather => self.send == self.recv + rank * self.send_len * esz,
            Kind::ReduceScatter => self.recv == self.send + rank * self.recv_len * esz,
            Kind::Send | Kind::Recv | Kind::Barrier => false,
        };
        if in_place {
            return Ok(Layout::InPlace);
        }
        if overlap(
            self.send,
            self.send_len * esz,
            self.recv,
            self.recv_len * esz,
        ) {
            return Err(format!(
                "{}: input and output overlap without being the in-place layout (the same \
                 buffer, or for a gather the output's block of this rank)",
                self.what()
            ));
        }
        Ok(Layout::OutOfPlace)
    }
}

/// Call `$f::<T>(args)` with `T` the Rust type of a `DataType`.
macro_rules! with_type {
    ($t:expr, $f:ident, $($a:expr),*) => {
        match $t {
            DataType::F32 => $f::<f32>($($a),*),
            DataType::F64 => $f::<f64>($($a),*),
            DataType::F16 => $f::<half::f16>($($a),*),
            DataType::Bf16 => $f::<half::bf16>($($a),*),
            DataType::I8 => $f::<i8>($($a),*),
            DataType::U8 => $f::<u8>($($a),*),
            DataType::I32 => $f::<i32>($($a),*),
            DataType::U32 => $f::<u32>($($a),*),
            DataType::I64 => $f::<i64>($($a),*),
            DataType::U64 => $f::<u64>($($a),*),
        }
    };
}

/// # Safety
/// `ptr` is aligned, and where `len > 0` valid for reads of `len`
/// elements that nothing writes while the slice lives.
unsafe fn read<'a, T>(ptr: usize, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: as the caller vouches.
    unsafe { std::slice::from_raw_parts(ptr as *const T, len) }
}

/// # Safety
/// As [`read`], for writes, and nothing else touches the memory while the
/// slice lives.
unsafe fn write<'a, T>(ptr: usize, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: as the caller vouches.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut T, len) }
}

/// A checked host call's buffers as slices of its element type `T`: what
/// every arm of [`host_typed`] hands the library.
impl Call {
    /// The input, read.
    ///
    /// # Safety
    /// As [`read`], for `send` and `send_len`.
    unsafe fn input<'a, T>(&self) -> &'a [T] {
        // SAFETY: as the caller vouches.
        unsafe { read(self.send, self.send_len) }
    }

    /// The input, written: the one buffer of an in-place call whose
    /// layout is the input's (reduce-scatter, reduce).
    ///
    /// # Safety
    /// As [`write`], for `send` and `send_len`.
    unsafe fn input_mut<'a, T>(&self) -> &'a mut [T] {
        // SAFETY: as the caller vouches.
        unsafe { write(self.send, self.send_len) }
    }

    /// The output, written.
    ///
    /// # Safety
    /// As [`write`], for `recv` and `recv_len`.
    unsafe fn output<'a, T>(&self) -> &'a mut [T] {
        // SAFETY: as the caller vouches.
        unsafe { write(self.recv, self.recv_len) }
    }
}

/// Run a checked host call of element type `T`.
///
/// # Safety
/// The buffers are live host memory of the given lengths, kept alive and
/// untouched by anything else until this returns (the Python layer holds
/// them); `layout` is what `check_host` found.
unsafe fn host_typed<T: Element>(
    comm: &Communicator,
    c: &Call,
    layout: Layout,
) -> ferroccl::Result<()> {
    let in_place = layout == Layout::InPlace;
    // SAFETY (every block below): `check_host` made sure the pointers are
    // non-NULL where used, aligned, and either one buffer in the in-place
    // layout (then only `write` of the whole buffer is made) or disjoint;
    // the caller vouches for the memory.
    unsafe {
        match c.kind {
            Kind::AllReduce if in_place => comm.all_reduce_in_place(c.output::<T>(), c.op),
            Kind::AllReduce => comm.all_reduce(c.input::<T>(), c.output(), c.op),
            Kind::ReduceScatter if in_place => {
                comm.reduce_scatter_in_place(c.input_mut::<T>(), c.op)
            }
            Kind::ReduceScatter => comm.reduce_scatter(c.input::<T>(), c.output(), c.op),
            Kind::AllGather if in_place => comm.all_gather_in_place(c.output::<T>()),
            Kind::AllGather => comm.all_gather(c.input::<T>(), c.output()),
            Kind::Broadcast => {
                if !in_place && comm.rank() == c.root {
                    if c.send_len != c.recv_len {
                        return Err(Error::InvalidArgument(format!(
                            "{}: the root's input has {} elements and its output {}",
                            c.what(),
                            c.send_len,
                            c.recv_len
                        )));
                    }
                    c.output::<T>().copy_from_slice(c.input::<T>());
                }
                comm.broadcast(c.output::<T>(), c.root)
            }
            Kind::Reduce if in_place => comm.reduce_in_place(c.input_mut::<T>(), c.op, c.root),
            Kind::Reduce => comm.reduce(c.input::<T>(), c.output(), c.op, c.root),
            Kind::AllToAll if in_place => {
                // The library's all-to-all is out of place: a copy of the
                // input is the send side.
                let copy = c.input::<T>().to_vec();
                comm.all_to_all(&copy, c.output())
            }
            Kind::AllToAll => comm.all_to_all(c.input::<T>(), c.output()),
            Kind::Send => comm.send(c.input::<T>(), c.root),
            Kind::Recv => comm.recv(c.output::<T>(), c.root),
            Kind::Barrier => comm.barrier(),
        }
    }
}

/// Run a host call: checks, then the typed call.
///
/// # Safety
/// As [`host_typed`].
pub(crate) unsafe fn run_host(comm: &Communicator, c: &Call) -> Result<(), CallError> {
    let layout = c
        .check_host(comm.rank())
        .map_err(|m| CallError::new(comm, c, Error::InvalidArgument(m)))?;
    // SAFETY: forwarded from the caller.
    unsafe { with_type!(c.dtype, host_typed, comm, c, layout) }
        .map_err(|e| CallError::new(comm, c, e))
}

/// Enqueue a device call on `stream` through the raw entry points.
///
/// # Safety
/// The raw entry points' contract: device buffers of the given lengths
/// (or host memory the driver knows), a live stream of the current
/// context, the buffers untouched by other work until the stream passes
/// the call.
pub(crate) unsafe fn run_device(
    comm: &Communicator,
    c: &Call,
    stream: usize,
) -> Result<ferroccl::DeviceWork, CallError> {
    let (s, r) = (c.send as *const c_void, c.recv as *mut c_void);
    let st = stream as *mut c_void;
    let op = RawOp::Builtin(c.op);
    // SAFETY (each call): forwarded from the caller; the library checks
    // the pointers and the stream with the driver before enqueueing.
    let work = unsafe {
        match c.kind {
            Kind::AllReduce => comm.all_reduce_raw(s, r, c.recv_len, c.dtype, op, st),
            Kind::ReduceScatter => comm.reduce_scatter_raw(s, r, c.recv_len, c.dtype, op, st),
            Kind::AllGather => comm.all_gather_raw(s, r, c.send_len, c.dtype, st),
            Kind::Broadcast => comm.broadcast_raw(s, r, c.recv_len, c.dtype, c.root, st),
            Kind::Reduce => comm.reduce_raw(s, r, c.send_len, c.dtype, op, c.root, st),
            Kind::AllToAll => {
                comm.all_to_all_raw(s, r, c.send_len / comm.size().max(1), c.dtype, st)
            }
            Kind::Send => comm.send_raw(s, c.send_len, c.dtype, c.root, st),
            Kind::Recv => comm.recv_raw(r, c.recv_len, c.dtype, c.root, st),
            Kind::Barrier => {
                return Err(CallError::new(
                    comm,
                    c,
                    Error::InvalidArgument("barrier takes no device buffer".into()),
                ))
            }
        }
    };
    work.map_err(|e| CallError::new(comm, c, e))
}
