//! Entry points of newer NCCL headers that this library does not support.

use crate::abi::{ConfigHead, UniqueId};
use crate::status::unsupported;
use crate::NcclComm;
use std::ffi::{c_int, c_void};

/// Entry points of newer NCCL headers that this library does not support:
/// each returns `ncclInvalidUsage` and says so, so that a program linked
/// against them loads and learns why.
macro_rules! not_supported {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) => $why:literal;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: not supported yet (", $why, ").")]
        #[no_mangle]
        pub extern "C" fn $name($($arg: $ty),*) -> c_int {
            $(let _ = $arg;)*
            unsupported(stringify!($name), $why)
        }
    )*};
}

not_supported! {
    ncclCommRevoke(comm: NcclComm, flags: c_int) => "use ncclCommAbort";
    ncclCommGetUniqueId(comm: NcclComm, id: *mut UniqueId) => "growing a communicator";
    ncclCommGrow(comm: NcclComm, nranks: c_int, id: *const UniqueId, rank: c_int, newcomm: *mut NcclComm, config: *const ConfigHead) => "growing a communicator";
    ncclCommSuspend(comm: NcclComm, flags: c_int) => "suspending a communicator";
    ncclCommResume(comm: NcclComm) => "suspending a communicator";
    ncclCommMemStats(comm: NcclComm, stat: c_int, value: *mut u64) => "memory statistics";
    ncclWinGetUserPtr(comm: NcclComm, win: *mut c_void, ptr: *mut *mut c_void) => "symmetric memory windows";
    ncclPutSignal(buf: *const c_void, count: usize, datatype: c_int, peer: c_int, win: *mut c_void, offset: usize, sig: c_int, ctx: c_int, flags: u32, comm: NcclComm, stream: *mut c_void) => "one-sided operations";
    ncclSignal(peer: c_int, sig: c_int, ctx: c_int, flags: u32, comm: NcclComm, stream: *mut c_void) => "one-sided operations";
    ncclWaitSignal(n: c_int, descs: *mut c_void, comm: NcclComm, stream: *mut c_void) => "one-sided operations";
}
