//! The FIFO descriptors of a shared-memory connection tell the truth: read
//! through the addresses they give (as a device writer of the slots would
//! use them), the counters, published words, headers and payloads are the
//! frames that were sent, in the sender's mapping and in the receiver's.

mod common;

use common::*;
use ferroccl_transport::conformance::{exchange, Paths};
use ferroccl_transport::{
    Connection, Counter, Deadline, FifoDescriptor, FrameHeader, MemoryKind, TransportError,
    HEADER_BYTES,
};
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
            layout.payload + placed(fifo, slot)
        };
        assert_eq!(bytes(slot + at, len), payload(0, k, len), "frame {k}");
    }
}

/// How far into the payload area of the slot at `slot` its payload starts,
/// in bytes, as its placement word says.
fn placed(fifo: &FifoDescriptor, slot: usize) -> usize {
    let p = fifo
        .layout
        .placement
        .expect("shm slots say where a payload starts");
    let word: [u8; 4] = bytes(slot + p.offset, 4).try_into().unwrap();
    u32::from_ne_bytes(word) as usize * p.unit
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

#[test]
fn a_slot_s_payloads_move_along_it_from_one_use_to_the_next() {
    // Slots of three pages and 1,000 bytes, two of them: frames of 5,000
    // bytes take two pages each, so a slot's first payload starts at 0, its
    // second two pages in, its third back at 0 (two more pages would run
    // past the end). Frames whose length is not known beforehand
    // (`send_with`) start at 0 and leave the next place alone, as inline
    // frames do; a frame that does not fit from the next place starts at 0.
    //
    // Where the ranks share CPUs every payload starts at 0: on this
    // machine that is a communicator of more ranks than CPUs, so both
    // ways are checked, 2 ranks and as many as the CPUs and one more.
    let chunk = 3 * 4096 + 1000;
    let cpus = ferroccl_transport::wait::host_cpus();
    for size in [2, cpus + 1] {
        let spread = !ferroccl_transport::wait::ranks_share_cpus(size);
        if size == 2 && !spread {
            eprintln!("skipped the spread payloads on 2 ranks: this machine has one CPU for them");
        }
        payloads_move_along(chunk, size, spread);
    }
}

fn payloads_move_along(chunk: usize, size: usize, spread: bool) {
    let (mut c0, mut c1, _abort) = pair_of(size, chunk, 2);
    let sized = |c: &mut Connection, k: usize, len: usize| {
        let want = payload(0, k, len);
        host(c)
            .sender
            .send_sized_until(header_for(0, k), Deadline::At(soon(5_000)), len, &mut |b| {
                b.copy_from_slice(&want)
            })
            .unwrap();
    };
    // (length, sized?, where slot k % 2's payload must start)
    let frames: [(usize, bool, usize); 10] = [
        (5000, true, 0),
        (5000, true, 0),
        (5000, true, 8192),
        (5000, true, 8192),
        (5000, true, 0),
        (9, true, 0),
        (5000, false, 0),
        (chunk, true, 0),
        (4096, true, 8192),
        (5000, true, 0),
    ];
    let mut sizes = Vec::new();
    for (k, &(len, is_sized, at)) in frames.iter().enumerate() {
        if is_sized {
            sized(&mut c0, k, len);
        } else {
            send_bytes(&mut c0, header_for(0, k), &payload(0, k, len), soon(5_000)).unwrap();
        }
        sizes.push(len);
        let fifo = c1.recv_fifo;
        let slot = fifo.slots.unwrap() + (k % 2) * fifo.slot_stride;
        if len > fifo.layout.inline.unwrap().max_bytes {
            let at = if spread { at } else { 0 };
            assert_eq!(
                placed(&fifo, slot),
                at,
                "frame {k} of {len} bytes, {size} ranks"
            );
        }
        check(&fifo, &sizes, k + 1, k);
        let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step as usize, b), (k, payload(0, k, len)), "frame {k}");
    }
}

#[test]
fn a_payload_placed_past_the_slot_is_a_protocol_error_naming_the_peer() {
    let chunk = 3 * 4096;
    let (mut c0, mut c1, _abort) = pair(chunk, 2);
    let len = 5000;
    send_bytes(&mut c0, header_for(0, 0), &payload(0, 0, len), soon(5_000)).unwrap();
    let fifo = c1.recv_fifo;
    let p = fifo.layout.placement.unwrap();
    let word = fifo.slots.unwrap() + p.offset;
    // Two pages in: 8192 + 5000 bytes run past the 12,288-byte slot.
    let bad = ((2 * 4096 / p.unit) as u32).to_ne_bytes();
    // SAFETY: the word lies in the inline area of slot 0, which holds a
    // published frame that nobody writes before the receiver releases it;
    // this test stands for a sender that broke the protocol.
    unsafe { std::ptr::copy_nonoverlapping(bad.as_ptr(), word as *mut u8, 4) };
    let err = recv_bytes(&mut c1, soon(5_000)).unwrap_err();
    match &err {
        TransportError::Protocol { peer: 0, detail } => {
            assert!(
                detail.contains("placed 8192 bytes into a 12288-byte slot"),
                "{err}"
            )
        }
        other => panic!("want a protocol error from rank 0, got {other:?}"),
    }
    // The connection stays ended with it.
    assert!(matches!(
        recv_bytes(&mut c1, soon(100)),
        Err(TransportError::Protocol { peer: 0, .. })
    ));
}

#[test]
fn frames_cross_intact_while_their_payloads_move_along_the_slots() {
    // Both ways at once, 120 frames of every size up to the slot's, sized
    // (placed) and not, on 2 ranks: where the machine has 2 CPUs for them
    // the payloads move along their slots (the conformance suite's pairs
    // are of 4 ranks, which share this machine's CPUs).
    let chunk = 3 * 4096 + 100;
    for paths in [Paths::Sized, Paths::InSlot, Paths::Caller] {
        let (c0, c1, _abort) = pair_of(2, chunk, 2);
        exchange(c0, c1, chunk, 120, paths);
    }
}
