//! The planner: evaluates every applicable strategy with the alpha-beta cost model and picks
//! the fastest, deterministically.
//!
//! Cost model. Inter-node work is modelled per node (a node's G ranks share its NICs;
//! hierarchical collectives add intra-node phases at the topology's intra-node bandwidth).
//! A synchronous step costs `alpha` per hop (two hops when a pair needs the spine) plus
//! its bytes over the bottleneck of that step. Ring-based strategies use rail-aligned pair
//! capacities (see [`crate::RingScore`]); the water-filling strategies (recursive,
//! four-stage) and the lower bound use node bandwidth (all of a node's healthy NICs).

use crate::fabric::{Fabric, BYTES_PER_MBPS};
use crate::rerank::{self, RingScore, EXACT_MAX_NODES};
use crate::topology::Topology;
use r2ccl_core::{HealthEpoch, HealthView, NodeId, Rank};
use serde::{Deserialize, Serialize};

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// Two nodes have no common rail and the fabric has no spine, and no ring order avoids them.
    #[error("no ring order connects all nodes: {a} and {b} share no usable rail and the fabric has no spine")]
    NoPath {
        /// One end of the unusable pair.
        a: NodeId,
        /// The other end.
        b: NodeId,
    },
}

/// The collective operation to plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    /// AllReduce of `bytes` per rank.
    AllReduce,
    /// ReduceScatter of an input of `bytes` per rank.
    ReduceScatter,
    /// AllGather of an output of `bytes` per rank.
    AllGather,
    /// Broadcast of `bytes` from `root`.
    Broadcast {
        /// The source rank.
        root: Rank,
    },
    /// Reduce of `bytes` per rank into `root`.
    Reduce {
        /// The destination rank.
        root: Rank,
    },
    /// AlltoAll with `bytes` of send buffer per rank.
    AllToAll,
}

/// A candidate strategy. The declaration order is the tie-break order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The plain ring with an equal split over NICs (applies only without failed NICs).
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
    /// Pipeline chunks K.
    pub chunks: Option<u32>,
    /// Four-stage fraction f that runs the full ring including the slowest nodes.
    pub ring_fraction: Option<f64>,
    /// Recursive / four-stage: fraction of the buffer per level, slowest class first
    /// (level l runs among the nodes of bandwidth class l and faster).
    pub level_fractions: Vec<f64>,
    /// Node bandwidth of each class (Mbit/s), slowest first, matching `level_fractions`.
    pub class_mbps: Vec<u64>,
    /// R2CCL-AllReduce: the degraded node.
    pub degraded: Option<NodeId>,
    /// R2CCL-AllReduce: the healthy node that reduces and broadcasts back its tail.
    pub helper: Option<NodeId>,
    /// Whether the strategy follows the re-ranked ring order (`Plan::ring_order`) rather than
    /// node-id order.
    pub reranked: bool,
}

/// Predicted bytes per NIC, `[node * rails + rail]`, sent and received.
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
    fn from_f64(rails: usize, tx: &[f64], rx: &[f64]) -> Self {
        Self {
            rails,
            tx: tx.iter().map(|&x| x.round() as u64).collect(),
            rx: rx.iter().map(|&x| x.round() as u64).collect(),
        }
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
    /// Total inter-node bytes the model assumes (sum over senders), before rounding.
    pub model_total_bytes: f64,
}

/// The planner's decision for one collective under one health view.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The collective.
    pub collective: Collective,
    /// Bytes per rank.
    pub bytes: u64,
    /// Epoch of the health view the plan was made from.
    pub epoch: HealthEpoch,
    /// The chosen (fastest) strategy.
    pub chosen: Strategy,
    /// Predicted time of the chosen strategy, seconds.
    pub time_s: f64,
    /// Fault-free time: the plain ring on the same topology with every NIC healthy.
    pub t_nf_s: f64,
    /// Lower bound on the collective's time under this health view (bandwidth model).
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
}

