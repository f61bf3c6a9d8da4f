//! File descriptors across a Unix socket (`SCM_RIGHTS`): no GPU needed.
//!
//! The tests hold one lock each, so that counting this process's open
//! descriptors (`/proc/self/fd`) before and after is exact.

mod common;

use ferroccl_cuda_ipc::fdpass::{
    recv_exact_fds, recv_fds, send_fds, FdPassError, MAX_FDS_PER_MESSAGE,
};
use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(10)
}

/// An anonymous file holding `content`, named `name` (visible in
/// /proc/self/fd as "/memfd:NAME (deleted)").
fn memfd(name: &str, content: &[u8]) -> File {
    let cname = CString::new(name).unwrap();
    // SAFETY: a NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor nothing else owns.
    let mut f = unsafe { File::from_raw_fd(fd) };
    f.write_all(content).unwrap();
    f
}

/// The contents of a file from its start, whatever the shared offset.
fn contents(fd: OwnedFd) -> Vec<u8> {
    let f = File::from(fd);
    let len = f.metadata().unwrap().len() as usize;
    let mut buf = vec![0; len];
    f.read_exact_at(&mut buf, 0).unwrap();
    buf
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// How many of this process's descriptors point at a memfd called `name`.
fn open_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| {
            target
                .to_string_lossy()
                .starts_with(&format!("/memfd:{name}"))
        })
        .count()
}

#[test]
fn a_memfd_crosses_and_the_receiver_reads_what_the_sender_wrote() {
    let _s = serial();
    let (a, b) = UnixStream::pair().unwrap();
    let sender = std::thread::spawn(move || {
        let f = memfd("ferroccl-fdpass-one", b"written by the sender");
        send_fds(&a, b"hello", &[f.as_fd()], soon()).unwrap();
        // Closing our copy leaves the receiver's open.
    });
    let mut payload = [0u8; 5];
    let fds = recv_exact_fds(&b, &mut payload, 1, soon()).unwrap();
    sender.join().unwrap();
    assert_eq!(&payload, b"hello");
    assert_eq!(fds.len(), 1);
    // Received close-on-exec (MSG_CMSG_CLOEXEC).
    // SAFETY: F_GETFD on an open descriptor.
    let flags = unsafe { libc::fcntl(fds[0].as_raw_fd(), libc::F_GETFD) };
    assert!(flags & libc::FD_CLOEXEC != 0, "flags {flags:#x}");
    let fd = fds.into_iter().next().unwrap();
    assert_eq!(contents(fd), b"written by the sender");
    assert_eq!(open_named("ferroccl-fdpass-one"), 0);
}

#[test]
fn a_pipe_crosses_and_carries_bytes_written_after() {
    let _s = serial();
    let (a, b) = UnixStream::pair().unwrap();
    let mut fds = [0; 2];
    // SAFETY: writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both are new descriptors only we own.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    send_fds(&a, &[42], &[read_end.as_fd()], soon()).unwrap();
    drop(read_end);
    let mut payload = [0u8; 1];
    let got = recv_exact_fds(&b, &mut payload, 4, soon()).unwrap();
    assert_eq!(payload, [42]);
    let mut w = File::from(write_end);
    w.write_all(b"through the pipe").unwrap();
    drop(w);
    let mut r = File::from(got.into_iter().next().unwrap());
    let mut text = String::new();
    r.read_to_string(&mut text).unwrap();
    assert_eq!(text, "through the pipe");
}

#[test]
fn several_fds_in_one_message_arrive_in_order() {
    let _s = serial();
    let (a, b) = UnixStream::pair().unwrap();
    let before = open_fds();
    let sender = std::thread::spawn(move || {
        let files: Vec<File> = (0..5)
            .map(|i| {
                memfd(
                    &format!("ferroccl-fdpass-several-{i}"),
                    format!("file {i}").as_bytes(),
                )
            })
            .collect();
        let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        send_fds(&a, b"five", &borrowed, soon()).unwrap();
        a // keep the socket open until joined
    });
    let mut payload = [0u8; 4];
    let fds = recv_exact_fds(&b, &mut payload, 5, soon()).unwrap();
    let a = sender.join().unwrap();
    assert_eq!(&payload, b"five");
    let texts: Vec<Vec<u8>> = fds.into_iter().map(contents).collect();
    let want: Vec<Vec<u8>> = (0..5).map(|i| format!("file {i}").into_bytes()).collect();
    assert_eq!(texts, want);
    drop(a);
    drop(b);
    assert_eq!(open_fds(), before - 2, "the pair's two were open before");
}

