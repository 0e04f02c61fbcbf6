//! The effective fabric: a topology combined with a health view into per-NIC usable
//! bandwidth, healthy-rail masks, and rail-aligned pair capacities between nodes.

use crate::topology::Topology;
use crate::PlanError;
use r2ccl_core::{HealthEpoch, HealthView, NicHealth, NodeHealth, NodeId};

/// Bytes per second in one Mbit/s.
pub(crate) const BYTES_PER_MBPS: f64 = 125_000.0;

/// Bit mask with the low `k` bits set.
pub(crate) const fn full_mask(k: usize) -> u64 {
    if k >= 64 {
        u64::MAX
    } else {
        (1u64 << k) - 1
    }
}

/// Usable bandwidth of every NIC, derived from a topology and a health view.
#[derive(Clone, Debug)]
pub(crate) struct Fabric {
    /// Rails per node.
    pub k: usize,
    /// Usable Mbit/s, `[node * k + rail]`.
    pub bw: Vec<u64>,
    /// Nominal Mbit/s from the topology, `[node * k + rail]`.
    pub nominal: Vec<u64>,
    /// Healthy-rail bit mask per node.
    pub mask: Vec<u64>,
    /// Sum of usable Mbit/s per node.
    pub node_bw: Vec<u64>,
    /// Spine share for cross-rail pairs, per mille.
    pub spine_permille: u32,
}

impl Fabric {
    /// Combine `topo` and `health`. A NIC's usable rate is its topology line rate scaled by
    /// the health view's usable/nominal fraction (so the two may use different scales).
    pub(crate) fn new(topo: &Topology, health: &HealthView) -> Result<Self, PlanError> {
        let n = topo.node_count();
        let k = topo.rails();
        if health.node_count() != n {
            return Err(PlanError::HealthShape { topology_nodes: n, health_nodes: health.node_count() });
        }
        let mut bw = Vec::with_capacity(n * k);
        let mut nominal = Vec::with_capacity(n * k);
        let mut mask = Vec::with_capacity(n);
        let mut node_bw = Vec::with_capacity(n);
        for (i, (spec, h)) in topo.nodes().iter().zip(health.nodes()).enumerate() {
            if h.nics.len() != k {
                return Err(PlanError::HealthRails {
                    node: NodeId(i as u32),
                    topology_rails: k,
                    health_rails: h.nics.len(),
                });
            }
            let mut m = 0u64;
            let mut sum = 0u64;
            for (r, (&line, nh)) in spec.nic_mbps.iter().zip(&h.nics).enumerate() {
                let usable = if nh.nominal_mbps == 0 || nh.usable_mbps == 0 {
                    0
                } else {
                    let frac = u128::from(nh.usable_mbps.min(nh.nominal_mbps));
                    (u128::from(line) * frac / u128::from(nh.nominal_mbps)) as u64
                };
                if usable > 0 {
                    m |= 1 << r;
                }
                sum += usable;
                bw.push(usable);
                nominal.push(line);
            }
            if m == 0 {
                return Err(PlanError::NodeDisconnected(NodeId(i as u32)));
            }
            mask.push(m);
            node_bw.push(sum);
        }
        Ok(Self { k, bw, nominal, mask, node_bw, spine_permille: topo.spine_permille() })
    }

    /// The same fabric with every NIC healthy at its line rate.
    pub(crate) fn nominal(&self) -> Self {
        let n = self.node_count();
        let full = full_mask(self.k);
        let node_bw = (0..n).map(|i| self.nominal[i * self.k..(i + 1) * self.k].iter().sum()).collect();
        Self {
            k: self.k,
            bw: self.nominal.clone(),
            nominal: self.nominal.clone(),
            mask: vec![full; n],
            node_bw,
            spine_permille: self.spine_permille,
        }
    }

    /// Number of nodes.
    pub(crate) fn node_count(&self) -> usize {
        self.mask.len()
    }

    /// Usable Mbit/s of NIC `r` on node `i`.
    pub(crate) fn nic(&self, i: usize, r: usize) -> u64 {
        self.bw[i * self.k + r]
    }

    /// Whether any NIC is failed.
    pub(crate) fn has_failure(&self) -> bool {
        self.bw.contains(&0)
    }

    /// Whether any NIC runs below its line rate (failed or degraded).
    pub(crate) fn is_degraded(&self) -> bool {
        self.bw.iter().zip(&self.nominal).any(|(b, n)| b < n)
    }

    /// Rail-aligned capacity between nodes `i` and `j`: the sum over rails healthy on both
    /// of the smaller NIC rate (Mbit/s).
    pub(crate) fn same_rail(&self, i: usize, j: usize) -> u64 {
        let common = self.mask[i] & self.mask[j];
        if common == full_mask(self.k) {
            // Fast path: every rail usable on both ends.
            let (a, b) = (&self.bw[i * self.k..(i + 1) * self.k], &self.bw[j * self.k..(j + 1) * self.k]);
            return a.iter().zip(b).map(|(x, y)| (*x).min(*y)).sum();
        }
        let mut sum = 0;
        let mut m = common;
        while m != 0 {
            let r = m.trailing_zeros() as usize;
            sum += self.nic(i, r).min(self.nic(j, r));
            m &= m - 1;
        }
        sum
    }

    /// Capacity through the spine for a cross-rail pair (Mbit/s).
    pub(crate) fn spine(&self, i: usize, j: usize) -> u64 {
        let m = u128::from(self.node_bw[i].min(self.node_bw[j]));
        (m * u128::from(self.spine_permille) / 1000) as u64
    }

    /// Pair capacity as the Balance split uses it: rail-aligned over the rails usable at
    /// both ends; only when the two nodes share no usable rail, the spine's share.
    /// Returns (Mbit/s, whether the spine path is used).
    pub(crate) fn pair(&self, i: usize, j: usize) -> (u64, bool) {
        let s = self.same_rail(i, j);
        if s > 0 {
            (s, false)
        } else {
            (self.spine(i, j), true)
        }
    }

    /// Cross-rail hops on the pair: rails healthy on one end only (each such channel is
    /// rerouted through an intra-node hop), plus the rail count when the spine is used.
    pub(crate) fn cross(&self, i: usize, j: usize) -> u32 {
        let d = (self.mask[i] ^ self.mask[j]).count_ones();
        if self.mask[i] & self.mask[j] == 0 {
            d + self.k as u32
        } else {
            d
        }
    }

    /// The health view `r2ccl-algo` builds schedules from: nominal = the topology's line
    /// rate, usable = this fabric's usable rate (so both crates see the same bandwidths).
    pub(crate) fn health_view(&self, epoch: HealthEpoch) -> HealthView {
        let n = self.node_count();
        let nodes = (0..n)
            .map(|i| NodeHealth {
                nics: (0..self.k)
                    .map(|r| NicHealth { nominal_mbps: self.nominal[i * self.k + r], usable_mbps: self.nic(i, r) })
                    .collect(),
            })
            .collect();
        HealthView::from_nodes(epoch, nodes)
    }

    /// The `r2ccl-algo` fabric for `ranks_per_node` ranks per node.
    pub(crate) fn algo(&self, ranks_per_node: u32, epoch: HealthEpoch) -> Result<r2ccl_algo::Fabric, PlanError> {
        let layout = r2ccl_algo::Layout::uniform(self.node_count(), ranks_per_node as usize, self.k)?;
        // A fabric without a spine never crosses rails, not even for Spread.
        Ok(r2ccl_algo::Fabric::new(layout, self.health_view(epoch))?.with_rail_only(self.spine_permille == 0))
    }
}
