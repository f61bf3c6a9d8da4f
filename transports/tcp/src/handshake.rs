//! The connection handshake: the fixed-size hello a connecting rank sends on
//! every socket, its validation by the accepting rank, and the one status
//! byte that answers it. Decoding never allocates and never trusts a length
//! from the wire: the hello has no variable part.
//!
//! Layout (little endian, [`HELLO_BYTES`] bytes):
//! `magic u32 | version u32 | token u64 | comm_id u64 | from_rank u32 |
//! to_rank u32 | index u32 | nsocks u32 | chunk_bytes u64 | steps u32 |
//! reserved u32`.

/// First four bytes of a hello ("FCHS").
pub(crate) const HELLO_MAGIC: u32 = 0x5348_4346;
/// Version of this handshake and of the framing after it.
pub(crate) const PROTOCOL_VERSION: u32 = 1;
/// Size of an encoded [`Hello`].
pub(crate) const HELLO_BYTES: usize = 56;

/// What a connecting rank says about itself and the connection it wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) token: u64,
    pub(crate) comm_id: u64,
    pub(crate) from_rank: u32,
    pub(crate) to_rank: u32,
    pub(crate) index: u32,
    pub(crate) nsocks: u32,
    pub(crate) chunk_bytes: u64,
    pub(crate) steps: u32,
}

/// The accepting rank's answer, one byte on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    BadMagic,
    BadVersion,
    WrongToken,
    WrongComm,
    WrongRank,
    RankOutOfRange,
    BadIndex,
    NsocksMismatch,
    ChunkMismatch,
    StepsMismatch,
}

impl Status {
    const ALL: [Status; 11] = [
        Status::Ok,
        Status::BadMagic,
        Status::BadVersion,
        Status::WrongToken,
        Status::WrongComm,
        Status::WrongRank,
        Status::RankOutOfRange,
        Status::BadIndex,
        Status::NsocksMismatch,
        Status::ChunkMismatch,
        Status::StepsMismatch,
    ];

    pub(crate) fn code(self) -> u8 {
        Status::ALL
            .iter()
            .position(|s| *s == self)
            .and_then(|p| u8::try_from(p).ok())
            .unwrap_or(u8::MAX)
    }

    pub(crate) fn from_code(code: u8) -> Option<Status> {
        Status::ALL.get(usize::from(code)).copied()
    }

    /// Why the peer refused, for error messages.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Status::Ok => "accepted",
            Status::BadMagic => "not a ferroccl hello (bad magic)",
            Status::BadVersion => "protocol version mismatch",
            Status::WrongToken => "wrong job token",
            Status::WrongComm => "wrong communicator id",
            Status::WrongRank => "connection meant for another rank",
            Status::RankOutOfRange => "sender rank out of range",
            Status::BadIndex => "socket index out of range",
            Status::NsocksMismatch => "different sockets per peer",
            Status::ChunkMismatch => "different chunk size",
            Status::StepsMismatch => "different number of steps",
        }
    }
}

