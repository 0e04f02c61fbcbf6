//! Message authentication for bootstrap handshakes: SipHash-2-4 keyed with the job secret.
//!
//! Two SipHash passes with different domain bytes give a 128-bit tag. SipHash is a PRF
//! designed for short-input MACs; here it proves knowledge of the secret against a fresh
//! nonce, which is all the bootstrap needs (it does not encrypt anything).

use super::Secret;

struct Sip {
    v: [u64; 4],
}

impl Sip {
    fn new(k0: u64, k1: u64) -> Self {
        Self {
            v: [
                k0 ^ 0x736f_6d65_7073_6575,
                k1 ^ 0x646f_7261_6e64_6f6d,
                k0 ^ 0x6c79_6765_6e65_7261,
                k1 ^ 0x7465_6462_7974_6573,
            ],
        }
    }

    fn round(&mut self) {
        let v = &mut self.v;
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }

    fn compress(&mut self, m: u64) {
        self.v[3] ^= m;
        self.round();
        self.round();
        self.v[0] ^= m;
    }

    fn hash(mut self, data: &[u8]) -> u64 {
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.compress(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        self.compress(u64::from_le_bytes(last) | ((data.len() as u64 & 0xff) << 56));
        self.v[2] ^= 0xff;
        for _ in 0..4 {
            self.round();
        }
        self.v[0] ^ self.v[1] ^ self.v[2] ^ self.v[3]
    }
}

/// SipHash-2-4 of `data` under a 128-bit key.
pub(crate) fn siphash24(key: &[u8; 16], data: &[u8]) -> u64 {
    let mut k0 = [0u8; 8];
    let mut k1 = [0u8; 8];
    k0.copy_from_slice(&key[..8]);
    k1.copy_from_slice(&key[8..]);
    Sip::new(u64::from_le_bytes(k0), u64::from_le_bytes(k1)).hash(data)
}

/// A 128-bit tag over `parts` (length-delimited, so part boundaries matter).
pub(crate) fn tag(secret: &Secret, parts: &[&[u8]]) -> [u8; 16] {
    let mut msg = Vec::new();
    for p in parts {
        msg.extend_from_slice(&(p.len() as u64).to_le_bytes());
        msg.extend_from_slice(p);
    }
    let mut out = [0u8; 16];
    msg.push(1);
    out[..8].copy_from_slice(&siphash24(secret.bytes(), &msg).to_le_bytes());
    if let Some(last) = msg.last_mut() {
        *last = 2;
    }
    out[8..].copy_from_slice(&siphash24(secret.bytes(), &msg).to_le_bytes());
    out
}

/// Constant-time tag comparison.
pub(crate) fn tags_equal(a: &[u8; 16], b: &[u8; 16]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference vectors of the SipHash paper: key 00..0f, messages 00, 00 01, ...
    #[test]
    fn siphash_reference_vectors() {
        let key: [u8; 16] = core::array::from_fn(|i| i as u8);
        let msg: Vec<u8> = (0..15u8).collect();
        assert_eq!(siphash24(&key, &[]), 0x726f_db47_dd0e_0e31);
        assert_eq!(siphash24(&key, &msg[..1]), 0x74f8_39c5_93dc_67fd);
        assert_eq!(siphash24(&key, &msg[..8]), 0x93f5_f579_9a93_2462);
        assert_eq!(siphash24(&key, &msg[..15]), 0xa129_ca61_49be_45e5);
    }

    #[test]
    fn tags_depend_on_secret_and_boundaries() {
        let a = Secret::from_bytes([1; 16]);
        let b = Secret::from_bytes([2; 16]);
        assert_ne!(tag(&a, &[b"xy"]), tag(&b, &[b"xy"]));
        assert_ne!(tag(&a, &[b"x", b"y"]), tag(&a, &[b"xy"]));
        assert!(tags_equal(&tag(&a, &[b"n"]), &tag(&a, &[b"n"])));
    }
}
