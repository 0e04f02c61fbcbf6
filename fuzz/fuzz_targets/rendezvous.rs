//! Decoding rendezvous hello frames and rank-table payloads, from arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| r2ccl::fuzzing::rendezvous(data));
