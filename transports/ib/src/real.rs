//! The real verbs (feature `ib`): [`Device`] and [`QueuePair`] on
//! libibverbs, through the raw bindings `ibverbs-sys` (those of the
//! `ibverbs` crate 0.9, which does not re-export them).
//!
//! Why one file of about 1,250 lines: it is the whole binding to
//! libibverbs, and every `unsafe` block of the crate is here (each verbs
//! object's creation, use and destruction is an FFI call), kept in one
//! place so that the FFI surface and the owners' drop order read
//! together; the safe transport above it (`conn/`) holds none.
//!
//! Why raw calls and not `ibverbs`'s safe types: those borrow one another
//! (`ProtectionDomain<'ctx>`, `QueuePair<'res>`), so a type holding a
//! context, its protection domain and its queue pairs together would be
//! self-referential. Here each verbs object has a small owner that frees
//! it on drop, and the owners hold `Arc`s to what they were made from
//! (queue pair → device → protection domain → context), so drop order is
//! right by construction: a queue pair is destroyed before its completion
//! queues, the regions are deregistered before the protection domain is
//! freed, the context is closed last.
//!
//! Not run on a real device yet (none here): see `docs/ib.md`.
//!
//! - [`probe`] lists devices and ports and applies `FERROCCL_IB_HCA`;
//! - [`IbDevice`] is one device's protection domain, opened for one port:
//!   it registers memory it owns (page-aligned, zeroed), caller memory
//!   where it is ([`IbDevice::register_host`], for zero-copy sends) and
//!   dma-buf memory (GPU memory, [`IbDevice::register_dmabuf`]);
//! - [`IbDevice::create_qp`] gives a [`PendingQp`] (RC, in INIT, receives
//!   posted) whose [`Endpoint`] goes to the peer; [`PendingQp::connect`]
//!   with the peer's endpoint takes it through RTR to RTS: an [`IbQp`].
#![allow(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

use std::alloc::{self, Layout};
use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::os::fd::RawFd;
use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;

use crate::config::{
    choose_gid, mtu_code, mtu_from_code, select_ports, ConfigError, Endpoint, Gid, GidKind,
    IbConfig, LinkLayer, Port, ProbeError,
};
use crate::verbs::{
    Completion, CompletionKind, Device, MemoryRegion, MrHandle, QpState, QueuePair, UserMemory,
    VerbsError, WcError, WriteRequest,
};

/// Errors of the real verbs outside the traits (opening, registering,
/// creating and connecting queue pairs).
#[derive(Debug, thiserror::Error)]
pub enum IbError {
    /// A verbs call failed.
    #[error("{call} failed: {source}")]
    Verbs {
        /// The call.
        call: String,
        /// Its error.
        #[source]
        source: io::Error,
    },
    /// Something asked for that cannot be done.
    #[error("{0}")]
    Invalid(String),
    /// A configuration error.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The error of a call that returned null or -1 and set `errno`.
fn last_err(call: impl Into<String>) -> IbError {
    IbError::Verbs {
        call: call.into(),
        source: io::Error::last_os_error(),
    }
}

/// The error of a call that returned an errno value (some verbs return it
/// positive, some negative).
fn rc_err(call: impl Into<String>, rc: c_int) -> IbError {
    IbError::Verbs {
        call: call.into(),
        source: io::Error::from_raw_os_error(rc.abs()),
    }
}

// ---------------------------------------------------------------------
// Owners of verbs objects.

/// The device list of `ibv_get_device_list`, freed on drop.
struct DeviceList {
    list: *mut *mut ffi::ibv_device,
    len: usize,
}

impl DeviceList {
    fn get() -> Result<Self, ProbeError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid place for the count; the call allocates
        // the list, freed once in `Drop`.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = io::Error::last_os_error();
            let hint = if e.raw_os_error() == Some(libc::ENOSYS) {
                " (no kernel RDMA support)"
            } else {
                ""
            };
            return Err(ProbeError::NoDevice(format!(
                "ibv_get_device_list failed: {e}{hint}"
            )));
        }
        Ok(Self {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    /// The devices with their names.
    fn devices(&self) -> Vec<(*mut ffi::ibv_device, String)> {
        (0..self.len)
            .map(|i| {
                // SAFETY: the list holds `len` valid entries (and a null
                // after them) until it is freed, which is after `self`.
                let dev = unsafe { *self.list.add(i) };
                // SAFETY: `dev` is a listed device; its name is a
                // NUL-terminated string owned by the library.
                let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) }
                    .to_string_lossy()
                    .into_owned();
                (dev, name)
            })
            .collect()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `list` came from `ibv_get_device_list` and is freed once.
        // Contexts opened from it stay valid after (libibverbs keeps the
        // device alive while opened).
        unsafe { ffi::ibv_free_device_list(self.list) };
    }
}

/// An open device (`ibv_context`), closed on drop.
struct Context {
    raw: *mut ffi::ibv_context,
    name: String,
}

