//! Memory every rank of a host maps: the control pages the check-in runs
//! on (made at creation where every rank is on one host), windows
//! (`alloc_window`), the "create, agree, map, agree, unlink" set-up they
//! share, and the probe of cross-memory attach. What the pages and windows
//! are used for is `exec`'s; which calls use them is `plan`'s.

use super::routes::Range;
use super::{lock, Buffers, Communicator};
use crate::coll::{CollCall, CollKind};
use crate::element::{Element, ReduceOp};
use crate::error::{Error, Result};
use crate::exec;
use crate::window::{self, Control, Registration, Window};
use ferroccl_transport::{SharedMemory, SharedRegion};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Words of a 4 KiB page of memory: the stride at which a control page is
/// touched to map it in (`Communicator::create_control`).
const OS_PAGE_WORDS: usize = 4096 / 8;

/// What `share_regions` gives: this rank's region, and what `open` made of
/// every rank's.
type Shared<P> = (Box<dyn SharedRegion>, Vec<P>);

/// Rounds of the cross-memory-attach calibration (`calibrate_cma`): every
/// probe is timed once in each, and keeps its best. One round of four
/// timed calls a probe left a probe slow now and then on the Intel VM of
/// 2026-12-01 (a 512 KiB allgather pulled in 243 µs against 39-43 in four
/// other calibrations, a 64 KiB broadcast in 185 against 3.1-3.3), which
/// cut the range the pull won: 11 of 20 calibrations on 2 ranks chose
/// otherwise than the rest. With a second round, milliseconds later, 20 of
/// 20 chose alike (docs/performance-log.md, "The calibration in two
/// rounds").
const CALIBRATION_ROUNDS: usize = 2;

/// Rounds of `calibrate_cma` run before [`CALIBRATION_ROUNDS`] and not
/// kept. The first round finds the slots' lines cold (a call's payloads
/// move along the slots, and each probe is the first call of its size):
/// on 2 ranks of the AMD EPYC VM of 2026-12-07, in 11 of 12 calibrations
/// it timed the allgathers of 64 and 512 KiB blocks through slots
/// 1.4-2.8x slower than the best of the four rounds after it (64 KiB:
/// 10.4-17.5 µs against 5.9-10.4), the pulls 1.0-1.5x (the twelfth was
/// as slow in every round), and so leaned to the pull where loops run
/// faster through slots. Ten start-ups each, in turns: the pull taken
/// from 64 KiB blocks in 5 of 10 before, in none after
/// (docs/performance-log.md, "The calibration's first round").
const CALIBRATION_WARMUP_ROUNDS: usize = 1;

/// Rounds of `Communicator::calibrate_doubling` at each size, the two
/// ways taking turns.
const DOUBLING_ROUNDS: usize = 4;
/// Samples of each way in a round of `Communicator::calibrate_doubling`.
const DOUBLING_SAMPLES: usize = 2;
/// Milliseconds after which `Communicator::calibrate_doubling` times no
/// further size (on 2 ranks of the Intel VM of 2026-12-04 two sizes took
/// about 3 ms).
const DOUBLING_BUDGET_MS: f64 = 20.0;
/// Calls back to back in one sample of `Communicator::calibrate_doubling`.
const DOUBLING_RUN: usize = 8;

