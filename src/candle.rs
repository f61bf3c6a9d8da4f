//! Collectives on [Candle](https://github.com/huggingface/candle) tensors
//! (feature `candle`), and an all-reduce [`CustomOp1`] for tensor-parallel
//! layers (row- and column-parallel linear, as Candle's
//! `llama_multiprocess` example does with NCCL on CUDA, here on any
//! device).
//!
//! This module owns the moves between Candle storage and the
//! communicator's API; it adds no algorithm. A contiguous CPU tensor is
//! handed to the collective straight from Candle's storage (no copy in);
//! the result is one new buffer that becomes the output tensor.
//!
//! CUDA tensors: with feature `candle-cuda` (Candle built with its CUDA
//! backend), a CUDA tensor's buffer goes to the device entry points of
//! [`crate::cuda`] where it lies (the view's offset applied; a strided
//! view made dense on the device first), the output is a new buffer on
//! the same device, and the call is enqueued on the stream of Candle's
//! device: it returns at once, and Candle's later kernels on that stream
//! see the result. No host copy. Built and linted with the CUDA compiler
//! of cuda/toolkit.sh (by hand: CI does not build it, 36 minutes on 2
//! cores); not yet run on a GPU (docs/frameworks.md). Without that feature, a tensor on another device
//! (CUDA, Metal) is staged through host memory by Candle's own copies:
//! correct, one round trip over PCIe per call.
//!
//! Errors are Candle's: a ferroccl [`Error`](crate::Error) travels inside
//! `candle_core::Error::Wrapped` (Candle keeps only its text), which names
//! the failed rank, the call and its sequence number.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::op::BackpropOp;
use candle_core::{
    CpuStorage, CustomOp1, DType, Device, Layout, Shape, Storage, Tensor, WithDType,
};

use crate::{Communicator, Element, ReduceOp};

type CResult<T> = candle_core::Result<T>;

fn wrap(e: crate::Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// The elements of `layout` as one run of its storage, in index order
/// (its start offset included), or `None` for a strided view.
fn dense_run(layout: &Layout) -> Option<std::ops::Range<usize>> {
    layout.contiguous_offsets().map(|(start, end)| start..end)
}

fn unsupported(dtype: DType) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "ferroccl::candle: no collectives on {dtype:?} tensors (f32, f64, f16, bf16, u8, u32, \
         i32 and i64 have them)"
    ))
}

/// A collective as the tensor functions run it: on a tensor's elements in
/// index order, one flat buffer, into a new buffer. The same on the host
/// and on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flat {
    AllReduce(ReduceOp),
    /// From the root rank.
    Broadcast(usize),
    AllGather,
    /// Rank r keeps the r-th of `size` equal runs (the length divides).
    ReduceScatter(ReduceOp),
}

impl Flat {
    /// Elements of the output, for `n` elements of input over `ranks`.
    fn out_len(self, n: usize, ranks: usize) -> usize {
        match self {
            Flat::AllReduce(_) | Flat::Broadcast(_) => n,
            Flat::AllGather => n * ranks,
            Flat::ReduceScatter(_) => n / ranks,
        }
    }

    /// The collective on host memory.
    fn on_host<T: Element>(self, comm: &Communicator, x: &[T]) -> CResult<Vec<T>> {
        let mut out = vec![T::from_f64(0.0); self.out_len(x.len(), comm.size())];
        match self {
            Flat::AllReduce(op) => comm.all_reduce(x, &mut out, op),
            Flat::Broadcast(root) => {
                out.copy_from_slice(x);
                comm.broadcast(&mut out, root)
            }
            Flat::AllGather => comm.all_gather(x, &mut out),
            Flat::ReduceScatter(op) => comm.reduce_scatter(x, &mut out, op),
        }
        .map_err(wrap)?;
        Ok(out)
    }
}

/// Where a layout's elements lie in its storage: one run, or (a strided
/// view) each element's offset in index order.
enum Offsets {
    Run(usize, usize),
    Each(Vec<usize>),
}

