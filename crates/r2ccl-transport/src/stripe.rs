//! Striping one transfer over several NICs by weight, on the chunk grid.
//!
//! The split is deterministic: NIC `i` gets a contiguous chunk range whose byte boundaries are
//! the ideal weighted byte boundaries rounded to the nearest chunk edge (cumulative rounding),
//! so every NIC's byte count is within one chunk of `len * w_i / sum(w)`, and both ends of a
//! connection compute the same lanes from the same inputs.

/// The chunk count of a transfer of `len` bytes in chunks of `chunk_size`.
pub fn chunk_count(len: u64, chunk_size: u32) -> u32 {
    u32::try_from(len.div_ceil(u64::from(chunk_size.max(1)))).unwrap_or(u32::MAX)
}

/// Bytes of chunk `index` of a transfer of `len` bytes (the last chunk may be short).
pub fn chunk_len(len: u64, chunk_size: u32, index: u32) -> u32 {
    let start = u64::from(index) * u64::from(chunk_size);
    // The value is at most `chunk_size`, so the conversion cannot fail.
    u32::try_from(len.saturating_sub(start).min(u64::from(chunk_size))).unwrap_or(chunk_size)
}

/// Splits `len` bytes, in chunks of `chunk_size`, over NICs with `weights`: returns one
/// `start..end` chunk range per weight (empty for weight zero, and all empty when every weight
/// is zero). Ranges are contiguous, in weight order, and cover every chunk exactly once.
pub fn stripe(len: u64, chunk_size: u32, weights: &[u32]) -> Vec<(u32, u32)> {
    let n = chunk_count(len, chunk_size);
    let total: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if total == 0 {
        return vec![(0, 0); weights.len()];
    }
    let cs = u128::from(chunk_size.max(1));
    let mut prefix: u128 = 0;
    let mut start = 0u32;
    let mut out = Vec::with_capacity(weights.len());
    for (i, &w) in weights.iter().enumerate() {
        prefix += u128::from(w);
        let end = if prefix == total || weights[i + 1..].iter().all(|&w| w == 0) {
            n
        } else {
            let target = u128::from(len) * prefix / total;
            let k = (target + cs / 2) / cs;
            u32::try_from(k).unwrap_or(u32::MAX).clamp(start, n)
        };
        let end = if w == 0 { start } else { end };
        out.push((start, end));
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_and_follow_weights() {
        assert_eq!(stripe(0, 4, &[1, 1]), vec![(0, 0), (0, 0)]);
        assert_eq!(stripe(10, 4, &[1, 0]), vec![(0, 3), (3, 3)]);
        assert_eq!(stripe(16, 4, &[1, 1]), vec![(0, 2), (2, 4)]);
        assert_eq!(stripe(16, 4, &[0, 1, 0]), vec![(0, 0), (0, 4), (4, 4)]);
        assert_eq!(stripe(16, 4, &[3, 1]), vec![(0, 3), (3, 4)]);
        assert_eq!(chunk_len(10, 4, 2), 2);
        assert_eq!(chunk_len(10, 4, 3), 0);
    }
}
