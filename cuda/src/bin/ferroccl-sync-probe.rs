//! Which CUDA driver calls wait for a stream parked at a gate, on this GPU
//! and driver: the device rule's facts (docs/staging.md), checked against
//! the hardware in the first step of the GPU run (cuda/gpu/run.sh).
//!
//! For each call: a stream (non-blocking, or the legacy default stream) is
//! parked at a word of mapped pinned memory (`cuStreamWaitValue32`, as a
//! device call's gate), the call is made on another thread, and if it has
//! not returned after a second it "waits for the parked stream"; then the
//! word is raised, and the call must return. One line per call and stream
//! kind: `| call | parked stream | waits? |`. Without a device it says why
//! and exits 0 (1 with FERROCCL_REQUIRE_DEVICE=1).
//!
//! A second table (found on the first GPU run, docs/hardware.md): a call
//! that does not itself wait for a parked stream can still block behind
//! another thread that waits inside the driver for it (a user's pageable
//! copy to the host after the collective; the driver holds a lock while
//! it waits). For each call a progress thread makes, and three ways a
//! user's thread waits, it says whether the call returns.

use cudarc::driver::{result, sys};
use ferroccl_cuda::probe;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// How long a call may take before it counts as waiting.
const PATIENCE: Duration = Duration::from_secs(1);
/// How long a waiting call may take once the stream is let go.
const AFTER: Duration = Duration::from_secs(10);

/// A tiny kernel, for the module load.
const KERNEL: &str = "extern \"C\" __global__ void ferroccl_probe(int *p) { if (p) *p = 1; }";

fn main() {
    let require = std::env::var("FERROCCL_REQUIRE_DEVICE").as_deref() == Ok("1");
    let driver = match probe::driver() {
        Ok(d) => d,
        Err(e) => {
            println!("sync probe: no device: {e}");
            std::process::exit(i32::from(require));
        }
    };
    if let Err(e) = run(driver.version) {
        println!("sync probe: {e}");
        std::process::exit(1);
    }
}

/// Driver handles and addresses as plain bits, so they can cross to the
/// calling thread.
#[derive(Clone, Copy)]
struct Bits(u64, u64);

fn run(version: i32) -> Result<(), String> {
    let e = |what: &'static str| move |err: cudarc::driver::DriverError| format!("{what}: {err:?}");
    let dev = result::device::get(0).map_err(e("cuDeviceGet"))?;
    // SAFETY: the device handle the driver just returned.
    let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(e("cuDevicePrimaryCtxRetain"))?;
    let bind = move || {
        // SAFETY: the primary context retained above, kept for the
        // process's life.
        unsafe { result::ctx::set_current(ctx) }.map_err(e("cuCtxSetCurrent"))
    };
    bind()?;
    // SAFETY: the device handle from above.
    let major = unsafe {
        result::device::get_attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        )
    }
    .map_err(e("cuDeviceGetAttribute"))?;
    // SAFETY: as above.
    let minor = unsafe {
        result::device::get_attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        )
    }
    .map_err(e("cuDeviceGetAttribute"))?;
    let arch = format!("sm_{major}{minor}");
    let cubin = ferroccl_cuda::nvrtc::compile(KERNEL, &arch, &[])
        .map(|c| {
            let mut image = c.image;
            image.push(0);
            image
        })
        .map_err(|err| println!("sync probe: no module load row: {err}"))
        .ok();
    // The gate word: mapped pinned memory, never freed.
    // SAFETY: page-locked host memory of the current context, mapped.
    let host = unsafe { result::malloc_host(4096, sys::CU_MEMHOSTALLOC_DEVICEMAP) }
        .map_err(e("cuMemHostAlloc(DEVICEMAP)"))?;
    // SAFETY: the page just allocated, 4096 bytes, 4-byte aligned.
    let word = unsafe { &*host.cast::<AtomicU32>() };
    word.store(0, Ordering::Release);
    let mut gate: sys::CUdeviceptr = 0;
    // SAFETY: `host` is mapped memory of this context.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut gate, host, 0) }
        .result()
        .map_err(e("cuMemHostGetDevicePointer"))?;
    println!("sync probe: {arch}, driver {version}");
    println!("| call | parked stream | waits for it? |");
    println!("|---|---|---|");
    let mut value = 0u32;
    for legacy in [false, true] {
        let kind = if legacy {
            "legacy default"
        } else {
            "non-blocking"
        };
        for call in CALLS {
            if *call == "cuModuleLoadData" && cubin.is_none() {
                continue;
            }
            // What the call frees or uses, made before the stream parks.
            let made = prepare(call).map_err(|err| format!("{call}: set-up: {err}"))?;
            let parked = if legacy {
                std::ptr::null_mut()
            } else {
                result::stream::create(result::stream::StreamKind::NonBlocking)
                    .map_err(e("cuStreamCreate"))?
            };
            value += 1;
            park(parked, gate, value)?;
            let (done, ended) = mpsc::channel();
            let image = cubin.clone();
            let name = *call;
            let ctx_bits = Bits(ctx as u64, 0);
            std::thread::spawn(move || {
                let ctx = ctx_bits;
                // SAFETY: the primary context retained above, kept for the
                // process's life.
                let r = unsafe { result::ctx::set_current(ctx.0 as sys::CUcontext) }
                    .map_err(|err| format!("cuCtxSetCurrent: {err:?}"))
                    .and_then(|()| make_call(name, made, image.as_deref()));
                let _ = done.send(r);
            });
            let waits = verdict(&ended, word, value, "WAITS");
            println!("| {call} | {kind} | {waits} |");
            if !legacy {
                // SAFETY: the stream made above; its wait has passed.
                let _ = unsafe { result::stream::destroy(parked) };
            }
        }
    }
    behind_waiters(
        Bits(ctx as u64, 0),
        gate,
        word,
        &mut value,
        cubin.as_deref(),
    )
}

