//! Launch environments (launcher variables, unique id, secret): never a panic, and no error
//! echoes a secret it was given.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| r2ccl::fuzzing::launch_env_records(data));
