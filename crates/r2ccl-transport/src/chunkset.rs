//! A fixed-size set of chunk indices (a bitmap): the receiver's delivery record and the sender's
//! completion record of one transfer.

/// A set of chunk indices in `0..len`, stored as a bitmap.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ChunkSet {
    words: Vec<u64>,
    len: u32,
    count: u32,
}

impl ChunkSet {
    /// An empty set over `0..len`.
    pub fn new(len: u32) -> Self {
        Self { words: vec![0; (len as usize).div_ceil(64)], len, count: 0 }
    }

    /// The size of the index space.
    pub const fn capacity(&self) -> u32 {
        self.len
    }

    /// How many indices are in the set.
    pub const fn count(&self) -> u32 {
        self.count
    }

    /// Whether every index of `0..capacity` is in the set.
    pub const fn is_full(&self) -> bool {
        self.count == self.len
    }

    /// Whether `i` is in the set (false outside `0..capacity`).
    pub fn contains(&self, i: u32) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Adds `i`; returns true if it was not there before. Indices outside `0..capacity` are
    /// refused (false).
    pub fn insert(&mut self, i: u32) -> bool {
        if i >= self.len || self.contains(i) {
            return false;
        }
        self.words[(i / 64) as usize] |= 1 << (i % 64);
        self.count += 1;
        true
    }

    /// Removes every index in `start..end` (clamped to the capacity).
    pub fn remove_range(&mut self, start: u32, end: u32) {
        for i in start..end.min(self.len) {
            let w = &mut self.words[(i / 64) as usize];
            let bit = 1 << (i % 64);
            if *w & bit != 0 {
                *w &= !bit;
                self.count -= 1;
            }
        }
    }

    /// The first index in `start..end` that is not in the set, or `end` if all are: the end of the
    /// contiguous prefix held from `start`.
    pub fn first_missing(&self, start: u32, end: u32) -> u32 {
        let end = end.min(self.len);
        let mut i = start;
        while i < end {
            let w = self.words[(i / 64) as usize] >> (i % 64);
            if w == u64::MAX >> (i % 64) {
                i = (i / 64 + 1) * 64;
                continue;
            }
            let gap = (!w).trailing_zeros();
            return (i + gap).min(end);
        }
        end.max(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_and_ranges() {
        let mut s = ChunkSet::new(130);
        for i in 0..70 {
            assert!(s.insert(i));
        }
        assert!(!s.insert(3));
        assert!(!s.insert(130));
        assert_eq!(s.first_missing(0, 130), 70);
        assert_eq!(s.first_missing(10, 40), 40);
        s.insert(71);
        assert_eq!(s.first_missing(71, 130), 72);
        s.remove_range(60, 200);
        assert_eq!(s.count(), 60);
        assert_eq!(s.first_missing(0, 130), 60);
        assert_eq!(s.first_missing(5, 5), 5);
    }
}
