//! Which transports a communicator may use, in preference order
//! (shm > ib > tcp, of those compiled in and present), or the one
//! FERROCCL_TRANSPORT forces (also `mem` and `ib-emu` for ranks that are
//! threads). cuda-ipc is not among them: it shares the device executor's
//! FIFO memory (`comm::device_exec::share`) and carries no frames. `ib` needs feature `ib` and an RDMA port;
//! without them it falls back to TCP with one INFO line (DEBUG in builds
//! without the feature), or, forced, is an error naming what is missing.

use crate::config::Config;
use crate::error::{Error, Result};
use ferroccl_transport::{SharedMemory, Transport};
use std::sync::Arc;

/// Names accepted by FERROCCL_TRANSPORT.
pub const TRANSPORT_NAMES: [&str; 5] = ["shm", "ib", "tcp", "mem", "ib-emu"];

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
    // InfiniBand / RoCE where this build has the real verbs (feature `ib`)
    // and a usable port; otherwise one INFO line and TCP, or, when forced,
    // an error saying what is missing.
    let ib = |forced: bool| -> Result<Option<Arc<dyn Transport>>> {
        match ferroccl_ib::select::select(forced, &config.ib) {
            Ok(ferroccl_ib::select::Selected::Use(t)) => Ok(Some(t)),
            Ok(ferroccl_ib::select::Selected::FallBack(reason)) => {
                if cfg!(feature = "ib") {
                    tracing::info!(rank = config.rank, "{reason}");
                } else {
                    tracing::debug!(rank = config.rank, "{reason}");
                }
                Ok(None)
            }
            Err(message) => Err(Error::Env(message)),
        }
    };
    match config.transport.as_deref() {
        None => Ok([Some(shm()), ib(false)?, Some(tcp())]
            .into_iter()
            .flatten()
            .collect()),
        Some("ib") => Ok(ib(true)?.into_iter().collect()),
        Some("shm") => Ok(vec![shm()]),
        Some("tcp") => Ok(vec![tcp()]),
        Some("mem") => Ok(vec![Arc::new(ferroccl_transport::mem::MemTransport)]),
        Some("ib-emu") => Ok(vec![Arc::new(ferroccl_ib::emu_transport::transport(
            usize::from(config.ib.qps_per_connection),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config(transport: Option<&str>) -> Config {
        let mut c = Config::new(0, 2, "127.0.0.1", 1, 7).expect("config");
        c.transport = transport.map(str::to_string);
        c
    }

    fn names(config: &Config) -> Vec<&'static str> {
        select(config)
            .expect("a selection")
            .iter()
            .map(|t| t.name())
            .collect()
    }

    /// Without an RDMA device (CI, this machine) the default is shared
    /// memory then TCP, with `ib` left out, not an error; forcing `ib`
    /// is an error that says why it cannot be used.
    #[test]
    fn ib_falls_back_to_tcp_unless_forced() {
        if ferroccl_ib::probe(&ferroccl_ib::IbConfig::default()).is_ok() {
            eprintln!("an RDMA device is present: the fallback is not what runs here");
            return;
        }
        assert_eq!(names(&config(None)), ["shm", "tcp"]);
        match select(&config(Some("ib"))) {
            Err(Error::Env(msg)) => {
                assert!(msg.contains("FERROCCL_TRANSPORT=ib"), "{msg}");
                let why = if cfg!(feature = "ib") {
                    "no RDMA device"
                } else {
                    "built without the `ib` feature"
                };
                assert!(msg.contains(why), "{msg}");
            }
            Err(other) => panic!("{other:?}"),
            Ok(ts) => panic!("forced ib gave {} transports", ts.len()),
        }
        assert_eq!(names(&config(Some("ib-emu"))), ["ib-emu"]);
        assert!(select(&config(Some("infiniband"))).is_err());
    }
}
