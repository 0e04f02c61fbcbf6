//! The planner's candidates: one cost-model builder per strategy (plain and rail-parallel rings,
//! R2CCL-AllReduce, recursive, four-stage, recursive doubling), the lower bound, and the
//! tie-break between them. `plan.rs` runs them and keeps the fastest.

#[allow(clippy::wildcard_imports, reason = "the planner split by concern: its types are the parent's")]
use super::*;

/// Pipeline chunk counts the planner tries.
pub(super) const CHUNK_CHOICES: [u32; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];
/// What the four-stage schedule costs over the bound when the slowest nodes keep a share of the
/// full ring (they keep more than half the others' bandwidth): each slow node's ring share then
/// goes over one connection to its ring successor, which flows sharing links fairly per
/// connection (and ports held at the slow sender's rate) do not drain in proportion to its bytes.
/// Calibrated on r2ccl-sim's runs of the built schedule (1.155-1.17x the bound under max-min,
/// 1.13-1.20x under the port model; docs/reproduction.md, table 2); where the slow nodes only
/// join (at most half the bandwidth) the schedule reaches the bound and no factor applies.
pub const FOUR_STAGE_SHARED_RING: f64 = 1.15;
/// Chunk counts for reduce-to-helper / broadcast-back stages.
pub(super) const HELPER_CHUNKS: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Relative margin within which recursive AllReduce's prediction counts as equal to
/// R2CCL-AllReduce's (see [`beats`]): with one slower class both closed forms are the same
/// schedule on paper and differ by rounding only.
pub(super) const HELPER_TIE: f64 = 1e-9;

/// The AllReduce a plain candidate with several ranks per node runs.
pub(super) fn node_algorithm(c: &Candidate) -> Algorithm {
    if c.params.rails {
        Algorithm::Rails
    } else {
        Algorithm::Hierarchical
    }
}

/// Everything a candidate evaluation needs.
pub(super) struct Ctx<'a> {
    pub(super) net: Net<'a>,
    pub(super) coll: Collective,
    pub(super) n: usize,
    pub(super) g: u32,
    pub(super) p: usize,
    pub(super) count: u64,
    /// Bytes of one block / buffer (`count * elem`).
    pub(super) block: f64,
    pub(super) alpha: f64,
    /// Per-hop latency inside a node.
    pub(super) intra_alpha: f64,
}

impl Ctx<'_> {
    fn k(&self) -> usize {
        self.net.f.k
    }

    fn acc(&self) -> Acc {
        Acc::new(self.n * self.k())
    }

    fn hop(&self, r: Rate) -> f64 {
        self.alpha * if r.cross { 2.0 } else { 1.0 }
    }

    /// The busiest NIC's time for the bytes of `acc`: the most it sends or receives over its
    /// usable bandwidth (0 without bytes; infinite on a failed NIC with bytes).
    fn busiest(&self, acc: &Acc) -> f64 {
        let k = self.k();
        let mut worst: f64 = 0.0;
        for (x, (&tx, &rx)) in acc.tx.iter().zip(&acc.rx).enumerate() {
            let bytes = tx.max(rx);
            if bytes > 0 {
                let bw = self.net.f.nic(x / k, x % k) as f64 * BYTES_PER_MBPS;
                worst = worst.max(if bw > 0.0 { bytes as f64 / bw } else { f64::INFINITY });
            }
        }
        worst
    }

    /// Node of each position of the flat rank ring that follows `order` (ranks of a node
    /// consecutive).
    fn flat(&self, order: &[usize]) -> Vec<usize> {
        order.iter().flat_map(|&x| std::iter::repeat_n(x, self.g as usize)).collect()
    }

    /// Position of `rank` on the flat ring that follows `order`.
    fn flat_pos(&self, order: &[usize], rank: Rank) -> usize {
        let g = self.g as usize;
        let node = rank.index() / g;
        order.iter().position(|&x| x == node).unwrap_or(0) * g + rank.index() % g
    }

    fn candidate(
        &self,
        strategy: CandidateKind,
        time_s: f64,
        params: StrategyParams,
        acc: Acc,
        total: f64,
    ) -> Candidate {
        Candidate { strategy, time_s, params, nic_bytes: NicBytes::from_acc(self.k(), acc), model_total_bytes: total }
    }
}

