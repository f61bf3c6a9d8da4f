//! Carrying a call out: its plan (the planner's algorithm and slice
//! geometry, allreduce plans cached), the facts the planner routes it by,
//! and the hand-over to `exec`, which runs it. The route of a host call,
//! and every threshold behind it, is `plan::host`'s; a device call's path
//! is `plan::device`'s: `Inner::execute_on_device` runs it by the device
//! executor where `plan::device::takes_executor` allows it and
//! `plan::device::decide` chose the executor for the engine (at its set-up
//! in `comm::device_exec`), else through the staged executor
//! (`exec::staged`).

use super::plans::PlanKey;
use super::routes::Range;
use super::{lock, CallSpec, Communicator, Inner};
use crate::coll::{self, CollCall, CollKind, Plan};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::exec::{self, Call, HostIo, Io, Links};
use crate::plan::tune;
use crate::plan::{self, Facts, Memory};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A call's plan: from the cache, or built for this call.
pub(super) enum Planned {
    Cached(Arc<Plan>),
    Built(Plan),
}

/// A blocking call's plan: from a slot of the cache (`Plans::slot`), or
/// as `Communicator::plan` gives it.
pub(super) enum PlannedHere<'a> {
    Slot(&'a Plan),
    Planned(Planned),
}

impl std::ops::Deref for PlannedHere<'_> {
    type Target = Plan;
    fn deref(&self) -> &Plan {
        match self {
            PlannedHere::Slot(plan) => plan,
            PlannedHere::Planned(plan) => plan,
        }
    }
}

impl std::ops::Deref for Planned {
    type Target = Plan;
    fn deref(&self) -> &Plan {
        match self {
            Planned::Cached(plan) => plan,
            Planned::Built(plan) => plan,
        }
    }
}

/// Bytes of a call's input, which the planner routes it by.
fn in_bytes<T>(call: &Call, size: usize) -> usize {
    call.kind.extents(call.fingerprint.count as usize, size).0 * std::mem::size_of::<T>()
}

impl Communicator {
    /// The plan of `call` for elements of `T` (arguments checked first):
    /// the algorithm and slice geometry are the planner's, the schedule is
    /// the collective's. Collective plans on host memory come from a cache
    /// of recent ones by [`PlanKey`]: training loops and benchmarks repeat
    /// their calls, and choosing an algorithm and building its schedule
    /// cost more than running a small call over shared memory (small
    /// allgathers, reduce-scatters, broadcasts and reduces on 2 ranks took
    /// 1.2-1.8x as long when every call built its plan, even those that
    /// then ran inline and never read it).
    #[inline(always)]
    pub(super) fn plan<T: Element>(&self, call: &CollCall) -> Result<Planned> {
        // Host memory only (device calls are planned over their own links
        // and go through `execute_on_device`); point-to-point calls name a
        // peer and are cheap to plan.
        if !Self::cacheable(call) {
            return match self.build_plan::<T>(call) {
                Ok(plan) => Ok(Planned::Built(plan)),
                Err(err) => Err(self.refuse::<T>(call, err)),
            };
        }
        let key = self.plan_key::<T>(call);
        if let Some(plan) = self.inner.plans.get(&key) {
            return Ok(Planned::Cached(plan));
        }
        let plan = match self.build_plan::<T>(call) {
            Ok(plan) => Arc::new(plan),
            Err(err) => return Err(self.refuse::<T>(call, err)),
        };
        self.inner.plans.insert(key, plan.clone());
        Ok(Planned::Cached(plan))
    }

    /// Whether `call`'s plan is kept (`plan`): host memory, and not
    /// point-to-point (which names a peer and is cheap to plan).
    #[inline(always)]
    fn cacheable(call: &CollCall) -> bool {
        call.memory == Memory::Host && call.p2p.is_none() && call.kind != CollKind::SendRecv
    }

    #[inline(always)]
    fn plan_key<T: Element>(&self, call: &CollCall) -> PlanKey {
        (
            *call,
            std::mem::size_of::<T>(),
            self.inner.control.get().is_some(),
        )
    }

