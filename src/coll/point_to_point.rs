//! Send and receive between two ranks.

use super::{check_rank, Geometry, Plan};
use crate::algo::ring;
use crate::error::{Error, Result};

pub(crate) fn point_to_point(g: Geometry, len: usize, peer: usize, sending: bool) -> Result<Plan> {
    let what = if sending { "send peer" } else { "recv peer" };
    check_rank(what, peer, g.size)?;
    if peer == g.rank {
        return Err(Error::InvalidArgument(format!(
            "{what} {peer} is this rank itself; copy the buffer instead"
        )));
    }
    Ok(Plan::new(ring::point_to_point(
        g.ring(),
        len,
        peer,
        sending,
    )))
}
