//! Bandwidth-model (alpha = 0) formulas: the lower bound of MECHANISMS.md section 7,
//! closed-form times of every strategy, and the water-filling level plans that the
//! four-stage and recursive builders use.
//!
//! Units: `d` is bytes per participant (for node-level strategies, a node's buffer),
//! bandwidths are bytes per second per participant (a node's usable NIC total), times
//! are seconds. Every function is pure and deterministic.

use crate::layout::Fabric;
use crate::AlgoError;
use r2ccl_core::NodeId;

fn bad(name: &'static str, value: f64, why: &'static str) -> AlgoError {
    AlgoError::InvalidParameter { name, value: value.to_string(), why }
}

fn check_bw(bw: &[f64]) -> Result<(), AlgoError> {
    if bw.is_empty() {
        return Err(AlgoError::ZeroRanks);
    }
    match bw.iter().find(|b| !(b.is_finite() && **b > 0.0)) {
        Some(b) => Err(bad("bandwidth", *b, "must be finite and > 0")),
        None => Ok(()),
    }
}

fn min_of(bw: &[f64]) -> f64 {
    bw.iter().copied().fold(f64::INFINITY, f64::min)
}

/// Usable bandwidth of every node of `fabric` in bytes/s (Mbit/s x 125 000).
pub fn node_bandwidths(fabric: &Fabric) -> Vec<f64> {
    (0..fabric.layout().nodes()).map(|i| fabric.node_usable_mbps(NodeId(i as u32)) as f64 * 125_000.0).collect()
}

/// Fault-free ring AllReduce time `T_nf = 2(n-1)/n * D/B`.
pub fn fault_free_time(n: usize, d: f64, b: f64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    2.0 * (n - 1) as f64 / n as f64 * d / b
}

/// Ring (and Balance) AllReduce time: the ring runs at the pace of the slowest
/// participant, `2(n-1)/n * D / min b`.
pub fn ring_time(bw: &[f64], d: f64) -> Result<f64, AlgoError> {
    check_bw(bw)?;
    Ok(fault_free_time(bw.len(), d, min_of(bw)))
}

/// R2CCL-Balance with one node losing fraction `x`: `T_nf / (1 - x)`.
pub fn balance_time(n: usize, d: f64, b: f64, x: f64) -> Result<f64, AlgoError> {
    if !(0.0..1.0).contains(&x) {
        return Err(bad("x", x, "must be in [0, 1)"));
    }
    Ok(fault_free_time(n, d, b) / (1.0 - x))
}

/// Hot repair with a single backup NIC: slowdown of a node whose NIC `i` is healthy
/// when `healthy[i]`, each failed NIC's share moving to the next healthy NIC (the most
/// loaded NIC carries `1 + failed-mapped-to-it` shares). Errors if none is healthy.
pub fn single_backup_ratio(healthy: &[bool]) -> Result<f64, AlgoError> {
    let k = healthy.len();
    if !healthy.iter().any(|h| *h) {
        return Err(bad("healthy NICs", 0.0, "at least one NIC must be healthy"));
    }
    let mut shares = vec![0u32; k];
    for r in 0..k {
        if let Some(t) = (0..k).map(|d| (r + d) % k).find(|&c| healthy[c]) {
            shares[t] += 1;
        }
    }
    Ok(f64::from(shares.into_iter().max().unwrap_or(1)))
}

/// The stage times of R2CCL-AllReduce (section 5.2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct R2cclTimes {
    /// Main part over all nodes: `2(n-1)/n (1-Y)D / ((1-X)B)`.
    pub t1: f64,
    /// Tail among the healthy nodes on the idle rails: `2(n-2)/(n-1) YD / (XB)`.
    pub t2: f64,
    /// Reduce-to-helper and broadcast-back: `(1 + 1/K) YD / ((1-X)B)` (K = infinity: no 1/K term).
    pub t3: f64,
    /// `max(t1, t2) + t3`.
    pub total: f64,
}

/// R2CCL-AllReduce time for `n >= 2` nodes, the degraded one losing `x`, tail `y`,
/// `k` pipeline chunks (`None` = K -> infinity).
pub fn r2ccl_allreduce_time(n: usize, d: f64, b: f64, x: f64, y: f64, k: Option<u32>) -> Result<R2cclTimes, AlgoError> {
    if n < 2 {
        return Err(bad("n", n as f64, "R2CCL-AllReduce needs at least 2 nodes"));
    }
    if !(x > 0.0 && x < 1.0) {
        return Err(bad("x", x, "must be in (0, 1)"));
    }
    if !(y > 0.0 && y < 1.0) {
        return Err(bad("y", y, "must be in (0, 1)"));
    }
    let nf = n as f64;
    let t1 = 2.0 * (nf - 1.0) / nf * (1.0 - y) * d / ((1.0 - x) * b);
    let t2 = if n >= 3 { 2.0 * (nf - 2.0) / (nf - 1.0) * y * d / (x * b) } else { 0.0 };
    let fill = match k {
        Some(0) => return Err(bad("k", 0.0, "must be at least 1")),
        Some(k) => 1.0 + 1.0 / f64::from(k),
        None => 1.0,
    };
    let t3 = fill * y * d / ((1.0 - x) * b);
    Ok(R2cclTimes { t1, t2, t3, total: t1.max(t2) + t3 })
}

