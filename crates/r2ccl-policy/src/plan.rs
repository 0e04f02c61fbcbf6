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

/// A candidate strategy of the planner. The declaration order is the tie-break order.
///
/// Each maps onto an `r2ccl-algo` base algorithm and failure strategy
/// ([`Plan::request_for`]): `Ring` and `Balance` are [`r2ccl_algo::Strategy::Balance`]
/// (identical on a fabric without degraded NICs, the only case `Ring` is offered),
/// `RecursiveDoubling` is [`Algorithm::Tree`] with Balance splits, the others carry the
/// algo strategy of the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
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
    /// Recursive doubling: the latency-optimal AllReduce for small messages.
    RecursiveDoubling,
}

impl Strategy {
    /// Every strategy, in tie-break order.
    pub const ALL: [Strategy; 7] = [
        Strategy::Ring,
        Strategy::Balance,
        Strategy::SingleBackup,
        Strategy::R2cclAllReduce,
        Strategy::Recursive,
        Strategy::FourStage,
        Strategy::RecursiveDoubling,
    ];

    /// The snake_case name used by the CLI and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::Ring => "ring",
            Strategy::Balance => "balance",
            Strategy::SingleBackup => "single_backup",
            Strategy::R2cclAllReduce => "r2ccl_allreduce",
            Strategy::Recursive => "recursive",
            Strategy::FourStage => "four_stage",
            Strategy::RecursiveDoubling => "recursive_doubling",
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
    pub strategy: Strategy,
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
    pub chosen: Strategy,
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
    /// Every applicable strategy, in [`Strategy::ALL`] order.
    pub candidates: Vec<Candidate>,
}

