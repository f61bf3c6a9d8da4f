//! Failure: what a failed call does to its communicator (the first failure
//! ends it, and every later call returns it, restated for that call), who
//! is blamed (a rank that never issued the call rather than a neighbour
//! that only waited), and how the news spreads: failure and mismatch
//! reports through the rendezvous to every rank, failure frames to the
//! connected peers, and a watcher thread that hears the reports.

use super::order::keep_recent;
use super::{lock, Inner};
use crate::bootstrap::{FailureReport, MismatchReport};
use crate::coll::CollKind;
use crate::error::{Error, Result};
use crate::exec::Call;
use ferroccl_transport::Fingerprint;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

/// How long the rank that hosts the rendezvous waits after it reported a
/// failure, or heard one about another rank, before it lets its own calls
/// end (see `Inner::fail_with`).
const HOST_LINGER: std::time::Duration = std::time::Duration::from_millis(100);
impl Inner {
    /// Whether the communicator has failed (its error is in `failure`).
    #[inline(always)]
    pub(super) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
    /// Record a call's error as the communicator's failure (or, if the call
    /// only saw the abort that an earlier failure caused, return that one).
    pub(super) fn on_error(&self, err: Error, call: &Call) -> Error {
        if matches!(err, Error::Aborted(None)) {
            if let Some(stored) = self.relabelled_failure(call) {
                return stored;
            }
        }
        if matches!(err, Error::Timeout { .. } | Error::PeerFailed { .. }) {
            // A rank that timed out waiting on its neighbour, or heard from
            // it that it failed, is often only downstream of the real
            // failure (a rank further away died, stopped or found a
            // mismatch); give the job's report, if one is coming, a moment
            // to arrive and name the cause.
            let grace = (self.config.timeout / 10).min(std::time::Duration::from_secs(1));
            let until = Instant::now() + grace;
            while Instant::now() < until
                && lock(&self.failure).is_none()
                && lock(&self.mismatch_heard).is_none()
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            if let Some(mismatch) = self.heard_mismatch(call, true) {
                return mismatch;
            }
            if let Some(stored) = self.relabelled_failure(call) {
                return stored;
            }
        }
        if let Error::Mismatch {
            peer,
            local,
            remote,
        } = &err
        {
            let report = self.global_ranks.get(*peer).map(|&peer| MismatchReport {
                comm_id: self.comm_id,
                seq: call.order,
                peer,
                local: local.clone(),
                remote: remote.clone(),
                refused: false,
            });
            self.fail_with(err.clone(), None, Broadcast::Mismatch(report));
            return self.relabelled_failure(call).unwrap_or(err);
        }
        let err = match err {
            Error::Timeout {
                peer, waited_ms, ..
            } => self.blame_for_timeout(call, peer, waited_ms).unwrap_or(err),
            other => other,
        };
        let blame = match &err {
            Error::PeerFailed { rank, .. } | Error::Timeout { peer: rank, .. } => Some(*rank),
            _ => None,
        };
        self.fail(err.clone(), blame, true);
        self.relabelled_failure(call).unwrap_or(err)
    }
    /// The error for `call` if another rank reported a mismatch that
    /// concerns it (a collective at or after the mismatched position, or,
    /// with `any_call`, any call: one that failed on the mismatch's
    /// fallout); the communicator fails with it.
    #[inline]
    pub(super) fn heard_mismatch(&self, call: &Call, any_call: bool) -> Option<Error> {
        if !self.mismatch_flag.load(Ordering::SeqCst) {
            return None;
        }
        self.heard_mismatch_now(call, any_call)
    }
    #[cold]
    pub(super) fn heard_mismatch_now(&self, call: &Call, any_call: bool) -> Option<Error> {
        let (reporter, peer, m) = lock(&self.mismatch_heard).clone()?;
        // Before the mismatched position (the library's own calls of
        // set-up included) a call is left to finish: its peers completed it.
        if !any_call && !is_p2p(&call.fingerprint) && call.order < m.seq {
            return None;
        }
        if m.refused && self.refused_too(m.seq) {
            return None;
        }
        let err = self.mismatch_seen_here(reporter, peer, &m, Some(call));
        self.fail_on_heard(err.clone(), reporter, &m);
        Some(self.relabelled_failure(call).unwrap_or(err))
    }
    /// Tell every rank that this rank refused `call` (`err`): a refusal
    /// heard from another rank for the same position is not news here.
    pub(super) fn refused_at(&self, call: &Call, err: &Error) {
        {
            let mut heard = lock(&self.mismatch_heard);
            if matches!(&*heard, Some((_, _, m)) if m.refused && m.seq == call.order) {
                // Not news: what was heard after it comes up now.
                *heard = None;
                let mut later = lock(&self.heard_later);
                while let Some(next) = later.pop_front() {
                    let m = &next.2;
                    if !(m.refused && (m.seq <= call.order || self.refused_too(m.seq))) {
                        *heard = Some(next);
                        break;
                    }
                }
                if heard.is_none() {
                    self.mismatch_flag.store(false, Ordering::SeqCst);
                }
            }
        }
        let Some(&me) = self.global_ranks.get(self.rank) else {
            return;
        };
        tracing::warn!(rank = self.rank, "refused {}: {err}", call.during());
        self.rendezvous.store.report(FailureReport {
            rank: me,
            reason: format!("it refused {}: {err}", call.during()),
            comm: None,
            mismatch: Some(MismatchReport {
                comm_id: self.comm_id,
                seq: call.order,
                peer: me,
                local: call.during(),
                remote: err.to_string(),
                refused: true,
            }),
        });
        // A rank that made this call already said so.
        let went = {
            let mut later = lock(&self.went_later);
            let went = later.iter().find(|(_, m)| m.seq == call.order).cloned();
            later.retain(|(_, m)| m.seq > call.order);
            went
        };
        if let Some((reporter, m)) = went {
            self.went_ahead(reporter, &m);
        }
    }

