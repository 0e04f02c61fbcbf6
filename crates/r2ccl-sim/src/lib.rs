//! r2ccl-sim: a flow-level, event-driven cluster simulator for r2ccl.
//!
//! What it does: models nodes, GPUs on NVLink, rail-optimized NICs, rail switches and a spine as links with
//! bandwidth and latency; runs any DAG of transfers and compute delays with max-min fair link sharing (or, to
//! cross-check, r2ccl-algo's first-come first-served port model); applies
//! failure timelines (NIC down and back, silent black holes with a detection delay, degraded speed) to
//! in-flight flows; builds AllReduce schedules for every strategy under test from formulas, and also runs the
//! exact r2ccl-algo schedules that r2ccl-policy chooses ([`convert`]: every Send/Recv part becomes a flow pinned
//! to its NIC pair, intra-node messages go over NVLink); models data-parallel and
//! tensor+pipeline-parallel training and LLM decode; and reproduces the paper's tables (`reproduce`).
//!
//! What it does not do: no IO, no clocks and no threads in the library (simulated time only, deterministic);
//! packet-level effects (congestion control, PFC, adaptive routing) and compute/communication interference on
//! the GPU are not modeled. The `r2ccl-sim` binary reads scenario files and prints.

pub mod closed;
pub mod collective;
pub mod convert;
pub mod engine;
mod error;
pub mod fabric;
pub mod reproduce;
pub mod scenario;
pub mod workload;

pub use engine::{
    simulate, Dag, EngineConfig, Failure, FailureKind, Op, OpId, RailMask, RepairMode, RunResult, Sharing, TaskId,
};
pub use error::SimError;
pub use fabric::{Endpoint, Fabric, FabricSpec, LinkId};

/// Result alias of the simulator.
pub type Result<T> = std::result::Result<T, SimError>;
