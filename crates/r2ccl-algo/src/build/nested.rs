//! Node-level AllReduce strategies: the hierarchical wrapper (intra-node reduce to a
//! leader, inter-node algorithm among leaders, intra-node broadcast) and the nested
//! level engine behind R2CCL-AllReduce, recursive AllReduce and the four-stage schedule.

use super::{prims, Cx, Elems};
use crate::layout::{RailMask, RailPolicy};
use crate::model::{self, LevelPlan};
use crate::schedule::{Buf, SplitRef, Tag};
use crate::spec::R2cclParams;
use crate::AlgoError;
use r2ccl_core::{NodeId, RailId, Rank};

/// Run `inner` among one leader per node (the node's first rank on the ring), wrapped
/// in an intra-node chain reduce to the leader before and a chain broadcast after.
/// `inner` is called on every rank (non-leaders get `None`) so phase ids stay aligned.
pub(super) fn hierarchical(
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

/// The rail-parallel AllReduce ([`crate::Algorithm::Rails`]): a direct reduce-scatter inside
/// each node into `G` segments (`G` ranks per node), a ring AllReduce of segment `i` among
/// the `i`-th ranks of every node (nodes in ring order, ranks of a node in ring order) on
/// [`rails_group_mask`]`(i)`, a direct all-gather inside each node. Layouts whose nodes hold
/// different numbers of ranks run [`hierarchical`] with a ring among the leaders.
pub(crate) fn rails(cx: &mut Cx<'_>, ring: &[Rank], n: u64) -> Result<(), AlgoError> {
    let layout = cx.fab.layout();
    let mut order: Vec<usize> = Vec::with_capacity(layout.nodes());
    let mut members: Vec<Vec<Rank>> = vec![Vec::new(); layout.nodes()];
    for &r in ring {
        let node = layout.node_idx(r);
        if members[node].is_empty() {
            order.push(node);
        }
        members[node].push(r);
    }
    let out = Elems::new(Buf::Output, 0, n);
    let g = order.first().map_or(1, |&node| members[node].len());
    if order.iter().any(|&node| members[node].len() != g) {
        return hierarchical(cx, ring, n, |cx, leaders, _| prims::ring_allreduce(cx, leaders, out, RailMask::ALL));
    }
    cx.copy(Elems::new(Buf::Input, 0, n), out);
    let local = &members[layout.node_idx(cx.me)];
    let seg = |i: usize| out.part(g as u64, i as u64);
    prims::direct_rs(cx, local, &seg, RailMask::ALL)?;
    let pos = local.iter().position(|&r| r == cx.me).unwrap_or(0);
    let group: Vec<Rank> = order.iter().map(|&node| members[node][pos]).collect();
    prims::ring_allreduce(cx, &group, seg(pos), rails_group_mask(cx.fab, pos, g, cx.policy))?;
    prims::direct_ag(cx, local, &seg, RailMask::ALL)
}

/// The rails the `i`-th group of `rails` (`g` ranks per node) sends on under `policy`: its
/// own rails ([`rails_of_group`]), or every rail under [`RailPolicy::Balance`] and
/// [`RailPolicy::Spread`] when one of them runs below its nominal rate on some node (a
/// degraded NIC that is still usable would otherwise carry its group's whole share; spread
/// over all rails by bandwidth, it carries its bandwidth's share). A failed rail needs no
/// such rule: a transfer whose rails are unusable at either end is split over every rail.
pub fn rails_group_mask(fab: &crate::Fabric, i: usize, g: usize, policy: RailPolicy) -> RailMask {
    let k = fab.layout().nics_per_node();
    let own = rails_of_group(i, g, k);
    let slowed = (0..fab.layout().nodes())
        .any(|node| (0..k).filter(|&r| own.contains(r)).any(|r| fab.is_slowed(NodeId(node as u32), RailId(r as u16))));
    if slowed && policy != RailPolicy::SingleBackup {
        RailMask::ALL
    } else {
        own
    }
}

/// Rails of the `i`-th rail group of `rails` with `g` ranks and `k` NICs per node: rail
/// `i % k` when `g >= k`, else every rail `r` with `r % g == i` (one rank per node: all).
pub fn rails_of_group(i: usize, g: usize, k: usize) -> RailMask {
    if g >= k {
        RailMask(1u64 << ((i % k) % 64))
    } else {
        RailMask((0..k.min(64)).filter(|r| r % g.max(1) == i).fold(0u64, |m, r| m | 1u64 << r))
    }
}

/// One level of a nested schedule: `members` (indices into the leader list, ring order)
/// run a ring AllReduce of `range`; the other leaders join it.
pub(super) struct Level {
    members: Vec<usize>,
    pub(super) range: Elems,
    mask: RailMask,
}

/// Who is who in a level, as one rank (`me`, its index among the leaders) sees it.
pub(super) struct Roles {
    /// The members, in ring order.
    pub(super) members: Vec<Rank>,
    /// The other leaders (the joiners).
    pub(super) excluded: Vec<Rank>,
    /// This rank's position among the members.
    pub(super) pos: Option<usize>,
    /// This rank's index among the joiners.
    pub(super) joiner: Option<usize>,
}

impl Level {
    /// The level's members and joiners among `leaders`, and `me`'s place in them.
    pub(super) fn roles(&self, leaders: &[Rank], me: Option<usize>) -> Roles {
        let mut inside = vec![false; leaders.len()];
        for &m in &self.members {
            inside[m] = true;
        }
        let members: Vec<Rank> = self.members.iter().map(|&m| leaders[m]).collect();
        let excluded: Vec<Rank> = (0..leaders.len()).filter(|&i| !inside[i]).map(|i| leaders[i]).collect();
        let pos = me.and_then(|i| self.members.iter().position(|&m| m == i));
        let joiner = me.and_then(|i| excluded.iter().position(|&r| r == leaders[i]));
        Roles { members, excluded, pos, joiner }
    }
}

/// Levels with the helper join (R2CCL-AllReduce, recursive AllReduce): every level runs
/// its ring (stage 1); after all of them, the leaders outside a level reduce into a helper
/// and get the result back in `k` chunks (helpers rotate over the members chunk by chunk;
/// members get the result by a chain from the helper). `join_mask`: rails of the joiners'
/// transfers to and from helpers.
fn helper_levels(
    cx: &mut Cx<'_>,
    leaders: &[Rank],
    me: Option<usize>,
    levels: &[Level],
    k: u32,
    join_mask: RailMask,
) -> Result<(), AlgoError> {
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
    for lv in levels {
        let members: Vec<Rank> = lv.members.iter().map(|&m| leaders[m]).collect();
        prims::ring_allreduce(cx, &members, lv.range, lv.mask)?;
    }
    let barrier = cx.sinks_since(0);
    let k = u64::from(k);
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
                cx.send(members[hpos], tag(ph_up), piece, join_mask, &barrier)?;
            }
            if let Some(j) = pos {
                let q = (j + s - hpos) % s;
                if q == 0 {
                    for &e in &excluded {
                        cx.recv(e, tag(ph_up), piece, true, join_mask)?;
                    }
                    for &e in &excluded {
                        cx.send(e, tag(ph_down), piece, join_mask, &[])?;
                    }
                } else {
                    cx.recv(members[(j + s - 1) % s], tag(ph_chain), piece, false, RailMask::ALL)?;
                }
                if q + 1 < s {
                    cx.send(members[(j + 1) % s], tag(ph_chain), piece, RailMask::ALL, &[])?;
                }
            }
            if is_excluded {
                cx.recv(members[hpos], tag(ph_down), piece, false, join_mask)?;
            }
        }
    }
    Ok(())
}

