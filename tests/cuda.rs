//! Device collectives through the public API (cudarc slices and streams)
//! on a real GPU: thread ranks sharing one device, one context, a stream
//! each. Without a device each test prints why and passes, unless
//! `FERROCCL_REQUIRE_DEVICE=1` (the GPU run, `cuda/gpu/run.sh`), where a
//! missing device fails it. Processes on one GPU (the device executor
//! over cuda-ipc) run at the end, as children of this binary, where
//! `FERROCCL_GPU_PROCESS_TESTS=1` says MPS is on (`cuda/gpu/run.sh
//! processes`).

mod common;

use ferroccl::cuda::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
use ferroccl::testing::run_ranks_with;
use ferroccl::{DataType, Element, ReduceOp};
use ferroccl_cuda::cuda_engine::CudaEngine;
use ferroccl_cuda::device::{self, DeviceBuf, Engine, Stream};
use half::{bf16, f16};
use std::sync::Arc;
use std::time::Duration;

/// Device 0's primary context, or `None` (with the reason printed) where
/// there is no device and none is required.
fn device() -> Option<Arc<CudaContext>> {
    let required = std::env::var("FERROCCL_REQUIRE_DEVICE").as_deref() == Ok("1");
    match ferroccl::cuda::device_count() {
        Ok(n) if n > 0 => Some(CudaContext::new(0).expect("device 0's primary context")),
        other => {
            assert!(!required, "FERROCCL_REQUIRE_DEVICE=1 but: {other:?}");
            eprintln!("skipped: no CUDA device ({other:?})");
            None
        }
    }
}

fn config(c: &mut ferroccl::Config) {
    c.transport = Some("mem".into());
    c.timeout = Duration::from_secs(60);
}

/// Inputs: small integers 1..=3, exact in every type; sums, products
/// (at most 3^4) and averages of up to 4 ranks stay in range of i8.
fn value(rank: usize, i: usize) -> f64 {
    (1 + (rank * 7 + i * 3) % 3) as f64
}

/// What no result is: written into every output before every call.
const POISON: f64 = 99.0;

fn combine(op: ReduceOp, vals: impl Iterator<Item = f64>, ranks: usize, int: bool) -> f64 {
    let vals: Vec<f64> = vals.collect();
    match op {
        ReduceOp::Sum => vals.iter().sum(),
        ReduceOp::Prod => vals.iter().product(),
        ReduceOp::Min => vals.iter().cloned().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg => {
            let avg = vals.iter().sum::<f64>() / ranks as f64;
            if int {
                avg.trunc()
            } else {
                avg
            }
        }
    }
}

fn tolerance(dtype: DataType) -> f64 {
    match dtype {
        DataType::F16 | DataType::Bf16 => 1e-2,
        DataType::F32 => 1e-6,
        DataType::F64 => 1e-12,
        _ => 0.0,
    }
}

fn upload<T: Element + DeviceRepr>(stream: &Arc<CudaStream>, v: &[f64]) -> CudaSlice<T> {
    let host: Vec<T> = v.iter().map(|&x| T::from_f64(x)).collect();
    stream.clone_htod(&host).expect("copy to the device")
}

fn download<T: Element + DeviceRepr>(stream: &Arc<CudaStream>, d: &CudaSlice<T>) -> Vec<f64> {
    let host: Vec<T> = stream.clone_dtoh(d).expect("copy to the host");
    host.into_iter().map(Element::to_f64).collect()
}

/// The collectives checked, with whether they reduce.
const KINDS: [(&str, bool); 5] = [
    ("all_reduce", true),
    ("reduce_scatter", true),
    ("all_gather", false),
    ("broadcast", false),
    ("reduce", true),
];

