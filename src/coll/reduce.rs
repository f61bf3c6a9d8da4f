//! Reduce: the root gets the reduction of every rank's buffer (pipelined
//! chain ending at the root, or a binary tree rooted at the root).

use super::{check_len, check_rank, Geometry, Plan};
use crate::algo::{ring, tree, Algorithm};
use crate::error::Result;

/// `recv_len` matters on the root only (it must equal `send_len` there);
/// other ranks may pass an empty receive buffer. `Tree` runs on a tree;
/// every other algorithm on the ring's chain.
pub(crate) fn reduce(
    g: Geometry,
    send_len: usize,
    recv_len: usize,
    root: usize,
    algorithm: Algorithm,
) -> Result<Plan> {
    check_rank("reduce root", root, g.size)?;
    if g.rank == root {
        check_len(
            "reduce recv buffer on the root",
            recv_len,
            send_len,
            "recv.len() == send.len() on the root",
        )?;
    }
    let schedule = match algorithm {
        Algorithm::Tree => tree::reduce(g.ring(), send_len, root),
        Algorithm::Ring
        | Algorithm::OneShot
        | Algorithm::TwoShot
        | Algorithm::RecursiveDoubling
        | Algorithm::Hierarchical => ring::reduce(g.ring(), send_len, root),
    };
    // A tree rank with two children keeps a partial result in its output,
    // which a non-root caller need not give (and in place must not see
    // changed): it gets a temporary one.
    let keeps_partials = schedule.steps.iter().any(|s| s.prim.writes_output());
    let mut plan = Plan::new(schedule);
    if g.rank != root && keeps_partials {
        plan.scratch_output = send_len;
    }
    Ok(plan)
}
