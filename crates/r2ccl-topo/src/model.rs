//! The topology model: nodes with their NUMA nodes, GPUs, NICs and NVLink, rank
//! placement, and the validated cluster view.

use crate::error::ValidationError;
use crate::pci::{Locality, PathClass, PciAddr};
use r2ccl_core::{HealthEpoch, HealthView, NicHealth, NicId, NodeHealth, NodeId, RailId, Rank};
use serde::{Deserialize, Serialize};

/// One NUMA node of a server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumaNode {
    /// OS index of the NUMA node.
    pub id: u32,
    /// Its CPUs as a Linux cpulist (`"0-27,56-83"`), if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// Its local memory in bytes, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

/// One GPU of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// Device index on the node (the CUDA/NVML index).
    pub index: u32,
    /// Product name, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// PCI address, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciAddr>,
    /// NUMA node, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// PCIe host bridge label, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_bridge: Option<String>,
    /// PCIe switches from the host bridge down to the GPU, outermost first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<String>,
}

impl Gpu {
    /// The GPU's place in the node's PCIe/NUMA tree.
    pub fn locality(&self) -> Locality<'_> {
        Locality { numa: self.numa, host_bridge: self.host_bridge.as_deref(), switches: &self.switches }
    }
}

/// One NIC of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    /// Interface (or device) name, e.g. `mlx5_0`, `eth0`, `rail1`.
    pub name: String,
    /// Rail index: NIC `r` of every node sits on rail `r`.
    pub rail: RailId,
    /// Line rate in Mbit/s (positive).
    pub speed_mbps: u64,
    /// Whether the link was up when the topology was taken.
    pub link_up: bool,
    /// A virtual NIC (veth, vxlan, ...): no PCI device behind it.
    #[serde(rename = "virtual")]
    pub is_virtual: bool,
    /// NUMA node, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// PCI address, if it is a PCI device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciAddr>,
    /// PCIe host bridge label, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_bridge: Option<String>,
    /// PCIe switches from the host bridge down to the NIC, outermost first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub switches: Vec<String>,
}

impl Nic {
    /// The NIC's place in the node's PCIe/NUMA tree.
    pub fn locality(&self) -> Locality<'_> {
        Locality { numa: self.numa, host_bridge: self.host_bridge.as_deref(), switches: &self.switches }
    }
}

/// One node (server) as seen locally: CPUs, NUMA nodes, GPUs, NICs and NVLink.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTopology {
    /// Host name (or the host key the views were merged by).
    pub hostname: String,
    /// Physical cores, if known.
    pub cores: Option<u32>,
    /// Hardware threads (processing units), if known.
    pub pus: Option<u32>,
    /// NUMA nodes (empty when unknown).
    pub numa_nodes: Vec<NumaNode>,
    /// GPUs, by device index.
    pub gpus: Vec<Gpu>,
    /// Data NICs (one per rail).
    pub nics: Vec<Nic>,
    /// Every GPU reaches every other over NVLink through NVSwitches.
    pub nvswitch: bool,
    /// Direct NVLink connections between GPU device indices (unordered pairs).
    pub nvlinks: Vec<[u32; 2]>,
}

impl NodeTopology {
    /// An empty node named `hostname`.
    pub fn empty(hostname: impl Into<String>) -> Self {
        Self {
            hostname: hostname.into(),
            cores: None,
            pus: None,
            numa_nodes: Vec::new(),
            gpus: Vec::new(),
            nics: Vec::new(),
            nvswitch: false,
            nvlinks: Vec::new(),
        }
    }

    /// A node known only by its data NICs, one per rail in order: `(name, line rate in Mbit/s,
    /// NUMA node)` (a communicator's view of its peers, built from what each rank announced;
    /// tests). The NICs are virtual (no PCI address); names that several rails share (loopback
    /// runs) are made distinct with the rail (`lo.0`, `lo.1`); the node's NUMA nodes are those
    /// its NICs name.
    pub fn from_nics(hostname: impl Into<String>, nics: &[(&str, u64, Option<u32>)]) -> Self {
        let mut node = Self::empty(hostname);
        let mut ids: Vec<u32> = nics.iter().filter_map(|n| n.2).collect();
        ids.sort_unstable();
        ids.dedup();
        node.numa_nodes = ids.into_iter().map(|id| NumaNode { id, cpus: None, memory_bytes: None }).collect();
        for (r, &(name, speed_mbps, numa)) in nics.iter().enumerate() {
            let unique = nics.iter().filter(|x| x.0 == name).count() == 1;
            node.nics.push(Nic {
                name: if unique { name.to_string() } else { format!("{name}.{r}") },
                rail: RailId(u16::try_from(r).unwrap_or(u16::MAX)),
                speed_mbps,
                link_up: true,
                is_virtual: true,
                numa,
                pci: None,
                host_bridge: None,
                switches: Vec::new(),
            });
        }
        node
    }

