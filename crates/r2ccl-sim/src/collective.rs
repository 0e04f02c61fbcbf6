//! AllReduce schedules as flow DAGs, one builder per strategy under test.
//!
//! The builders work at node level on a rail-optimized fabric: an optional intra-node phase (direct
//! reduce-scatter to channel holders and all-gather back over NVLink), then per-channel rings between nodes
//! (channel c lives on one rail and one holder GPU per node). Schedules for degraded clusters follow
//! MECHANISMS.md sections 5-7: Balance spreads transfers of degraded nodes over their surviving rails,
//! R2CCL-AllReduce splits off a tail handled by the healthy nodes, the four-stage schedule excludes the
//! stragglers from a fraction of the buffer (scatter-in, reduce-scatter, all-gather, gather-back), and
//! recursive AllReduce water-fills fractions over bandwidth classes with reduce-to-helper and broadcast-back.

use crate::convert::Choice;
use crate::engine::{Dag, Op, RailMask, RepairMode, TaskId, ALL_RAILS};
use crate::fabric::{Endpoint, Fabric};
use r2ccl_policy::CandidateKind;
use serde::{Deserialize, Serialize};

/// Usable fraction of every NIC as the planner knows it: `health[node][rail]` in [0, 1].
pub type PlanHealth = Vec<Vec<f64>>;

/// A fully healthy plan view.
pub fn healthy(fabric: &Fabric) -> PlanHealth {
    let s = fabric.spec();
    vec![vec![1.0; s.nics_per_node as usize]; s.nodes as usize]
}

/// Fraction of a node's inter-node bandwidth that is usable.
pub fn node_fraction(h: &[f64]) -> f64 {
    if h.is_empty() {
        return 0.0;
    }
    h.iter().sum::<f64>() / h.len() as f64
}

/// How a simulated job handles failures: one of the paper's strategies as a formula schedule, a
/// baseline (fail-stop, hot repair, AdapCC-like), or an exact r2ccl-algo schedule (the planner's
/// choice, algo Balance, algo single backup). Not `r2ccl_policy::CandidateKind` (the planner's
/// candidates, which [`Scheme::Planner`] runs) nor `r2ccl_algo::Strategy` (a schedule request's
/// failure handling).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scheme {
    /// Fail-stop CCL: rings on fixed rails, no repair (a failure hangs the collective).
    #[serde(rename = "no_resilience")]
    NoResilience,
    /// Hot repair only: fixed rings, a failed NIC's traffic moves to one backup NIC.
    #[serde(rename = "hot_repair")]
    HotRepair,
    /// R2CCL-Balance: degraded nodes spread traffic over surviving NICs by bandwidth.
    #[serde(rename = "balance")]
    Balance,
    /// R2CCL-AllReduce (main part over all nodes, tail over healthy nodes, fold-in of the degraded node).
    #[serde(rename = "r2ccl_allreduce")]
    R2cclAllReduce,
    /// Recursive AllReduce over bandwidth classes (water-filling, helpers).
    #[serde(rename = "recursive")]
    Recursive,
    /// Four-stage pipelined schedule that reaches the lower bound in the bandwidth limit.
    #[serde(rename = "four_stage")]
    FourStage,
    /// AdapCC-like baseline: re-plans only between collectives (see docs/reproduction.md for its model).
    #[serde(rename = "adapcc")]
    AdapCc,
    /// The exact r2ccl-algo schedule that r2ccl-policy chooses for the case (see [`crate::convert`]).
    #[serde(rename = "planner")]
    Planner,
    /// r2ccl-algo's Balance schedule (hierarchical ring, bandwidth-weighted NIC splits) as planned.
    #[serde(rename = "algo_balance")]
    AlgoBalance,
    /// r2ccl-algo's single-backup (hot repair) schedule as planned.
    #[serde(rename = "algo_single_backup")]
    AlgoSingleBackup,
    /// r2ccl-algo's R2CCL-AllReduce schedule with the planner's tail fraction and chunks.
    #[serde(rename = "algo_r2ccl_allreduce")]
    AlgoR2cclAllReduce,
    /// r2ccl-algo's recursive AllReduce schedule with the planner's chunks.
    #[serde(rename = "algo_recursive")]
    AlgoRecursive,
    /// r2ccl-algo's four-stage schedule with the planner's chunks.
    #[serde(rename = "algo_four_stage")]
    AlgoFourStage,
}