/// Park `stream` at the gate word (device address `gate`) until it holds
/// at least `value`, as a device call's gate does.
fn park(stream: sys::CUstream, gate: sys::CUdeviceptr, value: u32) -> Result<(), String> {
    // SAFETY: a stream of the current context and the device mapping of
    // the gate word, which is never freed.
    unsafe {
        sys::cuStreamWaitValue32_v2(
            stream,
            gate,
            value,
            sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
        )
    }
    .result()
    .map_err(|err| format!("cuStreamWaitValue32: {err:?}"))
}

/// How a probed call ended: "no" (returned within [`PATIENCE`]), "error",
/// or `slow` (still in it); then the gate word is raised to `value`, and
/// a slow call must return within [`AFTER`] (said if not).
fn verdict(
    ended: &mpsc::Receiver<Result<(), String>>,
    word: &AtomicU32,
    value: u32,
    slow: &'static str,
) -> String {
    let first = match ended.recv_timeout(PATIENCE) {
        Ok(r) => r.map(|()| "no").unwrap_or("error"),
        Err(_) => slow,
    };
    word.store(value, Ordering::Release);
    let after = if first == slow {
        match ended.recv_timeout(AFTER) {
            Ok(Ok(())) => "",
            Ok(Err(_)) => " (then failed)",
            Err(_) => " (and still waits after the stream was let go)",
        }
    } else {
        ""
    };
    format!("{first}{after}")
}

/// The calls a progress thread makes while a stream is parked, probed
/// behind a thread that waits inside the driver for that stream.
const BEHIND: &[&str] = &[
    "cuEventCreate",
    "cuEventDestroy",
    "cuEventRecord",
    "cuEventRecord (recorded and waited on before)",
    "cuEventQuery",
    "cuStreamWaitEvent",
    "cuLaunchKernel",
    "cuStreamWriteValue32",
    "cuMemcpyHtoDAsync (pinned)",
    "cuMemcpyDtoHAsync (pinned)",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuLaunchHostFunc",
    "cuStreamQuery",
    "cuStreamCreate",
    "cuMemAlloc",
    "cuMemHostAlloc",
];

/// How a thread waits for the parked stream inside the driver.
const WAITERS: &[&str] = &[
    "cuMemcpyDtoHAsync (pageable)",
    // PyTorch's `copy_` to the host after a collective: its current
    // stream (the legacy default stream) made to wait for the collective's
    // stream, then a pageable copy on it (the fourth GPU run's DDP step
    // hung so, its progress thread in cuEventRecord).
    "cuMemcpyDtoHAsync (pageable, legacy stream behind it)",
    "cuStreamSynchronize",
    "cuEventSynchronize",
];

