//! Workload models (data-parallel training, tensor+pipeline-parallel training, LLM decode) and the
//! failure-cost models of the baselines (crash-and-restart from a checkpoint, AdapCC-like).
//!
//! Collectives are simulated flow by flow on the fabric; an iteration's timeline (compute delays, gradient
//! buckets, pipeline stages) is then run as a DAG of delays through the same engine. A collective's duration
//! does not depend on the compute around it (no GPU interference is modeled), and the collectives of one
//! job run one after another on one stream, so identical collectives are simulated once per health state.

use crate::collective::{build_allreduce, healthy, AllReduceJob, PlanHealth, Scheme};
use crate::engine::{simulate, Dag, EngineConfig, Failure, Op, TaskId};
use crate::error::SimError;
use crate::fabric::{Endpoint, Fabric};
use serde::{Deserialize, Serialize};

/// GPU speed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// Peak dense bf16 throughput, TFLOP/s.
    pub tflops: f64,
    /// Model FLOP utilization reached by training kernels.
    pub mfu: f64,
    /// HBM bandwidth, GB/s (decode is memory bound).
    #[serde(default = "hbm")]
    pub hbm_gbs: f64,
}
fn hbm() -> f64 {
    3350.0
}

impl Gpu {
    /// H100 SXM: 989 TFLOP/s bf16, 3.35 TB/s HBM.
    pub fn h100(mfu: f64) -> Self {
        Self { tflops: 989.0, mfu, hbm_gbs: hbm() }
    }
}

/// What the cluster runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Workload {
    /// One AllReduce of `bytes_mib` per GPU over all GPUs (hierarchical).
    Allreduce {
        /// Buffer per GPU, MiB.
        bytes_mib: f64,
        /// Pipeline chunks for the R2CCL-AllReduce / four-stage / recursive helper parts.
        #[serde(default = "chunks")]
        chunks: u32,
    },
    /// Data-parallel training (optionally tensor-parallel inside a node).
    DataParallel {
        /// Parameters.
        params: f64,
        /// Bytes per gradient element (4: fp32 gradient reduction, 2: bf16).
        grad_bytes: f64,
        /// Tokens per iteration, whole job.
        tokens_per_iter: f64,
        /// Tensor-parallel degree inside a node (1 = pure data parallel).
        #[serde(default = "one")]
        tp: u32,
        /// Gradient buckets per iteration.
        buckets: u32,
        /// Overlap each bucket's AllReduce with the rest of the backward pass.
        overlap: bool,
        /// GPU speed.
        gpu: Gpu,
        /// Pipeline chunks for the helper parts of the schedules.
        #[serde(default = "chunks")]
        chunks: u32,
    },
    /// Tensor parallel inside a node, pipeline parallel across nodes, data parallel over pipeline replicas.
    TensorPipeline {
        /// Parameters.
        params: f64,
        /// Hidden size.
        hidden: f64,
        /// Pipeline stages (one node each).
        pp: u32,
        /// Data-parallel replicas (nodes per stage).
        dp: u32,
        /// Micro-batches per iteration.
        micro_batches: u32,
        /// Tokens per micro-batch.
        micro_batch_tokens: f64,
        /// Bytes per gradient element of the data-parallel AllReduce.
        #[serde(default = "four")]
        grad_bytes: f64,
        /// GPU speed.
        gpu: Gpu,
        /// Pipeline chunks for the helper parts of the schedules.
        #[serde(default = "chunks")]
        chunks: u32,
    },
    /// LLM decode with tensor parallelism over all GPUs: two AllReduces per layer per token.
    Decode {
        /// Parameters.
        params: f64,
        /// Layers.
        layers: u32,
        /// Hidden size.
        hidden: f64,
        /// Sequences decoded together.
        batch: f64,
        /// GPU speed.
        gpu: Gpu,
    },
}
fn chunks() -> u32 {
    8
}
fn one() -> u32 {
    1
}
fn four() -> f64 {
    4.0
}

/// Per-strategy result of a workload under a health state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepTime {
    /// Iteration (or token, or collective) time, seconds.
    pub seconds: f64,
    /// Time in communication on the critical path or total collective time, seconds.
    pub comm_seconds: f64,
    /// Tokens per second (training: whole job; decode: per sequence stream).
    pub tokens_per_s: f64,
}

