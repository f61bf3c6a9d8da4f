//! The communicator: the public API, call ordering, async work, failure
//! handling and split. It checks arguments through `coll`, runs schedules
//! through `exec`, and never touches sockets itself.

use crate::algo::Algorithm;
use crate::bootstrap::{self, FailureReport, MismatchReport, Store};
use crate::coll::{self, CollKind, Geometry, Plan};
use crate::config::Config;
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::{self, Call, Connector, Io, Links, MemberWatch};
use crate::fingerprint::NO_ROOT;
use crate::tune::{self, LinkModel};
use crate::window::{self, Control, Window, WindowMaps, Windows};
use ferroccl_shm::Region;
use ferroccl_transport::{AbortHandle, ConnectionCloser, Fingerprint, ListenConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::Instant;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type Job = Box<dyn FnOnce() + Send>;
/// Builds an async call's job once its ticket and call are known.
type MakeJob<'a> = Box<dyn FnOnce(u64, &Call) -> Job + 'a>;

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

/// Owns the rendezvous of the job: the store client, and on the rank that
/// hosts it the server. Shared by a communicator and every communicator split
/// from it; the last one to go says goodbye so the job does not report this
/// rank as failed.
pub(crate) struct Rendezvous {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) _server: Option<bootstrap::TcpStoreServer>,
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        self.store.goodbye();
    }
}

struct Turns {
    /// Next ticket to hand out (under this lock, so that tickets and the
    /// progress queue agree on order).
    issued: Mutex<IssueState>,
    /// Tickets served so far: the caller whose ticket is next goes without
    /// taking a lock (a blocking call on an idle communicator always is).
    served: AtomicU64,
    /// Callers asleep on `turn` (so that ending a turn nobody waits for
    /// takes no lock and makes no wake-up system call).
    waiting: AtomicUsize,
    /// What `turn` sleeps on; it guards no data.
    sleep: Mutex<()>,
    turn: Condvar,
}

#[derive(Default)]
struct IssueState {
    next_ticket: u64,
    coll_seq: u64,
    /// Per (peer, sending) sequence numbers of point-to-point calls.
    p2p_seq: HashMap<(usize, bool), u64>,
    /// The last few collective calls issued, newest last: what this rank
    /// called at a sequence number that another rank reports a mismatch on.
    recent: std::collections::VecDeque<Fingerprint>,
}

/// How long the rank that hosts the rendezvous waits after it reported a
/// failure, before it lets its own calls end (see `Inner::fail_with`).
const HOST_LINGER: std::time::Duration = std::time::Duration::from_millis(100);

/// How many issued collective calls [`IssueState::recent`] keeps.
const RECENT_CALLS: usize = 16;

struct Inner {
    rank: usize,
    size: usize,
    /// Rank in the job of each rank of this communicator.
    global_ranks: Vec<usize>,
    comm_id: u64,
    config: Config,
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
    /// `mismatch_heard` is set (SeqCst, against `issued`: see the watcher).
    mismatch_flag: AtomicBool,
    closers: Arc<Mutex<Vec<Arc<dyn ConnectionCloser>>>>,
    progress: Mutex<Option<crossbeam_channel::Sender<Job>>>,
    progress_thread: Mutex<Option<JoinHandle<()>>>,
    watcher_stop: Mutex<Option<crossbeam_channel::Sender<()>>>,
    splits: AtomicU64,
    /// Sequence number of the last collective issued here: peers whose call
    /// timed out ask it (through the store) to find the rank that never
    /// called.
    issued: Arc<AtomicU64>,
    /// The tuner's constants, agreed by every rank at creation.
    model: Mutex<LinkModel>,
    /// (collective, size class) pairs whose choice was already logged.
    tuned: Mutex<std::collections::HashSet<(u8, u32)>>,
    /// Recent plans by (collective, count, element size); see
    /// `Communicator::all_reduce_plan`.
    /// A few entries scanned in order: cheaper than hashing the key.
    plans: Mutex<Vec<(PlanKey, Arc<Plan>)>>,
    /// Shared windows and the control pages that go with them.
    windows: Mutex<Windows>,
    /// Collectives that ran directly between windows.
    direct_calls: AtomicU64,
    /// The control pages (set once, read without a lock), made at creation
    /// where every rank is on one host (or with the first window under
    /// FERROCCL_CHECKIN=0): from then on every collective checks in there.
    control: std::sync::OnceLock<Arc<Control>>,
    /// `abort`'s signal, for waits that only look at it.
    abort_signal: ferroccl_transport::AbortSignal,
}

/// (collective, count, element size).
type PlanKey = (u8, usize, usize);

/// Plans kept per communicator; the oldest goes first.
const PLAN_CACHE_ENTRIES: usize = 32;

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
}

impl Communicator {
    /// Join a job with explicit settings: rank 0 hosts the rendezvous at
    /// `config.master_addr:master_port`, every rank connects to it.
    pub fn init(config: Config) -> Result<Communicator> {
        crate::logging::init();
        config.validate()?;
        let deadline = Instant::now() + config.timeout;
        let addr = crate::config::resolve(&config.master_addr, config.master_port)?;
        let server = if config.rank == 0 {
            let bind = std::net::SocketAddr::new(
                if addr.ip().is_loopback() {
                    addr.ip()
                } else {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                },
                addr.port(),
            );
            Some(bootstrap::TcpStoreServer::start(
                bind,
                config.token,
                config.size,
            )?)
        } else {
            None
        };
        let store = bootstrap::TcpStore::connect_with_heartbeat(
            addr,
            config.token,
            config.rank,
            deadline,
            config.heartbeat_interval(),
        )?;
        let rendezvous = Arc::new(Rendezvous {
            store: Arc::new(store),
            _server: server,
        });
        let global: Vec<usize> = (0..config.size).collect();
        Self::build(config, rendezvous, global, 1)
    }

    /// Join the job described by the launcher's environment: torchrun or
    /// ferroccl-run (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI
    /// (OMPI_COMM_WORLD_*) or Slurm (SLURM_PROCID, ...). FERROCCL_* variables
    /// tune it (see [`Config::from_env_overrides`]).
    pub fn from_env() -> Result<Communicator> {
        let info = bootstrap::env::detect_process_env()?;
        let config = Config::from_launch(&info)?;
        if config.size > 1 && config.transport.as_deref() == Some("mem") {
            // It would wait out the timeout for peers it cannot reach.
            return Err(Error::Env(
                "FERROCCL_TRANSPORT=mem joins only ranks that are threads of one process; \
                 ranks started by a launcher are processes (use shm or tcp, or leave it unset)"
                    .into(),
            ));
        }
        Self::init(config)
    }

