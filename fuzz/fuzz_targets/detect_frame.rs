//! Decoding r2ccl-detect protocol frames; what decodes re-encodes the same, from arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| r2ccl::fuzzing::detect(data));