/// Plan view from failures known at the start (`at_s <= 0`, not yet back).
pub fn plan_health(fabric: &Fabric, failures: &[Failure]) -> PlanHealth {
    let mut h = healthy(fabric);
    for f in failures.iter().filter(|f| f.at_s <= 0.0 && f.until_s.is_none_or(|u| u > 0.0)) {
        let cell = &mut h[f.node as usize][f.rail as usize];
        *cell = cell.min(f.remaining());
    }
    h
}

/// Simulate one AllReduce (`job`) under `strategy` and `failures`; returns the engine result.
pub fn allreduce_run(
    fabric: &Fabric,
    strategy: Scheme,
    job: &AllReduceJob,
    failures: &[Failure],
    engine: &EngineConfig,
) -> Result<crate::engine::RunResult, SimError> {
    let h = plan_health(fabric, failures);
    let mut dag = Dag::new();
    match strategy.schedule_choice() {
        Some(choice) => {
            crate::convert::append_allreduce(&mut dag, fabric, &h, job, choice, None)?;
        }
        None => {
            build_allreduce(&mut dag, fabric, &h, strategy, job, None);
        }
    }
    let cfg = EngineConfig { repair: strategy.repair_mode(), ..*engine };
    simulate(fabric, &dag, failures, &cfg)
}

fn ar_time(fabric: &Fabric, s: Scheme, job: &AllReduceJob, f: &[Failure], e: &EngineConfig) -> Result<f64, SimError> {
    let r = allreduce_run(fabric, s, job, f, e)?;
    Ok(if r.stalled { f64::INFINITY } else { r.makespan })
}

fn positive(field: &'static str, v: f64) -> Result<(), SimError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(SimError::Param { field, value: v.to_string(), why: "must be a positive finite number" })
    }
}

impl Workload {
    /// Check parameters against the fabric, naming the offending field.
    pub fn validate(&self, fabric: &Fabric) -> Result<(), SimError> {
        let s = fabric.spec();
        match self {
            Workload::Allreduce { bytes_mib, .. } => positive("workload.bytes_mib", *bytes_mib),
            Workload::DataParallel { params, grad_bytes, tokens_per_iter, tp, buckets, gpu, .. } => {
                positive("workload.params", *params)?;
                positive("workload.grad_bytes", *grad_bytes)?;
                positive("workload.tokens_per_iter", *tokens_per_iter)?;
                positive("workload.gpu.mfu", gpu.mfu)?;
                positive("workload.gpu.tflops", gpu.tflops)?;
                if *buckets == 0 {
                    return Err(SimError::Param {
                        field: "workload.buckets",
                        value: "0".into(),
                        why: "need at least one",
                    });
                }
                if *tp != 1 && *tp != s.gpus_per_node {
                    return Err(SimError::Param {
                        field: "workload.tp",
                        value: tp.to_string(),
                        why: "tensor parallelism must be 1 or all GPUs of a node",
                    });
                }
                Ok(())
            }
            Workload::TensorPipeline { params, pp, dp, micro_batches, gpu, .. } => {
                positive("workload.params", *params)?;
                positive("workload.gpu.mfu", gpu.mfu)?;
                if pp * dp != s.nodes {
                    return Err(SimError::Param {
                        field: "workload.pp",
                        value: format!("pp {pp} x dp {dp}"),
                        why: "pp * dp must equal fabric.nodes (one node per stage replica)",
                    });
                }
                if *micro_batches == 0 {
                    return Err(SimError::Param {
                        field: "workload.micro_batches",
                        value: "0".into(),
                        why: "need at least one",
                    });
                }
                Ok(())
            }
            Workload::Decode { params, layers, batch, gpu, .. } => {
                positive("workload.params", *params)?;
                positive("workload.batch", *batch)?;
                positive("workload.gpu.hbm_gbs", gpu.hbm_gbs)?;
                if *layers == 0 {
                    return Err(SimError::Param {
                        field: "workload.layers",
                        value: "0".into(),
                        why: "need at least one",
                    });
                }
                Ok(())
            }
        }
    }