impl Plan {
    /// The candidate for `s`, if it applied.
    pub fn candidate(&self, s: Strategy) -> Option<&Candidate> {
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
    pub fn request_for(&self, s: Strategy) -> Result<ScheduleRequest, PlanError> {
        let c = self.candidate(s).ok_or(PlanError::NotACandidate { strategy: s.name() })?;
        let k = c.params.chunks.unwrap_or(1).max(1);
        let is_allreduce = matches!(self.collective, Collective::AllReduce { .. });
        let hier = is_allreduce && self.ranks_per_node > 1;
        let (algorithm, strategy, chunks) = match s {
            Strategy::Ring | Strategy::Balance if hier => (node_algorithm(c), r2ccl_algo::Strategy::Balance, k),
            Strategy::Ring | Strategy::Balance => (Algorithm::Ring, r2ccl_algo::Strategy::Balance, k),
            Strategy::SingleBackup if hier => (node_algorithm(c), r2ccl_algo::Strategy::SingleBackup, k),
            Strategy::SingleBackup => (Algorithm::Ring, r2ccl_algo::Strategy::SingleBackup, k),
            Strategy::RecursiveDoubling => (Algorithm::Tree, r2ccl_algo::Strategy::Balance, 1),
            Strategy::R2cclAllReduce => {
                let degraded = c.params.degraded.ok_or(PlanError::NotACandidate { strategy: s.name() })?;
                let tail_fraction = c.params.tail_fraction.ok_or(PlanError::NotACandidate { strategy: s.name() })?;
                let p = R2cclParams { degraded, tail_fraction, pipeline_chunks: k };
                (Algorithm::Ring, r2ccl_algo::Strategy::R2cclAllReduce(p), 1)
            }
            Strategy::Recursive => (Algorithm::Ring, r2ccl_algo::Strategy::Recursive { pipeline_chunks: k }, 1),
            Strategy::FourStage => (Algorithm::Ring, r2ccl_algo::Strategy::FourStage, k),
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

/// Pipeline chunk counts the planner tries.
const CHUNK_CHOICES: [u32; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];
/// What the four-stage schedule costs over the bound when the slowest nodes keep a share of the
/// full ring (they keep more than half the others' bandwidth): each slow node's ring share then
/// goes over one connection to its ring successor, which flows sharing links fairly per
/// connection (and ports held at the slow sender's rate) do not drain in proportion to its bytes.
/// Calibrated on r2ccl-sim's runs of the built schedule (1.155-1.17x the bound under max-min,
/// 1.13-1.20x under the port model; docs/reproduction.md, table 2); where the slow nodes only
/// join (at most half the bandwidth) the schedule reaches the bound and no factor applies.
pub const FOUR_STAGE_SHARED_RING: f64 = 1.15;
/// Chunk counts for reduce-to-helper / broadcast-back stages.
const HELPER_CHUNKS: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Relative margin within which recursive AllReduce's prediction counts as equal to
/// R2CCL-AllReduce's (see [`beats`]): with one slower class both closed forms are the same
/// schedule on paper and differ by rounding only.
const HELPER_TIE: f64 = 1e-9;

/// The AllReduce a plain candidate with several ranks per node runs.
fn node_algorithm(c: &Candidate) -> Algorithm {
    if c.params.rails {
        Algorithm::Rails
    } else {
        Algorithm::Hierarchical
    }
}

/// Everything a candidate evaluation needs.
struct Ctx<'a> {
    net: Net<'a>,
    coll: Collective,
    n: usize,
    g: u32,
    p: usize,
    count: u64,
    /// Bytes of one block / buffer (`count * elem`).
    block: f64,
    alpha: f64,
    /// Per-hop latency inside a node.
    intra_alpha: f64,
}

impl Ctx<'_> {
    fn k(&self) -> usize {
        self.net.f.k
    }

    fn acc(&self) -> Acc {
        Acc::new(self.n * self.k())
    }

    fn hop(&self, r: Rate) -> f64 {
        self.alpha * if r.cross { 2.0 } else { 1.0 }
    }

    /// The busiest NIC's time for the bytes of `acc`: the most it sends or receives over its
    /// usable bandwidth (0 without bytes; infinite on a failed NIC with bytes).
    fn busiest(&self, acc: &Acc) -> f64 {
        let k = self.k();
        let mut worst: f64 = 0.0;
        for (x, (&tx, &rx)) in acc.tx.iter().zip(&acc.rx).enumerate() {
            let bytes = tx.max(rx);
            if bytes > 0 {
                let bw = self.net.f.nic(x / k, x % k) as f64 * BYTES_PER_MBPS;
                worst = worst.max(if bw > 0.0 { bytes as f64 / bw } else { f64::INFINITY });
            }
        }
        worst
    }

    /// Node of each position of the flat rank ring that follows `order` (ranks of a node
    /// consecutive).
    fn flat(&self, order: &[usize]) -> Vec<usize> {
        order.iter().flat_map(|&x| std::iter::repeat_n(x, self.g as usize)).collect()
    }

    /// Position of `rank` on the flat ring that follows `order`.
    fn flat_pos(&self, order: &[usize], rank: Rank) -> usize {
        let g = self.g as usize;
        let node = rank.index() / g;
        order.iter().position(|&x| x == node).unwrap_or(0) * g + rank.index() % g
    }

    fn candidate(&self, strategy: Strategy, time_s: f64, params: StrategyParams, acc: Acc, total: f64) -> Candidate {
        Candidate { strategy, time_s, params, nic_bytes: NicBytes::from_acc(self.k(), acc), model_total_bytes: total }
    }
}

/// Ring / Balance / single backup: the collective's plain algorithm with `pol` splits.
fn basic(
    c: &mut Ctx<'_>,
    s: Strategy,
    order: &[usize],
    pol: RailPolicy,
    reranked: bool,
) -> Result<Option<Candidate>, PlanError> {
    let (n, p) = (c.n as f64, c.p as f64);
    let params = StrategyParams { reranked, ..StrategyParams::default() };
    let mut acc = c.acc();
    let intra = Rate { spb: c.net.intra_spb, cross: false };
    let (t, total, params) = match c.coll {
        Collective::AllReduce { .. } => {
            // Several ranks per node: r2ccl-algo's hierarchical AllReduce (a chain reduce to the
            // node's leader, the leaders' ring, a chain broadcast), pipelined in k chunks; without
            // pipelining the 2(g-1) intra-node hops of the whole buffer would run one after another.
            let r = c.net.ring(&mut c.acc(), order, &[], c.count, 1, RailMask::ALL, pol, true, true)?;
            let g = f64::from(c.g);
            let time = |kf: f64| {
                let ring = if c.n < 2 { 0.0 } else { 2.0 * (n - 1.0) * (kf * c.hop(r) + c.block / n * r.spb) };
                let chain = if c.g > 1 {
                    2.0 * (g - 1.0 + kf - 1.0) * (c.intra_alpha + c.block / kf * c.net.intra_spb)
                } else {
                    0.0
                };
                ring + chain
            };
            let mut best = (time(1.0), 1u32);
            for kk in CHUNK_CHOICES.into_iter().filter(|_| c.g > 1) {
                if u64::from(kk) > c.count.max(1) {
                    break;
                }
                let t = time(f64::from(kk));
                if t < best.0 {
                    best = (t, kk);
                }
            }
            let (t, kk) = best;
            // The rail-parallel AllReduce instead, when it is faster.
            let rails = if c.g > 1 { Some(rails_allreduce(c, order, pol)?) } else { None };
            match rails {
                Some((tr, rk, racc)) if tr < t => {
                    acc = racc;
                    (tr, 2.0 * (n - 1.0) * c.block, StrategyParams { rails: true, chunks: Some(rk), ..params })
                }
                _ => {
                    c.net.ring(&mut acc, order, &[], c.count, kk, RailMask::ALL, pol, true, true)?;
                    let params = if c.g > 1 { StrategyParams { chunks: Some(kk), ..params } } else { params };
                    (t, 2.0 * (n - 1.0) * c.block, params)
                }
            }
        }
        Collective::ReduceScatter { .. } | Collective::AllGather => {
            let rs = matches!(c.coll, Collective::ReduceScatter { .. });
            let flat = c.flat(order);
            let mut r = c.net.ring(&mut acc, &flat, &[], c.p as u64 * c.count, 1, RailMask::ALL, pol, rs, !rs)?;
            if c.g > 1 {
                r = r.worst(intra);
            }
            let inter = if c.n < 2 { 0.0 } else { n };
            ((p - 1.0) * (c.hop(r) + c.block * r.spb), inter * (p - 1.0) * c.block, params)
        }
        Collective::Broadcast { root } | Collective::Reduce { root, .. } => {
            let flat = c.flat(order);
            let rp = c.flat_pos(order, root);
            let shift = usize::from(matches!(c.coll, Collective::Reduce { .. }));
            let chain: Vec<usize> = (0..c.p).map(|q| flat[(rp + shift + q) % c.p]).collect();
            let (sum, worst) = c.net.chain(&mut c.acc(), &chain, 1, 1, pol)?;
            let mut best: Option<(f64, u32)> = None;
            for kk in CHUNK_CHOICES {
                if u64::from(kk) > c.count.max(1) {
                    break;
                }
                let kf = f64::from(kk);
                let piece = c.block / kf;
                let t = (p - 1.0 + kf - 1.0) * c.hop(worst) + piece * (sum + (kf - 1.0) * worst.spb);
                if best.is_none_or(|b| t < b.0) {
                    best = Some((t, kk));
                }
            }
            let (t, kk) = best.unwrap_or((0.0, 1));
            c.net.chain(&mut acc, &chain, c.count, kk, pol)?;
            let inter = chain.windows(2).filter(|w| w[0] != w[1]).count() as f64;
            (t, inter * c.block, StrategyParams { chunks: Some(kk), ..params })
        }
        Collective::AlltoAll => {
            let g = u64::from(c.g);
            c.net.all_pairs(&mut acc, c.count, g * g, 1, pol)?;
            let worst = c.busiest(&acc);
            let gf = f64::from(c.g);
            ((p - 1.0) * c.alpha + worst, n * (n - 1.0) * gf * gf * c.block, params)
        }
        Collective::SendRecv { src, dst } => {
            let g = c.g as usize;
            let (a, b) = (src.index() / g, dst.index() / g);
            if src == dst {
                (0.0, 0.0, params)
            } else {
                let r = c.net.send(&mut acc, a, b, &chunked(&[(c.count, 1)], 1), RailMask::ALL, pol)?;
                let total = if a == b { 0.0 } else { c.block };
                (c.hop(r) + c.block * r.spb, total, params)
            }
        }
    };
    Ok(t.is_finite().then(|| c.candidate(s, t, params, acc, total)))
}

/// r2ccl-algo's rail-parallel AllReduce ([`Algorithm::Rails`]) for `c.g` ranks per node along
/// `order`, in `k` chunks per message: a direct reduce-scatter and a direct all-gather inside
/// each node, one hop each, every rank's links carrying `(g - 1) / g` of the buffer each way,
/// and between them one ring AllReduce per rank of a node over its segment on its rails, all
/// at once (`2 (n - 1)` hops, the busiest NIC's bytes over its bandwidth). Every message of a
/// connection goes after the one before, each with its hop. The intra-node phases and the NIC
/// phase use different links, so with `k` chunks they overlap but for `1/k` of the shorter
/// one. Returns the time, the chunk count and the bytes per NIC.
fn rails_allreduce(c: &mut Ctx<'_>, order: &[usize], pol: RailPolicy) -> Result<(f64, u32, Acc), PlanError> {
    let (n, g) = (c.n as f64, f64::from(c.g));
    let mut probe = c.acc();
    let mut hop: f64 = 0.0;
    for i in 0..c.g as usize {
        let (_, len) = r2ccl_algo::even_part(c.count, u64::from(c.g), i as u64);
        let mask = r2ccl_algo::rails_group_mask(c.net.af, i, c.g as usize, pol);
        let r = c.net.ring(&mut probe, order, &[], len, 1, mask, pol, true, true)?;
        hop = hop.max(c.hop(r));
    }
    let nic_bytes = if c.n < 2 { 0.0 } else { c.busiest(&probe) };
    let nvlink_bytes = 2.0 * (g - 1.0) * c.block / g * c.net.intra_spb;
    let time = |kf: f64| {
        let nvlink = 2.0 * kf * c.intra_alpha + nvlink_bytes;
        let nic = if c.n < 2 { 0.0 } else { 2.0 * (n - 1.0) * kf * hop + nic_bytes };
        nvlink.max(nic) + nvlink.min(nic) / kf
    };
    let mut best = (time(1.0), 1u32);
    for kk in CHUNK_CHOICES {
        if u64::from(kk) * u64::from(c.g) > c.count.max(1) {
            break;
        }
        let t = time(f64::from(kk));
        if t < best.0 {
            best = (t, kk);
        }
    }
    let (t, kk) = best;
    let mut acc = c.acc();
    for i in 0..c.g as usize {
        let (_, len) = r2ccl_algo::even_part(c.count, u64::from(c.g), i as u64);
        let mask = r2ccl_algo::rails_group_mask(c.net.af, i, c.g as usize, pol);
        c.net.ring(&mut acc, order, &[], len, kk, mask, pol, true, true)?;
    }
    Ok((t, kk, acc))
}

/// Usable Mbit/s of each node along `order`, as the nested builders see them.
fn order_mbps(f: &Fabric, order: &[usize]) -> Vec<f64> {
    order.iter().map(|&i| f.node_bw[i] as f64).collect()
}

/// The slowest edge of the helper chain among `members` (r2ccl-algo's `helper_levels`: member
/// `j` passes each piece to member `j + 1` over all rails, Balance splits).
fn chain_rate(c: &mut Ctx<'_>, members: &[usize]) -> Result<Rate, PlanError> {
    let mut worst = Rate::default();
    if members.len() < 2 {
        return Ok(worst);
    }
    for (q, &m) in members.iter().enumerate() {
        worst = worst.worst(c.net.rate(m, members[(q + 1) % members.len()], RailMask::ALL, RailPolicy::Balance)?);
    }
    Ok(worst)
}

/// What the helper chain of one level adds after its last fold-in (seconds): r2ccl-algo's
/// `helper_levels` gives each of the `k` pieces (`piece` bytes) to one helper, which passes the
/// result on whole to the other `s - 1` members along a store-and-forward chain, one hop after
/// the other. The chains of earlier pieces overlap the join; the last piece's does not:
/// `(s - 1) * (alpha per hop + piece / B_chain)`. Zero for a level without joiners or with one
/// member.
fn chain_tail(c: &Ctx<'_>, s: usize, has_joiners: bool, piece: f64, rate: Rate) -> f64 {
    if !has_joiners || s < 2 {
        return 0.0;
    }
    (s as f64 - 1.0) * (c.hop(rate) + piece * rate.spb)
}

/// One level of a nested schedule: member and excluded nodes, and its element count.
struct Level {
    members: Vec<usize>,
    excluded: Vec<usize>,
    len: u64,
    fraction: f64,
}

fn levels(order: &[usize], bw: &[f64], plan: &model::LevelPlan, count: u64) -> Vec<Level> {
    let ranges = model::level_ranges(count, &plan.fractions);
    plan.thresholds
        .iter()
        .zip(&plan.fractions)
        .zip(ranges)
        .map(|((&t, &fraction), (_, len))| {
            let (members, excluded) = (0..order.len()).partition::<Vec<usize>, _>(|&i| bw[i] >= t);
            Level {
                members: members.into_iter().map(|i| order[i]).collect(),
                excluded: excluded.into_iter().map(|i| order[i]).collect(),
                len,
                fraction,
            }
        })
        .collect()
}

/// R2CCL-AllReduce (section 5.2) for exactly one degraded node.
fn r2ccl_allreduce(c: &mut Ctx<'_>, order: &[usize]) -> Result<Option<Candidate>, PlanError> {
    let n = c.n;
    let max = c.net.f.node_bw.iter().copied().max().unwrap_or(0);
    let mut slow = (0..n).filter(|&i| c.net.f.node_bw[i] < max);
    let Some(dn) = slow.next() else { return Ok(None) };
    if slow.next().is_some() || n < 3 {
        return Ok(None);
    }
    let h = c.net.af.healthy_rails(NodeId(dn as u32));
    let healthy: Vec<usize> = order.iter().copied().filter(|&x| x != dn).collect();
    let pol = RailPolicy::Balance;
    let mut main = Rate::default();
    for q in 0..n {
        main = main.worst(c.net.rate(order[q], order[(q + 1) % n], h, pol)?);
    }
    let mut tail = Rate::default();
    for q in 0..healthy.len() {
        tail = tail.worst(c.net.rate(healthy[q], healthy[(q + 1) % healthy.len()], h.not(), pol)?);
    }
    let mut join = Rate::default();
    for &m in &healthy {
        join = join.worst(c.net.rate(dn, m, h, pol)?).worst(c.net.rate(m, dn, h, pol)?);
    }
    let chain = chain_rate(c, &healthy)?;
    if !(main.spb.is_finite() && tail.spb.is_finite() && join.spb.is_finite() && chain.spb.is_finite()) {
        return Ok(None);
    }
    let nf = n as f64;
    let d = c.block;
    let x = 1.0 - c.net.f.node_bw[dn] as f64 / max as f64;
    let a = 2.0 * (nf - 1.0) / nf * d * main.spb;
    let b = 2.0 * (nf - 2.0) / (nf - 1.0) * d * tail.spb;
    let y_eq = if a + b > 0.0 { a / (a + b) } else { x };
    let mut best: Option<(f64, f64, u32)> = None;
    for y in [x, y_eq] {
        if !(y > 0.0 && y < 1.0) {
            continue;
        }
        for k in HELPER_CHUNKS {
            let kf = f64::from(k);
            let t1 = 2.0 * (nf - 1.0) * (c.hop(main) + (1.0 - y) * d / nf * main.spb);
            let t2 = 2.0 * (nf - 2.0) * (c.hop(tail) + y * d / (nf - 1.0) * tail.spb);
            let t3 = (kf + 1.0) * (c.hop(join) + y * d / kf * join.spb);
            // The paper's T3 ends when the degraded node has its result; the built schedule
            // ends when the helper chain has passed the last piece to every healthy node.
            let t = t1.max(t2) + t3 + chain_tail(c, healthy.len(), true, y * d / kf, chain);
            if best.is_none_or(|bb| t < bb.0) {
                best = Some((t, y, k));
            }
        }
    }
    let Some((t, y, k)) = best else { return Ok(None) };
    let params = R2cclParams { degraded: NodeId(dn as u32), tail_fraction: y, pipeline_chunks: k };
    let main_len = params.main_len(c.count);
    let mut acc = c.acc();
    c.net.ring(&mut acc, order, &[], main_len, 1, h, pol, true, true)?;
    c.net.ring(&mut acc, &healthy, &[], c.count - main_len, 1, h.not(), pol, true, true)?;
    c.net.helper_join(&mut acc, &healthy, &[dn], c.count - main_len, k, h, pol)?;
    let total = 2.0 * (nf - 1.0) * (1.0 - y) * d + 2.0 * (nf - 2.0) * y * d + 2.0 * y * d + (nf - 2.0) * y * d;
    let sp = StrategyParams {
        tail_fraction: Some(y),
        chunks: Some(k),
        degraded: Some(NodeId(dn as u32)),
        reranked: true,
        ..StrategyParams::default()
    };
    Ok(Some(c.candidate(Strategy::R2cclAllReduce, t, sp, acc, total)))
}

/// Recursive AllReduce (section 6.2) with `r2ccl_algo::model::recursive_plan`.
fn recursive(c: &mut Ctx<'_>, order: &[usize]) -> Result<Candidate, PlanError> {
    let n = c.n as f64;
    let bw = order_mbps(c.net.f, order);
    let plan = model::recursive_plan(&bw)?;
    let bytes_bw: Vec<f64> = bw.iter().map(|b| b * BYTES_PER_MBPS).collect();
    let lv = levels(order, &bw, &plan, c.count);
    let mut chains = Vec::with_capacity(lv.len());
    for l in &lv {
        chains.push(chain_rate(c, &l.members)?);
    }
    // The closed form water-fills stage 1: each level's ring gets just the share of a member's
    // NICs that ends all levels together. The built schedule runs every level's ring on all
    // rails, and a NIC serves its connections alike, so stage 1 takes longer: what it adds.
    let shared_stage1 = {
        let bplan = model::recursive_plan(&bytes_bw)?;
        let closed = model::level_loads(&bytes_bw, &bplan, false)
            .iter()
            .zip(&bytes_bw)
            .map(|(l, b)| l * c.block / b)
            .fold(0.0, f64::max);
        (rings_shared_time(&bytes_bw, &bplan, c.block) - closed).max(0.0)
    };
    let mut best: Option<(f64, u32)> = None;
    for k in HELPER_CHUNKS {
        let kf = f64::from(k);
        // The levels' joins run at once (the closed form's stage 2); each level's chain then
        // passes its last piece on, so the slowest chain tail follows stage 2.
        let tail = lv
            .iter()
            .zip(&chains)
            .map(|(l, &r)| chain_tail(c, l.members.len(), !l.excluded.is_empty(), l.fraction * c.block / kf, r))
            .fold(0.0, f64::max);
        let t = model::recursive_time(&bytes_bw, c.block, Some(k))?
            + shared_stage1
            + (2.0 * (n - 1.0) + kf + 1.0) * c.alpha
            + tail;
        if best.is_none_or(|b| t < b.0) {
            best = Some((t, k));
        }
    }
    let (t, k) = best.unwrap_or((f64::INFINITY, 1));
    let mut acc = c.acc();
    let mut total = 0.0;
    for l in &lv {
        c.net.ring(&mut acc, &l.members, &[], l.len, 1, RailMask::ALL, RailPolicy::Balance, true, true)?;
    }
    for l in &lv {
        c.net.helper_join(&mut acc, &l.members, &l.excluded, l.len, k, RailMask::ALL, RailPolicy::Balance)?;
        let (s, e) = (l.members.len() as f64, l.excluded.len() as f64);
        let chain = if e > 0.0 { s - 1.0 } else { 0.0 };
        total += (2.0 * (s - 1.0) + 2.0 * e + chain) * l.fraction * c.block;
    }
    let params = StrategyParams {
        chunks: Some(k),
        level_fractions: plan.fractions.clone(),
        class_mbps: plan.thresholds.iter().map(|&t| t as u64).collect(),
        reranked: true,
        ..StrategyParams::default()
    };
    Ok(c.candidate(Strategy::Recursive, t, params, acc, total))
}

/// How long the rings of the levels of `plan` take together when they share every member
/// node's bandwidth (`bw`, bytes/s) alike per ring, for a buffer of `d` bytes: a fluid model.
/// Level `l` rings `fraction_l * d` among the nodes at or above its threshold, `2 (s - 1) / s`
/// of it out of each member; the levels' rates are max-min fair over the nodes (each level
/// uses every member node, whose bandwidth its levels share), recomputed whenever a level ends.
fn rings_shared_time(bw: &[f64], plan: &model::LevelPlan, d: f64) -> f64 {
    let levels = plan.thresholds.len().min(plan.fractions.len());
    let member = |l: usize, i: usize| bw[i] >= plan.thresholds[l];
    let mut left: Vec<f64> = (0..levels)
        .map(|l| {
            let s = (0..bw.len()).filter(|&i| member(l, i)).count() as f64;
            if s > 1.0 {
                plan.fractions[l].max(0.0) * d * 2.0 * (s - 1.0) / s
            } else {
                0.0
            }
        })
        .collect();
    let mut t = 0.0;
    for _ in 0..levels {
        let active: Vec<usize> = (0..levels).filter(|&l| left[l] > 0.0).collect();
        if active.is_empty() {
            break;
        }
        // Progressive filling: raise the unfrozen levels' rates together until a node is full.
        let mut rate = vec![0.0f64; levels];
        let mut frozen = vec![false; levels];
        let mut spare: Vec<f64> = bw.to_vec();
        while active.iter().any(|&l| !frozen[l]) {
            let count = |i: usize| active.iter().filter(|&&l| !frozen[l] && member(l, i)).count();
            let step = (0..bw.len())
                .filter(|&i| count(i) > 0)
                .map(|i| spare[i].max(0.0) / count(i) as f64)
                .fold(f64::INFINITY, f64::min);
            if !step.is_finite() {
                break;
            }
            for &l in &active {
                if !frozen[l] {
                    rate[l] += step;
                }
            }
            for (i, sp) in spare.iter_mut().enumerate() {
                *sp -= step * count(i) as f64;
            }
            for &l in &active {
                if !frozen[l] && (0..bw.len()).any(|i| member(l, i) && spare[i] <= 1e-9 * bw[i]) {
                    frozen[l] = true;
                }
            }
        }
        let dt = active.iter().filter(|&&l| rate[l] > 0.0).map(|&l| left[l] / rate[l]).fold(f64::INFINITY, f64::min);
        if !dt.is_finite() {
            return f64::INFINITY;
        }
        t += dt;
        for &l in &active {
            left[l] = if left[l] - rate[l] * dt <= 1e-9 * d { 0.0 } else { left[l] - rate[l] * dt };
        }
    }
    t
}

/// The four-stage AllReduce (section 7) with `r2ccl_algo::model::four_stage_plan`.
fn four_stage(c: &mut Ctx<'_>, order: &[usize]) -> Result<Candidate, PlanError> {
    let n = c.n as f64;
    let bw = order_mbps(c.net.f, order);
    let plan = model::four_stage_plan(&bw)?;
    let bytes_bw: Vec<f64> = bw.iter().map(|b| b * BYTES_PER_MBPS).collect();
    // The bandwidth model reaches the bound; the built schedule does not when the slowest
    // class keeps a share of the full ring (see FOUR_STAGE_SHARED_RING).
    let shared_ring = plan.thresholds.len() > 1 && plan.fractions.first().is_some_and(|&f| f > 1e-9);
    let t_bw = model::four_stage_time(&bytes_bw, c.block)? * if shared_ring { FOUR_STAGE_SHARED_RING } else { 1.0 };
    let mut best = (f64::INFINITY, 1u32);
    for k in CHUNK_CHOICES {
        if u64::from(k) > c.count.max(1) {
            break;
        }
        let kf = f64::from(k);
        let t = t_bw * (1.0 + 1.0 / kf) + (2.0 * (n - 1.0) + 2.0 + kf - 1.0) * c.alpha;
        if t < best.0 {
            best = (t, k);
        }
    }
    let (t, k) = best;
    let mut acc = c.acc();
    for l in levels(order, &bw, &plan, c.count) {
        c.net.spread_join(&mut acc, &l.members, &l.excluded, l.len, k)?;
        c.net.ring(&mut acc, &l.members, &l.excluded, l.len, k, RailMask::ALL, RailPolicy::Spread, true, true)?;
    }
    let params = StrategyParams {
        chunks: Some(k),
        ring_fraction: plan.fractions.first().copied(),
        level_fractions: plan.fractions.clone(),
        class_mbps: plan.thresholds.iter().map(|&t| t as u64).collect(),
        reranked: true,
        ..StrategyParams::default()
    };
    Ok(c.candidate(Strategy::FourStage, t, params, acc, 2.0 * (n - 1.0) * c.block))
}

/// Recursive doubling over all ranks along the flat ring (r2ccl-algo's tree AllReduce).
fn recursive_doubling(c: &mut Ctx<'_>, order: &[usize]) -> Result<Option<Candidate>, PlanError> {
    let flat = c.flat(order);
    let p = c.p;
    if p < 2 {
        return Ok(None);
    }
    let p2 = 1usize << (usize::BITS - 1 - p.leading_zeros());
    let extra = p - p2;
    let msgs = chunked(&[(c.count, 1)], 1);
    let mut acc = c.acc();
    let (mut t, mut total) = (0.0, 0.0);
    let pol = RailPolicy::Balance;
    // A round: its intra-node pairs take a hop inside the node and their buffer at the intra-node
    // rate. Its inter-node pairs take a hop and their buffer at their transfer's rate, and as they
    // share their nodes' NICs, at least the busiest NIC's bytes of the round over its bandwidth.
    let mut round = |c: &mut Ctx<'_>, acc: &mut Acc, pairs: &[(usize, usize)]| -> Result<f64, PlanError> {
        let mut worst: f64 = 0.0;
        let mut hop: Option<f64> = None;
        let mut ra = c.acc();
        for &(a, b) in pairs {
            let r = c.net.send(&mut ra, flat[a], flat[b], &msgs, RailMask::ALL, pol)?;
            if flat[a] != flat[b] {
                total += c.block;
                hop = Some(hop.unwrap_or(0.0).max(c.hop(r)));
                worst = worst.max(c.hop(r) + c.block * r.spb);
            } else {
                worst = worst.max(c.intra_alpha + c.block * r.spb);
            }
        }
        for (x, (tx, rx)) in ra.tx.iter().zip(&ra.rx).enumerate() {
            acc.tx[x] += tx;
            acc.rx[x] += rx;
        }
        Ok(worst.max(hop.map_or(0.0, |h| h + c.busiest(&ra))))
    };
    let fold: Vec<(usize, usize)> = (0..extra).map(|e| (2 * e, 2 * e + 1)).collect();
    if extra > 0 {
        t += round(c, &mut acc, &fold)?;
    }
    let real = |id: usize| if id < extra { 2 * id + 1 } else { id + extra };
    let mut dist = 1;
    while dist < p2 {
        let pairs: Vec<(usize, usize)> = (0..p2).map(|id| (real(id), real(id ^ dist))).collect();
        t += round(c, &mut acc, &pairs)?;
        dist <<= 1;
    }
    if extra > 0 {
        let back: Vec<(usize, usize)> = fold.iter().map(|&(a, b)| (b, a)).collect();
        t += round(c, &mut acc, &back)?;
    }
    let params = StrategyParams { reranked: true, ..StrategyParams::default() };
    Ok(t.is_finite().then(|| c.candidate(Strategy::RecursiveDoubling, t, params, acc, total)))
}

/// Intra-node phases of r2ccl-algo's hierarchical wrapper around the nested strategies for G
/// ranks per node (seconds): a chain reduce to the node's leader before the inter-node part and a
/// chain broadcast after it, each over the whole buffer and pipelined in `k` chunks (the
/// schedule's chunk count: four-stage's K, 1 for R2CCL-AllReduce and recursive).
fn intra(topo: &Topology, d: f64, k: u32) -> f64 {
    let g = f64::from(topo.ranks_per_node());
    if g <= 1.0 || d == 0.0 {
        return 0.0;
    }
    let bw = topo.intra_gbps() * 1e9 / 8.0;
    let kf = f64::from(k.max(1));
    2.0 * (g - 1.0 + kf - 1.0) * (topo.intra_alpha_s() + d / kf / bw)
}

/// Lower bound on the inter-node time (bandwidth model) with `d` bytes per rank.
fn lower_bound(f: &Fabric, coll: Collective, d: f64, g: u32) -> Result<f64, PlanError> {
    let n = f.node_count();
    if d == 0.0 {
        return Ok(0.0);
    }
    let nf = n as f64;
    let bw: Vec<f64> = f.node_bw.iter().map(|&b| b as f64 * BYTES_PER_MBPS).collect();
    let sum: f64 = bw.iter().sum();
    let min = bw.iter().copied().fold(f64::INFINITY, f64::min);
    if let Collective::SendRecv { src, dst } = coll {
        let (a, b) = (src.index() / g as usize, dst.index() / g as usize);
        return Ok(if a == b { 0.0 } else { d / bw[a].min(bw[b]) });
    }
    if n < 2 {
        return Ok(0.0);
    }
    Ok(match coll {
        Collective::AllReduce { .. } => model::lower_bound(&bw, d)?,
        Collective::ReduceScatter { .. } | Collective::AllGather => {
            ((nf - 1.0) * d / sum).max((nf - 1.0) / nf * d / min)
        }
        Collective::Broadcast { .. } | Collective::Reduce { .. } => d / min,
        Collective::AlltoAll | Collective::SendRecv { .. } => f64::from(g) * (nf - 1.0) / nf * d / min,
    })
}

/// Whether candidate `c` (later in [`Strategy::ALL`] order) replaces `best`: it must be
/// strictly faster. Recursive AllReduce must also beat R2CCL-AllReduce by more than
/// [`HELPER_TIE`]: its prediction (the closed form plus the helper chain) does not yet charge
/// what its built schedule costs in stage 1, where r2ccl-algo runs both level rings on all
/// rails and the tail ring takes link share from the main ring on every healthy NIC (about 4 ms
/// of 42.6 at 64 x 8 nodes, docs/reproduction.md). R2CCL-AllReduce keeps the main ring on the
/// degraded node's live rails and the tail ring on the others, so at equal predictions it is the
/// faster schedule.
fn beats(c: &Candidate, best: &Candidate) -> bool {
    if c.strategy == Strategy::Recursive && best.strategy == Strategy::R2cclAllReduce {
        return c.time_s < best.time_s * (1.0 - HELPER_TIE);
    }
    c.time_s < best.time_s
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
/// use r2ccl_policy::{plan, Collective, Strategy, Topology};
///
/// let topo = Topology::uniform(8, 4, 400_000)?;
/// let view = HealthView::uniform(8, 4, 400_000);
/// let allreduce = Collective::AllReduce { op: ReduceOp::Sum };
/// let small = plan(&topo, &view, allreduce, 4 << 10)?;
/// let large = plan(&topo, &view, allreduce, 1 << 30)?;
/// assert_eq!((small.chosen, large.chosen), (Strategy::RecursiveDoubling, Strategy::Ring));
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
        cands.extend(basic(&mut ctx, Strategy::Ring, &identity, RailPolicy::Balance, false)?);
    }
    if n >= 2 && f.is_degraded() {
        cands.extend(basic(&mut ctx, Strategy::Balance, &order, RailPolicy::Balance, true)?);
    }
    if n >= 2 && f.has_failure() {
        cands.extend(basic(&mut ctx, Strategy::SingleBackup, &identity, RailPolicy::SingleBackup, false)?);
    }
    if is_allreduce && n >= 3 {
        cands.extend(r2ccl_allreduce(&mut ctx, &order)?);
        let distinct = f.node_bw.iter().any(|&b| b != f.node_bw[0]);
        if distinct {
            cands.push(recursive(&mut ctx, &order)?);
            cands.push(four_stage(&mut ctx, &order)?);
        }
    }
    if is_allreduce && n >= 2 {
        cands.extend(recursive_doubling(&mut ctx, &order)?);
    }
    // The plain strategies model their own (pipelined) intra-node chains; the nested ones get
    // the chains of the hierarchical wrapper they are built in.
    let plain = |s: Strategy| matches!(s, Strategy::Ring | Strategy::Balance | Strategy::SingleBackup);
    for c in &mut cands {
        if count == 0 {
            c.time_s = 0.0;
            c.model_total_bytes = 0.0;
        } else if is_allreduce && c.strategy != Strategy::RecursiveDoubling && !plain(c.strategy) {
            let k = if c.strategy == Strategy::FourStage { c.params.chunks.unwrap_or(1) } else { 1 };
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
    let (chosen, time_s) = chosen.unwrap_or((Strategy::Balance, f64::INFINITY));

    let t_nf = if count == 0 {
        0.0
    } else {
        let nominal = f.nominal();
        let naf = nominal.algo(g, health.epoch())?;
        let mut nctx = Ctx { net: Net::new(&nominal, &naf, elem, intra_spb), ..ctx };
        basic(&mut nctx, Strategy::Ring, &identity, RailPolicy::Balance, false)?.map_or(0.0, |c| c.time_s)
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
