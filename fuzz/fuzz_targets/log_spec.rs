//! Log specs (level, per-subsystem levels, file pattern): a spec or an error.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let (level, subsys, file) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let _ = r2ccl_log::LogSpec::parse(level, subsys, file);
});
