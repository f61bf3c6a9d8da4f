//! Reduce-scatter: rank r gets the reduction of block r of every rank's input.

use super::{check_len, Geometry, Plan};
use crate::algo::ring;
use crate::error::{Error, Result};

/// Out of place: `send_len == recv_len * size`.
pub(crate) fn reduce_scatter(g: Geometry, send_len: usize, recv_len: usize) -> Result<Plan> {
    check_len(
        "reduce_scatter send buffer",
        send_len,
        recv_len * g.size,
        "send.len() == recv.len() * size",
    )?;
    Ok(Plan::new(ring::reduce_scatter(g.ring(), recv_len)))
}

/// In place on a buffer of `count * size`: the result lands in block `rank`.
pub(crate) fn reduce_scatter_in_place(g: Geometry, buf_len: usize) -> Result<Plan> {
    if !buf_len.is_multiple_of(g.size) {
        return Err(Error::InvalidArgument(format!(
            "reduce_scatter_in_place buffer has {buf_len} elements, not a multiple of the {} ranks",
            g.size
        )));
    }
    let count = buf_len / g.size;
    let mut plan = Plan::new(ring::reduce_scatter(g.ring(), count));
    plan.output_base = g.rank * count;
    Ok(plan)
}