/// Pipeline chunk counts the planner tries.
const CHUNK_CHOICES: [u32; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];
/// Chunk counts for reduce-to-helper / broadcast-back stages.
const HELPER_CHUNKS: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];

struct Ctx<'a> {
    f: &'a Fabric,
    n: usize,
    d: f64,
    alpha: f64,
}

/// How a ring-like strategy spreads an edge's traffic over NICs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Split {
    /// Channel r on rail r, equal shares.
    Equal,
    /// Channel r on rail r, or on the next rail healthy at both ends.
    Backup,
    /// Rail-aligned, proportional to usable pair capacity.
    Balance,
}

fn mbps(x: u64) -> f64 {
    x as f64 * BYTES_PER_MBPS
}

fn backup_rails(f: &Fabric, i: usize, j: usize, r: usize) -> (usize, usize, bool) {
    let both = f.mask[i] & f.mask[j];
    for t in 0..f.k {
        let s = (r + t) % f.k;
        if both & (1 << s) != 0 {
            return (s, s, false);
        }
    }
    (f.mask[i].trailing_zeros() as usize, f.mask[j].trailing_zeros() as usize, true)
}

/// Rate (bytes/s) of an edge i -> j under `split`, and whether it needs the spine.
fn edge_rate(f: &Fabric, split: Split, i: usize, j: usize) -> Option<(f64, bool)> {
    match split {
        Split::Equal => {
            let m = (0..f.k).map(|r| f.nic(i, r).min(f.nic(j, r))).min().unwrap_or(0);
            (m > 0).then(|| (mbps(m) * f.k as f64, false))
        }
        Split::Balance => {
            let (cap, spine) = f.pair(i, j);
            (cap > 0).then(|| (mbps(cap), spine))
        }
        Split::Backup => {
            let mut tx = [0u32; 64];
            let mut rx = [0u32; 64];
            let mut spine = false;
            for r in 0..f.k {
                let (a, b, s) = backup_rails(f, i, j, r);
                tx[a] += 1;
                rx[b] += 1;
                spine |= s;
            }
            // seconds per byte of the edge = max over NICs of (share / rate)
            let mut worst: f64 = 0.0;
            for r in 0..f.k {
                if tx[r] > 0 {
                    worst = worst.max(f64::from(tx[r]) / f.k as f64 / mbps(f.nic(i, r)));
                }
                if rx[r] > 0 {
                    worst = worst.max(f64::from(rx[r]) / f.k as f64 / mbps(f.nic(j, r)));
                }
            }
            (worst > 0.0 && worst.is_finite()).then(|| (1.0 / worst, spine))
        }
    }
}

fn edge_traffic(f: &Fabric, split: Split, i: usize, j: usize, bytes: f64, tx: &mut [f64], rx: &mut [f64]) {
    match split {
        Split::Equal => {
            for r in 0..f.k {
                tx[i * f.k + r] += bytes / f.k as f64;
                rx[j * f.k + r] += bytes / f.k as f64;
            }
        }
        Split::Balance => f.add_pair_traffic(i, j, bytes, tx, rx),
        Split::Backup => {
            for r in 0..f.k {
                let (a, b, _) = backup_rails(f, i, j, r);
                tx[i * f.k + a] += bytes / f.k as f64;
                rx[j * f.k + b] += bytes / f.k as f64;
            }
        }
    }
}

struct Shape {
    steps: f64,
    chunk: f64,
    edge_bytes: f64,
    closed: bool,
    reverse: bool,
}

