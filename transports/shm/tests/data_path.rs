//! Frames cross a shared-memory connection intact, in order, in both
//! directions at once, through slot wraparound and backpressure; payloads
//! are handed out 8-byte aligned; the copying entry points agree with the
//! zero-copy ones.

mod common;

use common::*;
use ferroccl_transport::{
    AbortHandle, Connection, Fingerprint, FrameHeader, FrameKind, Listener, TransportError,
};
use std::time::Duration;

fn header_for(from: usize, frame: usize) -> FrameHeader {
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

/// Sizes: the edges first (0, 1, chunk - 1, chunk), then a spread.
fn size_of(frame: usize, chunk: usize) -> usize {
    match frame {
        0 => 0,
        1 => 1,
        2 => chunk - 1,
        3 => chunk,
        _ => (frame * 7919) % (chunk + 1),
    }
}

/// Both ranks send `frames` frames to each other at once, through
/// `send_with`/`recv_with` or `send_from`/`recv_into`; every header field
/// and byte is checked against the pattern.
fn exchange(chunk: usize, steps: usize, frames: usize, copying: bool) {
    let abort = AbortHandle::new();
    let (c0, c1, prefix) = pair_with(chunk, steps, &abort.signal());
    // Both sides hold the mapping: the names are gone already.
    assert_eq!(segments(&prefix), Vec::<String>::new());
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for (me, conn) in [(0usize, c0), (1usize, c1)] {
        let peer = 1 - me;
        let Connection {
            mut sender,
            mut receiver,
            closer,
            ..
        } = conn;
        assert_eq!(sender.chunk_bytes(), chunk);
        assert_eq!(receiver.chunk_bytes(), chunk);
        senders.push(std::thread::spawn(move || {
            for f in 0..frames {
                let len = size_of(f, chunk);
                let result = if copying {
                    let payload: Vec<u8> = (0..len).map(|i| pattern(me, f, i)).collect();
                    sender.send_from(header_for(me, f), soon(20_000), &payload)
                } else {
                    sender.send_with(header_for(me, f), soon(20_000), &mut |buf: &mut [u8]| {
                        assert_eq!(buf.len(), chunk);
                        assert_eq!(buf.as_ptr() as usize % 8, 0, "send slot not 8-byte aligned");
                        for (i, b) in buf[..len].iter_mut().enumerate() {
                            *b = pattern(me, f, i);
                        }
                        len
                    })
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
                if copying {
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
                } else {
                    let mut seen = false;
                    receiver
                        .recv_with(soon(20_000), &mut |h: &FrameHeader, bytes: &[u8]| {
                            seen = true;
                            assert_eq!(*h, want, "rank {me} frame {f}");
                            assert_eq!(h.kind, FrameKind::Data);
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
    assert_eq!(segments(&prefix), Vec::<String>::new());
}

#[test]
fn small_chunks_wrap_many_times() {
    exchange(1000, 4, 300, false);
}

#[test]
fn copying_entry_points_wrap_many_times() {
    exchange(1000, 4, 300, true);
}

#[test]
fn one_step_fifo() {
    exchange(64, 1, 100, false);
    exchange(64, 1, 100, true);
}

#[test]
fn odd_chunk_sizes_keep_payloads_aligned() {
    for chunk in [1, 7, 63, 65, 4097] {
        exchange(chunk, 3, 20, false);
    }
}

/// Frames of up to 16 bytes travel in the header's cache line, larger
/// ones in the payload area: sizes on both sides of that edge, in every
/// order, through slots that are reused, never show a stale byte of the
/// other area or of an earlier frame.
#[test]
fn payloads_on_both_sides_of_the_inline_edge() {
    let (mut c0, mut c1, _abort) = pair(64, 2);
    let sizes: Vec<usize> = (0..=40)
        .chain((0..=40).rev())
        .chain([16, 17, 15, 64, 0, 16])
        .collect();
    for (f, &len) in sizes.iter().enumerate() {
        let payload: Vec<u8> = (0..len).map(|i| pattern(0, f, i)).collect();
        send_bytes(&mut c0, header_for(0, f), &payload, soon(5_000)).unwrap();
        if f % 2 == 1 {
            // Two frames in flight: both slots hold one.
            for g in [f - 1, f] {
                let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
                let want: Vec<u8> = (0..sizes[g]).map(|i| pattern(0, g, i)).collect();
                assert_eq!((h.step, bytes), (g as u32, want), "frame {g}");
            }
        }
    }
}

#[test]
fn large_chunks() {
    exchange(1 << 20, 8, 40, false);
}

#[test]
fn backpressure_holds_the_sender_until_the_receiver_releases() {
    let (mut c0, mut c1, _abort) = pair(128, 3);
    for f in 0..3 {
        send_bytes(&mut c0, header_for(0, f), &[f as u8; 10], soon(5_000)).unwrap();
    }
    // The ring is full: the fourth send waits and times out, naming rank 1.
    let err = send_bytes(&mut c0, header_for(0, 3), &[3; 10], soon(100));
    assert_timed_out_for_a_send_slot(&err);
    // One release frees one slot.
    let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, b), (0, vec![0u8; 10]));
    send_bytes(&mut c0, header_for(0, 3), &[3; 10], soon(5_000)).unwrap();
    let err = send_bytes(&mut c0, header_for(0, 4), &[4; 10], soon(50));
    assert!(
        matches!(err, Err(TransportError::Timeout { peer: 1, .. })),
        "{err:?}"
    );
    for f in 1..4u32 {
        let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step, b), (f, vec![f as u8; 10]));
    }
    // A sender blocked on a full ring goes on as soon as a slot is freed.
    for f in 4..7 {
        send_bytes(&mut c0, header_for(0, f), &[f as u8; 10], soon(5_000)).unwrap();
    }
    let blocked = std::thread::spawn(move || {
        send_bytes(&mut c0, header_for(0, 7), &[7; 10], soon(20_000)).map(|_| c0)
    });
    std::thread::sleep(Duration::from_millis(100));
    for f in 4..8u32 {
        let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step, b), (f, vec![f as u8; 10]));
    }
    blocked.join().unwrap().unwrap();
}

#[test]
fn consume_error_is_returned_and_slot_released() {
    let (mut c0, mut c1, _abort) = pair(256, 2);
    for f in 0..6 {
        let payload: Vec<u8> = (0..100).map(|i| pattern(0, f, i)).collect();
        send_bytes(&mut c0, header_for(0, f), &payload, soon(5_000)).unwrap();
        let err = c1
            .receiver
            .recv_with(soon(5_000), &mut |h: &FrameHeader, bytes: &[u8]| {
                assert_eq!(h.step, f as u32);
                assert_eq!(bytes, &payload[..]);
                Err(TransportError::Io(format!("consumer says no {f}")))
            });
        assert_eq!(
            err,
            Err(TransportError::Io(format!("consumer says no {f}")))
        );
    }
    // More frames than slots went through: every refused slot was released.
    send_bytes(&mut c0, header_for(0, 9), &[1, 2, 3], soon(5_000)).unwrap();
    let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, h.len, bytes), (9, 3, vec![1, 2, 3]));
}

#[test]
fn oversized_frames_are_errors_not_frames() {
    let (mut c0, mut c1, _abort) = pair(128, 2);
    let err = c0
        .sender
        .send_with(header_for(0, 0), soon(1_000), &mut |_| 129);
    assert!(
        matches!(err, Err(TransportError::Io(ref d)) if d.contains("129")),
        "{err:?}"
    );
    let err = c0
        .sender
        .send_from(header_for(0, 0), soon(1_000), &[0; 129]);
    assert!(
        matches!(err, Err(TransportError::Io(ref d)) if d.contains("129")),
        "{err:?}"
    );
    // The slot stayed free and the connection still works.
    for f in 0..4 {
        send_bytes(&mut c0, header_for(0, f), &[f as u8; 5], soon(5_000)).unwrap();
        let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step, bytes), (f as u32, vec![f as u8; 5]));
    }
}

