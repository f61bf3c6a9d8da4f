//! What TCP adds to the data-path cases of the conformance suite
//! (tests/conformance.rs): frames keep their order when socket buffers are
//! tiny and sockets outnumber slots; addresses are published and bound as
//! configured; fixed socket buffers work too.

mod common;

use common::*;
use std::time::Duration;

fn exchange_over(
    transport: &ferroccl_tcp::TcpTransport,
    chunk: usize,
    steps: usize,
    nsocks: usize,
    frames: usize,
) {
    let abort = ferroccl_transport::AbortHandle::new();
    let (c0, c1) = pair_with(transport, chunk, steps, nsocks, &abort.signal());
    exchange(c0, c1, chunk, frames, Paths::InSlot);
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
fn large_chunks_two_sockets() {
    exchange_over(&ferroccl_tcp::TcpTransport::new(), 1 << 20, 8, 2, 40);
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
