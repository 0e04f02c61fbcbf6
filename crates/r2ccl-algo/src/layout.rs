//! Layouts (ranks to nodes, NICs per node), ring orders, and the [`Fabric`]: a layout
//! joined with a validated health view, which computes per-NIC (rail) splits.

use crate::AlgoError;
use r2ccl_core::{HealthView, NodeId, RailId, Rank};

/// Which ranks live on which node, and how many NICs each node has.
///
/// Ranks of a node are listed in rank order; a rank's *local index* is its position
/// among its node's ranks, and its *own NIC* is rail `local_index % nics_per_node`
/// (the rail-optimized convention: GPU i uses NIC i).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    rank_node: Vec<NodeId>,
    local_index: Vec<u32>,
    node_ranks: Vec<Vec<Rank>>,
    nics_per_node: u16,
}

impl Layout {
    /// `nodes` nodes of `ranks_per_node` ranks each (ranks numbered node by node) and
    /// `nics_per_node` NICs each.
    pub fn uniform(nodes: usize, ranks_per_node: usize, nics_per_node: usize) -> Result<Self, AlgoError> {
        if nodes == 0 {
            return Err(AlgoError::ZeroNodes);
        }
        if ranks_per_node == 0 {
            return Err(AlgoError::ZeroRanks);
        }
        let rank_node = (0..nodes * ranks_per_node).map(|r| NodeId((r / ranks_per_node) as u32)).collect();
        Self::from_rank_nodes(rank_node, nics_per_node)
    }

    /// A layout from each rank's node. Node ids must be dense: every node `0..=max`
    /// holds at least one rank.
    pub fn from_rank_nodes(rank_node: Vec<NodeId>, nics_per_node: usize) -> Result<Self, AlgoError> {
        if rank_node.is_empty() {
            return Err(AlgoError::ZeroRanks);
        }
        if nics_per_node == 0 || nics_per_node > 64 {
            return Err(AlgoError::BadNicCount(nics_per_node));
        }
        let nodes = rank_node.iter().map(|n| n.index()).max().unwrap_or(0) + 1;
        let mut node_ranks: Vec<Vec<Rank>> = vec![Vec::new(); nodes];
        let mut local_index = Vec::with_capacity(rank_node.len());
        for (r, n) in rank_node.iter().enumerate() {
            let list = &mut node_ranks[n.index()];
            local_index.push(list.len() as u32);
            list.push(Rank(r as u32));
        }
        if let Some(i) = node_ranks.iter().position(Vec::is_empty) {
            return Err(AlgoError::EmptyNode(NodeId(i as u32)));
        }
        Ok(Self { rank_node, local_index, node_ranks, nics_per_node: nics_per_node as u16 })
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.rank_node.len()
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.node_ranks.len()
    }

    /// NICs per node.
    pub fn nics_per_node(&self) -> usize {
        usize::from(self.nics_per_node)
    }

    /// Check that `rank` is part of the communicator.
    pub fn check_rank(&self, rank: Rank) -> Result<(), AlgoError> {
        if rank.index() < self.ranks() {
            Ok(())
        } else {
            Err(AlgoError::RankOutOfRange { rank, ranks: self.ranks() })
        }
    }

    /// The node holding `rank`.
    pub fn node_of(&self, rank: Rank) -> Result<NodeId, AlgoError> {
        self.check_rank(rank)?;
        Ok(self.rank_node[rank.index()])
    }

    /// `rank`'s position among its node's ranks.
    pub fn local_index(&self, rank: Rank) -> Result<usize, AlgoError> {
        self.check_rank(rank)?;
        Ok(self.local_index[rank.index()] as usize)
    }

    /// `rank`'s own NIC rail (`local_index % nics_per_node`).
    pub fn own_rail(&self, rank: Rank) -> Result<RailId, AlgoError> {
        Ok(RailId((self.local_index(rank)? % self.nics_per_node()) as u16))
    }

    /// The ranks of `node`, in rank order (empty for an unknown node).
    pub fn ranks_of(&self, node: NodeId) -> &[Rank] {
        self.node_ranks.get(node.index()).map_or(&[], Vec::as_slice)
    }

    /// Unchecked node lookup for ranks already validated.
    pub(crate) fn node_idx(&self, rank: Rank) -> usize {
        self.rank_node[rank.index()].index()
    }

