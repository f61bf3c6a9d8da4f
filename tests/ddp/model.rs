//! A small MLP with a hand-written backward, in f64, and the harness the
//! other sections train it with: the single-process reference, training
//! on thread ranks through a `Reducer`, and the tolerances of the match.
//! No tests here; the model must stay the same for every section.
//!
//! y = W3 relu(W2 relu(W1 x + b1) + b2) + b3 (+ aux for the first quarter of
//! each global batch), loss = mean over samples of 0.5 |y - t|^2. `dead` is a
//! parameter no sample uses. Registration order: W1 b1 W2 b2 W3 b3 aux dead.

use ferroccl::ddp::{CommHook, ParamSpec, Reducer, ReducerConfig};
use ferroccl::testing::run_ranks;
use ferroccl::{Communicator, Element};

pub(crate) const D_IN: usize = 5;
pub(crate) const H: usize = 12;
pub(crate) const D_OUT: usize = 3;
/// Global batch: divisible by 2, 3 and 4.
const BATCH: usize = 24;
pub(crate) const LR: f64 = 0.05;

const NAMES: [&str; 8] = ["W1", "b1", "W2", "b2", "W3", "b3", "aux", "dead"];
pub(crate) const LENS: [usize; 8] = [H * D_IN, H, H * H, H, D_OUT * H, D_OUT, D_OUT, 5];
const AUX: usize = 6;
const DEAD: usize = 7;

pub(crate) fn specs(n: usize) -> Vec<ParamSpec> {
    (0..n).map(|p| ParamSpec::new(NAMES[p], LENS[p])).collect()
}

/// Deterministic initial weights (the same on every rank, as if broadcast).
pub(crate) fn init_params(n: usize) -> Vec<Vec<f64>> {
    (0..n)
        .map(|p| {
            (0..LENS[p])
                .map(|i| 0.4 * ((p * 131 + i * 17) as f64 * 0.61).sin())
                .collect()
        })
        .collect()
}

/// Sample `i` of the data stream: input and target.
fn sample(i: usize) -> ([f64; D_IN], [f64; D_OUT]) {
    let mut x = [0.0; D_IN];
    for (j, v) in x.iter_mut().enumerate() {
        *v = ((i * 7 + j * 3) as f64 * 0.37).sin() + 0.1 * j as f64;
    }
    let mut t = [0.0; D_OUT];
    for (k, v) in t.iter_mut().enumerate() {
        *v = (x[k] * x[(k + 1) % D_IN]).tanh() + 0.2 * k as f64;
    }
    (x, t)
}

fn matvec(w: &[f64], x: &[f64], b: &[f64]) -> Vec<f64> {
    b.iter()
        .enumerate()
        .map(|(r, bias)| {
            bias + w[r * x.len()..(r + 1) * x.len()]
                .iter()
                .zip(x)
                .map(|(a, c)| a * c)
                .sum::<f64>()
        })
        .collect()
}

