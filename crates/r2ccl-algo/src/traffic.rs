//! Traffic accounting of built schedules: bytes per NIC (node, rail) in each direction,
//! per rank, inside nodes, and forwarded through a node peer's NIC.

use crate::layout::Layout;
use crate::schedule::{RankSchedule, StepKind};
use crate::AlgoError;
use r2ccl_core::{NicId, NodeId, Rank};

/// Bytes moved by a set of schedules (usually every rank's schedule of one collective).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traffic {
    nics: usize,
    tx: Vec<u64>,
    rx: Vec<u64>,
    rank_tx: Vec<u64>,
    rank_rx: Vec<u64>,
    intra: Vec<u64>,
    forwarded: Vec<u64>,
}

impl Traffic {
    /// Account every send of `schedules` (its inter-node bytes split over NICs exactly as
    /// [`crate::RailSplit::divide`] splits them) and every receive (per rank).
    pub fn of(layout: &Layout, schedules: &[RankSchedule]) -> Result<Self, AlgoError> {
        let k = layout.nics_per_node();
        let nodes = layout.nodes();
        let mut t = Traffic {
            nics: k,
            tx: vec![0; nodes * k],
            rx: vec![0; nodes * k],
            rank_tx: vec![0; layout.ranks()],
            rank_rx: vec![0; layout.ranks()],
            intra: vec![0; nodes],
            forwarded: vec![0; nodes],
        };
        for s in schedules {
            let src_node = layout.node_of(s.rank)?.index();
            let own = layout.own_rail(s.rank)?;
            let elem = s.dtype.size() as u64;
            for step in s.steps() {
                match step.kind {
                    StepKind::Send { peer, src, split, .. } => {
                        let dst_node = layout.node_of(peer)?.index();
                        t.rank_tx[s.rank.index()] += src.len;
                        match s.split(split) {
                            None => t.intra[src_node] += src.len,
                            Some(sp) => {
                                for (part, bytes) in sp.parts.iter().zip(sp.divide(src.len, elem)) {
                                    t.tx[src_node * k + part.src.index()] += bytes;
                                    t.rx[dst_node * k + part.dst.index()] += bytes;
                                    if part.src != own {
                                        t.forwarded[src_node] += bytes;
                                    }
                                }
                            }
                        }
                    }
                    StepKind::Recv { dst, .. } => t.rank_rx[s.rank.index()] += dst.len,
                    _ => {}
                }
            }
        }
        Ok(t)
    }

    /// NICs per node.
    pub fn nics_per_node(&self) -> usize {
        self.nics
    }

    /// Bytes sent through `nic` (0 for an unknown NIC).
    pub fn nic_tx(&self, nic: NicId) -> u64 {
        self.at(&self.tx, nic)
    }

    /// Bytes received through `nic` (0 for an unknown NIC).
    pub fn nic_rx(&self, nic: NicId) -> u64 {
        self.at(&self.rx, nic)
    }

    fn at(&self, v: &[u64], nic: NicId) -> u64 {
        if nic.rail.index() >= self.nics {
            return 0;
        }
        v.get(nic.node.index() * self.nics + nic.rail.index()).copied().unwrap_or(0)
    }

    /// Bytes leaving `node` over its NICs.
    pub fn node_tx(&self, node: NodeId) -> u64 {
        self.tx.get(node.index() * self.nics..(node.index() + 1) * self.nics).map_or(0, |s| s.iter().sum())
    }

    /// Bytes entering `node` over its NICs.
    pub fn node_rx(&self, node: NodeId) -> u64 {
        self.rx.get(node.index() * self.nics..(node.index() + 1) * self.nics).map_or(0, |s| s.iter().sum())
    }

    /// Bytes `rank` sends (inside and across nodes).
    pub fn rank_tx(&self, rank: Rank) -> u64 {
        self.rank_tx.get(rank.index()).copied().unwrap_or(0)
    }

    /// Bytes `rank` receives.
    pub fn rank_rx(&self, rank: Rank) -> u64 {
        self.rank_rx.get(rank.index()).copied().unwrap_or(0)
    }

    /// Bytes sent between ranks of `node` without a NIC.
    pub fn intra_node(&self, node: NodeId) -> u64 {
        self.intra.get(node.index()).copied().unwrap_or(0)
    }

    /// Bytes of `node`'s ranks that leave through a NIC other than the sender's own
    /// (forwarded inside the node first).
    pub fn forwarded(&self, node: NodeId) -> u64 {
        self.forwarded.get(node.index()).copied().unwrap_or(0)
    }

    /// Total bytes crossing the network.
    pub fn total_inter_node(&self) -> u64 {
        self.tx.iter().sum()
    }
}
