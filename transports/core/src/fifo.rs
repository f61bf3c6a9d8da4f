//! What connection set-up says about each direction's FIFO: where its slots
//! live, how a slot is laid out, and where its head and tail counters are.
//! A host executor needs none of it (it moves bytes through the
//! [`HostPath`](crate::HostPath) halves); a GPU kernel that writes a peer's
//! FIFO or an RDMA engine needs exactly this, and transports of that kind
//! would have no host path at all. None exists yet: shm describes its
//! segments exactly; tcp and mem say their FIFO is internal; ib describes
//! its registered slots (`Registered`) with internal counters, its RDMA
//! writes posted by its host path; and the device executor (ferroccl's
//! `comm::device_exec::wire`) describes each direction of each channel as
//! two `Device` FIFOs, bulk and LL (LL lines carry their flags:
//! [`Counter::Flagged`]), and builds its kernels' connection table from
//! those descriptors. Plain data: nothing here reads or writes the memory
//! it describes.
//!
//! Counters count frames since the connection was made (they never wrap in
//! practice: 2^64 frames). Frame `k` travels in slot `k % slot_count`; the
//! sender may fill it once `head > k - slot_count` (the receiver released
//! frame `k - slot_count`), and publishes it by storing `tail = k + 1`
//! (and, where slots have one, the slot's published word); the receiver
//! consumes it once published and releases it by storing `head = k + 1`.
//!
//! # shm, for instance
//!
//! One direction of a shm connection is one file that both processes map
//! whole; each end describes it at the addresses of its own mapping `m`:
//!
//! ```text
//! memory       HostShared
//! mapping      m .. m + 1024 + steps * stride     (the whole segment)
//! tail         Mapped { m + 128 }   frames published (the sender stores)
//! head         Mapped { m + 192 }   frames released (the receiver stores)
//! slots        m + 1024, slot_count = steps
//! slot_stride  64 + chunk_bytes rounded up to a multiple of 64
//! slot_bytes   chunk_bytes
//! layout       published +0   u64, k + 1 once frame k is in the slot;
//!                             the receiver polls it (not tail)
//!              header    +8   the 40-byte frame header, len included
//!              inline    +48  payloads of at most 16 bytes (the cache
//!                             line of the word and the header)
//!              payload   +64  larger payloads, chunk_bytes at most
//! ```
//!
//! A sender fills slot `k % steps`, writes the header, stores the slot's
//! published word (Release) and then `tail`; the receiver loads the
//! published word (Acquire), reads header and payload, and stores `head`
//! (Release). Control fields of the segment other than these (identity,
//! close and failure flags) are the transport's own and not described.

/// Where a FIFO's slots live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Host memory of the receiving process, private to it: the sender's
    /// bytes reach it through the transport (a socket, a channel), never by
    /// a store of the sender (tcp, mem).
    HostPrivate,
    /// Host memory mapped by both processes (or threads) of the connection:
    /// either side loads and stores it directly (shm).
    HostShared,
    /// Memory of the GPU with this ordinal (as the owning process numbers
    /// its devices), mapped into the peer's address space (cuda-ipc).
    Device {
        /// The device's ordinal in the process that owns the memory.
        ordinal: u32,
    },
    /// Memory registered with an RDMA device (ib): what a remote writer
    /// needs to put bytes into it.
    Registered {
        /// The remote key the writer presents.
        rkey: u32,
        /// Address of slot 0 in the owner's registration (the virtual
        /// address in the owner's process, or the offset in its memory
        /// region, as the device was told).
        remote_addr: u64,
    },
}

/// Where a head or tail counter lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Counter {
    /// A 64-bit word (8-byte aligned, accessed only as an atomic) at this
    /// address in this process, for as long as the connection lives. Only
    /// its one writer (the sender for `tail`, the receiver for `head`)
    /// stores it, with Release; the other side loads it with Acquire.
    Mapped {
        /// Address of the word in this process.
        addr: usize,
    },
    /// Kept inside the transport (a socket stream's order, a channel): no
    /// memory a kernel could poll holds it.
    Internal,
    /// No word counts them: every line of a slot carries its frame's flag
    /// beside its data (NCCL's LL protocol), and the receiver polls the
    /// slot's lines themselves (the device executor's LL FIFOs).
    Flagged,
}

/// Where, inside one slot, its parts are (offsets from the slot's start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    /// Offset of the slot's published word: a 64-bit atomic the sender
    /// stores (Release) as `k + 1` once frame `k` is in the slot, and the
    /// receiver polls (Acquire) instead of `tail`. None where slots have no
    /// such word.
    pub published: Option<usize>,
    /// Offset of the frame's 40-byte header ([`crate::HEADER_BYTES`],
    /// `FrameHeader::encode` layout). None where the header does not
    /// travel in the slot (it is kept beside the slot, or on the wire).
    pub header: Option<usize>,
    /// Offset of the payload (`slot_bytes` long).
    pub payload: usize,
    /// Where a small payload travels instead (next to the header, in its
    /// cache line), if the transport does that.
    pub inline: Option<InlinePayload>,
    /// Where a larger payload's start inside the payload area is written,
    /// if the transport moves payloads along it (None: every payload
    /// starts at [`SlotLayout::payload`]).
    pub placement: Option<PayloadPlacement>,
}

