//! Registration of caller memory and zero-copy sends, on emulated verbs:
//! the registration cache against a plain LRU model (with the device's own
//! list of registrations as the witness), frames sent from a leased buffer
//! delivered exactly across the zero-copy threshold on 1 to 4 queue pairs,
//! memory freed and declared again, stale keys, and what the CPU copies
//! per frame, staged and zero copy, against the protocol's arithmetic.

mod common;

use common::{bounded, connect, header, soon};
use ferroccl_ib::conn::{self, Geometry, CTS_ENTRY_BYTES};
use ferroccl_ib::{
    CacheLimits, CompletionKind, Device, EmuDevice, EmuFabric, EmuQp, IbReceiver, IbSender,
    LocalSlice, MemoryLease, QpState, QueuePair, RegCache, RemoteSlice, UserBuffer, UserMemory,
    VerbsError, WcError, WriteRequest, ZeroCopyConfig,
};
use ferroccl_transport::{AbortHandle, SlotReceiver, SlotSender, TransportError, HEADER_BYTES};
use std::time::{Duration, Instant};

fn pattern(seed: usize, k: usize) -> u8 {
    (seed.wrapping_mul(131) ^ k.wrapping_mul(7) ^ (k >> 9)) as u8
}

/// A tiny deterministic generator (no dependency): xorshift64*.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n.max(1)
    }
}

// ---------------------------------------------------------------------
// The cache against a model.

/// The reference: registrations as a plain list, least recently used out,
/// leases named by a number that changes whenever one is declared again.
#[derive(Default)]
struct Model {
    /// (start, len, lease number, last use)
    entries: Vec<(usize, usize, u64, u64)>,
    tick: u64,
}

#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Hit: the registration's start.
    Hit(usize),
    /// Registered: its start and length.
    Miss(usize, usize),
    /// Not registered (no lease, or too large).
    Staged,
}

impl Model {
    /// `leases`: (start, len, number) of every live lease.
    fn acquire(
        &mut self,
        leases: &[(usize, usize, u64)],
        limits: CacheLimits,
        addr: usize,
        len: usize,
    ) -> Outcome {
        self.entries
            .retain(|e| leases.iter().any(|&(_, _, id)| id == e.2));
        self.tick += 1;
        let inside = |s: usize, l: usize| addr >= s && addr + len <= s + l;
        if let Some(e) = self.entries.iter_mut().find(|e| inside(e.0, e.1)) {
            e.3 = self.tick;
            return Outcome::Hit(e.0);
        }
        let Some(&(ls, ll, id)) = leases
            .iter()
            .filter(|l| inside(l.0, l.1))
            .min_by_key(|l| l.1)
        else {
            return Outcome::Staged;
        };
        if len > limits.max_bytes || limits.max_entries == 0 {
            return Outcome::Staged;
        }
        let (s, l) = if ll <= limits.max_bytes {
            (ls, ll)
        } else {
            (addr, len)
        };
        loop {
            let bytes: usize = self.entries.iter().map(|e| e.1).sum();
            if self.entries.is_empty()
                || (self.entries.len() < limits.max_entries && bytes + l <= limits.max_bytes)
            {
                break;
            }
            let lru = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].3)
                .unwrap();
            self.entries.remove(lru);
        }
        self.entries.push((s, l, id, self.tick));
        Outcome::Miss(s, l)
    }

    fn invalidate(&mut self, addr: usize, len: usize) {
        self.entries
            .retain(|e| !(e.0 < addr + len && addr < e.0 + e.1));
    }

    fn ranges(&self) -> Vec<(usize, usize)> {
        let mut r: Vec<_> = self.entries.iter().map(|e| (e.0, e.1)).collect();
        r.sort_unstable();
        r
    }
}

