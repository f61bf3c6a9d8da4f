//! What a caller may ask: error strings, the last error, a communicator's
//! asynchronous error, its size, device and rank.

use super::{out, put};
use crate::abi::result;
use crate::comm::Handle;
use crate::status::{self, entry};
use crate::NcclComm;
use std::ffi::{c_char, c_int, CStr};

/// `ncclGetErrorString`.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(code: c_int) -> *const c_char {
    let s: &CStr = match code {
        result::SUCCESS => c"no error",
        result::UNHANDLED_CUDA_ERROR => {
            c"unhandled cuda error (run with FERROCCL_DEBUG=INFO for details)"
        }
        result::SYSTEM_ERROR => {
            c"unhandled system error (run with FERROCCL_DEBUG=INFO for details)"
        }
        result::INTERNAL_ERROR => {
            c"internal error - please report this issue to the ferroccl developers"
        }
        result::INVALID_ARGUMENT => c"invalid argument (see ncclGetLastError)",
        result::INVALID_USAGE => c"invalid usage (see ncclGetLastError)",
        result::REMOTE_ERROR => c"remote process exited or there was a network error",
        result::IN_PROGRESS => c"NCCL operation in progress",
        result::TIMEOUT => c"operation timed out",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// `ncclGetLastError`: the process's last error message (the communicator
/// argument is accepted and not needed). Valid until this thread's next
/// call of it.
#[no_mangle]
pub extern "C" fn ncclGetLastError(_comm: NcclComm) -> *const c_char {
    std::panic::catch_unwind(status::last_error_ptr).unwrap_or(c"".as_ptr())
}

/// `ncclCommGetAsyncError`: never blocks.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library; `async_error` NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: NcclComm, async_error: *mut c_int) -> c_int {
    entry("ncclCommGetAsyncError", || {
        out(async_error, "asyncError")?;
        // SAFETY: as the caller vouches.
        let h = unsafe { Handle::from_c(comm)? };
        let code = h.async_error()?;
        if code != result::SUCCESS && code != result::IN_PROGRESS {
            if let Ok(core) = h.core() {
                if let Some(e) = core.comm.async_error() {
                    status::set_last_error(e.to_string());
                }
            }
        }
        // SAFETY: as the caller vouches.
        unsafe { put(async_error, "asyncError", code) }
    })
}

/// `ncclCommCount`.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library; `count` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: NcclComm, count: *mut c_int) -> c_int {
    entry("ncclCommCount", || {
        // SAFETY: as the caller vouches.
        let h = unsafe { Handle::from_c(comm)? };
        // SAFETY: as the caller vouches.
        let (_, size) = h.place()?;
        // SAFETY: as the caller vouches.
        unsafe { put(count, "count", size as c_int) }
    })
}

/// `ncclCommCuDevice`: the device current at initialisation (-1 for a
/// host-only communicator, without a CUDA driver).
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library; `device` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: NcclComm, device: *mut c_int) -> c_int {
    entry("ncclCommCuDevice", || {
        // SAFETY: as the caller vouches.
        let h = unsafe { Handle::from_c(comm)? };
        // SAFETY: as the caller vouches.
        unsafe { put(device, "device", h.device) }
    })
}

/// `ncclCommUserRank`.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library; `rank` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: NcclComm, rank: *mut c_int) -> c_int {
    entry("ncclCommUserRank", || {
        // SAFETY: as the caller vouches.
        let h = unsafe { Handle::from_c(comm)? };
        // SAFETY: as the caller vouches.
        let (me, _) = h.place()?;
        // SAFETY: as the caller vouches.
        unsafe { put(rank, "rank", me as c_int) }
    })
}

/// `ncclResetDebugInit`: nothing to do (ferroccl reads FERROCCL_DEBUG once).
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {}
