//! r2ccl-policy: the planner of r2ccl.
//!
//! What it does: given a [`Topology`] (nodes, NICs and their line rates, ranks per node,
//! per-hop latency, intra-node bandwidth, spine share) and an agreed
//! [`r2ccl_core::HealthView`], it predicts with an alpha-beta cost model the time and the
//! exact bytes per NIC of every applicable strategy (plain ring, single backup NIC,
//! Balance, R2CCL-AllReduce, recursive AllReduce, the four-stage bound-reaching AllReduce,
//! recursive doubling for small messages), the fault-free time and the lower bound,
//! re-ranks the ring order of nodes around failed rails, and picks the fastest strategy
//! ([`plan`], [`plan_payload`]). Plans are deterministic: equal inputs give bit-identical
//! plans on every rank. A plan turns into an `r2ccl-algo` request
//! ([`Plan::schedule_request`]) that, on [`schedule_fabric`], builds exactly the schedule
//! whose cost was predicted:
//! `plan(..) -> Plan::schedule_request() -> r2ccl_algo::build_rank_schedule(&schedule_fabric(..)?, ..)`.
//! The `r2ccl-plan` binary (`crates/r2ccl-policy/src/bin/r2ccl-plan.rs`) prints plans.
//!
//! Vocabulary: collectives are [`r2ccl_algo::Collective`] (re-exported as [`Collective`]);
//! NIC splits, level plans and closed forms are `r2ccl_algo`'s ([`r2ccl_algo::Fabric::split`],
//! [`r2ccl_algo::model`]). [`Strategy`] names the planner's candidates, each a base algorithm
//! plus an `r2ccl_algo::Strategy` ([`Plan::request_for`]).
//!
//! What it does not do: no IO, clocks or threads (sans-IO); it builds no schedules itself
//! (that is `r2ccl-algo`) and discovers no hardware (that is `r2ccl-topo`, which converts its
//! description into a [`Topology`]).

mod fabric;
mod mirror;
mod plan;
mod rerank;
mod topology;

pub use plan::{
    plan, plan_payload, rerank, rerank_exact, rerank_heuristic, ring_score, schedule_fabric, Candidate, NicBytes, Plan,
    PlanError, Strategy, StrategyParams, FOUR_STAGE_SHARED_RING,
};
pub use r2ccl_algo::Collective;
pub use rerank::{RingScore, EXACT_MAX_NODES};
pub use topology::{NodeSpec, Topology, TopologyError, DEFAULT_ALPHA_S, DEFAULT_INTRA_GBPS, DEFAULT_SPINE_PERMILLE};
