//! The executor's FIFO memory shared between processes (issue 16, the
//! cuda-ipc path): each rank's FIFO region made mappable by the other
//! processes of the communicator, the descriptors that VMM (and the host
//! stand-in) handles need passed over Unix sockets, and the peers'
//! regions mapped here, at this process's own addresses.
//!
//! - **The region.** On a GPU, a `ferroccl_cuda_ipc::SharedAlloc` (VMM
//!   where the device has it with POSIX fd handles, else legacy IPC),
//!   zeroed; on the host stand-in, a `HostShared` (a shared file). Its
//!   wire form (`Share::wire`) says which, with the handle; a rank of one
//!   kind cannot map the other's (refused, named).
//! - **The descriptors.** Where a handle carries a descriptor, the owner
//!   listens on a Unix socket of the abstract namespace (per network
//!   namespace, which the host identity already compares) under a name
//!   with its pid and a random part, published beside the handle. Every
//!   importer connects and asks, giving its rank; the owner checks with
//!   `SO_PEERCRED` that the process at the other end is that rank's (its
//!   pid from the first round) before it sends the descriptor. Each rank
//!   connects to all the owners it needs first, then serves every
//!   importer, then reads its answers: the listeners exist before the
//!   addresses are published, so no rank waits on another's order, and
//!   every wait is bounded by the set-up's deadline (a timeout naming the
//!   peer).
//! - **The mappings.** The peer's region mapped on this rank's device
//!   (`Mapped::import`), or in this process (`HostMapped`): its address
//!   goes in the `Conn` table in place of the owner's.

use crate::error::{Error, Result};
use ferroccl_cuda::device::Engine;
use ferroccl_cuda_ipc::{
    fdpass, HostMapped, HostShared, Mapped, Mechanism, ShareHandle, SharedAlloc,
};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};

/// The wire kinds of a region's handle.
const KIND_STAND_IN: u8 = 1;
const KIND_CUDA: u8 = 2;
/// An importer's request: magic, its rank, the owner's rank.
const ASK_MAGIC: [u8; 4] = *b"FXF1";
const ASK_LEN: usize = 12;

/// A rank's FIFO region, shareable with other processes.
pub(crate) enum Share {
    StandIn(HostShared),
    Cuda(SharedAlloc),
}

impl Share {
    /// `bytes` (at least) of zeroed memory kernels of `engine` (device
    /// `ordinal`) reach, shareable with other processes.
    pub(crate) fn new(engine: &dyn Engine, ordinal: u32, bytes: usize) -> Result<Share> {
        let bytes = bytes.max(1);
        if engine.stand_in_uuid().is_some() {
            let r = HostShared::new(bytes)
                .map_err(|e| Error::Io(format!("a shared FIFO region of {bytes} bytes: {e}")))?;
            // A GPU's region is zeroed and the context synchronized
            // (`SharedAlloc::zero`): the stand-in synchronizes as it does,
            // so a region made while a gate is held is caught.
            engine
                .synchronize("cuCtxSynchronize (zeroing shared FIFO memory)")
                .map_err(|e| Error::Io(format!("a shared FIFO region: {e}")))?;
            return Ok(Share::StandIn(r));
        }
        let cuda = |e: ferroccl_cuda::CudaError| {
            Error::Io(format!(
                "a shared FIFO region of {bytes} bytes on device {ordinal}: {e}"
            ))
        };
        let r = SharedAlloc::with_mechanism(ordinal, bytes, &[], Mechanism::Auto).map_err(cuda)?;
        r.zero().map_err(cuda)?;
        Ok(Share::Cuda(r))
    }

    /// Its address for this process's kernels.
    pub(crate) fn address(&self) -> u64 {
        match self {
            Share::StandIn(r) => r.ptr(),
            Share::Cuda(r) => r.ptr(),
        }
    }

    /// What a peer needs to map it (with the descriptor, where
    /// [`Share::carries_fd`]).
    pub(crate) fn wire(&self) -> Vec<u8> {
        match self {
            Share::StandIn(r) => {
                let mut out = vec![KIND_STAND_IN];
                out.extend((r.size() as u64).to_le_bytes());
                out
            }
            Share::Cuda(r) => {
                let mut out = vec![KIND_CUDA];
                out.extend(r.handle().encode());
                out
            }
        }
    }

    /// Whether a descriptor must travel beside the wire form.
    pub(crate) fn carries_fd(&self) -> bool {
        match self {
            Share::StandIn(_) => true,
            Share::Cuda(r) => r.handle().carries_fd(),
        }
    }

