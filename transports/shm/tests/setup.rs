//! Connection set-up through /dev/shm (beyond the conformance cases):
//! segments made for another job, communicator or geometry are refused
//! and the connecting rank learns why; a peer that never maps is a timeout
//! naming it; no segment outlives the set-up.

mod common;

use common::*;
use ferroccl_shm::ShmTransport;
use ferroccl_transport::{
    AbortHandle, HostInfo, ListenConfig, Listener, Transport, TransportError,
};

/// Rank 0 with `cfg0` connects to rank 1 with the default config; returns
/// what rank 1's accept saw within 500 ms, then what rank 0's first
/// receive saw, and the segments left over.
fn attempt(
    cfg0: ListenConfig,
) -> (
    Result<(), TransportError>,
    Result<(), TransportError>,
    Vec<String>,
) {
    let abort = AbortHandle::new();
    let l0 = listen(&cfg0, &abort.signal());
    let l1 = listen(&config(1, 4096, 4), &abort.signal());
    let prefix = l1.segment_prefix();
    let addr = l1.address();
    let mut c0 = l0
        .connect(1, &addr, soon(5_000))
        .expect("connect does not wait for the peer");
    let accepted = l1.accept(0, soon(500)).map(|_| ());
    let received = recv_bytes(&mut c0, soon(5_000)).map(|_| ());
    let left = segments(&prefix);
    drop(c0);
    (accepted, received, left)
}

fn assert_refused(cfg0: ListenConfig, reason: &str) {
    let (accepted, received, left) = attempt(cfg0);
    assert!(
        matches!(
            accepted,
            Err(TransportError::Timeout {
                peer: 0,
                what: "a connection",
                ..
            })
        ),
        "{reason}: {accepted:?}"
    );
    match received {
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
    assert_eq!(left, Vec::<String>::new(), "refused segments were unlinked");
}

#[test]
fn wrong_token_is_refused_and_never_accepted() {
    let mut cfg = config(0, 4096, 4);
    cfg.token ^= 0xdead;
    assert_refused(cfg, "wrong job token");
}

#[test]
fn other_mismatches_are_refused_with_their_reason() {
    let mut cfg = config(0, 4096, 4);
    cfg.comm_id += 1;
    assert_refused(cfg, "another communicator");
    assert_refused(config(0, 8192, 4), "chunk size");
    assert_refused(config(0, 4096, 8), "steps");
}

#[test]
fn matching_config_is_accepted_and_unlinked() {
    let (accepted, received, left) = attempt(config(0, 4096, 4));
    assert_eq!(accepted, Ok(()));
    // Accepted, and the acceptor's end dropped at once: its goodbye.
    assert_eq!(
        received,
        Err(TransportError::PeerClosed {
            peer: 1,
            detail: "peer shut down cleanly".into()
        })
    );
    assert_eq!(left, Vec::<String>::new());
}

#[test]
fn a_peer_that_never_maps_is_a_timeout_and_its_segments_go() {
    let abort = AbortHandle::new();
    let l0 = listen(&config(0, 64, 2), &abort.signal());
    let l1 = listen(&config(1, 64, 2), &abort.signal());
    let prefix = l1.segment_prefix();
    let mut c0 = l0.connect(1, &l1.address(), soon(300)).unwrap();
    assert_eq!(segments(&prefix).len(), 2, "one segment per direction");
    // Frames fit the ring before the peer maps it.
    send_bytes(&mut c0, data(0), b"early", soon(100)).unwrap();
    let err = recv_bytes(&mut c0, soon(5_000)).map(|_| ());
    assert!(
        matches!(err, Err(TransportError::Timeout { peer: 1, .. })),
        "{err:?}"
    );
    assert_eq!(segments(&prefix), Vec::<String>::new());
    // The accept that comes too late finds nothing.
    let late = l1.accept(0, soon(200)).map(|_| ());
    assert!(
        matches!(late, Err(TransportError::Timeout { peer: 0, .. })),
        "{late:?}"
    );
    drop(c0);
}

#[test]
fn dropping_an_unaccepted_connection_unlinks_its_segments() {
    let abort = AbortHandle::new();
    let l0 = listen(&config(0, 64, 2), &abort.signal());
    let l1 = listen(&config(1, 64, 2), &abort.signal());
    let prefix = l1.segment_prefix();
    let c0 = l0.connect(1, &l1.address(), soon(60_000)).unwrap();
    assert_eq!(segments(&prefix).len(), 2);
    drop(c0);
    assert_eq!(segments(&prefix), Vec::<String>::new());
}

#[test]
fn early_data_is_delivered_once_accepted() {
    let abort = AbortHandle::new();
    let l0 = listen(&config(0, 64, 3), &abort.signal());
    let l1 = listen(&config(1, 64, 3), &abort.signal());
    let mut c0 = l0.connect(1, &l1.address(), soon(10_000)).unwrap();
    for step in 0..3 {
        send_bytes(&mut c0, data(step), &[step as u8; 9], soon(100)).unwrap();
    }
    drop(c0);
    // The connector is gone (and unlinked its segments): nothing to accept.
    let err = l1.accept(0, soon(200)).map(|_| ());
    assert!(
        matches!(err, Err(TransportError::Timeout { .. })),
        "{err:?}"
    );

    let mut c0 = l0.connect(1, &l1.address(), soon(10_000)).unwrap();
    for step in 0..3 {
        send_bytes(&mut c0, data(step), &[step as u8; 9], soon(100)).unwrap();
    }
    let mut c1 = l1.accept(0, soon(5_000)).unwrap();
    for step in 0..3 {
        let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step, b), (step, vec![step as u8; 9]));
    }
}

