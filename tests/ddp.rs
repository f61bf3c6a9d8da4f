//! The data-parallel reducer: N thread ranks, each on its share of a global
//! batch, must end K SGD steps with the weights one process gets on the
//! whole batch (computed independently here, in f64, with no reducer), and
//! a rank whose backward goes wrong must get a clear error while the others
//! get one too instead of hanging.

mod common;

use ferroccl::ddp::{
    Bf16CompressHook, Bucket, CommHook, Fp16CompressHook, ParamSpec, PendingBucket, Reducer,
    ReducerConfig,
};
use ferroccl::testing::{run_ranks, run_ranks_with};
use ferroccl::{Communicator, Element, Error, ReduceOp};
use half::{bf16, f16};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// A small MLP with a hand-written backward, in f64.
//
// y = W3 relu(W2 relu(W1 x + b1) + b2) + b3 (+ aux for the first quarter of
// each global batch), loss = mean over samples of 0.5 |y - t|^2. `dead` is a
// parameter no sample uses. Registration order: W1 b1 W2 b2 W3 b3 aux dead.
// ---------------------------------------------------------------------------

const D_IN: usize = 5;
const H: usize = 12;
const D_OUT: usize = 3;
/// Global batch: divisible by 2, 3 and 4.
const BATCH: usize = 24;
const LR: f64 = 0.05;

const NAMES: [&str; 8] = ["W1", "b1", "W2", "b2", "W3", "b3", "aux", "dead"];
const LENS: [usize; 8] = [H * D_IN, H, H * H, H, D_OUT * H, D_OUT, D_OUT, 5];
const AUX: usize = 6;
const DEAD: usize = 7;

fn specs(n: usize) -> Vec<ParamSpec> {
    (0..n).map(|p| ParamSpec::new(NAMES[p], LENS[p])).collect()
}

