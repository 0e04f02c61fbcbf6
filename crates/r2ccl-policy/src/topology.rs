//! The planner's own small topology input: nodes, NICs (rails) with line rates, ranks per
//! node, per-hop latency and intra-node bandwidth.
//!
//! The caller builds a [`Topology`] from r2ccl-topo's cluster model (`TryFrom<&ClusterTopology>`:
//! the facade, from the NICs every rank announced) or through [`Topology::new`] /
//! [`Topology::uniform`] (the simulator, `r2ccl-plan` and tests), then the builder methods; the
//! planner never looks at anything else about the machine.

use serde::{Deserialize, Serialize};

/// Why a topology description was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TopologyError {
    /// The cluster has no node.
    #[error("topology has zero nodes")]
    ZeroNodes,
    /// A node has no NIC at all.
    #[error("node {node} has zero NICs (every node needs at least one inter-node NIC)")]
    ZeroNics {
        /// The node index.
        node: usize,
    },
    /// Nodes have different NIC counts; rails are NIC indices and must exist on every node.
    #[error("node {node} has {found} NICs but node 0 has {expected}; every node must have the same number of rails")]
    RailCountMismatch {
        /// The node index.
        node: usize,
        /// NIC count of node 0.
        expected: usize,
        /// NIC count of this node.
        found: usize,
    },
    /// A NIC's line rate is zero.
    #[error("NIC {rail} of node {node} has a line rate of 0 Mbit/s")]
    ZeroNicRate {
        /// The node index.
        node: usize,
        /// The rail index.
        rail: usize,
    },
    /// Zero ranks per node.
    #[error("ranks per node must be at least 1, got 0")]
    ZeroRanksPerNode,
    /// More rails than a `RailId` can name.
    #[error("{0} NICs per node is more than the 64 rails the planner supports")]
    TooManyRails(usize),
    /// The per-hop latency is negative or not finite.
    #[error("per-hop latency must be finite and >= 0 seconds, got {0}")]
    BadAlpha(f64),
    /// The intra-node bandwidth is not positive and finite.
    #[error("intra-node bandwidth must be finite and > 0 Gbit/s, got {0}")]
    BadIntraBandwidth(f64),
    /// The spine share is outside 0..=1000 per mille.
    #[error("cross-rail (spine) share must be within 0..=1000 per mille, got {0}")]
    BadSpineShare(u32),
    /// The cost model needs ranks numbered node by node, the same number on every node.
    #[error("rank {rank} is on node {node}; the cost model needs ranks numbered node by node, {per_node} per node")]
    NotNodeByNode {
        /// The first rank out of place.
        rank: u32,
        /// Its node.
        node: u32,
        /// Ranks per node if the placement were even.
        per_node: u32,
    },
}

/// One node as the planner sees it: the line rate of each of its NICs, indexed by rail.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Line rate of NIC `r` in Mbit/s (same unit as `r2ccl_core::NicHealth`).
    pub nic_mbps: Vec<u64>,
}

/// The cluster shape and link parameters the cost model needs.
///
/// Bandwidths are integers in Mbit/s so that ring re-ranking compares exact values; the
/// cost model converts to bytes per second (1 Mbit/s = 125 000 B/s).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    nodes: Vec<NodeSpec>,
    ranks_per_node: u32,
    alpha_s: f64,
    /// Per-hop latency inside a node; `None`: the same as `alpha_s`.
    intra_alpha_s: Option<f64>,
    intra_gbps: f64,
    spine_permille: u32,
    /// Whether the planner may re-rank the ring order of nodes after failures.
    #[serde(default = "rerank_default")]
    rerank: bool,
}

const fn rerank_default() -> bool {
    true
}

/// Default per-hop latency: 5 microseconds (RDMA NIC to NIC through one switch, plus software).
pub const DEFAULT_ALPHA_S: f64 = 5e-6;
/// The per-message latency the r2ccl communicator plans with over its UCX transport: 20
/// microseconds (TCP or RDMA through UCX, plus the engine's chunk handling). `cargo xtask bench`
/// and `cargo xtask e2e` give `r2ccl-plan` the same, so their predictions are the library's.
pub const COMMUNICATOR_ALPHA_S: f64 = 20e-6;
/// Default intra-node bandwidth per rank in Gbit/s (NVLink-class, 300 GB/s).
pub const DEFAULT_INTRA_GBPS: f64 = 2400.0;
/// Default capacity of cross-rail traffic through the spine, per mille of the smaller
/// node's NIC bandwidth (an oversubscribed spine; 0 = rail-only fabric).
pub const DEFAULT_SPINE_PERMILLE: u32 = 500;

impl Topology {
    /// A topology from explicit nodes, with one rank per node and default latency,
    /// intra-node bandwidth and spine share.
    pub fn new(nodes: Vec<NodeSpec>) -> Result<Self, TopologyError> {
        let t = Self {
            nodes,
            ranks_per_node: 1,
            alpha_s: DEFAULT_ALPHA_S,
            intra_alpha_s: None,
            intra_gbps: DEFAULT_INTRA_GBPS,
            spine_permille: DEFAULT_SPINE_PERMILLE,
            rerank: true,
        };
        t.validate()?;
        Ok(t)
    }

    /// `nodes` nodes with `nics` NICs of `nic_mbps` each.
    pub fn uniform(nodes: usize, nics: usize, nic_mbps: u64) -> Result<Self, TopologyError> {
        Self::new(vec![NodeSpec { nic_mbps: vec![nic_mbps; nics] }; nodes])
    }