/// A synchronous ring (or chain) collective: time and per-NIC traffic.
fn ring_like(c: &Ctx<'_>, split: Split, order: &[usize], sh: &Shape) -> Option<(f64, NicBytes, f64)> {
    let n = order.len();
    let edges = if n < 2 {
        0
    } else if sh.closed {
        n
    } else {
        n - 1
    };
    let mut rate = f64::INFINITY;
    let mut spine = false;
    let mut tx = vec![0.0; n * c.f.k];
    let mut rx = vec![0.0; n * c.f.k];
    for p in 0..edges {
        let (mut i, mut j) = (order[p], order[(p + 1) % n]);
        if sh.reverse {
            std::mem::swap(&mut i, &mut j);
        }
        let (r, s) = edge_rate(c.f, split, i, j)?;
        rate = rate.min(r);
        spine |= s;
        edge_traffic(c.f, split, i, j, sh.edge_bytes, &mut tx, &mut rx);
    }
    if edges == 0 {
        return Some((0.0, NicBytes::from_f64(c.f.k, &tx, &rx), 0.0));
    }
    let hop = c.alpha * if spine { 2.0 } else { 1.0 };
    let t = sh.steps * (hop + sh.chunk / rate);
    Some((t, NicBytes::from_f64(c.f.k, &tx, &rx), sh.edge_bytes * edges as f64))
}

/// Node-level rate of all-pairs traffic under `split` (AlltoAll).
fn node_rate(f: &Fabric, split: Split, i: usize) -> Option<(f64, Vec<f64>)> {
    let k = f.k;
    match split {
        Split::Equal => {
            let m = (0..k).map(|r| f.nic(i, r)).min().unwrap_or(0);
            (m > 0).then(|| (mbps(m) * k as f64, vec![1.0 / k as f64; k]))
        }
        Split::Balance => {
            let tot = f.node_bw[i] as f64;
            Some((mbps(f.node_bw[i]), (0..k).map(|r| f.nic(i, r) as f64 / tot).collect()))
        }
        Split::Backup => {
            let mut cnt = vec![0u32; k];
            for r in 0..k {
                let s = (0..k).map(|t| (r + t) % k).find(|&s| f.mask[i] & (1 << s) != 0)?;
                cnt[s] += 1;
            }
            let worst = (0..k)
                .filter(|&r| cnt[r] > 0)
                .map(|r| f64::from(cnt[r]) / k as f64 / mbps(f.nic(i, r)))
                .fold(0.0, f64::max);
            Some((1.0 / worst, cnt.iter().map(|&x| f64::from(x) / k as f64).collect()))
        }
    }
}

fn evaluate_basic(
    c: &Ctx<'_>,
    coll: Collective,
    split: Split,
    order: &[usize],
    g: u32,
    params: StrategyParams,
    s: Strategy,
) -> Option<Candidate> {
    let n = c.n as f64;
    let d = c.d;
    let k = c.f.k;
    let mk = |time_s: f64, nic_bytes: NicBytes, total: f64, params: StrategyParams| Candidate {
        strategy: s,
        time_s,
        params,
        nic_bytes,
        model_total_bytes: total,
    };
    match coll {
        Collective::AllReduce | Collective::ReduceScatter | Collective::AllGather => {
            let factor = if coll == Collective::AllReduce { 2.0 } else { 1.0 };
            let sh = Shape {
                steps: factor * (n - 1.0),
                chunk: d / n,
                edge_bytes: factor * (n - 1.0) * d / n,
                closed: true,
                reverse: false,
            };
            let (t, b, tot) = ring_like(c, split, order, &sh)?;
            Some(mk(t, b, tot, params))
        }
        Collective::Broadcast { root } | Collective::Reduce { root } => {
            let root_node = (root.0 / g) as usize;
            let mut chain = order.to_vec();
            if let Some(p) = chain.iter().position(|&x| x == root_node) {
                chain.rotate_left(p);
            }
            let reverse = matches!(coll, Collective::Reduce { .. });
            if reverse {
                chain[1..].reverse();
            }
            let mut best: Option<Candidate> = None;
            for kk in CHUNK_CHOICES {
                if f64::from(kk) > d.max(1.0) {
                    break;
                }
                let sh = Shape {
                    steps: (n - 1.0) + f64::from(kk) - 1.0,
                    chunk: d / f64::from(kk),
                    edge_bytes: d,
                    closed: false,
                    reverse,
                };
                let (t, b, tot) = ring_like(c, split, &chain, &sh)?;
                if best.as_ref().is_none_or(|x| t < x.time_s) {
                    let p = StrategyParams { chunks: Some(kk), ..params.clone() };
                    best = Some(mk(t, b, tot, p));
                }
            }
            best
        }
        Collective::AllToAll => {
            let per_node = f64::from(g) * (n - 1.0) / n * d;
            let mut tx = vec![0.0; c.n * k];
            if c.n < 2 {
                return Some(mk(0.0, NicBytes::from_f64(k, &tx, &tx), 0.0, params));
            }
            let mut worst: f64 = 0.0;
            for i in 0..c.n {
                let (rate, w) = node_rate(c.f, split, i)?;
                worst = worst.max(per_node / rate);
                for r in 0..k {
                    tx[i * k + r] += per_node * w[r];
                }
            }
            let t = (n - 1.0) * c.alpha + worst;
            Some(mk(t, NicBytes::from_f64(k, &tx, &tx), per_node * n, params))
        }
    }
}

