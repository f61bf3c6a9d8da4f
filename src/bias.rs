//! A lock that one thread, its owner, takes and releases without a locked
//! instruction, and asymmetric fences for the handshakes around it.
//!
//! A small collective's last stores are the lines its peers read next, and
//! every locked instruction (`lock`-prefixed or `xchg` on x86-64) waits
//! until those stores have left the core: each one behind a cross-core
//! transfer. A blocking call took three (the issue lock's two and the add
//! that ends its turn; docs/performance-log.md, "Small calls without a
//! locked instruction"). Most communicators are called from one thread, so
//! the issue lock is *biased*: the first thread to take it becomes its
//! owner and from then on takes it with plain loads and stores. Another
//! thread that wants it revokes the bias for good: it marks the lock
//! revoked, makes every thread of the process pass a full memory barrier
//! (Linux `membarrier`, `MEMBARRIER_CMD_PRIVATE_EXPEDITED`), and waits for
//! the owner to leave; both then take the mutex. The owner's store of
//! "inside" and its load of the mark need no fence of their own: the
//! barrier the revoker forces on the owner's CPU orders them against the
//! revoker's store and load (the asymmetric Dekker handshake that
//! user-space RCU and the JVM's biased locks build on).
//!
//! Where `membarrier` is missing (not Linux, a kernel before 4.14, a
//! sandbox that refuses it) the lock is never biased and every thread
//! takes the mutex; [`asymmetric`] says which, once per process (and
//! `Config::biased_locks`, FERROCCL_BIASED_LOCKS=0, turns it off for a
//! communicator).

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// `owner` before any thread took the lock.
const NO_OWNER: u64 = 0;
/// `owner` once another thread revoked the bias: no thread owns it again.
const REVOKED: u64 = u64::MAX;

/// This thread's number (from 1; never reused), for [`BiasedLock`]'s owner.
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: Cell<u64> = const { Cell::new(0) };
    }
    NUMBER.with(|n| {
        let mut v = n.get();
        if v == 0 {
            // Once per thread; far from any call's stores.
            v = NEXT.fetch_add(1, Ordering::Relaxed);
            n.set(v);
        }
        v
    })
}

/// Whether this process may use asymmetric fences (registered for
/// `membarrier`'s private expedited command; checked once a process: a
/// child forked after the parent registered registers again).
pub(crate) fn asymmetric() -> bool {
    static REGISTERED: Mutex<Option<(u32, bool)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut registered = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    match *registered {
        Some((at, ok)) if at == pid => ok,
        _ => {
            let ok = register();
            *registered = Some((pid, ok));
            ok
        }
    }
}

#[cfg(target_os = "linux")]
mod membarrier {
    /// `MEMBARRIER_CMD_QUERY` (linux/membarrier.h).
    pub(super) const QUERY: libc::c_long = 0;
    /// `MEMBARRIER_CMD_GLOBAL`: every thread of every process, without
    /// registering (slow: it waits for the CPUs' grace period).
    pub(super) const GLOBAL: libc::c_long = 1;
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`.
    pub(super) const PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
    /// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`.
    pub(super) const REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

    /// The `membarrier` system call with `cmd` (flags 0); its result.
    pub(super) fn call(cmd: libc::c_long) -> libc::c_long {
        // SAFETY: membarrier takes two integers and touches no memory of
        // the caller; an unknown command fails with EINVAL, a kernel
        // without it with ENOSYS.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_long,
                0 as libc::c_long,
            )
        }
    }
}

#[cfg(target_os = "linux")]
fn register() -> bool {
    let supported = membarrier::call(membarrier::QUERY);
    supported >= 0
        && supported & membarrier::PRIVATE_EXPEDITED != 0
        && supported & membarrier::GLOBAL != 0
        && membarrier::call(membarrier::REGISTER_PRIVATE_EXPEDITED) == 0
}

#[cfg(not(target_os = "linux"))]
fn register() -> bool {
    false
}

