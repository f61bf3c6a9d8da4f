//! The checker a user algorithm must pass before a communicator runs it:
//! the matching check over frames (every send received in order by a step
//! naming the same chunks, no deadlock over FIFOs of [`CHECK_SLOTS`] slots,
//! nothing left unreceived) and the value check through the functional
//! simulator against the collective's definition computed apart in f64.
//! It runs frames in the order `lower` builds a call in, so what it
//! accepts is what a call runs.

use super::lower::{blocks_touched, instantiate, run_groups, run_order, segments, Place};
use super::{
    prim_name, Chunks, Collective, UserAlgorithm, UserError, UserStep, Verdict, MAX_CHUNKS,
};
use crate::algo::Schedule;
use std::collections::{HashMap, VecDeque};

impl UserAlgorithm {
    /// Check every claimed rank count: steps well formed, frames matched
    /// with no deadlock ([`UserAlgorithm::check_matching`]) and results
    /// equal to the collective's definition ([`UserAlgorithm::check_values`]).
    pub fn check(&self) -> Result<Verdict, UserError> {
        let mut in_place = true;
        for n in self.sizes() {
            self.check_matching(n)?;
            in_place &= self.check_values(n)?.in_place;
        }
        Ok(Verdict { in_place })
    }

    /// Check rank count `n`'s steps: each well formed, and every frame
    /// sent is received, in order, by a step that names the same chunks
    /// (so both ends agree on its length at every element count, and on
    /// how a call cuts it), with no deadlock over FIFOs of two frames (the
    /// fewest slots a connection has) and no frame left. Cheap: frames
    /// carry no data, so this runs at thousands of ranks.
    ///
    /// It runs the frames in the order a call runs them (`run_order`):
    /// once with one frame a step (a call of one pass), and, for an
    /// allgather or reduce-scatter, once more with one frame for each
    /// block a step's chunks touch (a call of several passes, where the
    /// blocks' parts do not meet).
    pub fn check_matching(&self, n: usize) -> Result<(), UserError> {
        let ranks = self.ranks(n)?;
        for (r, steps) in ranks.iter().enumerate() {
            for (i, s) in steps.iter().enumerate() {
                if let Some(what) = s.problem(r, n, self.collective) {
                    return Err(UserError::at_step(n, r, i, s, what));
                }
            }
        }
        let blocks = self.collective.blocks(n);
        let groups: Vec<Vec<(usize, usize)>> = ranks
            .iter()
            .map(|steps| run_groups(steps, blocks))
            .collect();
        let one: Vec<Vec<(usize, usize)>> = ranks
            .iter()
            .zip(&groups)
            .map(|(steps, g)| run_order(steps, g, |_| 1))
            .collect();
        self.match_frames(n, ranks, &one)?;
        if blocks > 1 {
            let split: Vec<Vec<(usize, usize)>> = ranks
                .iter()
                .zip(&groups)
                .map(|(steps, g)| run_order(steps, g, |i| blocks_touched(steps[i].chunks, blocks)))
                .collect();
            self.match_frames(n, ranks, &split)?;
        }
        Ok(())
    }

