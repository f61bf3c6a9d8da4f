//! Connection set-up through files under /dev/shm, with no thread and no
//! socket: the connecting rank creates one segment per direction, named
//! from the acceptor's published nonce and the two ranks; the accepting
//! rank polls for them, checks who made them and for what, maps them and
//! unlinks them at once. From then on no name is left to leak.
//!
//! Published address (24 bytes, little endian):
//! `"FCSM" | version u32 | nonce u64 | pid u32 | rank u32`.
//! Segment name: `ferroccl-<nonce as 16 hex digits>-<from>-<to>`.

use crate::connection::{self, refusal_reason, Parts, PendingUnlink};
use crate::ring::{FoundIdentity, Geometry, Identity, Segment, LAYOUT_VERSION};
use crate::{os, SEGMENT_PREFIX};
use ferroccl_transport::{
    elapsed_ms, AbortSignal, Connection, ListenConfig, Listener, TransportError,
};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ADDRESS_MAGIC: &[u8; 4] = b"FCSM";
const ADDRESS_VERSION: u32 = 1;
const ADDRESS_BYTES: usize = 24;

/// How long an acceptor sleeps between looks for its peer's segments.
const ACCEPT_POLL: Duration = Duration::from_micros(500);

/// A listener of the shared-memory transport. It holds nothing in the
/// file system: connecting peers create the segments, this side maps and
/// unlinks them.
#[derive(Debug)]
pub struct ShmListener {
    dir: PathBuf,
    config: ListenConfig,
    geometry: Geometry,
    nonce: u64,
    pid: u32,
    abort: AbortSignal,
}

/// The fields of a published address.
pub(crate) struct Address {
    nonce: u64,
    pid: u32,
    rank: u32,
}

pub(crate) fn parse_address(bytes: &[u8]) -> Result<Address, String> {
    if bytes.len() != ADDRESS_BYTES {
        return Err(format!(
            "shm address of {} bytes, expected {ADDRESS_BYTES}",
            bytes.len()
        ));
    }
    if &bytes[0..4] != ADDRESS_MAGIC {
        return Err("not a shm address (bad magic)".into());
    }
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let version = u32_at(4);
    if version != ADDRESS_VERSION {
        return Err(format!(
            "shm address version {version}, expected {ADDRESS_VERSION}"
        ));
    }
    Ok(Address {
        nonce: u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes")),
        pid: u32_at(16),
        rank: u32_at(20),
    })
}

/// Why `found` (in a file of `file_len` bytes) is not the segment `want`
/// describes, as a refusal code (see `refusal_reason`); None: it is.
pub(crate) fn refusal(found: &FoundIdentity, file_len: u64, want: &Identity) -> Option<u32> {
    let f = &found.id;
    if !found.magic_ok || found.version != LAYOUT_VERSION {
        Some(6)
    } else if f.token != want.token {
        Some(1)
    } else if f.comm_id != want.comm_id {
        Some(2)
    } else if (f.from, f.to) != (want.from, want.to) {
        Some(3)
    } else if f.chunk_bytes != want.chunk_bytes {
        Some(4)
    } else if f.steps != want.steps {
        Some(5)
    } else if f.total_len != want.total_len || file_len != want.total_len {
        Some(7)
    } else {
        None
    }
}

