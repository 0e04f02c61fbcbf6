//! Completion time of schedules in the bandwidth model (alpha = 0).
//!
//! [`simulate`] is a discrete-event run of the dependency graph: every NIC has a send
//! port and a receive port with its usable bandwidth; each part of a transfer holds the
//! sending NIC's send port and the receiving NIC's receive port for `bytes / min(bw)`,
//! ports serve transfers first-come first-served in order of readiness, a transfer
//! completes when its slowest part does, and local steps are free. [`fluid_time`] is
//! the perfectly pipelined limit: the busiest port's bytes over its bandwidth.

use crate::layout::Fabric;
use crate::schedule::{RankSchedule, StepKind};
use crate::traffic::Traffic;
use crate::SimError;
use r2ccl_core::{NicId, NodeId, RailId, Rank};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Simulator parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimParams {
    /// Bandwidth of a transfer between two ranks of one node, bytes/s (infinity = free).
    pub intra_node_bytes_per_s: f64,
}

impl Default for SimParams {
    fn default() -> Self {
        Self { intra_node_bytes_per_s: f64::INFINITY }
    }
}

/// Result of [`simulate`].
#[derive(Clone, Debug, PartialEq)]
pub struct SimReport {
    /// Time the last step of any rank completes, seconds.
    pub makespan: f64,
    /// Time each rank's last step completes, seconds.
    pub rank_finish: Vec<f64>,
}

fn bytes_per_s(mbps: u64) -> f64 {
    mbps as f64 * 125_000.0
}

/// Perfectly pipelined time of `traffic` on `fabric`: the maximum over NIC ports of
/// bytes / usable bandwidth (infinity if a failed NIC carries bytes).
pub fn fluid_time(fabric: &Fabric, traffic: &Traffic) -> f64 {
    let layout = fabric.layout();
    let mut worst: f64 = 0.0;
    for node in 0..layout.nodes() {
        for rail in 0..layout.nics_per_node() {
            let nic = NicId::new(node as u32, rail as u16);
            let bytes = traffic.nic_tx(nic).max(traffic.nic_rx(nic));
            if bytes == 0 {
                continue;
            }
            let bw = bytes_per_s(fabric.usable_mbps(nic.node, nic.rail));
            worst = worst.max(if bw > 0.0 { bytes as f64 / bw } else { f64::INFINITY });
        }
    }
    worst
}

#[derive(Clone, Copy, PartialEq)]
struct Time(f64);
impl Eq for Time {}
impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Time {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A step's dependencies are complete.
    Ready,
    /// One part of a send finished on the wire.
    PartDone,
}

struct State {
    finish: Vec<f64>,
    remaining: Vec<u32>,
    ready_at: Vec<f64>,
    dependents: Vec<Vec<u32>>,
    heap: BinaryHeap<Reverse<(Time, Ev, u32)>>,
}

impl State {
    fn complete(&mut self, g: u32, t: f64) {
        self.finish[g as usize] = t;
        for i in 0..self.dependents[g as usize].len() {
            let d = self.dependents[g as usize][i] as usize;
            self.remaining[d] -= 1;
            self.ready_at[d] = self.ready_at[d].max(t);
            if self.remaining[d] == 0 {
                self.heap.push(Reverse((Time(self.ready_at[d]), Ev::Ready, d as u32)));
            }
        }
    }
}

/// A transfer part waiting for its two ports.
struct Part {
    send: u32,
    secs: f64,
    tx: usize,
    rx: usize,
}

