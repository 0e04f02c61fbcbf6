//! Per-NIC bytes of the schedules `r2ccl-algo` builds, computed at node level without
//! building them: every inter-node message of a builder is replayed as (sender node,
//! receiver node, length) and split over NICs by the same [`r2ccl_algo::Fabric::split`] and
//! [`r2ccl_algo::RailSplit::divide`] the builders and [`r2ccl_algo::Traffic`] use, so the
//! planner's predicted bytes per NIC equal the built schedule's exactly.
//!
//! Splits depend only on the health rows of the two ends, so they are computed once per
//! pair of node *types* (nodes with equal usable and nominal NIC rates) and cached.

use crate::fabric::{Fabric, BYTES_PER_MBPS};
use crate::PlanError;
use r2ccl_algo::{even_part, Fabric as AlgoFabric, RailMask, RailPolicy, RailSplit};
use r2ccl_core::NodeId;
use std::collections::HashMap;

/// The split cache's map (keys are a few small integers; the cache is private).
type FastMap<K, V> = r2ccl_core::fastmap::IntMap<K, V>;

/// Bytes per part of a transfer: `(src rail, dst rail, bytes)`.
type Shares = Vec<(usize, usize, u64)>;

/// A multiset of message lengths in elements: `(length, how many)`.
pub(crate) type Msgs = Vec<(u64, u64)>;

/// The lengths of `parts` near-equal parts of `total` elements (as [`even_part`] cuts them).
pub(crate) fn even(total: u64, parts: u64) -> [(u64, u64); 2] {
    let parts = parts.max(1);
    let (base, rem) = (total / parts, total % parts);
    [(base + 1, rem), (base, parts - rem)]
}

/// Messages of `segments` (each `(length, times)`) cut into `chunks` pieces each.
pub(crate) fn chunked(segments: &[(u64, u64)], chunks: u32) -> Msgs {
    let mut out = Msgs::with_capacity(segments.len() * 2);
    for &(len, times) in segments {
        if times == 0 || len == 0 {
            continue;
        }
        for (l, t) in even(len, u64::from(chunks)) {
            if l > 0 && t > 0 {
                out.push((l, t * times));
            }
        }
    }
    out
}

/// Number of `c` in `0..end` with `c % s == h`.
fn residues(h: u64, s: u64, end: u64) -> u64 {
    if h < end {
        (end - 1 - h) / s + 1
    } else {
        0
    }
}

/// Key of a joined ring edge: sender and receiver types, mask, policy, the level's member
/// count and its joiners' types (sorted).
type JoinedKey = (usize, usize, u64, RailPolicy, usize, Vec<usize>);

/// One cached (type, type, mask, policy) split with its derived rates.
struct EdgeInfo {
    split: RailSplit,
    /// Seconds per byte of the transfer when alone on its NICs (spine-limited for cross-rail parts).
    spb: f64,
    /// Whether some part crosses rails (through the spine).
    cross: bool,
    /// `divide` results by message length in bytes.
    divs: Vec<(u64, Vec<u64>)>,
}

/// Per-NIC byte accumulator, `[node * rails + rail]`.
#[derive(Clone, Debug)]
pub(crate) struct Acc {
    pub(crate) tx: Vec<u64>,
    pub(crate) rx: Vec<u64>,
}

impl Acc {
    pub(crate) fn new(nics: usize) -> Self {
        Self { tx: vec![0; nics], rx: vec![0; nics] }
    }
}

/// What a transfer costs: seconds per byte and whether it crosses rails.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Rate {
    pub(crate) spb: f64,
    pub(crate) cross: bool,
}

impl Rate {
    pub(crate) fn worst(self, other: Rate) -> Rate {
        Rate { spb: self.spb.max(other.spb), cross: self.cross || other.cross }
    }
}

/// The replaying context: both fabrics, the element size and the split cache.
pub(crate) struct Net<'a> {
    pub(crate) f: &'a Fabric,
    pub(crate) af: &'a AlgoFabric,
    pub(crate) elem: u64,
    /// Seconds per byte inside a node.
    pub(crate) intra_spb: f64,
    ty: Vec<usize>,
    cache: FastMap<(usize, usize, u64, RailPolicy), usize>,
    /// Edges of rings that joiners share (see [`Net::edge_joined`]): the plain key plus the
    /// level's member count and its joiners' types.
    joined: FastMap<JoinedKey, usize>,
    /// Edges of the direct four-stage levels (see [`Net::direct_level`]), by sender and
    /// receiver type and mask: r2ccl-algo's `fair_split` among every node.
    fair: FastMap<(usize, usize, u64), usize>,
    edges: Vec<EdgeInfo>,
}

