//! The TCP transport's connection hello and its status byte.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferroccl_tcp::fuzzing::handshake(data);
});
