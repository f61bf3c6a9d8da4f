//! A communicator's cache of host plans.
//!
//! Training loops and benchmarks repeat their calls, and choosing an
//! algorithm and building its schedule cost more than running a small
//! call over shared memory, so host plans are kept by [`PlanKey`] (see
//! `Communicator::plan`): in a list behind a lock, and the first ones
//! also in slots written once, which a blocking call reads without a lock
//! or an atomic reference count (`Plans::slot`). On 2 ranks of the EPYC
//! VM the lock and the count were 15-25% of an 8-byte call
//! (docs/performance-log.md, "Small calls without a locked instruction").

use crate::coll::{CollCall, Plan};
use ferroccl_transport::lock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What a host call's plan is a function of, besides the communicator's
/// fixed facts: the call as described (kind, count, buffer lengths, op,
/// root, in place, internal), its element size, and whether the control
/// pages exist (they decide how a call confirms, and may be made after
/// the first calls: `alloc_window` with FERROCCL_CHECKIN=0).
pub(super) type PlanKey = (CollCall, usize, bool);

/// Plans kept in the list; the oldest goes first.
const SHARED_ENTRIES: usize = 32;

/// Plans kept in slots: the first this many of the communicator (a loop
/// repeats a few calls; the library's set-up takes a few).
const SLOTS: usize = 32;

/// A kept key in words, compared in a few instructions (the call's
/// fields one by one took about 80 a call).
type Packed = [u64; 5];

/// `key` in words: one to one over the keys kept (host memory, no
/// point-to-point peer: `Communicator::plan`).
#[inline(always)]
fn packed((call, elem, control): &PlanKey) -> Packed {
    let op = call.op.map_or(0, |op| u64::from(op.code()) + 1);
    let flags = u64::from(call.kind.code())
        | op << 8
        | u64::from(call.in_place) << 16
        | u64::from(call.internal) << 17
        | u64::from(*control) << 18
        | u64::from(call.root.is_some()) << 19
        | (*elem as u64) << 32;
    [
        flags,
        call.count as u64,
        call.send_len as u64,
        call.recv_len as u64,
        call.root.unwrap_or(0) as u64,
    ]
}

