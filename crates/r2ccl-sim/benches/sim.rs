//! Benchmarks: one 1024-GPU AllReduce with failures, and the whole `reproduce`.
#![allow(clippy::print_stdout, clippy::unwrap_used, reason = "benchmark output")]
#![allow(clippy::disallowed_methods, reason = "benchmarks measure wall-clock time")]

use r2ccl_sim::collective::{build_allreduce, AllReduceJob, Scheme};
use r2ccl_sim::convert::{append_allreduce_with, Choice, MergeRails};
use r2ccl_sim::engine::{simulate, Dag};
use r2ccl_sim::workload::plan_health;
use r2ccl_sim::{reproduce, EngineConfig, Fabric, FabricSpec, Failure, RepairMode};
use std::time::Instant;

fn main() {
    let fab = Fabric::new(FabricSpec::new(128, 8, 8, 400.0)).unwrap();
    let job = AllReduceJob { nodes: (0..128).collect(), bytes: 256.0 * 1048576.0, intra: true, chunks: 1 };
    let fails = [Failure::known_down(3, 2), Failure::down_at(70, 5, 0.002)];
    let e = EngineConfig::with_repair(RepairMode::Spread);
    let mut exact_planner = f64::NAN;
    for s in [Scheme::Balance, Scheme::HotRepair, Scheme::Recursive, Scheme::Planner, Scheme::AlgoBalance] {
        // What `workload::allreduce_run` does, timed in two parts: the schedule (planning, r2ccl-algo's
        // build and the conversion, or the formula builder) and the simulation.
        let t = Instant::now();
        let h = plan_health(&fab, &fails);
        let mut dag = Dag::new();
        match s.schedule_choice() {
            Some(choice) => {
                let (p, _) = r2ccl_sim::convert::append_allreduce(&mut dag, &fab, &h, &job, choice, None).unwrap();
                let predicted = p.plan.candidate(p.strategy).map_or(f64::NAN, |c| c.time_s);
                println!(
                    "  {} runs r2ccl-algo {:?} with {} chunks; planner predicted {:.4} s (balance {:.4} s)",
                    s.name(),
                    p.strategy,
                    p.request.chunks,
                    predicted,
                    p.plan.candidate(r2ccl_policy::CandidateKind::Balance).map_or(f64::NAN, |c| c.time_s)
                );
            }
            None => {
                build_allreduce(&mut dag, &fab, &h, s, &job, None);
            }
        }
        let built = t.elapsed().as_secs_f64();
        let r = simulate(&fab, &dag, &fails, &EngineConfig { repair: s.repair_mode(), ..e }).unwrap();
        let wall = t.elapsed().as_secs_f64();
        if s == Scheme::Planner {
            exact_planner = r.makespan;
        }
        println!(
            "1024-GPU AllReduce 256 MiB, 2 failures, {:<10}: simulated {:.4} s, {} flows, {} events, wall {:.3} s \
             (schedule {:.3} s, simulation {:.3} s; target < 1 s)",
            s.name(),
            r.makespan,
            r.flows,
            r.events,
            wall,
            built,
            wall - built
        );
    }
    // The planner's choice with merged rail parts (an approximation), against the exact run above.
    let t = Instant::now();
    let mut dag = Dag::new();
    let merge = MergeRails::around(&fab, &fails);
    let h = plan_health(&fab, &fails);
    append_allreduce_with(&mut dag, &fab, &h, &job, Choice::Planner, None, Some(&merge)).unwrap();
    let built = t.elapsed().as_secs_f64();
    let r = simulate(&fab, &dag, &fails, &e).unwrap();
    let wall = t.elapsed().as_secs_f64();
    println!(
        "1024-GPU AllReduce 256 MiB, 2 failures, planner merged rail parts: simulated {:.4} s ({:+.1e} against exact), \
         {} flows, {} events, wall {wall:.3} s (schedule {built:.3} s, simulation {:.3} s; target < 1 s)",
        r.makespan,
        r.makespan / exact_planner - 1.0,
        r.flows,
        r.events,
        wall - built
    );
    let t = Instant::now();
    let tables = reproduce::all_tables().unwrap();
    println!("reproduce: {} tables in {:.2} s (target < 120 s)", tables.len(), t.elapsed().as_secs_f64());
}
