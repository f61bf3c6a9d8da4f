//! Algorithms written by users: a builder over the same primitives the
//! library's own schedules use, the checker that must accept an algorithm
//! before a communicator runs it, and the step from an algorithm's
//! count-free steps to the [`Schedule`] of one call.
//!
//! A user algorithm implements allreduce, allgather or reduce-scatter
//! ([`Collective`]). It names pieces of the buffer as chunk ranges (`chunks
//! a..b of k`: pieces `a` to `b - 1` of `partition(count, k, _)`; for an
//! allgather or reduce-scatter, of each rank's block of the in-place
//! layout, see [`Collective`]), so one description serves every element
//! count. It claims a set of rank counts,
//! with the steps of every rank for each. Pure data, like the rest of
//! `algo`: no I/O (the text format is parsed from a string, `algo::text`;
//! reading the file is `config`'s business), no clock, no `unsafe`.
//!
//! The checker (see [`UserAlgorithm::check`]) runs in two parts: a matching
//! check over frames (every send has its receive with the same length, no
//! deadlock on FIFOs of two slots, nothing left unreceived), cheap enough
//! for thousands of ranks, and a check of values through the functional
//! simulator (`algo::sim`), in place and out of place, sliced as a call is,
//! against the definition of the collective computed apart in f64.

//!
//! The module is cut where the work is: this file holds the public face
//! (the step vocabulary, the builder, the errors, and what a communicator
//! keeps: [`Checked`], [`Installed`]); `check` the checker; `lower` the
//! step from count-free steps to a call's [`Schedule`]; [`examples`] the
//! algorithms written with the builder.

mod check;
pub mod examples;
mod lower;
#[cfg(test)]
mod tests;

pub use check::CHECK_SLOTS;

use super::{partition, Operand, Prim, Schedule};
use lower::{instantiate, Place};
use std::collections::BTreeMap;

/// The collective a user algorithm implements.
///
/// Chunks of an allreduce cut its buffer of `count` elements. Chunks of an
/// allgather or a reduce-scatter cut the buffer of `n * count` elements of
/// NCCL's in-place layout, where rank `r`'s own block is block `r`
/// (elements `r * count .. (r + 1) * count`): an allgather's input is that
/// block of its output, a reduce-scatter's output is that block of its
/// input. There `of` is a multiple of `n`, and chunk `p` is sub-piece
/// `p % (of / n)` of block `p / (of / n)`, cut by
/// `partition(count, of / n, _)`: chunk boundaries fall on block
/// boundaries at every count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank ends with the reduction of every rank's buffer; the input
    /// and output have the same length.
    AllReduce,
    /// Rank `r`'s input (`count` elements) lands in block `r` of every
    /// rank's output (`n * count`). Steps read the input only inside the
    /// rank's own block.
    AllGather,
    /// Rank `r`'s output (`count` elements) is the reduction of block `r`
    /// of every rank's input (`n * count`). Steps write (and read) the
    /// output only inside the rank's own block.
    ReduceScatter,
}

impl Collective {
    /// Every collective a user algorithm may implement.
    pub const ALL: [Collective; 3] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
    ];

    /// Its name in the text format and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter => "reduce_scatter",
        }
    }

    /// The collective a text name means: its [`Collective::name`], in any
    /// case, with `-` and `_` ignored (`all_gather`, `ReduceScatter`).
    pub fn from_name(name: &str) -> Option<Collective> {
        let key = |s: &str| -> String {
            s.chars()
                .filter(|c| !matches!(c, '-' | '_'))
                .map(|c| c.to_ascii_lowercase())
                .collect()
        };
        Collective::ALL
            .into_iter()
            .find(|c| key(c.name()) == key(name))
    }

    /// Blocks the chunk coordinates cut on `n` ranks: 1 for an allreduce,
    /// `n` for an allgather or a reduce-scatter.
    pub fn blocks(self, n: usize) -> usize {
        match self {
            Collective::AllReduce => 1,
            Collective::AllGather | Collective::ReduceScatter => n,
        }
    }

    /// Elements of one rank's input and output for a call of `count` (an
    /// allreduce's buffer, an allgather's input block, a reduce-scatter's
    /// output block) on `n` ranks.
    pub fn extents(self, count: usize, n: usize) -> (usize, usize) {
        match self {
            Collective::AllReduce => (count, count),
            Collective::AllGather => (count, count.saturating_mul(n)),
            Collective::ReduceScatter => (count.saturating_mul(n), count),
        }
    }
}

