//! The fixed header every slot carries on the wire, and its decoding.
//!
//! Layout (little endian, 40 bytes):
//! `magic u32 | kind u8 | coll u8 | dtype u8 | op u8 | seq u64 | count u64 |
//! root u32 | step u32 | len u32 | aux u32`.
//! Decoding checks the magic, the kind and that `len` fits a slot before any
//! payload byte is read or any memory is reserved for it.

/// First four bytes of every frame ("FCCL").
pub const MAGIC: u32 = 0x4c43_4346;
/// Size of an encoded [`FrameHeader`].
pub const HEADER_BYTES: usize = 40;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// Payload of a collective step.
    Data,
    /// The sender tells us that rank `aux` failed; the payload is the reason
    /// (UTF-8, lossy).
    Failure,
    /// The sender is shutting down cleanly; no more frames follow.
    Goodbye,
}

impl FrameKind {
    fn code(self) -> u8 {
        match self {
            FrameKind::Data => 1,
            FrameKind::Failure => 2,
            FrameKind::Goodbye => 3,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(FrameKind::Data),
            2 => Some(FrameKind::Failure),
            3 => Some(FrameKind::Goodbye),
            _ => None,
        }
    }
}

/// What a collective call looked like on the rank that sent a frame, so that
/// the receiver can tell two ranks that called different things apart from a
/// slow peer. The codes are defined by the layer above.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fingerprint {
    /// Sequence number of the collective on its communicator.
    pub seq: u64,
    /// Collective kind code.
    pub coll: u8,
    /// Element type code.
    pub dtype: u8,
    /// Reduction op code (0 where there is none).
    pub op: u8,
    /// Element count as the caller gave it.
    pub count: u64,
    /// Root rank, or peer for point-to-point (u32::MAX where there is none).
    pub root: u32,
}

/// Header of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the frame is.
    pub kind: FrameKind,
    /// The call it belongs to.
    pub fingerprint: Fingerprint,
    /// Step of the schedule within the call.
    pub step: u32,
    /// Payload bytes that follow the header.
    pub len: u32,
    /// Kind-specific: the failed rank for [`FrameKind::Failure`].
    pub aux: u32,
}

impl FrameHeader {
    /// A data frame header; `len` is filled in by the sender.
    pub fn data(fingerprint: Fingerprint, step: u32) -> Self {
        FrameHeader {
            kind: FrameKind::Data,
            fingerprint,
            step,
            len: 0,
            aux: 0,
        }
    }

    /// Encode to the wire layout.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4] = self.kind.code();
        out[5] = self.fingerprint.coll;
        out[6] = self.fingerprint.dtype;
        out[7] = self.fingerprint.op;
        out[8..16].copy_from_slice(&self.fingerprint.seq.to_le_bytes());
        out[16..24].copy_from_slice(&self.fingerprint.count.to_le_bytes());
        out[24..28].copy_from_slice(&self.fingerprint.root.to_le_bytes());
        out[28..32].copy_from_slice(&self.step.to_le_bytes());
        out[32..36].copy_from_slice(&self.len.to_le_bytes());
        out[36..40].copy_from_slice(&self.aux.to_le_bytes());
        out
    }

    /// Decode and validate a header; `max_len` bounds the payload length
    /// (the slot size), so a hostile length is refused before it is used.
    pub fn decode(bytes: &[u8], max_len: usize) -> Result<Self, String> {
        if bytes.len() < HEADER_BYTES {
            return Err(format!(
                "truncated header: {} of {HEADER_BYTES} bytes",
                bytes.len()
            ));
        }
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| (u64::from(u32_at(at + 4)) << 32) | u64::from(u32_at(at));
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(format!("bad magic {magic:#010x} (expected {MAGIC:#010x})"));
        }
        let kind = FrameKind::from_code(bytes[4])
            .ok_or_else(|| format!("unknown frame kind {}", bytes[4]))?;
        let len = u32_at(32);
        if len as usize > max_len {
            return Err(format!(
                "frame claims {len} payload bytes, more than the {max_len}-byte slot"
            ));
        }
        Ok(FrameHeader {
            kind,
            fingerprint: Fingerprint {
                seq: u64_at(8),
                coll: bytes[5],
                dtype: bytes[6],
                op: bytes[7],
                count: u64_at(16),
                root: u32_at(24),
            },
            step: u32_at(28),
            len,
            aux: u32_at(36),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FrameHeader {
        FrameHeader {
            kind: FrameKind::Data,
            fingerprint: Fingerprint {
                seq: 0x0102_0304_0506_0708,
                coll: 3,
                dtype: 7,
                op: 2,
                count: 1_000_003,
                root: 5,
            },
            step: 11,
            len: 4096,
            aux: 9,
        }
    }

    #[test]
    fn header_round_trips() {
        let h = sample();
        assert_eq!(FrameHeader::decode(&h.encode(), 4096), Ok(h));
    }

    #[test]
    fn oversized_length_is_refused() {
        let h = sample();
        let err = FrameHeader::decode(&h.encode(), 4095).unwrap_err();
        assert!(err.contains("4096"), "{err}");
    }

    proptest::proptest! {
        /// Any bytes: refused, or a header within the slot bound that
        /// encodes back to the same 40 bytes.
        #[test]
        fn random_headers_decode_within_bounds_or_not_at_all(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            max_len in 0usize..(1 << 20),
            magic in proptest::prelude::any::<bool>(),
        ) {
            let mut bytes = bytes;
            if magic && bytes.len() >= 4 {
                bytes[..4].copy_from_slice(&MAGIC.to_le_bytes());
            }
            match FrameHeader::decode(&bytes, max_len) {
                Ok(h) => {
                    proptest::prop_assert!(h.len as usize <= max_len);
                    proptest::prop_assert_eq!(&h.encode()[..], &bytes[..HEADER_BYTES]);
                }
                Err(e) => proptest::prop_assert!(!e.is_empty()),
            }
        }
    }

    #[test]
    fn garbage_is_refused_without_panic() {
        assert!(FrameHeader::decode(&[], 10).is_err());
        assert!(FrameHeader::decode(&[0xff; HEADER_BYTES], 10).is_err());
        let mut bad_kind = sample().encode();
        bad_kind[4] = 200;
        assert!(FrameHeader::decode(&bad_kind, 1 << 20).is_err());
    }
}