    /// `plan` for a blocking call: a plan in a slot of the cache comes
    /// without a lock or an atomic count (`Plans::slot`).
    #[inline(always)]
    pub(super) fn plan_here<T: Element>(&self, call: &CollCall) -> Result<PlannedHere<'_>> {
        if Self::cacheable(call) {
            if let Some(plan) = self.inner.plans.slot(&self.plan_key::<T>(call)) {
                return Ok(PlannedHere::Slot(plan));
            }
        }
        self.plan::<T>(call).map(PlannedHere::Planned)
    }

    /// A collective this rank refuses (`err`, a bad argument found before
    /// anything moved): it still takes its place in the order, and the
    /// other ranks hear of it at once, so that those which accepted the
    /// call end it with an error naming this rank and the reason instead of
    /// waiting out the timeout (those which refused it too go on).
    #[cold]
    fn refuse<T: Element>(&self, call: &CollCall, err: Error) -> Error {
        let inner = &self.inner;
        if call.p2p.is_some() || inner.size == 1 || inner.has_failed() {
            return err;
        }
        let spec = CallSpec {
            refused: true,
            ..self.spec::<T>(call)
        };
        let Ok((ticket, issued)) = inner.issue(&spec, None) else {
            return err;
        };
        inner.wait_turn(ticket);
        inner.refused_at(&issued, &err);
        inner.end_turn();
        err
    }

    fn build_plan<T: Element>(&self, call: &CollCall) -> Result<Plan> {
        let inner = &self.inner;
        inner.build_plan_chunked::<T>(call, inner.chunk_bytes)
    }
}

impl Inner {
    /// The plan of `call` with frames of at most `chunk_bytes` (the host
    /// slots' size, or the device executor's chunk).
    pub(super) fn build_plan_chunked<T: Element>(
        &self,
        call: &CollCall,
        chunk_bytes: usize,
    ) -> Result<Plan> {
        let inner = self;
        let elem = std::mem::size_of::<T>();
        let count = call.slice_count(inner.size);
        // The model slices a broadcast or reduce by the frames this plan
        // has: the host slots', or the device executor's chunk.
        let facts = inner.facts_chunked(call.kind, chunk_bytes);
        let bytes = call.count * elem;
        if !inner.user.is_empty() && !call.internal {
            if let Some(user) = coll::user_collective(call.kind).and_then(|c| inner.user.get(c)) {
                return inner.build_user_plan(call, user, (count, elem), chunk_bytes, &facts);
            }
        }
        // Only collectives with a choice ask the model (it allocates the
        // list of costs): the others run their one algorithm.
        let (algorithm, costs, measured) =
            if tune::has_choice(call.kind, facts.layout) || facts.forced.is_some() {
                plan::algorithm_why(call.kind, bytes, &facts, &inner.links_for(call, &facts))
            } else {
                (crate::algo::Algorithm::Ring, Vec::new(), false)
            };
        // A device call says its plan once its path is known
        // (`execute_on_device`, `exec_run`). The library's own calls
        // (the calibration's probes, which force routes, and agreements)
        // say nothing, so that the line of each size is the user's call's.
        if tracing::enabled!(tracing::Level::INFO)
            && call.memory == Memory::Host
            && !call.internal
            && lock(&inner.tuned).insert((call.kind.code(), tune::size_class(bytes)))
        {
            tracing::info!(
                rank = inner.rank,
                "plan: {}",
                plan::explain(
                    call.kind,
                    (bytes, call.in_place),
                    &facts,
                    (algorithm, measured),
                    &costs
                )
            );
        }
        // Ring passes keep several slices in flight: the host's slots and
        // the device FIFOs' bulk slots are both `config.steps` a direction
        // (the device's LL lines are 8 a direction, above the depth cap).
        // Host calls between ranks of one host (which share control pages)
        // go through shared memory: two ranks of a symmetric collective
        // run each piece as one slice there (`Geometry::in_shared_memory`).
        let mut geometry = plan::geometry(
            call.kind,
            algorithm,
            (inner.rank, inner.size),
            count,
            elem,
            chunk_bytes,
        );
        if facts.control && call.memory == Memory::Host {
            geometry = geometry.in_shared_memory(
                call.kind,
                algorithm,
                (count, elem, chunk_bytes, inner.config.steps),
            );
        }
        let geometry = geometry
            .pipelined(inner.config.steps, inner.config.pipeline_depth)
            .bounded(call.kind, count, elem, chunk_bytes)?;
        let mut plan = coll::plan_on(call, geometry, algorithm, Some(&inner.hosts))?;
        // Without control pages a broadcast or reduce (or a call of no
        // elements) confirms through frames of its own; with them, through
        // the pages (`Inner::execute_checked`).
        // Device memory goes through slots whatever the pages (the staged
        // executor), so it confirms through frames too.
        let frames = !facts.control || call.memory != Memory::Host;
        if frames && plan::confirms(call.kind, call.count, inner.size) {
            let confirm = coll::confirmation(call, geometry, algorithm);
            plan.schedule.steps.extend(confirm.steps);
        }
        Ok(plan)
    }
}

