//! The extension module `ferroccl._ferroccl`: the library's `Communicator`
//! for Python, reached by (pointer, element count, data type) as the NCCL
//! ABI crate reaches it, so that any host buffer (a numpy array, a torch
//! tensor's storage) is used in place, and device buffers go to the raw
//! device entry points on the caller's stream.
//!
//! Why the `Communicator` class is this one file of about 400 lines: PyO3
//! takes one `#[pymethods]` block per Python class (several need its
//! `multiple-pymethods` feature and the `inventory` crate), so the class's
//! methods stay together here, each stating what is particular to it and
//! leaning on the modules beside it for the shapes they share: `call.rs`
//! (one call as Python named it: its checks, its buffers as slices, its
//! forwarding to the library's host or raw device entry points),
//! `queue.rs` (the worker thread, its queue, the turn a blocking call
//! waits for), `handle.rs` (the `Handle` class of an async call) and
//! `error.rs` (the exception `FerrocclError` and its facts). The Python
//! side of the package is in `ferroccl/*.py`.
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

mod call;
mod error;
mod handle;
mod native;
mod queue;

use call::{run_device, run_host, Call, Kind};
use error::{lib_error, CallError, FerrocclError};
use ferroccl::{Communicator, Config, DataType, ReduceOp};
use handle::{Handle, PyHandle};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use queue::{drained, enqueue, in_worker, run_now, worker_ended, Job, Shared};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A communicator: `ferroccl.Communicator` in Python. Its state is shared
/// (an `Arc`) with the C++ torch backend, which holds it through
/// `native::Api` and may outlive the Python object.
#[pyclass(module = "ferroccl._ferroccl", name = "Communicator", frozen)]
struct PyCommunicator {
    comm: Arc<Comm>,
}

impl std::ops::Deref for PyCommunicator {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.comm
    }
}

/// A Python communicator's state: the library's communicator, its worker
/// and the order of its calls.
pub(crate) struct Comm {
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
        PyCommunicator {
            comm: Arc::new(Comm::new(comm)),
        }
    }
}

