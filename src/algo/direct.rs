//! Direct allreduce for small messages: every rank talks to every other
//! rank at once, so latency is one or two steps whatever the rank count.
//!
//! Both schedules reduce the contributions of ranks `0, 1, ..., n-1` in
//! that order, as `(((x0 op x1) op x2) ...)`, on whichever rank reduces, so
//! float results are the same bits on every rank and do not depend on which
//! rank computed them. Each reducing rank needs its input after it has
//! started writing its output: in place, the caller runs these schedules on
//! a copy of the input (`coll::all_reduce` says so in its plan).
//!
//! Pipelining follows `Timeline` (algo/mod.rs): slice `s` is sent at tick `s`
//! and received at tick `s + 1`.

use super::ring::RingParams;
use super::{partition, slice_of, Operand, Prim, Schedule, Step, Timeline, NO_PEER};

/// The steps that reduce `(off, len)` of every rank's input into this
/// rank's output in rank order, receiving the frames tagged `tag` from the
/// peers.
fn reduce_in_rank_order(p: RingParams, off: usize, len: usize, tag: u32) -> Vec<Step> {
    (0..p.size)
        .map(|j| {
            if j == p.rank {
                let prim = if j == 0 { Prim::Copy } else { Prim::Reduce };
                Step::local(prim, Operand::Input, off, off, len)
            } else {
                let prim = if j == 0 {
                    Prim::Recv
                } else {
                    Prim::RecvReduceCopy
                };
                Step {
                    recv_from: j,
                    recv_tag: tag,
                    ..Step::local(prim, Operand::Output, off, off, len)
                }
            }
        })
        .collect()
}

/// Sends of `(off, len)` of `local` to every peer, nearest first.
fn send_to_all(p: RingParams, local: Operand, off: usize, len: usize, tag: u32) -> Vec<Step> {
    (1..p.size)
        .map(|k| Step {
            send_to: (p.rank + k) % p.size,
            send_tag: tag,
            ..Step::local(Prim::Send, local, off, off, len)
        })
        .collect()
}

/// One-shot allreduce: every rank sends its whole input (sliced) to every
/// peer, then reduces the `n` contributions of each slice in rank order.
pub fn one_shot(p: RingParams, count: usize) -> Schedule {
    let mut line = Timeline::default();
    for s in 0..count.div_ceil(p.slice.max(1)) {
        let (off, len) = slice_of((0, count), s, p.slice);
        let (t, tag) = (s as u64, s as u32);
        for step in send_to_all(p, Operand::Input, off, len, tag) {
            line.at(t, 0, 0, step);
        }
        for step in reduce_in_rank_order(p, off, len, tag) {
            line.at(t + 1, 1, 0, step);
        }
    }
    line.into_schedule()
}

/// Two-shot allreduce: rank `r` owns piece `r` of `partition(count, n, r)`;
/// each slice of piece `j` goes to rank `j`, which reduces it in rank order
/// (reduce-scatter), then sends the result to every peer (allgather).
///
/// Per tick `t`: receive the allgather frames of slice `t - 2`, reduce the
/// frames of slice `t - 1`, send its result, send the pieces of slice `t`.
/// Each link then carries two frames per tick, and each kind's receiver
/// runs at priority two below its sender (see `Timeline` (algo/mod.rs)).
pub fn two_shot(p: RingParams, count: usize) -> Schedule {
    let n = p.size;
    let piece = |j: usize| partition(count, n, j);
    let mut line = Timeline::default();
    for s in 0..piece(0).1.div_ceil(p.slice.max(1)) {
        let at = |j: usize| slice_of(piece(j), s, p.slice);
        let t = s as u64;
        let (scatter, gather) = ((s as u32).wrapping_mul(2), (s as u32).wrapping_mul(2) + 1);
        for k in 1..n {
            let j = (p.rank + k) % n;
            let (off, len) = at(j);
            if len > 0 {
                let step = Step {
                    send_to: j,
                    send_tag: scatter,
                    ..Step::local(Prim::Send, Operand::Input, off, off, len)
                };
                line.at(t, 3, 0, step);
            }
        }
        let (off, len) = at(p.rank);
        if len > 0 {
            for step in reduce_in_rank_order(p, off, len, scatter) {
                line.at(t + 1, 1, 0, step);
            }
            for step in send_to_all(p, Operand::Output, off, len, gather) {
                line.at(t + 1, 2, 0, step);
            }
        }
        for k in 1..n {
            let j = (p.rank + n - k) % n;
            let (off, len) = at(j);
            if len > 0 {
                let step = Step {
                    recv_from: j,
                    recv_tag: gather,
                    send_to: NO_PEER,
                    ..Step::local(Prim::Recv, Operand::Output, off, off, len)
                };
                line.at(t + 2, 0, 0, step);
            }
        }
    }
    line.into_schedule()
}

