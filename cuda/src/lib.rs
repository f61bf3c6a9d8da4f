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
//! types and ops to [`DataType`] and [`ReduceOp`] and its errors from [`CudaError`].

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

/// The element types and operators the kernels know: the one vocabulary
/// of every ferroccl crate (`ferroccl-types`). The kernel table is in the
/// order of `DataType::ALL` and `ReduceOp::ALL`; `Avg` reduces as `Sum`,
/// and the division by the rank count is done once, on the GPU, by the
/// finishing kernel.
pub use ferroccl_types::{DataType, ReduceOp};
