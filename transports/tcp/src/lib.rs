//! TCP transport (temporary stub; replaced by the tcp branch).
use ferroccl_transport::*;
/// Stub.
#[derive(Debug, Default)]
pub struct TcpTransport;
impl TcpTransport {
    /// Stub.
    pub fn new() -> Self {
        TcpTransport
    }
}
impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn can_connect(&self, _l: &HostInfo, _p: &HostInfo) -> bool {
        true
    }
    fn listen(
        &self,
        _c: &ListenConfig,
        _a: &AbortSignal,
    ) -> Result<Box<dyn Listener>, TransportError> {
        Err(TransportError::Io("not yet".into()))
    }
}
