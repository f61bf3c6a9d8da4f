//! The raw entry points' tests: without a driver, on the host stand-in
//! of a GPU (one per rank, or one shared that runs the device executor's
//! kernel), and with bad buffers.

use super::*;
use crate::testing::run_ranks_with;

/// Without a usable driver (this machine and CI), every raw entry
/// point returns `NoDevice` with the reason, never panics, and issues
/// nothing: a host call afterwards runs as the first call on every
/// rank. With a device (the GPU run), the same bogus pointers are
/// refused as not device memory.
#[test]
fn raw_device_calls_without_a_driver_are_no_device() {
    let probe = super::super::device_count();
    run_ranks_with(
        2,
        |c| c.transport = Some("mem".into()),
        move |comm| {
            let host = [1.0f32; 8];
            let mut out = [0.0f32; 8];
            let (s, r) = (host.as_ptr().cast(), out.as_mut_ptr().cast());
            let null = std::ptr::null_mut();
            let mut two = [0u8; 8];
            two[..4].copy_from_slice(&2.0f32.to_ne_bytes());
            let premul = RawOp::PreMulSum(PreMulScalar::Value(two));
            // SAFETY: every call is refused before it touches memory:
            // without a driver by the probe, with one by the pointer
            // check (host memory is not device memory).
            let results = unsafe {
                [
                    comm.all_reduce_raw(s, r, 8, DataType::F32, ReduceOp::Sum, null),
                    comm.reduce_scatter_raw(s, r, 4, DataType::F32, ReduceOp::Sum, null),
                    comm.all_gather_raw(s, r, 4, DataType::F32, null),
                    comm.broadcast_raw(s, r, 8, DataType::F32, 0, null),
                    comm.reduce_raw(s, r, 8, DataType::F32, ReduceOp::Max, 1, null),
                    comm.send_raw(s, 8, DataType::F32, 1 - comm.rank(), null),
                    comm.recv_raw(r, 8, DataType::F32, 1 - comm.rank(), null),
                    comm.all_to_all_raw(s, r, 4, DataType::F32, null),
                    comm.all_reduce_raw(s, r, 8, DataType::F32, premul, null),
                ]
            };
            for result in results {
                match (&probe, result) {
                    (Err(Error::NoDevice(why)), Err(Error::NoDevice(got))) => {
                        assert_eq!(&got, why)
                    }
                    (Ok(_), Err(Error::InvalidArgument(why))) => {
                        assert!(why.contains("not CUDA device memory"), "{why}")
                    }
                    (probe, other) => panic!("probe {probe:?}, call gave {other:?}"),
                }
            }
            // Nothing was issued: the first host call matches on
            // every rank.
            let mut buf = [comm.rank() as f32 + 1.0; 3];
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
            assert_eq!(buf, [3.0; 3]);
        },
    );
}

use ferroccl_cuda::host_engine::HostEngine;
use std::sync::Mutex;
use std::time::Duration;

/// The host stand-in of a GPU behind the raw entry points: pointers
/// are checked against the allocations made through it, as the
/// driver checks them against its own.
struct StandIn {
    engine: Arc<HostEngine>,
    allocs: Mutex<Vec<(u64, usize)>>,
    fill: usize,
}

impl StandIn {
    fn new(seed: u64, fill: usize) -> StandIn {
        StandIn {
            engine: Arc::new(HostEngine::with_delays(Duration::from_micros(100), seed)),
            allocs: Mutex::new(Vec::new()),
            fill,
        }
    }

    fn alloc(&self, bytes: usize) -> u64 {
        // In stream order: ranks sharing the stand-in may have streams
        // parked at gates (the device rule holds for callers too).
        let b = self
            .engine
            .alloc_device_async(device::LEGACY_STREAM, bytes)
            .unwrap();
        self.allocs.lock().unwrap().push((b.0, bytes));
        b.0
    }

    fn free(&self, addr: u64) {
        self.allocs
            .lock()
            .unwrap()
            .retain(|&(start, _)| start != addr);
        self.engine
            .free_device_async(device::LEGACY_STREAM, DeviceBuf(addr))
            .unwrap();
    }

    fn ptr(&self, addr: u64) -> device::DevicePtr {
        let info = self.pointer_info(addr).unwrap();
        at(&info, addr)
    }

    /// Write `data` at `addr` by work enqueued on `stream` (a copy
    /// from pinned memory the stand-in may delay), not waited for: the
    /// call must wait for it itself.
    fn enqueue_write(&self, stream: Stream, addr: u64, data: &[u8]) {
        self.engine
            .enqueue_write(stream, self.ptr(addr), data)
            .unwrap();
    }

