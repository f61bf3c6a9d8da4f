//! Windows: buffers that every rank of a communicator can read and write
//! directly (MPI's `MPI_Win_allocate_shared`; NCCL's memory allocated with
//! `ncclMemAlloc` and registered as a symmetric window).
//!
//! Through slots every byte a collective moves is copied twice: into a slot
//! by its sender, out of it by its receiver. When the buffers themselves
//! live in memory every rank has mapped, a rank can read its peers' inputs
//! and write their outputs itself, and each byte is copied once. On a CPU
//! there is no way to map another process's ordinary heap (that takes a
//! kernel module such as XPMEM), so such buffers must be allocated shared
//! from the start: [`crate::Communicator::alloc_window`] does that, every
//! rank together, and returns a [`Window`] that is used as a slice.
//!
//! Collectives whose buffers lie in windows on every rank (the same window
//! on every rank, at any offset) run the direct schedules of
//! `exec::direct`; anything else runs as before. Which way a call goes is
//! agreed per call through a small control page per rank (made when the
//! communicator is, where its ranks share a host), which also compares the
//! calls' fingerprints before any data moves and carries small calls
//! inline.

use crate::bias::BiasedLock;
use crate::element::Element;
use ferroccl_transport::{SharedMemory, SharedRegion};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};

/// A buffer of elements that the ranks of a communicator share: made by
/// [`crate::Communicator::alloc_window`], used as a `[T]` (it derefs to
/// one). Collectives whose input and output lie in windows (the same window
/// on every rank) copy each byte once, straight between the ranks'
/// buffers.
///
/// Where the ranks cannot share memory (ranks on several hosts, no
/// writable /dev/shm, FERROCCL_TRANSPORT=tcp, a single rank) the window is
/// ordinary private memory ([`Window::is_shared`] says which) and
/// collectives on it run as on any buffer.
///
/// A window's memory goes back to the system when every rank has dropped
/// its window. Elements start zeroed.
pub struct Window<T: Element> {
    /// Its place in the communicator's registry, which holds the
    /// mappings of the peers' parts: they live as long as this window.
    /// First, so that it drops first: the registry forgets the window
    /// before its own part is unmapped (and its addresses free to reuse).
    entry: Option<Registration>,
    mem: Mem<T>,
    len: usize,
}

enum Mem<T> {
    Shared(Box<dyn SharedRegion>),
    Private(Vec<T>),
}

impl<T: Element> Window<T> {
    pub(crate) fn shared(own: Box<dyn SharedRegion>, len: usize, entry: Registration) -> Self {
        Window {
            mem: Mem::Shared(own),
            len,
            entry: Some(entry),
        }
    }

    pub(crate) fn private(len: usize) -> Self {
        Window {
            mem: Mem::Private(vec![T::zeroed(); len]),
            len,
            entry: None,
        }
    }

    /// Whether the peers map this window (else it is private memory and
    /// collectives on it take the ordinary path).
    pub fn is_shared(&self) -> bool {
        matches!(self.mem, Mem::Shared(_))
    }

    /// The window's number on its communicator (the same on every rank;
    /// 0 for a private window).
    pub fn id(&self) -> u64 {
        self.entry.as_ref().map_or(0, |m| m.id)
    }
}

impl<T: Element> std::ops::Deref for Window<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        let bytes = self.len * std::mem::size_of::<T>();
        match &self.mem {
            // The region holds at least `bytes` bytes and is page-aligned
            // (see `Communicator::alloc_window`), so neither can fail.
            Mem::Shared(region) => bytemuck::cast_slice(
                region
                    .slice(0, bytes)
                    .expect("a window's region holds its elements"),
            ),
            Mem::Private(v) => v,
        }
    }
}

