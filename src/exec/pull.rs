//! Allgathers, all-to-alls and broadcasts of ordinary buffers straight
//! out of the peers' processes (cross-memory attach, `process_vm_readv`),
//! where every rank could read every other's memory (probed when the
//! control pages are made; `Control::cma`) and the planner chose it
//! (`plan::Direct::Pull`: allgather and all-to-all blocks and broadcast
//! sizes in the ranges the calibration measured the pull to win,
//! `plan::cma_range`). Each rank copies its own part from input to output
//! and what it needs out of each peer's process, nearest peer first
//! (allgather: every peer's input into the peer's block; all-to-all: block
//! `rank` of every peer's input; broadcast: the root's input, and nothing
//! on the root): one copy per byte, by the kernel, against two through
//! slots. A broadcast's root, where every rank may write every other's
//! memory too (`Control::cma_push`), shares the copy: it writes the last
//! share of its input into every receiver's output (`process_vm_writev`,
//! at the address the receiver announced for this call) while they pull
//! the rest. Otherwise only reads: a rank writes nothing but its own
//! output (and a root only the receivers' outputs, where they said), so
//! a peer that failed can at worst make a reader fail, never be
//! corrupted. The check-in's completion wait follows: no rank returns
//! while a peer may still read its input or write its output.

use super::checkin::{entry, word, Ctx, E_IN_ADDR, E_OUT_ADDR};
use super::direct::Kernel;
use super::io::HostIo;
use crate::algo::{Operand, Prim, Step};
use crate::coll::CollKind;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::reduce::Store;
use ferroccl_transport::SharedMemory;
use std::sync::atomic::Ordering;

/// Run check-in `turn`'s call (an allgather, all-to-all or broadcast of
/// `count` input elements per rank) by copying out of the peers'
/// processes.
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
/// (docs/performance-log.md, "A broadcast's root pushes a share").
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
        let fail = |reason: String| Error::PeerFailed {
            rank: j,
            during: k.call.during(),
            reason,
        };
        let out =
            word(ctx.control.pages.words(j), entry(turn) + E_OUT_ADDR)?.load(Ordering::Relaxed);
        let at = (kept as u64)
            .checked_mul(k.elem as u64)
            .and_then(|b| out.checked_add(b))
            .ok_or_else(|| fail(format!("its announced output address overflows at {kept}")))?;
        let pid = ctx.control.pids[j];
        ctx.control
            .memory
            .write_process(pid, at as usize, src)
            .map_err(|e| {
                fail(format!(
                    "writing {} bytes into its output at {at:#x} in process {pid} by \
                     cross-memory attach failed: {e}",
                    src.len()
                ))
            })?;
    }
    Ok(())
}

/// Copy out of the processes of `ranks` (cross-memory attach): for each
/// rank `j`, `part(j)` says which elements (`from`, of `j`'s input, which
/// lies at `inputs[j]` in process `pids[j]`) go where (`to`, of this
/// rank's output), and how many. This rank's own part is copied from input
/// to output. Reads only.
fn pull<T: Element>(
    k: &Kernel<'_>,
    from: (&dyn SharedMemory, &[u32], &[u64]),
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
        read_peer(k, from, io, j, (at, to, len))?;
    }
    Ok(())
}

/// Copy `len` elements of rank `j`'s input from element `from` (its
/// input lies at `inputs[j]` in process `pids[j]`) into this rank's
/// output at element `to`, by cross-memory attach.
fn read_peer<T: Element>(
    k: &Kernel<'_>,
    (memory, pids, inputs): (&dyn SharedMemory, &[u32], &[u64]),
    io: &mut HostIo<'_, T>,
    j: usize,
    (from, to, len): (usize, usize, usize),
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
    let dst: &mut [u8] = bytemuck::cast_slice_mut(io.output(to, len));
    let bytes = dst.len();
    memory.read_process(pids[j], at as usize, dst).map_err(|e| {
        fail(format!(
            "copying {bytes} bytes of its input at {at:#x} in process {} by cross-memory \
                 attach failed: {e}",
            pids[j]
        ))
    })
}
