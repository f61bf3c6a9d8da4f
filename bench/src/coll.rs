//! The collectives `ferroccl-perf` measures, and how nccl-tests turns a
//! size and a time into algorithm and bus bandwidth.
//!
//! Definitions (those of nccl-tests' PERFORMANCE.md):
//! - `size` is the byte count nccl-tests prints: the whole array for
//!   allreduce, broadcast and reduce; the whole gathered (or scattered) array
//!   for allgather and reducescatter; one rank's whole send buffer for
//!   alltoall; one message for sendrecv.
//! - `algbw = size / time`.
//! - `busbw = algbw * factor`, the factor being what makes busbw comparable
//!   with the link bandwidth for a ring: `2(n-1)/n` for allreduce,
//!   `(n-1)/n` for reducescatter, allgather and alltoall, `1` for broadcast,
//!   reduce and sendrecv.

/// A collective `ferroccl-perf` can time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    /// `all_reduce` / `all_reduce_in_place`.
    AllReduce,
    /// `reduce_scatter` / `reduce_scatter_in_place`.
    ReduceScatter,
    /// `all_gather` / `all_gather_in_place`.
    AllGather,
    /// `broadcast` (in place by nature: both columns time the same call).
    Broadcast,
    /// `reduce` / `reduce_in_place`.
    Reduce,
    /// `all_to_all` (out of place only).
    AllToAll,
    /// A ring of `send` to rank r+1 and `recv` from rank r-1 (out of place
    /// only), as nccl-tests' sendrecv_perf.
    SendRecv,
}

impl Coll {
    /// Every collective, in the order nccl-tests lists its binaries.
    pub const ALL: [Coll; 7] = [
        Coll::AllReduce,
        Coll::ReduceScatter,
        Coll::AllGather,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
        Coll::SendRecv,
    ];

    /// The name used on the command line (nccl-tests' binary name without
    /// `_perf` and underscores).
    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "allreduce",
            Coll::ReduceScatter => "reducescatter",
            Coll::AllGather => "allgather",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
            Coll::SendRecv => "sendrecv",
        }
    }

    /// Parse a collective name; underscores, dashes and a `_perf` suffix are
    /// accepted (`all_reduce_perf` names the same thing as `allreduce`).
    pub fn from_name(name: &str) -> Option<Coll> {
        let lower = name.to_ascii_lowercase();
        let bare = lower.strip_suffix("_perf").unwrap_or(&lower);
        let squashed: String = bare.chars().filter(|c| *c != '_' && *c != '-').collect();
        Coll::ALL.into_iter().find(|c| c.name() == squashed)
    }

    /// Whether the collective combines values with a reduction operator.
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether the collective has a root rank.
    pub fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// Whether ferroccl has an in-place form to time (nccl-tests prints N/A
    /// in the in-place columns otherwise).
    pub fn has_in_place(self) -> bool {
        !matches!(self, Coll::AllToAll | Coll::SendRecv)
    }

    /// The busbw/algbw factor for `ranks` ranks.
    pub fn bus_factor(self, ranks: usize) -> f64 {
        let n = ranks as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::ReduceScatter | Coll::AllGather | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }

    /// Elements per rank-sized block for a requested `bytes` of `elem`-byte
    /// elements over `ranks` ranks, rounded down and at least 1: for
    /// allgather, reducescatter and alltoall `bytes` is split into `ranks`
    /// blocks, for the others the block is the whole array.
    pub fn block_count(self, bytes: usize, elem: usize, ranks: usize) -> usize {
        let total = bytes / elem.max(1);
        let per = match self {
            Coll::ReduceScatter | Coll::AllGather | Coll::AllToAll => total / ranks.max(1),
            _ => total,
        };
        per.max(1)
    }

    /// Elements of the array the `size` column describes, given the block
    /// count from [`Coll::block_count`].
    pub fn total_count(self, block: usize, ranks: usize) -> usize {
        match self {
            Coll::ReduceScatter | Coll::AllGather | Coll::AllToAll => block * ranks,
            _ => block,
        }
    }
}

