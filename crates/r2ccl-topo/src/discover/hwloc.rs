//! hwloc discovery (feature `hwloc`) through `hwlocality`: cores, hardware threads,
//! NUMA nodes, the PCI tree and the locality of network devices.

use crate::discover::{DiscoveredNic, LocalDiscovery};
use crate::model::NumaNode;
use crate::pci::{host_bridge_label, switches_from_bridges, PciAddr};
use hwlocality::bitmap::Bitmap;
use hwlocality::object::attributes::{DownstreamAttributes, ObjectAttributes, UpstreamAttributes};
use hwlocality::object::types::{BridgeType, OSDeviceType, ObjectType};
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use hwlocality::Topology;

/// hwloc could not load the topology.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HwlocError {
    /// Building the topology failed.
    #[error("hwloc topology could not be built: {0}")]
    Build(String),
}

/// A PCI device with its place in the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HwlocPciDevice {
    /// Its address.
    pub addr: PciAddr,
    /// PCI class (e.g. 0x0200 Ethernet, 0x0302 3D controller).
    pub class_id: u16,
    /// Vendor id.
    pub vendor_id: u16,
    /// Device id.
    pub device_id: u16,
    /// NUMA node, when the device is local to exactly one.
    pub numa: Option<u32>,
    /// CPUs local to the device (cpulist).
    pub local_cpus: Option<String>,
    /// Host bridge label `domain:bus`.
    pub host_bridge: Option<String>,
    /// PCIe switches, outermost first.
    pub switches: Vec<String>,
}

/// A network OS device (`eth0`, `ens1f0`, `ib0`) and the PCI device behind it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HwlocNic {
    /// Interface name.
    pub name: String,
    /// The PCI device it belongs to, if hwloc attached it to one.
    pub pci: Option<HwlocPciDevice>,
    /// NUMA node, when local to exactly one.
    pub numa: Option<u32>,
    /// CPUs local to the NIC (cpulist).
    pub local_cpus: Option<String>,
}

/// What hwloc reports about this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HwlocView {
    /// Physical cores.
    pub cores: u32,
    /// Hardware threads.
    pub pus: u32,
    /// NUMA nodes with cpulists and memory.
    pub numa_nodes: Vec<NumaNode>,
    /// Every PCI device hwloc kept (NICs, GPUs, storage, ...).
    pub pci_devices: Vec<HwlocPciDevice>,
    /// Network OS devices.
    pub nics: Vec<HwlocNic>,
}

/// A bitmap as a Linux list (`0-27,56-83`); the typed sets print as `CpuSet(..)`.
fn cpulist(set: &impl AsRef<Bitmap>) -> String {
    set.as_ref().to_string()
}

fn pci_addr_of(obj: &TopologyObject) -> Option<PciAddr> {
    match obj.attributes()? {
        ObjectAttributes::PCIDevice(p) => {
            Some(PciAddr::new(u32::from(p.domain()), p.bus_id(), p.bus_device(), p.function()))
        }
        ObjectAttributes::Bridge(b) => match b.upstream_attributes()? {
            UpstreamAttributes::PCI(p) => {
                Some(PciAddr::new(u32::from(p.domain()), p.bus_id(), p.bus_device(), p.function()))
            }
        },
        _ => None,
    }
}

/// NUMA node and cpulist of the nearest non-I/O ancestor.
fn cpu_locality(obj: &TopologyObject) -> (Option<u32>, Option<String>) {
    let Some(anchor) = obj.first_non_io_ancestor() else { return (None, None) };
    let numa = anchor.nodeset().and_then(|ns| {
        if ns.weight() == Some(1) {
            ns.first_set().and_then(|i| u32::try_from(usize::from(i)).ok())
        } else {
            None
        }
    });
    (numa, anchor.cpuset().map(|c| cpulist(&c)))
}