impl<'a> Net<'a> {
    pub(crate) fn new(f: &'a Fabric, af: &'a AlgoFabric, elem: u64, intra_spb: f64) -> Self {
        let k = f.k;
        let n = f.node_count();
        let mut types: HashMap<(&[u64], &[u64]), usize> = HashMap::new();
        let mut ty = Vec::with_capacity(n);
        for i in 0..n {
            let key = (&f.bw[i * k..(i + 1) * k], &f.nominal[i * k..(i + 1) * k]);
            let next = types.len();
            ty.push(*types.entry(key).or_insert(next));
        }
        Self {
            f,
            af,
            elem: elem.max(1),
            intra_spb,
            ty,
            cache: FastMap::default(),
            joined: FastMap::default(),
            fair: FastMap::default(),
            edges: Vec::new(),
        }
    }

    fn edge(&mut self, a: usize, b: usize, mask: RailMask, pol: RailPolicy) -> Result<usize, PlanError> {
        let key = (self.ty[a], self.ty[b], mask.0, pol);
        if let Some(&e) = self.cache.get(&key) {
            return Ok(e);
        }
        let split = self.af.split(NodeId(a as u32), NodeId(b as u32), mask, pol)?;
        let e = self.edge_from(a, b, split);
        self.cache.insert(key, e);
        Ok(e)
    }

    /// The edge of a direct four-stage transfer from node `a` to node `b`, when every pair of
    /// nodes exchanges data at once (r2ccl-algo's `fair_split` among all nodes).
    fn edge_fair(&mut self, a: usize, b: usize, mask: RailMask) -> Result<usize, PlanError> {
        let key = (self.ty[a], self.ty[b], mask.0);
        if let Some(&e) = self.fair.get(&key) {
            return Ok(e);
        }
        let nodes: Vec<NodeId> = (0..self.f.node_count()).map(|i| NodeId(i as u32)).collect();
        let split = self.af.fair_split(NodeId(a as u32), NodeId(b as u32), &nodes, mask)?;
        let e = self.edge_from(a, b, split);
        self.fair.insert(key, e);
        Ok(e)
    }

    /// The edge of a ring transfer from member `a` to member `b` of a level of `members`
    /// whose `joiners` also load the members' NICs (r2ccl-algo's `joined_ring_split`).
    fn edge_joined(
        &mut self,
        a: usize,
        b: usize,
        members: usize,
        joiners: &[usize],
        mask: RailMask,
        pol: RailPolicy,
    ) -> Result<usize, PlanError> {
        let mut types: Vec<usize> = joiners.iter().map(|&j| self.ty[j]).collect();
        types.sort_unstable();
        let key = (self.ty[a], self.ty[b], mask.0, pol, members, types);
        if let Some(&e) = self.joined.get(&key) {
            return Ok(e);
        }
        let nodes: Vec<NodeId> = joiners.iter().map(|&j| NodeId(j as u32)).collect();
        let split = self.af.joined_ring_split(NodeId(a as u32), NodeId(b as u32), members, &nodes, mask, pol)?;
        let e = self.edge_from(a, b, split);
        self.joined.insert(key, e);
        Ok(e)
    }

    /// A new edge from node `a` to node `b` over `split`, with its rate.
    fn edge_from(&mut self, a: usize, b: usize, split: r2ccl_algo::RailSplit) -> usize {
        let k = self.f.k;
        let total = split.total_weight().max(1) as f64;
        let (mut txf, mut rxf) = (vec![0.0; k], vec![0.0; k]);
        let mut crossf = 0.0;
        for p in &split.parts {
            let w = p.weight as f64 / total;
            txf[p.src.index()] += w;
            rxf[p.dst.index()] += w;
            if p.src != p.dst {
                crossf += w;
            }
        }
        let mut spb: f64 = 0.0;
        for r in 0..k {
            for (frac, node) in [(txf[r], a), (rxf[r], b)] {
                if frac > 0.0 {
                    let bw = self.f.nic(node, r) as f64 * BYTES_PER_MBPS;
                    spb = spb.max(if bw > 0.0 { frac / bw } else { f64::INFINITY });
                }
            }
        }
        if crossf > 0.0 {
            let spine = self.f.spine(a, b) as f64 * BYTES_PER_MBPS;
            spb = spb.max(if spine > 0.0 { crossf / spine } else { f64::INFINITY });
        }
        self.edges.push(EdgeInfo { split, spb, cross: crossf > 0.0, divs: Vec::new() });
        self.edges.len() - 1
    }

