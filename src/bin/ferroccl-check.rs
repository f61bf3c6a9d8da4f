//! `ferroccl-check`: check a ferroccl installation under any launcher.
//!
//! Why one file of about 880 lines: it is one program, the check matrix
//! and the fault-injection options the test suite drives, and every part
//! of it runs in each invocation.
//!
//! ```text
//! ferroccl-run -n 4 -- ferroccl-check
//! torchrun --nproc-per-node 4 --no-python ferroccl-check
//! mpirun -n 4 ferroccl-check
//! ```
//!
//! Every rank joins with `Communicator::from_env()`, runs every collective for
//! a few element types and counts (0 and odd ones included) and checks each
//! result against an f64 reference computed here, independently of the
//! library. Rank 0 prints one line per check; every rank prints a summary.
//! Exit status: 0 when every check passed, 1 on the first error (printed
//! with this rank's number), 2 on a bad command line.
//!
//! The fault-injection options exist for the test suite: `--die-rank R
//! --die-at K` makes rank R kill itself with SIGKILL right before its K-th
//! collective call, `--hang-rank R --hang-at K` makes it sleep for an hour
//! there instead, `--stop-rank R --stop-at K` stops it there with SIGSTOP,
//! `--kill-rank R --kill-after-ms M` kills it with SIGKILL M ms after it
//! joined, wherever it is then, and `--mismatch-rank R --mismatch-at K`
//! makes it issue an extra all_reduce that no other rank issues.
//! `--die-rank`/`--die-at` may be given several times (pairs in order;
//! ranks are the job's, as the launcher numbers them). `--survive` makes
//! the survivors of a failure go on: each prints its error, shrinks the
//! communicator (`Communicator::shrink_failed`), runs one allreduce on the
//! new one and prints `rank R: went on as rank r of n ...` with the wall
//! clock of that first collective (the dying rank prints the wall clock of
//! its kill: their difference is the time to recover), then runs every
//! check again on the new communicator, down to one rank.
//! `--wrong CASE` runs one call in which rank 1 passes an argument that
//! differs from the other ranks' (`root`: a broadcast of `--count` u32 from
//! root 1 where the others name root 0; `op`: a reduce to root 0 with Max
//! where rank 0 says Sum; `bad-root`: a broadcast root out of range;
//! `bad-len`: an allgather output one element short), and every rank prints
//! how that call ended (`rank R: wrong call (CASE) ended after T ms: ...`;
//! where it ended `ok`, a barrier follows and the line ends with `ok, then:`
//! and how the barrier ended: a small broadcast's root and a small reduce's
//! senders learn of a mismatch in their next call, `Config::early_return`)
//! and exits 0.

mod tool;

use ferroccl::{Communicator, DataType, Element, Error, ReduceOp};
use half::{bf16, f16};
use std::time::{Duration, Instant};
use tool::{say, say_err};

const USAGE: &str = "\
usage: ferroccl-check [options]

Run under a launcher (ferroccl-run, torchrun, mpirun, srun): joins the job
from its environment, runs every collective for several element types and
counts, checks every result against an f64 reference, and exits 0 when all
checks pass, 1 with the error otherwise.

options:
      --count N        largest element count per check (default 1000)
      --iters K        run the whole set K times (default 1)
      --delay-ms M     sleep M milliseconds before every collective call
      --die-rank R     with --die-at K: rank R kills itself with SIGKILL
      --die-at K         right before its K-th collective call (1-based);
                         the pair may be repeated (job ranks)
      --survive        on a failure, the survivors shrink the communicator
                       and run the checks again on the new one
      --hang-rank R    with --hang-at K: rank R sleeps for an hour right
      --hang-at K        before its K-th collective call (1-based)
      --stop-rank R    with --stop-at K: rank R stops itself with SIGSTOP
      --stop-at K        right before its K-th collective call (1-based)
      --kill-rank R    with --kill-after-ms M: rank R kills itself with
      --kill-after-ms M  SIGKILL M ms after joining, wherever it is then
      --mismatch-rank R  with --mismatch-at K: rank R issues an extra
      --mismatch-at K    all_reduce (a mismatch) before its K-th call
      --wrong CASE     rank 1 makes one call with a wrong argument (root,
                       op, bad-root, bad-len); every rank prints how its
                       call ended
      --windows        run allreduce, reduce-scatter and allgather on
                       buffers from Communicator::alloc_window (directly
                       between the ranks' buffers where memory is shared)
  -h, --help           print this help";

/// The parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Options {
    count: usize,
    iters: usize,
    delay: Duration,
    /// (job rank, call) pairs at which that rank kills itself.
    die: Vec<(usize, u64)>,
    /// Survivors of a failure shrink the communicator and go on.
    survive: bool,
    /// (rank, call) at which that rank hangs.
    hang: Option<(usize, u64)>,
    /// (rank, call) at which that rank stops itself (SIGSTOP).
    stop: Option<(usize, u64)>,
    /// (rank, milliseconds after joining) at which that rank is killed.
    kill: Option<(usize, u64)>,
    /// (rank, call) before which that rank issues a call nobody else does.
    mismatch: Option<(usize, u64)>,
    /// Run the reducing and gathering checks on windows.
    windows: bool,
    /// One call with a wrong argument on rank 1, instead of the checks.
    wrong: Option<String>,
}

