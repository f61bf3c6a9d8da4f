//! Tests of a device call end to end on the host stand-in: ordering with
//! the caller's stream and its gate (the device rule: no call waits for
//! the stream it parked), the device executor on a shared device and
//! across processes, deadlocks, silent and killed peers and aborts named
//! as errors, every collective against an f64 reference, send/recv.
//!
//! Why one file of about 1,030 lines: every case drives the same entry
//! point (`Communicator::device_collective`) through the same harness
//! (ranks as threads or child processes, a stand-in engine per device,
//! bounded waits); the module's code itself is in mod.rs, 400 lines.

use super::*;
use crate::coll::CollKind;
use crate::element::DataType;
use crate::testing::run_ranks_with;
use ferroccl_cuda::host_engine::HostEngine;
use std::time::Duration;

fn config(c: &mut crate::Config) {
    c.transport = Some("mem".into());
    // These tests are of the parked stream (calls return at once); the
    // default, calls that return when done, is tested by name.
    c.device_async = true;
    c.timeout = Duration::from_secs(60);
    c.calibrate = false;
}

/// Small integers: exact in every type, sums of up to 4 ranks too.
fn value(rank: usize, i: usize) -> f64 {
    ((rank * 7 + i * 3) % 5) as f64
}

fn bytes_of<T: Element>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

fn elems<T: Element>(b: &[u8]) -> Vec<f64> {
    bytemuck::pod_collect_to_vec::<u8, T>(b)
        .iter()
        .map(|x| x.to_f64())
        .collect()
}

/// Put `data` in device memory by work enqueued on `stream` (which
/// the stand-in may delay) without waiting for it: the call must wait
/// for it itself.
fn enqueue_write(e: &HostEngine, stream: Stream, at: DevicePtr, data: &[u8]) {
    e.enqueue_write(stream, at, data).unwrap();
}

/// Read `bytes` at `at` by work enqueued on `stream` after the call,
/// waiting only for that work: the call's result must be there. No
/// call so far broke the device rule.
fn read_after(e: &HostEngine, stream: Stream, at: DevicePtr, bytes: usize) -> Vec<u8> {
    let got = e.enqueue_read(stream, at, bytes).unwrap();
    let got = got
        .recv_timeout(Duration::from_secs(30))
        .expect("the stream got to the read")
        .unwrap();
    assert_eq!(e.violations(), Vec::<String>::new(), "the device rule");
    got
}

/// Every collective of the staged path through the communicator, in
/// place and out of place, on 1-4 thread ranks each with its own
/// stand-in device (random delays), f32 and bf16 and i32, Sum and Avg:
/// the input is written by work still pending on the caller's stream,
/// the output read by work enqueued after the call, and both checked
/// against an f64 reference.
#[test]
fn device_calls_order_with_the_callers_stream() {
    for n in [1, 2, 3, 4] {
        let own = |rank: usize| {
            Arc::new(HostEngine::with_delays(
                Duration::from_micros(200),
                rank as u64 + 1,
            ))
        };
        every_collective::<f32>(n, &own, 37, &config);
        every_collective::<half::bf16>(n, &own, 37, &config);
        every_collective::<i32>(n, &own, 37, &config);
    }
}

/// The same calls where the ranks share one stand-in device that runs
/// the device executor's kernel (its CUDA source built for the host,
/// `exec::oracle::host_launch`): every rank of the communicator is a
/// thread of this process on one "GPU", so the launcher takes the
/// executor for every collective (the launches are counted) instead of
/// staging, and the results must be the same.
#[test]
fn device_calls_run_by_the_executor_on_a_shared_device() {
    let Some(hook) = crate::exec::oracle::host_launch::host_executor() else {
        return;
    };
    for n in [1, 2, 3, 4] {
        let launches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let widest = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let (counted, wide) = (launches.clone(), widest.clone());
        let e = executor_device(&hook, n as u64, move |l| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            wide.fetch_max(l.channels, std::sync::atomic::Ordering::Relaxed);
        });
        let shared = |_rank: usize| e.clone();
        every_collective::<f32>(n, &shared, 37, &config);
        every_collective::<i32>(n, &shared, 37, &config);
        // Slots of 128 bytes, two a FIFO, and 1013 elements a rank:
        // frames wrap every FIFO many times, and LL slots are cut to
        // the bulk slot (the tuner picks LL for these sizes).
        let small = |c: &mut crate::Config| {
            config(c);
            c.buffsize = 256;
            c.steps = 2;
        };
        every_collective::<f32>(n, &shared, 1013, &small);
        // 256 KiB a rank: the tuner takes the bulk protocol.
        every_collective::<f32>(n, &shared, 1 << 16, &small);
        // 1 MiB a rank on 32 KiB slots: steps cut into channels (up to
        // 4: each is a block of host threads, and the machine may have
        // two cores), each a block of the kernel over FIFOs of its own.
        let wide = |c: &mut crate::Config| {
            config(c);
            c.buffsize = 64 << 10;
            c.steps = 2;
            c.max_channels = Some(4);
        };
        every_collective::<f32>(n, &shared, 1 << 18, &wide);
        // 11 calls on every rank for each of the five grids, all by
        // the executor.
        assert_eq!(
            launches.load(std::sync::atomic::Ordering::Relaxed),
            5 * 11 * n,
            "{n} ranks: the executor did not run every call"
        );
        if n > 1 {
            let widest = widest.load(std::sync::atomic::Ordering::Relaxed);
            assert!(widest >= 4, "{n} ranks: at most {widest} channels a call");
        }
    }
}

/// The default channel bound (`Config::max_channels` unset) on 2 ranks
/// sharing a stand-in device that runs the executor's kernel: calls
/// of 8 MiB a rank cut their steps into 32 channels (the bound the H200
/// run chose, `plan::device::default_channels`), every collective's
/// result checked against the f64 reference as in the test above.
#[test]
fn the_default_channels_run_by_the_executor() {
    let Some(hook) = crate::exec::oracle::host_launch::host_executor() else {
        return;
    };
    let widest = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let wide = widest.clone();
    let e = executor_device(&hook, 7, move |l| {
        wide.fetch_max(l.channels, std::sync::atomic::Ordering::Relaxed);
    });
    let shared = |_rank: usize| e.clone();
    every_collective::<f32>(2, &shared, (2 << 20) + 37, &config);
    assert_eq!(
        widest.load(std::sync::atomic::Ordering::Relaxed) as usize,
        crate::plan::device::default_channels(2),
        "the widest call's channels"
    );
}

