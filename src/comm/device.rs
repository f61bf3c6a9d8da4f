//! Collectives on device buffers through the communicator, with NCCL's
//! stream semantics: a call takes its place in the order like any other
//! and returns at once; the caller's stream waits at the communicator's
//! gate for the call (`Engine::stream_wait_gate`), so later work on it
//! sees the result, and the progress thread carries the call out: it waits
//! for the stream's earlier work (an event recorded at the call), runs the
//! schedule through the staged executor (`exec::staged`), which returns
//! once every copy and kernel has finished, then raises the gate. The gate
//! is raised however the call ends (an error, a failed communicator, a job
//! dropped unrun), so a stream never waits on a call that will not come.
//!
//! The public entry points (`crate::cuda`: cudarc slices and a stream, and
//! raw pointers) are built on `device_collective`; the tests drive it with
//! the host stand-in of a GPU.

use super::{lock, Communicator, Inner, Work};
use crate::algo::encode::Layout;
use crate::coll::{self, CollCall};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec::{AvgFinish, DeviceBuffers, DeviceIo, ExecIo, Io};
use crate::plan::Memory;
use ferroccl_cuda::staging::{
    DeviceBuf, DevicePtr, Engine, Event, Gate, PinnedBuf, StagePool, Stream,
};
use std::sync::Arc;

/// Where a device call's buffers are, and what moves them.
#[derive(Clone)]
pub(crate) struct OnDevice {
    /// The device's ordinal.
    pub(crate) ordinal: u32,
    /// Its engine (CUDA, or the host stand-in).
    pub(crate) engine: Arc<dyn Engine>,
    /// The caller's stream.
    pub(crate) stream: Stream,
    /// The send buffer (in place: the one buffer).
    pub(crate) send: DevicePtr,
    /// The receive buffer (in place: ignored).
    pub(crate) recv: DevicePtr,
}

/// A communicator's gate on one engine: the callers' streams wait there
/// for the calls' numbers, which count the device calls on that engine.
pub(super) struct DeviceGate {
    engine: Arc<dyn Engine>,
    gate: Gate,
    /// Staging resources kept between this communicator's calls there.
    pool: Arc<StagePool>,
    /// The number of the last call issued on this engine.
    issued: u32,
}

/// A host wait for a device call: `wait()` blocks until the progress
/// thread has carried the call out (the caller's stream needs no host
/// wait: its later work already waits for the call). Dropping it is fine:
/// a failure also reaches [`Communicator::async_error`] and every later
/// call.
#[derive(Debug)]
pub struct DeviceWork(Work<()>);

impl DeviceWork {
    /// Wait for the call to end and return how it ended. Bounded: every
    /// wait inside the call is bounded by the communicator's timeout.
    pub fn wait(self) -> Result<()> {
        self.0.wait()
    }

    /// Whether the call has ended (`wait` would not block).
    pub fn is_complete(&self) -> bool {
        self.0.is_complete()
    }
}

/// Buffers that work enqueued on the caller's stream before a device call
/// uses (a raw PreMulSum's scaled input and its scalar), kept until the
/// call ends and then freed with the call's own scratch.
#[derive(Default)]
pub(crate) struct Keep {
    /// Device buffers.
    pub(crate) device: Vec<DeviceBuf>,
    /// Pinned host buffers.
    pub(crate) pinned: Vec<PinnedBuf>,
}

/// What a device call holds until it ends: its scratch, the event of the
/// caller's earlier work, and its place at the gate, raised when this is
/// dropped (the call ended, or its job was dropped unrun).
struct Held {
    engine: Arc<dyn Engine>,
    scratch: Vec<DeviceBuf>,
    pinned: Vec<PinnedBuf>,
    ready: Option<Event>,
    gate: Option<(Gate, u32)>,
}

impl Drop for Held {
    fn drop(&mut self) {
        // Every copy and kernel of the call has finished (the staged run
        // waits for them, also when it fails) or never started.
        for s in self.scratch.drain(..) {
            self.engine.free_device(s);
        }
        for p in self.pinned.drain(..) {
            self.engine.free_pinned(p);
        }
        if let Some(e) = self.ready.take() {
            self.engine.free_event(e);
        }
        if let Some((gate, value)) = self.gate.take() {
            self.engine.raise_gate(gate, value);
        }
    }
}

