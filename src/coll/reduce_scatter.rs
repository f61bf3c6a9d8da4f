//! Reduce-scatter: rank r gets the reduction of block r of every rank's input.

use super::{check_len, Geometry, Plan};
use crate::algo::hier::{self, HostMap};
use crate::algo::{ring, Schedule};
use crate::error::{Error, Result};

/// The schedule of a reduce-scatter of `count` elements a rank:
/// hierarchical over `hosts` where given (and of this communicator's
/// size), else the ring.
fn schedule(g: Geometry, count: usize, hosts: Option<&HostMap>) -> Schedule {
    match hosts {
        Some(h) if h.ranks() == g.size => {
            hier::reduce_scatter(h, g.rank, count, (g.slice, g.depth))
        }
        _ => ring::reduce_scatter(g.ring(), count),
    }
}

/// Out of place: `send_len == recv_len * size`.
pub(crate) fn reduce_scatter(
    g: Geometry,
    send_len: usize,
    recv_len: usize,
    hosts: Option<&HostMap>,
) -> Result<Plan> {
    check_len(
        "reduce_scatter send buffer",
        send_len,
        recv_len * g.size,
        "send.len() == recv.len() * size",
    )?;
    Ok(Plan::new(schedule(g, recv_len, hosts)))
}

/// In place on a buffer of `count * size`: the result lands in block `rank`
/// (both schedules read block `rank` of the input only at the step that
/// writes its result there).
pub(crate) fn reduce_scatter_in_place(
    g: Geometry,
    buf_len: usize,
    hosts: Option<&HostMap>,
) -> Result<Plan> {
    if !buf_len.is_multiple_of(g.size) {
        return Err(Error::InvalidArgument(format!(
            "reduce_scatter_in_place buffer has {buf_len} elements, not a multiple of the {} ranks",
            g.size
        )));
    }
    let count = buf_len / g.size;
    let mut plan = Plan::new(schedule(g, count, hosts));
    plan.output_base = g.rank * count;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::super::{plan_on, CollCall, CollKind};
    use super::*;
    use crate::algo::Algorithm;

    /// The planner passes the host map to every call: a reduce-scatter
    /// runs the hierarchical schedule only when the algorithm is the
    /// hierarchical one and the map covers the communicator, else exactly
    /// the ring's schedule (one host, or the ring chosen), out of place
    /// and in place.
    #[test]
    fn the_ring_unless_hierarchical_over_this_communicators_hosts() {
        let two = HostMap::from_sizes(&[2, 2]);
        let one = HostMap::single(4);
        let count = 37;
        for rank in 0..4 {
            let g = Geometry {
                rank,
                size: 4,
                slice: 8,
                depth: 2,
            };
            let ring = ring::reduce_scatter(g.ring(), count);
            let hier = hier::reduce_scatter(&two, rank, count, (8, 2));
            assert_ne!(ring, hier);
            let out = CollCall::new(CollKind::ReduceScatter, count, 4 * count, count);
            let inp = CollCall {
                in_place: true,
                ..CollCall::new(CollKind::ReduceScatter, count, 4 * count, 4 * count)
            };
            for call in [out, inp] {
                let plan = |algo, hosts| plan_on(&call, g, algo, hosts).unwrap();
                assert_eq!(plan(Algorithm::Ring, Some(&two)).schedule, ring);
                assert_eq!(plan(Algorithm::Ring, None).schedule, ring);
                assert_eq!(plan(Algorithm::Hierarchical, Some(&two)).schedule, hier);
                // A map of another size (a split communicator's parent).
                let other = HostMap::from_sizes(&[2, 3]);
                assert_eq!(plan(Algorithm::Hierarchical, Some(&other)).schedule, ring);
                // One host: the hierarchical builder is the ring itself.
                let single = plan(Algorithm::Hierarchical, Some(&one));
                assert_eq!(
                    single.output_base,
                    if call.in_place { rank * count } else { 0 }
                );
                assert_eq!(
                    single.schedule.steps.len(),
                    ring.steps.len(),
                    "one host: as many steps as the ring"
                );
            }
        }
    }
}
