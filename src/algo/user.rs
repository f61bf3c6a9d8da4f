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

use super::{partition, Operand, Prim, Schedule, Step, NO_PEER};
use std::collections::{BTreeMap, HashMap, VecDeque};

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
    /// It runs the frames in the order a call runs them ([`run_order`]):
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

    /// Every `(end - first, of)` the steps on `n` ranks use.
    fn widths(&self, n: usize) -> Vec<(usize, usize)> {
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
                    if let Err(e) =
                        super::sim::run(&schedules, &whole_inputs, &mut outputs, place, CHECK_SLOTS)
                    {
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

/// FIFO depth the checker uses: the fewest slots a connection may have
/// (`Config::validate` refuses fewer). Frames carry no data between ranks
/// that wait on each other, so a schedule that finishes with this many
/// finishes with more.
pub const CHECK_SLOTS: usize = 2;

/// A frame in the matching check: the sender's step index, the chunks it
/// carries and its number within the step.
type Frame = (usize, Chunks, usize);

/// Most steps of one run group ([`run_groups`]): bounds the check's cost
/// on long lists of independent steps.
const MAX_GROUP: usize = 64;

/// Blocks of `blocks` that `chunks` touches (1 for an allreduce's).
fn blocks_touched(chunks: Chunks, blocks: usize) -> usize {
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
fn run_groups(steps: &[UserStep], blocks: usize) -> Vec<(usize, usize)> {
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
fn run_order(
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
struct Place {
    collective: Collective,
    size: usize,
    rank: usize,
    whole: bool,
}

/// The pieces of the buffer (offset, length) that `chunks` names in the
/// pass `(base, m)` (elements `base..base + m` of each block of `count`):
/// one for an allreduce; for an allgather or reduce-scatter one per block
/// the range touches, those that meet merged (a single pass covers whole
/// blocks, so a range over several blocks stays one piece). Empty pieces
/// are left out; a range of no chunks problem, or of a cut uneven over the
/// blocks, yields nothing (the checker refuses it first).
fn segments(
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
fn instantiate(
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

/// Example algorithms written with the builder, as a user would.
pub mod examples {
    use super::{Chunks, Collective, RankSteps, UserAlgorithm};

    /// Recursive halving-doubling allreduce (Rabenseifner's): on `n = 2^m`
    /// ranks the buffer is cut into `n` chunks; `m` rounds of recursive
    /// halving (exchange half of what a rank still reduces with the rank
    /// whose number differs in one bit, largest bit first) leave rank `r`
    /// with chunk `r` reduced, and `m` rounds of recursive doubling (the
    /// same partners in reverse) gather every chunk everywhere: `2m`
    /// messages a rank, each rank sending `2 (n - 1) / n` of the buffer,
    /// like the ring. Claims the powers of two up to `max_ranks`; other
    /// rank counts are refused (the folding of extra ranks that
    /// `recursive_doubling` does is not written here).
    pub fn halving_doubling(max_ranks: usize) -> UserAlgorithm {
        let sizes = (0..usize::BITS)
            .map(|b| 1usize << b)
            .take_while(|&n| n <= max_ranks);
        UserAlgorithm::build(
            "halving_doubling",
            Collective::AllReduce,
            sizes,
            halving_doubling_rank,
        )
    }

    fn halving_doubling_rank(b: &mut RankSteps) {
        let (n, r) = (b.size(), b.rank());
        if n == 1 {
            b.copy(Chunks::one(0, 1));
            return;
        }
        // The chunks this rank still reduces: [lo, hi).
        let (mut lo, mut hi) = (0, n);
        let mut mask = n / 2;
        let mut first = true;
        while mask > 0 {
            let partner = r ^ mask;
            let mid = (lo + hi) / 2;
            let (keep, give) = if r & mask == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            b.send(partner, Chunks::range(give.0, give.1, n));
            if !first {
                b.using_output();
            }
            b.recv_reduce_copy(partner, Chunks::range(keep.0, keep.1, n));
            if !first {
                b.using_output();
            }
            (lo, hi) = keep;
            first = false;
            mask /= 2;
        }
        // Now [lo, hi) == [r, r + 1): gather by doubling, smallest bit
        // first.
        let mut mask = 1;
        while mask < n {
            let partner = r ^ mask;
            let width = hi - lo;
            let theirs = if r & mask == 0 {
                (hi, hi + width)
            } else {
                (lo - width, lo)
            };
            b.send(partner, Chunks::range(lo, hi, n)).using_output();
            b.recv(partner, Chunks::range(theirs.0, theirs.1, n));
            (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
            mask *= 2;
        }
    }

    /// The powers of two up to `max_ranks`.
    fn powers_of_two(max_ranks: usize) -> impl Iterator<Item = usize> {
        (0..usize::BITS)
            .map(|b| 1usize << b)
            .take_while(move |&n| n <= max_ranks)
    }

    /// Recursive-doubling allgather on `n = 2^m` ranks: chunk `b` of `n`
    /// is rank `b`'s block. Rank `r` copies its input into its block and
    /// sends it to `r ^ 1`; in round `k` it sends the `2^k` blocks it has
    /// gathered (those of its group of `2^k` ranks) to `r ^ 2^k`, and
    /// receives that rank's: `m` messages a rank, each rank sending
    /// `(n - 1) / n` of the output, like the ring. Claims the powers of
    /// two up to `max_ranks`.
    pub fn recursive_doubling_allgather(max_ranks: usize) -> UserAlgorithm {
        UserAlgorithm::build(
            "recursive_doubling_allgather",
            Collective::AllGather,
            powers_of_two(max_ranks),
            |b| {
                let (n, r) = (b.size(), b.rank());
                if n == 1 {
                    b.copy(Chunks::one(0, 1));
                    return;
                }
                let mut mask = 1;
                while mask < n {
                    let partner = r ^ mask;
                    // The group of `mask` ranks this rank's data covers.
                    let mine = r & !(mask - 1);
                    let theirs = partner & !(mask - 1);
                    if mask == 1 {
                        // The own block comes from the input, and is kept.
                        b.copy_send(partner, Chunks::one(r, n));
                    } else {
                        b.send(partner, Chunks::range(mine, mine + mask, n))
                            .using_output();
                    }
                    b.recv(partner, Chunks::range(theirs, theirs + mask, n));
                    mask *= 2;
                }
            },
        )
    }

    /// Pairwise-exchange reduce-scatter on any `n`: chunk `b` of `n` is
    /// block `b`. Rank `r` copies block `r` of its input into its output,
    /// then in round `k` (1 to `n - 1`) sends block `r + k` of its input to
    /// rank `r + k` and adds what rank `r - k` sends it (block `r` of that
    /// rank's input) to its output (ranks mod `n`): `n - 1` messages a
    /// rank of one block each, `(n - 1) / n` of the input, like the ring,
    /// with no partial result kept outside the rank's own block (which
    /// the coordinates of a reduce-scatter require: recursive halving,
    /// which keeps partial sums of other blocks, cannot be written).
    /// Claims `1..=max_ranks`.
    pub fn pairwise_reduce_scatter(max_ranks: usize) -> UserAlgorithm {
        UserAlgorithm::build(
            "pairwise_reduce_scatter",
            Collective::ReduceScatter,
            1..=max_ranks,
            pairwise_reduce_scatter_rank,
        )
    }

    /// Rank `b.rank()`'s steps of [`pairwise_reduce_scatter`] (for
    /// [`UserAlgorithm::add_size`] at larger rank counts).
    pub fn pairwise_reduce_scatter_rank(b: &mut RankSteps) {
        let (n, r) = (b.size(), b.rank());
        b.copy(Chunks::one(r, n));
        for k in 1..n {
            let to = (r + k) % n;
            let from = (r + n - k) % n;
            b.send(to, Chunks::one(to, n));
            b.recv_reduce_copy(from, Chunks::one(r, n)).using_output();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::examples::halving_doubling;
    use super::*;

    /// The torus shipped as text (examples/algorithms/torus.algo, 1..16
    /// ranks; tests/user_algorithms.rs checks 1..64 from the script).
    const TORUS: &str = include_str!("../../examples/algorithms/torus.algo");

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
    const BRUCK: &str = include_str!("../../examples/algorithms/bruck.algo");

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
}
