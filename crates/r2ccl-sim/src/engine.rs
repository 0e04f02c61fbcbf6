//! The flow-level, event-driven simulation engine.
//!
//! Input: a [`Dag`] of tasks (compute delays and transfers between GPUs) with dependencies, a failure
//! timeline and the engine settings. Transfers become flows on fabric paths; concurrent flows share links
//! max-min fairly (progressive filling), recomputed at every flow arrival or departure and every capacity
//! change, but only inside the connected component of flows that the change touches (max-min allocations
//! decompose over components, so this is exact). Links that can never be a bottleneck in a run are left out of
//! that computation (exact as well), and NVLink links that only intra-node flows can saturate take part only
//! while such a flow uses them. Transfers may belong to a queue (a connection) that carries them one at a
//! time in ready order. [`Sharing::Ports`] replaces max-min sharing by r2ccl-algo's port model for cross-checks.
//! Time is simulated: `f64` seconds from the start of the run.
//!
//! Failures change link capacities at their time; the engine learns of them only after a detection delay
//! (error completion, or the stall timeout of a silent black hole). Until then flows on a dead NIC stall.
//! On detection, in-flight flows on the dead NIC are moved per [`RepairMode`] (live migration) and the bytes
//! of the partially sent chunk are replayed; flows that start later are routed around known failures.

use crate::error::SimError;
use crate::fabric::{Endpoint, Fabric, LinkId};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

mod config;
mod dag;
mod fill;
mod heap;
pub use config::{EngineConfig, Failure, FailureKind, RepairMode, Sharing};
use dag::*;
pub use dag::{Dag, Op, OpId};
#[cfg(test)]
mod tests;
use heap::*;

/// Index of a task in a [`Dag`].
pub type TaskId = u32;

/// Bit mask of rails a transfer may use (bit r = rail r).
pub type RailMask = u64;

/// Every rail.
pub const ALL_RAILS: RailMask = u64::MAX;

/// Outcome of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    /// Time the last task finished (or the time the run stalled), seconds.
    pub makespan: f64,
    /// Finish time per task (`NaN` for tasks that never finished).
    pub finish: Vec<f64>,
    /// Whether the run stalled: some transfer can never finish (fail-stop hang).
    pub stalled: bool,
    /// Flows (subflows) created.
    pub flows: usize,
    /// Events processed.
    pub events: usize,
    /// Bytes resent because of live migration.
    pub replayed_bytes: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    FailStart(u32),
    Detect(u32),
    FailEnd(u32),
    RecoverDetect(u32),
    DelayDone(u32),
    FlowStart(u32),
    SubDone(u32, u32),
}

#[derive(Clone, Copy, Debug)]
struct Item {
    t: f64,
    seq: u64,
    ev: Ev,
}

/// A flow start on a latency FIFO, with its task's transfer and queue: the task was at hand when it became
/// ready, and by the time the flow starts its entries are usually out of the cache.
#[derive(Clone, Copy, Debug)]
struct Start {
    item: Item,
    task: Ready,
}

/// What finishing a transfer task takes, read while the task is at hand (when it becomes ready): its transfer,
/// its queue and its successors `succ[succ.0..succ.1]`.
#[derive(Clone, Copy, Debug)]
struct Ready {
    op: Op,
    queue: u32,
    succ: (u32, u32),
}
impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    fn cmp(&self, o: &Self) -> Ordering {
        // Min-heap on (t, seq).
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}

#[derive(Clone, Debug)]
struct Sub {
    task: u32,
    path_start: u32,
    path_len: u8,
    alive: bool,
    ver: u32,
    rate: f64,
    remaining: f64,
    orig: f64,
    weight: f64,
    t_upd: f64,
    /// Holds its ports ([`Sharing::Ports`] only).
    serving: bool,
    /// An event for its completion at the current rate is queued (version `ver`).
    queued: bool,
    /// Rate before the current recomputation.
    prev_rate: f64,
    /// Time it was created.
    born: f64,
    /// Creation order (ids are reused once a flow is gone; this is not).
    serial: u64,
    /// Between two GPUs of one node (it makes the gated links on its path live).
    intra: bool,
    /// Its task's only flow (whose count of flows left is not kept).
    single: bool,
    /// For a single flow: its task's queue and successor range (see [`Ready`]).
    queue: u32,
    succ: (u32, u32),
}

