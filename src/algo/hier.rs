//! Hierarchical schedules for ranks spread over hosts: the fast links
//! inside a host carry most of the steps, the network carries each byte
//! once per host instead of once per rank.
//!
//! Allreduce: reduce-scatter inside each host, allreduce across hosts of
//! each rank's shard (a ring over one rank per host), allgather inside
//! each host. Allgather: allgather across hosts (each rank gathers the
//! blocks of the ranks with its local index on every host), then allgather
//! inside each host. Reduce-scatter has no hierarchical schedule: its
//! partial sums for other hosts' ranks need a scratch buffer of `hosts`
//! blocks, and schedules address only the caller's two buffers; it runs
//! the ring.
//!
//! Uneven hosts (hosts of different rank counts) are handled, not refused:
//! the data is cut into `P` classes, `P` the largest host's rank count;
//! on a host of `m` ranks, local rank `i` holds every class `c` with
//! `c % m == i`, and class `c`'s ring across hosts runs through local rank
//! `c % m` of every host. A rank of a small host then runs several rings
//! across hosts, one after the other in class order, which every rank
//! shares, so none waits on a ring its peer has not reached.
//!
//! Every step touches whole units (a slice of one host's part of one
//! class, or of one rank's block): ranges are equal or apart, so
//! `channels::split` runs these schedules over several channels.
//!
//! Pure data, like the rest of `algo`: no I/O, no clocks, no `unsafe`.

use super::{partition, slice_of, Operand, Prim, Schedule, Step, NO_PEER};

/// Which ranks share a host. Hosts are numbered in order of their first
/// rank; a host's ranks are listed in rank order (local index = place in
/// that list). Ranks of one host need not be contiguous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMap {
    members: Vec<Vec<usize>>,
    host_of: Vec<usize>,
    local: Vec<usize>,
}

impl HostMap {
    /// From each rank's host identity (any comparable value: a boot id and
    /// namespace, a host name).
    pub fn from_ids<T: PartialEq>(ids: &[T]) -> HostMap {
        let mut firsts: Vec<usize> = Vec::new();
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut host_of = Vec::with_capacity(ids.len());
        let mut local = Vec::with_capacity(ids.len());
        for (rank, id) in ids.iter().enumerate() {
            let h = match firsts.iter().position(|&f| ids[f] == *id) {
                Some(h) => h,
                None => {
                    firsts.push(rank);
                    members.push(Vec::new());
                    members.len() - 1
                }
            };
            local.push(members[h].len());
            members[h].push(rank);
            host_of.push(h);
        }
        HostMap {
            members,
            host_of,
            local,
        }
    }

    /// Contiguous hosts of `sizes[h]` ranks each (host 0 has ranks
    /// `0..sizes[0]`, and so on). Hosts of no rank are left out.
    pub fn from_sizes(sizes: &[usize]) -> HostMap {
        let ids: Vec<usize> = sizes
            .iter()
            .enumerate()
            .flat_map(|(h, &m)| std::iter::repeat_n(h, m))
            .collect();
        HostMap::from_ids(&ids)
    }

    /// One host holding `ranks` ranks.
    pub fn single(ranks: usize) -> HostMap {
        HostMap::from_sizes(&[ranks])
    }

    /// Ranks in the communicator.
    pub fn ranks(&self) -> usize {
        self.host_of.len()
    }

    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.members.len()
    }

    /// Rank count of the largest host.
    pub fn largest(&self) -> usize {
        self.members.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The ranks of host `h`, in rank order.
    pub fn members(&self, h: usize) -> &[usize] {
        &self.members[h]
    }

    /// Whether a hierarchical schedule differs from the flat one: more
    /// than one host, and more than one rank on some host.
    pub fn is_hierarchical(&self) -> bool {
        self.hosts() > 1 && self.largest() > 1
    }

    /// Classes the data is cut into: the largest host's rank count.
    fn classes(&self) -> usize {
        self.largest().max(1)
    }

    /// The rank that carries class `c` on host `h`.
    fn carrier(&self, h: usize, c: usize) -> usize {
        let m = &self.members[h];
        m[c % m.len()]
    }
}

