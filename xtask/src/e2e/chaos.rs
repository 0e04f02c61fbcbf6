//! Seeded random fault timelines: chaos batches and fault storms, written as scenario text.

#[allow(clippy::wildcard_imports, reason = "a part of e2e.rs: its helpers are the parent's")]
use super::*;

/// Totals over chaos runs.
#[derive(Default)]
pub(super) struct ChaosTally {
    pub(super) runs: u32,
    pub(super) faults: usize,
    pub(super) failovers: usize,
    pub(super) wrong: u64,
    pub(super) hangs: u32,
}

impl ChaosTally {
    pub(super) fn add(&mut self, o: &Outcome) {
        self.runs += 1;
        self.faults += o.applied.len();
        // Over every rank where they printed their counts (timelines), else rank 0's.
        self.failovers += failovers_in(&o.outs).map_or_else(
            || o.rank0_out.lines().filter(|l| l.contains("event") && l.contains("failover")).count(),
            |n| n as usize,
        );
        match rank_sum(&o.outs, "wrong values") {
            Some(n) => self.wrong += n,
            None => {
                for l in o.rank0_out.lines() {
                    if let Some(rest) = l.strip_prefix("# Out of bounds values :") {
                        self.wrong += rest.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
                    }
                }
            }
        }
        self.hangs += o.ends.iter().filter(|e| matches!(e, End::Hung)).count() as u32;
    }
}

/// A pseudo-random generator for chaos timelines (xorshift64*; a seed repeats a run).
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Chaos run `i` of `seed`: 3 nodes x 3 NICs at 1gbit, 1 to 3 random faults on rails 0 and 1
/// between 1.5 and 4.5 s (NIC down, flap, black hole with or without restore, egress drop,
/// slow NIC). Rail 2 never fails, so every pair of nodes keeps a common rail and the job must
/// finish with every value exact.
/// The generator of chaos timeline `i` of `seed`.
pub(super) fn chaos_rng(seed: u64, i: u32) -> Rng {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ u64::from(i).wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03)
        | 1);
    for _ in 0..4 {
        rng.next();
    }
    rng
}

/// The collectives fault storms run, storm `i` running `STORM_COLLECTIVES[i % 5]`.
pub(super) const STORM_COLLECTIVES: [&str; 5] = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast"];

/// The message sizes fault storms run, storm `i` running `STORM_SIZES[(i / 5) % 3]`: large
/// messages (pipelined, striped), medium ones and small ones (thousands of collectives, so faults
/// land on plan and agreement boundaries far more often).
pub(super) const STORM_SIZES: [&str; 3] = ["8M", "256K", "4K"];

/// The shape of a fault storm's testbed (`--nodes`, `--nics`, `--ranks-per-node`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StormShape {
    pub(super) ranks_per_node: u32,
    pub(super) nics: u32,
    pub(super) nodes: u32,
    /// `--harsh`: slow-NIC episodes too, and NICs lost for good.
    pub(super) harsh: bool,
}

impl Default for StormShape {
    fn default() -> Self {
        Self { ranks_per_node: 1, nics: 2, nodes: 4, harsh: false }
    }
}

impl StormShape {
    /// The command-line flags that give this shape (none for the default).
    pub(super) fn flags(self) -> String {
        let d = Self::default();
        let mut f = String::new();
        if self.ranks_per_node != d.ranks_per_node {
            f += &format!(" --ranks-per-node {}", self.ranks_per_node);
        }
        if self.nics != d.nics {
            f += &format!(" --nics {}", self.nics);
        }
        if self.nodes != d.nodes {
            f += &format!(" --nodes {}", self.nodes);
        }
        if self.harsh {
            f += " --harsh";
        }
        f
    }
}

