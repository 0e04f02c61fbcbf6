//! The exact r2ccl-algo schedules, converted to flow DAGs, against r2ccl-algo's own timing, the closed forms
//! and r2ccl-algo's byte accounting.
#![allow(clippy::unwrap_used, reason = "tests")]
#![allow(clippy::print_stdout, reason = "tests report measured ratios")]

use r2ccl_algo::{Algorithm, Collective, R2cclParams, ScheduleRequest, Strategy as AlgoStrategy, Traffic};
use r2ccl_core::{DType, NicId, NodeId, ReduceOp};
use r2ccl_sim::closed;
use r2ccl_sim::collective::{healthy, AllReduceJob, PlanHealth, Scheme};
use r2ccl_sim::convert::{
    append_allreduce, append_allreduce_with, append_schedules, health_view, topology, Choice, MergeRails,
};
use r2ccl_sim::{simulate, Dag, EngineConfig, Fabric, FabricSpec, Failure, FailureKind, Op, RepairMode, Sharing};

/// 16 MiB of f32 per rank.
const BYTES: u64 = 16 * 1024 * 1024;

fn fabric(n: u32, g: u32, k: u32) -> Fabric {
    let mut s = FabricSpec::new(n, g, k, 100.0);
    s.nic_latency_us = 0.0;
    s.nvlink_latency_us = 0.0;
    Fabric::new(s).unwrap()
}

struct Outcome {
    /// Simulated makespan.
    sim: f64,
    /// Finish time of every rank's last step.
    rank_finish: Vec<f64>,
    /// `r2ccl_algo::simulate`'s makespan.
    algo_sim: f64,
    /// `r2ccl_algo::fluid_time`.
    fluid: f64,
}

/// Convert `req` on `fab` with `fails` known, simulate it under `sharing`, and compare bytes with `Traffic`.
fn run_with(fab: &Fabric, fails: &[Failure], req: &ScheduleRequest, sharing: Sharing) -> Outcome {
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
    let cfg = EngineConfig { sharing, ..EngineConfig::with_repair(RepairMode::Spread) };
    let r = simulate(fab, &dag, fails, &cfg).unwrap();
    assert!(!r.stalled);
    let params = r2ccl_algo::SimParams { intra_node_bytes_per_s: s.nvlink_gbps * 1e9 / 8.0 };
    let algo_sim = r2ccl_algo::simulate(&af, &all, &params).unwrap().makespan;
    Outcome {
        sim: r.makespan,
        rank_finish: c.rank_end.iter().map(|&t| r.finish[t as usize]).collect(),
        algo_sim,
        fluid: r2ccl_algo::fluid_time(&af, &traffic),
    }
}

