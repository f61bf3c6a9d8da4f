//! The collectives: reduction operators (`ncclRedOpCreatePreMulSum`,
//! `ncclRedOpDestroy`), the one checked path every collective entry point
//! forwards to (`collective`), the entry points themselves (one
//! `forward!` list), and gather and scatter as grouped point-to-point
//! calls (`rooted`).

use super::{live, out, put};
use crate::abi::{self, result};
use crate::call::{Call, Kind, Memory, Op, PreMul, Scalar};
use crate::group;
use crate::status::{entry, Failure};
use crate::NcclComm;
use std::ffi::{c_int, c_void};

/// `ncclRedOpCreatePreMulSum`: `ncclScalarHostImmediate` reads the
/// scalar now; `ncclScalarDevice` reads it at each call: a host address
/// when the call is made, a device address on the stream when the stream
/// reaches the call (device buffers only).
///
/// # Safety
/// `op` is NULL or writable; `scalar` NULL or a readable value of
/// `datatype` (for `ncclScalarDevice`, readable at every call that uses
/// the operator, on the device until the stream has passed the call);
/// `comm` NULL or an `ncclComm_t` of this library.
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpCreatePreMulSum(
    op: *mut c_int,
    scalar: *mut c_void,
    datatype: c_int,
    residence: c_int,
    comm: NcclComm,
) -> c_int {
    entry("ncclRedOpCreatePreMulSum", || {
        out(op, "op")?;
        let dtype = abi::data_type(datatype)?;
        // SAFETY: as the caller vouches.
        let (_, core) = unsafe { live(comm)? };
        let scalar_ptr = out(scalar, "scalar")? as usize;
        let on_device = ferroccl_cuda::cuda_engine::pointer_info(scalar_ptr as u64).is_ok();
        let scalar = match residence {
            1 => {
                if on_device {
                    return Err(Failure::invalid_argument(
                        "ncclScalarHostImmediate with a scalar in device memory",
                    ));
                }
                let mut bytes = [0u8; 8];
                // SAFETY: a readable value of `datatype` (at most 8
                // bytes), as the caller vouches.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        scalar_ptr as *const u8,
                        bytes.as_mut_ptr(),
                        dtype.size(),
                    )
                };
                Scalar::Value(bytes)
            }
            0 if on_device => Scalar::DevicePtr(scalar_ptr),
            0 => Scalar::HostPtr(scalar_ptr),
            other => {
                return Err(Failure::invalid_argument(format!(
                    "residence {other} is not an ncclScalarResidence_t (0 or 1)"
                )))
            }
        };
        let value = core.add_premul(PreMul { dtype, scalar })?;
        // SAFETY: as the caller vouches.
        unsafe { put(op, "op", value) }
    })
}

/// `ncclRedOpDestroy`.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library.
#[no_mangle]
pub unsafe extern "C" fn ncclRedOpDestroy(op: c_int, comm: NcclComm) -> c_int {
    entry("ncclRedOpDestroy", || {
        // SAFETY: as the caller vouches.
        let (_, core) = unsafe { live(comm)? };
        if op < abi::NUM_OPS {
            return Err(Failure::invalid_argument(format!(
                "op {op} is built in, not created by ncclRedOpCreatePreMulSum"
            )));
        }
        core.remove_premul(op)?;
        Ok(result::SUCCESS)
    })
}

/// Check and submit one call.
///
/// # Safety
/// `comm` is NULL or an `ncclComm_t` of this library; the buffers are
/// as NCCL's API requires for `kind`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn collective(
    name: &str,
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    op: Option<c_int>,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    entry(name, || {
        // SAFETY: as the caller vouches.
        let (_, core) = unsafe { live(comm)? };
        let dtype = abi::data_type(datatype)?;
        let op = match op {
            None => Op::None,
            Some(v) => match abi::builtin_op(v)? {
                Some(b) => Op::Builtin(b),
                None => Op::PreMul(core.premul(v)?),
            },
        };
        if root < 0 {
            let what = if matches!(kind, Kind::Send | Kind::Recv) {
                "peer"
            } else {
                "root"
            };
            return Err(Failure::invalid_argument(format!(
                "{what} {root} is negative"
            )));
        }
        let call = Call {
            kind,
            send: send as usize,
            recv: recv as usize,
            count,
            dtype,
            op,
            root: root as usize,
            memory: Memory::Host,
            stream: stream as usize,
        }
        .check(core.comm.rank(), core.comm.size())?;
        group::submit(core, call)?;
        Ok(result::SUCCESS)
    })
}

