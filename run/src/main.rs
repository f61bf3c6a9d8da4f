//! `ferroccl-run`: start the ranks of a ferroccl job on this node, in the
//! way of torchrun. See `ferroccl-run --help` and the [`ferroccl_run`]
//! library; this file only maps its outcome to an exit code.

use ferroccl_run::{launch, parse_args, wants_help, Error, USAGE};

fn main() {
    let args: Vec<String> = match std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect::<Result<_, _>>()
    {
        Ok(a) => a,
        Err(bad) => {
            eprintln!("ferroccl-run: argument {bad:?} is not valid UTF-8");
            std::process::exit(2);
        }
    };
    if wants_help(&args) {
        println!("{USAGE}");
        return;
    }
    let code = match parse_args(&args).and_then(|opts| launch(&opts)) {
        Ok(code) => code,
        Err(Error::InvalidArgument(msg)) => {
            eprintln!("ferroccl-run: {msg}");
            2
        }
        Err(e) => {
            eprintln!("ferroccl-run: {e}");
            1
        }
    };
    std::process::exit(code);
}
