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
//!
//! # Example
//!
//! Rank 0 (node 0) sends to rank 1 (node 1) on the NIC pair of rail 0, with rail 1 as the
//! backup. Its rail-0 NIC reports link down: the detector blames that NIC at once and asks
//! rank 1 to move the connection to rail 1. `examples/detect_alone.rs` drives three
//! detectors through whole failovers, fail-backs and triangulations.
//!
//! ```rust
//! use r2ccl_core::{NicId, NodeId, Rank};
//! use r2ccl_detect::{Command, ConnId, DetectConfig, Detector, Member, OobMessage, PathPair, Verdict};
//! use std::time::Duration;
//!
//! let members = [Member { rank: Rank(0), node: NodeId(0) }, Member { rank: Rank(1), node: NodeId(1) }];
//! let mut det = Detector::new(DetectConfig::default(), Rank(0), &members)?;
//! let pair = |rail| PathPair { src_nic: NicId::new(0, rail), dst_nic: NicId::new(1, rail) };
//! let conn = ConnId::new(0, 1, 0);
//! det.add_connection(Duration::ZERO, conn, vec![pair(0), pair(1)])?;
//!
//! det.handle_link_down(Duration::from_millis(5), NicId::new(0, 0))?;
//! let commands: Vec<Command> = std::iter::from_fn(|| det.poll_command()).collect();
//! assert!(commands.iter().any(|c| matches!(c,
//!     Command::DeclareFailed { verdict: Verdict::LocalNic(nic), .. } if *nic == NicId::new(0, 0))));
//! assert!(commands.iter().any(|c| matches!(c,
//!     Command::SendOob { to: Rank(1), msg: OobMessage::FailoverReq { index: 1, .. } })));
//! assert!(det.is_failing_over(&conn)); // until rank 1's FAILOVER_ACK arrives
//! # Ok::<(), r2ccl_detect::DetectError>(())
//! ```

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
