//! The launcher behind `ferroccl-run`: starts the ranks of one node as child
//! processes with the torchrun-style environment, prefixes their output,
//! forwards SIGINT/SIGTERM, and stops the whole node when one rank fails.
//!
//! It owns process spawning and signal handling for the launcher binary
//! only; the library's communicators never call it. The children read their
//! environment with [`crate::bootstrap::detect_process_env`].
//!
//! Each child runs in a process group of its own (so that a terminal's Ctrl-C
//! reaches it once, through the launcher, and so that signals reach the
//! child's own children too) with its standard input closed. On Linux a rank
//! also gets SIGTERM when the launcher dies, however it dies (the parent
//! death signal, which follows the thread that called [`launch`]).

use crate::bootstrap::free_port;
use crate::error::{Error, Result};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the other ranks may take to stop on their own after one failed,
/// before they get SIGTERM (`FERROCCL_RUN_SETTLE_S`, default 1 s): a rank
/// that sees the failure prints an error naming the failed rank, which is
/// what a person needs to read.
fn settle_time() -> Duration {
    std::env::var("FERROCCL_RUN_SETTLE_S")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(1))
}

/// Grace period between SIGTERM and SIGKILL when `FERROCCL_RUN_GRACE_S` is
/// not set.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// The longest piece of a child's output written as one prefixed line;
/// longer lines are cut into pieces of this size.
const MAX_LINE: u64 = 64 << 10;

/// How long the output of exited children is still drained (their own
/// children may hold the pipes open).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How long to wait for children after SIGKILL before giving up on them.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What to start and how: the parsed command line of `ferroccl-run`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchOptions {
    /// Processes to start on this node (`-n`, `--nproc-per-node`).
    pub nproc_per_node: usize,
    /// Number of nodes in the job (`--nnodes`, default 1).
    pub nnodes: usize,
    /// Index of this node (`--node-rank`, default 0).
    pub node_rank: usize,
    /// Host of the rendezvous (`--master-addr`, default `127.0.0.1`).
    pub master_addr: String,
    /// Port of the rendezvous (`--master-port`); `None` picks a free port,
    /// which only works with one node.
    pub master_port: Option<u16>,
    /// The program each rank runs.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// More environment for every child (`--env KEY=VALUE`), set last.
    pub extra_env: Vec<(String, String)>,
    /// Prefix every output line with `[rank R] ` (off with `--no-prefix`).
    pub prefix_output: bool,
    /// Pin each rank to a CPU (`--bind-to`).
    pub bind: Bind,
}

/// Whether and how ranks are pinned to CPUs (`--bind-to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Bind {
    /// Each local rank gets an equal, contiguous share of the CPUs this
    /// launcher may run on (one CPU each when there are as many ranks as
    /// CPUs, all of them for a single rank), when there are at least as many
    /// CPUs as local ranks; otherwise no pinning. A rank's own threads
    /// (a framework's compute pool, the progress thread) share its CPUs.
    #[default]
    Share,
    /// Local rank `i` on CPU `i mod n` of the launcher's `n` CPUs alone
    /// (Open MPI's `--bind-to core`).
    Core,
    /// Leave placement to the scheduler.
    None,
}

/// The CPUs each local rank is pinned to (None: not pinned). Two ranks
/// that wait on each other by spinning and find themselves on one CPU (the
/// scheduler likes to move a woken process next to its waker) make each
/// call cost a scheduler slice instead of a microsecond; keeping them on
/// CPUs of their own avoids that, as mpirun's binding does.
fn placement(bind: Bind, nproc: usize) -> Vec<Option<Vec<usize>>> {
    let cpus = allowed_cpus();
    let c = cpus.len();
    (0..nproc)
        .map(|i| match bind {
            _ if c == 0 => None,
            Bind::None => None,
            Bind::Core => Some(vec![cpus[i % c]]),
            Bind::Share if nproc > c => None,
            Bind::Share => Some(cpus[i * c / nproc..(i + 1) * c / nproc].to_vec()),
        })
        .collect()
}

/// The CPUs this process may run on, in order (empty where unknown).
#[cfg(target_os = "linux")]
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: the set is a plain bit array that the kernel fills; its size
    // is passed with it, and CPU_ISSET reads within it (i < CPU_SETSIZE).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&i| libc::CPU_ISSET(i, &set))
            .collect()
    }
}

