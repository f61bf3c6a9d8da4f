//! The extension module `ferroccl._ferroccl`: the library's `Communicator`
//! for Python, reached by (pointer, element count, data type) as the NCCL
//! ABI crate reaches it, so that any host buffer (a numpy array, a torch
//! tensor's storage) is used in place, and device buffers go to the raw
//! device entry points on the caller's stream.
//!
//! Why one file of about 980 lines: PyO3 takes one `#[pymethods]` block
//! per Python class (several need its `multiple-pymethods` feature and the
//! `inventory` crate), and the `Communicator` class's methods are most of
//! this file; the Python side of the package is in `ferroccl/*.py`.
//!
//! It owns the ordering of a Python communicator's calls: async calls run
//! one at a time, in issue order, on one worker thread per communicator;
//! a blocking call waits for the queue to drain and then runs on the
//! caller's thread (no thread hop for the common case), with the GIL
//! released while it runs. Keeping the buffers alive and unchanged while
//! a call runs is the Python layer's job (`ferroccl/__init__.py` holds
//! them in the `Work`); argument checks that need the element layout
//! (in place or disjoint) are made here, before any byte moves.
//!
//! It must not re-implement a collective: every call is one call of the
//! library's public API.

use ferroccl::cuda::RawOp;
use ferroccl::{Communicator, Config, DataType, Element, Error, ReduceOp};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

pyo3::create_exception!(
    _ferroccl,
    FerrocclError,
    PyRuntimeError,
    "A ferroccl call failed. Attributes: `rank` (this rank), `call` (the \
     collective), `seq` (its number on this communicator, from 1), \
     `failed_rank` (the rank blamed, or None), `kind` (the library's error \
     variant)."
);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The collectives a Python caller can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    Send,
    Recv,
    AllToAll,
    Barrier,
}

impl Kind {
    const ALL: [Kind; 9] = [
        Kind::AllReduce,
        Kind::ReduceScatter,
        Kind::AllGather,
        Kind::Broadcast,
        Kind::Reduce,
        Kind::Send,
        Kind::Recv,
        Kind::AllToAll,
        Kind::Barrier,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::AllGather => "all_gather",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::Send => "send",
            Kind::Recv => "recv",
            Kind::AllToAll => "all_to_all",
            Kind::Barrier => "barrier",
        }
    }

    fn parse(name: &str) -> PyResult<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| PyValueError::new_err(format!("ferroccl: unknown collective {name:?}")))
    }
}

/// One call as Python described it: buffers by address and length in
/// elements.
#[derive(Debug, Clone, Copy)]
struct Call {
    kind: Kind,
    send: usize,
    send_len: usize,
    recv: usize,
    recv_len: usize,
    dtype: DataType,
    op: ReduceOp,
    /// Root, or the peer of send/recv.
    root: usize,
    /// This call's number on the communicator (from 1), for errors.
    seq: u64,
}

/// How the buffers of a checked host call are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Disjoint send and receive buffers.
    OutOfPlace,
    /// One buffer, NCCL's in-place layout for the collective.
    InPlace,
}

fn overlap(a: usize, a_len: usize, b: usize, b_len: usize) -> bool {
    a_len > 0 && b_len > 0 && a < b + b_len && b < a + a_len
}

impl Call {
    fn what(&self) -> String {
        format!("{} #{}", self.kind.name(), self.seq)
    }

