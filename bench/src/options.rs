//! The command line of `ferroccl-perf`: nccl-tests' flags (`-t` threads
//! per process among them), plus `--ranks` to launch the job itself,
//! `--csv` to keep the rows and `--device` to put the buffers in GPU memory.

use crate::coll::Coll;
use ferroccl::{DataType, ReduceOp};
use std::path::PathBuf;

/// The usage text of `ferroccl-perf`.
pub const USAGE: &str = "\
usage: ferroccl-perf [COLLECTIVE] [options]

Times a ferroccl collective over a range of sizes and prints nccl-tests style
rows (time, algbw, busbw, #wrong; out-of-place and in-place). Either launches
its own processes (--ranks N) or joins the job of ferroccl-run, torchrun,
mpirun or srun. Without either it runs one process. Each process runs -t
threads, each thread a rank of its own (nccl-tests' -t): ranks = processes x
threads.

COLLECTIVE: allreduce (default), reducescatter, allgather, broadcast, reduce,
            alltoall, sendrecv (also accepted as --coll NAME, or -t NAME)

options:
  -b, --minbytes SIZE       smallest size (default 1K); suffixes K, M, G
  -e, --maxbytes SIZE       largest size (default 64M)
  -f, --stepfactor F        multiply the size by F each row (default 2)
  -n, --iters N             timed iterations per size (default 20)
  -w, --warmup_iters N      untimed iterations per size (default 5)
  -d, --datatype T          float, double, half, bfloat16, int8, uint8, int32,
                            uint32, int64, uint64 (or f32, bf16, ...) or all
                            (default float)
  -o, --op OP               sum, prod, min, max, avg or all (default sum)
  -c, --check 0|1           verify results and count wrong elements (default 1)
  -r, --root R              root of broadcast and reduce (default 0)
  -t, --nthreads N          threads per process, each one rank (default 1):
                            global rank = process rank x N + thread, ranks =
                            processes x N. Only global rank 0 prints.
                            (-t NAME, not a number, names the collective as
                            --coll does.)
      --coll NAME           the collective
  -R, --register 0|2        2: allocate every buffer as a window that all
                            ranks map (Communicator::alloc_window; nccl-tests'
                            symmetric registration), so collectives copy
                            straight between ranks' buffers; 0: plain
                            buffers (default). 1 (local registration) has no
                            CPU counterpart.
      --fresh 0|1           1: before every timed call (untimed, then a
                            barrier) read the whole output and rewrite the
                            input, as a training step does between
                            collectives, and time each call alone; 0: calls
                            back to back on the same buffers, as nccl-tests
                            (default). Host buffers only.
      --ranks N             launch N local processes of this program (each
                            running -t threads: N x threads ranks)
      --csv FILE            also write one CSV row per size to FILE
      --device host|cuda    where the buffers live (default host). cuda: in
                            the memory of GPU LOCAL_RANK % GPU count (the
                            threads of a process share its GPU, each with its
                            own stream), calls enqueued on the stream and
                            timed with CUDA events (nccl-tests' way); the
                            header adds each rank's GPU and the pinned host
                            copy bandwidth of the largest size. Not with
                            -R 2.
  -h, --help                print this help

The size is the one nccl-tests prints: for allgather and reducescatter the
whole gathered array, for alltoall one rank's send buffer.";

/// Settings of one `ferroccl-perf` run.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The collective to time.
    pub coll: Coll,
    /// Smallest size in bytes.
    pub min_bytes: usize,
    /// Largest size in bytes.
    pub max_bytes: usize,
    /// Size multiplier between rows (at least 2).
    pub step_factor: usize,
    /// Timed iterations per size.
    pub iters: usize,
    /// Untimed iterations per size before the timed ones.
    pub warmup_iters: usize,
    /// Element types, one table section each.
    pub dtypes: Vec<DataType>,
    /// Reduction operators (ignored by collectives that do not reduce).
    pub ops: Vec<ReduceOp>,
    /// Verify results.
    pub check: bool,
    /// Root of broadcast and reduce.
    pub root: usize,
    /// Launch this many local processes instead of joining a job.
    pub ranks: Option<usize>,
    /// Threads per process, each a rank of its own (`-t`, nccl-tests'
    /// `--nthreads`; at least 1).
    pub threads: usize,
    /// Where to write CSV rows.
    pub csv: Option<PathBuf>,
    /// Allocate the buffers as windows (`-R 2`).
    pub windows: bool,
    /// Read the output and rewrite the input before every timed call,
    /// untimed (`--fresh 1`).
    pub fresh: bool,
    /// Where the buffers live.
    pub device: Device,
}

/// Where `ferroccl-perf` puts its buffers (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// Host memory; calls run on the caller's thread, timed by the host
    /// clock.
    #[default]
    Host,
    /// CUDA device memory; calls enqueued on a stream, timed by CUDA events.
    Cuda,
}

impl Device {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Device::Host => "host",
            Device::Cuda => "cuda",
        }
    }

    /// Parse a `--device` value (`cpu` and `gpu` are accepted too).
    pub fn from_name(name: &str) -> Option<Device> {
        match name.trim().to_ascii_lowercase().as_str() {
            "host" | "cpu" => Some(Device::Host),
            "cuda" | "gpu" => Some(Device::Cuda),
            _ => None,
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            coll: Coll::AllReduce,
            min_bytes: 1 << 10,
            max_bytes: 64 << 20,
            step_factor: 2,
            iters: 20,
            warmup_iters: 5,
            dtypes: vec![DataType::F32],
            ops: vec![ReduceOp::Sum],
            check: true,
            root: 0,
            ranks: None,
            threads: 1,
            csv: None,
            windows: false,
            fresh: false,
            device: Device::Host,
        }
    }
}

