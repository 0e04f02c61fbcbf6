//! Where the planner's R2CCL-AllReduce loses time on the 512-GPU fabric (docs/reproduction.md, "R2CCL-AllReduce
//! at 64 nodes"): 64 x 8 NICs of 400 Gb/s, NIC 2 of node 5 failed, one rank per node with 6.5 GB (one gradient
//! bucket of the 13B TP=8 x DP=64 job). Prints the closed form, the degraded node's and the healthy nodes'
//! finish times, with and without latency, under max-min and port sharing, for several K. Run with
//! `cargo run --release -p r2ccl-sim --example r2ccl_64 [NODES]`.
#![allow(clippy::print_stdout, reason = "an example that prints its measurements")]

use r2ccl_algo::{Collective, R2cclParams, ScheduleRequest, Strategy as AlgoStrategy};
use r2ccl_core::{DType, NodeId, ReduceOp};
use r2ccl_sim::collective::{AllReduceJob, Scheme};
use r2ccl_sim::convert::{append_schedules, health_view, topology};
use r2ccl_sim::workload::{allreduce_run, plan_health};
use r2ccl_sim::{closed, simulate, Dag, EngineConfig, Fabric, FabricSpec, Failure, RepairMode, Sharing, SimError};

const BYTES: f64 = 6.5e9;

/// Makespan, finish of rank `deg` and the median rank finish of `req` on `fab` (one rank per node).
fn exact(
    fab: &Fabric,
    fails: &[Failure],
    req: &ScheduleRequest,
    sharing: Sharing,
    deg: usize,
) -> Result<(f64, f64, f64), SimError> {
    let s = fab.spec();
    let h = plan_health(fab, fails);
    let nodes: Vec<u32> = (0..s.nodes).collect();
    let topo = topology(fab, nodes.len(), 1)?;
    let view = health_view(fab, &nodes, &h);
    let af = r2ccl_policy::schedule_fabric(&topo, &view).map_err(|e| SimError::Convert(e.to_string()))?;
    let layout = af.layout().clone();
    let mut dag = Dag::new();
    let c = append_schedules(&mut dag, fab, &layout, &nodes, |r| r2ccl_algo::build_rank_schedule(&af, req, r), None)?;
    let cfg = EngineConfig { sharing, ..EngineConfig::with_repair(RepairMode::Spread) };
    let r = simulate(fab, &dag, fails, &cfg)?;
    let mut fin: Vec<f64> = c.rank_end.iter().map(|&t| r.finish.get(t as usize).copied().unwrap_or(f64::NAN)).collect();
    let d = fin.get(deg).copied().unwrap_or(f64::NAN);
    fin.sort_by(f64::total_cmp);
    Ok((r.makespan, d, fin[fin.len() / 2]))
}

fn main() -> Result<(), SimError> {
    let n: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let deg = 5.min(n - 1);
    let fails = [Failure::known_down(deg, 2)];
    for lat in [2.0, 0.0] {
        let mut spec = FabricSpec::new(n, 8, 8, 400.0);
        spec.nic_latency_us = lat;
        spec.nvlink_latency_us = lat / 2.0;
        let fab = Fabric::new(spec)?;
        let b = fab.spec().node_bytes_per_s();
        let nf = closed::t_nf(n as usize, BYTES, b);
        let job = AllReduceJob { nodes: (0..n).collect(), bytes: BYTES, intra: false, chunks: 8 };
        let e = EngineConfig::with_repair(RepairMode::Spread);
        let ms = |x: f64| x * 1e3;
        let healthy_t = allreduce_run(&fab, Scheme::Planner, &job, &[], &e)?.makespan;
        let bal = allreduce_run(&fab, Scheme::AlgoBalance, &job, &fails, &e)?.makespan;
        let planned = r2ccl_sim::convert::plan_allreduce(
            &fab,
            &plan_health(&fab, &fails),
            &job,
            r2ccl_sim::convert::Choice::Planner,
        )?;
        println!(
            "n = {n}, NIC latency {lat} us: T_nf closed {:.2} ms, healthy ring simulated {:.2} ms, algo Balance {:.2} ms \
             ({:.3}x); planner chose {:?}, predicted {:.2} ms ({:.3}x its t_nf)",
            ms(nf),
            ms(healthy_t),
            ms(bal),
            bal / healthy_t,
            planned.strategy,
            ms(planned.plan.time_s),
            planned.plan.time_s / planned.plan.t_nf_s,
        );
        for c in &planned.plan.candidates {
            println!(
                "  candidate {:?}: predicted {:.2} ms ({:.3}x), chunks {:?}, tail {:?}, levels {:?}",
                c.strategy,
                ms(c.time_s),
                c.time_s / planned.plan.t_nf_s,
                c.params.chunks,
                c.params.tail_fraction,
                c.params.level_fractions,
            );
        }
        for s in [Scheme::Planner, Scheme::AlgoRecursive, Scheme::AlgoR2cclAllReduce, Scheme::Balance] {
            let t = allreduce_run(&fab, s, &job, &fails, &e)?.makespan;
            println!("  {:>22}: simulated {:.2} ms ({:.3}x healthy)", s.name(), ms(t), t / healthy_t);
        }
        let count = (BYTES / 4.0) as u64;
        for k in [1u32, 4, 16, 32, 64] {
            let x = 1.0 / 8.0;
            let (_, _, _, t) = closed::r2ccl_allreduce(n as usize, BYTES, b, x, k);
            // The helper's result reaches the other n - 2 healthy nodes by a store-and-forward chain of pieces
            // of Y D / K: (n - 2) hops after the last piece's fold-in.
            let chain = f64::from(n - 2) * x * BYTES / (f64::from(k) * b);
            let p = R2cclParams { degraded: NodeId(deg), tail_fraction: x, pipeline_chunks: k };
            let req = |st| {
                ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count)
                    .with_strategy(st)
                    .with_chunks(1)
            };
            let r2 = req(AlgoStrategy::R2cclAllReduce(p));
            let (mk, d, med) = exact(&fab, &fails, &r2, Sharing::MaxMin, deg as usize)?;
            let (pmk, pd, _) = exact(&fab, &fails, &r2, Sharing::Ports, deg as usize)?;
            let (rmk, rd, _) = exact(
                &fab,
                &fails,
                &req(AlgoStrategy::Recursive { pipeline_chunks: k }),
                Sharing::MaxMin,
                deg as usize,
            )?;
            println!(
                "  K = {k:2}: closed form {:.2} ms, + chain {:.2} = {:.2}; R2CCL-AllReduce max-min: degraded node {:.2}, \
                 median node {:.2}, makespan {:.2} ({:.3}x healthy); ports: degraded node {:.2}, makespan {:.2}; \
                 recursive max-min: degraded node {:.2}, makespan {:.2} ({:.3}x)",
                ms(t),
                ms(chain),
                ms(t + chain),
                ms(d),
                ms(med),
                ms(mk),
                mk / healthy_t,
                ms(pd),
                ms(pmk),
                ms(rd),
                ms(rmk),
                rmk / healthy_t,
            );
        }
    }
    Ok(())
}
