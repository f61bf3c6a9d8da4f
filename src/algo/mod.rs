//! Schedules as plain data: which primitive each rank runs at each step, on
//! which part of which buffer, to and from which peer.
//!
//! Nothing here performs I/O, holds a clock or uses `unsafe`: a schedule for
//! any rank count can be built and checked on a laptop (see `sim` in the
//! tests). The executor (`exec`) interprets schedules over connections.

pub mod ring;

/// The primitive vocabulary (NCCL's, in snake case). "Input" is the caller's
/// send buffer, "output" its receive buffer (the same buffer in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prim {
    /// Send `input[input..+len]` to `send_to`.
    Send,
    /// Receive `len` elements from `recv_from` into `output[output..]`.
    Recv,
    /// Receive, combine with `input[input..]`, send the result on.
    RecvReduceSend,
    /// Receive, combine with `input[input..]`, store in `output[output..]`
    /// and send the result on.
    RecvReduceCopySend,
    /// Receive, store in `output[output..]` and send on.
    RecvCopySend,
    /// Receive, combine with `input[input..]`, store in `output[output..]`.
    RecvReduceCopy,
    /// Copy `input[input..]` to `output[output..]` and send it.
    CopySend,
    /// Copy `input[input..]` to `output[output..]` (no communication).
    Copy,
}

impl Prim {
    /// Whether the primitive receives a frame.
    pub fn receives(self) -> bool {
        !matches!(self, Prim::Send | Prim::CopySend | Prim::Copy)
    }

    /// Whether the primitive sends a frame.
    pub fn sends(self) -> bool {
        matches!(
            self,
            Prim::Send
                | Prim::RecvReduceSend
                | Prim::RecvReduceCopySend
                | Prim::RecvCopySend
                | Prim::CopySend
        )
    }

    /// Whether the primitive combines received data with input.
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Prim::RecvReduceSend | Prim::RecvReduceCopySend | Prim::RecvReduceCopy
        )
    }

    /// Whether the primitive writes the output buffer.
    pub fn writes_output(self) -> bool {
        matches!(
            self,
            Prim::Recv
                | Prim::RecvReduceCopySend
                | Prim::RecvCopySend
                | Prim::RecvReduceCopy
                | Prim::CopySend
                | Prim::Copy
        )
    }
}

/// Where a step's local operand lives: the data it sends, or combines with
/// what it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// `input[step.input..]`: the caller's contribution.
    Input,
    /// `output[step.output..]`: a partial result an earlier step stored
    /// (a tree node that combined one child and now adds the other).
    Output,
}

/// No peer (for primitives that do not send or do not receive).
pub const NO_PEER: usize = usize::MAX;

/// One step of one rank's schedule. Offsets and lengths count elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// What to do.
    pub prim: Prim,
    /// Where the local operand is read from.
    pub local: Operand,
    /// Peer to send to, or [`NO_PEER`].
    pub send_to: usize,
    /// Peer to receive from, or [`NO_PEER`].
    pub recv_from: usize,
    /// Offset in the input buffer.
    pub input: usize,
    /// Offset in the output buffer.
    pub output: usize,
    /// Elements moved.
    pub len: usize,
    /// Tag carried by the frame this step sends; the matching receive expects
    /// the same tag, which catches two ranks running different schedules.
    pub send_tag: u32,
    /// Tag this step expects on the frame it receives.
    pub recv_tag: u32,
}

/// A rank's whole schedule for one call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Steps in the order they run.
    pub steps: Vec<Step>,
}

impl Schedule {
    pub(crate) fn push(&mut self, step: Step) {
        self.steps.push(step);
    }
}

/// Split `count` elements into `parts` contiguous pieces whose sizes differ
/// by at most one (the first `count % parts` pieces get the extra element).
/// Returns `(offset, len)` of piece `index`.
pub fn partition(count: usize, parts: usize, index: usize) -> (usize, usize) {
    let base = count / parts;
    let extra = count % parts;
    let offset = index * base + index.min(extra);
    let len = base + usize::from(index < extra);
    (offset, len)
}

/// The part of a piece `(offset, len)` that slice `s` of `slice` elements
/// covers; empty past the end.
pub fn slice_of(piece: (usize, usize), s: usize, slice: usize) -> (usize, usize) {
    let start = (s * slice).min(piece.1);
    let len = slice.min(piece.1 - start);
    (piece.0 + start, len)
}

#[cfg(test)]
pub(crate) mod sim;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_covers_everything_once() {
        for count in [0usize, 1, 2, 7, 8, 9, 1000003] {
            for parts in 1..=9 {
                let mut next = 0;
                for i in 0..parts {
                    let (off, len) = partition(count, parts, i);
                    assert_eq!(off, next);
                    assert!(len == count / parts || len == count / parts + 1);
                    next += len;
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn slices_cover_a_piece() {
        for len in [0usize, 1, 5, 64, 65] {
            let slice = 16;
            let n = len.div_ceil(slice).max(1);
            let mut total = 0;
            for s in 0..n + 2 {
                let (off, l) = slice_of((100, len), s, slice);
                assert!(l <= slice);
                if l > 0 {
                    assert_eq!(off, 100 + total);
                }
                total += l;
            }
            assert_eq!(total, len);
        }
    }
}
