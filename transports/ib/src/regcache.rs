//! Registrations of caller memory kept for reuse, so that large frames can
//! be written to the peer straight from the caller's buffer (zero copy)
//! instead of being copied into the registered `stage` region first.
//!
//! It owns: which caller memory may be registered ([`MemoryLease`],
//! [`UserBuffer`]), the cache of registrations ([`RegCache`]) and its
//! settings ([`ZeroCopyConfig`]). It must not touch the data path's own
//! regions, nor any memory no lease covers.
//!
//! ## Memory that is freed and used again
//!
//! A registration pins the pages it found at registration time. If the
//! caller frees a buffer and the allocator maps fresh pages at the same
//! address (glibc does so for large blocks: `munmap`, then `mmap`), a
//! registration kept by address alone would make the NIC send the old
//! pages: wrong bytes, silently. A cache keyed by address cannot tell, and
//! the other ways to know (hooking `munmap`, on-demand paging) are either
//! intrusive or need hardware support. So, as NCCL does with
//! `ncclCommRegister`, this cache registers only memory the caller has
//! declared as staying put, and it checks that declaration on every use:
//!
//! - A [`MemoryLease`] declares a range; every registration is made under
//!   one lease and remembers it (a [`Weak`] reference). A registration is
//!   handed out only while its lease lives; once the lease is dropped, its
//!   registrations are never handed out again and are deregistered at the
//!   cache's next operation. A new lease on the same range is another
//!   lease: a fresh registration, never the old one.
//! - [`UserBuffer`] is memory with its lease inside: it owns its bytes, so
//!   they cannot be freed while the lease lives. That is the safe way in.
//! - [`MemoryLease::declare`] on memory the caller owns elsewhere is its
//!   promise that the range stays allocated and mapped while the lease
//!   lives (NCCL's contract). Broken, it costs wrong bytes at the peer,
//!   not memory safety here: caller memory is registered for the NIC to
//!   read only, so no peer can write into it.
//! - Memory no live lease covers is never registered: those frames are
//!   staged as before.

use crate::verbs::{Device, MemoryRegion, UserMemory};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// `FERROCCL_IB_REG_CACHE`: most registrations a connection keeps.
pub const REG_CACHE_VAR: &str = "FERROCCL_IB_REG_CACHE";
/// `FERROCCL_IB_REG_CACHE_BYTES`: most bytes they may cover.
pub const REG_CACHE_BYTES_VAR: &str = "FERROCCL_IB_REG_CACHE_BYTES";
/// `FERROCCL_IB_ZCOPY_MIN`: payload bytes from which a frame from a
/// registered buffer is sent without the staging copy.
pub const ZCOPY_MIN_VAR: &str = "FERROCCL_IB_ZCOPY_MIN";

/// Default of [`REG_CACHE_VAR`].
pub const DEFAULT_MAX_ENTRIES: usize = 64;
/// Default of [`REG_CACHE_BYTES_VAR`]: 1 GiB (registered memory is pinned,
/// and counts against the locked-memory limit).
pub const DEFAULT_MAX_BYTES: usize = 1 << 30;
/// Default of [`ZCOPY_MIN_VAR`]: 256 KiB. A zero-copy frame saves the
/// CPU its payload's copy, but costs one more message (its header goes
/// apart from the payload) and holds the sender until the NIC has read
/// the buffer, so one such frame is in flight per connection instead of a
/// slot FIFO's worth. See docs/ib.md, "Zero copy", for the arithmetic.
pub const DEFAULT_ZCOPY_MIN: usize = 256 << 10;

/// Bounds of a [`RegCache`]. Either at zero turns the cache, and so zero
/// copy, off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Most registrations kept.
    pub max_entries: usize,
    /// Most bytes they cover together.
    pub max_bytes: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits {
            max_entries: DEFAULT_MAX_ENTRIES,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// Zero copy's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZeroCopyConfig {
    /// Payload bytes from which a frame is sent from the caller's memory
    /// (when a lease covers it).
    pub min_bytes: usize,
    /// The cache's bounds.
    pub limits: CacheLimits,
}

impl Default for ZeroCopyConfig {
    fn default() -> Self {
        ZeroCopyConfig {
            min_bytes: DEFAULT_ZCOPY_MIN,
            limits: CacheLimits::default(),
        }
    }
}

