//! Helpers shared by the integration tests: listener configs, a connected
//! pair of ranks (threads of this process), patterned payloads, and a count
//! of the segments a listener's peers left in /dev/shm.
#![allow(dead_code)]

use ferroccl_shm::{ShmListener, ShmTransport};
use ferroccl_transport::{
    AbortHandle, AbortSignal, Connection, FrameHeader, ListenConfig, Listener, TransportError,
};
use std::time::{Duration, Instant};

pub const TOKEN: u64 = 0x5eed_0000_5a5a_abcd;
pub const COMM: u64 = 91;

pub fn config(rank: usize, chunk_bytes: usize, steps: usize) -> ListenConfig {
    ListenConfig {
        rank,
        size: 4,
        token: TOKEN,
        comm_id: COMM,
        chunk_bytes,
        steps,
        ifname: None,
        bind_addr: None,
        nsocks: 1,
    }
}

pub fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

pub fn listen(config: &ListenConfig, abort: &AbortSignal) -> ShmListener {
    ShmTransport::new()
        .listen_shm(config, abort)
        .expect("listen")
}

/// Files in /dev/shm whose names start with `prefix`.
pub fn segments(prefix: &str) -> Vec<String> {
    std::fs::read_dir(ferroccl_shm::DEFAULT_DIR)
        .expect("read /dev/shm")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// Poll until no segment with `prefix` is left (or 5 s); returns what is
/// left.
pub fn wait_no_segments(prefix: &str) -> Vec<String> {
    let start = Instant::now();
    loop {
        let left = segments(prefix);
        if left.is_empty() || start.elapsed() > Duration::from_secs(5) {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Rank 0 connects, rank 1 accepts; returns (rank 0's end, rank 1's end,
/// the segment prefix of rank 1's listener).
pub fn pair_with(
    chunk_bytes: usize,
    steps: usize,
    abort: &AbortSignal,
) -> (Connection, Connection, String) {
    let l0 = listen(&config(0, chunk_bytes, steps), abort);
    let l1 = listen(&config(1, chunk_bytes, steps), abort);
    let prefix = l1.segment_prefix();
    let addr1 = l1.address();
    let acceptor = std::thread::spawn(move || l1.accept(0, soon(10_000)));
    let c0 = l0.connect(1, &addr1, soon(10_000)).expect("connect");
    let c1 = acceptor.join().unwrap().expect("accept");
    assert_eq!(c0.peer, 1);
    assert_eq!(c1.peer, 0);
    assert_eq!(c0.transport, "shm");
    assert_eq!(c1.transport, "shm");
    (c0, c1, prefix)
}

pub fn pair(chunk_bytes: usize, steps: usize) -> (Connection, Connection, AbortHandle) {
    let abort = AbortHandle::new();
    let (a, b, _) = pair_with(chunk_bytes, steps, &abort.signal());
    (a, b, abort)
}

/// The byte at `index` of frame `frame` sent by rank `from`.
pub fn pattern(from: usize, frame: usize, index: usize) -> u8 {
    let x = (from as u64 + 1)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add((frame as u64) << 32)
        .wrapping_add(index as u64 * 0x2545_f491);
    (x ^ (x >> 29) ^ (x >> 47)) as u8
}

pub fn data(step: u32) -> FrameHeader {
    FrameHeader::data(Default::default(), step)
}

pub fn send_bytes(
    conn: &mut Connection,
    header: FrameHeader,
    payload: &[u8],
    deadline: Instant,
) -> Result<(), TransportError> {
    conn.sender
        .send_with(header, deadline, &mut |buf: &mut [u8]| {
            buf[..payload.len()].copy_from_slice(payload);
            payload.len()
        })
}

pub fn recv_bytes(
    conn: &mut Connection,
    deadline: Instant,
) -> Result<(FrameHeader, Vec<u8>), TransportError> {
    let mut out = None;
    conn.receiver
        .recv_with(deadline, &mut |h: &FrameHeader, bytes: &[u8]| {
            out = Some((*h, bytes.to_vec()));
            Ok(())
        })?;
    Ok(out.expect("consume was called"))
}

/// `err` is the timeout of a sender that waited for a free slot of rank 1.
pub fn assert_timed_out_for_a_send_slot<T: std::fmt::Debug>(err: &Result<T, TransportError>) {
    assert!(
        matches!(
            err,
            Err(TransportError::Timeout {
                peer: 1,
                what: "a free send slot",
                ..
            })
        ),
        "{err:?}"
    );
}
