//! PCI addresses and locality (NUMA node, host bridge, PCIe switch chain) with the
//! NCCL-style path classes derived from them.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A PCI address `domain:bus:device.function`, e.g. `0000:18:00.0`.
///
/// Parses both the 4-digit domain of sysfs/hwloc and the 8-digit domain NVML prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddr {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number (0-31).
    pub device: u8,
    /// Function number (0-7).
    pub function: u8,
}

/// A string that is not a PCI address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a PCI address (expected DDDD:BB:DD.F, hexadecimal)")]
pub struct PciAddrError(pub String);

impl PciAddr {
    /// The address `domain:bus:device.function`.
    pub const fn new(domain: u32, bus: u8, device: u8, function: u8) -> Self {
        Self { domain, bus, device, function }
    }
}

impl FromStr for PciAddr {
    type Err = PciAddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PciAddrError(s.to_owned());
        let (rest, function) = s.rsplit_once('.').ok_or_else(err)?;
        let mut parts = rest.split(':');
        let (domain, bus, device) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(d), Some(b), Some(v), None) => (d, b, v),
            (Some(b), Some(v), None, None) => ("0", b, v),
            _ => return Err(err()),
        };
        let hex_ok = |p: &str, max_len: usize| !p.is_empty() && p.len() <= max_len;
        if !hex_ok(domain, 8) || !hex_ok(bus, 2) || !hex_ok(device, 2) || !hex_ok(function, 1) {
            return Err(err());
        }
        let domain = u32::from_str_radix(domain, 16).map_err(|_| err())?;
        let bus = u8::from_str_radix(bus, 16).map_err(|_| err())?;
        let device = u8::from_str_radix(device, 16).map_err(|_| err())?;
        let function = u8::from_str_radix(function, 16).map_err(|_| err())?;
        if device > 31 || function > 7 {
            return Err(err());
        }
        Ok(Self { domain, bus, device, function })
    }
}

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

impl Serialize for PciAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PciAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Distance class between two devices of a node, as NCCL users know them
/// (`NCCL_P2P_LEVEL`, `NCCL_NET_GDR_LEVEL`), nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PathClass {
    /// Direct NVLink between two GPUs (only GPU-to-GPU paths have this class).
    #[serde(rename = "NVL")]
    NvLink,
    /// Through at most one PCIe switch: both devices hang off the same switch.
    #[serde(rename = "PIX")]
    Pix,
    /// Through several PCIe switches, without crossing the host bridge.
    #[serde(rename = "PXB")]
    Pxb,
    /// Through the PCIe host bridge (same root complex, same CPU).
    #[serde(rename = "PHB")]
    Phb,
    /// Across host bridges inside one NUMA node.
    #[serde(rename = "NODE")]
    Node,
    /// Across the SMP interconnect between NUMA nodes, or locality unknown.
    #[serde(rename = "SYS")]
    Sys,
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NvLink => "NVL",
            Self::Pix => "PIX",
            Self::Pxb => "PXB",
            Self::Phb => "PHB",
            Self::Node => "NODE",
            Self::Sys => "SYS",
        })
    }
}

/// Where a device sits in its node: NUMA node, PCIe host bridge and the chain of PCIe
/// switches from the host bridge down to the device (outermost first).
///
/// Switch and host-bridge ids are opaque labels, unique within a node: discovery uses
/// PCI addresses (the switch's upstream port, `domain:bus` of the host bridge),
/// descriptions may use any name (`"sw0"`, `"hb1"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Locality<'a> {
    /// NUMA node, if known.
    pub numa: Option<u32>,
    /// PCIe host bridge (root complex), if known.
    pub host_bridge: Option<&'a str>,
    /// PCIe switches from the host bridge down to the device, outermost first.
    pub switches: &'a [String],
}

