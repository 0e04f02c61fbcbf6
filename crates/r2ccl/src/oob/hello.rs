//! OOB handshakes: both sides prove the job secret over fresh nonces, and derive one frame key
//! per direction for the connection ([`super::frame`]).
//!
//! Acceptor: sends nonce A. Connector: sends its rank, nonce C and tag("oob-hello", A, C,
//! connector, acceptor). Acceptor: checks it, answers tag("oob-welcome", A, C, connector,
//! acceptor). Connector: checks that. Every read and write of one handshake ends by one deadline.

use super::frame::FrameKey;
use crate::bootstrap::uid::random16;
use crate::bootstrap::wire::Deadlined;
use crate::bootstrap::Secret;
use crate::bootstrap_mac::{oob_key, tag, tags_equal};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A connection's keys, as seen from one side.
pub(crate) struct Keys {
    /// Verifies what the peer sends.
    pub(crate) inbound: FrameKey,
    /// Tags what this side sends.
    pub(crate) outbound: FrameKey,
}

fn keys(secret: &Secret, a: &[u8; 16], c: &[u8; 16], connector: u32, acceptor: u32, i_connect: bool) -> Keys {
    let c2a = FrameKey::new(&oob_key(secret, b"c2a", (a, c), connector, acceptor));
    let a2c = FrameKey::new(&oob_key(secret, b"a2c", (a, c), connector, acceptor));
    if i_connect {
        Keys { inbound: a2c, outbound: c2a }
    } else {
        Keys { inbound: c2a, outbound: a2c }
    }
}

/// The acceptor's side, rank `me` of `world`: the connector's rank and the keys, or why it was
/// refused (no proof of the secret, an impossible rank, too slow).
pub(crate) fn accept(
    stream: &TcpStream,
    secret: &Secret,
    me: u32,
    world: u32,
    limit: Duration,
) -> Result<(u32, Keys), String> {
    let mut io = Deadlined { stream, deadline: Instant::now() + limit };
    let a = random16().map_err(|e| e.to_string())?;
    io.write_all(&a).map_err(|e| format!("sending challenge: {e}"))?;
    let mut hello = [0u8; 36];
    io.read_exact(&mut hello).map_err(|e| format!("reading hello: {e}"))?;
    let rank = u32::from_le_bytes([hello[0], hello[1], hello[2], hello[3]]);
    let mut c = [0u8; 16];
    c.copy_from_slice(&hello[4..20]);
    let mut proof = [0u8; 16];
    proof.copy_from_slice(&hello[20..]);
    let (cr, ar) = (rank.to_le_bytes(), me.to_le_bytes());
    if !tags_equal(&proof, &tag(secret, &[b"oob-hello v2", &a, &c, &cr, &ar])) {
        return Err("does not prove the job secret".into());
    }
    if rank >= world || rank == me {
        return Err(format!("claims rank {rank} of {world}"));
    }
    io.write_all(&tag(secret, &[b"oob-welcome v2", &a, &c, &cr, &ar])).map_err(|e| format!("sending welcome: {e}"))?;
    Ok((rank, keys(secret, &a, &c, rank, me, false)))
}

/// The connector's side: connect to rank `peer` at `addr` as rank `me` by `deadline` (each
/// attempt bounded), prove the secret and check that the peer proves it too.
pub(crate) fn connect(
    addr: &str,
    secret: &Secret,
    me: u32,
    peer: u32,
    deadline: Instant,
) -> io::Result<(TcpStream, Keys)> {
    let targets: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    let stream = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("no OOB connection to rank {peer} at {addr}")));
        }
        let attempt = targets.iter().find_map(|a| TcpStream::connect_timeout(a, left.min(Duration::from_secs(1))).ok());
        match attempt {
            Some(s) => break s,
            None => std::thread::sleep(left.min(Duration::from_millis(20))),
        }
    };
    let mut io = Deadlined { stream: &stream, deadline };
    let mut a = [0u8; 16];
    io.read_exact(&mut a)?;
    let c = random16()?;
    let (cr, ar) = (me.to_le_bytes(), peer.to_le_bytes());
    let mut hello = Vec::with_capacity(36);
    hello.extend_from_slice(&cr);
    hello.extend_from_slice(&c);
    hello.extend_from_slice(&tag(secret, &[b"oob-hello v2", &a, &c, &cr, &ar]));
    io.write_all(&hello)?;
    let mut welcome = [0u8; 16];
    io.read_exact(&mut welcome)?;
    if !tags_equal(&welcome, &tag(secret, &[b"oob-welcome v2", &a, &c, &cr, &ar])) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the OOB listener at {addr} does not prove the job secret for rank {peer}"),
        ));
    }
    Ok((stream, keys(secret, &a, &c, me, peer, true)))
}
