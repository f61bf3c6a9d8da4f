//! Several channels from one schedule: each step's elements cut into
//! `channels` contiguous pieces, piece `c` on channel `c`, so that
//! `channels` blocks (NCCL's channels) move a call's bytes at once, each
//! over FIFOs of its own.
//!
//! Why it is right: a send step and the receive step it feeds have the
//! same length (the frame says so, and the executors check it), so both
//! sides cut it the same way and piece `c` of a frame meets piece `c` of
//! its receive on channel `c`, in the same order as before. An element
//! goes through exactly the steps it went through on one channel, in the
//! same order, with the same operands: the result is the same bit for
//! bit. What the cut needs of the schedule is that two steps touching the
//! same elements cut them alike: ranges that are equal or apart, never
//! half over each other (else an element would be on two channels, which
//! run in no order between them). `encode` refuses a schedule where a
//! piece of one channel writes what another channel touches, so a
//! schedule that breaks this never reaches a device; the tests
//! (`exec::oracle`) show which algorithms keep it (all of the planner's,
//! at every count and rank count of their grid).
//!
//! Empty steps (the tokens of confirmations and barriers) stay whole on
//! channel 0.

use super::{Schedule, Step};

/// `schedule` over `channels` channels (at least 1; 1 gives it back as it
/// is). Every step of the input must be on channel 0.
pub fn split(schedule: &Schedule, channels: usize) -> Schedule {
    let channels = channels.max(1);
    if channels == 1 {
        return schedule.clone();
    }
    let mut steps = Vec::with_capacity(schedule.steps.len() * channels);
    for step in &schedule.steps {
        if step.len == 0 {
            steps.push(*step);
            continue;
        }
        let mut at = 0;
        for (c, len) in pieces(step.len, channels).enumerate() {
            if len == 0 {
                continue;
            }
            steps.push(Step {
                input: step.input + at,
                output: step.output + at,
                len,
                channel: step.channel * channels + c,
                ..*step
            });
            at += len;
        }
    }
    Schedule { steps }
}

/// The lengths of `len` cut into `channels` pieces, as equal as they go:
/// the first `len % channels` one longer.
pub fn pieces(len: usize, channels: usize) -> impl Iterator<Item = usize> {
    let (base, more) = (len / channels, len % channels);
    (0..channels).map(move |c| base + usize::from(c < more))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{ring, Prim};

    #[test]
    fn pieces_cover_the_step_in_order() {
        for len in 0..40 {
            for c in 1..6 {
                let p: Vec<usize> = pieces(len, c).collect();
                assert_eq!(p.len(), c);
                assert_eq!(p.iter().sum::<usize>(), len);
                assert!(p.windows(2).all(|w| w[0] >= w[1] && w[0] - w[1] <= 1));
            }
        }
    }

    /// Every element of every step lands on exactly one channel, at the
    /// same offsets in both buffers; the order of a channel's steps is
    /// the schedule's; empty steps stay on channel 0.
    #[test]
    fn a_split_keeps_every_element_once_and_the_order() {
        let p = ring::RingParams {
            rank: 1,
            size: 3,
            slice: 5,
            depth: 2,
        };
        let mut one = ring::all_reduce(p, 37);
        one.steps.push(crate::algo::token(Prim::Send, 0, 7));
        for c in [1, 2, 3, 8] {
            let split = split(&one, c);
            let mut next = 0;
            for step in &one.steps {
                let n = if step.len == 0 { 1 } else { c.min(step.len) };
                let parts = &split.steps[next..next + n];
                next += n;
                let mut at = 0;
                for (i, s) in parts.iter().enumerate() {
                    assert_eq!((s.input, s.output), (step.input + at, step.output + at));
                    assert_eq!(
                        (
                            s.prim,
                            s.local,
                            s.send_to,
                            s.recv_from,
                            s.send_tag,
                            s.recv_tag
                        ),
                        (
                            step.prim,
                            step.local,
                            step.send_to,
                            step.recv_from,
                            step.send_tag,
                            step.recv_tag
                        )
                    );
                    assert_eq!(s.channel, i, "{c} channels");
                    at += s.len;
                }
                assert_eq!(at, step.len);
            }
            assert_eq!(next, split.steps.len(), "{c} channels: steps left over");
        }
        assert_eq!(split(&one, 1), one);
    }
}
