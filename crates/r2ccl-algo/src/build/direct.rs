//! The four-stage AllReduce with direct exchanges per level ([`crate::Strategy::FourStageDirect`]):
//! every pair of a level's nodes exchanges its pieces at once over fair-share same-rail splits,
//! instead of one ring per level ([`crate::Strategy::FourStage`], `nested.rs`).

use super::nested::{four_stage_levels, hierarchical, Level, Roles};
use super::{Cx, Elems};
use crate::layout::RailMask;
use crate::schedule::{SplitRef, Tag};
use crate::AlgoError;
use r2ccl_core::Rank;

/// Admission window of a direct level, in chunks of `k`: a member starts sending chunk `c` once
/// its receives of chunk `c - w` are in, `w` half the collective and at least 4 chunks, so that a
/// level runs no further ahead of its scatter-in than that. Under r2ccl-sim's max-min sharing a
/// window of `k / 8` held 4 x 4, 4 x 8 and 8 x 8 nodes with one NIC lost at 1.022-1.031 x the bound
/// (K = 256-512), `k / 16` at 1.044-1.053; `k / 2` runs them at 1.000-1.001.
fn direct_window(k: u64) -> u64 {
    (k / 2).max(4)
}

/// The four-stage AllReduce (section 7) over direct levels ([`spread_direct`]).
pub(crate) fn four_stage_direct(cx: &mut Cx<'_>, ring: &[Rank], n: u64) -> Result<(), AlgoError> {
    hierarchical(cx, ring, n, |cx, leaders, me| {
        let levels = four_stage_levels(cx, leaders, n)?;
        spread_direct(cx, leaders, me, &levels)
    })
}

/// One direct level of the four-stage schedule as this rank sees it.
struct DirectLevel {
    members: Vec<Rank>,
    excluded: Vec<Rank>,
    range: Elems,
    /// This rank's position among the members.
    pos: Option<usize>,
    /// This rank's index among the joiners.
    joiner: Option<usize>,
    /// Phases of the reduce-scatter (scatter-in included) and the all-gather (gather-back included).
    ph: [u16; 2],
}

impl DirectLevel {
    /// Member `j`'s segment.
    fn seg(&self, j: usize) -> Elems {
        self.range.part(self.members.len() as u64, j as u64)
    }
}

/// The four-stage levels (section 7) with direct exchanges. In each level every member sends
/// each other member its piece of that member's segment and reduces what it receives into its
/// own (reduce-scatter), and the other leaders (joiners) send each member its piece likewise
/// (scatter-in); then every member sends its reduced segment to every other member and to every
/// joiner (all-gather and gather-back). Chunk-major: chunk `c` of every level, level by level,
/// so every rank's program order is the same interleaving; a chunk's all-gather follows its
/// reduce-scatter by data dependencies only.
///
/// Every transfer between two nodes goes over their [`crate::Fabric::fair_split`] among all
/// leaders. Each node's bytes are those of the water-filled plan (as a ring per level would
/// move them); what direct exchanges change is how they spread over connections. Where NICs
/// share their bandwidth evenly between connections (round-robin between queue pairs; TCP flows
/// through a tail-drop queue only roughly, docs/benchmarks.md), the plan's per-pair bytes are in
/// the ratio of those fair shares, so every connection runs at the rate its bytes need and all
/// of them finish together: the time is the lower bound's (r2ccl-sim, max-min sharing: 1.000-1.001
/// of it for 4 x 4, 4 x 8 and 8 x 8 nodes with one NIC lost or two on different nodes, and for
/// one NIC per node at 75%). In one ring per level, a slower member sends its whole share to its
/// one successor, whose NICs give that connection only their fair part: 1.15-1.24x the bound.
fn spread_direct(cx: &mut Cx<'_>, leaders: &[Rank], me: Option<usize>, levels: &[Level]) -> Result<(), AlgoError> {
    let k = u64::from(cx.chunks);
    let mut lv = Vec::with_capacity(levels.len());
    for level in levels {
        let ph = [cx.phase(), cx.phase()];
        let Roles { members, excluded, pos, joiner } = level.roles(leaders, me);
        lv.push(DirectLevel { members, excluded, range: level.range, pos, joiner, ph });
    }
    let Some(me_idx) = me else { return Ok(()) };
    // Every pair of leaders talks: one split each way per peer, by leader index.
    let me_rank = leaders[me_idx];
    let mut out_split = vec![SplitRef::INTRA; leaders.len()];
    let mut in_split = vec![SplitRef::INTRA; leaders.len()];
    for (i, &r) in leaders.iter().enumerate().filter(|&(i, _)| i != me_idx) {
        out_split[i] = cx.fair_split_ref(me_rank, r, leaders, RailMask::ALL)?;
        in_split[i] = cx.fair_split_ref(r, me_rank, leaders, RailMask::ALL)?;
    }
    let index = |r: Rank| leaders.iter().position(|&x| x == r).unwrap_or(me_idx);
    let to = |r: Rank| out_split[index(r)];
    let from = |r: Rank| in_split[index(r)];
    let w = direct_window(k);
    let mut gate: Vec<Vec<Option<u32>>> = vec![Vec::new(); lv.len()];
    for c in 0..k {
        let chunk = c as u32;
        for (l, v) in lv.iter().enumerate() {
            let s = v.members.len();
            let admit: Vec<u32> =
                c.checked_sub(w).and_then(|x| gate[l].get(x as usize).copied().flatten()).into_iter().collect();
            let (rs, ag) = (Tag::new(v.ph[0], 0, chunk), Tag::new(v.ph[1], 0, chunk));
            let mut last = None;
            if let Some(q) = v.joiner {
                // Joiner q starts at member q so that joiners do not collide.
                for a in 0..s {
                    let m = v.members[(q + a) % s];
                    cx.send_via(m, rs, v.seg((q + a) % s).part(k, c), to(m), &admit);
                }
                for (j, &m) in v.members.iter().enumerate() {
                    last = cx.recv_via(m, ag, v.seg(j).part(k, c), false, from(m)).or(last);
                }
            }
            if let Some(pos) = v.pos {
                let mine = v.seg(pos).part(k, c);
                // Round d: send to the member d places ahead, receive from the one d behind
                // (program order stays valid in every rank).
                for d in 1..s {
                    let (a, b) = (v.members[(pos + d) % s], v.members[(pos + s - d) % s]);
                    cx.send_via(a, rs, v.seg((pos + d) % s).part(k, c), to(a), &admit);
                    last = cx.recv_via(b, rs, mine, true, from(b)).or(last);
                }
                for &e in &v.excluded {
                    last = cx.recv_via(e, rs, mine, true, from(e)).or(last);
                }
                for d in 1..s {
                    let (a, b) = (v.members[(pos + d) % s], v.members[(pos + s - d) % s]);
                    cx.send_via(a, ag, mine, to(a), &[]);
                    cx.recv_via(b, ag, v.seg((pos + s - d) % s).part(k, c), false, from(b));
                }
                for &e in &v.excluded {
                    cx.send_via(e, ag, mine, to(e), &[]);
                }
            }
            gate[l].push(last);
        }
    }
    Ok(())
}
