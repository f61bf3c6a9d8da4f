//! The device executor's kernel source (`cuda/kernels/executor.cu`), built
//! by the host's C++ compiler under `host_emulation.h` and run with every
//! thread of every block of every rank a host thread (`harness.cpp`), on
//! the programs the planner makes: its buffers must equal the host
//! executor's bit for bit, for both protocols. What this proves without a
//! GPU: the kernel's reading of the format, its fused primitives and
//! operand order, the FIFO protocols (bulk slots with head and tail
//! counters; LL lines with flags, wrap-around and cleaning) with several
//! threads per block and blocks running truly at once, the counts kept
//! from call to call, the Avg finish, and that errors and aborts end every
//! rank's kernel with the named fault, never a hang. What it cannot: the
//! PTX memory primitives themselves (acquire, release, the 16-byte line
//! store) and the speed; those are the GPU run's (cuda/gpu/run.sh).
//!
//! Skipped, saying so, where there is no C++20 compiler (`c++`, or
//! `$CXX`), unless `FERROCCL_REQUIRE_CXX=1`.

use super::tests::{
    check, grid, idle_image, kinds_of, reduces, sweep_runs, two_channel_runs, Case, RankRun, STEPS,
};
use super::Buffers;
use crate::algo::Algorithm;
use crate::coll::CollKind;
use crate::element::{DataType, ReduceOp};
use ferroccl_cuda::executor::{self, Control, ExecFault, Protocol};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const HARNESS_CPP: &str = include_str!("harness.cpp");

/// The kernels the grids use.
const TYPES: [DataType; 4] = [DataType::F32, DataType::Bf16, DataType::I32, DataType::F64];

/// How the emulated FIFOs are set up.
#[derive(Debug, Clone, Copy)]
struct Params {
    threads: u32,
    repeats: u32,
    slots: u32,
    slot_bytes: u32,
    ll_slots: u32,
    ll_lines: u32,
    ll_clean: u64,
    /// Where every count starts.
    start: u64,
}

/// The host run's `STEPS` slots of the planner's 128 bytes for both
/// protocols (its plans keep `STEPS - 1` slices in flight, so fewer slots
/// could deadlock them), three threads a block (so lanes
/// and lines split unevenly), each call run twice on the same
/// connections (the counts go on, the FIFOs wrap many times), an LL
/// cleaning every 5 frames, and counts that start 5 frames before 2^32
/// (the LL flags, 32 bits, pass through 0).
const PARAMS: Params = Params {
    threads: 3,
    repeats: 2,
    slots: STEPS as u32,
    slot_bytes: 128,
    ll_slots: STEPS as u32,
    ll_lines: 1 + 128 / 8,
    ll_clean: 5,
    start: (1 << 32) - 5,
};

/// The C++ compiler of the host builds of the kernels: `$CXX`, else `c++`.
pub(super) fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// The flags of every host build of the kernel source (sanitizers aside).
pub(super) const CXX_FLAGS: [&str; 7] = [
    "-std=c++20",
    "-O1",
    "-pthread",
    "-ffp-contract=off",
    "-Wall",
    "-Wno-unused-function",
    "-Wno-unknown-pragmas",
];

/// Writes `text` to `src` and builds it with [`cxx`], [`CXX_FLAGS`] and
/// `extra` into `out`; returns how long the compiler ran. `Err` says why
/// not: the compiler could not start (`"{cxx}: ..."`: none here), or it
/// failed on the source (`"{cxx} failed on the kernel source:"` and the
/// first 8000 characters of its log), which `built_here` never skips.
pub(super) fn compile(
    src: &Path,
    text: &str,
    out: &Path,
    extra: &[&str],
) -> Result<Duration, String> {
    std::fs::write(src, text).map_err(|e| e.to_string())?;
    let cxx = cxx();
    let t = Instant::now();
    let run = Command::new(&cxx)
        .args(CXX_FLAGS)
        .args(extra)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .map_err(|e| format!("{cxx}: {e}"))?;
    if !run.status.success() {
        let log = String::from_utf8_lossy(&run.stderr);
        let cut = log.char_indices().nth(8000).map_or(log.len(), |(i, _)| i);
        return Err(format!(
            "{cxx} failed on the kernel source:\n{}",
            &log[..cut]
        ));
    }
    Ok(t.elapsed())
}

