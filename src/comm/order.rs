//! Call ordering: every call gets a ticket (its place in the
//! communicator's order) and a sequence number under one lock, and runs
//! when its ticket comes up, whether blocking on the caller's thread or
//! async on the progress thread; so calls run in issue order on every rank.

use super::{lock, CallSpec, Communicator, Inner, Work};
use crate::bias::{self, BiasedLock};
use crate::coll::Plan;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::{Call, Io};
use crate::fingerprint::{INTERNAL, NO_ROOT};
use ferroccl_transport::Fingerprint;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

pub(super) type Job = Box<dyn FnOnce() + Send>;
/// Builds an async call's job once its ticket and call are known.
type MakeJob<'a> = Box<dyn FnOnce(u64, &Call) -> Job + 'a>;
pub(super) struct Turns {
    /// Next ticket to hand out (under this lock, so that tickets and the
    /// progress queue agree on order). Biased towards the thread that
    /// issues (`bias::BiasedLock`): a communicator called from one thread
    /// takes it without a locked instruction. Where it may be biased,
    /// turns end by a plain store too ([`Inner::end_turn`]): both need the
    /// asymmetric fences, and a caller that sleeps on its turn then fences
    /// for the ender as well.
    pub(super) issued: BiasedLock<IssueState>,
    /// Tickets served so far: the caller whose ticket is next goes without
    /// taking a lock (a blocking call on an idle communicator always is).
    pub(super) served: AtomicU64,
    /// Callers asleep on `turn` (so that ending a turn nobody waits for
    /// takes no lock and makes no wake-up system call).
    pub(super) waiting: AtomicUsize,
    /// What `turn` sleeps on; it guards no data.
    pub(super) sleep: Mutex<()>,
    pub(super) turn: Condvar,
}
#[derive(Default)]
pub(super) struct IssueState {
    pub(super) next_ticket: u64,
    /// The user's collective calls so far (their fingerprints' numbers).
    pub(super) user_seq: u64,
    /// The library's own collective calls so far (numbered apart, with
    /// `fingerprint::INTERNAL` set).
    pub(super) internal_seq: u64,
    /// Every collective call so far, both kinds: the last call's position.
    pub(super) order: u64,
    /// Per (peer, sending) sequence numbers of point-to-point calls.
    pub(super) p2p_seq: HashMap<(usize, bool), u64>,
    /// The last [`RECENT_CALLS`] collective calls issued, as (position,
    /// fingerprint), the call at position p at `p % RECENT_CALLS` (position
    /// 0, which no collective call has, where none was yet): what this rank
    /// called at the position that another rank reports a mismatch on.
    pub(super) recent: [(u64, Fingerprint); RECENT_CALLS],
}
/// How many issued collective calls [`IssueState::recent`] keeps (and
/// each of the other per-call memories of a communicator).
pub(super) const RECENT_CALLS: usize = 16;

