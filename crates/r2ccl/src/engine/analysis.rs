//! Pure analysis of a rank's schedule (which sends need private copies, what runs in place) and
//! small helpers of the control plane (no state, no IO).

use super::*;

/// The steps [`Engine::start`] runs at once from the caller's input: copies out of the input
/// (into another buffer) that depend on nothing.
pub(super) fn copies_from_input_now(sched: &RankSchedule) -> Vec<bool> {
    sched
        .steps()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            matches!(s.kind, StepKind::Copy { src, dst } if src.buf == Buf::Input && dst.buf != Buf::Input)
                && sched.deps(i).is_empty()
        })
        .collect()
}

/// Whether `sched` stays correct when its input and output are the same memory, the input at
/// byte `in_at` and the output at `out_at` of one region (NCCL's in-place call): every step
/// that touches the input is a copy that waits for nothing onto the very same bytes.
pub(super) fn runs_in_place(sched: &RankSchedule, in_at: u64, out_at: u64) -> bool {
    sched.steps().iter().enumerate().filter(|(_, s)| touches_input(s)).all(|(i, s)| {
        matches!(s.kind, StepKind::Copy { src, dst }
            if src.buf == Buf::Input && dst.buf == Buf::Output && in_at + src.offset == out_at + dst.offset)
            && sched.deps(i).is_empty()
    })
}

/// Whether a step reads or writes the input buffer.
pub(super) fn touches_input(s: &Step) -> bool {
    match s.kind {
        StepKind::Send { src, .. } => src.buf == Buf::Input,
        StepKind::Recv { dst, .. } => dst.buf == Buf::Input,
        StepKind::Copy { src, dst } | StepKind::Reduce { src, dst } => src.buf == Buf::Input || dst.buf == Buf::Input,
    }
}

/// For each step that writes (receive, copy, reduce), the earlier sends whose source bytes it
/// overwrites; empty for every other step. The engine counts a send done once posted, and a
/// replay after a failure must find the bytes first sent, so such a write waits until the send
/// is confirmed or has moved to a private copy. Schedules list steps in a valid program order
/// and order every write after the reads before it, so a writer that may run after a send
/// comes later in the list. One forward sweep with the sends so far indexed by offset.
pub(super) fn overwritten_sends(sched: &RankSchedule) -> Vec<Vec<u32>> {
    let steps = sched.steps();
    let mut out = vec![Vec::new(); steps.len()];
    // Per buffer: the sends so far by source offset (end, step), and the longest one.
    let mut sent: [BTreeMap<u64, Vec<(u64, u32)>>; 3] = Default::default();
    let mut longest = [0u64; 3];
    for (i, s) in steps.iter().enumerate() {
        match s.kind {
            StepKind::Send { src, .. } if src.len > 0 => {
                let b = src.buf as usize;
                sent[b].entry(src.offset).or_default().push((src.offset + src.len, i as u32));
                longest[b] = longest[b].max(src.len);
            }
            StepKind::Recv { dst, .. } | StepKind::Copy { dst, .. } | StepKind::Reduce { dst, .. } if dst.len > 0 => {
                let b = dst.buf as usize;
                let (lo, hi) = (dst.offset, dst.offset + dst.len);
                // A send overlaps [lo, hi) iff it starts before hi and ends after lo.
                for (_, v) in sent[b].range(lo.saturating_sub(longest[b])..hi) {
                    out[i].extend(v.iter().filter(|&&(end, _)| end > lo).map(|&(_, j)| j));
                }
                out[i].sort_unstable();
            }
            _ => {}
        }
    }
    out
}

/// Per step: a send whose bytes a receive from the same peer overwrites, or a small send
/// ([`super::linger::LINGER_MAX_BYTES`]) whose bytes any later step overwrites. Those go out of a
/// private copy from the start: in an exchange (recursive doubling, a tree's way down) each
/// side's receive would otherwise wait for the other side's receipt, which waits for it; and a
/// small transfer's receiver holds its receipt back (`linger.rs`), which no write may wait for.
pub(super) fn sends_copied_at_once(sched: &RankSchedule, blockers: &[Vec<u32>]) -> Vec<bool> {
    let steps = sched.steps();
    let mut eager = vec![false; steps.len()];
    for (w, bs) in blockers.iter().enumerate() {
        let from = match steps[w].kind {
            StepKind::Recv { peer, .. } => Some(peer),
            _ => None,
        };
        for &j in bs {
            if let StepKind::Send { peer, src, .. } = steps[j as usize].kind {
                if Some(peer) == from || super::Engine::small(src.len) {
                    eager[j as usize] = true;
                }
            }
        }
    }
    eager
}

/// Per step: a send that some later step overwrites (it needs room for a private copy).
pub(super) fn private_sends(blockers: &[Vec<u32>]) -> Vec<bool> {
    let mut private = vec![false; blockers.len()];
    for &j in blockers.iter().flatten() {
        private[j as usize] = true;
    }
    private
}

/// NICs down for good: down, and not merely blamed by a verdict (a blamed NIC's link is up).
pub(super) fn gone_for_good(down: &BTreeSet<NicId>, blamed: &BTreeSet<NicId>) -> BTreeSet<NicId> {
    down.difference(blamed).copied().collect()
}

