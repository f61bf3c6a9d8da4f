//! The device executor's launcher (issue 16): device calls whose ranks'
//! GPUs reach each other run as one kernel per rank that moves and
//! reduces the data in device memory (docs/device-executor.md), in place
//! of staging through host memory.
//!
//! - **Which path.** At the first collective device call on an engine,
//!   every rank takes part, in the call's turn, in rounds through the
//!   rendezvous store: what it can do (the engine runs the executor, P2P
//!   on, the protocols FERROCCL_PROTO allows) and its GPU's identity
//!   (`plan::gpu_path`); its peer-access answers; and, where the executor is
//!   chosen, its FIFO memory: the device address, and for ranks with peers
//!   in other processes the handle to map it by (`share`). The
//!   choice is made from every rank's answers, so every rank makes the
//!   same one: the executor where every pair of ranks has a GPU path
//!   (ranks of one process use each other's pointers; ranks of other
//!   processes whose GPUs reach each other, or share one, map each other's
//!   FIFOs with cuda-ipc, the descriptors passed over Unix sockets, and
//!   say in a last round that they could); else every call stays staged,
//!   with the reason at INFO. Point-to-point calls always stay staged (two
//!   ranks cannot hold the all-rank rounds).
//! - **A call.** The progress thread, in the call's turn: chooses protocol
//!   and chunk (`plan::device::for_call`, its `plan:` line at INFO), plans the schedule with frames of
//!   that chunk, encodes this rank's program (`algo::encode`), and enqueues
//!   on the communicator's own stream: a wait for the caller's earlier
//!   work, the image and a fresh `Control`, the kernel, the raise of the
//!   caller's gate (the caller's stream waits there, so its later work sees
//!   the result with no host thread in between), the `Control` back.
//! - **The watchdog.** The progress thread then waits for that work, and
//!   raises the rank's abort word (a word of mapped host memory that every
//!   spin loop of the kernel reads) on `abort()`, on a failure the
//!   communicator hears of, and at the call's timeout; the kernel ends
//!   with `Aborted`, and the call returns the named error the host path
//!   would: the timeout naming the peer the kernel waited for, the peer's
//!   failure, the abort. A kernel that reports a fault (a frame with
//!   another tag or length) names the peer and the record. A kernel still
//!   running 10 s after its abort word was set is reported as such; the
//!   communicator is failed after any fault (the FIFO counts are out of
//!   step).

//!
//! The module: `setup` (the rounds of the first call, FIFO memory, the
//! GPU facts asked of the driver), `launch` (a call: plan, encode, launch,
//! watchdog, a kernel's report as the host path's error), `wire` (the
//! rounds' wire forms, the FIFO layout and connection table), `share`
//! (FIFO memory shared with ranks of other processes).

mod launch;
mod setup;
mod share;
mod wire;

use crate::error::{Error, Result};
use crate::plan::device::{Allowed, FifoGeometry};
use ferroccl_cuda::device::{DeviceBuf, DevicePtr, Engine, Event, Gate, PinnedBuf, Stream};
use ferroccl_cuda::error::CudaError;
use share::{PeerRegion, Share};
use std::time::Duration;

/// How long a kernel may go on after its abort word was set before the
/// call gives up on it.
const ABORT_GRACE: Duration = Duration::from_secs(10);
/// How often the watchdog looks at the communicator's state.
const WATCH_SLICE: Duration = Duration::from_millis(1);
/// Spins of a kernel's wait between reads of the abort word.
const SPIN_CHECK: u32 = 1 << 10;
/// The wire version of the rounds.
const ROUND_VERSION: u8 = 2;

/// Counters sit 128 bytes apart: a writer on one GPU and a poller on
/// another never share a line.
const WORD_GAP: u64 = 128;

/// A communicator's executor on one engine, once chosen and set up.
pub(super) struct Ready {
    stream: Stream,
    abort: Gate,
    abort_addr: u64,
    conns: DeviceBuf,
    /// What the connection table is uploaded through (made before the
    /// set-up's rounds).
    conns_pinned: PinnedBuf,
    ctl: DeviceBuf,
    ctl_pinned: PinnedBuf,
    /// The program image's device memory (stream-ordered) and its size.
    image: (DeviceBuf, usize),
    /// What images are uploaded through, [`IMAGE_PIECE`] bytes.
    image_pinned: PinnedBuf,
    /// Recorded after each piece of an image is sent.
    image_sent: Event,
    end: Event,
    allowed: Allowed,
    geometry: FifoGeometry,
    /// Channels set up (FIFOs and `Conn` entries for each).
    channels: usize,
    /// Set after a kernel fault: later calls are refused (the
    /// communicator has failed anyway).
    faulted: bool,
    /// This rank's FIFO memory where peers in other processes map it.
    share: Option<Share>,
    /// Those peers' FIFO memory, mapped here.
    peers: Vec<PeerRegion>,
}

/// What a communicator's device path on one engine is.
pub(super) enum ExecPath {
    /// Staged, for this reason (at INFO once, and on each call's
    /// `plan:` line).
    Staged(String),
    /// The executor.
    Ready(Box<Ready>),
}

/// Copy `bytes` to the start of `dst` through a pinned buffer, and wait.
fn upload(engine: &dyn Engine, stream: Stream, dst: DeviceBuf, bytes: &[u8]) -> Result<()> {
    let err = |e: CudaError| Error::Io(format!("device executor set-up: {e}"));
    if bytes.is_empty() {
        return Ok(());
    }
    let pinned = engine.alloc_pinned(bytes.len()).map_err(err)?;
    let done = upload_through(engine, stream, dst, pinned, bytes);
    engine.free_pinned(pinned);
    done
}

/// Copy `bytes` to the start of `dst` through `pinned` (at least as
/// large), and wait for the copy alone.
fn upload_through(
    engine: &dyn Engine,
    stream: Stream,
    dst: DeviceBuf,
    pinned: PinnedBuf,
    bytes: &[u8],
) -> Result<()> {
    let err = |e: CudaError| Error::Io(format!("device executor set-up: {e}"));
    (|| {
        engine.with_pinned(pinned, &mut |p| p[..bytes.len()].copy_from_slice(bytes))?;
        engine.h2d(stream, DevicePtr::new(dst), pinned, 0, bytes.len())?;
        let ev = engine.event()?;
        engine.record(ev, stream)?;
        let waited = engine.host_wait(ev, Duration::from_secs(60));
        engine.free_event(ev);
        waited
    })()
    .map_err(err)
}

/// Bytes of program image device memory made at set-up.
const IMAGE_START: usize = 4096;
/// Bytes of the pinned buffer images are uploaded through, a piece at a
/// time.
const IMAGE_PIECE: usize = 64 << 10;