impl Options {
    /// The sizes in bytes of the rows: `min_bytes` times powers of
    /// `step_factor` up to `max_bytes`.
    pub fn sizes(&self) -> Vec<usize> {
        let mut sizes = Vec::new();
        let mut s = self.min_bytes;
        while s <= self.max_bytes {
            sizes.push(s);
            match s.checked_mul(self.step_factor) {
                Some(next) => s = next,
                None => break,
            }
        }
        sizes
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Run the benchmark.
    Run(Options),
    /// Print the usage text.
    Help,
}

/// Parse a size: a number of bytes with an optional K, M or G suffix
/// (powers of 1024, as nccl-tests reads them; `KB`, `KiB` also accepted).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(format!("size '{text}' does not start with a number"));
    }
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => {
            return Err(format!(
                "size '{text}': unknown suffix '{suffix}' (K, M, G)"
            ))
        }
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("size '{text}' is too large"))?;
    n.checked_mul(1usize << shift)
        .ok_or_else(|| format!("size '{text}' is too large"))
}

/// Every option but `-h`/`--help`; all of them take a value.
const OPTIONS_WITH_VALUE: [&str; 28] = [
    "-b",
    "--minbytes",
    "-e",
    "--maxbytes",
    "-f",
    "--stepfactor",
    "-n",
    "--iters",
    "-w",
    "--warmup_iters",
    "--warmup-iters",
    "-d",
    "--datatype",
    "-o",
    "--op",
    "-c",
    "--check",
    "-r",
    "--root",
    "-t",
    "--nthreads",
    "--coll",
    "--ranks",
    "--csv",
    "-R",
    "--register",
    "--fresh",
    "--device",
];

/// Whether `value` reads as a whole number (a sign allowed, so that `-t -1`
/// is refused as a thread count, not looked up as a collective).
fn is_integer(value: &str) -> bool {
    value.trim().parse::<i128>().is_ok()
}

fn parse_number(name: &str, value: &str) -> Result<usize, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("{name} '{value}' is not a non-negative integer"))
}

