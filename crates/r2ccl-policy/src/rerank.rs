//! Topology-aware logical re-ranking (MECHANISMS.md section 6.1): choose the ring order of
//! nodes that maximizes the bottleneck pair bandwidth, then minimizes cross-rail hops.
//!
//! Exact branch-and-bound search up to [`EXACT_MAX_NODES`] nodes (node 0 fixed, nodes with
//! identical NIC health interchangeable, reflections cut); beyond it a heuristic: group
//! nodes by failed-rail set, chain the groups greedily, insert bridge nodes where adjacent
//! groups share no usable rail, then local 2-opt and relocation moves.

use crate::fabric::Fabric;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// Largest node count for which [`crate::plan`] uses the exact search.
pub const EXACT_MAX_NODES: usize = 10;

/// Quality of a ring order: larger bottleneck first, then fewer cross-rail hops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RingScore {
    /// Smallest pair capacity along the ring, Mbit/s.
    pub bottleneck_mbps: u64,
    /// Sum over ring edges of rails usable on one end only (plus the rail count for every
    /// edge that must go through the spine).
    pub cross_rail_hops: u64,
}

impl RingScore {
    /// Whether `self` is strictly better than `other`.
    pub fn is_better_than(&self, other: &RingScore) -> bool {
        self.cmp_quality(other) == Ordering::Greater
    }

    /// Quality order: higher bottleneck, then fewer cross-rail hops, is greater.
    pub fn cmp_quality(&self, other: &RingScore) -> Ordering {
        self.bottleneck_mbps.cmp(&other.bottleneck_mbps).then_with(|| other.cross_rail_hops.cmp(&self.cross_rail_hops))
    }
}

/// Score of a ring order (indices into the fabric's nodes).
pub(crate) fn score(f: &Fabric, order: &[usize]) -> RingScore {
    let n = order.len();
    if n < 2 {
        return RingScore { bottleneck_mbps: u64::MAX, cross_rail_hops: 0 };
    }
    let mut b = u64::MAX;
    let mut c = 0u64;
    for p in 0..n {
        let (i, j) = (order[p], order[(p + 1) % n]);
        b = b.min(f.pair(i, j).0);
        c += u64::from(f.cross(i, j));
    }
    RingScore { bottleneck_mbps: b, cross_rail_hops: c }
}

/// Rotate so node 0 comes first and orient so the second entry is below the last.
fn normalize(order: &mut [usize]) {
    if let Some(p) = order.iter().position(|&x| x == 0) {
        order.rotate_left(p);
    }
    let n = order.len();
    if n > 2 && order[1] > order[n - 1] {
        order[1..].reverse();
    }
}

/// Node types: nodes with equal per-NIC usable bandwidth are interchangeable.
fn types(f: &Fabric) -> (Vec<usize>, Vec<usize>) {
    let n = f.node_count();
    let mut idx: Vec<usize> = (0..n).collect();
    let row = |i: usize| &f.bw[i * f.k..(i + 1) * f.k];
    idx.sort_by(|&a, &b| row(b).cmp(row(a)).then(a.cmp(&b)));
    let mut ty = vec![0usize; n];
    let mut reps = Vec::new();
    for (pos, &i) in idx.iter().enumerate() {
        if pos == 0 || row(i) != row(idx[pos - 1]) {
            reps.push(i);
        }
        ty[i] = reps.len() - 1;
    }
    (ty, reps)
}

struct Exact {
    cap: Vec<u64>,
    cross: Vec<u64>,
    t: usize,
    n: usize,
    first: usize,
    remaining: Vec<usize>,
    seq: Vec<usize>,
    best: Option<(RingScore, Vec<usize>)>,
}

impl Exact {
    fn dfs(&mut self, b: u64, c: u64) {
        if let Some((best, _)) = &self.best {
            if b < best.bottleneck_mbps || (b == best.bottleneck_mbps && c >= best.cross_rail_hops) {
                return;
            }
        }
        let last = *self.seq.last().unwrap_or(&self.first);
        if self.seq.len() == self.n {
            // Reflection cut: keep sequences whose second type is not above the last one.
            if self.n > 2 && self.seq[1] > self.seq[self.n - 1] {
                return;
            }
            let e = last * self.t + self.first;
            let s = RingScore { bottleneck_mbps: b.min(self.cap[e]), cross_rail_hops: c + self.cross[e] };
            let better = match &self.best {
                None => true,
                Some((best, _)) => s.is_better_than(best),
            };
            if better {
                self.best = Some((s, self.seq.clone()));
            }
            return;
        }
        for ty in 0..self.t {
            if self.remaining[ty] == 0 {
                continue;
            }
            let e = last * self.t + ty;
            self.remaining[ty] -= 1;
            self.seq.push(ty);
            self.dfs(b.min(self.cap[e]), c + self.cross[e]);
            self.seq.pop();
            self.remaining[ty] += 1;
        }
    }
}