    /// Steady-state step time under `strategy` with `failures` known (planned around) from the start.
    pub fn step(
        &self,
        fabric: &Fabric,
        strategy: Scheme,
        failures: &[Failure],
        engine: &EngineConfig,
    ) -> Result<StepTime, SimError> {
        let s = fabric.spec();
        let all: Vec<u32> = (0..s.nodes).collect();
        let gpus = f64::from(s.gpus());
        match self {
            Workload::Allreduce { bytes_mib, chunks } => {
                let job = AllReduceJob { nodes: all, bytes: bytes_mib * 1048576.0, intra: true, chunks: *chunks };
                let t = ar_time(fabric, strategy, &job, failures, engine)?;
                Ok(StepTime { seconds: t, comm_seconds: t, tokens_per_s: 0.0 })
            }
            Workload::DataParallel { params, grad_bytes, tokens_per_iter, tp, buckets, overlap, gpu, chunks } => {
                let compute = 6.0 * params * tokens_per_iter / (gpus * gpu.tflops * 1e12 * gpu.mfu);
                let per_gpu = params / f64::from(*tp) * grad_bytes;
                let intra = *tp == 1;
                let node_bytes = if intra { per_gpu } else { per_gpu * f64::from(s.gpus_per_node) };
                let job = AllReduceJob { nodes: all, bytes: node_bytes / f64::from(*buckets), intra, chunks: *chunks };
                let t_ar = ar_time(fabric, strategy, &job, failures, engine)?;
                let (fwd, bwd) = (compute / 3.0, compute * 2.0 / 3.0);
                // The iteration timeline as a DAG of delays: forward, backward in buckets, one AllReduce per
                // bucket on one stream (overlapped with the rest of the backward pass, or after it).
                let mut dag = Dag::new();
                let mut prev_b = dag.add(Op::Delay(fwd), &[]);
                let mut grads = Vec::new();
                for _ in 0..*buckets {
                    prev_b = dag.add(Op::Delay(bwd / f64::from(*buckets)), &[prev_b]);
                    grads.push(prev_b);
                }
                let mut prev_ar: Option<TaskId> = None;
                for g in grads {
                    let mut deps = vec![if *overlap { g } else { prev_b }];
                    deps.extend(prev_ar);
                    prev_ar = Some(dag.add(Op::Delay(t_ar), &deps));
                }
                let r = simulate(fabric, &dag, &[], engine)?;
                let t = if t_ar.is_finite() { r.makespan } else { f64::INFINITY };
                Ok(StepTime { seconds: t, comm_seconds: t_ar * f64::from(*buckets), tokens_per_s: tokens_per_iter / t })
            }
            Workload::TensorPipeline {
                params,
                hidden,
                pp,
                dp,
                micro_batches,
                micro_batch_tokens,
                grad_bytes,
                gpu,
                chunks,
            } => {
                let tokens = micro_batch_tokens * f64::from(*micro_batches) * f64::from(*dp);
                let compute = 6.0 * params * tokens / (gpus * gpu.tflops * 1e12 * gpu.mfu);
                let m = f64::from(*micro_batches);
                let per_mb = compute / m;
                // Activations between stages: every TP rank sends its slice over its own rail, in parallel.
                let act = micro_batch_tokens * hidden * 2.0 / f64::from(s.gpus_per_node);
                let t_p2p = self.p2p_time(fabric, strategy, failures, engine, act)?;
                let p = f64::from(*pp);
                // 1F1B: (m + p - 1) slots of forward+backward, each with one activation and one gradient hop.
                let pipe = (m + p - 1.0) * (per_mb + 2.0 * t_p2p);
                // Data-parallel gradient AllReduce among the dp replicas of a stage (per-rail rings).
                let t_dp = if *dp > 1 {
                    let nodes: Vec<u32> = (0..*dp).map(|r| r * pp).collect();
                    let per_gpu = params / (f64::from(s.gpus_per_node) * p) * grad_bytes;
                    let job = AllReduceJob {
                        nodes,
                        bytes: per_gpu * f64::from(s.gpus_per_node),
                        intra: false,
                        chunks: *chunks,
                    };
                    ar_time(fabric, strategy, &job, failures, engine)?
                } else {
                    0.0
                };
                let t = pipe + t_dp;
                Ok(StepTime { seconds: t, comm_seconds: 2.0 * (m + p - 1.0) * t_p2p + t_dp, tokens_per_s: tokens / t })
            }
            Workload::Decode { params, layers, hidden, batch, gpu } => {
                let weights_per_gpu = params * 2.0 / gpus;
                let t_mem = weights_per_gpu / (gpu.hbm_gbs * 1e9);
                let job = AllReduceJob { nodes: all, bytes: batch * hidden * 2.0, intra: true, chunks: 1 };
                let t_ar = ar_time(fabric, strategy, &job, failures, engine)?;
                let t = t_mem + 2.0 * f64::from(*layers) * t_ar;
                Ok(StepTime { seconds: t, comm_seconds: 2.0 * f64::from(*layers) * t_ar, tokens_per_s: 1.0 / t })
            }
        }
    }

