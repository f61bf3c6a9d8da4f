//! What TCP adds to the failure cases of the conformance suite
//! (tests/conformance.rs): protocol violations and sockets that close
//! mid-stream, as a raw peer produces them, and the bounded drop of a
//! connection whose writer is stuck.

mod common;

use common::*;
use ferroccl_tcp::TcpTransport;
use ferroccl_transport::{AbortHandle, Connection, TransportError};
use std::io::Write;
use std::time::{Duration, Instant};

#[test]
fn oversized_length_is_a_protocol_error() {
    let (mut s, mut c1, _abort) = raw_peer(1024, 2);
    s.write_all(&raw_header(1, 0, 5, 0)).unwrap();
    s.write_all(b"abcde").unwrap();
    s.write_all(&raw_header(1, 1, 1025, 0)).unwrap();
    let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, &bytes[..]), (0, &b"abcde"[..]));
    let err = recv_bytes(&mut c1, soon(5_000)).map(|_| ());
    assert!(
        matches!(err, Err(TransportError::Protocol { peer: 0, ref detail }) if detail.contains("1025")),
        "{err:?}"
    );
    // The error sticks.
    let again = recv_bytes(&mut c1, soon(100)).map(|_| ());
    assert_eq!(again, err);
    // And the sending half learns of it too.
    let sent = send_bytes(&mut c1, data(0), b"x", soon(1_000));
    assert!(
        matches!(sent, Err(TransportError::Protocol { peer: 0, .. })),
        "{sent:?}"
    );
}

#[test]
fn bad_magic_and_unknown_kind_are_protocol_errors() {
    for bad in [b"GARBAGE!".repeat(5), raw_header(9, 0, 0, 0)] {
        let (mut s, mut c1, _abort) = raw_peer(64, 2);
        s.write_all(&bad).unwrap();
        let err = recv_bytes(&mut c1, soon(5_000)).map(|_| ());
        assert!(
            matches!(err, Err(TransportError::Protocol { peer: 0, .. })),
            "{err:?}"
        );
    }
}

#[test]
fn socket_closed_mid_frame_is_peer_closed() {
    let (mut s, mut c1, _abort) = raw_peer(1024, 2);
    s.write_all(&raw_header(1, 0, 100, 0)).unwrap();
    s.write_all(&[7; 40]).unwrap();
    let start = Instant::now();
    drop(s);
    let err = recv_bytes(&mut c1, soon(10_000)).map(|_| ());
    assert!(
        matches!(err, Err(TransportError::PeerClosed { peer: 0, ref detail }) if detail.contains("middle of a frame")),
        "{err:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn socket_closed_between_frames_delivers_data_then_peer_closed() {
    let (mut s, mut c1, _abort) = raw_peer(1024, 2);
    for step in 0..5u32 {
        s.write_all(&raw_header(1, step, 3, 0)).unwrap();
        s.write_all(&[step as u8; 3]).unwrap();
    }
    drop(s);
    for step in 0..5u32 {
        let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step, bytes), (step, vec![step as u8; 3]));
    }
    let err = recv_bytes(&mut c1, soon(5_000)).map(|_| ());
    assert!(
        matches!(err, Err(TransportError::PeerClosed { peer: 0, ref detail }) if detail.contains("without a goodbye")),
        "{err:?}"
    );
}

/// A connection with tiny socket buffers, whose receiver never reads.
fn clogged() -> (Connection, Connection, AbortHandle) {
    let abort = AbortHandle::new();
    let t = TcpTransport::new().with_socket_buffer_bytes(Some(16 << 10));
    let (c0, c1) = pair_with(&t, 64 << 10, 2, 1, &abort.signal());
    (c0, c1, abort)
}

#[test]
fn drop_of_a_clogged_connection_is_bounded() {
    let (mut c0, c1, _abort) = clogged();
    let _ = fill_until_blocked(&mut c0, 64 << 10, 10_000);
    let start = Instant::now();
    drop(c0);
    // The writer is stuck on a full socket: dropping waits for the drain
    // limit at most, then cuts the connection.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    drop(c1);
}
