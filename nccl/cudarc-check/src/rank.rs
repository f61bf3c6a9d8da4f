//! What every rank does: check the library cudarc loaded, then run its
//! mode; and the helpers both modes use (errors, the unique id's exchange,
//! the inputs and their check).

use crate::symbols::{check_loaded_library, check_symbols};
use crate::{gpu, host, timeout};
use cudarc::nccl::result::{self, NcclError, NcclStatus};
use cudarc::nccl::sys;
use std::ffi::CStr;
use std::path::Path;
use std::time::{Duration, Instant};

pub(crate) fn run_rank(mode: &str, rank: usize, world: usize, dir: &Path) -> Result<(), String> {
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

pub(crate) fn nccl_err(call: &str, e: NcclError) -> String {
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

pub(crate) fn ok(call: &str, r: Result<NcclStatus, NcclError>) -> Result<(), String> {
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
pub(crate) fn exchange_id(rank: usize, dir: &Path, tag: &str) -> Result<cudarc::nccl::Id, String> {
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
pub(crate) fn input(r: usize, i: usize) -> f64 {
    ((r + 1) * (1 + i % 13)) as f64 * 0.5
}

/// Compare `got` with the f64 reference `want(i)`; the first mismatch.
pub(crate) fn compare<T: Copy + Into<f64>>(
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