/// The slow side of an asymmetric fence: a full memory barrier on every
/// running thread of this process, so that a thread whose side of a
/// handshake is a compiler fence alone ([`light_fence`]) is ordered as if
/// it had fenced. Only after [`asymmetric`] said yes.
pub(crate) fn heavy_fence() {
    #[cfg(target_os = "linux")]
    {
        // Registered, the private command fails only in a child forked
        // after its parent registered (registration is per process):
        // register it and try again, and failing that take the global
        // command, which `register` checked the kernel has.
        if membarrier::call(membarrier::PRIVATE_EXPEDITED) != 0
            && !(asymmetric() && membarrier::call(membarrier::PRIVATE_EXPEDITED) == 0)
        {
            membarrier::call(membarrier::GLOBAL);
        }
    }
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// The fast side of an asymmetric fence: keeps the compiler from moving
/// memory accesses across it; the CPU is ordered by the other side's
/// [`heavy_fence`].
#[inline(always)]
pub(crate) fn light_fence() {
    compiler_fence(Ordering::SeqCst);
}

/// A mutex whose first taker owns it and takes it without locked
/// instructions until another thread takes it (module docs).
pub(crate) struct BiasedLock<T> {
    data: UnsafeCell<T>,
    /// Taken by every thread but the owner, and by the owner once revoked.
    slow: Mutex<()>,
    /// The owner's [`thread_number`], `NO_OWNER` or `REVOKED`.
    owner: AtomicU64,
    /// The owner holds the lock through the fast path.
    inside: AtomicBool,
    /// Whether this lock may be biased (`asymmetric()` at creation).
    biasable: bool,
}

// SAFETY: the data is reached only through a guard, and at most one guard
// exists at a time: the owner's fast guard excludes every slow one by the
// handshake in `lock_slow`, slow guards exclude each other by the mutex.
// `T: Send` is what a `Mutex<T>` asks too.
unsafe impl<T: Send> Sync for BiasedLock<T> {}

impl<T> BiasedLock<T> {
    /// A lock around `value`, biased towards its first taker if
    /// `biasable`, which only [`asymmetric`] may allow.
    pub(crate) fn with_bias(value: T, biasable: bool) -> Self {
        BiasedLock {
            data: UnsafeCell::new(value),
            slow: Mutex::new(()),
            owner: AtomicU64::new(NO_OWNER),
            inside: AtomicBool::new(false),
            biasable,
        }
    }

    /// Whether this lock may be biased (what it was created with): the
    /// process has asymmetric fences, and the caller let it.
    #[inline(always)]
    pub(crate) fn biasable(&self) -> bool {
        self.biasable
    }

    /// Whether a thread owns the lock now (it was taken, and only by it).
    #[cfg(test)]
    pub(crate) fn is_biased(&self) -> bool {
        !matches!(self.owner.load(Ordering::Relaxed), NO_OWNER | REVOKED)
    }

    /// Take the lock: by plain loads and stores on its owner's thread while
    /// the bias holds, by the mutex otherwise.
    #[inline(always)]
    pub(crate) fn lock(&self) -> BiasedGuard<'_, T> {
        if self.biasable {
            let me = thread_number();
            if self.owner.load(Ordering::Relaxed) == me {
                self.inside.store(true, Ordering::Relaxed);
                light_fence();
                // Against the revoker's store of REVOKED: either this load
                // sees it, or the revoker sees `inside` and waits.
                if self.owner.load(Ordering::Relaxed) == me {
                    // Acquire for what a slow holder wrote before the bias
                    // was claimed is the claim's own mutex (`lock_slow`).
                    return BiasedGuard {
                        lock: self,
                        slow: None,
                    };
                }
                self.inside.store(false, Ordering::Release);
            }
        }
        self.lock_slow(true)
    }

    /// Take the lock by the mutex, revoking an owner's bias, without
    /// becoming the owner: for threads that take it rarely (a watcher
    /// reading what was issued), which should not draw the bias away from
    /// the thread that takes it on every call.
    pub(crate) fn lock_elsewhere(&self) -> BiasedGuard<'_, T> {
        self.lock_slow(false)
    }

    #[cold]
    #[inline(never)]
    fn lock_slow(&self, claim: bool) -> BiasedGuard<'_, T> {
        let guard = self.slow.lock().unwrap_or_else(|p| p.into_inner());
        if self.biasable {
            let me = thread_number();
            match self.owner.load(Ordering::Relaxed) {
                NO_OWNER => {
                    // The first taker becomes the owner; this time it holds
                    // the mutex, later times not.
                    if claim {
                        self.owner.store(me, Ordering::Relaxed);
                    }
                }
                REVOKED => {}
                owner if owner == me => {
                    // The owner by `lock_elsewhere`, or after losing a race
                    // with nobody (only another thread revokes): it is not
                    // inside its fast path, and the mutex excludes the rest.
                }
                _ => {
                    // Another thread owns it: revoke the bias, then wait
                    // for the owner to leave if it is inside.
                    self.owner.store(REVOKED, Ordering::Relaxed);
                    heavy_fence();
                    let mut spins = 0u32;
                    while self.inside.load(Ordering::Acquire) {
                        spins += 1;
                        if spins < 64 {
                            std::hint::spin_loop();
                        } else {
                            std::thread::yield_now();
                        }
                    }
                }
            }
        }
        BiasedGuard {
            lock: self,
            slow: Some(guard),
        }
    }
}

