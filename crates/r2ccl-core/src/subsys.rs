//! Logging subsystem names: the `tracing` targets libraries emit under.
//!
//! Users filter on them with `R2CCL_DEBUG_SUBSYS` (as `NCCL_DEBUG_SUBSYS`); the
//! binary-side setup lives in `r2ccl-log`. Emit with e.g.
//! `tracing::info!(target: r2ccl_core::subsys::NET, ...)`.

/// Communicator setup and teardown.
pub const INIT: &str = "r2ccl::init";
/// Collective calls and their execution.
pub const COLL: &str = "r2ccl::coll";
/// Point-to-point send and receive.
pub const P2P: &str = "r2ccl::p2p";
/// Transport: paths, chunks, migration, replay.
pub const NET: &str = "r2ccl::net";
/// Failure detection, localization and recovery.
pub const DETECT: &str = "r2ccl::detect";
/// Topology discovery and NIC selection.
pub const TOPO: &str = "r2ccl::topo";
/// Planning: cost model, strategy choice, re-ranking.
pub const PLAN: &str = "r2ccl::plan";
/// Bootstrap and the out-of-band control channel.
pub const BOOTSTRAP: &str = "r2ccl::bootstrap";
/// Configuration loading.
pub const ENV: &str = "r2ccl::env";
/// Metrics export.
pub const METRICS: &str = "r2ccl::metrics";
/// The cluster simulator.
pub const SIM: &str = "r2ccl::sim";

/// Every subsystem as (user-facing name, tracing target).
pub const ALL: &[(&str, &str)] = &[
    ("INIT", INIT),
    ("COLL", COLL),
    ("P2P", P2P),
    ("NET", NET),
    ("DETECT", DETECT),
    ("TOPO", TOPO),
    ("PLAN", PLAN),
    ("BOOTSTRAP", BOOTSTRAP),
    ("ENV", ENV),
    ("METRICS", METRICS),
    ("SIM", SIM),
];

/// The tracing target of a user-facing subsystem name (case-insensitive), if known.
pub fn target_of(name: &str) -> Option<&'static str> {
    ALL.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, t)| *t)
}