/// Ring / Balance / single backup: the collective's plain algorithm with `pol` splits.
pub(super) fn basic(
    c: &mut Ctx<'_>,
    s: CandidateKind,
    order: &[usize],
    pol: RailPolicy,
    reranked: bool,
) -> Result<Option<Candidate>, PlanError> {
    let (n, p) = (c.n as f64, c.p as f64);
    let params = StrategyParams { reranked, ..StrategyParams::default() };
    let mut acc = c.acc();
    let intra = Rate { spb: c.net.intra_spb, cross: false };
    let (t, total, params) = match c.coll {
        Collective::AllReduce { .. } => {
            // Several ranks per node: r2ccl-algo's hierarchical AllReduce (a chain reduce to the
            // node's leader, the leaders' ring, a chain broadcast), pipelined in k chunks; without
            // pipelining the 2(g-1) intra-node hops of the whole buffer would run one after another.
            let r = c.net.ring(&mut c.acc(), order, &[], c.count, 1, RailMask::ALL, pol, true, true)?;
            let g = f64::from(c.g);
            let time = |kf: f64| {
                let ring = if c.n < 2 { 0.0 } else { 2.0 * (n - 1.0) * (kf * c.hop(r) + c.block / n * r.spb) };
                let chain = if c.g > 1 {
                    2.0 * (g - 1.0 + kf - 1.0) * (c.intra_alpha + c.block / kf * c.net.intra_spb)
                } else {
                    0.0
                };
                ring + chain
            };
            let mut best = (time(1.0), 1u32);
            for kk in CHUNK_CHOICES.into_iter().filter(|_| c.g > 1) {
                if u64::from(kk) > c.count.max(1) {
                    break;
                }
                let t = time(f64::from(kk));
                if t < best.0 {
                    best = (t, kk);
                }
            }
            let (t, kk) = best;
            // The rail-parallel AllReduce instead, when it is faster.
            let rails = if c.g > 1 { Some(rails_allreduce(c, order, pol)?) } else { None };
            match rails {
                Some((tr, rk, racc)) if tr < t => {
                    acc = racc;
                    (tr, 2.0 * (n - 1.0) * c.block, StrategyParams { rails: true, chunks: Some(rk), ..params })
                }
                _ => {
                    c.net.ring(&mut acc, order, &[], c.count, kk, RailMask::ALL, pol, true, true)?;
                    let params = if c.g > 1 { StrategyParams { chunks: Some(kk), ..params } } else { params };
                    (t, 2.0 * (n - 1.0) * c.block, params)
                }
            }
        }
        Collective::ReduceScatter { .. } | Collective::AllGather => {
            let rs = matches!(c.coll, Collective::ReduceScatter { .. });
            let flat = c.flat(order);
            let mut r = c.net.ring(&mut acc, &flat, &[], c.p as u64 * c.count, 1, RailMask::ALL, pol, rs, !rs)?;
            if c.g > 1 {
                r = r.worst(intra);
            }
            let inter = if c.n < 2 { 0.0 } else { n };
            ((p - 1.0) * (c.hop(r) + c.block * r.spb), inter * (p - 1.0) * c.block, params)
        }
        Collective::Broadcast { root } | Collective::Reduce { root, .. } => {
            let flat = c.flat(order);
            let rp = c.flat_pos(order, root);
            let shift = usize::from(matches!(c.coll, Collective::Reduce { .. }));
            let chain: Vec<usize> = (0..c.p).map(|q| flat[(rp + shift + q) % c.p]).collect();
            let (sum, worst) = c.net.chain(&mut c.acc(), &chain, 1, 1, pol)?;
            let mut best: Option<(f64, u32)> = None;
            for kk in CHUNK_CHOICES {
                if u64::from(kk) > c.count.max(1) {
                    break;
                }
                let kf = f64::from(kk);
                let piece = c.block / kf;
                let t = (p - 1.0 + kf - 1.0) * c.hop(worst) + piece * (sum + (kf - 1.0) * worst.spb);
                if best.is_none_or(|b| t < b.0) {
                    best = Some((t, kk));
                }
            }
            let (t, kk) = best.unwrap_or((0.0, 1));
            c.net.chain(&mut acc, &chain, c.count, kk, pol)?;
            let inter = chain.windows(2).filter(|w| w[0] != w[1]).count() as f64;
            (t, inter * c.block, StrategyParams { chunks: Some(kk), ..params })
        }
        Collective::AlltoAll => {
            let g = u64::from(c.g);
            c.net.all_pairs(&mut acc, c.count, g * g, 1, pol)?;
            let worst = c.busiest(&acc);
            let gf = f64::from(c.g);
            ((p - 1.0) * c.alpha + worst, n * (n - 1.0) * gf * gf * c.block, params)
        }
        Collective::SendRecv { src, dst } => {
            let g = c.g as usize;
            let (a, b) = (src.index() / g, dst.index() / g);
            if src == dst {
                (0.0, 0.0, params)
            } else {
                let r = c.net.send(&mut acc, a, b, &chunked(&[(c.count, 1)], 1), RailMask::ALL, pol)?;
                let total = if a == b { 0.0 } else { c.block };
                (c.hop(r) + c.block * r.spb, total, params)
            }
        }
    };
    Ok(t.is_finite().then(|| c.candidate(s, t, params, acc, total)))
}