    /// The GPU with device index `index`.
    pub fn gpu(&self, index: u32) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.index == index)
    }

    /// The NIC on rail `rail`.
    pub fn nic_on_rail(&self, rail: RailId) -> Option<&Nic> {
        self.nics.iter().find(|n| n.rail == rail)
    }

    /// The NIC named `name`.
    pub fn nic_named(&self, name: &str) -> Option<&Nic> {
        self.nics.iter().find(|n| n.name == name)
    }

    /// Whether GPUs `a` and `b` (device indices, both present) talk over NVLink.
    pub fn is_nvlinked(&self, a: u32, b: u32) -> bool {
        if a == b || self.gpu(a).is_none() || self.gpu(b).is_none() {
            return false;
        }
        self.nvswitch || self.nvlinks.iter().any(|&[x, y]| (x, y) == (a, b) || (x, y) == (b, a))
    }

    /// Distance class between two GPUs: NVLink if linked, else their PCIe/NUMA class.
    pub fn gpu_gpu_class(&self, a: u32, b: u32) -> Option<PathClass> {
        let (ga, gb) = (self.gpu(a)?, self.gpu(b)?);
        if self.is_nvlinked(a, b) {
            return Some(PathClass::NvLink);
        }
        Some(ga.locality().class_to(&gb.locality()))
    }

    /// Distance class between a GPU and the NIC on `rail` (never NVLink).
    pub fn gpu_nic_class(&self, gpu: u32, rail: RailId) -> Option<PathClass> {
        Some(self.gpu(gpu)?.locality().class_to(&self.nic_on_rail(rail)?.locality()))
    }

    /// Total nominal NIC bandwidth, Mbit/s.
    pub fn nic_mbps(&self) -> u64 {
        self.nics.iter().map(|n| n.speed_mbps).sum()
    }

    /// The order in which the node's other NICs take over the traffic of the NIC on `rail`:
    /// nearest to it first (same PCIe switch, host bridge, NUMA node, then the rest; unknown
    /// locality counts as the rest), each class in rail order going up from `rail`
    /// (cyclically), so that the NICs of one class back each other up in turn. A pure function
    /// of the node, so every rank computes the same chains. Empty for a rail the node lacks.
    pub fn backup_chain(&self, rail: RailId) -> Vec<RailId> {
        let Some(me) = self.nic_on_rail(rail) else { return Vec::new() };
        let here = me.locality();
        let k = self.nics.iter().map(|n| u32::from(n.rail.0) + 1).max().unwrap_or(1);
        let distance = |r: RailId| (u32::from(r.0) + k - u32::from(rail.0) % k) % k;
        let mut others: Vec<(PathClass, u32, RailId)> = self
            .nics
            .iter()
            .filter(|n| n.rail != rail)
            .map(|n| (here.class_to(&n.locality()), distance(n.rail), n.rail))
            .collect();
        others.sort_unstable();
        others.into_iter().map(|(_, _, r)| r).collect()
    }
}

/// Where a rank runs: its node, its GPU (if any) and its NUMA node (if known).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankPlacement {
    /// The rank.
    pub rank: Rank,
    /// Its node.
    pub node: NodeId,
    /// Its GPU's device index on the node; `None` for CPU-only ranks.
    pub gpu: Option<u32>,
    /// NUMA node the rank is bound to, if known (for GPU ranks: the GPU's).
    pub numa: Option<u32>,
}

