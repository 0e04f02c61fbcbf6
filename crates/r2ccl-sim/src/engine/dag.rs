//! What a run executes: [`Op`]s (transfers, compute, delays) in a [`Dag`] of tasks with
//! dependencies and optional queues.

#[allow(clippy::wildcard_imports, reason = "the engine split by concern: its types are the parent's")]
use super::*;

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
    pub(super) fn transfer(&self) -> Option<(Endpoint, Endpoint, f64, RailMask)> {
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
    pub(super) op_of: Vec<u32>,
    /// The ops: one entry per [`Dag::intern`]ed op, and one per task added with [`Dag::add`] or
    /// [`Dag::add_queued`].
    pub(super) table: Vec<Op>,
    /// Index in `table` by [`op_key`].
    pub(super) index: r2ccl_core::fastmap::IntMap<OpKey, u32>,
    /// Index in `table` of a barrier's op, once there is one.
    pub(super) barrier_op: Option<u32>,
    pub(super) edges: Vec<(TaskId, TaskId)>,
    /// Queue of each task (`NO_QUEUE`: none); empty while no task has one.
    pub(super) queue: Vec<u32>,
    /// Number of queues in use (largest id + 1).
    pub(super) queues: u32,
}

/// Queue id of a task that is in no queue.
pub(super) const NO_QUEUE: u32 = u32::MAX;

/// An op in the table of distinct ops of the [`Dag`] that made it ([`Dag::intern`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpId(u32);

/// An op as integers (kind, endpoints, rails, and the bits of its numbers): equal keys are the same op, bit for
/// bit.
pub(super) type OpKey = (u32, [u32; 6], [u64; 3]);

pub(super) fn op_key(op: &Op) -> OpKey {
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
