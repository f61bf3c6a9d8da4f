//! Algorithms written by users: a builder over the same primitives the
//! library's own schedules use, the checker that must accept an algorithm
//! before a communicator runs it, and the step from an algorithm's
//! count-free steps to the [`Schedule`] of one call.
//!
//! A user algorithm names pieces of the buffer as chunk ranges (`chunks a..b
//! of k`: pieces `a` to `b - 1` of `partition(count, k, _)`), so one
//! description serves every element count. It claims a set of rank counts,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank ends with the reduction of every rank's buffer; the input
    /// and output have the same length.
    AllReduce,
}

impl Collective {
    /// Its name in the text format and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
        }
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
    /// What is wrong with the step on `size` ranks at `rank`, if anything.
    fn problem(&self, rank: usize, size: usize) -> Option<String> {
        let name = prim_name(self.prim);
        if let Some(p) = self.chunks.problem() {
            return Some(p);
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

/// Every primitive, for [`prim_from_name`].
const PRIMS: [Prim; 9] = [
    Prim::Send,
    Prim::Recv,
    Prim::RecvReduceSend,
    Prim::RecvReduceCopySend,
    Prim::RecvCopySend,
    Prim::RecvReduceCopy,
    Prim::CopySend,
    Prim::Copy,
    Prim::Reduce,
];

/// The primitive a text name means.
pub fn prim_from_name(name: &str) -> Option<Prim> {
    PRIMS.into_iter().find(|p| prim_name(*p) == name)
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
    pub fn check_matching(&self, n: usize) -> Result<(), UserError> {
        let ranks = self.ranks(n)?;
        for (r, steps) in ranks.iter().enumerate() {
            for (i, s) in steps.iter().enumerate() {
                if let Some(what) = s.problem(r, n) {
                    return Err(UserError::at_step(n, r, i, s, what));
                }
            }
        }
        // A frame is (sender's step index, the chunks it carries).
        type Frame = (usize, Chunks);
        let mut fifo: HashMap<(usize, usize), VecDeque<Frame>> = HashMap::new();
        let mut pc = vec![0usize; n];
        let mut active: Vec<usize> = (0..n).filter(|&r| !ranks[r].is_empty()).collect();
        while !active.is_empty() {
            let mut moved = false;
            let mut still = Vec::with_capacity(active.len());
            for &r in &active {
                let steps = &ranks[r];
                // Run this rank as far as it goes.
                while let Some(s) = steps.get(pc[r]) {
                    if let Some(to) = s.to {
                        if fifo.get(&(r, to)).map_or(0, VecDeque::len) >= CHECK_SLOTS {
                            break;
                        }
                    }
                    if let Some(from) = s.from {
                        let Some(&(sent_at, sent)) = fifo.get(&(from, r)).and_then(|q| q.front())
                        else {
                            break;
                        };
                        if sent != s.chunks {
                            return Err(UserError::at_step(
                                n,
                                r,
                                pc[r],
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
                            .push_back((pc[r], s.chunks));
                    }
                    pc[r] += 1;
                    moved = true;
                }
                if pc[r] < steps.len() {
                    still.push(r);
                }
            }
            active = still;
            if !active.is_empty() && !moved {
                return Err(self.deadlock(n, ranks, &pc, &fifo));
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
        pc: &[usize],
        fifo: &HashMap<(usize, usize), VecDeque<(usize, Chunks)>>,
    ) -> UserError {
        let stuck: Vec<usize> = (0..n).filter(|&r| pc[r] < ranks[r].len()).collect();
        let r = stuck[0];
        let s = &ranks[r][pc[r]];
        let waits = match (s.from, s.to) {
            (Some(from), _) if fifo.get(&(from, r)).is_none_or(VecDeque::is_empty) => {
                if pc[from] >= ranks[from].len() {
                    format!(
                        "waits for a frame from rank {from}, which has finished without \
                         sending it (a missing send, or a receive too many)"
                    )
                } else {
                    format!(
                        "waits for a frame from rank {from}, which is stuck at its step {} ({})",
                        pc[from],
                        prim_name(ranks[from][pc[from]].prim)
                    )
                }
            }
            (_, Some(to)) => format!(
                "waits for room to send to rank {to}: {CHECK_SLOTS} frames sent there are not \
                 received (rank {to} {})",
                if pc[to] >= ranks[to].len() {
                    "has finished: a missing receive".to_string()
                } else {
                    format!("is stuck at its step {}", pc[to])
                }
            ),
            _ => "cannot move".to_string(),
        };
        UserError::at_step(
            n,
            r,
            pc[r],
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
    /// (`2k + 1` for the largest cut `k`), and a larger odd one.
    fn probe_counts(&self, n: usize) -> [usize; 3] {
        let most = self
            .sizes
            .get(&n)
            .into_iter()
            .flatten()
            .flatten()
            .map(|s| s.chunks.of)
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
    /// compare every rank's output with the sum computed in f64 apart.
    /// Assumes [`UserAlgorithm::check_matching`] passed. Costs about
    /// `n * count` per step: run it for the rank counts a job uses.
    pub fn check_values(&self, n: usize) -> Result<Verdict, UserError> {
        let ranks = self.ranks(n)?;
        let [_, ragged, _] = self.probe_counts(n);
        let widths = self.widths(n);
        let mut in_place = true;
        for count in [ragged, 1, 0] {
            // Inputs: integers up to 2^20 from a hash of (rank, element):
            // sums stay exact in f64, and a contribution lost, doubled or
            // taken from the wrong rank or place changes the sum.
            let inputs: Vec<Vec<f64>> = (0..n)
                .map(|r| (0..count).map(|i| input_value(r, i)).collect())
                .collect();
            let expected: Vec<f64> = (0..count)
                .map(|i| (0..n).map(|r| inputs[r][i]).sum())
                .collect();
            let longest = ranks
                .iter()
                .flatten()
                .map(|s| s.chunks.span(count).1)
                .max()
                .unwrap_or(0);
            for slice in [usize::MAX, longest.div_ceil(3).max(1)] {
                for place in [false, true] {
                    let built: Vec<(Schedule, Vec<usize>)> = (0..n)
                        .map(|r| instantiate(&ranks[r], count, slice, &widths))
                        .collect();
                    let schedules: Vec<Schedule> = built.iter().map(|b| b.0.clone()).collect();
                    let mut outputs: Vec<Vec<f64>> = if place {
                        inputs.clone()
                    } else {
                        vec![vec![f64::NAN; count]; n]
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
                        super::sim::run(&schedules, &inputs, &mut outputs, place, CHECK_SLOTS)
                    {
                        if place {
                            in_place = false;
                            continue;
                        }
                        return Err(UserError::general(n, format!("simulation ({how}): {e}")));
                    }
                    // Of the wrong elements (the first 64 of each rank),
                    // blame the one finished earliest in its rank's list:
                    // later wrong values mostly copy it.
                    let wrong = (0..n)
                        .flat_map(|r| {
                            let (outputs, expected, built) = (&outputs, &expected, &built);
                            (0..count)
                                .filter(move |&i| outputs[r][i] != expected[i])
                                .take(64)
                                .map(move |i| (last_writer(&built[r], i), r, i))
                        })
                        .min_by_key(|&(w, r, i)| (w.unwrap_or(usize::MAX), r, i));
                    if let Some((writer, r, i)) = wrong {
                        if place {
                            in_place = false;
                            continue;
                        }
                        return Err(wrong_value(
                            n,
                            (r, i, writer),
                            &ranks[r],
                            &how,
                            (outputs[r][i], expected[i]),
                        ));
                    }
                }
            }
        }
        Ok(Verdict { in_place })
    }

    /// This rank's schedule for a call of `count` elements cut in slices
    /// of at most `slice` elements, or None where `n` is not claimed.
    pub fn schedule(&self, n: usize, rank: usize, count: usize, slice: usize) -> Option<Schedule> {
        let widths = self.widths(n);
        self.steps(n, rank)
            .map(|steps| instantiate(steps, count, slice, &widths).0)
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

    /// Rank `rank`'s schedule for `count` elements in frames of at most
    /// `slice`.
    pub fn schedule(&self, rank: usize, count: usize, slice: usize) -> Schedule {
        let steps = self.algo.steps(self.size, rank).unwrap_or(&[]);
        instantiate(steps, count, slice, &self.widths).0
    }
}

/// What the checker found besides "correct".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The result is right in place too (else a communicator runs the
    /// algorithm in place from a copy of the input).
    pub in_place: bool,
}

/// FIFO depth the checker uses: the fewest slots a connection may have
/// (`Config::validate` refuses fewer). Frames carry no data between ranks
/// that wait on each other, so a schedule that finishes with this many
/// finishes with more.
pub const CHECK_SLOTS: usize = 2;

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

/// The error for output element `i` of rank `r`, last written by user
/// step `writer`.
fn wrong_value(
    n: usize,
    (r, i, writer): (usize, usize, Option<usize>),
    steps: &[UserStep],
    how: &str,
    (got, want): (f64, f64),
) -> UserError {
    let what = format!(
        "element {i} of the output is {got} where the sum of every rank's input is {want} ({how})"
    );
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
/// frame exceeds `slice` elements: the fewest `p` such that a block of
/// `ceil(count / p)` elements gives every step (of `widths`: its chunks'
/// `(end - first, of)`) at most `slice` elements.
fn passes(count: usize, slice: usize, widths: &[(usize, usize)]) -> usize {
    if count == 0 {
        return 0;
    }
    let slice = slice.max(1);
    let fits = |p: usize| {
        let m = count.div_ceil(p);
        widths
            .iter()
            .all(|&(w, k)| m.min(w.saturating_mul(m.div_ceil(k.max(1)))) <= slice)
    };
    // fits(count): blocks of one element.
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

/// The schedule of `steps` for `count` elements with frames of at most
/// `slice` elements, and for each of its steps the index of the user step
/// it came from. The buffer is cut into [`passes`] contiguous blocks, and
/// the whole list runs once per block, as if the block were the buffer
/// (its chunks cut from the block): each pass is the checked algorithm on
/// a shorter buffer, touches its own elements only, and ends with every
/// FIFO empty, so passes add neither wrong values nor deadlock. `widths`
/// are every rank's, so that all ranks cut alike. Steps whose piece is
/// empty are left out on both ends (a send and its receive name the same
/// chunks). A frame's tag is its number on its link, counted alike by the
/// sender and the receiver.
pub(crate) fn instantiate(
    steps: &[UserStep],
    count: usize,
    slice: usize,
    widths: &[(usize, usize)],
) -> (Schedule, Vec<usize>) {
    let mut sent: HashMap<usize, u32> = HashMap::new();
    let mut received: HashMap<usize, u32> = HashMap::new();
    let mut out = Schedule::default();
    let mut origin = Vec::new();
    let blocks = passes(count, slice, widths);
    for pass in 0..blocks {
        let (base, m) = partition(count, blocks, pass);
        for (i, s) in steps.iter().enumerate() {
            let (off, len) = s.chunks.span(m);
            if len == 0 {
                continue;
            }
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
            out.push(Step {
                prim: s.prim,
                local: s.local,
                send_to,
                recv_from,
                input: base + off,
                output: base + off,
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
        for n in algo.sizes() {
            for r in 0..n {
                let strip = |s: &[UserStep]| {
                    s.iter()
                        .map(|s| UserStep { line: None, ..*s })
                        .collect::<Vec<_>>()
                };
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
        use super::super::encode::{decode, encode, Layout, ProgramMeta};
        let algos = [
            halving_doubling(8),
            super::super::text::parse(TORUS).unwrap(),
        ];
        for algo in &algos {
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
}