    /// A descriptor of the region for one peer.
    fn fd(&self) -> Result<OwnedFd> {
        match self {
            Share::StandIn(r) => r
                .fd()
                .try_clone_to_owned()
                .map_err(|e| Error::Io(format!("the shared FIFO region's descriptor: {e}"))),
            Share::Cuda(r) => match r.export_fd() {
                Ok(Some(fd)) => Ok(fd),
                Ok(None) => Err(Error::Io(
                    "a legacy IPC region has no descriptor to send".into(),
                )),
                Err(e) => Err(Error::Io(format!("exporting the FIFO region: {e}"))),
            },
        }
    }
}

/// A peer's region mapped here.
#[allow(dead_code)] // held for its Drop: the mapping lives as long as the executor
pub(crate) enum PeerRegion {
    StandIn(HostMapped),
    Cuda(Mapped),
}

impl PeerRegion {
    /// Its address for this process's kernels.
    pub(crate) fn address(&self) -> u64 {
        match self {
            PeerRegion::StandIn(r) => r.ptr(),
            PeerRegion::Cuda(r) => r.ptr(),
        }
    }
}

/// A peer's handle as published: what it is and whether a descriptor
/// must be fetched for it. Refused where the bytes are no handle.
pub(crate) fn parse_wire(rank: usize, wire: &[u8]) -> Result<(bool, usize)> {
    let bad = |why: String| Error::Bootstrap(format!("rank {rank}'s FIFO handle: {why}"));
    match wire {
        [KIND_STAND_IN, size @ ..] => {
            let size: [u8; 8] = size
                .try_into()
                .map_err(|_| bad(format!("{} bytes", wire.len())))?;
            let size = u64::from_le_bytes(size);
            let size = usize::try_from(size)
                .ok()
                .filter(|&s| s > 0)
                .ok_or_else(|| bad(format!("a region of {size} bytes")))?;
            Ok((true, size))
        }
        [KIND_CUDA, h @ ..] => {
            let h = ShareHandle::decode(h).map_err(|e| bad(e.to_string()))?;
            Ok((h.carries_fd(), h.size() as usize))
        }
        [k, ..] => Err(bad(format!("unknown kind {k}"))),
        [] => Err(bad("empty".into())),
    }
}

/// Map rank `owner`'s region from its wire form (and descriptor) for
/// kernels of `engine`, device `ordinal`. `Err` says why not (the
/// set-up then stays staged on every rank).
pub(crate) fn map_peer(
    engine: &dyn Engine,
    ordinal: u32,
    owner: usize,
    wire: &[u8],
    fd: Option<&OwnedFd>,
) -> std::result::Result<PeerRegion, String> {
    let stand_in = engine.stand_in_uuid().is_some();
    match (wire.first(), stand_in) {
        (Some(&KIND_STAND_IN), true) => {
            let (_, size) = parse_wire(owner, wire).map_err(|e| e.to_string())?;
            let fd =
                fd.ok_or_else(|| format!("rank {owner}'s region came without its descriptor"))?;
            HostMapped::import(fd.as_fd(), size)
                .map(PeerRegion::StandIn)
                .map_err(|e| format!("mapping rank {owner}'s FIFO region: {e}"))
        }
        (Some(&KIND_CUDA), false) => {
            let h = ShareHandle::decode(&wire[1..]).map_err(|e| e.to_string())?;
            Mapped::import(ordinal, &h, fd.map(|f| f.as_fd()), &[])
                .map(PeerRegion::Cuda)
                .map_err(|e| format!("mapping rank {owner}'s FIFO region on device {ordinal}: {e}"))
        }
        _ => Err(format!(
            "rank {owner}'s FIFO region is on a {} and this rank's device is a {}",
            if wire.first() == Some(&KIND_CUDA) {
                "GPU"
            } else {
                "host stand-in"
            },
            if stand_in { "host stand-in" } else { "GPU" }
        )),
    }
}

/// The socket a rank hands its region's descriptor out on.
pub(crate) struct FdServer {
    listener: UnixListener,
    name: Vec<u8>,
}