/// Bandwidth classes: distinct node bandwidths (bytes/s) ascending, with counts and the
/// class of each node.
struct Classes {
    beta: Vec<f64>,
    mbps: Vec<u64>,
    count: Vec<usize>,
    of: Vec<usize>,
}

fn classes(f: &Fabric) -> Classes {
    let mut v: Vec<u64> = f.node_bw.clone();
    v.sort_unstable();
    v.dedup();
    let of = f.node_bw.iter().map(|b| v.partition_point(|x| x < b)).collect::<Vec<_>>();
    let mut count = vec![0; v.len()];
    for &c in &of {
        count[c] += 1;
    }
    Classes { beta: v.iter().map(|&x| mbps(x)).collect(), mbps: v, count, of }
}

/// The four-stage water-filling fractions (they reach the lower bound exactly).
fn four_stage_phi(cl: &Classes, n: usize) -> Vec<f64> {
    let m = cl.beta.len();
    let nf = n as f64;
    let total: f64 = cl.beta.iter().zip(&cl.count).map(|(b, &c)| b * c as f64).sum();
    let t = (2.0 * nf - 2.0) / total;
    let t = t.max(1.0 / cl.beta[0]);
    let u: Vec<f64> = cl.beta.iter().map(|b| ((t * b - 1.0) / (nf - 2.0)).max(0.0)).collect();
    let cu: f64 = u.iter().zip(&cl.count).map(|(x, &c)| x * c as f64).sum();
    let mut phi = vec![0.0; m];
    let mut above = n;
    let mut prev = 0.0;
    for l in 0..m {
        let s = if cu > 0.0 { u[l] / cu } else { 0.0 };
        phi[l] = (above as f64 * (s - prev)).max(0.0);
        prev = s;
        above -= cl.count[l];
    }
    let sum: f64 = phi.iter().sum();
    if sum > 0.0 {
        for x in &mut phi {
            *x /= sum;
        }
    } else {
        phi[0] = 1.0;
    }
    phi
}

/// Nodes in class l or faster.
fn members(cl: &Classes, l: usize) -> f64 {
    cl.count[l..].iter().sum::<usize>() as f64
}

/// Per-direction load (units of D) of a class-c node under the four-stage schedule.
fn four_stage_load(cl: &Classes, n: usize, phi: &[f64], c: usize) -> f64 {
    let nf = n as f64;
    let mut load = 0.0;
    for (l, &p) in phi.iter().enumerate() {
        let nl = members(cl, l);
        load += if l <= c { (2.0 * (nl - 1.0) + (nf - nl)) / nl * p } else { p };
    }
    load
}

/// Recursive AllReduce stage loads (units of D) of a class-c node: (stage 1, stage 2).
fn recursive_load(cl: &Classes, n: usize, phi: &[f64], c: usize) -> (f64, f64) {
    let nf = n as f64;
    let (mut s1, mut s2) = (0.0, 0.0);
    for (l, &p) in phi.iter().enumerate() {
        let nl = members(cl, l);
        if l <= c {
            s1 += 2.0 * (nl - 1.0) / nl * p;
            s2 += (nf - nl) / nl * p;
        } else {
            s2 += p;
        }
    }
    (s1, s2)
}

