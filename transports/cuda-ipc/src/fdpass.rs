//! Passing file descriptors between processes over a Unix-domain stream
//! socket (`SCM_RIGHTS`): how the owner of a VMM allocation hands its
//! POSIX fd handle to the process that maps it.
//!
//! The bytes of a message and the descriptors travel in one `sendmsg`; the
//! kernel attaches the descriptors to the first byte, so a message carries
//! at least one byte. On the receiving side every descriptor that arrives
//! is wrapped in an [`OwnedFd`] at once (it is opened close-on-exec,
//! `MSG_CMSG_CLOEXEC`), so that every error path closes it: more
//! descriptors than expected, a control message the kernel had to cut
//! (`MSG_CTRUNC`), a peer that closed mid-message. Every wait is a
//! `poll(2)` bounded by a deadline; the socket is used with `MSG_DONTWAIT`,
//! whether it is blocking or not, so no call waits past it.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// The most descriptors one message may carry (Linux's `SCM_MAX_FD`).
pub const MAX_FDS_PER_MESSAGE: usize = 253;

/// What went wrong passing descriptors.
#[derive(Debug, thiserror::Error)]
pub enum FdPassError {
    /// A system call on the socket failed.
    #[error("fd passing: {call} on the Unix socket failed: {source}")]
    Io {
        /// The call (`sendmsg`, `recvmsg`, `poll`).
        call: &'static str,
        /// The system's error.
        source: io::Error,
    },
    /// The peer closed its end (or reset it) before the message was
    /// complete.
    #[error(
        "fd passing: the peer closed the Unix socket after {received} of the {expected} \
         bytes of the message"
    )]
    PeerClosed {
        /// Bytes of the message that had arrived (or had been sent).
        received: usize,
        /// Bytes the message has.
        expected: usize,
    },
    /// The deadline passed first.
    #[error("fd passing: timed out after {waited:?} {what}")]
    Timeout {
        /// What was waited for.
        what: String,
        /// How long.
        waited: Duration,
    },
    /// More descriptors arrived than the receiver allowed for (the ones
    /// that arrived have been closed).
    #[error(
        "fd passing: the peer sent more file descriptors than the {max} expected \
         ({received} arrived{}); all of them were closed",
        if *.truncated { ", the kernel cut the rest (MSG_CTRUNC)" } else { "" }
    )]
    TooManyFds {
        /// How many the receiver allowed for.
        max: usize,
        /// How many arrived in this process before being closed.
        received: usize,
        /// Whether the kernel had to cut the control message (then more
        /// were sent than arrived).
        truncated: bool,
    },
    /// A bad argument, found before any system call.
    #[error("fd passing: invalid argument: {0}")]
    InvalidArgument(String),
}

fn io_err(call: &'static str) -> impl FnOnce(io::Error) -> FdPassError {
    move |source| FdPassError::Io { call, source }
}

/// Send all of `payload` with the descriptors `fds` attached to its first
/// byte. The descriptors stay open here (the peer gets its own copies).
/// Waits for room in the socket's buffer until `deadline`; a closed peer
/// is [`FdPassError::PeerClosed`] (no `SIGPIPE`: `MSG_NOSIGNAL`).
///
/// `payload` may not be empty (a stream socket delivers descriptors only
/// with data), and at most [`MAX_FDS_PER_MESSAGE`] descriptors go in one
/// message.
pub fn send_fds(
    sock: &UnixStream,
    payload: &[u8],
    fds: &[BorrowedFd<'_>],
    deadline: Instant,
) -> Result<(), FdPassError> {
    if payload.is_empty() {
        return Err(FdPassError::InvalidArgument(
            "an empty payload (descriptors travel with at least one byte)".into(),
        ));
    }
    if fds.len() > MAX_FDS_PER_MESSAGE {
        return Err(FdPassError::InvalidArgument(format!(
            "{} descriptors in one message, at most {MAX_FDS_PER_MESSAGE}",
            fds.len()
        )));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let start = Instant::now();
    let mut sent = 0;
    while sent < payload.len() {
        // The descriptors go with the first sendmsg that moves any byte.
        let with = if sent == 0 { raw.as_slice() } else { &[] };
        match sendmsg_once(sock.as_raw_fd(), &payload[sent..], with) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_for(sock, libc::POLLOUT, deadline, start, || {
                    format!(
                        "for room to send {} more bytes of a {}-byte message",
                        payload.len() - sent,
                        payload.len()
                    )
                })?;
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET)) => {
                return Err(FdPassError::PeerClosed {
                    received: sent,
                    expected: payload.len(),
                });
            }
            Err(e) => return Err(io_err("sendmsg")(e)),
        }
    }
    Ok(())
}