/// Parse the arguments (without the program name); `Ok(None)` asks for help.
fn parse_options(args: &[String]) -> Result<Option<Options>, String> {
    let mut count = 1000usize;
    let mut windows = false;
    let mut survive = false;
    let (mut die_ranks, mut die_ats) = (Vec::new(), Vec::new());
    let mut wrong = None;
    let mut iters = 1usize;
    let mut delay_ms = 0u64;
    let (mut hang_rank, mut hang_at) = (None, None);
    let (mut stop_rank, mut stop_at) = (None, None);
    let (mut kill_rank, mut kill_after) = (None, None);
    let (mut mismatch_rank, mut mismatch_at) = (None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if matches!(name, "-h" | "--help") {
            return Ok(None);
        }
        if name == "--windows" && inline.is_none() {
            windows = true;
            continue;
        }
        if name == "--survive" && inline.is_none() {
            survive = true;
            continue;
        }
        if name == "--wrong" {
            let case = match inline {
                Some(v) => v,
                None => it.next().cloned().ok_or("--wrong needs a case")?,
            };
            if !matches!(case.as_str(), "root" | "op" | "bad-root" | "bad-len") {
                return Err(format!(
                    "--wrong '{case}': the cases are root, op, bad-root, bad-len"
                ));
            }
            wrong = Some(case);
            continue;
        }
        if !matches!(
            name,
            "--count"
                | "--iters"
                | "--delay-ms"
                | "--die-rank"
                | "--die-at"
                | "--hang-rank"
                | "--hang-at"
                | "--stop-rank"
                | "--stop-at"
                | "--kill-rank"
                | "--kill-after-ms"
                | "--mismatch-rank"
                | "--mismatch-at"
        ) {
            return Err(format!("unknown argument '{arg}'"));
        }
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))?,
        };
        let number = |v: &str| -> Result<u64, String> {
            v.trim()
                .parse::<u64>()
                .map_err(|_| format!("{name} '{v}' is not a non-negative whole number"))
        };
        let n = number(&value)?;
        match name {
            "--count" => count = n as usize,
            "--iters" => iters = n as usize,
            "--delay-ms" => delay_ms = n,
            "--die-rank" => die_ranks.push(n as usize),
            "--die-at" => die_ats.push(n),
            "--hang-rank" => hang_rank = Some(n as usize),
            "--hang-at" => hang_at = Some(n),
            "--stop-rank" => stop_rank = Some(n as usize),
            "--stop-at" => stop_at = Some(n),
            "--kill-rank" => kill_rank = Some(n as usize),
            "--kill-after-ms" => kill_after = Some(n),
            "--mismatch-rank" => mismatch_rank = Some(n as usize),
            "--mismatch-at" => mismatch_at = Some(n),
            _ => unreachable!("checked above"),
        }
    }
    let pair = |what: &str, rank: Option<usize>, at: Option<u64>| match (rank, at) {
        (Some(r), Some(k)) if k >= 1 => Ok(Some((r, k))),
        (Some(_), Some(_)) => Err(format!("--{what}-at counts calls from 1")),
        (None, None) => Ok(None),
        _ => Err(format!("--{what}-rank and --{what}-at go together")),
    };
    Ok(Some(Options {
        count,
        iters,
        delay: Duration::from_millis(delay_ms),
        die: {
            if die_ranks.len() != die_ats.len() {
                return Err("--die-rank and --die-at go together".into());
            }
            let mut die = Vec::new();
            for (r, k) in die_ranks.into_iter().zip(die_ats) {
                die.extend(pair("die", Some(r), Some(k))?);
            }
            die
        },
        survive,
        hang: pair("hang", hang_rank, hang_at)?,
        stop: pair("stop", stop_rank, stop_at)?,
        kill: match (kill_rank, kill_after) {
            (Some(r), Some(ms)) => Some((r, ms)),
            (None, None) => None,
            _ => return Err("--kill-rank and --kill-after-ms go together".into()),
        },
        mismatch: pair("mismatch", mismatch_rank, mismatch_at)?,
        windows,
        wrong,
    }))
}

