//! ferroccl-nccl: NCCL's C API on ferroccl, built as `libnccl.so.2`.
//!
//! Every entry point of `include/nccl.h` is here, with NCCL's types and
//! values (`abi`). Buffers in host memory run the library's host
//! collectives synchronously (the stream is ignored); buffers in CUDA
//! device memory go to its raw device entry points, enqueued on the
//! caller's stream. Group calls collect and order (`group`). Entry points
//! this library does not support yet return `ncclInvalidUsage` with a
//! message for `ncclGetLastError`. No panic crosses into C (`status`).
//! docs/nccl.md is the user's page.
//!
//! This crate owns the C boundary only: it must not reach into the
//! library's internals, only its public API.

pub mod abi;
pub mod call;
pub mod comm;
pub mod group;
pub mod profiling;
pub mod status;
pub mod uid;

use abi::{result, ConfigHead, NcclType, UniqueId};
use call::{Call, Kind, Memory, Op, PreMul, Scalar};
use comm::{Core, Handle, State};
use status::{entry, unsupported, Failure};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex};
use uid::Meeting;

/// `ncclComm_t`.
pub type NcclComm = *mut Handle;

fn out<T>(ptr: *mut T, what: &str) -> Result<*mut T, Failure> {
    if ptr.is_null() {
        Err(Failure::invalid_argument(format!("{what} is NULL")))
    } else {
        Ok(ptr)
    }
}

/// Store `value` through a checked output pointer.
///
/// # Safety
/// `ptr` is NULL (refused) or valid for a write of a `T`.
unsafe fn put<T>(ptr: *mut T, what: &str, value: T) -> Result<c_int, Failure> {
    let ptr = out(ptr, what)?;
    // SAFETY: non-NULL, and the caller vouches that it is writable.
    unsafe { ptr.write(value) };
    Ok(result::SUCCESS)
}

/// The handle behind `comm` and its live communicator.
///
/// # Safety
/// As [`Handle::from_c`].
unsafe fn live<'a>(comm: NcclComm) -> Result<(&'a Handle, Arc<Core>), Failure> {
    // SAFETY: forwarded.
    let h = unsafe { Handle::from_c(comm)? };
    Ok((h, h.core()?))
}

/// `ncclGetVersion`.
///
/// # Safety
/// `version` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> c_int {
    // SAFETY: as the caller vouches.
    entry("ncclGetVersion", || unsafe {
        put(version, "version", abi::VERSION_CODE)
    })
}

/// `ncclGetUniqueId`: a new meeting whose rank 0 runs on this host.
///
/// # Safety
/// `unique_id` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut UniqueId) -> c_int {
    entry("ncclGetUniqueId", || {
        let id = Meeting::new_here()?.encode();
        // SAFETY: as the caller vouches.
        unsafe { put(unique_id, "uniqueId", id) }
    })
}

/// Make a communicator: now, or at the group's end inside a group.
///
/// # Safety
/// `newcomm` is NULL or writable; `config` as [`abi::read_config`].
unsafe fn init_rank(
    newcomm: *mut NcclComm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *const ConfigHead,
) -> Result<c_int, Failure> {
    let newcomm = out(newcomm, "comm")?;
    let (rank, size) = comm::check_rank(nranks, rank)?;
    // SAFETY: as the caller vouches.
    let config = unsafe { abi::read_config(config)? };
    let meeting = Meeting::decode(&id)?;
    let device = comm::current_device();
    if group::open() {
        let h = Handle::new_raw(rank, size, device, State::Pending);
        group::defer_init(h, id, rank, size, config);
        // SAFETY: checked non-NULL; the caller vouches it is writable.
        unsafe { newcomm.write(h) };
        return Ok(result::SUCCESS);
    }
    let core = comm::init(&meeting, rank, size, config)?;
    // SAFETY: as above.
    unsafe { newcomm.write(Handle::new_raw(rank, size, device, State::Ready(core))) };
    Ok(result::SUCCESS)
}

/// `ncclCommInitRank`.
///
/// # Safety
/// `comm` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut NcclComm,
    nranks: c_int,
    comm_id: UniqueId,
    rank: c_int,
) -> c_int {
    // SAFETY: as the caller vouches.
    entry("ncclCommInitRank", || unsafe {
        init_rank(comm, nranks, comm_id, rank, std::ptr::null())
    })
}

