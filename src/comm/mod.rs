//! The communicator: the public API. Every collective method describes its
//! call with one `coll::CollCall` and funnels it through
//! `Communicator::collective` (plan, order, execute, finish); the rest of
//! the communicator lives beside this file, one concern a file:
//!
//! - `setup`: joining a job, building a communicator over the rendezvous,
//!   split, the tuner's calibration, and tear-down;
//! - `order`: tickets and sequence numbers (calls run in issue order on
//!   every rank), blocking and async calls;
//! - `execute`: a call's plan (the planner's algorithm and route, the plan
//!   cache) and carrying it out through `exec`;
//! - `shared`: memory every rank of a host maps (control pages, windows)
//!   and the probe of cross-memory attach;
//! - `failure`: what a failed call does to the communicator, blame, the
//!   spreading of failures and mismatches to every rank;
//! - `shrink`: the survivors' new communicator after a failure;
//! - `device`: calls on device buffers (the public entry points are in
//!   `crate::cuda`): the gate the caller's stream waits at, scratch, the
//!   issue onto the progress thread;
//! - `device_exec`: the device executor's launcher: whether a
//!   communicator's device calls run GPU to GPU or stay staged (`setup`),
//!   each call's program, launch and watchdog (`launch`), the rounds' wire
//!   forms (`wire`), and the FIFO memory shared with ranks of other
//!   processes (`share`: cuda-ipc handles, descriptors over Unix sockets).
//!
//! Host data never passes through a socket or shared memory here: the
//! transports and `exec` move it. The one socket of its own is
//! `device_exec::share`'s Unix socket, which carries descriptors, not data.

pub(crate) mod device;
mod device_exec;
mod execute;
mod failure;
mod order;
mod plans;
mod routes;
mod setup;
mod shared;
mod shrink;

pub use device::DeviceWork;
pub(crate) use setup::Rendezvous;

use crate::bootstrap::MismatchReport;
use crate::coll::{self, CollCall, CollKind};
use crate::config::Config;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::{Io, Links};
use crate::plan::tune::LinkModel;
use crate::window::{Control, Windows};
use ferroccl_transport::{AbortHandle, ConnectionCloser};
use order::{Job, Turns};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use ferroccl_transport::lock;

/// A group of ranks that run collectives together.
///
/// Calls on one communicator run in the order they were issued, on every
/// rank; blocking calls are async calls followed by `wait`. After any failure
/// (a dead peer, a timeout, a mismatch, `abort()`), every later call returns
/// the error that ended it.
pub struct Communicator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .field("comm_id", &self.inner.comm_id)
            .finish()
    }
}

