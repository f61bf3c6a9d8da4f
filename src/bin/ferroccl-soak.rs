//! `ferroccl-soak`: a randomised soak of every collective.
//!
//! ```text
//! ferroccl-run -n 4 -- ferroccl-soak --seed 42 --ops 2000
//! ```
//!
//! Every rank joins with `Communicator::from_env()` and derives the same
//! random sequence of operations from one seed: which collective (blocking,
//! in place or not, batches of async allreduces, send/recv between a random
//! pair, all-to-all, barrier), element type, reduction operator, count
//! (skewed towards 0, 1, the rank count, odd numbers and powers of two give
//! or take one, sometimes up to `--max-count`), root, and every so often a
//! split into sub-communicators with random colors (negative: left out) and
//! keys, a few operations on them, and back to the parent. About one call
//! in four puts its buffers in windows (`Communicator::alloc_window`, made
//! for the call on every rank, the buffer at an offset of 0 to 64 elements,
//! the same on every rank or not), so the direct paths between windows run
//! in the same sequence as the slot paths; nothing around a buffer in its
//! window may change.
//!
//! Inputs are functions of (seed, operation, rank, element), so every rank
//! computes every other rank's input and checks its result against an f64
//! (or, for integers, i128) reference computed here, independently of the
//! library. Integer-valued inputs are bounded so that every result is exact
//! in every type; float inputs with full mantissas are checked within the
//! rounding bound of a sum of n terms in any order (see `tolerance_frac`).
//!
//! On the first wrong element or error a rank prints
//! `rank R: op #i (<description>): <what went wrong>` and the command that
//! replays the run, and exits 1. Exit status 2: a bad command line.
//!
//! `FERROCCL_SOAK_SABOTAGE=1` exists only to test this checker: it makes
//! each rank expect a wrong value (one more than the reference) for the
//! first element it checks, so that the run must fail.

mod tool;

use ferroccl::{Communicator, DataType, Element, ReduceOp, Window, Work};
use half::{bf16, f16};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Instant;
use tool::{say, say_err};

const USAGE: &str = "\
usage: ferroccl-soak [options]

Run under a launcher (ferroccl-run, torchrun, mpirun, srun): every rank runs
the same random sequence of collectives, sizes, element types, operators,
roots and communicator splits, derived from one seed, and checks every result
against a reference computed independently on every rank. Exits 0 when every
check passes, 1 on the first wrong result or error (with a command line that
replays the run), 2 on a bad command line.

options:
      --seed S         seed of the sequence (default: from the clock, printed
                       by rank 0)
      --ops K          number of operations (default 200)
      --max-count N    largest element count of one buffer (default 100000)
      --splits         split communicators now and then (the default)
      --no-splits      never split
      --windows        put the buffers of about one call in four in windows
                       (the default)
      --no-windows     never use windows
      --verbose        every rank prints each operation before running it
  -h, --help           print this help

FERROCCL_SOAK_SABOTAGE=1 makes the checker expect a wrong value (it exists
only to test that the soak can fail).";

// ------------------------------------------------------------ options

/// The parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Options {
    seed: Option<u64>,
    ops: usize,
    max_count: usize,
    splits: bool,
    windows: bool,
    verbose: bool,
}

/// Parse the arguments (without the program name); `Ok(None)` asks for help.
fn parse_options(args: &[String]) -> Result<Option<Options>, String> {
    let mut opts = Options {
        seed: None,
        ops: 200,
        max_count: 100_000,
        splits: true,
        windows: true,
        verbose: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        match name {
            "-h" | "--help" => return Ok(None),
            "--splits" | "--no-splits" | "--windows" | "--no-windows" | "--verbose"
                if inline.is_none() =>
            {
                match name {
                    "--splits" => opts.splits = true,
                    "--no-splits" => opts.splits = false,
                    "--windows" => opts.windows = true,
                    "--no-windows" => opts.windows = false,
                    _ => opts.verbose = true,
                }
                continue;
            }
            "--seed" | "--ops" | "--max-count" => {}
            _ => return Err(format!("unknown argument '{arg}'")),
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))?,
        };
        let n: u64 = value
            .trim()
            .parse()
            .map_err(|_| format!("{name} '{value}' is not a non-negative whole number"))?;
        match name {
            "--seed" => opts.seed = Some(n),
            "--ops" => opts.ops = n as usize,
            _ => opts.max_count = n as usize,
        }
    }
    Ok(Some(opts))
}

// ------------------------------------------------------------ randomness

/// The finaliser of splitmix64: a bijective 64-bit mix.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A hash of a few words (for inputs: any element of any rank, directly).
fn hash(words: &[u64]) -> u64 {
    words.iter().fold(0x05ee_d0ff_0cc1_u64, |h, &w| {
        mix(h.wrapping_add(w).wrapping_mul(0x9e37_79b9_7f4a_7c15))
    })
}

/// splitmix64: the sequence every rank draws alike.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }

    /// True with probability `percent`/100.
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

// ------------------------------------------------------------ the sequence

/// Kinds of operation, in the order the summary lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    AllReduce,
    AllReduceInPlace,
    AllReduceAsync,
    ReduceScatter,
    ReduceScatterInPlace,
    AllGather,
    AllGatherInPlace,
    Broadcast,
    Reduce,
    ReduceInPlace,
    SendRecv,
    AllToAll,
    Barrier,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::AllReduceInPlace => "all_reduce_in_place",
            Kind::AllReduceAsync => "all_reduce_async",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::ReduceScatterInPlace => "reduce_scatter_in_place",
            Kind::AllGather => "all_gather",
            Kind::AllGatherInPlace => "all_gather_in_place",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::ReduceInPlace => "reduce_in_place",
            Kind::SendRecv => "send/recv",
            Kind::AllToAll => "all_to_all",
            Kind::Barrier => "barrier",
        }
    }

    fn reduces(self) -> bool {
        matches!(
            self,
            Kind::AllReduce
                | Kind::AllReduceInPlace
                | Kind::AllReduceAsync
                | Kind::ReduceScatter
                | Kind::ReduceScatterInPlace
                | Kind::Reduce
                | Kind::ReduceInPlace
        )
    }

    /// Buffers of `count * size` elements.
    fn blocked(self) -> bool {
        matches!(
            self,
            Kind::ReduceScatter
                | Kind::ReduceScatterInPlace
                | Kind::AllGather
                | Kind::AllGatherInPlace
                | Kind::AllToAll
        )
    }
}

