//! Shared regions: a file under /dev/shm that every rank of a communicator
//! maps, for memory that peers read and write directly (ferroccl's windows,
//! and the small control page that goes with them).
//!
//! A region is plain bytes plus, at the start of a control region, 64-bit
//! words used as atomics. Which process may touch which bytes when is the
//! business of the protocol one layer up (ferroccl's `window` module); this
//! module only maps, bounds-checks and hands out views. Its `unsafe` is the
//! conversion of the mapping into slices and atomics.
//!
//! [`ShmMemory`] offers regions through the transport core's
//! [`SharedMemory`] seam, which is how the layer above reaches them.

use ferroccl_transport::{SharedMemory, SharedRegion};
use memmap2::{MmapOptions, MmapRaw};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

/// One mapping of a shared region.
#[derive(Debug)]
pub struct Region {
    map: MmapRaw,
    len: usize,
    path: PathBuf,
    /// (device, inode) of the file, so that `unlink` never removes a later
    /// file that took the same name.
    id: (u64, u64),
}

fn file_id(file: &File) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

impl Region {
    /// Create `dir/name` (it must not exist) with `len` bytes reserved
    /// (a full /dev/shm is an error here, not a SIGBUS later), zero-filled,
    /// and map it. `len` of 0 maps one byte's page so that every region has
    /// an address.
    pub fn create(dir: &Path, name: &str, len: usize) -> std::io::Result<Region> {
        let path = dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let made = (|| {
            let bytes = len.max(1) as u64;
            file.set_len(bytes)?;
            crate::os::reserve(&file, bytes)?;
            Region::map(&file, path.clone())
        })();
        if made.is_err() {
            let _ = std::fs::remove_file(&path);
        }
        made
    }

    /// Map the existing region `dir/name`, whatever its length.
    pub fn open(dir: &Path, name: &str) -> std::io::Result<Region> {
        let path = dir.join(name);
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        Region::map(&file, path)
    }

