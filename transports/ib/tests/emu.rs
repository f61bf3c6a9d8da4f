//! The emulated verbs against what RC hardware guarantees. Every expected
//! value is computed here, independently of the emulation.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ferroccl_ib::{
    Completion, CompletionKind, Device, EmuDevice, EmuFabric, EmuQp, LocalSlice, MemoryRegion,
    QpState, QueuePair, RemoteSlice, VerbsError, WcError, WriteRequest,
};

const TIMEOUT: Duration = Duration::from_secs(5);

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn write(
    wr_id: u64,
    src: &MemoryRegion,
    src_off: usize,
    len: usize,
    remote: RemoteSlice,
    imm: Option<u32>,
) -> WriteRequest {
    WriteRequest {
        wr_id,
        local: LocalSlice {
            mr: src.handle,
            offset: src_off,
            len,
        },
        remote,
        imm,
    }
}

/// Byte `offset` of the peer's region `mr`, as a work request names it.
fn at(mr: &MemoryRegion, offset: usize) -> RemoteSlice {
    RemoteSlice {
        rkey: mr.rkey,
        addr: mr.addr + offset as u64,
    }
}

/// Two devices of one fabric joined by a queue pair of send-queue depth
/// `depth`, with a region of `src_len` bytes on the first device (the
/// sender's) and one of `dst_len` on the second.
fn pair(
    depth: usize,
    src_len: usize,
    dst_len: usize,
) -> (
    EmuFabric,
    EmuDevice,
    EmuDevice,
    EmuQp,
    EmuQp,
    MemoryRegion,
    MemoryRegion,
) {
    let fabric = EmuFabric::new();
    let (da, db) = (fabric.device(), fabric.device());
    let (a, b) = fabric.connect(&da, &db, depth);
    let src = da.register(src_len).unwrap();
    let dst = db.register(dst_len).unwrap();
    (fabric, da, db, a, b, src, dst)
}

/// Runs `f` on a thread and fails the test if it takes longer than
/// `TIMEOUT` (instead of hanging).
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(TIMEOUT).expect("test hung or panicked")
}

/// Waits for exactly one completion.
fn one(qp: &impl QueuePair) -> Completion {
    let mut c = qp.wait(1, TIMEOUT);
    assert_eq!(c.len(), 1, "no completion within {TIMEOUT:?}");
    c.pop().unwrap()
}

#[test]
fn writes_land_at_offsets_in_order() {
    bounded(|| {
        let (_fabric, da, db, a, b, src, dst) = pair(8, 4096, 16 * 1024);
        let mut reference = vec![0u8; dst.len];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut done = Vec::new();
        let messages = 2000u64;
        for id in 0..messages {
            // Overlapping writes: only in-order execution gives the reference.
            let len = 1 + rng.below(512);
            let dst_off = rng.below(dst.len - len + 1);
            let src_off = rng.below(src.len - len + 1);
            let payload: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            // The source is rewritten only once the previous write is done,
            // as a real sender must.
            while a.outstanding() > 0 {
                done.extend(a.wait(usize::MAX, TIMEOUT));
            }
            da.write_region(src.handle, src_off, &payload).unwrap();
            reference[dst_off..dst_off + len].copy_from_slice(&payload);
            a.post_write(&write(id, &src, src_off, len, at(&dst, dst_off), None))
                .unwrap();
        }
        while a.outstanding() > 0 {
            done.extend(a.wait(usize::MAX, TIMEOUT));
        }
        let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, (0..messages).collect::<Vec<_>>());
        assert!(done
            .iter()
            .all(|c| c.kind == CompletionKind::SendDone && c.status.is_ok()));
        let mut got = vec![0u8; dst.len];
        db.read_region(dst.handle, 0, &mut got).unwrap();
        assert!(got == reference, "destination differs from the reference");
        // No immediate was sent: nothing for the receiver.
        assert!(b.poll(16).is_empty());
    });
}

#[test]
fn pipelined_writes_land_in_order() {
    // Many writes in flight at once, all to the same bytes from distinct
    // source slots: the last one posted must be what remains.
    bounded(|| {
        let (_fabric, da, db, a, _b, src, dst) = pair(32, 32 * 64, 64);
        for slot in 0..32usize {
            da.write_region(src.handle, slot * 64, &[slot as u8 + 1; 64])
                .unwrap();
            a.post_write(&write(slot as u64, &src, slot * 64, 64, at(&dst, 0), None))
                .unwrap();
        }
        let mut done = Vec::new();
        while done.len() < 32 {
            done.extend(a.wait(usize::MAX, TIMEOUT));
        }
        let mut got = [0u8; 64];
        db.read_region(dst.handle, 0, &mut got).unwrap();
        assert_eq!(got, [32u8; 64]);
    });
}