impl std::fmt::Display for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A contiguous range of pieces of the buffer: pieces `first..end` of
/// `partition(count, of, _)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chunks {
    /// First piece.
    pub first: usize,
    /// One past the last piece.
    pub end: usize,
    /// Pieces the buffer is cut into.
    pub of: usize,
}

impl Chunks {
    /// Piece `index` of `of`.
    pub fn one(index: usize, of: usize) -> Chunks {
        Chunks {
            first: index,
            end: index.saturating_add(1),
            of,
        }
    }

    /// Pieces `first..end` of `of`.
    pub fn range(first: usize, end: usize, of: usize) -> Chunks {
        Chunks { first, end, of }
    }

    /// `(offset, len)` in elements of a buffer of `count` elements; only
    /// `(0, 0)` for a range [`Chunks::problem`] refuses.
    pub fn span(self, count: usize) -> (usize, usize) {
        if self.problem().is_some() {
            return (0, 0);
        }
        let (start, _) = partition(count, self.of, self.first);
        let (last, last_len) = partition(count, self.of, self.end - 1);
        (start, last + last_len - start)
    }

    /// Why the range names no piece of a buffer, if it does not.
    pub fn problem(self) -> Option<String> {
        if self.of == 0 {
            Some("a buffer cut into 0 chunks".into())
        } else if self.of > MAX_CHUNKS {
            Some(format!(
                "a buffer cut into {} chunks (at most {MAX_CHUNKS})",
                self.of
            ))
        } else if self.first >= self.end {
            Some(format!(
                "chunks {}..{} is empty (the first must be below the end)",
                self.first, self.end
            ))
        } else if self.end > self.of {
            Some(format!(
                "chunks {}..{} of {} run past the last chunk ({})",
                self.first,
                self.end,
                self.of,
                self.of - 1
            ))
        } else {
            None
        }
    }
}

impl std::fmt::Display for Chunks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.end == self.first + 1 {
            write!(f, "chunk {} of {}", self.first, self.of)
        } else {
            write!(f, "chunks {}..{} of {}", self.first, self.end, self.of)
        }
    }
}

/// Most chunks a buffer may be cut into: the value check runs on buffers
/// of about twice this many elements.
pub const MAX_CHUNKS: usize = 1 << 20;

/// One step of a user algorithm, for any element count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserStep {
    /// The primitive.
    pub prim: Prim,
    /// Where the local operand is read from (ignored by `recv` and
    /// `recv_copy_send`, which have none).
    pub local: Operand,
    /// Peer the step receives from (primitives that receive).
    pub from: Option<usize>,
    /// Peer the step sends to (primitives that send).
    pub to: Option<usize>,
    /// The piece of the buffers it works on, at the same place in the
    /// input and the output.
    pub chunks: Chunks,
    /// Line of the text the step came from, for errors (None from the
    /// builder).
    pub line: Option<usize>,
}

impl UserStep {
    /// Whether the step reads the caller's input.
    pub fn reads_input(&self) -> bool {
        self.local == Operand::Input && !matches!(self.prim, Prim::Recv | Prim::RecvCopySend)
    }

    /// Whether the step reads or writes the output.
    pub fn touches_output(&self) -> bool {
        self.prim.writes_output() || self.local == Operand::Output
    }

