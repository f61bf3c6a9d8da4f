//! Reading launcher environments: who am I, how many are we, where is the
//! rendezvous.
//!
//! Understands ferroccl-run and torchrun (`RANK`, `WORLD_SIZE`, ...), Open
//! MPI's `mpirun` (`OMPI_COMM_WORLD_*`) and Slurm's `srun` (`SLURM_*`). It
//! only reads variables through the function it is given, so every case can
//! be tested with a map; it opens no socket.
//!
//! # Sources, in order
//!
//! 1. ferroccl-run / torchrun: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//!    `MASTER_PORT` are required; `LOCAL_RANK` (default 0) and
//!    `LOCAL_WORLD_SIZE` are optional. The source is `"ferroccl-run"` when
//!    `FERROCCL_LAUNCHER=ferroccl-run`, else `"torchrun"`.
//! 2. Open MPI: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
//!    `OMPI_COMM_WORLD_LOCAL_RANK` (default 0), `OMPI_COMM_WORLD_LOCAL_SIZE`,
//!    and `MASTER_ADDR` (required; pass it with `mpirun -x MASTER_ADDR`) and
//!    `MASTER_PORT` (default [`DEFAULT_MASTER_PORT`]).
//! 3. Slurm: `SLURM_PROCID`, `SLURM_NTASKS` (or the older `SLURM_NPROCS`),
//!    `SLURM_LOCALID` (default 0). The rendezvous host is `MASTER_ADDR` if set,
//!    else the first host of `SLURM_JOB_NODELIST` (or `SLURM_NODELIST`); the
//!    port is `MASTER_PORT` if set, else [`DEFAULT_MASTER_PORT`].
//!
//! When the variables of two launchers are present and describe a job of the
//! same size, their ranks must agree, else it is an error. When the sizes
//! differ the launchers are nested (ferroccl-run or torchrun started by `srun`
//! once per node is the usual multi-node recipe), and the first source in the
//! order above describes this process.
//!
//! The job token comes from `FERROCCL_TOKEN` (decimal or `0x` hex) if set.

use crate::error::{Error, Result};

/// The rendezvous port used under Open MPI and Slurm when `MASTER_PORT` is
/// not set (the same default as torchrun's).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// What a launcher told this process about the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    /// Global rank of this process.
    pub rank: usize,
    /// Number of ranks in the job.
    pub size: usize,
    /// Rank among the processes of this node (picks the GPU, for instance).
    pub local_rank: usize,
    /// Number of processes on this node, when the launcher says.
    pub local_size: Option<usize>,
    /// Host of the rendezvous (rank 0).
    pub master_addr: String,
    /// Port of the rendezvous.
    pub master_port: u16,
    /// The job token from `FERROCCL_TOKEN`; `None` lets the caller derive one.
    pub token: Option<u64>,
    /// Which launcher: `"ferroccl-run"`, `"torchrun"`, `"mpirun"` or `"srun"`.
    pub source: &'static str,
}

/// Read the launch environment through `get` (which returns a variable's
/// value, or `None` when it is not set).
///
/// Errors name the variables involved: missing partners, values that do not
/// parse, contradictions, or no launcher at all.
pub fn detect(get: &dyn Fn(&str) -> Option<String>) -> Result<LaunchInfo> {
    // Empty values count as unset: shells often export `VAR=` to clear.
    let get = |name: &str| get(name).filter(|v| !v.trim().is_empty());
    let token = parse_token(&get)?;

    let mut found: Vec<LaunchInfo> = Vec::new();
    for source in [from_torchrun, from_open_mpi, from_slurm] {
        if let Some(info) = source(&get)? {
            found.push(info);
        }
    }
    let Some(first) = found.first() else {
        return Err(Error::Env(
            "no launcher environment found: set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT \
             (torchrun/ferroccl-run), or run under mpirun or srun"
                .into(),
        ));
    };
    for other in &found[1..] {
        if other.size != first.size {
            continue; // nested launchers, see the module docs
        }
        if other.rank != first.rank || other.local_rank != first.local_rank {
            return Err(Error::Env(format!(
                "launchers disagree: {} says rank {} (local rank {}) of {}, {} says rank {} \
                 (local rank {}) of {}",
                describe(first.source),
                first.rank,
                first.local_rank,
                first.size,
                describe(other.source),
                other.rank,
                other.local_rank,
                other.size
            )));
        }
    }
    let mut info = first.clone();
    info.token = token;
    Ok(info)
}