/// Relative weights of the kinds of a single call.
const WEIGHTS: [(Kind, usize); 12] = [
    (Kind::AllReduce, 12),
    (Kind::AllReduceInPlace, 10),
    (Kind::ReduceScatter, 7),
    (Kind::ReduceScatterInPlace, 6),
    (Kind::AllGather, 7),
    (Kind::AllGatherInPlace, 6),
    (Kind::Broadcast, 8),
    (Kind::Reduce, 7),
    (Kind::ReduceInPlace, 6),
    (Kind::SendRecv, 8),
    (Kind::AllToAll, 7),
    (Kind::Barrier, 4),
];

/// One call on one communicator, as every rank of it sees it.
#[derive(Debug, Clone)]
struct Call {
    kind: Kind,
    dtype: DataType,
    op: ReduceOp,
    /// Elements per rank (per block for blocked kinds).
    count: usize,
    /// Root of broadcast and reduce; the sender of send/recv.
    root: usize,
    /// The receiver of send/recv.
    peer: usize,
    /// Float inputs with fractional parts (checked within a tolerance).
    frac: bool,
    /// Non-root ranks of `reduce` pass an empty receive buffer.
    empty_recv: bool,
    /// The buffers lie in windows made for the call.
    windows: bool,
    /// Seeds the inputs of this call.
    salt: u64,
}

impl Call {
    fn describe(&self) -> String {
        let k = self.kind;
        let mut s = k.name().to_string();
        if k == Kind::Barrier {
            return s;
        }
        s += &format!(" {}", self.dtype);
        if k.reduces() {
            s += &format!(" {}", self.op.name());
            if self.frac {
                s += " fractional";
            }
        }
        s += &format!(
            " {} element{}{}",
            self.count,
            if self.count == 1 { "" } else { "s" },
            if k.blocked() { " per block" } else { "" }
        );
        if self.windows {
            s += " in windows";
        }
        match k {
            Kind::Broadcast | Kind::Reduce | Kind::ReduceInPlace => {
                s += &format!(" root {}", self.root);
                if k == Kind::Reduce && self.empty_recv {
                    s += " (empty recv off the root)";
                }
            }
            Kind::SendRecv => s += &format!(" from rank {} to rank {}", self.root, self.peer),
            _ => {}
        }
        s
    }
}

/// What one communicator does in one step.
#[derive(Debug, Clone)]
enum Action {
    Call(Call),
    /// Async allreduces issued back to back, optionally a blocking call
    /// issued after them, then the async ones waited in order.
    Batch {
        calls: Vec<Call>,
        between: Option<Call>,
    },
}

impl Action {
    fn describe(&self) -> String {
        match self {
            Action::Call(c) => c.describe(),
            Action::Batch { calls, between } => {
                let list: Vec<String> = calls.iter().map(Call::describe).collect();
                let mut s = format!("async batch of {}: [{}]", calls.len(), list.join("; "));
                if let Some(b) = between {
                    s += &format!(", then blocking {} before the waits", b.describe());
                }
                s
            }
        }
    }
}

/// A split: every parent rank's color and key.
#[derive(Debug, Clone)]
struct SplitPlan {
    index: usize,
    colors: Vec<i32>,
    keys: Vec<i32>,
}

impl SplitPlan {
    /// The parent ranks of `color`, ordered as the sub-communicator ranks
    /// them: by key, ties by parent rank.
    fn members(&self, color: i32) -> Vec<usize> {
        let mut m: Vec<(i32, usize)> = (0..self.colors.len())
            .filter(|&r| self.colors[r] == color)
            .map(|r| (self.keys[r], r))
            .collect();
        m.sort_unstable();
        m.into_iter().map(|(_, r)| r).collect()
    }

    /// The colors in use, ascending.
    fn groups(&self) -> Vec<i32> {
        let mut c: Vec<i32> = self.colors.iter().copied().filter(|&c| c >= 0).collect();
        c.sort_unstable();
        c.dedup();
        c
    }
}

/// One step of the sequence.
#[derive(Debug, Clone)]
enum Step {
    /// Every rank of the job.
    World(Action),
    /// Every rank calls split; the members of each color get a communicator.
    Split(SplitPlan),
    /// Each sub-communicator of the current split does its action (by
    /// color); `last` ends the split (the sub-communicators are dropped).
    Sub {
        actions: Vec<(i32, Action)>,
        last: bool,
    },
}

/// Draws the sequence; every rank runs one, in step.
struct Generator {
    rng: Rng,
    size: usize,
    max_count: usize,
    splits: bool,
    windows: bool,
    /// The current split and the sub-steps it has left.
    split: Option<(SplitPlan, usize)>,
    splits_made: usize,
}

impl Generator {
    fn new(seed: u64, size: usize, opts: &Options) -> Self {
        Generator {
            rng: Rng(mix(seed ^ 0x50a4_50a4)),
            size,
            max_count: opts.max_count,
            splits: opts.splits,
            windows: opts.windows,
            split: None,
            splits_made: 0,
        }
    }

