//! Which `libnccl` cudarc's loader mapped, and whether the NCCL functions
//! cudarc declares resolve in it.

use cudarc::nccl::sys;
use std::path::PathBuf;

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

pub(crate) fn check_loaded_library(rank: usize) -> Result<(), String> {
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
pub(crate) fn check_symbols(rank: usize) -> Result<(), String> {
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
