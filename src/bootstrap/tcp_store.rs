//! TCP store (temporary stub; replaced by the boot branch).
use super::{FailureReport, Store};
use crate::error::{Error, Result};
use std::time::Instant;
/// Stub.
pub struct TcpStoreServer;
impl TcpStoreServer {
    /// Stub.
    pub fn start(_bind: std::net::SocketAddr, _token: u64, _world: usize) -> Result<Self> {
        Err(Error::Bootstrap("not yet".into()))
    }
}
/// Stub.
pub struct TcpStore;
impl TcpStore {
    /// Stub.
    pub fn connect(_a: std::net::SocketAddr, _t: u64, _r: usize, _d: Instant) -> Result<Self> {
        Err(Error::Bootstrap("not yet".into()))
    }
}
impl Store for TcpStore {
    fn set(&self, _k: &str, _v: &[u8]) -> Result<()> {
        unimplemented!()
    }
    fn get(&self, _k: &str, _d: Instant) -> Result<Vec<u8>> {
        unimplemented!()
    }
    fn report_failure(&self, _r: usize, _s: &str) {}
    fn failures(&self) -> crossbeam_channel::Receiver<FailureReport> {
        crossbeam_channel::never()
    }
    fn goodbye(&self) {}
}