/// Lower bound on AllReduce time with participant bandwidths `bw` (section 7,
/// generalized): `max(2(p-1)D / sum b, D / min b)`. The first term: every element needs
/// 2(p-1) transfers over a total capacity of `sum b`; the second: every participant must
/// send and receive all D bytes. With one straggler at `beta B` this is
/// `max(2(p-1)D/((p-1+beta)B), D/(beta B))`.
pub fn lower_bound(bw: &[f64], d: f64) -> Result<f64, AlgoError> {
    check_bw(bw)?;
    let p = bw.len();
    if p < 2 {
        return Ok(0.0);
    }
    let total: f64 = bw.iter().sum();
    Ok((2.0 * (p - 1) as f64 * d / total).max(d / min_of(bw)))
}

/// The section-7 bound for `p` participants at `b`, one of them at `beta * b`.
pub fn lower_bound_single(p: usize, d: f64, b: f64, beta: f64) -> Result<f64, AlgoError> {
    if !(beta > 0.0 && beta <= 1.0) {
        return Err(bad("beta", beta, "must be in (0, 1]"));
    }
    let mut bw = vec![b; p.max(1)];
    bw[0] = beta * b;
    lower_bound(&bw, d)
}

/// A nested level plan: level `l` is run by the participants with bandwidth
/// `>= thresholds[l]` over a fraction `fractions[l]` of the buffer (levels in increasing
/// threshold order, fractions summing to 1); slower participants join it.
#[derive(Clone, Debug, PartialEq)]
pub struct LevelPlan {
    /// Bandwidth threshold of each level (the level's slowest member class).
    pub thresholds: Vec<f64>,
    /// Buffer fraction of each level.
    pub fractions: Vec<f64>,
}

/// Element ranges `(start, len)` of consecutive levels of a nested plan over `count`
/// elements: cumulative rounding of the fractions, the last level ending at `count`.
/// The nested builders (recursive, four-stage) split their buffer exactly like this.
pub fn level_ranges(count: u64, fractions: &[f64]) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(fractions.len());
    let mut acc = 0.0;
    let mut start = 0u64;
    for (i, f) in fractions.iter().enumerate() {
        acc += f.max(0.0);
        let end =
            if i + 1 == fractions.len() { count } else { ((acc * count as f64).round() as u64).clamp(start, count) };
        out.push((start, end - start));
        start = end;
    }
    out
}

fn classes(bw: &[f64]) -> Vec<f64> {
    let mut c: Vec<f64> = bw.to_vec();
    c.sort_by(f64::total_cmp);
    c.dedup();
    c
}

fn members(bw: &[f64], t: f64) -> usize {
    bw.iter().filter(|&&b| b >= t).count()
}

/// Four-stage level plan (section 7, generalized by water-filling over bandwidth
/// classes): with `s` members and `e = p - s` joiners a level costs each member
/// `(2(s-1) + e)/s` and each joiner `1` buffer-fraction units per direction. Fractions
/// equalize every class's time (`load / bandwidth`); when the slowest class cannot keep
/// up even excluded from everything (its time is then `D / b`), it is excluded and the
/// rest is water-filled again. Reaches [`lower_bound`] in the bandwidth model.
pub fn four_stage_plan(bw: &[f64]) -> Result<LevelPlan, AlgoError> {
    check_bw(bw)?;
    let p = bw.len();
    let c = classes(bw);
    let m = c.len();
    let mut y = vec![0.0; m];
    if p <= 2 || m == 1 {
        y[0] = 1.0;
        return Ok(LevelPlan { thresholds: c, fractions: y });
    }
    let a: Vec<f64> = c
        .iter()
        .map(|&t| {
            let s = members(bw, t) as f64;
            (2.0 * (s - 1.0) + (p as f64 - s)) / s
        })
        .collect();
    let mut j = 0;
    loop {
        let coef = |k: usize| if a[k] - 1.0 > 1e-12 { (c[k] - c[k - 1]) / (a[k] - 1.0) } else { 0.0 };
        let csum: f64 = (j + 1..m).map(coef).sum();
        let t = a[j] / (c[j] + (a[j] - 1.0) * csum);
        for (k, yk) in y.iter_mut().enumerate().skip(j + 1) {
            *yk = t * coef(k);
        }
        y[j] = 1.0 - t * csum;
        if y[j] >= 0.0 || j + 1 == m {
            y[j] = y[j].max(0.0);
            break;
        }
        y[j] = 0.0;
        j += 1;
    }
    let sum: f64 = y.iter().sum();
    for v in &mut y {
        *v /= sum;
    }
    Ok(LevelPlan { thresholds: c, fractions: y })
}

