//! Runs the exact schedules of r2ccl-algo, as r2ccl-policy plans them, on the simulated fabric.
//!
//! [`append_schedules`] turns every rank's [`RankSchedule`] into tasks of a flow [`Dag`]: each matched
//! Send/Recv pair (same sender, receiver and tag) becomes one transfer per [`r2ccl_algo::RailPart`] of its
//! split (bytes from [`r2ccl_algo::RailSplit::divide`]) from the sending node's NIC `src` rail to the
//! receiving node's NIC `dst` rail ([`Op::Pinned`]; different rails cross the spine), or one NVLink transfer
//! for an intra-node message. A send starts when its step's dependencies are done and completes when all its
//! parts have arrived; a receive completes when the message has arrived and its own dependencies are done;
//! local copies and reductions take no time (the simulator models no GPU compute inside a collective).
//! Every connection (sender, receiver, source rail, destination rail) is one queue of the DAG
//! ([`Dag::add_queued`]): its parts go one after another in the order they become ready, as the library's
//! engine posts steps in dependency order and a queue pair serves its work requests in posting order.
//! Connections that share a link get equal shares of it (max-min weight 1 each), as a NIC arbitrates
//! round-robin between its queue pairs.
//! Schedules are built and converted one rank at a time, so memory beyond the DAG itself stays per rank.
//!
//! [`plan_allreduce`] and [`append_allreduce`] put the planner in front: a [`Topology`] and [`HealthView`]
//! derived from the simulated fabric and the failures known at the start, [`r2ccl_policy::plan_payload`],
//! then the chosen (or an explicitly requested) candidate's [`ScheduleRequest`] built on
//! [`r2ccl_policy::schedule_fabric`].

use crate::collective::{AllReduceJob, PlanHealth};
use crate::engine::{Dag, Op, OpId, TaskId};
use crate::error::SimError;
use crate::fabric::{Endpoint, Fabric};
use r2ccl_algo::{AlgoError, Layout, RankSchedule, ScheduleRequest, StepKind};
use r2ccl_core::{DType, HealthEpoch, HealthView, NicHealth, NodeHealth, Rank, ReduceOp};
use r2ccl_policy::{CandidateKind, Collective, NodeSpec, Plan, Topology};
use std::collections::hash_map::Entry;
use std::collections::VecDeque;

/// A map with integer keys (the converter looks up ranks, tags and rails millions of times).
type FxMap<K, V> = r2ccl_core::fastmap::IntMap<K, V>;

/// What a conversion produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Converted {
    /// Task that finishes when every rank's last step has finished.
    pub end: TaskId,
    /// Per rank (rank order): the task that finishes when that rank's last step has finished.
    pub rank_end: Vec<TaskId>,
    /// Transfer tasks created (one per NIC part, one per intra-node message).
    pub transfers: usize,
    /// Steps converted, all ranks together.
    pub steps: usize,
    /// Bytes sent by each NIC, `[algo node * nics + rail]` (algo node `i` is simulated node `nodes[i]`).
    pub nic_tx: Vec<u64>,
    /// Bytes received by each NIC, same indexing.
    pub nic_rx: Vec<u64>,
    /// Bytes moved inside each node (NVLink messages between ranks), by algo node.
    pub intra_bytes: Vec<u64>,
}

impl Converted {
    /// Bytes moved inside algo node `node` (0 for an unknown node).
    pub fn intra_bytes_of(&self, node: usize) -> u64 {
        self.intra_bytes.get(node).copied().unwrap_or(0)
    }
}

/// A message whose other side has not been converted yet.
#[derive(Clone, Copy, Debug)]
enum Half {
    /// The sender's parts are done at this task.
    Sent(TaskId),
    /// The receiver's task waits for the message.
    Posted(TaskId),
}

