//! Loopback measurements of the TCP transport: one-direction and
//! bidirectional throughput per chunk size and sockets per peer, and
//! ping-pong latency of small frames. Both ranks are threads of this
//! process, so they share the machine's cores.
//!
//! `cargo run --release -p ferroccl-tcp --example tcp_pingpong [-- quick] [-- copy] [-- direct] [-- sockbuf]`
//! `copy`: fill and consume copy the payload (as the executor's reducing
//! steps do) instead of leaving the slot untouched. `direct`: frames go
//! from and to caller memory through `send_from` and `recv_into` (as the
//! executor's plain send and receive steps do); overrides `copy`.
//! `sockbuf`: also compare fixed 4 MiB socket buffers with kernel
//! autotuning (the default).

use ferroccl_tcp::TcpTransport;
use ferroccl_transport::{
    AbortHandle, FrameHeader, HostPath, ListenConfig, Transport, TransportError,
};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

fn config(rank: usize, chunk_bytes: usize, nsocks: usize) -> ListenConfig {
    ListenConfig {
        rank,
        size: 2,
        token: 1,
        comm_id: 1,
        chunk_bytes,
        steps: ferroccl_transport::DEFAULT_STEPS,
        ifname: None,
        bind_addr: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        nsocks,
    }
}

fn pair(
    t: &TcpTransport,
    chunk: usize,
    nsocks: usize,
    abort: &AbortHandle,
) -> (HostPath, HostPath) {
    let l0 = t
        .listen(&config(0, chunk, nsocks), &abort.signal())
        .unwrap();
    let l1 = t
        .listen(&config(1, chunk, nsocks), &abort.signal())
        .unwrap();
    let addr = l1.address();
    let deadline = Instant::now() + Duration::from_secs(10);
    let acceptor = std::thread::spawn(move || l1.accept(0, deadline));
    let c0 = l0.connect(1, &addr, deadline).unwrap();
    let c1 = acceptor.join().unwrap().unwrap();
    (c0.host.unwrap(), c1.host.unwrap())
}

#[derive(Clone, Copy)]
struct Opts {
    copy: bool,
    direct: bool,
}

/// Move `total` bytes from `tx` to `rx` in full slots; returns seconds.
fn stream(
    mut sender: Box<dyn ferroccl_transport::SlotSender>,
    mut receiver: Box<dyn ferroccl_transport::SlotReceiver>,
    chunk: usize,
    total: usize,
    opts: Opts,
) -> (
    f64,
    Box<dyn ferroccl_transport::SlotSender>,
    Box<dyn ferroccl_transport::SlotReceiver>,
) {
    let frames = total.div_ceil(chunk);
    let deadline = Instant::now() + Duration::from_secs(120);
    let source = vec![0x5au8; chunk];
    let start = Instant::now();
    let Opts { copy, direct } = opts;
    let rx = std::thread::spawn(move || {
        let mut sink = vec![0u8; chunk];
        let mut check = 0u64;
        for _ in 0..frames {
            if direct {
                receiver
                    .recv_into(deadline, &mut |_| Ok(()), &mut sink)
                    .unwrap();
                check = check.wrapping_add(sink.len() as u64);
                continue;
            }
            receiver
                .recv_with(deadline, &mut |_h: &FrameHeader, bytes: &[u8]| {
                    if copy {
                        sink[..bytes.len()].copy_from_slice(bytes);
                    }
                    check = check.wrapping_add(bytes.len() as u64);
                    Ok::<(), TransportError>(())
                })
                .unwrap();
        }
        assert_eq!(check, (frames * chunk) as u64);
        receiver
    });
    for f in 0..frames {
        if direct {
            sender
                .send_from(
                    FrameHeader::data(Default::default(), f as u32),
                    deadline,
                    &source,
                )
                .unwrap();
            continue;
        }
        sender
            .send_with(
                FrameHeader::data(Default::default(), f as u32),
                deadline,
                &mut |buf: &mut [u8]| {
                    if copy {
                        buf.copy_from_slice(&source);
                    }
                    chunk
                },
            )
            .unwrap();
    }
    let receiver = rx.join().unwrap();
    (start.elapsed().as_secs_f64(), sender, receiver)
}

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn throughput(
    t: &TcpTransport,
    chunk: usize,
    nsocks: usize,
    total: usize,
    opts: &Opts,
) -> (f64, f64) {
    let abort = AbortHandle::new();
    // One direction.
    let (c0, c1) = pair(t, chunk, nsocks, &abort);
    // Warm up, then measure.
    let (_, s, r) = stream(c0.sender, c1.receiver, chunk, total / 8, *opts);
    let (secs, _, _) = stream(s, r, chunk, total, *opts);
    let uni = gbps(total, secs);
    drop((c0.receiver, c1.sender));

    // Both directions at once.
    let (c0, c1) = pair(t, chunk, nsocks, &abort);
    let o = *opts;
    let a = std::thread::spawn(move || stream(c0.sender, c1.receiver, chunk, total, o).0);
    let b = std::thread::spawn(move || stream(c1.sender, c0.receiver, chunk, total, o).0);
    let (sa, sb) = (a.join().unwrap(), b.join().unwrap());
    let bi = gbps(2 * total, sa.max(sb));
    (uni, bi)
}