impl Scheme {
    /// Every strategy, in table order.
    pub const ALL: [Scheme; 7] = [
        Scheme::NoResilience,
        Scheme::HotRepair,
        Scheme::Balance,
        Scheme::R2cclAllReduce,
        Scheme::Recursive,
        Scheme::FourStage,
        Scheme::AdapCc,
    ];

    /// Short name used in tables and scenario files.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::NoResilience => "no_resilience",
            Scheme::HotRepair => "hot_repair",
            Scheme::Balance => "balance",
            Scheme::R2cclAllReduce => "r2ccl_allreduce",
            Scheme::Recursive => "recursive",
            Scheme::FourStage => "four_stage",
            Scheme::AdapCc => "adapcc",
            Scheme::Planner => "planner",
            Scheme::AlgoBalance => "algo_balance",
            Scheme::AlgoSingleBackup => "algo_single_backup",
            Scheme::AlgoR2cclAllReduce => "algo_r2ccl_allreduce",
            Scheme::AlgoRecursive => "algo_recursive",
            Scheme::AlgoFourStage => "algo_four_stage",
        }
    }

    /// The strategies that run r2ccl-algo schedules converted by [`crate::convert`], in table order.
    pub const SCHEDULED: [Scheme; 6] = [
        Scheme::Planner,
        Scheme::AlgoBalance,
        Scheme::AlgoSingleBackup,
        Scheme::AlgoR2cclAllReduce,
        Scheme::AlgoRecursive,
        Scheme::AlgoFourStage,
    ];

    /// For strategies that run r2ccl-algo schedules: which one (`None`: built here from formulas).
    pub fn schedule_choice(self) -> Option<Choice> {
        Some(match self {
            Scheme::Planner => Choice::Planner,
            Scheme::AlgoBalance => Choice::Candidate(CandidateKind::Balance),
            Scheme::AlgoSingleBackup => Choice::Candidate(CandidateKind::SingleBackup),
            Scheme::AlgoR2cclAllReduce => Choice::Candidate(CandidateKind::R2cclAllReduce),
            Scheme::AlgoRecursive => Choice::Candidate(CandidateKind::Recursive),
            Scheme::AlgoFourStage => Choice::Candidate(CandidateKind::FourStage),
            _ => return None,
        })
    }

    /// How the engine moves transfers on failed NICs for this strategy (in flight and at start).
    pub fn repair_mode(self) -> RepairMode {
        match self {
            Scheme::NoResilience => RepairMode::None,
            Scheme::HotRepair | Scheme::AdapCc | Scheme::AlgoSingleBackup => RepairMode::SingleBackup,
            _ => RepairMode::Spread,
        }
    }
}

/// What to reduce and where.
#[derive(Clone, Debug, PartialEq)]
pub struct AllReduceJob {
    /// Participating nodes in ring order.
    pub nodes: Vec<u32>,
    /// Bytes each node contributes across nodes (hierarchical: the per-GPU buffer; per-rail groups: G times it).
    pub bytes: f64,
    /// Run the intra-node reduce-scatter / all-gather over NVLink around the inter-node part.
    pub intra: bool,
    /// Pipeline chunks of the R2CCL-AllReduce fold-in and of four-stage / recursive helper parts.
    pub chunks: u32,
}

#[derive(Clone, Copy, Debug)]
struct Channel {
    gpu: u32,
    rail: u32,
    share: f64,
}

fn std_channels(fabric: &Fabric) -> Vec<Channel> {
    let s = fabric.spec();
    let ch = s.gpus_per_node.max(s.nics_per_node);
    (0..ch)
        .map(|c| Channel { gpu: c * s.gpus_per_node / ch, rail: c * s.nics_per_node / ch, share: 1.0 / f64::from(ch) })
        .collect()
}

/// Channels on a subset of rails with explicit weights (the holder is the GPU next to the rail).
fn rail_channels(fabric: &Fabric, rails: &[(u32, f64)]) -> Vec<Channel> {
    let total: f64 = rails.iter().map(|r| r.1).sum();
    rails.iter().map(|&(rail, w)| Channel { gpu: fabric.gpu_of_rail(rail), rail, share: w / total }).collect()
}