impl Inner {
    /// Make this communicator's gate on `engine` at its first call there;
    /// its staging pool.
    fn open_gate(&self, engine: &Arc<dyn Engine>) -> Result<Arc<StagePool>> {
        let mut gates = lock(&self.gates);
        if let Some(g) = gates.iter().find(|g| Arc::ptr_eq(&g.engine, engine)) {
            return Ok(g.pool.clone());
        }
        let gate = engine
            .gate()
            .map_err(|e| Error::Io(format!("device gate: {e}")))?;
        let pool = Arc::new(StagePool::new(engine.clone()));
        gates.push(DeviceGate {
            engine: engine.clone(),
            gate,
            pool: pool.clone(),
            issued: 0,
        });
        Ok(pool)
    }

    /// The gate on `engine` and the number of the next call there; called
    /// under the issue lock, so numbers follow the order calls are carried
    /// out in.
    fn next_gate(&self, engine: &Arc<dyn Engine>) -> Option<(Gate, u32)> {
        let mut gates = lock(&self.gates);
        let g = gates.iter_mut().find(|g| Arc::ptr_eq(&g.engine, engine))?;
        g.issued = g.issued.wrapping_add(1);
        Some((g.gate, g.issued))
    }

    /// Raise every gate to its last call (tear-down: no stream may wait
    /// for a call that will not run).
    pub(super) fn raise_gates(&self) {
        for g in lock(&self.gates).iter() {
            g.engine.raise_gate(g.gate, g.issued);
        }
    }
}

impl Communicator {
    /// Enqueue `call` on the device buffers of `on` (see the module docs):
    /// returns once the call is issued and the caller's stream waits for
    /// it. A bad argument is refused before anything is enqueued.
    pub(crate) fn device_collective<T: Element>(
        &self,
        call: &CollCall,
        on: &OnDevice,
    ) -> Result<DeviceWork> {
        self.device_collective_keeping::<T>(call, on, Keep::default())
    }

