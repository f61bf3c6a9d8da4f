//! The host half of the planner: for a call in host memory, which
//! algorithm it runs, how its slices are cut, and whether its bytes go
//! through the transport's slots, inline in a check-in on the shared
//! control pages, directly between windows, or straight out of the peers'
//! processes (cross-memory attach); and, for each decision, the reason it
//! gives at FERROCCL_DEBUG=INFO. The algorithm and slices serve device
//! calls too (the device executor runs the same schedules).
//!
//! Every decision here is a pure function of the call (kind, bytes, where
//! its memory lives), of facts every rank of the communicator shares (rank
//! count, control pages, cross-memory attach, windows, a forced algorithm,
//! the agreed link model) and, after a check-in, of what every rank
//! announced. So every rank decides alike, without talking. `exec` carries a
//! decision out and decides nothing; `tune` holds the cost model this module
//! asks about algorithms. No I/O, no clock, no `unsafe`.

use super::tune::{self, HostLinks, Layout};
use crate::algo::Algorithm;
use crate::call::{CollKind, Geometry, Memory};
use crate::error::{Error, Result};
use crate::reduce::Store;

/// Calls whose input has at most this many bytes travel inline in the
/// check-in wherever the ranks share control pages and no algorithm is
/// forced, whatever the communicator's size and windows: the floor of
/// every [`inline_limit`] but a 2-rank allgather's with windows
/// ([`WINDOW_ALLGATHER_INLINE_BYTES`]).
pub(crate) const INLINE_BYTES: usize = 4096;

/// The inline limit of an allgather on 2 ranks once the communicator has
/// a shared window: above it the path between windows (each rank stores
/// its block straight into the peer's output) beat the inline exchange,
/// 1.6-1.8x at 4 KiB of input and 1.2x at 2 KiB, and lost at 1 KiB
/// (0.87-0.89x with the limit at 512 B; docs/performance-log.md, "A 2-rank
/// allgather of 1-4 KiB between windows").
pub(crate) const WINDOW_ALLGATHER_INLINE_BYTES: usize = 1024;

/// The largest input any call runs inline with, but an all-to-all, which
/// puts only its peers' blocks on the page ([`alltoall_inline_bytes`]);
/// the most a rank puts on its control page's inline space in one call
/// (`exec::checkin::INLINE_CAPACITY`) is this or an all-to-all's area on
/// 3 to 8 ranks ([`WIDE_ALLTOALL_INLINE_AREA`]), the larger.
pub(crate) const INLINE_MAX_BYTES: usize = 16 << 10;

/// The most ranks on which a broadcast, reduce, reduce-scatter, allgather
/// or all-to-all runs inline up to [`INLINE_MAX_BYTES`], and an allreduce
/// up to [`WIDE_ALLREDUCE_INLINE_BYTES`] (see [`inline_limit`]); measured
/// on 3, 4 and 8.
pub(crate) const INLINE_WIDE_MAX_RANKS: usize = 8;

/// The inline limit of an all-to-all on 2 to [`INLINE_WIDE_MAX_RANKS`]
/// ranks (on 2 ranks without windows; with them [`INLINE_MAX_BYTES`]:
/// [`windows_inline_limit`]): each rank puts on its page only the blocks
/// its peers take, `(size - 1) / size` of its input, so the input may be
/// `size / (size - 1)` times the area (`exec::inline::on_page`): 32 KiB
/// on 2 ranks with an area of 16 KiB (and with it, until 2026-12-07,
/// 24 KiB on 3, 21,845 bytes on 4, 18,724 on 8). Against the
/// slots on the AMD EPYC VM, in paired turns: 2 ranks at 32 KiB 1.65-1.86
/// µs against 1.95-2.64 (6 of 6, medians 1.68 against 2.03; the slots
/// read 0.81x Intel MPI there), 4 ranks at 20 KiB 5.7-6.3 against
/// 12.1-18.8 (6 of 6, medians 2.1x), 3 ranks at 24 KiB 5.4-6.1 against
/// 9.3-11.6 (5 of 5, medians 1.9x) (docs/performance-log.md, "The 2-rank
/// all-to-all inline to 32 KiB").
///
/// On 3 to 8 ranks the area is [`WIDE_ALLTOALL_INLINE_AREA`] instead:
/// 36 KiB of input on 3 ranks, 32 KiB on 4, 28,086 bytes on 8.
fn alltoall_inline_bytes(size: usize) -> usize {
    inline_page_bytes(CollKind::AllToAll, size) * size / size.saturating_sub(1).max(1)
}

/// The most an inline all-to-all on 3 to [`INLINE_WIDE_MAX_RANKS`] ranks
/// puts on a rank's page (the blocks its peers take, packed from the
/// area's start: `exec::inline::on_page`), above the 16 KiB of every
/// other inline call: past the inline limit the staging areas take the
/// all-to-all, two meetings a chunk, and were 2x slower than the inline
/// exchange just below the limit on 4 ranks (20 KiB, 5.7-6.3 against
/// 12.1-18.8 µs). On the AMD EPYC VM, in turns against the 16 KiB area
/// (`bench/ab.sh`, gated, four turns, 2,000 calls a size): 4 ranks at 24
/// and 32 KiB 1.76x and 1.89x (32 KiB: 11.6 -> 6.1 µs, where Intel MPI
/// took 9.1-9.3), 3 ranks at 32 KiB 1.70x, 8 ranks at 24 KiB 1.52x; 16,
/// 48 and 64 KiB, which no limit moved past, level; 2 ranks, which keep
/// 16 KiB (32 KiB of input; at 48 KiB the inline exchange and the slots
/// were level), level (docs/performance-log.md, "The all-to-all inline to
/// 32 KiB on 4 ranks").
pub(crate) const WIDE_ALLTOALL_INLINE_AREA: usize = 24 << 10;

/// The most an inline `kind` call on `size` ranks may put on a rank's
/// page: [`WIDE_ALLTOALL_INLINE_AREA`] for an all-to-all on 3 to
/// [`INLINE_WIDE_MAX_RANKS`] ranks, [`INLINE_MAX_BYTES`] for every other
/// (`exec::inline::next_place` moves the page's inline cursor by the
/// input up to it).
pub(crate) fn inline_page_bytes(kind: CollKind, size: usize) -> usize {
    if kind == CollKind::AllToAll && (3..=INLINE_WIDE_MAX_RANKS).contains(&size) {
        WIDE_ALLTOALL_INLINE_AREA
    } else {
        INLINE_MAX_BYTES
    }
}

/// The inline limit of an allreduce on 3 to [`INLINE_WIDE_MAX_RANKS`]
/// ranks, windows or not (see [`inline_limit`]).
pub(crate) const WIDE_ALLREDUCE_INLINE_BYTES: usize = 8 << 10;

/// The largest input of a `kind` call that runs inline in the check-in,
/// given `facts`: one exchange, each rank copying its input onto its page
/// and reading what it needs from the peers' pages (`exec::inline`), in
/// place of a schedule through slots.
///
/// On 2 ranks inline wins past 4 KiB for some calls (`bench/ab.sh`, this
/// build against the one before, 2 ranks, turn by turn; docs/performance-log.md,
/// "Inline up to 16 KiB on 2 ranks"): allreduce 1.3-1.5x faster out of
/// place and 2.4-2.5x in place at 8 and 16 KiB, reduce 1.2-1.3x and
/// broadcast 1.15-1.2x there, allgather 1.3-1.8x at 16 KiB gathered (8 KiB
/// of input); level from 32 KiB, behind from 64 KiB (one rank reads all
/// of the other's input across cores). So the allgather stopped at 8 KiB
/// of input until, on the AMD EPYC VM, 16 KiB of input inline measured
/// faster than the slots in 9 of 10 alternating turns, 1.13x out of
/// place and 1.11x in place by the medians (the slots' own turns spread
/// by 1.17x), and 12 KiB in 6 of 6 (docs/performance-log.md, "Probes on
/// the AMD VM"); it now runs inline to 16 KiB like the others. A
/// reduce-scatter (whose input is the whole vector) was 0.8-0.9x at 8 and
/// 16 KiB while every rank put its whole input on its page; since each
/// puts only the block its peer reduces
/// (`exec::inline`, 2026-12-01) it runs inline to 16 KiB as well: in turns
/// against 4 KiB, in both orders, 1.29x at 8 KiB out of place and
/// 1.10-1.15x in place, 1.16-1.25x and 1.00-1.11x at 16 KiB
/// (docs/performance-log.md, "The 2-rank reduce-scatter and all-to-all
/// inline to 16 KiB").
/// An all-to-all, whose output is no larger than its input and whose
/// ranks put on their pages only the block the peer takes, went inline
/// up to 8 KiB as the allgather; at 16 KiB inline measured 1.16-1.19x
/// faster than the slots in turns, both orders (same entry), so it ran
/// inline to 16 KiB too, and since 2026-12-05 to 32 KiB
/// ([`alltoall_inline_bytes`]).
///
/// On 3 to [`INLINE_WIDE_MAX_RANKS`] ranks a broadcast, reduce,
/// reduce-scatter, allgather and all-to-all keep 16 KiB, windows or not
/// (see [`windows_inline_limit`]): the schedules through slots they
/// replace pass the data on in several steps, a wait each, where the
/// inline exchange is one. Against 4 KiB at 8 and 16 KiB of input, in
/// turns (docs/performance-log.md, "Larger calls inline on 3 to 8 ranks"):
/// broadcast 3.0-3.7x on 3 ranks, 4.5-7.0x on 4 and 6.9-9.1x on 8; reduce
/// 3.0-4.1x, 3.0-6.8x and 3.9-6.5x; reduce-scatter 1.13-1.25x, 1.36-2.17x
/// and 2.45-2.56x; allgather 1.13-1.29x on 3 ranks (up to 11 KiB of
/// input), 1.08-1.67x on 4 and 2.22-2.63x on 8; all-to-all 1.61-1.91x,
/// 1.41-2.14x and 3.50-3.73x; 32 KiB (through slots in both) level. An
/// allreduce, where every rank reads every peer's whole input, stops at
/// [`WIDE_ALLREDUCE_INLINE_BYTES`] there: on 4 ranks 16 KiB measured
/// 0.92-1.13x against 4 KiB, but 8 KiB, where the ring through slots takes
/// 2(N - 1) steps and the path between windows two meetings against
/// inline's one, measured in turns against 4 KiB (docs/performance-log.md,
/// "An allreduce of 8 KiB inline on 3 to 8 ranks") 1.59x out of place and
/// 2.31x in place on 4 ranks with ordinary buffers, 1.40x and 1.31x
/// between windows; on 3 ranks 1.40x and 1.39x, 1.61x and 1.53x; on 8
/// 1.58x and 1.56x, 1.25x and 1.24x. Above 8 ranks, not measured, every
/// call keeps 4 KiB.
pub(crate) fn inline_limit(kind: CollKind, facts: &Facts) -> usize {
    if facts.size == 2 && facts.windows {
        if let Some(limit) = windows_inline_limit(kind) {
            return limit;
        }
    }
    limit_without_windows(kind, facts.size)
}

/// [`inline_limit`] of a `kind` call on `size` ranks where windows do not
/// lower it.
pub(crate) fn limit_without_windows(kind: CollKind, size: usize) -> usize {
    match (size, kind) {
        (2..=INLINE_WIDE_MAX_RANKS, CollKind::AllToAll) => alltoall_inline_bytes(size),
        (
            2..=INLINE_WIDE_MAX_RANKS,
            CollKind::Broadcast | CollKind::Reduce | CollKind::ReduceScatter | CollKind::AllGather,
        )
        | (2, CollKind::AllReduce) => INLINE_MAX_BYTES,
        (3..=INLINE_WIDE_MAX_RANKS, CollKind::AllReduce) => WIDE_ALLREDUCE_INLINE_BYTES,
        _ => INLINE_BYTES,
    }
}

/// From how many bytes of input a `kind` call whose buffers lie in windows
/// runs directly between them ([`after_check_in`]); `None` where `kind`
/// has no path between windows.
///
/// Every collective but send/recv and the barrier has one. The all-to-all
/// has had its own since 2026-12-05 (each rank writes block j of its input
/// into its block of rank j's output, [`Direct::AllToAll`]): until then an
/// all-to-all in a window only checked in and went through slots anyway,
/// and from 32 KiB it read 0.68-1.29x the best peer between windows on the
/// AMD EPYC VM where the bare program of its copies read 1.4-6.1x
/// (docs/performance-log.md, "The all-to-all against the peers, and
/// between windows").
///
/// Below the threshold a call takes its usual route. Between windows every
/// rank checks in and waits for every other to finish: two meetings of all
/// ranks, where a broadcast or reduce through slots only waits on its
/// neighbours in the chain or tree. On 4 ranks over 2 cores (every
/// meeting a process switch) that made the path between windows slower
/// up to 8 KiB for a broadcast (0.72-0.75x the slots) and up to 32 KiB
/// for a reduce (0.54-0.77x), level at 32 / 128 KiB, faster from 128 /
/// 512 KiB (1.3-4.9x; docs/performance-log.md, "Broadcast and reduce
/// between windows"). The reduce's threshold has been 32 KiB as the
/// broadcast's since 2026-12-03: in turns against 128 KiB, 4 ranks, its
/// path between windows took 8.4 µs at 32 KiB against the slots' 12.4
/// (1.48x) and 8.9 against 20.2 at 64 KiB (2.26x; docs/performance-log.md,
/// "The windows column against a floor of the machine"). On 2 ranks it
/// was faster at every size above the inline limit (1.55x at 32 KiB and
/// more).
fn window_path_from(kind: CollKind, facts: &Facts) -> Option<usize> {
    match kind {
        CollKind::AllReduce
        | CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::AllToAll => Some(0),
        CollKind::Broadcast | CollKind::Reduce if facts.size <= 2 => Some(0),
        CollKind::Broadcast | CollKind::Reduce => Some(32 << 10),
        CollKind::Barrier | CollKind::SendRecv => None,
    }
}

/// The inline limit of a `kind` call on 2 ranks once the communicator has
/// a shared window, where windows lower it: the calls whose path between
/// windows beats inline from there, allreduce and reduce-scatter from 4
/// KiB, allgather from 1 KiB ([`WINDOW_ALLGATHER_INLINE_BYTES`]), and
/// all-to-all from 16 KiB, its limit before the one without windows rose
/// to 32 KiB (between windows 32 KiB took 1.11-1.17 µs a call, inline
/// 1.65-1.86; docs/performance-log.md, "The 2-rank all-to-all inline to
/// 32 KiB"); `None` for the others, which keep their limit. A broadcast
/// or reduce keeps its 2-rank limit with windows: inline, its root or
/// senders leave as
/// soon as their data is on their page (`early_return`), which the path
/// between windows, a check-in and a wait for every rank to finish,
/// cannot match at those sizes. On 3 to 8 ranks windows lower nothing:
/// there the inline exchange beat the path between windows at 8 and
/// 16 KiB of input, reduce-scatter 1.47-1.87x and allgather 0.94-1.68x
/// (docs/performance-log.md, "Larger calls inline on 3 to 8 ranks").
fn windows_inline_limit(kind: CollKind) -> Option<usize> {
    match kind {
        CollKind::AllReduce | CollKind::ReduceScatter => Some(INLINE_BYTES),
        CollKind::AllGather => Some(WINDOW_ALLGATHER_INLINE_BYTES),
        CollKind::AllToAll => Some(INLINE_MAX_BYTES),
        _ => None,
    }
}

/// Whether a `kind` call of `in_bytes` on `size` ranks that checks in
/// because the communicator has windows (its inline limit lowered by
/// [`windows_inline_limit`]) would have run inline without them: then a
/// rank whose buffers the path between windows cannot take puts its
/// input on its page before it announces, and where no rank's buffers
/// can take that path the call runs inline after the check-in
/// (`exec::checked_in`) instead of through slots: on 2 ranks of a
/// communicator with a window, ordinary buffers' allgathers of 2 and 4
/// KiB of input took 1.17 and 1.67 µs a call with it (1.08 and 1.70
/// inline without a check-in, when their limit with windows was 4 KiB),
/// 1.77 and 2.23 through slots; allreduces of 8 and 16 KiB 2.24 and 3.34
/// against 2.95 and 3.96 through slots (docs/performance-log.md, "A
/// 2-rank allgather of 1-4 KiB between windows").
pub(crate) fn inline_after_check_in(kind: CollKind, in_bytes: usize, size: usize) -> bool {
    size == 2
        && windows_inline_limit(kind).is_some()
        && in_bytes <= limit_without_windows(kind, size)
}

/// Whether a rank's buffers of a `kind` call (the windows its input and
/// output lie in, 0 for none) are those the path between windows needs
/// ([`after_check_in`] over every rank's): an allgather's or all-to-all's
/// output, a reduce-scatter's input, an allreduce's both.
pub(crate) fn direct_capable(kind: CollKind, in_win: u64, out_win: u64) -> bool {
    match kind {
        CollKind::AllGather | CollKind::AllToAll => out_win != 0,
        CollKind::ReduceScatter => in_win != 0,
        _ => in_win != 0 && out_win != 0,
    }
}

/// Allgathers and all-to-alls whose blocks have at least this many bytes
/// copy from the peers by cross-memory attach where the ranks may. Below
/// it the slots win or tie (each `process_vm_readv` pins the peer's pages,
/// and the check-in and completion wait cost a round trip each): measured
/// on 2 ranks from blocks of 64 KiB (allgather 9.4-9.6 against 4.4-6.5
/// GB/s at 128 KiB gathered) and on 4 ranks from about 64 KiB blocks
/// (below that slower; docs/performance-history.md).
pub(crate) const CMA_MIN_BYTES: usize = 64 << 10;

/// Block sizes (bytes a rank) at which the control pages' calibration
/// may time an allgather both by cross-memory attach and through slots
/// ([`cma_probes`] keeps those that fit).
pub(crate) const CMA_PROBE_BLOCKS: [usize; 3] = [64 << 10, 512 << 10, 2 << 20];

