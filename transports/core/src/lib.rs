//! The transport seam of ferroccl: what every transport (shm, tcp, ib, and
//! the in-process `mem`) implements, and the wire header they all carry.
//! (cuda-ipc implements no transport yet: the device executor makes its
//! FIFOs itself and shares them through `ferroccl-cuda-ipc`.)
//!
//! A connection between two ranks is a FIFO of `steps` slots of `chunk_bytes`
//! each, in each direction. The sender fills a free slot and publishes it;
//! the receiver consumes a filled slot and releases it. Nothing here knows
//! about collectives, element types or algorithms: that is the executor's
//! business, one layer up. This crate's `unsafe` is the vector loop of
//! its byte copy (`copy`, [`copy_bytes`]) and the prefetches
//! ([`prefetch_for_write`], [`prefetch_for_read`]): hardware instructions
//! with no safe wrapper.
//!
//! - [`Transport`] and [`Listener`] are the set-up half: a connection comes
//!   back as a [`Connection`] that describes each direction's FIFO
//!   ([`FifoDescriptor`], `fifo`) and, for transports whose bytes the CPU
//!   moves, carries the host data path over it ([`HostPath`]: the
//!   [`SlotSender`] and [`SlotReceiver`] halves).
//! - `frame` is the 40-byte header every frame carries.
//! - `shared` is the seam to memory every rank of a host maps
//!   ([`SharedMemory`], [`SharedRegion`]); `wait` the policy of waiting on
//!   such memory.
//! - `mem` is the in-process transport; `conformance` (feature
//!   `conformance`) the cases every transport must pass.
#![warn(missing_docs, unreachable_pub)]

mod abort;
mod arrivals;
#[cfg(feature = "conformance")]
pub mod conformance;
mod copy;
mod fifo;
mod frame;
pub mod mem;
mod shared;
pub mod wait;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub use abort::{AbortHandle, AbortSignal};
pub use arrivals::Arrivals;
pub use copy::{
    choose_shared_copy, copy_bytes, copy_from_shared, copy_from_shared_by_lines, copy_into_shared,
    copy_pages, copy_streams, memcpy_keeps_pace, pages_enabled, prefetch_for_read,
    prefetch_for_write, shared_copy_from_env, PAGES_BLOCK, PAGES_MAX, VECTOR_MIN,
};
pub use fifo::{
    Counter, FifoDescriptor, InlinePayload, Mapping, MemoryKind, PayloadPlacement, SlotLayout,
};
pub use frame::{Fingerprint, FrameHeader, FrameKind, HEADER_BYTES, MAGIC};
pub use shared::{SharedMemory, SharedRegion};

/// The value of an on/off environment variable, as every FERROCCL_ flag
/// reads it: `0`, `false`, `off`, `no` are off; `1`, `true`, `on`, `yes`
/// and the empty string on; anything else `None` (the config refuses it).
pub fn flag_value(value: &str) -> Option<bool> {
    match value.trim() {
        "0" | "false" | "off" | "no" => Some(false),
        "1" | "true" | "on" | "yes" | "" => Some(true),
        _ => None,
    }
}

/// A size as FERROCCL_ settings and sysfs write it: a number of bytes with
/// an optional binary suffix (`K`, `M`, `G`, either case), surrounding
/// blanks ignored; anything else, or one past `usize`, `None`.
pub fn size_value(value: &str) -> Option<usize> {
    let v = value.trim();
    let (digits, shift) = match v.char_indices().last()? {
        (i, 'k' | 'K') => (&v[..i], 10),
        (i, 'm' | 'M') => (&v[..i], 20),
        (i, 'g' | 'G') => (&v[..i], 30),
        _ => (v, 0),
    };
    let n: usize = digits.parse().ok()?;
    n.checked_mul(1usize.checked_shl(shift)?)
}

/// Lock `m`, recovering the guard if a holder panicked: what transports
/// guard (error slots, socket lists, free slots) stays consistent across a
/// panic, and tearing a connection down must still work then.
#[inline]
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Number of slots per direction of a connection unless configured otherwise
/// (NCCL uses 8 as well).
pub const DEFAULT_STEPS: usize = 8;

