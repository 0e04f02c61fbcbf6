//! What the detector hands out: commands for its driver and typed events for logs and metrics.

use crate::health::{EventKind, StateKind};
use crate::ids::{PathId, ProbeId};
use crate::triangulate::{Method, Observations, Verdict};
use crate::wire::OobMessage;
use r2ccl_core::{NicId, Rank};
use std::time::Duration;

/// An action the driver must carry out. The detector moves no data: on `DeclareFailed` the
/// driver stops using the path (and migrates what ran on it with its own protocol, e.g.
/// `r2ccl_transport::migrate`), on `DeclareRecovered` it may use the path again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Send `msg` (encode it with [`OobMessage::encode`]) to `to` over the OOB channel.
    SendOob {
        /// Destination rank.
        to: Rank,
        /// The message.
        msg: OobMessage,
    },
    /// Ask another rank (the peer, or an auxiliary node) to probe; send `msg` (a
    /// [`OobMessage::ProbeRequest`]) to `to` over the OOB channel.
    AskProbe {
        /// The rank that should probe.
        to: Rank,
        /// The request.
        msg: OobMessage,
    },
    /// Send a zero-byte probe from local NIC `from` to NIC `to` on the probe endpoints and
    /// report with `handle_probe_result` (a missing answer times out inside the detector).
    StartProbe {
        /// The probe's id.
        probe: ProbeId,
        /// The local NIC to probe from.
        from: NicId,
        /// The NIC to probe.
        to: NicId,
    },
    /// Send a heartbeat over an idle path; the peer's driver reports it with `handle_heartbeat`.
    SendHeartbeat {
        /// The path.
        path: PathId,
    },
    /// A path is failed, with the localization verdict (issued once per failure). A verdict
    /// that blames a NIC also declares every other usable path through that NIC failed.
    DeclareFailed {
        /// The path.
        path: PathId,
        /// Which component failed.
        verdict: Verdict,
        /// How the verdict was reached.
        method: Method,
    },
    /// A failed path answered N consecutive probes after its hold-down and is healthy again.
    DeclareRecovered {
        /// The path.
        path: PathId,
    },
}

/// A typed record of something the detector did, for logs and metrics. `at` is the `now`
/// of the call that caused it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DetectEvent {
    /// A path changed state.
    PathTransition {
        /// When.
        at: Duration,
        /// The path.
        path: PathId,
        /// Old state.
        from: StateKind,
        /// New state.
        to: StateKind,
        /// The event that caused it.
        event: EventKind,
    },
    /// A localization round ended.
    Localized {
        /// When.
        at: Duration,
        /// The path.
        path: PathId,
        /// The verdict.
        verdict: Verdict,
        /// How it was reached.
        method: Method,
        /// What the probes saw.
        observations: Observations,
    },
    /// A failed path is held down before re-probing.
    HeldDown {
        /// When.
        at: Duration,
        /// The path.
        path: PathId,
        /// Hold-down length.
        holddown: Duration,
        /// Consecutive flaps so far.
        flaps: u32,
    },
    /// A probe report for no outstanding request (a duplicate, or one that came after its
    /// round ended) was ignored.
    StaleIgnored {
        /// When.
        at: Duration,
        /// From whom.
        from: Rank,
        /// The message.
        msg: OobMessage,
    },
    /// A probe request was resent `oob_max_retries` times without an answer; the detector
    /// stopped resending it.
    OobGaveUp {
        /// When.
        at: Duration,
        /// The silent rank.
        to: Rank,
        /// The message.
        msg: OobMessage,
    },
    /// A probe request was refused: it names a NIC not on this detector's node as the prober, or
    /// its rank has [`crate::MAX_OPEN_REQUESTS`] open or
    /// [`crate::MAX_REMEMBERED_REQUESTS`] remembered already.
    Rejected {
        /// When.
        at: Duration,
        /// From whom.
        from: Rank,
        /// The message.
        msg: OobMessage,
        /// Why.
        why: &'static str,
    },
}