/// Most bytes of output a rank allocates for the calibration's probes.
const CMA_PROBE_OUTPUT_BYTES: usize = 32 << 20;

/// Where the staging areas take an allgather's blocks ([`takes_spread`]),
/// the smallest block the allgather pulls, whatever the calibrated range
/// (all-to-alls, which the staging areas do not take, keep it). The
/// calibration timed pulled allgathers of 64 KiB blocks 1.1-1.2x faster
/// than staged ones on 4 ranks of the Intel VM (24.6-29.9 against
/// 30.6-33.9 µs, six calibrations, each the best of single calls), while
/// in loops of 300 calls, in turns, the staging areas were 1.18-1.45x
/// faster there (28.4 against 41.3 µs out of place), and 1.17-1.27x on 8
/// ranks; from 128 KiB blocks the two were within 0.83-1.04x on 4 ranks
/// (docs/performance-log.md, "Allgathers of 64 KiB blocks through the
/// staging areas"). The calibration's own probes (a range from 0) are
/// not held to it.
pub(crate) const STAGED_PULL_MIN_BYTES: usize = 128 << 10;

/// The blocks an allgather pulls where the staging areas would take
/// them: `range` (the calibrated one) from [`STAGED_PULL_MIN_BYTES`] at
/// the least; a range from 0 (the calibration's probes) as it is.
pub(crate) fn staged_pull_range((from, upto): (usize, usize)) -> (usize, usize) {
    match from.max(STAGED_PULL_MIN_BYTES) {
        _ if from == 0 => (from, upto),
        from if from <= upto => (from, upto),
        _ => NO_CMA,
    }
}

/// The blocks of [`CMA_PROBE_BLOCKS`] a calibration on `facts.size` ranks
/// times: those whose gathered output fits in 32 MiB and the pull may take
/// at all (below the streaming-store bound of `takes_cma`: a probe above
/// it would time the slots twice).
pub(crate) fn cma_probes(facts: &Facts) -> Vec<usize> {
    let n = facts.size.max(1);
    CMA_PROBE_BLOCKS
        .into_iter()
        .filter(|&b| b.saturating_mul(n) <= CMA_PROBE_OUTPUT_BYTES)
        .filter(|&b| {
            takes_cma(
                CollKind::AllGather,
                b,
                false,
                &Facts {
                    cma_gather: (0, usize::MAX),
                    ..*facts
                },
            )
        })
        .collect()
}

/// The blocks (bytes a rank) at which the calibration times an all-to-all
/// both pulled and through the staging areas where those take allgathers
/// and all-to-alls ([`cma_alltoall_probes`]), in ascending order.
pub(crate) const CMA_ALLTOALL_PROBE_BLOCKS: [usize; 3] = [128 << 10, 512 << 10, 1 << 20];

/// The blocks at which a calibration on `facts.size` ranks times the
/// all-to-all itself: those of [`CMA_ALLTOALL_PROBE_BLOCKS`] whose
/// buffers fit in 32 MiB and that the pull may take at all (not where the
/// staging areas stream the output, [`takes_cma`], whatever the
/// last-level cache: on 8 ranks the smallest alone), where allgathers of
/// pulled sizes go through the staging areas (4 to 8 ranks,
/// [`takes_spread`]); none elsewhere, where the all-to-all keeps the
/// allgathers' range (on 2 and 3 ranks both weigh the pull against slots).
///
/// The 128 KiB probe since 2026-12-07: on the Intel VM of model 207 the
/// pull beat the staging areas from the smallest blocks it takes (4
/// ranks, against `FERROCCL_CALIBRATE=0`, which pulls from
/// [`CMA_MIN_BYTES`]: 1.83x at 64 KiB blocks, 1.50x at 128 KiB, 1.28x at
/// 256 KiB; 8 ranks 1.30-1.47x from 64 KiB to 512 KiB blocks), while the
/// two larger probes opened the range at 512 KiB: a 512 KiB all-to-all on
/// 4 ranks ran at 0.54x Open MPI. With it, 1.71x there and 1.29x at 1
/// MiB; 8 ranks 1.38-1.47x from 1 to 4 MiB; the start-up level (4 ranks
/// 210-233 against 229-233 ms, 8 ranks 544-648 against 571-685)
/// (docs/performance-log.md, "The Intel VM's table after the week on the
/// AMD VM").
///
/// Since 2026-12-06 the all-to-all's probes weigh the pull against the
/// staging areas, which take all-to-alls up to
/// [`SPREAD_ALLTOALL_MAX_BYTES`] there. On 4 ranks of the AMD EPYC VM, in
/// eight start-ups, the pull took 390-698 µs at 512 KiB blocks and
/// 938-1,577 at 1 MiB, the staging areas 315-574 and 854-1,456: the range
/// opened at 512 KiB (and closed there) in two, at 1 MiB by a tie in two,
/// and never in four. Past that size the pull keeps its range from
/// [`CMA_MIN_BYTES`] ([`takes_cma`]). What follows is
/// from before, when an all-to-all there went through pairwise slots,
/// which copy each block into a slot and out of it: the allgathers'
/// probes weighed the pull against the staging areas, which the
/// all-to-all did not take. On 4 ranks of the AMD EPYC
/// VM the allgathers' probes chose "never" in every calibration, and
/// all-to-alls of 4-16 MiB ran through slots at 0.50-0.76x Intel MPI, while
/// pulled they took 1.3-1.8x less time (docs/performance-log.md, "The
/// all-to-all against the peers, and between windows"). At 1 MiB blocks
/// the pull won in six calibrations of six (1.5-1.8x); with that probe
/// alone the range opened there, and 512 KiB blocks went through slots.
/// On a later instance of that VM (2026-12-06) 512 KiB blocks (a 2 MiB
/// all-to-all on 4 ranks) took 334-447 µs pulled against 457-570 through
/// slots in five turns of five, and 256 KiB blocks 149-172 through slots
/// against 156-288 pulled: so 512 KiB is probed too. The choice at 512
/// KiB flips between start-ups (there the pull lost in one calibration of
/// four on the earlier instance, in one of six on this one); beside the 1
/// MiB probe such a loss only moves the range's start to 1 MiB, where
/// with 512 KiB as the one probe it would be "never". A tie counts as a
/// win (the pull is the all-to-all's range without a calibration), and
/// the range opens at the smaller block that wins upwards (`cma_range`).
/// The buffers are the larger probe's (4 MiB on 4 ranks), as before.
pub(crate) fn cma_alltoall_probes(facts: &Facts) -> Vec<usize> {
    let n = facts.size.max(1);
    // Where the staging areas stream, not probed whatever the cache (as
    // if it were unknown): on 8 ranks of the 2-core Intel VM the two
    // larger probes took the start-up from 0.53-0.62 to 0.85-1.01 s.
    let probing = Facts {
        cma_alltoall: (0, usize::MAX),
        llc_bytes: 0,
        ..*facts
    };
    CMA_ALLTOALL_PROBE_BLOCKS
        .into_iter()
        .filter(|&block| {
            let staged = takes_spread(CollKind::AllGather, block, facts);
            let fits = block.saturating_mul(n) <= CMA_PROBE_OUTPUT_BYTES;
            staged && fits && takes_cma(CollKind::AllToAll, block * n, false, &probing)
        })
        .collect()
}

/// A pull wins a probe when it takes at most this share of the slots'
/// time.
const CMA_WIN: f64 = 0.95;

/// Where pulling by cross-memory attach won, from `(bytes, pull µs,
/// slots µs)` in ascending sizes (an allgather's blocks, a broadcast's
/// buffer): from the smallest probe it won (by 5% or more) over the wins
/// in a row from there, an inclusive range; open above (`usize::MAX`)
/// where that run reaches the largest probe; [`NO_CMA`] where it won
/// none. A tie (the pull neither 5% faster nor 5% slower) counts as a win at the
/// sizes of `keep`, the range the call pulls over without a calibration
/// (a broadcast's [`cma_broadcast_default`]; [`NO_CMA`] for the
/// allgathers): there one timing of single calls says nothing against
/// what loops measured. On the Intel VM of 2026-12-02 a 2-rank
/// broadcast's probes tied at 64 KiB in about half the calibrations
/// (pull 4.5-5.5 µs, slots 4.4-5.8), which moved the range to 512 KiB
/// alone or to none, while in loops of 1,000 calls, in turns, the pull
/// took 8.6-10.2 µs at 128 KiB against the slots' 11.0-15.7, and 27-35
/// at 512 KiB against 42-58 (docs/performance-log.md, "Small broadcasts
/// through the staging area in 32 KiB chunks").
///
/// Where the pull wins depends on the machine and the call. Allgathers:
/// on the earlier Intel build machine from 64 KiB blocks, on the AMD VM
/// of 2026-11-29 only from about 2 MiB (2 ranks, 128 KiB gathered: 12.9
/// against 9.4 µs through slots; 4 MiB: 422 against 741-788). A run that
/// stops short of the largest probe closes the range there: before
/// 2026-12-01 one slow turn at the largest probe (the 2 MiB allgather on
/// the Intel VM of 2026-12-01 measured 229-275 µs pulled against
/// 333-432 through slots in seven of ten calibrations, and 394-449 pulled
/// in the other three) cost the pull at every size. Broadcasts: through slots the root's copy
/// into a slot and the receiver's copy out of it run at once on two
/// cores, where a pull is one kernel copy on the receiver; on that Intel
/// VM the pull won 1.14-1.69x from 64 to 512 KiB on 2 ranks and lost
/// 0.37-0.71x at 1 and 2 MiB, and on 4 ranks over its 2 cores it lost
/// 0.74-0.93x at every size (three receivers pull while the root waits);
/// on an earlier machine it lost at 2 and 8 MiB on 2 ranks
/// (docs/performance-log.md, "Broadcast out of the root's process").
pub(crate) fn cma_range(probes: &[(usize, f64, f64)], keep: (usize, usize)) -> (usize, usize) {
    let mut range = NO_CMA;
    for (k, &(bytes, pull, slots)) in probes.iter().enumerate() {
        // A win by less than 5% is a tie on a shared machine: the slots,
        // every other call's path, keep it, unless the pull is the path
        // without a calibration there.
        let tie = pull * CMA_WIN < slots;
        if pull <= slots * CMA_WIN || (tie && (keep.0..=keep.1).contains(&bytes)) {
            let upto = if k + 1 == probes.len() {
                usize::MAX
            } else {
                bytes
            };
            range = (range.0.min(bytes), upto);
        } else if range != NO_CMA {
            break;
        }
    }
    range
}

/// The empty range of [`cma_range`]: the call never pulls.
pub(crate) const NO_CMA: (usize, usize) = (usize::MAX, 0);

/// The allgather and all-to-all blocks that pull before (or without:
/// FERROCCL_CALIBRATE=0) the calibration: from [`CMA_MIN_BYTES`] up.
pub(crate) const CMA_GATHER_DEFAULT: (usize, usize) = (CMA_MIN_BYTES, usize::MAX);

/// The broadcast sizes that pull the root's input before (or without:
/// FERROCCL_CALIBRATE=0) the calibration: on 2 ranks from
/// [`CMA_MIN_BYTES`] to 512 KiB, where the pull won 1.14-1.69x on the
/// Intel VM of 2026-12-01 (and lost from 1 MiB); on more ranks never (on
/// 4 ranks over 2 cores it lost at every size). See [`cma_range`].
pub(crate) fn cma_broadcast_default(size: usize) -> (usize, usize) {
    if size == 2 {
        (CMA_MIN_BYTES, 512 << 10)
    } else {
        NO_CMA
    }
}

/// The 2-rank allreduces of ordinary buffers (bytes of input, an
/// inclusive range) that run by cross-memory attach where the ranks may
/// read and write each other's memory and each has a CPU
/// (`Control::cma_push`): each rank pulls its half of the peer's input,
/// reduces it with its own and writes the result into its output and the
/// peer's (`exec::pull`), two kernel copies of half the buffer a rank
/// where the slots copy every byte three times. From 512 KiB: on the
/// Intel VM of model 207 it won 1.14-1.91x from 64 KiB to 8 MiB on
/// buffers reused call after call (nccl-tests' way), but in rounds that
/// read the output and rewrite the input first, as a training step does,
/// it lost 1.1-1.4x out of place below 512 KiB (the peer's output lines
/// then sit in the peer's cache and each write fetches them), was level
/// at 512 KiB and won 1.02-1.57x from 1 MiB (docs/performance-log.md,
/// "A 2-rank allreduce in halves"). Level with the slots at 16 MiB.
/// See [`cma_allreduce_default`]; the calibration at creation keeps the
/// part of it where the halves measured no slower
/// ([`cma_allreduce_range`]).
pub(crate) const CMA_ALLREDUCE: (usize, usize) = (512 << 10, 8 << 20);

/// The allreduces that run by cross-memory attach on `size` ranks whose
/// ranks may write into each other (`push`): [`CMA_ALLREDUCE`] on 2
/// ranks, none elsewhere (with more ranks each would pull from and write
/// into every peer, `size - 1` calls for a share of `1 / size`).
pub(crate) fn cma_allreduce_default(size: usize, push: bool) -> (usize, usize) {
    if size == 2 && push {
        CMA_ALLREDUCE
    } else {
        NO_CMA
    }
}

/// The allreduce sizes (bytes of input, [`CMA_PROBE_BLOCKS`] within
/// [`CMA_ALLREDUCE`]) at which the control pages' calibration times a
/// 2-rank allreduce out of place both in halves and through slots, on
/// `size` ranks that may write into each other (`push`) and stream their
/// stores only from `nt_store_bytes` of output: none where
/// [`cma_allreduce_default`] gives none.
pub(crate) fn cma_allreduce_probes(size: usize, push: bool, nt_store_bytes: usize) -> Vec<usize> {
    let (from, upto) = cma_allreduce_default(size, push);
    CMA_PROBE_BLOCKS
        .into_iter()
        .filter(|b| (from..=upto).contains(b))
        .filter(|&b| slot_store(true, b, nt_store_bytes) == Store::Cached)
        .collect()
}

/// The allreduces that run in halves after the calibration timed them
/// (`(bytes, halves µs, slots µs)` in ascending sizes, from
/// [`cma_allreduce_probes`]): [`cma_range`] of the probes, a tie counting
/// for the halves (the route measured without a calibration), held within
/// [`CMA_ALLREDUCE`]. Where the kernel's copies between processes are
/// slow the halves lose: on the AMD EPYC VM of 2026-12-04 they took
/// 1.6-2.1x as long as the slots from 512 KiB to 8 MiB (80.7 against 43.8
/// µs at 512 KiB, 337 against 186 at 2 MiB), and its calibration pulled
/// an allgather's blocks only at 512 KiB and a broadcast never
/// (docs/performance-log.md, "The halves calibrated").
pub(crate) fn cma_allreduce_range(probes: &[(usize, f64, f64)]) -> (usize, usize) {
    let (from, upto) = cma_range(probes, CMA_ALLREDUCE);
    let (from, upto) = (from.max(CMA_ALLREDUCE.0), upto.min(CMA_ALLREDUCE.1));
    if from <= upto {
        (from, upto)
    } else {
        NO_CMA
    }
}

/// What the communicator knows about its ranks that every rank knows
/// alike: the facts a route depends on besides the call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Facts {
    /// Ranks in the communicator.
    pub(crate) size: usize,
    /// The ranks share control pages (one host, shared memory allowed).
    pub(crate) control: bool,
    /// Every rank may read every other's memory (`process_vm_readv`).
    pub(crate) cma: bool,
    /// The communicator has a shared window: any call may lie in one.
    pub(crate) windows: bool,
    /// FERROCCL_ALGO forces this algorithm (then no call skips its
    /// schedule: not inline, not by cross-memory attach).
    pub(crate) forced: Option<Algorithm>,
    /// Hosts the ranks are on, and the largest host's rank count.
    pub(crate) layout: Layout,
    /// A user algorithm runs the call being routed (`algo::user`: an
    /// allreduce, allgather or reduce-scatter): it skips no schedule.
    pub(crate) user: bool,
    /// `Config::nt_store_bytes`: from where outputs are written with
    /// streaming stores (0: never).
    pub(crate) nt_store_bytes: usize,
    /// The host slots' size (`Config::chunk_bytes`), which slices a
    /// broadcast or reduce (and so its modelled cost).
    pub(crate) chunk_bytes: usize,
    /// The blocks of an allgather pulled by cross-memory attach, an
    /// inclusive range: from `CMA_MIN_BYTES` up until the control pages'
    /// calibration measures it ([`cma_range`]; [`NO_CMA`]: never).
    pub(crate) cma_gather: (usize, usize),
    /// The blocks of an all-to-all pulled by cross-memory attach: the
    /// allgathers' range, but where allgathers go through the staging
    /// areas, measured for the all-to-all itself
    /// ([`cma_alltoall_probes`]).
    pub(crate) cma_alltoall: (usize, usize),
    /// Broadcasts of this many bytes (an inclusive range) copy the root's
    /// input out of its process, as the calibration measured
    /// ([`cma_range`]); [`NO_CMA`] where it did not run or the slots won.
    pub(crate) cma_broadcast: (usize, usize),
    /// Allreduces of this many bytes (an inclusive range) run by
    /// cross-memory attach ([`cma_allreduce_default`]; [`NO_CMA`]: never).
    pub(crate) cma_allreduce: (usize, usize),
    /// Some host has more ranks than CPUs, agreed by every rank at the
    /// calibration (`tune::cost_us`); false without it.
    pub(crate) shared_cores: bool,
    /// `Config::spread`: large broadcasts on 3 or more ranks may run
    /// through the root's staging area ([`takes_spread`]).
    pub(crate) spread: bool,
    /// Allreduces of up to this many bytes run recursive doubling where
    /// the model would run the ring: what the control pages' calibration
    /// measured ([`doubling_until`]); 0 before it, or without it.
    pub(crate) doubling: usize,
    /// The host's last-level cache in bytes (`topo::last_level_cache_bytes`;
    /// 0 where unknown): the staging areas' streaming stores take an
    /// all-to-all from the pull only where all ranks' buffers pass it
    /// ([`takes_cma`]).
    pub(crate) llc_bytes: usize,
}

