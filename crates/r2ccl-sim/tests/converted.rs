//! The exact r2ccl-algo schedules, converted to flow DAGs, against r2ccl-algo's own timing, the closed forms
//! and r2ccl-algo's byte accounting.
#![allow(clippy::unwrap_used, reason = "tests")]

use r2ccl_algo::{Algorithm, Collective, R2cclParams, ScheduleRequest, Strategy as AlgoStrategy, Traffic};
use r2ccl_core::{DType, NicId, NodeId, ReduceOp};
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

fn close(got: f64, want: f64, tol: f64, what: &str) {
    let err = (got / want - 1.0).abs();
    assert!(err < tol, "{what}: simulated {got:.6} s vs {want:.6} s ({:.3}% off)", err * 100.0);
}

#[test]
fn ring_balance_and_backup_match_algo_and_closed_forms() {
    for (n, k) in [(4u32, 4u32), (6, 2), (8, 4)] {
        let fab = fabric(n, 1, k);
        let b = fab.spec().node_bytes_per_s();
        let nf = closed::t_nf(n as usize, BYTES as f64, b);
        let x = 1.0 / f64::from(k);
        let fails = [Failure::known_down(1, 0)];
        let ring = run(&fab, &[], &req(AlgoStrategy::Balance, 1));
        let bal = run(&fab, &fails, &req(AlgoStrategy::Balance, 1));
        let backup = run(&fab, &fails, &req(AlgoStrategy::SingleBackup, 1));
        for (o, closed_form, what) in
            [(ring, nf, "ring"), (bal, nf * closed::balance_ratio(x), "balance"), (backup, 2.0 * nf, "single backup")]
        {
            close(o.sim, o.algo_sim, 0.01, &format!("{what} n={n} k={k} vs r2ccl_algo::simulate"));
            close(o.sim, o.fluid, 0.01, &format!("{what} n={n} k={k} vs r2ccl_algo::fluid_time"));
            close(o.sim, closed_form, 0.01, &format!("{what} n={n} k={k} vs closed form"));
        }
    }
}

#[test]
fn hierarchical_balance_with_gpus_moves_the_same_bytes() {
    // Two and four GPUs per node: intra-node chain reduce/broadcast over NVLink around the leaders' ring.
    for (n, g, k) in [(4u32, 2u32, 2u32), (4, 4, 4)] {
        let fab = fabric(n, g, k);
        let r = req(AlgoStrategy::Balance, 1).with_algorithm(Algorithm::Hierarchical);
        let o = run(&fab, &[Failure::known_down(2, 1)], &r);
        // NVLink is 36x a NIC: the leaders' ring dominates and the algo model (free NVLink port) agrees.
        close(o.sim, o.algo_sim, 0.05, &format!("hierarchical n={n} g={g} k={k}"));
    }
}

#[test]
fn nested_strategies_are_bounded_by_algo_timing() {
    // Max-min fair sharing between connections on a NIC (what a NIC does with several queue pairs) is slower
    // than r2ccl-algo's first-come first-served ports for the pipelined helper and scatter stages; the
    // converted schedules stay between the perfectly pipelined time and 1.5x r2ccl-algo's list schedule.
    for (n, k) in [(4u32, 4u32), (6, 2), (8, 4)] {
        let fab = fabric(n, 1, k);
        let x = 1.0 / f64::from(k);
        let fails = [Failure::known_down(1, 0)];
        let r2 = R2cclParams { degraded: NodeId(1), tail_fraction: x, pipeline_chunks: 8 };
        for (what, st, chunks) in [
            ("r2ccl_allreduce", AlgoStrategy::R2cclAllReduce(r2), 1),
            ("recursive", AlgoStrategy::Recursive { pipeline_chunks: 8 }, 1),
            ("four_stage", AlgoStrategy::FourStage, 16),
        ] {
            let o = run(&fab, &fails, &req(st, chunks));
            assert!(o.sim >= o.fluid * (1.0 - 1e-9), "{what} n={n} k={k}: {} below the fluid bound {}", o.sim, o.fluid);
            assert!(o.sim <= 1.5 * o.algo_sim, "{what} n={n} k={k}: {} vs algo {}", o.sim, o.algo_sim);
        }
    }
}

#[test]
fn planner_choice_and_candidates_run_in_scenarios() {
    let text = r#"
name = "planner"
strategies = ["balance", "planner", "algo_balance", "algo_single_backup", "algo_r2ccl_allreduce", "algo_recursive"]
[fabric]
nodes = 4
gpus_per_node = 2
nics_per_node = 2
nic_gbps = 100
[workload]
kind = "allreduce"
bytes_mib = 4
[[failures]]
node = 1
rail = 0
kind = "down"
at_s = 0.0
[[failures]]
node = 2
rail = 1
kind = "black_hole"
at_s = 0.5
"#;
    let rep = r2ccl_sim::scenario::Scenario::from_toml(text).unwrap().run().unwrap();
    let get = |s: Strategy| rep.rows.iter().find(|r| r.strategy == s).unwrap();
    for r in &rep.rows {
        assert!(r.seconds.is_finite() && r.seconds > 0.0, "{:?}", r);
        assert!(r.failure_induced_s.is_finite(), "in-flight failure is repaired: {:?}", r);
    }
    // Balance and single backup differ only in NIC weights: with one of two NICs lost both double.
    let (ab, sb) = (get(Strategy::AlgoBalance), get(Strategy::AlgoSingleBackup));
    close(ab.seconds, sb.seconds, 0.01, "balance vs single backup with K = 2");
    assert!(ab.overhead_pct > 50.0, "losing half a node's NICs at least halves its ring speed: {ab:?}");
}

#[test]
fn planner_request_runs_exactly_what_it_planned() {
    let fab = fabric(4, 1, 4);
    let mut h = healthy(&fab);
    h[1][0] = 0.0;
    let job = AllReduceJob { nodes: vec![3, 2, 1, 0], bytes: BYTES as f64, intra: false, chunks: 1 };
    let mut dag = Dag::new();
    let (p, c) =
        append_allreduce(&mut dag, &fab, &h, &job, Choice::Candidate(r2ccl_policy::Strategy::R2cclAllReduce), None)
            .unwrap();
    assert_eq!(p.strategy, r2ccl_policy::Strategy::R2cclAllReduce);
    // The plan's predicted bytes per NIC are the converted DAG's (algo node i is simulated node 3 - i).
    let cand = p.plan.candidate(p.strategy).unwrap();
    assert_eq!(c.nic_tx, cand.nic_bytes.tx);
    assert_eq!(c.nic_rx, cand.nic_bytes.rx);
    let af = r2ccl_policy::schedule_fabric(&p.topology, &p.view).unwrap();
    let traffic = Traffic::of(af.layout(), &r2ccl_algo::build_all(&af, &p.request).unwrap()).unwrap();
    let fails = [Failure { node: 1, rail: 0, kind: FailureKind::Down, at_s: -1.0, until_s: None }];
    let r = simulate(&fab, &dag, &fails, &EngineConfig::with_repair(RepairMode::Spread)).unwrap();
    assert!(!r.stalled);
    assert!(r.makespan >= r2ccl_algo::fluid_time(&af, &traffic) * (1.0 - 1e-9));
    assert!(r.makespan <= 1.5 * cand.time_s, "{} vs predicted {}", r.makespan, cand.time_s);
}