    /// Local checks of a host call: NULL, alignment, overlap that is not
    /// the in-place layout. Lengths against the rank count are the
    /// library's to check.
    fn check_host(&self, rank: usize) -> Result<Layout, String> {
        let esz = self.dtype.size();
        for (ptr, len, label) in [
            (self.send, self.send_len, "input"),
            (self.recv, self.recv_len, "output"),
        ] {
            if len > 0 && ptr == 0 {
                return Err(format!("{}: the {label} is a NULL pointer", self.what()));
            }
            if len > 0 && ptr % esz != 0 {
                return Err(format!(
                    "{}: the {label} at {ptr:#x} is not aligned to its {esz}-byte {} elements",
                    self.what(),
                    self.dtype
                ));
            }
        }
        let in_place = match self.kind {
            Kind::AllReduce | Kind::Broadcast | Kind::Reduce | Kind::AllToAll => {
                self.send == self.recv && self.send_len == self.recv_len
            }
            Kind::AllGather => self.send == self.recv + rank * self.send_len * esz,
            Kind::ReduceScatter => self.recv == self.send + rank * self.recv_len * esz,
            Kind::Send | Kind::Recv | Kind::Barrier => false,
        };
        if in_place {
            return Ok(Layout::InPlace);
        }
        if overlap(
            self.send,
            self.send_len * esz,
            self.recv,
            self.recv_len * esz,
        ) {
            return Err(format!(
                "{}: input and output overlap without being the in-place layout (the same \
                 buffer, or for a gather the output's block of this rank)",
                self.what()
            ));
        }
        Ok(Layout::OutOfPlace)
    }
}

/// Call `$f::<T>(args)` with `T` the Rust type of a `DataType`.
macro_rules! with_type {
    ($t:expr, $f:ident, $($a:expr),*) => {
        match $t {
            DataType::F32 => $f::<f32>($($a),*),
            DataType::F64 => $f::<f64>($($a),*),
            DataType::F16 => $f::<half::f16>($($a),*),
            DataType::Bf16 => $f::<half::bf16>($($a),*),
            DataType::I8 => $f::<i8>($($a),*),
            DataType::U8 => $f::<u8>($($a),*),
            DataType::I32 => $f::<i32>($($a),*),
            DataType::U32 => $f::<u32>($($a),*),
            DataType::I64 => $f::<i64>($($a),*),
            DataType::U64 => $f::<u64>($($a),*),
        }
    };
}

/// # Safety
/// `ptr` is aligned, and where `len > 0` valid for reads of `len`
/// elements that nothing writes while the slice lives.
unsafe fn read<'a, T>(ptr: usize, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: as the caller vouches.
    unsafe { std::slice::from_raw_parts(ptr as *const T, len) }
}

/// # Safety
/// As [`read`], for writes, and nothing else touches the memory while the
/// slice lives.
unsafe fn write<'a, T>(ptr: usize, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: as the caller vouches.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut T, len) }
}

/// A checked host call's buffers as slices of its element type `T`: what
/// every arm of [`host_typed`] hands the library.
impl Call {
    /// The input, read.
    ///
    /// # Safety
    /// As [`read`], for `send` and `send_len`.
    unsafe fn input<'a, T>(&self) -> &'a [T] {
        // SAFETY: as the caller vouches.
        unsafe { read(self.send, self.send_len) }
    }

    /// The input, written: the one buffer of an in-place call whose
    /// layout is the input's (reduce-scatter, reduce).
    ///
    /// # Safety
    /// As [`write`], for `send` and `send_len`.
    unsafe fn input_mut<'a, T>(&self) -> &'a mut [T] {
        // SAFETY: as the caller vouches.
        unsafe { write(self.send, self.send_len) }
    }

    /// The output, written.
    ///
    /// # Safety
    /// As [`write`], for `recv` and `recv_len`.
    unsafe fn output<'a, T>(&self) -> &'a mut [T] {
        // SAFETY: as the caller vouches.
        unsafe { write(self.recv, self.recv_len) }
    }
}

