//! Cost-model properties: the bandwidth limit (alpha = 0) reproduces the closed forms of
//! MECHANISMS.md sections 5 and 7, and plans are deterministic, never use a failed NIC and
//! account for exactly the traffic the model assumes.
#![allow(clippy::unwrap_used, reason = "tests: a failure is a test failure")]

use proptest::prelude::*;
use r2ccl_algo::model;
use r2ccl_core::{HealthView, NicId, NodeId, ReduceOp};
use r2ccl_policy::{plan, CandidateKind, Collective, Plan, Topology};

const GBPS: u64 = 100_000; // 100 Gbit/s per NIC, in Mbit/s
const BPS_PER_NIC: f64 = 100e9 / 8.0;

fn rel(a: f64, b: f64) -> f64 {
    ((a - b) / b).abs()
}

/// `n` nodes x `k` NICs, node `d` loses its first `lost` NICs, alpha = 0.
fn one_degraded(n: usize, k: usize, d: usize, lost: usize, bytes: u64) -> Plan {
    let topo = Topology::uniform(n, k, GBPS).unwrap().with_alpha(0.0).unwrap();
    let mut view = HealthView::uniform(n, k, GBPS);
    for r in 0..lost {
        view.set_failed(NicId::new(d as u32, r as u16)).unwrap();
    }
    plan(&topo, &view, Collective::AllReduce { op: ReduceOp::Sum }, bytes).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn bandwidth_limit_matches_closed_forms(n in 3usize..16, k in 2usize..9, lost_seed in 0usize..64,
                                          d_seed in 0usize..64, bytes in 1u64..(1 << 32)) {
        let lost = 1 + lost_seed % (k - 1);
        let d = d_seed % n;
        let p = one_degraded(n, k, d, lost, bytes);
        let x = lost as f64 / k as f64;
        let b = BPS_PER_NIC * k as f64;
        let dd = bytes as f64;
        let t_nf = model::fault_free_time(n, dd, b);
        prop_assert!(rel(p.t_nf_s, t_nf) < 1e-9);
        // Balance = T_nf / (1 - X).
        let bal = p.candidate(CandidateKind::Balance).unwrap();
        prop_assert!(rel(bal.time_s, t_nf / (1.0 - x)) < 1e-9, "balance {} vs {}", bal.time_s, t_nf / (1.0 - x));
        // R2CCL-AllReduce = max(T1, T2) + T3 with the (1 + 1/K) pipeline term, for its own Y and K,
        // plus the helper chain: the last piece (Y D / K) passed on whole along the other n - 2
        // healthy nodes.
        let r = p.candidate(CandidateKind::R2cclAllReduce).unwrap();
        let y = r.params.tail_fraction.unwrap();
        let kk = r.params.chunks.unwrap();
        let chain = |y: f64| (n as f64 - 2.0) * y * dd / (f64::from(kk) * b);
        let closed = model::r2ccl_allreduce_time(n, dd, b, x, y, Some(kk)).unwrap().total + chain(y);
        prop_assert!(rel(r.time_s, closed) < 1e-9, "r2ccl {} vs {}", r.time_s, closed);
        // ...and never worse than the paper's Y = X at the same K.
        let paper = model::r2ccl_allreduce_time(n, dd, b, x, x, Some(kk)).unwrap().total + chain(x);
        prop_assert!(r.time_s <= paper * (1.0 + 1e-12));
        // Recursive: the closed form plus the chain of its level without the degraded node, plus
        // what stage 1 loses when its two rings (all nodes: f0; the healthy ones: f1) share every
        // NIC alike instead of water-filled: while both run, the all-node ring gets half a healthy
        // node's bandwidth (at most the degraded node's), the healthy ring the rest; then the one
        // left runs alone.
        let rc = p.candidate(CandidateKind::Recursive).unwrap();
        let rk = rc.params.chunks.unwrap();
        let top = *rc.params.level_fractions.last().unwrap();
        let mut bw = vec![b; n];
        bw[d] = (1.0 - x) * b;
        let nf = n as f64;
        let f0 = rc.params.level_fractions[0];
        let f1 = rc.params.level_fractions.get(1).copied().unwrap_or(0.0);
        let (v0, v1) = (f0 * dd * 2.0 * (nf - 1.0) / nf, f1 * dd * 2.0 * (nf - 2.0) / (nf - 1.0));
        let (x0, x1) = ((b / 2.0).min((1.0 - x) * b), b - (b / 2.0).min((1.0 - x) * b));
        let both = (v0 / x0).min(if v1 > 0.0 { v1 / x1 } else { 0.0 });
        let shared = both + (v0 - x0 * both) / ((1.0 - x) * b) + (v1 - x1 * both).max(0.0) / b;
        let water = ((v0 + v1) / b).max(v0 / ((1.0 - x) * b));
        let rec = model::recursive_time(&bw, dd, Some(rk)).unwrap()
            + (nf - 2.0) * top * dd / (f64::from(rk) * b)
            + (shared - water).max(0.0);
        prop_assert!(rel(rc.time_s, rec) < 1e-9, "recursive {} vs {}", rc.time_s, rec);
        // Lower bound and four-stage.
        let lb = model::lower_bound_single(n, dd, b, 1.0 - x).unwrap();
        prop_assert!(rel(p.lower_bound_s, lb) < 1e-9);
        // Four-stage: the bound when the degraded node only joins (f = 0, X >= 1/2); with a ring
        // share (f > 0) the bound times the planner's shared-ring factor.
        let fs = p.candidate(CandidateKind::FourStage).unwrap();
        let f = model::four_stage_fraction(n, 1.0 - x).unwrap();
        let want = lb * if f > 1e-9 { r2ccl_policy::FOUR_STAGE_SHARED_RING } else { 1.0 };
        prop_assert!(fs.time_s >= want * (1.0 - 1e-9) && fs.time_s <= want * 1.01, "four-stage {} vs {} (bound {}, f {})", fs.time_s, want, lb, f);
        prop_assert!((fs.params.ring_fraction.unwrap() - f).abs() < 1e-9, "f {:?} vs {}", fs.params.ring_fraction, f);
        prop_assert!(rel(model::four_stage_time(&bw, dd).unwrap(), lb) < 1e-9);
        // Every strategy is at or above the bound.
        for c in &p.candidates {
            prop_assert!(c.time_s >= lb * (1.0 - 1e-9), "{:?} below the bound", c.strategy);
        }
    }

    #[test]
    fn plans_are_deterministic_and_consistent(n in 1usize..24, k in 1usize..5, ranks in 1u32..4,
                                             fails in proptest::collection::vec((0usize..24, 0usize..4), 0..8),
                                             bytes in 0u64..(1 << 31), alpha_ns in 0u32..20_000) {
        let topo = Topology::uniform(n, k, GBPS).unwrap().with_ranks_per_node(ranks).unwrap()
            .with_alpha(f64::from(alpha_ns) * 1e-9).unwrap();
        let mut view = HealthView::uniform(n, k, GBPS);
        for (node, nic) in fails {
            let (node, nic) = (node % n, nic % k);
            // Keep at least one NIC per node.
            if view.node(NodeId(node as u32)).unwrap().healthy_rails().count() > 1 {
                view.set_failed(NicId::new(node as u32, nic as u16)).unwrap();
            }
        }
        let a = plan(&topo, &view, Collective::AllReduce { op: ReduceOp::Sum }, bytes).unwrap();
        let b = plan(&topo, &view.clone(), Collective::AllReduce { op: ReduceOp::Sum }, bytes).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
        prop_assert_eq!(a.time_s.to_bits(), b.time_s.to_bits());
        // The chosen strategy is the fastest candidate (a recursive AllReduce that ties with
        // R2CCL-AllReduce up to rounding leaves the choice to R2CCL-AllReduce).
        let chosen = a.chosen_candidate().unwrap();
        prop_assert!(a.candidates.iter().all(|c| c.time_s >= chosen.time_s
            || (c.strategy == CandidateKind::Recursive && chosen.strategy == CandidateKind::R2cclAllReduce
                && c.time_s >= chosen.time_s * (1.0 - 1e-9))));
        prop_assert!(a.time_s >= a.lower_bound_s * (1.0 - 1e-9));
        for c in &a.candidates {
            // No traffic on failed NICs.
            for f in view.failed_nics() {
                let (i, r) = (f.node.index(), f.rail.index());
                prop_assert_eq!(c.nic_bytes.tx(i, r), 0, "{:?} sends on failed {}", c.strategy, f);
                prop_assert_eq!(c.nic_bytes.rx(i, r), 0, "{:?} receives on failed {}", c.strategy, f);
            }
            // Total traffic equals what the model assumes (up to rounding per NIC).
            let slack = (n * k) as f64;
            prop_assert!((c.nic_bytes.total_tx() as f64 - c.model_total_bytes).abs() <= slack,
                "{:?}: tx {} vs model {}", c.strategy, c.nic_bytes.total_tx(), c.model_total_bytes);
            prop_assert!((c.nic_bytes.total_rx() as f64 - c.model_total_bytes).abs() <= slack);
            prop_assert!(c.time_s.is_finite() && c.time_s >= 0.0);
        }
    }
}

