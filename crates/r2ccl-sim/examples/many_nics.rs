//! One NIC lost on servers with 2, 4 or 8 NICs (issue 34): the planner's predictions at the bandwidth limit
//! (no latency) next to the section-7 lower bound, and the simulated time of the exact four-stage schedule
//! and of the planner's choice under max-min sharing. Run with
//! `cargo run --release -p r2ccl-sim --example many_nics [--chunks K] [--bytes B] [NODESxNICS ...]`.
#![allow(clippy::print_stdout, reason = "an example that prints its measurements")]

use r2ccl_policy::CandidateKind as P;
use r2ccl_sim::collective::AllReduceJob;
use r2ccl_sim::convert::{append_schedules, plan_allreduce, Choice};
use r2ccl_sim::workload::plan_health;
use r2ccl_sim::SimError;
use r2ccl_sim::{simulate, Dag, EngineConfig, Fabric, FabricSpec, Failure, FailureKind, Op, RepairMode};

/// Simulated makespan of `choice`'s exact schedule, with its chunk count replaced by `chunks` when given.
fn simulated(
    fab: &Fabric,
    job: &AllReduceJob,
    fails: &[Failure],
    choice: Choice,
    chunks: Option<u32>,
) -> Result<(f64, u32), SimError> {
    let mut p = plan_allreduce(fab, &plan_health(fab, fails), job, choice)?;
    if let Some(k) = chunks {
        p.request.chunks = k;
    }
    let af = r2ccl_policy::schedule_fabric(&p.topology, &p.view).map_err(|e| SimError::Convert(e.to_string()))?;
    let layout = af.layout().clone();
    let mut dag = Dag::new();
    let req = &p.request;
    append_schedules(&mut dag, fab, &layout, &job.nodes, |r| r2ccl_algo::build_rank_schedule(&af, req, r), None)?;
    let t = simulate(fab, &dag, fails, &EngineConfig::with_repair(RepairMode::Spread))?.makespan;
    if std::env::var_os("MANY_NICS_LINKS").is_some() {
        print_nic_bytes(fab, &dag, t);
    }
    Ok((t, req.chunks))
}

/// Every NIC link's bytes over its capacity, as a fraction of the makespan `t` (1: busy all the time).
fn print_nic_bytes(fab: &Fabric, dag: &Dag, t: f64) {
    let caps = fab.capacities();
    let mut bytes = vec![0.0; caps.len()];
    let mut path = Vec::new();
    for op in dag.ops() {
        let (src, dst, b, sr, dr) = match op {
            Op::Pinned { src, dst, bytes, src_rail, dst_rail, .. } => (src, dst, bytes, src_rail, dst_rail),
            Op::Transfer { src, dst, bytes, .. } => (src, dst, bytes, 0, 0),
            Op::Delay(_) => continue,
        };
        fab.path(src, dst, sr, dr, &mut path);
        for &l in &path {
            bytes[l as usize] += b;
        }
    }
    let s = fab.spec();
    for n in 0..s.nodes {
        let row = |f: &dyn Fn(u32) -> usize| -> String {
            (0..s.nics_per_node).map(|k| format!("{:.2}", bytes[f(k)] / caps[f(k)] / t)).collect::<Vec<_>>().join(" ")
        };
        println!(
            "    node {n}: up [{}] down [{}]",
            row(&|k| fab.nic_up(n, k) as usize),
            row(&|k| fab.nic_down(n, k) as usize)
        );
    }
}

