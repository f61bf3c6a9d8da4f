//! Many frames of random sizes between three ranks (threads), every
//! connection used in both directions at once by separate sender and
//! receiver threads; each frame carries its own checksum, and each
//! direction's running checksum is compared with the sender's.

mod common;

use common::*;
use ferroccl_transport::{AbortHandle, Connection, Fingerprint, FrameHeader, Listener, SlotSender};

const RANKS: usize = 3;
const FRAMES: usize = 10_000;
const CHUNK: usize = 4096;
const STEPS: usize = 4;

/// xorshift64*: deterministic per (from, to) so both ends agree on sizes.
struct Rng(u64);

impl Rng {
    fn new(from: usize, to: usize) -> Self {
        Rng(0x2545_f491_4f6c_dd1d ^ (((from as u64) << 32) | (to as u64 + 1)))
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// FNV-1a, independent of the transport.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn three_ranks_all_to_all_random_sizes() {
    let abort = AbortHandle::new();
    let listeners: Vec<_> = (0..RANKS)
        .map(|r| listen(&config(r, CHUNK, STEPS), &abort.signal()))
        .collect();
    let prefixes: Vec<String> = listeners.iter().map(|l| l.segment_prefix()).collect();
    let addrs: Vec<Vec<u8>> = listeners.iter().map(|l| l.address()).collect();
    // conns[a][b]: rank a's end of the connection to rank b.
    let mut conns: Vec<Vec<Option<Connection>>> = (0..RANKS)
        .map(|_| (0..RANKS).map(|_| None).collect())
        .collect();
    for a in 0..RANKS {
        for b in a + 1..RANKS {
            conns[a][b] = Some(listeners[a].connect(b, &addrs[b], soon(10_000)).unwrap());
            conns[b][a] = Some(listeners[b].accept(a, soon(10_000)).unwrap());
        }
    }
    let mut threads = Vec::new();
    for (me, row) in conns.into_iter().enumerate() {
        for (peer, conn) in row.into_iter().enumerate() {
            let Some(conn) = conn else {
                continue;
            };
            let (mut sender, mut receiver, closer) = halves(conn);
            threads.push(std::thread::spawn(move || {
                let mut rng = Rng::new(me, peer);
                let mut running = 0u64;
                let mut payload = vec![0u8; CHUNK];
                for f in 0..FRAMES {
                    let len = (rng.next() % (CHUNK as u64 + 1)) as usize;
                    for b in payload[..len].iter_mut() {
                        *b = rng.next() as u8;
                    }
                    let sum = fnv(&payload[..len]);
                    running = running.wrapping_mul(31).wrapping_add(sum);
                    let header = FrameHeader::data(
                        Fingerprint {
                            seq: f as u64,
                            count: sum,
                            ..Default::default()
                        },
                        f as u32,
                    );
                    sender
                        .send_from(header, soon(60_000), &payload[..len])
                        .unwrap_or_else(|e| panic!("{me}->{peer} frame {f}: {e}"));
                }
                (me, peer, running, Some(sender))
            }));
            threads.push(std::thread::spawn(move || {
                let _keep = closer;
                let mut rng = Rng::new(peer, me);
                let mut running = 0u64;
                for f in 0..FRAMES {
                    let len = (rng.next() % (CHUNK as u64 + 1)) as usize;
                    for _ in 0..len {
                        rng.next();
                    }
                    receiver
                        .recv_with(soon(60_000), &mut |h, bytes| {
                            assert_eq!(h.fingerprint.seq, f as u64, "{peer}->{me}");
                            assert_eq!(bytes.len(), len, "{peer}->{me} frame {f}");
                            let sum = fnv(bytes);
                            assert_eq!(sum, h.fingerprint.count, "{peer}->{me} frame {f}");
                            running = running.wrapping_mul(31).wrapping_add(sum);
                            Ok(())
                        })
                        .unwrap_or_else(|e| panic!("{peer}->{me} frame {f}: {e}"));
                }
                // Reported as the sender's direction, to pair them up.
                (peer, me, running, None)
            }));
        }
    }
    let mut sent = std::collections::HashMap::new();
    let mut received = std::collections::HashMap::new();
    let mut keep = Vec::new();
    for (i, t) in threads.into_iter().enumerate() {
        let (from, to, running, half): (usize, usize, u64, Option<Box<dyn SlotSender>>) =
            match t.join() {
                Ok(v) => v,
                Err(_) => panic!("thread {i} panicked"),
            };
        if i % 2 == 0 {
            sent.insert((from, to), running);
        } else {
            received.insert((from, to), running);
        }
        keep.push(half);
    }
    assert_eq!(sent.len(), RANKS * (RANKS - 1));
    assert_eq!(sent, received);
    drop(keep);
    for p in &prefixes {
        assert_eq!(segments(p), Vec::<String>::new());
    }
}
