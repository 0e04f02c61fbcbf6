//! Static TOML/JSON topology descriptions (presets, site files, dumps): the schema,
//! loading, resolution into a [`ClusterTopology`], and overlay on local discovery.
//!
//! Schema (every key optional unless noted; unknown keys are rejected):
//!
//! ```toml
//! name = "h100-8gpu-8nic"       # shown in dumps
//! description = "..."
//! discover = false              # true: tools merge this over local discovery
//! rails = 8                     # default: the most NICs any node lists
//!
//! [[nodes]]                     # one entry per kind of node
//! hostname = "h100-{i}"         # {i} = global node index; default "node{i}"
//! count = 2                     # copies of this node; default 1
//! cores = 112
//! pus = 224
//! ranks = 8                     # ranks per node; default one per GPU, else 1
//! nvswitch = true               # all GPUs linked through NVSwitches
//! nvlinks = [[0, 1]]            # direct NVLinks between GPU indices
//! numa_nodes = [{ id = 0, cpus = "0-55" }]
//! [[nodes.gpus]]                # index defaults to the position
//! index = 0
//! pci = "0000:18:00.0"
//! numa = 0
//! host_bridge = "hb0"           # any label; PCIe root complex
//! switches = ["sw0"]            # PCIe switches, outermost first
//! [[nodes.nics]]                # name required; rail defaults to the position
//! name = "mlx5_0"
//! rail = 0
//! speed_mbps = 400000
//! numa = 0
//! pci = "0000:19:00.0"
//! host_bridge = "hb0"
//! switches = ["sw0"]
//! link_up = true                # default: discovered state, else true
//! virtual = false               # default: discovered, else "no PCI address given"
//!
//! [[ranks]]                     # optional explicit placement (default: generated)
//! rank = 0                      # defaults to the position
//! node = 0                      # required
//! gpu = 0
//! numa = 0
//! ```

use crate::discover::{DiscoveredNic, LocalDiscovery};
use crate::error::{LoadError, ValidationError};
use crate::model::{ClusterTopology, Gpu, Nic, NodeTopology, NumaNode, RankPlacement};
use crate::pci::PciAddr;
use r2ccl_core::{NodeId, RailId, Rank};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// A whole topology description: nodes (possibly repeated) and optional rank placement.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyDescription {
    /// Name shown in dumps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Whether tools merge this description over local discovery (default false:
    /// the description stands alone, as presets of other machines do).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub discover: bool,
    /// Number of rails; default the most NICs any node lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rails: Option<i64>,
    /// Node kinds.
    #[serde(default)]
    pub nodes: Vec<NodeSpec>,
    /// Explicit rank placement; empty = generated from each node's `ranks`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankSpec>,
}

/// One kind of node; fields left out are filled from discovery (when overlaid) or
/// defaulted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Host name; `{i}` is replaced by the global node index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// How many nodes of this kind (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    /// Physical cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Hardware threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pus: Option<u32>,
    /// Ranks per node (default one per GPU, or 1 without GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<i64>,
    /// All GPUs reach each other over NVSwitch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvswitch: Option<bool>,
    /// Direct NVLinks between GPU indices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlinks: Option<Vec<[u32; 2]>>,
    /// NUMA nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub numa_nodes: Vec<NumaNode>,
    /// GPUs (non-empty: exactly these GPUs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuSpec>,
    /// NICs (non-empty: exactly these NICs, matched to discovered ones by name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NicSpec>,
}

/// One GPU of a node description.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Device index (default: position in the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// Product name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// PCI address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciAddr>,
    /// NUMA node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// PCIe host bridge label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_bridge: Option<String>,
    /// PCIe switches, outermost first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switches: Option<Vec<String>>,
}

/// One NIC of a node description.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicSpec {
    /// Interface name (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Rail (default: position in the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail: Option<i64>,
    /// Line rate in Mbit/s (default: discovered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mbps: Option<i64>,
    /// Link state (default: discovered, else up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_up: Option<bool>,
    /// Virtual NIC (default: discovered, else true when no PCI address is known).
    #[serde(default, rename = "virtual", skip_serializing_if = "Option::is_none")]
    pub is_virtual: Option<bool>,
    /// NUMA node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// PCI address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciAddr>,
    /// PCIe host bridge label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_bridge: Option<String>,
    /// PCIe switches, outermost first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switches: Option<Vec<String>>,
}

