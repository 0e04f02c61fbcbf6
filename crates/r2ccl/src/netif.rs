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

/// Every interface of this network namespace (`/sys/class/net`), sorted.
pub fn interface_names() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    out.sort();
    out
}

/// The data NICs a `transport.nics` list (`R2CCL_NICS`) names, written as `NCCL_SOCKET_IFNAME`
/// and `NCCL_IB_HCA` are: an entry that is an interface's name is that interface (repeating one
/// runs several rails over it, as `lo,lo` does on one host); `=name` is `name` exactly; any other
/// entry is a prefix and stands for every interface it starts (`eth` for `eth0,eth1`, in natural
/// order), or for itself when none does (opening it then fails as a NIC of its own, a dead rail);
/// a list that starts with `^` is every data NIC of `discovered` except those the prefixes (or
/// `=` names) match. `interfaces`: every interface of the namespace. The rail order is the
/// result's order, so every node must resolve its list to its NICs in the same rail order.
pub fn select_nics(spec: &[String], interfaces: &[String], discovered: &[String]) -> Result<Vec<String>, String> {
    let matches = |pattern: &str, name: &str| match pattern.strip_prefix('=') {
        Some(exact) => name == exact,
        None => name.starts_with(pattern),
    };
    let natural = |a: &&String, b: &&String| {
        let split = |s: &str| {
            let digits = s.len() - s.bytes().rev().take_while(u8::is_ascii_digit).count();
            (s[..digits].to_owned(), s[digits..].parse::<u64>().unwrap_or(0), s.len())
        };
        split(a).cmp(&split(b))
    };
    if let Some(first) = spec.first().and_then(|f| f.strip_prefix('^')) {
        let excluded: Vec<&str> =
            std::iter::once(first).chain(spec[1..].iter().map(String::as_str)).filter(|p| !p.is_empty()).collect();
        let kept: Vec<String> =
            discovered.iter().filter(|n| !excluded.iter().any(|p| matches(p, n))).cloned().collect();
        if kept.is_empty() {
            return Err(format!("transport.nics {spec:?} excludes every data NIC of {discovered:?}"));
        }
        return Ok(kept);
    }
    let mut out = Vec::new();
    for entry in spec {
        if let Some(exact) = entry.strip_prefix('=') {
            out.push(exact.to_owned());
        } else if interfaces.iter().any(|i| i == entry) {
            out.push(entry.clone());
        } else {
            let mut found: Vec<&String> = interfaces.iter().filter(|i| matches(entry, i)).collect();
            found.sort_by(natural);
            if found.is_empty() {
                out.push(entry.clone());
            } else {
                out.extend(found.into_iter().cloned());
            }
        }
    }
    Ok(out)
}

/// The OOB interface and its IPv4 address that a `bootstrap.oob_iface` (`R2CCL_OOB_IFACE`) spec
/// picks among `addresses` (`(interface, address)`, as [`ipv4_addresses`] lists them), written
/// as `NCCL_SOCKET_IFNAME` is: an interface's name, `=name` exactly, a prefix (the first matching
/// interface in natural order), or `^p,q` (the first interface other than `lo` matching
/// neither, `lo` only when nothing else is left). `None` when nothing matches (or `spec` is empty).
pub fn select_oob(spec: &str, addresses: &[(String, Ipv4Addr)]) -> Option<(String, Ipv4Addr)> {
    if spec.is_empty() {
        return None;
    }
    let mut sorted: Vec<&(String, Ipv4Addr)> = addresses.iter().collect();
    sorted.sort_by_key(|(n, _)| {
        let digits = n.len() - n.bytes().rev().take_while(u8::is_ascii_digit).count();
        (n[..digits].to_owned(), n[digits..].parse::<u64>().unwrap_or(0), n.len())
    });
    let matches = |p: &str, name: &str| match p.strip_prefix('=') {
        Some(exact) => name == exact,
        None => name.starts_with(p),
    };
    if let Some(rest) = spec.strip_prefix('^') {
        let excluded: Vec<&str> = rest.split(',').map(str::trim).filter(|p| !p.is_empty()).collect();
        let kept: Vec<&&(String, Ipv4Addr)> =
            sorted.iter().filter(|(n, _)| !excluded.iter().any(|p| matches(p, n))).collect();
        return kept.iter().find(|(n, _)| n != "lo").or_else(|| kept.first()).map(|&&a| a.clone());
    }
    if let Some(exact) = sorted.iter().find(|(n, _)| n == spec) {
        return Some((*exact).clone());
    }
    sorted.into_iter().find(|(n, _)| matches(spec, n)).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oob_interface_takes_names_prefixes_and_exclusions() {
        let a = |n: &str, last: u8| (n.to_owned(), Ipv4Addr::new(10, 0, 0, last));
        let addrs = vec![a("lo", 1), a("eth10", 2), a("eth2", 3), a("docker0", 4), a("ib0", 5)];
        let pick = |spec: &str| select_oob(spec, &addrs).map(|(n, _)| n);
        assert_eq!(pick("eth10").as_deref(), Some("eth10"));
        assert_eq!(pick("eth").as_deref(), Some("eth2"));
        assert_eq!(pick("=eth").as_deref(), None);
        assert_eq!(pick("^docker,eth").as_deref(), Some("ib0"));
        assert_eq!(pick("^docker,eth,ib").as_deref(), Some("lo"));
        assert_eq!(pick("nosuch").as_deref(), None);
        assert_eq!(pick("").as_deref(), None);
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn nic_lists_take_names_prefixes_exact_names_and_exclusions() {
        let ifs = names(&["eth0", "eth1", "eth10", "eth2", "ib0", "lo", "rail0", "rail1"]);
        let data = names(&["eth0", "eth1", "eth2", "eth10", "ib0"]);
        let sel = |spec: &[&str]| select_nics(&names(spec), &ifs, &data);
        assert_eq!(sel(&["lo", "lo"]).unwrap(), names(&["lo", "lo"]));
        assert_eq!(sel(&["eth"]).unwrap(), names(&["eth0", "eth1", "eth2", "eth10"]));
        assert_eq!(sel(&["rail1", "rail0"]).unwrap(), names(&["rail1", "rail0"]));
        assert_eq!(sel(&["=eth1", "ib"]).unwrap(), names(&["eth1", "ib0"]));
        assert_eq!(sel(&["^eth"]).unwrap(), names(&["ib0"]));
        assert_eq!(sel(&["^ib", "=eth10"]).unwrap(), names(&["eth0", "eth1", "eth2"]));
        // A name that is no interface and no prefix of one stays: opening it fails, a dead rail.
        assert_eq!(sel(&["lo", "nosuch0"]).unwrap(), names(&["lo", "nosuch0"]));
        let err = sel(&["^eth", "ib"]).unwrap_err();
        assert!(err.contains("excludes every data NIC"), "{err}");
    }

    #[test]
    fn loopback_has_its_address_and_is_found_by_it() {
        assert_eq!(select_oob("lo", &ipv4_addresses()).map(|(_, a)| a), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(iface_of(IpAddr::V4(Ipv4Addr::LOCALHOST)).as_deref(), Some("lo"));
        assert_eq!(select_oob("no-such-interface0", &ipv4_addresses()), None);
    }

    #[test]
    fn default_data_nics_never_returns_nothing() {
        let nics = default_data_nics(None);
        assert!(!nics.is_empty());
        assert!(!default_data_nics(nics.first().map(String::as_str)).is_empty());
    }
}
