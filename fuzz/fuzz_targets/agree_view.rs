//! Health views of the agreement protocol, from arbitrary bytes; what decodes re-encodes the same.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| r2ccl::fuzzing::agree_view(3, data));
