//! The TCP rendezvous: key-value semantics, token checks, robustness against
//! garbage, and the failure broadcast.

use ferroccl::bootstrap::{FailureReport, MismatchReport, Store, TcpStore, TcpStoreServer};
use ferroccl::Error;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const TOKEN: u64 = 0x5eed_cafe_f00d_0001;

fn server(world: usize) -> TcpStoreServer {
    let s = TcpStoreServer::start("127.0.0.1:0".parse().unwrap(), TOKEN, world).unwrap();
    s.set_shutdown_grace(Duration::from_secs(2));
    s
}

fn client(addr: SocketAddr, rank: usize) -> TcpStore {
    TcpStore::connect(addr, TOKEN, rank, in_secs(10)).unwrap()
}

fn in_secs(s: u64) -> Instant {
    Instant::now() + Duration::from_secs(s)
}

/// The next report within `within`, if any.
fn next_report(
    rx: &crossbeam_channel::Receiver<FailureReport>,
    within: Duration,
) -> Option<FailureReport> {
    rx.recv_timeout(within).ok()
}

#[test]
fn set_and_get_across_threads_and_clients() {
    let srv = server(4);
    let addr = srv.local_addr();
    let stores: Vec<Arc<TcpStore>> = (0..4).map(|r| Arc::new(client(addr, r))).collect();
    let handles: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(r, s)| {
            let s = s.clone();
            std::thread::spawn(move || {
                s.set(
                    &format!("addr/{r}"),
                    format!("value of rank {r}").as_bytes(),
                )
                .unwrap();
                // Everyone reads everyone, including keys set later.
                (0..4)
                    .map(|p| {
                        String::from_utf8(s.get(&format!("addr/{p}"), in_secs(10)).unwrap())
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let expected: Vec<String> = (0..4).map(|p| format!("value of rank {p}")).collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), expected);
    }
    // Overwrite, empty and binary values.
    stores[0].set("k", b"").unwrap();
    assert_eq!(stores[3].get("k", in_secs(5)).unwrap(), Vec::<u8>::new());
    let bin: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    stores[1].set("k", &bin).unwrap();
    assert_eq!(stores[2].get("k", in_secs(5)).unwrap(), bin);
    for s in &stores {
        s.goodbye();
    }
}

#[test]
fn concurrent_gets_from_one_process_do_not_block_each_other() {
    let srv = server(1);
    let store = Arc::new(client(srv.local_addr(), 0));
    // Several threads wait on keys that a later thread of the same process
    // sets: a single shared request connection would deadlock here.
    let waiters: Vec<_> = (0..4)
        .map(|i| {
            let s = store.clone();
            std::thread::spawn(move || s.get(&format!("late/{i}"), in_secs(10)).unwrap())
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..4 {
        store.set(&format!("late/{i}"), &[i as u8; 3]).unwrap();
    }
    for (i, w) in waiters.into_iter().enumerate() {
        assert_eq!(w.join().unwrap(), vec![i as u8; 3]);
    }
    store.goodbye();
}

#[test]
fn get_waits_for_a_later_set() {
    let srv = server(2);
    let addr = srv.local_addr();
    let a = client(addr, 0);
    let b = client(addr, 1);
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        b.set("later", b"here").unwrap();
        b
    });
    let t = Instant::now();
    assert_eq!(a.get("later", in_secs(10)).unwrap(), b"here");
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    a.goodbye();
    setter.join().unwrap().goodbye();
}

#[test]
fn get_deadline_gives_a_bootstrap_error_naming_the_key() {
    let srv = server(1);
    let a = client(srv.local_addr(), 0);
    let t = Instant::now();
    let err = a
        .get("never", Instant::now() + Duration::from_millis(300))
        .unwrap_err();
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(280), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    match err {
        Error::Bootstrap(msg) => {
            assert!(msg.contains("timed out after"), "{msg}");
            assert!(msg.contains("'never'"), "{msg}");
        }
        other => panic!("expected Error::Bootstrap, got {other:?}"),
    }
    // The connection is still usable after a timeout.
    a.set("never", b"now").unwrap();
    assert_eq!(a.get("never", in_secs(1)).unwrap(), b"now");
    a.goodbye();
}

#[test]
fn wrong_token_is_refused() {
    let srv = server(2);
    let addr = srv.local_addr();
    let err = TcpStore::connect(addr, TOKEN ^ 1, 1, in_secs(5)).unwrap_err();
    match err {
        Error::Bootstrap(msg) => {
            assert!(msg.contains("token"), "{msg}");
            assert!(msg.contains(&addr.to_string()), "{msg}");
        }
        other => panic!("expected Error::Bootstrap, got {other:?}"),
    }
    // A rank outside the job is refused too.
    let err = TcpStore::connect(addr, TOKEN, 2, in_secs(5)).unwrap_err();
    assert!(err.to_string().contains("rank 2"), "{err}");
    // And nobody was reported failed because of them.
    let good = client(addr, 0);
    assert_eq!(
        next_report(&good.failures(), Duration::from_millis(200)),
        None
    );
    good.goodbye();
}

#[test]
fn connect_retries_until_the_server_is_up() {
    let port = ferroccl::bootstrap::free_port().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let starter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        TcpStoreServer::start(addr, TOKEN, 1).unwrap()
    });
    let c = TcpStore::connect(addr, TOKEN, 0, in_secs(10)).unwrap();
    c.set("x", b"1").unwrap();
    c.goodbye();
    drop(starter.join().unwrap());
}

