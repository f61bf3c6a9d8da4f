//! A user algorithm's allreduce (`algo::user`): the schedule of a checked
//! algorithm for this call's count and slices.

use super::{check_len, Geometry, Plan};
use crate::algo::user::Checked;
use crate::error::Result;

/// `send_len` and `recv_len` as for `all_reduce`. In place, an algorithm
/// the checker found wrong in place runs from a copy of the input.
pub(crate) fn all_reduce(
    g: Geometry,
    send_len: usize,
    recv_len: usize,
    user: &Checked,
) -> Result<Plan> {
    check_len(
        "all_reduce recv buffer",
        recv_len,
        send_len,
        "recv.len() == send.len()",
    )?;
    let plan = Plan::new(user.schedule(g.rank, send_len, g.slice));
    Ok(if user.verdict().in_place {
        plan
    } else {
        plan.copying_input()
    })
}
