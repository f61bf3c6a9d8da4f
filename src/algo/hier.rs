//! Hierarchical schedules for ranks spread over hosts: the fast links
//! inside a host carry most of the steps, the network carries each byte
//! once per host instead of once per rank.
//!
//! Allreduce: reduce-scatter inside each host, allreduce across hosts of
//! each rank's shard (a ring over one rank per host), allgather inside
//! each host. Allgather: allgather across hosts (each rank gathers the
//! blocks of the ranks with its local index on every host), then allgather
//! inside each host. Reduce-scatter: reduce-scatter inside each host, then
//! across hosts, pipelined through frames so that no scratch is needed
//! (the partial sums for other hosts' ranks travel inside frames, as in a
//! ring reduce-scatter): each destination's chain walks every host's ranks
//! over the links inside it and crosses to the next host at the next local
//! index (see [`reduce_scatter`]); a host sends `n - m` blocks out over
//! its `m` ranks' connections, against the flat ring's `n - 1` through
//! one rank.
//!
//! Uneven hosts (hosts of different rank counts) are handled, not refused.
//! Reduce-scatter's chains then start at ticks found by search, so that
//! no link carries two frames in one tick (`chain_starts`). Allreduce and
//! allgather cut the data into `P` classes, `P` the largest host's rank count;
//! on a host of `m` ranks, local rank `i` holds every class `c` with
//! `c % m == i`, and class `c`'s ring across hosts runs through local rank
//! `c % m` of every host. A rank of a small host then runs several rings
//! across hosts, in an order every rank shares, so none waits on a ring
//! its peer has not reached.
//!
//! Above depth 1 the phases of allreduce and allgather are pipelined
//! (`all_reduce_phases`): every phase is stamped on one `Timeline`, so
//! a slice crosses hosts while later slices are still reduced inside the
//! host; depth 1 keeps the phases in turn.
//!
//! Every step touches whole units (a slice of one host's part of one
//! class, or of one rank's block): ranges are equal or apart, so
//! `channels::split` runs these schedules over several channels.
//!
//! Pure data, like the rest of `algo`: no I/O, no clocks, no `unsafe`.

use super::{partition, slice_of, Operand, Prim, Schedule, Step, Timeline, NO_PEER};

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

    /// The ranks of `rank`'s host (`rank` among them), in rank order.
    pub fn members_of(&self, rank: usize) -> &[usize] {
        &self.members[self.host_of[rank]]
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

/// The ticks a ring pass of `pass` over `m` members spans a unit (`m ==
/// 1`: one, the first pass's copy).
fn pass_hops(pass: Pass, m: usize) -> u64 {
    match (pass, m) {
        (_, 0 | 1) => 1,
        (Pass::AllReduce, _) => 2 * m as u64 - 1,
        (Pass::ReduceScatter | Pass::AllGather, _) => m as u64,
    }
}

/// One ring pass to stamp into a timeline: over `members` (global ranks;
/// this rank is `members[pos]`), block `b` belonging to `members[b]`.
/// Units of equal index in every block travel together (a ring pass per
/// unit index, as `ring` does per slice); a missing or empty unit is left
/// out on every rank alike, since all ranks build the same blocks.
/// `local` says where the data already is: the input (first pass of a
/// call) or the output (a later pass). Tags are `tag_base` plus the
/// transfer's number.
struct RingPass<'a> {
    members: &'a [usize],
    pos: usize,
    blocks: &'a [Vec<Unit>],
    pass: Pass,
    local: Operand,
    tag_base: u32,
}