#[test]
fn a_message_without_fds_is_just_bytes() {
    let _s = serial();
    let (a, b) = UnixStream::pair().unwrap();
    send_fds(&a, b"no descriptors", &[], soon()).unwrap();
    let mut payload = [0u8; 14];
    let fds = recv_exact_fds(&b, &mut payload, 3, soon()).unwrap();
    assert!(fds.is_empty());
    assert_eq!(&payload, b"no descriptors");
    // And with no room for any.
    send_fds(&a, b"x", &[], soon()).unwrap();
    let (n, fds) = recv_fds(&b, &mut payload, 0, soon()).unwrap();
    assert_eq!((n, fds.len()), (1, 0));
}

#[test]
fn fds_stay_with_their_message_and_pieces_are_reported() {
    let _s = serial();
    let (a, b) = UnixStream::pair().unwrap();
    let f1 = memfd("ferroccl-fdpass-first", b"first");
    let f2 = memfd("ferroccl-fdpass-second", b"second");
    send_fds(&a, &[1; 8], &[f1.as_fd()], soon()).unwrap();
    send_fds(&a, &[2; 8], &[f2.as_fd()], soon()).unwrap();
    drop((f1, f2));
    // A small buffer: the first piece brings the first message's fd.
    let mut small = [0u8; 3];
    let (n, fds) = recv_fds(&b, &mut small, 1, soon()).unwrap();
    assert_eq!((n, small), (3, [1; 3]));
    assert_eq!(
        fds.into_iter().map(contents).collect::<Vec<_>>(),
        [b"first".to_vec()]
    );
    // The rest of the first message comes without it. Read exactly the
    // rest: a larger buffer could take the start of the second message
    // and its fd with it (the kernel glues one writer's messages).
    let mut rest = [0u8; 5];
    let fds = recv_exact_fds(&b, &mut rest, 1, soon()).unwrap();
    assert_eq!(rest, [1; 5]);
    assert!(fds.is_empty());
    let mut second = [0u8; 8];
    let fds = recv_exact_fds(&b, &mut second, 1, soon()).unwrap();
    assert_eq!(second, [2; 8]);
    assert_eq!(
        fds.into_iter().map(contents).collect::<Vec<_>>(),
        [b"second".to_vec()]
    );
}