/// Run a checked host call of element type `T`.
///
/// # Safety
/// The buffers are live host memory of the given lengths, kept alive and
/// untouched by anything else until this returns (the Python layer holds
/// them); `layout` is what `check_host` found.
unsafe fn host_typed<T: Element>(
    comm: &Communicator,
    c: &Call,
    layout: Layout,
) -> ferroccl::Result<()> {
    let in_place = layout == Layout::InPlace;
    // SAFETY (every block below): `check_host` made sure the pointers are
    // non-NULL where used, aligned, and either one buffer in the in-place
    // layout (then only `write` of the whole buffer is made) or disjoint;
    // the caller vouches for the memory.
    unsafe {
        match c.kind {
            Kind::AllReduce if in_place => comm.all_reduce_in_place(c.output::<T>(), c.op),
            Kind::AllReduce => comm.all_reduce(c.input::<T>(), c.output(), c.op),
            Kind::ReduceScatter if in_place => {
                comm.reduce_scatter_in_place(c.input_mut::<T>(), c.op)
            }
            Kind::ReduceScatter => comm.reduce_scatter(c.input::<T>(), c.output(), c.op),
            Kind::AllGather if in_place => comm.all_gather_in_place(c.output::<T>()),
            Kind::AllGather => comm.all_gather(c.input::<T>(), c.output()),
            Kind::Broadcast => {
                if !in_place && comm.rank() == c.root {
                    if c.send_len != c.recv_len {
                        return Err(Error::InvalidArgument(format!(
                            "{}: the root's input has {} elements and its output {}",
                            c.what(),
                            c.send_len,
                            c.recv_len
                        )));
                    }
                    c.output::<T>().copy_from_slice(c.input::<T>());
                }
                comm.broadcast(c.output::<T>(), c.root)
            }
            Kind::Reduce if in_place => comm.reduce_in_place(c.input_mut::<T>(), c.op, c.root),
            Kind::Reduce => comm.reduce(c.input::<T>(), c.output(), c.op, c.root),
            Kind::AllToAll if in_place => {
                // The library's all-to-all is out of place: a copy of the
                // input is the send side.
                let copy = c.input::<T>().to_vec();
                comm.all_to_all(&copy, c.output())
            }
            Kind::AllToAll => comm.all_to_all(c.input::<T>(), c.output()),
            Kind::Send => comm.send(c.input::<T>(), c.root),
            Kind::Recv => comm.recv(c.output::<T>(), c.root),
            Kind::Barrier => comm.barrier(),
        }
    }
}

/// Run a host call: checks, then the typed call.
///
/// # Safety
/// As [`host_typed`].
unsafe fn run_host(comm: &Communicator, c: &Call) -> Result<(), CallError> {
    let layout = c
        .check_host(comm.rank())
        .map_err(|m| CallError::new(comm, c, Error::InvalidArgument(m)))?;
    // SAFETY: forwarded from the caller.
    unsafe { with_type!(c.dtype, host_typed, comm, c, layout) }
        .map_err(|e| CallError::new(comm, c, e))
}

/// Enqueue a device call on `stream` through the raw entry points.
///
/// # Safety
/// The raw entry points' contract: device buffers of the given lengths
/// (or host memory the driver knows), a live stream of the current
/// context, the buffers untouched by other work until the stream passes
/// the call.
unsafe fn run_device(
    comm: &Communicator,
    c: &Call,
    stream: usize,
) -> Result<ferroccl::DeviceWork, CallError> {
    let (s, r) = (c.send as *const c_void, c.recv as *mut c_void);
    let st = stream as *mut c_void;
    let op = RawOp::Builtin(c.op);
    // SAFETY (each call): forwarded from the caller; the library checks
    // the pointers and the stream with the driver before enqueueing.
    let work = unsafe {
        match c.kind {
            Kind::AllReduce => comm.all_reduce_raw(s, r, c.recv_len, c.dtype, op, st),
            Kind::ReduceScatter => comm.reduce_scatter_raw(s, r, c.recv_len, c.dtype, op, st),
            Kind::AllGather => comm.all_gather_raw(s, r, c.send_len, c.dtype, st),
            Kind::Broadcast => comm.broadcast_raw(s, r, c.recv_len, c.dtype, c.root, st),
            Kind::Reduce => comm.reduce_raw(s, r, c.send_len, c.dtype, op, c.root, st),
            Kind::AllToAll => {
                comm.all_to_all_raw(s, r, c.send_len / comm.size().max(1), c.dtype, st)
            }
            Kind::Send => comm.send_raw(s, c.send_len, c.dtype, c.root, st),
            Kind::Recv => comm.recv_raw(r, c.recv_len, c.dtype, c.root, st),
            Kind::Barrier => {
                return Err(CallError::new(
                    comm,
                    c,
                    Error::InvalidArgument("barrier takes no device buffer".into()),
                ))
            }
        }
    };
    work.map_err(|e| CallError::new(comm, c, e))
}

