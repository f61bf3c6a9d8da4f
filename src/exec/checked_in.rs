//! A call while the ranks of one host share control pages: carries out
//! the planner's route for it (note a call through slots, or check in and
//! run it inline, directly between windows or out of the peers'
//! processes). Apart from `checkin`, the page protocol that `inline`,
//! `direct` and `pull` build on, so that none of them imports back.

use super::checkin::{
    all_read, announce, finish, free_slot, note_slot_call, publish_finished, read_announcement,
    Ctx, Deadline, Place, ENTRY_INPUT_WORDS, SMALL_WORDS,
};
use super::io::HostIo;
use super::{direct, inline, pull, spread, Call};
use crate::coll::CollKind;
use crate::element::Element;
use crate::error::Result;
use crate::plan::{self, Direct, Route};
use std::sync::atomic::Ordering;

/// Carry out `route` (the planner's, from the call alone) for a call
/// while the ranks share control pages: note a call that goes through
/// slots, or check in and run the call inline, directly between windows
/// or out of the peers' processes, as the planner decides from every
/// rank's announcement. `Ok(true)`: done (results in place on every
/// rank); `Ok(false)`: run the schedule through slots.
///
/// A call whose input travels in its announcement's first line
/// (`inline::in_words`) runs here, inlined into the blocking call
/// (`Communicator::run_blocking`); the others in `run_other`, out of
/// line (those of up to 160 bytes through `inline::run_words` too):
/// inlined, the inline area's path lost 5-12% at 2-8 KiB on 2 ranks
/// (docs/performance-log.md, "Small calls without a locked
/// instruction").
#[inline(always)]
pub(crate) fn run<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    call: &Call,
    route: Route,
) -> Result<bool> {
    let extents = call.kind.extents(call.fingerprint.count as usize, ctx.size);
    if route == Route::Inline && inline::in_words::<T>(extents.0) {
        let (turn, deadline) = take_turn(ctx, call)?;
        inline::run_words::<T, SMALL_WORDS>(ctx, io, call, extents.0, turn, &deadline)?;
        publish_finished(ctx);
        return Ok(true);
    }
    run_other(ctx, io, call, route, extents)
}

/// [`run`] for the calls it does not run itself (`extents`: the call's
/// input and output elements).
#[inline(never)]
fn run_other<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    call: &Call,
    route: Route,
    (in_len, out_len): (usize, usize),
) -> Result<bool> {
    let paths = match route {
        Route::Slots { note: false } => return Ok(false),
        Route::Slots { note: true } => {
            note_slot_call(ctx, call)?;
            return Ok(false);
        }
        Route::Inline => (false, false),
        Route::CheckIn { cma, spread } => (cma, spread),
    };
    let (turn, deadline) = take_turn(ctx, call)?;
    let done = if route == Route::Inline && inline::in_entry::<T>(in_len) {
        inline::run_words::<T, ENTRY_INPUT_WORDS>(ctx, io, call, in_len, turn, &deadline)
            .map(|()| true)
    } else if route == Route::Inline {
        inline::run(ctx, io, call, in_len, turn, &deadline).map(|()| true)
    } else {
        check_in(ctx, io, call, (turn, paths), (in_len, out_len), &deadline)
    }?;
    // Up to which check-in this rank is done with its peers' pages.
    publish_finished(ctx);
    Ok(done)
}

/// Take this call's check-in, once every peer is done with the
/// announcement slot it reuses; with its deadline.
#[inline(always)]
fn take_turn(ctx: &Ctx<'_>, call: &Call) -> Result<(u64, Deadline)> {
    // Only the call holding its turn counts check-ins: no locked
    // instruction (one waits for the last call's cross-core stores).
    let turn = ctx.control.checkins.load(Ordering::Relaxed);
    ctx.control.checkins.store(turn + 1, Ordering::Relaxed);
    let deadline = Deadline::new(call.timeout);
    free_slot(ctx, turn, call)?;
    Ok((turn, deadline))
}