impl std::fmt::Display for Coll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Algorithm and bus bandwidth in GB/s (10^9 bytes per second) for `bytes`
/// moved in `seconds`.
pub fn bandwidth(coll: Coll, ranks: usize, bytes: usize, seconds: f64) -> (f64, f64) {
    let algbw = bytes as f64 / seconds / 1e9;
    (algbw, algbw * coll.bus_factor(ranks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn bus_factors_match_hand_derived_values() {
        // allreduce 2(n-1)/n: n=2 -> 2*1/2, n=4 -> 2*3/4, n=8 -> 2*7/8.
        let cases = [
            (Coll::AllReduce, [1.0, 1.5, 1.75]),
            (Coll::ReduceScatter, [0.5, 0.75, 0.875]),
            (Coll::AllGather, [0.5, 0.75, 0.875]),
            (Coll::AllToAll, [0.5, 0.75, 0.875]),
            (Coll::Broadcast, [1.0, 1.0, 1.0]),
            (Coll::Reduce, [1.0, 1.0, 1.0]),
            (Coll::SendRecv, [1.0, 1.0, 1.0]),
        ];
        for (coll, want) in cases {
            for (n, w) in [2usize, 4, 8].into_iter().zip(want) {
                assert!(
                    close(coll.bus_factor(n), w),
                    "{coll} n={n}: {} != {w}",
                    coll.bus_factor(n)
                );
            }
        }
    }

    #[test]
    fn bandwidth_of_known_transfers() {
        // 1 GB in 0.5 s is 2 GB/s algbw; allreduce on 4 ranks moves
        // 2*3/4 of it over each rank's link: 3 GB/s busbw.
        let (alg, bus) = bandwidth(Coll::AllReduce, 4, 1_000_000_000, 0.5);
        assert!(close(alg, 2.0) && close(bus, 3.0), "{alg} {bus}");
        // 64 MiB allgathered on 8 ranks in 10 ms.
        let (alg, bus) = bandwidth(Coll::AllGather, 8, 64 << 20, 0.01);
        assert!(close(alg, 6.7108864), "{alg}");
        assert!(close(bus, 6.7108864 * 7.0 / 8.0), "{bus}");
        // 1 MiB sendrecv in 1 ms: 1.048576 GB/s both ways of counting.
        let (alg, bus) = bandwidth(Coll::SendRecv, 2, 1 << 20, 1e-3);
        assert!(close(alg, 1.048576) && close(bus, 1.048576));
    }

    #[test]
    fn counts_split_gathered_arrays_into_blocks() {
        // 1 MiB of f32 over 4 ranks: 65536 per block, 262144 in all.
        assert_eq!(Coll::AllGather.block_count(1 << 20, 4, 4), 65536);
        assert_eq!(Coll::AllGather.total_count(65536, 4), 262144);
        assert_eq!(Coll::AllReduce.block_count(1 << 20, 4, 4), 262144);
        assert_eq!(Coll::AllReduce.total_count(262144, 4), 262144);
        // 1000 bytes of f64 over 3 ranks: 125 elements, 41 per block.
        assert_eq!(Coll::ReduceScatter.block_count(1000, 8, 3), 41);
        assert_eq!(Coll::ReduceScatter.total_count(41, 3), 123);
        // Never zero elements.
        assert_eq!(Coll::AllToAll.block_count(4, 4, 8), 1);
        assert_eq!(Coll::Broadcast.block_count(1, 8, 2), 1);
    }

    #[test]
    fn names_parse_in_every_spelling() {
        for c in Coll::ALL {
            assert_eq!(Coll::from_name(c.name()), Some(c));
        }
        assert_eq!(Coll::from_name("all_reduce_perf"), Some(Coll::AllReduce));
        assert_eq!(Coll::from_name("reduce-scatter"), Some(Coll::ReduceScatter));
        assert_eq!(Coll::from_name("AllGather"), Some(Coll::AllGather));
        assert_eq!(Coll::from_name("gather"), None);
    }
}