fn bit(rail: u32) -> RailMask {
    1u64 << rail.min(63)
}

/// Knobs of the recursive AllReduce formula builder ([`build_recursive`]), for the experiments of
/// docs/reproduction.md ("Recursive AllReduce at one failure"). [`RecursiveVariant::default`] is the schedule
/// that every table runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecursiveVariant {
    /// Build only this level (0: the ring over all nodes, 1: the first helper level, ...); `None`: all levels.
    pub only_level: Option<usize>,
    /// Start the helper levels when level 0 has finished instead of at the same time.
    pub sequential: bool,
    /// Member rings of a helper level in flight at once: at each member, chunk c's ring follows chunk
    /// c - `ring_window`'s (1, the default: one chunk's ring at a time).
    pub ring_window: usize,
    /// A helper starts its ring of chunk c only after the outsiders' fold-in of chunk c has arrived (the
    /// default). `false` only measures what that wait costs: the reduced result would be wrong.
    pub fold_in_wait: bool,
}

impl Default for RecursiveVariant {
    fn default() -> Self {
        Self { only_level: None, sequential: false, ring_window: 1, fold_in_wait: true }
    }
}

struct Builder<'a> {
    fabric: &'a Fabric,
    health: &'a PlanHealth,
    dag: &'a mut Dag,
    /// Knobs of the helper levels (non-scatter [`Builder::subset_with_helpers`]).
    variant: RecursiveVariant,
}

/// Per-member state of a ring: last send and last receive of each member.
struct Ring {
    members: Vec<u32>,
    last_send: Vec<Option<TaskId>>,
    last_recv: Vec<Option<TaskId>>,
}

impl Ring {
    fn new(members: &[u32], ready: &[Option<TaskId>]) -> Self {
        Self { members: members.to_vec(), last_send: vec![None; members.len()], last_recv: ready.to_vec() }
    }
}

