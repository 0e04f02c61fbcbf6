//! r2ccl-algo: collective schedules as data, and the math behind them.
//!
//! What it does:
//! - Represents one rank's part of a collective as a [`RankSchedule`]: ordered steps
//!   (send, receive-and-reduce, receive-and-copy, local copy/reduce) over byte regions of
//!   the rank's input/output/scratch buffers, with per-step dependencies for chunk-level
//!   pipelining and a per-NIC [`RailSplit`] for every inter-node transfer.
//! - Builds schedules ([`build_rank_schedule`], one rank at a time, memory proportional
//!   to that rank's steps) for AllReduce, ReduceScatter, AllGather, Broadcast, Reduce,
//!   AlltoAll and Send/Recv, with ring, latency-optimal (recursive doubling / binomial
//!   tree) and hierarchical algorithms, any ring order (from logical re-ranking), and the
//!   failure strategies of MECHANISMS.md: Balance, single backup NIC, R2CCL-AllReduce,
//!   recursive AllReduce and the four-stage bound-reaching AllReduce (one ring per level, or
//!   direct exchanges per level); and grouped
//!   point-to-point sends and receives to arbitrary peers ([`build_p2p_group`]).
//! - Runs schedules on in-memory buffers with a single-threaded reference executor
//!   ([`execute`]) that detects deadlocks instead of hanging.
//! - Computes the section-7 lower bound, closed-form strategy times ([`model`]), per-NIC
//!   traffic of built schedules ([`Traffic`]) and schedule completion times in the
//!   bandwidth model ([`simulate`], [`fluid_time`]).
//!
//! What it does not do: no IO, clocks, threads or transport; it does not choose a
//! strategy or search ring orders (that is r2ccl-policy), and it does not agree on health
//! views (callers pass the agreed [`r2ccl_core::HealthView`]).
//!
//! Invariants: every rank runs the same builder control flow, so tags and phases match
//! across ranks; program order is always a valid execution order; no transfer part
//! uses a NIC that is failed at either end; builders never panic on bad input.

mod build;
mod error;
mod exec;
mod layout;
pub mod model;
mod schedule;
mod sim;
mod spec;
mod traffic;

pub use build::{
    build_all, build_p2p_group, build_rank_schedule, even_part, p2p_group_lens, rails_group_mask, rails_of_group, P2pOp,
};
pub use error::{AlgoError, ExecError, SimError};
pub use exec::{execute, ExecOrder};
pub use layout::{Fabric, Layout, RailMask, RailPart, RailPolicy, RailSplit};
pub use schedule::{Buf, RankSchedule, Region, SplitRef, Step, StepKind, Tag};
pub use sim::{fluid_time, simulate, SimParams, SimReport};
pub use spec::{Algorithm, Collective, R2cclParams, ScheduleRequest, Strategy};
pub use traffic::Traffic;
