//! Pure session building blocks against simple reference models: the chunk set and striping.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use proptest::prelude::*;
use r2ccl_transport::{chunk_count, chunk_len, stripe, ChunkSet};
use std::collections::BTreeSet;

#[derive(Clone, Debug)]
enum Op {
    Insert(u32),
    Remove(u32, u32),
}

proptest! {
    #[test]
    fn chunk_set_matches_a_set_model(
        cap in 0u32..300,
        ops in proptest::collection::vec(
            prop_oneof![3 => (0u32..320).prop_map(Op::Insert), 1 => (0u32..320, 0u32..320).prop_map(|(a, b)| Op::Remove(a, b))],
            0..200,
        ),
        probe in (0u32..320, 0u32..320),
    ) {
        let mut s = ChunkSet::new(cap);
        let mut m = BTreeSet::new();
        for op in ops {
            match op {
                Op::Insert(i) => prop_assert_eq!(s.insert(i), i < cap && m.insert(i)),
                Op::Remove(a, b) => {
                    s.remove_range(a, b);
                    m.retain(|&x| !(a..b).contains(&x));
                }
            }
            prop_assert_eq!(s.count() as usize, m.len());
        }
        let (a, b) = (probe.0.min(probe.1), probe.0.max(probe.1));
        let end = b.min(cap).max(a);
        let want = (a..end).find(|i| !m.contains(i)).unwrap_or(end);
        prop_assert_eq!(s.first_missing(a, b), want);
        prop_assert_eq!(s.is_full(), m.len() == cap as usize);
    }

    #[test]
    fn stripe_covers_every_chunk_once_and_follows_weights(
        len in 0u64..(64 << 20),
        cs in 1u32..(1 << 20),
        weights in proptest::collection::vec(0u32..1000, 1..9),
    ) {
        let lanes = stripe(len, cs, &weights);
        prop_assert_eq!(lanes.len(), weights.len());
        let n = chunk_count(len, cs);
        let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        if total == 0 {
            prop_assert!(lanes.iter().all(|&(a, b)| a == b));
            return Ok(());
        }
        let mut next = 0;
        for (i, &(a, b)) in lanes.iter().enumerate() {
            prop_assert_eq!(a, next);
            prop_assert!(a <= b);
            if weights[i] == 0 {
                prop_assert_eq!(a, b);
            }
            next = b;
            let bytes: u64 = (a..b).map(|c| u64::from(chunk_len(len, cs, c))).sum();
            let ideal = len as f64 * f64::from(weights[i]) / total as f64;
            prop_assert!((bytes as f64 - ideal).abs() <= f64::from(cs), "lane {} has {} bytes, ideal {}", i, bytes, ideal);
        }
        prop_assert_eq!(next, n);
    }
}