/// [`run_with`] under the default max-min sharing.
fn run(fab: &Fabric, fails: &[Failure], req: &ScheduleRequest) -> Outcome {
    run_with(fab, fails, req, Sharing::MaxMin)
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

/// The three nested strategies with the chunk counts under test (R2CCL-AllReduce's degraded node is node 1).
fn nested_cases(x: f64) -> Vec<(String, AlgoStrategy, u32)> {
    let mut v = Vec::new();
    for k in [1u32, 4, 8] {
        let r2 = R2cclParams { degraded: NodeId(1), tail_fraction: x, pipeline_chunks: k };
        v.push((format!("r2ccl_allreduce K={k}"), AlgoStrategy::R2cclAllReduce(r2), 1));
        v.push((format!("recursive K={k}"), AlgoStrategy::Recursive { pipeline_chunks: k }, k));
    }
    for k in [1u32, 2, 4, 16] {
        v.push((format!("four_stage K={k}"), AlgoStrategy::FourStage, k));
    }
    v
}

#[test]
fn under_the_port_model_converted_schedules_reproduce_algo_timing() {
    // `Sharing::Ports` is r2ccl_algo::simulate's model (exclusive NIC ports, list scheduling in readiness order).
    // Under it the converted DAGs reproduce r2ccl-algo's own times: the conversion (dependencies, message
    // matching, NIC parts) is exact. Four-stage is within 5% only: its list schedule depends on the order in which
    // simultaneously ready parts take ports (reversing that order moves r2ccl-sim's time by up to 6%), and the two
    // simulators break such ties differently.
    for (n, k) in [(4u32, 4u32), (6, 2), (8, 4)] {
        let fab = fabric(n, 1, k);
        let fails = [Failure::known_down(1, 0)];
        let x = 1.0 / f64::from(k);
        let mut cases = nested_cases(x);
        cases.push(("balance".into(), AlgoStrategy::Balance, 1));
        cases.push(("single backup".into(), AlgoStrategy::SingleBackup, 1));
        for (what, st, chunks) in cases {
            let o = run_with(&fab, &fails, &req(st, chunks), Sharing::Ports);
            let tol = if what.starts_with("four_stage") { 0.08 } else { 0.01 };
            println!("ports: {what} n={n} k={k}: {:.4} x r2ccl_algo::simulate", o.sim / o.algo_sim);
            close(o.sim, o.algo_sim, tol, &format!("ports: {what} n={n} k={k} vs r2ccl_algo::simulate"));
        }
    }
}

#[test]
fn under_max_min_sharing_nested_strategies_stay_in_the_documented_band() {
    // The default sharing differs from r2ccl-algo's port model: connections that share a NIC share its
    // bandwidth instead of taking turns. Measured over these cases: 0.94x to 1.19x r2ccl_algo::simulate
    // (docs/reproduction.md); never below the perfectly pipelined time.
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for (n, k) in [(4u32, 4u32), (6, 2), (8, 4)] {
        let fab = fabric(n, 1, k);
        let fails = [Failure::known_down(1, 0)];
        for (what, st, chunks) in nested_cases(1.0 / f64::from(k)) {
            let o = run(&fab, &fails, &req(st, chunks));
            assert!(o.sim >= o.fluid * (1.0 - 1e-9), "{what} n={n} k={k}: {} below the fluid bound {}", o.sim, o.fluid);
            let ratio = o.sim / o.algo_sim;
            (lo, hi) = (lo.min(ratio), hi.max(ratio));
            assert!((0.9..=1.25).contains(&ratio), "{what} n={n} k={k}: {ratio:.4} x r2ccl_algo::simulate");
        }
    }
    println!("max-min / r2ccl_algo::simulate over the nested cases: {lo:.3} .. {hi:.3}");
}

#[test]
fn r2ccl_allreduce_degraded_node_matches_the_k_chunk_formula() {
    // MECHANISMS.md 5.2: 4 nodes x 4 NICs, node 2 lost NIC 1, X = Y = 1/4. The formula is the degraded node's
    // finish time (the helpers forward the folded tail to the other healthy nodes afterwards).
    let fab = fabric(4, 1, 4);
    let b = fab.spec().node_bytes_per_s();
    let count: u64 = 4 * 3 * 64 * 1024;
    let d = (count * 4) as f64;
    let fails = [Failure::known_down(2, 1)];
    for k in [1u32, 2, 4, 8, 16] {
        let p = R2cclParams { degraded: NodeId(2), tail_fraction: 0.25, pipeline_chunks: k };
        let r = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count)
            .with_strategy(AlgoStrategy::R2cclAllReduce(p));
        let (_, _, _, formula) = closed::r2ccl_allreduce(4, d, b, 0.25, k);
        let ports = run_with(&fab, &fails, &r, Sharing::Ports);
        close(ports.rank_finish[2], formula, 0.01, &format!("ports: degraded node, K={k}, vs max(T1, T2) + T3"));
        // Under max-min sharing the helper's NICs carry the broadcast-back to the degraded node and the chain
        // to the next healthy node at the same time, each at part speed: the degraded node finishes later.
        let mm = run(&fab, &fails, &r);
        let ratio = mm.rank_finish[2] / formula;
        assert!((1.0..1.15).contains(&ratio), "max-min: degraded node K={k} at {ratio:.4} x the formula");
    }
}

