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

/// Index of a task in a [`Dag`].
pub type TaskId = u32;

/// Bit mask of rails a transfer may use (bit r = rail r).
pub type RailMask = u64;

/// Every rail.
pub const ALL_RAILS: RailMask = u64::MAX;

/// One unit of work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// Compute or fixed delay of this many seconds.
    Delay(f64),
    /// Move `bytes` from `src` to `dst`, spread over the usable rails of `rails` weighted by bandwidth.
    Transfer {
        /// Sending GPU.
        src: Endpoint,
        /// Receiving GPU.
        dst: Endpoint,
        /// Payload, bytes.
        bytes: f64,
        /// Rails the schedule assigned to this transfer.
        rails: RailMask,
        /// Weight in weighted max-min sharing (its target rate in any common unit; schedules use
        /// bytes times the number of transfers of its kind that run one after another on a link).
        weight: f64,
    },
    /// Move `bytes` from `src` to `dst` leaving on NIC `src_rail` of the sending node and arriving on NIC
    /// `dst_rail` of the receiving node (through the spine when they differ): one part of a schedule's
    /// [`r2ccl_algo::RailSplit`]. If either NIC is known failed when the flow starts or while it runs, the
    /// flow is moved like a [`Op::Transfer`] on those two rails under the run's [`RepairMode`].
    Pinned {
        /// Sending GPU.
        src: Endpoint,
        /// Receiving GPU.
        dst: Endpoint,
        /// Payload, bytes.
        bytes: f64,
        /// Rail of the sending node's NIC.
        src_rail: u32,
        /// Rail of the receiving node's NIC.
        dst_rail: u32,
        /// Weight in weighted max-min sharing.
        weight: f64,
    },
}

impl Op {
    /// `(src, dst, bytes, rails)` of a transfer (pinned transfers: the mask of their two rails).
    fn transfer(&self) -> Option<(Endpoint, Endpoint, f64, RailMask)> {
        match *self {
            Op::Delay(_) => None,
            Op::Transfer { src, dst, bytes, rails, .. } => Some((src, dst, bytes, rails)),
            Op::Pinned { src, dst, bytes, src_rail, dst_rail, .. } => {
                Some((src, dst, bytes, (1u64 << src_rail.min(63)) | (1u64 << dst_rail.min(63))))
            }
        }
    }
}

/// A DAG of tasks: a task starts when all its dependencies have finished.
///
/// Transfers may also belong to a *queue* ([`Dag::add_queued`]): one connection (a queue pair) that carries its
/// transfers one at a time in the order they become ready, as a NIC serves the work requests of one queue pair
/// in posting order.
///
/// Tasks that do the same thing (every barrier, and the ops a builder interns with [`Dag::intern`], such as the
/// many transfers of a schedule between the same two GPUs on the same rails with the same size) share one entry
/// of a table of ops, so that a task takes a few bytes: the engine walks millions of them in an order far from the
/// order they were added in.
#[derive(Clone, Debug, Default)]
pub struct Dag {
    /// Per task: its op's index in `table`.
    op_of: Vec<u32>,
    /// The ops: one entry per [`Dag::intern`]ed op, and one per task added with [`Dag::add`] or
    /// [`Dag::add_queued`].
    table: Vec<Op>,
    /// Index in `table` by [`op_key`].
    index: r2ccl_core::fastmap::IntMap<OpKey, u32>,
    /// Index in `table` of a barrier's op, once there is one.
    barrier_op: Option<u32>,
    edges: Vec<(TaskId, TaskId)>,
    /// Queue of each task (`NO_QUEUE`: none); empty while no task has one.
    queue: Vec<u32>,
    /// Number of queues in use (largest id + 1).
    queues: u32,
}

/// Queue id of a task that is in no queue.
const NO_QUEUE: u32 = u32::MAX;

/// An op in the table of distinct ops of the [`Dag`] that made it ([`Dag::intern`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpId(u32);

/// An op as integers (kind, endpoints, rails, and the bits of its numbers): equal keys are the same op, bit for
/// bit.
type OpKey = (u32, [u32; 6], [u64; 3]);

fn op_key(op: &Op) -> OpKey {
    match *op {
        Op::Delay(d) => (0, [0; 6], [d.to_bits(), 0, 0]),
        Op::Transfer { src, dst, bytes, rails, weight } => {
            (1, [src.node, src.gpu, dst.node, dst.gpu, 0, 0], [bytes.to_bits(), rails, weight.to_bits()])
        }
        Op::Pinned { src, dst, bytes, src_rail, dst_rail, weight } => {
            (2, [src.node, src.gpu, dst.node, dst.gpu, src_rail, dst_rail], [bytes.to_bits(), 0, weight.to_bits()])
        }
    }
}

impl Dag {
    /// An empty DAG.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `op` after all of `deps`; returns its id. The op gets an entry of its own in the table (no look-up:
    /// builders whose ops rarely repeat pay nothing for sharing); [`Dag::intern`] shares entries.
    pub fn add(&mut self, op: Op, deps: &[TaskId]) -> TaskId {
        self.table.push(op);
        let op = OpId(self.table.len() as u32 - 1);
        self.add_interned(op, deps, None)
    }

    /// `op`'s entry in this DAG's table of distinct ops (added if it is new): adding tasks by it
    /// ([`Dag::add_interned`]) saves looking the op up once per task.
    pub fn intern(&mut self, op: Op) -> OpId {
        let table = &mut self.table;
        OpId(*self.index.entry(op_key(&op)).or_insert_with(|| {
            table.push(op);
            table.len() as u32 - 1
        }))
    }

