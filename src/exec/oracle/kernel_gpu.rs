//! The device executor's kernels on a real GPU: the planner's programs of
//! every rank of a call, each rank a kernel on its own stream of one GPU
//! (ranks of one process: the FIFOs are plain device pointers, which is
//! what cuda-ipc maps for ranks of other processes), launched at once;
//! every buffer must equal the host executor's bit for bit, for both
//! protocols. The abort word of each rank is a gate word in mapped host
//! memory: a kernel that has not ended 20 s after launch has it set, and
//! one still running 10 s later fails the test as a hang.
//!
//! Skipped, saying so, without a CUDA driver and device (the build
//! machines); the GPU script (`cuda/gpu/run.sh`) runs it. The machinery
//! takes any [`Engine`]: `host_launch` runs it on the host stand-in with
//! the kernels built for the host.

use super::kernel_host::judge;
use super::tests::{check, grid, idle_image, reduces, sweep_runs, Case, RankRun, STEPS};
use super::Buffers;
use crate::algo::Algorithm;
use crate::coll::CollKind;
use crate::element::{DataType, ReduceOp};
use ferroccl_cuda::cuda_engine::CudaEngine;
use ferroccl_cuda::device::{DeviceBuf, DevicePtr, Engine, Stream};
use ferroccl_cuda::executor::{self, Conn, Control, ExecLaunch, Protocol, CONTROL_BYTES};
use std::time::{Duration, Instant};

/// Slots as the host run's (`STEPS` of the planner's 128-byte frames, for
/// both protocols: its plans keep `STEPS - 1` slices in flight), LL
/// cleaning every 5 frames, a production spin count between abort checks.
const SLOTS: u32 = STEPS as u32;
const SLOT_BYTES: u32 = 128;
const LL_SLOTS: u32 = STEPS as u32;
const LL_LINES: u32 = 1 + 128 / 8;
const LL_CLEAN: u64 = 5;

fn engine() -> Option<std::sync::Arc<CudaEngine>> {
    match CudaEngine::shared(0) {
        Ok(e) => Some(e),
        Err(e) => {
            if std::env::var("FERROCCL_REQUIRE_DEVICE").is_ok_and(|v| v == "1") {
                panic!("FERROCCL_REQUIRE_DEVICE=1 but no device: {e}");
            }
            eprintln!("GPU executor tests skipped: {e}");
            None
        }
    }
}

/// Device memory the test frees at the end.
struct Mem<'a> {
    e: &'a dyn Engine,
    bufs: Vec<DeviceBuf>,
}

impl Mem<'_> {
    fn upload(&mut self, stream: Stream, bytes: &[u8]) -> u64 {
        let e = self.e;
        let n = bytes.len().max(16);
        let dev = e.alloc_device(n).expect("cuMemAlloc");
        self.bufs.push(dev);
        let pinned = e.alloc_pinned(n).expect("pinned");
        e.with_pinned(pinned, &mut |p| {
            p.fill(0);
            p[..bytes.len()].copy_from_slice(bytes);
        })
        .unwrap();
        e.h2d(
            stream,
            DevicePtr {
                buf: dev,
                offset: 0,
            },
            pinned,
            0,
            n,
        )
        .unwrap();
        sync(e, stream);
        e.free_pinned(pinned);
        dev.0
    }

    fn download(&self, stream: Stream, dev: u64, len: usize) -> Vec<u8> {
        let e = self.e;
        if len == 0 {
            return Vec::new();
        }
        let pinned = e.alloc_pinned(len).unwrap();
        e.d2h(
            stream,
            pinned,
            0,
            DevicePtr {
                buf: DeviceBuf(dev),
                offset: 0,
            },
            len,
        )
        .unwrap();
        sync(e, stream);
        let mut out = vec![0u8; len];
        e.with_pinned(pinned, &mut |p| out.copy_from_slice(&p[..len]))
            .unwrap();
        e.free_pinned(pinned);
        out
    }
}

impl Drop for Mem<'_> {
    fn drop(&mut self) {
        for b in self.bufs.drain(..) {
            self.e.free_device(b);
        }
    }
}

