//! The transport's message buffers kept for reuse, bounded in count and in bytes.
//!
//! A buffer is taken by size: the smallest kept one that fits and is at most twice the need
//! (warm pages instead of fresh ones that fault on first touch, and a header's receive never
//! holds a chunk's megabyte); else a new one. What is kept is bounded by [`MAX_BUFFERS`] and
//! [`MAX_BYTES`] of capacity, so the pool never holds more than what was in flight at once, up
//! to those bounds.

/// Most buffers kept.
pub(crate) const MAX_BUFFERS: usize = 256;
/// Most bytes of capacity kept.
pub(crate) const MAX_BYTES: usize = 16 << 20;

/// Message buffers kept for reuse.
#[derive(Debug, Default)]
pub(crate) struct BufPool {
    bufs: Vec<Vec<u8>>,
    /// The kept buffers' capacity.
    bytes: usize,
}

impl BufPool {
    /// An empty buffer with room for `need` bytes (see the module doc).
    pub(crate) fn take(&mut self, need: usize) -> Vec<u8> {
        let most = need.max(4096).saturating_mul(2);
        let fit = self
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| (need..=most).contains(&b.capacity()))
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match fit {
            Some(i) => {
                let mut buf = self.bufs.swap_remove(i);
                self.bytes -= buf.capacity();
                buf.clear();
                buf
            }
            None => Vec::with_capacity(need),
        }
    }

    /// Keep `buf` for a later take, unless the pool is full.
    pub(crate) fn put(&mut self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap > 0 && self.bufs.len() < MAX_BUFFERS && self.bytes + cap <= MAX_BYTES {
            self.bytes += cap;
            self.bufs.push(buf);
        }
    }

    /// The kept buffers' capacity.
    #[cfg(test)]
    pub(crate) const fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_need_never_takes_a_large_buffer_and_the_pool_is_bounded() {
        let mut pool = BufPool::default();
        pool.put(Vec::with_capacity(1 << 20));
        let small = pool.take(70_000);
        assert!(small.capacity() >= 70_000 && small.capacity() < 1 << 20, "{}", small.capacity());
        assert_eq!(pool.bytes(), 1 << 20, "the large buffer stays kept");
        let big = pool.take(1 << 20);
        assert_eq!(big.capacity(), 1 << 20);
        assert_eq!(pool.bytes(), 0);
        for _ in 0..40 {
            pool.put(Vec::with_capacity(1 << 20));
        }
        assert_eq!(pool.bytes(), MAX_BYTES, "kept up to the byte bound");
        for _ in 0..300 {
            pool.put(Vec::with_capacity(16));
        }
        assert!(pool.bufs.len() <= MAX_BUFFERS);
        assert!(pool.take(1 << 20).is_empty());
    }
}
