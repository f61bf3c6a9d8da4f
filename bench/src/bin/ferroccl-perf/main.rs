//! `ferroccl-perf`: nccl-tests style bandwidth table of a ferroccl collective.
//!
//! With `--ranks N` it launches N local copies of itself through
//! [`ferroccl_run::launch`] and waits for them; the copies (marked by
//! [`CHILD_ENV`]) join the job from their environment, as they would under
//! ferroccl-run, torchrun, mpirun or srun. With `-t T` (nccl-tests'
//! threads per process) each process runs T threads, each a rank with its
//! own communicator: rank = process rank x T + thread, of processes x T.
//! Rank 0 prints the table; the other ranks print only their errors. See
//! `ferroccl-perf --help`.
//!
//! `--device cuda` (in `device.rs`) keeps the buffers in GPU memory; the
//! table, the inputs and the check are the host mode's, from this file.
//!
//! This file launches the copies, sets up the ranks (threads) and runs
//! the rows; `report.rs` prints the table, `check.rs` holds the buffers,
//! inputs and the check against the f64 reference.

mod check;
mod device;
mod report;

use check::{count_wrong, fill, lengths, Buf, Buffers, Shape};
use report::{print_header, Measure, Report, Row};

use ferroccl::bootstrap::LaunchInfo;
use ferroccl::{Communicator, Config, DataType, Element, ReduceOp};
use ferroccl_bench::coll::Coll;
use ferroccl_bench::options::{parse_args, Command, Device, Options, USAGE};
use ferroccl_run::{launch, Bind, LaunchOptions};
use half::{bf16, f16};
use std::error::Error;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

/// Set in the environment of the ranks that `--ranks` launches, so that
/// they join the job instead of launching again.
const CHILD_ENV: &str = "FERROCCL_PERF_CHILD";

/// Variables whose presence says that a launcher started this process.
const LAUNCHER_VARS: [&str; 4] = ["RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID"];

/// Bytes of each rank's description gathered for the header (a line of
/// text, cut here).
const INFO_BYTES: usize = 256;

type AnyResult<T> = Result<T, Box<dyn Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match parse_args(&args) {
        Ok(Command::Run(o)) => o,
        Ok(Command::Help) => {
            println!("{USAGE}");
            return;
        }
        Err(msg) => {
            eprintln!("ferroccl-perf: {msg}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    if opts.device == Device::Cuda {
        // Before launching anything: without a device every rank would
        // fail the same way. Each launched rank asks again (a launcher
        // other than ours starts them without this check), and only rank
        // 0 says why, so the reason is printed once.
        if let Err(reason) = device::available() {
            let rank_zero = ferroccl::bootstrap::detect_process_env().map_or(true, |i| i.rank == 0);
            if rank_zero {
                eprintln!("ferroccl-perf: --device cuda: {reason}");
            }
            std::process::exit(2);
        }
    }
    if std::env::var_os(CHILD_ENV).is_none() {
        let under_launcher = LAUNCHER_VARS.iter().any(|v| std::env::var_os(v).is_some());
        let ranks = opts.ranks.or(if under_launcher { None } else { Some(1) });
        if let Some(n) = ranks {
            std::process::exit(launch_self(n, &args));
        }
    }
    match run_process(&opts) {
        0 => {}
        code => std::process::exit(code),
    }
}

/// Run this process's ranks and return its exit status: 0, or 1 when a
/// rank failed (its error printed, naming it) or counted wrong elements.
/// With `-t 1` the process is one rank, on this thread; with `-t T`, T
/// threads each join the job as rank `process rank x T + thread` of
/// `processes x T`, and the status comes once every thread has ended.
fn run_process(opts: &Options) -> i32 {
    let siblings = Siblings::default();
    let threads = opts.threads;
    let ok = if threads == 1 {
        let rank = std::env::var("RANK").unwrap_or_else(|_| "?".into());
        run_rank(opts, &rank, 0, &siblings, Communicator::from_env)
    } else {
        let launch = match ferroccl::bootstrap::detect_process_env() {
            Ok(info) => info,
            Err(e) => {
                eprintln!("ferroccl-perf: -t {threads}: {e}");
                return 1;
            }
        };
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|thread| {
                    let rank = launch.rank * threads + thread;
                    let (launch, siblings) = (&launch, &siblings);
                    std::thread::Builder::new()
                        .name(format!("rank-{rank}"))
                        .spawn_scoped(scope, move || {
                            run_rank(opts, &rank.to_string(), thread, siblings, || {
                                thread_communicator(launch, threads, thread)
                            })
                        })
                        .map_err(|e| {
                            // The threads started before it would wait for
                            // this rank until the timeout.
                            eprintln!("ferroccl-perf: cannot start rank {rank}'s thread: {e}");
                            siblings.fail(&rank.to_string());
                        })
                })
                .collect();
            // Join every thread, even after a failure: the process ends
            // only when all of its ranks have (a panicked one counts as
            // failed; the panic message names its thread, `rank-N`).
            let oks: Vec<bool> = handles
                .into_iter()
                .map(|h| h.is_ok_and(|h| h.join().unwrap_or(false)))
                .collect();
            oks.into_iter().all(|ok| ok)
        })
    };
    if ok {
        0
    } else {
        1
    }
}

