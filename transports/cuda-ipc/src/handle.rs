//! [`ShareHandle`]: what the owner of a shared allocation sends the
//! process that maps it, and its wire form.
//!
//! The wire form is fixed-length ([`WIRE_LEN`] bytes), little-endian and
//! versioned, so that a receiver reads exactly one handle off a stream
//! socket (`fdpass::recv_exact_fds`) before looking at it:
//!
//! ```text
//! offset  bytes  field
//!      0      4  magic, the bytes "FCIH" (ferroccl CUDA IPC handle)
//!      4      2  version, u16 = 1
//!      6      1  kind: 1 = Fd (VMM, the POSIX fd travels beside the bytes
//!                by SCM_RIGHTS), 2 = Legacy (cuIpcGetMemHandle)
//!      7      1  reserved, 0
//!      8      8  size, u64: bytes the mapping covers; non-zero, a multiple
//!                of the granularity, at most MAX_SIZE
//!     16      8  granularity, u64: a power of two; Fd: the allocation's
//!                (cuMemGetAllocationGranularity), the alignment of the
//!                importer's reservation; Legacy: LEGACY_GRANULARITY
//!     24     64  Legacy: the CUipcMemHandle's bytes; Fd: zeros
//! ```
//!
//! [`ShareHandle::decode`] checks every field and never panics: bytes
//! that are not exactly a handle this version wrote are refused with what
//! is wrong ([`WireError`]). A later version changes `version`; a decoder
//! refuses versions it does not know rather than guess.

use std::fmt;

/// Bytes of a handle on the wire.
pub const WIRE_LEN: usize = 88;
/// The first four bytes of every handle.
pub const MAGIC: [u8; 4] = *b"FCIH";
/// The version this build writes and the only one it reads.
pub const WIRE_VERSION: u16 = 1;
/// The largest size a handle may describe (1 TiB): a bound on a length
/// read from the wire, above any device's memory.
pub const MAX_SIZE: u64 = 1 << 40;
/// The granularity to which legacy (`cuMemAlloc`) allocations are rounded:
/// 2 MiB, the page size with which the driver backs IPC-able memory.
pub const LEGACY_GRANULARITY: u64 = 2 << 20;

const KIND_FD: u8 = 1;
const KIND_LEGACY: u8 = 2;

/// How the peer maps an allocation.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShareHandle {
    /// A VMM allocation (`cuMemCreate`): the peer imports the POSIX fd
    /// that travels beside these bytes (`cuMemImportFromShareableHandle`)
    /// and maps `size` bytes of it at an address aligned to
    /// `granularity`.
    Fd {
        /// Bytes of the allocation (a multiple of `granularity`).
        size: u64,
        /// The allocation granularity (a power of two).
        granularity: u64,
    },
    /// A legacy allocation (`cuMemAlloc`): the peer opens the 64-byte
    /// `CUipcMemHandle` (`cuIpcOpenMemHandle`), `size` bytes.
    Legacy {
        /// The bytes of the `CUipcMemHandle`.
        handle: [u8; 64],
        /// Bytes of the allocation (a multiple of
        /// [`LEGACY_GRANULARITY`]).
        size: u64,
    },
}

impl fmt::Debug for ShareHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShareHandle::Fd { size, granularity } => f
                .debug_struct("Fd")
                .field("size", size)
                .field("granularity", granularity)
                .finish(),
            ShareHandle::Legacy { handle, size } => {
                let head: String = handle[..8].iter().map(|b| format!("{b:02x}")).collect();
                f.debug_struct("Legacy")
                    .field("handle", &format_args!("{head}.."))
                    .field("size", size)
                    .finish()
            }
        }
    }
}

/// Why bytes are not a handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not [`WIRE_LEN`] bytes.
    #[error("a CUDA IPC handle is {WIRE_LEN} bytes, got {0}")]
    Length(usize),
    /// The magic is not "FCIH".
    #[error("not a CUDA IPC handle: the magic is {0:02x?}, not \"FCIH\"")]
    Magic([u8; 4]),
    /// A version this build does not read.
    #[error("CUDA IPC handle version {got}; this build reads version {WIRE_VERSION} only")]
    Version {
        /// The version on the wire.
        got: u16,
    },
    /// A field holds a value no handle has.
    #[error("bad CUDA IPC handle: {0}")]
    Field(String),
}

