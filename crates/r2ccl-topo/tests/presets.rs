//! Every preset in configs/topo loads, validates, yields the expected NIC selection
//! and backup order, and survives a dump/load round trip.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a test failure with a message")]

use r2ccl_core::{NicId, NodeId, RailId, Rank};
use r2ccl_topo::{
    load_cluster_file, render_cluster, write_cluster_view, ClusterTopology, DumpFormat, PathClass, TopologyDescription,
};
use std::path::PathBuf;

fn preset_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs/topo")
}

fn preset(name: &str) -> ClusterTopology {
    load_cluster_file(&preset_dir().join(name)).unwrap()
}

fn rails(c: &ClusterTopology, rank: u32) -> (Vec<u16>, Vec<u16>) {
    let s = c.select_nics(Rank(rank)).unwrap();
    (s.primaries().map(|n| n.rail.0).collect(), s.backups().map(|n| n.rail.0).collect())
}

#[test]
fn every_preset_file_loads_and_validates() {
    let mut names: Vec<_> = std::fs::read_dir(preset_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    names.sort();
    assert!(names.len() >= 3, "{names:?}");
    for p in names {
        let c = load_cluster_file(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(!c.ranks().is_empty(), "{}", p.display());
        assert_eq!(c.nic_selections().len(), c.ranks().len(), "{}", p.display());
    }
}

#[test]
fn h100_preset_has_pix_primaries_and_locality_ordered_backups() {
    let c = preset("h100-8gpu-8nic.toml");
    assert_eq!(c.name(), Some("h100-8gpu-8nic"));
    assert_eq!((c.nodes().len(), c.ranks().len(), c.rails()), (2, 16, 8));
    let n0 = c.node(NodeId(0)).unwrap();
    assert_eq!(n0.hostname, "h100-0");
    assert_eq!(c.node(NodeId(1)).unwrap().hostname, "h100-1");
    assert_eq!(n0.nic_mbps(), 8 * 400_000);
    assert!(n0.is_nvlinked(0, 7) && n0.is_nvlinked(3, 4));
    let desc = TopologyDescription::from_file(&preset_dir().join("h100-8gpu-8nic.toml")).unwrap();
    assert!(desc.spec_for_host("h100-1").is_some());
    assert!(desc.spec_for_host("elsewhere").is_some(), "a single entry applies to any host");
    assert_eq!(n0.gpu_gpu_class(0, 5), Some(PathClass::NvLink));
    assert_eq!(n0.gpu_nic_class(0, RailId(0)), Some(PathClass::Pix));
    assert_eq!(n0.gpu_nic_class(0, RailId(1)), Some(PathClass::Phb));
    assert_eq!(n0.gpu_nic_class(0, RailId(3)), Some(PathClass::Node));
    assert_eq!(n0.gpu_nic_class(0, RailId(4)), Some(PathClass::Sys));

    assert_eq!(rails(&c, 0), (vec![0], vec![1, 2, 3, 4, 5, 6, 7]));
    assert_eq!(rails(&c, 1), (vec![1], vec![0, 2, 3, 4, 5, 6, 7]));
    assert_eq!(rails(&c, 3), (vec![3], vec![2, 0, 1, 4, 5, 6, 7]));
    assert_eq!(rails(&c, 5), (vec![5], vec![4, 6, 7, 0, 1, 2, 3]));
    assert_eq!(rails(&c, 7), (vec![7], vec![6, 4, 5, 0, 1, 2, 3]));
    // Node 1 mirrors node 0.
    let s = c.select_nics(Rank(13)).unwrap();
    assert_eq!(s.node, NodeId(1));
    assert_eq!(s.primaries().collect::<Vec<_>>(), vec![NicId::new(1, 5)]);
    let classes: Vec<PathClass> = s.chain.iter().map(|r| r.class).collect();
    use PathClass::*;
    assert_eq!(classes, vec![Pix, Phb, Node, Node, Sys, Sys, Sys, Sys]);

    // The backup chain skips failed NICs in order.
    let mut view = c.health_view();
    assert_eq!(view.nic(NicId::new(0, 0)).unwrap().nominal_mbps, 400_000);
    assert_eq!(s.first_usable(&view), Some(NicId::new(1, 5)));
    view.set_failed(NicId::new(1, 5)).unwrap();
    view.set_failed(NicId::new(1, 4)).unwrap();
    assert_eq!(s.first_usable(&view), Some(NicId::new(1, 6)));
}

#[test]
fn small_cluster_preset_shares_the_third_nic_as_first_backup() {
    let c = preset("small-2gpu-3nic.toml");
    assert_eq!((c.nodes().len(), c.ranks().len(), c.rails()), (3, 6, 3));
    for n in c.nodes() {
        assert!(n.nics.iter().all(|x| x.speed_mbps == 10_000 && !x.is_virtual && x.link_up));
        assert!(!n.is_nvlinked(0, 1));
        assert_eq!(n.gpu_gpu_class(0, 1), Some(PathClass::Node));
    }
    for node in 0..3 {
        assert_eq!(rails(&c, 2 * node), (vec![0], vec![2, 1]));
        assert_eq!(rails(&c, 2 * node + 1), (vec![1], vec![2, 0]));
    }
    assert_eq!(c.ranks_on(NodeId(1)).collect::<Vec<_>>(), vec![Rank(2), Rank(3)]);
    assert!((c.health_view().node(NodeId(0)).unwrap().nominal_mbps()) == 30_000);
}

#[test]
fn testbed_preset_uses_every_veth_rail() {
    let c = preset("testbed.toml");
    assert_eq!((c.nodes().len(), c.ranks().len(), c.rails()), (4, 4, 2));
    for (i, n) in c.nodes().iter().enumerate() {
        assert_eq!(n.hostname, format!("testbed-node{i}"));
        let names: Vec<&str> = n.nics.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["rail0", "rail1"]);
        assert!(n.nics.iter().all(|x| x.is_virtual && x.pci.is_none() && x.speed_mbps == 1000));
    }
    for r in 0..4 {
        let s = c.select_nics(Rank(r)).unwrap();
        assert_eq!(s.node, NodeId(r));
        assert_eq!(s.primaries().collect::<Vec<_>>(), vec![NicId::new(r, 0), NicId::new(r, 1)]);
        assert_eq!(s.backups().count(), 0);
        assert!(s.chain.iter().all(|x| x.class == PathClass::Node));
    }
    assert_eq!(c.health_view(), r2ccl_core::HealthView::uniform(4, 2, 1000));
}

#[test]
fn dumps_load_back_to_the_same_view() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("r2ccl-topo-dumps");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["h100-8gpu-8nic.toml", "small-2gpu-3nic.toml", "testbed.toml"] {
        let c = preset(name);
        for format in [DumpFormat::Toml, DumpFormat::Json] {
            let text = render_cluster(&c, format).unwrap();
            let desc = match format {
                DumpFormat::Toml => TopologyDescription::from_toml_str(&text).unwrap(),
                DumpFormat::Json => TopologyDescription::from_json_str(&text).unwrap(),
            };
            assert_eq!(desc.resolve().unwrap(), c, "{name} via {format:?}");
        }
        let json = dir.join(name.replace(".toml", ".json"));
        write_cluster_view(&json, &c, None).unwrap();
        assert!(std::fs::read_to_string(&json).unwrap().starts_with('{'));
        assert_eq!(load_cluster_file(&json).unwrap(), c);
        let toml = dir.join(name);
        write_cluster_view(&toml, &c, Some(DumpFormat::Toml)).unwrap();
        assert_eq!(load_cluster_file(&toml).unwrap(), c);
    }
    assert!("yaml".parse::<DumpFormat>().is_err());
    assert_eq!("JSON".parse::<DumpFormat>().unwrap(), DumpFormat::Json);
}

#[test]
fn the_binary_dumps_a_preset_that_loads_back() {
    let file = preset_dir().join("small-2gpu-3nic.toml");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_r2ccl-topo")).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let f = file.to_str().unwrap();
    let toml = run(&["dump", "--file", f]);
    assert_eq!(TopologyDescription::from_toml_str(&toml).unwrap().resolve().unwrap(), preset("small-2gpu-3nic.toml"));
    let json = run(&["dump", "--format", "json", "--file", f]);
    assert_eq!(TopologyDescription::from_json_str(&json).unwrap().resolve().unwrap(), preset("small-2gpu-3nic.toml"));
    let nics: Vec<r2ccl_topo::NicSelection> =
        serde_json::from_str(&run(&["nics", "--format", "json", "--file", f])).unwrap();
    assert_eq!(nics, preset("small-2gpu-3nic.toml").nic_selections());
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_r2ccl-topo")).args(["dump", "--format", "yaml"]).output();
    assert!(!bad.unwrap().status.success());
}
