//! Health-view agreement (MECHANISMS.md section 4), sans-IO: every rank contributes its
//! local view, the views are merged (union of failures, minimum bandwidth), and the result
//! gets the next epoch. Every rank that completes a round holds the same view, because
//! the merge is commutative, associative and idempotent.
//!
//! The driver sends [`encode_view`] of its local view to every peer on the OOB `Agree`
//! channel and feeds what arrives into [`Agreement::handle_view`].

use r2ccl_core::{HealthEpoch, HealthView, NicHealth, NodeHealth};

/// Why an agreement round failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgreeError {
    /// A view message could not be decoded.
    #[error("malformed health view from rank {from}: {why}")]
    Malformed {
        /// The sender.
        from: u32,
        /// What was wrong.
        why: &'static str,
    },
    /// A view of another cluster shape.
    #[error("rank {from} reports a health view of a different cluster shape")]
    Shape {
        /// The sender.
        from: u32,
    },
    /// A rank outside the communicator.
    #[error("health view from rank {0}, which is not in this communicator")]
    UnknownRank(u32),
}

/// Encode a view for the OOB channel: round (u64), epoch (u64), nodes (u32), then per node
/// its NIC count (u32) and per NIC nominal and usable Mbit/s (u64 each), little-endian.
pub fn encode_view(round: u64, view: &HealthView) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + view.node_count() * 36);
    out.extend_from_slice(&round.to_le_bytes());
    out.extend_from_slice(&view.epoch().0.to_le_bytes());
    out.extend_from_slice(&(view.node_count() as u32).to_le_bytes());
    for node in view.nodes() {
        out.extend_from_slice(&(node.nics.len() as u32).to_le_bytes());
        for nic in &node.nics {
            out.extend_from_slice(&nic.nominal_mbps.to_le_bytes());
            out.extend_from_slice(&nic.usable_mbps.to_le_bytes());
        }
    }
    out
}

/// Decode [`encode_view`]'s bytes into (round, view); never panics.
pub fn decode_view(from: u32, bytes: &[u8]) -> Result<(u64, HealthView), AgreeError> {
    let bad = |why| AgreeError::Malformed { from, why };
    let mut pos = 0usize;
    let mut take = |n: usize| -> Result<&[u8], AgreeError> {
        let s = bytes.get(pos..pos + n).ok_or(bad("truncated"))?;
        pos += n;
        Ok(s)
    };
    let u64_at = |s: &[u8]| s.iter().rev().fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    let round = u64_at(take(8)?);
    let epoch = HealthEpoch(u64_at(take(8)?));
    let nodes = u64_at(take(4)?) as usize;
    if nodes > bytes.len() {
        return Err(bad("node count larger than the message"));
    }
    let mut out = Vec::with_capacity(nodes);
    for _ in 0..nodes {
        let nics = u64_at(take(4)?) as usize;
        if nics > 4096 {
            return Err(bad("more than 4096 NICs on a node"));
        }
        let mut v = Vec::with_capacity(nics);
        for _ in 0..nics {
            let nominal_mbps = u64_at(take(8)?);
            let usable_mbps = u64_at(take(8)?);
            v.push(NicHealth { nominal_mbps, usable_mbps: usable_mbps.min(nominal_mbps) });
        }
        out.push(NodeHealth { nics: v });
    }
    if pos != bytes.len() {
        return Err(bad("trailing bytes"));
    }
    Ok((round, HealthView::from_nodes(epoch, out)))
}

/// One agreement round at one rank.
#[derive(Clone, Debug)]
pub struct Agreement {
    round: u64,
    merged: HealthView,
    heard: Vec<bool>,
    missing: usize,
}

impl Agreement {
    /// Start round `round` at `rank` of `world` with this rank's local view.
    pub fn new(round: u64, rank: u32, world: u32, local: HealthView) -> Self {
        let mut heard = vec![false; world as usize];
        if let Some(h) = heard.get_mut(rank as usize) {
            *h = true;
        }
        let missing = heard.iter().filter(|h| !**h).count();
        Self { round, merged: local, heard, missing }
    }

    /// The round number.
    pub const fn round(&self) -> u64 {
        self.round
    }

    /// Feed a peer's view of this round; views of other rounds are ignored (`Ok(false)`).
    pub fn handle_view(&mut self, from: u32, round: u64, view: &HealthView) -> Result<bool, AgreeError> {
        if round != self.round {
            return Ok(false);
        }
        let seen = self.heard.get_mut(from as usize).ok_or(AgreeError::UnknownRank(from))?;
        if *seen {
            return Ok(false);
        }
        self.merged.merge_from(view).map_err(|_| AgreeError::Shape { from })?;
        *seen = true;
        self.missing -= 1;
        Ok(true)
    }

    /// Ranks not heard from yet.
    pub fn missing(&self) -> Vec<u32> {
        self.heard.iter().enumerate().filter(|(_, h)| !**h).map(|(r, _)| r as u32).collect()
    }

    /// Whether every rank's view is in.
    pub const fn is_complete(&self) -> bool {
        self.missing == 0
    }

    /// The agreed view, stamped with the epoch after the highest contributed one; `None`
    /// until complete.
    pub fn result(&self) -> Option<HealthView> {
        self.is_complete().then(|| {
            let mut v = self.merged.clone();
            v.set_epoch(self.merged.epoch().next());
            v
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use r2ccl_core::NicId;

    #[test]
    fn round_trip_and_garbage() {
        let mut v = HealthView::uniform(3, 2, 100_000);
        v.set_failed(NicId::new(1, 0)).unwrap();
        v.set_epoch(HealthEpoch(4));
        let bytes = encode_view(9, &v);
        assert_eq!(decode_view(0, &bytes).unwrap(), (9, v));
        for cut in 0..bytes.len() {
            assert!(decode_view(0, &bytes[..cut]).is_err());
        }
        assert!(decode_view(0, &[0xff; 64]).is_err());
    }

    #[test]
    fn every_rank_agrees_whatever_the_arrival_order() {
        let world = 4u32;
        let locals: Vec<HealthView> = (0..world)
            .map(|r| {
                let mut v = HealthView::uniform(2, 2, 1000);
                v.set_epoch(HealthEpoch(u64::from(r % 2)));
                if r == 2 {
                    v.set_failed(NicId::new(1, 1)).unwrap();
                }
                v
            })
            .collect();
        let mut results = Vec::new();
        for me in 0..world {
            let mut a = Agreement::new(1, me, world, locals[me as usize].clone());
            let order: Vec<u32> = (0..world).rev().filter(|&r| r != me).collect();
            for r in order {
                assert!(!a.is_complete());
                assert!(a.handle_view(r, 1, &locals[r as usize]).unwrap());
                assert!(!a.handle_view(r, 1, &locals[r as usize]).unwrap(), "duplicates are ignored");
            }
            assert!(!a.handle_view(0, 2, &locals[0]).unwrap(), "other rounds are ignored");
            results.push(a.result().unwrap());
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(results[0].epoch(), HealthEpoch(2));
        assert_eq!(results[0].failed_nics(), vec![NicId::new(1, 1)]);
        let mut a = Agreement::new(1, 0, 2, locals[0].clone());
        assert_eq!(a.missing(), vec![1]);
        assert_eq!(a.handle_view(1, 1, &HealthView::uniform(3, 2, 1000)), Err(AgreeError::Shape { from: 1 }));
        assert_eq!(a.handle_view(7, 1, &locals[1]), Err(AgreeError::UnknownRank(7)));
    }
}
