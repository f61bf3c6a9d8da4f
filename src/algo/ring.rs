//! Ring schedules, chunk pipelined: allreduce (reduce-scatter then
//! allgather), reduce-scatter, allgather, broadcast and reduce (a chain that
//! starts or ends at the root), point-to-point, all-to-all (pairwise rounds)
//! and barrier (two laps of an empty token).
//!
//! Data is cut into `n` pieces (one per rank) and each piece into slices of
//! at most `slice` elements; each slice makes a ring pass (`K` hops: `2(n -
//! 1)` for allreduce, `n - 1` for reduce-scatter and allgather). A step
//! whose slice is empty is left out on every rank alike, since all ranks
//! compute the same lengths.
//!
//! # Pipelined slices
//!
//! With `depth` 1 a rank runs slice 0's whole pass, then slice 1's: every
//! hop of every slice waits for the previous hop's frame to arrive, so a
//! call pays the link's latency `slices x K` times. With `depth` `D > 1`
//! slice `s + 1` starts `ceil(K / D)` hops after slice `s` (hop `k` of
//! slice `s` runs at tick `s * ceil(K / D) + k`; within a tick the older
//! slice first), so up to `D` slices are in flight and a rank works on one
//! while the next one's frame travels: the latency is paid about `K +
//! (slices - 1) * K / D` times. Slices touch disjoint ranges, so interleaving them keeps
//! in-place calls correct; a sender and its receiver order their shared
//! frames alike (every rank uses the same ticks), and tags stay unique per
//! slice and hop.
//!
//! Room: between two hops of one slice a rank runs at most `D - 1` steps of
//! other slices, so a send never waits for a slot that its receiver frees
//! only at or after the sender's own position when `D` is below the slots
//! per connection ([`pipeline_depth`] keeps it so; `slots >= 2`, so `D = 1`
//! always fits).

use super::{partition, slice_of, Operand, Prim, Schedule, Step, Timeline, NO_PEER};

/// Most slices in flight: beyond a few, more hide no more latency and only
/// hold slots.
pub const MAX_DEPTH: usize = 4;

/// Slices in flight for connections of `slots` slots a direction: at most
/// `slots - 1` (see the module's "Room"), at most [`MAX_DEPTH`], at least 1.
pub fn pipeline_depth(slots: usize) -> usize {
    slots.saturating_sub(1).clamp(1, MAX_DEPTH)
}

/// The depth a pass runs at: `forced` when it is set (above 0; the config
/// refuses one of `slots` or more), else [`pipeline_depth`] of `slots`.
/// The planner and the simulator both ask this, so they pipeline alike.
pub fn depth_for(slots: usize, forced: usize) -> usize {
    if forced > 0 {
        forced
    } else {
        pipeline_depth(slots)
    }
}

/// Ticks between the starts of two consecutive slices of a pass that
/// spans `ticks` ticks a slice, `depth` slices in flight: `ceil(ticks /
/// depth)`, at least 1. Every pipelined pass (this module's, and the
/// hierarchical schedules') spaces its slices by it.
pub(crate) fn cadence(ticks: u64, depth: usize) -> u64 {
    ticks.div_ceil(depth.max(1) as u64).max(1)
}

/// Common inputs of a ring schedule.
#[derive(Debug, Clone, Copy)]
pub struct RingParams {
    /// This rank.
    pub rank: usize,
    /// Ranks in the ring.
    pub size: usize,
    /// Largest slice in elements (bounded by the slot size).
    pub slice: usize,
    /// Slices in flight (see "Pipelined slices"); 1 runs them one after
    /// the other. Must be below the connections' slots a direction.
    pub depth: usize,
}

impl RingParams {
    fn next(&self) -> usize {
        (self.rank + 1) % self.size
    }
    fn prev(&self) -> usize {
        (self.rank + self.size - 1) % self.size
    }
    /// Rank `rank - k` around the ring.
    fn back(&self, k: usize) -> usize {
        (self.rank + self.size - k % self.size) % self.size
    }
    fn slices(&self, longest: usize) -> usize {
        longest.div_ceil(self.slice.max(1))
    }
}

/// Collects steps, numbering the transfers of each slice so that a frame's
/// tag on the sender equals the tag its receiver expects, and orders them by
/// tick (see "Pipelined slices").
struct Emitter {
    p: RingParams,
    out: Timeline,
    /// Transfers per slice, to make tags unique across slices.
    per_slice: u32,
    /// Ticks between the starts of two consecutive slices.
    cadence: u64,
}

impl Emitter {
    /// An emitter for passes of `hops` hops a slice.
    fn new(p: RingParams, hops: u32) -> Emitter {
        Emitter {
            p,
            out: Timeline::default(),
            per_slice: hops,
            cadence: cadence(u64::from(hops), p.depth),
        }
    }

    fn finish(self) -> Schedule {
        self.out.into_schedule()
    }