// SAFETY: a context is only a handle; libibverbs' verbs may be called on
// it from any thread. Everything made from it holds it (by `Arc`) and is
// dropped before it.
unsafe impl Send for Context {}
// SAFETY: as for `Send`: the verbs called on a context are thread-safe.
unsafe impl Sync for Context {}

impl Context {
    fn open(dev: *mut ffi::ibv_device, name: &str) -> Result<Self, IbError> {
        // SAFETY: `dev` is an entry of a live device list.
        let raw = unsafe { ffi::ibv_open_device(dev) };
        if raw.is_null() {
            return Err(last_err(format!("ibv_open_device({name})")));
        }
        Ok(Self {
            raw,
            name: name.to_string(),
        })
    }

    fn open_by_name(name: &str) -> Result<Self, IbError> {
        let list = DeviceList::get().map_err(|e| IbError::Invalid(e.to_string()))?;
        let found = list.devices().into_iter().find(|(_, n)| n == name);
        match found {
            Some((dev, n)) => Self::open(dev, &n),
            None => Err(IbError::Invalid(format!("no RDMA device named {name}"))),
        }
    }

    /// The ports of this device, GID tables included for active ones.
    fn ports(&self) -> Result<Vec<Port>, IbError> {
        // SAFETY: an all-zero `ibv_device_attr` is a valid value (plain
        // integers and byte arrays).
        let mut dattr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `raw` is an open context, `dattr` a valid out-place.
        let rc = unsafe { ffi::ibv_query_device(self.raw, &mut dattr) };
        if rc != 0 {
            return Err(rc_err(format!("ibv_query_device({})", self.name), rc));
        }
        let mut out = Vec::new();
        for p in 1..=dattr.phys_port_cnt {
            let attr = self.query_port(p)?;
            let link_layer = if u32::from(attr.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET {
                LinkLayer::Ethernet
            } else {
                LinkLayer::Infiniband
            };
            let active = attr.state == ffi::ibv_port_state::IBV_PORT_ACTIVE;
            // The GID table is only meaningful on an active (or armed) port.
            let gids = if active {
                self.gids(p, attr.gid_tbl_len, link_layer)?
            } else {
                Vec::new()
            };
            out.push(Port {
                device: self.name.clone(),
                port: p,
                active,
                link_layer,
                lid: attr.lid,
                mtu: mtu_from_code(attr.active_mtu).unwrap_or(256),
                gids,
            });
        }
        Ok(out)
    }

    fn query_port(&self, port: u8) -> Result<ffi::ibv_port_attr, IbError> {
        // SAFETY: an all-zero `ibv_port_attr` is valid (integers only).
        let mut attr: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `raw` is open; the exported `ibv_query_port` fills the
        // leading, compatible part of the zeroed full structure (what the
        // header's inline wrapper does too).
        let rc = unsafe {
            ffi::ibv_query_port(
                self.raw,
                port,
                (&mut attr as *mut ffi::ibv_port_attr).cast::<ffi::_compat_ibv_port_attr>(),
            )
        };
        if rc != 0 {
            return Err(rc_err(format!("ibv_query_port({}:{port})", self.name), rc));
        }
        Ok(attr)
    }

    /// The non-empty GID entries of `port`, with their types when the
    /// library can tell them (`ibv_query_gid_ex`), else by `ibv_query_gid`.
    fn gids(&self, port: u8, table_len: c_int, link: LinkLayer) -> Result<Vec<Gid>, IbError> {
        let n = table_len.clamp(0, 256) as u32;
        let mut out = Vec::new();
        for index in 0..n {
            // SAFETY: an all-zero entry is valid (bytes and integers).
            let mut e: ffi::ibv_gid_entry = unsafe { std::mem::zeroed() };
            // SAFETY: `raw` is open and `e` is a valid out-place of the
            // size passed.
            let rc = unsafe {
                ffi::_ibv_query_gid_ex(
                    self.raw,
                    u32::from(port),
                    index,
                    &mut e,
                    0,
                    std::mem::size_of::<ffi::ibv_gid_entry>(),
                )
            };
            let (raw, kind) = if rc == 0 {
                // SAFETY: both views of the union are plain bytes.
                let raw = unsafe { e.gid.raw };
                let kind = match e.gid_type {
                    ffi::IBV_GID_TYPE_ROCE_V1 => GidKind::RoceV1,
                    ffi::IBV_GID_TYPE_ROCE_V2 => GidKind::RoceV2,
                    _ if link == LinkLayer::Ethernet => GidKind::Unknown,
                    _ => GidKind::Ib,
                };
                (raw, kind)
            } else if rc.abs() == libc::ENODATA {
                continue; // an empty slot of the table
            } else {
                // No typed query (old kernel or driver): the plain one.
                let mut g = ffi::ibv_gid { raw: [0; 16] };
                // SAFETY: `raw` is open, `g` a valid out-place.
                let rc = unsafe { ffi::ibv_query_gid(self.raw, port, index as c_int, &mut g) };
                if rc != 0 {
                    continue;
                }
                // SAFETY: both views of the union are plain bytes.
                let raw = unsafe { g.raw };
                let kind = match link {
                    LinkLayer::Infiniband => GidKind::Ib,
                    LinkLayer::Ethernet => GidKind::Unknown,
                };
                (raw, kind)
            };
            if raw.iter().any(|&b| b != 0) {
                out.push(Gid {
                    index: index as u8,
                    raw,
                    kind,
                });
            }
        }
        Ok(out)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `ibv_open_device` and is closed once;
        // every object made from it is gone (they hold this context).
        unsafe { ffi::ibv_close_device(self.raw) };
    }
}

/// A protection domain with its context.
struct Pd {
    raw: *mut ffi::ibv_pd,
    // Dropped after `raw` is freed (in `Drop` below, fields after).
    ctx: Context,
}

// SAFETY: as for `Context`: a handle whose verbs are thread-safe.
unsafe impl Send for Pd {}
// SAFETY: as for `Send`.
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `ibv_alloc_pd` and is freed once, after
        // the regions and queue pairs in it (they hold it).
        unsafe { ffi::ibv_dealloc_pd(self.raw) };
    }
}

