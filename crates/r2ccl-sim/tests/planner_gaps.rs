//! Measurements behind docs/reproduction.md's explanations of the planner's 2-node schedules: the 2.7B bucket
//! and the decode AllReduce run r2ccl-algo's rail-parallel AllReduce, what binds them and what a lost NIC costs
//! (example `planner_gaps` prints the full figures).
#![allow(clippy::unwrap_used, reason = "tests")]

use r2ccl_policy::CandidateKind as P;
use r2ccl_sim::collective::{AllReduceJob, Scheme};
use r2ccl_sim::convert::{append_allreduce, plan_allreduce, Choice};
use r2ccl_sim::workload::{allreduce_run, plan_health};
use r2ccl_sim::{simulate, Dag, EngineConfig, Fabric, FabricSpec, Failure, RepairMode};

fn fabric(nvlink_gbps: f64, nic_latency_us: f64) -> Fabric {
    let mut s = FabricSpec::new(2, 8, 8, 400.0);
    s.nvlink_gbps = nvlink_gbps;
    s.nic_latency_us = nic_latency_us;
    s.nvlink_latency_us = nic_latency_us / 2.0;
    Fabric::new(s).unwrap()
}

fn run(fab: &Fabric, s: Scheme, job: &AllReduceJob, failed: &[(u32, u32)]) -> f64 {
    let f: Vec<Failure> = failed.iter().map(|&(n, r)| Failure::known_down(n, r)).collect();
    let r = allreduce_run(fab, s, job, &f, &EngineConfig::with_repair(RepairMode::Spread)).unwrap();
    assert!(!r.stalled);
    r.makespan
}

#[test]
fn the_2p7b_bucket_runs_rail_parallel_and_is_bound_by_each_gpus_nvlink() {
    // One 2.7 GB bucket on 2 x 8 GPUs: the planner runs r2ccl-algo's rail-parallel AllReduce. Each GPU's NVLink
    // links carry the node's reduce-scatter and all-gather, 2 (g - 1) / g of the bucket each way (10.5 ms at
    // 3600 Gb/s); the NICs carry 1/8 of the bucket each, both ways (6.75 ms at 400 Gb/s). Pipelined in chunks,
    // the NVLink phases bind.
    let job = AllReduceJob { nodes: vec![0, 1], bytes: 2.7e9, intra: true, chunks: 8 };
    let fab = fabric(3600.0, 2.0);
    let nvlink = 2.0 * 7.0 / 8.0 * job.bytes / (3600e9 / 8.0);
    for failed in [vec![], vec![(0u32, 3u32)]] {
        let f: Vec<Failure> = failed.iter().map(|&(n, r)| Failure::known_down(n, r)).collect();
        let p = plan_allreduce(&fab, &plan_health(&fab, &f), &job, Choice::Planner).unwrap();
        assert_eq!(p.request.algorithm, r2ccl_algo::Algorithm::Rails, "{failed:?}");
        assert!(p.request.chunks > 1, "pipelined: {} chunks", p.request.chunks);
    }
    let healthy = run(&fab, Scheme::Planner, &job, &[]);
    assert!(healthy >= nvlink && healthy < 1.2 * nvlink, "healthy {healthy} against NVLink's {nvlink}");
    // A failed NIC moves its rail's share onto the other seven: the NIC phase grows by 8/7, still below the NVLink
    // phases, so the bucket slows by less than that.
    let rail3 = run(&fab, Scheme::Planner, &job, &[(0, 3)]);
    assert!(rail3 > healthy && rail3 < 8.0 / 7.0 * healthy, "NIC 3 failed {rail3} vs healthy {healthy}");
    // With NVLink 10x faster the NICs bind, and a failed NIC costs its 8/7.
    let fast = fabric(36000.0, 0.0);
    let (h, f) = (run(&fast, Scheme::Planner, &job, &[]), run(&fast, Scheme::Planner, &job, &[(0, 3)]));
    assert!((f / h - 8.0 / 7.0).abs() < 0.02, "fast NVLink: {f} / {h}");
}

#[test]
fn decode_runs_rail_parallel_as_fast_as_the_formula_balance() {
    // 1 MiB per rank over TP = 16 on 2 x 8 GPUs: the planner predicts the rail-parallel AllReduce and recursive
    // doubling within 3% of what they simulate, and picks the rail-parallel one, with a NIC down too. It runs as
    // fast as the formula Balance.
    let job = AllReduceJob { nodes: vec![0, 1], bytes: 1048576.0, intra: true, chunks: 1 };
    let fab = fabric(3600.0, 2.0);
    let mut times = Vec::new();
    for failed in [vec![], vec![(1u32, 0u32)]] {
        let f: Vec<Failure> = failed.iter().map(|&(n, r)| Failure::known_down(n, r)).collect();
        let p = plan_allreduce(&fab, &plan_health(&fab, &f), &job, Choice::Planner).unwrap();
        assert_eq!(p.request.algorithm, r2ccl_algo::Algorithm::Rails, "{failed:?}");
        let rails = run(&fab, Scheme::Planner, &job, &failed);
        assert!((p.plan.time_s / rails - 1.0).abs() < 0.03, "predicted {}, simulated {rails}", p.plan.time_s);
        // Recursive doubling: three NVLink rounds, then every rank's whole buffer across the node pair at once
        // (8 MiB per node over the live NICs). The planner now charges that round's busiest NIC.
        let rd_pred = p.plan.candidate(P::RecursiveDoubling).unwrap().time_s;
        let mut dag = Dag::new();
        let h = plan_health(&fab, &f);
        append_allreduce(&mut dag, &fab, &h, &job, Choice::Candidate(P::RecursiveDoubling), None).unwrap();
        let rd = simulate(&fab, &dag, &f, &EngineConfig::with_repair(RepairMode::Spread)).unwrap().makespan;
        assert!((rd_pred / rd - 1.0).abs() < 0.03, "recursive doubling predicted {rd_pred}, simulated {rd}");
        assert!(rails < 0.6 * rd, "rail-parallel {rails} vs recursive doubling {rd}");
        // The direct exchanges inside the node take one NVLink hop each, as the formula Balance models them.
        let formula = run(&fab, Scheme::Balance, &job, &failed);
        assert!((rails / formula - 1.0).abs() < 0.02, "rail-parallel {rails}, formula Balance {formula}");
        times.push(rails);
    }
    // A lost NIC moves its rail's ring onto the other seven: about 1% per AllReduce.
    assert!(times[1] / times[0] < 1.02, "a lost NIC: {} against {}", times[1], times[0]);
}
