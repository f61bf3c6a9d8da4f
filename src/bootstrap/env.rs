//! Launcher environments (temporary stub; replaced by the boot branch).
use crate::error::{Error, Result};
/// Stub.
pub struct LaunchInfo {
    /** */
    pub rank: usize,
    /** */
    pub size: usize,
    /** */
    pub local_rank: usize,
    /** */
    pub local_size: Option<usize>,
    /** */
    pub master_addr: String,
    /** */
    pub master_port: u16,
    /** */
    pub token: Option<u64>,
    /** */
    pub source: &'static str,
}
/// Stub.
pub fn detect_process_env() -> Result<LaunchInfo> {
    Err(Error::Env("not yet".into()))
}
