//! The shared-memory transport's published address.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferroccl_shm::fuzzing::address(data);
});
