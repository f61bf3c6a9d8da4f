//! Allgathers, all-to-alls, broadcasts and 2-rank allreduces of ordinary
//! buffers straight out of the peers' processes (cross-memory attach,
//! `process_vm_readv`), where every rank could read every other's memory
//! (probed when the control pages are made; `Control::cma`) and the
//! planner chose it (`plan::Direct::Pull`: allgather and all-to-all blocks
//! and broadcast sizes in the ranges the calibration measured the pull to
//! win, `plan::cma_range`; allreduces in `plan::CMA_ALLREDUCE`). Each rank
//! copies its own part from input to output and what it needs out of each
//! peer's process, nearest peer first (allgather: every peer's input into
//! the peer's block; all-to-all: block `rank` of every peer's input;
//! broadcast: the root's input, and nothing on the root): one copy per
//! byte, by the kernel, against two through slots.
//!
//! Where every rank may write every other's memory too and has a CPU of
//! its own (`Control::cma_push`), the ranks share the copies: a
//! broadcast's root writes the last share of its input into every
//! receiver's output (`process_vm_writev`, at the address the receiver
//! announced for this call) while they pull the rest; on 2 ranks an
//! allreduce's rank r pulls half r of the peer's input, reduces it with
//! its own into its output and writes the result into the peer's output.
//! A rank writes nothing but its own output and, where the peers said,
//! theirs, never a peer's input: a peer that failed can make a reader
//! fail, and a writer can corrupt only the output of the call the
//! receiver announced (docs/reliability.md, "Writes into a peer's
//! process"). The check-in's completion wait follows: no rank returns
//! while a peer may still read its input or write its output.

use super::checkin::{entry, word, Ctx, E_IN_ADDR, E_OUT_ADDR};
use super::direct::{with_scratch, Kernel};
use super::io::HostIo;
use crate::algo::{Operand, Prim, Step};
use crate::coll::CollKind;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::reduce::Store;
use ferroccl_transport::SharedMemory;
use std::sync::atomic::Ordering;

/// Where the peers' inputs are: the memory that reaches other processes,
/// each rank's pid and the address of its input there.
type Inputs<'a> = (&'a dyn SharedMemory, &'a [u32], &'a [u64]);

/// Run check-in `turn`'s call (an allgather, all-to-all, broadcast or
/// 2-rank allreduce of `count` input elements per rank) by copying out of
/// the peers' processes (and, where they may, into them).
pub(super) fn run<T: Element>(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    turn: u64,
    count: usize,
) -> Result<()> {
    // Each peer stored its input's address before the sequence number
    // this rank acquired when it read the announcement.
    let inputs = (0..ctx.size)
        .map(|j| {
            let at = word(ctx.control.pages.words(j), entry(turn) + E_IN_ADDR)?;
            Ok(at.load(Ordering::Relaxed))
        })
        .collect::<Result<Vec<u64>>>()?;
    let (n, rank) = (ctx.size, ctx.rank);
    let from = (
        &*ctx.control.memory,
        ctx.control.pids.as_slice(),
        inputs.as_slice(),
    );
    // This rank first, then the nearest peers.
    let every = (0..n).map(|step| (rank + step) % n);
    match k.call.kind {
        // Every input into its block.
        CollKind::AllGather => pull(k, from, io, every, |j| (0, j * count, count)),
        // The root's input (on the root, its own: nothing in place); where
        // the root may write into the receivers, it pushes the last share
        // while they pull the rest.
        CollKind::Broadcast => {
            let root = k.call.fingerprint.root as usize;
            let share = if ctx.control.cma_push {
                push_share(count, n, k.elem)
            } else {
                0
            };
            let kept = count - share;
            if rank == root && share > 0 {
                pull(k, from, io, std::iter::once(root), |_| (0, 0, count))?;
                push(k, ctx, io, turn, (kept, share))
            } else {
                pull(k, from, io, std::iter::once(root), |_| (0, 0, kept))
            }
        }
        CollKind::AllReduce => all_reduce(k, ctx, io, turn, (from, count)),
        // Block `rank` of every input into block j.
        _ => {
            let block = count / n;
            pull(k, from, io, every, |j| (rank * block, j * block, block))
        }
    }
}

/// How many of a broadcast's `count` elements its root pushes into each
/// of the `n - 1` receivers (the last ones) while they pull the rest: a
/// rank's share, `count / n`, in whole cache lines, so that the root
/// copies as much as each receiver, on CPUs of their own at once. On 2
/// ranks of the 2-core Intel VM the bare program of the traffic
/// (`bench/bound/cma_bcast.c`, SPLIT=1 against the whole pull) ran
/// 1.2-1.6x faster at 128 KiB and 1.7-3x from 512 KiB to 8 MiB, and
/// ferroccl's broadcast 1.3-2.3x from 64 KiB to 32 MiB in turns
/// (docs/performance-log.md, "A broadcast's root pushes a share"). A
/// 2-rank allreduce splits its halves here too: rank 0 the first
/// `push_share(count, 2)` elements, rank 1 the rest.
fn push_share(count: usize, n: usize, elem: usize) -> usize {
    let line = (64 / elem.max(1)).max(1);
    count / n.max(1) / line * line
}

