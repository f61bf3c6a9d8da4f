//! Which transports a communicator may use, in preference order
//! (cuda-ipc > shm > ib > tcp, of those compiled in and present), or the one
//! FERROCCL_TRANSPORT forces.

use crate::config::Config;
use crate::error::{Error, Result};
use ferroccl_transport::{SharedMemory, Transport};
use std::sync::Arc;

/// Names accepted by FERROCCL_TRANSPORT.
pub const TRANSPORT_NAMES: [&str; 4] = ["shm", "tcp", "mem", "ib-emu"];

/// Transports that join only ranks that are threads of one process.
pub(crate) const IN_PROCESS: [&str; 2] = ["mem", "ib-emu"];

/// The transports a communicator listens on, in preference order: each peer
/// is reached by the first whose `can_connect` holds for both ranks (shm for
/// ranks of one host, TCP otherwise). A forced transport is the only one; if
/// it cannot reach a peer, connecting to that peer fails with a message
/// naming it.
pub(crate) fn select(config: &Config) -> Result<Vec<Arc<dyn Transport>>> {
    let shm =
        || Arc::new(ferroccl_shm::ShmTransport::with_dir(shm_dir(config))) as Arc<dyn Transport>;
    let tcp = || Arc::new(ferroccl_tcp::TcpTransport::new()) as Arc<dyn Transport>;
    match config.transport.as_deref() {
        None => Ok(vec![shm(), tcp()]),
        Some("shm") => Ok(vec![shm()]),
        Some("tcp") => Ok(vec![tcp()]),
        Some("mem") => Ok(vec![Arc::new(ferroccl_transport::mem::MemTransport)]),
        Some("ib-emu") => Ok(vec![Arc::new(ferroccl_ib::emu_transport::transport(
            config.ib_qps_per_connection,
        ))]),
        Some(other) => Err(Error::InvalidArgument(format!(
            "unknown transport '{other}' (FERROCCL_TRANSPORT); known: {}",
            TRANSPORT_NAMES.join(", ")
        ))),
    }
}

/// Memory every rank of this host can map (windows, check-in control
/// pages), in FERROCCL_SHM_DIR: None where FERROCCL_TRANSPORT forbids
/// sharing memory (tcp). The one place that names the shared-memory crate
/// for this; whether the ranks are on one host is the caller's question.
pub(crate) fn shared_memory(config: &Config) -> Option<Arc<dyn SharedMemory>> {
    match config.transport.as_deref() {
        Some("tcp") => None,
        _ => Some(Arc::new(ferroccl_shm::ShmMemory::new(shm_dir(config)))),
    }
}

/// The directory of shared-memory files: FERROCCL_SHM_DIR, else the shm
/// crate's default (/dev/shm).
fn shm_dir(config: &Config) -> std::path::PathBuf {
    config
        .shm_dir
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from(ferroccl_shm::DEFAULT_DIR))
}
