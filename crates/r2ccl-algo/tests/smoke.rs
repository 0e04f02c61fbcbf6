//! Fixed-case checks of every collective, algorithm and strategy on a degraded fabric.
#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use r2ccl_algo::{Algorithm, Collective, ExecOrder, Fabric, Layout, R2cclParams, ScheduleRequest, Strategy};
use r2ccl_core::{DType, NicId, NodeId, Rank, ReduceOp};

fn fabric(nodes: usize, rpn: usize, nics: usize, fail: &[(u32, u16)]) -> Fabric {
    let layout = Layout::uniform(nodes, rpn, nics).unwrap();
    let mut view = r2ccl_core::HealthView::uniform(nodes, nics, 100_000);
    for &(n, r) in fail {
        view.set_failed(NicId::new(n, r)).unwrap();
    }
    Fabric::new(layout, view).unwrap()
}

#[test]
fn every_collective_and_strategy_is_exact() {
    let fab = fabric(4, 2, 2, &[(1, 0)]);
    let colls = [
        Collective::AllReduce { op: ReduceOp::Sum },
        Collective::AllReduce { op: ReduceOp::Avg },
        Collective::ReduceScatter { op: ReduceOp::Max },
        Collective::AllGather,
        Collective::Broadcast { root: Rank(5) },
        Collective::Reduce { op: ReduceOp::Prod, root: Rank(3) },
        Collective::AlltoAll,
        Collective::SendRecv { src: Rank(1), dst: Rank(6) },
    ];
    let mut built = 0;
    for c in colls {
        for alg in [Algorithm::Ring, Algorithm::Tree, Algorithm::Hierarchical, Algorithm::Rails] {
            for n in [0u64, 1, 7, 33] {
                let req = ScheduleRequest::new(c, DType::F32, n).with_algorithm(alg).with_chunks(2);
                if r2ccl_algo::build_all(&fab, &req).is_err() {
                    continue;
                }
                common::run_and_check(&fab, &req, n, ExecOrder::Program);
                common::run_and_check(&fab, &req, n, ExecOrder::Dataflow);
                built += 1;
            }
        }
    }
    // 8 collectives with ring, tree for the 2 allreduces + broadcast + reduce, hierarchical and rails for the 2
    // allreduces.
    assert_eq!(built, (8 + 4 + 2 + 2) * 4);
    let strategies = [
        Strategy::Balance,
        Strategy::SingleBackup,
        Strategy::R2cclAllReduce(R2cclParams { degraded: NodeId(1), tail_fraction: 0.5, pipeline_chunks: 3 }),
        Strategy::Recursive { pipeline_chunks: 3 },
        Strategy::FourStage,
        Strategy::FourStageDirect,
    ];
    for s in strategies {
        for n in [0u64, 1, 7, 33, 100] {
            let req = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::I32, n)
                .with_strategy(s)
                .with_chunks(2);
            common::run_and_check(&fab, &req, n, ExecOrder::Program);
            common::run_and_check(&fab, &req, n, ExecOrder::Dataflow);
        }
    }
}

