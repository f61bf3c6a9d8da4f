//! The device path of `ferroccl::candle` (feature `candle-cuda`) on a GPU:
//! every collective of the module, the `AllReduce` op (plain, on a view
//! with an offset, on a strided view) and a column- then row-parallel
//! pair of linear layers, on CUDA tensors, each compared with the same call
//! on CPU tensors (the host path) in the same process.
//!
//! ```sh
//! cargo build --release -p ferroccl-run -p ferroccl --bin ferroccl-run \
//!     --features candle-cuda --example candle_cuda_check
//! target/release/ferroccl-run -n 2 -- target/release/examples/candle_cuda_check
//! ```
//!
//! Every rank uses GPU `--gpu` [0] (2 processes on one GPU is the check
//! the GPU run makes, cuda/gpu/run.sh). Prints one line per check and
//! `rank=R checks=N failed=F`; exits with an error if any check failed.
//! Integer types must match exactly, f32 and f64 to a few ulps, f16 and
//! bf16 to their rounding (the device sums in another order than the
//! host for more than 2 ranks).

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use ferroccl::candle::{
    all_gather, all_reduce, broadcast, reduce_scatter, AllReduce, ColumnParallelLinear,
    RowParallelLinear,
};
use ferroccl::{Communicator, ReduceOp};

#[allow(dead_code)]
#[path = "common/candle_data.rs"]
mod candle_data;
use candle_data::{arg, BoxError};

/// Rank r's `[rows, cols]` input: small numbers, exact in every type.
fn input(rank: usize, rows: usize, cols: usize, dtype: DType) -> candle_core::Result<Tensor> {
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| (rank % 4) as f32 + (i % 16) as f32 / 4.0)
        .collect();
    Tensor::from_vec(v, (rows, cols), &Device::Cpu)?.to_dtype(dtype)
}

fn values(t: &Tensor) -> candle_core::Result<Vec<f64>> {
    t.to_device(&Device::Cpu)?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1()
}

/// The tolerance, relative to the largest |value|, of a comparison in
/// `dtype`.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => 1e-2,
        DType::F32 => 1e-6,
        DType::F64 => 1e-12,
        _ => 0.0,
    }
}

struct Checks {
    rank: usize,
    run: usize,
    failed: usize,
}

impl Checks {
    /// Compare the CPU result `host` with the CUDA result `device` (shape
    /// and values), printing the outcome.
    fn check(&mut self, name: &str, dtype: DType, host: &Tensor, device: &Tensor) {
        self.run += 1;
        let outcome = (|| -> candle_core::Result<Option<String>> {
            if !device.device().is_cuda() {
                return Ok(Some(format!("result on {:?}, not CUDA", device.device())));
            }
            if host.dims() != device.dims() || host.dtype() != device.dtype() {
                return Ok(Some(format!(
                    "shape {:?} {:?} on the host, {:?} {:?} on the device",
                    host.dims(),
                    host.dtype(),
                    device.dims(),
                    device.dtype()
                )));
            }
            let (h, d) = (values(host)?, values(device)?);
            let scale = h.iter().map(|v| v.abs()).fold(1.0, f64::max);
            let bound = tolerance(dtype) * scale;
            let worst = h
                .iter()
                .zip(&d)
                .enumerate()
                .map(|(i, (a, b))| (i, (a - b).abs()))
                .fold((0, 0.0), |w, x| if x.1 > w.1 { x } else { w });
            Ok((worst.1 > bound).then(|| {
                format!(
                    "element {}: host {} device {} (bound {bound:e})",
                    worst.0, h[worst.0], d[worst.0]
                )
            }))
        })();
        let line = match outcome {
            Ok(None) => "ok".to_string(),
            Ok(Some(why)) => {
                self.failed += 1;
                format!("MISMATCH {why}")
            }
            Err(e) => {
                self.failed += 1;
                format!("ERROR {e}")
            }
        };
        println!("rank={} {name} {dtype:?}: {line}", self.rank);
    }
}