#[cfg(not(target_os = "linux"))]
fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

/// A CPU set holding `cpus`.
#[cfg(target_os = "linux")]
fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET writes one bit
    // inside it for each CPU below CPU_SETSIZE (others are skipped).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(cpu, &mut set);
        }
        set
    }
}

/// The usage text of `ferroccl-run`.
pub const USAGE: &str = "\
usage: ferroccl-run -n N [options] [--] PROGRAM [ARGS...]

Starts N copies of PROGRAM on this node with RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, FERROCCL_LAUNCHER and
FERROCCL_TOKEN set (as torchrun does). When a rank fails, the others have
FERROCCL_RUN_SETTLE_S seconds (default 1) to stop on their own and report
it, then get SIGTERM, then SIGKILL after FERROCCL_RUN_GRACE_S seconds
(default 5); ferroccl-run exits with the failed rank's code.

options:
  -n, --nproc-per-node N   processes on this node (required)
      --nnodes K           nodes in the job (default 1)
      --node-rank I        index of this node, 0..K-1 (default 0)
      --master-addr A      host of rank 0 (default 127.0.0.1)
      --master-port P      port of the rendezvous (default: a free port;
                           required when K > 1)
      --env KEY=VALUE      set KEY in every rank's environment (repeatable)
      --no-prefix          do not prefix output lines with [rank R]
      --bind-to B          share (default): pin each rank to an equal share
                           of the CPUs (one each when ranks = CPUs; none when
                           there are more ranks than CPUs); core: one CPU per
                           rank; none: no pinning
  -h, --help               print this help

FERROCCL_TOKEN, if set, is passed to the ranks; otherwise a random token is
made (one node) or one is derived from the master address and job shape
(several nodes: set FERROCCL_TOKEN to a secret shared by all nodes instead).";

/// Whether the command line asks for help (`-h` or `--help` among the
/// launcher's own options, not the program's).
pub fn wants_help(args: &[String]) -> bool {
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "-h" | "--help" => return true,
            "--" => return false,
            s if takes_value(s) => {
                args.next();
            }
            s if s.starts_with('-') => {}
            _ => return false, // the program starts here
        }
    }
    false
}

/// Whether option `name` (without `=value`) takes a value.
fn takes_value(name: &str) -> bool {
    matches!(
        name,
        "-n" | "--nproc-per-node"
            | "--nproc_per_node"
            | "--nnodes"
            | "--node-rank"
            | "--node_rank"
            | "--master-addr"
            | "--master_addr"
            | "--master-port"
            | "--master_port"
            | "--env"
            | "--bind-to"
            | "--bind_to"
    )
}

fn usage_error(msg: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("{msg}\n\n{USAGE}"))
}