/// Read the launch environment of this process.
pub fn detect_process_env() -> Result<LaunchInfo> {
    detect(&|name| std::env::var(name).ok())
}

/// The variables that a source's rank comes from, for error messages.
fn describe(source: &str) -> &'static str {
    match source {
        "mpirun" => "OMPI_COMM_WORLD_RANK/SIZE",
        "srun" => "SLURM_PROCID/NTASKS",
        _ => "RANK/WORLD_SIZE",
    }
}

fn parse_token(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<u64>> {
    let Some(raw) = get("FERROCCL_TOKEN") else {
        return Ok(None);
    };
    let s = raw.trim();
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse::<u64>(),
    };
    parsed.map(Some).map_err(|_| {
        Error::Env(format!(
            "FERROCCL_TOKEN='{raw}' is not a u64 (write it in decimal or as 0x-prefixed hex)"
        ))
    })
}

fn number(name: &str, raw: &str) -> Result<usize> {
    raw.trim()
        .parse::<usize>()
        .map_err(|_| Error::Env(format!("{name}='{raw}' is not a number")))
}

fn port(name: &str, raw: &str) -> Result<u16> {
    match raw.trim().parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(Error::Env(format!(
            "{name}='{raw}' is not a port number (1-65535)"
        ))),
    }
}

/// Read `name` as a number if set.
fn opt_number(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>> {
    get(name).map(|v| number(name, &v)).transpose()
}

/// Read `name`, which must be set because `because` is.
fn required(get: &dyn Fn(&str) -> Option<String>, name: &str, because: &str) -> Result<String> {
    get(name).ok_or_else(|| Error::Env(format!("{because} is set but {name} is missing")))
}

/// Check the numbers that every source gives and build the info.
#[allow(clippy::too_many_arguments)]
fn checked(
    source: &'static str,
    names: [&str; 4],
    rank: usize,
    size: usize,
    local_rank: usize,
    local_size: Option<usize>,
    master_addr: String,
    master_port: u16,
) -> Result<LaunchInfo> {
    let [rank_var, size_var, local_rank_var, local_size_var] = names;
    if size == 0 {
        return Err(Error::Env(format!(
            "{size_var}=0: a job needs at least one rank"
        )));
    }
    if rank >= size {
        return Err(Error::Env(format!(
            "{rank_var}={rank} is not below {size_var}={size}"
        )));
    }
    if let Some(ls) = local_size {
        if ls == 0 {
            return Err(Error::Env(format!(
                "{local_size_var}=0: a node needs at least one rank"
            )));
        }
        if local_rank >= ls {
            return Err(Error::Env(format!(
                "{local_rank_var}={local_rank} is not below {local_size_var}={ls}"
            )));
        }
        if ls > size {
            return Err(Error::Env(format!(
                "{local_size_var}={ls} is larger than {size_var}={size}"
            )));
        }
    }
    Ok(LaunchInfo {
        rank,
        size,
        local_rank,
        local_size,
        master_addr,
        master_port,
        token: None,
        source,
    })
}

/// A launcher's rank and size variables: both (parsed), neither (that
/// launcher did not start this process), or one alone (an error naming the
/// other).
fn rank_and_size(
    get: &dyn Fn(&str) -> Option<String>,
    rank_var: &str,
    size_var: &str,
) -> Result<Option<(usize, usize)>> {
    match (get(rank_var), get(size_var)) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(Error::Env(format!(
            "{rank_var} is set but {size_var} is missing"
        ))),
        (None, Some(_)) => Err(Error::Env(format!(
            "{size_var} is set but {rank_var} is missing"
        ))),
        (Some(r), Some(s)) => Ok(Some((number(rank_var, &r)?, number(size_var, &s)?))),
    }
}

fn from_torchrun(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
    let Some((rank, size)) = rank_and_size(get, "RANK", "WORLD_SIZE")? else {
        return Ok(None);
    };
    let local_rank = opt_number(get, "LOCAL_RANK")?.unwrap_or(0);
    let local_size = opt_number(get, "LOCAL_WORLD_SIZE")?;
    let master_addr = required(get, "MASTER_ADDR", "RANK")?;
    let master_port = port("MASTER_PORT", &required(get, "MASTER_PORT", "RANK")?)?;
    let source = if get("FERROCCL_LAUNCHER").as_deref() == Some("ferroccl-run") {
        "ferroccl-run"
    } else {
        "torchrun"
    };
    checked(
        source,
        ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"],
        rank,
        size,
        local_rank,
        local_size,
        master_addr,
        master_port,
    )
    .map(Some)
}

