//! Device programs: a rank's schedule for one call encoded as a byte image
//! that a GPU kernel reads as it stands (a header, a table of channels, then
//! per channel a contiguous array of fixed-size little-endian instruction
//! records), and the decoder that turns an image back into steps, checking
//! every field first. `docs/device-executor.md` describes the format for
//! the kernel's author.
//!
//! Why one file of about 1,060 lines before its tests: it is one binary
//! format, and each record's encoding, decoding and field checks sit side
//! by side, so that a change to the layout is made in one place; the
//! kernel's reader is `cuda/kernels/executor.cu`.
//!
//! Each channel's records keep the schedule's order; channels are separate
//! streams of work (one thread block each on the device), so the encoder
//! refuses a schedule whose channels touch the same memory where one of
//! them writes it (the order between them would be lost), and the decoder
//! refuses such a program too.
//!
//! Pure data like the rest of `algo`: no I/O, no `unsafe`. Running a
//! program is the business of `exec` (the host interpreter in tests) and of
//! the device kernel.

use super::{Operand, Prim, Schedule, Step, NO_PEER};
use crate::element::{DataType, ReduceOp};
use std::collections::BTreeMap;
use std::ops::Range;

/// The image's first four bytes.
pub const MAGIC: [u8; 4] = *b"FCLP";
/// The format's version; any other is refused.
pub const VERSION: u16 = 1;
/// Bytes of the header.
pub const HEADER_BYTES: usize = 96;
/// Bytes of one entry of the channel table.
pub const CHANNEL_ENTRY_BYTES: usize = 16;
/// Bytes of one instruction record.
pub const RECORD_BYTES: usize = 40;
/// Most ranks a program can name: peers are 16 bits, and `0xFFFF` means
/// none.
pub const MAX_RANKS: usize = 0xFFFF;
/// Most channels: a record's channel is 8 bits.
pub const MAX_CHANNELS: usize = 256;
/// Bound of every offset, length and extent, in elements (2^48): a kernel
/// may add two of them and multiply by an element size in 64 bits.
pub const MAX_ELEMENTS: u64 = 1 << 48;
/// A record's peer field when the primitive has no peer that way.
pub const NONE_PEER: u16 = 0xFFFF;

/// Flag bit: the primitive receives a frame.
pub const FLAG_RECV: u8 = 1;
/// Flag bit: the primitive sends a frame.
pub const FLAG_SEND: u8 = 2;
/// Flag bit: the primitive combines two operands with the call's op (the
/// frame and its local operand; for `Reduce`, the output and the input).
pub const FLAG_REDUCE: u8 = 4;
/// Flag bit: the primitive writes the output.
pub const FLAG_WRITE: u8 = 8;
/// Flag bit: the primitive reads its local operand.
pub const FLAG_LOCAL: u8 = 16;

/// The record's opcode of `prim` (never 0).
pub fn opcode(prim: Prim) -> u8 {
    match prim {
        Prim::Send => 1,
        Prim::Recv => 2,
        Prim::RecvReduceSend => 3,
        Prim::RecvReduceCopySend => 4,
        Prim::RecvCopySend => 5,
        Prim::RecvReduceCopy => 6,
        Prim::CopySend => 7,
        Prim::Copy => 8,
        Prim::Reduce => 9,
    }
}

/// The primitive of opcode `code`, if there is one.
pub fn prim_of(code: u8) -> Option<Prim> {
    Prim::ALL.into_iter().find(|&p| opcode(p) == code)
}

/// The record's flags of `prim`: what it does, spelt out for a generic
/// kernel loop (the decoder checks that they agree with the opcode).
pub fn flags(prim: Prim) -> u8 {
    let mut f = 0;
    if prim.receives() {
        f |= FLAG_RECV;
    }
    if prim.sends() {
        f |= FLAG_SEND;
    }
    if prim.reduces() || prim == Prim::Reduce {
        f |= FLAG_REDUCE;
    }
    if prim.writes_output() {
        f |= FLAG_WRITE;
    }
    if reads_local(prim) {
        f |= FLAG_LOCAL;
    }
    f
}

/// Whether `prim` reads its local operand (`Recv` and `RecvCopySend` only
/// store what they receive).
fn reads_local(prim: Prim) -> bool {
    !matches!(prim, Prim::Recv | Prim::RecvCopySend)
}

/// Where a call's input and output lie, as the launcher hands them over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Two buffers that do not overlap (out of place, or in place run from
    /// a copy of the input or into a temporary output).
    Separate,
    /// One buffer: the input starts at element `input_base`, the output at
    /// `output_base` (in place).
    Shared {
        /// Where the input starts in the buffer.
        input_base: usize,
        /// Where the output starts in the buffer.
        output_base: usize,
    },
}

/// Avg's end: `output[offset..offset + len]` divided by `divisor`, once,
/// after every channel has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finish {
    /// First element, relative to the output.
    pub offset: usize,
    /// Elements divided.
    pub len: usize,
    /// The rank count.
    pub divisor: usize,
}

/// What a program says besides its steps: whose it is and how its buffers
/// are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgramMeta {
    /// The rank that runs the program.
    pub rank: usize,
    /// Ranks of the call.
    pub ranks: usize,
    /// Element type.
    pub dtype: DataType,
    /// The call's reduction operator (`None` for calls that reduce
    /// nothing); Avg combines as Sum and ends with `finish`.
    pub op: Option<ReduceOp>,
    /// How input and output lie.
    pub layout: Layout,
    /// Avg's division, on the ranks that hold a result.
    pub finish: Option<Finish>,
}

/// A decoded program: its meta, how much of each buffer it touches, and
/// the steps of each channel in order (a step's `channel` is its index
/// here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// Whose program and how its buffers lie.
    pub meta: ProgramMeta,
    /// Elements of the input the program reads (from the input's start).
    pub input_extent: usize,
    /// Elements of the output the program reads or writes.
    pub output_extent: usize,
    /// The steps, by channel.
    pub channels: Vec<Vec<Step>>,
}

impl Program {
    /// Every step, channel after channel: for a schedule of one channel,
    /// the schedule itself.
    pub fn schedule(&self) -> Schedule {
        Schedule {
            steps: self.channels.iter().flatten().copied().collect(),
        }
    }
}

