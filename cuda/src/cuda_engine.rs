//! [`CudaEngine`]: the [`Engine`] on a real GPU (staging, gates and the
//! device executor's launches), over the CUDA driver API (cudarc's
//! `result`/`sys` layer, loaded at run time).
//!
//! Handles are the driver's own values: a [`DeviceBuf`] is a
//! `CUdeviceptr` (so a user's buffer needs no registration: its address is
//! its handle), a [`PinnedBuf`] the host address of a `cuMemHostAlloc`
//! allocation, a [`Stream`] a `CUstream` and an [`Event`] a `CUevent`.
//! Every method makes the engine's context current on the calling thread
//! first (the primary context of its device, as the runtime API and
//! PyTorch use), so any thread may call it.
//!
//! The kernels are compiled by NVRTC for the device's own architecture at
//! the first engine of a device in the process, and the module is kept for
//! the process's life (`loaded`).
//!
//! Nothing here has run on a GPU yet: the build machines have none. The
//! GPU run (`cuda/gpu/run.sh`) is where it is tested.
//!
//! Why one file of about 1,080 lines: it is the one `impl Engine` for the
//! driver, each method a short sequence of driver calls with the context
//! made current and the errors mapped, sharing the per-device `Loaded` and
//! the gate and retirement bookkeeping of the device rule.

use crate::device::{
    gate_reached, DeviceBuf, DevicePtr, Engine, Event, Gate, PinnedBuf, Retired, Stream,
};
use crate::error::{CudaError, Result};
use crate::executor::{self, ExecLaunch, Protocol, EXEC_THREADS};
use crate::kernels::{self, BLOCK_THREADS};
use crate::{nvrtc, probe, DataType, ReduceOp};
use cudarc::driver::{result, sys, DriverError};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A device's context and its loaded kernels, shared by every engine of
/// that device in the process.
struct Loaded {
    ctx: sys::CUcontext,
    multiprocessors: u32,
    functions: HashMap<String, sys::CUfunction>,
    arch: String,
}

// SAFETY: a CUcontext and the CUfunctions of a module loaded in it are
// driver handles valid in every thread of the process (the driver API
// documents contexts as usable from any thread once made current, which
// every method does first); the map is never changed after loading.
unsafe impl Send for Loaded {}
// SAFETY: as above; nothing in `Loaded` is mutated after construction.
unsafe impl Sync for Loaded {}

/// The staging engine of one CUDA device.
pub struct CudaEngine {
    ordinal: usize,
    loaded: Arc<Loaded>,
    /// The pinned allocations, by host address.
    pinned: Mutex<HashMap<u64, Pinned>>,
    /// Gates: words of mapped pinned pages, handed out in order and never
    /// freed (a stream may wait at one after its owner is gone).
    gates: Mutex<Gates>,
    /// What was retired while a gate was held (the device rule); the lock
    /// also orders retiring against new waits at gates.
    retired: Mutex<Vec<Retired>>,
    /// An event recorded after each executor kernel not yet seen ended: a
    /// kernel may wait for a peer's kernel that a host thread has yet to
    /// launch, so while one is in flight nothing may wait for every
    /// stream (the device rule).
    kernels: Mutex<Vec<Event>>,
    /// Events made and not in use: `event` takes one, `free_event` gives
    /// it back. Creating or destroying an event takes a driver lock that a
    /// thread waiting inside the driver for a parked stream holds (a
    /// user's pageable copy to the host after a device call; seen on the
    /// first GPU run, docs/hardware.md), so the progress thread, which
    /// raises the gate that stream waits for, must do neither while a gate
    /// is held: the events are made up front and reused.
    events: Mutex<Vec<Event>>,
    /// Streams made and not in use, for the same reason: `cuStreamCreate`
    /// blocks there too (a staging pipeline is made on the progress
    /// thread), so streams are made up front and kept.
    streams: Mutex<Vec<Stream>>,
    /// Whether a pool ran out under a gate and said so (once an engine).
    pool_warned: std::sync::atomic::AtomicBool,
}

/// Streams made with each engine: two a staging pipeline.
pub const STREAM_POOL: usize = 8;

/// Events made with each engine ([`CudaEngine::new`]); past them `event`
/// makes more (logged: the device rule's lock above).
pub const EVENT_POOL: usize = 512;

/// Pages of gate words: a [`Gate`] is a word's host address; the device
/// reads it through the page's device mapping.
#[derive(Default)]
struct Gates {
    /// (host address, device address) of each page, newest last.
    pages: Vec<(u64, u64)>,
    /// Words handed out of the newest page.
    used: usize,
    /// Device address of each gate handed out.
    device: HashMap<u64, u64>,
    /// Per gate, the value the latest stream wait at it waits for.
    waited: HashMap<u64, u32>,
}

/// Bytes of each page of gates.
const GATE_PAGE: usize = 4096;

/// How long `host_wait` spins on the event before it yields the core.
const HOST_WAIT_SPIN: Duration = Duration::from_micros(50);
/// How long `host_wait` yields between polls before it sleeps: a sleep's
/// overshoot (tens of microseconds) is small against calls this long.
const HOST_WAIT_YIELD: Duration = Duration::from_millis(2);

thread_local! {
    /// This thread's latest `host_wait` that ended at its timeout: the
    /// event, when that wait started, when it ended.
    static LAST_WAIT: std::cell::Cell<Option<(u64, Instant, Instant)>> =
        const { std::cell::Cell::new(None) };
}

