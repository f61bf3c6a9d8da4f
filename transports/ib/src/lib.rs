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
// Without feature `ib` no unsafe at all; with it, only `real` (the FFI to
// libibverbs) may opt in, every block with its `// SAFETY:` comment.
#![cfg_attr(not(feature = "ib"), forbid(unsafe_code))]
#![cfg_attr(feature = "ib", deny(unsafe_code))]
#![warn(missing_docs, unreachable_pub)]

pub mod config;
pub mod conn;
pub mod emu;
pub mod emu_transport;
#[cfg(feature = "ib")]
pub mod real;
pub mod select;
pub mod setup;
pub mod verbs;
#[cfg(feature = "ib")]
pub mod verbs_fabric;

#[cfg(not(feature = "ib"))]
pub use config::probe;
pub use config::{
    choose_gid, decide, select_ports, ConfigError, Decision, Endpoint, EndpointError, Gid, GidKind,
    HcaItem, HcaSpec, IbConfig, LinkLayer, Port, ProbeError,
};
pub use conn::{EndInfo, EndParts, Geometry, IbCloser, IbReceiver, IbSender, LocalRegions};
pub use emu::{EmuDevice, EmuFabric, EmuQp, FabricStats};
#[cfg(feature = "ib")]
pub use real::{probe, IbDevice, IbError, IbQp, PendingQp};
pub use setup::{Fabric, NetTransport};
pub use verbs::{
    Completion, CompletionKind, Device, LocalSlice, MemoryRegion, MrHandle, QpState, QueuePair,
    RemoteSlice, VerbsError, WcError, WriteRequest,
};
