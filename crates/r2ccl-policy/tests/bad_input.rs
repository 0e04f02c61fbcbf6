//! Bad input: every invalid request is an error that names what is wrong; nothing panics.
#![allow(clippy::unwrap_used, reason = "tests: a failure is a test failure")]

use r2ccl_core::{HealthView, NicId, NodeId, Rank};
use r2ccl_policy::{plan, Collective, NodeSpec, PlanError, Strategy, Topology, TopologyError};

#[test]
fn topology_errors_name_the_problem() {
    assert_eq!(Topology::uniform(0, 2, 1000), Err(TopologyError::ZeroNodes));
    assert_eq!(Topology::uniform(2, 0, 1000), Err(TopologyError::ZeroNics { node: 0 }));
    assert_eq!(Topology::uniform(2, 2, 0), Err(TopologyError::ZeroNicRate { node: 0, rail: 0 }));
    assert_eq!(Topology::uniform(2, 2, 1000).unwrap().with_ranks_per_node(0), Err(TopologyError::ZeroRanksPerNode));
    assert!(Topology::uniform(2, 2, 1000).unwrap().with_alpha(-1.0).is_err());
    assert!(Topology::uniform(2, 2, 1000).unwrap().with_alpha(f64::NAN).is_err());
    assert!(Topology::uniform(2, 2, 1000).unwrap().with_intra_gbps(0.0).is_err());
    assert!(Topology::uniform(2, 2, 1000).unwrap().with_spine_permille(1001).is_err());
    let e = Topology::new(vec![NodeSpec { nic_mbps: vec![1, 1] }, NodeSpec { nic_mbps: vec![1] }]).unwrap_err();
    assert_eq!(e, TopologyError::RailCountMismatch { node: 1, expected: 2, found: 1 });
    assert!(e.to_string().contains("node 1 has 1 NICs"));
}

#[test]
fn plan_errors_name_the_problem() {
    let topo = Topology::uniform(4, 2, 100_000).unwrap().with_ranks_per_node(2).unwrap();
    let mut v = HealthView::uniform(4, 2, 100_000);
    v.set_failed(NicId::new(2, 0)).unwrap();
    v.set_failed(NicId::new(2, 1)).unwrap();
    let e = plan(&topo, &v, Collective::AllReduce, 1 << 20).unwrap_err();
    assert_eq!(e, PlanError::NodeDisconnected(NodeId(2)));
    assert!(e.to_string().contains("node2 has no usable NIC"), "{e}");

    let v3 = HealthView::uniform(3, 2, 100_000);
    let e = plan(&topo, &v3, Collective::AllReduce, 1).unwrap_err();
    assert_eq!(e, PlanError::HealthShape { topology_nodes: 4, health_nodes: 3 });

    let v4 = HealthView::uniform(4, 3, 100_000);
    assert!(matches!(plan(&topo, &v4, Collective::AllReduce, 1), Err(PlanError::HealthRails { .. })));

    let ok = HealthView::uniform(4, 2, 100_000);
    let e = plan(&topo, &ok, Collective::Broadcast { root: Rank(8) }, 1).unwrap_err();
    assert_eq!(e, PlanError::RootOutOfRange { root: Rank(8), ranks: 8 });
    assert!(e.to_string().contains("outside the communicator of 8 ranks"));
    assert!(plan(&topo, &ok, Collective::Reduce { root: Rank(7) }, 1).is_ok());
}

#[test]
fn no_spine_and_disjoint_rails_on_two_nodes_is_an_error() {
    let topo = Topology::uniform(2, 2, 100_000).unwrap().with_spine_permille(0).unwrap();
    let mut v = HealthView::uniform(2, 2, 100_000);
    v.set_failed(NicId::new(0, 0)).unwrap();
    v.set_failed(NicId::new(1, 1)).unwrap();
    let e = plan(&topo, &v, Collective::AllReduce, 1 << 20).unwrap_err();
    assert!(matches!(e, PlanError::NoPath { .. }), "{e}");
    // With a spine the same failure set is planned over it.
    let topo = Topology::uniform(2, 2, 100_000).unwrap();
    let p = plan(&topo, &v, Collective::AllReduce, 1 << 20).unwrap();
    assert!(p.time_s.is_finite());
}

#[test]
fn zero_bytes_moves_nothing() {
    let topo = Topology::uniform(4, 2, 100_000).unwrap();
    let mut v = HealthView::uniform(4, 2, 100_000);
    let p = plan(&topo, &v, Collective::AllReduce, 0).unwrap();
    assert_eq!((p.time_s, p.t_nf_s, p.lower_bound_s), (0.0, 0.0, 0.0));
    assert_eq!(p.chosen, Strategy::Ring);
    v.set_failed(NicId::new(1, 0)).unwrap();
    let p = plan(&topo, &v, Collective::AllReduce, 0).unwrap();
    assert_eq!(p.chosen, Strategy::Balance);
    assert!(p.candidates.iter().all(|c| c.time_s == 0.0 && c.nic_bytes.total_tx() == 0));
}

#[test]
fn every_collective_plans_on_odd_shapes() {
    for n in [1usize, 2, 3, 5] {
        for k in [1usize, 3] {
            let topo = Topology::uniform(n, k, 50_000).unwrap().with_ranks_per_node(3).unwrap();
            let mut v = HealthView::uniform(n, k, 50_000);
            if k > 1 {
                v.set_failed(NicId::new((n - 1) as u32, 0)).unwrap();
            }
            let colls = [
                Collective::AllReduce,
                Collective::ReduceScatter,
                Collective::AllGather,
                Collective::Broadcast { root: Rank(1) },
                Collective::Reduce { root: Rank((3 * n - 1) as u32) },
                Collective::AllToAll,
            ];
            for c in colls {
                for bytes in [1u64, 3, 1 << 20] {
                    let p = plan(&topo, &v, c, bytes).unwrap();
                    assert!(p.time_s.is_finite() && p.time_s >= 0.0, "{c:?} n={n} k={k}");
                    assert!(p.time_s >= p.lower_bound_s * (1.0 - 1e-9), "{c:?} n={n} k={k}: below bound");
                    for f in v.failed_nics() {
                        for cand in &p.candidates {
                            assert_eq!(
                                cand.nic_bytes.tx(f.node.index(), f.rail.index()),
                                0,
                                "{c:?} {:?}",
                                cand.strategy
                            );
                        }
                    }
                }
            }
        }
    }
}