/// A stand-in device (random delays of up to 100 us, seeded by `seed`)
/// that runs the executor's kernel by `hook`, showing `seen` each launch
/// first.
fn executor_device(
    hook: &ferroccl_cuda::host_engine::ExecutorHook,
    seed: u64,
    seen: impl Fn(&ferroccl_cuda::executor::ExecLaunch) + Send + Sync + 'static,
) -> Arc<HostEngine> {
    let hook = hook.clone();
    Arc::new(
        HostEngine::with_delays(Duration::from_micros(100), seed).with_executor(Arc::new(
            move |l: &ferroccl_cuda::executor::ExecLaunch| {
                seen(l);
                hook(l)
            },
        )),
    )
}

/// Device buffers `send` and `recv` of stand-in `e`, on `stream`.
fn on_device(e: &Arc<HostEngine>, stream: Stream, send: DevicePtr, recv: DevicePtr) -> OnDevice {
    OnDevice {
        ordinal: 0,
        engine: e.clone(),
        stream,
        send,
        recv,
    }
}

fn small_allreduce(e: &Arc<HostEngine>, count: usize) -> (OnDevice, CollCall) {
    let stream = e.stream().unwrap();
    // In the stream's order: the other rank's stream may be parked.
    let buf = DevicePtr::new(e.alloc_device_async(stream, count * 4).unwrap());
    e.write_device(buf, &vec![0u8; count * 4]).unwrap();
    let on = OnDevice {
        ordinal: 0,
        engine: e.clone(),
        stream,
        send: buf,
        recv: buf,
    };
    let call = CollCall {
        op: Some(ReduceOp::Sum),
        in_place: true,
        ..CollCall::new(CollKind::AllReduce, count, count, count)
    };
    (on, call)
}

/// What the test forces the stand-in to call under a held gate.
const FORCED: &str = "cuMemFreeHost (forced by the test)";

/// Two thread ranks, each on a stand-in of its own or both on one
/// (`shared`), staged: after a first call, rank 0's stand-in is made
/// to free pinned memory on the next host wait made while a gate is
/// held, which its progress thread makes in the second call, with the
/// caller's stream parked at the gate that thread is to raise: on a
/// GPU, a deadlock. Each rank's result of the second call.
fn forced_deadlock(shared: bool) -> Vec<std::result::Result<(), String>> {
    forced_deadlock_with(shared, true)
}

/// [`forced_deadlock`], with `Config::device_async` as given: where it is
/// off, no gate is held and the stand-in's forced free finds nothing to
/// wait for.
fn forced_deadlock_with(shared: bool, device_async: bool) -> Vec<std::result::Result<(), String>> {
    let sync_limit = Duration::from_millis(500);
    let one = Arc::new(HostEngine::new().with_sync_limit(sync_limit));
    let between = std::sync::Barrier::new(2);
    run_ranks_with(
        2,
        |c| {
            config(c);
            c.device_async = device_async;
            c.timeout = Duration::from_secs(20);
            // Many chunks: the staged call waits on the host often.
            c.buffsize = 256;
            c.steps = 2;
        },
        |comm| {
            let e = match shared {
                true => one.clone(),
                false => Arc::new(HostEngine::new().with_sync_limit(sync_limit)),
            };
            let (on, call) = small_allreduce(&e, 4096);
            comm.device_collective::<f32>(&call, &on)
                .unwrap()
                .wait()
                .unwrap();
            between.wait();
            if comm.rank() == 0 {
                e.force_sync_at_next_host_wait(FORCED);
            }
            between.wait();
            // The call's wait for the stream's earlier work ends only
            // once the stream is parked at the gate.
            // (A call that returns when done would wait for the hold.)
            let hold = device_async.then(|| e.hold_stream(on.stream).unwrap());
            let work = comm.device_collective::<f32>(&call, &on);
            drop(hold);
            let result = work.and_then(|w| w.wait()).map_err(|e| e.to_string());
            if device_async && (comm.rank() == 0 || shared) {
                assert!(
                    e.violations().iter().any(|v| v.contains(FORCED)),
                    "rank {}: {:?}",
                    comm.rank(),
                    e.violations()
                );
            }
            result
        },
    )
}

/// A deadlock the stand-in reports (a synchronizing call under a held
/// gate waited past its limit) ends as an error on every rank, naming
/// the call where the rank shares the stand-in, and naming the call or
/// rank 0 where it has a stand-in of its own; the ranks return
/// (bounded here so that a hang fails the test).
#[test]
fn a_deadlock_the_stand_in_reports_is_an_error_on_every_rank() {
    for shared in [false, true] {
        let (done, results) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(forced_deadlock(shared));
        });
        let results = results
            .recv_timeout(Duration::from_secs(300))
            .unwrap_or_else(|_| panic!("shared {shared}: the ranks never returned"));
        for (rank, result) in results.iter().enumerate() {
            let err = match result {
                Ok(()) => panic!("shared {shared}: rank {rank} succeeded"),
                Err(err) => err,
            };
            let named = err.contains(FORCED) && (rank != 0 || shared || err.contains("deadlock"));
            let names_rank_0 = rank != 0 && !shared && err.contains("rank 0");
            assert!(named || names_rank_0, "shared {shared}: rank {rank}: {err}");
        }
    }
}