impl From<WireError> for ferroccl_cuda::CudaError {
    fn from(e: WireError) -> Self {
        ferroccl_cuda::CudaError::InvalidArgument(e.to_string())
    }
}

impl ShareHandle {
    /// Bytes the mapping covers.
    pub fn size(&self) -> u64 {
        match *self {
            ShareHandle::Fd { size, .. } | ShareHandle::Legacy { size, .. } => size,
        }
    }

    /// The granularity the size is a multiple of.
    pub fn granularity(&self) -> u64 {
        match *self {
            ShareHandle::Fd { granularity, .. } => granularity,
            ShareHandle::Legacy { .. } => LEGACY_GRANULARITY,
        }
    }

    /// Whether a file descriptor travels with the bytes.
    pub fn carries_fd(&self) -> bool {
        matches!(self, ShareHandle::Fd { .. })
    }

    /// Whether the fields are ones a handle can have (what
    /// [`ShareHandle::decode`] checks beyond the framing).
    pub fn validate(&self) -> Result<(), WireError> {
        let (size, granularity) = (self.size(), self.granularity());
        if granularity == 0 || !granularity.is_power_of_two() {
            return Err(WireError::Field(format!(
                "the granularity {granularity} is not a power of two"
            )));
        }
        if size == 0 {
            return Err(WireError::Field("the size is 0".into()));
        }
        if size > MAX_SIZE {
            return Err(WireError::Field(format!(
                "the size {size} is above the {MAX_SIZE} a handle may describe"
            )));
        }
        if !size.is_multiple_of(granularity) {
            return Err(WireError::Field(format!(
                "the size {size} is not a multiple of the granularity {granularity}"
            )));
        }
        Ok(())
    }

    /// The wire form (see the module's table).
    pub fn encode(&self) -> [u8; WIRE_LEN] {
        let mut out = [0u8; WIRE_LEN];
        out[0..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&WIRE_VERSION.to_le_bytes());
        out[6] = match self {
            ShareHandle::Fd { .. } => KIND_FD,
            ShareHandle::Legacy { .. } => KIND_LEGACY,
        };
        out[8..16].copy_from_slice(&self.size().to_le_bytes());
        out[16..24].copy_from_slice(&self.granularity().to_le_bytes());
        if let ShareHandle::Legacy { handle, .. } = self {
            out[24..88].copy_from_slice(handle);
        }
        out
    }

