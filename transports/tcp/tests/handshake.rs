//! Connection set-up: refusals reach the connecting rank with a reason and
//! never reach `accept`; garbage on the listening port harms nothing.

mod common;

use common::*;
use ferroccl_tcp::TcpTransport;
use ferroccl_transport::{AbortHandle, ListenConfig, TransportError};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Rank 0 with `cfg0` connects to rank 1 with the default config; returns
/// the connect result and what rank 1's accept saw within 500 ms.
fn attempt(cfg0: ListenConfig) -> (Result<(), TransportError>, Result<(), TransportError>) {
    let abort = AbortHandle::new();
    let t = TcpTransport::new();
    let l0 = listen(&t, &cfg0, &abort.signal());
    let l1 = listen(&t, &config(1, 4096, 4, 2), &abort.signal());
    let addr = l1.address();
    let connected = l0.connect(1, &addr, soon(5_000)).map(|_| ());
    let accepted = l1.accept(0, soon(500)).map(|_| ());
    (connected, accepted)
}

fn assert_refused(cfg0: ListenConfig, reason: &str) {
    let (connected, accepted) = attempt(cfg0);
    match connected {
        Err(TransportError::Connect {
            peer: 1,
            ref detail,
        }) => {
            assert!(
                detail.contains("peer refused") && detail.contains(reason),
                "{detail}"
            )
        }
        other => panic!("expected a refusal for {reason:?}, got {other:?}"),
    }
    assert!(
        matches!(
            accepted,
            Err(TransportError::Timeout {
                peer: 0,
                what: "a connection",
                ..
            })
        ),
        "{accepted:?}"
    );
}

#[test]
fn wrong_token_is_refused_and_never_accepted() {
    let mut cfg = config(0, 4096, 4, 2);
    cfg.token ^= 0xdead;
    assert_refused(cfg, "wrong job token");
}

#[test]
fn other_mismatches_are_refused_with_their_reason() {
    let mut cfg = config(0, 4096, 4, 2);
    cfg.comm_id += 1;
    assert_refused(cfg, "communicator");
    assert_refused(config(0, 8192, 4, 2), "chunk size");
    assert_refused(config(0, 4096, 8, 2), "steps");
    assert_refused(config(0, 4096, 4, 3), "sockets per peer");
}

#[test]
fn matching_config_is_accepted() {
    let (connected, accepted) = attempt(config(0, 4096, 4, 2));
    assert_eq!(connected, Ok(()));
    assert_eq!(accepted, Ok(()));
}

#[test]
fn bad_addresses_and_absent_peers() {
    let abort = AbortHandle::new();
    let l0 = listen(&TcpTransport::new(), &config(0, 64, 2, 1), &abort.signal());
    for bad in [
        &b"not an address"[..],
        b"",
        b"\xff\xfe",
        b"127.0.0.1",
        b"1.2.3.4:99999",
    ] {
        let err = l0.connect(1, bad, soon(1_000)).map(|_| ());
        assert!(
            matches!(err, Err(TransportError::Connect { peer: 1, .. })),
            "{bad:?}: {err:?}"
        );
    }
    // Nothing listens there: refused until the deadline, then a timeout.
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let start = Instant::now();
    let err = l0
        .connect(1, format!("127.0.0.1:{port}").as_bytes(), soon(300))
        .map(|_| ());
    assert!(
        matches!(err, Err(TransportError::Timeout { peer: 1, .. })),
        "{err:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
    // Ranks outside the communicator are refused before any I/O.
    assert!(matches!(
        l0.accept(5, soon(1_000)),
        Err(TransportError::Connect { peer: 5, .. })
    ));
    assert!(matches!(
        l0.accept(0, soon(1_000)),
        Err(TransportError::Connect { peer: 0, .. })
    ));
}

#[test]
fn connect_waits_for_a_late_listener() {
    let abort = AbortHandle::new();
    let t = TcpTransport::new();
    // Reserve a port, release it, and start rank 1 on it a little later.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let l0 = listen(&t, &config(0, 64, 2, 1), &abort.signal());
    let signal = abort.signal();
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        // Bind the reserved port through a raw listener that performs the
        // accepting side by hand: read the hello, answer ok.
        let raw = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let (mut s, _) = raw.accept().unwrap();
        let mut hello = [0u8; 56];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&[0]).unwrap();
        drop(signal);
        hello
    });
    let conn = l0.connect(1, format!("127.0.0.1:{port}").as_bytes(), soon(10_000));
    assert!(conn.is_ok(), "{conn:?}");
    let hello = late.join().unwrap();
    assert_eq!(hello.to_vec(), raw_hello(TOKEN, COMM, 0, 1, 0, 1, 64, 2));
}

