//! Isolates where the recursive AllReduce formula schedule loses time at one failure (docs/reproduction.md,
//! "Recursive AllReduce at one failure"): table 1's fabric (n nodes x 8 NICs of 100 Gb/s, one rank per
//! node, 1 GiB), each level alone, the levels one after the other, without the fold-in wait and with several
//! member rings in flight. Run with `cargo run --release -p r2ccl-sim --example recursive_isolate`.
#![allow(clippy::print_stdout, reason = "an example that prints its measurements")]

use r2ccl_sim::closed;
use r2ccl_sim::collective::{build_recursive, recursive_levels, AllReduceJob, RecursiveVariant};
use r2ccl_sim::workload::plan_health;
use r2ccl_sim::{simulate, Dag, EngineConfig, Fabric, FabricSpec, Failure, RepairMode, SimError};

const D: f64 = 1024.0 * 1024.0 * 1024.0;

/// T / T_nf of the recursive schedule built with `v` (K = `k` chunks) on `n` nodes with `lost` of node 1's
/// 8 NICs failed.
fn ratio(n: u32, lost: u32, k: u32, v: RecursiveVariant) -> Result<f64, SimError> {
    let mut spec = FabricSpec::new(n, 1, 8, 100.0);
    spec.nic_latency_us = 0.01;
    let fab = Fabric::new(spec)?;
    let fails: Vec<Failure> = (0..lost).map(|r| Failure::known_down(1, r)).collect();
    let h = plan_health(&fab, &fails);
    let job = AllReduceJob { nodes: (0..n).collect(), bytes: D, intra: false, chunks: k };
    let mut dag = Dag::new();
    build_recursive(&mut dag, &fab, &h, &job, None, v);
    let r = simulate(&fab, &dag, &fails, &EngineConfig::with_repair(RepairMode::Spread))?;
    Ok(r.makespan / closed::t_nf(n as usize, D, fab.spec().node_bytes_per_s()))
}

fn main() -> Result<(), SimError> {
    let base = RecursiveVariant::default();
    for (n, lost) in [(4u32, 2u32), (8, 1)] {
        let x = f64::from(lost) / 8.0;
        let mut frac = vec![1.0; n as usize];
        frac[1] = 1.0 - x;
        let levels = recursive_levels(&(0..n).collect::<Vec<_>>(), &frac);
        let f1 = levels.get(1).map_or(0.0, |l| l.1);
        let m = (n - 1) as f64;
        let nf = 2.0 * (f64::from(n) - 1.0) / f64::from(n);
        // Level 1 alone in the bandwidth model: a member's ring share 2(m-1)/m plus 1/m of the fold-in.
        let level1 = f1 * (2.0 * (m - 1.0) / m + 1.0 / m) / nf;
        // Rail floor: the straggler's ring predecessor sends its level-0 share to the straggler on the 8 - lost
        // rails the straggler has left, on top of its level-1 ring share and its broadcast-back (per rail).
        let f0 = levels.first().map_or(1.0, |l| l.1);
        let live = f64::from(8 - lost);
        let per_rail = nf * f0 / live + 2.0 * (m - 1.0) / m * f1 / 8.0 + f1 / (m * live);
        let floor = per_rail * 8.0 / nf;
        println!(
            "n = {n}, X = {x}: level fractions {:?}, bound {:.3}, level 1 alone in the bandwidth model {level1:.3}, \
             rail floor of these levels {floor:.3}",
            levels.iter().map(|l| l.1).collect::<Vec<_>>(),
            closed::lower_bound(n as usize, D, 1.0, 1.0 - x) / closed::t_nf(n as usize, D, 1.0),
        );
        for k in [16u32, 64, 256] {
            let w = (n - 1) as usize;
            let rows = [
                ("as built", base),
                ("level 0 alone", RecursiveVariant { only_level: Some(0), ..base }),
                ("level 1 alone", RecursiveVariant { only_level: Some(1), ..base }),
                ("levels one after the other", RecursiveVariant { sequential: true, ..base }),
                ("no fold-in wait", RecursiveVariant { fold_in_wait: false, ..base }),
                (
                    "level 1 alone, no fold-in wait",
                    RecursiveVariant { only_level: Some(1), fold_in_wait: false, ..base },
                ),
                ("window m", RecursiveVariant { ring_window: w, ..base }),
                ("level 1 alone, window m", RecursiveVariant { only_level: Some(1), ring_window: w, ..base }),
            ];
            for (what, v) in rows {
                println!("  K = {k:3}  {what:32} {:.3}", ratio(n, lost, k, v)?);
            }
        }
    }
    Ok(())
}