/// A contiguous run of elements a step moves: where it is in the input
/// and in the output, and how long.
#[derive(Debug, Clone, Copy)]
struct Unit {
    input: usize,
    output: usize,
    len: usize,
}

/// What a ring pass over a group does to each unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Member `i` ends with the reduction of block `i` in its output.
    ReduceScatter,
    /// Every member ends with the reduction of every block.
    AllReduce,
    /// Every member ends with every member's block.
    AllGather,
}

/// A ring pass over `members` (global ranks; this rank is
/// `members[pos]`), block `b` belonging to `members[b]`. Units of equal
/// index in every block travel together (a ring pass per unit index, as
/// `ring` does per slice); a missing or empty unit is left out on every
/// rank alike, since all ranks build the same blocks. `local` says where
/// the data already is: the input (first pass of a call) or the output (a
/// later pass). Tags are `tag_base` plus the transfer's number.
fn ring_pass(
    out: &mut Schedule,
    members: &[usize],
    pos: usize,
    blocks: &[Vec<Unit>],
    pass: Pass,
    local: Operand,
    tag_base: u32,
) {
    let m = members.len();
    if m == 1 {
        // Nothing to exchange; a first pass still puts its data in place.
        if local == Operand::Input {
            for u in &blocks[0] {
                if u.len > 0 {
                    out.push(Step::local(Prim::Copy, local, u.input, u.output, u.len));
                }
            }
        }
        return;
    }
    let next = members[(pos + 1) % m];
    let prev = members[(pos + m - 1) % m];
    let back = |k: usize| (pos + m - k % m) % m;
    let units = blocks.iter().map(Vec::len).max().unwrap_or(0);
    let per = 2 * m as u32;
    for u in 0..units {
        let base = tag_base.wrapping_add((u as u32).wrapping_mul(per));
        let mut hop = |k: usize, prim: Prim, block: usize| {
            let Some(unit) = blocks[block].get(u) else {
                return;
            };
            if unit.len == 0 {
                return;
            }
            let k = k as u32;
            out.push(Step {
                prim,
                local,
                send_to: if prim.sends() { next } else { NO_PEER },
                recv_from: if prim.receives() { prev } else { NO_PEER },
                input: unit.input,
                output: unit.output,
                len: unit.len,
                send_tag: base.wrapping_add(k),
                recv_tag: base.wrapping_add(k.wrapping_sub(1)),
                channel: 0,
            });
        };
        match pass {
            Pass::ReduceScatter | Pass::AllReduce => {
                hop(0, Prim::Send, back(1));
                for j in 2..m {
                    hop(j - 1, Prim::RecvReduceSend, back(j));
                }
                if pass == Pass::ReduceScatter {
                    hop(m - 1, Prim::RecvReduceCopy, pos);
                } else {
                    hop(m - 1, Prim::RecvReduceCopySend, pos);
                    for j in 1..m - 1 {
                        hop(m - 1 + j, Prim::RecvCopySend, back(j));
                    }
                    hop(2 * m - 2, Prim::Recv, back(m - 1));
                }
            }
            Pass::AllGather => {
                let first = if local == Operand::Input {
                    Prim::CopySend
                } else {
                    Prim::Send
                };
                hop(0, first, pos);
                for j in 1..m - 1 {
                    hop(j, Prim::RecvCopySend, back(j));
                }
                hop(m - 1, Prim::Recv, back(m - 1));
            }
        }
    }
}

/// Tag bases of the phases: far apart, so that a frame of one phase met
/// by a step of another fails its tag check.
const TAG_INTRA_FIRST: u32 = 0x1000_0000;
const TAG_INTER: u32 = 0x2000_0000;
const TAG_INTRA_LAST: u32 = 0x3000_0000;
/// Tag distance between the rings across hosts of two classes.
const TAG_CLASS: u32 = 0x0010_0000;

/// The units of class `c` of an allreduce of `count` elements: the class
/// is cut into one part per host (the blocks of its ring across hosts),
/// each part into slices of at most `slice`.
fn class_parts(map: &HostMap, count: usize, slice: usize, c: usize) -> Vec<Vec<Unit>> {
    let (off, len) = partition(count, map.classes(), c);
    let slice = slice.max(1);
    (0..map.hosts())
        .map(|h| {
            let (poff, plen) = partition(len, map.hosts(), h);
            (0..plen.div_ceil(slice))
                .map(|s| {
                    let (at, l) = slice_of((off + poff, plen), s, slice);
                    Unit {
                        input: at,
                        output: at,
                        len: l,
                    }
                })
                .collect()
        })
        .collect()
}

