//! Kernel evidence on a TCP path: whether this process's TCP connections from one IP address to
//! another get ACKs (`TCP_INFO` of its own sockets), so that a silent black hole is told from a
//! slow peer in tens of milliseconds instead of a probe's timeout.
//!
//! Why it is sound: the peer's kernel acknowledges every segment it gets, whether or not the
//! peer's process is scheduled. A connection with bytes in flight that has had no ACK for several
//! round trips has lost its path (a black hole, an egress drop, a dead cable), while a loaded or
//! descheduled peer still ACKs (or advertises a zero window, which leaves nothing in flight and so
//! proves nothing here). UCX does not expose its sockets: they are found among the process's file
//! descriptors by their local and remote addresses. Reads only (`getsockname`, `getpeername`,
//! `getsockopt`); a descriptor closed or reused meanwhile just gives a sample of another socket or
//! none.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// What one TCP connection's kernel state says (the fields of `struct tcp_info` used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TcpSample {
    /// Segments sent and not yet acknowledged (`tcpi_unacked`).
    pub unacked: u32,
    /// Time since the last ACK arrived (`tcpi_last_ack_recv`).
    pub since_ack: Duration,
    /// Time since the last data arrived from the peer (`tcpi_last_data_recv`).
    pub since_data: Duration,
    /// Smoothed round-trip time (`tcpi_rtt`).
    pub rtt: Duration,
    /// Its variation (`tcpi_rttvar`).
    pub rttvar: Duration,
}

/// The verdict of the kernel's evidence on one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpVerdict {
    /// Nothing conclusive: no connection with bytes in flight, or both fresh and stuck ones.
    Unknown,
    /// A connection on the path got an ACK within the quiet time, and none is stuck.
    Acking,
    /// At least one connection has bytes in flight with no ACK for `quiet` and several of its
    /// round trips, no connection on the path got an ACK within `quiet`, and no data came from
    /// the peer's NIC within `quiet` either.
    Silent,
}

/// Judge a path from the samples of its connections: [`TcpVerdict::Silent`] when one has bytes
/// in flight and no ACK for at least `quiet` (and at least `3 rtt + 4 rttvar`, so that a long
/// queue is never taken for a black hole) while none got an ACK or data within `quiet`.
///
/// Data from the peer's NIC within `quiet` means the path works, at least that way: bytes of
/// ours stuck meanwhile are congestion (a tail-drop queue locking one connection out while
/// others drain it, which is no reason for a migration), or a one-way loss that the peer, whose
/// bytes then go unacknowledged and who hears nothing from us, sees as silence and reports.
pub(crate) fn judge(samples: &[TcpSample], quiet: Duration) -> TcpVerdict {
    let fresh = samples.iter().any(|s| s.since_ack < quiet);
    let hearing = samples.iter().any(|s| s.since_data < quiet);
    let stuck = samples.iter().any(|s| s.unacked > 0 && s.since_ack >= quiet.max(3 * s.rtt + 4 * s.rttvar));
    match (fresh, stuck) {
        (false, true) if hearing => TcpVerdict::Unknown,
        (false, true) => TcpVerdict::Silent,
        (true, false) => TcpVerdict::Acking,
        _ => TcpVerdict::Unknown,
    }
}

/// One established TCP connection of this process: (local address, remote address, sample).
pub(crate) type Connection = (IpAddr, IpAddr, TcpSample);

/// Every established TCP connection of this process, with its sample: one pass over its file
/// descriptors, which [`of_path`] then filters (several paths judged at one instant share it).
pub(crate) fn snapshot() -> Vec<Connection> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let is_socket = std::fs::read_link(entry.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        let (Some(local), Some(remote)) = (sock_ip(fd, false), sock_ip(fd, true)) else { continue };
        if let Some(s) = tcp_sample(fd) {
            out.push((local, remote, s));
        }
    }
    out
}

/// The samples of the connections in `all` from `local` to `remote` (any ports).
pub(crate) fn of_path(all: &[Connection], local: IpAddr, remote: IpAddr) -> Vec<TcpSample> {
    all.iter().filter(|c| c.0 == local && c.1 == remote).map(|c| c.2).collect()
}

/// The local (`peer == false`) or remote address of socket `fd`, for IPv4 and IPv6 sockets.
fn sock_ip(fd: i32, peer: bool) -> Option<IpAddr> {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let ptr = std::ptr::addr_of_mut!(ss).cast::<libc::sockaddr>();
    // SAFETY: `ss` is large enough for any address and `len` says so; a bad fd only fails.
    let rc = unsafe {
        if peer {
            libc::getpeername(fd, ptr, &mut len)
        } else {
            libc::getsockname(fd, ptr, &mut len)
        }
    };
    if rc != 0 {
        return None;
    }
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a = unsafe { &*std::ptr::addr_of!(ss).cast::<libc::sockaddr_in>() };
            Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe { &*std::ptr::addr_of!(ss).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            // A v4-mapped address is the IPv4 peer of a dual-stack socket.
            Some(ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4))
        }
        _ => None,
    }
}

