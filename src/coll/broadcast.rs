//! Broadcast: the root's buffer is copied to every rank (pipelined chain).

use super::{check_rank, Geometry, Plan};
use crate::algo::ring;
use crate::error::Result;

pub(crate) fn broadcast(g: Geometry, len: usize, root: usize) -> Result<Plan> {
    check_rank("broadcast root", root, g.size)?;
    Ok(Plan::new(ring::broadcast(g.ring(), len, root)))
}
