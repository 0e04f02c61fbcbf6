//! sysfs/netdev parsing from fixture trees the tests build: a physical NIC behind a
//! PCIe switch with its NUMA node, a veth, a link that is down, a driver without a
//! speed (virtio-style device below the PCI function), and loopback.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a test failure with a message")]

use r2ccl_core::RailId;
use r2ccl_topo::discover::sysfs::{numa_nodes, pci_placement, read_interface, scan_netdev};
use r2ccl_topo::discover::{discover_local, DiscoverOptions, Source, FALLBACK_SPEED_MBPS};
use r2ccl_topo::{Locality, NodeSpec, PathClass, PciAddr, TopologyDescription, ValidationError};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// A fresh fixture root under the target's temp dir.
fn fixture(name: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sysfs-fixtures").join(name);
    let _ = fs::remove_dir_all(&root);
    fs::create_dir_all(root.join("class/net")).unwrap();
    fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
    root
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// `../` repeated `n` times.
fn up(n: usize) -> String {
    "../".repeat(n)
}

/// A PCI function at `devices/<chain>` (chain relative to `devices`), registered in
/// `bus/pci/devices`, with an optional `numa_node` file.
fn pci_function(root: &Path, chain: &str, numa: Option<&str>) -> PathBuf {
    let dir = root.join("devices").join(chain);
    fs::create_dir_all(&dir).unwrap();
    if let Some(n) = numa {
        write(&dir.join("numa_node"), n);
    }
    let addr = chain.rsplit('/').next().unwrap();
    symlink(format!("../../../devices/{chain}"), root.join("bus/pci/devices").join(addr)).unwrap();
    dir
}

/// An interface whose device directory is `devices/<device_chain>`; `files` are
/// written into the interface directory.
fn netdev(root: &Path, device_chain: Option<&str>, name: &str, files: &[(&str, &str)]) {
    let iface_rel = match device_chain {
        Some(c) => format!("devices/{c}/net/{name}"),
        None => format!("devices/virtual/net/{name}"),
    };
    let iface = root.join(&iface_rel);
    fs::create_dir_all(&iface).unwrap();
    for (f, text) in files {
        write(&iface.join(f), text);
    }
    if device_chain.is_some() {
        // net/<name>/device -> ../../ (the device directory)
        symlink("../../", iface.join("device")).unwrap();
    }
    symlink(format!("{}{iface_rel}", up(2)), root.join("class/net").join(name)).unwrap();
}

const SWITCH_NIC: &str = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0";
const SWITCH_GPU: &str = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:10.0/0000:05:00.0";
const DOWN_NIC: &str = "pci0000:00/0000:00:02.0/0000:04:00.0";
const VIRTIO: &str = "pci0000:00/0000:00:03.0";

/// The whole machine: every case in one tree.
fn machine(name: &str) -> PathBuf {
    let root = fixture(name);
    pci_function(&root, SWITCH_NIC, Some("1"));
    pci_function(&root, SWITCH_GPU, Some("1"));
    pci_function(&root, DOWN_NIC, Some("-1"));
    pci_function(&root, VIRTIO, Some("0"));
    netdev(&root, Some(SWITCH_NIC), "ens1f0", &[("operstate", "up\n"), ("speed", "100000\n"), ("type", "1\n")]);
    // Link down: reading `speed` fails on a real kernel; here the file is absent.
    netdev(&root, Some(DOWN_NIC), "enp4s0", &[("operstate", "down\n"), ("carrier", "0\n"), ("type", "1\n")]);
    // virtio: the netdev hangs below a virtio device below the PCI function, which is
    // the one with numa_node; the driver reports speed -1.
    netdev(&root, Some(&format!("{VIRTIO}/virtio2")), "eth0", &[("operstate", "up\n"), ("speed", "-1\n")]);
    netdev(&root, None, "veth0", &[("operstate", "up\n"), ("speed", "10000\n"), ("type", "1\n")]);
    netdev(&root, None, "lo", &[("operstate", "unknown\n"), ("carrier", "1\n"), ("type", "772\n")]);
    write(&root.join("devices/system/node/node0/cpulist"), "0-3\n");
    write(&root.join("devices/system/node/node1/cpulist"), "4-7\n");
    root
}

#[test]
fn physical_nic_behind_a_switch_has_numa_pci_and_switch() {
    let root = machine("physical");
    let nic = read_interface(&root, "ens1f0").unwrap();
    assert_eq!(nic.link_up, Some(true));
    assert_eq!(nic.speed_mbps, Some(100_000));
    assert_eq!(nic.numa, Some(1));
    assert_eq!(nic.pci, Some(PciAddr::new(0, 3, 0, 0)));
    assert_eq!(nic.host_bridge.as_deref(), Some("0000:00"));
    assert_eq!(nic.switches, vec!["0000:01:00.0".to_owned()]);
    assert!(!nic.is_virtual && !nic.is_loopback);

    // A GPU under another downstream port of the same switch is PIX from the NIC.
    let gpu = pci_placement(&root, PciAddr::new(0, 5, 0, 0)).unwrap();
    assert_eq!(gpu.switches, nic.switches);
    let l = Locality { numa: gpu.numa, host_bridge: gpu.host_bridge.as_deref(), switches: &gpu.switches };
    assert_eq!(
        l.class_to(&Locality { numa: nic.numa, host_bridge: nic.host_bridge.as_deref(), switches: &nic.switches }),
        PathClass::Pix
    );
}

#[test]
fn veth_has_no_pci_device() {
    let root = machine("veth");
    let nic = read_interface(&root, "veth0").unwrap();
    assert!(nic.is_virtual);
    assert_eq!((nic.pci, nic.numa, nic.host_bridge.clone()), (None, None, None));
    assert_eq!((nic.link_up, nic.speed_mbps), (Some(true), Some(10_000)));
}

#[test]
fn link_down_and_unknown_numa() {
    let root = machine("down");
    let nic = read_interface(&root, "enp4s0").unwrap();
    assert_eq!(nic.link_up, Some(false));
    assert_eq!(nic.speed_mbps, None);
    assert_eq!(nic.numa, None, "numa_node -1 means unknown");
    assert_eq!(nic.pci, Some(PciAddr::new(0, 4, 0, 0)));
    assert!(nic.switches.is_empty(), "only a root port above it");
}

#[test]
fn missing_speed_and_numa_from_the_pci_function() {
    let root = machine("virtio");
    let nic = read_interface(&root, "eth0").unwrap();
    assert_eq!(nic.speed_mbps, None);
    assert_eq!(nic.pci, Some(PciAddr::new(0, 0, 3, 0)));
    assert_eq!(nic.numa, Some(0));
    assert!(!nic.is_virtual);
}

#[test]
fn scan_lists_everything_and_numa_nodes_are_read() {
    let root = machine("scan");
    let nics = scan_netdev(&root).unwrap();
    let names: Vec<&str> = nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["enp4s0", "ens1f0", "eth0", "lo", "veth0"]);
    assert!(nics.iter().find(|n| n.name == "lo").unwrap().is_loopback);
    let numa = numa_nodes(&root).unwrap();
    assert_eq!(
        numa.iter().map(|n| (n.id, n.cpus.clone().unwrap())).collect::<Vec<_>>(),
        [(0, "0-3".to_owned()), (1, "4-7".to_owned())]
    );
    assert!(scan_netdev(&root.join("nonexistent")).is_err());
    assert!(read_interface(&root, "nope").is_err());
}

