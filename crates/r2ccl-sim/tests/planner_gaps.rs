//! Measurements behind docs/reproduction.md's explanations of the planner's 2-node schedules: why the 2.7B
//! bucket runs faster with a failed NIC, and why the decode AllReduce loses more per token than the formula
//! strategies (example `planner_gaps` prints the full figures).
#![allow(clippy::unwrap_used, reason = "tests")]

use r2ccl_policy::Strategy as P;
use r2ccl_sim::collective::{AllReduceJob, Strategy};
use r2ccl_sim::convert::{plan_allreduce, Choice};
use r2ccl_sim::workload::{allreduce_run, plan_health};
use r2ccl_sim::{EngineConfig, Fabric, FabricSpec, Failure, RepairMode};

fn fabric(nvlink_gbps: f64, nic_latency_us: f64) -> Fabric {
    let mut s = FabricSpec::new(2, 8, 8, 400.0);
    s.nvlink_gbps = nvlink_gbps;
    s.nic_latency_us = nic_latency_us;
    s.nvlink_latency_us = nic_latency_us / 2.0;
    Fabric::new(s).unwrap()
}

fn run(fab: &Fabric, s: Strategy, job: &AllReduceJob, failed: &[(u32, u32)]) -> f64 {
    let f: Vec<Failure> = failed.iter().map(|&(n, r)| Failure::known_down(n, r)).collect();
    let r = allreduce_run(fab, s, job, &f, &EngineConfig::with_repair(RepairMode::Spread)).unwrap();
    assert!(!r.stalled);
    r.makespan
}

#[test]
fn the_2p7b_bucket_is_bound_by_the_leaders_nvlink_so_a_failed_relay_rail_speeds_it_up() {
    // One 2.7 GB bucket, hierarchical Balance/ring, 64 chunks: chains through the 8 GPUs to GPU 0, whose
    // NVLink links also relay the ring's traffic of the other live rails (PXN).
    let job = AllReduceJob { nodes: vec![0, 1], bytes: 2.7e9, intra: true, chunks: 8 };
    let fab = fabric(3600.0, 2.0);
    let healthy = run(&fab, Strategy::Planner, &job, &[]);
    let rail3 = run(&fab, Strategy::Planner, &job, &[(0, 3)]);
    let rails35 = run(&fab, Strategy::Planner, &job, &[(0, 3), (0, 5)]);
    let rail0 = run(&fab, Strategy::Planner, &job, &[(0, 0)]);
    // Fewer relayed rails at the leader: faster, although the NICs lose 1/8 or 2/8 of their bandwidth.
    assert!(rail3 < 0.99 * healthy, "NIC 3 failed {rail3} vs healthy {healthy}");
    assert!(rails35 < 0.98 * rail3, "NICs 3, 5 failed {rails35} vs {rail3}");
    // The leader's own NIC failed: all 7 live rails are relayed over its NVLink, and the run is slower.
    assert!(rail0 > 1.02 * healthy, "NIC 0 failed {rail0} vs healthy {healthy}");
    // With NVLink 10x faster the NICs bind, and a failed NIC costs its 8/7.
    let fast = fabric(36000.0, 0.0);
    let (h, f) = (run(&fast, Strategy::Planner, &job, &[]), run(&fast, Strategy::Planner, &job, &[(0, 3)]));
    assert!((f / h - 8.0 / 7.0).abs() < 0.01, "fast NVLink: {f} / {h}");
}

#[test]
fn decode_runs_recursive_doubling_whose_cross_node_round_is_bandwidth_bound() {
    // 1 MiB per rank over TP = 16 on 2 x 8 GPUs.
    let job = AllReduceJob { nodes: vec![0, 1], bytes: 1048576.0, intra: true, chunks: 1 };
    let fab = fabric(3600.0, 2.0);
    let b = fab.spec().nic_bytes_per_s();
    for failed in [vec![], vec![(1u32, 0u32)]] {
        let f: Vec<Failure> = failed.iter().map(|&(n, r)| Failure::known_down(n, r)).collect();
        let p = plan_allreduce(&fab, &plan_health(&fab, &f), &job, Choice::Planner).unwrap();
        assert_eq!(p.strategy, P::RecursiveDoubling);
        let rd = run(&fab, Strategy::Planner, &job, &failed);
        // Its cross-node round moves every rank's whole buffer: 8 MiB per node over the live NICs.
        let live = 8.0 - failed.len() as f64;
        let round = 8.0 * job.bytes / (live * b);
        let intra = 3.0 * (1e-6 + job.bytes / (3600e9 / 8.0));
        assert!((rd / (intra + 4e-6 + round) - 1.0).abs() < 0.03, "simulated {rd}, model {}", intra + 4e-6 + round);
        // The planner charges that round one pair's buffer over all NICs, as if the 8 pairs did not share them.
        let predicted = p.plan.time_s;
        assert!(predicted < 0.75 * rd, "predicted {predicted}, simulated {rd}");
        // Still the fastest r2ccl-algo schedule: the hierarchical ring's 14 chain hops take longer.
        let ring = allreduce_run(&fab, Strategy::AlgoBalance, &job, &f, &EngineConfig::with_repair(RepairMode::Spread))
            .unwrap()
            .makespan;
        assert!(ring > 1.4 * rd, "hierarchical {ring} vs recursive doubling {rd}");
    }
    let h = run(&fab, Strategy::Planner, &job, &[]);
    let d = run(&fab, Strategy::Planner, &job, &[(1, 0)]);
    let (fh, fd) = (run(&fab, Strategy::Balance, &job, &[]), run(&fab, Strategy::Balance, &job, &[(1, 0)]));
    assert!(d / h > 1.07 && fd / fh < 1.03, "recursive doubling {d} / {h}, formula Balance {fd} / {fh}");
}