/// Join the job as one rank through `join` and run the benchmark; whether
/// it ran and counted no wrong element. Prints its own error. A failure or
/// a panic aborts the process's other ranks (their calls end with
/// `Aborted` instead of waiting out the timeout for this one).
fn run_rank(
    opts: &Options,
    rank: &str,
    thread: usize,
    siblings: &Siblings,
    join: impl FnOnce() -> ferroccl::Result<Communicator>,
) -> bool {
    let _on_panic = PanicGuard(siblings, rank);
    let result = join().map_err(Into::into).and_then(|comm| {
        let comm = Arc::new(comm);
        siblings.add(&comm);
        run(opts, &comm, thread)
    });
    match result {
        Ok(wrong) => wrong == 0,
        Err(e) => {
            // A rank aborted because another failed says which one did.
            let first = siblings.first_failure(rank);
            let cause = if first == rank {
                String::new()
            } else {
                format!(" (after rank {first} failed)")
            };
            eprintln!("ferroccl-perf: rank {rank}: {e}{cause}");
            siblings.abort_all();
            false
        }
    }
}

/// The communicator of thread `thread` of `threads` in the process that
/// `launch` describes: rank `launch.rank x threads + thread` of
/// `launch.size x threads`, over the launch's rendezvous (hosted by rank
/// 0, thread 0 of process 0).
fn thread_communicator(
    launch: &LaunchInfo,
    threads: usize,
    thread: usize,
) -> ferroccl::Result<Communicator> {
    let info = LaunchInfo {
        rank: launch.rank * threads + thread,
        size: launch.size * threads,
        ..launch.clone()
    };
    let config = Config::from_launch(&info)?;
    if launch.size > 1 && config.transport.as_deref() == Some("mem") {
        // As `Communicator::from_env` refuses it: the other processes'
        // ranks could not be reached, and set-up would wait out the timeout.
        return Err(ferroccl::Error::Env(
            "FERROCCL_TRANSPORT=mem joins only ranks that are threads of one process; \
             with --ranks or a launcher the ranks span processes (use shm or tcp, or leave it unset)"
                .into(),
        ));
    }
    Communicator::init(config)
}

/// The communicators of this process's ranks, so that the first to fail
/// aborts the others. Weak: each rank's own thread drops its communicator.
#[derive(Default)]
struct Siblings {
    comms: Mutex<Vec<Weak<Communicator>>>,
    failed: AtomicBool,
    /// The rank that failed first.
    first: Mutex<Option<String>>,
}

impl Siblings {
    /// Count `comm` in; aborted at once if a rank has failed already.
    fn add(&self, comm: &Arc<Communicator>) {
        lock(&self.comms).push(Arc::downgrade(comm));
        // After the push: a failure either saw it in the list or is seen
        // here.
        if self.failed.load(Ordering::SeqCst) {
            comm.abort();
        }
    }

    /// `rank` failed: the rank that failed first (`rank` if none had).
    fn first_failure(&self, rank: &str) -> String {
        lock(&self.first)
            .get_or_insert_with(|| rank.to_string())
            .clone()
    }

    /// Abort every rank of the process (once).
    fn abort_all(&self) {
        if !self.failed.swap(true, Ordering::SeqCst) {
            for comm in lock(&self.comms).iter().filter_map(Weak::upgrade) {
                comm.abort();
            }
        }
    }

    /// `rank` failed: abort every rank of the process.
    fn fail(&self, rank: &str) {
        self.first_failure(rank);
        self.abort_all();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Aborts the process's other ranks when a rank's thread panics.
struct PanicGuard<'a>(&'a Siblings, &'a str);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail(self.1);
        }
    }
}

