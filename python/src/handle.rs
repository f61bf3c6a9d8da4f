//! The handle of an async call: where it stands, the callbacks to run at
//! its end, and the `Handle` class Python waits on.

use crate::error::{CallError, FerrocclError};
use crate::lock;
use pyo3::prelude::*;
use std::sync::{Arc, Condvar, Mutex};

/// Where a call stands.
#[derive(Default)]
struct HandleState {
    done: Option<Result<(), CallError>>,
    /// Python callables to call (with no argument) once done.
    callbacks: Vec<Py<PyAny>>,
    /// A device call's host-side wait, kept so that its end can be asked.
    device: Option<ferroccl::DeviceWork>,
    /// What holds the call's buffers (Python objects), released when the
    /// call ends, so that a queued call's buffers live until then even if
    /// the caller drops its `Work`.
    keep: Option<Py<PyAny>>,
}

#[derive(Default)]
pub(crate) struct Handle {
    state: Mutex<HandleState>,
    cv: Condvar,
}

impl Handle {
    /// Record how the call ended; returns the callbacks to run.
    pub(crate) fn finish(&self, r: Result<(), CallError>) -> Vec<Py<PyAny>> {
        let (callbacks, keep) = {
            let mut s = lock(&self.state);
            s.done = Some(r);
            (std::mem::take(&mut s.callbacks), s.keep.take())
        };
        self.cv.notify_all();
        // Released without the GIL where it is not held: Python takes the
        // reference back the next time a thread holds it.
        drop(keep);
        callbacks
    }

    /// Hold `keep` until the call ends (at once dropped if it has).
    pub(crate) fn keep(&self, keep: Py<PyAny>) {
        let mut s = lock(&self.state);
        if s.done.is_none() {
            s.keep = Some(keep);
        }
    }

    /// A handle that ended before it was issued (a refused call).
    pub(crate) fn failed(e: CallError) -> Arc<Handle> {
        let handle = Arc::new(Handle::default());
        lock(&handle.state).done = Some(Err(e));
        handle
    }

    /// Wait until the call ends (the caller must not hold the GIL: the
    /// worker may need it for a callback); its result. Bounded by the
    /// communicator's timeout.
    pub(crate) fn wait(&self) -> Result<(), CallError> {
        let mut s = lock(&self.state);
        while s.done.is_none() {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.done.clone().expect("set above")
    }

    /// Whether the call has ended (on the device too, for a device call).
    pub(crate) fn is_completed(&self) -> bool {
        let s = lock(&self.state);
        match (&s.done, &s.device) {
            (Some(_), Some(d)) => d.is_complete(),
            (done, _) => done.is_some(),
        }
    }

    /// The call's error, if it ended with one.
    pub(crate) fn error(&self) -> Option<CallError> {
        match &lock(&self.state).done {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        }
    }
}

/// The handle of an async call.
#[pyclass(module = "ferroccl._ferroccl", name = "Handle", frozen)]
pub(crate) struct PyHandle {
    pub(crate) handle: Arc<Handle>,
}

impl PyHandle {
    /// The handle of a device call the stream has been given: done on the
    /// host, its end on the device asked of `work`.
    pub(crate) fn of_device(work: ferroccl::DeviceWork) -> PyHandle {
        let handle = Arc::new(Handle::default());
        {
            let mut s = lock(&handle.state);
            s.done = Some(Ok(()));
            s.device = Some(work);
        }
        PyHandle { handle }
    }
}

#[pymethods]
impl PyHandle {
    /// Wait until the call ends (GIL released); raise its error if it
    /// failed. Bounded by the communicator's timeout.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.handle.wait()).map_err(|e| e.to_py(py))
    }

    /// Whether the call has ended (`wait` would not block).
    fn is_completed(&self) -> bool {
        self.handle.is_completed()
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
        self.handle.error().map(|e| e.to_py(py))
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