/// Whether two packed keys are the same: word by word, without a branch
/// (an array's `==` calls `memcmp`).
#[inline(always)]
fn same(a: &Packed, b: &Packed) -> bool {
    a.iter().zip(b).fold(0, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A plan in a slot, and the generation it was made in.
struct Slot {
    generation: u64,
    key: Packed,
    plan: Arc<Plan>,
}

/// One communicator's plans.
pub(super) struct Plans {
    /// Bumped when the plans go stale (`clear`): a slot of an older
    /// generation is not used (nor written again).
    generation: AtomicU64,
    /// Plans read without a lock, each slot written once.
    slots: [OnceLock<Slot>; SLOTS],
    /// The slot found last: looked at first (a hint; any value works).
    last: AtomicUsize,
    /// Recent plans, scanned in order: cheaper than hashing the key.
    shared: Mutex<Vec<(PlanKey, Arc<Plan>)>>,
}

impl Plans {
    pub(super) fn new() -> Self {
        Plans {
            generation: AtomicU64::new(0),
            slots: std::array::from_fn(|_| OnceLock::new()),
            last: AtomicUsize::new(0),
            shared: Mutex::new(Vec::new()),
        }
    }

    /// The plan kept for `key`, newest first (a loop repeats its last
    /// call, and the library's own set-up calls sit at the front).
    pub(super) fn get(&self, key: &PlanKey) -> Option<Arc<Plan>> {
        lock(&self.shared)
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, plan)| plan.clone())
    }

    /// Keep `plan` for `key`: in the list, the oldest going when it is
    /// full, and in the first free slot, while there is one.
    pub(super) fn insert(&self, key: PlanKey, plan: Arc<Plan>) {
        let mut shared = lock(&self.shared);
        // Under the lock: `clear` cannot fall between the generation read
        // and the slot's write.
        let generation = self.generation.load(Ordering::Relaxed);
        let packed = packed(&key);
        let taken = |s: &Slot| s.generation == generation && same(&s.key, &packed);
        if !self.slots.iter().any(|s| s.get().is_some_and(taken)) {
            if let Some(free) = self.slots.iter().find(|s| s.get().is_none()) {
                let _ = free.set(Slot {
                    generation,
                    key: packed,
                    plan: plan.clone(),
                });
            }
        }
        if shared.len() >= SHARED_ENTRIES {
            shared.remove(0);
        }
        shared.push((key, plan));
    }

    /// Forget every plan (they were chosen under facts that changed). The
    /// slots of the old generation stay taken: later plans go to those
    /// left, then to the list alone.
    pub(super) fn clear(&self) {
        let mut shared = lock(&self.shared);
        shared.clear();
        // Release: a thread that sees the new generation sees no slot of
        // the old one as current.
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The plan for `key` in a slot: no lock, and no atomic count (the
    /// slot lives as long as the communicator). The slot found last is
    /// looked at here, inlined into the call (a loop repeats its call);
    /// the others in `slot_among`.
    #[inline(always)]
    pub(super) fn slot(&self, key: &PlanKey) -> Option<&Plan> {
        let generation = self.generation.load(Ordering::Acquire);
        let key = packed(key);
        let last = self.last.load(Ordering::Relaxed);
        match self.slots.get(last).and_then(OnceLock::get) {
            Some(s) if same(&s.key, &key) && s.generation == generation => Some(&s.plan),
            _ => self.slot_among(&key, generation),
        }
    }

    /// `slot` past the slot found last.
    #[inline(never)]
    fn slot_among(&self, key: &Packed, generation: u64) -> Option<&Plan> {
        let at = self.slots.iter().position(|s| {
            s.get()
                .is_some_and(|s| same(&s.key, key) && s.generation == generation)
        })?;
        self.last.store(at, Ordering::Relaxed);
        self.slots[at].get().map(|s| &*s.plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coll::CollKind;

    fn plan_of(n: usize) -> Arc<Plan> {
        let call = CollCall::new(CollKind::AllReduce, n, n, n);
        let g = crate::plan::geometry(
            CollKind::AllReduce,
            crate::algo::Algorithm::Ring,
            (0, 2),
            n,
            4,
            1 << 16,
        );
        Arc::new(crate::coll::plan_on(&call, g, crate::algo::Algorithm::Ring, None).unwrap())
    }

    fn key(n: usize) -> PlanKey {
        (CollCall::new(CollKind::AllReduce, n, n, n), 4, true)
    }

    /// A kept plan is found in its slot by its key, from any thread, and
    /// every field of the key tells keys apart; a cleared cache's slots
    /// are not used.
    #[test]
    fn a_kept_plan_is_found_by_its_key_until_the_cache_is_cleared() {
        let cache = Plans::new();
        let plan = plan_of(8);
        assert!(cache.slot(&key(8)).is_none());
        cache.insert(key(8), plan.clone());
        let found = cache.slot(&key(8)).expect("kept");
        assert!(std::ptr::eq(found, &*plan));
        let (call, elem, control) = key(8);
        let others = [
            key(16),
            (call, 8, control),
            (call, elem, false),
            (
                CollCall {
                    in_place: true,
                    ..call
                },
                elem,
                control,
            ),
            (
                CollCall {
                    internal: true,
                    ..call
                },
                elem,
                control,
            ),
            (
                CollCall {
                    op: Some(crate::element::ReduceOp::Max),
                    ..call
                },
                elem,
                control,
            ),
            (
                CollCall {
                    root: Some(0),
                    ..call
                },
                elem,
                control,
            ),
            (
                CollCall {
                    recv_len: 9,
                    ..call
                },
                elem,
                control,
            ),
            (
                CollCall {
                    send_len: 9,
                    ..call
                },
                elem,
                control,
            ),
            (
                CollCall {
                    kind: CollKind::AllGather,
                    ..call
                },
                elem,
                control,
            ),
        ];
        for other in &others {
            assert!(cache.slot(other).is_none(), "{other:?}");
        }
        std::thread::scope(|s| {
            s.spawn(|| assert!(cache.slot(&key(8)).is_some(), "another thread"));
        });
        cache.clear();
        assert!(cache.slot(&key(8)).is_none(), "stale after clear");
        assert!(cache.get(&key(8)).is_none(), "stale after clear");
    }

    /// More plans than slots: the first ones keep theirs, the later ones
    /// are in the list alone (and still found there).
    #[test]
    fn plans_past_the_slots_are_in_the_list() {
        let cache = Plans::new();
        let plans: Vec<_> = (1..=SLOTS + 3).map(|n| (n, plan_of(n))).collect();
        for (n, plan) in &plans {
            cache.insert(key(*n), plan.clone());
            cache.insert(key(*n), plan.clone());
        }
        let slotted = plans
            .iter()
            .filter(|(n, p)| cache.slot(&key(*n)).is_some_and(|f| std::ptr::eq(f, &**p)))
            .count();
        assert_eq!(slotted, SLOTS);
        let (n, plan) = &plans[plans.len() - 1];
        assert!(cache.slot(&key(*n)).is_none());
        assert!(Arc::ptr_eq(
            &cache.get(&key(*n)).expect("in the list"),
            plan
        ));
    }
}