#[test]
fn ring_allreduce_traffic_is_the_textbook_total() {
    let p = one_degraded(6, 4, 2, 1, 6 << 20);
    for c in &p.candidates {
        // R2CCL-AllReduce and recursive add their join and helper-chain traffic on top.
        if matches!(c.strategy, CandidateKind::Balance | CandidateKind::SingleBackup | CandidateKind::FourStage) {
            assert!((c.model_total_bytes - 2.0 * 5.0 * f64::from(6 << 20)).abs() < 1.0, "{:?}", c.strategy);
        }
    }
    // Balance on the degraded node: its 3 NICs share its traffic equally, to within one
    // element per message (each of its 10 messages rounds by largest remainder).
    let bal = p.candidate(CandidateKind::Balance).unwrap();
    let shares: Vec<u64> = (0..4).map(|r| bal.nic_bytes.tx(2, r)).collect();
    assert_eq!(shares[0], 0);
    assert!(shares[1].abs_diff(shares[2]) <= 10 && shares[2].abs_diff(shares[3]) <= 10, "{shares:?}");
    assert_eq!(p.nic_weights[2 * 4], 0.0);
    assert!((p.nic_weights[2 * 4 + 1] - 1.0 / 3.0).abs() < 1e-12);
}

#[test]
fn section7_table_to_three_decimals() {
    // (n, NICs, lost, balance, r2ccl K->inf, bound)
    let rows = [
        (4usize, 4usize, 1usize, 1.333, 1.222, 1.067),
        (4, 2, 1, 2.000, 1.667, 1.333),
        (8, 8, 1, 1.143, 1.082, 1.016),
        (8, 2, 1, 2.000, 1.571, 1.143),
    ];
    let round3 = |x: f64| (x * 1000.0).round() / 1000.0;
    for (n, k, lost, bal, r2, lb) in rows {
        let p = one_degraded(n, k, 1, lost, 1 << 30);
        let x = lost as f64 / k as f64;
        let t_nf = p.t_nf_s;
        assert_eq!(round3(p.candidate(CandidateKind::Balance).unwrap().time_s / t_nf), bal, "balance n={n} X={x}");
        let b = BPS_PER_NIC * k as f64;
        let r2_inf = model::r2ccl_allreduce_time(n, f64::from(1u32 << 30), b, x, x, None).unwrap().total;
        assert_eq!(round3(r2_inf / t_nf), r2, "r2ccl n={n} X={x}");
        assert_eq!(round3(p.lower_bound_s / t_nf), lb, "bound n={n} X={x}");
        let fs = p.candidate(CandidateKind::FourStage).unwrap().time_s / t_nf;
        let shared = model::four_stage_fraction(n, 1.0 - x).unwrap() > 1e-9;
        let want = lb * if shared { r2ccl_policy::FOUR_STAGE_SHARED_RING } else { 1.0 };
        assert!((fs - want).abs() / want < 0.01, "four-stage {fs} vs {want} (bound {lb})");
        // The planner's R2CCL-AllReduce (finite K, Y chosen) is within 1% of or better than K -> inf with
        // Y = X, once its helper chain ((n - 2) Y D / (K B), zero at K -> inf) is set aside.
        let r = p.candidate(CandidateKind::R2cclAllReduce).unwrap();
        let (y, kk) = (r.params.tail_fraction.unwrap(), f64::from(r.params.chunks.unwrap()));
        let chain = (n as f64 - 2.0) * y * f64::from(1u32 << 30) / (kk * b);
        assert!(chain > 0.0);
        assert!((r.time_s - chain) / t_nf <= r2 * 1.01, "r2ccl n={n} X={x}: {} - chain {}", r.time_s, chain);
    }
}

