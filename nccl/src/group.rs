//! `ncclGroupStart` / `ncclGroupEnd`: calls made between them (on this
//! thread, as NCCL's groups are) are collected and run at the end.
//!
//! - Deferred `ncclCommInitRank`s run at the end, each on a thread of its
//!   own, so that one thread can create every rank of a communicator.
//! - Then deferred `ncclCommSplit`s: those of one parent in issue order,
//!   each parent on a thread of its own (a split is a collective of its
//!   parent), so that one thread can split every rank it holds; a parent
//!   may be an init of the same group.
//! - Calls on several communicators run on one thread per communicator,
//!   so that one thread can drive every rank (`ncclCommInitAll`'s users).
//! - On each communicator the calls run in issue order; a run of
//!   point-to-point calls between two collectives is cut into pieces of
//!   one slot (FERROCCL_BUFFSIZE / FERROCCL_STEPS bytes, the same on every
//!   rank) and run in rounds: in round k every call's k-th piece, first
//!   all sends, then all receives. A send waits only for free slots, and a
//!   connection holds `steps` slots, so with at most `steps / 2` sends to
//!   one peer in a group, no send can wait on a rank that waits on it:
//!   every waiting rank waits for one that is at an earlier round, or at
//!   the send half of its own round (docs/nccl.md gives the argument).

use crate::abi::UniqueId;
use crate::call::{self, Call, Kind};
use crate::comm::{self, Core, Handle, State};
use crate::status::Failure;
use crate::uid::Meeting;
use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::Arc;

/// A call deferred to the end of the group.
enum Deferred {
    /// `ncclCommInitRank` of the handle at this address.
    Init {
        handle: usize,
        id: UniqueId,
        rank: usize,
        size: usize,
        config: crate::abi::CommConfig,
    },
    /// `ncclCommSplit` of the handle at `parent`; `child` is the pending
    /// handle it fills (`None` for `NCCL_SPLIT_NOCOLOR`, which takes part
    /// and gets no communicator).
    Split {
        parent: usize,
        color: c_int,
        key: c_int,
        child: Option<usize>,
        config: Option<crate::abi::CommConfig>,
    },
    /// A checked collective or point-to-point call.
    Call { core: Arc<Core>, call: Call },
}

