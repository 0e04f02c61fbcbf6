//! Where the wall time of the bench's 1024-GPU AllReduce goes (docs/reproduction.md, "Cost"): 128 x 8 GPUs and
//! NICs of 400 Gb/s, 256 MiB, NIC 2 of node 3 down from the start and NIC 5 of node 70 going down at 2 ms.
//! Without arguments it times the schedule (plan, build, conversion) and the simulation of each bench strategy;
//! `planner` does so for the planner's choice alone. `algo` times r2ccl-algo's build of the planner's schedule
//! alone (every rank, no conversion). `chunks K...` runs the planner's schedule with K pipeline chunks instead of
//! its own, with both failures and with the known one only, to measure what coalescing chunks would change.
//! `merged` times the planner's choice with merged rail parts (`convert::MergeRails`, an approximation) and then
//! exactly, and prints the approximation's error: makespan and every rank's finish time against the exact run
//! (`merged alone`: the merged run only). Run with `cargo run --release -p r2ccl-sim --example cost_1024 [planner |
//! merged [alone] | algo | chunks K...]`.
#![allow(clippy::print_stdout, reason = "an example that prints its measurements")]
#![allow(clippy::disallowed_methods, reason = "it measures wall-clock time")]

use r2ccl_core::Rank;
use r2ccl_sim::collective::{build_allreduce, AllReduceJob, Strategy};
use r2ccl_sim::convert::{
    append_allreduce, append_allreduce_with, append_schedules, plan_allreduce, Choice, MergeRails,
};
use r2ccl_sim::engine::{simulate, Dag};
use r2ccl_sim::workload::plan_health;
use r2ccl_sim::{EngineConfig, Fabric, FabricSpec, Failure, RepairMode, SimError};
use std::time::Instant;

fn main() -> Result<(), SimError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fab = Fabric::new(FabricSpec::new(128, 8, 8, 400.0))?;
    let job = AllReduceJob { nodes: (0..128).collect(), bytes: 256.0 * 1048576.0, intra: true, chunks: 1 };
    let fails = [Failure::known_down(3, 2), Failure::down_at(70, 5, 0.002)];
    match args.first().map(String::as_str) {
        Some("algo") => algo_build(&fab, &job, &fails),
        Some("chunks") => {
            let ks: Vec<u32> = args[1..].iter().filter_map(|a| a.parse().ok()).collect();
            chunks(&fab, &job, &fails, &ks)
        }
        Some("planner") => phases(&fab, &job, &fails, &[Strategy::Planner]),
        Some("merged") => merged(&fab, &job, &fails, args.get(1).is_some_and(|a| a == "alone")),
        _ => phases(
            &fab,
            &job,
            &fails,
            &[Strategy::Balance, Strategy::HotRepair, Strategy::Recursive, Strategy::Planner, Strategy::AlgoBalance],
        ),
    }
}

fn phases(fab: &Fabric, job: &AllReduceJob, fails: &[Failure], strategies: &[Strategy]) -> Result<(), SimError> {
    let h = plan_health(fab, fails);
    for &s in strategies {
        let t = Instant::now();
        let mut dag = Dag::new();
        match s.schedule_choice() {
            Some(choice) => {
                append_allreduce(&mut dag, fab, &h, job, choice, None)?;
            }
            None => {
                build_allreduce(&mut dag, fab, &h, s, job, None);
            }
        }
        let built = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let cfg = EngineConfig::with_repair(s.repair_mode());
        let r = simulate(fab, &dag, fails, &cfg)?;
        println!(
            "{:<12} schedule {built:.3} s, simulation {:.3} s: {} tasks, {} flows, {} events, makespan {:.17e} s",
            s.name(),
            t.elapsed().as_secs_f64(),
            dag.len(),
            r.flows,
            r.events,
            r.makespan
        );
    }
    Ok(())
}