impl Inner {
    /// The links the planner chooses `call`'s algorithm over: the measured
    /// host links for host memory, the device's own model
    /// (`plan::device::links`) for device memory, whichever executor then
    /// runs it.
    fn links_for(&self, call: &CollCall, facts: &plan::Facts) -> tune::HostLinks {
        match call.memory {
            Memory::Host => self.host_links(),
            Memory::Device { .. } => plan::device::links(facts.layout),
        }
    }

    /// The measured links a host call's algorithm is chosen over.
    pub(super) fn host_links(&self) -> tune::HostLinks {
        tune::HostLinks {
            intra: *lock(&self.intra_model),
            inter: *lock(&self.model),
        }
    }

    /// The name of the algorithm `build_plan_chunked` runs `call` (of
    /// `bytes`, in frames of `chunk_bytes`) by, for the device paths'
    /// `plan:` lines.
    pub(super) fn algorithm_name(
        &self,
        call: &CollCall,
        bytes: usize,
        chunk_bytes: usize,
    ) -> String {
        let facts = self.facts_chunked(call.kind, chunk_bytes);
        if !self.user.is_empty() && !call.internal {
            if let Some(user) = coll::user_collective(call.kind).and_then(|c| self.user.get(c)) {
                return format!("user algorithm '{}'", user.name());
            }
        }
        if tune::has_choice(call.kind, facts.layout) || facts.forced.is_some() {
            let links = self.links_for(call, &facts);
            let (algorithm, _) = plan::algorithm(call.kind, bytes, &facts, &links);
            match call.memory {
                Memory::Host => format!("{algorithm} (the host model's)"),
                Memory::Device { .. } => format!("{algorithm} (the device model's)"),
            }
        } else {
            crate::algo::Algorithm::Ring.to_string()
        }
    }
}

impl Inner {
    /// The plan of an allreduce, allgather or reduce-scatter the user
    /// algorithm `user` runs.
    #[cold]
    fn build_user_plan(
        &self,
        call: &CollCall,
        user: &crate::algo::user::Checked,
        (count, elem): (usize, usize),
        chunk_bytes: usize,
        facts: &Facts,
    ) -> Result<Plan> {
        let bytes = call.count * elem;
        if tracing::enabled!(tracing::Level::INFO)
            && lock(&self.tuned).insert((call.kind.code(), tune::size_class(bytes)))
        {
            tracing::info!(
                rank = self.rank,
                "plan: {}",
                plan::explain_user(call.kind, (bytes, call.in_place), facts, user)
            );
        }
        // Frames as large as the ring's: a pass of the algorithm per block.
        let geometry = plan::geometry(
            call.kind,
            crate::algo::Algorithm::Ring,
            (self.rank, self.size),
            count,
            elem,
            chunk_bytes,
        )
        .bounded(call.kind, count, elem, chunk_bytes)?;
        let mut plan = coll::user_plan(call, geometry, user)?;
        let frames = !facts.control || call.memory != Memory::Host;
        if frames && plan::confirms(call.kind, call.count, self.size) {
            let confirm = coll::confirmation(call, geometry, crate::algo::Algorithm::Ring);
            plan.schedule.steps.extend(confirm.steps);
        }
        Ok(plan)
    }
}