    fn next_step(&mut self) -> Step {
        if let Some((plan, left)) = self.split.take() {
            if self.rng.chance(20) {
                // The parent stays usable while its children live.
                let action = self.action(self.size);
                self.split = Some((plan, left));
                return Step::World(action);
            }
            let actions = plan
                .groups()
                .into_iter()
                .map(|c| (c, self.action(plan.members(c).len())))
                .collect();
            let last = left <= 1;
            if !last {
                self.split = Some((plan, left - 1));
            }
            return Step::Sub { actions, last };
        }
        if self.splits && self.rng.chance(6) {
            let n = self.size;
            let ncolors = 1 + self.rng.below(n.min(3));
            let colors = (0..n)
                .map(|_| {
                    if self.rng.chance(15) {
                        -1 - self.rng.below(2) as i32
                    } else {
                        self.rng.below(ncolors) as i32
                    }
                })
                .collect();
            let keys = (0..n).map(|_| self.rng.below(5) as i32 - 2).collect();
            let plan = SplitPlan {
                index: self.splits_made,
                colors,
                keys,
            };
            self.splits_made += 1;
            self.split = Some((plan.clone(), 1 + self.rng.below(6)));
            return Step::Split(plan);
        }
        Step::World(self.action(self.size))
    }

    /// An action for a communicator of `n` ranks.
    fn action(&mut self, n: usize) -> Action {
        if self.rng.chance(8) {
            let calls = (0..1 + self.rng.below(4))
                .map(|_| self.call(Kind::AllReduceAsync, n))
                .collect();
            let between = if self.rng.chance(30) {
                let kind = self
                    .rng
                    .pick(&[Kind::AllReduce, Kind::Barrier, Kind::Broadcast]);
                Some(self.call(kind, n))
            } else {
                None
            };
            return Action::Batch { calls, between };
        }
        let total: usize = WEIGHTS.iter().map(|w| w.1).sum();
        let mut x = self.rng.below(total);
        let mut kind = Kind::Barrier;
        for (k, w) in WEIGHTS {
            if x < w {
                kind = k;
                break;
            }
            x -= w;
        }
        if kind == Kind::SendRecv && n < 2 {
            kind = Kind::AllReduce;
        }
        Action::Call(self.call(kind, n))
    }

    fn call(&mut self, kind: Kind, n: usize) -> Call {
        let dtype = self.rng.pick(&DataType::ALL);
        let op = self.rng.pick(&ReduceOp::ALL);
        let limit = if kind.blocked() {
            self.max_count / n
        } else {
            self.max_count
        };
        let count = if kind == Kind::Barrier {
            0
        } else {
            self.count(n, limit)
        };
        let root = self.rng.below(n);
        let peer = if n > 1 {
            (root + 1 + self.rng.below(n - 1)) % n
        } else {
            root
        };
        let frac = is_float(dtype) && op != ReduceOp::Prod && self.rng.chance(30);
        Call {
            kind,
            dtype,
            op,
            count,
            root,
            peer,
            frac,
            empty_recv: self.rng.chance(50),
            // Not send/recv, whose ranks hold different buffers (windows
            // are made by every rank together).
            windows: self.windows
                && !matches!(kind, Kind::SendRecv | Kind::Barrier)
                && self.rng.chance(25),
            salt: self.rng.next(),
        }
    }

    /// A count skewed towards the edges: 0, 1, the rank count give or take
    /// one, small odd numbers, powers of two give or take one; sometimes
    /// anything up to `limit`.
    fn count(&mut self, n: usize, limit: usize) -> usize {
        let r = &mut self.rng;
        let c = match r.below(100) {
            0..=9 => 0,
            10..=19 => 1,
            20..=29 => n + r.below(3) - 1,
            30..=54 => 2 + r.below(63),
            55..=66 => (1usize << (4 + r.below(14))) + r.below(3) - 1,
            67..=87 => 65 + r.below(4032),
            _ => r.below(limit + 1),
        };
        let c = if c > 1 && r.chance(50) { c | 1 } else { c };
        c.min(limit)
    }
}

// ------------------------------------------------------------ reference

fn is_float(dt: DataType) -> bool {
    matches!(
        dt,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
    )
}

/// The integers every value of `dt` in this soak lies in: exact in the type
/// and in f64.
fn int_range(dt: DataType) -> (i128, i128) {
    match dt {
        DataType::I8 => (-128, 127),
        DataType::U8 => (0, 255),
        DataType::I32 => (i128::from(i32::MIN), i128::from(i32::MAX)),
        DataType::U32 => (0, i128::from(u32::MAX)),
        DataType::I64 | DataType::F64 => (-(1 << 53), 1 << 53),
        DataType::U64 => (0, 1 << 53),
        DataType::F32 => (-(1 << 24), 1 << 24),
        DataType::F16 => (-2048, 2048),
        DataType::Bf16 => (-256, 256),
    }
}

/// `v` rounded to `dt` (done here with `half` and `as`, not with the
/// library's conversions).
fn quantize(dt: DataType, v: f64) -> f64 {
    match dt {
        DataType::F64 => v,
        DataType::F32 => f64::from(v as f32),
        DataType::F16 => f16::from_f64(v).to_f64(),
        DataType::Bf16 => bf16::from_f64(v).to_f64(),
        _ => v.trunc(),
    }
}

/// Unit roundoff of one step of a reduction in `dt`: f16 and bf16 combine
/// in f32 and round back, so both roundings count.
fn unit_roundoff(dt: DataType) -> f64 {
    match dt {
        DataType::F64 => 2f64.powi(-53),
        DataType::F32 => 2f64.powi(-24),
        DataType::F16 => 2f64.powi(-11) + 2f64.powi(-24),
        DataType::Bf16 => 2f64.powi(-8) + 2f64.powi(-24),
        _ => 0.0,
    }
}

/// Uniform integer in `lo..=hi` from `h`.
fn in_range(h: u64, lo: i128, hi: i128) -> i128 {
    lo + (i128::from(h) % (hi - lo + 1))
}

