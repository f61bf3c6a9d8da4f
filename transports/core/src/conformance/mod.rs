//! The cases every transport must pass, for the test harnesses of the
//! transport crates (feature `conformance`; never in normal builds).
//!
//! A harness describes its transport with a [`Suite`] and runs every case
//! with one line: `ferroccl_transport::conformance_tests!(suite_expr);`
//! expands to one `#[test]` per case (a test thread each, so cases run in
//! parallel and fail by name). The cases (in `data_path`, `failure` and
//! `setup`, listed in [`conformance_tests!`](crate::conformance_tests)):
//!
//! - data path: frames arrive in order with their headers and bytes, in
//!   both directions at once, through slot reuse, for sizes 0, 1, around a
//!   small-payload edge, `chunk - 1` and `chunk`; the copying and in-place
//!   entry points agree and mix; the FIFO pushes back when nobody reads and
//!   lets the sender on as the receiver releases; a frame larger than a
//!   slot is refused; `recv_into` of a wrong length is a `Protocol` error
//!   that writes nothing.
//! - failure: deadlines (fixed and relative) are timeouts naming the peer;
//!   abort ends blocked calls promptly; a peer that drops or closes is
//!   `PeerClosed` after its queued frames; a failure report reaches both
//!   ends as `PeerFailed` ahead of queued data.
//! - set-up: wrong token or communicator is refused; connect and accept
//!   pair up by rank; accept times out naming the peer, and aborts; the
//!   FIFO descriptors match the configuration at both ends.
//!
//! Every helper the transport crates' own tests share lives here too, so
//! that there is one copy of each. All ranks are threads of the test
//! process.

pub mod data_path;
pub mod failure;
pub mod setup;

use crate::{
    AbortHandle, AbortSignal, Connection, ConnectionCloser, Fingerprint, FrameHeader, HostPath,
    ListenConfig, Listener, SlotReceiver, SlotSender, Transport, TransportError,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Job token of every suite configuration.
pub const TOKEN: u64 = 0x5eed_0000_c0f0_abcd;
/// Communicator id of every suite configuration.
pub const COMM: u64 = 4242;
/// Ranks of every suite configuration.
pub const SIZE: usize = 4;

/// How a transport pushes back on a sender whose receiver does not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Exactly `steps` frames can be outstanding: the next send waits for
    /// the receiver to release a slot (shm, mem).
    Slots,
    /// Buffers outside the slots (a socket's) take more frames first: a
    /// sender waits only once those are full too, which takes at most
    /// `max_frames` full frames of 64 KiB (tcp).
    Buffered {
        /// Full 64 KiB frames after which a sender must have waited.
        max_frames: usize,
    },
}

/// A transport under test, and what the cases need to know about it.
pub struct Suite {
    name: &'static str,
    make: Box<dyn Fn() -> Box<dyn Transport> + Send + Sync>,
    make_filling: Option<Box<dyn Fn() -> Box<dyn Transport> + Send + Sync>>,
    configure: Box<dyn Fn(&mut ListenConfig) + Send + Sync>,
    flow: Flow,
    clean_close: &'static str,
}

impl std::fmt::Debug for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Suite")
            .field("name", &self.name)
            .field("flow", &self.flow)
            .finish()
    }
}

impl Suite {
    /// The transport `make` builds, whose connections say they are `name`.
    /// Defaults: [`Flow::Slots`], and "peer shut down cleanly" as what a
    /// receiver hears when its peer's sending end went away cleanly.
    pub fn new(
        name: &'static str,
        make: impl Fn() -> Box<dyn Transport> + Send + Sync + 'static,
    ) -> Self {
        Suite {
            name,
            make: Box::new(make),
            make_filling: None,
            configure: Box::new(|_| {}),
            flow: Flow::Slots,
            clean_close: "peer shut down cleanly",
        }
    }

    /// Adjust every listener configuration (bind address, sockets per
    /// peer...) after the suite has set rank, size, token, chunk and steps.
    pub fn configure(mut self, f: impl Fn(&mut ListenConfig) + Send + Sync + 'static) -> Self {
        self.configure = Box::new(f);
        self
    }