impl Communicator {
    /// What a call carries besides its buffers, for its fingerprint.
    pub(super) fn spec<T: Element>(&self, call: &CollCall) -> CallSpec {
        CallSpec {
            kind: call.kind,
            dtype: T::DTYPE,
            op: call.op,
            count: call.count,
            root: call.root,
            p2p: call.p2p,
            internal: call.internal,
            refused: false,
        }
    }
}

impl Inner {
    /// The facts the planner routes this communicator's calls of `kind`
    /// by (the same on every rank).
    #[inline]
    pub(super) fn facts(&self, kind: CollKind) -> Facts {
        let control = self.control.get();
        Facts {
            size: self.size,
            control: control.is_some(),
            cma: control.is_some_and(|c| c.cma),
            windows: control.is_some_and(|c| c.windows.load(Ordering::Relaxed)),
            forced: self.config.algorithm,
            layout: tune::Layout {
                hosts: self.hosts.hosts(),
                largest: self.hosts.largest(),
            },
            user: !self.user.is_empty()
                && coll::user_collective(kind).is_some_and(|c| self.user.get(c).is_some()),
            nt_store_bytes: self.config.nt_store_bytes,
            chunk_bytes: self.chunk_bytes,
            cma_gather: self.routing.range(Range::Gather),
            cma_alltoall: self.routing.range(Range::AllToAll),
            cma_broadcast: self.routing.range(Range::Broadcast),
            cma_allreduce: if control.is_some_and(|c| c.cma_push) {
                self.routing.range(Range::AllReduce)
            } else {
                crate::plan::NO_CMA
            },
            shared_cores: self.routing.shared_cores(),
            spread: self.config.spread,
            doubling: self.routing.doubling(),
            llc_bytes: crate::topo::last_level_cache_bytes(),
        }
    }

    /// `facts(kind)` for a plan in frames of `chunk_bytes` (the host
    /// slots', or the device executor's chunk).
    fn facts_chunked(&self, kind: CollKind, chunk_bytes: usize) -> Facts {
        Facts {
            chunk_bytes,
            ..self.facts(kind)
        }
    }

    /// The route of a host call of `kind` with `in_bytes` of input, in
    /// place or not, from the facts as they are now, kept for the calls
    /// that repeat it (`routes::Routing::kept`).
    #[inline(never)]
    fn route_afresh(&self, kind: CollKind, in_bytes: usize, in_place: bool) -> Result<plan::Route> {
        // The epoch before the facts: a change after this read keeps the
        // route under the old epoch, never used again.
        let epoch = self.routing.epoch();
        let route = plan::route(kind, in_bytes, in_place, Memory::Host, &self.facts(kind))?;
        self.routing.keep((kind, in_bytes, in_place), route, epoch);
        Ok(route)
    }

    /// Run a checked call (the caller holds its turn).
    #[inline(always)]
    pub(super) fn execute<T: Element>(
        &self,
        plan: &Plan,
        io: Io<'_, T>,
        call: &Call,
    ) -> Result<()> {
        if self.has_failed() {
            if let Some(err) = self.relabelled_failure(call) {
                return Err(err);
            }
        }
        if let Some(err) = self.heard_mismatch(call, false) {
            return Err(err);
        }
        // The route of a call on host buffers (device calls take the
        // device half's path).
        let route = match &io {
            Io::Host(host) => {
                let bytes = in_bytes::<T>(call, self.size);
                // A small call's route, told without the facts that
                // change (`plan::always_inline`).
                if plan::always_inline(call.kind, bytes)
                    && self.config.algorithm.is_none()
                    && self.user.is_empty()
                    && self.control.get().is_some()
                {
                    Some(plan::Route::Inline)
                } else {
                    let in_place = matches!(host, HostIo::InPlace { .. });
                    match self.routing.kept(call.kind, bytes, in_place) {
                        Some(route) => Some(route),
                        None => match self.route_afresh(call.kind, bytes, in_place) {
                            Ok(route) => Some(route),
                            Err(err) => return Err(self.on_error(err, call)),
                        },
                    }
                }
            }
            _ => None,
        };
        // Check-ins this rank left before its peers came (a broadcast's
        // root, a reduce's senders) are compared before any other call;
        // another such one compares them only when it needs their slot
        // (in batches). A call that does not check in also waits until
        // every peer announced the last check-in (`exec::settle`). A
        // mismatch found there fails this call, naming that one.
        if let Some(control) = self.control.get() {
            let ctx = self.ctx(control);
            if exec::unsettled(&ctx) {
                let root = call.fingerprint.root as usize;
                let early = self.config.early_return;
                let settled = match route {
                    Some(plan::Route::Inline)
                        if plan::leaves_early(call.kind, self.rank, root, early) =>
                    {
                        let next = control.checkins.load(Ordering::Relaxed);
                        match (next + 1).checked_sub(exec::CHECKIN_SLOTS) {
                            Some(upto) => exec::confirm_left(&ctx, upto, call),
                            None => Ok(()),
                        }
                    }
                    Some(plan::Route::Inline | plan::Route::CheckIn { .. }) => {
                        exec::confirm_left(&ctx, u64::MAX, call)
                    }
                    _ => exec::settle(&ctx, call),
                };
                if let Err(failed) = settled {
                    let (err, at) = *failed;
                    return Err(self.on_error(err, &at));
                }
            }
        }
        let result = self.execute_checked(plan, io, call, route);
        match result {
            Ok(()) => Ok(()),
            Err(err) => Err(self.on_error(err, call)),
        }
    }