/// Why a schedule cannot be encoded, or an image decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    /// A value of the call does not fit the format.
    #[error("{what} is {value}, beyond what the format holds ({limit})")]
    TooLarge {
        /// The field.
        what: String,
        /// Its value.
        value: u128,
        /// The format's limit (inclusive).
        limit: u128,
    },
    /// A step the format cannot carry as it is (a peer where the primitive
    /// has none, a range past the format's bound, ...).
    #[error("rank {rank}, channel {channel}, step {index}: {detail}")]
    BadStep {
        /// The program's rank.
        rank: usize,
        /// The step's channel.
        channel: usize,
        /// The step's index (in the schedule when encoding, in its
        /// channel when decoding).
        index: usize,
        /// What is wrong.
        detail: String,
    },
    /// Steps of two channels touch the same memory and at least one writes
    /// it: run as separate streams, their order would be lost.
    #[error(
        "rank {rank}: channel {writer_channel} step {writer} writes elements {range:?} of the \
         {buffer}, which channel {other_channel} step {other} {other_does} too; channels run \
         as separate streams, so the order between the two would be lost"
    )]
    CrossChannel {
        /// The program's rank.
        rank: usize,
        /// The channel of the step that writes.
        writer_channel: usize,
        /// That step's index in its channel.
        writer: usize,
        /// The channel of the other step.
        other_channel: usize,
        /// Its index in its channel.
        other: usize,
        /// What it does there ("reads" or "writes").
        other_does: &'static str,
        /// "input", "output" or "buffer" (in place).
        buffer: &'static str,
        /// Elements both touch (in the buffer named).
        range: Range<usize>,
    },
    /// The image ends before what its header or tables say it holds.
    #[error("image of {have} bytes is truncated: {what} needs {need}")]
    Truncated {
        /// What did not fit.
        what: &'static str,
        /// Bytes needed.
        need: u128,
        /// Bytes there.
        have: usize,
    },
    /// The image does not start with [`MAGIC`].
    #[error("not a ferroccl program: magic {found:02x?}, expected {MAGIC:02x?}")]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// The image is of another version.
    #[error("program version {found}, this build reads version {VERSION}")]
    Version {
        /// The version found.
        found: u16,
    },
    /// A header or channel-table field is out of range.
    #[error("header field {field}: {detail}")]
    BadField {
        /// The field.
        field: &'static str,
        /// What is wrong.
        detail: String,
    },
}

/// What a step reads and writes, in elements of the input and the output.
struct Access {
    reads_input: Option<Range<u64>>,
    reads_output: Option<Range<u64>>,
    writes_output: Option<Range<u64>>,
}

impl Access {
    /// As the host executor runs the step: the local operand where the
    /// primitive reads it (`Reduce` always reads the input, and the output
    /// it adds to), the output where it writes it. Empty steps touch
    /// nothing. `None` where a range passes the format's bound.
    fn of(step: &Step) -> Option<Access> {
        let len = step.len as u64;
        let range = |off: usize| -> Option<Option<Range<u64>>> {
            let off = off as u64;
            let end = off.checked_add(len)?;
            (end <= MAX_ELEMENTS).then_some((len > 0).then_some(off..end))
        };
        let (mut reads_input, mut reads_output, mut writes_output) = (None, None, None);
        if step.prim == Prim::Reduce {
            reads_input = range(step.input)?;
            reads_output = range(step.output)?;
        } else if reads_local(step.prim) {
            match step.local {
                Operand::Input => reads_input = range(step.input)?,
                Operand::Output => reads_output = range(step.output)?,
            }
        }
        if step.prim.writes_output() {
            writes_output = range(step.output)?;
        }
        Some(Access {
            reads_input,
            reads_output,
            writes_output,
        })
    }
}

/// Little-endian writes at fixed offsets.
struct Writer(Vec<u8>);

impl Writer {
    fn put(&mut self, at: usize, bytes: &[u8]) {
        self.0[at..at + bytes.len()].copy_from_slice(bytes);
    }
    fn u8(&mut self, at: usize, v: u8) {
        self.put(at, &[v]);
    }
    fn u16(&mut self, at: usize, v: u16) {
        self.put(at, &v.to_le_bytes());
    }
    fn u32(&mut self, at: usize, v: u32) {
        self.put(at, &v.to_le_bytes());
    }
    fn u64(&mut self, at: usize, v: u64) {
        self.put(at, &v.to_le_bytes());
    }
}

/// Little-endian reads, bounds checked.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn bytes<const N: usize>(
        &self,
        at: usize,
        what: &'static str,
    ) -> Result<[u8; N], ProgramError> {
        at.checked_add(N)
            .and_then(|end| self.0.get(at..end))
            .and_then(|b| b.try_into().ok())
            .ok_or(ProgramError::Truncated {
                what,
                need: at as u128 + N as u128,
                have: self.0.len(),
            })
    }
    fn u8(&self, at: usize, what: &'static str) -> Result<u8, ProgramError> {
        Ok(self.bytes::<1>(at, what)?[0])
    }
    fn u16(&self, at: usize, what: &'static str) -> Result<u16, ProgramError> {
        Ok(u16::from_le_bytes(self.bytes(at, what)?))
    }
    fn u32(&self, at: usize, what: &'static str) -> Result<u32, ProgramError> {
        Ok(u32::from_le_bytes(self.bytes(at, what)?))
    }
    fn u64(&self, at: usize, what: &'static str) -> Result<u64, ProgramError> {
        Ok(u64::from_le_bytes(self.bytes(at, what)?))
    }
}

fn too_large(
    what: impl Into<String>,
    value: impl Into<u128>,
    limit: impl Into<u128>,
) -> ProgramError {
    ProgramError::TooLarge {
        what: what.into(),
        value: value.into(),
        limit: limit.into(),
    }
}

/// `v` if it is at most `limit`.
fn bounded(what: &str, v: usize, limit: u64) -> Result<u64, ProgramError> {
    let v64 = v as u64;
    if v64 <= limit {
        Ok(v64)
    } else {
        Err(too_large(what, v as u128, limit))
    }
}

/// A peer field: `NONE_PEER` where the primitive has no peer that way,
/// else a rank of the call.
fn peer_field(has: bool, peer: usize, ranks: usize, which: &str) -> Result<u16, String> {
    match (has, peer) {
        (false, NO_PEER) => Ok(NONE_PEER),
        (false, p) => Err(format!(
            "{which} peer {p} on a primitive that does not {which}"
        )),
        (true, NO_PEER) => Err(format!("no {which} peer on a primitive that does {which}")),
        (true, p) if p < ranks => Ok(p as u16),
        (true, p) => Err(format!("{which} peer {p} is not a rank of {ranks}")),
    }
}

