//! A rendezvous port for launchers that must name rank 0's port before rank 0 binds it.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where the kernel picks ephemeral ports when it is not told (`ip_local_port_range`), or Linux's
/// default when that cannot be read.
fn ephemeral_range() -> (u16, u16) {
    let read = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok();
    let parsed = read.and_then(|s| {
        let mut it = s.split_whitespace().map(str::parse::<u16>);
        match (it.next(), it.next()) {
            (Some(Ok(lo)), Some(Ok(hi))) if lo <= hi => Some((lo, hi)),
            _ => None,
        }
    });
    parsed.unwrap_or((32768, 60999))
}

/// A TCP port on `ip` that is free now and lies outside the kernel's ephemeral range, for a
/// launcher that must tell every rank the root's address (`R2CCL_ROOT`) before rank 0 binds it,
/// as under `mpirun -x R2CCL_ROOT=...`.
///
/// A port taken from the ephemeral range (binding port 0, then releasing it) can be handed to any
/// outgoing connection or listener of the host in between, and rank 0 then fails with "Address
/// already in use"; a port outside that range is only taken by someone who names it. Launchers
/// that start rank 0 themselves should hand it an open listener instead (as `r2ccl-perf launch`
/// does), which leaves no window at all.
///
/// ```
/// let port = r2ccl::bootstrap::free_port_outside_ephemeral_range(std::net::Ipv4Addr::LOCALHOST.into())?;
/// std::net::TcpListener::bind(("127.0.0.1", port))?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn free_port_outside_ephemeral_range(ip: IpAddr) -> std::io::Result<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (lo, hi) = ephemeral_range();
    // The ports below the range from 10000 up, or above it when the range starts low.
    let (first, last) = if lo > 11_000 { (10_000u32, u32::from(lo) - 1) } else { (u32::from(hi) + 1, 65_535u32) };
    if first > last {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrNotAvailable,
            format!("the ephemeral port range {lo}-{hi} leaves no port outside it"),
        ));
    }
    let span = last - first + 1;
    // Processes and threads of one host start at different places, so that two launchers
    // rarely try the same port.
    let start = std::process::id().wrapping_mul(7919).wrapping_add(NEXT.fetch_add(613, Ordering::Relaxed)) % span;
    for i in 0..span.min(4096) {
        let Ok(port) = u16::try_from(first + (start + i) % span) else { continue };
        if TcpListener::bind(SocketAddr::new(ip, port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free port on {ip} outside the ephemeral range {lo}-{hi} after 4096 tries"),
    ))
}
