//! Conformance cases of connection set-up: who may connect, who gets which
//! connection, how waiting for a peer ends, and what the FIFO descriptors
//! say.

use super::{data, recv_bytes, send_bytes, soon, Suite, SIZE};
use crate::{
    AbortHandle, Connection, Counter, FifoDescriptor, HostInfo, ListenConfig, TransportError,
};
use std::time::{Duration, Instant};

/// Rank 0 with `cfg0` connects to rank 1 with the suite's configuration:
/// neither end may get a working connection. The connecting end is refused
/// at once or finds its connection dead (an error naming rank 1, not a
/// timeout); the accepting end never hands one out (a timeout, or a refusal
/// naming rank 0).
fn assert_refused(suite: &Suite, cfg0: ListenConfig) {
    let abort = AbortHandle::new();
    let l0 = suite.listen(&cfg0, &abort.signal());
    let l1 = suite.listen(&suite.config(1, 4096, 4), &abort.signal());
    let connected = l0.connect(1, &l1.address(), soon(5_000));
    let accepted = l1.accept(0, soon(500)).map(|_| ());
    assert!(
        matches!(
            accepted,
            Err(TransportError::Timeout {
                peer: 0,
                what: "a connection",
                ..
            }) | Err(TransportError::Connect { peer: 0, .. })
        ),
        "{accepted:?}"
    );
    match connected {
        Err(TransportError::Connect { peer: 1, .. }) => {}
        Ok(mut c0) => {
            let received = recv_bytes(&mut c0, soon(5_000)).map(|_| ());
            assert!(
                matches!(
                    received,
                    Err(TransportError::Connect { peer: 1, .. })
                        | Err(TransportError::PeerClosed { peer: 1, .. })
                ),
                "{received:?}"
            );
        }
        Err(other) => panic!("{other:?}"),
    }
}

/// A peer presenting another job token gets no connection.
pub fn wrong_token_is_refused(suite: &Suite) {
    let mut cfg = suite.config(0, 4096, 4);
    cfg.token ^= 0xdead;
    assert_refused(suite, cfg);
}

/// A peer of another communicator of the same job gets no connection.
pub fn wrong_communicator_is_refused(suite: &Suite) {
    let mut cfg = suite.config(0, 4096, 4);
    cfg.comm_id += 1;
    assert_refused(suite, cfg);
}

