//! The hand-written multi-layer perceptron that `mlp_ddp` and `mlp_fsdp`
//! train: its data stream, its layers' forward and backward, the loss, the
//! weights' checksum, and the flag reader and compare-mode arithmetic both
//! use. Not an example of its own (no `main.rs`): each includes it with
//! `#[path = "../common/mlp.rs"] mod mlp;`.
//!
//! A layer `y = W x + b` is given as its `Dims` and its weight and bias
//! slices, W row-major as out × in: `mlp_ddp` keeps W and b as two vectors
//! (two parameters of the reducer), `mlp_fsdp` as one flat parameter, W
//! followed by b (one FSDP unit); both hand the slices in.

/// splitmix64: a tiny deterministic generator, so every run sees the same
/// data (and the same initial weights) without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The shape of one linear layer `y = W x + b`, W row-major as out × in.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub d_in: usize,
    pub d_out: usize,
}

impl Dims {
    /// The number of elements of W.
    pub fn weights(&self) -> usize {
        self.d_in * self.d_out
    }
}

/// The shapes of a model of `layers` linear layers: `d_in` → `hidden` ×
/// (`layers` − 1) → `d_out`.
pub fn layer_dims(layers: usize, d_in: usize, hidden: usize, d_out: usize) -> Vec<Dims> {
    (0..layers)
        .map(|l| Dims {
            d_in: if l == 0 { d_in } else { hidden },
            d_out: if l + 1 == layers { d_out } else { hidden },
        })
        .collect()
}

/// `a · b` in eight independent sums, so that the compiler can keep them in
/// one vector.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y += a x`.
pub fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `x · Wᵀ + b` for a batch of rows.
pub fn forward(d: Dims, w: &[f32], b: &[f32], x: &[f32], rows: usize) -> Vec<f32> {
    let mut y = vec![0f32; rows * d.d_out];
    for r in 0..rows {
        let xr = &x[r * d.d_in..(r + 1) * d.d_in];
        for (o, yo) in y[r * d.d_out..(r + 1) * d.d_out].iter_mut().enumerate() {
            *yo = dot(&w[o * d.d_in..(o + 1) * d.d_in], xr) + b[o];
        }
    }
    y
}

/// The ReLU, in place.
pub fn relu(y: &mut [f32]) {
    y.iter_mut().for_each(|v| *v = v.max(0.0));
}

/// Forward through every layer, a ReLU after each but the last; returns
/// each layer's input followed by the output. `params(l)` is layer `l`'s W
/// and b.
pub fn forward_all<'p>(
    dims: &[Dims],
    mut params: impl FnMut(usize) -> (&'p [f32], &'p [f32]),
    x: Vec<f32>,
    rows: usize,
) -> Vec<Vec<f32>> {
    let mut inputs = vec![x];
    for (l, &d) in dims.iter().enumerate() {
        let (w, b) = params(l);
        let mut y = forward(d, w, b, &inputs[l], rows);
        if l + 1 < dims.len() {
            relu(&mut y);
        }
        inputs.push(y);
    }
    inputs
}

/// Adds a layer's parameter gradients, from the gradient `dy` of its output
/// and its input `x`, into `gw` and `gb`: dW = dyᵀ x, db = Σ dy.
pub fn param_grad(d: Dims, x: &[f32], dy: &[f32], rows: usize, gw: &mut [f32], gb: &mut [f32]) {
    for r in 0..rows {
        let xr = &x[r * d.d_in..(r + 1) * d.d_in];
        for (o, &g) in dy[r * d.d_out..(r + 1) * d.d_out].iter().enumerate() {
            gb[o] += g;
            axpy(&mut gw[o * d.d_in..(o + 1) * d.d_in], g, xr);
        }
    }
}

/// The gradient of a layer's input: dx = dy W.
pub fn input_grad(d: Dims, w: &[f32], dy: &[f32], rows: usize) -> Vec<f32> {
    let mut dx = vec![0f32; rows * d.d_in];
    for r in 0..rows {
        let dxr = &mut dx[r * d.d_in..(r + 1) * d.d_in];
        for (o, &g) in dy[r * d.d_out..(r + 1) * d.d_out].iter().enumerate() {
            axpy(dxr, g, &w[o * d.d_in..(o + 1) * d.d_in]);
        }
    }
    dx
}