/// A failed call, with the facts the Python exception carries.
#[derive(Debug, Clone)]
struct CallError {
    /// None where no communicator exists yet (joining failed).
    rank: Option<usize>,
    call: &'static str,
    seq: u64,
    failed_rank: Option<usize>,
    kind: &'static str,
    message: String,
}

fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::InvalidArgument(_) => "InvalidArgument",
        Error::Env(_) => "Env",
        Error::Bootstrap(_) => "Bootstrap",
        Error::Timeout { .. } => "Timeout",
        Error::PeerFailed { .. } => "PeerFailed",
        Error::Mismatch { .. } => "Mismatch",
        Error::Protocol { .. } => "Protocol",
        Error::Connect { .. } => "Connect",
        Error::Aborted(_) => "Aborted",
        Error::Io(_) => "Io",
        Error::NoDevice(_) => "NoDevice",
    }
}

impl CallError {
    fn new(comm: &Communicator, c: &Call, e: Error) -> CallError {
        CallError {
            rank: Some(comm.rank()),
            call: c.kind.name(),
            seq: c.seq,
            failed_rank: e.failed_rank(),
            kind: error_kind(&e),
            // The library's own message names the call where it ran.
            message: if e.to_string().contains(&format!("{} #", c.kind.name())) {
                format!("ferroccl rank {}: {e}", comm.rank())
            } else {
                format!("ferroccl rank {}: {}: {e}", comm.rank(), c.what())
            },
        }
    }

    fn to_py(&self, py: Python<'_>) -> PyErr {
        let err = FerrocclError::new_err(self.message.clone());
        let v = err.value(py);
        // Setting attributes on a fresh exception instance cannot fail
        // short of memory exhaustion; the message carries the facts anyway.
        let _ = v.setattr("rank", self.rank);
        let _ = v.setattr("call", self.call);
        let _ = v.setattr("seq", self.seq);
        let _ = v.setattr("failed_rank", self.failed_rank);
        let _ = v.setattr("kind", self.kind);
        err
    }
}

/// A failure to join a job, as the Python exception: no rank yet, the
/// call `init`.
fn lib_error(e: Error) -> PyErr {
    let err = CallError {
        rank: None,
        call: "init",
        seq: 0,
        failed_rank: e.failed_rank(),
        kind: error_kind(&e),
        message: format!("ferroccl: {e}"),
    };
    Python::attach(|py| err.to_py(py))
}

/// Where a call stands.
#[derive(Default)]
struct HandleState {
    done: Option<Result<(), CallError>>,
    /// Python callables to call (with no argument) once done.
    callbacks: Vec<Py<PyAny>>,
    /// A device call's host-side wait, kept so that its end can be asked.
    device: Option<ferroccl::DeviceWork>,
}

#[derive(Default)]
struct Handle {
    state: Mutex<HandleState>,
    cv: Condvar,
}

impl Handle {
    /// Record how the call ended; returns the callbacks to run.
    fn finish(&self, r: Result<(), CallError>) -> Vec<Py<PyAny>> {
        let callbacks = {
            let mut s = lock(&self.state);
            s.done = Some(r);
            std::mem::take(&mut s.callbacks)
        };
        self.cv.notify_all();
        callbacks
    }
}