/// A random 64-bit number from the kernel, or failing that from the
/// clock, the pid and std's per-process hash keys.
fn random_nonce() -> u64 {
    use std::io::Read;
    let mut buf = [0u8; 8];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .is_ok()
    {
        return u64::from_le_bytes(buf);
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// The peer's pid as liveness needs it: None for this very process.
fn other_process(pid: u32) -> Option<u32> {
    (pid != 0 && pid != std::process::id()).then_some(pid)
}

impl ShmListener {
    pub(crate) fn new(
        dir: PathBuf,
        config: &ListenConfig,
        abort: &AbortSignal,
    ) -> Result<Self, TransportError> {
        let bad = |what: String| TransportError::Io(format!("shm listener: {what}"));
        if config.chunk_bytes == 0 || u32::try_from(config.chunk_bytes).is_err() {
            return Err(bad(format!(
                "chunk of {} bytes (1 to {} allowed)",
                config.chunk_bytes,
                u32::MAX
            )));
        }
        if config.steps == 0 || config.steps > crate::MAX_STEPS {
            return Err(bad(format!(
                "{} steps (1 to {} allowed)",
                config.steps,
                crate::MAX_STEPS
            )));
        }
        if config.rank >= config.size || u32::try_from(config.size).is_err() {
            return Err(bad(format!(
                "rank {} of a communicator of {}",
                config.rank, config.size
            )));
        }
        let geometry = Geometry {
            chunk_bytes: config.chunk_bytes,
            steps: config.steps,
        };
        if geometry.total_len().is_none() {
            return Err(bad("segment size overflows".into()));
        }
        if !os::dir_writable(&dir) {
            return Err(bad(format!("{} is not writable", dir.display())));
        }
        Ok(ShmListener {
            dir,
            config: config.clone(),
            geometry,
            nonce: random_nonce(),
            pid: std::process::id(),
            abort: abort.clone(),
        })
    }

    /// The prefix of the names of every segment made for connections to
    /// this listener (in its directory): `ferroccl-<nonce>-`.
    pub fn segment_prefix(&self) -> String {
        format!("{SEGMENT_PREFIX}{:016x}-", self.nonce)
    }

    fn path(&self, nonce: u64, from: usize, to: usize) -> PathBuf {
        self.dir
            .join(format!("{SEGMENT_PREFIX}{nonce:016x}-{from}-{to}"))
    }

    fn identity(&self, from: usize, to: usize) -> Identity {
        Identity {
            token: self.config.token,
            comm_id: self.config.comm_id,
            from: from as u32,
            to: to as u32,
            chunk_bytes: self.config.chunk_bytes as u64,
            steps: self.config.steps as u32,
            total_len: self.geometry.total_len().expect("checked in new") as u64,
        }
    }

    /// Create, size, map and label one segment.
    fn create(&self, path: &Path, id: &Identity) -> std::io::Result<(Segment, (u64, u64))> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        let meta = file.metadata()?;
        let made = (meta.dev(), meta.ino());
        let result = (|| {
            file.set_len(id.total_len)?;
            os::reserve(&file, id.total_len)?;
            let seg = Segment::map_full(&file, self.geometry)?;
            seg.write_identity(id, self.pid);
            Ok(seg)
        })();
        match result {
            Ok(seg) => Ok((seg, made)),
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// Look for a segment: None while it does not exist or is not ready.
    fn find(&self, path: &Path) -> std::io::Result<Option<(File, Segment, FoundIdentity)>> {
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() < Segment::CONTROL_BYTES {
            return Ok(None);
        }
        let control = Segment::map_control(&file)?;
        Ok(control.read_identity().map(|found| (file, control, found)))
    }

    /// Why `found` (in a file of `file_len` bytes) is not the segment we
    /// expect from `want`, as a refusal code.
    fn mismatch(&self, found: &FoundIdentity, file_len: u64, want: &Identity) -> Option<u32> {
        refusal(found, file_len, want)
    }
}

/// Segments named for this listener (its nonce) that nobody mapped: a peer
/// that created them and died, or gave up, before this side attached.
/// Nobody else will map them once the listener is gone, so it removes them;
/// that keeps a killed peer from leaving files behind whenever a survivor
/// drops its communicator.
impl Drop for ShmListener {
    fn drop(&mut self) {
        let prefix = self.segment_prefix();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

impl Listener for ShmListener {
    fn address(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(ADDRESS_BYTES);
        v.extend_from_slice(ADDRESS_MAGIC);
        v.extend_from_slice(&ADDRESS_VERSION.to_le_bytes());
        v.extend_from_slice(&self.nonce.to_le_bytes());
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&(self.config.rank as u32).to_le_bytes());
        v
    }

    fn connect(
        &self,
        peer: usize,
        address: &[u8],
        deadline: Instant,
    ) -> Result<Connection, TransportError> {
        let connect_err = |detail: String| TransportError::Connect { peer, detail };
        let addr = parse_address(address).map_err(connect_err)?;
        if addr.rank as usize != peer {
            return Err(connect_err(format!(
                "the address is rank {}'s, not rank {peer}'s",
                addr.rank
            )));
        }
        if peer >= self.config.size || peer == self.config.rank {
            return Err(connect_err(format!(
                "no rank {peer} to connect to from rank {} of {}",
                self.config.rank, self.config.size
            )));
        }
        if self.abort.is_fired() {
            return Err(TransportError::Aborted);
        }
        let me = self.config.rank;
        let out_path = self.path(addr.nonce, me, peer);
        let in_path = self.path(addr.nonce, peer, me);
        let (out, out_id) = self
            .create(&out_path, &self.identity(me, peer))
            .map_err(|e| connect_err(format!("creating {}: {e}", out_path.display())))?;
        let (inn, in_id) = match self.create(&in_path, &self.identity(peer, me)) {
            Ok(made) => made,
            Err(e) => {
                let _ = std::fs::remove_file(&out_path);
                return Err(connect_err(format!("creating {}: {e}", in_path.display())));
            }
        };
        tracing::debug!(
            rank = me,
            peer,
            "created shared segments {} and {}",
            out_path.display(),
            in_path.display()
        );
        Ok(connection::establish(Parts {
            ranks: self.config.size,
            peer,
            chunk_bytes: self.config.chunk_bytes,
            out: Arc::new(out),
            inn: Arc::new(inn),
            peer_pid: other_process(addr.pid),
            pending: Some(PendingUnlink {
                paths: vec![out_path, in_path],
                ids: vec![out_id, in_id],
                deadline,
            }),
            abort: self.abort.clone(),
        }))
    }

    fn accept(&self, peer: usize, deadline: Instant) -> Result<Connection, TransportError> {
        let start = Instant::now();
        let me = self.config.rank;
        if peer >= self.config.size || peer == me {
            return Err(TransportError::Connect {
                peer,
                detail: format!(
                    "no rank {peer} to accept from at rank {me} of {}",
                    self.config.size
                ),
            });
        }
        // Named from the connector's side: it sends on `from = peer`.
        let in_path = self.path(self.nonce, peer, me);
        let out_path = self.path(self.nonce, me, peer);
        let io_err = |path: &Path, e: std::io::Error| {
            TransportError::Io(format!("opening {}: {e}", path.display()))
        };
        loop {
            if self.abort.is_fired() {
                return Err(TransportError::Aborted);
            }
            let found_in = self.find(&in_path).map_err(|e| io_err(&in_path, e))?;
            let found_out = match found_in {
                Some(_) => self.find(&out_path).map_err(|e| io_err(&out_path, e))?,
                None => None,
            };
            if let (Some(fin), Some(fout)) = (found_in, found_out) {
                if let Some(conn) = self.attach(peer, (&in_path, fin), (&out_path, fout))? {
                    return Ok(conn);
                }
            }
            if Instant::now() >= deadline {
                return Err(TransportError::Timeout {
                    peer,
                    what: "a connection",
                    waited_ms: elapsed_ms(start),
                });
            }
            std::thread::sleep(ACCEPT_POLL);
        }
    }
}

type Found = (File, Segment, FoundIdentity);

impl ShmListener {
    /// Check both segments, then map them whole, unlink them and tell the
    /// creator. A mismatch is refused (logged, flagged to the creator,
    /// unlinked) and the acceptor goes on waiting: `Ok(None)`.
    fn attach(
        &self,
        peer: usize,
        (in_path, (in_file, in_ctl, in_found)): (&Path, Found),
        (out_path, (out_file, out_ctl, out_found)): (&Path, Found),
    ) -> Result<Option<Connection>, TransportError> {
        let me = self.config.rank;
        let io_err = |path: &Path, e: std::io::Error| {
            TransportError::Io(format!("mapping {}: {e}", path.display()))
        };
        let len =
            |f: &File, path: &Path| f.metadata().map(|m| m.len()).map_err(|e| io_err(path, e));
        let refusal = self
            .mismatch(&in_found, len(&in_file, in_path)?, &self.identity(peer, me))
            .or(self.mismatch(
                &out_found,
                len(&out_file, out_path)?,
                &self.identity(me, peer),
            ));
        if let Some(code) = refusal {
            tracing::warn!(
                rank = me,
                peer,
                "refusing the shared segments of rank {peer}: {} (found: token {}, comm {:#x}, ranks {}->{}, chunk {}, steps {}; expected comm {:#x}, chunk {}, steps {})",
                refusal_reason(code),
                if in_found.id.token == self.config.token { "ours" } else { "another" },
                in_found.id.comm_id,
                in_found.id.from,
                in_found.id.to,
                in_found.id.chunk_bytes,
                in_found.id.steps,
                self.config.comm_id,
                self.config.chunk_bytes,
                self.config.steps,
            );
            for (ctl, path) in [(&in_ctl, in_path), (&out_ctl, out_path)] {
                ctl.mark_refused(code);
                let _ = std::fs::remove_file(path);
            }
            return Ok(None);
        }
        let inn = Segment::map_full(&in_file, self.geometry).map_err(|e| io_err(in_path, e))?;
        let out = Segment::map_full(&out_file, self.geometry).map_err(|e| io_err(out_path, e))?;
        for path in [in_path, out_path] {
            let _ = std::fs::remove_file(path);
        }
        for seg in [&inn, &out] {
            seg.mark_attached(self.pid);
        }
        tracing::debug!(rank = me, peer, "mapped and unlinked the shared segments");
        Ok(Some(connection::establish(Parts {
            ranks: self.config.size,
            peer,
            chunk_bytes: self.config.chunk_bytes,
            out: Arc::new(out),
            inn: Arc::new(inn),
            peer_pid: other_process(in_found.creator_pid),
            pending: None,
            abort: self.abort.clone(),
        })))
    }
}