/// What a host function waits for where the device cannot wait at a gate
/// itself (`gate_wait`).
struct GateWait {
    word: u64,
    value: u32,
    deadline: Instant,
}

/// A host function the driver runs in stream order (`cuLaunchHostFunc`)
/// where stream memory operations are not supported: it holds the stream
/// until the gate has reached the value, or until the deadline.
unsafe extern "C" fn gate_wait(data: *mut c_void) {
    // SAFETY: `data` is the `Box<GateWait>` leaked by `stream_wait_gate`
    // for exactly this one call.
    let wait = unsafe { Box::from_raw(data.cast::<GateWait>()) };
    // SAFETY: the word lies in a gate page, which is never freed.
    let word = unsafe { &*(wait.word as *const AtomicU32) };
    while !gate_reached(word.load(Ordering::Acquire), wait.value) && Instant::now() < wait.deadline
    {
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// A host function the driver runs in stream order where the device
/// cannot write a gate word itself: it raises the gate (never lowering it).
unsafe extern "C" fn gate_raise(data: *mut c_void) {
    // SAFETY: `data` is the `Box<(u64, u32)>` leaked by
    // `stream_raise_gate` for exactly this one call.
    let raise = unsafe { Box::from_raw(data.cast::<(u64, u32)>()) };
    let (word, value) = *raise;
    // SAFETY: the word lies in a gate page, which is never freed.
    let word = unsafe { &*(word as *const AtomicU32) };
    let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
        (!gate_reached(w, value)).then_some(value)
    });
}

/// A pinned allocation: its size, and an event recorded after every copy
/// that uses it, so that host access can be refused while one is pending.
struct Pinned {
    len: usize,
    last_copy: sys::CUevent,
    /// Held while the host has the buffer's bytes (`with_pinned`), so
    /// that two threads never hold them at once.
    access: Arc<Mutex<()>>,
}

// SAFETY: a CUevent is a driver handle usable from any thread of the
// process once its context is current (every method binds it first).
unsafe impl Send for Pinned {}

fn driver_err(call: &'static str) -> impl Fn(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        reason: format!("{e:?}"),
    }
}

/// The loaded module of device `ordinal`, compiled and loaded at the first
/// call for that device.
fn loaded(ordinal: usize) -> Result<Arc<Loaded>> {
    static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Loaded>>>> = OnceLock::new();
    let devices = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut devices = devices.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = devices.get(&ordinal) {
        return Ok(l.clone());
    }
    let l = Arc::new(load(ordinal)?);
    devices.insert(ordinal, l.clone());
    Ok(l)
}

fn load(ordinal: usize) -> Result<Loaded> {
    let driver = probe::driver()?;
    let dev = crate::topo::device(u32::try_from(ordinal).unwrap_or(u32::MAX))?;
    let attr = |a: sys::CUdevice_attribute, call: &'static str| -> Result<i32> {
        // SAFETY: `dev` is a device handle the driver just returned.
        unsafe { result::device::get_attribute(dev, a) }.map_err(driver_err(call))
    };
    use sys::CUdevice_attribute as A;
    let major = attr(
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        "cuDeviceGetAttribute(major)",
    )?;
    let minor = attr(
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        "cuDeviceGetAttribute(minor)",
    )?;
    let sms = attr(
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        "cuDeviceGetAttribute(multiprocessors)",
    )?;
    // SAFETY: retains the device's primary context (released never: it is
    // kept for the process's life, as the module loaded in it).
    let ctx = unsafe { result::primary_ctx::retain(dev) }
        .map_err(driver_err("cuDevicePrimaryCtxRetain"))?;
    // SAFETY: `ctx` is the context just retained.
    unsafe { result::ctx::set_current(ctx) }.map_err(driver_err("cuCtxSetCurrent"))?;
    let arch = format!("sm_{major}{minor}");
    let cubin = nvrtc::compile_kernels(&arch)?;
    let mut image = cubin.image;
    image.push(0);
    // SAFETY: `image` is a complete CUBIN from NVRTC for this device's
    // architecture; the driver copies it during the call.
    let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
        .map_err(driver_err("cuModuleLoadData"))?;
    let mut functions = HashMap::new();
    for name in kernels::names() {
        let cname = CString::new(name.as_str()).expect("kernel names have no NUL");
        // SAFETY: `module` was loaded above and is never unloaded; the
        // name is a NUL-terminated kernel name of the table.
        let f = unsafe { result::module::get_function(module, cname) }
            .map_err(driver_err("cuModuleGetFunction"))?;
        functions.insert(name.clone(), f);
    }
    tracing::info!(
        "CUDA device {ordinal}: {arch}, {sms} multiprocessors, driver {}, {} kernels \
         compiled in {:?}",
        driver.version,
        functions.len(),
        cubin.elapsed
    );
    Ok(Loaded {
        ctx,
        multiprocessors: sms.max(1) as u32,
        functions,
        arch,
    })
}

