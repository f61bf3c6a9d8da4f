//! Entry points for the fuzz targets (fuzz/) and property tests: each runs
//! one wire decoder of this crate on arbitrary bytes. Hidden from the docs;
//! not an API.

use crate::handshake::{Expected, Hello, Status};
use crate::slot::Slot;
use crate::wire::{Partial, Progress};
use std::io::{ErrorKind, Read};

/// Decode `data` as a connection hello and judge it against a fixed
/// expectation; also read its first byte as a status answer. Returns
/// whether the hello was accepted.
pub fn handshake(data: &[u8]) -> bool {
    let _ = data
        .first()
        .map(|&b| Status::from_code(b).map(Status::reason));
    let expected = Expected {
        token: 0x0123_4567_89ab_cdef,
        comm_id: 1,
        rank: 1,
        size: 4,
        nsocks: 2,
        chunk_bytes: 1 << 16,
        steps: 8,
    };
    match Hello::decode(data) {
        Ok(hello) => hello.validate(&expected).is_ok(),
        Err(status) => {
            assert_ne!(status, Status::Ok, "a refused hello must not say ok");
            false
        }
    }
}

/// Hands out bytes in pieces whose sizes come from the data, with a "would
/// block" between pieces, like a nonblocking socket.
struct Pieces<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
    turn: usize,
    blocked: bool,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.blocked = !self.blocked;
        if self.blocked {
            return Err(ErrorKind::WouldBlock.into());
        }
        let size = self
            .sizes
            .get(self.turn % self.sizes.len().max(1))
            .map_or(1, |&s| usize::from(s).max(1));
        self.turn += 1;
        let n = size.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// Read `data` as a stream of data frames from a peer, the way a
/// connection does: its first byte picks the slot size (1 to 256 bytes) and
/// whether payloads go into the caller's buffer or a slot, the next eight
/// the sizes of the reads. Returns how many frames and control messages
/// came out before the stream ended or was refused.
pub fn frame_stream(data: &[u8]) -> usize {
    let Some((&first, rest)) = data.split_first() else {
        return 0;
    };
    let chunk = usize::from(first) + 1;
    let into_caller = first & 1 == 1;
    let (sizes, stream) = rest.split_at(rest.len().min(8));
    let mut input = Pieces {
        data: stream,
        sizes,
        turn: 0,
        blocked: false,
    };
    let mut state = Partial::idle();
    let mut dst = vec![0u8; chunk];
    let mut events = 0;
    // Each turn consumes a byte or blocks once; bound the loop anyway.
    for _ in 0..4 * (stream.len() + 8) {
        let into = state.reads_into_caller().then_some(&mut dst[..]);
        match state.advance(&mut input, chunk, into) {
            Ok(Progress::WouldBlock) => {}
            Ok(Progress::Header(h)) => {
                assert!(h.len as usize <= chunk, "a header beyond the slot passed");
                if into_caller {
                    state.set_payload(None);
                } else {
                    state.set_payload(Some(Slot::new(chunk)));
                }
            }
            Ok(Progress::Frame(h, _)) => {
                assert!(h.len as usize <= chunk);
                events += 1;
            }
            Ok(Progress::Failure { reason, .. }) => {
                assert!(reason.len() <= crate::wire::MAX_REASON_BYTES * 4);
                events += 1;
            }
            Ok(Progress::Goodbye) => events += 1,
            Ok(Progress::Eof) | Err(_) => break,
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hellos_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = handshake(&bytes);
        }

        #[test]
        fn frame_streams_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = frame_stream(&bytes);
        }
    }
}