/// `dispatch.inc` for `kernels`: a function per kernel that calls it with
/// untyped buffers, and `table`, every `Entry` (name, function); the file
/// that includes it defines `Entry`.
fn dispatch_inc(kernels: &[(Protocol, ReduceOp, DataType)]) -> String {
    let mut dispatch = String::new();
    let mut table = String::from("static Entry table[] = {\n");
    for &(p, op, ty) in kernels {
        let name = executor::kernel_name(p, Some(op), ty);
        let e = executor::element_struct(ty);
        let _ = writeln!(
            dispatch,
            "static void call_{name}(const unsigned char* p, void* i, void* o, \
             ferroccl::Conn* c, ferroccl::Control* t) {{ {name}(p, (ferroccl::{e}::T*)i, \
             (ferroccl::{e}::T*)o, c, t); }}"
        );
        let _ = writeln!(table, "    {{\"{name}\", call_{name}}},");
    }
    table.push_str("};\n");
    format!("{dispatch}{table}")
}

/// The C++ source of the executor's kernels for the host, every protocol
/// and kernel op on `types`, followed by `tail` (the harness or the launch
/// library), with its `dispatch.inc` written into `dir` (made if need
/// be); and how many kernels it holds.
pub(super) fn host_source(
    dir: &Path,
    types: &[DataType],
    tail: &str,
) -> Result<(String, usize), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let mut kernels = Vec::new();
    for p in Protocol::ALL {
        for op in executor::KERNEL_OPS {
            for &ty in types {
                kernels.push((p, op, ty));
            }
        }
    }
    std::fs::write(dir.join("dispatch.inc"), dispatch_inc(&kernels)).map_err(|e| e.to_string())?;
    let src = format!(
        "{}\n{}\n{}",
        executor::HOST_EMULATION_H,
        executor::source_for(&kernels),
        tail
    );
    Ok((src, kernels.len()))
}

/// The harness, built once per test process: `Err` says why not.
fn harness() -> &'static Result<PathBuf, String> {
    static EXE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ferroccl-exec-host-{}", std::process::id()));
        let (src, _) = host_source(&dir, &TYPES, HARNESS_CPP)?;
        let exe = dir.join("harness");
        let took = compile(&dir.join("harness.cpp"), &src, &exe, &[])?;
        eprintln!("harness built in {took:.1?}");
        Ok(exe)
    })
}

/// The harness built with ThreadSanitizer (`-fsanitize=thread`): `Err`
/// says why not (no compiler, or no libtsan).
fn tsan_harness() -> &'static Result<PathBuf, String> {
    static EXE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    EXE.get_or_init(|| {
        let plain = harness().as_ref().map_err(|e| e.clone())?;
        let dir = plain.parent().expect("the harness is in a folder");
        let exe = dir.join("harness-tsan");
        let cxx = cxx();
        let out = Command::new(&cxx)
            .args(["-std=c++20", "-O1", "-g", "-pthread", "-fsanitize=thread"])
            .args(["-Wno-tsan", "-Wno-unknown-pragmas", "-o"])
            .arg(&exe)
            .arg(dir.join("harness.cpp"))
            .output()
            .map_err(|e| format!("{cxx}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{cxx} -fsanitize=thread: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ));
        }
        Ok(exe)
    })
}

/// The harness, or `None` (skip) where no compiler is here and that is
/// allowed. A compile error of the kernel source always fails.
fn harness_here(test: &str) -> Option<&'static Path> {
    built_here(harness(), test).map(PathBuf::as_path)
}

/// What a host build of the kernel source made, or `None` (skip, saying
/// so) where no compiler is here and that is allowed
/// (`FERROCCL_REQUIRE_CXX=1` makes it a failure). A compile error of the
/// kernel source (an `Err` that says "failed on the kernel source")
/// always fails.
pub(super) fn built_here<'a, T>(built: &'a Result<T, String>, test: &str) -> Option<&'a T> {
    match built {
        Ok(p) => Some(p),
        Err(e) if e.contains("failed on the kernel source") => panic!("{e}"),
        Err(e) => {
            if std::env::var("FERROCCL_REQUIRE_CXX").is_ok_and(|v| v == "1") {
                panic!("{test}: FERROCCL_REQUIRE_CXX=1 but no C++ compiler: {e}");
            }
            eprintln!("{test}: skipped, no C++20 compiler: {e}");
            None
        }
    }
}

/// One case of a job: a call on every rank.
struct Job<'a> {
    protocol: Protocol,
    dtype: DataType,
    op: Option<ReduceOp>,
    runs: &'a [Option<RankRun>],
    params: Params,
    /// A rank never launched (a killed process).
    dead: Option<usize>,
    timeout_ms: u32,
    /// Images to run instead of the runs' own (damaged ones).
    images: Option<Vec<Vec<u8>>>,
}

