//! Memory that every rank of a host maps (ferroccl's windows and the
//! control pages of its check-ins), as a provider and its regions, so that
//! the layer above reaches it without naming a transport crate. The life
//! cycle is the caller's: each rank creates its region, all agree that
//! every rank could, each opens every rank's region, all agree again, and
//! then every name is unlinked, so that a rank killed afterwards leaves
//! nothing behind. This module only states the seam; the mapping (and its
//! `unsafe`) lives in the provider's crate (ferroccl-shm).

use std::path::Path;
use std::sync::atomic::AtomicU64;

/// A place where regions shared by the processes of one host are made
/// (a directory of a tmpfs, for ferroccl-shm), and what the check-ins need
/// to know about those processes.
pub trait SharedMemory: Send + Sync + std::fmt::Debug {
    /// Where regions live, for messages ("/dev/shm").
    fn location(&self) -> String;

    /// The start of every name this provider's transport gives its files,
    /// so that a name made with it is recognisably ferroccl's.
    fn name_prefix(&self) -> &'static str;

    /// Create the region `name` (it must not exist) of `len` bytes, zeroed,
    /// and map it. Space is reserved now: a full file system is an error
    /// here, not a fault on first touch. A `len` of 0 still gets an address.
    fn create(&self, name: &str, len: usize) -> std::io::Result<Box<dyn SharedRegion>>;

    /// Map the existing region `name`, whatever its length.
    fn open(&self, name: &str) -> std::io::Result<Box<dyn SharedRegion>>;

    /// Remove the name `name` (mappings stay valid); a name that does not
    /// exist is no error.
    fn unlink(&self, name: &str) -> std::io::Result<()>;

    /// Copy `local.len()` bytes at `remote_addr` in process `pid` into
    /// `local` (cross-memory attach): an error, never a panic, for a process
    /// that is gone, memory not mapped there, `pid` being this process, or
    /// a lack of permission; [`std::io::ErrorKind::Unsupported`] where the
    /// provider cannot do this at all.
    fn read_process(&self, pid: u32, remote_addr: usize, local: &mut [u8]) -> std::io::Result<()>;

    /// Copy `local` to `remote_addr` in process `pid` (cross-memory
    /// attach, the other way): the same errors as
    /// [`SharedMemory::read_process`]; [`std::io::ErrorKind::Unsupported`]
    /// (the default) where the provider cannot.
    fn write_process(&self, pid: u32, remote_addr: usize, local: &[u8]) -> std::io::Result<()> {
        let _ = (pid, remote_addr, local);
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this shared-memory provider cannot write another process's memory",
        ))
    }

    /// Whether process `pid` is gone (does not exist, or is a zombie).
    fn process_gone(&self, pid: u32) -> bool;
}

/// One mapping of a shared region: plain bytes, and 64-bit words used as
/// atomics. Which process may touch which bytes when is the caller's
/// protocol; a region only maps, bounds-checks and hands out views.
pub trait SharedRegion: Send + Sync + std::fmt::Debug {
    /// Bytes mapped.
    fn len(&self) -> usize;

    /// Whether the region has no bytes (never for a created one).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address of the first byte in this process, to tell whether a slice
    /// lies inside the region (or to tell a peer where to read by
    /// cross-memory attach). Not for dereferencing.
    fn addr(&self) -> usize;

    /// The file the region was created from or opened at, for messages.
    fn path(&self) -> &Path;

    /// `len` bytes at `off`, to read; an error if they are not all inside.
    fn slice(&self, off: usize, len: usize) -> std::io::Result<&[u8]>;

    /// `len` bytes at `off`, to write; an error if they are not all inside.
    fn slice_mut(&mut self, off: usize, len: usize) -> std::io::Result<&mut [u8]>;

    /// The 64-bit word at `index` (byte offset `8 * index`), as an atomic
    /// shared with every process that maps the region.
    fn word(&self, index: usize) -> std::io::Result<&AtomicU64>;

    /// Every whole 64-bit word of the region (`len / 8` of them), so that
    /// code that reads many words indexes this slice instead of making a
    /// call per word. Word `i` is [`SharedRegion::word`]`(i)`.
    fn words(&self) -> &[AtomicU64];

    /// Remove the region's name (the mappings stay valid until dropped);
    /// a later region that took the same name is left alone.
    fn unlink(&self) -> std::io::Result<()>;
}
