//! A deterministic simulator for schedules: every rank's schedule runs over
//! bounded FIFOs of f64 frames (one per sender, receiver and channel, as the
//! executor's connections), one step at a time, round robin. It checks
//! tags and lengths, detects deadlock (no rank can move) and returns the
//! output buffers, so a schedule is tested with no threads and no I/O.

use super::{Operand, Prim, Schedule, Step};
use std::collections::{HashMap, VecDeque};

/// Run `schedules` (one per rank). `inputs[r]` is rank r's input; when
/// `in_place`, the input is read from the output buffer instead, which must
/// then hold the input already. `cap` bounds each FIFO, as slots do.
/// Combining is f64 addition.
pub(crate) fn run(
    schedules: &[Schedule],
    inputs: &[Vec<f64>],
    outputs: &mut [Vec<f64>],
    in_place: bool,
    cap: usize,
) -> Result<(), String> {
    run_with(schedules, inputs, outputs, in_place, cap, |a, b| a + b)
}

#[cfg(test)]
/// f32 addition, rounding every combine: results then depend on the order
/// of the combines, which lets a test check that ranks agree bit for bit.
pub(crate) fn add_f32(acc: f64, x: f64) -> f64 {
    f64::from(acc as f32 + x as f32)
}

/// [`run`] with `combine(partial, contribution)` as the reduction.
pub(crate) fn run_with(
    schedules: &[Schedule],
    inputs: &[Vec<f64>],
    outputs: &mut [Vec<f64>],
    in_place: bool,
    cap: usize,
    combine: fn(f64, f64) -> f64,
) -> Result<(), String> {
    drive(schedules, cap, |r, pc, step, received: Option<Vec<f64>>| {
        if let Some(data) = &received {
            if data.len() != step.len {
                return Err(format!(
                    "rank {r} step {pc} expected {} elements, got {}",
                    step.len,
                    data.len()
                ));
            }
        }
        let input: Vec<f64> = {
            let (src, at) = match step.local {
                Operand::Input if !in_place => (&inputs[r], step.input),
                Operand::Input => (&outputs[r], step.input),
                Operand::Output => (&outputs[r], step.output),
            };
            if step.prim == Prim::Recv || step.prim == Prim::RecvCopySend {
                Vec::new()
            } else {
                src.get(at..at + step.len)
                    .ok_or_else(|| format!("rank {r} step {pc} reads past its operand"))?
                    .to_vec()
            }
        };
        let value: Vec<f64> = match (received, step.prim.reduces()) {
            _ if step.prim == Prim::Reduce => {
                let acc = outputs[r]
                    .get(step.output..step.output + step.len)
                    .ok_or_else(|| format!("rank {r} step {pc} reads past output"))?;
                acc.iter()
                    .zip(&input)
                    .map(|(a, b)| combine(*a, *b))
                    .collect()
            }
            // A partial result kept in the output is the left operand,
            // as the executor's `reduce_into(output, data)` has it.
            (Some(data), true) if step.local == Operand::Output => input
                .iter()
                .zip(&data)
                .map(|(a, b)| combine(*a, *b))
                .collect(),
            (Some(data), true) => data
                .iter()
                .zip(&input)
                .map(|(a, b)| combine(*a, *b))
                .collect(),
            (Some(data), false) => data,
            (None, _) => input,
        };
        if step.prim.writes_output() {
            let dst = outputs[r]
                .get_mut(step.output..step.output + step.len)
                .ok_or_else(|| format!("rank {r} step {pc} writes past output"))?;
            dst.copy_from_slice(&value);
        }
        Ok(value)
    })
}