    /// The default ring order: ranks in rank order (node by node for uniform layouts).
    pub fn default_ring(&self) -> Vec<Rank> {
        (0..self.ranks() as u32).map(Rank).collect()
    }

    /// Expand a node order (for example from logical re-ranking) into a rank ring order:
    /// the ranks of each node consecutively, nodes in the given order.
    pub fn ring_from_node_order(&self, nodes: &[NodeId]) -> Result<Vec<Rank>, AlgoError> {
        check_permutation(nodes.iter().map(|n| n.index()), self.nodes())?;
        Ok(nodes.iter().flat_map(|n| self.ranks_of(*n).iter().copied()).collect())
    }

    /// Validate a rank ring order (a permutation of all ranks).
    pub fn check_ring(&self, ring: &[Rank]) -> Result<(), AlgoError> {
        check_permutation(ring.iter().map(|r| r.index()), self.ranks())
    }

    /// The node order implied by a rank ring order: nodes by first appearance.
    pub fn node_order(&self, ring: &[Rank]) -> Vec<NodeId> {
        let mut seen = vec![false; self.nodes()];
        let mut out = Vec::with_capacity(self.nodes());
        for r in ring {
            let n = self.rank_node[r.index()];
            if !seen[n.index()] {
                seen[n.index()] = true;
                out.push(n);
            }
        }
        out
    }
}

fn check_permutation(items: impl Iterator<Item = usize>, n: usize) -> Result<(), AlgoError> {
    let mut seen = vec![false; n];
    let mut count = 0usize;
    for i in items {
        count += 1;
        if i >= n {
            return Err(AlgoError::BadRingOrder { expected: n, detail: format!("entry {i} is out of range") });
        }
        if seen[i] {
            return Err(AlgoError::BadRingOrder { expected: n, detail: format!("entry {i} appears twice") });
        }
        seen[i] = true;
    }
    if count != n {
        return Err(AlgoError::BadRingOrder { expected: n, detail: format!("{count} entries") });
    }
    Ok(())
}

/// A set of rails as a bit mask (bit r = rail r). Nodes have at most 64 NICs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RailMask(pub u64);

impl RailMask {
    /// Every rail.
    pub const ALL: RailMask = RailMask(u64::MAX);

    /// Whether `rail` is in the set.
    pub const fn contains(self, rail: usize) -> bool {
        rail < 64 && (self.0 >> rail) & 1 == 1
    }

    /// The complement.
    #[must_use]
    pub const fn not(self) -> Self {
        RailMask(!self.0)
    }
}

/// One share of a transfer: the bytes leave on `src` rail of the sending node and
/// arrive on `dst` rail of the receiving node (`src != dst` crosses rails through the
/// spine). `weight` is proportional to the share (the bottleneck NIC's usable Mbit/s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RailPart {
    /// Rail of the sending node's NIC.
    pub src: RailId,
    /// Rail of the receiving node's NIC.
    pub dst: RailId,
    /// Relative weight (usable Mbit/s of the bottleneck NIC, or a backup's doubled share).
    pub weight: u64,
}

/// How an inter-node transfer is split over NICs: bytes go to each part in proportion
/// to its weight ([`RailSplit::divide`]). When the sending rank's own NIC is not a
/// part's `src`, the transport forwards the bytes inside the node to the rank owning
/// that NIC (PXN-style forwarding through a node peer).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RailSplit {
    /// The parts, in rail order; never empty, every weight positive.
    pub parts: Vec<RailPart>,
}

impl RailSplit {
    /// Sum of the weights.
    pub fn total_weight(&self) -> u64 {
        self.parts.iter().map(|p| p.weight).sum()
    }

    /// Weight of part `i` as a fraction of the total.
    pub fn fraction(&self, i: usize) -> f64 {
        let total = self.total_weight();
        if total == 0 {
            return 0.0;
        }
        self.parts.get(i).map_or(0.0, |p| p.weight as f64 / total as f64)
    }

