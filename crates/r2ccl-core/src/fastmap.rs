//! A fast, non-cryptographic hash map for small integer keys (ranks, rails, tags, sizes), shared
//! by the planner and the simulator, whose hot loops look such keys up millions of times.
//!
//! Only for keys a run makes itself: the hash is not seeded, so input chosen to collide would
//! degrade it. Never key it with bytes from the wire or a peer.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The FxHash mix over each integer written (bytes one at a time).
#[derive(Clone, Copy, Debug, Default)]
pub struct IntHasher(u64);

impl IntHasher {
    fn mix(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.mix(u64::from(b));
        }
    }
    fn write_u16(&mut self, x: u16) {
        self.mix(u64::from(x));
    }
    fn write_u32(&mut self, x: u32) {
        self.mix(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        self.mix(x);
    }
    fn write_usize(&mut self, x: usize) {
        self.mix(x as u64);
    }
}

/// A map with integer keys hashed by [`IntHasher`].
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_small_keys_keep_their_values() {
        let mut m: IntMap<(u32, u16, u64), usize> = IntMap::default();
        for i in 0..1000u32 {
            m.insert((i % 7, (i % 3) as u16, u64::from(i)), i as usize);
        }
        assert_eq!(m.len(), 1000);
        assert!((0..1000u32).all(|i| m[&(i % 7, (i % 3) as u16, u64::from(i))] == i as usize));
    }
}
