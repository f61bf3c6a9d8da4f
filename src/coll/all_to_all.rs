//! All-to-all: block j of rank r's input goes to block r of rank j's output.

use super::{check_len, Geometry, Plan};
use crate::algo::ring;
use crate::error::{Error, Result};

pub(crate) fn all_to_all(g: Geometry, send_len: usize, recv_len: usize) -> Result<Plan> {
    check_len(
        "all_to_all recv buffer",
        recv_len,
        send_len,
        "recv.len() == send.len()",
    )?;
    if !send_len.is_multiple_of(g.size) {
        return Err(Error::InvalidArgument(format!(
            "all_to_all buffers have {send_len} elements, not a multiple of the {} ranks",
            g.size
        )));
    }
    Ok(Plan::new(ring::all_to_all(g.ring(), send_len / g.size)))
}
