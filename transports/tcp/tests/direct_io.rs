//! The caller-memory paths (`send_from`, `recv_into`) and what doing the I/O
//! on the calling thread must not break: frame order mixed with the slot
//! paths, refused frames, two ranks writing big frames to each other at
//! once, and deadlines that cut a frame in the middle.

mod common;

use common::*;
use ferroccl_tcp::TcpTransport;
use ferroccl_transport::{AbortHandle, Connection, FrameHeader, TransportError};
use std::io::Write;
use std::time::{Duration, Instant};

fn data(step: u32) -> FrameHeader {
    FrameHeader::data(Default::default(), step)
}

fn payload(from: usize, frame: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| pattern(from, frame, i)).collect()
}

fn len_of(frame: usize, chunk: usize) -> usize {
    (frame * 7919 + 13) % (chunk + 1)
}

/// Frames alternate between `send_from` and `send_with` on one side and
/// between `recv_into` and `recv_with` on the other; every fifth frame is
/// refused by `check`, every seventh read into a buffer of the wrong size.
/// Refused frames are consumed, and the ones after them still arrive in
/// order.
fn mixed(nsocks: usize, steps: usize) {
    let chunk = 4096;
    let frames = 200;
    let (c0, c1, _abort) = pair(chunk, steps, nsocks);
    let Connection { mut sender, .. } = c0;
    let Connection { mut receiver, .. } = c1;
    let tx = std::thread::spawn(move || {
        for f in 0..frames {
            let bytes = payload(0, f, len_of(f, chunk));
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
        let want = payload(0, f, len_of(f, chunk));
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
        let mut dst = vec![
            0xeeu8;
            if wrong_size {
                want.len() + 1
            } else {
                want.len()
            }
        ];
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

#[test]
fn mixed_paths_keep_order_one_socket() {
    mixed(1, 4);
}

#[test]
fn mixed_paths_keep_order_three_sockets() {
    mixed(3, 4);
    mixed(3, 2);
}

#[test]
fn oversized_send_from_is_an_error_not_a_frame() {
    let (mut c0, mut c1, _abort) = pair(128, 2, 1);
    let err = c0.sender.send_from(data(0), soon(1_000), &[0; 129]);
    assert!(
        matches!(err, Err(TransportError::Io(ref d)) if d.contains("129")),
        "{err:?}"
    );
    c0.sender
        .send_from(data(1), soon(1_000), &[7; 128])
        .unwrap();
    let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, b), (1, vec![7; 128]));
}

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
                        c.sender
                            .send_from(data(f as u32), soon(30_000), &bytes)
                            .unwrap_or_else(|e| panic!("rank {me} frame {f}: {e}"));
                    }
                    let mut dst = vec![0u8; chunk];
                    for f in 0..frames {
                        c.receiver
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
    let r = c1.receiver.recv_into(soon(300), &mut |_| Ok(()), &mut dst);
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
    c1.receiver
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
        match c0.sender.send_from(data(f as u32), soon(200), &bytes) {
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
        c0.sender
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