/// Whether nodes `a` and `b` can still reach each other given the NICs known to be `down`:
/// neither is isolated and, on a rail-only fabric, they share a healthy rail.
pub(super) fn reachable(
    topo: &r2ccl_transport::Topology,
    down: &BTreeSet<NicId>,
    rail_only: bool,
    a: NodeId,
    b: NodeId,
) -> Result<(), EngineError> {
    for node in [a, b] {
        if topo.nics_of(node).iter().all(|n| down.contains(n)) {
            return Err(EngineError::NodeIsolated(node.0));
        }
    }
    if rail_only && a != b {
        let healthy = |n: NodeId| -> BTreeSet<u16> {
            topo.nics_of(n).iter().filter(|x| !down.contains(x)).map(|x| x.rail.0).collect()
        };
        if healthy(a).is_disjoint(&healthy(b)) {
            return Err(EngineError::NoCommonRail { a: a.0, b: b.0 });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use r2ccl_algo::{build_rank_schedule, Algorithm, Collective, Fabric, Layout, ScheduleRequest};
    use r2ccl_core::{DType, HealthView, ReduceOp};

    /// The definition, by brute force: a later step writes an overlapping range of the buffer.
    fn reference(sched: &RankSchedule) -> Vec<bool> {
        let steps = sched.steps();
        let dst = |k: &StepKind| match *k {
            StepKind::Recv { dst, .. } | StepKind::Copy { dst, .. } | StepKind::Reduce { dst, .. } => Some(dst),
            StepKind::Send { .. } => None,
        };
        (0..steps.len())
            .map(|i| match steps[i].kind {
                StepKind::Send { src, .. } => steps[i + 1..]
                    .iter()
                    .filter_map(|s| dst(&s.kind))
                    .any(|d| d.buf == src.buf && d.offset < src.offset + src.len && src.offset < d.offset + d.len),
                _ => false,
            })
            .collect()
    }

    /// By brute force: for each writing step, the earlier sends of overlapping bytes.
    fn reference_blockers(sched: &RankSchedule) -> Vec<Vec<u32>> {
        let steps = sched.steps();
        (0..steps.len())
            .map(|w| {
                let d = match steps[w].kind {
                    StepKind::Recv { dst, .. } | StepKind::Copy { dst, .. } | StepKind::Reduce { dst, .. } => dst,
                    StepKind::Send { .. } => return Vec::new(),
                };
                let mut v: Vec<u32> = (0..w)
                    .filter(|&j| match steps[j].kind {
                        StepKind::Send { src, .. } => {
                            src.len > 0
                                && d.len > 0
                                && d.buf == src.buf
                                && d.offset < src.offset + src.len
                                && src.offset < d.offset + d.len
                        }
                        _ => false,
                    })
                    .map(|j| j as u32)
                    .collect();
                v.sort_unstable();
                v
            })
            .collect()
    }

    #[test]
    fn private_copies_are_exactly_the_sends_a_later_step_overwrites() {
        let layout = Layout::uniform(4, 1, 2).unwrap();
        let fabric = Fabric::new(layout, HealthView::uniform(4, 2, 100_000)).unwrap();
        let sum = ReduceOp::Sum;
        let cases = [
            ScheduleRequest::new(Collective::AllReduce { op: sum }, DType::F32, 4096).with_chunks(4),
            ScheduleRequest::new(Collective::AllReduce { op: sum }, DType::F32, 1000).with_algorithm(Algorithm::Tree),
            ScheduleRequest::new(Collective::ReduceScatter { op: sum }, DType::F32, 1024).with_chunks(2),
            ScheduleRequest::new(Collective::AllGather, DType::F32, 1024),
            ScheduleRequest::new(Collective::Broadcast { root: Rank(1) }, DType::F32, 1024).with_chunks(3),
            ScheduleRequest::new(Collective::AlltoAll, DType::F32, 256),
        ];
        let mut saved = 0;
        for req in cases {
            for r in 0..4 {
                let sched = build_rank_schedule(&fabric, &req, Rank(r)).unwrap();
                let blockers = overwritten_sends(&sched);
                let got = private_sends(&blockers);
                assert_eq!(got, reference(&sched), "{req:?} rank {r}");
                assert_eq!(blockers, reference_blockers(&sched), "{req:?} rank {r}");
                let sends = sched.steps().iter().filter(|s| matches!(s.kind, StepKind::Send { .. })).count();
                saved += sends - got.iter().filter(|&&p| p).count();
            }
        }
        // The ring's all-gather half and every send from the input need no copy.
        assert!(saved > 0);
    }

    #[test]
    fn a_ring_allreduce_copies_its_input_once_straight_to_the_output() {
        let layout = Layout::uniform(4, 1, 2).unwrap();
        let fabric = Fabric::new(layout, HealthView::uniform(4, 2, 100_000)).unwrap();
        let sum = ReduceOp::Sum;
        let ring = ScheduleRequest::new(Collective::AllReduce { op: sum }, DType::F32, 4096).with_chunks(4);
        for r in 0..4 {
            let sched = build_rank_schedule(&fabric, &ring, Rank(r)).unwrap();
            let direct = copies_from_input_now(&sched);
            assert_eq!(direct.iter().filter(|&&d| d).count(), 1, "rank {r}: one input -> output copy");
            let later = sched.steps().iter().enumerate().any(|(i, s)| !direct[i] && touches_input(s));
            assert!(!later, "rank {r}: nothing else reads the input, so it never enters the workspace");
        }
        // A schedule that sends from the input keeps it in the workspace.
        let a2a = ScheduleRequest::new(Collective::AlltoAll, DType::F32, 256);
        let sched = build_rank_schedule(&fabric, &a2a, Rank(0)).unwrap();
        let direct = copies_from_input_now(&sched);
        assert!(sched.steps().iter().enumerate().any(|(i, s)| !direct[i] && touches_input(s)));
    }
}
