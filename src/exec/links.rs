//! The connections of one communicator: which transport reaches which peer,
//! connection set-up through the rendezvous (lower rank connects, higher rank
//! accepts), and the per-peer sending and receiving halves the executor uses.

use super::Call;
use crate::bootstrap::{FailureReport, Store};
use crate::error::{Error, Result};
use ferroccl_transport::{
    lock, AbortSignal, ConnectionCloser, FifoDescriptor, HostInfo, HostPath, ListenConfig,
    Listener, SlotReceiver, SlotSender, Transport,
};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Failure reports about the members of one communicator, consulted by its
/// rendezvous waits: a member that dies while the communicator is being set
/// up (or before a lazy connection to it) is named, in this communicator's
/// ranks, instead of leaving the others to wait out the timeout.
pub(crate) struct MemberWatch {
    rank: usize,
    /// Job rank of each rank of the communicator.
    members: Vec<usize>,
    reports: crossbeam_channel::Receiver<FailureReport>,
    failed: Mutex<Option<(usize, String)>>,
    /// The rendezvous host went away (it need not be a member: every
    /// communicator's set-up goes through it).
    host_lost: Mutex<Option<String>>,
}

impl MemberWatch {
    /// Watch the reports of `store` (those made before included) for the
    /// members `members` (job ranks, by communicator rank); `rank` is this
    /// rank in the communicator.
    pub(crate) fn new(store: &dyn Store, rank: usize, members: Vec<usize>) -> Self {
        MemberWatch {
            rank,
            members,
            reports: store.failures(),
            failed: Mutex::new(None),
            host_lost: Mutex::new(None),
        }
    }

    /// The first other member reported failed, as (communicator rank,
    /// reason). Mismatch reports concern a call, not a member's life, and
    /// are left to the communicator that made them.
    pub(crate) fn failed(&self) -> Option<(usize, String)> {
        let mut failed = lock(&self.failed);
        if failed.is_none() {
            for report in self.reports.try_iter() {
                if report.mismatch.is_some() {
                    continue;
                }
                let local = self.members.iter().position(|&g| g == report.rank);
                if let Some(local) = local.filter(|&l| l != self.rank) {
                    *failed = Some((local, report.reason));
                    break;
                }
                if report.is_rendezvous_loss() {
                    let mut lost = lock(&self.host_lost);
                    lost.get_or_insert(report.reason);
                }
            }
        }
        failed.clone()
    }

    /// `failed()` as the error of what was going on (`during`); failing
    /// that, the loss of the rendezvous host when it is not a member.
    pub(crate) fn error(&self, during: &str) -> Option<Error> {
        if let Some((rank, reason)) = self.failed() {
            return Some(Error::PeerFailed {
                rank,
                during: during.to_string(),
                reason,
            });
        }
        let lost = lock(&self.host_lost);
        lost.as_ref().map(|reason| {
            Error::Bootstrap(format!(
                "{during}: rank 0 of the job, the rendezvous host, failed: {reason}"
            ))
        })
    }

