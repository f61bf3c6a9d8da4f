//! The device executor's kernels behind the host stand-in engine: the
//! kernel source (`cuda/kernels/executor.cu`) built by the host's C++
//! compiler under `host_emulation.h` into a shared library
//! (`launch.cpp`), loaded once per test process, and run by an
//! [`ExecutorHook`] that a [`HostEngine`] calls in stream order for each
//! `launch_executor`, every thread of every block a host thread. With it
//! the stand-in runs device calls through the executor as a GPU does:
//! what a launcher puts in device memory (program, buffers, `Conn`
//! tables, `Control`, FIFOs) is what the kernel reads, at the stand-in's
//! addresses, and the launcher is tested end to end without a GPU.
//!
//! Skipped, saying so, where there is no C++20 compiler (`c++`, or
//! `$CXX`), unless `FERROCCL_REQUIRE_CXX=1`.
//!
//! `FERROCCL_HOST_LAUNCH_LIB`, test-only (not a user setting): where it
//! names an existing file, the process loads that library instead of
//! building one, so that a test's child processes (the test binary run
//! again) reuse their parent's build ([`library_path`]) rather than spend
//! some 20 s compiling it again. A library it names that does not load is
//! a failure.

use super::kernel_gpu::gpu_sweep;
use super::kernel_host::{built_here, compile, host_source};
use super::tests::{check, grid};
use crate::algo::Algorithm;
use crate::coll::CollKind;
use crate::element::{DataType, ReduceOp};
use ferroccl_cuda::device::Engine;
use ferroccl_cuda::executor::{self, ExecLaunch, Protocol};
use ferroccl_cuda::host_engine::{ExecutorHook, HostEngine};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const LAUNCH_CPP: &str = include_str!("launch.cpp");

/// The types whose kernels the library holds (both protocols, every
/// kernel op): a launch of another type fails, naming its kernel.
const TYPES: [DataType; 5] = [
    DataType::F32,
    DataType::Bf16,
    DataType::I32,
    DataType::F64,
    DataType::I64,
];

/// Host threads a block: few (the test machines have two cores), but
/// more than one, so that lanes and lines split among threads.
const THREADS: u32 = 4;

/// `ferroccl_host_launch` of `launch.cpp`.
type LaunchFn = unsafe extern "C" fn(
    name: *const c_char,
    channels: c_uint,
    threads: c_uint,
    program: *const u8,
    input: *mut c_void,
    output: *mut c_void,
    conns: *mut c_void,
    ctl: *mut c_void,
) -> c_int;

/// The environment variable that hands a process an already built
/// library (module doc).
const LIB_VAR: &str = "FERROCCL_HOST_LAUNCH_LIB";

/// The library's entry point and path, loaded once per test process from
/// `$FERROCCL_HOST_LAUNCH_LIB` where that names a file, else built: `Err`
/// says why not (no compiler; a compile error says "failed on the kernel
/// source").
fn library() -> &'static Result<(LaunchFn, PathBuf), String> {
    static LIB: OnceLock<Result<(LaunchFn, PathBuf), String>> = OnceLock::new();
    LIB.get_or_init(|| {
        if let Some(lib) = std::env::var_os(LIB_VAR)
            .map(PathBuf::from)
            .filter(|p| p.is_file())
        {
            let launch =
                load(&lib).unwrap_or_else(|e| panic!("{} (from {LIB_VAR}): {e}", lib.display()));
            eprintln!(
                "host executor library loaded from {} ({LIB_VAR})",
                lib.display()
            );
            return Ok((launch, lib));
        }
        let dir = std::env::temp_dir().join(format!("ferroccl-exec-launch-{}", std::process::id()));
        let (text, kernels) = host_source(&dir, &TYPES, LAUNCH_CPP)?;
        let src = dir.join("launch.cpp");
        let lib = dir.join("libferroccl_host_launch.so");
        let took = compile(&src, &text, &lib, &["-shared", "-fPIC"])?;
        eprintln!("host executor library ({kernels} kernels) built in {took:.1?}");
        // Built but not loadable is a failure, never a skip.
        let launch = load(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
        Ok((launch, lib))
    })
}

/// The path of the library this process loaded, built first if need be:
/// what a test hands the processes it starts in `FERROCCL_HOST_LAUNCH_LIB`.
/// `None` where it could not be built (no compiler, or a compile error).
pub(crate) fn library_path() -> Option<PathBuf> {
    library().as_ref().ok().map(|(_, p)| p.clone())
}

/// Loads the library for good and finds its entry point.
fn load(lib: &Path) -> Result<LaunchFn, String> {
    let path = CString::new(lib.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated path to the library built above from our
    // own source, whose initialisers only set up its tables. It is never
    // closed: hooks may call into it until the process ends.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("dlopen: {}", dl_error()));
    }
    // SAFETY: a handle dlopen gave, and a NUL-terminated name.
    let sym = unsafe { libc::dlsym(handle, c"ferroccl_host_launch".as_ptr()) };
    if sym.is_null() {
        return Err(format!("dlsym(ferroccl_host_launch): {}", dl_error()));
    }
    // SAFETY: the symbol is launch.cpp's `extern "C" int
    // ferroccl_host_launch(const char*, unsigned, unsigned, const unsigned
    // char*, void*, void*, void*, void*)`, which `LaunchFn` spells; the
    // library stays loaded, so the pointer stays valid.
    Ok(unsafe { std::mem::transmute::<*mut c_void, LaunchFn>(sym) })
}