fn merged(fab: &Fabric, job: &AllReduceJob, fails: &[Failure], alone: bool) -> Result<(), SimError> {
    let h = plan_health(fab, fails);
    let merge = MergeRails::around(fab, fails);
    let cfg = EngineConfig::with_repair(Strategy::Planner.repair_mode());
    let mut runs = Vec::new();
    let modes = [("merged", Some(&merge)), ("exact", None)];
    for (name, m) in modes.into_iter().take(if alone { 1 } else { 2 }) {
        let t = Instant::now();
        let mut dag = Dag::new();
        let (_, conv) = append_allreduce_with(&mut dag, fab, &h, job, Choice::Planner, None, m)?;
        let built = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let r = simulate(fab, &dag, fails, &cfg)?;
        let sim = t.elapsed().as_secs_f64();
        println!(
            "planner {name:<6} schedule {built:.3} s, simulation {sim:.3} s, total {:.3} s: {} tasks, {} flows, {} \
             events, makespan {:.17e} s",
            built + sim,
            dag.len(),
            r.flows,
            r.events,
            r.makespan
        );
        let ends: Vec<f64> =
            conv.rank_end.iter().map(|&t| r.finish.get(t as usize).copied().unwrap_or(f64::NAN)).collect();
        runs.push((r.makespan, ends));
    }
    if let [(m, me), (e, ee)] = runs.as_slice() {
        // Each rank's finish time against the exact one, relative to that and to the exact makespan.
        let (mut rel, mut of_makespan, mut worst) = (0.0f64, 0.0f64, 0usize);
        for (i, (a, b)) in me.iter().zip(ee).enumerate() {
            if (a / b - 1.0).abs() > rel {
                (rel, worst) = ((a / b - 1.0).abs(), i);
            }
            of_makespan = of_makespan.max((a - b).abs() / e);
        }
        println!(
            "merged rail parts against exact: makespan {:+.3e} relative ({:.6} ms against {:.6} ms); ranks' finish \
             times within {of_makespan:.3e} of the makespan, {rel:.3e} relative (rank {worst}: {:.6} ms against \
             {:.6} ms)",
            m / e - 1.0,
            m * 1e3,
            e * 1e3,
            me[worst] * 1e3,
            ee[worst] * 1e3
        );
    }
    Ok(())
}

fn algo_build(fab: &Fabric, job: &AllReduceJob, fails: &[Failure]) -> Result<(), SimError> {
    let p = plan_allreduce(fab, &plan_health(fab, fails), job, Choice::Planner)?;
    let af = r2ccl_policy::schedule_fabric(&p.topology, &p.view).map_err(|e| SimError::Convert(e.to_string()))?;
    let t = Instant::now();
    let (mut steps, mut parts) = (0usize, 0usize);
    for r in 0..af.layout().ranks() as u32 {
        let s =
            r2ccl_algo::build_rank_schedule(&af, &p.request, Rank(r)).map_err(|e| SimError::Convert(e.to_string()))?;
        steps += s.steps().len();
        for st in s.steps() {
            if let r2ccl_algo::StepKind::Send { split, .. } = st.kind {
                parts += s.split(split).map_or(1, |sp| sp.parts.len());
            }
        }
    }
    println!(
        "r2ccl-algo builds the planner's {:?} schedule (K = {}) for every rank in {:.3} s: {steps} steps, {parts} \
         transfer parts",
        p.strategy,
        p.request.chunks,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn chunks(fab: &Fabric, job: &AllReduceJob, fails: &[Failure], ks: &[u32]) -> Result<(), SimError> {
    let p = plan_allreduce(fab, &plan_health(fab, fails), job, Choice::Planner)?;
    let af = r2ccl_policy::schedule_fabric(&p.topology, &p.view).map_err(|e| SimError::Convert(e.to_string()))?;
    let layout = af.layout().clone();
    println!("the planner runs {:?} with K = {}", p.strategy, p.request.chunks);
    for &k in ks {
        for fl in [fails, &fails[..1]] {
            let mut req = p.request.clone();
            req.chunks = k.max(1);
            let t = Instant::now();
            let mut dag = Dag::new();
            let build = |r| r2ccl_algo::build_rank_schedule(&af, &req, r);
            let c = append_schedules(&mut dag, fab, &layout, &job.nodes, build, None)?;
            let built = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let r = simulate(fab, &dag, fl, &EngineConfig::with_repair(RepairMode::Spread))?;
            println!(
                "K = {k:>3}, {} failure(s): schedule {built:.3} s, simulation {:.3} s, {} transfers, makespan {:.6} ms",
                fl.len(),
                t.elapsed().as_secs_f64(),
                c.transfers,
                r.makespan * 1e3
            );
        }
    }
    Ok(())
}