fn opts(root: &Path) -> DiscoverOptions {
    DiscoverOptions { sysfs_root: root.into(), hwloc: false, nvml: false, hostname: Some("fx".into()) }
}

#[test]
fn discovery_alone_uses_physical_nics_in_pci_order() {
    let root = machine("discover");
    let d = discover_local(&opts(&root));
    assert_eq!(d.hostname, "fx");
    assert!(d.notes.iter().any(|n| n.source == Source::Sysfs && n.message.contains("eth0")), "{:?}", d.notes);
    let node = d.to_node();
    let names: Vec<(&str, u16)> = node.nics.iter().map(|n| (n.name.as_str(), n.rail.0)).collect();
    assert_eq!(names, [("eth0", 0), ("ens1f0", 1), ("enp4s0", 2)]);
    assert_eq!(node.nic_on_rail(RailId(0)).unwrap().speed_mbps, FALLBACK_SPEED_MBPS);
    assert!(!node.nic_named("enp4s0").unwrap().link_up);
    assert_eq!(node.numa_nodes.len(), 2);

    // A sysfs root that does not exist: a note, an empty machine, no failure.
    let empty = discover_local(&opts(&root.join("missing")));
    assert!(empty.nics.is_empty());
    assert!(empty.notes.iter().any(|n| n.source == Source::Sysfs));
}

#[test]
fn a_description_fills_in_what_discovery_cannot_see() {
    let root = machine("overlay");
    let d = discover_local(&opts(&root));
    let desc = TopologyDescription::from_toml_str(
        r#"
        [[nodes]]
        [[nodes.nics]]
        name = "veth0"
        speed_mbps = 1000
        numa = 0
        [[nodes.nics]]
        name = "ens1f0"
        rail = 1
        "#,
    )
    .unwrap();
    let c = desc.resolve_with(|_, _| d.clone()).unwrap();
    let n = &c.nodes()[0];
    assert_eq!(n.hostname, "fx", "discovered host name kept");
    let veth = n.nic_named("veth0").unwrap();
    assert_eq!(
        (veth.rail, veth.speed_mbps, veth.numa, veth.is_virtual, veth.link_up),
        (RailId(0), 1000, Some(0), true, true)
    );
    let ens = n.nic_named("ens1f0").unwrap();
    assert_eq!((ens.rail, ens.speed_mbps, ens.numa), (RailId(1), 100_000, Some(1)), "discovered speed and NUMA");
    assert_eq!(n.nics.len(), 2, "a NIC list in the description is exact");

    // A described NIC discovery does not know needs its speed.
    let spec = NodeSpec {
        nics: vec![r2ccl_topo::NicSpec { name: Some("ghost0".into()), ..Default::default() }],
        ..Default::default()
    };
    assert_eq!(
        spec.overlay("nodes[0]", d, None).unwrap_err(),
        ValidationError::MissingField { field: "nodes[0].nics[0].speed_mbps".into() }
    );
}
