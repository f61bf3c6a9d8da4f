//! The connections of one communicator: which transport reaches which peer,
//! connection set-up through the rendezvous (lower rank connects, higher rank
//! accepts), and the sending and receiving halves the executor uses, by
//! channel and peer. A channel is a set of connections of its own (its own
//! FIFOs) to the same peers, so that a schedule may run several rings or
//! trees at once (NCCL's channels); the host schedules use channel 0, and
//! further channels connect when a step first names them. The device
//! executor's channels are not these: it makes FIFOs of its own in device
//! memory (`comm::device_exec`); it uses this module's rendezvous
//! `exchange` for its set-up rounds.

use super::Call;
use crate::algo::hier::HostMap;
use crate::bootstrap::{FailureFeed, Store};
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
    /// The communicator: reports scoped to another one are not about it.
    comm_id: u64,
    /// Job rank of each rank of the communicator.
    members: Vec<usize>,
    reports: FailureFeed,
    failed: Mutex<Option<(usize, String)>>,
    /// The rendezvous host went away (it need not be a member: every
    /// communicator's set-up goes through it).
    host_lost: Mutex<Option<String>>,
}

impl MemberWatch {
    /// Watch the reports of `store` (those made before included) for the
    /// members `members` (job ranks, by communicator rank); `rank` is this
    /// rank in the communicator.
    pub(crate) fn new(store: &dyn Store, comm_id: u64, rank: usize, members: Vec<usize>) -> Self {
        MemberWatch {
            rank,
            comm_id,
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
                if report.mismatch.is_some() || !report.concerns(self.comm_id) {
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
    /// The transports, in preference order.
    transports: Vec<Arc<dyn Transport>>,
    /// Each channel's listeners, one per transport: channel 0's made at
    /// creation, the others when a step first names the channel.
    listeners: Vec<Vec<Box<dyn Listener>>>,
    /// What channel 0 listens with; channel `c` listens with its own
    /// communicator id ([`channel_comm_id`]), so that its connections are
    /// never taken for another channel's.
    listen: ListenConfig,
    abort: AbortSignal,
    hosts: Vec<HostInfo>,
    timeout: Duration,
}

/// The prefix of every rendezvous key of communicator `comm_id`: what its
/// members release when they drop it ([`crate::bootstrap::Store::release`]).
pub(crate) fn key_scope(comm_id: u64) -> String {
    format!("comm/{comm_id:016x}/")
}

fn key(comm_id: u64, what: &str, rank: usize) -> String {
    format!("{}{what}/{rank}", key_scope(comm_id))
}

/// The rendezvous name of a listener's address: channel 0 keeps the name
/// it always had.
fn addr_key(comm_id: u64, transport: &str, channel: usize, rank: usize) -> String {
    match channel {
        0 => key(comm_id, &format!("addr-{transport}"), rank),
        c => key(comm_id, &format!("addr-{transport}-ch{c}"), rank),
    }
}

/// The communicator id channel `channel` of communicator `comm_id` shows
/// its transports (channel 0: `comm_id` itself): every rank derives the
/// same one, and a handshake meant for one channel fails on another's.
pub(crate) fn channel_comm_id(comm_id: u64, channel: usize) -> u64 {
    if channel == 0 {
        return comm_id;
    }
    // splitmix64's finaliser: nearby channels get unrelated ids.
    let mut z = comm_id ^ (channel as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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
        let mut connector = Connector {
            rank,
            size,
            comm_id,
            store,
            watch,
            transports,
            listeners: Vec::new(),
            listen: config.clone(),
            abort: abort.clone(),
            hosts: Vec::with_capacity(size),
            timeout,
        };
        connector.listen_through(0)?;
        let Connector {
            store,
            watch,
            hosts,
            ..
        } = &mut connector;
        store.set(&key(comm_id, "host", rank), host.host_id.as_bytes())?;
        let deadline = Instant::now() + timeout;
        for r in 0..size {
            let id = watched_get(
                &**store,
                watch,
                &key(comm_id, "host", r),
                deadline,
                (r, "its host, at the rendezvous: the rank never joined"),
            )?;
            hosts.push(HostInfo {
                host_id: String::from_utf8_lossy(&id).into_owned(),
            });
        }
        Ok(connector)
    }

    /// Start (and publish) every transport's listener of each channel up to
    /// `channel` that this rank does not listen on yet.
    fn listen_through(&mut self, channel: usize) -> Result<()> {
        while self.listeners.len() <= channel {
            let c = self.listeners.len();
            let config = ListenConfig {
                comm_id: channel_comm_id(self.comm_id, c),
                ..self.listen.clone()
            };
            let during = match c {
                0 => "communicator set-up".to_string(),
                c => format!("set-up of channel {c}"),
            };
            let mut listeners = Vec::with_capacity(self.transports.len());
            for transport in &self.transports {
                let listener = transport
                    .listen(&config, &self.abort)
                    .map_err(|e| Error::from_transport(e, &during))?;
                self.store.set(
                    &addr_key(self.comm_id, transport.name(), c, self.rank),
                    &listener.address(),
                )?;
                listeners.push(listener);
            }
            self.listeners.push(listeners);
        }
        Ok(())
    }

    /// Index of the transport that joins this rank and `peer`: the first in
    /// preference order that can. Both ends compute the same answer.
    fn pick(&self, peer: usize) -> Result<usize> {
        let (me, them) = (&self.hosts[self.rank], &self.hosts[peer]);
        self.transports
            .iter()
            .position(|t| t.can_connect(me, them))
            .ok_or_else(|| Error::Connect {
                peer,
                detail: format!(
                    "no transport can reach it (enabled: {})",
                    self.transport_names().join(", ")
                ),
            })
    }

    /// Which ranks share a host, from every rank's host identity. A rank
    /// whose host is unknown (an empty identity) makes the whole map one
    /// host, so that nothing is built on a guess.
    fn host_map(&self) -> HostMap {
        if self.hosts.iter().any(|h| h.host_id.is_empty()) {
            return HostMap::single(self.hosts.len());
        }
        let ids: Vec<&str> = self.hosts.iter().map(|h| h.host_id.as_str()).collect();
        HostMap::from_ids(&ids)
    }

    /// Whether every rank of the communicator is on this rank's host.
    fn one_host(&self) -> bool {
        let me = &self.hosts[self.rank].host_id;
        !me.is_empty() && self.hosts.iter().all(|h| &h.host_id == me)
    }

    fn transport_names(&self) -> Vec<&'static str> {
        self.transports.iter().map(|t| t.name()).collect()
    }

    fn connect(&mut self, channel: usize, peer: usize) -> Result<ferroccl_transport::Connection> {
        let index = self.pick(peer)?;
        let name = self.transports[index].name();
        let deadline = Instant::now() + self.timeout;
        let (rank, comm_id) = (self.rank, self.comm_id);
        // Listen (and publish) first: a peer of this channel may be waiting
        // for this rank's address.
        self.listen_through(channel)?;
        let listener = &*self.listeners[channel][index];
        let conn = if rank < peer {
            let address = watched_get(
                &*self.store,
                &self.watch,
                &addr_key(comm_id, name, channel, peer),
                deadline,
                (peer, "its listening address, at the rendezvous"),
            )?;
            listener.connect(peer, &address, deadline)
        } else {
            listener.accept(peer, deadline)
        }
        .map_err(|e| Error::from_transport(e, "connection set-up"))?;
        tracing::info!(
            rank,
            peer,
            channel,
            transport = name,
            "connected rank {rank} to rank {peer} over {name} (channel {channel})"
        );
        Ok(conn)
    }
}

/// `store.get(key, deadline)` in slices, ending early with the failure of a
/// member that `watch` hears of. A wait that ends in an error of its own
/// (the rendezvous gone, say) first gives a report a moment to arrive: when
/// a member dies, rank 0 often exits on it and takes the rendezvous along.
/// A wait that reaches the deadline is a timeout naming `of`'s rank and
/// what was awaited from it.
fn watched_get(
    store: &dyn Store,
    watch: &MemberWatch,
    key: &str,
    deadline: Instant,
    of: (usize, &str),
) -> Result<Vec<u8>> {
    let started = Instant::now();
    let during = "communicator set-up";
    watched_get_during(store, watch, key, deadline, during).map_err(|err| match err {
        Error::Bootstrap(_) if Instant::now() >= deadline => Error::Timeout {
            peer: of.0,
            during: during.to_string(),
            what: of.1.to_string(),
            waited_ms: started.elapsed().as_millis() as u64,
        },
        other => other,
    })
}

/// [`watched_get`], with what the wait is part of for its errors.
fn watched_get_during(
    store: &dyn Store,
    watch: &MemberWatch,
    key: &str,
    deadline: Instant,
    during: &str,
) -> Result<Vec<u8>> {
    loop {
        if let Some(err) = watch.error(during) {
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
            Err(err) => return Err(watch.error_within(during, WAIT_SLICE).unwrap_or(err)),
        }
    }
}

/// A receiving half, and the sending half its step forwards to (if any).
pub(super) type RecvSend<'a> = (
    &'a mut Box<dyn SlotReceiver>,
    Option<&'a mut Box<dyn SlotSender>>,
);

/// The halves of one channel's established connections, by peer.
struct Channel {
    senders: Vec<Option<Box<dyn SlotSender>>>,
    receivers: Vec<Option<Box<dyn SlotReceiver>>>,
    /// What set-up said about each peer's FIFOs: (send, receive).
    fifos: Vec<Option<(FifoDescriptor, FifoDescriptor)>>,
    transport_of: Vec<Option<&'static str>>,
}

impl Channel {
    fn new(size: usize) -> Self {
        Channel {
            senders: (0..size).map(|_| None).collect(),
            receivers: (0..size).map(|_| None).collect(),
            fifos: vec![None; size],
            transport_of: vec![None; size],
        }
    }
}

/// The halves of every established connection, by channel and peer.
pub(crate) struct Links {
    connector: Connector,
    /// Channel 0 always; others once a step names them.
    channels: Vec<Channel>,
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
            channels: vec![Channel::new(size)],
            closers,
        }
    }

    /// Every rank's bytes for `what`, in rank order, this rank's being
    /// `mine`: published under `comm/{comm_id}/{what}/{rank}` and read
    /// with the set-up's watch (a member's failure ends the wait, naming
    /// it) until `deadline`; a rank whose part has not come by then is
    /// named in a timeout of `during` (the call). Every rank must call it
    /// with the same `what` (once: keys are never taken back).
    pub(crate) fn exchange(
        &self,
        what: &str,
        mine: &[u8],
        deadline: Instant,
        during: &str,
    ) -> Result<Vec<Vec<u8>>> {
        let c = &self.connector;
        let started = Instant::now();
        c.store.set(&key(c.comm_id, what, c.rank), mine)?;
        (0..c.size)
            .map(|r| {
                watched_get_during(
                    &*c.store,
                    &c.watch,
                    &key(c.comm_id, what, r),
                    deadline,
                    during,
                )
                .map_err(|err| match err {
                    Error::Bootstrap(_) if Instant::now() >= deadline => Error::Timeout {
                        peer: r,
                        during: during.to_string(),
                        what: format!("its part of the device path set-up ({what})"),
                        waited_ms: started.elapsed().as_millis() as u64,
                    },
                    other => other,
                })
            })
            .collect()
    }

    /// Connect to `peer` on `channel` now if not connected yet. Inlined:
    /// every step of every call asks, and almost always the answer is
    /// "connected".
    #[inline]
    pub(crate) fn ensure(&mut self, channel: usize, peer: usize) -> Result<()> {
        match self.channels.get(channel).and_then(|c| c.senders.get(peer)) {
            Some(Some(_)) => Ok(()),
            _ => self.connect(channel, peer),
        }
    }

    /// Connect to `peer` on `channel`. Like channel 0's peers other than
    /// the ring neighbours, a channel's connections are made when a step
    /// first needs them, the lower rank connecting and the higher
    /// accepting: both ranks run the same schedule, so both get here.
    #[cold]
    fn connect(&mut self, channel: usize, peer: usize) -> Result<()> {
        let size = self.connector.size;
        if peer >= size {
            return Err(Error::InvalidArgument(format!(
                "rank {peer} out of range for a communicator of {size} ranks"
            )));
        }
        if channel > MAX_CHANNELS {
            return Err(Error::InvalidArgument(format!(
                "channel {channel} out of range: a communicator has at most {} channels",
                MAX_CHANNELS + 1
            )));
        }
        while self.channels.len() <= channel {
            self.channels.push(Channel::new(size));
        }
        if self.channels[channel].senders[peer].is_some() || peer == self.connector.rank {
            return Ok(());
        }
        let conn = self.connector.connect(channel, peer)?;
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
        let links = &mut self.channels[channel];
        links.transport_of[peer] = Some(conn.transport);
        links.fifos[peer] = Some((conn.send_fifo, conn.recv_fifo));
        links.senders[peer] = Some(sender);
        links.receivers[peer] = Some(receiver);
        lock(&self.closers).push(conn.closer);
        Ok(())
    }

    /// Whether every rank of the communicator is on this rank's host (so
    /// that they can share memory).
    pub(crate) fn one_host(&self) -> bool {
        self.connector.one_host()
    }

    /// Which ranks share a host (see `Connector::host_map`).
    pub(crate) fn host_map(&self) -> HostMap {
        self.connector.host_map()
    }

    /// The transport each peer is connected over on channel 0 (None: not
    /// connected yet).
    pub(crate) fn transports(&self) -> &[Option<&'static str>] {
        &self.channels[0].transport_of
    }

    /// The FIFOs of the connection to `peer` on `channel` as its set-up
    /// described them, (send, receive); None while not connected.
    #[expect(dead_code, reason = "the planner reads it to choose device paths")]
    pub(crate) fn fifos(
        &self,
        channel: usize,
        peer: usize,
    ) -> Option<&(FifoDescriptor, FifoDescriptor)> {
        self.channels.get(channel)?.fifos.get(peer)?.as_ref()
    }

    #[inline]
    pub(super) fn sender(
        &mut self,
        channel: usize,
        peer: usize,
        call: &Call,
    ) -> Result<&mut Box<dyn SlotSender>> {
        self.ensure(channel, peer)?;
        self.channels[channel].senders[peer]
            .as_mut()
            .ok_or_else(|| gone(peer, call))
    }

    #[inline]
    pub(super) fn receiver_and_sender(
        &mut self,
        channel: usize,
        from: usize,
        to: usize,
        call: &Call,
    ) -> Result<RecvSend<'_>> {
        self.ensure(channel, from)?;
        if to != crate::algo::NO_PEER {
            self.ensure(channel, to)?;
        }
        let links = &mut self.channels[channel];
        let receiver = links.receivers[from]
            .as_mut()
            .ok_or_else(|| gone(from, call))?;
        let sender = if to == crate::algo::NO_PEER {
            None
        } else {
            Some(links.senders[to].as_mut().ok_or_else(|| gone(to, call))?)
        };
        Ok((receiver, sender))
    }

    /// Drop every connection (their threads exit with them).
    pub(crate) fn clear(&mut self) {
        for links in &mut self.channels {
            links.senders.iter_mut().for_each(|s| *s = None);
            links.receivers.iter_mut().for_each(|r| *r = None);
            // They described memory the halves held.
            links.fifos.iter_mut().for_each(|f| *f = None);
        }
    }
}

/// The highest channel number a step may name: each channel is a set of
/// connections (and, over shm, of shared FIFOs) of its own, so a schedule
/// that named a wild one would make thousands.
pub(crate) const MAX_CHANNELS: usize = 31;

fn gone(peer: usize, call: &Call) -> Error {
    Error::PeerFailed {
        rank: peer,
        during: call.during(),
        reason: "its connection was already closed".into(),
    }
}