/// What the accepting rank expects of every hello.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expected {
    pub(crate) token: u64,
    pub(crate) comm_id: u64,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) nsocks: usize,
    pub(crate) chunk_bytes: usize,
    pub(crate) steps: usize,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut out = [0u8; HELLO_BYTES];
        out[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        out[8..16].copy_from_slice(&self.token.to_le_bytes());
        out[16..24].copy_from_slice(&self.comm_id.to_le_bytes());
        out[24..28].copy_from_slice(&self.from_rank.to_le_bytes());
        out[28..32].copy_from_slice(&self.to_rank.to_le_bytes());
        out[32..36].copy_from_slice(&self.index.to_le_bytes());
        out[36..40].copy_from_slice(&self.nsocks.to_le_bytes());
        out[40..48].copy_from_slice(&self.chunk_bytes.to_le_bytes());
        out[48..52].copy_from_slice(&self.steps.to_le_bytes());
        out
    }

    /// Decode the fixed layout; only magic and version are judged here.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Hello, Status> {
        let Some(bytes) = bytes.get(..HELLO_BYTES) else {
            return Err(Status::BadMagic);
        };
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let u64_at = |at: usize| (u64::from(u32_at(at + 4)) << 32) | u64::from(u32_at(at));
        if u32_at(0) != HELLO_MAGIC {
            return Err(Status::BadMagic);
        }
        if u32_at(4) != PROTOCOL_VERSION {
            return Err(Status::BadVersion);
        }
        Ok(Hello {
            token: u64_at(8),
            comm_id: u64_at(16),
            from_rank: u32_at(24),
            to_rank: u32_at(28),
            index: u32_at(32),
            nsocks: u32_at(36),
            chunk_bytes: u64_at(40),
            steps: u32_at(48),
        })
    }

    /// Check every field against what this listener expects.
    pub(crate) fn validate(&self, expected: &Expected) -> Result<(), Status> {
        let eq = |wire: u64, want: usize| u64::try_from(want) == Ok(wire);
        if self.token != expected.token {
            return Err(Status::WrongToken);
        }
        if self.comm_id != expected.comm_id {
            return Err(Status::WrongComm);
        }
        if !eq(u64::from(self.to_rank), expected.rank) {
            return Err(Status::WrongRank);
        }
        if u64::from(self.from_rank) >= expected.size as u64 {
            return Err(Status::RankOutOfRange);
        }
        if !eq(u64::from(self.nsocks), expected.nsocks) {
            return Err(Status::NsocksMismatch);
        }
        if self.index >= self.nsocks {
            return Err(Status::BadIndex);
        }
        if !eq(self.chunk_bytes, expected.chunk_bytes) {
            return Err(Status::ChunkMismatch);
        }
        if !eq(u64::from(self.steps), expected.steps) {
            return Err(Status::StepsMismatch);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn expected() -> Expected {
        Expected {
            token: 0xfeed_beef_0123_4567,
            comm_id: 42,
            rank: 3,
            size: 4,
            nsocks: 2,
            chunk_bytes: 1 << 20,
            steps: 8,
        }
    }

    fn good() -> Hello {
        Hello {
            token: 0xfeed_beef_0123_4567,
            comm_id: 42,
            from_rank: 1,
            to_rank: 3,
            index: 1,
            nsocks: 2,
            chunk_bytes: 1 << 20,
            steps: 8,
        }
    }

    /// The acceptance rule written out independently of `validate`.
    fn reference_accepts(h: &Hello) -> bool {
        h.token == 0xfeed_beef_0123_4567
            && h.comm_id == 42
            && h.to_rank == 3
            && h.from_rank < 4
            && h.nsocks == 2
            && h.index < 2
            && h.chunk_bytes == 1 << 20
            && h.steps == 8
    }

    #[test]
    fn round_trip_and_accept() {
        let h = good();
        let decoded = Hello::decode(&h.encode()).unwrap();
        assert_eq!(decoded, h);
        assert_eq!(decoded.validate(&expected()), Ok(()));
    }

    #[test]
    fn every_field_is_checked() {
        type Mutation = fn(&mut Hello);
        let cases: [(Mutation, Status); 9] = [
            (|h| h.token ^= 1, Status::WrongToken),
            (|h| h.comm_id = 43, Status::WrongComm),
            (|h| h.to_rank = 2, Status::WrongRank),
            (|h| h.from_rank = 4, Status::RankOutOfRange),
            (|h| h.from_rank = u32::MAX, Status::RankOutOfRange),
            (|h| h.index = 2, Status::BadIndex),
            (|h| h.nsocks = 3, Status::NsocksMismatch),
            (|h| h.chunk_bytes = u64::MAX, Status::ChunkMismatch),
            (|h| h.steps = 7, Status::StepsMismatch),
        ];
        for (mutate, status) in cases {
            let mut h = good();
            mutate(&mut h);
            let decoded = Hello::decode(&h.encode()).unwrap();
            assert_eq!(decoded.validate(&expected()), Err(status), "{h:?}");
        }
    }

    #[test]
    fn bad_magic_version_and_truncation() {
        let mut bytes = good().encode();
        assert_eq!(
            Hello::decode(&bytes[..HELLO_BYTES - 1]),
            Err(Status::BadMagic)
        );
        bytes[4] = 9;
        assert_eq!(Hello::decode(&bytes), Err(Status::BadVersion));
        bytes[0] = 0;
        assert_eq!(Hello::decode(&bytes), Err(Status::BadMagic));
    }

    #[test]
    fn status_codes_round_trip() {
        for s in Status::ALL {
            assert_eq!(Status::from_code(s.code()), Some(s));
        }
        assert_eq!(Status::from_code(200), None);
        assert_eq!(Status::Ok.code(), 0);
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_and_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            match Hello::decode(&bytes) {
                Ok(h) => {
                    // Only a string that starts with the magic and version
                    // decodes at all; it must then be judged field by field.
                    prop_assert!(bytes.len() >= HELLO_BYTES);
                    prop_assert_eq!(&bytes[0..4], &HELLO_MAGIC.to_le_bytes());
                    prop_assert_eq!(h.validate(&expected()).is_ok(), reference_accepts(&h));
                }
                Err(s) => prop_assert_ne!(s, Status::Ok),
            }
        }

        #[test]
        fn random_bytes_after_magic_are_refused(tail in proptest::collection::vec(any::<u8>(), 0..80)) {
            let mut bytes = HELLO_MAGIC.to_le_bytes().to_vec();
            bytes.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
            bytes.extend_from_slice(&tail);
            match Hello::decode(&bytes) {
                Ok(h) => {
                    prop_assert_eq!(h.validate(&expected()).is_ok(), reference_accepts(&h));
                }
                Err(s) => prop_assert!(bytes.len() < HELLO_BYTES && s == Status::BadMagic),
            }
        }
    }
}
