//! Helpers of the shared-memory tests: listener configs, a connected pair
//! of ranks (threads of this process) with the segment prefix of its
//! acceptor, and a count of the segments a listener's peers left in
//! /dev/shm. The helpers every transport's tests share (payload patterns,
//! sending and receiving one frame...) come from the conformance module.
#![allow(dead_code, unused_imports)]

use ferroccl_shm::{ShmListener, ShmTransport};
pub use ferroccl_transport::conformance::{
    assert_timed_out_for_a_send_slot, data, halves, header_for, host, pair_listeners, pattern,
    payload, recv_bytes, send_bytes, soon,
};
use ferroccl_transport::{AbortHandle, AbortSignal, Connection, ListenConfig};
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
    pair_in(
        config(0, chunk_bytes, steps).size,
        chunk_bytes,
        steps,
        abort,
    )
}

/// `pair_with` for ranks 0 and 1 of a communicator of `size` ranks (what
/// the shm transport's waits and payload placement go by).
fn pair_in(
    size: usize,
    chunk_bytes: usize,
    steps: usize,
    abort: &AbortSignal,
) -> (Connection, Connection, String) {
    let config = |rank| ListenConfig {
        size,
        ..config(rank, chunk_bytes, steps)
    };
    let l0 = listen(&config(0), abort);
    let l1 = listen(&config(1), abort);
    let prefix = l1.segment_prefix();
    let (c0, c1) = pair_listeners(&l0, Box::new(l1));
    assert_eq!(c0.transport, "shm");
    assert_eq!(c1.transport, "shm");
    (c0, c1, prefix)
}

/// [`pair`] for a communicator of `size` ranks.
#[allow(dead_code)]
pub fn pair_of(
    size: usize,
    chunk_bytes: usize,
    steps: usize,
) -> (Connection, Connection, AbortHandle) {
    let abort = AbortHandle::new();
    let (a, b, _) = pair_in(size, chunk_bytes, steps, &abort.signal());
    (a, b, abort)
}

pub fn pair(chunk_bytes: usize, steps: usize) -> (Connection, Connection, AbortHandle) {
    let abort = AbortHandle::new();
    let (a, b, _) = pair_with(chunk_bytes, steps, &abort.signal());
    (a, b, abort)
}
