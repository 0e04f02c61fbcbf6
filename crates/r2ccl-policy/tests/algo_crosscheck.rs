//! Cross-check against `r2ccl-algo`'s bandwidth model: the planner's lower bound and
//! four-stage time agree with the schedule crate's closed forms (alpha = 0; four-stage with the
//! planner's shared-ring factor where the slowest class keeps a ring share).
#![allow(clippy::unwrap_used, reason = "tests: a failure is a test failure")]

use proptest::prelude::*;
use r2ccl_core::{HealthView, NicId, ReduceOp};
use r2ccl_policy::{plan, CandidateKind, Collective, Topology};

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn bound_and_four_stage_agree_with_algo(n in 3usize..12, k in 2usize..6,
                                            fails in proptest::collection::vec((0usize..12, 0usize..6), 1..6)) {
        let topo = Topology::uniform(n, k, 100_000).unwrap().with_alpha(0.0).unwrap();
        let mut v = HealthView::uniform(n, k, 100_000);
        for (i, r) in fails {
            let (i, r) = (i % n, r % k);
            if v.node(r2ccl_core::NodeId(i as u32)).unwrap().healthy_rails().count() > 1 {
                v.set_failed(NicId::new(i as u32, r as u16)).unwrap();
            }
        }
        let d = f64::from(1u32 << 30);
        let p = plan(&topo, &v, Collective::AllReduce { op: ReduceOp::Sum }, 1 << 30).unwrap();
        let bw: Vec<f64> = v.nodes().iter().map(|h| h.usable_mbps() as f64 * 125_000.0).collect();
        let lb = r2ccl_algo::model::lower_bound(&bw, d).unwrap();
        prop_assert!(((p.lower_bound_s - lb) / lb).abs() < 1e-9, "bound {} vs algo {}", p.lower_bound_s, lb);
        if let Some(fs) = p.candidate(CandidateKind::FourStage) {
            // The closed form, times the shared-ring factor when the slowest class keeps a ring share.
            let plan = r2ccl_algo::model::four_stage_plan(&bw).unwrap();
            let shared = plan.thresholds.len() > 1 && plan.fractions[0] > 1e-9;
            let factor = if shared { r2ccl_policy::FOUR_STAGE_SHARED_RING } else { 1.0 };
            let t = r2ccl_algo::model::four_stage_time(&bw, d).unwrap() * factor;
            prop_assert!(fs.time_s >= t * (1.0 - 1e-9) && fs.time_s <= t * 1.01, "four-stage {} vs algo {}", fs.time_s, t);
        }
    }
}