/// The executor kernel `name` of device `ordinal`, compiled and loaded at
/// its first use in the process (the current context must be the
/// device's primary one).
fn executor_function(
    ordinal: usize,
    arch: &str,
    protocol: Protocol,
    op: Option<ReduceOp>,
    ty: DataType,
    before_load: &dyn Fn(),
) -> Result<sys::CUfunction> {
    // Keyed by the unroll option too: a kernel compiled under one
    // FERROCCL_EXEC_UNROLL is not the kernel of another.
    type Key = (usize, String, Option<String>);
    static FUNCTIONS: OnceLock<Mutex<HashMap<Key, usize>>> = OnceLock::new();
    let name = executor::kernel_name(protocol, op, ty);
    let unroll = executor::unroll_option(std::env::var(executor::UNROLL_ENV).ok().as_deref())?;
    let key = (ordinal, name, unroll);
    let map = FUNCTIONS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&f) = map.get(&key) {
        return Ok(f as sys::CUfunction);
    }
    let (_, name, unroll) = &key;
    let cubin = nvrtc::compile(
        &executor::source_for(&[(protocol, executor::kernel_op(op), ty)]),
        arch,
        &unroll.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;
    let mut image = cubin.image;
    image.push(0);
    before_load();
    // SAFETY: `image` is a complete CUBIN from NVRTC for this device's
    // architecture; the driver copies it during the call; the module is
    // never unloaded.
    let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
        .map_err(driver_err("cuModuleLoadData(executor)"))?;
    let cname = CString::new(name.as_str()).expect("kernel names have no NUL");
    // SAFETY: `module` was loaded above; the name is NUL-terminated.
    let f = unsafe { result::module::get_function(module, cname) }
        .map_err(driver_err("cuModuleGetFunction(executor)"))?;
    tracing::info!(
        "CUDA device {ordinal}: executor kernel {name} compiled in {:?}",
        cubin.elapsed
    );
    map.insert(key, f as usize);
    Ok(f)
}

/// What the driver knows of a device address (`pointer_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    /// The device whose memory it is.
    pub ordinal: usize,
    /// The start of the allocation it lies in.
    pub start: u64,
    /// The size of that allocation in bytes.
    pub size: usize,
}

impl PointerInfo {
    /// Whether `bytes` from `ptr` lie inside the allocation.
    pub fn holds(&self, ptr: u64, bytes: usize) -> bool {
        ptr >= self.start
            && (ptr - self.start)
                .checked_add(bytes as u64)
                .is_some_and(|end| end <= self.size as u64)
    }
}