/// r2ccl-algo's rail-parallel AllReduce ([`Algorithm::Rails`]) for `c.g` ranks per node along
/// `order`, in `k` chunks per message: a direct reduce-scatter and a direct all-gather inside
/// each node, one hop each, every rank's links carrying `(g - 1) / g` of the buffer each way,
/// and between them one ring AllReduce per rank of a node over its segment on its rails, all
/// at once (`2 (n - 1)` hops, the busiest NIC's bytes over its bandwidth). Every message of a
/// connection goes after the one before, each with its hop. The intra-node phases and the NIC
/// phase use different links, so with `k` chunks they overlap but for `1/k` of the shorter
/// one. Returns the time, the chunk count and the bytes per NIC.
pub(super) fn rails_allreduce(c: &mut Ctx<'_>, order: &[usize], pol: RailPolicy) -> Result<(f64, u32, Acc), PlanError> {
    let (n, g) = (c.n as f64, f64::from(c.g));
    let mut probe = c.acc();
    let mut hop: f64 = 0.0;
    for i in 0..c.g as usize {
        let (_, len) = r2ccl_algo::even_part(c.count, u64::from(c.g), i as u64);
        let mask = r2ccl_algo::rails_group_mask(c.net.af, i, c.g as usize, pol);
        let r = c.net.ring(&mut probe, order, &[], len, 1, mask, pol, true, true)?;
        hop = hop.max(c.hop(r));
    }
    let nic_bytes = if c.n < 2 { 0.0 } else { c.busiest(&probe) };
    let nvlink_bytes = 2.0 * (g - 1.0) * c.block / g * c.net.intra_spb;
    let time = |kf: f64| {
        let nvlink = 2.0 * kf * c.intra_alpha + nvlink_bytes;
        let nic = if c.n < 2 { 0.0 } else { 2.0 * (n - 1.0) * kf * hop + nic_bytes };
        nvlink.max(nic) + nvlink.min(nic) / kf
    };
    let mut best = (time(1.0), 1u32);
    for kk in CHUNK_CHOICES {
        if u64::from(kk) * u64::from(c.g) > c.count.max(1) {
            break;
        }
        let t = time(f64::from(kk));
        if t < best.0 {
            best = (t, kk);
        }
    }
    let (t, kk) = best;
    let mut acc = c.acc();
    for i in 0..c.g as usize {
        let (_, len) = r2ccl_algo::even_part(c.count, u64::from(c.g), i as u64);
        let mask = r2ccl_algo::rails_group_mask(c.net.af, i, c.g as usize, pol);
        c.net.ring(&mut acc, order, &[], len, kk, mask, pol, true, true)?;
    }
    Ok((t, kk, acc))
}

/// Usable Mbit/s of each node along `order`, as the nested builders see them.
pub(super) fn order_mbps(f: &Fabric, order: &[usize]) -> Vec<f64> {
    order.iter().map(|&i| f.node_bw[i] as f64).collect()
}

/// The slowest edge of the helper chain among `members` (r2ccl-algo's `helper_levels`: member
/// `j` passes each piece to member `j + 1` over all rails, Balance splits).
pub(super) fn chain_rate(c: &mut Ctx<'_>, members: &[usize]) -> Result<Rate, PlanError> {
    let mut worst = Rate::default();
    if members.len() < 2 {
        return Ok(worst);
    }
    for (q, &m) in members.iter().enumerate() {
        worst = worst.worst(c.net.rate(m, members[(q + 1) % members.len()], RailMask::ALL, RailPolicy::Balance)?);
    }
    Ok(worst)
}

