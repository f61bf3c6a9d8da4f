//! The command line of `ferroccl-soak` and the line that replays a run.
//! Owns parsing only: it draws nothing and runs nothing; every option that
//! changes the sequence must appear in `replay` and in `agree` (main.rs).

pub(crate) const USAGE: &str = "\
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

/// The parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) seed: Option<u64>,
    pub(crate) ops: usize,
    pub(crate) max_count: usize,
    pub(crate) splits: bool,
    pub(crate) windows: bool,
    pub(crate) verbose: bool,
}

/// Parse the arguments (without the program name); `Ok(None)` asks for help.
pub(crate) fn parse_options(args: &[String]) -> Result<Option<Options>, String> {
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

/// Settings that change what a run does (which path each call takes), for
/// the replay line.
const REPLAY_ENV: [&str; 14] = [
    "FERROCCL_TRANSPORT",
    "FERROCCL_ALGO",
    "FERROCCL_BUFFSIZE",
    "FERROCCL_STEPS",
    "FERROCCL_NSOCKS_PERPEER",
    "FERROCCL_NT_STORE_BYTES",
    "FERROCCL_CHECKIN",
    "FERROCCL_EARLY_RETURN",
    "FERROCCL_CMA",
    "FERROCCL_CMA_PUSH",
    "FERROCCL_SIMD",
    "FERROCCL_CALIBRATE",
    "FERROCCL_FAULT",
    "FERROCCL_SOAK_SABOTAGE",
];

/// The command line that replays this run.
pub(crate) fn replay(size: usize, seed: u64, opts: &Options) -> String {
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
}