#[test]
fn connect_gives_up_at_the_deadline_naming_the_address() {
    let port = ferroccl::bootstrap::free_port().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let t = Instant::now();
    let err =
        TcpStore::connect(addr, TOKEN, 3, Instant::now() + Duration::from_millis(300)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    let msg = err.to_string();
    assert!(msg.contains(&addr.to_string()), "{msg}");
    assert!(msg.contains("after waiting"), "{msg}");
}

#[test]
fn port_in_use_is_named() {
    let srv = server(1);
    let err = TcpStoreServer::start(srv.local_addr(), TOKEN, 1).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&srv.local_addr().to_string()), "{msg}");
    assert!(msg.contains("already in use"), "{msg}");
}

/// Open a raw connection, send `bytes`, and wait until the server drops it.
fn send_raw_and_expect_drop(addr: SocketAddr, bytes: &[u8]) {
    send_raw(addr, bytes, false)
}

/// Like [`send_raw_and_expect_drop`], then close our side: a truncated frame.
fn send_truncated_and_expect_drop(addr: SocketAddr, bytes: &[u8]) {
    send_raw(addr, bytes, true)
}

fn send_raw(addr: SocketAddr, bytes: &[u8], close_write: bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(bytes);
    if close_write {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut sink = Vec::new();
    // Ends with EOF (or reset) once the server drops the connection; an
    // answer to garbage would be a bug, a timeout too.
    match s.read_to_end(&mut sink) {
        Ok(_) => {}
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "server did not drop the connection: {e}"
        ),
    }
    // Nothing, the OK to an authenticated hello (and nothing after it), or
    // a refusal.
    assert!(
        sink.is_empty() || sink == [0x81, 0, 0, 0, 0] || sink[0] == 0x84,
        "unexpected answer {sink:?}"
    );
}

fn hello(token: u64, rank: u32, kind: u8) -> Vec<u8> {
    hello_beating(token, rank, kind, 0)
}

/// A watch connection for `rank` opened by hand (hello, then the server's
/// OK), for tests that then misbehave on it.
fn raw_watcher(addr: std::net::SocketAddr, rank: u32) -> TcpStream {
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(&hello(TOKEN, rank, 1)).unwrap();
    let mut ok = [0u8; 5];
    raw.read_exact(&mut ok).unwrap();
    assert_eq!(ok[0], 0x81, "the server did not accept the watch hello");
    raw
}

/// A request connection for `rank` opened by hand.
fn raw_request(addr: std::net::SocketAddr, rank: u32) -> TcpStream {
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(&hello(TOKEN, rank, 0)).unwrap();
    let mut ok = [0u8; 5];
    raw.read_exact(&mut ok).unwrap();
    assert_eq!(ok[0], 0x81, "the server did not accept the request hello");
    raw
}