fn sync(e: &dyn Engine, stream: Stream) {
    let ev = e.event().unwrap();
    e.record(ev, stream).unwrap();
    e.host_wait(ev, Duration::from_secs(60)).unwrap();
    e.free_event(ev);
}

/// Runs one call's programs on the GPU (or `e`'s stand-in of one): per
/// rank, its Control and its buffers afterwards.
fn run_on_gpu(
    e: &dyn Engine,
    protocol: Protocol,
    dtype: DataType,
    op: Option<ReduceOp>,
    runs: &[Option<RankRun>],
) -> Result<Vec<(Control, Buffers<u8>)>, String> {
    let n = runs.len();
    let mut mem = Mem {
        e,
        bufs: Vec::new(),
    };
    let setup = e.stream().map_err(|e| e.to_string())?;
    let images: Vec<Vec<u8>> = runs
        .iter()
        .enumerate()
        .map(|(r, run)| match run {
            Some(run) => run.image.clone(),
            None => idle_image(r, n, dtype, op),
        })
        .collect();
    let channels: Vec<u32> = images
        .iter()
        .map(|i| u16::from_le_bytes([i[20], i[21]]) as u32)
        .collect();
    let c_max = *channels.iter().max().unwrap() as usize;
    // FIFO (s -> r, c): one zeroed region in device memory.
    let slots_b = (SLOTS * SLOT_BYTES) as u64;
    let meta_b = 8 * SLOTS as u64;
    let ll_b = (LL_SLOTS * LL_LINES * 16) as u64;
    let region = slots_b + meta_b + ll_b + 3 * 128;
    let mut fifo = vec![0u64; n * n * c_max];
    for f in fifo.iter_mut() {
        *f = mem.upload(setup, &vec![0u8; region as usize]);
    }
    let at = |base: u64| FifoAt {
        slots: base,
        meta: base + slots_b,
        ll: base + slots_b + meta_b,
        tail: base + slots_b + meta_b + ll_b,
        head: base + slots_b + meta_b + ll_b + 128,
        ll_head: base + slots_b + meta_b + ll_b + 256,
    };
    let mut ranks = Vec::new();
    for r in 0..n {
        let mut table = vec![Conn::default(); c_max * n];
        for c in 0..c_max {
            for p in 0..n {
                let to = at(fifo[(r * n + p) * c_max + c]);
                let from = at(fifo[(p * n + r) * c_max + c]);
                table[c * n + p] = Conn {
                    send_slots: to.slots,
                    send_meta: to.meta,
                    send_tail: to.tail,
                    send_head: to.head,
                    send_ll: to.ll,
                    send_ll_head: to.ll_head,
                    recv_slots: from.slots,
                    recv_meta: from.meta,
                    recv_tail: from.tail,
                    recv_head: from.head,
                    recv_ll: from.ll,
                    recv_ll_head: from.ll_head,
                    ll_clean: LL_CLEAN,
                    slots: SLOTS,
                    slot_bytes: SLOT_BYTES,
                    ll_slots: LL_SLOTS,
                    ll_lines: LL_LINES,
                    ..Conn::default()
                };
            }
        }
        let gate = e.gate().map_err(|e| e.to_string())?;
        let abort = e.gate_device_address(gate).map_err(|e| e.to_string())?;
        let ctl = Control {
            abort,
            spin_check: 1 << 12,
            ..Control::default()
        };
        let (a, b) = match runs[r].as_ref().map(|r| &r.before) {
            Some(Buffers::Separate { input, output }) => (input.clone(), output.clone()),
            Some(Buffers::Shared { buf }) => (buf.clone(), Vec::new()),
            None => (Vec::new(), Vec::new()),
        };
        let shared = matches!(
            runs[r].as_ref().map(|r| &r.before),
            Some(Buffers::Shared { .. })
        );
        let image = mem.upload(setup, &images[r]);
        let da = mem.upload(setup, &a);
        let db = if shared { da } else { mem.upload(setup, &b) };
        let conns = mem.upload(setup, &executor::conns_to_bytes(&table));
        let dctl = mem.upload(setup, &ctl.to_bytes());
        ranks.push((gate, image, da, db, conns, dctl, a.len(), b.len(), shared));
    }
    // Launch every rank at once, each on its own stream.
    let streams: Vec<Stream> = (0..n).map(|_| e.stream().unwrap()).collect();
    for (r, &(_, image, da, db, conns, dctl, ..)) in ranks.iter().enumerate() {
        let launch = ExecLaunch {
            protocol,
            op,
            ty: dtype,
            channels: channels[r],
            program: image,
            input: da,
            output: db,
            conns,
            ctl: dctl,
        };
        e.launch_executor(streams[r], &launch)
            .map_err(|e| format!("launch rank {r}: {e}"))?;
    }
    let events: Vec<_> = streams
        .iter()
        .map(|&s| {
            let ev = e.event().unwrap();
            e.record(ev, s).unwrap();
            ev
        })
        .collect();
    let started = Instant::now();
    for (r, &ev) in events.iter().enumerate() {
        let left = Duration::from_secs(20).saturating_sub(started.elapsed());
        if e.host_wait(ev, left.max(Duration::from_millis(1))).is_err() {
            // The host's timeout: raise every abort word, then give the
            // kernels 10 s to see it.
            for &(gate, ..) in &ranks {
                e.raise_gate(gate, 1);
            }
            if let Err(err) = e.host_wait(ev, Duration::from_secs(10)) {
                panic!("rank {r}'s kernel still runs 10 s after its abort word was set: {err}");
            }
        }
    }
    let mut out = Vec::new();
    for &(_, _, da, db, _, dctl, alen, blen, shared) in &ranks {
        let ctl = Control::from_bytes(&mem.download(setup, dctl, CONTROL_BYTES)).unwrap();
        let a = mem.download(setup, da, alen);
        let bufs = if shared {
            Buffers::Shared { buf: a }
        } else {
            Buffers::Separate {
                input: a,
                output: mem.download(setup, db, blen),
            }
        };
        out.push((ctl, bufs));
    }
    for s in streams {
        e.free_stream(s);
    }
    for ev in events {
        e.free_event(ev);
    }
    e.free_stream(setup);
    Ok(out)
}