    /// Add the task `op` (from this DAG's [`Dag::intern`]) after all of `deps`, on connection `queue` if any (see
    /// [`Dag::add_queued`]); returns its id.
    pub fn add_interned(&mut self, op: OpId, deps: &[TaskId], queue: Option<u32>) -> TaskId {
        let id = self.op_of.len() as TaskId;
        self.op_of.push(op.0);
        for &d in deps {
            self.edges.push((d, id));
        }
        if let Some(q) = queue.filter(|&q| q != NO_QUEUE) {
            self.queue.resize(self.op_of.len(), NO_QUEUE);
            self.queue[id as usize] = q;
            self.queues = self.queues.max(q + 1);
        }
        id
    }

    /// Add transfer `op` after all of `deps`, carried by connection `queue` (any id below `u32::MAX`): once its
    /// dependencies are done it waits until the transfers of that queue that became ready before it have
    /// finished.
    pub fn add_queued(&mut self, op: Op, deps: &[TaskId], queue: u32) -> TaskId {
        self.table.push(op);
        let op = OpId(self.table.len() as u32 - 1);
        self.add_interned(op, deps, Some(queue))
    }

    /// A zero-length task after all of `deps` (a barrier).
    pub fn barrier(&mut self, deps: &[TaskId]) -> TaskId {
        let op = match self.barrier_op {
            Some(at) => OpId(at),
            None => {
                let op = self.intern(Op::Delay(0.0));
                self.barrier_op = Some(op.0);
                op
            }
        };
        self.add_interned(op, deps, None)
    }

    /// Add a dependency `before -> after` to existing tasks.
    pub fn depend(&mut self, before: TaskId, after: TaskId) {
        self.edges.push((before, after));
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.op_of.len()
    }

    /// Whether the DAG has no task.
    pub fn is_empty(&self) -> bool {
        self.op_of.is_empty()
    }

    /// What task `task` does (`None` past the last task).
    pub fn op(&self, task: TaskId) -> Option<Op> {
        let at = *self.op_of.get(task as usize)?;
        self.table.get(at as usize).copied()
    }

    /// The dependencies `(before, after)`, in the order they were added.
    pub fn edges(&self) -> &[(TaskId, TaskId)] {
        &self.edges
    }

    /// The tasks' ops, in task order.
    pub fn ops(&self) -> impl Iterator<Item = Op> + '_ {
        self.op_of.iter().filter_map(|&at| self.table.get(at as usize).copied())
    }
}

/// How a transfer whose assigned rails are all known-failed is routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepairMode {
    /// No resilience: the transfer keeps its failed path and stalls (fail-stop CCL).
    None,
    /// Hot repair with one backup NIC: the next healthy rail (same rail on both ends).
    SingleBackup,
    /// Balance: spread over every rail usable on both ends, weighted by bandwidth.
    Spread,
}

/// What goes wrong with one NIC.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum FailureKind {
    /// Link down with an error completion: detected after `detect_error_s`.
    Down,
    /// Silent black hole: packets vanish, detected after the stall timeout.
    BlackHole,
    /// Degraded speed: the NIC keeps `fraction` of its line rate.
    Degraded {
        /// Remaining fraction of the line rate, in (0, 1).
        fraction: f64,
    },
}

/// The kinds as written in scenario files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindName {
    Down,
    BlackHole,
    Degraded,
}

/// A failure as written in a scenario file (flat, unknown keys rejected).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FailureToml {
    node: u32,
    rail: u32,
    kind: KindName,
    #[serde(default)]
    fraction: Option<f64>,
    at_s: f64,
    #[serde(default)]
    until_s: Option<f64>,
}

impl TryFrom<FailureToml> for Failure {
    type Error = String;
    fn try_from(t: FailureToml) -> Result<Self, String> {
        let kind = match (t.kind, t.fraction) {
            (KindName::Down, None) => FailureKind::Down,
            (KindName::BlackHole, None) => FailureKind::BlackHole,
            (KindName::Degraded, Some(fraction)) => FailureKind::Degraded { fraction },
            (KindName::Degraded, None) => return Err("failure kind `degraded` needs `fraction`".into()),
            (k, Some(_)) => return Err(format!("`fraction` is only for kind `degraded`, not {k:?}")),
        };
        Ok(Failure { node: t.node, rail: t.rail, kind, at_s: t.at_s, until_s: t.until_s })
    }
}

impl From<Failure> for FailureToml {
    fn from(f: Failure) -> Self {
        let (kind, fraction) = match f.kind {
            FailureKind::Down => (KindName::Down, None),
            FailureKind::BlackHole => (KindName::BlackHole, None),
            FailureKind::Degraded { fraction } => (KindName::Degraded, Some(fraction)),
        };
        Self { node: f.node, rail: f.rail, kind, fraction, at_s: f.at_s, until_s: f.until_s }
    }
}

/// One failure of NIC `rail` on `node` between `at_s` and `until_s`.
///
/// In scenario files: `{ node, rail, kind = "down" | "black_hole" | "degraded", fraction (degraded only),
/// at_s, until_s (optional) }`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "FailureToml", into = "FailureToml")]
pub struct Failure {
    /// Node index.
    pub node: u32,
    /// Rail (NIC index) on that node.
    pub rail: u32,
    /// What happens.
    pub kind: FailureKind,
    /// Start, seconds from the start of the run (negative: already failed and known at the start).
    pub at_s: f64,
    /// End (NIC back), if it comes back.
    pub until_s: Option<f64>,
}

impl Failure {
    /// A NIC that is down (and known) before the run starts.
    pub fn known_down(node: u32, rail: u32) -> Self {
        Self { node, rail, kind: FailureKind::Down, at_s: -1.0e6, until_s: None }
    }