fn main() -> Result<(), SimError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut chunks = Some(64u32);
    let mut bytes = 256.0 * 1048576.0;
    let mut cases: Vec<(u32, u32)> = Vec::new();
    // `--fail N:R[:F],...`: NIC R of node N failed (or at fraction F of its rate) instead of the two default sets.
    let mut custom: Option<Vec<(u32, u32, f64)>> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--chunks" => chunks = it.next().and_then(|v| v.parse().ok()).filter(|&k| k > 0),
            "--bytes" => bytes = it.next().and_then(|v| v.parse().ok()).unwrap_or(bytes),
            "--fail" => {
                let v = it.next().map(String::as_str).unwrap_or("");
                let parse = |x: &str| -> Option<(u32, u32, f64)> {
                    let f: Vec<&str> = x.split(':').collect();
                    Some((
                        f.first()?.parse().ok()?,
                        f.get(1)?.parse().ok()?,
                        f.get(2).map_or(Some(0.0), |y| y.parse().ok())?,
                    ))
                };
                custom = Some(v.split(',').filter_map(parse).collect());
            }
            c => {
                let (n, k) = c.split_once('x').ok_or_else(|| SimError::Convert(format!("case {c:?} is not NxK")))?;
                let parse = |s: &str| s.parse::<u32>().map_err(|e| SimError::Convert(format!("case {c:?}: {e}")));
                cases.push((parse(n)?, parse(k)?));
            }
        }
    }
    if cases.is_empty() {
        cases = vec![(4, 2), (8, 2), (4, 4), (4, 8), (8, 8)];
    }
    println!(
        "| nodes x NICs | failed | bound / t_nf | four_stage pred | r2ccl_allreduce pred | balance pred | chosen | \
         chosen pred / bound | four_stage sim / bound (K) | chosen sim / bound |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (nodes, nics) in cases {
        let mut spec = FabricSpec::new(nodes, 1, nics, 400.0);
        spec.nvlink_gbps = 1e6;
        spec.nic_latency_us = 0.0;
        spec.nvlink_latency_us = 0.0;
        let fab = Fabric::new(spec)?;
        let job = AllReduceJob { nodes: (0..nodes).collect(), bytes, intra: false, chunks: 1 };
        let node_bw = |failed: &[(u32, u32, f64)]| -> Vec<f64> {
            (0..nodes)
                .map(|n| f64::from(nics) - failed.iter().filter(|f| f.0 == n).map(|f| 1.0 - f.2).sum::<f64>())
                .collect()
        };
        let t_nf = r2ccl_algo::model::lower_bound(&node_bw(&[]), 1.0).map_err(|e| SimError::Convert(e.to_string()))?;
        let fail_sets: Vec<Vec<(u32, u32, f64)>> =
            custom.clone().map_or_else(|| vec![vec![(1, 0, 0.0)], vec![(1, 0, 0.0), (2, 1, 0.0)]], |c| vec![c]);
        for failed in fail_sets.iter().filter(|f| f.iter().all(|&(n, r, _)| n < nodes && r < nics)) {
            let fails: Vec<Failure> = failed
                .iter()
                .map(|&(n, r, f)| {
                    if f > 0.0 {
                        Failure { kind: FailureKind::Degraded { fraction: f }, ..Failure::known_down(n, r) }
                    } else {
                        Failure::known_down(n, r)
                    }
                })
                .collect();
            let lb_rel = r2ccl_algo::model::lower_bound(&node_bw(failed), 1.0)
                .map_err(|e| SimError::Convert(e.to_string()))?
                / t_nf;
            let p = plan_allreduce(&fab, &plan_health(&fab, &fails), &job, Choice::Planner)?;
            let healthy = plan_allreduce(&fab, &plan_health(&fab, &[]), &job, Choice::Planner)?;
            let t0 = healthy.plan.candidates.iter().map(|c| c.time_s).fold(f64::INFINITY, f64::min);
            let pred = |s: P| p.plan.candidate(s).map_or(f64::NAN, |c| c.time_s / t0);
            let lb = lb_rel * t0;
            let chosen = p.strategy;
            let (fs, k) = simulated(&fab, &job, &fails, Choice::Candidate(P::FourStage), chunks)?;
            let (cs, _) = simulated(&fab, &job, &fails, Choice::Planner, chunks)?;
            println!(
                "| {nodes} x {nics} | {failed:?} | {lb_rel:.3} | {:.3} | {:.3} | {:.3} | {chosen:?} | {:.3} | {:.3} ({k}) \
                 | {:.3} |",
                pred(P::FourStage),
                pred(P::R2cclAllReduce),
                pred(P::Balance),
                pred(chosen) / lb_rel,
                fs / lb,
                cs / lb,
            );
        }
    }
    Ok(())
}