/// The device and allocation of device address `ptr`, from the driver:
/// `NoDevice` without a driver, `InvalidArgument` for an address that is
/// not CUDA device memory (host memory, pinned or not, included).
pub fn pointer_info(ptr: u64) -> Result<PointerInfo> {
    probe::driver()?;
    if ptr == 0 {
        return Err(CudaError::InvalidArgument("a null device pointer".into()));
    }
    use sys::CUpointer_attribute as P;
    fn attr<V: Default>(ptr: u64, a: sys::CUpointer_attribute) -> Option<V> {
        let mut v = V::default();
        // SAFETY: `v` is a writable value of the attribute's type (memory
        // type and ordinal: 32-bit; range start: CUdeviceptr; range size:
        // size_t), which the driver fills; it only inspects `ptr`.
        let rc = unsafe { sys::cuPointerGetAttribute((&mut v as *mut V).cast(), a, ptr) };
        (rc == sys::CUresult::CUDA_SUCCESS).then_some(v)
    }
    let not_device = |what: &str| {
        CudaError::InvalidArgument(format!("{ptr:#x} is not CUDA device memory ({what})"))
    };
    let kind: u32 = attr(ptr, P::CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
        .ok_or_else(|| not_device("the driver does not know the address"))?;
    if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        return Err(not_device("host memory: use the host API"));
    }
    let ordinal: i32 = attr(ptr, P::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
        .ok_or_else(|| not_device("no device ordinal"))?;
    let start: u64 = attr(ptr, P::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
        .ok_or_else(|| not_device("no allocation range"))?;
    let size: usize = attr(ptr, P::CU_POINTER_ATTRIBUTE_RANGE_SIZE)
        .ok_or_else(|| not_device("no allocation size"))?;
    Ok(PointerInfo {
        ordinal: ordinal.max(0) as usize,
        start,
        size,
    })
}

impl CudaEngine {
    /// The engine of device `ordinal`: `NoDevice` without a driver or
    /// device; the kernels compile at the first engine of each device.
    pub fn new(ordinal: usize) -> Result<CudaEngine> {
        let engine = CudaEngine {
            ordinal,
            loaded: loaded(ordinal)?,
            pinned: Mutex::new(HashMap::new()),
            gates: Mutex::new(Gates::default()),
            retired: Mutex::new(Vec::new()),
            kernels: Mutex::new(Vec::new()),
            events: Mutex::new(Vec::with_capacity(EVENT_POOL)),
            streams: Mutex::new(Vec::with_capacity(STREAM_POOL)),
            pool_warned: std::sync::atomic::AtomicBool::new(false),
        };
        // Made now, while no stream of this engine waits at a gate.
        let made = (0..EVENT_POOL)
            .map(|_| engine.create_event())
            .collect::<Result<Vec<_>>>()?;
        *engine.events.lock().unwrap_or_else(|p| p.into_inner()) = made;
        let made = (0..STREAM_POOL)
            .map(|_| engine.create_stream())
            .collect::<Result<Vec<_>>>()?;
        *engine.streams.lock().unwrap_or_else(|p| p.into_inner()) = made;
        Ok(engine)
    }

    /// A handle from `pool`, else one made by `make`: past the pool,
    /// under a gate, it may block behind a thread waiting for the gated
    /// stream (the device rule), which is said once an engine.
    fn take_pooled<H>(
        &self,
        pool: &Mutex<Vec<H>>,
        what: &str,
        made: usize,
        make: impl FnOnce() -> Result<H>,
    ) -> Result<H> {
        if let Some(h) = pool.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(h);
        }
        if self.gates_held() && !self.pool_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "CUDA device {}: more than {made} {what} in use (calls enqueued faster than \
                 they run); making more while a stream waits at a gate (the device rule: it \
                 may block behind a thread waiting for that stream; said once)",
                self.ordinal
            );
        }
        make()
    }

    fn create_stream(&self) -> Result<Stream> {
        self.bind()?;
        let s = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(driver_err("cuStreamCreate"))?;
        Ok(Stream(s as u64))
    }

    fn create_event(&self) -> Result<Event> {
        self.bind()?;
        let e = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(driver_err("cuEventCreate"))?;
        Ok(Event(e as u64))
    }

    /// The engine of device `ordinal` that every caller in the process
    /// shares (made at the first call; `NoDevice` without a driver or
    /// device).
    pub fn shared(ordinal: usize) -> Result<Arc<CudaEngine>> {
        static ENGINES: OnceLock<Mutex<HashMap<usize, Arc<CudaEngine>>>> = OnceLock::new();
        let engines = ENGINES.get_or_init(|| Mutex::new(HashMap::new()));
        let mut engines = engines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = engines.get(&ordinal) {
            return Ok(e.clone());
        }
        let e = Arc::new(CudaEngine::new(ordinal)?);
        engines.insert(ordinal, e.clone());
        Ok(e)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Whether `stream` (a `CUstream`; 0, the legacy default stream,
    /// counts as the current context's) belongs to this engine's context,
    /// the device's primary context, which every device call runs in.
    pub fn owns_stream(&self, stream: u64) -> Result<bool> {
        if stream == 0 {
            return Ok(true);
        }
        self.bind()?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the caller vouches that `stream` is a live stream; the
        // driver writes its context into `ctx`.
        unsafe { sys::cuStreamGetCtx(stream as sys::CUstream, &mut ctx) }
            .result()
            .map_err(driver_err("cuStreamGetCtx"))?;
        Ok(ctx == self.loaded.ctx)
    }

    /// The architecture the kernels were compiled for (`sm_90`).
    pub fn arch(&self) -> &str {
        &self.loaded.arch
    }

    /// The device rule's check on a GPU: `call` waits for every stream
    /// of the device, so made while a stream waits at a gate it may wait
    /// for ever. A debug build stops there; a release build says so at
    /// ERROR (the GPU run's logs are searched for it).
    fn check_quiet(&self, call: &str) {
        let what = if self.gates_held() {
            "a stream waits at a gate: it waits for that stream"
        } else if self.kernels_in_flight() {
            "an executor kernel is in flight: it waits for the kernel, which may wait for a \
             peer's kernel this thread is to launch"
        } else {
            return;
        };
        tracing::error!("{call} while {what} (the device rule)");
        debug_assert!(false, "{call} while {what} (the device rule)");
    }

    /// Whether an executor kernel launched here may not have ended (the
    /// events of those that have are freed).
    fn kernels_in_flight(&self) -> bool {
        let mut kernels = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        kernels.retain(|&e| {
            let ended = self.host_wait(e, Duration::ZERO).is_ok();
            if ended {
                self.free_event(e);
            }
            !ended
        });
        !kernels.is_empty()
    }

    /// Free what was retired if no gate is held and no executor kernel is
    /// in flight (`retired` locked, which launches take too).
    fn free_retired(&self, retired: &mut Vec<Retired>) {
        if retired.is_empty() || self.gates_held() || self.kernels_in_flight() {
            return;
        }
        for what in retired.drain(..) {
            match what {
                Retired::Device(b) => self.free_device(b),
                Retired::Pinned(b) => self.free_pinned(b),
                Retired::Stream(s) => self.free_stream(s),
            }
        }
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the process's life.
        unsafe { result::ctx::set_current(self.loaded.ctx) }.map_err(driver_err("cuCtxSetCurrent"))
    }

    /// The size of pinned buffer `buf` and the event of its last copy.
    fn pinned(&self, buf: PinnedBuf) -> Result<(usize, sys::CUevent)> {
        self.pinned_entry(buf).map(|(len, e, _)| (len, e))
    }

    fn pinned_entry(&self, buf: PinnedBuf) -> Result<(usize, sys::CUevent, Arc<Mutex<()>>)> {
        self.pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&buf.0)
            .map(|p| (p.len, p.last_copy, p.access.clone()))
            .ok_or_else(|| CudaError::InvalidArgument(format!("no pinned buffer {:#x}", buf.0)))
    }

    /// Mark pinned buffer `buf` as used by the work enqueued on `stream`
    /// so far (its event is recorded after it).
    fn used_by(&self, buf: PinnedBuf, stream: Stream) -> Result<()> {
        let (_, last_copy) = self.pinned(buf)?;
        // SAFETY: the buffer's event and a stream of this context (bound by
        // the caller).
        unsafe { result::event::record(last_copy, stream.0 as sys::CUstream) }
            .map_err(driver_err("cuEventRecord"))
    }

    fn pinned_range(&self, buf: PinnedBuf, off: usize, bytes: usize) -> Result<*mut u8> {
        let (len, _) = self.pinned(buf)?;
        if off.checked_add(bytes).is_none_or(|end| end > len) {
            return Err(CudaError::InvalidArgument(format!(
                "{bytes} bytes at {off} overrun pinned buffer of {len} bytes"
            )));
        }
        Ok((buf.0 as usize + off) as *mut u8)
    }

    fn function(&self, name: &str) -> Result<sys::CUfunction> {
        self.loaded
            .functions
            .get(name)
            .copied()
            .ok_or_else(|| CudaError::InvalidArgument(format!("no kernel {name}")))
    }

    /// Grid for `count` elements of `elem` bytes: enough blocks for one
    /// 16-byte vector per thread, at most four per multiprocessor (the
    /// kernels loop over the rest).
    fn grid(&self, count: usize, elem: usize) -> u32 {
        let per_block = BLOCK_THREADS as usize * (16 / elem).max(1);
        let want = count.div_ceil(per_block).max(1);
        want.min(4 * self.loaded.multiprocessors as usize) as u32
    }

    fn launch(
        &self,
        stream: Stream,
        name: &str,
        count: usize,
        elem: usize,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        self.bind()?;
        let f = self.function(name)?;
        let grid = self.grid(count, elem);
        // SAFETY: `f` is a kernel of the loaded module; `params` holds one
        // pointer per kernel parameter, in order, each to a live local of
        // the caller of the right type (the kernel table's signatures);
        // the driver copies the values during the call.
        unsafe {
            result::launch_kernel(
                f,
                (grid, 1, 1),
                (BLOCK_THREADS, 1, 1),
                0,
                stream.0 as sys::CUstream,
                params,
            )
        }
        .map_err(driver_err("cuLaunchKernel"))
    }
}

