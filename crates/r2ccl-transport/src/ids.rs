//! Identifiers of the transport: communicators, transfers, chunks, lanes, paths, requests, memory handles.

use r2ccl_core::{NicId, Rank};
use std::fmt;

/// A communicator, as the transport knows it (chosen by the layer above, unique per job).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommId(pub u64);

/// One point-to-point transfer of a collective: the message that `src` sends to `dst` in step
/// `step` of collective number `seq` of communicator `comm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransferKey {
    /// The communicator.
    pub comm: CommId,
    /// Collective sequence number within the communicator.
    pub seq: u64,
    /// Step of the collective's schedule.
    pub step: u32,
    /// The sending rank.
    pub src: Rank,
    /// The receiving rank.
    pub dst: Rank,
}

impl TransferKey {
    /// The transfer `src -> dst` of step `step` of collective `seq` of communicator `comm`.
    pub const fn new(comm: u64, seq: u64, step: u32, src: u32, dst: u32) -> Self {
        Self { comm: CommId(comm), seq, step, src: Rank(src), dst: Rank(dst) }
    }
}

impl fmt::Display for TransferKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "comm{}/seq{}/step{} {}->{}", self.comm.0, self.seq, self.step, self.src, self.dst)
    }
}

/// The identity of one chunk: (communicator, collective sequence, step, chunk index), plus the two
/// ranks. A resend of the same chunk carries the same identity, which makes replay idempotent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkId {
    /// The transfer the chunk belongs to.
    pub transfer: TransferKey,
    /// Index of the chunk within the transfer (byte offset = index * chunk size).
    pub index: u32,
}

/// One lane of a transfer: the contiguous chunk range that striping gave to one NIC. Lanes are the
/// unit of migration: each has its own path, in-flight set and replay boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LaneId {
    /// The transfer.
    pub transfer: TransferKey,
    /// Lane number within the transfer (0-based, in rail order of the lanes' primary NICs).
    pub lane: u16,
}

impl fmt::Display for LaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} lane{}", self.transfer, self.lane)
    }
}

/// A path as one rank sees it: its own NIC, the peer rank and the peer's NIC. The same shape as
/// `r2ccl-detect`'s path id, so the facade converts field by field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathId {
    /// This rank's NIC.
    pub local: NicId,
    /// The rank at the other end.
    pub peer: Rank,
    /// The peer's NIC.
    pub remote: NicId,
}

impl PathId {
    /// The path from `local` to rank `peer`'s NIC `remote`.
    pub const fn new(local: NicId, peer: Rank, remote: NicId) -> Self {
        Self { local, peer, remote }
    }

    /// The same path as the peer sees it, given this side's rank `me`.
    #[must_use]
    pub const fn mirror(self, me: Rank) -> Self {
        Self { local: self.remote, peer: me, remote: self.local }
    }
}

impl fmt::Display for PathId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}=>{}@{}", self.local, self.remote, self.peer)
    }
}

/// A request posted on a transport (send, receive or probe); unique per transport instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// A memory region registered on all NICs of a node at once; valid on every one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MemHandle(pub u64);