    /// Keep a mismatch or refusal report (reporter, peer, report) for the
    /// calls it concerns. While the one kept is a refusal of a call this
    /// rank has not reached, later reports wait behind it: this rank may
    /// refuse that call too, and then they come up in turn.
    fn hear(&self, report: (usize, usize, MismatchReport)) {
        let mut heard = lock(&self.mismatch_heard);
        if lock(&self.failure).is_some() {
            return;
        }
        if matches!(&*heard, Some((_, _, h)) if h.refused && self.refused_too(h.seq)) {
            *heard = None;
        }
        match &*heard {
            None => *heard = Some(report),
            Some((_, _, h)) if h.refused && report.2.seq != h.seq => {
                let mut later = lock(&self.heard_later);
                if !later.iter().any(|(_, _, m)| m.seq == report.2.seq) {
                    keep_recent(&mut later, report);
                }
            }
            Some(_) => {}
        }
    }

    /// Whether this rank refused its own call at position `order` too.
    pub(super) fn refused_too(&self, order: u64) -> bool {
        lock(&self.refused_here).contains(&order)
    }

    /// End this communicator on the error `err` heard from the job. After
    /// a refusal of the reporter's, this rank accepted the call: it tells
    /// the job so (a report for that position, which ranks that have not
    /// reached it keep until they do), so that the ranks which refused the
    /// call learn that it was not refused everywhere.
    pub(super) fn fail_on_heard(&self, err: Error, reporter: usize, m: &MismatchReport) {
        if !m.refused {
            self.fail(err, Some(reporter), false);
            return;
        }
        let during = match &err {
            Error::PeerFailed { during, .. } => during.clone(),
            _ => "its call".to_string(),
        };
        let report = MismatchReport {
            comm_id: self.comm_id,
            seq: m.seq,
            // The refuser, and what it refused.
            peer: m.peer,
            local: during,
            remote: format!("{}: {}", m.local, m.remote),
            refused: true,
        };
        self.fail_with(err, None, Broadcast::Went(report));
    }

