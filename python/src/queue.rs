//! The order of a Python communicator's calls: its worker thread, the
//! queue of async calls and callbacks it runs in issue order, and the turn
//! a blocking call waits for.

use crate::call::{run_host, Call};
use crate::handle::Handle;
use crate::lock;
use ferroccl::Communicator;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

thread_local! {
    /// This thread is a communicator's worker: calls it issues (from a
    /// done-callback) run at once, on it.
    static IN_WORKER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is a communicator's worker (see `IN_WORKER`).
pub(crate) fn in_worker() -> bool {
    IN_WORKER.with(|w| w.get())
}

/// Run done-callbacks under the GIL, on the worker, before it takes the
/// next queued call. Calls a callback issues run at once on the worker
/// (see `IN_WORKER`), so every rank runs them right after the call whose
/// callback issued them, whatever other threads queued meanwhile: the
/// order stays the same on every rank (PowerSGD's hooks issue and wait
/// for calls from callbacks).
pub(crate) fn run_callbacks(callbacks: Vec<Py<PyAny>>) {
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
pub(crate) struct Queue {
    /// Async calls issued and not yet finished.
    pub(crate) pending: usize,
}

/// A communicator and what orders its calls: held by the Python object,
/// its worker and every call running.
pub(crate) struct Shared {
    pub(crate) comm: Communicator,
    pub(crate) queue: Mutex<Queue>,
    pub(crate) drained: Condvar,
    pub(crate) seq: AtomicU64,
}

impl Shared {
    /// A new communicator's shared state, and its worker thread, which
    /// runs the jobs sent on the returned queue in order until the queue
    /// is dropped.
    pub(crate) fn start(
        comm: Communicator,
    ) -> (Arc<Shared>, mpsc::Sender<Job>, std::thread::JoinHandle<()>) {
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
                        Job::Native(cb) => cb.run(),
                    }
                    let mut q = lock(&s.queue);
                    q.pending -= 1;
                    if q.pending == 0 {
                        s.drained.notify_all();
                    }
                }
            })
            .expect("spawning a thread");
        (shared, tx, worker)
    }
}

/// What the worker runs, in issue order.
pub(crate) enum Job {
    /// A call and the handle to finish.
    Call(Call, Arc<Handle>),
    /// A Python callable to call (under the GIL) once every call issued
    /// before it has ended.
    Callback(Py<PyAny>),
    /// The same for a C function (the C++ torch backend's futures), called
    /// without the GIL.
    Native(NativeCallback),
}

/// A C function and its argument, called once (see `Job::Native`).
pub(crate) struct NativeCallback {
    pub(crate) f: unsafe extern "C" fn(*mut std::ffi::c_void),
    pub(crate) ctx: *mut std::ffi::c_void,
}

// SAFETY: the C++ caller hands over `ctx` to be used on the worker thread
// (its callback is written for that: it takes what it needs under its
// own locks and the GIL).
unsafe impl Send for NativeCallback {}

impl NativeCallback {
    pub(crate) fn run(self) {
        // SAFETY: `f` and `ctx` come together from the C++ caller, which
        // promises `f(ctx)` may be called once, from any thread.
        unsafe { (self.f)(self.ctx) }
    }
}

/// Queue `job` for the worker, behind every job queued before it; it
/// counts as pending until the worker has run it.
/// A job the worker can no longer take (its thread ended) is handed back.
pub(crate) fn enqueue(shared: &Shared, tx: &mpsc::Sender<Job>, job: Job) -> Result<(), Job> {
    lock(&shared.queue).pending += 1;
    tx.send(job).map_err(|mpsc::SendError(job)| {
        lock(&shared.queue).pending -= 1;
        job
    })
}

/// The Python error of a job the worker could not take.
pub(crate) fn worker_ended() -> PyErr {
    PyRuntimeError::new_err("ferroccl: the worker thread ended")
}

/// Wait (GIL released by the caller) until no async call is pending.
pub(crate) fn drained(shared: &Shared) -> MutexGuard<'_, Queue> {
    let mut q = lock(&shared.queue);
    while q.pending > 0 {
        q = shared.drained.wait(q).unwrap_or_else(|p| p.into_inner());
    }
    q
}

/// Run an async call at once on the issuing thread (GIL not held) and
/// hand back its finished handle: where nothing is queued ahead of it, or
/// from a done-callback on the worker.
pub(crate) fn run_now(shared: &Shared, call: &Call, handle: Arc<Handle>) -> Arc<Handle> {
    // SAFETY: the caller keeps the buffers for the call alive and
    // untouched until its handle is done, which is before this returns.
    let r = unsafe { run_host(&shared.comm, call) };
    // A fresh handle has no callbacks yet: nothing to run.
    drop(handle.finish(r));
    handle
}