/// Random lookups of sub-ranges of eight buffers (one larger than the
/// byte bound), leases dropped and declared again (memory freed and used
/// again), and invalidations, against [`Model`]: each lookup's outcome
/// and offset, and after every step the registrations the emulated device
/// holds, must be the model's.
#[test]
fn the_cache_agrees_with_an_lru_model() {
    let sizes = [4096usize, 8192, 4096, 12288, 2048, 4096, 24576, 1000];
    let limits_tried = [
        CacheLimits {
            max_entries: 3,
            max_bytes: 16384,
        },
        CacheLimits {
            max_entries: 1,
            max_bytes: 1 << 20,
        },
        CacheLimits {
            max_entries: 16,
            max_bytes: 9000,
        },
        CacheLimits {
            max_entries: 0,
            max_bytes: 1 << 20,
        },
    ];
    for (round, &limits) in limits_tried.iter().enumerate() {
        let arena = vec![0u8; sizes.iter().sum()];
        let mut bufs = Vec::new();
        let mut at = 0;
        for &n in &sizes {
            bufs.push((at, n));
            at += n;
        }
        let base = arena.as_ptr() as usize;
        let dev = EmuFabric::eager().device();
        let mut cache = RegCache::new(limits);
        let mut model = Model::default();
        let mut leases: Vec<Option<(MemoryLease, u64)>> = bufs
            .iter()
            .enumerate()
            .map(|(i, &(o, n))| Some((MemoryLease::declare(&arena[o..o + n]), i as u64)))
            .collect();
        let mut next_id = leases.len() as u64;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ round as u64);
        let (mut hits, mut misses) = (0u64, 0u64);
        for step in 0..3000 {
            let b = rng.below(bufs.len());
            let (o, n) = bufs[b];
            match rng.below(20) {
                0 => {
                    // Freed (lease dropped) or allocated again (declared).
                    leases[b] = match leases[b].take() {
                        Some(_) => None,
                        None => {
                            next_id += 1;
                            Some((MemoryLease::declare(&arena[o..o + n]), next_id))
                        }
                    };
                }
                1 => {
                    let from = o + rng.below(n);
                    let len = 1 + rng.below(n);
                    let gone = cache.invalidate(&dev, base + from, len);
                    let before = model.entries.len();
                    model.invalidate(base + from, len);
                    assert_eq!(gone, before - model.entries.len(), "step {step}");
                }
                _ => {
                    let from = rng.below(n);
                    let len = 1 + rng.below(n - from);
                    let live: Vec<_> = leases
                        .iter()
                        .enumerate()
                        .filter_map(|(i, l)| {
                            l.as_ref().map(|(_, id)| (base + bufs[i].0, bufs[i].1, *id))
                        })
                        .collect();
                    let addr = base + o + from;
                    let want = model.acquire(&live, limits, addr, len);
                    let got = cache.acquire(&dev, addr, len);
                    match (&want, got) {
                        (Outcome::Staged, None) => {}
                        (Outcome::Hit(s), Some((mr, off))) => {
                            hits += 1;
                            assert_eq!((mr.addr as usize, off), (*s, addr - s), "step {step}");
                        }
                        (Outcome::Miss(s, l), Some((mr, off))) => {
                            misses += 1;
                            assert_eq!(
                                (mr.addr as usize, mr.len, off),
                                (*s, *l, addr - s),
                                "step {step}"
                            );
                        }
                        (want, got) => panic!("step {step}: model {want:?}, cache {got:?}"),
                    }
                }
            }
            let on_device: Vec<_> = dev
                .user_regions()
                .into_iter()
                .map(|(_, a, l)| (a, l))
                .collect();
            // Dropped leases' registrations go at the cache's next
            // lookup; compare only after one (or an invalidation, which
            // the model mirrors exactly).
            let model_ranges = model.ranges();
            if cache.ranges() == model_ranges {
                assert_eq!(on_device, model_ranges, "step {step}: device");
            } else {
                // The only allowed difference: registrations of leases
                // dropped since the last lookup, still to be reaped.
                let stale = cache.ranges();
                assert!(
                    model_ranges.iter().all(|r| stale.contains(r)),
                    "step {step}: cache {stale:?}, model {model_ranges:?}"
                );
                assert_eq!(on_device, stale, "step {step}: device");
            }
        }
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.misses), (hits, misses), "{limits:?}");
        if limits.max_entries > 0 {
            assert!(hits > 100 && misses > 10, "{limits:?}: {stats:?}");
            assert!(stats.evicted > 0, "{limits:?}: {stats:?}");
        } else {
            assert_eq!(hits + misses, 0);
        }
        cache.clear(&dev);
        assert!(dev.user_regions().is_empty());
        drop(arena);
    }
}

