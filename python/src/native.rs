//! The C face of a Python communicator, for the C++ torch backend
//! (`ferroccl/csrc/c10d_backend.cpp`): a table of C functions in a capsule
//! (`ferroccl._ferroccl.native_api`) and, per communicator, a counted
//! reference to its state (`Communicator._native_ref()`).
//!
//! A call issued here is the call `Communicator.call_async` issues: the
//! same names, checks, numbering, queue and handle, so calls from C++ and
//! from Python on one communicator keep one order. Nothing here needs the
//! GIL except `raise_error`, which sets a Python exception.
//!
//! The table's layout is a contract with the C++ file: a change to either
//! changes `VERSION`, which the C++ side checks before using the table.

use crate::call::Kind;
use crate::error::CallError;
use crate::handle::Handle;
use crate::queue::{Job, NativeCallback};
use crate::{parse_names, Comm};
use pyo3::prelude::*;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Arc;

/// The layout version of `Api` (checked by the C++ side).
pub(crate) const VERSION: u32 = 1;

/// The capsule's name, as the C++ side asks for it.
pub(crate) const CAPSULE: &CStr = c"ferroccl._ferroccl.native_api";

/// A C callback and its argument.
type NativeFn = unsafe extern "C" fn(*mut c_void);

/// The functions the C++ backend calls. `comm` is a reference from
/// `Communicator._native_ref()`; `h` a handle from `issue`. Every handle
/// is released once, every reference once.
#[repr(C)]
pub(crate) struct Api {
    version: u32,
    /// Issue a call (names as `Communicator.call_async` takes them;
    /// buffers as address and element count): a handle, never null. A
    /// call refused before it runs (destroyed communicator, unknown name)
    /// returns a handle that ended with the error.
    issue: unsafe extern "C" fn(
        comm: *const c_void,
        kind: *const c_char,
        send: usize,
        send_len: usize,
        recv: usize,
        recv_len: usize,
        dtype: *const c_char,
        op: *const c_char,
        root: usize,
    ) -> *const c_void,
    /// Call `f(ctx)` once, on the communicator's worker, after every call
    /// issued before this has ended; at once where the caller is that
    /// worker or the communicator was destroyed.
    after: unsafe extern "C" fn(comm: *const c_void, f: NativeFn, ctx: *mut c_void),
    /// Wait until the call ends (call it without the GIL).
    wait: unsafe extern "C" fn(h: *const c_void),
    /// 1 once the call has ended, else 0.
    done: unsafe extern "C" fn(h: *const c_void) -> i32,
    /// 1 if the call ended with an error, else 0.
    failed: unsafe extern "C" fn(h: *const c_void) -> i32,
    /// With the GIL held: if the call ended with an error, set it as the
    /// current Python exception (a `FerrocclError` with its facts) and
    /// return 1; else 0.
    raise_error: unsafe extern "C" fn(h: *const c_void) -> i32,
    /// Copy the error's message (NUL-terminated, cut to `cap` bytes) into
    /// `buf`; the message's full length, 0 where there is no error.
    message: unsafe extern "C" fn(h: *const c_void, buf: *mut c_char, cap: usize) -> usize,
    /// Release a handle.
    release: unsafe extern "C" fn(h: *const c_void),
    /// Release a communicator reference.
    release_comm: unsafe extern "C" fn(comm: *const c_void),
}

