//! Whether a communicator gets the InfiniBand transport: the fallback rule
//! of [`crate::decide`] applied to this build and this machine.
//!
//! - `FERROCCL_TRANSPORT=ib` (forced): the real verbs on the ports
//!   FERROCCL_IB_HCA allows, or an error that says what is missing (built
//!   without feature `ib`, no RDMA device, no active port, none matching
//!   the filter). Bad settings are refused when they are read
//!   ([`IbConfig::from_lookup`]).
//! - Not forced: the real verbs where a usable port exists (the caller puts
//!   them after shared memory and before TCP), else a reason for one INFO
//!   line, and TCP.

use crate::config::{decide, Decision, IbConfig};
use ferroccl_transport::Transport;
use std::sync::Arc;

/// What selection found.
pub enum Selected {
    /// The transport to use.
    Use(Arc<dyn Transport>),
    /// Not used: the reason, for one INFO line (the caller uses TCP).
    FallBack(String),
}

/// The InfiniBand transport for a communicator with settings `cfg`
/// (already read and checked). `Err` only when `forced` and no port can be
/// used: the message says what is missing.
pub fn select(forced: bool, cfg: &IbConfig) -> Result<Selected, String> {
    match decide(forced, crate::probe(cfg)) {
        Decision::Use(ports) => Ok(Selected::Use(use_ports(ports, cfg.clone()))),
        Decision::FallBack { reason } => Ok(Selected::FallBack(reason)),
        Decision::Fail { message } => Err(message),
    }
}

#[cfg(feature = "ib")]
fn use_ports(ports: Vec<crate::Port>, cfg: IbConfig) -> Arc<dyn Transport> {
    let qps = usize::from(cfg.qps_per_connection);
    Arc::new(crate::setup::NetTransport::new(
        crate::verbs_fabric::VerbsFabric::new(ports, cfg),
        qps,
    ))
}

#[cfg(not(feature = "ib"))]
fn use_ports(_ports: Vec<crate::Port>, _cfg: IbConfig) -> Arc<dyn Transport> {
    unreachable!("without feature `ib` the probe finds no port")
}