/// Uniform in [-1, 1) with a full 53-bit mantissa.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Element `i` of the data rank `r` moves (gather, broadcast, send,
/// all-to-all): anything the type holds exactly.
fn moved(c: &Call, r: usize, i: usize) -> f64 {
    let h = hash(&[c.salt, 1, r as u64, i as u64]);
    if is_float(c.dtype) {
        quantize(c.dtype, unit(h) * 1000.0)
    } else {
        let (lo, hi) = int_range(c.dtype);
        in_range(h, lo, hi) as f64
    }
}

/// What a receive buffer holds before the call: anything the type holds,
/// unlikely to equal the result.
fn garbage(c: &Call, i: usize) -> f64 {
    let h = hash(&[c.salt, 2, i as u64]);
    if is_float(c.dtype) {
        quantize(c.dtype, unit(h) * 777.0)
    } else {
        let (lo, hi) = int_range(c.dtype);
        in_range(h, lo, hi) as f64
    }
}

/// Integer input of rank `r` of `n` at element `i` of a reducing call:
/// bounded so that every partial and final result of the op is exact in
/// the type (sums: each rank within 1/n of the type's exact range; products:
/// at most two factors other than 1, of magnitude at most 3 and 2).
fn int_input(c: &Call, n: usize, r: usize, i: usize) -> i128 {
    let signed = int_range(c.dtype).0 < 0;
    if c.op == ReduceOp::Prod {
        let h = hash(&[c.salt, 3, i as u64]);
        let a = (h % n as u64) as usize;
        let b = ((h >> 16) % n as u64) as usize;
        let fa: &[i128] = if signed {
            &[2, 3, -1, -2, 0]
        } else {
            &[2, 3, 0]
        };
        let fb: &[i128] = if signed { &[2, -1, 1] } else { &[2, 1] };
        if r == a {
            return fa[((h >> 32) % fa.len() as u64) as usize];
        }
        if r == b {
            return fb[((h >> 40) % fb.len() as u64) as usize];
        }
        return 1;
    }
    let (lo, hi) = int_range(c.dtype);
    let (lo, hi) = match c.op {
        ReduceOp::Sum | ReduceOp::Avg => (lo / n as i128, hi / n as i128),
        _ => (lo, hi),
    };
    // Small values most of the time, the whole range sometimes.
    let cap = match c.salt % 3 {
        0 => 4,
        1 => 100,
        _ => i128::MAX,
    };
    in_range(
        hash(&[c.salt, 4, r as u64, i as u64]),
        lo.max(-cap),
        hi.min(cap),
    )
}

/// Fractional float input of rank `r` at element `i` (already in the type).
fn frac_input(c: &Call, r: usize, i: usize) -> f64 {
    quantize(c.dtype, unit(hash(&[c.salt, 5, r as u64, i as u64])))
}

/// Input of rank `r` of `n` at element `i` of a reducing call.
fn input(c: &Call, n: usize, r: usize, i: usize) -> f64 {
    if c.frac {
        frac_input(c, r, i)
    } else {
        int_input(c, n, r, i) as f64
    }
}

/// The reference result at element `i` of a reducing call over `n` ranks
/// and the allowed |got - want|.
fn reference(c: &Call, n: usize, i: usize) -> (f64, f64) {
    if c.frac {
        let vals: Vec<f64> = (0..n).map(|r| frac_input(c, r, i)).collect();
        let sum: f64 = vals.iter().sum();
        let abs: f64 = vals.iter().map(|v| v.abs()).sum();
        return match c.op {
            ReduceOp::Min => (vals.iter().copied().fold(f64::INFINITY, f64::min), 0.0),
            ReduceOp::Max => (vals.iter().copied().fold(f64::NEG_INFINITY, f64::max), 0.0),
            ReduceOp::Avg => {
                let want = sum / n as f64;
                (want, tolerance_frac(c.dtype, n, abs, want, true))
            }
            _ => (sum, tolerance_frac(c.dtype, n, abs, sum, false)),
        };
    }
    let vals = (0..n).map(|r| int_input(c, n, r, i));
    let exact: i128 = match c.op {
        ReduceOp::Sum | ReduceOp::Avg => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Min => vals.min().unwrap_or(0),
        ReduceOp::Max => vals.max().unwrap_or(0),
    };
    if c.op != ReduceOp::Avg {
        return (exact as f64, 0.0);
    }
    if !is_float(c.dtype) {
        // Integer Avg truncates toward zero (as i128 division does).
        return ((exact / n as i128) as f64, 0.0);
    }
    // The sum is exact; the one division rounds once (twice for f16/bf16:
    // to f32, then to the type).
    let want = exact as f64 / n as f64;
    (want, 1.01 * unit_roundoff(c.dtype) * want.abs())
}

/// Allowed error of a fractional Sum or Avg of `n` terms whose magnitudes
/// add up to `abs`. Any summation order (ring, tree, one-shot: each a tree
/// of n-1 additions of height at most n-1) computes the sum within
/// γ(n-1)·Σ|x| ≤ 1.01·(n-1)·u·Σ|x| (Higham, Accuracy and Stability of
/// Numerical Algorithms, §4.2); Avg divides that error by n and rounds once
/// more (u·|result|). The f64 reference itself may be off by (n-1)·2⁻⁵³·Σ|x|.
fn tolerance_frac(dt: DataType, n: usize, abs: f64, want: f64, avg: bool) -> f64 {
    let u = unit_roundoff(dt);
    let steps = n.saturating_sub(1) as f64;
    let reference_error = steps * 2f64.powi(-53) * abs;
    let sum_error = 1.01 * steps * u * abs;
    if avg {
        (sum_error / n as f64 + 1.01 * u * (want.abs() + sum_error)) + reference_error
    } else {
        sum_error + reference_error
    }
}

// ------------------------------------------------------------ checking

type Checked = Result<(), String>;

