//! The wire forms of the device executor's set-up rounds (every rank's
//! offer, its peer-access row, its FIFO entry), where each part of a
//! FIFO lies in a region, and the connection table every rank's kernel
//! reads.

use super::{ROUND_VERSION, WORD_GAP};
use crate::error::{Error, Result};
use crate::plan::device::{self as device_plan, Allowed, FifoGeometry, Offer};
use crate::plan::gpu_path::GpuIdentity;
use ferroccl_cuda::executor::Conn;
use ferroccl_transport::{Counter, FifoDescriptor, Mapping, MemoryKind, SlotLayout};

/// Where each part of a (sender, receiver, channel)'s FIFOs lies in a
/// region, in bytes from its start (the sizes: `plan::device`).
impl FifoGeometry {
    fn meta(&self) -> u64 {
        self.slots as u64 * self.slot_bytes as u64
    }
    fn ll(&self) -> u64 {
        (self.meta() + 8 * self.slots as u64).next_multiple_of(WORD_GAP)
    }
    fn tail(&self) -> u64 {
        (self.ll() + self.ll_slots as u64 * self.ll_lines as u64 * 16).next_multiple_of(WORD_GAP)
    }
    fn head(&self) -> u64 {
        self.tail() + WORD_GAP
    }
    fn ll_head(&self) -> u64 {
        self.head() + WORD_GAP
    }
    /// Bytes of one region.
    pub(crate) fn region(&self) -> u64 {
        self.ll_head() + WORD_GAP
    }
}

/// One direction (sender to receiver) of one channel of the device
/// executor, as the transport core describes FIFOs: a bulk FIFO whose
/// frame headers (a word per slot, `len | tag << 32`) are kept beside its
/// slots, and an LL FIFO whose lines carry their frames' flags. Slots,
/// header words, LL lines and the bulk tail are in the receiver's memory
/// (it polls them); the heads are in the sender's (it polls them), so the
/// descriptors' `mapping` is the receiver's region and the head counters
/// lie outside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceFifo {
    /// Bulk frames: `slots` of `slot_bytes`, tail and head words.
    pub(crate) bulk: FifoDescriptor,
    /// The bulk frames' header words, one per slot, after the slots.
    pub(crate) headers: usize,
    /// LL frames: `ll_slots` of `ll_lines` 16-byte lines (a header line,
    /// then 8 bytes of payload a line, each line with its flag).
    pub(crate) ll: FifoDescriptor,
}

/// The FIFOs from `sender` to `receiver` on channel `c` of `n` ranks when
/// rank `r`'s FIFO memory starts at `bases[r]` on the device it numbers
/// `ordinals[r]`: region `(c * n + sender)` of the receiver holds the
/// frames, region `(c * n + receiver)` of the sender the words the
/// receiver raises for them (each word in the memory of the side that
/// polls it).
pub(crate) fn device_fifo(
    bases: &[u64],
    ordinals: &[u32],
    n: usize,
    g: &FifoGeometry,
    c: usize,
    sender: usize,
    receiver: usize,
) -> DeviceFifo {
    let region =
        |owner: usize, p: usize| (bases[owner] + ((c * n + p) as u64) * g.region()) as usize;
    let (to, back) = (region(receiver, sender), region(sender, receiver));
    let memory = MemoryKind::Device {
        ordinal: ordinals[receiver],
    };
    let mapping = Some(Mapping {
        addr: to,
        len: g.region() as usize,
    });
    let word = |at: u64| Counter::Mapped { addr: at as usize };
    let bulk = FifoDescriptor {
        memory,
        mapping,
        slots: Some(to),
        slot_count: g.slots as usize,
        slot_bytes: g.slot_bytes as usize,
        slot_stride: g.slot_bytes as usize,
        layout: SlotLayout::PAYLOAD_ONLY,
        head: word(back as u64 + g.head()),
        tail: word(to as u64 + g.tail()),
    };
    let ll = FifoDescriptor {
        memory,
        mapping,
        slots: Some(to + g.ll() as usize),
        slot_count: g.ll_slots as usize,
        slot_bytes: g.room(ferroccl_cuda::executor::Protocol::LowLatency),
        slot_stride: g.ll_lines as usize * 16,
        layout: SlotLayout {
            published: None,
            header: None,
            payload: 16,
            inline: None,
            placement: None,
        },
        head: word(back as u64 + g.ll_head()),
        tail: Counter::Flagged,
    };
    DeviceFifo {
        bulk,
        headers: to + g.meta() as usize,
        ll,
    }
}