/// Every collective (in place and out of place) x op on `T`, on this
/// rank's stream, against the f64 reference; outputs poisoned first.
fn every_collective<T: Element + DeviceRepr>(
    comm: &ferroccl::Communicator,
    ctx: &Arc<CudaContext>,
) {
    let (rank, size) = (comm.rank(), comm.size());
    let stream = ctx.new_stream().expect("a stream");
    let on = comm.on_stream(&stream);
    let int = !matches!(
        T::DTYPE,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
    );
    let block = 1000 + 37; // per rank: odd, past a 16-byte vector
    let root = size - 1;
    for (name, reduces) in KINDS {
        let ops: &[ReduceOp] = if reduces {
            &ReduceOp::ALL
        } else {
            &[ReduceOp::Sum]
        };
        for &op in ops {
            for in_place in [false, true] {
                let what = format!("{name} {op:?} {} in place {in_place} n={size}", T::DTYPE);
                let (send_len, recv_len) = match name {
                    "reduce_scatter" => (block * size, block),
                    "all_gather" => (block, block * size),
                    _ => (block, block),
                };
                let input: Vec<f64> = (0..send_len).map(|i| value(rank, i)).collect();
                let red = |i: usize| combine(op, (0..size).map(|r| value(r, i)), size, int);
                // Expected output (None: not specified on this rank).
                let want: Vec<Option<f64>> = match name {
                    "all_reduce" => (0..block).map(|i| Some(red(i))).collect(),
                    "reduce_scatter" => (0..block).map(|i| Some(red(rank * block + i))).collect(),
                    "all_gather" => (0..block * size)
                        .map(|j| Some(value(j / block, j % block)))
                        .collect(),
                    "broadcast" => (0..block).map(|i| Some(value(root, i))).collect(),
                    // Out of place, other ranks' recv is left as it was;
                    // in place it may serve as scratch.
                    _ if rank == root => (0..block).map(|i| Some(red(i))).collect(),
                    _ if in_place => vec![None; block],
                    _ => vec![Some(POISON); block],
                };
                let got = if in_place {
                    // The whole buffer, this rank's input where the
                    // collective reads it, poison elsewhere.
                    let n = send_len.max(recv_len);
                    let mut host = vec![POISON; n];
                    let at = if name == "all_gather" {
                        rank * block
                    } else {
                        0
                    };
                    host[at..at + send_len].copy_from_slice(&input);
                    let mut buf = upload::<T>(&stream, &host);
                    let work = match name {
                        "all_reduce" => on.all_reduce_in_place(&mut buf, op),
                        "reduce_scatter" => on.reduce_scatter_in_place(&mut buf, op),
                        "all_gather" => on.all_gather_in_place(&mut buf),
                        "broadcast" => on.broadcast(&mut buf, root),
                        _ => on.reduce_in_place(&mut buf, op, root),
                    }
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let all = download(&stream, &buf);
                    work.wait().unwrap_or_else(|e| panic!("{what}: {e}"));
                    let at = if name == "reduce_scatter" {
                        rank * block
                    } else {
                        0
                    };
                    all[at..at + recv_len].to_vec()
                } else {
                    let send = upload::<T>(&stream, &input);
                    let mut recv = upload::<T>(&stream, &vec![POISON; recv_len]);
                    let work = match name {
                        "all_reduce" => on.all_reduce(&send, &mut recv, op),
                        "reduce_scatter" => on.reduce_scatter(&send, &mut recv, op),
                        "all_gather" => on.all_gather(&send, &mut recv),
                        "broadcast" => {
                            // In place only; out of place is the raw entry's.
                            let mut buf = upload::<T>(&stream, &input);
                            let w = on.broadcast(&mut buf, root);
                            stream.memcpy_dtod(&buf, &mut recv).expect("copy");
                            w
                        }
                        _ => on.reduce(&send, &mut recv, op, root),
                    }
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let got = download(&stream, &recv);
                    work.wait().unwrap_or_else(|e| panic!("{what}: {e}"));
                    got
                };
                let tol = tolerance(T::DTYPE);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    if let Some(w) = w {
                        assert!(
                            (g - w).abs() <= w.abs() * tol,
                            "{what} rank {rank} element {i}: {g} != {w}"
                        );
                    }
                }
            }
        }
    }
    // All-to-all: block r of recv is block `rank` of rank r's send.
    let input: Vec<f64> = (0..block * size).map(|i| value(rank, i)).collect();
    let send = upload::<T>(&stream, &input);
    let mut recv = upload::<T>(&stream, &vec![POISON; block * size]);
    let work = on.all_to_all(&send, &mut recv).expect("all_to_all");
    let got = download(&stream, &recv);
    work.wait().expect("all_to_all");
    for (j, g) in got.iter().enumerate() {
        let w = value(j / block, rank * block + j % block);
        assert_eq!(
            *g,
            w,
            "all_to_all {} n={size} rank {rank} element {j}",
            T::DTYPE
        );
    }
    // Send and receive around the ring (rank 0 receives first).
    if size > 1 {
        let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
        let mine = upload::<T>(&stream, &input[..block]);
        let mut theirs = upload::<T>(&stream, &vec![POISON; block]);
        let works = if rank == 0 {
            [on.recv(&mut theirs, prev), on.send(&mine, next)]
        } else {
            [on.send(&mine, next), on.recv(&mut theirs, prev)]
        };
        let got = download(&stream, &theirs);
        for w in works {
            w.expect("send/recv").wait().expect("send/recv");
        }
        for (i, g) in got.iter().enumerate() {
            assert_eq!(
                *g,
                value(prev, i),
                "recv {} rank {rank} element {i}",
                T::DTYPE
            );
        }
    }
}

