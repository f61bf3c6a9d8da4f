//! Frames cross a loopback connection intact, in order, in both directions
//! at once, with one and with several sockets per peer.

mod common;

use common::*;
use ferroccl_transport::{Fingerprint, FrameHeader, FrameKind};
use std::time::Duration;

fn header_for(from: usize, frame: usize) -> FrameHeader {
    FrameHeader::data(
        Fingerprint {
            seq: (from as u64) << 40 | frame as u64,
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

fn exchange(chunk: usize, steps: usize, nsocks: usize, frames: usize) {
    exchange_over(
        &ferroccl_tcp::TcpTransport::new(),
        chunk,
        steps,
        nsocks,
        frames,
    );
}

fn exchange_over(
    transport: &ferroccl_tcp::TcpTransport,
    chunk: usize,
    steps: usize,
    nsocks: usize,
    frames: usize,
) {
    let abort = ferroccl_transport::AbortHandle::new();
    let (c0, c1) = pair_with(transport, chunk, steps, nsocks, &abort.signal());
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for (me, conn) in [(0usize, c0), (1usize, c1)] {
        let peer = 1 - me;
        let ferroccl_transport::Connection {
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
                sender
                    .send_with(header_for(me, f), soon(20_000), &mut |buf: &mut [u8]| {
                        assert_eq!(buf.len(), chunk);
                        assert_eq!(buf.as_ptr() as usize % 8, 0, "send slot not 8-byte aligned");
                        for (i, b) in buf[..len].iter_mut().enumerate() {
                            *b = pattern(me, f, i);
                        }
                        len
                    })
                    .unwrap_or_else(|e| panic!("rank {me} frame {f}: {e}"));
            }
            sender
        }));
        receivers.push(std::thread::spawn(move || {
            let _keep = closer;
            for f in 0..frames {
                let mut seen = false;
                receiver
                    .recv_with(soon(20_000), &mut |h: &FrameHeader, bytes: &[u8]| {
                        seen = true;
                        let mut want = header_for(peer, f);
                        want.len = size_of(f, chunk) as u32;
                        assert_eq!(*h, want, "rank {me} frame {f}");
                        assert_eq!(h.kind, FrameKind::Data);
                        assert_eq!(bytes.len(), want.len as usize);
                        assert_eq!(bytes.as_ptr() as usize % 8, 0, "recv slot not 8-byte aligned");
                        for (i, b) in bytes.iter().enumerate() {
                            assert_eq!(*b, pattern(peer, f, i), "rank {me} frame {f} byte {i}");
                        }
                        Ok(())
                    })
                    .unwrap_or_else(|e| panic!("rank {me} frame {f}: {e}"));
                assert!(seen);
            }
            // Nothing more was sent.
            let extra = receiver.recv_with(soon(50), &mut |_, _| Ok(()));
            assert!(
                matches!(extra, Err(ferroccl_transport::TransportError::Timeout { peer: p, what: "data", .. }) if p == peer),
                "{extra:?}"
            );
            receiver
        }));
    }
    // Senders stay alive until every receiver is done, so that no Goodbye
    // reaches a receiver that still checks for silence.
    let senders: Vec<_> = senders
        .into_iter()
        .map(|t| t.join().expect("a sender panicked"))
        .collect();
    for t in receivers {
        t.join().expect("a receiver panicked");
    }
    drop(senders);
}

#[test]
fn one_socket_small_chunks_wrap_many_times() {
    exchange(1000, 4, 1, 300);
}

#[test]
fn three_sockets_preserve_order() {
    exchange(1000, 4, 3, 300);
}

#[test]
fn fewer_steps_than_sockets_under_backpressure() {
    // Tiny socket buffers make every socket fill up, so that readers wait
    // for slots while later frames sit on other sockets.
    let t = ferroccl_tcp::TcpTransport::new().with_socket_buffer_bytes(Some(8 << 10));
    exchange_over(&t, 32 << 10, 1, 3, 60);
    exchange_over(&t, 32 << 10, 2, 4, 60);
}

#[test]
fn one_step_fifo() {
    exchange(64, 1, 1, 100);
}

#[test]
fn large_chunks_two_sockets() {
    exchange(1 << 20, 8, 2, 40);
}

