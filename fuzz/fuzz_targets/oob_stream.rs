//! The OOB byte stream of one peer, split at random into reads, verified and decoded into frames,
//! each frame dispatched to its channel's decoder (engine control, detection protocol,
//! agreement). Odd first bytes send the rest as correctly tagged frames (reaching the decoders),
//! even ones as raw bytes (a stranger's stream, refused at its first frame).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte: the mode (bit 0) and how many cut points follow (2 bytes each).
    let (&k, rest) = data.split_first().unwrap_or((&0, &[]));
    let sealed = k & 1 == 1;
    let k = usize::from((k >> 1) % 16).min(rest.len() / 2);
    let (cuts, stream) = rest.split_at(k * 2);
    let mut cuts: Vec<usize> = cuts.chunks_exact(2).map(|c| usize::from(u16::from_le_bytes([c[0], c[1]]))).collect();
    cuts.sort_unstable();
    r2ccl::fuzzing::oob_stream(stream, &cuts, sealed);
});