/// Exact search: the best ring order, starting from `incumbent` as the bound to beat.
pub(crate) fn exact(f: &Fabric, incumbent: &[usize]) -> Vec<usize> {
    let n = f.node_count();
    if n <= 3 {
        return (0..n).collect();
    }
    let (ty, reps) = types(f);
    let t = reps.len();
    let mut cap = vec![0u64; t * t];
    let mut cross = vec![0u64; t * t];
    for a in 0..t {
        for b in 0..t {
            cap[a * t + b] = f.pair(reps[a], reps[b]).0;
            cross[a * t + b] = u64::from(f.cross(reps[a], reps[b]));
        }
    }
    let mut remaining = vec![0usize; t];
    for &x in &ty {
        remaining[x] += 1;
    }
    let first = ty[0];
    remaining[first] -= 1;
    let mut ex =
        Exact { cap, cross, t, n, first, remaining, seq: vec![first], best: Some((score(f, incumbent), Vec::new())) };
    ex.dfs(u64::MAX, 0);
    let types_seq = match ex.best {
        Some((_, s)) if !s.is_empty() => s,
        _ => return incumbent.to_vec(),
    };
    // Map the type sequence back to nodes, lowest index first within each type; node 0
    // is the lowest node of its type, so it lands at position 0.
    let mut pools: Vec<Vec<usize>> = vec![Vec::new(); t];
    for i in (0..n).rev() {
        pools[ty[i]].push(i);
    }
    let mut order: Vec<usize> = types_seq.iter().filter_map(|&x| pools[x].pop()).collect();
    normalize(&mut order);
    order
}

/// Heuristic re-ranking: grouping, bridges, local search.
pub(crate) fn heuristic(f: &Fabric) -> Vec<usize> {
    let n = f.node_count();
    if n <= 3 {
        return (0..n).collect();
    }
    let (ty, reps) = types(f);
    // Groups by type (types are already sorted healthiest first).
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); reps.len()];
    for i in 0..n {
        groups[ty[i]].push(i);
    }
    // Greedy chain of groups: start with the healthiest, then the best-connected next.
    let mut used = vec![false; reps.len()];
    let mut chain = vec![0usize];
    used[0] = true;
    for _ in 1..reps.len() {
        let cur = reps[*chain.last().unwrap_or(&0)];
        let mut best: Option<(usize, u64, u32)> = None;
        for (g, &rep) in reps.iter().enumerate() {
            if used[g] {
                continue;
            }
            let (cap, _) = f.pair(cur, rep);
            let cr = f.cross(cur, rep);
            let better = match best {
                None => true,
                Some((_, bc, bx)) => cap > bc || (cap == bc && cr < bx),
            };
            if better {
                best = Some((g, cap, cr));
            }
        }
        if let Some((g, _, _)) = best {
            used[g] = true;
            chain.push(g);
        }
    }
    let mut order: Vec<usize> = chain.iter().flat_map(|&g| groups[g].iter().copied()).collect();
    insert_bridges(f, &mut order);
    local_search(f, &mut order);
    normalize(&mut order);
    order
}

/// Where two adjacent nodes share no usable rail, move in a node that shares rails with
/// both (taken from inside a run of identical nodes so that no new gap opens).
fn insert_bridges(f: &Fabric, order: &mut Vec<usize>) {
    let n = order.len();
    for _ in 0..n {
        let gap = (0..n).find(|&p| f.mask[order[p]] & f.mask[order[(p + 1) % n]] == 0);
        let Some(p) = gap else { return };
        let (a, c) = (order[p], order[(p + 1) % n]);
        let mut best: Option<(usize, u64)> = None;
        for q in 0..n {
            let b = order[q];
            let (prev, next) = (order[(q + n - 1) % n], order[(q + 1) % n]);
            if b == a || b == c || f.mask[prev] & f.mask[next] == 0 {
                continue;
            }
            if f.mask[b] & f.mask[a] == 0 || f.mask[b] & f.mask[c] == 0 {
                continue;
            }
            // Only take nodes whose removal keeps their neighbours connected as well as before.
            let keep = f.pair(prev, next).0 >= f.pair(prev, b).0.min(f.pair(b, next).0);
            if !keep {
                continue;
            }
            let v = f.pair(a, b).0.min(f.pair(b, c).0);
            if best.is_none_or(|(_, bv)| v > bv) {
                best = Some((q, v));
            }
        }
        let Some((q, _)) = best else { return };
        let b = order.remove(q);
        let at = order.iter().position(|&x| x == a).map_or(0, |x| x + 1);
        order.insert(at, b);
    }
}