impl Builder<'_> {
    fn degraded(&self, node: u32) -> bool {
        self.health[node as usize].iter().any(|&f| f < 1.0)
    }

    /// Rails for a transfer between two nodes on channel rail `rail` under Balance semantics.
    fn balance_mask(&self, a: u32, b: u32, rail: u32) -> RailMask {
        if self.degraded(a) || self.degraded(b) {
            ALL_RAILS
        } else {
            bit(rail)
        }
    }

    /// A transfer; `slots` = how many transfers of its kind follow one another on its links (weight).
    fn xfer(
        &mut self,
        src: Endpoint,
        dst: Endpoint,
        bytes: f64,
        slots: f64,
        rails: RailMask,
        deps: &[Option<TaskId>],
    ) -> TaskId {
        let d: Vec<TaskId> = deps.iter().flatten().copied().collect();
        self.dag.add(Op::Transfer { src, dst, bytes, rails, weight: bytes * slots }, &d)
    }

    /// `steps` ring steps of `bytes` each on channel `ch`.
    fn ring_steps(&mut self, ring: &mut Ring, ch: Channel, steps: usize, bytes: f64, slots: f64, balance: bool) {
        let m = ring.members.len();
        if m < 2 {
            return;
        }
        let mut new_recv = vec![None; m];
        for _ in 0..steps {
            for i in 0..m {
                let (a, b) = (ring.members[i], ring.members[(i + 1) % m]);
                let mask = if balance { self.balance_mask(a, b, ch.rail) } else { bit(ch.rail) };
                let t = self.xfer(
                    Endpoint::new(a, ch.gpu),
                    Endpoint::new(b, ch.gpu),
                    bytes,
                    slots,
                    mask,
                    &[ring.last_send[i], ring.last_recv[i]],
                );
                ring.last_send[i] = Some(t);
                new_recv[(i + 1) % m] = Some(t);
            }
            ring.last_recv.clone_from(&new_recv);
        }
    }

    /// Ring AllReduce of `bytes` on `members` for one channel; returns each member's completion.
    fn ring_allreduce(
        &mut self,
        members: &[u32],
        ch: Channel,
        bytes: f64,
        ready: &[Option<TaskId>],
        balance: bool,
    ) -> Vec<Option<TaskId>> {
        let m = members.len();
        let mut ring = Ring::new(members, ready);
        if m >= 2 {
            let steps = 2 * (m - 1);
            self.ring_steps(&mut ring, ch, steps, bytes / m as f64, steps as f64, balance);
        }
        ring.last_recv
    }

    /// Intra-node reduce-scatter to holders (returns per node per channel readiness).
    fn intra_rs(
        &mut self,
        nodes: &[u32],
        chans: &[Channel],
        bytes: f64,
        start: Option<TaskId>,
    ) -> Vec<Vec<Option<TaskId>>> {
        let g = self.fabric.spec().gpus_per_node;
        nodes
            .iter()
            .map(|&n| {
                chans
                    .iter()
                    .map(|c| {
                        if g == 1 {
                            return start;
                        }
                        let parts: Vec<TaskId> = (0..g)
                            .filter(|&x| x != c.gpu)
                            .map(|x| {
                                self.xfer(
                                    Endpoint::new(n, x),
                                    Endpoint::new(n, c.gpu),
                                    bytes * c.share,
                                    1.0,
                                    0,
                                    &[start],
                                )
                            })
                            .collect();
                        Some(self.dag.barrier(&parts))
                    })
                    .collect()
            })
            .collect()
    }

    /// Intra-node all-gather from holders after `done[node][chan]`; returns the end barrier.
    fn intra_ag(&mut self, nodes: &[u32], chans: &[Channel], bytes: f64, done: &[Vec<Option<TaskId>>]) -> TaskId {
        let g = self.fabric.spec().gpus_per_node;
        let mut ends = Vec::new();
        for (i, &n) in nodes.iter().enumerate() {
            for (c, ch) in chans.iter().enumerate() {
                if g == 1 {
                    ends.extend(done[i][c]);
                    continue;
                }
                for x in (0..g).filter(|&x| x != ch.gpu) {
                    let t = self.xfer(
                        Endpoint::new(n, ch.gpu),
                        Endpoint::new(n, x),
                        bytes * ch.share,
                        1.0,
                        0,
                        &[done[i][c]],
                    );
                    ends.push(t);
                }
            }
        }
        self.dag.barrier(&ends)
    }

    /// Ring AllReduce of `bytes` over `nodes` on `chans` with the intra phases; returns the end barrier.
    fn hierarchical(
        &mut self,
        job: &AllReduceJob,
        chans: &[Channel],
        bytes: f64,
        start: Option<TaskId>,
        balance: bool,
    ) -> TaskId {
        let nodes = &job.nodes;
        let ready = if job.intra {
            self.intra_rs(nodes, chans, bytes, start)
        } else {
            vec![vec![start; chans.len()]; nodes.len()]
        };
        let mut done = vec![vec![None; chans.len()]; nodes.len()];
        for (c, ch) in chans.iter().enumerate() {
            let r: Vec<Option<TaskId>> = ready.iter().map(|v| v[c]).collect();
            let out = self.ring_allreduce(nodes, *ch, bytes * ch.share, &r, balance);
            for (i, o) in out.into_iter().enumerate() {
                done[i][c] = o;
            }
        }
        if job.intra {
            self.intra_ag(nodes, chans, bytes, &done)
        } else {
            let all: Vec<TaskId> = done.iter().flatten().flatten().copied().collect();
            let mut deps = all;
            deps.extend(start);
            self.dag.barrier(&deps)
        }
    }

    /// Subset AllReduce of `bytes` among `members` with `outsiders` joining through helpers, in `chunks`.
    /// `scatter`: each outsider spreads its contribution over all members (four-stage scatter-in/gather-back);
    /// `reduce_scatter`: members still have to reduce among themselves (false: they already hold their sum);
    /// otherwise each outsider uses one helper per chunk (rotating over the members, so helper load spreads)
    /// for reduce-to-helper and broadcast-back.
    #[allow(clippy::too_many_arguments, reason = "internal builder with one call site per strategy")]
    fn subset_with_helpers(
        &mut self,
        members: &[u32],
        outsiders: &[u32],
        bytes: f64,
        chunks: u32,
        scatter: bool,
        reduce_scatter: bool,
        start: Option<TaskId>,
        ends: &mut Vec<TaskId>,
    ) {
        let m = members.len();
        if m == 0 || bytes <= 0.0 {
            return;
        }
        let chans = std_channels(self.fabric);
        let k = chunks.max(1);
        for ch in &chans {
            let cb = bytes * ch.share / f64::from(k);
            let mut prev_in: Vec<Vec<Option<TaskId>>> = vec![vec![start; m]; outsiders.len()];
            let mut prev_out: Vec<Vec<Option<TaskId>>> = vec![vec![None; m]; outsiders.len()];
            let window = if scatter { 1 } else { self.variant.ring_window.max(1) };
            let mut rings: Vec<Ring> = (0..window).map(|_| Ring::new(members, &vec![start; m])).collect();
            for kk in 0..k {
                let ring = &mut rings[kk as usize % window];
                // Inputs of the outsiders.
                let mut ins_at: Vec<Vec<TaskId>> = vec![Vec::new(); m];
                for (qi, &q) in outsiders.iter().enumerate() {
                    let targets: Vec<usize> = if scatter { (0..m).collect() } else { vec![(qi + kk as usize) % m] };
                    let part = cb / targets.len() as f64;
                    for &j in &targets {
                        let t = self.xfer(
                            Endpoint::new(q, ch.gpu),
                            Endpoint::new(members[j], ch.gpu),
                            part,
                            f64::from(k),
                            bit(ch.rail),
                            &[prev_in[qi][j]],
                        );
                        prev_in[qi][j] = Some(t);
                        ins_at[j].push(t);
                    }
                }
                if scatter {
                    // Reduce-scatter among members; a member's shard is final after its RS and its inputs.
                    let slots = f64::from(k) * (m as f64 - 1.0) * if reduce_scatter { 2.0 } else { 1.0 };
                    if m >= 2 && reduce_scatter {
                        self.ring_steps(ring, *ch, m - 1, cb / m as f64, slots, true);
                    }
                    let mut reduced = Vec::with_capacity(m);
                    for (j, ins) in ins_at.iter().enumerate() {
                        let mut deps: Vec<TaskId> = ins.clone();
                        deps.extend(ring.last_recv[j]);
                        deps.extend(start);
                        reduced.push(self.dag.barrier(&deps));
                    }
                    for (j, &r) in reduced.iter().enumerate() {
                        ring.last_recv[j] = Some(r);
                    }
                    if m >= 2 {
                        self.ring_steps(ring, *ch, m - 1, cb / m as f64, slots, true);
                    }
                    for (qi, &q) in outsiders.iter().enumerate() {
                        for j in 0..m {
                            let t = self.xfer(
                                Endpoint::new(members[j], ch.gpu),
                                Endpoint::new(q, ch.gpu),
                                cb / m as f64,
                                f64::from(k),
                                bit(ch.rail),
                                &[Some(reduced[j]), prev_out[qi][j]],
                            );
                            prev_out[qi][j] = Some(t);
                            ends.push(t);
                        }
                    }
                } else {
                    for (j, ins) in ins_at.iter().enumerate() {
                        if !ins.is_empty() && self.variant.fold_in_wait {
                            let mut deps = ins.clone();
                            deps.extend(ring.last_recv[j]);
                            ring.last_recv[j] = Some(self.dag.barrier(&deps));
                        }
                    }
                    if m >= 2 {
                        let slots = f64::from(k) * 2.0 * (m as f64 - 1.0);
                        self.ring_steps(ring, *ch, 2 * (m - 1), cb / m as f64, slots, true);
                    }
                    for (qi, &q) in outsiders.iter().enumerate() {
                        let j = (qi + kk as usize) % m;
                        let t = self.xfer(
                            Endpoint::new(members[j], ch.gpu),
                            Endpoint::new(q, ch.gpu),
                            cb,
                            f64::from(k),
                            bit(ch.rail),
                            &[ring.last_recv[j], prev_out[qi][j]],
                        );
                        prev_out[qi][j] = Some(t);
                        ends.push(t);
                    }
                }
            }
            for ring in &rings {
                ends.extend(ring.last_recv.iter().flatten());
            }
        }
    }
}