forward! {
    /// `ncclAllReduce`.
    ///
    /// # Safety
    /// NCCL's contract: `comm` an `ncclComm_t` of this library; the buffers
    /// hold `count` elements; host buffers are untouched by others until the
    /// call returns, device buffers until the stream reaches it.
    fn ncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, comm: NcclComm, stream: *mut c_void)
        => collective(Kind::AllReduce, sendbuff, recvbuff, count, datatype, Some(op), 0, comm, stream);

    /// `ncclReduce`.
    ///
    /// # Safety
    /// As [`ncclAllReduce`]; `recvbuff` is used on `root` only.
    fn ncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, op: c_int, root: c_int, comm: NcclComm, stream: *mut c_void)
        => collective(Kind::Reduce, sendbuff, recvbuff, count, datatype, Some(op), root, comm, stream);

    /// `ncclBroadcast`.
    ///
    /// # Safety
    /// As [`ncclAllReduce`]; `sendbuff` is used on `root` only.
    fn ncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: NcclComm, stream: *mut c_void)
        => collective(Kind::Broadcast, sendbuff, recvbuff, count, datatype, None, root, comm, stream);

    /// `ncclBcast`: broadcast in place.
    ///
    /// # Safety
    /// As [`ncclAllReduce`].
    fn ncclBcast(buff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: NcclComm, stream: *mut c_void)
        => collective(Kind::Broadcast, buff, buff, count, datatype, None, root, comm, stream);

    /// `ncclReduceScatter`: `recvcount` elements per rank.
    ///
    /// # Safety
    /// As [`ncclAllReduce`]; `sendbuff` holds `recvcount * nranks` elements.
    fn ncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: c_int, op: c_int, comm: NcclComm, stream: *mut c_void)
        => collective(Kind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, Some(op), 0, comm, stream);

    /// `ncclAllGather`: `sendcount` elements per rank.
    ///
    /// # Safety
    /// As [`ncclAllReduce`]; `recvbuff` holds `sendcount * nranks` elements.
    fn ncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: c_int, comm: NcclComm, stream: *mut c_void)
        => collective(Kind::AllGather, sendbuff, recvbuff, sendcount, datatype, None, 0, comm, stream);

    /// `ncclAlltoAll`: `count` elements to and from each rank.
    ///
    /// # Safety
    /// As [`ncclAllReduce`]; both buffers hold `count * nranks` elements.
    fn ncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, comm: NcclComm, stream: *mut c_void)
        => collective(Kind::AllToAll, sendbuff, recvbuff, count, datatype, None, 0, comm, stream);

    /// `ncclGather`: `count` elements from every rank into the root's
    /// `recvbuff`, rank `i`'s at block `i`.
    ///
    /// # Safety
    /// As `rooted`.
    fn ncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: NcclComm, stream: *mut c_void)
        => rooted(true, sendbuff, recvbuff, count, datatype, root, comm, stream);

    /// `ncclScatter`: block `i` of the root's `sendbuff` to rank `i`.
    ///
    /// # Safety
    /// As `rooted`.
    fn ncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: c_int, root: c_int, comm: NcclComm, stream: *mut c_void)
        => rooted(false, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

/// `ncclGather` (`gather`) or `ncclScatter`: the root's blocks as
/// point-to-point calls in one group, so they run (and are checked) as
/// grouped sends and receives do.
///
/// # Safety
/// As [`ncclAllReduce`]: the root's `recvbuff` (gather) or `sendbuff`
/// (scatter) holds `count * nranks` elements, every other buffer `count`.
#[allow(clippy::too_many_arguments)]
unsafe fn rooted(
    name: &str,
    gather: bool,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> c_int {
    entry(name, || {
        // SAFETY: as the caller vouches.
        let (_, core) = unsafe { live(comm)? };
        let dtype = abi::data_type(datatype)?;
        let (me, n) = (core.comm.rank(), core.comm.size());
        if root < 0 || root as usize >= n {
            return Err(Failure::invalid_argument(format!(
                "{name}: root {root} is out of range for a communicator of {n} ranks"
            )));
        }
        let root = root as usize;
        let block = count
            .checked_mul(dtype.size())
            .filter(|b| {
                b.checked_mul(n)
                    .is_some_and(|all| all <= isize::MAX as usize)
            })
            .ok_or_else(|| {
                Failure::invalid_argument(format!(
                    "{name}: count {count} of {dtype:?} on {n} ranks overflows the address space"
                ))
            })?;
        let (send, recv) = (send as usize, recv as usize);
        let many = if gather { recv } else { send };
        if me == root && count > 0 && many == 0 {
            let what = if gather { "recvbuff" } else { "sendbuff" };
            return Err(Failure::invalid_argument(format!(
                "{name}: {what} is NULL on the root but {n} blocks of {count} are needed"
            )));
        }
        let p2p = |kind, send, recv, peer| Call {
            kind,
            send,
            recv,
            count,
            dtype,
            op: Op::None,
            root: peer,
            memory: Memory::Host,
            stream: stream as usize,
        };
        let mut calls = Vec::new();
        if gather {
            calls.push(p2p(Kind::Send, send, 0, root));
            if me == root {
                calls.extend((0..n).map(|q| p2p(Kind::Recv, 0, recv + q * block, q)));
            }
        } else {
            if me == root {
                calls.extend((0..n).map(|q| p2p(Kind::Send, send + q * block, 0, q)));
            }
            calls.push(p2p(Kind::Recv, 0, recv, root));
        }
        let calls = calls
            .into_iter()
            .map(|c| c.check(me, n))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|mut f| {
                f.message = f
                    .message
                    .replace("ncclSend", name)
                    .replace("ncclRecv", name);
                f
            })?;
        group::submit_all(core, calls)?;
        Ok(result::SUCCESS)
    })
}