/// The validated cluster view: every node, every rank's placement, the rail count.
///
/// Invariants (checked by [`ClusterTopology::new`], so every value of this type holds
/// them): ranks are exactly `0..n` in order and each names an existing node and GPU;
/// each node has exactly one NIC per rail `0..rails`, unique NIC names and PCI
/// addresses, positive speeds, and NVLink/NUMA references to things that exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterTopology {
    name: Option<String>,
    rails: u16,
    nodes: Vec<NodeTopology>,
    ranks: Vec<RankPlacement>,
}

impl ClusterTopology {
    /// Validate and build a cluster view. NICs of each node are sorted by rail and
    /// ranks by rank; `rails` is the number of rails of the fabric.
    pub fn new(
        name: Option<String>,
        rails: u16,
        mut nodes: Vec<NodeTopology>,
        mut ranks: Vec<RankPlacement>,
    ) -> Result<Self, ValidationError> {
        crate::validate::validate(rails, &nodes, &ranks)?;
        for node in &mut nodes {
            node.nics.sort_by_key(|n| n.rail);
        }
        ranks.sort_by_key(|r| r.rank);
        Ok(Self { name, rails, nodes, ranks })
    }

    /// A cluster of `nodes` with rank `r` on node `rank_node[r]` (CPU ranks, NUMA binding
    /// unknown); the fabric has as many rails as the first node has NICs.
    pub fn with_ranks_on(
        name: Option<String>,
        nodes: Vec<NodeTopology>,
        rank_node: &[NodeId],
    ) -> Result<Self, ValidationError> {
        let rails = u16::try_from(nodes.first().map_or(0, |n| n.nics.len())).unwrap_or(u16::MAX);
        let ranks = rank_node
            .iter()
            .enumerate()
            .map(|(r, &node)| RankPlacement {
                rank: Rank(u32::try_from(r).unwrap_or(u32::MAX)),
                node,
                gpu: None,
                numa: None,
            })
            .collect();
        Self::new(name, rails, nodes, ranks)
    }

    /// The view's name (the description's or preset's), if any.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Number of rails of the fabric (NICs per node).
    pub const fn rails(&self) -> u16 {
        self.rails
    }

    /// Every node, indexed by [`NodeId`].
    pub fn nodes(&self) -> &[NodeTopology] {
        &self.nodes
    }

    /// Every rank's placement, indexed by [`Rank`].
    pub fn ranks(&self) -> &[RankPlacement] {
        &self.ranks
    }

    /// One node.
    pub fn node(&self, node: NodeId) -> Option<&NodeTopology> {
        self.nodes.get(node.index())
    }

    /// One rank's placement.
    pub fn rank(&self, rank: Rank) -> Option<&RankPlacement> {
        self.ranks.get(rank.index())
    }

    /// One NIC.
    pub fn nic(&self, nic: NicId) -> Option<&Nic> {
        self.node(nic.node)?.nics.get(nic.rail.index())
    }

    /// Ranks placed on `node`, in rank order.
    pub fn ranks_on(&self, node: NodeId) -> impl Iterator<Item = Rank> + '_ {
        self.ranks.iter().filter(move |r| r.node == node).map(|r| r.rank)
    }

    /// Distance class between `rank` and the NIC on `rail` of its node: the GPU's
    /// PCIe/NUMA class for GPU ranks, NODE (same NUMA node) or SYS for CPU ranks.
    pub fn rank_nic_class(&self, rank: Rank, rail: RailId) -> Option<PathClass> {
        let p = self.rank(rank)?;
        let node = self.node(p.node)?;
        let nic = node.nic_on_rail(rail)?;
        match p.gpu {
            Some(g) => node.gpu_nic_class(g, rail),
            None => Some(Locality { numa: p.numa, host_bridge: None, switches: &[] }.class_to(&nic.locality())),
        }
    }

    /// The health view this topology starts from, at epoch 0: every NIC at its line
    /// rate, NICs whose link was down marked failed.
    pub fn health_view(&self) -> HealthView {
        let nodes = self
            .nodes
            .iter()
            .map(|n| NodeHealth {
                nics: n
                    .nics
                    .iter()
                    .map(|nic| NicHealth {
                        nominal_mbps: nic.speed_mbps,
                        usable_mbps: if nic.link_up { nic.speed_mbps } else { 0 },
                    })
                    .collect(),
            })
            .collect();
        HealthView::from_nodes(HealthEpoch(0), nodes)
    }
}
