//! Test-only fault injection, compiled in always and inert unless the
//! process environment asks for it: `FERROCCL_FAULT=close_mid_frame:rank=R:
//! after_frames=N` makes the process whose launcher rank (the `RANK`
//! variable) is R write only the header and half the payload of its N-th
//! data frame (counted over all its TCP connections, from 1), then shut
//! that socket down, as a process whose network dies mid-frame would. The
//! fault suite (tests/processes.rs) uses it; the data path pays one load
//! and one branch per frame for it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A parsed `FERROCCL_FAULT` that applies to this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CloseMidFrame {
    /// The data frame (from 1) to cut.
    pub(crate) after_frames: u64,
}

static FAULT: OnceLock<Option<CloseMidFrame>> = OnceLock::new();
static FRAMES: AtomicU64 = AtomicU64::new(0);

/// Parse a `FERROCCL_FAULT` value for the process of launcher rank `rank`:
/// `None` when it does not apply here. A value that does not parse is
/// ignored with a WARN: it only ever comes from a test.
pub(crate) fn parse(spec: &str, rank: Option<&str>) -> Option<CloseMidFrame> {
    let mut parts = spec.trim().split(':');
    if parts.next() != Some("close_mid_frame") {
        tracing::warn!("FERROCCL_FAULT='{spec}' is not understood; ignored");
        return None;
    }
    let (mut want_rank, mut after) = (None, None);
    for part in parts {
        match part.split_once('=') {
            Some(("rank", v)) => want_rank = Some(v.trim().to_string()),
            Some(("after_frames", v)) => after = v.trim().parse::<u64>().ok().filter(|&n| n > 0),
            _ => {
                tracing::warn!("FERROCCL_FAULT='{spec}': '{part}' is not understood; ignored");
                return None;
            }
        }
    }
    let Some(after_frames) = after else {
        tracing::warn!("FERROCCL_FAULT='{spec}' needs after_frames=N (N >= 1); ignored");
        return None;
    };
    match (want_rank, rank) {
        (Some(w), Some(r)) if w == r.trim() => Some(CloseMidFrame { after_frames }),
        (None, _) => Some(CloseMidFrame { after_frames }),
        _ => None,
    }
}

/// Whether the data frame about to be sent is the one to cut.
#[inline]
pub(crate) fn cut_this_frame() -> bool {
    let fault = FAULT.get_or_init(|| {
        let spec = std::env::var("FERROCCL_FAULT").ok()?;
        let fault = parse(&spec, std::env::var("RANK").ok().as_deref());
        if fault.is_some() {
            tracing::warn!("FERROCCL_FAULT='{spec}' is armed in this process");
        }
        fault
    });
    match fault {
        None => false,
        Some(f) => FRAMES.fetch_add(1, Ordering::Relaxed) + 1 == f.after_frames,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_apply_to_their_rank_only() {
        let want = Some(CloseMidFrame { after_frames: 7 });
        assert_eq!(
            parse("close_mid_frame:rank=1:after_frames=7", Some("1")),
            want
        );
        assert_eq!(
            parse("close_mid_frame:rank=1:after_frames=7", Some("2")),
            None
        );
        assert_eq!(parse("close_mid_frame:rank=1:after_frames=7", None), None);
        assert_eq!(parse("close_mid_frame:after_frames=7", Some("3")), want);
        for bad in [
            "",
            "close",
            "close_mid_frame",
            "close_mid_frame:after_frames=0",
            "close_mid_frame:after_frames=x",
            "close_mid_frame:when=now:after_frames=2",
        ] {
            assert_eq!(parse(bad, Some("1")), None, "{bad}");
        }
    }
}