/// What the helper chain of one level adds after its last fold-in (seconds): r2ccl-algo's
/// `helper_levels` gives each of the `k` pieces (`piece` bytes) to one helper, which passes the
/// result on whole to the other `s - 1` members along a store-and-forward chain, one hop after
/// the other. The chains of earlier pieces overlap the join; the last piece's does not:
/// `(s - 1) * (alpha per hop + piece / B_chain)`. Zero for a level without joiners or with one
/// member.
pub(super) fn chain_tail(c: &Ctx<'_>, s: usize, has_joiners: bool, piece: f64, rate: Rate) -> f64 {
    if !has_joiners || s < 2 {
        return 0.0;
    }
    (s as f64 - 1.0) * (c.hop(rate) + piece * rate.spb)
}

/// One level of a nested schedule: member and excluded nodes, and its element count.
pub(super) struct Level {
    pub(super) members: Vec<usize>,
    pub(super) excluded: Vec<usize>,
    pub(super) len: u64,
    pub(super) fraction: f64,
}

pub(super) fn levels(order: &[usize], bw: &[f64], plan: &model::LevelPlan, count: u64) -> Vec<Level> {
    let ranges = model::level_ranges(count, &plan.fractions);
    plan.thresholds
        .iter()
        .zip(&plan.fractions)
        .zip(ranges)
        .map(|((&t, &fraction), (_, len))| {
            let (members, excluded) = (0..order.len()).partition::<Vec<usize>, _>(|&i| bw[i] >= t);
            Level {
                members: members.into_iter().map(|i| order[i]).collect(),
                excluded: excluded.into_iter().map(|i| order[i]).collect(),
                len,
                fraction,
            }
        })
        .collect()
}

/// R2CCL-AllReduce (section 5.2) for exactly one degraded node.
pub(super) fn r2ccl_allreduce(c: &mut Ctx<'_>, order: &[usize]) -> Result<Option<Candidate>, PlanError> {
    let n = c.n;
    let max = c.net.f.node_bw.iter().copied().max().unwrap_or(0);
    let mut slow = (0..n).filter(|&i| c.net.f.node_bw[i] < max);
    let Some(dn) = slow.next() else { return Ok(None) };
    if slow.next().is_some() || n < 3 {
        return Ok(None);
    }
    let h = c.net.af.healthy_rails(NodeId(dn as u32));
    let healthy: Vec<usize> = order.iter().copied().filter(|&x| x != dn).collect();
    let pol = RailPolicy::Balance;
    let mut main = Rate::default();
    for q in 0..n {
        main = main.worst(c.net.rate(order[q], order[(q + 1) % n], h, pol)?);
    }
    let mut tail = Rate::default();
    for q in 0..healthy.len() {
        tail = tail.worst(c.net.rate(healthy[q], healthy[(q + 1) % healthy.len()], h.not(), pol)?);
    }
    let mut join = Rate::default();
    for &m in &healthy {
        join = join.worst(c.net.rate(dn, m, h, pol)?).worst(c.net.rate(m, dn, h, pol)?);
    }
    let chain = chain_rate(c, &healthy)?;
    if !(main.spb.is_finite() && tail.spb.is_finite() && join.spb.is_finite() && chain.spb.is_finite()) {
        return Ok(None);
    }
    let nf = n as f64;
    let d = c.block;
    let x = 1.0 - c.net.f.node_bw[dn] as f64 / max as f64;
    let a = 2.0 * (nf - 1.0) / nf * d * main.spb;
    let b = 2.0 * (nf - 2.0) / (nf - 1.0) * d * tail.spb;
    let y_eq = if a + b > 0.0 { a / (a + b) } else { x };
    let mut best: Option<(f64, f64, u32)> = None;
    for y in [x, y_eq] {
        if !(y > 0.0 && y < 1.0) {
            continue;
        }
        for k in HELPER_CHUNKS {
            let kf = f64::from(k);
            let t1 = 2.0 * (nf - 1.0) * (c.hop(main) + (1.0 - y) * d / nf * main.spb);
            let t2 = 2.0 * (nf - 2.0) * (c.hop(tail) + y * d / (nf - 1.0) * tail.spb);
            let t3 = (kf + 1.0) * (c.hop(join) + y * d / kf * join.spb);
            // The paper's T3 ends when the degraded node has its result; the built schedule
            // ends when the helper chain has passed the last piece to every healthy node.
            let t = t1.max(t2) + t3 + chain_tail(c, healthy.len(), true, y * d / kf, chain);
            if best.is_none_or(|bb| t < bb.0) {
                best = Some((t, y, k));
            }
        }
    }
    let Some((t, y, k)) = best else { return Ok(None) };
    let params = R2cclParams { degraded: NodeId(dn as u32), tail_fraction: y, pipeline_chunks: k };
    let main_len = params.main_len(c.count);
    let mut acc = c.acc();
    c.net.ring(&mut acc, order, &[], main_len, 1, h, pol, true, true)?;
    c.net.ring(&mut acc, &healthy, &[], c.count - main_len, 1, h.not(), pol, true, true)?;
    c.net.helper_join(&mut acc, &healthy, &[dn], c.count - main_len, k, h, pol)?;
    let total = 2.0 * (nf - 1.0) * (1.0 - y) * d + 2.0 * (nf - 2.0) * y * d + 2.0 * y * d + (nf - 2.0) * y * d;
    let sp = StrategyParams {
        tail_fraction: Some(y),
        chunks: Some(k),
        degraded: Some(NodeId(dn as u32)),
        reranked: true,
        ..StrategyParams::default()
    };
    Ok(Some(c.candidate(CandidateKind::R2cclAllReduce, t, sp, acc, total)))
}