/// Encode `schedule`, rank `meta.rank`'s for one call, as a device
/// program. Refuses (never panics on) what does not fit the format: too
/// many ranks or channels, offsets past [`MAX_ELEMENTS`], peers that are
/// not ranks of the call or that the primitive does not have, a reducing
/// primitive without an op, channels that touch the same memory.
pub fn encode(schedule: &Schedule, meta: &ProgramMeta) -> Result<Vec<u8>, ProgramError> {
    check_meta(meta)?;
    let rank = meta.rank;
    let channels = schedule
        .steps
        .iter()
        .map(|s| s.channel)
        .max()
        .map_or(1, |c| c.saturating_add(1));
    if channels > MAX_CHANNELS {
        return Err(too_large(
            "channel count",
            channels as u128,
            MAX_CHANNELS as u128,
        ));
    }
    let (mut input_extent, mut output_extent) = (0u64, 0u64);
    let mut by_channel: Vec<Vec<(usize, &Step)>> = vec![Vec::new(); channels];
    for (index, step) in schedule.steps.iter().enumerate() {
        let bad = |detail: String| ProgramError::BadStep {
            rank,
            channel: step.channel,
            index,
            detail,
        };
        for (what, v) in [
            ("input offset", step.input),
            ("output offset", step.output),
            ("len", step.len),
        ] {
            if v as u64 > MAX_ELEMENTS {
                return Err(bad(format!(
                    "{what} {v} passes the bound of {MAX_ELEMENTS} elements"
                )));
            }
        }
        let access = Access::of(step).ok_or_else(|| {
            bad(format!(
                "its range passes the bound of {MAX_ELEMENTS} elements"
            ))
        })?;
        if (step.prim.reduces() || step.prim == Prim::Reduce) && meta.op.is_none() {
            return Err(bad(format!(
                "{:?} combines, but the call has no op",
                step.prim
            )));
        }
        peer_field(step.prim.sends(), step.send_to, meta.ranks, "send").map_err(&bad)?;
        peer_field(step.prim.receives(), step.recv_from, meta.ranks, "receive").map_err(&bad)?;
        if let Some(r) = &access.reads_input {
            input_extent = input_extent.max(r.end);
        }
        for r in [&access.reads_output, &access.writes_output]
            .into_iter()
            .flatten()
        {
            output_extent = output_extent.max(r.end);
        }
        by_channel[step.channel].push((index, step));
    }
    if let Some(f) = meta.finish {
        output_extent = output_extent.max((f.offset + f.len) as u64);
    }
    check_extents(&meta.layout, input_extent, output_extent)?;
    let as_steps: Vec<Vec<Step>> = by_channel
        .iter()
        .map(|c| c.iter().map(|(_, s)| **s).collect())
        .collect();
    check_independent(rank, &meta.layout, &as_steps)?;

    let table = HEADER_BYTES + channels * CHANNEL_ENTRY_BYTES;
    let total = table + schedule.steps.len() * RECORD_BYTES;
    let mut w = Writer(vec![0u8; total]);
    w.put(0, &MAGIC);
    w.u16(4, VERSION);
    w.u16(6, HEADER_BYTES as u16);
    w.u32(8, rank as u32);
    w.u32(12, meta.ranks as u32);
    w.u8(16, meta.dtype.code());
    w.u8(17, meta.dtype.size() as u8);
    let (layout, input_base, output_base) = match meta.layout {
        Layout::Separate => (0, 0, 0),
        Layout::Shared {
            input_base,
            output_base,
        } => (1, input_base as u64, output_base as u64),
    };
    w.u8(18, layout);
    w.u8(19, meta.op.map_or(0, ReduceOp::code));
    w.u16(20, channels as u16);
    w.u16(22, RECORD_BYTES as u16);
    w.u64(24, input_base);
    w.u64(32, output_base);
    w.u64(40, input_extent);
    w.u64(48, output_extent);
    if let Some(f) = meta.finish {
        w.u64(56, f.offset as u64);
        w.u64(64, f.len as u64);
        w.u32(72, f.divisor as u32);
    }
    w.u64(80, total as u64);
    let mut at = table;
    for (c, steps) in by_channel.iter().enumerate() {
        let entry = HEADER_BYTES + c * CHANNEL_ENTRY_BYTES;
        w.u64(entry, at as u64);
        let count = u32::try_from(steps.len()).map_err(|_| {
            too_large(
                format!("steps of channel {c}"),
                steps.len() as u128,
                u32::MAX,
            )
        })?;
        w.u32(entry + 8, count);
        for (_, step) in steps {
            write_record(&mut w, at, step);
            at += RECORD_BYTES;
        }
    }
    debug_assert_eq!(at, total);
    Ok(w.0)
}

/// One record at `at` (fields already checked).
fn write_record(w: &mut Writer, at: usize, step: &Step) {
    let peer = |p: usize| if p == NO_PEER { NONE_PEER } else { p as u16 };
    w.u8(at, opcode(step.prim));
    w.u8(at + 1, u8::from(step.local == Operand::Output));
    w.u8(at + 2, flags(step.prim));
    w.u8(at + 3, step.channel as u8);
    w.u16(at + 4, peer(step.send_to));
    w.u16(at + 6, peer(step.recv_from));
    w.u32(at + 8, step.send_tag);
    w.u32(at + 12, step.recv_tag);
    w.u64(at + 16, step.input as u64);
    w.u64(at + 24, step.output as u64);
    w.u64(at + 32, step.len as u64);
}

/// The meta's own limits (shared by encoder and decoder).
fn check_meta(meta: &ProgramMeta) -> Result<(), ProgramError> {
    if meta.ranks == 0 || meta.ranks > MAX_RANKS {
        return Err(too_large(
            "rank count",
            meta.ranks as u128,
            MAX_RANKS as u128,
        ));
    }
    if meta.rank >= meta.ranks {
        return Err(ProgramError::BadField {
            field: "rank",
            detail: format!("rank {} of {} ranks", meta.rank, meta.ranks),
        });
    }
    if let Layout::Shared {
        input_base,
        output_base,
    } = meta.layout
    {
        bounded("input base", input_base, MAX_ELEMENTS)?;
        bounded("output base", output_base, MAX_ELEMENTS)?;
    }
    if let Some(f) = meta.finish {
        if meta.op != Some(ReduceOp::Avg) {
            return Err(ProgramError::BadField {
                field: "finish",
                detail: format!("a division ends Avg only, and the op is {:?}", meta.op),
            });
        }
        if f.divisor == 0 || f.divisor > u32::MAX as usize {
            return Err(too_large("finish divisor", f.divisor as u128, u32::MAX));
        }
        let end = bounded("finish offset", f.offset, MAX_ELEMENTS)?
            + bounded("finish len", f.len, MAX_ELEMENTS)?;
        if end > MAX_ELEMENTS {
            return Err(too_large("finish end", end, MAX_ELEMENTS));
        }
    }
    Ok(())
}