/// `$obj.$method::<T>($args)` for the element type `$dt` names.
macro_rules! by_type {
    ($dt:expr, $obj:ident . $method:ident, $($arg:expr),*) => {
        match $dt {
            DataType::F32 => $obj.$method::<f32>($($arg),*),
            DataType::F64 => $obj.$method::<f64>($($arg),*),
            DataType::F16 => $obj.$method::<f16>($($arg),*),
            DataType::Bf16 => $obj.$method::<bf16>($($arg),*),
            DataType::I8 => $obj.$method::<i8>($($arg),*),
            DataType::U8 => $obj.$method::<u8>($($arg),*),
            DataType::I32 => $obj.$method::<i32>($($arg),*),
            DataType::U32 => $obj.$method::<u32>($($arg),*),
            DataType::I64 => $obj.$method::<i64>($($arg),*),
            DataType::U64 => $obj.$method::<u64>($($arg),*),
        }
    };
}

fn make<T: Element>(n: usize, f: impl Fn(usize) -> f64) -> Vec<T> {
    (0..n).map(|i| T::from_f64(f(i))).collect()
}

/// A buffer of a call: a vector, or `len` elements at `at` in a window made
/// for the call (zeroed; the elements around the buffer must stay zero).
enum Buf<T: Element> {
    Vec(Vec<T>),
    Window {
        win: Window<T>,
        at: usize,
        len: usize,
    },
}

impl<T: Element> std::ops::Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buf::Vec(v) => v,
            Buf::Window { win, at, len } => &win[*at..*at + *len],
        }
    }
}

impl<T: Element> std::ops::DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Buf::Vec(v) => v,
            Buf::Window { win, at, len } => &mut win[*at..*at + *len],
        }
    }
}

impl<T: Element> Buf<T> {
    /// In a window: that the call wrote nothing outside the buffer.
    fn untouched_around(&self) -> Checked {
        let Buf::Window { win, at, len } = self else {
            return Ok(());
        };
        let outside = (0..*at).chain(at + len..win.len());
        match outside.into_iter().find(|&i| win[i].to_f64() != 0.0) {
            None => Ok(()),
            Some(i) => Err(format!(
                "wrote outside its buffer: element {i} of the window (buffer at {at}, {len} \
                 elements) is {}",
                win[i].to_f64()
            )),
        }
    }
}

/// Buffer number `k` of call `c` on this rank: `len` elements `f(i)`, in a
/// vector or (if the call says so) in a window made for it, every rank
/// together: half the time at the same offset on every rank (buffers that
/// lie alike against cache lines take the fused kernels), else at one of
/// its own.
fn buffer<T: Element>(
    comm: &Communicator,
    c: &Call,
    k: u64,
    len: usize,
    f: &dyn Fn(usize) -> f64,
) -> Result<Buf<T>, String> {
    if !c.windows {
        return Ok(Buf::Vec(make(len, f)));
    }
    let alike = hash(&[c.salt, 7, k]) & 1 == 0;
    let who = if alike { u64::MAX } else { comm.rank() as u64 };
    let at = (hash(&[c.salt, 6, k, who]) % 65) as usize;
    let mut win = comm
        .alloc_window::<T>(at + len + 1)
        .map_err(|e| format!("alloc_window: {e}"))?;
    for (i, x) in win[at..at + len].iter_mut().enumerate() {
        *x = T::from_f64(f(i));
    }
    Ok(Buf::Window { win, at, len })
}

/// Count an action in the summary.
fn count_action(tally: &mut BTreeMap<String, usize>, a: &Action) {
    let mut one = |c: &Call| {
        *tally.entry(c.kind.name().into()).or_default() += 1;
        if c.windows {
            *tally.entry("in windows".into()).or_default() += 1;
        }
    };
    match a {
        Action::Call(c) => one(c),
        Action::Batch { calls, between } => {
            if let Some(b) = between {
                one(b);
            }
            *tally.entry("async batch".into()).or_default() += 1;
            *tally.entry(Kind::AllReduceAsync.name().into()).or_default() += calls.len();
        }
    }
}

/// Runs the sequence on one rank.
struct Soak {
    seed: u64,
    verbose: bool,
    /// One wrong expectation left to plant (FERROCCL_SOAK_SABOTAGE=1).
    sabotage: Cell<bool>,
    /// Calls that ran without the slots (inline in the check-in, directly
    /// between windows, or by cross-memory attach), as the communicators
    /// count them.
    direct: Cell<u64>,
}

impl Soak {
    /// Compare `got` with `want(i) = (value, tolerance)`; name the first
    /// difference. `inputs(i)`, where given, lists every rank's input there.
    fn check<T: Element>(
        &self,
        what: &str,
        got: &[T],
        want: impl Fn(usize) -> (f64, f64),
        inputs: Option<&dyn Fn(usize) -> Vec<f64>>,
    ) -> Checked {
        for (i, v) in got.iter().enumerate() {
            let (g, (mut w, tol)) = (v.to_f64(), want(i));
            if self.sabotage.get() {
                self.sabotage.set(false);
                w += 1.0;
            }
            if g.is_nan() || (g - w).abs() > tol {
                let mut msg = format!(
                    "wrong result: {what}: element {i} of {} is {g}, expected {w}",
                    got.len()
                );
                if tol > 0.0 {
                    msg += &format!(" within {tol:e}");
                }
                if let Some(inputs) = inputs {
                    msg += &format!(" (inputs by rank: {:?})", inputs(i));
                }
                return Err(msg);
            }
        }
        Ok(())
    }

    fn check_reduced<T: Element>(
        &self,
        what: &str,
        c: &Call,
        n: usize,
        got: &[T],
        offset: usize,
    ) -> Checked {
        let inputs = |i: usize| (0..n).map(|r| input(c, n, r, offset + i)).collect();
        self.check(what, got, |i| reference(c, n, offset + i), Some(&inputs))
    }

