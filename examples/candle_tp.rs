//! A tensor-parallel transformer block in Candle on ferroccl: attention
//! heads and the MLP's hidden features split across the ranks (Megatron's
//! column- and row-parallel linear layers, as Candle's `llama_multiprocess`
//! does with NCCL on CUDA), here on the CPU across processes.
//!
//! ```sh
//! cargo build --release -p ferroccl-run -p ferroccl --bin ferroccl-run --features candle --example candle_tp
//! target/release/ferroccl-run -n 2 -- target/release/examples/candle_tp
//! ```
//!
//! Block: `h = x + Wo·attn(Wq·n(x), Wk·n(x), Wv·n(x))`, `y = h + W2·gelu(W1·n(h))`
//! with `n` an RMS norm. Q, K, V and W1 are column-parallel (each rank
//! computes its heads, its hidden features); Wo and W2 are row-parallel:
//! each rank's partial product is summed over the ranks by
//! `ferroccl::candle::AllReduce`, two all-reduces per block. Every rank
//! builds the same full weights from a fixed formula and keeps its shard.
//! Prints `rank=R checksum=... max_err=...`: `max_err` is the largest
//! difference from the same block computed unsplit in f64 on this
//! process, and `scale=` the largest |y| (for the tests' tolerance).
//! Flags: `--seq` [6], `--dump FILE` (rank 0 writes y, one value a line).

use std::sync::Arc;

use candle_core::{DType, Device, Tensor, D};
use ferroccl::candle::{ColumnParallelLinear, RowParallelLinear};
use ferroccl::Communicator;

// The Candle examples' flag reader; the data-parallel examples' model and
// data in it are not this block's.
#[allow(dead_code)]
#[path = "common/candle_data.rs"]
mod candle_data;
use candle_data::{arg, BoxError};

const D_MODEL: usize = 16;
const HEADS: usize = 4;
const D_FF: usize = 32;

/// A fixed `[rows, cols]` weight: the same on every rank and run.
fn weight(seed: usize, rows: usize, cols: usize, dtype: DType) -> candle_core::Result<Tensor> {
    let scale = 1.0 / (cols as f64).sqrt();
    let v: Vec<f64> = (0..rows * cols)
        .map(|i| scale * ((i * 31 + seed * 97) as f64 * 0.173).sin())
        .collect();
    Tensor::from_vec(v, (rows, cols), &Device::Cpu)?.to_dtype(dtype)
}

fn rms_norm(x: &Tensor) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + 1e-6)?.sqrt()?)
}

/// Attention over the heads whose projections `q`, `k`, `v` (`[seq,
/// heads * dh]`) hold, causal.
fn attention(q: &Tensor, k: &Tensor, v: &Tensor, heads: usize) -> candle_core::Result<Tensor> {
    let (seq, width) = q.dims2()?;
    let dh = width / heads;
    let split = |t: &Tensor| t.reshape((seq, heads, dh))?.transpose(0, 1)?.contiguous();
    let (q, k, v) = (split(q)?, split(k)?, split(v)?);
    let scores = (q.matmul(&k.t()?)? / (dh as f64).sqrt())?;
    let mask: Vec<f32> = (0..seq * seq)
        .map(|i| {
            if i % seq > i / seq {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let mask = Tensor::from_vec(mask, (seq, seq), &Device::Cpu)?.to_dtype(q.dtype())?;
    let p = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(&mask)?)?;
    p.matmul(&v)?.transpose(0, 1)?.reshape((seq, width))
}

/// The block split across `comm`'s ranks.
struct ParallelBlock {
    q: ColumnParallelLinear,
    k: ColumnParallelLinear,
    v: ColumnParallelLinear,
    o: RowParallelLinear,
    up: ColumnParallelLinear,
    down: RowParallelLinear,
    local_heads: usize,
}

impl ParallelBlock {
    fn new(comm: Arc<Communicator>) -> candle_core::Result<Self> {
        let f = DType::F32;
        Ok(ParallelBlock {
            q: ColumnParallelLinear::from_full(&comm, &weight(1, D_MODEL, D_MODEL, f)?, None)?,
            k: ColumnParallelLinear::from_full(&comm, &weight(2, D_MODEL, D_MODEL, f)?, None)?,
            v: ColumnParallelLinear::from_full(&comm, &weight(3, D_MODEL, D_MODEL, f)?, None)?,
            up: ColumnParallelLinear::from_full(&comm, &weight(5, D_FF, D_MODEL, f)?, None)?,
            local_heads: HEADS / comm.size(),
            o: RowParallelLinear::from_full(comm.clone(), &weight(4, D_MODEL, D_MODEL, f)?, None)?,
            down: RowParallelLinear::from_full(comm, &weight(6, D_MODEL, D_FF, f)?, None)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let n = rms_norm(x)?;
        let a = attention(
            &self.q.forward(&n)?,
            &self.k.forward(&n)?,
            &self.v.forward(&n)?,
            self.local_heads,
        )?;
        let h = (x + self.o.forward(&a)?)?;
        let m = self.up.forward(&rms_norm(&h)?)?.gelu()?;
        h + self.down.forward(&m)?
    }
}

/// The same block, unsplit, in `dtype` (the reference).
fn full_block(x: &Tensor, dtype: DType) -> candle_core::Result<Tensor> {
    let lin = |seed, rows, cols, t: &Tensor| -> candle_core::Result<Tensor> {
        t.matmul(&weight(seed, rows, cols, dtype)?.t()?)
    };
    let n = rms_norm(x)?;
    let a = attention(
        &lin(1, D_MODEL, D_MODEL, &n)?,
        &lin(2, D_MODEL, D_MODEL, &n)?,
        &lin(3, D_MODEL, D_MODEL, &n)?,
        HEADS,
    )?;
    let h = (x + lin(4, D_MODEL, D_MODEL, &a)?)?;
    let m = lin(5, D_FF, D_MODEL, &rms_norm(&h)?)?.gelu()?;
    h + lin(6, D_MODEL, D_FF, &m)?
}

fn main() -> Result<(), BoxError> {
    let seq: usize = arg("--seq").map(|v| v.parse()).transpose()?.unwrap_or(6);
    let comm = Arc::new(Communicator::from_env()?);
    let (rank, size) = (comm.rank(), comm.size());
    if !HEADS.is_multiple_of(size) || !D_FF.is_multiple_of(size) {
        return Err(format!("{HEADS} heads and {D_FF} hidden features over {size} ranks").into());
    }
    let x: Vec<f64> = (0..seq * D_MODEL)
        .map(|i| ((i * 13) as f64 * 0.29).sin())
        .collect();
    let x64 = Tensor::from_vec(x, (seq, D_MODEL), &Device::Cpu)?;
    let x = x64.to_dtype(DType::F32)?;

    let block = ParallelBlock::new(comm.clone())?;
    let y = block.forward(&x)?;
    let want = full_block(&x64, DType::F64)?;
    let got: Vec<f64> = y.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
    let want: Vec<f64> = want.flatten_all()?.to_vec1()?;
    let max_err = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
    let checksum: f64 = got
        .iter()
        .enumerate()
        .map(|(i, v)| (1 + i % 7) as f64 * v)
        .sum();
    println!("rank={rank} checksum={checksum:.9} max_err={max_err:e} scale={scale:e}");
    if rank == 0 {
        if let Some(path) = arg("--dump") {
            let text: String = got.iter().map(|v| format!("{v:?}\n")).collect();
            std::fs::write(path, text)?;
        }
    }
    comm.barrier()?;
    Ok(())
}
