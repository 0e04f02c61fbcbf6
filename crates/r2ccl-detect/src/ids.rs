//! Identifiers of the detection layer: connections, paths, probes.

use r2ccl_core::{NicId, Rank};
use std::fmt;

/// A one-way data connection between two ranks, watched on one path: `src` sends, `dst`
/// receives. `chan` tells apart several connections between the same two ranks (the engine
/// uses one per rail).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId {
    /// The sending rank.
    pub src: Rank,
    /// The receiving rank.
    pub dst: Rank,
    /// Channel number among the connections of `src` to `dst`.
    pub chan: u32,
}

impl ConnId {
    /// The connection `src -> dst` on channel `chan`.
    pub const fn new(src: u32, dst: u32, chan: u32) -> Self {
        Self { src: Rank(src), dst: Rank(dst), chan }
    }
}

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}->{}#{}", self.src, self.dst, self.chan)
    }
}

/// The (sender NIC, receiver NIC) pair a connection uses, in the connection's direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathPair {
    /// The sender's NIC.
    pub src_nic: NicId,
    /// The receiver's NIC.
    pub dst_nic: NicId,
}

impl fmt::Display for PathPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=>{}", self.src_nic, self.dst_nic)
    }
}

/// A path as one rank sees it: its own NIC, the peer rank, and the peer's NIC.
/// Health is tracked per `PathId`; every connection between the two ranks over the same
/// NIC pair shares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathId {
    /// This rank's NIC.
    pub local: NicId,
    /// The rank at the other end.
    pub peer: Rank,
    /// The peer's NIC.
    pub remote: NicId,
}

impl fmt::Display for PathId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}<->{}@{}", self.local, self.remote, self.peer)
    }
}

/// A probe this detector asked its driver to run (unique per detector).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProbeId(pub u64);

impl fmt::Display for ProbeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "probe{}", self.0)
    }
}