/// How a call starts, decided from the call alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Through the transport's slots by its schedule; `note`: first say
    /// so on this rank's control page, so that a peer that checks in for
    /// this call instead (it was given another call) reports the mismatch
    /// instead of waiting for the timeout.
    Slots {
        /// Store the call's fingerprint on the control page first.
        note: bool,
    },
    /// All in one check-in: the input travels on the control page.
    Inline,
    /// Check in, then decide from every rank's announcement
    /// ([`after_check_in`]); `cma`: announce the input's address, the
    /// peers may copy out of this process; `spread`: a broadcast that
    /// does not run between windows goes through its root's staging area
    /// ([`takes_spread`]).
    CheckIn {
        /// The call may run by cross-memory attach.
        cma: bool,
        /// A broadcast of ordinary buffers runs through the root's
        /// staging area, which every receiver reads (never with `cma`).
        spread: bool,
    },
}

impl Route {
    /// Why, in words, for the INFO log.
    pub(crate) fn explain(self) -> &'static str {
        match self {
            Route::Slots { note: false } => "through the transport's slots",
            Route::Slots { note: true } => {
                "through the transport's slots (noted on the shared control page for mismatch \
                 checks)"
            }
            Route::Inline => "inline in the check-in on the shared control pages, one exchange",
            Route::CheckIn { cma: true, .. } => {
                "check-in, then straight out of the peers' processes (cross-memory attach) or \
                 directly between windows"
            }
            Route::CheckIn { spread: true, .. } => {
                "check-in, then through the staging areas on the control pages (a broadcast's \
                 root's, every rank's in an allgather or allreduce), or directly between windows"
            }
            Route::CheckIn { .. } => {
                "check-in, then directly between windows where every rank's buffers lie in one"
            }
        }
    }
}

/// The route of a call of `kind` whose input has `in_bytes` bytes in
/// `memory`, in place or not. Device memory takes `plan::device`'s path, never a route: here
/// it is an error before any byte moves.
#[inline]
pub(crate) fn route(
    kind: CollKind,
    in_bytes: usize,
    in_place: bool,
    memory: Memory,
    facts: &Facts,
) -> Result<Route> {
    if let Memory::Device { .. } = memory {
        // Device calls take the device half's path
        // (`plan::device::path`) before a route is asked for.
        return Err(device_unsupported(kind, memory));
    }
    // Send/recv involves two ranks, not the communicator: it never checks
    // in (the others would wait for it).
    if kind == CollKind::SendRecv || !facts.control {
        return Ok(Route::Slots { note: false });
    }
    if facts.user
        && matches!(
            kind,
            CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter
        )
    {
        // The user algorithm runs it, windows or not.
        return Ok(Route::Slots { note: true });
    }
    let free = facts.forced.is_none();
    if free && in_bytes <= inline_limit(kind, facts) {
        return Ok(Route::Inline);
    }
    let cma = free && facts.cma && takes_cma(kind, in_bytes, in_place, facts);
    let spread = free && !cma && takes_spread(kind, in_bytes, facts);
    let between_windows =
        facts.windows && window_path_from(kind, facts).is_some_and(|min| in_bytes >= min);
    if cma || spread || between_windows {
        return Ok(Route::CheckIn { cma, spread });
    }
    Ok(Route::Slots { note: true })
}

/// The smallest broadcast that runs through its root's staging area on 4
/// to [`SPREAD_MAX_RANKS`] ranks ([`takes_spread`]): above every inline
/// limit.
pub(crate) const SPREAD_MIN_BYTES: usize = INLINE_MAX_BYTES + 1;

/// The smallest broadcast that runs through its root's staging area on 3
/// ranks, where the chain copies the buffer 4 times against the staging
/// area's 3 and passes it on in two steps. On the 2-core Intel VM, in two
/// runs of turns (the staging area's speed over the chain's): 32 KiB to 4
/// MiB 0.82-1.68x, below 1 in 13 of 24 cells (2 MiB in all four:
/// 0.86-0.98x); 8 MiB 1.17-1.64x, 32 MiB 1.58-1.62x
/// (docs/performance-log.md, "Broadcast through one staging area").
pub(crate) const SPREAD_MIN_BYTES_3: usize = 8 << 20;

/// The smallest allreduce that runs through the staging areas on 4 to 8
/// ranks ([`takes_spread`]). Each rank stages its input chunk by chunk,
/// reduces its piece of each chunk out of every rank's slot and puts the
/// result back in its own, and copies every peer's reduced piece out:
/// per rank S written to stage, S read to reduce, S/N written and S read
/// back, where the ring through slots copies 2(N-1)/N of the input into and
/// out of a slot at every one of its 2(N - 1) steps. On the 2-core Intel
/// VM, in turns against the ring (docs/performance-log.md, "Allreduce
/// through the staging areas"): 4 ranks 8 KiB 0.88-0.93x, 16 KiB
/// 1.22-1.31x, 32 KiB to 8 MiB 0.77-1.60x (three runs; below 1 in 7 of
/// 38 cells, 128 KiB out of place in two runs of three: 0.77 and 0.85,
/// 1.30 in the third), 32 MiB out of place 0.78-0.79x
/// (the output written with ordinary stores, where the ring streams it);
/// 8 ranks 1.07-1.75x from 16 KiB to 4 MiB.
pub(crate) const SPREAD_REDUCE_MIN_BYTES: usize = 16 << 10;

/// The largest allreduce that runs through the staging areas
/// ([`SPREAD_REDUCE_MIN_BYTES`]).
pub(crate) const SPREAD_REDUCE_MAX_BYTES: usize = 8 << 20;

/// The largest block (an allgather's input) that runs through the staging
/// areas ([`takes_spread`]). Each rank stages its block and copies every
/// peer's out: N + N(N - 1) block copies with the own output's, where the
/// ring through slots copies each block into and out of a slot at every
/// hop, N(2N - 1). On the 2-core Intel VM, against the ring (cross-memory
/// attach off in both; docs/performance-log.md, "Broadcast through one
/// staging area"): 4 ranks 1.24-1.58x from 32 to 512 KiB blocks, level at
/// 2 MiB (1.00-1.04x), 0.86-1.57x at 8 MiB; 8 ranks 1.47-2.38x from 32 KiB
/// to 2 MiB blocks. On 3 ranks 0.79-1.21x from 21 KiB to 5 MiB blocks, level
/// within the noise: 3 ranks keep the ring.
pub(crate) const SPREAD_GATHER_MAX_BYTES: usize = 2 << 20;

/// The largest all-to-all (a rank's whole input) that runs through the
/// staging areas ([`takes_spread`]) where it does not pull: the largest
/// measured. Each rank stages the blocks it sends, slice by slice, and
/// copies its own out of every peer's staging area: two copies of each
/// byte, as through pairwise slots, but with no step waiting for one
/// peer at a time. On 4 ranks of the 2-core AMD EPYC VM, five gated turns
/// against the build before (slots below the pull's range, the pull in
/// it; the calibration weighing the pull against the route it replaces
/// in both): 1.12-1.30x from 64 KiB to 8 MiB, no size slower; the bare
/// programs of the traffic (`bench/bound/staged_alltoall.c` against
/// `cma_alltoall.c`) took 58-98 against 86-130 µs at 128 KiB blocks and
/// 2.1-3.3 against 2.2-3.8 ms at 2 MiB blocks (docs/performance-log.md,
/// "The 4-rank all-to-all at its bare program, and through the staging
/// areas"). Above it the pull or the slots, whose receiver streams a large
/// output, as before.
pub(crate) const SPREAD_ALLTOALL_MAX_BYTES: usize = 8 << 20;

/// The most ranks a broadcast runs through its root's staging area on
/// ([`takes_spread`]); measured on 3, 4 and 8.
pub(crate) const SPREAD_MAX_RANKS: usize = INLINE_WIDE_MAX_RANKS;

/// Whether a `kind` call of `in_bytes` on `facts.size` ranks that share
/// control pages runs, where its buffers do not lie in windows and it
/// does not pull, through the staging areas on the control pages
/// (`exec::spread`; `Config::spread`): an allgather on 4 to
/// [`SPREAD_MAX_RANKS`] ranks whose blocks are above the inline limit and
/// at most [`SPREAD_GATHER_MAX_BYTES`], every rank staging its block and
/// reading every peer's; an allreduce of [`SPREAD_REDUCE_MIN_BYTES`] to
/// [`SPREAD_REDUCE_MAX_BYTES`] on 4 to [`SPREAD_MAX_RANKS`] ranks, each
/// rank reducing its piece of every chunk; an all-to-all above the inline
/// limit and up to [`SPREAD_ALLTOALL_MAX_BYTES`] on 4 to
/// [`SPREAD_MAX_RANKS`] ranks, each rank staging the blocks it sends and
/// reading its own out of every peer's area; a broadcast above the inline
/// limit on 4 to [`SPREAD_MAX_RANKS`] ranks, from [`SPREAD_MIN_BYTES_3`]
/// on 3. The root
/// copies its input once into the staging area and every other rank
/// copies it once out of it, N copies of the buffer, where the chain
/// through pairwise slots copies it 2(N - 1) times (each rank but the
/// last out of one slot and into the next). On 2 ranks both are two
/// copies, and the slots' pipelined pair stays. On the 2-core Intel VM,
/// 4 ranks, `bench/bound/spread.c` (only that traffic, both ways) took
/// 4.4 against 5.4 µs at 32 KiB, 79 against 125 at 512 KiB and 6.6-7.5
/// against 8.6-12.7 ms at 32 MiB (docs/performance-log.md, "Broadcast
/// through one staging area").
pub(crate) fn takes_spread(kind: CollKind, in_bytes: usize, facts: &Facts) -> bool {
    if !facts.spread || !(3..=SPREAD_MAX_RANKS).contains(&facts.size) {
        return false;
    }
    match kind {
        CollKind::Broadcast => {
            in_bytes
                >= if facts.size == 3 {
                    SPREAD_MIN_BYTES_3
                } else {
                    SPREAD_MIN_BYTES
                }
        }
        CollKind::AllGather => {
            facts.size >= 4 && (SPREAD_MIN_BYTES..=SPREAD_GATHER_MAX_BYTES).contains(&in_bytes)
        }
        CollKind::AllReduce => {
            facts.size >= 4
                && (SPREAD_REDUCE_MIN_BYTES..=SPREAD_REDUCE_MAX_BYTES).contains(&in_bytes)
        }
        CollKind::AllToAll => {
            facts.size >= 4 && (SPREAD_MIN_BYTES..=SPREAD_ALLTOALL_MAX_BYTES).contains(&in_bytes)
        }
        _ => false,
    }
}

/// Whether a `kind` call of `in_bytes` runs inline ([`route`] says
/// [`Route::Inline`]) wherever the ranks share control pages and neither a
/// forced algorithm nor a user algorithm takes it, whatever the facts that
/// change during a communicator's life (its windows, the calibrated
/// cross-memory-attach threshold): the caller of a small call can skip
/// gathering them. Every inline limit is at least [`INLINE_BYTES`], but a
/// 2-rank allgather's with windows, [`WINDOW_ALLGATHER_INLINE_BYTES`].
#[inline]
pub(crate) fn always_inline(kind: CollKind, in_bytes: usize) -> bool {
    let floor = if kind == CollKind::AllGather {
        WINDOW_ALLGATHER_INLINE_BYTES
    } else {
        INLINE_BYTES
    };
    kind != CollKind::SendRecv && in_bytes <= floor
}

/// Whether `rank` reads `peer`'s announcement in an inline call of
/// `kind` (root `root`) before it leaves the call: every rank reads every
/// other's, but with `early_return` (`Config::early_return`) a
/// broadcast's receivers read only the root's (all they need), and the
/// root and a reduce's senders read none (they need nothing of their
/// peers and leave once their input is on their page). The receivers and
/// the reduce's root find a mismatch with the root or a sender in the
/// call; a rank that leaves without reading the ranks that read it
/// ([`leaves_early`]) compares their announcements later
/// (`exec::checkin::confirm_left`), so a mismatch fails a later call of
/// its own, naming this one.
pub(crate) fn reads_inline(
    kind: CollKind,
    rank: usize,
    peer: usize,
    root: usize,
    early_return: bool,
) -> bool {
    if !early_return {
        return true;
    }
    match kind {
        CollKind::Broadcast => rank != root && peer == root,
        CollKind::Reduce => rank == root,
        _ => true,
    }
}

/// Whether `rank` leaves an inline call of `kind` (root `root`) without
/// reading the announcements of the ranks that read its own: a
/// broadcast's root and a reduce's senders ([`reads_inline`]).
pub(crate) fn leaves_early(kind: CollKind, rank: usize, root: usize, early_return: bool) -> bool {
    if !early_return {
        return false;
    }
    match kind {
        CollKind::Broadcast => rank == root,
        CollKind::Reduce => rank != root,
        _ => false,
    }
}

pub(crate) fn device_unsupported(kind: CollKind, memory: Memory) -> Error {
    Error::InvalidArgument(format!(
        "{}: buffers in {memory:?} reached a path that moves host memory only",
        kind.name()
    ))
}

/// Whether a call of `kind` whose input has `in_bytes` may run by
/// cross-memory attach on `size` ranks: an allgather or all-to-all whose
/// blocks (an allgather's whole input, one of an all-to-all's `size`) lie
/// in `facts.cma_gather` (from `CMA_MIN_BYTES` up, or as measured at
/// creation: [`cma_range`]), and whose output the slots would write
/// with ordinary stores too ([`slot_store`]: in place, or below
/// `nt_store_bytes`). Beyond that the slots win: their receiver writes the
/// output with streaming stores, while the kernel's copy reads every line
/// of the output before writing it. On the 2-core build machine a 2-rank
/// allgather of 32 / 64 MiB took 5.2-5.7 / 11.1-12.4 ms through slots
/// against 11.4-12.3 / 22.0-22.6 ms pulled, and still 7.3-8.8 / 16.7-18.6
/// ms pulled into a buffer in cache and streamed out from there
/// (docs/performance-log.md, "Cross-memory attach and streaming stores").
/// A broadcast pulls within the range the calibration measured it to win
/// (`facts.cma_broadcast`: [`cma_range`]), its output (the
/// receiver's buffer, `in_bytes`) under the same streaming-store bound,
/// and a 2-rank allreduce within `facts.cma_allreduce` under it too.
/// An allgather whose blocks the staging areas would take pulls from
/// [`STAGED_PULL_MIN_BYTES`] at the least. An all-to-all past
/// [`SPREAD_ALLTOALL_MAX_BYTES`] on ranks whose staging areas take
/// smaller ones pulls from [`CMA_MIN_BYTES`] blocks whatever the
/// calibration said: its probes weighed the pull against the staging
/// areas, not against the slots that take those sizes otherwise (on 4
/// ranks of the AMD EPYC VM all-to-alls of 4-16 MiB pulled took 1.3-1.8x
/// less time than through slots). One the staging areas take and write
/// with streaming stores ([`direct_store`]: all ranks' buffers together
/// at twice `nt_store_bytes`) past the last-level cache (`facts.llc_bytes`,
/// or where it is unknown) never pulls, whatever the probes (at smaller
/// blocks, where nothing streams) said: on 4 ranks of that VM (a 32 MiB
/// L3) at 8 MiB, five turns, staged 2,090-2,192 µs against 3,191-3,646
/// pulled, by the start-ups' own choice. Where the cache holds those
/// buffers the pull's copy stays in it and the probes' range holds: on 4
/// ranks of the Intel VM (a 260 MiB L3) at 8 MiB the pull took 1.42x less
/// time than the staging areas in four turns (docs/performance-log.md,
/// "The Intel VM's table after the week on the AMD VM").
fn takes_cma(kind: CollKind, in_bytes: usize, in_place: bool, facts: &Facts) -> bool {
    let (size, nt_store_bytes) = (facts.size, facts.nt_store_bytes);
    let (block, out_bytes) = match kind {
        CollKind::AllGather => (in_bytes, in_bytes.saturating_mul(size)),
        CollKind::AllToAll => (in_bytes / size.max(1), in_bytes),
        CollKind::Broadcast | CollKind::AllReduce => (in_bytes, in_bytes),
        _ => return false,
    };
    let (from, upto) = match kind {
        CollKind::Broadcast => facts.cma_broadcast,
        CollKind::AllReduce => facts.cma_allreduce,
        CollKind::AllGather if takes_spread(kind, in_bytes, facts) => {
            staged_pull_range(facts.cma_gather)
        }
        // Where the staging areas stream the output past the last-level
        // cache, they take it.
        CollKind::AllToAll
            if takes_spread(kind, in_bytes, facts)
                && staging_streams_past_cache(2 * in_bytes * size, in_place, facts) =>
        {
            NO_CMA
        }
        // Past what the staging areas take, the probes (weighed against
        // them) say nothing of the slots the pull would replace: it pulls
        // as without a calibration.
        CollKind::AllToAll
            if in_bytes > SPREAD_ALLTOALL_MAX_BYTES
                && takes_spread(kind, SPREAD_ALLTOALL_MAX_BYTES, facts) =>
        {
            CMA_GATHER_DEFAULT
        }
        CollKind::AllToAll => facts.cma_alltoall,
        _ => facts.cma_gather,
    };
    (from..=upto).contains(&block)
        && slot_store(!in_place, out_bytes, nt_store_bytes) == Store::Cached
}

/// Whether an all-to-all through the staging areas whose ranks' buffers
/// come to `buffer_bytes` writes them with streaming stores
/// ([`direct_store`]) and they pass the host's last-level cache
/// (`facts.llc_bytes`; where it is unknown, the streaming alone, the rule
/// before 2026-12-07): only there do the staging areas' streaming stores
/// beat the pull, whose copy writes with ordinary stores.
fn staging_streams_past_cache(buffer_bytes: usize, in_place: bool, facts: &Facts) -> bool {
    direct_store(
        CollKind::AllToAll,
        !in_place,
        buffer_bytes,
        facts.nt_store_bytes,
    ) == Store::Streaming
        && buffer_bytes >= facts.llc_bytes
}

