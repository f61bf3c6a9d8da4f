//! What the RDMA data path needs from verbs, modelled on ibverbs reliable
//! connected (RC) queue pairs: memory registration, one-sided RDMA WRITE
//! and RDMA WRITE WITH IMMEDIATE, completion polling and the queue pair's
//! state.
//!
//! There is no `unsafe` in this crate and so no raw addresses: a
//! registered region is named by an [`MrHandle`] and addressed by byte
//! offset, and its bytes are reached through [`Device::write_region`] and
//! [`Device::read_region`]. The real implementation (on `ibverbs`, behind
//! feature `ib`) maps a handle to the memory it registered and an offset
//! to `base + offset`. Remote memory is named as on the wire: `(rkey,
//! remote address)`, the peer having said both (its region's
//! [`MemoryRegion::addr`] plus an offset).
//!
//! Caller memory registered where it is ([`Device::register_user`]) is
//! named by its address, as a number that nothing here dereferences: the
//! NIC reads it, and the emulation is handed the bytes themselves
//! ([`Device::present`]).

use std::time::Duration;

/// A registered memory region of one device, local to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrHandle(pub u64);

/// What registration gives: the handle, the local key (checked on the
/// local side of a work request) and the remote key (handed to peers so
/// that they may write into the region).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRegion {
    /// The region, for local use.
    pub handle: MrHandle,
    /// Local key (`lkey`).
    pub lkey: u32,
    /// Remote key (`rkey`): what a peer names the region by.
    pub rkey: u32,
    /// Length in bytes.
    pub len: usize,
    /// The address peers name the region's first byte by (a virtual
    /// address on real verbs; the emulation makes up distinct ones). A
    /// work request's remote address is `addr + offset`.
    pub addr: u64,
}

/// The local bytes a write sends: `len` bytes at `offset` in region `mr`
/// (a scatter/gather element of one entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalSlice {
    /// Source region.
    pub mr: MrHandle,
    /// Byte offset in it.
    pub offset: usize,
    /// Byte count (may be zero, e.g. for an immediate alone).
    pub len: usize,
}

/// Where a write lands at the peer: address `addr` of the region named by
/// `rkey` (the work request's `remote_addr` and `rkey`). The peer hands out
/// both, e.g. in a clear-to-send entry: its region's [`MemoryRegion::addr`]
/// plus an offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteSlice {
    /// The peer's remote key.
    pub rkey: u32,
    /// The address in the peer's region where the write starts.
    pub addr: u64,
}

/// One RDMA WRITE (or WRITE WITH IMMEDIATE when `imm` is set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRequest {
    /// Caller-chosen id, returned in the send completion.
    pub wr_id: u64,
    /// What to send.
    pub local: LocalSlice,
    /// Where it lands.
    pub remote: RemoteSlice,
    /// With `Some`, the peer also gets a receive completion carrying this
    /// value and the length written.
    pub imm: Option<u32>,
}

/// What a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionKind {
    /// A posted write finished (at the sender).
    SendDone,
    /// A write with immediate landed (at the receiver).
    RecvWithImm {
        /// The immediate.
        imm: u32,
        /// Bytes written.
        len: usize,
    },
}

/// Why a work request failed; as on hardware, any of these also leaves the
/// queue pair in [`QpState::Error`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WcError {
    /// The peer refused the access: unknown or stale rkey, or out of the
    /// region's bounds (`IBV_WC_REM_ACCESS_ERR`).
    #[error("remote access error: {0}")]
    RemoteAccess(String),
    /// The local slice is not in a registered region of this device
    /// (`IBV_WC_LOC_PROT_ERR`).
    #[error("local protection error: {0}")]
    LocalProtection(String),
    /// The peer's queue pair is in error or gone; no answer would come
    /// (`IBV_WC_RETRY_EXC_ERR`).
    #[error("transport retry exceeded: {0}")]
    RetryExceeded(String),
    /// The queue pair was in error when this request's turn came; it was
    /// not executed (`IBV_WC_WR_FLUSH_ERR`).
    #[error("flushed: queue pair in error state")]
    Flushed,
}

/// One completion: the request it answers (`wr_id`, zero for receive
/// completions), what happened, and whether it went well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// Send done or receive with immediate.
    pub kind: CompletionKind,
    /// `Ok(())` or the error.
    pub status: Result<(), WcError>,
}

/// A queue pair's state, as far as the data path cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpState {
    /// Connected, ready to send and receive (RTS).
    Ready,
    /// Broken: everything posted or pending completes with an error.
    Error,
}

/// Errors returned directly by calls (not through completions).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// The send queue is full: `depth` requests are outstanding (posted and
    /// their send completion not yet polled).
    #[error("send queue full: {depth} work requests outstanding; poll completions first")]
    SendQueueFull {
        /// The queue's depth.
        depth: usize,
    },
    /// No such registered region on this device.
    #[error("no registered region {0:?} on this device")]
    UnknownRegion(MrHandle),
    /// The device cannot register this kind of memory (the emulation and
    /// dma-buf without driver support): the caller stages the bytes
    /// through registered host memory instead.
    #[error("memory registration not supported: {0}")]
    Unsupported(String),
    /// The registration call itself failed (locked-memory limit, a bad
    /// address, ...), with the driver's reason.
    #[error("memory registration failed: {0}")]
    Registration(String),
    /// A local access outside a region.
    #[error("bytes {offset}..{offset}+{len} out of region of {region_len} bytes")]
    OutOfBounds {
        /// Start.
        offset: usize,
        /// Count.
        len: usize,
        /// The region's length.
        region_len: usize,
    },
}