// ---------------------------------------------------------------------
// Zero-copy sends through the data path.

/// What the protocol should cost for one frame of `n` payload bytes, sent
/// and received, once the first frame is past: (CPU bytes copied, CPU
/// copies, fabric writes, fabric bytes). Staged: the sender copies header
/// and payload into `stage`; zero copy: the header only, and the header
/// is one more write. Either way the sender reads one 32-byte
/// clear-to-send entry. The receiver copies header and payload out of its
/// slot and writes one entry, which it posts. (The first frame also reads
/// the entries posted at set-up: [`warm_up`] sends it.)
fn per_frame(n: usize, zero_copy: bool, qps: usize) -> (u64, u64, u64, u64) {
    let (h, c, n64) = (HEADER_BYTES as u64, CTS_ENTRY_BYTES as u64, n as u64);
    let pieces = if HEADER_BYTES + n >= conn::STRIPE_MIN_BYTES {
        qps as u64
    } else {
        1
    };
    let receiver = (h + n64 + c, 3);
    let (send_bytes, send_copies, writes) = if zero_copy {
        (h + c, 2, 1 + pieces)
    } else {
        (h + n64 + c, 3, pieces)
    };
    (
        send_bytes + receiver.0,
        send_copies + receiver.1,
        writes + 1,
        h + n64 + c,
    )
}

/// One staged frame of one byte, sent and received, so that the sender has
/// taken the clear-to-send entries posted at set-up before counting.
fn warm_up(tx: &mut IbSender<EmuDevice, EmuQp>, rx: &mut IbReceiver<EmuDevice, EmuQp>) {
    tx.send_from(header(9999), soon(10_000), &[1]).unwrap();
    rx.recv_with(soon(10_000), &mut |h, b| {
        assert_eq!((h.step, b), (9999, &[1u8][..]));
        Ok(())
    })
    .unwrap();
}

