//! The RDMA data path ([`ferroccl_ib::conn`]) on emulated verbs, beyond
//! the conformance suite: credits with a slow receiver, a stale remote key,
//! a host dying mid-transfer, and what crosses the fabric per frame.

mod common;

use common::{bounded, connect, header, soon};
use ferroccl_ib::conn::{self, Geometry, CTS_ENTRY_BYTES};
use ferroccl_ib::ZeroCopyConfig;
use ferroccl_ib::{Device, EmuFabric};
use ferroccl_transport::{AbortHandle, SlotReceiver, SlotSender, TransportError, HEADER_BYTES};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

fn frame(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (i.wrapping_mul(131) ^ k.wrapping_mul(7)) as u8)
        .collect()
}

/// A receiver that takes its time: the sender is never more than `steps`
/// frames ahead of what was received (it waits for clear-to-send
/// entries), and every frame arrives intact and in order.
#[test]
fn a_slow_receiver_holds_the_sender_to_its_credits() {
    bounded(|| {
        let fabric = EmuFabric::eager();
        let abort = AbortHandle::new();
        let g = Geometry {
            chunk_bytes: 4096,
            steps: 3,
            qps: 1,
        };
        let ((mut tx, _r0, _c0), (_s1, mut rx, _c1), _, _) =
            connect(&fabric, g, ZeroCopyConfig::default(), &abort);
        let frames = 40;
        let received = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&received);
        let sender = thread::spawn(move || {
            let mut most_ahead = 0;
            for i in 0..frames {
                let bytes = frame(i, 1 + i * 97 % 4096);
                tx.send_from(header(i), soon(10_000), &bytes).unwrap();
                // Frame i is out: at most `steps` frames may be unreceived.
                let ahead = i as u64 + 1 - seen.load(Ordering::SeqCst);
                most_ahead = most_ahead.max(ahead);
            }
            most_ahead
        });
        for i in 0..frames {
            if i % 4 == 0 {
                thread::sleep(Duration::from_millis(20));
            }
            rx.recv_with(soon(10_000), &mut |h, bytes| {
                assert_eq!(h.step, i as u32);
                assert_eq!(bytes, frame(i, 1 + i * 97 % 4096));
                Ok(())
            })
            .unwrap();
            received.fetch_add(1, Ordering::SeqCst);
        }
        let most_ahead = sender.join().unwrap();
        assert!(
            most_ahead <= g.steps as u64 + 1,
            "the sender ran {most_ahead} frames ahead with {} slots",
            g.steps
        );
        // It did have to wait: the receiver slept with the FIFO full.
        assert!(most_ahead >= g.steps as u64, "{most_ahead}");
    });
}

/// The receiver's slots are deregistered under the sender (a stale remote
/// key): the write fails as on hardware, both ends' queue pairs are in
/// error, and each end's next call names the other rank.
#[test]
fn a_stale_remote_key_fails_both_ends_naming_the_peer() {
    bounded(|| {
        let fabric = EmuFabric::eager();
        let abort = AbortHandle::new();
        let g = Geometry {
            chunk_bytes: 1024,
            steps: 2,
            qps: 1,
        };
        let ((mut tx, _r0, _c0), (_s1, mut rx, _c1), devs, slots1) =
            connect(&fabric, g, ZeroCopyConfig::default(), &abort);
        tx.send_from(header(0), soon(5_000), b"fine").unwrap();
        rx.recv_with(soon(5_000), &mut |_, b| {
            assert_eq!(b, b"fine");
            Ok(())
        })
        .unwrap();
        devs[1].deregister(slots1.slots.handle).unwrap();
        let sent = tx
            .send_from(header(1), soon(5_000), b"into a stale key")
            .and_then(|()| tx.send_from(header(2), soon(5_000), b"again"));
        match sent {
            Err(TransportError::PeerFailed { rank: 1, reason }) => {
                assert!(reason.contains("remote access"), "{reason}")
            }
            other => panic!("sender: {other:?}"),
        }
        let got = rx.recv_with(soon(5_000), &mut |_, _| Ok(()));
        assert!(
            matches!(got, Err(TransportError::PeerFailed { rank: 0, .. })),
            "receiver: {got:?}"
        );
    });
}

