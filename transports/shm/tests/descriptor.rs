//! The FIFO descriptors of a shared-memory connection tell the truth: read
//! through the addresses they give (as a device writer of the slots would
//! use them), the counters, published words, headers and payloads are the
//! frames that were sent, in the sender's mapping and in the receiver's.

mod common;

use common::*;
use ferroccl_transport::{Counter, FifoDescriptor, FrameHeader, MemoryKind, HEADER_BYTES};
use std::sync::atomic::{AtomicU64, Ordering};

/// The 64-bit word at `addr` of a live mapping.
fn word(addr: usize) -> u64 {
    assert_eq!(addr % 8, 0);
    // SAFETY: `addr` is a counter or published word of a descriptor whose
    // connection is alive for the whole test (the mapping stays), 8-aligned
    // (checked), and the transport only ever accesses it as an atomic.
    unsafe { &*(addr as *const AtomicU64) }.load(Ordering::Acquire)
}

/// `len` bytes at `addr` of a live mapping.
fn bytes(addr: usize, len: usize) -> Vec<u8> {
    // SAFETY: the range lies inside the slot of a published, not yet
    // released frame of a live connection (the caller's descriptor says
    // so), which nobody writes until the receiver releases it; it is copied
    // out at once.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec()
}

fn counter(c: Counter) -> u64 {
    match c {
        Counter::Mapped { addr } => word(addr),
        other => panic!("shm counters are mapped, not {other:?}"),
    }
}

/// Frames `k` in `0..sent` (sizes `sizes[k]`, headers `header_for(0, k)`)
/// are in the slots `fifo` describes; `released` of them were released.
fn check(fifo: &FifoDescriptor, sizes: &[usize], sent: usize, released: usize) {
    assert_eq!(fifo.memory, MemoryKind::HostShared);
    let mapping = fifo.mapping.expect("a mapping");
    let slots = fifo.slots.expect("slots at a fixed place");
    assert_eq!(slots, mapping.addr + 1024);
    assert_eq!(fifo.slot_stride, 64 + fifo.slot_bytes.next_multiple_of(64));
    assert_eq!(mapping.len, 1024 + fifo.slot_count * fifo.slot_stride);
    assert_eq!(
        fifo.tail,
        Counter::Mapped {
            addr: mapping.addr + 128
        }
    );
    assert_eq!(
        fifo.head,
        Counter::Mapped {
            addr: mapping.addr + 192
        }
    );
    assert_eq!(counter(fifo.tail), sent as u64);
    assert_eq!(counter(fifo.head), released as u64);
    let layout = fifo.layout;
    for (k, &len) in sizes.iter().enumerate().take(sent).skip(released) {
        let slot = slots + (k % fifo.slot_count) * fifo.slot_stride;
        assert_eq!(
            word(slot + layout.published.unwrap()),
            k as u64 + 1,
            "frame {k}"
        );
        let raw = bytes(slot + layout.header.unwrap(), HEADER_BYTES);
        let header = FrameHeader::decode(&raw, fifo.slot_bytes).unwrap();
        let mut want = header_for(0, k);
        want.len = len as u32;
        assert_eq!(header, want, "frame {k}");
        let inline = layout.inline.unwrap();
        let at = if len <= inline.max_bytes {
            inline.offset
        } else {
            layout.payload
        };
        assert_eq!(bytes(slot + at, len), payload(0, k, len), "frame {k}");
    }
}

#[test]
fn descriptors_describe_the_slots_and_counters_as_they_are() {
    let (chunk, steps) = (100, 3);
    let (mut c0, mut c1, _abort) = pair(chunk, steps);
    let sizes = [10, 100, 0, 16, 17];
    for (k, &len) in sizes.iter().enumerate().take(steps) {
        send_bytes(&mut c0, header_for(0, k), &payload(0, k, len), soon(5_000)).unwrap();
    }
    // The sender's mapping and the receiver's: two views of one file.
    assert_ne!(c0.send_fifo.mapping, c1.recv_fifo.mapping);
    check(&c0.send_fifo, &sizes, steps, 0);
    check(&c1.recv_fifo, &sizes, steps, 0);
    // Nothing went the other way.
    check(&c1.send_fifo, &sizes, 0, 0);
    check(&c0.recv_fifo, &sizes, 0, 0);
    // Release two, publish two more (they reuse slots 0 and 1).
    for (k, &len) in sizes.iter().enumerate().take(2) {
        let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step as usize, b), (k, payload(0, k, len)));
    }
    for (k, &len) in sizes.iter().enumerate().skip(steps) {
        send_bytes(&mut c0, header_for(0, k), &payload(0, k, len), soon(5_000)).unwrap();
    }
    check(&c0.send_fifo, &sizes, sizes.len(), 2);
    check(&c1.recv_fifo, &sizes, sizes.len(), 2);
}