    /// A NIC that goes down at `at_s` for good.
    pub fn down_at(node: u32, rail: u32, at_s: f64) -> Self {
        Self { node, rail, kind: FailureKind::Down, at_s, until_s: None }
    }

    /// Remaining capacity fraction while failed.
    pub fn remaining(&self) -> f64 {
        match self.kind {
            FailureKind::Down | FailureKind::BlackHole => 0.0,
            FailureKind::Degraded { fraction } => fraction,
        }
    }

    /// Check the failure against the fabric shape, naming what is wrong.
    pub fn validate(&self, fabric: &Fabric, index: usize) -> Result<(), SimError> {
        let s = fabric.spec();
        if self.node >= s.nodes {
            return Err(SimError::NoSuchComponent {
                index,
                what: format!("node {} (the fabric has {} nodes)", self.node, s.nodes),
            });
        }
        if self.rail >= s.nics_per_node {
            return Err(SimError::NoSuchComponent {
                index,
                what: format!("NIC rail {} on node {} (nodes have {} NICs)", self.rail, self.node, s.nics_per_node),
            });
        }
        if let FailureKind::Degraded { fraction } = self.kind {
            if !(fraction > 0.0 && fraction < 1.0) {
                return Err(SimError::BadFailure { index, why: format!("degraded fraction {fraction} not in (0, 1)") });
            }
        }
        if !self.at_s.is_finite() {
            return Err(SimError::BadFailure { index, why: format!("at_s {} is not finite", self.at_s) });
        }
        if let Some(u) = self.until_s {
            if !(u.is_finite() && u > self.at_s) {
                return Err(SimError::BadFailure {
                    index,
                    why: format!("until_s {u} is not after at_s {}", self.at_s),
                });
            }
        }
        Ok(())
    }
}

/// How concurrent flows share the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharing {
    /// Weighted max-min fairness on every link (progressive filling): what a NIC does between queue pairs.
    #[default]
    MaxMin,
    /// The port model of `r2ccl_algo::simulate`, for cross-checking: every NIC uplink and downlink is a port that
    /// serves one flow at a time, a flow starts only when the ports on its path are idle (waiting flows are
    /// served in the order they started, skipping those whose ports are busy) and then runs to the end at its
    /// path's bottleneck capacity; NVLink and spine links are not shared. Queues of the DAG are not needed (a
    /// port keeps the order) and are ignored.
    Ports,
}

/// Engine settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// How transfers on known-failed rails are moved.
    pub repair: RepairMode,
    /// How concurrent flows share links.
    #[serde(default)]
    pub sharing: Sharing,
    /// Detection delay of a link-down with an error completion, seconds.
    #[serde(default = "d_err")]
    pub detect_error_s: f64,
    /// Detection delay of a silent black hole (the stall timeout), seconds.
    #[serde(default = "d_bh")]
    pub detect_blackhole_s: f64,
    /// Delay before a degraded NIC's measured bandwidth is used for weighting, seconds.
    #[serde(default = "d_deg")]
    pub detect_degraded_s: f64,
    /// Delay before a recovered NIC is trusted again (probes with hysteresis), seconds.
    #[serde(default = "d_rec")]
    pub recover_detect_s: f64,
    /// Chunk size of the replay boundary, bytes: a migrated flow resends its partially sent chunk.
    #[serde(default = "d_chunk")]
    pub replay_chunk_bytes: f64,
}

fn d_err() -> f64 {
    0.005
}
fn d_bh() -> f64 {
    0.05
}
fn d_deg() -> f64 {
    0.1
}
fn d_rec() -> f64 {
    1.0
}
fn d_chunk() -> f64 {
    4.0 * 1024.0 * 1024.0
}

impl EngineConfig {
    /// Defaults with the given repair mode.
    pub fn with_repair(repair: RepairMode) -> Self {
        Self {
            repair,
            sharing: Sharing::MaxMin,
            detect_error_s: d_err(),
            detect_blackhole_s: d_bh(),
            detect_degraded_s: d_deg(),
            recover_detect_s: d_rec(),
            replay_chunk_bytes: d_chunk(),
        }
    }
}

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

/// Pending flow completions, at most one per flow: a binary min-heap on (time, sequence number) that knows each
/// flow's position, so a flow whose rate changes moves its entry instead of leaving a stale one behind. Keys are
/// unique (sequence numbers are), so the order of pops does not depend on the heap's shape.
#[derive(Debug, Default)]
struct Completions {
    /// (time as [`time_key`], sequence number, flow).
    heap: Vec<(u64, u64, u32)>,
    /// Per flow: its index in `heap`, or `ABSENT`.
    pos: Vec<u32>,
}

/// A flow with no pending completion.
const ABSENT: u32 = u32::MAX;

/// Children per node of the completion heap.
const ARITY: usize = 2;

/// An integer with the order of [`f64::total_cmp`].
fn time_key(t: f64) -> u64 {
    let b = t.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | 1 << 63
    }
}