/// Merged rail parts: an approximation of the conversion that makes one flow of a message instead of one per
/// NIC part, for messages between nodes that no failure touches.
///
/// A message whose split has several parts, each from a NIC to the same rail of the receiving node, becomes one
/// [`Op::Pinned`] transfer: its largest part (the first of equal ones), on that part's rail and connection. In the
/// exact conversion each part is its own flow on its own rail, usually alone there, and the message is done when
/// the last part is; the largest part stands for them. What the merged message leaves out: the load of the other
/// parts on their rails (every message of such a schedule puts one part on each rail, so the rail kept carries
/// the load one rail carries in the exact run, and the other rails carry only the messages that stay exact), and
/// the PXN hops of the parts left out on the NVLink links of both nodes. Messages from or to a node in
/// [`MergeRails::exact_nodes`] (the nodes with a failure, known or in flight) keep every part. Byte accounting
/// ([`Converted::nic_tx`], [`Converted::nic_rx`]) still counts every part of the schedule; the DAG moves fewer
/// bytes. Its error against the exact conversion is measured, not bounded: `cargo run --release -p r2ccl-sim
/// --example cost_1024 merged` prints it for the 1024-GPU case.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergeRails {
    /// Per simulated node: whether its messages keep every part.
    pub exact_nodes: Vec<bool>,
}

impl MergeRails {
    /// Merge every message except those from or to a node with one of `failures` (known or in flight).
    pub fn around(fabric: &Fabric, failures: &[crate::engine::Failure]) -> Self {
        let mut exact_nodes = vec![false; fabric.spec().nodes as usize];
        for f in failures {
            if let Some(e) = exact_nodes.get_mut(f.node as usize) {
                *e = true;
            }
        }
        Self { exact_nodes }
    }

    /// Whether a message between simulated nodes `a` and `b` may be merged.
    fn merges(&self, a: u32, b: u32) -> bool {
        let exact = |n: u32| self.exact_nodes.get(n as usize).copied().unwrap_or(false);
        !exact(a) && !exact(b)
    }
}

/// Convert the schedules of every rank of `layout` (from `build`, called once per rank in rank order) into
/// tasks of `dag` after `start`. Algo node `i` runs on simulated node `nodes[i]`; a rank runs on the GPU of
/// its local index.
pub fn append_schedules(
    dag: &mut Dag,
    fabric: &Fabric,
    layout: &Layout,
    nodes: &[u32],
    build: impl FnMut(Rank) -> Result<RankSchedule, AlgoError>,
    start: Option<TaskId>,
) -> Result<Converted, SimError> {
    append_schedules_with(dag, fabric, layout, nodes, build, start, None)
}