/// Extents within the bound, also where they start at a base.
fn check_extents(layout: &Layout, input: u64, output: u64) -> Result<(), ProgramError> {
    let (ib, ob) = match *layout {
        Layout::Separate => (0, 0),
        Layout::Shared {
            input_base,
            output_base,
        } => (input_base as u64, output_base as u64),
    };
    for (what, base, extent) in [("input", ib, input), ("output", ob, output)] {
        if extent > MAX_ELEMENTS || base + extent > MAX_ELEMENTS {
            return Err(too_large(
                format!("end of the {what}"),
                base as u128 + extent as u128,
                MAX_ELEMENTS,
            ));
        }
    }
    Ok(())
}

/// Disjoint, merged half-open intervals.
#[derive(Default)]
struct Intervals(BTreeMap<u64, u64>);

impl Intervals {
    fn insert(&mut self, r: Range<u64>) {
        let (mut start, mut end) = (r.start, r.end);
        // Absorb every interval that overlaps or touches [start, end).
        while let Some((&s, &e)) = self.0.range(..=end).next_back() {
            if e < start {
                break;
            }
            start = start.min(s);
            end = end.max(e);
            self.0.remove(&s);
        }
        self.0.insert(start, end);
    }

    /// The first range both sets hold, if any.
    fn overlap(&self, other: &Intervals) -> Option<Range<u64>> {
        let (mut a, mut b) = (self.0.iter().peekable(), other.0.iter().peekable());
        while let (Some(&(&s1, &e1)), Some(&(&s2, &e2))) = (a.peek(), b.peek()) {
            let (s, e) = (s1.max(s2), e1.min(e2));
            if s < e {
                return Some(s..e);
            }
            if e1 <= e2 {
                a.next();
            } else {
                b.next();
            }
        }
        None
    }
}

/// Where an access lies: out of place the input and the output are two
/// spaces (0 and 1); in place both live in space 1 at their bases.
fn place(layout: &Layout, output: bool, r: &Range<u64>) -> (usize, Range<u64>) {
    match (*layout, output) {
        (Layout::Separate, false) => (0, r.clone()),
        (Layout::Separate, true) => (1, r.clone()),
        (
            Layout::Shared {
                input_base,
                output_base,
            },
            out,
        ) => {
            let base = if out { output_base } else { input_base } as u64;
            (1, r.start + base..r.end + base)
        }
    }
}

/// The reads and writes of one step, placed: `(space, range, writes)`.
fn placed(layout: &Layout, step: &Step) -> Vec<(usize, Range<u64>, bool)> {
    let Some(a) = Access::of(step) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (r, output, writes) in [
        (a.reads_input, false, false),
        (a.reads_output, true, false),
        (a.writes_output, true, true),
    ] {
        if let Some(r) = r {
            let (space, r) = place(layout, output, &r);
            out.push((space, r, writes));
        }
    }
    out
}

/// Refuse channels that touch the same memory where one writes it: run as
/// separate streams they would race. The condition does not depend on the
/// order of the steps, so the decoder checks it the same way.
fn check_independent(
    rank: usize,
    layout: &Layout,
    channels: &[Vec<Step>],
) -> Result<(), ProgramError> {
    if channels.iter().filter(|c| !c.is_empty()).count() < 2 {
        return Ok(());
    }
    // Per channel and space: everything touched, and everything written.
    let mut touched: Vec<[Intervals; 2]> = channels.iter().map(|_| Default::default()).collect();
    let mut written: Vec<[Intervals; 2]> = channels.iter().map(|_| Default::default()).collect();
    for (c, steps) in channels.iter().enumerate() {
        for step in steps {
            for (space, r, writes) in placed(layout, step) {
                if writes {
                    written[c][space].insert(r.clone());
                }
                touched[c][space].insert(r);
            }
        }
    }
    for (c, writes) in written.iter().enumerate() {
        for (d, touches) in touched.iter().enumerate() {
            if c == d {
                continue;
            }
            for space in 0..2 {
                if let Some(r) = writes[space].overlap(&touches[space]) {
                    return Err(conflict(rank, layout, channels, (c, d), space, r));
                }
            }
        }
    }
    Ok(())
}

/// The error for a conflict found on `r` in `space` between channel
/// `c`'s writes and channel `d`'s accesses: names one step of each.
fn conflict(
    rank: usize,
    layout: &Layout,
    channels: &[Vec<Step>],
    (c, d): (usize, usize),
    space: usize,
    r: Range<u64>,
) -> ProgramError {
    let find = |ch: usize, want_write: bool| {
        channels[ch]
            .iter()
            .enumerate()
            .find_map(|(i, step)| {
                placed(layout, step).into_iter().find_map(|(s, sr, w)| {
                    let hit =
                        s == space && sr.start < r.end && r.start < sr.end && (w || !want_write);
                    hit.then_some((i, if w { "writes" } else { "reads" }))
                })
            })
            .unwrap_or((0, "touches"))
    };
    let (writer, _) = find(c, true);
    let (other, other_does) = find(d, false);
    let buffer = match (layout, space) {
        (Layout::Shared { .. }, _) => "buffer",
        (Layout::Separate, 0) => "input",
        (Layout::Separate, _) => "output",
    };
    ProgramError::CrossChannel {
        rank,
        writer_channel: c,
        writer,
        other_channel: d,
        other,
        other_does,
        buffer,
        range: r.start as usize..r.end as usize,
    }
}