    /// Emit `prim` as the `k`-th hop of slice `s`: it receives transfer
    /// `k - 1` and sends transfer `k`.
    #[allow(clippy::too_many_arguments)]
    fn hop(&mut self, prim: Prim, s: usize, k: u32, input: usize, output: usize, len: usize) {
        if len == 0 {
            return;
        }
        let base = (s as u32).wrapping_mul(self.per_slice);
        let tick = s as u64 * self.cadence + u64::from(k);
        self.out.at(
            tick,
            s as i64,
            0,
            Step {
                local: Operand::Input,
                prim,
                send_to: if prim.sends() { self.p.next() } else { NO_PEER },
                recv_from: if prim.receives() {
                    self.p.prev()
                } else {
                    NO_PEER
                },
                input,
                output,
                len,
                send_tag: base.wrapping_add(k),
                recv_tag: base.wrapping_add(k.wrapping_sub(1)),
                channel: 0,
            },
        );
    }
}

fn local_copy(count: usize) -> Schedule {
    let mut out = Schedule::default();
    if count > 0 {
        out.push(Step {
            local: Operand::Input,
            prim: Prim::Copy,
            send_to: NO_PEER,
            recv_from: NO_PEER,
            input: 0,
            output: 0,
            len: count,
            send_tag: 0,
            recv_tag: 0,
            channel: 0,
        });
    }
    out
}

/// Allreduce of `count` elements: reduce-scatter then allgather around the
/// ring; rank r ends the first phase owning piece r.
pub fn all_reduce(p: RingParams, count: usize) -> Schedule {
    let n = p.size;
    if n == 1 {
        return local_copy(count);
    }
    let piece = |c: usize| partition(count, n, c);
    let slices = p.slices(piece(0).1);
    let mut e = Emitter::new(p, 2 * (n as u32 - 1));
    for s in 0..slices {
        let at = |c: usize| slice_of(piece(c), s, p.slice);
        let mut k = 0u32;
        let (off, len) = at(p.back(1));
        e.hop(Prim::Send, s, k, off, off, len);
        for j in 2..n {
            k += 1;
            let (off, len) = at(p.back(j));
            e.hop(Prim::RecvReduceSend, s, k, off, off, len);
        }
        k += 1;
        let (off, len) = at(p.rank);
        e.hop(Prim::RecvReduceCopySend, s, k, off, off, len);
        for j in 1..n - 1 {
            k += 1;
            let (off, len) = at(p.back(j));
            e.hop(Prim::RecvCopySend, s, k, off, off, len);
        }
        k += 1;
        let (off, len) = at(p.back(n - 1));
        e.hop(Prim::Recv, s, k, off, off, len);
    }
    e.finish()
}

/// Reduce-scatter: input holds `n` blocks of `count`; rank r's output gets
/// the reduction of block r.
pub fn reduce_scatter(p: RingParams, count: usize) -> Schedule {
    let n = p.size;
    if n == 1 {
        return local_copy(count);
    }
    let slices = p.slices(count);
    let mut e = Emitter::new(p, n as u32 - 1);
    for s in 0..slices {
        let (rel, len) = slice_of((0, count), s, p.slice);
        let block = |c: usize| c * count + rel;
        let mut k = 0u32;
        e.hop(Prim::Send, s, k, block(p.back(1)), 0, len);
        for j in 2..n {
            k += 1;
            e.hop(Prim::RecvReduceSend, s, k, block(p.back(j)), 0, len);
        }
        k += 1;
        e.hop(Prim::RecvReduceCopy, s, k, block(p.rank), rel, len);
    }
    e.finish()
}

/// Allgather: each rank's `count` input elements land in block `rank` of
/// every rank's output.
pub fn all_gather(p: RingParams, count: usize) -> Schedule {
    let n = p.size;
    if n == 1 {
        return local_copy(count);
    }
    let slices = p.slices(count);
    let mut e = Emitter::new(p, n as u32 - 1);
    for s in 0..slices {
        let (rel, len) = slice_of((0, count), s, p.slice);
        let block = |c: usize| c * count + rel;
        let mut k = 0u32;
        e.hop(Prim::CopySend, s, k, rel, block(p.rank), len);
        for j in 1..n - 1 {
            k += 1;
            e.hop(Prim::RecvCopySend, s, k, 0, block(p.back(j)), len);
        }
        k += 1;
        e.hop(Prim::Recv, s, k, 0, block(p.back(n - 1)), len);
    }
    e.finish()
}

/// A chain through the ring in which each link carries one frame per slice
/// (tag = slice index). `first` and `last` are the primitives of the chain's
/// two ends, `middle` the one of every rank between them; `pos` is this
/// rank's place in the chain.
fn chain(p: RingParams, count: usize, pos: usize, ends: [Prim; 3]) -> Schedule {
    let n = p.size;
    let [first, middle, last] = ends;
    let prim = match pos {
        0 => first,
        x if x == n - 1 => last,
        _ => middle,
    };
    let mut out = Schedule::default();
    for s in 0..p.slices(count) {
        let (off, len) = slice_of((0, count), s, p.slice);
        let tag = s as u32;
        out.push(Step {
            local: Operand::Input,
            prim,
            send_to: if prim.sends() { p.next() } else { NO_PEER },
            recv_from: if prim.receives() { p.prev() } else { NO_PEER },
            input: off,
            output: off,
            len,
            send_tag: tag,
            recv_tag: tag,
            channel: 0,
        });
    }
    out
}