impl ZeroCopyConfig {
    /// From the process environment.
    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// From `lookup` (an unset or empty variable keeps its default): a
    /// byte count with an optional `K`, `M` or `G` (powers of 1024); a bad
    /// one is an error naming the variable and its value.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let mut cfg = Self::default();
        let read = |var: &str, into: &mut usize| -> Result<(), String> {
            match lookup(var).filter(|v| !v.trim().is_empty()) {
                None => Ok(()),
                Some(v) => {
                    *into = ferroccl_transport::size_value(&v).ok_or_else(|| {
                        format!("{var}={v:?} is not a byte count (digits, then K, M or G)")
                    })?;
                    Ok(())
                }
            }
        };
        read(REG_CACHE_VAR, &mut cfg.limits.max_entries)?;
        read(REG_CACHE_BYTES_VAR, &mut cfg.limits.max_bytes)?;
        read(ZCOPY_MIN_VAR, &mut cfg.min_bytes)?;
        Ok(cfg)
    }
}

/// What a lease covers.
#[derive(Debug)]
struct LeaseRange {
    start: usize,
    len: usize,
}

/// Live leases, process-wide (memory is the process's, not a device's).
fn leases() -> &'static Mutex<Vec<Weak<LeaseRange>>> {
    static LEASES: OnceLock<Mutex<Vec<Weak<LeaseRange>>>> = OnceLock::new();
    LEASES.get_or_init(Mutex::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The smallest live lease covering `start..start + len`.
fn lease_covering(start: usize, len: usize) -> Option<Arc<LeaseRange>> {
    let mut all = lock(leases());
    all.retain(|w| w.strong_count() > 0);
    all.iter()
        .filter_map(Weak::upgrade)
        .filter(|l| covers(l.start, l.len, start, len))
        .min_by_key(|l| l.len)
}

fn covers(start: usize, len: usize, at: usize, n: usize) -> bool {
    at >= start && at.checked_add(n).is_some_and(|end| end <= start + len)
}

fn overlaps(a: usize, alen: usize, b: usize, blen: usize) -> bool {
    a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

/// A declaration that a range of caller memory stays allocated and mapped
/// while this value lives, so that the data path may register it and send
/// from it without copying. Dropping it withdraws the declaration: no
/// registration made under it is used again (see the module doc).
#[derive(Debug)]
pub struct MemoryLease {
    range: Arc<LeaseRange>,
}

impl MemoryLease {
    /// Declares `bytes`' range. The caller promises that the range stays
    /// allocated and mapped (not freed, not `munmap`ed) while the lease
    /// lives; if not, a frame sent from it may carry the bytes the memory
    /// held at registration. [`UserBuffer`] keeps that promise by owning
    /// the memory.
    pub fn declare(bytes: &[u8]) -> Self {
        let range = Arc::new(LeaseRange {
            start: bytes.as_ptr() as usize,
            len: bytes.len(),
        });
        let mut all = lock(leases());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&range));
        MemoryLease { range }
    }

    /// The declared range: first byte's address and length.
    pub fn range(&self) -> (usize, usize) {
        (self.range.start, self.range.len)
    }
}

/// Host memory that frames may be sent from without a copy: zeroed bytes
/// owned together with their [`MemoryLease`], so they stay put for as
/// long as the lease says they do.
#[derive(Debug)]
pub struct UserBuffer {
    // Declared before `bytes` so that it is dropped (withdrawn) first.
    lease: MemoryLease,
    bytes: Box<[u8]>,
}

impl UserBuffer {
    /// `len` zeroed bytes, declared.
    pub fn new(len: usize) -> Self {
        Self::from_vec(vec![0; len])
    }

    /// `bytes`, moved in and declared.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let bytes = bytes.into_boxed_slice();
        UserBuffer {
            lease: MemoryLease::declare(&bytes),
            bytes,
        }
    }

    /// The lease the buffer holds.
    pub fn lease(&self) -> &MemoryLease {
        &self.lease
    }
}

impl std::ops::Deref for UserBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl std::ops::DerefMut for UserBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

/// What a [`RegCache`] has done, counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups answered by a registration already there.
    pub hits: u64,
    /// Lookups that registered memory.
    pub misses: u64,
    /// Lookups no live lease covered (or too large for the bounds): the
    /// frame is staged.
    pub uncovered: u64,
    /// Registrations that failed (the frame is staged).
    pub failed: u64,
    /// Registrations deregistered to stay within the bounds.
    pub evicted: u64,
    /// Registrations deregistered because their lease was dropped or
    /// [`RegCache::invalidate`] named them.
    pub invalidated: u64,
}

#[derive(Debug)]
struct Entry {
    start: usize,
    len: usize,
    mr: MemoryRegion,
    lease: Weak<LeaseRange>,
    /// Tick of the last use (least recently used goes first).
    last: u64,
}

/// A bounded set of registrations of leased caller memory on one device,
/// looked up by range (a range inside a registration is a hit), least
/// recently used first out. Registrations are made over the whole leased
/// range when it fits the byte bound (so every chunk of a buffer hits
/// after the first), else over the range asked for.
///
/// Not shared: each sending half owns one and uses it from its thread, so
/// a registration it handed out stays registered until the caller's next
/// call on the cache (deregistration happens only inside those calls).
#[derive(Debug)]
pub struct RegCache {
    limits: CacheLimits,
    entries: Vec<Entry>,
    tick: u64,
    stats: CacheStats,
}