struct Ring<'a> {
    f: &'a Fabric,
    cap: Vec<u64>,
    cross: Vec<u64>,
    b: u64,
    nb: usize,
    c: u64,
}

impl<'a> Ring<'a> {
    fn new(f: &'a Fabric, order: &[usize]) -> Self {
        let mut r = Self { f, cap: Vec::new(), cross: Vec::new(), b: 0, nb: 0, c: 0 };
        r.rebuild(order);
        r
    }

    fn rebuild(&mut self, order: &[usize]) {
        let n = order.len();
        self.cap.clear();
        self.cross.clear();
        for p in 0..n {
            let (i, j) = (order[p], order[(p + 1) % n]);
            self.cap.push(self.f.pair(i, j).0);
            self.cross.push(u64::from(self.f.cross(i, j)));
        }
        self.b = self.cap.iter().copied().min().unwrap_or(u64::MAX);
        self.nb = self.cap.iter().filter(|&&x| x == self.b).count();
        self.c = self.cross.iter().sum();
    }

    fn edge(&self, i: usize, j: usize) -> (u64, u64) {
        (self.f.pair(i, j).0, u64::from(self.f.cross(i, j)))
    }

    /// Score after removing the edges at `removed` positions and adding `added` edges.
    fn eval(&self, removed: &[usize], added: &[(usize, usize)]) -> RingScore {
        let mut c = self.c;
        let mut gone_b = 0;
        for &p in removed {
            c -= self.cross[p];
            if self.cap[p] == self.b {
                gone_b += 1;
            }
        }
        let mut rest = self.b;
        if gone_b == self.nb {
            rest = (0..self.cap.len()).filter(|p| !removed.contains(p)).map(|p| self.cap[p]).min().unwrap_or(u64::MAX);
        }
        let mut b = rest;
        for &(i, j) in added {
            let (cap, cr) = self.edge(i, j);
            b = b.min(cap);
            c += cr;
        }
        RingScore { bottleneck_mbps: b, cross_rail_hops: c }
    }

    fn current(&self) -> RingScore {
        RingScore { bottleneck_mbps: self.b, cross_rail_hops: self.c }
    }
}

/// First-improvement 2-opt and single-node relocation, restricted to moves that touch an
/// imperfect edge (below the best edge capacity seen, or with cross-rail hops).
fn local_search(f: &Fabric, order: &mut Vec<usize>) {
    let n = order.len();
    if n < 4 {
        return;
    }
    let mut ring = Ring::new(f, order);
    let max_moves = 4 * n + 64;
    'moves: for _ in 0..max_moves {
        let top = ring.cap.iter().copied().max().unwrap_or(0);
        let hot: Vec<usize> = (0..n).filter(|&p| ring.cap[p] < top || ring.cross[p] > 0).take(256).collect();
        if hot.is_empty() {
            return;
        }
        let cur = ring.current();
        // 2-opt: reverse positions a+1..=b.
        for &a in &hot {
            for b in 0..n {
                let (lo, hi) = if a < b { (a, b) } else { (b, a) };
                if hi - lo < 2 || (lo == 0 && hi == n - 1) {
                    continue;
                }
                let added = [(order[lo], order[hi]), (order[lo + 1], order[(hi + 1) % n])];
                let s = ring.eval(&[lo, hi], &added);
                if s.is_better_than(&cur) {
                    order[lo + 1..=hi].reverse();
                    ring.rebuild(order);
                    continue 'moves;
                }
            }
        }
        // Relocation: move the node at x into the hot edge (y, y+1).
        for &y in &hot {
            for x in 0..n {
                let (xp, xn) = ((x + n - 1) % n, (x + 1) % n);
                if x == y || x == (y + 1) % n {
                    continue;
                }
                let node = order[x];
                let added = [(order[xp], order[xn]), (order[y], node), (node, order[(y + 1) % n])];
                let s = ring.eval(&[xp, x, y], &added);
                if s.is_better_than(&cur) {
                    let target = order[y];
                    order.remove(x);
                    let at = order.iter().position(|&v| v == target).map_or(0, |v| v + 1);
                    order.insert(at, node);
                    ring.rebuild(order);
                    continue 'moves;
                }
            }
        }
        return;
    }
}
