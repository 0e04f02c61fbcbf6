//! The health view: per-node, per-NIC usable bandwidth, stamped with an epoch.
//!
//! Every rank must plan a collective from the same view (MECHANISMS.md section 4):
//! local views are merged with [`HealthView::merge_from`] (union of failures, minimum
//! of bandwidth) and the result carries a new epoch. [`HealthView::digest`] is a
//! stable fingerprint so ranks can check that they agree.

use crate::{HealthError, NicId, NodeId, RailId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A health epoch: bumped on every agreed change of the health view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HealthEpoch(pub u64);

impl HealthEpoch {
    /// The epoch after this one (saturating: a peer-sent `u64::MAX` stays there rather than
    /// overflow).
    #[must_use]
    pub const fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}

impl fmt::Display for HealthEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch{}", self.0)
    }
}

/// Health of one NIC: its nominal and currently usable bandwidth in Mbit/s.
/// A NIC with zero usable bandwidth is failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NicHealth {
    /// Line rate when healthy, Mbit/s.
    pub nominal_mbps: u64,
    /// Usable rate now, Mbit/s (0 = failed; below nominal = degraded).
    pub usable_mbps: u64,
}

impl NicHealth {
    /// A healthy NIC at `mbps`.
    pub const fn healthy(mbps: u64) -> Self {
        Self { nominal_mbps: mbps, usable_mbps: mbps }
    }

    /// Whether the NIC carries no traffic.
    pub const fn is_failed(&self) -> bool {
        self.usable_mbps == 0
    }

    /// Whether the NIC runs below its line rate but above zero.
    pub const fn is_degraded(&self) -> bool {
        self.usable_mbps > 0 && self.usable_mbps < self.nominal_mbps
    }
}

/// Health of one node's NICs, indexed by rail.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeHealth {
    /// One entry per NIC, indexed by rail.
    pub nics: Vec<NicHealth>,
}

impl NodeHealth {
    /// Sum of nominal NIC bandwidth, Mbit/s.
    pub fn nominal_mbps(&self) -> u64 {
        self.nics.iter().map(|n| n.nominal_mbps).sum()
    }

    /// Sum of usable NIC bandwidth, Mbit/s.
    pub fn usable_mbps(&self) -> u64 {
        self.nics.iter().map(|n| n.usable_mbps).sum()
    }

    /// Fraction of the node's inter-node bandwidth that is lost (the paper's X).
    pub fn lost_fraction(&self) -> f64 {
        let nominal = self.nominal_mbps();
        if nominal == 0 {
            return 1.0;
        }
        1.0 - self.usable_mbps() as f64 / nominal as f64
    }

    /// Rails whose NIC still carries traffic, in rail order.
    pub fn healthy_rails(&self) -> impl Iterator<Item = RailId> + '_ {
        self.nics.iter().enumerate().filter(|(_, n)| !n.is_failed()).map(|(r, _)| RailId(r as u16))
    }

    /// Whether at least one NIC carries traffic.
    pub fn is_connected(&self) -> bool {
        self.nics.iter().any(|n| !n.is_failed())
    }
}

/// The health of every NIC of every node, with its epoch.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HealthView {
    epoch: HealthEpoch,
    nodes: Vec<NodeHealth>,
}

impl HealthView {
    /// A view of `nodes` nodes with `nics` healthy NICs of `mbps` each, at epoch 0.
    pub fn uniform(nodes: usize, nics: usize, mbps: u64) -> Self {
        Self { epoch: HealthEpoch(0), nodes: vec![NodeHealth { nics: vec![NicHealth::healthy(mbps); nics] }; nodes] }
    }

    /// A view from explicit per-node health, at `epoch`.
    pub fn from_nodes(epoch: HealthEpoch, nodes: Vec<NodeHealth>) -> Self {
        Self { epoch, nodes }
    }

    /// The view's epoch.
    pub const fn epoch(&self) -> HealthEpoch {
        self.epoch
    }

    /// Stamp the view with `epoch`.
    pub fn set_epoch(&mut self, epoch: HealthEpoch) {
        self.epoch = epoch;
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// All nodes, indexed by node id.
    pub fn nodes(&self) -> &[NodeHealth] {
        &self.nodes
    }

    /// One node's health.
    pub fn node(&self, node: NodeId) -> Result<&NodeHealth, HealthError> {
        self.nodes.get(node.index()).ok_or(HealthError::UnknownNode(node))
    }

    /// One NIC's health.
    pub fn nic(&self, nic: NicId) -> Result<&NicHealth, HealthError> {
        self.node(nic.node)?.nics.get(nic.rail.index()).ok_or(HealthError::UnknownNic(nic))
    }

    fn nic_mut(&mut self, nic: NicId) -> Result<&mut NicHealth, HealthError> {
        self.nodes
            .get_mut(nic.node.index())
            .and_then(|n| n.nics.get_mut(nic.rail.index()))
            .ok_or(HealthError::UnknownNic(nic))
    }

    /// Whether `nic` is failed (unknown NICs are an error, not "healthy").
    pub fn is_failed(&self, nic: NicId) -> Result<bool, HealthError> {
        Ok(self.nic(nic)?.is_failed())
    }

    /// Mark `nic` failed. Does not change the epoch.
    pub fn set_failed(&mut self, nic: NicId) -> Result<(), HealthError> {
        self.nic_mut(nic)?.usable_mbps = 0;
        Ok(())
    }

    /// Set `nic`'s usable bandwidth (clamped to its nominal rate). Does not change the epoch.
    pub fn set_usable(&mut self, nic: NicId, mbps: u64) -> Result<(), HealthError> {
        let n = self.nic_mut(nic)?;
        n.usable_mbps = mbps.min(n.nominal_mbps);
        Ok(())
    }

    /// Mark `nic` healthy at its nominal rate. Does not change the epoch.
    pub fn set_healthy(&mut self, nic: NicId) -> Result<(), HealthError> {
        let n = self.nic_mut(nic)?;
        n.usable_mbps = n.nominal_mbps;
        Ok(())
    }

    /// Every failed NIC, in (node, rail) order.
    pub fn failed_nics(&self) -> Vec<NicId> {
        let mut out = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            for (r, nic) in node.nics.iter().enumerate() {
                if nic.is_failed() {
                    out.push(NicId::new(i as u32, r as u16));
                }
            }
        }
        out
    }