    /// Run a call the way the planner routes it (`route`, for host
    /// buffers): inline, directly between windows or out of the peers'
    /// processes where the ranks share control pages and the call allows
    /// it, else its schedule through slots.
    #[inline(always)]
    fn execute_checked<T: Element>(
        &self,
        plan: &Plan,
        io: Io<'_, T>,
        call: &Call,
        route: Option<plan::Route>,
    ) -> Result<()> {
        if let Io::Device(device) = io {
            return self.execute_on_device::<T>(plan, *device, call);
        }
        let memory = io.memory();
        let (Io::Host(mut io), Some(route)) = (io, route) else {
            return Err(plan::device_unsupported(call.kind, memory));
        };
        // With control pages the route may skip the slots (inline, between
        // windows, out of the peers' processes).
        if let Some(control) = self.control.get() {
            let ctx = self.ctx(control);
            if exec::run_checked_in(&ctx, &mut io, call, route)? {
                // Only the call holding its turn counts (no locked instruction:
                // one here waits for the announcement's cross-core store).
                let calls = self.direct_calls.load(Ordering::Relaxed);
                self.direct_calls.store(calls + 1, Ordering::Relaxed);
                return Ok(());
            }
        }
        let mut links = lock(&self.links);
        let result = self.run_slots(&mut links, plan, io, call);
        drop(links);
        result?;
        // A broadcast or reduce does not tell every rank from its data that
        // every other ran the same call: with control pages, compare the
        // peers' notes (without them, the schedule ends with a
        // confirmation of its own: `coll::plan`).
        if route == (plan::Route::Slots { note: true })
            && plan::confirms(call.kind, call.fingerprint.count as usize, self.size)
        {
            if let Some(control) = self.control.get() {
                let ctx = self.ctx(control);
                exec::confirm(&ctx, call)?;
            }
        }
        Ok(())
    }

    /// What the control-page paths need of this communicator.
    fn ctx<'a>(&'a self, control: &'a crate::window::Control) -> exec::Ctx<'a> {
        exec::Ctx {
            rank: self.rank,
            size: self.size,
            control,
            windows: &self.windows,
            abort: &self.abort_signal,
        }
    }