/// Start `ranks` copies of this program with the same arguments and return
/// the launcher's exit code.
fn launch_self(ranks: usize, args: &[String]) -> i32 {
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ferroccl-perf: cannot find this program to launch it: {e}");
            return 1;
        }
    };
    let opts = LaunchOptions {
        nproc_per_node: ranks,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: None,
        program: program.into_os_string(),
        args: args.iter().map(Into::into).collect(),
        extra_env: vec![(CHILD_ENV.into(), "1".into())],
        // Rank 0 prints the whole table and nobody else prints rows, so the
        // output reads like nccl-tests'; errors carry their rank themselves.
        prefix_output: false,
        // Each rank on CPUs of its own when there are enough, as mpirun
        // binds the peers this is compared with.
        bind: Bind::Share,
    };
    match launch(&opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferroccl-perf: launching {ranks} ranks failed: {e}");
            1
        }
    }
}

/// Run the benchmark as one rank of the job, thread `thread` of its
/// process; returns the number of wrong elements found (0 without `-c 1`).
fn run(opts: &Options, comm: &Communicator, thread: usize) -> AnyResult<u64> {
    let (rank, ranks) = (comm.rank(), comm.size());
    if opts.coll.rooted() && opts.root >= ranks {
        return Err(format!("--root {} is not a rank of {ranks}", opts.root).into());
    }
    if opts.coll == Coll::SendRecv && ranks < 2 {
        return Err("sendrecv needs at least 2 ranks".into());
    }
    // Connect every peer the collective will use before anything is timed.
    comm.barrier()?;
    let gpu = match opts.device {
        Device::Host => None,
        Device::Cuda => Some(device::Gpu::open(comm, opts)?),
    };
    let infos = gather_text(comm, &rank_info(comm, thread, gpu.as_ref()))?;
    let pinned = match &gpu {
        Some(gpu) => gather_text(
            comm,
            &format!("{} rank {rank} thread {thread}", gpu.pinned_copy()),
        )?,
        None => Vec::new(),
    };
    let print = rank == 0;
    if print {
        print_header(opts, comm, &infos, &pinned);
    }
    let csv = match (&opts.csv, print) {
        (Some(path), true) => {
            let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
            writeln!(
                w,
                "collective,ranks,size_bytes,count,type,redop,root,\
                 oop_time_us,oop_algbw_gbs,oop_busbw_gbs,oop_wrong,\
                 ip_time_us,ip_algbw_gbs,ip_busbw_gbs,ip_wrong"
            )?;
            Some(w)
        }
        _ => None,
    };
    let mut report = Report {
        print,
        coll: opts.coll,
        ranks,
        csv,
        busbw_sum: 0.0,
        busbw_rows: 0,
        wrong: 0,
    };
    let ops: Vec<Option<ReduceOp>> = if opts.coll.reduces() {
        opts.ops.iter().copied().map(Some).collect()
    } else {
        vec![None]
    };
    for &dtype in &opts.dtypes {
        for &op in &ops {
            macro_rules! typed {
                ($($dt:ident => $t:ty),*) => {
                    match (dtype, &gpu) {
                        $((DataType::$dt, None) => bench_type::<$t>(comm, opts, op, &mut report)?,
                          (DataType::$dt, Some(gpu)) =>
                              device::bench_type::<$t>(comm, gpu, opts, op, &mut report)?,)*
                    }
                };
            }
            typed!(F32 => f32, F64 => f64, F16 => f16, Bf16 => bf16, I8 => i8, U8 => u8,
                   I32 => i32, U32 => u32, I64 => i64, U64 => u64);
        }
    }
    if let Some(csv) = report.csv.as_mut() {
        csv.flush()?;
    }
    if print {
        if opts.check {
            let verdict = if report.wrong == 0 { "OK" } else { "FAILED" };
            println!("# Out of bounds values : {} {verdict}", report.wrong);
        } else {
            println!("# Out of bounds values : not checked (-c 0)");
        }
        let avg = report.busbw_sum / report.busbw_rows.max(1) as f64;
        println!("# Avg bus bandwidth    : {avg:.4} ");
        println!("#");
    }
    comm.barrier()?;
    Ok(report.wrong)
}

/// This rank's pid, thread (its index among the process's `-t` threads),
/// host, GPU (with `--device cuda`) and transports.
fn rank_info(comm: &Communicator, thread: usize, gpu: Option<&device::Gpu>) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let transports: Vec<String> = comm
        .transports()
        .iter()
        .enumerate()
        .filter_map(|(peer, t)| t.map(|t| format!("{peer}:{t}")))
        .collect();
    // The device before the peers: a long list of peers is what gets cut.
    let device = gpu.map_or(String::new(), |g| format!(" {}", g.description()));
    format!(
        "Rank {:>3} Pid {:>7} Thread {:>2} on {host}{device} peers {}",
        comm.rank(),
        std::process::id(),
        thread,
        if transports.is_empty() {
            "none".to_string()
        } else {
            transports.join(" ")
        }
    )
}

