//! The reduction kernels against a device-to-device copy, in the same run
//! (issue 15, item 5): bytes read plus written per second. A reduce
//! `dst = a op b` reads two buffers and writes one (3 x size); the copy
//! reads one and writes one (2 x size). The target is at least 90% of the
//! copy's rate for f32 and bf16 from 64 MiB.
//!
//! Usage: ferroccl-kernel-bench [--iters N] [SIZE_MIB ...]   (default 64 256 1024)
//! Times come from CUDA events around N back-to-back launches after a
//! warm-up; three buffers per size, filled with random bits (never zeros).

use cudarc::driver::{result, sys};
use ferroccl_cuda::cuda_engine::CudaEngine;
use ferroccl_cuda::device::{DeviceBuf, DevicePtr, Engine, Stream};
use ferroccl_cuda::{DataType, ReduceOp};
use std::time::Duration;

fn main() {
    let mut iters = 20usize;
    let mut sizes: Vec<usize> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--iters" {
            iters = args.next().and_then(|v| v.parse().ok()).unwrap_or(iters);
        } else if let Ok(mib) = a.parse::<usize>() {
            sizes.push(mib);
        } else {
            eprintln!("usage: ferroccl-kernel-bench [--iters N] [SIZE_MIB ...]");
            std::process::exit(2);
        }
    }
    if sizes.is_empty() {
        sizes = vec![64, 256, 1024];
    }
    let e = match CudaEngine::new(0) {
        Ok(e) => e,
        Err(err) => {
            eprintln!("ferroccl-kernel-bench: {err}");
            std::process::exit(1);
        }
    };
    println!("# device 0, {}, {iters} launches per point", e.arch());
    println!(
        "# {:>9} {:>6} {:>5} {:>10} {:>10} {:>10} {:>7}",
        "size", "type", "op", "time(us)", "GB/s", "copy GB/s", "of copy"
    );
    for mib in sizes {
        let bytes = mib << 20;
        let s = e.stream().expect("stream");
        let bufs: Vec<_> = (0..3)
            .map(|_| e.alloc_device(bytes).expect("device memory"))
            .collect();
        fill_random(&e, s, &bufs, bytes);
        let copy_us = time(s, iters, || {
            e.d2d(s, DevicePtr::new(bufs[2]), DevicePtr::new(bufs[0]), bytes)
                .expect("copy")
        });
        let copy_rate = 2.0 * bytes as f64 / copy_us / 1e3;
        for (ty, op) in [
            (DataType::F32, ReduceOp::Sum),
            (DataType::Bf16, ReduceOp::Sum),
            (DataType::F32, ReduceOp::Max),
            (DataType::F16, ReduceOp::Sum),
            (DataType::F64, ReduceOp::Sum),
            (DataType::I32, ReduceOp::Sum),
        ] {
            let count = bytes / ty.size();
            let [a, b, d] = [0, 1, 2].map(|k| DevicePtr::new(bufs[k]));
            let us = time(s, iters, || {
                e.reduce(s, op, ty, d, a, b, count).expect("reduce")
            });
            let rate = 3.0 * bytes as f64 / us / 1e3;
            println!(
                "{:>9}M {:>6} {:>5} {:>10.1} {:>10.1} {:>10.1} {:>6.0}%",
                mib,
                ty.short_name(),
                op.name(),
                us,
                rate,
                copy_rate,
                100.0 * rate / copy_rate
            );
        }
        for b in bufs {
            e.free_device(b);
        }
        e.free_stream(s);
    }
}

/// Random bits in every buffer, through a pinned staging buffer.
fn fill_random(e: &CudaEngine, s: Stream, bufs: &[DeviceBuf], bytes: usize) {
    let chunk = bytes.min(64 << 20);
    let pin = e.alloc_pinned(chunk).expect("pinned memory");
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    for &b in bufs {
        let mut off = 0;
        while off < bytes {
            let n = chunk.min(bytes - off);
            e.with_pinned(pin, &mut |m| {
                for w in m.chunks_mut(8) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let v = x.to_le_bytes();
                    w.copy_from_slice(&v[..w.len()]);
                }
            })
            .expect("pinned access");
            e.h2d(s, DevicePtr::new(b).add(off), pin, 0, n)
                .expect("copy in");
            let done = e.event().expect("event");
            e.record(done, s).expect("record");
            e.host_wait(done, Duration::from_secs(60))
                .expect("copy in done");
            e.free_event(done);
            off += n;
        }
    }
    e.free_pinned(pin);
}

/// Microseconds per launch of `f` on `s`: CUDA events around `iters`
/// launches, after three warm-up launches.
fn time(s: Stream, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let stream = s.0 as sys::CUstream;
    let start = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).expect("event");
    let end = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT).expect("event");
    // SAFETY: both events and the stream belong to the engine's context,
    // which the engine's calls in the warm-up made current on this thread.
    unsafe { result::event::record(start, stream) }.expect("record");
    for _ in 0..iters {
        f();
    }
    // SAFETY: as above.
    unsafe { result::event::record(end, stream) }.expect("record");
    // SAFETY: `end` was recorded above; waiting for it is bounded by the
    // work enqueued before it.
    unsafe { result::event::synchronize(end) }.expect("synchronize");
    // SAFETY: both events were recorded on one stream and have completed.
    let ms = unsafe { result::event::elapsed(start, end) }.expect("elapsed");
    // SAFETY: the events are not used again.
    unsafe {
        let _ = result::event::destroy(start);
        let _ = result::event::destroy(end);
    }
    f64::from(ms) * 1e3 / iters as f64
}
