//! What the command-line tools (`ferroccl-check`, `ferroccl-soak`) share:
//! whole-line output, reading their options, and joining the job. Each
//! binary includes it with `mod tool;` (a folder with no `main.rs` is not a
//! binary of its own).

use ferroccl::Communicator;
use std::io::Write;

/// Print a whole line to stdout at once (ranks' lines must not interleave
/// inside the launcher's prefixing).
pub fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Print a whole line to stderr at once.
pub fn say_err(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
    let _ = err.flush();
}

/// The options `parse` reads from the command line; `--help` (`Ok(None)`)
/// prints `usage` and exits 0, a bad option prints it and exits 2.
pub fn options_or_exit<T>(
    tool: &str,
    usage: &str,
    parse: impl FnOnce(&[String]) -> Result<Option<T>, String>,
) -> T {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse(&args) {
        Ok(Some(options)) => options,
        Ok(None) => {
            say(usage);
            std::process::exit(0);
        }
        Err(msg) => {
            say_err(&format!("{tool}: {msg}\n\n{usage}"));
            std::process::exit(2);
        }
    }
}

/// Join the job the launcher started, or print why not (as `rank R:` when
/// the environment names the rank) and exit 1.
pub fn join_or_exit(tool: &str) -> Communicator {
    match Communicator::from_env() {
        Ok(comm) => comm,
        Err(e) => {
            let who = match ferroccl::bootstrap::detect_process_env() {
                Ok(info) => format!("rank {}", info.rank),
                Err(_) => tool.to_string(),
            };
            say_err(&format!("{who}: {e}"));
            std::process::exit(1);
        }
    }
}