/// How a checked-in call runs, decided from every rank's announcement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direct {
    /// The check-in was the whole call (a barrier).
    Done,
    /// Rank r reduces piece r of every input (window `input`) into piece r
    /// of every output (window `output`).
    AllReduce {
        /// The window every rank's input lies in.
        input: u64,
        /// The window every rank's output lies in.
        output: u64,
    },
    /// Rank r writes its input into block r of every output.
    AllGather {
        /// The window every rank's output lies in.
        output: u64,
    },
    /// Rank r writes block j of its input into block r of rank j's
    /// output, for every j (its own too).
    AllToAll {
        /// The window every rank's output lies in.
        output: u64,
    },
    /// Rank r reduces block r of every input into its output.
    ReduceScatter {
        /// The window every rank's input lies in.
        input: u64,
    },
    /// Rank r copies piece r of the root's input into piece r of every
    /// output (the root's too unless it is in place).
    Broadcast {
        /// The window the root's input lies in.
        input: u64,
        /// The window every rank's output lies in.
        output: u64,
    },
    /// Rank r reduces piece r of every input into piece r of the root's
    /// output.
    Reduce {
        /// The window every rank's input lies in.
        input: u64,
        /// The window the root's output lies in.
        output: u64,
    },
    /// Each rank copies what it needs out of the peers' processes.
    Pull,
    /// Through the staging areas (`exec::spread`): a broadcast's root
    /// copies its input through its own, every receiver out of it; an
    /// allgather's and an allreduce's ranks each through their own.
    Spread,
    /// The buffers do not allow a direct path: the schedule, through slots.
    Slots,
}

/// The direct path of a checked-in call of `kind`: `inputs` / `outputs`
/// is the window the inputs / outputs the call reads / writes lie in (None:
/// one of them is in no window, or they differ): every rank's, but for a
/// broadcast's input and a reduce's output only the root's. `cma` and
/// `spread` are what [`route`] said.
pub(crate) fn after_check_in(
    kind: CollKind,
    inputs: Option<u64>,
    outputs: Option<u64>,
    (cma, spread): (bool, bool),
) -> Direct {
    match (kind, inputs, outputs) {
        (CollKind::Barrier, _, _) => Direct::Done,
        (CollKind::AllReduce, Some(input), Some(output)) => Direct::AllReduce { input, output },
        (CollKind::AllReduce, _, _) if cma => Direct::Pull,
        (CollKind::AllReduce, _, _) if spread => Direct::Spread,
        (CollKind::AllGather, _, Some(output)) => Direct::AllGather { output },
        (CollKind::AllGather, _, None) if cma => Direct::Pull,
        (CollKind::AllGather, _, None) if spread => Direct::Spread,
        (CollKind::AllToAll, _, Some(output)) => Direct::AllToAll { output },
        (CollKind::AllToAll, _, _) if cma => Direct::Pull,
        (CollKind::AllToAll, _, _) if spread => Direct::Spread,
        (CollKind::Broadcast, Some(input), Some(output)) => Direct::Broadcast { input, output },
        (CollKind::Broadcast, _, _) if cma => Direct::Pull,
        (CollKind::Broadcast, _, _) if spread => Direct::Spread,
        (CollKind::ReduceScatter, Some(input), _) => Direct::ReduceScatter { input },
        (CollKind::Reduce, Some(input), Some(output)) => Direct::Reduce { input, output },
        _ => Direct::Slots,
    }
}

/// Whether a call of `kind` on `count` elements (the fingerprint's) on
/// `size` ranks that runs through slots must end with a confirmation, so
/// that a mismatch fails the call itself on every rank.
///
/// Every rank checks every frame it receives against its own call before
/// it uses the frame or sends anything derived from it. So a rank knows
/// that every rank ran its call once its output depends on every rank's
/// input: every such dependency is a chain of frames, each checked by its
/// receiver. That holds for an allreduce, reduce-scatter, allgather and
/// all-to-all of any algorithm, and for the barrier's two laps. It does not
/// hold for a broadcast (the root only sends; a rank hears only from the
/// ranks on its path from the root), a reduce (only the root hears from
/// everyone) or a call of no elements (no frames at all): those confirm.
/// `algo::sim::knowledge` checks this rule on every schedule. Send/recv
/// never confirms: a send returns once its data is handed to the
/// transport, and only the receiver checks it.
pub(crate) fn confirms(kind: CollKind, count: usize, size: usize) -> bool {
    size > 1
        && match kind {
            CollKind::Broadcast | CollKind::Reduce => true,
            CollKind::SendRecv | CollKind::Barrier => false,
            _ => count == 0,
        }
}

/// How a call through slots writes its output: a large output of its own
/// (out of place, at least `nt_store_bytes`; 0 turns it off) with
/// streaming stores: it would not stay in cache anyway, and ordinary stores
/// would read every line first. In place, the lines written were just read
/// as input and are in cache: streaming them out measured 30-40% slower
/// (docs/performance-history.md).
#[inline]
pub(crate) fn slot_store(out_of_place: bool, out_bytes: usize, nt_store_bytes: usize) -> Store {
    if out_of_place && nt_store_bytes > 0 && out_bytes >= nt_store_bytes {
        Store::Streaming
    } else {
        Store::Cached
    }
}

/// How a call directly between windows writes its outputs: streaming
/// stores, out of place, once the buffers of all ranks together (what the
/// direct kernels stream through: `buffer_bytes`, the call's input and
/// output extents times the ranks) reach twice the threshold: a 2-rank
/// allreduce from 16 MiB (64 MiB of buffers; measured 8.6-10.1 GB/s
/// against 3.6-11.1 with ordinary stores), an allgather from 32 MiB
/// (48 MiB of buffers at 16 MiB measured better with ordinary stores).
///
/// A broadcast streams in place too, and from an eighth of that: each
/// buffer it writes is a receiver's, which the call reads no more (the
/// root's input is only read), and its kernel streams from the root's
/// piece to every output in one pass. With the 32 MiB default that is
/// from 8 MiB of buffers summed over the ranks (`buffer_bytes` counts a
/// broadcast's one buffer twice: from 16 MiB): 2 ranks from 4 MiB, 4
/// ranks from 2 MiB. On the 2-core Intel VM, against ordinary stores:
/// 4 ranks 1.9-3.3x at 16-32 MiB, 1.14-1.26x at 2-4 MiB, 0.92x at 1 MiB;
/// 2 ranks 1.28x at 4 MiB, 0.86x at 2 MiB, 0.49x at 1 MiB
/// (docs/performance-log.md, "Broadcast streams in place").
pub(crate) fn direct_store(
    kind: CollKind,
    out_of_place: bool,
    buffer_bytes: usize,
    nt_store_bytes: usize,
) -> Store {
    let from = if kind == CollKind::Broadcast {
        (nt_store_bytes / 2).max(1)
    } else if out_of_place {
        nt_store_bytes.saturating_mul(2)
    } else {
        usize::MAX
    };
    if nt_store_bytes > 0 && buffer_bytes >= from {
        Store::Streaming
    } else {
        Store::Cached
    }
}

/// How an allreduce or reduce-scatter directly between windows writes its
/// outputs: as [`direct_store`] says, and with streaming stores also,
/// out of place, once the buffers of all ranks together reach the host's
/// last-level cache (`llc_bytes`, 0 where unknown): past it ordinary
/// stores fetch every output line from memory first and push another
/// out, where streaming stores only write. On the AMD EPYC VM (a 32 MiB
/// L3), in gated turns against ordinary stores (docs/performance-log.md,
/// "Streaming between windows past the last-level cache"): a 2-rank
/// allreduce of 8 MiB (32 MiB of buffers) 1.77x, a 4-rank one of 4 MiB
/// 1.71x, a 2-rank reduce-scatter of 16 MiB 1.58x and a 4-rank one of 8
/// MiB 2.79x; below the cache they lost (2-rank allreduce of 2 and 4 MiB
/// 0.46x and 0.48x). An allgather kept ordinary stores at every size
/// measured (0.27-0.87x streaming, to 48 MiB of buffers on 2 ranks).
pub(crate) fn direct_reduce_store(
    kind: CollKind,
    out_of_place: bool,
    buffer_bytes: usize,
    (nt_store_bytes, llc_bytes): (usize, usize),
) -> Store {
    let past_cache = matches!(kind, CollKind::AllReduce | CollKind::ReduceScatter)
        && out_of_place
        && nt_store_bytes > 0
        && llc_bytes > 0
        && buffer_bytes >= llc_bytes;
    if past_cache {
        Store::Streaming
    } else {
        direct_store(kind, out_of_place, buffer_bytes, nt_store_bytes)
    }
}

/// The algorithm a call of `bytes` runs when it goes through slots (the
/// forced one, else the model's cheapest), with every candidate's modelled
/// cost for the log. The hierarchical algorithm, forced or chosen, runs
/// only where the ranks span hosts with several on some host, and only for
/// the collectives it serves (allreduce, allgather, reduce-scatter):
/// elsewhere, the ring,
/// so that a one-host communicator keeps its path whatever FERROCCL_ALGO.
pub(crate) fn algorithm(
    kind: CollKind,
    bytes: usize,
    facts: &Facts,
    links: &HostLinks,
) -> (Algorithm, Vec<(Algorithm, f64)>) {
    let (algo, costs, _) = algorithm_why(kind, bytes, facts, links);
    (algo, costs)
}

/// [`algorithm`], and whether the calibration's measurement
/// ([`Facts::doubling`]) put recursive doubling in the model's place: the
/// log says "measured" only then, not where the model chose it itself.
pub(crate) fn algorithm_why(
    kind: CollKind,
    bytes: usize,
    facts: &Facts,
    links: &HostLinks,
) -> (Algorithm, Vec<(Algorithm, f64)>, bool) {
    let (algo, costs) = match facts.forced {
        Some(Algorithm::Hierarchical) if !hier_applies(kind, facts.layout) => {
            (Algorithm::Ring, Vec::new())
        }
        Some(forced) => (forced, Vec::new()),
        // A reduce-scatter's call names one rank's output block, an
        // allgather's one rank's input block; the model costs the whole
        // buffer, `size` blocks.
        None if matches!(kind, CollKind::ReduceScatter | CollKind::AllGather) => {
            tune::choose_on_with(
                kind,
                facts.layout,
                facts.size,
                (bytes.saturating_mul(facts.size), facts.chunk_bytes),
                links,
                facts.shared_cores,
            )
        }
        None => {
            let (algo, costs) = tune::choose_on_with(
                kind,
                facts.layout,
                facts.size,
                (bytes, facts.chunk_bytes),
                links,
                facts.shared_cores,
            );
            if doubling_measured(kind, bytes, facts, algo) {
                return (Algorithm::RecursiveDoubling, costs, true);
            }
            (algo, costs)
        }
    };
    (algo, costs, false)
}

/// Whether an allreduce of `bytes` for which the model chose `model`
/// runs recursive doubling instead, as the calibration measured
/// ([`Facts::doubling`]): only in place of the ring.
fn doubling_measured(kind: CollKind, bytes: usize, facts: &Facts, model: Algorithm) -> bool {
    kind == CollKind::AllReduce && model == Algorithm::Ring && bytes <= facts.doubling
}

/// Allreduce sizes (bytes) at which the control pages' calibration may
/// time recursive doubling against the ring ([`doubling_probe`] keeps
/// those where the two compete).
pub(crate) const DOUBLING_PROBE_BYTES: [usize; 6] =
    [8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10];

/// Whether the calibration times an allreduce of `bytes` both ways: the
/// call goes through slots in place and out of place (not inline, not by
/// cross-memory attach, not through the staging areas), and the model,
/// before any measurement, runs it by the ring there.
pub(crate) fn doubling_probe(bytes: usize, facts: &Facts, links: &HostLinks) -> bool {
    let facts = Facts {
        doubling: 0,
        ..*facts
    };
    let slots = |in_place| {
        matches!(
            route(CollKind::AllReduce, bytes, in_place, Memory::Host, &facts),
            Ok(Route::Slots { .. })
        )
    };
    facts.forced.is_none()
        && !facts.user
        && slots(false)
        && slots(true)
        && algorithm(CollKind::AllReduce, bytes, &facts, links).0 == Algorithm::Ring
}

/// The ring keeps a probe's size where it takes at most this share of
/// recursive doubling's time; in a tie recursive doubling runs.
pub(crate) const RING_WIN: f64 = 0.95;

/// Up to which size allreduces run recursive doubling where the model
/// chose the ring, from `(bytes, doubling µs, ring µs)` in ascending
/// sizes: the largest probe of the run from the smallest at which the
/// ring was not faster by 5% or more; 0 where it was at the smallest.
///
/// The model costs a ring step at the calibrated latency, the best of
/// single 4-byte calls, and ties the two at 32 KiB on 2 ranks, where the
/// ring meets twice and recursive doubling once. On the Intel VM of
/// 2026-12-04 the ring's second meeting cost more in loops: recursive
/// doubling was 1.23-1.51x faster there out of place and 1.07-1.42x in
/// place, where the model chose the ring; at 64 KiB the ring was level or
/// faster. A tie goes to recursive doubling: a meeting is what that VM's
/// state changes from one start-up to the next (a 2-rank allreduce of 32
/// KiB took the ring 4.1 µs in its fast state and 7.4-8.1 in its slow
/// one, recursive doubling 4.0-4.6 and 5.8-6.0), so in a tie the one
/// meeting is the smaller risk (docs/performance-log.md, "The 2-rank
/// allreduce of 32 KiB by recursive doubling, as measured at creation").
pub(crate) fn doubling_until(probes: &[(usize, f64, f64)]) -> usize {
    probes
        .iter()
        .take_while(|&&(_, doubling, ring)| ring > doubling * RING_WIN)
        .last()
        .map_or(0, |&(bytes, _, _)| bytes)
}

/// Whether the hierarchical algorithm serves `kind` on `layout`.
pub(crate) fn hier_applies(kind: CollKind, layout: Layout) -> bool {
    layout.hierarchical()
        && matches!(
            kind,
            CollKind::AllReduce | CollKind::AllGather | CollKind::ReduceScatter
        )
}

/// Slice geometry of a call of `count` elements of `elem` bytes run by
/// `algorithm`, over slots of `chunk_bytes`: slices are cut from the pieces
/// the algorithm moves (a ring moves 1/n of the data per hop, each of the
/// two trees half, one-shot all).
pub(crate) fn geometry(
    kind: CollKind,
    algorithm: Algorithm,
    (rank, size): (usize, usize),
    count: usize,
    elem: usize,
    chunk_bytes: usize,
) -> Geometry {
    slices(
        rank,
        size,
        count,
        pieces(kind, algorithm, size),
        elem,
        chunk_bytes,
    )
}

/// Bytes of each of `pieces` pieces of `count` elements of `elem` bytes.
fn piece_bytes(count: usize, pieces: usize, elem: usize) -> usize {
    count / pieces.max(1) * elem
}

/// The pieces `geometry` cuts a call's elements into.
fn pieces(kind: CollKind, algorithm: Algorithm, size: usize) -> usize {
    match (kind, algorithm) {
        (CollKind::AllReduce, Algorithm::Ring | Algorithm::TwoShot | Algorithm::Hierarchical) => {
            size
        }
        (CollKind::AllReduce, Algorithm::Tree) => 2,
        _ => 1,
    }
}

impl Geometry {
    /// This geometry for a host call through the slots of one host's
    /// shared memory: an allreduce, reduce-scatter or allgather between
    /// two ranks runs each piece as one slice, as large as a slot allows
    /// (`(count, elem, chunk_bytes)` as `geometry` had them). Slices let a
    /// rank start on a piece before its peer has sent all of it, which
    /// pays where the ranks wait on one another in a chain (more ranks, a
    /// network, a broadcast's root and receiver); two ranks of these
    /// collectives do the same work side by side, so slices only add a
    /// frame's handover each and spread the copies out of the peer's cache
    /// into short runs. With the copy out of a slot by pages
    /// (`ferroccl_transport::copy_from_shared`), in turns on the 2-core
    /// Intel VM: the 2-rank allreduce 1.10-1.28x at 128 KiB-2 MiB (reused
    /// buffers; 1.16-1.18x at 512 KiB in fresh rounds), reduce-scatter
    /// 1.11-1.29x at 512 KiB-2 MiB, allgather and broadcast level
    /// (docs/performance-log.md, "One slice a piece between two ranks").
    ///
    /// A piece of at least the whole ring of a direction (`steps` slots of
    /// `chunk_bytes`) goes in slices of a quarter slot instead (at least
    /// 64 KiB): its slices would otherwise cycle through every slot, and
    /// the ring's bytes add to the two ranks' buffers in the caches. On
    /// the AMD EPYC VM (1 MiB L2 a core, 32 MiB L3), in turns against
    /// whole slots: the 2-rank allreduce, allgather and reduce-scatter
    /// 0.98-1.44x at 8-32 MiB (17 of 18 cells faster); smaller pieces
    /// lost with such slices (the reduce-scatter of 2 MiB 0.76-0.93x), so
    /// they keep whole slots (docs/performance-log.md, "Quarter slots for
    /// pieces that fill the ring").
    pub(crate) fn in_shared_memory(
        self,
        kind: CollKind,
        algorithm: Algorithm,
        (count, elem, chunk_bytes, steps): (usize, usize, usize, usize),
    ) -> Geometry {
        let symmetric = matches!(
            kind,
            CollKind::AllReduce | CollKind::ReduceScatter | CollKind::AllGather
        );
        if self.size != 2 || !symmetric {
            return self;
        }
        let piece = piece_bytes(count, pieces(kind, algorithm, self.size), elem);
        let slice = if piece >= chunk_bytes.saturating_mul(steps.max(1)) {
            // A slot sliced as the tuner slices any piece: a quarter,
            // within 64 KiB and the slot.
            tune::slice_bytes(chunk_bytes, chunk_bytes)
        } else {
            piece.min(chunk_bytes)
        };
        Geometry {
            slice: (slice / elem.max(1)).max(1),
            ..self
        }
    }
}