impl Offsets {
    fn of(layout: &Layout) -> Self {
        if let Some(run) = dense_run(layout) {
            return Offsets::Run(run.start, run.end);
        }
        let (dims, stride) = (layout.dims(), layout.stride());
        let n: usize = dims.iter().product();
        let mut out = Vec::with_capacity(n);
        let mut index = vec![0usize; dims.len()];
        for _ in 0..n {
            out.push(
                layout.start_offset() + index.iter().zip(stride).map(|(i, s)| i * s).sum::<usize>(),
            );
            // Advance the multi-index, last dimension fastest.
            for d in (0..dims.len()).rev() {
                index[d] += 1;
                if index[d] < dims[d] {
                    break;
                }
                index[d] = 0;
            }
        }
        Offsets::Each(out)
    }

    /// The elements in index order: borrowed from `v` for a run, gathered
    /// into `buf` otherwise.
    fn view<'a, T: Copy>(&self, v: &'a [T], buf: &'a mut Vec<T>) -> &'a [T] {
        match self {
            Offsets::Run(start, end) => &v[*start..*end],
            Offsets::Each(offsets) => {
                buf.extend(offsets.iter().map(|&o| v[o]));
                buf
            }
        }
    }
}

/// Runs `$body` on the elements of a CPU storage (bound to `$slice` as a
/// `&[T]` of the storage's type, in index order) and turns the vector it
/// returns into a storage of the same type.
macro_rules! with_elements {
    ($storage:expr, $layout:expr, |$slice:ident| $body:expr) => {{
        let offsets = Offsets::of($layout);
        macro_rules! arm {
            ($v:expr, $t:ty) => {{
                let mut buf = Vec::new();
                let $slice: &[$t] = offsets.view($v, &mut buf);
                <$t>::to_cpu_storage_owned($body?)
            }};
        }
        match $storage {
            CpuStorage::F32(v) => arm!(v, f32),
            CpuStorage::F64(v) => arm!(v, f64),
            CpuStorage::F16(v) => arm!(v, half::f16),
            CpuStorage::BF16(v) => arm!(v, half::bf16),
            CpuStorage::U8(v) => arm!(v, u8),
            CpuStorage::U32(v) => arm!(v, u32),
            CpuStorage::I32(v) => arm!(v, i32),
            CpuStorage::I64(v) => arm!(v, i64),
            other => return Err(unsupported(other.dtype())),
        }
    }};
}

/// Runs `verb` on `t`'s elements and builds a tensor of `shape` from its
/// output: on the device for a CUDA tensor (feature `candle-cuda`), else
/// on the host.
fn run(comm: &Communicator, t: &Tensor, shape: Shape, verb: Flat) -> CResult<Tensor> {
    #[cfg(feature = "candle-cuda")]
    if t.device().is_cuda() {
        return device::run(comm, t, shape, verb);
    }
    on_host(t, shape, &|s, l| {
        Ok(with_elements!(s, l, |x| verb.on_host(comm, x)))
    })
}

/// Applies `f` to `t`'s elements on the host and builds a tensor of `shape`
/// from its output: straight from the storage for a contiguous CPU tensor,
/// else through a contiguous copy (strided views) or a host copy (other
/// devices), the result going back to `t`'s device.
fn on_host(
    t: &Tensor,
    shape: Shape,
    f: &dyn Fn(&CpuStorage, &Layout) -> CResult<CpuStorage>,
) -> CResult<Tensor> {
    let device = t.device().clone();
    let host = match &device {
        Device::Cpu => t.contiguous()?,
        _ => t.to_device(&Device::Cpu)?.contiguous()?,
    };
    let out = {
        let (storage, layout) = host.storage_and_layout();
        match &*storage {
            Storage::Cpu(cpu) => f(cpu, layout)?,
            _ => {
                return Err(candle_core::Error::Msg(
                    "ferroccl::candle: a host copy is not in CPU storage".into(),
                ))
            }
        }
    };
    let out = Tensor::from_storage(Storage::Cpu(out), shape, BackpropOp::none(), false);
    match device {
        Device::Cpu => Ok(out),
        _ => out.to_device(&device),
    }
}

/// `t` reduced over every rank with `op` (same shape and dtype on every
/// rank). A collective.
pub fn all_reduce(comm: &Communicator, t: &Tensor, op: ReduceOp) -> CResult<Tensor> {
    run(comm, t, t.shape().clone(), Flat::AllReduce(op))
}