/// Two thread ranks on one executor device: one call sets the
/// executor up; in the next, rank 1 never calls (`silent`) or rank 0
/// is aborted while its kernel waits (`abort`). Rank 0's result and
/// how long the call took.
fn executor_failure(abort: bool) -> Option<(Result<()>, Duration)> {
    let hook = crate::exec::oracle::host_launch::host_executor()?;
    let e = Arc::new(HostEngine::new().with_executor(hook));
    // The timeout also bounds the first call's device set-up, which
    // took over 2 s on a loaded 2-core machine (a test binary built
    // beside three others): 8 s leaves it room. One channel: the FIFOs
    // the stand-in zeroes at set-up grow with the channels (256 MiB a
    // rank at the default 32), and a 1024-element call takes one.
    let timeout = Duration::from_secs(if abort { 60 } else { 8 });
    let stay = if abort {
        Duration::from_secs(5)
    } else {
        timeout + Duration::from_secs(2)
    };
    let results = run_ranks_with(
        2,
        |c| {
            c.transport = Some("mem".into());
            c.timeout = timeout;
            c.max_channels = Some(1);
        },
        |comm| {
            let (on, call) = small_allreduce(&e, 1024);
            comm.device_collective::<f32>(&call, &on)
                .unwrap()
                .wait()
                .unwrap();
            if comm.rank() == 1 {
                // Never makes the second call; stays until rank 0 is
                // done with it (past its timeout, or its abort).
                std::thread::sleep(stay);
                return None;
            }
            let t = std::time::Instant::now();
            std::thread::scope(|s| {
                if abort {
                    s.spawn(|| {
                        std::thread::sleep(Duration::from_millis(300));
                        comm.abort();
                    });
                }
                let work = comm.device_collective::<f32>(&call, &on).unwrap();
                Some((work.wait(), t.elapsed()))
            })
        },
    );
    results.into_iter().next().flatten()
}

/// A kernel that waits for a peer that never makes the call ends at
/// the timeout (its abort word raised by the watchdog), and the call
/// names the peer, as on the host path.
#[test]
fn an_executor_kernel_waiting_for_a_silent_peer_ends_at_the_timeout() {
    let Some((result, took)) = executor_failure(false) else {
        return;
    };
    match result {
        Err(err) => assert_eq!(err.failed_rank(), Some(1), "{err}"),
        Ok(()) => panic!("rank 0's call succeeded without rank 1"),
    }
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// `abort()` on a rank whose kernel waits ends the kernel and the call
/// with the abort.
#[test]
fn abort_ends_a_waiting_executor_kernel() {
    let Some((result, took)) = executor_failure(true) else {
        return;
    };
    match result {
        Err(Error::Aborted(why)) => {
            assert!(why.is_some_and(|w| w.contains("abort()")), "no reason")
        }
        other => panic!("rank 0: {other:?}"),
    }
    assert!(took < Duration::from_secs(30), "took {took:?}");
}

/// What a child process left.
struct Finished {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

impl Finished {
    fn all(&self) -> String {
        format!("--- stdout\n{}--- stderr\n{}", self.stdout, self.stderr)
    }
}

/// A child with its output read on threads of its own (so that a full
/// pipe never stops it).
type Captured = (
    std::process::Child,
    std::thread::JoinHandle<String>,
    std::thread::JoinHandle<String>,
);

fn spawn_captured(mut cmd: std::process::Command) -> Captured {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the child starts");
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            String::from_utf8_lossy(&s).into_owned()
        })
    };
    let out = read(Box::new(child.stdout.take().expect("piped")));
    let err = read(Box::new(child.stderr.take().expect("piped")));
    (child, out, err)
}

