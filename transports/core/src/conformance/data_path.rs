//! Conformance cases of the data path: frames cross intact and in order,
//! the FIFO pushes back, and frames that do not fit are refused without
//! harm to the connection.

use super::{
    assert_timed_out_for_a_send_slot, data, exchange, halves, header_for, host, pair_listeners,
    pattern, payload, recv_bytes, send_bytes, soon, Flow, Paths, Suite,
};
use crate::{AbortHandle, FrameHeader, TransportError};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Many frames through a small FIFO, every slot reused many times, with
/// `send_with`/`recv_with`.
pub fn frames_cross_intact_through_slot_reuse(suite: &Suite) {
    let (c0, c1, _abort) = suite.pair(1000, 4);
    exchange(c0, c1, 1000, 300, Paths::InSlot);
}

/// The same through `send_from`/`recv_into`.
pub fn caller_memory_paths_cross_intact(suite: &Suite) {
    let (c0, c1, _abort) = suite.pair(1000, 4);
    exchange(c0, c1, 1000, 300, Paths::Caller);
}

/// The same through `send_sized_until`, in slots of a few pages (where
/// shared memory moves a slot's payloads along it from one use to the next)
/// and in slots smaller than a page.
pub fn sized_sends_cross_intact_wherever_placed(suite: &Suite) {
    for (chunk, steps) in [(3 * 4096 + 100, 2), (1000, 4), (64, 1)] {
        let (c0, c1, _abort) = suite.pair(chunk, steps);
        exchange(c0, c1, chunk, 120, Paths::Sized);
    }
}

/// A FIFO of one slot, both ways.
pub fn one_step_fifo(suite: &Suite) {
    for paths in [Paths::InSlot, Paths::Caller] {
        let (c0, c1, _abort) = suite.pair(64, 1);
        exchange(c0, c1, 64, 100, paths);
    }
}

/// Slot sizes that are no multiple of 8 still hand out aligned payloads.
pub fn odd_chunk_sizes_keep_payloads_aligned(suite: &Suite) {
    for chunk in [1, 7, 63, 65, 4097] {
        let (c0, c1, _abort) = suite.pair(chunk, 3);
        exchange(c0, c1, chunk, 20, Paths::InSlot);
    }
}

/// Slots of a megabyte.
pub fn large_chunks(suite: &Suite) {
    let (c0, c1, _abort) = suite.pair(1 << 20, 8);
    exchange(c0, c1, 1 << 20, 40, Paths::InSlot);
}

/// Sizes from 0 to 40 and back, through two slots that are reused: every
/// size on both sides of a small-payload edge (shm keeps up to 16 bytes in
/// the header's cache line), in every order, never shows a stale byte of
/// another area or of an earlier frame.
pub fn payloads_on_both_sides_of_the_inline_edge(suite: &Suite) {
    let (mut c0, mut c1, _abort) = suite.pair(64, 2);
    let sizes: Vec<usize> = (0..=40)
        .chain((0..=40).rev())
        .chain([16, 17, 15, 64, 0, 16])
        .collect();
    for (f, &len) in sizes.iter().enumerate() {
        send_bytes(&mut c0, header_for(0, f), &payload(0, f, len), soon(5_000)).unwrap();
        if f % 2 == 1 {
            // Two frames in flight: both slots hold one.
            for g in [f - 1, f] {
                let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
                assert_eq!(
                    (h.step, bytes),
                    (g as u32, payload(0, g, sizes[g])),
                    "frame {g}"
                );
            }
        }
    }
}

/// Frames alternate between `send_from` and `send_with` on one side and
/// between `recv_into` and `recv_with` on the other; every fifth frame is
/// refused by `check`, every seventh read into a buffer of the wrong size.
/// Refused frames are consumed, and the ones after them still arrive in
/// order.
pub fn paths_mixed_keep_order_and_refusals_consume(suite: &Suite) {
    for steps in [4, 2] {
        mixed(suite, steps);
    }
}

