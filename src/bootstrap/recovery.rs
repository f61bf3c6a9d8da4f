//! The survivors' meeting point, used by `Communicator::shrink`: one TCP
//! listener per process whose address each rank publishes in its
//! rendezvous when it joins, and which every member of a communicator reads
//! when the communicator is built, so that the survivors of a failure can
//! find each other again without the rendezvous (its host, rank 0, may be
//! the rank that died). It owns the shrink's two messages, a survivor's
//! proposal to the leader and the leader's verdict, and nothing else: who
//! leads and what the verdict says is decided in `comm/shrink.rs`.
//!
//! Every length read from the wire is bounded before use, and a proposal
//! without the job's token is dropped before it is kept.

use crate::error::{Error, Result};
use ferroccl_transport::lock;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

const MAGIC: u32 = 0x5348_524b; // "SHRK"
const VERDICT_JOIN: u8 = 1;
const VERDICT_REFUSED: u8 = 2;
/// The most ranks a proposal or verdict may list.
const MAX_RANKS: usize = 1 << 16;
/// The longest reason or address a verdict may carry.
const MAX_TEXT: usize = 4096;
/// Proposals kept unclaimed at most (a leader that never came, a stranger
/// that guessed the token): the oldest go first.
const MAX_PENDING: usize = 1024;
/// How long a connecting survivor may take to send its proposal.
const PROPOSAL_READ: Duration = Duration::from_secs(5);

/// The key under which global rank `rank` publishes its meeting point.
pub(crate) fn key(rank: usize) -> String {
    format!("recovery/{rank}")
}

/// A survivor's proposal for a shrink: who it is, whom it takes for the
/// leader, and which ranks it holds failed (old communicator ranks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proposal {
    pub(crate) token: u64,
    /// Names the shrink: the same on every survivor of one communicator.
    pub(crate) key: u64,
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) failed: Vec<usize>,
}

/// What the leader tells each survivor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Join the new communicator: its members (old ranks, in new rank
    /// order), its rendezvous and its id.
    Join {
        members: Vec<usize>,
        store: SocketAddr,
        comm_id: u64,
    },
    /// The shrink failed, or this survivor is not among its members.
    Refused(String),
}

fn put_ranks(p: &mut Vec<u8>, ranks: &[usize]) {
    p.extend_from_slice(&(ranks.len() as u32).to_le_bytes());
    for &r in ranks {
        p.extend_from_slice(&(r as u32).to_le_bytes());
    }
}

fn put_text(p: &mut Vec<u8>, text: &str) {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    p.extend_from_slice(&(end as u32).to_le_bytes());
    p.extend_from_slice(&text.as_bytes()[..end]);
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

fn read_ranks(r: &mut impl Read) -> std::io::Result<Vec<usize>> {
    let n = read_u32(r)? as usize;
    if n > MAX_RANKS {
        return Err(bad("too many ranks"));
    }
    (0..n).map(|_| read_u32(r).map(|x| x as usize)).collect()
}

fn read_text(r: &mut impl Read) -> std::io::Result<String> {
    let n = read_u32(r)? as usize;
    if n > MAX_TEXT {
        return Err(bad("text too long"));
    }
    let mut b = vec![0u8; n];
    r.read_exact(&mut b)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

impl Proposal {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(32 + 4 * self.failed.len());
        p.extend_from_slice(&MAGIC.to_le_bytes());
        p.extend_from_slice(&self.token.to_le_bytes());
        p.extend_from_slice(&self.key.to_le_bytes());
        p.extend_from_slice(&(self.from as u32).to_le_bytes());
        p.extend_from_slice(&(self.to as u32).to_le_bytes());
        put_ranks(&mut p, &self.failed);
        p
    }

    pub(crate) fn decode(r: &mut impl Read) -> std::io::Result<Proposal> {
        if read_u32(r)? != MAGIC {
            return Err(bad("not a shrink proposal"));
        }
        Ok(Proposal {
            token: read_u64(r)?,
            key: read_u64(r)?,
            from: read_u32(r)? as usize,
            to: read_u32(r)? as usize,
            failed: read_ranks(r)?,
        })
    }
}

impl Verdict {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut p = MAGIC.to_le_bytes().to_vec();
        match self {
            Verdict::Join {
                members,
                store,
                comm_id,
            } => {
                p.push(VERDICT_JOIN);
                p.extend_from_slice(&comm_id.to_le_bytes());
                put_text(&mut p, &store.to_string());
                put_ranks(&mut p, members);
            }
            Verdict::Refused(why) => {
                p.push(VERDICT_REFUSED);
                put_text(&mut p, why);
            }
        }
        p
    }

    pub(crate) fn decode(r: &mut impl Read) -> std::io::Result<Verdict> {
        if read_u32(r)? != MAGIC {
            return Err(bad("not a shrink verdict"));
        }
        let mut kind = [0u8; 1];
        r.read_exact(&mut kind)?;
        match kind[0] {
            VERDICT_JOIN => {
                let comm_id = read_u64(r)?;
                let store = read_text(r)?
                    .parse()
                    .map_err(|_| bad("a verdict's address does not parse"))?;
                Ok(Verdict::Join {
                    members: read_ranks(r)?,
                    store,
                    comm_id,
                })
            }
            VERDICT_REFUSED => Ok(Verdict::Refused(read_text(r)?)),
            _ => Err(bad("unknown verdict")),
        }
    }
}

/// Proposals received and not yet claimed, with the connection to answer
/// on, and the signal that one arrived.
type Pending = Arc<(Mutex<Vec<(Proposal, TcpStream)>>, Condvar)>;

