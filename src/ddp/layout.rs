//! Bucket layout as plain data: which parameters go into which bucket, and
//! how a bucket is cut into the chunks that are reduced as separate
//! collectives. No communicator, no buffers: every rank computes the same
//! layout from the same order and caps, which is what keeps their
//! collective sequences aligned.

/// Where one parameter's gradient lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Index of the chunk (in launch order, across all buckets).
    pub(crate) chunk: usize,
    /// Element offset inside the chunk's buffer.
    pub(crate) offset: usize,
}

/// One collective's worth of parameters: a whole bucket, or a prefix-ready
/// piece of one when prefix streaming is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChunkPlan {
    /// The bucket it belongs to.
    pub(crate) bucket: usize,
    /// Parameters, in buffer order.
    pub(crate) params: Vec<usize>,
    /// Elements in the chunk's buffer.
    pub(crate) len: usize,
}

/// Buckets and chunks for one parameter order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Parameters of each bucket, in buffer order; buckets in launch order.
    pub(crate) buckets: Vec<Vec<usize>>,
    /// Chunks in launch order (the buckets' chunks, bucket after bucket).
    pub(crate) chunks: Vec<ChunkPlan>,
    /// Per parameter, where its gradient lives.
    pub(crate) slots: Vec<Slot>,
}

/// Greedy packing, as PyTorch does it: parameters join the open group in
/// `order` until the group holds at least its cap, then the group closes.
/// A single parameter larger than the cap gets a group of its own. The first
/// group's cap is `first_cap`, the others' `cap`.
fn pack(
    order: &[usize],
    bytes: impl Fn(usize) -> usize,
    first_cap: usize,
    cap: usize,
) -> Vec<Vec<usize>> {
    let mut groups = Vec::new();
    let mut open = Vec::new();
    let mut open_bytes = 0usize;
    for &p in order {
        open.push(p);
        open_bytes += bytes(p);
        let limit = if groups.is_empty() { first_cap } else { cap };
        if open_bytes >= limit {
            groups.push(std::mem::take(&mut open));
            open_bytes = 0;
        }
    }
    if !open.is_empty() {
        groups.push(open);
    }
    groups
}

impl Layout {
    /// The layout of parameters of `lens` elements (of `elem` bytes each),
    /// packed in `order` (a permutation of `0..lens.len()`), with the first
    /// bucket capped at `first_cap` bytes and the others at `cap`; buckets
    /// larger than `chunk` bytes (when given) are cut into chunks of at
    /// least `chunk` bytes, on parameter boundaries.
    pub(crate) fn build(
        lens: &[usize],
        elem: usize,
        order: &[usize],
        first_cap: usize,
        cap: usize,
        chunk: Option<usize>,
    ) -> Layout {
        debug_assert!(is_permutation(order, lens.len()));
        let bytes = |p: usize| lens[p] * elem;
        let buckets = pack(order, bytes, first_cap.max(1), cap.max(1));
        let mut chunks = Vec::new();
        let mut slots = vec![
            Slot {
                chunk: 0,
                offset: 0
            };
            lens.len()
        ];
        for (b, params) in buckets.iter().enumerate() {
            let pieces = match chunk {
                Some(c) => pack(params, bytes, c.max(1), c.max(1)),
                None => vec![params.clone()],
            };
            for piece in pieces {
                let mut len = 0;
                for &p in &piece {
                    slots[p] = Slot {
                        chunk: chunks.len(),
                        offset: len,
                    };
                    len += lens[p];
                }
                chunks.push(ChunkPlan {
                    bucket: b,
                    params: piece,
                    len,
                });
            }
        }
        Layout {
            buckets,
            chunks,
            slots,
        }
    }
}

/// Whether `order` holds each of `0..n` exactly once.
pub(crate) fn is_permutation(order: &[usize], n: usize) -> bool {
    if order.len() != n {
        return false;
    }
    let mut seen = vec![false; n];
    for &p in order {
        if p >= n || std::mem::replace(&mut seen[p], true) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_bucket_is_small_and_a_large_parameter_stands_alone() {
        // 4-byte elements; caps of 100 and 400 bytes.
        let lens = [10, 10, 10, 200, 10, 10];
        let order: Vec<usize> = (0..6).rev().collect();
        let l = Layout::build(&lens, 4, &order, 100, 400, None);
        // 5,4,3: 40+40 < 100, then 800 >= 100 closes; 2,1,0: 120 < 400.
        assert_eq!(l.buckets, vec![vec![5, 4, 3], vec![2, 1, 0]]);
        assert_eq!(l.chunks.len(), 2);
        assert_eq!(
            l.slots[3],
            Slot {
                chunk: 0,
                offset: 20
            }
        );
        assert_eq!(l.chunks[0].len, 220);
    }

    #[test]
    fn chunks_cut_a_bucket_on_parameter_boundaries() {
        let lens = [30, 30, 30, 30];
        let order = [3, 2, 1, 0];
        // One bucket (cap not reached), chunks of at least 200 bytes: 2 params each.
        let l = Layout::build(&lens, 4, &order, 1 << 20, 1 << 20, Some(200));
        assert_eq!(l.buckets, vec![vec![3, 2, 1, 0]]);
        let params: Vec<_> = l.chunks.iter().map(|c| c.params.clone()).collect();
        assert_eq!(params, vec![vec![3, 2], vec![1, 0]]);
        assert_eq!(
            l.slots[1],
            Slot {
                chunk: 1,
                offset: 0
            }
        );
        assert_eq!(
            l.slots[0],
            Slot {
                chunk: 1,
                offset: 30
            }
        );
    }

    #[test]
    fn every_parameter_has_exactly_one_slot_that_fits() {
        let lens: Vec<usize> = (0..37).map(|i| (i * 7919) % 50 + 1).collect();
        let order: Vec<usize> = (0..37).map(|i| (i * 11) % 37).collect();
        for chunk in [None, Some(40), Some(1)] {
            let l = Layout::build(&lens, 2, &order, 60, 150, chunk);
            let mut covered: Vec<Vec<bool>> = l.chunks.iter().map(|c| vec![false; c.len]).collect();
            for (p, s) in l.slots.iter().enumerate() {
                for x in &mut covered[s.chunk][s.offset..s.offset + lens[p]] {
                    assert!(!*x, "overlap at parameter {p}");
                    *x = true;
                }
            }
            assert!(covered.iter().flatten().all(|&x| x));
            let flat: Vec<usize> = l.buckets.concat();
            assert_eq!(flat, order);
        }
    }

    #[test]
    fn permutation_check() {
        assert!(is_permutation(&[2, 0, 1], 3));
        assert!(!is_permutation(&[0, 0, 1], 3));
        assert!(!is_permutation(&[0, 1], 3));
        assert!(!is_permutation(&[0, 1, 3], 3));
    }
}
