//! Reduce: the root gets the reduction of every rank's buffer (pipelined
//! chain ending at the root).

use super::{check_len, check_rank, Geometry, Plan};
use crate::algo::ring;
use crate::error::Result;

/// `recv_len` matters on the root only (it must equal `send_len` there);
/// other ranks may pass an empty receive buffer.
pub(crate) fn reduce(g: Geometry, send_len: usize, recv_len: usize, root: usize) -> Result<Plan> {
    check_rank("reduce root", root, g.size)?;
    if g.rank == root {
        check_len(
            "reduce recv buffer on the root",
            recv_len,
            send_len,
            "recv.len() == send.len() on the root",
        )?;
    }
    Ok(Plan::new(ring::reduce(g.ring(), send_len, root)))
}
