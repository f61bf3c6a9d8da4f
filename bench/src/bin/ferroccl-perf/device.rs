//! `--device cuda`: the buffers in GPU memory, every call enqueued on one
//! stream through `Communicator::on_stream`, times from CUDA events around
//! back-to-back calls (nccl-tests' way on GPUs). With `-t` the threads of a
//! process are ranks on the process's GPU, each with a stream of its own.
//!
//! Inputs, outputs' poison and the check are the host mode's (`fill`,
//! `count_wrong`): the pattern is made in host memory and copied in, the
//! results copied out and counted against the same f64 reference.
//!
//! cudarc panics when libcuda is missing, so nothing here calls it before
//! [`available`] has said there is a device.

use super::{count_wrong, fill, lengths, AnyResult, Buf, Buffers, Measure, Report, Row, Shape};
use cuda::cudarc::driver::sys::{CUdevice_attribute, CUevent_flags};
use cuda::cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};
use ferroccl::cuda::{self, DeviceWork};
use ferroccl::{Communicator, Element, ReduceOp};
use ferroccl_bench::coll::Coll;
use ferroccl_bench::options::Options;
use std::sync::Arc;

/// Copies of the pinned-bandwidth measure each way, after one untimed.
const PINNED_COPIES: usize = 5;

/// The number of CUDA devices, or why none can be used.
pub(super) fn available() -> Result<usize, String> {
    cuda::device_count().map_err(|e| match e {
        ferroccl::Error::NoDevice(reason) => reason,
        other => other.to_string(),
    })
}

/// This rank's GPU: its primary context, the stream every call goes on,
/// and what the header says about it.
pub(super) struct Gpu {
    stream: Arc<CudaStream>,
    ordinal: usize,
    name: String,
    pci_bus: i32,
    pinned: PinnedCopy,
}

/// Bandwidth of copies between device memory and pinned host memory.
struct PinnedCopy {
    bytes: usize,
    /// GB/s (10^9 bytes per second), device to host.
    d2h: f64,
    /// GB/s, host to device.
    h2d: f64,
}

impl Gpu {
    /// Open GPU `LOCAL_RANK % count` (as nccl-tests places one rank per
    /// GPU, and ranks beyond the GPU count share them; the `-t` threads of
    /// one process all open their process's GPU) on a new stream of this
    /// rank's own, and measure its
    /// pinned copy bandwidth at the largest size. The ranks measure in
    /// turn, so that each number is one copy's alone, not a share of
    /// copies that ranks on one GPU or one PCIe link run at once.
    pub(super) fn open(comm: &Communicator, opts: &Options) -> AnyResult<Gpu> {
        let count = available().map_err(|reason| format!("--device cuda: {reason}"))?;
        let local_rank = ferroccl::bootstrap::detect_process_env().map_or(0, |i| i.local_rank);
        let ordinal = local_rank % count;
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.new_stream()?;
        let name = ctx.name()?;
        let pci_bus = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
        let bytes = opts.sizes().last().copied().unwrap_or(opts.max_bytes);
        let mut pinned = None;
        for turn in 0..comm.size() {
            if turn == comm.rank() {
                pinned = Some(measure_pinned_copy(&ctx, &stream, bytes)?);
            }
            comm.barrier()?;
        }
        Ok(Gpu {
            stream,
            ordinal,
            name,
            pci_bus,
            pinned: pinned.expect("every rank has a turn"),
        })
    }

    /// `device 0 [0x07] NVIDIA H100 80GB HBM3`, as nccl-tests names a
    /// rank's GPU.
    pub(super) fn description(&self) -> String {
        format!(
            "device {} [0x{:02x}] {}",
            self.ordinal, self.pci_bus, self.name
        )
    }

    /// `d2h X GB/s, h2d Y GB/s (N bytes)`, the rest of the header's
    /// `# pinned copy:` line.
    pub(super) fn pinned_copy(&self) -> String {
        let p = &self.pinned;
        format!(
            "d2h {:.2} GB/s, h2d {:.2} GB/s ({} bytes) device {}",
            p.d2h, p.h2d, p.bytes, self.ordinal
        )
    }
}

fn timing_event(stream: &CudaStream) -> AnyResult<CudaEvent> {
    Ok(stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?)
}

