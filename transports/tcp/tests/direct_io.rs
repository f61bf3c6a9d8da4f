//! What doing the I/O on the calling thread must not break, beyond the
//! conformance cases (tests/conformance.rs, which mix the caller-memory
//! and slot paths): two ranks writing big frames to each other at once,
//! and deadlines that cut a frame in the middle.

mod common;

use common::*;
use ferroccl_tcp::TcpTransport;
use ferroccl_transport::{AbortHandle, TransportError};
use std::io::Write;
use std::time::{Duration, Instant};

/// Both ranks send more than the socket buffers hold to each other before
/// either receives: the background readers must drain, or both hang.
#[test]
fn both_ranks_writing_big_frames_to_each_other_do_not_deadlock() {
    for nsocks in [1, 2] {
        let abort = AbortHandle::new();
        let t = TcpTransport::new().with_socket_buffer_bytes(Some(16 << 10));
        let chunk = 1 << 20;
        let steps = 4;
        let (c0, c1) = pair_with(&t, chunk, steps, nsocks, &abort.signal());
        let start = Instant::now();
        let ends: Vec<_> = [(0usize, c0), (1, c1)]
            .into_iter()
            .map(|(me, mut c)| {
                std::thread::spawn(move || {
                    let frames = steps;
                    for f in 0..frames {
                        let bytes = payload(me, f, chunk);
                        host(&mut c)
                            .sender
                            .send_from(data(f as u32), soon(30_000), &bytes)
                            .unwrap_or_else(|e| panic!("rank {me} frame {f}: {e}"));
                    }
                    let mut dst = vec![0u8; chunk];
                    for f in 0..frames {
                        host(&mut c)
                            .receiver
                            .recv_into(soon(30_000), &mut |_| Ok(()), &mut dst)
                            .unwrap_or_else(|e| panic!("rank {me} frame {f}: {e}"));
                        assert!(dst == payload(1 - me, f, chunk), "rank {me} frame {f}");
                    }
                    c
                })
            })
            .collect();
        let _conns: Vec<_> = ends.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(start.elapsed() < Duration::from_secs(20));
    }
}

/// A deadline that passes in the middle of a payload bound for the
/// caller's buffer loses nothing: the part that arrived moves to a slot and
/// the next receive gets the whole frame.
#[test]
fn recv_into_deadline_inside_a_payload_keeps_the_frame() {
    let (mut s, mut c1, _abort) = raw_peer(1024, 2);
    let body: Vec<u8> = (0..100u8).collect();
    s.write_all(&raw_header(1, 0, 100, 0)).unwrap();
    s.write_all(&body[..30]).unwrap();
    let mut dst = vec![0u8; 100];
    let r = host(&mut c1)
        .receiver
        .recv_into(soon(300), &mut |_| Ok(()), &mut dst);
    assert!(
        matches!(
            r,
            Err(TransportError::Timeout {
                peer: 0,
                what: "data",
                ..
            })
        ),
        "{r:?}"
    );
    s.write_all(&body[30..]).unwrap();
    s.write_all(&raw_header(1, 1, 3, 0)).unwrap();
    s.write_all(&[1, 2, 3]).unwrap();
    let mut dst = vec![0u8; 100];
    host(&mut c1)
        .receiver
        .recv_into(
            soon(5_000),
            &mut |h| {
                assert_eq!(h.step, 0);
                Ok(())
            },
            &mut dst,
        )
        .unwrap();
    assert_eq!(dst, body);
    let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, b), (1, vec![1, 2, 3]));
}

/// A send whose deadline passes after part of its frame went out keeps the
/// stream framed: its tail goes ahead of the next frame, and the receiver
/// sees whole frames in order.
#[test]
fn send_cut_short_keeps_the_stream_framed() {
    let abort = AbortHandle::new();
    let t = TcpTransport::new().with_socket_buffer_bytes(Some(16 << 10));
    let chunk = 64 << 10;
    let (mut c0, mut c1) = pair_with(&t, chunk, 2, 1, &abort.signal());
    let mut cut_at = None;
    for f in 0..10_000usize {
        let bytes = payload(0, f, chunk);
        match host(&mut c0)
            .sender
            .send_from(data(f as u32), soon(200), &bytes)
        {
            Ok(()) => {}
            Err(TransportError::Timeout { peer: 1, .. }) => {
                cut_at = Some(f);
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    let cut_at = cut_at.expect("the socket never filled up");
    let next = cut_at + 1;
    let sending = std::thread::spawn(move || {
        let bytes = payload(0, next, chunk);
        host(&mut c0)
            .sender
            .send_from(data(next as u32), soon(30_000), &bytes)
            .unwrap();
        c0
    });
    let mut steps = Vec::new();
    while steps.last() != Some(&(next as u32)) {
        let (h, b) = recv_bytes(&mut c1, soon(30_000)).unwrap();
        assert_eq!(b, payload(0, h.step as usize, chunk), "frame {}", h.step);
        steps.push(h.step);
    }
    // Frames 0..cut_at, then the cut one if any of it had gone out, then
    // the next.
    let mut want: Vec<u32> = (0..cut_at as u32).collect();
    if steps.len() == cut_at + 2 {
        want.push(cut_at as u32);
    }
    want.push(next as u32);
    assert_eq!(steps, want);
    let _c0 = sending.join().unwrap();
}