/// Rank `root`'s `t` on every rank (every rank passes a tensor of the
/// same shape and dtype; its contents matter on `root` only).
pub fn broadcast(comm: &Communicator, t: &Tensor, root: usize) -> CResult<Tensor> {
    run(comm, t, t.shape().clone(), Flat::Broadcast(root))
}

/// Every rank's `t` concatenated along `dim`, rank 0's first.
pub fn all_gather(comm: &Communicator, t: &Tensor, dim: usize) -> CResult<Tensor> {
    let n = comm.size();
    let dims = t.dims();
    if dim >= dims.len() {
        return Err(candle_core::Error::Msg(format!(
            "ferroccl::candle: all_gather along dim {dim} of a {}-d tensor",
            dims.len()
        )));
    }
    let mut stacked = vec![n];
    stacked.extend_from_slice(dims);
    let gathered = run(comm, t, Shape::from(stacked), Flat::AllGather)?;
    let parts: Vec<Tensor> = (0..n).map(|r| gathered.get(r)).collect::<CResult<_>>()?;
    Tensor::cat(&parts, dim)
}

/// `t` reduced over every rank with `op` and split along `dim`: rank r
/// keeps the r-th of `size` equal parts (`dims[dim]` must divide evenly).
pub fn reduce_scatter(
    comm: &Communicator,
    t: &Tensor,
    dim: usize,
    op: ReduceOp,
) -> CResult<Tensor> {
    let n = comm.size();
    let dims = t.dims().to_vec();
    if dim >= dims.len() || !dims[dim].is_multiple_of(n) {
        return Err(candle_core::Error::Msg(format!(
            "ferroccl::candle: reduce_scatter along dim {dim} of shape {dims:?} over {n} ranks: \
             that dimension must exist and divide by the rank count"
        )));
    }
    // Blocks of the collective are contiguous runs of its buffer: bring
    // `dim` to the front so that rank r's part is the r-th run.
    let front = t.transpose(0, dim)?.contiguous()?;
    let mut out_dims = front.dims().to_vec();
    out_dims[0] /= n;
    let part = run(comm, &front, Shape::from(out_dims), Flat::ReduceScatter(op))?;
    part.transpose(0, dim)?.contiguous()
}

/// The all-reduce as a Candle operation, for the outputs of
/// tensor-parallel layers: `x.apply_op1(AllReduce::sum(comm.clone()))`.
/// Its backward passes the gradient through unchanged: the op sums
/// partial results that each rank computed from its own shard, so each
/// shard's gradient is the full output's (Megatron's row-parallel
/// layer). CPU tensors run in place of Candle's kernel, and CUDA tensors
/// too with feature `candle-cuda` (on the device, `cuda_fwd`); other
/// devices go through [`all_reduce`] (host staging) instead.
#[derive(Clone)]
pub struct AllReduce {
    comm: Arc<Communicator>,
    op: ReduceOp,
}

impl std::fmt::Debug for AllReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllReduce").field("op", &self.op).finish()
    }
}

impl AllReduce {
    /// Sum over the ranks of `comm`.
    pub fn sum(comm: Arc<Communicator>) -> Self {
        AllReduce {
            comm,
            op: ReduceOp::Sum,
        }
    }

    /// Reduce with `op` (no backward except for `Sum`).
    pub fn new(comm: Arc<Communicator>, op: ReduceOp) -> Self {
        AllReduce { comm, op }
    }

    /// Apply to `x` on any device: the op for CPU tensors (and CUDA
    /// tensors with feature `candle-cuda`), host staging for others.
    pub fn forward(&self, x: &Tensor) -> CResult<Tensor> {
        match x.device() {
            Device::Cpu => x.apply_op1(self.clone()),
            #[cfg(feature = "candle-cuda")]
            Device::Cuda(_) => x.apply_op1(self.clone()),
            _ => all_reduce(&self.comm, x, self.op),
        }
    }
}