/// Fraction f of the buffer that runs the full ring in the four-stage schedule (MECHANISMS.md section 7,
/// generalized to `s` stragglers of relative bandwidth `beta` among `p` nodes).
pub fn four_stage_fraction(p: usize, s: usize, beta: f64) -> f64 {
    let h = p - s;
    if s == 0 || h < 2 {
        return 1.0;
    }
    let a = 2.0 * (p as f64 - 1.0) / p as f64;
    let c = 2.0 * (h as f64 - 1.0) / h as f64 + s as f64 / h as f64;
    let den = (a - c) - (a - 1.0) / beta;
    if den.abs() < 1e-12 {
        return 0.0;
    }
    ((1.0 / beta - c) / den).clamp(0.0, 1.0)
}

/// Water-filling levels of recursive AllReduce: (members of the level, fraction of the buffer).
pub fn recursive_levels(nodes: &[u32], frac: &[f64]) -> Vec<(Vec<u32>, f64)> {
    let n = nodes.len();
    let mut classes: Vec<f64> = Vec::new();
    let mut sorted: Vec<f64> = nodes.iter().map(|&x| frac[x as usize]).collect();
    sorted.sort_by(f64::total_cmp);
    for b in sorted {
        if classes.last().is_none_or(|&l| b > l + 1e-9) {
            classes.push(b);
        }
    }
    // Levels with at most two members gain nothing over helpers: drop them.
    let members_of = |b: f64| -> Vec<u32> { nodes.iter().copied().filter(|&x| frac[x as usize] >= b - 1e-9).collect() };
    let mut levels: Vec<(Vec<u32>, f64)> = Vec::new();
    for (i, &b) in classes.iter().enumerate() {
        let mem = members_of(b);
        if i > 0 && mem.len() <= 2 {
            break;
        }
        levels.push((mem, b));
    }
    if levels.len() <= 1 || classes[0] <= 0.0 {
        return vec![(nodes.to_vec(), 1.0)];
    }
    let c0 = 2.0 * (n as f64 - 1.0) / n as f64;
    // Per-direction load of a member of a level with m members, relative to the level's fraction: its ring
    // share 2(m-1)/m plus its share of the outsiders' helper traffic (n-m)/m (helpers rotate per chunk).
    let coef = |m: usize| (m as f64 + n as f64 - 2.0) / m as f64 - 1.0;
    let mut sigma = 0.0;
    for w in 1..levels.len() {
        sigma += (levels[w].1 - levels[w - 1].1) / coef(levels[w].0.len());
    }
    let b0 = levels[0].1;
    let tau = c0 / (b0 + (c0 - 1.0) * sigma);
    let mut f: Vec<f64> = (0..levels.len())
        .map(|w| if w == 0 { 0.0 } else { (levels[w].1 - levels[w - 1].1) * tau / coef(levels[w].0.len()) })
        .collect();
    let rest: f64 = f.iter().sum();
    if rest <= 1.0 {
        f[0] = 1.0 - rest;
    } else {
        f.iter_mut().for_each(|x| *x /= rest);
    }
    levels.into_iter().zip(f).map(|((m, _), f)| (m, f)).filter(|(_, f)| *f > 1e-12).collect()
}