    /// [`Communicator::device_collective`], keeping `keep` until the call
    /// ends (freed then, or at once if the call is refused).
    pub(crate) fn device_collective_keeping<T: Element>(
        &self,
        call: &CollCall,
        on: &OnDevice,
        keep: Keep,
    ) -> Result<DeviceWork> {
        let call = CollCall {
            memory: Memory::Device {
                ordinal: on.ordinal,
            },
            ..*call
        };
        let plan = self.plan::<T>(&call)?;
        let elem = std::mem::size_of::<T>();
        let engine = on.engine.clone();
        let device_err = |e| Error::Io(format!("{} on device memory: {e}", call.kind.name()));
        let mut held = Held {
            engine: engine.clone(),
            scratch: keep.device,
            pinned: keep.pinned,
            ready: None,
            gate: None,
        };
        // A schedule that keeps partial results in an output the caller did
        // not give (a tree reduce's inner ranks) gets device scratch.
        let scratch = match plan.scratch_output {
            0 => None,
            n => {
                let s = engine.alloc_device(n * elem).map_err(device_err)?;
                held.scratch.push(s);
                Some(s)
            }
        };
        // A schedule that reads its input after writing its output at the
        // same place runs in place from a copy of the input (as on the
        // host), made on the caller's stream, after its earlier work. An
        // all-to-all in place (NCCL's `sendbuff == recvbuff`, which the
        // host API has no verb for) is such a schedule: a block received
        // may land where a block not yet sent lies.
        let copies_input = plan.copies_input || call.kind == crate::coll::CollKind::AllToAll;
        let copy = if call.in_place
            && scratch.is_none()
            && copies_input
            && plan.input_base == 0
            && plan.output_base == 0
        {
            let bytes = call.send_len * elem;
            let made = engine.alloc_device(bytes).map_err(device_err)?;
            held.scratch.push(made);
            engine
                .d2d(on.stream, DevicePtr::new(made), on.send, bytes)
                .map_err(device_err)?;
            Some(made)
        } else {
            None
        };
        let layout = match (scratch, copy) {
            (None, None) if call.in_place => Layout::Shared {
                input_base: plan.input_base,
                output_base: plan.output_base,
            },
            _ => Layout::Separate,
        };
        let bufs = match (scratch, copy) {
            (Some(s), _) => DeviceBuffers {
                input: on.send,
                output: DevicePtr::new(s),
            },
            (None, Some(c)) => DeviceBuffers {
                input: DevicePtr::new(c),
                output: on.send,
            },
            (None, None) if call.in_place => DeviceBuffers {
                input: on.send.add(plan.input_base * elem),
                output: on.send.add(plan.output_base * elem),
            },
            (None, None) => DeviceBuffers {
                input: on.send,
                output: on.recv,
            },
        };
        // Avg's division, where this rank holds a result: the range is the
        // caller's, the executor's output starts at the output base.
        let base = if call.in_place { plan.output_base } else { 0 };
        let avg = (call.op == Some(ReduceOp::Avg) && scratch.is_none())
            .then(|| coll::result_range(&call, &plan, self.rank()))
            .flatten()
            .map(|range| AvgFinish {
                range: range.start.saturating_sub(base)..range.end.saturating_sub(base),
                ranks: self.size(),
            });
        let pool = self.inner.open_gate(&engine)?;
        // The caller's work so far (and the input copy above), which the
        // progress thread waits for before the call's first copy.
        let ready = engine.event().map_err(device_err)?;
        held.ready = Some(ready);
        engine.record(ready, on.stream).map_err(device_err)?;
        let io = DeviceIo {
            ordinal: on.ordinal,
            bufs,
            pool,
            ready,
            avg,
            exec: ExecIo {
                coll: call,
                layout,
                base: on.send,
            },
            gate: None,
        };
        // Issue: the job is queued under the issue lock, where the call
        // also gets its number at the gate.
        let mut gated = None;
        let inner = self.inner.clone();
        let at_issue = || {
            held.gate = inner.next_gate(&engine);
            gated = held.gate;
            held
        };
        // `held` goes with the job: dropped when the call has ended (the
        // gate raised before the caller hears), or unrun with the job.
        let work = self.run_async_at(self.spec::<T>(&call), at_issue, move |inner, c, held| {
            let io = DeviceIo {
                gate: held.gate,
                ..io
            };
            let result = inner.execute(&plan, Io::<T>::Device(io), c);
            drop(held);
            result
        })?;
        let during = work.during.clone();
        let (gate, value) = gated.ok_or_else(|| Error::Io(format!("{during}: no device gate")))?;
        // After the issue: the job may already have raised the gate past
        // this number, and then the wait passes at once. Bounded for
        // engines that wait on the host: every call before this one is.
        let limit = self.inner.config.timeout.saturating_mul(4);
        engine
            .stream_wait_gate(on.stream, gate, value, limit)
            .map_err(|e| {
                Error::Io(format!(
                    "{during}: the call was issued, but the stream could not be made to wait \
                     for it: {e}"
                ))
            })?;
        Ok(DeviceWork(work))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::CollKind;
    use crate::element::DataType;
    use crate::testing::run_ranks_with;
    use ferroccl_cuda::staging::HostEngine;
    use std::time::Duration;

    fn config(c: &mut crate::Config) {
        c.transport = Some("mem".into());
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

    /// Put `data` in device memory by work enqueued on `stream` (a copy
    /// from pinned memory, which the stand-in may delay) without waiting
    /// for it: the call must wait for it itself.
    fn enqueue_write(e: &HostEngine, stream: Stream, at: DevicePtr, data: &[u8]) {
        let pin = e.alloc_pinned(data.len().max(1)).unwrap();
        e.with_pinned(pin, &mut |m| m[..data.len()].copy_from_slice(data))
            .unwrap();
        e.h2d(stream, at, pin, 0, data.len()).unwrap();
    }

    /// Read `bytes` at `at` by work enqueued on `stream` after the call,
    /// waiting only for that work: the call's result must be there.
    fn read_after(e: &HostEngine, stream: Stream, at: DevicePtr, bytes: usize) -> Vec<u8> {
        let pin = e.alloc_pinned(bytes.max(1)).unwrap();
        e.d2h(stream, pin, 0, at, bytes).unwrap();
        let done = e.event().unwrap();
        e.record(done, stream).unwrap();
        e.host_wait(done, Duration::from_secs(30)).unwrap();
        let mut out = Vec::new();
        e.with_pinned(pin, &mut |m| out = m[..bytes].to_vec())
            .unwrap();
        out
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
    /// `exec::program::host_launch`): every rank of the communicator is a
    /// thread of this process on one "GPU", so the launcher takes the
    /// executor for every collective (the launches are counted) instead of
    /// staging, and the results must be the same.
    #[test]
    fn device_calls_run_by_the_executor_on_a_shared_device() {
        let Some(hook) = crate::exec::program::host_launch::host_executor() else {
            return;
        };
        for n in [1, 2, 3, 4] {
            let launches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let widest = Arc::new(std::sync::atomic::AtomicU32::new(0));
            let (counted, wide) = (launches.clone(), widest.clone());
            let hook = hook.clone();
            let e = Arc::new(
                HostEngine::with_delays(Duration::from_micros(100), n as u64).with_executor(
                    Arc::new(move |l: &ferroccl_cuda::executor::ExecLaunch| {
                        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        wide.fetch_max(l.channels, std::sync::atomic::Ordering::Relaxed);
                        hook(l)
                    }),
                ),
            );
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
                c.max_channels = 4;
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

    /// An in-place f32 allreduce of `count` zeroes on `e`, on a stream of
    /// its own: the call and where it runs.
    fn small_allreduce(e: &Arc<HostEngine>, count: usize) -> (OnDevice, CollCall) {
        let stream = e.stream().unwrap();
        let buf = DevicePtr::new(e.alloc_device(count * 4).unwrap());
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

    /// Two thread ranks on one executor device: one call sets the
    /// executor up; in the next, rank 1 never calls (`silent`) or rank 0
    /// is aborted while its kernel waits (`abort`). Rank 0's result and
    /// how long the call took.
    fn executor_failure(abort: bool) -> Option<(Result<()>, Duration)> {
        let hook = crate::exec::program::host_launch::host_executor()?;
        let e = Arc::new(HostEngine::new().with_executor(hook));
        // The timeout also bounds the first call's device set-up, which
        // took over 2 s on a loaded 2-core machine (a test binary built
        // beside three others): 8 s leaves it room.
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
        let lib = crate::exec::program::host_launch::library_path()?;
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
        let hook = crate::exec::program::host_launch::host_executor().expect("the library");
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
                wide.max_channels = 3;
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
            let root =
                (kind == CollKind::Broadcast || kind == CollKind::Reduce).then_some(size - 1);
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
            let send = DevicePtr::new(e.alloc_device(buf_len * elem).unwrap());
            let recv = DevicePtr::new(e.alloc_device(buf_len * elem).unwrap());
            let at = if in_place && kind == CollKind::AllGather {
                send.add(rank * block * elem)
            } else {
                send
            };
            enqueue_write(e, stream, at, &bytes_of(&input));
            let engine: Arc<dyn Engine> = e.clone();
            let on = OnDevice {
                ordinal: 0,
                engine,
                stream,
                send,
                recv,
            };
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
                CollKind::ReduceScatter => {
                    Some((0..block).map(|i| sum(rank * block + i)).collect())
                }
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
            e.free_device(send.buf);
            e.free_device(recv.buf);
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
            let hold = e.gate().unwrap();
            e.stream_wait_gate(stream, hold, 1, Duration::from_secs(30))
                .unwrap();
            enqueue_write(&e, stream, buf, &bytes_of(&input));
            let engine: Arc<dyn Engine> = e.clone();
            let on = OnDevice {
                ordinal: 0,
                engine,
                stream,
                send: buf,
                recv: buf,
            };
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
            e.raise_gate(hold, 1);
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
}