/// Page-aligned, zeroed host memory we own.
struct HostMem {
    ptr: *mut u8,
    layout: Layout,
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated with `layout` and is freed once;
        // its registration is gone by now (see `Region`).
        unsafe { alloc::dealloc(self.ptr, self.layout) };
    }
}

/// A registered region: the `ibv_mr` and, for host memory, the memory.
struct Region {
    mr: *mut ffi::ibv_mr,
    len: usize,
    /// The address work requests name the first byte by: the virtual
    /// address for host memory, the iova for dma-buf memory.
    addr: u64,
    /// `None` for dma-buf (device) memory, which the CPU cannot reach here.
    mem: Option<HostMem>,
}

// SAFETY: the region owns its memory and registration; they are handles
// and bytes usable from any thread, and reached only under the device's
// region lock.
unsafe impl Send for Region {}

impl Region {
    fn keys(&self) -> (u32, u32, u64) {
        // SAFETY: `mr` is a live registration (deregistered only on drop).
        let mr = unsafe { &*self.mr };
        (mr.lkey, mr.rkey, self.addr)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `mr` came from a registration call and is deregistered
        // once, before the memory is freed (the `mem` field drops after).
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

// ---------------------------------------------------------------------
// Probing.

/// The ports to use: every device's ports (`ibv_get_device_list`, then
/// each port's state, link layer and GID table), filtered by
/// `cfg.hca` ([`select_ports`]). Without a device: [`ProbeError::NoDevice`].
pub fn probe(cfg: &IbConfig) -> Result<Vec<Port>, ProbeError> {
    let list = DeviceList::get()?;
    let devices = list.devices();
    if devices.is_empty() {
        return Err(ProbeError::NoDevice(
            "ibv_get_device_list listed none (no RDMA hardware, driver or soft-RoCE)".to_string(),
        ));
    }
    let mut ports = Vec::new();
    let mut failures = Vec::new();
    for (dev, name) in devices {
        match Context::open(dev, &name).and_then(|ctx| ctx.ports()) {
            Ok(p) => ports.extend(p),
            Err(e) => failures.push(e.to_string()),
        }
    }
    if ports.is_empty() && !failures.is_empty() {
        return Err(ProbeError::Verbs {
            call: "probing the devices".to_string(),
            detail: failures.join("; "),
        });
    }
    select_ports(&cfg.hca, &ports)
}

// ---------------------------------------------------------------------
// The device.

/// One device's protection domain, opened for one of its ports: memory
/// registration ([`Device`]) and queue pairs ([`IbDevice::create_qp`]).
/// Clones name the same protection domain.
#[derive(Clone)]
pub struct IbDevice {
    inner: Arc<DevInner>,
}

struct DevInner {
    regions: Mutex<HashMap<u64, Region>>,
    next: AtomicU64,
    page: usize,
    port: Port,
    gid: Option<Gid>,
    cfg: IbConfig,
    pd: Pd,
}

impl Drop for DevInner {
    fn drop(&mut self) {
        // Deregister before the protection domain is freed.
        lock(&self.regions).clear();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for IbDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbDevice")
            .field("port", &self.inner.port.describe())
            .field("gid", &self.inner.gid)
            .finish()
    }
}

impl IbDevice {
    /// Opens `port`'s device (a port from [`probe`]) and allocates a
    /// protection domain; picks the GID by [`choose_gid`].
    pub fn open(port: &Port, cfg: &IbConfig) -> Result<Self, IbError> {
        let gid = choose_gid(port, cfg.gid_index)?;
        let ctx = Context::open_by_name(&port.device)?;
        // SAFETY: `ctx.raw` is an open context.
        let raw = unsafe { ffi::ibv_alloc_pd(ctx.raw) };
        if raw.is_null() {
            return Err(last_err(format!("ibv_alloc_pd({})", port.device)));
        }
        // SAFETY: `sysconf` only reads a system constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Ok(Self {
            inner: Arc::new(DevInner {
                regions: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
                page: usize::try_from(page).unwrap_or(4096).max(4096),
                port: port.clone(),
                gid,
                cfg: cfg.clone(),
                pd: Pd { raw, ctx },
            }),
        })
    }