/// [`append_schedules`], with the messages `merge` allows merged into one flow each ([`MergeRails`], an
/// approximation) when it is given.
pub fn append_schedules_with(
    dag: &mut Dag,
    fabric: &Fabric,
    layout: &Layout,
    nodes: &[u32],
    mut build: impl FnMut(Rank) -> Result<RankSchedule, AlgoError>,
    start: Option<TaskId>,
    merge: Option<&MergeRails>,
) -> Result<Converted, SimError> {
    let s = fabric.spec();
    let k = layout.nics_per_node();
    if layout.nodes() != nodes.len() {
        return Err(SimError::Convert(format!("layout has {} nodes, placement {}", layout.nodes(), nodes.len())));
    }
    if k != s.nics_per_node as usize {
        return Err(SimError::Convert(format!("layout has {k} NICs per node, the fabric {}", s.nics_per_node)));
    }
    if let Some(&bad) = nodes.iter().find(|&&n| n >= s.nodes) {
        return Err(SimError::Convert(format!("placement names node {bad}; the fabric has {}", s.nodes)));
    }
    let endpoint = |r: Rank| -> Result<Endpoint, SimError> {
        let node = layout.node_of(r).map_err(|e| SimError::Convert(e.to_string()))?;
        let local = layout.local_index(r).map_err(|e| SimError::Convert(e.to_string()))? as u32;
        if local >= s.gpus_per_node {
            return Err(SimError::Convert(format!("{r} is local rank {local}; nodes have {} GPUs", s.gpus_per_node)));
        }
        Ok(Endpoint::new(nodes[node.index()], local))
    };
    let mut out = Converted {
        end: 0,
        rank_end: Vec::with_capacity(layout.ranks()),
        transfers: 0,
        steps: 0,
        nic_tx: vec![0; layout.nodes() * k],
        nic_rx: vec![0; layout.nodes() * k],
        intra_bytes: vec![0; layout.nodes()],
    };
    // Messages whose other side is not converted yet, per (sender, receiver) pair in the order the side converted
    // first posted them (tags are unique per pair). The other side usually takes them in the same order.
    let mut open: FxMap<(u32, u32), VecDeque<(u64, Half)>> = FxMap::default();
    let mut sinks: Vec<TaskId> = Vec::new();
    let mut task_of: Vec<TaskId> = Vec::new();
    let mut has_dependent: Vec<bool> = Vec::new();
    let mut deps: Vec<TaskId> = Vec::new();
    let mut parts: Vec<TaskId> = Vec::new();
    // One queue per connection (sender, receiver, source rail, destination rail; intra-node: rails u32::MAX),
    // numbered in the order they first appear. Only the sender's conversion adds to a connection, so the map
    // holds the connections of the rank at hand: `(receiver, source rail, destination rail)`.
    let mut queues: FxMap<(u32, u32, u32), u32> = FxMap::default();
    let mut next_queue = 0u32;
    // Per rank: what a message of each (split, length, receiver) turns into (memoized: the ops and queues of its
    // parts and the bytes each NIC moves).
    let mut messages: FxMap<(u16, u64, u32), Message> = FxMap::default();
    for r in 0..layout.ranks() as u32 {
        let rank = Rank(r);
        let sched = build(rank).map_err(|e| SimError::Convert(format!("building {rank}: {e}")))?;
        let me = endpoint(rank)?;
        let my_node = layout.node_of(rank).map_err(|e| SimError::Convert(e.to_string()))?.index();
        let elem = sched.dtype.size() as u64;
        messages.clear();
        queues.clear();
        task_of.clear();
        has_dependent.clear();
        has_dependent.resize(sched.steps().len(), false);
        for (i, step) in sched.steps().iter().enumerate() {
            deps.clear();
            for &d in sched.deps(i) {
                let d = d as usize;
                let t = *task_of.get(d).ok_or_else(|| {
                    SimError::Convert(format!("{rank} step {i} depends on step {d}, which is not earlier"))
                })?;
                has_dependent[d] = true;
                deps.push(t);
            }
            if deps.is_empty() {
                deps.extend(start);
            }
            let task = match step.kind {
                StepKind::Copy { .. } | StepKind::Reduce { .. } => dag.barrier(&deps),
                StepKind::Recv { peer, tag, .. } => {
                    let t = dag.barrier(&deps);
                    match match_half(&mut open, (peer.0, r), r, tag.0, Half::Posted(t))? {
                        Some(Half::Sent(done)) => dag.depend(done, t),
                        Some(Half::Posted(_)) => {
                            return Err(SimError::Convert(format!("{rank} receives tag {} from {peer} twice", tag.0)))
                        }
                        None => {}
                    }
                    t
                }
                StepKind::Send { peer, tag, src, split } => {
                    let m = match messages.entry((split.0, src.len, peer.0)) {
                        Entry::Occupied(e) => e.into_mut(),
                        Entry::Vacant(v) => {
                            let dst = endpoint(peer)?;
                            let mut m = Message::default();
                            match sched.split(split) {
                                None => {
                                    if me.node != dst.node {
                                        return Err(SimError::Convert(format!(
                                            "{rank} sends to {peer} on another node without a NIC split"
                                        )));
                                    }
                                    m.intra = true;
                                    let op = dag.intern(Op::Transfer {
                                        src: me,
                                        dst,
                                        bytes: src.len as f64,
                                        rails: 0,
                                        weight: 1.0,
                                    });
                                    let q = queue_of(&mut queues, &mut next_queue, (peer.0, u32::MAX, u32::MAX));
                                    m.flows.push((op, q));
                                }
                                Some(sp) => {
                                    let peer_node =
                                        layout.node_of(peer).map_err(|e| SimError::Convert(e.to_string()))?.index();
                                    let sizes = sp.divide(src.len, elem);
                                    // Merged: the index of the largest part (the first of equal ones) is the one
                                    // kept.
                                    let kept = merge
                                        .filter(|mr| {
                                            sp.parts.len() > 1
                                                && sp.parts.iter().all(|p| p.src == p.dst)
                                                && mr.merges(me.node, dst.node)
                                        })
                                        .and_then(|_| {
                                            sizes.iter().enumerate().rev().max_by_key(|&(_, &b)| b).map(|(j, _)| j)
                                        });
                                    for (j, (part, &bytes)) in sp.parts.iter().zip(sizes.iter()).enumerate() {
                                        if bytes == 0 {
                                            continue;
                                        }
                                        let (sr, dr) = (part.src.index(), part.dst.index());
                                        if sr >= k || dr >= k {
                                            return Err(SimError::Convert(format!(
                                                "{rank} step {i} uses rail {sr}/{dr}"
                                            )));
                                        }
                                        m.bytes.push((my_node * k + sr, peer_node * k + dr, bytes));
                                        if kept.is_some_and(|kj| kj != j) {
                                            continue;
                                        }
                                        let op = dag.intern(Op::Pinned {
                                            src: me,
                                            dst,
                                            bytes: bytes as f64,
                                            src_rail: sr as u32,
                                            dst_rail: dr as u32,
                                            weight: 1.0,
                                        });
                                        let q = queue_of(&mut queues, &mut next_queue, (peer.0, sr as u32, dr as u32));
                                        m.flows.push((op, q));
                                    }
                                }
                            }
                            v.insert(m)
                        }
                    };
                    if m.intra {
                        out.intra_bytes[my_node] += src.len;
                    }
                    for &(tx, rx, bytes) in &m.bytes {
                        out.nic_tx[tx] += bytes;
                        out.nic_rx[rx] += bytes;
                    }
                    parts.clear();
                    parts.extend(m.flows.iter().map(|&(op, q)| dag.add_interned(op, &deps, Some(q))));
                    out.transfers += parts.len();
                    let done = match parts.as_slice() {
                        [one] => *one,
                        [] => dag.barrier(&deps),
                        many => dag.barrier(many),
                    };
                    match match_half(&mut open, (r, peer.0), r, tag.0, Half::Sent(done))? {
                        Some(Half::Posted(t)) => dag.depend(done, t),
                        Some(Half::Sent(_)) => {
                            return Err(SimError::Convert(format!("{rank} sends tag {} to {peer} twice", tag.0)))
                        }
                        None => {}
                    }
                    done
                }
            };
            task_of.push(task);
        }
        out.steps += task_of.len();
        let first_sink = sinks.len();
        sinks.extend(task_of.iter().zip(&has_dependent).filter(|(_, &h)| !h).map(|(&t, _)| t));
        let mine: Vec<TaskId> = sinks[first_sink..].iter().copied().chain(start).collect();
        out.rank_end.push(dag.barrier(&mine));
    }
    let unmatched = open.iter().flat_map(|(&(a, b), q)| q.iter().map(move |&(tag, half)| (a, b, tag, half)));
    if let Some((a, b, tag, half)) = unmatched.clone().next() {
        return Err(unmatched_error(a, b, tag, half, unmatched.count()));
    }
    sinks.extend(start);
    out.end = dag.barrier(&sinks);
    Ok(out)
}