    /// A report that rank `reporter` made its call at a position where
    /// rank `m.peer` (global) refused its own (see `fail_on_heard`): where
    /// this rank refused that call too, its communicator ends now; where it
    /// has not reached it, the report waits for `refused_at`.
    pub(super) fn heard_went(&self, reporter: usize, m: &MismatchReport) {
        let mut later = lock(&self.went_later);
        if self.refused_too(m.seq) {
            drop(later);
            self.went_ahead(reporter, m);
        } else if self.issued.load(Ordering::Acquire) < m.seq {
            keep_recent(&mut later, (reporter, m.clone()));
        }
        // Else this rank accepted the call too, and ends on the refusal.
    }

    /// End this communicator, which refused its call at `m.seq`, because
    /// rank `reporter` made that call.
    fn went_ahead(&self, reporter: usize, m: &MismatchReport) {
        let during = self
            .issued_at(m.seq)
            .unwrap_or_else(|| "a call this rank refused".to_string());
        let err = Error::PeerFailed {
            rank: reporter,
            during,
            reason: went_text(&m.local, self.rank_of(m.peer), &m.remote),
        };
        self.fail_with(err, Some(reporter), Broadcast::No);
    }

    /// The position of the last collective this rank issued, read under
    /// the issue lock (`Inner::issue` stores it there without a fence of
    /// its own: a locked instruction in every call). Taken from the
    /// watcher's thread, which revokes the calling thread's bias on it
    /// (`bias::BiasedLock`): its handshake orders this read after the
    /// mismatch flag's store as the mutex did.
    fn issued_so_far(&self) -> u64 {
        let _issuing = self.turns.issued.lock_elsewhere();
        self.issued.load(Ordering::Acquire)
    }

    /// The description of this rank's collective at position `order`, if
    /// it is among the recent ones it issued.
    fn issued_at(&self, order: u64) -> Option<String> {
        if order == 0 {
            // No collective call's position (its slot's "none yet").
            return None;
        }
        let state = self.turns.issued.lock_elsewhere();
        let (at, fp) = state.recent[order as usize % super::order::RECENT_CALLS];
        (at == order).then(|| crate::fingerprint::describe(&fp))
    }

    /// This communicator's rank of global rank `global` (itself where it
    /// is not a member, which does not happen for reports it keeps).
    fn rank_of(&self, global: usize) -> usize {
        self.global_ranks
            .iter()
            .position(|&g| g == global)
            .unwrap_or(self.rank)
    }

