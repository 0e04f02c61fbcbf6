//! Measurements behind docs/reproduction.md's explanations of the recursive formula schedule at one failure
//! and of the helper schedules at 64 nodes (examples `recursive_isolate` and `r2ccl_64` print the full tables).
#![allow(clippy::unwrap_used, reason = "tests")]

use r2ccl_algo::{Collective, R2cclParams, ScheduleRequest, Strategy as AlgoStrategy};
use r2ccl_core::{DType, NodeId, ReduceOp};
use r2ccl_sim::closed;
use r2ccl_sim::collective::{build_recursive, AllReduceJob, RecursiveVariant};
use r2ccl_sim::convert::{append_schedules, health_view, topology};
use r2ccl_sim::workload::plan_health;
use r2ccl_sim::{simulate, Dag, EngineConfig, Fabric, FabricSpec, Failure, RepairMode, Sharing};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Recursive formula schedule, table 1's fabric (4 nodes x 8 NICs, node 1 lost 2 NICs), K = 64: T / T_nf.
fn recursive(v: RecursiveVariant) -> f64 {
    let mut spec = FabricSpec::new(4, 1, 8, 100.0);
    spec.nic_latency_us = 0.01;
    let fab = Fabric::new(spec).unwrap();
    let fails = [Failure::known_down(1, 0), Failure::known_down(1, 1)];
    let job = AllReduceJob { nodes: (0..4).collect(), bytes: GIB, intra: false, chunks: 64 };
    let mut dag = Dag::new();
    build_recursive(&mut dag, &fab, &plan_health(&fab, &fails), &job, None, v);
    let r = simulate(&fab, &dag, &fails, &EngineConfig::with_repair(RepairMode::Spread)).unwrap();
    assert!(!r.stalled);
    r.makespan / closed::t_nf(4, GIB, fab.spec().node_bytes_per_s())
}

#[test]
fn recursive_loses_time_in_its_one_chunk_at_a_time_member_ring() {
    let base = RecursiveVariant::default();
    // Levels: 0.4 of the buffer over all 4 nodes, 0.6 over the 3 healthy ones. Level 1 alone needs
    // 0.6 x (4/3 + 1/3) D / B = 0.667 T_nf in the bandwidth model.
    let level1 = recursive(RecursiveVariant { only_level: Some(1), ..base });
    assert!(level1 > 1.4 * 0.6667, "level 1 alone {level1:.3}");
    // The fold-in wait is not what costs the time ...
    let no_wait = recursive(RecursiveVariant { only_level: Some(1), fold_in_wait: false, ..base });
    assert!((no_wait / level1 - 1.0).abs() < 0.05, "no fold-in wait {no_wait:.3} vs {level1:.3}");
    // ... one chunk's ring at a time is: with one ring per helper in flight, level 1 comes within 15% of it.
    let windowed = recursive(RecursiveVariant { only_level: Some(1), ring_window: 3, ..base });
    assert!(windowed < 1.15 * 0.6667, "level 1 alone, window 3: {windowed:.3}");
    // Sharing the rails between the levels helps rather than hurts.
    let all = recursive(base);
    let sequential = recursive(RecursiveVariant { sequential: true, ..base });
    assert!(all < sequential - 0.1, "concurrent {all:.3}, sequential {sequential:.3}");
    // With the window the whole schedule sits on the rail floor of these levels: the straggler's ring
    // predecessor carries its level-0 share to the straggler on 6 of 8 rails (1.244 T_nf), above the bound
    // (1.067) and close to Balance (1.333).
    let whole = recursive(RecursiveVariant { ring_window: 3, ..base });
    assert!(whole > 1.244 * 0.995 && whole < 1.244 * 1.02, "window 3: {whole:.3}");
}

/// The exact R2CCL-AllReduce (Y = 1/8) or recursive schedule on 64 x 8 NICs of 400 Gb/s without latency,
/// NIC 2 of node 5 failed, one rank per node with 6.5 GB: (makespan, node 5's finish).
fn helper_64(strategy: AlgoStrategy, sharing: Sharing) -> (f64, f64) {
    let mut spec = FabricSpec::new(64, 8, 8, 400.0);
    spec.nic_latency_us = 0.0;
    spec.nvlink_latency_us = 0.0;
    let fab = Fabric::new(spec).unwrap();
    let fails = [Failure::known_down(5, 2)];
    let nodes: Vec<u32> = (0..64).collect();
    let topo = topology(&fab, 64, 1).unwrap();
    let view = health_view(&fab, &nodes, &plan_health(&fab, &fails));
    let af = r2ccl_policy::schedule_fabric(&topo, &view).unwrap();
    let layout = af.layout().clone();
    let req = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, 1_625_000_000)
        .with_strategy(strategy)
        .with_chunks(1);
    let mut dag = Dag::new();
    let c = append_schedules(&mut dag, &fab, &layout, &nodes, |r| r2ccl_algo::build_rank_schedule(&af, &req, r), None)
        .unwrap();
    let cfg = EngineConfig { sharing, ..EngineConfig::with_repair(RepairMode::Spread) };
    let r = simulate(&fab, &dag, &fails, &cfg).unwrap();
    (r.makespan, r.finish[c.rank_end[5] as usize])
}

#[test]
fn helper_chain_sets_the_makespan_at_64_nodes() {
    let b = 8.0 * 400e9 / 8.0;
    for k in [16u32, 32] {
        let p = R2cclParams { degraded: NodeId(5), tail_fraction: 0.125, pipeline_chunks: k };
        let (_, _, _, t) = closed::r2ccl_allreduce(64, 6.5e9, b, 0.125, k);
        // The helper passes each folded piece (Y D / K) along a store-and-forward chain of 62 hops.
        let chain = 62.0 * 0.125 * 6.5e9 / (f64::from(k) * b);
        let (makespan, degraded) = helper_64(AlgoStrategy::R2cclAllReduce(p), Sharing::Ports);
        assert!((degraded / t - 1.0).abs() < 0.01, "K = {k}: degraded node {degraded} vs closed form {t}");
        assert!((makespan / (t + chain) - 1.0).abs() < 0.01, "K = {k}: makespan {makespan} vs {}", t + chain);
        // Recursive differs only in running both stage-1 rings on all rails: the degraded node finishes
        // about 4 ms later.
        let (_, r2_deg) = helper_64(AlgoStrategy::R2cclAllReduce(p), Sharing::MaxMin);
        let (_, rec_deg) = helper_64(AlgoStrategy::Recursive { pipeline_chunks: k }, Sharing::MaxMin);
        assert!(rec_deg - r2_deg > 3e-3, "K = {k}: recursive {rec_deg}, R2CCL-AllReduce {r2_deg}");
    }
}