/// Deterministic initial weights (the same on every rank, as if broadcast).
fn init_params(n: usize) -> Vec<Vec<f64>> {
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
fn backward(
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
enum Unused {
    /// The model has no aux/dead parameters.
    None,
    /// `mark_unused` for each parameter without a gradient.
    Declared,
    /// `find_unused_parameters`: the reducer finds them at `finish()`.
    Detected,
}

#[derive(Clone, Copy)]
struct Run {
    steps: usize,
    micros: usize,
    unused: Unused,
    /// Reverse the order of marks (to give rebuild something to learn).
    forward_order: bool,
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
fn small_buckets() -> ReducerConfig {
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

const U_F64: f64 = 1.1102230246251565e-16;
const U_F32: f64 = 5.960464477539063e-8;
/// f16: 2^-11 relative, plus the division by the world size before the
/// cast can push small gradients into subnormals (absolute spacing 2^-24),
/// which `gmax` of order 1 absorbs.
const U_F16: f64 = 4.8828125e-4;
const U_BF16: f64 = 3.90625e-3;

fn check_equivalence<T: Element>(
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

fn plain() -> Run {
    Run {
        steps: 4,
        micros: 1,
        unused: Unused::None,
        forward_order: false,
    }
}

fn no_rebuild() -> ReducerConfig {
    ReducerConfig {
        rebuild_buckets: false,
        ..small_buckets()
    }
}

// ---------------------------------------------------------------------------
// Equivalence.
// ---------------------------------------------------------------------------

#[test]
fn n_ranks_match_one_process_without_rebuild() {
    for ranks in [2, 3, 4] {
        check_equivalence::<f64>(ranks, plain(), no_rebuild(), || None, U_F64);
    }
}

#[test]
fn n_ranks_match_one_process_with_rebuild() {
    for ranks in [2, 3, 4] {
        let run = Run {
            forward_order: true,
            ..plain()
        };
        let layouts = check_equivalence::<f64>(ranks, run, small_buckets(), || None, U_F64);
        // Backward handed gradients over in the order b1 W1 b2 W2 b3 W3;
        // packed greedily with f64 sizes (96, 480, 96, 1152, 24, 288 bytes)
        // under caps of 64 then 400 bytes. The initial layout started from
        // the last parameter instead.
        for layout in &layouts {
            assert_eq!(layout, &vec![vec![1], vec![0], vec![3, 2], vec![5, 4]]);
        }
    }
}

#[test]
fn plain_buckets_match_one_process_too() {
    // The default reducer allocates its buckets as windows; the same
    // training with ordinary vectors for buckets.
    for ranks in [2, 3] {
        let config = ReducerConfig {
            windows: false,
            ..small_buckets()
        };
        check_equivalence::<f64>(ranks, plain(), config, || None, U_F64);
    }
}

/// With buckets in windows, each bucket's allreduce runs directly between
/// the ranks' buckets (counted by the communicator); with plain buckets
/// through slots. Both give the average, computed here independently.
#[test]
fn buckets_in_windows_reduce_directly() {
    // Three parameters of 3000 f64 (24 KB, more than a check-in carries
    // inline), in buckets of at most 2 parameters.
    let lens = [3000usize, 3000, 3000];
    let specs: Vec<ParamSpec> = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| ParamSpec::new(format!("p{i}"), l))
        .collect();
    let value = |rank: usize, p: usize, i: usize| ((rank + 1) * (p + 2) + i % 17) as f64;
    let results = run_ranks(3, |comm| {
        let n = comm.size();
        let mut calls = Vec::new();
        for windows in [true, false] {
            let config = ReducerConfig {
                first_bucket_cap_bytes: 48_000,
                bucket_cap_bytes: 48_000,
                rebuild_buckets: false,
                windows,
                ..ReducerConfig::default()
            };
            let mut reducer = Reducer::<f64>::new(&comm, &specs, config).unwrap();
            let before = comm.direct_window_calls();
            for p in (0..lens.len()).rev() {
                let g: Vec<f64> = (0..lens[p]).map(|i| value(comm.rank(), p, i)).collect();
                reducer.mark_ready(p, &g).unwrap();
            }
            reducer.finish().unwrap();
            calls.push((
                comm.direct_window_calls() - before,
                reducer.bucket_layout().len() as u64,
            ));
            for (p, &len) in lens.iter().enumerate() {
                let got = reducer.grad(p).unwrap();
                assert_eq!(got.len(), len);
                for (i, &g) in got.iter().enumerate() {
                    let want = (0..n).map(|r| value(r, p, i)).sum::<f64>() / n as f64;
                    assert!(
                        (g - want).abs() <= 1e-12 * want.abs(),
                        "windows {windows}: parameter {p} element {i} is {g}, expected {want}"
                    );
                }
            }
        }
        calls
    });
    for (rank, calls) in results.into_iter().enumerate() {
        let [(with_windows, buckets), (plain, _)] = calls[..] else {
            unreachable!()
        };
        assert_eq!(buckets, 2, "rank {rank}: two buckets");
        assert_eq!(
            with_windows,
            plain + buckets,
            "rank {rank}: every bucket in a window is reduced directly"
        );
    }
}

/// A bucket is a window or a vector, used as a slice either way.
#[test]
fn a_bucket_is_a_window_or_a_vector() {
    let results = run_ranks(2, |comm| {
        let mut w = Bucket::from_window(comm.alloc_window::<f32>(5).unwrap());
        let shared = w.is_shared();
        w.iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = (i + comm.rank()) as f32);
        let mut v = Bucket::from(vec![1f32, 2.0]);
        v[1] = 7.0;
        (shared, v.is_shared(), w.into_vec(), v.into_vec())
    });
    for (rank, (shared, vec_shared, w, v)) in results.into_iter().enumerate() {
        assert!(shared, "rank {rank}: a window of 2 thread ranks is shared");
        assert!(!vec_shared);
        let want: Vec<f32> = (0..5).map(|i| (i + rank) as f32).collect();
        assert_eq!(w, want);
        assert_eq!(v, vec![1.0, 7.0]);
    }
}

#[test]
fn f32_gradients_match_within_f32_rounding() {
    for ranks in [2, 3, 4] {
        check_equivalence::<f32>(ranks, plain(), small_buckets(), || None, U_F32);
    }
}

#[test]
fn no_sync_accumulation_matches_the_whole_batch() {
    for ranks in [2, 3, 4] {
        let run = Run {
            micros: 3,
            ..plain()
        };
        check_equivalence::<f64>(ranks, run, small_buckets(), || None, U_F64);
    }
}

#[test]
fn prefix_streaming_matches_one_process() {
    let config = ReducerConfig {
        prefix_chunk_bytes: Some(100),
        bucket_cap_bytes: 1 << 20,
        ..small_buckets()
    };
    for ranks in [2, 3, 4] {
        check_equivalence::<f64>(ranks, plain(), config.clone(), || None, U_F64);
    }
}

#[test]
fn fp16_and_bf16_hooks_match_within_their_rounding() {
    for ranks in [2, 3, 4] {
        check_equivalence::<f32>(
            ranks,
            plain(),
            small_buckets(),
            || Some(Box::new(Fp16CompressHook)),
            U_F16,
        );
        check_equivalence::<f32>(
            ranks,
            plain(),
            small_buckets(),
            || Some(Box::new(Bf16CompressHook)),
            U_BF16,
        );
    }
}

#[test]
fn unused_parameters_declared_or_detected_count_as_zero() {
    for ranks in [2, 3, 4] {
        for unused in [Unused::Declared, Unused::Detected] {
            let run = Run { unused, ..plain() };
            check_equivalence::<f64>(ranks, run, small_buckets(), || None, U_F64);
        }
    }
    // With micro-steps too: aux accumulates only on rank 0.
    let run = Run {
        unused: Unused::Detected,
        micros: 2,
        ..plain()
    };
    check_equivalence::<f64>(3, run, small_buckets(), || None, U_F64);
}

/// A hook of the user's: sum with one allreduce, then divide on the way
/// back (through `PendingBucket::then`).
struct SumThenDivide;

impl CommHook<f64> for SumThenDivide {
    fn launch(
        &self,
        comm: &Communicator,
        bucket: Bucket<f64>,
    ) -> ferroccl::Result<PendingBucket<f64>> {
        let n = comm.size() as f64;
        let work = comm.all_reduce_async(bucket, ReduceOp::Sum)?;
        Ok(PendingBucket::then(work, move |mut b: Bucket<f64>| {
            b.iter_mut().for_each(|v| *v /= n);
            Ok(b)
        }))
    }
    fn name(&self) -> &str {
        "sum_then_divide"
    }
}

#[test]
fn a_user_hook_replaces_the_allreduce() {
    check_equivalence::<f64>(
        3,
        plain(),
        small_buckets(),
        || Some(Box::new(SumThenDivide)),
        U_F64,
    );
}

#[test]
fn half_precision_reducers_average_within_one_rounding() {
    fn check<T: Element>(u: f64) {
        let size = 3;
        let lens = [7usize, 300, 5];
        let value = |r: usize, p: usize, i: usize| ((r * 31 + p * 7 + i) % 13) as f64 * 0.25 - 1.5;
        let got = run_ranks(size, |comm| {
            let specs: Vec<ParamSpec> = lens
                .iter()
                .enumerate()
                .map(|(p, &l)| ParamSpec::new(format!("p{p}"), l))
                .collect();
            let mut r = Reducer::<T>::new(&comm, &specs, small_buckets()).unwrap();
            for p in (0..lens.len()).rev() {
                let g: Vec<T> = (0..lens[p])
                    .map(|i| T::from_f64(value(comm.rank(), p, i)))
                    .collect();
                r.mark_ready(p, &g).unwrap();
            }
            r.finish().unwrap();
            (0..lens.len())
                .map(|p| {
                    r.grad(p)
                        .unwrap()
                        .iter()
                        .map(|v| v.to_f64())
                        .collect::<Vec<_>>()
                })
                .collect::<Vec<_>>()
        });
        for (rank, grads) in got.iter().enumerate() {
            for (p, g) in grads.iter().enumerate() {
                for (i, v) in g.iter().enumerate() {
                    let want = (0..size).map(|r| value(r, p, i)).sum::<f64>() / size as f64;
                    // Inputs are exact; partial sums (multiples of 0.25 below
                    // 16) are exact too; only the division rounds, once.
                    assert!(
                        (v - want).abs() <= want.abs() * u * 1.01,
                        "{} rank {rank} p{p}[{i}]: {v} vs {want}",
                        T::DTYPE
                    );
                }
            }
        }
    }
    check::<f16>(U_F16);
    check::<bf16>(U_BF16);
    check::<f64>(U_F64);
}

// ---------------------------------------------------------------------------
// Layout, streaming.
// ---------------------------------------------------------------------------

#[test]
fn every_rank_has_the_same_layout_after_rebuild_even_when_orders_differ() {
    let layouts = run_ranks(3, |comm| {
        let mut r = Reducer::<f32>::new(&comm, &specs(6), small_buckets()).unwrap();
        let before = r.bucket_layout();
        // Each rank produces gradients in another order; rank 0's wins.
        let mut order: Vec<usize> = (0..6).collect();
        order.rotate_left(comm.rank() * 2);
        for &p in &order {
            r.mark_ready(p, &vec![1.0; LENS[p]]).unwrap();
        }
        r.finish().unwrap();
        assert!(r.is_rebuilt());
        let mut g3 = vec![0.0; LENS[3]];
        let mut rest: Vec<Vec<f32>> = (0..6).map(|p| vec![0.0; LENS[p]]).collect();
        let mut out: Vec<&mut [f32]> = rest.iter_mut().map(|v| &mut v[..]).collect();
        out[3] = &mut g3;
        r.copy_grads_into(&mut out).unwrap();
        (before, r.bucket_layout(), g3)
    });
    // Independently: rank 0's order 0..6 packed greedily (64 bytes first,
    // then 400) with f32 sizes 240, 48, 576, 48, 144, 12 bytes.
    let want = vec![vec![0], vec![1, 2], vec![3, 4, 5]];
    for (rank, (before, after, g3)) in layouts.iter().enumerate() {
        assert_eq!(
            before,
            &vec![vec![5, 4], vec![3, 2], vec![1, 0]],
            "rank {rank} before"
        );
        assert_eq!(after, &want, "rank {rank} after rebuild");
        assert!(
            g3.iter().all(|&v| v == 1.0),
            "gradients survive the rebuild"
        );
    }
}

#[test]
fn a_full_bucket_starts_before_backward_ends() {
    run_ranks(2, |comm| {
        let config = ReducerConfig {
            prefix_chunk_bytes: Some(64),
            ..small_buckets()
        };
        let mut r = Reducer::<f32>::new(&comm, &specs(6), config).unwrap();
        assert_eq!(r.launched(), 0);
        // Bucket 0 is [5, 4] (b3: 12 bytes, W3: 144 bytes).
        r.mark_ready(5, &[1.0; D_OUT]).unwrap();
        assert_eq!(r.launched(), 0, "half a bucket must not launch");
        r.mark_ready(4, &[1.0; D_OUT * H]).unwrap();
        assert_eq!(r.launched(), 1, "a full first bucket launches at once");
        assert!(r.grad(4).is_none(), "its buffer is with the collective");
        // Out of order: bucket 2 ([1, 0]) fills before bucket 1 ([3, 2]) and
        // must wait for it, so that every rank issues buckets in one order.
        r.mark_ready(1, &[1.0; H]).unwrap();
        r.mark_ready(0, &vec![1.0; H * D_IN]).unwrap();
        assert_eq!(r.launched(), 1);
        r.mark_ready(3, &[1.0; H]).unwrap();
        // Prefix streaming: bucket 1 is cut into [3, 2] -> chunks [3], [2]?
        // b2 is 48 bytes < 64, so the first chunk is [3, 2]: nothing yet.
        assert_eq!(r.launched(), 1);
        r.mark_ready(2, &vec![1.0; H * H]).unwrap();
        assert_eq!(r.launched(), r.chunk_layout().len());
        r.finish().unwrap();
        assert!(r.grad(4).unwrap().iter().all(|&v| v == 1.0));
    });
}

#[test]
fn prefix_streaming_launches_the_ready_prefix_of_a_bucket() {
    run_ranks(2, |comm| {
        // One bucket of everything, cut into chunks of >= 100 bytes.
        let config = ReducerConfig {
            first_bucket_cap_bytes: 1 << 20,
            bucket_cap_bytes: 1 << 20,
            prefix_chunk_bytes: Some(100),
            rebuild_buckets: false,
            ..ReducerConfig::default()
        };
        let mut r = Reducer::<f32>::new(&comm, &specs(6), config).unwrap();
        assert_eq!(r.bucket_layout(), vec![vec![5, 4, 3, 2, 1, 0]]);
        // f32 bytes: b3 12, W3 144 -> chunk; b2 48, W2 576 -> chunk; b1 48, W1 240 -> chunk.
        assert_eq!(r.chunk_layout(), vec![vec![5, 4], vec![3, 2], vec![1, 0]]);
        r.mark_ready(5, &[2.0; D_OUT]).unwrap();
        r.mark_ready(4, &[2.0; D_OUT * H]).unwrap();
        assert_eq!(
            r.launched(),
            1,
            "the ready prefix of the bucket is on its way"
        );
        for p in [3, 2, 1, 0] {
            r.mark_ready(p, &vec![2.0 * (comm.rank() + 1) as f32; LENS[p]])
                .unwrap();
        }
        r.finish().unwrap();
        assert!(r.grad(5).unwrap().iter().all(|&v| v == 2.0));
        assert!(r.grad(0).unwrap().iter().all(|&v| v == 3.0), "(2 + 4) / 2");
    });
}

// ---------------------------------------------------------------------------
// Errors: clear on the offending rank, and no hang on the others.
// ---------------------------------------------------------------------------

/// Run 3 ranks with a short timeout; `fault(rank, reducer)` runs the step's
/// backward (possibly wrongly) before finish(). Returns each rank's finish()
/// result, then checks that a clean step afterwards gives the right average.
fn faulty_step(fault: impl Fn(usize, &mut Reducer<'_, f32>) + Sync) -> Vec<Result<(), Error>> {
    let start = Instant::now();
    let results = run_ranks_with(
        3,
        |c| c.timeout = Duration::from_secs(10),
        |comm| {
            let mut r = Reducer::<f32>::new(&comm, &specs(6), small_buckets()).unwrap();
            fault(comm.rank(), &mut r);
            let result = r.finish();
            // The next step starts clean on every rank.
            for p in (0..6).rev() {
                r.mark_ready(p, &vec![comm.rank() as f32; LENS[p]]).unwrap();
            }
            r.finish().unwrap();
            assert!(
                r.grad(0).unwrap().iter().all(|&v| v == 1.0),
                "(0 + 1 + 2) / 3"
            );
            result
        },
    );
    // Errors are found by the status exchange, not by timeouts.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    results
}

fn mark_all_but(r: &mut Reducer<'_, f32>, skip: Option<usize>) {
    for p in (0..6).rev().filter(|&p| Some(p) != skip) {
        r.mark_ready(p, &vec![1.0; LENS[p]]).unwrap();
    }
}

fn expect_blamed(results: &[Result<(), Error>], culprit: usize, local: &str, param: &str) {
    for (rank, res) in results.iter().enumerate() {
        let err = res.clone().expect_err("the step must fail on every rank");
        let text = err.to_string();
        if rank == culprit {
            assert!(
                matches!(err, Error::InvalidArgument(_)),
                "rank {rank}: {err:?}"
            );
            assert!(text.contains(local), "rank {rank}: {text}");
        } else {
            assert!(
                matches!(err, Error::PeerFailed { rank: r, .. } if r == culprit),
                "rank {rank}: {err:?}"
            );
        }
        assert!(text.contains(param), "rank {rank}: {text}");
    }
}

#[test]
fn marking_twice_fails_on_every_rank_and_names_the_parameter() {
    let results = faulty_step(|rank, r| {
        mark_all_but(r, None);
        if rank == 1 {
            let err = r.mark_ready(2, &vec![1.0; LENS[2]]).unwrap_err();
            assert!(
                err.to_string()
                    .contains("parameter 2 (W2) was marked ready twice"),
                "{err}"
            );
        }
    });
    expect_blamed(&results, 1, "marked ready twice", "W2");
}

#[test]
fn a_parameter_never_marked_fails_on_every_rank_without_hanging() {
    let results = faulty_step(|rank, r| mark_all_but(r, (rank == 2).then_some(1)));
    expect_blamed(&results, 2, "never marked ready", "b1");
}

#[test]
fn a_gradient_of_the_wrong_length_is_refused() {
    let results = faulty_step(|rank, r| {
        if rank == 0 {
            let err = r.mark_ready(3, &[1.0; H + 1]).unwrap_err();
            assert!(
                err.to_string().contains("13 elements, expected 12"),
                "{err}"
            );
        }
        mark_all_but(r, (rank == 0).then_some(3));
    });
    expect_blamed(&results, 0, "elements, expected", "b2");
}

#[test]
fn an_unknown_parameter_index_is_refused() {
    let results = faulty_step(|rank, r| {
        if rank == 2 {
            assert!(r.mark_ready(9, &[1.0]).is_err());
        }
        mark_all_but(r, None);
    });
    expect_blamed(&results, 2, "does not exist", "index 9");
}

#[test]
fn a_rank_that_gives_up_does_not_hang_the_others() {
    let start = Instant::now();
    let results = run_ranks_with(
        3,
        |c| c.timeout = Duration::from_secs(3),
        |comm| -> Result<(), Error> {
            // Set-up itself may already fail on the others if rank 1 is
            // gone before they have finished it.
            let mut r = Reducer::<f32>::new(&comm, &specs(6), small_buckets())?;
            if comm.rank() == 1 {
                // Backward fails half way; the rank returns without finish().
                r.mark_ready(5, &[1.0; D_OUT])?;
                return Ok(());
            }
            // Marks may fail too: a bucket's launch reports the
            // communicator's failure once rank 1 is gone.
            for p in (0..6).rev() {
                r.mark_ready(p, &vec![1.0; LENS[p]])?;
            }
            r.finish()
        },
    );
    for (rank, res) in results.iter().enumerate() {
        if rank != 1 {
            let err = res.clone().expect_err("rank 1 never finished the step");
            assert_eq!(err.failed_rank(), Some(1), "rank {rank}: {err}");
        }
    }
    // Bounded by the communicator timeout (3 s) plus set-up.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn ranks_with_different_parameters_are_refused_at_construction() {
    let results = run_ranks(2, |comm| {
        let n = if comm.rank() == 0 { 6 } else { 5 };
        Reducer::<f32>::new(&comm, &specs(n), ReducerConfig::default()).map(|_| ())
    });
    for (rank, res) in results.into_iter().enumerate() {
        let err = res.expect_err("different models must be refused");
        assert!(err.to_string().contains("ranks [1]"), "rank {rank}: {err}");
    }
}

// ---------------------------------------------------------------------------
// The examples, as processes under ferroccl-run.
// ---------------------------------------------------------------------------

/// Path of example `name` built with this test's profile, building it (with
/// `features`) if it is not there yet.
fn example(name: &str, features: &[&str]) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let profile_dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>");
    let path = profile_dir.join("examples").join(name);
    if !path.exists() {
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.args(["build", "--example", name]);
        if profile_dir.ends_with("release") {
            cmd.arg("--release");
        }
        if !features.is_empty() {
            cmd.args(["--features", &features.join(",")]);
        }
        let status = cmd.status().expect("cannot run cargo");
        assert!(status.success(), "building example {name} failed");
    }
    path
}

/// Run `ferroccl-run -n ranks -- exe args` and return rank 0's summary line
/// as key=value pairs.
fn run_example(
    ranks: usize,
    exe: &std::path::Path,
    args: &[&str],
) -> std::collections::HashMap<String, String> {
    let out = std::process::Command::new(common::process::ferroccl_run())
        .args(["-n", &ranks.to_string(), "--"])
        .arg(exe)
        .args(args)
        .env("FERROCCL_CALIBRATE", "0")
        .env_remove("FERROCCL_TOKEN")
        // `mem` (thread ranks only) would leave processes unable to connect;
        // and a short timeout bounds the run if anything else goes wrong.
        .env_remove("FERROCCL_TRANSPORT")
        .env("FERROCCL_TIMEOUT", "30")
        .output()
        .expect("cannot run ferroccl-run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("checksum="))
        .unwrap_or_else(|| panic!("no summary in {stdout}"));
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The weights of the example's f32 model after training on 2 and 3 ranks
/// match one process on the whole batch. The checksum weighs every weight
/// by 1..7; f32 reassociation in the sums over samples and ranks moves it
/// by far less than 1e-4 relative, while one missing bucket or a missing
/// division moves it in the first digits.
#[test]
fn the_mlp_example_trains_the_same_model_on_1_2_and_3_ranks() {
    let exe = example("mlp_ddp", &[]);
    let args = [
        "--steps",
        "4",
        "--warmup",
        "0",
        "--batch",
        "12",
        "--in",
        "24",
        "--hidden",
        "48",
        "--layers",
        "3",
        "--lr",
        "0.1",
        "--bucket-mb",
        "0.01",
        "--first-bucket-mb",
        "0.002",
    ];
    let one = run_example(1, &exe, &args);
    let want: f64 = one["checksum"].parse().unwrap();
    let init = run_example(
        1,
        &exe,
        &[
            "--steps", "0", "--warmup", "0", "--in", "24", "--hidden", "48", "--layers", "3",
        ],
    );
    let start: f64 = init["checksum"].parse().unwrap();
    assert!(
        (want - start).abs() > 1e-2 * want.abs().max(1.0),
        "training must move the weights"
    );
    for ranks in [2, 3] {
        let got = run_example(ranks, &exe, &args);
        let g: f64 = got["checksum"].parse().unwrap();
        assert!(
            (g - want).abs() <= 1e-4 * want.abs().max(1.0),
            "{ranks} ranks: checksum {g}, one process {want}"
        );
        assert!(got["buckets"].parse::<usize>().unwrap() > 1, "{got:?}");
    }
}

/// The same for the Candle example (feature `candle`).
#[cfg(feature = "candle")]
#[test]
fn the_candle_example_trains_the_same_model_on_1_and_2_ranks() {
    let exe = example("candle_ddp", &["candle"]);
    let args = ["--steps", "20"];
    let want: f64 = run_example(1, &exe, &args)["checksum"].parse().unwrap();
    let got: f64 = run_example(2, &exe, &args)["checksum"].parse().unwrap();
    assert!(
        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
        "2 ranks: {got}, one process {want}"
    );
}

/// A hook that refuses to launch on one rank.
struct FailsOnRank(usize);

impl CommHook<f32> for FailsOnRank {
    fn launch(
        &self,
        comm: &Communicator,
        bucket: Bucket<f32>,
    ) -> ferroccl::Result<PendingBucket<f32>> {
        if comm.rank() == self.0 {
            return Err(Error::InvalidArgument("hook refused".into()));
        }
        Ok(PendingBucket::from_work(
            comm.all_reduce_async(bucket, ReduceOp::Avg)?,
        ))
    }
    fn name(&self) -> &str {
        "fails_on_rank"
    }
}

#[test]
fn a_hook_failing_on_one_rank_fails_the_step_everywhere_within_the_timeout() {
    let start = Instant::now();
    let results = run_ranks_with(
        3,
        |c| c.timeout = Duration::from_secs(2),
        |comm| -> Result<(), Error> {
            let mut r = Reducer::with_hook(&comm, &specs(6), small_buckets(), FailsOnRank(1))?;
            let mut first_err = None;
            for p in (0..6).rev() {
                if let Err(e) = r.mark_ready(p, &vec![1.0; LENS[p]]) {
                    first_err.get_or_insert(e);
                }
            }
            let finished = r.finish();
            match first_err {
                Some(e) => Err(e),
                None => finished,
            }
        },
    );
    let err = results[1].clone().expect_err("rank 1's hook failed");
    assert!(err.to_string().contains("hook refused"), "{err}");
    for rank in [0, 2] {
        assert!(
            results[rank].is_err(),
            "rank {rank} must not report success"
        );
    }
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}
