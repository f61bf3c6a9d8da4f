//! Measurements of the shared-memory transport: one-direction and
//! bidirectional throughput (payload copied in by `send_from` and out by
//! `recv_into`, as the executor does), and half round-trip latency of 8 B
//! and 1 KiB frames; with both ranks as threads of one process and as two
//! processes; next to a plain memcpy of the same bytes.
//!
//! `cargo run --release -p ferroccl-shm --example shm_pingpong [-- quick]`
//!
//! The second process is this program run again with `child <address>`.

use ferroccl_shm::ShmTransport;
use ferroccl_transport::{
    AbortHandle, Connection, FrameHeader, ListenConfig, Listener, SlotReceiver, SlotSender,
};
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

const CHUNK: usize = 1 << 20;
const SIZES: [usize; 3] = [64 << 10, 256 << 10, 1 << 20];
const LATENCY_SIZES: [usize; 2] = [8, 1024];

fn config(rank: usize) -> ListenConfig {
    ListenConfig {
        rank,
        size: 2,
        token: 0xbe7c_4a11,
        comm_id: 1,
        chunk_bytes: CHUNK,
        steps: ferroccl_transport::DEFAULT_STEPS,
        ifname: None,
        bind_addr: None,
        nsocks: 1,
    }
}

fn far() -> Instant {
    Instant::now() + Duration::from_secs(300)
}

fn header(step: u32) -> FrameHeader {
    FrameHeader::data(Default::default(), step)
}

#[derive(Clone, Copy)]
struct Plan {
    total: usize,
    iters: usize,
}

fn stream_out(sender: &mut dyn SlotSender, size: usize, frames: usize) {
    let source = vec![0x5au8; size];
    for f in 0..frames {
        sender.send_from(header(f as u32), far(), &source).unwrap();
    }
}

fn stream_in(receiver: &mut dyn SlotReceiver, size: usize, frames: usize) -> u64 {
    let mut sink = vec![0u8; size];
    let mut check = 0u64;
    for _ in 0..frames {
        receiver
            .recv_into(far(), &mut |_| Ok(()), &mut sink)
            .unwrap();
        check = check.wrapping_add(u64::from(sink[size - 1]));
    }
    check
}

fn go(sender: &mut dyn SlotSender) {
    sender.send_from(header(u32::MAX), far(), &[]).unwrap();
}

fn wait_go(receiver: &mut dyn SlotReceiver) {
    receiver.recv_into(far(), &mut |_| Ok(()), &mut []).unwrap();
}

