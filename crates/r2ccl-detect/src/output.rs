//! What the detector hands out: commands for its driver and typed events for logs and metrics.

use crate::health::{EventKind, StateKind};
use crate::ids::{ConnId, FailoverEpoch, PathId, PathPair, ProbeId};
use crate::triangulate::{Method, Observations, Verdict};
use crate::wire::{MigrationReason, OobMessage};
use r2ccl_core::{NicId, Rank};
use std::time::Duration;

/// An action the driver must carry out.
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
    /// Stop posting on `conn`'s current path and retire its outstanding requests.
    Quiesce {
        /// The connection.
        conn: ConnId,
        /// The path to quiesce.
        path: PathPair,
    },
    /// A path is failed, with the localization verdict.
    DeclareFailed {
        /// The path.
        path: PathId,
        /// Which component failed.
        verdict: Verdict,
        /// How the verdict was reached.
        method: Method,
    },
    /// Move `conn` to chain entry `index` (`to`) and replay from chunk `boundary`; both ends
    /// get this command with the same epoch and boundary.
    MigratePath {
        /// The connection.
        conn: ConnId,
        /// The failover epoch agreed.
        epoch: FailoverEpoch,
        /// The path left.
        from_path: PathPair,
        /// The backup path.
        to: PathPair,
        /// Its index in the connection's chain.
        index: usize,
        /// First chunk to replay (chunks before it are held by the receiver).
        boundary: u64,
    },
    /// Move `conn` back to a recovered, more preferred path (same agreement as a failover).
    FailBack {
        /// The connection.
        conn: ConnId,
        /// The failover epoch agreed.
        epoch: FailoverEpoch,
        /// The path left.
        from_path: PathPair,
        /// The recovered path.
        to: PathPair,
        /// Its index in the connection's chain.
        index: usize,
        /// First chunk to replay.
        boundary: u64,
    },
    /// A failed path answered N consecutive probes and is healthy again.
    DeclareRecovered {
        /// The path.
        path: PathId,
    },
    /// The health view changed: re-plan at the next collective.
    RequestReplan {
        /// Why.
        reason: ReplanReason,
    },
}

/// Why a re-plan is requested.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplanReason {
    /// This rank completed a migration of `conn`.
    Migrated {
        /// The connection.
        conn: ConnId,
    },
    /// Another rank broadcast a hot repair.
    HotRepair {
        /// The rank that broadcast it.
        origin: Rank,
        /// Its connection.
        conn: ConnId,
    },
    /// A path recovered.
    Recovered {
        /// The path.
        path: PathId,
    },
    /// A connection has no usable backup path left.
    NoBackup {
        /// The connection.
        conn: ConnId,
    },
}

/// Which end of a connection this rank is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The sending (authoritative) end.
    Sender,
    /// The receiving end.
    Receiver,
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
    /// The sender started a failover or fail-back.
    FailoverStarted {
        /// When.
        at: Duration,
        /// The connection.
        conn: ConnId,
        /// New epoch.
        epoch: FailoverEpoch,
        /// Chain index of the target path.
        index: usize,
        /// Sender's completed chunks.
        sender_done: u64,
        /// Failover or fail-back.
        reason: MigrationReason,
    },
    /// Both ends agree on the boundary (this end emitted its migrate command).
    FailoverAgreed {
        /// When.
        at: Duration,
        /// The connection.
        conn: ConnId,
        /// The epoch.
        epoch: FailoverEpoch,
        /// The replay boundary.
        boundary: u64,
        /// This end's role.
        role: Role,
    },
    /// The receiver started hinting the sender.
    HintStarted {
        /// When.
        at: Duration,
        /// The connection.
        conn: ConnId,
        /// The hinted epoch.
        epoch: FailoverEpoch,
    },
    /// A message with an old epoch or unknown id was ignored.
    StaleIgnored {
        /// When.
        at: Duration,
        /// From whom.
        from: Rank,
        /// The message.
        msg: OobMessage,
    },
    /// A duplicate FAILOVER_REQ was acknowledged again.
    DuplicateReq {
        /// When.
        at: Duration,
        /// The connection.
        conn: ConnId,
        /// Its epoch.
        epoch: FailoverEpoch,
    },
    /// A connection has no usable backup path.
    NoBackup {
        /// When.
        at: Duration,
        /// The connection.
        conn: ConnId,
    },
    /// A hot-repair notice from another rank.
    HotRepairReceived {
        /// When.
        at: Duration,
        /// The rank that sent it.
        origin: Rank,
        /// Its connection.
        conn: ConnId,
        /// Its epoch.
        epoch: FailoverEpoch,
    },
    /// A message was resent `oob_max_retries` times without an answer; the detector stopped.
    OobGaveUp {
        /// When.
        at: Duration,
        /// The silent rank.
        to: Rank,
        /// The message.
        msg: OobMessage,
    },
    /// A message that does not fit this detector's connections or NICs was refused.
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
