//! Broadcast: the root's buffer is copied to every rank (pipelined chain,
//! or a binary tree rooted at the root).

use super::{check_rank, Geometry, Plan};
use crate::algo::{ring, tree, Algorithm};
use crate::error::Result;

/// `Tree` runs on a tree; every other algorithm on the ring's chain.
pub(crate) fn broadcast(
    g: Geometry,
    len: usize,
    root: usize,
    algorithm: Algorithm,
) -> Result<Plan> {
    check_rank("broadcast root", root, g.size)?;
    Ok(Plan::new(match algorithm {
        Algorithm::Tree => tree::broadcast(g.ring(), len, root),
        Algorithm::Ring
        | Algorithm::OneShot
        | Algorithm::TwoShot
        | Algorithm::RecursiveDoubling
        | Algorithm::Hierarchical => ring::broadcast(g.ring(), len, root),
    }))
}