/// What one `BEHIND` call uses, made before the stream parks.
#[derive(Clone, Copy)]
struct Kit {
    stream: u64,
    device: u64,
    pinned: u64,
    event: u64,
    freed: u64,
    function: u64,
}

/// A second table: whether each call a progress thread makes returns
/// while another thread of the process waits inside the driver for a
/// parked stream (a pageable copy to the host, a stream or event
/// synchronize: what a user's thread does after enqueueing a collective).
/// A call that blocks there deadlocks a progress thread whose gate that
/// stream waits for.
fn behind_waiters(
    ctx: Bits,
    gate: sys::CUdeviceptr,
    word: &AtomicU32,
    value: &mut u32,
    cubin: Option<&[u8]>,
) -> Result<(), String> {
    let e = |what: &'static str| move |err: cudarc::driver::DriverError| format!("{what}: {err:?}");
    let function = match cubin {
        // SAFETY: a complete CUBIN for this device; the module is kept.
        Some(image) => unsafe {
            let module =
                result::module::load_data(image.as_ptr().cast()).map_err(e("cuModuleLoadData"))?;
            let name = std::ffi::CString::new("ferroccl_probe").expect("no NUL");
            result::module::get_function(module, name).map_err(e("cuModuleGetFunction"))? as u64
        },
        None => 0,
    };
    println!();
    println!("| call | while another thread waits in | blocks? |");
    println!("|---|---|---|");
    for waiter in WAITERS {
        for call in BEHIND {
            if *call == "cuLaunchKernel" && function == 0 {
                continue;
            }
            let stream = || {
                result::stream::create(result::stream::StreamKind::NonBlocking)
                    .map(|s| s as u64)
                    .map_err(e("cuStreamCreate"))
            };
            // SAFETY: allocations of the current context, used by this
            // row alone and never freed (a probe).
            let kit = unsafe {
                let s = stream()?;
                let freed = if *call == "cuMemFreeAsync" {
                    let b = result::malloc_async(s as sys::CUstream, 1 << 20)
                        .map_err(e("cuMemAllocAsync"))?;
                    result::stream::synchronize(s as sys::CUstream)
                        .map_err(e("cuStreamSynchronize"))?;
                    b
                } else {
                    0
                };
                let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(e("cuEventCreate"))?;
                if call.starts_with("cuEventRecord (") {
                    // An event with a past, as a staging pipeline's are:
                    // recorded, waited on by another stream, completed.
                    let other = stream()?;
                    result::event::record(event, s as sys::CUstream).map_err(e("cuEventRecord"))?;
                    result::stream::wait_event(
                        other as sys::CUstream,
                        event,
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    )
                    .map_err(e("cuStreamWaitEvent"))?;
                    result::stream::synchronize(other as sys::CUstream)
                        .map_err(e("cuStreamSynchronize"))?;
                }
                Kit {
                    stream: s,
                    device: result::malloc_sync(1 << 20).map_err(e("cuMemAlloc"))?,
                    pinned: result::malloc_host(1 << 20, 0).map_err(e("cuMemHostAlloc"))? as u64,
                    event: event as u64,
                    freed,
                    function,
                }
            };
            let parked = result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(e("cuStreamCreate"))?;
            *value += 1;
            park(parked, gate, *value)?;
            // SAFETY: an event of this context recorded on the parked stream.
            let after = unsafe {
                let ev = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(e("cuEventCreate"))?;
                result::event::record(ev, parked).map_err(e("cuEventRecord"))?;
                ev as u64
            };
            let (wdone, wended) = mpsc::channel();
            let (name, parked_bits, device) = (*waiter, parked as u64, kit.device);
            std::thread::spawn(move || {
                // SAFETY: the retained primary context; the parked stream,
                // its event and a 1 MiB device buffer of this row.
                let r = unsafe {
                    result::ctx::set_current(ctx.0 as sys::CUcontext).and_then(|()| match name {
                        "cuStreamSynchronize" => {
                            result::stream::synchronize(parked_bits as sys::CUstream)
                        }
                        "cuEventSynchronize" => result::event::synchronize(after as sys::CUevent),
                        "cuMemcpyDtoHAsync (pageable, legacy stream behind it)" => {
                            let legacy = std::ptr::null_mut();
                            result::stream::wait_event(
                                legacy,
                                after as sys::CUevent,
                                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                            )
                            .and_then(|()| {
                                let mut host = vec![0u8; 1 << 20];
                                result::memcpy_dtoh_async(&mut host[..], device, legacy)
                            })
                        }
                        _ => {
                            let mut host = vec![0u8; 1 << 20];
                            result::memcpy_dtoh_async(
                                &mut host[..],
                                device,
                                parked_bits as sys::CUstream,
                            )
                        }
                    })
                };
                let _ = wdone.send(r.is_ok());
            });
            std::thread::sleep(Duration::from_millis(200));
            let waiting = wended.try_recv().is_err();
            let (done, ended) = mpsc::channel();
            let name = *call;
            std::thread::spawn(move || {
                // SAFETY: the retained primary context, then the call on
                // this row's own resources.
                let r = unsafe { result::ctx::set_current(ctx.0 as sys::CUcontext) }
                    .map_err(|err| format!("{err:?}"))
                    .and_then(|()| behind_call(name, kit));
                let _ = done.send(r);
            });
            let blocks = verdict(&ended, word, *value, "BLOCKS");
            let _ = wended.recv_timeout(AFTER);
            let note = if waiting {
                ""
            } else {
                " (the waiter did not wait)"
            };
            println!("| {call} | {waiter} | {blocks}{note} |");
        }
    }
    Ok(())
}

