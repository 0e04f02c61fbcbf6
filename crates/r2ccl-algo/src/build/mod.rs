//! Schedule builders: validate a request, then emit one rank's steps.
//!
//! Every builder runs the same control flow on every rank (phase ids are allocated
//! unconditionally), and emits only the calling rank's steps, so building one rank's
//! schedule costs time and memory proportional to what that rank does.

mod direct;
mod group;
mod nested;
mod prims;

pub use group::{build_p2p_group, p2p_group_lens, P2pOp};
pub use nested::{rails_group_mask, rails_of_group};

use crate::layout::{Fabric, RailMask, RailPolicy};
use crate::schedule::{Buf, RankSchedule, Region, ScheduleBuilder, SplitRef, StepKind, Tag};
use crate::spec::{Algorithm, Collective, ScheduleRequest, Strategy};
use crate::AlgoError;
use r2ccl_core::{NodeId, Rank, ReduceOp};
use std::borrow::Cow;

/// Element range `[start, start + len)` of a buffer (in elements, not bytes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Elems {
    pub(crate) buf: Buf,
    pub(crate) start: u64,
    pub(crate) len: u64,
}

impl Elems {
    pub(crate) const fn new(buf: Buf, start: u64, len: u64) -> Self {
        Self { buf, start, len }
    }

    /// Part `i` of `parts` near-equal parts (the first `len % parts` get one more).
    pub(crate) fn part(self, parts: u64, i: u64) -> Self {
        let (s, l) = even_part(self.len, parts, i);
        Self { buf: self.buf, start: self.start + s, len: l }
    }
}

/// Start and length of part `i` of `parts` near-equal parts of `total`: the first
/// `total % parts` parts get one more. Every builder splits segments, chunks and pipeline
/// pieces this way (in elements).
pub fn even_part(total: u64, parts: u64, i: u64) -> (u64, u64) {
    let parts = parts.max(1);
    let base = total / parts;
    let rem = total % parts;
    (i * base + i.min(rem), base + u64::from(i < rem))
}

/// Per-rank build context.
pub(crate) struct Cx<'a> {
    pub(crate) fab: &'a Fabric,
    pub(crate) me: Rank,
    pub(crate) elem: u64,
    pub(crate) chunks: u32,
    pub(crate) policy: RailPolicy,
    pub(crate) b: ScheduleBuilder,
    phase: u16,
    split_cache: Vec<(usize, usize, RailMask, SplitRef)>,
}

