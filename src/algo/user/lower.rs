//! Lowering a user algorithm to one call's [`Schedule`]: the count-free
//! steps of a rank cut into run groups and run order, each chunk range
//! turned into buffer pieces for a count, and the call cut into passes so
//! that no frame exceeds the slice. The checker runs the same order.

use super::{Chunks, Collective, UserAlgorithm, UserStep};
use crate::algo::{partition, Operand, Prim, Schedule, Step, NO_PEER};
use std::collections::HashMap;

impl UserAlgorithm {
    /// Every `(end - first, of)` the steps on `n` ranks use.
    pub(super) fn widths(&self, n: usize) -> Vec<(usize, usize)> {
        let mut w: Vec<(usize, usize)> = self
            .sizes
            .get(&n)
            .into_iter()
            .flatten()
            .flatten()
            .map(|s| (s.chunks.end.saturating_sub(s.chunks.first), s.chunks.of))
            .collect();
        w.sort_unstable();
        w.dedup();
        w
    }

    /// This rank's schedule for an out-of-place call of `count` elements
    /// (an allreduce's buffer, an allgather's input, a reduce-scatter's
    /// output) cut in slices of at most `slice` elements, or None where
    /// `n` is not claimed.
    pub fn schedule(&self, n: usize, rank: usize, count: usize, slice: usize) -> Option<Schedule> {
        let widths = self.widths(n);
        let at = Place {
            collective: self.collective,
            size: n,
            rank,
            whole: false,
        };
        self.steps(n, rank)
            .map(|steps| instantiate(steps, at, count, slice, &widths).0)
    }
}

/// Most steps of one run group ([`run_groups`]): bounds the check's cost
/// on long lists of independent steps.
const MAX_GROUP: usize = 64;

/// Blocks of `blocks` that `chunks` touches (1 for an allreduce's).
pub(super) fn blocks_touched(chunks: Chunks, blocks: usize) -> usize {
    if blocks <= 1 || chunks.problem().is_some() || !chunks.of.is_multiple_of(blocks) {
        return 1;
    }
    let per = chunks.of / blocks;
    (chunks.end - 1) / per - chunks.first / per + 1
}

/// Whether two chunk ranges may share an element at some count: exactly
/// for ranges of one cut; for two cuts, only whether they touch a common
/// block of `blocks` (block boundaries are exact at every count), and
/// for an allreduce (one block) always.
fn may_overlap(a: Chunks, b: Chunks, blocks: usize) -> bool {
    if a.of == b.of {
        return a.first < b.end && b.first < a.end;
    }
    if blocks > 1 && a.of.is_multiple_of(blocks) && b.of.is_multiple_of(blocks) {
        let (pa, pb) = (a.of / blocks, b.of / blocks);
        let (a0, a1) = (a.first / pa, (a.end.max(1) - 1) / pa);
        let (b0, b1) = (b.first / pb, (b.end.max(1) - 1) / pb);
        return a0 <= b1 && b0 <= a1;
    }
    true
}

/// Whether two steps of one rank depend on each other through the
/// buffers: one writes an element the other reads or writes. Input and
/// output count as one buffer (in place they are).
fn conflict(a: &UserStep, b: &UserStep, blocks: usize) -> bool {
    let reads =
        |s: &UserStep| s.reads_input() || s.local == Operand::Output || s.prim == Prim::Reduce;
    let writes = |s: &UserStep| s.prim.writes_output();
    ((writes(a) && (reads(b) || writes(b))) || (writes(b) && reads(a)))
        && may_overlap(a.chunks, b.chunks, blocks)
}

