//! Shrink: a new communicator of the survivors of this one (NCCL's
//! `ncclCommShrink`, ULFM's `MPI_Comm_shrink`), made without this
//! communicator's rendezvous or connections, so that it works when the
//! rank that hosted the rendezvous is the one that died.
//!
//! How the survivors agree, in order:
//! 1. each survivor leaves out the ranks it was given and the ranks this
//!    communicator knows to have failed (`known_failed`);
//! 2. the lowest rank not left out leads; every other survivor sends it a
//!    proposal (who it is, what it leaves out) at the meeting point that
//!    rank published when the communicator was built
//!    (`bootstrap::recovery`): an address already exchanged;
//! 3. the leader waits, until the communicator's timeout, for every rank it
//!    does not leave out; the failed set is the union of every proposal's;
//!    the members are the ranks that proposed and are not in it, in old
//!    rank order. A rank it waited for that never came (still inside a
//!    call of the old communicator, or dead unseen) fails the shrink on
//!    every survivor with an error naming it: every survivor ends with the
//!    same member list, or with an error;
//! 4. the leader starts a fresh rendezvous and tells every member its new
//!    rank and where the rendezvous is; each member builds the new
//!    communicator over it (new connections, as at creation).
//!
//! This communicator is not touched: a survivor still inside one of its
//! calls ends it on the failure as before.

