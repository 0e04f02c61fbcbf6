//! Invalid descriptions are rejected with an error naming the field.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a test failure with a message")]

use r2ccl_topo::{LoadError, TopologyDescription, ValidationError};

/// A valid two-node, two-rail description; `extra` is appended to node 0's NIC list
/// or elsewhere by the tests through string replacement.
const BASE: &str = r#"
rails = 2
[[nodes]]
hostname = "a"
numa_nodes = [{ id = 0 }]
[[nodes.gpus]]
index = 0
numa = 0
[[nodes.nics]]
name = "nic0"
rail = 0
speed_mbps = 100000
pci = "0000:01:00.0"
[[nodes.nics]]
name = "nic1"
rail = 1
speed_mbps = 100000
pci = "0000:02:00.0"
[[nodes]]
hostname = "b"
[[nodes.nics]]
name = "nic0"
speed_mbps = 100000
[[nodes.nics]]
name = "nic1"
speed_mbps = 100000
"#;

fn invalid(text: &str) -> ValidationError {
    let desc = TopologyDescription::from_toml_str(text).unwrap();
    match desc.resolve() {
        Err(e) => e,
        Ok(c) => panic!("accepted: {c:?}"),
    }
}

fn field(e: &ValidationError) -> String {
    // Every message starts with the field path.
    e.to_string().split(':').next().unwrap().to_owned()
}

#[test]
fn the_base_description_is_valid() {
    let c = TopologyDescription::from_toml_str(BASE).unwrap().resolve().unwrap();
    assert_eq!((c.nodes().len(), c.ranks().len(), c.rails()), (2, 2, 2));
}

#[test]
fn duplicate_nic_name_is_rejected() {
    let e = invalid(&BASE.replacen(r#"name = "nic1""#, r#"name = "nic0""#, 1));
    assert!(matches!(&e, ValidationError::DuplicateNic { value, .. } if value == "nic0"), "{e}");
    assert_eq!(field(&e), "nodes[0].nics[1].name");
    assert!(e.to_string().contains("nodes[0].nics[0].name"), "{e}");
}

#[test]
fn duplicate_nic_pci_address_is_rejected() {
    let e = invalid(&BASE.replacen("0000:02:00.0", "0000:01:00.0", 1));
    assert_eq!(field(&e), "nodes[0].nics[1].pci");
    assert!(matches!(e, ValidationError::DuplicateNic { .. }));
}

#[test]
fn unknown_rail_is_rejected() {
    let e = invalid(&BASE.replacen("rail = 1", "rail = 5", 1));
    assert_eq!(e, ValidationError::UnknownRail { field: "nodes[0].nics[1].rail".into(), rail: 5, rails: 2 });
    let e = invalid(&BASE.replacen("rail = 1", "rail = -1", 1));
    assert_eq!(field(&e), "nodes[0].nics[1].rail");
}

#[test]
fn duplicate_and_missing_rails_are_rejected() {
    let e = invalid(&BASE.replacen("rail = 1", "rail = 0", 1));
    assert!(matches!(e, ValidationError::DuplicateRail { rail: 0, .. }));
    assert_eq!(field(&e), "nodes[0].nics[1].rail");
    let e = invalid(&BASE.replacen("rails = 2", "rails = 3", 1));
    assert_eq!(e, ValidationError::MissingRail { field: "nodes[0].nics".into(), rail: 2, rails: 3 });
}

#[test]
fn negative_and_zero_speeds_are_rejected() {
    let e = invalid(&BASE.replacen("speed_mbps = 100000", "speed_mbps = -400", 2));
    assert_eq!(e, ValidationError::InvalidSpeed { field: "nodes[0].nics[0].speed_mbps".into(), value: -400 });
    let e = invalid(&BASE.replace("name = \"nic1\"\nspeed_mbps = 100000", "name = \"nic1\"\nspeed_mbps = 0"));
    assert_eq!(e, ValidationError::InvalidSpeed { field: "nodes[1].nics[1].speed_mbps".into(), value: 0 });
    // Without discovery a NIC must say its speed.
    let e = invalid(&BASE.replace("name = \"nic1\"\nspeed_mbps = 100000", "name = \"nic1\""));
    assert_eq!(e, ValidationError::MissingField { field: "nodes[1].nics[1].speed_mbps".into() });
}

#[test]
fn rank_without_a_node_is_rejected() {
    let ranks = "\n[[ranks]]\nnode = 0\ngpu = 0\n[[ranks]]\ngpu = 0\n";
    let e = invalid(&format!("{BASE}{ranks}"));
    assert_eq!(e, ValidationError::RankWithoutNode { field: "ranks[1].node".into(), rank: 1, node: None, nodes: 2 });
    let e = invalid(&format!("{BASE}\n[[ranks]]\nnode = 0\n[[ranks]]\nnode = 7\n"));
    assert_eq!(field(&e), "ranks[1].node");
    assert!(e.to_string().contains("node 7 does not exist"), "{e}");
}

#[test]
fn bad_rank_lists_are_rejected() {
    let e = invalid(&format!("{BASE}\n[[ranks]]\nrank = 0\nnode = 0\n[[ranks]]\nrank = 0\nnode = 1\n"));
    assert_eq!(e, ValidationError::DuplicateRank { field: "ranks[1].rank".into(), rank: 0 });
    let e = invalid(&format!("{BASE}\n[[ranks]]\nnode = 1\ngpu = 3\n"));
    assert_eq!(e, ValidationError::UnknownGpu { field: "ranks[0].gpu".into(), gpu: 3 });
    let e = invalid(&format!("{BASE}\n[[ranks]]\nnode = 0\nnuma = 4\n"));
    assert_eq!(field(&e), "ranks[0].numa");
}

#[test]
fn other_broken_references_are_rejected() {
    let e = invalid(&BASE.replacen("hostname = \"a\"", "hostname = \"a\"\nnvlinks = [[0, 2]]", 1));
    assert_eq!(e, ValidationError::UnknownGpu { field: "nodes[0].nvlinks[0]".into(), gpu: 2 });
    let e = invalid(&BASE.replacen("index = 0\nnuma = 0", "index = 0\nnuma = 1", 1));
    assert_eq!(field(&e), "nodes[0].gpus[0].numa");
    let e = invalid(&BASE.replacen("hostname = \"b\"", "hostname = \"b\"\ncount = 0", 1));
    assert_eq!(e, ValidationError::InvalidCount { field: "nodes[1].count".into(), value: 0 });
    let e = invalid(&BASE.replacen("name = \"nic0\"\nrail = 0", "rail = 0", 1));
    assert_eq!(e, ValidationError::MissingField { field: "nodes[0].nics[0].name".into() });
}

#[test]
fn syntax_errors_unknown_keys_and_bad_values_name_the_key() {
    for (text, key) in [
        (BASE.replacen("speed_mbps", "speed_gbps", 1), "speed_gbps"),
        (BASE.replacen("0000:01:00.0", "01-00", 1), "01-00"),
        (BASE.replacen("rails = 2", "rails = \"two\"", 1), "rails"),
    ] {
        match TopologyDescription::from_toml_str(&text) {
            Err(e @ LoadError::Parse { .. }) => assert!(e.to_string().contains(key), "{e}"),
            other => panic!("{key}: {other:?}"),
        }
    }
}
