//! The tuner: picks the slice size (and, later, the algorithm) for a call.
//! Pure functions of sizes; no clocks here.

/// Smallest slice worth a frame of its own: below this the per-frame cost
/// dominates.
const MIN_SLICE_BYTES: usize = 32 * 1024;
/// Slices per ring piece we aim for, so that consecutive hops overlap.
const TARGET_SLICES: usize = 4;

/// Largest slice in bytes for a call whose ring pieces are `piece_bytes`,
/// over slots of `chunk_bytes`.
pub(crate) fn slice_bytes(piece_bytes: usize, chunk_bytes: usize) -> usize {
    (piece_bytes / TARGET_SLICES)
        .clamp(MIN_SLICE_BYTES.min(chunk_bytes), chunk_bytes)
        .max(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_stay_within_the_slot() {
        for piece in [0usize, 1, 1000, 1 << 20, 1 << 30] {
            for chunk in [64usize, 4096, 1 << 19] {
                let s = slice_bytes(piece, chunk);
                assert!(
                    s <= chunk.max(8) && s >= 8,
                    "piece {piece} chunk {chunk} -> {s}"
                );
            }
        }
    }
}
