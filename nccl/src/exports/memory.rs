//! Memory: buffer registration (kept only to refuse foreign handles),
//! `ncclMemAlloc`/`ncclMemFree`, and the window and device-communicator
//! calls this library refuses.

use super::{live, out, put};
use crate::abi::result;
use crate::status::{entry, unsupported, Failure};
use crate::NcclComm;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

/// Registrations, by handle: (handle, communicator handle, buffer). The
/// data path does not use them (registration is a hint in NCCL's API,
/// never needed for correctness); they are kept so that a handle
/// `ncclCommRegister` did not give, or gave to another communicator, is
/// refused.
static REGISTRATIONS: Mutex<Vec<(usize, usize, usize)>> = Mutex::new(Vec::new());

/// `ncclCommRegister`: a handle for `ncclCommDeregister`; no effect on the
/// path calls take.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library; `handle` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommRegister(
    comm: NcclComm,
    buff: *mut c_void,
    size: usize,
    handle: *mut *mut c_void,
) -> c_int {
    entry("ncclCommRegister", || {
        out(handle, "handle")?;
        // SAFETY: as the caller vouches.
        unsafe { live(comm)? };
        if buff.is_null() && size > 0 {
            return Err(Failure::invalid_argument(format!(
                "buff is NULL with size {size}"
            )));
        }
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        // Handles are small numbers, never addresses: nothing to free.
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        REGISTRATIONS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, comm as usize, buff as usize));
        // SAFETY: as the caller vouches.
        unsafe { put(handle, "handle", id as *mut c_void) }
    })
}

/// `ncclCommDeregister`.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDeregister(comm: NcclComm, handle: *mut c_void) -> c_int {
    entry("ncclCommDeregister", || {
        // SAFETY: as the caller vouches.
        unsafe { live(comm)? };
        let mut all = REGISTRATIONS.lock().unwrap_or_else(|p| p.into_inner());
        let i = all
            .iter()
            .position(|&(id, c, _)| id == handle as usize && c == comm as usize)
            .ok_or_else(|| {
                Failure::invalid_argument(format!(
                    "handle {handle:?} is not a registration of this communicator (or was \
                     deregistered already)"
                ))
            })?;
        all.swap_remove(i);
        Ok(result::SUCCESS)
    })
}

/// `ncclCommWindowRegister`: not supported yet.
#[no_mangle]
pub extern "C" fn ncclCommWindowRegister(
    _comm: NcclComm,
    _buff: *mut c_void,
    _size: usize,
    _win: *mut *mut c_void,
    _flags: c_int,
) -> c_int {
    unsupported(
        "ncclCommWindowRegister",
        "symmetric memory windows (use ordinary buffers)",
    )
}

/// `ncclCommWindowDeregister`: not supported yet.
#[no_mangle]
pub extern "C" fn ncclCommWindowDeregister(_comm: NcclComm, _win: *mut c_void) -> c_int {
    unsupported(
        "ncclCommWindowDeregister",
        "symmetric memory windows (none can have been registered)",
    )
}

/// `ncclDevCommCreate`: NCCL's device API, not supported.
#[no_mangle]
pub extern "C" fn ncclDevCommCreate(
    _comm: NcclComm,
    _reqs: *const c_void,
    _out: *mut c_void,
) -> c_int {
    unsupported("ncclDevCommCreate", "NCCL's device-side communication API")
}

/// `ncclDevCommDestroy`: NCCL's device API, not supported.
#[no_mangle]
pub extern "C" fn ncclDevCommDestroy(_comm: NcclComm, _dev_comm: *const c_void) -> c_int {
    unsupported("ncclDevCommDestroy", "NCCL's device-side communication API")
}

/// Where an allocation of `ncclMemAlloc` lives.
#[derive(Clone, Copy)]
enum Allocation {
    /// Page-aligned host memory of this layout (no CUDA device usable).
    Host(std::alloc::Layout),
    /// Device memory of the context current at the call (`cuMemAlloc`).
    Device,
}