#[test]
fn immediates_arrive_in_order_with_lengths() {
    bounded(|| {
        let (_fabric, _da, _db, a, b, src, dst) = pair(16, 1024, 1024);
        let n = 3000u32;
        let expected: Vec<(u32, usize)> = (0..n)
            .map(|i| (i.wrapping_mul(2_654_435_761), (i as usize * 37) % 1025))
            .collect();
        let sent = expected.clone();
        let sender = thread::spawn(move || {
            for (i, &(imm, len)) in sent.iter().enumerate() {
                while a.outstanding() == 16 {
                    for c in a.wait(usize::MAX, TIMEOUT) {
                        assert!(c.status.is_ok(), "{c:?}");
                    }
                }
                a.post_write(&write(i as u64, &src, 0, len, at(&dst, 0), Some(imm)))
                    .unwrap();
            }
            while a.outstanding() > 0 {
                a.wait(usize::MAX, TIMEOUT);
            }
            a
        });
        let mut got = Vec::new();
        while got.len() < n as usize {
            for c in b.wait(64, TIMEOUT) {
                assert!(c.status.is_ok(), "{c:?}");
                match c.kind {
                    CompletionKind::RecvWithImm { imm, len } => got.push((imm, len)),
                    other => panic!("unexpected {other:?} at the receiver"),
                }
            }
        }
        let a = sender.join().unwrap();
        assert_eq!(got, expected);
        assert_eq!(a.state(), QpState::Ready);
        assert_eq!(b.state(), QpState::Ready);
    });
}

/// Posts a bad write then a good one: the bad one fails with a remote
/// access error, the queue pair goes to error, the good one is flushed and
/// so is anything posted later.
fn assert_refused(
    bad_rkey: u32,
    bad_off: usize,
    bad_len: usize,
    setup: impl FnOnce(&ferroccl_ib::EmuDevice, &MemoryRegion),
) {
    let (_fabric, _da, db, a, b, src, dst) = pair(8, 256, 128);
    setup(&db, &dst);
    let rkey = if bad_rkey == 0 { dst.rkey } else { bad_rkey };
    let remote = RemoteSlice {
        rkey,
        addr: dst.addr.wrapping_add(bad_off as u64),
    };
    a.post_write(&write(1, &src, 0, bad_len, remote, Some(7)))
        .unwrap();
    a.post_write(&write(2, &src, 0, 8, at(&dst, 0), Some(8)))
        .unwrap();
    let first = one(&a);
    assert_eq!(first.wr_id, 1);
    assert!(
        matches!(first.status, Err(WcError::RemoteAccess(_))),
        "{first:?}"
    );
    assert_eq!(a.state(), QpState::Error);
    let second = one(&a);
    assert_eq!((second.wr_id, second.status), (2, Err(WcError::Flushed)));
    a.post_write(&write(3, &src, 0, 8, at(&dst, 0), None))
        .unwrap();
    let third = one(&a);
    assert_eq!((third.wr_id, third.status), (3, Err(WcError::Flushed)));
    // Nothing reached the receiver.
    assert!(b.poll(8).is_empty());
    assert_eq!(a.outstanding(), 0);
}

#[test]
fn wrong_rkey_is_remote_access_error() {
    bounded(|| assert_refused(0xdead_beef, 0, 8, |_, _| ()));
}

#[test]
fn other_devices_rkey_is_refused() {
    bounded(|| {
        let (_fabric, da, db, a, _b, src, dst) = pair(8, 64, 64);
        da.write_region(src.handle, 0, &[0xab; 8]).unwrap();
        // The sender's own rkey names nothing at the receiver.
        a.post_write(&write(1, &src, 0, 8, at(&src, 0), None))
            .unwrap();
        let c = one(&a);
        assert!(matches!(c.status, Err(WcError::RemoteAccess(_))), "{c:?}");
        assert_eq!(a.state(), QpState::Error);
        let mut got = [0xffu8; 64];
        db.read_region(dst.handle, 0, &mut got).unwrap();
        assert_eq!(got, [0u8; 64], "a refused write must not land");
    });
}

#[test]
fn deregistered_rkey_is_refused() {
    bounded(|| assert_refused(0, 0, 8, |db, dst| db.deregister(dst.handle).unwrap()));
}

#[test]
fn out_of_bounds_is_refused() {
    bounded(|| assert_refused(0, 124, 8, |_, _| ()));
    bounded(|| assert_refused(0, usize::MAX - 2, 8, |_, _| ()));
}

