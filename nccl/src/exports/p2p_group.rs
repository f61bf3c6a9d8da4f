//! Point-to-point calls and groups: `ncclSend`, `ncclRecv` (forwarded to
//! the collectives' checked path) and `ncclGroupStart`/`ncclGroupEnd`.

use super::collectives::collective;
use crate::abi::result;
use crate::call::Kind;
use crate::group;
use crate::status::{entry, unsupported};
use crate::NcclComm;
use std::ffi::{c_int, c_void};

forward! {
    /// `ncclSend`.
    ///
    /// # Safety
    /// As [`ncclAllReduce`](super::collectives::ncclAllReduce).
    fn ncclSend(sendbuff: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: NcclComm, stream: *mut c_void)
        => collective(Kind::Send, sendbuff, std::ptr::null_mut(), count, datatype, None, peer, comm, stream);

    /// `ncclRecv`.
    ///
    /// # Safety
    /// As [`ncclAllReduce`](super::collectives::ncclAllReduce).
    fn ncclRecv(recvbuff: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: NcclComm, stream: *mut c_void)
        => collective(Kind::Recv, std::ptr::null(), recvbuff, count, datatype, None, peer, comm, stream);
}

/// `ncclGroupStart`.
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> c_int {
    entry("ncclGroupStart", || {
        group::start();
        Ok(result::SUCCESS)
    })
}

/// `ncclGroupEnd`: runs what the group collected (host calls complete
/// before it returns).
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> c_int {
    entry("ncclGroupEnd", || {
        group::end()?;
        Ok(result::SUCCESS)
    })
}

/// `ncclGroupSimulateEnd`: not supported yet.
#[no_mangle]
pub extern "C" fn ncclGroupSimulateEnd(_sim_info: *mut c_void) -> c_int {
    unsupported(
        "ncclGroupSimulateEnd",
        "this library has no performance model to report",
    )
}