/// Broadcast from `root` along the chain root, root+1, ..., root-1; the
/// buffer is both input and output.
pub fn broadcast(p: RingParams, count: usize, root: usize) -> Schedule {
    let n = p.size;
    if n == 1 {
        return Schedule::default();
    }
    let pos = (p.rank + n - root) % n;
    chain(p, count, pos, [Prim::Send, Prim::RecvCopySend, Prim::Recv])
}

/// Reduce to `root` along the chain root+1, ..., root; the root's output
/// gets the result.
pub fn reduce(p: RingParams, count: usize, root: usize) -> Schedule {
    let n = p.size;
    if n == 1 {
        return local_copy(count);
    }
    let pos = (p.rank + n - root - 1) % n;
    chain(
        p,
        count,
        pos,
        [Prim::Send, Prim::RecvReduceSend, Prim::RecvReduceCopy],
    )
}

/// Point-to-point: `count` elements to (`sending`) or from `peer`, sliced.
pub fn point_to_point(p: RingParams, count: usize, peer: usize, sending: bool) -> Schedule {
    let mut out = Schedule::default();
    for s in 0..p.slices(count) {
        let (off, len) = slice_of((0, count), s, p.slice);
        let tag = s as u32;
        out.push(Step {
            local: Operand::Input,
            prim: if sending { Prim::Send } else { Prim::Recv },
            send_to: if sending { peer } else { NO_PEER },
            recv_from: if sending { NO_PEER } else { peer },
            input: off,
            output: off,
            len,
            send_tag: tag,
            recv_tag: tag,
            channel: 0,
        });
    }
    out
}

/// All-to-all: block `j` of rank r's input goes to block `r` of rank j's
/// output. Round k pairs each rank with r+k (to) and r-k (from), so every
/// rank sends and receives once per round and slices interleave: no rank
/// waits on a send that its receiver is not draining.
pub fn all_to_all(p: RingParams, block: usize) -> Schedule {
    let n = p.size;
    let mut out = local_copy_at(p.rank * block, block);
    let slices = p.slices(block);
    for k in 1..n {
        let to = (p.rank + k) % n;
        let from = p.back(k);
        for s in 0..slices {
            let (rel, len) = slice_of((0, block), s, p.slice);
            let tag = ((k as u32) << 20).wrapping_add(s as u32);
            out.push(Step {
                local: Operand::Input,
                prim: Prim::Send,
                send_to: to,
                recv_from: NO_PEER,
                input: to * block + rel,
                output: 0,
                len,
                send_tag: tag,
                recv_tag: 0,
                channel: 0,
            });
            out.push(Step {
                local: Operand::Input,
                prim: Prim::Recv,
                send_to: NO_PEER,
                recv_from: from,
                input: 0,
                output: from * block + rel,
                len,
                send_tag: 0,
                recv_tag: tag,
                channel: 0,
            });
        }
    }
    out
}

fn local_copy_at(offset: usize, count: usize) -> Schedule {
    let mut out = local_copy(count);
    for step in &mut out.steps {
        step.input = offset;
        step.output = offset;
    }
    out
}

/// A confirmation after a chain (a broadcast's or reduce's data steps):
/// `informed`, the one rank whose data came through every other rank, sends
/// an empty frame on around the ring, informed + 1, ..., informed - 1, each
/// passing it on once it has checked it. A rank that accepts it knows that
/// `informed`, and so every rank, ran its call.
pub fn confirmation(p: RingParams, informed: usize) -> Schedule {
    let n = p.size;
    let mut out = Schedule::default();
    if n == 1 {
        return out;
    }
    let d = (p.rank + n - informed) % n;
    if d > 0 {
        out.push(super::token(Prim::Recv, p.prev(), super::CONFIRM_TAG));
    }
    if d < n - 1 {
        out.push(super::token(Prim::Send, p.next(), super::CONFIRM_TAG));
    }
    out
}

/// Barrier: an empty token goes twice around the ring. After the first lap
/// rank 0 knows every rank arrived; the second lap tells the others.
pub fn barrier(p: RingParams) -> Schedule {
    let mut out = Schedule::default();
    if p.size == 1 {
        return out;
    }
    let step = |prim: Prim, lap: u32| Step {
        local: Operand::Input,
        prim,
        send_to: if prim.sends() { p.next() } else { NO_PEER },
        recv_from: if prim.receives() { p.prev() } else { NO_PEER },
        input: 0,
        output: 0,
        len: 0,
        send_tag: lap,
        recv_tag: lap,
        channel: 0,
    };
    let order: [(Prim, u32); 4] = if p.rank == 0 {
        [
            (Prim::Send, 0),
            (Prim::Recv, 0),
            (Prim::Send, 1),
            (Prim::Recv, 1),
        ]
    } else {
        [
            (Prim::Recv, 0),
            (Prim::Send, 0),
            (Prim::Recv, 1),
            (Prim::Send, 1),
        ]
    };
    for (prim, lap) in order {
        out.push(step(prim, lap));
    }
    out
}
