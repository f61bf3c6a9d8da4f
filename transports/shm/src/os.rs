//! The operating-system calls that std does not offer: whether a process
//! still lives, reserving a file's blocks, whether a directory is writable,
//! and reading another process's memory. With `ring` and `region`, the only
//! `unsafe` of the crate.

use std::fs::File;
use std::os::fd::AsRawFd;

/// Whether process `pid` is gone: it does not exist, or it is a zombie
/// (killed but not yet reaped by its parent, which `kill(pid, 0)` still
/// reports as present).
pub(crate) fn process_gone(pid: u32) -> bool {
    let Ok(raw) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if raw <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks that the
    // process exists and may be signalled. No memory is passed.
    let rc = unsafe { libc::kill(raw, 0) };
    if rc != 0 {
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    // "pid (comm) S ...": the state follows the last ')'.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state == 'Z' || state == 'X'),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Reserve `len` bytes of `file` so that a full /dev/shm is an error here
/// rather than a SIGBUS on first touch of a slot.
pub(crate) fn reserve(file: &File, len: u64) -> std::io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| std::io::Error::other("segment too large"))?;
    // SAFETY: the descriptor is open for writing for the duration of the
    // call (borrowed from `file`); no memory is passed.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// Whether this process may create files in `dir`.
pub(crate) fn dir_writable(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a NUL-terminated string that lives across the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) == 0 }
}

/// The other process `pid` as the kernel names it: refused where it is
/// this process (`what`: "read" or "write") or no process id.
fn other_process(pid: u32, what: &str) -> std::io::Result<libc::pid_t> {
    if pid == std::process::id() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("cross-memory {what} of this process's own memory"),
        ));
    }
    libc::pid_t::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no such process id"))
}

/// Run `step(done, remote + done)` (one system call over the bytes from
/// `done` on, returning how many it moved or -1) until `len` bytes have
/// moved: the kernel may move fewer than asked.
fn in_steps(
    remote: usize,
    len: usize,
    what: &str,
    mut step: impl FnMut(usize, usize) -> isize,
) -> std::io::Result<()> {
    let mut done = 0;
    while done < len {
        let at = remote.checked_add(done).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "address overflow")
        })?;
        let n = step(done, at);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("cross-memory {what} stopped after {done} of {len} bytes"),
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Copy `local.len()` bytes from address `remote` of process `pid` into
/// `local` with `process_vm_readv` (cross-memory attach: one copy, by the
/// kernel, with the caller's permission to ptrace `pid`). Fails rather than
/// reading this process's own memory (`pid` is this process): the kernel
/// would write into `local` from memory the caller may also hold.
pub(crate) fn read_process_memory(
    pid: u32,
    remote: usize,
    local: &mut [u8],
) -> std::io::Result<()> {
    let raw = other_process(pid, "read")?;
    let len = local.len();
    in_steps(remote, len, "read", |done, from| {
        let rest = &mut local[done..];
        let here = libc::iovec {
            iov_base: rest.as_mut_ptr().cast(),
            iov_len: rest.len(),
        };
        let there = libc::iovec {
            iov_base: from as *mut libc::c_void,
            iov_len: rest.len(),
        };
        // SAFETY: `here` describes `rest`, memory of this process borrowed
        // mutably for the call, so the kernel writes only bytes this call
        // owns; `there` names memory of another process (checked above),
        // which the kernel reads or refuses (EFAULT, EPERM, ESRCH) without
        // touching this process's memory. One iovec each; no flags.
        unsafe { libc::process_vm_readv(raw, &here, 1, &there, 1, 0) }
    })
}

/// Copy `local` to address `remote` of process `pid` with
/// `process_vm_writev` ([`read_process_memory`] the other way). Fails
/// rather than writing this process's own memory.
pub(crate) fn write_process_memory(pid: u32, remote: usize, local: &[u8]) -> std::io::Result<()> {
    let raw = other_process(pid, "write")?;
    in_steps(remote, local.len(), "write", |done, to| {
        let rest = &local[done..];
        let here = libc::iovec {
            iov_base: rest.as_ptr() as *mut libc::c_void,
            iov_len: rest.len(),
        };
        let there = libc::iovec {
            iov_base: to as *mut libc::c_void,
            iov_len: rest.len(),
        };
        // SAFETY: `here` describes `rest`, memory of this process borrowed
        // for the call, which the kernel only reads (the pointer is mutable
        // only because iovec's is); `there` names memory of another process
        // (checked above), which the kernel writes or refuses (EFAULT,
        // EPERM, ESRCH) without touching this process's memory. One iovec
        // each; no flags.
        unsafe { libc::process_vm_writev(raw, &here, 1, &there, 1, 0) }
    })
}