fn node_traffic(c: &Ctx<'_>, per_node: &[f64]) -> NicBytes {
    let mut tx = vec![0.0; c.n * c.f.k];
    for (i, &b) in per_node.iter().enumerate() {
        c.f.add_node_traffic(i, b, &mut tx);
    }
    NicBytes::from_f64(c.f.k, &tx, &tx)
}

fn four_stage(c: &Ctx<'_>, cl: &Classes) -> Candidate {
    let n = c.n;
    let phi = four_stage_phi(cl, n);
    let m = cl.beta.len();
    let t_bw = (0..m).map(|k| four_stage_load(cl, n, &phi, k) * c.d / cl.beta[k]).fold(0.0, f64::max);
    let mut best = (f64::INFINITY, 1u32);
    for k in CHUNK_CHOICES {
        let kf = f64::from(k);
        let t = t_bw * (1.0 + 1.0 / kf) + (2.0 * (n as f64 - 1.0) + 2.0 + kf - 1.0) * c.alpha;
        if t < best.0 {
            best = (t, k);
        }
    }
    let loads: Vec<f64> = cl.of.iter().map(|&k| four_stage_load(cl, n, &phi, k) * c.d).collect();
    Candidate {
        strategy: Strategy::FourStage,
        time_s: best.0,
        params: StrategyParams {
            chunks: Some(best.1),
            ring_fraction: Some(phi[0]),
            level_fractions: phi,
            class_mbps: cl.mbps.clone(),
            ..StrategyParams::default()
        },
        nic_bytes: node_traffic(c, &loads),
        model_total_bytes: 2.0 * (n as f64 - 1.0) * c.d,
    }
}

fn recursive(c: &Ctx<'_>, cl: &Classes) -> Candidate {
    let n = c.n;
    let m = cl.beta.len();
    let top = cl.beta[m - 1];
    let slices: Vec<f64> = (0..m).map(|l| (cl.beta[l] - if l == 0 { 0.0 } else { cl.beta[l - 1] }) / top).collect();
    let mut best: Option<(f64, u32, Vec<f64>)> = None;
    for phi in [slices, four_stage_phi(cl, n)] {
        let s1 = (0..m).map(|k| recursive_load(cl, n, &phi, k).0 / cl.beta[k]).fold(0.0, f64::max) * c.d;
        let s2 = (0..m).map(|k| recursive_load(cl, n, &phi, k).1 / cl.beta[k]).fold(0.0, f64::max) * c.d;
        for k in HELPER_CHUNKS {
            let kf = f64::from(k);
            let t = s1 + (1.0 + 1.0 / kf) * s2 + (2.0 * (n as f64 - 1.0) + kf + 1.0) * c.alpha;
            if best.as_ref().is_none_or(|b| t < b.0) {
                best = Some((t, k, phi.clone()));
            }
        }
    }
    let (t, k, phi) = best.unwrap_or((f64::INFINITY, 1, vec![1.0]));
    let loads: Vec<f64> = cl
        .of
        .iter()
        .map(|&k| {
            let (a, b) = recursive_load(cl, n, &phi, k);
            (a + b) * c.d
        })
        .collect();
    Candidate {
        strategy: Strategy::Recursive,
        time_s: t,
        params: StrategyParams {
            chunks: Some(k),
            level_fractions: phi,
            class_mbps: cl.mbps.clone(),
            reranked: true,
            ..StrategyParams::default()
        },
        nic_bytes: node_traffic(c, &loads),
        model_total_bytes: 2.0 * (n as f64 - 1.0) * c.d,
    }
}