/// The largest slice, in elements, of an allreduce of `count` elements of
/// `elem` bytes on `size` ranks run by `algorithm` over slots of
/// `chunk_bytes`: `geometry`'s rule, public so that a tool builds the
/// schedules a call runs (`ferroccl-sim`) without a copy of the rule.
pub fn all_reduce_slice(
    algorithm: Algorithm,
    size: usize,
    count: usize,
    elem: usize,
    chunk_bytes: usize,
) -> usize {
    geometry(
        CollKind::AllReduce,
        algorithm,
        (0, size),
        count,
        elem,
        chunk_bytes,
    )
    .slice
}

/// The largest slice, in elements, of a ring reduce-scatter, allgather,
/// broadcast or reduce whose per-rank block is `count` elements of `elem`
/// bytes, over slots of `chunk_bytes` (`geometry`'s rule for them; public
/// for the same reason as [`all_reduce_slice`]).
pub fn block_slice(count: usize, elem: usize, chunk_bytes: usize) -> usize {
    geometry(
        CollKind::AllGather,
        Algorithm::Ring,
        (0, 1),
        count,
        elem,
        chunk_bytes,
    )
    .slice
}

/// Geometry of a call whose `count` elements are cut into `pieces`.
pub(crate) fn slices(
    rank: usize,
    size: usize,
    count: usize,
    pieces: usize,
    elem: usize,
    chunk_bytes: usize,
) -> Geometry {
    let slice_bytes = tune::slice_bytes(piece_bytes(count, pieces, elem), chunk_bytes);
    Geometry {
        rank,
        size,
        slice: (slice_bytes / elem.max(1)).max(1),
        depth: 1,
    }
}

impl Geometry {
    /// This geometry with its ring passes `forced` slices deep, or, for
    /// `forced` 0, as deep as connections of `slots` slots a direction
    /// allow (`ring::pipeline_depth`). The config refuses a forced depth
    /// of `slots` or more.
    pub(crate) fn pipelined(self, slots: usize, forced: usize) -> Geometry {
        Geometry {
            depth: crate::algo::ring::depth_for(slots, forced),
            ..self
        }
    }

    /// This geometry if the schedule it cuts a call of `kind` and `count`
    /// elements (of `elem` bytes, over frames of `chunk_bytes`) into stays
    /// within [`MAX_SLICES`]; else the error that refuses the call before
    /// anything is built or moved. Slices are at most a frame, so frames
    /// small against the call (a `FERROCCL_BUFFSIZE` of a few KiB under a
    /// call of GiB) would build a schedule of millions of steps, each
    /// allocated before the first byte moves: slices of 4 bytes made a
    /// 32 MiB allreduce build several GB a rank and take 1.5 s a call.
    pub(crate) fn bounded(
        self,
        kind: CollKind,
        count: usize,
        elem: usize,
        chunk_bytes: usize,
    ) -> Result<Geometry> {
        let slices = schedule_slices(kind, count, self.size, self.slice);
        if slices <= MAX_SLICES {
            return Ok(self);
        }
        let slice_bytes = self.slice.saturating_mul(elem);
        Err(Error::InvalidArgument(format!(
            "{} of {count} elements ({} bytes) on {} ranks would be cut into {slices} \
             slices of at most {slice_bytes} bytes (frames of {chunk_bytes} bytes), more than \
             the {MAX_SLICES} a schedule may hold; raise FERROCCL_BUFFSIZE (frames are \
             FERROCCL_BUFFSIZE / FERROCCL_STEPS on the host) or split the call",
            kind.name(),
            count.saturating_mul(elem),
            self.size,
        )))
    }
}

/// Most slices a call's schedule may be cut into ([`Geometry::bounded`]):
/// about two million steps (some 150 MB a rank) at the most. At the
/// default frames (512 KiB slots, so slices of 512 KiB in calls this
/// large) it takes an allreduce of 512 GiB, or an 8-rank allgather with
/// blocks of 64 GiB, to reach it.
pub(crate) const MAX_SLICES: usize = 1 << 20;

/// The slices a schedule cuts a call of `kind` and `count` elements on
/// `size` ranks into, in slices of `slice` elements: every block of an
/// allgather, reduce-scatter or all-to-all (`count` is one rank's block),
/// the whole buffer of the others.
fn schedule_slices(kind: CollKind, count: usize, size: usize, slice: usize) -> usize {
    let blocks = match kind {
        CollKind::AllGather | CollKind::ReduceScatter | CollKind::AllToAll => size.max(1),
        _ => 1,
    };
    count.div_ceil(slice.max(1)).saturating_mul(blocks)
}

/// The INFO line for a call of `kind` (allreduce, allgather or
/// reduce-scatter) of `bytes` that the user algorithm `user` runs.
pub(crate) fn explain_user(
    kind: CollKind,
    (bytes, in_place): (usize, bool),
    facts: &Facts,
    user: &crate::algo::user::Checked,
) -> String {
    let route =
        route(kind, bytes, in_place, Memory::Host, facts).unwrap_or(Route::Slots { note: false });
    format!(
        "{} of {bytes} bytes on {} ranks -> user algorithm '{}' ({}; the checker accepted it \
         for {} ranks at creation, so the tuner does not choose), {}",
        kind.name(),
        facts.size,
        user.name(),
        user.source(),
        facts.size,
        route.explain()
    )
}

/// The INFO line for a call of `kind` and `bytes`: the route, and the
/// algorithm where the call goes through slots.
pub(crate) fn explain(
    kind: CollKind,
    (bytes, in_place): (usize, bool),
    facts: &Facts,
    (chosen, measured): (Algorithm, bool),
    costs: &[(Algorithm, f64)],
) -> String {
    let route =
        route(kind, bytes, in_place, Memory::Host, facts).unwrap_or(Route::Slots { note: false });
    let how = match (route, facts.forced) {
        (Route::Inline, _) => route.explain().to_string(),
        (_, Some(forced)) if forced != chosen => format!(
            "{chosen} ({forced} forced by FERROCCL_ALGO does not apply: {}), {}",
            if facts.layout.hierarchical() {
                "not this collective"
            } else {
                "the ranks are not spread over hosts with several on one"
            },
            route.explain()
        ),
        (_, Some(forced)) => format!("{} (forced by FERROCCL_ALGO), {}", forced, route.explain()),
        (_, None) if measured => format!(
            "{chosen} (measured faster than the ring up to {} bytes at creation), {}",
            facts.doubling,
            route.explain()
        ),
        (_, None) => format!("{chosen}, {}", route.explain()),
    };
    let model = if costs.is_empty() {
        String::new()
    } else {
        let listed: Vec<String> = costs
            .iter()
            .map(|(a, c)| format!("{} {c:.1} us", a.name()))
            .collect();
        format!(" (model: {})", listed.join(", "))
    };
    let hosts = if facts.layout.hosts > 1 {
        format!(
            " over {} hosts (largest {} ranks)",
            facts.layout.hosts, facts.layout.largest
        )
    } else {
        String::new()
    };
    format!(
        "{} of {bytes} bytes on {} ranks{hosts} -> {how}{model}",
        kind.name(),
        facts.size
    )
}

#[cfg(test)]
mod tests {
    use super::tune::LinkModel;
    use super::*;

    /// `costs` prices `algo` at `want` microseconds (to a part in a million).
    fn assert_cost(costs: &[(Algorithm, f64)], algo: Algorithm, want: f64) {
        let got = costs.iter().find(|c| c.0 == algo).unwrap().1;
        assert!((got - want).abs() < 1e-6 * want, "{algo}: {costs:?}");
    }

    fn facts() -> Facts {
        Facts {
            size: 4,
            control: true,
            cma: true,
            windows: false,
            forced: None,
            layout: Layout::one_host(4),
            user: false,
            nt_store_bytes: crate::config::DEFAULT_NT_STORE_BYTES,
            chunk_bytes: 512 << 10,
            cma_gather: CMA_GATHER_DEFAULT,
            cma_alltoall: CMA_GATHER_DEFAULT,
            cma_broadcast: NO_CMA,
            cma_allreduce: NO_CMA,
            shared_cores: false,
            // The staging area's route has a test of its own.
            spread: false,
            doubling: 0,
            // Unknown: the rules that read it keep their rule without it.
            llc_bytes: 0,
        }
    }

