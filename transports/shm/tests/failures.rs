//! An established connection fails loudly, names the peer, and within a
//! bounded time: dropped and closed ends, reported failures, deadlines and
//! aborts. Nothing is left in /dev/shm afterwards.

mod common;

use common::*;
use ferroccl_transport::{AbortHandle, Connection, Deadline, TransportError};
use std::time::{Duration, Instant};

fn clean_close() -> Result<(), TransportError> {
    Err(TransportError::PeerClosed {
        peer: 0,
        detail: "peer shut down cleanly".into(),
    })
}

#[test]
fn dropped_connection_ends_cleanly_after_its_data() {
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
    let start = Instant::now();
    assert_eq!(recv_bytes(&mut c1, soon(10_000)).map(|_| ()), clean_close());
    assert!(start.elapsed() < Duration::from_secs(5));
    // It sticks, and sending to the departed peer fails too, naming it.
    assert_eq!(recv_bytes(&mut c1, soon(100)).map(|_| ()), clean_close());
    let sent = send_bytes(&mut c1, data(0), b"late", soon(5_000));
    assert!(
        matches!(sent, Err(TransportError::PeerClosed { peer: 0, .. })),
        "{sent:?}"
    );
    drop(c1);
    assert_eq!(segments(&prefix), Vec::<String>::new());
}

#[test]
fn half_close_leaves_the_other_direction_open() {
    let (c0, mut c1, _abort) = pair(512, 4);
    let Connection {
        sender: s0,
        receiver: mut r0,
        ..
    } = c0;
    drop(s0);
    assert_eq!(recv_bytes(&mut c1, soon(5_000)).map(|_| ()), clean_close());
    for step in 0..20 {
        send_bytes(&mut c1, data(step), &[step as u8; 300], soon(5_000)).unwrap();
        let mut got = None;
        r0.recv_with(soon(5_000), &mut |h, b| {
            got = Some((h.step, b.to_vec()));
            Ok(())
        })
        .unwrap();
        assert_eq!(got, Some((step, vec![step as u8; 300])));
    }
}