/// Why a transport operation did not complete.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TransportError {
    /// The deadline passed while waiting on `peer`.
    #[error("timed out after {waited_ms} ms waiting for rank {peer} ({what})")]
    Timeout {
        /// The rank waited for.
        peer: usize,
        /// What was being waited for (a slot, a frame, a connection).
        what: &'static str,
        /// How long the wait lasted.
        waited_ms: u64,
    },
    /// The peer closed the connection or its process went away.
    #[error("rank {peer} closed the connection: {detail}")]
    PeerClosed {
        /// The rank at the other end.
        peer: usize,
        /// What the operating system said.
        detail: String,
    },
    /// The peer sent bytes that do not decode (bad magic, oversized frame...).
    #[error("rank {peer} sent an invalid frame: {detail}")]
    Protocol {
        /// The rank at the other end.
        peer: usize,
        /// What was wrong with it.
        detail: String,
    },
    /// A rank reported that another rank failed (through an abort frame or
    /// the failure broadcast of the rendezvous).
    #[error("rank {rank} failed: {reason}")]
    PeerFailed {
        /// The rank that failed.
        rank: usize,
        /// What is known about the failure.
        reason: String,
    },
    /// Connection set-up failed (bind, connect, handshake).
    #[error("could not connect to rank {peer}: {detail}")]
    Connect {
        /// The rank that could not be reached.
        peer: usize,
        /// Why.
        detail: String,
    },
    /// The communicator was aborted locally.
    #[error("aborted")]
    Aborted,
    /// Local I/O failure not attributable to a peer.
    #[error("I/O error: {0}")]
    Io(String),
}

/// What a rank tells its transports about itself, to decide which transport
/// can reach which peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    /// Identity of the host (boot id, hostname, network namespace).
    pub host_id: String,
}

/// Parameters for a listener, shared by every connection it makes.
#[derive(Debug, Clone)]
pub struct ListenConfig {
    /// Rank of this process in the communicator.
    pub rank: usize,
    /// Number of ranks in the communicator.
    pub size: usize,
    /// Job token: peers presenting another token are refused.
    pub token: u64,
    /// Identifies the communicator, so that a connection meant for another
    /// communicator of the same job is refused.
    pub comm_id: u64,
    /// Bytes per slot.
    pub chunk_bytes: usize,
    /// Slots per direction.
    pub steps: usize,
    /// Interface name prefix to bind (FERROCCL_SOCKET_IFNAME); `None` picks one.
    pub ifname: Option<String>,
    /// IP address to bind to; `None` derives it from `ifname` or defaults.
    pub bind_addr: Option<std::net::IpAddr>,
    /// Sockets per peer, for transports that stripe (FERROCCL_NSOCKS_PERPEER).
    pub nsocks: usize,
}

/// A transport: a way to build connections between ranks.
pub trait Transport: Send + Sync {
    /// Short name, as used by FERROCCL_TRANSPORT and in logs ("tcp", "shm").
    fn name(&self) -> &'static str;
    /// Whether this transport can join `local` and `peer`.
    fn can_connect(&self, local: &HostInfo, peer: &HostInfo) -> bool;
    /// Start accepting connections; the listener's address is then published
    /// to the peers through the rendezvous.
    fn listen(
        &self,
        config: &ListenConfig,
        abort: &AbortSignal,
    ) -> Result<Box<dyn Listener>, TransportError>;
}

/// A bound endpoint that accepts connections from peers and opens connections
/// to them. By convention the lower rank connects and the higher rank accepts.
pub trait Listener: Send + Sync {
    /// Opaque address bytes to publish to peers.
    fn address(&self) -> Vec<u8>;
    /// Open a connection to `peer`, whose listener published `address`.
    fn connect(
        &self,
        peer: usize,
        address: &[u8],
        deadline: Instant,
    ) -> Result<Connection, TransportError>;
    /// Wait for `peer` to connect to us.
    fn accept(&self, peer: usize, deadline: Instant) -> Result<Connection, TransportError>;
}

