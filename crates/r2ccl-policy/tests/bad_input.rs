//! Bad input: every invalid request is an error that names what is wrong; nothing panics.
#![allow(clippy::unwrap_used, reason = "tests: a failure is a test failure")]

use r2ccl_core::{HealthView, NicId, NodeId, Rank, ReduceOp};
use r2ccl_policy::{plan, CandidateKind, Collective, NodeSpec, PlanError, Topology, TopologyError};

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
    let e = plan(&topo, &v, Collective::AllReduce { op: ReduceOp::Sum }, 1 << 20).unwrap_err();
    assert_eq!(e, PlanError::NodeDisconnected(NodeId(2)));
    assert!(e.to_string().contains("node2 has no usable NIC"), "{e}");

    let v3 = HealthView::uniform(3, 2, 100_000);
    let e = plan(&topo, &v3, Collective::AllReduce { op: ReduceOp::Sum }, 1).unwrap_err();
    assert_eq!(e, PlanError::HealthShape { topology_nodes: 4, health_nodes: 3 });

    let v4 = HealthView::uniform(4, 3, 100_000);
    assert!(matches!(
        plan(&topo, &v4, Collective::AllReduce { op: ReduceOp::Sum }, 1),
        Err(PlanError::HealthRails { .. })
    ));

    let ok = HealthView::uniform(4, 2, 100_000);
    let e = plan(&topo, &ok, Collective::Broadcast { root: Rank(8) }, 1).unwrap_err();
    assert_eq!(e, PlanError::RootOutOfRange { root: Rank(8), ranks: 8 });
    assert!(e.to_string().contains("outside the communicator of 8 ranks"));
    assert!(plan(&topo, &ok, Collective::Reduce { op: ReduceOp::Sum, root: Rank(7) }, 1).is_ok());
}

#[test]
fn no_spine_and_disjoint_rails_on_two_nodes_is_an_error() {
    let topo = Topology::uniform(2, 2, 100_000).unwrap().with_spine_permille(0).unwrap();
    let mut v = HealthView::uniform(2, 2, 100_000);
    v.set_failed(NicId::new(0, 0)).unwrap();
    v.set_failed(NicId::new(1, 1)).unwrap();
    let e = plan(&topo, &v, Collective::AllReduce { op: ReduceOp::Sum }, 1 << 20).unwrap_err();
    assert!(matches!(e, PlanError::NoPath { .. }), "{e}");
    // With a spine the same failure set is planned over it.
    let topo = Topology::uniform(2, 2, 100_000).unwrap();
    let p = plan(&topo, &v, Collective::AllReduce { op: ReduceOp::Sum }, 1 << 20).unwrap();
    assert!(p.time_s.is_finite());
}

#[test]
fn zero_bytes_moves_nothing() {
    let topo = Topology::uniform(4, 2, 100_000).unwrap();
    let mut v = HealthView::uniform(4, 2, 100_000);
    let p = plan(&topo, &v, Collective::AllReduce { op: ReduceOp::Sum }, 0).unwrap();
    assert_eq!((p.time_s, p.t_nf_s, p.lower_bound_s), (0.0, 0.0, 0.0));
    assert_eq!(p.chosen, CandidateKind::Ring);
    v.set_failed(NicId::new(1, 0)).unwrap();
    let p = plan(&topo, &v, Collective::AllReduce { op: ReduceOp::Sum }, 0).unwrap();
    assert_eq!(p.chosen, CandidateKind::Balance);
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
                Collective::AllReduce { op: ReduceOp::Sum },
                Collective::ReduceScatter { op: ReduceOp::Sum },
                Collective::AllGather,
                Collective::Broadcast { root: Rank(1) },
                Collective::Reduce { op: ReduceOp::Sum, root: Rank((3 * n - 1) as u32) },
                Collective::AlltoAll,
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

#[test]
fn bad_requests_fail_in_both_crates_with_what_is_wrong() {
    use r2ccl_algo::{build_rank_schedule, AlgoError, Layout};
    use r2ccl_core::DType;
    use r2ccl_policy::{plan_payload, schedule_fabric};
    let sum = ReduceOp::Sum;
    // Zero ranks: neither a topology nor a layout can be empty.
    assert_eq!(Topology::uniform(0, 2, 1000), Err(TopologyError::ZeroNodes));
    assert_eq!(Topology::uniform(2, 2, 1000).unwrap().with_ranks_per_node(0), Err(TopologyError::ZeroRanksPerNode));
    assert_eq!(Layout::from_rank_nodes(vec![], 2), Err(AlgoError::ZeroRanks));
    let topo = Topology::uniform(3, 2, 100_000).unwrap().with_ranks_per_node(2).unwrap();
    let ok = HealthView::uniform(3, 2, 100_000);
    // A rank outside the communicator of 6 ranks.
    let e = plan(&topo, &ok, Collective::SendRecv { src: Rank(1), dst: Rank(6) }, 64).unwrap_err();
    assert_eq!(e, PlanError::RankOutOfRange { rank: Rank(6), role: "dst", ranks: 6 });
    assert!(e.to_string().contains("rank6 (dst) is outside the communicator of 6 ranks"), "{e}");
    let e = plan(&topo, &ok, Collective::SendRecv { src: Rank(9), dst: Rank(0) }, 64).unwrap_err();
    assert!(e.to_string().contains("rank9 (src)"), "{e}");
    let p = plan_payload(&topo, &ok, Collective::AllReduce { op: sum }, DType::F32, 8).unwrap();
    let fab = schedule_fabric(&topo, &ok).unwrap();
    let req = p.schedule_request().unwrap();
    let e = build_rank_schedule(&fab, &req, Rank(6)).unwrap_err();
    assert!(e.to_string().contains("rank6 is outside the communicator of 6 ranks"), "{e}");
    // A root out of range.
    let e = plan(&topo, &ok, Collective::Reduce { op: sum, root: Rank(6) }, 64).unwrap_err();
    assert_eq!(e, PlanError::RootOutOfRange { root: Rank(6), ranks: 6 });
    // A failure set that leaves node 1 without any NIC, for planning and for building.
    let mut cut = HealthView::uniform(3, 2, 100_000);
    cut.set_failed(NicId::new(1, 0)).unwrap();
    cut.set_failed(NicId::new(1, 1)).unwrap();
    for e in [plan(&topo, &cut, Collective::AllGather, 64).unwrap_err(), schedule_fabric(&topo, &cut).unwrap_err()] {
        assert_eq!(e, PlanError::NodeDisconnected(NodeId(1)));
        assert!(e.to_string().contains("node1 has no usable NIC"), "{e}");
    }
    // A strategy that is not a candidate of the plan.
    let e = p.request_for(CandidateKind::FourStage).unwrap_err();
    assert!(e.to_string().contains("four_stage is not a candidate"), "{e}");
    // A ring order naming a node that does not exist.
    let e = r2ccl_policy::ring_score(&topo, &ok, &[NodeId(0), NodeId(7), NodeId(2)]).unwrap_err();
    assert!(matches!(e, PlanError::NodeOutOfRange { .. }), "{e}");
}