impl Comm {
    fn new(comm: Communicator) -> Comm {
        let (shared, tx, worker) = Shared::start(comm);
        let inline_bytes = std::env::var("FERROCCL_PY_INLINE_BYTES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(usize::MAX);
        Comm {
            rank: shared.comm.rank(),
            size: shared.comm.size(),
            timeout: shared.comm.config().timeout.as_secs_f64(),
            slot: std::sync::RwLock::new(Some(shared)),
            jobs: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
            inline_bytes,
        }
    }

    /// The call Python named: the names parsed, a number given.
    fn call_of(
        &self,
        kind: &str,
        send: (usize, usize),
        recv: (usize, usize),
        dtype: &str,
        op: &str,
        root: usize,
    ) -> PyResult<Call> {
        let (kind, dtype, op) = parse_names(kind, dtype, op).map_err(PyValueError::new_err)?;
        self.numbered(kind, send, recv, dtype, op, root)
    }

    /// The call of parsed names, given this communicator's next number.
    fn numbered(
        &self,
        kind: Kind,
        send: (usize, usize),
        recv: (usize, usize),
        dtype: DataType,
        op: ReduceOp,
        root: usize,
    ) -> PyResult<Call> {
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

    /// Issue one call after every call issued before it, without the GIL
    /// (the worker may need it): at once on this thread where nothing is
    /// queued (or from a done-callback on the worker), else on the worker.
    /// The caller keeps the buffers alive and untouched until the handle
    /// is done.
    fn issue(&self, call: Call) -> Result<Arc<Handle>, CallError> {
        let refused = |why: &str| {
            CallError::refused(
                self.rank,
                call.kind.name(),
                call.seq,
                format!("ferroccl rank {}: {}: {why}", self.rank, call.what()),
            )
        };
        let shared = self
            .shared()
            .map_err(|_| refused("the communicator was destroyed"))?;
        let handle = Arc::new(Handle::default());
        if in_worker() {
            // From a done-callback: run now (see `queue::run_callbacks`).
            return Ok(run_now(&shared, &call, handle));
        }
        let jobs = lock(&self.jobs);
        let tx = jobs
            .as_ref()
            .ok_or_else(|| refused("the communicator was destroyed"))?;
        let bytes = call.send_len.max(call.recv_len) * call.dtype.size();
        if bytes <= self.inline_bytes {
            // With nothing queued the call runs at once on this thread:
            // that saves the thread hop (tens of microseconds on a busy
            // machine), and on few cores a worker overlapping the caller's
            // compute only competes with it. Holding the queue keeps other
            // issuers behind it.
            let q = lock(&shared.queue);
            if q.pending == 0 {
                let done = run_now(&shared, &call, handle);
                drop(q);
                return Ok(done);
            }
        }
        enqueue(&shared, tx, Job::Call(call, Arc::clone(&handle)))
            .map_err(|_| refused("the worker thread ended"))?;
        Ok(handle)
    }

    /// Queue `job` (a callback) behind every call issued before it; from
    /// the worker itself it is handed back, to run at once. On a destroyed
    /// communicator it is handed back too: every call issued before has
    /// ended then.
    fn after(&self, job: Job) -> Option<Job> {
        if in_worker() {
            return Some(job);
        }
        let Ok(shared) = self.shared() else {
            return Some(job);
        };
        let jobs = lock(&self.jobs);
        let Some(tx) = jobs.as_ref() else {
            return Some(job);
        };
        enqueue(&shared, tx, job).err()
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
    /// before it; returns its handle. The caller keeps the buffers
    /// untouched until the handle is done; `keep` (the objects that own
    /// them) is held until then, so that dropping the handle early cannot
    /// free memory the call still writes.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (kind, send, recv, dtype, op="sum", root=0, keep=None))]
    fn call_async(
        &self,
        py: Python<'_>,
        kind: &str,
        send: (usize, usize),
        recv: (usize, usize),
        dtype: &str,
        op: &str,
        root: usize,
        keep: Option<Py<PyAny>>,
    ) -> PyResult<PyHandle> {
        let call = self.call_of(kind, send, recv, dtype, op, root)?;
        let handle = py.detach(|| self.issue(call)).map_err(|e| e.to_py(py))?;
        if let Some(k) = keep {
            handle.keep(k);
        }
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
        enqueue(&shared, tx, Job::Callback(callback)).map_err(|_| worker_ended())
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
        Ok(PyHandle::of_device(work))
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

    /// A counted reference to this communicator's state for the C++
    /// torch backend, as an address (see `native`): whoever takes it
    /// releases it once through the capsule's `release_comm`.
    fn _native_ref(&self) -> usize {
        native::comm_ref(&self.comm)
    }

    fn __repr__(&self) -> String {
        format!(
            "ferroccl.Communicator(rank={}, size={})",
            self.rank, self.size
        )
    }
}

/// A call's names parsed: the collective, the element type, the
/// reduction; the message of the first unknown one.
fn parse_names(kind: &str, dtype: &str, op: &str) -> Result<(Kind, DataType, ReduceOp), String> {
    let kind =
        Kind::from_name(kind).ok_or_else(|| format!("ferroccl: unknown collective {kind:?}"))?;
    let dtype = DataType::from_name(dtype).ok_or_else(|| {
        format!(
            "ferroccl: {}: element type {dtype:?} is not one the library carries",
            kind.name()
        )
    })?;
    let op = ReduceOp::from_name(op).ok_or_else(|| {
        format!(
            "ferroccl: {}: reduction {op:?} is not one of sum, prod, min, max, avg",
            kind.name()
        )
    })?;
    Ok((kind, dtype, op))
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
    m.add("native_api", native::capsule(m.py())?)?;
    Ok(())
}