    /// The transport of the cases that fill a FIFO with nobody reading
    /// (the one of [`Suite::new`] unless set): for a transport with
    /// buffers outside its slots, one whose buffers are fixed and smaller
    /// than a frame of 64 KiB, so that once a send has waited, a send of
    /// another full frame waits too.
    pub fn filling_transport(
        mut self,
        make: impl Fn() -> Box<dyn Transport> + Send + Sync + 'static,
    ) -> Self {
        self.make_filling = Some(Box::new(make));
        self
    }

    /// How the transport pushes back (see [`Flow`]).
    pub fn flow(mut self, flow: Flow) -> Self {
        self.flow = flow;
        self
    }

    /// The `PeerClosed` detail of a peer's clean departure.
    pub fn clean_close_detail(mut self, detail: &'static str) -> Self {
        self.clean_close = detail;
        self
    }

    /// The transport's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// A new transport.
    pub fn transport(&self) -> Box<dyn Transport> {
        (self.make)()
    }

    /// The configuration of `rank` (of [`SIZE`]).
    pub fn config(&self, rank: usize, chunk_bytes: usize, steps: usize) -> ListenConfig {
        let mut c = ListenConfig {
            rank,
            size: SIZE,
            token: TOKEN,
            comm_id: COMM,
            chunk_bytes,
            steps,
            ifname: None,
            bind_addr: None,
            nsocks: 1,
        };
        (self.configure)(&mut c);
        c
    }

    /// A listener for `config`.
    pub fn listen(&self, config: &ListenConfig, abort: &AbortSignal) -> Box<dyn Listener> {
        self.transport()
            .listen(config, abort)
            .unwrap_or_else(|e| panic!("{}: listen: {e}", self.name))
    }

    /// Rank 0 connects to rank 1, which accepts: (rank 0's end, rank 1's
    /// end), both checked to name their peer and this transport.
    pub fn pair_with(
        &self,
        chunk_bytes: usize,
        steps: usize,
        abort: &AbortSignal,
    ) -> (Connection, Connection) {
        let l0 = self.listen(&self.config(0, chunk_bytes, steps), abort);
        let l1 = self.listen(&self.config(1, chunk_bytes, steps), abort);
        let (c0, c1) = pair_listeners(&*l0, l1);
        assert_eq!(c0.transport, self.name);
        assert_eq!(c1.transport, self.name);
        (c0, c1)
    }

    /// [`Suite::pair_with`] over the filling transport (see
    /// [`Suite::filling_transport`]).
    pub fn pair_filling(
        &self,
        chunk_bytes: usize,
        steps: usize,
        abort: &AbortSignal,
    ) -> (Connection, Connection) {
        let Some(make) = &self.make_filling else {
            return self.pair_with(chunk_bytes, steps, abort);
        };
        let listen = |rank| {
            make()
                .listen(&self.config(rank, chunk_bytes, steps), abort)
                .unwrap_or_else(|e| panic!("{}: listen: {e}", self.name))
        };
        let (l0, l1) = (listen(0), listen(1));
        pair_listeners(&*l0, l1)
    }

    /// [`Suite::pair_with`] under an abort handle of its own.
    pub fn pair(&self, chunk_bytes: usize, steps: usize) -> (Connection, Connection, AbortHandle) {
        let abort = AbortHandle::new();
        let (a, b) = self.pair_with(chunk_bytes, steps, &abort.signal());
        (a, b, abort)
    }

    /// How many frames surely fit a FIFO of `steps` with nobody reading.
    pub fn frames_that_fit(&self, steps: usize) -> usize {
        match self.flow {
            Flow::Slots => steps,
            Flow::Buffered { .. } => steps.max(10),
        }
    }
}