/// A hello that promises heartbeats every `beat_ms` (0: none).
fn hello_beating(token: u64, rank: u32, kind: u8, beat_ms: u32) -> Vec<u8> {
    let mut p = vec![0x01];
    p.extend_from_slice(&23u32.to_le_bytes());
    p.extend_from_slice(&u32::from_be_bytes(*b"FCCL").to_le_bytes());
    // The protocol's version (3: RELEASE).
    p.extend_from_slice(&3u16.to_le_bytes());
    p.push(kind);
    p.extend_from_slice(&rank.to_le_bytes());
    p.extend_from_slice(&token.to_le_bytes());
    p.extend_from_slice(&beat_ms.to_le_bytes());
    p
}

#[test]
fn garbage_does_not_disturb_the_server() {
    // Shows the server's WARN lines with --nocapture.
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let srv = server(2);
    let addr = srv.local_addr();
    let good = client(addr, 0);
    let rx = good.failures();
    good.set("before", b"1").unwrap();

    send_raw_and_expect_drop(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    send_raw_and_expect_drop(addr, &[0xff; 64]);
    // A hello that claims 4 GiB.
    send_raw_and_expect_drop(addr, &[0x01, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
    // A truncated hello, then close.
    send_truncated_and_expect_drop(addr, &hello(TOKEN, 1, 0)[..9]);
    // Authenticated request connections sending bad frames: an oversized
    // SET, an unknown opcode, a SET whose key length exceeds its payload,
    // a truncated frame.
    let mut bad = hello(TOKEN, 1, 0);
    bad.extend_from_slice(&[0x02, 0xff, 0xff, 0xff, 0x7f]);
    send_raw_and_expect_drop(addr, &bad);
    let mut bad = hello(TOKEN, 1, 0);
    bad.extend_from_slice(&[0x42, 0, 0, 0, 0]);
    send_raw_and_expect_drop(addr, &bad);
    let mut bad = hello(TOKEN, 1, 0);
    bad.extend_from_slice(&[0x02, 8, 0, 0, 0, 0xff, 0xff, 0, 0, 1, 2, 3, 4]);
    send_raw_and_expect_drop(addr, &bad);
    let mut bad = hello(TOKEN, 1, 0);
    bad.extend_from_slice(&[0x02, 100, 0, 0, 0, 1, 0, 0, 0, b'k']);
    send_truncated_and_expect_drop(addr, &bad);
    // Wrong token (answered with a refusal, then dropped).
    send_raw_and_expect_drop(addr, &hello(TOKEN + 1, 1, 1));

    // The good client still works and its key survived.
    assert_eq!(good.get("before", in_secs(5)).unwrap(), b"1");
    good.set("after", b"2").unwrap();
    let other = client(addr, 1);
    assert_eq!(other.get("after", in_secs(5)).unwrap(), b"2");
    // Garbage is not a rank failure.
    assert_eq!(next_report(&rx, Duration::from_millis(200)), None);
    other.goodbye();
    good.goodbye();
}

#[test]
fn silent_connection_is_dropped_after_the_hello_timeout() {
    let srv = server(1);
    srv.set_hello_timeout(Duration::from_millis(200));
    let mut s = TcpStream::connect(srv.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 1];
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0);
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn a_vanished_client_is_reported_by_rank() {
    let srv = server(3);
    let addr = srv.local_addr();
    let a = client(addr, 0);
    let rx = a.failures();
    let b = client(addr, 1);
    let c = client(addr, 2);
    // Rank 2 drops its store without goodbye, as a crash would.
    drop(c);
    let report = next_report(&rx, Duration::from_secs(5)).expect("no failure report");
    assert_eq!(report.rank, 2);
    assert!(
        report.reason.contains("lost its rendezvous connection"),
        "{report:?}"
    );
    // Rank 1 hears of it too, and a later subscriber gets the earlier report.
    let rb = b.failures();
    assert_eq!(
        next_report(&rb, Duration::from_secs(5)),
        Some(report.clone())
    );
    // Exactly one report: no rank 0 or rank 1 noise.
    assert_eq!(next_report(&rx, Duration::from_millis(200)), None);
    a.goodbye();
    b.goodbye();
}

#[test]
fn a_killed_raw_watch_connection_is_reported() {
    // Closer to a killed process: the socket just closes, no Drop code runs
    // on the client side beyond the kernel's.
    let srv = server(2);
    let addr = srv.local_addr();
    let a = client(addr, 0);
    let rx = a.failures();
    let raw = raw_watcher(addr, 1);
    drop(raw);
    let report = next_report(&rx, Duration::from_secs(5)).expect("no failure report");
    assert_eq!(report.rank, 1);
    a.goodbye();
}

#[test]
fn report_failure_reaches_every_client() {
    let srv = server(3);
    let addr = srv.local_addr();
    let stores: Vec<TcpStore> = (0..3).map(|r| client(addr, r)).collect();
    let rxs: Vec<_> = stores.iter().map(|s| s.failures()).collect();
    stores[1].report_failure(2, "timed out in all_reduce #7");
    let expected = FailureReport::failed(2, "timed out in all_reduce #7");
    for (r, rx) in rxs.iter().enumerate() {
        assert_eq!(
            next_report(rx, Duration::from_secs(5)),
            Some(expected.clone()),
            "rank {r}"
        );
    }
    for s in &stores {
        s.goodbye();
    }
    for rx in &rxs {
        assert_eq!(next_report(rx, Duration::from_millis(100)), None);
    }
}

#[test]
fn clean_shutdown_reports_nothing() {
    let srv = server(3);
    let addr = srv.local_addr();
    let stores: Vec<TcpStore> = (0..3).map(|r| client(addr, r)).collect();
    let rxs: Vec<_> = stores.iter().map(|s| s.failures()).collect();
    // Ranks 1 and 2 leave cleanly; rank 0 is still connected when the
    // server shuts down (its grace runs out): it hears "closing cleanly",
    // which is not a failure.
    stores[1].goodbye();
    stores[2].goodbye();
    srv.set_shutdown_grace(Duration::from_millis(300));
    let t = Instant::now();
    srv.shutdown();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    for (r, rx) in rxs.iter().enumerate() {
        assert_eq!(
            next_report(rx, Duration::from_millis(300)),
            None,
            "rank {r}"
        );
    }
    drop(stores);
    for rx in &rxs {
        assert_eq!(next_report(rx, Duration::from_millis(50)), None);
    }
}

#[test]
fn shutdown_waits_for_goodbyes() {
    let srv = server(2);
    srv.set_shutdown_grace(Duration::from_secs(10));
    let addr = srv.local_addr();
    let a = client(addr, 0);
    let b = client(addr, 1);
    let rx = a.failures();
    let leaver = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        b.set("done", b"1").unwrap();
        b.goodbye();
        drop(b);
    });
    a.goodbye();
    let t = Instant::now();
    srv.shutdown();
    let waited = t.elapsed();
    // It waited for rank 1's goodbye, but not for the whole grace period.
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    leaver.join().unwrap();
    assert_eq!(next_report(&rx, Duration::from_millis(200)), None);
}

#[test]
fn server_death_is_reported_as_rank_0() {
    let srv = server(2);
    let addr = srv.local_addr();
    let b = client(addr, 1);
    let rx = b.failures();
    // A server that vanishes without the clean-closing message: simulate
    // with a proxy we can cut.
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_addr = proxy.local_addr().unwrap();
    let cut = Arc::new(std::sync::Mutex::new(Vec::<TcpStream>::new()));
    let cut2 = cut.clone();
    std::thread::spawn(move || {
        for inbound in proxy.incoming() {
            let Ok(inbound) = inbound else { return };
            let outbound = TcpStream::connect(addr).unwrap();
            cut2.lock().unwrap().push(inbound.try_clone().unwrap());
            let (mut i1, mut o1) = (inbound.try_clone().unwrap(), outbound.try_clone().unwrap());
            let (mut i2, mut o2) = (inbound, outbound);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut i1, &mut o1);
                let _ = o1.shutdown(std::net::Shutdown::Both);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut o2, &mut i2);
            });
        }
    });
    let c = TcpStore::connect(proxy_addr, TOKEN, 0, in_secs(5)).unwrap();
    let rc = c.failures();
    for s in cut.lock().unwrap().iter() {
        s.shutdown(std::net::Shutdown::Both).unwrap();
    }
    let report = next_report(&rc, Duration::from_secs(5)).expect("no report");
    assert_eq!(
        report,
        FailureReport::failed(0, "the rendezvous host (rank 0) went away")
    );
    // The real server saw rank 0's connection vanish and told rank 1.
    let seen = next_report(&rx, Duration::from_secs(5)).expect("no report on rank 1");
    assert_eq!(seen.rank, 0);
    b.goodbye();
    drop(c);
}

