//! ferroccl-nccl: NCCL's C API on ferroccl, built as `libnccl.so.2`.
//!
//! Every entry point of `include/nccl.h` is here, with NCCL's types and
//! values (`abi`). Buffers in host memory run the library's host
//! collectives synchronously (the stream is ignored); buffers in CUDA
//! device memory go to its raw device entry points, enqueued on the
//! caller's stream. Group calls collect and order (`group`). Entry points
//! this library does not support yet return `ncclInvalidUsage` with a
//! message for `ncclGetLastError`. No panic crosses into C (`status`).
//! docs/nccl.md is the user's page.
//!
//! This crate owns the C boundary only: it must not reach into the
//! library's internals, only its public API.
//!
//! The entry points live in `exports`, one file per family; they are
//! re-exported here so that Rust callers see them at the crate root as
//! before.

pub mod abi;
pub mod call;
pub mod comm;
pub mod exports;
pub mod group;
pub mod profiling;
pub mod status;
pub mod uid;

pub use exports::collectives::*;
pub use exports::info::*;
pub use exports::life::*;
pub use exports::memory::*;
pub use exports::p2p_group::*;
pub use exports::unsupported::*;

pub(crate) use exports::life::split;

use comm::Handle;

/// `ncclComm_t`.
pub type NcclComm = *mut Handle;