/// Rank 0 (`l0`) connects to rank 1 (`l1`), which accepts on another
/// thread and is dropped there; both ends must name their peer.
pub fn pair_listeners(l0: &dyn Listener, l1: Box<dyn Listener>) -> (Connection, Connection) {
    let addr1 = l1.address();
    let acceptor = std::thread::spawn(move || l1.accept(0, soon(10_000)));
    let c0 = l0.connect(1, &addr1, soon(10_000)).expect("connect");
    let c1 = acceptor.join().unwrap().expect("accept");
    assert_eq!(c0.peer, 1);
    assert_eq!(c1.peer, 0);
    (c0, c1)
}

/// `ms` milliseconds from now.
pub fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// The byte at `index` of frame `frame` sent by rank `from`.
pub fn pattern(from: usize, frame: usize, index: usize) -> u8 {
    let x = (from as u64 + 1)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add((frame as u64) << 32)
        .wrapping_add(index as u64 * 0x2545_f491);
    (x ^ (x >> 29) ^ (x >> 47)) as u8
}

/// `len` bytes of [`pattern`] for frame `frame` from rank `from`.
pub fn payload(from: usize, frame: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(from, frame, i)).collect()
}

/// A header whose every field depends on the sender and the frame.
pub fn header_for(from: usize, frame: usize) -> FrameHeader {
    FrameHeader::data(
        Fingerprint {
            seq: ((from as u64) << 40) | frame as u64,
            coll: (frame % 7) as u8,
            dtype: (frame % 11) as u8,
            op: (frame % 5) as u8,
            count: frame as u64 * 1_000_003,
            root: from as u32,
        },
        frame as u32,
    )
}

/// A data header with a zero fingerprint.
pub fn data(step: u32) -> FrameHeader {
    FrameHeader::data(Default::default(), step)
}

/// Sizes: the edges first (0, 1, chunk - 1, chunk), then a spread.
pub fn size_of(frame: usize, chunk: usize) -> usize {
    match frame {
        0 => 0,
        1 => 1,
        2 => chunk - 1,
        3 => chunk,
        _ => (frame * 7919) % (chunk + 1),
    }
}

/// The host data path of `conn` (every transport under test has one).
pub fn host(conn: &mut Connection) -> &mut HostPath {
    conn.host
        .as_mut()
        .expect("the connection has a host data path")
}

/// The sending half, the receiving half and the closer of `conn`.
pub fn halves(
    conn: Connection,
) -> (
    Box<dyn SlotSender>,
    Box<dyn SlotReceiver>,
    Arc<dyn ConnectionCloser>,
) {
    let Connection { host, closer, .. } = conn;
    let HostPath { sender, receiver } = host.expect("the connection has a host data path");
    (sender, receiver, closer)
}

/// Send `payload` as one frame through `send_with`.
pub fn send_bytes(
    conn: &mut Connection,
    header: FrameHeader,
    payload: &[u8],
    deadline: Instant,
) -> Result<(), TransportError> {
    host(conn)
        .sender
        .send_with(header, deadline, &mut |buf: &mut [u8]| {
            buf[..payload.len()].copy_from_slice(payload);
            payload.len()
        })
}

/// Receive one frame through `recv_with`: its header and a copy of its
/// payload.
pub fn recv_bytes(
    conn: &mut Connection,
    deadline: Instant,
) -> Result<(FrameHeader, Vec<u8>), TransportError> {
    let mut out = None;
    host(conn)
        .receiver
        .recv_with(deadline, &mut |h: &FrameHeader, bytes: &[u8]| {
            out = Some((*h, bytes.to_vec()));
            Ok(())
        })?;
    Ok(out.expect("consume was called"))
}

/// `err` is the timeout of a sender that waited for a free slot of `peer`.
pub fn assert_timed_out_for_a_send_slot<T: std::fmt::Debug>(
    err: &Result<T, TransportError>,
    peer: usize,
) {
    assert!(
        matches!(
            err,
            Err(TransportError::Timeout {
                peer: p,
                what: "a free send slot",
                ..
            }) if *p == peer
        ),
        "{err:?}"
    );
}

