//! Example algorithms written with the builder, as a user would.

use super::{Chunks, Collective, RankSteps, UserAlgorithm};

/// Recursive halving-doubling allreduce (Rabenseifner's): on `n = 2^m`
/// ranks the buffer is cut into `n` chunks; `m` rounds of recursive
/// halving (exchange half of what a rank still reduces with the rank
/// whose number differs in one bit, largest bit first) leave rank `r`
/// with chunk `r` reduced, and `m` rounds of recursive doubling (the
/// same partners in reverse) gather every chunk everywhere: `2m`
/// messages a rank, each rank sending `2 (n - 1) / n` of the buffer,
/// like the ring. Claims the powers of two up to `max_ranks`; other
/// rank counts are refused (the folding of extra ranks that
/// `recursive_doubling` does is not written here).
pub fn halving_doubling(max_ranks: usize) -> UserAlgorithm {
    let sizes = (0..usize::BITS)
        .map(|b| 1usize << b)
        .take_while(|&n| n <= max_ranks);
    UserAlgorithm::build(
        "halving_doubling",
        Collective::AllReduce,
        sizes,
        halving_doubling_rank,
    )
}

fn halving_doubling_rank(b: &mut RankSteps) {
    let (n, r) = (b.size(), b.rank());
    if n == 1 {
        b.copy(Chunks::one(0, 1));
        return;
    }
    // The chunks this rank still reduces: [lo, hi).
    let (mut lo, mut hi) = (0, n);
    let mut mask = n / 2;
    let mut first = true;
    while mask > 0 {
        let partner = r ^ mask;
        let mid = (lo + hi) / 2;
        let (keep, give) = if r & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        b.send(partner, Chunks::range(give.0, give.1, n));
        if !first {
            b.using_output();
        }
        b.recv_reduce_copy(partner, Chunks::range(keep.0, keep.1, n));
        if !first {
            b.using_output();
        }
        (lo, hi) = keep;
        first = false;
        mask /= 2;
    }
    // Now [lo, hi) == [r, r + 1): gather by doubling, smallest bit
    // first.
    let mut mask = 1;
    while mask < n {
        let partner = r ^ mask;
        let width = hi - lo;
        let theirs = if r & mask == 0 {
            (hi, hi + width)
        } else {
            (lo - width, lo)
        };
        b.send(partner, Chunks::range(lo, hi, n)).using_output();
        b.recv(partner, Chunks::range(theirs.0, theirs.1, n));
        (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
        mask *= 2;
    }
}

/// The powers of two up to `max_ranks`.
fn powers_of_two(max_ranks: usize) -> impl Iterator<Item = usize> {
    (0..usize::BITS)
        .map(|b| 1usize << b)
        .take_while(move |&n| n <= max_ranks)
}

/// Recursive-doubling allgather on `n = 2^m` ranks: chunk `b` of `n`
/// is rank `b`'s block. Rank `r` copies its input into its block and
/// sends it to `r ^ 1`; in round `k` it sends the `2^k` blocks it has
/// gathered (those of its group of `2^k` ranks) to `r ^ 2^k`, and
/// receives that rank's: `m` messages a rank, each rank sending
/// `(n - 1) / n` of the output, like the ring. Claims the powers of
/// two up to `max_ranks`.
pub fn recursive_doubling_allgather(max_ranks: usize) -> UserAlgorithm {
    UserAlgorithm::build(
        "recursive_doubling_allgather",
        Collective::AllGather,
        powers_of_two(max_ranks),
        |b| {
            let (n, r) = (b.size(), b.rank());
            if n == 1 {
                b.copy(Chunks::one(0, 1));
                return;
            }
            let mut mask = 1;
            while mask < n {
                let partner = r ^ mask;
                // The group of `mask` ranks this rank's data covers.
                let mine = r & !(mask - 1);
                let theirs = partner & !(mask - 1);
                if mask == 1 {
                    // The own block comes from the input, and is kept.
                    b.copy_send(partner, Chunks::one(r, n));
                } else {
                    b.send(partner, Chunks::range(mine, mine + mask, n))
                        .using_output();
                }
                b.recv(partner, Chunks::range(theirs, theirs + mask, n));
                mask *= 2;
            }
        },
    )
}

/// Pairwise-exchange reduce-scatter on any `n`: chunk `b` of `n` is
/// block `b`. Rank `r` copies block `r` of its input into its output,
/// then in round `k` (1 to `n - 1`) sends block `r + k` of its input to
/// rank `r + k` and adds what rank `r - k` sends it (block `r` of that
/// rank's input) to its output (ranks mod `n`): `n - 1` messages a
/// rank of one block each, `(n - 1) / n` of the input, like the ring,
/// with no partial result kept outside the rank's own block (which
/// the coordinates of a reduce-scatter require: recursive halving,
/// which keeps partial sums of other blocks, cannot be written).
/// Claims `1..=max_ranks`.
pub fn pairwise_reduce_scatter(max_ranks: usize) -> UserAlgorithm {
    UserAlgorithm::build(
        "pairwise_reduce_scatter",
        Collective::ReduceScatter,
        1..=max_ranks,
        pairwise_reduce_scatter_rank,
    )
}

/// Rank `b.rank()`'s steps of [`pairwise_reduce_scatter`] (for
/// [`UserAlgorithm::add_size`] at larger rank counts).
pub fn pairwise_reduce_scatter_rank(b: &mut RankSteps) {
    let (n, r) = (b.size(), b.rank());
    b.copy(Chunks::one(r, n));
    for k in 1..n {
        let to = (r + k) % n;
        let from = (r + n - k) % n;
        b.send(to, Chunks::one(to, n));
        b.recv_reduce_copy(from, Chunks::one(r, n)).using_output();
    }
}