/// A held [`BiasedLock`]: its data, until dropped.
pub(crate) struct BiasedGuard<'a, T> {
    lock: &'a BiasedLock<T>,
    /// The mutex's guard on the slow path; `None` on the owner's.
    slow: Option<MutexGuard<'a, ()>>,
}

impl<T> Deref for BiasedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is the one holder (`BiasedLock`'s Sync).
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for BiasedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: this guard is the one holder, and borrowed mutably.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for BiasedGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.slow.is_none() {
            // Release: a revoker that sees the owner out sees its writes.
            self.lock.inside.store(false, Ordering::Release);
        }
        // The slow guard, if any, unlocks the mutex as it drops.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Counting under the lock from several threads loses no increment,
    /// biased or not, with the owner running throughout the revocation.
    fn counts_under(biasable: bool) {
        let lock = Arc::new(BiasedLock::with_bias((0u64, 0u64), biasable));
        // The owner: this thread takes it first.
        for _ in 0..1000 {
            let mut g = lock.lock();
            g.0 += 1;
            g.1 += 1;
        }
        assert_eq!(lock.is_biased(), biasable);
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = lock.lock();
                        // Torn updates would show as the two apart.
                        assert_eq!(g.0, g.1);
                        g.0 += 1;
                        g.1 += 1;
                    }
                })
            })
            .collect();
        for _ in 0..20_000 {
            let mut g = lock.lock();
            assert_eq!(g.0, g.1);
            g.0 += 1;
            g.1 += 1;
        }
        for t in threads {
            t.join().unwrap();
        }
        let g = lock.lock();
        assert_eq!(*g, (81_000, 81_000));
        assert!(!lock.is_biased());
    }

    #[test]
    fn a_biased_lock_loses_no_update_when_other_threads_revoke_it() {
        counts_under(asymmetric());
    }

    #[test]
    fn an_unbiased_lock_is_a_mutex() {
        counts_under(false);
    }

    #[test]
    fn the_owner_keeps_the_bias_until_another_thread_takes_the_lock() {
        let lock = Arc::new(BiasedLock::with_bias(0u32, asymmetric()));
        assert!(!lock.is_biased());
        *lock.lock() += 1;
        assert_eq!(lock.is_biased(), asymmetric());
        *lock.lock() += 1;
        assert_eq!(lock.is_biased(), asymmetric());
        let other = lock.clone();
        std::thread::spawn(move || *other.lock() += 1)
            .join()
            .unwrap();
        assert!(!lock.is_biased());
        assert_eq!(*lock.lock(), 3);
    }

    #[test]
    fn a_lock_taken_elsewhere_first_is_still_claimed_by_its_first_locker() {
        let lock = Arc::new(BiasedLock::with_bias(0u32, asymmetric()));
        let elsewhere = || {
            let other = lock.clone();
            std::thread::spawn(move || *other.lock_elsewhere() += 1)
                .join()
                .unwrap();
        };
        elsewhere();
        assert!(!lock.is_biased());
        *lock.lock() += 1;
        assert_eq!(lock.is_biased(), asymmetric());
        // Taken elsewhere again: the bias is gone for good.
        elsewhere();
        assert!(!lock.is_biased());
        *lock.lock() += 1;
        assert!(!lock.is_biased());
        assert_eq!(*lock.lock(), 4);
    }
}