/// A call that checks in and then runs directly between windows, out of
/// the peers' processes, through the root's staging area or
/// (`Ok(false)`) through slots, at check-in `turn`; `(cma, spread)`: the
/// route's.
fn check_in<T: Element>(
    ctx: &Ctx<'_>,
    io: &mut HostIo<'_, T>,
    call: &Call,
    (turn, (cma, spread)): (u64, (bool, bool)),
    (in_len, out_len): (usize, usize),
    deadline: &Deadline,
) -> Result<bool> {
    let kind = call.kind;
    let elem = std::mem::size_of::<T>();
    let (in_addr, out_addr) = io.addresses();
    let place = {
        let windows = ctx.windows.lock();
        let locate = |addr: usize, len: usize| {
            windows
                .find(addr, len * elem)
                .filter(|&(_, off)| off % elem == 0)
                .map_or((0, 0), |(id, off)| (id, off as u64))
        };
        let (in_win, in_off) = locate(in_addr, in_len);
        let (out_win, out_off) = locate(out_addr, out_len);
        Place {
            in_win,
            in_off,
            out_win,
            out_off,
        }
    };
    // A small call that checks in only because the communicator has
    // windows, from a rank whose buffers the path between windows could
    // not take: its input goes on its page first, so that if the ranks'
    // buffers do not all lie in windows the call runs inline after all
    // (`plan::inline_after_check_in`) instead of through slots.
    let inline_after = plan::inline_after_check_in(kind, in_len * elem, ctx.size);
    if inline_after {
        // Every rank moves its inline cursor alike (`inline::next_place`).
        let area = inline::next_place::<T>(ctx, kind, turn, in_len);
        if !plan::direct_capable(kind, place.in_win, place.out_win) {
            inline::publish(ctx, io, kind, in_len, (turn, area))?;
        }
    }
    // The input's and output's addresses only where a peer may read from
    // (or, a broadcast's root, write into) them: they lie in the
    // announcement's second cache line, which the other check-ins leave
    // alone.
    announce(
        ctx,
        turn,
        call,
        &place,
        cma.then_some((in_addr as u64, out_addr as u64)),
    )?;
    // On the stack up to 8 ranks: an allocation and its free were about a
    // tenth of a small call's instructions between windows.
    let mut few = [place; 8];
    let mut many;
    let places: &mut [Place] = if ctx.size <= few.len() {
        &mut few[..ctx.size]
    } else {
        many = vec![place; ctx.size];
        &mut many
    };
    for peer in (0..ctx.size).filter(|&p| p != ctx.rank) {
        places[peer] = read_announcement(ctx, turn, peer, deadline, call)?;
    }
    all_read(ctx, turn);
    let same = |w: fn(&Place) -> u64| {
        let first = w(&places[0]);
        (first != 0 && places.iter().all(|p| w(p) == first)).then_some(first)
    };
    // A broadcast reads the root's input alone, a reduce writes the root's
    // output alone: only the root's need lie in a window.
    let root = call.fingerprint.root as usize;
    let roots = |w: fn(&Place) -> u64| places.get(root).map(w).filter(|&id| id != 0);
    let (inputs, outputs) = match kind {
        CollKind::Broadcast => (roots(|p| p.in_win), same(|p| p.out_win)),
        CollKind::Reduce => (same(|p| p.in_win), roots(|p| p.out_win)),
        _ => (same(|p| p.in_win), same(|p| p.out_win)),
    };
    let direct = plan::after_check_in(kind, inputs, outputs, (cma, spread));
    let buffers = (in_len + out_len) * elem * ctx.size;
    let out_of_place = matches!(io, HostIo::OutOfPlace { .. });
    let mode = match direct {
        // Reduced straight between windows: streaming also past the
        // last-level cache.
        Direct::AllReduce { .. } | Direct::ReduceScatter { .. } => plan::direct_reduce_store(
            kind,
            out_of_place,
            buffers,
            (call.nt_store_bytes, crate::topo::last_level_cache_bytes()),
        ),
        _ => plan::direct_store(kind, out_of_place, buffers, call.nt_store_bytes),
    };
    let kernel = direct::Kernel {
        rank: ctx.rank,
        size: ctx.size,
        elem,
        places,
        call,
        op: call.op,
        mode,
    };
    match direct {
        Direct::Done => return Ok(true),
        // Every rank put its input on its page (none could take the path
        // between windows): the inline exchange's second half.
        Direct::Slots
            if inline_after
                && places
                    .iter()
                    .all(|p| !plan::direct_capable(kind, p.in_win, p.out_win)) =>
        {
            inline::take_all(ctx, io, call, turn)?;
            return Ok(true);
        }
        Direct::Slots => return Ok(false),
        Direct::AllReduce { input, output } => {
            direct::all_reduce(&kernel, ctx, io, (input, output), (in_len, out_len))?
        }
        Direct::AllGather { output } => {
            direct::all_gather(&kernel, ctx, io, output, (in_len, out_len))?
        }
        Direct::AllToAll { output } => {
            direct::all_to_all(&kernel, ctx, io, output, (in_len, out_len))?
        }
        Direct::ReduceScatter { input } => {
            direct::reduce_scatter(&kernel, ctx, io, input, (in_len, out_len))?
        }
        Direct::Broadcast { input, output } => {
            direct::broadcast(&kernel, ctx, io, (input, output), in_len)?
        }
        Direct::Reduce { input, output } => {
            direct::reduce(&kernel, ctx, io, (input, output), in_len)?
        }
        Direct::Pull => pull::run(&kernel, ctx, io, turn, in_len)?,
        // No rank touches another's buffers: no completion wait.
        Direct::Spread => {
            spread::run(ctx, io, call, (in_len, mode), deadline)?;
            return Ok(true);
        }
    }
    finish(ctx, call.order, deadline, call)?;
    Ok(true)
}