    fn map(file: &File, path: PathBuf) -> std::io::Result<Region> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| std::io::Error::other("region too large"))?;
        if len == 0 {
            return Err(std::io::Error::other("region file is empty"));
        }
        let map = MmapOptions::new().len(len).map_raw(file)?;
        if map.len() < len {
            return Err(std::io::Error::other("short mapping"));
        }
        Ok(Region {
            map,
            len,
            path,
            id: file_id(file)?,
        })
    }

    /// Remove the region's file (the mappings stay valid until dropped).
    /// A file of the same name that is not this region is left alone.
    pub fn unlink(&self) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.id => std::fs::remove_file(&self.path),
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes (never: see `create`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte in this process, to tell whether a slice
    /// lies inside the region. Not for dereferencing.
    pub fn addr(&self) -> usize {
        self.map.as_ptr() as usize
    }

    /// The file the region was created from or opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    // The accessors below are inlined into the callers in other crates:
    // the check-in of a small collective makes some twenty of them, and
    // as calls they cost about a fifth of an 8-byte allreduce.
    #[inline]
    fn check(&self, off: usize, len: usize) -> std::io::Result<()> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(self.outside(off, len)),
        }
    }

    #[cold]
    #[inline(never)]
    fn outside(&self, off: usize, len: usize) -> std::io::Error {
        std::io::Error::other(format!(
            "bytes {off}..+{len} lie outside a region of {} bytes",
            self.len
        ))
    }

    /// `len` bytes at `off`, to read.
    ///
    /// Other processes may write other parts of the region meanwhile; the
    /// caller's protocol guarantees nobody writes these bytes while the view
    /// lives.
    #[inline]
    pub fn slice(&self, off: usize, len: usize) -> std::io::Result<&[u8]> {
        self.check(off, len)?;
        // SAFETY: `off + len <= self.len` (checked above) and the mapping
        // of `self.len` bytes lives as long as `self`, which the returned
        // borrow cannot outlive. Any bit pattern is a valid u8. Within this
        // process no `&mut` to these bytes exists while the shared borrow of
        // `self` lives (`slice_mut` takes `&mut self`); other processes stay
        // off them by protocol, as with the transport's slots.
        Ok(unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(off), len) })
    }

    /// `len` bytes at `off`, to write.
    #[inline]
    pub fn slice_mut(&mut self, off: usize, len: usize) -> std::io::Result<&mut [u8]> {
        self.check(off, len)?;
        // SAFETY: as in `slice`; `&mut self` makes this the only view of
        // the region in this process while it lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(off), len) })
    }

    /// The 64-bit word at `index` (byte offset `8 * index`), as an atomic
    /// shared with every process that maps the region.
    #[inline]
    pub fn word(&self, index: usize) -> std::io::Result<&AtomicU64> {
        let Some(off) = index.checked_mul(8) else {
            return Err(self.outside(usize::MAX, 8));
        };
        self.check(off, 8)?;
        // SAFETY: the mapping is page-aligned, so `off` (a multiple of 8)
        // is 8-aligned; the 8 bytes lie inside the mapping (checked) which
        // outlives the borrow. AtomicU64 has the size and alignment of u64,
        // any bit pattern is valid, and atomics may be accessed through a
        // shared reference from this and other processes at once. Regions
        // used with words keep those bytes for atomics only.
        Ok(unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) })
    }

    /// Every whole 64-bit word of the region, as atomics (see `word`).
    #[inline]
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: as in `word`, for the `len / 8` words that lie wholly
        // inside the mapping (page-aligned, so word 0 is 8-aligned): the
        // slice covers `8 * (len / 8) <= len` bytes, lives no longer than
        // `self` (the mapping), and any bit pattern is a valid AtomicU64.
        // Bytes also handed out by `slice` are shared with it, which is
        // sound for the same reason those views are: `slice_mut` needs
        // `&mut self`, so no `&mut` alias exists in this process while this
        // borrow lives.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr() as *const AtomicU64, self.len / 8) }
    }
}

impl SharedRegion for Region {
    fn len(&self) -> usize {
        self.len
    }

    fn addr(&self) -> usize {
        Region::addr(self)
    }

    fn path(&self) -> &Path {
        Region::path(self)
    }

    fn slice(&self, off: usize, len: usize) -> std::io::Result<&[u8]> {
        Region::slice(self, off, len)
    }

    fn slice_mut(&mut self, off: usize, len: usize) -> std::io::Result<&mut [u8]> {
        Region::slice_mut(self, off, len)
    }

    fn word(&self, index: usize) -> std::io::Result<&AtomicU64> {
        Region::word(self, index)
    }

    fn words(&self) -> &[AtomicU64] {
        Region::words(self)
    }

    fn unlink(&self) -> std::io::Result<()> {
        Region::unlink(self)
    }
}

/// Shared regions as files of one directory (a tmpfs such as /dev/shm,
/// FERROCCL_SHM_DIR), through the transport core's [`SharedMemory`] seam.
#[derive(Debug, Clone)]
pub struct ShmMemory {
    dir: PathBuf,
}

impl ShmMemory {
    /// Regions in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ShmMemory { dir: dir.into() }
    }

    /// The directory regions are created in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl SharedMemory for ShmMemory {
    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn name_prefix(&self) -> &'static str {
        crate::SEGMENT_PREFIX
    }

    fn create(&self, name: &str, len: usize) -> std::io::Result<Box<dyn SharedRegion>> {
        Ok(Box::new(Region::create(&self.dir, name, len)?))
    }

    fn open(&self, name: &str) -> std::io::Result<Box<dyn SharedRegion>> {
        Ok(Box::new(Region::open(&self.dir, name)?))
    }

    fn unlink(&self, name: &str) -> std::io::Result<()> {
        match std::fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn read_process(&self, pid: u32, remote_addr: usize, local: &mut [u8]) -> std::io::Result<()> {
        read_process_memory(pid, remote_addr, local)
    }

    fn write_process(&self, pid: u32, remote_addr: usize, local: &[u8]) -> std::io::Result<()> {
        write_process_memory(pid, remote_addr, local)
    }

    fn process_gone(&self, pid: u32) -> bool {
        process_gone(pid)
    }
}

