//! Linux sysfs/netdev discovery: interfaces from `<root>/class/net`, their link state,
//! speed, NUMA node and PCI placement, NUMA nodes from `<root>/devices/system/node`.
//!
//! The root is injectable (`/sys` in production) so tests build fixture trees.
//! Device placement is read from where `class/net/<if>/device` resolves to under
//! `<root>/devices`: `pciDDDD:BB` names the host bridge, the PCI addresses after it
//! are the bridges down to the device, the last one is the device itself.

use crate::discover::DiscoveredNic;
use crate::error::SysfsError;
use crate::model::NumaNode;
use crate::pci::{host_bridge_label, switches_from_bridges, PciAddr};
use std::fs;
use std::path::{Path, PathBuf};

/// Where a PCI device sits: its address, NUMA node, host bridge and switches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PciPlacement {
    /// The device's own address, if the path has one.
    pub addr: Option<PciAddr>,
    /// NUMA node (`numa_node` of the device; -1 = unknown).
    pub numa: Option<u32>,
    /// Host bridge label `domain:bus`.
    pub host_bridge: Option<String>,
    /// PCIe switches, outermost first.
    pub switches: Vec<String>,
    /// CPUs local to the device (`local_cpulist`).
    pub local_cpus: Option<String>,
}

fn read_trim(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

fn read_numa(dir: &Path) -> Option<u32> {
    read_trim(&dir.join("numa_node")).and_then(|s| s.parse::<i64>().ok()).and_then(|v| u32::try_from(v).ok())
}

/// Placement of the device whose sysfs directory is `device_dir` (any path that
/// resolves under `<root>/devices`).
pub fn placement_of(root: &Path, device_dir: &Path) -> Result<PciPlacement, SysfsError> {
    let real = fs::canonicalize(device_dir).map_err(|source| SysfsError::Io { path: device_dir.into(), source })?;
    let devices = root.join("devices");
    let devices = fs::canonicalize(&devices).map_err(|source| SysfsError::Io { path: devices.clone(), source })?;
    let rel = real.strip_prefix(&devices).unwrap_or(&real);
    let mut placement = PciPlacement::default();
    let mut chain: Vec<(PciAddr, PathBuf)> = Vec::new();
    let mut cur = devices.clone();
    for comp in rel.components() {
        cur.push(comp);
        let Some(name) = comp.as_os_str().to_str() else { continue };
        if let Some(hb) = name.strip_prefix("pci") {
            if let Some((d, b)) = hb.split_once(':') {
                if let (Ok(d), Ok(b)) = (u32::from_str_radix(d, 16), u8::from_str_radix(b, 16)) {
                    placement.host_bridge = Some(host_bridge_label(d, b));
                }
            }
        } else if let Ok(addr) = name.parse::<PciAddr>() {
            chain.push((addr, cur.clone()));
        }
    }
    if let Some((addr, dir)) = chain.pop() {
        placement.addr = Some(addr);
        placement.numa = read_numa(&real).or_else(|| read_numa(&dir));
        placement.local_cpus = read_trim(&dir.join("local_cpulist"));
    } else {
        placement.numa = read_numa(&real);
    }
    let bridges: Vec<PciAddr> = chain.into_iter().map(|(a, _)| a).collect();
    placement.switches = switches_from_bridges(&bridges);
    Ok(placement)
}

/// Placement of the PCI device `addr` (`<root>/bus/pci/devices/<addr>`).
pub fn pci_placement(root: &Path, addr: PciAddr) -> Result<PciPlacement, SysfsError> {
    placement_of(root, &root.join("bus/pci/devices").join(addr.to_string()))
}

fn link_state(dir: &Path) -> Option<bool> {
    match read_trim(&dir.join("operstate")).as_deref() {
        Some("up") => Some(true),
        Some("down" | "lowerlayerdown" | "notpresent" | "dormant") => Some(false),
        _ => match read_trim(&dir.join("carrier")).as_deref() {
            Some("1") => Some(true),
            Some("0") => Some(false),
            _ => None,
        },
    }
}

fn speed(dir: &Path) -> Option<u64> {
    // Reading `speed` fails with EINVAL on links that are down or have no speed;
    // drivers without one print -1 (or 4294967295 from older kernels).
    read_trim(&dir.join("speed"))
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|&v| v > 0 && v != i64::from(u32::MAX))
        .and_then(|v| u64::try_from(v).ok())
}

/// One interface directory (`<root>/class/net/<name>`).
pub fn read_interface(root: &Path, name: &str) -> Result<DiscoveredNic, SysfsError> {
    let dir = root.join("class/net").join(name);
    if !dir.exists() {
        return Err(SysfsError::Io { path: dir, source: std::io::ErrorKind::NotFound.into() });
    }
    let kind = read_trim(&dir.join("type")).and_then(|t| t.parse::<u32>().ok());
    let mut nic = DiscoveredNic {
        name: name.to_owned(),
        link_up: link_state(&dir),
        speed_mbps: speed(&dir),
        is_loopback: name == "lo" || kind == Some(772),
        ..Default::default()
    };
    let device = dir.join("device");
    if device.exists() {
        let p = placement_of(root, &device)?;
        nic.pci = p.addr;
        nic.numa = p.numa;
        nic.host_bridge = p.host_bridge;
        nic.switches = p.switches;
        nic.local_cpus = p.local_cpus;
        nic.is_virtual = p.addr.is_none();
    } else {
        // veth, bridges, ifb, tunnels: no device behind the interface; their
        // locality has to come from configuration.
        nic.is_virtual = true;
    }
    Ok(nic)
}

/// Every interface under `<root>/class/net`, sorted by name.
pub fn scan_netdev(root: &Path) -> Result<Vec<DiscoveredNic>, SysfsError> {
    let dir = root.join("class/net");
    let entries = fs::read_dir(&dir).map_err(|source| SysfsError::Io { path: dir.clone(), source })?;
    let mut names: Vec<String> =
        entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str().map(str::to_owned)).collect();
    names.sort();
    names.iter().map(|n| read_interface(root, n)).collect()
}

/// NUMA nodes from `<root>/devices/system/node/node*` (with their cpulists); empty
/// when the kernel has no NUMA support.
pub fn numa_nodes(root: &Path) -> Result<Vec<NumaNode>, SysfsError> {
    let dir = root.join("devices/system/node");
    let entries = match fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(SysfsError::Io { path: dir, source }),
    };
    let mut out: Vec<NumaNode> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let id = name.strip_prefix("node")?.parse::<u32>().ok()?;
            Some(NumaNode { id, cpus: read_trim(&e.path().join("cpulist")), memory_bytes: None })
        })
        .collect();
    out.sort_by_key(|n| n.id);
    Ok(out)
}
