//! Hundreds of connections come and go without leaving threads behind.
//! Alone in its own test binary, so that the thread count it watches is
//! its own.

mod common;

use common::*;
use ferroccl_tcp::TcpTransport;
use ferroccl_transport::{AbortHandle, FrameHeader};
use std::time::{Duration, Instant};

fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn wait_for_threads(at_most: usize) -> usize {
    let start = Instant::now();
    loop {
        let n = threads_now();
        if n <= at_most || start.elapsed() > Duration::from_secs(20) {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn connections_and_listeners_release_their_threads() {
    let baseline = threads_now();
    assert!(baseline > 0, "cannot count threads here");
    let abort = AbortHandle::new();
    let t = TcpTransport::new();
    for round in 0..120usize {
        let nsocks = 1 + round % 3;
        let (mut c0, mut c1) = pair_with(&t, 4096, 2, nsocks, &abort.signal());
        // Listeners are gone already: one background reader per socket
        // and end remains (writes happen on the calling thread).
        assert!(threads_now() >= baseline + 2 * nsocks);
        for step in 0..5u32 {
            send_bytes(
                &mut c0,
                FrameHeader::data(Default::default(), step),
                &[round as u8; 33],
                soon(5_000),
            )
            .unwrap();
            let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
            assert_eq!((h.step, b), (step, vec![round as u8; 33]));
        }
        match round % 4 {
            0 => {}
            1 => c0.closer.close(),
            2 => c1.closer.close_with_failure(0, "test"),
            _ => {
                // Halves dropped in the other order, closer kept longest.
                let (sender, receiver, closer) = halves(c1);
                let kept = closer.clone();
                drop(receiver);
                drop(sender);
                drop(c0);
                drop(closer);
                drop(kept);
                continue;
            }
        }
        drop(c1);
        drop(c0);
    }
    let left = wait_for_threads(baseline);
    assert!(left <= baseline, "{left} threads left, {baseline} before");
}
