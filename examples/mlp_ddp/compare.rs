//! `--mode compare`: the variants (`--variants`) that take turns step by
//! step in one job, and the markdown table rank 0 prints of them.

use super::{mlp, Args, Mode};

/// One configuration of `--mode compare`.
#[derive(Clone, Debug)]
pub(super) struct VariantSpec {
    pub(super) label: String,
    pub(super) mode: Mode,
    pub(super) bucket_mb: f64,
    pub(super) prefix_mb: Option<f64>,
    /// Cap of the first bucket, if not `--first-bucket-mb`.
    pub(super) first_mb: Option<f64>,
    /// Buckets as windows (`ReducerConfig::windows`, the default).
    pub(super) windows: bool,
}

impl VariantSpec {
    /// The one variant a run of `mode` (not compare) trains: the buckets
    /// of the flags.
    pub(super) fn of_args(args: &Args, mode: Mode) -> VariantSpec {
        VariantSpec {
            label: format!("{mode:?}"),
            mode,
            bucket_mb: args.bucket_mb,
            prefix_mb: args.prefix_chunk_mb,
            first_mb: None,
            windows: args.windows,
        }
    }
}

/// `none`, `after:CAP`, `one` (the reducer with a single bucket: every
/// gradient reduced in one collective once backward is done) or
/// `red:CAP[:PREFIX]` (MiB), separated by `;`. A `/plain` suffix gives the
/// variant plain buckets instead of windows (`ReducerConfig::windows`).
pub(super) fn parse_variants(text: &str) -> Result<Vec<VariantSpec>, String> {
    text.split(';')
        .map(|v| {
            let (v, windows) = match v.strip_suffix("/plain") {
                Some(v) => (v, false),
                None => (v, true),
            };
            let tag = |label: String| {
                if windows {
                    label
                } else {
                    format!("{label}, plain buckets")
                }
            };
            let parts: Vec<&str> = v.split(':').collect();
            let num = |i: usize| -> Result<Option<f64>, String> {
                parts
                    .get(i)
                    .map(|p| p.parse::<f64>().map_err(|e| format!("variant {v}: {e}")))
                    .transpose()
            };
            let (mode, label) = match parts[0] {
                "none" => {
                    return Ok(VariantSpec {
                        label: "none".into(),
                        mode: Mode::None,
                        bucket_mb: 25.0,
                        prefix_mb: None,
                        first_mb: None,
                        windows,
                    })
                }
                "one" => {
                    return Ok(VariantSpec {
                        label: tag("one bucket".into()),
                        mode: Mode::Reducer,
                        bucket_mb: 1e6,
                        prefix_mb: None,
                        first_mb: Some(1e6),
                        windows,
                    })
                }
                "after" => (Mode::AfterBackward, "after-backward".to_string()),
                "red" => (Mode::Reducer, String::new()),
                other => return Err(format!("unknown variant kind {other}")),
            };
            let bucket_mb = num(1)?.unwrap_or(25.0);
            let prefix_mb = num(2)?;
            let label = if mode == Mode::Reducer {
                match prefix_mb {
                    Some(p) => format!("reducer, {bucket_mb} MiB + prefix {p} MiB"),
                    None => format!("reducer, {bucket_mb} MiB"),
                }
            } else {
                label
            };
            Ok(VariantSpec {
                label: tag(label),
                mode,
                bucket_mb,
                prefix_mb,
                first_mb: None,
                windows,
            })
        })
        .collect()
}

pub(super) const DEFAULT_VARIANTS: &str =
    "none;after:25;one;red:1;red:5;red:25;red:100;red:25:4;red:100:4;red:100:12";

/// A variant's numbers on rank 0: label, step ms median and min, buckets,
/// collectives.
pub(super) type Row = (String, f64, f64, usize, usize);

/// The compare table: "hidden" is the share of the communication time
/// (after-backward, or one bucket, minus none) that the variant does not
/// pay.
pub(super) fn print_table(summary: &[Row]) {
    let find = |label: &str| summary.iter().find(|s| s.0 == label).map(|s| s.1);
    let (none, after, one) = (find("none"), find("after-backward"), find("one bucket"));
    let hidden = |base: Option<f64>, label: &str, median: f64| {
        if label == "none" || label == "after-backward" {
            "-".into()
        } else {
            mlp::hidden_share(none, base, median)
        }
    };
    println!(
        "| variant | buckets | collectives | step ms, median | step ms, min \
         | hidden vs after-backward | hidden vs one bucket |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (label, median, min, b, c) in summary {
        let h1 = hidden(after, label, *median);
        let h2 = if label == "one bucket" {
            "-".into()
        } else {
            hidden(one, label, *median)
        };
        println!("| {label} | {b} | {c} | {median:.1} | {min:.1} | {h1} | {h2} |");
    }
}
