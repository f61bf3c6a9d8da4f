//! `host` mode: cudarc's result-level NCCL calls on host memory (no GPU
//! needed: CI).

use crate::rank::{compare, exchange_id, input, nccl_err, ok};
use cudarc::nccl::result::{self, NcclError};
use cudarc::nccl::sys;
use std::ffi::{c_void, CStr};
use std::path::Path;

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

pub(crate) fn run(rank: usize, world: usize, dir: &Path) -> Result<(), String> {
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