    /// Build a communicator over an existing rendezvous (used by `init`,
    /// `split` and the in-process test harness).
    pub(crate) fn build(
        config: Config,
        rendezvous: Arc<Rendezvous>,
        global_ranks: Vec<usize>,
        comm_id: u64,
    ) -> Result<Communicator> {
        crate::logging::init();
        let (rank, size) = (config.rank, config.size);
        // Shared with the set-up watch thread below.
        let abort = Arc::new(AbortHandle::new());
        let transports = crate::transports::select(&config)?;
        let listen = ListenConfig {
            rank,
            size,
            token: config.token,
            comm_id,
            chunk_bytes: config.chunk_bytes(),
            steps: config.steps,
            ifname: config.socket_ifname.clone(),
            bind_addr: None,
            nsocks: config.nsocks_per_peer,
        };
        // A member that dies during set-up is named, not waited for: the
        // rendezvous waits consult `watch`, and a thread fires this
        // communicator's abort (ending transport waits) when it hears.
        let watch = Arc::new(MemberWatch::new(
            &*rendezvous.store,
            rank,
            global_ranks.clone(),
        ));
        let (setup_done, setup_running) = crossbeam_channel::bounded::<()>(0);
        {
            let (watch, abort) = (watch.clone(), abort.clone());
            std::thread::Builder::new()
                .name(format!("ferroccl-setup-{rank}"))
                .spawn(move || loop {
                    match setup_running.recv_timeout(std::time::Duration::from_millis(50)) {
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                            if watch.failed().is_some() {
                                abort.abort();
                                return;
                            }
                        }
                        _ => return,
                    }
                })?;
        }
        let closers = Arc::new(Mutex::new(Vec::new()));
        let set_up = || -> Result<Links> {
            let connector = Connector::new(
                &listen,
                rendezvous.store.clone(),
                watch.clone(),
                transports,
                crate::topo::host_info(),
                &abort.signal(),
                config.timeout,
            )?;
            let mut links = Links::new(connector, closers.clone());
            // Ring neighbours now, so that a broken network shows at
            // start-up; other peers when first needed.
            if size > 1 {
                let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
                // The lower rank connects and the higher accepts; order the
                // two set-ups so no rank accepts while its partner also
                // accepts.
                let mut order = [next, prev];
                order.sort_unstable();
                for peer in order {
                    links.ensure(peer)?;
                }
            }
            Ok(links)
        };
        let links = set_up();
        drop(setup_done);
        let links = links.map_err(|err| {
            watch
                .error_within("communicator set-up", exec::WAIT_SLICE)
                .unwrap_or(err)
        })?;
        let (job_tx, job_rx) = crossbeam_channel::unbounded::<Job>();
        let progress_thread = std::thread::Builder::new()
            .name(format!("ferroccl-progress-{rank}"))
            .spawn(move || {
                for job in job_rx {
                    job();
                }
            })?;
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let abort_signal = abort.signal();
        let inner = Arc::new(Inner {
            rank,
            size,
            global_ranks,
            comm_id,
            config,
            rendezvous,
            links: Mutex::new(links),
            turns: Turns {
                issued: Mutex::new(IssueState::default()),
                served: AtomicU64::new(0),
                waiting: AtomicUsize::new(0),
                sleep: Mutex::new(()),
                turn: Condvar::new(),
            },
            abort,
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            mismatch_heard: Mutex::new(None),
            mismatch_flag: AtomicBool::new(false),
            closers,
            progress: Mutex::new(Some(job_tx)),
            progress_thread: Mutex::new(Some(progress_thread)),
            watcher_stop: Mutex::new(Some(stop_tx)),
            splits: AtomicU64::new(0),
            issued: Arc::new(AtomicU64::new(0)),
            model: Mutex::new(LinkModel::DEFAULT),
            tuned: Mutex::new(std::collections::HashSet::new()),
            plans: Mutex::new(Vec::new()),
            windows: Mutex::new(Windows::default()),
            direct_calls: AtomicU64::new(0),
            control: std::sync::OnceLock::new(),
            abort_signal,
        });
        if let Some(&global) = inner.global_ranks.get(rank) {
            inner.rendezvous.store.register_progress(
                comm_id,
                global,
                Arc::downgrade(&inner.issued),
            );
        }
        spawn_watcher(&inner, stop_rx)?;
        let comm = Communicator { inner };
        if comm.inner.config.calibrate && comm.inner.size > 1 {
            comm.calibrate()?;
        }
        // After calibration: its calls restart the numbering, which a
        // check-in must never see go backwards.
        if comm.inner.config.checkin && comm.create_control()? {
            comm.restart_numbering();
        }
        Ok(comm)
    }

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
        // A mismatch reported for a call this rank has not reached yet.
        let (reporter, peer, m) = lock(&self.inner.mismatch_heard).clone()?;
        Some(self.inner.mismatch_seen_here(reporter, peer, &m, None))
    }

    /// Out-of-place allreduce: `recv[i] = op over ranks of send[i]`.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        if send.len() != recv.len() {
            // Let the plan builder state the error.
            let (algorithm, geometry) = self.pick::<T>(CollKind::AllReduce, send.len());
            coll::all_reduce(geometry, send.len(), recv.len(), algorithm)?;
        }
        let plan = self.all_reduce_plan::<T>(send.len())?;
        self.run_blocking(
            self.spec::<T>(CollKind::AllReduce, Some(op), send.len(), None),
            &plan,
            Io::OutOfPlace {
                input: send,
                output: &mut *recv,
            },
        )?;
        self.finish_avg(op, recv);
        Ok(())
    }

    /// In-place allreduce.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let plan = self.all_reduce_plan::<T>(buf.len())?;
        let spec = self.spec::<T>(CollKind::AllReduce, Some(op), buf.len(), None);
        self.run_blocking(spec, &plan, in_place(&mut *buf, 0, 0))?;
        self.finish_avg(op, buf);
        Ok(())
    }

    /// Allreduce on an owned buffer (a `Vec<T>`, a [`Window<T>`], any
    /// owner of a `[T]`), in place, without blocking: the call is queued in
    /// order and `wait()` returns the buffer.
    pub fn all_reduce_async<T, B>(&self, mut buf: B, op: ReduceOp) -> Result<Work<B>>
    where
        T: Element,
        B: std::ops::DerefMut<Target = [T]> + Send + 'static,
    {
        let plan = self.all_reduce_plan::<T>(buf.len())?;
        let spec = self.spec::<T>(CollKind::AllReduce, Some(op), buf.len(), None);
        let size = self.inner.size;
        self.run_async(spec, move |inner, call| {
            inner.execute(&plan, in_place(&mut buf, 0, 0), call)?;
            finish_avg(op, &mut buf, size);
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
        let plan = coll::reduce_scatter(self.geometry::<T>(recv.len(), 1), send.len(), recv.len())?;
        let spec = self.spec::<T>(CollKind::ReduceScatter, Some(op), recv.len(), None);
        self.run_blocking(
            spec,
            &plan,
            Io::OutOfPlace {
                input: send,
                output: &mut *recv,
            },
        )?;
        self.finish_avg(op, recv);
        Ok(())
    }

    /// In-place reduce-scatter on `count * size` elements: block `rank` of
    /// `buf` gets the result; the other blocks are left as scratch.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let plan = coll::reduce_scatter_in_place(
            self.geometry::<T>(buf.len() / self.inner.size, 1),
            buf.len(),
        )?;
        let spec = self.spec::<T>(
            CollKind::ReduceScatter,
            Some(op),
            buf.len() / self.inner.size,
            None,
        );
        let (ib, ob) = (plan.input_base, plan.output_base);
        let count = buf.len() / self.inner.size;
        self.run_blocking(spec, &plan, in_place(&mut *buf, ib, ob))?;
        self.finish_avg(op, &mut buf[ob..ob + count]);
        Ok(())
    }

    /// Allgather: `recv.len() == send.len() * size`; block r of `recv` gets
    /// rank r's `send`.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let plan = coll::all_gather(self.geometry::<T>(send.len(), 1), send.len(), recv.len())?;
        let spec = self.spec::<T>(CollKind::AllGather, None, send.len(), None);
        self.run_blocking(
            spec,
            &plan,
            Io::OutOfPlace {
                input: send,
                output: recv,
            },
        )
    }

    /// In-place allgather on `count * size` elements whose block `rank`
    /// holds this rank's input.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let plan = coll::all_gather_in_place(
            self.geometry::<T>(buf.len() / self.inner.size, 1),
            buf.len(),
        )?;
        let spec = self.spec::<T>(CollKind::AllGather, None, buf.len() / self.inner.size, None);
        let (ib, ob) = (plan.input_base, plan.output_base);
        self.run_blocking(spec, &plan, in_place(buf, ib, ob))
    }

    /// Broadcast `buf` from `root` to every rank.
    pub fn broadcast<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        let (algorithm, geometry) = self.pick::<T>(CollKind::Broadcast, buf.len());

        let plan = coll::broadcast(geometry, buf.len(), root, algorithm)?;
        let spec = self.spec::<T>(CollKind::Broadcast, None, buf.len(), Some(root));
        self.run_blocking(spec, &plan, in_place(buf, 0, 0))
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
        let (algorithm, geometry) = self.pick::<T>(CollKind::Reduce, send.len());

        let plan = coll::reduce(geometry, send.len(), recv.len(), root, algorithm)?;
        let spec = self.spec::<T>(CollKind::Reduce, Some(op), send.len(), Some(root));
        let mut scratch = vec![T::zeroed(); plan.scratch_output];
        let output = if plan.scratch_output > 0 {
            &mut scratch[..]
        } else {
            &mut *recv
        };
        self.run_blocking(
            spec,
            &plan,
            Io::OutOfPlace {
                input: send,
                output,
            },
        )?;
        if self.inner.rank == root {
            self.finish_avg(op, recv);
        }
        Ok(())
    }

    /// In-place reduce: the root's `buf` gets the reduction; other ranks'
    /// buffers are inputs only (left unchanged).
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        let (algorithm, geometry) = self.pick::<T>(CollKind::Reduce, buf.len());

        let plan = coll::reduce(geometry, buf.len(), buf.len(), root, algorithm)?;
        let spec = self.spec::<T>(CollKind::Reduce, Some(op), buf.len(), Some(root));
        let mut scratch = vec![T::zeroed(); plan.scratch_output];
        let io = if plan.scratch_output > 0 {
            Io::OutOfPlace {
                input: &*buf,
                output: &mut scratch,
            }
        } else {
            in_place(&mut *buf, 0, 0)
        };
        self.run_blocking(spec, &plan, io)?;
        if self.inner.rank == root {
            self.finish_avg(op, buf);
        }
        Ok(())
    }

    /// Send `buf` to `peer` (which must call `recv` with the same length).
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        let plan = coll::point_to_point(self.geometry::<T>(buf.len(), 1), buf.len(), peer, true)?;
        let mut spec = self.spec::<T>(CollKind::SendRecv, None, buf.len(), Some(self.inner.rank));
        spec.p2p = Some((peer, true));
        self.run_blocking(
            spec,
            &plan,
            Io::OutOfPlace {
                input: buf,
                output: &mut [],
            },
        )
    }

    /// Receive `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        let plan = coll::point_to_point(self.geometry::<T>(buf.len(), 1), buf.len(), peer, false)?;
        let mut spec = self.spec::<T>(CollKind::SendRecv, None, buf.len(), Some(peer));
        spec.p2p = Some((peer, false));
        self.run_blocking(
            spec,
            &plan,
            Io::OutOfPlace {
                input: &[],
                output: buf,
            },
        )
    }

    /// All-to-all: `send` and `recv` hold `size` blocks; block j of `send`
    /// goes to rank j, block r of `recv` comes from rank r.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        let plan = coll::all_to_all(
            self.geometry::<T>(send.len() / self.inner.size, 1),
            send.len(),
            recv.len(),
        )?;
        let spec = self.spec::<T>(CollKind::AllToAll, None, send.len(), None);
        self.run_blocking(
            spec,
            &plan,
            Io::OutOfPlace {
                input: send,
                output: recv,
            },
        )
    }

    /// Allocate a window: `len` elements (zeroed) that every rank of this
    /// communicator maps, used as a slice (`&mut window[..]`). Collectives
    /// whose buffers lie in windows (the same window on every rank, at any
    /// offset) read and write the peers' buffers directly, copying each
    /// byte once instead of twice through slots: allreduce (input and
    /// output in windows), allgather (output in a window), reduce-scatter
    /// (input in a window). This is MPI's `MPI_Win_allocate_shared`, or
    /// NCCL's `ncclMemAlloc` plus a symmetric window registration.
    ///
    /// A collective: every rank calls it, in the same order as its other
    /// collectives; lengths may differ between ranks. Where the ranks
    /// cannot share memory (several hosts, FERROCCL_TRANSPORT=tcp, no
    /// writable shared-memory directory, one rank) every rank gets private
    /// memory instead ([`Window::is_shared`] is false) and collectives on
    /// it run as on any buffer. Once a communicator has a shared window,
    /// each of its collectives starts with a check-in on the shared control
    /// pages (about a cache-line exchange with every peer), not only the
    /// small ones.
    pub fn alloc_window<T: Element>(&self, len: usize) -> Result<Window<T>> {
        let inner = &self.inner;
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "alloc_window: {len} elements of {} do not fit in memory",
                T::DTYPE.name()
            ))
        })?;
        let id = {
            let mut windows = lock(&inner.windows);
            windows.created += 1;
            windows.created
        };
        // The control pages first (made at creation unless
        // FERROCCL_CHECKIN=0): without them a window is private memory.
        if !self.create_control()? {
            return Ok(Window::private(len));
        }
        let shared = self.share_regions(
            &format!("alloc_window: window {id}"),
            id,
            |dir, name| Region::create(dir, name, bytes),
            // This rank's own part is reached through the window itself.
            |r, dir, name| {
                (r != inner.rank)
                    .then(|| Region::open(dir, name))
                    .transpose()
            },
        )?;
        let Some((own, parts)) = shared else {
            return Ok(Window::private(len));
        };
        let maps = Arc::new(WindowMaps {
            id,
            own_addr: own.addr(),
            own_bytes: bytes,
            peers: Mutex::new(parts),
        });
        lock(&inner.windows).add(&maps);
        if let Some(control) = inner.control.get() {
            control.windows.store(true, Ordering::Relaxed);
        }
        tracing::debug!(
            rank = inner.rank,
            "alloc_window: window {id} of {bytes} bytes shared by {} ranks",
            inner.size
        );
        Ok(Window::shared(own, len, maps))
    }

    /// Whether the ranks can share memory at all: more than one, on one
    /// host, TCP not forced (the same answer on every rank).
    fn can_share(&self) -> bool {
        let inner = &self.inner;
        inner.size > 1
            && inner.config.transport.as_deref() != Some("tcp")
            && lock(&inner.links).one_host()
    }

    /// The set-up of memory every rank maps (a collective; control pages
    /// are region 0, windows count from 1): each rank creates its file of
    /// region `id` under FERROCCL_SHM_DIR with `create`, all agree that
    /// every rank could, each maps every rank's file with `open`, all agree
    /// again, and every rank removes every rank's file (the names are
    /// unique to the job, the communicator and the region), so that a rank
    /// killed after the agreement leaves nothing; after a failed set-up the
    /// survivors remove them too. `Ok(None)` where some rank could not
    /// (the caller falls back to private memory); an error only when the
    /// agreement itself fails.
    fn share_regions<P>(
        &self,
        what: &str,
        id: u64,
        create: impl FnOnce(&std::path::Path, &str) -> std::io::Result<Region>,
        open: impl Fn(usize, &std::path::Path, &str) -> std::io::Result<P>,
    ) -> Result<Option<(Region, Vec<P>)>> {
        let inner = &self.inner;
        let dir = inner.config.shm_dir();
        let name = |rank: usize| window::region_name(inner.config.token, inner.comm_id, id, rank);
        let sweep = || {
            for r in 0..inner.size {
                let _ = std::fs::remove_file(dir.join(name(r)));
            }
        };
        let created = create(&dir, &name(inner.rank));
        if let Err(e) = &created {
            tracing::info!(
                rank = inner.rank,
                "{what}: cannot create this rank's part in {}: {e}; private memory instead",
                dir.display()
            );
        }
        let all_created = match self.agree_all(created.is_ok()) {
            Ok(all) => all,
            Err(e) => {
                sweep();
                return Err(e);
            }
        };
        let own = match created {
            Ok(own) if all_created => own,
            Ok(own) => {
                let _ = own.unlink();
                return Ok(None);
            }
            Err(_) => return Ok(None),
        };
        let opened = (0..inner.size)
            .map(|r| open(r, &dir, &name(r)))
            .collect::<std::io::Result<Vec<P>>>();
        if let Err(e) = &opened {
            tracing::info!(
                rank = inner.rank,
                "{what}: cannot map a peer's part: {e}; private memory instead"
            );
        }
        let agreed = self.agree_all(opened.is_ok());
        // Every rank has mapped every part, or given up: the files go.
        sweep();
        if !agreed? {
            return Ok(None);
        }
        let parts = opened.map_err(|e| Error::Io(e.to_string()))?;
        Ok(Some((own, parts)))
    }

    /// Give every rank the control pages of all (a collective), unless it
    /// has them (`share_regions`, with a magic word and the process id on
    /// each page). `Ok(false)` where the ranks cannot share memory (several
    /// hosts, FERROCCL_TRANSPORT=tcp, one rank, a rank that could not
    /// create or map a page): the communicator then runs every call
    /// through slots.
    fn create_control(&self) -> Result<bool> {
        let inner = &self.inner;
        if inner.control.get().is_some() {
            return Ok(true);
        }
        if !self.can_share() {
            return Ok(false);
        }
        let create = |dir: &std::path::Path, name: &str| {
            let page = Region::create(dir, name, window::CONTROL_BYTES)?;
            let word = |i: usize| page.word(i).map_err(std::io::Error::other);
            word(exec::window::W_PID)?.store(u64::from(std::process::id()), Ordering::Relaxed);
            // Where word 0 lies in this process, for the peers' probe of
            // cross-memory attach (this mapping lives as long as the page).
            let magic_at = word(exec::window::W_MAGIC)? as *const AtomicU64 as u64;
            word(exec::window::W_PROBE)?.store(magic_at, Ordering::Relaxed);
            word(exec::window::W_MAGIC)?.store(exec::window::CONTROL_MAGIC, Ordering::Release);
            Ok(page)
        };
        let open = |_: usize, dir: &std::path::Path, name: &str| {
            let page = Region::open(dir, name)?;
            let magic = page.word(exec::window::W_MAGIC)?.load(Ordering::Acquire);
            if page.len() < window::CONTROL_BYTES || magic != exec::window::CONTROL_MAGIC {
                return Err(std::io::Error::other(format!(
                    "{} is not a control page of this version",
                    page.path().display()
                )));
            }
            Ok(page)
        };
        let Some((own, pages)) = self.share_regions("control pages", 0, create, open)? else {
            return Ok(false);
        };
        let pids: Vec<u32> = pages
            .iter()
            .map(|p| {
                p.word(exec::window::W_PID)
                    .map(|w| w.load(Ordering::Relaxed) as u32)
                    .unwrap_or(0)
            })
            .collect();
        let cma = self.probe_cma(&pages, &pids)?;
        let _ = inner.control.set(Arc::new(Control {
            pages,
            own: Mutex::new(own),
            pids,
            checkins: AtomicU64::new(0),
            windows: AtomicBool::new(false),
            cma,
        }));
        tracing::info!(
            rank = inner.rank,
            "control pages shared by {} ranks: collectives of at most {} bytes run inline in \
             the check-in",
            inner.size,
            exec::window::INLINE_BYTES
        );
        Ok(true)
    }

    /// Whether this rank can read every peer's memory by cross-memory
    /// attach (the probe word of each peer's control page, at the address
    /// the peer wrote there, must read back as the page's magic), agreed by
    /// all ranks (a collective): any rank that cannot, or has FERROCCL_CMA=0,
    /// turns it off for all.
    fn probe_cma(&self, pages: &[Region], pids: &[u32]) -> Result<bool> {
        let inner = &self.inner;
        let probe = |peer: usize| -> std::result::Result<(), String> {
            let at = pages[peer]
                .word(exec::window::W_PROBE)
                .map_err(|e| e.to_string())?
                .load(Ordering::Relaxed) as usize;
            let mut word = [0u8; 8];
            ferroccl_shm::read_process_memory(pids[peer], at, &mut word).map_err(|e| {
                format!("reading rank {peer}'s memory (process {}): {e}", pids[peer])
            })?;
            if u64::from_ne_bytes(word) != exec::window::CONTROL_MAGIC {
                return Err(format!("rank {peer}'s probe word read back wrong"));
            }
            Ok(())
        };
        let mine = if inner.config.cma {
            (0..inner.size)
                .filter(|&p| p != inner.rank)
                .try_for_each(probe)
        } else {
            Err("FERROCCL_CMA=0".into())
        };
        let all = self.agree_all(mine.is_ok())?;
        match (&mine, all) {
            (_, true) => tracing::info!(
                rank = inner.rank,
                "cross-memory attach between the {} ranks: allgathers and all-to-alls of \
                 ordinary buffers with blocks of at least {} bytes copy straight out of the \
                 peers' processes",
                inner.size,
                exec::window::CMA_MIN_BYTES
            ),
            (Err(why), false) => tracing::info!(
                rank = inner.rank,
                "no cross-memory attach ({why}): allgathers and all-to-alls of ordinary buffers \
                 go through slots"
            ),
            (Ok(()), false) => tracing::info!(
                rank = inner.rank,
                "no cross-memory attach (another rank cannot, or has FERROCCL_CMA=0): \
                 allgathers and all-to-alls of ordinary buffers go through slots"
            ),
        }
        Ok(all)
    }

    /// How many collectives of this communicator ran without the
    /// transport's slots: inline in the check-in on the shared control
    /// pages (input of at most 4 KiB, every rank on one host), directly
    /// between windows (see [`Communicator::alloc_window`]), or, for large
    /// allgathers and all-to-alls of ordinary buffers, straight out of the
    /// peers' processes by cross-memory attach (FERROCCL_CMA). To check
    /// that a program's buffers are where it thinks.
    pub fn direct_window_calls(&self) -> u64 {
        self.inner.direct_calls.load(Ordering::Relaxed)
    }

    /// Whether `ok` holds on every rank (a collective).
    fn agree_all(&self, ok: bool) -> Result<bool> {
        let mine = [u8::from(!ok)];
        let mut any_failed = [0u8];
        self.all_reduce(&mine, &mut any_failed, ReduceOp::Max)?;
        Ok(any_failed[0] == 0)
    }

    /// Wait until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        let plan = coll::barrier(self.geometry::<u8>(0, 1));
        let spec = self.spec::<u8>(CollKind::Barrier, None, 0, None);
        self.run_blocking::<u8>(spec, &plan, in_place(&mut [], 0, 0))
    }

    /// Split into sub-communicators: ranks passing the same `color` form one,
    /// ordered by `key` (ties by rank). A negative color takes no part and
    /// gets `None`. Every rank must call it (it is a collective).
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Communicator>> {
        let mine = [i64::from(color), i64::from(key)];
        let mut all = vec![0i64; 2 * self.inner.size];
        self.all_gather(&mine, &mut all)?;
        let split_index = self.inner.splits.fetch_add(1, Ordering::SeqCst);
        if color < 0 {
            return Ok(None);
        }
        let mut members: Vec<(i64, usize)> = (0..self.inner.size)
            .filter(|&r| all[2 * r] == i64::from(color))
            .map(|r| (all[2 * r + 1], r))
            .collect();
        members.sort_unstable();
        let rank = members
            .iter()
            .position(|&(_, r)| r == self.inner.rank)
            .ok_or_else(|| {
                Error::Aborted(Some(
                    "split: this rank is missing from its own color".into(),
                ))
            })?;
        let global: Vec<usize> = members
            .iter()
            .map(|&(_, r)| self.inner.global_ranks[r])
            .collect();
        let comm_id = split_id(self.inner.comm_id, split_index, color);
        let mut config = self.inner.config.clone();
        config.rank = rank;
        config.size = members.len();
        Self::build(config, self.inner.rendezvous.clone(), global, comm_id).map(Some)
    }

    /// End every in-flight and queued call of this communicator with
    /// `Error::Aborted`, from any thread, and close its connections. The
    /// communicator stays unusable afterwards.
    pub fn abort(&self) {
        self.inner.fail(
            Error::Aborted(Some("abort() was called on this rank".into())),
            None,
            true,
        );
    }

    fn finish_avg<T: Element>(&self, op: ReduceOp, out: &mut [T]) {
        finish_avg(op, out, self.inner.size);
    }

    /// The algorithm for a call of `count` elements (forced by the config,
    /// else the tuner's cheapest) and its slice geometry. Every rank decides
    /// alike: the model is agreed at creation and the inputs are the call's.
    fn pick<T: Element>(&self, kind: CollKind, count: usize) -> (Algorithm, Geometry) {
        let n = self.inner.size;
        let bytes = count * std::mem::size_of::<T>();
        let algorithm = match self.inner.config.algorithm {
            Some(forced) => forced,
            None => {
                let model = *lock(&self.inner.model);
                let (best, costs) = tune::choose(kind, n, bytes, &model);
                if tracing::enabled!(tracing::Level::INFO)
                    && lock(&self.inner.tuned).insert((kind.code(), tune::size_class(bytes)))
                {
                    let listed: Vec<String> = costs
                        .iter()
                        .map(|(a, c)| format!("{} {c:.1} us", a.name()))
                        .collect();
                    // Small calls skip the schedule where the ranks share
                    // control pages (`exec::window`).
                    let chosen = if exec::window::runs_inline(kind, bytes)
                        && self.inner.control.get().is_some()
                    {
                        "inline in the check-in on the shared control pages, one exchange"
                    } else {
                        best.name()
                    };
                    tracing::info!(
                        rank = self.inner.rank,
                        "tuner: {} of {bytes} bytes on {n} ranks -> {chosen} (model: {})",
                        kind.name(),
                        listed.join(", ")
                    );
                }
                best
            }
        };
        // Slices are cut from the pieces the algorithm moves: a ring moves
        // 1/n of the data per hop, each of the two trees half, one-shot all.
        let pieces = match (kind, algorithm) {
            (CollKind::AllReduce, Algorithm::Ring | Algorithm::TwoShot) => n,
            (CollKind::AllReduce, Algorithm::Tree) => 2,
            _ => 1,
        };
        (algorithm, self.geometry::<T>(count, pieces))
    }

    /// Measure this communicator's links and agree on the tuner's constants:
    /// the latency of a one-element ring allreduce, the bandwidth of a
    /// 1 MiB one, the local reduction speed; the slowest rank's figures win,
    /// so every rank's model (and so every choice) is the same. Runs on
    /// every rank at creation (a collective); turn off with
    /// FERROCCL_CALIBRATE=0.
    fn calibrate(&self) -> Result<()> {
        let n = self.inner.size as f64;
        let hops = 2.0 * (n - 1.0);
        let ring = |buf: &mut [f32], op: ReduceOp| -> Result<()> {
            let pieces = self.inner.size;
            let plan = coll::all_reduce(
                self.geometry::<f32>(buf.len(), pieces),
                buf.len(),
                buf.len(),
                Algorithm::Ring,
            )?;
            let spec = self.spec::<f32>(CollKind::AllReduce, Some(op), buf.len(), None);
            self.run_blocking(spec, &plan, in_place(buf, 0, 0))
        };
        // Each figure is the best of several timed runs after a warm-up:
        // the minimum is what the links can do; the noise of a shared
        // machine only ever adds.
        let best_of = |reps: usize, buf: &mut [f32]| -> Result<f64> {
            let mut best = f64::INFINITY;
            for _ in 0..reps {
                let start = Instant::now();
                ring(buf, ReduceOp::Sum)?;
                best = best.min(start.elapsed().as_secs_f64() * 1e6);
            }
            Ok(best)
        };
        let mut one = [0f32; 1];
        best_of(4, &mut one)?;
        let alpha_us = best_of(16, &mut one)? / hops;

        let reduce_gbps = tune::measure_reduce_gbps();
        let mut big = vec![0f32; (1 << 20) / 4];
        let bytes = (big.len() * 4) as f64;
        best_of(2, &mut big)?;
        let t_us = best_of(4, &mut big)?;
        let moving_us =
            (t_us - hops * alpha_us - (n - 1.0) / n * bytes / (reduce_gbps * 1e3)).max(t_us * 0.1);
        let beta_gbps = 2.0 * (n - 1.0) / n * bytes / moving_us / 1e3;

        // Agree: the largest latency, the smallest speeds.
        let mut agreed = [
            alpha_us as f32,
            (1.0 / beta_gbps) as f32,
            (1.0 / reduce_gbps) as f32,
        ];
        ring(&mut agreed, ReduceOp::Max)?;
        let model = LinkModel {
            alpha_us: f64::from(agreed[0]).max(0.1),
            beta_gbps: (1.0 / f64::from(agreed[1])).clamp(0.01, 1000.0),
            reduce_gbps: (1.0 / f64::from(agreed[2])).clamp(0.01, 1000.0),
        };
        *lock(&self.inner.model) = model;
        // Plans chosen under the old model (none in practice) are stale.
        lock(&self.inner.plans).clear();
        self.restart_numbering();
        tracing::info!(
            rank = self.inner.rank,
            "tuner: calibrated on {} ranks: alpha {:.1} us, beta {:.2} GB/s, reduce {:.1} GB/s \
             ({} kernels; the CPU has {})",
            self.inner.size,
            model.alpha_us,
            model.beta_gbps,
            model.reduce_gbps,
            crate::reduce::SimdLevel::current(),
            crate::reduce::SimdLevel::detected()
        );
        Ok(())
    }

    /// Number the user's calls from 1: the set-up's own calls (calibration,
    /// control pages) are not theirs. Only before any check-in.
    fn restart_numbering(&self) {
        let mut state = lock(&self.inner.turns.issued);
        state.coll_seq = 0;
        state.recent.clear();
        self.inner.issued.store(0, Ordering::SeqCst);
    }

    /// The tuner's constants (measured at creation, agreed by all ranks).
    pub fn link_model(&self) -> LinkModel {
        *lock(&self.inner.model)
    }

    /// The allreduce plan for `count` elements of `T`, from the cache of
    /// recent plans or built (and cached). Training loops and benchmarks
    /// repeat the same sizes, and choosing an algorithm and building its
    /// schedule costs more than running a small allreduce over shared memory.
    fn all_reduce_plan<T: Element>(&self, count: usize) -> Result<Arc<Plan>> {
        let key = (CollKind::AllReduce.code(), count, std::mem::size_of::<T>());
        if let Some((_, plan)) = lock(&self.inner.plans).iter().find(|(k, _)| *k == key) {
            return Ok(plan.clone());
        }
        let (algorithm, geometry) = self.pick::<T>(CollKind::AllReduce, count);
        let plan = Arc::new(coll::all_reduce(geometry, count, count, algorithm)?);
        let mut plans = lock(&self.inner.plans);
        if plans.len() >= PLAN_CACHE_ENTRIES {
            plans.remove(0);
        }
        plans.push((key, plan.clone()));
        Ok(plan)
    }

    fn geometry<T: Element>(&self, count: usize, pieces: usize) -> Geometry {
        let elem = std::mem::size_of::<T>();
        let piece_bytes = count / pieces.max(1) * elem;
        let slice_bytes = tune::slice_bytes(piece_bytes, self.inner.config.chunk_bytes());
        Geometry {
            rank: self.inner.rank,
            size: self.inner.size,
            slice: (slice_bytes / elem).max(1),
        }
    }

    fn spec<T: Element>(
        &self,
        kind: CollKind,
        op: Option<ReduceOp>,
        count: usize,
        root: Option<usize>,
    ) -> CallSpec {
        CallSpec {
            kind,
            dtype: T::DTYPE,
            op,
            count,
            root,
            p2p: None,
        }
    }

    fn run_blocking<T: Element>(&self, spec: CallSpec, plan: &Plan, io: Io<'_, T>) -> Result<()> {
        let (ticket, call) = self.inner.issue(&spec, None)?;
        self.inner.wait_turn(ticket);
        let result = self.inner.execute(plan, io, &call);
        self.inner.end_turn();
        result
    }

    fn run_async<R: Send + 'static>(
        &self,
        spec: CallSpec,
        job: impl FnOnce(&Inner, &Call) -> Result<R> + Send + 'static,
    ) -> Result<Work<R>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let inner = self.inner.clone();
        let mut during = String::new();
        let queued = |ticket: u64, call: &Call| -> Job {
            during = call.during();
            let call = call.clone();
            Box::new(move || {
                inner.wait_turn(ticket);
                let result = job(&inner, &call);
                inner.end_turn();
                let _ = tx.send(result);
            })
        };
        self.inner.issue(&spec, Some(Box::new(queued)))?;
        Ok(Work { result: rx, during })
    }
}

