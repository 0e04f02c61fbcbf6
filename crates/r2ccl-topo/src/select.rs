//! NIC selection: each rank's primary NICs and its ordered chain of backups.

use crate::model::ClusterTopology;
use crate::pci::PathClass;
use r2ccl_core::{HealthView, NicId, NodeId, RailId, Rank};
use serde::{Deserialize, Serialize};

/// One NIC in a rank's chain with its distance class from the rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankedNic {
    /// The NIC.
    pub nic: NicId,
    /// Distance class from the rank's GPU (or NUMA node) to the NIC.
    pub class: PathClass,
}

/// A rank's NICs: primaries (every NIC at the nearest class) then backups.
///
/// Order: by distance class (same PCIe switch, then further switches, host bridge,
/// same NUMA node, then the rest); inside a class by rail distance going up from the
/// first primary's rail (cyclically), so ranks whose primaries differ spread their
/// backups over different NICs. The order is a pure function of the topology, so
/// every rank computes the same chains.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicSelection {
    /// The rank.
    pub rank: Rank,
    /// Its node.
    pub node: NodeId,
    /// Every NIC of the node, nearest first.
    pub chain: Vec<RankedNic>,
    /// How many leading entries of `chain` are primaries.
    pub primary_count: usize,
}

impl NicSelection {
    /// The primary NICs.
    pub fn primaries(&self) -> impl Iterator<Item = NicId> + '_ {
        self.chain[..self.primary_count].iter().map(|r| r.nic)
    }

    /// The backups, in the order to fail over to.
    pub fn backups(&self) -> impl Iterator<Item = NicId> + '_ {
        self.chain[self.primary_count..].iter().map(|r| r.nic)
    }

    /// Rails of the chain, nearest first.
    pub fn rails(&self) -> Vec<RailId> {
        self.chain.iter().map(|r| r.nic.rail).collect()
    }

    /// The first NIC of the chain that `view` does not mark failed (NICs the view
    /// does not know count as failed).
    pub fn first_usable(&self, view: &HealthView) -> Option<NicId> {
        self.chain.iter().map(|r| r.nic).find(|&n| matches!(view.is_failed(n), Ok(false)))
    }
}

impl ClusterTopology {
    /// The NIC selection of `rank`; `None` for an unknown rank.
    pub fn select_nics(&self, rank: Rank) -> Option<NicSelection> {
        let p = self.rank(rank)?;
        let node = self.node(p.node)?;
        let mut ranked: Vec<RankedNic> = node
            .nics
            .iter()
            .filter_map(|n| {
                Some(RankedNic { nic: NicId { node: p.node, rail: n.rail }, class: self.rank_nic_class(rank, n.rail)? })
            })
            .collect();
        let best = ranked.iter().map(|r| r.class).min()?;
        let anchor = ranked.iter().filter(|r| r.class == best).map(|r| r.nic.rail.0).min().unwrap_or(0);
        let k = u32::from(self.rails().max(1));
        let distance = |rail: RailId| (u32::from(rail.0) + k - u32::from(anchor) % k) % k;
        ranked.sort_by_key(|r| (r.class, distance(r.nic.rail), r.nic.rail));
        let primary_count = ranked.iter().take_while(|r| r.class == best).count();
        Some(NicSelection { rank, node: p.node, chain: ranked, primary_count })
    }

    /// The NIC selection of every rank, in rank order (ranks on nodes without NICs
    /// are left out).
    pub fn nic_selections(&self) -> Vec<NicSelection> {
        self.ranks().iter().filter_map(|r| self.select_nics(r.rank)).collect()
    }
}