#[test]
fn a_silent_watcher_is_reported_after_its_missed_heartbeats() {
    // A raw watch connection that promises heartbeats every 50 ms and then
    // sends none: what a stopped (SIGSTOP) process looks like, its socket
    // still open.
    let srv = server(2);
    let addr = srv.local_addr();
    let a = TcpStore::connect_with_heartbeat(
        addr,
        TOKEN,
        0,
        in_secs(10),
        Some(Duration::from_millis(50)),
    )
    .unwrap();
    let rx = a.failures();
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.write_all(&hello_beating(TOKEN, 1, 1, 50)).unwrap();
    let mut ok = [0u8; 5];
    raw.read_exact(&mut ok).unwrap();
    assert_eq!(ok[0], 0x81);
    let start = Instant::now();
    let report = next_report(&rx, Duration::from_secs(10)).expect("no failure report");
    let took = start.elapsed();
    assert_eq!(report.rank, 1, "{report:?}");
    assert!(report.reason.contains("no heartbeat"), "{report:?}");
    // Four intervals of 50 ms, plus scheduling on a loaded machine.
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // The server pushed its own beats meanwhile, and cut the connection.
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut pushed = Vec::new();
    let _ = raw.read_to_end(&mut pushed);
    assert!(
        pushed.len() >= 5 && pushed.chunks(5).any(|f| f == [0x87, 0, 0, 0, 0]),
        "no BEAT frame among {pushed:?}"
    );
    // The healthy client was never taken for silent.
    assert_eq!(next_report(&rx, Duration::from_millis(300)), None);
    a.goodbye();
}