use super::{lock, Communicator, Rendezvous};
use crate::bootstrap::recovery::{self, Proposal, Verdict};
use crate::bootstrap::{TcpStore, TcpStoreServer};
use crate::error::{Error, Result};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Communicator {
    /// The ranks of this communicator known to have failed so far: reported
    /// gone by the job (a dead or cut-off process), or blamed for this
    /// communicator's failure (a broken connection, a timeout, an abort
    /// there). What [`shrink`](Communicator::shrink) leaves out besides the
    /// ranks it is given.
    pub fn failed_ranks(&self) -> Vec<usize> {
        lock(&self.inner.known_failed).iter().copied().collect()
    }

    /// A new communicator of the survivors: every rank of this one but
    /// `exclude` and the ranks known to have failed
    /// ([`failed_ranks`](Communicator::failed_ranks)), renumbered in order.
    /// Every surviving rank calls it (a collective of the survivors); a
    /// rank left out must not. It needs neither this communicator's
    /// rendezvous nor its connections, so it works after any rank died,
    /// rank 0 (the rendezvous host) included, and this communicator may
    /// have failed or not (it is left as it is).
    ///
    /// The survivors agree on the members: each gets the same list, or an
    /// error. A rank expected that does not call `shrink` within the
    /// timeout (it is still waiting in a call of this communicator, or died
    /// unseen) fails the shrink on every survivor with
    /// [`Error::PeerFailed`] naming it; call again with it left out. A
    /// survivor that others hold failed gets an error saying who said so.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        let inner = &self.inner;
        let (rank, size) = (inner.rank, inner.size);
        if let Some(&bad) = exclude.iter().find(|&&r| r >= size) {
            return Err(Error::InvalidArgument(format!(
                "shrink: rank {bad} to leave out is not a rank of this communicator of {size}"
            )));
        }
        let mut left_out: BTreeSet<usize> = exclude.iter().copied().collect();
        left_out.extend(lock(&inner.known_failed).iter().copied());
        if left_out.contains(&rank) {
            return Err(Error::InvalidArgument(format!(
                "shrink: this rank ({rank}) is among the ranks left out ({:?}); a rank left out \
                 must not call shrink",
                left_out
            )));
        }
        let index = inner.shrinks.fetch_add(1, Ordering::SeqCst);
        let key = shrink_key(inner.config.token, inner.comm_id, index);
        let deadline = Instant::now() + inner.config.timeout;
        let leader = (0..size)
            .find(|r| !left_out.contains(r))
            .expect("this rank is not left out");
        let point = recovery::meeting_point()
            .map_err(|e| Error::Bootstrap(format!("shrink: no meeting point here: {e}")))?;
        let start = Instant::now();
        let (new_rank, members, store, comm_id, server) = if leader == rank {
            let expected: Vec<usize> = (0..size)
                .filter(|r| *r != rank && !left_out.contains(r))
                .collect();
            let mut proposals = point.gather(inner.config.token, key, rank, &expected, deadline);
            let accusations: Vec<(usize, Vec<usize>)> = proposals
                .iter()
                .map(|(p, _)| (p.from, p.failed.clone()))
                .collect();
            let mut failed = left_out.clone();
            for (p, _) in &proposals {
                failed.extend(p.failed.iter().copied().filter(|&r| r < size));
            }
            failed.remove(&rank);
            let came: BTreeSet<usize> = proposals.iter().map(|(p, _)| p.from).collect();
            let missing: Vec<usize> = expected
                .iter()
                .copied()
                .filter(|r| !came.contains(r) && !failed.contains(r))
                .collect();
            let members: Vec<usize> = (0..size)
                .filter(|r| (*r == rank || came.contains(r)) && !failed.contains(r))
                .collect();
            let outcome = if let Some(&first) = missing.first() {
                Err(Error::PeerFailed {
                    rank: first,
                    during: "shrink".into(),
                    reason: format!(
                        "rank(s) {missing:?} did not join the shrink within {} ms (still inside \
                         a call of the old communicator, or failed unseen); call shrink again \
                         leaving them out",
                        inner.config.timeout.as_millis()
                    ),
                })
            } else {
                self.host_rendezvous(members.len(), key)
            };
            let (store, server) = match outcome {
                Ok(hosted) => hosted,
                Err(err) => {
                    for (_, stream) in &mut proposals {
                        recovery::answer(stream, &Verdict::Refused(err.to_string()));
                    }
                    return Err(err);
                }
            };
            let new_id = key | 2;
            for (p, stream) in &mut proposals {
                let verdict = if failed.contains(&p.from) {
                    let mut accusers: Vec<usize> = accusations
                        .iter()
                        .filter(|(_, named)| named.contains(&p.from))
                        .map(|(by, _)| *by)
                        .collect();
                    if left_out.contains(&p.from) {
                        accusers.push(rank);
                    }
                    Verdict::Refused(format!(
                        "rank {} is held failed by rank(s) {accusers:?}; it is not a member of \
                         the shrunken communicator",
                        p.from
                    ))
                } else {
                    Verdict::Join {
                        members: members.clone(),
                        store,
                        comm_id: new_id,
                    }
                };
                recovery::answer(stream, &verdict);
            }
            let new_rank = members.iter().position(|&r| r == rank).unwrap_or(0);
            (new_rank, members, store, new_id, Some(server))
        } else {
            let addr = lock(&inner.rendezvous.meeting)
                .get(&inner.global_ranks[leader])
                .copied()
                .flatten()
                .ok_or_else(|| {
                    Error::Bootstrap(format!(
                        "shrink: rank {leader}, which leads it, published no meeting point"
                    ))
                })?;
            let proposal = Proposal {
                token: inner.config.token,
                key,
                from: rank,
                to: leader,
                failed: left_out.iter().copied().collect(),
            };
            // The leader may wait its whole timeout for a late survivor
            // before it answers: wait longer than that.
            let answer_by = deadline + inner.config.timeout / 2 + Duration::from_secs(2);
            let verdict =
                recovery::propose(addr, &proposal, answer_by).map_err(|e| Error::PeerFailed {
                    rank: leader,
                    during: "shrink".into(),
                    reason: format!(
                        "it leads the shrink (the lowest rank not left out) and did not answer: \
                         {e}; if it failed, call shrink again leaving it out"
                    ),
                })?;
            match verdict {
                Verdict::Refused(why) => {
                    return Err(Error::Bootstrap(format!(
                        "shrink: the leader refused: {why}"
                    )))
                }
                Verdict::Join {
                    members,
                    store,
                    comm_id,
                } => {
                    let Some(new_rank) = members.iter().position(|&r| r == rank) else {
                        return Err(Error::Bootstrap(format!(
                            "shrink: the leader's member list {members:?} leaves this rank out"
                        )));
                    };
                    (new_rank, members, store, comm_id, None)
                }
            }
        };
        tracing::info!(
            rank,
            "shrink: agreed on {} survivors {members:?} in {:.1} ms; rank {rank} becomes {new_rank}",
            members.len(),
            start.elapsed().as_secs_f64() * 1e3
        );
        let mut config = inner.config.clone();
        config.rank = new_rank;
        config.size = members.len();
        config.token = shrink_token(inner.config.token, key);
        let connect_by = Instant::now() + config.timeout;
        let client = TcpStore::connect_with_heartbeat(
            store,
            config.token,
            new_rank,
            connect_by,
            config.heartbeat_interval(),
        )?;
        let rendezvous = Arc::new(Rendezvous::new(Arc::new(client), server, new_rank)?);
        let global = (0..members.len()).collect();
        Communicator::build(config, rendezvous, global, comm_id)
    }

    /// [`shrink`](Communicator::shrink) leaving out only the ranks known to
    /// have failed.
    pub fn shrink_failed(&self) -> Result<Communicator> {
        self.shrink(&[])
    }

    /// Start the shrunken communicator's rendezvous on this rank (the
    /// leader), on the interface it was reached on.
    fn host_rendezvous(&self, members: usize, key: u64) -> Result<(SocketAddr, TcpStoreServer)> {
        let ip = self
            .inner
            .rendezvous
            .store
            .local_ip()
            .unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
        let token = shrink_token(self.inner.config.token, key);
        let server = TcpStoreServer::start(SocketAddr::new(ip, 0), token, members)?;
        Ok((server.local_addr(), server))
    }
}

/// Names shrink number `index` of communicator `comm_id` alike on every
/// survivor, and apart from other jobs' (the token).
fn shrink_key(token: u64, comm_id: u64, index: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in [token, comm_id, index, 0x5348_5249_4e4b] {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The shrunken communicator's token: its rendezvous and handshakes refuse
/// the old communicator's ranks that were left out.
fn shrink_token(token: u64, key: u64) -> u64 {
    shrink_key(token, key, u64::MAX)
}