/// One established connection to a peer: where each direction's FIFO is,
/// and (for transports whose bytes the CPU moves) the host data path over
/// it.
pub struct Connection {
    /// The rank at the other end.
    pub peer: usize,
    /// Name of the transport that made it.
    pub transport: &'static str,
    /// The FIFO this rank sends on (to `peer`), as this rank sees it.
    pub send_fifo: FifoDescriptor,
    /// The FIFO this rank receives on (from `peer`), as this rank sees it.
    pub recv_fifo: FifoDescriptor,
    /// The host data path over those FIFOs; None for transports whose
    /// bytes only a device moves (a kernel, an RDMA engine).
    pub host: Option<HostPath>,
    /// Tears the connection down from any thread.
    pub closer: std::sync::Arc<dyn ConnectionCloser>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.peer)
            .field("transport", &self.transport)
            .field("send_fifo", &self.send_fifo)
            .field("recv_fifo", &self.recv_fifo)
            .field("host", &self.host.is_some())
            .finish()
    }
}

/// The host data path over a connection's FIFO descriptions, for
/// transports whose bytes the CPU moves: two independent halves, so that
/// an executor can receive from one peer while it sends to another (or to
/// the same one) in the same step.
pub struct HostPath {
    /// The sending half.
    pub sender: Box<dyn SlotSender>,
    /// The receiving half.
    pub receiver: Box<dyn SlotReceiver>,
}

impl std::fmt::Debug for HostPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostPath")
            .field("chunk_bytes", &self.sender.chunk_bytes())
            .field("peer", &self.receiver.peer())
            .finish()
    }
}

/// Closes a connection from any thread; blocked operations on either half
/// then return an error instead of waiting for their deadline.
pub trait ConnectionCloser: Send + Sync {
    /// Tell the peer that `failed_rank` failed (best effort; used to spread a
    /// failure to ranks that are not next to it), then close.
    fn close_with_failure(&self, failed_rank: usize, reason: &str);
    /// Close the connection without telling the peer anything more.
    fn close(&self);
}

/// When a wait gives up: at a fixed instant, or a time after the wait
/// begins. The second lets a transport skip the clock for a wait that ends
/// at once (a small frame that is already there), where reading it costs as
/// much as the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// At this instant.
    At(Instant),
    /// This long after the wait begins; a transport may count from its
    /// first look at the clock, a few spins into the wait.
    After(Duration),
}

impl Deadline {
    /// The instant, reading the clock now for [`Deadline::After`].
    pub fn instant(self) -> Instant {
        match self {
            Deadline::At(at) => at,
            Deadline::After(wait) => Instant::now() + wait,
        }
    }
}

impl From<Instant> for Deadline {
    fn from(at: Instant) -> Self {
        Deadline::At(at)
    }
}

/// The sending half of a connection.
pub trait SlotSender: Send {
    /// Bytes per slot.
    fn chunk_bytes(&self) -> usize;
    /// Wait for a free slot (until `deadline`), let `fill` write into it and
    /// return how many bytes it wrote (at most `chunk_bytes`), then publish
    /// them to the peer under `header` (whose `len` is set from that count).
    fn send_with(
        &mut self,
        header: FrameHeader,
        deadline: Instant,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), TransportError>;

    /// Send `bytes` (at most `chunk_bytes`) as one frame. Transports that can
    /// put caller memory on the wire directly override this to skip the copy
    /// into a slot; the default copies through `send_with`.
    fn send_from(
        &mut self,
        header: FrameHeader,
        deadline: Instant,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        send_from_via_slot(self, header, deadline, bytes)
    }

    /// Whether `send_from` copies the caller's bytes into a slot (true for
    /// transports whose slots are the medium, such as shared memory). An
    /// executor that has just produced the bytes in one pass can then write
    /// them into the slot in that same pass through `send_with`, instead of
    /// writing them elsewhere and having `send_from` read them again. False
    /// where `send_from` puts caller memory on the wire as it is (TCP).
    fn send_from_copies(&self) -> bool {
        true
    }

    /// `send_with` until a [`Deadline`]; transports whose waits can start
    /// without the clock override it (the default reads it now).
    fn send_with_until(
        &mut self,
        header: FrameHeader,
        deadline: Deadline,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), TransportError> {
        self.send_with(header, deadline.instant(), fill)
    }