    /// One call on `comm`, checked.
    fn call<T: Element>(&self, comm: &Communicator, c: &Call) -> Checked {
        let (rank, n, count) = (comm.rank(), comm.size(), c.count);
        let err = |e: ferroccl::Error| e.to_string();
        let exact = |v: f64| (v, 0.0);
        let made = Cell::new(0u64);
        // Every rank makes the same number of buffers, in the same order
        // (windows are made by all together).
        let buf = |len: usize, f: &dyn Fn(usize) -> f64| {
            let k = made.get();
            made.set(k + 1);
            buffer::<T>(comm, c, k, len, f)
        };
        let mine = |len: usize| buf(len, &|i| input(c, n, rank, i));
        let junk = |len: usize| buf(len, &|i| garbage(c, i));
        let moving = |len: usize, r: usize| buf(len, &|i| moved(c, r, i));
        match c.kind {
            Kind::AllReduce => {
                let send = mine(count)?;
                let mut recv = junk(count)?;
                comm.all_reduce(&send, &mut recv, c.op).map_err(err)?;
                self.check_reduced("result", c, n, &recv, 0)?;
                self.check("send buffer", &send, |i| exact(input(c, n, rank, i)), None)?;
                send.untouched_around().and(recv.untouched_around())
            }
            Kind::AllReduceInPlace | Kind::AllReduceAsync => {
                let mut buf = mine(count)?;
                comm.all_reduce_in_place(&mut buf, c.op).map_err(err)?;
                self.check_reduced("result", c, n, &buf, 0)?;
                buf.untouched_around()
            }
            Kind::ReduceScatter => {
                let send = mine(count * n)?;
                let mut recv = junk(count)?;
                comm.reduce_scatter(&send, &mut recv, c.op).map_err(err)?;
                self.check_reduced("result", c, n, &recv, rank * count)?;
                self.check("send buffer", &send, |i| exact(input(c, n, rank, i)), None)?;
                send.untouched_around().and(recv.untouched_around())
            }
            Kind::ReduceScatterInPlace => {
                let mut buf = mine(count * n)?;
                comm.reduce_scatter_in_place(&mut buf, c.op).map_err(err)?;
                let block = &buf[rank * count..(rank + 1) * count];
                self.check_reduced("own block", c, n, block, rank * count)?;
                buf.untouched_around()
            }
            Kind::AllGather => {
                let send = moving(count, rank)?;
                let mut recv = junk(count * n)?;
                comm.all_gather(&send, &mut recv).map_err(err)?;
                let want = |j: usize| exact(moved(c, j / count, j % count));
                self.check("result", &recv, want, None)?;
                send.untouched_around().and(recv.untouched_around())
            }
            Kind::AllGatherInPlace => {
                let mut buf = buf(count * n, &|j| {
                    if j / count == rank {
                        moved(c, rank, j % count)
                    } else {
                        garbage(c, j)
                    }
                })?;
                comm.all_gather_in_place(&mut buf).map_err(err)?;
                let want = |j: usize| exact(moved(c, j / count, j % count));
                self.check("result", &buf, want, None)?;
                buf.untouched_around()
            }
            Kind::Broadcast => {
                let mut buf = if rank == c.root {
                    moving(count, rank)?
                } else {
                    junk(count)?
                };
                comm.broadcast(&mut buf, c.root).map_err(err)?;
                self.check("result", &buf, |i| exact(moved(c, c.root, i)), None)?;
                buf.untouched_around()
            }
            Kind::Reduce => {
                let send = mine(count)?;
                let mut recv = if rank != c.root && c.empty_recv {
                    junk(0)?
                } else {
                    junk(count)?
                };
                comm.reduce(&send, &mut recv, c.op, c.root).map_err(err)?;
                if rank == c.root {
                    self.check_reduced("result on the root", c, n, &recv, 0)?;
                } else {
                    let what = "receive buffer off the root (must stay untouched)";
                    self.check(what, &recv, |i| exact(garbage(c, i)), None)?;
                }
                self.check("send buffer", &send, |i| exact(input(c, n, rank, i)), None)?;
                send.untouched_around().and(recv.untouched_around())
            }
            Kind::ReduceInPlace => {
                let mut buf = mine(count)?;
                comm.reduce_in_place(&mut buf, c.op, c.root).map_err(err)?;
                if rank == c.root {
                    self.check_reduced("result on the root", c, n, &buf, 0)?;
                } else {
                    let what = "buffer off the root (must stay unchanged)";
                    self.check(what, &buf, |i| exact(input(c, n, rank, i)), None)?;
                }
                buf.untouched_around()
            }
            Kind::SendRecv => {
                if rank == c.root {
                    let send: Vec<T> = make(count, |i| moved(c, rank, i));
                    comm.send(&send, c.peer).map_err(err)?;
                    self.check("send buffer", &send, |i| exact(moved(c, rank, i)), None)
                } else if rank == c.peer {
                    let mut recv: Vec<T> = make(count, |i| garbage(c, i));
                    comm.recv(&mut recv, c.root).map_err(err)?;
                    self.check("received", &recv, |i| exact(moved(c, c.root, i)), None)
                } else {
                    Ok(())
                }
            }
            Kind::AllToAll => {
                let send = buf(count * n, &|j| moved(c, rank, j))?;
                let mut recv = junk(count * n)?;
                comm.all_to_all(&send, &mut recv).map_err(err)?;
                // Block r of the result is block `rank` of rank r's input.
                let want = |j: usize| exact(moved(c, j / count, rank * count + j % count));
                self.check("result", &recv, want, None)?;
                send.untouched_around().and(recv.untouched_around())
            }
            Kind::Barrier => comm.barrier().map_err(err),
        }
    }