#[test]
fn a_beating_client_is_not_reported() {
    let srv = server(2);
    let addr = srv.local_addr();
    // 100 ms: four missed beats are 400 ms of silence, which a sender
    // thread does not see even on a loaded machine (a 20 ms interval did
    // fail here at a load average of 15).
    let beat = Some(Duration::from_millis(100));
    let a = TcpStore::connect_with_heartbeat(addr, TOKEN, 0, in_secs(10), beat).unwrap();
    let b = TcpStore::connect_with_heartbeat(addr, TOKEN, 1, in_secs(10), beat).unwrap();
    let (ra, rb) = (a.failures(), b.failures());
    // Fifteen intervals of quiet application time: heartbeats keep both
    // sides alive.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(next_report(&ra, Duration::ZERO), None);
    assert_eq!(next_report(&rb, Duration::ZERO), None);
    a.goodbye();
    b.goodbye();
}

#[test]
fn a_silent_server_is_reported_as_rank_0() {
    // A fake rendezvous that accepts hellos and then says nothing: what a
    // stopped rank 0 looks like to the others.
    let fake = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = fake.local_addr().unwrap();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for _ in 0..2 {
            let (mut s, _) = fake.accept().unwrap();
            let mut hello = [0u8; 5 + 23];
            s.read_exact(&mut hello).unwrap();
            s.write_all(&[0x81, 0, 0, 0, 0]).unwrap();
            conns.push(s);
        }
        std::thread::sleep(Duration::from_secs(3));
        conns
    });
    let c = TcpStore::connect_with_heartbeat(
        addr,
        TOKEN,
        1,
        in_secs(10),
        Some(Duration::from_millis(50)),
    )
    .unwrap();
    let rx = c.failures();
    let start = Instant::now();
    let report = next_report(&rx, Duration::from_secs(10)).expect("no report");
    assert_eq!(report.rank, 0, "{report:?}");
    assert!(report.reason.contains("no heartbeat"), "{report:?}");
    assert!(
        !report.is_rendezvous_loss(),
        "silence is a failure of its own"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    drop(c);
    drop(held.join().unwrap());
}

#[test]
fn a_mismatch_report_reaches_every_client_whole() {
    let srv = server(3);
    let addr = srv.local_addr();
    let stores: Vec<TcpStore> = (0..3).map(|r| client(addr, r)).collect();
    let rxs: Vec<_> = stores.iter().map(|s| s.failures()).collect();
    let report = FailureReport {
        rank: 2,
        reason: "collective mismatch".into(),
        comm: None,
        mismatch: Some(MismatchReport {
            comm_id: 0xfeed_0000_0000_0001,
            seq: 3,
            peer: 1,
            local: "all_reduce #3 (float, sum, 12 elements)".into(),
            remote: "all_reduce #3 (float, sum, 10 elements) — é".into(),
            refused: false,
        }),
    };
    stores[2].report(report.clone());
    for (r, rx) in rxs.iter().enumerate() {
        assert_eq!(
            next_report(rx, Duration::from_secs(5)),
            Some(report.clone()),
            "rank {r}"
        );
    }
    for s in &stores {
        s.goodbye();
    }
}