    /// Whether `send_sized_until` places a payload by its length (shared
    /// memory moving payloads along its slots); false by default, where
    /// it is `send_with_until` and a caller keeps to `send_from` (which a
    /// transport may serve without a copy, as ib does for registered
    /// memory).
    fn places_payloads(&self) -> bool {
        false
    }

    /// `send_with_until` for a frame whose length the caller knows before
    /// it fills the slot: `fill` gets exactly `len` bytes (at most
    /// `chunk_bytes`) to write. A transport that places a payload by its
    /// length overrides it (shared memory moves payloads along its slots);
    /// the default goes through `send_with_until`.
    fn send_sized_until(
        &mut self,
        header: FrameHeader,
        deadline: Deadline,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), TransportError> {
        frame_fits(len, self.chunk_bytes())?;
        self.send_with_until(header, deadline, &mut |slot| {
            fill(&mut slot[..len]);
            len
        })
    }

    /// `send_from` until a [`Deadline`] (see `send_with_until`).
    fn send_from_until(
        &mut self,
        header: FrameHeader,
        deadline: Deadline,
        bytes: &[u8],
    ) -> Result<(), TransportError> {
        self.send_from(header, deadline.instant(), bytes)
    }
}

/// `SlotSender::send_from` through a slot copy; also the fallback for
/// transports whose fast path does not apply to a given frame.
pub fn send_from_via_slot<S: SlotSender + ?Sized>(
    sender: &mut S,
    header: FrameHeader,
    deadline: Instant,
    bytes: &[u8],
) -> Result<(), TransportError> {
    let n = bytes.len();
    frame_fits(n, sender.chunk_bytes())?;
    sender.send_with(header, deadline, &mut |slot| {
        copy_into_shared(&mut slot[..n], bytes);
        n
    })
}

/// A frame of `n` bytes fits a slot of `room`, or the error that says it
/// does not (before any byte is written).
fn frame_fits(n: usize, room: usize) -> Result<(), TransportError> {
    if n > room {
        return Err(TransportError::Io(format!(
            "a frame of {n} bytes does not fit a {room}-byte slot"
        )));
    }
    Ok(())
}

/// What a receiver hands each filled slot to: the frame's header and its
/// payload bytes; an error it returns is passed through `recv_with`.
pub type Consume<'a> = dyn FnMut(&FrameHeader, &[u8]) -> Result<(), TransportError> + 'a;

/// The receiving half of a connection.
pub trait SlotReceiver: Send {
    /// The rank at the other end.
    fn peer(&self) -> usize;
    /// Bytes per slot.
    fn chunk_bytes(&self) -> usize;
    /// Wait for the next filled slot (until `deadline`), hand its header and
    /// bytes to `consume`, then release the slot to the sender. An error from
    /// `consume` is passed through and the slot is still released.
    fn recv_with(
        &mut self,
        deadline: Instant,
        consume: &mut Consume<'_>,
    ) -> Result<(), TransportError>;

    /// Receive the next frame's payload straight into `dst`, after `check`
    /// has accepted its header (`check` sees the header before any payload
    /// byte is placed; its error is passed through). The payload length must
    /// equal `dst.len()`, else a `Protocol` error. Transports that read the
    /// wire on the calling thread override this to skip the slot; the
    /// default copies out of the slot.
    fn recv_into(
        &mut self,
        deadline: Instant,
        check: &mut dyn FnMut(&FrameHeader) -> Result<(), TransportError>,
        dst: &mut [u8],
    ) -> Result<(), TransportError> {
        recv_into_via_slot(self, deadline, check, dst)
    }

    /// Whether `recv_into` copies out of a slot (true unless overridden):
    /// an executor that wants to write `dst` in its own way (streaming
    /// stores, say) can then use `recv_with` at no extra cost. False where
    /// `recv_into` reads the wire straight into `dst` (TCP).
    fn recv_into_copies(&self) -> bool {
        true
    }

    /// `recv_with` until a [`Deadline`]; transports whose waits can start
    /// without the clock override it (the default reads it now).
    fn recv_with_until(
        &mut self,
        deadline: Deadline,
        consume: &mut Consume<'_>,
    ) -> Result<(), TransportError> {
        self.recv_with(deadline.instant(), consume)
    }