thread_local! {
    /// This thread is a communicator's worker: calls it issues (from a
    /// done-callback) run at once, on it.
    static IN_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is a communicator's worker (see `IN_WORKER`).
fn in_worker() -> bool {
    IN_WORKER.with(|w| w.get())
}

/// Run done-callbacks under the GIL, on the worker, before it takes the
/// next queued call. Calls a callback issues run at once on the worker
/// (see `IN_WORKER`), so every rank runs them right after the call whose
/// callback issued them, whatever other threads queued meanwhile: the
/// order stays the same on every rank (PowerSGD's hooks issue and wait
/// for calls from callbacks).
fn run_callbacks(callbacks: Vec<Py<PyAny>>) {
    if callbacks.is_empty() {
        return;
    }
    Python::attach(|py| {
        for cb in callbacks {
            if let Err(e) = cb.call0(py) {
                // A callback's own error belongs to its future; one that
                // escapes is printed, as Python does for errors in threads.
                e.print(py);
            }
        }
    });
}

/// The ordering state of a Python communicator.
#[derive(Default)]
struct Queue {
    /// Async calls issued and not yet finished.
    pending: usize,
}

struct Shared {
    comm: Communicator,
    queue: Mutex<Queue>,
    drained: Condvar,
    seq: AtomicU64,
}

/// What the worker runs, in issue order.
enum Job {
    /// A call and the handle to finish.
    Call(Call, Arc<Handle>),
    /// A Python callable to call (under the GIL) once every call issued
    /// before it has ended.
    Callback(Py<PyAny>),
}

/// A communicator: `ferroccl.Communicator` in Python.
#[pyclass(module = "ferroccl._ferroccl", name = "Communicator", frozen)]
struct PyCommunicator {
    /// None once destroyed: the communicator itself is dropped then, so
    /// that it leaves the job cleanly (torch's destroy_process_group calls
    /// the backend's shutdown, which calls `destroy`).
    slot: std::sync::RwLock<Option<Arc<Shared>>>,
    rank: usize,
    size: usize,
    timeout: f64,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Async calls of at most this many bytes run at once on the caller's
    /// thread when nothing is queued (FERROCCL_PY_INLINE_BYTES; default:
    /// every size; 0: always on the worker). On the 2-core build machine
    /// DDP's bucket allreduces on the worker, overlapping backward,
    /// competed with it for the cores: a 25M-parameter transformer's step
    /// spent 346-412 ms in communication that way and 57-93 ms inline
    /// (docs/performance-log.md, "PyTorch").
    inline_bytes: usize,
}

impl PyCommunicator {
    fn new(comm: Communicator) -> PyCommunicator {
        let shared = Arc::new(Shared {
            comm,
            queue: Mutex::new(Queue::default()),
            drained: Condvar::new(),
            seq: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::channel::<Job>();
        let s = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name(format!("ferroccl-py-{}", s.comm.rank()))
            .spawn(move || {
                IN_WORKER.with(|w| w.set(true));
                for job in rx {
                    match job {
                        Job::Call(call, handle) => {
                            // SAFETY: the Python layer keeps the buffers of
                            // an async call alive and untouched until its
                            // Work ends (it holds them in the Work).
                            let r = unsafe { run_host(&s.comm, &call) };
                            // The callbacks run before the call counts as
                            // over, so that what they issue comes before any
                            // blocking call of another thread.
                            run_callbacks(handle.finish(r));
                        }
                        Job::Callback(cb) => run_callbacks(vec![cb]),
                    }
                    let mut q = lock(&s.queue);
                    q.pending -= 1;
                    if q.pending == 0 {
                        s.drained.notify_all();
                    }
                }
            })
            .expect("spawning a thread");
        let inline_bytes = std::env::var("FERROCCL_PY_INLINE_BYTES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(usize::MAX);
        PyCommunicator {
            rank: shared.comm.rank(),
            size: shared.comm.size(),
            timeout: shared.comm.config().timeout.as_secs_f64(),
            slot: std::sync::RwLock::new(Some(shared)),
            jobs: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
            inline_bytes,
        }
    }

    fn call_of(
        &self,
        kind: &str,
        send: (usize, usize),
        recv: (usize, usize),
        dtype: &str,
        op: &str,
        root: usize,
    ) -> PyResult<Call> {
        let kind = Kind::parse(kind)?;
        let dtype = DataType::from_name(dtype).ok_or_else(|| {
            PyValueError::new_err(format!(
                "ferroccl: {}: element type {dtype:?} is not one the library carries",
                kind.name()
            ))
        })?;
        let op = ReduceOp::from_name(op).ok_or_else(|| {
            PyValueError::new_err(format!(
                "ferroccl: {}: reduction {op:?} is not one of sum, prod, min, max, avg",
                kind.name()
            ))
        })?;
        Ok(Call {
            kind,
            send: send.0,
            send_len: send.1,
            recv: recv.0,
            recv_len: recv.1,
            dtype,
            op,
            root,
            seq: self.shared()?.seq.fetch_add(1, Ordering::Relaxed) + 1,
        })
    }

    /// The live communicator, or the error of a destroyed one.
    fn shared(&self) -> PyResult<Arc<Shared>> {
        self.slot
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| self.destroyed(None))
    }

    /// The error of a call (where one is named) on a destroyed
    /// communicator.
    fn destroyed(&self, call: Option<&Call>) -> PyErr {
        let what = call.map(|c| format!("{}: ", c.what())).unwrap_or_default();
        FerrocclError::new_err(format!(
            "ferroccl rank {}: {what}the communicator was destroyed",
            self.rank
        ))
    }

    /// Run `f` on the calling thread, GIL released, once no async call is
    /// pending (on the worker, from a callback, at once: the queue waits
    /// for it); its error as the Python exception. The shape of every call
    /// that returns once it has run (host) or been enqueued (device).
    fn in_turn<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&Communicator) -> Result<R, CallError> + Send,
    ) -> PyResult<R> {
        let shared = self.shared()?;
        py.detach(|| {
            let _turn = (!in_worker()).then(|| drained(&shared));
            f(&shared.comm)
        })
        .map_err(|e| e.to_py(py))
    }
}

/// Queue `job` for the worker, behind every job queued before it; it
/// counts as pending until the worker has run it.
fn enqueue(shared: &Shared, tx: &mpsc::Sender<Job>, job: Job) -> PyResult<()> {
    lock(&shared.queue).pending += 1;
    if tx.send(job).is_err() {
        lock(&shared.queue).pending -= 1;
        return Err(PyRuntimeError::new_err("ferroccl: the worker thread ended"));
    }
    Ok(())
}

/// Wait (GIL released by the caller) until no async call is pending.
fn drained(shared: &Shared) -> MutexGuard<'_, Queue> {
    let mut q = lock(&shared.queue);
    while q.pending > 0 {
        q = shared.drained.wait(q).unwrap_or_else(|p| p.into_inner());
    }
    q
}