/// Ranks 0..3 connect every pair (lower connects, higher accepts) while
/// the acceptors take their peers in the reverse order of arrival: each
/// end gets the connection to the peer it asked for, as the frame that
/// each sends (its rank in the payload) shows.
pub fn connect_and_accept_pair_up_by_rank(suite: &Suite) {
    let ranks = 3.min(SIZE);
    let abort = AbortHandle::new();
    let listeners: Vec<_> = (0..ranks)
        .map(|r| suite.listen(&suite.config(r, 64, 2), &abort.signal()))
        .collect();
    let addrs: Vec<Vec<u8>> = listeners.iter().map(|l| l.address()).collect();
    let mut conns: Vec<Vec<Option<Connection>>> = (0..ranks)
        .map(|_| (0..ranks).map(|_| None).collect())
        .collect();
    std::thread::scope(|s| {
        let accepting: Vec<_> = listeners
            .iter()
            .enumerate()
            .map(|(me, l)| {
                s.spawn(move || {
                    // The highest peer first: it connects last.
                    (0..me)
                        .rev()
                        .map(|peer| (peer, l.accept(peer, soon(10_000)).expect("accept")))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (a, l) in listeners.iter().enumerate() {
            for b in a + 1..ranks {
                conns[a][b] = Some(l.connect(b, &addrs[b], soon(10_000)).expect("connect"));
            }
        }
        for (me, t) in accepting.into_iter().enumerate() {
            for (peer, conn) in t.join().unwrap() {
                conns[me][peer] = Some(conn);
            }
        }
    });
    for (me, row) in conns.iter_mut().enumerate() {
        for (peer, conn) in row.iter_mut().enumerate() {
            let Some(conn) = conn else { continue };
            assert_eq!(conn.peer, peer);
            assert_eq!(conn.transport, suite.name());
            send_bytes(conn, data(me as u32), &[me as u8; 3], soon(5_000)).unwrap();
        }
    }
    for (me, row) in conns.iter_mut().enumerate() {
        for (peer, conn) in row.iter_mut().enumerate() {
            let Some(conn) = conn else { continue };
            let (h, b) = recv_bytes(conn, soon(5_000)).unwrap();
            assert_eq!(
                (h.step, b),
                (peer as u32, vec![peer as u8; 3]),
                "at rank {me}"
            );
        }
    }
}

/// Waiting for a peer that never connects ends at the deadline, naming it.
pub fn accept_times_out_naming_an_absent_peer(suite: &Suite) {
    let abort = AbortHandle::new();
    let l1 = suite.listen(&suite.config(1, 64, 2), &abort.signal());
    let start = Instant::now();
    let err = l1.accept(3, soon(300)).map(|_| ());
    assert!(
        matches!(
            err,
            Err(TransportError::Timeout {
                peer: 3,
                what: "a connection",
                ..
            })
        ),
        "{err:?}"
    );
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// Abort ends a waiting accept within moments.
pub fn accept_is_aborted_promptly(suite: &Suite) {
    let abort = AbortHandle::new();
    let l1 = suite.listen(&suite.config(1, 64, 2), &abort.signal());
    let t = std::thread::spawn(move || {
        let start = Instant::now();
        (l1.accept(0, soon(60_000)).map(|_| ()), start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(100));
    abort.abort();
    let (r, waited) = t.join().unwrap();
    assert_eq!(r, Err(TransportError::Aborted));
    assert!(waited < Duration::from_secs(5));
}

/// Two ranks of one host (the same host identity) can be joined, and the
/// transport says its name.
pub fn ranks_of_one_host_can_connect(suite: &Suite) {
    let t = suite.transport();
    assert_eq!(t.name(), suite.name());
    let here = HostInfo {
        host_id: "boot-a/host/net:[1]".into(),
    };
    assert!(t.can_connect(&here, &here.clone()));
}

/// Each end describes both directions with the configured geometry; the
/// two ends agree on every direction's memory kind, sizes and layout; what
/// is mapped here lies inside the described mapping, and the counters are
/// aligned words apart from the slots.
pub fn fifo_descriptors_match_the_configuration(suite: &Suite) {
    let (chunk, steps) = (1000, 3);
    let (c0, c1, _abort) = suite.pair(chunk, steps);
    for conn in [&c0, &c1] {
        for fifo in [&conn.send_fifo, &conn.recv_fifo] {
            assert_eq!(
                (fifo.slot_count, fifo.slot_bytes),
                (steps, chunk),
                "{fifo:?}"
            );
            check_placement(fifo);
        }
        assert!(conn.host.is_some(), "no host data path: {conn:?}");
    }
    for (out, inn) in [
        (&c0.send_fifo, &c1.recv_fifo),
        (&c1.send_fifo, &c0.recv_fifo),
    ] {
        assert_eq!(out.memory, inn.memory);
        assert_eq!(out.slot_stride, inn.slot_stride);
        assert_eq!(out.layout, inn.layout);
        assert_eq!(out.slots.is_some(), inn.slots.is_some());
        assert_eq!(out.mapping.map(|m| m.len), inn.mapping.map(|m| m.len));
        for (a, b) in [(out.head, inn.head), (out.tail, inn.tail)] {
            assert_eq!(
                matches!(a, Counter::Mapped { .. }),
                matches!(b, Counter::Mapped { .. })
            );
        }
    }
    // The descriptions stay true while the connection works.
    let (mut c0, mut c1) = (c0, c1);
    send_bytes(&mut c0, data(1), &[1; 10], soon(5_000)).unwrap();
    let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
    assert_eq!((h.step, b), (1, vec![1; 10]));
}

/// Slots and mapped counters of `fifo` lie inside its mapping, counters
/// 8-aligned and outside the slots; the slot layout fits the stride.
fn check_placement(fifo: &FifoDescriptor) {
    if let Some(slots) = fifo.slot_range() {
        let mapping = fifo
            .mapping
            .expect("slots at a fixed place are in a mapping");
        assert!(mapping.contains(slots.addr, slots.len), "{fifo:?}");
        let l = &fifo.layout;
        assert!(l.payload + fifo.slot_bytes <= fifo.slot_stride, "{fifo:?}");
        if let Some(at) = l.published {
            assert!(at + 8 <= fifo.slot_stride && at % 8 == 0, "{fifo:?}");
            assert!(l
                .header
                .is_none_or(|h| h >= at + 8 || h + crate::HEADER_BYTES <= at));
        }
        if let Some(at) = l.header {
            assert!(at + crate::HEADER_BYTES <= fifo.slot_stride, "{fifo:?}");
        }
        if let Some(inline) = l.inline {
            assert!(
                inline.offset + inline.max_bytes <= fifo.slot_stride,
                "{fifo:?}"
            );
        }
    }
    for counter in [fifo.head, fifo.tail] {
        if let Counter::Mapped { addr } = counter {
            let mapping = fifo.mapping.expect("a mapped counter is in the mapping");
            assert!(mapping.contains(addr, 8), "{fifo:?}");
            assert_eq!(addr % 8, 0, "{fifo:?}");
            if let Some(slots) = fifo.slot_range() {
                assert!(
                    !slots.contains(addr, 8),
                    "a counter inside the slots: {fifo:?}"
                );
            }
        }
    }
    if let (Counter::Mapped { addr: h }, Counter::Mapped { addr: t }) = (fifo.head, fifo.tail) {
        assert_ne!(h, t, "{fifo:?}");
    }
}