/// Frames of sizes across the zero-copy threshold, each a different
/// slice of one leased buffer, on 1 to 4 queue pairs: every frame arrives
/// equal to the source bytes; those at or above the threshold go from the
/// caller's memory (one registration of the whole buffer, hits after it)
/// and cost exactly [`per_frame`]; those below are staged.
#[test]
fn zero_copy_frames_arrive_exact_across_the_threshold() {
    for qps in 1..=4 {
        bounded(move || {
            let fabric = EmuFabric::eager();
            let abort = AbortHandle::new();
            let chunk = 256 << 10;
            let g = Geometry {
                chunk_bytes: chunk,
                steps: 3,
                qps,
            };
            let min = 64 << 10;
            let z = ZeroCopyConfig {
                min_bytes: min,
                ..ZeroCopyConfig::default()
            };
            let ((mut tx, _r0, _c0), (_s1, mut rx, _c1), devs, _) = connect(&fabric, g, z, &abort);
            let len = 3 * chunk;
            let src = UserBuffer::from_vec((0..len).map(|k| pattern(qps, k)).collect());
            let sizes = [
                1,
                min - HEADER_BYTES - 1,
                min - 1,
                min,
                min + 1,
                100_003,
                chunk - 1,
                chunk,
            ];
            let mut zc_frames = 0u64;
            warm_up(&mut tx, &mut rx);
            for (i, &n) in sizes.iter().chain(sizes.iter().rev()).enumerate() {
                let from = (i * 40_961) % (len - n);
                let before = fabric.stats();
                tx.send_from(header(i), soon(10_000), &src[from..from + n])
                    .unwrap();
                let mut got = Vec::new();
                rx.recv_with(soon(10_000), &mut |h, b| {
                    assert_eq!(h.step, i as u32);
                    got.extend_from_slice(b);
                    Ok(())
                })
                .unwrap();
                let want: Vec<u8> = (from..from + n).map(|k| pattern(qps, k)).collect();
                assert!(got == want, "qps {qps}, frame {i} of {n} bytes differs");
                let zc = n >= min;
                zc_frames += u64::from(zc);
                let after = fabric.stats();
                let (cpu_bytes, cpu_copies, writes, bytes) = per_frame(n, zc, qps);
                assert_eq!(
                    (
                        after.cpu_bytes - before.cpu_bytes,
                        after.cpu_copies - before.cpu_copies,
                        after.writes - before.writes,
                        after.bytes - before.bytes,
                    ),
                    (cpu_bytes, cpu_copies, writes, bytes),
                    "qps {qps}, frame {i} of {n} bytes (zero copy: {zc})"
                );
                // The payload, and only it, left from the caller's memory.
                assert_eq!(
                    after.user_bytes - before.user_bytes,
                    if zc { n as u64 } else { 0 },
                    "qps {qps}, frame {i} of {n} bytes"
                );
            }
            let stats = tx.cache_stats();
            assert_eq!(stats.misses, 1, "{stats:?}");
            assert_eq!(stats.hits, zc_frames - 1, "{stats:?}");
            let whole = (src.as_ptr() as usize, len);
            assert_eq!(tx.cached_ranges(), vec![whole]);
            assert_eq!(
                devs[0]
                    .user_regions()
                    .into_iter()
                    .map(|(_, a, l)| (a, l))
                    .collect::<Vec<_>>(),
                vec![whole]
            );
            // The sending half deregisters what it kept when it goes.
            drop(tx);
            assert!(devs[0].user_regions().is_empty());
        });
    }
}

/// Memory declared, sent from, given back (lease dropped), then declared
/// again at the same address with other bytes: the old registration is
/// never used again (a miss, not a hit; the device holds one registration,
/// the new one) and the peer gets the new bytes. Without a lease the frame
/// is staged, and still exact.
#[test]
fn memory_given_back_and_declared_again_is_registered_again() {
    bounded(|| {
        let fabric = EmuFabric::eager();
        let abort = AbortHandle::new();
        let g = Geometry {
            chunk_bytes: 64 << 10,
            steps: 2,
            qps: 2,
        };
        let z = ZeroCopyConfig {
            min_bytes: 4096,
            ..ZeroCopyConfig::default()
        };
        let ((mut tx, _r0, _c0), (_s1, mut rx, _c1), devs, _) = connect(&fabric, g, z, &abort);
        let n = 50_000;
        let mut memory = vec![0u8; n];
        let check = |i: usize, seed: usize, rx: &mut IbReceiver<EmuDevice, EmuQp>| {
            rx.recv_with(soon(10_000), &mut |_, b| {
                assert!(
                    b.iter().enumerate().all(|(k, &v)| v == pattern(seed, k)),
                    "frame {i}"
                );
                Ok(())
            })
            .unwrap();
        };
        for (k, v) in memory.iter_mut().enumerate() {
            *v = pattern(1, k);
        }
        let first = MemoryLease::declare(&memory);
        tx.send_from(header(0), soon(10_000), &memory).unwrap();
        check(0, 1, &mut rx);
        let old = devs[0].user_regions();
        assert_eq!(old.len(), 1);
        drop(first);
        for (k, v) in memory.iter_mut().enumerate() {
            *v = pattern(2, k);
        }
        let second = MemoryLease::declare(&memory);
        tx.send_from(header(1), soon(10_000), &memory).unwrap();
        check(1, 2, &mut rx);
        let stats = tx.cache_stats();
        assert_eq!((stats.hits, stats.misses, stats.invalidated), (0, 2, 1));
        let now = devs[0].user_regions();
        assert_eq!(now.len(), 1);
        assert_ne!(now[0].0, old[0].0, "the old registration was kept");
        drop(second);
        for (k, v) in memory.iter_mut().enumerate() {
            *v = pattern(3, k);
        }
        warm_up(&mut tx, &mut rx);
        let before = fabric.stats();
        tx.send_from(header(2), soon(10_000), &memory).unwrap();
        check(2, 3, &mut rx);
        let after = fabric.stats();
        assert_eq!(
            after.cpu_bytes - before.cpu_bytes,
            per_frame(n, false, 2).0,
            "staged"
        );
        assert_eq!(tx.cache_stats().uncovered, 1);
        assert!(devs[0].user_regions().is_empty());
    });
}