/// Every rank's `text` (cut to [`INFO_BYTES`]), gathered to every rank.
fn gather_text(comm: &Communicator, text: &str) -> AnyResult<Vec<String>> {
    let mut mine = [0u8; INFO_BYTES];
    let len = text.len().min(INFO_BYTES);
    mine[..len].copy_from_slice(&text.as_bytes()[..len]);
    let mut all = vec![0u8; INFO_BYTES * comm.size()];
    comm.all_gather(&mine, &mut all)?;
    Ok(all
        .chunks(INFO_BYTES)
        .map(|c| {
            let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
            String::from_utf8_lossy(&c[..end]).into_owned()
        })
        .collect())
}

fn bench_type<T: Element>(
    comm: &Communicator,
    opts: &Options,
    op: Option<ReduceOp>,
    report: &mut Report,
) -> AnyResult<()> {
    let elem = std::mem::size_of::<T>();
    let ranks = comm.size();
    for bytes in opts.sizes() {
        let (shape, total) = Shape::of(comm, opts, op, bytes, elem);
        let (send_len, recv_len, inplace_len) = lengths(shape);
        let w = opts.windows;
        let mut bufs = Buffers::<T> {
            send: Buf::new(comm, send_len, w)?,
            recv: Buf::new(comm, recv_len, w)?,
            inplace: Buf::new(comm, inplace_len, w)?,
        };
        let size_bytes = total * elem;

        fill(shape, &mut bufs, false);
        for _ in 0..opts.warmup_iters {
            call(comm, shape, &mut bufs, false)?;
        }
        let seconds = if opts.fresh {
            time_fresh(comm, opts.iters, shape, &mut bufs, false)?
        } else {
            time_calls(comm, opts.iters, || call(comm, shape, &mut bufs, false))?
        };
        let wrong = if opts.check {
            Some(count_wrong(comm, shape, &bufs, false)?)
        } else {
            None
        };
        let out_of_place = Measure::new(opts.coll, ranks, size_bytes, seconds, wrong);

        let in_place = if opts.coll.has_in_place() {
            fill(shape, &mut bufs, true);
            for _ in 0..opts.warmup_iters {
                call(comm, shape, &mut bufs, true)?;
            }
            let seconds = if opts.fresh {
                time_fresh(comm, opts.iters, shape, &mut bufs, true)?
            } else {
                time_calls(comm, opts.iters, || call(comm, shape, &mut bufs, true))?
            };
            // In-place calls consume their input: refill and check one more,
            // untimed call.
            let wrong = if opts.check {
                fill(shape, &mut bufs, true);
                call(comm, shape, &mut bufs, true)?;
                Some(count_wrong(comm, shape, &bufs, true)?)
            } else {
                None
            };
            Some(Measure::new(opts.coll, ranks, size_bytes, seconds, wrong))
        } else {
            None
        };
        report.row(&Row::new::<T>(opts, op, total, out_of_place, in_place))?;
    }
    Ok(())
}

/// Barrier, then `iters` calls; the mean per call on this rank, then the
/// maximum over ranks.
fn time_calls(
    comm: &Communicator,
    iters: usize,
    mut one: impl FnMut() -> ferroccl::Result<()>,
) -> AnyResult<f64> {
    comm.barrier()?;
    let start = Instant::now();
    for _ in 0..iters {
        one()?;
    }
    let mut t = [start.elapsed().as_secs_f64() / iters as f64];
    comm.all_reduce_in_place(&mut t, ReduceOp::Max)?;
    Ok(t[0])
}