/// One rank's placement in a description.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankSpec {
    /// The rank (default: position in the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Its node (required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u32>,
    /// Its GPU's device index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// Its NUMA node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
}

fn positive(field: impl FnOnce() -> String, v: i64) -> Result<u64, ValidationError> {
    u64::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| ValidationError::InvalidCount { field: field(), value: v })
}

impl TopologyDescription {
    /// Parse TOML text.
    pub fn from_toml_str(text: &str) -> Result<Self, LoadError> {
        toml::from_str(text).map_err(|e| LoadError::Parse { path: None, message: e.to_string() })
    }

    /// Parse JSON text.
    pub fn from_json_str(text: &str) -> Result<Self, LoadError> {
        serde_json::from_str(text).map_err(|e| LoadError::Parse { path: None, message: e.to_string() })
    }

    /// Read a file: JSON when it ends in `.json`, TOML otherwise.
    pub fn from_file(path: &Path) -> Result<Self, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io { path: path.into(), source })?;
        let parsed = if path.extension().is_some_and(|e| e == "json") {
            Self::from_json_str(&text)
        } else {
            Self::from_toml_str(&text)
        };
        parsed.map_err(|e| match e {
            LoadError::Parse { message, .. } => LoadError::Parse { path: Some(path.into()), message },
            other => other,
        })
    }

    /// Number of nodes once every `count` is expanded.
    fn expanded(&self) -> Result<Vec<(usize, &NodeSpec)>, ValidationError> {
        let mut out = Vec::new();
        for (i, spec) in self.nodes.iter().enumerate() {
            let count = positive(|| format!("nodes[{i}].count"), spec.count.unwrap_or(1))?;
            for _ in 0..count {
                out.push((i, spec));
            }
        }
        Ok(out)
    }

    /// The description alone (no discovery) as a validated cluster view.
    pub fn resolve(&self) -> Result<ClusterTopology, ValidationError> {
        self.resolve_with(|_, _| LocalDiscovery::default())
    }

    /// The cluster view with each node built over `base(node index, hostname)`: the
    /// description overrides and fills what the base discovered. A node entry without
    /// a host name takes the discovered one (if any).
    pub fn resolve_with(
        &self,
        mut base: impl FnMut(usize, &str) -> LocalDiscovery,
    ) -> Result<ClusterTopology, ValidationError> {
        let expanded = self.expanded()?;
        let mut nodes = Vec::with_capacity(expanded.len());
        for (global, (i, spec)) in expanded.iter().enumerate() {
            let named = spec.hostname_for(global);
            let local = base(global, &named);
            // Without a host name in the description, a discovered one wins.
            let hostname = if spec.hostname.is_none() && !local.hostname.is_empty() { None } else { Some(named) };
            nodes.push(spec.overlay(&format!("nodes[{i}]"), local, hostname)?);
        }
        let rails = match self.rails {
            Some(r) => u16::try_from(r).map_err(|_| ValidationError::OutOfRange {
                field: "rails".into(),
                value: r,
                allowed: "0..=65535",
            })?,
            None => {
                let most = nodes.iter().map(|n| n.nics.len()).max().unwrap_or(0);
                u16::try_from(most).map_err(|_| ValidationError::OutOfRange {
                    field: "rails".into(),
                    value: most as i64,
                    allowed: "0..=65535",
                })?
            }
        };
        let ranks = if self.ranks.is_empty() {
            self.generated_ranks(&expanded, &nodes)?
        } else {
            self.explicit_ranks(nodes.len())?
        };
        ClusterTopology::new(self.name.clone(), rails, nodes, ranks)
    }

    fn generated_ranks(
        &self,
        expanded: &[(usize, &NodeSpec)],
        nodes: &[NodeTopology],
    ) -> Result<Vec<RankPlacement>, ValidationError> {
        let mut ranks = Vec::new();
        for (n, ((i, spec), node)) in expanded.iter().zip(nodes).enumerate() {
            let default = if node.gpus.is_empty() { 1 } else { node.gpus.len() as i64 };
            let count = positive(|| format!("nodes[{i}].ranks"), spec.ranks.unwrap_or(default))?;
            for local in 0..count as usize {
                let gpu = node.gpus.get(local).map(|g| g.index);
                // GPU ranks sit with their GPU; CPU ranks on a single-NUMA node on it.
                let only_numa = if node.numa_nodes.len() == 1 { node.numa_nodes.first().map(|n| n.id) } else { None };
                let numa = match node.gpus.get(local) {
                    Some(g) => g.numa,
                    None => only_numa,
                };
                ranks.push(RankPlacement { rank: Rank(ranks.len() as u32), node: NodeId(n as u32), gpu, numa });
            }
        }
        Ok(ranks)
    }

    fn explicit_ranks(&self, node_count: usize) -> Result<Vec<RankPlacement>, ValidationError> {
        self.ranks
            .iter()
            .enumerate()
            .map(|(k, r)| {
                let rank = r.rank.unwrap_or(k as u32);
                let node = r.node.ok_or_else(|| ValidationError::RankWithoutNode {
                    field: format!("ranks[{k}].node"),
                    rank,
                    node: None,
                    nodes: node_count,
                })?;
                Ok(RankPlacement { rank: Rank(rank), node: NodeId(node), gpu: r.gpu, numa: r.numa })
            })
            .collect()
    }

    /// The node entry that applies to host `hostname`: the entry whose expanded host
    /// names contain it, else the only entry if there is exactly one.
    pub fn spec_for_host(&self, hostname: &str) -> Option<&NodeSpec> {
        let expanded = self.expanded().ok()?;
        expanded
            .iter()
            .enumerate()
            .find(|(g, (_, s))| s.hostname.is_some() && s.hostname_for(*g) == hostname)
            .map(|(_, (_, s))| *s)
            .or_else(|| if self.nodes.len() == 1 { self.nodes.first() } else { None })
    }

    /// A description that reproduces `cluster` exactly (what dumps write): one entry
    /// per node, every field spelled out, explicit ranks.
    pub fn from_cluster(cluster: &ClusterTopology) -> Self {
        let nodes = cluster
            .nodes()
            .iter()
            .map(|n| NodeSpec {
                hostname: Some(n.hostname.clone()),
                count: None,
                cores: n.cores,
                pus: n.pus,
                ranks: None,
                nvswitch: Some(n.nvswitch),
                nvlinks: Some(n.nvlinks.clone()),
                numa_nodes: n.numa_nodes.clone(),
                gpus: n
                    .gpus
                    .iter()
                    .map(|g| GpuSpec {
                        index: Some(g.index),
                        model: g.model.clone(),
                        pci: g.pci,
                        numa: g.numa,
                        host_bridge: g.host_bridge.clone(),
                        switches: Some(g.switches.clone()),
                    })
                    .collect(),
                nics: n
                    .nics
                    .iter()
                    .map(|x| NicSpec {
                        name: Some(x.name.clone()),
                        rail: Some(i64::from(x.rail.0)),
                        speed_mbps: Some(i64::try_from(x.speed_mbps).unwrap_or(i64::MAX)),
                        link_up: Some(x.link_up),
                        is_virtual: Some(x.is_virtual),
                        numa: x.numa,
                        pci: x.pci,
                        host_bridge: x.host_bridge.clone(),
                        switches: Some(x.switches.clone()),
                    })
                    .collect(),
            })
            .collect();
        let ranks = cluster
            .ranks()
            .iter()
            .map(|r| RankSpec { rank: Some(r.rank.0), node: Some(r.node.0), gpu: r.gpu, numa: r.numa })
            .collect();
        Self {
            name: cluster.name().map(str::to_owned),
            description: None,
            discover: false,
            rails: Some(i64::from(cluster.rails())),
            nodes,
            ranks,
        }
    }
}

