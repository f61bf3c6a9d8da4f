//! NCCL's profiling interface: every entry point also answers to its name
//! with a `p` in front (`pncclAllReduce`), so that a profiling layer that
//! defines `ncclAllReduce` itself can reach the library's through the
//! alias. Each alias only calls the entry point it names.

use crate::abi::{ConfigHead, UniqueId};
use crate::NcclComm;
use std::ffi::{c_char, c_int, c_void};

macro_rules! profiling_aliases {
    ($($alias:ident => $target:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty;)*) => {$(
        #[doc = concat!("`", stringify!($alias), "`: calls `", stringify!($target), "`.")]
        ///
        /// # Safety
        /// As the entry point it calls.
        #[no_mangle]
        #[allow(unused_unsafe)]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $ret {
            // SAFETY: the caller keeps the contract of the entry point.
            unsafe { crate::$target($($arg),*) }
        }
    )*};
}

profiling_aliases! {
    pncclGetVersion => ncclGetVersion(version: *mut c_int) -> c_int;
    pncclGetUniqueId => ncclGetUniqueId(id: *mut UniqueId) -> c_int;
    pncclCommInitRank => ncclCommInitRank(comm: *mut NcclComm, nranks: c_int, id: UniqueId, rank: c_int) -> c_int;
    pncclCommInitRankConfig => ncclCommInitRankConfig(comm: *mut NcclComm, nranks: c_int, id: UniqueId, rank: c_int, config: *const ConfigHead) -> c_int;
    pncclCommInitRankScalable => ncclCommInitRankScalable(comm: *mut NcclComm, nranks: c_int, rank: c_int, n_id: c_int, ids: *const UniqueId, config: *const ConfigHead) -> c_int;
    pncclCommInitAll => ncclCommInitAll(comms: *mut NcclComm, ndev: c_int, devlist: *const c_int) -> c_int;
    pncclCommFinalize => ncclCommFinalize(comm: NcclComm) -> c_int;
    pncclCommDestroy => ncclCommDestroy(comm: NcclComm) -> c_int;
    pncclCommAbort => ncclCommAbort(comm: NcclComm) -> c_int;
    pncclCommSplit => ncclCommSplit(comm: NcclComm, color: c_int, key: c_int, newcomm: *mut NcclComm, config: *const ConfigHead) -> c_int;
    pncclCommShrink => ncclCommShrink(comm: NcclComm, exclude: *mut c_int, count: c_int, newcomm: *mut NcclComm, config: *const ConfigHead, flags: c_int) -> c_int;
    pncclGetErrorString => ncclGetErrorString(code: c_int) -> *const c_char;
    pncclGetLastError => ncclGetLastError(comm: NcclComm) -> *const c_char;
    pncclCommGetAsyncError => ncclCommGetAsyncError(comm: NcclComm, error: *mut c_int) -> c_int;
    pncclCommCount => ncclCommCount(comm: NcclComm, count: *mut c_int) -> c_int;
    pncclCommCuDevice => ncclCommCuDevice(comm: NcclComm, device: *mut c_int) -> c_int;
    pncclCommUserRank => ncclCommUserRank(comm: NcclComm, rank: *mut c_int) -> c_int;
    pncclCommRegister => ncclCommRegister(comm: NcclComm, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> c_int;
    pncclCommDeregister => ncclCommDeregister(comm: NcclComm, handle: *mut c_void) -> c_int;
    pncclCommWindowRegister => ncclCommWindowRegister(comm: NcclComm, buff: *mut c_void, size: usize, win: *mut *mut c_void, flags: c_int) -> c_int;
    pncclCommWindowDeregister => ncclCommWindowDeregister(comm: NcclComm, win: *mut c_void) -> c_int;
    pncclDevCommCreate => ncclDevCommCreate(comm: NcclComm, reqs: *const c_void, out: *mut c_void) -> c_int;
    pncclDevCommDestroy => ncclDevCommDestroy(comm: NcclComm, dev_comm: *const c_void) -> c_int;
    pncclMemAlloc => ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> c_int;
    pncclMemFree => ncclMemFree(ptr: *mut c_void) -> c_int;
    pncclRedOpCreatePreMulSum => ncclRedOpCreatePreMulSum(op: *mut c_int, scalar: *mut c_void, datatype: c_int, residence: c_int, comm: NcclComm) -> c_int;
    pncclRedOpDestroy => ncclRedOpDestroy(op: c_int, comm: NcclComm) -> c_int;
    pncclAllReduce => ncclAllReduce(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclReduce => ncclReduce(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclBroadcast => ncclBroadcast(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclBcast => ncclBcast(buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclReduceScatter => ncclReduceScatter(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclAllGather => ncclAllGather(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclAlltoAll => ncclAlltoAll(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclGather => ncclGather(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclScatter => ncclScatter(send: *const c_void, recv: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclSend => ncclSend(send: *const c_void, count: usize, datatype: c_int, peer: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclRecv => ncclRecv(recv: *mut c_void, count: usize, datatype: c_int, peer: c_int, comm: NcclComm, stream: *mut c_void) -> c_int;
    pncclGroupStart => ncclGroupStart() -> c_int;
    pncclGroupEnd => ncclGroupEnd() -> c_int;
    pncclGroupSimulateEnd => ncclGroupSimulateEnd(sim_info: *mut c_void) -> c_int;
}