fn r2ccl_allreduce(c: &Ctx<'_>, order: &[usize]) -> Option<Candidate> {
    let n = c.n;
    let f = c.f;
    let max = *f.node_bw.iter().max()?;
    let mut degraded = (0..n).filter(|&i| f.node_bw[i] < max);
    let d_node = degraded.next()?;
    if degraded.next().is_some() || n < 3 {
        return None;
    }
    let pos = order.iter().position(|&x| x == d_node)?;
    let helper = order[(pos + 1) % n];
    let mut e_min = f64::INFINITY;
    let mut spine_main = false;
    for p in 0..n {
        let (cap, s) = f.pair(order[p], order[(p + 1) % n]);
        e_min = e_min.min(mbps(cap));
        spine_main |= s;
    }
    let healthy: Vec<usize> = order.iter().copied().filter(|&x| x != d_node).collect();
    let h = healthy.len();
    let mut idle = f64::INFINITY;
    for p in 0..h {
        let (a, b) = (healthy[p], healthy[(p + 1) % h]);
        idle = idle.min((mbps(f.node_bw[a]) - e_min).min(mbps(f.node_bw[b]) - e_min));
    }
    if idle <= 0.0 || e_min <= 0.0 {
        return None;
    }
    let (cap3, spine3) = f.pair(d_node, helper);
    let r3 = mbps(cap3);
    if r3 <= 0.0 {
        return None;
    }
    let nf = n as f64;
    let d = c.d;
    let x = 1.0 - f.node_bw[d_node] as f64 / max as f64;
    let a = 2.0 * (nf - 1.0) / nf * d / e_min;
    let b = 2.0 * (nf - 2.0) / (nf - 1.0) * d / idle;
    let y_eq = if a + b > 0.0 { a / (a + b) } else { x };
    let hop_main = c.alpha * if spine_main { 2.0 } else { 1.0 };
    let hop3 = c.alpha * if spine3 { 2.0 } else { 1.0 };
    let mut best: Option<(f64, f64, u32)> = None;
    for y in [x, y_eq] {
        for k in HELPER_CHUNKS {
            let kf = f64::from(k);
            let t1 = 2.0 * (nf - 1.0) * (hop_main + (1.0 - y) * d / nf / e_min);
            let t2 = 2.0 * (nf - 2.0) * (c.alpha + y * d / (nf - 1.0) / idle);
            let t3 = (kf + 1.0) * (hop3 + y * d / kf / r3);
            let t = t1.max(t2) + t3;
            if best.is_none_or(|bb| t < bb.0) {
                best = Some((t, y, k));
            }
        }
    }
    let (t, y, k) = best?;
    let mut tx = vec![0.0; n * f.k];
    let mut rx = vec![0.0; n * f.k];
    let main_edge = 2.0 * (nf - 1.0) * (1.0 - y) * d / nf;
    for p in 0..n {
        f.add_pair_traffic(order[p], order[(p + 1) % n], main_edge, &mut tx, &mut rx);
    }
    let tail_edge = 2.0 * (nf - 2.0) * y * d / (nf - 1.0);
    for p in 0..h {
        f.add_pair_traffic(healthy[p], healthy[(p + 1) % h], tail_edge, &mut tx, &mut rx);
    }
    f.add_pair_traffic(d_node, helper, y * d, &mut tx, &mut rx);
    f.add_pair_traffic(helper, d_node, y * d, &mut tx, &mut rx);
    Some(Candidate {
        strategy: Strategy::R2cclAllReduce,
        time_s: t,
        params: StrategyParams {
            tail_fraction: Some(y),
            chunks: Some(k),
            degraded: Some(NodeId(d_node as u32)),
            helper: Some(NodeId(helper as u32)),
            reranked: true,
            ..StrategyParams::default()
        },
        nic_bytes: NicBytes::from_f64(f.k, &tx, &rx),
        model_total_bytes: main_edge * nf + tail_edge * h as f64 + 2.0 * y * d,
    })
}

