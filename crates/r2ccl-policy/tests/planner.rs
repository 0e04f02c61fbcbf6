//! The communicator's `Planner`: forced strategies, the fallback for layouts the cost model
//! does not cover, ring pipelining, planning across nodes without a rail in common, the cache.

use r2ccl_algo::{Algorithm, Layout, ScheduleRequest};
use r2ccl_core::{DType, HealthView, NicId, NodeId, Rank, ReduceOp};
use r2ccl_policy::{
    pipeline_ring, plan_bridging_splits, CandidateKind, Choice, Collective, PlanError, Planner, PlannerError, Topology,
    RING_PARTS_MAX,
};
use r2ccl_topo::{ClusterTopology, NodeTopology};

fn allreduce(bytes: u64) -> ScheduleRequest {
    ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, bytes / 4)
}

const SUM: Collective = Collective::AllReduce { op: ReduceOp::Sum };

fn planner(nodes: u32, nics: usize, forced: Option<CandidateKind>) -> Planner {
    let topo = Topology::uniform(nodes as usize, nics, 1000).and_then(|t| t.with_spine_permille(0)).expect("topology");
    let layout = Layout::from_rank_nodes((0..nodes).map(NodeId).collect(), nics).expect("layout");
    Planner::new(Rank(1), layout, Some(topo), 1000, forced)
}

#[test]
fn the_cost_model_chooses_unless_a_strategy_is_forced_and_offered() {
    let healthy = HealthView::uniform(4, 2, 1000);
    let p = planner(4, 2, None).collective(&healthy, SUM, DType::F32, 1 << 20).unwrap();
    assert_eq!(p.choice, Choice::Planned(CandidateKind::Ring));
    assert!(p.predicted_s >= p.lower_bound_s && p.predicted_s.is_finite());
    let mut degraded = healthy.clone();
    degraded.set_failed(NicId::new(1, 0)).unwrap();
    let p = planner(4, 2, Some(CandidateKind::Balance)).collective(&degraded, SUM, DType::F32, 1 << 20).unwrap();
    assert_eq!(p.choice, Choice::Planned(CandidateKind::Balance));
    // Forcing the plain ring, which a failed NIC rules out, leaves the choice to the model.
    let p = planner(4, 2, Some(CandidateKind::Ring)).collective(&degraded, SUM, DType::F32, 1 << 20).unwrap();
    assert_ne!(p.choice, Choice::Planned(CandidateKind::Ring));
}

#[test]
fn layouts_the_model_does_not_cover_fall_back_to_a_tree_for_small_calls_and_balance_otherwise() {
    // Ranks not numbered node by node: no cost model.
    let layout = Layout::from_rank_nodes([0, 1, 0, 1].map(NodeId).to_vec(), 2).unwrap();
    let mut p = Planner::new(Rank(0), layout, None, 1000, None);
    let view = HealthView::uniform(2, 2, 1000);
    assert_eq!(p.collective(&view, SUM, DType::F32, 1024).unwrap().choice, Choice::FallbackTree);
    let big = p.collective(&view, SUM, DType::F32, 1 << 20).unwrap();
    assert_eq!(big.choice, Choice::FallbackBalance);
    assert!(big.predicted_s.is_nan());
    // AllGather is never a tree.
    assert_eq!(p.collective(&view, Collective::AllGather, DType::F32, 16).unwrap().choice, Choice::FallbackBalance);
}

#[test]
fn plans_are_cached_per_view_and_a_new_view_plans_again() {
    let mut p = planner(4, 2, None);
    let healthy = HealthView::uniform(4, 2, 1000);
    let a = p.collective(&healthy, SUM, DType::F32, 1 << 20).unwrap();
    let b = p.collective(&healthy, SUM, DType::F32, 1 << 20).unwrap();
    assert_eq!(a.schedule, b.schedule);
    let mut degraded = healthy.clone();
    degraded.set_failed(NicId::new(2, 1)).unwrap();
    let c = p.collective(&degraded, SUM, DType::F32, 1 << 20).unwrap();
    assert_ne!(a.choice, c.choice, "a failed NIC rules the plain ring out");
}