struct FifoAt {
    slots: u64,
    meta: u64,
    ll: u64,
    tail: u64,
    head: u64,
    ll_head: u64,
}

/// Runs `cases` of `algo` on `n` ranks through the host executor, then
/// the same programs through `e`'s kernels with `protocol`: the failures.
pub(super) fn gpu_sweep(
    e: &dyn Engine,
    n: usize,
    algo: Algorithm,
    cases: &[Case],
    protocol: Protocol,
) -> Vec<String> {
    let (mut failures, runs) = sweep_runs(n, algo, cases);
    let device = if e.stand_in_uuid().is_some() {
        "stand-in"
    } else {
        "GPU"
    };
    for (_, case, runs) in &runs {
        let what = format!("{device} {} {algo} {case:?} on {n} ranks", protocol.name());
        let op = reduces(case.kind).then_some(case.op);
        match run_on_gpu(e, protocol, case.dtype, op, runs) {
            Err(err) => failures.push(format!("{what}: {err}")),
            Ok(got) => failures.extend(judge(&what, runs, got.iter().map(|(c, b)| (c, b)))),
        }
    }
    failures
}

/// Every collective, both protocols, 2, 3 and 4 ranks on one GPU.
#[test]
fn the_kernels_match_the_executor_on_the_gpu() {
    use CollKind::*;
    let Some(e) = engine() else {
        return;
    };
    let t = Instant::now();
    let mut failures = Vec::new();
    for p in Protocol::ALL {
        for n in [2, 3, 4] {
            let all = [
                AllReduce,
                ReduceScatter,
                AllGather,
                Broadcast,
                Reduce,
                AllToAll,
                SendRecv,
            ];
            failures.extend(gpu_sweep(&*e, n, Algorithm::Ring, &grid(n, &all), p));
            failures.extend(gpu_sweep(
                &*e,
                n,
                Algorithm::Tree,
                &grid(n, &[AllReduce]),
                p,
            ));
        }
    }
    check(failures, t, "GPU executor kernels");
}