/// Rank 1's host dies while rank 0 streams to it and waits on it: rank
/// 0's blocked send and receive both end, naming rank 1, long before their
/// deadlines.
#[test]
fn a_host_dying_mid_transfer_ends_the_peers_waits() {
    bounded(|| {
        let fabric = EmuFabric::eager();
        let abort = AbortHandle::new();
        let g = Geometry {
            chunk_bytes: 64 << 10,
            steps: 4,
            qps: 2,
        };
        let ((mut tx, mut rx0, _c0), (_s1, mut rx1, _c1), devs, _) =
            connect(&fabric, g, ZeroCopyConfig::default(), &abort);
        // Rank 1 takes a few frames, then its host dies.
        let taker = thread::spawn(move || {
            for _ in 0..3 {
                rx1.recv_with(soon(5_000), &mut |_, _| Ok(())).unwrap();
            }
            rx1
        });
        let streaming = thread::spawn(move || {
            let start = Instant::now();
            let mut i = 0;
            let end = loop {
                if let Err(e) = tx.send_from(header(i), soon(60_000), &frame(i, 64 << 10)) {
                    break e;
                }
                i += 1;
            };
            (end, start.elapsed())
        });
        let waiting = thread::spawn(move || {
            let start = Instant::now();
            (
                rx0.recv_with(soon(60_000), &mut |_, _| Ok(())),
                start.elapsed(),
            )
        });
        let _rx1 = taker.join().unwrap();
        thread::sleep(Duration::from_millis(50));
        devs[1].kill();
        let (sent, t_send) = streaming.join().unwrap();
        let (got, t_recv) = waiting.join().unwrap();
        assert!(
            matches!(sent, TransportError::PeerFailed { rank: 1, .. }),
            "sender: {sent:?}"
        );
        assert!(
            matches!(got, Err(TransportError::PeerFailed { rank: 1, .. })),
            "receiver: {got:?}"
        );
        assert!(t_send < Duration::from_secs(10) && t_recv < Duration::from_secs(10));
    });
}

/// What crosses the fabric per frame, counted by the emulated NIC, against
/// the protocol's own arithmetic: a frame of `n` bytes is `pieces` writes
/// with immediate carrying `40 + n` bytes (header and payload; one piece
/// per queue pair from 64 KiB, else one), and each frame received returns
/// one 32-byte clear-to-send write, the first `steps` of each direction
/// posted at set-up.
#[test]
fn writes_and_bytes_per_frame_are_the_protocols() {
    for (qps, n) in [(1, 0), (1, 1000), (1, 200 << 10), (4, 1000), (4, 200 << 10)] {
        bounded(move || {
            let fabric = EmuFabric::eager();
            let abort = AbortHandle::new();
            let g = Geometry {
                chunk_bytes: 256 << 10,
                steps: 4,
                qps,
            };
            let ((mut tx, _r0, _c0), (_s1, mut rx, _c1), _, _) =
                connect(&fabric, g, ZeroCopyConfig::default(), &abort);
            let frames = 10u64;
            for i in 0..frames as usize {
                tx.send_from(header(i), soon(5_000), &frame(i, n)).unwrap();
                rx.recv_with(soon(5_000), &mut |_, b| {
                    assert_eq!(b.len(), n);
                    Ok(())
                })
                .unwrap();
            }
            let stats = fabric.stats();
            let total = (HEADER_BYTES + n) as u64;
            let pieces = if total >= conn::STRIPE_MIN_BYTES as u64 {
                qps as u64
            } else {
                1
            };
            // Both ends post their first `steps` entries at set-up (rank 0
            // for the direction unused here), then rank 1 one per frame.
            let credits = 2 * g.steps as u64 + frames;
            assert_eq!(stats.writes, frames * pieces + credits, "qps {qps}, n {n}");
            assert_eq!(stats.with_imm, stats.writes);
            assert_eq!(
                stats.bytes,
                frames * total + credits * CTS_ENTRY_BYTES as u64,
                "qps {qps}, n {n}"
            );
        });
    }
}