/// Parse the arguments of `ferroccl-run` (without the program name itself).
///
/// Options come first; the program starts after `--` or at the first
/// argument that is not an option. Both `--opt value` and `--opt=value` are
/// accepted. Errors are [`Error::InvalidArgument`] carrying the usage text.
pub fn parse_args(args: &[String]) -> Result<LaunchOptions> {
    let mut nproc: Option<usize> = None;
    let mut nnodes: usize = 1;
    let mut node_rank: usize = 0;
    let mut master_addr = "127.0.0.1".to_string();
    let mut master_port: Option<u16> = None;
    let mut extra_env = Vec::new();
    let mut prefix_output = true;
    let mut bind = Bind::Share;
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        if arg == "--" {
            i += 1;
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            break;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let value = if takes_value(name) {
            match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    match args.get(i) {
                        Some(v) => v.clone(),
                        None => return Err(usage_error(format!("{name} needs a value"))),
                    }
                }
            }
        } else if inline.is_some() {
            return Err(usage_error(format!("{name} takes no value")));
        } else {
            String::new()
        };
        match name {
            "-n" | "--nproc-per-node" | "--nproc_per_node" => {
                nproc = Some(count(name, &value)?);
            }
            "--nnodes" => nnodes = count(name, &value)?,
            "--node-rank" | "--node_rank" => node_rank = index(name, &value)?,
            "--master-addr" | "--master_addr" => {
                if value.is_empty() {
                    return Err(usage_error("--master-addr must not be empty"));
                }
                master_addr = value;
            }
            "--master-port" | "--master_port" => match value.parse::<u16>() {
                Ok(p) if p != 0 => master_port = Some(p),
                _ => {
                    return Err(usage_error(format!(
                        "--master-port '{value}' is not a port number (1-65535)"
                    )))
                }
            },
            "--env" => match value.split_once('=') {
                Some((k, v)) if !k.is_empty() => extra_env.push((k.to_string(), v.to_string())),
                _ => {
                    return Err(usage_error(format!(
                        "--env '{value}' is not of the form KEY=VALUE"
                    )))
                }
            },
            "--no-prefix" => prefix_output = false,
            "--bind-to" | "--bind_to" => {
                bind = match value.as_str() {
                    "share" => Bind::Share,
                    "core" => Bind::Core,
                    "none" => Bind::None,
                    _ => {
                        return Err(usage_error(format!(
                            "--bind-to '{value}' is not one of: share, core, none"
                        )))
                    }
                }
            }
            "-h" | "--help" => return Err(usage_error("help requested")),
            other => return Err(usage_error(format!("unknown option '{other}'"))),
        }
        i += 1;
    }
    let Some(nproc_per_node) = nproc else {
        return Err(usage_error(
            "-n N (the number of processes on this node) is required",
        ));
    };
    if node_rank >= nnodes {
        return Err(usage_error(format!(
            "--node-rank {node_rank} must be below --nnodes {nnodes}"
        )));
    }
    let Some(program) = args.get(i) else {
        return Err(usage_error("no program to run"));
    };
    Ok(LaunchOptions {
        nproc_per_node,
        nnodes,
        node_rank,
        master_addr,
        master_port,
        program: program.into(),
        args: args[i + 1..].iter().map(OsString::from).collect(),
        extra_env,
        prefix_output,
        bind,
    })
}

fn count(name: &str, v: &str) -> Result<usize> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(usage_error(format!(
            "{name} '{v}' is not a positive number"
        ))),
    }
}

fn index(name: &str, v: &str) -> Result<usize> {
    v.parse::<usize>()
        .map_err(|_| usage_error(format!("{name} '{v}' is not a number")))
}

/// 64 random bits from the kernel, or (if that fails) from the clock and
/// the process id.
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    mix64(t ^ (u64::from(std::process::id()) << 32))
}

/// A bijective scrambling of 64 bits (the splitmix64 finaliser).
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A token every node of a multi-node job computes alike from what they
/// share. It keeps other jobs from joining by mistake; it is no secret.
fn derived_token(master_addr: &str, master_port: u16, nnodes: usize, nproc: usize) -> u64 {
    let text = format!("ferroccl-run|{master_addr}|{master_port}|{nnodes}|{nproc}");
    // FNV-1a: fixed and the same on every platform and compiler version.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h)
}

/// The grace period from `FERROCCL_RUN_GRACE_S` (seconds, fractions allowed).
fn grace_from_env() -> Result<Duration> {
    match std::env::var("FERROCCL_RUN_GRACE_S") {
        Err(_) => Ok(DEFAULT_GRACE),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && (0.0..=3600.0).contains(&s) => Ok(Duration::from_secs_f64(s)),
            _ => Err(Error::Env(format!(
                "FERROCCL_RUN_GRACE_S='{v}' is not a number of seconds between 0 and 3600"
            ))),
        },
    }
}

// ------------------------------------------------------------ signals

/// Write end of the self-pipe that the signal handler writes to; -1 when no
/// launch is running.
static SIGNAL_PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

/// One launch at a time per process: the signal handler is process-wide.
static LAUNCH_LOCK: Mutex<()> = Mutex::new(());

/// Signals passed on to the ranks. SIGHUP too: the ranks live in process
/// groups of their own, so a closing terminal would not reach them.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_PIPE_WRITE.load(Ordering::SeqCst);
    if fd < 0 {
        return;
    }
    let byte = sig as u8;
    #[cfg(target_os = "linux")]
    // SAFETY: __errno_location returns this thread's errno slot, valid for
    // the thread's life; saving it keeps the interrupted code's errno intact.
    let saved = unsafe { *libc::__errno_location() };
    // SAFETY: write(2) is async-signal-safe; `fd` is the write end of our
    // non-blocking pipe (a full pipe only loses a duplicate wake-up), and
    // `byte` lives on this stack frame for the call.
    unsafe {
        libc::write(fd, (&byte as *const u8).cast(), 1);
    }
    #[cfg(target_os = "linux")]
    // SAFETY: as above.
    unsafe {
        *libc::__errno_location() = saved
    };
}