#[test]
fn bad_addresses_are_connect_errors() {
    let abort = AbortHandle::new();
    let l0 = listen(&config(0, 64, 2), &abort.signal());
    let l2 = listen(&config(2, 64, 2), &abort.signal());
    for (peer, addr) in [
        (1, b"short".to_vec()),
        (1, vec![0u8; 24]),
        // Rank 2's address presented as rank 1's.
        (1, l2.address()),
        (0, l0.address()),
    ] {
        let err = l0.connect(peer, &addr, soon(1_000)).map(|_| ());
        assert!(
            matches!(err, Err(TransportError::Connect { peer: p, .. }) if p == peer),
            "{err:?}"
        );
    }
}

#[test]
fn bad_configs_are_refused_at_listen() {
    let abort = AbortHandle::new();
    for cfg in [config(0, 0, 2), config(0, 64, 0), config(7, 64, 2)] {
        let r = ShmTransport::new()
            .listen(&cfg, &abort.signal())
            .map(|_| ());
        assert!(matches!(r, Err(TransportError::Io(_))), "{r:?}");
    }
    let r = ShmTransport::with_dir("/no/such/dir")
        .listen(&config(0, 64, 2), &abort.signal())
        .map(|_| ());
    assert!(
        matches!(r, Err(TransportError::Io(ref d)) if d.contains("/no/such/dir")),
        "{r:?}"
    );
}

#[test]
fn can_connect_only_on_the_same_host() {
    let t = ShmTransport::new();
    assert_eq!(t.name(), "shm");
    let a = HostInfo {
        host_id: "boot-a/host/net:[1]".into(),
    };
    let b = HostInfo {
        host_id: "boot-b/host/net:[1]".into(),
    };
    assert!(t.can_connect(&a, &a.clone()));
    assert!(!t.can_connect(&a, &b));
    assert!(!ShmTransport::with_dir("/no/such/dir").can_connect(&a, &a.clone()));
}

#[test]
fn a_listener_removes_segments_left_for_it_when_it_goes() {
    // A peer that created its segments and died before this side mapped
    // them leaves files named for this listener; dropping the listener
    // removes them, and nothing with another listener's name.
    let abort = AbortHandle::new();
    let mine = listen(&config(1, 4096, 4), &abort.signal());
    let other = listen(&config(2, 4096, 4), &abort.signal());
    let dir = std::path::Path::new(ferroccl_shm::DEFAULT_DIR);
    let left = dir.join(format!("{}0-1", mine.segment_prefix()));
    let foreign = dir.join(format!("{}0-2", other.segment_prefix()));
    std::fs::write(&left, [0u8; 64]).expect("create a leftover segment");
    std::fs::write(&foreign, [0u8; 64]).expect("create another listener's segment");
    let prefix = mine.segment_prefix();
    drop(mine);
    assert_eq!(segments(&prefix), Vec::<String>::new());
    assert!(foreign.exists(), "another listener's segment was removed");
    drop(other);
    assert!(!foreign.exists());
}