/// Append `item` to one of a communicator's memories of recent calls,
/// forgetting the oldest beyond [`RECENT_CALLS`].
pub(super) fn keep_recent<T>(q: &mut std::collections::VecDeque<T>, item: T) {
    if q.len() == RECENT_CALLS {
        q.pop_front();
    }
    q.push_back(item);
}
impl Inner {
    /// Hand out the next ticket and sequence number; for async calls, queue
    /// the job under the same lock so queue order is ticket order.
    ///
    /// Inlined, with [`wait_turn`](Inner::wait_turn) and
    /// [`end_turn`](Inner::end_turn)'s quick paths: a blocking call's copy
    /// (no job) builds its call in the caller's frame instead of returning
    /// it through memory, about 50 of an 8-byte broadcast's instructions a
    /// rank; 2 ranks in turns, 8-512 B, 1.02-1.11x on every collective
    /// (docs/data/2026-12-02/inline-issue/).
    #[inline(always)]
    pub(super) fn issue(
        &self,
        spec: &CallSpec,
        enqueue: Option<MakeJob<'_>>,
    ) -> Result<(u64, Call)> {
        let mut state = self.turns.issued.lock();
        let (next_seq, order) = match spec.p2p {
            Some(key) => (state.p2p_seq.get(&key).copied().unwrap_or(0) + 1, 0),
            None if spec.internal => ((state.internal_seq + 1) | INTERNAL, state.order + 1),
            None => (state.user_seq + 1, state.order + 1),
        };
        let fp = Fingerprint {
            seq: next_seq,
            coll: spec.kind.code(),
            dtype: spec.dtype.code(),
            op: spec.op.map_or(0, ReduceOp::code),
            count: spec.count as u64,
            root: spec.root.map_or(NO_ROOT, |r| r as u32),
        };
        let call = Call {
            kind: spec.kind,
            fingerprint: fp,
            order,
            op: spec.op.unwrap_or(ReduceOp::Sum),
            timeout: self.config.timeout,
            nt_store_bytes: self.config.nt_store_bytes,
            place_below: self.config.buffsize,
        };
        if self.has_failed() {
            // Name the call being refused, not the one that failed. Not
            // under `state`: restating a mismatch another rank reported
            // looks up this rank's call at that position in `recent`,
            // under the same lock (holding it here deadlocked the call).
            // A failure, once stored, is never cleared, so there is one.
            drop(state);
            return Err(self
                .relabelled_failure(&call)
                .unwrap_or_else(|| Error::Aborted(Some("the communicator has failed".into()))));
        }
        match spec.p2p {
            Some(key) => {
                state.p2p_seq.insert(key, next_seq);
            }
            None => {
                if spec.internal {
                    state.internal_seq += 1;
                } else {
                    state.user_seq = next_seq;
                }
                state.order = order;
                state.recent[order as usize % RECENT_CALLS] = (order, fp);
                if spec.refused {
                    // Before `issued` shows the position: the watcher,
                    // which reads them the other way round, never takes
                    // another rank's refusal of this call for news.
                    keep_recent(&mut lock(&self.refused_here), order);
                }
                // Release: a reader that sees the position sees the
                // refusal noted before it. No fence: the watcher reads it
                // under this lock after raising its mismatch flag
                // (`failure::issued_so_far`).
                self.issued.store(order, Ordering::Release);
            }
        }
        let ticket = state.next_ticket;
        if let Some(make_job) = enqueue {
            let job = make_job(ticket, &call);
            let sender = lock(&self.progress);
            let sender = sender
                .as_ref()
                .ok_or_else(|| Error::Aborted(Some("communicator is shutting down".into())))?;
            sender
                .send(job)
                .map_err(|_| Error::Aborted(Some("the progress thread is gone".into())))?;
        }
        state.next_ticket += 1;
        tracing::trace!(
            rank = self.rank,
            "issued {} as ticket {ticket}",
            call.during()
        );
        Ok((ticket, call))
    }
    #[inline(always)]
    pub(super) fn wait_turn(&self, ticket: u64) {
        if self.turns.served.load(Ordering::Acquire) != ticket {
            self.sleep_until_turn(ticket);
        }
    }
    /// [`wait_turn`](Inner::wait_turn) for a ticket that is not next yet.
    #[cold]
    #[inline(never)]
    fn sleep_until_turn(&self, ticket: u64) {
        let turns = &self.turns;
        let mut guard = lock(&turns.sleep);
        // SeqCst with `end_turn`: either it sees this waiter, or this
        // waiter sees its ticket count (no lost wake-up). Where turns end
        // by a plain store, the ender's side of that handshake is a
        // compiler fence, and this side fences for both.
        turns.waiting.fetch_add(1, Ordering::SeqCst);
        if turns.issued.biasable() {
            bias::heavy_fence();
        }
        while turns.served.load(Ordering::SeqCst) != ticket {
            guard = turns.turn.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
        turns.waiting.fetch_sub(1, Ordering::SeqCst);
    }
    #[inline(always)]
    pub(super) fn end_turn(&self) {
        let turns = &self.turns;
        if turns.issued.biasable() {
            // Only the caller holding the turn moves `served`: a plain
            // store, no locked add behind the call's last stores. The
            // load of `waiting` after it is ordered by the sleeper's heavy
            // fence (`sleep_until_turn`).
            let next = turns.served.load(Ordering::Relaxed) + 1;
            turns.served.store(next, Ordering::Release);
            bias::light_fence();
        } else {
            turns.served.fetch_add(1, Ordering::SeqCst);
        }
        if turns.waiting.load(Ordering::SeqCst) > 0 {
            self.wake_waiters();
        }
    }
    /// Wake the callers asleep on their turn ([`end_turn`](Inner::end_turn)).
    #[cold]
    #[inline(never)]
    fn wake_waiters(&self) {
        let turns = &self.turns;
        // A waiter that counted itself holds `sleep` until it sleeps:
        // taking it here means the notification cannot fall between its
        // check of `served` and its sleep.
        drop(lock(&turns.sleep));
        turns.turn.notify_all();
    }
}

impl Communicator {
    /// A blocking call: issue it, wait for its turn, run it.
    ///
    /// Inlined, with `Inner::execute`, `Inner::execute_checked` and the
    /// word branch of `exec::run_checked_in` (`exec::inline::run_words`),
    /// into each public collective: one function from a small call to the
    /// page protocol, about 130 fewer instructions of an 8-byte call's
    /// 1,150 (1.05-1.09x on 2-rank allreduces and allgathers, 1.14-1.18x
    /// on broadcasts and reduces: docs/performance-log.md, "Small calls
    /// without a locked instruction"). The paths off that line (slots,
    /// device memory, check-ins, the inline area) stay out of line.
    #[inline(always)]
    pub(super) fn run_blocking<T: Element>(
        &self,
        spec: CallSpec,
        plan: &Plan,
        io: Io<'_, T>,
    ) -> Result<()> {
        let (ticket, call) = self.inner.issue(&spec, None)?;
        self.inner.wait_turn(ticket);
        let result = self.inner.execute(plan, io, &call);
        self.inner.end_turn();
        result
    }
    pub(super) fn run_async<R: Send + 'static>(
        &self,
        spec: CallSpec,
        job: impl FnOnce(&Inner, &Call) -> Result<R> + Send + 'static,
    ) -> Result<Work<R>> {
        self.run_async_at(spec, || (), move |inner, call, ()| job(inner, call))
    }

    /// `run_async`, with `at_issue` run under the issue lock, in issue
    /// order, as the job is queued; what it returns goes to the job (and
    /// is dropped with it if the job never runs).
    pub(super) fn run_async_at<R: Send + 'static, S: Send + 'static>(
        &self,
        spec: CallSpec,
        at_issue: impl FnOnce() -> S,
        job: impl FnOnce(&Inner, &Call, S) -> Result<R> + Send + 'static,
    ) -> Result<Work<R>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let inner = self.inner.clone();
        let mut during = String::new();
        let queued = |ticket: u64, call: &Call| -> Job {
            during = call.during();
            let call = call.clone();
            let issued = at_issue();
            Box::new(move || {
                inner.wait_turn(ticket);
                let result = job(&inner, &call, issued);
                inner.end_turn();
                let _ = tx.send(result);
            })
        };
        self.inner.issue(&spec, Some(Box::new(queued)))?;
        Ok(Work { result: rx, during })
    }
}