/// Send full frames of `chunk` bytes ([`payload`] of rank 0, frame number
/// as step) with a 200 ms deadline each until one waits past it; returns
/// how many went out before, and the error of the one that did not. Panics
/// after `max` frames.
pub fn fill_until_blocked(
    conn: &mut Connection,
    chunk: usize,
    max: usize,
) -> (usize, TransportError) {
    for f in 0..max {
        let bytes = payload(0, f, chunk);
        if let Err(e) = host(conn)
            .sender
            .send_from(data(f as u32), soon(200), &bytes)
        {
            return (f, e);
        }
    }
    panic!("{max} frames of {chunk} bytes went out with nobody reading");
}

/// Which entry points [`exchange`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paths {
    /// `send_with` and `recv_with`: the closure writes or reads the slot.
    InSlot,
    /// `send_from` and `recv_into`: the caller's memory.
    Caller,
    /// `send_sized_until` and `recv_with`: the closure writes exactly the
    /// frame's bytes, wherever the transport places them.
    Sized,
}

/// Both ends send `frames` frames (sizes from [`size_of`]) to each other at
/// once, each end's sender and receiver on threads of their own; every
/// header field and byte is checked against the pattern, slots and
/// payloads are 8-byte aligned, and nothing more arrives afterwards.
pub fn exchange(c0: Connection, c1: Connection, chunk: usize, frames: usize, paths: Paths) {
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for (me, conn) in [(0usize, c0), (1usize, c1)] {
        let peer = 1 - me;
        let (mut sender, mut receiver, closer) = halves(conn);
        assert_eq!(sender.chunk_bytes(), chunk);
        assert_eq!(receiver.chunk_bytes(), chunk);
        assert_eq!(receiver.peer(), peer);
        senders.push(std::thread::spawn(move || {
            for f in 0..frames {
                let len = size_of(f, chunk);
                let result = match paths {
                    Paths::Caller => {
                        sender.send_from(header_for(me, f), soon(20_000), &payload(me, f, len))
                    }
                    Paths::Sized => sender.send_sized_until(
                        header_for(me, f),
                        crate::Deadline::At(soon(20_000)),
                        len,
                        &mut |buf: &mut [u8]| {
                            assert_eq!(buf.len(), len);
                            assert_eq!(
                                buf.as_ptr() as usize % 8,
                                0,
                                "sized send slot not 8-byte aligned"
                            );
                            for (i, b) in buf.iter_mut().enumerate() {
                                *b = pattern(me, f, i);
                            }
                        },
                    ),
                    Paths::InSlot => sender.send_with(
                        header_for(me, f),
                        soon(20_000),
                        &mut |buf: &mut [u8]| {
                            assert_eq!(buf.len(), chunk);
                            assert_eq!(
                                buf.as_ptr() as usize % 8,
                                0,
                                "send slot not 8-byte aligned"
                            );
                            for (i, b) in buf[..len].iter_mut().enumerate() {
                                *b = pattern(me, f, i);
                            }
                            len
                        },
                    ),
                };
                result.unwrap_or_else(|e| panic!("rank {me} frame {f}: {e}"));
            }
            sender
        }));
        receivers.push(std::thread::spawn(move || {
            let _keep = closer;
            for f in 0..frames {
                let mut want = header_for(peer, f);
                want.len = size_of(f, chunk) as u32;
                match paths {
                    Paths::Caller => receive_into(&mut *receiver, me, f, want),
                    Paths::InSlot | Paths::Sized => {
                        receive_in_slot(&mut *receiver, me, f, want)
                    }
                }
            }
            // Nothing more was sent.
            let extra = receiver.recv_with(soon(50), &mut |_, _| Ok(()));
            assert!(
                matches!(extra, Err(TransportError::Timeout { peer: p, what: "data", .. }) if p == peer),
                "{extra:?}"
            );
            receiver
        }));
    }
    // Senders stay alive until every receiver is done, so that no goodbye
    // reaches a receiver that still checks for silence.
    let senders: Vec<_> = senders
        .into_iter()
        .map(|t| t.join().expect("a sender panicked"))
        .collect();
    let receivers: Vec<_> = receivers
        .into_iter()
        .map(|t| t.join().expect("a receiver panicked"))
        .collect();
    drop((senders, receivers));
}