/// What the engine reads and counts per task while it runs, in one small record: a task's turn touches all of it
/// (the last dependency to finish counts it down, then it starts with its op, queue and successors), and the
/// tasks of a run (millions for the 1024-GPU schedules) are far apart in memory. Finish times are written to a
/// list of their own.
#[derive(Clone, Copy, Debug)]
struct TaskState {
    /// Its op's index in the DAG's table of distinct ops.
    op: u32,
    /// Its queue (`NO_QUEUE`: none, or the queues are not used in this run).
    queue: u32,
    /// Its successors are `succ[succ.0..succ.1]`.
    succ: (u32, u32),
}

/// Most links on a flow's path (NVLink hop, uplink, spine up and down, downlink, NVLink hop).
const MAX_PATH: usize = 8;

/// Simulate `dag` on `fabric` under `failures`.
pub fn simulate(fabric: &Fabric, dag: &Dag, failures: &[Failure], cfg: &EngineConfig) -> Result<RunResult, SimError> {
    run_with(fabric, dag, failures, cfg, Shortcuts { gate_nvlink: true, fill_alone: true })
}

/// Exact shortcuts of the engine, all taken by [`simulate`]; tests compare runs with and without each.
#[derive(Clone, Copy, Debug)]
struct Shortcuts {
    /// Gate NVLink links (see [`Sim::new`]).
    gate_nvlink: bool,
    /// Fill components whose flows share no link per flow ([`Sim::fill_alone`]).
    fill_alone: bool,
}

/// [`simulate`] with the given shortcuts.
fn run_with(
    fabric: &Fabric,
    dag: &Dag,
    failures: &[Failure],
    cfg: &EngineConfig,
    shortcuts: Shortcuts,
) -> Result<RunResult, SimError> {
    for (i, f) in failures.iter().enumerate() {
        f.validate(fabric, i)?;
    }
    let mut sim = Sim::new(fabric, dag, failures, cfg, shortcuts);
    sim.run();
    Ok(sim.result())
}

struct Sim<'a> {
    fabric: &'a Fabric,
    dag: &'a Dag,
    failures: &'a [Failure],
    cfg: &'a EngineConfig,
    heap: BinaryHeap<Item>,
    /// Flow starts by path latency (bit pattern): each is due at the time its task started plus that latency,
    /// and tasks start at the current time, which never decreases, so each FIFO is in event order and keeps
    /// these events (about half of all) out of the heap. The next event is the earliest of the heap's top
    /// and the FIFOs' fronts, by (time, sequence number) as in the heap.
    starts: Vec<(u64, VecDeque<Start>)>,
    /// The task of the flow start [`Sim::pop_due`] took last from a FIFO, for its handling.
    popped: Option<Ready>,
    /// Flow completions (the events `Ev::SubDone`), one entry per flow at its current rate.
    completions: Completions,
    seq: u64,
    now: f64,
    cap: Vec<f64>,
    nominal_nic: f64,
    known: Vec<f64>,
    nic_state: Vec<f64>,
    link_subs: Vec<Vec<u32>>,
    /// Per entry of `paths`: the flow's index in that link's `link_subs` (removal without a search).
    link_pos: Vec<u32>,
    /// Ids of finished flows, reused by new ones (flow `i`'s path lives at `paths[i * MAX_PATH..]`), so the
    /// flow tables stay the size of the most flows alive at once.
    free_subs: Vec<u32>,
    /// Flows created.
    created: u64,
    subs: Vec<Sub>,
    paths: Vec<LinkId>,
    /// Per task.
    tasks: Vec<TaskState>,
    /// Per task: its finish time (`NaN` until it finished).
    finish: Vec<f64>,
    /// Per task: dependencies not finished yet; once they are (the task has started), the flows of its transfer
    /// not finished yet (kept for transfers of several flows only).
    left: Vec<u32>,
    succ: Vec<u32>,
    done: usize,
    dirty: Vec<LinkId>,
    // Component scratch.
    gen: u32,
    link_mark: Vec<u32>,
    sub_mark: Vec<u32>,
    frozen: Vec<u32>,
    cap_rem: Vec<f64>,
    cnt: Vec<u32>,
    wsum: Vec<f64>,
    comp_links: Vec<LinkId>,
    comp_subs: Vec<u32>,
    /// Links still filling ([`Sim::fill_max_min`] scratch).
    active: Vec<LinkId>,
    /// Per link: its share at the start of the filling round ([`Sim::fill_max_min`] scratch).
    share: Vec<f64>,
    /// Per link: the last filling round that changed it.
    touched: Vec<u32>,
    /// Filling rounds so far (wrapping).
    round: u32,
    /// Least share per flow ([`Sim::fill_alone`] scratch).
    least: Vec<f64>,
    /// Whether [`Sim::fill_alone`] may be used.
    alone_ok: bool,
    stack: Vec<LinkId>,
    scratch_path: Vec<LinkId>,
    events: usize,
    replayed: f64,
    /// Per queue: whether a transfer of it is in flight.
    q_busy: Vec<bool>,
    /// Per queue: transfers ready to start, in the order they became ready.
    q_wait: Vec<VecDeque<(u32, Ready)>>,
    /// Per link: a NIC port ([`Sharing::Ports`]).
    is_port: Vec<bool>,
    /// Per link: it can never limit a flow in this run, so flows do not join it (see [`Sim::new`]).
    elided: Vec<bool>,
    /// Per link: it can limit a flow only while an intra-node flow uses it (an NVLink link when intra-node
    /// transfers exist but the node's NIC total fits in NVLink; see [`Sim::new`]).
    gated: Vec<bool>,
    /// Per link: whether it takes part in the sharing computation now (nonzero), i.e. for a gated link the
    /// number of intra-node flows on it; 1 for every other link.
    live: Vec<u32>,
    /// Zero-length tasks ready now, in the order they became ready.
    instant: VecDeque<u32>,
}