#[test]
fn consume_error_is_returned_and_slot_released() {
    let (mut c0, mut c1, _abort) = pair(256, 2, 1);
    for f in 0..6 {
        let payload: Vec<u8> = (0..100).map(|i| pattern(0, f, i)).collect();
        send_bytes(&mut c0, header_for(0, f), &payload, soon(5_000)).unwrap();
        let err = c1
            .receiver
            .recv_with(soon(5_000), &mut |h: &FrameHeader, bytes: &[u8]| {
                assert_eq!(h.step, f as u32);
                assert_eq!(bytes, &payload[..]);
                Err(ferroccl_transport::TransportError::Io(format!(
                    "consumer says no {f}"
                )))
            });
        assert_eq!(
            err,
            Err(ferroccl_transport::TransportError::Io(format!(
                "consumer says no {f}"
            )))
        );
    }
    // More frames than slots went through: every refused slot was released.
    send_bytes(&mut c0, header_for(0, 9), &[1, 2, 3], soon(5_000)).unwrap();
    let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, h.len, bytes), (9, 3, vec![1, 2, 3]));
}

#[test]
fn oversized_fill_is_an_error_not_a_frame() {
    let (mut c0, mut c1, _abort) = pair(128, 2, 1);
    let err = c0
        .sender
        .send_with(header_for(0, 0), soon(1_000), &mut |_| 129);
    assert!(
        matches!(err, Err(ferroccl_transport::TransportError::Io(ref d)) if d.contains("129")),
        "{err:?}"
    );
    // The slot came back and the connection still works.
    for f in 0..4 {
        send_bytes(&mut c0, header_for(0, f), &[f as u8; 5], soon(5_000)).unwrap();
        let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step, bytes), (f as u32, vec![f as u8; 5]));
    }
}

#[test]
fn default_address_is_published_and_reachable() {
    let abort = ferroccl_transport::AbortHandle::new();
    let transport = ferroccl_tcp::TcpTransport::new();
    let mut cfg0 = config(0, 64, 2, 1);
    let mut cfg1 = config(1, 64, 2, 1);
    cfg0.bind_addr = None;
    cfg1.bind_addr = None;
    let l0 = listen(&transport, &cfg0, &abort.signal());
    let l1 = listen(&transport, &cfg1, &abort.signal());
    let addr = socket_addr(&l1.address());
    assert!(!addr.ip().is_unspecified(), "published {addr}");
    assert_ne!(addr.port(), 0);
    let addr1 = l1.address();
    let t = std::thread::spawn(move || l1.accept(0, soon(10_000)));
    let mut c0 = l0.connect(1, &addr1, soon(10_000)).unwrap();
    let mut c1 = t.join().unwrap().unwrap();
    assert_eq!(c1.peer, 0);
    assert_eq!(c0.peer, 1);
    drop(l0);
    // The connection outlives its listener.
    send_bytes(&mut c0, header_for(0, 0), &[], soon(1_000)).unwrap();
    let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.len, bytes.len()), (0, 0));
}

#[test]
fn loopback_interface_by_name() {
    let abort = ferroccl_transport::AbortHandle::new();
    let mut cfg = config(0, 64, 2, 1);
    cfg.bind_addr = None;
    cfg.ifname = Some("=lo".into());
    let l = listen(&ferroccl_tcp::TcpTransport::new(), &cfg, &abort.signal());
    assert_eq!(
        socket_addr(&l.address()).ip(),
        std::net::Ipv4Addr::LOCALHOST
    );
    cfg.ifname = Some("=no-such-interface0".into());
    let err = ferroccl_transport::Transport::listen(
        &ferroccl_tcp::TcpTransport::new(),
        &cfg,
        &abort.signal(),
    )
    .map(|_| ());
    assert!(
        matches!(err, Err(ferroccl_transport::TransportError::Io(ref d)) if d.contains("no-such-interface0")),
        "{err:?}"
    );
}

#[test]
fn fixed_socket_buffers_work_too() {
    let abort = ferroccl_transport::AbortHandle::new();
    let transport = ferroccl_tcp::TcpTransport::new().with_socket_buffer_bytes(Some(4 << 20));
    let (mut c0, mut c1) = pair_with(&transport, 4096, 2, 2, &abort.signal());
    for f in 0..10 {
        let payload: Vec<u8> = (0..4096).map(|i| pattern(1, f, i)).collect();
        send_bytes(&mut c1, header_for(1, f), &payload, soon(5_000)).unwrap();
        let (_, got) = recv_bytes(&mut c0, soon(5_000)).unwrap();
        assert_eq!(got, payload);
    }
    std::thread::sleep(Duration::from_millis(1));
}