    /// Divide `len` bytes (whole elements of `elem` bytes) over the parts in proportion
    /// to the weights, element-aligned, by largest remainder (ties to the lower rail).
    /// The result has one entry per part and sums to `len`.
    pub fn divide(&self, len: u64, elem: u64) -> Vec<u64> {
        let elem = elem.max(1);
        let elems = len / elem;
        let total = self.total_weight().max(1);
        let mut out: Vec<u64> = Vec::with_capacity(self.parts.len());
        let mut rems: Vec<(u128, usize)> = Vec::with_capacity(self.parts.len());
        let mut given = 0u64;
        for (i, p) in self.parts.iter().enumerate() {
            let exact = u128::from(elems) * u128::from(p.weight);
            let q = (exact / u128::from(total)) as u64;
            rems.push((exact % u128::from(total), i));
            given += q;
            out.push(q);
        }
        rems.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (_, i) in rems.iter().take((elems - given) as usize) {
            out[*i] += 1;
        }
        let mut bytes: Vec<u64> = out.into_iter().map(|e| e * elem).collect();
        if let Some(first) = bytes.first_mut() {
            *first += len - elems * elem; // a partial element (never produced by builders)
        }
        bytes
    }
}

/// How inter-node transfers use a node's NICs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum RailPolicy {
    /// R2CCL-Balance: rails usable at both ends, weighted by bandwidth (`w_j = b_j /
    /// sum b`); a healthy node's rail that is failed at the peer stays idle for that
    /// peer. With no failure this is the fault-free even split.
    #[default]
    Balance,
    /// Each end spreads a transfer over all its usable NICs in proportion to their
    /// bandwidth, crossing rails through the spine where the ends' usable rails differ,
    /// so a node's NICs are loaded exactly in proportion to their bandwidth (what the
    /// four-stage schedule needs to reach the lower bound).
    Spread,
    /// Hot repair only: each healthy rail keeps its nominal share and a failed rail's
    /// share moves onto one backup (the next healthy rail), which then carries double.
    SingleBackup,
}

/// A layout joined with a validated health view: the input every builder needs.
#[derive(Clone, Debug)]
pub struct Fabric {
    layout: Layout,
    health: HealthView,
    usable: Vec<u64>,
    nominal: Vec<u64>,
    /// No path crosses rails (no spine): Spread keeps to rails usable at both ends.
    rail_only: bool,
}

impl Fabric {
    /// Join `layout` and `health`. Errors if the view's shape differs from the layout or
    /// if a node of a multi-node layout has no usable NIC (a single-node communicator
    /// needs no NIC).
    pub fn new(layout: Layout, health: HealthView) -> Result<Self, AlgoError> {
        let k = layout.nics_per_node();
        let mismatch = |detail: String| AlgoError::ShapeMismatch {
            layout_nodes: layout.nodes(),
            layout_nics: k,
            view_nodes: health.node_count(),
            detail,
        };
        if health.node_count() != layout.nodes() {
            return Err(mismatch("node counts differ".into()));
        }
        let mut usable = Vec::with_capacity(layout.nodes() * k);
        let mut nominal = Vec::with_capacity(layout.nodes() * k);
        for (i, node) in health.nodes().iter().enumerate() {
            if node.nics.len() != k {
                return Err(mismatch(format!("node{i} has {} NICs", node.nics.len())));
            }
            if layout.nodes() > 1 && !node.is_connected() {
                return Err(AlgoError::NodeWithoutNic(NodeId(i as u32)));
            }
            usable.extend(node.nics.iter().map(|n| n.usable_mbps));
            nominal.extend(node.nics.iter().map(|n| n.nominal_mbps));
        }
        Ok(Self { layout, health, usable, nominal, rail_only: false })
    }

    /// The same fabric without a spine (`true`): NIC r of a node reaches only NIC r of the
    /// others, so Spread keeps every byte on rails usable at both ends, as Balance does.
    #[must_use]
    pub fn with_rail_only(mut self, rail_only: bool) -> Self {
        self.rail_only = rail_only;
        self
    }