#[test]
fn recv_into_refuses_a_wrong_length_and_a_rejected_header() {
    let (mut c0, mut c1, _abort) = pair(128, 2);
    send_bytes(&mut c0, header_for(0, 0), &[9; 10], soon(5_000)).unwrap();
    let mut dst = [0u8; 11];
    let err = c1
        .receiver
        .recv_into(soon(5_000), &mut |_| Ok(()), &mut dst);
    assert!(
        matches!(err, Err(TransportError::Protocol { peer: 0, ref detail }) if detail.contains("10") && detail.contains("11")),
        "{err:?}"
    );
    assert_eq!(dst, [0u8; 11], "no byte placed on a length mismatch");
    send_bytes(&mut c0, header_for(0, 1), &[8; 11], soon(5_000)).unwrap();
    let err = c1.receiver.recv_into(
        soon(5_000),
        &mut |h| Err(TransportError::Io(format!("step {} refused", h.step))),
        &mut dst,
    );
    assert_eq!(err, Err(TransportError::Io("step 1 refused".into())));
    assert_eq!(dst, [0u8; 11], "no byte placed before check accepts");
    // Both slots were released.
    send_bytes(&mut c0, header_for(0, 2), &[7; 11], soon(5_000)).unwrap();
    c1.receiver
        .recv_into(soon(5_000), &mut |_| Ok(()), &mut dst)
        .unwrap();
    assert_eq!(dst, [7u8; 11]);
}

#[test]
fn payload_reads_as_f64() {
    let (mut c0, mut c1, _abort) = pair(8 * 100, 2);
    let values: Vec<f64> = (0..100).map(|i| i as f64 * 0.5 - 7.25).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    c0.sender
        .send_from(header_for(0, 0), soon(5_000), &bytes)
        .unwrap();
    let mut sum = 0.0;
    c1.receiver
        .recv_with(soon(5_000), &mut |_, b| {
            // The executor reinterprets payloads in place; alignment makes
            // that legal.
            assert_eq!(b.as_ptr() as usize % std::mem::align_of::<f64>(), 0);
            sum = b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .sum();
            Ok(())
        })
        .unwrap();
    let want: f64 = values.iter().sum();
    assert_eq!(sum, want);
}

#[test]
fn connection_outlives_its_listeners() {
    let abort = AbortHandle::new();
    let l0 = listen(&config(0, 64, 2), &abort.signal());
    let l1 = listen(&config(1, 64, 2), &abort.signal());
    let addr = l1.address();
    let mut c0 = Listener::connect(&l0, 1, &addr, soon(5_000)).unwrap();
    drop(l0);
    let mut c1 = Listener::accept(&l1, 0, soon(5_000)).unwrap();
    drop(l1);
    send_bytes(&mut c0, header_for(0, 0), &[], soon(1_000)).unwrap();
    let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.len, bytes.len()), (0, 0));
}
