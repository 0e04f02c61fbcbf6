//! Identifier newtypes: ranks, nodes, rails and NICs.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A rank in a communicator (0-based, dense).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Rank(pub u32);

/// A node (server) of the cluster (0-based, dense in a communicator's cluster view).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

/// A rail: NIC index `r` on every node; in a rail-optimized fabric NIC `r` of every
/// node hangs off rail switch `r`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RailId(pub u16);

/// One NIC: the NIC on rail `rail` of node `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NicId {
    /// The node that holds the NIC.
    pub node: NodeId,
    /// The NIC's rail index on that node.
    pub rail: RailId,
}

impl NicId {
    /// The NIC on rail `rail` of node `node`.
    pub const fn new(node: u32, rail: u16) -> Self {
        Self { node: NodeId(node), rail: RailId(rail) }
    }
}

impl Rank {
    /// The rank as an index into per-rank arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl NodeId {
    /// The node as an index into per-node arrays.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl RailId {
    /// The rail as an index into per-NIC arrays of a node.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

impl fmt::Display for RailId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rail{}", self.0)
    }
}

impl fmt::Display for NicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/nic{}", self.node, self.rail.0)
    }
}