/// Allreduce of `count` elements on rank `rank` of `map`, slices of at
/// most `slice` elements: reduce-scatter inside the host, a ring allreduce
/// across hosts per class, allgather inside the host. Works in place too
/// (every step reads a range before any step writes it, as the ring).
pub fn all_reduce(map: &HostMap, rank: usize, count: usize, slice: usize) -> Schedule {
    let mut out = Schedule::default();
    let h = map.host_of[rank];
    let host = &map.members[h];
    let m = host.len();
    let parts: Vec<Vec<Vec<Unit>>> = (0..map.classes())
        .map(|c| class_parts(map, count, slice, c))
        .collect();
    // Inside the host, local rank i's block is every class it carries.
    let blocks: Vec<Vec<Unit>> = (0..m)
        .map(|i| {
            parts
                .iter()
                .enumerate()
                .filter(|(c, _)| c % m == i)
                .flat_map(|(_, p)| p.iter().flatten().copied())
                .collect()
        })
        .collect();
    let pos = map.local[rank];
    ring_pass(
        &mut out,
        host,
        pos,
        &blocks,
        Pass::ReduceScatter,
        Operand::Input,
        TAG_INTRA_FIRST,
    );
    for (c, p) in parts.iter().enumerate() {
        if map.carrier(h, c) != rank {
            continue;
        }
        let ring: Vec<usize> = (0..map.hosts()).map(|g| map.carrier(g, c)).collect();
        ring_pass(
            &mut out,
            &ring,
            h,
            p,
            Pass::AllReduce,
            Operand::Output,
            TAG_INTER.wrapping_add(TAG_CLASS.wrapping_mul(c as u32)),
        );
    }
    ring_pass(
        &mut out,
        host,
        pos,
        &blocks,
        Pass::AllGather,
        Operand::Output,
        TAG_INTRA_LAST,
    );
    out
}