impl<'a> Sim<'a> {
    fn new(
        fabric: &'a Fabric,
        dag: &'a Dag,
        failures: &'a [Failure],
        cfg: &'a EngineConfig,
        shortcuts: Shortcuts,
    ) -> Self {
        let n = dag.op_of.len();
        // Under the port model a port already serves one transfer at a time in the order they became ready.
        let queues = cfg.sharing != Sharing::Ports;
        let mut tasks: Vec<TaskState> = dag
            .op_of
            .iter()
            .enumerate()
            .map(|(t, &op)| TaskState {
                op,
                queue: dag.queue.get(t).copied().filter(|_| queues).unwrap_or(NO_QUEUE),
                succ: (0, 0),
            })
            .collect();
        // Count each task's dependencies and successors (in `succ.1`), then place the successor lists in task order
        // and fill them in edge order (`succ.1` ends up at the end of each list).
        let mut left = vec![0u32; n];
        for &(a, b) in &dag.edges {
            left[b as usize] += 1;
            tasks[a as usize].succ.1 += 1;
        }
        let mut at = 0u32;
        for t in &mut tasks {
            let count = t.succ.1;
            t.succ = (at, at);
            at += count;
        }
        let mut succ = vec![0u32; dag.edges.len()];
        for &(a, b) in &dag.edges {
            let end = &mut tasks[a as usize].succ.1;
            succ[*end as usize] = b;
            *end += 1;
        }
        let s = fabric.spec();
        let nics = (s.nodes * s.nics_per_node) as usize;
        let links = fabric.link_count();
        let mut sim = Self {
            fabric,
            dag,
            failures,
            cfg,
            heap: BinaryHeap::new(),
            starts: Vec::new(),
            popped: None,
            completions: Completions::default(),
            seq: 0,
            now: 0.0,
            cap: fabric.capacities().to_vec(),
            nominal_nic: s.nic_bytes_per_s(),
            known: vec![s.nic_bytes_per_s(); nics],
            nic_state: vec![1.0; nics],
            link_subs: vec![Vec::new(); links],
            link_pos: Vec::new(),
            free_subs: Vec::new(),
            created: 0,
            subs: Vec::new(),
            paths: Vec::new(),
            tasks,
            finish: vec![f64::NAN; n],
            left,
            succ,
            done: 0,
            dirty: Vec::new(),
            gen: 0,
            link_mark: vec![0; links],
            sub_mark: Vec::new(),
            frozen: Vec::new(),
            cap_rem: vec![0.0; links],
            cnt: vec![0; links],
            wsum: vec![0.0; links],
            comp_links: Vec::new(),
            comp_subs: Vec::new(),
            active: Vec::new(),
            least: Vec::new(),
            share: vec![0.0; links],
            touched: vec![0; links],
            round: 0,
            alone_ok: shortcuts.fill_alone,
            stack: Vec::new(),
            scratch_path: Vec::new(),
            events: 0,
            replayed: 0.0,
            q_busy: vec![false; dag.queues as usize],
            q_wait: vec![VecDeque::new(); dag.queues as usize],
            is_port: vec![false; links],
            elided: vec![false; links],
            gated: vec![false; links],
            live: vec![1; links],
            instant: VecDeque::new(),
        };
        for node in 0..s.nodes {
            for rail in 0..s.nics_per_node {
                sim.is_port[fabric.nic_up(node, rail) as usize] = true;
                sim.is_port[fabric.nic_down(node, rail) as usize] = true;
            }
        }
        // Links that can never be a bottleneck are left out of the sharing computation (exact, and it keeps the
        // components of flows per rail). Without intra-node transfers an NVLink link only carries PXN hops to
        // and from the node's NICs, at most the node's NIC total (the rails of a GPU's sending hops and of
        // its forwarding hops are disjoint); a spine link carries at most what the rail's NICs send or
        // receive. Failures only ever lower NIC capacities.
        let nic_total = s.nic_bytes_per_s() * f64::from(s.nics_per_node);
        let intra =
            dag.table.iter().any(|op| op.transfer().is_some_and(|(a, b, _, _)| a.node == b.node && a.gpu != b.gpu));
        let pxn_fits = nic_total <= s.nvlink_gbps * 1e9 / 8.0;
        let nvl_free = !intra && pxn_fits;
        // With intra-node transfers, an NVLink link can still limit a flow only while an intra-node flow uses it:
        // the PXN hops alone fit. Such a link is gated: flows join it, but it takes part in the sharing
        // computation (and joins its flows into one component) only while it carries an intra-node flow. A
        // max-min allocation does not change when a constraint that cannot be saturated is left out, so this is
        // exact up to rounding (the filling runs over other components, in another order).
        let nvl_gated = shortcuts.gate_nvlink && intra && pxn_fits && cfg.sharing == Sharing::MaxMin;
        let spine_free = s.spine_oversubscription <= 1.0;
        for node in 0..s.nodes {
            for gpu in 0..s.gpus_per_node {
                let e = Endpoint::new(node, gpu);
                for l in [fabric.nvl_out(e) as usize, fabric.nvl_in(e) as usize] {
                    sim.elided[l] = nvl_free;
                    sim.gated[l] = nvl_gated;
                    sim.live[l] = u32::from(!nvl_gated);
                }
            }
        }
        for rail in 0..s.nics_per_node {
            sim.elided[fabric.spine_up(rail) as usize] = spine_free;
            sim.elided[fabric.spine_down(rail) as usize] = spine_free;
        }
        for (i, f) in failures.iter().enumerate() {
            sim.push(f.at_s, Ev::FailStart(i as u32));
        }
        for t in 0..n {
            if sim.left[t] == 0 {
                sim.start_task(t as u32, 0.0);
            }
        }
        sim
    }

    fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Item { t, seq: self.seq, ev });
    }

    /// Queue the start of `task`'s flow (`op`, on `queue`) at `now + lat` on the FIFO of latency `lat` (the heap if
    /// that would break the FIFO's order).
    fn push_start(&mut self, lat: f64, task: u32, op: Op, queue: u32, succ: (u32, u32)) {
        let ev = Ev::FlowStart(task);
        let t = self.now + lat;
        let key = lat.to_bits();
        let i = match self.starts.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                self.starts.push((key, VecDeque::new()));
                self.starts.len() - 1
            }
        };
        if self.starts[i].1.back().is_some_and(|b| b.item.t > t) {
            self.push(t, ev);
            return;
        }
        self.seq += 1;
        let item = Item { t, seq: self.seq, ev };
        self.starts[i].1.push_back(Start { item, task: Ready { op, queue, succ } });
    }

    /// The earliest pending event (by time, then sequence number), if any is due by `horizon`; removed.
    fn pop_due(&mut self, horizon: f64) -> Option<Item> {
        const HEAP: usize = usize::MAX;
        const COMPLETIONS: usize = usize::MAX - 1;
        // Whether (t, seq) comes before `best` (the order of `Item`, whose `Ord` is reversed for the max-heap).
        let before = |t: f64, seq: u64, best: &Option<(f64, u64, usize)>| {
            best.is_none_or(|(bt, bs, _)| t.total_cmp(&bt).then(seq.cmp(&bs)) == Ordering::Less)
        };
        let mut best: Option<(f64, u64, usize)> = self.heap.peek().map(|it| (it.t, it.seq, HEAP));
        if let Some((t, seq, _)) = self.completions.first() {
            if before(t, seq, &best) {
                best = Some((t, seq, COMPLETIONS));
            }
        }
        for (i, (_, q)) in self.starts.iter().enumerate() {
            if let Some(st) = q.front() {
                if before(st.item.t, st.item.seq, &best) {
                    best = Some((st.item.t, st.item.seq, i));
                }
            }
        }
        let (t, _, from) = best?;
        if t > horizon {
            return None;
        }
        match from {
            HEAP => self.heap.pop(),
            COMPLETIONS => {
                let (t, seq, s) = self.completions.first()?;
                self.completions.remove(s);
                Some(Item { t, seq, ev: Ev::SubDone(s, self.subs[s as usize].ver) })
            }
            fifo => {
                let st = self.starts[fifo].1.pop_front()?;
                self.popped = Some(st.task);
                Some(st.item)
            }
        }
    }

    fn nic_index(&self, node: u32, rail: u32) -> usize {
        (node * self.fabric.spec().nics_per_node + rail) as usize
    }

    fn start_task(&mut self, task: u32, at: f64) {
        let op = self.op(task);
        match op {
            // Zero-length tasks (barriers) finish at once, without a trip through the event heap.
            Op::Delay(d) if d <= 0.0 && at <= self.now => self.instant.push_back(task),
            Op::Delay(d) => self.push(at + d.max(0.0), Ev::DelayDone(task)),
            Op::Transfer { src, dst, .. } | Op::Pinned { src, dst, .. } => {
                let lat = self.fabric.path_latency(src, dst);
                if at == self.now {
                    let ready = self.ready(task, op);
                    self.push_start(lat, task, op, ready.queue, ready.succ);
                } else {
                    self.push(at + lat, Ev::FlowStart(task));
                }
            }
        }
    }

    /// What `task` does.
    fn op(&self, task: u32) -> Op {
        self.dag.table[self.tasks[task as usize].op as usize]
    }

    /// `task` (transfer `op`) as its flows need it: see [`Ready`].
    fn ready(&self, task: u32, op: Op) -> Ready {
        let t = &self.tasks[task as usize];
        Ready { op, queue: t.queue, succ: t.succ }
    }

    fn task_done(&mut self, task: u32) {
        let t = &self.tasks[task as usize];
        let (queue, succ) = (t.queue, t.succ);
        self.finish_task(task, queue, succ);
    }

    /// [`Sim::task_done`] with the task's queue and successor range at hand.
    fn finish_task(&mut self, task: u32, q: u32, succ: (u32, u32)) {
        self.finish[task as usize] = self.now;
        self.done += 1;
        if q != NO_QUEUE {
            self.q_busy[q as usize] = false;
            if let Some((next, ready)) = self.q_wait[q as usize].pop_front() {
                self.flow_start(next, ready);
            }
        }
        let (a, b) = (succ.0 as usize, succ.1 as usize);
        for i in a..b {
            let s = self.succ[i];
            let left = &mut self.left[s as usize];
            *left -= 1;
            if *left == 0 {
                self.start_task(s, self.now);
            }
        }
    }

    /// Finish the zero-length tasks that became ready at the current time, in the order they did.
    fn drain_instant(&mut self) {
        while let Some(task) = self.instant.pop_front() {
            self.events += 1;
            self.task_done(task);
        }
    }

    fn run(&mut self) {
        self.drain_instant();
        while let Some(first) = self.pop_due(f64::INFINITY) {
            self.now = self.now.max(first.t);
            let horizon = self.now + 1e-12 * (1.0 + self.now.abs());
            self.handle(first.ev);
            self.drain_instant();
            while let Some(it) = self.pop_due(horizon) {
                self.handle(it.ev);
                self.drain_instant();
            }
            if !self.dirty.is_empty() {
                self.recompute();
            }
            if self.done == self.tasks.len() {
                // All work done; remaining events are failure bookkeeping only.
                break;
            }
        }
    }

    fn handle(&mut self, ev: Ev) {
        self.events += 1;
        match ev {
            Ev::DelayDone(t) => self.task_done(t),
            Ev::FlowStart(t) => {
                let ready = match self.popped.take() {
                    Some(r) => r,
                    None => self.ready(t, self.op(t)),
                };
                self.flow_start(t, ready);
            }
            Ev::SubDone(s, ver) => {
                let sub = &self.subs[s as usize];
                if !sub.alive || sub.ver != ver {
                    return;
                }
                let (task, single, q, succ) = (sub.task, sub.single, sub.queue, sub.succ);
                self.kill_sub(s);
                if single {
                    self.finish_task(task, q, succ);
                    return;
                }
                let left = &mut self.left[task as usize];
                *left -= 1;
                if *left == 0 {
                    self.task_done(task);
                }
            }
            Ev::FailStart(i) => {
                let f = self.failures[i as usize];
                let frac = f.remaining();
                let nic = self.nic_index(f.node, f.rail);
                self.nic_state[nic] = frac;
                let (up, down) = (self.fabric.nic_up(f.node, f.rail), self.fabric.nic_down(f.node, f.rail));
                for l in [up, down] {
                    self.cap[l as usize] = self.fabric.capacities()[l as usize] * frac;
                    self.dirty.push(l);
                }
                let delay = match f.kind {
                    FailureKind::Down => self.cfg.detect_error_s,
                    FailureKind::BlackHole => self.cfg.detect_blackhole_s,
                    FailureKind::Degraded { .. } => self.cfg.detect_degraded_s,
                };
                self.push(f.at_s + delay, Ev::Detect(i));
                if let Some(u) = f.until_s {
                    self.push(u, Ev::FailEnd(i));
                }
            }
            Ev::Detect(i) => {
                let f = self.failures[i as usize];
                if f.until_s.is_some_and(|u| u <= self.now) {
                    return;
                }
                let nic = self.nic_index(f.node, f.rail);
                self.known[nic] = self.nominal_nic * f.remaining();
                if f.remaining() == 0.0 && self.cfg.repair != RepairMode::None {
                    self.migrate(f.node, f.rail);
                }
            }
            Ev::FailEnd(i) => {
                let f = self.failures[i as usize];
                let nic = self.nic_index(f.node, f.rail);
                self.nic_state[nic] = 1.0;
                for l in [self.fabric.nic_up(f.node, f.rail), self.fabric.nic_down(f.node, f.rail)] {
                    self.cap[l as usize] = self.fabric.capacities()[l as usize];
                    self.dirty.push(l);
                }
                self.push(self.now + self.cfg.recover_detect_s, Ev::RecoverDetect(i));
            }
            Ev::RecoverDetect(i) => {
                let f = self.failures[i as usize];
                let nic = self.nic_index(f.node, f.rail);
                if self.nic_state[nic] >= 1.0 {
                    self.known[nic] = self.nominal_nic;
                }
            }
        }
    }

    fn usable(&self, node: u32, rail: u32) -> f64 {
        self.known[self.nic_index(node, rail)]
    }

    /// Rails (src rail, dst rail, weight) for a transfer under the current knowledge.
    fn resolve(&self, src: Endpoint, dst: Endpoint, mask: RailMask, out: &mut Vec<(u32, u32, f64)>) {
        out.clear();
        if src.node == dst.node {
            out.push((0, 0, 1.0));
            return;
        }
        let k = self.fabric.spec().nics_per_node;
        let in_mask = |r: u32| r < 64 && mask & (1u64 << r) != 0;
        let first = (0..k).find(|&r| in_mask(r)).unwrap_or(0);
        for r in (0..k).filter(|&r| in_mask(r)) {
            let w = self.usable(src.node, r).min(self.usable(dst.node, r));
            if w > 0.0 {
                out.push((r, r, w));
            }
        }
        if !out.is_empty() {
            return;
        }
        match self.cfg.repair {
            RepairMode::None => {
                out.push((first, first, 1.0));
                return;
            }
            RepairMode::SingleBackup => {
                for i in 1..k {
                    let b = (first + i) % k;
                    if self.usable(src.node, b) > 0.0 && self.usable(dst.node, b) > 0.0 {
                        out.push((b, b, 1.0));
                        return;
                    }
                }
            }
            RepairMode::Spread => {
                for r in 0..k {
                    let w = self.usable(src.node, r).min(self.usable(dst.node, r));
                    if w > 0.0 {
                        out.push((r, r, w));
                    }
                }
                if !out.is_empty() {
                    return;
                }
            }
        }
        // No common rail: cross-rail through the spine.
        let best = |node: u32| {
            (0..k)
                .filter(|&r| self.usable(node, r) > 0.0)
                .max_by(|&a, &b| self.usable(node, a).total_cmp(&self.usable(node, b)).then(b.cmp(&a)))
        };
        match (best(src.node), best(dst.node)) {
            (Some(a), Some(b)) => out.push((a, b, 1.0)),
            _ => out.push((first, first, 1.0)),
        }
    }

    #[allow(clippy::too_many_arguments, reason = "one flat call site per routing outcome")]
    fn add_sub(&mut self, task: u32, src: Endpoint, dst: Endpoint, rs: u32, rd: u32, bytes: f64, weight: f64) -> u32 {
        let mut path = std::mem::take(&mut self.scratch_path);
        self.fabric.path(src, dst, rs, rd, &mut path);
        let whole = path.len();
        path.retain(|&l| !self.elided[l as usize]);
        debug_assert!(path.len() <= MAX_PATH, "path of {} links", path.len());
        path.truncate(MAX_PATH);
        let id = match self.free_subs.pop() {
            Some(id) => id,
            None => {
                let id = self.subs.len() as u32;
                self.paths.resize(self.paths.len() + MAX_PATH, 0);
                self.link_pos.resize(self.link_pos.len() + MAX_PATH, 0);
                self.sub_mark.push(0);
                self.frozen.push(0);
                id
            }
        };
        let path_start = id * MAX_PATH as u32;
        let intra = src.node == dst.node && whole > 0;
        for (j, &l) in path.iter().enumerate() {
            self.paths[path_start as usize + j] = l;
            self.link_pos[path_start as usize + j] = self.link_subs[l as usize].len() as u32;
            self.link_subs[l as usize].push(id);
            if intra && self.gated[l as usize] {
                self.live[l as usize] += 1;
            }
            if self.live[l as usize] > 0 {
                self.dirty.push(l);
            }
        }
        let sub = Sub {
            task,
            path_start,
            path_len: path.len() as u8,
            alive: true,
            ver: 0,
            rate: 0.0,
            remaining: bytes,
            orig: bytes,
            weight: weight.max(1e-30),
            t_upd: self.now,
            serving: false,
            queued: false,
            prev_rate: 0.0,
            born: self.now,
            serial: self.created,
            intra,
            single: false,
            queue: NO_QUEUE,
            succ: (0, 0),
        };
        self.created += 1;
        match self.subs.get_mut(id as usize) {
            Some(slot) => *slot = sub,
            None => self.subs.push(sub),
        }
        if whole == 0 {
            // Same GPU: nothing to move.
            self.subs[id as usize].queued = true;
            self.seq += 1;
            self.completions.set(id, self.now, self.seq);
        }
        self.scratch_path = path;
        id
    }

    /// Start the flows of `task`, or queue it behind its queue's transfer in flight.
    fn flow_start(&mut self, task: u32, ready: Ready) {
        let q = ready.queue;
        if q != NO_QUEUE {
            if self.q_busy[q as usize] {
                self.q_wait[q as usize].push_back((task, ready));
                return;
            }
            self.q_busy[q as usize] = true;
        }
        let (src, dst, bytes, rails, weight) = match ready.op {
            Op::Delay(_) => return,
            Op::Transfer { src, dst, bytes, rails, weight } => (src, dst, bytes, rails, weight),
            Op::Pinned { src, dst, bytes, src_rail, dst_rail, weight } => {
                let live = src.node == dst.node
                    || (self.usable(src.node, src_rail) > 0.0 && self.usable(dst.node, dst_rail) > 0.0);
                if live && bytes > 0.0 {
                    // The task's one flow: it is done when the flow is (its count of flows left is not kept).
                    let id = self.add_sub(task, src, dst, src_rail, dst_rail, bytes, weight);
                    let sub = &mut self.subs[id as usize];
                    sub.single = true;
                    (sub.queue, sub.succ) = (q, ready.succ);
                    return;
                }
                (src, dst, bytes, (1u64 << src_rail.min(63)) | (1u64 << dst_rail.min(63)), weight)
            }
        };
        if bytes <= 0.0 {
            self.task_done(task);
            return;
        }
        let mut parts = Vec::new();
        self.resolve(src, dst, rails, &mut parts);
        let total: f64 = parts.iter().map(|p| p.2).sum();
        self.left[task as usize] = parts.len() as u32;
        for (rs, rd, w) in parts {
            self.add_sub(task, src, dst, rs, rd, bytes * w / total, weight * w / total);
        }
    }

    fn kill_sub(&mut self, s: u32) {
        let (start, len, intra) = {
            let sub = &mut self.subs[s as usize];
            if !sub.alive {
                // Gone already (its id may be free for reuse): nothing to undo.
                return;
            }
            sub.alive = false;
            (sub.path_start as usize, sub.path_len as usize, sub.intra)
        };
        self.completions.remove(s);
        for i in start..start + len {
            let l = self.paths[i];
            let p = self.link_pos[i] as usize;
            let v = &mut self.link_subs[l as usize];
            v.swap_remove(p);
            if let Some(&moved) = v.get(p) {
                // The link's last flow took the removed one's place: its entry for this link moves too.
                let m = &self.subs[moved as usize];
                let (a, b) = (m.path_start as usize, m.path_start as usize + m.path_len as usize);
                if let Some(j) = (a..b).find(|&j| self.paths[j] == l) {
                    self.link_pos[j] = p as u32;
                }
            }
            if intra && self.gated[l as usize] {
                // A gated link that no longer carries an intra-node flow is dirty once more, for the flows it
                // held back (see [`Sim::recompute`]).
                self.live[l as usize] -= 1;
                self.dirty.push(l);
            } else if self.live[l as usize] > 0 && !self.link_subs[l as usize].is_empty() {
                // (A link left without flows changes no rate.)
                self.dirty.push(l);
            }
        }
        self.free_subs.push(s);
    }

    fn settle(&mut self, s: u32) {
        let now = self.now;
        let sub = &mut self.subs[s as usize];
        sub.remaining = (sub.remaining - sub.rate * (now - sub.t_upd)).max(0.0);
        sub.t_upd = now;
    }

    /// Live migration of every in-flight flow on NIC (node, rail).
    fn migrate(&mut self, node: u32, rail: u32) {
        let mut victims: Vec<u32> = Vec::new();
        for l in [self.fabric.nic_up(node, rail), self.fabric.nic_down(node, rail)] {
            victims.extend(self.link_subs[l as usize].iter().copied());
        }
        victims.sort_unstable_by_key(|&s| self.subs[s as usize].serial);
        victims.dedup();
        let mut parts = Vec::new();
        for s in victims {
            self.settle(s);
            let (task, remaining, orig, sw, single) = {
                let sub = &self.subs[s as usize];
                (sub.task, sub.remaining, sub.orig, sub.weight, sub.single)
            };
            let Some((src, dst, _, rails)) = self.op(task).transfer() else {
                continue;
            };
            let sent = orig - remaining;
            let chunk = self.cfg.replay_chunk_bytes;
            let replay = if chunk > 0.0 { sent % chunk } else { 0.0 };
            self.replayed += replay;
            let bytes = remaining + replay;
            self.kill_sub(s);
            self.resolve(src, dst, rails, &mut parts);
            let total: f64 = parts.iter().map(|p| p.2).sum();
            if single {
                self.left[task as usize] = parts.len() as u32;
            } else {
                self.left[task as usize] += parts.len() as u32 - 1;
            }
            for &(rs, rd, w) in &parts {
                self.add_sub(task, src, dst, rs, rd, bytes * w / total, sw * w / total);
            }
        }
    }

    fn result(&self) -> RunResult {
        let stalled = self.done < self.tasks.len();
        let finish = self.finish.clone();
        let makespan = if stalled { self.now } else { finish.iter().copied().fold(0.0, f64::max) };
        RunResult {
            makespan,
            finish,
            stalled,
            flows: self.created as usize,
            events: self.events,
            replayed_bytes: self.replayed,
        }
    }
}