/// A counter's word as the kernel takes it.
fn counter_word(c: Counter) -> u64 {
    match c {
        Counter::Mapped { addr } => addr as u64,
        _ => unreachable!("the device FIFOs' counters are words"),
    }
}

/// The kernel's view of one peer on one channel: the FIFOs toward it and
/// from it.
fn conn(send: &DeviceFifo, recv: &DeviceFifo, g: &FifoGeometry, ll_clean: u64) -> Conn {
    let slots = |f: &FifoDescriptor| f.slots.expect("device FIFOs have their slots") as u64;
    Conn {
        send_slots: slots(&send.bulk),
        send_meta: send.headers as u64,
        send_tail: counter_word(send.bulk.tail),
        send_head: counter_word(send.bulk.head),
        send_ll: slots(&send.ll),
        send_ll_head: counter_word(send.ll.head),
        recv_slots: slots(&recv.bulk),
        recv_meta: recv.headers as u64,
        recv_tail: counter_word(recv.bulk.tail),
        recv_head: counter_word(recv.bulk.head),
        recv_ll: slots(&recv.ll),
        recv_ll_head: counter_word(recv.ll.head),
        ll_clean,
        slots: g.slots,
        slot_bytes: g.slot_bytes,
        ll_slots: g.ll_slots,
        ll_lines: g.ll_lines,
        ..Conn::default()
    }
}

/// The `Conn` table of rank `rank` of `n`, `channels * n` entries (zeros
/// for itself): entry `c * n + p` is [`device_fifo`] from `rank` to `p`
/// and from `p` to `rank` on channel `c`. So a sender's `send_*` are the
/// receiver's `recv_*`.
pub(crate) fn conn_table(
    rank: usize,
    n: usize,
    channels: usize,
    bases: &[u64],
    ordinals: &[u32],
    g: &FifoGeometry,
    ll_clean: u64,
) -> Vec<Conn> {
    let mut table = vec![Conn::default(); channels * n];
    for c in 0..channels {
        for p in (0..n).filter(|&p| p != rank) {
            let send = device_fifo(bases, ordinals, n, g, c, rank, p);
            let recv = device_fifo(bases, ordinals, n, g, c, p, rank);
            table[c * n + p] = conn(&send, &recv, g, ll_clean);
        }
    }
    table
}

/// A rank's offer on the wire (the decision from every rank's:
/// `plan::device::decide`).
impl Offer {
    pub(super) fn to_bytes(&self) -> Result<Vec<u8>> {
        let flags = self.runs as u8
            | (self.p2p as u8) << 1
            | (self.allowed.bulk as u8) << 2
            | (self.allowed.ll as u8) << 3
            | (self.gpu.is_some() as u8) << 4;
        let mut out = vec![ROUND_VERSION, flags];
        let g = &self.geometry;
        for v in [g.slots, g.slot_bytes, g.ll_slots, g.ll_lines] {
            out.extend(v.to_le_bytes());
        }
        out.push(self.channels);
        if let Some(gpu) = &self.gpu {
            out.extend(gpu.to_bytes()?);
        }
        Ok(out)
    }

