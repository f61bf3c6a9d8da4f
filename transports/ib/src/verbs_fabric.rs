//! The real verbs ([`crate::real`]) as a [`Fabric`] for the socket
//! set-up: the transport `ib`. Nothing here has run on an RDMA device
//! (docs/ib.md, "On a real fabric").

use crate::config::{Endpoint, IbConfig, Port};
use crate::real::{IbDevice, IbQp, PendingQp};
use crate::setup::Fabric;
use ferroccl_transport::ListenConfig;

/// The ports chosen by probing, and the settings.
#[derive(Debug)]
pub struct VerbsFabric {
    ports: Vec<Port>,
    cfg: IbConfig,
}

impl VerbsFabric {
    /// Over `ports` (at least one, from [`crate::probe`]).
    pub fn new(ports: Vec<Port>, cfg: IbConfig) -> Self {
        VerbsFabric { ports, cfg }
    }
}

impl Fabric for VerbsFabric {
    type Dev = IbDevice;
    type Qp = IbQp;
    type Prepared = PendingQp;

    fn name(&self) -> &'static str {
        "ib"
    }

    /// The ranks of a host share its ports round robin by rank (NCCL
    /// matches GPUs and NICs by PCI distance; ferroccl has no such
    /// topology for NICs yet).
    fn device(&self, config: &ListenConfig) -> Result<IbDevice, String> {
        let port = self
            .ports
            .get(config.rank % self.ports.len().max(1))
            .ok_or("no RDMA port")?;
        let dev = IbDevice::open(port, &self.cfg).map_err(|e| e.to_string())?;
        tracing::info!(
            rank = config.rank,
            "ib: using {} (FERROCCL_IB_HCA to choose)",
            port.describe()
        );
        Ok(dev)
    }

    fn prepare(&self, dev: &IbDevice, depth: usize) -> Result<(PendingQp, Vec<u8>), String> {
        let qp = dev.create_qp(depth).map_err(|e| e.to_string())?;
        let endpoint = qp.endpoint().to_bytes().to_vec();
        Ok((qp, endpoint))
    }

    fn connect(&self, prepared: PendingQp, remote: &[u8]) -> Result<IbQp, String> {
        let remote = Endpoint::from_bytes(remote).map_err(|e| e.to_string())?;
        prepared.connect(&remote).map_err(|e| e.to_string())
    }
}
