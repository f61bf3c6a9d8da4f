//! The Python exception `FerrocclError` and the facts it carries.

use crate::call::Call;
use ferroccl::{Communicator, Error};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

pyo3::create_exception!(
    _ferroccl,
    FerrocclError,
    PyRuntimeError,
    "A ferroccl call failed. Attributes: `rank` (this rank), `call` (the \
     collective), `seq` (its number on this communicator, from 1), \
     `failed_rank` (the rank blamed, or None), `kind` (the library's error \
     variant)."
);

/// A failed call, with the facts the Python exception carries.
#[derive(Debug, Clone)]
pub(crate) struct CallError {
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
    pub(crate) fn new(comm: &Communicator, c: &Call, e: Error) -> CallError {
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

    /// A call refused before it ran (the communicator destroyed, a name
    /// the library does not know), with the call's name.
    pub(crate) fn refused(rank: usize, call: &'static str, seq: u64, message: String) -> CallError {
        CallError {
            rank: Some(rank),
            call,
            seq,
            failed_rank: None,
            kind: "InvalidArgument",
            message,
        }
    }

    /// The message, as the Python exception's text.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn to_py(&self, py: Python<'_>) -> PyErr {
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
pub(crate) fn lib_error(e: Error) -> PyErr {
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