/// Wait for a child, killing it (and failing) past `limit`.
fn finish_within((mut child, out, err): Captured, limit: Duration) -> Finished {
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waitpid") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "a child rank ran past {limit:?}:\n--- stdout\n{}--- stderr\n{}",
                out.join().unwrap_or_default(),
                err.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Finished {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// The variable that makes this test binary a child rank of
/// `across_processes`: `MODE,RANK,SIZE,PORT,PORT2,TOKEN` (a second
/// communicator rendezvouses at `PORT2`).
const XPROC: &str = "FERROCCL_TEST_XPROC";

/// Run `size` ranks as child processes of this test binary (the test
/// `xproc_child`, told its part by `XPROC`), all on one stand-in
/// "GPU" (one stand-in UUID), the host executor library built once
/// here and loaded by each; what each child left, by rank. `None`
/// (skip) without a C++ compiler.
fn across_processes(mode: &str, size: usize) -> Option<Vec<Finished>> {
    let lib = crate::exec::oracle::host_launch::library_path()?;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port()
    };
    let (port, port2) = (free(), free());
    let token = std::process::id() as u64 ^ (u64::from(port) << 32) ^ 0x5eed;
    let exe = std::env::current_exe().expect("the test binary");
    let children: Vec<_> = (0..size)
        .map(|rank| {
            let mut cmd = std::process::Command::new(&exe);
            cmd.args([
                "--exact",
                "comm::device::tests::xproc_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                XPROC,
                format!("{mode},{rank},{size},{port},{port2},{token}"),
            )
            .env("FERROCCL_HOST_LAUNCH_LIB", &lib);
            spawn_captured(cmd)
        })
        .collect();
    Some(
        children
            .into_iter()
            .map(|c| finish_within(c, Duration::from_secs(240)))
            .collect(),
    )
}

/// A child rank of `across_processes` (does nothing unless `XPROC`
/// is set). Mode `all`: every collective on four grids, each call by
/// the executor over FIFOs mapped across processes (the launches are
/// counted). Mode `kill`: one call, then the last rank exits without a
/// word while the others' kernels wait in the second call; they must
/// end with an error naming it.
#[test]
fn xproc_child() {
    let Ok(spec) = std::env::var(XPROC) else {
        return;
    };
    let f: Vec<&str> = spec.split(',').collect();
    let [mode, rank, size, port, port2, token] = f[..] else {
        panic!("{XPROC}={spec}");
    };
    let (rank, size): (usize, usize) = (rank.parse().unwrap(), size.parse().unwrap());
    let token: u64 = token.parse().unwrap();
    let hook = crate::exec::oracle::host_launch::host_executor().expect("the library");
    let launches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let widest = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (counted, wide) = (launches.clone(), widest.clone());
    let mut uuid = *b"FCSX\0\0\0\0\0\0\0\0\0\0\0\0";
    uuid[8..].copy_from_slice(&token.to_le_bytes());
    let e = Arc::new(
        HostEngine::with_delays(Duration::from_micros(50), rank as u64)
            .with_executor(Arc::new(move |l: &ferroccl_cuda::executor::ExecLaunch| {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                wide.fetch_max(l.channels, std::sync::atomic::Ordering::Relaxed);
                hook(l)
            }))
            .with_stand_in_uuid(uuid),
    );
    let mut config =
        crate::Config::new(rank, size, "127.0.0.1", port.parse().unwrap(), token).unwrap();
    config.calibrate = false;
    config.timeout = Duration::from_secs(if mode == "kill" { 20 } else { 60 });
    let mut wide = config.clone();
    // Slots of 128 bytes, two a FIFO: frames wrap the FIFOs often.
    config.buffsize = 256;
    config.steps = 2;
    let comm = Communicator::init(config).unwrap();
    match mode {
        "all" => {
            every_collective_on::<f32>(&comm, &e, 37);
            every_collective_on::<i32>(&comm, &e, 1013);
            every_collective_on::<f32>(&comm, &e, 1 << 14);
            drop(comm);
            // A second communicator of 32 KiB slots and up to 3
            // channels (1 MiB calls take them), each over FIFOs of its
            // own in every peer's mapped memory.
            wide.master_port = port2.parse().unwrap();
            wide.buffsize = 64 << 10;
            wide.max_channels = Some(3);
            let comm = Communicator::init(wide).unwrap();
            every_collective_on::<f32>(&comm, &e, 1 << 18);
            let n = launches.load(std::sync::atomic::Ordering::Relaxed);
            let w = widest.load(std::sync::atomic::Ordering::Relaxed);
            println!("XPROC rank {rank}: {n} launches, at most {w} channels");
        }
        "kill" => {
            let (on, call) = small_allreduce(&e, 1024);
            comm.device_collective::<f32>(&call, &on)
                .unwrap()
                .wait()
                .unwrap();
            if rank == size - 1 {
                // Gone without a goodbye, as a killed process is, once
                // the others' kernels wait in the next call.
                std::thread::sleep(Duration::from_millis(500));
                std::process::exit(9);
            }
            let t = std::time::Instant::now();
            let got = comm
                .device_collective::<f32>(&call, &on)
                .and_then(|w| w.wait());
            println!(
                "XPROC rank {rank}: {} launches, after {:?}: {}",
                launches.load(std::sync::atomic::Ordering::Relaxed),
                t.elapsed(),
                match got {
                    Ok(()) => "ok".to_string(),
                    Err(e) => format!("failed rank {:?}: {e}", e.failed_rank()),
                }
            );
        }
        _ => panic!("{XPROC}: mode {mode}"),
    }
}

/// Ranks in separate processes on one (stand-in) GPU: the launcher
/// maps each other's FIFO memory (shared files, their descriptors
/// passed over Unix sockets, as VMM handles are) and every collective
/// runs by the executor, checked against the f64 reference.
#[test]
fn device_calls_run_by_the_executor_across_processes() {
    for size in [2, 3] {
        let Some(done) = across_processes("all", size) else {
            return;
        };
        for (rank, f) in done.iter().enumerate() {
            assert!(
                f.status.success(),
                "{size} ranks, rank {rank}:\n{}",
                f.all()
            );
            // Four grids of 11 calls, every one by the executor.
            let want = format!("XPROC rank {rank}: 44 launches, at most 3 channels");
            assert!(
                f.stdout.contains(&want),
                "{size} ranks, rank {rank}:\n{}",
                f.all()
            );
        }
    }
}

/// A process killed while its peers' kernels wait for it: every
/// survivor's call ends with an error naming it, well within the
/// timeout.
#[test]
fn a_killed_process_is_named_by_the_kernels_waiting_for_it() {
    let size = 3;
    let Some(done) = across_processes("kill", size) else {
        return;
    };
    assert_eq!(
        done[size - 1].status.code(),
        Some(9),
        "{}",
        done[size - 1].all()
    );
    for (rank, f) in done[..size - 1].iter().enumerate() {
        assert!(f.status.success(), "rank {rank}:\n{}", f.all());
        let line = f
            .stdout
            .lines()
            .find(|l| l.contains(&format!("XPROC rank {rank}: ")))
            .unwrap_or_else(|| panic!("rank {rank}:\n{}", f.all()));
        // The second call's kernel was launched, and ended by the
        // failure.
        assert!(line.contains(": 2 launches, after"), "rank {rank}: {line}");
        assert!(
            line.contains(&format!("failed rank Some({})", size - 1)),
            "rank {rank}: {line}"
        );
    }
}

/// Every collective through `device_collective` on `n` thread ranks,
/// rank r on the device `engine(r)`, `block` elements a rank (37: not
/// a multiple of anything), checked against an f64 reference.
fn every_collective<T: Element>(
    n: usize,
    engine: &(dyn Fn(usize) -> Arc<HostEngine> + Sync),
    block: usize,
    config: &(dyn Fn(&mut crate::Config) + Sync),
) {
    run_ranks_with(n, config, |comm| {
        every_collective_on::<T>(&comm, &engine(comm.rank()), block)
    });
}

/// `every_collective`'s calls on one rank: `comm`'s, on engine `e`.
fn every_collective_on<T: Element>(comm: &Communicator, e: &Arc<HostEngine>, block: usize) {
    let (rank, size) = (comm.rank(), comm.size());
    let stream = e.stream().unwrap();
    let elem = std::mem::size_of::<T>();
    for (kind, op, in_place) in [
        (CollKind::AllReduce, ReduceOp::Sum, false),
        (CollKind::AllReduce, ReduceOp::Sum, true),
        (CollKind::AllReduce, ReduceOp::Avg, true),
        (CollKind::ReduceScatter, ReduceOp::Sum, false),
        (CollKind::ReduceScatter, ReduceOp::Avg, true),
        (CollKind::AllGather, ReduceOp::Sum, false),
        (CollKind::AllGather, ReduceOp::Sum, true),
        (CollKind::Broadcast, ReduceOp::Sum, true),
        (CollKind::Reduce, ReduceOp::Sum, false),
        (CollKind::Reduce, ReduceOp::Avg, true),
        (CollKind::AllToAll, ReduceOp::Sum, false),
    ] {
        let (send_len, recv_len) = match kind {
            CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => (block, block),
            CollKind::ReduceScatter => (block * size, block),
            CollKind::AllToAll => (block * size, block * size),
            _ => (block, block * size),
        };
        let root = (kind == CollKind::Broadcast || kind == CollKind::Reduce).then_some(size - 1);
        let buf_len = send_len.max(recv_len);
        let call = CollCall {
            op: matches!(
                kind,
                CollKind::AllReduce | CollKind::ReduceScatter | CollKind::Reduce
            )
            .then_some(op),
            root,
            in_place,
            ..CollCall::new(
                kind,
                match kind {
                    CollKind::AllToAll => send_len,
                    _ => block,
                },
                if in_place { buf_len } else { send_len },
                if in_place { buf_len } else { recv_len },
            )
        };
        // This rank's input: in place, where the collective
        // reads it (an allgather's own block).
        let input: Vec<T> = (0..send_len).map(|i| T::from_f64(value(rank, i))).collect();
        // In the stream's order, as PyTorch's caching allocator gives
        // memory: ranks sharing a device may have streams parked at
        // their gates, and a plain allocation would wait for them (the
        // device rule holds for the caller too, as NCCL's for cudaFree).
        let send = DevicePtr::new(e.alloc_device_async(stream, buf_len * elem).unwrap());
        let recv = DevicePtr::new(e.alloc_device_async(stream, buf_len * elem).unwrap());
        let at = if in_place && kind == CollKind::AllGather {
            send.add(rank * block * elem)
        } else {
            send
        };
        enqueue_write(e, stream, at, &bytes_of(&input));
        let on = on_device(e, stream, send, recv);
        let work = comm
            .device_collective::<T>(&call, &on)
            .unwrap_or_else(|err| panic!("{kind:?} {op} in place {in_place}: {err}"));
        // In place, a reduce-scatter leaves this rank's block
        // where it lay in the input.
        let out_at = match (in_place, kind) {
            (false, _) => recv,
            (true, CollKind::ReduceScatter) => send.add(rank * block * elem),
            (true, _) => send,
        };
        let got = elems::<T>(&read_after(e, stream, out_at, recv_len * elem));
        work.wait()
            .unwrap_or_else(|err| panic!("{kind:?} {op} in place {in_place}: {err}"));
        let sum = |i: usize| (0..size).map(|r| value(r, i)).sum::<f64>();
        let want: Option<Vec<f64>> = match kind {
            CollKind::AllReduce => Some((0..block).map(sum).collect()),
            CollKind::ReduceScatter => Some((0..block).map(|i| sum(rank * block + i)).collect()),
            CollKind::AllGather => Some(
                (0..block * size)
                    .map(|j| value(j / block, j % block))
                    .collect(),
            ),
            CollKind::Broadcast => Some((0..block).map(|i| value(size - 1, i)).collect()),
            // Block r of recv: block `rank` of rank r's send.
            CollKind::AllToAll => Some(
                (0..block * size)
                    .map(|j| value(j / block, rank * block + j % block))
                    .collect(),
            ),
            _ => (rank == size - 1).then(|| (0..block).map(sum).collect()),
        };
        let Some(mut want) = want else { continue };
        if op == ReduceOp::Avg && kind != CollKind::AllGather {
            let int = T::DTYPE == DataType::I32;
            for w in &mut want {
                *w /= size as f64;
                if int {
                    *w = w.trunc();
                }
            }
        }
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= w.abs() * 1e-2,
                "{} {kind:?} {op} in place {in_place} n={size} rank {rank} \
                 element {i}: {g} != {w}",
                T::DTYPE
            );
        }
        e.free_device_async(stream, send.buf).unwrap();
        e.free_device_async(stream, recv.buf).unwrap();
    }
}

