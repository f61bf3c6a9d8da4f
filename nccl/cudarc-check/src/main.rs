//! `cudarc-nccl-check`: a program on `cudarc::nccl`, run against ferroccl's
//! libnccl (docs/nccl.md, "cudarc").
//!
//! ```text
//! cudarc-nccl-check host N   N processes, cudarc's result-level calls on
//!                            host memory (no GPU needed: CI)
//! cudarc-nccl-check gpu N    N processes on the machine's GPU(s) in
//!                            Candle's pattern (Id, Comm::from_rank,
//!                            all_reduce of CudaSlices)
//! ```
//!
//! Each rank is a process started by the first (the launcher), as Candle's
//! multi-process example starts one per GPU. Rank 0 makes the unique id and
//! shares it through a file. Every rank first checks which `libnccl` cudarc's
//! loader mapped (with `FERROCCL_CHECK_EXPECT_LIB=<file>`, it must be that
//! file) and that the NCCL functions cudarc declares resolve in it, then
//! runs its collectives and checks each result against a reference computed
//! in f64 from the inputs' formula. The launcher exits 0 only when every
//! rank did. `CUDARC_CHECK_TIMEOUT` (seconds, default 120) bounds the run.

use cudarc::nccl::result::{self, NcclError, NcclStatus};
use cudarc::nccl::sys;
use std::ffi::{c_void, CStr};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

/// Every NCCL function cudarc 0.19.10's bindings declare with its `nccl`
/// feature (NCCL 2.30), read off its `nccl::sys` module, except the
/// parameter API below. (`ncclResetDebugInit`, which it declares for NCCL
/// 2.24 to 2.29 only, is not among them.)
const DECLARED: &[&str] = &[
    "ncclAllGather",
    "ncclAllReduce",
    "ncclAlltoAll",
    "ncclBcast",
    "ncclBroadcast",
    "ncclCommAbort",
    "ncclCommCount",
    "ncclCommCuDevice",
    "ncclCommDeregister",
    "ncclCommDestroy",
    "ncclCommFinalize",
    "ncclCommGetAsyncError",
    "ncclCommGetUniqueId",
    "ncclCommGrow",
    "ncclCommInitAll",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommInitRankScalable",
    "ncclCommMemStats",
    "ncclCommRegister",
    "ncclCommResume",
    "ncclCommRevoke",
    "ncclCommShrink",
    "ncclCommSplit",
    "ncclCommSuspend",
    "ncclCommUserRank",
    "ncclCommWindowDeregister",
    "ncclCommWindowRegister",
    "ncclGather",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclGetUniqueId",
    "ncclGetVersion",
    "ncclGroupEnd",
    "ncclGroupSimulateEnd",
    "ncclGroupStart",
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclPutSignal",
    "ncclRecv",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclReduce",
    "ncclReduceScatter",
    "ncclScatter",
    "ncclSend",
    "ncclSignal",
    "ncclWaitSignal",
    "ncclWinGetUserPtr",
];

/// NCCL 2.30's parameter API, which cudarc also declares: not in the 2.28
/// ABI that ferroccl exports. Reported, not required (calling one through
/// cudarc would panic with "Missing symbol").
const DECLARED_2_30_ONLY: &[&str] = &[
    "ncclParamBind",
    "ncclParamDumpAll",
    "ncclParamGet",
    "ncclParamGetAllParameterKeys",
    "ncclParamGetI16",
    "ncclParamGetI32",
    "ncclParamGetI64",
    "ncclParamGetI8",
    "ncclParamGetParameter",
    "ncclParamGetStr",
    "ncclParamGetU16",
    "ncclParamGetU32",
    "ncclParamGetU64",
    "ncclParamGetU8",
];