/// Run an async call at once on the issuing thread (GIL released) and
/// hand back its finished handle: where nothing is queued ahead of it, or
/// from a done-callback on the worker.
fn run_now(py: Python<'_>, shared: &Shared, call: &Call, handle: Arc<Handle>) -> PyHandle {
    // SAFETY: the caller holds the buffers for the call (it is blocked in
    // it until this returns).
    let r = py.detach(|| unsafe { run_host(&shared.comm, call) });
    drop(handle.finish(r));
    PyHandle { handle }
}

#[pymethods]
impl PyCommunicator {
    /// Join the job the launcher's environment describes (ferroccl-run,
    /// mpirun, Slurm; under torchrun use the torch backend instead, whose
    /// rendezvous goes through torch's store).
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<PyCommunicator> {
        let comm = py.detach(Communicator::from_env).map_err(lib_error)?;
        Ok(PyCommunicator::new(comm))
    }

    /// Join a job with explicit settings: rank 0 hosts the rendezvous at
    /// `addr:port`; every rank gives the same `token`. FERROCCL_*
    /// variables tune the rest; `timeout` (seconds), where given, bounds
    /// every wait.
    #[staticmethod]
    #[pyo3(signature = (rank, size, addr, port, token, timeout=None))]
    fn init(
        py: Python<'_>,
        rank: usize,
        size: usize,
        addr: String,
        port: u16,
        token: u64,
        timeout: Option<f64>,
    ) -> PyResult<PyCommunicator> {
        let mut config = Config::new(rank, size, addr, port, token).map_err(lib_error)?;
        if let Some(t) = timeout {
            if !(t.is_finite() && t > 0.0) {
                return Err(PyValueError::new_err(format!(
                    "ferroccl: timeout must be a positive number of seconds, not {t}"
                )));
            }
            config.timeout = Duration::from_secs_f64(t);
        }
        let comm = py
            .detach(move || Communicator::init(config))
            .map_err(lib_error)?;
        Ok(PyCommunicator::new(comm))
    }

