//! `NodeTopology::backup_chain`: a NIC's traffic goes to the nearest other NIC first (same PCIe
//! switch, host bridge, NUMA node, then the rest), each class in rail order after the NIC.

use r2ccl_core::RailId;
use r2ccl_topo::{Nic, NodeTopology};

fn nic(rail: u16, numa: Option<u32>, bridge: Option<&str>, switch: Option<&str>) -> Nic {
    Nic {
        name: format!("nic{rail}"),
        rail: RailId(rail),
        speed_mbps: 100_000,
        link_up: true,
        is_virtual: false,
        numa,
        pci: None,
        host_bridge: bridge.map(str::to_owned),
        switches: switch.map(|s| vec![s.to_owned()]).unwrap_or_default(),
    }
}

fn rails(node: &NodeTopology, rail: u16) -> Vec<u16> {
    node.backup_chain(RailId(rail)).into_iter().map(|r| r.0).collect()
}

#[test]
fn the_same_numa_node_comes_first_then_rail_order_after_the_nic() {
    let mut node = NodeTopology::empty("a");
    node.nics = vec![nic(0, Some(0), None, None), nic(1, Some(0), None, None), nic(2, Some(1), None, None)];
    node.nics.push(nic(3, Some(1), None, None));
    assert_eq!(rails(&node, 0), [1, 2, 3]);
    assert_eq!(rails(&node, 1), [0, 2, 3]);
    assert_eq!(rails(&node, 2), [3, 0, 1]);
    assert_eq!(rails(&node, 3), [2, 0, 1]);
    // Unknown locality: rail order after the NIC.
    for n in &mut node.nics {
        n.numa = None;
    }
    assert_eq!(rails(&node, 2), [3, 0, 1]);
    assert!(rails(&node, 7).is_empty(), "a rail the node lacks");
}

#[test]
fn a_shared_pcie_switch_beats_a_shared_host_bridge_which_beats_a_shared_numa_node() {
    let mut node = NodeTopology::empty("b");
    node.nics = vec![
        nic(0, Some(0), Some("hb0"), Some("sw0")),
        nic(1, Some(0), Some("hb1"), None),
        nic(2, Some(0), Some("hb0"), Some("sw1")),
        nic(3, Some(0), Some("hb0"), Some("sw0")),
        nic(4, Some(1), Some("hb2"), None),
    ];
    // NIC 3 shares NIC 0's switch, NIC 2 its host bridge, NIC 1 its NUMA node, NIC 4 nothing.
    assert_eq!(rails(&node, 0), [3, 2, 1, 4]);
}