/// The functions this program reaches, directly (`result`, `sys`) or
/// through cudarc's `safe` layer (`Id::new`, `Comm::from_rank`, its
/// collectives, and `Drop`, which aborts).
const USED: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommCount",
    "ncclCommUserRank",
    "ncclCommCuDevice",
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclReduce",
    "ncclReduceScatter",
    "ncclAllGather",
    "ncclGroupStart",
    "ncclSend",
    "ncclRecv",
    "ncclGroupEnd",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclCommDestroy",
    "ncclCommAbort",
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let outcome = match args.as_slice() {
        [_, mode @ ("host" | "gpu"), world] => parse_world(world).and_then(|w| launch(mode, w)),
        [_, "rank", mode @ ("host" | "gpu"), rank, world, dir] => {
            parse_rank(rank, world).and_then(|(r, w)| run_rank(mode, r, w, Path::new(dir)))
        }
        _ => Err(
            "usage: cudarc-nccl-check host|gpu WORLD   (ranks as processes; see the source's docs)"
                .into(),
        ),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cudarc-nccl-check: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_world(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(w) if (1..=64).contains(&w) => Ok(w),
        _ => Err(format!(
            "WORLD must be a number of ranks from 1 to 64, not {s:?}"
        )),
    }
}

fn parse_rank(rank: &str, world: &str) -> Result<(usize, usize), String> {
    let world = parse_world(world)?;
    match rank.parse::<usize>() {
        Ok(r) if r < world => Ok((r, world)),
        _ => Err(format!("RANK must be below WORLD ({world}), not {rank:?}")),
    }
}

fn timeout() -> Duration {
    let secs = std::env::var("CUDARC_CHECK_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(120);
    Duration::from_secs(secs)
}

// ---------------------------------------------------------------- launcher

/// Start `world` ranks of `mode` as processes of this program, wait for
/// them (killing them past the timeout), print their output.
fn launch(mode: &str, world: usize) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir =
        std::env::temp_dir().join(format!("cudarc-nccl-check-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut children: Vec<(Child, PathBuf)> = Vec::new();
    for rank in 0..world {
        let log = dir.join(format!("rank{rank}.log"));
        let out = File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let child = Command::new(&exe)
            .args(["rank", mode, &rank.to_string(), &world.to_string()])
            .arg(&dir)
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting rank {rank}: {e}"))?;
        children.push((child, log));
    }
    let deadline = Instant::now() + timeout();
    let mut failed = Vec::new();
    for (rank, (child, log)) in children.iter_mut().enumerate() {
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("waiting for rank {rank}: {e}")),
            }
        };
        let text = std::fs::read_to_string(&*log).unwrap_or_default();
        println!("--- rank {rank} ({mode}):");
        print!("{text}");
        match status {
            Some(s) if s.success() => {}
            Some(s) => failed.push(format!("rank {rank} exited with {s}")),
            None => failed.push(format!("rank {rank} killed after {:?}", timeout())),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if failed.is_empty() {
        println!("cudarc-nccl-check {mode} {world}: every rank OK");
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

// ------------------------------------------------------------ every rank

fn run_rank(mode: &str, rank: usize, world: usize, dir: &Path) -> Result<(), String> {
    // cudarc's loader panics where it finds no libnccl under its candidate
    // names (libnccl.so first; not libnccl.so.2): say so instead.
    // SAFETY: tries to open libnccl under cudarc's candidate names.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "cudarc finds no libnccl: put the directory holding ferroccl's \
             libnccl.so on LD_LIBRARY_PATH"
                .into(),
        );
    }
    // The library loads at the first call through cudarc.
    let version = result::get_nccl_version().map_err(|e| nccl_err("ncclGetVersion", e))?;
    println!("rank {rank}: ncclGetVersion {version}");
    check_loaded_library(rank)?;
    check_symbols(rank)?;
    match mode {
        "host" => host::run(rank, world, dir),
        _ => gpu::run(rank, world, dir),
    }?;
    println!("rank {rank}: OK");
    Ok(())
}

/// The shared libraries mapped in this process whose names say NCCL: the
/// one cudarc's loader opened (the kernel names the file, after symbolic
/// links).
fn nccl_mappings() -> Result<Vec<PathBuf>, String> {
    let maps = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("reading /proc/self/maps: {e}"))?;
    let mut files: Vec<PathBuf> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(PathBuf::from)
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("lib") && n.contains("nccl"))
        })
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