/// The rhythm both simulations share: every rank's schedule runs over
/// bounded FIFOs of `cap` frames (one per sender, receiver and channel, as
/// the executor's connections), one step at a time, round robin. A step
/// runs once its FIFO out has room and its frame in (tag checked) has
/// come; `visit(rank, step index, step, payload received)` does its work
/// and returns the payload it sends (dropped when it sends nothing). Ends
/// with an error on a deadlock (no rank can move) or on frames never
/// received.
fn drive<P>(
    schedules: &[Schedule],
    cap: usize,
    mut visit: impl FnMut(usize, usize, &Step, Option<P>) -> Result<P, String>,
) -> Result<(), String> {
    let n = schedules.len();
    let mut fifo: HashMap<(usize, usize, usize), VecDeque<(u32, P)>> = HashMap::new();
    let mut pc = vec![0usize; n];
    loop {
        let mut moved = false;
        for r in 0..n {
            let Some(step) = schedules[r].steps.get(pc[r]).copied() else {
                continue;
            };
            if step.prim.sends()
                && fifo
                    .get(&(r, step.send_to, step.channel))
                    .map_or(0, VecDeque::len)
                    >= cap
            {
                continue;
            }
            let received = if step.prim.receives() {
                let q = fifo.entry((step.recv_from, r, step.channel)).or_default();
                let Some((tag, payload)) = q.pop_front() else {
                    continue;
                };
                if tag != step.recv_tag {
                    return Err(format!(
                        "rank {r} step {} expected tag {} from {}, got {tag}",
                        pc[r], step.recv_tag, step.recv_from
                    ));
                }
                Some(payload)
            } else {
                None
            };
            let sent = visit(r, pc[r], &step, received)?;
            if step.prim.sends() {
                fifo.entry((r, step.send_to, step.channel))
                    .or_default()
                    .push_back((step.send_tag, sent));
            }
            pc[r] += 1;
            moved = true;
        }
        if (0..n).all(|r| pc[r] == schedules[r].steps.len()) {
            let left: usize = fifo.values().map(VecDeque::len).sum();
            return if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} frames never received"))
            };
        }
        if !moved {
            return Err(format!("deadlock: program counters {pc:?}"));
        }
    }
}

