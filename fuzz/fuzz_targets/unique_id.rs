//! Unique id strings (`r2ccl1:HOST:PORT:SECRET`); what parses prints back to itself.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        r2ccl::fuzzing::unique_id(s);
    }
});