fn from_open_mpi(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
    const RANK: &str = "OMPI_COMM_WORLD_RANK";
    const SIZE: &str = "OMPI_COMM_WORLD_SIZE";
    let Some((rank, size)) = rank_and_size(get, RANK, SIZE)? else {
        return Ok(None);
    };
    let local_rank = opt_number(get, "OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(0);
    let local_size = opt_number(get, "OMPI_COMM_WORLD_LOCAL_SIZE")?;
    let master_addr = get("MASTER_ADDR").ok_or_else(|| {
        Error::Env(format!(
            "{RANK} is set (mpirun) but MASTER_ADDR is missing: export it to every rank \
             (mpirun -x MASTER_ADDR=host-of-rank-0)"
        ))
    })?;
    let master_port = match get("MASTER_PORT") {
        Some(p) => port("MASTER_PORT", &p)?,
        None => DEFAULT_MASTER_PORT,
    };
    checked(
        "mpirun",
        [
            RANK,
            SIZE,
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ],
        rank,
        size,
        local_rank,
        local_size,
        master_addr,
        master_port,
    )
    .map(Some)
}

fn from_slurm(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>> {
    const RANK: &str = "SLURM_PROCID";
    // SLURM_NPROCS is the older name of SLURM_NTASKS; a missing size is
    // reported by the current name.
    let size_var = if get("SLURM_NTASKS").is_none() && get("SLURM_NPROCS").is_some() {
        "SLURM_NPROCS"
    } else {
        "SLURM_NTASKS"
    };
    let Some((rank, size)) = rank_and_size(get, RANK, size_var)? else {
        return Ok(None);
    };
    let local_rank = opt_number(get, "SLURM_LOCALID")?.unwrap_or(0);
    let master_addr = match get("MASTER_ADDR") {
        Some(a) => a,
        None => {
            let (var, list) = match get("SLURM_JOB_NODELIST") {
                Some(l) => ("SLURM_JOB_NODELIST", l),
                None => (
                    "SLURM_NODELIST",
                    get("SLURM_NODELIST").ok_or_else(|| {
                        Error::Env(format!(
                            "{RANK} is set (srun) but neither MASTER_ADDR nor SLURM_JOB_NODELIST \
                             is, so the rendezvous host is unknown"
                        ))
                    })?,
                ),
            };
            first_host(&list)
                .ok_or_else(|| Error::Env(format!("{var}='{list}' is not a Slurm host list")))?
        }
    };
    let master_port = match get("MASTER_PORT") {
        Some(p) => port("MASTER_PORT", &p)?,
        None => DEFAULT_MASTER_PORT,
    };
    checked(
        "srun",
        [RANK, size_var, "SLURM_LOCALID", ""],
        rank,
        size,
        local_rank,
        None,
        master_addr,
        master_port,
    )
    .map(Some)
}

/// The first host of a Slurm host list in its compressed syntax:
/// `"node[01-04,07],gpu5"` gives `"node01"`, `"a-[3-5]"` gives `"a-3"`,
/// `"rack[2-3]-n[1-4]"` gives `"rack2-n1"`, `"host1,host2"` gives `"host1"`.
///
/// Zero padding is kept as written. Returns `None` for an empty list or
/// unbalanced brackets.
pub fn first_host(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break, // end of the first item (outside brackets)
            '[' => {
                // Take the first number of the first range; skip to ']'.
                let mut taking = true;
                let mut closed = false;
                let mut took_any = false;
                for d in chars.by_ref() {
                    if d == ']' {
                        closed = true;
                        break;
                    }
                    if d == ',' || d == '-' {
                        taking = false;
                    } else if d == '[' {
                        return None;
                    } else if taking {
                        host.push(d);
                        took_any = true;
                    }
                }
                if !closed || !took_any {
                    return None;
                }
            }
            ']' => return None,
            c if c.is_whitespace() => return None,
            c => host.push(c),
        }
    }
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn run(pairs: &[(&str, &str)]) -> Result<LaunchInfo> {
        let map = env(pairs);
        detect(&|k| map.get(k).cloned())
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        match run(pairs) {
            Ok(info) => panic!("expected an error, got {info:?}"),
            Err(Error::Env(msg)) => msg,
            Err(other) => panic!("expected Error::Env, got {other:?}"),
        }
    }

    const TORCHRUN: &[(&str, &str)] = &[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "1234"),
    ];

    #[test]
    fn torchrun_full() {
        let info = run(TORCHRUN).unwrap();
        assert_eq!(
            info,
            LaunchInfo {
                rank: 5,
                size: 8,
                local_rank: 1,
                local_size: Some(4),
                master_addr: "10.0.0.1".into(),
                master_port: 1234,
                token: None,
                source: "torchrun",
            }
        );
    }

    #[test]
    fn ferroccl_run_source_and_token() {
        let mut pairs = TORCHRUN.to_vec();
        pairs.push(("FERROCCL_LAUNCHER", "ferroccl-run"));
        pairs.push(("FERROCCL_TOKEN", "0xDEADbeef"));
        let info = run(&pairs).unwrap();
        assert_eq!(info.source, "ferroccl-run");
        assert_eq!(info.token, Some(0xdead_beef));
        pairs.pop();
        pairs.push(("FERROCCL_TOKEN", "18446744073709551615"));
        assert_eq!(run(&pairs).unwrap().token, Some(u64::MAX));
    }

    #[test]
    fn bad_token() {
        let mut pairs = TORCHRUN.to_vec();
        pairs.push(("FERROCCL_TOKEN", "0xzz"));
        let msg = err(&pairs);
        assert!(msg.contains("FERROCCL_TOKEN='0xzz'"), "{msg}");
    }

    #[test]
    fn torchrun_minimal_defaults_local_rank() {
        let info = run(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "9"),
        ])
        .unwrap();
        assert_eq!((info.local_rank, info.local_size), (0, None));
    }

    #[test]
    fn partial_sets_name_the_missing_variable() {
        assert_eq!(
            err(&[("RANK", "1")]),
            "RANK is set but WORLD_SIZE is missing"
        );
        assert_eq!(
            err(&[("WORLD_SIZE", "1")]),
            "WORLD_SIZE is set but RANK is missing"
        );
        let msg = err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "5")]);
        assert_eq!(msg, "RANK is set but MASTER_ADDR is missing");
        let msg = err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]);
        assert_eq!(msg, "RANK is set but MASTER_PORT is missing");
        assert_eq!(
            err(&[("OMPI_COMM_WORLD_RANK", "1")]),
            "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is missing"
        );
        assert_eq!(
            err(&[("SLURM_PROCID", "1")]),
            "SLURM_PROCID is set but SLURM_NTASKS is missing"
        );
    }

    #[test]
    fn unparsable_values() {
        let mut pairs = TORCHRUN.to_vec();
        pairs[0] = ("RANK", "x");
        assert_eq!(err(&pairs), "RANK='x' is not a number");
        let mut pairs = TORCHRUN.to_vec();
        pairs[5] = ("MASTER_PORT", "70000");
        assert!(err(&pairs).contains("MASTER_PORT='70000'"));
        let mut pairs = TORCHRUN.to_vec();
        pairs[2] = ("LOCAL_RANK", "-1");
        assert_eq!(err(&pairs), "LOCAL_RANK='-1' is not a number");
    }

    #[test]
    fn rank_not_below_size() {
        let mut pairs = TORCHRUN.to_vec();
        pairs[0] = ("RANK", "8");
        assert_eq!(err(&pairs), "RANK=8 is not below WORLD_SIZE=8");
        let mut pairs = TORCHRUN.to_vec();
        pairs[1] = ("WORLD_SIZE", "0");
        assert!(err(&pairs).starts_with("WORLD_SIZE=0"));
    }

    #[test]
    fn local_rank_not_below_local_size() {
        let mut pairs = TORCHRUN.to_vec();
        pairs[2] = ("LOCAL_RANK", "4");
        assert_eq!(err(&pairs), "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4");
        let msg = err(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("MASTER_ADDR", "h"),
        ]);
        assert_eq!(
            msg,
            "OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2"
        );
    }

    #[test]
    fn open_mpi() {
        let info = run(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("MASTER_ADDR", "m"),
            ("FERROCCL_TOKEN", "77"),
        ])
        .unwrap();
        assert_eq!(
            info,
            LaunchInfo {
                rank: 3,
                size: 4,
                local_rank: 1,
                local_size: Some(2),
                master_addr: "m".into(),
                master_port: DEFAULT_MASTER_PORT,
                token: Some(77),
                source: "mpirun",
            }
        );
        let msg = err(&[("OMPI_COMM_WORLD_RANK", "3"), ("OMPI_COMM_WORLD_SIZE", "4")]);
        assert!(msg.contains("MASTER_ADDR is missing"), "{msg}");
    }

    #[test]
    fn slurm_uses_nodelist_and_default_port() {
        let info = run(&[
            ("SLURM_PROCID", "6"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_JOB_NODELIST", "node[01-04,07],gpu5"),
        ])
        .unwrap();
        assert_eq!(
            info,
            LaunchInfo {
                rank: 6,
                size: 8,
                local_rank: 2,
                local_size: None,
                master_addr: "node01".into(),
                master_port: DEFAULT_MASTER_PORT,
                token: None,
                source: "srun",
            }
        );
    }

    #[test]
    fn slurm_prefers_master_variables() {
        let info = run(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "a-[3-5]"),
            ("MASTER_ADDR", "head"),
            ("MASTER_PORT", "4000"),
        ])
        .unwrap();
        assert_eq!(
            (info.master_addr.as_str(), info.master_port),
            ("head", 4000)
        );
    }

    #[test]
    fn slurm_without_any_host() {
        let msg = err(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")]);
        assert!(msg.contains("SLURM_JOB_NODELIST"), "{msg}");
        let msg = err(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n[1-2"),
        ]);
        assert!(msg.contains("SLURM_JOB_NODELIST='n[1-2'"), "{msg}");
    }

    #[test]
    fn first_host_of_compressed_lists() {
        assert_eq!(first_host("node[01-04,07],gpu5").as_deref(), Some("node01"));
        assert_eq!(first_host("a-[3-5]").as_deref(), Some("a-3"));
        assert_eq!(first_host("host1,host2").as_deref(), Some("host1"));
        assert_eq!(first_host("single").as_deref(), Some("single"));
        assert_eq!(first_host("n[7,2-3]").as_deref(), Some("n7"));
        assert_eq!(first_host("rack[2-3]-n[1-4]").as_deref(), Some("rack2-n1"));
        assert_eq!(first_host("[5-6]x,y").as_deref(), Some("5x"));
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("n[1-2"), None);
        assert_eq!(first_host("n]"), None);
        assert_eq!(first_host("n[]"), None);
    }

    #[test]
    fn launchers_that_disagree() {
        let mut pairs = TORCHRUN.to_vec();
        pairs[0] = ("RANK", "1");
        pairs.push(("OMPI_COMM_WORLD_RANK", "2"));
        pairs.push(("OMPI_COMM_WORLD_SIZE", "8"));
        pairs.push(("OMPI_COMM_WORLD_LOCAL_RANK", "1"));
        let msg = err(&pairs);
        assert!(msg.contains("launchers disagree"), "{msg}");
        assert!(msg.contains("rank 1"), "{msg}");
        assert!(msg.contains("rank 2"), "{msg}");
    }

    #[test]
    fn launchers_that_agree() {
        let mut pairs = TORCHRUN.to_vec();
        pairs.push(("SLURM_PROCID", "5"));
        pairs.push(("SLURM_NTASKS", "8"));
        pairs.push(("SLURM_LOCALID", "1"));
        pairs.push(("SLURM_JOB_NODELIST", "x"));
        assert_eq!(run(&pairs).unwrap().source, "torchrun");
    }

    #[test]
    fn nested_launchers_take_the_inner_one() {
        // ferroccl-run started by srun once per node: srun's numbers describe
        // the node, RANK/WORLD_SIZE describe this process.
        let mut pairs = TORCHRUN.to_vec();
        pairs.push(("FERROCCL_LAUNCHER", "ferroccl-run"));
        pairs.push(("SLURM_PROCID", "1"));
        pairs.push(("SLURM_NTASKS", "2"));
        pairs.push(("SLURM_JOB_NODELIST", "n[1-2]"));
        let info = run(&pairs).unwrap();
        assert_eq!((info.rank, info.size, info.source), (5, 8, "ferroccl-run"));
    }

    #[test]
    fn nothing_found() {
        assert_eq!(
            err(&[("HOME", "/root"), ("MASTER_ADDR", "x")]),
            "no launcher environment found: set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT \
             (torchrun/ferroccl-run), or run under mpirun or srun"
        );
    }

    #[test]
    fn empty_values_count_as_unset() {
        let msg = err(&[("RANK", ""), ("WORLD_SIZE", "")]);
        assert!(msg.starts_with("no launcher environment found"), "{msg}");
    }
}