    /// After a collective timed out waiting on `waited_for`: ask every
    /// member how far it has come, and blame the lowest rank that has not
    /// issued this call at all (it is stuck in its own code, or stopped)
    /// rather than the neighbour, which may only be waiting too. `None`
    /// when every member has issued it (then the neighbour is blamed).
    pub(super) fn blame_for_timeout(
        &self,
        call: &Call,
        waited_for: usize,
        waited_ms: u64,
    ) -> Option<Error> {
        if is_p2p(&call.fingerprint) {
            return None; // one peer, and its own numbering
        }
        let seq = call.order;
        let others: Vec<usize> = (0..self.size).filter(|&r| r != self.rank).collect();
        let globals: Vec<usize> = others
            .iter()
            .filter_map(|&r| self.global_ranks.get(r).copied())
            .collect();
        let wait = (self.config.timeout / 4).min(std::time::Duration::from_secs(2));
        let answers =
            self.rendezvous
                .store
                .ask_progress(self.comm_id, &globals, Instant::now() + wait);
        let (laggard, at) = others
            .iter()
            .zip(answers)
            .find_map(|(&r, a)| a.filter(|&issued| issued < seq).map(|a| (r, a)))?;
        // Positions count the library's own calls too: say how far behind
        // the laggard is, not a number the user would look for.
        let behind = seq - at;
        let calls = if behind == 1 { "call" } else { "calls" };
        tracing::warn!(
            rank = self.rank,
            "{}: timed out waiting for rank {waited_for}; rank {laggard} has not issued the call \
             ({behind} collective {calls} behind)",
            call.during()
        );
        Some(Error::PeerFailed {
            rank: laggard,
            during: call.during(),
            reason: format!(
                "timed out after {waited_ms} ms: it has not called this {} ({behind} collective \
                 {calls} behind this rank); it is stuck or busy outside the library",
                CollKind::from_code(call.fingerprint.coll).map_or("collective", |k| k.name())
            ),
        })
    }
    /// The stored failure, restated for the call `call` (a mismatch that
    /// another rank reported is compared with this call).
    pub(super) fn relabelled_failure(&self, call: &Call) -> Option<Error> {
        let stored = lock(&self.failure).clone()?;
        Some(match stored {
            Error::PeerFailed { rank, reason, .. } => Error::PeerFailed {
                rank,
                during: call.during(),
                reason,
            },
            Error::Mismatch { .. } => match &*lock(&self.mismatch_heard) {
                Some((reporter, peer, m)) => {
                    self.mismatch_seen_here(*reporter, *peer, m, Some(call))
                }
                None => stored,
            },
            other => other,
        })
    }
    /// Mark the communicator failed (first failure wins), wake every waiter,
    /// tell the job which rank is to blame (unless the news came from the
    /// job already), and close connections with a failure frame.
    pub(super) fn fail(&self, err: Error, blame: Option<usize>, broadcast: bool) {
        let how = if broadcast {
            Broadcast::Failed
        } else {
            Broadcast::No
        };
        self.fail_with(err, blame, how);
    }
    pub(super) fn fail_with(&self, err: Error, blame: Option<usize>, broadcast: Broadcast) {
        // A rank blamed for a broken connection or a timeout is one a
        // shrink leaves out; one that called differently, or aborted this
        // communicator (to shrink it, say), is alive.
        if let Some(b) = blame.filter(|&b| b != self.rank) {
            let aborted = matches!(&err, Error::PeerFailed { reason, .. } if left_by_abort(reason));
            if !aborted
                && !matches!(err, Error::Mismatch { .. })
                && !matches!(broadcast, Broadcast::Went(_))
            {
                lock(&self.known_failed).insert(b);
            }
        }
        {
            let mut failure = lock(&self.failure);
            if failure.is_some() {
                return;
            }
            tracing::warn!(rank = self.rank, "communicator failed: {err}");
            *failure = Some(err.clone());
            self.failed.store(true, Ordering::Release);
        }
        // Without a peer to blame (abort(), a mismatch seen here) this rank
        // is the one leaving: say so, so that peers learn it at once instead
        // of at their timeout.
        let blamed = blame.unwrap_or(self.rank);
        let reason = match (&broadcast, &err) {
            (Broadcast::Went(m), _) => went_text(&m.local, self.rank_of(m.peer), &m.remote),
            (_, Error::PeerFailed { reason, .. }) => reason.clone(),
            (_, other) => other.to_string(),
        };
        // A mismatch, or a call that went ahead where another rank refused
        // it, ends the calls at that position and after; a peer may still
        // be finishing an earlier call that this rank completed, whose last
        // frames are on the way, and a failure told on the connections
        // overtakes them. The job tells it instead: at its next call, or at
        // once if it has reached that position.
        let preempt =
            !matches!(err, Error::Mismatch { .. }) && !matches!(broadcast, Broadcast::Went(_));
        let told_the_job = !matches!(broadcast, Broadcast::No);
        if let Some(&global) = self.global_ranks.get(blamed) {
            match broadcast {
                Broadcast::No => {}
                // Scoped to this communicator: the blamed rank's other
                // communicators go on (its process, if gone, is reported
                // by the rendezvous for all of them).
                Broadcast::Failed => {
                    self.rendezvous
                        .store
                        .report_failure_in(self.comm_id, global, &reason)
                }
                Broadcast::Went(m) => self.rendezvous.store.report(FailureReport {
                    rank: global,
                    reason: reason.clone(),
                    comm: None,
                    mismatch: Some(m),
                }),
                Broadcast::Mismatch(mismatch) => self.rendezvous.store.report(FailureReport {
                    rank: global,
                    reason: reason.clone(),
                    comm: mismatch.is_none().then_some(self.comm_id),
                    mismatch,
                }),
            }
            if (told_the_job || blamed != self.rank) && self.rendezvous._server.is_some() {
                // This process hosts the rendezvous and may exit on this
                // error at once: a socket closed with unread bytes (the
                // clients' heartbeats) is reset, and a reset peer drops what
                // it had not read yet, this report among it. The watch
                // threads read at once; give them a moment. The same where
                // the news came from the job: the report this process's
                // server is pushing to the others (a rank's lost
                // connection) may not have reached them yet; leaving at
                // once, this rank was blamed instead ("the rendezvous host
                // went away"; 3 in about 670 runs of
                // `processes::a_killed_rank_is_named_everywhere`).
                std::thread::sleep(HOST_LINGER);
            }
        }
        // Peers first, then local waiters: a program that exits on the error
        // must not look like the culprit to peers that have not heard yet.
        if preempt {
            for closer in lock(&self.closers).iter() {
                closer.close_with_failure(blamed, &reason);
            }
        }
        self.abort.abort();
    }
    /// What this rank says about a mismatch that `reporter` (local rank)
    /// found with `m.peer`: each side sees the other's call; a third rank
    /// compares its own call at that position with both.
    pub(super) fn mismatch_seen_here(
        &self,
        reporter: usize,
        peer: usize,
        m: &MismatchReport,
        call: Option<&Call>,
    ) -> Error {
        let own = |call: Option<&Call>| match call {
            Some(c) if c.order == m.seq && !is_p2p(&c.fingerprint) => Some(c.during()),
            _ => self.issued_at(m.seq),
        };
        if m.refused {
            return Error::PeerFailed {
                rank: reporter,
                during: own(call).unwrap_or_else(|| "a later call".to_string()),
                reason: format!(
                    "it refused its call at this position, {}: {}",
                    m.local, m.remote
                ),
            };
        }
        if self.rank == peer {
            return Error::Mismatch {
                peer: reporter,
                local: m.remote.clone(),
                remote: m.local.clone(),
            };
        }
        let own = own(call);
        let both = || format!("{} (and rank {peer} called {})", m.local, m.remote);
        match own {
            Some(own) if own == m.local => Error::Mismatch {
                peer,
                local: own,
                remote: m.remote.clone(),
            },
            Some(own) if own == m.remote => Error::Mismatch {
                peer: reporter,
                local: own,
                remote: m.local.clone(),
            },
            Some(own) => Error::Mismatch {
                peer: reporter,
                local: own,
                remote: both(),
            },
            // This rank has not reached that position: it says where it is
            // (a call before it can end on the mismatch's fallout, when the
            // reporter's process exits and its sockets reset).
            None => Error::Mismatch {
                peer: reporter,
                local: match call {
                    Some(c) if crate::fingerprint::is_internal(&c.fingerprint) => {
                        "nothing at that position yet (it was still inside communicator set-up, \
                         split or alloc_window)"
                            .to_string()
                    }
                    Some(c) => format!("{}, not that call yet", c.during()),
                    None => "nothing at that position yet".to_string(),
                },
                remote: both(),
            },
        }
    }
}