/// Time [`PINNED_COPIES`] copies of `bytes` each way between device
/// memory and page-locked host memory allocated as the staging engine
/// allocates its bounce buffers (`cuMemHostAlloc` with no flags).
fn measure_pinned_copy(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    bytes: usize,
) -> AnyResult<PinnedCopy> {
    let mut dev = stream.alloc_zeros::<u8>(bytes)?;
    // SAFETY: the allocation's bytes are unset; they are set just below,
    // through a raw pointer, before anything reads them.
    let mut host = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }?;
    let p = host.as_mut_ptr()?;
    // SAFETY: `p` is the start of the `bytes` bytes just allocated, which
    // nothing else refers to yet.
    unsafe { std::ptr::write_bytes(p, 0, bytes) };
    // One copy each way first: the first touch of the pages by the copy
    // engine is slower than the rest.
    stream.memcpy_dtoh(&dev, &mut host)?;
    stream.memcpy_htod(&host, &mut dev)?;
    let start = timing_event(stream)?;
    for _ in 0..PINNED_COPIES {
        stream.memcpy_dtoh(&dev, &mut host)?;
    }
    let middle = timing_event(stream)?;
    for _ in 0..PINNED_COPIES {
        stream.memcpy_htod(&host, &mut dev)?;
    }
    let end = timing_event(stream)?;
    let gbs = |ms: f32| (bytes * PINNED_COPIES) as f64 / (f64::from(ms) / 1e3) / 1e9;
    Ok(PinnedCopy {
        bytes,
        d2h: gbs(start.elapsed_ms(&middle)?),
        h2d: gbs(middle.elapsed_ms(&end)?),
    })
}

/// The device buffers of one size, as [`Buffers`] on the host.
struct DeviceBuffers<T> {
    send: CudaSlice<T>,
    recv: CudaSlice<T>,
    inplace: CudaSlice<T>,
}

impl<T: DeviceRepr + ValidAsZeroBits> DeviceBuffers<T> {
    fn new(
        stream: &Arc<CudaStream>,
        (send, recv, inplace): (usize, usize, usize),
    ) -> AnyResult<Self> {
        // A buffer a collective does not use has length 0 (broadcast's
        // send); it gets one element, since a driver allocation cannot be
        // empty, and is never passed to a call.
        let alloc = |len: usize| stream.alloc_zeros::<T>(len.max(1));
        Ok(DeviceBuffers {
            send: alloc(send)?,
            recv: alloc(recv)?,
            inplace: alloc(inplace)?,
        })
    }
}

/// Copy `host` into the start of `dev` (nothing for an unused buffer).
fn upload<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    host: &[T],
    dev: &mut CudaSlice<T>,
) -> AnyResult<()> {
    if !host.is_empty() {
        stream.memcpy_htod(host, dev)?;
    }
    Ok(())
}

/// Copy `dev` into `host` and wait for it.
fn download<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    dev: &CudaSlice<T>,
    host: &mut [T],
) -> AnyResult<()> {
    stream.memcpy_dtoh(dev, host)?;
    stream.synchronize()?;
    Ok(())
}

/// The rows of one element type and op, as the host mode's `bench_type`.
pub(super) fn bench_type<T: Element + DeviceRepr + ValidAsZeroBits>(
    comm: &Communicator,
    gpu: &Gpu,
    opts: &Options,
    op: Option<ReduceOp>,
    report: &mut Report,
) -> AnyResult<()> {
    let stream = &gpu.stream;
    let on = comm.on_stream(stream);
    let elem = std::mem::size_of::<T>();
    let ranks = comm.size();
    for bytes in opts.sizes() {
        let (shape, total) = Shape::of(comm, opts, op, bytes, elem);
        let lens = lengths(shape);
        // Host mirrors: the pattern to copy in, and where results come
        // back to be checked.
        let mut host = Buffers::<T> {
            send: Buf::new(comm, lens.0, false)?,
            recv: Buf::new(comm, lens.1, false)?,
            inplace: Buf::new(comm, lens.2, false)?,
        };
        let mut dev = DeviceBuffers::<T>::new(stream, lens)?;
        let size_bytes = total * elem;

        fill(shape, &mut host, false);
        upload(stream, &host.send, &mut dev.send)?;
        upload(stream, &host.recv, &mut dev.recv)?;
        for _ in 0..opts.warmup_iters {
            let _ = call(&on, shape, &mut dev, false)?;
        }
        let seconds = time_calls(comm, stream, opts.iters, || {
            call(&on, shape, &mut dev, false)
        })?;
        let wrong = if opts.check {
            // The calls so far wrote the output: poison it again (the
            // mirror still holds the poison) so that what the checked call
            // leaves unwritten shows.
            upload(stream, &host.recv, &mut dev.recv)?;
            call(&on, shape, &mut dev, false)?.wait()?;
            download(stream, &dev.recv, &mut host.recv)?;
            Some(count_wrong(comm, shape, &host, false)?)
        } else {
            None
        };
        let out_of_place = Measure::new(opts.coll, ranks, size_bytes, seconds, wrong);

        // Every device collective has an in-place form (the others are
        // refused by the options).
        fill(shape, &mut host, true);
        upload(stream, &host.inplace, &mut dev.inplace)?;
        for _ in 0..opts.warmup_iters {
            let _ = call(&on, shape, &mut dev, true)?;
        }
        let seconds = time_calls(comm, stream, opts.iters, || {
            call(&on, shape, &mut dev, true)
        })?;
        // In-place calls consume their input: copy the inputs and poison in
        // again (the mirror still holds them) and check one more call.
        let wrong = if opts.check {
            upload(stream, &host.inplace, &mut dev.inplace)?;
            call(&on, shape, &mut dev, true)?.wait()?;
            download(stream, &dev.inplace, &mut host.inplace)?;
            Some(count_wrong(comm, shape, &host, true)?)
        } else {
            None
        };
        let in_place = Measure::new(opts.coll, ranks, size_bytes, seconds, wrong);
        report.row(&Row::new::<T>(
            opts,
            op,
            total,
            out_of_place,
            Some(in_place),
        ))?;
    }
    Ok(())
}

