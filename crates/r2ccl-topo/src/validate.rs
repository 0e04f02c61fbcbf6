//! Validation of a cluster view: the rules every [`crate::ClusterTopology`] holds.

use crate::error::ValidationError;
use crate::model::{NodeTopology, RankPlacement};
use std::collections::HashMap;

/// Check the cluster-view invariants; the first broken rule is returned, naming its
/// field as `nodes[i]...` or `ranks[k]...` (indices into the given slices).
pub(crate) fn validate(rails: u16, nodes: &[NodeTopology], ranks: &[RankPlacement]) -> Result<(), ValidationError> {
    for (i, node) in nodes.iter().enumerate() {
        validate_node(&format!("nodes[{i}]"), rails, node)?;
    }
    validate_ranks(nodes, ranks)
}

fn numa_ok(field: impl FnOnce() -> String, numa: Option<u32>, node: &NodeTopology) -> Result<(), ValidationError> {
    match numa {
        Some(n) if !node.numa_nodes.is_empty() && !node.numa_nodes.iter().any(|x| x.id == n) => {
            Err(ValidationError::UnknownNuma {
                field: field(),
                numa: n,
                known: node.numa_nodes.iter().map(|x| x.id).collect(),
            })
        }
        _ => Ok(()),
    }
}

fn validate_node(p: &str, rails: u16, node: &NodeTopology) -> Result<(), ValidationError> {
    let mut numa_seen = HashMap::new();
    for (j, n) in node.numa_nodes.iter().enumerate() {
        if numa_seen.insert(n.id, j).is_some() {
            return Err(ValidationError::DuplicateNuma { field: format!("{p}.numa_nodes[{j}].id"), numa: n.id });
        }
    }
    let mut gpu_seen = HashMap::new();
    for (j, g) in node.gpus.iter().enumerate() {
        if gpu_seen.insert(g.index.to_string(), j).is_some() {
            return Err(ValidationError::DuplicateGpu {
                field: format!("{p}.gpus[{j}].index"),
                value: g.index.to_string(),
            });
        }
        if let Some(pci) = g.pci {
            if gpu_seen.insert(pci.to_string(), j).is_some() {
                return Err(ValidationError::DuplicateGpu {
                    field: format!("{p}.gpus[{j}].pci"),
                    value: pci.to_string(),
                });
            }
        }
        numa_ok(|| format!("{p}.gpus[{j}].numa"), g.numa, node)?;
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    let mut pcis = HashMap::new();
    let mut rail_owner: HashMap<u16, usize> = HashMap::new();
    for (j, nic) in node.nics.iter().enumerate() {
        let f = |name: &str| format!("{p}.nics[{j}].{name}");
        if nic.name.is_empty() {
            return Err(ValidationError::EmptyName { field: f("name") });
        }
        if let Some(first) = names.insert(&nic.name, j) {
            return Err(ValidationError::DuplicateNic {
                field: f("name"),
                value: nic.name.clone(),
                first: format!("{p}.nics[{first}].name"),
            });
        }
        if let Some(pci) = nic.pci {
            if let Some(first) = pcis.insert(pci, j) {
                return Err(ValidationError::DuplicateNic {
                    field: f("pci"),
                    value: pci.to_string(),
                    first: format!("{p}.nics[{first}].pci"),
                });
            }
        }
        if nic.rail.0 >= rails {
            return Err(ValidationError::UnknownRail { field: f("rail"), rail: i64::from(nic.rail.0), rails });
        }
        if let Some(first) = rail_owner.insert(nic.rail.0, j) {
            return Err(ValidationError::DuplicateRail {
                field: f("rail"),
                rail: nic.rail.0,
                first: format!("{p}.nics[{first}] ({})", node.nics[first].name),
            });
        }
        if nic.speed_mbps == 0 {
            return Err(ValidationError::InvalidSpeed { field: f("speed_mbps"), value: 0 });
        }
        numa_ok(|| f("numa"), nic.numa, node)?;
    }
    if let Some(rail) = (0..rails).find(|r| !rail_owner.contains_key(r)) {
        return Err(ValidationError::MissingRail { field: format!("{p}.nics"), rail, rails });
    }
    for (j, &[a, b]) in node.nvlinks.iter().enumerate() {
        if a == b {
            return Err(ValidationError::SelfLink { field: format!("{p}.nvlinks[{j}]"), gpu: a });
        }
        for g in [a, b] {
            if node.gpu(g).is_none() {
                return Err(ValidationError::UnknownGpu { field: format!("{p}.nvlinks[{j}]"), gpu: g });
            }
        }
    }
    Ok(())
}

fn validate_ranks(nodes: &[NodeTopology], ranks: &[RankPlacement]) -> Result<(), ValidationError> {
    let mut seen = vec![false; ranks.len()];
    for (k, r) in ranks.iter().enumerate() {
        let f = |name: &str| format!("ranks[{k}].{name}");
        let Some(node) = nodes.get(r.node.index()) else {
            return Err(ValidationError::RankWithoutNode {
                field: f("node"),
                rank: r.rank.0,
                node: Some(r.node.0),
                nodes: nodes.len(),
            });
        };
        match seen.get_mut(r.rank.index()) {
            Some(s) if *s => return Err(ValidationError::DuplicateRank { field: f("rank"), rank: r.rank.0 }),
            Some(s) => *s = true,
            None => {
                return Err(ValidationError::OutOfRange {
                    field: f("rank"),
                    value: i64::from(r.rank.0),
                    allowed: "ranks are 0..number of ranks",
                })
            }
        }
        if let Some(g) = r.gpu {
            if node.gpu(g).is_none() {
                return Err(ValidationError::UnknownGpu { field: f("gpu"), gpu: g });
            }
        }
        numa_ok(|| f("numa"), r.numa, node)?;
    }
    if let Some(missing) = seen.iter().position(|s| !s) {
        return Err(ValidationError::MissingRank { field: "ranks".into(), rank: missing as u32, count: ranks.len() });
    }
    Ok(())
}