    /// The matching check over `order` (each rank's frames: a step index
    /// and the frame's number within the step).
    fn match_frames(
        &self,
        n: usize,
        ranks: &[Vec<UserStep>],
        order: &[Vec<(usize, usize)>],
    ) -> Result<(), UserError> {
        let mut fifo: HashMap<(usize, usize), VecDeque<Frame>> = HashMap::new();
        let mut pc = vec![0usize; n];
        let mut active: Vec<usize> = (0..n).filter(|&r| !order[r].is_empty()).collect();
        while !active.is_empty() {
            let mut moved = false;
            let mut still = Vec::with_capacity(active.len());
            for &r in &active {
                let steps = &ranks[r];
                // Run this rank as far as it goes.
                while let Some(&(at, part)) = order[r].get(pc[r]) {
                    let s = &steps[at];
                    if let Some(to) = s.to {
                        if fifo.get(&(r, to)).map_or(0, VecDeque::len) >= CHECK_SLOTS {
                            break;
                        }
                    }
                    if let Some(from) = s.from {
                        let Some(&(sent_at, sent, sent_part)) =
                            fifo.get(&(from, r)).and_then(|q| q.front())
                        else {
                            break;
                        };
                        if (sent, sent_part) != (s.chunks, part) {
                            return Err(UserError::at_step(
                                n,
                                r,
                                at,
                                s,
                                format!(
                                    "{} from {from} names {} where the frame it takes, from \
                                     rank {from} step {sent_at}, carries {} (a receive names \
                                     the same chunks as its send)",
                                    prim_name(s.prim),
                                    s.chunks,
                                    sent
                                ),
                            ));
                        }
                        if let Some(q) = fifo.get_mut(&(from, r)) {
                            q.pop_front();
                        }
                    }
                    if let Some(to) = s.to {
                        fifo.entry((r, to))
                            .or_default()
                            .push_back((at, s.chunks, part));
                    }
                    pc[r] += 1;
                    moved = true;
                }
                if pc[r] < order[r].len() {
                    still.push(r);
                }
            }
            active = still;
            if !active.is_empty() && !moved {
                return Err(self.deadlock(n, ranks, order, &pc, &fifo));
            }
        }
        if let Some(((from, to), q)) = fifo
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .min_by_key(|(k, _)| **k)
        {
            let at = q.front().map_or(0, |f| f.0);
            let s = &ranks[*from][at];
            return Err(UserError::at_step(
                n,
                *from,
                at,
                s,
                format!(
                    "{} to {to} ({}) is never received: rank {to} ends with {} frame(s) from \
                     rank {from} unreceived",
                    prim_name(s.prim),
                    s.chunks,
                    q.len()
                ),
            ));
        }
        Ok(())
    }

    /// The error for a state where no rank can move: the lowest stuck
    /// rank, what it waits for, and why that never comes.
    fn deadlock(
        &self,
        n: usize,
        ranks: &[Vec<UserStep>],
        order: &[Vec<(usize, usize)>],
        pc: &[usize],
        fifo: &HashMap<(usize, usize), VecDeque<Frame>>,
    ) -> UserError {
        let stuck: Vec<usize> = (0..n).filter(|&r| pc[r] < order[r].len()).collect();
        let r = stuck[0];
        let step_of = |q: usize| order[q][pc[q]].0;
        let at = step_of(r);
        let s = &ranks[r][at];
        let waits = match (s.from, s.to) {
            (Some(from), _) if fifo.get(&(from, r)).is_none_or(VecDeque::is_empty) => {
                if pc[from] >= order[from].len() {
                    format!(
                        "waits for a frame from rank {from}, which has finished without \
                         sending it (a missing send, or a receive too many)"
                    )
                } else {
                    format!(
                        "waits for a frame from rank {from}, which is stuck at its step {} ({})",
                        step_of(from),
                        prim_name(ranks[from][step_of(from)].prim)
                    )
                }
            }
            (_, Some(to)) => format!(
                "waits for room to send to rank {to}: {CHECK_SLOTS} frames sent there are not \
                 received (rank {to} {})",
                if pc[to] >= order[to].len() {
                    "has finished: a missing receive".to_string()
                } else {
                    format!("is stuck at its step {}", step_of(to))
                }
            ),
            _ => "cannot move".to_string(),
        };
        UserError::at_step(
            n,
            r,
            at,
            s,
            format!(
                "deadlock over FIFOs of {CHECK_SLOTS} slots: {} {waits}; {} rank(s) stuck",
                prim_name(s.prim),
                stuck.len()
            ),
        )
    }

    fn ranks(&self, n: usize) -> Result<&Vec<Vec<UserStep>>, UserError> {
        let ranks = self
            .sizes
            .get(&n)
            .ok_or_else(|| UserError::general(n, format!("no schedule for {n} ranks")))?;
        if ranks.len() != n {
            return Err(UserError::general(
                n,
                format!("{} ranks have steps, where there are {n}", ranks.len()),
            ));
        }
        Ok(ranks)
    }

    /// Element counts for the value check: one that leaves many pieces
    /// empty (1), one that makes pieces of every cut differ in length
    /// (`2k + 1` for the largest cut `k` of a block: of the buffer for an
    /// allreduce, of each rank's block for the others), and a larger odd
    /// one.
    fn probe_counts(&self, n: usize) -> [usize; 3] {
        let blocks = self.collective.blocks(n).max(1);
        let most = self
            .sizes
            .get(&n)
            .into_iter()
            .flatten()
            .flatten()
            .map(|s| (s.chunks.of / blocks).max(1))
            .max()
            .unwrap_or(1);
        [
            1,
            2 * most.min(MAX_CHUNKS) + 1,
            7 * most.min(MAX_CHUNKS) + 3,
        ]
    }

