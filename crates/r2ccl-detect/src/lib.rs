//! r2ccl-detect: sans-IO failure detection, localization and recovery for multi-NIC paths.
//!
//! What it does: one [`Detector`] per rank tracks the health of every path (local NIC,
//! peer rank, remote NIC) its connections use, with an explicit, table-driven state machine
//! ([`health::TRANSITIONS`]; illegal transitions are errors). It turns signals (in-band
//! errors, link down/up, missed progress and heartbeat deadlines, probe outcomes, the probe
//! requests and reports of other ranks' detectors) into commands: send heartbeats on idle
//! paths, probe, ask the peer and an auxiliary node to probe (three-point triangulation,
//! [`triangulate`]; the requests are resent until their report comes, duplicates are
//! answered from a cache), declare a path failed with the verdict that names the failed
//! local NIC, remote NIC or link (a blamed NIC fails every path through it), then re-probe it
//! after an exponential flap hold-down and declare it recovered after N consecutive good
//! probes (hysteresis). Every transition is also a typed [`DetectEvent`] for logs and
//! metrics. The OOB messages have a versioned, length-prefixed [`wire`] format whose decoder
//! never panics.
//!
//! What it does not do: no migration protocol and no data movement or replay. On
//! [`Command::DeclareFailed`] the driver stops using the path and moves what ran on it
//! itself (r2ccl's engine migrates lanes with `r2ccl_transport::migrate`, the FAILOVER_REQ /
//! ACK exchange keyed by lane); on [`Command::DeclareRecovered`] it may use the path again.
//! No IO, clocks, sleeps, threads or sockets either (time comes in as `now`, a
//! [`std::time::Duration`] since an arbitrary origin), no metrics recorder, no logging setup,
//! and no agreement on the cluster-wide health view (the facade does that).
//!
//! Driving loop: feed inputs with `handle_*(now, ...)`, call
//! [`Detector::handle_timeout`] when [`Detector::poll_timeout`] is reached, and after each
//! call drain [`Detector::poll_command`] and [`Detector::poll_event`].
//!
//! # Example
//!
//! Rank 0 (node 0) watches its paths to rank 1 (node 1) on rails 0 and 1, one connection
//! per rail. Its rail-0 NIC reports link down: in the same call the detector declares the
//! rail-0 path failed and blames that NIC from local evidence; the rail-1 path stays
//! healthy, and nothing is migrated (that is the driver's business).
//! `examples/detect_alone.rs` drives three detectors through link-down, silent-NIC
//! triangulation and recovery.
//!
//! ```rust
//! use r2ccl_core::{NicId, NodeId, Rank};
//! use r2ccl_detect::{Command, ConnId, DetectConfig, Detector, Member, Method, PathId, PathPair, PathState, Verdict};
//! use std::time::Duration;
//!
//! let members = [Member { rank: Rank(0), node: NodeId(0) }, Member { rank: Rank(1), node: NodeId(1) }];
//! let mut det = Detector::new(DetectConfig::default(), Rank(0), &members)?;
//! for rail in 0..2u16 {
//!     let path = PathPair { src_nic: NicId::new(0, rail), dst_nic: NicId::new(1, rail) };
//!     det.add_connection(Duration::ZERO, ConnId::new(0, 1, u32::from(rail)), path)?;
//! }
//!
//! let nic = NicId::new(0, 0);
//! det.handle_link_down(Duration::from_millis(5), nic)?;
//! let rail0 = PathId { local: nic, peer: Rank(1), remote: NicId::new(1, 0) };
//! let commands: Vec<Command> = std::iter::from_fn(|| det.poll_command()).collect();
//! assert_eq!(
//!     commands,
//!     [Command::DeclareFailed { path: rail0, verdict: Verdict::LocalNic(nic), method: Method::LocalEvidence }]
//! );
//! assert_eq!(det.path_state(&rail0), Some(PathState::Failed));
//! let rail1 = PathId { local: NicId::new(0, 1), peer: Rank(1), remote: NicId::new(1, 1) };
//! assert_eq!(det.path_state(&rail1), Some(PathState::Healthy));
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
pub use detector::{DetectError, Detector, Member, ProbeResult, MAX_OPEN_REQUESTS, MAX_REMEMBERED_REQUESTS};
pub use health::{IllegalTransition, PathState};
pub use ids::{ConnId, PathId, PathPair, ProbeId};
pub use output::{Command, DetectEvent};
pub use triangulate::{Method, Observation, Observations, Verdict};
pub use wire::{OobMessage, WireError};