/// What the harness says of one rank.
#[derive(Debug)]
struct Outcome {
    ctl: Control,
    timed_out: bool,
    bufs: Buffers<u8>,
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

fn write_job(jobs: &[Job]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&0x4a4c4346u32.to_le_bytes());
    out.extend_from_slice(&(jobs.len() as u32).to_le_bytes());
    for j in jobs {
        let n = j.runs.len();
        let p = j.params;
        for v in [
            n as u32,
            p.threads,
            p.repeats,
            p.slots,
            p.slot_bytes,
            p.ll_slots,
            p.ll_lines,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&p.ll_clean.to_le_bytes());
        out.extend_from_slice(&p.start.to_le_bytes());
        out.extend_from_slice(&(j.dead.map_or(u32::MAX, |d| d as u32)).to_le_bytes());
        out.extend_from_slice(&j.timeout_ms.to_le_bytes());
        let name = executor::kernel_name(j.protocol, j.op, j.dtype);
        put_bytes(&mut out, name.as_bytes());
        for (r, run) in j.runs.iter().enumerate() {
            let image = match (&j.images, run) {
                (Some(images), _) => images[r].clone(),
                (None, Some(run)) => run.image.clone(),
                (None, None) => idle_image(r, n, j.dtype, j.op),
            };
            put_bytes(&mut out, &image);
            match run.as_ref().map(|r| &r.before) {
                Some(Buffers::Separate { input, output }) => {
                    put_bytes(&mut out, input);
                    put_bytes(&mut out, output);
                }
                Some(Buffers::Shared { buf }) => {
                    put_bytes(&mut out, buf);
                    put_bytes(&mut out, &[]);
                }
                None => {
                    put_bytes(&mut out, &[]);
                    put_bytes(&mut out, &[]);
                }
            }
        }
    }
    out
}

struct Cursor<'a>(&'a [u8], usize);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.0[self.1..self.1 + n];
        self.1 += n;
        s
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn bytes(&mut self) -> Vec<u8> {
        let n = self.u64() as usize;
        self.take(n).to_vec()
    }
}

/// Runs the jobs through the harness: per job, per rank, what it left.
fn run_jobs(exe: &Path, jobs: &[Job], tag: &str) -> Result<Vec<Vec<Outcome>>, String> {
    let dir = exe.parent().unwrap();
    let job = dir.join(format!("{tag}.job"));
    let result = dir.join(format!("{tag}.out"));
    std::fs::write(&job, write_job(jobs)).map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .arg(&job)
        .arg(&result)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        let log = String::from_utf8_lossy(&out.stderr);
        let cut = log.char_indices().nth(3000).map_or(log.len(), |(i, _)| i);
        return Err(format!(
            "harness exited {:?}: {}",
            out.status.code(),
            &log[..cut]
        ));
    }
    let data = std::fs::read(&result).map_err(|e| e.to_string())?;
    let mut c = Cursor(&data, 0);
    let mut all = Vec::new();
    for j in jobs {
        let mut ranks = Vec::new();
        for run in j.runs {
            let ctl = Control {
                error: c.u32(),
                channel: c.u32(),
                record: c.u32(),
                peer: c.u32(),
                want: c.u64(),
                got: c.u64(),
                ..Control::default()
            };
            let timed_out = c.u32() != 0;
            let _dead = c.u32();
            let a = c.bytes();
            let b = c.bytes();
            let bufs = match run.as_ref().map(|r| &r.before) {
                Some(Buffers::Shared { .. }) => Buffers::Shared { buf: a },
                _ => Buffers::Separate {
                    input: a,
                    output: b,
                },
            };
            ranks.push(Outcome {
                ctl,
                timed_out,
                bufs,
            });
        }
        all.push(ranks);
    }
    Ok(all)
}