/// `ncclCommInitRankConfig`.
///
/// # Safety
/// `comm` is NULL or writable; `config` is NULL or an `ncclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut NcclComm,
    nranks: c_int,
    comm_id: UniqueId,
    rank: c_int,
    config: *const ConfigHead,
) -> c_int {
    // SAFETY: as the caller vouches.
    entry("ncclCommInitRankConfig", || unsafe {
        init_rank(comm, nranks, comm_id, rank, config)
    })
}

/// `ncclCommInitRankScalable`: every rank passes the same ids; the first
/// is enough to meet (one rendezvous serves every rank).
///
/// # Safety
/// `newcomm` is NULL or writable; `comm_ids` NULL or `n_id` ids;
/// `config` NULL or an `ncclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    newcomm: *mut NcclComm,
    nranks: c_int,
    myrank: c_int,
    n_id: c_int,
    comm_ids: *const UniqueId,
    config: *const ConfigHead,
) -> c_int {
    entry("ncclCommInitRankScalable", || {
        if n_id < 1 || comm_ids.is_null() {
            return Err(Failure::invalid_argument(format!(
                "nId {n_id} with commIds {comm_ids:?}: at least one id is needed"
            )));
        }
        // SAFETY: non-NULL and holding `n_id >= 1` ids, as the caller vouches.
        let id = unsafe { *comm_ids };
        // SAFETY: as the caller vouches.
        unsafe { init_rank(newcomm, nranks, id, myrank, config) }
    })
}

/// `ncclCommInitAll`: `ndev` ranks in this process, one thread each.
///
/// # Safety
/// `comms` is NULL or writable for `ndev` handles; `devlist` NULL or
/// `ndev` ints.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut NcclComm,
    ndev: c_int,
    devlist: *const c_int,
) -> c_int {
    entry("ncclCommInitAll", || {
        let comms = out(comms, "comm")?;
        if ndev < 1 {
            return Err(Failure::invalid_argument(format!(
                "ndev {ndev} must be at least 1"
            )));
        }
        let n = ndev as usize;
        let devices: Vec<c_int> = if devlist.is_null() {
            (0..ndev).collect()
        } else {
            // SAFETY: `ndev` ints, as the caller vouches.
            unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
        };
        let port = ferroccl::bootstrap::free_port()?;
        let meeting = Meeting {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            token: uid::random_token(),
        };
        let made: Vec<Result<Arc<Core>, Failure>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..n)
                .map(|r| {
                    let meeting = &meeting;
                    s.spawn(move || comm::init(meeting, r, n, abi::CommConfig::default()))
                })
                .collect();
            threads
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(Failure::internal("an init thread panicked")))
                })
                .collect()
        });
        if let Some(f) = made.iter().find_map(|r| r.as_ref().err()) {
            return Err(f.clone());
        }
        for (r, core) in made.into_iter().enumerate() {
            let core = core?;
            // SAFETY: `comms` holds `ndev` writable handles, as the caller vouches.
            unsafe {
                comms
                    .add(r)
                    .write(Handle::new_raw(r, n, devices[r], State::Ready(core)))
            };
        }
        Ok(result::SUCCESS)
    })
}

/// `ncclCommFinalize`: waits for this communicator's device calls (host
/// calls are complete when they return).
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library.
#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: NcclComm) -> c_int {
    entry("ncclCommFinalize", || {
        // SAFETY: as the caller vouches.
        let (_, core) = unsafe { live(comm)? };
        core.flush()?;
        Ok(result::SUCCESS)
    })
}

/// `ncclCommDestroy`.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: NcclComm) -> c_int {
    entry("ncclCommDestroy", || {
        // SAFETY: as the caller vouches.
        unsafe { Handle::from_c(comm)? }.retire(false)?;
        Ok(result::SUCCESS)
    })
}

/// `ncclCommAbort`: ends in-flight calls with an error, never waits for
/// peers.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library.
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: NcclComm) -> c_int {
    entry("ncclCommAbort", || {
        // SAFETY: as the caller vouches.
        unsafe { Handle::from_c(comm)? }.retire(true)?;
        Ok(result::SUCCESS)
    })
}

