//! Tests of user algorithms: the examples and the torus pass the checker,
//! broken algorithms are refused with the rank and step named.

use super::examples::halving_doubling;
use super::*;
use crate::algo::Step;

/// The torus shipped as text (examples/algorithms/torus.algo, 1..16
/// ranks; tests/user_algorithms.rs checks 1..64 from the script).
const TORUS: &str = include_str!("../../../examples/algorithms/torus.algo");

#[test]
fn halving_doubling_is_checked_for_every_power_of_two_to_64() {
    let algo = halving_doubling(64);
    assert_eq!(algo.sizes().collect::<Vec<_>>(), [1, 2, 4, 8, 16, 32, 64]);
    let verdict = algo.check().unwrap();
    assert!(verdict.in_place);
}

/// The cheap matching check reaches 4,096 ranks (docs/algorithms.md
/// gives its time), the value check 256.
#[test]
fn halving_doubling_matches_up_to_4096_ranks() {
    let algo = halving_doubling(4096);
    for n in [128, 256, 1024, 4096] {
        algo.check_matching(n).unwrap();
    }
    algo.check_values(256).unwrap();
}

/// Each rank sends `2 (n - 1) / n` of the buffer in `2 log2 n`
/// messages: counted on the schedule, against the formula.
#[test]
fn halving_doubling_moves_what_the_ring_moves() {
    let algo = halving_doubling(64);
    for n in [2usize, 4, 8, 64] {
        let count = 64 * 1000;
        for r in 0..n {
            let s = algo.schedule(n, r, count, usize::MAX).unwrap();
            let sends: Vec<&Step> = s.steps.iter().filter(|s| s.prim.sends()).collect();
            assert_eq!(sends.len(), 2 * n.trailing_zeros() as usize);
            let sent: usize = sends.iter().map(|s| s.len).sum();
            assert_eq!(sent, 2 * (n - 1) * count / n, "n {n} rank {r}");
        }
    }
}

#[test]
fn halving_doubling_refuses_other_rank_counts() {
    let err = halving_doubling(64).for_size(6).unwrap_err();
    assert!(err.to_string().contains("no schedule for 6 ranks"), "{err}");
    assert!(err.to_string().contains("1, 2, 4, 8, 16, 32, 64"), "{err}");
}

#[test]
fn the_shipped_torus_text_is_checked_for_1_to_16_ranks() {
    let algo = super::super::text::parse(TORUS).unwrap();
    assert_eq!(algo.name, "torus");
    assert_eq!(
        algo.sizes().collect::<Vec<_>>(),
        (1..=16).collect::<Vec<_>>()
    );
    algo.check().unwrap();
}

/// Text written from the builder parses back to the same steps.
#[test]
fn text_round_trips_the_builder() {
    let algo = halving_doubling(16);
    let text = super::super::text::write(&algo);
    let back = super::super::text::parse(&text).unwrap();
    assert_eq!(back.name, algo.name);
    assert_same_steps(&back, &algo);
}

/// `back` has `algo`'s steps on every rank of every count it claims
/// (but for the text lines `back` came from).
fn assert_same_steps(back: &UserAlgorithm, algo: &UserAlgorithm) {
    let strip = |s: &[UserStep]| {
        s.iter()
            .map(|s| UserStep { line: None, ..*s })
            .collect::<Vec<_>>()
    };
    for n in algo.sizes() {
        for r in 0..n {
            assert_eq!(
                strip(back.steps(n, r).unwrap()),
                strip(algo.steps(n, r).unwrap())
            );
        }
    }
}

/// `halving_doubling(8)` with `edit` applied to rank `rank`'s steps.
fn planted(rank: usize, edit: impl Fn(&mut Vec<UserStep>)) -> UserAlgorithm {
    let good = halving_doubling(8).for_size(8).unwrap();
    let mut ranks: Vec<Vec<UserStep>> =
        (0..8).map(|r| good.steps(8, r).unwrap().to_vec()).collect();
    edit(&mut ranks[rank]);
    let mut bad = UserAlgorithm::new("planted", Collective::AllReduce);
    bad.set_size(8, ranks);
    bad
}