/// A registration deregistered behind the cache's back: the send is
/// refused with an error naming the peer (no hang, nothing posted), the
/// cache forgets it, and the next frame registers afresh and arrives.
#[test]
fn a_registration_gone_under_the_cache_is_refused_then_replaced() {
    bounded(|| {
        let fabric = EmuFabric::eager();
        let abort = AbortHandle::new();
        let g = Geometry {
            chunk_bytes: 8192,
            steps: 2,
            qps: 1,
        };
        let z = ZeroCopyConfig {
            min_bytes: 1024,
            ..ZeroCopyConfig::default()
        };
        let ((mut tx, _r0, _c0), (_s1, mut rx, _c1), devs, _) = connect(&fabric, g, z, &abort);
        let src = UserBuffer::from_vec((0..8192).map(|k| pattern(5, k)).collect());
        tx.send_from(header(0), soon(5_000), &src).unwrap();
        rx.recv_with(soon(5_000), &mut |_, b| {
            assert!(b == &src[..]);
            Ok(())
        })
        .unwrap();
        let [(handle, _, _)] = devs[0].user_regions()[..] else {
            panic!("one registration expected");
        };
        devs[0].deregister(handle).unwrap();
        match tx.send_from(header(1), soon(5_000), &src[..4096]) {
            Err(TransportError::Io(m)) => assert!(m.contains("rank 1"), "{m}"),
            other => panic!("{other:?}"),
        }
        tx.send_from(header(1), soon(5_000), &src[100..5000])
            .unwrap();
        rx.recv_with(soon(5_000), &mut |h, b| {
            assert_eq!(h.step, 1);
            assert!(b == &src[100..5000]);
            Ok(())
        })
        .unwrap();
        assert_eq!(tx.cache_stats().misses, 2);
    });
}