    /// The port this device was opened for.
    pub fn port(&self) -> &Port {
        &self.inner.port
    }

    /// The GID in use (`None`: an InfiniBand port without one).
    pub fn gid(&self) -> Option<Gid> {
        self.inner.gid
    }

    /// [`Device::register`] with the verbs error when it fails (the trait's
    /// error type has no variant for a failed registration).
    pub fn try_register(&self, len: usize) -> Result<MemoryRegion, IbError> {
        let d = &self.inner;
        let size = len.max(1).div_ceil(d.page) * d.page;
        let layout = Layout::from_size_align(size, d.page)
            .map_err(|e| IbError::Invalid(format!("cannot allocate {len} bytes: {e}")))?;
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(IbError::Invalid(format!("out of memory for {len} bytes")));
        }
        let mem = HostMem { ptr, layout };
        let access = (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0 as c_int;
        // Exactly `len` bytes (one for an empty region) are registered, so
        // the device refuses remote writes past the region's end.
        // SAFETY: the PD is live; `ptr` points to `size >= len.max(1)`
        // bytes we own, freed only after deregistration (`Region`).
        let mr = unsafe { ffi::ibv_reg_mr(d.pd.raw, ptr.cast(), len.max(1), access) };
        if mr.is_null() {
            return Err(last_err(format!("ibv_reg_mr({len} bytes)")));
        }
        Ok(self.insert(Region {
            mr,
            len,
            addr: ptr as u64,
            mem: Some(mem),
        }))
    }