/// Whether a call is point-to-point (numbered per peer and direction).
pub(super) fn is_p2p(fp: &Fingerprint) -> bool {
    CollKind::from_code(fp.coll) == Some(CollKind::SendRecv)
}
/// What [`Inner::fail_with`] tells the job.
pub(super) enum Broadcast {
    /// Nothing (the news came from the job).
    No,
    /// That the blamed rank failed.
    Failed,
    /// That this rank leaves because its call went ahead where another
    /// rank refused the same call (the report: this rank's call, the
    /// refuser and what it refused).
    Went(MismatchReport),
    /// That this rank found a mismatch (with the peer's global rank and
    /// both calls, when known).
    Mismatch(Option<MismatchReport>),
}
/// Listen for failure reports of the job and fail the communicator when one
/// names a member.
pub(super) fn spawn_watcher(
    inner: &Arc<Inner>,
    stop: crossbeam_channel::Receiver<()>,
) -> Result<std::thread::JoinHandle<()>> {
    let feed = inner.rendezvous.store.failures();
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let rank = inner.rank;
    std::thread::Builder::new()
        .name(format!("ferroccl-watch-{rank}"))
        .spawn(move || loop {
            let reports = feed.receiver();
            crossbeam_channel::select! {
                recv(reports) -> report => {
                    let Ok(report) = report else { return };
                    if report.is_rendezvous_loss() {
                        // Rank 0 leaving is often only the echo of another
                        // failure (it exits on it); give the report naming
                        // the cause, or this rank's own error, a moment to
                        // arrive first.
                        std::thread::sleep(std::time::Duration::from_millis(200));
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    let local_of = |g: usize| inner.global_ranks.iter().position(|&x| x == g);
                    let Some(local) = local_of(report.rank) else { continue };
                    // A report about another communicator of the same
                    // ranks (an abort there, a timeout there) leaves this
                    // one alone.
                    if local == inner.rank || !report.concerns(inner.comm_id) {
                        continue;
                    }
                    match &report.mismatch {
                        // A mismatch concerns its own communicator only:
                        // the reporter is alive and its other communicators
                        // work.
                        Some(m) if m.comm_id != inner.comm_id => {}
                        // A rank made a call that another refused.
                        Some(m) if m.refused && m.peer != report.rank => {
                            inner.heard_went(local, m);
                        }
                        // Another rank refused a call this rank refused too.
                        Some(m) if m.refused && inner.refused_too(m.seq) => {}
                        Some(m) => {
                            let peer = local_of(m.peer).unwrap_or(local);
                            inner.hear((local, peer, m.clone()));
                            // Stored before `issued` is read under the
                            // issue lock, which the issuer stores it
                            // under: either the issue came after that
                            // read, and the call sees the flag when it
                            // runs (`heard_mismatch`), or the read sees
                            // the call.
                            inner.mismatch_flag.store(true, Ordering::SeqCst);
                            // A call before the mismatched one is left to
                            // finish: its peers completed it, so its data
                            // is on the way. The mismatched call (or a
                            // later one) ends now, or when it starts.
                            if inner.issued_so_far() >= m.seq
                                && !(m.refused && inner.refused_too(m.seq))
                            {
                                let err = inner.mismatch_seen_here(local, peer, m, None);
                                inner.fail_on_heard(err, local, m);
                            }
                        }
                        None => {
                            if !left_by_abort(&report.reason) {
                                lock(&inner.known_failed).insert(local);
                            }
                            // After a mismatch report, ranks leave on the
                            // mismatch: their going is its echo, not news.
                            // So is any rank's going after a refusal: the
                            // refuser returned its error, the others ended
                            // their calls on it, and their processes may
                            // end before this rank reaches the call. Name
                            // what was refused.
                            let heard = lock(&inner.mismatch_heard).clone();
                            let err = match heard {
                                Some((reporter, peer, m)) => {
                                    inner.mismatch_seen_here(reporter, peer, &m, None)
                                }
                                _ => Error::PeerFailed {
                                    rank: local,
                                    during: "failure report from the job".into(),
                                    reason: report.reason.clone(),
                                },
                            };
                            inner.fail(err, Some(local), false);
                        }
                    }
                }
                recv(stop) -> _ => return,
            }
        })
        .map_err(Into::into)
}

/// What `abort()` says of itself (its error, and the reason its peers
/// hear): a rank that aborted is alive and may shrink with the others.
pub(super) const ABORT_SAYS: &str = "abort() was called on this rank";

/// Whether a failure's reason is a peer's `abort()`.
fn left_by_abort(reason: &str) -> bool {
    reason.contains(ABORT_SAYS)
}

/// What a rank that made its call `call` says where rank `refuser` refused
/// its own (`refused`: that call and why).
fn went_text(call: &str, refuser: usize, refused: &str) -> String {
    format!("it made its call at this position ({call}), which rank {refuser} refused ({refused})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{MemoryStore, Store};
    use crate::comm::{Communicator, Rendezvous};
    use crate::config::Config;
    use std::time::Duration;

    /// Rank 1 refuses an all_gather (its output is short) and leaves at
    /// once: it drops its communicator, or (`lost`) its process goes and
    /// the rendezvous server's report of the lost connection follows the
    /// refusal. Ranks 0 and 2 reach the call only after both reports
    /// arrived. The going is the echo of the refusal: they name rank 1 and
    /// what it refused, not only that it went (the process test
    /// `a_refused_argument_ends_the_call_on_every_rank_at_once` saw the
    /// latter now and then, where a rank came late to its call). Over the
    /// default transports, the in-process one and emulated RDMA.
    #[test]
    fn a_refuser_that_goes_at_once_is_named_for_its_refusal() {
        for transport in [None, Some("mem"), Some("ib-emu")] {
            for lost in [false, true] {
                refuser_goes(transport, lost, 1);
            }
        }
    }

    /// The same where the rank that goes is not the refuser but rank 2,
    /// which ended its own call on rank 1's refusal and whose process then
    /// ended: rank 0, late to the call, hears the refusal and then rank 2's
    /// lost connection, and names the refusal (the process test above saw
    /// "rank 2 failed: lost its rendezvous connection" on rank 0 once).
    #[test]
    fn a_rank_that_goes_after_a_refusal_is_its_echo() {
        for transport in [None, Some("mem")] {
            refuser_goes(transport, true, 2);
        }
    }

    /// `goer`: the rank whose going is reported (with `lost`) after its call.
    fn refuser_goes(transport: Option<&str>, lost: bool, goer: usize) {
        let store = MemoryStore::new();
        let n = 3;
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|rank| {
                    let store = store.clone();
                    s.spawn(move || {
                        let mut config =
                            Config::new(rank, n, "127.0.0.1", 0, 0x5e1f).expect("config");
                        config.transport = transport.map(str::to_string);
                        config.calibrate = false;
                        config.timeout = Duration::from_secs(30);
                        let shared: Arc<dyn Store> = store.clone();
                        let rendezvous =
                            Arc::new(Rendezvous::new(shared, None, rank).expect("rendezvous"));
                        let comm = Communicator::build(config, rendezvous, (0..n).collect(), 3)
                            .expect("communicator");
                        // Every rank's set-up is over (its own collectives
                        // would otherwise meet the refusal).
                        comm.barrier().expect("a valid call first");
                        let send = [rank as u32; 4];
                        let mut recv = vec![0u32; 12 - usize::from(rank == 1)];
                        if rank == 1 || rank == goer {
                            let r = comm.all_gather(&send, &mut recv);
                            if lost && rank == goer {
                                // What the server says of a process that died.
                                store.report(FailureReport::failed(
                                    goer,
                                    "lost its rendezvous connection (process died or was killed)",
                                ));
                            }
                            drop(comm);
                            return r;
                        }
                        std::thread::sleep(Duration::from_millis(500));
                        comm.all_gather(&send, &mut recv)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rank"))
                .collect()
        });
        let how = format!("{transport:?}, process lost: {lost}, rank {goer} goes");
        for (rank, r) in results.into_iter().enumerate() {
            match (rank, r) {
                (1, Err(Error::InvalidArgument(_))) => {}
                (
                    0 | 2,
                    Err(Error::PeerFailed {
                        rank: 1,
                        during,
                        reason,
                    }),
                ) => {
                    assert!(
                        during.starts_with("all_gather #2 ("),
                        "rank {rank} ({how}): during '{during}'"
                    );
                    assert!(
                        reason.contains("refused") && reason.contains("11 elements"),
                        "rank {rank} ({how}): reason '{reason}'"
                    );
                }
                (_, other) => panic!("rank {rank} ({how}): got {other:?}"),
            }
        }
    }
}