/// What each rank knows at the end of `schedules` (one per rank) about
/// the others' calls, as the executor's checks give it: a rank that
/// accepts a frame from `s` knows that `s` runs its call (the frame's
/// fingerprint is its own), and learns everything `s` knew when it sent
/// the frame (a rank checks a frame before it sends anything after it).
/// `Ok(informed)`: `informed[r]` when what rank r knows links every rank
/// to it, so that a mismatch anywhere would have failed its call. Frames
/// run over bounded FIFOs of `cap`, as in [`run`]; tags are checked.
#[cfg(test)]
pub(crate) fn knowledge(schedules: &[Schedule], cap: usize) -> Result<Vec<bool>, String> {
    let n = schedules.len();
    // Known "same call" pairs, as an n x n adjacency bit set per rank.
    let words = (n * n).div_ceil(64);
    type Known = Vec<u64>;
    let set = |k: &mut Known, a: usize, b: usize| {
        for (x, y) in [(a, b), (b, a)] {
            k[(x * n + y) / 64] |= 1 << ((x * n + y) % 64);
        }
    };
    let mut known: Vec<Known> = vec![vec![0; words]; n];
    drive(schedules, cap, |r, _, step, received: Option<Known>| {
        if let Some(theirs) = received {
            for (mine, t) in known[r].iter_mut().zip(&theirs) {
                *mine |= t;
            }
            set(&mut known[r], step.recv_from, r);
        }
        Ok(known[r].clone())
    })?;
    // Rank r is informed when its known pairs connect every rank to r.
    Ok((0..n)
        .map(|r| {
            let k = &known[r];
            let edge = |a: usize, b: usize| k[(a * n + b) / 64] >> ((a * n + b) % 64) & 1 == 1;
            let mut seen = vec![false; n];
            let mut stack = vec![r];
            seen[r] = true;
            while let Some(a) = stack.pop() {
                for (b, seen_b) in seen.iter_mut().enumerate() {
                    if !*seen_b && edge(a, b) {
                        *seen_b = true;
                        stack.push(b);
                    }
                }
            }
            seen.into_iter().all(|x| x)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::ring::{self, RingParams};
    use super::super::{direct, tree};
    use super::*;

    fn value(rank: usize, i: usize) -> f64 {
        (rank * 1000 + i) as f64
    }

    /// Every rank's `len` input elements, `value(rank, i)`.
    fn rank_inputs(n: usize, len: usize) -> Vec<Vec<f64>> {
        (0..n)
            .map(|r| (0..len).map(|i| value(r, i)).collect())
            .collect()
    }

    /// Every rank's output of `count` elements: in place its input, else
    /// NaN (so that an element no step wrote shows).
    fn outputs_for(inputs: &[Vec<f64>], count: usize, in_place: bool) -> Vec<Vec<f64>> {
        if in_place {
            inputs.to_vec()
        } else {
            vec![vec![f64::NAN; count]; inputs.len()]
        }
    }

    fn params(rank: usize, size: usize, slice: usize) -> RingParams {
        deep(rank, size, slice, 1)
    }

    /// Ring passes `depth` slices deep.
    fn deep(rank: usize, size: usize, slice: usize, depth: usize) -> RingParams {
        RingParams {
            rank,
            size,
            slice,
            depth,
        }
    }

    /// Ring allreduce of `count` elements on `n` ranks, `depth` slices
    /// deep over FIFOs of `cap` frames, out of place and in place: every
    /// output against the f64 sum.
    fn check_ring_all_reduce(n: usize, count: usize, slice: usize, depth: usize, cap: usize) {
        let sched: Vec<_> = (0..n)
            .map(|r| ring::all_reduce(deep(r, n, slice, depth), count))
            .collect();
        let inputs = rank_inputs(n, count);
        for in_place in [false, true] {
            let mut outputs = outputs_for(&inputs, count, in_place);
            run(&sched, &inputs, &mut outputs, in_place, cap).unwrap_or_else(|e| {
                panic!("n={n} count={count} slice={slice} cap={cap} depth={depth}: {e}")
            });
            for out in &outputs {
                for (i, v) in out.iter().enumerate() {
                    let want: f64 = (0..n).map(|r| value(r, i)).sum();
                    assert_eq!(*v, want, "n={n} count={count} depth={depth} i={i}");
                }
            }
        }
    }

    /// Ring reduce-scatter of blocks of `count` on `n` ranks, `depth`
    /// slices deep over FIFOs of `cap` frames: each rank's block against
    /// the f64 sum.
    fn check_ring_reduce_scatter(n: usize, count: usize, slice: usize, depth: usize, cap: usize) {
        let rs: Vec<_> = (0..n)
            .map(|r| ring::reduce_scatter(deep(r, n, slice, depth), count))
            .collect();
        let inputs = rank_inputs(n, count * n);
        let mut outputs = vec![vec![f64::NAN; count]; n];
        run(&rs, &inputs, &mut outputs, false, cap).unwrap();
        for (rank, out) in outputs.iter().enumerate() {
            for (i, v) in out.iter().enumerate() {
                let want: f64 = (0..n).map(|r| value(r, rank * count + i)).sum();
                assert_eq!(*v, want, "reduce_scatter n={n} count={count} depth={depth}");
            }
        }
    }

    const SIZES: [usize; 9] = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    const SLICES: [usize; 3] = [1, 3, 1000];
    // A rank holds its received slot while it waits for a send slot, so a
    // link needs two slots; real links have `steps` (8) plus socket buffers.
    const CAPS: [usize; 2] = [2, 8];

    fn counts(n: usize) -> Vec<usize> {
        vec![0, 1, n.saturating_sub(1), n, n + 1, 37, 100]
    }

    #[test]
    fn ring_all_reduce_sums_everything_everywhere() {
        for n in SIZES {
            for count in counts(n) {
                for slice in SLICES {
                    for cap in CAPS {
                        // As deep as the library runs over `cap` slots.
                        let depth = ring::pipeline_depth(cap);
                        check_ring_all_reduce(n, count, slice, depth, cap);
                    }
                }
            }
        }
    }

    /// Pipelined passes at every depth over links of one slot more than
    /// the depth (`ring`'s "Room"): right results, no deadlock, with many
    /// slices (slice 1 and 3 of 100 elements a piece and more).
    #[test]
    fn pipelined_ring_passes_fit_in_one_slot_more_than_their_depth() {
        for depth in 1..=6 {
            let cap = depth + 1;
            for n in [2usize, 3, 4, 7] {
                for (count, slice) in [(100usize, 3usize), (37, 1), (n * 50, 7)] {
                    check_ring_all_reduce(n, count, slice, depth, cap);
                    check_ring_reduce_scatter(n, count, slice, depth, cap);
                }
            }
        }
    }

    /// Why the depth stays below the slots: a ring 4 slices deep over
    /// links of 2 slots deadlocks (every rank waits to send into a full
    /// link whose receiver waits to send too).
    #[test]
    fn a_ring_deeper_than_its_slots_deadlocks() {
        let n = 3;
        let count = 37;
        let sched: Vec<_> = (0..n)
            .map(|r| ring::all_reduce(deep(r, n, 1, 4), count))
            .collect();
        let inputs = rank_inputs(n, count);
        let mut outputs = vec![vec![f64::NAN; count]; n];
        let err = run(&sched, &inputs, &mut outputs, false, 2).unwrap_err();
        assert!(err.contains("deadlock"), "{err}");
        assert_eq!(ring::pipeline_depth(2), 1);
        let mut outputs = vec![vec![f64::NAN; count]; n];
        run(&sched, &inputs, &mut outputs, false, 5).unwrap();
    }

    #[test]
    fn ring_reduce_scatter_and_all_gather() {
        for n in SIZES {
            for count in counts(n) {
                for (slice, cap) in SLICES.into_iter().flat_map(|s| CAPS.map(|c| (s, c))) {
                    let depth = ring::pipeline_depth(cap);
                    check_ring_reduce_scatter(n, count, slice, depth, cap);

                    let ag: Vec<_> = (0..n)
                        .map(|r| ring::all_gather(deep(r, n, slice, depth), count))
                        .collect();
                    let inputs = rank_inputs(n, count);
                    let mut outputs = vec![vec![f64::NAN; count * n]; n];
                    run(&ag, &inputs, &mut outputs, false, cap).unwrap();
                    for out in &outputs {
                        for (j, v) in out.iter().enumerate() {
                            assert_eq!(*v, value(j / count, j % count), "all_gather n={n}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn chains_broadcast_and_reduce_from_every_root() {
        for n in SIZES {
            for root in 0..n {
                for count in counts(n) {
                    let bc: Vec<_> = (0..n)
                        .map(|r| ring::broadcast(params(r, n, 3), count, root))
                        .collect();
                    let mut bufs = rank_inputs(n, count);
                    run(&bc, &[], &mut bufs, true, 2).unwrap();
                    for b in &bufs {
                        for (i, v) in b.iter().enumerate() {
                            assert_eq!(*v, value(root, i));
                        }
                    }

                    let rd: Vec<_> = (0..n)
                        .map(|r| ring::reduce(params(r, n, 3), count, root))
                        .collect();
                    let inputs = rank_inputs(n, count);
                    let mut outputs = vec![vec![f64::NAN; count]; n];
                    run(&rd, &inputs, &mut outputs, false, 2).unwrap();
                    for (i, v) in outputs[root].iter().enumerate() {
                        let want: f64 = (0..n).map(|r| value(r, i)).sum();
                        assert_eq!(*v, want, "reduce n={n} root={root}");
                    }
                }
            }
        }
    }

    #[test]
    fn all_to_all_and_barrier_complete_without_deadlock() {
        for n in SIZES {
            for block in [0usize, 1, 5, 17] {
                let sched: Vec<_> = (0..n)
                    .map(|r| ring::all_to_all(params(r, n, 4), block))
                    .collect();
                let inputs = rank_inputs(n, block * n);
                let mut outputs = vec![vec![f64::NAN; block * n]; n];
                run(&sched, &inputs, &mut outputs, false, 2).unwrap();
                for (rank, out) in outputs.iter().enumerate() {
                    for (j, v) in out.iter().enumerate() {
                        let (src, i) = (j / block.max(1), j % block.max(1));
                        assert_eq!(*v, value(src, rank * block + i));
                    }
                }
            }
            let barrier: Vec<_> = (0..n).map(|r| ring::barrier(params(r, n, 1))).collect();
            run(&barrier, &[], &mut vec![Vec::new(); n], true, 2).unwrap();
        }
    }

    #[test]
    fn point_to_point_pairs_match() {
        for count in [0usize, 1, 10] {
            let sched = vec![
                ring::point_to_point(params(0, 2, 3), count, 1, true),
                ring::point_to_point(params(1, 2, 3), count, 0, false),
            ];
            let inputs = vec![(0..count).map(|i| value(0, i)).collect(), vec![]];
            let mut outputs = vec![vec![], vec![f64::NAN; count]];
            run(&sched, &inputs, &mut outputs, false, 2).unwrap();
            assert_eq!(outputs[1], inputs[0]);
        }
    }

    #[test]
    fn simulator_catches_mismatched_schedules() {
        // Rank 1 runs a schedule for another count: lengths disagree.
        let sched = vec![
            ring::all_reduce(params(0, 2, 100), 10),
            ring::all_reduce(params(1, 2, 100), 12),
        ];
        let inputs = vec![vec![1.0; 10], vec![1.0; 12]];
        let mut outputs = vec![vec![0.0; 10], vec![0.0; 12]];
        assert!(run(&sched, &inputs, &mut outputs, false, 8).is_err());
    }

    /// Counts the new schedules are checked for.
    fn new_counts(n: usize) -> Vec<usize> {
        vec![0, 1, n.saturating_sub(1), n, 37, 1000]
    }

    type Build = fn(RingParams, usize) -> Schedule;

    /// Run an allreduce schedule for every rank on `value` inputs, out of
    /// place (`stage`: in place as `comm` runs it, on a copy of the input)
    /// or truly in place, and check every output against the f64 sum.
    fn check_all_reduce(
        name: &str,
        build: Build,
        n: usize,
        count: usize,
        slice: usize,
        stage: bool,
    ) {
        let sched: Vec<_> = (0..n).map(|r| build(params(r, n, slice), count)).collect();
        let inputs = rank_inputs(n, count);
        for in_place in [false, true] {
            let mut outputs = outputs_for(&inputs, count, in_place);
            let truly_in_place = in_place && !stage;
            run(&sched, &inputs, &mut outputs, truly_in_place, 2).unwrap_or_else(|e| {
                panic!("{name} n={n} count={count} slice={slice} in_place={in_place}: {e}")
            });
            for (rank, out) in outputs.iter().enumerate() {
                for (i, v) in out.iter().enumerate() {
                    let want: f64 = (0..n).map(|r| value(r, i)).sum();
                    assert_eq!(
                        *v, want,
                        "{name} n={n} count={count} slice={slice} in_place={in_place} rank={rank} i={i}"
                    );
                }
            }
        }
    }

    #[test]
    fn tree_all_reduce_sums_everything_everywhere() {
        for n in 1..=33 {
            for count in new_counts(n) {
                for slice in SLICES {
                    check_all_reduce("tree", tree::all_reduce, n, count, slice, false);
                }
            }
        }
    }

    #[test]
    fn direct_all_reduces_sum_everything_everywhere() {
        for n in 1..=16 {
            for count in new_counts(n) {
                for slice in SLICES {
                    check_all_reduce("one_shot", direct::one_shot, n, count, slice, true);
                    check_all_reduce("two_shot", direct::two_shot, n, count, slice, true);
                }
            }
        }
    }

    /// Non-integer inputs whose f32 sums depend on the order of the adds.
    fn ragged(rank: usize, i: usize) -> f64 {
        f64::from(((rank * 7919 + i * 104729) % 1000) as f32 * 0.1013 + 1e-3 * rank as f32)
    }

    #[test]
    fn direct_and_tree_results_are_the_same_bits_on_every_rank() {
        let builds: [(&str, Build, bool); 3] = [
            ("one_shot", direct::one_shot, true),
            ("two_shot", direct::two_shot, true),
            ("tree", tree::all_reduce, false),
        ];
        for (name, build, rank_order) in builds {
            for n in [2usize, 3, 5, 8, 13, 16] {
                for (count, slice) in [(1usize, 1usize), (37, 4), (200, 1000)] {
                    let sched: Vec<_> = (0..n).map(|r| build(params(r, n, slice), count)).collect();
                    let inputs: Vec<Vec<f64>> = (0..n)
                        .map(|r| (0..count).map(|i| ragged(r, i)).collect())
                        .collect();
                    let mut outputs = vec![vec![f64::NAN; count]; n];
                    run_with(&sched, &inputs, &mut outputs, false, 2, add_f32).unwrap();
                    for (rank, out) in outputs.iter().enumerate() {
                        assert_eq!(
                            out.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            outputs[0].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{name} n={n}: rank {rank} differs from rank 0"
                        );
                    }
                    if rank_order {
                        for (i, v) in outputs[0].iter().enumerate() {
                            let want =
                                (1..n).fold(ragged(0, i), |acc, r| add_f32(acc, ragged(r, i)));
                            assert_eq!(
                                v.to_bits(),
                                want.to_bits(),
                                "{name} n={n} i={i}: not rank order"
                            );
                        }
                    }
                }
            }
        }
        // The inputs do make the order matter.
        let fwd = (1..8).fold(ragged(0, 3), |acc, r| add_f32(acc, ragged(r, 3)));
        let back = (0..7)
            .rev()
            .fold(ragged(7, 3), |acc, r| add_f32(acc, ragged(r, 3)));
        assert_ne!(fwd.to_bits(), back.to_bits());
    }

    #[test]
    fn tree_broadcast_and_reduce_from_every_root() {
        for n in 1..=33 {
            for root in 0..n {
                for count in new_counts(n) {
                    for slice in SLICES {
                        let what = format!("n={n} root={root} count={count} slice={slice}");
                        let bc: Vec<_> = (0..n)
                            .map(|r| tree::broadcast(params(r, n, slice), count, root))
                            .collect();
                        let mut bufs = rank_inputs(n, count);
                        run(&bc, &[], &mut bufs, true, 2)
                            .unwrap_or_else(|e| panic!("broadcast {what}: {e}"));
                        for b in &bufs {
                            for (i, v) in b.iter().enumerate() {
                                assert_eq!(*v, value(root, i), "broadcast {what}");
                            }
                        }

                        let rd: Vec<_> = (0..n)
                            .map(|r| tree::reduce(params(r, n, slice), count, root))
                            .collect();
                        let inputs = rank_inputs(n, count);
                        for in_place in [false, true] {
                            let mut outputs = outputs_for(&inputs, count, in_place);
                            run(&rd, &inputs, &mut outputs, in_place, 2)
                                .unwrap_or_else(|e| panic!("reduce {what}: {e}"));
                            for (i, v) in outputs[root].iter().enumerate() {
                                let want: f64 = (0..n).map(|r| value(r, i)).sum();
                                assert_eq!(*v, want, "reduce {what} in_place={in_place}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tree_all_reduce_reaches_64_ranks() {
        for n in [34usize, 47, 63, 64] {
            for count in [0usize, 1, n - 1, 1000] {
                check_all_reduce("tree", tree::all_reduce, n, count, 3, false);
            }
        }
    }

    #[test]
    fn simulator_catches_an_unstaged_in_place_one_shot() {
        // Run truly in place, one-shot overwrites its input before it adds
        // it: the check must see the wrong sums.
        let n = 3;
        let sched: Vec<_> = (0..n)
            .map(|r| direct::one_shot(params(r, n, 4), 4))
            .collect();
        let mut bufs = rank_inputs(n, 4);
        run(&sched, &[], &mut bufs, true, 2).unwrap();
        let want: f64 = (0..n).map(|r| value(r, 0)).sum();
        assert!(bufs.iter().any(|b| b[0] != want));
    }

    /// Each channel is a FIFO of its own: frames sent on channels 0 then 1
    /// may be received on 1 then 0; on one channel the same order is a tag
    /// mismatch.
    #[test]
    fn channels_are_separate_fifos() {
        use super::super::{Step, NO_PEER};
        let step = |prim, peer, channel, off, tag| Step {
            send_to: if prim == Prim::Send { peer } else { NO_PEER },
            recv_from: if prim == Prim::Recv { peer } else { NO_PEER },
            send_tag: tag,
            recv_tag: tag,
            channel,
            ..Step::local(
                prim,
                if prim == Prim::Send {
                    Operand::Input
                } else {
                    Operand::Output
                },
                off,
                off,
                2,
            )
        };
        let schedules = |second: usize| {
            vec![
                Schedule {
                    steps: vec![
                        step(Prim::Send, 1, 0, 0, 1),
                        step(Prim::Send, 1, second, 2, 2),
                    ],
                },
                Schedule {
                    steps: vec![
                        step(Prim::Recv, 0, second, 2, 2),
                        step(Prim::Recv, 0, 0, 0, 1),
                    ],
                },
            ]
        };
        let inputs = vec![vec![1.0, 2.0, 3.0, 4.0], vec![0.0; 4]];
        let mut outputs = vec![vec![0.0; 4]; 2];
        run(&schedules(1), &inputs, &mut outputs, false, 2).unwrap();
        assert_eq!(outputs[1], inputs[0]);
        let mut outputs = vec![vec![0.0; 4]; 2];
        let err = run(&schedules(0), &inputs, &mut outputs, false, 2).unwrap_err();
        assert!(err.contains("expected tag 2"), "{err}");
    }
}