    /// A fault-free fabric: `layout` with every NIC healthy at `mbps`.
    pub fn healthy(layout: Layout, mbps: u64) -> Result<Self, AlgoError> {
        let view = HealthView::uniform(layout.nodes(), layout.nics_per_node(), mbps);
        Self::new(layout, view)
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The health view.
    pub fn health(&self) -> &HealthView {
        &self.health
    }

    /// Usable Mbit/s of NIC `rail` on `node` (0 when failed or unknown).
    pub fn usable_mbps(&self, node: NodeId, rail: RailId) -> u64 {
        let k = self.layout.nics_per_node();
        if rail.index() >= k {
            return 0;
        }
        self.usable.get(node.index() * k + rail.index()).copied().unwrap_or(0)
    }

    /// Sum of usable Mbit/s of a node's NICs.
    pub fn node_usable_mbps(&self, node: NodeId) -> u64 {
        let k = self.layout.nics_per_node();
        self.usable.get(node.index() * k..(node.index() + 1) * k).map_or(0, |s| s.iter().sum())
    }

    /// Rails of `node` that carry traffic, as a mask.
    pub fn healthy_rails(&self, node: NodeId) -> RailMask {
        let k = self.layout.nics_per_node();
        let mut m = 0u64;
        for r in 0..k {
            if self.usable_mbps(node, RailId(r as u16)) > 0 {
                m |= 1 << r;
            }
        }
        RailMask(m)
    }

    /// Whether NIC `rail` of `node` is usable but below its nominal rate.
    pub fn is_slowed(&self, node: NodeId, rail: RailId) -> bool {
        let k = self.layout.nics_per_node();
        let x = node.index() * k + rail.index();
        match (self.usable.get(x), self.nominal.get(x)) {
            (Some(&u), Some(&n)) => rail.index() < k && u > 0 && u < n,
            _ => false,
        }
    }

    /// Whether any NIC of the fabric is failed or degraded.
    pub fn is_degraded(&self) -> bool {
        self.usable.iter().zip(&self.nominal).any(|(u, n)| u < n)
    }

    /// The split of a transfer from `src` node to `dst` node under `policy`, restricted
    /// to rails in `mask` where possible (if `mask` leaves either end without a usable
    /// rail, every rail is allowed).
    ///
    /// Balance: rails usable at both ends, weighted by the smaller usable bandwidth of
    /// the pair (`w_j = b_j / sum b` on the degraded side); if the two nodes share no
    /// usable rail, their usable rails are paired cross-rail.
    /// Spread: the bytes leave the sender's usable rails in proportion to their
    /// bandwidth and arrive on the receiver's usable rails in proportion to theirs, so
    /// every NIC of a node carries its bandwidth's share of the node's traffic.
    /// Same-rail pairs take as much as they can; the rest crosses rails through the
    /// spine (a transfer between two healthy nodes never does). On a rail-only fabric
    /// ([`Fabric::with_rail_only`]) nothing crosses rails: Spread is Balance there.
    /// Single backup: rails usable at both ends, each with its nominal share, a lost
    /// rail's share on the next usable rail.
    pub fn split(&self, src: NodeId, dst: NodeId, mask: RailMask, policy: RailPolicy) -> Result<RailSplit, AlgoError> {
        let k = self.layout.nics_per_node();
        let usable = |node: NodeId, m: RailMask| -> Vec<u64> {
            (0..k).map(|r| if m.contains(r) { self.usable_mbps(node, RailId(r as u16)) } else { 0 }).collect()
        };
        let (mut tx, mut rx) = (usable(src, mask), usable(dst, mask));
        if tx.iter().all(|&b| b == 0) || rx.iter().all(|&b| b == 0) {
            tx = usable(src, RailMask::ALL);
            rx = usable(dst, RailMask::ALL);
        }
        if tx.iter().all(|&b| b == 0) {
            return Err(AlgoError::NodeWithoutNic(src));
        }
        if rx.iter().all(|&b| b == 0) {
            return Err(AlgoError::NodeWithoutNic(dst));
        }
        if policy == RailPolicy::Spread && !self.rail_only {
            return Ok(RailSplit { parts: transport_plan(&tx, &rx) });
        }
        let both = |m: RailMask| -> Vec<RailPart> {
            (0..k)
                .filter(|&r| m.contains(r))
                .filter_map(|r| {
                    let rail = RailId(r as u16);
                    let w = self.usable_mbps(src, rail).min(self.usable_mbps(dst, rail));
                    (w > 0).then_some(RailPart { src: rail, dst: rail, weight: w })
                })
                .collect()
        };
        let mut parts = both(mask);
        if parts.is_empty() {
            parts = both(RailMask::ALL);
        }
        if parts.is_empty() {
            // The nodes lost complementary rails: pair their usable rails cross-rail.
            let s: Vec<usize> = (0..k).filter(|&r| tx[r] > 0).collect();
            let d: Vec<usize> = (0..k).filter(|&r| rx[r] > 0).collect();
            for i in 0..s.len().max(d.len()) {
                let (a, b) = (RailId(s[i % s.len()] as u16), RailId(d[i % d.len()] as u16));
                let w = self.usable_mbps(src, a).min(self.usable_mbps(dst, b));
                parts.push(RailPart { src: a, dst: b, weight: w });
            }
            return Ok(RailSplit { parts });
        }
        if policy == RailPolicy::SingleBackup {
            // Nominal share per rail; a rail lost at either end hands its share to the next usable rail.
            let usable: Vec<usize> = parts.iter().map(|p| p.src.index()).collect();
            let mut weights = vec![0u64; k];
            for r in (0..k).filter(|&r| mask.contains(r) || mask == RailMask::ALL) {
                let share = self.nominal[src.index() * k + r].min(self.nominal[dst.index() * k + r]);
                let target = (0..k).map(|d| (r + d) % k).find(|c| usable.contains(c));
                if let Some(t) = target {
                    weights[t] += share;
                }
            }
            for p in &mut parts {
                p.weight = weights[p.src.index()].max(1);
            }
        }
        Ok(RailSplit { parts })
    }
}

impl Fabric {
    /// The split of a transfer from `src` to `dst` when every pair of `nodes` exchanges data at
    /// once (the direct four-stage levels): same-rail parts, rail `r` weighted by the share of
    /// both NICs one connection gets when the NIC's bandwidth is divided evenly between its
    /// connections, `min(usable(src, r) / c(src, r), usable(dst, r) / c(dst, r))`, where `c(x, r)`
    /// counts the other nodes of `nodes` whose NIC on rail `r` is usable. Under fair sharing each
    /// part then runs at the rate its bytes need, and the pair's parts finish together. Pairs with
    /// no usable rail in common get [`Fabric::split`].
    pub fn fair_split(
        &self,
        src: NodeId,
        dst: NodeId,
        nodes: &[NodeId],
        mask: RailMask,
    ) -> Result<RailSplit, AlgoError> {
        let k = self.layout.nics_per_node();
        let up = |node: NodeId, r: usize| mask.contains(r) && self.usable_mbps(node, RailId(r as u16)) > 0;
        let conns = |node: NodeId, r: usize| nodes.iter().filter(|&&x| x != node && up(x, r)).count().max(1) as u64;
        let parts: Vec<RailPart> = (0..k)
            .filter(|&r| up(src, r) && up(dst, r))
            .filter_map(|r| {
                let rail = RailId(r as u16);
                // Scaled so that a 1 Mbit/s NIC shared by 4,096 connections keeps a weight.
                let share = |x: NodeId| self.usable_mbps(x, rail).saturating_mul(1 << 12) / conns(x, r);
                let weight = share(src).min(share(dst));
                (weight > 0).then_some(RailPart { src: rail, dst: rail, weight })
            })
            .collect();
        if parts.is_empty() {
            return self.split(src, dst, mask, RailPolicy::Spread);
        }
        Ok(RailSplit { parts })
    }