#[test]
fn four_stage_reaches_the_bound_when_the_straggler_only_joins_and_the_port_floor_otherwise() {
    // Section 7: one NIC per node, node 0 degraded to beta = 1 - X, K = 64. The busiest NIC carries exactly the
    // bytes of the lower bound. With beta = 1/2 the plan runs no full ring (f = 0: the straggler only scatters
    // in and gathers back) and the rate-matched schedule reaches the bound under max-min sharing, within the
    // pipeline fill. With beta > 1/2 (f > 0) the straggler's ring share goes to one neighbour: under the port
    // model (r2ccl_algo::simulate and Sharing::Ports) a part holds both NIC ports at the straggler's rate, so
    // that neighbour's receive port needs more than the bound (the port floor below) and no order of these
    // messages reaches the bound; max-min sharing gets between the two (see docs/reproduction.md).
    for (n, x) in [(4u32, 0.25), (4, 0.5), (8, 0.125), (8, 0.5)] {
        let mut s = FabricSpec::new(n, 1, 1, 800.0);
        s.nic_latency_us = 0.0;
        s.nvlink_latency_us = 0.0;
        let fab = Fabric::new(s).unwrap();
        let b = fab.spec().node_bytes_per_s();
        let d = BYTES as f64;
        let beta = 1.0 - x;
        let lb = closed::lower_bound(n as usize, d, b, beta);
        let deg =
            [Failure { node: 0, rail: 0, kind: FailureKind::Degraded { fraction: beta }, at_s: -1.0, until_s: None }];
        let r = req(AlgoStrategy::FourStage, 64);
        let mm = run(&fab, &deg, &r);
        close(mm.fluid, lb, 0.01, &format!("four-stage n={n} x={x}: busiest NIC vs lower bound"));
        let ports = run_with(&fab, &deg, &r, Sharing::Ports);
        // Port floor: the straggler's ring successor receives the ring share and its scatter-in at beta B.
        let (p, f) = (f64::from(n), r2ccl_algo::model::four_stage_fraction(n as usize, beta).unwrap());
        let successor =
            2.0 * (p - 1.0) / p * f / beta + 2.0 * (p - 2.0) / (p - 1.0) * (1.0 - f) + (1.0 - f) / ((p - 1.0) * beta);
        let straggler = (2.0 * (p - 1.0) / p * f + (1.0 - f)) / beta;
        let floor = successor.max(straggler) * d / b / lb;
        let (t_mm, t_ports, t_algo) = (mm.sim / lb, ports.sim / lb, mm.algo_sim / lb);
        println!(
            "four-stage n={n} x={x}: T/LB max-min {t_mm:.4} ports {t_ports:.4} algo {t_algo:.4}, port floor {floor:.4}"
        );
        close(ports.sim, ports.algo_sim, 0.08, &format!("four-stage n={n} x={x}: ports vs r2ccl_algo::simulate"));
        if f == 0.0 {
            assert!((floor - 1.0).abs() < 1e-9, "n={n} x={x}: port floor {floor}");
            assert!(t_mm < 1.03, "four-stage n={n} x={x}: max-min at {t_mm:.4} x the bound");
            assert!(t_ports < 1.13 && t_algo < 1.11, "n={n} x={x}: ports {t_ports:.4}, algo {t_algo:.4} x the bound");
        } else {
            assert!(floor > 1.1, "n={n} x={x}: port floor {floor}");
            assert!((1.05..1.2).contains(&t_mm), "four-stage n={n} x={x}: max-min at {t_mm:.4} x the bound");
            for (what, t) in [("ports", t_ports), ("r2ccl_algo::simulate", t_algo)] {
                assert!(
                    t >= floor * 0.999 && t < floor * 1.04,
                    "n={n} x={x} {what}: {t:.4} x the bound, floor {floor:.4}"
                );
            }
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
    let get = |s: Scheme| rep.rows.iter().find(|r| r.strategy == s).unwrap();
    for r in &rep.rows {
        assert!(r.seconds.is_finite() && r.seconds > 0.0, "{:?}", r);
        assert!(r.failure_induced_s.is_finite(), "in-flight failure is repaired: {:?}", r);
    }
    // Balance and single backup differ only in NIC weights: with one of two NICs lost both double. Their
    // busiest NICs carry the same bytes; node 3 uses one NIC under Balance (rail 1 is dropped everywhere) and
    // both under single backup, which moves the event-level time by about 2%.
    let (ab, sb) = (get(Scheme::AlgoBalance), get(Scheme::AlgoSingleBackup));
    close(ab.seconds, sb.seconds, 0.03, "balance vs single backup with K = 2");
    assert!(ab.overhead_pct > 50.0, "losing half a node's NICs at least halves its ring speed: {ab:?}");
}

#[test]
fn planner_request_runs_exactly_what_it_planned() {
    let fab = fabric(4, 1, 4);
    let mut h = healthy(&fab);
    h[1][0] = 0.0;
    let job = AllReduceJob { nodes: vec![3, 2, 1, 0], bytes: BYTES as f64, intra: false, chunks: 1 };
    let mut dag = Dag::new();
    let (p, c) = append_allreduce(
        &mut dag,
        &fab,
        &h,
        &job,
        Choice::Candidate(r2ccl_policy::CandidateKind::R2cclAllReduce),
        None,
    )
    .unwrap();
    assert_eq!(p.strategy, r2ccl_policy::CandidateKind::R2cclAllReduce);
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

#[test]
fn merged_rail_parts_keep_the_bytes_and_come_close_to_the_exact_run() {
    // 8 nodes x 4 GPUs x 4 NICs, the four-stage schedule (every message split over the NICs; the planner picks the
    // rail-parallel AllReduce here, whose messages have one part each) with one NIC known down and one failing in
    // flight: merging
    // the rail parts of messages between the other nodes leaves the byte accounting as it is, makes fewer flows,
    // keeps every part of the failed nodes' messages, and stays close to the exact run.
    let mut s = FabricSpec::new(8, 4, 4, 100.0);
    s.nvlink_gbps = 1600.0;
    let fab = Fabric::new(s).unwrap();
    let fails = [Failure::known_down(2, 1), Failure::down_at(5, 3, 2e-4)];
    let h = r2ccl_sim::workload::plan_health(&fab, &fails);
    let job = AllReduceJob { nodes: (0..8).collect(), bytes: BYTES as f64, intra: true, chunks: 1 };
    let merge = MergeRails::around(&fab, &fails);
    assert_eq!(merge.exact_nodes, [false, false, true, false, false, true, false, false]);
    let cfg = EngineConfig::with_repair(RepairMode::Spread);
    let mut runs = Vec::new();
    for m in [None, Some(&merge)] {
        let mut dag = Dag::new();
        let four_stage = Choice::Candidate(r2ccl_policy::CandidateKind::FourStage);
        let (_, c) = append_allreduce_with(&mut dag, &fab, &h, &job, four_stage, None, m).unwrap();
        let r = simulate(&fab, &dag, &fails, &cfg).unwrap();
        assert!(!r.stalled);
        // Pinned transfers that touch a node with a failure, and pinned transfers in all.
        let pinned = |touching: bool| {
            dag.ops()
                .filter(|op| match op {
                    Op::Pinned { src, dst, .. } => {
                        !touching || merge.exact_nodes[src.node as usize] || merge.exact_nodes[dst.node as usize]
                    }
                    _ => false,
                })
                .count()
        };
        runs.push((c, r, pinned(true), pinned(false)));
    }
    let [(ce, re, te, ae), (cm, rm, tm, am)] = runs.as_slice() else { unreachable!() };
    assert_eq!(cm.nic_tx, ce.nic_tx);
    assert_eq!(cm.nic_rx, ce.nic_rx);
    assert_eq!(cm.intra_bytes, ce.intra_bytes);
    assert_eq!(tm, te, "messages of the failed nodes keep every part");
    // The others are one per message instead of one per NIC (4).
    assert_eq!((ae - te), 4 * (am - tm), "{am} pinned transfers merged against {ae} exact");
    assert!(rm.flows < re.flows);
    let err = rm.makespan / re.makespan - 1.0;
    println!("merged rail parts: {} flows against {}, makespan {err:+.3e} relative", rm.flows, re.flows);
    assert!(err.abs() < 0.02, "merged {} against exact {}", rm.makespan, re.makespan);
}
