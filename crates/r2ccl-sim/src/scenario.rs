//! Scenario files: a fabric, a workload, failures, detection and recovery settings, strategies to compare.
//!
//! Parsing rejects unknown keys (serde `deny_unknown_fields`); validation rejects impossible topologies and
//! failures of components that do not exist, naming them.

use crate::collective::{AllReduceJob, Scheme};
use crate::engine::{EngineConfig, Failure, RepairMode, Sharing};
use crate::error::SimError;
use crate::fabric::{Fabric, FabricSpec};
use crate::workload::{allreduce_run, failure_induced, Recovery, Workload};
use serde::{Deserialize, Serialize};

/// Failure detection settings (`[detection]`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Detection {
    /// Delay until a link-down with an error completion is acted on, milliseconds.
    #[serde(default = "err_ms")]
    pub error_ms: f64,
    /// Stall timeout that detects a silent black hole, milliseconds.
    #[serde(default = "stall_ms")]
    pub stall_timeout_ms: f64,
    /// Re-probe delay before a recovered NIC is used again, milliseconds.
    #[serde(default = "rec_ms")]
    pub recover_ms: f64,
    /// Replay boundary (chunk) size, MiB.
    #[serde(default = "chunk_mib")]
    pub replay_chunk_mib: f64,
}
fn err_ms() -> f64 {
    5.0
}
fn stall_ms() -> f64 {
    50.0
}
fn rec_ms() -> f64 {
    1000.0
}
fn chunk_mib() -> f64 {
    4.0
}
impl Default for Detection {
    fn default() -> Self {
        Self { error_ms: err_ms(), stall_timeout_ms: stall_ms(), recover_ms: rec_ms(), replay_chunk_mib: chunk_mib() }
    }
}

impl Detection {
    /// Engine settings (repair mode is set per strategy).
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            repair: RepairMode::Spread,
            sharing: Sharing::MaxMin,
            detect_error_s: self.error_ms / 1e3,
            detect_blackhole_s: self.stall_timeout_ms / 1e3,
            detect_degraded_s: self.error_ms / 1e3,
            recover_detect_s: self.recover_ms / 1e3,
            replay_chunk_bytes: self.replay_chunk_mib * 1048576.0,
        }
    }
}

/// A scenario file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name shown in reports.
    pub name: String,
    /// The cluster.
    pub fabric: FabricSpec,
    /// What runs on it.
    pub workload: Workload,
    /// NIC failures. `at_s <= 0`: present (and known) from the start; later: they hit the run in flight.
    #[serde(default)]
    pub failures: Vec<Failure>,
    /// Strategies to compare (default: all).
    #[serde(default = "all_strategies")]
    pub strategies: Vec<Scheme>,
    /// Detection settings.
    #[serde(default)]
    pub detection: Detection,
    /// Baseline recovery costs.
    #[serde(default)]
    pub recovery: Recovery,
}
fn all_strategies() -> Vec<Scheme> {
    Scheme::ALL.to_vec()
}

/// One strategy's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StrategyReport {
    /// Scheme.
    pub strategy: Scheme,
    /// Step (iteration, token or collective) time with the failures, seconds (infinite: hangs).
    pub seconds: f64,
    /// Same without failures, seconds.
    pub healthy_seconds: f64,
    /// Relative overhead, percent.
    pub overhead_pct: f64,
    /// Throughput with the failures (tokens/s; 0 for a bare collective).
    pub tokens_per_s: f64,
    /// Throughput without failures.
    pub healthy_tokens_per_s: f64,
    /// Failure-induced time over the recovery window, seconds.
    pub failure_induced_s: f64,
}

/// A scenario's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Scenario name.
    pub name: String,
    /// One row per strategy.
    pub rows: Vec<StrategyReport>,
}

impl Scenario {
    /// Parse TOML text, rejecting unknown keys, then validate.
    pub fn from_toml(text: &str) -> Result<Self, SimError> {
        let s: Scenario = toml::from_str(text).map_err(|e| SimError::Parse(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// Validate the fabric, the workload and every failure.
    pub fn validate(&self) -> Result<Fabric, SimError> {
        let fabric = Fabric::new(self.fabric.clone())?;
        self.workload.validate(&fabric)?;
        for (i, f) in self.failures.iter().enumerate() {
            f.validate(&fabric, i)?;
        }
        Ok(fabric)
    }

    /// Run every strategy.
    pub fn run(&self) -> Result<Report, SimError> {
        let fabric = self.validate()?;
        let engine = self.detection.engine();
        let known: Vec<Failure> = self.failures.iter().map(|f| Failure { at_s: f.at_s.min(-1.0), ..*f }).collect();
        let mut rows = Vec::new();
        for &s in &self.strategies {
            let h = self.workload.step(&fabric, s, &[], &engine)?;
            let d = self.workload.step(&fabric, s, &known, &engine)?;
            // The step that is hit: a collective of the workload with the failures arriving in flight.
            let hit_extra = if let Some(first) = self.failures.iter().find(|f| f.at_s > 0.0) {
                let job = AllReduceJob {
                    nodes: (0..fabric.spec().nodes).collect(),
                    bytes: 64.0 * 1048576.0,
                    intra: true,
                    chunks: 4,
                };
                let base = allreduce_run(&fabric, s, &job, &[], &engine)?.makespan;
                let shifted: Vec<Failure> =
                    self.failures.iter().map(|f| Failure { at_s: f.at_s - first.at_s + base / 2.0, ..*f }).collect();
                let r = allreduce_run(&fabric, s, &job, &shifted, &engine)?;
                if r.stalled {
                    f64::INFINITY
                } else {
                    r.makespan - base
                }
            } else {
                0.0
            };
            let induced = failure_induced(s, &self.recovery, h.seconds, d.seconds, hit_extra);
            rows.push(StrategyReport {
                strategy: s,
                seconds: d.seconds,
                healthy_seconds: h.seconds,
                overhead_pct: (d.seconds / h.seconds - 1.0) * 100.0,
                tokens_per_s: d.tokens_per_s,
                healthy_tokens_per_s: h.tokens_per_s,
                failure_induced_s: induced,
            });
        }
        Ok(Report { name: self.name.clone(), rows })
    }
}
