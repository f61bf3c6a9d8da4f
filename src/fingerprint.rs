//! What a call looked like, as carried in every frame, and how to say it to
//! a person ("all_reduce #17 (float, sum, 1000 elements)").

use crate::coll::CollKind;
use crate::element::{DataType, ReduceOp};
use ferroccl_transport::Fingerprint;

/// Marker for "no root" in a fingerprint.
pub(crate) const NO_ROOT: u32 = u32::MAX;

/// Set in the `seq` of the library's own calls (the agreements of
/// communicator set-up, `split` and `alloc_window`, the tuner's
/// calibration): they are numbered apart from the user's calls, which count
/// from 1, so that no error ever gives a user call's number to one of them,
/// and a frame of one is never taken for the other.
pub(crate) const INTERNAL: u64 = 1 << 63;

/// Whether a fingerprint is of one of the library's own calls.
pub(crate) fn is_internal(fp: &Fingerprint) -> bool {
    fp.seq & INTERNAL != 0
}

/// Describe a fingerprint for an error message; unknown codes (from a peer
/// running another version, or garbage) are shown as numbers, never trusted.
pub(crate) fn describe(fp: &Fingerprint) -> String {
    let kind = CollKind::from_code(fp.coll)
        .map(|k| k.name().to_string())
        .unwrap_or_else(|| format!("unknown call {}", fp.coll));
    let dtype = DataType::from_code(fp.dtype)
        .map(|t| t.name().to_string())
        .unwrap_or_else(|| format!("type {}", fp.dtype));
    let mut parts = vec![dtype];
    if let Some(op) = ReduceOp::from_code(fp.op) {
        parts.push(op.name().to_string());
    }
    parts.push(format!("{} elements", fp.count));
    if fp.root != NO_ROOT {
        let what = if matches!(CollKind::from_code(fp.coll), Some(CollKind::SendRecv)) {
            "from rank"
        } else {
            "root"
        };
        parts.push(format!("{what} {}", fp.root));
    }
    if is_internal(fp) {
        return format!(
            "the library's own {kind} #{} inside communicator set-up, split or alloc_window ({})",
            fp.seq & !INTERNAL,
            parts.join(", ")
        );
    }
    format!("{kind} #{} ({})", fp.seq, parts.join(", "))
}