#[derive(Default)]
struct Group {
    depth: usize,
    calls: Vec<Deferred>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// `ncclGroupStart`.
pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// Whether a group is open on this thread.
pub fn open() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// Keep an initialisation for the end of the group.
pub fn defer_init(
    handle: *mut Handle,
    id: UniqueId,
    rank: usize,
    size: usize,
    config: crate::abi::CommConfig,
) {
    GROUP.with(|g| {
        g.borrow_mut().calls.push(Deferred::Init {
            handle: handle as usize,
            id,
            rank,
            size,
            config,
        })
    });
}

/// Keep a split for the end of the group.
pub fn defer_split(
    parent: *mut Handle,
    color: c_int,
    key: c_int,
    child: Option<*mut Handle>,
    config: Option<crate::abi::CommConfig>,
) {
    GROUP.with(|g| {
        g.borrow_mut().calls.push(Deferred::Split {
            parent: parent as usize,
            color,
            key,
            child: child.map(|c| c as usize),
            config,
        })
    });
}

/// Run `call` now, or keep it for the end of the group.
pub fn submit(core: Arc<Core>, call: Call) -> Result<(), Failure> {
    if open() {
        GROUP.with(|g| g.borrow_mut().calls.push(Deferred::Call { core, call }));
        return Ok(());
    }
    if matches!(call.kind, Kind::Send | Kind::Recv) && call.root == core.comm.rank() {
        return Err(Failure::invalid_usage(
            "a send or receive to this rank itself needs its partner in the same group \
             (ncclGroupStart/End)",
        ));
    }
    // SAFETY: the caller of the entry point vouches for the buffers as
    // NCCL's API requires, until the call has completed.
    unsafe { call::run(&core, &call) }
}

/// Run `calls` (the sends and receives one gather or scatter is made of)
/// now, as one group of their own, or keep them for the end of the open
/// group.
pub fn submit_all(core: Arc<Core>, calls: Vec<Call>) -> Result<(), Failure> {
    if open() {
        GROUP.with(|g| {
            let mut g = g.borrow_mut();
            for call in calls {
                g.calls.push(Deferred::Call {
                    core: core.clone(),
                    call,
                });
            }
        });
        return Ok(());
    }
    run_calls(&core, &calls)
}

/// `ncclGroupEnd`: run what the outermost group collected.
pub fn end() -> Result<(), Failure> {
    let calls = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Failure::invalid_usage(
                "ncclGroupEnd without a matching ncclGroupStart",
            ));
        }
        g.depth -= 1;
        Ok(if g.depth == 0 {
            std::mem::take(&mut g.calls)
        } else {
            Vec::new()
        })
    })?;
    let mut inits = Vec::new();
    let mut splits: Vec<(usize, Vec<SplitArgs>)> = Vec::new();
    let mut per_comm: Vec<(Arc<Core>, Vec<Call>)> = Vec::new();
    for d in calls {
        match d {
            Deferred::Init {
                handle,
                id,
                rank,
                size,
                config,
            } => inits.push((handle, id, rank, size, config)),
            Deferred::Split {
                parent,
                color,
                key,
                child,
                config,
            } => {
                let args = (color, key, child, config);
                match splits.iter_mut().find(|(p, _)| *p == parent) {
                    Some((_, all)) => all.push(args),
                    None => splits.push((parent, vec![args])),
                }
            }
            Deferred::Call { core, call } => {
                match per_comm.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &core)) {
                    Some((_, calls)) => calls.push(call),
                    None => per_comm.push((core, vec![call])),
                }
            }
        }
    }
    let mut first: Option<Failure> = None;
    if !inits.is_empty() {
        let results: Vec<Result<(), Failure>> = std::thread::scope(|s| {
            let threads: Vec<_> = inits
                .into_iter()
                .map(|(handle, id, rank, size, config)| {
                    s.spawn(move || {
                        // SAFETY: the address is a handle this library
                        // made for this init; handles are never freed.
                        let h = unsafe { &*(handle as *const Handle) };
                        let made =
                            Meeting::decode(&id).and_then(|m| comm::init(&m, rank, size, config));
                        match made {
                            Ok(core) => {
                                h.set_state(State::Ready(core));
                                Ok(())
                            }
                            Err(f) => {
                                h.set_state(State::Failed(f.clone()));
                                Err(f)
                            }
                        }
                    })
                })
                .collect();
            threads.into_iter().map(join).collect()
        });
        first = results.into_iter().find_map(Result::err);
    }
    if !splits.is_empty() {
        let results: Vec<Result<(), Failure>> = std::thread::scope(|s| {
            let threads: Vec<_> = splits
                .into_iter()
                .map(|(parent, all)| s.spawn(move || run_splits(parent, all)))
                .collect();
            threads.into_iter().map(join).collect()
        });
        first = first.or_else(|| results.into_iter().find_map(Result::err));
    }
    let results: Vec<Result<(), Failure>> = if per_comm.len() == 1 {
        let (core, calls) = &per_comm[0];
        vec![run_calls(core, calls)]
    } else {
        std::thread::scope(|s| {
            let threads: Vec<_> = per_comm
                .iter()
                .map(|(core, calls)| s.spawn(move || run_calls(core, calls)))
                .collect();
            threads.into_iter().map(join).collect()
        })
    };
    match first.or_else(|| results.into_iter().find_map(Result::err)) {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

/// A deferred split's color, key, child handle and config.
type SplitArgs = (c_int, c_int, Option<usize>, Option<crate::abi::CommConfig>);

/// The deferred splits of the parent handle at `parent`, in issue order;
/// each child gets its communicator or the failure. The first failure.
fn run_splits(parent: usize, all: Vec<SplitArgs>) -> Result<(), Failure> {
    // SAFETY: the address is a handle this library made (checked when the
    // split was deferred); handles are never freed.
    let parent = unsafe { &*(parent as *const Handle) };
    let mut first = None;
    for (color, key, child, config) in all {
        // SAFETY: as above, a pending handle made for this split.
        let child = child.map(|c| unsafe { &*(c as *const Handle) });
        let made = crate::split(parent, color, key, config).and_then(|core| match (core, child) {
            (Some(core), Some(child)) => {
                child.set_split(core);
                Ok(())
            }
            (None, None) => Ok(()),
            (made, _) => Err(Failure::internal(format!(
                "ncclCommSplit with color {color}: the split gave {}, against its color",
                if made.is_some() {
                    "a communicator"
                } else {
                    "no communicator"
                }
            ))),
        });
        if let Err(f) = made {
            if let Some(child) = child {
                child.set_state(State::Failed(f.clone()));
            }
            first.get_or_insert(f);
        }
    }
    first.map_or(Ok(()), Err)
}

fn join(t: std::thread::ScopedJoinHandle<'_, Result<(), Failure>>) -> Result<(), Failure> {
    t.join()
        .unwrap_or_else(|_| Err(Failure::internal("a group thread panicked")))
}

/// One communicator's calls of a group, in order; each run of
/// point-to-point calls in rounds (module docs).
fn run_calls(core: &Core, calls: &[Call]) -> Result<(), Failure> {
    let mut p2p: Vec<Call> = Vec::new();
    for c in calls {
        if matches!(c.kind, Kind::Send | Kind::Recv) {
            p2p.push(*c);
            continue;
        }
        run_p2p(core, &std::mem::take(&mut p2p))?;
        // SAFETY: the entry point's caller vouches for the buffers until
        // ncclGroupEnd returns (host) or the stream reaches the call.
        unsafe { call::run(core, c)? };
    }
    run_p2p(core, &p2p)
}

fn run_p2p(core: &Core, calls: &[Call]) -> Result<(), Failure> {
    if calls.is_empty() {
        return Ok(());
    }
    let me = core.comm.rank();
    // Sends to this rank itself meet their receives here: the n-th send
    // fills the n-th receive.
    let to_self: Vec<&Call> = calls
        .iter()
        .filter(|c| c.kind == Kind::Send && c.root == me)
        .collect();
    let from_self: Vec<&Call> = calls
        .iter()
        .filter(|c| c.kind == Kind::Recv && c.root == me)
        .collect();
    if to_self.len() != from_self.len() {
        return Err(Failure::invalid_usage(format!(
            "the group has {} sends to this rank itself and {} receives from it",
            to_self.len(),
            from_self.len()
        )));
    }
    for (s, r) in to_self.iter().zip(&from_self) {
        copy_to_self(s, r)?;
    }
    let others: Vec<&Call> = calls.iter().filter(|c| c.root != me).collect();
    let slot = core.comm.config().chunk_bytes().max(8);
    let piece = |c: &Call| (slot / c.dtype.size()).max(1);
    let rounds = others
        .iter()
        .map(|c| c.count.div_ceil(piece(c)))
        .max()
        .unwrap_or(0);
    for round in 0..rounds {
        for kind in [Kind::Send, Kind::Recv] {
            for c in others.iter().filter(|c| c.kind == kind) {
                let n = piece(c);
                let from = round * n;
                if from < c.count {
                    let part = call::piece(c, from, n.min(c.count - from));
                    // SAFETY: a piece of a checked call lies inside its
                    // buffer; the caller vouches for the buffer.
                    unsafe { call::run(core, &part)? };
                }
            }
        }
    }
    Ok(())
}

fn copy_to_self(send: &Call, recv: &Call) -> Result<(), Failure> {
    let bytes = send.count * send.dtype.size();
    if send.count != recv.count || send.dtype != recv.dtype {
        return Err(Failure::invalid_argument(format!(
            "a send to this rank itself of {} {:?} meets a receive of {} {:?}",
            send.count, send.dtype, recv.count, recv.dtype
        )));
    }
    if send.memory != call::Memory::Host || recv.memory != call::Memory::Host {
        return Err(Failure::invalid_usage(
            "a send to this rank itself on device memory is not supported yet",
        ));
    }
    if bytes > 0 {
        // SAFETY: both were checked (non-NULL, the caller's buffers of
        // `bytes`); `copy` allows them to overlap.
        unsafe { std::ptr::copy(send.send as *const u8, recv.recv as *mut u8, bytes) };
    }
    Ok(())
}