/// Allocations of `ncclMemAlloc`: address and kind.
static ALLOCATIONS: Mutex<Vec<(usize, Allocation)>> = Mutex::new(Vec::new());

/// `ncclMemAlloc`: with a CUDA device, device memory of the calling
/// thread's current context (`cuMemAlloc`, as `cudaMalloc` gives; the
/// device path needs no special memory, so NCCL's registration-friendly
/// allocation brings nothing more here); where no CUDA device can be
/// used, page-aligned host memory (host buffers are what this library
/// then serves).
///
/// # Safety
/// `ptr` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> c_int {
    entry("ncclMemAlloc", || {
        out(ptr, "ptr")?;
        let (p, kind) = if ferroccl::cuda::device_count().is_ok_and(|n| n > 0) {
            (device_alloc(size)?, Allocation::Device)
        } else {
            let layout = std::alloc::Layout::from_size_align(size.max(1), 4096)
                .map_err(|e| Failure::invalid_argument(format!("size {size}: {e}")))?;
            // SAFETY: the layout has a non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            if p.is_null() {
                return Err(Failure {
                    code: result::SYSTEM_ERROR,
                    message: format!("out of memory allocating {size} bytes"),
                });
            }
            (p as usize, Allocation::Host(layout))
        };
        ALLOCATIONS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((p, kind));
        // SAFETY: as the caller vouches.
        unsafe { put(ptr, "ptr", p as *mut c_void) }
    })
}

/// `size` bytes of device memory in the calling thread's current CUDA
/// context.
fn device_alloc(size: usize) -> Result<usize, Failure> {
    use ferroccl::cuda::cudarc::driver::result as cu;
    match cu::ctx::get_current() {
        Ok(Some(_)) => {}
        Ok(None) => {
            return Err(Failure::invalid_usage(
                "ncclMemAlloc: no CUDA context is current on this thread (select a device                  first, as with cudaSetDevice)",
            ))
        }
        Err(e) => {
            return Err(Failure {
                code: result::UNHANDLED_CUDA_ERROR,
                message: format!("ncclMemAlloc: cuCtxGetCurrent: {e}"),
            })
        }
    }
    // SAFETY: a context is current on this thread (checked above); the
    // driver returns a fresh allocation of at least one byte, freed only
    // by `ncclMemFree`.
    let p = unsafe { cu::malloc_sync(size.max(1)) }.map_err(|e| Failure {
        code: result::UNHANDLED_CUDA_ERROR,
        message: format!("ncclMemAlloc: cuMemAlloc of {size} bytes: {e}"),
    })?;
    Ok(p as usize)
}

/// `ncclMemFree`: only what `ncclMemAlloc` returned.
#[no_mangle]
pub extern "C" fn ncclMemFree(ptr: *mut c_void) -> c_int {
    entry("ncclMemFree", || {
        let mut all = ALLOCATIONS.lock().unwrap_or_else(|p| p.into_inner());
        let i = all
            .iter()
            .position(|&(p, _)| p == ptr as usize)
            .ok_or_else(|| {
                Failure::invalid_argument(format!(
                    "ptr {ptr:?} was not returned by ncclMemAlloc (or was freed already)"
                ))
            })?;
        let (p, kind) = all.swap_remove(i);
        match kind {
            // SAFETY: allocated by `ncclMemAlloc` with exactly this layout
            // and not freed since (it was still listed).
            Allocation::Host(layout) => unsafe { std::alloc::dealloc(p as *mut u8, layout) },
            Allocation::Device => {
                use ferroccl::cuda::cudarc::driver::result as cu;
                // SAFETY: allocated by `cuMemAlloc` in `ncclMemAlloc` and
                // not freed since (it was still listed).
                unsafe { cu::free_sync(p as _) }.map_err(|e| Failure {
                    code: result::UNHANDLED_CUDA_ERROR,
                    message: format!("ncclMemFree: cuMemFree: {e}"),
                })?;
            }
        }
        Ok(result::SUCCESS)
    })
}