    /// Nodes that have no usable NIC left.
    pub fn disconnected_nodes(&self) -> Vec<NodeId> {
        (0..self.nodes.len()).filter(|&i| !self.nodes[i].is_connected()).map(|i| NodeId(i as u32)).collect()
    }

    /// Whether any NIC is failed or degraded.
    pub fn is_degraded(&self) -> bool {
        self.nodes.iter().flat_map(|n| &n.nics).any(|n| n.usable_mbps < n.nominal_mbps)
    }

    /// Merge another rank's view into this one: union of failures, minimum of usable
    /// bandwidth, maximum of the epochs. Commutative, associative and idempotent, so
    /// every rank that merges the same set of views gets the same result.
    pub fn merge_from(&mut self, other: &HealthView) -> Result<(), HealthError> {
        let same_shape = self.nodes.len() == other.nodes.len()
            && self.nodes.iter().zip(&other.nodes).all(|(a, b)| a.nics.len() == b.nics.len());
        if !same_shape {
            return Err(HealthError::ShapeMismatch { ours: self.nodes.len(), theirs: other.nodes.len() });
        }
        for (a, b) in self.nodes.iter_mut().zip(&other.nodes) {
            for (x, y) in a.nics.iter_mut().zip(&b.nics) {
                x.nominal_mbps = x.nominal_mbps.max(y.nominal_mbps);
                x.usable_mbps = x.usable_mbps.min(y.usable_mbps);
            }
        }
        self.epoch = self.epoch.max(other.epoch);
        Ok(())
    }

    /// A stable 64-bit fingerprint of the epoch and every NIC's health (FNV-1a), equal
    /// on every rank and platform for equal views.
    pub fn digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |v: u64| {
            for b in v.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        eat(self.epoch.0);
        eat(self.nodes.len() as u64);
        for node in &self.nodes {
            eat(node.nics.len() as u64);
            for nic in &node.nics {
                eat(nic.nominal_mbps);
                eat(nic.usable_mbps);
            }
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_is_union_of_failures_and_keeps_max_epoch() {
        let mut a = HealthView::uniform(3, 2, 100_000);
        let mut b = a.clone();
        a.set_failed(NicId::new(0, 1)).unwrap();
        b.set_usable(NicId::new(2, 0), 40_000).unwrap();
        b.set_epoch(HealthEpoch(7));
        let mut ab = a.clone();
        ab.merge_from(&b).unwrap();
        let mut ba = b.clone();
        ba.merge_from(&a).unwrap();
        assert_eq!(ab, ba);
        assert_eq!(ab.digest(), ba.digest());
        assert_eq!(ab.epoch(), HealthEpoch(7));
        assert_eq!(ab.failed_nics(), vec![NicId::new(0, 1)]);
        assert_eq!(ab.nic(NicId::new(2, 0)).unwrap().usable_mbps, 40_000);
        assert!((ab.node(NodeId(0)).unwrap().lost_fraction() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn unknown_nic_and_shape_mismatch_are_errors() {
        let mut a = HealthView::uniform(2, 2, 1000);
        assert_eq!(a.set_failed(NicId::new(0, 5)), Err(HealthError::UnknownNic(NicId::new(0, 5))));
        assert!(a.is_failed(NicId::new(9, 0)).is_err());
        let b = HealthView::uniform(3, 2, 1000);
        assert!(matches!(a.merge_from(&b), Err(HealthError::ShapeMismatch { .. })));
    }

    #[test]
    fn disconnected_nodes_are_reported() {
        let mut a = HealthView::uniform(2, 2, 1000);
        a.set_failed(NicId::new(1, 0)).unwrap();
        assert!(a.disconnected_nodes().is_empty());
        a.set_failed(NicId::new(1, 1)).unwrap();
        assert_eq!(a.disconnected_nodes(), vec![NodeId(1)]);
        assert_eq!(a.node(NodeId(1)).unwrap().healthy_rails().count(), 0);
    }
}
