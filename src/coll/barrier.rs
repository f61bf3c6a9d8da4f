//! Barrier: no rank leaves before every rank has arrived.

use super::{Geometry, Plan};
use crate::algo::ring;

pub(crate) fn barrier(g: Geometry) -> Plan {
    Plan::new(ring::barrier(g.ring()))
}