    /// What is wrong with the step of `collective` on `size` ranks at
    /// `rank`, if anything.
    fn problem(&self, rank: usize, size: usize, collective: Collective) -> Option<String> {
        let name = prim_name(self.prim);
        if let Some(p) = self.chunks.problem() {
            return Some(p);
        }
        let blocks = collective.blocks(size);
        if !self.chunks.of.is_multiple_of(blocks) {
            return Some(format!(
                "{} cuts the {blocks} blocks of this {collective} unevenly (the chunk count \
                 must be a multiple of the {size} ranks)",
                self.chunks
            ));
        }
        let per = self.chunks.of / blocks;
        let own = rank * per..(rank + 1) * per;
        let inside = own.contains(&self.chunks.first) && self.chunks.end <= own.end;
        if !inside {
            let own_text = Chunks::range(own.start, own.end, self.chunks.of);
            match collective {
                Collective::AllGather if self.reads_input() => {
                    return Some(format!(
                    "{name} reads the input at {} outside rank {rank}'s own block ({own_text}): \
                         an allgather's input is only its own block (add 'using output' to read \
                         what the output holds)",
                    self.chunks
                ))
                }
                Collective::ReduceScatter if self.touches_output() => {
                    return Some(format!(
                        "{name} {} the output at {} outside rank {rank}'s own block ({own_text}): \
                         a reduce-scatter's output is only its own block",
                        if self.prim.writes_output() {
                            "writes"
                        } else {
                            "reads"
                        },
                        self.chunks
                    ))
                }
                _ => {}
            }
        }
        for (needed, peer, word) in [
            (self.prim.receives(), self.from, "from"),
            (self.prim.sends(), self.to, "to"),
        ] {
            match (needed, peer) {
                (true, None) => return Some(format!("{name} needs a peer '{word}'")),
                (false, Some(_)) => return Some(format!("{name} takes no peer '{word}'")),
                (true, Some(p)) if p >= size => {
                    return Some(format!(
                        "peer {p} ('{word}') is not a rank of {size} (0..{})",
                        size - 1
                    ))
                }
                (true, Some(p)) if p == rank => {
                    return Some(format!("peer '{word}' {p} is the rank itself"))
                }
                _ => {}
            }
        }
        let reads_local = !matches!(self.prim, Prim::Recv | Prim::RecvCopySend);
        let output_allowed = matches!(
            self.prim,
            Prim::Send | Prim::RecvReduceSend | Prim::RecvReduceCopySend | Prim::RecvReduceCopy
        );
        if self.local == Operand::Output && !output_allowed {
            return Some(if reads_local {
                format!(
                    "{name} reads its operand from the input only ('using output' is not allowed)"
                )
            } else {
                format!("{name} has no local operand ('using' does not apply)")
            });
        }
        None
    }
}

/// The name of a primitive in the text format (the variant's, in snake
/// case).
pub fn prim_name(prim: Prim) -> &'static str {
    match prim {
        Prim::Send => "send",
        Prim::Recv => "recv",
        Prim::RecvReduceSend => "recv_reduce_send",
        Prim::RecvReduceCopySend => "recv_reduce_copy_send",
        Prim::RecvCopySend => "recv_copy_send",
        Prim::RecvReduceCopy => "recv_reduce_copy",
        Prim::CopySend => "copy_send",
        Prim::Copy => "copy",
        Prim::Reduce => "reduce",
    }
}

/// The primitive a text name means.
pub fn prim_from_name(name: &str) -> Option<Prim> {
    Prim::ALL.into_iter().find(|p| prim_name(*p) == name)
}

/// The steps of one rank, written in order: what the builder closure of
/// [`UserAlgorithm::build`] is handed.
#[derive(Debug)]
pub struct RankSteps {
    rank: usize,
    size: usize,
    steps: Vec<UserStep>,
}

impl RankSteps {
    /// The rank being written.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The rank count being written.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Append any step.
    pub fn step(
        &mut self,
        prim: Prim,
        from: Option<usize>,
        to: Option<usize>,
        chunks: Chunks,
    ) -> &mut Self {
        self.steps.push(UserStep {
            prim,
            local: Operand::Input,
            from,
            to,
            chunks,
            line: None,
        });
        self
    }

    /// Read the local operand of the last step from the output (a partial
    /// result an earlier step stored there) instead of the input.
    pub fn using_output(&mut self) -> &mut Self {
        if let Some(last) = self.steps.last_mut() {
            last.local = Operand::Output;
        }
        self
    }

    /// Send `chunks` of the input to `to`.
    pub fn send(&mut self, to: usize, chunks: Chunks) -> &mut Self {
        self.step(Prim::Send, None, Some(to), chunks)
    }

    /// Receive `chunks` from `from` into the output.
    pub fn recv(&mut self, from: usize, chunks: Chunks) -> &mut Self {
        self.step(Prim::Recv, Some(from), None, chunks)
    }

    /// Receive from `from`, combine with the local operand, send to `to`.
    pub fn recv_reduce_send(&mut self, from: usize, to: usize, chunks: Chunks) -> &mut Self {
        self.step(Prim::RecvReduceSend, Some(from), Some(to), chunks)
    }

    /// Receive from `from`, combine, store in the output and send to `to`.
    pub fn recv_reduce_copy_send(&mut self, from: usize, to: usize, chunks: Chunks) -> &mut Self {
        self.step(Prim::RecvReduceCopySend, Some(from), Some(to), chunks)
    }

