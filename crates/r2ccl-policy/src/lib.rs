//! r2ccl-policy: the planner of r2ccl.
//!
//! What it does: given a [`Topology`] (nodes, NICs and their line rates, ranks per node,
//! per-hop latency, intra-node bandwidth, spine share) and an agreed
//! [`r2ccl_core::HealthView`], it predicts with an alpha-beta cost model the time and the
//! exact bytes per NIC of every applicable strategy (plain ring, single backup NIC,
//! Balance, R2CCL-AllReduce, recursive AllReduce, the four-stage bound-reaching AllReduce (rings
//! or direct exchanges per level),
//! recursive doubling for small messages), the fault-free time and the lower bound,
//! re-ranks the ring order of nodes around failed rails, and picks the fastest strategy
//! ([`plan`], [`plan_payload`]). Plans are deterministic: equal inputs give bit-identical
//! plans on every rank. A plan turns into an `r2ccl-algo` request
//! ([`Plan::schedule_request`]) that, on [`schedule_fabric`], builds exactly the schedule
//! whose cost was predicted:
//! `plan(..) -> Plan::schedule_request() -> r2ccl_algo::build_rank_schedule(&schedule_fabric(..)?, ..)`.
//! A communicator asks one [`Planner`] per call: it adds the forced strategy, the fallback for
//! layouts the model does not cover, ring pipelining and a schedule cache, and returns the
//! rank's schedule. The `r2ccl-plan` binary (`crates/r2ccl-policy/src/bin/r2ccl-plan.rs`)
//! prints plans.
//!
//! Vocabulary: collectives are [`r2ccl_algo::Collective`] (re-exported as [`Collective`]);
//! NIC splits, level plans and closed forms are `r2ccl_algo`'s ([`r2ccl_algo::Fabric::split`],
//! [`r2ccl_algo::model`]). [`CandidateKind`] names the planner's candidates, each a base algorithm
//! plus an `r2ccl_algo::Strategy` ([`Plan::request_for`]).
//!
//! What it does not do: no IO, clocks or threads (sans-IO); it builds no schedules itself
//! (that is `r2ccl-algo`) and discovers no hardware (that is `r2ccl-topo`; the facade turns
//! its agreed cluster view into a [`Topology`]).
//!
//! # Example
//!
//! An AllReduce of 64 MiB per rank on 4 nodes x 2 NICs of 100 Gb/s, healthy and with NIC 1
//! of node 2 failed (`examples/plan_failure.rs` prints every candidate of both plans).
//!
//! ```rust
//! use r2ccl_core::{HealthView, NicId, ReduceOp};
//! use r2ccl_policy::{plan, Collective, CandidateKind, Topology};
//!
//! let topo = Topology::uniform(4, 2, 100_000)?; // line rates in Mbit/s
//! let allreduce = Collective::AllReduce { op: ReduceOp::Sum };
//! let healthy = plan(&topo, &HealthView::uniform(4, 2, 100_000), allreduce, 64 << 20)?;
//! assert_eq!(healthy.chosen, CandidateKind::Ring);
//!
//! let mut view = HealthView::uniform(4, 2, 100_000);
//! view.set_failed(NicId::new(2, 1))?;
//! let degraded = plan(&topo, &view, allreduce, 64 << 20)?;
//! assert!(degraded.candidate(CandidateKind::Ring).is_none()); // the plain ring needs every NIC
//! assert!(degraded.time_s > healthy.time_s);
//! assert!(degraded.time_s >= degraded.lower_bound_s);
//! // What r2ccl-algo builds on `schedule_fabric(&topo, &view)?`.
//! let _request = degraded.schedule_request()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod fabric;
mod mirror;
mod plan;
mod planner;
mod rerank;
mod topology;

pub use plan::{
    plan, plan_payload, rerank, rerank_exact, rerank_heuristic, ring_score, schedule_fabric, Candidate, CandidateKind,
    NicBytes, Plan, PlanError, StrategyParams, DIRECT_PART_MIN_BYTES, FOUR_STAGE_SHARED_RING,
};
pub use planner::{
    communicator_topology, pipeline_ring, plan_bridging_splits, Choice, Planned, Planner, PlannerError,
    FALLBACK_TREE_BELOW, PLAN_CACHE, RING_PARTS_MAX, RING_PART_MIN, RING_PART_TIME_US,
};
pub use r2ccl_algo::Collective;
pub use rerank::{RingScore, EXACT_MAX_NODES};
pub use topology::{
    NodeSpec, Topology, TopologyError, COMMUNICATOR_ALPHA_S, DEFAULT_ALPHA_S, DEFAULT_INTRA_GBPS,
    DEFAULT_SPINE_PERMILLE,
};