/// Per-participant load (bytes sent, equal to bytes received) of a nested plan, in units
/// of D. `spread = true` for the four-stage join (scatter-in/gather-back), `false` for
/// the helper join of the recursive schedule (stage 1 only; joiners then add one unit
/// per excluded level).
pub fn level_loads(bw: &[f64], plan: &LevelPlan, spread: bool) -> Vec<f64> {
    let p = bw.len() as f64;
    let sizes: Vec<f64> = plan.thresholds.iter().map(|&t| members(bw, t) as f64).collect();
    bw.iter()
        .map(|&b| {
            plan.thresholds
                .iter()
                .zip(&plan.fractions)
                .zip(&sizes)
                .map(|((&t, &y), &s)| {
                    if b >= t {
                        let ring = if s > 1.0 { 2.0 * (s - 1.0) / s } else { 0.0 };
                        if spread {
                            y * (ring + (p - s) / s)
                        } else {
                            y * ring
                        }
                    } else if spread {
                        y
                    } else {
                        0.0
                    }
                })
                .sum()
        })
        .collect()
}

/// Four-stage AllReduce time in the bandwidth model: `max_i load_i * D / b_i`.
pub fn four_stage_time(bw: &[f64], d: f64) -> Result<f64, AlgoError> {
    let plan = four_stage_plan(bw)?;
    Ok(level_loads(bw, &plan, true).iter().zip(bw).map(|(l, b)| l * d / b).fold(0.0, f64::max))
}

/// The four-stage fraction `f` of section 7 (share of the buffer that runs the full
/// ring including the straggler) for `p` participants, one at `beta`.
pub fn four_stage_fraction(p: usize, beta: f64) -> Result<f64, AlgoError> {
    if !(beta > 0.0 && beta <= 1.0) {
        return Err(bad("beta", beta, "must be in (0, 1]"));
    }
    let mut bw = vec![1.0; p.max(1)];
    bw[0] = beta;
    let plan = four_stage_plan(&bw)?;
    Ok(plan.fractions[0])
}

/// Recursive AllReduce level plan (section 6.2): level `l` is a ring among the
/// participants of class `>= thresholds[l]`, fractions water-filled so that every
/// participant's links are busy for the same stage-1 time (levels with fewer than two
/// members are dropped). Slower participants join each level by reduce-to-helper and
/// broadcast-back afterwards.
pub fn recursive_plan(bw: &[f64]) -> Result<LevelPlan, AlgoError> {
    check_bw(bw)?;
    let c: Vec<f64> = classes(bw).into_iter().filter(|&t| members(bw, t) >= 2).collect();
    if c.is_empty() {
        return Ok(LevelPlan { thresholds: vec![min_of(bw)], fractions: vec![1.0] });
    }
    let r: Vec<f64> = c
        .iter()
        .map(|&t| {
            let s = members(bw, t) as f64;
            2.0 * (s - 1.0) / s
        })
        .collect();
    let mut w = vec![c[0] / r[0]];
    for k in 1..c.len() {
        w.push((c[k] - c[k - 1]) / r[k]);
    }
    let sum: f64 = w.iter().sum();
    Ok(LevelPlan { fractions: w.iter().map(|v| v / sum).collect(), thresholds: c })
}

/// Recursive AllReduce time in the bandwidth model: stage 1 (water-filled rings,
/// busiest participant) plus stage 2, the reduce-to-helper/broadcast-back of the joiners,
/// timed by its busiest participant and stretched by the pipeline fill `(1 + 1/K)`
/// (`None` = K -> infinity). In stage 2 a joiner moves every skipped fraction once per
/// direction; a member of a level with `s` members and `e` joiners moves `(e + s - 1)/s`
/// of that level's fraction (helper duty rotates, results spread by a chain).
pub fn recursive_time(bw: &[f64], d: f64, k: Option<u32>) -> Result<f64, AlgoError> {
    let plan = recursive_plan(bw)?;
    let stage1 = level_loads(bw, &plan, false).iter().zip(bw).map(|(l, b)| l * d / b).fold(0.0, f64::max);
    let fill = match k {
        Some(0) => return Err(bad("k", 0.0, "must be at least 1")),
        Some(k) => 1.0 + 1.0 / f64::from(k),
        None => 1.0,
    };
    let p = bw.len() as f64;
    let sizes: Vec<f64> = plan.thresholds.iter().map(|&t| members(bw, t) as f64).collect();
    let stage2 = bw
        .iter()
        .map(|&b| {
            let load: f64 = plan
                .thresholds
                .iter()
                .zip(&plan.fractions)
                .zip(&sizes)
                .map(|((&t, &y), &s)| {
                    let e = p - s;
                    if e == 0.0 {
                        0.0
                    } else if b < t {
                        y
                    } else {
                        y * (e + s - 1.0) / s
                    }
                })
                .sum();
            fill * load * d / b
        })
        .fold(0.0, f64::max);
    Ok(stage1 + stage2)
}