    /// The handle `bytes` encode, or what is wrong with them. Accepts
    /// exactly what [`ShareHandle::encode`] writes for a handle that
    /// passes [`ShareHandle::validate`]; never panics.
    pub fn decode(bytes: &[u8]) -> Result<ShareHandle, WireError> {
        let bytes: &[u8; WIRE_LEN] = bytes
            .try_into()
            .map_err(|_| WireError::Length(bytes.len()))?;
        let magic: [u8; 4] = [bytes[0], bytes[1], bytes[2], bytes[3]];
        if magic != MAGIC {
            return Err(WireError::Magic(magic));
        }
        let version = u16::from_le_bytes([bytes[4], bytes[5]]);
        if version != WIRE_VERSION {
            return Err(WireError::Version { got: version });
        }
        if bytes[7] != 0 {
            return Err(WireError::Field(format!(
                "the reserved byte is {:#04x}, not 0",
                bytes[7]
            )));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let size = u64_at(8);
        let granularity = u64_at(16);
        let tail = &bytes[24..88];
        let handle = match bytes[6] {
            KIND_FD => {
                if let Some(i) = tail.iter().position(|&b| b != 0) {
                    return Err(WireError::Field(format!(
                        "an Fd handle has byte {:#04x} at offset {} where zeros belong",
                        tail[i],
                        24 + i
                    )));
                }
                ShareHandle::Fd { size, granularity }
            }
            KIND_LEGACY => {
                if granularity != LEGACY_GRANULARITY {
                    return Err(WireError::Field(format!(
                        "a Legacy handle has granularity {granularity}, not \
                         {LEGACY_GRANULARITY}"
                    )));
                }
                let mut handle = [0u8; 64];
                handle.copy_from_slice(tail);
                ShareHandle::Legacy { handle, size }
            }
            other => {
                return Err(WireError::Field(format!(
                    "unknown kind {other} (1 = Fd, 2 = Legacy)"
                )))
            }
        };
        handle.validate()?;
        Ok(handle)
    }
}

/// `size` rounded up to a multiple of `granularity` (a power of two).
/// Errors (before any driver call): a size of 0, a granularity that is
/// not a power of two, a result above [`MAX_SIZE`] or past `usize`.
pub fn round_up(size: usize, granularity: usize) -> ferroccl_cuda::Result<usize> {
    use ferroccl_cuda::CudaError::InvalidArgument;
    if size == 0 {
        return Err(InvalidArgument("a shared allocation of 0 bytes".into()));
    }
    if !granularity.is_power_of_two() {
        return Err(InvalidArgument(format!(
            "the granularity {granularity} is not a power of two"
        )));
    }
    let rounded = size
        .checked_next_multiple_of(granularity)
        .filter(|&r| r as u64 <= MAX_SIZE)
        .ok_or_else(|| {
            InvalidArgument(format!(
                "{size} bytes rounded up to the granularity {granularity} is above the \
                 {MAX_SIZE} bytes a shared allocation may have"
            ))
        })?;
    Ok(rounded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_handle() -> impl Strategy<Value = ShareHandle> {
        let fd = (12u32..=30, 1u64..=1 << 16).prop_filter_map("fits", |(shift, pages)| {
            let granularity = 1u64 << shift;
            let size = pages.checked_mul(granularity)?;
            (size <= MAX_SIZE).then_some(ShareHandle::Fd { size, granularity })
        });
        let legacy =
            (any::<[u8; 32]>(), any::<[u8; 32]>(), 1u64..=1 << 19).prop_map(|(a, b, pages)| {
                let mut handle = [0u8; 64];
                handle[..32].copy_from_slice(&a);
                handle[32..].copy_from_slice(&b);
                ShareHandle::Legacy {
                    handle,
                    size: pages * LEGACY_GRANULARITY,
                }
            });
        prop_oneof![fd, legacy]
    }

    proptest! {
        #[test]
        fn handles_cross_the_wire_unchanged(h in any_handle()) {
            let bytes = h.encode();
            prop_assert_eq!(ShareHandle::decode(&bytes), Ok(h));
        }

        /// Whatever arrives, decoding returns (never panics), and what it
        /// accepts is exactly what encoding that handle writes.
        #[test]
        fn random_bytes_never_panic_and_accepted_ones_are_canonical(
            bytes in proptest::collection::vec(any::<u8>(), 0..120),
            keep_header in any::<bool>(),
        ) {
            let mut bytes = bytes;
            if keep_header && bytes.len() >= 8 {
                bytes[..4].copy_from_slice(&MAGIC);
                bytes[4..6].copy_from_slice(&WIRE_VERSION.to_le_bytes());
                bytes[6] = 1 + bytes[6] % 2;
                bytes[7] = 0;
            }
            if let Ok(h) = ShareHandle::decode(&bytes) {
                prop_assert_eq!(&h.encode()[..], &bytes[..]);
            }
        }

        /// Flipping any bit of a valid handle's framing (magic, version,
        /// kind, reserved) or cutting it is always refused.
        #[test]
        fn damaged_framing_is_refused(h in any_handle(), bit in 0usize..64, cut in 0usize..WIRE_LEN) {
            let mut bytes = h.encode();
            bytes[bit / 8] ^= 1 << (bit % 8);
            // Fd (1) and Legacy (2) differ in two bits: one flip of the
            // kind byte always gives an unknown kind.
            prop_assert!(ShareHandle::decode(&bytes).is_err(), "{:?}", bytes);
            prop_assert!(ShareHandle::decode(&h.encode()[..cut]).is_err());
        }
    }

    #[test]
    fn the_wire_layout_is_the_documented_one() {
        let h = ShareHandle::Fd {
            size: 3 << 21,
            granularity: 1 << 21,
        };
        let b = h.encode();
        assert_eq!(&b[0..4], b"FCIH");
        assert_eq!(&b[4..6], &[1, 0]);
        assert_eq!(b[6], 1);
        assert_eq!(b[7], 0);
        assert_eq!(&b[8..16], &(3u64 << 21).to_le_bytes());
        assert_eq!(&b[16..24], &(1u64 << 21).to_le_bytes());
        assert!(b[24..].iter().all(|&x| x == 0));

        let mut handle = [0u8; 64];
        for (i, x) in handle.iter_mut().enumerate() {
            *x = i as u8 + 1;
        }
        let l = ShareHandle::Legacy {
            handle,
            size: 2 * LEGACY_GRANULARITY,
        };
        let b = l.encode();
        assert_eq!(b[6], 2);
        assert_eq!(&b[8..16], &(4u64 << 20).to_le_bytes());
        assert_eq!(&b[16..24], &LEGACY_GRANULARITY.to_le_bytes());
        assert_eq!(&b[24..], &handle[..]);
        assert!(format!("{l:?}").contains("0102030405060708"), "{l:?}");
    }

    #[test]
    fn damaged_handles_are_refused_with_the_reason() {
        // A granularity other than the legacy one, so that the kind
        // switched to Legacy is refused.
        let good = ShareHandle::Fd {
            size: 4 << 16,
            granularity: 1 << 16,
        }
        .encode();
        let with = |f: &dyn Fn(&mut [u8; WIRE_LEN])| {
            let mut b = good;
            f(&mut b);
            ShareHandle::decode(&b)
        };
        assert_eq!(ShareHandle::decode(&good[..87]), Err(WireError::Length(87)));
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(ShareHandle::decode(&long), Err(WireError::Length(89)));
        assert_eq!(ShareHandle::decode(&[]), Err(WireError::Length(0)));
        assert_eq!(with(&|b| b[0] = b'X'), Err(WireError::Magic(*b"XCIH")));
        assert_eq!(
            with(&|b| b[4..6].copy_from_slice(&2u16.to_le_bytes())),
            Err(WireError::Version { got: 2 })
        );
        assert_eq!(
            with(&|b| b[4..6].copy_from_slice(&0u16.to_le_bytes())),
            Err(WireError::Version { got: 0 })
        );
        let field = |r: Result<ShareHandle, WireError>, words: &str| match r {
            Err(WireError::Field(why)) => assert!(why.contains(words), "{why}"),
            other => panic!("expected a field error about {words}, got {other:?}"),
        };
        field(with(&|b| b[6] = 0), "unknown kind 0");
        field(with(&|b| b[6] = 3), "unknown kind 3");
        field(with(&|b| b[7] = 1), "reserved");
        field(with(&|b| b[8..16].fill(0)), "size is 0");
        field(
            with(&|b| b[8..16].copy_from_slice(&((4u64 << 16) + 1).to_le_bytes())),
            "not a multiple",
        );
        field(
            with(&|b| b[8..16].copy_from_slice(&(MAX_SIZE * 2).to_le_bytes())),
            "above",
        );
        field(
            with(&|b| b[16..24].copy_from_slice(&3u64.to_le_bytes())),
            "power of two",
        );
        field(with(&|b| b[16..24].fill(0)), "power of two");
        field(with(&|b| b[50] = 7), "offset 50");
        // A legacy handle must say the legacy granularity.
        field(
            with(&|b| {
                b[6] = 2;
            }),
            "granularity",
        );
        // Errors become CudaError::InvalidArgument with the words.
        let e: ferroccl_cuda::CudaError = WireError::Version { got: 9 }.into();
        assert!(
            matches!(&e, ferroccl_cuda::CudaError::InvalidArgument(w) if w.contains("version 9")),
            "{e}"
        );
    }

    #[test]
    fn sizes_round_up_to_the_granularity() {
        assert_eq!(round_up(1, 1 << 21), Ok(1 << 21));
        assert_eq!(round_up(1 << 21, 1 << 21), Ok(1 << 21));
        assert_eq!(round_up((1 << 21) + 1, 1 << 21), Ok(2 << 21));
        assert_eq!(round_up(4096, 4096), Ok(4096));
        assert_eq!(round_up(5, 1), Ok(5));
        assert!(round_up(0, 1 << 21).is_err());
        assert!(round_up(10, 0).is_err());
        assert!(round_up(10, 3 << 20).is_err());
        assert!(round_up(usize::MAX, 1 << 21).is_err());
        assert!(round_up(MAX_SIZE as usize + 1, 1 << 21).is_err());
        assert_eq!(round_up(MAX_SIZE as usize, 1 << 21), Ok(MAX_SIZE as usize));
    }
}
