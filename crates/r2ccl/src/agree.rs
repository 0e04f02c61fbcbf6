//! Health-view agreement (MECHANISMS.md section 4), sans-IO: every rank contributes its
//! local view, the views are merged (union of failures, minimum bandwidth), and the result
//! gets the next epoch. Every rank that completes a round holds the same view, because
//! the merge is commutative, associative and idempotent. One exception to the union: a node
//! that the union leaves without any usable NIC, although some rank saw one of its NICs
//! usable, keeps each NIC at the best any rank saw (views taken at different instants of a
//! flap must not cut off a node that never lost all its NICs at once; the engines steer
//! around what is really down). A node every view has lost stays lost.
//!
//! The driver sends [`encode_view`] of its local view to every peer on the OOB `Agree`
//! channel and feeds what arrives into [`Agreement::handle_view`].

use r2ccl_core::{HealthEpoch, HealthView, NicHealth, NicId, NodeHealth};

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

/// The most nodes a decoded view may have.
const MAX_VIEW_NODES: usize = 1 << 20;
/// The most NICs a decoded view may have in all (16 bytes each in memory).
const MAX_VIEW_NICS: usize = 1 << 20;
/// The most NICs one node of a decoded view may have.
const MAX_NODE_NICS: usize = 4096;

/// Encode a view for the OOB channel: round (u64), epoch (u64), nodes (u32), runs (u32), then
/// per run of consecutive nodes alike: their number (u32), their NIC count (u32) and per NIC
/// nominal and usable Mbit/s (u64 each); little-endian. Nodes of one model with every NIC whole
/// are one run, and each node that differs adds at most two: a view of 1,024 nodes of 8 NICs
/// with one NIC down is 3 runs, 432 bytes, where a record per node would be 135 KB, sent to
/// every rank on each health change.
pub fn encode_view(round: u64, view: &HealthView) -> Vec<u8> {
    let nodes = view.nodes();
    let mut runs: Vec<(u32, &NodeHealth)> = Vec::new();
    for node in nodes {
        match runs.last_mut() {
            Some((n, last)) if *last == node => *n += 1,
            _ => runs.push((1, node)),
        }
    }
    let mut out = Vec::with_capacity(24 + runs.iter().map(|(_, n)| 8 + 16 * n.nics.len()).sum::<usize>());
    out.extend_from_slice(&round.to_le_bytes());
    out.extend_from_slice(&view.epoch().0.to_le_bytes());
    out.extend_from_slice(&(nodes.len() as u32).to_le_bytes());
    out.extend_from_slice(&(runs.len() as u32).to_le_bytes());
    for (count, node) in runs {
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&(node.nics.len() as u32).to_le_bytes());
        for nic in &node.nics {
            out.extend_from_slice(&nic.nominal_mbps.to_le_bytes());
            out.extend_from_slice(&nic.usable_mbps.to_le_bytes());
        }
    }
    out
}

/// Decode [`encode_view`]'s bytes into (round, view); never panics, and allocates no more than
/// the bounds above allow whatever the counts claim.
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
    let runs = u64_at(take(4)?) as usize;
    if nodes > MAX_VIEW_NODES {
        return Err(bad("more nodes than a view may have"));
    }
    if runs > nodes || runs > bytes.len() {
        return Err(bad("more runs than nodes or bytes"));
    }
    let mut out = Vec::with_capacity(nodes);
    let mut nics_in_all = 0usize;
    for _ in 0..runs {
        let count = u64_at(take(4)?) as usize;
        let nics = u64_at(take(4)?) as usize;
        if count == 0 || out.len() + count > nodes {
            return Err(bad("runs that do not add up to the node count"));
        }
        if nics > MAX_NODE_NICS {
            return Err(bad("more than 4096 NICs on a node"));
        }
        nics_in_all = nics_in_all.saturating_add(count.saturating_mul(nics));
        if nics_in_all > MAX_VIEW_NICS {
            return Err(bad("more NICs than a view may have"));
        }
        let mut v = Vec::with_capacity(nics);
        for _ in 0..nics {
            let nominal_mbps = u64_at(take(8)?);
            let usable_mbps = u64_at(take(8)?);
            v.push(NicHealth { nominal_mbps, usable_mbps: usable_mbps.min(nominal_mbps) });
        }
        let node = NodeHealth { nics: v };
        out.extend(std::iter::repeat_n(node, count));
    }
    if out.len() != nodes {
        return Err(bad("runs that do not add up to the node count"));
    }
    if pos != bytes.len() {
        return Err(bad("trailing bytes"));
    }
    Ok((round, HealthView::from_nodes(epoch, out)))
}

/// Every NIC of `view` with its usable bandwidth.
fn nics_of(view: &HealthView) -> impl Iterator<Item = (NicId, u64)> + '_ {
    view.nodes().iter().enumerate().flat_map(|(i, node)| {
        node.nics.iter().enumerate().map(move |(r, n)| (NicId::new(i as u32, r as u16), n.usable_mbps))
    })
}

