//! The text format of user algorithms (docs/algorithms.md has the
//! grammar): a parser that turns every bad line into an error naming the
//! line, never a panic, and a writer whose output the parser reads back.
//! Strings in, strings out: reading the file is the caller's business.

use super::user::UserStep;
use super::user::{prim_from_name, prim_name, Chunks, Collective, UserAlgorithm, UserError};
use super::{Operand, Prim};
use std::collections::BTreeMap;

/// Most ranks a section may declare: a guard against a typo allocating
/// the step lists of billions of ranks.
pub const MAX_RANKS: usize = 1 << 20;

/// Parse an algorithm from `text`. Every rank count it claims is a
/// `ranks N` section; the checker still has to accept it
/// ([`UserAlgorithm::check`]). Text of several algorithms is refused here
/// (read it with [`parse_all`]).
pub fn parse(text: &str) -> Result<UserAlgorithm, UserError> {
    let mut all = parse_all(text)?;
    if all.len() > 1 {
        let (_, line) = &all[1];
        return Err(UserError::at_line(
            *line,
            format!(
                "a second 'algorithm' line: this text holds {} algorithms where one is expected",
                all.len()
            ),
        ));
    }
    Ok(all.remove(0).0)
}

/// Parse every algorithm of `text`, each with the line it starts on: an
/// `algorithm NAME` line starts each one after the first (the first may
/// leave it out, then its name is `user`), and each declares its
/// collective. What a communicator reads from FERROCCL_ALGO_FILE, which
/// may hold one algorithm per collective. Never an empty list.
pub fn parse_all(text: &str) -> Result<Vec<(UserAlgorithm, usize)>, UserError> {
    let mut done = Vec::new();
    let mut cur = Draft::default();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let err = |what: String| UserError::at_line(line, what);
        let body = raw.split('#').next().unwrap_or("");
        let words: Vec<&str> = body.split_whitespace().collect();
        let Some(&first) = words.first() else {
            continue;
        };
        match first {
            "algorithm" => {
                if words.len() != 2 {
                    return Err(err("expected 'algorithm NAME' (one word)".into()));
                }
                // A name after a header line of its own belongs to it.
                if cur.name.is_some() || !cur.sections.is_empty() {
                    done.push(std::mem::take(&mut cur).finish()?);
                }
                cur.name = Some(words[1].to_string());
                cur.start.get_or_insert(line);
            }
            "collective" => {
                if cur.collective.is_some() {
                    return Err(err(
                        "a second 'collective' line (start another algorithm with an \
                         'algorithm NAME' line)"
                            .into(),
                    ));
                }
                let names: Vec<&str> = Collective::ALL.iter().map(|c| c.name()).collect();
                cur.collective = match words.get(1..) {
                    Some([name]) => Collective::from_name(name),
                    _ => None,
                };
                if cur.collective.is_none() {
                    return Err(err(format!(
                        "expected 'collective C' with C one of {}, got '{}'",
                        names.join(", "),
                        body.trim()
                    )));
                }
                cur.start.get_or_insert(line);
            }
            "ranks" => {
                if words.len() != 2 {
                    return Err(err("expected 'ranks N'".into()));
                }
                let n = number(words[1], "rank count").map_err(err)?;
                if n == 0 || n > MAX_RANKS {
                    return Err(err(format!("rank count {n} is outside 1..={MAX_RANKS}")));
                }
                if cur.sections.contains_key(&n) {
                    return Err(err(format!("a second section for {n} ranks")));
                }
                cur.sections.insert(n, vec![Vec::new(); n]);
                cur.current = Some(n);
                cur.start.get_or_insert(line);
            }
            "rank" => {
                let Some(n) = cur.current else {
                    return Err(err(
                        "a step before any 'ranks N' line says how many ranks it is for".into(),
                    ));
                };
                let (rank, step) = parse_step(&words[1..], line).map_err(err)?;
                if rank >= n {
                    return Err(err(format!(
                        "rank {rank} is not a rank of this section's {n} (0..{})",
                        n - 1
                    )));
                }
                if let Some(ranks) = cur.sections.get_mut(&n) {
                    ranks[rank].push(step);
                }
            }
            other => {
                return Err(err(format!(
                    "unknown line start '{other}' (expected algorithm, collective, ranks or rank)"
                )))
            }
        }
    }
    done.push(cur.finish()?);
    Ok(done)
}

