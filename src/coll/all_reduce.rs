//! Allreduce: every rank gets the reduction of every rank's buffer.

use super::{check_len, Geometry, Plan};
use crate::algo::hier::HostMap;
use crate::algo::{direct, hier, ring, tree, Algorithm};
use crate::error::Result;

/// `send_len` and `recv_len` are equal for out of place; in place pass the
/// buffer length twice. Every [`Algorithm`] applies; the hierarchical one
/// over `hosts` (`None`: all ranks on one host, the schedule then runs
/// inside it alone).
pub(crate) fn all_reduce(
    g: Geometry,
    send_len: usize,
    recv_len: usize,
    algorithm: Algorithm,
    hosts: Option<&HostMap>,
) -> Result<Plan> {
    check_len(
        "all_reduce recv buffer",
        recv_len,
        send_len,
        "recv.len() == send.len()",
    )?;
    let p = g.ring();
    Ok(match algorithm {
        Algorithm::Ring => Plan::new(ring::all_reduce(p, send_len)),
        Algorithm::Tree => Plan::new(tree::all_reduce(p, send_len)),
        // The direct schedules add this rank's input at its place in rank
        // order, after the output holds a partial result.
        Algorithm::OneShot => Plan::new(direct::one_shot(p, send_len)).copying_input(),
        Algorithm::TwoShot => Plan::new(direct::two_shot(p, send_len)).copying_input(),
        // Its first round sends the input while it writes the output.
        Algorithm::RecursiveDoubling => {
            Plan::new(direct::recursive_doubling(p, send_len)).copying_input()
        }
        Algorithm::Hierarchical => {
            let one;
            let hosts = match hosts {
                Some(h) if h.ranks() == g.size => h,
                _ => {
                    one = HostMap::single(g.size);
                    &one
                }
            };
            Plan::new(hier::all_reduce(
                hosts,
                g.rank,
                send_len,
                (g.slice, g.depth),
            ))
        }
    })
}