/// Gradients of the mean loss over `samples` (global sample indices), times
/// `scale`, layer by layer from the last: `emit(param, grad)` is called in
/// the order backward produces them (W3 b3 aux, W2 b2, W1 b1). `uses_aux`
/// says which samples add `aux` to their output.
pub(crate) fn backward(
    params: &[Vec<f64>],
    samples: &[usize],
    denom: f64,
    uses_aux: impl Fn(usize) -> bool,
    mut emit: impl FnMut(usize, Vec<f64>),
) {
    let n_params = params.len();
    let (w1, b1, w2, b2, w3, b3) = (
        &params[0], &params[1], &params[2], &params[3], &params[4], &params[5],
    );
    let mut acts = Vec::new();
    for &s in samples {
        let (x, t) = sample(s);
        let z1 = matvec(w1, &x, b1);
        let a1: Vec<f64> = z1.iter().map(|v| v.max(0.0)).collect();
        let z2 = matvec(w2, &a1, b2);
        let a2: Vec<f64> = z2.iter().map(|v| v.max(0.0)).collect();
        let mut y = matvec(w3, &a2, b3);
        if n_params > AUX && uses_aux(s) {
            for (v, a) in y.iter_mut().zip(&params[AUX]) {
                *v += a;
            }
        }
        let dy: Vec<f64> = y.iter().zip(&t).map(|(a, b)| (a - b) / denom).collect();
        acts.push((x, z1, a1, z2, a2, dy, uses_aux(s)));
    }
    // Layer 3 (and aux).
    let mut gw3 = vec![0.0; D_OUT * H];
    let mut gb3 = vec![0.0; D_OUT];
    let mut gaux = vec![0.0; D_OUT];
    for (_, _, _, _, a2, dy, aux) in &acts {
        for k in 0..D_OUT {
            gb3[k] += dy[k];
            if *aux {
                gaux[k] += dy[k];
            }
            for j in 0..H {
                gw3[k * H + j] += dy[k] * a2[j];
            }
        }
    }
    emit(4, gw3);
    emit(5, gb3);
    if n_params > AUX && acts.iter().any(|a| a.6) {
        emit(AUX, gaux);
    }
    // Layer 2.
    let mut gw2 = vec![0.0; H * H];
    let mut gb2 = vec![0.0; H];
    let mut dz2s = Vec::new();
    for (_, _, a1, z2, _, dy, _) in &acts {
        let dz2: Vec<f64> = (0..H)
            .map(|j| {
                let da2: f64 = (0..D_OUT).map(|k| w3[k * H + j] * dy[k]).sum();
                if z2[j] > 0.0 {
                    da2
                } else {
                    0.0
                }
            })
            .collect();
        for j in 0..H {
            gb2[j] += dz2[j];
            for i in 0..H {
                gw2[j * H + i] += dz2[j] * a1[i];
            }
        }
        dz2s.push(dz2);
    }
    emit(2, gw2);
    emit(3, gb2);
    // Layer 1.
    let mut gw1 = vec![0.0; H * D_IN];
    let mut gb1 = vec![0.0; H];
    for ((x, z1, ..), dz2) in acts.iter().zip(&dz2s) {
        for i in 0..H {
            let da1: f64 = (0..H).map(|j| w2[j * H + i] * dz2[j]).sum();
            let dz1 = if z1[i] > 0.0 { da1 } else { 0.0 };
            gb1[i] += dz1;
            for c in 0..D_IN {
                gw1[i * D_IN + c] += dz1 * x[c];
            }
        }
    }
    emit(0, gw1);
    emit(1, gb1);
}

/// Samples of optimizer step `step`, micro-step `micro` of `micros`: one
/// global batch each.
fn global_batch(step: usize, micro: usize, micros: usize) -> std::ops::Range<usize> {
    let start = (step * micros + micro) * BATCH;
    start..start + BATCH
}

/// The first quarter of every global batch uses `aux`; with contiguous
/// shards of at least a quarter, only rank 0 holds such samples.
fn uses_aux(s: usize) -> bool {
    s % BATCH < BATCH / 4
}

/// One process on the whole batch: plain SGD on the mean loss over all
/// `micros` micro-batches of each step. Also returns the largest gradient
/// component seen, for the tolerances.
fn reference(n_params: usize, steps: usize, micros: usize) -> (Vec<Vec<f64>>, f64) {
    let mut params = init_params(n_params);
    let mut gmax = 0f64;
    for step in 0..steps {
        let samples: Vec<usize> = (0..micros)
            .flat_map(|m| global_batch(step, m, micros))
            .collect();
        let mut grads = vec![Vec::new(); n_params];
        let denom = samples.len() as f64;
        backward(&params, &samples, denom, uses_aux, |p, g| grads[p] = g);
        for (p, w) in params.iter_mut().enumerate() {
            // Parameters with no gradient (aux unused, dead) keep their value.
            for (i, v) in w.iter_mut().enumerate() {
                let g = grads[p].get(i).copied().unwrap_or(0.0);
                gmax = gmax.max(g.abs());
                *v -= LR * g;
            }
        }
    }
    (params, gmax)
}

/// How a rank deals with parameters it has no gradient for.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Unused {
    /// The model has no aux/dead parameters.
    None,
    /// `mark_unused` for each parameter without a gradient.
    Declared,
    /// `find_unused_parameters`: the reducer finds them at `finish()`.
    Detected,
}

#[derive(Clone, Copy)]
pub(crate) struct Run {
    pub(crate) steps: usize,
    pub(crate) micros: usize,
    pub(crate) unused: Unused,
    /// Reverse the order of marks (to give rebuild something to learn).
    pub(crate) forward_order: bool,
}