/// A small payload's place inside a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlinePayload {
    /// Offset of the inline payload from the slot's start.
    pub offset: usize,
    /// Payloads of at most this many bytes are stored here instead of at
    /// [`SlotLayout::payload`].
    pub max_bytes: usize,
}

/// A payload's start inside a slot's payload area, for a transport that
/// moves payloads along it (shared memory, so that the lines a receiver
/// read last are not the ones the sender writes next).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadPlacement {
    /// Offset from the slot's start of a native-endian u32: the payload's
    /// start past [`SlotLayout::payload`], in `unit`s. Written for every
    /// payload that does not travel inline.
    pub offset: usize,
    /// Bytes per unit of that word.
    pub unit: usize,
}

impl SlotLayout {
    /// The layout of a slot that is nothing but its payload.
    pub const PAYLOAD_ONLY: SlotLayout = SlotLayout {
        published: None,
        header: None,
        payload: 0,
        inline: None,
        placement: None,
    };
}

/// One address range of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// First byte.
    pub addr: usize,
    /// Bytes.
    pub len: usize,
}

impl Mapping {
    /// Whether `len` bytes at `addr` lie inside this range.
    pub fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.addr
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.addr + self.len)
    }
}

/// One direction of a connection as this rank sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FifoDescriptor {
    /// Where the slots live (shm: `HostShared`; tcp, mem: `HostPrivate`).
    pub memory: MemoryKind,
    /// The memory that holds this FIFO's slots and its [`Counter::Mapped`]
    /// counters, as one range in this process (shm: the whole segment,
    /// control block at its start); None where nothing of it is mapped
    /// here (tcp, mem).
    pub mapping: Option<Mapping>,
    /// Address of slot 0 in this process, where the slots are memory at a
    /// fixed place here (slot `i` starts at `slots + i * slot_stride`;
    /// shm: `mapping.addr + 1024`); None where they are not (tcp's and
    /// mem's buffers handed around inside the transport, memory of another
    /// process not mapped here).
    pub slots: Option<usize>,
    /// Slots in the FIFO (the listener's `steps`).
    pub slot_count: usize,
    /// Payload capacity of one slot in bytes (the listener's
    /// `chunk_bytes`): the largest frame.
    pub slot_bytes: usize,
    /// Bytes from one slot's start to the next (shm: 64 + `slot_bytes`
    /// rounded up to a multiple of 64); meaningful where `slots` is Some
    /// (0 otherwise).
    pub slot_stride: usize,
    /// Where a slot's parts are, from its start (shm: published word at 0,
    /// header at 8, inline payload of up to 16 bytes at 48, payload at
    /// 64); meaningful where `slots` is Some.
    pub layout: SlotLayout,
    /// Frames released by the receiver, written only by it (shm: the u64
    /// at `mapping.addr + 192`; tcp, mem: `Internal`).
    pub head: Counter,
    /// Frames published by the sender, written only by it (shm: the u64 at
    /// `mapping.addr + 128`; tcp, mem: `Internal`).
    pub tail: Counter,
}

impl FifoDescriptor {
    /// A FIFO whose slots and counters are all inside the transport (tcp's
    /// socket buffers, mem's channels): only its geometry is known.
    pub fn internal(memory: MemoryKind, slot_count: usize, slot_bytes: usize) -> Self {
        FifoDescriptor {
            memory,
            mapping: None,
            slots: None,
            slot_count,
            slot_bytes,
            slot_stride: 0,
            layout: SlotLayout::PAYLOAD_ONLY,
            head: Counter::Internal,
            tail: Counter::Internal,
        }
    }

    /// The address range of all slots in this process, where they have one.
    pub fn slot_range(&self) -> Option<Mapping> {
        let addr = self.slots?;
        Some(Mapping {
            addr,
            len: self.slot_stride.checked_mul(self.slot_count)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_holds_what_lies_inside_it_only() {
        let m = Mapping {
            addr: 4096,
            len: 1024,
        };
        assert!(m.contains(4096, 1024));
        assert!(m.contains(4096 + 128, 8));
        assert!(!m.contains(4095, 8));
        assert!(!m.contains(4096 + 1020, 8));
        assert!(!m.contains(usize::MAX, 8));
    }

    #[test]
    fn an_internal_fifo_has_no_place() {
        let d = FifoDescriptor::internal(MemoryKind::HostPrivate, 8, 1 << 20);
        assert_eq!((d.slot_count, d.slot_bytes), (8, 1 << 20));
        assert_eq!((d.slots, d.mapping, d.slot_range()), (None, None, None));
        assert_eq!((d.head, d.tail), (Counter::Internal, Counter::Internal));
    }
}
