//! The planner: evaluates every applicable strategy with the alpha-beta cost model, picks
//! the fastest deterministically, and turns the choice into an `r2ccl-algo` schedule request.
//!
//! Cost model. Inter-node transfers are split over NICs exactly as `r2ccl-algo` splits them
//! ([`r2ccl_algo::Fabric::split`]); a transfer's rate is set by its busiest NIC (and by the
//! spine's share for parts that cross rails). A synchronous step costs `alpha` per hop (two
//! hops when it crosses rails) plus its bytes at the slowest transfer of the step. AllReduce
//! runs hierarchically when a node holds several ranks (intra-node phases at the topology's
//! intra-node bandwidth); the other collectives run their flat algorithms over all ranks.
//! The water-filling strategies (recursive, four-stage) and the lower bound use
//! `r2ccl_algo::model`'s closed forms over node bandwidths. The helper strategies
//! (R2CCL-AllReduce, recursive) add the helper chain as r2ccl-algo's `helper_levels` builds
//! it: after the last fold-in, that piece's result goes whole along the level's `s - 1` other
//! members, `(s - 1) (alpha + Y D / (K B))`.
//!
//! Predicted bytes per NIC are exact: they replay the builders' inter-node messages (see
//! `mirror.rs`), so they equal [`r2ccl_algo::Traffic`] of the built schedule byte for byte.

use crate::fabric::{Fabric, BYTES_PER_MBPS};
use crate::mirror::{chunked, Acc, Net, Rate};
use crate::rerank::{self, RingScore, EXACT_MAX_NODES};
use crate::topology::Topology;
use r2ccl_algo::{model, AlgoError, Algorithm, Collective, R2cclParams, RailMask, RailPolicy, ScheduleRequest};
use r2ccl_core::{DType, HealthEpoch, HealthView, NodeId, Rank};
use serde::{Deserialize, Serialize};

mod candidates;
use candidates::*;
pub use candidates::{DIRECT_PART_MIN_BYTES, FOUR_STAGE_SHARED_RING};

/// Why no plan (or no schedule request from a plan) could be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    /// The health view describes a different number of nodes than the topology.
    #[error("health view has {health_nodes} nodes but the topology has {topology_nodes}")]
    HealthShape {
        /// Nodes in the topology.
        topology_nodes: usize,
        /// Nodes in the health view.
        health_nodes: usize,
    },
    /// A node's NIC count differs between topology and health view.
    #[error("{node} has {health_rails} NICs in the health view but {topology_rails} in the topology")]
    HealthRails {
        /// The node.
        node: NodeId,
        /// NICs in the topology.
        topology_rails: usize,
        /// NICs in the health view.
        health_rails: usize,
    },
    /// Every NIC of a node is failed: it cannot take part in any inter-node collective.
    #[error("{0} has no usable NIC left (all its NICs are failed)")]
    NodeDisconnected(NodeId),
    /// A root rank is outside the communicator.
    #[error("root {root} is outside the communicator of {ranks} ranks")]
    RootOutOfRange {
        /// The requested root.
        root: Rank,
        /// Ranks in the communicator.
        ranks: u64,
    },
    /// A send/receive peer is outside the communicator.
    #[error("{rank} ({role}) is outside the communicator of {ranks} ranks")]
    RankOutOfRange {
        /// The offending rank.
        rank: Rank,
        /// Which argument it was (`src` or `dst`).
        role: &'static str,
        /// Ranks in the communicator.
        ranks: u64,
    },
    /// A ring order names a node outside the topology.
    #[error("{node} in the ring order is outside the topology of {nodes} nodes")]
    NodeOutOfRange {
        /// The offending node.
        node: NodeId,
        /// Nodes in the topology.
        nodes: usize,
    },
    /// Two nodes have no common rail and the fabric has no spine, and no ring order avoids them.
    #[error("no ring order connects all nodes: {a} and {b} share no usable rail and the fabric has no spine")]
    NoPath {
        /// One end of the unusable pair.
        a: NodeId,
        /// The other end.
        b: NodeId,
    },
    /// A schedule request was asked for a strategy that is not a candidate of the plan.
    #[error("{strategy} is not a candidate of this plan (it does not apply to the case)")]
    NotACandidate {
        /// The strategy's name.
        strategy: &'static str,
    },
    /// The schedule crate refused the layout, health view or request.
    #[error("schedule: {0}")]
    Schedule(#[from] AlgoError),
}