impl<T: Element> std::ops::DerefMut for Window<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let bytes = self.len * std::mem::size_of::<T>();
        match &mut self.mem {
            Mem::Shared(region) => bytemuck::cast_slice_mut(
                region
                    .slice_mut(0, bytes)
                    .expect("a window's region holds its elements"),
            ),
            Mem::Private(v) => v,
        }
    }
}

impl<T: Element> std::fmt::Debug for Window<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("id", &self.id())
            .field("len", &self.len)
            .field("shared", &self.is_shared())
            .finish()
    }
}

/// A shared window's place in its communicator's registry ([`Windows`],
/// which holds the mappings of the peers' parts): dropped with the
/// window, it takes them out of the registry, so that they are unmapped
/// then and a buffer at its addresses is found in it no more.
pub(crate) struct Registration {
    pub(crate) id: u64,
    /// The registry that holds the window (gone with its communicator).
    pub(crate) registry: Weak<BiasedLock<Windows>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            // Rarely, and maybe on another thread than the calls': the
            // bias stays with the thread that calls.
            registry.lock_elsewhere().forget(self.id);
        }
    }
}

/// Each rank's part of one window as mapped here, by rank; `None` at this
/// rank's index (its part is the window's own region, reached through the
/// caller's slices).
pub(crate) type Parts = Vec<Option<Box<dyn SharedRegion>>>;

/// The words of each control page, borrowed once from the pages.
type PageWords<'a> = Vec<&'a [AtomicU64]>;

self_cell::self_cell!(
    /// The ranks' control pages, by rank, and each page's words
    /// (`SharedRegion::words`) asked once, when the pages are made: the
    /// check-in reads some twenty words a call, and each ask would be a
    /// call through the trait object.
    pub(crate) struct Pages {
        owner: Vec<Box<dyn SharedRegion>>,
        #[covariant]
        dependent: PageWords,
    }
);

impl Pages {
    pub(crate) fn from_regions(pages: Vec<Box<dyn SharedRegion>>) -> Self {
        Pages::new(pages, |pages| pages.iter().map(|p| p.words()).collect())
    }

    /// Rank `rank`'s page.
    pub(crate) fn page(&self, rank: usize) -> &dyn SharedRegion {
        &*self.borrow_owner()[rank]
    }

    /// The 64-bit words of rank `rank`'s page.
    #[inline]
    pub(crate) fn words(&self, rank: usize) -> &[AtomicU64] {
        self.borrow_dependent()[rank]
    }
}

