//! InfiniBand / RoCE transport of ferroccl, in progress: the protocol
//! apart from the verbs.
//!
//! - [`verbs`] is what the RDMA data path needs from verbs, as two small
//!   traits ([`Device`] and [`QueuePair`]) modelled on ibverbs reliable
//!   connected queue pairs: registration giving `(lkey, rkey)`, RDMA WRITE
//!   and WRITE WITH IMMEDIATE, completions, the queue pair's state.
//! - [`emu`] implements them in process ([`EmuFabric`]), enforcing what
//!   RC hardware does: in-order execution and completion, rkey and bounds
//!   checks (remote access error, queue pair to error), flushing once in
//!   error, a dead peer, the send queue's depth.
//!
//! Not written yet: the real verbs on the `ibverbs` crate behind feature
//! `ib`, connection set-up, the receiver-driven data path (clear-to-send
//! FIFO), a registration cache, dma-buf registration of GPU memory. No
//! machine here has an RDMA device (no kernel support, not even
//! soft-RoCE), so the emulation is how the logic is tested. See
//! `docs/ib.md`.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod conn;
pub mod emu;
pub mod emu_transport;
pub mod verbs;

pub use conn::{EndInfo, EndParts, Geometry, IbCloser, IbReceiver, IbSender, LocalRegions};
pub use emu::{EmuDevice, EmuFabric, EmuQp, FabricStats};
pub use emu_transport::EmuTransport;
pub use verbs::{
    Completion, CompletionKind, Device, LocalSlice, MemoryRegion, MrHandle, QpState, QueuePair,
    RemoteSlice, VerbsError, WcError, WriteRequest,
};
