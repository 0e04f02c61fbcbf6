//! Local discovery: sysfs/netdev, hwloc and NVML, each optional and each failing
//! cleanly (a failed or absent source leaves a [`SourceNote`] and discovery goes on).

#[cfg(feature = "hwloc")]
pub mod hwloc;
#[cfg(feature = "nvml")]
pub mod nvml;
pub mod sysfs;

use crate::model::{Gpu, Nic, NodeTopology, NumaNode};
use crate::pci::PciAddr;
use r2ccl_core::RailId;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// Speed assumed for a physical NIC whose driver reports none (virtio, some VFs),
/// Mbit/s. NCCL's socket transport assumes the same.
pub const FALLBACK_SPEED_MBPS: u64 = 10_000;

/// A network interface as discovery saw it (all interfaces, data NICs or not).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoveredNic {
    /// Interface name.
    pub name: String,
    /// Link state, if the kernel says.
    pub link_up: Option<bool>,
    /// Line rate in Mbit/s, if the driver reports one.
    pub speed_mbps: Option<u64>,
    /// NUMA node, if known.
    pub numa: Option<u32>,
    /// PCI address of the device behind the interface, if any.
    pub pci: Option<PciAddr>,
    /// PCIe host bridge label, if known.
    pub host_bridge: Option<String>,
    /// PCIe switches from the host bridge down to the device, outermost first.
    pub switches: Vec<String>,
    /// CPUs local to the device (cpulist), if known.
    pub local_cpus: Option<String>,
    /// No device behind it (veth, bridge, tunnel, ifb).
    pub is_virtual: bool,
    /// The loopback interface.
    pub is_loopback: bool,
}

/// A discovery source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// Linux `/sys/class/net` and `/sys/bus/pci`.
    Sysfs,
    /// The hwloc library.
    Hwloc,
    /// NVIDIA's NVML.
    Nvml,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Sysfs => "sysfs",
            Self::Hwloc => "hwloc",
            Self::Nvml => "nvml",
        })
    }
}

/// Something a source could not do or had to assume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceNote {
    /// The source.
    pub source: Source,
    /// What happened.
    pub message: String,
}

/// What local discovery found on this machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalDiscovery {
    /// Host name.
    pub hostname: String,
    /// Physical cores.
    pub cores: Option<u32>,
    /// Hardware threads.
    pub pus: Option<u32>,
    /// NUMA nodes.
    pub numa_nodes: Vec<NumaNode>,
    /// Every network interface.
    pub nics: Vec<DiscoveredNic>,
    /// GPUs.
    pub gpus: Vec<Gpu>,
    /// GPUs linked all-to-all through NVSwitch.
    pub nvswitch: bool,
    /// Direct NVLinks between GPU indices.
    pub nvlinks: Vec<[u32; 2]>,
    /// Sources that failed, were skipped or had to assume something.
    pub notes: Vec<SourceNote>,
}

impl LocalDiscovery {
    /// The discovered interface named `name`.
    pub fn nic(&self, name: &str) -> Option<&DiscoveredNic> {
        self.nics.iter().find(|n| n.name == name)
    }

    /// The interfaces discovery would use as data NICs without a description:
    /// physical (PCI-backed), not loopback, in PCI address order.
    pub fn data_nics(&self) -> Vec<&DiscoveredNic> {
        let mut v: Vec<_> = self.nics.iter().filter(|n| !n.is_virtual && !n.is_loopback && n.pci.is_some()).collect();
        v.sort_by(|a, b| (a.pci, &a.name).cmp(&(b.pci, &b.name)));
        v
    }

    /// The node as discovery alone sees it: data NICs get rails in PCI order, a NIC
    /// without a reported speed gets [`FALLBACK_SPEED_MBPS`].
    pub fn to_node(&self) -> NodeTopology {
        let nics = self
            .data_nics()
            .into_iter()
            .enumerate()
            .map(|(r, d)| Nic {
                name: d.name.clone(),
                rail: RailId(r as u16),
                speed_mbps: d.speed_mbps.unwrap_or(FALLBACK_SPEED_MBPS),
                link_up: d.link_up.unwrap_or(true),
                is_virtual: false,
                numa: d.numa,
                pci: d.pci,
                host_bridge: d.host_bridge.clone(),
                switches: d.switches.clone(),
            })
            .collect();
        NodeTopology {
            hostname: self.hostname.clone(),
            cores: self.cores,
            pus: self.pus,
            numa_nodes: self.numa_nodes.clone(),
            gpus: self.gpus.clone(),
            nics,
            nvswitch: self.nvswitch,
            nvlinks: self.nvlinks.clone(),
        }
    }