/// Send `size` bytes of `buf` as frame `step`, the way `opts` says.
fn send_one(c: &mut HostPath, step: usize, buf: &[u8], size: usize, opts: Opts, deadline: Instant) {
    let header = FrameHeader::data(Default::default(), step as u32);
    if opts.direct {
        c.sender.send_from(header, deadline, &buf[..size]).unwrap();
    } else {
        c.sender
            .send_with(header, deadline, &mut |slot| {
                if opts.copy {
                    slot[..size].copy_from_slice(&buf[..size]);
                }
                size
            })
            .unwrap();
    }
}

/// Receive frame `step` of `size` bytes into `buf`, the way `opts` says.
fn recv_one(
    c: &mut HostPath,
    step: usize,
    buf: &mut [u8],
    size: usize,
    opts: Opts,
    deadline: Instant,
) {
    if opts.direct {
        c.receiver
            .recv_into(
                deadline,
                &mut |h| {
                    assert_eq!(h.step, step as u32);
                    Ok(())
                },
                &mut buf[..size],
            )
            .unwrap();
    } else {
        c.receiver
            .recv_with(deadline, &mut |h, b| {
                assert_eq!((h.step, b.len()), (step as u32, size));
                if opts.copy {
                    buf[..size].copy_from_slice(b);
                }
                Ok(())
            })
            .unwrap();
    }
}

fn latency(t: &TcpTransport, size: usize, iters: usize, opts: Opts) -> (f64, f64) {
    let abort = AbortHandle::new();
    let (mut c0, mut c1) = pair(t, 64 << 10, 1, &abort);
    let deadline = Instant::now() + Duration::from_secs(120);
    let echo = std::thread::spawn(move || {
        let mut buf = vec![0u8; size];
        for i in 0..iters + 100 {
            recv_one(&mut c1, i, &mut buf, size, opts, deadline);
            send_one(&mut c1, i, &buf, size, opts, deadline);
        }
        c1
    });
    let mut buf = vec![0x33u8; size];
    let mut samples = Vec::with_capacity(iters);
    for i in 0..iters + 100 {
        let start = Instant::now();
        send_one(&mut c0, i, &buf, size, opts, deadline);
        recv_one(&mut c0, i, &mut buf, size, opts, deadline);
        if i >= 100 {
            samples.push(start.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    let _c1 = echo.join().unwrap();
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    (samples[samples.len() / 2], mean)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "quick");
    let opts = Opts {
        copy: args.iter().any(|a| a == "copy"),
        direct: args.iter().any(|a| a == "direct"),
    };
    let total = if quick { 64 << 20 } else { 512 << 20 };
    let t = TcpTransport::new();
    println!(
        "# loopback, {} MiB per direction, steps {}, payload {}",
        total >> 20,
        ferroccl_transport::DEFAULT_STEPS,
        if opts.direct {
            "from/to caller memory (send_from/recv_into)"
        } else if opts.copy {
            "copied in fill/consume"
        } else {
            "untouched"
        }
    );
    println!(
        "{:>10} {:>6} {:>12} {:>14}",
        "chunk", "nsocks", "uni GB/s", "bidir GB/s"
    );
    for chunk in [64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20] {
        for nsocks in [1, 2, 4] {
            let (uni, bi) = throughput(&t, chunk, nsocks, total, &opts);
            println!(
                "{:>9}K {:>6} {:>12.2} {:>14.2}",
                chunk >> 10,
                nsocks,
                uni,
                bi
            );
        }
    }
    if args.iter().any(|a| a == "sockbuf") {
        println!("# socket buffers: fixed 4 MiB vs kernel autotuning");
        println!(
            "{:>10} {:>6} {:>10} {:>12} {:>14}",
            "chunk", "nsocks", "sockbuf", "uni GB/s", "bidir GB/s"
        );
        for (name, tr) in [
            (
                "4MiB",
                TcpTransport::new().with_socket_buffer_bytes(Some(4 << 20)),
            ),
            ("auto", TcpTransport::new()),
        ] {
            for chunk in [256 << 10, 1 << 20] {
                for nsocks in [1, 2] {
                    let (uni, bi) = throughput(&tr, chunk, nsocks, total, &opts);
                    println!(
                        "{:>9}K {:>6} {:>10} {:>12.2} {:>14.2}",
                        chunk >> 10,
                        nsocks,
                        name,
                        uni,
                        bi
                    );
                }
            }
        }
    }
    println!("# ping-pong, one socket, half round trip");
    println!("{:>8} {:>10} {:>10}", "bytes", "p50 us", "mean us");
    for size in [0, 8, 1024, 8192, 65536] {
        let (p50, mean) = latency(&t, size, if quick { 2_000 } else { 20_000 }, opts);
        println!("{:>8} {:>10.1} {:>10.1}", size, p50, mean);
    }
}
