//! `R2CCL_FAULT` specs: a list of faults or an error naming the bad part.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = r2ccl_ucx::parse_faults(s);
    }
});
