//! UCX address blobs from the rank table and the socket addresses packed in them.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = r2ccl_ucx::parse_address_blob(data);
    let _ = r2ccl_ucx::WorkerAddress::from_bytes(data.to_vec()).socket_addr();
});
