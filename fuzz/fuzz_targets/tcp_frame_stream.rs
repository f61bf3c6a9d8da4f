//! The TCP transport's resumable frame reader: a peer's byte stream read
//! into slots or the caller's buffer, with "would block" between pieces.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferroccl_tcp::fuzzing::frame_stream(data);
});