/// An algorithm being read.
#[derive(Default)]
struct Draft {
    name: Option<String>,
    collective: Option<Collective>,
    sections: BTreeMap<usize, Vec<Vec<UserStep>>>,
    current: Option<usize>,
    /// Its first line.
    start: Option<usize>,
}

impl Draft {
    fn finish(self) -> Result<(UserAlgorithm, usize), UserError> {
        let name = self.name.unwrap_or_else(|| "user".into());
        let collective = self.collective.ok_or_else(|| UserError {
            size: None,
            rank: None,
            step: None,
            line: self.start,
            what: format!(
                "algorithm '{name}' has no 'collective' line (say 'collective allreduce', \
                 'collective allgather' or 'collective reduce_scatter')"
            ),
        })?;
        let mut algo = UserAlgorithm::new(name, collective);
        for (n, ranks) in self.sections {
            algo.set_size(n, ranks);
        }
        Ok((algo, self.start.unwrap_or(1)))
    }
}

fn number(word: &str, what: &str) -> Result<usize, String> {
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected a {what} (a number), got '{word}'"));
    }
    word.parse()
        .map_err(|_| format!("{what} '{word}' is too large"))
}

/// The words after `rank`: `R: PRIM [from P] [to P] chunk C of K` or
/// `... chunks A..B of K`, then `[using input|output]`.
fn parse_step(words: &[&str], line: usize) -> Result<(usize, UserStep), String> {
    // "3:" or "3 :".
    let (rank_word, rest) = match words {
        [w, ":", rest @ ..] => (*w, rest),
        [w, rest @ ..] if w.ends_with(':') => (&w[..w.len() - 1], rest),
        _ => return Err("expected 'rank R: PRIMITIVE ...'".into()),
    };
    let rank = number(rank_word, "rank")?;
    let (&prim_word, mut rest) = rest
        .split_first()
        .ok_or("expected a primitive after 'rank R:'")?;
    let prim = prim_from_name(prim_word).ok_or_else(|| {
        format!(
            "unknown primitive '{prim_word}' (one of: send, recv, recv_reduce_send, \
             recv_reduce_copy_send, recv_copy_send, recv_reduce_copy, copy_send, copy, reduce)"
        )
    })?;
    let mut from = None;
    let mut to = None;
    let mut chunks = None;
    let mut local = None;
    while let Some((&key, tail)) = rest.split_first() {
        let value = |k: usize| -> Result<&str, String> {
            tail.get(k)
                .copied()
                .ok_or_else(|| format!("'{key}' needs a value"))
        };
        match key {
            "from" | "to" => {
                let slot = if key == "from" { &mut from } else { &mut to };
                if slot.is_some() {
                    return Err(format!("'{key}' given twice"));
                }
                *slot = Some(number(value(0)?, "peer")?);
                rest = &tail[1..];
            }
            "chunk" | "chunks" => {
                if chunks.is_some() {
                    return Err("chunks given twice".into());
                }
                let which = value(0)?;
                if value(1)? != "of" {
                    return Err(format!("expected '{key} {which} of K'"));
                }
                let of = number(value(2)?, "chunk count")?;
                let (first, end) = if key == "chunk" {
                    let c = number(which, "chunk")?;
                    (c, c.saturating_add(1))
                } else {
                    let (a, b) = which
                        .split_once("..")
                        .ok_or_else(|| format!("expected 'chunks A..B of K', got '{which}'"))?;
                    (number(a, "first chunk")?, number(b, "end chunk")?)
                };
                let c = Chunks::range(first, end, of);
                if let Some(problem) = c.problem() {
                    return Err(problem);
                }
                chunks = Some(c);
                rest = &tail[3..];
            }
            "using" => {
                if local.is_some() {
                    return Err("'using' given twice".into());
                }
                local = Some(match value(0)? {
                    "input" => Operand::Input,
                    "output" => Operand::Output,
                    other => {
                        return Err(format!(
                            "expected 'using input' or 'using output', got '{other}'"
                        ))
                    }
                });
                rest = &tail[1..];
            }
            other => {
                return Err(format!(
                    "unexpected '{other}' (expected from, to, chunk, chunks or using)"
                ))
            }
        }
    }
    let chunks = chunks.ok_or("a step needs 'chunk C of K' or 'chunks A..B of K'")?;
    let step = UserStep {
        prim,
        local: local.unwrap_or(Operand::Input),
        from,
        to,
        chunks,
        line: Some(line),
    };
    if (local.is_some() && matches!(prim, Prim::Recv | Prim::RecvCopySend))
        || step.prim.receives() != from.is_some()
        || step.prim.sends() != to.is_some()
    {
        // The checker words these; refuse them here with the line.
        let need = match (prim.receives(), prim.sends()) {
            (true, true) => "'from P to P'",
            (true, false) => "'from P' and no 'to'",
            (false, true) => "'to P' and no 'from'",
            (false, false) => "no peer",
        };
        if step.prim.receives() != from.is_some() || step.prim.sends() != to.is_some() {
            return Err(format!("{} takes {need}", prim_name(prim)));
        }
        return Err(format!(
            "{} has no local operand ('using' does not apply)",
            prim_name(prim)
        ));
    }
    Ok((rank, step))
}