/// Ring admission window of the four-stage schedule, in chunks of `k` (see [`spread`]):
/// a sixteenth of the collective, at least 4 chunks.
///
/// Four chunks keep the members' ring and the scatter-in in step in r2ccl-algo's port
/// model, where a ring that runs ahead only delays the joiners' gather-back (16 chunks of
/// 64 took 1.18 x the bound there instead of 1.09). On real TCP paths each stage also
/// waits behind the bytes queued in socket buffers and shapers; with 256 or 512 chunks a
/// window of 4 is a few milliseconds of data, too little to absorb that, and the ring
/// stalls: the 4 x 2 testbed with one NIC down took 1.076 x the bound at 64 MiB
/// (K = 512) with 4, against 1.056-1.063 with 16 to 64 (`cargo xtask bench --part
/// strategies`, docs/benchmarks.md).
fn ring_window(k: u64) -> u64 {
    (k / 16).max(4)
}

/// One level of the four-stage schedule as this rank sees it.
struct SpreadLevel {
    members: Vec<Rank>,
    excluded: Vec<Rank>,
    range: Elems,
    mask: RailMask,
    /// This rank's position among the members.
    pos: Option<usize>,
    /// This rank's index among the joiners.
    joiner: Option<usize>,
    /// Phases of scatter-in, reduce-scatter, all-gather and gather-back.
    ph: [u16; 4],
    /// Splits of this rank's ring sends to its successor and receives from its predecessor
    /// (around the joiners' load, [`crate::Fabric::joined_ring_split`]); `None` off the ring.
    ring_splits: Option<(SplitRef, SplitRef)>,
}

