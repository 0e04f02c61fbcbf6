//! The simulated cluster fabric: nodes with GPUs on NVLink, rail-optimized NICs, rail switches and a spine.
//!
//! Every link is directed (full duplex is two links) and has a capacity in bytes/s and a latency in seconds.
//! Link layout per node: one NVLink egress and one ingress link per GPU, one uplink (NIC to rail switch)
//! and one downlink per NIC; per rail: one spine uplink and one spine downlink, used only by cross-rail
//! traffic. GPU `g` sits next to NIC `g * K / G` (PXN: a GPU reaching another NIC crosses NVLink first).

use crate::error::SimError;
use serde::{Deserialize, Serialize};

/// Index of a directed link in a [`Fabric`].
pub type LinkId = u32;

/// One GPU (rank) in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    /// Node index.
    pub node: u32,
    /// GPU index inside the node.
    pub gpu: u32,
}

impl Endpoint {
    /// GPU `gpu` of node `node`.
    pub const fn new(node: u32, gpu: u32) -> Self {
        Self { node, gpu }
    }
}

/// Shape and speeds of the cluster (the `[fabric]` table of a scenario).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricSpec {
    /// Number of nodes (servers).
    pub nodes: u32,
    /// GPUs (ranks) per node.
    pub gpus_per_node: u32,
    /// NICs (rails) per node.
    pub nics_per_node: u32,
    /// Line rate of one NIC, Gbit/s.
    pub nic_gbps: f64,
    /// NVLink bandwidth per GPU and direction, Gbit/s.
    #[serde(default = "default_nvlink_gbps")]
    pub nvlink_gbps: f64,
    /// One-way latency of a NIC hop (NIC to switch or switch to NIC), microseconds.
    #[serde(default = "default_nic_latency_us")]
    pub nic_latency_us: f64,
    /// One-way latency of an NVLink hop, microseconds.
    #[serde(default = "default_nvlink_latency_us")]
    pub nvlink_latency_us: f64,
    /// Spine oversubscription: a rail switch's spine uplink carries `nodes * nic_gbps / this`.
    #[serde(default = "default_oversub")]
    pub spine_oversubscription: f64,
}

fn default_nvlink_gbps() -> f64 {
    3600.0
}
fn default_nic_latency_us() -> f64 {
    2.0
}
fn default_nvlink_latency_us() -> f64 {
    1.0
}
fn default_oversub() -> f64 {
    1.0
}

impl FabricSpec {
    /// `nodes` H100-like servers: `gpus` GPUs and `nics` NICs of `nic_gbps` each, default NVLink and latencies.
    pub fn new(nodes: u32, gpus: u32, nics: u32, nic_gbps: f64) -> Self {
        Self {
            nodes,
            gpus_per_node: gpus,
            nics_per_node: nics,
            nic_gbps,
            nvlink_gbps: default_nvlink_gbps(),
            nic_latency_us: default_nic_latency_us(),
            nvlink_latency_us: default_nvlink_latency_us(),
            spine_oversubscription: default_oversub(),
        }
    }

    /// Reject impossible shapes, naming the offending field.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |field: &'static str, value: String, why: &'static str| Err(SimError::Topology { field, value, why });
        if self.nodes == 0 {
            return bad("fabric.nodes", self.nodes.to_string(), "need at least one node");
        }
        if self.gpus_per_node == 0 || self.gpus_per_node > 64 {
            return bad("fabric.gpus_per_node", self.gpus_per_node.to_string(), "must be 1..=64");
        }
        if self.nics_per_node == 0 || self.nics_per_node > 64 {
            return bad("fabric.nics_per_node", self.nics_per_node.to_string(), "must be 1..=64");
        }
        for (field, v) in [
            ("fabric.nic_gbps", self.nic_gbps),
            ("fabric.nvlink_gbps", self.nvlink_gbps),
            ("fabric.spine_oversubscription", self.spine_oversubscription),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(field, v.to_string(), "must be a positive finite number");
            }
        }
        for (field, v) in
            [("fabric.nic_latency_us", self.nic_latency_us), ("fabric.nvlink_latency_us", self.nvlink_latency_us)]
        {
            if !(v.is_finite() && v >= 0.0) {
                return bad(field, v.to_string(), "must be a non-negative finite number");
            }
        }
        Ok(())
    }

    /// Bandwidth of one NIC in bytes/s.
    pub fn nic_bytes_per_s(&self) -> f64 {
        self.nic_gbps * 1e9 / 8.0
    }

    /// Inter-node bandwidth of one node (all NICs) in bytes/s: the paper's B.
    pub fn node_bytes_per_s(&self) -> f64 {
        self.nic_bytes_per_s() * f64::from(self.nics_per_node)
    }

    /// Total number of GPUs.
    pub fn gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
}

/// A built fabric: the link table and path construction.
#[derive(Clone, Debug)]
pub struct Fabric {
    spec: FabricSpec,
    capacity: Vec<f64>,
    latency: Vec<f64>,
    per_node: u32,
}