/// Which schedule family a planner candidate is (its name is the `policy.strategy` setting's and
/// `r2ccl-plan --strategy`'s value). Not a failure strategy: that is [`r2ccl_algo::Strategy`],
/// with its parameters, which each kind maps onto. The declaration order is the tie-break order.
///
/// Each maps onto an `r2ccl-algo` base algorithm and failure strategy
/// ([`Plan::request_for`]): `Ring` and `Balance` are [`r2ccl_algo::Strategy::Balance`]
/// (identical on a fabric without degraded NICs, the only case `Ring` is offered),
/// `RecursiveDoubling` is [`Algorithm::Tree`] with Balance splits, the others carry the
/// algo strategy of the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CandidateKind {
    /// The plain ring (applies only when no NIC is failed or degraded).
    Ring,
    /// Balance: the same algorithm, NIC shares proportional to usable bandwidth (section 5.1).
    Balance,
    /// Hot repair only: a failed NIC's channels move onto one backup NIC.
    SingleBackup,
    /// R2CCL-AllReduce: main/tail split with reduce-to-helper (section 5.2).
    R2cclAllReduce,
    /// Recursive AllReduce over bandwidth classes (section 6.2).
    Recursive,
    /// The four-stage bound-reaching AllReduce, water-filled over bandwidth classes (section 7).
    FourStage,
    /// The four-stage AllReduce with direct exchanges per level (every pair of a level's nodes
    /// at once, over fair-share splits) instead of one ring per level.
    FourStageDirect,
    /// Recursive doubling: the latency-optimal AllReduce for small messages.
    RecursiveDoubling,
}

impl CandidateKind {
    /// Every strategy, in tie-break order.
    pub const ALL: [CandidateKind; 8] = [
        CandidateKind::Ring,
        CandidateKind::Balance,
        CandidateKind::SingleBackup,
        CandidateKind::R2cclAllReduce,
        CandidateKind::Recursive,
        CandidateKind::FourStage,
        CandidateKind::FourStageDirect,
        CandidateKind::RecursiveDoubling,
    ];

    /// The snake_case name used by the CLI and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            CandidateKind::Ring => "ring",
            CandidateKind::Balance => "balance",
            CandidateKind::SingleBackup => "single_backup",
            CandidateKind::R2cclAllReduce => "r2ccl_allreduce",
            CandidateKind::Recursive => "recursive",
            CandidateKind::FourStage => "four_stage",
            CandidateKind::FourStageDirect => "four_stage_direct",
            CandidateKind::RecursiveDoubling => "recursive_doubling",
        }
    }
}

/// Parameters of a strategy (fields that do not apply are `None` / empty).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StrategyParams {
    /// R2CCL-AllReduce tail fraction Y.
    pub tail_fraction: Option<f64>,
    /// Pipeline chunks K: of the reduce-to-helper / broadcast-back stage for R2CCL-AllReduce
    /// and recursive AllReduce, of every transfer for the four-stage schedule and for
    /// Broadcast/Reduce chains (`None` = 1).
    pub chunks: Option<u32>,
    /// Four-stage fraction f that runs the full ring including the slowest nodes (informational:
    /// `r2ccl-algo` derives the same value from the node bandwidths).
    pub ring_fraction: Option<f64>,
    /// Recursive / four-stage: fraction of the buffer per level, slowest class first
    /// (level l runs among the nodes of bandwidth class l and faster).
    pub level_fractions: Vec<f64>,
    /// Node bandwidth of each class (Mbit/s), slowest first, matching `level_fractions`.
    pub class_mbps: Vec<u64>,
    /// R2CCL-AllReduce: the degraded node.
    pub degraded: Option<NodeId>,
    /// Whether the strategy follows the re-ranked ring order (`Plan::ring_order`) rather than
    /// node-id order.
    pub reranked: bool,
    /// Ring / Balance / single backup AllReduce with several ranks per node: runs r2ccl-algo's
    /// rail-parallel [`Algorithm::Rails`] rather than [`Algorithm::Hierarchical`].
    #[serde(default)]
    pub rails: bool,
}

/// Predicted bytes per NIC, `[node * rails + rail]`, sent and received. They equal the
/// built schedule's [`r2ccl_algo::Traffic`] exactly (same splits, same element rounding).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicBytes {
    /// NICs per node.
    pub rails: usize,
    /// Bytes sent by each NIC.
    pub tx: Vec<u64>,
    /// Bytes received by each NIC.
    pub rx: Vec<u64>,
}