#[test]
fn bad_local_slice_is_local_protection_error() {
    bounded(|| {
        let (_fabric, _da, _db, a, _b, src, dst) = pair(8, 64, 64);
        a.post_write(&write(1, &src, 60, 8, at(&dst, 0), None))
            .unwrap();
        let c = one(&a);
        assert!(
            matches!(c.status, Err(WcError::LocalProtection(_))),
            "{c:?}"
        );
        assert_eq!(a.state(), QpState::Error);
    });
}

#[test]
fn pending_work_is_flushed_when_peer_dropped() {
    bounded(|| {
        let (_fabric, _da, _db, a, b, src, dst) = pair(8, 64, 64);
        for id in 0..4 {
            a.post_write(&write(id, &src, 0, 8, at(&dst, 0), Some(id as u32)))
                .unwrap();
        }
        drop(b);
        assert_eq!(a.state(), QpState::Error);
        let mut done = Vec::new();
        while done.len() < 4 {
            done.extend(a.wait(usize::MAX, TIMEOUT));
        }
        let got: Vec<_> = done.into_iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            got,
            (0..4)
                .map(|id| (id, Err(WcError::Flushed)))
                .collect::<Vec<_>>()
        );
        a.post_write(&write(9, &src, 0, 8, at(&dst, 0), None))
            .unwrap();
        assert_eq!(one(&a).status, Err(WcError::Flushed));
    });
}

#[test]
fn peer_dropped_mid_stream_no_hang() {
    bounded(|| {
        let (_fabric, _da, _db, a, b, src, dst) = pair(4, 64, 64);
        let receiver = thread::spawn(move || {
            let mut seen = 0;
            while seen < 100 {
                seen += b.wait(usize::MAX, TIMEOUT).len();
            }
            drop(b); // the peer dies mid-stream
            seen
        });
        // The sender streams until its work fails; it must not hang.
        let mut ok = 0u64;
        let mut first_error = None;
        let mut id = 0u64;
        while first_error.is_none() {
            match a.post_write(&write(id, &src, 0, 8, at(&dst, 0), Some(id as u32))) {
                Ok(()) => id += 1,
                Err(VerbsError::SendQueueFull { .. }) => {}
                Err(e) => panic!("{e}"),
            }
            for c in a.wait(usize::MAX, Duration::from_millis(10)) {
                match c.status {
                    Ok(()) => ok += 1,
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        assert!(receiver.join().unwrap() >= 100);
        assert!(ok >= 100, "only {ok} writes completed before the peer died");
        assert!(
            matches!(
                first_error,
                Some(WcError::Flushed | WcError::RetryExceeded(_))
            ),
            "{first_error:?}"
        );
        assert_eq!(a.state(), QpState::Error);
        // Whatever is still outstanding drains with errors, then new work too.
        while a.outstanding() > 0 {
            for c in a.wait(usize::MAX, TIMEOUT) {
                assert!(c.status.is_err());
            }
        }
        a.post_write(&write(id, &src, 0, 8, at(&dst, 0), None))
            .unwrap();
        assert_eq!(one(&a).status, Err(WcError::Flushed));
    });
}

#[test]
fn send_queue_depth_is_enforced() {
    bounded(|| {
        let fabric = EmuFabric::new();
        let dev = fabric.device();
        let (a, _b) = fabric.connect(&dev, &dev, 4); // loopback
        let src = dev.register(64).unwrap();
        let dst = dev.register(64).unwrap();
        for id in 0..4 {
            a.post_write(&write(id, &src, 0, 8, at(&dst, 0), None))
                .unwrap();
        }
        assert_eq!(a.outstanding(), 4);
        let refused = a.post_write(&write(4, &src, 0, 8, at(&dst, 0), None));
        assert_eq!(refused, Err(VerbsError::SendQueueFull { depth: 4 }));
        // Polling one send completion frees one slot, not more.
        assert_eq!(a.poll(1).len(), 1);
        a.post_write(&write(4, &src, 0, 8, at(&dst, 0), None))
            .unwrap();
        assert_eq!(
            a.post_write(&write(5, &src, 0, 8, at(&dst, 0), None)),
            Err(VerbsError::SendQueueFull { depth: 4 })
        );
        let rest: Vec<u64> = a.poll(usize::MAX).iter().map(|c| c.wr_id).collect();
        assert_eq!(rest, vec![1, 2, 3, 4]);
        assert_eq!(a.outstanding(), 0);
    });
}

#[test]
fn wait_times_out_when_idle() {
    bounded(|| {
        let fabric = EmuFabric::new();
        let (da, db) = (fabric.device(), fabric.device());
        let (a, _b) = fabric.connect(&da, &db, 4);
        let start = Instant::now();
        assert!(a.wait(8, Duration::from_millis(50)).is_empty());
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert!(a.poll(8).is_empty());
    });
}