    /// The rate of a transfer from node `a` to node `b` (intra-node when equal).
    pub(crate) fn rate(&mut self, a: usize, b: usize, mask: RailMask, pol: RailPolicy) -> Result<Rate, PlanError> {
        if a == b {
            return Ok(Rate { spb: self.intra_spb, cross: false });
        }
        let e = self.edge(a, b, mask, pol)?;
        Ok(Rate { spb: self.edges[e].spb, cross: self.edges[e].cross })
    }

    /// Bytes of each part of edge `e` for one message of `len` elements.
    fn divide(&mut self, e: usize, len: u64) -> usize {
        let bytes = len * self.elem;
        let info = &mut self.edges[e];
        if let Some(i) = info.divs.iter().position(|(l, _)| *l == bytes) {
            return i;
        }
        let d = info.split.divide(bytes, self.elem);
        info.divs.push((bytes, d));
        info.divs.len() - 1
    }

    /// Account messages `msgs` from node `a` to node `b`; returns the transfer's rate.
    pub(crate) fn send(
        &mut self,
        acc: &mut Acc,
        a: usize,
        b: usize,
        msgs: &[(u64, u64)],
        mask: RailMask,
        pol: RailPolicy,
    ) -> Result<Rate, PlanError> {
        if a == b {
            return Ok(Rate { spb: self.intra_spb, cross: false });
        }
        let e = self.edge(a, b, mask, pol)?;
        Ok(self.send_on(acc, a, b, e, msgs))
    }

    /// Account messages `msgs` from node `a` to node `b` over edge `e`; returns its rate.
    fn send_on(&mut self, acc: &mut Acc, a: usize, b: usize, e: usize, msgs: &[(u64, u64)]) -> Rate {
        let k = self.f.k;
        for &(len, times) in msgs {
            if len == 0 || times == 0 {
                continue;
            }
            let di = self.divide(e, len);
            let info = &self.edges[e];
            for (p, bytes) in info.split.parts.iter().zip(&info.divs[di].1) {
                acc.tx[a * k + p.src.index()] += times * bytes;
                acc.rx[b * k + p.dst.index()] += times * bytes;
            }
        }
        Rate { spb: self.edges[e].spb, cross: self.edges[e].cross }
    }

