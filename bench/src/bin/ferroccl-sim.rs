//! `ferroccl-sim`: predicts the time and busbw of ferroccl's collectives
//! on a modelled cluster by running the library's own schedules through a
//! timing simulation (docs/sim.md). Prints nccl-tests columns, as
//! ferroccl-perf does, one table per rank count and algorithm.

use ferroccl::algo::Algorithm;
use ferroccl::DataType;
use ferroccl_bench::coll::{bandwidth, Coll};
use ferroccl_bench::options::parse_size;
use ferroccl_bench::sim::engine::simulate;
use ferroccl_bench::sim::engine::DEFAULT_MAX_RUNS;
use ferroccl_bench::sim::model::{Cluster, PRESETS};
use ferroccl_bench::sim::schedules::{algorithms, job_within, user_job};
use ferroccl_bench::sim::svg::{plot, Series};
use std::io::Write;
use std::time::Instant;

const USAGE: &str = "\
usage: ferroccl-sim [COLLECTIVE] [options]

Runs ferroccl's own schedules (built by the library's code, as a call would
build them) on a model of a cluster and prints the predicted time, algbw and
busbw per size in nccl-tests columns, for each rank count and algorithm.

COLLECTIVE: allreduce (default), reducescatter, allgather, broadcast, reduce
            (also --coll NAME or --op NAME)

options:
      --preset NAME         a shipped model: h100, a100, cpu, v100, summit
                            (default h100)
      --model FILE          a model file (key = value; docs/sim.md)
      --ranks LIST          rank counts, comma separated (default 8)
  -b, --minbytes SIZE       smallest size (default 8); suffixes K, M, G
  -e, --maxbytes SIZE       largest size (default 64M)
  -f, --stepfactor F        multiply the size by F each row (default 2)
  -d, --datatype T          element type (default float)
  -a, --algo LIST           algorithms, comma separated, or all (default all)
      --algo-file FILE      also time the user algorithm in FILE for the
                            collective (allreduce, allgather, reducescatter;
                            text format of docs/algorithms.md), checked for
                            each rank count first
      --max-direct-ranks N  simulate one_shot and two_shot up to N ranks
                            (default 512: their n^2 connections)
      --max-runs N          refuse a job whose schedules take more than N runs
                            of steps (default 30000000, about 1.7 GB)
      --csv FILE            also write one CSV row per result
      --svg-sizes FILE      draw busbw against size (one line per ranks x algo)
      --svg-ranks FILE      draw busbw against ranks at the size of --at
      --at SIZE             size for --svg-ranks (default the largest)
      --depth N             slices in flight in a ring pass (default: the
                            library's rule for the model's slots, at most
                            4; 1: each slice's pass after the previous one)
      --print-model         print the model's constants and exit
  -h, --help                print this help";

struct Args {
    coll: Coll,
    cluster: Cluster,
    ranks: Vec<usize>,
    min: usize,
    max: usize,
    factor: usize,
    dtype: DataType,
    algos: Option<Vec<Algorithm>>,
    algo_file: Option<String>,
    max_direct: usize,
    max_runs: usize,
    csv: Option<String>,
    svg_sizes: Option<String>,
    svg_ranks: Option<String>,
    at: Option<usize>,
    print_model: bool,
    depth: usize,
}

fn parse(argv: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args {
        coll: Coll::AllReduce,
        cluster: Cluster::preset("h100")?,
        ranks: vec![8],
        min: 8,
        max: 64 << 20,
        factor: 2,
        dtype: DataType::F32,
        algos: None,
        algo_file: None,
        max_direct: 512,
        max_runs: DEFAULT_MAX_RUNS,
        csv: None,
        svg_sizes: None,
        svg_ranks: None,
        at: None,
        print_model: false,
        depth: 0,
    };
    let mut i = 0;
    while i < argv.len() {
        let flag = argv[i].as_str();
        let mut value = || {
            i += 1;
            argv.get(i)
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag {
            "-h" | "--help" => return Ok(None),
            "--preset" => a.cluster = Cluster::preset(&value()?)?,
            "--model" => {
                let path = value()?;
                let text =
                    std::fs::read_to_string(&path).map_err(|e| format!("--model {path}: {e}"))?;
                a.cluster = Cluster::parse(&text).map_err(|e| format!("{path}: {e}"))?;
            }
            "--ranks" => {
                a.ranks = value()?
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .map_err(|_| format!("--ranks: '{s}'"))
                    })
                    .collect::<Result<_, _>>()?;
                if a.ranks.contains(&0) {
                    return Err("--ranks: at least 1".into());
                }
            }
            "-b" | "--minbytes" => a.min = parse_size(&value()?)?,
            "-e" | "--maxbytes" => a.max = parse_size(&value()?)?,
            "-f" | "--stepfactor" => {
                a.factor = value()?.parse().map_err(|_| "-f: a number".to_string())?;
                if a.factor < 2 {
                    return Err("-f: at least 2".into());
                }
            }
            "-d" | "--datatype" => {
                let v = value()?;
                a.dtype =
                    DataType::from_name(&v).ok_or_else(|| format!("-d: unknown type '{v}'"))?;
            }
            "-a" | "--algo" => {
                let v = value()?;
                a.algos = if v == "all" {
                    None
                } else {
                    Some(
                        v.split(',')
                            .map(|s| {
                                Algorithm::from_name(s).ok_or_else(|| format!("--algo: '{s}'"))
                            })
                            .collect::<Result<_, _>>()?,
                    )
                };
            }
            "--max-direct-ranks" => {
                a.max_direct = value()?
                    .parse()
                    .map_err(|_| "--max-direct-ranks: a number".to_string())?
            }
            "--max-runs" => {
                a.max_runs = value()?
                    .parse()
                    .map_err(|_| "--max-runs: a number".to_string())?
            }
            "--csv" => a.csv = Some(value()?),
            "--svg-sizes" => a.svg_sizes = Some(value()?),
            "--svg-ranks" => a.svg_ranks = Some(value()?),
            "--at" => a.at = Some(parse_size(&value()?)?),
            "--print-model" => a.print_model = true,
            "--depth" => {
                a.depth = value()?
                    .parse()
                    .ok()
                    .filter(|&d: &usize| d >= 1)
                    .ok_or_else(|| "--depth: a number, at least 1".to_string())?
            }
            "--algo-file" => a.algo_file = Some(value()?),
            "--coll" | "--op" => {
                let v = value()?;
                a.coll = Coll::from_name(&v).ok_or_else(|| format!("unknown collective '{v}'"))?;
            }
            name if !name.starts_with('-') => {
                a.coll =
                    Coll::from_name(name).ok_or_else(|| format!("unknown collective '{name}'"))?;
            }
            other => return Err(format!("unknown option '{other}'")),
        }
        i += 1;
    }
    if algorithms(a.coll).is_empty() {
        return Err(format!("{} has no schedule the simulator runs", a.coll));
    }
    if a.algo_file.is_some()
        && !matches!(
            a.coll,
            Coll::AllReduce | Coll::AllGather | Coll::ReduceScatter
        )
    {
        return Err(
            "--algo-file: user algorithms implement allreduce, allgather and reducescatter".into(),
        );
    }
    if a.min > a.max {
        return Err("-b is above -e".into());
    }
    // After every flag: --preset and --model replace the cluster.
    a.cluster.depth = a.depth;
    Ok(Some(a))
}