#[test]
fn small_messages_pick_the_latency_optimal_algorithm() {
    let topo = Topology::uniform(16, 8, 400_000).unwrap();
    let view = HealthView::uniform(16, 8, 400_000);
    let small = plan(&topo, &view, Collective::AllReduce { op: ReduceOp::Sum }, 4 << 10).unwrap();
    assert_eq!(small.chosen, CandidateKind::RecursiveDoubling);
    let large = plan(&topo, &view, Collective::AllReduce { op: ReduceOp::Sum }, 1 << 30).unwrap();
    assert_eq!(large.chosen, CandidateKind::Ring);
    // The crossover comes from the model: find it and check both sides.
    let mut lo = 4u64 << 10;
    let mut hi = 1u64 << 30;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if plan(&topo, &view, Collective::AllReduce { op: ReduceOp::Sum }, mid).unwrap().chosen
            == CandidateKind::RecursiveDoubling
        {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let at = |b: u64, s: CandidateKind| {
        plan(&topo, &view, Collective::AllReduce { op: ReduceOp::Sum }, b).unwrap().candidate(s).unwrap().time_s
    };
    assert!(at(lo, CandidateKind::RecursiveDoubling) <= at(lo, CandidateKind::Ring));
    assert!(at(hi, CandidateKind::Ring) < at(hi, CandidateKind::RecursiveDoubling));
}

#[test]
fn single_backup_doubles_and_balance_spreads() {
    // 3 nodes x 3 NICs, one NIC cut (the paper's small cluster): backup 2x, Balance 1.5x.
    let p = one_degraded(3, 3, 0, 1, 4 << 30);
    let sb = p.candidate(CandidateKind::SingleBackup).unwrap().time_s / p.t_nf_s;
    let bal = p.candidate(CandidateKind::Balance).unwrap().time_s / p.t_nf_s;
    assert!((sb - 2.0).abs() < 1e-9, "single backup {sb}");
    assert!((bal - 1.5).abs() < 1e-9, "balance {bal}");
    assert!(p.candidate(CandidateKind::Ring).is_none());
    let sbc = p.candidate(CandidateKind::SingleBackup).unwrap();
    // Rail 1 carries its own channel and the failed rail 0's (to within element rounding).
    assert!(sbc.nic_bytes.tx(0, 1).abs_diff(2 * sbc.nic_bytes.tx(0, 2)) <= 8, "{:?}", sbc.nic_bytes);
}

/// Several ranks per node: the plain strategies run r2ccl-algo's rail-parallel AllReduce when the
/// model puts it ahead of the hierarchical one: one chunk for a latency-bound buffer, pipelined
/// chunks for a large one; recursive doubling's cross-node round pays its busiest NIC.
#[test]
fn multi_rank_nodes_run_the_rail_parallel_allreduce() {
    let topo = Topology::uniform(2, 8, 400_000)
        .unwrap()
        .with_ranks_per_node(8)
        .unwrap()
        .with_alpha(4e-6)
        .unwrap()
        .with_intra_alpha(1e-6)
        .unwrap()
        .with_intra_gbps(3600.0)
        .unwrap();
    let sum = Collective::AllReduce { op: ReduceOp::Sum };
    for (bytes, pipelined) in [(1u64 << 20, false), (2_700_000_000, true)] {
        for failed in [None, Some(NicId::new(1, 0))] {
            let mut view = HealthView::uniform(2, 8, 400_000);
            if let Some(nic) = failed {
                view.set_failed(nic).unwrap();
            }
            let p = plan(&topo, &view, sum, bytes).unwrap();
            let req = p.schedule_request().unwrap();
            assert_eq!(req.algorithm, r2ccl_algo::Algorithm::Rails, "{bytes} bytes, {failed:?}: {:?}", p.chosen);
            assert_eq!(req.chunks > 1, pipelined, "{bytes} bytes: {} chunks", req.chunks);
        }
    }
    // 1 MiB: three NVLink rounds (1 us + 1 MiB at 450 GB/s each), then 8 MiB per node over 8 NICs of 50 GB/s
    // after a 4 us hop.
    let p = plan(&topo, &HealthView::uniform(2, 8, 400_000), sum, 1 << 20).unwrap();
    let rd = p.candidate(CandidateKind::RecursiveDoubling).unwrap().time_s;
    let mib = 1048576.0;
    let want = 3.0 * (1e-6 + mib / 450e9) + 4e-6 + 8.0 * mib / (8.0 * 50e9);
    assert!(rel(rd, want) < 1e-9, "recursive doubling {rd} against {want}");
}