impl NicBytes {
    fn from_acc(rails: usize, acc: Acc) -> Self {
        Self { rails, tx: acc.tx, rx: acc.rx }
    }

    /// Bytes sent by NIC `rail` of `node` (0 if out of range).
    pub fn tx(&self, node: usize, rail: usize) -> u64 {
        self.tx.get(node * self.rails + rail).copied().unwrap_or(0)
    }

    /// Bytes received by NIC `rail` of `node` (0 if out of range).
    pub fn rx(&self, node: usize, rail: usize) -> u64 {
        self.rx.get(node * self.rails + rail).copied().unwrap_or(0)
    }

    /// Sum of bytes sent by all NICs.
    pub fn total_tx(&self) -> u64 {
        self.tx.iter().sum()
    }

    /// Sum of bytes received by all NICs.
    pub fn total_rx(&self) -> u64 {
        self.rx.iter().sum()
    }
}

/// One evaluated strategy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// The strategy.
    pub strategy: CandidateKind,
    /// Predicted completion time, seconds.
    pub time_s: f64,
    /// Its chosen parameters.
    pub params: StrategyParams,
    /// Predicted inter-node bytes per NIC.
    pub nic_bytes: NicBytes,
    /// Total inter-node bytes the cost model assumes (sum over senders, continuous: level
    /// fractions and the tail fraction unrounded).
    pub model_total_bytes: f64,
}

/// The planner's decision for one collective under one health view.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The collective (the reduce op does not change the plan).
    pub collective: Collective,
    /// Element type of the payload.
    pub dtype: DType,
    /// Elements per block (as in [`ScheduleRequest::count`]).
    pub count: u64,
    /// Bytes per rank the model moves: the buffer for AllReduce, Broadcast, Reduce and
    /// Send/Recv; the whole `ranks x count` input (ReduceScatter), output (AllGather) or
    /// send buffer (AlltoAll) otherwise.
    pub bytes: u64,
    /// Ranks per node of the communicator (ranks are numbered node by node).
    pub ranks_per_node: u32,
    /// Epoch of the health view the plan was made from.
    pub epoch: HealthEpoch,
    /// The chosen (fastest) strategy.
    pub chosen: CandidateKind,
    /// Predicted time of the chosen strategy, seconds.
    pub time_s: f64,
    /// Fault-free time: the plain algorithm on the same topology with every NIC healthy.
    pub t_nf_s: f64,
    /// Lower bound on the collective's inter-node time under this health view (bandwidth model).
    pub lower_bound_s: f64,
    /// The re-ranked ring order of nodes, starting at node 0.
    pub ring_order: Vec<NodeId>,
    /// Quality of `ring_order`.
    pub ring_score: RingScore,
    /// Balance weights `w = b / sum b` per NIC, `[node * rails + rail]`.
    pub nic_weights: Vec<f64>,
    /// Every applicable strategy, in [`CandidateKind::ALL`] order.
    pub candidates: Vec<Candidate>,
}

