//! One file per collective: check the arguments (before any byte moves),
//! build the schedule, and say what the caller does around it (where an
//! in-place call's input and output start, a temporary output, which part
//! of the output Avg divides). Every public collective funnels through one
//! descriptor, [`CollCall`], and [`plan`] (as NCCL funnels every call
//! through one info struct). Nothing here does I/O, holds `unsafe` or reads
//! a clock.

mod all_gather;
mod all_reduce;
mod all_to_all;
mod barrier;
mod broadcast;
#[cfg(test)]
mod knowledge_tests;
mod point_to_point;
mod reduce;
mod reduce_scatter;
mod user;

pub(crate) use all_gather::{all_gather, all_gather_in_place};
pub(crate) use all_reduce::all_reduce;
pub(crate) use all_to_all::all_to_all;
pub(crate) use barrier::barrier;
pub(crate) use broadcast::broadcast;
pub(crate) use point_to_point::point_to_point;
pub(crate) use reduce::reduce;
pub(crate) use reduce_scatter::{reduce_scatter, reduce_scatter_in_place};

use crate::algo::encode::{Finish, Layout};
use crate::algo::{Algorithm, Schedule};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use std::ops::Range;

pub(crate) use user::{collective_of as user_collective, plan as user_plan};

// The call's vocabulary lives in the leaf module `call`; these paths stay
// for the code that names them through `coll`.
pub(crate) use crate::call::{CollCall, CollKind, Geometry};

/// Check `call` and build this rank's plan for it, run by `algorithm`
/// (collectives with a single algorithm ignore it) at slice geometry `g`,
/// with every rank on one host.
pub(crate) fn plan(call: &CollCall, g: Geometry, algorithm: Algorithm) -> Result<Plan> {
    plan_on(call, g, algorithm, None)
}

/// [`plan`] for ranks spread over `hosts`: what the hierarchical
/// algorithm runs on (allreduce, allgather, reduce-scatter); the others
/// ignore it.
pub(crate) fn plan_on(
    call: &CollCall,
    g: Geometry,
    algorithm: Algorithm,
    hosts: Option<&crate::algo::hier::HostMap>,
) -> Result<Plan> {
    let c = call;
    let root = || c.root.unwrap_or(usize::MAX);
    // Allgather and reduce-scatter have a hierarchical schedule but no
    // other choice.
    let gather_hosts = hosts.filter(|_| algorithm == Algorithm::Hierarchical);
    match c.kind {
        CollKind::AllReduce => all_reduce(g, c.send_len, c.recv_len, algorithm, hosts),
        CollKind::ReduceScatter if c.in_place => {
            reduce_scatter_in_place(g, c.send_len, gather_hosts)
        }
        CollKind::ReduceScatter => reduce_scatter(g, c.send_len, c.recv_len, gather_hosts),
        CollKind::AllGather if c.in_place => all_gather_in_place(g, c.recv_len, gather_hosts),
        CollKind::AllGather => all_gather(g, c.send_len, c.recv_len, gather_hosts),
        CollKind::Broadcast => broadcast(g, c.send_len, root(), algorithm),
        CollKind::Reduce => reduce(g, c.send_len, c.recv_len, root(), algorithm),
        CollKind::SendRecv => {
            let (peer, sending) = c.p2p.unwrap_or((usize::MAX, true));
            point_to_point(g, c.count, peer, sending)
        }
        CollKind::AllToAll => all_to_all(g, c.send_len, c.recv_len),
        CollKind::Barrier => Ok(barrier(g)),
    }
}

/// The steps that end a call through slots where the ranks share no
/// control pages and `plan::confirms` asks for them: empty frames that
/// carry the call's fingerprint, so that every rank learns that every
/// other ran the same call (see `plan::confirms`). A broadcast or reduce
/// passes a token on from the rank its data told (the chain's last, the
/// tree's root; on a broadcast's tree, up to the root first); a call of no
/// elements runs the barrier's two laps.
pub(crate) fn confirmation(call: &CollCall, g: Geometry, algorithm: Algorithm) -> Schedule {
    use crate::algo::{ring, tree, CONFIRM_TAG};
    let (p, n) = (g.ring(), g.size);
    let root = call.root.unwrap_or(0) % n.max(1);
    let tree = algorithm == Algorithm::Tree;
    match call.kind {
        CollKind::Broadcast if call.count > 0 && tree => tree::confirmation(p, root, true),
        // The chain ends at root - 1.
        CollKind::Broadcast if call.count > 0 => ring::confirmation(p, (root + n - 1) % n),
        CollKind::Reduce if call.count > 0 && tree => tree::confirmation(p, root, false),
        // The chain ends at the root.
        CollKind::Reduce if call.count > 0 => ring::confirmation(p, root),
        _ => {
            let mut laps = ring::barrier(p);
            for step in &mut laps.steps {
                step.send_tag += CONFIRM_TAG + 2;
                step.recv_tag += CONFIRM_TAG + 2;
            }
            laps
        }
    }
}