    /// Issue one async allreduce; the returned closure waits and checks.
    fn issue<'a, T: Element>(
        &'a self,
        comm: &Communicator,
        c: &'a Call,
    ) -> Result<Box<dyn FnOnce() -> Checked + 'a>, String> {
        let (rank, n) = (comm.rank(), comm.size());
        let buf: Buf<T> = buffer(comm, c, 0, c.count, &|i| input(c, n, rank, i))?;
        let work: Work<Buf<T>> = comm
            .all_reduce_async(buf, c.op)
            .map_err(|e| e.to_string())?;
        Ok(Box::new(move || {
            let out = work.wait().map_err(|e| e.to_string())?;
            if out.len() != c.count {
                return Err(format!(
                    "wait() returned {} elements, expected {}",
                    out.len(),
                    c.count
                ));
            }
            self.check_reduced("result", c, n, &out, 0)?;
            out.untouched_around()
        }))
    }

    fn action(&self, comm: &Communicator, a: &Action) -> Checked {
        let before = comm.direct_window_calls();
        let result = self.action_on(comm, a);
        let direct = comm.direct_window_calls() - before;
        if direct > 0 {
            self.direct.set(self.direct.get() + direct);
        }
        result
    }

    fn action_on(&self, comm: &Communicator, a: &Action) -> Checked {
        match a {
            Action::Call(c) => by_type!(c.dtype, self.call, comm, c),
            Action::Batch { calls, between } => {
                let mut pending = Vec::new();
                for (j, c) in calls.iter().enumerate() {
                    let what = format!("async call {} of {}", j + 1, calls.len());
                    let wait = by_type!(c.dtype, self.issue, comm, c)
                        .map_err(|e| format!("{what}: issue: {e}"))?;
                    pending.push((what, wait));
                }
                if let Some(b) = between {
                    by_type!(b.dtype, self.call, comm, b)
                        .map_err(|e| format!("blocking call between: {e}"))?;
                }
                for (what, wait) in pending {
                    wait().map_err(|e| format!("{what}: {e}"))?;
                }
                Ok(())
            }
        }
    }

    /// Run `ops` steps on `world`; on failure return (step, description,
    /// what went wrong).
    fn run(
        &self,
        world: &Communicator,
        opts: &Options,
        tally: &mut BTreeMap<String, usize>,
    ) -> Result<(), (usize, String, String)> {
        let (rank, size) = (world.rank(), world.size());
        let mut generator = Generator::new(self.seed, size, opts);
        // This rank's communicator of the current split, with its color.
        let mut sub: Option<(i32, Communicator)> = None;
        for i in 0..opts.ops {
            let step = generator.next_step();
            let (desc, result) = match &step {
                Step::World(a) => {
                    count_action(tally, a);
                    let desc = a.describe();
                    self.announce(rank, i, &desc);
                    let r = self.action(world, a);
                    (desc, r)
                }
                Step::Split(plan) => {
                    *tally.entry("split".into()).or_default() += 1;
                    let desc = format!(
                        "split #{}: colors {:?} keys {:?}",
                        plan.index, plan.colors, plan.keys
                    );
                    self.announce(rank, i, &desc);
                    let r = self.split(world, plan).map(|c| {
                        sub = c;
                    });
                    (desc, r)
                }
                Step::Sub { actions, last } => {
                    let mut desc = String::from("no part in this step of the split");
                    let mut r = Ok(());
                    for (color, a) in actions {
                        count_action(tally, a);
                        if let Some((mine, comm)) = &sub {
                            if mine == color {
                                desc = format!(
                                    "in split color {color}, rank {} of {}: {}",
                                    comm.rank(),
                                    comm.size(),
                                    a.describe()
                                );
                                self.announce(rank, i, &desc);
                                r = self.action(comm, a);
                            }
                        }
                    }
                    if *last {
                        sub = None;
                    }
                    (desc, r)
                }
            };
            result.map_err(|e| (i, desc, e))?;
        }
        Ok(())
    }

    /// Split `world` as `plan` says; check this rank's place in the result.
    fn split(
        &self,
        world: &Communicator,
        plan: &SplitPlan,
    ) -> Result<Option<(i32, Communicator)>, String> {
        let rank = world.rank();
        let (color, key) = (plan.colors[rank], plan.keys[rank]);
        let got = world.split(color, key).map_err(|e| e.to_string())?;
        if color < 0 {
            return match got {
                None => Ok(None),
                Some(c) => Err(format!(
                    "color {color} should give no communicator, got rank {} of {}",
                    c.rank(),
                    c.size()
                )),
            };
        }
        let comm = got.ok_or_else(|| format!("color {color} gave no communicator"))?;
        let members = plan.members(color);
        let want = members.iter().position(|&r| r == rank);
        if comm.size() != members.len() || Some(comm.rank()) != want {
            return Err(format!(
                "got rank {} of {}, expected rank {want:?} of {} (members by key: {members:?})",
                comm.rank(),
                comm.size(),
                members.len()
            ));
        }
        Ok(Some((color, comm)))
    }

    fn announce(&self, rank: usize, i: usize, desc: &str) {
        if self.verbose {
            say(&format!("rank {rank}: op #{i}: {desc}"));
        }
    }
}

// ------------------------------------------------------------ main

/// Settings that change what a run does (which path each call takes), for
/// the replay line.
const REPLAY_ENV: [&str; 12] = [
    "FERROCCL_TRANSPORT",
    "FERROCCL_ALGO",
    "FERROCCL_BUFFSIZE",
    "FERROCCL_STEPS",
    "FERROCCL_NSOCKS_PERPEER",
    "FERROCCL_NT_STORE_BYTES",
    "FERROCCL_CHECKIN",
    "FERROCCL_CMA",
    "FERROCCL_SIMD",
    "FERROCCL_CALIBRATE",
    "FERROCCL_FAULT",
    "FERROCCL_SOAK_SABOTAGE",
];