impl Plan {
    /// The candidate for `s`, if it applied.
    pub fn candidate(&self, s: CandidateKind) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.strategy == s)
    }

    /// The chosen candidate.
    pub fn chosen_candidate(&self) -> Option<&Candidate> {
        self.candidate(self.chosen)
    }

    /// The `r2ccl-algo` request of the chosen strategy: with the fabric from
    /// [`schedule_fabric`], [`r2ccl_algo::build_rank_schedule`] builds exactly the schedule
    /// whose time and bytes per NIC this plan predicted.
    pub fn schedule_request(&self) -> Result<ScheduleRequest, PlanError> {
        self.request_for(self.chosen)
    }

    /// The `r2ccl-algo` request of candidate `s` (same collective, payload, strategy,
    /// parameters, pipeline chunks and ring order as the candidate's prediction).
    pub fn request_for(&self, s: CandidateKind) -> Result<ScheduleRequest, PlanError> {
        let c = self.candidate(s).ok_or(PlanError::NotACandidate { strategy: s.name() })?;
        let k = c.params.chunks.unwrap_or(1).max(1);
        let is_allreduce = matches!(self.collective, Collective::AllReduce { .. });
        let hier = is_allreduce && self.ranks_per_node > 1;
        let (algorithm, strategy, chunks) = match s {
            CandidateKind::Ring | CandidateKind::Balance if hier => {
                (node_algorithm(c), r2ccl_algo::Strategy::Balance, k)
            }
            CandidateKind::Ring | CandidateKind::Balance => (Algorithm::Ring, r2ccl_algo::Strategy::Balance, k),
            CandidateKind::SingleBackup if hier => (node_algorithm(c), r2ccl_algo::Strategy::SingleBackup, k),
            CandidateKind::SingleBackup => (Algorithm::Ring, r2ccl_algo::Strategy::SingleBackup, k),
            CandidateKind::RecursiveDoubling => (Algorithm::Tree, r2ccl_algo::Strategy::Balance, 1),
            CandidateKind::R2cclAllReduce => {
                let degraded = c.params.degraded.ok_or(PlanError::NotACandidate { strategy: s.name() })?;
                let tail_fraction = c.params.tail_fraction.ok_or(PlanError::NotACandidate { strategy: s.name() })?;
                let p = R2cclParams { degraded, tail_fraction, pipeline_chunks: k };
                (Algorithm::Ring, r2ccl_algo::Strategy::R2cclAllReduce(p), 1)
            }
            CandidateKind::Recursive => (Algorithm::Ring, r2ccl_algo::Strategy::Recursive { pipeline_chunks: k }, 1),
            CandidateKind::FourStage => (Algorithm::Ring, r2ccl_algo::Strategy::FourStage, k),
            CandidateKind::FourStageDirect => (Algorithm::Ring, r2ccl_algo::Strategy::FourStageDirect, k),
        };
        let mut req = ScheduleRequest::new(self.collective, self.dtype, self.count)
            .with_algorithm(algorithm)
            .with_strategy(strategy)
            .with_chunks(chunks);
        let identity = self.ring_order.iter().enumerate().all(|(i, n)| n.index() == i);
        if c.params.reranked && !identity {
            let g = self.ranks_per_node;
            req = req.with_ring(self.ring_order.iter().flat_map(|n| (0..g).map(move |l| Rank(n.0 * g + l))).collect());
        }
        Ok(req)
    }
}

/// The `r2ccl-algo` fabric a plan's schedules are built on: the topology's layout (ranks
/// node by node, `ranks_per_node` each) and a health view whose NICs have the topology's
/// line rates scaled by the agreed view's usable fraction (what the planner used).
pub fn schedule_fabric(topology: &Topology, health: &HealthView) -> Result<r2ccl_algo::Fabric, PlanError> {
    Fabric::new(topology, health)?.algo(topology.ranks_per_node(), health.epoch())
}

