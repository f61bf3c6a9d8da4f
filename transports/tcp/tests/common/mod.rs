//! Helpers of the TCP tests: listener configs, a connected pair of ranks
//! over loopback, a hand-written hello (the documented wire layout, written
//! out independently of the crate). The helpers every transport's tests
//! share (payload patterns, sending and receiving one frame...) come from
//! the conformance module.
#![allow(dead_code, unused_imports)]

use ferroccl_tcp::TcpTransport;
pub use ferroccl_transport::conformance::{
    data, exchange, fill_until_blocked, halves, header_for, host, pair_listeners, pattern, payload,
    recv_bytes, send_bytes, soon, Paths,
};
use ferroccl_transport::{AbortHandle, AbortSignal, Connection, ListenConfig, Listener, Transport};
use std::net::{IpAddr, Ipv4Addr};

pub const TOKEN: u64 = 0x5eed_0000_1234_abcd;
pub const COMM: u64 = 77;

pub fn config(rank: usize, chunk_bytes: usize, steps: usize, nsocks: usize) -> ListenConfig {
    ListenConfig {
        rank,
        size: 2,
        token: TOKEN,
        comm_id: COMM,
        chunk_bytes,
        steps,
        ifname: None,
        bind_addr: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        nsocks,
    }
}

pub fn listen(
    transport: &TcpTransport,
    config: &ListenConfig,
    abort: &AbortSignal,
) -> Box<dyn Listener> {
    transport.listen(config, abort).expect("listen")
}

/// Rank 0 connects, rank 1 accepts; returns (rank 0's end, rank 1's end).
pub fn pair_with(
    transport: &TcpTransport,
    chunk_bytes: usize,
    steps: usize,
    nsocks: usize,
    abort: &AbortSignal,
) -> (Connection, Connection) {
    let l0 = listen(transport, &config(0, chunk_bytes, steps, nsocks), abort);
    let l1 = listen(transport, &config(1, chunk_bytes, steps, nsocks), abort);
    let (c0, c1) = pair_listeners(&*l0, l1);
    assert_eq!(c0.transport, "tcp");
    (c0, c1)
}

pub fn pair(
    chunk_bytes: usize,
    steps: usize,
    nsocks: usize,
) -> (Connection, Connection, AbortHandle) {
    let abort = AbortHandle::new();
    let (a, b) = pair_with(
        &TcpTransport::new(),
        chunk_bytes,
        steps,
        nsocks,
        &abort.signal(),
    );
    (a, b, abort)
}

/// A hello laid out by hand: magic "FCHS", version 1, token, comm id,
/// from, to, index, nsocks, chunk bytes (u64), steps, reserved.
#[allow(clippy::too_many_arguments)]
pub fn raw_hello(
    token: u64,
    comm: u64,
    from: u32,
    to: u32,
    index: u32,
    nsocks: u32,
    chunk: u64,
    steps: u32,
) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(b"FCHS");
    v.extend_from_slice(&1u32.to_le_bytes());
    v.extend_from_slice(&token.to_le_bytes());
    v.extend_from_slice(&comm.to_le_bytes());
    v.extend_from_slice(&from.to_le_bytes());
    v.extend_from_slice(&to.to_le_bytes());
    v.extend_from_slice(&index.to_le_bytes());
    v.extend_from_slice(&nsocks.to_le_bytes());
    v.extend_from_slice(&chunk.to_le_bytes());
    v.extend_from_slice(&steps.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(v.len(), 56);
    v
}

/// A frame header laid out by hand: magic "FCCL", kind, coll, dtype, op,
/// seq, count, root, step, len, aux.
pub fn raw_header(kind: u8, step: u32, len: u32, aux: u32) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(b"FCCL");
    v.extend_from_slice(&[kind, 0, 0, 0]);
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&0u64.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&step.to_le_bytes());
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&aux.to_le_bytes());
    assert_eq!(v.len(), 40);
    v
}

pub fn socket_addr(address: &[u8]) -> std::net::SocketAddr {
    std::str::from_utf8(address).unwrap().parse().unwrap()
}

/// Rank 1's end of a connection whose rank 0 is a raw socket driven by
/// hand (after a hand-written hello).
pub fn raw_peer(chunk: usize, steps: usize) -> (std::net::TcpStream, Connection, AbortHandle) {
    let abort = AbortHandle::new();
    let l1 = listen(
        &TcpTransport::new(),
        &config(1, chunk, steps, 1),
        &abort.signal(),
    );
    let mut s = std::net::TcpStream::connect(socket_addr(&l1.address())).unwrap();
    std::io::Write::write_all(
        &mut s,
        &raw_hello(TOKEN, COMM, 0, 1, 0, 1, chunk as u64, steps as u32),
    )
    .unwrap();
    let mut ok = [9u8; 1];
    std::io::Read::read_exact(&mut s, &mut ok).unwrap();
    assert_eq!(ok, [0]);
    let conn = l1.accept(0, soon(5_000)).unwrap();
    (s, conn, abort)
}
