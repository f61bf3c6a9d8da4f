//! The C entry points of `include/nccl.h`, one file per family:
//! `life` (making and ending communicators), `info` (errors and
//! queries), `memory` (registration and allocation), `collectives`,
//! `p2p_group` (send, receive and groups) and `unsupported` (newer entry
//! points refused with a message). The checks on pointers from C that
//! every family shares are here.
//!
//! Every function here is `#[no_mangle]`: the symbols of `libnccl.so.2`
//! are these names whatever module holds them.

use crate::abi::result;
use crate::comm::{Core, Handle};
use crate::status::Failure;
use crate::NcclComm;
use std::ffi::c_int;
use std::sync::Arc;

/// Declares entry points that only forward to one checked path: each
/// `fn name(args) => target(values);` becomes `#[no_mangle] pub unsafe
/// extern "C" fn name(args) -> c_int` returning
/// `target(stringify!(name), values)`, with the doc comments given (each
/// with its `# Safety`). What the target requires is what the entry
/// point's caller vouches for, so the forwarding needs no check of its own.
macro_rules! forward {
    ($(
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $target:ident($($value:expr),* $(,)?);
    )*) => {$(
        $(#[$meta])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            // SAFETY: the caller vouches for this entry point's `# Safety`,
            // which is what the target requires; the arguments pass
            // unchanged.
            unsafe { $target(stringify!($name), $($value),*) }
        }
    )*};
}

pub mod collectives;
pub mod info;
pub mod life;
pub mod memory;
pub mod p2p_group;
pub mod unsupported;

fn out<T>(ptr: *mut T, what: &str) -> Result<*mut T, Failure> {
    if ptr.is_null() {
        Err(Failure::invalid_argument(format!("{what} is NULL")))
    } else {
        Ok(ptr)
    }
}

/// Store `value` through a checked output pointer.
///
/// # Safety
/// `ptr` is NULL (refused) or valid for a write of a `T`.
unsafe fn put<T>(ptr: *mut T, what: &str, value: T) -> Result<c_int, Failure> {
    let ptr = out(ptr, what)?;
    // SAFETY: non-NULL, and the caller vouches that it is writable.
    unsafe { ptr.write(value) };
    Ok(result::SUCCESS)
}

/// The handle behind `comm` and its live communicator.
///
/// # Safety
/// As [`Handle::from_c`].
unsafe fn live<'a>(comm: NcclComm) -> Result<(&'a Handle, Arc<Core>), Failure> {
    // SAFETY: forwarded.
    let h = unsafe { Handle::from_c(comm)? };
    Ok((h, h.core()?))
}