/// `ncclCommSplit`: `NCCL_SPLIT_NOCOLOR` gives NULL. Inside a group it
/// is deferred to `ncclGroupEnd`, as NCCL's is (so that one thread can
/// split every rank it holds): `*newcomm` is written now, a handle that
/// is pending until then (NULL for `NCCL_SPLIT_NOCOLOR`).
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library; `newcomm` NULL or
/// writable; `config` NULL or an `ncclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    comm: NcclComm,
    color: c_int,
    key: c_int,
    newcomm: *mut NcclComm,
    config: *const ConfigHead,
) -> c_int {
    entry("ncclCommSplit", || {
        let newcomm = out(newcomm, "newcomm")?;
        // SAFETY: as the caller vouches.
        let h = unsafe { Handle::from_c(comm)? };
        // A NULL config inherits the parent's, as NCCL's does.
        let config = if config.is_null() {
            None
        } else {
            // SAFETY: as the caller vouches.
            Some(unsafe { abi::read_config(config)? })
        };
        if color < abi::SPLIT_NOCOLOR {
            return Err(Failure::invalid_argument(format!(
                "color {color} must be at least 0, or NCCL_SPLIT_NOCOLOR (-1)"
            )));
        }
        if group::open() {
            // The parent may be an init of the same group, still pending;
            // any other state that is not a live communicator is refused
            // now.
            if !h.pending() {
                h.core()?;
            }
            let child = (color != abi::SPLIT_NOCOLOR).then(|| Handle::new_split_raw(h.device));
            group::defer_split(comm, color, key, child, config);
            // SAFETY: checked non-NULL; the caller vouches it is writable.
            unsafe { newcomm.write(child.unwrap_or(std::ptr::null_mut())) };
            return Ok(result::SUCCESS);
        }
        let value = match split(h, color, key, config)? {
            None => std::ptr::null_mut(),
            Some(core) => {
                let (rank, size) = (core.comm.rank(), core.comm.size());
                Handle::new_raw(rank, size, h.device, State::Ready(core))
            }
        };
        // SAFETY: checked non-NULL; the caller vouches it is writable.
        unsafe { newcomm.write(value) };
        Ok(result::SUCCESS)
    })
}

/// Split the live communicator of `parent`: the child's core, or `None`
/// for `NCCL_SPLIT_NOCOLOR` (`config` `None`: the parent's).
pub(crate) fn split(
    parent: &Handle,
    color: c_int,
    key: c_int,
    config: Option<abi::CommConfig>,
) -> Result<Option<Arc<Core>>, Failure> {
    let core = parent.core()?;
    let config = config.unwrap_or_else(|| core.config.clone());
    Ok(core.comm.split(color, key)?.map(|c| Core::new(c, config)))
}

/// `ncclCommShrink`: not supported yet.
#[no_mangle]
pub extern "C" fn ncclCommShrink(
    _comm: NcclComm,
    _exclude_ranks: *mut c_int,
    _exclude_count: c_int,
    _newcomm: *mut NcclComm,
    _config: *const ConfigHead,
    _flags: c_int,
) -> c_int {
    unsupported(
        "ncclCommShrink",
        "use ncclCommSplit with NCCL_SPLIT_NOCOLOR on the excluded ranks",
    )
}

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

/// `ncclRedOpCreatePreMulSum`: `ncclScalarHostImmediate` reads the
/// scalar now; `ncclScalarDevice` reads it at each call: a host address
/// when the call is made, a device address on the stream when the stream
/// reaches the call (device buffers only).
///
/// # Safety
/// `op` is NULL or writable; `scalar` NULL or a readable value of
/// `datatype` (for `ncclScalarDevice`, readable at every call that uses
/// the operator, on the device until the stream has passed the call);
/// `comm` NULL or an `ncclComm_t` of this library.
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut c_int,
    scalar: *mut c_void,
    datatype: c_int,
    residence: c_int,
    comm: NcclComm,
) -> c_int {
    entry("ncclRedOpCreatePreMulSum", || {
        out(op, "op")?;
        let dtype = NcclType::from_c(datatype)?;
        // SAFETY: as the caller vouches.
        let (_, core) = unsafe { live(comm)? };
        let scalar_ptr = out(scalar, "scalar")? as usize;
        let on_device = ferroccl_cuda::engine::pointer_info(scalar_ptr as u64).is_ok();
        let scalar = match residence {
            1 => {
                if on_device {
                    return Err(Failure::invalid_argument(
                        "ncclScalarHostImmediate with a scalar in device memory",
                    ));
                }
                let mut bytes = [0u8; 8];
                // SAFETY: a readable value of `datatype` (at most 8
                // bytes), as the caller vouches.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        scalar_ptr as *const u8,
                        bytes.as_mut_ptr(),
                        dtype.size(),
                    )
                };
                Scalar::Value(bytes)
            }
            0 if on_device => Scalar::DevicePtr(scalar_ptr),
            0 => Scalar::HostPtr(scalar_ptr),
            other => {
                return Err(Failure::invalid_argument(format!(
                    "residence {other} is not an ncclScalarResidence_t (0 or 1)"
                )))
            }
        };
        let value = core.add_premul(PreMul { dtype, scalar })?;
        // SAFETY: as the caller vouches.
        unsafe { put(op, "op", value) }
    })
}