/// The control pages of the ranks (one per rank, every rank maps all):
/// where calls are announced and completions signalled (`exec::checkin`).
pub(crate) struct Control {
    /// Each rank's page, by rank (this rank's own included).
    pub(crate) pages: Pages,
    /// This rank's page once more, to write its inline data through (the
    /// same memory as `pages[rank]`).
    pub(crate) own: Mutex<Box<dyn SharedRegion>>,
    /// Each rank's process id, to notice a peer that died.
    pub(crate) pids: Vec<u32>,
    /// Where the pages were made: asked whether a peer's process is gone,
    /// and to read a peer's memory by cross-memory attach (`exec::pull`).
    pub(crate) memory: Arc<dyn SharedMemory>,
    /// Check-ins so far on this rank (the same count on every rank: which
    /// calls check in is decided from the call alone): picks the
    /// announcement slot of the next one.
    pub(crate) checkins: std::sync::atomic::AtomicU64,
    /// Where (bytes from its start) the last inline input this rank placed
    /// in its inline region ends: the next one goes after it
    /// (`exec::checkin::next_area`).
    pub(crate) inline_end: std::sync::atomic::AtomicU64,
    /// The check-ins this rank left without reading the announcements of
    /// the ranks that read its own (a broadcast's root, a reduce's
    /// senders: `exec::inline`) and has not compared with theirs yet, by
    /// slot: bit `t % CHECKIN_SLOTS` for check-in `t`
    /// (`exec::checkin::confirm_left`).
    pub(crate) left_mask: AtomicU64,
    /// The oldest of them, `u64::MAX` when there is none.
    pub(crate) oldest_unconfirmed: AtomicU64,
    /// One more than the last check-in that every peer is known to have
    /// announced: a rank that reads every announcement of a check-in
    /// learns it there; one that does not waits for it before any call
    /// that does not check in (`exec::checkin::settle`).
    pub(crate) all_announced: AtomicU64,
    /// The least of the peers' "done up to" words when this rank last read
    /// them (`exec::checkin::free_slot`).
    pub(crate) peers_finished: AtomicU64,
    /// `Config::early_return`: a small broadcast's root and a small
    /// reduce's senders leave their check-in without reading their peers'
    /// announcements (`plan::reads_inline`).
    pub(crate) early_return: bool,
    /// Set once the communicator has a shared window (on every rank
    /// alike): from then on every collective checks in, not only small
    /// ones, since any of them may lie in windows.
    pub(crate) windows: std::sync::atomic::AtomicBool,
    /// Every rank read every other rank's probe word by cross-memory
    /// attach at creation (and FERROCCL_CMA is on everywhere): large
    /// allgathers and all-to-alls, and broadcasts over the calibrated
    /// sizes, of ordinary buffers copy straight out of the peers'
    /// processes (`exec::pull`).
    pub(crate) cma: bool,
    /// Every rank could also write every other rank's probe word by
    /// cross-memory attach, and has a CPU of its own (no more ranks than
    /// the host's CPUs): a broadcast pulled out of the root's process
    /// is shared, the root pushing a share of its input into every
    /// receiver's output while the receivers pull the rest (`exec::pull`).
    pub(crate) cma_push: bool,
    /// Chunks staged so far through the roots' staging areas by large
    /// broadcasts on 3 or more ranks (`exec::spread`; the same count on
    /// every rank, each rank counting every such call): numbers the next
    /// call's chunks, which take the staging slots in turn.
    pub(crate) spread_chunks: AtomicU64,
}

/// A communicator's windows.
#[derive(Default)]
pub(crate) struct Windows {
    /// Windows created so far (shared or not), the same count on every
    /// rank: numbers them.
    pub(crate) created: u64,
    live: Vec<Live>,
}

/// A window [`Windows`] holds while it lives: its number, where this
/// rank's part is (to recognise buffers inside it), and the peers' parts.
/// A call between windows reaches the parts under the registry's lock,
/// which the thread that calls takes without a locked instruction
/// (`bias::BiasedLock`): looking a window up by a weak pointer and locking
/// its parts took about seven locked instructions a call, each waiting for
/// the call's stores to the peers' lines to leave the core
/// (docs/performance-log.md, "Calls between windows without a locked
/// instruction").
struct Live {
    id: u64,
    own_addr: usize,
    own_bytes: usize,
    parts: Parts,
}

impl Windows {
    /// The live shared window whose own part holds `bytes` bytes at
    /// `addr`, and the offset of `addr` in it.
    pub(crate) fn find(&self, addr: usize, bytes: usize) -> Option<(u64, usize)> {
        let end = addr.checked_add(bytes)?;
        self.live
            .iter()
            .find(|w| addr >= w.own_addr && end <= w.own_addr + w.own_bytes)
            .map(|w| (w.id, addr - w.own_addr))
    }

    /// The peers' parts of live windows `a` and `b` (`None` for `b` when
    /// it is `a`), or the number of one that is not live here.
    pub(crate) fn parts(
        &mut self,
        a: u64,
        b: u64,
    ) -> Result<(&mut Parts, Option<&mut Parts>), u64> {
        let (mut first, mut second) = (None, None);
        for w in &mut self.live {
            if w.id == a {
                first = Some(&mut w.parts);
            } else if w.id == b {
                second = Some(&mut w.parts);
            }
        }
        match (first, second) {
            (Some(first), second) if a == b || second.is_some() => Ok((first, second)),
            (None, _) => Err(a),
            _ => Err(b),
        }
    }