/// Append the AllReduce `job` under `strategy` to `dag`, after `start`; returns the end task.
pub fn build_allreduce(
    dag: &mut Dag,
    fabric: &Fabric,
    health: &PlanHealth,
    strategy: Scheme,
    job: &AllReduceJob,
    start: Option<TaskId>,
) -> TaskId {
    let mut b = Builder { fabric, health, dag, variant: RecursiveVariant::default() };
    let chans = std_channels(fabric);
    let frac: Vec<f64> = health.iter().map(|h| node_fraction(h)).collect();
    let degraded: Vec<u32> = job.nodes.iter().copied().filter(|&x| b.degraded(x)).collect();
    let healthy_nodes: Vec<u32> = job.nodes.iter().copied().filter(|&x| !b.degraded(x)).collect();
    let n = job.nodes.len();
    match strategy {
        Scheme::NoResilience | Scheme::HotRepair | Scheme::AdapCc => {
            b.hierarchical(job, &chans, job.bytes, start, false)
        }
        // The scheduled strategies come from r2ccl-algo (`crate::convert::append_allreduce`); asked here, they
        // get the closest formula schedule.
        Scheme::Balance | Scheme::Planner | Scheme::AlgoBalance | Scheme::AlgoSingleBackup => {
            b.hierarchical(job, &chans, job.bytes, start, true)
        }
        Scheme::AlgoR2cclAllReduce => build_allreduce(dag, fabric, health, Scheme::R2cclAllReduce, job, start),
        Scheme::AlgoRecursive => build_allreduce(dag, fabric, health, Scheme::Recursive, job, start),
        Scheme::AlgoFourStage => build_allreduce(dag, fabric, health, Scheme::FourStage, job, start),
        Scheme::R2cclAllReduce => {
            if degraded.len() != 1 || n < 3 {
                return b.hierarchical(job, &chans, job.bytes, start, true);
            }
            let d = degraded[0];
            let hd = &health[d as usize];
            let x = 1.0 - node_fraction(hd);
            let y = x;
            let main_rails: Vec<(u32, f64)> =
                hd.iter().enumerate().filter(|(_, &f)| f > 0.0).map(|(r, &f)| (r as u32, f)).collect();
            let tail_rails: Vec<(u32, f64)> =
                hd.iter().enumerate().filter(|(_, &f)| f < 1.0).map(|(r, &f)| (r as u32, 1.0 - f)).collect();
            let main = rail_channels(fabric, &main_rails);
            let tail = rail_channels(fabric, &tail_rails);
            // Stage 1a: main part over all nodes (with the intra phases around everything).
            let main_end = b.hierarchical(job, &main, job.bytes * (1.0 - y), start, false);
            // Stage 1b: tail among healthy nodes on the rails the failure left idle.
            let mut t1 = Vec::new();
            for ch in &tail {
                let out = b.ring_allreduce(
                    &healthy_nodes,
                    *ch,
                    job.bytes * y * ch.share,
                    &vec![start; healthy_nodes.len()],
                    false,
                );
                t1.extend(out.into_iter().flatten());
            }
            t1.push(main_end);
            let stage1 = b.dag.barrier(&t1);
            // Stage 2: fold the degraded node's tail in (scatter to the healthy nodes), all-gather among
            // them and send the result back, pipelined in K chunks.
            let mut ends = vec![stage1];
            b.subset_with_helpers(
                &healthy_nodes,
                &[d],
                job.bytes * y,
                job.chunks,
                true,
                false,
                Some(stage1),
                &mut ends,
            );
            b.dag.barrier(&ends)
        }
        Scheme::FourStage => {
            if degraded.is_empty() || healthy_nodes.len() < 2 {
                return b.hierarchical(job, &chans, job.bytes, start, true);
            }
            let beta = degraded.iter().map(|&x| frac[x as usize]).fold(1.0, f64::min);
            let f = four_stage_fraction(n, degraded.len(), beta);
            let mut ends = Vec::new();
            if f > 0.0 {
                ends.push(b.hierarchical(job, &chans, job.bytes * f, start, true));
            }
            b.subset_with_helpers(
                &healthy_nodes,
                &degraded,
                job.bytes * (1.0 - f),
                job.chunks,
                true,
                true,
                start,
                &mut ends,
            );
            ends.extend(start);
            b.dag.barrier(&ends)
        }
        Scheme::Recursive => build_recursive(dag, fabric, health, job, start, RecursiveVariant::default()),
    }
}