impl Locality<'_> {
    /// The PCIe/NUMA distance class between two devices (never [`PathClass::NvLink`]).
    ///
    /// Same innermost switch: PIX; a shared outer switch: PXB; same host bridge: PHB;
    /// same NUMA node: NODE; otherwise (or unknown): SYS.
    pub fn class_to(&self, other: &Locality<'_>) -> PathClass {
        if let (Some(a), Some(b)) = (self.switches.last(), other.switches.last()) {
            if a == b {
                return PathClass::Pix;
            }
        }
        if let (Some(a), Some(b)) = (self.switches.first(), other.switches.first()) {
            if a == b {
                return PathClass::Pxb;
            }
        }
        if self.host_bridge.is_some() && self.host_bridge == other.host_bridge {
            return PathClass::Phb;
        }
        if self.numa.is_some() && self.numa == other.numa {
            return PathClass::Node;
        }
        PathClass::Sys
    }
}

/// PCIe switches seen from a chain of PCI-to-PCI bridges between the host bridge and a
/// device (outermost first, the device itself excluded).
///
/// The first bridge is the root port of the host bridge; after it bridges come in
/// pairs (switch upstream port, switch downstream port). A switch is named by its
/// upstream port's address, so two devices under different downstream ports of one
/// switch share it.
pub fn switches_from_bridges(bridges: &[PciAddr]) -> Vec<String> {
    bridges.iter().skip(1).step_by(2).map(ToString::to_string).collect()
}

/// The host-bridge label discovery uses: `domain:bus` of the root bus, e.g. `0000:00`.
pub fn host_bridge_label(domain: u32, bus: u8) -> String {
    format!("{domain:04x}:{bus:02x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_parse_and_print() {
        let a: PciAddr = "0000:18:00.0".parse().unwrap();
        assert_eq!(a, PciAddr::new(0, 0x18, 0, 0));
        let nvml: PciAddr = "00000001:3b:1f.7".parse().unwrap();
        assert_eq!(nvml, PciAddr::new(1, 0x3b, 0x1f, 7));
        assert_eq!(nvml.to_string(), "0001:3b:1f.7");
        let short: PciAddr = "3b:00.1".parse().unwrap();
        assert_eq!(short, PciAddr::new(0, 0x3b, 0, 1));
        for bad in ["", "0000:18:00", "0000:18:20.0", "0000:18:00.8", "zz:00.0", "0000:100:00.0", "virtio2"] {
            assert!(bad.parse::<PciAddr>().is_err(), "{bad} parsed");
        }
    }

    fn loc<'a>(switches: &'a [String], host_bridge: Option<&'a str>, numa: Option<u32>) -> Locality<'a> {
        Locality { numa, host_bridge, switches }
    }

    #[test]
    fn path_classes_follow_the_switch_chain() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let (sw0, sw1, none) = (s(&["top", "sw0"]), s(&["top", "sw1"]), Vec::new());
        let a = loc(&sw0, Some("hb0"), Some(0));
        assert_eq!(a.class_to(&loc(&sw0, Some("hb0"), Some(0))), PathClass::Pix);
        assert_eq!(a.class_to(&loc(&sw1, Some("hb0"), Some(0))), PathClass::Pxb);
        assert_eq!(a.class_to(&loc(&none, Some("hb0"), Some(0))), PathClass::Phb);
        assert_eq!(a.class_to(&loc(&none, Some("hb1"), Some(0))), PathClass::Node);
        assert_eq!(a.class_to(&loc(&none, Some("hb1"), Some(1))), PathClass::Sys);
        assert_eq!(loc(&none, None, None).class_to(&loc(&none, None, None)), PathClass::Sys);
        assert!(PathClass::NvLink < PathClass::Pix && PathClass::Node < PathClass::Sys);
    }

    #[test]
    fn switches_are_named_by_upstream_ports() {
        let chain = [PciAddr::new(0, 0, 1, 0), PciAddr::new(0, 1, 0, 0), PciAddr::new(0, 2, 8, 0)];
        assert_eq!(switches_from_bridges(&chain), vec!["0000:01:00.0".to_owned()]);
        assert!(switches_from_bridges(&chain[..1]).is_empty());
        assert!(switches_from_bridges(&[]).is_empty());
    }
}