/// A device call returns while the caller's stream is still held by
/// earlier work, and is carried out only after that work: the stream
/// is held at a gate of the test's own until the call has returned on
/// every rank, then let go; the result is right and later work on the
/// stream sees it. Two calls in a row on the same stream both wait.
#[test]
fn device_calls_return_before_the_stream_gets_to_them() {
    run_ranks_with(3, config, |comm| {
        let (rank, size) = (comm.rank(), comm.size());
        let e = Arc::new(HostEngine::with_delays(
            Duration::from_micros(100),
            7 + rank as u64,
        ));
        let stream = e.stream().unwrap();
        let n = 1000;
        let buf = DevicePtr::new(e.alloc_device(n * 4).unwrap());
        let input: Vec<f32> = (0..n).map(|i| value(rank, i) as f32).collect();
        let engine: Arc<dyn Engine> = e.clone();
        let on = OnDevice {
            ordinal: 0,
            engine,
            stream,
            send: buf,
            recv: buf,
        };
        // The communicator's first call on the engine sets up its
        // staging (allocations wait for the device's work, the device
        // rule): made first, so that the calls below allocate nothing.
        let warm = CollCall {
            op: Some(ReduceOp::Sum),
            in_place: true,
            ..CollCall::new(CollKind::AllReduce, 1, 1, 1)
        };
        comm.device_collective::<f32>(&warm, &on)
            .unwrap()
            .wait()
            .unwrap();
        // The stream is held by earlier work that is slow (not a
        // gate: a test's gate would be one the library's calls must
        // not allocate under).
        let hold = e.hold_stream(stream).unwrap();
        enqueue_write(&e, stream, buf, &bytes_of(&input));
        let sum = CollCall {
            op: Some(ReduceOp::Sum),
            in_place: true,
            ..CollCall::new(CollKind::AllReduce, n, n, n)
        };
        let max = CollCall {
            op: Some(ReduceOp::Max),
            ..sum
        };
        let first = comm.device_collective::<f32>(&sum, &on).unwrap();
        let second = comm.device_collective::<f32>(&max, &on).unwrap();
        // Returned with the stream held: neither call can have run.
        assert!(!first.is_complete() && !second.is_complete());
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !first.is_complete(),
            "the call ran before the stream's earlier work"
        );
        hold.send(()).unwrap();
        let got = elems::<f32>(&read_after(&e, stream, buf, n * 4));
        first.wait().unwrap();
        second.wait().unwrap();
        let made = e.pinned_allocations();
        // Max over ranks of the same sum is the sum.
        for (i, g) in got.iter().enumerate() {
            let want: f64 = (0..size).map(|r| value(r, i)).sum();
            assert_eq!(*g, want, "rank {rank} element {i}");
        }
        // Later calls of the same size reuse the communicator's
        // staging resources: no pinned allocation after the first.
        for _ in 0..8 {
            comm.device_collective::<f32>(&max, &on)
                .unwrap()
                .wait()
                .unwrap();
        }
        assert_eq!(e.pinned_allocations(), made, "pinned buffers not reused");
    });
}