/// The elements of the caller's output (in place: of its one buffer) that
/// hold this rank's result once `call` has run under `plan`; `None` where
/// this rank holds none (a reduce's non-root ranks) or the call has no
/// reduced result.
pub(crate) fn result_range(call: &CollCall, plan: &Plan, rank: usize) -> Option<Range<usize>> {
    match call.kind {
        CollKind::AllReduce => Some(0..call.recv_len),
        CollKind::ReduceScatter => {
            let at = if call.in_place { plan.output_base } else { 0 };
            Some(at..at + call.count)
        }
        CollKind::Reduce if call.root == Some(rank) => Some(0..call.recv_len),
        _ => None,
    }
}

/// Avg's division as a device program carries it (`encode::Finish`), for
/// `rank` of `n` ranks running `call` under `plan` with its buffers laid
/// out as `layout` says: `Some` on the ranks that hold an Avg result
/// (`result_range`), its offset relative to the program's output, else
/// `None`. `Err` says why a program cannot carry it: the result lies in
/// the caller's buffer while the schedule runs on a temporary output
/// (`plan.scratch_output`), or it starts before the output.
// Used by tests only until the device launcher (`comm::device_exec`)
// switches to it.
pub(crate) fn avg_finish(
    call: &CollCall,
    plan: &Plan,
    rank: usize,
    n: usize,
    layout: Layout,
) -> std::result::Result<Option<Finish>, String> {
    let range = match (call.op, result_range(call, plan, rank)) {
        (Some(ReduceOp::Avg), Some(range)) => range,
        _ => return Ok(None),
    };
    if plan.scratch_output > 0 {
        return Err(
            "a result in the caller's buffer while the schedule runs on a temporary one".into(),
        );
    }
    let base = match layout {
        Layout::Shared { output_base, .. } => output_base,
        Layout::Separate => 0,
    };
    let offset = range
        .start
        .checked_sub(base)
        .ok_or_else(|| format!("result {range:?} before the output's start {base}"))?;
    Ok(Some(Finish {
        offset,
        len: range.len(),
        divisor: n,
    }))
}

/// What follows a reducing call on the ranks that hold a result: Avg
/// travels as Sum and is divided once, here, by the rank count.
pub(crate) fn finish<T: Element>(
    call: &CollCall,
    plan: &Plan,
    rank: usize,
    size: usize,
    out: &mut [T],
) {
    if call.op != Some(ReduceOp::Avg) {
        return;
    }
    if let Some(range) = result_range(call, plan, rank) {
        if let Some(result) = out.get_mut(range) {
            T::divide(result, size);
        }
    }
}

/// A checked call: its schedule and where its buffers start.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) schedule: Schedule,
    /// In place: where the input starts in the one buffer.
    pub(crate) input_base: usize,
    /// In place: where the output starts in the one buffer.
    pub(crate) output_base: usize,
    /// The schedule reads its input after it has written its output there
    /// (direct allreduce): in place, the caller runs it out of place from a
    /// copy of the buffer.
    pub(crate) copies_input: bool,
    /// Elements of a temporary output the caller runs the schedule on,
    /// because the schedule keeps partial results where the caller gave no
    /// output or wants its buffer unchanged (a non-root rank of a tree
    /// reduce); 0 for none.
    pub(crate) scratch_output: usize,
}

impl Plan {
    fn new(schedule: Schedule) -> Self {
        Plan {
            schedule,
            input_base: 0,
            output_base: 0,
            copies_input: false,
            scratch_output: 0,
        }
    }

    fn copying_input(mut self) -> Self {
        self.copies_input = true;
        self
    }
}

pub(crate) fn check_len(what: &str, got: usize, want: usize, rule: &str) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} has {got} elements but must have {want} ({rule})"
        )))
    }
}

pub(crate) fn check_rank(what: &str, rank: usize, size: usize) -> Result<()> {
    if rank < size {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{what} {rank} is out of range for a communicator of {size} ranks (0..{size})"
        )))
    }
}
