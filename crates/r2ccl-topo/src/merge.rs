//! The cluster view merged from every rank's local view (the facade gathers them at
//! init over the bootstrap network).

use crate::error::MergeError;
use crate::model::{ClusterTopology, NodeTopology, RankPlacement};
use r2ccl_core::{NodeId, Rank};
use serde::{Deserialize, Serialize};

/// What one rank reports about itself and its node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalView {
    /// The reporting rank.
    pub rank: Rank,
    /// Tells nodes apart (see [`crate::discover::host_key`]); ranks with equal keys
    /// share a node.
    pub host_key: String,
    /// The rank's GPU device index, if any.
    pub gpu: Option<u32>,
    /// The NUMA node the rank is bound to, if known (defaults to its GPU's).
    pub numa: Option<u32>,
    /// The node as this rank sees it.
    pub node: NodeTopology,
}

impl ClusterTopology {
    /// Merge every rank's local view into the cluster view.
    ///
    /// Nodes are numbered by their lowest rank, so every rank that merges the same
    /// set of views (in any order) gets the same view. Ranks sharing a host key must
    /// report equal node topologies. Each node's host name becomes its host key. The
    /// rail count is the most NICs any node has; validation then requires every node
    /// to have all of them.
    pub fn merge(views: &[LocalView]) -> Result<Self, MergeError> {
        if views.is_empty() {
            return Err(MergeError::Empty);
        }
        let mut sorted: Vec<&LocalView> = views.iter().collect();
        sorted.sort_by_key(|v| v.rank);
        let mut hosts: Vec<(&str, Rank, &NodeTopology)> = Vec::new();
        let mut ranks = Vec::with_capacity(sorted.len());
        for v in sorted {
            let node = match hosts.iter().position(|(h, _, _)| *h == v.host_key) {
                Some(i) => {
                    let (_, first, topo) = hosts[i];
                    if *topo != v.node {
                        return Err(MergeError::ConflictingViews {
                            host: v.host_key.clone(),
                            first: first.0,
                            rank: v.rank.0,
                        });
                    }
                    i
                }
                None => {
                    hosts.push((&v.host_key, v.rank, &v.node));
                    hosts.len() - 1
                }
            };
            let numa = v.numa.or_else(|| v.gpu.and_then(|g| v.node.gpu(g)).and_then(|g| g.numa));
            ranks.push(RankPlacement { rank: v.rank, node: NodeId(node as u32), gpu: v.gpu, numa });
        }
        let nodes: Vec<NodeTopology> =
            hosts.iter().map(|(h, _, t)| NodeTopology { hostname: (*h).to_owned(), ..(*t).clone() }).collect();
        let rails = nodes.iter().map(|n| n.nics.len()).max().unwrap_or(0);
        let rails = u16::try_from(rails).unwrap_or(u16::MAX);
        Ok(ClusterTopology::new(None, rails, nodes, ranks)?)
    }
}