    /// Registers device (e.g. GPU) memory exported as a dma-buf: `len`
    /// bytes at `offset` in the dma-buf `fd`, named `iova` on the wire
    /// (the returned region's `addr`), for local and remote write.
    ///
    /// The region serves as a write's local or remote slice; the CPU
    /// cannot reach it here, so `write_region` / `read_region` answer
    /// [`VerbsError::UnknownRegion`] for it. Needs a kernel and a NIC with
    /// dma-buf support (Linux 5.12 on, e.g. ConnectX with a peer-memory
    /// capable GPU driver). Not tested: no device here.
    pub fn register_dmabuf(
        &self,
        fd: RawFd,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> Result<MemoryRegion, IbError> {
        let access = (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0 as c_int;
        // SAFETY: the PD is live; the kernel validates `fd`, `offset` and
        // `len` against the dma-buf (a bad one fails the call, it does
        // not touch our memory).
        let mr =
            unsafe { ffi::ibv_reg_dmabuf_mr(self.inner.pd.raw, offset, len, iova, fd, access) };
        if mr.is_null() {
            return Err(last_err(format!(
                "ibv_reg_dmabuf_mr(fd {fd}, offset {offset}, {len} bytes)"
            )));
        }
        Ok(self.insert(Region {
            mr,
            len,
            addr: iova,
            mem: None,
        }))
    }

    /// Registers `len` bytes of caller memory at `addr` where they are,
    /// for the NIC to read only (the source of writes: no local or remote
    /// write access, so no peer can write into it). `ibv_reg_mr` pins the
    /// pages it finds now; the caller keeps the range allocated and mapped
    /// until it deregisters (see [`crate::regcache`]). The CPU side
    /// (`write_region`, `read_region`) refuses the region. Not tested: no
    /// device here.
    pub fn register_host(&self, addr: usize, len: usize) -> Result<MemoryRegion, IbError> {
        if addr == 0 || len == 0 {
            return Err(IbError::Invalid(format!(
                "cannot register {len} bytes at {addr:#x}"
            )));
        }
        // SAFETY: the PD is live. `ibv_reg_mr` neither reads nor writes the
        // bytes: it pins the pages mapped at `addr..addr + len` (failing
        // if any is not mapped). Access 0 lets the NIC only read them when
        // a write names this region, which happens only while the data
        // path holds the caller's borrow of them (`IbSender::send_from`
        // waits for the writes' completions).
        let mr = unsafe { ffi::ibv_reg_mr(self.inner.pd.raw, addr as *mut _, len, 0) };
        if mr.is_null() {
            return Err(last_err(format!(
                "ibv_reg_mr(caller memory, {len} bytes at {addr:#x})"
            )));
        }
        Ok(self.insert(Region {
            mr,
            len,
            addr: addr as u64,
            mem: None,
        }))
    }

    fn insert(&self, region: Region) -> MemoryRegion {
        let (lkey, rkey, addr) = region.keys();
        let len = region.len;
        let handle = MrHandle(self.inner.next.fetch_add(1, Ordering::Relaxed));
        lock(&self.inner.regions).insert(handle.0, region);
        MemoryRegion {
            handle,
            lkey,
            rkey,
            len,
            addr,
        }
    }

    /// A reliable connected queue pair on this device's port with a send
    /// queue of `depth` requests, in INIT with its receives posted. Give
    /// its [`PendingQp::endpoint`] to the peer, then
    /// [`PendingQp::connect`] with the peer's.
    pub fn create_qp(&self, depth: usize) -> Result<PendingQp, IbError> {
        let d = &self.inner;
        if depth == 0 || depth > 1 << 16 {
            return Err(IbError::Invalid(format!(
                "send queue depth {depth}: must be 1 to 65536"
            )));
        }
        // Receives for writes with immediate: at least as many as the peer
        // may have in flight; beyond that the peer waits (RNR retry,
        // unbounded) until a poll here reposts.
        let recv_depth = depth.max(16);
        let ctx = d.pd.ctx.raw;
        let cq = |n: usize| -> Result<Cq, IbError> {
            // SAFETY: `ctx` is open; no completion channel, vector 0.
            let raw =
                unsafe { ffi::ibv_create_cq(ctx, n as c_int, ptr::null_mut(), ptr::null_mut(), 0) };
            if raw.is_null() {
                Err(last_err(format!("ibv_create_cq({n})")))
            } else {
                Ok(Cq(raw))
            }
        };
        let scq = cq(depth)?;
        let rcq = cq(recv_depth)?;
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: scq.0,
            recv_cq: rcq.0,
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: depth as u32,
                max_recv_wr: recv_depth as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: the PD and both CQs are live; `init` is fully set.
        let qp = unsafe { ffi::ibv_create_qp(d.pd.raw, &mut init) };
        if qp.is_null() {
            return Err(last_err(format!("ibv_create_qp(RC, depth {depth})")));
        }
        let res = QpRes {
            qp,
            scq,
            rcq,
            dev: Arc::clone(&self.inner),
        };

        // SAFETY: all-zero is a valid `ibv_qp_attr` (integers, unions of
        // bytes).
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = d.port.port;
        attr.qp_access_flags = (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0;
        use ffi::ibv_qp_attr_mask as M;
        res.modify(
            &mut attr,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;
        for _ in 0..recv_depth {
            res.post_recv()?;
        }
        let mut h = RandomState::new().build_hasher();
        h.write_u32(res.qp_num());
        let psn = (h.finish() as u32) & 0x00ff_ffff;
        let local = Endpoint {
            qpn: res.qp_num(),
            psn,
            lid: d.port.lid,
            gid: d.gid.map_or([0; 16], |g| g.raw),
            port: d.port.port,
            mtu: d.port.mtu,
        };
        Ok(PendingQp { res, depth, local })
    }

    fn with_region<T>(
        &self,
        mr: MrHandle,
        offset: usize,
        len: usize,
        f: impl FnOnce(*mut u8) -> T,
    ) -> Result<T, VerbsError> {
        let regions = lock(&self.inner.regions);
        let r = regions.get(&mr.0).ok_or(VerbsError::UnknownRegion(mr))?;
        let mem = r.mem.as_ref().ok_or(VerbsError::UnknownRegion(mr))?;
        match offset.checked_add(len) {
            Some(end) if end <= r.len => {
                // SAFETY: `offset + len <= r.len <= allocation size`.
                Ok(f(unsafe { mem.ptr.add(offset) }))
            }
            _ => Err(VerbsError::OutOfBounds {
                offset,
                len,
                region_len: r.len,
            }),
        }
    }
}

impl Device for IbDevice {
    /// Registers `len` zeroed, page-aligned bytes. The trait has no error
    /// for a failed registration (memory lock limit, ...): that is
    /// reported as `OutOfBounds { offset: 0, len, region_len: 0 }`; use
    /// [`IbDevice::try_register`] for the reason.
    fn register(&self, len: usize) -> Result<MemoryRegion, VerbsError> {
        self.try_register(len).map_err(|_| VerbsError::OutOfBounds {
            offset: 0,
            len,
            region_len: 0,
        })
    }

    /// Host memory through [`IbDevice::register_host`], dma-buf through
    /// [`IbDevice::register_dmabuf`]; a failure is
    /// [`VerbsError::Registration`] with the driver's reason (a dma-buf
    /// refused by a kernel or NIC without support comes back this way, and
    /// the caller stages through host memory instead).
    fn register_user(&self, mem: UserMemory) -> Result<MemoryRegion, VerbsError> {
        let done = match mem {
            UserMemory::Host { addr, len } => self.register_host(addr, len),
            UserMemory::DmaBuf {
                fd,
                offset,
                len,
                iova,
            } => self.register_dmabuf(fd, offset, len, iova),
        };
        done.map_err(|e| VerbsError::Registration(e.to_string()))
    }

    /// Checks only that `bytes` are at the region's address plus `offset`
    /// and inside it: the NIC reads them there itself.
    fn present(&self, mr: MrHandle, offset: usize, bytes: &[u8]) -> Result<(), VerbsError> {
        let regions = lock(&self.inner.regions);
        let r = regions.get(&mr.0).ok_or(VerbsError::UnknownRegion(mr))?;
        let inside = offset
            .checked_add(bytes.len())
            .is_some_and(|end| end <= r.len);
        let at = r.addr.checked_add(offset as u64);
        if r.mem.is_some() || !inside || at != Some(bytes.as_ptr() as u64) {
            return Err(VerbsError::OutOfBounds {
                offset,
                len: bytes.len(),
                region_len: r.len,
            });
        }
        Ok(())
    }

    fn deregister(&self, mr: MrHandle) -> Result<(), VerbsError> {
        let region = lock(&self.inner.regions).remove(&mr.0);
        // Dropping deregisters, then frees the memory.
        region.map(drop).ok_or(VerbsError::UnknownRegion(mr))
    }

    fn write_region(&self, mr: MrHandle, offset: usize, data: &[u8]) -> Result<(), VerbsError> {
        self.with_region(mr, offset, data.len(), |dst| {
            // SAFETY: `dst` has `data.len()` bytes in our allocation (bounds
            // checked); `data` is a distinct Rust slice. The memory is
            // shared with the NIC like DMA memory: reached only through raw
            // pointers, never as a Rust reference.
            unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) }
        })
    }

    fn read_region(&self, mr: MrHandle, offset: usize, out: &mut [u8]) -> Result<(), VerbsError> {
        self.with_region(mr, offset, out.len(), |src| {
            // SAFETY: as in `write_region`, the other way.
            unsafe { ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) }
        })
    }
}

// ---------------------------------------------------------------------
// Queue pairs.

/// A completion queue, destroyed on drop.
struct Cq(*mut ffi::ibv_cq);

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: from `ibv_create_cq`, destroyed once, after the queue
        // pair using it (`QpRes` drops its `qp` first).
        unsafe { ffi::ibv_destroy_cq(self.0) };
    }
}