/// `every_collective` for every element type.
fn every_type(comm: &ferroccl::Communicator, ctx: &Arc<CudaContext>) {
    every_collective::<f32>(comm, ctx);
    every_collective::<f64>(comm, ctx);
    every_collective::<f16>(comm, ctx);
    every_collective::<bf16>(comm, ctx);
    every_collective::<i8>(comm, ctx);
    every_collective::<u8>(comm, ctx);
    every_collective::<i32>(comm, ctx);
    every_collective::<u32>(comm, ctx);
    every_collective::<i64>(comm, ctx);
    every_collective::<u64>(comm, ctx);
}

/// Every collective x Element x op on device memory, for 1, 2 and 4
/// thread ranks sharing one GPU (one context, a stream each).
#[test]
fn every_collective_on_device_memory() {
    let Some(ctx) = device() else { return };
    for n in [1, 2, 4] {
        run_ranks_with(n, config, |comm| {
            every_type(&comm, &ctx);
        });
    }
}

/// A call on a stream with pending work sees that work's result (the
/// input is written by a copy queued behind a large one), and the next
/// kernel on the stream sees the call's result without a host wait (a
/// reduction kernel doubling it, enqueued right after the call).
#[test]
fn stream_order_on_a_gpu() {
    let Some(ctx) = device() else { return };
    run_ranks_with(2, config, |comm| {
        let (rank, size) = (comm.rank(), comm.size());
        let stream = ctx.new_stream().expect("a stream");
        let n = 1 << 20;
        let input: Vec<f64> = (0..n).map(|i| value(rank, i)).collect();
        let staged = upload::<f32>(&stream, &input);
        // Pending work: a large copy, then the input's copy behind it.
        let big = 256 << 20;
        let from = stream.alloc_zeros::<u8>(big).expect("memory");
        let mut to = stream.alloc_zeros::<u8>(big).expect("memory");
        let mut buf = upload::<f32>(&stream, &vec![POISON; n]);
        stream.synchronize().expect("sync");
        stream.memcpy_dtod(&from, &mut to).expect("copy");
        stream.memcpy_dtod(&staged, &mut buf).expect("copy");
        let work = comm
            .on_stream(&stream)
            .all_reduce_in_place(&mut buf, ReduceOp::Sum)
            .expect("all_reduce");
        // The next kernel on the stream: doubled = buf + buf.
        let engine = CudaEngine::shared(0).expect("engine");
        let doubled = stream.alloc_zeros::<f32>(n).expect("memory");
        {
            use ferroccl::cuda::cudarc::driver::DevicePtr;
            let (b, _b) = buf.device_ptr(&stream);
            let (d, _d) = doubled.device_ptr(&stream);
            let at = |p: u64| device::DevicePtr::new(DeviceBuf(p));
            let s = Stream(stream.cu_stream() as u64);
            engine
                .reduce(
                    s,
                    ferroccl_cuda::ReduceOp::Sum,
                    ferroccl_cuda::DataType::F32,
                    at(d),
                    at(b),
                    at(b),
                    n,
                )
                .expect("kernel");
        }
        let got = download(&stream, &doubled);
        work.wait().expect("all_reduce");
        for (i, g) in got.iter().enumerate() {
            let want = 2.0 * (0..size).map(|r| value(r, i)).sum::<f64>();
            assert_eq!(*g, want, "rank {rank} element {i}");
        }
    });
}