/// SIGINT and SIGTERM delivered to the launcher, turned into bytes on a pipe
/// that the launch loop polls. Restores the previous handlers when dropped.
struct SignalPipe {
    read_fd: libc::c_int,
    write_fd: libc::c_int,
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalPipe {
    fn install() -> Result<SignalPipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` has room for the two descriptors pipe(2) writes.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(Error::Io(format!(
                "cannot create the signal pipe: {}",
                std::io::Error::last_os_error()
            )));
        }
        for fd in fds {
            // SAFETY: fcntl on descriptors we just created; children must
            // not inherit them and neither end may block.
            unsafe {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                let fl = libc::fcntl(fd, libc::F_GETFL);
                libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
        }
        let mut pipe = SignalPipe {
            read_fd: fds[0],
            write_fd: fds[1],
            previous: Vec::new(),
        };
        SIGNAL_PIPE_WRITE.store(fds[1], Ordering::SeqCst);
        for sig in FORWARDED {
            // SAFETY: a zeroed sigaction is a valid "no flags, empty mask"
            // value; we then fill the handler and mask.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            action.sa_flags = libc::SA_RESTART;
            // SAFETY: sa_mask is a valid sigset_t inside `action`.
            unsafe { libc::sigemptyset(&mut action.sa_mask) };
            // SAFETY: see the zeroed value above; sigaction fills `old`.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: both pointers are to live sigaction values; the handler
            // only does async-signal-safe work.
            if unsafe { libc::sigaction(sig, &action, &mut old) } != 0 {
                return Err(Error::Io(format!(
                    "cannot install a handler for signal {sig}: {}",
                    std::io::Error::last_os_error()
                )));
            }
            pipe.previous.push((sig, old));
        }
        Ok(pipe)
    }

    /// Wait until a signal arrives or `timeout` passes; return the signals
    /// received.
    fn wait(&self, timeout: Duration) -> Vec<libc::c_int> {
        let mut pfd = libc::pollfd {
            fd: self.read_fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd; poll only writes its revents.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        let mut got = Vec::new();
        let mut buf = [0u8; 16];
        loop {
            // SAFETY: reading into a stack buffer of the given length from
            // our non-blocking pipe.
            let n = unsafe { libc::read(self.read_fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            got.extend(buf[..n as usize].iter().map(|&b| libc::c_int::from(b)));
        }
        got
    }
}

impl Drop for SignalPipe {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores the action saved by install for this signal.
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
        SIGNAL_PIPE_WRITE.store(-1, Ordering::SeqCst);
        // SAFETY: closing the descriptors we created; no handler refers to
        // them any more.
        unsafe {
            libc::close(self.read_fd);
            libc::close(self.write_fd);
        }
    }
}

/// Send `sig` to the process group led by `pid` (the child and whatever it
/// started). Harmless when the group is gone.
fn signal_group(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) with a negative pid addresses a process group; each
    // child leads its own group, created at spawn, and a group id is not
    // reused while the group has members.
    unsafe { libc::kill(-(pid as libc::pid_t), sig) };
}

// ------------------------------------------------------------ output

/// Copy a child's output to ours, each line prefixed with `[rank R] ` and
/// written whole under the stream's lock, so lines of different ranks never
/// mix. Output that cannot be written is still drained so the child never
/// blocks on a full pipe.
fn pump_lines(rank: usize, src: impl Read, to_stderr: bool) {
    let mut reader = BufReader::new(src);
    let prefix = format!("[rank {rank}] ");
    let mut line = Vec::new();
    let mut out_ok = true;
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        if out_ok {
            let written = if to_stderr {
                let mut e = std::io::stderr().lock();
                e.write_all(&line).and_then(|_| e.flush())
            } else {
                let mut o = std::io::stdout().lock();
                o.write_all(&line).and_then(|_| o.flush())
            };
            out_ok = written.is_ok();
        }
    }
}

// ------------------------------------------------------------ launch

/// One started rank.
struct RankProcess {
    rank: usize,
    child: Child,
    status: Option<ExitStatus>,
}

/// The exit code a shell would report for `status`.
fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

fn describe_exit(rank: usize, status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("ferroccl-run: rank {rank} exited with code {c}"),
        (None, Some(s)) => format!("ferroccl-run: rank {rank} was killed by signal {s}"),
        (None, None) => format!("ferroccl-run: rank {rank} ended with status {status}"),
    }
}

/// Start the ranks of this node and supervise them; returns the exit code
/// for the launcher: 0 if every rank exited 0, else the code of the first
/// rank that failed (128 + signal number for a signal).
///
/// When a rank fails, the others get SIGTERM and, after the grace period
/// (`FERROCCL_RUN_GRACE_S`, default 5 s), SIGKILL. SIGINT, SIGTERM and
/// SIGHUP sent to the launcher are forwarded to every rank, and the same
/// grace period then bounds how long the launcher waits for them.
pub fn launch(opts: &LaunchOptions) -> Result<i32> {
    if opts.nproc_per_node == 0 || opts.nnodes == 0 || opts.node_rank >= opts.nnodes {
        return Err(Error::InvalidArgument(format!(
            "cannot launch {} processes per node as node {} of {}",
            opts.nproc_per_node, opts.node_rank, opts.nnodes
        )));
    }
    let grace = grace_from_env()?;
    let master_port =
        match opts.master_port {
            Some(p) => p,
            None if opts.nnodes == 1 => free_port()?,
            None => return Err(Error::InvalidArgument(
                "--master-port is required with --nnodes > 1: every node must use the same port"
                    .into(),
            )),
        };
    let token = match std::env::var("FERROCCL_TOKEN") {
        Ok(t) if !t.trim().is_empty() => t,
        _ if opts.nnodes == 1 => random_u64().to_string(),
        _ => {
            eprintln!(
                "ferroccl-run: note: FERROCCL_TOKEN is not set; deriving the job token from the \
                 master address, port and job shape. Set FERROCCL_TOKEN to the same secret on \
                 every node to keep other jobs out."
            );
            derived_token(
                &opts.master_addr,
                master_port,
                opts.nnodes,
                opts.nproc_per_node,
            )
            .to_string()
        }
    };
    let world_size = opts.nnodes * opts.nproc_per_node;

    let _one_at_a_time = LAUNCH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let signals = SignalPipe::install()?;
    let (pump_done_tx, pump_done_rx) = crossbeam_channel::unbounded::<()>();
    let mut pumps = 0usize;
    let mut ranks: Vec<RankProcess> = Vec::with_capacity(opts.nproc_per_node);

    let cpus = placement(opts.bind, opts.nproc_per_node);
    for (local, cpu) in cpus.into_iter().enumerate() {
        let rank = opts.node_rank * opts.nproc_per_node + local;
        let mut cmd = Command::new(&opts.program);
        cmd.args(&opts.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", world_size.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", opts.nproc_per_node.to_string())
            .env("GROUP_RANK", opts.node_rank.to_string())
            .env("MASTER_ADDR", &opts.master_addr)
            .env("MASTER_PORT", master_port.to_string())
            .env("FERROCCL_LAUNCHER", "ferroccl-run")
            .env("FERROCCL_TOKEN", &token)
            .envs(opts.extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .process_group(0);
        #[cfg(target_os = "linux")]
        {
            let launcher = std::process::id() as libc::pid_t;
            // Built here: the child may not allocate between fork and exec.
            let cpu_set = cpu.as_deref().map(cpu_set);
            // SAFETY: the closure runs in the child between fork and exec and
            // only makes async-signal-safe system calls (prctl, getppid,
            // sched_setaffinity) and fills a CPU set on its stack; it takes
            // no lock and allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    // If the launcher dies (even by SIGKILL), the rank gets
                    // SIGTERM instead of running on as an orphan.
                    let sig = libc::SIGTERM as libc::c_ulong;
                    if libc::prctl(libc::PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::getppid() != launcher {
                        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    if let Some(set) = &cpu_set {
                        // A failure to pin is not worth failing the rank
                        // for (a container may forbid it); it runs unpinned.
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
                    }
                    Ok(())
                });
            }
        }
        if opts.prefix_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for r in &mut ranks {
                    signal_group(r.child.id(), libc::SIGKILL);
                    let _ = r.child.wait();
                }
                return Err(Error::Io(format!(
                    "cannot start rank {rank} ('{}'): {e}",
                    opts.program.to_string_lossy()
                )));
            }
        };
        if opts.prefix_output {
            let pipes: [(Option<Box<dyn Read + Send>>, bool); 2] = [
                (child.stdout.take().map(|s| Box::new(s) as _), false),
                (child.stderr.take().map(|s| Box::new(s) as _), true),
            ];
            for (pipe, to_stderr) in pipes {
                let Some(pipe) = pipe else { continue };
                let done = pump_done_tx.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("ferroccl-run-out-{rank}"))
                    .spawn(move || {
                        pump_lines(rank, pipe, to_stderr);
                        let _ = done.send(());
                    });
                if spawned.is_ok() {
                    pumps += 1;
                }
            }
        }
        ranks.push(RankProcess {
            rank,
            child,
            status: None,
        });
    }
    drop(pump_done_tx);

    let mut first_failure: Option<(usize, ExitStatus)> = None;
    let mut term_at: Option<Instant> = None;
    let mut kill_at: Option<Instant> = None;
    let mut give_up_at: Option<Instant> = None;
    loop {
        for sig in signals.wait(Duration::from_millis(20)) {
            for r in &ranks {
                signal_group(r.child.id(), sig);
            }
            // Whatever the ranks do with it, the launcher ends in bounded
            // time from here.
            kill_at.get_or_insert_with(|| Instant::now() + grace);
        }
        let mut ended = Vec::new();
        for (i, r) in ranks.iter_mut().enumerate() {
            if r.status.is_none() {
                if let Ok(Some(status)) = r.child.try_wait() {
                    r.status = Some(status);
                    ended.push(i);
                }
            }
        }
        let failed: Vec<usize> = ended
            .iter()
            .copied()
            .filter(|&i| ranks[i].status.is_some_and(|s| !s.success()))
            .collect();
        if !failed.is_empty() && first_failure.is_none() {
            // Of the ranks that ended in the same poll, one killed by a
            // signal is the cause; the others most likely exited on the error
            // it caused.
            let cause = failed
                .iter()
                .copied()
                .find(|&i| ranks[i].status.is_some_and(|s| s.signal().is_some()))
                .unwrap_or(failed[0]);
            let status = ranks[cause].status.expect("ended ranks have a status");
            first_failure = Some((ranks[cause].rank, status));
            // Give the survivors a moment to notice and report the failure
            // themselves (they name the failed rank) before stopping them.
            term_at = Some(Instant::now() + settle_time());
        }
        for &i in &failed {
            let status = ranks[i].status.expect("ended ranks have a status");
            eprintln!("{}", describe_exit(ranks[i].rank, status));
        }
        if term_at.is_some_and(|at| Instant::now() >= at) {
            term_at = None;
            // Exited ranks too: their groups may still have members.
            for r in &ranks {
                signal_group(r.child.id(), libc::SIGTERM);
            }
            kill_at.get_or_insert_with(|| Instant::now() + grace);
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        let now = Instant::now();
        if give_up_at.is_none() && kill_at.is_some_and(|at| now >= at) {
            for r in ranks.iter().filter(|r| r.status.is_none()) {
                eprintln!(
                    "ferroccl-run: rank {} did not stop within {:.1} s; sending SIGKILL",
                    r.rank,
                    grace.as_secs_f64()
                );
            }
            for r in &ranks {
                signal_group(r.child.id(), libc::SIGKILL);
            }
            give_up_at = Some(now + KILL_WAIT);
        }
        if give_up_at.is_some_and(|at| now >= at) {
            for r in ranks.iter().filter(|r| r.status.is_none()) {
                eprintln!(
                    "ferroccl-run: rank {} (pid {}) is still there after SIGKILL; leaving it",
                    r.rank,
                    r.child.id()
                );
            }
            break;
        }
    }
    if first_failure.is_some() {
        // Whatever the failed job's ranks left behind in their groups.
        for r in &ranks {
            signal_group(r.child.id(), libc::SIGKILL);
        }
    }
    drop(signals);

    // Let the output threads finish; a rank's own children may hold the
    // pipes open, so this is bounded too.
    let until = Instant::now() + DRAIN_TIMEOUT;
    for _ in 0..pumps {
        if pump_done_rx
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .is_err()
        {
            break;
        }
    }

    if let Some((_, status)) = first_failure {
        return Ok(exit_code(status));
    }
    // No failure seen: all exited 0, or we gave up on some after SIGKILL.
    Ok(ranks
        .iter()
        .map(|r| r.status.map(exit_code).unwrap_or(128 + libc::SIGKILL))
        .find(|&c| c != 0)
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    fn usage_msg(a: &[&str]) -> String {
        match parse_args(&args(a)) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn parses_the_full_command_line() {
        let o = parse_args(&args(&[
            "--nproc-per-node=4",
            "--nnodes",
            "3",
            "--node-rank=2",
            "--master-addr",
            "head",
            "--master-port",
            "4242",
            "--env",
            "A=b=c",
            "--no-prefix",
            "--",
            "python",
            "-u",
            "train.py",
        ]))
        .unwrap();
        assert_eq!(
            o,
            LaunchOptions {
                nproc_per_node: 4,
                nnodes: 3,
                node_rank: 2,
                master_addr: "head".into(),
                master_port: Some(4242),
                program: "python".into(),
                args: vec!["-u".into(), "train.py".into()],
                extra_env: vec![("A".into(), "b=c".into())],
                prefix_output: false,
                bind: Bind::Share,
            }
        );
    }

    #[test]
    fn program_may_follow_without_double_dash() {
        let o = parse_args(&args(&["-n", "2", "sh", "-c", "exit 0"])).unwrap();
        assert_eq!(o.nproc_per_node, 2);
        assert_eq!((o.nnodes, o.node_rank), (1, 0));
        assert_eq!(o.master_addr, "127.0.0.1");
        assert_eq!(o.master_port, None);
        assert!(o.prefix_output);
        assert_eq!(o.program, OsString::from("sh"));
        assert_eq!(o.args, vec![OsString::from("-c"), OsString::from("exit 0")]);
    }

    #[test]
    fn usage_errors() {
        assert!(usage_msg(&["--", "sh"]).starts_with("-n N"));
        assert!(usage_msg(&["-n", "0", "sh"]).contains("'0' is not a positive number"));
        assert!(usage_msg(&["-n", "x", "sh"]).contains("-n 'x'"));
        assert!(usage_msg(&["-n"]).contains("-n needs a value"));
        assert!(usage_msg(&["-n", "2"]).starts_with("no program"));
        assert!(usage_msg(&["-n", "2", "--"]).starts_with("no program"));
        assert!(usage_msg(&["-n", "2", "--bogus", "sh"]).contains("unknown option '--bogus'"));
        assert!(
            usage_msg(&["-n", "2", "--nnodes", "2", "--node-rank", "2", "sh"])
                .contains("must be below --nnodes 2")
        );
        assert!(usage_msg(&["-n", "2", "--master-port", "0", "sh"]).contains("'0'"));
        assert!(usage_msg(&["-n", "2", "--env", "novalue", "sh"]).contains("KEY=VALUE"));
        assert!(usage_msg(&["-n", "2", "--no-prefix=1", "sh"]).contains("takes no value"));
    }

    #[test]
    fn help_is_recognised_before_the_program_only() {
        assert!(wants_help(&args(&["--help"])));
        assert!(wants_help(&args(&["-n", "2", "-h"])));
        assert!(wants_help(&args(&["--master-port=5", "--help", "prog"])));
        assert!(!wants_help(&args(&["-n", "2", "--", "prog", "--help"])));
        assert!(!wants_help(&args(&["-n", "2", "prog", "--help"])));
        assert!(!wants_help(&args(&["--master-addr", "-h", "prog"])));
    }

    #[test]
    fn derived_tokens_agree_and_differ_by_job() {
        let a = derived_token("head", 29500, 2, 4);
        assert_eq!(a, derived_token("head", 29500, 2, 4));
        assert_ne!(a, derived_token("head", 29501, 2, 4));
        assert_ne!(a, derived_token("head", 29500, 2, 8));
        assert_ne!(a, derived_token("other", 29500, 2, 4));
    }

    #[test]
    fn exit_codes_of_signals() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
        assert_eq!(
            describe_exit(4, ExitStatus::from_raw(libc::SIGTERM)),
            "ferroccl-run: rank 4 was killed by signal 15"
        );
    }
}