    /// This rank, `0..size`.
    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    #[getter]
    fn size(&self) -> usize {
        self.size
    }

    /// Bound of every wait, in seconds.
    #[getter]
    fn timeout(&self) -> f64 {
        self.timeout
    }

    /// Run one call to its end (GIL released): `send` and `recv` are
    /// (address, elements); `dtype` a library type name; `op` a reduction
    /// name (ignored where none applies); `root` the root or the peer.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kind, send, recv, dtype, op="sum", root=0))]
    fn call(
        &self,
        py: Python<'_>,
        kind: &str,
        send: (usize, usize),
        recv: (usize, usize),
        dtype: &str,
        op: &str,
        root: usize,
    ) -> PyResult<()> {
        let call = self.call_of(kind, send, recv, dtype, op, root)?;
        // SAFETY: the Python caller holds the buffers for the call's
        // length (it is blocked in it).
        self.in_turn(py, |comm| unsafe { run_host(comm, &call) })
    }

    /// Issue one call to run in the background, after every call issued
    /// before it; returns its handle. The caller keeps the buffers alive
    /// and untouched until the handle is done.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kind, send, recv, dtype, op="sum", root=0))]
    fn call_async(
        &self,
        py: Python<'_>,
        kind: &str,
        send: (usize, usize),
        recv: (usize, usize),
        dtype: &str,
        op: &str,
        root: usize,
    ) -> PyResult<PyHandle> {
        let call = self.call_of(kind, send, recv, dtype, op, root)?;
        let shared = self.shared()?;
        let handle = Arc::new(Handle::default());
        if in_worker() {
            // From a done-callback: run now (see `run_callbacks`).
            return Ok(run_now(py, &shared, &call, handle));
        }
        let jobs = lock(&self.jobs);
        let tx = jobs.as_ref().ok_or_else(|| self.destroyed(Some(&call)))?;
        let bytes = call.send_len.max(call.recv_len) * call.dtype.size();
        if bytes <= self.inline_bytes {
            // With nothing queued the call runs at once on this thread:
            // that saves the thread hop (tens of microseconds on a busy
            // machine), and on few cores a worker overlapping the caller's
            // compute only competes with it. Holding the queue keeps other
            // issuers behind it.
            let q = lock(&shared.queue);
            if q.pending == 0 {
                let done = run_now(py, &shared, &call, handle);
                drop(q);
                return Ok(done);
            }
        }
        enqueue(&shared, tx, Job::Call(call, Arc::clone(&handle)))?;
        Ok(PyHandle { handle })
    }

    /// Call `callback()` (under the GIL) on the worker once every call
    /// issued before this has ended, at this place in the order: calls
    /// the callback issues run there, on every rank alike, whether or not
    /// the earlier calls had ended when this was queued (a torch future's
    /// callbacks issue calls: PowerSGD). From the worker itself (inside
    /// such a callback) it runs at once.
    fn enqueue_callback(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        if in_worker() {
            return callback.call0(py).map(|_| ());
        }
        let shared = self.shared()?;
        let jobs = lock(&self.jobs);
        let tx = jobs.as_ref().ok_or_else(|| self.destroyed(None))?;
        enqueue(&shared, tx, Job::Callback(callback))
    }

    /// Enqueue one call on CUDA stream `stream` (a `cudaStream_t` as an
    /// integer, e.g. `torch.cuda.current_stream().cuda_stream`) through
    /// the raw device entry points, after every host call issued before
    /// it; returns at once with a handle that is done when the call has
    /// ended on the device.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kind, send, recv, dtype, stream, op="sum", root=0))]
    fn call_device(
        &self,
        py: Python<'_>,
        kind: &str,
        send: (usize, usize),
        recv: (usize, usize),
        dtype: &str,
        stream: usize,
        op: &str,
        root: usize,
    ) -> PyResult<PyHandle> {
        let call = self.call_of(kind, send, recv, dtype, op, root)?;
        // SAFETY: the Python caller passes a tensor's device memory of the
        // given lengths and its current stream; it keeps the tensors alive
        // in the Work.
        let work = self.in_turn(py, |comm| unsafe { run_device(comm, &call, stream) })?;
        let handle = Arc::new(Handle::default());
        {
            let mut s = lock(&handle.state);
            s.done = Some(Ok(()));
            s.device = Some(work);
        }
        Ok(PyHandle { handle })
    }