    /// The split of a ring transfer from member `src` to member `dst` of a four-stage level
    /// of `members` members whose `joiners` scatter into and gather back from every member
    /// over `policy` splits (one segment, 1/`members` of the level, each way per joiner).
    ///
    /// A member's ring traffic (2 (s - 1) / s of the level each way) fills what the joiners
    /// leave of its NICs by water-filling: every NIC ends at the same load per bandwidth, or
    /// carries no ring traffic if the joiners alone load it beyond that. So a rail that
    /// carries the joiners' traffic gets less of the ring, and no member NIC is loaded like
    /// the joiner's own. Where the joiners load a member's NICs in proportion to bandwidth
    /// (or there are none), this is `split(src, dst, mask, policy)`.
    pub fn joined_ring_split(
        &self,
        src: NodeId,
        dst: NodeId,
        members: usize,
        joiners: &[NodeId],
        mask: RailMask,
        policy: RailPolicy,
    ) -> Result<RailSplit, AlgoError> {
        let plain = self.split(src, dst, mask, policy)?;
        if joiners.is_empty() || members < 2 {
            return Ok(plain);
        }
        let tx = self.ring_room(src, members, joiners, mask, policy, true)?;
        let rx = self.ring_room(dst, members, joiners, mask, policy, false)?;
        let (Some(tx), Some(rx)) = (tx, rx) else { return Ok(plain) };
        let parts = if self.rail_only {
            (0..self.layout.nics_per_node())
                .filter_map(|r| {
                    let w = tx[r].min(rx[r]);
                    (w > 0).then_some(RailPart { src: RailId(r as u16), dst: RailId(r as u16), weight: w })
                })
                .collect()
        } else {
            transport_plan(&tx, &rx)
        };
        if parts.is_empty() {
            return Ok(plain);
        }
        Ok(RailSplit { parts })
    }