/// Why a check did not pass.
enum Failure {
    /// The library returned an error.
    Comm(Error),
    /// A result differs from the reference.
    Wrong(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Comm(e)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Comm(e) => write!(f, "{e}"),
            Failure::Wrong(m) => write!(f, "wrong result: {m}"),
        }
    }
}

type Checked = Result<(), Failure>;

// ------------------------------------------------------------ reference

fn is_signed(dt: DataType) -> bool {
    !matches!(dt, DataType::U8 | DataType::U32 | DataType::U64)
}

fn is_float(dt: DataType) -> bool {
    matches!(
        dt,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
    )
}

/// Largest |value| per rank such that any sum over `size` ranks is exact in
/// `dt` (integers within range, floats within their exact-integer range).
fn magnitude(dt: DataType, size: usize) -> usize {
    let exact_limit: usize = match dt {
        DataType::U8 => 255 / 2,
        DataType::I8 => 127,
        DataType::Bf16 => 256,
        DataType::F16 => 2048,
        _ => 1 << 24,
    };
    (exact_limit / size.max(1)).min(4)
}

/// Input of `rank` at element `i` of a call with `op`. Products: one rank
/// (which depends on `i`) gives 2 (or -1), the rest give 1, so every
/// product is exact; other ops: small integers.
fn input(dt: DataType, op: ReduceOp, rank: usize, size: usize, i: usize) -> f64 {
    if op == ReduceOp::Prod {
        return if i % size == rank {
            if is_signed(dt) && i.is_multiple_of(3) {
                -1.0
            } else {
                2.0
            }
        } else {
            1.0
        };
    }
    let m = magnitude(dt, size);
    if m == 0 {
        // Too many ranks for small values: one rank gives 1.
        return f64::from(u8::from(i % size == rank));
    }
    let h = ((i.wrapping_mul(7) + rank.wrapping_mul(13) + 5) % (2 * m + 1)) as f64;
    if is_signed(dt) {
        h - m as f64
    } else {
        h
    }
}

/// The f64 reference of `op` over every rank's input at element `i`.
fn expected(dt: DataType, op: ReduceOp, size: usize, i: usize) -> f64 {
    let vals = (0..size).map(|r| input(dt, op, r, size, i));
    match op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg => {
            let avg = vals.sum::<f64>() / size as f64;
            if is_float(dt) {
                avg
            } else {
                avg.trunc() // integer Avg truncates toward zero
            }
        }
    }
}

/// Allowed |got - want|: exact, except the one rounding of a float Avg.
fn tolerance(dt: DataType, op: ReduceOp, want: f64) -> f64 {
    if op != ReduceOp::Avg || !is_float(dt) {
        return 0.0;
    }
    let ulp = match dt {
        DataType::Bf16 => 2f64.powi(-7),
        DataType::F16 => 2f64.powi(-10),
        DataType::F32 => 2f64.powi(-23),
        _ => 2f64.powi(-52),
    };
    want.abs() * ulp
}

/// An identifying value for element `i` of rank `r`'s data, exact in every
/// type (below 100).
fn tag(r: usize, i: usize) -> f64 {
    ((r * 31 + i * 7) % 100) as f64
}

fn make<T: Element>(n: usize, f: impl Fn(usize) -> f64) -> Vec<T> {
    (0..n).map(|i| T::from_f64(f(i))).collect()
}

