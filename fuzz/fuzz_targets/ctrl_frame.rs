//! Decoding engine control frames (migration requests and acks, receipts, nacks, blame); what decodes re-encodes the same, from arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| r2ccl::fuzzing::ctrl(data));
