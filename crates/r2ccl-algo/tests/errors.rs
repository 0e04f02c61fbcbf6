//! Bad input: every invalid request returns a descriptive error, never a panic or a hang.
#![allow(clippy::unwrap_used, reason = "tests")]

use r2ccl_algo::{
    build_all, build_rank_schedule, execute, AlgoError, Algorithm, Collective, ExecError, ExecOrder, Fabric, Layout,
    R2cclParams, ScheduleRequest, Strategy,
};
use r2ccl_core::{DType, HealthView, NicId, NodeId, Rank, ReduceOp};

fn allreduce(n: u64) -> ScheduleRequest {
    ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::I32, n)
}

#[test]
fn bad_layouts_and_views() {
    assert_eq!(Layout::from_rank_nodes(vec![], 2), Err(AlgoError::ZeroRanks));
    assert_eq!(Layout::uniform(0, 1, 1), Err(AlgoError::ZeroNodes));
    assert_eq!(Layout::uniform(2, 0, 1), Err(AlgoError::ZeroRanks));
    assert_eq!(Layout::uniform(2, 1, 0), Err(AlgoError::BadNicCount(0)));
    assert_eq!(Layout::from_rank_nodes(vec![NodeId(0), NodeId(2)], 1), Err(AlgoError::EmptyNode(NodeId(1))));
    let layout = Layout::uniform(3, 2, 2).unwrap();
    let mut view = HealthView::uniform(3, 2, 1000);
    view.set_failed(NicId::new(1, 0)).unwrap();
    view.set_failed(NicId::new(1, 1)).unwrap();
    let err = Fabric::new(layout.clone(), view).unwrap_err();
    assert_eq!(err, AlgoError::NodeWithoutNic(NodeId(1)));
    assert!(err.to_string().contains("node1"), "{err}");
    let err = Fabric::new(layout, HealthView::uniform(2, 2, 1000)).unwrap_err();
    assert!(matches!(err, AlgoError::ShapeMismatch { .. }), "{err}");
}

#[test]
fn bad_requests() {
    let fab = Fabric::healthy(Layout::uniform(2, 2, 2).unwrap(), 1000).unwrap();
    let err = build_rank_schedule(&fab, &allreduce(4), Rank(4)).unwrap_err();
    assert_eq!(err, AlgoError::RankOutOfRange { rank: Rank(4), ranks: 4 });
    assert!(err.to_string().contains("rank4"));
    let b = ScheduleRequest::new(Collective::Broadcast { root: Rank(9) }, DType::F32, 3);
    assert_eq!(build_all(&fab, &b).unwrap_err(), AlgoError::RootOutOfRange { root: Rank(9), ranks: 4 });
    let r = ScheduleRequest::new(Collective::Reduce { op: ReduceOp::Max, root: Rank(4) }, DType::F32, 3);
    assert!(matches!(build_all(&fab, &r), Err(AlgoError::RootOutOfRange { .. })));
    let s = ScheduleRequest::new(Collective::SendRecv { src: Rank(0), dst: Rank(7) }, DType::F32, 3);
    assert!(matches!(build_all(&fab, &s), Err(AlgoError::RankOutOfRange { .. })));
    let ring = allreduce(4).with_ring(vec![Rank(0), Rank(1), Rank(1), Rank(3)]);
    assert!(matches!(build_all(&fab, &ring), Err(AlgoError::BadRingOrder { .. })));
    let ring = allreduce(4).with_ring(vec![Rank(0), Rank(1)]);
    assert!(matches!(build_all(&fab, &ring), Err(AlgoError::BadRingOrder { .. })));
    assert!(matches!(build_all(&fab, &allreduce(4).with_chunks(0)), Err(AlgoError::InvalidParameter { .. })));
    let ag = ScheduleRequest::new(Collective::AllGather, DType::F32, 3);
    assert!(matches!(
        build_all(&fab, &ag.clone().with_strategy(Strategy::FourStage)),
        Err(AlgoError::NotApplicable { .. })
    ));
    assert!(matches!(build_all(&fab, &ag.with_algorithm(Algorithm::Tree)), Err(AlgoError::NotApplicable { .. })));
    let bad_tail = R2cclParams { degraded: NodeId(0), tail_fraction: 1.5, pipeline_chunks: 2 };
    assert!(matches!(
        build_all(&fab, &allreduce(4).with_strategy(Strategy::R2cclAllReduce(bad_tail))),
        Err(AlgoError::InvalidParameter { name: "tail_fraction", .. })
    ));
    let bad_node = R2cclParams { degraded: NodeId(5), tail_fraction: 0.5, pipeline_chunks: 2 };
    assert!(matches!(
        build_all(&fab, &allreduce(4).with_strategy(Strategy::R2cclAllReduce(bad_node))),
        Err(AlgoError::InvalidParameter { name: "degraded", .. })
    ));
    let huge = ScheduleRequest::new(Collective::AlltoAll, DType::F64, u64::MAX / 2);
    assert!(matches!(build_all(&fab, &huge), Err(AlgoError::SizeOverflow { .. })));
    assert!(r2ccl_algo::model::lower_bound(&[], 1.0).is_err());
    assert!(r2ccl_algo::model::lower_bound(&[1.0, 0.0], 1.0).is_err());
    assert!(r2ccl_algo::model::r2ccl_allreduce_time(1, 1.0, 1.0, 0.5, 0.5, None).is_err());
}

#[test]
fn executor_rejects_mismatches_and_detects_deadlock() {
    let fab = Fabric::healthy(Layout::uniform(3, 1, 1).unwrap(), 1000).unwrap();
    let scheds = build_all(&fab, &allreduce(6)).unwrap();
    let inputs = vec![vec![0u8; 24]; 3];
    assert!(matches!(execute(&scheds, &inputs[..2], ExecOrder::Program), Err(ExecError::Mismatch(_))));
    let short = vec![vec![0u8; 24], vec![0u8; 20], vec![0u8; 24]];
    assert!(matches!(execute(&scheds, &short, ExecOrder::Program), Err(ExecError::InputSize { .. })));
    // Rank 1 waits for a point-to-point message from rank 2 while the others run an
    // allreduce: rank 2 never sends it and rank 1 never feeds the ring.
    let p2p = ScheduleRequest::new(Collective::SendRecv { src: Rank(2), dst: Rank(1) }, DType::I32, 6);
    let p2p = build_all(&fab, &p2p).unwrap();
    let mixed = vec![scheds[0].clone(), p2p[1].clone(), scheds[2].clone()];
    for order in [ExecOrder::Program, ExecOrder::Dataflow] {
        let err = execute(&mixed, &inputs, order).unwrap_err();
        assert!(matches!(err, ExecError::Deadlock { .. }), "{err}");
    }
    // Schedules out of rank order.
    let swapped = vec![scheds[1].clone(), scheds[0].clone(), scheds[2].clone()];
    assert!(matches!(execute(&swapped, &inputs, ExecOrder::Program), Err(ExecError::Mismatch(_))));
}