/// The root's share of a broadcast pushed by cross-memory attach: the
/// `share` elements of its input from element `kept` written at element
/// `kept` of every receiver's output, at the address each announced at
/// check-in `turn`, nearest receiver first. The receivers wait at the
/// completion for this rank's word, stored after the last write.
fn push<T: Element>(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    io: &HostIo<'_, T>,
    turn: u64,
    (kept, share): (usize, usize),
) -> Result<()> {
    let (n, rank) = (ctx.size, ctx.rank);
    let src: &[u8] = bytemuck::cast_slice(io.input(kept, share));
    for j in (1..n).map(|step| (rank + step) % n) {
        write_peer(k, ctx, turn, j, kept, src)?;
    }
    Ok(())
}

/// Bytes a pulled 2-rank allreduce moves per turn of its loop: the
/// peer's input read into a buffer this thread keeps, reduced with this
/// rank's into its output, and the result written into the peer's output
/// from there while it is still in this core's cache.
const ALL_REDUCE_CHUNK_BYTES: usize = 64 << 10;

/// A 2-rank allreduce of `count` elements by cross-memory attach: this
/// rank's half (rank 0 the first `count / 2` elements in whole cache
/// lines, rank 1 the rest), chunk by chunk, pulled out of the peer's
/// input, reduced with this rank's input into its output and written at
/// the same place of the peer's output (the address it announced at
/// check-in `turn`). The peer does the same with the other half; neither
/// reads what the other writes, in place too (a rank writes only the
/// peer's half of the peer's buffer, which the peer never touches). The
/// completion wait follows. The result of each element is computed once,
/// so both ranks hold the same bits.
fn all_reduce<T: Element>(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    turn: u64,
    (from, count): (Inputs<'_>, usize),
) -> Result<()> {
    let peer = 1 - ctx.rank.min(1);
    let half = push_share(count, 2, k.elem);
    let (start, len) = if ctx.rank == 0 {
        (0, half)
    } else {
        (half, count - half)
    };
    let chunk = (ALL_REDUCE_CHUNK_BYTES / k.elem.max(1)).max(1);
    with_scratch::<T, _>(chunk.min(len), |tmp| {
        for at in (start..start + len).step_by(chunk) {
            let m = chunk.min(start + len - at);
            let tmp = &mut tmp[..m];
            read_peer(k, from, peer, at, bytemuck::cast_slice_mut(tmp))?;
            let step = Step::local(Prim::Reduce, Operand::Input, at, at, m);
            io.reduce_to_output(Store::Cached, k.op, &step, tmp);
            write_peer(
                k,
                ctx,
                turn,
                peer,
                at,
                bytemuck::cast_slice(io.output_ref(at, m)),
            )?;
        }
        Ok(())
    })
}

/// Write `src` into rank `j`'s output from element `at`, at the address
/// `j` announced at check-in `turn`, by cross-memory attach.
fn write_peer(
    k: &Kernel<'_>,
    ctx: &Ctx<'_>,
    turn: u64,
    j: usize,
    at: usize,
    src: &[u8],
) -> Result<()> {
    let fail = |reason: String| Error::PeerFailed {
        rank: j,
        during: k.call.during(),
        reason,
    };
    let out = word(ctx.control.pages.words(j), entry(turn) + E_OUT_ADDR)?.load(Ordering::Relaxed);
    let addr = (at as u64)
        .checked_mul(k.elem as u64)
        .and_then(|b| out.checked_add(b))
        .ok_or_else(|| fail(format!("its announced output address overflows at {at}")))?;
    let pid = ctx.control.pids[j];
    ctx.control
        .memory
        .write_process(pid, addr as usize, src)
        .map_err(|e| {
            fail(format!(
                "writing {} bytes into its output at {addr:#x} in process {pid} by \
                 cross-memory attach failed: {e}",
                src.len()
            ))
        })
}

/// Copy out of the processes of `ranks` (cross-memory attach): for each
/// rank `j`, `part(j)` says which elements (`from`, of `j`'s input, which
/// lies at `inputs[j]` in process `pids[j]`) go where (`to`, of this
/// rank's output), and how many. This rank's own part is copied from input
/// to output. Reads only.
fn pull<T: Element>(
    k: &Kernel<'_>,
    from: Inputs<'_>,
    io: &mut HostIo<'_, T>,
    ranks: impl Iterator<Item = usize>,
    part: impl Fn(usize) -> (usize, usize, usize),
) -> Result<()> {
    for j in ranks {
        let (at, to, len) = part(j);
        if j == k.rank {
            let own = Step::local(Prim::Copy, Operand::Input, at, to, len);
            io.copy_input_to_output(Store::Cached, &own);
            continue;
        }
        read_peer(k, from, j, at, bytemuck::cast_slice_mut(io.output(to, len)))?;
    }
    Ok(())
}

/// Copy rank `j`'s input from element `from` (its input lies at
/// `inputs[j]` in process `pids[j]`) into `dst`, by cross-memory attach.
fn read_peer(
    k: &Kernel<'_>,
    (memory, pids, inputs): Inputs<'_>,
    j: usize,
    from: usize,
    dst: &mut [u8],
) -> Result<()> {
    let fail = |reason: String| Error::PeerFailed {
        rank: j,
        during: k.call.during(),
        reason,
    };
    let at = (from as u64)
        .checked_mul(k.elem as u64)
        .and_then(|b| inputs[j].checked_add(b))
        .ok_or_else(|| fail(format!("its announced input address overflows at {from}")))?;
    let bytes = dst.len();
    memory.read_process(pids[j], at as usize, dst).map_err(|e| {
        fail(format!(
            "copying {bytes} bytes of its input at {at:#x} in process {} by cross-memory \
                 attach failed: {e}",
            pids[j]
        ))
    })
}
