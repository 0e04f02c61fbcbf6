//! Closed forms of MECHANISMS.md sections 5 and 7, used to check the simulator (times in seconds).

/// Fault-free ring AllReduce: T_nf = 2(n-1)/n * D/B.
pub fn t_nf(n: usize, d: f64, b: f64) -> f64 {
    2.0 * (n as f64 - 1.0) / n as f64 * d / b
}

/// Balance: T / T_nf = 1 / (1 - X).
pub fn balance_ratio(x: f64) -> f64 {
    1.0 / (1.0 - x)
}

/// R2CCL-AllReduce with Y = X and `k` pipeline chunks: (T1, T2, T3, T).
pub fn r2ccl_allreduce(n: usize, d: f64, b: f64, x: f64, k: u32) -> (f64, f64, f64, f64) {
    let y = x;
    let nf = n as f64;
    let t1 = 2.0 * (nf - 1.0) / nf * (1.0 - y) * d / ((1.0 - x) * b);
    let t2 = 2.0 * (nf - 2.0) / (nf - 1.0) * y * d / (x * b);
    let t3 = (1.0 + 1.0 / f64::from(k.max(1))) * y * d / ((1.0 - x) * b);
    (t1, t2, t3, t1.max(t2) + t3)
}

/// R2CCL-AllReduce ratio with K -> infinity: 1 + nX / (2(n-1)(1-X)).
pub fn r2ccl_ratio_limit(n: usize, x: f64) -> f64 {
    1.0 + n as f64 * x / (2.0 * (n as f64 - 1.0) * (1.0 - x))
}

/// Lower bound with p participants and one straggler at beta * B.
pub fn lower_bound(p: usize, d: f64, b: f64, beta: f64) -> f64 {
    let pf = p as f64;
    (2.0 * (pf - 1.0) * d / ((pf - 1.0 + beta) * b)).max(d / (beta * b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_values_of_section_7() {
        let rows = [
            (4, 0.25, 1.333, 1.222, 1.067),
            (4, 0.5, 2.0, 1.667, 1.333),
            (8, 0.125, 1.143, 1.082, 1.016),
            (8, 0.5, 2.0, 1.571, 1.143),
        ];
        for (n, x, bal, r2, lb) in rows {
            let nf = t_nf(n, 1.0, 1.0);
            assert!((balance_ratio(x) - bal).abs() < 1e-3);
            assert!((r2ccl_ratio_limit(n, x) - r2).abs() < 1e-3);
            assert!((lower_bound(n, 1.0, 1.0, 1.0 - x) / nf - lb).abs() < 1e-3);
        }
    }
}
