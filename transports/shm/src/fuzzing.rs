//! Entry points for the fuzz targets (fuzz/) and property tests: each runs
//! one decoder of this crate on arbitrary bytes, as a hostile or broken
//! peer could present them. Hidden from the docs; not an API.
//!
//! The shared-memory transport reads three things it did not write: the
//! address a peer published through the rendezvous, the control block of a
//! segment file found under the segment directory (its identity, checked
//! before the file is mapped whole), and the counters and frame headers of
//! a mapped segment.

use crate::listener::{parse_address, refusal};
use crate::ring::{Consumer, Geometry, Identity, Segment};
use ferroccl_transport::FrameHeader;
use std::fs::OpenOptions;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Decode `data` as a published shm address; whether it was accepted.
pub fn address(data: &[u8]) -> bool {
    parse_address(data).is_ok()
}

/// The geometry the segment entry point maps `data` with.
const GEOMETRY: Geometry = Geometry {
    chunk_bytes: 64,
    steps: 2,
};

/// Write `data` (cut or zero-padded to one small segment) into a file,
/// read its control block as an acceptor does and judge its identity
/// against a fixed expectation, then map it whole and consume up to
/// `steps + 1` frames as a receiver does: each slot's `published` word
/// checked against the frame expected there, each header decoded against the slot size, the payload taken
/// at the decoded length. Returns the refusal code (None: accepted) and how
/// many frames decoded. Panics only if a decoder does.
pub fn segment(data: &[u8]) -> std::io::Result<(Option<u32>, usize)> {
    static FILES: AtomicU64 = AtomicU64::new(0);
    let total = GEOMETRY.total_len().expect("small geometry");
    let mut bytes = data.to_vec();
    bytes.resize(total, 0);
    let path = std::env::temp_dir().join(format!(
        "ferroccl-fuzz-{}-{}",
        std::process::id(),
        FILES.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        file.write_all(&bytes)?;
        let want = Identity {
            token: 7,
            comm_id: 1,
            from: 0,
            to: 1,
            chunk_bytes: GEOMETRY.chunk_bytes as u64,
            steps: GEOMETRY.steps as u32,
            total_len: total as u64,
        };
        let control = Segment::map_control(&file)?;
        let code = match control.read_identity() {
            Some(found) => refusal(&found, total as u64, &want),
            None => Some(0),
        };
        let seg = Arc::new(Segment::map_full(&file, GEOMETRY)?);
        let mut ring = Consumer::new(seg);
        let mut frames = 0;
        for _ in 0..=GEOMETRY.steps {
            match ring.peek() {
                Some(filled) => match FrameHeader::decode(&filled.header, GEOMETRY.chunk_bytes) {
                    Ok(h) => {
                        // A placement past the slot's end is refused,
                        // never read.
                        let Ok(payload) = filled.payload(h.len as usize) else {
                            break;
                        };
                        assert_eq!(payload.len(), h.len as usize, "payload past the frame");
                        frames += 1;
                        ring.release();
                    }
                    Err(_) => break,
                },
                None => break,
            }
        }
        Ok((code, frames))
    })();
    let _ = std::fs::remove_file(&path);
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn addresses_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let accepted = address(&bytes);
            // Only 24-byte strings that start with the magic can pass.
            prop_assert!(!accepted || (bytes.len() == 24 && &bytes[..4] == b"FCSM"));
        }

        #[test]
        fn segments_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1400)) {
            let (code, frames) = segment(&bytes).expect("temporary file");
            // Random bytes never carry the magic, so they are refused.
            prop_assert!(code.is_some());
            prop_assert!(frames <= GEOMETRY.steps);
        }
    }

    #[test]
    fn a_well_formed_address_is_accepted() {
        let mut bytes = b"FCSM".to_vec();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&[0u8; 16]);
        assert!(address(&bytes));
    }
}