/// `dx` through a ReLU whose output was `a`: zero where `a` was not positive.
pub fn relu_back(mut dx: Vec<f32>, a: &[f32]) -> Vec<f32> {
    for (g, a) in dx.iter_mut().zip(a) {
        if *a <= 0.0 {
            *g = 0.0;
        }
    }
    dx
}

/// Mean squared error of `out` against `t` over `denom`, and its gradient
/// with respect to `out`.
pub fn mse(out: &[f32], t: &[f32], denom: f32) -> (f64, Vec<f32>) {
    let loss = out
        .iter()
        .zip(t)
        .map(|(y, t)| f64::from((y - t) * (y - t)))
        .sum::<f64>()
        / f64::from(denom);
    let dy = out
        .iter()
        .zip(t)
        .map(|(y, t)| (y - t) / denom * 2.0)
        .collect();
    (loss, dy)
}

/// Samples `first..first + rows` of the stream: inputs and the outputs of a
/// fixed random "teacher" that the model learns to imitate.
pub fn batch(first: usize, rows: usize, d_in: usize, d_out: usize) -> (Vec<f32>, Vec<f32>) {
    let mut x = Vec::with_capacity(rows * d_in);
    let mut t = Vec::with_capacity(rows * d_out);
    for i in first..first + rows {
        let mut rng = Rng(0x5eed ^ (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        let xi: Vec<f32> = (0..d_in).map(|_| rng.uniform()).collect();
        for o in 0..d_out {
            // The teacher: a sparse fixed mix of inputs through tanh.
            let s: f32 = (0..8)
                .map(|k| xi[(o * 37 + k * 11) % d_in] * if k % 2 == 0 { 0.5 } else { -0.3 })
                .sum();
            t.push(s.tanh());
        }
        x.extend(xi);
    }
    (x, t)
}

/// Weighted sum of every weight, in the model's order (W0 b0 W1 b1 ...),
/// each times 1..7 by its place: equal on every rank when training is
/// synchronised, and the example tests' measure of "the same model".
pub fn checksum<'a>(weights: impl IntoIterator<Item = &'a f32>) -> f64 {
    weights
        .into_iter()
        .enumerate()
        .map(|(i, &v)| f64::from(v) * (1.0 + (i % 7) as f64))
        .sum()
}

/// The median and the least of step times (sorted in place); zeros if
/// there are none.
pub fn median_min(times: &mut [f64]) -> (f64, f64) {
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(0.0);
    let min = times.first().copied().unwrap_or(0.0);
    (median, min)
}

/// The share of the communication a variant hides, as a percentage: its
/// median against the serial twin's (all communication exposed) and the
/// compute-only `none`'s, (serial − median) / (serial − none); `-` without
/// both or when the serial twin is not slower than `none`.
pub fn hidden_share(none: Option<f64>, serial: Option<f64>, median: f64) -> String {
    match (none, serial) {
        (Some(z), Some(s)) if s > z => format!("{:.0}%", 100.0 * (s - median) / (s - z)),
        _ => "-".into(),
    }
}

/// The command line's flags, one at a time, with their values.
pub struct Flags(std::iter::Skip<std::env::Args>);

impl Flags {
    pub fn from_env() -> Self {
        Flags(std::env::args().skip(1))
    }

    /// The next flag, if any.
    pub fn flag(&mut self) -> Option<String> {
        self.0.next()
    }

    /// The value after `flag`.
    pub fn value(&mut self, flag: &str) -> Result<String, String> {
        self.0.next().ok_or(format!("{flag} needs a value"))
    }

    /// The value after `flag`, as a number.
    pub fn num(&mut self, flag: &str) -> Result<f64, String> {
        self.value(flag)?
            .parse::<f64>()
            .map_err(|e| format!("{flag}: {e}"))
    }
}

/// An example's `main`: parse the flags (exit 2 on a bad one), run
/// (exit 1 on an error), each error on stderr after the example's `name`.
pub fn main_of<A>(
    name: &str,
    parse: impl FnOnce() -> Result<A, String>,
    run: impl FnOnce(&A) -> ferroccl::Result<()>,
) {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("{name}: {e}");
        std::process::exit(1);
    }
}