/// Compare `got` with `want(i)` within `tol(want)`; name the first difference.
fn compare<T: Element>(
    what: &str,
    got: &[T],
    want: impl Fn(usize) -> f64,
    tol: impl Fn(f64) -> f64,
) -> Checked {
    for (i, v) in got.iter().enumerate() {
        let (g, w) = (v.to_f64(), want(i));
        if (g - w).abs() > tol(w) || g.is_nan() {
            return Err(Failure::Wrong(format!(
                "{what}: element {i} of {} is {g}, expected {w}",
                got.len()
            )));
        }
    }
    Ok(())
}

fn exact(_: f64) -> f64 {
    0.0
}

// ------------------------------------------------------------ the checks

struct Checker<'a> {
    comm: &'a Communicator,
    opts: &'a Options,
    /// Collective calls made so far on this rank (for the fault injection),
    /// over every communicator it went on with.
    calls: u64,
    /// This rank in the job (the launcher's), whatever communicator it is
    /// on now.
    job_rank: usize,
    /// Checks passed on this rank.
    passed: usize,
    /// Rotates the reduction operator from one reducing check to the next.
    op_turn: usize,
}

impl Checker<'_> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn size(&self) -> usize {
        self.comm.size()
    }

    fn next_op(&mut self) -> ReduceOp {
        let op = ReduceOp::ALL[self.op_turn % ReduceOp::ALL.len()];
        self.op_turn += 1;
        op
    }

    /// Called right before every collective call: delay and fault injection.
    fn before_call(&mut self) {
        self.calls += 1;
        let k = self.calls;
        let rank = self.rank();
        if !self.opts.delay.is_zero() {
            std::thread::sleep(self.opts.delay);
        }
        if self.opts.die.contains(&(self.job_rank, k)) {
            let rank = self.job_rank;
            say_err(&format!(
                "rank {rank}: killing this process with SIGKILL before collective call {k} \
                 (--die-at) at unix_us {}",
                unix_us()
            ));
            let pid = std::process::id().to_string();
            // `kill` the program, or the shell's builtin where there is none.
            let killed = std::process::Command::new("kill")
                .args(["-9", &pid])
                .status()
                .is_ok_and(|s| s.success())
                || std::process::Command::new("sh")
                    .args(["-c", &format!("kill -9 {pid}")])
                    .status()
                    .is_ok_and(|s| s.success());
            if killed {
                // SIGKILL is on its way; never run the call.
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            say_err(&format!("rank {rank}: could not SIGKILL itself; aborting"));
            std::process::abort();
        }
        if self.opts.stop == Some((rank, k)) {
            let pid = std::process::id();
            say_err(&format!(
                "rank {rank}: stopping this process (pid {pid}) with SIGSTOP before collective \
                 call {k} (--stop-at)"
            ));
            if !signal_self("STOP") {
                say_err(&format!("rank {rank}: could not SIGSTOP itself; aborting"));
                std::process::abort();
            }
        }
        if self.opts.mismatch == Some((rank, k)) {
            say_err(&format!(
                "rank {rank}: issuing an extra all_reduce before collective call {k} \
                 (--mismatch-at)"
            ));
            let mut odd = [1u8; 7919];
            if let Err(e) = self.comm.all_reduce_in_place(&mut odd, ReduceOp::Max) {
                say_err(&format!("rank {rank}: {e}"));
                std::process::exit(1);
            }
        }
        if self.opts.hang == Some((rank, k)) {
            say_err(&format!(
                "rank {rank}: hanging for an hour before collective call {k} (--hang-at)"
            ));
            std::thread::sleep(Duration::from_secs(3600));
        }
    }

    fn pass(&mut self, what: &str) {
        self.passed += 1;
        if self.rank() == 0 {
            say(&format!("ok {what}"));
        }
    }

    /// Every collective on element type `T` with `count` elements (per rank
    /// block where a call has blocks).
    fn run_type<T: Element>(&mut self, count: usize) -> Checked {
        let (rank, n, dt) = (self.rank(), self.size(), T::DTYPE);
        let comm = self.comm;

        // all_reduce, out of place.
        let op = self.next_op();
        let what = format!("all_reduce {dt} {} {count} elements", op.name());
        let send: Vec<T> = make(count, |i| input(dt, op, rank, n, i));
        let mut recv = vec![T::from_f64(99.0); count];
        // With --windows: two windows of `count * n` for this type.
        let mut windows = if self.opts.windows {
            Some((
                comm.alloc_window::<T>(count * n)?,
                comm.alloc_window::<T>(count * n)?,
            ))
        } else {
            None
        };
        self.before_call();
        match &mut windows {
            Some((a, b)) => {
                a[..count].copy_from_slice(&send);
                comm.all_reduce(&a[..count], &mut b[..count], op)?;
                recv.copy_from_slice(&b[..count]);
            }
            None => comm.all_reduce(&send, &mut recv, op)?,
        }
        compare(
            &what,
            &recv,
            |i| expected(dt, op, n, i),
            |w| tolerance(dt, op, w),
        )?;
        self.pass(&what);

        // all_reduce, in place.
        let op = self.next_op();
        let what = format!("all_reduce_in_place {dt} {} {count} elements", op.name());
        let mut buf: Vec<T> = make(count, |i| input(dt, op, rank, n, i));
        self.before_call();
        match &mut windows {
            Some((a, _)) => {
                a[..count].copy_from_slice(&buf);
                comm.all_reduce_in_place(&mut a[..count], op)?;
                buf.copy_from_slice(&a[..count]);
            }
            None => comm.all_reduce_in_place(&mut buf, op)?,
        }
        compare(
            &what,
            &buf,
            |i| expected(dt, op, n, i),
            |w| tolerance(dt, op, w),
        )?;
        self.pass(&what);

        // reduce_scatter: block r of every input reduces onto rank r.
        let op = self.next_op();
        let what = format!(
            "reduce_scatter {dt} {} {count} elements per rank",
            op.name()
        );
        let send: Vec<T> = make(count * n, |i| input(dt, op, rank, n, i));
        let mut recv = vec![T::from_f64(99.0); count];
        self.before_call();
        match &mut windows {
            Some((a, _)) => {
                a.copy_from_slice(&send);
                comm.reduce_scatter(a, &mut recv, op)?;
            }
            None => comm.reduce_scatter(&send, &mut recv, op)?,
        }
        compare(
            &what,
            &recv,
            |i| expected(dt, op, n, rank * count + i),
            |w| tolerance(dt, op, w),
        )?;
        self.pass(&what);

        // all_gather.
        let what = format!("all_gather {dt} {count} elements per rank");
        let mine: Vec<T> = make(count, |i| tag(rank, i));
        let mut all = vec![T::from_f64(99.0); count * n];
        self.before_call();
        match &mut windows {
            Some((_, b)) => {
                b.fill(T::from_f64(99.0));
                comm.all_gather(&mine, b)?;
                all.copy_from_slice(b);
            }
            None => comm.all_gather(&mine, &mut all)?,
        }
        compare(
            &what,
            &all,
            |j| tag(j / count.max(1), j % count.max(1)),
            exact,
        )?;
        self.pass(&what);

        // broadcast from a root that moves with the call count.
        let root = (self.calls as usize) % n;
        let what = format!("broadcast {dt} {count} elements from rank {root}");
        let mut buf: Vec<T> = make(count, |i| tag(rank, i));
        self.before_call();
        comm.broadcast(&mut buf, root)?;
        compare(&what, &buf, |i| tag(root, i), exact)?;
        self.pass(&what);

        // reduce to another root.
        let op = self.next_op();
        let root = (root + 1) % n;
        let what = format!("reduce {dt} {} {count} elements to rank {root}", op.name());
        let send: Vec<T> = make(count, |i| input(dt, op, rank, n, i));
        let mut recv = if rank == root {
            vec![T::from_f64(99.0); count]
        } else {
            Vec::new()
        };
        self.before_call();
        comm.reduce(&send, &mut recv, op, root)?;
        compare(
            &what,
            &recv,
            |i| expected(dt, op, n, i),
            |w| tolerance(dt, op, w),
        )?;
        self.pass(&what);

        // send/recv around the ring: rank 0 sends first, every other rank
        // receives from its predecessor first, so no rank waits on a rank
        // that is itself waiting to send.
        if n > 1 {
            let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
            let what = format!("send/recv {dt} {count} elements around the ring");
            let mine: Vec<T> = make(count, |i| tag(rank, i));
            let mut got = vec![T::from_f64(99.0); count];
            if rank == 0 {
                self.before_call();
                comm.send(&mine, next)?;
                self.before_call();
                comm.recv(&mut got, prev)?;
            } else {
                self.before_call();
                comm.recv(&mut got, prev)?;
                self.before_call();
                comm.send(&mine, next)?;
            }
            compare(&what, &got, |i| tag(prev, i), exact)?;
            self.pass(&what);
        }

        // all_to_all: block j of rank r's input goes to block r of rank j.
        let what = format!("all_to_all {dt} {count} elements per block");
        let send: Vec<T> = make(count * n, |j| tag(rank, j));
        let mut recv = vec![T::from_f64(99.0); count * n];
        self.before_call();
        comm.all_to_all(&send, &mut recv)?;
        compare(
            &what,
            &recv,
            |j| tag(j / count.max(1), rank * count + j % count.max(1)),
            exact,
        )?;
        self.pass(&what);

        self.before_call();
        comm.barrier()?;
        self.pass(&format!("barrier after {dt} {count}"));
        Ok(())
    }

    /// Split into even and odd ranks (in reverse order by key) and reduce
    /// the parent ranks over each half.
    fn run_split(&mut self) -> Checked {
        let (rank, n) = (self.rank(), self.size());
        let color = (rank % 2) as i32;
        self.before_call();
        let sub = self
            .comm
            .split(color, -(rank as i32))?
            .ok_or_else(|| Failure::Wrong("split gave no communicator for color >= 0".into()))?;
        let members: Vec<usize> = (0..n).filter(|r| r % 2 == rank % 2).collect();
        let want_rank = members.iter().rev().position(|&r| r == rank);
        if sub.size() != members.len() || Some(sub.rank()) != want_rank {
            return Err(Failure::Wrong(format!(
                "split: got rank {} of {}, expected rank {want_rank:?} of {}",
                sub.rank(),
                sub.size(),
                members.len()
            )));
        }
        let mut v = [rank as i64, 1];
        self.before_call();
        sub.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        let want = [members.iter().sum::<usize>() as i64, members.len() as i64];
        if v != want {
            return Err(Failure::Wrong(format!(
                "split: all_reduce over the sub-communicator gave {v:?}, expected {want:?}"
            )));
        }
        self.pass(&format!(
            "split into even and odd ranks ({} and {} ranks)",
            n.div_ceil(2),
            n / 2
        ));
        Ok(())
    }

    fn run_all(&mut self) -> Checked {
        // Largest first, so that the first calls move data (fault injection
        // at an early call then lands inside a real exchange).
        let mut counts = vec![self.opts.count, 7, 1, 0];
        counts.sort_unstable_by(|a, b| b.cmp(a));
        counts.dedup();
        for _ in 0..self.opts.iters {
            for &count in &counts {
                self.run_type::<f32>(count)?;
                self.run_type::<f64>(count)?;
                self.run_type::<f16>(count)?;
                self.run_type::<bf16>(count)?;
                self.run_type::<i32>(count)?;
                self.run_type::<u8>(count)?;
                self.run_type::<i64>(count)?;
            }
            self.run_split()?;
        }
        Ok(())
    }
}