/// Runs `cases` of `algo` on `n` ranks through the host executor, then
/// the same programs through the kernel with `protocol`: the failures.
fn kernel_sweep(
    exe: &Path,
    n: usize,
    algo: Algorithm,
    cases: &[Case],
    protocol: Protocol,
) -> Vec<String> {
    let (mut failures, runs) = sweep_runs(n, algo, cases);
    let jobs: Vec<Job> = runs
        .iter()
        .map(|(_, case, runs)| Job {
            protocol,
            dtype: case.dtype,
            op: reduces(case.kind).then_some(case.op),
            runs,
            params: PARAMS,
            dead: None,
            timeout_ms: 20_000,
            images: None,
        })
        .collect();
    let tag = format!("{}-{algo}-{n}", protocol.name());
    let outcomes = match run_jobs(exe, &jobs, &tag) {
        Ok(o) => o,
        Err(e) => {
            failures.push(format!("{tag}: {e}"));
            return failures;
        }
    };
    for ((_, case, runs), ranks) in runs.iter().zip(outcomes) {
        let what = format!("{} {algo} {case:?} on {n} ranks", protocol.name());
        failures.extend(judge(&what, runs, ranks.iter().map(|o| (&o.ctl, &o.bufs))));
    }
    failures
}

/// The first rank of a call whose kernel faulted or left other buffers
/// than the host executor, said with `what`; `None` when every rank
/// matches (a rank that took no part has no buffers to compare).
pub(super) fn judge<'a>(
    what: &str,
    runs: &[Option<RankRun>],
    got: impl IntoIterator<Item = (&'a Control, &'a Buffers<u8>)>,
) -> Option<String> {
    for (r, (run, (ctl, bufs))) in runs.iter().zip(got).enumerate() {
        if let Some(why) = ExecFault::describe(ctl) {
            return Some(format!("{what}: rank {r}: {why}"));
        }
        if run.as_ref().is_some_and(|run| *bufs != run.after) {
            return Some(format!(
                "{what}: rank {r}: the kernel's buffers differ from the executor's"
            ));
        }
    }
    None
}

fn sweep_all(protocol: Protocol, ranks: &[usize]) {
    let Some(exe) = harness_here(protocol.name()) else {
        return;
    };
    let t = Instant::now();
    let mut failures = Vec::new();
    for &n in ranks {
        let tn = Instant::now();
        for algo in Algorithm::ALL {
            failures.extend(kernel_sweep(
                exe,
                n,
                algo,
                &grid(n, kinds_of(algo)),
                protocol,
            ));
        }
        eprintln!(
            "{} kernel, {n} ranks: {:.1?}",
            protocol.name(),
            tn.elapsed()
        );
    }
    check(failures, t, &format!("{} kernel", protocol.name()));
}

// Rank counts: the host runs every thread of every rank at once on the
// build machine's two cores, so the full grid takes a few counts (odd and
// even, a power of two and not); 8 and 16 ranks run a smaller grid.

#[test]
fn the_bulk_kernel_matches_the_executor() {
    sweep_all(Protocol::Bulk, &[1, 2, 3, 5]);
}

#[test]
fn the_ll_kernel_matches_the_executor() {
    sweep_all(Protocol::LowLatency, &[2, 4]);
}

/// 8 and 16 ranks: allreduce, allgather and reduce-scatter by the ring,
/// allreduce by the tree, 1013 elements of f32 and bf16 (Sum, Avg), in
/// and out of place, both protocols.
#[test]
fn both_kernels_match_the_executor_on_8_and_16_ranks() {
    use CollKind::*;
    let Some(exe) = harness_here("8 and 16 ranks") else {
        return;
    };
    let t = Instant::now();
    let keep = |c: &Case| {
        c.count == 1013
            && matches!(c.dtype, DataType::F32 | DataType::Bf16)
            && matches!(c.op, ReduceOp::Sum | ReduceOp::Avg)
    };
    let mut failures = Vec::new();
    for n in [8, 16] {
        for p in Protocol::ALL {
            let ring: Vec<Case> = grid(n, &[AllReduce, AllGather, ReduceScatter])
                .into_iter()
                .filter(keep)
                .collect();
            failures.extend(kernel_sweep(exe, n, Algorithm::Ring, &ring, p));
            let ar: Vec<Case> = grid(n, &[AllReduce]).into_iter().filter(keep).collect();
            failures.extend(kernel_sweep(exe, n, Algorithm::Tree, &ar, p));
        }
    }
    check(failures, t, "8 and 16 ranks");
}