    /// `error()`, waiting up to `grace` for a report to arrive: what failed
    /// a wait (a reset rendezvous connection, say) is often the echo of a
    /// member's death whose report is a moment behind.
    pub(crate) fn error_within(&self, during: &str, grace: Duration) -> Option<Error> {
        let until = Instant::now() + grace;
        loop {
            if let Some(err) = self.error(during) {
                return Some(err);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A rendezvous wait asks for at most this long at a time, then looks at
/// the failure reports; also how long a failed set-up step waits for a
/// report that names the cause.
pub(crate) const WAIT_SLICE: Duration = Duration::from_millis(200);

/// How much earlier than asked a sliced wait may end and still count as
/// having run out.
const SLICE_EARLY: Duration = Duration::from_millis(20);

/// Builds connections to peers on demand.
pub(crate) struct Connector {
    rank: usize,
    size: usize,
    comm_id: u64,
    store: Arc<dyn Store>,
    watch: Arc<MemberWatch>,
    transports: Vec<(Arc<dyn Transport>, Box<dyn Listener>)>,
    hosts: Vec<HostInfo>,
    timeout: Duration,
}

fn key(comm_id: u64, what: &str, rank: usize) -> String {
    format!("comm/{comm_id:016x}/{what}/{rank}")
}

impl Connector {
    /// Start a listener per transport, publish their addresses and this
    /// rank's host identity, and learn every rank's host identity.
    pub(crate) fn new(
        config: &ListenConfig,
        store: Arc<dyn Store>,
        watch: Arc<MemberWatch>,
        transports: Vec<Arc<dyn Transport>>,
        host: HostInfo,
        abort: &AbortSignal,
        timeout: Duration,
    ) -> Result<Self> {
        let (rank, size, comm_id) = (config.rank, config.size, config.comm_id);
        let mut listening = Vec::new();
        for transport in transports {
            let listener = transport
                .listen(config, abort)
                .map_err(|e| Error::from_transport(e, "communicator set-up"))?;
            store.set(
                &key(comm_id, &format!("addr-{}", transport.name()), rank),
                &listener.address(),
            )?;
            listening.push((transport, listener));
        }
        store.set(&key(comm_id, "host", rank), host.host_id.as_bytes())?;
        let deadline = Instant::now() + timeout;
        let mut hosts = Vec::with_capacity(size);
        for r in 0..size {
            let id = watched_get(&*store, &watch, &key(comm_id, "host", r), deadline)?;
            hosts.push(HostInfo {
                host_id: String::from_utf8_lossy(&id).into_owned(),
            });
        }
        Ok(Connector {
            rank,
            size,
            comm_id,
            store,
            watch,
            transports: listening,
            hosts,
            timeout,
        })
    }

    /// Index of the transport that joins this rank and `peer`: the first in
    /// preference order that can. Both ends compute the same answer.
    fn pick(&self, peer: usize) -> Result<usize> {
        let (me, them) = (&self.hosts[self.rank], &self.hosts[peer]);
        self.transports
            .iter()
            .position(|(t, _)| t.can_connect(me, them))
            .ok_or_else(|| Error::Connect {
                peer,
                detail: format!(
                    "no transport can reach it (enabled: {})",
                    self.transport_names().join(", ")
                ),
            })
    }

    /// Whether every rank of the communicator is on this rank's host.
    fn one_host(&self) -> bool {
        let me = &self.hosts[self.rank].host_id;
        !me.is_empty() && self.hosts.iter().all(|h| &h.host_id == me)
    }

    fn transport_names(&self) -> Vec<&'static str> {
        self.transports.iter().map(|(t, _)| t.name()).collect()
    }

    fn connect(&self, peer: usize) -> Result<ferroccl_transport::Connection> {
        let index = self.pick(peer)?;
        let (transport, listener) = &self.transports[index];
        let deadline = Instant::now() + self.timeout;
        let conn = if self.rank < peer {
            let address = watched_get(
                &*self.store,
                &self.watch,
                &key(self.comm_id, &format!("addr-{}", transport.name()), peer),
                deadline,
            )?;
            listener.connect(peer, &address, deadline)
        } else {
            listener.accept(peer, deadline)
        }
        .map_err(|e| Error::from_transport(e, "connection set-up"))?;
        tracing::info!(
            rank = self.rank,
            peer,
            transport = transport.name(),
            "connected rank {} to rank {} over {}",
            self.rank,
            peer,
            transport.name()
        );
        Ok(conn)
    }
}

/// `store.get(key, deadline)` in slices, ending early with the failure of a
/// member that `watch` hears of. A wait that ends in an error of its own
/// (the rendezvous gone, say) first gives a report a moment to arrive: when
/// a member dies, rank 0 often exits on it and takes the rendezvous along.
fn watched_get(
    store: &dyn Store,
    watch: &MemberWatch,
    key: &str,
    deadline: Instant,
) -> Result<Vec<u8>> {
    const DURING: &str = "communicator set-up";
    loop {
        if let Some(err) = watch.error(DURING) {
            return Err(err);
        }
        let slice = deadline.min(Instant::now() + WAIT_SLICE);
        match store.get(key, slice) {
            Ok(value) => return Ok(value),
            // The slice ran out (the server rounds its wait down to whole
            // milliseconds, so allow it to answer a little early): wait on.
            // An error of another kind that happens to come this late is
            // met again, at once, by the next request.
            Err(_) if Instant::now() + SLICE_EARLY >= slice && slice < deadline => {}
            Err(err) => return Err(watch.error_within(DURING, WAIT_SLICE).unwrap_or(err)),
        }
    }
}

/// A receiving half, and the sending half its step forwards to (if any).
pub(super) type RecvSend<'a> = (
    &'a mut Box<dyn SlotReceiver>,
    Option<&'a mut Box<dyn SlotSender>>,
);

/// The halves of every established connection, by peer.
pub(crate) struct Links {
    connector: Connector,
    senders: Vec<Option<Box<dyn SlotSender>>>,
    receivers: Vec<Option<Box<dyn SlotReceiver>>>,
    /// What set-up said about each peer's FIFOs: (send, receive).
    fifos: Vec<Option<(FifoDescriptor, FifoDescriptor)>>,
    transport_of: Vec<Option<&'static str>>,
    /// Shared with the communicator so that abort can close connections
    /// while the executor is blocked holding `Links`.
    closers: Arc<Mutex<Vec<Arc<dyn ConnectionCloser>>>>,
}

impl Links {
    pub(crate) fn new(
        connector: Connector,
        closers: Arc<Mutex<Vec<Arc<dyn ConnectionCloser>>>>,
    ) -> Self {
        let size = connector.size;
        Links {
            connector,
            senders: (0..size).map(|_| None).collect(),
            receivers: (0..size).map(|_| None).collect(),
            fifos: vec![None; size],
            transport_of: vec![None; size],
            closers,
        }
    }

    /// Connect to `peer` now if not connected yet. Inlined: every step of
    /// every call asks, and almost always the answer is "connected".
    #[inline]
    pub(crate) fn ensure(&mut self, peer: usize) -> Result<()> {
        match self.senders.get(peer) {
            Some(Some(_)) => Ok(()),
            _ => self.connect(peer),
        }
    }

    #[cold]
    fn connect(&mut self, peer: usize) -> Result<()> {
        if peer >= self.connector.size {
            return Err(Error::InvalidArgument(format!(
                "rank {peer} out of range for a communicator of {} ranks",
                self.connector.size
            )));
        }
        if self.senders[peer].is_some() || peer == self.connector.rank {
            return Ok(());
        }
        let conn = self.connector.connect(peer)?;
        let Some(HostPath { sender, receiver }) = conn.host else {
            conn.closer.close();
            return Err(Error::Connect {
                peer,
                detail: format!(
                    "the {} transport has no host data path for this executor",
                    conn.transport
                ),
            });
        };
        self.transport_of[peer] = Some(conn.transport);
        self.fifos[peer] = Some((conn.send_fifo, conn.recv_fifo));
        self.senders[peer] = Some(sender);
        self.receivers[peer] = Some(receiver);
        lock(&self.closers).push(conn.closer);
        Ok(())
    }

    /// Whether every rank of the communicator is on this rank's host (so
    /// that they can share memory).
    pub(crate) fn one_host(&self) -> bool {
        self.connector.one_host()
    }

    /// The transport each peer is connected over (None: not connected yet).
    pub(crate) fn transports(&self) -> &[Option<&'static str>] {
        &self.transport_of
    }

    /// The FIFOs of the connection to `peer` as its set-up described them,
    /// (send, receive); None while not connected.
    #[expect(dead_code, reason = "the planner reads it to choose device paths")]
    pub(crate) fn fifos(&self, peer: usize) -> Option<&(FifoDescriptor, FifoDescriptor)> {
        self.fifos.get(peer)?.as_ref()
    }

    #[inline]
    pub(super) fn sender(&mut self, peer: usize, call: &Call) -> Result<&mut Box<dyn SlotSender>> {
        self.ensure(peer)?;
        self.senders[peer].as_mut().ok_or_else(|| gone(peer, call))
    }

    #[inline]
    pub(super) fn receiver_and_sender(
        &mut self,
        from: usize,
        to: usize,
        call: &Call,
    ) -> Result<RecvSend<'_>> {
        self.ensure(from)?;
        if to != crate::algo::NO_PEER {
            self.ensure(to)?;
        }
        let receiver = self.receivers[from]
            .as_mut()
            .ok_or_else(|| gone(from, call))?;
        let sender = if to == crate::algo::NO_PEER {
            None
        } else {
            Some(self.senders[to].as_mut().ok_or_else(|| gone(to, call))?)
        };
        Ok((receiver, sender))
    }

    /// Drop every connection (their threads exit with them).
    pub(crate) fn clear(&mut self) {
        self.senders.iter_mut().for_each(|s| *s = None);
        self.receivers.iter_mut().for_each(|r| *r = None);
        // They described memory the halves held.
        self.fifos.iter_mut().for_each(|f| *f = None);
    }
}

fn gone(peer: usize, call: &Call) -> Error {
    Error::PeerFailed {
        rank: peer,
        during: call.during(),
        reason: "its connection was already closed".into(),
    }
}