fn check_loaded_library(rank: usize) -> Result<(), String> {
    let loaded = nccl_mappings()?;
    println!("rank {rank}: cudarc loaded {loaded:?}");
    if let Some(expect) = std::env::var_os("FERROCCL_CHECK_EXPECT_LIB") {
        let expect = std::fs::canonicalize(&expect)
            .map_err(|e| format!("FERROCCL_CHECK_EXPECT_LIB {expect:?}: {e}"))?;
        if loaded != [expect.clone()] {
            return Err(format!(
                "cudarc loaded {loaded:?}, not (only) {}",
                expect.display()
            ));
        }
    }
    Ok(())
}

/// Look every declared function up in the library cudarc loaded, as its
/// bindings do on their first call.
fn check_symbols(rank: usize) -> Result<(), String> {
    let missing = |names: &[&str]| -> Vec<String> {
        names
            .iter()
            .filter(|name| {
                // SAFETY: looking a name up in the library cudarc has
                // loaded (a valid `Library` for the process's lifetime);
                // the address is not used, so its type does not matter.
                let found = unsafe {
                    sys::culib()
                        .get::<unsafe extern "C" fn()>(name.as_bytes())
                        .is_ok()
                };
                !found
            })
            .map(|n| n.to_string())
            .collect()
    };
    let used = missing(USED);
    let declared = missing(DECLARED);
    let later = missing(DECLARED_2_30_ONLY);
    println!(
        "rank {rank}: {} of {} used and {} of {} declared NCCL functions resolve; NCCL 2.30's parameter API: {} of {} missing",
        USED.len() - used.len(),
        USED.len(),
        DECLARED.len() - declared.len(),
        DECLARED.len(),
        later.len(),
        DECLARED_2_30_ONLY.len()
    );
    if !used.is_empty() || !declared.is_empty() {
        return Err(format!("unresolved: used {used:?}, declared {declared:?}"));
    }
    Ok(())
}

fn nccl_err(call: &str, e: NcclError) -> String {
    // SAFETY: NULL asks for the process's last error message; the result
    // is NULL or a NUL-terminated string owned by the library.
    let last = unsafe { sys::ncclGetLastError(std::ptr::null_mut()) };
    let last = if last.is_null() {
        String::new()
    } else {
        // SAFETY: non-NULL, NUL-terminated, valid until the next call.
        unsafe { CStr::from_ptr(last) }
            .to_string_lossy()
            .into_owned()
    };
    format!("{call}: {:?} ({last})", e.0)
}

fn ok(call: &str, r: Result<NcclStatus, NcclError>) -> Result<(), String> {
    match r {
        Ok(NcclStatus::Success) => Ok(()),
        Ok(NcclStatus::InProgress) => Err(format!("{call}: ncclInProgress from a blocking call")),
        Ok(NcclStatus::NumResults) => Err(format!("{call}: ncclNumResults")),
        Err(e) => Err(nccl_err(call, e)),
    }
}