impl Fabric {
    /// Build the link table of `spec` (validated first).
    pub fn new(spec: FabricSpec) -> Result<Self, SimError> {
        spec.validate()?;
        let g = spec.gpus_per_node;
        let k = spec.nics_per_node;
        let per_node = 2 * g + 2 * k;
        let total = spec.nodes as usize * per_node as usize + 2 * k as usize;
        let mut capacity = Vec::with_capacity(total);
        let mut latency = Vec::with_capacity(total);
        let nvl = spec.nvlink_gbps * 1e9 / 8.0;
        let nic = spec.nic_bytes_per_s();
        for _ in 0..spec.nodes {
            for _ in 0..2 * g {
                capacity.push(nvl);
                latency.push(spec.nvlink_latency_us * 1e-6);
            }
            for _ in 0..2 * k {
                capacity.push(nic);
                latency.push(spec.nic_latency_us * 1e-6);
            }
        }
        let spine = nic * f64::from(spec.nodes) / spec.spine_oversubscription;
        for _ in 0..2 * k {
            capacity.push(spine);
            latency.push(spec.nic_latency_us * 1e-6);
        }
        Ok(Self { spec, capacity, latency, per_node })
    }

    /// The spec this fabric was built from.
    pub fn spec(&self) -> &FabricSpec {
        &self.spec
    }

    /// Number of directed links.
    pub fn link_count(&self) -> usize {
        self.capacity.len()
    }

    /// Nominal capacity of every link, bytes/s.
    pub fn capacities(&self) -> &[f64] {
        &self.capacity
    }

    /// Latency of `link`, seconds.
    pub fn latency(&self, link: LinkId) -> f64 {
        self.latency[link as usize]
    }

    fn base(&self, node: u32) -> u32 {
        node * self.per_node
    }
    /// NVLink egress of a GPU.
    pub fn nvl_out(&self, e: Endpoint) -> LinkId {
        self.base(e.node) + 2 * e.gpu
    }
    /// NVLink ingress of a GPU.
    pub fn nvl_in(&self, e: Endpoint) -> LinkId {
        self.base(e.node) + 2 * e.gpu + 1
    }
    /// Uplink of NIC `rail` on `node` (node to rail switch).
    pub fn nic_up(&self, node: u32, rail: u32) -> LinkId {
        self.base(node) + 2 * self.spec.gpus_per_node + 2 * rail
    }
    /// Downlink of NIC `rail` on `node` (rail switch to node).
    pub fn nic_down(&self, node: u32, rail: u32) -> LinkId {
        self.nic_up(node, rail) + 1
    }
    /// Spine uplink of rail switch `rail`.
    pub fn spine_up(&self, rail: u32) -> LinkId {
        self.spec.nodes * self.per_node + 2 * rail
    }
    /// Spine downlink into rail switch `rail`.
    pub fn spine_down(&self, rail: u32) -> LinkId {
        self.spine_up(rail) + 1
    }

    /// The GPU next to NIC `rail`.
    pub fn gpu_of_rail(&self, rail: u32) -> u32 {
        rail * self.spec.gpus_per_node / self.spec.nics_per_node
    }

    /// The NIC next to GPU `gpu`.
    pub fn rail_of_gpu(&self, gpu: u32) -> u32 {
        gpu * self.spec.nics_per_node / self.spec.gpus_per_node
    }

    /// Links from `src` to `dst`. Same node: NVLink (empty when `src == dst`). Different nodes: optional NVLink hop
    /// to the GPU next to NIC `rail_src`, its uplink, the spine when `rail_src != rail_dst`, the downlink of
    /// `rail_dst` on the destination and an optional NVLink hop to `dst`.
    pub fn path(&self, src: Endpoint, dst: Endpoint, rail_src: u32, rail_dst: u32, out: &mut Vec<LinkId>) {
        out.clear();
        if src.node == dst.node {
            if src.gpu != dst.gpu {
                out.push(self.nvl_out(src));
                out.push(self.nvl_in(dst));
            }
            return;
        }
        let near_src = Endpoint::new(src.node, self.gpu_of_rail(rail_src));
        if near_src.gpu != src.gpu {
            out.push(self.nvl_out(src));
            out.push(self.nvl_in(near_src));
        }
        out.push(self.nic_up(src.node, rail_src));
        if rail_src != rail_dst {
            out.push(self.spine_up(rail_src));
            out.push(self.spine_down(rail_dst));
        }
        out.push(self.nic_down(dst.node, rail_dst));
        let near_dst = Endpoint::new(dst.node, self.gpu_of_rail(rail_dst));
        if near_dst.gpu != dst.gpu {
            out.push(self.nvl_out(near_dst));
            out.push(self.nvl_in(dst));
        }
    }

    /// Propagation latency of the nominal path between two GPUs (same rail when across nodes).
    pub fn path_latency(&self, src: Endpoint, dst: Endpoint) -> f64 {
        let s = &self.spec;
        if src.node == dst.node {
            if src.gpu == dst.gpu {
                0.0
            } else {
                s.nvlink_latency_us * 1e-6
            }
        } else {
            2.0 * s.nic_latency_us * 1e-6
        }
    }
}