/// A rank's steps cut into run groups: runs of consecutive steps with no
/// dependency between any two ([`conflict`]) that send to at most one
/// peer and receive from at most one, each a list of streams (the steps,
/// in order, with one pair of peers `(from, to)`), where no two streams
/// send to the same peer or receive from the same peer: typically one
/// round of an exchange. Each entry: (first step, one past the last).
pub(super) fn run_groups(steps: &[UserStep], blocks: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, s) in steps.iter().enumerate() {
        let joins = i > start
            && i - start < MAX_GROUP
            && steps[start..i].iter().all(|g| {
                let same_stream = (g.from, g.to) == (s.from, s.to);
                // At most one peer sent to and one received from.
                let one_peer =
                    |a: Option<usize>, b: Option<usize>| a.is_none() || b.is_none() || a == b;
                !conflict(g, s, blocks)
                    && one_peer(g.to, s.to)
                    && one_peer(g.from, s.from)
                    && (same_stream
                        || ((g.to.is_none() || g.to != s.to)
                            && (g.from.is_none() || g.from != s.from)))
            });
        if i > start && !joins {
            out.push((start, i));
            start = i;
        }
    }
    if start < steps.len() {
        out.push((start, steps.len()));
    }
    out
}

/// A step's peers, `(from, to)`: what names its stream in a run group.
type Peers = (Option<usize>, Option<usize>);

/// The order a rank runs its frames in: group by group, the streams of a
/// group taking turns one frame at a time (each stream's frames in step
/// order, `parts(step)` frames a step), so that a rank that sends several
/// frames to one peer and receives several from another alternates
/// between them instead of filling a FIFO first. Each link's frames keep
/// their step order (a group holds one stream per link), so sender and
/// receiver agree on them; the checker runs this order
/// ([`UserAlgorithm::check_matching`]) and a call runs it too.
pub(super) fn run_order(
    steps: &[UserStep],
    groups: &[(usize, usize)],
    parts: impl Fn(usize) -> usize,
) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &(start, end) in groups {
        let mut streams: Vec<(Peers, Vec<(usize, usize)>)> = Vec::new();
        for (i, s) in steps.iter().enumerate().take(end).skip(start) {
            let key = (s.from, s.to);
            let frames = (0..parts(i)).map(|j| (i, j));
            match streams.iter_mut().find(|(k, _)| *k == key) {
                Some((_, list)) => list.extend(frames),
                None => streams.push((key, frames.collect())),
            }
        }
        let longest = streams.iter().map(|(_, l)| l.len()).max().unwrap_or(0);
        for j in 0..longest {
            out.extend(streams.iter().filter_map(|(_, l)| l.get(j).copied()));
        }
    }
    out
}

