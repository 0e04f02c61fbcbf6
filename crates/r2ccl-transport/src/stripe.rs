//! Striping one transfer over several NICs by weight, on the chunk grid.
//!
//! The split is deterministic: NIC `i` gets a contiguous chunk range whose byte boundaries are
//! the ideal weighted byte boundaries rounded to the nearest chunk edge (cumulative rounding),
//! so every NIC's byte count is within one chunk of `len * w_i / sum(w)`. The session feeds it
//! byte targets that carry each NIC's rounding debt from transfer to transfer
//! ([`Striper`]), so that over many transfers, short ones included, every NIC carries its
//! weighted share of the bytes.

/// Striping with memory: the bytes each NIC was owed or overpaid by earlier transfers (by
/// chunk rounding) count toward the next one. A transfer of one chunk goes whole to one NIC,
/// so without this a NIC with three times the weight of another would still get every other
/// short message; with it, short messages follow the weights too.
#[derive(Clone, Debug, Default)]
pub struct Striper {
    /// Per NIC: bytes owed (positive) or overpaid (negative) so far.
    credit: Vec<i128>,
}

impl Striper {
    /// Split a transfer of `len` bytes in chunks of `chunk_size` over NICs with `weights`
    /// (zero: not used by this transfer, its balance stands), as [`stripe`] does, then book what each NIC
    /// got against its share.
    pub fn stripe(&mut self, len: u64, chunk_size: u32, weights: &[u32]) -> Vec<(u32, u32)> {
        self.credit.resize(weights.len(), 0);
        let total: i128 = weights.iter().map(|&w| i128::from(w)).sum();
        if total == 0 || len == 0 {
            return stripe(len, chunk_size, weights);
        }
        // Each NIC's share, cumulatively rounded so that the shares add up to `len` exactly
        // (the balances then sum to zero and cannot drift).
        let mut prefix = 0i128;
        let mut prev = 0i128;
        let ideal: Vec<i128> = weights
            .iter()
            .map(|&w| {
                prefix += i128::from(w);
                let cum = i128::from(len) * prefix / total;
                let share = cum - prev;
                prev = cum;
                share
            })
            .collect();
        let targets: Vec<u64> = weights
            .iter()
            .zip(&ideal)
            .zip(&self.credit)
            .map(|((&w, &i), &c)| if w == 0 { 0 } else { u64::try_from((i + c).max(0)).unwrap_or(0) })
            .collect();
        let ranges = if targets.iter().all(|&t| t == 0) {
            stripe(len, chunk_size, weights)
        } else {
            stripe_wide(len, chunk_size, &targets)
        };
        let cs = u64::from(chunk_size.max(1));
        for (j, &(a, b)) in ranges.iter().enumerate() {
            if weights[j] == 0 {
                // Not part of this transfer: its balance stands.
                continue;
            }
            let got = (u64::from(b) * cs).min(len).saturating_sub(u64::from(a) * cs);
            // Bounded: a NIC's balance stays within a chunk or so of zero plus its share of one
            // transfer, since the next transfer's target includes it.
            self.credit[j] += ideal[j] - i128::from(got);
        }
        ranges
    }
}

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
    let wide: Vec<u64> = weights.iter().map(|&w| u64::from(w)).collect();
    stripe_wide(len, chunk_size, &wide)
}

/// [`stripe`] with 64-bit weights (byte targets, for instance).
pub fn stripe_wide(len: u64, chunk_size: u32, weights: &[u64]) -> Vec<(u32, u32)> {
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

    #[test]
    fn a_striper_follows_the_weights_over_short_transfers() {
        // One-chunk transfers go whole to one NIC; over many, the bytes follow the weights.
        let mut st = Striper::default();
        let mut bytes = [0u64; 3];
        for _ in 0..400 {
            for (j, (a, b)) in st.stripe(1000, 4096, &[3, 1, 0]).into_iter().enumerate() {
                bytes[j] += u64::from(b - a) * 1000;
            }
        }
        assert_eq!(bytes[2], 0, "a NIC of weight zero gets nothing");
        assert!(bytes[0].abs_diff(300_000) <= 1000 && bytes[1].abs_diff(100_000) <= 1000, "{bytes:?}");
        // Equal weights: short transfers alternate.
        let mut st = Striper::default();
        let firsts: Vec<usize> =
            (0..6).map(|_| st.stripe(10, 4096, &[1, 1]).iter().position(|&(a, b)| b > a).unwrap_or(9)).collect();
        assert_eq!(firsts, vec![1, 0, 1, 0, 1, 0]);
        // Shares add up exactly, so balances do not drift: after 200 000 odd-sized transfers
        // over three NICs, every NIC still gets its share of the next one.
        let mut st = Striper::default();
        for _ in 0..200_000 {
            st.stripe(7, 4096, &[1, 1, 1]);
        }
        assert!(st.credit.iter().all(|c| c.abs() <= 7), "{:?}", st.credit);
        // Every transfer is covered exactly once, in order.
        let mut st = Striper::default();
        for len in [1u64, 4096, 4097, 10_000, 65_536, 100_000] {
            let r = st.stripe(len, 4096, &[5, 3, 2]);
            assert_eq!(r.first().map(|x| x.0), Some(0));
            assert!(r.windows(2).all(|w| w[0].1 == w[1].0));
            assert_eq!(r.last().map(|x| x.1), Some(chunk_count(len, 4096)));
        }
    }
}
