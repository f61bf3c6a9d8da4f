//! The 40-byte frame header every transport carries (transports/core),
//! decoded against slot sizes taken from the input; a header that decodes
//! must encode back to the same bytes and respect the slot bound.
#![no_main]

use ferroccl_transport::{FrameHeader, HEADER_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let max_len = data.get(HEADER_BYTES..HEADER_BYTES + 4).map_or(4096, |b| {
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
    });
    if let Ok(h) = FrameHeader::decode(data, max_len) {
        assert!(h.len as usize <= max_len);
        assert_eq!(&h.encode()[..], &data[..HEADER_BYTES]);
    }
});