/// Parse the arguments (without the program name). `Err` carries a one-line
/// reason; the caller prints it with [`USAGE`] and exits with status 2.
pub fn parse_args(args: &[String]) -> Result<Command, String> {
    let mut o = Options::default();
    let mut coll_given = false;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        i += 1;
        if !arg.starts_with('-') || arg == "-" {
            if coll_given {
                return Err(format!("unexpected argument '{arg}'"));
            }
            o.coll = Coll::from_name(arg).ok_or_else(|| format!("unknown collective '{arg}'"))?;
            coll_given = true;
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg, None),
        };
        if name == "-h" || name == "--help" {
            return Ok(Command::Help);
        }
        if !OPTIONS_WITH_VALUE.contains(&name) {
            return Err(format!("unknown option '{name}'"));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let v = args
                    .get(i)
                    .ok_or_else(|| format!("{name} needs a value"))?
                    .clone();
                i += 1;
                v
            }
        };
        match name {
            "-b" | "--minbytes" => o.min_bytes = parse_size(&value)?,
            "-e" | "--maxbytes" => o.max_bytes = parse_size(&value)?,
            "-f" | "--stepfactor" => {
                o.step_factor = parse_number(name, &value)?;
                if o.step_factor < 2 {
                    return Err(format!("{name} must be at least 2"));
                }
            }
            "-n" | "--iters" => {
                o.iters = parse_number(name, &value)?;
                if o.iters == 0 {
                    return Err(format!("{name} must be at least 1"));
                }
            }
            "-w" | "--warmup_iters" | "--warmup-iters" => {
                o.warmup_iters = parse_number(name, &value)?
            }
            "-d" | "--datatype" => {
                o.dtypes = if value.eq_ignore_ascii_case("all") {
                    DataType::ALL.to_vec()
                } else {
                    vec![DataType::from_name(&value)
                        .ok_or_else(|| format!("unknown datatype '{value}'"))?]
                }
            }
            "-o" | "--op" => {
                o.ops = if value.eq_ignore_ascii_case("all") {
                    ReduceOp::ALL.to_vec()
                } else {
                    vec![ReduceOp::from_name(&value)
                        .ok_or_else(|| format!("unknown op '{value}'"))?]
                }
            }
            "-c" | "--check" => {
                o.check = match value.trim() {
                    "0" => false,
                    "1" => true,
                    _ => return Err(format!("{name} takes 0 or 1, not '{value}'")),
                }
            }
            "--fresh" => {
                o.fresh = match value.trim() {
                    "0" => false,
                    "1" => true,
                    _ => return Err(format!("{name} takes 0 or 1, not '{value}'")),
                }
            }
            "-r" | "--root" => o.root = parse_number(name, &value)?,
            // nccl-tests' -t is threads per process; a name after -t is
            // still read as the collective (as --coll), which this program
            // took -t for before it had threads. No collective's name is a
            // number, so the value says which is meant.
            "-t" | "--nthreads" if name == "--nthreads" || is_integer(&value) => {
                o.threads = parse_number(name, &value)?;
                if o.threads == 0 {
                    return Err(format!("{name} must be at least 1 (threads per process)"));
                }
            }
            "-t" | "--coll" => {
                if coll_given {
                    return Err("the collective is given twice".into());
                }
                o.coll = Coll::from_name(&value)
                    .ok_or_else(|| format!("unknown collective '{value}'"))?;
                coll_given = true;
            }
            "--ranks" => {
                let n = parse_number(name, &value)?;
                if n == 0 {
                    return Err("--ranks must be at least 1".into());
                }
                o.ranks = Some(n);
            }
            "--csv" => o.csv = Some(PathBuf::from(value)),
            "-R" | "--register" => {
                o.windows = match value.trim() {
                    "0" => false,
                    "2" => true,
                    "1" => {
                        return Err(format!(
                            "{name} 1 (local registration of any buffer) has no CPU counterpart: \
                             peers can only map memory ferroccl allocated; use {name} 2 (windows)"
                        ))
                    }
                    _ => return Err(format!("{name} takes 0 or 2, not '{value}'")),
                }
            }
            "--device" => {
                o.device = Device::from_name(&value)
                    .ok_or_else(|| format!("unknown device '{value}' (host or cuda)"))?
            }
            _ => unreachable!("{name} is in OPTIONS_WITH_VALUE"),
        }
    }
    if o.min_bytes == 0 {
        return Err("--minbytes must be at least 1".into());
    }
    if o.min_bytes > o.max_bytes {
        return Err(format!(
            "--minbytes {} is larger than --maxbytes {}",
            o.min_bytes, o.max_bytes
        ));
    }
    if o.device == Device::Cuda && o.fresh {
        return Err("--device cuda: --fresh 1 touches host buffers; leave it out".into());
    }
    if o.device == Device::Cuda && o.windows {
        return Err("--device cuda: -R 2 windows are host memory; \
                    use -R 0 with device buffers"
            .into());
    }
    Ok(Command::Run(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, String> {
        parse_args(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    fn options(args: &[&str]) -> Options {
        match parse(args) {
            Ok(Command::Run(o)) => o,
            other => panic!("{args:?} -> {other:?}"),
        }
    }

    #[test]
    fn fresh_takes_0_or_1_and_only_host_buffers() {
        assert!(!options(&[]).fresh);
        assert!(options(&["--fresh", "1"]).fresh);
        assert!(!options(&["--fresh=0"]).fresh);
        assert!(parse(&["--fresh", "2"]).is_err());
        assert!(parse(&["--fresh", "1", "--device", "cuda"]).is_err());
    }

    #[test]
    fn register_takes_0_or_2() {
        assert!(!options(&[]).windows);
        assert!(options(&["-R", "2"]).windows);
        assert!(options(&["--register=2"]).windows);
        assert!(!options(&["-R", "0"]).windows);
        let err = parse(&["-R", "1"]).unwrap_err();
        assert!(err.contains("no CPU counterpart"), "{err}");
        assert!(parse(&["-R", "3"]).is_err());
        assert!(parse(&["-R"]).is_err());
    }

    #[test]
    fn device_is_host_unless_cuda_is_asked_for() {
        assert_eq!(options(&[]).device, Device::Host);
        assert_eq!(options(&["--device", "cuda"]).device, Device::Cuda);
        assert_eq!(options(&["--device=CUDA"]).device, Device::Cuda);
        assert_eq!(options(&["--device", "gpu"]).device, Device::Cuda);
        assert_eq!(options(&["--device", "host"]).device, Device::Host);
        assert_eq!(options(&["--device=cpu"]).device, Device::Host);
        for coll in [
            "allreduce",
            "reducescatter",
            "allgather",
            "broadcast",
            "reduce",
        ] {
            let o = options(&[coll, "--device", "cuda", "-c", "1"]);
            assert_eq!((o.device, o.coll.name()), (Device::Cuda, coll));
        }
        assert_eq!(
            parse(&["--device", "tpu"]),
            Err("unknown device 'tpu' (host or cuda)".to_string())
        );
        assert!(parse(&["--device"]).is_err());
    }

    #[test]
    fn device_cuda_refuses_windows() {
        for coll in ["alltoall", "sendrecv"] {
            assert_eq!(
                options(&["--device", "cuda", "-t", coll]).device,
                Device::Cuda
            );
        }
        let err = parse(&["-R", "2", "--device", "cuda"]).unwrap_err();
        assert!(err.contains("-R 2"), "{err}");
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("64M"), Ok(67_108_864));
        assert_eq!(parse_size("2G"), Ok(2_147_483_648));
        assert_eq!(parse_size("3KiB"), Ok(3072));
        assert_eq!(parse_size("512B"), Ok(512));
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let o = options(&[]);
        assert_eq!(o.coll, Coll::AllReduce);
        assert_eq!(
            (o.min_bytes, o.max_bytes, o.step_factor),
            (1024, 64 << 20, 2)
        );
        assert_eq!((o.iters, o.warmup_iters, o.root), (20, 5, 0));
        assert_eq!(o.dtypes, vec![DataType::F32]);
        assert_eq!(o.ops, vec![ReduceOp::Sum]);
        assert!(o.check);
        assert_eq!(o.ranks, None);
        assert_eq!(o.threads, 1);
        assert_eq!(o.csv, None);
        assert_eq!(o.device, Device::Host);
        // 1K, 2K, ..., 64M: 17 rows.
        let sizes = o.sizes();
        assert_eq!(sizes.len(), 17);
        assert_eq!((sizes[0], sizes[16]), (1024, 64 << 20));
    }

    #[test]
    fn flags_in_short_long_and_inline_forms() {
        let o = options(&[
            "reducescatter",
            "-b",
            "8",
            "--maxbytes=1M",
            "-f",
            "4",
            "-n",
            "3",
            "-w",
            "0",
            "-d",
            "bf16",
            "-o",
            "max",
            "-c",
            "0",
            "-r",
            "1",
            "--ranks",
            "4",
            "--csv",
            "out.csv",
        ]);
        assert_eq!(o.coll, Coll::ReduceScatter);
        assert_eq!((o.min_bytes, o.max_bytes, o.step_factor), (8, 1 << 20, 4));
        assert_eq!((o.iters, o.warmup_iters, o.root), (3, 0, 1));
        assert_eq!(o.dtypes, vec![DataType::Bf16]);
        assert_eq!(o.ops, vec![ReduceOp::Max]);
        assert!(!o.check);
        assert_eq!(o.ranks, Some(4));
        assert_eq!(o.csv, Some(PathBuf::from("out.csv")));
        // 8, 32, 128, ..., 512K: 8 * 4^k <= 1M for k = 0..=8.
        assert_eq!(o.sizes().len(), 9);
        assert_eq!(options(&["-t", "all_gather_perf"]).coll, Coll::AllGather);
        assert_eq!(options(&["-d", "all"]).dtypes.len(), 10);
        assert_eq!(options(&["-o", "all"]).ops.len(), 5);
        assert_eq!(options(&["-d", "half"]).dtypes, vec![DataType::F16]);
    }

    #[test]
    fn t_is_threads_per_process_or_a_collective_name() {
        assert_eq!(options(&["-t", "2"]).threads, 2);
        assert_eq!(options(&["--nthreads", "4"]).threads, 4);
        assert_eq!(options(&["--nthreads=3", "--ranks", "2"]).threads, 3);
        let o = options(&["allgather", "-t", "2", "--ranks", "2"]);
        assert_eq!((o.coll, o.threads, o.ranks), (Coll::AllGather, 2, Some(2)));
        // A name after -t is the collective, as --coll NAME; threads stay 1.
        let o = options(&["-t", "reducescatter"]);
        assert_eq!((o.coll, o.threads), (Coll::ReduceScatter, 1));
        let o = options(&["-t", "reduce", "-t", "4"]);
        assert_eq!((o.coll, o.threads), (Coll::Reduce, 4));
        assert_eq!(
            parse(&["-t", "0"]),
            Err("-t must be at least 1 (threads per process)".to_string())
        );
        assert_eq!(
            parse(&["--nthreads", "0"]),
            Err("--nthreads must be at least 1 (threads per process)".to_string())
        );
        for bad in [
            &["-t", "-1"][..],
            &["--nthreads", "two"],
            &["--nthreads"],
            &["-t"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(parse(&["-t", "-1"]).unwrap_err().contains("-t '-1'"));
    }

    #[test]
    fn sizes_stop_at_the_maximum() {
        let o = options(&["-b", "1K", "-e", "5K", "-f", "2"]);
        assert_eq!(o.sizes(), vec![1024, 2048, 4096]);
        let o = options(&["-b", "3", "-e", "3"]);
        assert_eq!(o.sizes(), vec![3]);
    }

    #[test]
    fn bad_flags_are_errors() {
        for bad in [
            &["--bogus"][..],
            &["--bogus", "1"],
            &["-x"],
            &["-b"],
            &["-b", "lots"],
            &["-f", "1"],
            &["-n", "0"],
            &["-c", "2"],
            &["-d", "float128"],
            &["-o", "xor"],
            &["gather"],
            &["allreduce", "allgather"],
            &["allreduce", "-t", "allgather"],
            &["-b", "2M", "-e", "1M"],
            &["-b", "0"],
            &["--ranks", "0"],
            &["--ranks", "two"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(
            parse(&["--bogus"]),
            Err("unknown option '--bogus'".to_string())
        );
        assert_eq!(parse(&["-h"]), Ok(Command::Help));
        assert_eq!(parse(&["-b", "1K", "--help"]), Ok(Command::Help));
    }
}