/// Programs of two channels (two rings on the halves of the buffer, or a
/// ring and a tree), Avg of f32, in and out of place, on 2, 3, 5 and 8
/// ranks: two blocks a rank, each its own FIFOs, and the last block to
/// end divides the whole result.
#[test]
fn two_channel_programs_match_the_executor_in_the_kernel() {
    let Some(exe) = harness_here("two channels") else {
        return;
    };
    let t = Instant::now();
    let mut failures = Vec::new();
    for n in [2, 3, 5, 8] {
        for (shape, runs) in two_channel_runs(n) {
            let runs = match runs {
                Ok(runs) => runs,
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            };
            let jobs: Vec<Job> = Protocol::ALL
                .into_iter()
                .map(|p| Job {
                    op: Some(ReduceOp::Avg),
                    ..job(p, &runs)
                })
                .collect();
            let out = match run_jobs(exe, &jobs, &format!("two-{n}")) {
                Ok(o) => o,
                Err(e) => {
                    failures.push(e);
                    continue;
                }
            };
            for (j, ranks) in jobs.iter().zip(out) {
                let what = format!("{} two channels {shape:?} on {n} ranks", j.protocol.name());
                failures.extend(judge(&what, &runs, ranks.iter().map(|o| (&o.ctl, &o.bufs))));
            }
        }
    }
    check(failures, t, "two channels in the kernel");
}

/// Both protocols under ThreadSanitizer: every access to FIFO memory,
/// counters, flags and buffers is ordered by the protocol's own acquire
/// and release (the host build's stand-ins for the PTX ones) and the
/// block barriers, with no data race, on ring and tree allreduces of 3
/// ranks and two-channel programs. TSan exits nonzero on any report,
/// which fails the run. Skipped where the compiler has no libtsan.
#[test]
fn the_protocols_have_no_data_race_under_thread_sanitizer() {
    use CollKind::*;
    if harness_here("tsan").is_none() {
        return;
    }
    let exe = match tsan_harness() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("tsan: skipped, {e}");
            return;
        }
    };
    let t = Instant::now();
    let keep = |c: &Case| c.count == 1013 && c.dtype == DataType::F32 && c.op == ReduceOp::Sum;
    let cases: Vec<Case> = grid(3, &[AllReduce]).into_iter().filter(keep).collect();
    let mut failures = Vec::new();
    for p in Protocol::ALL {
        for algo in [Algorithm::Ring, Algorithm::Tree] {
            failures.extend(kernel_sweep(exe, 3, algo, &cases, p));
        }
    }
    for (shape, runs) in two_channel_runs(3) {
        let runs = runs.unwrap();
        let jobs: Vec<Job> = Protocol::ALL
            .into_iter()
            .map(|p| Job {
                op: Some(ReduceOp::Avg),
                ..job(p, &runs)
            })
            .collect();
        if let Err(e) = run_jobs(exe, &jobs, "tsan-two") {
            failures.push(format!("two channels {shape:?}: {e}"));
        }
    }
    check(failures, t, "tsan");
}

#[test]
fn the_kernel_structs_have_the_rust_layout() {
    let Some(exe) = harness_here("layout") else {
        return;
    };
    let out = Command::new(exe).arg("layout").output().unwrap();
    let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    use executor::Conn;
    use std::mem::{offset_of, size_of};
    let want = vec![
        size_of::<Conn>(),
        offset_of!(Conn, recv_slots),
        offset_of!(Conn, sent),
        offset_of!(Conn, ll_clean),
        offset_of!(Conn, slots),
        offset_of!(Conn, ll_lines),
        size_of::<Control>(),
        offset_of!(Control, error),
        offset_of!(Control, want),
    ];
    assert_eq!(got, want);
}

/// One allreduce of 1013 f32 on 4 ranks, through the host executor.
fn four_rank_allreduce() -> Vec<Option<RankRun>> {
    let case = grid(4, &[CollKind::AllReduce])
        .into_iter()
        .find(|c| c.count == 1013 && !c.in_place && c.dtype == DataType::F32)
        .unwrap();
    let (f, mut runs) = sweep_runs(4, Algorithm::Ring, &[case]);
    assert!(f.is_empty(), "{f:?}");
    runs.pop().unwrap().2
}

fn job<'a>(protocol: Protocol, runs: &'a [Option<RankRun>]) -> Job<'a> {
    Job {
        protocol,
        dtype: DataType::F32,
        op: Some(ReduceOp::Sum),
        runs,
        params: Params {
            repeats: 1,
            ..PARAMS
        },
        dead: None,
        timeout_ms: 20_000,
        images: None,
    }
}