    /// Receive from `from`, store in the output and send to `to`.
    pub fn recv_copy_send(&mut self, from: usize, to: usize, chunks: Chunks) -> &mut Self {
        self.step(Prim::RecvCopySend, Some(from), Some(to), chunks)
    }

    /// Receive from `from`, combine with the local operand, store in the
    /// output.
    pub fn recv_reduce_copy(&mut self, from: usize, chunks: Chunks) -> &mut Self {
        self.step(Prim::RecvReduceCopy, Some(from), None, chunks)
    }

    /// Copy the input to the output and send it to `to`.
    pub fn copy_send(&mut self, to: usize, chunks: Chunks) -> &mut Self {
        self.step(Prim::CopySend, None, Some(to), chunks)
    }

    /// Copy the input to the output.
    pub fn copy(&mut self, chunks: Chunks) -> &mut Self {
        self.step(Prim::Copy, None, None, chunks)
    }

    /// `output = output op input` (no communication).
    pub fn reduce(&mut self, chunks: Chunks) -> &mut Self {
        self.step(Prim::Reduce, None, None, chunks)
    }
}

/// Why a user algorithm was refused: where (rank count, rank, step index
/// and, from text, line) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserError {
    /// The rank count being checked.
    pub size: Option<usize>,
    /// The rank whose step is wrong.
    pub rank: Option<usize>,
    /// Index of the step in that rank's list.
    pub step: Option<usize>,
    /// Line of the text, where the algorithm came from text.
    pub line: Option<usize>,
    /// What is wrong.
    pub what: String,
}

impl UserError {
    pub(crate) fn at_line(line: usize, what: impl Into<String>) -> UserError {
        UserError {
            size: None,
            rank: None,
            step: None,
            line: Some(line),
            what: what.into(),
        }
    }

    fn general(size: usize, what: impl Into<String>) -> UserError {
        UserError {
            size: Some(size),
            rank: None,
            step: None,
            line: None,
            what: what.into(),
        }
    }

    fn at_step(size: usize, rank: usize, step: usize, s: &UserStep, what: String) -> UserError {
        UserError {
            size: Some(size),
            rank: Some(rank),
            step: Some(step),
            line: s.line,
            what,
        }
    }
}

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut place = Vec::new();
        if let Some(line) = self.line {
            place.push(format!("line {line}"));
        }
        if let Some(size) = self.size {
            place.push(format!("on {size} ranks"));
        }
        if let Some(rank) = self.rank {
            place.push(format!("rank {rank}"));
        }
        if let Some(step) = self.step {
            place.push(format!("step {step}"));
        }
        if place.is_empty() {
            f.write_str(&self.what)
        } else {
            write!(f, "{}: {}", place.join(", "), self.what)
        }
    }
}

impl std::error::Error for UserError {}

/// An algorithm written by a user: a collective, and for each rank count
/// it claims, every rank's steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserAlgorithm {
    /// Its name, for logs.
    pub name: String,
    /// The collective it implements.
    pub collective: Collective,
    /// Rank count -> each rank's steps.
    pub(crate) sizes: BTreeMap<usize, Vec<Vec<UserStep>>>,
}

impl UserAlgorithm {
    /// An algorithm with no rank counts yet.
    pub fn new(name: impl Into<String>, collective: Collective) -> UserAlgorithm {
        UserAlgorithm {
            name: name.into(),
            collective,
            sizes: BTreeMap::new(),
        }
    }

    /// Write the algorithm for every rank count of `sizes` by calling
    /// `write(&mut steps)` once per rank (`steps.rank()`, `steps.size()`).
    pub fn build(
        name: impl Into<String>,
        collective: Collective,
        sizes: impl IntoIterator<Item = usize>,
        write: impl Fn(&mut RankSteps),
    ) -> UserAlgorithm {
        let mut algo = UserAlgorithm::new(name, collective);
        for n in sizes {
            algo.add_size(n, &write);
        }
        algo
    }

    /// Add (or replace) rank count `n`, written by `write`.
    pub fn add_size(&mut self, n: usize, write: impl Fn(&mut RankSteps)) {
        let ranks = (0..n)
            .map(|rank| {
                let mut steps = RankSteps {
                    rank,
                    size: n,
                    steps: Vec::new(),
                };
                write(&mut steps);
                steps.steps
            })
            .collect();
        self.sizes.insert(n, ranks);
    }