#[test]
fn progress_questions_are_answered_by_each_process() {
    use std::sync::atomic::AtomicU64;
    let srv = server(3);
    let addr = srv.local_addr();
    let stores: Vec<TcpStore> = (0..3).map(|r| client(addr, r)).collect();
    let counters: Vec<Arc<AtomicU64>> = [5, 4, 5].map(|v| Arc::new(AtomicU64::new(v))).into();
    for (r, s) in stores.iter().enumerate() {
        s.register_progress(77, r, Arc::downgrade(&counters[r]));
    }
    // Another communicator's counter is not an answer for this one.
    let other = Arc::new(AtomicU64::new(99));
    stores[1].register_progress(78, 1, Arc::downgrade(&other));
    let got = stores[0].ask_progress(77, &[1, 2], in_secs(5));
    assert_eq!(got, vec![Some(4), Some(5)]);
    // A dropped counter no longer answers: the question waits for its
    // deadline and says so with None.
    drop(counters);
    let start = Instant::now();
    let got = stores[2].ask_progress(77, &[0, 1], Instant::now() + Duration::from_millis(300));
    assert_eq!(got, vec![None, None]);
    assert!(start.elapsed() < Duration::from_secs(5));
    for s in &stores {
        s.goodbye();
    }
}

#[test]
fn garbage_on_a_watch_connection_reports_that_rank_and_nothing_else() {
    let srv = server(2);
    let addr = srv.local_addr();
    let a = client(addr, 0);
    let rx = a.failures();
    let mut raw = raw_watcher(addr, 1);
    // A SET is not a watch frame; then a PROGRESS of the wrong size.
    raw.write_all(&[0x02, 0, 0, 0, 0]).unwrap();
    let report = next_report(&rx, Duration::from_secs(5)).expect("no report");
    assert_eq!(report.rank, 1);
    assert!(report.reason.contains("0x02"), "{report:?}");
    a.set("still", b"here").unwrap();
    assert_eq!(a.get("still", in_secs(5)).unwrap(), b"here");
    a.goodbye();
}

/// Keys of a scope stay until every party has released it (a late party
/// still reads them), then the server holds nothing of it; another scope
/// is untouched, and a malformed RELEASE (no parties) ends only its own
/// connection.
#[test]
fn released_scopes_leave_nothing_on_the_server() {
    let srv = server(3);
    let addr = srv.local_addr();
    let stores: Vec<TcpStore> = (0..3).map(|r| client(addr, r)).collect();
    for (r, s) in stores.iter().enumerate() {
        s.set(&format!("comm/0007/addr/{r}"), b"a").unwrap();
    }
    stores[0].set("comm/0008/addr/0", b"other").unwrap();
    let (held, _) = srv.held();
    stores[0].release("comm/0007/", 3);
    stores[1].release("comm/0007/", 3);
    assert_eq!(srv.held(), (held, 1));
    for r in 0..3 {
        assert_eq!(
            stores[2]
                .get(&format!("comm/0007/addr/{r}"), in_secs(5))
                .unwrap(),
            b"a"
        );
    }
    stores[2].release("comm/0007/", 3);
    assert_eq!(srv.held(), (held - 3, 0));
    let soon = Instant::now() + Duration::from_millis(50);
    assert!(stores[1].get("comm/0007/addr/0", soon).is_err());
    assert_eq!(
        stores[1].get("comm/0008/addr/0", in_secs(5)).unwrap(),
        b"other"
    );
    // RELEASE (0x09) for 0 parties: refused, the server goes on.
    let mut raw = raw_request(addr, 0);
    raw.write_all(&[0x09, 5, 0, 0, 0, 0, 0, 0, 0, b'c'])
        .unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(raw.read(&mut byte).unwrap_or(0), 0, "the connection ends");
    assert_eq!(srv.held(), (held - 3, 0));
    for s in &stores {
        s.goodbye();
    }
}