/// A queue pair with its completion queues and device.
struct QpRes {
    qp: *mut ffi::ibv_qp,
    scq: Cq,
    rcq: Cq,
    dev: Arc<DevInner>,
}

// SAFETY: handles whose verbs are thread-safe; besides, an `IbQp` makes
// every call on them under its own lock.
unsafe impl Send for QpRes {}
// SAFETY: as for `Send`.
unsafe impl Sync for QpRes {}

impl Drop for QpRes {
    fn drop(&mut self) {
        // SAFETY: from `ibv_create_qp`, destroyed once, before its CQs
        // (fields drop after this) and its PD (held by `dev`).
        unsafe { ffi::ibv_destroy_qp(self.qp) };
    }
}

/// wr_id of the zero-length receives (receive completions are told apart
/// by their queue, not by this).
const RECV_WR_ID: u64 = 0;

impl QpRes {
    fn qp_num(&self) -> u32 {
        // SAFETY: `qp` is live; `qp_num` is set at creation.
        unsafe { (*self.qp).qp_num }
    }

    fn modify(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
        to: &str,
    ) -> Result<(), IbError> {
        // SAFETY: `qp` is live; `attr` is valid for the fields `mask` names.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as c_int) };
        if rc != 0 {
            return Err(rc_err(format!("ibv_modify_qp(to {to})"), rc));
        }
        Ok(())
    }

    /// Posts one zero-length receive (for a write with immediate).
    fn post_recv(&self) -> Result<(), IbError> {
        let mut wr = ffi::ibv_recv_wr {
            wr_id: RECV_WR_ID,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
        // SAFETY: `qp` is live and its context's ops table is filled by the
        // driver; `wr` is a valid single request with no buffers, read
        // during the call only.
        let rc = unsafe {
            let ctx = (*self.qp).context;
            match (*ctx).ops.post_recv {
                Some(post) => post(self.qp, &mut wr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            return Err(rc_err("ibv_post_recv", rc));
        }
        Ok(())
    }

    fn poll_cq(&self, cq: &Cq, max: usize) -> Result<Vec<ffi::ibv_wc>, IbError> {
        let mut wcs = vec![ffi::ibv_wc::default(); max.min(64)];
        if wcs.is_empty() {
            return Ok(wcs);
        }
        // SAFETY: `cq` is live, its context's ops table is the driver's;
        // `wcs` has room for the count passed.
        let n = unsafe {
            let ctx = (*cq.0).context;
            match (*ctx).ops.poll_cq {
                Some(poll) => poll(cq.0, wcs.len() as c_int, wcs.as_mut_ptr()),
                None => -libc::ENOSYS,
            }
        };
        if n < 0 {
            return Err(rc_err("ibv_poll_cq", n));
        }
        wcs.truncate(n as usize);
        Ok(wcs)
    }
}

/// A queue pair created and in INIT, not connected yet.
pub struct PendingQp {
    res: QpRes,
    depth: usize,
    local: Endpoint,
}

impl std::fmt::Debug for PendingQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingQp")
            .field("local", &self.local)
            .finish()
    }
}

impl PendingQp {
    /// What the peer needs to connect to this queue pair.
    pub fn endpoint(&self) -> Endpoint {
        self.local
    }

