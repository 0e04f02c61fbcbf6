//! Closed-form bandwidth-model times of MECHANISMS.md sections 5 and 7 (alpha = 0), for
//! one degraded node among `n` equal nodes. The planner's general cost model must agree
//! with these in that case; tests and the CLI compare against them.
//!
//! Units: `d` bytes per rank, `b` bytes per second per node; results in seconds.

/// Fault-free ring AllReduce: `2(n-1)/n * D/B`.
pub fn t_nf_allreduce(n: u32, d: f64, b: f64) -> f64 {
    if n < 2 {
        return 0.0;
    }
    let n = f64::from(n);
    2.0 * (n - 1.0) / n * d / b
}

/// Balance under a lost fraction `x`: `T_nf / (1 - x)`.
pub fn balance_allreduce(n: u32, x: f64, d: f64, b: f64) -> f64 {
    t_nf_allreduce(n, d, b) / (1.0 - x)
}

/// The three stage times of R2CCL-AllReduce (section 5.2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct R2cclTimes {
    /// Main part over all n nodes at the degraded node's pace.
    pub t1: f64,
    /// Tail among the n-1 healthy nodes on the idle capacity.
    pub t2: f64,
    /// Reduce-to-helper and broadcast-back, pipelined in K chunks.
    pub t3: f64,
}

impl R2cclTimes {
    /// `max(T1, T2) + T3`.
    pub fn total(&self) -> f64 {
        self.t1.max(self.t2) + self.t3
    }
}

/// R2CCL-AllReduce stage times with tail fraction `y` and `k` pipeline chunks
/// (`None` = the paper's K -> infinity).
pub fn r2ccl_allreduce(n: u32, x: f64, y: f64, k: Option<u32>, d: f64, b: f64) -> R2cclTimes {
    let nf = f64::from(n);
    let fill = k.map_or(0.0, |k| 1.0 / f64::from(k.max(1)));
    R2cclTimes {
        t1: 2.0 * (nf - 1.0) / nf * (1.0 - y) * d / ((1.0 - x) * b),
        t2: 2.0 * (nf - 2.0) / (nf - 1.0) * y * d / (x * b),
        t3: (1.0 + fill) * y * d / ((1.0 - x) * b),
    }
}

/// Section 7 lower bound for `p` participants with one straggler at `beta * b`:
/// `max(2(p-1)D / ((p-1+beta)B), D / (beta B))`.
pub fn lower_bound_allreduce(p: u32, beta: f64, d: f64, b: f64) -> f64 {
    if p < 2 {
        return 0.0;
    }
    let pf = f64::from(p);
    (2.0 * (pf - 1.0) * d / ((pf - 1.0 + beta) * b)).max(d / (beta * b))
}

/// The four-stage schedule's full-ring fraction `f` for one straggler at `beta`: the value
/// that equalizes the straggler's and the others' time, clamped to [0, 1].
pub fn four_stage_fraction(p: u32, beta: f64) -> f64 {
    let pf = f64::from(p);
    if p < 3 {
        return 1.0;
    }
    let r = 2.0 * (pf - 1.0) / pf;
    let o = (2.0 * pf - 3.0) / (pf - 1.0);
    // straggler: (r f + 1 - f) / beta == others: r f + o (1 - f)
    let num = o - 1.0 / beta;
    let den = (r - 1.0) / beta - r + o;
    if den == 0.0 {
        return 1.0;
    }
    (num / den).clamp(0.0, 1.0)
}

/// The four-stage schedule's bandwidth-model time with full-ring fraction `f`.
pub fn four_stage_allreduce(p: u32, beta: f64, f: f64, d: f64, b: f64) -> f64 {
    let pf = f64::from(p);
    if p < 2 {
        return 0.0;
    }
    let r = 2.0 * (pf - 1.0) / pf;
    let straggler = (r * f + (1.0 - f)) * d / (beta * b);
    let others = if p < 3 { r * d / b } else { (r * f + (2.0 * pf - 3.0) / (pf - 1.0) * (1.0 - f)) * d / b };
    straggler.max(others)
}
