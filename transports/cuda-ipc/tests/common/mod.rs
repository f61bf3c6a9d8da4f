//! Both halves of a test that crosses processes: the test binary runs
//! itself again, only its `child_process_side` test, with one end of a
//! socket pair inherited and named in an environment variable.

use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

/// Starts this test binary again as the child, handing it `child`'s end
/// of the pair (named in `env`); the parent's copy of that end is closed.
pub fn spawn_child(env: &str, child: UnixStream) -> Child {
    let child_fd = child.as_raw_fd();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_process_side",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(env, child_fd.to_string())
    // The child's test report is not ours; its panics go to stderr.
    .stdout(Stdio::null());
    // SAFETY: between fork and exec the closure only calls fcntl, which is
    // async-signal-safe: the child's end of the pair survives exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(child_fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let proc = cmd.spawn().unwrap();
    drop(child);
    proc
}

/// In the child: the socket the parent handed over, or `None` in an
/// ordinary run (the variable is not set).
pub fn inherited_socket(env: &str) -> Option<UnixStream> {
    let fd: i32 = std::env::var(env).ok()?.parse().unwrap();
    // SAFETY: the parent passed us this descriptor, ours alone now.
    Some(unsafe { UnixStream::from_raw_fd(fd) })
}
