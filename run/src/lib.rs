//! `ferroccl-run`: starts the ranks of one node as child processes with the
//! torchrun-style environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `GROUP_RANK`, `MASTER_ADDR`, `MASTER_PORT`,
//! `FERROCCL_LAUNCHER`, `FERROCCL_TOKEN`; and `FERROCCL_HOST_CPUS`, the
//! CPUs it places them on), prefixes their output, forwards
//! SIGINT/SIGTERM/SIGHUP, and stops the whole node when one rank fails.
//!
//! This crate is the launcher only: the `ferroccl-run` binary and, for
//! programs that start their own ranks (such as `ferroccl-perf --ranks`),
//! [`launch`]. It does not depend on the ferroccl library, which ships no
//! launcher code; the ranks read the environment set here with
//! `ferroccl::bootstrap::detect_process_env` (or any torchrun-aware code).
//!
//! Each child runs in a process group of its own (so that a terminal's Ctrl-C
//! reaches it once, through the launcher, and so that signals reach the
//! child's own children too) with its standard input closed. On Linux a rank
//! also gets SIGTERM when the launcher dies, however it dies (the parent
//! death signal, which follows the thread that called [`launch`]).
//!
//! ```no_run
//! let args: Vec<String> = ["-n", "2", "--", "./train"].map(String::from).into();
//! let code = ferroccl_run::launch(&ferroccl_run::parse_args(&args)?)?;
//! std::process::exit(code);
//! # Ok::<(), ferroccl_run::Error>(())
//! ```
#![warn(missing_docs, unreachable_pub)]

mod args;
mod cpus;
mod error;
mod launch;
mod output;
mod rendezvous;
mod signals;

pub use args::{parse_args, wants_help, Bind, LaunchOptions, USAGE};
pub use error::{Error, Result};
pub use launch::{launch, DEFAULT_GRACE};