/// Recursive AllReduce (section 6.2) with `r2ccl_algo::model::recursive_plan`.
pub(super) fn recursive(c: &mut Ctx<'_>, order: &[usize]) -> Result<Candidate, PlanError> {
    let n = c.n as f64;
    let bw = order_mbps(c.net.f, order);
    let plan = model::recursive_plan(&bw)?;
    let bytes_bw: Vec<f64> = bw.iter().map(|b| b * BYTES_PER_MBPS).collect();
    let lv = levels(order, &bw, &plan, c.count);
    let mut chains = Vec::with_capacity(lv.len());
    for l in &lv {
        chains.push(chain_rate(c, &l.members)?);
    }
    // The closed form water-fills stage 1: each level's ring gets just the share of a member's
    // NICs that ends all levels together. The built schedule runs every level's ring on all
    // rails, and a NIC serves its connections alike, so stage 1 takes longer: what it adds.
    let shared_stage1 = {
        let bplan = model::recursive_plan(&bytes_bw)?;
        let closed = model::level_loads(&bytes_bw, &bplan, false)
            .iter()
            .zip(&bytes_bw)
            .map(|(l, b)| l * c.block / b)
            .fold(0.0, f64::max);
        (rings_shared_time(&bytes_bw, &bplan, c.block) - closed).max(0.0)
    };
    let mut best: Option<(f64, u32)> = None;
    for k in HELPER_CHUNKS {
        let kf = f64::from(k);
        // The levels' joins run at once (the closed form's stage 2); each level's chain then
        // passes its last piece on, so the slowest chain tail follows stage 2.
        let tail = lv
            .iter()
            .zip(&chains)
            .map(|(l, &r)| chain_tail(c, l.members.len(), !l.excluded.is_empty(), l.fraction * c.block / kf, r))
            .fold(0.0, f64::max);
        let t = model::recursive_time(&bytes_bw, c.block, Some(k))?
            + shared_stage1
            + (2.0 * (n - 1.0) + kf + 1.0) * c.alpha
            + tail;
        if best.is_none_or(|b| t < b.0) {
            best = Some((t, k));
        }
    }
    let (t, k) = best.unwrap_or((f64::INFINITY, 1));
    let mut acc = c.acc();
    let mut total = 0.0;
    for l in &lv {
        c.net.ring(&mut acc, &l.members, &[], l.len, 1, RailMask::ALL, RailPolicy::Balance, true, true)?;
    }
    for l in &lv {
        c.net.helper_join(&mut acc, &l.members, &l.excluded, l.len, k, RailMask::ALL, RailPolicy::Balance)?;
        let (s, e) = (l.members.len() as f64, l.excluded.len() as f64);
        let chain = if e > 0.0 { s - 1.0 } else { 0.0 };
        total += (2.0 * (s - 1.0) + 2.0 * e + chain) * l.fraction * c.block;
    }
    let params = StrategyParams {
        chunks: Some(k),
        level_fractions: plan.fractions.clone(),
        class_mbps: plan.thresholds.iter().map(|&t| t as u64).collect(),
        reranked: true,
        ..StrategyParams::default()
    };
    Ok(c.candidate(CandidateKind::Recursive, t, params, acc, total))
}