/// One `sendmsg(MSG_DONTWAIT | MSG_NOSIGNAL)` of `bytes` with `fds` in an
/// `SCM_RIGHTS` control message (none if `fds` is empty).
fn sendmsg_once(sock: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE only computes a size (no memory is touched).
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as libc::c_uint) } as usize;
    // u64 words: the buffer is aligned for cmsghdr (8 bytes on 64-bit).
    let mut control = vec![0u64; space.div_ceil(size_of::<u64>())];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is a plain C struct for which all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` zeroed, aligned bytes, the
        // room CMSG_SPACE asks for one header and `fd_bytes` of data, so
        // CMSG_FIRSTHDR is non-null and the header and the data written
        // through it lie inside `control`.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as libc::c_uint) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                fd_bytes,
            );
        }
    }
    // SAFETY: `msg` points at one iovec over `bytes` (read only by the
    // kernel) and, if any, the control buffer built above; all outlive
    // the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Receive what has arrived, like `recv(2)`: waits (until `deadline`)
/// for data, then returns the bytes one `recvmsg` gave (at least one, at
/// most `payload.len()`) and the descriptors that came with them, each
/// already an [`OwnedFd`] (close-on-exec). A deadline already past still
/// returns what has arrived.
///
/// A stream socket keeps no message boundaries: with a buffer longer
/// than the rest of the current message, the bytes of the next one (and
/// its descriptors) may come in the same call. To keep each message's
/// descriptors with it, read messages of known length with
/// [`recv_exact_fds`].
///
/// Errors, after which every descriptor that arrived is closed:
/// [`FdPassError::TooManyFds`] when more than `max_fds` arrived or the
/// kernel had to cut the control message; [`FdPassError::PeerClosed`]
/// when the peer closed before any byte; [`FdPassError::Timeout`].
/// `payload` may not be empty, and `max_fds` is at most
/// [`MAX_FDS_PER_MESSAGE`].
pub fn recv_fds(
    sock: &UnixStream,
    payload: &mut [u8],
    max_fds: usize,
    deadline: Instant,
) -> Result<(usize, Vec<OwnedFd>), FdPassError> {
    check_recv_args(payload.len(), max_fds)?;
    recv_piece(
        sock,
        payload,
        max_fds,
        deadline,
        Instant::now(),
        0,
        payload.len(),
    )
}

/// Receive exactly `payload.len()` bytes and the descriptors that came
/// with them (at most `max_fds` over the whole message): [`recv_fds`]
/// until the buffer is full. A peer that closes before the last byte is
/// [`FdPassError::PeerClosed`], saying how many had arrived; every error
/// closes the descriptors received so far.
pub fn recv_exact_fds(
    sock: &UnixStream,
    payload: &mut [u8],
    max_fds: usize,
    deadline: Instant,
) -> Result<Vec<OwnedFd>, FdPassError> {
    check_recv_args(payload.len(), max_fds)?;
    let start = Instant::now();
    let expected = payload.len();
    let mut got = 0;
    let mut fds = Vec::new();
    while got < expected {
        let (n, more) = recv_piece(
            sock,
            &mut payload[got..],
            max_fds - fds.len(),
            deadline,
            start,
            got,
            expected,
        )
        .map_err(|e| match e {
            // Say how many descriptors this message brought in all.
            FdPassError::TooManyFds {
                received,
                truncated,
                ..
            } => FdPassError::TooManyFds {
                max: max_fds,
                received: received + fds.len(),
                truncated,
            },
            other => other,
        })?;
        got += n;
        fds.extend(more);
    }
    Ok(fds)
}

fn check_recv_args(len: usize, max_fds: usize) -> Result<(), FdPassError> {
    if len == 0 {
        return Err(FdPassError::InvalidArgument(
            "an empty payload buffer (descriptors travel with at least one byte)".into(),
        ));
    }
    if max_fds > MAX_FDS_PER_MESSAGE {
        return Err(FdPassError::InvalidArgument(format!(
            "max_fds {max_fds} is above the {MAX_FDS_PER_MESSAGE} one message can carry"
        )));
    }
    Ok(())
}

/// One successful `recvmsg` into `buf` (waiting for data until
/// `deadline`); `before` bytes of an `expected`-byte message have already
/// arrived (for the errors' words).
fn recv_piece(
    sock: &UnixStream,
    buf: &mut [u8],
    max_fds: usize,
    deadline: Instant,
    start: Instant,
    before: usize,
    expected: usize,
) -> Result<(usize, Vec<OwnedFd>), FdPassError> {
    loop {
        match recvmsg_once(sock.as_raw_fd(), buf, max_fds) {
            Ok(Received { bytes: 0, .. }) => {
                // End of stream. The kernel never attaches descriptors to
                // no data; anything that came all the same is closed here.
                return Err(FdPassError::PeerClosed {
                    received: before,
                    expected,
                });
            }
            Ok(Received {
                bytes,
                fds,
                truncated,
            }) => {
                if truncated || fds.len() > max_fds {
                    let received = fds.len();
                    drop(fds); // closes every one that arrived
                    return Err(FdPassError::TooManyFds {
                        max: max_fds,
                        received,
                        truncated,
                    });
                }
                return Ok((bytes, fds));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_for(sock, libc::POLLIN, deadline, start, || {
                    format!(
                        "for a message on the Unix socket ({before} of {expected} bytes arrived)"
                    )
                })?;
            }
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => {
                return Err(FdPassError::PeerClosed {
                    received: before,
                    expected,
                });
            }
            Err(e) => return Err(io_err("recvmsg")(e)),
        }
    }
}

/// What one `recvmsg` gave.
struct Received {
    bytes: usize,
    fds: Vec<OwnedFd>,
    /// `MSG_CTRUNC`: the control message did not fit.
    truncated: bool,
}

/// One `recvmsg(MSG_DONTWAIT | MSG_CMSG_CLOEXEC)` with room for `max_fds`
/// descriptors (the rounding and the room for credentials may let a few
/// more in; the caller checks the count) and for the sender's credentials, which the
/// kernel attaches where the socket has `SO_PASSCRED` (they are ignored;
/// without the room they would cut the control message).
fn recvmsg_once(sock: RawFd, buf: &mut [u8], max_fds: usize) -> io::Result<Received> {
    let fd_bytes = max_fds * size_of::<RawFd>();
    // SAFETY: CMSG_SPACE only computes a size.
    let creds = unsafe { libc::CMSG_SPACE(size_of::<libc::ucred>() as libc::c_uint) } as usize;
    let space = if max_fds == 0 {
        creds
    } else {
        // SAFETY: CMSG_SPACE only computes a size.
        creds + unsafe { libc::CMSG_SPACE(fd_bytes as libc::c_uint) as usize }
    };
    let mut control = vec![0u64; space.div_ceil(size_of::<u64>())];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is a plain C struct for which all-zero is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf` and
    // at most `msg_controllen` bytes into `control`, both live and
    // exclusively borrowed for the call.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let truncated = msg.msg_flags & libc::MSG_CTRUNC != 0;
    let mut fds = Vec::new();
    {
        let end = control.as_ptr() as usize + (msg.msg_controllen as usize).min(space);
        // SAFETY: the kernel set msg_controllen to the bytes of control
        // data it wrote into `control` (at most `space`); CMSG_FIRSTHDR
        // and CMSG_NXTHDR stay within that length and return null past
        // it, and each header is checked against the buffer's end before
        // its data is read (unaligned: a plain byte copy).
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                let data = libc::CMSG_DATA(cmsg) as usize;
                let header = libc::CMSG_LEN(0) as usize;
                let len = ((*cmsg).cmsg_len as usize).saturating_sub(header);
                let len = len.min(end.saturating_sub(data));
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    for i in 0..len / size_of::<RawFd>() {
                        let fd = std::ptr::read_unaligned((data as *const RawFd).wrapping_add(i));
                        if fd >= 0 {
                            // The kernel installed it in this process for
                            // us: we are its only owner.
                            fds.push(OwnedFd::from_raw_fd(fd));
                        }
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
    }
    Ok(Received {
        bytes: n as usize,
        fds,
        truncated,
    })
}

