//! Ranks in two processes: a peer killed with SIGKILL is noticed through
//! its pid (PeerClosed within a bounded time, not at the deadline), and
//! no segment is left in /dev/shm whichever side was killed and when.
//!
//! The other process is this test binary run again with
//! FERROCCL_SHM_TEST_CHILD set: `child_rank` then plays a rank instead of
//! returning at once.

mod common;

use common::*;
use ferroccl_transport::{AbortHandle, Listener, TransportError};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_ENV: &str = "FERROCCL_SHM_TEST_CHILD";
const ADDR_ENV: &str = "FERROCCL_SHM_TEST_ADDR";
const CHUNK: usize = 256;
const STEPS: usize = 4;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The child's part. "connect": rank 0 connects to the parent's rank 1,
/// sends three frames, says READY and waits to be killed. "listen": rank 1
/// publishes its address and waits to be killed without ever accepting.
#[test]
fn child_rank() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    let abort = AbortHandle::new();
    let mut out = std::io::stdout();
    let _keep = match mode.as_str() {
        "connect" => {
            let addr = unhex(&std::env::var(ADDR_ENV).unwrap());
            let l0 = listen(&config(0, CHUNK, STEPS), &abort.signal());
            let mut c0 = l0.connect(1, &addr, soon(30_000)).unwrap();
            for step in 0..3u32 {
                send_bytes(&mut c0, data(step), &[step as u8 + 1; 100], soon(5_000)).unwrap();
            }
            writeln!(out, "READY").unwrap();
            Some(c0)
        }
        "listen" => {
            let l1 = listen(&config(1, CHUNK, STEPS), &abort.signal());
            writeln!(out, "ADDR {}", hex(&l1.address())).unwrap();
            std::mem::forget(l1);
            None
        }
        other => panic!("unknown child mode {other}"),
    };
    out.flush().unwrap();
    // Bounded: the parent kills us long before.
    std::thread::sleep(Duration::from_secs(60));
}

fn spawn_child(mode: &str, addr: Option<&[u8]>) -> (Child, BufReader<ChildStdout>) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_rank", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(addr) = addr {
        cmd.env(ADDR_ENV, hex(addr));
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdout)
}

/// The child's output from `word` to the end of the first line that has it.
fn wait_line(out: &mut BufReader<ChildStdout>, word: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        let n = out.read_line(&mut line).unwrap();
        assert!(n > 0, "the child ended before saying {word}");
        // The harness may have printed "test child_rank ... " first.
        if let Some(at) = line.find(word) {
            return line[at..].trim_end().to_owned();
        }
    }
}

fn sigkill(child: &mut Child) {
    // Child::kill sends SIGKILL on Unix.
    child.kill().unwrap();
}

fn assert_gone(r: Result<(), TransportError>, pid: u32) {
    match r {
        Err(TransportError::PeerClosed { peer: 0, detail }) => {
            assert_eq!(detail, format!("process {pid} is gone"))
        }
        other => panic!("expected PeerClosed for process {pid}, got {other:?}"),
    }
}

#[test]
fn killed_connector_is_noticed_and_leaves_nothing() {
    let abort = AbortHandle::new();
    let l1 = listen(&config(1, CHUNK, STEPS), &abort.signal());
    let prefix = l1.segment_prefix();
    let (mut child, mut out) = spawn_child("connect", Some(&l1.address()));
    let pid = child.id();
    wait_line(&mut out, "READY");
    let mut c1 = l1.accept(0, soon(10_000)).unwrap();
    assert_eq!(segments(&prefix), Vec::<String>::new());
    for step in 0..3u32 {
        let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step, b), (step, vec![step as u8 + 1; 100]));
    }
    // Fill the ring towards the child, which never reads.
    for step in 0..STEPS as u32 {
        send_bytes(&mut c1, data(step), b"to the child", soon(5_000)).unwrap();
    }
    let (mut sender, mut receiver, _closer) = halves(c1);
    let receiving = std::thread::spawn(move || {
        let start = Instant::now();
        (
            receiver.recv_with(soon(60_000), &mut |_, _| Ok(())),
            start.elapsed(),
        )
    });
    let sending = std::thread::spawn(move || {
        let start = Instant::now();
        (
            sender.send_from(data(9), soon(60_000), b"blocked"),
            start.elapsed(),
        )
    });
    std::thread::sleep(Duration::from_millis(200));
    // Not reaped yet: the peer is a zombie while the survivor looks.
    sigkill(&mut child);
    for (r, waited) in [receiving.join().unwrap(), sending.join().unwrap()] {
        assert_gone(r, pid);
        assert!(waited < Duration::from_secs(10), "{waited:?}");
    }
    child.wait().unwrap();
    assert_eq!(wait_no_segments(&prefix), Vec::<String>::new());
}

#[test]
fn connector_killed_before_accept_is_drained_then_noticed() {
    let abort = AbortHandle::new();
    let l1 = listen(&config(1, CHUNK, STEPS), &abort.signal());
    let prefix = l1.segment_prefix();
    let (mut child, mut out) = spawn_child("connect", Some(&l1.address()));
    let pid = child.id();
    wait_line(&mut out, "READY");
    assert_eq!(
        segments(&prefix).len(),
        2,
        "the child made one segment per direction"
    );
    sigkill(&mut child);
    child.wait().unwrap();
    // The segments outlived their creator; the acceptor maps and unlinks
    // them, takes what was sent, then learns the sender is gone.
    let mut c1 = l1.accept(0, soon(10_000)).unwrap();
    assert_eq!(segments(&prefix), Vec::<String>::new());
    for step in 0..3u32 {
        let (h, b) = recv_bytes(&mut c1, soon(5_000)).unwrap();
        assert_eq!((h.step, b), (step, vec![step as u8 + 1; 100]));
    }
    let start = Instant::now();
    assert_gone(recv_bytes(&mut c1, soon(60_000)).map(|_| ()), pid);
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn killed_acceptor_is_noticed_and_the_connector_unlinks() {
    let abort = AbortHandle::new();
    let (mut child, mut out) = spawn_child("listen", None);
    let pid = child.id();
    let line = wait_line(&mut out, "ADDR ");
    let addr = unhex(&line["ADDR ".len()..]);
    let l0 = listen(&config(0, CHUNK, STEPS), &abort.signal());
    let mut c0 = l0.connect(1, &addr, soon(60_000)).unwrap();
    // The segments are named from the child's nonce (bytes 8..16 of its
    // address, see the listener's docs).
    let nonce = u64::from_le_bytes(addr[8..16].try_into().unwrap());
    let prefix = format!("{}{nonce:016x}-", ferroccl_shm::SEGMENT_PREFIX);
    assert_eq!(segments(&prefix).len(), 2);
    sigkill(&mut child);
    let start = Instant::now();
    let r = recv_bytes(&mut c0, soon(60_000)).map(|_| ());
    match r {
        Err(TransportError::PeerClosed { peer: 1, detail }) => {
            assert_eq!(detail, format!("process {pid} is gone"))
        }
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(10));
    // The peer will never map them: unlinked as soon as that was known.
    assert_eq!(segments(&prefix), Vec::<String>::new());
    child.wait().unwrap();
}