/// Recursive-doubling allreduce (the butterfly), for small messages on
/// several ranks: `log2 p` rounds (`p` the largest power of two up to the
/// rank count), in round `j` each rank exchanging its partial result with
/// the rank whose number differs in bit `j` and combining the two; one
/// message a rank a round, where one-shot sends `n - 1` at once (with more
/// ranks than cores each message costs its receiver a wake-up:
/// docs/performance-log.md, "TCP small messages"). Ranks past `p` fold in
/// first (rank `p + i` sends its input to rank `i`, which combines it) and
/// get the result back at the end: two rounds more.
///
/// The partners combine the same two partials in the two orders
/// (`mine op theirs`); every op of ferroccl is commutative bit for bit
/// (Min and Max included: `-0`/`+0` and NaN are resolved symmetrically,
/// `reduce::arith`), so every rank holds the same bits. They differ from
/// the other algorithms' bits where floats round differently.
///
/// Ticks: slice `s`'s fold at tick `s`, its round `j` sent at
/// `s + f + j` (`f`: 1 with a fold, else 0) and received at the next; its
/// result back at `s + f + rounds`. A link carries one frame per tick
/// and direction (each round has partners of its own; the fold and the
/// return go opposite ways), so the schedule cannot deadlock (`Timeline`).
pub fn recursive_doubling(p: RingParams, count: usize) -> Schedule {
    let (n, r) = (p.size, p.rank);
    let pow = if n <= 1 {
        1
    } else {
        1 << (usize::BITS - 1 - n.leading_zeros())
    };
    let extra = n - pow;
    let rounds = pow.trailing_zeros() as usize;
    let fold = usize::from(extra > 0);
    // Tags: a slice uses `rounds + 2`, one per round, the fold and the
    // return.
    let per_slice = rounds as u32 + 2;
    let mut line = Timeline::default();
    for s in 0..count.div_ceil(p.slice.max(1)) {
        let (off, len) = slice_of((0, count), s, p.slice);
        let t = s as u64;
        let tag = |k: u32| (s as u32).wrapping_mul(per_slice).wrapping_add(k);
        let (fold_tag, back_tag) = (tag(rounds as u32), tag(rounds as u32 + 1));
        if r >= pow {
            // Fold in, then wait for the result.
            let send = Step {
                send_to: r - pow,
                send_tag: fold_tag,
                ..Step::local(Prim::Send, Operand::Input, off, off, len)
            };
            line.at(t, 1, 0, send);
            let back = Step {
                recv_from: r - pow,
                recv_tag: back_tag,
                ..Step::local(Prim::Recv, Operand::Output, off, off, len)
            };
            line.at(t + (fold + rounds) as u64 + 1, 0, 0, back);
            continue;
        }
        if n == 1 {
            line.at(
                t,
                0,
                0,
                Step::local(Prim::Copy, Operand::Input, off, off, len),
            );
            continue;
        }
        // This rank's partial: its input, or what the fold left in the
        // output.
        let mut local = Operand::Input;
        if r < extra {
            let fold_in = Step {
                recv_from: r + pow,
                recv_tag: fold_tag,
                ..Step::local(Prim::RecvReduceCopy, Operand::Input, off, off, len)
            };
            line.at(t + 1, 0, 0, fold_in);
            local = Operand::Output;
        }
        for j in 0..rounds {
            let partner = r ^ (1 << j);
            let at = t + (fold + j) as u64;
            let send = Step {
                send_to: partner,
                send_tag: tag(j as u32),
                ..Step::local(Prim::Send, local, off, off, len)
            };
            line.at(at, 1, 0, send);
            let combine = Step {
                recv_from: partner,
                recv_tag: tag(j as u32),
                ..Step::local(Prim::RecvReduceCopy, local, off, off, len)
            };
            line.at(at + 1, 0, 0, combine);
            local = Operand::Output;
        }
        if r < extra {
            let back = Step {
                send_to: r + pow,
                send_tag: back_tag,
                ..Step::local(Prim::Send, local, off, off, len)
            };
            line.at(t + (fold + rounds) as u64, 1, 0, back);
        }
    }
    line.into_schedule()
}