/// `ncclRedOpDestroy`.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library.
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpDestroy(op: c_int, comm: NcclComm) -> c_int {
    entry("ncclRedOpDestroy", || {
        // SAFETY: as the caller vouches.
        let (_, core) = unsafe { live(comm)? };
        if op < abi::NUM_OPS {
            return Err(Failure::invalid_argument(format!(
                "op {op} is built in, not created by ncclRedOpCreatePreMulSum"
            )));
        }
        core.remove_premul(op)?;
        Ok(result::SUCCESS)
    })
}

/// Check and submit one call.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library; the buffers are
/// as NCCL's API requires for `kind`.
#[allow(clippy::too_many_arguments)]
unsafe fn collective(
    name: &str,
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    op: Option<c_int>,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    entry(name, || {
        // SAFETY: as the caller vouches.
        let (_, core) = unsafe { live(comm)? };
        let dtype = NcclType::from_c(datatype)?;
        let op = match op {
            None => Op::None,
            Some(v) => match abi::builtin_op(v)? {
                Some(b) => Op::Builtin(b),
                None => Op::PreMul(core.premul(v)?),
            },
        };
        if root < 0 {
            let what = if matches!(kind, Kind::Send | Kind::Recv) {
                "peer"
            } else {
                "root"
            };
            return Err(Failure::invalid_argument(format!(
                "{what} {root} is negative"
            )));
        }
        let call = Call {
            kind,
            send: send as usize,
            recv: recv as usize,
            count,
            dtype,
            op,
            root: root as usize,
            memory: Memory::Host,
            stream: stream as usize,
        }
        .check(core.comm.rank(), core.comm.size())?;
        group::submit(core, call)?;
        Ok(result::SUCCESS)
    })
}

/// `ncclAllReduce`.
///
/// # Safety
/// NCCL's contract: `comm` an `ncclComm_t` of this library; the buffers
/// hold `count` elements; host buffers are untouched by others until the
/// call returns, device buffers until the stream reaches it.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        collective(
            "ncclAllReduce",
            Kind::AllReduce,
            sendbuff,
            recvbuff,
            count,
            datatype,
            Some(op),
            0,
            comm,
            stream,
        )
    }
}

/// `ncclReduce`.
///
/// # Safety
/// As [`ncclAllReduce`]; `recvbuff` is used on `root` only.
#[no_mangle]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        collective(
            "ncclReduce",
            Kind::Reduce,
            sendbuff,
            recvbuff,
            count,
            datatype,
            Some(op),
            root,
            comm,
            stream,
        )
    }
}

/// `ncclBroadcast`.
///
/// # Safety
/// As [`ncclAllReduce`]; `sendbuff` is used on `root` only.
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        collective(
            "ncclBroadcast",
            Kind::Broadcast,
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            root,
            comm,
            stream,
        )
    }
}

/// `ncclBcast`: broadcast in place.
///
/// # Safety
/// As [`ncclAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        collective(
            "ncclBcast",
            Kind::Broadcast,
            buff,
            buff,
            count,
            datatype,
            None,
            root,
            comm,
            stream,
        )
    }
}

/// `ncclReduceScatter`: `recvcount` elements per rank.
///
/// # Safety
/// As [`ncclAllReduce`]; `sendbuff` holds `recvcount * nranks` elements.
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        collective(
            "ncclReduceScatter",
            Kind::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            Some(op),
            0,
            comm,
            stream,
        )
    }
}

/// `ncclAllGather`: `sendcount` elements per rank.
///
/// # Safety
/// As [`ncclAllReduce`]; `recvbuff` holds `sendcount * nranks` elements.
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        collective(
            "ncclAllGather",
            Kind::AllGather,
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            None,
            0,
            comm,
            stream,
        )
    }
}