/// Simulate `schedules` (one per rank, rank order) on `fabric` in the bandwidth model.
///
/// List scheduling: whenever ports are idle, the earliest-ready waiting transfer parts
/// whose two ports are both idle start (work-conserving, first-come first-served).
pub fn simulate(fabric: &Fabric, schedules: &[RankSchedule], params: &SimParams) -> Result<SimReport, SimError> {
    let layout = fabric.layout();
    if schedules.len() != layout.ranks() || schedules.iter().enumerate().any(|(i, s)| s.rank.index() != i) {
        return Err(SimError::Mismatch(format!("need one schedule per rank of {} in rank order", layout.ranks())));
    }
    let k = layout.nics_per_node();
    let mut base = Vec::with_capacity(schedules.len() + 1);
    let mut total = 0u32;
    for s in schedules {
        base.push(total);
        total += s.steps().len() as u32;
    }
    base.push(total);
    let n = total as usize;
    let mut st = State {
        finish: vec![f64::NAN; n],
        remaining: vec![0; n],
        ready_at: vec![0.0; n],
        dependents: vec![Vec::new(); n],
        heap: BinaryHeap::new(),
    };
    let mut recv_of: HashMap<(u32, u32, u64), u32> = HashMap::new();
    let mut locate = Vec::with_capacity(n);
    for (r, s) in schedules.iter().enumerate() {
        for (i, step) in s.steps().iter().enumerate() {
            let g = base[r] + i as u32;
            locate.push((r as u32, i as u32));
            st.remaining[g as usize] = s.deps(i).len() as u32;
            for &d in s.deps(i) {
                st.dependents[(base[r] + d) as usize].push(g);
            }
            if let StepKind::Recv { peer, tag, .. } = step.kind {
                recv_of.insert((peer.0, r as u32, tag.0), g);
            }
        }
    }
    for g in 0..n {
        if st.remaining[g] == 0 {
            st.heap.push(Reverse((Time(0.0), Ev::Ready, g as u32)));
        }
    }
    let mut tx_busy = vec![0.0f64; layout.nodes() * k];
    let mut rx_busy = vec![0.0f64; layout.nodes() * k];
    let mut outstanding = vec![0u32; n];
    let mut pending: Vec<Part> = Vec::new();
    let mut arrived: HashMap<(u32, u32, u64), f64> = HashMap::new();
    let mut waiting: HashMap<(u32, u32, u64), f64> = HashMap::new();
    let deliver = |st: &mut State,
                   arrived: &mut HashMap<(u32, u32, u64), f64>,
                   waiting: &mut HashMap<(u32, u32, u64), f64>,
                   g: u32,
                   t: f64| {
        st.complete(g, t);
        let (r, i) = locate[g as usize];
        if let StepKind::Send { peer, tag, .. } = schedules[r as usize].steps()[i as usize].kind {
            let key = (r, peer.0, tag.0);
            match waiting.remove(&key) {
                Some(ready) => {
                    if let Some(&rg) = recv_of.get(&key) {
                        st.complete(rg, t.max(ready));
                    }
                }
                None => {
                    arrived.insert(key, t);
                }
            }
        }
    };
    while let Some(Reverse((Time(t), ev, g))) = st.heap.pop() {
        let (r, i) = locate[g as usize];
        let s = &schedules[r as usize];
        match (ev, s.steps()[i as usize].kind) {
            (Ev::PartDone, _) => {
                outstanding[g as usize] -= 1;
                if outstanding[g as usize] == 0 {
                    deliver(&mut st, &mut arrived, &mut waiting, g, t);
                }
            }
            (Ev::Ready, StepKind::Copy { .. } | StepKind::Reduce { .. }) => st.complete(g, t),
            (Ev::Ready, StepKind::Recv { peer, tag, .. }) => {
                let key = (peer.0, r, tag.0);
                match arrived.remove(&key) {
                    Some(a) => st.complete(g, a.max(t)),
                    None => {
                        waiting.insert(key, t);
                    }
                }
            }
            (Ev::Ready, StepKind::Send { peer, src, split, .. }) => match s.split(split) {
                None => {
                    outstanding[g as usize] = 1;
                    let done = t + src.len as f64 / params.intra_node_bytes_per_s;
                    st.heap.push(Reverse((Time(done), Ev::PartDone, g)));
                }
                Some(sp) => {
                    let sn = layout.node_idx(s.rank);
                    let dn = layout.node_idx(peer);
                    for (part, bytes) in sp.parts.iter().zip(sp.divide(src.len, s.dtype.size() as u64)) {
                        if bytes == 0 {
                            continue;
                        }
                        let bs = fabric.usable_mbps(NodeId(sn as u32), part.src);
                        let bd = fabric.usable_mbps(NodeId(dn as u32), part.dst);
                        if bs == 0 || bd == 0 {
                            let nic = if bs == 0 {
                                NicId { node: NodeId(sn as u32), rail: part.src }
                            } else {
                                NicId { node: NodeId(dn as u32), rail: RailId(part.dst.0) }
                            };
                            return Err(SimError::FailedNic { rank: s.rank, step: i as usize, nic });
                        }
                        outstanding[g as usize] += 1;
                        pending.push(Part {
                            send: g,
                            secs: bytes as f64 / bytes_per_s(bs.min(bd)),
                            tx: sn * k + part.src.index(),
                            rx: dn * k + part.dst.index(),
                        });
                    }
                    if outstanding[g as usize] == 0 {
                        deliver(&mut st, &mut arrived, &mut waiting, g, t);
                    }
                }
            },
        }
        // Dispatch once every event of this instant is handled.
        let same_instant = st.heap.peek().is_some_and(|Reverse((Time(next), _, _))| *next <= t);
        if !same_instant && !pending.is_empty() {
            let mut kept = Vec::with_capacity(pending.len());
            for part in pending.drain(..) {
                if tx_busy[part.tx] <= t && rx_busy[part.rx] <= t {
                    let end = t + part.secs;
                    tx_busy[part.tx] = end;
                    rx_busy[part.rx] = end;
                    st.heap.push(Reverse((Time(end), Ev::PartDone, part.send)));
                } else {
                    kept.push(part);
                }
            }
            pending = kept;
        }
    }
    if let Some(g) = st.finish.iter().position(|f| f.is_nan()) {
        let (r, i) = locate[g];
        let unfinished = st.finish.iter().filter(|f| f.is_nan()).count();
        return Err(SimError::Stuck { unfinished, rank: Rank(r), step: i as usize });
    }
    let rank_finish: Vec<f64> = (0..schedules.len())
        .map(|r| st.finish[base[r] as usize..base[r + 1] as usize].iter().copied().fold(0.0, f64::max))
        .collect();
    let makespan = rank_finish.iter().copied().fold(0.0, f64::max);
    Ok(SimReport { makespan, rank_finish })
}
