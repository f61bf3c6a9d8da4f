//! Allreduce: every rank gets the reduction of every rank's buffer.

use super::{check_len, Geometry, Plan};
use crate::algo::ring;
use crate::error::Result;

/// `send_len` and `recv_len` are equal for out of place; in place pass the
/// buffer length twice.
pub(crate) fn all_reduce(g: Geometry, send_len: usize, recv_len: usize) -> Result<Plan> {
    check_len(
        "all_reduce recv buffer",
        recv_len,
        send_len,
        "recv.len() == send.len()",
    )?;
    Ok(Plan::new(ring::all_reduce(g.ring(), send_len)))
}
