//! What the Candle examples share: their flag readers, and for
//! `candle_ddp` and `candle_fsdp` the model's shape, the data stream and
//! the initial weights' formula, so that both train the same model on the
//! same samples. Not an example of its own (no `main.rs`): each includes it
//! with `#[path = "common/candle_data.rs"] mod candle_data;`.

use candle_core::{Device, Tensor};

/// Inputs and outputs of the model; its number of linear layers.
pub const D_IN: usize = 16;
pub const D_OUT: usize = 4;
pub const LAYERS: usize = 3;

pub type BoxError = Box<dyn std::error::Error>;

/// The word after flag `name` on the command line, if the flag is there.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

/// The number after flag `name`, or `default` without the flag.
pub fn num(name: &str, default: f64) -> Result<f64, BoxError> {
    match arg(name) {
        Some(v) => Ok(v.parse()?),
        None if std::env::args().any(|a| a == name) => Err(format!("{name} needs a value").into()),
        None => Ok(default),
    }
}

/// Each layer's (inputs, outputs): `D_IN` → `hidden` × 2 → `D_OUT`.
pub fn layer_dims(hidden: usize) -> Vec<(usize, usize)> {
    (0..LAYERS)
        .map(|l| {
            let d_in = if l == 0 { D_IN } else { hidden };
            let d_out = if l + 1 == LAYERS { D_OUT } else { hidden };
            (d_in, d_out)
        })
        .collect()
}

/// Sample `i` of the stream and the output of a fixed "teacher".
pub fn sample(i: usize) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..D_IN)
        .map(|j| ((i * 7 + j * 3) as f32 * 0.37).sin())
        .collect();
    let t = (0..D_OUT)
        .map(|o| (x[o] * x[(o + 5) % D_IN] + 0.5 * x[(o + 9) % D_IN]).tanh())
        .collect();
    (x, t)
}

/// Samples `first..first + rows` as an input tensor (rows × `D_IN`) and a
/// target tensor (rows × `D_OUT`).
pub fn batch(first: usize, rows: usize, dev: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let (mut xs, mut ts) = (Vec::new(), Vec::new());
    for i in first..first + rows {
        let (x, t) = sample(i);
        xs.extend(x);
        ts.extend(t);
    }
    Ok((
        Tensor::from_vec(xs, (rows, D_IN), dev)?,
        Tensor::from_vec(ts, (rows, D_OUT), dev)?,
    ))
}

/// A fixed initial weight: a hash of (`key`, `i`) spread over [-1, 1), at
/// Kaiming-uniform scale for `fan_in` inputs.
pub fn initial(key: usize, i: usize, fan_in: f32) -> f32 {
    let k = ((key as u64) << 32 | i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let u = (k >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
    u / fan_in.sqrt()
}