fn sizes(a: &Args) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = a.min.max(1);
    while s <= a.max {
        out.push(s);
        match s.checked_mul(a.factor) {
            Some(next) => s = next,
            None => break,
        }
    }
    out
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            let names: Vec<&str> = PRESETS.iter().map(|p| p.0).collect();
            println!("\npresets: {}", names.join(", "));
            return;
        }
        Err(e) => {
            eprintln!("ferroccl-sim: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("ferroccl-sim: {e}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> Result<(), String> {
    println!("# model: {}", a.cluster);
    if a.print_model {
        return Ok(());
    }
    let elem = a.dtype.size();
    let algos: Vec<Algorithm> = match &a.algos {
        Some(list) => list
            .iter()
            .copied()
            .filter(|x| algorithms(a.coll).contains(x))
            .collect(),
        None => algorithms(a.coll).to_vec(),
    };
    let mut csv = match &a.csv {
        Some(path) => {
            let mut f = std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?;
            writeln!(
                f,
                "coll,algo,ranks,bytes,count,type,time_us,algbw_gbs,busbw_gbs,steps,wall_s"
            )
            .map_err(|e| e.to_string())?;
            Some(f)
        }
        None => None,
    };
    let op = if a.coll.reduces() { "sum" } else { "none" };
    let at = a.at.unwrap_or(a.max);
    let mut by_size: Vec<Series> = Vec::new();
    let mut by_ranks: Vec<(Algorithm, Vec<(f64, f64)>)> =
        algos.iter().map(|&x| (x, Vec::new())).collect();
    for &n in &a.ranks {
        for &algo in &algos {
            if matches!(algo, Algorithm::OneShot | Algorithm::TwoShot) && n > a.max_direct {
                println!(
                    "# {n} ranks, {algo}: left out (above --max-direct-ranks {})\n",
                    a.max_direct
                );
                continue;
            }
            println!(
                "# {} ranks ({} hosts), {}, algorithm {}",
                n,
                n.div_ceil(a.cluster.ranks_per_host),
                a.coll,
                algo
            );
            println!(
                "#{:>11} {:>12} {:>8} {:>6} {:>6} {:>12} {:>9} {:>9} {:>12} {:>8}",
                "size",
                "count",
                "type",
                "redop",
                "root",
                "time(us)",
                "algbw",
                "busbw",
                "steps",
                "wall(s)"
            );
            let mut series = Vec::new();
            let started_all = Instant::now();
            for bytes in sizes(a) {
                let block = a.coll.block_count(bytes, elem, n);
                let total = a.coll.total_count(block, n);
                let size = total * elem;
                let started = Instant::now();
                let j = match job_within(&a.cluster, a.coll, algo, (n, block, elem), a.max_runs) {
                    Some(Ok(j)) => j,
                    Some(Err(e)) => {
                        println!("# {size} bytes: left out: {e}");
                        continue;
                    }
                    None => continue,
                };
                let out = simulate(&a.cluster, &j)
                    .map_err(|e| format!("{n} ranks, {algo}, {size} bytes: {e}"))?;
                let wall = started.elapsed().as_secs_f64();
                let (algbw, busbw) = bandwidth(a.coll, n, size, out.time_us * 1e-6);
                let root = if a.coll.rooted() { "0" } else { "-1" };
                println!(
                    "{:>12} {:>12} {:>8} {:>6} {:>6} {:>12.2} {:>9.2} {:>9.2} {:>12} {:>8.2}",
                    size,
                    total,
                    a.dtype.name(),
                    op,
                    root,
                    out.time_us,
                    algbw,
                    busbw,
                    out.steps,
                    wall
                );
                let _ = std::io::stdout().flush();
                if let Some(f) = csv.as_mut() {
                    writeln!(
                        f,
                        "{},{},{},{},{},{},{:.3},{:.4},{:.4},{},{:.3}",
                        a.coll,
                        algo,
                        n,
                        size,
                        total,
                        a.dtype.name(),
                        out.time_us,
                        algbw,
                        busbw,
                        out.steps,
                        wall
                    )
                    .map_err(|e| e.to_string())?;
                }
                series.push((size as f64, busbw));
                if bytes == at {
                    if let Some(s) = by_ranks.iter_mut().find(|s| s.0 == algo) {
                        s.1.push((n as f64, busbw));
                    }
                }
            }
            println!(
                "# {} ranks, {}: simulated in {:.2} s\n",
                n,
                algo,
                started_all.elapsed().as_secs_f64()
            );
            by_size.push((format!("{algo}, {n} ranks"), series));
        }
    }
    if let Some(path) = &a.algo_file {
        run_user(a, path)?;
    }
    let title = |what: &str| format!("ferroccl-sim {}: {} ({what})", a.coll, a.cluster.name);
    if let Some(path) = &a.svg_sizes {
        std::fs::write(
            path,
            plot(&title("predicted"), "message size (bytes)", true, &by_size),
        )
        .map_err(|e| format!("{path}: {e}"))?;
    }
    if let Some(path) = &a.svg_ranks {
        let series: Vec<Series> = by_ranks
            .into_iter()
            .map(|(algo, p)| (algo.to_string(), p))
            .collect();
        let what = format!("predicted at {} bytes", at);
        std::fs::write(path, plot(&title(&what), "ranks", false, &series))
            .map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

/// Time the user algorithm of `path` for every rank count (after the
/// checker accepts it there), in the same columns.
fn run_user(a: &Args, path: &str) -> Result<(), String> {
    use ferroccl::algo::text;
    use ferroccl::algo::user::{Checked, Collective};
    let source = std::fs::read_to_string(path).map_err(|e| format!("--algo-file {path}: {e}"))?;
    let all = text::parse_all(&source).map_err(|e| format!("--algo-file {path}: {e}"))?;
    let want = match a.coll {
        Coll::AllGather => Collective::AllGather,
        Coll::ReduceScatter => Collective::ReduceScatter,
        _ => Collective::AllReduce,
    };
    let (algo, _) = all
        .into_iter()
        .find(|(algo, _)| algo.collective == want)
        .ok_or_else(|| format!("--algo-file {path}: no {want} algorithm in the file"))?;
    let elem = a.dtype.size();
    for &n in &a.ranks {
        let user = Checked::new(&algo, n, path.to_string())
            .map_err(|e| format!("--algo-file {path}: refused: {e}"))?;
        println!(
            "# {} ranks ({} hosts), {}, user algorithm {} ({path})",
            n,
            n.div_ceil(a.cluster.ranks_per_host),
            a.coll,
            user.name()
        );
        println!(
            "#{:>11} {:>12} {:>8} {:>6} {:>6} {:>12} {:>9} {:>9} {:>12}",
            "size", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "steps"
        );
        for bytes in sizes(a) {
            let count = a.coll.block_count(bytes, elem, n);
            let total = a.coll.total_count(count, n);
            let size = total * elem;
            let job = match user_job(&a.cluster, &user, (n, count, elem), a.max_runs) {
                Ok(j) => j,
                Err(e) => {
                    println!("# {size} bytes: left out: {e}");
                    continue;
                }
            };
            let out = simulate(&a.cluster, &job)
                .map_err(|e| format!("{n} ranks, {}, {size} bytes: {e}", user.name()))?;
            let (algbw, busbw) = bandwidth(a.coll, n, size, out.time_us * 1e-6);
            println!(
                "{:>12} {:>12} {:>8} {:>6} {:>6} {:>12.2} {:>9.2} {:>9.2} {:>12}",
                size,
                total,
                a.dtype.name(),
                if a.coll.reduces() { "sum" } else { "none" },
                "-1",
                out.time_us,
                algbw,
                busbw,
                out.steps
            );
        }
        println!();
    }
    Ok(())
}