    /// Time of one activation hop from node 0 (or the first degraded node) to its pipeline neighbour.
    fn p2p_time(
        &self,
        fabric: &Fabric,
        strategy: Scheme,
        failures: &[Failure],
        engine: &EngineConfig,
        bytes: f64,
    ) -> Result<f64, SimError> {
        let s = fabric.spec();
        let h = plan_health(fabric, failures);
        let src = (0..s.nodes).find(|&n| h[n as usize].iter().any(|&x| x < 1.0)).unwrap_or(0);
        let dst = if src + 1 < s.nodes { src + 1 } else { src.saturating_sub(1) };
        let mut dag = Dag::new();
        let balance = matches!(strategy, Scheme::NoResilience | Scheme::HotRepair | Scheme::AdapCc);
        for g in 0..s.gpus_per_node {
            let rail = fabric.rail_of_gpu(g);
            let degraded = h[src as usize].iter().chain(&h[dst as usize]).any(|&x| x < 1.0);
            let rails = if !balance && degraded { crate::engine::ALL_RAILS } else { 1u64 << rail.min(63) };
            dag.add(
                Op::Transfer { src: Endpoint::new(src, g), dst: Endpoint::new(dst, g), bytes, rails, weight: bytes },
                &[],
            );
        }
        let cfg = EngineConfig { repair: strategy.repair_mode(), ..*engine };
        let r = simulate(fabric, &dag, failures, &cfg)?;
        Ok(if r.stalled { f64::INFINITY } else { r.makespan })
    }
}

/// Costs of the baselines when a failure hits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recovery {
    /// Checkpoint interval, minutes (crash-and-restart loses half of it on average).
    #[serde(default = "ckpt")]
    pub checkpoint_interval_min: f64,
    /// Detection + isolation + reload time of a crash-and-restart, minutes (paper's median: about 68).
    #[serde(default = "restart")]
    pub restart_min: f64,
    /// AdapCC-like: time until a collective stuck on a dead NIC is aborted (transport timeout), seconds.
    #[serde(default = "adapcc_timeout")]
    pub adapcc_timeout_s: f64,
    /// AdapCC-like: communicator rebuild and re-profiling after the abort, seconds.
    #[serde(default = "adapcc_reconfig")]
    pub adapcc_reconfig_s: f64,
    /// How long the failed NIC stays out (the window over which failure-induced time is summed), minutes.
    #[serde(default = "window")]
    pub window_min: f64,
}
fn ckpt() -> f64 {
    30.0
}
fn restart() -> f64 {
    68.0
}
fn adapcc_timeout() -> f64 {
    30.0
}
fn adapcc_reconfig() -> f64 {
    5.0
}
fn window() -> f64 {
    60.0
}

impl Default for Recovery {
    fn default() -> Self {
        Self {
            checkpoint_interval_min: ckpt(),
            restart_min: restart(),
            adapcc_timeout_s: adapcc_timeout(),
            adapcc_reconfig_s: adapcc_reconfig(),
            window_min: window(),
        }
    }
}

/// Failure-induced time (seconds) of one failure lasting the recovery window.
///
/// * crash-and-restart: restart time plus half a checkpoint interval of lost work, then full speed;
/// * AdapCC-like: the collective in flight hangs until the timeout, is aborted, the communicator is rebuilt
///   and the step re-run; afterwards every step runs at its degraded time `degraded`;
/// * R2CCL strategies: `hit_extra` (detection, migration, replay in the step that was hit) plus the
///   degraded steps.
pub fn failure_induced(strategy: Scheme, rec: &Recovery, healthy: f64, degraded: f64, hit_extra: f64) -> f64 {
    let window = rec.window_min * 60.0;
    let steps = (window / degraded.max(1e-12)).floor();
    let steady = steps * (degraded - healthy).max(0.0);
    match strategy {
        Scheme::NoResilience => rec.restart_min * 60.0 + rec.checkpoint_interval_min * 60.0 / 2.0,
        Scheme::AdapCc => rec.adapcc_timeout_s + rec.adapcc_reconfig_s + healthy / 2.0 + steady,
        _ => hit_extra + steady,
    }
}
