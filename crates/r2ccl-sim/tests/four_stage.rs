//! The planner's direct four-stage AllReduce on servers with several NICs (issue 34): the exact
//! schedule r2ccl-algo builds, run on the simulated fabric under max-min sharing, takes the
//! section-7 lower bound's time and the planner's prediction, with one or two NICs lost or one NIC
//! slowed; and the planner chooses it there.
#![allow(clippy::unwrap_used, reason = "tests")]
#![allow(clippy::print_stdout, reason = "tests report measured ratios")]

use r2ccl_policy::CandidateKind as P;
use r2ccl_sim::collective::AllReduceJob;
use r2ccl_sim::convert::{append_schedules, plan_allreduce, Choice};
use r2ccl_sim::workload::plan_health;
use r2ccl_sim::{simulate, Dag, EngineConfig, Fabric, FabricSpec, Failure, FailureKind, RepairMode};

/// `nodes` x `nics` at 400 Gb/s, no latency: the bandwidth limit the bound speaks of.
fn fabric(nodes: u32, nics: u32) -> Fabric {
    let mut spec = FabricSpec::new(nodes, 1, nics, 400.0);
    spec.nvlink_gbps = 1e6;
    spec.nic_latency_us = 0.0;
    spec.nvlink_latency_us = 0.0;
    Fabric::new(spec).unwrap()
}

/// (simulated time of the exact direct four-stage schedule of 1 GiB, in the planner's chunks,
/// the planner's prediction, the lower bound, the planner's own choice), seconds.
fn run(nodes: u32, nics: u32, fails: &[Failure]) -> (f64, f64, f64, P) {
    let fab = fabric(nodes, nics);
    let job = AllReduceJob { nodes: (0..nodes).collect(), bytes: 1024.0 * 1048576.0, intra: false, chunks: 1 };
    let p = plan_allreduce(&fab, &plan_health(&fab, fails), &job, Choice::Candidate(P::FourStageDirect)).unwrap();
    assert_eq!(p.strategy, P::FourStageDirect);
    let predicted = p.plan.candidate(P::FourStageDirect).unwrap().time_s;
    let af = r2ccl_policy::schedule_fabric(&p.topology, &p.view).unwrap();
    let layout = af.layout().clone();
    let mut dag = Dag::new();
    let req = &p.request;
    append_schedules(&mut dag, &fab, &layout, &job.nodes, |r| r2ccl_algo::build_rank_schedule(&af, req, r), None)
        .unwrap();
    let t = simulate(&fab, &dag, fails, &EngineConfig::with_repair(RepairMode::Spread)).unwrap().makespan;
    (t, predicted, p.plan.lower_bound_s, p.plan.chosen)
}

#[test]
fn direct_four_stage_reaches_the_bound_and_is_chosen_on_multi_nic_nodes() {
    let down = Failure::known_down;
    let slow = |n, r, fraction| Failure { kind: FailureKind::Degraded { fraction }, ..Failure::known_down(n, r) };
    // The last number: how far above the bound the simulated time may be. Three bandwidth classes
    // (two nodes with different NICs lost) share NICs less exactly: 1.029 there.
    let cases: Vec<(u32, u32, Vec<Failure>, f64)> = vec![
        (4, 2, vec![down(1, 0)], 1.02),
        (4, 4, vec![down(1, 0)], 1.01),
        (4, 8, vec![down(1, 0)], 1.01),
        (8, 8, vec![down(1, 0)], 1.01),
        (4, 4, vec![down(1, 0), down(2, 1)], 1.01),
        (8, 8, vec![down(1, 0), down(2, 1)], 1.01),
        (6, 4, vec![down(0, 0), down(3, 1), down(3, 2)], 1.035),
        (4, 1, vec![slow(0, 0, 0.75)], 1.01),
        (8, 1, vec![slow(0, 0, 0.875)], 1.01),
    ];
    for (nodes, nics, fails, max) in cases {
        let (t, predicted, lb, chosen) = run(nodes, nics, &fails);
        let what: Vec<(u32, u32)> = fails.iter().map(|f| (f.node, f.rail)).collect();
        println!(
            "{nodes} x {nics} NICs, {what:?}: simulated {:.4} x the bound, predicted {:.4} x, chosen {}",
            t / lb,
            predicted / lb,
            chosen.name()
        );
        // Chosen with one or two NICs lost on nodes of 4 or 8 (three lost on 6 x 4: the ring
        // four-stage is predicted faster there).
        if nics >= 4 && fails.len() <= 2 {
            assert_eq!(chosen, P::FourStageDirect, "{nodes} x {nics} {what:?}");
        }
        assert!(t / lb < max, "{nodes} x {nics} {what:?}: simulated {:.4} x the bound", t / lb);
        assert!(predicted / lb < 1.01, "{nodes} x {nics} {what:?}: predicted {:.4} x the bound", predicted / lb);
        assert!(t / predicted < max, "{nodes} x {nics} {what:?}: simulated {t} vs predicted {predicted}");
    }
}