/// A damaged tag, a slot too small, a killed rank, and the host's
/// timeout: each ends every rank's kernel, the first with the fault named
/// where it happened, the others aborted; nothing hangs (the harness exits
/// 4 on a kernel still running 10 s after its abort word was set).
#[test]
fn faults_and_aborts_end_every_kernel_with_a_named_error() {
    let Some(exe) = harness_here("faults") else {
        return;
    };
    let runs = four_rank_allreduce();
    // Rank 2's first receive expects another tag.
    let mut images: Vec<Vec<u8>> = runs
        .iter()
        .map(|r| r.as_ref().unwrap().image.clone())
        .collect();
    let program = crate::algo::encode::decode(&images[2]).unwrap();
    let first_recv = program.channels[0]
        .iter()
        .position(|s| s.prim.receives())
        .unwrap();
    let at = crate::algo::encode::HEADER_BYTES
        + crate::algo::encode::CHANNEL_ENTRY_BYTES
        + first_recv * crate::algo::encode::RECORD_BYTES
        + 12;
    images[2][at] ^= 1;
    let mut jobs = Vec::new();
    for p in Protocol::ALL {
        jobs.push(Job {
            images: Some(images.clone()),
            ..job(p, &runs)
        });
        jobs.push(Job {
            params: Params {
                slot_bytes: 64,
                ll_lines: 1 + 64 / 8,
                ..PARAMS
            },
            ..job(p, &runs)
        });
        jobs.push(Job {
            dead: Some(1),
            ..job(p, &runs)
        });
        jobs.push(Job {
            // Rank 3 never starts and no failure is reported: the
            // timeout ends the others.
            dead: Some(3),
            timeout_ms: 30,
            ..job(p, &runs)
        });
    }
    let out = run_jobs(exe, &jobs, "faults").unwrap_or_else(|e| panic!("{e}"));
    for (k, ranks) in out.iter().enumerate() {
        let p = jobs[k].protocol.name();
        let faults: Vec<Option<ExecFault>> = ranks
            .iter()
            .map(|o| ExecFault::from_code(o.ctl.error))
            .collect();
        eprintln!("{p} case {}: {faults:?}", k % 4);
        match k % 4 {
            0 => {
                assert_eq!(faults[2], Some(ExecFault::Tag), "{p}: {faults:?}");
                let ctl = &ranks[2].ctl;
                assert_eq!((ctl.channel, ctl.record as usize), (0, first_recv), "{p}");
                assert_eq!(ctl.got ^ ctl.want, 1, "{p}: {ctl:?}");
                for (r, f) in faults.iter().enumerate() {
                    assert!(
                        r == 2 || *f == Some(ExecFault::Aborted) || f.is_none(),
                        "{p}: {faults:?}"
                    );
                }
                assert!(
                    faults
                        .iter()
                        .filter(|f| **f == Some(ExecFault::Aborted))
                        .count()
                        >= 1,
                    "{p}: {faults:?}"
                );
            }
            1 => {
                assert!(faults.contains(&Some(ExecFault::TooBig)), "{p}: {faults:?}");
                assert!(
                    faults
                        .iter()
                        .all(|f| matches!(f, Some(ExecFault::TooBig | ExecFault::Aborted))),
                    "{p}: {faults:?}"
                );
                let big = ranks.iter().find(|o| o.ctl.error == 4).unwrap();
                assert_eq!(big.ctl.want, 64, "{p}: {:?}", big.ctl);
            }
            2 | 3 => {
                let dead = jobs[k].dead.unwrap();
                for (r, f) in faults.iter().enumerate() {
                    if r != dead {
                        assert_eq!(*f, Some(ExecFault::Aborted), "{p} rank {r}: {faults:?}");
                        assert_eq!(ranks[r].timed_out, k % 4 == 3, "{p} rank {r}");
                    }
                }
            }
            _ => unreachable!(),
        }
    }
}

/// The comparison can fail: the Max kernel run where Sum is due gives
/// other bits, and the comparison says so; the Sum kernel matches.
#[test]
fn a_wrong_kernel_or_program_breaks_the_match() {
    let Some(exe) = harness_here("mutation") else {
        return;
    };
    let runs = four_rank_allreduce();
    let jobs = vec![
        Job {
            op: Some(ReduceOp::Max),
            ..job(Protocol::Bulk, &runs)
        },
        Job {
            op: Some(ReduceOp::Max),
            ..job(Protocol::LowLatency, &runs)
        },
        job(Protocol::Bulk, &runs),
    ];
    let out = run_jobs(exe, &jobs, "mutation").unwrap_or_else(|e| panic!("{e}"));
    for (k, ranks) in out.iter().enumerate() {
        let same = runs
            .iter()
            .zip(ranks)
            .all(|(run, o)| o.ctl.error == 0 && o.bufs == run.as_ref().unwrap().after);
        assert_eq!(same, k == 2, "job {k}");
    }
}