/// What one message of a rank turns into.
#[derive(Clone, Debug, Default)]
struct Message {
    /// Its transfers (one per NIC part, one for an intra-node message, one for merged parts): op and queue.
    flows: Vec<(OpId, u32)>,
    /// Per NIC part: the sending NIC's and the receiving NIC's index in [`Converted::nic_tx`] and
    /// [`Converted::nic_rx`], and its bytes.
    bytes: Vec<(usize, usize, u64)>,
    /// An intra-node message.
    intra: bool,
}

/// The queue of the converted rank's connection `key` (a new queue id, `next`, for a new connection).
fn queue_of(queues: &mut FxMap<(u32, u32, u32), u32>, next: &mut u32, key: (u32, u32, u32)) -> u32 {
    *queues.entry(key).or_insert_with(|| {
        *next += 1;
        *next - 1
    })
}

/// The error for message `tag` from rank `a` to rank `b`, whose side `half` found no other side (`count` such).
fn unmatched_error(a: u32, b: u32, tag: u64, half: Half, count: usize) -> SimError {
    let what = if matches!(half, Half::Sent(_)) { "never received" } else { "never sent" };
    SimError::Convert(format!("message tag {tag} from rank {a} to rank {b} is {what} ({count} unmatched)"))
}

/// Match `half` of message `tag` of `pair` (sender, receiver), converting rank `r`: the other side's half when it
/// was converted already (taken out of `open`), else `None` with `half` left in `open` for it. A half of the same
/// kind found instead means the message was posted twice on this side.
fn match_half(
    open: &mut FxMap<(u32, u32), VecDeque<(u64, Half)>>,
    pair: (u32, u32),
    r: u32,
    tag: u64,
    half: Half,
) -> Result<Option<Half>, SimError> {
    let other = if pair.0 == r { pair.1 } else { pair.0 };
    let pending = open.entry(pair).or_default();
    if other > r {
        // The other side comes later: nothing of it can be here yet.
        pending.push_back((tag, half));
        return Ok(None);
    }
    let found = match pending.front() {
        Some(&(t, _)) if t == tag => pending.pop_front(),
        _ => pending.iter().position(|&(t, _)| t == tag).and_then(|i| pending.remove(i)),
    };
    match found {
        Some((_, h)) => Ok(Some(h)),
        None if other == r => {
            pending.push_back((tag, half));
            Ok(None)
        }
        // The other side was converted without it.
        None => Err(unmatched_error(pair.0, pair.1, tag, half, 1)),
    }
}