/// How many passes a call of `count` elements runs in so that no step's
/// frame exceeds `slice` elements: the fewest `p` such that a pass of
/// `ceil(count / p)` elements of each of the `blocks` blocks gives every
/// step (of `widths`: its chunks' `(end - first, of)`) at most `slice`
/// elements.
fn passes(count: usize, slice: usize, blocks: usize, widths: &[(usize, usize)]) -> usize {
    if count == 0 {
        return 0;
    }
    let slice = slice.max(1);
    let blocks = blocks.max(1);
    let fits = |p: usize| {
        let m = count.div_ceil(p);
        widths.iter().all(|&(w, k)| {
            let per = (k / blocks).max(1);
            m.saturating_mul(blocks)
                .min(w.saturating_mul(m.div_ceil(per)))
                <= slice
        })
    };
    // fits(count): passes of one element a block.
    let (mut lo, mut hi) = (1, count);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

/// Where a schedule is built for: the collective, the rank count and the
/// rank, and whether its offsets are of the one buffer of an in-place call
/// (`whole`) or of the separate input and output.
#[derive(Debug, Clone, Copy)]
pub(super) struct Place {
    pub(super) collective: Collective,
    pub(super) size: usize,
    pub(super) rank: usize,
    pub(super) whole: bool,
}

/// The pieces of the buffer (offset, length) that `chunks` names in the
/// pass `(base, m)` (elements `base..base + m` of each block of `count`):
/// one for an allreduce; for an allgather or reduce-scatter one per block
/// the range touches, those that meet merged (a single pass covers whole
/// blocks, so a range over several blocks stays one piece). Empty pieces
/// are left out; a range of no chunks problem, or of a cut uneven over the
/// blocks, yields nothing (the checker refuses it first).
pub(super) fn segments(
    chunks: Chunks,
    collective: Collective,
    n: usize,
    count: usize,
    (base, m): (usize, usize),
) -> Vec<(usize, usize)> {
    let blocks = collective.blocks(n).max(1);
    if chunks.problem().is_some() || !chunks.of.is_multiple_of(blocks) {
        return Vec::new();
    }
    let per = chunks.of / blocks;
    let mut out: Vec<(usize, usize)> = Vec::new();
    for b in chunks.first / per..=(chunks.end - 1) / per {
        let lo = chunks.first.max(b * per) - b * per;
        let hi = chunks.end.min((b + 1) * per) - b * per;
        let (start, _) = partition(m, per, lo);
        let (last, last_len) = partition(m, per, hi - 1);
        let (off, len) = (b * count + base + start, last + last_len - start);
        if len == 0 {
            continue;
        }
        match out.last_mut() {
            Some(prev) if prev.0 + prev.1 == off => prev.1 += len,
            _ => out.push((off, len)),
        }
    }
    out
}

/// The schedule of `steps` at `at` for `count` elements with frames of at
/// most `slice` elements, and for each of its steps the index of the user
/// step it came from. Each block of `count` elements is cut into
/// [`passes`] contiguous parts, and the whole list runs once per pass, as
/// if every block were that part (its chunks cut from it): each pass is
/// the checked algorithm on a shorter buffer, touches its own elements
/// only, and ends with every FIFO empty, so passes add neither wrong
/// values nor deadlock. `widths` are every rank's, so that all ranks cut
/// alike. A step whose chunks span blocks that do not meet in a pass runs
/// as one step per block, in order, on both ends. Steps whose piece is
/// empty are left out on both ends (a send and its receive name the same
/// chunks). Frames run in [`run_order`], the order the checker checks. A
/// frame's tag is its number on its link, counted alike by the sender and
/// the receiver.
///
/// Offsets are of the buffer of `n * count` (allgather, reduce-scatter)
/// in place; out of place an allgather's input offsets and a
/// reduce-scatter's output offsets are moved down by `rank * count` (the
/// checker keeps such steps inside the rank's block), and offsets a step
/// never uses are 0.
pub(super) fn instantiate(
    steps: &[UserStep],
    at: Place,
    count: usize,
    slice: usize,
    widths: &[(usize, usize)],
) -> (Schedule, Vec<usize>) {
    let mut sent: HashMap<usize, u32> = HashMap::new();
    let mut received: HashMap<usize, u32> = HashMap::new();
    let mut out = Schedule::default();
    let mut origin = Vec::new();
    let n = at.size;
    let own = at.rank.saturating_mul(count);
    let nblocks = at.collective.blocks(n);
    let groups = run_groups(steps, nblocks);
    let blocks = passes(count, slice, nblocks, widths);
    for pass in 0..blocks {
        let part = partition(count, blocks, pass);
        let pieces: Vec<Vec<(usize, usize)>> = steps
            .iter()
            .map(|s| segments(s.chunks, at.collective, n, count, part))
            .collect();
        for (i, j) in run_order(steps, &groups, |i| pieces[i].len()) {
            let s = &steps[i];
            let (off, len) = pieces[i][j];
            let tag = |peer: Option<usize>, counter: &mut HashMap<usize, u32>| match peer {
                Some(p) => {
                    let t = counter.entry(p).or_insert(0);
                    *t = t.wrapping_add(1);
                    (p, t.wrapping_sub(1))
                }
                None => (NO_PEER, 0),
            };
            let (send_to, send_tag) = tag(s.to, &mut sent);
            let (recv_from, recv_tag) = tag(s.from, &mut received);
            let (input, output) = match (at.collective, at.whole) {
                (Collective::AllReduce, _) | (_, true) => (off, off),
                (Collective::AllGather, false) => (
                    if s.reads_input() {
                        off.saturating_sub(own)
                    } else {
                        0
                    },
                    off,
                ),
                (Collective::ReduceScatter, false) => (
                    off,
                    if s.touches_output() {
                        off.saturating_sub(own)
                    } else {
                        0
                    },
                ),
            };
            out.push(Step {
                prim: s.prim,
                local: s.local,
                send_to,
                recv_from,
                input,
                output,
                len,
                send_tag,
                recv_tag,
                channel: 0,
            });
            origin.push(i);
        }
    }
    (out, origin)
}