#[test]
fn a_closed_peer_is_named_on_both_sides() {
    let _s = serial();
    let (a, b) = UnixStream::pair().unwrap();
    drop(a);
    let mut payload = [0u8; 4];
    match recv_fds(&b, &mut payload, 1, soon()) {
        Err(FdPassError::PeerClosed {
            received: 0,
            expected: 4,
        }) => {}
        other => panic!("expected PeerClosed, got {other:?}"),
    }
    // Mid-message: 3 of 10 bytes, then the peer goes.
    let (a, b) = UnixStream::pair().unwrap();
    let f = memfd("ferroccl-fdpass-closed", b"x");
    send_fds(&a, b"abc", &[f.as_fd()], soon()).unwrap();
    drop((a, f));
    let mut payload = [0u8; 10];
    let e = recv_exact_fds(&b, &mut payload, 1, soon()).unwrap_err();
    assert!(
        matches!(
            e,
            FdPassError::PeerClosed {
                received: 3,
                expected: 10
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("after 3 of the 10 bytes"), "{e}");
    // The fd that came with the first piece was closed with the error.
    assert_eq!(open_named("ferroccl-fdpass-closed"), 0);
    // Sending to a closed peer: an error, no SIGPIPE.
    let (a, b) = UnixStream::pair().unwrap();
    drop(b);
    match send_fds(&a, b"anyone?", &[], soon()) {
        Err(FdPassError::PeerClosed {
            received: 0,
            expected: 7,
        }) => {}
        other => panic!("expected PeerClosed, got {other:?}"),
    }
}

#[test]
fn a_deadline_ends_the_wait() {
    let _s = serial();
    let (a, b) = UnixStream::pair().unwrap();
    let mut payload = [0u8; 4];
    let start = Instant::now();
    let e = recv_fds(&b, &mut payload, 1, start + Duration::from_millis(150)).unwrap_err();
    let waited = start.elapsed();
    assert!(matches!(e, FdPassError::Timeout { .. }), "{e:?}");
    assert!(waited >= Duration::from_millis(150), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert!(e.to_string().contains("0 of 4 bytes"), "{e}");

    // Half a message, then silence: the timeout says how far it got.
    send_fds(&a, b"ab", &[], soon()).unwrap();
    let e = recv_exact_fds(
        &b,
        &mut payload,
        1,
        Instant::now() + Duration::from_millis(100),
    )
    .unwrap_err();
    assert!(e.to_string().contains("2 of 4 bytes"), "{e}");

    // A deadline already past still takes what has arrived.
    send_fds(&a, b"late", &[], soon()).unwrap();
    let (n, _) = recv_fds(&b, &mut payload, 1, Instant::now() - Duration::from_secs(1)).unwrap();
    assert_eq!(&payload[..n], b"late");

    // A sender whose peer never reads times out too (a blocking socket
    // included: every call is MSG_DONTWAIT).
    let big = vec![7u8; 16 << 20];
    let start = Instant::now();
    let e = send_fds(&a, &big, &[], start + Duration::from_millis(150)).unwrap_err();
    assert!(matches!(e, FdPassError::Timeout { .. }), "{e:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    drop(b);
}

/// More descriptors than the receiver allows: an error, and every one
/// that arrived is closed (counted in /proc/self/fd, and by name).
#[test]
fn more_fds_than_allowed_is_an_error_and_leaks_nothing() {
    let _s = serial();
    for (max, sent) in [(0, 1), (1, 2), (1, 3), (2, 5), (3, 4), (0, 7)] {
        let (a, b) = UnixStream::pair().unwrap();
        let name = format!("ferroccl-fdpass-many-{max}-{sent}");
        let before = open_fds();
        {
            let files: Vec<File> = (0..sent).map(|_| memfd(&name, b"x")).collect();
            let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
            send_fds(&a, b"msg", &borrowed, soon()).unwrap();
        }
        let mut payload = [0u8; 3];
        match recv_exact_fds(&b, &mut payload, max, soon()) {
            Err(FdPassError::TooManyFds {
                max: m,
                received,
                truncated,
            }) => {
                assert_eq!(m, max);
                assert!(received <= sent, "{received} of {sent}");
                eprintln!("max {max}, sent {sent}: {received} arrived, truncated {truncated}");
            }
            other => panic!("max {max}, sent {sent}: expected TooManyFds, got {other:?}"),
        }
        assert_eq!(open_named(&name), 0, "max {max}, sent {sent}");
        assert_eq!(open_fds(), before, "max {max}, sent {sent}");
    }
}

/// A receiving socket with SO_PASSCRED gets the sender's credentials
/// with every message: they take control-buffer room, but neither cut
/// the descriptors nor count as descriptors.
#[test]
fn credentials_beside_the_fds_are_ignored() {
    let _s = serial();
    let (a, b) = UnixStream::pair().unwrap();
    let on: libc::c_int = 1;
    // SAFETY: sets one int option from a live local of that size.
    let rc = unsafe {
        libc::setsockopt(
            b.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let f = memfd("ferroccl-fdpass-creds", b"with credentials");
    send_fds(&a, b"c", &[f.as_fd()], soon()).unwrap();
    let fds = recv_exact_fds(&b, &mut [0; 1], 1, soon()).unwrap();
    assert_eq!(
        fds.into_iter().map(contents).collect::<Vec<_>>(),
        [b"with credentials".to_vec()]
    );
    send_fds(&a, b"d", &[], soon()).unwrap();
    assert!(recv_exact_fds(&b, &mut [0; 1], 0, soon())
        .unwrap()
        .is_empty());
    // Too many is still refused, and closed.
    send_fds(&a, b"e", &[f.as_fd(), f.as_fd()], soon()).unwrap();
    drop(f);
    let e = recv_exact_fds(&b, &mut [0; 1], 1, soon()).unwrap_err();
    assert!(matches!(e, FdPassError::TooManyFds { .. }), "{e:?}");
    assert_eq!(open_named("ferroccl-fdpass-creds"), 0);
}

#[test]
fn bad_arguments_are_refused_before_any_call() {
    let _s = serial();
    let (a, b) = UnixStream::pair().unwrap();
    let invalid = |r: Result<(), FdPassError>| {
        assert!(matches!(r, Err(FdPassError::InvalidArgument(_))), "{r:?}")
    };
    invalid(send_fds(&a, b"", &[], soon()));
    let f = memfd("ferroccl-fdpass-args", b"");
    let many: Vec<BorrowedFd<'_>> = (0..MAX_FDS_PER_MESSAGE + 1).map(|_| f.as_fd()).collect();
    invalid(send_fds(&a, b"x", &many, soon()));
    invalid(recv_fds(&b, &mut [], 1, soon()).map(drop));
    invalid(recv_fds(&b, &mut [0; 4], MAX_FDS_PER_MESSAGE + 1, soon()).map(drop));
    invalid(recv_exact_fds(&b, &mut [], 1, soon()).map(drop));
    // The most one message may carry goes through.
    let all: Vec<BorrowedFd<'_>> = (0..MAX_FDS_PER_MESSAGE).map(|_| f.as_fd()).collect();
    send_fds(&a, b"x", &all, soon()).unwrap();
    let got = recv_exact_fds(&b, &mut [0; 1], MAX_FDS_PER_MESSAGE, soon()).unwrap();
    assert_eq!(got.len(), MAX_FDS_PER_MESSAGE);
}

const CHILD_ENV: &str = "FERROCCL_FDPASS_CHILD_SOCKET";

/// Across processes: this test binary runs again as a child (only
/// `child_process_side`), which creates a memfd, writes to it, sends it
/// over the socket it inherited and exits; the parent reads what it
/// wrote.
#[test]
fn an_fd_crosses_to_another_process() {
    let _s = serial();
    let (parent, child) = UnixStream::pair().unwrap();
    let mut proc = common::spawn_child(CHILD_ENV, child);
    let mut payload = [0u8; 8];
    let got = recv_exact_fds(&parent, &mut payload, 1, soon());
    let status = proc.wait().unwrap();
    let fds = got.unwrap();
    assert!(status.success(), "child: {status}");
    let pid = u32::from_le_bytes(payload[..4].try_into().unwrap());
    assert_eq!(pid, proc.id(), "the payload names the child");
    assert_ne!(pid, std::process::id());
    assert_eq!(
        contents(fds.into_iter().next().unwrap()),
        format!("written by process {pid}").as_bytes()
    );
}

/// The child's half of `an_fd_crosses_to_another_process`; nothing to do
/// in an ordinary run.
#[test]
fn child_process_side() {
    let Some(sock) = common::inherited_socket(CHILD_ENV) else {
        return;
    };
    let _s = serial();
    let pid = std::process::id();
    let f = memfd(
        "ferroccl-fdpass-child",
        format!("written by process {pid}").as_bytes(),
    );
    let mut payload = [0u8; 8];
    payload[..4].copy_from_slice(&pid.to_le_bytes());
    send_fds(&sock, &payload, &[f.as_fd()], soon()).unwrap();
}

/// The peer's pid is what the kernel recorded: this process's own for a
/// socket pair (another process's is shown by ferroccl's cross-process
/// executor test, whose owners check it before they hand out a region).
#[test]
fn peer_pid_is_the_connecting_process() {
    // Serial like the others: its socket pair would otherwise show up in
    // a concurrent test's count of this process's descriptors.
    let _s = serial();
    let (a, b) = UnixStream::pair().unwrap();
    assert_eq!(ferroccl_cuda_ipc::peer_pid(&a).unwrap(), std::process::id());
    assert_eq!(ferroccl_cuda_ipc::peer_pid(&b).unwrap(), std::process::id());
}
