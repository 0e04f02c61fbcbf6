//! Node-level AllReduce strategies: the hierarchical wrapper (intra-node reduce to a
//! leader, inter-node algorithm among leaders, intra-node broadcast) and the nested
//! level engine behind R2CCL-AllReduce, recursive AllReduce and the four-stage schedule.

use super::{prims, Cx, Elems};
use crate::layout::RailMask;
use crate::model::{self, LevelPlan};
use crate::schedule::{Buf, Tag};
use crate::spec::R2cclParams;
use crate::AlgoError;
use r2ccl_core::Rank;

/// Run `inner` among one leader per node (the node's first rank on the ring), wrapped
/// in an intra-node chain reduce to the leader before and a chain broadcast after.
/// `inner` is called on every rank (non-leaders get `None`) so phase ids stay aligned.
pub(crate) fn hierarchical(
    cx: &mut Cx<'_>,
    ring: &[Rank],
    n: u64,
    inner: impl FnOnce(&mut Cx<'_>, &[Rank], Option<usize>) -> Result<(), AlgoError>,
) -> Result<(), AlgoError> {
    let layout = cx.fab.layout();
    let my_node = layout.node_idx(cx.me);
    let mut seen = vec![false; layout.nodes()];
    let mut leaders = Vec::with_capacity(layout.nodes());
    let mut local = Vec::new();
    for &r in ring {
        let node = layout.node_idx(r);
        if !seen[node] {
            seen[node] = true;
            leaders.push(r);
        }
        if node == my_node {
            local.push(r);
        }
    }
    let out = Elems::new(Buf::Output, 0, n);
    cx.copy(Elems::new(Buf::Input, 0, n), out);
    let to_leader: Vec<Rank> = local.iter().rev().copied().collect();
    prims::chain_reduce_to_last(cx, &to_leader, out, RailMask::ALL)?;
    let me_leader = leaders.iter().position(|&r| r == cx.me);
    inner(cx, &leaders, me_leader)?;
    prims::chain_copy(cx, &local, out, RailMask::ALL)
}

/// One level of a nested schedule: `members` (indices into the leader list, ring order)
/// run a ring AllReduce of `range`; the other leaders join it.
struct Level {
    members: Vec<usize>,
    range: Elems,
    mask: RailMask,
}

/// How nodes outside a level join it.
enum Join {
    /// Four-stage: scatter-in evenly to all members, gather-back from all members.
    Spread,
    /// Reduce-to-helper and broadcast-back in `k` chunks after stage 1 (helpers rotate
    /// over the members chunk by chunk; members get the result by a chain from the helper).
    Helper {
        /// Pipeline chunks.
        k: u32,
        /// Rails for the joiners' transfers to and from helpers.
        mask: RailMask,
    },
}

fn run_levels(
    cx: &mut Cx<'_>,
    leaders: &[Rank],
    me: Option<usize>,
    levels: &[Level],
    join: &Join,
) -> Result<(), AlgoError> {
    let chunks = u64::from(cx.chunks);
    let l = leaders.len();
    let status = |lv: &Level| -> (Option<usize>, bool) {
        match me {
            Some(i) => match lv.members.iter().position(|&m| m == i) {
                Some(j) => (Some(j), false),
                None => (None, true),
            },
            None => (None, false),
        }
    };
    let excluded_of = |lv: &Level| -> Vec<Rank> {
        let mut inside = vec![false; l];
        for &m in &lv.members {
            inside[m] = true;
        }
        (0..l).filter(|&i| !inside[i]).map(|i| leaders[i]).collect()
    };
    match join {
        Join::Spread => {
            for lv in levels {
                let (ph_sc, ph_ga) = (cx.phase(), cx.phase());
                let members: Vec<Rank> = lv.members.iter().map(|&m| leaders[m]).collect();
                let excluded = excluded_of(lv);
                let s = members.len() as u64;
                let range = lv.range;
                let seg = move |j: usize| range.part(s, j as u64);
                let (pos, is_excluded) = status(lv);
                // Chunk-major order: every member's first chunk leaves first, so the
                // members' reduce-scatter pipelines start together.
                if is_excluded {
                    for c in 0..chunks {
                        for (j, &m) in members.iter().enumerate() {
                            cx.send(m, Tag::new(ph_sc, 0, c as u32), seg(j).part(chunks, c), lv.mask, &[])?;
                        }
                    }
                }
                if let Some(j) = pos {
                    for &e in &excluded {
                        for c in 0..chunks {
                            cx.recv(e, Tag::new(ph_sc, 0, c as u32), seg(j).part(chunks, c), true, lv.mask)?;
                        }
                    }
                }
                prims::ring_rs(cx, &members, &seg, lv.mask)?;
                prims::ring_ag(cx, &members, &seg, lv.mask)?;
                if let Some(j) = pos {
                    for &e in &excluded {
                        for c in 0..chunks {
                            cx.send(e, Tag::new(ph_ga, 0, c as u32), seg(j).part(chunks, c), lv.mask, &[])?;
                        }
                    }
                }
                if is_excluded {
                    for c in 0..chunks {
                        for (j, &m) in members.iter().enumerate() {
                            cx.recv(m, Tag::new(ph_ga, 0, c as u32), seg(j).part(chunks, c), false, lv.mask)?;
                        }
                    }
                }
            }
        }
        Join::Helper { k, mask: join_mask } => {
            for lv in levels {
                let members: Vec<Rank> = lv.members.iter().map(|&m| leaders[m]).collect();
                prims::ring_allreduce(cx, &members, lv.range, lv.mask)?;
            }
            let barrier = cx.sinks_since(0);
            let k = u64::from(*k);
            for lv in levels {
                let (ph_up, ph_down, ph_chain) = (cx.phase(), cx.phase(), cx.phase());
                let members: Vec<Rank> = lv.members.iter().map(|&m| leaders[m]).collect();
                let excluded = excluded_of(lv);
                if excluded.is_empty() || members.is_empty() {
                    continue;
                }
                let s = members.len();
                let (pos, is_excluded) = status(lv);
                for c in 0..k {
                    let piece = lv.range.part(k, c);
                    let hpos = (c as usize) % s;
                    let tag = |ph| Tag::new(ph, c as u32, 0);
                    if is_excluded {
                        cx.send(members[hpos], tag(ph_up), piece, *join_mask, &barrier)?;
                    }
                    if let Some(j) = pos {
                        let q = (j + s - hpos) % s;
                        if q == 0 {
                            for &e in &excluded {
                                cx.recv(e, tag(ph_up), piece, true, *join_mask)?;
                            }
                            for &e in &excluded {
                                cx.send(e, tag(ph_down), piece, *join_mask, &[])?;
                            }
                        } else {
                            cx.recv(members[(j + s - 1) % s], tag(ph_chain), piece, false, RailMask::ALL)?;
                        }
                        if q + 1 < s {
                            cx.send(members[(j + 1) % s], tag(ph_chain), piece, RailMask::ALL, &[])?;
                        }
                    }
                    if is_excluded {
                        cx.recv(members[hpos], tag(ph_down), piece, false, *join_mask)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Element ranges of consecutive levels (see [`model::level_ranges`]).
fn ranges(n: u64, fractions: &[f64]) -> Vec<Elems> {
    model::level_ranges(n, fractions).into_iter().map(|(start, len)| Elems::new(Buf::Output, start, len)).collect()
}

fn leader_bandwidths(cx: &Cx<'_>, leaders: &[Rank]) -> Vec<f64> {
    let layout = cx.fab.layout();
    leaders.iter().map(|&r| cx.fab.node_usable_mbps(r_core_node(layout.node_idx(r))) as f64).collect()
}

fn r_core_node(i: usize) -> r2ccl_core::NodeId {
    r2ccl_core::NodeId(i as u32)
}

fn plan_levels(leaders_len: usize, bw: &[f64], plan: &LevelPlan, n: u64) -> Vec<Level> {
    let rs = ranges(n, &plan.fractions);
    plan.thresholds
        .iter()
        .zip(rs)
        .map(|(&t, range)| Level {
            members: (0..leaders_len).filter(|&i| bw[i] >= t).collect(),
            range,
            mask: RailMask::ALL,
        })
        .collect()
}

/// R2CCL-AllReduce (section 5.2).
pub(crate) fn r2ccl_allreduce(cx: &mut Cx<'_>, ring: &[Rank], n: u64, params: &R2cclParams) -> Result<(), AlgoError> {
    let degraded = params.degraded;
    let healthy_mask = cx.fab.healthy_rails(degraded);
    hierarchical(cx, ring, n, |cx, leaders, me| {
        let layout = cx.fab.layout();
        let d = leaders.iter().position(|&r| layout.node_idx(r) == degraded.index()).unwrap_or(0);
        let main = params.main_len(n);
        let levels = [
            Level {
                members: (0..leaders.len()).collect(),
                range: Elems::new(Buf::Output, 0, main),
                mask: healthy_mask,
            },
            Level {
                members: (0..leaders.len()).filter(|&i| i != d).collect(),
                range: Elems::new(Buf::Output, main, n - main),
                mask: healthy_mask.not(),
            },
        ];
        let levels = if leaders.len() < 2 { &levels[..1] } else { &levels[..] };
        run_levels(cx, leaders, me, levels, &Join::Helper { k: params.pipeline_chunks, mask: healthy_mask })
    })
}

/// Recursive AllReduce (section 6.2) with stage-1 water-filling.
pub(crate) fn recursive(cx: &mut Cx<'_>, ring: &[Rank], n: u64, k: u32) -> Result<(), AlgoError> {
    hierarchical(cx, ring, n, |cx, leaders, me| {
        let bw = leader_bandwidths(cx, leaders);
        let plan = if leaders.len() < 2 {
            LevelPlan { thresholds: vec![0.0], fractions: vec![1.0] }
        } else {
            model::recursive_plan(&bw)?
        };
        let levels = plan_levels(leaders.len(), &bw, &plan, n);
        run_levels(cx, leaders, me, &levels, &Join::Helper { k, mask: RailMask::ALL })
    })
}

/// The four-stage bound-reaching AllReduce (section 7), water-filled over bandwidth classes.
pub(crate) fn four_stage(cx: &mut Cx<'_>, ring: &[Rank], n: u64) -> Result<(), AlgoError> {
    hierarchical(cx, ring, n, |cx, leaders, me| {
        let bw = leader_bandwidths(cx, leaders);
        let plan = if leaders.len() < 2 {
            LevelPlan { thresholds: vec![0.0], fractions: vec![1.0] }
        } else {
            model::four_stage_plan(&bw)?
        };
        let levels = plan_levels(leaders.len(), &bw, &plan, n);
        run_levels(cx, leaders, me, &levels, &Join::Spread)
    })
}