    /// Set the number of ranks (GPUs or processes) per node.
    pub fn with_ranks_per_node(mut self, ranks: u32) -> Result<Self, TopologyError> {
        if ranks == 0 {
            return Err(TopologyError::ZeroRanksPerNode);
        }
        self.ranks_per_node = ranks;
        Ok(self)
    }

    /// Set the per-hop latency alpha in seconds (0 = pure bandwidth model).
    pub fn with_alpha(mut self, alpha_s: f64) -> Result<Self, TopologyError> {
        if !alpha_s.is_finite() || alpha_s < 0.0 {
            return Err(TopologyError::BadAlpha(alpha_s));
        }
        self.alpha_s = alpha_s;
        Ok(self)
    }

    /// Set the per-hop latency of intra-node transfers (NVLink/PCIe/shared memory) in seconds;
    /// without it intra-node hops cost [`Topology::alpha_s`] as well.
    pub fn with_intra_alpha(mut self, alpha_s: f64) -> Result<Self, TopologyError> {
        if !alpha_s.is_finite() || alpha_s < 0.0 {
            return Err(TopologyError::BadAlpha(alpha_s));
        }
        self.intra_alpha_s = Some(alpha_s);
        Ok(self)
    }

    /// Set the intra-node (NVLink/PCIe/shared memory) bandwidth per rank in Gbit/s.
    pub fn with_intra_gbps(mut self, gbps: f64) -> Result<Self, TopologyError> {
        if !gbps.is_finite() || gbps <= 0.0 {
            return Err(TopologyError::BadIntraBandwidth(gbps));
        }
        self.intra_gbps = gbps;
        Ok(self)
    }

    /// Set the spine's capacity for cross-rail traffic, per mille of the smaller node's
    /// usable NIC bandwidth (0 = rail-only fabric: cross-rail pairs have no direct path).
    pub fn with_spine_permille(mut self, permille: u32) -> Result<Self, TopologyError> {
        if permille > 1000 {
            return Err(TopologyError::BadSpineShare(permille));
        }
        self.spine_permille = permille;
        Ok(self)
    }

    /// Whether the planner may re-rank the ring order of nodes (MECHANISMS.md: a degraded node
    /// between two healthy ones, fewer slow hops); on by default. Off, every ring follows node
    /// order (config key `policy.rerank`).
    #[must_use]
    pub const fn with_rerank(mut self, on: bool) -> Self {
        self.rerank = on;
        self
    }

    /// Whether the planner may re-rank the ring order ([`Topology::with_rerank`]).
    pub const fn rerank(&self) -> bool {
        self.rerank
    }

    fn validate(&self) -> Result<(), TopologyError> {
        let first = self.nodes.first().ok_or(TopologyError::ZeroNodes)?;
        let k = first.nic_mbps.len();
        if k > 64 {
            return Err(TopologyError::TooManyRails(k));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if n.nic_mbps.is_empty() {
                return Err(TopologyError::ZeroNics { node: i });
            }
            if n.nic_mbps.len() != k {
                return Err(TopologyError::RailCountMismatch { node: i, expected: k, found: n.nic_mbps.len() });
            }
            if let Some(r) = n.nic_mbps.iter().position(|&m| m == 0) {
                return Err(TopologyError::ZeroNicRate { node: i, rail: r });
            }
        }
        Ok(())
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// NICs (rails) per node.
    pub fn rails(&self) -> usize {
        self.nodes.first().map_or(0, |n| n.nic_mbps.len())
    }

    /// All nodes, indexed by node id.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }

    /// Ranks per node.
    pub const fn ranks_per_node(&self) -> u32 {
        self.ranks_per_node
    }

    /// Total ranks of the communicator.
    pub fn rank_count(&self) -> u64 {
        self.nodes.len() as u64 * u64::from(self.ranks_per_node)
    }

    /// Per-hop latency in seconds.
    pub const fn alpha_s(&self) -> f64 {
        self.alpha_s
    }

    /// Per-hop latency of intra-node transfers, seconds ([`Topology::alpha_s`] unless set).
    pub fn intra_alpha_s(&self) -> f64 {
        self.intra_alpha_s.unwrap_or(self.alpha_s)
    }

    /// Intra-node bandwidth per rank, Gbit/s.
    pub const fn intra_gbps(&self) -> f64 {
        self.intra_gbps
    }

    /// Spine share for cross-rail traffic, per mille.
    pub const fn spine_permille(&self) -> u32 {
        self.spine_permille
    }
}

impl TryFrom<&r2ccl_topo::ClusterTopology> for Topology {
    type Error = TopologyError;

    /// Each node's NICs at their line rates by rail, and its ranks (numbered node by node, the
    /// same count on every node); latency, intra-node bandwidth and spine share at their
    /// defaults.
    fn try_from(cluster: &r2ccl_topo::ClusterTopology) -> Result<Self, Self::Error> {
        let nodes: Vec<NodeSpec> = cluster
            .nodes()
            .iter()
            .map(|n| NodeSpec { nic_mbps: n.nics.iter().map(|nic| nic.speed_mbps).collect() })
            .collect();
        let per_node = u32::try_from(cluster.ranks().len() / nodes.len().max(1)).unwrap_or(u32::MAX);
        for p in cluster.ranks() {
            if per_node == 0
                || p.node.0 != p.rank.0 / per_node
                || per_node as usize * nodes.len() != cluster.ranks().len()
            {
                return Err(TopologyError::NotNodeByNode { rank: p.rank.0, node: p.node.0, per_node });
            }
        }
        Self::new(nodes)?.with_ranks_per_node(per_node.max(1))
    }
}