fn check_ranks(coll: Collective, ranks: u64) -> Result<(), PlanError> {
    match coll {
        Collective::Broadcast { root } | Collective::Reduce { root, .. } if u64::from(root.0) >= ranks => {
            Err(PlanError::RootOutOfRange { root, ranks })
        }
        Collective::SendRecv { src, dst } => {
            for (rank, role) in [(src, "src"), (dst, "dst")] {
                if u64::from(rank.0) >= ranks {
                    return Err(PlanError::RankOutOfRange { rank, role, ranks });
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The ring order `plan` uses for the re-ranked strategies: exact search up to
/// [`EXACT_MAX_NODES`] nodes, the heuristic beyond.
pub fn rerank(topology: &Topology, health: &HealthView) -> Result<(Vec<NodeId>, RingScore), PlanError> {
    let f = Fabric::new(topology, health)?;
    let order = rerank_fabric(&f);
    let s = rerank::score(&f, &order);
    Ok((order.into_iter().map(|i| NodeId(i as u32)).collect(), s))
}

/// Only the heuristic re-ranking (to compare against [`rerank_exact`]).
pub fn rerank_heuristic(topology: &Topology, health: &HealthView) -> Result<(Vec<NodeId>, RingScore), PlanError> {
    let f = Fabric::new(topology, health)?;
    let order = rerank::heuristic(&f);
    let s = rerank::score(&f, &order);
    Ok((order.into_iter().map(|i| NodeId(i as u32)).collect(), s))
}

/// Only the exact search (any node count; exponential beyond about 12 distinct nodes).
pub fn rerank_exact(topology: &Topology, health: &HealthView) -> Result<(Vec<NodeId>, RingScore), PlanError> {
    let f = Fabric::new(topology, health)?;
    let inc: Vec<usize> = (0..f.node_count()).collect();
    let order = rerank::exact(&f, &inc);
    let s = rerank::score(&f, &order);
    Ok((order.into_iter().map(|i| NodeId(i as u32)).collect(), s))
}

/// Score of a given ring order under a topology and health view.
pub fn ring_score(topology: &Topology, health: &HealthView, order: &[NodeId]) -> Result<RingScore, PlanError> {
    let f = Fabric::new(topology, health)?;
    let o: Vec<usize> = order.iter().map(|x| x.index()).collect();
    if let Some(&bad) = o.iter().find(|&&i| i >= f.node_count()) {
        return Err(PlanError::NodeOutOfRange { node: NodeId(bad as u32), nodes: f.node_count() });
    }
    Ok(rerank::score(&f, &o))
}

fn rerank_fabric(f: &Fabric) -> Vec<usize> {
    let h = rerank::heuristic(f);
    let best = if f.node_count() <= EXACT_MAX_NODES { rerank::exact(f, &h) } else { h };
    // Keep node-id order when it is as good: fewer ranks change neighbours.
    let identity: Vec<usize> = (0..f.node_count()).collect();
    if rerank::score(f, &best).is_better_than(&rerank::score(f, &identity)) {
        best
    } else {
        identity
    }
}

/// Plan `collective` of `bytes` per rank on `topology` under `health`.
///
/// Shorthand for [`plan_payload`] with one-byte elements: `count = bytes` for AllReduce,
/// Broadcast, Reduce and Send/Recv, `count = bytes / ranks` (rounded down) for the blocked
/// collectives, whose `bytes` are the whole per-rank input, output or send buffer.
///
/// The choice depends on the size: latency wins for small messages, bandwidth for large.
///
/// ```rust
/// use r2ccl_core::{HealthView, ReduceOp};
/// use r2ccl_policy::{plan, Collective, CandidateKind, Topology};
///
/// let topo = Topology::uniform(8, 4, 400_000)?;
/// let view = HealthView::uniform(8, 4, 400_000);
/// let allreduce = Collective::AllReduce { op: ReduceOp::Sum };
/// let small = plan(&topo, &view, allreduce, 4 << 10)?;
/// let large = plan(&topo, &view, allreduce, 1 << 30)?;
/// assert_eq!((small.chosen, large.chosen), (CandidateKind::RecursiveDoubling, CandidateKind::Ring));
/// for p in [&small, &large] {
///     let fastest = p.candidates.iter().map(|c| c.time_s).fold(f64::INFINITY, f64::min);
///     assert_eq!(p.time_s, fastest);
///     assert!(p.time_s >= p.lower_bound_s);
/// }
/// // Equal inputs give identical plans (every rank plans on its own).
/// assert_eq!(plan(&topo, &view, allreduce, 1 << 30)?, large);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn plan(topology: &Topology, health: &HealthView, collective: Collective, bytes: u64) -> Result<Plan, PlanError> {
    let count = if is_blocked(collective) { bytes / topology.rank_count().max(1) } else { bytes };
    plan_payload(topology, health, collective, DType::U8, count)
}

fn is_blocked(c: Collective) -> bool {
    matches!(c, Collective::ReduceScatter { .. } | Collective::AllGather | Collective::AlltoAll)
}

/// Plan `collective` over `count` elements of `dtype` per block (as in
/// [`ScheduleRequest`]) on `topology` under `health`.
///
/// Deterministic: equal inputs give bit-identical plans. A zero-byte collective moves
/// nothing: every applicable strategy predicts 0 s and the plain algorithm (ring, or
/// balance under failures) is chosen. Errors: a health view of another shape, a node
/// without any usable NIC, a root or peer outside the communicator, nodes that no ring
/// order can connect.
pub fn plan_payload(
    topology: &Topology,
    health: &HealthView,
    collective: Collective,
    dtype: DType,
    count: u64,
) -> Result<Plan, PlanError> {
    let ranks = topology.rank_count();
    check_ranks(collective, ranks)?;
    let f = Fabric::new(topology, health)?;
    let n = f.node_count();
    let k = f.k;
    let g = topology.ranks_per_node();
    let elem = dtype.size() as u64;
    let block = count as f64 * elem as f64;
    let d = if is_blocked(collective) { block * ranks as f64 } else { block };
    let identity: Vec<usize> = (0..n).collect();
    let order = if topology.rerank() { rerank_fabric(&f) } else { identity.clone() };
    let score = rerank::score(&f, &order);
    if n >= 2 && score.bottleneck_mbps == 0 {
        let p = (0..n).find(|&p| f.pair(order[p], order[(p + 1) % n]).0 == 0).unwrap_or(0);
        return Err(PlanError::NoPath { a: NodeId(order[p] as u32), b: NodeId(order[(p + 1) % n] as u32) });
    }
    let af = f.algo(g, health.epoch())?;
    let intra_spb = 8.0 / (topology.intra_gbps() * 1e9);
    let mut ctx = Ctx {
        net: Net::new(&f, &af, elem, intra_spb),
        coll: collective,
        n,
        g,
        p: ranks as usize,
        count,
        block,
        alpha: topology.alpha_s(),
        intra_alpha: topology.intra_alpha_s(),
    };
    let is_allreduce = matches!(collective, Collective::AllReduce { .. });

    let mut cands: Vec<Candidate> = Vec::new();
    // A single node uses no inter-node NIC, so its plain algorithm applies under any failure.
    if !f.is_degraded() || n == 1 {
        cands.extend(basic(&mut ctx, CandidateKind::Ring, &identity, RailPolicy::Balance, false)?);
    }
    if n >= 2 && f.is_degraded() {
        cands.extend(basic(&mut ctx, CandidateKind::Balance, &order, RailPolicy::Balance, true)?);
    }
    if n >= 2 && f.has_failure() {
        cands.extend(basic(&mut ctx, CandidateKind::SingleBackup, &identity, RailPolicy::SingleBackup, false)?);
    }
    if is_allreduce && n >= 3 {
        cands.extend(r2ccl_allreduce(&mut ctx, &order)?);
        let distinct = f.node_bw.iter().any(|&b| b != f.node_bw[0]);
        if distinct {
            cands.push(recursive(&mut ctx, &order)?);
            cands.push(four_stage(&mut ctx, &order, false)?);
            cands.push(four_stage(&mut ctx, &order, true)?);
        }
    }
    if is_allreduce && n >= 2 {
        cands.extend(recursive_doubling(&mut ctx, &order)?);
    }
    // The plain strategies model their own (pipelined) intra-node chains; the nested ones get
    // the chains of the hierarchical wrapper they are built in.
    let plain =
        |s: CandidateKind| matches!(s, CandidateKind::Ring | CandidateKind::Balance | CandidateKind::SingleBackup);
    for c in &mut cands {
        if count == 0 {
            c.time_s = 0.0;
            c.model_total_bytes = 0.0;
        } else if is_allreduce && c.strategy != CandidateKind::RecursiveDoubling && !plain(c.strategy) {
            let four_stage = matches!(c.strategy, CandidateKind::FourStage | CandidateKind::FourStageDirect);
            let k = if four_stage { c.params.chunks.unwrap_or(1) } else { 1 };
            c.time_s += intra(topology, block, k);
        }
    }
    cands.sort_by_key(|c| c.strategy);
    let chosen = cands
        .iter()
        .fold(None::<&Candidate>, |b, c| match b {
            Some(b) if !beats(c, b) => Some(b),
            _ => Some(c),
        })
        .map(|c| (c.strategy, c.time_s));
    let (chosen, time_s) = chosen.unwrap_or((CandidateKind::Balance, f64::INFINITY));

    let t_nf = if count == 0 {
        0.0
    } else {
        let nominal = f.nominal();
        let naf = nominal.algo(g, health.epoch())?;
        let mut nctx = Ctx { net: Net::new(&nominal, &naf, elem, intra_spb), ..ctx };
        basic(&mut nctx, CandidateKind::Ring, &identity, RailPolicy::Balance, false)?.map_or(0.0, |c| c.time_s)
    };
    let lb = if count == 0 { 0.0 } else { lower_bound(&f, collective, d, g)? };
    let nic_weights = (0..n * k).map(|x| f.bw[x] as f64 / f.node_bw[x / k] as f64).collect();
    Ok(Plan {
        collective,
        dtype,
        count,
        bytes: d as u64,
        ranks_per_node: g,
        epoch: health.epoch(),
        chosen,
        time_s,
        t_nf_s: t_nf,
        lower_bound_s: lb,
        ring_order: order.into_iter().map(|i| NodeId(i as u32)).collect(),
        ring_score: score,
        nic_weights,
        candidates: cands,
    })
}