/// Fault storm `i` of `seed` (`--chaos N --storm`): `nodes` (4) nodes x `nics` (2) NICs, 12 s of collectives
/// (storm `i` runs `STORM_COLLECTIVES[i % 5]` at `STORM_SIZES[(i / 5) % 3]`); from 1.5 s to
/// 11.5 s a fault episode starts every 0.25-0.6 s on a random healthy NIC of a random node that
/// has fewer than `nics - 1` NICs under a fault: a flap (down, up), a black hole that heals, or an
/// egress drop that ends, each 0.2-0.8 s long. Every node keeps a working NIC throughout.
pub(super) fn storm_scenario(seed: u64, i: u32, shape: StormShape) -> (String, String) {
    let StormShape { ranks_per_node, nics, nodes, .. } = shape;
    let mut rng = chaos_rng(seed, i);
    let mut busy_until = vec![vec![0.0f64; nics as usize]; nodes as usize];
    let mut lost = vec![0u32; nodes as usize];
    let mut gone = vec![vec![false; nics as usize]; nodes as usize];
    let mut faults: Vec<(f64, String)> = Vec::new();
    let mut at = 1.5;
    while at < 11.5 {
        let node = rng.below(u64::from(nodes)) as usize;
        let free: Vec<usize> = (0..nics as usize).filter(|&n| busy_until[node][n] < at).collect();
        if free.len() > 1 {
            let nic = free[rng.below(free.len() as u64) as usize];
            let end = at + 0.2 + rng.below(600) as f64 / 1000.0;
            let kind = if shape.harsh { rng.below(5) } else { rng.below(3) };
            // A harsh storm loses at most `nics - 2` NICs of a node for good (hot-unplugged), so
            // that transient faults still come and go on two, and never one that would leave two
            // nodes without a rail in common for good: on a rail-only fabric nothing could carry
            // their transfers then (no relay through a third node: a bounded error, by design).
            let keeps = |m: usize, r: usize| !(gone[m][r] || (m == node && r == nic));
            let may_lose = lost[node] + 2 < nics
                && (0..nodes as usize).all(|m| m == node || (0..nics as usize).any(|r| keeps(node, r) && keeps(m, r)));
            let (on, off) = match kind {
                0 => ("down", Some("up")),
                1 => ("blackhole", Some("restore")),
                2 => ("drop", Some("undrop")),
                3 => ("rate=100mbit", Some("rate=1gbit")),
                _ if may_lose => ("remove", None),
                _ => ("down", Some("up")),
            };
            faults.push((at, format!("{at:.2} {node} {nic} {on}")));
            match off {
                Some(off) => {
                    faults.push((end, format!("{end:.2} {node} {nic} {off}")));
                    // A short gap after the episode: the next one on this NIC starts on a healed NIC.
                    busy_until[node][nic] = end + 0.05;
                }
                None => {
                    lost[node] += 1;
                    gone[node][nic] = true;
                    busy_until[node][nic] = f64::INFINITY;
                }
            }
        }
        at += 0.25 + rng.below(350) as f64 / 1000.0;
    }
    faults.sort_by(|a, b| a.0.total_cmp(&b.0));
    let list: Vec<String> = faults.into_iter().map(|(_, f)| format!("\"{f}\"")).collect();
    let name = format!("storm-{seed}-{i}");
    let size = STORM_SIZES[(i as usize / STORM_COLLECTIVES.len()) % STORM_SIZES.len()];
    let text = format!(
        "nodes = {nodes}\nnics = {nics}\nranks_per_node = {ranks_per_node}\nrate = \"1gbit\"\nargs = \"{} -b {size} -e {size} -N 0 --duration 12\"\ndeadline_s = 45\nexpect = \"success\"\nfaults = [{}]\n",
        STORM_COLLECTIVES[i as usize % STORM_COLLECTIVES.len()],
        list.join(", ")
    );
    (name, text)
}

pub(super) fn chaos_scenario(seed: u64, i: u32) -> (String, String) {
    let mut rng = chaos_rng(seed, i);
    let mut faults: Vec<(f64, String)> = Vec::new();
    let mut used: Vec<(u64, u64)> = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let (node, nic) = (rng.below(3), rng.below(2));
        if used.contains(&(node, nic)) {
            continue;
        }
        used.push((node, nic));
        let at = 1.5 + rng.below(3000) as f64 / 1000.0;
        let heal = at + 0.3 + rng.below(1500) as f64 / 1000.0;
        let pair: &[(f64, &str)] = match rng.below(6) {
            0 => &[(at, "down")],
            1 => &[(at, "down"), (heal, "up")],
            2 => &[(at, "blackhole")],
            3 => &[(at, "blackhole"), (heal, "restore")],
            4 => &[(at, "drop")],
            _ => &[(at, "rate=100mbit")],
        };
        for (t, kind) in pair {
            faults.push((*t, format!("{t:.2} {node} {nic} {kind}")));
        }
    }
    faults.sort_by(|a, b| a.0.total_cmp(&b.0));
    let list: Vec<String> = faults.into_iter().map(|(_, f)| format!("\"{f}\"")).collect();
    let name = format!("chaos-{seed}-{i}");
    let text = format!(
        "nodes = 3\nnics = 3\nrate = \"1gbit\"\nargs = \"all_reduce -b 8M -e 8M -N 0 --duration 7\"\ndeadline_s = 30\nexpect = \"success\"\nfaults = [{}]\n",
        list.join(", ")
    );
    (name, text)
}
