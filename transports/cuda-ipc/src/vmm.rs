//! Device memory another process can map.
//!
//! Why one file of about 900 lines before its tests: the two mechanisms
//! below sit behind one type each ([`SharedAlloc`], [`Mapped`]), and every
//! driver call of sharing device memory between processes is here, in one
//! reviewable place.
//!
//! The owner makes a [`SharedAlloc`] on its device, sends its
//! [`ShareHandle`] (and, for VMM, the fd of [`SharedAlloc::export_fd`]
//! beside it over a Unix socket, `crate::fdpass`) to the peer process,
//! which makes a [`Mapped`] of it on its own device.
//!
//! Two mechanisms:
//!
//! - **VMM** (where the device supports virtual memory management and
//!   POSIX fd handles): `cuMemCreate` (pinned device memory, exportable as
//!   a POSIX fd), `cuMemAddressReserve`, `cuMemMap`, `cuMemSetAccess`
//!   (read-write for the owner's device and the peer devices asked for);
//!   `cuMemExportToShareableHandle` gives an fd; the importer calls
//!   `cuMemImportFromShareableHandle` on it, then reserves, maps and sets
//!   access the same way. Dropping unmaps, frees the address range and
//!   releases the handle, in that order.
//! - **Legacy** IPC elsewhere: `cuMemAlloc` and `cuIpcGetMemHandle` (64
//!   bytes, sent as bytes); the importer `cuIpcOpenMemHandle` (with
//!   `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`) and `cuIpcCloseMemHandle`.
//!   The driver refuses to open a handle in the process that made it; such
//!   an import is refused here first, with the reason (ranks of one
//!   process share the pointer instead).
//!
//! Every call runs in the device's primary context (retained at its first
//! use here and kept for the process's life, as `ferroccl_cuda::cuda_engine`
//! does), made current on the calling thread first. Every public function
//! checks its arguments that need no driver first, then asks
//! `ferroccl_cuda::probe::driver`: without a driver it is [`CudaError::NoDevice`],
//! never a cudarc panic.
//!
//! Sizes are rounded up to the allocation granularity (VMM: what
//! `cuMemGetAllocationGranularity` says for the device, 2 MiB on current
//! GPUs; legacy: [`LEGACY_GRANULARITY`]).

use crate::handle::{round_up, ShareHandle, LEGACY_GRANULARITY};
use ferroccl_cuda::cudarc::driver::{result, sys, DriverError};
use ferroccl_cuda::topo::device;
use ferroccl_cuda::{CudaError, Result};
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

pub use ferroccl_cuda::topo::can_access_peer;

/// Which mechanism a [`SharedAlloc`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mechanism {
    /// VMM where the device supports it with POSIX fd handles, legacy IPC
    /// otherwise (said once at INFO).
    Auto,
    /// VMM only: an error where the device lacks it.
    Vmm,
    /// Legacy IPC (`cuMemAlloc` + `cuIpcGetMemHandle`) even where VMM
    /// would serve.
    Legacy,
}

