//! Memory shared between processes for the host stand-in of a GPU
//! (`ferroccl_cuda::host_engine::HostEngine`): what [`SharedAlloc`] and
//! [`Mapped`] are for a real device, with an anonymous shared file
//! (`memfd_create`) in place of device memory.
//!
//! The stand-in's kernels (the executor's source built for the host)
//! read and write memory through plain addresses, so a region another
//! process maps at its own address is to them exactly what a cuda-ipc
//! mapping is to a GPU's kernels. The owner makes a [`HostShared`]; its
//! [`HostShared::fd`] travels to the peer over a Unix socket
//! ([`crate::fdpass`]), as a VMM handle's does; the peer makes a
//! [`HostMapped`] of it. Both are zeroed memory (a new file reads as
//! zeroes), and the mapping keeps the memory alive after the owner has
//! gone, as VMM does.
//!
//! [`SharedAlloc`]: crate::SharedAlloc
//! [`Mapped`]: crate::Mapped

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A shared mapping of `len` bytes of a file, unmapped on drop.
struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    fn new(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a shared region of 0 bytes",
            ));
        }
        // SAFETY: a new mapping chosen by the kernel (no address given),
        // of a descriptor that is open for the duration of the call; the
        // result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            addr: p as usize,
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made and owns; no reference into
        // it outlives the value (users hold the address only, under the
        // contract of the stand-in engine: kept alive while kernels run).
        unsafe {
            libc::munmap(self.addr as *mut c_void, self.len);
        }
    }
}

/// Zeroed memory this process owns and other processes may map.
pub struct HostShared {
    file: OwnedFd,
    map: Mapping,
}

impl std::fmt::Debug for HostShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostShared")
            .field("ptr", &format_args!("{:#x}", self.map.addr))
            .field("size", &self.map.len)
            .finish()
    }
}

impl HostShared {
    /// `size` bytes (at least one), zeroed.
    pub fn new(size: usize) -> io::Result<HostShared> {
        if size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a shared region of 0 bytes",
            ));
        }
        // SAFETY: a NUL-terminated name; the descriptor is checked, then
        // owned by the OwnedFd alone.
        let file = unsafe {
            let fd = libc::memfd_create(c"ferroccl-stand-in-fifo".as_ptr(), libc::MFD_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            OwnedFd::from_raw_fd(fd)
        };
        let len = libc::off_t::try_from(size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too large"))?;
        // SAFETY: a descriptor this value owns.
        if unsafe { libc::ftruncate(file.as_raw_fd(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping::new(file.as_fd(), size)?;
        Ok(HostShared { file, map })
    }

    /// Its address in this process.
    pub fn ptr(&self) -> u64 {
        self.map.addr as u64
    }

    /// Its size in bytes.
    pub fn size(&self) -> usize {
        self.map.len
    }

    /// The descriptor to send a peer process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Another process's [`HostShared`] mapped into this one.
pub struct HostMapped {
    map: Mapping,
}

impl std::fmt::Debug for HostMapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMapped")
            .field("ptr", &format_args!("{:#x}", self.map.addr))
            .field("size", &self.map.len)
            .finish()
    }
}

impl HostMapped {
    /// Map `size` bytes of the region whose descriptor came from its
    /// owner. Refused where the file is smaller than `size` (a wrong size
    /// from the wire must not map past the file's end: touching such a
    /// page would be a `SIGBUS`).
    pub fn import(fd: BorrowedFd<'_>, size: usize) -> io::Result<HostMapped> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
        // SAFETY: a descriptor open for the call, and room for one stat.
        if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fstat succeeded, so it filled the struct.
        let st = unsafe { st.assume_init() };
        if (st.st_mode & libc::S_IFMT) != libc::S_IFREG || (st.st_size as u64) < size as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the shared region's file holds {} bytes, not the {size} its handle says",
                    st.st_size
                ),
            ));
        }
        Ok(HostMapped {
            map: Mapping::new(fd, size)?,
        })
    }

    /// Its address in this process.
    pub fn ptr(&self) -> u64 {
        self.map.addr as u64
    }

    /// Its size in bytes.
    pub fn size(&self) -> usize {
        self.map.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn word(addr: u64) -> &'static AtomicU64 {
        let p = std::ptr::with_exposed_provenance::<AtomicU64>(addr as usize);
        // SAFETY (test): an aligned word inside a live mapping that the
        // test keeps alive while it uses the reference.
        unsafe { &*p }
    }

    #[test]
    fn a_mapping_sees_the_owners_writes_and_outlives_it() {
        let owner = HostShared::new(1 << 16).unwrap();
        assert_eq!(word(owner.ptr() + 8).load(Ordering::Relaxed), 0);
        let peer = HostMapped::import(owner.fd(), 1 << 16).unwrap();
        assert_ne!(peer.ptr(), owner.ptr());
        word(owner.ptr() + 4096).store(0xfeed, Ordering::Release);
        assert_eq!(word(peer.ptr() + 4096).load(Ordering::Acquire), 0xfeed);
        word(peer.ptr() + 65528).store(7, Ordering::Release);
        assert_eq!(word(owner.ptr() + 65528).load(Ordering::Acquire), 7);
        drop(owner);
        assert_eq!(word(peer.ptr() + 4096).load(Ordering::Acquire), 0xfeed);
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(HostShared::new(0).is_err());
        let owner = HostShared::new(4096).unwrap();
        let e = HostMapped::import(owner.fd(), 8192).unwrap_err();
        assert!(e.to_string().contains("holds 4096 bytes"), "{e}");
        assert!(HostMapped::import(owner.fd(), 0).is_err());
        // A descriptor that is not a regular file.
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(HostMapped::import(a.as_fd(), 4096).is_err());
    }
}