/// Rank 1's side of the script: starts every phase and measures it.
/// Returns rows of (what, size, value).
fn lead(conn: &mut Connection, plan: Plan) -> Vec<(&'static str, usize, f64)> {
    let mut rows = Vec::new();
    let host = conn.host.as_mut().expect("shm has a host data path");
    let (sender, receiver) = (&mut host.sender, &mut host.receiver);
    for size in SIZES {
        let frames = plan.total / size;
        // One direction: the other rank streams to us.
        let start = Instant::now();
        go(sender.as_mut());
        assert_eq!(
            stream_in(receiver.as_mut(), size, frames),
            frames as u64 * 0x5a
        );
        rows.push((
            "uni GB/s",
            size,
            (frames * size) as f64 / start.elapsed().as_secs_f64() / 1e9,
        ));
        // Both directions.
        let start = Instant::now();
        go(sender.as_mut());
        std::thread::scope(|s| {
            let out = s.spawn(|| stream_out(sender.as_mut(), size, frames));
            stream_in(receiver.as_mut(), size, frames);
            out.join().unwrap();
        });
        rows.push((
            "bidir GB/s",
            size,
            (2 * frames * size) as f64 / start.elapsed().as_secs_f64() / 1e9,
        ));
    }
    for size in LATENCY_SIZES {
        let payload = vec![1u8; size];
        let mut back = vec![0u8; size];
        let mut samples = Vec::with_capacity(plan.iters);
        for i in 0..plan.iters + 100 {
            let start = Instant::now();
            sender.send_from(header(i as u32), far(), &payload).unwrap();
            receiver
                .recv_into(far(), &mut |_| Ok(()), &mut back)
                .unwrap();
            if i >= 100 {
                samples.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        }
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        rows.push(("half-RTT p50 us", size, samples[samples.len() / 2]));
        rows.push(("half-RTT mean us", size, mean));
    }
    rows
}

/// Rank 0's side of the script.
fn follow(conn: &mut Connection, plan: Plan) {
    let host = conn.host.as_mut().expect("shm has a host data path");
    let (sender, receiver) = (&mut host.sender, &mut host.receiver);
    for size in SIZES {
        let frames = plan.total / size;
        wait_go(receiver.as_mut());
        stream_out(sender.as_mut(), size, frames);
        wait_go(receiver.as_mut());
        std::thread::scope(|s| {
            let out = s.spawn(|| stream_out(sender.as_mut(), size, frames));
            stream_in(receiver.as_mut(), size, frames);
            out.join().unwrap();
        });
    }
    for size in LATENCY_SIZES {
        let mut buf = vec![0u8; size];
        for i in 0..plan.iters + 100 {
            receiver
                .recv_into(far(), &mut |_| Ok(()), &mut buf)
                .unwrap();
            sender.send_from(header(i as u32), far(), &buf).unwrap();
        }
    }
}

fn plan_from(quick: bool) -> Plan {
    if quick {
        Plan {
            total: 128 << 20,
            iters: 2_000,
        }
    } else {
        Plan {
            total: 1 << 30,
            iters: 20_000,
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn threads(plan: Plan) -> Vec<(&'static str, usize, f64)> {
    let abort = AbortHandle::new();
    let t = ShmTransport::new();
    let l0 = t.listen_shm(&config(0), &abort.signal()).unwrap();
    let l1 = t.listen_shm(&config(1), &abort.signal()).unwrap();
    let addr = l1.address();
    let follower = std::thread::spawn(move || {
        let mut c0 = l0.connect(1, &addr, far()).unwrap();
        follow(&mut c0, plan);
        c0
    });
    let mut c1 = l1.accept(0, far()).unwrap();
    let rows = lead(&mut c1, plan);
    let _c0 = follower.join().unwrap();
    rows
}

fn processes(plan: Plan, quick: bool) -> Vec<(&'static str, usize, f64)> {
    let abort = AbortHandle::new();
    let l1 = ShmTransport::new()
        .listen_shm(&config(1), &abort.signal())
        .unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "child",
            &hex(&l1.address()),
            if quick { "quick" } else { "full" },
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut c1 = l1.accept(0, far()).unwrap();
    let rows = lead(&mut c1, plan);
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "done");
    assert!(child.wait().unwrap().success());
    rows
}

fn child(addr: &str, quick: bool) {
    let abort = AbortHandle::new();
    let l0 = ShmTransport::new()
        .listen_shm(&config(0), &abort.signal())
        .unwrap();
    let mut c0 = l0.connect(1, &unhex(addr), far()).unwrap();
    follow(&mut c0, plan_from(quick));
    println!("done");
    std::io::stdout().flush().unwrap();
}

/// memcpy of the same frames: `total` bytes in `size`-byte copies from one
/// buffer into a ring of `DEFAULT_STEPS` buffers, as the sender does.
fn memcpy(size: usize, total: usize) -> f64 {
    let src = vec![0x5au8; size];
    let mut dst: Vec<Vec<u8>> = (0..ferroccl_transport::DEFAULT_STEPS)
        .map(|_| vec![0u8; size])
        .collect();
    let frames = total / size;
    let start = Instant::now();
    for f in 0..frames {
        let n = dst.len();
        let d = &mut dst[f % n];
        d.copy_from_slice(&src);
        std::hint::black_box(d);
    }
    (frames * size) as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        child(&args[2], args.get(3).map(String::as_str) == Some("quick"));
        return;
    }
    let quick = args.iter().any(|a| a == "quick");
    let plan = plan_from(quick);
    println!(
        "# shm: chunk {} KiB, steps {}, {} MiB per direction per size, {} latency iterations",
        CHUNK >> 10,
        ferroccl_transport::DEFAULT_STEPS,
        plan.total >> 20,
        plan.iters
    );
    println!("# payload copied in by send_from and out by recv_into (two copies per byte)");
    let t = threads(plan);
    let p = processes(plan, quick);
    println!(
        "{:>18} {:>8} {:>10} {:>10}",
        "measure", "bytes", "threads", "processes"
    );
    for (a, b) in t.iter().zip(&p) {
        assert_eq!((a.0, a.1), (b.0, b.1));
        println!("{:>18} {:>8} {:>10.2} {:>10.2}", a.0, a.1, a.2, b.2);
    }
    println!("# memcpy of the same frames, one thread (one copy per byte)");
    for size in SIZES {
        println!(
            "{:>18} {:>8} {:>10.2}",
            "memcpy GB/s",
            size,
            memcpy(size, plan.total)
        );
    }
}