/// Frame `f` for rank `me` through `recv_into`, checked against `want`.
fn receive_into(receiver: &mut dyn SlotReceiver, me: usize, f: usize, want: FrameHeader) {
    let peer = 1 - me;
    let mut dst = vec![0xeeu8; want.len as usize];
    let mut checked = false;
    receiver
        .recv_into(
            soon(20_000),
            &mut |h: &FrameHeader| {
                checked = true;
                assert_eq!(*h, want, "rank {me} frame {f}");
                Ok(())
            },
            &mut dst,
        )
        .unwrap_or_else(|e| panic!("rank {me} frame {f}: {e}"));
    assert!(checked);
    for (i, b) in dst.iter().enumerate() {
        assert_eq!(*b, pattern(peer, f, i), "rank {me} frame {f} byte {i}");
    }
}

/// Frame `f` for rank `me` through `recv_with`, checked against `want`.
fn receive_in_slot(receiver: &mut dyn SlotReceiver, me: usize, f: usize, want: FrameHeader) {
    let peer = 1 - me;
    let mut seen = false;
    receiver
        .recv_with(soon(20_000), &mut |h: &FrameHeader, bytes: &[u8]| {
            seen = true;
            assert_eq!(*h, want, "rank {me} frame {f}");
            assert_eq!(h.kind, crate::FrameKind::Data);
            assert_eq!(bytes.len(), want.len as usize);
            assert_eq!(bytes.as_ptr() as usize % 8, 0, "payload not 8-byte aligned");
            for (i, b) in bytes.iter().enumerate() {
                assert_eq!(*b, pattern(peer, f, i), "rank {me} frame {f} byte {i}");
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("rank {me} frame {f}: {e}"));
    assert!(seen);
}

/// One `#[test]` per conformance case, each building its [`Suite`] from
/// `$suite` (an expression evaluated per test):
/// `ferroccl_transport::conformance_tests!(Suite::new("mem", || Box::new(MemTransport)));`
#[macro_export]
macro_rules! conformance_tests {
    ($suite:expr) => {
        $crate::conformance_tests!(@cases $suite;
            data_path::frames_cross_intact_through_slot_reuse,
            data_path::caller_memory_paths_cross_intact,
            data_path::sized_sends_cross_intact_wherever_placed,
            data_path::one_step_fifo,
            data_path::odd_chunk_sizes_keep_payloads_aligned,
            data_path::large_chunks,
            data_path::payloads_on_both_sides_of_the_inline_edge,
            data_path::paths_mixed_keep_order_and_refusals_consume,
            data_path::the_fifo_pushes_back_and_lets_go,
            data_path::consume_error_is_returned_and_slot_released,
            data_path::oversized_frames_are_errors_not_frames,
            data_path::recv_into_refuses_a_wrong_length_and_a_rejected_header,
            data_path::payload_reads_as_f64,
            data_path::connection_outlives_its_listeners,
            failure::receive_deadline_is_a_timeout_naming_the_peer,
            failure::a_relative_deadline_is_a_timeout_naming_the_peer,
            failure::send_deadline_is_a_timeout_naming_the_peer,
            failure::abort_ends_blocked_sends_and_receives_promptly,
            failure::dropped_connection_ends_cleanly_after_its_data,
            failure::half_close_leaves_the_other_direction_open,
            failure::blocked_receive_and_send_wake_when_the_peer_drops,
            failure::close_with_failure_reaches_the_peer_and_pending_waits,
            failure::failure_preempts_queued_data_and_its_reason_is_bounded,
            failure::close_says_goodbye_and_wakes_local_waits,
            setup::wrong_token_is_refused,
            setup::wrong_communicator_is_refused,
            setup::connect_and_accept_pair_up_by_rank,
            setup::accept_times_out_naming_an_absent_peer,
            setup::accept_is_aborted_promptly,
            setup::ranks_of_one_host_can_connect,
            setup::fifo_descriptors_match_the_configuration,
        );
    };
    (@cases $suite:expr; $($module:ident :: $case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::$module::$case(&$suite);
            }
        )*
    };
}