#[test]
fn a_missing_receive_is_refused_naming_the_sender_and_its_step() {
    // Rank 5's steps: 0 send, 1 recv_reduce_copy (from 1), ...; drop
    // the receive: rank 1's send to 5 at its step 0 is never taken.
    let bad = planted(5, |s| {
        s.remove(1);
    });
    let err = bad.check().unwrap_err();
    assert_eq!(err.size, Some(8));
    assert!(err.rank.is_some() && err.step.is_some(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("deadlock") || text.contains("never received") || text.contains("names"),
        "{text}"
    );
    // Wherever it shows first, the error names rank 5 or its partner 1.
    assert!(matches!(err.rank, Some(1) | Some(5)), "{text}");
}

#[test]
fn a_wrong_reduction_is_refused_naming_the_rank_and_step() {
    // Rank 2's last halving round (step 5) receives without
    // combining (recv): its chunk 2 loses rank 2's share of it.
    let bad = planted(2, |s| {
        assert_eq!(s[5].prim, Prim::RecvReduceCopy);
        s[5].prim = Prim::Recv;
        s[5].local = Operand::Input;
    });
    bad.check_matching(8).unwrap();
    let err = bad.check().unwrap_err();
    assert_eq!((err.rank, err.step), (Some(2), Some(5)), "{err}");
    assert!(
        err.to_string().contains("sum of every rank's input"),
        "{err}"
    );
}

#[test]
fn a_wrong_peer_is_refused_naming_the_rank_and_step() {
    // Rank 3 sends its first half to 4 instead of its partner 7.
    let bad = planted(3, |s| {
        assert_eq!(s[0].to, Some(7));
        s[0].to = Some(4);
    });
    let err = bad.check().unwrap_err();
    assert!(err.rank.is_some() && err.step.is_some(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("deadlock") || text.contains("never received") || text.contains("names"),
        "{text}"
    );
}

#[test]
fn a_wrong_place_is_refused_with_the_values() {
    // Rank 0's gather receives into chunk 2 where the partner sends
    // chunk 1: lengths agree at most counts, values do not.
    let bad = planted(0, |s| {
        let last = s.len() - 5;
        assert_eq!(s[last].prim, Prim::Recv);
        s[last].chunks = Chunks::one(2, 8);
    });
    let err = bad.check().unwrap_err();
    assert!(err.rank.is_some(), "{err}");
}

#[test]
fn malformed_steps_are_refused_with_their_place() {
    let cases: Vec<(UserStep, &str)> = vec![
        (
            UserStep {
                prim: Prim::Send,
                local: Operand::Input,
                from: None,
                to: Some(9),
                chunks: Chunks::one(0, 1),
                line: Some(7),
            },
            "not a rank",
        ),
        (
            UserStep {
                prim: Prim::Recv,
                local: Operand::Input,
                from: Some(0),
                to: None,
                chunks: Chunks::one(0, 1),
                line: None,
            },
            "rank itself",
        ),
        (
            UserStep {
                prim: Prim::Copy,
                local: Operand::Output,
                from: None,
                to: None,
                chunks: Chunks::one(0, 1),
                line: None,
            },
            "input only",
        ),
        (
            UserStep {
                prim: Prim::Send,
                local: Operand::Input,
                from: None,
                to: Some(1),
                chunks: Chunks::range(3, 9, 8),
                line: None,
            },
            "past the last chunk",
        ),
    ];
    for (step, says) in cases {
        let mut algo = UserAlgorithm::new("bad", Collective::AllReduce);
        algo.set_size(2, vec![vec![step], Vec::new()]);
        let err = algo.check().unwrap_err();
        assert_eq!((err.rank, err.step), (Some(0), Some(0)), "{err}");
        assert_eq!(err.line, step.line);
        assert!(err.to_string().contains(says), "{err} lacks {says}");
    }
}

/// The schedules of both examples encode for the device executor and
/// decode to the same steps (they use only primitives it knows).
#[test]
fn user_schedules_encode_for_the_device() {
    for algo in [
        halving_doubling(8),
        super::super::text::parse(TORUS).unwrap(),
    ] {
        assert_encodes_for_the_device(&algo);
    }
}

/// Every rank's schedule of `algo` on 2, 4, 6 and 8 ranks (those it
/// claims) encodes for the device executor and decodes to itself.
fn assert_encodes_for_the_device(algo: &UserAlgorithm) {
    use super::super::encode::{decode, encode, Layout, ProgramMeta};
    for n in [2usize, 4, 6, 8]
        .into_iter()
        .filter(|n| algo.steps(*n, 0).is_some())
    {
        for r in 0..n {
            let schedule = algo.schedule(n, r, 1000, 100).unwrap();
            let meta = ProgramMeta {
                rank: r,
                ranks: n,
                dtype: crate::DataType::F32,
                op: Some(crate::ReduceOp::Sum),
                layout: Layout::Separate,
                finish: None,
            };
            let image = encode(&schedule, &meta)
                .unwrap_or_else(|e| panic!("{} n {n} rank {r}: {e}", algo.name));
            assert_eq!(decode(&image).unwrap().schedule(), schedule);
        }
    }
}

/// The schedules a communicator runs, built at a slot-sized slice,
/// through the crate's simulator with FIFOs of 2 and 8 slots: the
/// checked algorithm stays right when sliced finer than the checker did.
#[test]
fn sliced_schedules_stay_right() {
    let algos = [
        halving_doubling(16),
        super::super::text::parse(TORUS).unwrap(),
    ];
    for algo in &algos {
        for n in algo.sizes().filter(|n| *n <= 16) {
            for (count, slice) in [(1000, 7), (37, 1), (16 * 5 + 3, 4)] {
                for cap in [2, 8] {
                    let schedules: Vec<Schedule> = (0..n)
                        .map(|r| algo.schedule(n, r, count, slice).unwrap())
                        .collect();
                    let inputs: Vec<Vec<f64>> = (0..n)
                        .map(|r| (0..count).map(|i| (r * 1000 + i) as f64).collect())
                        .collect();
                    let mut out = vec![vec![0.0; count]; n];
                    super::super::sim::run(&schedules, &inputs, &mut out, false, cap)
                        .unwrap_or_else(|e| panic!("{} n {n}: {e}", algo.name));
                    for (r, o) in out.iter().enumerate() {
                        for (i, v) in o.iter().enumerate() {
                            let want: usize = (0..n).map(|q| q * 1000 + i).sum();
                            assert_eq!(*v, want as f64, "{} n {n} rank {r} i {i}", algo.name);
                        }
                    }
                }
            }
        }
    }
}

// Allgather and reduce-scatter.

use super::examples::{pairwise_reduce_scatter, recursive_doubling_allgather};

/// Bruck's allgather shipped as text (examples/algorithms/bruck.algo,
/// 1..16 ranks; tests/user_algorithms.rs checks 1..64 from the script).
const BRUCK: &str = include_str!("../../../examples/algorithms/bruck.algo");

fn bruck() -> UserAlgorithm {
    super::super::text::parse(BRUCK).unwrap()
}

#[test]
fn the_allgather_and_reduce_scatter_examples_are_checked_to_64_ranks() {
    let rd = recursive_doubling_allgather(64);
    assert_eq!(rd.collective, Collective::AllGather);
    assert_eq!(rd.sizes().collect::<Vec<_>>(), [1, 2, 4, 8, 16, 32, 64]);
    assert!(rd.check().unwrap().in_place);
    let rs = pairwise_reduce_scatter(64);
    assert_eq!(rs.collective, Collective::ReduceScatter);
    assert_eq!(rs.sizes().count(), 64);
    assert!(rs.check().unwrap().in_place);
    let b = bruck();
    assert_eq!(
        (b.name.as_str(), b.collective),
        ("bruck_allgather", Collective::AllGather)
    );
    assert_eq!(b.sizes().collect::<Vec<_>>(), (1..=16).collect::<Vec<_>>());
    assert!(b.check().unwrap().in_place);
}

/// Matching at sampled rank counts up to 4,096 (pairwise, whose
/// `n * (n - 1)` frames make 4,096 ranks cost minutes, to 1,024);
/// values at 256 and 100.
#[test]
fn the_allgather_and_reduce_scatter_examples_match_up_to_4096_ranks() {
    let rd = recursive_doubling_allgather(4096);
    for n in [128, 1024, 4096] {
        rd.check_matching(n).unwrap();
    }
    rd.check_values(256).unwrap();
    let mut rs = UserAlgorithm::new("pairwise", Collective::ReduceScatter);
    for n in [100, 257, 1024] {
        rs.add_size(n, examples::pairwise_reduce_scatter_rank);
        rs.check_matching(n).unwrap();
    }
    rs.check_values(100).unwrap();
}

/// Each rank sends `(n - 1) * count` elements (the ring's), in `log2 n`
/// messages for recursive doubling and `n - 1` for pairwise, counted
/// on the schedules against the formula.
#[test]
fn the_examples_move_what_the_ring_moves() {
    let (rd, rs) = (
        recursive_doubling_allgather(64),
        pairwise_reduce_scatter(64),
    );
    for n in [2usize, 4, 8, 64] {
        let count = 1000;
        for r in 0..n {
            for (algo, messages) in [(&rd, n.trailing_zeros() as usize), (&rs, n - 1)] {
                let s = algo.schedule(n, r, count, usize::MAX).unwrap();
                let sends: Vec<&Step> = s.steps.iter().filter(|s| s.prim.sends()).collect();
                assert_eq!(sends.len(), messages, "{} n {n} rank {r}", algo.name);
                let sent: usize = sends.iter().map(|s| s.len).sum();
                assert_eq!(sent, (n - 1) * count, "{} n {n} rank {r}", algo.name);
            }
        }
    }
}

/// The schedules a communicator runs, at slices that cut every block
/// into several passes (so that a range over several blocks runs as
/// one step a block), through the crate's simulator with FIFOs of 2
/// and 8 slots, out of place and in place at the block the executor
/// puts the input (allgather) or output (reduce-scatter), against the
/// definition.
#[test]
fn sliced_allgather_and_reduce_scatter_schedules_stay_right() {
    let algos = [
        recursive_doubling_allgather(16),
        bruck(),
        pairwise_reduce_scatter(16),
    ];
    let value = |r: usize, i: usize| (r * 100_000 + i) as f64;
    for algo in &algos {
        let gather = algo.collective == Collective::AllGather;
        for n in algo.sizes().filter(|n| *n <= 16) {
            for (count, slice) in [(1000, 7), (37, 1), (16 * 5 + 3, 4), (5, 1000)] {
                let schedules: Vec<Schedule> = (0..n)
                    .map(|r| algo.schedule(n, r, count, slice).unwrap())
                    .collect();
                for s in schedules.iter().flat_map(|s| &s.steps) {
                    assert!(s.len <= slice, "{} n {n}: a frame of {}", algo.name, s.len);
                }
                let (in_len, out_len) = algo.collective.extents(count, n);
                let inputs: Vec<Vec<f64>> = (0..n)
                    .map(|r| (0..in_len).map(|i| value(r, i)).collect())
                    .collect();
                let want = |r: usize, j: usize| -> f64 {
                    if gather {
                        value(j / count, j % count)
                    } else {
                        (0..n).map(|q| value(q, r * count + j)).sum()
                    }
                };
                for cap in [2, 8] {
                    let mut out = vec![vec![f64::NAN; out_len]; n];
                    super::super::sim::run(&schedules, &inputs, &mut out, false, cap)
                        .unwrap_or_else(|e| panic!("{} n {n}: {e}", algo.name));
                    // In place: the executor's bases, added to the
                    // offsets, over one buffer of n * count.
                    let based: Vec<Schedule> = (0..n)
                        .map(|r| {
                            let mut s = schedules[r].clone();
                            for st in &mut s.steps {
                                if gather {
                                    st.input += r * count;
                                } else {
                                    st.output += r * count;
                                }
                            }
                            s
                        })
                        .collect();
                    let mut whole: Vec<Vec<f64>> = (0..n)
                        .map(|r| {
                            if gather {
                                let mut b = vec![f64::NAN; n * count];
                                b[r * count..(r + 1) * count].copy_from_slice(&inputs[r]);
                                b
                            } else {
                                inputs[r].clone()
                            }
                        })
                        .collect();
                    super::super::sim::run(&based, &inputs, &mut whole, true, cap)
                        .unwrap_or_else(|e| panic!("{} n {n} in place: {e}", algo.name));
                    for (r, got) in out.iter().enumerate() {
                        for (j, v) in got.iter().enumerate() {
                            let at = if gather { j } else { r * count + j };
                            assert_eq!(*v, want(r, j), "{} n {n} r {r} j {j}", algo.name);
                            assert_eq!(whole[r][at], want(r, j), "{} in place", algo.name);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn allgather_and_reduce_scatter_text_round_trips() {
    for algo in [recursive_doubling_allgather(8), pairwise_reduce_scatter(5)] {
        let text = super::super::text::write(&algo);
        assert!(text.contains(&format!("collective {}", algo.collective)));
        let back = super::super::text::parse(&text).unwrap();
        assert_eq!(back.collective, algo.collective);
        assert_same_steps(&back, &algo);
    }
}

/// `algo` on `n` ranks with `edit` applied to rank `rank`'s steps.
fn planted_in(
    algo: &UserAlgorithm,
    n: usize,
    rank: usize,
    edit: impl Fn(&mut Vec<UserStep>),
) -> UserAlgorithm {
    let mut ranks: Vec<Vec<UserStep>> =
        (0..n).map(|r| algo.steps(n, r).unwrap().to_vec()).collect();
    edit(&mut ranks[rank]);
    let mut bad = UserAlgorithm::new("planted", algo.collective);
    bad.set_size(n, ranks);
    bad
}

#[test]
fn an_allgather_reading_the_input_outside_its_block_is_refused_with_the_line() {
    // Bruck on 4 ranks, rank 2: copy, send chunk 2 (using output),
    // recv chunk 3, send chunks 2..4 (using output): drop 'using
    // output' from the last send: it would read input blocks 2 and 3.
    let bad = planted_in(&bruck(), 4, 2, |s| {
        assert_eq!(
            (s[3].prim, s[3].chunks),
            (Prim::Send, Chunks::range(2, 4, 4))
        );
        s[3].local = Operand::Input;
    });
    let err = bad.check().unwrap_err();
    assert_eq!(
        (err.size, err.rank, err.step),
        (Some(4), Some(2), Some(3)),
        "{err}"
    );
    assert!(err.line.is_some(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("outside rank 2's own block (chunk 2 of 4)"),
        "{text}"
    );
    assert!(text.starts_with("line "), "{text}");
}

#[test]
fn a_reduce_scatter_writing_outside_its_block_is_refused() {
    // Pairwise on 4 ranks, rank 1's first receive (step 2) into
    // chunk 2 instead of its own chunk 1.
    let bad = planted_in(&pairwise_reduce_scatter(4), 4, 1, |s| {
        assert_eq!(s[2].prim, Prim::RecvReduceCopy);
        s[2].chunks = Chunks::one(2, 4);
    });
    let err = bad.check().unwrap_err();
    assert_eq!((err.rank, err.step), (Some(1), Some(2)), "{err}");
    assert!(
        err.to_string()
            .contains("writes the output at chunk 2 of 4 outside rank 1's own block"),
        "{err}"
    );
}

#[test]
fn a_cut_uneven_over_the_blocks_is_refused() {
    let mut algo = UserAlgorithm::new("uneven", Collective::AllGather);
    algo.set_size(
        2,
        vec![
            vec![UserStep {
                prim: Prim::Copy,
                local: Operand::Input,
                from: None,
                to: None,
                chunks: Chunks::one(0, 3),
                line: Some(9),
            }],
            Vec::new(),
        ],
    );
    let err = algo.check().unwrap_err();
    assert_eq!((err.rank, err.step, err.line), (Some(0), Some(0), Some(9)));
    assert!(err.to_string().contains("multiple of the 2 ranks"), "{err}");
}

#[test]
fn a_wrong_reduction_in_a_reduce_scatter_is_refused_naming_the_rank_and_step() {
    // Rank 3's last receive (step 8 of 4 + 2 * 3 - ... : the last)
    // stores without combining: block 3 loses its partial sum.
    let bad = planted_in(&pairwise_reduce_scatter(5), 5, 3, |s| {
        let last = s.len() - 1;
        assert_eq!(s[last].prim, Prim::RecvReduceCopy);
        s[last].prim = Prim::Recv;
        s[last].local = Operand::Input;
    });
    bad.check_matching(5).unwrap();
    let err = bad.check().unwrap_err();
    assert_eq!((err.rank, err.step), (Some(3), Some(8)), "{err}");
    assert!(
        err.to_string()
            .contains("the sum of every rank's input element"),
        "{err}"
    );
}

#[test]
fn a_missing_or_misplaced_allgather_receive_is_refused() {
    let rd = recursive_doubling_allgather(8);
    // Rank 6 drops its last receive (from 2, blocks 0..4).
    let bad = planted_in(&rd, 8, 6, |s| {
        s.pop();
    });
    let err = bad.check().unwrap_err();
    assert!(matches!(err.rank, Some(2) | Some(6)), "{err}");
    assert!(err.step.is_some(), "{err}");
    // Rank 5 receives its second frame (blocks 6..8) into 4..6.
    let bad = planted_in(&rd, 8, 5, |s| {
        assert_eq!(s[3].chunks, Chunks::range(6, 8, 8));
        s[3].chunks = Chunks::range(2, 4, 8);
    });
    let err = bad.check().unwrap_err();
    assert_eq!((err.rank, err.step), (Some(5), Some(3)), "{err}");
    assert!(err.to_string().contains("names the same chunks"), "{err}");
    // Rank 1 forgets to copy its own block: its block stays garbage,
    // and so does what it forwards of it in round 2 (rank 3's
    // receive of blocks 0..2, step 3, the first to finish it).
    let bad = planted_in(&rd, 8, 1, |s| {
        assert_eq!(s[0].prim, Prim::CopySend);
        s[0].prim = Prim::Send;
    });
    let err = bad.check().unwrap_err();
    assert_eq!((err.rank, err.step), (Some(3), Some(3)), "{err}");
    assert!(err.to_string().contains("rank 1's input element"), "{err}");
}

/// A reduce-scatter right out of place and wrong in place (it reads
/// its own input block again after writing its result there): the
/// verdict says so.
#[test]
fn a_reduce_scatter_wrong_in_place_is_found() {
    let algo = UserAlgorithm::build("twice", Collective::ReduceScatter, [2], |b| {
        let (r, p) = (b.rank(), 1 - b.rank());
        b.send(p, Chunks::one(p, 2)).send(p, Chunks::one(p, 2));
        b.recv_reduce_copy(p, Chunks::one(r, 2));
        b.recv_reduce_copy(p, Chunks::one(r, 2));
    });
    assert!(!algo.check().unwrap().in_place);
    assert!(pairwise_reduce_scatter(2).check().unwrap().in_place);
}

#[test]
fn allgather_and_reduce_scatter_schedules_encode_for_the_device() {
    for algo in [
        recursive_doubling_allgather(8),
        bruck(),
        pairwise_reduce_scatter(8),
    ] {
        assert_encodes_for_the_device(&algo);
    }
}