impl Cx<'_> {
    pub(crate) fn region(&self, e: Elems) -> Region {
        Region::new(e.buf, e.start * self.elem, e.len * self.elem)
    }

    /// A fresh phase id (call on every rank in the same order).
    pub(crate) fn phase(&mut self) -> u16 {
        self.phase = self.phase.wrapping_add(1);
        self.phase
    }

    fn split_ref(&mut self, src: Rank, dst: Rank, mask: RailMask) -> Result<SplitRef, AlgoError> {
        let layout = self.fab.layout();
        let (sn, dn) = (layout.node_idx(src), layout.node_idx(dst));
        if sn == dn {
            return Ok(SplitRef::INTRA);
        }
        if let Some(&(_, _, _, r)) = self.split_cache.iter().find(|c| c.0 == sn && c.1 == dn && c.2 == mask) {
            return Ok(r);
        }
        let split = self.fab.split(NodeId(sn as u32), NodeId(dn as u32), mask, self.policy)?;
        let r = self.b.intern_split(split);
        self.split_cache.push((sn, dn, mask, r));
        Ok(r)
    }

    /// The split of a transfer from `src` to `dst` when every pair of `nodes` (ranks) exchanges
    /// data at once ([`Fabric::fair_split`]).
    pub(crate) fn fair_split_ref(
        &mut self,
        src: Rank,
        dst: Rank,
        nodes: &[Rank],
        mask: RailMask,
    ) -> Result<SplitRef, AlgoError> {
        let Some((sn, dn, ids)) = self.nodes_of(src, dst, nodes) else { return Ok(SplitRef::INTRA) };
        let split = self.fab.fair_split(sn, dn, &ids, mask)?;
        Ok(self.b.intern_split(split))
    }

    /// The nodes of `src`, of `dst` and of each of `others`; `None` when `src` and `dst` share a
    /// node (their transfer is intra-node).
    fn nodes_of(&self, src: Rank, dst: Rank, others: &[Rank]) -> Option<(NodeId, NodeId, Vec<NodeId>)> {
        let layout = self.fab.layout();
        let node = |r: Rank| NodeId(layout.node_idx(r) as u32);
        (node(src) != node(dst)).then(|| (node(src), node(dst), others.iter().map(|&r| node(r)).collect()))
    }

    /// The split of a ring transfer from `src` to `dst`, members of a level of `members`
    /// whose `joiners` (ranks) also load the members' NICs ([`Fabric::joined_ring_split`]).
    pub(crate) fn joined_split_ref(
        &mut self,
        src: Rank,
        dst: Rank,
        members: usize,
        joiners: &[Rank],
        mask: RailMask,
    ) -> Result<SplitRef, AlgoError> {
        let Some((sn, dn, nodes)) = self.nodes_of(src, dst, joiners) else { return Ok(SplitRef::INTRA) };
        let split = self.fab.joined_ring_split(sn, dn, members, &nodes, mask, self.policy)?;
        Ok(self.b.intern_split(split))
    }

    /// Send `src` to `peer` over an explicit `split`; nothing for an empty region.
    pub(crate) fn send_via(&mut self, peer: Rank, tag: Tag, src: Elems, split: SplitRef, extra: &[u32]) -> Option<u32> {
        if src.len == 0 {
            return None;
        }
        let src = self.region(src);
        Some(self.b.push(StepKind::Send { peer, tag, src, split }, extra))
    }

    /// Receive into `dst` from `peer` over an explicit `split`; nothing for an empty region.
    pub(crate) fn recv_via(&mut self, peer: Rank, tag: Tag, dst: Elems, reduce: bool, split: SplitRef) -> Option<u32> {
        if dst.len == 0 {
            return None;
        }
        let dst = self.region(dst);
        Some(self.b.push(StepKind::Recv { peer, tag, dst, reduce, split }, &[]))
    }

    /// Send `src` to `peer`; nothing for an empty region.
    pub(crate) fn send(
        &mut self,
        peer: Rank,
        tag: Tag,
        src: Elems,
        mask: RailMask,
        extra: &[u32],
    ) -> Result<Option<u32>, AlgoError> {
        if src.len == 0 {
            return Ok(None);
        }
        let split = self.split_ref(self.me, peer, mask)?;
        Ok(self.send_via(peer, tag, src, split, extra))
    }

    /// Receive into `dst` from `peer` (reducing or copying); nothing for an empty region.
    pub(crate) fn recv(
        &mut self,
        peer: Rank,
        tag: Tag,
        dst: Elems,
        reduce: bool,
        mask: RailMask,
    ) -> Result<Option<u32>, AlgoError> {
        if dst.len == 0 {
            return Ok(None);
        }
        let split = self.split_ref(peer, self.me, mask)?;
        Ok(self.recv_via(peer, tag, dst, reduce, split))
    }

    /// `dst = src` locally; nothing for an empty region.
    pub(crate) fn copy(&mut self, src: Elems, dst: Elems) {
        if src.len > 0 {
            let (src, dst) = (self.region(src), self.region(dst));
            self.b.push(StepKind::Copy { src, dst }, &[]);
        }
    }

    /// The steps since `start` that no later step (since `start`) depends on: waiting for
    /// all of them means waiting for every step since `start`.
    pub(crate) fn sinks_since(&self, start: u32) -> Vec<u32> {
        let end = self.b.next_index();
        if end <= start {
            return Vec::new();
        }
        let sched = self.b.peek();
        let mut has_dependent = vec![false; (end - start) as usize];
        for i in start..end {
            for &d in sched.deps(i as usize) {
                if d >= start {
                    has_dependent[(d - start) as usize] = true;
                }
            }
        }
        (start..end).filter(|&i| !has_dependent[(i - start) as usize]).collect()
    }
}