/// How long the rings of the levels of `plan` take together when they share every member
/// node's bandwidth (`bw`, bytes/s) alike per ring, for a buffer of `d` bytes: a fluid model.
/// Level `l` rings `fraction_l * d` among the nodes at or above its threshold, `2 (s - 1) / s`
/// of it out of each member; the levels' rates are max-min fair over the nodes (each level
/// uses every member node, whose bandwidth its levels share), recomputed whenever a level ends.
pub(super) fn rings_shared_time(bw: &[f64], plan: &model::LevelPlan, d: f64) -> f64 {
    let levels = plan.thresholds.len().min(plan.fractions.len());
    let member = |l: usize, i: usize| bw[i] >= plan.thresholds[l];
    let mut left: Vec<f64> = (0..levels)
        .map(|l| {
            let s = (0..bw.len()).filter(|&i| member(l, i)).count() as f64;
            if s > 1.0 {
                plan.fractions[l].max(0.0) * d * 2.0 * (s - 1.0) / s
            } else {
                0.0
            }
        })
        .collect();
    let mut t = 0.0;
    for _ in 0..levels {
        let active: Vec<usize> = (0..levels).filter(|&l| left[l] > 0.0).collect();
        if active.is_empty() {
            break;
        }
        // Progressive filling: raise the unfrozen levels' rates together until a node is full.
        let mut rate = vec![0.0f64; levels];
        let mut frozen = vec![false; levels];
        let mut spare: Vec<f64> = bw.to_vec();
        while active.iter().any(|&l| !frozen[l]) {
            let count = |i: usize| active.iter().filter(|&&l| !frozen[l] && member(l, i)).count();
            let step = (0..bw.len())
                .filter(|&i| count(i) > 0)
                .map(|i| spare[i].max(0.0) / count(i) as f64)
                .fold(f64::INFINITY, f64::min);
            if !step.is_finite() {
                break;
            }
            for &l in &active {
                if !frozen[l] {
                    rate[l] += step;
                }
            }
            for (i, sp) in spare.iter_mut().enumerate() {
                *sp -= step * count(i) as f64;
            }
            for &l in &active {
                if !frozen[l] && (0..bw.len()).any(|i| member(l, i) && spare[i] <= 1e-9 * bw[i]) {
                    frozen[l] = true;
                }
            }
        }
        let dt = active.iter().filter(|&&l| rate[l] > 0.0).map(|&l| left[l] / rate[l]).fold(f64::INFINITY, f64::min);
        if !dt.is_finite() {
            return f64::INFINITY;
        }
        t += dt;
        for &l in &active {
            left[l] = if left[l] - rate[l] * dt <= 1e-9 * d { 0.0 } else { left[l] - rate[l] * dt };
        }
    }
    t
}

/// The smallest message of a direct four-stage level the planner pipelines into: no more
/// pipeline chunks than leave each of a member's messages this many bytes.
///
/// A direct level keeps every pair of its nodes busy at once with `K` messages each, so the
/// number of messages in flight grows with the level's size as well as with `K`, and each one
/// pays a rendezvous handshake. On the shaped TCP testbed (4 x 4 NICs at 50mbit, one lost, 64 MiB
/// in 16 MiB segments) the time over the bound went 1.24-1.31 at K = 8 (512 KiB messages),
/// 1.46 at K = 32 and 2.06 at K = 64 (docs/benchmarks.md); NCCL's network chunks are of the same
/// order. At 1 GiB it still allows K = 128 for 16 nodes (a pipeline fill under 1%).
pub const DIRECT_PART_MIN_BYTES: f64 = (512 << 10) as f64;