/// Microseconds since the Unix epoch (ranks of one host share the clock).
fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// Send `signal` (a name `kill` knows: STOP, KILL) to this process with
/// the `kill` program, or the shell's builtin where there is none.
fn signal_self(signal: &str) -> bool {
    let pid = std::process::id().to_string();
    let flag = format!("-{signal}");
    std::process::Command::new("kill")
        .args([flag.as_str(), &pid])
        .status()
        .is_ok_and(|s| s.success())
        || std::process::Command::new("sh")
            .args(["-c", &format!("kill {flag} {pid}")])
            .status()
            .is_ok_and(|s| s.success())
}

/// The one call of `--wrong CASE`: rank 1's argument differs.
fn wrong_call(comm: &Communicator, case: &str, count: usize) -> Result<(), Error> {
    let (rank, size) = (comm.rank(), comm.size());
    let odd = rank == 1;
    match case {
        "root" => {
            let mut buf = vec![rank as u32; count];
            comm.broadcast(&mut buf, usize::from(odd))
        }
        "op" => {
            let send = vec![rank as f32; count];
            let mut recv = vec![0f32; count];
            let op = if rank == 0 {
                ReduceOp::Sum
            } else {
                ReduceOp::Max
            };
            comm.reduce(&send, &mut recv, op, 0)
        }
        "bad-root" => {
            let mut buf = vec![rank as u32; count];
            comm.broadcast(&mut buf, if odd { size } else { 0 })
        }
        _ => {
            let send = vec![rank as u32; count];
            let mut recv = vec![0u32; count * size - usize::from(odd)];
            comm.all_gather(&send, &mut recv)
        }
    }
}