#[test]
fn rails_sends_each_ranks_share_on_its_own_rail_and_spreads_a_failed_one() {
    // 4 nodes x 4 ranks x 4 NICs, 4096 f32 per rank: each rank's segment is 1024 elements (4 KiB), and a ring
    // AllReduce among 4 nodes sends 2 * 3/4 of it from every node on the segment's rail.
    let req = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, 4096)
        .with_algorithm(Algorithm::Rails)
        .with_chunks(2);
    let healthy = fabric(4, 4, 4, &[]);
    let scheds = common::run_and_check(&healthy, &req, 7, ExecOrder::Dataflow);
    let t = r2ccl_algo::Traffic::of(healthy.layout(), &scheds).unwrap();
    for node in 0..4u32 {
        for rail in 0..4u16 {
            assert_eq!(t.nic_tx(NicId::new(node, rail)), 2 * 3 * 1024, "node {node} rail {rail}");
        }
        // Nothing goes through a node peer's NIC: each rank sends on its own rail.
        assert_eq!(t.forwarded(NodeId(node)), 0);
    }
    // NIC 0 of node 1 failed: the rail-0 group's transfers to and from node 1 spread over the three rails usable
    // at both ends; every other transfer stays on its rail, and the result is still exact.
    let degraded = fabric(4, 4, 4, &[(1, 0)]);
    let scheds = common::run_and_check(&degraded, &req, 7, ExecOrder::Program);
    let t = r2ccl_algo::Traffic::of(degraded.layout(), &scheds).unwrap();
    // Node 0's rail-0 rank sends only to node 1, on rails 1-3 (a third each, to the element).
    assert_eq!(t.nic_tx(NicId::new(1, 0)), 0);
    assert_eq!(t.nic_tx(NicId::new(0, 0)), 0);
    let node0: u64 = (1..4).map(|r| t.nic_tx(NicId::new(0, r))).sum();
    assert_eq!(node0, 4 * 2 * 3 * 1024);
    for rail in 1..4u16 {
        let extra = t.nic_tx(NicId::new(0, rail)) - 2 * 3 * 1024;
        assert!(extra.abs_diff(2 * 1024) <= 12 * 4, "node 0 rail {rail} carries {extra} bytes of rail 0's");
    }
    let node1: u64 = (1..4).map(|r| t.nic_tx(NicId::new(1, r))).sum();
    assert_eq!(node1, 4 * 2 * 3 * 1024);
    // A layout whose nodes hold different numbers of ranks runs the hierarchical AllReduce, exactly.
    let uneven = Layout::from_rank_nodes(vec![NodeId(0), NodeId(0), NodeId(1), NodeId(2), NodeId(2)], 2).unwrap();
    let fab = Fabric::new(uneven, r2ccl_core::HealthView::uniform(3, 2, 100_000)).unwrap();
    common::run_and_check(&fab, &req, 3, ExecOrder::Dataflow);
}

#[test]
fn rails_is_exact_on_every_small_uniform_layout_and_ring_order() {
    for (nodes, rpn, nics) in [(2, 2, 1), (2, 4, 2), (3, 2, 4), (3, 3, 2), (4, 4, 4), (2, 8, 8), (3, 2, 8)] {
        for fail in [&[][..], &[(1u32, 0u16)][..], &[(0, 1), (2 % nodes as u32, 0)][..]] {
            let lost = |n: u32| fail.iter().filter(|&&(m, _)| m == n).count();
            if fail.iter().any(|&(n, r)| usize::from(r) >= nics || lost(n) >= nics) {
                continue;
            }
            let fab = fabric(nodes, rpn, nics, fail);
            let p = (nodes * rpn) as u32;
            // Rank order, then a ring that reverses the nodes and rotates the ranks inside each.
            let mut shuffled: Vec<Rank> = Vec::new();
            for node in (0..nodes as u32).rev() {
                shuffled.extend((0..rpn as u32).map(|i| Rank(node * rpn as u32 + (i + 1) % rpn as u32)));
            }
            for ring in [None, Some(shuffled)] {
                for (count, chunks) in [(0u64, 1u32), (1, 1), (37, 2), (1000, 3)] {
                    let mut req = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F64, count)
                        .with_algorithm(Algorithm::Rails)
                        .with_strategy(if count % 2 == 0 { Strategy::Balance } else { Strategy::SingleBackup })
                        .with_chunks(chunks);
                    if let Some(r) = &ring {
                        req = req.with_ring(r.clone());
                    }
                    assert_eq!(r2ccl_algo::build_all(&fab, &req).unwrap().len(), p as usize);
                    common::run_and_check(&fab, &req, count, ExecOrder::Dataflow);
                    common::run_and_check(&fab, &req, count, ExecOrder::Program);
                }
            }
        }
    }
}