/// Which schedule an AllReduce runs: the planner's choice, or one of its candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Whatever [`r2ccl_policy::plan_payload`] chooses.
    Planner,
    /// This candidate with the planner's parameters; the plain algorithm (Balance, or the ring on a healthy
    /// fabric) when it is not a candidate in the case at hand (for example R2CCL-AllReduce without failure).
    Candidate(CandidateKind),
}

/// The planner's input for `nodes` nodes of `fabric` with `ranks_per_node` ranks each: NIC line rates,
/// per-hop latency `2 x nic_latency` (NIC to switch to NIC), NVLink's latency and bandwidth inside a node, and the
/// spine share `1000 / spine_oversubscription` per mille.
pub fn topology(fabric: &Fabric, nodes: usize, ranks_per_node: u32) -> Result<Topology, SimError> {
    let s = fabric.spec();
    let mbps = (s.nic_gbps * 1000.0).round() as u64;
    let conv = |e: r2ccl_policy::TopologyError| SimError::Convert(e.to_string());
    let permille = (1000.0 / s.spine_oversubscription).round().clamp(0.0, 1000.0) as u32;
    Topology::new(vec![NodeSpec { nic_mbps: vec![mbps; s.nics_per_node as usize] }; nodes])
        .map_err(conv)?
        .with_ranks_per_node(ranks_per_node)
        .map_err(conv)?
        .with_alpha(2.0 * s.nic_latency_us * 1e-6)
        .map_err(conv)?
        .with_intra_alpha(s.nvlink_latency_us * 1e-6)
        .map_err(conv)?
        .with_intra_gbps(s.nvlink_gbps)
        .map_err(conv)?
        .with_spine_permille(permille)
        .map_err(conv)
}

/// The agreed health view of `nodes` (simulated node ids, in algo node order) under the plan view `health`.
pub fn health_view(fabric: &Fabric, nodes: &[u32], health: &PlanHealth) -> HealthView {
    let s = fabric.spec();
    let mbps = (s.nic_gbps * 1000.0).round() as u64;
    let view = nodes
        .iter()
        .map(|&n| NodeHealth {
            nics: (0..s.nics_per_node as usize)
                .map(|r| {
                    let f = health.get(n as usize).and_then(|h| h.get(r)).copied().unwrap_or(1.0).clamp(0.0, 1.0);
                    NicHealth { nominal_mbps: mbps, usable_mbps: (mbps as f64 * f).round() as u64 }
                })
                .collect(),
        })
        .collect();
    HealthView::from_nodes(HealthEpoch(1), view)
}

