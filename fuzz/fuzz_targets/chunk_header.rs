//! Chunk headers: arbitrary bytes never decode under a key they were not tagged with (unless they
//! are a copy of a tagged header), and a header built from the input and tagged round-trips, while
//! any single changed byte of it is refused.
#![no_main]
use libfuzzer_sys::fuzz_target;
use r2ccl_transport::{ChunkHeader, ChunkId, HeaderKey, HeaderMac, TransferKey, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let mac = HeaderMac::new(&HeaderKey::from_bytes([0x42; 32]));
    let _ = ChunkHeader::decode(data, &mac);
    let _ = ChunkHeader::decode_split(data, &mac);
    // Structure-aware: the first 41 bytes pick the fields, the next two a byte to flip.
    let mut f = [0u8; 43];
    let n = data.len().min(43);
    f[..n].copy_from_slice(&data[..n]);
    let u32_at = |i: usize| u32::from_le_bytes([f[i], f[i + 1], f[i + 2], f[i + 3]]);
    let u64_at = |i: usize| u64::from_le_bytes([f[i], f[i + 1], f[i + 2], f[i + 3], f[i + 4], f[i + 5], f[i + 6], f[i + 7]]);
    let len = u32_at(0) % 4096;
    let h = ChunkHeader {
        id: ChunkId { transfer: TransferKey::new(u64_at(4), u64_at(12), u32_at(20), u32_at(24), u32_at(28)), index: u32_at(32) },
        total_len: u64::from(len) + u64::from(u32_at(36)),
        len,
        flags: u16::from(f[40] & 1),
        args: u32_at(36),
    };
    let mut msg = h.encode(&mac).to_vec();
    msg.extend(std::iter::repeat_n(0u8, len as usize));
    assert_eq!(ChunkHeader::decode(&msg, &mac).map(|(d, _)| d), Ok(h));
    let at = usize::from(f[41]) % HEADER_LEN;
    msg[at] ^= f[42] | 1;
    assert!(ChunkHeader::decode(&msg, &mac).is_err(), "a changed byte {at} was accepted");
});