    /// Run rank count `n` through the functional simulator with distinct
    /// inputs, out of place and in place, whole and sliced (three slices a
    /// step), at element counts that leave pieces ragged and empty, and
    /// compare every rank's output with the collective's definition
    /// computed apart in f64 (an allreduce's sum; an allgather's blocks;
    /// a reduce-scatter's sum of the rank's block). Assumes
    /// [`UserAlgorithm::check_matching`] passed. Costs about `n * count`
    /// per step (`n * n * count` for an allgather or reduce-scatter): run
    /// it for the rank counts a job uses.
    pub fn check_values(&self, n: usize) -> Result<Verdict, UserError> {
        let ranks = self.ranks(n)?;
        let collective = self.collective;
        let [_, ragged, _] = self.probe_counts(n);
        let widths = self.widths(n);
        let mut in_place = true;
        for count in [ragged, 1, 0] {
            // Inputs: integers up to 2^20 from a hash of (rank, element):
            // sums stay exact in f64, and a contribution lost, doubled or
            // taken from the wrong rank or place changes the sum.
            let (in_len, _) = collective.extents(count, n);
            let inputs: Vec<Vec<f64>> = (0..n)
                .map(|r| (0..in_len).map(|i| input_value(r, i)).collect())
                .collect();
            let expected: Vec<Vec<f64>> = (0..n)
                .map(|r| definition(collective, n, r, count, &inputs))
                .collect();
            let longest = ranks
                .iter()
                .flatten()
                .flat_map(|s| segments(s.chunks, collective, n, count, (0, count)))
                .map(|(_, len)| len)
                .max()
                .unwrap_or(0);
            for slice in [usize::MAX, longest.div_ceil(3).max(1)] {
                for place in [false, true] {
                    let built: Vec<(Schedule, Vec<usize>)> = (0..n)
                        .map(|r| {
                            let at = Place {
                                collective,
                                size: n,
                                rank: r,
                                whole: place,
                            };
                            instantiate(&ranks[r], at, count, slice, &widths)
                        })
                        .collect();
                    let schedules: Vec<Schedule> = built.iter().map(|b| b.0.clone()).collect();
                    // In place every collective runs on the whole buffer
                    // (an allgather's other blocks hold garbage until
                    // written: NaN, which any read of them spreads).
                    let (whole_inputs, mut outputs): (Vec<Vec<f64>>, Vec<Vec<f64>>) = if place {
                        let whole: Vec<Vec<f64>> = (0..n)
                            .map(|r| whole_buffer(collective, n, r, count, &inputs[r]))
                            .collect();
                        (whole.clone(), whole)
                    } else {
                        let out_len = collective.extents(count, n).1;
                        (inputs.clone(), vec![vec![f64::NAN; out_len]; n])
                    };
                    let how = format!(
                        "{}, {count} elements{}",
                        if place { "in place" } else { "out of place" },
                        if slice == usize::MAX {
                            String::new()
                        } else {
                            format!(", slices of {slice}")
                        }
                    );
                    if let Err(e) = crate::algo::sim::run(
                        &schedules,
                        &whole_inputs,
                        &mut outputs,
                        place,
                        CHECK_SLOTS,
                    ) {
                        if place {
                            in_place = false;
                            continue;
                        }
                        return Err(UserError::general(n, format!("simulation ({how}): {e}")));
                    }
                    // The result's place in the output: in place, a
                    // reduce-scatter's is the rank's block.
                    let at = |r: usize| match (place, collective) {
                        (true, Collective::ReduceScatter) => r * count,
                        _ => 0,
                    };
                    // Of the wrong elements (the first 64 of each rank),
                    // blame the one finished earliest in its rank's list:
                    // later wrong values mostly copy it.
                    let wrong = (0..n)
                        .flat_map(|r| {
                            let (outputs, expected, built) = (&outputs, &expected, &built);
                            (0..expected[r].len())
                                .filter(move |&i| {
                                    outputs[r].get(at(r) + i).copied() != Some(expected[r][i])
                                })
                                .take(64)
                                .map(move |i| (last_writer(&built[r], at(r) + i), r, i))
                        })
                        .min_by_key(|&(w, r, i)| (w.unwrap_or(usize::MAX), r, i));
                    if let Some((writer, r, i)) = wrong {
                        if place {
                            in_place = false;
                            continue;
                        }
                        return Err(wrong_value(
                            (n, collective, count),
                            (r, i, writer),
                            &ranks[r],
                            &how,
                            (outputs[r][i], expected[r][i]),
                        ));
                    }
                }
            }
        }
        Ok(Verdict { in_place })
    }
}