impl RegCache {
    /// An empty cache with these bounds.
    pub fn new(limits: CacheLimits) -> Self {
        RegCache {
            limits,
            entries: Vec::new(),
            tick: 0,
            stats: CacheStats::default(),
        }
    }

    /// The cache's bounds.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    /// A registration covering the `len` bytes at `addr`, and their offset
    /// in it; `None` when no live lease covers them, when they cannot fit
    /// the bounds, or when registering failed (the caller stages them).
    /// Registers and evicts on `dev` as needed; first deregisters the
    /// registrations whose lease is gone.
    pub fn acquire<D: Device>(
        &mut self,
        dev: &D,
        addr: usize,
        len: usize,
    ) -> Option<(MemoryRegion, usize)> {
        self.reap(dev);
        self.tick += 1;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| covers(e.start, e.len, addr, len))
        {
            e.last = self.tick;
            self.stats.hits += 1;
            return Some((e.mr, addr - e.start));
        }
        let lease = match lease_covering(addr, len) {
            Some(lease) if len <= self.limits.max_bytes && self.limits.max_entries > 0 => lease,
            _ => {
                self.stats.uncovered += 1;
                return None;
            }
        };
        let (start, n) = if lease.len <= self.limits.max_bytes {
            (lease.start, lease.len)
        } else {
            (addr, len)
        };
        while !self.entries.is_empty()
            && (self.entries.len() >= self.limits.max_entries
                || self.bytes() + n > self.limits.max_bytes)
        {
            let lru = (0..self.entries.len())
                .min_by_key(|&i| self.entries[i].last)
                .unwrap_or(0);
            let e = self.entries.swap_remove(lru);
            let _ = dev.deregister(e.mr.handle);
            self.stats.evicted += 1;
        }
        match dev.register_user(UserMemory::Host {
            addr: start,
            len: n,
        }) {
            Ok(mr) => {
                self.entries.push(Entry {
                    start,
                    len: n,
                    mr,
                    lease: Arc::downgrade(&lease),
                    last: self.tick,
                });
                self.stats.misses += 1;
                Some((mr, addr - start))
            }
            Err(_) => {
                self.stats.failed += 1;
                None
            }
        }
    }

    /// Deregisters every registration overlapping the `len` bytes at
    /// `addr` (e.g. before the caller gives that memory back while a lease
    /// on a larger range lives on); returns how many.
    pub fn invalidate<D: Device>(&mut self, dev: &D, addr: usize, len: usize) -> usize {
        self.remove_where(dev, |e| overlaps(e.start, e.len, addr, len))
    }

    /// Deregisters everything (the sending half is going away).
    pub fn clear<D: Device>(&mut self, dev: &D) {
        self.remove_where(dev, |_| true);
    }

    /// What the cache has done so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// The registrations kept: address and length of each, by address.
    pub fn ranges(&self) -> Vec<(usize, usize)> {
        let mut out: Vec<_> = self.entries.iter().map(|e| (e.start, e.len)).collect();
        out.sort_unstable();
        out
    }

    /// Bytes the registrations kept cover.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.len).sum()
    }

    /// Deregisters the registrations whose lease was dropped.
    fn reap<D: Device>(&mut self, dev: &D) {
        self.remove_where(dev, |e| e.lease.strong_count() == 0);
    }

    fn remove_where<D: Device>(&mut self, dev: &D, dead: impl Fn(&Entry) -> bool) -> usize {
        let mut n = 0;
        self.entries.retain(|e| {
            if dead(e) {
                let _ = dev.deregister(e.mr.handle);
                n += 1;
                false
            } else {
                true
            }
        });
        self.stats.invalidated += n as u64;
        n as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_the_environment_or_name_the_bad_one() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            ZeroCopyConfig::from_lookup(env(&[])),
            Ok(ZeroCopyConfig::default())
        );
        let cfg = ZeroCopyConfig::from_lookup(env(&[
            (REG_CACHE_VAR, "8"),
            (REG_CACHE_BYTES_VAR, "64M"),
            (ZCOPY_MIN_VAR, ""),
        ]))
        .unwrap();
        assert_eq!(
            cfg,
            ZeroCopyConfig {
                min_bytes: DEFAULT_ZCOPY_MIN,
                limits: CacheLimits {
                    max_entries: 8,
                    max_bytes: 64 << 20
                }
            }
        );
        let err = ZeroCopyConfig::from_lookup(env(&[(ZCOPY_MIN_VAR, "big")])).unwrap_err();
        assert!(err.contains(ZCOPY_MIN_VAR) && err.contains("big"), "{err}");
    }
}