    /// Run a call on device buffers by the path `plan::device` gives it:
    /// the device executor where the communicator set that up for the
    /// engine, else, after the caller's stream's earlier work (the event
    /// recorded at the call), its schedule through slots by the staged
    /// executor, which returns once every copy and kernel has finished (so
    /// later work on the caller's stream sees the result).
    #[inline(never)]
    fn execute_on_device<T: Element>(
        &self,
        plan: &Plan,
        device: exec::DeviceIo,
        call: &Call,
    ) -> Result<()> {
        let engine = device.pool.engine().clone();
        let coll = device.exec.coll;
        let mut staged_why = "point-to-point calls stay staged".to_string();
        if plan::device::takes_executor(&coll) {
            let links = lock(&self.links);
            let mut paths = lock(&self.exec_paths);
            let known = paths.iter().position(|(e, _)| Arc::ptr_eq(e, &engine));
            // The device rule with ranks sharing a device: a module load
            // waits for every kernel of the device, and a peer's kernel
            // may wait for this rank; so the kernels are loaded before a
            // round every rank holds (the set-up's, or one of its own),
            // which no rank passes to launch before every rank has loaded.
            if let Some((op, ty)) = device.prepare {
                // First a round: every rank's earlier calls have ended, so
                // no stream of this communicator waits at a gate.
                if known.is_some() {
                    let setup = self.exec_setups.fetch_add(1, Ordering::Relaxed);
                    let deadline = std::time::Instant::now() + call.timeout;
                    links.exchange(
                        &format!("gpu-exec/{setup}/loading"),
                        &[1],
                        deadline,
                        &call.during(),
                    )?;
                }
                for protocol in ferroccl_cuda::executor::Protocol::ALL {
                    engine
                        .prepare_executor(protocol, op, ty)
                        .map_err(|e| exec::staged_error(call, e))?;
                }
                if known.is_some() {
                    let setup = self.exec_setups.fetch_add(1, Ordering::Relaxed);
                    let deadline = std::time::Instant::now() + call.timeout;
                    links.exchange(
                        &format!("gpu-exec/{setup}/loaded"),
                        &[1],
                        deadline,
                        &call.during(),
                    )?;
                }
            }
            let at = match known {
                Some(at) => at,
                None => {
                    let setup = self.exec_setups.fetch_add(1, Ordering::Relaxed);
                    let path = self.exec_setup(&links, &*engine, device.ordinal, setup, call)?;
                    paths.push((engine.clone(), path));
                    paths.len() - 1
                }
            };
            drop(links);
            match &mut paths[at].1 {
                super::device_exec::ExecPath::Ready(ready) => {
                    return self.exec_run::<T>(ready, &device, call, &coll, plan);
                }
                super::device_exec::ExecPath::Staged(why) => staged_why.clone_from(why),
            }
        }
        let bytes = coll.count * std::mem::size_of::<T>();
        if tracing::enabled!(tracing::Level::INFO)
            && lock(&self.tuned).insert((coll.kind.code() | 0x80, tune::size_class(bytes)))
        {
            tracing::info!(
                rank = self.rank,
                "plan: {}",
                plan::device::explain_staged(
                    coll.kind,
                    bytes,
                    self.size,
                    &self.algorithm_name(&coll, bytes, self.chunk_bytes),
                    &staged_why
                )
            );
        }
        let engine = &*engine;
        let before = engine.host_wait(device.ready, call.timeout);
        before.map_err(|e| exec::staged_error(call, e))?;
        let mut links = lock(&self.links);
        exec::run_staged::<T>(
            &mut links,
            &plan.schedule,
            exec::Resources::Pooled(&device.pool),
            device.bufs,
            call,
            device.avg,
        )
    }

    /// Run a call's schedule through slots (out of place from a copy where
    /// the schedule needs its input after writing its output).
    #[inline(never)]
    fn run_slots<T: Element>(
        &self,
        links: &mut Links,
        plan: &Plan,
        io: HostIo<'_, T>,
        call: &Call,
    ) -> Result<()> {
        match io {
            // The schedule reads its input after writing its output: run
            // it out of place from a copy.
            HostIo::InPlace {
                buf,
                input_base: 0,
                output_base: 0,
            } if plan.copies_input => {
                // The copy of a small input lives on the stack: an
                // allocation and its free cost ~70 instructions, a tenth of
                // an 8-byte allreduce.
                let mut words = [0u64; SMALL_COPY_WORDS];
                let heap;
                let input = match small_copy(&mut words, buf) {
                    Some(small) => small,
                    None => {
                        heap = buf.to_vec();
                        &heap
                    }
                };
                let io = HostIo::OutOfPlace { input, output: buf };
                exec::run(links, &plan.schedule, io, call)
            }
            io => exec::run(links, &plan.schedule, io, call),
        }
    }
}