    /// Read `bytes` at `addr` by work enqueued on `stream` after the
    /// call, waiting only for that work.
    fn read_after(&self, stream: Stream, addr: u64, bytes: usize) -> Vec<u8> {
        let got = self
            .engine
            .enqueue_read(stream, self.ptr(addr), bytes)
            .unwrap();
        let out = got
            .recv_timeout(Duration::from_secs(30))
            .expect("the stream got to the read")
            .unwrap();
        assert_eq!(
            self.engine.violations(),
            Vec::<String>::new(),
            "the device rule"
        );
        out
    }
}

impl RawDevice for StandIn {
    fn pointer_info(&self, ptr: u64) -> std::result::Result<engine::PointerInfo, CudaError> {
        self.allocs
            .lock()
            .unwrap()
            .iter()
            .find(|&&(start, size)| ptr >= start && ptr < start + size as u64)
            .map(|&(start, size)| engine::PointerInfo {
                ordinal: 0,
                start,
                size,
            })
            .ok_or_else(|| {
                CudaError::InvalidArgument(format!(
                    "{ptr:#x} is not CUDA device memory (of the stand-in)"
                ))
            })
    }

    fn engine(&self, stream: u64, _ordinal: usize) -> Result<(Arc<dyn Engine>, Stream)> {
        Ok((self.engine.clone(), Stream(stream)))
    }

    fn premul_fill(&self) -> usize {
        self.fill
    }
}

/// Small integers: exact in every type tested, and their sums too.
fn value(rank: usize, i: usize) -> f64 {
    ((rank * 7 + i * 3) % 5) as f64
}

fn raw(kind: CollKind, send: u64, recv: u64, count: usize, dtype: DataType) -> Raw {
    Raw {
        kind,
        send,
        recv,
        count,
        dtype,
        op: None,
        premul: None,
        root: None,
        p2p: None,
        stream: 0,
    }
}

/// One raw call of a rank: its arguments, the buffers it needs
/// (element counts) and where its input lies in them, where its
/// output is read, and the f64 reference of that output.
struct Case {
    name: &'static str,
    raw: Raw,
    /// (buffer index, element offset, this rank's input values).
    inputs: Vec<(usize, usize, Vec<f64>)>,
    /// (buffer index, element offset, reference).
    want: Option<(usize, usize, Vec<f64>)>,
}

/// The raw entry points' own logic (NCCL's counts and in-place
/// layouts, the root's copy of an out-of-place broadcast, the copy of
/// an in-place all-to-all, PreMulSum's multiplication on the stream)
/// on the host stand-in, rank r with its own stand-in device: every
/// collective, in place and out of place, and PreMulSum with a scalar
/// by value and one in device memory written by work still pending on
/// the stream, each checked against an f64 reference computed from
/// the inputs' formula. PreMulSum's scalar fill is cut to 5 elements,
/// so that its doubling copies and its products in pieces (with a
/// short last piece) are all used.
#[test]
fn raw_calls_on_the_stand_in_match_the_reference() {
    for n in [1, 2, 3, 4] {
        let own = |rank: usize| Arc::new(StandIn::new(rank as u64 + 11, 5));
        raw_calls::<f32>(n, 0.5, &own);
        raw_calls::<half::bf16>(n, 0.5, &own);
        raw_calls::<i32>(n, 3.0, &own);
    }
}

/// The same calls where the ranks are threads on one stand-in device
/// that runs the device executor's kernel (its CUDA source built for
/// the host): every collective goes to the executor (the launches are
/// counted), with the in-place all-to-all's copy and PreMulSum's
/// products made on the stream before it.
#[test]
fn raw_calls_run_by_the_executor_on_a_shared_device() {
    let Some(hook) = crate::exec::oracle::host_launch::host_executor() else {
        return;
    };
    for n in [2, 3] {
        let launches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = launches.clone();
        let hook = hook.clone();
        let mut dev = StandIn::new(n as u64, 5);
        dev.engine = Arc::new(
            HostEngine::with_delays(Duration::from_micros(100), n as u64).with_executor(Arc::new(
                move |l: &ferroccl_cuda::executor::ExecLaunch| {
                    counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    hook(l)
                },
            )),
        );
        let dev = Arc::new(dev);
        raw_calls::<f32>(n, 0.5, &|_| dev.clone());
        // 13 collectives on every rank (sends and receives are
        // staged), all by the executor.
        assert_eq!(
            launches.load(std::sync::atomic::Ordering::Relaxed),
            13 * n,
            "{n} ranks: the executor did not run every collective"
        );
    }
}

