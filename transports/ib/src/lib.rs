//! InfiniBand / RoCE transport of ferroccl (issue 17).
//!
//! - [`verbs`]: what the RDMA data path needs from verbs, as two small
//!   traits ([`Device`] and [`QueuePair`]) modelled on ibverbs reliable
//!   connected queue pairs.
//! - [`conn`]: the receiver-driven data path of one connection over them
//!   (clear-to-send entries, slots, striping over queue pairs, endings,
//!   failure reports).
//! - [`setup`]: connection set-up over a socket for any [`Fabric`], and
//!   the transport [`NetTransport`]; [`select`]: whether a communicator
//!   gets it (fallback to TCP).
//! - [`regcache`]: caller memory declared to stay put ([`MemoryLease`],
//!   [`UserBuffer`]) and the cache of its registrations ([`RegCache`]),
//!   from which large frames are sent without the staging copy.
//! - [`emu`]: the verbs emulated in process ([`EmuFabric`]), with RC
//!   semantics; [`emu_transport`]: the transport `ib-emu` on it, ranks as
//!   threads.
//! - `real` and `verbs_fabric` (feature `ib`): the real verbs on
//!   libibverbs. [`config`]: FERROCCL_IB_* settings, port and GID choice.
//!
//! No machine here has an RDMA device (no kernel support, not even
//! soft-RoCE), so the emulation is how the logic is tested; nothing has run
//! on a real fabric. See `docs/ib.md`.
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
pub mod regcache;
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
pub use regcache::{CacheLimits, CacheStats, MemoryLease, RegCache, UserBuffer, ZeroCopyConfig};
pub use setup::{Fabric, NetTransport};
pub use verbs::{
    Completion, CompletionKind, Device, LocalSlice, MemoryRegion, MrHandle, QpState, QueuePair,
    RemoteSlice, UserMemory, VerbsError, WcError, WriteRequest,
};