fn raw_connect(addr: &[u8]) -> TcpStream {
    let s = TcpStream::connect(socket_addr(addr)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Read the one-byte answer, or None if the listener closed without one.
fn answer(mut s: TcpStream) -> Option<u8> {
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(1) => Some(b[0]),
        _ => None,
    }
}

#[test]
fn garbage_does_not_harm_the_listener() {
    let abort = AbortHandle::new();
    let t = TcpTransport::new();
    let l1 = listen(&t, &config(1, 4096, 4, 1), &abort.signal());
    let addr = l1.address();

    // A silent client, kept open across the good connection below.
    let silent = raw_connect(&addr);

    // Random bytes (a fixed xorshift stream), more than a hello's worth.
    let mut x = 0x1234_5678_9abc_def0u64;
    let noise: Vec<u8> = (0..300)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let mut s = raw_connect(&addr);
    let _ = s.write_all(&noise);
    assert_ne!(answer(s), Some(0), "random bytes were accepted");

    // A truncated hello, then the client goes away.
    let mut s = raw_connect(&addr);
    s.write_all(&raw_hello(TOKEN, COMM, 0, 1, 0, 1, 4096, 4)[..30])
        .unwrap();
    drop(s);

    // A valid-looking hello announcing a huge chunk: refused, nothing
    // allocated for it (the process would abort on a 2^63-byte request).
    let mut s = raw_connect(&addr);
    s.write_all(&raw_hello(TOKEN, COMM, 0, 1, 0, 1, 1 << 63, 4))
        .unwrap();
    let code = answer(s);
    assert!(matches!(code, Some(c) if c != 0), "{code:?}");

    // Absurd ranks and indices.
    for hello in [
        raw_hello(TOKEN, COMM, u32::MAX, 1, 0, 1, 4096, 4),
        raw_hello(TOKEN, COMM, 0, 1, u32::MAX, 1, 4096, 4),
        raw_hello(TOKEN, COMM, 0, u32::MAX, 0, 1, 4096, 4),
        raw_hello(TOKEN, COMM, 0, 1, 0, u32::MAX, 4096, 4),
    ] {
        let mut s = raw_connect(&addr);
        s.write_all(&hello).unwrap();
        let code = answer(s);
        assert!(matches!(code, Some(c) if c != 0), "{code:?}");
    }

    // None of that reached accept.
    let err = l1.accept(0, soon(200)).map(|_| ());
    assert!(
        matches!(err, Err(TransportError::Timeout { peer: 0, .. })),
        "{err:?}"
    );

    // A good peer still gets through, promptly, while the silent client
    // holds its socket open.
    let l0 = listen(&t, &config(0, 4096, 4, 1), &abort.signal());
    let start = Instant::now();
    let acceptor = std::thread::spawn(move || l1.accept(0, soon(10_000)));
    let mut c0 = l0
        .connect(1, &addr, soon(10_000))
        .expect("good peer connects");
    let mut c1 = acceptor.join().unwrap().expect("good peer accepted");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "a silent client delayed the handshake"
    );
    send_bytes(
        &mut c0,
        ferroccl_transport::FrameHeader::data(Default::default(), 3),
        b"hello",
        soon(5_000),
    )
    .unwrap();
    let (h, bytes) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, &bytes[..]), (3, &b"hello"[..]));
    drop(silent);
}

#[test]
fn hand_written_hello_is_accepted() {
    let abort = AbortHandle::new();
    let l1 = listen(
        &TcpTransport::new(),
        &config(1, 4096, 4, 1),
        &abort.signal(),
    );
    let mut s = raw_connect(&l1.address());
    s.write_all(&raw_hello(TOKEN, COMM, 0, 1, 0, 1, 4096, 4))
        .unwrap();
    assert_eq!(answer(s.try_clone().unwrap()), Some(0));
    let conn = l1.accept(0, soon(5_000)).expect("accepted");
    assert_eq!(conn.peer, 0);
}

#[test]
fn abort_interrupts_accept_and_connect_retries() {
    let abort = AbortHandle::new();
    let l1 = listen(&TcpTransport::new(), &config(1, 64, 2, 1), &abort.signal());
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let l0 = listen(&TcpTransport::new(), &config(0, 64, 2, 1), &abort.signal());
    let accepting = std::thread::spawn(move || l1.accept(0, soon(60_000)).map(|_| ()));
    let connecting = std::thread::spawn(move || {
        l0.connect(1, format!("127.0.0.1:{port}").as_bytes(), soon(60_000))
            .map(|_| ())
    });
    std::thread::sleep(Duration::from_millis(200));
    let start = Instant::now();
    abort.abort();
    assert_eq!(accepting.join().unwrap(), Err(TransportError::Aborted));
    assert_eq!(connecting.join().unwrap(), Err(TransportError::Aborted));
    assert!(start.elapsed() < Duration::from_secs(5));
}