/// Bytes of input that an in-place call copies onto the stack rather than
/// the heap, in 8-byte words (element types are at most 8 bytes).
const SMALL_COPY_WORDS: usize = 32;
/// `src` copied into `words`, if it fits.
fn small_copy<'a, T: Element>(words: &'a mut [u64], src: &[T]) -> Option<&'a [T]> {
    let n = (std::mem::size_of_val(src)).div_ceil(8);
    let typed: &mut [T] = bytemuck::try_cast_slice_mut(words.get_mut(..n)?).ok()?;
    let typed = typed.get_mut(..src.len())?;
    typed.copy_from_slice(src);
    Some(typed)
}

#[cfg(test)]
impl Communicator {
    /// Test hook of executors the communicator does not reach yet (the
    /// staged one): plan `call`, take its turn, and hand its plan, the
    /// connections and the executor's view of the call to `f`.
    pub(crate) fn run_on_links_for_test<T: Element>(
        &self,
        call: &CollCall,
        f: impl FnOnce(&Plan, &mut Links, &Call) -> Result<()>,
    ) -> Result<()> {
        let plan = self.plan::<T>(call)?;
        let (ticket, issued) = self.inner.issue(&self.spec::<T>(call), None)?;
        self.inner.wait_turn(ticket);
        let result = f(&plan, &mut lock(&self.inner.links), &issued);
        self.inner.end_turn();
        result
    }
}