    /// `recv_into` until a [`Deadline`] (see `recv_with_until`).
    fn recv_into_until(
        &mut self,
        deadline: Deadline,
        check: &mut dyn FnMut(&FrameHeader) -> Result<(), TransportError>,
        dst: &mut [u8],
    ) -> Result<(), TransportError> {
        self.recv_into(deadline.instant(), check, dst)
    }
}

/// `SlotReceiver::recv_into` through a slot copy.
pub fn recv_into_via_slot<R: SlotReceiver + ?Sized>(
    receiver: &mut R,
    deadline: Instant,
    check: &mut dyn FnMut(&FrameHeader) -> Result<(), TransportError>,
    dst: &mut [u8],
) -> Result<(), TransportError> {
    let peer = receiver.peer();
    receiver.recv_with(deadline, &mut |header, bytes| {
        deliver_into(peer, header, bytes, check, dst)
    })
}

/// What `recv_into` does with a received frame, wherever its bytes are:
/// let `check` accept the header, then copy the payload into `dst`, which it
/// must fill exactly (else a `Protocol` error naming `peer`, and no byte of
/// `dst` is written).
pub fn deliver_into(
    peer: usize,
    header: &FrameHeader,
    bytes: &[u8],
    check: &mut dyn FnMut(&FrameHeader) -> Result<(), TransportError>,
    dst: &mut [u8],
) -> Result<(), TransportError> {
    check(header)?;
    if bytes.len() != dst.len() {
        return Err(TransportError::Protocol {
            peer,
            detail: format!(
                "frame of {} bytes where {} were expected",
                bytes.len(),
                dst.len()
            ),
        });
    }
    copy_bytes(dst, bytes);
    Ok(())
}

/// Milliseconds between `start` and now, for error messages.
pub fn elapsed_ms(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod deliver_tests {
    use super::*;

    fn header() -> FrameHeader {
        FrameHeader::data(Fingerprint::default(), 3)
    }

    /// A delivery copies a frame exactly, refuses a frame of the wrong
    /// length naming the peer without writing a byte, and passes on the
    /// check's refusal.
    #[test]
    fn deliveries_copy_exactly_and_refuse_alike() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 1) as u8).collect();
        let mut dst = vec![0u8; 5000];
        deliver_into(4, &header(), &src[3..], &mut |_| Ok(()), &mut dst[..4997]).unwrap();
        assert_eq!(&dst[..4997], &src[3..]);

        let mut dst = vec![0xA5u8; 4000];
        let err = deliver_into(4, &header(), &src, &mut |_| Ok(()), &mut dst).unwrap_err();
        assert!(
            matches!(&err, TransportError::Protocol { peer: 4, detail }
                if detail == "frame of 5000 bytes where 4000 were expected"),
            "{err:?}"
        );
        assert!(dst.iter().all(|&b| b == 0xA5), "wrote on a refusal");

        let refuse = &mut |_: &FrameHeader| Err(TransportError::Aborted);
        let err = deliver_into(4, &header(), &src, refuse, &mut dst).unwrap_err();
        assert!(matches!(err, TransportError::Aborted), "{err:?}");
        assert!(dst.iter().all(|&b| b == 0xA5), "wrote on a refusal");
    }
}

#[cfg(test)]
mod value_tests {
    use super::size_value;

    /// Sizes with binary suffixes, as settings and sysfs ("32768K") write
    /// them; anything else is not a size.
    #[test]
    fn sizes_parse_with_binary_suffixes_and_refuse_the_rest() {
        assert_eq!(size_value("0"), Some(0));
        assert_eq!(size_value("4096"), Some(4096));
        assert_eq!(size_value("512"), Some(512));
        assert_eq!(size_value("256K"), Some(256 << 10));
        assert_eq!(size_value("32768K"), Some(32 << 20));
        assert_eq!(size_value(" 2m "), Some(2 << 20));
        assert_eq!(size_value("1M"), Some(1 << 20));
        assert_eq!(size_value("1G"), Some(1 << 30));
        assert_eq!(size_value("2G"), Some(2 << 30));
        for bad in [
            "",
            "K",
            "-1",
            "1.5M",
            "12KB",
            "12Q",
            "1 MiB",
            "99999999999999999999",
        ] {
            assert_eq!(size_value(bad), None, "{bad}");
        }
    }
}