    pub(super) fn from_bytes(rank: usize, b: &[u8]) -> Result<Offer> {
        let bad = |why: &str| Error::Bootstrap(format!("rank {rank}'s device offer: {why}"));
        let [version, flags, rest @ ..] = b else {
            return Err(bad("too short"));
        };
        if *version != ROUND_VERSION {
            return Err(bad(&format!(
                "version {version}, this build speaks {ROUND_VERSION}"
            )));
        }
        if flags >> 5 != 0 {
            return Err(bad(&format!("unknown flags {flags:#x}")));
        }
        let Some((g, rest)) = rest.split_first_chunk::<16>() else {
            return Err(bad("too short"));
        };
        let word = |i: usize| u32::from_le_bytes(g[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        let geometry = FifoGeometry {
            slots: word(0),
            slot_bytes: word(1),
            ll_slots: word(2),
            ll_lines: word(3),
        };
        let Some((&channels, rest)) = rest.split_first() else {
            return Err(bad("too short"));
        };
        if channels == 0 || channels as usize > device_plan::CHANNEL_LIMIT {
            return Err(bad(&format!("{channels} channels")));
        }
        let gpu = if flags & 16 != 0 {
            Some(GpuIdentity::from_bytes(rest)?)
        } else if rest.is_empty() {
            None
        } else {
            return Err(bad("bytes after an offer without a GPU"));
        };
        Ok(Offer {
            runs: flags & 1 != 0,
            p2p: flags & 2 != 0,
            geometry,
            channels,
            allowed: Allowed {
                bulk: flags & 4 != 0,
                ll: flags & 8 != 0,
            },
            gpu,
        })
    }
}

/// A rank's peer-access row on the wire: one byte a rank, 0 no, 1 yes,
/// 2 unknown.
pub(super) fn row_to_bytes(row: &[Option<bool>]) -> Vec<u8> {
    row.iter()
        .map(|a| match a {
            Some(false) => 0,
            Some(true) => 1,
            None => 2,
        })
        .collect()
}

pub(super) fn row_from_bytes(rank: usize, n: usize, b: &[u8]) -> Result<Vec<Option<bool>>> {
    if b.len() != n {
        return Err(Error::Bootstrap(format!(
            "rank {rank}'s peer-access row has {} entries, not {n}",
            b.len()
        )));
    }
    b.iter()
        .map(|&v| match v {
            0 => Ok(Some(false)),
            1 => Ok(Some(true)),
            2 => Ok(None),
            _ => Err(Error::Bootstrap(format!(
                "rank {rank}'s peer-access row holds {v}"
            ))),
        })
        .collect()
}

/// What a rank publishes of its FIFO memory: its address (for ranks of
/// its process), and, for peers in other processes, the handle to map
/// it by and the socket its descriptor is handed out on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FifoEntry {
    pub(crate) address: u64,
    pub(crate) wire: Option<Vec<u8>>,
    pub(crate) socket: Option<Vec<u8>>,
}

/// A rank's FIFO entry on the wire: `[1]`, the address, the handle and
/// the socket name each with its length (0: none); `[0]` where the rank
/// could not make its FIFOs.
pub(super) fn fifo_entry(address: u64, wire: Option<Vec<u8>>, socket: Option<&[u8]>) -> Vec<u8> {
    let mut out = vec![1];
    out.extend(address.to_le_bytes());
    let wire = wire.unwrap_or_default();
    out.extend((wire.len() as u16).to_le_bytes());
    out.extend(&wire);
    let socket = socket.unwrap_or_default();
    out.push(socket.len() as u8);
    out.extend(socket);
    out
}

/// Rank `rank`'s FIFO entry: `None` where it could not make its FIFOs.
pub(super) fn parse_fifo_entry(rank: usize, b: &[u8]) -> Result<Option<FifoEntry>> {
    let bad = || Error::Bootstrap(format!("rank {rank}'s FIFO entry: {} bytes", b.len()));
    let rest = match b {
        [0] => return Ok(None),
        [1, rest @ ..] => rest,
        _ => return Err(bad()),
    };
    let (address, rest) = rest.split_first_chunk::<8>().ok_or_else(bad)?;
    let (len, rest) = rest.split_first_chunk::<2>().ok_or_else(bad)?;
    let len = u16::from_le_bytes(*len) as usize;
    let (wire, rest) = (rest.get(..len).ok_or_else(bad)?, &rest[len..]);
    let (&slen, rest) = rest.split_first().ok_or_else(bad)?;
    if rest.len() != slen as usize {
        return Err(bad());
    }
    let some = |v: &[u8]| (!v.is_empty()).then(|| v.to_vec());
    Ok(Some(FifoEntry {
        address: u64::from_le_bytes(*address),
        wire: some(wire),
        socket: some(rest),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::device::tests::offer;
    use ferroccl_cuda::executor::Protocol;
    use std::collections::HashSet;

    /// Every sender's words are its receiver's, each word of each pair
    /// lies in one place, and in the memory of the rank the geometry says.
    #[test]
    fn conn_tables_pair_every_sender_with_its_receiver() {
        let g = FifoGeometry {
            slots: 3,
            slot_bytes: 256,
            ll_slots: 2,
            ll_lines: 33,
        };
        for n in 1..=6 {
            for channels in 1..=2 {
                let span = channels as u64 * n as u64 * g.region();
                let bases: Vec<u64> = (0..n as u64)
                    .map(|r| (1 << 40) + r * (span + 4096))
                    .collect();
                let ordinals: Vec<u32> = (0..n as u32).map(|r| r % 2).collect();
                let tables: Vec<Vec<Conn>> = (0..n)
                    .map(|r| conn_table(r, n, channels, &bases, &ordinals, &g, 7))
                    .collect();
                let mut words = HashSet::new();
                for c in 0..channels {
                    for s in 0..n {
                        for r in 0..n {
                            let a = tables[s][c * n + r];
                            if s == r {
                                assert_eq!(a, Conn::default());
                                continue;
                            }
                            let b = tables[r][c * n + s];
                            assert_eq!(
                                (
                                    a.send_slots,
                                    a.send_meta,
                                    a.send_tail,
                                    a.send_head,
                                    a.send_ll,
                                    a.send_ll_head
                                ),
                                (
                                    b.recv_slots,
                                    b.recv_meta,
                                    b.recv_tail,
                                    b.recv_head,
                                    b.recv_ll,
                                    b.recv_ll_head
                                ),
                                "{s} -> {r} on channel {c} of {n}"
                            );
                            let inside = |owner: usize, at: u64| {
                                at >= bases[owner] && at < bases[owner] + span
                            };
                            // The receiver polls tail and LL lines and
                            // holds the slots; the sender polls head.
                            assert!(
                                inside(r, a.send_slots)
                                    && inside(r, a.send_tail)
                                    && inside(r, a.send_ll)
                            );
                            assert!(inside(s, a.send_head) && inside(s, a.send_ll_head));
                            for w in [
                                a.send_slots,
                                a.send_meta,
                                a.send_tail,
                                a.send_head,
                                a.send_ll,
                                a.send_ll_head,
                            ] {
                                assert!(words.insert(w), "{w:#x} twice");
                            }
                            assert_eq!(
                                (a.slots, a.slot_bytes, a.ll_slots, a.ll_lines, a.ll_clean),
                                (3, 256, 2, 33, 7)
                            );
                        }
                    }
                }
            }
        }
    }

    /// Each direction's FIFOs are Device memory of the receiver's GPU,
    /// every part inside the receiver's region and apart from the others,
    /// the heads in the sender's region.
    #[test]
    fn device_fifos_describe_the_receivers_memory() {
        let g = FifoGeometry::new(4096, 4);
        let (n, channels) = (3, 2);
        let span = (channels * n) as u64 * g.region();
        let bases: Vec<u64> = (0..n as u64).map(|r| (1 << 40) + r * (1 << 30)).collect();
        let ordinals = [0, 3, 1];
        for c in 0..channels {
            for s in 0..n {
                for r in (0..n).filter(|&r| r != s) {
                    let f = device_fifo(&bases, &ordinals, n, &g, c, s, r);
                    let m = f.bulk.mapping.unwrap();
                    assert!(
                        m.addr as u64 >= bases[r]
                            && m.addr as u64 + m.len as u64 <= bases[r] + span
                    );
                    for d in [f.bulk, f.ll] {
                        assert_eq!(
                            d.memory,
                            MemoryKind::Device {
                                ordinal: ordinals[r]
                            }
                        );
                        let slots = d.slot_range().unwrap();
                        assert!(m.contains(slots.addr, slots.len), "{s} -> {r} on {c}");
                        let Counter::Mapped { addr } = d.head else {
                            panic!("{:?}", d.head)
                        };
                        let back = bases[s] + ((c * n + r) as u64) * g.region();
                        assert!(addr as u64 >= back && (addr as u64) < back + g.region());
                    }
                    assert_eq!(f.ll.tail, Counter::Flagged);
                    let Counter::Mapped { addr: tail } = f.bulk.tail else {
                        panic!()
                    };
                    let headers = Mapping {
                        addr: f.headers,
                        len: 8 * g.slots as usize,
                    };
                    let (bulk, ll) = (f.bulk.slot_range().unwrap(), f.ll.slot_range().unwrap());
                    // In the region's order: slots, header words, LL
                    // lines, tail; none overlapping the next.
                    assert!(bulk.addr + bulk.len <= headers.addr);
                    assert!(headers.addr + headers.len <= ll.addr);
                    assert!(ll.addr + ll.len <= tail);
                    assert!(m.contains(tail, 8));
                    assert_eq!(f.ll.slot_bytes, g.room(Protocol::LowLatency));
                }
            }
        }
    }

    /// FIFO entries cross the wire whole, with and without a handle; a
    /// rank without FIFOs says so; cut or padded entries are refused.
    #[test]
    fn fifo_entries_cross_the_wire() {
        let full = FifoEntry {
            address: 0xdead_beef_0040,
            wire: Some(vec![1, 2, 3]),
            socket: Some(b"ferroccl-fifo-1-2".to_vec()),
        };
        let bytes = fifo_entry(full.address, full.wire.clone(), full.socket.as_deref());
        assert_eq!(parse_fifo_entry(0, &bytes).unwrap(), Some(full));
        let bare = fifo_entry(64, None, None);
        assert_eq!(
            parse_fifo_entry(0, &bare).unwrap(),
            Some(FifoEntry {
                address: 64,
                wire: None,
                socket: None
            })
        );
        assert_eq!(parse_fifo_entry(0, &[0]).unwrap(), None);
        for cut in 0..bytes.len() {
            assert!(parse_fifo_entry(2, &bytes[..cut]).is_err(), "{cut} bytes");
        }
        let long = [bytes.clone(), vec![0]].concat();
        let err = parse_fifo_entry(2, &long).unwrap_err();
        assert!(err.to_string().contains("rank 2"), "{err}");
    }

    #[test]
    fn the_geometry_keeps_parts_apart() {
        let g = FifoGeometry::new(
            crate::config::DEFAULT_BUFFSIZE / ferroccl_transport::DEFAULT_STEPS,
            ferroccl_transport::DEFAULT_STEPS,
        );
        assert_eq!((g.slots, g.slot_bytes), (8, 512 << 10));
        assert_eq!(FifoGeometry::new(256, 1).slots, 2);
        assert_eq!(FifoGeometry::new(256, 4).room(Protocol::LowLatency), 256);
        assert!(g.meta() >= g.slots as u64 * g.slot_bytes as u64);
        assert!(g.ll() >= g.meta() + 8 * g.slots as u64);
        assert!(g.tail() >= g.ll() + g.ll_slots as u64 * g.ll_lines as u64 * 16);
        for w in [g.ll(), g.tail(), g.head(), g.ll_head(), g.region()] {
            assert_eq!(w % WORD_GAP, 0);
        }
        // An LL slot holds the tuner's LL chunk after its header line.
        assert!((g.ll_lines as usize - 1) * 8 >= device_plan::LL_CHUNK_BYTES);
        assert!(g.slot_bytes as usize >= device_plan::BULK_CHUNK_BYTES);
    }

    #[test]
    fn offers_cross_the_wire_and_bad_ones_are_refused() {
        for o in [
            offer(3, 9),
            Offer {
                runs: false,
                p2p: true,
                allowed: Allowed {
                    bulk: false,
                    ll: true,
                },
                geometry: FifoGeometry::new(1 << 20, 8),
                channels: 1,
                gpu: None,
            },
        ] {
            let b = o.to_bytes().unwrap();
            assert_eq!(Offer::from_bytes(0, &b).unwrap(), o);
            for cut in 0..b.len() {
                // Never a panic; a cut offer is refused or (cut after the
                // flags of one without a GPU) equal.
                let _ = Offer::from_bytes(0, &b[..cut]);
            }
        }
        let e = Offer::from_bytes(4, &[ROUND_VERSION + 1, 0])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rank 4") && e.contains(&format!("version {}", ROUND_VERSION + 1)),
            "{e}"
        );
        let mut zero = offer(1, 2).to_bytes().unwrap();
        zero[18] = 0;
        let e = Offer::from_bytes(4, &zero).unwrap_err().to_string();
        assert!(e.contains("0 channels"), "{e}");
        let mut flags = vec![ROUND_VERSION, 0x20];
        flags.extend([0; 16]);
        let e = Offer::from_bytes(4, &flags).unwrap_err().to_string();
        assert!(e.contains("flags"), "{e}");
        assert!(row_from_bytes(1, 3, &[0, 1, 3]).is_err());
        assert_eq!(
            row_from_bytes(1, 3, &row_to_bytes(&[Some(false), Some(true), None])).unwrap(),
            vec![Some(false), Some(true), None]
        );
    }
}
