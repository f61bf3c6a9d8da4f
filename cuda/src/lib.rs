//! ferroccl-cuda: the CUDA half of ferroccl's glue.
//!
//! - `probe`: is there a driver and a device (every device call starts
//!   here; without one it returns [`CudaError::NoDevice`] with the reason,
//!   never a panic: cudarc panics when libcuda is missing, so it is only
//!   called after the library and the driver version have been checked);
//! - `kernels`: the reduction kernels, one source (`kernels/reduce.cu`)
//!   from which every (op, type) is instantiated; `executor`: the device
//!   executor's kernels (`kernels/executor.cu`, one per protocol, op and
//!   type) and the structures the launcher shares with them; `nvrtc`:
//!   compiling both at first use for the device's own architecture;
//! - `device`: the [`device::Engine`] trait that every device path of the
//!   library goes through (memory, streams, events, gates, copies,
//!   kernels, executor launches) and the handles it deals in;
//! - `cuda_engine`: [`cuda_engine::CudaEngine`], the `Engine` on a real GPU
//!   (CUDA driver API; kernels compiled for the device's architecture at
//!   its first engine in the process);
//! - `host_engine`: [`host_engine::HostEngine`], the `Engine`'s host
//!   stand-in, on which the tests run every device path, with `scalar`,
//!   its element-at-a-time kernels;
//! - `stager`: the [`stager::Stager`], the order of copies, transfers and
//!   kernels that carries a collective on device buffers through pinned
//!   host memory;
//! - `topo`: which GPU a device is (UUID, PCI bus id, NUMA node) and
//!   whether two devices reach each other, for the library's `gpu_path`.
//!
//! The crate does not depend on `ferroccl`: the library maps its element
//! types and ops to [`Ty`] and [`Op`] and its errors from [`CudaError`].

pub mod cuda_engine;
pub mod device;
pub mod error;
pub mod executor;
pub mod host_engine;
pub mod kernels;
pub mod nvrtc;
pub mod probe;
pub mod scalar;
pub mod stager;
pub mod topo;

/// The cudarc this crate is built on (0.19: driver API and NVRTC, loaded at
/// run time), for callers whose buffers and streams must be its types.
pub use cudarc;
pub use error::{CudaError, Result};

use std::sync::{Mutex, MutexGuard};

/// A lock that survives a panicked holder: the engines' and the stager's
/// state stays consistent between statements, so a poisoned lock is still
/// usable, and a panic elsewhere must not turn into a second one here.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An argument the engine or stager refuses, with what was wrong.
pub(crate) fn bad(what: String) -> CudaError {
    CudaError::InvalidArgument(what)
}

/// An element type the kernels reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ty {
    F32,
    F64,
    F16,
    Bf16,
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
}

impl Ty {
    /// Every type, in the order of the kernel table.
    pub const ALL: [Ty; 10] = [
        Ty::F32,
        Ty::F64,
        Ty::F16,
        Ty::Bf16,
        Ty::I8,
        Ty::U8,
        Ty::I32,
        Ty::U32,
        Ty::I64,
        Ty::U64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Ty::I8 | Ty::U8 => 1,
            Ty::F16 | Ty::Bf16 => 2,
            Ty::F32 | Ty::I32 | Ty::U32 => 4,
            Ty::F64 | Ty::I64 | Ty::U64 => 8,
        }
    }

    /// The short name used in kernel names and messages (`f32`, `bf16`).
    pub const fn name(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::F64 => "f64",
            Ty::F16 => "f16",
            Ty::Bf16 => "bf16",
            Ty::I8 => "i8",
            Ty::U8 => "u8",
            Ty::I32 => "i32",
            Ty::U32 => "u32",
            Ty::I64 => "i64",
            Ty::U64 => "u64",
        }
    }

    /// Whether the type is a floating-point one (has NaN).
    pub const fn is_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64 | Ty::F16 | Ty::Bf16)
    }
}

/// A reduction the kernels perform. `Avg` reduces as `Sum`; the division
/// by the rank count is done once, on the GPU, by the finishing kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
}

impl Op {
    /// Every op, in the order of the kernel table.
    pub const ALL: [Op; 5] = [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::Avg];

    /// The short name used in kernel names and messages.
    pub const fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Min => "min",
            Op::Max => "max",
            Op::Avg => "avg",
        }
    }
}