/// Allgather of `count` elements a rank into block `rank` of every rank's
/// output, on rank `rank` of `map`: across hosts first (class `c` is the
/// blocks of the ranks of local index `c`; its ring runs through the
/// carriers of `c`), then inside the host, each rank passing on the
/// blocks it gathered.
pub fn all_gather(map: &HostMap, rank: usize, count: usize, slice: usize) -> Schedule {
    let mut out = Schedule::default();
    let h = map.host_of[rank];
    let host = &map.members[h];
    let m = host.len();
    let slice = slice.max(1);
    // The units of rank d's block: slices of its input, at block d of the
    // output.
    let block_of = |d: usize| -> Vec<Unit> {
        (0..count.div_ceil(slice))
            .map(|s| {
                let (at, l) = slice_of((0, count), s, slice);
                Unit {
                    input: at,
                    output: d * count + at,
                    len: l,
                }
            })
            .collect()
    };
    let member_of_class = |g: usize, c: usize| map.members[g].get(c).copied();
    for c in 0..map.classes() {
        if map.carrier(h, c) != rank {
            continue;
        }
        let ring: Vec<usize> = (0..map.hosts()).map(|g| map.carrier(g, c)).collect();
        // A host with fewer than c + 1 ranks relays class c: no block.
        let blocks: Vec<Vec<Unit>> = (0..map.hosts())
            .map(|g| member_of_class(g, c).map_or_else(Vec::new, block_of))
            .collect();
        let local = if member_of_class(h, c) == Some(rank) {
            Operand::Input
        } else {
            Operand::Output
        };
        ring_pass(
            &mut out,
            &ring,
            h,
            &blocks,
            Pass::AllGather,
            local,
            TAG_INTER.wrapping_add(TAG_CLASS.wrapping_mul(c as u32)),
        );
    }
    // Inside the host, local rank i passes on every block of the classes
    // it carries, from every host.
    let blocks: Vec<Vec<Unit>> = (0..m)
        .map(|i| {
            (0..map.ranks())
                .filter(|&d| map.local[d] % m == i)
                .flat_map(block_of)
                .collect()
        })
        .collect();
    ring_pass(
        &mut out,
        host,
        map.local[rank],
        &blocks,
        Pass::AllGather,
        Operand::Output,
        TAG_INTRA_LAST,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{channels, sim};

    /// Every layout of `hosts` hosts of 1..=`most` ranks each, up to 64
    /// ranks: all even ones, and uneven ones in increasing and mixed
    /// orders.
    fn layouts() -> Vec<Vec<usize>> {
        let mut all = Vec::new();
        for hosts in 1..=8usize {
            for m in 1..=8usize {
                if hosts * m <= 64 {
                    all.push(vec![m; hosts]);
                }
            }
        }
        all.extend([
            vec![1, 2],
            vec![2, 1],
            vec![3, 1, 2],
            vec![1, 4, 2, 3],
            vec![8, 1],
            vec![2, 3, 5, 7],
            vec![8, 7, 8, 6, 8, 8, 8, 8],
            vec![5, 1, 1, 1, 5],
        ]);
        all
    }

    fn value(rank: usize, i: usize) -> f64 {
        ((rank * 131 + i * 7) % 97) as f64 - 40.0
    }

    /// Results of `build` on every rank of `map`, run over FIFOs of
    /// `cap` with f32 rounding at every combine.
    fn run(
        map: &HostMap,
        build: impl Fn(usize) -> Schedule,
        in_len: usize,
        out_len: usize,
        in_place: bool,
        channels: usize,
    ) -> Result<Vec<Vec<f64>>, String> {
        let n = map.ranks();
        let schedules: Vec<Schedule> = (0..n)
            .map(|r| channels::split(&build(r), channels))
            .collect();
        let inputs: Vec<Vec<f64>> = (0..n)
            .map(|r| (0..in_len).map(|i| value(r, i)).collect())
            .collect();
        let mut outputs: Vec<Vec<f64>> = if in_place {
            inputs.clone()
        } else {
            vec![vec![f64::NAN; out_len]; n]
        };
        sim::run_with(&schedules, &inputs, &mut outputs, in_place, 2, sim::add_f32)?;
        Ok(outputs)
    }

    #[test]
    fn host_maps_group_ranks_by_identity() {
        let map = HostMap::from_ids(&["b", "a", "b", "c", "a"]);
        assert_eq!(map.hosts(), 3);
        assert_eq!(map.members(0), &[0, 2]);
        assert_eq!(map.members(1), &[1, 4]);
        assert_eq!(map.members(2), &[3]);
        assert!(map.is_hierarchical());
        assert!(!HostMap::single(8).is_hierarchical());
        assert!(!HostMap::from_sizes(&[1, 1, 1]).is_hierarchical());
        assert_eq!(HostMap::from_sizes(&[2, 0, 3]).hosts(), 2);
    }

    /// Allreduce on every layout: each element equals the f64 sum of every
    /// rank's input (values are small integers, exact in f32), every rank
    /// holds the same bits, out of place and in place, over 1 and 3
    /// channels, with no deadlock on FIFOs of two frames.
    #[test]
    fn all_reduce_sums_everything_on_every_layout() {
        for sizes in layouts() {
            let map = HostMap::from_sizes(&sizes);
            let n = map.ranks();
            for count in [0usize, 1, 7, 64, 157] {
                for slice in [1usize, 5, 1000] {
                    for (in_place, ch) in [(false, 1), (true, 1), (false, 3)] {
                        let outs = run(
                            &map,
                            |r| all_reduce(&map, r, count, slice),
                            count,
                            count,
                            in_place,
                            ch,
                        )
                        .unwrap_or_else(|e| panic!("{sizes:?} count {count} slice {slice}: {e}"));
                        for (i, got) in outs[0].iter().enumerate() {
                            let want: f64 = (0..n).map(|r| value(r, i)).sum();
                            assert_eq!(
                                *got, want,
                                "{sizes:?} count {count} slice {slice} element {i}"
                            );
                        }
                        for (r, o) in outs.iter().enumerate() {
                            assert_eq!(
                                o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                outs[0].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                                "{sizes:?} count {count}: rank {r} differs from rank 0"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Allreduce of values that round in f32: the sum agrees with the f64
    /// reference within f32's error, the same bits everywhere.
    #[test]
    fn all_reduce_of_fractions_is_close_to_the_f64_sum() {
        for sizes in [vec![4, 4], vec![3, 5, 2], vec![8, 8, 8, 8, 8, 8, 8, 8]] {
            let map = HostMap::from_sizes(&sizes);
            let n = map.ranks();
            let count = 300;
            let schedules: Vec<Schedule> = (0..n).map(|r| all_reduce(&map, r, count, 17)).collect();
            let frac = |r: usize, i: usize| 1.0 / (1 + r * 3 + i) as f64;
            let inputs: Vec<Vec<f64>> = (0..n)
                .map(|r| (0..count).map(|i| f64::from(frac(r, i) as f32)).collect())
                .collect();
            let mut outputs = vec![vec![0.0; count]; n];
            sim::run_with(&schedules, &inputs, &mut outputs, false, 2, sim::add_f32).unwrap();
            for i in 0..count {
                let want: f64 = inputs.iter().map(|x| x[i]).sum();
                let err = (outputs[0][i] - want).abs();
                assert!(err <= want.abs() * 1e-5, "{sizes:?} element {i}: {err}");
                for o in &outputs {
                    assert_eq!(o[i].to_bits(), outputs[0][i].to_bits());
                }
            }
        }
    }

    /// Allgather on every layout: block r of every rank's output is rank
    /// r's input, out of place and over 1 and 3 channels.
    #[test]
    fn all_gather_collects_every_block_on_every_layout() {
        for sizes in layouts() {
            let map = HostMap::from_sizes(&sizes);
            let n = map.ranks();
            for count in [0usize, 1, 9, 40] {
                for slice in [1usize, 4, 1000] {
                    for ch in [1, 3] {
                        let outs = run(
                            &map,
                            |r| all_gather(&map, r, count, slice),
                            count,
                            count * n,
                            false,
                            ch,
                        )
                        .unwrap_or_else(|e| panic!("{sizes:?} count {count} slice {slice}: {e}"));
                        for (r, o) in outs.iter().enumerate() {
                            for d in 0..n {
                                for i in 0..count {
                                    assert_eq!(
                                        o[d * count + i],
                                        value(d, i),
                                        "{sizes:?} count {count}: rank {r} block {d} [{i}]"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Ranks of a host need not be contiguous: hosts interleaved.
    #[test]
    fn interleaved_hosts_work_too() {
        let map = HostMap::from_ids(&[0, 1, 0, 1, 2, 0, 2]);
        let n = map.ranks();
        let count = 23;
        let outs = run(
            &map,
            |r| all_reduce(&map, r, count, 3),
            count,
            count,
            false,
            1,
        )
        .unwrap();
        for i in 0..count {
            let want: f64 = (0..n).map(|r| value(r, i)).sum();
            assert!(outs.iter().all(|o| o[i] == want), "element {i}");
        }
        let outs = run(&map, |r| all_gather(&map, r, 5, 2), 5, 5 * n, false, 1).unwrap();
        for o in &outs {
            for d in 0..n {
                for i in 0..5 {
                    assert_eq!(o[d * 5 + i], value(d, i));
                }
            }
        }
    }

    /// The network carries what the design says: on 2 hosts of 4 ranks,
    /// an allreduce sends 2 (h - 1) / h of the buffer out of each host in
    /// all (each class's ring moves its part), where the flat ring moves
    /// 2 (n - 1) / n of it through the one rank at the host's edge; and a
    /// schedule crossing hosts names only carriers of one class.
    #[test]
    fn bytes_across_hosts_are_what_the_model_says() {
        let map = HostMap::from_sizes(&[4, 4]);
        let count = 800;
        // What leaves host h, from its own ranks' schedules.
        let leaving = |h: usize| -> usize {
            map.members(h)
                .iter()
                .flat_map(|&r| all_reduce(&map, r, count, 10).steps)
                .filter(|s| s.prim.sends() && map.host_of[s.send_to] != h)
                .map(|s| s.len)
                .sum()
        };
        let hosts = 2;
        assert_eq!(leaving(0), 2 * (hosts - 1) * count / hosts);
        assert_eq!(leaving(1), leaving(0));
    }
}
