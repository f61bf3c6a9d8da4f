//! Allgather: rank r's buffer lands in block r of every rank's output.

use super::{check_len, Geometry, Plan};
use crate::algo::hier::{self, HostMap};
use crate::algo::ring;
use crate::error::{Error, Result};

/// The schedule of an allgather of `count` a rank: hierarchical over
/// `hosts` where given (and of this communicator's size), else the ring.
fn schedule(g: Geometry, count: usize, hosts: Option<&HostMap>) -> crate::algo::Schedule {
    match hosts {
        Some(h) if h.ranks() == g.size => hier::all_gather(h, g.rank, count, (g.slice, g.depth)),
        _ => ring::all_gather(g.ring(), count),
    }
}

/// Out of place: `recv_len == send_len * size`.
pub(crate) fn all_gather(
    g: Geometry,
    send_len: usize,
    recv_len: usize,
    hosts: Option<&HostMap>,
) -> Result<Plan> {
    check_len(
        "all_gather recv buffer",
        recv_len,
        send_len * g.size,
        "recv.len() == send.len() * size",
    )?;
    Ok(Plan::new(schedule(g, send_len, hosts)))
}

/// In place on a buffer of `count * size` whose block `rank` holds the input.
pub(crate) fn all_gather_in_place(
    g: Geometry,
    buf_len: usize,
    hosts: Option<&HostMap>,
) -> Result<Plan> {
    if !buf_len.is_multiple_of(g.size) {
        return Err(Error::InvalidArgument(format!(
            "all_gather_in_place buffer has {buf_len} elements, not a multiple of the {} ranks",
            g.size
        )));
    }
    let count = buf_len / g.size;
    let mut plan = Plan::new(schedule(g, count, hosts));
    plan.input_base = g.rank * count;
    Ok(plan)
}
