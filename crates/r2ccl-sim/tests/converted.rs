//! The exact r2ccl-algo schedules, converted to flow DAGs, against r2ccl-algo's own timing, the closed forms
//! and r2ccl-algo's byte accounting.
#![allow(clippy::unwrap_used, reason = "tests")]

use r2ccl_algo::{Algorithm, Collective, R2cclParams, ScheduleRequest, Strategy as AlgoStrategy, Traffic};
use r2ccl_core::{DType, NicId, NodeId, Rank, ReduceOp};
use r2ccl_sim::closed;
use r2ccl_sim::collective::{healthy, AllReduceJob, PlanHealth, Strategy};
use r2ccl_sim::convert::{append_allreduce, append_schedules, health_view, topology, Choice};
use r2ccl_sim::{simulate, Dag, EngineConfig, Fabric, FabricSpec, Failure, FailureKind, RepairMode};

/// 16 MiB of f32 per rank.
const BYTES: u64 = 16 * 1024 * 1024;

fn fabric(n: u32, g: u32, k: u32) -> Fabric {
    let mut s = FabricSpec::new(n, g, k, 100.0);
    s.nic_latency_us = 0.0;
    s.nvlink_latency_us = 0.0;
    Fabric::new(s).unwrap()
}

struct Outcome {
    sim: f64,
    algo_sim: f64,
    fluid: f64,
}

/// Convert `req` on `fab` with `fails` known, simulate it, and compare bytes with `Traffic`.
fn run(fab: &Fabric, fails: &[Failure], req: &ScheduleRequest) -> Outcome {
    let s = fab.spec();
    let mut h: PlanHealth = healthy(fab);
    for f in fails {
        h[f.node as usize][f.rail as usize] = f.remaining();
    }
    let nodes: Vec<u32> = (0..s.nodes).collect();
    let topo = topology(fab, s.nodes as usize, s.gpus_per_node).unwrap();
    let view = health_view(fab, &nodes, &h);
    let af = r2ccl_policy::schedule_fabric(&topo, &view).unwrap();
    let layout = af.layout().clone();
    let mut dag = Dag::new();
    let c = append_schedules(&mut dag, fab, &layout, &nodes, |r| r2ccl_algo::build_rank_schedule(&af, req, r), None)
        .unwrap();
    let all = r2ccl_algo::build_all(&af, req).unwrap();
    let traffic = Traffic::of(&layout, &all).unwrap();
    for n in 0..s.nodes as usize {
        for r in 0..s.nics_per_node as usize {
            let nic = NicId::new(n as u32, r as u16);
            let i = n * s.nics_per_node as usize + r;
            assert_eq!(c.nic_tx[i], traffic.nic_tx(nic), "tx bytes of {nic}");
            assert_eq!(c.nic_rx[i], traffic.nic_rx(nic), "rx bytes of {nic}");
        }
        assert_eq!(c.intra_bytes_of(n), traffic.intra_node(NodeId(n as u32)));
    }
    let r = simulate(fab, &dag, fails, &EngineConfig::with_repair(RepairMode::Spread)).unwrap();
    assert!(!r.stalled);
    let params = r2ccl_algo::SimParams { intra_node_bytes_per_s: s.nvlink_gbps * 1e9 / 8.0 };
    let algo_sim = r2ccl_algo::simulate(&af, &all, &params).unwrap().makespan;
    Outcome { sim: r.makespan, algo_sim, fluid: r2ccl_algo::fluid_time(&af, &traffic) }
}

fn req(strategy: AlgoStrategy, chunks: u32) -> ScheduleRequest {
    ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, BYTES / 4)
        .with_strategy(strategy)
        .with_chunks(chunks)
}

#[test]
fn explore() {
    for (n, k) in [(4u32, 4u32), (6, 2), (8, 4)] {
        let fab = fabric(n, 1, k);
        let fails = [Failure::known_down(1, 0)];
        let x = 1.0 / f64::from(k);
        let b = fab.spec().node_bytes_per_s();
        let d = BYTES as f64;
        for (name, st, ch) in [
            ("ring", AlgoStrategy::Balance, 1),
            ("balance", AlgoStrategy::Balance, 1),
            ("backup", AlgoStrategy::SingleBackup, 1),
            (
                "r2ccl",
                AlgoStrategy::R2cclAllReduce(R2cclParams { degraded: NodeId(1), tail_fraction: x, pipeline_chunks: 8 }),
                1,
            ),
            ("recursive", AlgoStrategy::Recursive { pipeline_chunks: 8 }, 1),
            ("four", AlgoStrategy::FourStage, 16),
        ] {
            let f: &[Failure] = if name == "ring" { &[] } else { &fails };
            let o = run(&fab, f, &req(st, ch));
            let nf = closed::t_nf(n as usize, d, b);
            println!(
                "n={n} k={k} {name}: sim {:.6} algo {:.6} fluid {:.6} ratio-to-nf {:.4} sim/algo {:.4}",
                o.sim,
                o.algo_sim,
                o.fluid,
                o.sim / nf,
                o.sim / o.algo_sim
            );
        }
    }
}