struct Inner {
    rank: usize,
    size: usize,
    /// Rank in the job of each rank of this communicator.
    global_ranks: Vec<usize>,
    comm_id: u64,
    config: Config,
    /// `config.chunk_bytes()`, worked out once: every call's route
    /// reads it, and it divides.
    chunk_bytes: usize,
    rendezvous: Arc<Rendezvous>,
    links: Mutex<Links>,
    turns: Turns,
    abort: Arc<AbortHandle>,
    failure: Mutex<Option<Error>>,
    /// `failure` is set: lets every call check it without the lock.
    failed: AtomicBool,
    /// A mismatch another rank reported, as (reporter, peer, report) in
    /// this communicator's ranks: calls that end on it compare themselves
    /// with both sides.
    mismatch_heard: Mutex<Option<(usize, usize, MismatchReport)>>,
    /// Reports heard while `mismatch_heard` held a refusal of a call this
    /// rank had not reached (see `Inner::hear`).
    heard_later: Mutex<std::collections::VecDeque<(usize, usize, MismatchReport)>>,
    /// Reports that a rank made a call another refused, for positions this
    /// rank has not reached (see `Inner::heard_went`), as (reporter, report).
    went_later: Mutex<std::collections::VecDeque<(usize, MismatchReport)>>,
    /// `mismatch_heard` is set (SeqCst, against `issued`: see the watcher).
    mismatch_flag: AtomicBool,
    /// Positions of the last few calls this rank refused for a bad
    /// argument: another rank's refusal of the same call is no news.
    refused_here: Mutex<std::collections::VecDeque<u64>>,
    closers: Arc<Mutex<Vec<Arc<dyn ConnectionCloser>>>>,
    progress: Mutex<Option<crossbeam_channel::Sender<Job>>>,
    progress_thread: Mutex<Option<JoinHandle<()>>>,
    watcher_stop: Mutex<Option<crossbeam_channel::Sender<()>>>,
    /// The thread that hears the job's failure reports (joined on drop).
    watcher_thread: Mutex<Option<JoinHandle<()>>>,
    splits: AtomicU64,
    /// The communicators split from this one on this rank (weakly: they
    /// live on their own), for `abort_with_splits`.
    children: Mutex<Vec<std::sync::Weak<Inner>>>,
    /// Shrinks asked of this communicator so far: numbers them alike on
    /// every survivor.
    shrinks: AtomicU64,
    /// Ranks of this communicator known to have failed: reported gone by
    /// the job, or blamed for this communicator's failure (what
    /// `Communicator::shrink` leaves out besides the ranks it is given).
    known_failed: Mutex<std::collections::BTreeSet<usize>>,
    /// Sequence number of the last collective issued here: peers whose call
    /// timed out ask it (through the store) to find the rank that never
    /// called.
    issued: Arc<AtomicU64>,
    /// The user algorithms that run every allreduce, allgather or
    /// reduce-scatter (one per collective, where given), checked for this
    /// rank count at creation (`Config::checked_user_algorithms`).
    user: crate::algo::user::Installed,
    /// The tuner's constants, agreed by every rank at creation.
    model: Mutex<LinkModel>,
    /// The tuner's model of a link inside a host (the hierarchical
    /// algorithm's inner steps), agreed by every rank at creation.
    intra_model: Mutex<LinkModel>,
    /// Which ranks share a host (the hierarchical algorithm's map).
    hosts: Arc<crate::algo::hier::HostMap>,
    /// (collective, size class) pairs whose choice was already logged.
    tuned: Mutex<std::collections::HashSet<(u8, u32)>>,
    /// Recent host plans (`plans`; see `Communicator::plan`).
    plans: plans::Plans,
    /// This communicator's gates, one per device engine it has run calls
    /// on (`device`).
    gates: Mutex<Vec<device::DeviceGate>>,
    /// The device path of each engine this communicator's collectives
    /// ran on (`device_exec`): the executor, set up, or staging.
    exec_paths: Mutex<
        Vec<(
            Arc<dyn ferroccl_cuda::device::Engine>,
            device_exec::ExecPath,
        )>,
    >,
    /// Device path set-ups so far: numbers their rounds' keys.
    exec_setups: AtomicU64,
    /// Shared windows and the control pages that go with them.
    windows: Arc<crate::bias::BiasedLock<Windows>>,
    /// Collectives that ran directly between windows.
    direct_calls: AtomicU64,
    /// The facts of host routes that change after creation (the
    /// calibrated ranges of cross-memory attach, recursive doubling's
    /// limit, CPUs shared), and the routes of recent calls.
    routing: routes::Routing,
    /// The control pages (set once, read without a lock), made at creation
    /// where every rank is on one host (or with the first window under
    /// FERROCCL_CHECKIN=0): from then on every collective checks in there.
    control: std::sync::OnceLock<Arc<Control>>,
    /// Where memory every rank of this host maps is made (windows, control
    /// pages): `transports::shared_memory`, None where FERROCCL_TRANSPORT
    /// forbids it.
    shared: Option<Arc<dyn ferroccl_transport::SharedMemory>>,
    /// `abort`'s signal, for waits that only look at it.
    abort_signal: ferroccl_transport::AbortSignal,
}

/// The result of an async call: `wait()` blocks until it is done.
#[must_use = "an async call's errors are only seen through wait()"]
pub struct Work<T> {
    result: crossbeam_channel::Receiver<Result<T>>,
    during: String,
}