/// Decode a program image, checking every field: magic, version, sizes,
/// ranks, type, layout, op, extents, the channel table (canonical: the
/// records follow the table channel after channel, to the image's end),
/// and each record (opcode, flags, channel, peers, ranges within the
/// extents), and that channels are independent. Never panics, whatever
/// the bytes.
pub fn decode(image: &[u8]) -> Result<Program, ProgramError> {
    let r = Reader(image);
    if image.len() < HEADER_BYTES {
        return Err(ProgramError::Truncated {
            what: "the header",
            need: HEADER_BYTES as u128,
            have: image.len(),
        });
    }
    let magic = r.bytes::<4>(0, "magic")?;
    if magic != MAGIC {
        return Err(ProgramError::BadMagic { found: magic });
    }
    let version = r.u16(4, "version")?;
    if version != VERSION {
        return Err(ProgramError::Version { found: version });
    }
    let field = |field: &'static str, detail: String| ProgramError::BadField { field, detail };
    let expect = |name: &'static str, got: u64, want: u64| {
        if got == want {
            Ok(())
        } else {
            Err(field(name, format!("{got}, expected {want}")))
        }
    };
    expect(
        "header bytes",
        r.u16(6, "header")?.into(),
        HEADER_BYTES as u64,
    )?;
    expect(
        "record bytes",
        r.u16(22, "header")?.into(),
        RECORD_BYTES as u64,
    )?;
    expect("reserved (76)", r.u32(76, "header")?.into(), 0)?;
    expect("reserved (88)", r.u64(88, "header")?, 0)?;
    expect("total bytes", r.u64(80, "header")?, image.len() as u64)?;
    let rank = r.u32(8, "header")? as usize;
    let ranks = r.u32(12, "header")? as usize;
    let dtype_code = r.u8(16, "header")?;
    let dtype = DataType::from_code(dtype_code)
        .ok_or_else(|| field("dtype", format!("unknown type code {dtype_code}")))?;
    expect(
        "element bytes",
        r.u8(17, "header")?.into(),
        dtype.size() as u64,
    )?;
    let (ib, ob) = (r.u64(24, "header")?, r.u64(32, "header")?);
    let layout = match r.u8(18, "header")? {
        0 if ib == 0 && ob == 0 => Layout::Separate,
        0 => {
            return Err(field(
                "layout",
                format!("bases {ib} and {ob} on separate buffers"),
            ))
        }
        1 if ib <= MAX_ELEMENTS && ob <= MAX_ELEMENTS => Layout::Shared {
            input_base: ib as usize,
            output_base: ob as usize,
        },
        1 => return Err(too_large("a base", ib.max(ob), MAX_ELEMENTS)),
        other => return Err(field("layout", format!("unknown layout {other}"))),
    };
    let op = match r.u8(19, "header")? {
        0 => None,
        code => Some(
            ReduceOp::from_code(code)
                .ok_or_else(|| field("op", format!("unknown op code {code}")))?,
        ),
    };
    let (fo, fl, fd) = (
        r.u64(56, "header")?,
        r.u64(64, "header")?,
        r.u32(72, "header")?,
    );
    let finish = match fd {
        0 if fo == 0 && fl == 0 => None,
        0 => {
            return Err(field(
                "finish",
                format!("range {fo}+{fl} without a divisor"),
            ))
        }
        _ if fo > MAX_ELEMENTS || fl > MAX_ELEMENTS => {
            return Err(too_large("finish range", fo.max(fl), MAX_ELEMENTS))
        }
        d => Some(Finish {
            offset: fo as usize,
            len: fl as usize,
            divisor: d as usize,
        }),
    };
    let meta = ProgramMeta {
        rank,
        ranks,
        dtype,
        op,
        layout,
        finish,
    };
    check_meta(&meta)?;
    let (input_extent, output_extent) = (r.u64(40, "header")?, r.u64(48, "header")?);
    check_extents(&layout, input_extent, output_extent)?;
    if let Some(f) = finish {
        if (f.offset + f.len) as u64 > output_extent {
            return Err(field(
                "finish",
                format!(
                    "range {}+{} past the output extent {output_extent}",
                    f.offset, f.len
                ),
            ));
        }
    }
    let channels = r.u16(20, "header")? as usize;
    if channels == 0 || channels > MAX_CHANNELS {
        return Err(field(
            "channels",
            format!("{channels}, expected 1..={MAX_CHANNELS}"),
        ));
    }

    // The table, and the records where it says, contiguous to the end.
    let table_end = HEADER_BYTES + channels * CHANNEL_ENTRY_BYTES;
    if image.len() < table_end {
        return Err(ProgramError::Truncated {
            what: "the channel table",
            need: table_end as u128,
            have: image.len(),
        });
    }
    let mut next = table_end as u64;
    let mut spans = Vec::with_capacity(channels);
    for c in 0..channels {
        let entry = HEADER_BYTES + c * CHANNEL_ENTRY_BYTES;
        let at = r.u64(entry, "the channel table")?;
        let count = r.u32(entry + 8, "the channel table")?;
        expect(
            "channel entry reserved",
            r.u32(entry + 12, "the channel table")?.into(),
            0,
        )?;
        if at != next {
            return Err(field(
                "channel offset",
                format!("channel {c} records at byte {at}, expected {next}"),
            ));
        }
        let end = at + u64::from(count) * RECORD_BYTES as u64;
        if end > image.len() as u64 {
            return Err(ProgramError::Truncated {
                what: "the records",
                need: end as u128,
                have: image.len(),
            });
        }
        spans.push((at as usize, count as usize));
        next = end;
    }
    if next != image.len() as u64 {
        return Err(field(
            "total bytes",
            format!("records end at byte {next}, the image at {}", image.len()),
        ));
    }
    let mut decoded = Vec::with_capacity(channels);
    let (mut need_input, mut need_output) = (0u64, 0u64);
    for (c, &(at, count)) in spans.iter().enumerate() {
        let mut steps = Vec::with_capacity(count);
        for i in 0..count {
            let step = read_record(&r, at + i * RECORD_BYTES, &meta, c).map_err(|detail| {
                ProgramError::BadStep {
                    rank,
                    channel: c,
                    index: i,
                    detail,
                }
            })?;
            let a = Access::of(&step).ok_or_else(|| ProgramError::BadStep {
                rank,
                channel: c,
                index: i,
                detail: format!("range passes the bound of {MAX_ELEMENTS} elements"),
            })?;
            let past =
                |r: &Option<Range<u64>>, extent: u64| r.as_ref().is_some_and(|r| r.end > extent);
            if past(&a.reads_input, input_extent)
                || past(&a.reads_output, output_extent)
                || past(&a.writes_output, output_extent)
            {
                return Err(ProgramError::BadStep {
                    rank,
                    channel: c,
                    index: i,
                    detail: format!(
                        "range past the extents (input {input_extent}, output {output_extent}): {step:?}"
                    ),
                });
            }
            if let Some(r) = &a.reads_input {
                need_input = need_input.max(r.end);
            }
            for r in [&a.reads_output, &a.writes_output].into_iter().flatten() {
                need_output = need_output.max(r.end);
            }
            steps.push(step);
        }
        decoded.push(steps);
    }
    // Extents as the encoder writes them, so that an image has one form.
    if let Some(f) = finish {
        need_output = need_output.max((f.offset + f.len) as u64);
    }
    for (name, got, need) in [
        ("input extent", input_extent, need_input),
        ("output extent", output_extent, need_output),
    ] {
        if got != need {
            return Err(field(name, format!("{got}, the program needs {need}")));
        }
    }
    check_independent(rank, &layout, &decoded)?;
    Ok(Program {
        meta,
        input_extent: input_extent as usize,
        output_extent: output_extent as usize,
        channels: decoded,
    })
}

