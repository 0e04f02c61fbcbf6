//! Netlink link messages as the kernel (or anyone who can send to the socket) delivers them.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = r2ccl_ucx::parse_link_messages(data);
});