/// The dynamic loader's last error on this thread.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message that stays
    // valid until this thread's next dl call; it is copied at once.
    unsafe {
        let msg = libc::dlerror();
        if msg.is_null() {
            "no reason given".into()
        } else {
            CStr::from_ptr(msg).to_string_lossy().into_owned()
        }
    }
}

/// A hook that runs the executor's kernels on the host, for
/// [`HostEngine::with_executor`]; `None` (skip, saying so) where there is
/// no C++20 compiler, which `FERROCCL_REQUIRE_CXX=1` makes a failure. A
/// compile error of the kernel source always fails.
pub(crate) fn host_executor() -> Option<ExecutorHook> {
    let launch = built_here(library(), "host executor")?.0;
    Some(Arc::new(move |l: &ExecLaunch| run(launch, l)))
}

/// One launch: returns when every thread of the grid has ended.
fn run(launch: LaunchFn, l: &ExecLaunch) -> Result<(), String> {
    let name = executor::kernel_name(l.protocol, l.op, l.ty);
    let c_name = CString::new(name.as_str()).map_err(|e| e.to_string())?;
    let at = |a: u64| std::ptr::with_exposed_provenance_mut::<c_void>(a as usize);
    // SAFETY: `launch` is the library's entry point (`load`). The
    // addresses are the stand-in's device memory (the engine contract:
    // the caller keeps each allocation alive, the program and Conn table
    // as the kernel reads them, until the stream's work has ended) and a
    // gate word, which lives as long as its engine. The call returns only
    // after joining every thread it started, so nothing outlives it.
    let rc = unsafe {
        launch(
            c_name.as_ptr(),
            l.channels,
            THREADS,
            at(l.program).cast::<u8>().cast_const(),
            at(l.input),
            at(l.output),
            at(l.conns),
            at(l.ctl),
        )
    };
    match rc {
        0 => Ok(()),
        1 => Err(format!(
            "no host build of the kernel {name} (the host library holds {})",
            TYPES.map(|t| t.short_name()).join(", ")
        )),
        2 => Err(format!("{name}: a launch of no blocks or threads")),
        _ => Err(format!(
            "{name}: the launch's host threads could not be made"
        )),
    }
}

/// Ring allreduce, allgather and reduce-scatter, on 2 and 3 ranks, both
/// protocols, f32 and i32 with Sum and Avg: every rank's kernel launched
/// through one stand-in engine on a stream of its own, over FIFOs in the
/// stand-in's device memory, equal to the host executor bit for bit.
#[test]
fn the_kernels_match_the_executor_through_the_stand_in() {
    use CollKind::*;
    let Some(hook) = host_executor() else {
        return;
    };
    let e = HostEngine::new().with_executor(hook);
    let t = Instant::now();
    let mut failures = Vec::new();
    for p in Protocol::ALL {
        for n in [2, 3] {
            let tn = Instant::now();
            let cases: Vec<_> = grid(n, &[AllReduce, AllGather, ReduceScatter])
                .into_iter()
                .filter(|c| matches!(c.dtype, DataType::F32 | DataType::I32))
                .filter(|c| matches!(c.op, ReduceOp::Sum | ReduceOp::Avg))
                .collect();
            failures.extend(gpu_sweep(&e, n, Algorithm::Ring, &cases, p));
            eprintln!(
                "stand-in {} kernel, {n} ranks, {} cases: {:.1?}",
                p.name(),
                cases.len(),
                tn.elapsed()
            );
        }
    }
    check(failures, t, "stand-in executor kernels");
}

/// A launch of a kernel the library lacks is the engine's fault, which
/// names the kernel.
#[test]
fn a_kernel_not_built_is_named() {
    let Some(hook) = host_executor() else {
        return;
    };
    let e = HostEngine::new().with_executor(hook);
    assert!(e.runs_executor());
    let s = e.stream().unwrap();
    let launch = ExecLaunch {
        protocol: Protocol::LowLatency,
        op: None,
        ty: DataType::U8,
        channels: 1,
        program: 0,
        input: 0,
        output: 0,
        conns: 0,
        ctl: 0,
    };
    e.launch_executor(s, &launch).unwrap();
    let done = e.event().unwrap();
    e.record(done, s).unwrap();
    let err = e.host_wait(done, Duration::from_secs(10)).unwrap_err();
    assert!(err.to_string().contains("ferroccl_exec_ll_sum_u8"), "{err}");
    e.free_event(done);
    e.free_stream(s);
}

/// A process started with `FERROCCL_HOST_LAUNCH_LIB` naming this
/// process's library loads it instead of building one, and runs kernels
/// through it.
#[test]
fn a_child_process_loads_the_parents_library() {
    if host_executor().is_none() {
        return;
    }
    let lib = library_path().expect("the library this process loaded");
    let test = concat!(module_path!(), "::a_kernel_not_built_is_named");
    let test = test.split_once("::").map_or(test, |(_, t)| t);
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(LIB_VAR, &lib)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said = format!("{stdout}\n{stderr}");
    assert!(out.status.success(), "{said}");
    assert!(stdout.contains("1 passed"), "{said}");
    assert!(
        stderr.contains(&format!("loaded from {}", lib.display())),
        "{said}"
    );
    assert!(!stderr.contains("built in"), "{said}");
}
