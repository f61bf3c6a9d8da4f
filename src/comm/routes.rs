//! The facts a host call's route changes with after creation, and the
//! routes of recent calls found under them.
//!
//! A call's route (`plan::route`: inline, a check-in, the slots) is a
//! function of the call (its kind, its input's bytes, in place or not) and
//! of the communicator's facts (`Inner::facts`). Most facts are fixed at
//! creation; those that change after it live here: the ranges the control
//! pages' calibration measures for cross-memory attach, recursive
//! doubling's limit, whether some host's ranks share CPUs, and, told by
//! [`Routing::changed`], the control pages themselves and the first shared
//! window. Each change moves an epoch on, and the routes of recent calls
//! are kept with the epoch they were found in: a call that repeats one (a
//! training loop, a benchmark) takes its route from here instead of
//! building the facts and routing by them afresh (about 180 instructions
//! of a 2-rank allgather between windows: `Inner::facts` about 110, the
//! route's tests the rest; docs/performance-log.md, "Routes kept with the
//! facts' epoch").
//!
//! A route is read and kept by the call that holds the communicator's
//! turn (`Inner::execute`), one call at a time, so an entry's two words
//! are never read while another thread writes them; they are atomics only
//! so that the communicator is shared between threads without a lock.

use crate::coll::CollKind;
use crate::plan::Route;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// An inclusive range of sizes that calibration sets and every call
/// reads (its ends apart: a call routed between two stores of a
/// calibration is one of the calibration's own).
struct SizeRange(AtomicUsize, AtomicUsize);

impl SizeRange {
    fn new((from, upto): (usize, usize)) -> Self {
        SizeRange(AtomicUsize::new(from), AtomicUsize::new(upto))
    }
    fn get(&self) -> (usize, usize) {
        (
            self.0.load(Ordering::Relaxed),
            self.1.load(Ordering::Relaxed),
        )
    }
    fn set(&self, (from, upto): (usize, usize)) {
        self.0.store(from, Ordering::Relaxed);
        self.1.store(upto, Ordering::Relaxed);
    }
}

/// Which of the calibrated ranges of cross-memory attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Range {
    /// The blocks of an allgather of ordinary buffers pulled by
    /// cross-memory attach: from `plan::CMA_MIN_BYTES` up until the
    /// control pages' calibration (`Communicator::calibrate_cma`)
    /// measures them; `plan::NO_CMA`: never.
    Gather,
    /// The same for an all-to-all's blocks: the allgathers' range, or
    /// where the calibration times the all-to-all itself
    /// (`plan::cma_alltoall_probes`), its own.
    AllToAll,
    /// The broadcast sizes that pull the root's input by cross-memory
    /// attach: none (`plan::NO_CMA`) until the same calibration measures
    /// the pull winning.
    Broadcast,
    /// The 2-rank allreduces of ordinary buffers that run in halves by
    /// cross-memory attach where the ranks may write into each other
    /// (`Control::cma_push`): `plan::CMA_ALLREDUCE` until the same
    /// calibration measures where the halves win.
    AllReduce,
}

/// Routes kept: a loop repeats a few calls (a training step's buckets,
/// a benchmark's in-place and out-of-place calls).
const KEPT: usize = 8;

/// Calls of more bytes than this are not kept (their key would not fit
/// one word; a route is nothing beside such a call).
const KEPT_MAX_BYTES: usize = 1 << 50;

/// One kept route: the call's key and, beside it, the route with its
/// epoch (`Routing::kept`).
struct Kept {
    key: AtomicU64,
    route: AtomicU64,
}

/// The facts of a communicator's host routes that change after creation,
/// their epoch, and the routes of recent calls.
pub(super) struct Routing {
    gather: SizeRange,
    alltoall: SizeRange,
    broadcast: SizeRange,
    allreduce: SizeRange,
    /// Allreduces of up to this many bytes run recursive doubling where
    /// the model would run the ring, as the control pages' calibration
    /// measured (`Communicator::calibrate_doubling`); 0 before it, or
    /// without it.
    doubling: AtomicUsize,
    /// Some host has more ranks than CPUs (the tuner's tree then costs a
    /// reduce's children one after the other): agreed at the calibration,
    /// false without it.
    shared_cores: AtomicBool,
    /// Moved on by every change of a fact a route depends on: a route
    /// kept in an older epoch is not used.
    epoch: AtomicU64,
    kept: [Kept; KEPT],
}

