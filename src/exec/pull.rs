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
//! slots. Only reads: a rank writes nothing but its own output, so a peer
//! that failed can at worst make a reader fail, never be corrupted. The
//! check-in's completion wait follows: no rank returns while a peer may
//! still read its input.

use super::checkin::{entry, word, Ctx, E_IN_ADDR};
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
        // The root's input, whole (on the root, its own: nothing in place).
        CollKind::Broadcast => {
            let root = k.call.fingerprint.root as usize;
            pull(k, from, io, std::iter::once(root), |_| (0, 0, count))
        }
        // Block `rank` of every input into block j.
        _ => {
            let block = count / n;
            pull(k, from, io, every, |j| (rank * block, j * block, block))
        }
    }
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
