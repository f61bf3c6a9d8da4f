//! Which transports a communicator may use, in preference order
//! (cuda-ipc > shm > ib > tcp, of those compiled in and present), or the one
//! FERROCCL_TRANSPORT forces.

use crate::config::Config;
use crate::error::{Error, Result};
use ferroccl_transport::Transport;
use std::sync::Arc;

/// Names accepted by FERROCCL_TRANSPORT.
pub const TRANSPORT_NAMES: [&str; 2] = ["tcp", "mem"];

pub(crate) fn select(config: &Config) -> Result<Vec<Arc<dyn Transport>>> {
    match config.transport.as_deref() {
        None | Some("tcp") => Ok(vec![Arc::new(ferroccl_tcp::TcpTransport::new())]),
        Some("mem") => Ok(vec![Arc::new(ferroccl_transport::mem::MemTransport)]),
        Some(other) => Err(Error::InvalidArgument(format!(
            "unknown transport '{other}' (FERROCCL_TRANSPORT); known: {}",
            TRANSPORT_NAMES.join(", ")
        ))),
    }
}
