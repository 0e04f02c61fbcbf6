//! What the session needs to know about the cluster: which node each rank is on, how many NICs
//! each node has, and for every NIC its chain of backups on the same node, best first. Built
//! from r2ccl-topo's cluster model (`TryFrom<&ClusterTopology>`) or, in tests, by hand.

use r2ccl_core::{NicId, NodeId, RailId, Rank};
use std::collections::BTreeMap;

/// Why a topology was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// A rank sits on a node that the NIC table does not have.
    #[error("{rank} is on {node}, but only {nodes} nodes have NICs")]
    UnknownNode {
        /// The rank.
        rank: Rank,
        /// Its node.
        node: NodeId,
        /// Number of nodes known.
        nodes: usize,
    },
    /// A node has no NIC.
    #[error("{0} has no NIC")]
    NoNic(NodeId),
    /// A backup chain names a NIC that does not exist, is on another node, or is the NIC itself.
    #[error("backup chain of {nic} names {backup}, which is not another NIC of the same node")]
    BadBackup {
        /// The NIC whose chain is wrong.
        nic: NicId,
        /// The wrong entry.
        backup: NicId,
    },
    /// `numa_groups` does not divide the NIC count.
    #[error("{nics} NICs per node cannot be split into {groups} NUMA groups")]
    BadGroups {
        /// NICs per node.
        nics: u16,
        /// Groups asked for.
        groups: u16,
    },
}

/// Ranks, nodes, NICs and backup chains (input to the session; the topology crate or the
/// configuration produces it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    rank_node: Vec<NodeId>,
    nics_per_node: Vec<u16>,
    chains: BTreeMap<NicId, Vec<NicId>>,
}

impl Topology {
    /// A topology from its parts: the node of every rank, the NIC count of every node, and for
    /// every NIC its backups on the same node ordered by locality (same NUMA node / PCIe switch
    /// first). NICs without an entry get an empty chain.
    pub fn new(
        rank_node: Vec<NodeId>,
        nics_per_node: Vec<u16>,
        chains: BTreeMap<NicId, Vec<NicId>>,
    ) -> Result<Self, TopologyError> {
        for (r, &node) in rank_node.iter().enumerate() {
            if node.index() >= nics_per_node.len() {
                let rank = Rank(u32::try_from(r).unwrap_or(u32::MAX));
                return Err(TopologyError::UnknownNode { rank, node, nodes: nics_per_node.len() });
            }
        }
        for (n, &k) in nics_per_node.iter().enumerate() {
            if k == 0 {
                return Err(TopologyError::NoNic(NodeId(u32::try_from(n).unwrap_or(u32::MAX))));
            }
        }
        let topo = Self { rank_node, nics_per_node, chains };
        for (&nic, chain) in &topo.chains {
            for &b in chain {
                if b == nic || b.node != nic.node || !topo.has_nic(b) || !topo.has_nic(nic) {
                    return Err(TopologyError::BadBackup { nic, backup: b });
                }
            }
        }
        Ok(topo)
    }

    /// `nodes` nodes with `ranks_per_node` ranks (rank r on node r / ranks_per_node) and `nics`
    /// NICs each, split into `numa_groups` equal groups of consecutive rails. Every NIC's chain
    /// lists its own group first, then the other groups, each by rail distance.
    pub fn uniform(nodes: u32, ranks_per_node: u32, nics: u16, numa_groups: u16) -> Result<Self, TopologyError> {
        if numa_groups == 0 || !nics.is_multiple_of(numa_groups) {
            return Err(TopologyError::BadGroups { nics, groups: numa_groups });
        }
        let per_group = nics / numa_groups;
        let rank_node = (0..nodes * ranks_per_node).map(|r| NodeId(r / ranks_per_node.max(1))).collect();
        let mut chains = BTreeMap::new();
        for node in 0..nodes {
            for rail in 0..nics {
                let mut others: Vec<u16> = (0..nics).filter(|&o| o != rail).collect();
                others.sort_by_key(|&o| (o / per_group != rail / per_group, o.abs_diff(rail), o));
                chains.insert(NicId::new(node, rail), others.into_iter().map(|o| NicId::new(node, o)).collect());
            }
        }
        Self::new(rank_node, vec![nics; nodes as usize], chains)
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.rank_node.len()
    }

    /// The node of `rank`, if the rank exists.
    pub fn node_of(&self, rank: Rank) -> Option<NodeId> {
        self.rank_node.get(rank.index()).copied()
    }

    /// The NICs of `node`, by rail (empty for an unknown node).
    pub fn nics_of(&self, node: NodeId) -> Vec<NicId> {
        let k = self.nics_per_node.get(node.index()).copied().unwrap_or(0);
        (0..k).map(|r| NicId { node, rail: RailId(r) }).collect()
    }

    /// Whether `nic` exists.
    pub fn has_nic(&self, nic: NicId) -> bool {
        self.nics_per_node.get(nic.node.index()).is_some_and(|&k| nic.rail.0 < k)
    }

    /// The backup chain of `nic`, best first (empty if none was given).
    pub fn chain(&self, nic: NicId) -> &[NicId] {
        self.chains.get(&nic).map_or(&[], Vec::as_slice)
    }
}

impl TryFrom<&r2ccl_topo::ClusterTopology> for Topology {
    type Error = TopologyError;

    /// Every rank's node, every node's NICs, and each NIC's backup chain as r2ccl-topo orders it
    /// ([`r2ccl_topo::NodeTopology::backup_chain`]: same PCIe switch, host bridge, NUMA node
    /// first, each group in rail order after the NIC).
    fn try_from(cluster: &r2ccl_topo::ClusterTopology) -> Result<Self, Self::Error> {
        let mut chains = BTreeMap::new();
        let mut nics_per_node = Vec::with_capacity(cluster.nodes().len());
        for (n, node) in cluster.nodes().iter().enumerate() {
            let id = NodeId(u32::try_from(n).unwrap_or(u32::MAX));
            nics_per_node.push(u16::try_from(node.nics.len()).unwrap_or(u16::MAX));
            for nic in &node.nics {
                let chain = node.backup_chain(nic.rail).into_iter().map(|rail| NicId { node: id, rail }).collect();
                chains.insert(NicId { node: id, rail: nic.rail }, chain);
            }
        }
        Self::new(cluster.ranks().iter().map(|p| p.node).collect(), nics_per_node, chains)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_chains_prefer_same_group() {
        let t = Topology::uniform(2, 1, 4, 2).unwrap();
        assert_eq!(t.chain(NicId::new(1, 0)), &[NicId::new(1, 1), NicId::new(1, 2), NicId::new(1, 3)]);
        assert_eq!(t.chain(NicId::new(0, 2)), &[NicId::new(0, 3), NicId::new(0, 1), NicId::new(0, 0)]);
        assert_eq!(t.node_of(Rank(1)), Some(NodeId(1)));
        assert!(Topology::uniform(1, 1, 3, 2).is_err());
    }
}