/// The command line that replays this run.
fn replay(size: usize, seed: u64, opts: &Options) -> String {
    let mut s = String::new();
    for var in REPLAY_ENV {
        if let Ok(v) = std::env::var(var) {
            s += &format!("{var}={v} ");
        }
    }
    s += &format!(
        "ferroccl-run -n {size} -- ferroccl-soak --seed {seed} --ops {} --max-count {}",
        opts.ops, opts.max_count
    );
    if !opts.splits {
        s += " --no-splits";
    }
    if !opts.windows {
        s += " --no-windows";
    }
    s
}

/// Agree on the seed (rank 0's) and check that every rank runs the same
/// options.
fn agree(comm: &Communicator, opts: &Options) -> Result<u64, String> {
    let mut seed = [opts.seed.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // Short enough to type.
        mix(nanos ^ u64::from(std::process::id())) % 1_000_000_000
    })];
    comm.broadcast(&mut seed, 0).map_err(|e| e.to_string())?;
    let mine = [
        seed[0],
        opts.ops as u64,
        opts.max_count as u64,
        u64::from(opts.splits),
        u64::from(opts.windows),
    ];
    let k = mine.len();
    let mut all = vec![0u64; k * comm.size()];
    comm.all_gather(&mine, &mut all)
        .map_err(|e| e.to_string())?;
    if let Some(r) = (0..comm.size()).find(|&r| all[k * r..k * (r + 1)] != mine) {
        return Err(format!(
            "rank {r} runs with other options (seed, ops, max-count, splits, windows): {:?}, \
             here {mine:?}",
            &all[k * r..k * (r + 1)]
        ));
    }
    Ok(seed[0])
}

fn main() {
    let opts = tool::options_or_exit("ferroccl-soak", USAGE, parse_options);
    let started = Instant::now();
    let comm = tool::join_or_exit("ferroccl-soak");
    let (rank, size) = (comm.rank(), comm.size());
    let seed = match agree(&comm, &opts) {
        Ok(s) => s,
        Err(e) => {
            say_err(&format!("rank {rank}: agreeing on the seed: {e}"));
            std::process::exit(1);
        }
    };
    if rank == 0 {
        say(&format!(
            "ferroccl-soak: seed {seed}{}, {} ops on {size} ranks, max-count {}, splits {}, \
             windows {}",
            if opts.seed.is_some() {
                ""
            } else {
                " (from the clock)"
            },
            opts.ops,
            opts.max_count,
            if opts.splits { "on" } else { "off" },
            if opts.windows { "on" } else { "off" }
        ));
        say(&format!(
            "ferroccl-soak: replay: {}",
            replay(size, seed, &opts)
        ));
    }
    let soak = Soak {
        seed,
        verbose: opts.verbose,
        sabotage: Cell::new(std::env::var("FERROCCL_SOAK_SABOTAGE").is_ok_and(|v| v == "1")),
        direct: Cell::new(0),
    };
    let mut tally = BTreeMap::new();
    let outcome = soak
        .run(&comm, &opts, &mut tally)
        .map_err(|(i, desc, e)| format!("op #{i} ({desc}): {e}"))
        .and_then(|()| {
            // No rank leaves (rank 0 hosts the rendezvous) before all are done.
            comm.barrier().map_err(|e| format!("final barrier: {e}"))
        });
    if let Err(e) = outcome {
        // Print first, then leave at once: the launcher stops the others.
        say_err(&format!("rank {rank}: {e}"));
        say_err(&format!("replay: {}", replay(size, seed, &opts)));
        std::process::exit(1);
    }
    say(&format!(
        "ferroccl-soak: rank {rank}: {} ops ok (seed {seed})",
        opts.ops
    ));
    if rank == 0 {
        let kinds: Vec<String> = tally.iter().map(|(k, v)| format!("{k} {v}")).collect();
        say(&format!(
            "ferroccl-soak: {} ops ok on {size} ranks in {:.1} s (seed {seed}): {}; on rank 0 {} \
             calls ran without slots (inline, between windows or by cross-memory attach)",
            opts.ops,
            started.elapsed().as_secs_f64(),
            kinds.join(", "),
            soak.direct.get()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options() {
        let parse =
            |a: &[&str]| parse_options(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let o = parse(&["--seed", "7", "--ops=3", "--no-splits"])
            .unwrap()
            .unwrap();
        assert_eq!(
            (o.seed, o.ops, o.max_count, o.splits, o.windows),
            (Some(7), 3, 100_000, false, true)
        );
        let o = parse(&["--no-windows"]).unwrap().unwrap();
        assert!(!o.windows && o.splits);
        assert!(parse(&["--help"]).unwrap().is_none());
        assert!(parse(&["--ops"]).is_err());
        assert!(parse(&["--seed", "x"]).is_err());
        assert!(parse(&["--frob"]).is_err());
    }

    #[test]
    fn sequences_depend_on_the_seed_only() {
        let steps = |seed| {
            let opts = parse_options(&["--max-count=1000".to_string()])
                .unwrap()
                .unwrap();
            let mut g = Generator::new(seed, 4, &opts);
            (0..300)
                .map(|_| format!("{:?}", g.next_step()))
                .collect::<Vec<_>>()
        };
        assert_eq!(steps(5), steps(5));
        assert_ne!(steps(5), steps(6));
    }

    #[test]
    fn integer_references_stay_in_range() {
        let opts = parse_options(&["--max-count=50".to_string(), "--no-splits".to_string()])
            .unwrap()
            .unwrap();
        let mut g = Generator::new(1, 5, &opts);
        for _ in 0..2000 {
            let n = 1 + g.rng.below(8);
            let c = g.call(Kind::AllReduce, n);
            if c.frac {
                continue;
            }
            let (lo, hi) = int_range(c.dtype);
            for i in 0..c.count {
                let (want, _) = reference(&c, n, i);
                assert!(want >= lo as f64 && want <= hi as f64, "{c:?} {i}: {want}");
                for r in 0..n {
                    let v = int_input(&c, n, r, i) as f64;
                    assert!(v >= lo as f64 && v <= hi as f64, "{c:?}");
                }
            }
        }
    }
}