/// The four-stage AllReduce (section 7) with `r2ccl_algo::model::four_stage_plan`: one ring per
/// level ([`CandidateKind::FourStage`]) or direct exchanges per level over fair-share splits
/// ([`CandidateKind::FourStageDirect`], `direct`).
pub(super) fn four_stage(c: &mut Ctx<'_>, order: &[usize], direct: bool) -> Result<Candidate, PlanError> {
    let n = c.n as f64;
    let bw = order_mbps(c.net.f, order);
    let plan = model::four_stage_plan(&bw)?;
    let bytes_bw: Vec<f64> = bw.iter().map(|b| b * BYTES_PER_MBPS).collect();
    let t_bw = if direct {
        // Node-level, the plan reaches the bound, and so does the built schedule under fair
        // sharing of NICs between connections where its same-rail parts load every NIC in
        // proportion to its bandwidth; where rails the nodes do not share leave a NIC more than
        // its share, that NIC's bytes set the time.
        let mut whole = c.acc();
        for l in levels(order, &bw, &plan, c.count) {
            c.net.direct_level(&mut whole, &l.members, &l.excluded, l.len, 1, RailMask::ALL)?;
        }
        model::four_stage_time(&bytes_bw, c.block)?.max(c.busiest(&whole))
    } else {
        // The bandwidth model reaches the bound; the built schedule does not when the slowest
        // class keeps a share of the full ring (see FOUR_STAGE_SHARED_RING).
        let shared_ring = plan.thresholds.len() > 1 && plan.fractions.first().is_some_and(|&f| f > 1e-9);
        model::four_stage_time(&bytes_bw, c.block)? * if shared_ring { FOUR_STAGE_SHARED_RING } else { 1.0 }
    };
    let mut best = (f64::INFINITY, 1u32);
    for k in CHUNK_CHOICES {
        let kf = f64::from(k);
        let small = direct && c.block / (n * kf) < DIRECT_PART_MIN_BYTES;
        if k > 1 && (u64::from(k) > c.count.max(1) || small) {
            break;
        }
        // Hops on a chunk's path: a ring's 2 (n - 1) plus scatter-in and gather-back. A direct
        // level has two (its reduce-scatter, scatter-in included, and its all-gather), but is
        // charged the rings' count: with two, it became the choice for every size from 4 KiB on
        // 4 x 2 nodes with a NIC lost, in place of recursive doubling and Balance, whose results
        // are bit-identical to the fault-free run's (the DDP example checks that); its own
        // reduction order is not. Where its bandwidth wins (4 and more NICs) it is chosen anyway.
        let hops = 2.0 * (n - 1.0) + 2.0;
        let t = t_bw * (1.0 + 1.0 / kf) + (hops + kf - 1.0) * c.alpha;
        if t < best.0 {
            best = (t, k);
        }
    }
    let (t, k) = best;
    let mut acc = c.acc();
    for l in levels(order, &bw, &plan, c.count) {
        if direct {
            c.net.direct_level(&mut acc, &l.members, &l.excluded, l.len, k, RailMask::ALL)?;
        } else {
            c.net.spread_join(&mut acc, &l.members, &l.excluded, l.len, k)?;
            c.net.ring(&mut acc, &l.members, &l.excluded, l.len, k, RailMask::ALL, RailPolicy::Spread, true, true)?;
        }
    }
    let params = StrategyParams {
        chunks: Some(k),
        ring_fraction: plan.fractions.first().copied(),
        level_fractions: plan.fractions.clone(),
        class_mbps: plan.thresholds.iter().map(|&t| t as u64).collect(),
        reranked: true,
        ..StrategyParams::default()
    };
    let kind = if direct { CandidateKind::FourStageDirect } else { CandidateKind::FourStage };
    Ok(c.candidate(kind, t, params, acc, 2.0 * (n - 1.0) * c.block))
}

/// Recursive doubling over all ranks along the flat ring (r2ccl-algo's tree AllReduce).
pub(super) fn recursive_doubling(c: &mut Ctx<'_>, order: &[usize]) -> Result<Option<Candidate>, PlanError> {
    let flat = c.flat(order);
    let p = c.p;
    if p < 2 {
        return Ok(None);
    }
    let p2 = 1usize << (usize::BITS - 1 - p.leading_zeros());
    let extra = p - p2;
    let msgs = chunked(&[(c.count, 1)], 1);
    let mut acc = c.acc();
    let (mut t, mut total) = (0.0, 0.0);
    let pol = RailPolicy::Balance;
    // A round: its intra-node pairs take a hop inside the node and their buffer at the intra-node
    // rate. Its inter-node pairs take a hop and their buffer at their transfer's rate, and as they
    // share their nodes' NICs, at least the busiest NIC's bytes of the round over its bandwidth.
    let mut round = |c: &mut Ctx<'_>, acc: &mut Acc, pairs: &[(usize, usize)]| -> Result<f64, PlanError> {
        let mut worst: f64 = 0.0;
        let mut hop: Option<f64> = None;
        let mut ra = c.acc();
        for &(a, b) in pairs {
            let r = c.net.send(&mut ra, flat[a], flat[b], &msgs, RailMask::ALL, pol)?;
            if flat[a] != flat[b] {
                total += c.block;
                hop = Some(hop.unwrap_or(0.0).max(c.hop(r)));
                worst = worst.max(c.hop(r) + c.block * r.spb);
            } else {
                worst = worst.max(c.intra_alpha + c.block * r.spb);
            }
        }
        for (x, (tx, rx)) in ra.tx.iter().zip(&ra.rx).enumerate() {
            acc.tx[x] += tx;
            acc.rx[x] += rx;
        }
        Ok(worst.max(hop.map_or(0.0, |h| h + c.busiest(&ra))))
    };
    let fold: Vec<(usize, usize)> = (0..extra).map(|e| (2 * e, 2 * e + 1)).collect();
    if extra > 0 {
        t += round(c, &mut acc, &fold)?;
    }
    let real = |id: usize| if id < extra { 2 * id + 1 } else { id + extra };
    let mut dist = 1;
    while dist < p2 {
        let pairs: Vec<(usize, usize)> = (0..p2).map(|id| (real(id), real(id ^ dist))).collect();
        t += round(c, &mut acc, &pairs)?;
        dist <<= 1;
    }
    if extra > 0 {
        let back: Vec<(usize, usize)> = fold.iter().map(|&(a, b)| (b, a)).collect();
        t += round(c, &mut acc, &back)?;
    }
    let params = StrategyParams { reranked: true, ..StrategyParams::default() };
    Ok(t.is_finite().then(|| c.candidate(CandidateKind::RecursiveDoubling, t, params, acc, total)))
}