fn pci_device(obj: &TopologyObject) -> Option<HwlocPciDevice> {
    let ObjectAttributes::PCIDevice(p) = obj.attributes()? else { return None };
    let addr = pci_addr_of(obj)?;
    let mut bridges = Vec::new();
    let mut host_bridge = None;
    for a in obj.ancestors() {
        if a.object_type() != ObjectType::Bridge {
            continue;
        }
        let Some(ObjectAttributes::Bridge(b)) = a.attributes() else { continue };
        match b.upstream_type() {
            BridgeType::Host => {
                if let Some(DownstreamAttributes::PCI(d)) = b.downstream_attributes() {
                    host_bridge = Some(host_bridge_label(u32::from(d.domain()), d.secondary_bus()));
                }
            }
            _ => {
                if let Some(addr) = pci_addr_of(a) {
                    bridges.push(addr);
                }
            }
        }
    }
    bridges.reverse();
    let (numa, local_cpus) = cpu_locality(obj);
    Some(HwlocPciDevice {
        addr,
        class_id: p.class_id(),
        vendor_id: p.vendor_id(),
        device_id: p.device_id(),
        numa,
        local_cpus,
        host_bridge,
        switches: switches_from_bridges(&bridges),
    })
}

/// Load this machine's topology with I/O devices and read what r2ccl needs.
pub fn discover_hwloc() -> Result<HwlocView, HwlocError> {
    let topo = Topology::builder()
        .with_io_type_filter(TypeFilter::KeepImportant)
        .map_err(|e| HwlocError::Build(e.to_string()))?
        .build()
        .map_err(|e| HwlocError::Build(e.to_string()))?;
    let count = |t| u32::try_from(topo.objects_with_type(t).count()).unwrap_or(u32::MAX);
    let numa_nodes = topo
        .objects_with_type(ObjectType::NUMANode)
        .filter_map(|n| {
            let id = u32::try_from(n.os_index()?).ok()?;
            let memory_bytes = match n.attributes() {
                Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map(u64::from),
                _ => None,
            };
            Some(NumaNode { id, cpus: n.cpuset().map(|c| cpulist(&c)), memory_bytes })
        })
        .collect();
    let pci_devices = topo.pci_devices().filter_map(pci_device).collect();
    let nics = topo
        .objects_with_type(ObjectType::OSDevice)
        .filter(|o| matches!(o.attributes(), Some(ObjectAttributes::OSDevice(a)) if a.device_type() == OSDeviceType::Network))
        .filter_map(|o| {
            let name = o.name()?.to_str().ok()?.to_owned();
            let pci = o.ancestors().find(|a| a.object_type() == ObjectType::PCIDevice).and_then(pci_device);
            let (numa, local_cpus) = cpu_locality(o);
            Some(HwlocNic { name, pci, numa, local_cpus })
        })
        .collect();
    Ok(HwlocView { cores: count(ObjectType::Core), pus: count(ObjectType::PU), numa_nodes, pci_devices, nics })
}

impl HwlocView {
    /// Fill `d` with what hwloc knows and sysfs did not: cores and threads, NUMA
    /// nodes with memory, and the PCI placement and NUMA node of each NIC.
    pub fn apply_to(self, d: &mut LocalDiscovery) {
        d.cores = Some(self.cores);
        d.pus = Some(self.pus);
        if !self.numa_nodes.is_empty() {
            d.numa_nodes = self.numa_nodes;
        }
        for h in self.nics {
            let idx = match d.nics.iter().position(|n| n.name == h.name) {
                Some(i) => i,
                None => {
                    d.nics.push(DiscoveredNic { name: h.name.clone(), ..Default::default() });
                    d.nics.len() - 1
                }
            };
            let n = &mut d.nics[idx];
            n.numa = n.numa.or(h.numa).or_else(|| h.pci.as_ref().and_then(|p| p.numa));
            n.local_cpus = n.local_cpus.take().or(h.local_cpus);
            if let Some(p) = h.pci {
                n.pci = n.pci.or(Some(p.addr));
                n.host_bridge = n.host_bridge.take().or(p.host_bridge);
                if n.switches.is_empty() {
                    n.switches = p.switches;
                }
                n.is_virtual = false;
            }
        }
    }
}
