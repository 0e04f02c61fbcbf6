//! r2ccl-detect: sans-IO failure detection, localization and recovery for multi-NIC paths.
//!
//! What it does: one [`Detector`] per rank tracks the health of every path (local NIC,
//! peer rank, remote NIC) its connections may use, with an explicit, table-driven state
//! machine ([`health::TRANSITIONS`]; illegal transitions are errors). It turns signals
//! (in-band errors, link down/up, missed progress and heartbeat deadlines, OOB messages,
//! probe outcomes) into commands: notify the peer with the sender-authoritative
//! FAILOVER_REQ / ACK / HINT protocol (epochs, replay boundary = min(sender done, receiver
//! holds)), probe, ask the peer and an auxiliary node to probe (three-point triangulation,
//! [`triangulate`]), declare a NIC or link failed with its verdict, migrate a connection to
//! a backup path from the agreed boundary, broadcast a hot repair, re-probe failed paths
//! with hysteresis and exponential flap hold-down, fail back, and request re-plans. Every
//! transition is also a typed [`DetectEvent`] for logs and metrics. The OOB messages have
//! a versioned, length-prefixed [`wire`] format whose decoder never panics.
//!
//! What it does not do: no IO, clocks, sleeps, threads or sockets (time comes in as `now`,
//! a [`std::time::Duration`] since an arbitrary origin), no metrics recorder, no logging
//! setup, no data movement or replay itself (the transport does that on
//! [`Command::MigratePath`]), and no agreement on the cluster-wide health view (the facade
//! merges views at the next collective).
//!
//! Driving loop: feed inputs with `handle_*(now, ...)`, call
//! [`Detector::handle_timeout`] when [`Detector::poll_timeout`] is reached, and after each
//! call drain [`Detector::poll_command`] and [`Detector::poll_event`].

mod config;
mod detector;
pub mod health;
mod ids;
mod output;
pub mod triangulate;
pub mod wire;

pub use config::{ConfigError, DetectConfig};
pub use detector::{DetectError, Detector, Member, ProbeResult};
pub use health::{IllegalTransition, PathState};
pub use ids::{ConnId, FailoverEpoch, PathId, PathPair, ProbeId};
pub use output::{Command, DetectEvent, ReplanReason, Role};
pub use triangulate::{Method, Observation, Observations, Verdict};
pub use wire::{MigrationReason, OobMessage, WireError};