/// Build `rank`'s schedule for `req` on `fabric`.
///
/// Errors: rank or root outside the communicator, a bad ring order, a parameter out of
/// range, or a strategy/algorithm that does not exist for the collective.
pub fn build_rank_schedule(fabric: &Fabric, req: &ScheduleRequest, rank: Rank) -> Result<RankSchedule, AlgoError> {
    let layout = fabric.layout();
    let p = layout.ranks();
    layout.check_rank(rank)?;
    validate(fabric, req)?;
    let ring: Cow<'_, [Rank]> = match &req.ring {
        Some(r) => Cow::Borrowed(r.as_slice()),
        None => Cow::Owned(layout.default_ring()),
    };
    let (input_len, output_len) = req.buffer_lens(p)?;
    let op = req.collective.op();
    let mut cx = Cx {
        fab: fabric,
        me: rank,
        elem: req.dtype.size() as u64,
        chunks: req.chunks,
        policy: req.strategy.rail_policy(),
        b: ScheduleBuilder::new(rank, p as u32, req.dtype, op, input_len, output_len),
        phase: 0,
        split_cache: Vec::new(),
    };
    let n = req.count;
    let out = Elems::new(Buf::Output, 0, n);
    let input = Elems::new(Buf::Input, 0, n);
    match (req.collective, req.strategy) {
        (Collective::AllReduce { .. }, Strategy::R2cclAllReduce(params)) => {
            nested::r2ccl_allreduce(&mut cx, &ring, n, &params)?;
        }
        (Collective::AllReduce { .. }, Strategy::Recursive { pipeline_chunks }) => {
            nested::recursive(&mut cx, &ring, n, pipeline_chunks)?;
        }
        (Collective::AllReduce { .. }, Strategy::FourStage) => nested::four_stage(&mut cx, &ring, n)?,
        (Collective::AllReduce { .. }, Strategy::FourStageDirect) => direct::four_stage_direct(&mut cx, &ring, n)?,
        (Collective::AllReduce { .. }, _) => match req.algorithm {
            Algorithm::Ring => {
                cx.b.reserve(2 * p * req.chunks as usize + 1);
                cx.copy(input, out);
                prims::ring_allreduce(&mut cx, &ring, out, RailMask::ALL)?;
            }
            Algorithm::Tree => {
                cx.copy(input, out);
                prims::recursive_doubling(&mut cx, &ring, out)?;
            }
            Algorithm::Hierarchical => nested::hierarchical(&mut cx, &ring, n, |cx, leaders, _| {
                prims::ring_allreduce(cx, leaders, out, RailMask::ALL)
            })?,
            Algorithm::Rails => nested::rails(&mut cx, &ring, n)?,
        },
        (Collective::ReduceScatter { .. }, _) => prims::reduce_scatter(&mut cx, &ring, n)?,
        (Collective::AllGather, _) => prims::all_gather(&mut cx, &ring, n)?,
        (Collective::Broadcast { root }, _) => {
            if req.algorithm == Algorithm::Tree {
                prims::tree_broadcast(&mut cx, &ring, root, n)?;
            } else {
                prims::chain_broadcast(&mut cx, &ring, root, n)?;
            }
        }
        (Collective::Reduce { root, .. }, _) => {
            if req.algorithm == Algorithm::Tree {
                prims::tree_reduce(&mut cx, &ring, root, n)?;
            } else {
                prims::chain_reduce(&mut cx, &ring, root, n)?;
            }
        }
        (Collective::AlltoAll, _) => prims::all_to_all(&mut cx, &ring, n)?,
        (Collective::SendRecv { src, dst }, _) => prims::send_recv(&mut cx, src, dst, n)?,
    }
    let finalize_region = match req.collective {
        Collective::AllReduce { op: ReduceOp::Avg } => Some(out),
        Collective::Reduce { op: ReduceOp::Avg, root } if root == rank => Some(out),
        Collective::ReduceScatter { op: ReduceOp::Avg } => Some(out),
        _ => None,
    };
    if let Some(r) = finalize_region {
        if r.len > 0 {
            let region = cx.region(r);
            cx.b.set_finalize(region, p as u32);
        }
    }
    Ok(cx.b.finish())
}