impl Routing {
    /// The facts of a new communicator of `size` ranks: the ranges before
    /// any calibration, no recursive doubling, no CPUs shared.
    pub(super) fn new(size: usize) -> Self {
        Routing {
            gather: SizeRange::new(crate::plan::CMA_GATHER_DEFAULT),
            alltoall: SizeRange::new(crate::plan::CMA_GATHER_DEFAULT),
            broadcast: SizeRange::new(crate::plan::cma_broadcast_default(size)),
            allreduce: SizeRange::new(crate::plan::cma_allreduce_default(size, true)),
            doubling: AtomicUsize::new(0),
            shared_cores: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            kept: std::array::from_fn(|_| Kept {
                key: AtomicU64::new(0),
                route: AtomicU64::new(0),
            }),
        }
    }

    fn size_range(&self, which: Range) -> &SizeRange {
        match which {
            Range::Gather => &self.gather,
            Range::AllToAll => &self.alltoall,
            Range::Broadcast => &self.broadcast,
            Range::AllReduce => &self.allreduce,
        }
    }

    /// A calibrated range of cross-memory attach.
    pub(super) fn range(&self, which: Range) -> (usize, usize) {
        self.size_range(which).get()
    }

    /// Set a range of cross-memory attach (the calibration, forcing a
    /// route or keeping what it measured).
    pub(super) fn set_range(&self, which: Range, range: (usize, usize)) {
        self.size_range(which).set(range);
        self.changed();
    }

    /// Recursive doubling's limit (`Facts::doubling`).
    pub(super) fn doubling(&self) -> usize {
        self.doubling.load(Ordering::Relaxed)
    }

    /// Set recursive doubling's limit.
    pub(super) fn set_doubling(&self, upto: usize) {
        self.doubling.store(upto, Ordering::Relaxed);
        self.changed();
    }

    /// Whether some host's ranks share CPUs (`Facts::shared_cores`).
    pub(super) fn shared_cores(&self) -> bool {
        self.shared_cores.load(Ordering::Relaxed)
    }

    /// Set whether some host's ranks share CPUs.
    pub(super) fn set_shared_cores(&self, shared: bool) {
        self.shared_cores.store(shared, Ordering::Relaxed);
        self.changed();
    }

    /// A fact a route depends on changed (one of the above, or one kept
    /// elsewhere: the control pages made, the first window shared): no
    /// route kept before is used again.
    pub(super) fn changed(&self) {
        self.epoch.fetch_add(1, Ordering::Release);
    }

    /// The epoch to keep a route found now in: read before the facts.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The route kept for a `kind` call of `in_bytes` of input, in place
    /// or not, if it was found in the current epoch.
    #[inline(always)]
    pub(super) fn kept(&self, kind: CollKind, in_bytes: usize, in_place: bool) -> Option<Route> {
        let key = key(kind, in_bytes, in_place)?;
        let kept = &self.kept[slot(key)];
        if kept.key.load(Ordering::Relaxed) != key {
            return None;
        }
        let word = kept.route.load(Ordering::Relaxed);
        if word >> ROUTE_BITS != self.epoch.load(Ordering::Acquire) {
            return None;
        }
        decode(word & ROUTE_MASK)
    }

    /// Keep `route` for a `kind` call of `in_bytes`, in place or not,
    /// found under the facts of `epoch` (read before them: `epoch`).
    pub(super) fn keep(
        &self,
        (kind, in_bytes, in_place): (CollKind, usize, bool),
        route: Route,
        epoch: u64,
    ) {
        let Some(key) = key(kind, in_bytes, in_place) else {
            return;
        };
        let kept = &self.kept[slot(key)];
        kept.key.store(key, Ordering::Relaxed);
        kept.route
            .store(epoch << ROUTE_BITS | encode(route), Ordering::Relaxed);
    }
}

/// Bits of a kept route's word that hold the route; the epoch above.
const ROUTE_BITS: u32 = 3;
const ROUTE_MASK: u64 = (1 << ROUTE_BITS) - 1;

/// A call's key in one word, never 0 (the kind's code is at least 1);
/// `None` for calls too large to keep.
#[inline(always)]
fn key(kind: CollKind, in_bytes: usize, in_place: bool) -> Option<u64> {
    (in_bytes <= KEPT_MAX_BYTES)
        .then(|| (in_bytes as u64) << 12 | u64::from(in_place) << 8 | u64::from(kind.code()))
}

/// Where `key` is kept: a multiplicative hash of it.
#[inline(always)]
fn slot(key: u64) -> usize {
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - KEPT.trailing_zeros())) as usize
}

/// `route` in [`ROUTE_BITS`] bits.
fn encode(route: Route) -> u64 {
    match route {
        Route::Slots { note: false } => 0,
        Route::Slots { note: true } => 1,
        Route::Inline => 2,
        Route::CheckIn { cma, spread } => 4 | u64::from(cma) | u64::from(spread) << 1,
    }
}

