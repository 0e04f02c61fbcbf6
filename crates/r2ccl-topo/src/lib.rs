//! r2ccl-topo: the topology of an r2ccl cluster, and how to find it.
//!
//! # What it does
//!
//! - **Model** ([`ClusterTopology`], [`NodeTopology`], [`Nic`], [`Gpu`],
//!   [`RankPlacement`]): nodes with NUMA nodes, GPUs and NICs (rail, speed, NUMA node,
//!   PCI address, PCIe host bridge and switch chain), NVLink between GPUs, and where
//!   every rank runs. Distances between devices use the classes NCCL users know
//!   ([`PathClass`]: NVL, PIX, PXB, PHB, NODE, SYS). A `ClusterTopology` is always
//!   valid: [`ClusterTopology::new`] rejects duplicate NICs, unknown or missing rails,
//!   zero speeds, ranks without a node, and the like with a [`ValidationError`]
//!   naming the field (`nodes[0].nics[2].speed_mbps`).
//! - **Discovery** ([`discover::discover_local`]), every source optional and failing
//!   cleanly into a [`discover::SourceNote`]: Linux sysfs/netdev (interfaces, link
//!   state, speed, NUMA node, PCI placement; root path injectable), hwloc (feature
//!   `hwloc`, off by default: cores, threads, NUMA nodes, PCI tree, NIC locality) and NVML
//!   (feature `nvml`: GPUs, NVLink; no driver = "no GPUs").
//! - **Static descriptions** ([`TopologyDescription`], TOML or JSON, schema in
//!   [`description`]): presets in `configs/topo/` and site files that override or
//!   fill in what discovery cannot see (veth NICs have no PCI device, virtio reports
//!   no speed).
//! - **NIC selection** ([`ClusterTopology::select_nics`]): each rank's primary NICs
//!   and its ordered backup chain by locality (same PCIe switch, same host bridge,
//!   same NUMA node, then the rest).
//! - **Cluster view** ([`ClusterTopology::merge`]) from every rank's [`LocalView`],
//!   the starting [`r2ccl_core::HealthView`] ([`ClusterTopology::health_view`]), and
//!   dumps ([`write_cluster_view`]) that load back as descriptions. The binary
//!   `r2ccl-topo dump [--format toml|json] [--file PRESET]` prints them.
//!
//! # What it does not do
//!
//! No health tracking (that is the [`r2ccl_core::HealthView`] and `r2ccl-detect`), no
//! planning or weights (`r2ccl-policy`), no communication: the facade gathers the
//! local views. It never reads the environment: `R2CCL_TOPO_DUMP_FILE` is read by the
//! facade, which then calls [`write_cluster_view`]. Only discovery does IO (sysfs,
//! hwloc, NVML, the description and dump files); the model, validation, selection
//! and merging are pure.
//!
//! # Example
//!
//! Two nodes with two 100 Gb/s NICs each, described inline, resolved into a validated
//! view; the rank on node 1 gets a primary NIC and a backup chain that skips failed NICs.
//! `examples/discover_dump.rs` discovers this machine and dumps it, and loads a preset.
//!
//! ```rust
//! use r2ccl_core::{NicId, Rank};
//! use r2ccl_topo::TopologyDescription;
//!
//! let desc = TopologyDescription::from_toml_str(
//!     r#"
//!     [[nodes]]
//!     hostname = "n{i}"
//!     count = 2
//!     nics = [{ name = "eth0", speed_mbps = 100000 }, { name = "eth1", speed_mbps = 100000 }]
//!     "#,
//! )?;
//! let cluster = desc.resolve()?;
//! assert_eq!((cluster.nodes().len(), cluster.rails(), cluster.ranks().len()), (2, 2, 2));
//! assert_eq!(cluster.nodes()[1].hostname, "n1");
//!
//! let selection = cluster.select_nics(Rank(1)).ok_or("rank 1 has no NICs")?;
//! let mut health = cluster.health_view();
//! let primary = selection.first_usable(&health).ok_or("no usable NIC")?;
//! health.set_failed(primary)?;
//! let backup = selection.first_usable(&health).ok_or("no usable NIC")?;
//! assert_eq!((primary, backup), (NicId::new(1, 0), NicId::new(1, 1)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Why `hwlocality` and not `hwloc2`
//!
//! The design card named the `hwloc2` crate. Its 2.2.0 release panics on NUMA and PCI
//! queries and segfaults in `name()` against Debian's hwloc 2.9, so it cannot list
//! NICs at all. `hwlocality` (1.0.0-alpha.13, feature `hwloc-2_8_0`, linked to the
//! system hwloc through pkg-config; building it needs `libhwloc-dev` and
//! `libudev-dev`) works against the same library: it lists NUMA nodes, cores, PCI
//! devices with their bridges, and network devices with their CPU locality. It is
//! still an alpha, which is why it sits behind the `hwloc` feature and why sysfs
//! alone gives a usable topology when the feature is off or hwloc fails.
//!
//! # Features
//!
//! - `cli` (default): the `r2ccl-topo` binary and its one extra dependency (`anyhow`).
//! - `hwloc` (off by default, so the crate links no system library unless asked): hwloc
//!   discovery; needs `libhwloc-dev`, `libudev-dev`, `pkg-config` to build.
//! - `nvml`: NVML discovery; loads `libnvidia-ml.so` at run time, so it builds and
//!   runs (reporting no GPUs) without a driver.

pub mod description;
pub mod discover;
mod dump;
mod error;
mod merge;
mod model;
mod pci;
mod select;
mod validate;

pub use description::{GpuSpec, NicSpec, NodeSpec, RankSpec, TopologyDescription};
pub use dump::{render_cluster, render_description, write_cluster_view, DumpFormat};
pub use error::{DumpError, LoadError, MergeError, SysfsError, ValidationError};
pub use merge::LocalView;
pub use model::{ClusterTopology, Gpu, Nic, NodeTopology, NumaNode, RankPlacement};
pub use pci::{host_bridge_label, switches_from_bridges, Locality, PathClass, PciAddr, PciAddrError};
pub use select::{NicSelection, RankedNic};

use std::path::Path;

/// Read a description file (TOML, or JSON for `*.json`) and resolve it on its own
/// into a validated cluster view.
///
/// This is how presets (`configs/topo/*.toml`) are loaded:
///
/// ```rust
/// use std::path::Path;
///
/// let presets = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/topo");
/// let cluster = r2ccl_topo::load_cluster_file(&presets.join("h100-8gpu-8nic.toml"))?;
/// assert_eq!(cluster.name(), Some("h100-8gpu-8nic"));
/// assert_eq!((cluster.nodes().len(), cluster.rails(), cluster.ranks().len()), (2, 8, 16));
/// assert!(cluster.nodes().iter().all(|n| n.nic_mbps() == 8 * 400_000));
///
/// // A missing or invalid file is an error that names the path.
/// let err = r2ccl_topo::load_cluster_file(&presets.join("no-such-preset.toml")).unwrap_err();
/// assert!(err.to_string().contains("no-such-preset.toml"));
/// # Ok::<(), r2ccl_topo::LoadError>(())
/// ```
pub fn load_cluster_file(path: &Path) -> Result<ClusterTopology, LoadError> {
    let desc = TopologyDescription::from_file(path)?;
    desc.resolve().map_err(|source| LoadError::Invalid { path: Some(path.into()), source })
}