fn dptr(p: DevicePtr) -> sys::CUdeviceptr {
    p.buf.0 + p.offset as u64
}

impl Engine for CudaEngine {
    fn alloc_device(&self, bytes: usize) -> Result<DeviceBuf> {
        self.check_quiet("cuMemAlloc");
        self.bind()?;
        // SAFETY: a plain allocation in the current (engine's) context.
        let p = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(driver_err("cuMemAlloc"))?;
        Ok(DeviceBuf(p))
    }

    fn alloc_device_async(&self, stream: Stream, bytes: usize) -> Result<DeviceBuf> {
        self.bind()?;
        // SAFETY: a stream of this context (0: the legacy default stream);
        // the memory is usable in its order from here on.
        let p = unsafe { result::malloc_async(stream.0 as sys::CUstream, bytes.max(1)) }
            .map_err(driver_err("cuMemAllocAsync"))?;
        Ok(DeviceBuf(p))
    }

    fn free_device_async(&self, stream: Stream, buf: DeviceBuf) -> Result<()> {
        self.bind()?;
        // SAFETY: `buf` came from `alloc_device_async`; the free runs after
        // the work enqueued on `stream` so far, which is the last to use it
        // (the caller's contract).
        unsafe { result::free_async(buf.0, stream.0 as sys::CUstream) }
            .map_err(driver_err("cuMemFreeAsync"))
    }

    fn retire(&self, what: Retired) {
        let mut retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        retired.push(what);
        self.free_retired(&mut retired);
    }

    fn gates_held(&self) -> bool {
        let gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.waited.iter().any(|(&word, &value)| {
            // SAFETY: a gate word of a page that is never freed, 4-byte
            // aligned, written atomically by host and device.
            let w = unsafe { &*(word as *const AtomicU32) };
            !gate_reached(w.load(Ordering::Acquire), value)
        })
    }

    fn synchronize(&self, call: &'static str) -> Result<()> {
        self.check_quiet(call);
        self.bind()?;
        result::ctx::synchronize().map_err(driver_err("cuCtxSynchronize"))
    }

    fn prepare_executor(
        &self,
        protocol: Protocol,
        op: Option<ReduceOp>,
        ty: DataType,
    ) -> Result<()> {
        self.bind()?;
        executor_function(self.ordinal, &self.loaded.arch, protocol, op, ty, &|| {
            self.check_quiet("cuModuleLoadData (the executor kernel)")
        })
        .map(|_| ())
    }

