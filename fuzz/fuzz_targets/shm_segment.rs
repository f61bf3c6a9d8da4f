//! A shared-memory segment as a hostile peer could leave it: control block
//! identity, ring counters and slot frame headers.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferroccl_shm::fuzzing::segment(data);
});