    /// A ring reduce-scatter (`rs`) and/or all-gather (`ag`) among `nodes` (the node of each
    /// ring position) over `total` elements cut into one segment per position, each segment
    /// in `chunks` messages. Returns the slowest inter-node edge. A four-stage level passes its
    /// `joiners` (none elsewhere): their scatter-in and gather-back also load the members' NICs,
    /// and the ring's splits go around that load (r2ccl-algo's `joined_ring_split`).
    #[allow(clippy::too_many_arguments, reason = "mirrors the builder's parameters one to one")]
    pub(crate) fn ring(
        &mut self,
        acc: &mut Acc,
        nodes: &[usize],
        joiners: &[usize],
        total: u64,
        chunks: u32,
        mask: RailMask,
        pol: RailPolicy,
        rs: bool,
        ag: bool,
    ) -> Result<Rate, PlanError> {
        let s = nodes.len() as u64;
        let mut worst = Rate::default();
        if s < 2 {
            return Ok(worst);
        }
        let rem = total % s;
        let base = total / s;
        // All segments except the one at `skip`.
        let except = |skip: u64| -> [(u64, u64); 2] {
            let long = rem - u64::from(skip < rem);
            [(base + 1, long), (base, s - rem - u64::from(skip >= rem))]
        };
        // Per-edge message lists depend only on whether the skipped segments are long, so
        // at most four distinct lists exist: build them once.
        let mut lists: Vec<((bool, bool), Msgs)> = Vec::with_capacity(4);
        for pos in 0..nodes.len() {
            let (a, b) = (nodes[pos], nodes[(pos + 1) % nodes.len()]);
            if a == b {
                continue;
            }
            let (rs_skip, ag_skip) = (pos as u64, (pos as u64 + 1) % s);
            let key = (rs_skip < rem, ag_skip < rem);
            let idx = match lists.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    let mut segs = Vec::with_capacity(4);
                    if rs {
                        segs.extend(except(rs_skip));
                    }
                    if ag {
                        segs.extend(except(ag_skip));
                    }
                    lists.push((key, chunked(&segs, chunks)));
                    lists.len() - 1
                }
            };
            let r = if joiners.is_empty() || total == 0 {
                self.send(acc, a, b, &lists[idx].1, mask, pol)?
            } else {
                let e = self.edge_joined(a, b, nodes.len(), joiners, mask, pol)?;
                self.send_on(acc, a, b, e, &lists[idx].1)
            };
            worst = worst.worst(r);
        }
        Ok(worst)
    }

    /// A pipelined chain along `nodes` (node of each chain position) carrying `count`
    /// elements in `chunks` messages per edge. Returns (sum over edges of seconds per
    /// byte, slowest edge).
    pub(crate) fn chain(
        &mut self,
        acc: &mut Acc,
        nodes: &[usize],
        count: u64,
        chunks: u32,
        pol: RailPolicy,
    ) -> Result<(f64, Rate), PlanError> {
        let msgs = chunked(&[(count, 1)], chunks);
        let mut sum = 0.0;
        let mut worst = Rate::default();
        for w in nodes.windows(2) {
            let r = self.send(acc, w[0], w[1], &msgs, RailMask::ALL, pol)?;
            sum += r.spb;
            worst = worst.worst(r);
        }
        Ok((sum, worst))
    }

    /// The reduce-to-helper / broadcast-back join of one level (r2ccl-algo's helper join):
    /// piece `c` of `k` goes from every excluded node to member `c % s` and back, and the
    /// helper chains it to the other members. Returns the slowest joiner transfer.
    #[allow(clippy::too_many_arguments, reason = "mirrors the builder's parameters one to one")]
    pub(crate) fn helper_join(
        &mut self,
        acc: &mut Acc,
        members: &[usize],
        excluded: &[usize],
        len: u64,
        k: u32,
        join_mask: RailMask,
        pol: RailPolicy,
    ) -> Result<Rate, PlanError> {
        let mut worst = Rate::default();
        let s = members.len() as u64;
        if excluded.is_empty() || s == 0 {
            return Ok(worst);
        }
        let k = u64::from(k.max(1));
        let (base, rem) = (len / k, len % k);
        let pieces_of = |h: u64| -> [(u64, u64); 2] {
            let long = residues(h, s, rem);
            [(base + 1, long), (base, residues(h, s, k) - long)]
        };
        for h in 0..s.min(k) {
            let msgs: Msgs = pieces_of(h).into_iter().filter(|&(l, t)| l > 0 && t > 0).collect();
            let m = members[h as usize];
            for &e in excluded {
                worst = worst.worst(self.send(acc, e, m, &msgs, join_mask, pol)?);
                worst = worst.worst(self.send(acc, m, e, &msgs, join_mask, pol)?);
            }
        }
        if s >= 2 {
            for j in 0..s {
                let next = (j + 1) % s;
                let skip = pieces_of(next);
                let msgs: Msgs = [(base + 1, rem - skip[0].1), (base, k - rem - skip[1].1)]
                    .into_iter()
                    .filter(|&(l, t)| l > 0 && t > 0)
                    .collect();
                self.send(acc, members[j as usize], members[next as usize], &msgs, RailMask::ALL, pol)?;
            }
        }
        Ok(worst)
    }

    /// Bytes per part `(src rail, dst rail, bytes)` of messages `msgs` from `a` to `b`.
    fn part_bytes(
        &mut self,
        a: usize,
        b: usize,
        msgs: &[(u64, u64)],
        mask: RailMask,
        pol: RailPolicy,
    ) -> Result<Shares, PlanError> {
        let e = self.edge(a, b, mask, pol)?;
        Ok(self.part_bytes_on(e, msgs))
    }

    /// Bytes per part `(src rail, dst rail, bytes)` of messages `msgs` over edge `e`.
    fn part_bytes_on(&mut self, e: usize, msgs: &[(u64, u64)]) -> Shares {
        let mut v = Vec::new();
        for &(l, t) in msgs {
            if l == 0 || t == 0 {
                continue;
            }
            let di = self.divide(e, l);
            let info = &self.edges[e];
            for (p, bytes) in info.split.parts.iter().zip(&info.divs[di].1) {
                v.push((p.src.index(), p.dst.index(), t * bytes));
            }
        }
        v
    }

    /// One direct four-stage level (r2ccl-algo's `spread_direct`) over `len` elements cut into
    /// one segment per member, each in `chunks` messages: every member sends each other member
    /// that member's segment (reduce-scatter) and its own segment (all-gather), every excluded
    /// node sends each member its segment (scatter-in) and gets it back (gather-back), all over
    /// [`Net::edge_fair`] splits. Pairs of node types with equal segment lengths share one
    /// computed list of part bytes.
    pub(crate) fn direct_level(
        &mut self,
        acc: &mut Acc,
        members: &[usize],
        excluded: &[usize],
        len: u64,
        chunks: u32,
        mask: RailMask,
    ) -> Result<(), PlanError> {
        let s = members.len() as u64;
        let k = self.f.k;
        let mut local: FastMap<(usize, usize, u64), Shares> = FastMap::default();
        for (j, &m) in members.iter().enumerate() {
            let seg = even_part(len, s, j as u64).1;
            if seg == 0 {
                continue;
            }
            let msgs = chunked(&[(seg, 1)], chunks);
            // Member m's segment goes to m from every other member and every joiner, and from m
            // to each of them.
            for &x in members.iter().chain(excluded).filter(|&&x| x != m) {
                for (a, b) in [(x, m), (m, x)] {
                    let key = (self.ty[a], self.ty[b], seg);
                    let v = match local.entry(key) {
                        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                        std::collections::hash_map::Entry::Vacant(slot) => {
                            let e = self.edge_fair(a, b, mask)?;
                            slot.insert(self.part_bytes_on(e, &msgs))
                        }
                    };
                    for &(src, dst, bytes) in v.iter() {
                        acc.tx[a * k + src] += bytes;
                        acc.rx[b * k + dst] += bytes;
                    }
                }
            }
        }
        Ok(())
    }

    /// The four-stage scatter-in / gather-back of one level: every excluded node sends
    /// member `j`'s segment to it and gets it back, in `chunks` messages. Members of one
    /// node type with equal segment lengths share one computed split.
    pub(crate) fn spread_join(
        &mut self,
        acc: &mut Acc,
        members: &[usize],
        excluded: &[usize],
        len: u64,
        chunks: u32,
    ) -> Result<(), PlanError> {
        let s = members.len() as u64;
        let k = self.f.k;
        for &e in excluded {
            let mut local: Vec<((usize, u64), (Shares, Shares))> = Vec::new();
            for (j, &m) in members.iter().enumerate() {
                let seg = even_part(len, s, j as u64).1;
                if seg == 0 || m == e {
                    continue;
                }
                let key = (self.ty[m], seg);
                let idx = match local.iter().position(|(x, _)| *x == key) {
                    Some(i) => i,
                    None => {
                        let msgs = chunked(&[(seg, 1)], chunks);
                        let out = self.part_bytes(e, m, &msgs, RailMask::ALL, RailPolicy::Spread)?;
                        let back = self.part_bytes(m, e, &msgs, RailMask::ALL, RailPolicy::Spread)?;
                        local.push((key, (out, back)));
                        local.len() - 1
                    }
                };
                let (out, back) = &local[idx].1;
                for &(src, dst, bytes) in out {
                    acc.tx[e * k + src] += bytes;
                    acc.rx[m * k + dst] += bytes;
                }
                for &(src, dst, bytes) in back {
                    acc.tx[m * k + src] += bytes;
                    acc.rx[e * k + dst] += bytes;
                }
            }
        }
        Ok(())
    }

    /// AlltoAll by pairwise exchange: every ordered pair of distinct nodes exchanges
    /// `per_pair` messages of `count` elements in `chunks` pieces.
    pub(crate) fn all_pairs(
        &mut self,
        acc: &mut Acc,
        count: u64,
        per_pair: u64,
        chunks: u32,
        pol: RailPolicy,
    ) -> Result<(), PlanError> {
        let n = self.f.node_count();
        let k = self.f.k;
        let msgs = chunked(&[(count, per_pair)], chunks);
        // Bytes per part for each (sender type, receiver type), computed once.
        let mut per: FastMap<(usize, usize), Shares> = FastMap::default();
        for a in 0..n {
            for b in 0..n {
                if a == b {
                    continue;
                }
                let key = (self.ty[a], self.ty[b]);
                if let std::collections::hash_map::Entry::Vacant(slot) = per.entry(key) {
                    slot.insert(self.part_bytes(a, b, &msgs, RailMask::ALL, pol)?);
                }
                if let Some(v) = per.get(&key) {
                    for &(src, dst, bytes) in v {
                        acc.tx[a * k + src] += bytes;
                        acc.rx[b * k + dst] += bytes;
                    }
                }
            }
        }
        Ok(())
    }
}
