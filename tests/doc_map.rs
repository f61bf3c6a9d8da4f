//! The map stays true: every path of the tree that docs/architecture.md,
//! the README, docs/README.md and docs/status.md name must exist, so a
//! file moved or removed without its doc fails here rather than leaving a
//! newcomer a map of a tree that is gone.
//!
//! Every Markdown link between them (`[text](target#anchor)`) must land:
//! the file exists and, for a `.md` target, a heading makes the anchor.
//!
//! A path is a run of `[A-Za-z0-9_.-/]` that starts with one of the tree's
//! top-level folders (`src/`, `docs/`, `transports/`, ...), wherever it
//! stands in the text (backticks, parentheses, prose). A run followed by
//! `*`, `<` or `{` is a pattern, not a path, and is left out. A file
//! `a/b.rs` is also found as the module directory `a/b/` (`a/b/mod.rs`),
//! so that splitting a file into a directory keeps the map true.

use std::collections::BTreeSet;
use std::path::Path;

/// The documents whose paths are checked, from the repository root.
const DOCS: [&str; 4] = [
    "docs/architecture.md",
    "README.md",
    "docs/README.md",
    "docs/status.md",
];

/// The documents whose links are checked: those above and the one-screen
/// performance page, whose rows link into the logs.
const LINKED: [&str; 5] = [
    "docs/architecture.md",
    "README.md",
    "docs/README.md",
    "docs/status.md",
    "docs/performance.md",
];

/// The top-level folders a path may start with.
const ROOTS: [&str; 13] = [
    "src/",
    "docs/",
    "transports/",
    "cuda/",
    "nccl/",
    "python/",
    "run/",
    "bench/",
    "tests/",
    "examples/",
    "integrations/",
    "fuzz/",
    ".ci/",
];

fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/')
}

/// Every path `text` names, trailing sentence punctuation removed.
fn paths_in(text: &str) -> BTreeSet<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut found = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        if !path_char(chars[i]) || (i > 0 && path_char(chars[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && path_char(chars[i]) {
            i += 1;
        }
        if matches!(chars.get(i), Some('*' | '<' | '{')) {
            continue;
        }
        // A path never starts right after a `/` or a `.` of something
        // longer (`../shared/DESIGN.md` is outside the tree).
        if start > 0 && matches!(chars[start - 1], '/' | '.') {
            continue;
        }
        let word: String = chars[start..i].iter().collect();
        let word = word.trim_end_matches(['.', ',']).to_string();
        if ROOTS.iter().any(|r| word.starts_with(r)) {
            found.insert(word);
        }
    }
    found
}

/// Whether `path` exists under `root`, a file `x.rs` also as the module
/// directory `x/`.
fn exists(root: &Path, path: &str) -> bool {
    let at = root.join(path.trim_end_matches('/'));
    if at.exists() {
        return true;
    }
    path.strip_suffix(".rs").is_some_and(|module| {
        root.join(module).join("mod.rs").exists() || root.join(module).is_dir()
    })
}

#[test]
fn every_path_the_docs_name_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in DOCS {
        let text = std::fs::read_to_string(root.join(doc))
            .unwrap_or_else(|e| panic!("{doc} cannot be read: {e}"));
        for path in paths_in(&text) {
            checked += 1;
            if !exists(root, &path) {
                missing.push(format!("{doc}: {path}"));
            }
        }
    }
    // The map names well over a hundred paths: a scanner that finds none
    // would pass vacuously.
    assert!(checked > 100, "only {checked} paths found in {DOCS:?}");
    assert!(
        missing.is_empty(),
        "paths named in the docs that do not exist:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_scanner_finds_paths_and_leaves_patterns_out() {
    let text = "see `src/comm/mod.rs`, (docs/ib.md). src/exec/program* and \
                bench/sim/veth-*.conf and ../shared/DESIGN.md, tests/ \
                and transports/core/src/conformance/.";
    let found: Vec<String> = paths_in(text).into_iter().collect();
    assert_eq!(
        found,
        [
            "docs/ib.md",
            "src/comm/mod.rs",
            "tests/",
            "transports/core/src/conformance/"
        ]
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(exists(root, "src/comm/mod.rs"));
    assert!(
        exists(root, "src/comm.rs"),
        "a module directory stands for its file"
    );
    assert!(!exists(root, "src/comm/no_such_file.rs"));
}

/// The anchors the headings of a Markdown text make, as GitHub makes them:
/// lower case, spaces to `-`, only letters, digits, `-` and `_` kept; a
/// repeated one gets `-1`, `-2`, ... Lines in fenced code are no headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let mut slug = String::new();
        for c in title.to_lowercase().chars() {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                slug.push(c);
            } else if c == ' ' {
                slug.push('-');
            }
        }
        let n = seen.entry(slug.clone()).or_insert(0);
        if *n > 0 {
            found.insert(format!("{slug}-{n}"));
        } else {
            found.insert(slug);
        }
        *n += 1;
    }
    found
}

/// The targets of the Markdown links in `text` (`](target)`), web links
/// left out.
fn links_in(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        if !target.contains("://") && !target.starts_with("mailto:") && !target.contains(' ') {
            found.push(target.to_string());
        }
        rest = &rest[end..];
    }
    found
}

#[test]
fn every_link_between_the_docs_lands() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in LINKED {
        let text = std::fs::read_to_string(root.join(doc))
            .unwrap_or_else(|e| panic!("{doc} cannot be read: {e}"));
        let dir = root.join(doc).parent().expect("a folder").to_path_buf();
        for link in links_in(&text) {
            checked += 1;
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let (target, target_text) = if file.is_empty() {
                (root.join(doc), text.clone())
            } else {
                let target = dir.join(file);
                if !target.exists() {
                    broken.push(format!("{doc}: {link} (no such file)"));
                    continue;
                }
                let text = if file.ends_with(".md") {
                    std::fs::read_to_string(&target).unwrap_or_default()
                } else {
                    String::new()
                };
                (target, text)
            };
            if !anchor.is_empty()
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&target_text).contains(anchor)
            {
                broken.push(format!("{doc}: {link} (no heading makes that anchor)"));
            }
        }
    }
    assert!(checked > 50, "only {checked} links found in {LINKED:?}");
    assert!(
        broken.is_empty(),
        "links in the docs that do not land:\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn anchors_and_links_are_read_as_github_does() {
    let text = "# Peers after the session (02:51 UTC)\n\n```sh\n# not a heading\n```\n\
                ## Launching: `ferroccl-run`\n## Plots\n## Plots\n\
                see [a](performance-log.md#plots) and [b](https://example.org/x).\n";
    let got: Vec<String> = anchors(text).into_iter().collect();
    assert_eq!(
        got,
        [
            "launching-ferroccl-run",
            "peers-after-the-session-0251-utc",
            "plots",
            "plots-1"
        ]
    );
    assert_eq!(links_in(text), ["performance-log.md#plots"]);
}
