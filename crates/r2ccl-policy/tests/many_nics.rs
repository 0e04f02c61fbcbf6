//! Issue 34's table: the planner's predictions for a 1 GiB AllReduce with no latency term (the
//! bandwidth limit), one NIC of one node lost, on 2, 4 and 8 NICs per node: the direct four-stage
//! schedule reaches the section-7 lower bound on multi-NIC nodes (chosen / bound at most 1.01),
//! and at most 1.02 with two NICs of different nodes lost.
#![allow(clippy::unwrap_used, reason = "tests: a failure is a test failure")]
#![allow(clippy::print_stdout, reason = "the test prints the table it checks")]

use r2ccl_core::{DType, HealthView, NicId, ReduceOp};
use r2ccl_policy::{plan_payload, CandidateKind, Collective, Plan, Topology};

const MBPS: u64 = 400_000;

/// `n` nodes x `k` NICs, the NICs `(node, rail)` of `lost` failed, an f32 AllReduce of 1 GiB.
fn plan_1gib(n: usize, k: usize, lost: &[(u32, u16)]) -> Plan {
    let topo = Topology::uniform(n, k, MBPS).unwrap().with_alpha(0.0).unwrap();
    let mut view = HealthView::uniform(n, k, MBPS);
    for &(node, rail) in lost {
        view.set_failed(NicId::new(node, rail)).unwrap();
    }
    plan_payload(&topo, &view, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, (1u64 << 30) / 4).unwrap()
}

#[test]
fn the_chosen_schedule_reaches_the_bound_with_several_nics_per_node() {
    println!("| nodes x NICs | lost | bound / t_nf | four_stage | four_stage_direct | r2ccl_allreduce | balance | chosen | chosen / bound |");
    let one: &[(u32, u16)] = &[(1, 0)];
    let two: &[(u32, u16)] = &[(1, 0), (2, 1)];
    type Case<'a> = (usize, usize, &'a [(u32, u16)], f64);
    let cases: [Case<'_>; 10] = [
        (4, 2, one, 1.01),
        (8, 2, one, 1.01),
        (4, 4, one, 1.01),
        (4, 8, one, 1.01),
        (8, 8, one, 1.01),
        (16, 8, one, 1.01),
        (4, 4, two, 1.02),
        (4, 8, two, 1.02),
        (8, 8, two, 1.02),
        (16, 8, two, 1.02),
    ];
    for (n, k, lost, max) in cases {
        let p = plan_1gib(n, k, lost);
        let ratio = |s: CandidateKind| p.candidate(s).map_or(f64::NAN, |c| c.time_s / p.t_nf_s);
        let chosen = p.time_s / p.lower_bound_s;
        println!(
            "| {n} x {k} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {chosen:.3} |",
            lost.len(),
            p.lower_bound_s / p.t_nf_s,
            ratio(CandidateKind::FourStage),
            ratio(CandidateKind::FourStageDirect),
            ratio(CandidateKind::R2cclAllReduce),
            ratio(CandidateKind::Balance),
            p.chosen.name()
        );
        assert!(chosen <= max, "{n} x {k}, {lost:?}: chosen {} at {chosen:.4} x the bound", p.chosen.name());
        if k >= 4 {
            assert_eq!(p.chosen, CandidateKind::FourStageDirect, "{n} x {k}, {lost:?}");
        }
    }
}