    /// Whether a failure ended this communicator (never blocks): its
    /// message, or None.
    fn async_error(&self) -> Option<String> {
        let shared = self.shared().ok()?;
        shared.comm.async_error().map(|e| e.to_string())
    }

    /// End every in-flight and queued call with an error, from any
    /// thread; the communicator stays unusable.
    fn abort(&self) {
        if let Ok(shared) = self.shared() {
            shared.comm.abort();
        }
    }

    /// Finish the queued calls, stop the worker thread and drop the
    /// communicator, which leaves the job cleanly. Idempotent; later calls
    /// are refused.
    fn destroy(&self, py: Python<'_>) {
        let tx = lock(&self.jobs).take();
        drop(tx);
        let worker = lock(&self.worker).take();
        let shared = self.slot.write().unwrap_or_else(|p| p.into_inner()).take();
        // The worker may need the GIL for a callback while it drains; the
        // communicator's drop (leaving the job) may wait on its threads.
        py.detach(move || {
            if let Some(w) = worker {
                let _ = w.join();
            }
            // The worker's reference went with it: this drops the
            // communicator unless a call on another thread still holds it
            // (then that call's end does).
            drop(shared);
        });
    }

    fn __repr__(&self) -> String {
        format!(
            "ferroccl.Communicator(rank={}, size={})",
            self.rank, self.size
        )
    }
}

/// The handle of an async call.
#[pyclass(module = "ferroccl._ferroccl", name = "Handle", frozen)]
struct PyHandle {
    handle: Arc<Handle>,
}

#[pymethods]
impl PyHandle {
    /// Wait until the call ends (GIL released); raise its error if it
    /// failed. Bounded by the communicator's timeout.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let r = py.detach(|| {
            let mut s = lock(&self.handle.state);
            while s.done.is_none() {
                s = self.handle.cv.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            s.done.clone().expect("set above")
        });
        r.map_err(|e| e.to_py(py))
    }

    /// Whether the call has ended (`wait` would not block).
    fn is_completed(&self) -> bool {
        let s = lock(&self.handle.state);
        match (&s.done, &s.device) {
            (Some(_), Some(d)) => d.is_complete(),
            (done, _) => done.is_some(),
        }
    }

    /// Wait for a device call to end on the device (host wait); for a host
    /// call the same as `wait`.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let device = lock(&self.handle.state).device.take();
        if let Some(d) = device {
            py.detach(|| d.wait())
                .map_err(|e| FerrocclError::new_err(format!("ferroccl: {e}")))?;
        }
        self.wait(py)
    }

    /// The call's error message if it failed, None if it succeeded or is
    /// still running.
    fn error(&self, py: Python<'_>) -> Option<PyErr> {
        let s = lock(&self.handle.state);
        match &s.done {
            Some(Err(e)) => Some(e.to_py(py)),
            _ => None,
        }
    }

    /// Call `callback()` once the call ends: at once (on this thread) if it
    /// already has, else on the communicator's worker thread.
    fn add_done_callback(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        {
            let mut s = lock(&self.handle.state);
            if s.done.is_none() {
                s.callbacks.push(callback);
                return Ok(());
            }
        }
        callback.call0(py).map(|_| ())
    }
}

/// The element type names the library carries, in its own spelling.
#[pyfunction]
fn data_types() -> Vec<&'static str> {
    DataType::ALL.iter().map(|d| d.name()).collect()
}

/// A random job token.
#[pyfunction]
fn random_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[pymodule]
fn _ferroccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCommunicator>()?;
    m.add_class::<PyHandle>()?;
    m.add("FerrocclError", m.py().get_type::<FerrocclError>())?;
    m.add_function(wrap_pyfunction!(data_types, m)?)?;
    m.add_function(wrap_pyfunction!(random_token, m)?)?;
    Ok(())
}