impl NodeSpec {
    /// The host name of the copy at global node index `global`.
    pub fn hostname_for(&self, global: usize) -> String {
        match &self.hostname {
            Some(h) => h.replace("{i}", &global.to_string()),
            None => format!("node{global}"),
        }
    }

    /// This description laid over a local discovery: what the description says wins,
    /// what it leaves out comes from discovery. `path` prefixes error fields
    /// (`nodes[0]`); `hostname` overrides the discovered host name.
    pub fn overlay(
        &self,
        path: &str,
        local: LocalDiscovery,
        hostname: Option<String>,
    ) -> Result<NodeTopology, ValidationError> {
        let discovered_node = local.to_node();
        let mut node = NodeTopology {
            hostname: hostname.unwrap_or_else(|| local.hostname.clone()),
            cores: self.cores.or(local.cores),
            pus: self.pus.or(local.pus),
            numa_nodes: if self.numa_nodes.is_empty() { local.numa_nodes.clone() } else { self.numa_nodes.clone() },
            gpus: Vec::new(),
            nics: Vec::new(),
            nvswitch: self.nvswitch.unwrap_or(local.nvswitch),
            nvlinks: self.nvlinks.clone().unwrap_or_else(|| local.nvlinks.clone()),
        };
        node.gpus = if self.gpus.is_empty() {
            local.gpus.clone()
        } else {
            self.gpus.iter().enumerate().map(|(j, g)| g.overlay(j as u32, &local.gpus)).collect()
        };
        node.nics = if self.nics.is_empty() {
            discovered_node.nics
        } else {
            let mut nics = Vec::with_capacity(self.nics.len());
            for (j, spec) in self.nics.iter().enumerate() {
                nics.push(spec.overlay(&format!("{path}.nics[{j}]"), j, &local.nics)?);
            }
            nics
        };
        Ok(node)
    }
}

