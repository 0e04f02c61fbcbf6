//! Cross-check against `r2ccl-algo`'s bandwidth model: the planner's lower bound and
//! four-stage time agree with the schedule crate's closed forms (alpha = 0; the built four-stage
//! schedule reaches its closed form under fair sharing of NICs).
#![allow(clippy::unwrap_used, reason = "tests: a failure is a test failure")]

use proptest::prelude::*;
use r2ccl_core::{HealthView, NicId, ReduceOp};
use r2ccl_policy::{plan, Collective, Strategy, Topology};

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
        if let Some(fs) = p.candidate(Strategy::FourStage) {
            // The closed form, or the busiest NIC's bytes where rails the nodes do not share load
            // some NIC beyond its share (the built schedule runs at that under fair sharing).
            let t = r2ccl_algo::model::four_stage_time(&bw, d).unwrap();
            let nb = &fs.nic_bytes;
            let busiest = (0..n * k)
                .filter(|&x| nb.tx[x].max(nb.rx[x]) > 0)
                .map(|x| {
                    let mbps = v.node(r2ccl_core::NodeId((x / k) as u32)).unwrap().nics[x % k].usable_mbps;
                    nb.tx[x].max(nb.rx[x]) as f64 / (mbps as f64 * 125_000.0)
                })
                .fold(0.0, f64::max);
            let want = t.max(busiest);
            prop_assert!(fs.time_s >= want * (1.0 - 1e-9) && fs.time_s <= want * 1.01, "four-stage {} vs algo {} (busiest NIC {})", fs.time_s, t, busiest);
        }
    }
}