/// `ncclAlltoAll`: `count` elements to and from each rank.
///
/// # Safety
/// As [`ncclAllReduce`]; both buffers hold `count * nranks` elements.
#[no_mangle]
pub unsafe extern "C" fn ncclAlltoAll(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        collective(
            "ncclAlltoAll",
            Kind::AllToAll,
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            0,
            comm,
            stream,
        )
    }
}

/// `ncclSend`.
///
/// # Safety
/// As [`ncclAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    sendbuff: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        collective(
            "ncclSend",
            Kind::Send,
            sendbuff,
            std::ptr::null_mut(),
            count,
            datatype,
            None,
            peer,
            comm,
            stream,
        )
    }
}

/// `ncclRecv`.
///
/// # Safety
/// As [`ncclAllReduce`].
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        collective(
            "ncclRecv",
            Kind::Recv,
            std::ptr::null(),
            recvbuff,
            count,
            datatype,
            None,
            peer,
            comm,
            stream,
        )
    }
}

/// `ncclGather` (`gather`) or `ncclScatter`: the root's blocks as
/// point-to-point calls in one group, so they run (and are checked) as
/// grouped sends and receives do.
///
/// # Safety
/// As [`ncclAllReduce`]: the root's `recvbuff` (gather) or `sendbuff`
/// (scatter) holds `count * nranks` elements, every other buffer `count`.
#[allow(clippy::too_many_arguments)]
unsafe fn rooted(
    name: &str,
    gather: bool,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    entry(name, || {
        // SAFETY: as the caller vouches.
        let (_, core) = unsafe { live(comm)? };
        let dtype = NcclType::from_c(datatype)?;
        let (me, n) = (core.comm.rank(), core.comm.size());
        if root < 0 || root as usize >= n {
            return Err(Failure::invalid_argument(format!(
                "{name}: root {root} is out of range for a communicator of {n} ranks"
            )));
        }
        let root = root as usize;
        let block = count
            .checked_mul(dtype.size())
            .filter(|b| {
                b.checked_mul(n)
                    .is_some_and(|all| all <= isize::MAX as usize)
            })
            .ok_or_else(|| {
                Failure::invalid_argument(format!(
                    "{name}: count {count} of {dtype:?} on {n} ranks overflows the address space"
                ))
            })?;
        let (send, recv) = (send as usize, recv as usize);
        let many = if gather { recv } else { send };
        if me == root && count > 0 && many == 0 {
            let what = if gather { "recvbuff" } else { "sendbuff" };
            return Err(Failure::invalid_argument(format!(
                "{name}: {what} is NULL on the root but {n} blocks of {count} are needed"
            )));
        }
        let p2p = |kind, send, recv, peer| Call {
            kind,
            send,
            recv,
            count,
            dtype,
            op: Op::None,
            root: peer,
            memory: Memory::Host,
            stream: stream as usize,
        };
        let mut calls = Vec::new();
        if gather {
            calls.push(p2p(Kind::Send, send, 0, root));
            if me == root {
                calls.extend((0..n).map(|q| p2p(Kind::Recv, 0, recv + q * block, q)));
            }
        } else {
            if me == root {
                calls.extend((0..n).map(|q| p2p(Kind::Send, send + q * block, 0, q)));
            }
            calls.push(p2p(Kind::Recv, 0, recv, root));
        }
        let calls = calls
            .into_iter()
            .map(|c| c.check(me, n))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|mut f| {
                f.message = f
                    .message
                    .replace("ncclSend", name)
                    .replace("ncclRecv", name);
                f
            })?;
        group::submit_all(core, calls)?;
        Ok(result::SUCCESS)
    })
}

/// `ncclGather`: `count` elements from every rank into the root's
/// `recvbuff`, rank `i`'s at block `i`.
///
/// # Safety
/// As [`rooted`].
#[no_mangle]
pub unsafe extern "C" fn ncclGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        rooted(
            "ncclGather",
            true,
            sendbuff,
            recvbuff,
            count,
            datatype,
            root,
            comm,
            stream,
        )
    }
}

/// `ncclScatter`: block `i` of the root's `sendbuff` to rank `i`.
///
/// # Safety
/// As [`rooted`].
#[no_mangle]
pub unsafe extern "C" fn ncclScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        rooted(
            "ncclScatter",
            false,
            sendbuff,
            recvbuff,
            count,
            datatype,
            root,
            comm,
            stream,
        )
    }
}

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

/// `ncclResetDebugInit`: nothing to do (ferroccl reads FERROCCL_DEBUG once).
#[no_mangle]
pub extern "C" fn ncclResetDebugInit() {}

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