/// The raw entry points (NCCL's arguments) on real device pointers: an
/// in-place allreduce and a reduce-scatter in NCCL's in-place layout give
/// the reference; a count past the allocation and a host pointer are
/// refused before anything is issued (the next call still matches on
/// every rank).
#[test]
fn raw_entry_points_on_a_gpu() {
    use ferroccl::cuda::cudarc::driver::DevicePtrMut;
    let Some(ctx) = device() else { return };
    run_ranks_with(2, config, |comm| {
        let (rank, size) = (comm.rank(), comm.size());
        let stream = ctx.new_stream().expect("a stream");
        let n = 4099;
        let input: Vec<f64> = (0..n * size).map(|i| value(rank, i)).collect();
        let mut buf = upload::<f32>(&stream, &input);
        let cu = stream.cu_stream().cast::<std::ffi::c_void>();
        let (p, _use) = buf.device_ptr_mut(&stream);
        let p = p as *mut std::ffi::c_void;
        // SAFETY: `p` is `n * size` f32 of device memory on device 0 that
        // lives until after the stream is synchronized below; `cu` is a
        // stream of device 0's primary context.
        unsafe {
            // Far past it: the driver may round an allocation up.
            let past = n * size + (64 << 20);
            let too_long = comm.all_reduce_raw(p, p, past, DataType::F32, ReduceOp::Sum, cu);
            match too_long {
                Err(ferroccl::Error::InvalidArgument(why)) => {
                    assert!(why.contains("past its allocation"), "{why}")
                }
                other => panic!("a count past the allocation: {other:?}"),
            }
            let host = [0f32; 4];
            let on_host =
                comm.all_reduce_raw(host.as_ptr().cast(), p, 4, DataType::F32, ReduceOp::Sum, cu);
            assert!(
                matches!(&on_host, Err(ferroccl::Error::InvalidArgument(w)) if w.contains("not CUDA device memory")),
                "{on_host:?}"
            );
            comm.all_reduce_raw(p, p, n * size, DataType::F32, ReduceOp::Sum, cu)
                .expect("raw allreduce");
            // NCCL's in-place reduce-scatter: recv is block `rank` of send.
            let recv = p.cast::<f32>().add(rank * n).cast();
            comm.reduce_scatter_raw(p, recv, n, DataType::F32, ReduceOp::Max, cu)
                .expect("raw reduce-scatter");
        }
        drop(_use);
        let got = download(&stream, &buf);
        stream.synchronize().expect("sync");
        // Max over ranks of the same sum is the sum.
        for i in 0..n {
            let j = rank * n + i;
            let want: f64 = (0..size).map(|r| value(r, j)).sum();
            assert_eq!(got[j], want, "rank {rank} element {j}");
        }
    });
}

/// The variable that makes this test binary a child rank of
/// `in_processes`: `MODE,RANK,SIZE,PORT,TOKEN`.
const CHILD: &str = "FERROCCL_TEST_CUDA_CHILD";
/// Set (to 1) where processes sharing the GPU can run kernels at once:
/// under MPS, which `cuda/gpu/run.sh processes` starts. Without it the
/// process tests say why and pass.
const PROCESS_TESTS: &str = "FERROCCL_GPU_PROCESS_TESTS";

/// Run `size` ranks as child processes of this test binary (the test
/// `cuda_process_child`) on device 0, with INFO logging (the path the
/// calls took); (status, stdout, stderr) of each, by rank.
fn in_processes(mode: &str, size: usize) -> Vec<(std::process::ExitStatus, String, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let token = u64::from(std::process::id()) << 16 | u64::from(port);
    let exe = std::env::current_exe().expect("the test binary");
    let children: Vec<_> = (0..size)
        .map(|rank| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "cuda_process_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, format!("{mode},{rank},{size},{port},{token}"))
                .env("FERROCCL_DEBUG", "INFO")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("a child rank starts")
        })
        .collect();
    // Each child is bounded by its communicator's timeout, and killed
    // past LIMIT should that fail; each is waited for on a thread of its
    // own (which reads both its pipes to the end), so that no child stops
    // on a full pipe while another is waited for.
    const LIMIT: Duration = Duration::from_secs(300);
    let waits: Vec<_> = children
        .into_iter()
        .map(|c| std::thread::spawn(move || common::process::wait_bounded(c, LIMIT)))
        .collect();
    waits
        .into_iter()
        .map(|w| {
            let done = w.join().expect("the waiting thread");
            let mut stderr = done.stderr;
            if done.killed {
                stderr.push_str(&format!("\n(killed: still ran after {LIMIT:?})"));
            }
            (done.status, done.stdout, stderr)
        })
        .collect()
}

