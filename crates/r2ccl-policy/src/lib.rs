//! r2ccl-policy: the planner of r2ccl.
//!
//! What it does: given a [`Topology`] (nodes, NICs and their line rates, ranks per node,
//! per-hop latency, intra-node bandwidth) and an agreed [`r2ccl_core::HealthView`], it
//! predicts with an alpha-beta cost model the time and per-NIC bytes of every applicable
//! strategy (plain ring, single backup NIC, Balance, R2CCL-AllReduce, recursive AllReduce,
//! the four-stage bound-reaching AllReduce, recursive doubling for small messages), the
//! fault-free time and the lower bound, re-ranks the ring order of nodes around failed
//! rails, and picks the fastest strategy ([`plan`]). Plans are deterministic: equal inputs
//! give bit-identical plans on every rank. The `r2ccl-plan` binary
//! (`crates/r2ccl-policy/src/bin/r2ccl-plan.rs`) prints them.
//!
//! What it does not do: no IO, clocks or threads (sans-IO); it builds no executable
//! schedules (that is `r2ccl-algo`) and discovers no hardware (that is `r2ccl-topo`,
//! which converts its description into a [`Topology`]).

mod fabric;
pub mod formulas;
mod plan;
mod rerank;
mod topology;

pub use plan::{
    plan, rerank, rerank_exact, rerank_heuristic, ring_score, Candidate, Collective, NicBytes, Plan, PlanError,
    Strategy, StrategyParams,
};
pub use rerank::{RingScore, EXACT_MAX_NODES};
pub use topology::{NodeSpec, Topology, TopologyError, DEFAULT_ALPHA_S, DEFAULT_INTRA_GBPS, DEFAULT_SPINE_PERMILLE};
