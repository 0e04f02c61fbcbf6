//! Discovery on the machine the tests run on: hwloc finds NUMA nodes, cores and the
//! NIC `eth0` with its locality; NVML reports no GPUs without failing.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a test failure with a message")]

use r2ccl_topo::discover::{discover_local, DiscoverOptions, Source};
use std::path::Path;

fn has_eth0() -> bool {
    Path::new("/sys/class/net/eth0").exists()
}

#[cfg(feature = "hwloc")]
#[test]
fn hwloc_finds_numa_nodes_cores_and_eth0_locality() {
    let view = r2ccl_topo::discover::hwloc::discover_hwloc().unwrap();
    assert!(!view.numa_nodes.is_empty());
    assert!(view.cores >= 1 && view.pus >= view.cores, "cores {} pus {}", view.cores, view.pus);
    assert!(view.numa_nodes.iter().all(|n| n.cpus.as_deref().is_some_and(|c| !c.is_empty())), "{view:?}");
    if !has_eth0() {
        return;
    }
    let sys = r2ccl_topo::discover::sysfs::read_interface(Path::new("/sys"), "eth0").unwrap();
    let eth0 = view.nics.iter().find(|n| n.name == "eth0");
    match sys.pci {
        Some(addr) => {
            // On the project's machines eth0 is virtio-net: the netdev hangs below a
            // virtio device below PCI function 0000:00:03.0, whose sysfs numa_node is
            // -1 (single-node VM). hwloc still attaches eth0 to that PCI device and
            // places it in the machine's NUMA node.
            let eth0 = eth0.unwrap_or_else(|| panic!("hwloc did not list eth0: {:?}", view.nics));
            let pci = eth0.pci.as_ref().unwrap();
            assert_eq!(pci.addr, addr);
            assert_eq!(pci.class_id >> 8, 0x02, "a network controller");
            assert_eq!(pci.host_bridge, sys.host_bridge);
            assert!(eth0.local_cpus.as_deref().is_some_and(|c| !c.is_empty()));
            let numa = eth0.numa.or(sys.numa);
            if view.numa_nodes.len() == 1 {
                assert_eq!(numa, Some(view.numa_nodes[0].id));
            }
        }
        None => {
            // eth0 without a PCI device (a veth in a container): hwloc has no PCI
            // device for it, discovery counts it as virtual.
            assert!(eth0.is_none_or(|e| e.pci.is_none()));
            assert!(sys.is_virtual);
        }
    }
}

#[test]
fn local_discovery_puts_eth0_on_a_rail_with_its_locality() {
    let d = discover_local(&DiscoverOptions::default());
    assert!(!d.hostname.is_empty());
    assert!(d.nics.iter().any(|n| n.is_loopback), "lo is listed (and never a data NIC)");
    if cfg!(feature = "hwloc") {
        assert!(d.cores.is_some_and(|c| c >= 1));
        assert!(!d.numa_nodes.is_empty());
    } else {
        assert!(d.notes.iter().any(|n| n.source == Source::Hwloc));
    }
    let node = d.to_node();
    assert!(node.nics.iter().all(|n| n.speed_mbps > 0 && !n.is_virtual));
    if has_eth0() && d.nic("eth0").unwrap().pci.is_some() {
        let eth0 = node.nic_named("eth0").unwrap();
        assert!(eth0.pci.is_some() && eth0.host_bridge.is_some());
        if cfg!(feature = "hwloc") {
            assert!(eth0.numa.is_some(), "hwloc fills the NUMA node sysfs lacks: {eth0:?}");
        }
    }
    // The discovered node makes a valid one-node cluster.
    let desc = r2ccl_topo::TopologyDescription { nodes: vec![Default::default()], ..Default::default() };
    let c = desc.resolve_with(|_, _| d.clone()).unwrap();
    assert_eq!(c.nodes()[0].hostname, d.hostname);
    assert_eq!(c.ranks().len(), 1);
}

#[test]
fn gpus_absent_is_a_clean_result() {
    let d = discover_local(&DiscoverOptions::default());
    assert!(d.notes.iter().any(|n| n.source == Source::Nvml && n.message.contains("no GPUs")) || !d.gpus.is_empty());
    #[cfg(feature = "nvml")]
    {
        let scan = r2ccl_topo::discover::nvml::discover_gpus();
        if scan.gpus.is_empty() {
            assert!(scan.unavailable.is_some(), "no GPUs must say why");
            assert!(scan.nvlinks.is_empty() && !scan.nvswitch);
        }
    }
}

#[test]
fn host_key_tells_network_namespaces_apart() {
    let key = r2ccl_topo::discover::host_key();
    assert!(key.starts_with(&r2ccl_topo::discover::hostname()));
    if Path::new("/proc/self/ns/net").exists() {
        assert!(key.contains("net:["), "{key}");
    }
}