/// The route [`encode`] made `code` of.
#[inline(always)]
fn decode(code: u64) -> Option<Route> {
    match code {
        0 => Some(Route::Slots { note: false }),
        1 => Some(Route::Slots { note: true }),
        2 => Some(Route::Inline),
        4..=7 => Some(Route::CheckIn {
            cma: code & 1 != 0,
            spread: code & 2 != 0,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_route() -> Vec<Route> {
        let mut routes = vec![
            Route::Slots { note: false },
            Route::Slots { note: true },
            Route::Inline,
        ];
        for cma in [false, true] {
            for spread in [false, true] {
                routes.push(Route::CheckIn { cma, spread });
            }
        }
        routes
    }

    /// Every route comes back as kept, for its call alone, until a fact
    /// changes; a route found before the change (its epoch read before)
    /// is not used after it.
    #[test]
    fn a_kept_route_is_found_for_its_call_until_a_fact_changes() {
        let routing = Routing::new(2);
        for (i, route) in every_route().into_iter().enumerate() {
            let call = (CollKind::AllGather, 8192 + i, i % 2 == 0);
            assert_eq!(routing.kept(call.0, call.1, call.2), None);
            routing.keep(call, route, routing.epoch());
            assert_eq!(routing.kept(call.0, call.1, call.2), Some(route));
            // Another kind, size or placement is another call.
            assert_eq!(routing.kept(CollKind::AllReduce, call.1, call.2), None);
            assert_eq!(routing.kept(call.0, call.1 + 1, call.2), None);
            assert_eq!(routing.kept(call.0, call.1, !call.2), None);
        }
        let call = (CollKind::Broadcast, 1 << 20, false);
        routing.keep(call, Route::Inline, routing.epoch());
        let before = routing.epoch();
        routing.set_range(Range::Broadcast, (0, usize::MAX));
        assert_eq!(routing.kept(call.0, call.1, call.2), None);
        assert_eq!(routing.range(Range::Broadcast), (0, usize::MAX));
        // Found under the old facts, kept after the change: not used.
        routing.keep(call, Route::Inline, before);
        assert_eq!(routing.kept(call.0, call.1, call.2), None);
        for change in [
            &|r: &Routing| r.set_doubling(4096) as (),
            &|r: &Routing| r.set_shared_cores(true),
            &|r: &Routing| r.changed(),
        ] as [&dyn Fn(&Routing); 3]
        {
            routing.keep(call, Route::Slots { note: true }, routing.epoch());
            assert!(routing.kept(call.0, call.1, call.2).is_some());
            change(&routing);
            assert_eq!(routing.kept(call.0, call.1, call.2), None);
        }
        assert_eq!(routing.doubling(), 4096);
        assert!(routing.shared_cores());
        // Too large to keep: never found.
        let huge = (CollKind::AllReduce, KEPT_MAX_BYTES + 1, false);
        routing.keep(huge, Route::Inline, routing.epoch());
        assert_eq!(routing.kept(huge.0, huge.1, huge.2), None);
    }

    /// The routes a communicator keeps: a repeated call's (8 KiB of
    /// allreduce on 2 ranks: inline without windows) until the first
    /// window is shared, then, as the facts say with a window, a check-in
    /// (the path between windows); every rank alike.
    #[test]
    fn a_communicator_routes_a_repeated_call_again_after_its_first_window() {
        let bytes = 8192;
        let kept =
            |comm: &crate::Communicator| comm.inner.routing.kept(CollKind::AllReduce, bytes, false);
        let results = crate::testing::run_ranks(2, |comm| {
            let input = vec![1f32; bytes / 4];
            let mut out = vec![0f32; bytes / 4];
            let mut seen = Vec::new();
            for _ in 0..2 {
                comm.all_reduce(&input, &mut out, crate::ReduceOp::Sum)
                    .unwrap();
                seen.push(kept(&comm));
            }
            let mut w = comm.alloc_window::<f32>(bytes / 2).unwrap();
            seen.push(kept(&comm));
            let (a, b) = w.split_at_mut(bytes / 4);
            a.fill(1.0);
            comm.all_reduce(a, b, crate::ReduceOp::Sum).unwrap();
            assert!(b.iter().all(|&v| v == 2.0), "the sum between windows");
            seen.push(kept(&comm));
            seen
        });
        for seen in results {
            assert_eq!(
                seen,
                [
                    Some(Route::Inline),
                    Some(Route::Inline),
                    None,
                    Some(Route::CheckIn {
                        cma: false,
                        spread: false
                    })
                ]
            );
        }
    }

    /// The words of every route decode to it.
    #[test]
    fn every_route_is_encoded_one_to_one() {
        for route in every_route() {
            assert_eq!(decode(encode(route)), Some(route));
        }
        assert_eq!(decode(3), None);
    }
}