/// Build every rank's schedule (convenience for tests, the executor and the simulator).
pub fn build_all(fabric: &Fabric, req: &ScheduleRequest) -> Result<Vec<RankSchedule>, AlgoError> {
    (0..fabric.layout().ranks()).map(|r| build_rank_schedule(fabric, req, Rank(r as u32))).collect()
}

fn validate(fabric: &Fabric, req: &ScheduleRequest) -> Result<(), AlgoError> {
    let layout = fabric.layout();
    let p = layout.ranks();
    if req.chunks == 0 {
        return Err(AlgoError::InvalidParameter { name: "chunks", value: "0".into(), why: "must be at least 1" });
    }
    if let Some(r) = &req.ring {
        layout.check_ring(r)?;
    }
    match req.collective {
        Collective::Broadcast { root } | Collective::Reduce { root, .. } if root.index() >= p => {
            return Err(AlgoError::RootOutOfRange { root, ranks: p });
        }
        Collective::SendRecv { src, dst } => {
            layout.check_rank(src)?;
            layout.check_rank(dst)?;
        }
        _ => {}
    }
    let is_allreduce = matches!(req.collective, Collective::AllReduce { .. });
    let name = req.collective.name();
    match req.strategy {
        Strategy::Balance | Strategy::SingleBackup => {}
        _ if !is_allreduce => return Err(AlgoError::NotApplicable { what: req.strategy.name(), collective: name }),
        Strategy::R2cclAllReduce(params) => {
            if params.degraded.index() >= layout.nodes() {
                return Err(AlgoError::InvalidParameter {
                    name: "degraded",
                    value: params.degraded.to_string(),
                    why: "must be a node of the layout",
                });
            }
            if !(params.tail_fraction > 0.0 && params.tail_fraction < 1.0) {
                return Err(AlgoError::InvalidParameter {
                    name: "tail_fraction",
                    value: params.tail_fraction.to_string(),
                    why: "must be in (0, 1)",
                });
            }
            if params.pipeline_chunks == 0 {
                return Err(AlgoError::InvalidParameter {
                    name: "pipeline_chunks",
                    value: "0".into(),
                    why: "must be at least 1",
                });
            }
        }
        Strategy::Recursive { pipeline_chunks: 0 } => {
            return Err(AlgoError::InvalidParameter {
                name: "pipeline_chunks",
                value: "0".into(),
                why: "must be at least 1",
            });
        }
        Strategy::Recursive { .. } | Strategy::FourStage | Strategy::FourStageDirect => {}
    }
    match req.algorithm {
        Algorithm::Tree
            if !matches!(
                req.collective,
                Collective::AllReduce { .. } | Collective::Broadcast { .. } | Collective::Reduce { .. }
            ) =>
        {
            Err(AlgoError::NotApplicable { what: "tree", collective: name })
        }
        Algorithm::Hierarchical if !is_allreduce => {
            Err(AlgoError::NotApplicable { what: "hierarchical", collective: name })
        }
        Algorithm::Rails if !is_allreduce => Err(AlgoError::NotApplicable { what: "rails", collective: name }),
        _ => Ok(()),
    }
}
