//! Socket addresses for UCX's client/server connection flow: a NIC's own IP address, the packed form
//! peers exchange out of band, and the C `sockaddr` UCX takes.
//!
//! Why client/server and not `ucp_worker_get_address`: over TCP, UCX 1.13 pairs the two directions of
//! worker-address endpoints into one shared socket, and force-closing such an endpoint while it still
//! has unsent bytes leaves a receive-only socket that is freed inside its own event handler when the
//! peer's close arrives (a use-after-free in `uct_tcp_iface_handle_events`). Endpoints created from a
//! socket address use point-to-point lanes instead: one socket per endpoint, closed outright.

use crate::error::UcxError;
use r2ccl_ucx_sys as sys;
use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// First byte of a packed address (format version).
const PACKED_V1: u8 = 1;

/// Pack `addr` for the address blob: version, family (4 or 6), IP bytes, port (big endian).
pub(crate) fn pack(addr: SocketAddr) -> Vec<u8> {
    let mut out = vec![PACKED_V1];
    match addr.ip() {
        IpAddr::V4(ip) => {
            out.push(4);
            out.extend_from_slice(&ip.octets());
        }
        IpAddr::V6(ip) => {
            out.push(6);
            out.extend_from_slice(&ip.octets());
        }
    }
    out.extend_from_slice(&addr.port().to_be_bytes());
    out
}

/// Unpack what [`pack`] wrote; `Err` says what is wrong with it.
pub(crate) fn unpack(bytes: &[u8]) -> Result<SocketAddr, &'static str> {
    let (&version, rest) = bytes.split_first().ok_or("empty")?;
    if version != PACKED_V1 {
        return Err("unknown format version");
    }
    let (&family, rest) = rest.split_first().ok_or("no address family")?;
    let (ip, rest) = match family {
        4 => {
            let b: [u8; 4] = rest.get(..4).and_then(|s| s.try_into().ok()).ok_or("IPv4 address cut short")?;
            (IpAddr::V4(Ipv4Addr::from(b)), &rest[4..])
        }
        6 => {
            let b: [u8; 16] = rest.get(..16).and_then(|s| s.try_into().ok()).ok_or("IPv6 address cut short")?;
            (IpAddr::V6(Ipv6Addr::from(b)), &rest[16..])
        }
        _ => return Err("unknown address family"),
    };
    let port: [u8; 2] = rest.try_into().map_err(|_| "port missing or trailing bytes")?;
    let port = u16::from_be_bytes(port);
    if port == 0 {
        return Err("port 0");
    }
    Ok(SocketAddr::new(ip, port))
}

/// A C socket address for UCX calls, kept alive by the caller for the call's duration.
pub(crate) struct RawSockaddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl RawSockaddr {
    pub(crate) fn new(addr: SocketAddr) -> Self {
        // SAFETY: sockaddr_storage is a plain C struct; all-zero is a valid (unspecified) address.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is large and aligned enough for any sockaddr type.
                unsafe { std::ptr::write((&raw mut storage).cast::<libc::sockaddr_in>(), sin) };
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: as above.
                unsafe { std::ptr::write((&raw mut storage).cast::<libc::sockaddr_in6>(), sin6) };
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        Self { storage, len: len as libc::socklen_t }
    }

    /// As UCX's `ucs_sock_addr_t`, borrowing `self`.
    pub(crate) fn as_ucs(&self) -> sys::ucs_sock_addr_t {
        sys::ucs_sock_addr_t { addr: (&raw const self.storage).cast::<sys::sockaddr>(), addrlen: self.len }
    }
}

/// The port of a socket address UCX filled in (`ucp_listener_query`), if it is IPv4 or IPv6.
pub(crate) fn port_of(storage: &sys::sockaddr_storage) -> Option<u16> {
    let family = i32::from(storage.ss_family);
    if family == libc::AF_INET {
        // SAFETY: the family says the storage holds a sockaddr_in; storage is large and aligned enough.
        let sin = unsafe { &*(&raw const *storage).cast::<libc::sockaddr_in>() };
        Some(u16::from_be(sin.sin_port))
    } else if family == libc::AF_INET6 {
        // SAFETY: as above, for sockaddr_in6.
        let sin6 = unsafe { &*(&raw const *storage).cast::<libc::sockaddr_in6>() };
        Some(u16::from_be(sin6.sin6_port))
    } else {
        None
    }
}

/// The IP address of network interface `device` to listen on: its first IPv4 address, else its first
/// IPv6 address that is not link-local.
pub(crate) fn device_ip(device: &str) -> Result<IpAddr, UcxError> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: valid out pointer; the list is freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(UcxError::NoDeviceAddress {
            device: device.to_owned(),
            why: format!("getifaddrs failed: {}", std::io::Error::last_os_error()),
        });
    }
    let mut v4 = None;
    let mut v6 = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: getifaddrs gives NUL-terminated interface names.
        if unsafe { CStr::from_ptr(ifa.ifa_name) }.to_bytes() != device.as_bytes() {
            continue;
        }
        // SAFETY: non-null sockaddr from getifaddrs; its family says which struct it is.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family == libc::AF_INET && v4.is_none() {
            // SAFETY: AF_INET entries hold a sockaddr_in.
            let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
            v4 = Some(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()));
        } else if family == libc::AF_INET6 && v6.is_none() {
            // SAFETY: AF_INET6 entries hold a sockaddr_in6.
            let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            if ip.segments()[0] & 0xffc0 != 0xfe80 {
                v6 = Some(ip);
            }
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    v4.map(IpAddr::V4).or(v6.map(IpAddr::V6)).ok_or_else(|| UcxError::NoDeviceAddress {
        device: device.to_owned(),
        why: "it has no IPv4 or global IPv6 address (or does not exist)".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_addresses_round_trip() {
        for a in ["198.18.1.2:40001", "127.0.0.1:1", "[2001:db8::7]:65535"] {
            let addr: SocketAddr = a.parse().unwrap();
            assert_eq!(unpack(&pack(addr)), Ok(addr), "{a}");
        }
    }

    #[test]
    fn malformed_packed_addresses_say_why() {
        assert_eq!(unpack(&[]), Err("empty"));
        assert_eq!(unpack(&[9, 4, 1, 2, 3, 4, 0, 1]), Err("unknown format version"));
        assert_eq!(unpack(&[1, 5, 1, 2, 3, 4, 0, 1]), Err("unknown address family"));
        assert_eq!(unpack(&[1, 4, 1, 2, 3]), Err("IPv4 address cut short"));
        assert_eq!(unpack(&[1, 4, 1, 2, 3, 4, 0]), Err("port missing or trailing bytes"));
        assert_eq!(unpack(&[1, 4, 1, 2, 3, 4, 0, 1, 0]), Err("port missing or trailing bytes"));
        assert_eq!(unpack(&[1, 4, 1, 2, 3, 4, 0, 0]), Err("port 0"));
    }

    #[test]
    fn loopback_has_an_address_and_a_missing_device_does_not() {
        assert_eq!(device_ip("lo").unwrap(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        let e = device_ip("r2ccl-no-such-nic").unwrap_err();
        assert!(e.to_string().contains("r2ccl-no-such-nic"), "{e}");
    }
}