/// One record of channel `channel`, checked against the meta.
fn read_record(
    r: &Reader<'_>,
    at: usize,
    meta: &ProgramMeta,
    channel: usize,
) -> Result<Step, String> {
    let get = |e: ProgramError| e.to_string();
    let code = r.u8(at, "a record").map_err(get)?;
    let prim = prim_of(code).ok_or_else(|| format!("unknown opcode {code}"))?;
    let local = match r.u8(at + 1, "a record").map_err(get)? {
        0 => Operand::Input,
        1 => Operand::Output,
        other => return Err(format!("unknown local operand {other}")),
    };
    let f = r.u8(at + 2, "a record").map_err(get)?;
    if f != flags(prim) {
        return Err(format!(
            "flags {f:#04x} where {prim:?} has {:#04x}",
            flags(prim)
        ));
    }
    let ch = r.u8(at + 3, "a record").map_err(get)? as usize;
    if ch != channel {
        return Err(format!("record says channel {ch}"));
    }
    if (prim.reduces() || prim == Prim::Reduce) && meta.op.is_none() {
        return Err(format!("{prim:?} combines, but the program has no op"));
    }
    let peer = |p: u16, has: bool, which: &str| -> Result<usize, String> {
        match (has, p) {
            (false, NONE_PEER) => Ok(NO_PEER),
            (false, p) => Err(format!("{which} peer {p} on {prim:?}")),
            (true, NONE_PEER) => Err(format!("{prim:?} without a {which} peer")),
            (true, p) if (p as usize) < meta.ranks => Ok(p as usize),
            (true, p) => Err(format!("{which} peer {p} is not a rank of {}", meta.ranks)),
        }
    };
    let send_to = peer(
        r.u16(at + 4, "a record").map_err(get)?,
        prim.sends(),
        "send",
    )?;
    let recv_from = peer(
        r.u16(at + 6, "a record").map_err(get)?,
        prim.receives(),
        "receive",
    )?;
    let elements = |off: usize, what: &str| -> Result<usize, String> {
        let v = r.u64(at + off, "a record").map_err(get)?;
        if v > MAX_ELEMENTS {
            return Err(format!(
                "{what} {v} passes the bound of {MAX_ELEMENTS} elements"
            ));
        }
        Ok(v as usize)
    };
    Ok(Step {
        prim,
        local,
        send_to,
        recv_from,
        send_tag: r.u32(at + 8, "a record").map_err(get)?,
        recv_tag: r.u32(at + 12, "a record").map_err(get)?,
        input: elements(16, "input offset")?,
        output: elements(24, "output offset")?,
        len: elements(32, "len")?,
        channel,
    })
}

#[cfg(test)]
mod tests {
    use super::super::ring::{self, RingParams};
    use super::super::{direct, tree};
    use super::*;
    use proptest::prelude::*;

    fn meta(rank: usize, ranks: usize) -> ProgramMeta {
        ProgramMeta {
            rank,
            ranks,
            dtype: DataType::F32,
            op: Some(ReduceOp::Sum),
            layout: Layout::Separate,
            finish: None,
        }
    }

    fn p(rank: usize, size: usize, slice: usize) -> RingParams {
        RingParams {
            rank,
            size,
            slice,
            depth: 1,
        }
    }

    /// Schedules of every shape the algorithms make, for `n` ranks.
    fn schedules(n: usize, count: usize, slice: usize) -> Vec<(String, usize, Schedule)> {
        let mut out = Vec::new();
        for r in 0..n {
            let q = p(r, n, slice);
            let mut add = |name: &str, s: Schedule| out.push((name.to_string(), r, s));
            add("ring all_reduce", ring::all_reduce(q, count));
            add("ring reduce_scatter", ring::reduce_scatter(q, count));
            add("ring all_gather", ring::all_gather(q, count));
            add("ring broadcast", ring::broadcast(q, count, n - 1));
            add("ring reduce", ring::reduce(q, count, 0));
            add("ring all_to_all", ring::all_to_all(q, count));
            add("ring barrier", ring::barrier(q));
            add("tree all_reduce", tree::all_reduce(q, count));
            add("tree broadcast", tree::broadcast(q, count, n / 2));
            add("tree reduce", tree::reduce(q, count, n / 2));
            add("tree confirmation", tree::confirmation(q, 0, true));
            add("one_shot", direct::one_shot(q, count));
            add("two_shot", direct::two_shot(q, count));
        }
        out
    }

    #[test]
    fn algorithm_schedules_round_trip() {
        for n in [1, 2, 3, 5, 8] {
            for count in [0, 1, 7, 100] {
                for (name, r, s) in schedules(n, count, 16) {
                    let image = encode(&s, &meta(r, n))
                        .unwrap_or_else(|e| panic!("{name} n={n} r={r}: {e}"));
                    let program =
                        decode(&image).unwrap_or_else(|e| panic!("{name} n={n} r={r}: {e}"));
                    assert_eq!(program.schedule(), s, "{name} n={n} rank {r} count {count}");
                    assert_eq!(program.meta, meta(r, n));
                    assert_eq!(
                        image.len(),
                        HEADER_BYTES + CHANNEL_ENTRY_BYTES + s.steps.len() * RECORD_BYTES
                    );
                }
            }
        }
    }

