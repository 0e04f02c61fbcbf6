//! Argument digests: each chunk header carries a digest of the arguments its sender called the
//! collective with, and the receiver compares it with its own, so a rank that called another
//! collective (or the same with another count, type, operation or root) is named on the first
//! chunk that crosses, at no cost in messages. Part of [`Session`]; its state lives there.

#[allow(clippy::wildcard_imports, reason = "the session split by concern: its types are the parent's")]
use super::*;

/// Collectives whose digests are kept, back from the newest one set: a chunk of an older one is
/// not checked (it can only be a duplicate by then).
const ARGS_KEPT: u64 = 16;

/// This rank's digest of a collective's arguments ([`Session::set_args`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgDigest {
    /// The same with every peer (a collective).
    Same(u32),
    /// One per peer (a group of point-to-point operations, where each pair describes the
    /// operations between the two of them); a peer without one is not checked.
    PerPeer(BTreeMap<Rank, u32>),
}

impl ArgDigest {
    /// The digest for chunks to or from `peer`.
    pub fn for_peer(&self, peer: Rank) -> Option<u32> {
        match self {
            Self::Same(d) => Some(*d),
            Self::PerPeer(m) => m.get(&peer).copied(),
        }
    }
}

/// The digest chunks of `key` carry from this rank, given its digests.
pub(super) fn for_send(args: &BTreeMap<(CommId, u64), ArgDigest>, key: TransferKey) -> u32 {
    args.get(&(key.comm, key.seq)).and_then(|a| a.for_peer(key.dst)).unwrap_or(0)
}

impl Session {
    /// Sets this rank's argument digest for collective `seq` of `comm`, before its transfers are
    /// started or expected: chunks sent for it carry the digest, and a chunk received for it
    /// whose digest differs is refused ([`ChunkProblem::ArgsDiffer`]), never applied. Chunks of
    /// a collective with no digest set carry 0 and are not checked.
    pub fn set_args(&mut self, comm: CommId, seq: u64, args: ArgDigest) {
        self.args.insert((comm, seq), args);
        self.args.retain(|&(c, s), _| c != comm || s.saturating_add(ARGS_KEPT) > seq);
    }

    /// Whether `h`'s digest agrees with this rank's for its collective and sender (yes when this
    /// rank set none); a disagreement is counted and reported.
    pub(super) fn args_agree(&mut self, path: PathId, h: &ChunkHeader) -> bool {
        let key = h.transfer();
        let Some(mine) = self.args.get(&(key.comm, key.seq)).and_then(|a| a.for_peer(key.src)) else {
            return true;
        };
        if h.args == mine {
            return true;
        }
        self.stats.args_differ += 1;
        self.bad(path, ChunkProblem::ArgsDiffer { seq: key.seq, from: key.src, theirs: h.args, mine });
        false
    }
}