fn recursive_doubling(c: &Ctx<'_>, order: &[usize]) -> Option<Candidate> {
    let n = c.n;
    let f = c.f;
    let p2 = 1usize << (usize::BITS - 1 - n.leading_zeros());
    let mut tx = vec![0.0; n * f.k];
    let mut rx = vec![0.0; n * f.k];
    let mut t = 0.0;
    let mut total = 0.0;
    let mut round = |pairs: &[(usize, usize)], tx: &mut Vec<f64>, rx: &mut Vec<f64>| -> Option<f64> {
        let mut rate = f64::INFINITY;
        let mut spine = false;
        for &(a, b) in pairs {
            let (cap, s) = f.pair(order[a], order[b]);
            if cap == 0 {
                return None;
            }
            rate = rate.min(mbps(cap));
            spine |= s;
            f.add_pair_traffic(order[a], order[b], c.d, tx, rx);
            total += c.d;
        }
        Some(c.alpha * if spine { 2.0 } else { 1.0 } + c.d / rate)
    };
    let extra: Vec<(usize, usize)> = (0..n - p2).map(|e| (p2 + e, e)).collect();
    if !extra.is_empty() {
        t += round(&extra, &mut tx, &mut rx)?;
    }
    let mut dist = 1;
    while dist < p2 {
        let pairs: Vec<(usize, usize)> = (0..p2).map(|p| (p, p ^ dist)).collect();
        t += round(&pairs, &mut tx, &mut rx)?;
        dist <<= 1;
    }
    if !extra.is_empty() {
        let back: Vec<(usize, usize)> = extra.iter().map(|&(a, b)| (b, a)).collect();
        t += round(&back, &mut tx, &mut rx)?;
    }
    Some(Candidate {
        strategy: Strategy::RecursiveDoubling,
        time_s: t,
        params: StrategyParams { reranked: true, ..StrategyParams::default() },
        nic_bytes: NicBytes::from_f64(f.k, &tx, &rx),
        model_total_bytes: total,
    })
}

/// Intra-node phases for G ranks per node: (time with latency, bandwidth-only time).
fn intra(topo: &Topology, coll: Collective, d: f64) -> (f64, f64) {
    let g = f64::from(topo.ranks_per_node());
    if g <= 1.0 || d == 0.0 {
        return (0.0, 0.0);
    }
    let bw = topo.intra_gbps() * 1e9 / 8.0;
    let a = topo.alpha_s();
    match coll {
        Collective::AllReduce => (2.0 * (g - 1.0) * (a + d / g / bw), 2.0 * (g - 1.0) / g * d / bw),
        Collective::Broadcast { .. } | Collective::Reduce { .. } => ((g - 1.0) * a + d / bw, d / bw),
        _ => ((g - 1.0) * (a + d / g / bw), (g - 1.0) / g * d / bw),
    }
}

fn lower_bound(f: &Fabric, coll: Collective, d: f64, g: u32) -> f64 {
    let n = f.node_count();
    if n < 2 || d == 0.0 {
        return 0.0;
    }
    let nf = n as f64;
    let sum: f64 = f.node_bw.iter().map(|&b| mbps(b)).sum();
    let min = f.node_bw.iter().map(|&b| mbps(b)).fold(f64::INFINITY, f64::min);
    match coll {
        Collective::AllReduce => (2.0 * (nf - 1.0) * d / sum).max(d / min),
        Collective::ReduceScatter | Collective::AllGather => ((nf - 1.0) * d / sum).max((nf - 1.0) / nf * d / min),
        Collective::Broadcast { .. } | Collective::Reduce { .. } => d / min,
        Collective::AllToAll => f64::from(g) * (nf - 1.0) / nf * d / min,
    }
}

