//! `r2ccl-topo` on its own: discover this machine (sysfs, plus hwloc when the `hwloc`
//! feature is built; no GPU or RDMA NIC needed, sources that find nothing leave notes),
//! turn it into a one-node cluster view and dump it as `r2ccl-topo dump` does; then load the
//! `small-2gpu-3nic` preset from `configs/topo/`, print each rank's primary NIC and backup
//! chain, and check the preset's shape, its NIC selection and its dump/load round trip.
//!
//! Run with `cargo run -p r2ccl-topo --example discover_dump`.
#![allow(clippy::print_stdout, reason = "an example prints what it shows")]

use r2ccl_core::{NodeId, RailId, Rank};
use r2ccl_topo::discover::{discover_local, DiscoverOptions};
use r2ccl_topo::{load_cluster_file, render_cluster, ClusterTopology, DumpFormat, PathClass, TopologyDescription};
use std::error::Error;
use std::path::PathBuf;

fn check(ok: bool, what: &str) -> Result<(), Box<dyn Error>> {
    if ok {
        println!("  ok: {what}");
        Ok(())
    } else {
        Err(format!("check failed: {what}").into())
    }
}

/// This machine, as discovery sees it.
fn local_machine() -> Result<(), Box<dyn Error>> {
    let local = discover_local(&DiscoverOptions::default());
    println!("== local discovery on {}", local.hostname);
    let count = |v: Option<u32>| v.map_or("?".to_owned(), |n| n.to_string());
    println!(
        "cores {}, threads {}, NUMA nodes {}, GPUs {}",
        count(local.cores),
        count(local.pus),
        local.numa_nodes.len(),
        local.gpus.len()
    );
    for n in &local.nics {
        let kind = if n.is_loopback {
            "loopback"
        } else if n.is_virtual {
            "virtual"
        } else {
            "physical"
        };
        let link = match n.link_up {
            Some(true) => "up",
            Some(false) => "down",
            None => "?",
        };
        let speed = n.speed_mbps.map_or("?".to_owned(), |s| format!("{s} Mbit/s"));
        let pci = n.pci.map_or("-".to_owned(), |p| p.to_string());
        println!("  interface {:<16} {kind:<8} link {link:<4} speed {speed:<14} pci {pci}", n.name);
    }
    for note in &local.notes {
        println!("  note: {}: {}", note.source, note.message);
    }
    // The same resolution as `r2ccl-topo dump` without --file: one node, from discovery.
    let desc = TopologyDescription { nodes: vec![Default::default()], ..Default::default() };
    let cluster = desc.resolve_with(|_, _| local.clone())?;
    println!("-- dump (as `r2ccl-topo dump`):");
    print!("{}", render_cluster(&cluster, DumpFormat::Toml)?);
    println!("--");
    check(cluster.nodes().len() == 1, "discovery gives a one-node cluster view")?;
    let node = cluster.node(NodeId(0)).ok_or("node 0 missing")?;
    check(node.hostname == local.hostname, "named after this host")?;
    check(
        node.nics.len() == local.data_nics().len(),
        &format!("its rails are the {} physical data NIC(s) found (none is fine)", node.nics.len()),
    )?;
    check(!cluster.ranks().is_empty(), "with at least one rank placed on it")?;
    Ok(())
}

/// The 3-node x 3-NIC preset.
fn preset() -> Result<ClusterTopology, Box<dyn Error>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs/topo/small-2gpu-3nic.toml");
    let c = load_cluster_file(&path)?;
    println!("== preset {} ({})", c.name().unwrap_or("?"), path.display());
    for node in c.nodes() {
        let nics: Vec<String> = node.nics.iter().map(|n| format!("{}@{}G", n.name, n.speed_mbps / 1000)).collect();
        println!("  {}: {} GPUs, NICs {}", node.hostname, node.gpus.len(), nics.join(" "));
    }
    for s in c.nic_selections() {
        let name = |r: &r2ccl_topo::RankedNic| {
            let nic = c.nic(r.nic).map_or("?", |n| n.name.as_str());
            format!("{nic}(rail{},{})", r.nic.rail.0, r.class)
        };
        let primaries: Vec<String> = s.chain[..s.primary_count].iter().map(name).collect();
        let backups: Vec<String> = s.chain[s.primary_count..].iter().map(name).collect();
        println!("  {} {}: primary {} | backups {}", s.rank, s.node, primaries.join(" "), backups.join(" "));
    }
    Ok(c)
}

fn main() -> Result<(), Box<dyn Error>> {
    local_machine()?;
    println!();
    let c = preset()?;
    check((c.nodes().len(), c.rails(), c.ranks().len()) == (3, 3, 6), "3 nodes, 3 rails, 6 ranks (one per GPU)")?;
    check(c.nodes().iter().all(|n| n.nics.len() == 3 && n.nic_mbps() == 30_000), "every node has 3 NICs of 10 Gb/s")?;
    let rails = |rank: u32| -> Result<(Vec<u16>, Vec<u16>), Box<dyn Error>> {
        let s = c.select_nics(Rank(rank)).ok_or("no selection")?;
        Ok((s.primaries().map(|n| n.rail.0).collect(), s.backups().map(|n| n.rail.0).collect()))
    };
    check(rails(0)? == (vec![0], vec![2, 1]), "GPU 0: primary rail 0 (same switch), backups rail 2 (PHB), rail 1")?;
    check(rails(1)? == (vec![1], vec![2, 0]), "GPU 1: primary rail 1 (same switch), backups rail 2, rail 0")?;
    let node0 = c.node(NodeId(0)).ok_or("node 0 missing")?;
    check(node0.gpu_nic_class(0, RailId(0)) == Some(PathClass::Pix), "GPU 0 and rail 0 share a PCIe switch (PIX)")?;
    let text = render_cluster(&c, DumpFormat::Toml)?;
    check(TopologyDescription::from_toml_str(&text)?.resolve()? == c, "the dump loads back to the same view")?;
    check(c.health_view().failed_nics().is_empty(), "its starting health view has no failed NIC")?;
    Ok(())
}