impl GpuSpec {
    fn overlay(&self, position: u32, discovered: &[Gpu]) -> Gpu {
        let index = self.index.unwrap_or(position);
        let base = discovered
            .iter()
            .find(|g| self.pci.is_some() && g.pci == self.pci)
            .or_else(|| discovered.iter().find(|g| g.index == index));
        Gpu {
            index,
            model: self.model.clone().or_else(|| base.and_then(|b| b.model.clone())),
            pci: self.pci.or_else(|| base.and_then(|b| b.pci)),
            numa: self.numa.or_else(|| base.and_then(|b| b.numa)),
            host_bridge: self.host_bridge.clone().or_else(|| base.and_then(|b| b.host_bridge.clone())),
            switches: self.switches.clone().or_else(|| base.map(|b| b.switches.clone())).unwrap_or_default(),
        }
    }
}

impl NicSpec {
    fn overlay(&self, path: &str, position: usize, discovered: &[DiscoveredNic]) -> Result<Nic, ValidationError> {
        let f = |name: &str| format!("{path}.{name}");
        let name = self.name.clone().ok_or_else(|| ValidationError::MissingField { field: f("name") })?;
        if name.is_empty() {
            return Err(ValidationError::EmptyName { field: f("name") });
        }
        let base = discovered.iter().find(|d| d.name == name);
        let rail = self.rail.unwrap_or(position as i64);
        let rail = u16::try_from(rail).map_err(|_| ValidationError::OutOfRange {
            field: f("rail"),
            value: rail,
            allowed: "a rail index 0..=65535",
        })?;
        let speed_mbps = match self.speed_mbps {
            Some(v) => u64::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| ValidationError::InvalidSpeed { field: f("speed_mbps"), value: v })?,
            None => base
                .and_then(|b| b.speed_mbps)
                .ok_or_else(|| ValidationError::MissingField { field: f("speed_mbps") })?,
        };
        let pci = self.pci.or_else(|| base.and_then(|b| b.pci));
        Ok(Nic {
            name,
            rail: RailId(rail),
            speed_mbps,
            link_up: self.link_up.or_else(|| base.and_then(|b| b.link_up)).unwrap_or(true),
            is_virtual: self.is_virtual.or_else(|| base.map(|b| b.is_virtual)).unwrap_or(pci.is_none()),
            numa: self.numa.or_else(|| base.and_then(|b| b.numa)),
            pci,
            host_bridge: self.host_bridge.clone().or_else(|| base.and_then(|b| b.host_bridge.clone())),
            switches: self.switches.clone().or_else(|| base.map(|b| b.switches.clone())).unwrap_or_default(),
        })
    }
}