/// Whether process `pid` is gone (does not exist, or is a zombie).
pub fn process_gone(pid: u32) -> bool {
    crate::os::process_gone(pid)
}

/// Copy `local.len()` bytes at address `remote` in process `pid` into
/// `local`: cross-memory attach (`process_vm_readv`), one copy by the
/// kernel, no shared mapping needed. It takes permission to ptrace `pid`
/// (same user, and Yama's `ptrace_scope` 0 or a capability; some container
/// profiles forbid the call), so callers probe it first and keep another
/// way. An error, never a panic, for a process that is gone, memory that is
/// not mapped there, or `pid` being this process.
pub fn read_process_memory(pid: u32, remote: usize, local: &mut [u8]) -> std::io::Result<()> {
    crate::os::read_process_memory(pid, remote, local)
}

/// Copy `local` to address `remote` in process `pid`
/// (`process_vm_writev`): [`read_process_memory`] the other way, with the
/// same permission and the same errors. The caller must know that those
/// bytes of `pid` are its to write (the peer announced them as a buffer
/// this call fills).
pub fn write_process_memory(pid: u32, remote: usize, local: &[u8]) -> std::io::Result<()> {
    crate::os::write_process_memory(pid, remote, local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    fn name(tag: &str) -> String {
        format!("ferroccl-test-region-{}-{tag}", std::process::id())
    }

    #[test]
    fn two_mappings_see_each_others_writes_and_unlink_leaves_them_valid() {
        let dir = Path::new(crate::DEFAULT_DIR);
        let n = name("share");
        let mut a = Region::create(dir, &n, 10_000).unwrap();
        let b = Region::open(dir, &n).unwrap();
        assert_eq!(b.len(), 10_000);
        a.unlink().unwrap();
        assert!(!dir.join(&n).exists());
        a.slice_mut(5000, 4).unwrap().copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(b.slice(5000, 4).unwrap(), &[1, 2, 3, 4]);
        a.word(3).unwrap().store(77, Ordering::Release);
        assert_eq!(b.word(3).unwrap().load(Ordering::Acquire), 77);
        assert!(b.slice(9999, 2).is_err());
        assert!(b.slice(usize::MAX, 2).is_err());
        assert!(b.word(1250).is_err());
        assert!(b.word(usize::MAX).is_err());
    }

    #[test]
    fn create_refuses_an_existing_name_and_unlink_spares_a_newer_file() {
        let dir = Path::new(crate::DEFAULT_DIR);
        let n = name("excl");
        let first = Region::create(dir, &n, 64).unwrap();
        assert!(Region::create(dir, &n, 64).is_err());
        std::fs::remove_file(dir.join(&n)).unwrap();
        let second = Region::create(dir, &n, 64).unwrap();
        first.unlink().unwrap();
        assert!(dir.join(&n).exists(), "the newer file must stay");
        second.unlink().unwrap();
        assert!(!dir.join(&n).exists());
    }

    #[test]
    fn a_missing_or_empty_file_is_an_error() {
        let dir = Path::new(crate::DEFAULT_DIR);
        assert!(Region::open(dir, &name("missing")).is_err());
        let n = name("empty");
        std::fs::File::create(dir.join(&n)).unwrap();
        assert!(Region::open(dir, &n).is_err());
        std::fs::remove_file(dir.join(&n)).unwrap();
    }

    /// The start address of the mapping of process `pid` that holds file
    /// offset 0 of its executable (the ELF header), once it runs `comm`
    /// (a process just spawned may not have run its `exec` yet).
    fn header_of(pid: u32, comm: &str) -> usize {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let proc = |f: &str| format!("/proc/{pid}/{f}");
            let running = std::fs::read_to_string(proc("comm")).unwrap_or_default();
            let exe = std::fs::read_link(proc("exe")).unwrap_or_default();
            let maps = std::fs::read_to_string(proc("maps")).unwrap_or_default();
            let found = maps.lines().find_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                (running.trim() == comm
                    && f.len() >= 6
                    && f[2] == "00000000"
                    && std::path::Path::new(f[5]) == exe)
                    .then(|| f[0].split('-').next())
                    .flatten()
                    .and_then(|start| usize::from_str_radix(start, 16).ok())
            });
            if let Some(at) = found {
                return at;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "process {pid} ({running}) shows no header of {}:\n{maps}",
                exe.display()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn cross_memory_reads_another_process_and_refuses_the_rest() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut four = [0u8; 4];
        // The other process's executable starts with its ELF header.
        match read_process_memory(pid, header_of(pid, "sleep"), &mut four) {
            Ok(()) => assert_eq!(&four, b"\x7fELF"),
            // Not allowed here (Yama, a container profile): callers fall
            // back; there is nothing more to check of the copy itself.
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("cross-memory attach not permitted here: {e}")
            }
            Err(e) => panic!("reading process {pid}: {e}"),
        }
        // Unmapped memory there: an error, not a crash.
        assert!(read_process_memory(pid, 8, &mut four).is_err());
        // Nothing to read is nothing to do.
        read_process_memory(pid, 8, &mut []).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        // A process that is gone.
        assert!(read_process_memory(pid, 1 << 20, &mut four).is_err());
        // This process's own memory is refused.
        let own = [1u8; 4];
        let err =
            read_process_memory(std::process::id(), own.as_ptr() as usize, &mut four).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(read_process_memory(0, 4096, &mut four).is_err());
    }

    /// The lowest address of process `pid`'s stack mapping (its far end
    /// from where the stack grows: a `sleep` never reaches it).
    fn stack_floor_of(pid: u32) -> usize {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        maps.lines()
            .find(|line| line.ends_with("[stack]"))
            .and_then(|line| line.split('-').next())
            .and_then(|start| usize::from_str_radix(start, 16).ok())
            .unwrap_or_else(|| panic!("no stack in the maps of process {pid}:\n{maps}"))
    }

    #[test]
    fn cross_memory_writes_another_process_and_refuses_the_rest() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let header = header_of(pid, "sleep");
        let floor = stack_floor_of(pid);
        let words = *b"ferroccl";
        match write_process_memory(pid, floor, &words) {
            Ok(()) => {
                // What was written reads back, by the other way.
                let mut back = [0u8; 8];
                read_process_memory(pid, floor, &mut back).unwrap();
                assert_eq!(back, words);
                // A read-only mapping there (the executable's header): an
                // error, and the header stays.
                assert!(write_process_memory(pid, header, b"XXXX").is_err());
                let mut four = [0u8; 4];
                read_process_memory(pid, header, &mut four).unwrap();
                assert_eq!(&four, b"\x7fELF");
            }
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("cross-memory attach not permitted here: {e}")
            }
            Err(e) => panic!("writing process {pid}: {e}"),
        }
        // Unmapped memory there: an error, not a crash.
        assert!(write_process_memory(pid, 8, &words).is_err());
        // Nothing to write is nothing to do.
        write_process_memory(pid, 8, &[]).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        // A process that is gone.
        assert!(write_process_memory(pid, floor, &words).is_err());
        // This process's own memory is refused.
        let own = [1u8; 8];
        let err =
            write_process_memory(std::process::id(), own.as_ptr() as usize, &words).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        assert!(write_process_memory(0, 4096, &words).is_err());
    }
}