impl CustomOp1 for AllReduce {
    fn name(&self) -> &'static str {
        "ferroccl-all-reduce"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> CResult<(CpuStorage, Shape)> {
        let verb = Flat::AllReduce(self.op);
        let out = with_elements!(storage, layout, |x| verb.on_host(&self.comm, x));
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> CResult<(candle_core::CudaStorage, Shape)> {
        let out = device::on_storage(&self.comm, storage, layout, Flat::AllReduce(self.op))?;
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> CResult<Option<Tensor>> {
        match self.op {
            ReduceOp::Sum => Ok(Some(grad_res.clone())),
            op => Err(candle_core::Error::Msg(format!(
                "ferroccl::candle: no backward for an all-reduce with {op:?}"
            ))),
        }
    }
}

/// A linear layer whose weight is split by output features: rank r holds
/// rows `[r * out / n, (r + 1) * out / n)` of the full `[out, in]` weight
/// and computes that slice of the output; no communication (Megatron's
/// column-parallel layer, followed by a row-parallel one or a gather).
#[derive(Debug, Clone)]
pub struct ColumnParallelLinear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl ColumnParallelLinear {
    /// This rank's shard of a full `weight` (`[out, in]`) and `bias`
    /// (`[out]`); `out` must divide by the rank count.
    pub fn from_full(comm: &Communicator, weight: &Tensor, bias: Option<&Tensor>) -> CResult<Self> {
        let (n, r) = (comm.size(), comm.rank());
        let out = weight.dim(0)?;
        if !out.is_multiple_of(n) {
            return Err(candle_core::Error::Msg(format!(
                "ferroccl::candle: column-parallel weight with {out} rows over {n} ranks"
            )));
        }
        let part = out / n;
        Ok(ColumnParallelLinear {
            weight: weight.narrow(0, r * part, part)?.contiguous()?,
            bias: bias.map(|b| b.narrow(0, r * part, part)).transpose()?,
        })
    }

    /// `x [.., in]` to this rank's part of the output, `[.., out / n]`.
    pub fn forward(&self, x: &Tensor) -> CResult<Tensor> {
        let y = x.broadcast_matmul(&self.weight.t()?)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// A linear layer whose weight is split by input features: rank r holds
/// columns `[r * in / n, (r + 1) * in / n)` of the full `[out, in]` weight,
/// takes that slice of the input (a column-parallel layer's output) and
/// the partial products are summed over the ranks by [`AllReduce`]; the
/// bias is added once, after the sum.
#[derive(Debug, Clone)]
pub struct RowParallelLinear {
    weight: Tensor,
    bias: Option<Tensor>,
    reduce: AllReduce,
}

impl RowParallelLinear {
    /// This rank's shard of a full `weight` (`[out, in]`); `in` must
    /// divide by the rank count. `bias` (`[out]`) is kept whole.
    pub fn from_full(
        comm: Arc<Communicator>,
        weight: &Tensor,
        bias: Option<&Tensor>,
    ) -> CResult<Self> {
        let (n, r) = (comm.size(), comm.rank());
        let input = weight.dim(1)?;
        if !input.is_multiple_of(n) {
            return Err(candle_core::Error::Msg(format!(
                "ferroccl::candle: row-parallel weight with {input} columns over {n} ranks"
            )));
        }
        let part = input / n;
        Ok(RowParallelLinear {
            weight: weight.narrow(1, r * part, part)?.contiguous()?,
            bias: bias.cloned(),
            reduce: AllReduce::sum(comm),
        })
    }

    /// `x [.., in / n]` (this rank's slice) to the full output `[.., out]`,
    /// the same on every rank.
    pub fn forward(&self, x: &Tensor) -> CResult<Tensor> {
        let partial = x.broadcast_matmul(&self.weight.t()?)?;
        let y = self.reduce.forward(&partial)?;
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}

/// Whether `dtype` has collectives here.
pub fn supports(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F64
            | DType::F16
            | DType::BF16
            | DType::U8
            | DType::U32
            | DType::I32
            | DType::I64
    )
}

/// The device path: CUDA tensors handed to the device entry points of
/// [`crate::cuda`] as they lie in Candle's storage, on Candle's stream.
/// Candle's cudarc is ferroccl's (the same crate and version, one in the
/// build), so its `CudaSlice`s and `CudaStream` go to
/// [`Communicator::on_stream`] as they are: no pointer or stream handle
/// is taken out of them, and cudarc's event tracking orders the buffers'
/// uses on other streams.
#[cfg(feature = "candle-cuda")]
mod device {
    use super::{dense_run, unsupported, CResult, Flat};
    use crate::cuda::cudarc::driver::DeviceRepr;
    use crate::{Communicator, Element};
    use candle_core::backend::{BackendDevice, BackendStorage};
    use candle_core::cuda::CudaDType;
    use candle_core::op::BackpropOp;
    use candle_core::{CudaStorage, DType, Layout, Shape, Storage, Tensor};

    /// `verb` on the elements of the CUDA tensor `t`, into a new tensor of
    /// `shape` on its device.
    pub(super) fn run(
        comm: &Communicator,
        t: &Tensor,
        shape: Shape,
        verb: Flat,
    ) -> CResult<Tensor> {
        let out = {
            let (storage, layout) = t.storage_and_layout();
            match &*storage {
                Storage::Cuda(cuda) => on_storage(comm, cuda, layout, verb)?,
                _ => {
                    return Err(candle_core::Error::Msg(
                        "ferroccl::candle: a CUDA tensor is not in CUDA storage".into(),
                    ))
                }
            }
        };
        Ok(Tensor::from_storage(
            Storage::Cuda(out),
            shape,
            BackpropOp::none(),
            false,
        ))
    }

    /// `verb` on the elements of `storage` seen through `layout` (index
    /// order), enqueued on the stream of Candle's device: the returned
    /// storage is a new buffer that later work on that stream may read
    /// (the stream waits for the call; the host does not). A strided view
    /// is first made dense on the device by Candle's copy.
    pub(super) fn on_storage(
        comm: &Communicator,
        storage: &CudaStorage,
        layout: &Layout,
        verb: Flat,
    ) -> CResult<CudaStorage> {
        if !super::supports(storage.dtype()) {
            return Err(unsupported(storage.dtype()));
        }
        let Some(run) = dense_run(layout) else {
            let shape = layout.shape();
            let mut dense = storage.device().zeros_impl(shape, storage.dtype())?;
            storage.copy_strided_src(&mut dense, 0, layout)?;
            return on_storage(comm, &dense, &Layout::contiguous(shape), verb);
        };
        match storage.dtype() {
            DType::F32 => typed::<f32>(comm, storage, run, verb),
            DType::F64 => typed::<f64>(comm, storage, run, verb),
            DType::F16 => typed::<half::f16>(comm, storage, run, verb),
            DType::BF16 => typed::<half::bf16>(comm, storage, run, verb),
            DType::U8 => typed::<u8>(comm, storage, run, verb),
            DType::U32 => typed::<u32>(comm, storage, run, verb),
            DType::I32 => typed::<i32>(comm, storage, run, verb),
            DType::I64 => typed::<i64>(comm, storage, run, verb),
            other => Err(unsupported(other)),
        }
    }

    /// [`on_storage`] on the elements `run` of a storage of `T`.
    fn typed<T: Element + CudaDType + DeviceRepr>(
        comm: &Communicator,
        storage: &CudaStorage,
        run: std::ops::Range<usize>,
        verb: Flat,
    ) -> CResult<CudaStorage> {
        let dev = storage.device();
        let len = verb.out_len(run.len(), comm.size());
        let input = storage.as_cuda_slice::<T>()?;
        // A view of the elements only: the layout's start offset is the
        // view's, so the device call gets the right address and length.
        let send = input.slice(run);
        // SAFETY: `alloc_uninit` leaves the buffer's contents unset. Every
        // element of `T` (the eight number types above) is valid for any
        // bits, so no read of it is undefined; and the call below writes
        // every element (the root's broadcast: the copy first) before
        // later work on Candle's stream, which waits for the call, reads
        // it. A call that fails before it is enqueued drops the buffer
        // unread; one that fails later fails the communicator
        // (`Communicator::async_error`), as any device call.
        let mut out = unsafe { dev.alloc_uninit(&Shape::from(len), storage.dtype()) }?;
        let recv = out.as_cuda_slice_mut::<T>()?;
        let stream = dev.cuda_stream();
        let on = comm.on_stream(&stream);
        // The returned `DeviceWork` is dropped: the stream waits for the
        // call (crate::cuda), so Candle's later kernels see its result.
        match verb {
            Flat::AllReduce(op) => on.all_reduce(&send, recv, op),
            Flat::Broadcast(root) => {
                if root == comm.rank() {
                    dev.memcpy_dtod(&send, recv)?;
                }
                on.broadcast(recv, root)
            }
            Flat::AllGather => on.all_gather(&send, recv),
            Flat::ReduceScatter(op) => on.reduce_scatter(&send, recv, op),
        }
        .map_err(super::wrap)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::run_ranks;

    /// Rank r's input: element i is r * 10 + i / 4 (exact in every float
    /// type up to 4 ranks).
    fn input(rank: usize, shape: &[usize], dtype: DType) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| (rank * 10) as f32 + i as f32 / 4.0)
            .collect();
        Tensor::from_vec(v, shape, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    }

    fn values(t: &Tensor) -> Vec<f64> {
        t.to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    }

    #[test]
    fn all_reduce_of_every_type_and_a_strided_view_sums_the_ranks() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64] {
            let out = run_ranks(3, move |comm| {
                let x = input(comm.rank(), &[4, 6], dtype);
                let plain = all_reduce(&comm, &x, ReduceOp::Sum).unwrap();
                // A transposed view is strided: the op gathers it first.
                let view = x.t().unwrap();
                let op = view.apply_op1(AllReduce::sum(Arc::new(comm))).unwrap();
                (
                    values(&plain),
                    values(&op),
                    plain.dtype(),
                    op.dims().to_vec(),
                )
            });
            let want = |i: usize| {
                (0..3)
                    .map(|r| (r * 10) as f64 + i as f64 / 4.0)
                    .sum::<f64>()
            };
            let want_t: Vec<f64> = (0..24).map(|k| want((k % 4) * 6 + k / 4)).collect();
            for (plain, op, dt, dims) in out {
                assert_eq!(dt, dtype);
                assert_eq!(dims, vec![6, 4]);
                if dtype == DType::I64 {
                    // i64 input truncated the quarters.
                    continue;
                }
                for (i, g) in plain.iter().enumerate() {
                    assert_eq!(*g, want(i), "{dtype:?} element {i}");
                }
                assert_eq!(op, want_t, "{dtype:?} through the op");
            }
        }
    }

    /// What the device path (feature `candle-cuda`) computes before it
    /// hands Candle's buffers over: the output's length and the run of the
    /// storage a layout covers, its start offset included. Pure, so
    /// checked here; the device calls themselves need a GPU (cuda/gpu/).
    #[test]
    fn output_lengths_and_the_runs_of_a_layout() {
        let sum = ReduceOp::Sum;
        assert_eq!(Flat::AllReduce(sum).out_len(12, 3), 12);
        assert_eq!(Flat::Broadcast(2).out_len(12, 3), 12);
        assert_eq!(Flat::AllGather.out_len(12, 3), 36);
        assert_eq!(Flat::ReduceScatter(sum).out_len(12, 3), 4);
        let full = Layout::contiguous((4, 6));
        assert_eq!(dense_run(&full), Some(0..24));
        // Rows 1 and 2: one run, starting at the view's offset.
        assert_eq!(dense_run(&full.narrow(0, 1, 2).unwrap()), Some(6..18));
        // Columns, a transpose, a broadcast: strided, made dense first.
        assert_eq!(dense_run(&full.narrow(1, 2, 2).unwrap()), None);
        assert_eq!(dense_run(&full.transpose(0, 1).unwrap()), None);
        let row = Layout::contiguous((1, 6));
        assert_eq!(dense_run(&row.broadcast_as((3, 6)).unwrap()), None);
    }

    /// A view that starts inside its storage (rows of a larger tensor) is
    /// reduced from its own elements: the offset is honoured.
    #[test]
    fn a_view_with_an_offset_reduces_its_own_elements() {
        let out = run_ranks(2, |comm| {
            let x = input(comm.rank(), &[4, 6], DType::F32);
            let rows = x.narrow(0, 1, 2).unwrap();
            let comm = Arc::new(comm);
            let plain = all_reduce(&comm, &rows, ReduceOp::Sum).unwrap();
            let op = AllReduce::sum(comm).forward(&rows).unwrap();
            (values(&plain), values(&op))
        });
        let want: Vec<f64> = (6..18).map(|i| 10.0 + 2.0 * (i as f64 / 4.0)).collect();
        for (plain, op) in out {
            assert_eq!(plain, want);
            assert_eq!(op, want);
        }
    }

    #[test]
    fn gather_scatter_and_broadcast_match_the_single_process_results() {
        let out = run_ranks(2, |comm| {
            let x = input(comm.rank(), &[2, 4], DType::F32);
            let g0 = all_gather(&comm, &x, 0).unwrap();
            let g1 = all_gather(&comm, &x, 1).unwrap();
            let rs = reduce_scatter(&comm, &x, 1, ReduceOp::Sum).unwrap();
            let b = broadcast(&comm, &x, 1).unwrap();
            (g0, g1, rs, b)
        });
        let x0 = input(0, &[2, 4], DType::F32);
        let x1 = input(1, &[2, 4], DType::F32);
        let want_g0 = Tensor::cat(&[&x0, &x1], 0).unwrap();
        let want_g1 = Tensor::cat(&[&x0, &x1], 1).unwrap();
        let sum = (&x0 + &x1).unwrap();
        for (rank, (g0, g1, rs, b)) in out.into_iter().enumerate() {
            assert_eq!(values(&g0), values(&want_g0));
            assert_eq!(g1.dims(), &[2, 8]);
            assert_eq!(values(&g1), values(&want_g1));
            let want_rs = sum.narrow(1, rank * 2, 2).unwrap();
            assert_eq!(rs.dims(), &[2, 2]);
            assert_eq!(values(&rs), values(&want_rs));
            assert_eq!(values(&b), values(&x1));
        }
    }

    #[test]
    fn a_bad_split_or_dtype_is_an_error_before_anything_moves() {
        let out = run_ranks(2, |comm| {
            let x = input(0, &[3, 4], DType::F32);
            let bad_split = reduce_scatter(&comm, &x, 0, ReduceOp::Sum).unwrap_err();
            let bad_dim = all_gather(&comm, &x, 2).unwrap_err();
            let i16s = Tensor::zeros((2, 2), DType::I16, &Device::Cpu).unwrap();
            let bad_type = all_reduce(&comm, &i16s, ReduceOp::Sum).unwrap_err();
            // The communicator still works: nothing was issued.
            let ok = all_reduce(&comm, &x, ReduceOp::Max).unwrap();
            (
                bad_split.to_string(),
                bad_dim.to_string(),
                bad_type.to_string(),
                values(&ok),
            )
        });
        for (split, dim, ty, ok) in out {
            assert!(split.contains("divide by the rank count"), "{split}");
            assert!(dim.contains("dim 2"), "{dim}");
            assert!(ty.contains("I16"), "{ty}");
            assert_eq!(ok, values(&input(0, &[3, 4], DType::F32)));
        }
    }

    #[test]
    fn the_op_passes_the_gradient_through_for_sum() {
        let grads = run_ranks(2, |comm| {
            let comm = Arc::new(comm);
            let w = candle_core::Var::from_vec(vec![1f32, 2.0, 3.0], 3, &Device::Cpu).unwrap();
            let scale = (comm.rank() + 1) as f64;
            let y = (w.as_tensor() * scale).unwrap();
            let s = AllReduce::sum(comm).forward(&y).unwrap();
            let loss = s.sqr().unwrap().sum_all().unwrap();
            let g = loss.backward().unwrap();
            (values(&s), values(g.get(&w).unwrap()))
        });
        // s = (1 + 2) w on both ranks; d loss / d y = 2 s; d y / d w = scale.
        for (rank, (s, g)) in grads.into_iter().enumerate() {
            let scale = (rank + 1) as f64;
            let want_s: Vec<f64> = [1.0, 2.0, 3.0].iter().map(|w| 3.0 * w).collect();
            assert_eq!(s, want_s);
            let want_g: Vec<f64> = want_s.iter().map(|s| 2.0 * s * scale).collect();
            assert_eq!(g, want_g);
        }
    }
}
