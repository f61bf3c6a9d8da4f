//! A user algorithm's calls (`algo::user`): the schedule of a checked
//! algorithm for this call's count and slices, allreduce, allgather or
//! reduce-scatter.

use super::{check_len, CollCall, CollKind, Geometry, Plan};
use crate::algo::user::{Checked, Collective};
use crate::error::{Error, Result};

/// The user collective that runs calls of `kind`, if any.
pub(crate) fn collective_of(kind: CollKind) -> Option<Collective> {
    match kind {
        CollKind::AllReduce => Some(Collective::AllReduce),
        CollKind::AllGather => Some(Collective::AllGather),
        CollKind::ReduceScatter => Some(Collective::ReduceScatter),
        _ => None,
    }
}

/// The plan of `call` (of `user`'s collective) by `user`, with the
/// buffers checked as the library's own algorithms check them. In place,
/// an allgather's or reduce-scatter's schedule is the out-of-place one
/// with its input (allgather) or output (reduce-scatter) at block `rank`
/// of the one buffer, as the ring's; an allreduce the checker found wrong
/// in place runs from a copy of the input, and an in-place allgather or
/// reduce-scatter it found wrong in place is refused (call the
/// out-of-place form).
pub(crate) fn plan(call: &CollCall, g: Geometry, user: &Checked) -> Result<Plan> {
    let (send_len, recv_len) = (call.send_len, call.recv_len);
    let collective = user.collective();
    let count = match (collective, call.in_place) {
        (Collective::AllReduce, _) => {
            check_len(
                "all_reduce recv buffer",
                recv_len,
                send_len,
                "recv.len() == send.len()",
            )?;
            send_len
        }
        (Collective::AllGather, false) => {
            check_len(
                "all_gather recv buffer",
                recv_len,
                send_len * g.size,
                "recv.len() == send.len() * size",
            )?;
            send_len
        }
        (Collective::ReduceScatter, false) => {
            check_len(
                "reduce_scatter send buffer",
                send_len,
                recv_len * g.size,
                "send.len() == recv.len() * size",
            )?;
            recv_len
        }
        (c, true) => {
            let what = if c == Collective::AllGather {
                "all_gather_in_place"
            } else {
                "reduce_scatter_in_place"
            };
            if !send_len.is_multiple_of(g.size) {
                return Err(Error::InvalidArgument(format!(
                    "{what} buffer has {send_len} elements, not a multiple of the {} ranks",
                    g.size
                )));
            }
            if !user.verdict().in_place {
                return Err(Error::InvalidArgument(format!(
                    "{what}: the user algorithm '{}' ({}) gives wrong results in place (the \
                     checker found so at creation); call the out-of-place form",
                    user.name(),
                    user.source()
                )));
            }
            send_len / g.size
        }
    };
    let mut plan = Plan::new(user.schedule(g.rank, count, g.slice));
    match (collective, call.in_place) {
        (Collective::AllReduce, true) if !user.verdict().in_place => {
            plan = plan.copying_input();
        }
        (Collective::AllGather, true) => plan.input_base = g.rank * count,
        (Collective::ReduceScatter, true) => plan.output_base = g.rank * count,
        _ => {}
    }
    Ok(plan)
}