/// Wait for the stream, barrier, then `iters` calls enqueued back to back
/// between two events: the mean per call on this rank from the events,
/// then the maximum over ranks.
fn time_calls(
    comm: &Communicator,
    stream: &Arc<CudaStream>,
    iters: usize,
    mut one: impl FnMut() -> AnyResult<DeviceWork>,
) -> AnyResult<f64> {
    stream.synchronize()?;
    comm.barrier()?;
    let start = timing_event(stream)?;
    let mut last = None;
    for _ in 0..iters {
        last = Some(one()?);
    }
    let end = timing_event(stream)?;
    let ms = start.elapsed_ms(&end)?;
    // A failed call also fails every later one; the last call's own
    // error names the call.
    if let Some(work) = last {
        work.wait()?;
    }
    let mut t = [f64::from(ms) / 1e3 / iters as f64];
    comm.all_reduce_in_place(&mut t, ReduceOp::Max)?;
    Ok(t[0])
}

/// Enqueue one call of the collective on the stream.
fn call<T: Element>(
    on: &cuda::OnStream<'_>,
    s: Shape,
    b: &mut DeviceBuffers<T>,
    in_place: bool,
) -> AnyResult<DeviceWork> {
    let work = if in_place {
        let buf = &mut b.inplace;
        match s.coll {
            Coll::AllReduce => on.all_reduce_in_place(buf, s.op),
            Coll::ReduceScatter => on.reduce_scatter_in_place(buf, s.op),
            Coll::AllGather => on.all_gather_in_place(buf),
            Coll::Broadcast => on.broadcast(buf, s.root),
            Coll::Reduce => on.reduce_in_place(buf, s.op, s.root),
            Coll::AllToAll | Coll::SendRecv => {
                return Err(format!("{} has no in-place form", s.coll).into())
            }
        }
    } else {
        match s.coll {
            Coll::AllReduce => on.all_reduce(&b.send, &mut b.recv, s.op),
            Coll::ReduceScatter => on.reduce_scatter(&b.send, &mut b.recv, s.op),
            Coll::AllGather => on.all_gather(&b.send, &mut b.recv),
            // Broadcast works in place: the out-of-place column uses `recv`.
            Coll::Broadcast => on.broadcast(&mut b.recv, s.root),
            Coll::Reduce => on.reduce(&b.send, &mut b.recv, s.op, s.root),
            Coll::AllToAll => on.all_to_all(&b.send, &mut b.recv),
            // Even ranks send first, odd ranks receive first (as on the
            // host: calls run one at a time, and a ring of sends would wait
            // on each other). The second call ends after the first.
            Coll::SendRecv => {
                let next = (s.rank + 1) % s.ranks;
                let prev = (s.rank + s.ranks - 1) % s.ranks;
                if s.rank.is_multiple_of(2) {
                    on.send(&b.send, next)?;
                    on.recv(&mut b.recv, prev)
                } else {
                    on.recv(&mut b.recv, prev)?;
                    on.send(&b.send, next)
                }
            }
        }
    };
    // Later work on the stream sees the result: the caller waits on the
    // host only where it must.
    Ok(work?)
}