/// The device rule on the stand-in that synchronizes as CUDA does:
/// device calls that need scratch (an all-to-all in place copies its
/// input; a tree reduce keeps partial results on inner ranks), issued
/// back to back on one stream without a host wait, so that a call's
/// stream is parked at its gate while the progress thread carries out
/// the call before it and sets up its staging. Any call on the
/// progress thread that waits for every stream (a free, an
/// allocation, a module load) waits for the parked stream, which waits
/// for the progress thread: the stand-in gives up after 3 s and says
/// so, and names any such call made while a gate is held. Every call
/// must end well, with the right result.
#[test]
fn device_calls_under_a_gate_never_wait_for_the_parked_stream() {
    run_ranks_with(3, config, |comm| {
        let (rank, size) = (comm.rank(), comm.size());
        let e = Arc::new(
            HostEngine::with_delays(Duration::from_micros(100), 11 + rank as u64)
                .with_sync_limit(Duration::from_secs(3)),
        );
        let stream = e.stream().unwrap();
        let n = 64;
        let a2a = DevicePtr::new(e.alloc_device(n * size * 4).unwrap());
        let red = DevicePtr::new(e.alloc_device(n * 4).unwrap());
        let out = DevicePtr::new(e.alloc_device(n * 4).unwrap());
        let input: Vec<f32> = (0..n * size).map(|i| value(rank, i) as f32).collect();
        e.enqueue_write(stream, a2a, &bytes_of(&input)).unwrap();
        e.enqueue_write(stream, red, &bytes_of(&input[..n]))
            .unwrap();
        let engine: Arc<dyn Engine> = e.clone();
        let on = |send, recv| OnDevice {
            ordinal: 0,
            engine: engine.clone(),
            stream,
            send,
            recv,
        };
        let all_to_all = CollCall {
            in_place: true,
            ..CollCall::new(CollKind::AllToAll, n * size, n * size, n * size)
        };
        let reduce = CollCall {
            op: Some(ReduceOp::Sum),
            root: Some(0),
            ..CollCall::new(CollKind::Reduce, n, n, n)
        };
        let mut works = Vec::new();
        for _ in 0..3 {
            works.push(
                comm.device_collective::<f32>(&all_to_all, &on(a2a, a2a))
                    .unwrap(),
            );
            works.push(
                comm.device_collective::<f32>(&reduce, &on(red, out))
                    .unwrap(),
            );
        }
        let got = elems::<f32>(&read_after(&e, stream, a2a, n * size * 4));
        let reduced = elems::<f32>(&read_after(&e, stream, out, n * 4));
        for w in works {
            w.wait().unwrap();
        }
        // Three all-to-alls in place: block r of the result is block
        // `rank` of rank r's input, applied three times, which is a
        // transpose of the blocks done an odd number of times.
        let want: Vec<f64> = (0..n * size)
            .map(|j| value(j / n, rank * n + j % n))
            .collect();
        assert_eq!(got, want, "rank {rank}");
        if rank == 0 {
            let want: Vec<f64> = (0..n)
                .map(|i| (0..size).map(|r| value(r, i)).sum())
                .collect();
            assert_eq!(reduced, want, "rank {rank}");
        }
        assert_eq!(e.violations(), Vec::<String>::new(), "the device rule");
    });
}

/// Device calls on the legacy default stream (PyTorch's default
/// stream), on a non-blocking stream (`torch.cuda.Stream()`: PyTorch's
/// pool makes its streams non-blocking) and on a blocking stream
/// (`cudaStreamCreate`'s default, as other libraries make them), each
/// after its input was written on another stream: the legacy stream
/// follows a blocking writer implicitly, a blocking stream follows the
/// legacy writer implicitly, and the non-blocking stream follows the
/// legacy writer through an event (`wait_stream`), as PyTorch orders
/// them. The results are checked against the f64 reference and no
/// call breaks the device rule.
#[test]
fn device_calls_on_the_legacy_and_torch_like_streams() {
    use ferroccl_cuda::device::LEGACY_STREAM;
    run_ranks_with(2, config, |comm| {
        let (rank, size) = (comm.rank(), comm.size());
        let e = Arc::new(HostEngine::with_delays(
            Duration::from_micros(100),
            21 + rank as u64,
        ));
        let blocking = e.blocking_stream().unwrap();
        let torch_side = e.stream().unwrap();
        let n = 257;
        let streams = [LEGACY_STREAM, torch_side, blocking];
        for (k, stream) in streams.into_iter().chain(streams).enumerate() {
            // The writer: a blocking stream for the legacy stream's
            // call, the legacy stream for the others.
            let writer = match stream {
                LEGACY_STREAM => blocking,
                _ => LEGACY_STREAM,
            };
            let buf = DevicePtr::new(e.alloc_device_async(writer, n * 4).unwrap());
            let input: Vec<f32> = (0..n).map(|i| value(rank + k, i) as f32).collect();
            e.enqueue_write(writer, buf, &bytes_of(&input)).unwrap();
            // Only the non-blocking stream needs the event; the
            // legacy stream's implicit order covers the others.
            if stream == torch_side {
                let written = e.event().unwrap();
                e.record(written, writer).unwrap();
                e.stream_wait(stream, written).unwrap();
            }
            let engine: Arc<dyn Engine> = e.clone();
            let on = OnDevice {
                ordinal: 0,
                engine,
                stream,
                send: buf,
                recv: buf,
            };
            let call = CollCall {
                op: Some(ReduceOp::Sum),
                in_place: true,
                ..CollCall::new(CollKind::AllReduce, n, n, n)
            };
            let work = comm.device_collective::<f32>(&call, &on).unwrap();
            let got = elems::<f32>(&read_after(&e, stream, buf, n * 4));
            work.wait().unwrap();
            let want: Vec<f64> = (0..n)
                .map(|i| (0..size).map(|r| value(r + k, i)).sum())
                .collect();
            assert_eq!(got, want, "rank {rank} call {k}");
        }
    });
}

