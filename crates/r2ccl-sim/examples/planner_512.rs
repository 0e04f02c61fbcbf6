//! The planner's candidates on the 512-GPU table's AllReduce (docs/reproduction.md, 512-GPU notes): 64 x 8 NICs of
//! 400 Gb/s, 6.5e9 bytes, one rank per node, `F` NICs failed as `reproduce` places them (node `(7i + 5) % 64`, rail
//! `(3i + 2) % 8`). For each failure count it prints the prediction of Balance, R2CCL-AllReduce (one failure only),
//! recursive and the two four-stage schedules (rings, direct levels) beside their r2ccl-algo schedule's simulated
//! time; at 0 failures, the ring's. Four-stage takes about 20 s to simulate at ten failures. Run with
//! `cargo run --release -p r2ccl-sim --example planner_512 [F...]` (default: 1 9 10).
#![allow(clippy::print_stdout, reason = "an example that prints its measurements")]

use r2ccl_policy::CandidateKind as P;
use r2ccl_sim::collective::AllReduceJob;
use r2ccl_sim::convert::{append_allreduce, Choice};
use r2ccl_sim::workload::plan_health;
use r2ccl_sim::{simulate, Dag, EngineConfig, Fabric, FabricSpec, Failure, FailureKind, RepairMode, SimError};

fn main() -> Result<(), SimError> {
    let fab = Fabric::new(FabricSpec::new(64, 8, 8, 400.0))?;
    let job = AllReduceJob { nodes: (0..64).collect(), bytes: 6.5e9, intra: false, chunks: 8 };
    let mut counts: Vec<u32> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    if counts.is_empty() {
        counts = vec![1, 9, 10];
    }
    for f in counts {
        let fails: Vec<Failure> = (0..f)
            .map(|i| Failure {
                node: (i * 7 + 5) % 64,
                rail: (i * 3 + 2) % 8,
                kind: FailureKind::Down,
                at_s: 0.0,
                until_s: None,
            })
            .collect();
        let health = plan_health(&fab, &fails);
        let all = [P::Balance, P::R2cclAllReduce, P::Recursive, P::FourStage, P::FourStageDirect];
        let strategies: &[P] = if f == 0 { &[P::Ring] } else { &all };
        for &s in strategies {
            if p_skip(s, f) {
                continue;
            }
            let mut dag = Dag::new();
            let (p, _) = append_allreduce(&mut dag, &fab, &health, &job, Choice::Candidate(s), None)?;
            let r = simulate(&fab, &dag, &fails, &EngineConfig::with_repair(RepairMode::Spread))?;
            let predicted = p.plan.candidate(s).map_or(f64::NAN, |c| c.time_s);
            println!(
                "{f} failures, {s:?}{}: predicted {:.3} ms, simulated {:.3} ms",
                if p.plan.chosen == s { " (chosen)" } else { "" },
                predicted * 1e3,
                r.makespan * 1e3
            );
        }
    }
    Ok(())
}

/// R2CCL-AllReduce plans one degraded node only.
fn p_skip(s: P, failures: u32) -> bool {
    s == P::R2cclAllReduce && failures != 1
}