/// `iters` calls, each after a training step's touch of the buffers
/// (untimed: the whole output read, the input rewritten with what it held
/// when `fill` wrote it, then a barrier), timed one by one (`--fresh 1`);
/// the mean per call on this rank, then the maximum over ranks. Back to
/// back on the same buffers (`time_calls`), a call finds what the last one
/// left in the caches: an input the peers read last time still clean in
/// their caches, an output a peer wrote still in the writer's, as no
/// benchmark reads it.
fn time_fresh<T: Element>(
    comm: &Communicator,
    iters: usize,
    shape: Shape,
    bufs: &mut Buffers<T>,
    in_place: bool,
) -> AnyResult<f64> {
    fill(shape, bufs, in_place);
    // Where the call overwrites the buffer it reads (in place, and a
    // broadcast's output off the root), its input is restored from a copy;
    // elsewhere each element is written back where it is, so that the
    // touch reads no second buffer, as the MPIs' touch in
    // bench/peers/mpi_coll.c (which writes constants) reads none.
    let overwritten = in_place || (shape.coll == Coll::Broadcast && shape.rank != shape.root);
    let input: Vec<T> = if overwritten {
        read_buffer(shape, bufs, in_place).to_vec()
    } else {
        Vec::new()
    };
    let mut scratch = vec![T::zeroed(); REWRITE_CHUNK];
    let mut total = 0.0;
    for _ in 0..iters {
        let out: &[T] = if in_place { &bufs.inplace } else { &bufs.recv };
        std::hint::black_box(out.iter().fold(0.0, |a, &x| a + x.to_f64()));
        let buf = read_buffer(shape, bufs, in_place);
        if overwritten {
            buf.copy_from_slice(&input);
        } else {
            rewrite(buf, &mut scratch);
        }
        comm.barrier()?;
        let start = Instant::now();
        call(comm, shape, bufs, in_place)?;
        total += start.elapsed().as_secs_f64();
    }
    let mut t = [total / iters as f64];
    comm.all_reduce_in_place(&mut t, ReduceOp::Max)?;
    Ok(t[0])
}

/// Elements `rewrite` moves at a time.
const REWRITE_CHUNK: usize = 4096;

/// Write every element of `buf` back with the value it holds, as a step
/// that rewrites its gradients would: the lines end up written in this
/// core's cache. Through `scratch` (`REWRITE_CHUNK` elements), which the
/// compiler must treat as changed (`black_box`), so that it keeps the
/// stores.
fn rewrite<T: Element>(buf: &mut [T], scratch: &mut [T]) {
    for chunk in buf.chunks_mut(scratch.len()) {
        let tmp = &mut scratch[..chunk.len()];
        tmp.copy_from_slice(chunk);
        std::hint::black_box(&mut *tmp);
        chunk.copy_from_slice(tmp);
    }
}

/// The buffer a call reads: in place the one buffer, out of place the
/// input, but a broadcast's is its output buffer (the root's data).
fn read_buffer<T: Element>(s: Shape, b: &mut Buffers<T>, in_place: bool) -> &mut [T] {
    if in_place {
        &mut b.inplace
    } else if s.coll == Coll::Broadcast {
        &mut b.recv
    } else {
        &mut b.send
    }
}

/// One call of the collective.
fn call<T: Element>(
    comm: &Communicator,
    s: Shape,
    b: &mut Buffers<T>,
    in_place: bool,
) -> ferroccl::Result<()> {
    if in_place {
        let buf = &mut b.inplace[..];
        return match s.coll {
            Coll::AllReduce => comm.all_reduce_in_place(buf, s.op),
            Coll::ReduceScatter => comm.reduce_scatter_in_place(buf, s.op),
            Coll::AllGather => comm.all_gather_in_place(buf),
            Coll::Broadcast => comm.broadcast(buf, s.root),
            Coll::Reduce => comm.reduce_in_place(buf, s.op, s.root),
            Coll::AllToAll | Coll::SendRecv => unreachable!("no in-place {}", s.coll),
        };
    }
    match s.coll {
        Coll::AllReduce => comm.all_reduce(&b.send, &mut b.recv, s.op),
        Coll::ReduceScatter => comm.reduce_scatter(&b.send, &mut b.recv, s.op),
        Coll::AllGather => comm.all_gather(&b.send, &mut b.recv),
        Coll::Broadcast => comm.broadcast(&mut b.recv, s.root),
        Coll::Reduce => comm.reduce(&b.send, &mut b.recv, s.op, s.root),
        Coll::AllToAll => comm.all_to_all(&b.send, &mut b.recv),
        Coll::SendRecv => {
            // Calls on a communicator run one at a time, and a send larger
            // than the slots blocks until the peer receives; if every rank
            // sent first, a ring of them would wait on each other. Even ranks
            // send first and odd ranks receive first, which breaks every
            // cycle (for odd sizes the last, even, rank sends to rank 0,
            // whose send to the odd rank 1 completes first).
            let next = (s.rank + 1) % s.ranks;
            let prev = (s.rank + s.ranks - 1) % s.ranks;
            if s.rank.is_multiple_of(2) {
                comm.send(&b.send, next)?;
                comm.recv(&mut b.recv, prev)
            } else {
                comm.recv(&mut b.recv, prev)?;
                comm.send(&b.send, next)
            }
        }
    }
}
