//! What the emulated-verbs tests of the data path share: two ranks joined
//! on an emulated fabric, frame headers, deadlines, and a bound on a test's
//! time.

#![allow(dead_code)]

use ferroccl_ib::conn::{self, EndParts, Geometry, LocalRegions};
use ferroccl_ib::{EmuDevice, EmuFabric, EmuQp, IbCloser, IbReceiver, IbSender, ZeroCopyConfig};
use ferroccl_transport::{AbortHandle, FrameHeader};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

pub type End = (
    IbSender<EmuDevice, EmuQp>,
    IbReceiver<EmuDevice, EmuQp>,
    Arc<IbCloser<EmuDevice, EmuQp>>,
);

/// Ranks 0 and 1 on devices of `fabric`, joined with geometry `g` and
/// zero-copy settings `z`; also the devices and rank 1's regions.
pub fn connect(
    fabric: &EmuFabric,
    g: Geometry,
    z: ZeroCopyConfig,
    abort: &AbortHandle,
) -> (End, End, [EmuDevice; 2], LocalRegions) {
    let devs = [fabric.device(), fabric.device()];
    let regions = [
        LocalRegions::register(&devs[0], &g).unwrap(),
        LocalRegions::register(&devs[1], &g).unwrap(),
    ];
    let mut out: [Vec<EmuQp>; 2] = [Vec::new(), Vec::new()];
    let mut inq: [Vec<EmuQp>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..g.qps {
        for from in 0..2 {
            let (a, b) = fabric.connect(&devs[from], &devs[1 - from], g.queue_depth());
            out[from].push(a);
            inq[1 - from].push(b);
        }
    }
    let [out0, out1] = out;
    let [in0, in1] = inq;
    let end = |rank: usize, out_qps, in_qps| {
        conn::open_with(
            EndParts {
                rank,
                peer: 1 - rank,
                geometry: g,
                dev: devs[rank].clone(),
                regions: regions[rank],
                remote: regions[1 - rank].info(),
                out_qps,
                in_qps,
                abort: abort.signal(),
            },
            z,
        )
        .unwrap()
    };
    let e0 = end(0, out0, in0);
    let e1 = end(1, out1, in1);
    (e0, e1, devs.clone(), regions[1])
}

pub fn header(i: usize) -> FrameHeader {
    FrameHeader::data(Default::default(), i as u32)
}

pub fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// Runs `f` on a thread; fails the test if it takes over 30 s.
pub fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("test hung or panicked")
}
