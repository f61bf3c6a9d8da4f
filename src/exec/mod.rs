//! Carries out the planner's decisions (`crate::plan`): it runs a call's
//! schedule over the connections, or the check-in and the paths without
//! slots; it decides nothing about which path a call takes.
//!
//! - `io`: a call's buffers and where they live (host slices; device
//!   addresses, with what the staged executor and the device executor's
//!   launcher need).
//! - `interp`: the host interpreter of a schedule's primitives over the
//!   transports' host data path.
//! - `verify`: the one comparison of a peer's view of the call with this
//!   rank's, used by frames and check-ins alike.
//! - `links`: the connections of a communicator, by channel and peer.
//! - `checkin`: the control-page protocol (announce, compare, finish) that
//!   the paths below start with; `checked_in`: a call's route carried out
//!   over it (the one place that picks among them); `inline`: small calls
//!   carried in it;
//!   `direct`: collectives directly between windows; `pull`: allgathers,
//!   all-to-alls and broadcasts out of the peers' processes (cross-memory
//!   attach); `spread`: large broadcasts on 3 or more ranks through the
//!   root's staging area, which every receiver reads.
//! - `staged`: a schedule on device buffers over the host transports,
//!   through pinned bounce buffers (ferroccl-cuda's `Stager`): the path of
//!   every device call that the device executor does not take
//!   (`comm::device_exec` launches that one; `Inner::execute_on_device`
//!   takes the path `plan::device` decides).
//! - `oracle` (tests only): the test oracle of the device executor, not an
//!   executor. It runs encoded device programs (`algo::encode`) on the host
//!   and proves them against `interp`; its `oracle/` files run the
//!   executor's kernel source built for the host, or on a GPU, against the
//!   same results.

mod checked_in;
mod checkin;
mod direct;
mod inline;
mod interp;
mod io;
mod links;
#[cfg(test)]
pub(crate) mod oracle;
mod pull;
mod spread;
mod staged;
mod verify;

pub(crate) use checked_in::run as run_checked_in;
pub(crate) use checkin::{
    confirm, confirm_left, leave, settle, unsettled, Ctx, CHECKIN_SLOTS, CONTROL_MAGIC, W_MAGIC,
    W_PID, W_PROBE,
};
pub(crate) use interp::run;
pub(crate) use io::{AvgFinish, DeviceBuffers, DeviceIo, ExecIo};
pub(crate) use io::{HostIo, Io};
pub(crate) use links::{key_scope, Connector, Links, MemberWatch, WAIT_SLICE};
pub(crate) use spread::{SPREAD_AT, SPREAD_BYTES};
pub(crate) use staged::DEPTH as STAGE_DEPTH;
pub(crate) use staged::{device_error as staged_error, run as run_staged, Resources};

use crate::coll::CollKind;
use crate::element::ReduceOp;
use crate::fingerprint;
use ferroccl_transport::Fingerprint;
use std::time::Duration;

/// What the executor needs to know about the call it runs.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// Which collective.
    pub(crate) kind: CollKind,
    /// Carried by every frame and announcement, and checked on receipt.
    /// Its `seq` is the user's call number (the library's own calls are
    /// numbered apart, see `fingerprint::INTERNAL`).
    pub(crate) fingerprint: Fingerprint,
    /// The call's position among every collective call of the
    /// communicator, the library's own included, from 1 and never
    /// restarting (0 for point-to-point): what the control pages order
    /// check-ins and completions by, and what mismatch reports name.
    pub(crate) order: u64,
    /// Reduction operator (ignored by non-reducing primitives).
    pub(crate) op: ReduceOp,
    /// Bound of every single wait.
    pub(crate) timeout: Duration,
    /// Outputs of at least this many bytes are written with streaming
    /// stores (0: never); `Config::nt_store_bytes`, applied by the
    /// planner's store rules.
    pub(crate) nt_store_bytes: usize,
    /// Calls whose buffers are smaller than this many bytes (the ring of
    /// slots of a connection, `Config::buffsize`) let a transport that can
    /// place their frames along its slots do so
    /// (`SlotSender::send_sized_until`): on the AMD VM a 2-rank call of
    /// 32-256 KiB through shm ran 1.1-3.4x as fast. A larger call streams
    /// through every slot anyway, and a 2-rank piece that fills the ring
    /// goes in quarter slots to keep their footprint small on purpose
    /// (docs/performance-log.md, "Quarter slots for pieces that fill the
    /// ring", "Payloads spread over the slots").
    pub(crate) place_below: usize,
}

impl Call {
    /// "all_reduce #17 (float, sum, 1000 elements)", for errors; formatted
    /// only when one happens, so the fast path allocates nothing for it.
    pub(crate) fn during(&self) -> String {
        fingerprint::describe(&self.fingerprint)
    }
}
