//! Requests to the metrics endpoint, received in random pieces: parsed without panic, bounded in
//! size, and a whole request is recognised however it is cut.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (&k, rest) = data.split_first().unwrap_or((&0, &[]));
    let k = usize::from(k % 16).min(rest.len() / 2);
    let (cuts, request) = rest.split_at(k * 2);
    let mut cuts: Vec<usize> = cuts.chunks_exact(2).map(|c| usize::from(u16::from_le_bytes([c[0], c[1]]))).collect();
    cuts.sort_unstable();
    r2ccl::fuzzing::metrics_request(request, &cuts);
});