    fn free_device(&self, buf: DeviceBuf) {
        self.check_quiet("cuMemFree");
        if self.bind().is_ok() {
            // SAFETY: `buf` came from `alloc_device` and the caller has
            // waited for the work that used it.
            let _ = unsafe { result::free_sync(buf.0) };
        }
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuf> {
        self.check_quiet("cuMemHostAlloc");
        self.bind()?;
        // SAFETY: page-locked host memory of the current context; freed by
        // `free_pinned`.
        let p = unsafe { result::malloc_host(bytes.max(1), 0) }
            .map_err(driver_err("cuMemHostAlloc"))?;
        let last_copy = match result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING) {
            Ok(e) => e,
            Err(e) => {
                // SAFETY: `p` was allocated above and nothing uses it.
                let _ = unsafe { result::free_host(p) };
                return Err(driver_err("cuEventCreate")(e));
            }
        };
        let key = p as u64;
        self.pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                key,
                Pinned {
                    len: bytes,
                    last_copy,
                    access: Arc::new(Mutex::new(())),
                },
            );
        Ok(PinnedBuf(key))
    }

    fn free_pinned(&self, buf: PinnedBuf) {
        let gone = self
            .pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&buf.0);
        if let Some(p) = gone {
            self.check_quiet("cuMemFreeHost");
            if self.bind().is_ok() {
                // SAFETY: the buffer's last copy is waited for first, so no
                // enqueued copy uses the memory when it is freed; the event
                // is not used again.
                unsafe {
                    let _ = result::event::synchronize(p.last_copy);
                    let _ = result::event::destroy(p.last_copy);
                    let _ = result::free_host(buf.0 as *mut c_void);
                }
            }
        }
    }

    fn with_pinned(&self, buf: PinnedBuf, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let (len, last_copy, access) = self.pinned_entry(buf)?;
        let _only = access.lock().unwrap_or_else(|p| p.into_inner());
        self.bind()?;
        // SAFETY: the buffer's event, of this context.
        match unsafe { sys::cuEventQuery(last_copy) } {
            sys::CUresult::CUDA_SUCCESS => {}
            sys::CUresult::CUDA_ERROR_NOT_READY => {
                return Err(CudaError::InvalidArgument(format!(
                    "pinned buffer {:#x} touched by the host while a copy still uses it",
                    buf.0
                )))
            }
            other => return other.result().map_err(driver_err("cuEventQuery")),
        }
        // SAFETY: `buf` is a live pinned allocation of `len` bytes, and the
        // event recorded after the last copy that used it has completed,
        // so no device work touches it; `_only` keeps other threads' host
        // access out while the closure holds the slice.
        let bytes = unsafe { std::slice::from_raw_parts_mut(buf.0 as *mut u8, len) };
        f(bytes);
        Ok(())
    }

    /// One of the streams made up front ([`STREAM_POOL`]); a new one
    /// only when all are in use.
    fn stream(&self) -> Result<Stream> {
        self.take_pooled(&self.streams, "streams", STREAM_POOL, || {
            self.create_stream()
        })
    }

    /// Back to the streams in use next (the caller retired it: its work
    /// has ended); never destroyed, as events are not.
    fn free_stream(&self, stream: Stream) {
        if stream.0 == 0 {
            return;
        }
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(stream);
    }

    /// One of the events made up front ([`EVENT_POOL`]); a new one only
    /// when all are in use.
    fn event(&self) -> Result<Event> {
        self.take_pooled(&self.events, "events", EVENT_POOL, || self.create_event())
    }

    /// Back to the events in use next; never destroyed (the lock above).
    fn free_event(&self, event: Event) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    fn d2h(
        &self,
        stream: Stream,
        dst: PinnedBuf,
        dst_off: usize,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let host = self.pinned_range(dst, dst_off, bytes)?;
        self.bind()?;
        // SAFETY: `host..host + bytes` lies in a live pinned allocation
        // (checked above) that stays allocated until the copy's event has
        // completed (staging contract); `src` is device memory of this
        // context with `bytes` readable (the caller's extents).
        let rc = unsafe {
            sys::cuMemcpyDtoHAsync_v2(host.cast(), dptr(src), bytes, stream.0 as sys::CUstream)
        };
        rc.result().map_err(driver_err("cuMemcpyDtoHAsync"))?;
        self.used_by(dst, stream)
    }

    fn h2d(
        &self,
        stream: Stream,
        dst: DevicePtr,
        src: PinnedBuf,
        src_off: usize,
        bytes: usize,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let host = self.pinned_range(src, src_off, bytes)?;
        self.bind()?;
        // SAFETY: as in `d2h`, the other way round.
        let rc = unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dptr(dst),
                host.cast_const().cast(),
                bytes,
                stream.0 as sys::CUstream,
            )
        };
        rc.result().map_err(driver_err("cuMemcpyHtoDAsync"))?;
        self.used_by(src, stream)
    }

    fn d2d(&self, stream: Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges are device memory of this context of at
        // least `bytes` (the caller's extents) and do not overlap.
        unsafe { result::memcpy_dtod_async(dptr(dst), dptr(src), bytes, stream.0 as sys::CUstream) }
            .map_err(driver_err("cuMemcpyDtoDAsync"))
    }

    fn write_scalar(&self, stream: Stream, dst: DevicePtr, value: &[u8]) -> Result<()> {
        let at = dptr(dst);
        let s = stream.0 as sys::CUstream;
        self.bind()?;
        // SAFETY: `dst` is device memory of this context with room for
        // one element of `value.len()` bytes (the caller's temporary);
        // each memset writes inside it, in the stream's order.
        let rc = unsafe {
            match *value {
                [b] => sys::cuMemsetD8Async(at, b, 1, s),
                [a, b] => sys::cuMemsetD16Async(at, u16::from_ne_bytes([a, b]), 1, s),
                [a, b, c, d] => sys::cuMemsetD32Async(at, u32::from_ne_bytes([a, b, c, d]), 1, s),
                [a, b, c, d, e, f, g, h] => {
                    let rc = sys::cuMemsetD32Async(at, u32::from_ne_bytes([a, b, c, d]), 1, s);
                    if rc != sys::CUresult::CUDA_SUCCESS {
                        rc
                    } else {
                        sys::cuMemsetD32Async(at + 4, u32::from_ne_bytes([e, f, g, h]), 1, s)
                    }
                }
                _ => sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            }
        };
        rc.result().map_err(driver_err("cuMemsetD*Async"))
    }

    fn reduce(
        &self,
        stream: Stream,
        op: ReduceOp,
        ty: DataType,
        dst: DevicePtr,
        a: DevicePtr,
        b: DevicePtr,
        count: usize,
    ) -> Result<()> {
        let name = kernels::reduce_name(op, ty);
        let (mut d, mut x, mut y, mut n) = (dptr(dst), dptr(a), dptr(b), count as u64);
        let mut params: [*mut c_void; 4] = [
            (&mut d as *mut u64).cast(),
            (&mut x as *mut u64).cast(),
            (&mut y as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
        ];
        self.launch(stream, &name, count, ty.size(), &mut params)
    }

    fn avg_finish(
        &self,
        stream: Stream,
        ty: DataType,
        buf: DevicePtr,
        count: usize,
        ranks: usize,
    ) -> Result<()> {
        let name = kernels::finish_name(ty);
        let (mut p, mut c, mut r) = (dptr(buf), count as u64, ranks as u64);
        let mut params: [*mut c_void; 3] = [
            (&mut p as *mut u64).cast(),
            (&mut c as *mut u64).cast(),
            (&mut r as *mut u64).cast(),
        ];
        self.launch(stream, &name, count, ty.size(), &mut params)
    }

    fn record(&self, event: Event, stream: Stream) -> Result<()> {
        self.bind()?;
        // SAFETY: an event and a stream of this context.
        unsafe { result::event::record(event.0 as sys::CUevent, stream.0 as sys::CUstream) }
            .map_err(driver_err("cuEventRecord"))
    }

    fn stream_wait(&self, stream: Stream, event: Event) -> Result<()> {
        self.bind()?;
        // SAFETY: an event and a stream of this context.
        unsafe {
            result::stream::wait_event(
                stream.0 as sys::CUstream,
                event.0 as sys::CUevent,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(driver_err("cuStreamWaitEvent"))
    }

    fn host_wait(&self, event: Event, timeout: Duration) -> Result<()> {
        self.bind()?;
        let now = Instant::now();
        // A wait that goes on from this thread's previous one, which
        // ended at its timeout on the same event just now (the watchdog
        // waits in slices of a millisecond), keeps that wait's start: a
        // long call then sleeps between polls instead of yielding the
        // whole time.
        let start = LAST_WAIT.with(|last| match last.get() {
            Some((e, started, ended))
                if e == event.0 && now.duration_since(ended) < HOST_WAIT_SPIN =>
            {
                started
            }
            _ => now,
        });
        let deadline = now + timeout;
        loop {
            // SAFETY: an event of this context.
            let rc = unsafe { sys::cuEventQuery(event.0 as sys::CUevent) };
            match rc {
                sys::CUresult::CUDA_SUCCESS => {
                    LAST_WAIT.with(|last| last.set(None));
                    return Ok(());
                }
                sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    LAST_WAIT.with(|last| last.set(None));
                    return other.result().map_err(driver_err("cuEventQuery"));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                LAST_WAIT.with(|last| last.set(Some((event.0, start, now))));
                return Err(CudaError::Timeout {
                    what: "the device's work (an event)".into(),
                    waited_ms: timeout.as_millis() as u64,
                });
            }
            // A short call ends within microseconds, and a sleep costs
            // far more than asked (a 20 us sleep took 76 us on the H200's
            // host, run 9: the kernel's timer slack), which was most of
            // an 8-byte call's 113 us there. So: spin, then yield the
            // core (which returns at once where no other thread wants
            // it), and sleep only once a call has been long.
            let waited = start.elapsed();
            if waited < HOST_WAIT_SPIN {
                std::hint::spin_loop();
            } else if waited < HOST_WAIT_YIELD {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    fn gate(&self) -> Result<Gate> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        let words = GATE_PAGE / 4;
        if gates.pages.is_empty() || gates.used == words {
            drop(gates);
            self.check_quiet("cuMemHostAlloc (a page of gates)");
            gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        }
        if gates.pages.is_empty() || gates.used == words {
            self.bind()?;
            // SAFETY: page-locked host memory mapped into the device's
            // address space, zeroed below before any gate in it is handed
            // out; never freed (gates live as long as the process).
            let host = unsafe {
                result::malloc_host(
                    GATE_PAGE,
                    sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
                )
            }
            .map_err(driver_err("cuMemHostAlloc(DEVICEMAP)"))?;
            // SAFETY: `host` is the page just allocated, GATE_PAGE bytes.
            unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, GATE_PAGE) };
            let mut device: sys::CUdeviceptr = 0;
            // SAFETY: `host` is mapped memory of this context (above).
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) }
                .result()
                .map_err(driver_err("cuMemHostGetDevicePointer"))?;
            gates.pages.push((host as u64, device));
            gates.used = 0;
        }
        let (host, device) = *gates.pages.last().expect("a page was made above");
        let at = 4 * gates.used as u64;
        gates.used += 1;
        gates.device.insert(host + at, device + at);
        Ok(Gate(host + at))
    }

    fn stream_wait_gate(
        &self,
        stream: Stream,
        gate: Gate,
        value: u32,
        limit: Duration,
    ) -> Result<()> {
        // Under the lock of what is retired: a free that found no gate
        // held ends before a stream parks.
        let _retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        let device = {
            let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
            let device = gates
                .device
                .get(&gate.0)
                .copied()
                .ok_or_else(|| CudaError::InvalidArgument(format!("no gate {:#x}", gate.0)))?;
            gates.waited.insert(gate.0, value);
            device
        };
        self.bind()?;
        // SAFETY: a stream of this context and the device mapping of a
        // gate word, which is never freed.
        let rc = unsafe {
            sys::cuStreamWaitValue32_v2(
                stream.0 as sys::CUstream,
                device,
                value,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        };
        if rc != sys::CUresult::CUDA_ERROR_NOT_SUPPORTED {
            return rc.result().map_err(driver_err("cuStreamWaitValue32"));
        }
        // No stream memory operations on this device: a host function in
        // the stream's order waits instead (bounded by `limit`).
        let wait = Box::into_raw(Box::new(GateWait {
            word: gate.0,
            value,
            deadline: Instant::now() + limit,
        }));
        // SAFETY: `gate_wait` takes back the box exactly once, when the
        // driver runs it; if the launch fails it never runs and the box
        // is taken back here.
        let rc = unsafe {
            sys::cuLaunchHostFunc(stream.0 as sys::CUstream, Some(gate_wait), wait.cast())
        };
        if rc != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the launch failed, so `gate_wait` will not run.
            drop(unsafe { Box::from_raw(wait) });
        }
        rc.result().map_err(driver_err("cuLaunchHostFunc"))
    }

    fn runs_executor(&self) -> bool {
        true
    }

    fn shares_hardware_queues(&self) -> bool {
        true
    }

    fn gate_device_address(&self, gate: Gate) -> Result<u64> {
        self.gates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .device
            .get(&gate.0)
            .copied()
            .ok_or_else(|| CudaError::InvalidArgument(format!("no gate {:#x}", gate.0)))
    }

    /// The kernel is compiled by NVRTC for this device at its first use in
    /// the process (only that kernel: all 80 take a minute) and kept; the
    /// grid is `launch.channels` blocks of [`EXEC_THREADS`] threads.
    fn launch_executor(&self, stream: Stream, launch: &ExecLaunch) -> Result<()> {
        if launch.channels == 0 {
            return Err(CudaError::InvalidArgument(
                "a program has at least one channel".into(),
            ));
        }
        self.bind()?;
        let f = executor_function(
            self.ordinal,
            &self.loaded.arch,
            launch.protocol,
            launch.op,
            launch.ty,
            &|| self.check_quiet("cuModuleLoadData (the executor kernel, at its first launch)"),
        )?;
        let ExecLaunch {
            mut program,
            mut input,
            mut output,
            mut conns,
            mut ctl,
            ..
        } = *launch;
        let mut params: [*mut c_void; 5] = [
            (&mut program as *mut u64).cast(),
            (&mut input as *mut u64).cast(),
            (&mut output as *mut u64).cast(),
            (&mut conns as *mut u64).cast(),
            (&mut ctl as *mut u64).cast(),
        ];
        // Counted in flight until an event after it completes, under the
        // lock of what is retired: a free that found none in flight ends
        // before the kernel starts.
        let _retired = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        let ended = self.event()?;
        // SAFETY: `f` is an executor kernel of a module loaded in this
        // context and never unloaded; its five parameters are pointers
        // (8 bytes each), and `params` holds one pointer to a live u64
        // local per parameter, in order; the driver copies the values
        // during the call.
        let launched = unsafe {
            result::launch_kernel(
                f,
                (launch.channels, 1, 1),
                (EXEC_THREADS, 1, 1),
                0,
                stream.0 as sys::CUstream,
                &mut params,
            )
        }
        .map_err(driver_err("cuLaunchKernel(executor)"))
        .and_then(|()| self.record(ended, stream));
        match launched {
            Ok(()) => self
                .kernels
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(ended),
            Err(_) => self.free_event(ended),
        }
        launched
    }

    fn stream_raise_gate(&self, stream: Stream, gate: Gate, value: u32) -> Result<()> {
        let device = self.gate_device_address(gate)?;
        self.bind()?;
        // SAFETY: a stream of this context and the device mapping of a
        // gate word, which is never freed. A plain write: calls raise
        // their gate in order, so the value only grows.
        let rc =
            unsafe { sys::cuStreamWriteValue32_v2(stream.0 as sys::CUstream, device, value, 0) };
        if rc != sys::CUresult::CUDA_ERROR_NOT_SUPPORTED {
            return rc.result().map_err(driver_err("cuStreamWriteValue32"));
        }
        // No stream memory operations: a host function in the stream's
        // order raises it.
        let raise = Box::into_raw(Box::new((gate.0, value)));
        // SAFETY: `gate_raise` takes back the box exactly once, when the
        // driver runs it; if the launch fails it never runs and the box
        // is taken back here.
        let rc = unsafe {
            sys::cuLaunchHostFunc(stream.0 as sys::CUstream, Some(gate_raise), raise.cast())
        };
        if rc != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the launch failed, so `gate_raise` will not run.
            drop(unsafe { Box::from_raw(raise) });
        }
        rc.result().map_err(driver_err("cuLaunchHostFunc"))
    }

    fn raise_gate(&self, gate: Gate, value: u32) {
        let known = self
            .gates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .device
            .contains_key(&gate.0);
        if !known {
            return;
        }
        // SAFETY: a gate word of a page that is never freed, 4-byte
        // aligned; the device only reads it, the host writes it atomically.
        let word = unsafe { &*(gate.0 as *const AtomicU32) };
        let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            (!gate_reached(w, value)).then_some(value)
        });
        self.free_retired(&mut self.retired.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a device the engine is refused with `NoDevice` and the
    /// reason, never a panic (cudarc panics if called without libcuda).
    #[test]
    fn no_device_is_an_error_not_a_panic() {
        match CudaEngine::new(0) {
            Ok(e) => assert!(e.arch().starts_with("sm_"), "{}", e.arch()),
            Err(CudaError::NoDevice(why)) => assert!(!why.is_empty()),
            Err(other) => {
                // A device exists but the kernels did not load: only
                // acceptable where the GPU run did not ask for a device.
                assert!(
                    std::env::var("FERROCCL_REQUIRE_DEVICE").as_deref() != Ok("1"),
                    "{other}"
                );
            }
        }
    }
}