impl Run {
    fn n_params(&self) -> usize {
        if self.unused == Unused::None {
            6
        } else {
            8
        }
    }
}

/// Train on `comm`'s rank with a `Reducer<T>` (gradients rounded to T on the
/// way in, weights kept in f64) and return the final weights and the
/// reducer's bucket layout.
fn train<T: Element>(
    comm: &Communicator,
    run: Run,
    config: ReducerConfig,
    hook: Option<Box<dyn CommHook<T>>>,
    u: f64,
) -> (Vec<Vec<f64>>, Vec<Vec<usize>>) {
    let n_params = run.n_params();
    let config = ReducerConfig {
        find_unused_parameters: run.unused == Unused::Detected,
        ..config
    };
    let mut reducer = match hook {
        Some(h) => Reducer::with_hook(comm, &specs(n_params), config, h),
        None => Reducer::new(comm, &specs(n_params), config),
    }
    .unwrap();
    let (rank, size) = (comm.rank(), comm.size());
    let shard = BATCH / size;
    let mut params = init_params(n_params);
    for step in 0..run.steps {
        for micro in 0..run.micros {
            reducer.set_sync(micro + 1 == run.micros);
            let batch = global_batch(step, micro, run.micros);
            let samples: Vec<usize> = batch.skip(rank * shard).take(shard).collect();
            // Each micro-step's local loss is the mean over the shard, scaled
            // by 1/micros so that the accumulated sum is the mean of the step.
            let denom = (shard * run.micros) as f64;
            let mut produced = Vec::new();
            backward(&params, &samples, denom, uses_aux, |p, g| {
                produced.push((p, g))
            });
            if run.forward_order {
                produced.reverse();
            }
            let mut given = vec![false; n_params];
            for (p, g) in produced {
                let g: Vec<T> = g.iter().map(|&v| T::from_f64(v)).collect();
                reducer.mark_ready(p, &g).unwrap();
                given[p] = true;
            }
            if run.unused == Unused::Declared {
                for p in (0..n_params).filter(|&p| !given[p]) {
                    reducer.mark_unused(p).unwrap();
                }
            }
            reducer.finish().unwrap();
        }
        check_step_gradients(&reducer, &params, run, step, size, u);
        for (p, w) in params.iter_mut().enumerate() {
            let g = reducer.grad(p).expect("averaged gradient after finish()");
            for (v, g) in w.iter_mut().zip(g) {
                *v -= LR * g.to_f64();
            }
        }
    }
    if run.unused != Unused::None {
        assert_eq!(reducer.globally_unused(), &[DEAD], "rank {rank}");
    }
    (params, reducer.bucket_layout())
}

/// Rank `rank`'s gradient for optimizer step `step` at `params`, summed
/// over the step's micro-steps (zero where it has none), and the sum of the
/// micro-steps' absolute values.
fn shard_gradient(
    params: &[Vec<f64>],
    run: Run,
    step: usize,
    rank: usize,
    size: usize,
) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let shard = BATCH / size;
    let mut sum: Vec<Vec<f64>> = params.iter().map(|p| vec![0.0; p.len()]).collect();
    let mut abs = sum.clone();
    for micro in 0..run.micros {
        let samples: Vec<usize> = global_batch(step, micro, run.micros)
            .skip(rank * shard)
            .take(shard)
            .collect();
        backward(
            params,
            &samples,
            (shard * run.micros) as f64,
            uses_aux,
            |p, g| {
                for (i, v) in g.iter().enumerate() {
                    sum[p][i] += v;
                    abs[p][i] += v.abs();
                }
            },
        );
    }
    (sum, abs)
}

