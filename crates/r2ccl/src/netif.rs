//! Local network interfaces for the communicator's defaults: the IPv4 address of the OOB
//! interface (`R2CCL_OOB_IFACE`), the interface that holds an address, and the data NICs
//! discovery picks when `R2CCL_NICS` is not set (never the OOB interface when others exist).

use std::net::{IpAddr, Ipv4Addr};

/// Every `(interface, IPv4 address)` of this network namespace (`getifaddrs`).
pub fn ipv4_addresses() -> Vec<(String, Ipv4Addr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() && !ifa.ifa_name.is_null() {
            // SAFETY: ifa_addr points to a sockaddr whose family says how to read it.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                // SAFETY: ifa_name is a NUL-terminated C string.
                let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
                out.push((name, Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The IPv4 address of interface `name`, if it has one.
pub fn iface_ipv4(name: &str) -> Option<Ipv4Addr> {
    ipv4_addresses().into_iter().find(|(n, _)| n == name).map(|(_, a)| a)
}

/// The interface that holds `ip`, if any.
pub fn iface_of(ip: IpAddr) -> Option<String> {
    let IpAddr::V4(v4) = ip else { return None };
    ipv4_addresses().into_iter().find(|(_, a)| *a == v4).map(|(n, _)| n)
}

/// Data NICs when none are configured: the physical NICs discovery finds, without `oob` when
/// others remain; `lo` when there are none (a single-host run).
pub fn default_data_nics(oob: Option<&str>) -> Vec<String> {
    let found = r2ccl_topo::discover::discover_local(&r2ccl_topo::discover::DiscoverOptions {
        hwloc: false,
        nvml: false,
        ..Default::default()
    });
    let all: Vec<String> =
        found.data_nics().into_iter().filter(|n| n.link_up != Some(false)).map(|n| n.name.clone()).collect();
    let without_oob: Vec<String> = all.iter().filter(|n| Some(n.as_str()) != oob).cloned().collect();
    if !without_oob.is_empty() {
        without_oob
    } else if !all.is_empty() {
        all
    } else {
        vec!["lo".to_owned()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_its_address_and_is_found_by_it() {
        assert_eq!(iface_ipv4("lo"), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(iface_of(IpAddr::V4(Ipv4Addr::LOCALHOST)).as_deref(), Some("lo"));
        assert_eq!(iface_ipv4("no-such-interface0"), None);
    }

    #[test]
    fn default_data_nics_never_returns_nothing() {
        let nics = default_data_nics(None);
        assert!(!nics.is_empty());
        assert!(!default_data_nics(nics.first().map(String::as_str)).is_empty());
    }
}