fn main() -> Result<(), BoxError> {
    let ordinal: usize = arg("--gpu").map(|v| v.parse()).transpose()?.unwrap_or(0);
    let comm = Arc::new(Communicator::from_env()?);
    let (rank, size) = (comm.rank(), comm.size());
    let gpu = Device::new_cuda(ordinal)?;
    let mut checks = Checks {
        rank,
        run: 0,
        failed: 0,
    };
    let (rows, cols) = (4 * size, 12);
    let sum = ReduceOp::Sum;
    for dtype in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::U32,
        DType::U8,
    ] {
        let x = input(rank, rows, cols, dtype)?;
        let xg = x.to_device(&gpu)?;
        let c = &mut checks;
        c.check(
            "all_reduce sum",
            dtype,
            &all_reduce(&comm, &x, sum)?,
            &all_reduce(&comm, &xg, sum)?,
        );
        c.check(
            "all_reduce max",
            dtype,
            &all_reduce(&comm, &x, ReduceOp::Max)?,
            &all_reduce(&comm, &xg, ReduceOp::Max)?,
        );
        let root = size - 1;
        c.check(
            "broadcast",
            dtype,
            &broadcast(&comm, &x, root)?,
            &broadcast(&comm, &xg, root)?,
        );
        for dim in [0, 1] {
            c.check(
                &format!("all_gather dim {dim}"),
                dtype,
                &all_gather(&comm, &x, dim)?,
                &all_gather(&comm, &xg, dim)?,
            );
        }
        c.check(
            "reduce_scatter dim 0",
            dtype,
            &reduce_scatter(&comm, &x, 0, sum)?,
            &reduce_scatter(&comm, &xg, 0, sum)?,
        );
        let op = AllReduce::sum(comm.clone());
        c.check("AllReduce op", dtype, &op.forward(&x)?, &op.forward(&xg)?);
        // A view that starts inside its buffer, and a strided one.
        c.check(
            "AllReduce op, rows 1..3 (offset)",
            dtype,
            &op.forward(&x.narrow(0, 1, 2)?)?,
            &op.forward(&xg.narrow(0, 1, 2)?)?,
        );
        c.check(
            "AllReduce op, transposed (strided)",
            dtype,
            &op.forward(&x.t()?)?,
            &op.forward(&xg.t()?)?,
        );
    }

    // Tensor parallelism: a column-parallel layer, then a row-parallel one
    // whose partial products the op sums, in f32.
    let weight = |seed: usize, r: usize, c: usize| -> candle_core::Result<Tensor> {
        let v: Vec<f32> = (0..r * c)
            .map(|i| ((i * 31 + seed * 97) as f32 * 0.173).sin() / (c as f32).sqrt())
            .collect();
        Tensor::from_vec(v, (r, c), &Device::Cpu)
    };
    let (d_model, d_ff) = (16, 8 * size);
    let (w1, w2) = (weight(1, d_ff, d_model)?, weight(2, d_model, d_ff)?);
    let x = input(0, 6, d_model, DType::F32)?;
    let mlp = |dev: &Device| -> candle_core::Result<Tensor> {
        let (w1, w2, x) = (w1.to_device(dev)?, w2.to_device(dev)?, x.to_device(dev)?);
        let up = ColumnParallelLinear::from_full(&comm, &w1, None)?;
        let down = RowParallelLinear::from_full(comm.clone(), &w2, None)?;
        down.forward(&up.forward(&x)?.gelu()?)
    };
    checks.check(
        "column- then row-parallel linear",
        DType::F32,
        &mlp(&Device::Cpu)?,
        &mlp(&gpu)?,
    );

    // Every call so far was enqueued on Candle's stream; a failure there
    // fails the communicator.
    gpu.synchronize()?;
    if let Some(e) = comm.async_error() {
        return Err(format!("rank {rank}: the communicator failed: {e}").into());
    }
    println!("rank={rank} checks={} failed={}", checks.run, checks.failed);
    comm.barrier()?;
    if checks.failed > 0 {
        return Err(format!(
            "rank {rank}: {} of {} checks failed",
            checks.failed, checks.run
        )
        .into());
    }
    Ok(())
}