    /// Connects to the peer's `remote` endpoint: INIT → RTR → RTS, with
    /// the configured timeout and retry count, the path MTU the smaller of
    /// both ports' active MTU, the GRH (GID addressing) on RoCE or when
    /// the peer has no LID.
    pub fn connect(self, remote: &Endpoint) -> Result<IbQp, IbError> {
        let d = Arc::clone(&self.res.dev);
        let mtu = self.local.mtu.min(remote.mtu);
        let mtu = mtu_code(mtu).ok_or_else(|| IbError::Invalid(format!("MTU {mtu}")))?;
        let global = d.port.link_layer == LinkLayer::Ethernet || remote.lid == 0;
        // SAFETY: all-zero is a valid `ibv_qp_attr`.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = mtu;
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = 1;
        attr.min_rnr_timer = 12; // 0.64 ms
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = d.port.port;
        if global {
            let gid = d.gid.ok_or_else(|| {
                IbError::Invalid(format!(
                    "{} has no GID, needed to reach the peer (RoCE, or peer without LID)",
                    d.port.describe()
                ))
            })?;
            attr.ah_attr.is_global = 1;
            attr.ah_attr.grh.dgid = ffi::ibv_gid { raw: remote.gid };
            attr.ah_attr.grh.sgid_index = gid.index;
            attr.ah_attr.grh.hop_limit = 255;
            attr.ah_attr.grh.traffic_class = 0;
            attr.ah_attr.grh.flow_label = 0;
        }
        use ffi::ibv_qp_attr_mask as M;
        self.res.modify(
            &mut attr,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        // SAFETY: all-zero is a valid `ibv_qp_attr`.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        attr.timeout = d.cfg.timeout;
        attr.retry_cnt = d.cfg.retry_cnt;
        attr.rnr_retry = 7; // wait for receives without limit
        attr.sq_psn = self.local.psn;
        attr.max_rd_atomic = 1;
        self.res.modify(
            &mut attr,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )?;
        Ok(IbQp {
            res: self.res,
            depth: self.depth,
            local: self.local,
            remote: *remote,
            st: Mutex::new(QpSt::default()),
        })
    }
}

/// A connected reliable connected queue pair ([`QueuePair`]).
///
/// Send completions come from its send CQ, receive completions (writes
/// with immediate) from its receive CQ; one zero-length receive is
/// reposted per receive completion taken. Receives flushed once the queue
/// pair is in error are not reported (they carry no data; [`state`]
/// says `Error`). `wait` polls (no completion channel): it spins briefly,
/// then sleeps 20 µs between polls.
///
/// [`state`]: QueuePair::state
pub struct IbQp {
    res: QpRes,
    depth: usize,
    local: Endpoint,
    remote: Endpoint,
    st: Mutex<QpSt>,
}

#[derive(Default)]
struct QpSt {
    outstanding: usize,
    failed: bool,
    /// Completions made up for posts the library refused.
    made_up: VecDeque<Completion>,
}

impl std::fmt::Debug for IbQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbQp")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("depth", &self.depth)
            .finish()
    }
}

impl IbQp {
    /// This end's endpoint.
    pub fn local(&self) -> Endpoint {
        self.local
    }

    /// The peer's endpoint.
    pub fn remote(&self) -> Endpoint {
        self.remote
    }
}

fn wc_error(status: ffi::ibv_wc_status::Type, vendor: u32) -> WcError {
    use ffi::ibv_wc_status as S;
    // SAFETY: returns a static NUL-terminated string for any status.
    let name = unsafe { CStr::from_ptr(ffi::ibv_wc_status_str(status)) }.to_string_lossy();
    let text = format!("{name} (status {status}, vendor error {vendor:#x})");
    match status {
        S::IBV_WC_WR_FLUSH_ERR => WcError::Flushed,
        S::IBV_WC_REM_ACCESS_ERR | S::IBV_WC_REM_INV_REQ_ERR | S::IBV_WC_REM_OP_ERR => {
            WcError::RemoteAccess(text)
        }
        S::IBV_WC_LOC_PROT_ERR
        | S::IBV_WC_LOC_ACCESS_ERR
        | S::IBV_WC_LOC_LEN_ERR
        | S::IBV_WC_LOC_QP_OP_ERR => WcError::LocalProtection(text),
        _ => WcError::RetryExceeded(text),
    }
}