/// Intra-node phases of r2ccl-algo's hierarchical wrapper around the nested strategies for G
/// ranks per node (seconds): a chain reduce to the node's leader before the inter-node part and a
/// chain broadcast after it, each over the whole buffer and pipelined in `k` chunks (the
/// schedule's chunk count: four-stage's K, 1 for R2CCL-AllReduce and recursive).
pub(super) fn intra(topo: &Topology, d: f64, k: u32) -> f64 {
    let g = f64::from(topo.ranks_per_node());
    if g <= 1.0 || d == 0.0 {
        return 0.0;
    }
    let bw = topo.intra_gbps() * 1e9 / 8.0;
    let kf = f64::from(k.max(1));
    2.0 * (g - 1.0 + kf - 1.0) * (topo.intra_alpha_s() + d / kf / bw)
}

/// Lower bound on the inter-node time (bandwidth model) with `d` bytes per rank.
pub(super) fn lower_bound(f: &Fabric, coll: Collective, d: f64, g: u32) -> Result<f64, PlanError> {
    let n = f.node_count();
    if d == 0.0 {
        return Ok(0.0);
    }
    let nf = n as f64;
    let bw: Vec<f64> = f.node_bw.iter().map(|&b| b as f64 * BYTES_PER_MBPS).collect();
    let sum: f64 = bw.iter().sum();
    let min = bw.iter().copied().fold(f64::INFINITY, f64::min);
    if let Collective::SendRecv { src, dst } = coll {
        let (a, b) = (src.index() / g as usize, dst.index() / g as usize);
        return Ok(if a == b { 0.0 } else { d / bw[a].min(bw[b]) });
    }
    if n < 2 {
        return Ok(0.0);
    }
    Ok(match coll {
        Collective::AllReduce { .. } => model::lower_bound(&bw, d)?,
        Collective::ReduceScatter { .. } | Collective::AllGather => {
            ((nf - 1.0) * d / sum).max((nf - 1.0) / nf * d / min)
        }
        Collective::Broadcast { .. } | Collective::Reduce { .. } => d / min,
        Collective::AlltoAll | Collective::SendRecv { .. } => f64::from(g) * (nf - 1.0) / nf * d / min,
    })
}

/// Whether candidate `c` (later in [`CandidateKind::ALL`] order) replaces `best`: it must be
/// strictly faster. Recursive AllReduce must also beat R2CCL-AllReduce by more than
/// [`HELPER_TIE`]: its prediction (the closed form plus the helper chain) does not yet charge
/// what its built schedule costs in stage 1, where r2ccl-algo runs both level rings on all
/// rails and the tail ring takes link share from the main ring on every healthy NIC (about 4 ms
/// of 42.6 at 64 x 8 nodes, docs/reproduction.md). R2CCL-AllReduce keeps the main ring on the
/// degraded node's live rails and the tail ring on the others, so at equal predictions it is the
/// faster schedule.
pub(super) fn beats(c: &Candidate, best: &Candidate) -> bool {
    if c.strategy == CandidateKind::Recursive && best.strategy == CandidateKind::R2cclAllReduce {
        return c.time_s < best.time_s * (1.0 - HELPER_TIE);
    }
    c.time_s < best.time_s
}