fn mixed(suite: &Suite, steps: usize) {
    let chunk = 4096;
    let frames = 200;
    let len_of = move |frame: usize| (frame * 7919 + 13) % (chunk + 1);
    let (c0, c1, _abort) = suite.pair(chunk, steps);
    let (mut sender, _r0, _k0) = halves(c0);
    let (_s1, mut receiver, _k1) = halves(c1);
    let tx = std::thread::spawn(move || {
        for f in 0..frames {
            let bytes = payload(0, f, len_of(f));
            if f % 2 == 0 {
                sender.send_from(data(f as u32), soon(20_000), &bytes)
            } else {
                sender.send_with(data(f as u32), soon(20_000), &mut |slot| {
                    slot[..bytes.len()].copy_from_slice(&bytes);
                    bytes.len()
                })
            }
            .unwrap_or_else(|e| panic!("frame {f}: {e}"));
        }
        sender
    });
    for f in 0..frames {
        let want = payload(0, f, len_of(f));
        if f % 3 == 0 {
            let mut got = None;
            receiver
                .recv_with(soon(20_000), &mut |h, b| {
                    got = Some((h.step, b.to_vec()));
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("frame {f}: {e}"));
            assert_eq!(got, Some((f as u32, want)), "frame {f}");
            continue;
        }
        let refuse = f % 5 == 0;
        let wrong_size = f % 7 == 0;
        let mut dst = vec![0xeeu8; want.len() + usize::from(wrong_size)];
        let mut seen = None;
        let r = receiver.recv_into(
            soon(20_000),
            &mut |h| {
                seen = Some(h.step);
                if refuse {
                    Err(TransportError::Io(format!("refused {f}")))
                } else {
                    Ok(())
                }
            },
            &mut dst,
        );
        assert_eq!(seen, Some(f as u32), "frame {f}");
        if refuse {
            assert_eq!(r, Err(TransportError::Io(format!("refused {f}"))));
        } else if wrong_size {
            assert!(
                matches!(r, Err(TransportError::Protocol { peer: 0, .. })),
                "frame {f}: {r:?}"
            );
        } else {
            r.unwrap_or_else(|e| panic!("frame {f}: {e}"));
            assert_eq!(dst, want, "frame {f}");
        }
    }
    let _sender = tx.join().unwrap();
    let extra = receiver.recv_with(soon(50), &mut |_, _| Ok(()));
    assert!(
        matches!(extra, Err(TransportError::Timeout { peer: 0, .. })),
        "{extra:?}"
    );
}

/// With nobody reading, a sender stalls once the FIFO is full: after
/// exactly `steps` frames where the slots are the only buffer, within
/// `max_frames` where there are others. As the receiver takes frames the
/// stalled sender goes on, and every frame arrives intact and in order.
pub fn the_fifo_pushes_back_and_lets_go(suite: &Suite) {
    if suite.flow == Flow::Slots {
        slot_by_slot(suite);
    }
    let chunk = 64 << 10;
    let steps = 2;
    let max = match suite.flow {
        Flow::Slots => steps + 1,
        Flow::Buffered { max_frames } => max_frames,
    };
    let abort = AbortHandle::new();
    let (mut c0, mut c1) = suite.pair_filling(chunk, steps, &abort.signal());
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let sending = {
        let (done, stop) = (done.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut f = 0;
            while !stop.load(Ordering::SeqCst) {
                assert!(f < max, "{f} frames went out with nobody reading");
                let bytes = payload(0, f, chunk);
                host(&mut c0)
                    .sender
                    .send_from(data(f as u32), soon(30_000), &bytes)
                    .unwrap_or_else(|e| panic!("frame {f}: {e}"));
                f += 1;
                done.store(f, Ordering::SeqCst);
            }
            (f, c0)
        })
    };
    // Stalled: no send completed for 300 ms.
    let mut seen = (done.load(Ordering::SeqCst), Instant::now());
    while seen.1.elapsed() < Duration::from_millis(300) {
        assert!(!sending.is_finished(), "the sender never stalled");
        std::thread::sleep(Duration::from_millis(20));
        let now = done.load(Ordering::SeqCst);
        if now != seen.0 {
            seen = (now, Instant::now());
        }
    }
    let stalled = seen.0;
    match suite.flow {
        Flow::Slots => assert_eq!(stalled, steps, "frames that went out into a full FIFO"),
        Flow::Buffered { .. } => assert!(stalled >= steps, "stalled after {stalled} frames"),
    }
    stop.store(true, Ordering::SeqCst);
    let mut got = 0;
    loop {
        // Receive only frames known to have gone out: the sender counts a
        // frame once its send returned, and may have stopped (its thread
        // not yet finished) with no frame after it, which a receive would
        // wait for until its deadline.
        let finished = sending.is_finished();
        let sent = done.load(Ordering::SeqCst);
        if got == sent {
            if finished {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let (h, b) = recv_bytes(&mut c1, soon(30_000)).unwrap();
        assert_eq!(h.step as usize, got, "frames out of order");
        assert!(
            b == payload(0, got, chunk),
            "frame {got} changed on the way"
        );
        got += 1;
    }
    let (sent, _c0) = sending.join().unwrap();
    assert_eq!(got, sent);
    assert!(sent > stalled, "the stalled send never went on");
}

/// Slot by slot: one release frees exactly one slot.
fn slot_by_slot(suite: &Suite) {
    let (mut c0, mut c1, _abort) = suite.pair(128, 3);
    for f in 0..3 {
        send_bytes(&mut c0, header_for(0, f), &[f as u8; 10], soon(5_000)).unwrap();
    }
    // The ring is full: the fourth send waits and times out, naming rank 1.
    let err = send_bytes(&mut c0, header_for(0, 3), &[3; 10], soon(100));
    assert_timed_out_for_a_send_slot(&err, 1);
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

/// An error from `consume` is passed through, and the slot still goes
/// back: more frames than slots get through.
pub fn consume_error_is_returned_and_slot_released(suite: &Suite) {
    let (mut c0, mut c1, _abort) = suite.pair(256, 2);
    for f in 0..6 {
        let sent = payload(0, f, 100);
        send_bytes(&mut c0, header_for(0, f), &sent, soon(5_000)).unwrap();
        let err =
            host(&mut c1)
                .receiver
                .recv_with(soon(5_000), &mut |h: &FrameHeader, bytes: &[u8]| {
                    assert_eq!(h.step, f as u32);
                    assert_eq!(bytes, &sent[..]);
                    Err(TransportError::Io(format!("consumer says no {f}")))
                });
        assert_eq!(
            err,
            Err(TransportError::Io(format!("consumer says no {f}")))
        );
    }
    send_bytes(&mut c0, header_for(0, 9), &[1, 2, 3], soon(5_000)).unwrap();
    let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, h.len, bytes), (9, 3, vec![1, 2, 3]));
}

/// A fill that claims more than the slot, or a `send_from` of more than a
/// slot, is an error naming the size; nothing is sent, and the slot stays
/// free.
pub fn oversized_frames_are_errors_not_frames(suite: &Suite) {
    let (mut c0, mut c1, _abort) = suite.pair(128, 2);
    let sender = &mut host(&mut c0).sender;
    let err = sender.send_with(header_for(0, 0), soon(1_000), &mut |_| 129);
    assert!(
        matches!(err, Err(TransportError::Io(ref d)) if d.contains("129")),
        "{err:?}"
    );
    let err = sender.send_from(header_for(0, 0), soon(1_000), &[0; 129]);
    assert!(
        matches!(err, Err(TransportError::Io(ref d)) if d.contains("129")),
        "{err:?}"
    );
    sender
        .send_from(header_for(0, 7), soon(1_000), &[7; 128])
        .unwrap();
    let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, b), (7, vec![7; 128]));
    for f in 0..4 {
        send_bytes(&mut c0, header_for(0, f), &[f as u8; 5], soon(5_000)).unwrap();
        let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step, bytes), (f as u32, vec![f as u8; 5]));
    }
}