/// The same calls on thread ranks sharing a stand-in whose streams share
/// one hardware queue (a GPU at `CUDA_DEVICE_MAX_CONNECTIONS=1`, where the
/// fourth GPU run hung a single rank at its first call): in a queue work
/// starts in the order it was enqueued, so anything that waits for a
/// later host action (a parked stream) would hold the rest back and be
/// named. With calls that return when done, and the ranks staged (the
/// stand-in, like a GPU, says its streams share queues), every call
/// matches the reference and nothing is named.
#[test]
fn raw_calls_on_one_hardware_queue() {
    for n in [2, 3] {
        let mut dev = StandIn::new(n as u64 + 20, 5);
        let mut e = HostEngine::with_delays(Duration::from_micros(100), n as u64 + 20)
            .with_hardware_queues(1)
            .with_sync_limit(Duration::from_secs(10));
        if let Some(hook) = crate::exec::oracle::host_launch::host_executor() {
            e = e.with_executor(hook);
        }
        dev.engine = Arc::new(e);
        let dev = Arc::new(dev);
        raw_calls::<f32>(n, 0.5, &|_| dev.clone());
        assert!(
            dev.engine.violations().is_empty(),
            "{:?}",
            dev.engine.violations()
        );
    }
}

fn raw_calls<T: Element>(n: usize, scalar: f64, device: &(dyn Fn(usize) -> Arc<StandIn> + Sync)) {
    let c = 37;
    run_ranks_with(
        n,
        |cfg| {
            cfg.transport = Some("mem".into());
            cfg.timeout = Duration::from_secs(60);
            cfg.calibrate = false;
        },
        |comm| {
            let (rank, size) = (comm.rank(), comm.size());
            let dt = T::DTYPE;
            let dev = device(rank);
            let stream = dev.engine.stream().unwrap();
            let elem = std::mem::size_of::<T>();
            let input = |len: usize| (0..len).map(|i| value(rank, i)).collect::<Vec<f64>>();
            let sum = |i: usize| (0..size).map(|r| value(r, i)).sum::<f64>();
            let last = size - 1;
            let cases = |b: &[u64]| -> Vec<Case> {
                let off = |k: usize, elems: usize| b[k] + (elems * elem) as u64;
                let mut v = vec![
                    Case {
                        name: "allreduce sum",
                        raw: Raw {
                            op: Some(ReduceOp::Sum),
                            ..raw(CollKind::AllReduce, b[0], b[1], c, dt)
                        },
                        inputs: vec![(0, 0, input(c))],
                        want: Some((1, 0, (0..c).map(sum).collect())),
                    },
                    Case {
                        name: "allreduce max in place",
                        raw: Raw {
                            op: Some(ReduceOp::Max),
                            ..raw(CollKind::AllReduce, b[0], b[0], c, dt)
                        },
                        inputs: vec![(0, 0, input(c))],
                        want: Some((
                            0,
                            0,
                            (0..c)
                                .map(|i| (0..size).map(|r| value(r, i)).fold(0.0, f64::max))
                                .collect(),
                        )),
                    },
                    Case {
                        name: "reduce-scatter sum in place",
                        raw: Raw {
                            op: Some(ReduceOp::Sum),
                            ..raw(CollKind::ReduceScatter, b[0], off(0, rank * c), c, dt)
                        },
                        inputs: vec![(0, 0, input(c * size))],
                        want: Some((0, rank * c, (0..c).map(|i| sum(rank * c + i)).collect())),
                    },
                    Case {
                        name: "reduce-scatter avg",
                        raw: Raw {
                            op: Some(ReduceOp::Avg),
                            ..raw(CollKind::ReduceScatter, b[0], b[1], c, dt)
                        },
                        inputs: vec![(0, 0, input(c * size))],
                        want: Some((
                            1,
                            0,
                            (0..c)
                                .map(|i| {
                                    let a = sum(rank * c + i) / size as f64;
                                    if dt == DataType::I32 {
                                        a.trunc()
                                    } else {
                                        a
                                    }
                                })
                                .collect(),
                        )),
                    },
                    Case {
                        name: "allgather in place",
                        raw: raw(CollKind::AllGather, off(0, rank * c), b[0], c, dt),
                        inputs: vec![(0, rank * c, input(c))],
                        want: Some((0, 0, (0..c * size).map(|j| value(j / c, j % c)).collect())),
                    },
                    Case {
                        name: "allgather",
                        raw: raw(CollKind::AllGather, b[0], b[1], c, dt),
                        inputs: vec![(0, 0, input(c))],
                        want: Some((1, 0, (0..c * size).map(|j| value(j / c, j % c)).collect())),
                    },
                    Case {
                        name: "broadcast out of place",
                        raw: Raw {
                            root: Some(last),
                            ..raw(CollKind::Broadcast, b[0], b[1], c, dt)
                        },
                        inputs: vec![(0, 0, input(c))],
                        want: Some((1, 0, (0..c).map(|i| value(last, i)).collect())),
                    },
                    Case {
                        name: "reduce min in place",
                        raw: Raw {
                            op: Some(ReduceOp::Min),
                            root: Some(last),
                            ..raw(CollKind::Reduce, b[0], b[0], c, dt)
                        },
                        inputs: vec![(0, 0, input(c))],
                        want: (rank == last).then(|| {
                            (
                                0,
                                0,
                                (0..c)
                                    .map(|i| {
                                        (0..size).map(|r| value(r, i)).fold(f64::MAX, f64::min)
                                    })
                                    .collect(),
                            )
                        }),
                    },
                    Case {
                        name: "all-to-all",
                        raw: raw(CollKind::AllToAll, b[0], b[1], c, dt),
                        inputs: vec![(0, 0, input(c * size))],
                        want: Some((
                            1,
                            0,
                            (0..c * size)
                                .map(|j| value(j / c, rank * c + j % c))
                                .collect(),
                        )),
                    },
                    Case {
                        name: "all-to-all in place",
                        raw: raw(CollKind::AllToAll, b[0], b[0], c, dt),
                        inputs: vec![(0, 0, input(c * size))],
                        want: Some((
                            0,
                            0,
                            (0..c * size)
                                .map(|j| value(j / c, rank * c + j % c))
                                .collect(),
                        )),
                    },
                    Case {
                        name: "allreduce premulsum, scalar by value",
                        raw: Raw {
                            op: Some(ReduceOp::Sum),
                            premul: Some(PreMulScalar::Value(scalar_bytes::<T>(scalar))),
                            ..raw(CollKind::AllReduce, b[0], b[1], c, dt)
                        },
                        inputs: vec![(0, 0, input(c))],
                        want: Some((1, 0, (0..c).map(|i| scalar * sum(i)).collect())),
                    },
                    Case {
                        name: "reduce-scatter premulsum in place, scalar on the device",
                        raw: Raw {
                            op: Some(ReduceOp::Sum),
                            premul: Some(PreMulScalar::Device(b[2])),
                            ..raw(CollKind::ReduceScatter, b[0], off(0, rank * c), c, dt)
                        },
                        inputs: vec![(0, 0, input(c * size)), (2, 0, vec![scalar])],
                        want: Some((
                            0,
                            rank * c,
                            (0..c).map(|i| scalar * sum(rank * c + i)).collect(),
                        )),
                    },
                    Case {
                        name: "reduce premulsum, scalar on the device",
                        raw: Raw {
                            op: Some(ReduceOp::Sum),
                            premul: Some(PreMulScalar::Device(off(2, 1))),
                            root: Some(0),
                            ..raw(CollKind::Reduce, b[0], b[1], c, dt)
                        },
                        inputs: vec![(0, 0, input(c)), (2, 1, vec![scalar])],
                        want: (rank == 0)
                            .then(|| (1, 0, (0..c).map(|i| scalar * sum(i)).collect())),
                    },
                ];
                if size > 1 {
                    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
                    let send = Case {
                        name: "send",
                        raw: Raw {
                            p2p: Some((next, true)),
                            ..raw(CollKind::SendRecv, b[0], b[0], c, dt)
                        },
                        inputs: vec![(0, 0, input(c))],
                        want: None,
                    };
                    let recv = Case {
                        name: "recv",
                        raw: Raw {
                            p2p: Some((prev, false)),
                            ..raw(CollKind::SendRecv, b[1], b[1], c, dt)
                        },
                        inputs: vec![],
                        want: Some((1, 0, (0..c).map(|i| value(prev, i)).collect())),
                    };
                    // Rank 0 receives first: no cycle of blocking sends.
                    if rank == 0 {
                        v.extend([recv, send]);
                    } else {
                        v.extend([send, recv]);
                    }
                }
                v
            };
            let lens = [c * size, c * size, 2];
            let plan = cases(&[0, 0, 0]).len();
            for k in 0..plan {
                let bufs: Vec<u64> = lens.iter().map(|&l| dev.alloc(l * elem)).collect();
                let case = cases(&bufs).swap_remove(k);
                let what = format!("{} ranks, rank {rank}, {dt}, {}", size, case.name);
                for (b, at, vals) in &case.inputs {
                    let data: Vec<T> = vals.iter().map(|&x| T::from_f64(x)).collect();
                    let addr = bufs[*b] + (at * elem) as u64;
                    dev.enqueue_write(stream, addr, bytemuck::cast_slice(&data));
                }
                let raw = Raw {
                    stream: stream.0,
                    ..case.raw
                };
                let work =
                    run_raw_on::<T>(&comm, raw, &*dev).unwrap_or_else(|e| panic!("{what}: {e}"));
                let got = case
                    .want
                    .as_ref()
                    .map(|(b, at, w)| read_elems::<T>(&dev, stream, bufs[*b], *at, w.len()));
                // PreMulSum leaves its input as it was (out of place).
                let kept = (raw.premul.is_some() && raw.send != raw.recv)
                    .then(|| read_elems::<T>(&dev, stream, bufs[0], 0, c));
                work.wait().unwrap_or_else(|e| panic!("{what}: {e}"));
                if let (Some(got), Some((_, _, want))) = (got, &case.want) {
                    for (i, (g, w)) in got.iter().zip(want).enumerate() {
                        assert!(
                            (g - w).abs() <= w.abs() * 1e-2,
                            "{what}: element {i}: {g} != {w}"
                        );
                    }
                }
                if let Some(kept) = kept {
                    assert_eq!(kept, input(c), "{what}: the input changed");
                }
                for b in bufs {
                    dev.free(b);
                }
            }
        },
    );
}