    /// Per-rail weights for `node`'s ring traffic around the joiners' load (see
    /// [`Fabric::joined_ring_split`]), sending (`true`) or receiving; `None` where the joiners
    /// load the node's NICs in proportion to bandwidth (the plain split is right then).
    fn ring_room(
        &self,
        node: NodeId,
        members: usize,
        joiners: &[NodeId],
        mask: RailMask,
        policy: RailPolicy,
        sending: bool,
    ) -> Result<Option<Vec<u64>>, AlgoError> {
        let k = self.layout.nics_per_node();
        let mut cap = vec![0.0f64; k];
        for (r, c) in cap.iter_mut().enumerate() {
            if mask.contains(r) {
                *c = self.usable_mbps(node, RailId(r as u16)) as f64;
            }
        }
        if cap.iter().all(|&c| c == 0.0) {
            return Ok(None);
        }
        // Joiner bytes per rail, in units of the level's length.
        let mut load = vec![0.0f64; k];
        for &e in joiners.iter().filter(|&&e| e != node) {
            let sp = if sending { self.split(node, e, mask, policy)? } else { self.split(e, node, mask, policy)? };
            let total = sp.total_weight().max(1) as f64;
            for p in &sp.parts {
                let r = if sending { p.src } else { p.dst }.index();
                load[r] += p.weight as f64 / total / members as f64;
            }
        }
        let level = |r: usize| if cap[r] > 0.0 { load[r] / cap[r] } else { f64::INFINITY };
        let used: Vec<usize> = (0..k).filter(|&r| cap[r] > 0.0).collect();
        let first = level(used[0]);
        if used.iter().all(|&r| (level(r) - first).abs() <= 1e-9 * first.max(1e-12)) {
            return Ok(None);
        }
        // Water level u: sum over rails of max(0, u * cap - load) = the ring's bytes.
        let ring = 2.0 * (members as f64 - 1.0) / members as f64;
        let mut order = used.clone();
        order.sort_by(|&a, &b| level(a).total_cmp(&level(b)));
        let (mut csum, mut lsum, mut u) = (0.0, 0.0, 0.0);
        for (i, &r) in order.iter().enumerate() {
            csum += cap[r];
            lsum += load[r];
            u = (ring + lsum) / csum;
            if order.get(i + 1).is_none_or(|&n| u <= level(n)) {
                break;
            }
        }
        // Parts per million of the ring's bytes (integer weights, as splits take).
        Ok(Some(
            (0..k)
                .map(|r| if cap[r] > 0.0 { ((u * cap[r] - load[r]).max(0.0) / ring * 1e6).round() as u64 } else { 0 })
                .collect(),
        ))
    }
}

/// Spread's integer transport plan: supply `tx_r * sum(rx)` on the sender's rails, demand
/// `rx_r * sum(tx)` on the receiver's; same-rail pairs take what they can, the rest crosses
/// rails.
fn transport_plan(tx: &[u64], rx: &[u64]) -> Vec<RailPart> {
    let k = tx.len().min(rx.len());
    let (st, sr): (u64, u64) = (tx.iter().sum(), rx.iter().sum());
    let mut supply: Vec<u64> = tx.iter().map(|&b| b * sr).collect();
    let mut demand: Vec<u64> = rx.iter().map(|&b| b * st).collect();
    let mut parts = Vec::new();
    for r in 0..k {
        let w = supply[r].min(demand[r]);
        if w > 0 {
            parts.push(RailPart { src: RailId(r as u16), dst: RailId(r as u16), weight: w });
            supply[r] -= w;
            demand[r] -= w;
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < k && j < k {
        if supply[i] == 0 {
            i += 1;
        } else if demand[j] == 0 {
            j += 1;
        } else {
            let w = supply[i].min(demand[j]);
            parts.push(RailPart { src: RailId(i as u16), dst: RailId(j as u16), weight: w });
            supply[i] -= w;
            demand[j] -= w;
        }
    }
    parts.sort_by_key(|p| (p.src, p.dst));
    parts
}