/// A child rank of `in_processes` (nothing unless `CHILD` is set). Mode
/// `all`: every collective x Element x op (`every_collective`). Mode
/// `kill`: one allreduce, then the last rank exits without a word while
/// the others' kernels wait in the next; they print their error.
#[test]
fn cuda_process_child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let f: Vec<&str> = spec.split(',').collect();
    let [mode, rank, size, port, token] = f[..] else {
        panic!("{CHILD}={spec}");
    };
    let (rank, size): (usize, usize) = (rank.parse().unwrap(), size.parse().unwrap());
    let ctx = CudaContext::new(0).expect("device 0");
    let mut c = ferroccl::Config::new(
        rank,
        size,
        "127.0.0.1",
        port.parse().unwrap(),
        token.parse().unwrap(),
    )
    .expect("config");
    c.timeout = Duration::from_secs(if mode == "kill" { 20 } else { 120 });
    let comm = ferroccl::Communicator::init(c).expect("communicator");
    match mode {
        "all" => {
            every_type(&comm, &ctx);
            println!("CHILD rank {rank}: done");
        }
        "kill" => {
            let stream = ctx.new_stream().expect("a stream");
            let on = comm.on_stream(&stream);
            let mut buf = upload::<f32>(&stream, &vec![1.0; 1 << 20]);
            on.all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .and_then(|w| w.wait())
                .expect("the first allreduce");
            if rank == size - 1 {
                std::thread::sleep(Duration::from_millis(500));
                std::process::exit(9);
            }
            let t = std::time::Instant::now();
            let got = on
                .all_reduce_in_place(&mut buf, ReduceOp::Sum)
                .and_then(|w| w.wait());
            match got {
                Ok(()) => println!("CHILD rank {rank}: ok after {:?}", t.elapsed()),
                Err(e) => println!(
                    "CHILD rank {rank}: failed rank {:?} after {:?}: {e}",
                    e.failed_rank(),
                    t.elapsed()
                ),
            }
        }
        _ => panic!("{CHILD}: mode {mode}"),
    }
}

/// Whether the process tests run here: a device, and `PROCESS_TESTS`.
fn processes_can_run() -> bool {
    if device().is_none() {
        return false;
    }
    if std::env::var(PROCESS_TESTS).as_deref() != Ok("1") {
        eprintln!(
            "skipped: kernels of processes sharing one GPU run at once only under MPS; \
             cuda/gpu/run.sh processes starts it and sets {PROCESS_TESTS}=1"
        );
        return false;
    }
    true
}

/// Every collective x Element x op for 2 and 4 processes on one GPU: the
/// device executor over FIFOs mapped with cuda-ipc (the INFO line says
/// so on every rank), against the f64 reference.
#[test]
fn every_collective_in_processes_on_one_gpu() {
    if !processes_can_run() {
        return;
    }
    for size in [2, 4] {
        for (rank, (status, out, err)) in in_processes("all", size).iter().enumerate() {
            let all = format!("{size} processes, rank {rank}:\n--- stdout\n{out}--- stderr\n{err}");
            assert!(status.success(), "{all}");
            assert!(out.contains(&format!("CHILD rank {rank}: done")), "{all}");
            assert!(
                err.contains("device calls run by the device executor")
                    && err.contains("in other processes (FIFOs mapped with cuda-ipc)"),
                "not the executor: {all}"
            );
        }
    }
}

/// Of three processes on one GPU, the last exits while the others'
/// kernels wait for it: both survivors' calls end with the error naming
/// it, well within the timeout.
#[test]
fn a_killed_process_is_named_on_a_gpu() {
    if !processes_can_run() {
        return;
    }
    let size = 3;
    let done = in_processes("kill", size);
    assert_eq!(done[size - 1].0.code(), Some(9), "{:?}", done[size - 1]);
    for (rank, (status, out, err)) in done[..size - 1].iter().enumerate() {
        let all = format!("rank {rank}:\n--- stdout\n{out}--- stderr\n{err}");
        assert!(status.success(), "{all}");
        assert!(
            out.contains(&format!(
                "CHILD rank {rank}: failed rank Some({})",
                size - 1
            )),
            "{all}"
        );
    }
}
