//! The unique id: what the ranks of a new communicator need to meet.
//!
//! NCCL's id carries the address where the caller of `ncclGetUniqueId`
//! listens for the ranks. Here rank 0 hosts the job's rendezvous (the
//! library's TCP store, `Communicator::init`), so the id carries the
//! address and port rank 0 will listen on and a random job token that the
//! rendezvous demands of every peer. The caller of `ncclGetUniqueId` must
//! therefore run on rank 0's host (as rank 0 itself, in practice).
//!
//! Layout of the 128 bytes (all ours; a real NCCL id is refused):
//! `0..8` magic `FERROCCL`, `8` layout version 1, `9` address family
//! (4 or 6), `10..12` port (big-endian), `12..28` address (IPv4 in the
//! first 4 bytes), `28..36` token (little-endian), the rest zero.

use crate::abi::{UniqueId, UNIQUE_ID_BYTES};
use crate::status::Failure;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

const MAGIC: &[u8; 8] = b"FERROCCL";
const LAYOUT: u8 = 1;

/// Where rank 0 listens, and the job's token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meeting {
    /// Rank 0's rendezvous address.
    pub addr: SocketAddr,
    /// Job token.
    pub token: u64,
}

impl Meeting {
    /// The 128 bytes of an id.
    pub fn encode(&self) -> UniqueId {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[..8].copy_from_slice(MAGIC);
        b[8] = LAYOUT;
        b[10..12].copy_from_slice(&self.addr.port().to_be_bytes());
        match self.addr.ip() {
            IpAddr::V4(ip) => {
                b[9] = 4;
                b[12..16].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                b[9] = 6;
                b[12..28].copy_from_slice(&ip.octets());
            }
        }
        b[28..36].copy_from_slice(&self.token.to_le_bytes());
        UniqueId { internal: b }
    }

    /// Read an id made by [`Meeting::encode`].
    pub fn decode(id: &UniqueId) -> Result<Meeting, Failure> {
        let b = &id.internal;
        if &b[..8] != MAGIC || b[8] != LAYOUT {
            return Err(Failure::invalid_argument(
                "the ncclUniqueId was not made by this library's ncclGetUniqueId (wrong magic): \
                 every rank must use the id from one ncclGetUniqueId call of this library",
            ));
        }
        let port = u16::from_be_bytes([b[10], b[11]]);
        let ip = match b[9] {
            4 => IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15])),
            6 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&b[12..28]);
                IpAddr::V6(Ipv6Addr::from(o))
            }
            f => {
                return Err(Failure::invalid_argument(format!(
                    "the ncclUniqueId names address family {f}, not 4 or 6: corrupted id"
                )))
            }
        };
        if port == 0 {
            return Err(Failure::invalid_argument(
                "the ncclUniqueId names port 0: corrupted id",
            ));
        }
        let mut t = [0u8; 8];
        t.copy_from_slice(&b[28..36]);
        Ok(Meeting {
            addr: SocketAddr::new(ip, port),
            token: u64::from_le_bytes(t),
        })
    }

    /// A new meeting for a job whose rank 0 runs in this process's host:
    /// NCCL_COMM_ID (`host:port`, as NCCL reads it) if set, else this
    /// host's address (FERROCCL_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME,
    /// else the first up non-loopback interface) and a port free now.
    pub fn new_here() -> Result<Meeting, Failure> {
        let token = random_token();
        if let Some(fixed) = env("FERROCCL_COMM_ID").or_else(|| env("NCCL_COMM_ID")) {
            use std::net::ToSocketAddrs;
            let addr = fixed
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| {
                    Failure::invalid_argument(format!(
                        "NCCL_COMM_ID='{fixed}' is not a host:port that resolves"
                    ))
                })?;
            return Ok(Meeting { addr, token });
        }
        let ifname = env("FERROCCL_SOCKET_IFNAME").or_else(|| env("NCCL_SOCKET_IFNAME"));
        let listen = ferroccl_transport::ListenConfig {
            rank: 0,
            size: 1,
            token,
            comm_id: 0,
            chunk_bytes: 64,
            steps: 2,
            ifname,
            bind_addr: None,
            nsocks: 1,
        };
        let (_, ip) = ferroccl_tcp::choose_addresses(&listen)
            .map_err(|e| Failure::from(ferroccl::Error::Bootstrap(e.to_string())))?;
        // A port free now; rank 0 binds it in `ncclCommInitRank`.
        let bind = if ip.is_loopback() {
            ip
        } else {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        };
        let port = TcpListener::bind((bind, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| {
                Failure::from(ferroccl::Error::Bootstrap(format!(
                    "no free port for the rendezvous on {bind}: {e}"
                )))
            })?
            .port();
        Ok(Meeting {
            addr: SocketAddr::new(ip, port),
            token,
        })
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// 64 random bits: from the kernel where it answers, else from the hash
/// seed, the clock and the process id.
pub fn random_token() -> u64 {
    use std::io::Read;
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_foreign_ids_are_refused() {
        for addr in ["10.1.2.3:29500", "[fe80::1]:1234", "127.0.0.1:65535"] {
            let m = Meeting {
                addr: addr.parse().unwrap(),
                token: 0x0123_4567_89ab_cdef,
            };
            assert_eq!(Meeting::decode(&m.encode()).unwrap(), m);
        }
        let zero = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        let e = Meeting::decode(&zero).unwrap_err();
        assert_eq!(e.code, crate::abi::result::INVALID_ARGUMENT);
        assert!(e.message.contains("wrong magic"), "{}", e.message);
    }
}