    /// Set rank count `n`'s steps directly (one list per rank).
    pub fn set_size(&mut self, n: usize, ranks: Vec<Vec<UserStep>>) {
        self.sizes.insert(n, ranks);
    }

    /// The rank counts it claims, in increasing order.
    pub fn sizes(&self) -> impl Iterator<Item = usize> + '_ {
        self.sizes.keys().copied()
    }

    /// Rank `rank`'s steps on `n` ranks, if `n` is claimed.
    pub fn steps(&self, n: usize, rank: usize) -> Option<&[UserStep]> {
        self.sizes
            .get(&n)
            .and_then(|ranks| ranks.get(rank))
            .map(Vec::as_slice)
    }

    /// The algorithm restricted to rank count `n` (what a communicator
    /// keeps), or an error saying which counts it claims.
    pub fn for_size(&self, n: usize) -> Result<UserAlgorithm, UserError> {
        let ranks = self.sizes.get(&n).ok_or_else(|| {
            let claimed: Vec<String> = self.sizes().map(|s| s.to_string()).collect();
            UserError::general(
                n,
                format!(
                    "'{}' has no schedule for {n} ranks (it claims: {})",
                    self.name,
                    if claimed.is_empty() {
                        "none".to_string()
                    } else {
                        claimed.join(", ")
                    }
                ),
            )
        })?;
        let mut one = UserAlgorithm::new(self.name.clone(), self.collective);
        one.sizes.insert(n, ranks.clone());
        Ok(one)
    }
}

/// A user algorithm restricted to one rank count and accepted by the
/// checker there: what a communicator keeps.
#[derive(Debug, Clone)]
pub struct Checked {
    algo: UserAlgorithm,
    size: usize,
    verdict: Verdict,
    widths: Vec<(usize, usize)>,
    source: String,
}

impl Checked {
    /// Check `algo` on `size` ranks; `source` says where it came from (a
    /// file, the API) for logs.
    pub fn new(algo: &UserAlgorithm, size: usize, source: String) -> Result<Checked, UserError> {
        let algo = algo.for_size(size)?;
        algo.check_matching(size)?;
        let verdict = algo.check_values(size)?;
        let widths = algo.widths(size);
        Ok(Checked {
            algo,
            size,
            verdict,
            widths,
            source,
        })
    }

    /// The algorithm's name.
    pub fn name(&self) -> &str {
        &self.algo.name
    }

    /// The collective it implements.
    pub fn collective(&self) -> Collective {
        self.algo.collective
    }

    /// Where it came from (a file, the API).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// What the checker found.
    pub fn verdict(&self) -> Verdict {
        self.verdict
    }

    /// Rank `rank`'s schedule for a call of `count` elements (an
    /// allreduce's buffer, an allgather's input, a reduce-scatter's
    /// output) in frames of at most `slice`. Its offsets are of the
    /// separate input and output; in place, an allgather's input and a
    /// reduce-scatter's output start at block `rank` of the one buffer
    /// (where the checker's in-place run put them).
    pub fn schedule(&self, rank: usize, count: usize, slice: usize) -> Schedule {
        let steps = self.algo.steps(self.size, rank).unwrap_or(&[]);
        let at = Place {
            collective: self.algo.collective,
            size: self.size,
            rank,
            whole: false,
        };
        instantiate(steps, at, count, slice, &self.widths).0
    }
}

/// The checked user algorithms of a communicator, at most one per
/// collective.
#[derive(Debug, Clone, Default)]
pub struct Installed {
    list: Vec<Checked>,
}

impl Installed {
    /// The one that runs `collective`'s calls, if any.
    #[inline]
    pub fn get(&self, collective: Collective) -> Option<&Checked> {
        self.list.iter().find(|c| c.collective() == collective)
    }

    /// Add `checked` (replacing one for the same collective).
    pub fn add(&mut self, checked: Checked) {
        self.list.retain(|c| c.collective() != checked.collective());
        self.list.push(checked);
    }

    /// No user algorithm at all.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Every one, in the order added.
    pub fn iter(&self) -> impl Iterator<Item = &Checked> {
        self.list.iter()
    }
}

/// What the checker found besides "correct".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The result is right in place too (else a communicator runs an
    /// allreduce in place from a copy of the input, and refuses in-place
    /// allgathers and reduce-scatters with an error that says so).
    pub in_place: bool,
}