/// The table, in a capsule for the module.
pub(crate) fn capsule(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyCapsule>> {
    let api = Api {
        version: VERSION,
        issue,
        after,
        wait,
        done,
        failed,
        raise_error,
        message,
        release,
        release_comm,
    };
    pyo3::types::PyCapsule::new_with_value(py, api, CAPSULE)
}

/// A counted reference to `comm` for the C++ side (released with
/// `release_comm`).
pub(crate) fn comm_ref(comm: &Arc<Comm>) -> usize {
    Arc::into_raw(Arc::clone(comm)) as usize
}

/// # Safety
/// `p` is a reference from `comm_ref`, not yet released.
unsafe fn comm<'a>(p: *const c_void) -> &'a Comm {
    // SAFETY: the caller's contract: `p` came from `Arc::into_raw` and the
    // reference it stands for is still held.
    unsafe { &*(p as *const Comm) }
}

/// # Safety
/// `h` is a handle from `issue`, not yet released.
unsafe fn handle<'a>(h: *const c_void) -> &'a Handle {
    // SAFETY: as for `comm`: from `Arc::into_raw` in `issue`, still held.
    unsafe { &*(h as *const Handle) }
}

/// # Safety
/// `p` is a NUL-terminated string (or null).
unsafe fn text<'a>(p: *const c_char) -> &'a str {
    if p.is_null() {
        return "";
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn issue(
    c: *const c_void,
    kind: *const c_char,
    send: usize,
    send_len: usize,
    recv: usize,
    recv_len: usize,
    dtype: *const c_char,
    op: *const c_char,
    root: usize,
) -> *const c_void {
    // SAFETY: the C++ side passes a held reference and C strings.
    let (c, kind, dtype, op) = unsafe { (comm(c), text(kind), text(dtype), text(op)) };
    let refused = |call: &'static str, why: String| {
        Handle::failed(CallError::refused(
            c.rank,
            call,
            0,
            format!("ferroccl rank {}: {call}: {why}", c.rank),
        ))
    };
    let handle = match parse_names(kind, dtype, op) {
        Err(why) => refused(Kind::from_name(kind).map_or("call", Kind::name), why),
        Ok((k, d, o)) => match c.numbered(k, (send, send_len), (recv, recv_len), d, o, root) {
            Err(_) => refused(k.name(), "the communicator was destroyed".into()),
            Ok(call) => c.issue(call).unwrap_or_else(Handle::failed),
        },
    };
    Arc::into_raw(handle) as *const c_void
}

unsafe extern "C" fn after(c: *const c_void, f: NativeFn, ctx: *mut c_void) {
    // SAFETY: the C++ side passes a held reference.
    let c = unsafe { comm(c) };
    if let Some(Job::Native(cb)) = c.after(Job::Native(NativeCallback { f, ctx })) {
        cb.run();
    }
}

unsafe extern "C" fn wait(h: *const c_void) {
    // SAFETY: a held handle. Its result is read with `failed`/`message`.
    let _ = unsafe { handle(h) }.wait();
}

unsafe extern "C" fn done(h: *const c_void) -> i32 {
    // SAFETY: a held handle.
    i32::from(unsafe { handle(h) }.is_completed())
}

unsafe extern "C" fn failed(h: *const c_void) -> i32 {
    // SAFETY: a held handle.
    i32::from(unsafe { handle(h) }.error().is_some())
}

unsafe extern "C" fn raise_error(h: *const c_void) -> i32 {
    // SAFETY: a held handle.
    let Some(e) = unsafe { handle(h) }.error() else {
        return 0;
    };
    // SAFETY: the C++ side calls this with the GIL held (its contract),
    // which is what `assume_attached` requires.
    let py = unsafe { Python::assume_attached() };
    e.to_py(py).restore(py);
    1
}

unsafe extern "C" fn message(h: *const c_void, buf: *mut c_char, cap: usize) -> usize {
    // SAFETY: a held handle.
    let Some(e) = unsafe { handle(h) }.error() else {
        return 0;
    };
    let m = e.message().as_bytes();
    if !buf.is_null() && cap > 0 {
        let n = m.len().min(cap - 1);
        // SAFETY: the C++ side gives `cap` writable bytes at `buf`; `n + 1`
        // of them are written.
        unsafe {
            std::ptr::copy_nonoverlapping(m.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
    }
    m.len()
}

unsafe extern "C" fn release(h: *const c_void) {
    // SAFETY: a handle from `issue` (`Arc::into_raw`), released once.
    drop(unsafe { Arc::from_raw(h as *const Handle) });
}

unsafe extern "C" fn release_comm(c: *const c_void) {
    // SAFETY: a reference from `comm_ref` (`Arc::into_raw`), released once.
    drop(unsafe { Arc::from_raw(c as *const Comm) });
}
