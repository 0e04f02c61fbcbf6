//! Linux link-state monitor: a non-blocking `NETLINK_ROUTE` socket subscribed to `RTMGRP_LINK`, parsing
//! `RTM_NEWLINK`/`RTM_DELLINK` into (interface index, running) changes.
//!
//! A dead local NIC must be acted on at once: TCP never reports a local drop. The socket is polled from
//! the transport's progress (one `recv` with `MSG_DONTWAIT`), no thread.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `nlmsghdr` is 16 bytes, `ifinfomsg` 16 bytes (both fixed by the kernel ABI).
const NLMSG_HDR_LEN: usize = 16;
const IFINFO_LEN: usize = 16;
/// Message types (`linux/rtnetlink.h`, `linux/netlink.h`).
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
/// Interface flags (`linux/if.h`): administratively up, and operationally running (carrier).
const IFF_UP: u32 = 0x1;
const IFF_RUNNING: u32 = 0x40;

/// One link change the kernel announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkChange {
    /// Interface index.
    pub ifindex: i32,
    /// Whether the link is usable (up, running and with carrier); false for a deleted link.
    pub up: bool,
}

/// Parse a buffer of netlink messages; anything that is not a well-formed link message is skipped.
pub fn parse_link_messages(mut buf: &[u8]) -> Vec<LinkChange> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDR_LEN {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        if len < NLMSG_HDR_LEN || len > buf.len() {
            break;
        }
        let body = &buf[NLMSG_HDR_LEN..len];
        if (kind == RTM_NEWLINK || kind == RTM_DELLINK) && body.len() >= IFINFO_LEN {
            let ifindex = i32::from_ne_bytes([body[4], body[5], body[6], body[7]]);
            let flags = u32::from_ne_bytes([body[8], body[9], body[10], body[11]]);
            // `lo` does not report IFF_LOWER_UP on every kernel; RUNNING is what carrier loss clears.
            let running = flags & IFF_UP != 0 && flags & IFF_RUNNING != 0;
            out.push(LinkChange { ifindex, up: kind == RTM_NEWLINK && running });
        }
        // Messages are 4-byte aligned.
        let next = (len + 3) & !3;
        buf = buf.get(next..).unwrap_or(&[]);
    }
    out
}

/// A netlink socket that receives link-state changes of this network namespace.
#[derive(Debug)]
pub struct LinkMonitor {
    fd: OwnedFd,
    buf: Vec<u8>,
}

impl LinkMonitor {
    /// Open the socket and join `RTMGRP_LINK`.
    pub fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2) call; the result is checked below.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_nl is a plain C struct; all-zero is valid (pid 0: the kernel assigns one).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: `addr` is a valid sockaddr_nl of the size passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const addr).cast::<libc::sockaddr>(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd, buf: vec![0; 32 * 1024] })
    }

    /// The socket, for waiting on it with `poll(2)` (readable when a link change arrived).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// Every link change received since the last call (never blocks).
    pub fn poll(&mut self) -> Vec<LinkChange> {
        let mut out = Vec::new();
        loop {
            // SAFETY: the buffer is writable for its length; the descriptor is ours.
            let n = unsafe {
                libc::recv(self.fd.as_raw_fd(), self.buf.as_mut_ptr().cast(), self.buf.len(), libc::MSG_DONTWAIT)
            };
            let Ok(n) = usize::try_from(n) else { break };
            if n == 0 {
                break;
            }
            out.extend(parse_link_messages(&self.buf[..n]));
        }
        out
    }
}

/// The interface index of `name` in this namespace, if it exists.
pub fn ifindex(name: &str) -> Option<i32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    i32::try_from(idx).ok().filter(|&i| i > 0)
}

/// Whether interface `name` is up and running now (`SIOCGIFFLAGS`-free: reads sysfs `flags`).
pub fn is_running(name: &str) -> Option<bool> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{name}/flags")).ok()?;
    let flags = u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()?;
    let carrier = std::fs::read_to_string(format!("/sys/class/net/{name}/carrier")).ok();
    let carrier_ok = carrier.is_none_or(|c| c.trim() != "0");
    Some(flags & IFF_UP != 0 && carrier_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u16, ifindex: i32, flags: u32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDR_LEN + IFINFO_LEN + 3) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&[0, 0, 1, 0]);
        m.extend_from_slice(&ifindex.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(&[0xAA; 3]);
        m.push(0); // padding to 4 bytes
        m
    }

    #[test]
    fn parses_link_up_down_and_delete_and_skips_garbage() {
        let mut buf = msg(RTM_NEWLINK, 3, IFF_UP | IFF_RUNNING | 0x1_0000);
        buf.extend(msg(RTM_NEWLINK, 4, IFF_UP));
        buf.extend(msg(20, 5, IFF_UP | IFF_RUNNING)); // RTM_NEWADDR: ignored
        buf.extend(msg(RTM_DELLINK, 6, IFF_UP | IFF_RUNNING));
        buf.extend([1, 2, 3]); // truncated tail
        assert_eq!(
            parse_link_messages(&buf),
            vec![
                LinkChange { ifindex: 3, up: true },
                LinkChange { ifindex: 4, up: false },
                LinkChange { ifindex: 6, up: false }
            ]
        );
        assert!(parse_link_messages(&[0xFF; 40]).is_empty());
    }

    #[test]
    fn the_socket_opens_and_loopback_resolves() {
        let mut m = LinkMonitor::open().unwrap();
        let _ = m.poll();
        assert_eq!(ifindex("lo"), Some(1));
        assert_eq!(is_running("lo"), Some(true));
        assert!(ifindex("no-such-nic0").is_none());
    }
}