    /// `always_inline`, which a small call's caller asks instead of
    /// `route`, never says inline where `route` would not, whatever the
    /// facts that change (windows, the cross-memory-attach threshold) and
    /// the ones it is asked with (control pages, no forced or user
    /// algorithm), for every collective on 2 to 8 ranks.
    #[test]
    fn a_call_always_inline_is_routed_inline_under_every_fact() {
        let mut said = 0;
        for kind in CollKind::ALL {
            for size in [1, 2, 3, 4, 8] {
                for windows in [false, true] {
                    for (cma, cma_gather) in [
                        (false, NO_CMA),
                        (true, (0, usize::MAX)),
                        (true, (4096, 1 << 20)),
                    ] {
                        let f = Facts {
                            size,
                            windows,
                            cma,
                            cma_gather,
                            cma_broadcast: cma_gather,
                            layout: Layout::one_host(size),
                            ..facts()
                        };
                        for bytes in [
                            0,
                            1,
                            8,
                            64,
                            1024,
                            1025,
                            4095,
                            4096,
                            4097,
                            8192,
                            16 << 10,
                            1 << 20,
                        ] {
                            for in_place in [false, true] {
                                if always_inline(kind, bytes) {
                                    said += 1;
                                    assert_eq!(
                                        route(kind, bytes, in_place, Memory::Host, &f).unwrap(),
                                        Route::Inline,
                                        "{kind:?} of {bytes} B on {size} ranks, windows {windows}, cma {cma}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(said > 0);
        // Send/recv never checks in, and nothing above the least limit is
        // told without the facts.
        assert!(!always_inline(CollKind::SendRecv, 8));
        assert!(!always_inline(CollKind::AllReduce, INLINE_BYTES + 1));
        assert!(always_inline(CollKind::AllGather, 1024));
        assert!(!always_inline(CollKind::AllGather, 1025));
    }

    /// A broadcast pulls over the range the calibration gave it, and only
    /// there; the allgathers' range does not move it.
    #[test]
    fn a_broadcast_pulls_over_its_own_range() {
        let [a, b, _] = CMA_PROBE_BLOCKS;
        // The route follows the range, in place or not, on 2 and 4 ranks.
        for size in [2, 4] {
            let f = Facts {
                size,
                layout: Layout::one_host(size),
                cma_broadcast: (a, b),
                cma_gather: NO_CMA,
                spread: true,
                ..facts()
            };
            // Outside it: through slots on 2 ranks, through the root's
            // staging area on more.
            let outside = if size == 2 {
                Route::Slots { note: true }
            } else {
                Route::CheckIn {
                    cma: false,
                    spread: true,
                }
            };
            for in_place in [false, true] {
                let r = |bytes| route(CollKind::Broadcast, bytes, in_place, Memory::Host, &f);
                assert_eq!(
                    r(a).unwrap(),
                    Route::CheckIn {
                        cma: true,
                        spread: false
                    }
                );
                assert_eq!(
                    r(b).unwrap(),
                    Route::CheckIn {
                        cma: true,
                        spread: false
                    }
                );
                assert_eq!(r(a - 4).unwrap(), outside);
                assert_eq!(r(b + 4).unwrap(), outside);
            }
            // Without it (not calibrated, or the slots won) a broadcast
            // never pulls, whatever the allgathers' range.
            let f = Facts {
                cma_broadcast: NO_CMA,
                cma_gather: (0, usize::MAX),
                ..f
            };
            assert_eq!(
                route(CollKind::Broadcast, b, false, Memory::Host, &f).unwrap(),
                outside
            );
        }
        // The root's input in a window and every output in one: the path
        // between windows, before the pull.
        assert_eq!(
            after_check_in(CollKind::Broadcast, Some(1), Some(2), (true, false)),
            Direct::Broadcast {
                input: 1,
                output: 2
            }
        );
        assert_eq!(
            after_check_in(CollKind::Broadcast, Some(1), None, (true, false)),
            Direct::Pull
        );
        assert_eq!(
            after_check_in(CollKind::Broadcast, Some(1), None, (false, false)),
            Direct::Slots
        );
    }

    /// A broadcast above the inline limit on 3 to 8 ranks sharing control
    /// pages goes through the root's staging area, and an allgather on 4
    /// to 8 with blocks up to `SPREAD_GATHER_MAX_BYTES` through every
    /// rank's: not on 2 ranks or more than 8, not at or below the inline
    /// limit, not where the pull takes it, a forced algorithm runs, or
    /// `Config::spread` is off; and no other collective. Between windows
    /// the direct path still wins.
    /// Where the staging areas take an allgather's blocks, the calibrated
    /// pull starts at `STAGED_PULL_MIN_BYTES` for allgathers only: an
    /// all-to-all keeps the range, and so do 2 and 3 ranks and the
    /// calibration's own probes (a range from 0).
    #[test]
    fn allgathers_below_128_kib_blocks_stage_rather_than_pull() {
        let pulled = Route::CheckIn {
            cma: true,
            spread: false,
        };
        let staged = Route::CheckIn {
            cma: false,
            spread: true,
        };
        let floor = STAGED_PULL_MIN_BYTES;
        for size in [2, 3, 4, 8] {
            let f = Facts {
                size,
                layout: Layout::one_host(size),
                spread: true,
                cma_gather: (CMA_MIN_BYTES, usize::MAX),
                ..facts()
            };
            let r = |kind, bytes, f: &Facts| route(kind, bytes, false, Memory::Host, f).unwrap();
            let gathers = size >= 4;
            for block in [CMA_MIN_BYTES, floor - 4] {
                let want = if gathers { staged } else { pulled };
                assert_eq!(r(CollKind::AllGather, block, &f), want, "{size} {block}");
                assert_eq!(r(CollKind::AllToAll, block * size, &f), pulled, "{size}");
                // The calibration times the pull itself.
                let probing = Facts {
                    cma_gather: (0, usize::MAX),
                    ..f
                };
                assert_eq!(r(CollKind::AllGather, block, &probing), pulled);
            }
            assert_eq!(r(CollKind::AllGather, floor, &f), pulled, "{size}");
            // Without the staging areas, the range alone.
            let off = Facts { spread: false, ..f };
            assert_eq!(r(CollKind::AllGather, CMA_MIN_BYTES, &off), pulled);
            // A range that starts higher keeps its start.
            let high = Facts {
                cma_gather: (512 << 10, usize::MAX),
                ..f
            };
            let want = if gathers {
                staged
            } else {
                Route::Slots { note: true }
            };
            assert_eq!(r(CollKind::AllGather, floor, &high), want, "{size}");
        }
        // A range that ends below the floor leaves allgathers none.
        assert_eq!(staged_pull_range((floor / 2, floor / 2)), NO_CMA);
        assert_eq!(staged_pull_range((floor / 2, floor)), (floor, floor));
        assert_eq!(staged_pull_range((0, 7)), (0, 7));
        assert_eq!(staged_pull_range(NO_CMA), NO_CMA);
    }

    /// The calibration times the all-to-all itself only where allgathers
    /// go through the staging areas (4 to 8 ranks, the staging areas on),
    /// and the all-to-all follows its own range, not the allgathers'.
    #[test]
    fn all_to_alls_have_their_own_range_where_allgathers_are_staged() {
        // On 8 ranks the staging areas stream the two larger probes'
        // outputs (4 and 8 MiB a rank: the buffers of all ranks at 64 and
        // 128 MiB), which the pull never takes past the last-level cache:
        // only the smallest is probed there, whatever the cache (a probe's
        // cost on 8 ranks).
        let all = CMA_ALLTOALL_PROBE_BLOCKS.to_vec();
        let smallest = vec![CMA_ALLTOALL_PROBE_BLOCKS[0]];
        for (size, spread, want) in [
            (2, true, vec![]),
            (3, true, vec![]),
            (4, true, all),
            (8, true, smallest),
            (4, false, vec![]),
            (9, true, vec![]),
        ] {
            let f = Facts {
                size,
                layout: Layout::one_host(size),
                spread,
                ..facts()
            };
            // A cache that holds those buffers adds no probe.
            let roomy = Facts {
                llc_bytes: 256 << 20,
                ..f
            };
            assert_eq!(
                cma_alltoall_probes(&roomy),
                cma_alltoall_probes(&f),
                "{size} ranks, a 256 MiB cache"
            );
            assert_eq!(
                cma_alltoall_probes(&f),
                want,
                "{size} ranks, spread {spread}"
            );
        }
        // The range opens at the smallest block where the pull wins or
        // ties and wins on from there, else at the next, as with one probe.
        let [least, small, large] = CMA_ALLTOALL_PROBE_BLOCKS;
        let won_small = (small, 330.0, 470.0);
        let won_large = (large, 700.0, 1200.0);
        for (at_least, want) in [
            ((least, 80.0, 150.0), (least, usize::MAX)),
            ((least, 102.0, 100.0), (least, usize::MAX)),
            ((least, 130.0, 100.0), (small, usize::MAX)),
        ] {
            assert_eq!(
                cma_range(&[at_least, won_small, won_large], CMA_GATHER_DEFAULT),
                want,
                "{at_least:?}"
            );
        }
        for (at_small, want) in [
            ((small, 330.0, 470.0), (small, usize::MAX)),
            ((small, 410.0, 400.0), (small, usize::MAX)),
            ((small, 500.0, 400.0), (large, usize::MAX)),
        ] {
            let lost_least = (least, 130.0, 100.0);
            assert_eq!(
                cma_range(&[lost_least, at_small, won_large], CMA_GATHER_DEFAULT),
                want,
                "{at_small:?}"
            );
        }
        // A win at the smallest alone (the staging areas ahead at 512 KiB)
        // pulls those blocks only.
        assert_eq!(
            cma_range(
                &[(least, 80.0, 150.0), (small, 500.0, 400.0), won_large],
                CMA_GATHER_DEFAULT
            ),
            (least, least)
        );
        // Buffers that the slots would write with streaming stores are
        // not probed (the pull never takes them).
        let f = Facts {
            size: 4,
            layout: Layout::one_host(4),
            spread: true,
            nt_store_bytes: 1 << 20,
            ..facts()
        };
        assert_eq!(cma_alltoall_probes(&f), Vec::<usize>::new());
        let block = large;
        let pulled = Route::CheckIn {
            cma: true,
            spread: false,
        };
        let f = Facts {
            size: 4,
            layout: Layout::one_host(4),
            spread: true,
            cma_gather: NO_CMA,
            cma_alltoall: (large, usize::MAX),
            ..facts()
        };
        let r = |kind, bytes, f: &Facts| route(kind, bytes, false, Memory::Host, f).unwrap();
        let staged = Route::CheckIn {
            cma: false,
            spread: true,
        };
        assert_eq!(r(CollKind::AllToAll, 4 * block, &f), pulled);
        assert_eq!(r(CollKind::AllToAll, 4 * (block - 4), &f), staged);
        let swapped = Facts {
            cma_gather: (CMA_MIN_BYTES, usize::MAX),
            cma_alltoall: NO_CMA,
            ..f
        };
        assert_eq!(r(CollKind::AllToAll, 4 * block, &swapped), staged);
        // Every probe weighs the pull against the staging areas, which
        // take the probe's all-to-all on 4 to 8 ranks.
        for size in [4, 8] {
            for block in CMA_ALLTOALL_PROBE_BLOCKS {
                let g = Facts {
                    size,
                    layout: Layout::one_host(size),
                    cma_alltoall: NO_CMA,
                    ..swapped
                };
                assert_eq!(
                    r(CollKind::AllToAll, size * block, &g),
                    staged,
                    "{size} ranks"
                );
            }
        }
        // Past the staging areas' largest, the pull takes the all-to-all
        // whatever the probes said (they weighed it against the staging
        // areas, not the slots), below the streaming-store bound.
        let past = SPREAD_ALLTOALL_MAX_BYTES + 4 * 64;
        let big = Facts {
            nt_store_bytes: usize::MAX,
            ..swapped
        };
        assert_eq!(r(CollKind::AllToAll, past, &big), pulled);
        assert_eq!(
            r(CollKind::AllToAll, SPREAD_ALLTOALL_MAX_BYTES, &big),
            staged
        );
        // Where the staging areas stream the output (all ranks' buffers at
        // twice the threshold), they take it, whatever the pull's range.
        let streams = Facts {
            cma_alltoall: (CMA_MIN_BYTES, usize::MAX),
            nt_store_bytes: 16 << 20,
            ..big
        };
        assert_eq!(
            r(CollKind::AllToAll, SPREAD_ALLTOALL_MAX_BYTES / 2, &streams),
            staged
        );
        assert_eq!(
            r(CollKind::AllToAll, SPREAD_ALLTOALL_MAX_BYTES / 4, &streams),
            pulled
        );
        // Not where all ranks' buffers fit in the last-level cache: there
        // the pull's range holds (4 MiB on 4 ranks: 32 MiB of buffers).
        let half = SPREAD_ALLTOALL_MAX_BYTES / 2;
        let cached = |llc_bytes| Facts {
            llc_bytes,
            ..streams
        };
        assert_eq!(r(CollKind::AllToAll, half, &cached(32 << 20)), staged);
        assert_eq!(r(CollKind::AllToAll, half, &cached((32 << 20) + 1)), pulled);
        // Outside the pull's range the staging areas take it all the same.
        let unmeasured = Facts {
            cma_alltoall: NO_CMA,
            ..cached(usize::MAX)
        };
        assert_eq!(r(CollKind::AllToAll, half, &unmeasured), staged);
        let no_spread = Facts {
            spread: false,
            ..big
        };
        assert_eq!(
            r(CollKind::AllToAll, past, &no_spread),
            Route::Slots { note: true }
        );
    }

    /// All-to-alls past the inline limit and up to
    /// [`SPREAD_ALLTOALL_MAX_BYTES`] on 4 to 8 ranks that share control
    /// pages go through the staging areas where they do not pull; not on
    /// 2 and 3 ranks, not with `Config::spread` off, not past that size,
    /// and not where the buffers lie in windows.
    #[test]
    fn all_to_alls_past_inline_go_through_the_staging_areas_on_4_to_8_ranks() {
        let r =
            |bytes, f: &Facts| route(CollKind::AllToAll, bytes, false, Memory::Host, f).unwrap();
        let staged = Route::CheckIn {
            cma: false,
            spread: true,
        };
        for size in 2..=9 {
            let f = Facts {
                size,
                layout: Layout::one_host(size),
                spread: true,
                cma: false,
                ..facts()
            };
            let limit = inline_limit(CollKind::AllToAll, &f);
            assert_eq!(r(limit, &f), Route::Inline, "{size} ranks");
            for bytes in [limit + size * 4, 1 << 20, SPREAD_ALLTOALL_MAX_BYTES] {
                let want = if (4..=SPREAD_MAX_RANKS).contains(&size) {
                    staged
                } else {
                    Route::Slots { note: true }
                };
                assert_eq!(r(bytes, &f), want, "{size} ranks, {bytes} bytes");
                assert_eq!(
                    r(bytes, &Facts { spread: false, ..f }),
                    Route::Slots { note: true }
                );
                if want == staged {
                    assert_eq!(
                        after_check_in(CollKind::AllToAll, None, None, (false, true)),
                        Direct::Spread
                    );
                }
            }
            assert_eq!(
                r(SPREAD_ALLTOALL_MAX_BYTES + size * 4, &f),
                Route::Slots { note: true },
                "{size} ranks"
            );
        }
        // Between windows the window path, not the staging areas.
        assert_eq!(
            after_check_in(CollKind::AllToAll, None, Some(3), (false, true)),
            Direct::AllToAll { output: 3 }
        );
    }

    #[test]
    fn large_broadcasts_on_3_to_8_ranks_go_through_the_staging_area() {
        let spread = Route::CheckIn {
            cma: false,
            spread: true,
        };
        for size in [2, 3, 4, 8, 9, 16] {
            let f = Facts {
                size,
                layout: Layout::one_host(size),
                spread: true,
                cma_gather: NO_CMA,
                ..facts()
            };
            let r = |kind, bytes, f: &Facts| route(kind, bytes, false, Memory::Host, f).unwrap();
            let wide = (3..=SPREAD_MAX_RANKS).contains(&size);
            let min = if size == 3 {
                SPREAD_MIN_BYTES_3
            } else {
                SPREAD_MIN_BYTES
            };
            for bytes in [min, 2 * min, 64 << 20] {
                assert_eq!(
                    r(CollKind::Broadcast, bytes, &f) == spread,
                    wide,
                    "{size} {bytes}"
                );
                for kind in CollKind::ALL {
                    if !matches!(
                        kind,
                        CollKind::Broadcast
                            | CollKind::AllGather
                            | CollKind::AllReduce
                            | CollKind::AllToAll
                    ) {
                        assert_ne!(r(kind, bytes, &f), spread, "{kind:?}");
                    }
                }
                // An allgather's blocks on 4 to 8 ranks, up to their bound.
                let gathers = size >= 4 && wide && bytes <= SPREAD_GATHER_MAX_BYTES;
                let block = bytes.max(SPREAD_MIN_BYTES);
                assert_eq!(
                    r(CollKind::AllGather, block, &f) == spread,
                    gathers,
                    "{size} {block}"
                );
                let off = Facts { spread: false, ..f };
                assert_eq!(
                    r(CollKind::Broadcast, bytes, &off),
                    Route::Slots { note: true }
                );
                let forced = Facts {
                    forced: Some(Algorithm::Ring),
                    ..f
                };
                assert_eq!(
                    r(CollKind::Broadcast, bytes, &forced),
                    Route::Slots { note: true }
                );
            }
            // Where the calibration says pull (its output under the
            // streaming-store bound), the pull.
            let pulled = Facts {
                cma_broadcast: (0, usize::MAX),
                ..f
            };
            assert_eq!(
                r(CollKind::Broadcast, 1 << 20, &pulled),
                Route::CheckIn {
                    cma: true,
                    spread: false
                }
            );
            // Right above the inline limit on 4 ranks and more; on 3
            // through slots up to its own threshold.
            assert!(inline_limit(CollKind::Broadcast, &f) < SPREAD_MIN_BYTES);
            let below = match size {
                3 => Route::Slots { note: true },
                _ => Route::Inline,
            };
            if wide {
                assert_eq!(r(CollKind::Broadcast, min - 1, &f), below);
            }
        }
        assert_eq!(
            after_check_in(CollKind::Broadcast, None, Some(2), (false, true)),
            Direct::Spread
        );
        assert_eq!(
            after_check_in(CollKind::AllGather, Some(1), None, (false, true)),
            Direct::Spread
        );
        assert_eq!(
            after_check_in(CollKind::AllGather, None, Some(3), (false, true)),
            Direct::AllGather { output: 3 }
        );
        let f = Facts {
            size: 4,
            layout: Layout::one_host(4),
            spread: true,
            cma_gather: NO_CMA,
            ..facts()
        };
        let gather = |bytes| route(CollKind::AllGather, bytes, false, Memory::Host, &f).unwrap();
        assert_eq!(gather(SPREAD_GATHER_MAX_BYTES), spread);
        assert_eq!(
            gather(SPREAD_GATHER_MAX_BYTES + 4),
            Route::Slots { note: true }
        );
        assert_eq!(gather(SPREAD_MIN_BYTES - 1), Route::Inline);
        assert_eq!(
            after_check_in(CollKind::Broadcast, Some(1), Some(2), (false, true)),
            Direct::Broadcast {
                input: 1,
                output: 2
            }
        );
    }

    /// An allreduce of 16 KiB to 8 MiB on 4 to 8 ranks goes through the
    /// staging areas where its buffers are ordinary; below, inline or
    /// through slots, above and on other sizes through slots, and between
    /// windows the path between windows.
    #[test]
    fn allreduces_of_16_kib_to_8_mib_on_4_to_8_ranks_go_through_the_staging_areas() {
        let spread = Route::CheckIn {
            cma: false,
            spread: true,
        };
        let (lo, hi) = (SPREAD_REDUCE_MIN_BYTES, SPREAD_REDUCE_MAX_BYTES);
        for size in [2, 3, 4, 5, 8, 9] {
            let f = Facts {
                size,
                layout: Layout::one_host(size),
                spread: true,
                ..facts()
            };
            let r = |bytes, f: &Facts| {
                route(CollKind::AllReduce, bytes, false, Memory::Host, f).unwrap()
            };
            let wide = (4..=SPREAD_MAX_RANKS).contains(&size);
            for bytes in [lo, lo + 4, 1 << 20, hi] {
                assert_eq!(r(bytes, &f) == spread, wide, "{size} {bytes}");
                // Off (above the inline limit), or with an algorithm
                // forced: through slots.
                let off = Facts { spread: false, ..f };
                if bytes > inline_limit(CollKind::AllReduce, &f) {
                    assert_eq!(r(bytes, &off), Route::Slots { note: true });
                }
                let forced = Facts {
                    forced: Some(Algorithm::Ring),
                    ..f
                };
                assert_eq!(r(bytes, &forced), Route::Slots { note: true });
            }
            assert_ne!(r(lo - 4, &f), spread, "{size}");
            assert_ne!(r(hi + 4, &f), spread, "{size}");
            // In place too.
            if wide {
                assert_eq!(
                    route(CollKind::AllReduce, lo, true, Memory::Host, &f).unwrap(),
                    spread
                );
            }
        }
        // Windows on every rank take their own path; otherwise the
        // staging areas.
        assert_eq!(
            after_check_in(CollKind::AllReduce, Some(1), Some(2), (false, true)),
            Direct::AllReduce {
                input: 1,
                output: 2
            }
        );
        for (i, o) in [(None, None), (Some(1), None), (None, Some(2))] {
            assert_eq!(
                after_check_in(CollKind::AllReduce, i, o, (false, true)),
                Direct::Spread
            );
            assert_eq!(
                after_check_in(CollKind::AllReduce, i, o, (false, false)),
                Direct::Slots
            );
        }
    }

    /// The calibration's range: from the smallest probe the pull won over
    /// the wins in a row from there, open above where they reach the
    /// largest probe; none where it won none; ties won inside the range
    /// kept without a calibration.
    #[test]
    fn the_pull_runs_over_the_probes_it_won_in_a_row() {
        // Each probe's pull time against slots that take 1.0.
        let probes = |t: [f64; 3]| -> Vec<(usize, f64, f64)> {
            CMA_PROBE_BLOCKS
                .into_iter()
                .zip(t)
                .map(|(x, p)| (x, p, 1.0))
                .collect()
        };
        let at = |wins: [bool; 3]| {
            cma_range(
                &probes(wins.map(|w| if w { 1.0 / 1.5 } else { 2.0 / 1.5 })),
                NO_CMA,
            )
        };
        let [a, b, d] = CMA_PROBE_BLOCKS;
        let open = usize::MAX;
        assert_eq!(at([true; 3]), (a, open));
        assert_eq!(at([false, false, true]), (d, open));
        assert_eq!(at([false, true, true]), (b, open));
        // A loss at the largest probe closes the range below it, rather
        // than costing the pull everywhere.
        assert_eq!(at([true, true, false]), (a, b));
        assert_eq!(at([false, true, false]), (b, b));
        assert_eq!(at([true, false, true]), (a, a));
        assert_eq!(at([false; 3]), NO_CMA);
        // A tie, or a win by less than 5%, is no win.
        assert_eq!(cma_range(&[(a, 1.0, 1.0)], NO_CMA), NO_CMA);
        assert_eq!(cma_range(&[(a, 0.96, 1.0)], NO_CMA), NO_CMA);
        assert_eq!(cma_range(&[(a, 0.95, 1.0)], NO_CMA), (a, open));
        assert_eq!(cma_range(&[], NO_CMA), NO_CMA);
        // Inside the range kept without a calibration (a 2-rank
        // broadcast's) a tie counts as a win, a loss by over 5% does
        // not, and outside it a tie is no win.
        let keep = cma_broadcast_default(2);
        assert_eq!(keep, (a, b));
        assert_eq!(cma_range(&probes([1.0, 1.04, 1.0]), keep), (a, b));
        assert_eq!(cma_range(&probes([1.0, 0.5, 0.5]), keep), (a, open));
        assert_eq!(cma_range(&probes([1.06, 1.0, 1.0]), keep), (b, b));
        assert_eq!(cma_range(&probes([1.06, 1.06, 0.5]), keep), (d, open));
        assert_eq!(cma_range(&probes([1.1, 1.1, 1.1]), keep), NO_CMA);
        assert_eq!(cma_range(&probes([1.0, 1.0, 1.0]), NO_CMA), NO_CMA);
        assert_eq!(
            cma_range(&probes([1.0, 1.0, 1.0]), cma_broadcast_default(4)),
            NO_CMA
        );
        // The route follows the range.
        let f = Facts {
            cma_gather: (d, usize::MAX),
            ..facts()
        };
        assert_eq!(
            route(CollKind::AllGather, d, false, Memory::Host, &f).unwrap(),
            Route::CheckIn {
                cma: true,
                spread: false
            }
        );
        assert_eq!(
            route(CollKind::AllGather, d - 4, false, Memory::Host, &f).unwrap(),
            Route::Slots { note: true }
        );
        // A closed range: the blocks past it go through slots again.
        let f = Facts {
            cma_gather: (a, b),
            ..facts()
        };
        for (block, cma) in [(a, true), (b, true), (b + 4, false), (d, false)] {
            assert_eq!(
                route(CollKind::AllGather, block, false, Memory::Host, &f).unwrap()
                    == (Route::CheckIn {
                        cma: true,
                        spread: false
                    }),
                cma,
                "{block}"
            );
        }
        // Probes: every block on 8 ranks (16 MiB gathered at most); on
        // 16, 2 MiB blocks would gather 32 MiB (streamed, and the memory
        // bound); on 64, 64 KiB only; on 1024, none.
        let on = |size: usize| {
            cma_probes(&Facts {
                size,
                layout: Layout::one_host(size),
                ..facts()
            })
        };
        assert_eq!(on(4), CMA_PROBE_BLOCKS.to_vec());
        assert_eq!(on(8), CMA_PROBE_BLOCKS.to_vec());
        assert_eq!(on(16), vec![a, b]);
        assert_eq!(on(64), vec![a]);
        assert!(on(1024).is_empty());
        // Streaming stores off: no bound but the memory.
        let never = Facts {
            nt_store_bytes: 0,
            ..facts()
        };
        assert_eq!(cma_probes(&never), CMA_PROBE_BLOCKS.to_vec());
    }

    fn links(intra: (f64, f64), inter: (f64, f64)) -> HostLinks {
        let model = |(alpha_us, beta_gbps): (f64, f64)| LinkModel {
            alpha_us,
            beta_gbps,
            reduce_gbps: 1000.0,
        };
        HostLinks {
            intra: model(intra),
            inter: model(inter),
        }
    }

    /// On synthetic layouts: one host never takes the hierarchical
    /// algorithm, chosen or forced; two hosts of two ranks with a fast
    /// host and a 1 Gb/s network take it for a large allreduce and
    /// allgather, with the cost the model's formula gives by hand; links
    /// as slow inside as across keep the flat ring; one rank a host never
    /// takes it; the reason is in the INFO line.
    #[test]
    fn hierarchical_only_over_hosts_and_where_the_model_says() {
        let fast_host = links((2.0, 20.0), (50.0, 0.125));
        let bytes = 64 << 20;
        let spread = |hosts: usize, largest: usize| Facts {
            size: hosts * largest,
            control: false,
            cma: false,
            layout: Layout { hosts, largest },
            ..facts()
        };
        // One host: never, whatever the sizes and links.
        for n in [2, 4, 8] {
            let f = Facts {
                size: n,
                layout: Layout::one_host(n),
                ..facts()
            };
            for b in [8, 1 << 20, bytes] {
                for kind in [
                    CollKind::AllReduce,
                    CollKind::AllGather,
                    CollKind::ReduceScatter,
                ] {
                    let (a, costs) = algorithm(kind, b, &f, &fast_host);
                    assert_ne!(a, Algorithm::Hierarchical);
                    assert!(costs.iter().all(|c| c.0 != Algorithm::Hierarchical));
                }
            }
            let forced = Facts {
                forced: Some(Algorithm::Hierarchical),
                ..f
            };
            for kind in [CollKind::AllReduce, CollKind::ReduceScatter] {
                let (a, _) = algorithm(kind, bytes, &forced, &fast_host);
                assert_eq!(a, Algorithm::Ring, "forced on one host runs the ring");
            }
            let (a, _) = algorithm(CollKind::AllReduce, bytes, &forced, &fast_host);
            let line = explain(
                CollKind::AllReduce,
                (bytes, false),
                &forced,
                (a, false),
                &[],
            );
            assert!(line.contains("does not apply"), "{line}");
        }
        // Two hosts of two: 64 MiB. Ring: 6 hops of 50 us and 1.5 times
        // the buffer at 125 MB/s. Hierarchical: inside, 2 hops of 2 us and
        // the buffer once at 20 GB/s; across, 2 hops of 50 us and the
        // buffer once at 125 MB/s (reductions at 1000 GB/s).
        let b = bytes as f64;
        let ring = 6.0 * 50.0 + 1.5 * b / 125.0 + 0.75 * b / 1e6;
        let hier = 2.0 * 2.0 + b / 20e3 + 0.5 * b / 1e6 + 2.0 * 50.0 + b / 125.0 + 0.25 * b / 1e6;
        let f = spread(2, 2);
        let (a, costs) = algorithm(CollKind::AllReduce, bytes, &f, &fast_host);
        assert_eq!(a, Algorithm::Hierarchical, "{costs:?}");
        assert_cost(&costs, Algorithm::Ring, ring);
        assert_cost(&costs, Algorithm::Hierarchical, hier);
        let (a, _) = algorithm(CollKind::AllGather, bytes, &f, &fast_host);
        assert_eq!(a, Algorithm::Hierarchical);
        let line = explain(CollKind::AllReduce, (bytes, false), &f, (a, false), &costs);
        assert!(
            line.contains("over 2 hosts") && line.contains("hierarchical"),
            "{line}"
        );
        // Links as slow inside as across: the host's extra pass costs
        // more than the network bytes saved.
        let flat_links = links((50.0, 0.125), (50.0, 0.125));
        let (a, costs) = algorithm(CollKind::AllReduce, bytes, &f, &flat_links);
        assert_eq!(a, Algorithm::Ring, "{costs:?}");
        // One rank a host: nothing to do inside, never hierarchical.
        let (a, costs) = algorithm(CollKind::AllReduce, bytes, &spread(4, 1), &fast_host);
        assert_ne!(a, Algorithm::Hierarchical);
        assert!(costs.iter().all(|c| c.0 != Algorithm::Hierarchical));
        // Not a collective it serves: the broadcast keeps its choice.
        let (a, _) = algorithm(CollKind::Broadcast, bytes, &f, &fast_host);
        assert_ne!(a, Algorithm::Hierarchical);
        // Forced over hosts: it runs.
        let forced = Facts {
            forced: Some(Algorithm::Hierarchical),
            ..f
        };
        let (a, _) = algorithm(CollKind::AllReduce, 8, &forced, &fast_host);
        assert_eq!(a, Algorithm::Hierarchical);
        let (a, _) = algorithm(CollKind::ReduceScatter, 8, &forced, &fast_host);
        assert_eq!(a, Algorithm::Hierarchical);
        // Reduce-scatter of a 64 MiB input (16 MiB a rank, the call's
        // count) on two hosts of two. Ring: 3
        // hops of 50 us, each a quarter of the input over the network (its
        // combine, faster, overlaps). Hierarchical: 1 tick across, two
        // blocks over the network at once, and 2 ticks inside, a block
        // each at 20 GB/s.
        let ring = 3.0 * 50.0 + 0.75 * b / 125.0;
        let hier = 50.0 + 0.5 * b / 125.0 + 2.0 * (2.0 + 0.25 * b / 20e3);
        let (a, costs) = algorithm(CollKind::ReduceScatter, bytes / 4, &f, &fast_host);
        assert_eq!(a, Algorithm::Hierarchical, "{costs:?}");
        assert_cost(&costs, Algorithm::Ring, ring);
        assert_cost(&costs, Algorithm::Hierarchical, hier);
        let line = explain(
            CollKind::ReduceScatter,
            (bytes, false),
            &f,
            (a, false),
            &costs,
        );
        assert!(
            line.contains("reduce_scatter of") && line.contains("-> hierarchical"),
            "{line}"
        );
        // As slow inside as across: a link inside carries as much as the
        // network saves, and the ring keeps it.
        let (a, costs) = algorithm(CollKind::ReduceScatter, bytes / 4, &f, &flat_links);
        assert_eq!(a, Algorithm::Ring, "{costs:?}");
        assert!(costs.iter().any(|c| c.0 == Algorithm::Hierarchical));
    }

    #[test]
    fn larger_calls_run_inline_on_up_to_eight_ranks_by_collective() {
        let two = Facts {
            size: 2,
            layout: Layout::one_host(2),
            ..facts()
        };
        let windows = Facts {
            windows: true,
            ..two
        };
        let limits = [
            (CollKind::AllReduce, 16 << 10),
            (CollKind::Reduce, 16 << 10),
            (CollKind::Broadcast, 16 << 10),
            (CollKind::ReduceScatter, 16 << 10),
            (CollKind::AllGather, 16 << 10),
            (CollKind::AllToAll, 32 << 10),
        ];
        let four = |windows: bool| Facts { windows, ..facts() };
        let many = |size: usize| Facts {
            size,
            layout: Layout::one_host(size),
            ..facts()
        };
        for (kind, limit) in limits {
            // The page holds what a rank puts on it: a 2-rank
            // all-to-all's, half its input.
            let published = if kind == CollKind::AllToAll {
                limit / 2
            } else {
                limit
            };
            assert!(published <= INLINE_MAX_BYTES, "{kind:?}: the page holds it");
            // With windows on 2 ranks, allreduce and reduce-scatter keep
            // 4 KiB, allgather 1 KiB, all-to-all 16 KiB; the others keep
            // their limit. On 3 to 8 ranks, windows or not, all but
            // allreduce and all-to-all 16 KiB, allreduce 8 KiB,
            // all-to-all what puts 24 KiB on the page (36 KiB on 3 ranks,
            // 32 KiB on 4, 28,086 bytes on 8); above 8, 4 KiB.
            let with_windows = match kind {
                CollKind::AllReduce | CollKind::ReduceScatter => INLINE_BYTES,
                CollKind::AllGather => 1024,
                CollKind::AllToAll => INLINE_MAX_BYTES,
                _ => limit,
            };
            let more = |size: usize| match kind {
                CollKind::AllReduce => WIDE_ALLREDUCE_INLINE_BYTES,
                CollKind::AllToAll => [36_864, 32_768, 28_086][[3, 4, 8]
                    .iter()
                    .position(|&n| n == size)
                    .expect("3, 4 or 8 ranks")],
                _ => INLINE_MAX_BYTES,
            };
            for (f, most, what) in [
                (two, limit, "2 ranks"),
                (windows, with_windows, "2 ranks, windows"),
                (four(false), more(4), "4 ranks"),
                (four(true), more(4), "4 ranks, windows"),
                (many(3), more(3), "3 ranks"),
                (many(INLINE_WIDE_MAX_RANKS), more(8), "8 ranks"),
                (many(INLINE_WIDE_MAX_RANKS + 1), INLINE_BYTES, "9 ranks"),
            ] {
                assert_eq!(
                    route(kind, most, false, Memory::Host, &f).unwrap(),
                    Route::Inline,
                    "{kind:?} {what}"
                );
                assert_ne!(
                    route(kind, most + 1, false, Memory::Host, &f).unwrap(),
                    Route::Inline,
                    "{kind:?} {what}"
                );
            }
        }
    }

    #[test]
    fn small_calls_go_inline_only_with_control_pages_and_no_forced_algorithm() {
        let f = facts();
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::Broadcast,
            CollKind::Barrier,
        ] {
            assert_eq!(
                route(kind, 8, false, Memory::Host, &f).unwrap(),
                Route::Inline
            );
            assert_eq!(
                route(kind, inline_limit(kind, &f) + 1, false, Memory::Host, &f).unwrap(),
                Route::Slots { note: true },
                "{kind:?}"
            );
        }
        let no_pages = Facts {
            control: false,
            ..f
        };
        assert_eq!(
            route(CollKind::AllReduce, 8, false, Memory::Host, &no_pages).unwrap(),
            Route::Slots { note: false }
        );
        let forced = Facts {
            forced: Some(Algorithm::Ring),
            ..f
        };
        assert_eq!(
            route(CollKind::AllReduce, 8, false, Memory::Host, &forced).unwrap(),
            Route::Slots { note: true }
        );
        // A user algorithm takes every call of its collective
        // (allreduce, allgather, reduce-scatter), and only those.
        let user = Facts {
            user: true,
            windows: true,
            ..f
        };
        for kind in [
            CollKind::AllReduce,
            CollKind::AllGather,
            CollKind::ReduceScatter,
        ] {
            assert_eq!(
                route(kind, 8, false, Memory::Host, &user).unwrap(),
                Route::Slots { note: true }
            );
        }
        assert_eq!(
            route(CollKind::Broadcast, 8, false, Memory::Host, &user).unwrap(),
            Route::Inline
        );
        // Send/recv never checks in.
        assert_eq!(
            route(CollKind::SendRecv, 8, false, Memory::Host, &f).unwrap(),
            Route::Slots { note: false }
        );
    }

    #[test]
    fn cross_memory_attach_from_its_block_size_for_allgather_and_all_to_all_only() {
        let f = facts();
        let big = CMA_MIN_BYTES;
        assert_eq!(
            route(CollKind::AllGather, big, false, Memory::Host, &f).unwrap(),
            Route::CheckIn {
                cma: true,
                spread: false
            }
        );
        assert_eq!(
            route(CollKind::AllGather, big - 1, false, Memory::Host, &f).unwrap(),
            Route::Slots { note: true }
        );
        // An all-to-all's block is a quarter of its input on 4 ranks.
        assert_eq!(
            route(CollKind::AllToAll, 4 * big, false, Memory::Host, &f).unwrap(),
            Route::CheckIn {
                cma: true,
                spread: false
            }
        );
        assert_eq!(
            route(CollKind::AllToAll, 4 * big - 4, false, Memory::Host, &f).unwrap(),
            Route::Slots { note: true }
        );
        for kind in [CollKind::Broadcast, CollKind::AllReduce, CollKind::Reduce] {
            assert_eq!(
                route(kind, 1 << 24, false, Memory::Host, &f).unwrap(),
                Route::Slots { note: true }
            );
        }
        let no_cma = Facts { cma: false, ..f };
        assert_eq!(
            route(CollKind::AllGather, big, false, Memory::Host, &no_cma).unwrap(),
            Route::Slots { note: true }
        );
        // Up to where the slots would stream the output: below
        // `nt_store_bytes` of output (an allgather's on 4 ranks is 4
        // inputs; an all-to-all's is its input).
        let nt = f.nt_store_bytes;
        for (kind, bytes, cma) in [
            (CollKind::AllGather, nt / 4 - 4, true),
            (CollKind::AllGather, nt / 4, false),
            (CollKind::AllToAll, nt - 4, true),
            (CollKind::AllToAll, nt, false),
        ] {
            let want = if cma {
                Route::CheckIn {
                    cma: true,
                    spread: false,
                }
            } else {
                Route::Slots { note: true }
            };
            assert_eq!(
                route(kind, bytes, false, Memory::Host, &f).unwrap(),
                want,
                "{kind:?} {bytes}"
            );
        }
        // In place, slots write with ordinary stores too: no upper bound.
        assert_eq!(
            route(CollKind::AllGather, 1 << 30, true, Memory::Host, &f).unwrap(),
            Route::CheckIn {
                cma: true,
                spread: false
            }
        );
        // Streaming stores off: no upper bound.
        let never = Facts {
            nt_store_bytes: 0,
            ..f
        };
        assert_eq!(
            route(CollKind::AllGather, 1 << 30, false, Memory::Host, &never).unwrap(),
            Route::CheckIn {
                cma: true,
                spread: false
            }
        );
    }

    #[test]
    fn with_a_window_the_collectives_with_a_window_path_check_in() {
        let f = Facts {
            windows: true,
            cma: false,
            ..facts()
        };
        for kind in [
            CollKind::AllReduce,
            CollKind::ReduceScatter,
            CollKind::AllGather,
            CollKind::Broadcast,
            CollKind::Reduce,
            CollKind::AllToAll,
        ] {
            assert_eq!(
                route(kind, 1 << 20, false, Memory::Host, &f).unwrap(),
                Route::CheckIn {
                    cma: false,
                    spread: false
                }
            );
            assert!(window_path_from(kind, &f).is_some());
            // The check-in decides from the places; the window path
            // exists for it.
            assert_ne!(
                after_check_in(kind, Some(1), Some(2), (false, false)),
                Direct::Slots
            );
        }
        // On more ranks a broadcast or reduce takes the path between
        // windows only from its threshold.
        let (four, two) = (
            f,
            Facts {
                size: 2,
                layout: Layout::one_host(2),
                ..f
            },
        );
        for (kind, min) in [
            (CollKind::Broadcast, 32 << 10),
            (CollKind::Reduce, 32 << 10),
        ] {
            assert_eq!(window_path_from(kind, &four), Some(min));
            assert_eq!(
                route(kind, min, false, Memory::Host, &four).unwrap(),
                Route::CheckIn {
                    cma: false,
                    spread: false
                },
                "{kind:?}"
            );
            assert_eq!(
                route(kind, min - 1, false, Memory::Host, &four).unwrap(),
                Route::Slots { note: true },
                "{kind:?}"
            );
            assert_eq!(window_path_from(kind, &two), Some(0), "{kind:?} on 2 ranks");
        }
        // A broadcast needs its outputs in a window, a reduce its inputs.
        assert_eq!(
            after_check_in(CollKind::Broadcast, Some(1), None, (false, false)),
            Direct::Slots
        );
        assert_eq!(
            after_check_in(CollKind::Reduce, None, Some(1), (false, false)),
            Direct::Slots
        );
        // An all-to-all needs every output in the window (its inputs
        // need not be); else through slots, or pulled where the route
        // said so.
        let kind = CollKind::AllToAll;
        assert_eq!(
            after_check_in(kind, None, Some(3), (false, false)),
            Direct::AllToAll { output: 3 }
        );
        assert_eq!(
            after_check_in(kind, Some(1), None, (false, false)),
            Direct::Slots
        );
        assert_eq!(
            after_check_in(kind, Some(1), None, (true, false)),
            Direct::Pull
        );
        // Send/recv involves two ranks and never checks in.
        assert_eq!(window_path_from(CollKind::SendRecv, &f), None);
        assert_eq!(
            route(CollKind::SendRecv, 1 << 20, false, Memory::Host, &f).unwrap(),
            Route::Slots { note: false },
        );
    }

    /// No host route takes device memory (the staged executor takes it
    /// before a route is asked for).
    #[test]
    fn no_host_route_takes_device_memory() {
        let err = route(
            CollKind::AllReduce,
            8,
            false,
            Memory::Device { ordinal: 3 },
            &facts(),
        )
        .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("ordinal: 3"), "{err}");
    }

    #[test]
    fn direct_paths_need_every_rank_in_one_window() {
        use CollKind::*;
        assert_eq!(
            after_check_in(AllReduce, Some(1), Some(2), (false, false)),
            Direct::AllReduce {
                input: 1,
                output: 2
            }
        );
        assert_eq!(
            after_check_in(AllReduce, None, Some(2), (false, false)),
            Direct::Slots
        );
        // A 2-rank allreduce the route sent by cross-memory attach.
        assert_eq!(
            after_check_in(AllReduce, None, Some(2), (true, false)),
            Direct::Pull
        );
        assert_eq!(
            after_check_in(AllGather, None, Some(2), (true, false)),
            Direct::AllGather { output: 2 }
        );
        assert_eq!(
            after_check_in(AllGather, None, None, (true, false)),
            Direct::Pull
        );
        assert_eq!(
            after_check_in(AllGather, None, None, (false, false)),
            Direct::Slots
        );
        // Outputs in a window go between windows even where the route
        // would have pulled.
        assert_eq!(
            after_check_in(AllToAll, Some(1), Some(1), (true, false)),
            Direct::AllToAll { output: 1 }
        );
        assert_eq!(
            after_check_in(AllToAll, Some(1), None, (true, false)),
            Direct::Pull
        );
        assert_eq!(
            after_check_in(ReduceScatter, Some(5), None, (false, false)),
            Direct::ReduceScatter { input: 5 }
        );
        assert_eq!(
            after_check_in(Barrier, None, None, (false, false)),
            Direct::Done
        );
        assert_eq!(
            after_check_in(Broadcast, Some(1), Some(1), (false, false)),
            Direct::Broadcast {
                input: 1,
                output: 1
            }
        );
        assert_eq!(
            after_check_in(Reduce, Some(3), Some(4), (false, false)),
            Direct::Reduce {
                input: 3,
                output: 4
            }
        );
        assert_eq!(
            after_check_in(AllToAll, Some(1), None, (false, false)),
            Direct::Slots
        );
    }

    #[test]
    fn streaming_stores_from_the_threshold_out_of_place_or_in_a_broadcast() {
        use CollKind::*;
        let nt = 32 << 20;
        assert_eq!(slot_store(true, nt, nt), Store::Streaming);
        assert_eq!(slot_store(true, nt - 1, nt), Store::Cached);
        assert_eq!(slot_store(false, 4 * nt, nt), Store::Cached);
        assert_eq!(slot_store(true, 4 * nt, 0), Store::Cached);
        assert_eq!(direct_store(AllReduce, true, 2 * nt, nt), Store::Streaming);
        assert_eq!(direct_store(AllReduce, true, 2 * nt - 1, nt), Store::Cached);
        assert_eq!(direct_store(AllReduce, false, 4 * nt, nt), Store::Cached);
        assert_eq!(direct_store(AllGather, false, 4 * nt, nt), Store::Cached);
        assert_eq!(direct_store(AllReduce, true, 4 * nt, 0), Store::Cached);
        // A broadcast streams in place as out, from an eighth of the bound
        // (its one buffer counted twice).
        assert_eq!(direct_store(Broadcast, false, nt / 2, nt), Store::Streaming);
        assert_eq!(direct_store(Broadcast, true, nt / 2, nt), Store::Streaming);
        assert_eq!(
            direct_store(Broadcast, false, nt / 2 - 1, nt),
            Store::Cached
        );
        assert_eq!(direct_store(Broadcast, false, 4 * nt, 0), Store::Cached);
        assert_eq!(direct_store(Broadcast, false, 8, 1), Store::Streaming);
    }

    /// Allreduces and reduce-scatters between windows stream out of place
    /// from the last-level cache's size of buffers, where it is known and
    /// streaming is on; the other collectives, in-place calls and an
    /// unknown cache keep `direct_store`'s rule.
    #[test]
    fn reducing_calls_between_windows_stream_past_the_last_level_cache() {
        use CollKind::*;
        let (nt, llc) = (32 << 20, 32 << 20);
        for kind in [AllReduce, ReduceScatter] {
            assert_eq!(
                direct_reduce_store(kind, true, llc, (nt, llc)),
                Store::Streaming
            );
            assert_eq!(
                direct_reduce_store(kind, true, llc - 1, (nt, llc)),
                Store::Cached
            );
            assert_eq!(
                direct_reduce_store(kind, false, 4 * llc, (nt, llc)),
                Store::Cached
            );
            // Streaming off, or the cache unknown: the threshold alone.
            assert_eq!(
                direct_reduce_store(kind, true, 4 * llc, (0, llc)),
                Store::Cached
            );
            assert_eq!(direct_reduce_store(kind, true, llc, (nt, 0)), Store::Cached);
            assert_eq!(
                direct_reduce_store(kind, true, 2 * nt, (nt, 0)),
                Store::Streaming
            );
        }
        assert_eq!(
            direct_reduce_store(AllGather, true, 4 * llc / 3, (nt, llc)),
            Store::Cached
        );
        assert_eq!(
            direct_reduce_store(AllToAll, true, llc, (nt, llc)),
            Store::Cached
        );
        assert_eq!(
            direct_reduce_store(Broadcast, false, nt / 2, (nt, llc)),
            direct_store(Broadcast, false, nt / 2, nt)
        );
    }

    #[test]
    fn two_ranks_of_one_host_run_symmetric_pieces_whole() {
        let chunk = 512 << 10;
        // A 2-rank allreduce of 512 KiB: pieces of 256 KiB, one slice each
        // through shared memory, four of 64 KiB otherwise.
        let count = 128 << 10;
        let g = |kind, size, count| {
            let sliced = geometry(kind, Algorithm::Ring, (0, size), count, 4, chunk);
            let shared = sliced.in_shared_memory(kind, Algorithm::Ring, (count, 4, chunk, 8));
            (sliced.slice, shared.slice)
        };
        assert_eq!(g(CollKind::AllReduce, 2, count), (16 << 10, 64 << 10));
        // Reduce-scatter and allgather: one piece, the block, capped by the
        // slot.
        assert_eq!(g(CollKind::ReduceScatter, 2, count).1, count);
        assert_eq!(g(CollKind::AllGather, 2, 4 * count).1, chunk / 4);
        // A piece of the whole ring (8 slots) or more goes in quarter
        // slots: an allgather's or reduce-scatter's block of 4 MiB, an
        // allreduce of 8 MiB (pieces of 4 MiB); one element short of the
        // ring, whole slots.
        let ring = 8 * chunk / 4;
        assert_eq!(g(CollKind::AllGather, 2, ring).1, chunk / 16);
        assert_eq!(g(CollKind::AllGather, 2, ring - 1).1, chunk / 4);
        assert_eq!(g(CollKind::ReduceScatter, 2, ring).1, chunk / 16);
        assert_eq!(g(CollKind::ReduceScatter, 2, ring - 1).1, chunk / 4);
        assert_eq!(g(CollKind::AllReduce, 2, 2 * ring).1, chunk / 16);
        assert_eq!(g(CollKind::AllReduce, 2, 2 * ring - 2).1, chunk / 4);
        // Never below 64 KiB, and never above the slot: slots of 128 KiB
        // take slices of 64 KiB, slots of 32 KiB whole slots.
        let slots_of = |chunk: usize| {
            let (kind, algo) = (CollKind::AllGather, Algorithm::Ring);
            geometry(kind, algo, (0, 2), 1 << 22, 4, chunk)
                .in_shared_memory(kind, algo, (1 << 22, 4, chunk, 8))
                .slice
        };
        assert_eq!(slots_of(128 << 10), (64 << 10) / 4);
        assert_eq!(slots_of(32 << 10), (32 << 10) / 4);
        // A broadcast keeps its slices (its receiver follows its root), and
        // so do more ranks.
        let (sliced, shared) = g(CollKind::Broadcast, 2, count);
        assert_eq!(sliced, shared);
        let (sliced, shared) = g(CollKind::AllReduce, 3, 3 * count);
        assert_eq!(sliced, shared);
        assert!(sliced < count);
    }

    #[test]
    fn a_schedule_holds_at_most_max_slices() {
        // Slots of 64 bytes (the least the config allows): slices of 16
        // f32 at most, on 2 and 4 ranks.
        let chunk = 64;
        let at = |kind, size, count| {
            geometry(kind, Algorithm::Ring, (0, size), count, 4, chunk)
                .bounded(kind, count, 4, chunk)
                .map(|g| g.slice)
        };
        for size in [2, 4] {
            // The whole buffer of an allreduce, broadcast or reduce.
            for kind in [CollKind::AllReduce, CollKind::Broadcast, CollKind::Reduce] {
                assert_eq!(at(kind, size, MAX_SLICES * 16), Ok(16), "{kind:?}");
                match at(kind, size, MAX_SLICES * 16 + 1) {
                    Err(Error::InvalidArgument(msg)) => {
                        assert!(msg.contains(kind.name()), "{msg}");
                        assert!(msg.contains(&format!("{} slices", MAX_SLICES + 1)), "{msg}");
                        assert!(msg.contains("FERROCCL_BUFFSIZE"), "{msg}");
                    }
                    other => panic!("{kind:?} on {size} ranks: {other:?}"),
                }
            }
            // Every block of an allgather or reduce-scatter.
            for kind in [CollKind::AllGather, CollKind::ReduceScatter] {
                let most = MAX_SLICES / size * 16;
                assert_eq!(at(kind, size, most), Ok(16), "{kind:?}");
                assert!(at(kind, size, most + 1).is_err(), "{kind:?}");
            }
        }
        // The default slots take calls of far more than any host buffer.
        let (kind, big, slot) = (CollKind::AllReduce, 1usize << 36, 512 << 10);
        let default = geometry(kind, Algorithm::Ring, (0, 2), big, 4, slot);
        assert!(default.bounded(kind, big, 4, slot).is_ok());
    }

    #[test]
    fn slices_follow_the_pieces_each_algorithm_moves() {
        let chunk = 1 << 20;
        let ring = geometry(
            CollKind::AllReduce,
            Algorithm::Ring,
            (0, 4),
            1 << 22,
            4,
            chunk,
        );
        let one = geometry(
            CollKind::AllReduce,
            Algorithm::OneShot,
            (0, 4),
            1 << 22,
            4,
            chunk,
        );
        assert!(ring.slice <= one.slice);
        assert!(ring.slice * 4 <= chunk && one.slice * 4 <= chunk);
        let forced = Facts {
            forced: Some(Algorithm::Tree),
            ..facts()
        };
        let flat = HostLinks {
            intra: LinkModel::DEFAULT,
            inter: LinkModel::DEFAULT,
        };
        let (a, costs) = algorithm(CollKind::AllReduce, 8, &forced, &flat);
        assert_eq!(a, Algorithm::Tree);
        assert!(costs.is_empty());
        let line = explain(
            CollKind::AllReduce,
            (1 << 20, false),
            &forced,
            (a, false),
            &costs,
        );
        assert!(line.contains("forced"), "{line}");
    }

    /// A 2-rank allreduce of ordinary buffers runs by cross-memory attach
    /// over `CMA_ALLREDUCE` where the ranks may write into each other,
    /// in place too, and under the streaming-store bound out of place;
    /// never on more ranks, without the writes, with a forced algorithm
    /// or between windows.
    #[test]
    fn two_rank_allreduce_pulls_and_pushes_where_the_ranks_may_write() {
        let (lo, hi) = CMA_ALLREDUCE;
        let two = Facts {
            size: 2,
            layout: Layout::one_host(2),
            cma_allreduce: cma_allreduce_default(2, true),
            ..facts()
        };
        let r = |bytes, in_place, f: &Facts| {
            route(CollKind::AllReduce, bytes, in_place, Memory::Host, f).unwrap()
        };
        let pull = Route::CheckIn {
            cma: true,
            spread: false,
        };
        for in_place in [false, true] {
            for bytes in [lo, lo + 4, 1 << 20, hi] {
                assert_eq!(r(bytes, in_place, &two), pull, "{bytes} {in_place}");
            }
            assert_ne!(r(lo - 4, in_place, &two), pull);
            assert_ne!(r(hi + 4, in_place, &two), pull);
            for f in [
                Facts {
                    cma_allreduce: cma_allreduce_default(2, false),
                    ..two
                },
                Facts {
                    forced: Some(Algorithm::Ring),
                    ..two
                },
                Facts { cma: false, ..two },
            ] {
                assert_ne!(r(1 << 20, in_place, &f), pull);
            }
        }
        // Out of place above the streaming-store bound, the slots.
        let low_nt = Facts {
            nt_store_bytes: 1 << 20,
            ..two
        };
        assert_eq!(r(512 << 10, false, &low_nt), pull);
        assert_ne!(r(1 << 20, false, &low_nt), pull);
        assert_eq!(r(1 << 20, true, &low_nt), pull);
        assert_eq!(cma_allreduce_default(3, true), NO_CMA);
        assert_eq!(cma_allreduce_default(4, true), NO_CMA);
        assert_eq!(
            after_check_in(CollKind::AllReduce, None, None, (true, false)),
            Direct::Pull
        );
        assert_eq!(
            after_check_in(CollKind::AllReduce, Some(1), Some(2), (true, false)),
            Direct::AllReduce {
                input: 1,
                output: 2
            }
        );
    }

    /// The halves' calibration: probed on 2 ranks that may write into each
    /// other, at the probe sizes within `CMA_ALLREDUCE` whose output is
    /// written with ordinary stores; kept where they won or tied, held
    /// within `CMA_ALLREDUCE`.
    #[test]
    fn the_halves_run_where_the_calibration_measured_them_no_slower() {
        let nt = crate::config::DEFAULT_NT_STORE_BYTES;
        assert_eq!(cma_allreduce_probes(2, true, nt), vec![512 << 10, 2 << 20]);
        assert_eq!(cma_allreduce_probes(2, true, 1 << 20), vec![512 << 10]);
        assert!(cma_allreduce_probes(2, false, nt).is_empty());
        assert!(cma_allreduce_probes(4, true, nt).is_empty());
        let (a, b) = (512 << 10, 2 << 20);
        // (halves µs, slots µs) at 512 KiB and 2 MiB.
        let range = |at_a: (f64, f64), at_b: (f64, f64)| {
            cma_allreduce_range(&[(a, at_a.0, at_a.1), (b, at_b.0, at_b.1)])
        };
        // Faster at both (the Intel VM): the whole default range.
        assert_eq!(range((53.0, 87.0), (300.0, 400.0)), CMA_ALLREDUCE);
        // Slower at both (the AMD VM of 2026-12-04): never.
        assert_eq!(range((99.0, 43.7), (406.2, 186.6)), NO_CMA);
        // Only from 2 MiB: from there to the default's end.
        assert_eq!(range((99.0, 43.7), (300.0, 400.0)), (b, CMA_ALLREDUCE.1));
        // Only at 512 KiB: up to that probe.
        assert_eq!(range((53.0, 87.0), (406.2, 186.6)), (a, a));
        // A tie (2% slower) counts for the halves, a 10% loss does not.
        assert_eq!(range((51.0, 50.0), (300.0, 400.0)), CMA_ALLREDUCE);
        assert_eq!(range((55.0, 50.0), (300.0, 400.0)), (b, CMA_ALLREDUCE.1));
    }

    /// The calibration's rule (`doubling_until`): from the smallest
    /// probe, the run of sizes where the ring was not 5% faster (a tie
    /// goes to recursive doubling), up to its last size; a ring 5% faster
    /// ends it; at the smallest, 0.
    #[test]
    fn doubling_until_takes_the_run_the_ring_did_not_win_from_the_smallest_probe() {
        let (a, b, c) = (32 << 10, 64 << 10, 128 << 10);
        assert_eq!(doubling_until(&[]), 0);
        assert_eq!(doubling_until(&[(a, 5.0, 7.0)]), a);
        assert_eq!(doubling_until(&[(a, 5.0, 7.0), (b, 11.0, 9.0)]), a);
        assert_eq!(
            doubling_until(&[(a, 5.0, 7.0), (b, 9.0, 10.0), (c, 30.0, 26.0)]),
            b
        );
        assert_eq!(doubling_until(&[(a, 1.0, 1.0)]), a, "a tie");
        assert_eq!(doubling_until(&[(a, 1.0, 0.96)]), a, "a tie");
        assert_eq!(doubling_until(&[(a, 1.0, 0.95)]), 0, "the ring 5% faster");
        assert_eq!(
            doubling_until(&[(a, 7.0, 5.0), (b, 5.0, 7.0)]),
            0,
            "only a run from the smallest probe"
        );
    }

    /// Where the calibration measured recursive doubling faster
    /// (`Facts::doubling`), a 2-rank allreduce that the model runs by the
    /// ring runs by recursive doubling up to that size and by the ring
    /// above it; a forced algorithm, another collective and a size where
    /// the model chose something else keep theirs; the INFO line says
    /// why. The probes are the sizes that go through slots both in place
    /// and out of place with the model's ring: on 2 ranks not the inline
    /// 8 and 16 KiB; none where an algorithm is forced, and none from 16
    /// KiB on 4 ranks, whose allreduces go through the staging areas.
    #[test]
    fn measured_recursive_doubling_replaces_the_models_ring_up_to_its_size() {
        // The calibration of the Intel VM of 2026-12-04, where the model
        // ties the two at 32 KiB and prefers the ring.
        let m = LinkModel {
            alpha_us: 0.45,
            beta_gbps: 7.5,
            reduce_gbps: 28.0,
        };
        let l = HostLinks { intra: m, inter: m };
        let two = Facts {
            size: 2,
            layout: Layout::one_host(2),
            cma_allreduce: cma_allreduce_default(2, true),
            ..facts()
        };
        let (a, b) = (32 << 10, 64 << 10);
        let ring = |f: &Facts, kind, bytes| algorithm(kind, bytes, f, &l).0;
        assert_eq!(ring(&two, CollKind::AllReduce, a), Algorithm::Ring);
        assert_eq!(ring(&two, CollKind::AllReduce, b), Algorithm::Ring);
        let measured = Facts { doubling: a, ..two };
        let (got, costs, why) = algorithm_why(CollKind::AllReduce, a, &measured, &l);
        assert_eq!((got, why), (Algorithm::RecursiveDoubling, true));
        let line = explain(
            CollKind::AllReduce,
            (a, false),
            &measured,
            (got, why),
            &costs,
        );
        assert!(
            line.contains("recursive_doubling (measured faster than the ring up to 32768 bytes"),
            "{line}"
        );
        assert_eq!(ring(&measured, CollKind::AllReduce, a + 4), Algorithm::Ring);
        let mut model_doubles = 0;
        for bytes in [8, 64, 4096] {
            assert_eq!(
                ring(&measured, CollKind::AllReduce, bytes),
                ring(&two, CollKind::AllReduce, bytes),
                "{bytes} bytes"
            );
            // Where the model takes recursive doubling itself, below the
            // measured size, the log must not credit the measurement.
            let (got, costs, why) = algorithm_why(CollKind::AllReduce, bytes, &measured, &l);
            if got == Algorithm::RecursiveDoubling {
                model_doubles += 1;
                assert!(!why, "{bytes} bytes: the model's own choice");
                let line = explain(
                    CollKind::AllReduce,
                    (bytes, false),
                    &measured,
                    (got, why),
                    &costs,
                );
                assert!(!line.contains("measured faster"), "{bytes} bytes: {line}");
            }
        }
        assert!(
            model_doubles > 0,
            "no size here where the model doubles itself"
        );
        let forced = Facts {
            forced: Some(Algorithm::Ring),
            ..measured
        };
        assert_eq!(ring(&forced, CollKind::AllReduce, a), Algorithm::Ring);
        assert_eq!(
            ring(&measured, CollKind::Broadcast, a),
            ring(&two, CollKind::Broadcast, a)
        );

        let probes = |f: &Facts| -> Vec<usize> {
            DOUBLING_PROBE_BYTES
                .into_iter()
                .filter(|&s| doubling_probe(s, f, &l))
                .collect()
        };
        let want = vec![32 << 10, 64 << 10, 128 << 10, 256 << 10];
        assert_eq!(probes(&two), want);
        assert_eq!(probes(&measured), want, "whatever was measured before");
        assert_eq!(
            probes(&Facts {
                doubling: 0,
                ..forced
            }),
            Vec::<usize>::new()
        );
        let four = Facts {
            size: 4,
            layout: Layout::one_host(4),
            spread: true,
            ..facts()
        };
        assert!(
            probes(&four).iter().all(|&s| s < 16 << 10),
            "{:?}",
            probes(&four)
        );
    }
}