/// Element type and count of an AllReduce of `bytes` per rank (`f32` when the size allows, else bytes).
fn payload(bytes: f64) -> (DType, u64) {
    let b = bytes.max(0.0).round() as u64;
    if b.is_multiple_of(4) {
        (DType::F32, b / 4)
    } else {
        (DType::U8, b)
    }
}

/// Ranks per node of `job`: every GPU with the intra-node phases, one rank per node (GPU 0, the node's
/// whole per-node buffer, forwarded over NVLink to the other NICs) for per-rail groups.
fn ranks_per_node(fabric: &Fabric, job: &AllReduceJob) -> u32 {
    if job.intra {
        fabric.spec().gpus_per_node
    } else {
        1
    }
}

/// A planned AllReduce: the planner's topology, view and plan, and the request that was built.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// The planner's input.
    pub topology: Topology,
    /// The health view it planned for.
    pub view: HealthView,
    /// Its plan.
    pub plan: Plan,
    /// The strategy whose schedule runs.
    pub strategy: CandidateKind,
    /// The schedule request that runs.
    pub request: ScheduleRequest,
}

/// Plan `job` (nodes in ring order, `bytes` per rank) under `health` and pick the request for `choice`.
pub fn plan_allreduce(
    fabric: &Fabric,
    health: &PlanHealth,
    job: &AllReduceJob,
    choice: Choice,
) -> Result<Planned, SimError> {
    let conv = |e: r2ccl_policy::PlanError| SimError::Convert(e.to_string());
    let g = ranks_per_node(fabric, job);
    let topo = topology(fabric, job.nodes.len(), g)?;
    let view = health_view(fabric, &job.nodes, health);
    let (dtype, count) = payload(job.bytes);
    let coll = Collective::AllReduce { op: ReduceOp::Sum };
    let plan = r2ccl_policy::plan_payload(&topo, &view, coll, dtype, count).map_err(conv)?;
    let strategy = match choice {
        Choice::Planner => plan.chosen,
        Choice::Candidate(s) if plan.candidate(s).is_some() => s,
        Choice::Candidate(_) if plan.candidate(CandidateKind::Balance).is_some() => CandidateKind::Balance,
        Choice::Candidate(_) => CandidateKind::Ring,
    };
    let request = plan.request_for(strategy).map_err(conv)?;
    Ok(Planned { topology: topo, view, plan, strategy, request })
}

/// Plan `job` under `health` for `choice` and append its exact schedule to `dag` after `start`.
pub fn append_allreduce(
    dag: &mut Dag,
    fabric: &Fabric,
    health: &PlanHealth,
    job: &AllReduceJob,
    choice: Choice,
    start: Option<TaskId>,
) -> Result<(Planned, Converted), SimError> {
    append_allreduce_with(dag, fabric, health, job, choice, start, None)
}

/// [`append_allreduce`], with the messages `merge` allows merged into one flow each ([`MergeRails`], an
/// approximation) when it is given.
pub fn append_allreduce_with(
    dag: &mut Dag,
    fabric: &Fabric,
    health: &PlanHealth,
    job: &AllReduceJob,
    choice: Choice,
    start: Option<TaskId>,
    merge: Option<&MergeRails>,
) -> Result<(Planned, Converted), SimError> {
    let planned = plan_allreduce(fabric, health, job, choice)?;
    let conv = |e: r2ccl_policy::PlanError| SimError::Convert(e.to_string());
    let af = r2ccl_policy::schedule_fabric(&planned.topology, &planned.view).map_err(conv)?;
    let layout = af.layout().clone();
    let req = &planned.request;
    let build = |r| r2ccl_algo::build_rank_schedule(&af, req, r);
    let converted = append_schedules_with(dag, fabric, &layout, &job.nodes, build, start, merge)?;
    Ok((planned, converted))
}
