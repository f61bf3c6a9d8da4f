//! ferroccl-cuda-ipc: device memory shared between the processes of one
//! host, for ranks whose buffers are on GPUs there. It implements no
//! transport of its own (no `Transport` from `ferroccl-transport`): the
//! library's device executor maps its FIFOs with it
//! (`ferroccl::comm::device_exec::share`), and the design below is that of those
//! FIFOs.
//!
//! # The design
//!
//! A connection is a FIFO of slots (DESIGN.md, "Data path"). For cuda-ipc
//! the FIFO lives in **device memory owned by the receiver**: the
//! receiving rank allocates it on its own GPU, and the sending rank maps
//! that memory into its own address space and writes the slots (and the
//! tail counter) with its kernels' ordinary stores; the receiver's
//! kernels read them from local memory. Writes cross the interconnect
//! (NVLink, PCIe) once, reads stay local.
//!
//! How the sender gets the mapping depends on where the two ranks are:
//!
//! - **Two processes**: the owner makes a [`SharedAlloc`], exports it and
//!   sends the peer its [`ShareHandle`] over the job's local channel;
//!   the peer makes a [`Mapped`] from it.
//!   - With CUDA's virtual memory management (VMM; where the device
//!     supports it with POSIX fd handles) the handle is a file
//!     descriptor: it crosses a Unix-domain socket as `SCM_RIGHTS`
//!     ancillary data ([`fdpass`]), beside the handle's 88 bytes.
//!   - Elsewhere the legacy IPC handle (`cuIpcGetMemHandle`) is 64 plain
//!     bytes inside the handle's 88, and nothing else travels.
//! - **One process** (several ranks as threads): the ranks share the raw
//!   device pointer ([`SharedAlloc::ptr`]); nothing is exported (the
//!   driver would refuse a legacy handle in its own process anyway).
//! - **One GPU**: ranks on the same device need no peer access; two
//!   devices need it, enabled with [`enable_peer_access`] (in-process)
//!   or granted in the mapping's access list (VMM), and only where
//!   [`can_access_peer`] says the pair can.
//!
//! What is here: [`fdpass`] (descriptors over a Unix socket, bounded by a
//! deadline, and who the peer process is), `handle` ([`ShareHandle`] and its versioned wire form) and
//! [`vmm`] (the allocations and mappings over the driver API of
//! `cudarc::driver::sys`, loaded at run time), and [`host`], the same
//! sharing for the host stand-in of a GPU (a shared file in place of
//! device memory), with which CI runs the cross-process executor. Without a driver every
//! device call is [`CudaError::NoDevice`](ferroccl_cuda::CudaError), never
//! a panic. docs/cuda-ipc.md describes it in full.
#![warn(missing_docs, unreachable_pub)]

pub mod fdpass;
pub mod handle;
pub mod host;
pub mod vmm;

pub use fdpass::{peer_pid, recv_exact_fds, recv_fds, send_fds, FdPassError};
pub use handle::{round_up, ShareHandle, WireError, LEGACY_GRANULARITY, WIRE_LEN};
pub use host::{HostMapped, HostShared};
pub use vmm::{
    can_access_peer, enable_peer_access, make_current, support, Mapped, Mechanism, SharedAlloc,
    Support,
};