/// The reducer's gradient of a step against the average of every rank's
/// gradient, recomputed here in f64 from the same weights. Per component
/// the reduced value may differ by the rounding of each rank's gradient to
/// the wire type and of each partial sum along the reduction: at most
/// `size` + `micros` roundings of values no larger than the largest
/// per-rank magnitude, plus the division (one more); a floor of `size`
/// times f16's subnormal spacing (2^-24) covers gradients that the
/// compression hooks divide into f16's subnormal range.
fn check_step_gradients<T: Element>(
    reducer: &Reducer<'_, T>,
    params: &[Vec<f64>],
    run: Run,
    step: usize,
    size: usize,
    u: f64,
) {
    let shards: Vec<_> = (0..size)
        .map(|r| shard_gradient(params, run, step, r, size))
        .collect();
    let roundings = (size + run.micros + 1) as f64;
    for (p, name) in NAMES.iter().enumerate().take(params.len()) {
        let got = reducer.grad(p).expect("averaged gradient after finish()");
        for (i, g) in got.iter().enumerate() {
            let want = shards.iter().map(|s| s.0[p][i]).sum::<f64>() / size as f64;
            let scale = shards.iter().map(|s| s.1[p][i]).fold(0.0, f64::max);
            let tol = roundings * u * scale * 1.01 + size as f64 * 2f64.powi(-24);
            assert!(
                (g.to_f64() - want).abs() <= tol,
                "step {step}, {size} ranks: {name}[{i}] is {}, expected {want} (tolerance {tol})",
                g.to_f64()
            );
        }
    }
}

/// Small caps so the 8 parameters spread over several buckets: the first
/// bucket closes at 64 bytes, the others at 400.
pub(crate) fn small_buckets() -> ReducerConfig {
    ReducerConfig {
        first_bucket_cap_bytes: 64,
        bucket_cap_bytes: 400,
        ..ReducerConfig::default()
    }
}

fn max_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Tolerance of the final weights when gradients travel in a type of unit
/// roundoff `u`. Per step and component, the reduced gradient differs from
/// the reference by the rounding of each rank's gradient to the type (u·G),
/// of the partial sums along the ring (at most `size` roundings of values
/// up to G) and of the division, so by at most (size + 2)·u·G, plus f64's
/// reassociation, which is far smaller; SGD moves each weight by lr times
/// that per step, over `steps` steps. Differences in weights feed back into
/// later gradients; with lr = 0.05 and this model's curvature the growth
/// over 4 steps stays below 2x, and the factor 4 covers it with margin. A
/// floor of 1e-11 covers f64 reassociation (sums of at most 96 terms of
/// size G, u = 2^-53: below 1e-13 after 4 steps).
fn tolerance(u: f64, size: usize, steps: usize, gmax: f64) -> f64 {
    (4.0 * steps as f64 * LR * (size as f64 + 2.0) * u * gmax).max(1e-11)
}

pub(crate) const U_F64: f64 = 1.1102230246251565e-16;
pub(crate) const U_F32: f64 = 5.960464477539063e-8;
/// f16: 2^-11 relative, plus the division by the world size before the
/// cast can push small gradients into subnormals (absolute spacing 2^-24),
/// which `gmax` of order 1 absorbs.
pub(crate) const U_F16: f64 = 4.8828125e-4;
pub(crate) const U_BF16: f64 = 3.90625e-3;

pub(crate) fn check_equivalence<T: Element>(
    ranks: usize,
    run: Run,
    config: ReducerConfig,
    hook: fn() -> Option<Box<dyn CommHook<T>>>,
    u: f64,
) -> Vec<Vec<Vec<usize>>> {
    let (want, gmax) = reference(run.n_params(), run.steps, run.micros);
    let init = init_params(run.n_params());
    // The test can fail: training moves the weights by more than the
    // tolerance (for the 16-bit hooks this worst-case bound over the whole
    // trajectory is loose; the per-step gradient check is the sharp one).
    let moved = max_diff(&want, &init);
    let tol = tolerance(u, ranks, run.steps, gmax);
    assert!(moved > tol, "weights moved {moved}, tolerance {tol}");
    let results = run_ranks(ranks, |comm| {
        train::<T>(&comm, run, config.clone(), hook(), u)
    });
    let mut layouts = Vec::new();
    for (rank, (got, layout)) in results.into_iter().enumerate() {
        let d = max_diff(&got, &want);
        assert!(
            d <= tol,
            "{ranks} ranks, rank {rank}: weights differ from the single-process reference by {d} \
             (tolerance {tol}, moved {moved})"
        );
        layouts.push(layout);
    }
    layouts
}

pub(crate) fn plain() -> Run {
    Run {
        steps: 4,
        micros: 1,
        unused: Unused::None,
        forward_order: false,
    }
}

pub(crate) fn no_rebuild() -> ReducerConfig {
    ReducerConfig {
        rebuild_buckets: false,
        ..small_buckets()
    }
}
