//! Decoding a rank's NIC blob from the rank table; what decodes re-encodes the same, from arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| r2ccl::fuzzing::nic_blob(data));