/// Append the recursive AllReduce of `job` (water-filled levels, [`recursive_levels`]) built with `variant`'s
/// knobs to `dag`, after `start`; returns the end task. The default variant is [`Scheme::Recursive`].
pub fn build_recursive(
    dag: &mut Dag,
    fabric: &Fabric,
    health: &PlanHealth,
    job: &AllReduceJob,
    start: Option<TaskId>,
    variant: RecursiveVariant,
) -> TaskId {
    let mut b = Builder { fabric, health, dag, variant };
    let chans = std_channels(fabric);
    let frac: Vec<f64> = health.iter().map(|h| node_fraction(h)).collect();
    let levels = recursive_levels(&job.nodes, &frac);
    let mut ends = Vec::new();
    let mut level_start = start;
    for (i, (members, f)) in levels.iter().enumerate() {
        if variant.only_level.is_some_and(|l| l != i) {
            continue;
        }
        if i == 0 && members.len() == job.nodes.len() {
            let end = b.hierarchical(job, &chans, job.bytes * f, start, true);
            if variant.sequential {
                level_start = Some(end);
            }
            ends.push(end);
        } else {
            let outs: Vec<u32> = job.nodes.iter().copied().filter(|x| !members.contains(x)).collect();
            b.subset_with_helpers(members, &outs, job.bytes * f, job.chunks, false, true, level_start, &mut ends);
        }
    }
    ends.extend(start);
    b.dag.barrier(&ends)
}