/// A call that fails still lets the caller's stream go (the gate is
/// raised however the call ends), within the timeout, and its
/// `DeviceWork` names the rank that never called.
#[test]
fn a_failed_device_call_lets_the_stream_go() {
    let results = run_ranks_with(
        2,
        |c| {
            c.transport = Some("mem".into());
            c.timeout = Duration::from_secs(2);
        },
        |comm| {
            if comm.rank() == 1 {
                // Never calls; stays until rank 0 has timed out.
                std::thread::sleep(Duration::from_secs(4));
                return None;
            }
            let e = Arc::new(HostEngine::new());
            let (on, call) = small_allreduce(&e, 16);
            let work = comm.device_collective::<f32>(&call, &on).unwrap();
            // The stream's later work runs (read_after waits at most
            // 30 s; the call gives up after 2).
            read_after(&e, on.stream, on.send, 64);
            Some(work.wait())
        },
    );
    match &results[0] {
        Some(Err(err)) => assert_eq!(err.failed_rank(), Some(1), "{err}"),
        other => panic!("rank 0: {other:?}"),
    }
}

/// Send and receive on device memory: each rank sends to the next and
/// receives from the previous (odd length, both orders of posting).
#[test]
fn device_send_and_recv() {
    run_ranks_with(3, config, |comm| {
        let (rank, size) = (comm.rank(), comm.size());
        let e = Arc::new(HostEngine::with_delays(
            Duration::from_micros(100),
            rank as u64,
        ));
        let stream = e.stream().unwrap();
        let n = 301;
        let out = DevicePtr::new(e.alloc_device(n * 4).unwrap());
        let inp = DevicePtr::new(e.alloc_device(n * 4).unwrap());
        let data: Vec<f32> = (0..n).map(|i| value(rank, i) as f32).collect();
        enqueue_write(&e, stream, out, &bytes_of(&data));
        let engine: Arc<dyn Engine> = e.clone();
        let on = OnDevice {
            ordinal: 0,
            engine,
            stream,
            send: out,
            recv: inp,
        };
        let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
        let send = CollCall {
            root: Some(rank),
            p2p: Some((next, true)),
            ..CollCall::new(CollKind::SendRecv, n, n, 0)
        };
        let recv = CollCall {
            root: Some(prev),
            p2p: Some((prev, false)),
            ..CollCall::new(CollKind::SendRecv, n, 0, n)
        };
        // Rank 0 receives first, the others send first: no cycle of
        // blocking sends.
        let order = if rank == 0 {
            [recv, send]
        } else {
            [send, recv]
        };
        let works: Vec<DeviceWork> = order
            .iter()
            .map(|c| comm.device_collective::<f32>(c, &on).unwrap())
            .collect();
        let got = elems::<f32>(&read_after(&e, stream, inp, n * 4));
        for w in works {
            w.wait().unwrap();
        }
        let want: Vec<f64> = (0..n).map(|i| value(prev, i)).collect();
        assert_eq!(got, want, "rank {rank}");
    });
}