impl RingPass<'_> {
    /// Stamp the pass into `timeline`: hop `k` of unit `u` at tick
    /// `at(u).0 + k` with priority `at(u).1`, for `stream`. A frame sent
    /// at tick `t` is received at `t + 1`, as `Timeline` asks.
    fn stamp(&self, timeline: &mut Timeline, at: impl Fn(usize) -> (u64, i64), stream: usize) {
        let (blocks, local) = (self.blocks, self.local);
        let m = self.members.len();
        if m == 1 {
            // Nothing to exchange; a first pass still puts its data in place.
            if local == Operand::Input {
                for (u, unit) in blocks[0].iter().enumerate() {
                    if unit.len > 0 {
                        let (tick, priority) = at(u);
                        timeline.at(
                            tick,
                            priority,
                            stream,
                            Step::local(Prim::Copy, local, unit.input, unit.output, unit.len),
                        );
                    }
                }
            }
            return;
        }
        let pos = self.pos;
        let next = self.members[(pos + 1) % m];
        let prev = self.members[(pos + m - 1) % m];
        let back = |k: usize| (pos + m - k % m) % m;
        let units = blocks.iter().map(Vec::len).max().unwrap_or(0);
        let per = 2 * m as u32;
        for u in 0..units {
            let base = self.tag_base.wrapping_add((u as u32).wrapping_mul(per));
            let (start, priority) = at(u);
            let mut hop = |k: usize, prim: Prim, block: usize| {
                let Some(unit) = blocks[block].get(u) else {
                    return;
                };
                if unit.len == 0 {
                    return;
                }
                let k32 = k as u32;
                timeline.at(
                    start + k as u64,
                    priority,
                    stream,
                    Step {
                        prim,
                        local,
                        send_to: if prim.sends() { next } else { NO_PEER },
                        recv_from: if prim.receives() { prev } else { NO_PEER },
                        input: unit.input,
                        output: unit.output,
                        len: unit.len,
                        send_tag: base.wrapping_add(k32),
                        recv_tag: base.wrapping_add(k32.wrapping_sub(1)),
                        channel: 0,
                    },
                );
            };
            match self.pass {
                Pass::ReduceScatter | Pass::AllReduce => {
                    hop(0, Prim::Send, back(1));
                    for j in 2..m {
                        hop(j - 1, Prim::RecvReduceSend, back(j));
                    }
                    if self.pass == Pass::ReduceScatter {
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

/// The streams of the passes across hosts: on even hosts class `c`'s
/// rings run over links of their own (rank `(g, c)` to `(g + 1, c)`), a
/// stream each; on uneven hosts a rank may carry several classes over one
/// link, so all classes share one stream. Stream 0 is the host's own ring.
fn inter_stream(map: &HostMap, c: usize) -> usize {
    if map.even() {
        1 + c
    } else {
        1
    }
}

/// Class `c`'s ring across hosts (its carrier on every host) and the tag
/// base of its passes.
fn class_ring(map: &HostMap, c: usize) -> (Vec<usize>, u32) {
    (
        (0..map.hosts()).map(|g| map.carrier(g, c)).collect(),
        TAG_INTER.wrapping_add(TAG_CLASS.wrapping_mul(c as u32)),
    )
}

/// When each unit `(c, s)` (class `c`, slice `s`) of the passes across
/// hosts starts, and its priority: each unit at its `ready` tick or
/// `cadence` after the previous unit of its stream, whichever is later,
/// so a stream never has more than `depth` units in flight. `ready[c][s]`
/// is `None` for a unit no host has.
fn inter_starts(map: &HostMap, ready: &[Vec<Option<u64>>], cadence: u64) -> Vec<Vec<(u64, i64)>> {
    let classes = ready.len();
    let slices = ready.iter().map(Vec::len).max().unwrap_or(0);
    let mut at = vec![vec![(0u64, 0i64); slices]; classes];
    // The units of each stream in the order they start.
    let streams: Vec<Vec<(usize, usize)>> = if map.even() {
        (0..classes)
            .map(|c| (0..slices).map(|s| (c, s)).collect())
            .collect()
    } else {
        vec![(0..slices)
            .flat_map(|s| (0..classes).map(move |c| (c, s)))
            .collect()]
    };
    for stream in streams {
        let mut prev: Option<u64> = None;
        let mut seq = 0i64;
        for (c, s) in stream {
            let Some(r) = ready[c].get(s).copied().flatten() else {
                continue;
            };
            let start = prev.map_or(r, |p| r.max(p + cadence));
            at[c][s] = (start, seq);
            prev = Some(start);
            seq += 1;
        }
    }
    at
}

/// The same as [`inter_starts`] for the phases in turn: from tick `after`,
/// class after class (no two passes at once), a pass's `slices` units
/// `cadence` apart, each spanning `hops` ticks.
fn in_turn_starts(
    classes: usize,
    slices: usize,
    (cadence, hops): (u64, u64),
    after: u64,
) -> Vec<Vec<(u64, i64)>> {
    let span = (slices as u64).saturating_sub(1) * cadence + hops;
    (0..classes)
        .map(|c| {
            (0..slices)
                .map(|s| (after + c as u64 * span + s as u64 * cadence, s as i64))
                .collect()
        })
        .collect()
}

/// Start ticks of the `units` units of the last pass inside a host:
/// `cadence` apart, the first `cadence` after `after` (the last start of
/// the host's pass before it, if any), none before its `ready` tick.
fn chained_starts(
    units: usize,
    cadence: u64,
    after: Option<u64>,
    ready: impl Fn(usize) -> u64,
) -> Vec<u64> {
    let mut prev = after;
    (0..units)
        .map(|u| {
            let r = ready(u);
            let start = prev.map_or(r, |p| r.max(p + cadence));
            prev = Some(start);
            start
        })
        .collect()
}

/// Allreduce of `count` elements on rank `rank` of `map`, slices of at
/// most `slice` elements, each phase's ring passes `depth` slices deep
/// (`ring::RingParams::depth`): reduce-scatter inside the host, a ring
/// allreduce across hosts per class, allgather inside the host. Works in
/// place too (every step reads a range before any step writes it, as the
/// ring).
///
/// Above depth 1 the phases are pipelined too (`all_reduce_phases`):
/// a slice crosses hosts as soon as every host has reduced it, and comes
/// back into the host as soon as it has crossed, while the next slices
/// are still reduced inside the host. Depth 1 (FERROCCL_PIPELINE_DEPTH=1)
/// keeps the old order: each phase whole, one after the other.
pub fn all_reduce(
    map: &HostMap,
    rank: usize,
    count: usize,
    (slice, depth): (usize, usize),
) -> Schedule {
    all_reduce_phases(map, rank, count, (slice, depth), depth > 1)
}

/// [`all_reduce`]'s phases on one timeline (`Timeline`), one after the
/// other or, when `pipelined`:
///
/// - inside each host, the units of the reduce-scatter and then those of
///   the allgather run as one stream (stream 0: both passes take `m`
///   ticks a unit over the same links), slice-major (slice 0 of every
///   class and host part first), a unit starting `ceil(m / depth)` ticks
///   after the one before, or later when its data is not ready;
/// - across hosts, unit `(c, s)` (slice `s` of class `c`'s parts) starts
///   the tick after every host has reduced slice `s` of every part of
///   class `c` (`inter_starts`), and the allgather's unit the tick after
///   every class and slice in it has crossed.
///
/// Every host computes every other host's ticks (they depend on its rank
/// count alone), so both ends of a link stamp a frame alike. Why this
/// keeps `Timeline`'s room rule over FIFOs of `depth + 1` slots: every
/// link belongs to one stream (links inside a host to stream 0, those
/// across hosts to the stream of their class), a stream's units all span
/// the same ticks and start at least `ceil(K / depth)` apart, so at most
/// `depth` units of a stream are in flight at any tick, as in one
/// pipelined ring pass, and priorities (a unit's place in its stream)
/// fall along a chain of waits as there. In turn, each phase's ticks
/// follow the phase before on this rank, class after class across hosts,
/// the order the phases always ran in.
fn all_reduce_phases(
    map: &HostMap,
    rank: usize,
    count: usize,
    (slice, depth): (usize, usize),
    pipelined: bool,
) -> Schedule {
    let (classes, hosts) = (map.classes(), map.hosts());
    let parts: Vec<Vec<Vec<Unit>>> = (0..classes)
        .map(|c| class_parts(map, count, slice, c))
        .collect();
    let slices = parts.iter().flatten().map(Vec::len).max().unwrap_or(0);
    // The units of local rank i's block on a host of m ranks (every class
    // it carries), as (class, host part, slice): slice-major when
    // pipelined, class after class in turn.
    let ids_of = |m: usize| -> Vec<Vec<(usize, usize, usize)>> {
        (0..m)
            .map(|i| {
                let mut ids = Vec::new();
                if pipelined {
                    for s in 0..slices {
                        for c in (i..classes).step_by(m) {
                            for (g, part) in parts[c].iter().enumerate() {
                                if s < part.len() {
                                    ids.push((c, g, s));
                                }
                            }
                        }
                    }
                } else {
                    for c in (i..classes).step_by(m) {
                        for (g, part) in parts[c].iter().enumerate() {
                            ids.extend((0..part.len()).map(|s| (c, g, s)));
                        }
                    }
                }
                ids
            })
            .collect()
    };
    let h = map.host_of[rank];
    let host = &map.members[h];
    let m = host.len();
    let ids = ids_of(m);
    let units = ids.iter().map(Vec::len).max().unwrap_or(0);
    let inside_hops = |m: usize| pass_hops(Pass::ReduceScatter, m);
    let cadence = super::ring::cadence(inside_hops(m), depth);
    let across_hops = pass_hops(Pass::AllReduce, hosts);
    let across_cadence = super::ring::cadence(across_hops, depth);
    // Across hosts: when each unit starts, and (pipelined) the tick after
    // slice s of class c is reduced on every host (a host of m ranks
    // reduces its unit u over ticks u * cadence .. u * cadence + m - 1;
    // hosts of one size alike).
    let mut reduced: Vec<Vec<Option<u64>>> = vec![vec![None; slices]; classes];
    let across_at = if pipelined {
        let mut sizes: Vec<usize> = map.members.iter().map(Vec::len).collect();
        sizes.sort_unstable();
        sizes.dedup();
        for &size in &sizes {
            let other;
            let size_ids = if size == m {
                &ids
            } else {
                other = ids_of(size);
                &other
            };
            let hops = inside_hops(size);
            let cadence = super::ring::cadence(hops, depth);
            for b in size_ids {
                for (u, &(c, _, s)) in b.iter().enumerate() {
                    let done = u as u64 * cadence + hops;
                    let r = &mut reduced[c][s];
                    *r = Some(r.map_or(done, |r| r.max(done)));
                }
            }
        }
        inter_starts(map, &reduced, across_cadence)
    } else {
        let first_done = units
            .checked_sub(1)
            .map_or(0, |last| last as u64 * cadence + inside_hops(m));
        in_turn_starts(classes, slices, (across_cadence, across_hops), first_done)
    };
    let all_crossed = across_at
        .iter()
        .flatten()
        .map(|&(t, _)| t + across_hops)
        .max()
        .unwrap_or(0);
    let crossed = |c: usize, s: usize| match (pipelined, hosts > 1) {
        (false, _) => all_crossed,
        (true, true) => across_at[c][s].0 + across_hops,
        (true, false) => reduced[c][s].unwrap_or(0),
    };

    let mut timeline = Timeline::default();
    let blocks: Vec<Vec<Unit>> = ids
        .iter()
        .map(|b| b.iter().map(|&(c, g, s)| parts[c][g][s]).collect())
        .collect();
    let pos = map.local[rank];
    let inside = |pass, local, tag_base| RingPass {
        members: host,
        pos,
        blocks: &blocks,
        pass,
        local,
        tag_base,
    };
    inside(Pass::ReduceScatter, Operand::Input, TAG_INTRA_FIRST).stamp(
        &mut timeline,
        |u| (u as u64 * cadence, u as i64),
        0,
    );
    for (c, p) in parts.iter().enumerate() {
        if hosts == 1 || map.carrier(h, c) != rank {
            continue;
        }
        let (ring, tag_base) = class_ring(map, c);
        let across = RingPass {
            members: &ring,
            pos: h,
            blocks: p,
            pass: Pass::AllReduce,
            local: Operand::Output,
            tag_base,
        };
        across.stamp(&mut timeline, |s| across_at[c][s], inter_stream(map, c));
    }
    // The allgather's units after the reduce-scatter's, each once every
    // class and slice in it has crossed.
    let last_first = units.checked_sub(1).map(|last| last as u64 * cadence);
    let starts = chained_starts(units, cadence, last_first, |u| {
        ids.iter()
            .filter_map(|b| b.get(u))
            .map(|&(c, _, s)| crossed(c, s))
            .max()
            .unwrap_or(0)
    });
    inside(Pass::AllGather, Operand::Output, TAG_INTRA_LAST).stamp(
        &mut timeline,
        |u| (starts[u], (units + u) as i64),
        0,
    );
    timeline.into_schedule()
}

/// Allgather of `count` elements a rank into block `rank` of every rank's
/// output, on rank `rank` of `map`: across hosts first (class `c` is the
/// blocks of the ranks of local index `c`; its ring runs through the
/// carriers of `c`), then inside the host, each rank passing on the
/// blocks it gathered; passes `depth` slices deep, as [`all_reduce`]'s,
/// and above depth 1 the two phases pipelined as there: a slice passes
/// through the host as soon as it has crossed hosts.
pub fn all_gather(
    map: &HostMap,
    rank: usize,
    count: usize,
    (slice, depth): (usize, usize),
) -> Schedule {
    let mut timeline = Timeline::default();
    let (classes, hosts) = (map.classes(), map.hosts());
    let h = map.host_of[rank];
    let host = &map.members[h];
    let m = host.len();
    let slice = slice.max(1);
    let slices = count.div_ceil(slice);
    let pipelined = depth > 1;
    // The units of rank d's block: slices of its input, at block d of the
    // output.
    let block_of = |d: usize| -> Vec<Unit> {
        (0..slices)
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
    // Across hosts every unit is ready at once.
    let across_hops = pass_hops(Pass::AllGather, hosts);
    let across_cadence = super::ring::cadence(across_hops, depth);
    let across_at = if pipelined {
        inter_starts(map, &vec![vec![Some(0); slices]; classes], across_cadence)
    } else {
        in_turn_starts(classes, slices, (across_cadence, across_hops), 0)
    };
    for (c, at) in across_at.iter().enumerate() {
        if map.carrier(h, c) != rank {
            continue;
        }
        let (ring, tag_base) = class_ring(map, c);
        // A host with fewer than c + 1 ranks relays class c: no block.
        let blocks: Vec<Vec<Unit>> = (0..hosts)
            .map(|g| member_of_class(g, c).map_or_else(Vec::new, block_of))
            .collect();
        let local = if member_of_class(h, c) == Some(rank) {
            Operand::Input
        } else {
            Operand::Output
        };
        let across = RingPass {
            members: &ring,
            pos: h,
            blocks: &blocks,
            pass: Pass::AllGather,
            local,
            tag_base,
        };
        let stream = if pipelined { inter_stream(map, c) } else { 1 };
        across.stamp(&mut timeline, |s| at[s], stream);
    }
    let crossed = |c: usize, s: usize| across_at[c][s].0 + across_hops;
    // Inside the host, local rank i passes on every block of the classes
    // it carries, from every host: slice-major when pipelined (slice 0 of
    // every block first), block after block in turn.
    let ids: Vec<Vec<(usize, usize)>> = (0..m)
        .map(|i| {
            let mine: Vec<usize> = (0..map.ranks())
                .filter(|&d| map.local[d] % m == i)
                .collect();
            if pipelined {
                (0..slices)
                    .flat_map(|s| mine.iter().map(move |&d| (d, s)))
                    .collect()
            } else {
                mine.iter()
                    .flat_map(|&d| (0..slices).map(move |s| (d, s)))
                    .collect()
            }
        })
        .collect();
    let blocks: Vec<Vec<Unit>> = ids
        .iter()
        .map(|b| b.iter().map(|&(d, s)| block_of(d)[s]).collect())
        .collect();
    let units = blocks.iter().map(Vec::len).max().unwrap_or(0);
    let cadence = super::ring::cadence(pass_hops(Pass::AllGather, m), depth);
    // In turn: after the last pass across hosts ends.
    let all_crossed = (0..classes)
        .flat_map(|c| (0..slices).map(move |s| (c, s)))
        .map(|(c, s)| crossed(c, s))
        .max()
        .unwrap_or(0);
    let starts = chained_starts(units, cadence, None, |u| {
        if pipelined {
            ids.iter()
                .filter_map(|b| b.get(u))
                .map(|&(d, s)| crossed(map.local[d], s))
                .max()
                .unwrap_or(0)
        } else {
            all_crossed
        }
    });
    RingPass {
        members: host,
        pos: map.local[rank],
        blocks: &blocks,
        pass: Pass::AllGather,
        local: Operand::Output,
        tag_base: TAG_INTRA_LAST,
    }
    .stamp(&mut timeline, |u| (starts[u], u as i64), 0);
    timeline.into_schedule()
}

/// Tag base of the reduce-scatter's transfers (a frame's tag is this plus
/// the tick it is sent at).
const TAG_SCATTER: u32 = 0x4000_0000;

/// Where rank `rank` stands in the chain of destination `d` of a
/// reduce-scatter on `map`: the chain starts on the host after `d`'s,
/// walks every host in host order and ends at `d`; on each host it enters
/// at local index `j + 1` and leaves from local index `j` (both modulo the
/// host's rank count), `j` being `d`'s local index, walking the host's
/// ranks in local order in between. `prefix[x]` is the rank count of
/// hosts `0..x` (one more entry than hosts).
struct ChainPos {
    /// Hop number: the chain's `k`-th rank (0 sends first, `n - 1` is `d`).
    k: usize,
    /// The rank before, or [`NO_PEER`] at the start.
    prev: usize,
    /// The rank after, or [`NO_PEER`] at the end.
    next: usize,
}

impl HostMap {
    /// Ranks of the hosts strictly between host `from` and host `to`
    /// going forward (`from + 1 ..= to - 1`, modulo the host count).
    fn ranks_between(&self, prefix: &[usize], from: usize, to: usize) -> usize {
        let h = self.hosts();
        let n = self.ranks();
        let (a, b) = ((from + 1) % h, to % h);
        // Hosts a..b (exclusive of b) in cyclic order.
        if a <= b {
            prefix[b] - prefix[a]
        } else {
            n - prefix[a] + prefix[b]
        }
    }

    fn chain_pos(&self, prefix: &[usize], d: usize, rank: usize) -> ChainPos {
        let n = self.ranks();
        let h = self.hosts();
        let (hd, j) = (self.host_of[d], self.local[d]);
        let (g, i) = (self.host_of[rank], self.local[rank]);
        let m = self.members[g].len();
        // Ranks walked before entering host g.
        let before = if g == hd {
            n - m
        } else {
            self.ranks_between(prefix, hd, g)
        };
        let t = (i + m - (j + 1) % m) % m;
        let k = before + t;
        let next = if k + 1 == n {
            NO_PEER
        } else if t + 1 < m {
            self.members[g][(i + 1) % m]
        } else {
            let nh = (g + 1) % h;
            let nm = self.members[nh].len();
            self.members[nh][(j + 1) % nm]
        };
        let prev = if k == 0 {
            NO_PEER
        } else if t > 0 {
            self.members[g][(i + m - 1) % m]
        } else {
            let ph = (g + h - 1) % h;
            let pm = self.members[ph].len();
            self.members[ph][j % pm]
        };
        ChainPos { k, prev, next }
    }

    fn prefix(&self) -> Vec<usize> {
        let mut prefix = vec![0];
        for m in &self.members {
            prefix.push(prefix.last().copied().unwrap_or(0) + m.len());
        }
        prefix
    }

    /// Whether every host has the same rank count.
    fn even(&self) -> bool {
        self.members.iter().all(|m| m.len() == self.largest())
    }
}

/// The tick each destination's chain starts at in a reduce-scatter on
/// `map` (hop `k` of chain `d` runs at tick `start[d] + k`), chosen so
/// that no link carries two frames in one tick: `Timeline`'s condition
/// for running on slots of two frames without deadlock.
///
/// On even hosts every chain starts at 0: rank `(g, i)` then serves at
/// tick `k` exactly one chain (the one of local index `i - 1 - k mod m`,
/// its host `k / m + 1` hosts back), so it sends one frame a tick, and a link
/// carries at most one. On uneven hosts chains of destinations whose
/// local indices agree modulo a small host would meet on that host's
/// links; there each chain, in rank order, starts at the first tick at
/// which none of its hops meets a hop already placed (`O(n^2)` to build,
/// against `O(n)` a slice on even hosts).
fn chain_starts(map: &HostMap, prefix: &[usize]) -> Vec<u64> {
    if map.even() {
        return vec![0; map.ranks()];
    }
    first_free_starts(map, prefix)
}

/// [`chain_starts`] by search alone: each chain, in rank order, at the
/// first tick where none of its hops meets one placed before.
fn first_free_starts(map: &HostMap, prefix: &[usize]) -> Vec<u64> {
    let n = map.ranks();
    let mut busy: std::collections::HashSet<(usize, usize, u64)> = std::collections::HashSet::new();
    let mut starts = Vec::with_capacity(n);
    for d in 0..n {
        // The chain's links, in hop order.
        let mut order = vec![0usize; n];
        for r in 0..n {
            order[map.chain_pos(prefix, d, r).k] = r;
        }
        let links: Vec<(usize, usize)> = order.windows(2).map(|w| (w[0], w[1])).collect();
        let mut start = 0u64;
        while links
            .iter()
            .enumerate()
            .any(|(k, &(a, b))| busy.contains(&(a, b, start + k as u64)))
        {
            start += 1;
        }
        for (k, &(a, b)) in links.iter().enumerate() {
            busy.insert((a, b, start + k as u64));
        }
        starts.push(start);
    }
    starts
}

/// Reduce-scatter on rank `rank` of `map`: the input holds one block of
/// `count` elements per rank, and rank `d`'s output gets the reduction of
/// every rank's block `d`; slices of at most `slice` elements. In place
/// the caller points the output at block `rank` of the one buffer (as for
/// the ring): a rank reads block `d` only in `d`'s chain, where `d` itself
/// comes last.
///
/// Every destination `d` has a chain through all ranks that ends at `d`,
/// carrying the partial sum inside frames (`RecvReduceSend`), so nothing
/// needs scratch space. The chain of a destination of local index `j`
/// enters every host at local index `j + 1`, walks the host's ranks over
/// the links inside it and leaves from local index `j` for the next host
/// (see `ChainPos`): it is the ring reduce-scatter's chain on a ring `R_j`
/// whose host segments start at `j + 1` and end at `j`. On `h` hosts of
/// `m` ranks the chains of `R_j` cross the network from `(g, j)` to
/// `(g + 1, j + 1)`, one connection per local index, and together a host
/// sends `n - m` blocks out (the least a reduce-scatter can: one partial
/// sum for every rank elsewhere), where the flat ring sends `n - 1`
/// through one rank at the host's edge. It is reduce-scatter inside each
/// host, then across hosts, pipelined, with the ring's `n - 1` hops.
pub fn reduce_scatter(
    map: &HostMap,
    rank: usize,
    count: usize,
    (slice, depth): (usize, usize),
) -> Schedule {
    let n = map.ranks();
    let slice = slice.max(1);
    let slices = count.div_ceil(slice);
    let mut out = Schedule::default();
    if n == 1 {
        if count > 0 {
            out.push(Step::local(Prim::Copy, Operand::Input, 0, 0, count));
        }
        return out;
    }
    let prefix = map.prefix();
    let starts = chain_starts(map, &prefix);
    // Ticks one slice's pass spans; slice `s + 1` starts `span / depth`
    // ticks after slice `s` (pipelined as `ring` pipelines its slices; the
    // older slice first within a tick). Tags number the hop as if the
    // passes ran one after the other, so they stay unique per link.
    let span = starts.iter().copied().max().unwrap_or(0) + n as u64;
    let cadence = super::ring::cadence(span, depth);
    let pos: Vec<ChainPos> = (0..n).map(|d| map.chain_pos(&prefix, d, rank)).collect();
    let mut timeline = Timeline::default();
    for s in 0..slices {
        let (rel, len) = slice_of((0, count), s, slice);
        for (d, p) in pos.iter().enumerate() {
            let hop = s as u64 * span + starts[d] + p.k as u64;
            let tick = s as u64 * cadence + starts[d] + p.k as u64;
            let prim = if p.k == 0 {
                Prim::Send
            } else if p.k + 1 == n {
                Prim::RecvReduceCopy
            } else {
                Prim::RecvReduceSend
            };
            let tag = |t: u64| TAG_SCATTER.wrapping_add(t as u32);
            timeline.at(
                tick,
                s as i64,
                d,
                Step {
                    prim,
                    local: Operand::Input,
                    send_to: p.next,
                    recv_from: p.prev,
                    input: d * count + rel,
                    output: rel,
                    len,
                    send_tag: tag(hop),
                    recv_tag: tag(hop.wrapping_sub(1)),
                    channel: 0,
                },
            );
        }
    }
    timeline.into_schedule()
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
        (channels, depth): (usize, usize),
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
        // One slot more than the passes' depth: the least they fit in.
        sim::run_with(
            &schedules,
            &inputs,
            &mut outputs,
            in_place,
            depth + 1,
            sim::add_f32,
        )?;
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
                    for (in_place, ch, depth) in [(false, 1, 1), (true, 1, 3), (false, 3, 2)] {
                        let outs = run(
                            &map,
                            |r| all_reduce(&map, r, count, (slice, depth)),
                            count,
                            count,
                            in_place,
                            (ch, depth),
                        )
                        .unwrap_or_else(|e| {
                            panic!("{sizes:?} count {count} slice {slice} depth {depth}: {e}")
                        });
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

    /// Deeper pipelines, over the fewest slots they fit in (`depth + 1`):
    /// the pipelined phases (`all_reduce_phases`, the pipelined
    /// `all_gather`) on every layout, against the f64 reference, and the
    /// same bits as the phases in turn (each unit is combined in the same
    /// order, whenever it runs).
    #[test]
    fn pipelined_phases_match_the_phases_in_turn_at_any_depth() {
        for sizes in layouts() {
            let map = HostMap::from_sizes(&sizes);
            let n = map.ranks();
            for (count, slice) in [(157usize, 3usize), (64, 1), (9, 1000)] {
                for depth in [2usize, 4, 7] {
                    let what = format!("{sizes:?} count {count} slice {slice} depth {depth}");
                    let piped = run(
                        &map,
                        |r| all_reduce(&map, r, count, (slice, depth)),
                        count,
                        count,
                        depth % 2 == 0,
                        (1, depth),
                    )
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let in_turn = run(
                        &map,
                        |r| all_reduce_phases(&map, r, count, (slice, depth), false),
                        count,
                        count,
                        false,
                        (1, depth),
                    )
                    .unwrap_or_else(|e| panic!("{what} in turn: {e}"));
                    for (r, (p, t)) in piped.iter().zip(&in_turn).enumerate() {
                        for i in 0..count {
                            let want: f64 = (0..n).map(|q| value(q, i)).sum();
                            assert_eq!(p[i], want, "{what}: rank {r} element {i}");
                            assert_eq!(p[i].to_bits(), t[i].to_bits(), "{what}: rank {r}");
                        }
                    }
                    let gathered = run(
                        &map,
                        |r| all_gather(&map, r, count, (slice, depth)),
                        count,
                        count * n,
                        false,
                        (1, depth),
                    )
                    .unwrap_or_else(|e| panic!("{what} allgather: {e}"));
                    for (r, o) in gathered.iter().enumerate() {
                        for d in 0..n {
                            for i in 0..count {
                                assert_eq!(o[d * count + i], value(d, i), "{what}: rank {r}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// The phases overlap above depth 1, and only there: on 2 hosts of 4
    /// ranks with several slices, a carrier starts crossing hosts before
    /// its host's reduce-scatter ends and passes the first crossed slices
    /// on inside its host before the last crossing ends (allgather:
    /// inside the host before crossing ends); at depth 1 every step across
    /// hosts comes after every step of the first phase and before every
    /// step of the last.
    #[test]
    fn phases_overlap_when_pipelined() {
        let map = HostMap::from_sizes(&[4, 4]);
        let (count, slice) = (4096, 64);
        for rank in 0..map.ranks() {
            let piped = all_reduce(&map, rank, count, (slice, 4));
            let in_turn = all_reduce(&map, rank, count, (slice, 1));
            let first_phase_end = |s: &Schedule| {
                s.steps
                    .iter()
                    .rposition(|st| {
                        (TAG_INTRA_FIRST..TAG_INTER).contains(&st.send_tag.max(st.recv_tag))
                    })
                    .unwrap_or(0)
            };
            let last_phase_start = |s: &Schedule| {
                s.steps
                    .iter()
                    .position(|st| st.send_tag.max(st.recv_tag) >= TAG_INTRA_LAST)
                    .unwrap_or(0)
            };
            let across = |s: &Schedule| -> (usize, usize) {
                let ks: Vec<usize> = s
                    .steps
                    .iter()
                    .enumerate()
                    .filter(|(_, st)| {
                        (TAG_INTER..TAG_INTRA_LAST).contains(&st.send_tag.max(st.recv_tag))
                    })
                    .map(|(k, _)| k)
                    .collect();
                (ks[0], ks[ks.len() - 1])
            };
            let (a0, a1) = across(&piped);
            assert!(
                a0 < first_phase_end(&piped),
                "rank {rank}: crossing waits for the whole reduce-scatter"
            );
            assert!(
                last_phase_start(&piped) < a1,
                "rank {rank}: the allgather waits for every crossing"
            );
            let (b0, b1) = across(&in_turn);
            assert!(
                first_phase_end(&in_turn) < b0 && b1 < last_phase_start(&in_turn),
                "rank {rank} in turn"
            );
            let gather = all_gather(&map, rank, count, (slice, 4));
            let ((g0, g1), inside) = (across(&gather), last_phase_start(&gather));
            assert!(
                g0 < inside && inside < g1,
                "rank {rank}: allgather phases in turn"
            );
            let gather = all_gather(&map, rank, count, (slice, 1));
            let ((_, g1), inside) = (across(&gather), last_phase_start(&gather));
            assert!(g1 < inside, "rank {rank}: allgather at depth 1 overlaps");
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
            let schedules: Vec<Schedule> = (0..n)
                .map(|r| all_reduce(&map, r, count, (17, 1)))
                .collect();
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
                    for (ch, depth) in [(1, 1), (1, 3), (3, 2)] {
                        let outs = run(
                            &map,
                            |r| all_gather(&map, r, count, (slice, depth)),
                            count,
                            count * n,
                            false,
                            (ch, depth),
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
            |r| all_reduce(&map, r, count, (3, 3)),
            count,
            count,
            false,
            (1, 3),
        )
        .unwrap();
        for i in 0..count {
            let want: f64 = (0..n).map(|r| value(r, i)).sum();
            assert!(outs.iter().all(|o| o[i] == want), "element {i}");
        }
        let outs = run(
            &map,
            |r| all_gather(&map, r, 5, (2, 1)),
            5,
            5 * n,
            false,
            (1, 1),
        )
        .unwrap();
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
                .flat_map(|&r| all_reduce(&map, r, count, (10, 1)).steps)
                .filter(|s| s.prim.sends() && map.host_of[s.send_to] != h)
                .map(|s| s.len)
                .sum()
        };
        let hosts = 2;
        assert_eq!(leaving(0), 2 * (hosts - 1) * count / hosts);
        assert_eq!(leaving(1), leaving(0));
    }

    /// Block `d` of rank `r`'s reduce-scatter input: the test's values
    /// at the element's place in the whole input.
    fn scatter_want(n: usize, count: usize, d: usize, i: usize) -> f64 {
        (0..n).map(|r| value(r, d * count + i)).sum()
    }

    /// Reduce-scatter on `map` for `count` elements a rank: every rank's
    /// result (out of place: its output; in place: block `rank` of its
    /// buffer, where the caller points the output) against the f64 sum.
    fn check_reduce_scatter(
        map: &HostMap,
        count: usize,
        slice: usize,
        in_place: bool,
        (ch, depth): (usize, usize),
    ) {
        let n = map.ranks();
        let build = |r: usize| {
            let mut s = reduce_scatter(map, r, count, (slice, depth));
            if in_place {
                for step in &mut s.steps {
                    step.output += r * count;
                }
            }
            s
        };
        let what = format!(
            "{map:?} count {count} slice {slice} in place {in_place} channels {ch} depth {depth}"
        );
        let outs = run(map, build, count * n, count, in_place, (ch, depth))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        for (r, o) in outs.iter().enumerate() {
            let at = if in_place { r * count } else { 0 };
            for i in 0..count {
                assert_eq!(
                    o[at + i],
                    scatter_want(n, count, r, i),
                    "{what}: rank {r} element {i}"
                );
            }
        }
    }

    /// Reduce-scatter on every layout: rank r's result is the f64 sum of
    /// every rank's block r (values exact in f32), out of place, in place
    /// and over 3 channels, with no deadlock on FIFOs of two frames.
    #[test]
    fn reduce_scatter_sums_each_block_on_every_layout() {
        for sizes in layouts() {
            let map = HostMap::from_sizes(&sizes);
            for count in [0usize, 1, 7, 40] {
                for slice in [1usize, 3, 1000] {
                    for (in_place, ch, depth) in [(false, 1, 1), (true, 1, 3), (false, 3, 2)] {
                        check_reduce_scatter(&map, count, slice, in_place, (ch, depth));
                    }
                }
            }
        }
    }

    /// Interleaved hosts, and larger layouts sampled (even ones up to 256
    /// ranks, uneven ones up to 100), a few slices each.
    #[test]
    fn reduce_scatter_on_interleaved_and_larger_layouts() {
        let interleaved = HostMap::from_ids(&[0, 1, 0, 1, 2, 0, 2]);
        for (in_place, ch) in [(false, 1), (true, 1), (false, 2)] {
            check_reduce_scatter(&interleaved, 9, 4, in_place, (ch, 2));
        }
        let mixed = HostMap::from_ids(&[3, 1, 1, 2, 3, 3, 0, 2, 1, 3, 0]);
        check_reduce_scatter(&mixed, 5, 2, true, (1, 3));
        for sizes in [
            vec![8; 32],
            vec![32; 8],
            vec![2; 100],
            vec![20, 13, 31, 7, 25],
            vec![1, 40, 3, 40],
        ] {
            check_reduce_scatter(&HostMap::from_sizes(&sizes), 3, 2, false, (1, 2));
        }
    }

    /// The chain starts the proof gives on even hosts (all 0) are what the
    /// search finds too: no two hops of one link share a tick.
    #[test]
    fn even_hosts_need_no_search() {
        for sizes in layouts() {
            let map = HostMap::from_sizes(&sizes);
            if map.even() {
                let prefix = map.prefix();
                assert_eq!(
                    first_free_starts(&map, &prefix),
                    vec![0; map.ranks()],
                    "{sizes:?}"
                );
            }
        }
    }

    /// What leaves each host in a reduce-scatter: one partial sum for each
    /// rank elsewhere, `n - m` blocks (the flat ring sends `n - 1`), over
    /// one connection per local index on even hosts.
    #[test]
    fn reduce_scatter_sends_each_host_n_minus_m_blocks() {
        for sizes in layouts() {
            let map = HostMap::from_sizes(&sizes);
            let n = map.ranks();
            let count = 10;
            for h in 0..map.hosts() {
                let steps: Vec<Step> = map
                    .members(h)
                    .iter()
                    .flat_map(|&r| reduce_scatter(&map, r, count, (3, 1)).steps)
                    .filter(|s| s.prim.sends() && map.host_of[s.send_to] != h)
                    .collect();
                let m = map.members(h).len();
                let sent: usize = steps.iter().map(|s| s.len).sum();
                assert_eq!(sent, (n - m) * count, "{sizes:?} host {h}");
                if map.even() && map.hosts() > 1 {
                    let mut senders: Vec<usize> = steps
                        .iter()
                        .map(|s| map.local[s.send_to] + m * map.host_of[s.send_to])
                        .collect();
                    senders.sort_unstable();
                    senders.dedup();
                    assert_eq!(senders.len(), m, "{sizes:?} host {h}: connections");
                }
            }
        }
    }
}