/// Make `call` of `BEHIND` on `kit`'s resources (its context current).
fn behind_call(call: &str, kit: Kit) -> Result<(), String> {
    let e = |err: cudarc::driver::DriverError| format!("{err:?}");
    let s = kit.stream as sys::CUstream;
    // SAFETY (each arm): the call's documented arguments on resources
    // `behind_waiters` made for this row alone, sizes within them.
    unsafe {
        match call {
            "cuEventCreate" => result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map(|_| ())
                .map_err(e),
            "cuEventDestroy" => result::event::destroy(kit.event as sys::CUevent).map_err(e),
            "cuEventRecord" | "cuEventRecord (recorded and waited on before)" => {
                result::event::record(kit.event as sys::CUevent, s).map_err(e)
            }
            "cuEventQuery" => match sys::cuEventQuery(kit.event as sys::CUevent) {
                sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_NOT_READY => Ok(()),
                other => Err(format!("{other:?}")),
            },
            "cuStreamWaitEvent" => result::stream::wait_event(
                s,
                kit.event as sys::CUevent,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
            .map_err(e),
            "cuLaunchKernel" => {
                let mut p: u64 = 0;
                let mut params: [*mut std::ffi::c_void; 1] = [(&mut p as *mut u64).cast()];
                result::launch_kernel(
                    kit.function as sys::CUfunction,
                    (1, 1, 1),
                    (32, 1, 1),
                    0,
                    s,
                    &mut params,
                )
                .map_err(e)
            }
            "cuStreamWriteValue32" => sys::cuStreamWriteValue32_v2(s, kit.device, 1, 0)
                .result()
                .map_err(e),
            "cuMemcpyHtoDAsync (pinned)" => sys::cuMemcpyHtoDAsync_v2(
                kit.device,
                kit.pinned as *const std::ffi::c_void,
                4096,
                s,
            )
            .result()
            .map_err(e),
            "cuMemcpyDtoHAsync (pinned)" => {
                sys::cuMemcpyDtoHAsync_v2(kit.pinned as *mut std::ffi::c_void, kit.device, 4096, s)
                    .result()
                    .map_err(e)
            }
            "cuMemAllocAsync" => result::malloc_async(s, 1 << 20).map(|_| ()).map_err(e),
            "cuMemFreeAsync" => result::free_async(kit.freed, s).map_err(e),
            "cuLaunchHostFunc" => sys::cuLaunchHostFunc(s, Some(nothing), std::ptr::null_mut())
                .result()
                .map_err(e),
            "cuStreamQuery" => match sys::cuStreamQuery(s) {
                sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_NOT_READY => Ok(()),
                other => Err(format!("{other:?}")),
            },
            "cuStreamCreate" => result::stream::create(result::stream::StreamKind::NonBlocking)
                .map(|_| ())
                .map_err(e),
            "cuMemAlloc" => result::malloc_sync(1 << 20).map(|_| ()).map_err(e),
            "cuMemHostAlloc" => result::malloc_host(1 << 20, 0).map(|_| ()).map_err(e),
            other => Err(format!("no call {other}")),
        }
    }
}

/// A host function that does nothing (`cuLaunchHostFunc`).
extern "C" fn nothing(_: *mut std::ffi::c_void) {}

/// The calls probed: those the device rule names, and the stream-ordered
/// ones it uses instead.
const CALLS: &[&str] = &[
    "cuMemAlloc",
    "cuMemFree",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemsetD8",
    "cuMemcpyHtoD",
    "cuStreamCreate",
    "cuStreamDestroy",
    "cuEventCreate",
    "cuModuleLoadData",
    "cuCtxSynchronize",
];

/// What `call` needs made first (a device buffer, pinned memory, a
/// stream), made while no stream is parked: (buffer, stream) bits.
fn prepare(call: &str) -> Result<Bits, String> {
    let e = |err: cudarc::driver::DriverError| format!("{err:?}");
    let stream = || result::stream::create(result::stream::StreamKind::NonBlocking).map_err(e);
    Ok(match call {
        // SAFETY: a plain allocation in the current context, used by this
        // probe call alone.
        "cuMemFree" | "cuMemsetD8" | "cuMemcpyHtoD" => {
            Bits(unsafe { result::malloc_sync(1 << 20) }.map_err(e)?, 0)
        }
        // SAFETY: as above, pinned.
        "cuMemFreeHost" => Bits(
            unsafe { result::malloc_host(1 << 20, 0) }.map_err(e)? as u64,
            0,
        ),
        "cuStreamDestroy" | "cuMemAllocAsync" => Bits(0, stream()? as u64),
        "cuMemFreeAsync" => {
            let s = stream()?;
            // SAFETY: `s` is the stream just made; the allocation is its.
            let b = unsafe { result::malloc_async(s, 1 << 20) }.map_err(e)?;
            // SAFETY: as above; waits for the allocation alone.
            unsafe { result::stream::synchronize(s) }.map_err(e)?;
            Bits(b, s as u64)
        }
        _ => Bits(0, 0),
    })
}

/// Make `call` (on the calling thread, its context current).
fn make_call(call: &str, made: Bits, image: Option<&[u8]>) -> Result<(), String> {
    let e = |err: cudarc::driver::DriverError| format!("{err:?}");
    // SAFETY (each arm): the call's documented arguments: buffers and
    // streams made by `prepare` for this call alone, sizes within them.
    unsafe {
        match call {
            "cuMemAlloc" => result::malloc_sync(1 << 20).map(|_| ()).map_err(e),
            "cuMemFree" => result::free_sync(made.0).map_err(e),
            "cuMemHostAlloc" => result::malloc_host(1 << 20, 0).map(|_| ()).map_err(e),
            "cuMemFreeHost" => result::free_host(made.0 as *mut std::ffi::c_void).map_err(e),
            "cuMemAllocAsync" => result::malloc_async(made.1 as sys::CUstream, 1 << 20)
                .map(|_| ())
                .map_err(e),
            "cuMemFreeAsync" => result::free_async(made.0, made.1 as sys::CUstream).map_err(e),
            "cuMemsetD8" => result::memset_d8_sync(made.0, 0, 1 << 20).map_err(e),
            "cuMemcpyHtoD" => result::memcpy_htod_sync(made.0, &[0u8; 4096][..]).map_err(e),
            "cuStreamCreate" => result::stream::create(result::stream::StreamKind::NonBlocking)
                .map(|_| ())
                .map_err(e),
            "cuStreamDestroy" => result::stream::destroy(made.1 as sys::CUstream).map_err(e),
            "cuEventCreate" => result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map(|_| ())
                .map_err(e),
            "cuModuleLoadData" => match image {
                Some(image) => result::module::load_data(image.as_ptr().cast())
                    .map(|_| ())
                    .map_err(e),
                None => Ok(()),
            },
            "cuCtxSynchronize" => result::ctx::synchronize().map_err(e),
            other => Err(format!("no call {other}")),
        }
    }
}