/// The order of calls in which the first GPU run's thread ranks hung
/// (`tests/cuda.rs`: allreduce, every op out of place then in place,
/// 1037 f32 a rank, on 2 ranks sharing a device; rank 1's kernel of call
/// #6, Min in place, waited for a frame of rank 0's, which had ended),
/// here on the stand-in running the executor kernel's source.
#[test]
fn every_op_in_the_order_the_gpu_run_hung() {
    let Some(hook) = crate::exec::oracle::host_launch::host_executor() else {
        return;
    };
    let launches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = launches.clone();
    let e = executor_device(&hook, 2, move |_| {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    let block = 1037;
    run_ranks_with(2, config, |comm| {
        let (rank, size) = (comm.rank(), comm.size());
        let stream = e.stream().unwrap();
        let bytes = block * 4;
        for op in ReduceOp::ALL {
            for in_place in [false, true] {
                let input: Vec<f32> = (0..block).map(|i| value(rank, i) as f32 + 1.0).collect();
                let send = DevicePtr::new(e.alloc_device_async(stream, bytes).unwrap());
                let recv = DevicePtr::new(e.alloc_device_async(stream, bytes).unwrap());
                enqueue_write(&e, stream, send, &bytes_of(&input));
                let call = CollCall {
                    op: Some(op),
                    in_place,
                    ..CollCall::new(CollKind::AllReduce, block, block, block)
                };
                let on = on_device(&e, stream, send, recv);
                let what = format!("{op} in place {in_place} rank {rank}");
                let work = comm
                    .device_collective::<f32>(&call, &on)
                    .unwrap_or_else(|err| panic!("{what}: {err}"));
                let out = if in_place { send } else { recv };
                let got = elems::<f32>(&read_after(&e, stream, out, bytes));
                work.wait().unwrap_or_else(|err| panic!("{what}: {err}"));
                for (i, g) in got.iter().enumerate() {
                    let vals = (0..size).map(|r| value(r, i) + 1.0);
                    let w = match op {
                        ReduceOp::Sum => vals.sum::<f64>(),
                        ReduceOp::Prod => vals.product(),
                        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
                        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                        ReduceOp::Avg => vals.sum::<f64>() / size as f64,
                    };
                    assert!(
                        (g - w).abs() <= w.abs() * 1e-6,
                        "{what} element {i}: {g} != {w}"
                    );
                }
                e.free_device_async(stream, send.buf).unwrap();
                e.free_device_async(stream, recv.buf).unwrap();
            }
        }
    });
    assert_eq!(
        launches.load(std::sync::atomic::Ordering::Relaxed),
        2 * 2 * ReduceOp::ALL.len(),
        "every call by the executor"
    );
}

/// Two thread ranks sharing a stand-in (staged), each reading every
/// call's result by a pageable copy to the host right after the call
/// (`HostEngine::blocking_read`, as cudarc's `clone_dtoh` and torch's
/// `.item()`), rank 0 always a little later than rank 1: rank 1 is inside
/// the copy, its stream parked at call k's gate, while rank 0 issues call
/// k. Each rank's result, and the stand-in's violations.
/// Eight in-place allreduces of `count` f32 on 2 ranks sharing `e`, the
/// input changed before each, every result read by a pageable copy
/// (`HostEngine::blocking_read`) and checked against the sum. `read_first`:
/// rank 0 a little later than rank 1, and each result read before the
/// call's `wait` (as a user's thread reading it right after the call),
/// else after it.
fn eight_allreduces(
    comm: &crate::Communicator,
    e: &Arc<HostEngine>,
    count: usize,
    read_first: bool,
) -> std::result::Result<(), String> {
    let rank = comm.rank();
    let (on, call) = small_allreduce(e, count);
    let (stream, buf) = (on.stream, on.send);
    (0..8).try_for_each(|k| {
        let input: Vec<f32> = (0..count)
            .map(|i| (value(rank, i) + k as f64) as f32)
            .collect();
        enqueue_write(e, stream, buf, &bytes_of(&input));
        if read_first && rank == 0 {
            std::thread::sleep(Duration::from_millis(30));
        }
        let failed = |err: Error| format!("call {k}: {err}");
        let mut work = Some(comm.device_collective::<f32>(&call, &on).map_err(failed)?);
        if !read_first {
            work.take().map_or(Ok(()), |w| w.wait()).map_err(failed)?;
        }
        let got = e
            .blocking_read(stream, buf, count * 4)
            .map_err(|err| format!("call {k}: read: {err}"))?;
        work.take().map_or(Ok(()), |w| w.wait()).map_err(failed)?;
        let got = elems::<f32>(&got);
        for (i, g) in got.iter().enumerate() {
            let w = (0..2).map(|r| value(r, i) + k as f64).sum::<f64>();
            if *g != w {
                return Err(format!("call {k} element {i}: {g} != {w}"));
            }
        }
        Ok(())
    })
}

fn reading_results(
    pool: Option<usize>,
    device_async: bool,
) -> (Vec<std::result::Result<(), String>>, Vec<String>) {
    let mut e = HostEngine::with_delays(Duration::from_micros(50), 11)
        .with_sync_limit(Duration::from_secs(2));
    if let Some(n) = pool {
        e = e.with_event_pool(n);
    }
    let e = Arc::new(e);
    let count = 300;
    let results = run_ranks_with(
        2,
        |c| {
            config(c);
            c.timeout = Duration::from_secs(20);
            c.device_async = device_async;
        },
        |comm| eight_allreduces(&comm, &e, count, true),
    );
    (results, e.violations())
}

/// A user's thread reading a result by a pageable copy, which waits
/// inside the driver for its stream, while a peer rank issues the call
/// that stream waits for: with the events made up front, as the CUDA
/// engine makes them, every call ends right; with none (each made under
/// the driver lock the reading thread holds, as the first GPU run hung),
/// the stand-in finds the deadlock and names the call (the progress
/// thread's `cuEventDestroy` of the call's event before it raises the
/// gate, or a `cuEventCreate`), and every rank returns.
#[test]
fn a_thread_reading_a_result_does_not_block_the_calls_it_waits_for() {
    let (results, violations) = reading_results(None, true);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(violations, Vec::<String>::new());
    let (results, violations) = reading_results(Some(0), true);
    assert!(results.iter().any(|r| r.is_err()), "{results:?}");
    assert!(
        violations
            .iter()
            .any(|v| v.starts_with("cuEvent") && v.contains("inside the driver")),
        "{violations:?}"
    );
}

/// The default (`Config::device_async` off): a call returns once its work
/// has ended, so no stream is parked while the progress thread calls the
/// driver. The same two ranks reading every result by a pageable copy,
/// with every event made under the driver lock (the pool empty, which
/// with parked streams deadlocks, the test above): every call ends
/// right and the stand-in finds nothing.
#[test]
fn calls_that_return_when_done_need_no_event_pool() {
    let (results, violations) = reading_results(Some(0), false);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(violations, Vec::<String>::new());
}

/// Two thread ranks sharing a stand-in whose streams share one hardware
/// queue (as a GPU with `CUDA_DEVICE_MAX_CONNECTIONS=1`, where the fourth
/// GPU run hung even one rank), 8 allreduces each with the inputs changed
/// between them. The ranks are staged (a rank's kernel could wait behind
/// the other's work). Each rank's result and the engine's fault.
fn on_one_hardware_queue(device_async: bool) -> (Vec<std::result::Result<(), String>>, String) {
    let mut e = HostEngine::with_delays(Duration::from_micros(50), 5)
        .with_hardware_queues(1)
        .with_sync_limit(Duration::from_secs(2));
    if let Some(hook) = crate::exec::oracle::host_launch::host_executor() {
        e = e.with_executor(hook);
    }
    let e = Arc::new(e);
    let count = 300;
    let results = run_ranks_with(
        2,
        |c| {
            config(c);
            c.timeout = Duration::from_secs(10);
            c.device_async = device_async;
        },
        |comm| eight_allreduces(&comm, &e, count, false),
    );
    let fault = e
        .host_wait(e.event().unwrap(), Duration::from_millis(1))
        .err()
        .map(|err| err.to_string())
        .unwrap_or_default();
    (results, fault)
}

/// On one hardware queue, calls that return when done end right on both
/// ranks and leave the stand-in without a fault; with the stream parked
/// (`device_async`) the call's own staging waits behind the park, and the
/// stand-in names the deadlock: as held back in the queue, or, where the
/// test's own pageable read of a result (queued on the same stuck queue)
/// reaches the stand-in's sync limit first, as that read's wait. Which of
/// the two waits is named first is a race (a full `--lib` run on 2 cores
/// named the read once, 2026-11-30); both are this one deadlock.
#[test]
fn one_hardware_queue_holds_back_only_a_parked_stream() {
    let (results, fault) = on_one_hardware_queue(false);
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(fault, "");
    let (results, fault) = on_one_hardware_queue(true);
    assert!(results.iter().any(|r| r.is_err()), "{results:?}");
    assert!(
        fault.contains("hardware queue")
            || fault.contains("a pageable copy to the host waited 2s for its stream"),
        "{fault}"
    );
}

/// The default again, against the forced deadlock: rank 0's stand-in
/// frees pinned memory at the progress thread's next host wait under a
/// gate; with no stream parked there is nothing for it to wait for, so
/// both ranks' second calls succeed (with parked streams, both fail,
/// `a_deadlock_the_stand_in_reports_is_an_error_on_every_rank`).
#[test]
fn calls_that_return_when_done_survive_the_forced_deadlock() {
    for shared in [false, true] {
        let results = forced_deadlock_with(shared, false);
        assert!(
            results.iter().all(|r| r.is_ok()),
            "shared {shared}: {results:?}"
        );
    }
}