impl FdServer {
    /// A listener in the abstract namespace under a fresh name.
    pub(crate) fn bind() -> Result<FdServer> {
        let mut last = None;
        for _ in 0..4 {
            let name = format!(
                "ferroccl-fifo-{}-{:016x}",
                std::process::id(),
                crate::config::random_u64()
            )
            .into_bytes();
            let addr = SocketAddr::from_abstract_name(&name)
                .map_err(|e| Error::Io(format!("a Unix socket name: {e}")))?;
            match UnixListener::bind_addr(&addr) {
                Ok(listener) => {
                    listener
                        .set_nonblocking(true)
                        .map_err(|e| Error::Io(format!("the FIFO descriptor socket: {e}")))?;
                    return Ok(FdServer { listener, name });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(Error::Io(format!(
            "binding the FIFO descriptor socket: {}",
            last.expect("tried")
        )))
    }

    /// Its name, to publish.
    pub(crate) fn name(&self) -> &[u8] {
        &self.name
    }

    /// Serve `askers` (ranks and their pids): each gets a descriptor of
    /// `share`, once the process at the other end is shown to be the
    /// rank's. Connections from anything else are closed and not counted.
    pub(crate) fn serve(
        &self,
        me: usize,
        share: &Share,
        askers: &[(usize, u32)],
        deadline: Instant,
        during: &str,
    ) -> Result<()> {
        let started = Instant::now();
        let mut left: Vec<(usize, u32)> = askers.to_vec();
        // Connections that named a rank but came from another process: said
        // in the timeout (ranks in other PID namespaces would show here).
        let mut strangers = Vec::new();
        while !left.is_empty() {
            let sock = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout {
                            peer: left[0].0,
                            during: during.to_string(),
                            what: format!(
                                "its request for this rank's FIFO region{}",
                                if strangers.is_empty() {
                                    String::new()
                                } else {
                                    format!(" (refused: {})", strangers.join("; "))
                                }
                            ),
                            waited_ms: started.elapsed().as_millis() as u64,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(e) => return Err(Error::Io(format!("accepting on the FIFO socket: {e}"))),
            };
            // A stranger, or a request that is not ours, is dropped.
            let Some(rank) = read_ask(&sock, me, deadline) else {
                continue;
            };
            let Some(at) = left.iter().position(|&(r, _)| r == rank) else {
                continue;
            };
            match fdpass::peer_pid(&sock) {
                Ok(pid) if pid == left[at].1 => {}
                Ok(pid) => {
                    strangers.push(format!(
                        "a request as rank {rank} from pid {pid}, not its pid {}",
                        left[at].1
                    ));
                    continue;
                }
                Err(e) => {
                    strangers.push(format!("a request as rank {rank}: SO_PEERCRED: {e}"));
                    continue;
                }
            }
            let fd = share.fd()?;
            fdpass::send_fds(&sock, &[1], &[fd.as_fd()], deadline).map_err(|e| {
                Error::Io(format!(
                    "{during}: sending rank {rank} the FIFO region's descriptor: {e}"
                ))
            })?;
            left.swap_remove(at);
        }
        Ok(())
    }
}

/// Read an importer's request: its rank, where it is well formed and for
/// `me`.
fn read_ask(sock: &UnixStream, me: usize, deadline: Instant) -> Option<usize> {
    let left = deadline.checked_duration_since(Instant::now())?;
    sock.set_nonblocking(false).ok()?;
    sock.set_read_timeout(Some(
        left.clamp(Duration::from_millis(1), Duration::from_secs(5)),
    ))
    .ok()?;
    let mut ask = [0u8; ASK_LEN];
    (&*sock).read_exact(&mut ask).ok()?;
    let word = |i: usize| u32::from_le_bytes(ask[i..i + 4].try_into().expect("4 bytes"));
    if ask[..4] != ASK_MAGIC || word(8) as usize != me {
        return None;
    }
    Some(word(4) as usize)
}

/// Connect to rank `owner`'s socket and ask for its region as rank `me`.
pub(crate) fn ask(owner: usize, name: &[u8], me: usize, during: &str) -> Result<UnixStream> {
    let addr = SocketAddr::from_abstract_name(name)
        .map_err(|e| Error::Bootstrap(format!("rank {owner}'s FIFO socket name: {e}")))?;
    let mut sock = UnixStream::connect_addr(&addr).map_err(|e| {
        Error::Io(format!(
            "{during}: connecting to rank {owner}'s FIFO socket: {e}"
        ))
    })?;
    let mut msg = ASK_MAGIC.to_vec();
    msg.extend((me as u32).to_le_bytes());
    msg.extend((owner as u32).to_le_bytes());
    sock.write_all(&msg).map_err(|e| {
        Error::Io(format!(
            "{during}: asking rank {owner} for its FIFO region: {e}"
        ))
    })?;
    Ok(sock)
}

/// Rank `owner`'s answer on `sock`: its region's descriptor.
pub(crate) fn answer(
    owner: usize,
    sock: &UnixStream,
    deadline: Instant,
    during: &str,
) -> Result<OwnedFd> {
    let started = Instant::now();
    let mut byte = [0u8; 1];
    let fds = fdpass::recv_exact_fds(sock, &mut byte, 1, deadline).map_err(|e| match e {
        fdpass::FdPassError::Timeout { .. } => Error::Timeout {
            peer: owner,
            during: during.to_string(),
            what: "its FIFO region's descriptor".into(),
            waited_ms: started.elapsed().as_millis() as u64,
        },
        other => Error::Io(format!(
            "{during}: rank {owner}'s FIFO region's descriptor: {other}"
        )),
    })?;
    match (byte, <[OwnedFd; 1]>::try_from(fds)) {
        ([1], Ok([fd])) => Ok(fd),
        (_, got) => Err(Error::Protocol {
            peer: owner,
            during: during.to_string(),
            detail: format!(
                "its FIFO region's answer was byte {} with {} descriptors",
                byte[0],
                got.map_or_else(|v| v.len(), |_| 1)
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroccl_cuda::host_engine::HostEngine;

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    /// A stand-in region handed to a "peer" through the socket exchange
    /// (one process plays both sides: the pid check then expects this
    /// process's own pid) is the same memory at another address.
    #[test]
    fn a_region_crosses_the_socket_and_maps() {
        let e = HostEngine::new();
        let share = Share::new(&e, 0, 4096).unwrap();
        assert!(share.carries_fd());
        let wire = share.wire();
        assert_eq!(parse_wire(1, &wire).unwrap(), (true, 4096));
        let server = FdServer::bind().unwrap();
        let pid = std::process::id();
        let sock = ask(1, server.name(), 0, "test").unwrap();
        server
            .serve(1, &share, &[(0, pid)], deadline(), "test")
            .unwrap();
        let fd = answer(1, &sock, deadline(), "test").unwrap();
        let peer = map_peer(&e, 0, 1, &wire, Some(&fd)).unwrap();
        assert_ne!(peer.address(), share.address());
    }

    /// A request from a process that is not the rank's, or for another
    /// owner, gets no descriptor, and the wait ends at the deadline naming
    /// the rank still missing and what was refused.
    #[test]
    fn strangers_get_nothing_and_the_wait_is_bounded() {
        let e = HostEngine::new();
        let share = Share::new(&e, 0, 4096).unwrap();
        let server = FdServer::bind().unwrap();
        // Asks as rank 0, but rank 0 is said to be another process.
        let _sock = ask(1, server.name(), 0, "test").unwrap();
        // Asks for owner 5, not 1.
        let _other = ask(5, server.name(), 0, "test").unwrap();
        let soon = Instant::now() + Duration::from_millis(300);
        let err = server
            .serve(1, &share, &[(0, std::process::id() + 1)], soon, "test")
            .unwrap_err();
        assert_eq!(err.failed_rank(), Some(0), "{err}");
        assert!(err.to_string().contains("not its pid"), "{err}");
    }

    /// Handles from the wire that are no handle are refused with the
    /// rank; a stand-in cannot map a GPU's region nor the reverse.
    #[test]
    fn bad_handles_are_refused() {
        for bad in [&[][..], &[9, 1, 2][..], &[KIND_STAND_IN, 1, 2, 3][..]] {
            let err = parse_wire(3, bad).unwrap_err();
            assert!(err.to_string().contains("rank 3"), "{err}");
        }
        let zero = [vec![KIND_STAND_IN], 0u64.to_le_bytes().to_vec()].concat();
        assert!(parse_wire(3, &zero).is_err());
        assert!(parse_wire(3, &[KIND_CUDA, 0, 0]).is_err());
        let e = HostEngine::new();
        let cuda = [vec![KIND_CUDA], vec![0; 88]].concat();
        let why = map_peer(&e, 0, 2, &cuda, None).err().unwrap();
        assert!(why.contains("rank 2's FIFO region is on a GPU"), "{why}");
        let stand_in = Share::new(&e, 0, 64).unwrap().wire();
        let why = map_peer(&e, 0, 2, &stand_in, None).err().unwrap();
        assert!(why.contains("without its descriptor"), "{why}");
    }
}