/// `recv_into` with a buffer of the wrong length is a `Protocol` error
/// naming both lengths, and a header that `check` refuses passes its
/// error through; neither writes a byte, and both free their slot.
pub fn recv_into_refuses_a_wrong_length_and_a_rejected_header(suite: &Suite) {
    let (mut c0, mut c1, _abort) = suite.pair(128, 2);
    send_bytes(&mut c0, header_for(0, 0), &[9; 10], soon(5_000)).unwrap();
    let mut dst = [0u8; 11];
    let receiver = &mut host(&mut c1).receiver;
    let err = receiver.recv_into(soon(5_000), &mut |_| Ok(()), &mut dst);
    assert!(
        matches!(err, Err(TransportError::Protocol { peer: 0, ref detail }) if detail.contains("10") && detail.contains("11")),
        "{err:?}"
    );
    assert_eq!(dst, [0u8; 11], "no byte placed on a length mismatch");
    send_bytes(&mut c0, header_for(0, 1), &[8; 11], soon(5_000)).unwrap();
    let receiver = &mut host(&mut c1).receiver;
    let err = receiver.recv_into(
        soon(5_000),
        &mut |h| Err(TransportError::Io(format!("step {} refused", h.step))),
        &mut dst,
    );
    assert_eq!(err, Err(TransportError::Io("step 1 refused".into())));
    assert_eq!(dst, [0u8; 11], "no byte placed before check accepts");
    // Both slots were released.
    send_bytes(&mut c0, header_for(0, 2), &[7; 11], soon(5_000)).unwrap();
    host(&mut c1)
        .receiver
        .recv_into(soon(5_000), &mut |_| Ok(()), &mut dst)
        .unwrap();
    assert_eq!(dst, [7u8; 11]);
}

/// A payload can be read in place as 8-byte elements.
pub fn payload_reads_as_f64(suite: &Suite) {
    let (mut c0, mut c1, _abort) = suite.pair(8 * 100, 2);
    let values: Vec<f64> = (0..100).map(|i| i as f64 * 0.5 - 7.25).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    host(&mut c0)
        .sender
        .send_from(header_for(0, 0), soon(5_000), &bytes)
        .unwrap();
    let mut sum = 0.0;
    host(&mut c1)
        .receiver
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

/// Dropping the listeners leaves their connections working.
pub fn connection_outlives_its_listeners(suite: &Suite) {
    let abort = AbortHandle::new();
    let l0 = suite.listen(&suite.config(0, 64, 2), &abort.signal());
    let l1 = suite.listen(&suite.config(1, 64, 2), &abort.signal());
    let (mut c0, mut c1) = pair_listeners(&*l0, l1);
    drop(l0);
    send_bytes(&mut c0, header_for(0, 0), &[], soon(1_000)).unwrap();
    let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.len, bytes.len()), (0, 0));
    send_bytes(&mut c1, header_for(1, 1), &[pattern(1, 1, 0)], soon(1_000)).unwrap();
    let (h, bytes) = recv_bytes(&mut c0, soon(5_000)).unwrap();
    assert_eq!((h.step, bytes), (1, vec![pattern(1, 1, 0)]));
}
