//! Configuration from `R2CCL_*` variables: any names and values give a config or a clear error.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let pairs: Vec<(String, String)> = text
        .split('\n')
        .filter(|l| !l.contains("R2CCL_CONFIG"))
        .filter_map(|l| l.split_once('=').map(|(k, v)| (format!("R2CCL_{k}"), v.to_owned())))
        .collect();
    let _ = r2ccl_config::load_from(pairs);
});