/// FIFO depth the checker uses: the fewest slots a connection may have
/// (`Config::validate` refuses fewer). Frames carry no data between ranks
/// that wait on each other, so a schedule that finishes with this many
/// finishes with more.
pub const CHECK_SLOTS: usize = 2;

/// A frame in the matching check: the sender's step index, the chunks it
/// carries and its number within the step.
type Frame = (usize, Chunks, usize);

fn input_value(rank: usize, i: usize) -> f64 {
    let mut x = (rank as u64) << 32 | i as u64;
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    (1 + (x & 0xF_FFFF)) as f64
}

/// The user step that last wrote output element `i` in a built schedule.
fn last_writer(built: &(Schedule, Vec<usize>), i: usize) -> Option<usize> {
    built
        .0
        .steps
        .iter()
        .zip(&built.1)
        .filter(|(s, _)| s.prim.writes_output() && (s.output..s.output + s.len).contains(&i))
        .map(|(_, &origin)| origin)
        .next_back()
}

/// What rank `r`'s output of `collective` on `n` ranks should hold for a
/// call of `count`, from every rank's input, in f64.
fn definition(
    collective: Collective,
    n: usize,
    r: usize,
    count: usize,
    inputs: &[Vec<f64>],
) -> Vec<f64> {
    match collective {
        Collective::AllReduce => (0..count)
            .map(|i| inputs.iter().map(|x| x[i]).sum())
            .collect(),
        Collective::AllGather => (0..n * count)
            .map(|j| inputs[j / count][j % count])
            .collect(),
        Collective::ReduceScatter => (0..count)
            .map(|i| inputs.iter().map(|x| x[r * count + i]).sum())
            .collect(),
    }
}

/// Rank `r`'s one buffer for an in-place call: an allreduce's or a
/// reduce-scatter's input, or an allgather's input in block `r` of
/// `n * count` elements of NaN.
fn whole_buffer(
    collective: Collective,
    n: usize,
    r: usize,
    count: usize,
    input: &[f64],
) -> Vec<f64> {
    match collective {
        Collective::AllReduce | Collective::ReduceScatter => input.to_vec(),
        Collective::AllGather => {
            let mut buf = vec![f64::NAN; n * count];
            buf[r * count..(r + 1) * count].copy_from_slice(input);
            buf
        }
    }
}

/// The error for output element `i` of rank `r`, last written by user
/// step `writer`.
fn wrong_value(
    (n, collective, count): (usize, Collective, usize),
    (r, i, writer): (usize, usize, Option<usize>),
    steps: &[UserStep],
    how: &str,
    (got, want): (f64, f64),
) -> UserError {
    let should = match collective {
        Collective::AllReduce => "the sum of every rank's input".to_string(),
        Collective::AllGather => format!(
            "rank {}'s input element {}",
            i / count.max(1),
            i % count.max(1)
        ),
        Collective::ReduceScatter => format!(
            "the sum of every rank's input element {} (block {r})",
            r * count + i
        ),
    };
    let what = format!("element {i} of the output is {got} where {should} is {want} ({how})");
    match writer {
        Some(at) => UserError::at_step(
            n,
            r,
            at,
            &steps[at],
            format!(
                "{what}; the first step to finish a wrong value is this {} ({}): it, or a step \
                 whose data it takes, combines the wrong contributions or puts them in the \
                 wrong place",
                prim_name(steps[at].prim),
                steps[at].chunks
            ),
        ),
        None => UserError {
            size: Some(n),
            rank: Some(r),
            step: None,
            line: None,
            what: format!("{what}; no step of rank {r} writes it"),
        },
    }
}
