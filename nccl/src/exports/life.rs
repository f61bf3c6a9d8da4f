//! Communicator life: the version, unique ids, making a communicator
//! (`ncclCommInitRank*`, `ncclCommInitAll`), splitting and shrinking it,
//! and ending it (`ncclCommFinalize`, `ncclCommDestroy`, `ncclCommAbort`).

use super::{live, out, put};
use crate::abi::{self, result, ConfigHead, UniqueId};
use crate::comm::{self, Core, Handle, State};
use crate::group;
use crate::status::{entry, Failure};
use crate::uid::{self, Meeting};
use crate::NcclComm;
use std::ffi::c_int;
use std::sync::Arc;

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

/// `ncclCommShrink`: a new communicator of the ranks of `comm` but the
/// `exclude_count` ranks of `exclude_ranks` and those known to have failed
/// (`Communicator::shrink`); every rank not excluded calls it, an excluded
/// rank must not. `NCCL_SHRINK_ABORT` first ends the parent's calls in
/// flight (as `ncclCommAbort` would, without freeing the handle);
/// `NCCL_SHRINK_DEFAULT` leaves the parent as it is. Inside a group it is
/// refused (not deferred).
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library; `exclude_ranks` NULL
/// (with a count of 0) or `exclude_count` readable `int`s; `newcomm` NULL
/// or writable; `config` NULL or an `ncclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommShrink(
    comm: NcclComm,
    exclude_ranks: *mut c_int,
    exclude_count: c_int,
    newcomm: *mut NcclComm,
    config: *const ConfigHead,
    flags: c_int,
) -> c_int {
    entry("ncclCommShrink", || {
        let newcomm = out(newcomm, "newcomm")?;
        // SAFETY: as the caller vouches.
        let h = unsafe { Handle::from_c(comm)? };
        let count = usize::try_from(exclude_count).map_err(|_| {
            Failure::invalid_argument(format!("excludeRanksCount {exclude_count} is negative"))
        })?;
        if count > 0 && exclude_ranks.is_null() {
            return Err(Failure::invalid_argument(format!(
                "excludeRanksList is NULL with excludeRanksCount {count}"
            )));
        }
        if flags != abi::SHRINK_DEFAULT && flags != abi::SHRINK_ABORT {
            return Err(Failure::invalid_argument(format!(
                "shrinkFlags {flags:#x}: NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)"
            )));
        }
        if group::open() {
            return Err(Failure::invalid_usage(
                "ncclCommShrink inside a group is not supported: call it outside \
                 ncclGroupStart/ncclGroupEnd",
            ));
        }
        let exclude: Vec<c_int> = if count == 0 {
            Vec::new()
        } else {
            // SAFETY: non-NULL and `count` readable ints, as the caller vouches.
            unsafe { std::slice::from_raw_parts(exclude_ranks, count) }.to_vec()
        };
        let core = h.core()?;
        let size = core.comm.size();
        let mut ranks = Vec::with_capacity(exclude.len());
        for r in exclude {
            match usize::try_from(r) {
                Ok(r) if r < size => ranks.push(r),
                _ => {
                    return Err(Failure::invalid_argument(format!(
                        "excluded rank {r} is not a rank of this communicator of {size}"
                    )))
                }
            }
        }
        let config = if config.is_null() {
            core.config.clone()
        } else {
            // SAFETY: as the caller vouches.
            unsafe { abi::read_config(config)? }
        };
        if flags == abi::SHRINK_ABORT {
            core.comm.abort();
        }
        let child = Core::new(core.comm.shrink(&ranks)?, config);
        let (rank, size) = (child.comm.rank(), child.comm.size());
        let value = Handle::new_raw(rank, size, h.device, State::Ready(child));
        // SAFETY: checked non-NULL; the caller vouches it is writable.
        unsafe { newcomm.write(value) };
        Ok(result::SUCCESS)
    })
}