#[test]
fn blocked_receive_and_send_wake_when_the_peer_drops() {
    let (c0, c1, _abort) = pair(512, 2);
    let Connection {
        mut sender,
        mut receiver,
        ..
    } = c1;
    // Fill the ring towards rank 0, which never reads.
    for step in 0..2 {
        sender.send_from(data(step), soon(5_000), b"x").unwrap();
    }
    let receiving = std::thread::spawn(move || {
        let start = Instant::now();
        let r = receiver.recv_with(soon(30_000), &mut |_, _| Ok(()));
        (r, start.elapsed())
    });
    let sending = std::thread::spawn(move || {
        let start = Instant::now();
        let r = sender.send_from(data(2), soon(30_000), b"y");
        (r, start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    drop(c0);
    for (r, waited) in [receiving.join().unwrap(), sending.join().unwrap()] {
        assert!(
            matches!(r, Err(TransportError::PeerClosed { peer: 0, .. })),
            "{r:?}"
        );
        assert!(waited < Duration::from_secs(10), "{waited:?}");
    }
}

#[test]
fn close_with_failure_reaches_the_peer_and_pending_waits() {
    let (c0, c1, _abort) = pair(256, 4);
    let Connection {
        mut sender,
        mut receiver,
        closer,
        ..
    } = c1;
    // A receive already waiting when the failure arrives.
    let pending = std::thread::spawn(move || {
        let r = receiver.recv_with(soon(30_000), &mut |_, _| Ok(()));
        (r, receiver)
    });
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    c0.closer.close_with_failure(7, "boom: rank 7 lost its GPU");
    let (r, mut receiver) = pending.join().unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    let is_boom = |r: &Result<(), TransportError>| matches!(r, Err(TransportError::PeerFailed { rank: 7, reason }) if reason == "boom: rank 7 lost its GPU");
    assert!(is_boom(&r), "{r:?}");
    // Later calls on both halves say the same.
    assert!(is_boom(&receiver.recv_with(soon(100), &mut |_, _| Ok(()))));
    assert!(is_boom(&sender.send_with(data(0), soon(100), &mut |_| 0)));
    drop(closer);
    // The closing side's own halves fail too, without waiting.
    let mut c0 = c0;
    let start = Instant::now();
    assert!(is_boom(&recv_bytes(&mut c0, soon(30_000)).map(|_| ())));
    assert!(is_boom(&send_bytes(&mut c0, data(0), b"x", soon(30_000))));
    assert!(start.elapsed() < Duration::from_secs(1));
}

#[test]
fn failure_preempts_queued_data_and_its_reason_is_bounded() {
    let (mut c0, mut c1, _abort) = pair(1024, 4);
    send_bytes(&mut c0, data(0), b"stale", soon(5_000)).unwrap();
    // A long reason with a multi-byte character across the cut.
    let reason = format!("{}é{}", "x".repeat(255), "y".repeat(10_000));
    c0.closer.close_with_failure(3, &reason);
    // A second report does not overwrite the first.
    c1.closer.close_with_failure(5, "second");
    let err = recv_bytes(&mut c1, soon(5_000)).map(|_| ());
    match err {
        Err(TransportError::PeerFailed { rank: 3, reason }) => {
            assert_eq!(reason, "x".repeat(255));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn close_says_goodbye_and_wakes_local_waits() {
    let (c0, mut c1, _abort) = pair(256, 4);
    let Connection {
        mut receiver,
        mut sender,
        closer,
        ..
    } = c0;
    sender.send_from(data(0), soon(1_000), b"before").unwrap();
    let waiter = std::thread::spawn(move || {
        let start = Instant::now();
        (
            receiver.recv_with(soon(30_000), &mut |_, _| Ok(())),
            start.elapsed(),
        )
    });
    std::thread::sleep(Duration::from_millis(100));
    closer.close();
    closer.close();
    let (local, waited) = waiter.join().unwrap();
    assert!(
        matches!(local, Err(TransportError::Io(ref d)) if d.contains("rank 1") && d.contains("closed locally")),
        "{local:?}"
    );
    assert!(waited < Duration::from_secs(5));
    let sent = sender.send_from(data(1), soon(1_000), b"after");
    assert!(matches!(sent, Err(TransportError::Io(_))), "{sent:?}");
    // The peer drains what came before the goodbye, then hears it.
    let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, &b[..]), (0, &b"before"[..]));
    assert_eq!(recv_bytes(&mut c1, soon(5_000)).map(|_| ()), clean_close());
    // And its sends fail: nobody will release a slot.
    let sent = send_bytes(&mut c1, data(0), b"x", soon(5_000));
    assert!(
        matches!(sent, Err(TransportError::PeerClosed { peer: 0, .. })),
        "{sent:?}"
    );
}

#[test]
fn receive_deadline_is_a_timeout_naming_the_peer() {
    let (_c0, mut c1, _abort) = pair(256, 4);
    let start = Instant::now();
    let err = recv_bytes(&mut c1, soon(300)).map(|_| ());
    let waited = start.elapsed();
    match err {
        Err(TransportError::Timeout {
            peer: 0,
            what: "data",
            waited_ms,
        }) => {
            assert!(
                waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
                "{waited:?}"
            );
            assert!((300..5_000).contains(&waited_ms), "{waited_ms}");
        }
        other => panic!("{other:?}"),
    }
    // A deadline already past still looks at what is published.
    let err = recv_bytes(&mut c1, Instant::now() - Duration::from_millis(1)).map(|_| ());
    assert!(
        matches!(err, Err(TransportError::Timeout { peer: 0, .. })),
        "{err:?}"
    );
}

/// A deadline given as a time after the wait begins (the executor's way,
/// which lets a wait that ends at once skip the clock) bounds the wait
/// like a fixed instant does, on both halves.
#[test]
fn a_relative_deadline_is_a_timeout_naming_the_peer() {
    let (mut c0, mut c1, _abort) = pair(64, 1);
    let start = Instant::now();
    let err = c1
        .receiver
        .recv_with_until(Deadline::After(Duration::from_millis(200)), &mut |_, _| {
            Ok(())
        });
    let waited = start.elapsed();
    assert!(
        matches!(
            err,
            Err(TransportError::Timeout {
                peer: 0,
                what: "data",
                ..
            })
        ),
        "{err:?}"
    );
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    send_bytes(&mut c0, data(0), &[1; 8], soon(1_000)).unwrap();
    let start = Instant::now();
    let err = c0.sender.send_from_until(
        data(1),
        Deadline::After(Duration::from_millis(200)),
        &[2; 8],
    );
    assert_timed_out_for_a_send_slot(&err);
    assert!(start.elapsed() >= Duration::from_millis(200));
    // What was sent before is intact.
    let (h, bytes) = recv_bytes(&mut c1, soon(1_000)).unwrap();
    assert_eq!((h.step, bytes), (0, vec![1u8; 8]));
}

#[test]
fn send_deadline_is_a_timeout_naming_the_peer() {
    let (mut c0, _c1, _abort) = pair(64, 2);
    for step in 0..2 {
        send_bytes(&mut c0, data(step), &[1; 64], soon(1_000)).unwrap();
    }
    let start = Instant::now();
    let err = send_bytes(&mut c0, data(2), &[1; 64], soon(200));
    assert_timed_out_for_a_send_slot(&err);
    assert!(start.elapsed() >= Duration::from_millis(200));
}

#[test]
fn abort_ends_blocked_sends_and_receives_promptly() {
    let abort = AbortHandle::new();
    let (mut c0, c1, _) = pair_with(64, 2, &abort.signal());
    for step in 0..2 {
        send_bytes(&mut c0, data(step), &[1; 64], soon(1_000)).unwrap();
    }
    let sending = std::thread::spawn(move || {
        let start = Instant::now();
        let r = send_bytes(&mut c0, data(2), &[1; 64], soon(60_000));
        (r, start.elapsed())
    });
    // Rank 1 has frames queued, so wait on a fresh pair for a blocked
    // receive.
    let (_d0, mut d1, _) = pair_with(64, 2, &abort.signal());
    let receiving = std::thread::spawn(move || {
        let start = Instant::now();
        let r = recv_bytes(&mut d1, soon(60_000)).map(|_| ());
        (r, start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    abort.abort();
    for (r, waited) in [sending.join().unwrap(), receiving.join().unwrap()] {
        assert_eq!(r, Err(TransportError::Aborted));
        assert!(waited < Duration::from_secs(10), "{waited:?}");
    }
    // After the abort, even queued data is not handed out.
    let Connection { mut receiver, .. } = c1;
    let r = receiver.recv_with(soon(1_000), &mut |_, _| Ok(()));
    assert_eq!(r, Err(TransportError::Aborted));
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
                let closer = c1.closer.clone();
                drop(c1.receiver);
                drop(c1.sender);
                drop(c0);
                drop(closer);
                assert_eq!(segments(&prefix), Vec::<String>::new());
                continue;
            }
        }
        drop(c1);
        drop(c0);
        assert_eq!(segments(&prefix), Vec::<String>::new());
    }
}
