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