    /// Hold window `id`'s peers' parts, this rank's own of `own_bytes`
    /// bytes at `own_addr`, until its [`Registration`] drops.
    pub(crate) fn add(&mut self, id: u64, (own_addr, own_bytes): (usize, usize), parts: Parts) {
        self.live.push(Live {
            id,
            own_addr,
            own_bytes,
            parts,
        });
    }

    /// Let go of window `id` (its window dropped).
    fn forget(&mut self, id: u64) {
        self.live.retain(|w| w.id != id);
    }
}

/// The name of rank `rank`'s part of window `id` (0: the control page) of
/// communicator `comm_id` in the job of `token`, made by `memory`.
pub(crate) fn region_name(
    memory: &dyn SharedMemory,
    token: u64,
    comm_id: u64,
    id: u64,
    rank: usize,
) -> String {
    format!(
        "{}win-{token:016x}-{comm_id:016x}-{id}-{rank}",
        memory.name_prefix()
    )
}

/// Bytes of a control page: 4 KiB of announcements, then the inline data
/// of calls that run in the check-in, an area of the planner's largest for
/// each announcement slot (`exec::checkin`, `exec::inline`), then the
/// staging area a large broadcast's root copies its input through for
/// every receiver to read (`exec::spread`). The pages are files on a
/// memory file system (or zeroed allocations for threads): only what calls
/// touch becomes resident (the staging area only on a rank that was the
/// root of such a broadcast).
pub(crate) const CONTROL_BYTES: usize = crate::exec::SPREAD_AT + crate::exec::SPREAD_BYTES;

#[cfg(test)]
mod tests {
    use super::{BiasedLock, Registration, Windows};
    use std::sync::Arc;

    fn registered(
        registry: &Arc<BiasedLock<Windows>>,
        id: u64,
        own: (usize, usize),
    ) -> Registration {
        registry.lock().add(id, own, Vec::new());
        Registration {
            id,
            registry: Arc::downgrade(registry),
        }
    }

    /// A buffer is found in the live window that holds it whole, at its
    /// offset; a dropped window is found no more, even where a new one
    /// took its addresses.
    #[test]
    fn finds_live_windows_by_address_and_number() {
        let registry = Arc::new(BiasedLock::with_bias(Windows::default(), false));
        let a = registered(&registry, 1, (4096, 8192));
        let b = registered(&registry, 2, (65536, 4096));
        {
            let mut w = registry.lock();
            assert_eq!(w.find(4096, 8192), Some((1, 0)));
            assert_eq!(w.find(8192, 16), Some((1, 4096)));
            assert_eq!(w.find(12000, 8192), None, "runs past the window's end");
            assert_eq!(w.find(65536 + 4000, 96), Some((2, 4000)));
            assert_eq!(w.find(usize::MAX - 4, 16), None, "the end overflows");
            assert!(w.parts(2, 2).is_ok_and(|(_, other)| other.is_none()));
            assert!(w.parts(1, 2).is_ok_and(|(_, other)| other.is_some()));
            assert_eq!(w.parts(1, 7).err(), Some(7));
        }
        drop(a);
        {
            let mut w = registry.lock();
            assert_eq!(w.find(4096, 16), None);
            assert_eq!(w.parts(1, 1).err(), Some(1));
            assert_eq!(w.parts(2, 1).err(), Some(1));
        }
        let c = registered(&registry, 3, (4096, 8192));
        {
            let mut w = registry.lock();
            assert_eq!(w.find(4096, 16), Some((3, 0)));
            assert!(w.parts(1, 1).is_err() && w.parts(3, 3).is_ok());
        }
        drop((b, c));
        assert_eq!(registry.lock().find(65536, 16), None);
        assert!(
            registry.lock().live.is_empty(),
            "every dropped window is let go"
        );
    }
}