    fn note(&mut self, source: Source, message: impl Into<String>) {
        let message = message.into();
        tracing::info!(target: r2ccl_core::subsys::TOPO, %source, "{message}");
        self.notes.push(SourceNote { source, message });
    }
}

/// Which sources to use and where sysfs lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoverOptions {
    /// Root of the sysfs tree (`/sys`; tests point it at fixture trees).
    pub sysfs_root: PathBuf,
    /// Use hwloc (needs the `hwloc` feature).
    pub hwloc: bool,
    /// Use NVML (needs the `nvml` feature).
    pub nvml: bool,
    /// Host name to report; `None` reads the kernel's.
    pub hostname: Option<String>,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        Self { sysfs_root: PathBuf::from("/sys"), hwloc: true, nvml: true, hostname: None }
    }
}

/// The kernel's host name (`/proc/sys/kernel/hostname`), or `localhost`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// A key that tells nodes apart when merging local views: the host name plus the
/// network namespace (`host/net:[4026531840]`), so that namespaces of one machine
/// (the testbed's nodes) count as separate nodes.
pub fn host_key() -> String {
    match std::fs::read_link("/proc/self/ns/net") {
        Ok(ns) => format!("{}/{}", hostname(), ns.display()),
        Err(_) => hostname(),
    }
}

/// Discover this machine with every enabled source. Never fails: a source that is
/// absent or fails leaves a note in [`LocalDiscovery::notes`].
pub fn discover_local(opts: &DiscoverOptions) -> LocalDiscovery {
    let mut d = LocalDiscovery { hostname: opts.hostname.clone().unwrap_or_else(hostname), ..Default::default() };
    match sysfs::scan_netdev(&opts.sysfs_root) {
        Ok(nics) => d.nics = nics,
        Err(e) => d.note(Source::Sysfs, format!("network interfaces not read: {e}")),
    }
    match sysfs::numa_nodes(&opts.sysfs_root) {
        Ok(n) => d.numa_nodes = n,
        Err(e) => d.note(Source::Sysfs, format!("NUMA nodes not read: {e}")),
    }
    if opts.hwloc {
        apply_hwloc(&mut d);
    }
    if opts.nvml {
        apply_nvml(&mut d, opts);
    }
    let unknown_speed: Vec<String> =
        d.data_nics().iter().filter(|n| n.speed_mbps.is_none()).map(|n| n.name.clone()).collect();
    for name in unknown_speed {
        d.note(Source::Sysfs, format!("{name}: driver reports no link speed, assuming {FALLBACK_SPEED_MBPS} Mbit/s"));
    }
    d
}

#[cfg(feature = "hwloc")]
fn apply_hwloc(d: &mut LocalDiscovery) {
    match hwloc::discover_hwloc() {
        Ok(view) => view.apply_to(d),
        Err(e) => d.note(Source::Hwloc, format!("hwloc discovery failed: {e}")),
    }
}

#[cfg(not(feature = "hwloc"))]
fn apply_hwloc(d: &mut LocalDiscovery) {
    d.note(Source::Hwloc, "hwloc support not built (feature `hwloc`)");
}

#[cfg(feature = "nvml")]
fn apply_nvml(d: &mut LocalDiscovery, opts: &DiscoverOptions) {
    let scan = nvml::discover_gpus();
    if let Some(why) = &scan.unavailable {
        d.note(Source::Nvml, format!("no GPUs: {why}"));
    }
    for mut g in scan.gpus {
        if let Some(pci) = g.pci {
            match sysfs::pci_placement(&opts.sysfs_root, pci) {
                Ok(p) => {
                    g.numa = g.numa.or(p.numa);
                    g.host_bridge = p.host_bridge;
                    g.switches = p.switches;
                }
                Err(e) => d.note(Source::Sysfs, format!("GPU {} at {pci}: locality not read: {e}", g.index)),
            }
        }
        d.gpus.push(g);
    }
    d.nvswitch = scan.nvswitch;
    d.nvlinks = scan.nvlinks;
}

#[cfg(not(feature = "nvml"))]
fn apply_nvml(d: &mut LocalDiscovery, _opts: &DiscoverOptions) {
    d.note(Source::Nvml, "NVML support not built (feature `nvml`): no GPUs");
}