fn check_root(coll: Collective, ranks: u64) -> Result<(), PlanError> {
    if let Collective::Broadcast { root } | Collective::Reduce { root } = coll {
        if u64::from(root.0) >= ranks {
            return Err(PlanError::RootOutOfRange { root, ranks });
        }
    }
    Ok(())
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
    if o.iter().any(|&i| i >= f.node_count()) {
        let bad = o.iter().copied().find(|&i| i >= f.node_count()).unwrap_or(0);
        return Err(PlanError::NodeDisconnected(NodeId(bad as u32)));
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
/// Deterministic: equal inputs give bit-identical plans. A zero-byte collective moves
/// nothing: every applicable strategy predicts 0 s and the plain algorithm (ring, or
/// balance under failures) is chosen.
pub fn plan(topology: &Topology, health: &HealthView, collective: Collective, bytes: u64) -> Result<Plan, PlanError> {
    check_root(collective, topology.rank_count())?;
    let f = Fabric::new(topology, health)?;
    let n = f.node_count();
    let k = f.k;
    let g = topology.ranks_per_node();
    let d = bytes as f64;
    let identity: Vec<usize> = (0..n).collect();
    let order = rerank_fabric(&f);
    let score = rerank::score(&f, &order);
    if n >= 2 && score.bottleneck_mbps == 0 {
        let p = (0..n).find(|&p| f.pair(order[p], order[(p + 1) % n]).0 == 0).unwrap_or(0);
        return Err(PlanError::NoPath { a: NodeId(order[p] as u32), b: NodeId(order[(p + 1) % n] as u32) });
    }
    let ctx = Ctx { f: &f, n, d, alpha: topology.alpha_s() };
    let (t_intra, bw_intra) = intra(topology, collective, d);

    let mut cands: Vec<Candidate> = Vec::new();
    // A single node uses no inter-node NIC, so its plain algorithm applies under any failure.
    if !f.has_failure() || n == 1 {
        cands.extend(evaluate_basic(
            &ctx,
            collective,
            Split::Equal,
            &identity,
            g,
            StrategyParams::default(),
            Strategy::Ring,
        ));
    }
    if n >= 2 && f.is_degraded() {
        let p = StrategyParams { reranked: true, ..StrategyParams::default() };
        cands.extend(evaluate_basic(&ctx, collective, Split::Balance, &order, g, p, Strategy::Balance));
    }
    if n >= 2 && f.has_failure() {
        cands.extend(evaluate_basic(
            &ctx,
            collective,
            Split::Backup,
            &identity,
            g,
            StrategyParams::default(),
            Strategy::SingleBackup,
        ));
    }
    if collective == Collective::AllReduce && n >= 3 {
        let cl = classes(&f);
        cands.extend(r2ccl_allreduce(&ctx, &order));
        if cl.beta.len() >= 2 {
            cands.push(recursive(&ctx, &cl));
            cands.push(four_stage(&ctx, &cl));
        }
    }
    if collective == Collective::AllReduce && n >= 2 {
        cands.extend(recursive_doubling(&ctx, &order));
    }
    for c in &mut cands {
        if bytes == 0 {
            c.time_s = 0.0;
            c.nic_bytes = NicBytes { rails: k, tx: vec![0; n * k], rx: vec![0; n * k] };
            c.model_total_bytes = 0.0;
        } else {
            c.time_s += t_intra;
        }
    }
    cands.sort_by_key(|c| c.strategy);
    let chosen = cands
        .iter()
        .fold(None::<&Candidate>, |b, c| match b {
            Some(b) if b.time_s <= c.time_s => Some(b),
            _ => Some(c),
        })
        .map(|c| (c.strategy, c.time_s));
    let (chosen, time_s) = chosen.unwrap_or((Strategy::Balance, f64::INFINITY));

    let nominal = f.nominal();
    let nctx = Ctx { f: &nominal, n, d, alpha: topology.alpha_s() };
    let t_nf = if bytes == 0 {
        0.0
    } else {
        evaluate_basic(&nctx, collective, Split::Equal, &identity, g, StrategyParams::default(), Strategy::Ring)
            .map_or(0.0, |c| c.time_s)
            + t_intra
    };
    let lb = if bytes == 0 { 0.0 } else { lower_bound(&f, collective, d, g) + bw_intra };
    let nic_weights = (0..n * k).map(|x| f.bw[x] as f64 / f.node_bw[x / k] as f64).collect();
    Ok(Plan {
        collective,
        bytes,
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