impl<T> std::fmt::Debug for Work<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Work")
            .field("during", &self.during)
            .finish()
    }
}

impl<T> Work<T> {
    /// Wait for the call to finish and return its buffer. Bounded: every wait
    /// inside the call is bounded by the communicator's timeout.
    pub fn wait(self) -> Result<T> {
        self.result.recv().unwrap_or_else(|_| {
            Err(Error::Aborted(Some(format!(
                "{}: the progress thread ended before the call finished",
                self.during
            ))))
        })
    }

    /// Whether the call has finished (its result can be taken without waiting).
    pub fn is_complete(&self) -> bool {
        !self.result.is_empty()
    }
}

/// What a call needs besides its buffers.
struct CallSpec {
    kind: CollKind,
    dtype: crate::element::DataType,
    op: Option<ReduceOp>,
    count: usize,
    root: Option<usize>,
    /// `Some((peer, sending))` for point-to-point.
    p2p: Option<(usize, bool)>,
    /// One of the library's own calls (numbered apart from the user's).
    internal: bool,
    /// This rank refused the call (a bad argument): it only takes its place.
    refused: bool,
}

impl Communicator {
    /// This rank's index, `0..size()`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The settings this communicator runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The transport each peer is connected over (`None`: not connected yet,
    /// or this rank itself).
    pub fn transports(&self) -> Vec<Option<&'static str>> {
        lock(&self.inner.links).transports().to_vec()
    }

    /// The error that ended this communicator, if one did; never blocks.
    pub fn async_error(&self) -> Option<Error> {
        if let Some(failure) = lock(&self.inner.failure).clone() {
            return Some(failure);
        }
        // A mismatch reported for a call this rank has not reached yet (a
        // refusal is not yet: this rank may refuse that call too).
        let (reporter, peer, m) = lock(&self.inner.mismatch_heard).clone()?;
        if m.refused {
            return None;
        }
        Some(self.inner.mismatch_seen_here(reporter, peer, &m, None))
    }

    /// Out-of-place allreduce: `recv[i] = op over ranks of send[i]`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        let call = CollCall {
            op: Some(op),
            ..CollCall::new(CollKind::AllReduce, send.len(), send.len(), recv.len())
        };
        self.collective(&call, Buffers::OutOfPlace { send, recv })
    }

    /// In-place allreduce.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let call = CollCall::all_reduce_in_place(buf.len(), op);
        self.collective(&call, Buffers::InPlace(buf))
    }

    /// Allreduce on an owned buffer (a `Vec<T>`, a [`Window<T>`], any
    /// owner of a `[T]`), in place, without blocking: the call is queued in
    /// order and `wait()` returns the buffer.
    ///
    /// [`Window<T>`]: crate::Window
    pub fn all_reduce_async<T, B>(&self, buf: B, op: ReduceOp) -> Result<Work<B>>
    where
        T: Element,
        B: std::ops::DerefMut<Target = [T]> + Send + 'static,
    {
        let call = CollCall::all_reduce_in_place(buf.len(), op);
        self.in_place_async(call, buf)
    }

    /// In-place reduce-scatter on an owned buffer of `count * size`
    /// elements, without blocking: the call is queued in order and `wait()`
    /// returns the buffer, whose block `rank` holds the result (the other
    /// blocks are left as scratch).
    pub fn reduce_scatter_async<T, B>(&self, buf: B, op: ReduceOp) -> Result<Work<B>>
    where
        T: Element,
        B: std::ops::DerefMut<Target = [T]> + Send + 'static,
    {
        let n = buf.len();
        let call = CollCall {
            op: Some(op),
            in_place: true,
            ..CollCall::new(CollKind::ReduceScatter, n / self.inner.size, n, n)
        };
        self.in_place_async(call, buf)
    }

    /// In-place allgather on an owned buffer of `count * size` elements
    /// whose block `rank` holds this rank's input, without blocking: the
    /// call is queued in order and `wait()` returns the buffer, every block
    /// filled.
    pub fn all_gather_async<T, B>(&self, buf: B) -> Result<Work<B>>
    where
        T: Element,
        B: std::ops::DerefMut<Target = [T]> + Send + 'static,
    {
        let n = buf.len();
        let call = CollCall {
            in_place: true,
            ..CollCall::new(CollKind::AllGather, n / self.inner.size, n, n)
        };
        self.in_place_async(call, buf)
    }

    /// An in-place call on an owned buffer, queued: the async twin of
    /// `collective` with `Buffers::InPlace`.
    fn in_place_async<T, B>(&self, call: CollCall, mut buf: B) -> Result<Work<B>>
    where
        T: Element,
        B: std::ops::DerefMut<Target = [T]> + Send + 'static,
    {
        let plan = self.plan::<T>(&call)?;
        let (rank, size) = (self.inner.rank, self.inner.size);
        self.run_async(self.spec::<T>(&call), move |inner, issued| {
            if plan.scratch_output > 0 {
                let mut scratch = vec![T::zeroed(); plan.scratch_output];
                inner.execute(&plan, Io::out_of_place(&buf, &mut scratch), issued)?;
            } else {
                let io = Io::in_place(&mut buf, plan.input_base, plan.output_base);
                inner.execute(&plan, io, issued)?;
            }
            coll::finish(&call, &plan, rank, size, &mut buf);
            Ok(buf)
        })
    }

    /// Reduce-scatter: `send.len() == recv.len() * size`; rank r's `recv`
    /// gets the reduction of block r of every rank's `send`.
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        let call = CollCall {
            op: Some(op),
            ..CollCall::new(CollKind::ReduceScatter, recv.len(), send.len(), recv.len())
        };
        self.collective(&call, Buffers::OutOfPlace { send, recv })
    }

    /// In-place reduce-scatter on `count * size` elements: block `rank` of
    /// `buf` gets the result; the other blocks are left as scratch.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let n = buf.len();
        let call = CollCall {
            op: Some(op),
            in_place: true,
            ..CollCall::new(CollKind::ReduceScatter, n / self.inner.size, n, n)
        };
        self.collective(&call, Buffers::InPlace(buf))
    }

    /// Allgather: `recv.len() == send.len() * size`; block r of `recv` gets
    /// rank r's `send`.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let call = CollCall::new(CollKind::AllGather, send.len(), send.len(), recv.len());
        self.collective(&call, Buffers::OutOfPlace { send, recv })
    }

    /// In-place allgather on `count * size` elements whose block `rank`
    /// holds this rank's input.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let n = buf.len();
        let call = CollCall {
            in_place: true,
            ..CollCall::new(CollKind::AllGather, n / self.inner.size, n, n)
        };
        self.collective(&call, Buffers::InPlace(buf))
    }

    /// Broadcast `buf` from `root` to every rank.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let n = buf.len();
        let call = CollCall {
            root: Some(root),
            in_place: true,
            ..CollCall::new(CollKind::Broadcast, n, n, n)
        };
        self.collective(&call, Buffers::InPlace(buf))
    }

    /// Reduce to `root`: on the root `recv` (of `send.len()`) gets the
    /// reduction; elsewhere `recv` is not touched and may be empty.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let call = CollCall {
            op: Some(op),
            root: Some(root),
            ..CollCall::new(CollKind::Reduce, send.len(), send.len(), recv.len())
        };
        self.collective(&call, Buffers::OutOfPlace { send, recv })
    }

    /// In-place reduce: the root's `buf` gets the reduction; other ranks'
    /// buffers are inputs only (left unchanged).
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let n = buf.len();
        let call = CollCall {
            op: Some(op),
            root: Some(root),
            in_place: true,
            ..CollCall::new(CollKind::Reduce, n, n, n)
        };
        self.collective(&call, Buffers::InPlace(buf))
    }

    /// Send `buf` to `peer` (which must call `recv` with the same length).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        let call = CollCall::p2p(buf.len(), self.inner.rank, peer, true);
        self.collective(
            &call,
            Buffers::OutOfPlace {
                send: buf,
                recv: &mut [],
            },
        )
    }

    /// Receive `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        let call = CollCall::p2p(buf.len(), self.inner.rank, peer, false);
        self.collective(
            &call,
            Buffers::OutOfPlace {
                send: &[],
                recv: buf,
            },
        )
    }

    /// All-to-all: `send` and `recv` hold `size` blocks; block j of `send`
    /// goes to rank j, block r of `recv` comes from rank r.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let call = CollCall::new(CollKind::AllToAll, send.len(), send.len(), recv.len());
        self.collective(&call, Buffers::OutOfPlace { send, recv })
    }

    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        let call = CollCall {
            in_place: true,
            ..CollCall::new(CollKind::Barrier, 0, 0, 0)
        };
        self.collective::<u8>(&call, Buffers::InPlace(&mut []))
    }

    /// End every in-flight and queued call of this communicator with
    /// `Error::Aborted`, from any thread, and close its connections. The
    /// communicator stays unusable afterwards; the other communicators of
    /// this rank (its parent, its splits) go on, and so do those of the
    /// other ranks, which hear of the abort in this communicator only.
    pub fn abort(&self) {
        self.inner
            .fail(Error::Aborted(Some(failure::ABORT_SAYS.into())), None, true);
    }

    /// [`abort`](Communicator::abort) this communicator and every
    /// communicator split from it on this rank (and split from those),
    /// still alive. `abort` alone ends only this one: its splits go on.
    pub fn abort_with_splits(&self) {
        let mut todo = vec![self.inner.clone()];
        while let Some(inner) = todo.pop() {
            inner.fail(Error::Aborted(Some(failure::ABORT_SAYS.into())), None, true);
            todo.extend(lock(&inner.children).iter().filter_map(|c| c.upgrade()));
        }
    }

    /// Every collective: plan `call` (arguments checked before anything
    /// else happens), wait for its turn, run it on `bufs`, and finish it
    /// (Avg's division on the ranks that hold a result).
    ///
    /// Inlined into every public collective, so that each gets a copy
    /// with its own `CollCall` constants folded (which buffers, which
    /// kind): measured on 2-rank allreduces of 8 B-1 KiB, about 2-3% of the
    /// call (docs/performance-log.md, restructuring check).
    #[inline(always)]
    fn collective<T: Element>(&self, call: &CollCall, bufs: Buffers<'_, T>) -> Result<()> {
        let planned = self.plan_here::<T>(call)?;
        // Dereferenced once (each use matched on where it came from).
        let plan: &coll::Plan = &planned;
        let (rank, size) = (self.inner.rank, self.inner.size);
        let spec = self.spec::<T>(call);
        match bufs {
            Buffers::OutOfPlace { send, recv } => {
                if plan.scratch_output > 0 {
                    // The schedule keeps partial results in an output the
                    // caller did not give (a tree reduce's inner ranks).
                    let mut scratch = vec![T::zeroed(); plan.scratch_output];
                    self.run_blocking(spec, plan, Io::out_of_place(send, &mut scratch))?;
                } else {
                    self.run_blocking(spec, plan, Io::out_of_place(send, &mut *recv))?;
                }
                coll::finish(call, plan, rank, size, recv);
            }
            Buffers::InPlace(buf) => {
                if plan.scratch_output > 0 {
                    // In place the caller's buffer must stay unchanged
                    // where it is only an input.
                    let mut scratch = vec![T::zeroed(); plan.scratch_output];
                    self.run_blocking(spec, plan, Io::out_of_place(&*buf, &mut scratch))?;
                } else {
                    let io = Io::in_place(&mut *buf, plan.input_base, plan.output_base);
                    self.run_blocking(spec, plan, io)?;
                }
                coll::finish(call, plan, rank, size, buf);
            }
        }
        Ok(())
    }
}

/// A blocking call's buffers.
enum Buffers<'a, T> {
    /// Separate send and receive buffers.
    OutOfPlace { send: &'a [T], recv: &'a mut [T] },
    /// One buffer, input and output.
    InPlace(&'a mut [T]),
}