impl QueuePair for IbQp {
    /// RDMA WRITE (WITH IMMEDIATE), signaled. A local slice whose region
    /// is not this device's is refused with [`VerbsError::UnknownRegion`]
    /// (the emulation completes it with a local protection error; here
    /// there is no key to post it with); one past its region's end is
    /// posted and the NIC completes it with a local protection error.
    fn post_write(&self, wr: &WriteRequest) -> Result<(), VerbsError> {
        let mut st = lock(&self.st);
        if st.outstanding >= self.depth {
            return Err(VerbsError::SendQueueFull { depth: self.depth });
        }
        let length = u32::try_from(wr.local.len).map_err(|_| VerbsError::OutOfBounds {
            offset: wr.local.offset,
            len: wr.local.len,
            region_len: u32::MAX as usize,
        })?;
        let (lkey, base) = {
            let regions = lock(&self.res.dev.regions);
            let r = regions
                .get(&wr.local.mr.0)
                .ok_or(VerbsError::UnknownRegion(wr.local.mr))?;
            let (lkey, _, addr) = r.keys();
            (lkey, addr)
        };
        let mut sge = ffi::ibv_sge {
            addr: base.wrapping_add(wr.local.offset as u64),
            length,
            lkey,
        };
        let mut swr = ffi::ibv_send_wr {
            wr_id: wr.wr_id,
            next: ptr::null_mut(),
            sg_list: if length == 0 {
                ptr::null_mut()
            } else {
                &mut sge
            },
            num_sge: c_int::from(length != 0),
            opcode: if wr.imm.is_some() {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE
            },
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        // Verbs wants the immediate in network byte order.
        swr.__bindgen_anon_1.imm_data = wr.imm.unwrap_or(0).to_be();
        swr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
            remote_addr: wr.remote.addr,
            rkey: wr.remote.rkey,
        };
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: `qp` is live and its context's ops table is the driver's;
        // `swr` and `sge` are valid for the call, which copies them into
        // the send queue. The bytes named are in a registered region (the
        // NIC checks the key and bounds).
        let rc = unsafe {
            let ctx = (*self.res.qp).context;
            match (*ctx).ops.post_send {
                Some(post) => post(self.res.qp, &mut swr, &mut bad),
                None => libc::ENOSYS,
            }
        };
        st.outstanding += 1;
        if rc != 0 {
            if rc.abs() == libc::ENOMEM {
                st.outstanding -= 1;
                return Err(VerbsError::SendQueueFull { depth: self.depth });
            }
            // No variant for this in the trait: complete the request with
            // an error, and count the queue pair as broken.
            st.failed = true;
            st.made_up.push_back(Completion {
                wr_id: wr.wr_id,
                kind: CompletionKind::SendDone,
                status: Err(WcError::LocalProtection(format!(
                    "ibv_post_send refused the request: {}",
                    io::Error::from_raw_os_error(rc.abs())
                ))),
            });
        }
        Ok(())
    }

    fn poll(&self, max: usize) -> Vec<Completion> {
        let mut st = lock(&self.st);
        let mut out = Vec::new();
        while out.len() < max {
            let Some(c) = st.made_up.pop_front() else {
                break;
            };
            st.outstanding = st.outstanding.saturating_sub(1);
            out.push(c);
        }
        if out.len() < max {
            match self.res.poll_cq(&self.res.scq, max - out.len()) {
                Ok(wcs) => {
                    for wc in wcs {
                        st.outstanding = st.outstanding.saturating_sub(1);
                        let status = match wc.error() {
                            None => Ok(()),
                            Some((s, v)) => {
                                st.failed = true;
                                Err(wc_error(s, v))
                            }
                        };
                        out.push(Completion {
                            wr_id: wc.wr_id(),
                            kind: CompletionKind::SendDone,
                            status,
                        });
                    }
                }
                Err(_) => st.failed = true,
            }
        }
        if out.len() < max {
            match self.res.poll_cq(&self.res.rcq, max - out.len()) {
                Ok(wcs) => {
                    for wc in wcs {
                        match wc.error() {
                            None => {
                                if self.res.post_recv().is_err() {
                                    st.failed = true;
                                }
                                out.push(Completion {
                                    wr_id: 0,
                                    kind: CompletionKind::RecvWithImm {
                                        imm: u32::from_be(wc.imm_data),
                                        len: wc.len(),
                                    },
                                    status: Ok(()),
                                });
                            }
                            Some((ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR, _)) => {
                                st.failed = true;
                            }
                            Some((s, v)) => {
                                st.failed = true;
                                out.push(Completion {
                                    wr_id: 0,
                                    kind: CompletionKind::RecvWithImm { imm: 0, len: 0 },
                                    status: Err(wc_error(s, v)),
                                });
                            }
                        }
                    }
                }
                Err(_) => st.failed = true,
            }
        }
        out
    }

    fn wait(&self, max: usize, timeout: Duration) -> Vec<Completion> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let got = self.poll(max);
            if !got.is_empty() || max == 0 || start.elapsed() >= timeout {
                return got;
            }
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(
                    Duration::from_micros(20).min(timeout - start.elapsed().min(timeout)),
                );
            }
        }
    }

    /// `Error` once an error completion was seen or a post refused, or
    /// when `ibv_query_qp` says ERR or SQE; else `Ready`.
    fn state(&self) -> QpState {
        let mut st = lock(&self.st);
        if st.failed {
            return QpState::Error;
        }
        // SAFETY: all-zero attribute structures are valid.
        let (mut attr, mut init): (ffi::ibv_qp_attr, ffi::ibv_qp_init_attr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: `qp` is live; both out-places are valid.
        let rc = unsafe {
            ffi::ibv_query_qp(
                self.res.qp,
                &mut attr,
                ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int,
                &mut init,
            )
        };
        if rc != 0
            || attr.qp_state == ffi::ibv_qp_state::IBV_QPS_ERR
            || attr.qp_state == ffi::ibv_qp_state::IBV_QPS_SQE
        {
            st.failed = true;
            return QpState::Error;
        }
        QpState::Ready
    }

    fn outstanding(&self) -> usize {
        lock(&self.st).outstanding
    }
}