impl SpreadLevel {
    /// Member `j`'s segment.
    fn seg(&self, j: usize) -> Elems {
        self.range.part(self.members.len() as u64, j as u64)
    }

    /// Whether this rank is in a ring of this level that moves bytes.
    fn rings(&self) -> bool {
        self.pos.is_some() && self.members.len() >= 2 && self.range.len > 0
    }
}

/// The four-stage levels (section 7): each level's members run a ring AllReduce of its
/// range; the other leaders (joiners) scatter their share of it in, evenly over the
/// members, and gather the result back.
///
/// The schedule is chunk-major and rate-matched. Chunk `c` of every level goes through
/// scatter-in, reduce-scatter, all-gather and gather-back (steps are emitted chunk by
/// chunk, level by level, so every rank's program order is the same interleaving), and
/// dependencies keep the stages at the pace the water-filled plan gives them:
/// - ring admission: a member starts the reduce-scatter of chunk `c` only once its own
///   reduce-scatter of chunk `c - w` is complete (`w` of [`ring_window`]) (that chunk's scatter-in
///   included). Reduced chunks, and with them gather-back, flow from the start instead of
///   after the whole reduce-scatter, and a ring runs no more than the window ahead of the
///   scatter-in it needs;
/// - scatter pacing: a joiner's scatter-in message `m` (of `s * K` for a level of `s`
///   members) waits for send `m / (s * K)` (as a fraction) of its own lowest ring, its
///   clock. Without it the scatter-in, ready at once, takes the joiner's NICs first and
///   the ring through the joiner stalls; with it the joiner's NICs carry ring and
///   scatter-in bytes in the plan's proportion all along;
/// - gather-back of a chunk follows its scatter-in and reduce-scatter by data dependencies.
///
/// The messages (peers, sizes, splits) are exactly those of a plain ring AllReduce per
/// level plus one scatter-in and one gather-back message per joiner, member and chunk, so
/// bytes per NIC are unchanged by the pacing.
fn spread(cx: &mut Cx<'_>, leaders: &[Rank], me: Option<usize>, levels: &[Level]) -> Result<(), AlgoError> {
    let k = u64::from(cx.chunks);
    let mut lv = Vec::with_capacity(levels.len());
    for level in levels {
        let ph = [cx.phase(), cx.phase(), cx.phase(), cx.phase()];
        let Roles { members, excluded, pos, joiner } = level.roles(leaders, me);
        let s = members.len();
        let ring_splits = match pos {
            Some(p) if s >= 2 => {
                let (next, prev) = (members[(p + 1) % s], members[(p + s - 1) % s]);
                let to_next = cx.joined_split_ref(cx.me, next, s, &excluded, level.mask)?;
                let from_prev = cx.joined_split_ref(prev, cx.me, s, &excluded, level.mask)?;
                Some((to_next, from_prev))
            }
            _ => None,
        };
        lv.push(SpreadLevel { members, excluded, range: level.range, mask: level.mask, pos, joiner, ph, ring_splits });
    }
    if me.is_none() {
        return Ok(());
    }
    // The clock: this rank's lowest ring, its sends in emission order and their number.
    let clock = lv.iter().position(SpreadLevel::rings);
    let clock_total = clock.map_or(0, |l| 2 * (lv[l].members.len() as u64 - 1) * k);
    let mut clock_sends: Vec<u32> = Vec::new();
    // Per level: the receive that completes this rank's reduce-scatter of each chunk.
    let mut rs_done: Vec<Vec<Option<u32>>> = vec![Vec::new(); lv.len()];
    for c in 0..k {
        let chunk = c as u32;
        for (l, v) in lv.iter().enumerate() {
            let s = v.members.len();
            // Scatter-in; joiner q starts at member q so that joiners do not collide.
            if let Some(q) = v.joiner {
                for a in 0..s {
                    let j = (q + a) % s;
                    let m = c * s as u64 + a as u64;
                    let due = (u128::from(m) * u128::from(clock_total) / (s as u128 * u128::from(k))) as usize;
                    let pace: Vec<u32> = clock_sends.get(due).or(clock_sends.last()).copied().into_iter().collect();
                    cx.send(v.members[j], Tag::new(v.ph[0], 0, chunk), v.seg(j).part(k, c), v.mask, &pace)?;
                }
            }
            if let Some(j) = v.pos {
                for &e in &v.excluded {
                    cx.recv(e, Tag::new(v.ph[0], 0, chunk), v.seg(j).part(k, c), true, v.mask)?;
                }
            }
            // The ring: reduce-scatter, then all-gather.
            if let (Some(pos), Some((out, inn))) = (v.pos, v.ring_splits) {
                let (next, prev) = (v.members[(pos + 1) % s], v.members[(pos + s - 1) % s]);
                let is_clock = clock == Some(l);
                let mut done = None;
                for t in 0..s - 1 {
                    let tag = Tag::new(v.ph[1], t as u32, chunk);
                    let admit: Vec<u32> = match c.checked_sub(ring_window(k)) {
                        Some(w) if t == 0 => rs_done[l].get(w as usize).copied().flatten().into_iter().collect(),
                        _ => Vec::new(),
                    };
                    let (src, dst) =
                        (v.seg((pos + 2 * s - t - 1) % s).part(k, c), v.seg((pos + 2 * s - t - 2) % s).part(k, c));
                    let sent = cx.send_via(next, tag, src, out, &admit);
                    if is_clock {
                        clock_sends.extend(sent);
                    }
                    let got = cx.recv_via(prev, tag, dst, true, inn);
                    done = got.or(done);
                }
                rs_done[l].push(done);
                for t in 0..s - 1 {
                    let tag = Tag::new(v.ph[2], t as u32, chunk);
                    let (src, dst) = (v.seg((pos + s - t) % s).part(k, c), v.seg((pos + 2 * s - t - 1) % s).part(k, c));
                    let sent = cx.send_via(next, tag, src, out, &[]);
                    if is_clock {
                        clock_sends.extend(sent);
                    }
                    cx.recv_via(prev, tag, dst, false, inn);
                }
            }
            // Gather-back.
            if let Some(j) = v.pos {
                for &e in &v.excluded {
                    cx.send(e, Tag::new(v.ph[3], 0, chunk), v.seg(j).part(k, c), v.mask, &[])?;
                }
            }
            if v.joiner.is_some() {
                for (j, &m) in v.members.iter().enumerate() {
                    cx.recv(m, Tag::new(v.ph[3], 0, chunk), v.seg(j).part(k, c), false, v.mask)?;
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
        helper_levels(cx, leaders, me, levels, params.pipeline_chunks, healthy_mask)
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
        helper_levels(cx, leaders, me, &levels, k, RailMask::ALL)
    })
}

/// The four-stage levels of `leaders` for `n` elements: water-filled over bandwidth classes.
pub(super) fn four_stage_levels(cx: &Cx<'_>, leaders: &[Rank], n: u64) -> Result<Vec<Level>, AlgoError> {
    let bw = leader_bandwidths(cx, leaders);
    let plan = if leaders.len() < 2 {
        LevelPlan { thresholds: vec![0.0], fractions: vec![1.0] }
    } else {
        model::four_stage_plan(&bw)?
    };
    Ok(plan_levels(leaders.len(), &bw, &plan, n))
}

/// The four-stage bound-reaching AllReduce (section 7), water-filled over bandwidth classes,
/// one ring per level.
pub(crate) fn four_stage(cx: &mut Cx<'_>, ring: &[Rank], n: u64) -> Result<(), AlgoError> {
    hierarchical(cx, ring, n, |cx, leaders, me| {
        let levels = four_stage_levels(cx, leaders, n)?;
        spread(cx, leaders, me, &levels)
    })
}
