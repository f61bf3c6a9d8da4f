//! The ranks' output: each line a rank writes comes out whole, prefixed with
//! `[rank R] `, on the launcher's stream of the same kind. It reads pipes and
//! writes lines; it never touches the processes.

use std::io::{BufRead, BufReader, Read, Write};

/// The longest piece of a child's output written as one prefixed line;
/// longer lines are cut into pieces of this size.
const MAX_LINE: u64 = 64 << 10;

/// Copy a child's output to ours, each line prefixed with `[rank R] ` and
/// written whole under the stream's lock, so lines of different ranks never
/// mix. Output that cannot be written is still drained so the child never
/// blocks on a full pipe.
pub(crate) fn pump_lines(rank: usize, src: impl Read, to_stderr: bool) {
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