/// This process's meeting point: the listener and the proposals it received
/// that no leader has claimed yet.
pub(crate) struct MeetingPoint {
    port: u16,
    pending: Pending,
}

/// The process's meeting point, started on first use; an error (no socket
/// could be bound) is kept and returned to every caller.
pub(crate) fn meeting_point() -> std::result::Result<&'static MeetingPoint, String> {
    static POINT: OnceLock<std::result::Result<MeetingPoint, String>> = OnceLock::new();
    POINT
        .get_or_init(|| MeetingPoint::start().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(Clone::clone)
}

impl MeetingPoint {
    fn start() -> Result<MeetingPoint> {
        // Every interface: the address published names the one this rank
        // reaches the rendezvous from.
        let listener = TcpListener::bind(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0))?;
        let port = listener.local_addr()?.port();
        let pending: Pending = Arc::default();
        let shared = pending.clone();
        std::thread::Builder::new()
            .name("ferroccl-meeting".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    let shared = shared.clone();
                    // One short-lived thread per survivor: a slow one holds
                    // up nobody else.
                    let _ = std::thread::Builder::new()
                        .name("ferroccl-meeting-read".into())
                        .spawn(move || {
                            let mut stream = stream;
                            let _ = stream.set_read_timeout(Some(PROPOSAL_READ));
                            if let Ok(p) = Proposal::decode(&mut stream) {
                                let (list, arrived) = &*shared;
                                let mut list = lock(list);
                                if list.len() >= MAX_PENDING {
                                    list.remove(0);
                                }
                                list.push((p, stream));
                                arrived.notify_all();
                            }
                        });
                }
            })?;
        Ok(MeetingPoint { port, pending })
    }

    /// The address to publish, on the interface `ip` (where this rank
    /// reaches its rendezvous; the loopback when that is in-process).
    pub(crate) fn address(&self, ip: Option<IpAddr>) -> SocketAddr {
        SocketAddr::new(ip.unwrap_or(Ipv4Addr::LOCALHOST.into()), self.port)
    }

    /// Take the proposals for shrink `key` addressed to rank `to` with the
    /// job's `token`, waiting until every rank of `expected` has proposed or
    /// `deadline`; proposals from other ranks that come meanwhile are taken
    /// too (the caller decides about them).
    pub(crate) fn gather(
        &self,
        token: u64,
        key: u64,
        to: usize,
        expected: &[usize],
        deadline: Instant,
    ) -> Vec<(Proposal, TcpStream)> {
        let (list, arrived) = &*self.pending;
        let mut taken: Vec<(Proposal, TcpStream)> = Vec::new();
        let mut list = lock(list);
        loop {
            let mut i = 0;
            while i < list.len() {
                let p = &list[i].0;
                if p.key == key && p.to == to && p.token == token {
                    let got = list.remove(i);
                    // A survivor that proposed twice (a retry) counts once,
                    // with its last proposal.
                    taken.retain(|(q, _)| q.from != got.0.from);
                    taken.push(got);
                } else {
                    i += 1;
                }
            }
            let all_in = expected
                .iter()
                .all(|r| taken.iter().any(|(p, _)| p.from == *r));
            let now = Instant::now();
            if all_in || now >= deadline {
                return taken;
            }
            list = arrived
                .wait_timeout(list, (deadline - now).min(Duration::from_millis(100)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Send `proposal` to the leader at `leader` and wait for its verdict until
/// `deadline`.
pub(crate) fn propose(
    leader: SocketAddr,
    proposal: &Proposal,
    deadline: Instant,
) -> Result<Verdict> {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut stream = TcpStream::connect_timeout(&leader, left.max(Duration::from_millis(10)))?;
    let _ = stream.set_nodelay(true);
    stream.write_all(&proposal.encode())?;
    let left = deadline.saturating_duration_since(Instant::now());
    stream.set_read_timeout(Some(left.max(Duration::from_millis(10))))?;
    Verdict::decode(&mut stream).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            Error::Bootstrap(format!(
                "no verdict from the shrink's leader at {leader} before the deadline"
            ))
        } else {
            Error::Bootstrap(format!("the shrink's leader at {leader}: {e}"))
        }
    })
}

/// Send `verdict` on a proposer's connection (bounded: a proposer that
/// takes nothing for a few seconds is gone).
pub(crate) fn answer(stream: &mut TcpStream, verdict: &Verdict) {
    let _ = stream.set_write_timeout(Some(Duration::from_secs(5)));
    let _ = stream.write_all(&verdict.encode());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_bytes_are_refused() {
        let p = Proposal {
            token: 7,
            key: 9,
            from: 3,
            to: 1,
            failed: vec![0, 2],
        };
        assert_eq!(Proposal::decode(&mut &p.encode()[..]).unwrap(), p);
        let v = Verdict::Join {
            members: vec![1, 3, 4],
            store: "127.0.0.1:4242".parse().unwrap(),
            comm_id: 11,
        };
        assert_eq!(Verdict::decode(&mut &v.encode()[..]).unwrap(), v);
        let r = Verdict::Refused("rank 2 said so".into());
        assert_eq!(Verdict::decode(&mut &r.encode()[..]).unwrap(), r);
        // A rank count past the bound is refused before anything is read.
        let mut huge = p.encode();
        let at = huge.len() - 4 * 2 - 4;
        huge[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Proposal::decode(&mut &huge[..]).is_err());
        assert!(Verdict::decode(&mut &[0u8; 3][..]).is_err());
        let mut wrong = v.encode();
        wrong[4] = 9;
        assert!(Verdict::decode(&mut &wrong[..]).is_err());
    }
}
