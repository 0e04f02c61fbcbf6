//! NVML discovery (feature `nvml`): GPUs, their PCI addresses and NVLink.
//!
//! NVML is loaded at run time; without the library or the driver the result is a
//! clean "no GPUs" with the reason, never an error or a panic.

use crate::model::Gpu;
use crate::pci::PciAddr;
use nvml_wrapper::Nvml;

/// Most NVLinks per GPU NVML knows (`NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: u32 = 18;

/// What NVML reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuScan {
    /// GPUs by device index (locality not filled in: NVML knows only the address).
    pub gpus: Vec<Gpu>,
    /// Every GPU has an active NVLink to an NVSwitch (all-to-all).
    pub nvswitch: bool,
    /// Direct GPU-to-GPU NVLinks (unordered pairs, each once).
    pub nvlinks: Vec<[u32; 2]>,
    /// Why there are no GPUs, when NVML could not be used at all.
    pub unavailable: Option<String>,
    /// Devices or links that could not be read.
    pub problems: Vec<String>,
}

/// Ask NVML for GPUs and NVLinks.
pub fn discover_gpus() -> GpuScan {
    let nvml = match Nvml::init() {
        Ok(n) => n,
        Err(e) => return GpuScan { unavailable: Some(format!("NVML unavailable: {e}")), ..Default::default() },
    };
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => return GpuScan { unavailable: Some(format!("NVML device count failed: {e}")), ..Default::default() },
    };
    let mut scan = GpuScan::default();
    if count == 0 {
        scan.unavailable = Some("NVML reports 0 devices".into());
        return scan;
    }
    let mut remote_of: Vec<(u32, Vec<PciAddr>)> = Vec::new();
    for index in 0..count {
        let dev = match nvml.device_by_index(index) {
            Ok(d) => d,
            Err(e) => {
                scan.problems.push(format!("GPU {index}: {e}"));
                continue;
            }
        };
        let pci = dev.pci_info().ok().and_then(|p| p.bus_id.parse::<PciAddr>().ok());
        let mut remotes = Vec::new();
        for link in 0..MAX_NVLINKS {
            let l = dev.link_wrapper_for(link);
            if matches!(l.is_active(), Ok(true)) {
                if let Some(r) = l.remote_pci_info().ok().and_then(|p| p.bus_id.parse::<PciAddr>().ok()) {
                    remotes.push(r);
                }
            }
        }
        remote_of.push((index, remotes));
        scan.gpus.push(Gpu { index, model: dev.name().ok(), pci, numa: None, host_bridge: None, switches: Vec::new() });
    }
    let gpu_at = |addr: PciAddr| scan.gpus.iter().find(|g| g.pci == Some(addr)).map(|g| g.index);
    let mut all_switch = !remote_of.is_empty();
    let mut pairs = Vec::new();
    for (a, remotes) in &remote_of {
        let mut reaches_switch = false;
        for &r in remotes {
            match gpu_at(r) {
                Some(b) if *a < b => pairs.push([*a, b]),
                Some(_) => {}
                None => reaches_switch = true,
            }
        }
        all_switch &= reaches_switch;
    }
    pairs.sort_unstable();
    pairs.dedup();
    scan.nvswitch = all_switch && scan.gpus.len() > 1;
    scan.nvlinks = pairs;
    scan
}