#[test]
fn a_node_without_a_nic_is_a_plan_error_and_a_bad_root_too() {
    let mut view = HealthView::uniform(4, 2, 1000);
    view.set_failed(NicId::new(3, 0)).unwrap();
    view.set_failed(NicId::new(3, 1)).unwrap();
    let e = planner(4, 2, None).collective(&view, SUM, DType::F32, 1 << 20).unwrap_err();
    assert!(matches!(e, PlannerError::Plan(_)), "{e:?}");
    let bcast = Collective::Broadcast { root: Rank(9) };
    let e = planner(4, 2, None).collective(&HealthView::uniform(4, 2, 1000), bcast, DType::F32, 16).unwrap_err();
    assert!(matches!(e, PlannerError::Plan(PlanError::RootOutOfRange { .. })), "{e:?}");
}

#[test]
fn a_split_between_two_nodes_is_planned_with_their_failed_nics_and_other_failures_stay() {
    let topo = Topology::uniform(4, 2, 1000).and_then(|t| t.with_spine_permille(0)).unwrap();
    let mut view = HealthView::uniform(4, 2, 1000);
    // Nodes 0 and 1 share no rail; with four nodes a ring order still avoids that pair.
    view.set_failed(NicId::new(0, 0)).unwrap();
    view.set_failed(NicId::new(1, 1)).unwrap();
    let (_, planned) = plan_bridging_splits(&topo, &view, SUM, DType::F32, 1 << 20).unwrap();
    assert_eq!(planned, view, "a ring order that avoids the pair needs no bridging");
    // On two nodes nothing avoids it: their failed NICs count as usable for planning.
    let topo2 = Topology::uniform(2, 2, 1000).and_then(|t| t.with_spine_permille(0)).unwrap();
    let mut view2 = HealthView::uniform(2, 2, 1000);
    view2.set_failed(NicId::new(0, 0)).unwrap();
    view2.set_failed(NicId::new(1, 1)).unwrap();
    assert!(matches!(
        r2ccl_policy::plan_payload(&topo2, &view2, SUM, DType::F32, 1 << 20),
        Err(PlanError::NoPath { .. })
    ));
    let (_, planned) = plan_bridging_splits(&topo2, &view2, SUM, DType::F32, 1 << 20).unwrap();
    assert!(planned.failed_nics().is_empty(), "{:?}", planned.failed_nics());
    // The planner says it bridged.
    let layout = Layout::from_rank_nodes(vec![NodeId(0), NodeId(1)], 2).unwrap();
    let p = Planner::new(Rank(0), layout, Some(topo2.clone()), 1000, None);
    let mut p = p;
    assert!(p.collective(&view2, SUM, DType::F32, 1 << 20).unwrap().bridged);
    // A node with no usable NIC at all is still an error.
    view2.set_failed(NicId::new(0, 1)).unwrap();
    assert!(plan_bridging_splits(&topo2, &view2, SUM, DType::F32, 1 << 20).is_err());
}

#[test]
fn large_plain_rings_are_pipelined_in_parts_of_a_millisecond_per_nic() {
    // 100 Mbit/s NICs: the 128 KiB floor. 64 MiB over 4 ranks: 16 MiB steps; 2 NICs: 64
    // parts (the cap); 4 MiB: 1 MiB steps, 4 parts of 256 KiB (128 KiB per NIC).
    assert_eq!(pipeline_ring(allreduce(64 << 20), 4, 2, 100).chunks, RING_PARTS_MAX);
    assert_eq!(pipeline_ring(allreduce(4 << 20), 4, 2, 100).chunks, 4);
    assert_eq!(pipeline_ring(allreduce(4 << 20), 4, 1, 100).chunks, 8);
    // 100 Gbit/s: 12.5 MB per NIC and part, so 64 MiB over 4 ranks on 1 NIC is one part.
    assert_eq!(pipeline_ring(allreduce(64 << 20), 4, 1, 100_000).chunks, 1);
    assert_eq!(pipeline_ring(allreduce(1 << 30), 4, 1, 100_000).chunks, 21);
    // Never below one part.
    assert_eq!(pipeline_ring(allreduce(1 << 20), 4, 2, 100).chunks, 1);
    let ag = ScheduleRequest::new(Collective::AllGather, DType::F32, (8 << 20) / 4);
    assert_eq!(pipeline_ring(ag, 4, 2, 100).chunks, 32);
}

