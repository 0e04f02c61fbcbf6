//! Every input a fuzz target once failed on (`tests/fuzz_regressions/<target>-<what>`), replayed
//! through the same entry point: each must now pass.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use std::path::Path;

#[test]
fn past_fuzz_failures_pass() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_regressions");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let data = std::fs::read(&path).unwrap();
        match name.split('-').next().unwrap() {
            "launch_env" => r2ccl::fuzzing::launch_env_records(&data),
            "oob_stream" => r2ccl::fuzzing::oob_stream(&data, &[], false),
            "ctrl_frame" => r2ccl::fuzzing::ctrl(&data),
            "rendezvous" => r2ccl::fuzzing::rendezvous(&data),
            "unique_id" => r2ccl::fuzzing::unique_id(&String::from_utf8_lossy(&data)),
            other => panic!("{name}: no entry point for fuzz target {other}"),
        }
        seen += 1;
    }
    assert!(seen >= 3, "the regression inputs are there ({seen})");
}