#[cfg(test)]
impl Communicator {
    /// Test hook of the control-page paths: hand the executor's view of
    /// this rank's control pages to `f`; `None` where the communicator has
    /// none.
    pub(crate) fn with_control_for_test<R>(
        &self,
        f: impl FnOnce(&exec::Ctx<'_>) -> R,
    ) -> Option<R> {
        let control = self.inner.control.get()?;
        Some(f(&self.inner.ctx(control)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With a user algorithm set, an allreduce's plan is its schedule
    /// (halving-doubling on 4 ranks: rank r's first frame goes to r ^ 2,
    /// where the ring's goes to r + 1), and other collectives keep theirs.
    #[test]
    fn a_user_algorithm_plans_every_allreduce() {
        use crate::algo::user::examples::halving_doubling;
        let firsts = crate::testing::run_ranks_with(
            4,
            |config| {
                config.transport = Some("mem".into());
                config.user_algorithm = Some(halving_doubling(8));
            },
            |comm| {
                let inner = &comm.inner;
                let first_send = |kind, len: usize| {
                    let recv = if kind == CollKind::AllGather {
                        4 * len
                    } else {
                        len
                    };
                    let call = CollCall::new(kind, len, len, recv);
                    let plan = inner.build_plan_chunked::<f32>(&call, 1 << 20).unwrap();
                    plan.schedule
                        .steps
                        .iter()
                        .find(|s| s.prim.sends())
                        .map(|s| s.send_to)
                };
                (
                    first_send(CollKind::AllReduce, 4096),
                    first_send(CollKind::AllGather, 4096),
                )
            },
        );
        for (r, (all_reduce, all_gather)) in firsts.into_iter().enumerate() {
            assert_eq!(all_reduce, Some(r ^ 2), "rank {r}");
            assert_eq!(all_gather, Some((r + 1) % 4), "rank {r}");
        }
    }

    /// With user algorithms for allgather and reduce-scatter too, their
    /// plans are theirs (the peers each rank sends to, in order, where the
    /// ring sends to r + 1 only), in place (at the rank's block) as out of
    /// place, and the allreduce's stays the user's.
    #[test]
    fn user_algorithms_plan_allgather_and_reduce_scatter() {
        use crate::algo::user::examples::{
            halving_doubling, pairwise_reduce_scatter, recursive_doubling_allgather,
        };
        let firsts = crate::testing::run_ranks_with(
            4,
            |config| {
                config.transport = Some("mem".into());
                config.user_algorithm = Some(halving_doubling(8));
                config.user_algorithms =
                    vec![recursive_doubling_allgather(8), pairwise_reduce_scatter(8)];
            },
            |comm| {
                let inner = &comm.inner;
                let first = |kind, in_place: bool| {
                    let (send, recv) = match kind {
                        CollKind::AllGather => (1000, 4000),
                        CollKind::ReduceScatter => (4000, 1000),
                        _ => (1000, 1000),
                    };
                    let call = if in_place {
                        CollCall {
                            in_place: true,
                            ..CollCall::new(kind, 1000, 4000, 4000)
                        }
                    } else {
                        CollCall::new(kind, 1000, send, recv)
                    };
                    let plan = inner.build_plan_chunked::<f32>(&call, 1 << 20).unwrap();
                    let to: Vec<usize> = plan
                        .schedule
                        .steps
                        .iter()
                        .filter(|s| s.prim.sends())
                        .map(|s| s.send_to)
                        .collect();
                    (to, plan.input_base, plan.output_base)
                };
                [
                    first(CollKind::AllReduce, false),
                    first(CollKind::AllGather, false),
                    first(CollKind::AllGather, true),
                    first(CollKind::ReduceScatter, false),
                    first(CollKind::ReduceScatter, true),
                ]
            },
        );
        for (r, got) in firsts.into_iter().enumerate() {
            // Halving-doubling: r ^ 2, r ^ 1, then back: r ^ 1, r ^ 2.
            assert_eq!(got[0], (vec![r ^ 2, r ^ 1, r ^ 1, r ^ 2], 0, 0), "rank {r}");
            // Recursive doubling: r ^ 1, r ^ 2 (the ring: r + 1 three times).
            assert_eq!(got[1], (vec![r ^ 1, r ^ 2], 0, 0), "rank {r}");
            assert_eq!(got[2], (vec![r ^ 1, r ^ 2], r * 1000, 0), "rank {r}");
            // Pairwise: r + 1, r + 2, r + 3 (the ring: r + 1 three times).
            let pairwise: Vec<usize> = (1..4).map(|k| (r + k) % 4).collect();
            assert_eq!(got[3], (pairwise.clone(), 0, 0), "rank {r}");
            assert_eq!(got[4], (pairwise, 0, r * 1000), "rank {r}");
        }
    }

    /// A schedule over two channels, over the mem transport and slots
    /// (no check-in): rank 0 sends the first half of its input on channel
    /// 0 and the second on channel 1; rank 1 receives channel 1's first.
    /// Channels are FIFOs of their own, so the crossed order works and each
    /// half lands where it belongs; were they one FIFO, rank 1's first
    /// receive would get channel 0's frame and fail on its tag.
    #[test]
    fn two_channels_carry_separate_fifos() {
        use crate::algo::{Operand, Prim, Schedule, Step};
        const N: usize = 96;
        const HALF: usize = N / 2;
        let input = |r: usize| (0..N).map(|i| (r * 1000 + i) as u32).collect::<Vec<_>>();
        let send = |channel, off, tag| Step {
            send_to: 1,
            send_tag: tag,
            channel,
            ..Step::local(Prim::Send, Operand::Input, off, off, HALF)
        };
        let recv = |channel, off, tag| Step {
            recv_from: 0,
            recv_tag: tag,
            channel,
            ..Step::local(Prim::Recv, Operand::Output, off, off, HALF)
        };
        let results = crate::testing::run_ranks_with(
            2,
            |config| {
                config.transport = Some("mem".into());
                config.checkin = false;
            },
            |comm| -> Result<Vec<u32>> {
                let steps = if comm.rank() == 0 {
                    vec![send(0, 0, 11), send(1, HALF, 12)]
                } else {
                    vec![recv(1, HALF, 12), recv(0, 0, 11)]
                };
                let plan = Plan {
                    schedule: Schedule { steps },
                    input_base: 0,
                    output_base: 0,
                    copies_input: false,
                    scratch_output: 0,
                };
                let call = CollCall::new(CollKind::AllGather, N, N, N);
                let mine = input(comm.rank());
                let mut out = vec![u32::MAX; N];
                // The first call connects channel 1; the second runs over
                // both channels connected.
                for _ in 0..2 {
                    comm.run_blocking(
                        comm.spec::<u32>(&call),
                        &plan,
                        Io::out_of_place(&mine, &mut out),
                    )?;
                }
                Ok(out)
            },
        );
        let outputs: Vec<Vec<u32>> = results.into_iter().map(|r| r.unwrap()).collect();
        // Rank 0 only sent: its output is untouched.
        assert_eq!(outputs[0], vec![u32::MAX; N]);
        assert_eq!(
            outputs[1],
            input(0),
            "rank 1 holds rank 0's input, each half in place"
        );
    }
}
