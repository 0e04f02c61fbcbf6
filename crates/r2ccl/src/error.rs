//! [`CommError`]: why a communicator call failed, with the ranks, nodes and collective it names.

use crate::engine::EngineError;
use r2ccl_core::{NodeId, Rank};

/// Why a communicator call failed. Every variant says what was seen; the variants that name a
/// rank, a node or a collective carry it as a field, so callers can match on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// Bootstrap or OOB setup failed.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// The transport could not be set up.
    #[error("transport setup: {0}")]
    Transport(String),
    /// Invalid options or arguments. The typed calls check sizes before anything is sent, so
    /// the communicator stays usable after theirs.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A peer process is gone (its OOB connection closed or went silent, or it left).
    #[error("rank {} is lost: {why}", rank.0)]
    PeerLost {
        /// The lost rank.
        rank: Rank,
        /// What was seen.
        why: String,
    },
    /// Ranks called collective `seq` with different arguments.
    #[error("collective arguments differ across ranks: {detail}")]
    Mismatch {
        /// The collective's sequence number (0 when a peer's report did not say).
        seq: u64,
        /// Both calls, as each rank described its own.
        detail: String,
    },
    /// The collective did not finish by its deadline.
    #[error("collective #{seq} timed out after {waited_ms} ms; waiting on: {waiting}")]
    Timeout {
        /// Collective sequence number.
        seq: u64,
        /// How long it ran.
        waited_ms: u64,
        /// What it was waiting for.
        waiting: String,
    },
    /// Every NIC of a node is down: its ranks cannot communicate.
    #[error("collective #{seq} failed: node {} has no usable NIC left (every NIC reported down)", node.0)]
    NodeIsolated {
        /// Collective sequence number.
        seq: u64,
        /// The node.
        node: NodeId,
    },
    /// Two nodes that must talk have no healthy rail in common (a rail-only fabric whose
    /// surviving rails are disjoint): nothing relays through a third node.
    #[error("collective #{seq} failed: nodes {} and {} have no healthy rail in common (rail-only fabric); a transfer between them cannot be repaired", a.0, b.0)]
    NoCommonRail {
        /// Collective sequence number.
        seq: u64,
        /// One node.
        a: NodeId,
        /// The other node.
        b: NodeId,
    },
    /// Every path to a peer failed without its NICs being reported down (for example a silent
    /// black hole on the last common rail) for longer than the no-path timeout.
    #[error("collective #{seq} failed: no usable path for {what} for {waited_ms} ms (every path to rank {} failed); giving up", peer.0)]
    NoPathLeft {
        /// Collective sequence number.
        seq: u64,
        /// The peer rank.
        peer: Rank,
        /// The lane or send that waited.
        what: String,
        /// How long it waited.
        waited_ms: u64,
    },
    /// The collective failed for another reason (a transport or kernel error).
    #[error("collective #{seq} failed: {why}")]
    Failed {
        /// Collective sequence number.
        seq: u64,
        /// Why.
        why: String,
    },
    /// The communicator was aborted (locally, by a peer, or after a failure on any rank).
    #[error("communicator aborted: {0}")]
    Aborted(String),
    /// A device (GPU) operation failed: no driver, no device, out of memory, an illegal address.
    #[error("device: {0}")]
    Device(#[from] crate::device::DeviceError),
}

impl CommError {
    /// A short name of the variant, for the `kind` label of `r2ccl_errors_total`.
    pub const fn kind(&self) -> &'static str {
        // Keep `KINDS` in step.
        match self {
            CommError::Bootstrap(_) => "bootstrap",
            CommError::Transport(_) => "transport",
            CommError::Invalid(_) => "invalid",
            CommError::PeerLost { .. } => "peer_lost",
            CommError::Mismatch { .. } => "mismatch",
            CommError::Timeout { .. } => "timeout",
            CommError::NodeIsolated { .. } => "node_isolated",
            CommError::NoCommonRail { .. } => "no_common_rail",
            CommError::NoPathLeft { .. } => "no_path_left",
            CommError::Failed { .. } => "failed",
            CommError::Aborted(_) => "aborted",
            CommError::Device(_) => "device",
        }
    }

    /// Every value [`CommError::kind`] returns (the `kind` label of `r2ccl_errors_total`).
    pub const KINDS: &'static [&'static str] = &[
        "bootstrap",
        "transport",
        "invalid",
        "peer_lost",
        "mismatch",
        "timeout",
        "node_isolated",
        "no_common_rail",
        "no_path_left",
        "failed",
        "aborted",
        "device",
    ];

    /// The error of collective `seq` that the engine's `e` ended.
    pub(crate) fn from_engine(seq: u64, e: &EngineError) -> Self {
        match e {
            EngineError::NodeIsolated(node) => CommError::NodeIsolated { seq, node: NodeId(*node) },
            EngineError::NoCommonRail { a, b } => CommError::NoCommonRail { seq, a: NodeId(*a), b: NodeId(*b) },
            EngineError::NoPathLeft { what, peer, waited_ms } => {
                CommError::NoPathLeft { seq, peer: Rank(*peer), what: what.clone(), waited_ms: *waited_ms }
            }
            other => CommError::Failed { seq, why: other.to_string() },
        }
    }

    /// Whether this rank ended a collective on its own (a failure or timeout only it may have
    /// seen), so its peers must be told rather than left waiting for their deadline.
    pub(crate) const fn is_local_failure(&self) -> bool {
        matches!(
            self,
            CommError::Failed { .. }
                | CommError::Timeout { .. }
                | CommError::NodeIsolated { .. }
                | CommError::NoCommonRail { .. }
                | CommError::NoPathLeft { .. }
        )
    }
}

impl From<crate::bootstrap::BootstrapError> for CommError {
    fn from(e: crate::bootstrap::BootstrapError) -> Self {
        CommError::Bootstrap(e.to_string())
    }
}

impl From<crate::bootstrap::UniqueIdError> for CommError {
    fn from(e: crate::bootstrap::UniqueIdError) -> Self {
        CommError::Bootstrap(e.to_string())
    }
}
