//! Bucket layout and streaming: rebuilt layouts agree across ranks, and
//! buckets (or their ready prefixes) launch before backward ends.

use crate::model::{small_buckets, specs, D_IN, D_OUT, H, LENS};
use ferroccl::ddp::{Reducer, ReducerConfig};
use ferroccl::testing::run_ranks;

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
