//! Reduce-scatter: rank r gets the reduction of block r of every rank's input.

use super::{check_len, Geometry, Plan};
use crate::algo::hier::{self, HostMap};
use crate::algo::{ring, Schedule};
use crate::error::{Error, Result};

/// The schedule of a reduce-scatter of `count` elements a rank:
/// hierarchical over `hosts` where given (and of this communicator's
/// size), else the ring.
fn schedule(g: Geometry, count: usize, hosts: Option<&HostMap>) -> Schedule {
    match hosts {
        Some(h) if h.ranks() == g.size => hier::reduce_scatter(h, g.rank, count, g.slice),
        _ => ring::reduce_scatter(g.ring(), count),
    }
}

/// Out of place: `send_len == recv_len * size`.
pub(crate) fn reduce_scatter(
    g: Geometry,
    send_len: usize,
    recv_len: usize,
    hosts: Option<&HostMap>,
) -> Result<Plan> {
    check_len(
        "reduce_scatter send buffer",
        send_len,
        recv_len * g.size,
        "send.len() == recv.len() * size",
    )?;
    Ok(Plan::new(schedule(g, recv_len, hosts)))
}

/// In place on a buffer of `count * size`: the result lands in block `rank`
/// (both schedules read block `rank` of the input only at the step that
/// writes its result there).
pub(crate) fn reduce_scatter_in_place(
    g: Geometry,
    buf_len: usize,
    hosts: Option<&HostMap>,
) -> Result<Plan> {
    if !buf_len.is_multiple_of(g.size) {
        return Err(Error::InvalidArgument(format!(
            "reduce_scatter_in_place buffer has {buf_len} elements, not a multiple of the {} ranks",
            g.size
        )));
    }
    let count = buf_len / g.size;
    let mut plan = Plan::new(schedule(g, count, hosts));
    plan.output_base = g.rank * count;
    Ok(plan)
}