    /// The byte positions the documentation's tables give.
    #[test]
    fn fields_sit_where_the_documentation_says() {
        let step = Step {
            send_to: 0x0102,
            send_tag: 0x0A0B_0C0D,
            recv_tag: 7,
            ..Step::local(
                Prim::CopySend,
                Operand::Output,
                0x1_0000_0001,
                0x2_0000_0002,
                0x3_0000_0003,
            )
        };
        let m = ProgramMeta {
            rank: 3,
            ranks: 0x0200,
            dtype: DataType::Bf16,
            op: Some(ReduceOp::Avg),
            layout: Layout::Shared {
                input_base: 5,
                output_base: 6,
            },
            finish: Some(Finish {
                offset: 1,
                len: 2,
                divisor: 0x0200,
            }),
        };
        let img = encode(&Schedule { steps: vec![step] }, &m).unwrap();
        let u16_at = |a: usize| u16::from_le_bytes(img[a..a + 2].try_into().unwrap());
        let u32_at = |a: usize| u32::from_le_bytes(img[a..a + 4].try_into().unwrap());
        let u64_at = |a: usize| u64::from_le_bytes(img[a..a + 8].try_into().unwrap());
        assert_eq!(&img[0..4], b"FCLP");
        assert_eq!((u16_at(4), u16_at(6)), (1, 96));
        assert_eq!((u32_at(8), u32_at(12)), (3, 0x0200));
        assert_eq!((img[16], img[17], img[18], img[19]), (4, 2, 1, 5));
        assert_eq!((u16_at(20), u16_at(22)), (1, 40));
        assert_eq!((u64_at(24), u64_at(32)), (5, 6));
        assert_eq!((u64_at(40), u64_at(48)), (0, 0x2_0000_0002 + 0x3_0000_0003));
        assert_eq!((u64_at(56), u64_at(64), u32_at(72)), (1, 2, 0x0200));
        assert_eq!(u64_at(80), img.len() as u64);
        assert_eq!((u64_at(96), u32_at(104)), (112, 1));
        let rec = 112;
        assert_eq!(img[rec], 7, "CopySend");
        assert_eq!(img[rec + 1], 1, "local = output");
        assert_eq!(img[rec + 2], FLAG_SEND | FLAG_WRITE | FLAG_LOCAL);
        assert_eq!(img[rec + 3], 0, "channel");
        assert_eq!((u16_at(rec + 4), u16_at(rec + 6)), (0x0102, NONE_PEER));
        assert_eq!((u32_at(rec + 8), u32_at(rec + 12)), (0x0A0B_0C0D, 7));
        assert_eq!(
            (u64_at(rec + 16), u64_at(rec + 24), u64_at(rec + 32)),
            (0x1_0000_0001, 0x2_0000_0002, 0x3_0000_0003)
        );
        assert_eq!(img.len(), rec + RECORD_BYTES);
    }

    #[test]
    fn encode_refuses_what_does_not_fit() {
        let send = |to: usize| Step {
            send_to: to,
            ..Step::local(Prim::Send, Operand::Input, 0, 0, 4)
        };
        let one = |s: Step| Schedule { steps: vec![s] };
        let fails = |s: Schedule, m: ProgramMeta, want: &str| {
            let err = encode(&s, &m).expect_err(want).to_string();
            assert!(err.contains(want), "{err:?} should say {want:?}");
        };
        fails(one(send(1)), meta(0, MAX_RANKS + 1), "rank count");
        fails(one(send(1)), meta(2, 2), "rank 2 of 2");
        fails(one(send(2)), meta(0, 2), "send peer 2 is not a rank of 2");
        fails(one(send(NO_PEER)), meta(0, 2), "no send peer");
        fails(
            one(Step {
                recv_from: 1,
                ..send(1)
            }),
            meta(0, 2),
            "receive peer 1 on a primitive",
        );
        fails(
            one(Step {
                channel: MAX_CHANNELS,
                ..send(1)
            }),
            meta(0, 2),
            "channel count",
        );
        fails(
            one(Step {
                input: MAX_ELEMENTS as usize,
                ..send(1)
            }),
            meta(0, 2),
            "passes the bound",
        );
        fails(
            one(Step {
                len: usize::MAX,
                ..send(1)
            }),
            meta(0, 2),
            "len",
        );
        fails(
            one(Step::local(Prim::Reduce, Operand::Input, 0, 0, 1)),
            ProgramMeta {
                op: None,
                ..meta(0, 1)
            },
            "no op",
        );
        let finish = Finish {
            offset: 0,
            len: 1,
            divisor: 2,
        };
        fails(
            one(send(1)),
            ProgramMeta {
                finish: Some(finish),
                ..meta(0, 2)
            },
            "Avg only",
        );
        let zero = Some(Finish {
            divisor: 0,
            ..finish
        });
        fails(
            one(send(1)),
            ProgramMeta {
                finish: zero,
                op: Some(ReduceOp::Avg),
                ..meta(0, 2)
            },
            "divisor",
        );
        // The largest values that fit do.
        let big = Step {
            input: (MAX_ELEMENTS - 1) as usize,
            len: 1,
            send_to: MAX_RANKS - 1,
            channel: MAX_CHANNELS - 1,
            ..send(0)
        };
        let img = encode(&one(big), &meta(0, MAX_RANKS)).unwrap();
        assert_eq!(decode(&img).unwrap().channels[MAX_CHANNELS - 1], vec![big]);
    }

    /// A tree allreduce with the steps that read a partial result (or a
    /// received broadcast) from the output moved to channel 1: they read what channel 0 wrote, so
    /// every rank that has such steps is refused, naming the output.
    #[test]
    fn dependent_channels_are_refused() {
        let n = 5;
        let mut refused = 0;
        for r in 0..n {
            let mut s = tree::all_reduce(p(r, n, 4), 10);
            let mut moved = false;
            for step in &mut s.steps {
                if step.local == Operand::Output && reads_local(step.prim) {
                    step.channel = 1;
                    moved = true;
                }
            }
            match encode(&s, &meta(r, n)) {
                Err(ProgramError::CrossChannel { buffer, .. }) => {
                    assert_eq!(buffer, "output");
                    assert!(moved);
                    refused += 1;
                }
                Err(other) => panic!("rank {r}: {other}"),
                Ok(_) => assert!(!moved, "rank {r}: a split that races was accepted"),
            }
        }
        assert!(refused > 0, "no rank's split tree was refused");
        // In place, a ring allreduce's last step (a receive into the
        // output) writes what its reduce-scatter steps read as input.
        let mut s = ring::all_reduce(p(0, 3, 100), 30);
        let last = s.steps.len() - 1;
        s.steps[last].channel = 1;
        let shared = ProgramMeta {
            layout: Layout::Shared {
                input_base: 0,
                output_base: 0,
            },
            ..meta(0, 3)
        };
        let err = encode(&s, &shared).unwrap_err().to_string();
        assert!(err.contains("channels run as separate streams"), "{err}");
        // Out of place the same split touches no memory of the other
        // channel: the encoder, which sees one rank, accepts it (the
        // interpreter then finds the peers' channels disagree).
        assert!(encode(&s, &meta(0, 3)).is_ok());
    }