fn main() {
    let opts = tool::options_or_exit("ferroccl-check", USAGE, parse_options);
    let started = Instant::now();
    let comm = tool::join_or_exit("ferroccl-check");
    let rank = comm.rank();
    if let Some((victim, ms)) = opts.kill {
        if victim == rank {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(ms));
                say_err(&format!(
                    "rank {rank}: killing this process with SIGKILL {ms} ms after joining \
                     (--kill-after-ms)"
                ));
                if !signal_self("KILL") {
                    std::process::abort();
                }
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            });
        }
    }
    if let Some(case) = &opts.wrong {
        let t = Instant::now();
        let outcome = match wrong_call(&comm, case, opts.count.max(1)) {
            Ok(()) => match comm.barrier() {
                Ok(()) => "ok, then: ok".to_string(),
                Err(e) => format!("ok, then: error: {e}"),
            },
            Err(e) => format!("error: {e}"),
        };
        say(&format!(
            "rank {rank}: wrong call ({case}) ended after {} ms: {outcome}",
            t.elapsed().as_millis()
        ));
        return;
    }
    let mut comm = comm;
    let mut calls = 0;
    let (passed, calls) = loop {
        let mut checker = Checker {
            comm: &comm,
            opts: &opts,
            calls,
            passed: 0,
            op_turn: 0,
            job_rank: rank,
        };
        let failure = match checker.run_all() {
            Ok(()) => break (checker.passed, checker.calls),
            Err(failure) => failure,
        };
        calls = checker.calls;
        // Print first, then leave at once: a launcher stops the other ranks
        // when one fails, and the error is what the user needs. Dropping
        // the (failed) communicator first is quick and lets it remove
        // shared-memory segments a dead peer left for it.
        say_err(&format!("rank {rank}: {failure}"));
        if !opts.survive || !matches!(failure, Failure::Comm(_)) || comm.size() == 1 {
            drop(comm);
            std::process::exit(1);
        }
        let since = Instant::now();
        let shrunk = comm.shrink_failed().and_then(|shrunk| {
            let mut one = [1u32];
            shrunk.all_reduce_in_place(&mut one, ReduceOp::Sum)?;
            if one[0] as usize != shrunk.size() {
                return Err(Error::InvalidArgument(format!(
                    "the first allreduce on the shrunken communicator gave {}, not {}",
                    one[0],
                    shrunk.size()
                )));
            }
            Ok(shrunk)
        });
        match shrunk {
            Ok(shrunk) => {
                say(&format!(
                    "rank {rank}: went on as rank {} of {} (failed: {:?}), first collective at \
                     unix_us {} ({} ms after its error)",
                    shrunk.rank(),
                    shrunk.size(),
                    comm.failed_ranks(),
                    unix_us(),
                    since.elapsed().as_millis()
                ));
                comm = shrunk;
            }
            Err(e) => {
                say_err(&format!("rank {rank}: shrink: {e}"));
                drop(comm);
                std::process::exit(1);
            }
        }
    };
    let (rank, size) = (comm.rank(), comm.size());
    // Which transport reaches each peer (all pairs are connected by now:
    // all_to_all touches every one).
    let links: Vec<String> = comm
        .transports()
        .iter()
        .enumerate()
        .filter_map(|(peer, t)| t.map(|t| format!("{peer}:{t}")))
        .collect();
    say(&format!(
        "ferroccl-check: rank {rank} transports: {}",
        links.join(" ")
    ));
    say(&format!(
        "ferroccl-check: rank {rank}: {passed} checks passed ({} collective calls checked, {} \
         calls without slots, {:.2} s)",
        calls,
        comm.direct_window_calls(),
        started.elapsed().as_secs_f64()
    ));
    if rank == 0 {
        say(&format!(
            "ferroccl-check: {passed} checks passed on {size} ranks"
        ));
    }
}