/// `TCP_INFO` of socket `fd`, if it is an established TCP connection.
fn tcp_sample(fd: i32) -> Option<TcpSample> {
    // SAFETY: tcp_info is plain old data; all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` has room for `len` bytes; the kernel writes at most that many; a non-TCP or
    // closed fd only fails.
    let rc = unsafe {
        libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, std::ptr::addr_of_mut!(info).cast(), &mut len)
    };
    // TCP_ESTABLISHED is 1 in the kernel's tcp_states.h.
    if rc != 0 || (len as usize) < 100 || info.tcpi_state != 1 {
        return None;
    }
    Some(TcpSample {
        unacked: info.tcpi_unacked,
        since_ack: Duration::from_millis(u64::from(info.tcpi_last_ack_recv)),
        since_data: Duration::from_millis(u64::from(info.tcpi_last_data_recv)),
        rtt: Duration::from_micros(u64::from(info.tcpi_rtt)),
        rttvar: Duration::from_micros(u64::from(info.tcpi_rttvar)),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail loudly")]
    use super::*;
    use std::io::{Read, Write};

    fn s(unacked: u32, since_ack_ms: u64, rtt_ms: u64) -> TcpSample {
        TcpSample {
            unacked,
            since_ack: Duration::from_millis(since_ack_ms),
            since_data: Duration::from_secs(60),
            rtt: Duration::from_millis(rtt_ms),
            rttvar: Duration::from_millis(rtt_ms / 4),
        }
    }

    #[test]
    fn a_connection_with_bytes_in_flight_and_no_ack_for_long_is_silent() {
        let q = Duration::from_millis(100);
        assert_eq!(judge(&[s(5, 150, 1)], q), TcpVerdict::Silent);
        // An idle connection alongside proves nothing either way.
        assert_eq!(judge(&[s(5, 150, 1), s(0, 9000, 1)], q), TcpVerdict::Silent);
    }

    #[test]
    fn a_long_queue_is_not_a_black_hole() {
        // 80 ms of round trip (a deep shaping queue): 150 ms without an ACK is under 3 rtt + 4 rttvar.
        assert_eq!(judge(&[s(40, 150, 80)], Duration::from_millis(100)), TcpVerdict::Unknown);
        assert_eq!(judge(&[s(40, 400, 80)], Duration::from_millis(100)), TcpVerdict::Silent);
    }

    #[test]
    fn any_fresh_ack_on_the_path_keeps_it_alive() {
        let q = Duration::from_millis(100);
        assert_eq!(judge(&[s(3, 2, 1)], q), TcpVerdict::Acking);
        assert_eq!(judge(&[s(0, 20, 1), s(0, 9000, 1)], q), TcpVerdict::Acking);
        assert_eq!(judge(&[s(3, 2, 1), s(5, 500, 1)], q), TcpVerdict::Unknown);
    }

    /// A tail-drop queue can lock one connection out for longer than the quiet time while the
    /// peer's bytes keep arriving: congestion, not a black hole (4 x 4 testbed, direct levels).
    #[test]
    fn bytes_stuck_while_the_peers_data_arrives_are_not_silence() {
        let q = Duration::from_millis(100);
        let stuck = s(12, 180, 2);
        let mut from_peer = s(0, 9000, 2);
        from_peer.since_data = Duration::from_millis(3);
        assert_eq!(judge(&[stuck, from_peer], q), TcpVerdict::Unknown);
        // The peer's last data older than the quiet time proves nothing: silent again.
        from_peer.since_data = Duration::from_millis(150);
        assert_eq!(judge(&[stuck, from_peer], q), TcpVerdict::Silent);
    }

    #[test]
    fn no_connection_or_nothing_in_flight_is_unknown() {
        let q = Duration::from_millis(100);
        assert_eq!(judge(&[], q), TcpVerdict::Unknown);
        assert_eq!(judge(&[s(0, 5000, 1)], q), TcpVerdict::Unknown);
    }

    /// The scan finds this process's own connection by its addresses and reads a fresh ACK.
    #[test]
    fn the_scan_finds_a_live_loopback_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        a.write_all(&[7u8; 4096]).unwrap();
        let mut buf = [0u8; 4096];
        b.read_exact(&mut buf).unwrap();
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let all = snapshot();
        let found = of_path(&all, lo, lo);
        // Both ends (and any other loopback connection of the test binary) are 127.0.0.1 to 127.0.0.1.
        assert!(found.len() >= 2, "{found:?}");
        assert!(found.iter().any(|s| s.since_ack < Duration::from_secs(1)), "{found:?}");
        assert_ne!(judge(&found, Duration::from_secs(1)), TcpVerdict::Silent);
        assert!(of_path(&all, lo, IpAddr::V4(Ipv4Addr::new(198, 18, 255, 254))).is_empty());
    }
}
