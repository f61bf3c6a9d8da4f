//! What an entry point returns: a result code, the message behind it for
//! `ncclGetLastError`, and the guard that keeps panics on this side of the
//! C boundary.

use std::ffi::{c_char, c_int, CString};
use std::sync::Mutex;

/// `ncclResult_t` values.
pub mod result {
    use std::ffi::c_int;
    /// `ncclSuccess`
    pub const SUCCESS: c_int = 0;
    /// `ncclUnhandledCudaError`
    pub const UNHANDLED_CUDA_ERROR: c_int = 1;
    /// `ncclSystemError`
    pub const SYSTEM_ERROR: c_int = 2;
    /// `ncclInternalError`
    pub const INTERNAL_ERROR: c_int = 3;
    /// `ncclInvalidArgument`
    pub const INVALID_ARGUMENT: c_int = 4;
    /// `ncclInvalidUsage`
    pub const INVALID_USAGE: c_int = 5;
    /// `ncclRemoteError`
    pub const REMOTE_ERROR: c_int = 6;
    /// `ncclInProgress`
    pub const IN_PROGRESS: c_int = 7;
    /// `ncclTimeout` (newer headers only; this library reports a peer that
    /// did not answer as `ncclRemoteError`, which every caller knows).
    pub const TIMEOUT: c_int = 8;
}

/// A refused or failed call: NCCL's code and the message for
/// `ncclGetLastError`.
#[derive(Debug, Clone)]
pub struct Failure {
    /// An `ncclResult_t` other than success.
    pub code: c_int,
    /// What went wrong, naming the argument or the peer.
    pub message: String,
}

impl Failure {
    /// `ncclInvalidArgument` with `message`.
    pub fn invalid_argument(message: impl Into<String>) -> Failure {
        Failure {
            code: result::INVALID_ARGUMENT,
            message: message.into(),
        }
    }

    /// `ncclInvalidUsage` with `message`.
    pub fn invalid_usage(message: impl Into<String>) -> Failure {
        Failure {
            code: result::INVALID_USAGE,
            message: message.into(),
        }
    }

    /// `ncclInternalError` with `message`.
    pub fn internal(message: impl Into<String>) -> Failure {
        Failure {
            code: result::INTERNAL_ERROR,
            message: message.into(),
        }
    }
}

/// The code of one of the library's errors.
pub fn code_of(e: &ferroccl::Error) -> c_int {
    use ferroccl::Error as E;
    match e {
        E::InvalidArgument(_) | E::Env(_) => result::INVALID_ARGUMENT,
        E::Bootstrap(_) | E::Io(_) | E::Connect { .. } => result::SYSTEM_ERROR,
        E::Timeout { .. }
        | E::PeerFailed { .. }
        | E::Mismatch { .. }
        | E::Protocol { .. }
        | E::Aborted(_) => result::REMOTE_ERROR,
        E::NoDevice(_) => result::UNHANDLED_CUDA_ERROR,
    }
}

impl From<ferroccl::Error> for Failure {
    fn from(e: ferroccl::Error) -> Failure {
        Failure {
            code: code_of(&e),
            message: e.to_string(),
        }
    }
}

/// The last error of the process (NCCL keeps one, not one per
/// communicator): set by every failed entry point.
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());

thread_local! {
    /// The copy `ncclGetLastError` last handed this thread: valid until the
    /// thread's next call of it.
    static HANDED_OUT: std::cell::RefCell<CString> = std::cell::RefCell::new(CString::default());
}

/// Record `message` as the last error.
pub fn set_last_error(message: String) {
    *LAST_ERROR.lock().unwrap_or_else(|p| p.into_inner()) = message;
}

/// The last error as a C string owned by this thread.
pub fn last_error_ptr() -> *const c_char {
    let text = LAST_ERROR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .replace('\0', " ");
    let text = CString::new(text).unwrap_or_default();
    HANDED_OUT.with(|cell| {
        *cell.borrow_mut() = text;
        cell.borrow().as_ptr()
    })
}

/// Run entry point `name`: its failure becomes its code and the last
/// error; a panic becomes `ncclInternalError` and never crosses into C.
pub fn entry(name: &str, body: impl FnOnce() -> Result<c_int, Failure>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(code)) => code,
        Ok(Err(failure)) => {
            // Messages built from a call's description already name the
            // entry point: name it once.
            let named = failure
                .message
                .strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(':'));
            set_last_error(if named {
                failure.message
            } else {
                format!("{name}: {}", failure.message)
            });
            failure.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            set_last_error(format!("{name}: internal error: {what}"));
            result::INTERNAL_ERROR
        }
    }
}

/// An entry point that does nothing yet: `ncclInvalidUsage` and why.
pub fn unsupported(name: &str, why: &str) -> c_int {
    entry(name, || {
        Err(Failure::invalid_usage(format!(
            "not supported by ferroccl yet: {why}"
        )))
    })
}