#[test]
fn other_algorithms_and_planned_chunks_are_left_alone() {
    let tree = allreduce(64 << 20).with_algorithm(Algorithm::Tree);
    assert_eq!(pipeline_ring(tree, 4, 2, 100).chunks, 1);
    let planned = allreduce(64 << 20).with_chunks(4);
    assert_eq!(pipeline_ring(planned, 4, 2, 100).chunks, 4);
    let bcast = ScheduleRequest::new(Collective::Broadcast { root: Rank(0) }, DType::F32, 16 << 20);
    assert_eq!(pipeline_ring(bcast, 4, 2, 100).chunks, 1);
    assert_eq!(pipeline_ring(allreduce(64 << 20), 1, 2, 100).chunks, 1);
}

/// A cluster model of nodes with `nics` NICs at `mbps` (`slow`: one NIC at half that), rank `r`
/// on node `rank_node[r]`.
fn cluster(rank_node: &[u32], nics: usize, mbps: u64, slow: Option<(usize, usize)>) -> ClusterTopology {
    let names: Vec<String> = (0..nics).map(|r| format!("eth{r}")).collect();
    let count = rank_node.iter().max().map_or(0, |&m| m as usize + 1);
    let nodes = (0..count)
        .map(|n| {
            let facts: Vec<(&str, u64, Option<u32>)> = names
                .iter()
                .enumerate()
                .map(|(r, name)| (name.as_str(), if slow == Some((n, r)) { mbps / 2 } else { mbps }, None))
                .collect();
            NodeTopology::from_nics(format!("node{n}"), &facts)
        })
        .collect();
    let placement: Vec<NodeId> = rank_node.iter().map(|&n| NodeId(n)).collect();
    ClusterTopology::with_ranks_on(None, nodes, &placement).expect("a valid cluster model")
}

#[test]
fn a_communicator_uses_the_cost_model_only_for_layouts_it_covers() {
    let by_node = cluster(&[0, 0, 1, 1], 2, 1000, None);
    let p = Planner::for_communicator(Rank(0), &by_node, true, "auto").unwrap();
    let topo = p.topology().expect("ranks numbered node by node");
    assert_eq!((topo.ranks_per_node(), topo.spine_permille()), (2, 0), "rail-only, two ranks per node");
    let interleaved = cluster(&[0, 1, 0, 1], 2, 1000, None);
    assert!(Planner::for_communicator(Rank(0), &interleaved, true, "auto").unwrap().topology().is_none());
    let uneven = cluster(&[0, 0, 1], 2, 1000, None);
    assert!(Planner::for_communicator(Rank(0), &uneven, true, "auto").unwrap().topology().is_none());
    // A forced strategy by its name.
    let mut view = HealthView::uniform(2, 2, 1000);
    view.set_failed(NicId::new(1, 0)).unwrap();
    let mut p = Planner::for_communicator(Rank(0), &cluster(&[0, 1], 2, 1000, None), true, "balance").unwrap();
    assert_eq!(p.collective(&view, SUM, DType::F32, 1 << 20).unwrap().choice, Choice::Planned(CandidateKind::Balance));
}

#[test]
fn the_cost_model_gets_every_nic_rate_from_the_cluster_model() {
    let c = cluster(&[0, 1, 2], 2, 1000, Some((1, 1)));
    let p = Planner::for_communicator(Rank(0), &c, true, "auto").unwrap();
    let topo = p.topology().unwrap();
    let rates: Vec<Vec<u64>> = topo.nodes().iter().map(|n| n.nic_mbps.clone()).collect();
    assert_eq!(rates, [vec![1000, 1000], vec![1000, 500], vec![1000, 1000]]);
    assert_eq!(topo.alpha_s(), r2ccl_policy::COMMUNICATOR_ALPHA_S);
    assert_eq!(
        Topology::try_from(&cluster(&[0, 1, 1, 0], 2, 1000, None)),
        Err(r2ccl_policy::TopologyError::NotNodeByNode { rank: 1, node: 1, per_node: 2 })
    );
}