/// Avg moves as Sum and divides once, at the end, on the ranks that hold a
/// result.
fn finish_avg<T: Element>(op: ReduceOp, out: &mut [T], size: usize) {
    if op == ReduceOp::Avg {
        T::divide(out, size);
    }
}

/// Bytes of input that an in-place call copies onto the stack rather than
/// the heap, in 8-byte words (element types are at most 8 bytes).
const SMALL_COPY_WORDS: usize = 32;

/// `src` copied into `words`, if it fits.
fn small_copy<'a, T: Element>(words: &'a mut [u64], src: &[T]) -> Option<&'a [T]> {
    let n = (std::mem::size_of_val(src)).div_ceil(8);
    let typed: &mut [T] = bytemuck::try_cast_slice_mut(words.get_mut(..n)?).ok()?;
    let typed = typed.get_mut(..src.len())?;
    typed.copy_from_slice(src);
    Some(typed)
}

fn in_place<T>(buf: &mut [T], input_base: usize, output_base: usize) -> Io<'_, T> {
    Io::InPlace {
        buf,
        input_base,
        output_base,
    }
}

/// A communicator id for a split that every member computes alike and that
/// differs from its parent's and its siblings'.
fn split_id(parent: u64, index: u64, color: i32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in [parent, index, color as u32 as u64, 0x0053_504c_4954] {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h | 2
}

impl Inner {
    /// Hand out the next ticket and sequence number; for async calls, queue
    /// the job under the same lock so queue order is ticket order.
    fn issue(&self, spec: &CallSpec, enqueue: Option<MakeJob<'_>>) -> Result<(u64, Call)> {
        let mut state = lock(&self.turns.issued);
        let next_seq = match spec.p2p {
            Some(key) => state.p2p_seq.get(&key).copied().unwrap_or(0) + 1,
            None => state.coll_seq + 1,
        };
        let fp = Fingerprint {
            seq: next_seq,
            coll: spec.kind.code(),
            dtype: spec.dtype.code(),
            op: spec.op.map_or(0, ReduceOp::code),
            count: spec.count as u64,
            root: spec.root.map_or(NO_ROOT, |r| r as u32),
        };
        if self.has_failed() {
            // Name the call being refused, not the one that failed.
            if let Some(err) = self.relabelled_failure(&fp) {
                return Err(err);
            }
        }
        match spec.p2p {
            Some(key) => {
                state.p2p_seq.insert(key, next_seq);
            }
            None => {
                state.coll_seq = next_seq;
                if state.recent.len() == RECENT_CALLS {
                    state.recent.pop_front();
                }
                state.recent.push_back(fp);
                self.issued.store(next_seq, Ordering::SeqCst);
            }
        }
        let call = Call {
            fingerprint: fp,
            op: spec.op.unwrap_or(ReduceOp::Sum),
            timeout: self.config.timeout,
            nt_store_bytes: self.config.nt_store_bytes,
            inline: self.config.algorithm.is_none(),
        };
        let ticket = state.next_ticket;
        if let Some(make_job) = enqueue {
            let job = make_job(ticket, &call);
            let sender = lock(&self.progress);
            let sender = sender
                .as_ref()
                .ok_or_else(|| Error::Aborted(Some("communicator is shutting down".into())))?;
            sender
                .send(job)
                .map_err(|_| Error::Aborted(Some("the progress thread is gone".into())))?;
        }
        state.next_ticket += 1;
        tracing::trace!(
            rank = self.rank,
            "issued {} as ticket {ticket}",
            call.during()
        );
        Ok((ticket, call))
    }

    fn wait_turn(&self, ticket: u64) {
        let turns = &self.turns;
        if turns.served.load(Ordering::Acquire) == ticket {
            return;
        }
        let mut guard = lock(&turns.sleep);
        // SeqCst with `end_turn`: either it sees this waiter, or this
        // waiter sees its ticket count (no lost wake-up).
        turns.waiting.fetch_add(1, Ordering::SeqCst);
        while turns.served.load(Ordering::SeqCst) != ticket {
            guard = turns.turn.wait(guard).unwrap_or_else(|p| p.into_inner());
        }
        turns.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    fn end_turn(&self) {
        let turns = &self.turns;
        turns.served.fetch_add(1, Ordering::SeqCst);
        if turns.waiting.load(Ordering::SeqCst) > 0 {
            // A waiter that counted itself holds `sleep` until it sleeps:
            // taking it here means the notification cannot fall between
            // its check of `served` and its sleep.
            drop(lock(&turns.sleep));
            turns.turn.notify_all();
        }
    }

    /// Whether the communicator has failed (its error is in `failure`).
    fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Run a checked call (the caller holds its turn).
    fn execute<T: Element>(&self, plan: &Plan, io: Io<'_, T>, call: &Call) -> Result<()> {
        if self.has_failed() {
            if let Some(err) = self.relabelled_failure(&call.fingerprint) {
                return Err(err);
            }
        }
        if let Some(err) = self.heard_mismatch(&call.fingerprint, false) {
            return Err(err);
        }
        let result = self.execute_checked(plan, io, call);
        match result {
            Ok(()) => Ok(()),
            Err(err) => Err(self.on_error(err, call)),
        }
    }

    /// Run a call: directly between windows where every rank's buffers
    /// allow it (once the communicator has windows), else its schedule.
    fn execute_checked<T: Element>(
        &self,
        plan: &Plan,
        mut io: Io<'_, T>,
        call: &Call,
    ) -> Result<()> {
        // Without windows (the common case) this costs one atomic load.
        let control = self.control.get().filter(|_| !is_p2p(&call.fingerprint));
        if let Some(control) = control {
            let ctx = exec::window::Ctx {
                rank: self.rank,
                size: self.size,
                control,
                windows: &self.windows,
                abort: &self.abort_signal,
            };
            if exec::window::run(&ctx, &mut io, call)? {
                self.direct_calls.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        }
        let mut links = lock(&self.links);
        match io {
            // The schedule reads its input after writing its output: run
            // it out of place from a copy.
            Io::InPlace {
                buf,
                input_base: 0,
                output_base: 0,
            } if plan.copies_input => {
                // The copy of a small input lives on the stack: an
                // allocation and its free cost ~70 instructions, a tenth of
                // an 8-byte allreduce.
                let mut words = [0u64; SMALL_COPY_WORDS];
                let heap;
                let input = match small_copy(&mut words, buf) {
                    Some(small) => small,
                    None => {
                        heap = buf.to_vec();
                        &heap
                    }
                };
                let io = Io::OutOfPlace { input, output: buf };
                exec::run(&mut links, &plan.schedule, io, call)
            }
            io => exec::run(&mut links, &plan.schedule, io, call),
        }
    }

    /// Record a call's error as the communicator's failure (or, if the call
    /// only saw the abort that an earlier failure caused, return that one).
    fn on_error(&self, err: Error, call: &Call) -> Error {
        if matches!(err, Error::Aborted(None)) {
            if let Some(stored) = self.relabelled_failure(&call.fingerprint) {
                return stored;
            }
        }
        if matches!(err, Error::Timeout { .. } | Error::PeerFailed { .. }) {
            // A rank that timed out waiting on its neighbour, or heard from
            // it that it failed, is often only downstream of the real
            // failure (a rank further away died, stopped or found a
            // mismatch); give the job's report, if one is coming, a moment
            // to arrive and name the cause.
            let grace = (self.config.timeout / 10).min(std::time::Duration::from_secs(1));
            let until = Instant::now() + grace;
            while Instant::now() < until
                && lock(&self.failure).is_none()
                && lock(&self.mismatch_heard).is_none()
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            if let Some(mismatch) = self.heard_mismatch(&call.fingerprint, true) {
                return mismatch;
            }
            if let Some(stored) = self.relabelled_failure(&call.fingerprint) {
                return stored;
            }
        }
        if let Error::Mismatch {
            peer,
            local,
            remote,
        } = &err
        {
            let report = self.global_ranks.get(*peer).map(|&peer| MismatchReport {
                comm_id: self.comm_id,
                seq: call.fingerprint.seq,
                peer,
                local: local.clone(),
                remote: remote.clone(),
            });
            self.fail_with(err.clone(), None, Broadcast::Mismatch(report));
            return self.relabelled_failure(&call.fingerprint).unwrap_or(err);
        }
        let err = match err {
            Error::Timeout {
                peer, waited_ms, ..
            } => self.blame_for_timeout(call, peer, waited_ms).unwrap_or(err),
            other => other,
        };
        let blame = match &err {
            Error::PeerFailed { rank, .. } | Error::Timeout { peer: rank, .. } => Some(*rank),
            _ => None,
        };
        self.fail(err.clone(), blame, true);
        self.relabelled_failure(&call.fingerprint).unwrap_or(err)
    }

    /// The error for `call` if another rank reported a mismatch that
    /// concerns it (a collective at or after the mismatched position, or,
    /// with `any_call`, any call: one that failed on the mismatch's
    /// fallout); the communicator fails with it.
    #[inline]
    fn heard_mismatch(&self, call: &Fingerprint, any_call: bool) -> Option<Error> {
        if !self.mismatch_flag.load(Ordering::SeqCst) {
            return None;
        }
        self.heard_mismatch_now(call, any_call)
    }

    #[cold]
    fn heard_mismatch_now(&self, call: &Fingerprint, any_call: bool) -> Option<Error> {
        let (reporter, peer, m) = lock(&self.mismatch_heard).clone()?;
        if !any_call && !is_p2p(call) && call.seq < m.seq {
            return None;
        }
        let err = self.mismatch_seen_here(reporter, peer, &m, Some(call));
        self.fail(err.clone(), Some(reporter), false);
        Some(self.relabelled_failure(call).unwrap_or(err))
    }

    /// After a collective timed out waiting on `waited_for`: ask every
    /// member how far it has come, and blame the lowest rank that has not
    /// issued this call at all (it is stuck in its own code, or stopped)
    /// rather than the neighbour, which may only be waiting too. `None`
    /// when every member has issued it (then the neighbour is blamed).
    fn blame_for_timeout(&self, call: &Call, waited_for: usize, waited_ms: u64) -> Option<Error> {
        if is_p2p(&call.fingerprint) {
            return None; // one peer, and its own numbering
        }
        let seq = call.fingerprint.seq;
        let others: Vec<usize> = (0..self.size).filter(|&r| r != self.rank).collect();
        let globals: Vec<usize> = others
            .iter()
            .filter_map(|&r| self.global_ranks.get(r).copied())
            .collect();
        let wait = (self.config.timeout / 4).min(std::time::Duration::from_secs(2));
        let answers =
            self.rendezvous
                .store
                .ask_progress(self.comm_id, &globals, Instant::now() + wait);
        let (laggard, at) = others
            .iter()
            .zip(answers)
            .find_map(|(&r, a)| a.filter(|&issued| issued < seq).map(|a| (r, a)))?;
        let last = if at == 0 {
            "none yet".to_string()
        } else {
            format!("#{at}")
        };
        tracing::warn!(
            rank = self.rank,
            "{}: timed out waiting for rank {waited_for}; rank {laggard} has not issued the call \
             (its last collective call: {last})",
            call.during()
        );
        Some(Error::PeerFailed {
            rank: laggard,
            during: call.during(),
            reason: format!(
                "timed out after {waited_ms} ms: it has not called {} #{seq} (its last collective \
                 call: {last}); it is stuck or busy outside the library",
                CollKind::from_code(call.fingerprint.coll).map_or("the collective", |k| k.name())
            ),
        })
    }

    /// The stored failure, restated for the call `call` (a mismatch that
    /// another rank reported is compared with this call).
    fn relabelled_failure(&self, call: &Fingerprint) -> Option<Error> {
        let stored = lock(&self.failure).clone()?;
        Some(match stored {
            Error::PeerFailed { rank, reason, .. } => Error::PeerFailed {
                rank,
                during: crate::fingerprint::describe(call),
                reason,
            },
            Error::Mismatch { .. } => match &*lock(&self.mismatch_heard) {
                Some((reporter, peer, m)) => {
                    self.mismatch_seen_here(*reporter, *peer, m, Some(call))
                }
                None => stored,
            },
            other => other,
        })
    }

    /// Mark the communicator failed (first failure wins), wake every waiter,
    /// tell the job which rank is to blame (unless the news came from the
    /// job already), and close connections with a failure frame.
    fn fail(&self, err: Error, blame: Option<usize>, broadcast: bool) {
        let how = if broadcast {
            Broadcast::Failed
        } else {
            Broadcast::No
        };
        self.fail_with(err, blame, how);
    }

    fn fail_with(&self, err: Error, blame: Option<usize>, broadcast: Broadcast) {
        {
            let mut failure = lock(&self.failure);
            if failure.is_some() {
                return;
            }
            tracing::warn!(rank = self.rank, "communicator failed: {err}");
            *failure = Some(err.clone());
            self.failed.store(true, Ordering::Release);
        }
        // Without a peer to blame (abort(), a mismatch seen here) this rank
        // is the one leaving: say so, so that peers learn it at once instead
        // of at their timeout.
        let blamed = blame.unwrap_or(self.rank);
        let reason = match &err {
            Error::PeerFailed { reason, .. } => reason.clone(),
            other => other.to_string(),
        };
        let told_the_job = !matches!(broadcast, Broadcast::No);
        if let Some(&global) = self.global_ranks.get(blamed) {
            match broadcast {
                Broadcast::No => {}
                Broadcast::Failed => self.rendezvous.store.report_failure(global, &reason),
                Broadcast::Mismatch(mismatch) => self.rendezvous.store.report(FailureReport {
                    rank: global,
                    reason: reason.clone(),
                    mismatch,
                }),
            }
            if told_the_job && self.rendezvous._server.is_some() {
                // This process hosts the rendezvous and may exit on this
                // error at once: a socket closed with unread bytes (the
                // clients' heartbeats) is reset, and a reset peer drops what
                // it had not read yet, this report among it. The watch
                // threads read at once; give them a moment.
                std::thread::sleep(HOST_LINGER);
            }
        }
        // Peers first, then local waiters: a program that exits on the error
        // must not look like the culprit to peers that have not heard yet.
        for closer in lock(&self.closers).iter() {
            closer.close_with_failure(blamed, &reason);
        }
        self.abort.abort();
    }

    /// What this rank says about a mismatch that `reporter` (local rank)
    /// found with `m.peer`: each side sees the other's call; a third rank
    /// compares its own call at that position with both.
    fn mismatch_seen_here(
        &self,
        reporter: usize,
        peer: usize,
        m: &MismatchReport,
        call: Option<&Fingerprint>,
    ) -> Error {
        if self.rank == peer {
            return Error::Mismatch {
                peer: reporter,
                local: m.remote.clone(),
                remote: m.local.clone(),
            };
        }
        let own = match call {
            Some(fp) if fp.seq == m.seq && !is_p2p(fp) => Some(crate::fingerprint::describe(fp)),
            _ => lock(&self.turns.issued)
                .recent
                .iter()
                .find(|fp| fp.seq == m.seq)
                .map(crate::fingerprint::describe),
        };
        let both = || format!("{} (and rank {peer} called {})", m.local, m.remote);
        match own {
            Some(own) if own == m.local => Error::Mismatch {
                peer,
                local: own,
                remote: m.remote.clone(),
            },
            Some(own) if own == m.remote => Error::Mismatch {
                peer: reporter,
                local: own,
                remote: m.local.clone(),
            },
            Some(own) => Error::Mismatch {
                peer: reporter,
                local: own,
                remote: both(),
            },
            // This rank has not reached that position: it says where it is
            // (a call before it can end on the mismatch's fallout, when the
            // reporter's process exits and its sockets reset).
            None => Error::Mismatch {
                peer: reporter,
                local: match call {
                    Some(fp) => format!(
                        "{} and nothing at #{} yet",
                        crate::fingerprint::describe(fp),
                        m.seq
                    ),
                    None => format!("nothing at #{} yet", m.seq),
                },
                remote: both(),
            },
        }
    }
}

/// Whether a call is point-to-point (numbered per peer and direction).
fn is_p2p(fp: &Fingerprint) -> bool {
    CollKind::from_code(fp.coll) == Some(CollKind::SendRecv)
}

/// What [`Inner::fail_with`] tells the job.
enum Broadcast {
    /// Nothing (the news came from the job).
    No,
    /// That the blamed rank failed.
    Failed,
    /// That this rank found a mismatch (with the peer's global rank and
    /// both calls, when known).
    Mismatch(Option<MismatchReport>),
}

/// Listen for failure reports of the job and fail the communicator when one
/// names a member.
fn spawn_watcher(inner: &Arc<Inner>, stop: crossbeam_channel::Receiver<()>) -> Result<()> {
    let reports = inner.rendezvous.store.failures();
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let rank = inner.rank;
    std::thread::Builder::new()
        .name(format!("ferroccl-watch-{rank}"))
        .spawn(move || loop {
            crossbeam_channel::select! {
                recv(reports) -> report => {
                    let Ok(report) = report else { return };
                    if report.is_rendezvous_loss() {
                        // Rank 0 leaving is often only the echo of another
                        // failure (it exits on it); give the report naming
                        // the cause, or this rank's own error, a moment to
                        // arrive first.
                        std::thread::sleep(std::time::Duration::from_millis(200));
                    }
                    let Some(inner) = weak.upgrade() else { return };
                    let local_of = |g: usize| inner.global_ranks.iter().position(|&x| x == g);
                    let Some(local) = local_of(report.rank) else { continue };
                    if local == inner.rank {
                        continue;
                    }
                    match &report.mismatch {
                        // A mismatch concerns its own communicator only:
                        // the reporter is alive and its other communicators
                        // work.
                        Some(m) if m.comm_id != inner.comm_id => {}
                        Some(m) => {
                            let peer = local_of(m.peer).unwrap_or(local);
                            {
                                let mut heard = lock(&inner.mismatch_heard);
                                if heard.is_none() && lock(&inner.failure).is_none() {
                                    *heard = Some((local, peer, m.clone()));
                                }
                            }
                            // SeqCst, as the issuer's store of `issued` and
                            // its load of this flag: either that call sees
                            // the flag, or the check below sees the call.
                            inner.mismatch_flag.store(true, Ordering::SeqCst);
                            // A call before the mismatched one is left to
                            // finish: its peers completed it, so its data
                            // is on the way. The mismatched call (or a
                            // later one) ends now, or when it starts.
                            if inner.issued.load(Ordering::SeqCst) >= m.seq {
                                let err = inner.mismatch_seen_here(local, peer, m, None);
                                inner.fail(err, Some(local), false);
                            }
                        }
                        None => {
                            // After a mismatch report, ranks leave on the
                            // mismatch: their going is its echo, not news.
                            let heard = lock(&inner.mismatch_heard).clone();
                            let err = match heard {
                                Some((reporter, peer, m)) => {
                                    inner.mismatch_seen_here(reporter, peer, &m, None)
                                }
                                None => Error::PeerFailed {
                                    rank: local,
                                    during: "failure report from the job".into(),
                                    reason: report.reason.clone(),
                                },
                            };
                            inner.fail(err, Some(local), false);
                        }
                    }
                }
                recv(stop) -> _ => return,
            }
        })?;
    Ok(())
}

impl Drop for Inner {
    fn drop(&mut self) {
        // A peer waiting at a check-in learns that this rank is gone (after
        // a failure it learns that from the job's failure report instead).
        if let Some(control) = self.control.get() {
            if !self.has_failed() {
                exec::window::leave(control, self.rank);
            }
        }
        lock(&self.watcher_stop).take();
        lock(&self.progress).take();
        if let Some(handle) = lock(&self.progress_thread).take() {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
        // Dropping the halves flushes frames still queued for peers (bounded
        // by the transport) and says goodbye; `close()` would cut them off.
        // The closers are for failure and abort only.
        lock(&self.links).clear();
        // The closers hold the last references to the connections: let
        // them go before the abort fires, so a connection still owed to a
        // peer (shm frames the peer has not mapped yet) can wait for it.
        lock(&self.closers).clear();
        self.abort.abort();
    }
}