/// The text of `algo`, which [`parse`] reads back to the same algorithm
/// (but for line numbers).
pub fn write(algo: &UserAlgorithm) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "algorithm {}",
        algo.name.replace(char::is_whitespace, "_")
    );
    let _ = writeln!(out, "collective {}", algo.collective.name());
    for n in algo.sizes() {
        let _ = writeln!(out, "\nranks {n}");
        for r in 0..n {
            for s in algo.steps(n, r).unwrap_or(&[]) {
                let _ = write!(out, "rank {r}: {}", prim_name(s.prim));
                if let Some(p) = s.from {
                    let _ = write!(out, " from {p}");
                }
                if let Some(p) = s.to {
                    let _ = write!(out, " to {p}");
                }
                let _ = write!(out, " {}", s.chunks);
                if s.local == Operand::Output {
                    out.push_str(" using output");
                }
                out.push('\n');
            }
        }
    }
    out
}

/// The text of several algorithms, which [`parse_all`] reads back.
pub fn write_all<'a>(algos: impl IntoIterator<Item = &'a UserAlgorithm>) -> String {
    let texts: Vec<String> = algos.into_iter().map(write).collect();
    texts.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HEAD: &str = "algorithm t\ncollective allreduce\nranks 2\n";

    #[test]
    fn a_small_file_parses() {
        let text = "# two ranks swap halves\nalgorithm swap   # a name\ncollective allreduce\n\n\
                    ranks 2\nrank 0: send to 1 chunk 1 of 2\nrank 0 : recv_reduce_copy from 1 \
                    chunks 0..1 of 2\nrank 1: send to 0 chunk 0 of 2\n\
                    rank 1: recv_reduce_copy from 0 chunk 1 of 2 using input\n";
        let algo = parse(text).unwrap();
        assert_eq!(algo.name, "swap");
        assert_eq!(algo.sizes().collect::<Vec<_>>(), [2]);
        let s = algo.steps(2, 0).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].prim, s[0].to, s[0].line),
            (Prim::Send, Some(1), Some(6))
        );
        assert_eq!(s[1].chunks, Chunks::one(0, 2));
        // It is not a whole allreduce (no gather): the checker says so.
        assert!(algo.check().is_err());
    }

    /// The example of docs/algorithms.md parses and passes the checker.
    #[test]
    fn the_documented_example_is_accepted() {
        let doc = include_str!("../../docs/algorithms.md");
        let start = doc.find("algorithm swap ").expect("the example");
        let end = start + doc[start..].find("```").expect("its end");
        let algo = parse(&doc[start..end]).unwrap();
        assert_eq!(algo.name, "swap");
        assert!(algo.check().unwrap().in_place);
    }

    /// Each bad line after a good header is an error naming line 4 and
    /// saying what is wrong.
    #[test]
    fn bad_lines_are_errors_naming_the_line() {
        let cases = [
            ("rank 0: send to 1", "needs 'chunk"),
            ("rank 0: send to 1 chunk 0 of", "needs a value"),
            ("rank 0: send to 1 chunk 2 of 2", "past the last chunk"),
            ("rank 0: send to 1 chunks 1..1 of 2", "empty"),
            ("rank 0: send to 1 chunks 1-2 of 2", "A..B"),
            ("rank 0: send to 1 chunk 0 of 0", "0 chunks"),
            ("rank 0: send to 1 chunk 0 of 99999999999", "at most"),
            ("rank 0: send to 1 chunk 0 on 2", "of K"),
            ("rank 0: sned to 1 chunk 0 of 2", "unknown primitive"),
            ("rank 0: send from 1 chunk 0 of 2", "send takes"),
            ("rank 0: recv to 1 chunk 0 of 2", "recv takes"),
            (
                "rank 0: recv_reduce_send from 1 chunk 0 of 2",
                "takes 'from P to P'",
            ),
            (
                "rank 0: recv from 1 chunk 0 of 2 using output",
                "no local operand",
            ),
            ("rank 0: send to 1 chunk 0 of 2 using both", "using input"),
            ("rank 0: send to 1 to 1 chunk 0 of 2", "twice"),
            ("rank 0: send to x chunk 0 of 2", "a number"),
            ("rank 0: send to -1 chunk 0 of 2", "a number"),
            (
                "rank 0: send to 99999999999999999999999 chunk 0 of 2",
                "too large",
            ),
            ("rank 2: send to 1 chunk 0 of 2", "not a rank"),
            ("rank 0 send to 1 chunk 0 of 2", "rank R:"),
            ("rank :", "a number"),
            ("rank 0:", "primitive"),
            ("rank 0: send to 1 chunk 0 of 2 extra", "unexpected 'extra'"),
            ("ranks 2", "second section"),
            ("ranks 0", "outside"),
            ("ranks 99999999", "outside"),
            ("ranks", "ranks N"),
            ("collective allgather", "second 'collective'"),
            ("algorithm two words", "one word"),
            ("sendto 1", "unknown line start"),
        ];
        for (line, says) in cases {
            let err = parse(&format!("{HEAD}{line}\n")).unwrap_err();
            assert_eq!(err.line, Some(4), "{line}: {err}");
            let text = err.to_string();
            assert!(text.starts_with("line 4: "), "{text}");
            assert!(text.contains(says), "{line}: '{text}' lacks '{says}'");
        }
        // Header problems.
        let err = parse("ranks 1\nrank 0: copy chunk 0 of 1\n").unwrap_err();
        assert!(err.to_string().contains("collective"), "{err}");
        let err = parse("collective allreduce\nrank 0: copy chunk 0 of 1\n").unwrap_err();
        assert_eq!(err.line, Some(2));
        let err = parse("collective scatter\n").unwrap_err();
        assert_eq!(err.line, Some(1));
    }

    fn any_line() -> impl Strategy<Value = String> {
        let word = prop_oneof![
            Just("rank".to_string()),
            Just("ranks".to_string()),
            Just("0:".to_string()),
            Just(":".to_string()),
            Just("send".to_string()),
            Just("recv_reduce_copy".to_string()),
            Just("copy".to_string()),
            Just("from".to_string()),
            Just("to".to_string()),
            Just("chunk".to_string()),
            Just("chunks".to_string()),
            Just("of".to_string()),
            Just("using".to_string()),
            Just("output".to_string()),
            Just("0..1".to_string()),
            Just("#".to_string()),
            (0usize..5).prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            "[ -~]{0,6}",
        ];
        prop::collection::vec(word, 0..9).prop_map(|w| w.join(" "))
    }

    proptest! {
        /// Any text: an algorithm or an error naming a line in the text
        /// (or the missing header), never a panic; what parses, the checker
        /// takes without panicking either.
        #[test]
        fn the_parser_is_total(lines in prop::collection::vec(any_line(), 0..12)) {
            let text = format!("{HEAD}{}", lines.join("\n"));
            match parse(&text) {
                Ok(algo) => { let _ = algo.check(); }
                Err(e) => {
                    if let Some(line) = e.line {
                        prop_assert!(line >= 1 && line <= text.lines().count());
                    }
                }
            }
        }

        /// Lines of a good file with one character changed: never a panic.
        #[test]
        fn mutated_good_files_never_panic(at in 0usize..400, c in any::<char>()) {
            let good = write(&super::super::user::examples::halving_doubling(4));
            let mut chars: Vec<char> = good.chars().collect();
            let at = at % chars.len();
            chars[at] = c;
            let text: String = chars.into_iter().collect();
            if let Ok(algo) = parse(&text) {
                let _ = algo.check();
            }
        }
    }
}