/// Rank 0 makes the id (`Id::new`, as Candle does) and writes it to
/// `dir/id-<tag>` (through a rename, so no rank reads half a file); the
/// others wait for it and rebuild it with `Id::uninit`.
fn exchange_id(rank: usize, dir: &Path, tag: &str) -> Result<cudarc::nccl::Id, String> {
    use cudarc::nccl::Id;
    let path = dir.join(format!("id-{tag}"));
    if rank == 0 {
        let id = Id::new().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
        let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
        let tmp = dir.join(format!("id-{tag}.tmp"));
        std::fs::write(&tmp, &bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        return Ok(id);
    }
    let deadline = Instant::now() + timeout();
    loop {
        if let Ok(bytes) = std::fs::read(&path) {
            let internal: [u8; 128] = bytes
                .try_into()
                .map_err(|b: Vec<u8>| format!("{}: {} bytes, not 128", path.display(), b.len()))?;
            return Ok(Id::uninit(internal.map(|b| b as std::ffi::c_char)));
        }
        if Instant::now() > deadline {
            return Err(format!("rank 0 wrote no id to {} in time", path.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Inputs of rank `r`: small multiples of 1/2, so that every partial sum
/// of up to 64 ranks is exact in f32 and any summation order gives the f64
/// reference exactly.
fn input(r: usize, i: usize) -> f64 {
    ((r + 1) * (1 + i % 13)) as f64 * 0.5
}

/// Compare `got` with the f64 reference `want(i)`; the first mismatch.
fn compare<T: Copy + Into<f64>>(
    what: &str,
    got: &[T],
    want: impl Fn(usize) -> f64,
) -> Result<(), String> {
    for (i, &g) in got.iter().enumerate() {
        let (g, w) = (g.into(), want(i));
        // Exact: the inputs make every result exact (see `input`); a NaN
        // (the receive buffers' fill) never equals a reference.
        if g != w {
            return Err(format!("{what}: element {i} is {g}, expected {w}"));
        }
    }
    Ok(())
}

// ----------------------------------------------- host memory, result level

mod host {
    use super::*;

    /// NCCL's stream argument: ferroccl's host path ignores it, so none.
    fn no_stream() -> sys::cudaStream_t {
        std::ptr::null_mut()
    }

    fn cp<T>(v: &[T]) -> *const c_void {
        v.as_ptr().cast()
    }

    fn mp<T>(v: &mut [T]) -> *mut c_void {
        v.as_mut_ptr().cast()
    }

    pub fn run(rank: usize, world: usize, dir: &Path) -> Result<(), String> {
        let id = exchange_id(rank, dir, "a")?;
        let id = sys::ncclUniqueId {
            internal: *id.internal(),
        };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid place for the handle.
        ok("ncclCommInitRank", unsafe {
            result::comm_init_rank(&mut comm, world as i32, id, rank as i32)
        })?;
        // SAFETY: `comm` is the live handle just made.
        let (count, me, device) = unsafe {
            (
                result::comm_count(comm).map_err(|e| nccl_err("ncclCommCount", e))?,
                result::comm_user_rank(comm).map_err(|e| nccl_err("ncclCommUserRank", e))?,
                result::comm_cu_device(comm).map_err(|e| nccl_err("ncclCommCuDevice", e))?,
            )
        };
        if (count, me) != (world as i32, rank as i32) {
            return Err(format!(
                "ncclCommCount/UserRank say {count}/{me}, not {world}/{rank}"
            ));
        }
        println!("rank {rank}: communicator of {count}, user rank {me}, CUDA device {device}");

        collectives(rank, world, comm)?;
        point_to_point(rank, world, comm)?;
        refusal(rank, world, comm)?;

        // SAFETY: the live handle, not used again.
        ok("ncclCommDestroy", unsafe { result::comm_destroy(comm) })?;
        println!("rank {rank}: ncclCommDestroy OK");

        // A second communicator, ended by ncclCommAbort (what cudarc's
        // `Comm` does when dropped) right after a collective.
        let id = exchange_id(rank, dir, "b")?;
        let id = sys::ncclUniqueId {
            internal: *id.internal(),
        };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: as above.
        ok("ncclCommInitRank (second)", unsafe {
            result::comm_init_rank(&mut comm, world as i32, id, rank as i32)
        })?;
        let mut v: Vec<i32> = (0..513).map(|i| (i * (rank + 1)) as i32).collect();
        let p = mp(&mut v);
        // SAFETY: in place, 513 i32 of `v`; the host path completes
        // before it returns.
        ok("ncclAllReduce (max, second)", unsafe {
            result::all_reduce(
                p,
                p,
                v.len(),
                sys::ncclDataType_t::ncclInt32,
                sys::ncclRedOp_t::ncclMax,
                comm,
                no_stream(),
            )
        })?;
        compare("allreduce max (second communicator)", &v, |i| {
            (i * world) as f64
        })?;
        // SAFETY: the live handle, not used again.
        ok("ncclCommAbort", unsafe { result::comm_abort(comm) })?;
        println!("rank {rank}: second communicator: allreduce max, ncclCommAbort OK");
        Ok(())
    }

    fn collectives(rank: usize, world: usize, comm: sys::ncclComm_t) -> Result<(), String> {
        // AllReduce, sum, f32, out of place; a count no rank count divides.
        let n = 10_007;
        let send: Vec<f32> = (0..n).map(|i| input(rank, i) as f32).collect();
        let mut recv = vec![f32::NAN; n];
        // SAFETY: both buffers hold `n` f32; synchronous on host memory.
        ok("ncclAllReduce", unsafe {
            result::all_reduce(
                cp(&send),
                mp(&mut recv),
                n,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                comm,
                no_stream(),
            )
        })?;
        compare("allreduce sum f32", &recv, |i| {
            (0..world).map(|r| input(r, i)).sum()
        })?;

        // AllReduce, product, f64, in place.
        let n = 1001;
        let factor = |r: usize, i: usize| 1.0 + ((r + i) % 3) as f64 * 0.5;
        let mut buf: Vec<f64> = (0..n).map(|i| factor(rank, i)).collect();
        let p = mp(&mut buf);
        // SAFETY: in place, `n` f64.
        ok("ncclAllReduce (prod, in place)", unsafe {
            result::all_reduce(
                p,
                p,
                n,
                sys::ncclDataType_t::ncclFloat64,
                sys::ncclRedOp_t::ncclProd,
                comm,
                no_stream(),
            )
        })?;
        compare("allreduce prod f64 in place", &buf, |i| {
            (0..world).map(|r| factor(r, i)).product()
        })?;

        // Broadcast from the last rank; the others pass no send buffer, as
        // cudarc's `Comm::broadcast` does with `None`.
        let n = 4099;
        let root = world - 1;
        let value = |i: usize| i as f64 * 0.25 - 7.0;
        let send: Vec<f64> = (0..n).map(value).collect();
        let mut recv = vec![f64::NAN; n];
        let src = if rank == root {
            cp(&send)
        } else {
            std::ptr::null()
        };
        // SAFETY: `recv` holds `n` f64, and so does `send` on the root.
        ok("ncclBroadcast", unsafe {
            result::broadcast(
                src,
                mp(&mut recv),
                n,
                sys::ncclDataType_t::ncclFloat64,
                root as i32,
                comm,
                no_stream(),
            )
        })?;
        compare("broadcast f64", &recv, value)?;

        // Reduce (sum) to rank 0; the others pass no receive buffer, as
        // cudarc's `Comm::reduce` does with `None`.
        let n = 777;
        let send: Vec<f64> = (0..n).map(|i| input(rank, i)).collect();
        let mut recv = vec![f64::NAN; n];
        let dst = if rank == 0 {
            mp(&mut recv)
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: `send` holds `n` f64, and so does `recv` on the root.
        ok("ncclReduce", unsafe {
            result::reduce(
                cp(&send),
                dst,
                n,
                sys::ncclDataType_t::ncclFloat64,
                sys::ncclRedOp_t::ncclSum,
                0,
                comm,
                no_stream(),
            )
        })?;
        if rank == 0 {
            compare("reduce sum f64 to rank 0", &recv, |i| {
                (0..world).map(|r| input(r, i)).sum()
            })?;
        }

        // ReduceScatter, sum, f32: block `rank` of everyone's sum.
        let m = 2053;
        let send: Vec<f32> = (0..world * m).map(|j| input(rank, j) as f32).collect();
        let mut recv = vec![f32::NAN; m];
        // SAFETY: `send` holds world * m f32, `recv` m.
        ok("ncclReduceScatter", unsafe {
            result::reduce_scatter(
                cp(&send),
                mp(&mut recv),
                m,
                sys::ncclDataType_t::ncclFloat32,
                sys::ncclRedOp_t::ncclSum,
                comm,
                no_stream(),
            )
        })?;
        compare("reducescatter sum f32", &recv, |i| {
            (0..world).map(|r| input(r, rank * m + i)).sum()
        })?;

        // AllGather, i32.
        let m = 3001;
        let mine = |r: usize, i: usize| (r * 100_003 + i) as i32;
        let send: Vec<i32> = (0..m).map(|i| mine(rank, i)).collect();
        let mut recv = vec![-1i32; world * m];
        // SAFETY: `send` holds m i32, `recv` world * m.
        ok("ncclAllGather", unsafe {
            result::all_gather(
                cp(&send),
                mp(&mut recv),
                m,
                sys::ncclDataType_t::ncclInt32,
                comm,
                no_stream(),
            )
        })?;
        compare("allgather i32", &recv, |j| f64::from(mine(j / m, j % m)))?;
        println!("rank {rank}: allreduce (sum f32, prod f64 in place), broadcast, reduce, reducescatter, allgather OK");
        Ok(())
    }

    /// A ring in one group: send to the next rank, receive from the
    /// previous one (with one rank, itself), a message of many slots.
    fn point_to_point(rank: usize, world: usize, comm: sys::ncclComm_t) -> Result<(), String> {
        let n = 70_001;
        let next = (rank + 1) % world;
        let prev = (rank + world - 1) % world;
        let value = |r: usize, i: usize| (r * 7 + i % 1000) as f32;
        let send: Vec<f32> = (0..n).map(|i| value(rank, i)).collect();
        let mut recv = vec![f32::NAN; n];
        ok("ncclGroupStart", result::group_start())?;
        // SAFETY: both buffers hold `n` f32 and outlive the group, which
        // runs (synchronously, on host memory) in ncclGroupEnd below.
        let queued = unsafe {
            ok(
                "ncclSend",
                result::send(
                    cp(&send),
                    n,
                    sys::ncclDataType_t::ncclFloat32,
                    next as i32,
                    comm,
                    no_stream(),
                ),
            )
            .and_then(|()| {
                ok(
                    "ncclRecv",
                    result::recv(
                        mp(&mut recv),
                        n,
                        sys::ncclDataType_t::ncclFloat32,
                        prev as i32,
                        comm,
                        no_stream(),
                    ),
                )
            })
        };
        // The group is closed whatever happened inside it.
        let ended = ok("ncclGroupEnd", result::group_end());
        queued.and(ended)?;
        compare("send/recv ring in a group", &recv, |i| {
            f64::from(value(prev, i))
        })?;
        println!("rank {rank}: send/recv ring in a group OK");
        Ok(())
    }

    /// A bad argument is refused before any data moves (on every rank
    /// alike, so the communicator stays usable), with a code cudarc turns
    /// into an `Err` and a string from ncclGetErrorString.
    fn refusal(rank: usize, world: usize, comm: sys::ncclComm_t) -> Result<(), String> {
        let mut buf = vec![0f32; 16];
        let p = mp(&mut buf);
        // SAFETY: a valid buffer of 16 f32; the root is out of range.
        let r = unsafe {
            result::broadcast(
                p,
                p,
                buf.len(),
                sys::ncclDataType_t::ncclFloat32,
                world as i32,
                comm,
                no_stream(),
            )
        };
        let code = match r {
            Err(NcclError(code)) => code,
            Ok(_) => {
                return Err(format!(
                    "ncclBroadcast with root {world} of {world} ranks succeeded"
                ))
            }
        };
        if code != sys::ncclResult_t::ncclInvalidArgument {
            return Err(format!(
                "root out of range gave {code:?}, not ncclInvalidArgument"
            ));
        }
        // SAFETY: a result code; the string is static in the library.
        let text = unsafe { CStr::from_ptr(sys::ncclGetErrorString(code)) }.to_string_lossy();
        if text.is_empty() {
            return Err("ncclGetErrorString gave an empty string".into());
        }
        // SAFETY: the live communicator; a string owned by the library.
        let last = unsafe { CStr::from_ptr(sys::ncclGetLastError(comm)) }.to_string_lossy();
        if !last.contains("root") {
            return Err(format!("ncclGetLastError does not name the root: {last:?}"));
        }
        println!("rank {rank}: root out of range refused: {code:?}, {text:?}, {last:?}");
        Ok(())
    }
}

// ------------------------------------------------ a GPU, Candle's pattern

mod gpu {
    use super::*;
    use cudarc::driver::{CudaContext, CudaSlice};
    use cudarc::nccl::{Comm, ReduceOp};

    fn drv(call: &str, e: cudarc::driver::DriverError) -> String {
        format!("{call}: {e:?}")
    }

    pub fn run(rank: usize, world: usize, dir: &Path) -> Result<(), String> {
        // cudarc's safe `Comm` needs a `CudaStream`, whose context is made
        // through cudarc's driver loader, which panics where libcuda
        // cannot be loaded: say so instead. (Its NCCL calls themselves
        // load only libnccl: the host mode runs without a driver.)
        // SAFETY: tries to open libcuda under cudarc's candidate names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(
                "no CUDA driver (libcuda) to load: cudarc's safe Comm needs a CudaStream; \
                 `host` mode runs cudarc's NCCL calls without one"
                    .into(),
            );
        }
        let id = exchange_id(rank, dir, "gpu")?;
        let devices = CudaContext::device_count().map_err(|e| drv("cuDeviceGetCount", e))? as usize;
        if devices == 0 {
            return Err("no CUDA device".into());
        }
        // Ranks share the GPUs round robin: with one GPU, all on it (which
        // real NCCL refuses, ferroccl does not).
        let ctx = CudaContext::new(rank % devices).map_err(|e| drv("CudaContext::new", e))?;
        let stream = ctx.new_stream().map_err(|e| drv("new_stream", e))?;
        let comm = Comm::from_rank(stream.clone(), rank, world, id)
            .map_err(|e| nccl_err("Comm::from_rank", e))?;
        println!(
            "rank {rank}: Comm::from_rank on device {} of {devices}",
            rank % devices
        );

        for n in [1usize, 1000, 4099, 1 << 20, (1 << 22) + 3] {
            let x: Vec<f32> = (0..n).map(|i| input(rank, i) as f32).collect();
            let send = stream.clone_htod(&x).map_err(|e| drv("clone_htod", e))?;
            let mut recv: CudaSlice<f32> =
                stream.alloc_zeros(n).map_err(|e| drv("alloc_zeros", e))?;
            ok(
                "Comm::all_reduce",
                comm.all_reduce(&send, &mut recv, &ReduceOp::Sum),
            )?;
            let got = stream.clone_dtoh(&recv).map_err(|e| drv("clone_dtoh", e))?;
            compare(&format!("all_reduce sum f32, {n} elements"), &got, |i| {
                (0..world).map(|r| input(r, i)).sum()
            })?;
        }
        println!("rank {rank}: all_reduce (sum, f32, 1 to 4M+3 elements) OK");

        let n = 100_003;
        let mut buf = stream
            .clone_htod(&(0..n).map(|i| input(rank, i)).collect::<Vec<f64>>())
            .map_err(|e| drv("clone_htod", e))?;
        ok(
            "Comm::all_reduce_in_place",
            comm.all_reduce_in_place(&mut buf, &ReduceOp::Max),
        )?;
        let got = stream.clone_dtoh(&buf).map_err(|e| drv("clone_dtoh", e))?;
        compare("all_reduce_in_place max f64", &got, |i| input(world - 1, i))?;

        let root = world - 1;
        let value = |i: usize| i as f32 * 0.25 - 7.0;
        let src = stream
            .clone_htod(&(0..n).map(value).collect::<Vec<f32>>())
            .map_err(|e| drv("clone_htod", e))?;
        let mut dst: CudaSlice<f32> = stream.alloc_zeros(n).map_err(|e| drv("alloc_zeros", e))?;
        let send = (rank == root).then_some(&src);
        ok(
            "Comm::broadcast",
            comm.broadcast(send, &mut dst, root as i32),
        )?;
        let got = stream.clone_dtoh(&dst).map_err(|e| drv("clone_dtoh", e))?;
        compare("broadcast f32", &got, |i| f64::from(value(i)))?;

        let m = 65_537;
        let mine = |r: usize, i: usize| (r * 1_000_003 + i) as i32;
        let src = stream
            .clone_htod(&(0..m).map(|i| mine(rank, i)).collect::<Vec<i32>>())
            .map_err(|e| drv("clone_htod", e))?;
        let mut dst: CudaSlice<i32> = stream
            .alloc_zeros(world * m)
            .map_err(|e| drv("alloc_zeros", e))?;
        ok("Comm::all_gather", comm.all_gather(&src, &mut dst))?;
        let got = stream.clone_dtoh(&dst).map_err(|e| drv("clone_dtoh", e))?;
        compare("all_gather i32", &got, |j| f64::from(mine(j / m, j % m)))?;
        println!("rank {rank}: all_reduce_in_place (max f64), broadcast, all_gather OK");

        // Dropping a `Comm` calls ncclCommAbort (cudarc's Drop), which
        // panics on an error.
        drop(comm);
        println!("rank {rank}: Comm dropped (ncclCommAbort)");
        Ok(())
    }
}
