//! The TCP rendezvous protocol: frame streams in both directions, read in
//! pieces with timeouts between them, and every payload decoder (hello,
//! SET, GET, failure and mismatch reports, progress questions and answers).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferroccl::bootstrap::fuzz_store_bytes(data);
});