    /// Two allreduces on the halves of a buffer, one per channel, steps
    /// interleaved: independent, accepted, each channel's order kept. In
    /// place where channel 1's input is channel 0's output, refused.
    #[test]
    fn independent_channels_are_kept_apart_in_order() {
        let (n, half) = (4, 50);
        for r in 0..n {
            let s = two_halves(r, n, half);
            let img = encode(&s, &meta(r, n)).unwrap();
            let program = decode(&img).unwrap();
            assert_eq!(program.channels.len(), 2);
            for c in 0..2 {
                let want: Vec<Step> = s.steps.iter().filter(|x| x.channel == c).copied().collect();
                assert_eq!(program.channels[c], want, "rank {r} channel {c}");
            }
            let aliased = ProgramMeta {
                layout: Layout::Shared {
                    input_base: half,
                    output_base: 0,
                },
                ..meta(r, n)
            };
            let err = encode(&s, &aliased).unwrap_err();
            assert!(
                matches!(
                    err,
                    ProgramError::CrossChannel {
                        buffer: "buffer",
                        ..
                    }
                ),
                "{err}"
            );
        }
    }

    /// Rank `r`'s steps of two ring allreduces of `half` elements, the
    /// first on channel 0 over elements `0..half`, the second on channel
    /// 1 over `half..2 * half`, interleaved.
    pub(crate) fn two_halves(r: usize, n: usize, half: usize) -> Schedule {
        let a = ring::all_reduce(p(r, n, 8), half);
        let mut b = ring::all_reduce(p(r, n, 8), half);
        for step in &mut b.steps {
            step.channel = 1;
            step.input += half;
            step.output += half;
        }
        let mut steps = Vec::new();
        let (mut x, mut y) = (a.steps.into_iter(), b.steps.into_iter());
        loop {
            match (x.next(), y.next()) {
                (None, None) => break,
                (p, q) => steps.extend(p.into_iter().chain(q)),
            }
        }
        Schedule { steps }
    }

    fn valid_image() -> Vec<u8> {
        encode(&two_halves(1, 3, 20), &meta(1, 3)).unwrap()
    }

    #[test]
    fn decode_names_what_is_wrong() {
        let good = valid_image();
        let rec0 = HEADER_BYTES + 2 * CHANNEL_ENTRY_BYTES;
        let bad = |at: usize, bytes: &[u8], want: &str| {
            let mut img = good.clone();
            img[at..at + bytes.len()].copy_from_slice(bytes);
            let err = decode(&img).expect_err(want).to_string();
            assert!(err.contains(want), "{err:?} should say {want:?}");
        };
        bad(0, b"XCLP", "magic");
        bad(4, &2u16.to_le_bytes(), "version 2");
        bad(8, &3u32.to_le_bytes(), "rank 3 of 3");
        bad(16, &[11], "unknown type code 11");
        bad(17, &[8], "element bytes");
        bad(18, &[2], "unknown layout 2");
        bad(19, &[9], "unknown op code 9");
        bad(20, &0u16.to_le_bytes(), "channels: 0");
        bad(24, &1u64.to_le_bytes(), "bases 1 and 0 on separate buffers");
        bad(72, &2u32.to_le_bytes(), "Avg only");
        bad(96, &7u64.to_le_bytes(), "channel 0 records at byte 7");
        bad(rec0, &[0], "unknown opcode 0");
        bad(rec0, &[10], "unknown opcode 10");
        bad(rec0 + 1, &[2], "unknown local operand 2");
        bad(rec0 + 2, &[0], "flags");
        bad(rec0 + 3, &[1], "record says channel 1");
        // Rank 1's first step sends to rank 2.
        bad(
            rec0 + 4,
            &3u16.to_le_bytes(),
            "send peer 3 is not a rank of 3",
        );
        bad(rec0 + 4, &NONE_PEER.to_le_bytes(), "without a send peer");
        bad(rec0 + 6, &0u16.to_le_bytes(), "receive peer 0 on Send");
        bad(
            rec0 + 16,
            &(MAX_ELEMENTS + 1).to_le_bytes(),
            "passes the bound",
        );
        bad(rec0 + 16, &1000u64.to_le_bytes(), "past the extents");
        bad(
            40,
            &41u64.to_le_bytes(),
            "input extent: 41, the program needs 40",
        );
        // A channel's count that runs past the end.
        bad(HEADER_BYTES + 8, &u32::MAX.to_le_bytes(), "truncated");
        let err = decode(&good[..good.len() - 1]).unwrap_err().to_string();
        assert!(err.contains("total bytes"), "{err}");
        let err = decode(&good[..50]).unwrap_err().to_string();
        assert!(err.contains("truncated: the header needs 96"), "{err}");
        let mut longer = good.clone();
        longer.extend_from_slice(&[0; RECORD_BYTES]);
        let total = longer.len() as u64;
        longer[80..88].copy_from_slice(&total.to_le_bytes());
        let err = decode(&longer).unwrap_err().to_string();
        assert!(err.contains("records end at byte"), "{err}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_decode(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = decode(&bytes);
        }

        /// A valid image with bytes overwritten, or cut: decode answers,
        /// and what it accepts encodes back to the same bytes.
        #[test]
        fn damaged_images_never_panic_decode(
            hits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
            cut in any::<prop::sample::Index>(),
            cutting in any::<bool>(),
        ) {
            let mut img = valid_image();
            for (at, v) in hits {
                let i = at.index(img.len());
                img[i] = v;
            }
            if cutting {
                img.truncate(cut.index(img.len()));
            }
            if let Ok(program) = decode(&img) {
                let mut steps = program.schedule();
                // Channels concatenated: each channel's order is what counts.
                steps.steps.sort_by_key(|s| s.channel);
                prop_assert_eq!(encode(&steps, &program.meta), Ok(img));
            }
        }
    }
}