/// The process id of the peer of a connected Unix socket, as the kernel
/// recorded it when the connection was made (`SO_PEERCRED`): who is
/// really at the other end, whatever it says in its bytes.
pub fn peer_pid(sock: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: room for one ucred, a live local, and its length, for the
    // duration of the call on a descriptor the socket keeps open.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(cred.pid).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("SO_PEERCRED gave pid {}", cred.pid),
        )
    })
}

/// Wait until `sock` is ready for `events` or `deadline` passes
/// ([`FdPassError::Timeout`], the wait counted from `start`). Returns on
/// readiness, hang-up or error alike: the next call on the socket says
/// which.
fn wait_for(
    sock: &UnixStream,
    events: libc::c_short,
    deadline: Instant,
    start: Instant,
    what: impl Fn() -> String,
) -> Result<(), FdPassError> {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(FdPassError::Timeout {
                what: what(),
                waited: now - start,
            });
        }
        // Round up, so that a wait never ends just before the deadline
        // only to spin; cap at what an int holds.
        let left = deadline - now;
        let ms = left
            .as_millis()
            .saturating_add(u128::from(!left.subsec_nanos().is_multiple_of(1_000_000)))
            .min(i32::MAX as u128) as libc::c_int;
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one pollfd, a live local, for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(io_err("poll")(e));
        }
        if rc > 0 {
            return Ok(());
        }
    }
}