impl Communicator {
    /// Allocate a window: `len` elements (zeroed) that every rank of this
    /// communicator maps, used as a slice (`&mut window[..]`). Collectives
    /// whose buffers lie in windows (the same window on every rank, at any
    /// offset) read and write the peers' buffers directly, copying each
    /// byte once instead of twice through slots: allreduce (input and
    /// output in windows), allgather and all-to-all (output in a window),
    /// reduce-scatter (input in a window), broadcast (the root's input
    /// and every output), reduce (every input and the root's output).
    /// This is MPI's `MPI_Win_allocate_shared`, or
    /// NCCL's `ncclMemAlloc` plus a symmetric window registration.
    ///
    /// A collective: every rank calls it, in the same order as its other
    /// collectives; lengths may differ between ranks. Where the ranks
    /// cannot share memory (several hosts, FERROCCL_TRANSPORT=tcp, no
    /// writable shared-memory directory, one rank) every rank gets private
    /// memory instead ([`Window::is_shared`] is false) and collectives on
    /// it run as on any buffer. Once a communicator has a shared window,
    /// each of its collectives starts with a check-in on the shared control
    /// pages (about a cache-line exchange with every peer), not only the
    /// small ones.
    pub fn alloc_window<T: Element>(&self, len: usize) -> Result<Window<T>> {
        let inner = &self.inner;
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "alloc_window: {len} elements of {} do not fit in memory",
                T::DTYPE.name()
            ))
        })?;
        let id = {
            let mut windows = inner.windows.lock_elsewhere();
            // Numbers travel in half a word of an announcement
            // (`exec::checkin`); every rank counts alike and refuses alike.
            if windows.created >= u64::from(u32::MAX) {
                return Err(Error::InvalidArgument(format!(
                    "alloc_window: this communicator has made {} windows, the most it can number",
                    windows.created
                )));
            }
            windows.created += 1;
            windows.created
        };
        // The control pages first (made at creation unless
        // FERROCCL_CHECKIN=0): without them a window is private memory.
        let Some(control) = self.create_control()? else {
            return Ok(Window::private(len));
        };
        let shared = self.share_regions(
            control.memory.as_ref(),
            &format!("alloc_window: window {id}"),
            id,
            |memory, name| memory.create(name, bytes),
            // This rank's own part is reached through the window itself.
            |r, memory, name| (r != inner.rank).then(|| memory.open(name)).transpose(),
        )?;
        let Some((own, parts)) = shared else {
            return Ok(Window::private(len));
        };
        inner
            .windows
            .lock_elsewhere()
            .add(id, (own.addr(), bytes), parts);
        let entry = Registration {
            id,
            registry: Arc::downgrade(&inner.windows),
        };
        if let Some(control) = inner.control.get() {
            // The first window moves every route on (`plan::route`).
            if !control.windows.swap(true, Ordering::Relaxed) {
                inner.routing.changed();
            }
        }
        tracing::debug!(
            rank = inner.rank,
            "alloc_window: window {id} of {bytes} bytes shared by {} ranks",
            inner.size
        );
        Ok(Window::shared(own, len, entry))
    }
    /// Where the ranks can share memory: more than one rank, on one host,
    /// with a provider of shared memory (none where FERROCCL_TRANSPORT=tcp);
    /// the same answer on every rank.
    pub(super) fn shared_memory(&self) -> Option<&Arc<dyn SharedMemory>> {
        let inner = &self.inner;
        (inner.size > 1 && lock(&inner.links).one_host())
            .then_some(inner.shared.as_ref())
            .flatten()
    }
    /// The set-up of memory every rank maps (a collective; control pages
    /// are region 0, windows count from 1), through `memory` (files under
    /// FERROCCL_SHM_DIR for ferroccl-shm): each rank creates its region
    /// `id` with `create`, all agree that every rank could, each maps every
    /// rank's region with `open`, all agree again, and every rank unlinks
    /// every rank's name (the names are unique to the job, the communicator
    /// and the region), so that a rank killed after the agreement leaves
    /// nothing; after a failed set-up the survivors unlink them too.
    /// `Ok(None)` where some rank could not (the caller falls back to
    /// private memory); an error only when the agreement itself fails.
    pub(super) fn share_regions<P>(
        &self,
        memory: &dyn SharedMemory,
        what: &str,
        id: u64,
        create: impl FnOnce(&dyn SharedMemory, &str) -> std::io::Result<Box<dyn SharedRegion>>,
        open: impl Fn(usize, &dyn SharedMemory, &str) -> std::io::Result<P>,
    ) -> Result<Option<Shared<P>>> {
        let inner = &self.inner;
        let name =
            |rank: usize| window::region_name(memory, inner.config.token, inner.comm_id, id, rank);
        let sweep = || {
            for r in 0..inner.size {
                let _ = memory.unlink(&name(r));
            }
        };
        let created = create(memory, &name(inner.rank));
        if let Err(e) = &created {
            tracing::info!(
                rank = inner.rank,
                "{what}: cannot create this rank's part in {}: {e}; private memory instead",
                memory.location()
            );
        }
        let all_created = match self.agree_all(created.is_ok()) {
            Ok(all) => all,
            Err(e) => {
                sweep();
                return Err(e);
            }
        };
        let own = match created {
            Ok(own) if all_created => own,
            Ok(own) => {
                let _ = own.unlink();
                return Ok(None);
            }
            Err(_) => return Ok(None),
        };
        let opened = (0..inner.size)
            .map(|r| open(r, memory, &name(r)))
            .collect::<std::io::Result<Vec<P>>>();
        if let Err(e) = &opened {
            tracing::info!(
                rank = inner.rank,
                "{what}: cannot map a peer's part: {e}; private memory instead"
            );
        }
        let agreed = self.agree_all(opened.is_ok());
        // Every rank has mapped every part, or given up: the files go.
        sweep();
        if !agreed? {
            return Ok(None);
        }
        let parts = opened.map_err(|e| Error::Io(e.to_string()))?;
        Ok(Some((own, parts)))
    }
    /// Give every rank the control pages of all (a collective), unless it
    /// has them (`share_regions`, with a magic word and the process id on
    /// each page), and return them. `Ok(None)` where the ranks cannot
    /// share memory (several hosts, FERROCCL_TRANSPORT=tcp, one rank, a
    /// rank that could not create or map a page): the communicator then
    /// runs every call through slots.
    pub(super) fn create_control(&self) -> Result<Option<Arc<Control>>> {
        let inner = &self.inner;
        if let Some(control) = inner.control.get() {
            return Ok(Some(Arc::clone(control)));
        }
        let Some(memory) = self.shared_memory().cloned() else {
            return Ok(None);
        };
        let create = |memory: &dyn SharedMemory, name: &str| {
            let page = memory.create(name, window::CONTROL_BYTES)?;
            let word = |i: usize| page.word(i);
            // Every page of the announcements and inline space in memory
            // now, not at a call's first use of its slot: each first touch
            // was a page fault (a few µs), which the first 32 calls of each
            // size paid (2-rank allreduce of 64 B, 25 calls: 1.4-2.6 µs a
            // call against 0.57; docs/data/2026-12-02/prefault/). The
            // stores write the zeros the page holds already.
            for i in (0..exec::SPREAD_AT / 8).step_by(OS_PAGE_WORDS) {
                word(i)?.store(0, Ordering::Relaxed);
            }
            word(exec::W_PID)?.store(u64::from(std::process::id()), Ordering::Relaxed);
            // Where word 0 lies in this process, for the peers' probe of
            // cross-memory attach (this mapping lives as long as the page).
            let magic_at = word(exec::W_MAGIC)? as *const AtomicU64 as u64;
            word(exec::W_PROBE)?.store(magic_at, Ordering::Relaxed);
            word(exec::W_MAGIC)?.store(exec::CONTROL_MAGIC, Ordering::Release);
            Ok(page)
        };
        let open = |_: usize, memory: &dyn SharedMemory, name: &str| {
            let page = memory.open(name)?;
            let magic = page.word(exec::W_MAGIC)?.load(Ordering::Acquire);
            if page.len() < window::CONTROL_BYTES || magic != exec::CONTROL_MAGIC {
                return Err(std::io::Error::other(format!(
                    "{} is not a control page of this version",
                    page.path().display()
                )));
            }
            // This process's mapping of the peer's announcements and inline
            // areas, in place before the first call reads them (see
            // `create`).
            for i in (0..exec::SPREAD_AT / 8).step_by(OS_PAGE_WORDS) {
                std::hint::black_box(page.word(i)?.load(Ordering::Relaxed));
            }
            Ok(page)
        };
        let Some((own, pages)) =
            self.share_regions(memory.as_ref(), "control pages", 0, create, open)?
        else {
            return Ok(None);
        };
        let pids: Vec<u32> = pages
            .iter()
            .map(|p| {
                p.word(exec::W_PID)
                    .map(|w| w.load(Ordering::Relaxed) as u32)
                    .unwrap_or(0)
            })
            .collect();
        let (cma, cma_push) = self.probe_cma(memory.as_ref(), &pages, &pids)?;
        let _ = inner.control.set(Arc::new(Control {
            pages: crate::window::Pages::from_regions(pages),
            own: Mutex::new(own),
            pids,
            memory,
            checkins: AtomicU64::new(0),
            inline_end: AtomicU64::new(0),
            left_mask: AtomicU64::new(0),
            oldest_unconfirmed: AtomicU64::new(u64::MAX),
            all_announced: AtomicU64::new(0),
            peers_finished: AtomicU64::new(0),
            early_return: inner.config.early_return,
            windows: AtomicBool::new(false),
            cma,
            cma_push,
            spread_chunks: AtomicU64::new(0),
        }));
        // Calls check in from now on (`plan::route`).
        inner.routing.changed();
        // Read here, once, not inside the first call between windows that
        // asks (`plan::direct_reduce_store`).
        let _ = crate::topo::last_level_cache_bytes();
        // The arguments are built only where INFO is on.
        tracing::info!(
            rank = inner.rank,
            "control pages shared by {} ranks: calls of at most these bytes of input run inline \
             in the check-in: {}{}",
            inner.size,
            inline_limits(inner.size),
            if inner.size == 2 {
                " (fewer where windows take them)"
            } else {
                ""
            },
        );
        if cma && inner.config.calibrate {
            self.calibrate_cma()?;
        }
        if inner.config.calibrate {
            self.calibrate_doubling()?;
        }
        // The pages just set (or, had another thread set some first, those).
        Ok(inner.control.get().cloned())
    }
    /// Whether this rank can read every peer's memory by cross-memory
    /// attach (the probe word of each peer's control page, at the address
    /// the peer wrote there, must read back as the page's magic), agreed by
    /// all ranks (a collective): any rank that cannot, or has FERROCCL_CMA=0,
    /// turns it off for all. Then whether every rank can also write every
    /// peer's memory that way (the magic written back over itself, at the
    /// same address) and has a CPU of its own, agreed the same way: a
    /// broadcast's root then pushes a share of its input into the
    /// receivers' outputs while they pull the rest (`exec::pull`).
    pub(super) fn probe_cma(
        &self,
        memory: &dyn SharedMemory,
        pages: &[Box<dyn SharedRegion>],
        pids: &[u32],
    ) -> Result<(bool, bool)> {
        let inner = &self.inner;
        let probe_at = |peer: usize| -> std::result::Result<usize, String> {
            Ok(pages[peer]
                .word(exec::W_PROBE)
                .map_err(|e| e.to_string())?
                .load(Ordering::Relaxed) as usize)
        };
        let probe = |peer: usize| -> std::result::Result<(), String> {
            let at = probe_at(peer)?;
            let mut word = [0u8; 8];
            memory
                .read_process(pids[peer], at, &mut word)
                .map_err(|e| {
                    format!("reading rank {peer}'s memory (process {}): {e}", pids[peer])
                })?;
            if u64::from_ne_bytes(word) != exec::CONTROL_MAGIC {
                return Err(format!("rank {peer}'s probe word read back wrong"));
            }
            Ok(())
        };
        let mine = if inner.config.cma {
            (0..inner.size)
                .filter(|&p| p != inner.rank)
                .try_for_each(probe)
        } else {
            Err("FERROCCL_CMA=0".into())
        };
        let all = self.agree_all(mine.is_ok())?;
        // The magic over itself: the word holds it already, so a peer
        // reading it meanwhile sees no change.
        let push = |peer: usize| -> std::result::Result<(), String> {
            let at = probe_at(peer)?;
            memory
                .write_process(pids[peer], at, &exec::CONTROL_MAGIC.to_ne_bytes())
                .map_err(|e| format!("writing rank {peer}'s memory (process {}): {e}", pids[peer]))
        };
        // Only where every rank has a CPU of its own: the share pays for
        // itself by two copies at once. On 4 ranks over the 2-core VM the
        // calibration then took the pull for 2 MiB broadcasts in some
        // start-ups, 0.78x in loops (docs/performance-log.md, "A
        // broadcast's root pushes a share").
        let own_cpus = !ferroccl_transport::wait::ranks_share_cpus(inner.size);
        let pushes = all && {
            let mine_push = (if inner.config.cma_push {
                Ok(())
            } else {
                Err("FERROCCL_CMA_PUSH=0".to_string())
            })
            .and_then(|()| {
                (0..inner.size)
                    .filter(|&p| p != inner.rank)
                    .try_for_each(push)
            })
            .and_then(|()| {
                own_cpus
                    .then_some(())
                    .ok_or_else(|| "the ranks share CPUs".to_string())
            });
            let pushes = self.agree_all(mine_push.is_ok())?;
            if !pushes {
                let why = mine_push.err().unwrap_or_else(|| {
                    "another rank cannot write into its peers, or has FERROCCL_CMA_PUSH=0".into()
                });
                tracing::info!(
                    rank = inner.rank,
                    "cross-memory attach reads only ({why}): broadcasts pulled are pulled \
                     whole, allreduces go through slots"
                );
            }
            pushes
        };
        match (&mine, all) {
            (_, true) => tracing::info!(
                rank = inner.rank,
                "cross-memory attach between the {} ranks: allgathers and all-to-alls of \
                 ordinary buffers with blocks of at least {} bytes{} copy straight out of the \
                 peers' processes, {}{} (unless the calibration, where it runs, says \
                 otherwise)",
                inner.size,
                crate::plan::CMA_MIN_BYTES,
                if crate::plan::takes_spread(
                    CollKind::AllGather,
                    crate::plan::CMA_MIN_BYTES,
                    &inner.facts(CollKind::AllGather)
                ) {
                    format!(
                        " (allgathers from {} bytes: smaller blocks through the staging areas)",
                        crate::plan::staged_pull_range(crate::plan::CMA_GATHER_DEFAULT).0
                    )
                } else {
                    String::new()
                },
                match crate::plan::cma_broadcast_default(inner.size) {
                    crate::plan::NO_CMA => "broadcasts never".to_string(),
                    (from, upto) => format!("and broadcasts of {from} to {upto} bytes"),
                },
                match (
                    pushes,
                    crate::plan::cma_allreduce_default(inner.size, pushes)
                ) {
                    (false, _) => String::new(),
                    (true, crate::plan::NO_CMA) => {
                        " (the root pushing a share of each broadcast into the receivers)".into()
                    }
                    (true, (from, upto)) => format!(
                        " (the root pushing a share of each broadcast into the receivers), and \
                         allreduces of {from} to {upto} bytes in halves, each rank pulling its \
                         half of the peer's input and writing the result into both outputs"
                    ),
                }
            ),
            (Err(why), false) => tracing::info!(
                rank = inner.rank,
                "no cross-memory attach ({why}): allgathers, all-to-alls and broadcasts of \
                 ordinary buffers go through slots"
            ),
            (Ok(()), false) => tracing::info!(
                rank = inner.rank,
                "no cross-memory attach (another rank cannot, or has FERROCCL_CMA=0): \
                 allgathers, all-to-alls and broadcasts of ordinary buffers go through slots"
            ),
        }
        Ok((all, pushes))
    }
    /// How many collectives of this communicator ran without the
    /// transport's slots: inline in the check-in on the shared control
    /// pages (input of at most 4 to 16 KiB by collective and size, every
    /// rank on one host), directly
    /// between windows (see [`Communicator::alloc_window`]), or, for large
    /// allgathers, all-to-alls and broadcasts of ordinary buffers, straight out of the
    /// peers' processes by cross-memory attach (FERROCCL_CMA). To check
    /// that a program's buffers are where it thinks.
    pub fn direct_window_calls(&self) -> u64 {
        self.inner.direct_calls.load(Ordering::Relaxed)
    }
    /// Measure from which block size an allgather of ordinary buffers is
    /// faster pulled by cross-memory attach than through slots, and pull
    /// over the blocks where it is (`Inner::cma_gather`), over which
    /// sizes a broadcast is (`Inner::cma_broadcast`), and, on 2 ranks that
    /// may write into each other, over which an allreduce in halves is
    /// (`Inner::cma_allreduce`, at `plan::cma_allreduce_probes`, decided
    /// by `plan::cma_allreduce_range`), and, where allgathers go through
    /// the staging areas, over which blocks an all-to-all is
    /// (`Inner::cma_alltoall`, at `plan::cma_alltoall_probes`; elsewhere
    /// it takes the allgathers' range): each rank times allgathers
    /// and broadcasts of each of `plan::cma_probes` both ways (the best of
    /// four after a warm-up call, in each of [`CALIBRATION_ROUNDS`] rounds
    /// over every probe after [`CALIBRATION_WARMUP_ROUNDS`] untimed ones,
    /// the best of the rounds), the ranks agree on the slowest
    /// rank's times,
    /// and `plan::cma_range` decides for each,
    /// so every rank routes alike. Runs at the control pages' creation
    /// where every rank can pull (a collective, before any call of the
    /// user's can be in flight); FERROCCL_CALIBRATE=0 keeps
    /// `plan::CMA_MIN_BYTES`, `plan::cma_broadcast_default` and
    /// `plan::CMA_ALLREDUCE`.
    pub(super) fn calibrate_cma(&self) -> Result<()> {
        let inner = &self.inner;
        let n = inner.size;
        let blocks = crate::plan::cma_probes(&inner.facts(CollKind::AllGather));
        let push = inner.control.get().is_some_and(|c| c.cma_push);
        let reduces = crate::plan::cma_allreduce_probes(n, push, inner.config.nt_store_bytes);
        let exchanges = crate::plan::cma_alltoall_probes(&inner.facts(CollKind::AllToAll));
        if blocks.is_empty() && reduces.is_empty() {
            return Ok(());
        }
        let most = blocks.iter().chain(&reduces).copied().max().unwrap_or(0) / 4;
        // An all-to-all's buffers are n blocks each.
        let most_exchanged = exchanges.iter().copied().max().unwrap_or(0) / 4 * n;
        let input = vec![inner.rank as f32; most.max(most_exchanged)];
        let mut output = vec![0f32; (most * n).max(most_exchanged)];
        // Each probe's best over the rounds: (allgather, broadcast) x
        // blocks x (pulled, through slots), then allreduces x (in halves,
        // through slots), then all-to-alls x (pulled, through slots), in
        // the order they run.
        let mut times =
            vec![f32::INFINITY; 4 * blocks.len() + 2 * reduces.len() + 2 * exchanges.len()];
        // One internal call out of place (an allreduce sums).
        let out_of_place = |kind: CollKind, input: &[f32], output: &mut [f32]| -> Result<()> {
            let call = CollCall {
                op: (kind == CollKind::AllReduce).then_some(ReduceOp::Sum),
                internal: true,
                ..CollCall::new(kind, input.len(), input.len(), output.len())
            };
            self.collective(
                &call,
                Buffers::OutOfPlace {
                    send: input,
                    recv: output,
                },
            )
        };
        let broadcast = |buf: &mut [f32]| -> Result<()> {
            let n = buf.len();
            let call = CollCall {
                root: Some(0),
                in_place: true,
                internal: true,
                ..CollCall::new(CollKind::Broadcast, n, n, n)
            };
            self.collective(&call, Buffers::InPlace(buf))
        };
        let best_of_four = |mut run: Box<dyn FnMut() -> Result<()> + '_>| -> Result<f32> {
            let mut best = f64::INFINITY;
            for turn in 0..5 {
                let start = Instant::now();
                run()?;
                if turn > 0 {
                    best = best.min(start.elapsed().as_secs_f64() * 1e6);
                }
            }
            Ok(best as f32)
        };
        // `run` timed with `range` forced the direct way (pulled, in
        // halves), then the other, each best kept in the next of `slots`.
        let both_ways = |range: Range,
                         slots: &mut std::slice::IterMut<'_, f32>,
                         run: &mut dyn FnMut() -> Result<()>|
         -> Result<()> {
            for direct in [true, false] {
                let forced = if direct {
                    (0, usize::MAX)
                } else {
                    crate::plan::NO_CMA
                };
                inner.routing.set_range(range, forced);
                let best = best_of_four(Box::new(&mut *run))?;
                if let Some(slot) = slots.next() {
                    *slot = slot.min(best);
                }
            }
            Ok(())
        };
        // Allgathers of each block, then broadcasts of a block's bytes (in
        // place, from rank 0), each pulled and by the route it takes
        // otherwise: through slots, or for a broadcast on 3 to 8 ranks
        // the root's staging area (`plan::takes_spread`), so that the pull
        // is weighed against what it would replace.
        let result = (|| -> Result<()> {
            for round in 0..CALIBRATION_WARMUP_ROUNDS + CALIBRATION_ROUNDS {
                if round == CALIBRATION_WARMUP_ROUNDS {
                    // What the warm-up measured is not kept.
                    times.fill(f32::INFINITY);
                }
                let mut slots = times.iter_mut();
                for (broadcasts, range) in [(false, Range::Gather), (true, Range::Broadcast)] {
                    for &block in &blocks {
                        let count = block / 4;
                        both_ways(range, &mut slots, &mut || {
                            if broadcasts {
                                broadcast(&mut output[..count])
                            } else {
                                out_of_place(
                                    CollKind::AllGather,
                                    &input[..count],
                                    &mut output[..count * n],
                                )
                            }
                        })?;
                    }
                }
                // Allreduces out of place, in halves and through slots.
                for &bytes in &reduces {
                    let count = bytes / 4;
                    both_ways(Range::AllReduce, &mut slots, &mut || {
                        out_of_place(CollKind::AllReduce, &input[..count], &mut output[..count])
                    })?;
                }
                // All-to-alls of n such blocks, pulled and through the
                // staging areas (which take them wherever these probes
                // run: `plan::cma_alltoall_probes`).
                for &block in &exchanges {
                    let count = block / 4 * n;
                    both_ways(Range::AllToAll, &mut slots, &mut || {
                        out_of_place(CollKind::AllToAll, &input[..count], &mut output[..count])
                    })?;
                }
            }
            Ok(())
        })();
        // Whatever happened, no route stays forced.
        let routing = &inner.routing;
        routing.set_range(Range::Gather, crate::plan::CMA_GATHER_DEFAULT);
        routing.set_range(Range::AllToAll, crate::plan::CMA_GATHER_DEFAULT);
        routing.set_range(Range::Broadcast, crate::plan::cma_broadcast_default(n));
        routing.set_range(
            Range::AllReduce,
            crate::plan::cma_allreduce_default(n, true),
        );
        result?;
        // The slowest rank's times: every rank decides alike.
        let mut agreed = vec![0f32; times.len()];
        let call = CollCall {
            op: Some(ReduceOp::Max),
            internal: true,
            ..CollCall::new(CollKind::AllReduce, times.len(), times.len(), times.len())
        };
        self.collective(
            &call,
            Buffers::OutOfPlace {
                send: &times,
                recv: &mut agreed,
            },
        )?;
        let probes = |sizes: &[usize], times: &[f32]| -> Vec<(usize, f64, f64)> {
            sizes
                .iter()
                .zip(times.chunks(2))
                .map(|(&b, t)| (b, f64::from(t[0]), f64::from(t[1])))
                .collect()
        };
        let (gathers, rest) = agreed.split_at(2 * blocks.len());
        let (broadcasts, rest) = rest.split_at(2 * blocks.len());
        let (reduced, exchanged) = rest.split_at(2 * reduces.len());
        let (gathers, broadcasts, reduced, exchanged) = (
            probes(&blocks, gathers),
            probes(&blocks, broadcasts),
            probes(&reduces, reduced),
            probes(&exchanges, exchanged),
        );
        let (gather, broadcast) = (
            crate::plan::cma_range(&gathers, crate::plan::NO_CMA),
            crate::plan::cma_range(&broadcasts, crate::plan::cma_broadcast_default(n)),
        );
        // A tie is a win: the pull is the all-to-all's range without a
        // calibration.
        let exchange = if exchanged.is_empty() {
            gather
        } else {
            crate::plan::cma_range(&exchanged, crate::plan::CMA_GATHER_DEFAULT)
        };
        routing.set_range(Range::Gather, gather);
        routing.set_range(Range::AllToAll, exchange);
        routing.set_range(Range::Broadcast, broadcast);
        let halves = if reduced.is_empty() {
            crate::plan::cma_allreduce_default(n, push)
        } else {
            crate::plan::cma_allreduce_range(&reduced)
        };
        routing.set_range(Range::AllReduce, halves);
        let range = |(from, upto): (usize, usize), what: &str| match (from, upto) {
            crate::plan::NO_CMA => "never (the other route won at every size)".to_string(),
            (from, usize::MAX) => format!("from {what}{from} bytes"),
            (from, upto) => format!("from {what}{from} to {upto} bytes"),
        };
        let said = |probes: &[(usize, f64, f64)]| {
            probes
                .iter()
                .map(|(b, p, s)| format!("{b}: {p:.1} / {s:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        // Where the staging areas take allgathers, those pull from
        // larger blocks than the all-to-alls (`plan::staged_pull_range`).
        let facts = inner.facts(CollKind::AllGather);
        let pulls =
            if crate::plan::takes_spread(CollKind::AllGather, crate::plan::CMA_MIN_BYTES, &facts) {
                format!(
                    "all-to-alls pull {}{}, allgathers {} (smaller blocks through the staging \
                     areas)",
                    range(exchange, "blocks of "),
                    if exchanged.is_empty() {
                        String::new()
                    } else {
                        format!(" (blocks: pull us / staged us {})", said(&exchanged))
                    },
                    match crate::plan::staged_pull_range(gather) {
                        crate::plan::NO_CMA => "never".to_string(),
                        staged => range(staged, "blocks of "),
                    }
                )
            } else {
                format!(
                    "allgathers and all-to-alls pull {}",
                    range(gather, "blocks of ")
                )
            };
        tracing::info!(
            rank = inner.rank,
            "cross-memory attach calibrated on {n} ranks (bytes: pull us / otherwise us): \
             allgather blocks {}; broadcasts {}; {pulls}, broadcasts {}{}",
            said(&gathers),
            said(&broadcasts),
            range(broadcast, ""),
            if reduced.is_empty() {
                String::new()
            } else {
                format!(
                    "; allreduces (halves us / slots us) {}: in halves {}",
                    said(&reduced),
                    range(halves, "")
                )
            },
        );
        Ok(())
    }
    /// Measure up to which size an allreduce of ordinary buffers through
    /// slots is faster by recursive doubling than by the ring the model
    /// chose (`Inner::doubling`): each rank times in-place allreduces of
    /// each of `plan::DOUBLING_PROBE_BYTES` that `plan::doubling_probe`
    /// keeps, both ways, in samples of [`DOUBLING_RUN`] calls back to
    /// back ([`DOUBLING_SAMPLES`] a way in each of [`DOUBLING_ROUNDS`]
    /// rounds, the two ways taking turns, each after one untimed call);
    /// the ranks agree on the slowest rank's median sample after each size
    /// and stop at the first the ring wins by 5% (or once the calibration
    /// has run [`DOUBLING_BUDGET_MS`]), and `plan::doubling_until` decides.
    ///
    /// Medians of calls in a row, not the best single call: what the
    /// ring's second meeting costs in a loop is the question, and its best
    /// case is the one the model already assumes. On the Intel VM of
    /// 2026-12-04 the best of eight single calls of 32 KiB tied the two in
    /// two calibrations of three (5.8-5.9 µs by the ring, 6.0 by recursive
    /// doubling) where loops took the ring 6.6-7.2 µs. Where the VM ran
    /// its fast state the ring's samples were faster (5.0 against 7.0) and
    /// it kept the ring, which then took 4.2 µs in the loop.
    ///
    /// Runs at the control pages' creation (a collective, before any call
    /// of the user's can be in flight); FERROCCL_CALIBRATE=0 leaves the
    /// model alone.
    pub(super) fn calibrate_doubling(&self) -> Result<()> {
        let inner = &self.inner;
        let n = inner.size;
        let facts = inner.facts(CollKind::AllReduce);
        let links = inner.host_links();
        let sizes: Vec<usize> = crate::plan::DOUBLING_PROBE_BYTES
            .into_iter()
            .filter(|&b| crate::plan::doubling_probe(b, &facts, &links))
            .collect();
        let Some(&most) = sizes.last() else {
            return Ok(());
        };
        let mut buf = vec![inner.rank as f32; most / 4];
        let mut probes: Vec<(usize, f64, f64)> = Vec::with_capacity(sizes.len());
        let allreduce = |buf: &mut [f32], op: ReduceOp| -> Result<()> {
            let call = CollCall {
                internal: true,
                ..CollCall::all_reduce_in_place(buf.len(), op)
            };
            self.collective(&call, Buffers::InPlace(buf))
        };
        // `upto` in force, and no plan made under another.
        let doubling = |upto: usize| {
            inner.routing.set_doubling(upto);
            inner.plans.clear();
        };
        let began = Instant::now();
        let result = (|| -> Result<()> {
            for &bytes in &sizes {
                let buf = &mut buf[..bytes / 4];
                // Recursive doubling's times, the ring's.
                let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
                for _round in 0..DOUBLING_ROUNDS {
                    for (way, upto) in [(0, usize::MAX), (1, 0)] {
                        doubling(upto);
                        allreduce(buf, ReduceOp::Max)?;
                        for _sample in 0..DOUBLING_SAMPLES {
                            let start = Instant::now();
                            for _ in 0..DOUBLING_RUN {
                                allreduce(buf, ReduceOp::Max)?;
                            }
                            let us = start.elapsed().as_secs_f64() * 1e6;
                            times[way].push(us / DOUBLING_RUN as f64);
                        }
                    }
                }
                // Each rank's medians, then the slowest rank's: every rank
                // decides alike.
                doubling(0);
                let [ours, ring] = times.map(|mut t| {
                    t.sort_by(f64::total_cmp);
                    t.get(t.len() / 2).copied().unwrap_or(f64::INFINITY) as f32
                });
                // And how long the calibration has run on the slowest
                // rank: a communicator of many ranks sharing few CPUs
                // stops before its larger probes.
                let ms = began.elapsed().as_secs_f64() * 1e3;
                let mut agreed = [ours, ring, ms as f32];
                allreduce(&mut agreed, ReduceOp::Max)?;
                let (ours, ring) = (f64::from(agreed[0]), f64::from(agreed[1]));
                probes.push((bytes, ours, ring));
                if ring <= ours * crate::plan::RING_WIN
                    || f64::from(agreed[2]) >= DOUBLING_BUDGET_MS
                {
                    break;
                }
            }
            Ok(())
        })();
        // Whatever happened, no probe's setting stays.
        doubling(if result.is_ok() {
            crate::plan::doubling_until(&probes)
        } else {
            0
        });
        result?;
        let upto = inner.routing.doubling();
        tracing::info!(
            rank = inner.rank,
            "recursive doubling against the ring calibrated on {n} ranks in {:.1} ms (bytes: \
             recursive doubling us / ring us): {}; allreduces {} (otherwise the model's choice)",
            began.elapsed().as_secs_f64() * 1e3,
            probes
                .iter()
                .map(|(b, d, r)| format!("{b}: {d:.1} / {r:.1}"))
                .collect::<Vec<_>>()
                .join(", "),
            if upto == 0 {
                "never take recursive doubling for the ring".to_string()
            } else {
                format!("of up to {upto} bytes take recursive doubling for the ring")
            }
        );
        Ok(())
    }
    /// Whether `ok` holds on every rank (a collective).
    pub(super) fn agree_all(&self, ok: bool) -> Result<bool> {
        let mine = [u8::from(!ok)];
        let mut any_failed = [0u8];
        let call = CollCall {
            op: Some(ReduceOp::Max),
            internal: true,
            ..CollCall::new(CollKind::AllReduce, 1, 1, 1)
        };
        self.collective(
            &call,
            Buffers::OutOfPlace {
                send: &mine,
                recv: &mut any_failed,
            },
        )?;
        Ok(any_failed[0] == 0)
    }
}

/// Each collective's inline limit on `size` ranks without windows, as the
/// planner computes it (`plan::limit_without_windows`), for the INFO line
/// at the control pages' creation: "all_reduce 16384, broadcast 16384, ...".
fn inline_limits(size: usize) -> String {
    [
        CollKind::AllReduce,
        CollKind::Broadcast,
        CollKind::Reduce,
        CollKind::ReduceScatter,
        CollKind::AllGather,
        CollKind::AllToAll,
    ]
    .into_iter()
    .map(|kind| {
        let limit = crate::plan::limit_without_windows(kind, size);
        format!("{} {limit}", kind.name())
    })
    .collect::<Vec<_>>()
    .join(", ")
}