/// The time of a [`time_key`].
fn key_time(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

impl Completions {
    fn is_before(a: &(u64, u64, u32), b: &(u64, u64, u32)) -> bool {
        (a.0, a.1) < (b.0, b.1)
    }

    /// Make flow `s`'s completion due at `t`, with sequence number `seq`.
    fn set(&mut self, s: u32, t: f64, seq: u64) {
        let si = s as usize;
        if si >= self.pos.len() {
            self.pos.resize(si + 1, ABSENT);
        }
        let item = (time_key(t), seq, s);
        match self.pos[si] {
            ABSENT => {
                self.heap.push(item);
                self.sift_up(self.heap.len() - 1, item);
            }
            p => {
                let i = p as usize;
                if Self::is_before(&item, &self.heap[i]) {
                    self.sift_up(i, item);
                } else {
                    self.sift_down(i, item);
                }
            }
        }
    }

    /// Drop flow `s`'s pending completion, if any.
    fn remove(&mut self, s: u32) {
        let Some(&p) = self.pos.get(s as usize) else { return };
        if p == ABSENT {
            return;
        }
        self.pos[s as usize] = ABSENT;
        let i = p as usize;
        let Some(last) = self.heap.pop() else { return };
        if i < self.heap.len() {
            // Move the hole at `i` down to a leaf along the earliest children, then put the last entry there and
            // let it rise: it usually belongs near the bottom, so this compares less than sifting it down.
            let mut h = i;
            while let Some(m) = self.earliest_child(h) {
                let child = self.heap[m];
                self.heap[h] = child;
                self.pos[child.2 as usize] = h as u32;
                h = m;
            }
            self.sift_up(h, last);
        }
    }

    /// The earliest of the children of heap slot `h`, if it has any.
    fn earliest_child(&self, h: usize) -> Option<usize> {
        let n = self.heap.len();
        let first = ARITY * h + 1;
        if first >= n {
            return None;
        }
        let mut m = first;
        for c in first + 1..(first + ARITY).min(n) {
            if Self::is_before(&self.heap[c], &self.heap[m]) {
                m = c;
            }
        }
        Some(m)
    }

    /// The earliest pending completion.
    fn first(&self) -> Option<(f64, u64, u32)> {
        self.heap.first().map(|&(k, seq, s)| (key_time(k), seq, s))
    }

    /// Put `item` at the hole `i` or above it, moving the later parents down.
    fn sift_up(&mut self, mut i: usize, item: (u64, u64, u32)) {
        while i > 0 {
            let p = (i - 1) / ARITY;
            let parent = self.heap[p];
            if !Self::is_before(&item, &parent) {
                break;
            }
            self.heap[i] = parent;
            self.pos[parent.2 as usize] = i as u32;
            i = p;
        }
        self.heap[i] = item;
        self.pos[item.2 as usize] = i as u32;
    }

    /// Put `item` at the hole `i` or below it, moving the earliest children up.
    fn sift_down(&mut self, mut i: usize, item: (u64, u64, u32)) {
        while let Some(m) = self.earliest_child(i) {
            let child = self.heap[m];
            if !Self::is_before(&child, &item) {
                break;
            }
            self.heap[i] = child;
            self.pos[child.2 as usize] = i as u32;
            i = m;
        }
        self.heap[i] = item;
        self.pos[item.2 as usize] = i as u32;
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

    /// Recompute max-min fair rates in the components touched by dirty links.
    fn recompute(&mut self) {
        self.gen = self.gen.wrapping_add(1);
        if self.gen == 0 {
            self.link_mark.iter_mut().for_each(|m| *m = 0);
            self.sub_mark.iter_mut().for_each(|m| *m = 0);
            self.frozen.iter_mut().for_each(|m| *m = 0);
            self.gen = 1;
        }
        let gen = self.gen;
        self.comp_links.clear();
        self.comp_subs.clear();
        let mut dirty = std::mem::take(&mut self.dirty);
        for &l in &dirty {
            if self.link_mark[l as usize] == gen {
                continue;
            }
            if self.live[l as usize] > 0 {
                self.link_mark[l as usize] = gen;
                self.stack.push(l);
            } else {
                // A gated link that just stopped taking part: its flows' components change, but it is no
                // constraint of them (and stays unmarked).
                for i in 0..self.link_subs[l as usize].len() {
                    let s = self.link_subs[l as usize][i];
                    self.visit_sub(s, gen);
                }
            }
        }
        dirty.clear();
        self.dirty = dirty;
        while let Some(l) = self.stack.pop() {
            self.comp_links.push(l);
            for i in 0..self.link_subs[l as usize].len() {
                let s = self.link_subs[l as usize][i];
                self.visit_sub(s, gen);
            }
        }
        for i in 0..self.comp_subs.len() {
            let s = self.comp_subs[i];
            self.settle(s);
            let sub = &mut self.subs[s as usize];
            sub.prev_rate = sub.rate;
        }
        match self.cfg.sharing {
            Sharing::MaxMin => self.fill_max_min(gen),
            Sharing::Ports => self.fill_ports(),
        }
        for i in 0..self.comp_subs.len() {
            let s = self.comp_subs[i];
            let sub = &mut self.subs[s as usize];
            if sub.queued && sub.rate == sub.prev_rate {
                // Its queued completion is still right.
                continue;
            }
            // A new version: the completion it had at its old rate no longer counts.
            sub.ver = sub.ver.wrapping_add(1);
            let (rate, rem) = (sub.rate, sub.remaining);
            sub.queued = rem <= 0.0 || rate > 0.0;
            self.seq += 1;
            if rem <= 0.0 {
                self.completions.set(s, self.now, self.seq);
            } else if rate > 0.0 {
                self.completions.set(s, self.now + rem / rate, self.seq);
            } else {
                self.completions.remove(s);
            }
        }
    }

    /// Add flow `s` to the current component (unless it is in already) and its live links to the search.
    fn visit_sub(&mut self, s: u32, gen: u32) {
        if self.sub_mark[s as usize] == gen {
            return;
        }
        self.sub_mark[s as usize] = gen;
        self.comp_subs.push(s);
        let sub = &self.subs[s as usize];
        for j in sub.path_start as usize..sub.path_start as usize + sub.path_len as usize {
            let l2 = self.paths[j];
            if self.link_mark[l2 as usize] != gen && self.live[l2 as usize] > 0 {
                self.link_mark[l2 as usize] = gen;
                self.stack.push(l2);
            }
        }
    }

    /// [`Sharing::Ports`] in the current component: flows holding their ports keep their path's bottleneck
    /// capacity; the others, oldest first, take their ports when all are idle and wait otherwise.
    fn fill_ports(&mut self) {
        let subs = &self.subs;
        self.comp_subs.sort_unstable_by(|&a, &b| {
            let (x, y) = (&subs[a as usize], &subs[b as usize]);
            x.born.total_cmp(&y.born).then(x.task.cmp(&y.task)).then(x.serial.cmp(&y.serial))
        });
        for &l in &self.comp_links {
            self.cnt[l as usize] = 0;
        }
        for i in 0..self.comp_subs.len() {
            let sub = &self.subs[self.comp_subs[i] as usize];
            if sub.serving {
                for j in sub.path_start as usize..sub.path_start as usize + sub.path_len as usize {
                    self.cnt[self.paths[j] as usize] = 1;
                }
            }
        }
        for i in 0..self.comp_subs.len() {
            let s = self.comp_subs[i] as usize;
            let (a, b) =
                (self.subs[s].path_start as usize, self.subs[s].path_start as usize + self.subs[s].path_len as usize);
            if !self.subs[s].serving {
                let idle = (a..b).all(|j| {
                    let l = self.paths[j] as usize;
                    !self.is_port[l] || self.cnt[l] == 0
                });
                if !idle {
                    self.subs[s].rate = 0.0;
                    continue;
                }
                for j in a..b {
                    self.cnt[self.paths[j] as usize] = 1;
                }
                self.subs[s].serving = true;
            }
            self.subs[s].rate = (a..b).map(|j| self.cap[self.paths[j] as usize]).fold(f64::INFINITY, f64::min);
        }
    }

    /// Weighted max-min fair rates (progressive filling) in the current component.
    fn fill_max_min(&mut self, gen: u32) {
        if self.alone_ok && self.comp_links.iter().all(|&l| self.link_subs[l as usize].len() <= 1) {
            self.fill_alone(gen);
            return;
        }
        // Progressive filling.
        let mut active = std::mem::take(&mut self.active);
        active.clear();
        for &l in &self.comp_links {
            let n = self.link_subs[l as usize].len() as u32;
            if n > 0 {
                self.cap_rem[l as usize] = self.cap[l as usize];
                self.cnt[l as usize] = n;
                self.wsum[l as usize] = self.link_subs[l as usize].iter().map(|&s| self.subs[s as usize].weight).sum();
                active.push(l);
            }
        }
        let mut unfrozen = self.comp_subs.len();
        while unfrozen > 0 && !active.is_empty() {
            self.round = self.round.wrapping_add(1);
            if self.round == 0 {
                self.touched.iter_mut().for_each(|m| *m = 0);
                self.round = 1;
            }
            let round = self.round;
            let mut best = f64::INFINITY;
            for &l in &active {
                let share = self.cap_rem[l as usize].max(0.0) / self.wsum[l as usize];
                self.share[l as usize] = share;
                best = best.min(share);
            }
            let lim = best * (1.0 + 1e-9);
            let mut i = 0;
            while i < active.len() {
                let l = active[i];
                // The share as of now: the one computed above unless a flow frozen since changed the link.
                let share = if self.touched[l as usize] == round {
                    self.cap_rem[l as usize].max(0.0) / self.wsum[l as usize]
                } else {
                    self.share[l as usize]
                };
                if share <= lim {
                    for k in 0..self.link_subs[l as usize].len() {
                        let s = self.link_subs[l as usize][k];
                        if self.frozen[s as usize] == gen {
                            continue;
                        }
                        self.frozen[s as usize] = gen;
                        unfrozen -= 1;
                        let w = self.subs[s as usize].weight;
                        let rate = best * w;
                        self.subs[s as usize].rate = rate;
                        let sub = &self.subs[s as usize];
                        for j in sub.path_start as usize..sub.path_start as usize + sub.path_len as usize {
                            let l2 = self.paths[j] as usize;
                            if self.link_mark[l2] != gen {
                                // A gated link out of the computation.
                                continue;
                            }
                            self.cap_rem[l2] -= rate;
                            self.cnt[l2] -= 1;
                            self.wsum[l2] -= w;
                            self.touched[l2] = round;
                        }
                    }
                }
                i += 1;
            }
            active.retain(|&l| self.cnt[l as usize] > 0);
        }
        self.active = active;
    }

    /// [`Sim::fill_max_min`] when no two flows of the component share a link: the same rounds, computed per flow.
    /// A link's share is then its capacity over its one flow's weight, and freezing a flow touches no other
    /// flow's links, so a round freezes (at the round's least share times its weight) every flow whose least
    /// share is within the tolerance of that round's least share.
    fn fill_alone(&mut self, gen: u32) {
        // Per flow with a link in the computation: its least share, or `NAN` once it is frozen.
        let mut least = std::mem::take(&mut self.least);
        least.clear();
        let mut unfrozen = 0usize;
        for &s in &self.comp_subs {
            let sub = &self.subs[s as usize];
            let mut m = f64::INFINITY;
            let mut any = false;
            for j in sub.path_start as usize..sub.path_start as usize + sub.path_len as usize {
                let l = self.paths[j] as usize;
                if self.link_mark[l] == gen {
                    // (The weight summed over the link's one flow is that weight, exactly.)
                    m = m.min(self.cap[l].max(0.0) / sub.weight);
                    any = true;
                }
            }
            least.push(if any { m } else { f64::NAN });
            unfrozen += usize::from(any);
        }
        while unfrozen > 0 {
            let best = least.iter().copied().filter(|m| !m.is_nan()).fold(f64::INFINITY, f64::min);
            let lim = best * (1.0 + 1e-9);
            for (i, m) in least.iter_mut().enumerate() {
                if *m <= lim {
                    let sub = &mut self.subs[self.comp_subs[i] as usize];
                    sub.rate = best * sub.weight;
                    *m = f64::NAN;
                    unfrozen -= 1;
                }
            }
        }
        self.least = least;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::FabricSpec;

    fn fab(nodes: u32, nics: u32) -> Fabric {
        let mut s = FabricSpec::new(nodes, 1, nics, 8.0); // 1 GB/s per NIC
        s.nic_latency_us = 0.0;
        s.nvlink_latency_us = 0.0;
        Fabric::new(s).unwrap()
    }

    #[test]
    fn completions_pop_in_time_then_sequence_order_after_moves_and_removals() {
        // Random sets (new and moved entries) and removals against a plain sorted reference.
        let mut c = Completions::default();
        let mut reference: std::collections::BTreeMap<u32, (f64, u64)> = std::collections::BTreeMap::new();
        let mut x: u64 = 12345;
        let mut next = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            x >> 33
        };
        for seq in 0..20_000u64 {
            let s = (next() % 300) as u32;
            if next() % 4 == 0 {
                c.remove(s);
                reference.remove(&s);
            } else {
                // Few distinct times, so that ties are decided by the sequence number.
                let t = (next() % 50) as f64 * 0.25 - 3.0;
                c.set(s, t, seq);
                reference.insert(s, (t, seq));
            }
            if seq % 7 == 0 {
                let want = reference
                    .iter()
                    .map(|(&s, &(t, q))| (t, q, s))
                    .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                assert_eq!(c.first(), want, "step {seq}");
                if let Some((_, _, s)) = want {
                    c.remove(s);
                    reference.remove(&s);
                }
            }
        }
        assert_eq!(c.heap.len(), reference.len());
    }

    #[test]
    fn time_keys_order_like_total_cmp_and_give_the_time_back() {
        let ts = [f64::NEG_INFINITY, -1e300, -2.5, -1e-300, -0.0, 0.0, 1e-300, 1e-12, 0.25, 2.5, 1e300, f64::INFINITY];
        for (i, a) in ts.iter().enumerate() {
            assert_eq!(key_time(time_key(*a)).to_bits(), a.to_bits());
            for b in &ts[i + 1..] {
                assert_eq!(time_key(*a).cmp(&time_key(*b)), a.total_cmp(b), "{a} {b}");
            }
        }
    }

    #[test]
    fn two_flows_share_a_link_fairly() {
        let f = fab(3, 1);
        let mut dag = Dag::new();
        let a = Endpoint::new(0, 0);
        dag.add(Op::Transfer { src: a, dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 }, &[]);
        dag.add(Op::Transfer { src: a, dst: Endpoint::new(2, 0), bytes: 2e9, rails: 1, weight: 1.0 }, &[]);
        let r = simulate(&f, &dag, &[], &EngineConfig::with_repair(RepairMode::None)).unwrap();
        // Both at 0.5 GB/s until the first finishes at 2 s, then the second alone: 1e9 left at 1 GB/s.
        assert!((r.finish[0] - 2.0).abs() < 1e-9, "{:?}", r.finish);
        assert!((r.finish[1] - 3.0).abs() < 1e-9, "{:?}", r.finish);
    }

    #[test]
    fn ports_serve_one_flow_at_a_time() {
        let f = fab(3, 1);
        let mut dag = Dag::new();
        let a = Endpoint::new(0, 0);
        dag.add(Op::Transfer { src: a, dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 }, &[]);
        dag.add(Op::Transfer { src: a, dst: Endpoint::new(2, 0), bytes: 2e9, rails: 1, weight: 1.0 }, &[]);
        let cfg = EngineConfig { sharing: Sharing::Ports, ..EngineConfig::with_repair(RepairMode::None) };
        let r = simulate(&f, &dag, &[], &cfg).unwrap();
        // The first flow holds node 0's uplink for 1 s, then the second runs alone for 2 s.
        assert!((r.finish[0] - 1.0).abs() < 1e-9, "{:?}", r.finish);
        assert!((r.finish[1] - 3.0).abs() < 1e-9, "{:?}", r.finish);
    }

    #[test]
    fn a_queue_carries_its_transfers_one_at_a_time_in_ready_order() {
        let f = fab(2, 1);
        let (a, b) = (Endpoint::new(0, 0), Endpoint::new(1, 0));
        let op = Op::Transfer { src: a, dst: b, bytes: 1e9, rails: 1, weight: 1.0 };
        let mut dag = Dag::new();
        let d = dag.add(Op::Delay(0.5), &[]);
        // Added first but ready at 0.5 s: it waits for the transfer that was ready at 0 s.
        let late = dag.add_queued(op, &[d], 7);
        let early = dag.add_queued(op, &[], 7);
        let r = simulate(&f, &dag, &[], &EngineConfig::with_repair(RepairMode::None)).unwrap();
        assert!((r.finish[early as usize] - 1.0).abs() < 1e-9, "{:?}", r.finish);
        assert!((r.finish[late as usize] - 2.0).abs() < 1e-9, "{:?}", r.finish);
        // Without the queue they share the link from 0.5 s on.
        let mut dag = Dag::new();
        let d = dag.add(Op::Delay(0.5), &[]);
        let late = dag.add(op, &[d]);
        let early = dag.add(op, &[]);
        let r = simulate(&f, &dag, &[], &EngineConfig::with_repair(RepairMode::None)).unwrap();
        assert!((r.finish[early as usize] - 1.5).abs() < 1e-9, "{:?}", r.finish);
        assert!((r.finish[late as usize] - 2.0).abs() < 1e-9, "{:?}", r.finish);
    }

    #[test]
    fn leaving_out_links_that_cannot_bind_changes_nothing() {
        // PXN traffic between 4-NIC nodes: NVLink (4 x 100 Gbit/s <= nvlink) and the spine are left out of the
        // sharing computation. A tiny intra-node transfer elsewhere keeps them in; the times must not move.
        let mut s = FabricSpec::new(3, 4, 4, 100.0);
        s.nvlink_gbps = 400.0;
        let f = Fabric::new(s).unwrap();
        let build = |intra: bool| {
            let mut dag = Dag::new();
            for (i, (src, dst, sr, dr)) in
                [(0u32, 1u32, 0u32, 1u32), (0, 2, 1, 1), (1, 2, 2, 3), (2, 0, 3, 0), (0, 1, 2, 2)]
                    .into_iter()
                    .enumerate()
            {
                let bytes = 1e8 * (i + 1) as f64;
                let op = Op::Pinned {
                    src: Endpoint::new(src, 0),
                    dst: Endpoint::new(dst, 3),
                    bytes,
                    src_rail: sr,
                    dst_rail: dr,
                    weight: 1.0,
                };
                dag.add(op, &[]);
            }
            if intra {
                let op = Op::Transfer {
                    src: Endpoint::new(2, 1),
                    dst: Endpoint::new(2, 2),
                    bytes: 1.0,
                    rails: 0,
                    weight: 1.0,
                };
                dag.add(op, &[]);
            }
            dag
        };
        let cfg = EngineConfig::with_repair(RepairMode::Spread);
        let fails = [Failure::known_down(1, 0)];
        let lean = simulate(&f, &build(false), &fails, &cfg).unwrap();
        let full = simulate(&f, &build(true), &fails, &cfg).unwrap();
        for i in 0..5 {
            assert!(
                (lean.finish[i] / full.finish[i] - 1.0).abs() < 1e-9,
                "{i}: {:?} vs {:?}",
                lean.finish,
                full.finish
            );
        }
    }

    #[test]
    fn gating_nvlink_links_changes_nothing() {
        // Intra-node transfers (some on NVLink links that PXN hops use as well, some alone), PXN transfers in
        // chains, a NIC known down and one failing during the run: every finish time agrees with the run that
        // keeps every NVLink link in the sharing computation.
        let mut s = FabricSpec::new(4, 4, 4, 100.0);
        s.nvlink_gbps = 400.0;
        let f = Fabric::new(s).unwrap();
        let mut dag = Dag::new();
        let mut x: u64 = 7;
        let mut next = |m: u64| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 33) % m
        };
        let mut prev: Vec<TaskId> = Vec::new();
        for i in 0..400u32 {
            let (sn, sg) = (next(4) as u32, next(4) as u32);
            let intra = next(3) == 0;
            let dn = if intra { sn } else { (sn + 1 + next(3) as u32) % 4 };
            let dg = if intra { (sg + 1 + next(3) as u32) % 4 } else { next(4) as u32 };
            let bytes = 1e5 * (1 + next(40)) as f64;
            let (src, dst) = (Endpoint::new(sn, sg), Endpoint::new(dn, dg));
            let op = if intra {
                Op::Transfer { src, dst, bytes, rails: 0, weight: 1.0 }
            } else {
                let (src_rail, dst_rail) = (next(4) as u32, next(4) as u32);
                Op::Pinned { src, dst, bytes, src_rail, dst_rail, weight: 1.0 }
            };
            let deps: Vec<TaskId> = prev.iter().rev().take(next(3) as usize).copied().collect();
            let t = if next(2) == 0 { dag.add_queued(op, &deps, i % 7) } else { dag.add(op, &deps) };
            prev.push(t);
        }
        let fails = [Failure::known_down(1, 2), Failure::down_at(2, 1, 2e-4)];
        for repair in [RepairMode::Spread, RepairMode::SingleBackup] {
            let cfg = EngineConfig::with_repair(repair);
            let gated = run_with(&f, &dag, &fails, &cfg, Shortcuts { gate_nvlink: true, fill_alone: false }).unwrap();
            let full = run_with(&f, &dag, &fails, &cfg, Shortcuts { gate_nvlink: false, fill_alone: false }).unwrap();
            assert_eq!(gated.flows, full.flows);
            for (i, (a, b)) in gated.finish.iter().zip(&full.finish).enumerate() {
                assert!((a / b - 1.0).abs() < 1e-12, "task {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn filling_flows_that_share_no_link_one_by_one_changes_nothing() {
        // Transfers between node pairs on their own rails (each alone on its links) and, later, some that share
        // a NIC, with rates that differ by less than the filling's tolerance (a NIC degraded to 1 - 1e-10) and by
        // more: the same finish times, bit for bit, with and without the shortcut.
        let f = fab(8, 4);
        let mut dag = Dag::new();
        let mut prev: Vec<TaskId> = Vec::new();
        for i in 0..200u32 {
            let (a, b) = (i % 8, (i * 3 + 1) % 8);
            let b = if a == b { (b + 1) % 8 } else { b };
            let rail = (i / 8) % 4;
            let bytes = 1e6 * f64::from(1 + i % 5) + f64::from(i);
            let op = Op::Pinned {
                src: Endpoint::new(a, 0),
                dst: Endpoint::new(b, 0),
                bytes,
                src_rail: rail,
                dst_rail: if i % 11 == 0 { (rail + 1) % 4 } else { rail },
                weight: if i % 7 == 0 { 0.5 } else { 1.0 },
            };
            let deps: Vec<TaskId> = prev.iter().rev().skip(usize::from(i % 3 == 0)).take(1).copied().collect();
            prev.push(if i % 2 == 0 { dag.add_queued(op, &deps, i % 5) } else { dag.add(op, &deps) });
        }
        let fails = [
            Failure {
                node: 2,
                rail: 1,
                kind: FailureKind::Degraded { fraction: 1.0 - 1e-10 },
                at_s: 0.0,
                until_s: None,
            },
            Failure { node: 5, rail: 3, kind: FailureKind::Degraded { fraction: 0.5 }, at_s: 0.01, until_s: None },
            Failure::down_at(6, 2, 0.02),
        ];
        for repair in [RepairMode::Spread, RepairMode::SingleBackup] {
            let cfg = EngineConfig::with_repair(repair);
            let fast = run_with(&f, &dag, &fails, &cfg, Shortcuts { gate_nvlink: true, fill_alone: true }).unwrap();
            let slow = run_with(&f, &dag, &fails, &cfg, Shortcuts { gate_nvlink: true, fill_alone: false }).unwrap();
            assert_eq!((fast.flows, fast.events), (slow.flows, slow.events));
            for (i, (a, b)) in fast.finish.iter().zip(&slow.finish).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "task {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn dependencies_and_delays_chain() {
        let f = fab(2, 1);
        let mut dag = Dag::new();
        let d = dag.add(Op::Delay(0.5), &[]);
        let t = dag.add(
            Op::Transfer { src: Endpoint::new(0, 0), dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 },
            &[d],
        );
        dag.add(Op::Delay(0.25), &[t]);
        let r = simulate(&f, &dag, &[], &EngineConfig::with_repair(RepairMode::None)).unwrap();
        assert!((r.makespan - 1.75).abs() < 1e-9);
    }

    #[test]
    fn failure_without_repair_stalls_and_with_repair_migrates() {
        let f = fab(2, 2);
        let mut dag = Dag::new();
        dag.add(
            Op::Transfer { src: Endpoint::new(0, 0), dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 },
            &[],
        );
        let fail = [Failure::down_at(0, 0, 0.5)];
        let r = simulate(&f, &dag, &fail, &EngineConfig::with_repair(RepairMode::None)).unwrap();
        assert!(r.stalled);
        let mut cfg = EngineConfig::with_repair(RepairMode::SingleBackup);
        cfg.replay_chunk_bytes = 0.0;
        let r = simulate(&f, &dag, &fail, &cfg).unwrap();
        assert!(!r.stalled);
        // 0.5 s at 1 GB/s, detection 5 ms stalled, then 0.5e9 on rail 1.
        assert!((r.makespan - 1.005).abs() < 1e-9, "{}", r.makespan);
    }

    #[test]
    fn nic_coming_back_resumes_a_stalled_flow() {
        let f = fab(2, 1);
        let mut dag = Dag::new();
        dag.add(
            Op::Transfer { src: Endpoint::new(0, 0), dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 },
            &[],
        );
        let fail = [Failure { node: 1, rail: 0, kind: FailureKind::BlackHole, at_s: 0.25, until_s: Some(0.75) }];
        let r = simulate(&f, &dag, &fail, &EngineConfig::with_repair(RepairMode::None)).unwrap();
        assert!((r.makespan - 1.5).abs() < 1e-9, "{}", r.makespan);
    }

    #[test]
    fn degraded_nic_slows_its_flows() {
        let f = fab(2, 1);
        let mut dag = Dag::new();
        dag.add(
            Op::Transfer { src: Endpoint::new(0, 0), dst: Endpoint::new(1, 0), bytes: 1e9, rails: 1, weight: 1.0 },
            &[],
        );
        let fail =
            [Failure { node: 0, rail: 0, kind: FailureKind::Degraded { fraction: 0.5 }, at_s: 0.0, until_s: None }];
        let r = simulate(&f, &dag, &fail, &EngineConfig::with_repair(RepairMode::Spread)).unwrap();
        assert!((r.makespan - 2.0).abs() < 1e-9, "{}", r.makespan);
    }

    #[test]
    fn pinned_parts_use_their_nics_and_move_when_one_fails() {
        let f = fab(2, 2);
        let mut dag = Dag::new();
        let (a, b) = (Endpoint::new(0, 0), Endpoint::new(1, 0));
        // Cross-rail 0 -> 1 and same-rail 1 -> 1 share node 1's NIC 1 downlink: 0.5 GB/s each.
        dag.add(Op::Pinned { src: a, dst: b, bytes: 1e9, src_rail: 0, dst_rail: 1, weight: 1.0 }, &[]);
        dag.add(Op::Pinned { src: a, dst: b, bytes: 1e9, src_rail: 1, dst_rail: 1, weight: 1.0 }, &[]);
        let r = simulate(&f, &dag, &[], &EngineConfig::with_repair(RepairMode::None)).unwrap();
        assert!((r.makespan - 2.0).abs() < 1e-9, "{}", r.makespan);
        // A pinned part on a NIC known dead at the start is spread over the rails alive at both ends.
        let mut dag = Dag::new();
        dag.add(Op::Pinned { src: a, dst: b, bytes: 1e9, src_rail: 0, dst_rail: 0, weight: 1.0 }, &[]);
        let r =
            simulate(&f, &dag, &[Failure::known_down(1, 0)], &EngineConfig::with_repair(RepairMode::Spread)).unwrap();
        assert!(!r.stalled);
        assert!((r.makespan - 1.0).abs() < 1e-9, "{}", r.makespan);
    }
}
