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
}

#[derive(Default)]
pub(crate) struct Handle {
    state: Mutex<HandleState>,
    cv: Condvar,
}

impl Handle {
    /// Record how the call ended; returns the callbacks to run.
    pub(crate) fn finish(&self, r: Result<(), CallError>) -> Vec<Py<PyAny>> {
        let callbacks = {
            let mut s = lock(&self.state);
            s.done = Some(r);
            std::mem::take(&mut s.callbacks)
        };
        self.cv.notify_all();
        callbacks
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