/// One agreement round at one rank.
#[derive(Clone, Debug)]
pub struct Agreement {
    round: u64,
    merged: HealthView,
    /// Per NIC, the most usable bandwidth any view gave it (maximum instead of minimum).
    best: HealthView,
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
        Self { round, best: local.clone(), merged: local, heard, missing }
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
        let better: Vec<(NicId, u64)> =
            nics_of(view).filter(|&(nic, mbps)| self.best.nic(nic).is_ok_and(|b| mbps > b.usable_mbps)).collect();
        for (nic, mbps) in better {
            // The shapes match (the merge above checked them).
            let _ = self.best.set_usable(nic, mbps);
        }
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
            let cut_off: Vec<usize> = (0..v.node_count())
                .filter(|&i| {
                    let lost = |h: &HealthView| h.nodes()[i].nics.iter().all(|n| n.usable_mbps == 0);
                    lost(&self.merged) && !lost(&self.best)
                })
                .collect();
            for (nic, mbps) in nics_of(&self.best).filter(|(nic, _)| cut_off.contains(&(nic.node.0 as usize))) {
                let _ = v.set_usable(nic, mbps);
            }
            v.set_epoch(self.merged.epoch().next());
            v
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use r2ccl_core::NodeId;

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
    fn a_large_view_travels_as_runs_of_alike_nodes() {
        let mut v = HealthView::uniform(1024, 8, 400_000);
        v.set_failed(NicId::new(517, 3)).unwrap();
        let bytes = encode_view(1, &v);
        assert_eq!(bytes.len(), 24 + 3 * (8 + 8 * 16), "three runs");
        assert_eq!(decode_view(0, &bytes).unwrap(), (1, v));
        // Counts that claim more than the bytes or the bounds allow are refused before allocating.
        let mut huge = encode_view(1, &HealthView::uniform(1, 8, 1));
        huge[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        huge[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_view(0, &huge).is_err());
        let mut many = encode_view(1, &HealthView::uniform(1, 8, 1));
        many[16..20].copy_from_slice(&(1u32 << 20).to_le_bytes());
        many[24..28].copy_from_slice(&(1u32 << 20).to_le_bytes());
        assert_eq!(
            decode_view(0, &many),
            Err(AgreeError::Malformed { from: 0, why: "more NICs than a view may have" })
        );
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

    /// The agreed view of `locals` as every rank computes it (each starting from its own view and
    /// hearing the others in a different order): they must all be equal.
    fn agree(locals: &[HealthView]) -> HealthView {
        let world = locals.len() as u32;
        let results: Vec<HealthView> = (0..world)
            .map(|me| {
                let mut a = Agreement::new(3, me, world, locals[me as usize].clone());
                for r in (0..world).map(|k| (me + 1 + k * 3) % world).filter(|&r| r != me) {
                    let _ = a.handle_view(r, 3, &locals[r as usize]).unwrap();
                }
                for r in 0..world {
                    let _ = a.handle_view(r, 3, &locals[r as usize]).unwrap();
                }
                a.result().unwrap()
            })
            .collect();
        assert!(results.windows(2).all(|w| w[0] == w[1]), "every rank agrees: {results:?}");
        results[0].clone()
    }

    #[test]
    fn views_of_a_flap_at_different_instants_never_cut_a_node_off() {
        // Rank 0 still sees node 1's NIC 0 out (a verdict it has not heard lifted), rank 2 already
        // sees NIC 1's link down: the union would leave node 1 nothing, though it never lost both.
        let mut locals = vec![HealthView::uniform(3, 2, 1000); 3];
        locals[0].set_failed(NicId::new(1, 0)).unwrap();
        locals[2].set_failed(NicId::new(1, 1)).unwrap();
        locals[2].set_failed(NicId::new(2, 0)).unwrap();
        let v = agree(&locals);
        assert!(v.node(NodeId(1)).unwrap().nics.iter().all(|n| n.usable_mbps == 1000), "{v:?}");
        assert_eq!(v.failed_nics(), vec![NicId::new(2, 0)], "other nodes keep the union");

        // A slowed NIC comes back at the best rate any view saw.
        locals[1].set_usable(NicId::new(1, 1), 400).unwrap();
        locals[1].set_failed(NicId::new(1, 0)).unwrap();
        let v = agree(&locals);
        assert_eq!(v.nic(NicId::new(1, 1)).unwrap().usable_mbps, 1000);

        // A node that every view has lost stays lost (the planner's clean error).
        for l in &mut locals {
            l.set_failed(NicId::new(1, 0)).unwrap();
            l.set_failed(NicId::new(1, 1)).unwrap();
        }
        let v = agree(&locals);
        assert!(v.failed_nics().contains(&NicId::new(1, 0)) && v.failed_nics().contains(&NicId::new(1, 1)));
    }
}
