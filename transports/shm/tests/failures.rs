//! What shared memory adds to the failure cases of the conformance suite
//! (tests/conformance.rs): a failure reason keeps at most 256 bytes, cut on
//! a character boundary; connections ended every way leave nothing in
//! /dev/shm.

mod common;

use common::*;
use ferroccl_transport::{AbortHandle, TransportError};
use std::time::Duration;

#[test]
fn a_failure_reason_keeps_256_bytes_cut_on_a_character() {
    let (mut c0, mut c1, _abort) = pair(1024, 4);
    send_bytes(&mut c0, data(0), b"stale", soon(5_000)).unwrap();
    // A long reason with a multi-byte character across byte 256.
    let reason = format!("{}é{}", "x".repeat(255), "y".repeat(10_000));
    c0.closer.close_with_failure(3, &reason);
    std::thread::sleep(Duration::from_millis(10));
    // A second report does not overwrite the first.
    c1.closer.close_with_failure(5, "second");
    match recv_bytes(&mut c1, soon(5_000)).map(|_| ()) {
        Err(TransportError::PeerFailed { rank: 3, reason }) => {
            assert_eq!(reason, "x".repeat(255));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_dropped_connection_leaves_no_segments() {
    let abort = AbortHandle::new();
    let (mut c0, mut c1, prefix) = pair_with(512, 4, &abort.signal());
    for step in 0..4 {
        send_bytes(&mut c0, data(step), &[step as u8; 100], soon(5_000)).unwrap();
    }
    drop(c0);
    for step in 0..4 {
        let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step, bytes), (step, vec![step as u8; 100]));
    }
    drop(c1);
    assert_eq!(segments(&prefix), Vec::<String>::new());
}

#[test]
fn many_connections_leave_nothing_in_dev_shm() {
    let abort = AbortHandle::new();
    for round in 0..50usize {
        let (mut c0, mut c1, prefix) = pair_with(4096, 2, &abort.signal());
        for step in 0..5u32 {
            send_bytes(&mut c0, data(step), &[round as u8; 33], soon(5_000)).unwrap();
            let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
            assert_eq!((h.step, b), (step, vec![round as u8; 33]));
        }
        match round % 4 {
            0 => {}
            1 => c0.closer.close(),
            2 => c1.closer.close_with_failure(0, "test"),
            _ => {
                // Halves dropped in the other order, a closer kept longest.
                let (sender, receiver, closer) = halves(c1);
                let kept = closer.clone();
                drop(receiver);
                drop(sender);
                drop(c0);
                drop(closer);
                assert_eq!(segments(&prefix), Vec::<String>::new());
                drop(kept);
                continue;
            }
        }
        drop(c1);
        drop(c0);
        assert_eq!(segments(&prefix), Vec::<String>::new());
    }
}