/// What a device supports for sharing memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Support {
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
    pub vmm: bool,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`.
    pub posix_fd: bool,
}

impl Support {
    /// Whether the VMM mechanism serves (both).
    pub fn vmm_with_fd(&self) -> bool {
        self.vmm && self.posix_fd
    }
}

fn driver_err(call: &'static str, at: String) -> impl FnOnce(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        reason: format!("{e:?} ({at})"),
    }
}

/// The primary context of `ordinal`, retained at the first call and kept
/// for the process's life (stored as an address: a `CUcontext` is a
/// pointer, valid in every thread).
fn primary_context(ordinal: u32) -> Result<sys::CUcontext> {
    static CONTEXTS: OnceLock<Mutex<HashMap<u32, usize>>> = OnceLock::new();
    let dev = device(ordinal)?;
    let contexts = CONTEXTS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut contexts = contexts.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&ctx) = contexts.get(&ordinal) {
        return Ok(ctx as sys::CUcontext);
    }
    // SAFETY: `dev` is a handle the driver just returned after cuInit (the
    // probe); the retained context is never released, so the address kept
    // stays valid.
    let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(driver_err(
        "cuDevicePrimaryCtxRetain",
        format!("device {ordinal}"),
    ))?;
    contexts.insert(ordinal, ctx as usize);
    Ok(ctx)
}

/// Make the primary context of device `ordinal` current on this thread
/// (what every call here does first; for callers that then use the
/// memory with the driver themselves, e.g. `cuMemcpyHtoD`).
pub fn make_current(ordinal: u32) -> Result<()> {
    let ctx = primary_context(ordinal)?;
    // SAFETY: the context is retained for the process's life.
    unsafe { result::ctx::set_current(ctx) }
        .map_err(driver_err("cuCtxSetCurrent", format!("device {ordinal}")))
}

/// What device `ordinal` supports for sharing memory.
pub fn support(ordinal: u32) -> Result<Support> {
    let dev = device(ordinal)?;
    use sys::CUdevice_attribute as A;
    let attr = |a: A, name: &'static str| -> Result<bool> {
        // SAFETY: `dev` is a device handle the driver just returned.
        unsafe { result::device::get_attribute(dev, a) }
            .map(|v| v != 0)
            .map_err(driver_err(
                "cuDeviceGetAttribute",
                format!("{name} of device {ordinal}"),
            ))
    };
    Ok(Support {
        vmm: attr(
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
        )?,
        posix_fd: attr(
            A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED",
        )?,
    })
}

/// The properties of a VMM allocation on device `dev`: pinned device
/// memory exportable as a POSIX fd.
fn allocation_prop(dev: sys::CUdevice) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes:
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: dev,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The VMM allocation granularity of device `ordinal`
/// (`cuMemGetAllocationGranularity`, minimum, for pinned device memory
/// with POSIX fd handles): sizes and mapping addresses are multiples of
/// it.
pub fn granularity(ordinal: u32) -> Result<usize> {
    let dev = device(ordinal)?;
    granularity_of(ordinal, dev)
}

fn granularity_of(ordinal: u32, dev: sys::CUdevice) -> Result<usize> {
    let prop = allocation_prop(dev);
    let mut g = 0usize;
    // SAFETY: `prop` is a complete property struct and `g` a live local
    // the driver writes one size_t into.
    unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    }
    .result()
    .map_err(driver_err(
        "cuMemGetAllocationGranularity",
        format!("device {ordinal}"),
    ))?;
    if !g.is_power_of_two() {
        return Err(CudaError::Driver {
            call: "cuMemGetAllocationGranularity",
            reason: format!("device {ordinal}: granularity {g} is not a power of two"),
        });
    }
    Ok(g)
}

/// Let kernels in device `from_ordinal`'s primary context access memory of
/// device `to_ordinal` (`cuCtxEnablePeerAccess`; already enabled counts
/// as done). A device and itself: nothing to do. A pair whose devices
/// cannot reach each other (`cuDeviceCanAccessPeer`) is
/// `InvalidArgument`.
pub fn enable_peer_access(from_ordinal: u32, to_ordinal: u32) -> Result<()> {
    device(from_ordinal)?;
    device(to_ordinal)?;
    if from_ordinal == to_ordinal {
        return Ok(());
    }
    if !can_access_peer(from_ordinal, to_ordinal)? {
        return Err(CudaError::InvalidArgument(format!(
            "CUDA device {from_ordinal} cannot access the memory of device {to_ordinal} \
             (cuDeviceCanAccessPeer says no)"
        )));
    }
    let to = primary_context(to_ordinal)?;
    make_current(from_ordinal)?;
    // SAFETY: `to` is a retained primary context; the current context is
    // `from_ordinal`'s primary one; flags must be 0.
    let rc = unsafe { sys::cuCtxEnablePeerAccess(to, 0) };
    match rc {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(())
        }
        other => Err(driver_err(
            "cuCtxEnablePeerAccess",
            format!("from device {from_ordinal} to device {to_ordinal}"),
        )(DriverError(other))),
    }
}

/// Checks `peers` (ordinals of this process) and keeps those other than
/// `ordinal`, once each.
fn other_devices(ordinal: u32, peers: &[u32]) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for &p in peers {
        device(p)?;
        if p != ordinal && !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------
// The pieces of a VMM mapping, each undone by its Drop, so that a failure
// half-way through leaves nothing behind and a whole mapping comes apart
// in the right order (fields drop in declaration order: unmap, free the
// addresses, release the memory).

/// A physical allocation handle (`cuMemCreate` or imported).
struct Physical {
    handle: sys::CUmemGenericAllocationHandle,
    ordinal: u32,
}

impl Drop for Physical {
    fn drop(&mut self) {
        // SAFETY: the handle came from cuMemCreate or
        // cuMemImportFromShareableHandle and is released once, here;
        // mappings made from it are unmapped before (field order).
        let rc = unsafe { sys::cuMemRelease(self.handle) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!("cuMemRelease (device {}) failed: {rc:?}", self.ordinal);
        }
    }
}

/// A reserved range of device addresses.
struct Reserved {
    ptr: sys::CUdeviceptr,
    size: usize,
    ordinal: u32,
}

impl Reserved {
    fn new(ordinal: u32, size: usize, alignment: usize) -> Result<Reserved> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: writes one address into a live local; no fixed address
        // is asked for (0) and flags must be 0.
        unsafe { sys::cuMemAddressReserve(&mut ptr, size, alignment, 0, 0) }
            .result()
            .map_err(driver_err(
                "cuMemAddressReserve",
                format!("device {ordinal}, {size} bytes aligned to {alignment}"),
            ))?;
        Ok(Reserved { ptr, size, ordinal })
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        // SAFETY: the range was reserved by cuMemAddressReserve with this
        // size and is freed once, after its mapping is gone (field order).
        let rc = unsafe { sys::cuMemAddressFree(self.ptr, self.size) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!(
                "cuMemAddressFree({:#x}, {}) (device {}) failed: {rc:?}",
                self.ptr,
                self.size,
                self.ordinal
            );
        }
    }
}

/// A mapping of a physical allocation at a reserved range.
struct MappedRange {
    ptr: sys::CUdeviceptr,
    size: usize,
    ordinal: u32,
}

impl MappedRange {
    fn new(reserved: &Reserved, physical: &Physical) -> Result<MappedRange> {
        // SAFETY: maps the whole of a reserved range (owned by the caller,
        // which keeps it past this mapping) at offset 0 of a live
        // allocation handle; flags must be 0.
        unsafe { sys::cuMemMap(reserved.ptr, reserved.size, 0, physical.handle, 0) }
            .result()
            .map_err(driver_err(
                "cuMemMap",
                format!(
                    "device {}, {} bytes at {:#x} (is the allocation that large?)",
                    reserved.ordinal, reserved.size, reserved.ptr
                ),
            ))?;
        Ok(MappedRange {
            ptr: reserved.ptr,
            size: reserved.size,
            ordinal: reserved.ordinal,
        })
    }

    /// Read-write access for each of `devices` (ordinals).
    fn grant(&self, devices: &[u32]) -> Result<()> {
        let mut descs = Vec::with_capacity(devices.len());
        for &d in devices {
            descs.push(sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: device(d)?,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            });
        }
        // SAFETY: the range is mapped (self) and `descs` holds
        // `descs.len()` complete descriptors for the duration of the call.
        unsafe { sys::cuMemSetAccess(self.ptr, self.size, descs.as_ptr(), descs.len()) }
            .result()
            .map_err(driver_err(
                "cuMemSetAccess",
                format!(
                    "read-write for devices {devices:?} on {} bytes at {:#x} of device {}",
                    self.size, self.ptr, self.ordinal
                ),
            ))
    }
}

impl Drop for MappedRange {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by cuMemMap with this size and is
        // unmapped once; its owner no longer hands out the address.
        let rc = unsafe { sys::cuMemUnmap(self.ptr, self.size) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!(
                "cuMemUnmap({:#x}, {}) (device {}) failed: {rc:?}",
                self.ptr,
                self.size,
                self.ordinal
            );
        }
    }
}

/// A VMM mapping: drops unmap, free the addresses, release the memory.
struct VmmMapping {
    map: MappedRange,
    _reserved: Reserved,
    physical: Physical,
    granularity: usize,
}

impl VmmMapping {
    /// Reserve, map and grant `devices` access to `physical`'s `size`
    /// bytes (a multiple of `granularity`).
    fn map(
        ordinal: u32,
        physical: Physical,
        size: usize,
        granularity: usize,
        devices: &[u32],
    ) -> Result<VmmMapping> {
        let reserved = Reserved::new(ordinal, size, granularity)?;
        let map = MappedRange::new(&reserved, &physical)?;
        map.grant(devices)?;
        Ok(VmmMapping {
            map,
            _reserved: reserved,
            physical,
            granularity,
        })
    }
}

// ---------------------------------------------------------------------
// Legacy IPC.

/// The legacy handles this process made and still holds: the driver
/// refuses to open them here, so an import of one is refused first with
/// the reason.
fn own_legacy_handles() -> &'static Mutex<HashSet<[u8; 64]>> {
    static OWN: OnceLock<Mutex<HashSet<[u8; 64]>>> = OnceLock::new();
    OWN.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A `cuMemAlloc` allocation and its IPC handle.
struct LegacyAlloc {
    ptr: sys::CUdeviceptr,
    ordinal: u32,
    handle: [u8; 64],
}

impl Drop for LegacyAlloc {
    fn drop(&mut self) {
        own_legacy_handles()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.handle);
        if let Err(e) = make_current(self.ordinal) {
            tracing::warn!("freeing legacy IPC memory of device {}: {e}", self.ordinal);
            return;
        }
        // SAFETY: `ptr` came from cuMemAlloc in this device's primary
        // context, now current, and is freed once.
        let rc = unsafe { sys::cuMemFree_v2(self.ptr) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!(
                "cuMemFree({:#x}) (device {}) failed: {rc:?}",
                self.ptr,
                self.ordinal
            );
        }
    }
}

/// A peer's legacy allocation opened here.
struct LegacyOpen {
    ptr: sys::CUdeviceptr,
    ordinal: u32,
}

impl Drop for LegacyOpen {
    fn drop(&mut self) {
        if let Err(e) = make_current(self.ordinal) {
            tracing::warn!(
                "closing a legacy IPC mapping on device {}: {e}",
                self.ordinal
            );
            return;
        }
        // SAFETY: `ptr` came from cuIpcOpenMemHandle in this device's
        // primary context, now current, and is closed once.
        let rc = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            tracing::warn!(
                "cuIpcCloseMemHandle({:#x}) (device {}) failed: {rc:?}",
                self.ptr,
                self.ordinal
            );
        }
    }
}

// ---------------------------------------------------------------------
// The owner's side.

enum Owned {
    Vmm(VmmMapping),
    Legacy(LegacyAlloc),
}

/// Device memory this process owns and other processes may map: the
/// receiver's FIFO of a cuda-ipc connection. Dropping it frees it here;
/// a peer's mapping keeps the memory alive until the peer drops it too
/// (VMM), or must be gone first (legacy: the memory is freed with the
/// owner's allocation).
pub struct SharedAlloc {
    ordinal: u32,
    size: usize,
    inner: Owned,
}

impl std::fmt::Debug for SharedAlloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedAlloc")
            .field("ordinal", &self.ordinal)
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("size", &self.size)
            .field("handle", &self.handle())
            .finish()
    }
}

impl SharedAlloc {
    /// At least `size` bytes (rounded up to the granularity) on device
    /// `ordinal`, read-write for it and for `peers` (other devices of this
    /// process that will access it directly), shareable with other
    /// processes: VMM where the device supports it, legacy IPC otherwise.
    pub fn new(ordinal: u32, size: usize, peers: &[u32]) -> Result<SharedAlloc> {
        SharedAlloc::with_mechanism(ordinal, size, peers, Mechanism::Auto)
    }

    /// [`SharedAlloc::new`] with the mechanism chosen by the caller.
    pub fn with_mechanism(
        ordinal: u32,
        size: usize,
        peers: &[u32],
        mechanism: Mechanism,
    ) -> Result<SharedAlloc> {
        if size == 0 {
            return Err(CudaError::InvalidArgument(
                "a shared allocation of 0 bytes".into(),
            ));
        }
        let dev = device(ordinal)?;
        let peers = other_devices(ordinal, peers)?;
        for &p in &peers {
            if !can_access_peer(p, ordinal)? {
                return Err(CudaError::InvalidArgument(format!(
                    "CUDA device {p} cannot access the memory of device {ordinal} \
                     (cuDeviceCanAccessPeer says no): it cannot be a peer of a shared \
                     allocation there"
                )));
            }
        }
        let support = support(ordinal)?;
        let use_vmm = match mechanism {
            Mechanism::Vmm if !support.vmm_with_fd() => {
                return Err(CudaError::InvalidArgument(format!(
                    "VMM sharing was asked for, but CUDA device {ordinal} lacks it \
                     ({support:?})"
                )))
            }
            Mechanism::Vmm => true,
            Mechanism::Legacy => false,
            Mechanism::Auto => {
                if !support.vmm_with_fd() {
                    tracing::info!(
                        "CUDA device {ordinal}: no VMM with POSIX fd handles ({support:?}); \
                         sharing memory through legacy IPC handles"
                    );
                }
                support.vmm_with_fd()
            }
        };
        make_current(ordinal)?;
        if use_vmm {
            let granularity = granularity_of(ordinal, dev)?;
            let size = round_up(size, granularity)?;
            let prop = allocation_prop(dev);
            let mut handle: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: `prop` is complete, `handle` a live local the driver
            // writes; `size` is a multiple of the granularity; flags 0.
            unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) }
                .result()
                .map_err(driver_err(
                    "cuMemCreate",
                    format!("device {ordinal}, {size} bytes, POSIX fd handle"),
                ))?;
            let physical = Physical { handle, ordinal };
            let mut devices = vec![ordinal];
            devices.extend(&peers);
            let mapping = VmmMapping::map(ordinal, physical, size, granularity, &devices)?;
            tracing::debug!(
                "CUDA device {ordinal}: {size} bytes of VMM memory at {:#x}, shareable by fd",
                mapping.map.ptr
            );
            Ok(SharedAlloc {
                ordinal,
                size,
                inner: Owned::Vmm(mapping),
            })
        } else {
            let size = round_up(size, LEGACY_GRANULARITY as usize)?;
            let mut ptr: sys::CUdeviceptr = 0;
            // SAFETY: the device's primary context is current; the driver
            // writes one address into a live local.
            unsafe { sys::cuMemAlloc_v2(&mut ptr, size) }
                .result()
                .map_err(driver_err(
                    "cuMemAlloc",
                    format!("device {ordinal}, {size} bytes"),
                ))?;
            let mut alloc = LegacyAlloc {
                ptr,
                ordinal,
                handle: [0; 64],
            };
            let mut ipc = sys::CUipcMemHandle { reserved: [0; 64] };
            // SAFETY: `ptr` is the base of a live cuMemAlloc allocation in
            // the current context; the driver fills the 64-byte handle.
            unsafe { sys::cuIpcGetMemHandle(&mut ipc, ptr) }
                .result()
                .map_err(driver_err(
                    "cuIpcGetMemHandle",
                    format!("device {ordinal}, {size} bytes at {ptr:#x}"),
                ))?;
            alloc.handle = ipc.reserved.map(|c| c as u8);
            own_legacy_handles()
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(alloc.handle);
            for &p in &peers {
                enable_peer_access(p, ordinal)?;
            }
            Ok(SharedAlloc {
                ordinal,
                size,
                inner: Owned::Legacy(alloc),
            })
        }
    }

    /// The device address of the memory (valid in every context of this
    /// process; kernels on the owner's device and the `peers` reach it).
    pub fn ptr(&self) -> u64 {
        match &self.inner {
            Owned::Vmm(m) => m.map.ptr,
            Owned::Legacy(a) => a.ptr,
        }
    }

    /// Bytes of the allocation (the size asked for, rounded up).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Set every byte to zero, and wait until it is done (a FIFO's
    /// counters must read 0 before any peer maps it).
    pub fn zero(&self) -> Result<()> {
        make_current(self.ordinal)?;
        let at = || format!("device {}, {} bytes", self.ordinal, self.size);
        // SAFETY: the allocation is live (self) and `size` bytes long from
        // `ptr()`, in the current (primary) context.
        unsafe { sys::cuMemsetD8_v2(self.ptr() as sys::CUdeviceptr, 0, self.size) }
            .result()
            .map_err(driver_err("cuMemsetD8", at()))?;
        // SAFETY: no arguments; the context is current on this thread.
        unsafe { sys::cuCtxSynchronize() }
            .result()
            .map_err(driver_err("cuCtxSynchronize", at()))
    }

    /// The device it lives on.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The mechanism in use: `Vmm` or `Legacy`, never `Auto`.
    pub fn mechanism(&self) -> Mechanism {
        match self.inner {
            Owned::Vmm(_) => Mechanism::Vmm,
            Owned::Legacy(_) => Mechanism::Legacy,
        }
    }

    /// What to send the peer process (its wire form:
    /// [`ShareHandle::encode`]). For VMM, the fd of
    /// [`SharedAlloc::export_fd`] travels beside it.
    pub fn handle(&self) -> ShareHandle {
        match &self.inner {
            Owned::Vmm(m) => ShareHandle::Fd {
                size: self.size as u64,
                granularity: m.granularity as u64,
            },
            Owned::Legacy(a) => ShareHandle::Legacy {
                handle: a.handle,
                size: self.size as u64,
            },
        }
    }

    /// A new POSIX fd of the allocation (`cuMemExportToShareableHandle`)
    /// to pass to a peer process (`fdpass::send_fds`), one per peer;
    /// closing it here after sending is right. `None` for legacy IPC,
    /// whose handle is all bytes.
    pub fn export_fd(&self) -> Result<Option<OwnedFd>> {
        let Owned::Vmm(m) = &self.inner else {
            return Ok(None);
        };
        make_current(self.ordinal)?;
        let mut fd: c_int = -1;
        // SAFETY: for CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the driver
        // writes one int (the new fd) through the pointer, a live local;
        // the allocation handle is live (self).
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut c_int).cast::<c_void>(),
                m.physical.handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        }
        .result()
        .map_err(driver_err(
            "cuMemExportToShareableHandle",
            format!("device {}, {} bytes", self.ordinal, self.size),
        ))?;
        if fd < 0 {
            return Err(CudaError::Driver {
                call: "cuMemExportToShareableHandle",
                reason: format!("it succeeded but gave fd {fd}"),
            });
        }
        // SAFETY: the driver just created this fd for us; nothing else
        // owns it.
        Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

// ---------------------------------------------------------------------
// The importer's side.

enum Imported {
    Vmm(VmmMapping),
    Legacy(LegacyOpen),
}

/// Another process's [`SharedAlloc`] mapped into this one: the sender's
/// view of a receiver's FIFO. Dropping it unmaps it (VMM: unmap, free the
/// addresses, release the imported handle; legacy: `cuIpcCloseMemHandle`).
pub struct Mapped {
    ordinal: u32,
    size: usize,
    inner: Imported,
}

impl std::fmt::Debug for Mapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapped")
            .field("ordinal", &self.ordinal)
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("size", &self.size)
            .field(
                "mechanism",
                &match self.inner {
                    Imported::Vmm(_) => "vmm",
                    Imported::Legacy(_) => "legacy",
                },
            )
            .finish()
    }
}

impl Mapped {
    /// Map the allocation `handle` describes for kernels on device
    /// `ordinal` of this process (and, VMM only, on `peers`, further
    /// devices of this process). `fd` is the descriptor that came with a
    /// [`ShareHandle::Fd`] (it stays the caller's: the driver takes its
    /// own reference, so it may be closed after this); a
    /// [`ShareHandle::Legacy`] comes without one.
    ///
    /// Refused before any driver call: a handle whose fields no handle
    /// has, an fd missing or extra, `peers` with a legacy handle (its
    /// mapping serves the importing device only), a legacy handle this
    /// process made (the driver refuses those; ranks of one process share
    /// the pointer).
    pub fn import(
        ordinal: u32,
        handle: &ShareHandle,
        fd: Option<BorrowedFd<'_>>,
        peers: &[u32],
    ) -> Result<Mapped> {
        handle.validate()?;
        let size = usize::try_from(handle.size()).map_err(|_| {
            CudaError::InvalidArgument(format!("a handle of {} bytes", handle.size()))
        })?;
        match (handle, &fd) {
            (ShareHandle::Fd { .. }, None) => {
                return Err(CudaError::InvalidArgument(
                    "a VMM handle needs the fd that came with it".into(),
                ))
            }
            (ShareHandle::Legacy { .. }, Some(_)) => {
                return Err(CudaError::InvalidArgument(
                    "a legacy IPC handle comes without an fd, one was given".into(),
                ))
            }
            (ShareHandle::Legacy { handle: bytes, .. }, None) => {
                if !peers.is_empty() {
                    return Err(CudaError::InvalidArgument(format!(
                        "a legacy IPC mapping serves the importing device only; peers \
                         {peers:?} were asked for (VMM handles can)"
                    )));
                }
                if own_legacy_handles()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(bytes)
                {
                    return Err(CudaError::InvalidArgument(
                        "this legacy IPC handle was made by this process, and \
                         cuIpcOpenMemHandle refuses those: ranks of one process share \
                         the device pointer instead"
                            .into(),
                    ));
                }
            }
            (ShareHandle::Fd { .. }, Some(_)) => {}
        }
        device(ordinal)?;
        let peers = other_devices(ordinal, peers)?;
        make_current(ordinal)?;
        let inner = match (handle, fd) {
            (&ShareHandle::Fd { granularity, .. }, Some(fd)) => {
                let mut h: sys::CUmemGenericAllocationHandle = 0;
                // SAFETY: for POSIX fd handles the driver takes the fd's
                // number as the pointer's value and only reads it (dups
                // its own reference); `fd` is open for the call (borrowed)
                // and `h` is a live local the driver writes.
                unsafe {
                    sys::cuMemImportFromShareableHandle(
                        &mut h,
                        fd.as_raw_fd() as usize as *mut c_void,
                        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    )
                }
                .result()
                .map_err(driver_err(
                    "cuMemImportFromShareableHandle",
                    format!("fd {} on device {ordinal}", fd.as_raw_fd()),
                ))?;
                let physical = Physical { handle: h, ordinal };
                let mut devices = vec![ordinal];
                devices.extend(&peers);
                Imported::Vmm(VmmMapping::map(
                    ordinal,
                    physical,
                    size,
                    granularity as usize,
                    &devices,
                )?)
            }
            (ShareHandle::Legacy { handle: bytes, .. }, None) => {
                let ipc = sys::CUipcMemHandle {
                    reserved: bytes.map(|b| b as std::ffi::c_char),
                };
                let mut ptr: sys::CUdeviceptr = 0;
                // SAFETY: the device's primary context is current; the
                // handle is passed by value and `ptr` is a live local the
                // driver writes.
                unsafe {
                    sys::cuIpcOpenMemHandle_v2(
                        &mut ptr,
                        ipc,
                        sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                    )
                }
                .result()
                .map_err(driver_err(
                    "cuIpcOpenMemHandle",
                    format!("on device {ordinal}, {size} bytes"),
                ))?;
                Imported::Legacy(LegacyOpen { ptr, ordinal })
            }
            _ => unreachable!("the pairs were checked above"),
        };
        Ok(Mapped {
            ordinal,
            size,
            inner,
        })
    }

    /// The device address of the mapping in this process.
    pub fn ptr(&self) -> u64 {
        match &self.inner {
            Imported::Vmm(m) => m.map.ptr,
            Imported::Legacy(l) => l.ptr,
        }
    }

    /// Bytes mapped.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device of this process it was mapped for.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// `Vmm` or `Legacy`.
    pub fn mechanism(&self) -> Mechanism {
        match self.inner {
            Imported::Vmm(_) => Mechanism::Vmm,
            Imported::Legacy(_) => Mechanism::Legacy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both sides may move between threads and be shared: every call
    /// makes its context current first.
    #[test]
    fn the_handles_are_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<SharedAlloc>();
        both::<Mapped>();
    }

    /// Arguments that need no driver are refused first, with or without
    /// one.
    #[test]
    fn bad_arguments_are_refused_before_the_driver() {
        let e = SharedAlloc::new(0, 0, &[]).unwrap_err();
        assert!(
            matches!(&e, CudaError::InvalidArgument(w) if w.contains("0 bytes")),
            "{e}"
        );
        let fd = ShareHandle::Fd {
            size: 1 << 21,
            granularity: 1 << 21,
        };
        let e = Mapped::import(0, &fd, None, &[]).unwrap_err();
        assert!(
            matches!(&e, CudaError::InvalidArgument(w) if w.contains("needs the fd")),
            "{e}"
        );
        let bad = ShareHandle::Fd {
            size: 3,
            granularity: 1 << 21,
        };
        let e = Mapped::import(0, &bad, None, &[]).unwrap_err();
        assert!(
            matches!(&e, CudaError::InvalidArgument(w) if w.contains("multiple")),
            "{e}"
        );
        let legacy = ShareHandle::Legacy {
            handle: [7; 64],
            size: LEGACY_GRANULARITY,
        };
        let e = Mapped::import(0, &legacy, None, &[1]).unwrap_err();
        assert!(
            matches!(&e, CudaError::InvalidArgument(w) if w.contains("peers")),
            "{e}"
        );
        let file = std::fs::File::open("/dev/null").unwrap();
        let e = Mapped::import(0, &legacy, Some(std::os::fd::AsFd::as_fd(&file)), &[]).unwrap_err();
        assert!(
            matches!(&e, CudaError::InvalidArgument(w) if w.contains("without an fd")),
            "{e}"
        );
    }

    /// Without a driver every entry point says `NoDevice` (never a cudarc
    /// panic); with one, an ordinal past the last is `InvalidArgument`.
    #[test]
    fn without_a_device_every_entry_point_says_no_device() {
        let fd_handle = ShareHandle::Fd {
            size: 1 << 21,
            granularity: 1 << 21,
        };
        let legacy = ShareHandle::Legacy {
            handle: [7; 64],
            size: LEGACY_GRANULARITY,
        };
        let file = std::fs::File::open("/dev/null").unwrap();
        let borrowed = std::os::fd::AsFd::as_fd(&file);
        match ferroccl_cuda::probe::driver() {
            Err(CudaError::NoDevice(_)) => {
                let no = |r: Result<()>, what: &str| match r {
                    Err(CudaError::NoDevice(why)) => assert!(!why.is_empty(), "{what}"),
                    other => panic!("{what}: expected NoDevice, got {other:?}"),
                };
                no(make_current(0), "make_current");
                no(support(0).map(drop), "support");
                no(granularity(0).map(drop), "granularity");
                no(enable_peer_access(0, 1), "enable_peer_access");
                no(enable_peer_access(0, 0), "enable_peer_access to itself");
                no(can_access_peer(0, 1).map(drop), "can_access_peer");
                for m in [Mechanism::Auto, Mechanism::Vmm, Mechanism::Legacy] {
                    no(
                        SharedAlloc::with_mechanism(0, 4096, &[], m).map(drop),
                        "SharedAlloc",
                    );
                }
                no(SharedAlloc::new(0, 1, &[1]).map(drop), "SharedAlloc::new");
                no(
                    Mapped::import(0, &fd_handle, Some(borrowed), &[]).map(drop),
                    "Mapped::import (fd)",
                );
                no(
                    Mapped::import(0, &legacy, None, &[]).map(drop),
                    "Mapped::import (legacy)",
                );
            }
            Ok(d) => {
                let past = d.devices as u32;
                let invalid = |r: Result<()>, what: &str| {
                    assert!(
                        matches!(r, Err(CudaError::InvalidArgument(_))),
                        "{what}: {r:?}"
                    )
                };
                invalid(make_current(past), "make_current");
                invalid(support(past).map(drop), "support");
                invalid(SharedAlloc::new(past, 1, &[]).map(drop), "SharedAlloc");
                invalid(SharedAlloc::new(0, 1, &[past]).map(drop), "peers");
                invalid(enable_peer_access(0, past), "enable_peer_access");
                invalid(
                    Mapped::import(past, &legacy, None, &[]).map(drop),
                    "Mapped::import",
                );
            }
            Err(other) => panic!("expected NoDevice, got {other:?}"),
        }
    }
}
