//! The command line of `ferroccl-run`: its usage text, the options it
//! takes and what they parse into. It owns parsing only; nothing here starts
//! a process or reads the environment.

use crate::error::{Error, Result};
use std::ffi::OsString;

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

/// The usage text of `ferroccl-run`.
pub const USAGE: &str = "\
usage: ferroccl-run -n N [options] [--] PROGRAM [ARGS...]

Starts N copies of PROGRAM on this node with RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, FERROCCL_LAUNCHER and
FERROCCL_TOKEN set (as torchrun does), and FERROCCL_HOST_CPUS (the CPUs it
places the ranks on, unless set already). When a rank fails, the others have
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
}