fn scalar_bytes<T: Element>(x: f64) -> [u8; 8] {
    let mut b = [0u8; 8];
    let v = T::from_f64(x);
    b[..std::mem::size_of::<T>()].copy_from_slice(bytemuck::bytes_of(&v));
    b
}

fn read_elems<T: Element>(
    dev: &StandIn,
    stream: Stream,
    buf: u64,
    at: usize,
    len: usize,
) -> Vec<f64> {
    let elem = std::mem::size_of::<T>();
    let bytes = dev.read_after(stream, buf + (at * elem) as u64, len * elem);
    bytemuck::pod_collect_to_vec::<u8, T>(&bytes)
        .iter()
        .map(|x| x.to_f64())
        .collect()
}

/// Buffers too short for NCCL's counts, overlapping without being in
/// place, not device memory, or a PreMulSum scalar outside any
/// allocation: refused with what was wrong, before anything is
/// issued (a host call afterwards is every rank's first).
#[test]
fn raw_calls_with_bad_buffers_are_refused_before_anything_moves() {
    run_ranks_with(
        2,
        |cfg| cfg.transport = Some("mem".into()),
        |comm| {
            let dev = StandIn::new(3, 5);
            let stream = dev.engine.stream().unwrap().0;
            let (one, two) = (dev.alloc(8 * 4), dev.alloc(8 * 4));
            let f32s = DataType::F32;
            let sum = Some(ReduceOp::Sum);
            let host = [0f32; 8];
            let bad = [
                (raw(CollKind::AllGather, one, two, 8, f32s), "recv buffer"),
                (
                    raw(CollKind::AllToAll, one, two, 8, f32s),
                    "run past its allocation",
                ),
                (
                    Raw {
                        op: sum,
                        ..raw(CollKind::AllReduce, one, one + 4, 4, f32s)
                    },
                    "overlap",
                ),
                (
                    Raw {
                        op: sum,
                        ..raw(CollKind::AllReduce, host.as_ptr() as u64, two, 8, f32s)
                    },
                    "not CUDA device memory",
                ),
                (
                    Raw {
                        op: sum,
                        premul: Some(PreMulScalar::Device(host.as_ptr() as u64)),
                        ..raw(CollKind::ReduceScatter, one, two, 4, f32s)
                    },
                    "PreMulSum scalar buffer",
                ),
                (
                    Raw {
                        op: sum,
                        premul: Some(PreMulScalar::Device(two + 30)),
                        ..raw(CollKind::AllReduce, one, two, 8, f32s)
                    },
                    "PreMulSum scalar buffer",
                ),
            ];
            for (r, needle) in bad {
                let r = Raw { stream, ..r };
                match run_raw_on::<f32>(&comm, r, &dev) {
                    Err(Error::InvalidArgument(why)) => {
                        assert!(why.contains(needle), "{r:?}: {why}")
                    }
                    other => panic!("{r:?}: {other:?}"),
                }
            }
            let mut buf = [comm.rank() as f32 + 1.0; 3];
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
            assert_eq!(buf, [3.0; 3]);
        },
    );
}
