//! Signals: SIGINT, SIGTERM and SIGHUP delivered to the launcher become
//! bytes on a self-pipe that the supervising loop polls, and signals go out
//! to each rank's process group. It owns the process-wide signal handlers
//! while a launch runs and nothing else.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Write end of the self-pipe that the signal handler writes to; -1 when no
/// launch is running.
static SIGNAL_PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

/// One launch at a time per process: the signal handler is process-wide.
pub(crate) static LAUNCH_LOCK: Mutex<()> = Mutex::new(());

/// Signals passed on to the ranks. SIGHUP too: the ranks live in process
/// groups of their own, so a closing terminal would not reach them.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_PIPE_WRITE.load(Ordering::SeqCst);
    if fd < 0 {
        return;
    }
    let byte = sig as u8;
    #[cfg(target_os = "linux")]
    // SAFETY: __errno_location returns this thread's errno slot, valid for
    // the thread's life; saving it keeps the interrupted code's errno intact.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: write(2) is async-signal-safe; `fd` is the write end of our
    // non-blocking pipe (a full pipe only loses a duplicate wake-up), and
    // `byte` lives on this stack frame for the call.
    unsafe {
        libc::write(fd, (&byte as *const u8).cast(), 1);
    }
    #[cfg(target_os = "linux")]
    // SAFETY: as above.
    unsafe {
        *libc::__errno_location() = saved
    };
}

/// SIGINT and SIGTERM delivered to the launcher, turned into bytes on a pipe
/// that the launch loop polls. Restores the previous handlers when dropped.
pub(crate) struct SignalPipe {
    read_fd: libc::c_int,
    write_fd: libc::c_int,
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalPipe {
    pub(crate) fn install() -> Result<SignalPipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(Error::Io(format!(
                "cannot create the signal pipe: {}",
                std::io::Error::last_os_error()
            )));
        }
        for fd in fds {
            // SAFETY: fcntl on descriptors we just created; children must
            // not inherit them and neither end may block.
            unsafe {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                let fl = libc::fcntl(fd, libc::F_GETFL);
                libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
        }
        let mut pipe = SignalPipe {
            read_fd: fds[0],
            write_fd: fds[1],
            previous: Vec::new(),
        };
        SIGNAL_PIPE_WRITE.store(fds[1], Ordering::SeqCst);
        for sig in FORWARDED {
            // SAFETY: a zeroed sigaction is a valid "no flags, empty mask"
            // value; we then fill the handler and mask.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            // SAFETY: sa_mask is a valid sigset_t inside `action`.
            unsafe { libc::sigemptyset(&mut action.sa_mask) };
            // SAFETY: see the zeroed value above; sigaction fills `old`.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: both pointers are to live sigaction values; the handler
            // only does async-signal-safe work.
            if unsafe { libc::sigaction(sig, &action, &mut old) } != 0 {
                return Err(Error::Io(format!(
                    "cannot install a handler for signal {sig}: {}",
                    std::io::Error::last_os_error()
                )));
            }
            pipe.previous.push((sig, old));
        }
        Ok(pipe)
    }

    /// Wait until a signal arrives or `timeout` passes; return the signals
    /// received.
    pub(crate) fn wait(&self, timeout: Duration) -> Vec<libc::c_int> {
        let mut pfd = libc::pollfd {
            fd: self.read_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd; poll only writes its revents.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        let mut got = Vec::new();
        let mut buf = [0u8; 16];
        loop {
            // SAFETY: reading into a stack buffer of the given length from
            // our non-blocking pipe.
            let n = unsafe { libc::read(self.read_fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            got.extend(buf[..n as usize].iter().map(|&b| libc::c_int::from(b)));
        }
        got
    }
}

impl Drop for SignalPipe {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores the action saved by install for this signal.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
        SIGNAL_PIPE_WRITE.store(-1, Ordering::SeqCst);
        // SAFETY: closing the descriptors we created; no handler refers to
        // them any more.
        unsafe {
            libc::close(self.read_fd);
            libc::close(self.write_fd);
        }
    }
}

/// Send `sig` to the process group led by `pid` (the child and whatever it
/// started). Harmless when the group is gone.
pub(crate) fn signal_group(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a negative pid addresses a process group; each
    // child leads its own group, created at spawn, and a group id is not
    // reused while the group has members.
    unsafe { libc::kill(-(pid as libc::pid_t), sig) };
}