/// Memory the caller owns, to be registered where it is (zero copy)
/// rather than copied into a region the device allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserMemory {
    /// `len` bytes of this process's host memory at virtual address
    /// `addr`, registered for the NIC to read (the source of writes):
    /// no remote access is granted, so no peer can write into it.
    Host {
        /// First byte's virtual address.
        addr: usize,
        /// Byte count.
        len: usize,
    },
    /// Device (GPU) memory exported as a dma-buf: `len` bytes at `offset`
    /// in the dma-buf `fd`, named `iova` on the wire. Registered for local
    /// and remote write, as device buffers are both source and target.
    DmaBuf {
        /// The dma-buf file descriptor (e.g. from `cuMemGetHandleForAddressRange`).
        fd: i32,
        /// Offset of the first byte in the dma-buf.
        offset: u64,
        /// Byte count.
        len: usize,
        /// The address work requests name the first byte by.
        iova: u64,
    },
}

impl UserMemory {
    /// The host range of `bytes`, for [`Device::register_user`].
    pub fn host(bytes: &[u8]) -> Self {
        UserMemory::Host {
            addr: bytes.as_ptr() as usize,
            len: bytes.len(),
        }
    }

    /// Byte count.
    pub fn len(&self) -> usize {
        match *self {
            UserMemory::Host { len, .. } | UserMemory::DmaBuf { len, .. } => len,
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A device's protection domain: registration and CPU access to
/// registered bytes.
pub trait Device {
    /// Registers `len` zeroed bytes. (The real verbs register memory the
    /// caller owns; here the device owns it, see the module doc.)
    fn register(&self, len: usize) -> Result<MemoryRegion, VerbsError>;
    /// Deregisters: the region's keys become invalid, and writes naming
    /// its rkey fail with [`WcError::RemoteAccess`].
    fn deregister(&self, mr: MrHandle) -> Result<(), VerbsError>;
    /// Copies `data` into the region at `offset` (the CPU filling a send
    /// buffer).
    fn write_region(&self, mr: MrHandle, offset: usize, data: &[u8]) -> Result<(), VerbsError>;
    /// Copies bytes out of the region at `offset` (the CPU reading what a
    /// peer wrote).
    fn read_region(&self, mr: MrHandle, offset: usize, out: &mut [u8]) -> Result<(), VerbsError>;

    /// Registers memory the caller owns where it is (see [`UserMemory`]).
    /// The region's `addr` is the memory's own address (host) or its iova
    /// (dma-buf); [`Device::write_region`] and [`Device::read_region`]
    /// refuse it (the caller reaches its own memory directly). The caller
    /// keeps the memory allocated and mapped until it deregisters: a
    /// registration pins the pages it found, so memory freed and mapped
    /// again at the same address would not be what the NIC reads (the
    /// registration cache, [`crate::regcache`], is what keeps that
    /// promise for the data path). [`VerbsError::Unsupported`] where the
    /// device cannot register that kind of memory.
    fn register_user(&self, mem: UserMemory) -> Result<MemoryRegion, VerbsError> {
        Err(VerbsError::Unsupported(format!(
            "this device does not register caller memory ({mem:?})"
        )))
    }

    /// Shows the device `bytes`, the caller's memory at `offset` in the
    /// host user region `mr`, before writes are posted from them. On real
    /// verbs the NIC reads them by address, so this only checks that
    /// `bytes` are where the region says (`addr + offset`); the emulated
    /// NIC, which cannot read memory by address without `unsafe`, takes
    /// its copy of them here (its DMA read, done early: the caller keeps
    /// `bytes` borrowed, unchanged, until the writes complete, so the
    /// result is the same). Bytes not where the region is are an error.
    fn present(&self, mr: MrHandle, offset: usize, bytes: &[u8]) -> Result<(), VerbsError> {
        let _ = (offset, bytes);
        Err(VerbsError::UnknownRegion(mr))
    }
}

/// One end of a reliable connected queue pair, with its own completion
/// queue (send and receive completions together).
///
/// Per queue pair, writes are executed and completed in posting order.
pub trait QueuePair {
    /// Posts an RDMA WRITE (with immediate when `wr.imm` is set). Refused
    /// with [`VerbsError::SendQueueFull`] beyond the send queue's depth.
    /// On a queue pair in error the post is accepted and completes with
    /// [`WcError::Flushed`], as `ibv_post_send` does.
    fn post_write(&self, wr: &WriteRequest) -> Result<(), VerbsError>;
    /// Takes up to `max` completions without blocking.
    fn poll(&self, max: usize) -> Vec<Completion>;
    /// Like [`poll`](Self::poll) but waits up to `timeout` for at least one
    /// completion; empty on timeout.
    fn wait(&self, max: usize, timeout: Duration) -> Vec<Completion>;
    /// The queue pair's state.
    fn state(&self) -> QpState;
    /// Requests posted whose send completion has not been polled yet.
    fn outstanding(&self) -> usize;
}
