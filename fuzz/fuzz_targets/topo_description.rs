//! Static topology descriptions (TOML): a description or an error, and resolving one into a
//! cluster model gives a model or an error.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(d) = r2ccl_topo::TopologyDescription::from_toml_str(s) {
            let _ = d.resolve();
        }
    }
});
