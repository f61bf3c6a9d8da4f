//! Equivalence: N ranks training through the reducer end with the weights
//! of one process on the whole batch, for every bucket layout, element
//! type, hook and way of dealing with unused parameters.

use crate::model::{
    check_equivalence, no_rebuild, plain, small_buckets, Run, Unused, U_BF16, U_F16, U_F32, U_F64,
};
use ferroccl::ddp::{
    Bf16CompressHook, Bucket, CommHook, Fp16CompressHook, ParamSpec, PendingBucket, Reducer,
    ReducerConfig,
};
use ferroccl::testing::run_ranks;
use ferroccl::{Communicator, Element, ReduceOp};
use half::{bf16, f16};

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