/// The receiver's slots deregistered under a zero-copy sender (a stale
/// remote key): the write is refused as on hardware, and each end's next
/// call names the other rank, well before its deadline.
#[test]
fn a_stale_remote_key_under_zero_copy_fails_both_ends_naming_the_peer() {
    bounded(|| {
        let fabric = EmuFabric::eager();
        let abort = AbortHandle::new();
        let g = Geometry {
            chunk_bytes: 128 << 10,
            steps: 2,
            qps: 2,
        };
        let z = ZeroCopyConfig {
            min_bytes: 1024,
            ..ZeroCopyConfig::default()
        };
        let ((mut tx, _r0, _c0), (_s1, mut rx, _c1), devs, slots1) = connect(&fabric, g, z, &abort);
        let src = UserBuffer::from_vec((0..(128 << 10)).map(|k| pattern(7, k)).collect());
        devs[1].deregister(slots1.slots.handle).unwrap();
        let start = Instant::now();
        let sent = tx
            .send_from(header(0), soon(20_000), &src)
            .and_then(|()| tx.send_from(header(1), soon(20_000), &src));
        match sent {
            Err(TransportError::PeerFailed { rank: 1, reason }) => {
                assert!(reason.contains("remote access"), "{reason}")
            }
            other => panic!("sender: {other:?}"),
        }
        let got = rx.recv_with(soon(20_000), &mut |_, _| Ok(()));
        assert!(
            matches!(got, Err(TransportError::PeerFailed { rank: 0, .. })),
            "receiver: {got:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(10));
    });
}

/// The receiver's host dies before a zero-copy frame: the send, which
/// waits for its writes' completions, ends with the peer named, long
/// before its deadline, instead of waiting for a completion that will not
/// come.
#[test]
fn a_peer_dying_under_a_zero_copy_send_is_named() {
    bounded(|| {
        let fabric = EmuFabric::eager();
        let abort = AbortHandle::new();
        let g = Geometry {
            chunk_bytes: 256 << 10,
            steps: 2,
            qps: 3,
        };
        let z = ZeroCopyConfig {
            min_bytes: 1024,
            ..ZeroCopyConfig::default()
        };
        let ((mut tx, _r0, _c0), (_s1, _rx, _c1), devs, _) = connect(&fabric, g, z, &abort);
        let src = UserBuffer::from_vec((0..(256 << 10)).map(|k| pattern(11, k)).collect());
        tx.send_from(header(0), soon(20_000), &src).unwrap();
        devs[1].kill();
        let start = Instant::now();
        let sent = tx.send_from(header(1), soon(20_000), &src);
        assert!(
            matches!(sent, Err(TransportError::PeerFailed { rank: 1, .. })),
            "{sent:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(10));
    });
}

// ---------------------------------------------------------------------
// The emulated verbs of caller memory.

/// Caller memory registered on the emulated device: a write from it lands
/// exactly (only what was presented, and only from where it is); its
/// rkey grants no remote write; once deregistered its lkey is refused
/// with a local protection error and the queue pair goes to error;
/// dma-buf memory is not supported (the caller stages instead); the
/// CPU-side calls refuse it.
#[test]
fn caller_memory_on_the_emulated_device() {
    let fabric = EmuFabric::new();
    let (a, b) = (fabric.device(), fabric.device());
    let target = b.register(4096).unwrap();
    let src: Vec<u8> = (0..4096).map(|k| pattern(9, k)).collect();
    let mr = a.register_user(UserMemory::host(&src)).unwrap();
    assert_eq!((mr.addr, mr.len), (src.as_ptr() as u64, 4096));
    assert!(matches!(
        a.present(mr.handle, 10, &src[11..20]),
        Err(VerbsError::OutOfBounds { .. })
    ));
    a.present(mr.handle, 100, &src[100..1100]).unwrap();
    let (qa, qb) = fabric.connect(&a, &b, 8);
    let write = |wr_id, offset, len, rkey, addr| WriteRequest {
        wr_id,
        local: LocalSlice {
            mr: mr.handle,
            offset,
            len,
        },
        remote: RemoteSlice { rkey, addr },
        imm: Some(7),
    };
    qa.post_write(&write(1, 100, 1000, target.rkey, target.addr + 5))
        .unwrap();
    let done = qa.wait(8, Duration::from_secs(5));
    assert_eq!(done[0].status, Ok(()));
    let mut out = vec![0u8; 1000];
    b.read_region(target.handle, 5, &mut out).unwrap();
    assert!(out == src[100..1100]);
    let imm = qb.wait(8, Duration::from_secs(5));
    assert_eq!(
        imm[0].kind,
        CompletionKind::RecvWithImm { imm: 7, len: 1000 }
    );
    assert!(matches!(
        a.write_region(mr.handle, 0, b"x"),
        Err(VerbsError::UnknownRegion(_))
    ));
    assert!(matches!(
        a.register_user(UserMemory::DmaBuf {
            fd: 3,
            offset: 0,
            len: 4096,
            iova: 0
        }),
        Err(VerbsError::Unsupported(_))
    ));

    // A peer naming the caller memory's rkey: no remote write granted.
    let theirs = b.register(64).unwrap();
    let (qb2, qa2) = fabric.connect(&b, &a, 8);
    qb2.post_write(&WriteRequest {
        wr_id: 2,
        local: LocalSlice {
            mr: theirs.handle,
            offset: 0,
            len: 64,
        },
        remote: RemoteSlice {
            rkey: mr.rkey,
            addr: mr.addr,
        },
        imm: None,
    })
    .unwrap();
    let refused = qb2.wait(8, Duration::from_secs(5));
    assert!(
        matches!(&refused[0].status, Err(WcError::RemoteAccess(_))),
        "{refused:?}"
    );
    assert_eq!(qa2.state(), QpState::Error);
    assert_eq!(
        src[..64],
        (0..64).map(|k| pattern(9, k)).collect::<Vec<_>>()
    );

    // Deregistered: its lkey is stale.
    a.deregister(mr.handle).unwrap();
    qa.post_write(&write(3, 100, 10, target.rkey, target.addr))
        .unwrap();
    let stale = qa.wait(8, Duration::from_secs(5));
    assert!(
        matches!(&stale[0].status, Err(WcError::LocalProtection(_))),
        "{stale:?}"
    );
    assert_eq!(qa.state(), QpState::Error);
}

// ---------------------------------------------------------------------
// The counts of docs/performance-log.md.

/// Per frame, staged against zero copy, for a few sizes on 1 and 2 queue
/// pairs: what the CPU copied and what crossed the fabric, counted by the
/// emulation over 20 frames each and checked against [`per_frame`];
/// printed as the table of docs/performance-log.md (`--nocapture`).
#[test]
fn counts_per_frame_staged_and_zero_copy() {
    println!("| qps | payload | path | CPU bytes/frame | CPU copies/frame | messages/frame | wire bytes/frame |");
    println!("|---:|---:|---|---:|---:|---:|---:|");
    for qps in [1, 2] {
        for n in [64 << 10, 256 << 10, 512 << 10] {
            for zc in [false, true] {
                let (row, want) = bounded(move || {
                    let fabric = EmuFabric::eager();
                    let abort = AbortHandle::new();
                    let g = Geometry {
                        chunk_bytes: 512 << 10,
                        steps: 4,
                        qps,
                    };
                    let z = ZeroCopyConfig {
                        min_bytes: if zc { 1 } else { usize::MAX },
                        ..ZeroCopyConfig::default()
                    };
                    let ((mut tx, _r0, _c0), (_s1, mut rx, _c1), _, _) =
                        connect(&fabric, g, z, &abort);
                    let src = UserBuffer::from_vec((0..n).map(|k| pattern(n, k)).collect());
                    let frames = 20u64;
                    warm_up(&mut tx, &mut rx);
                    let before = fabric.stats();
                    for i in 0..frames as usize {
                        tx.send_from(header(i), soon(10_000), &src).unwrap();
                        rx.recv_with(soon(10_000), &mut |_, b| {
                            assert!(b == &src[..]);
                            Ok(())
                        })
                        .unwrap();
                    }
                    let after = fabric.stats();
                    let per = |a: u64, b: u64| (a - b) / frames;
                    (
                        (
                            per(after.cpu_bytes, before.cpu_bytes),
                            per(after.cpu_copies, before.cpu_copies),
                            per(after.writes, before.writes),
                            per(after.bytes, before.bytes),
                        ),
                        per_frame(n, zc, qps),
                    )
                });
                assert_eq!(row, want, "qps {qps}, {n} bytes, zero copy {zc}");
                println!(
                    "| {qps} | {} KiB | {} | {} | {} | {} | {} |",
                    n >> 10,
                    if zc { "zero copy" } else { "staged" },
                    row.0,
                    row.1,
                    row.2,
                    row.3
                );
            }
        }
    }
}
