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
        for alg in [Algorithm::Ring, Algorithm::Tree, Algorithm::Hierarchical] {
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
    // 8 collectives with ring, tree for the 2 allreduces + broadcast + reduce, hierarchical for the 2 allreduces.
    assert_eq!(built, (8 + 4 + 2) * 4);
    let strategies = [
        Strategy::Balance,
        Strategy::SingleBackup,
        Strategy::R2cclAllReduce(R2cclParams { degraded: NodeId(1), tail_fraction: 0.5, pipeline_chunks: 3 }),
        Strategy::Recursive { pipeline_chunks: 3 },
        Strategy::FourStage,
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
