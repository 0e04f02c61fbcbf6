//! `r2ccl-policy` on its own: plan an AllReduce of 64 MiB per rank on 4 nodes x 2 NICs of
//! 100 Gb/s, once with every NIC healthy and once with NIC 1 of node 2 failed. Prints every
//! candidate strategy with its predicted time, the fault-free time, the lower bound and the
//! chosen strategy, and checks what the planner promises: the choice is the fastest
//! candidate, never below the lower bound, no candidate puts a byte on the failed NIC, and
//! the failure costs time.
//!
//! Run with `cargo run -p r2ccl-policy --example plan_failure`.
#![allow(clippy::print_stdout, reason = "an example prints what it shows")]

use r2ccl_core::{HealthView, NicId, ReduceOp};
use r2ccl_policy::{plan, CandidateKind, Collective, Plan, Topology};
use std::error::Error;

const NODES: usize = 4;
const NICS: usize = 2;
/// 100 Gb/s per NIC, in Mbit/s.
const NIC_MBPS: u64 = 100_000;
const BYTES: u64 = 64 << 20;

fn ms(s: f64) -> String {
    format!("{:>9.3} ms", s * 1e3)
}

fn show(title: &str, p: &Plan) {
    println!("== {title}");
    let order: Vec<String> = p.ring_order.iter().map(|n| n.0.to_string()).collect();
    println!("ring order {} (bottleneck {} Gb/s)", order.join(" "), p.ring_score.bottleneck_mbps / 1000);
    println!("  {:<20} {:>12} {:>8}", "strategy", "predicted", "x t_nf");
    for s in CandidateKind::ALL {
        match p.candidate(s) {
            Some(c) => {
                let mark = if s == p.chosen { "  <- chosen" } else { "" };
                println!("  {:<20} {} {:>8.3}{mark}", s.name(), ms(c.time_s), c.time_s / p.t_nf_s);
            }
            None => println!("  {:<20} {:>12}", s.name(), "n/a"),
        }
    }
    println!("  {:<20} {}", "fault-free t_nf", ms(p.t_nf_s));
    println!("  {:<20} {} {:>8.3}", "lower bound", ms(p.lower_bound_s), p.lower_bound_s / p.t_nf_s);
}

fn check(ok: bool, what: &str) -> Result<(), Box<dyn Error>> {
    if ok {
        println!("  ok: {what}");
        Ok(())
    } else {
        Err(format!("check failed: {what}").into())
    }
}

/// What every plan must satisfy.
fn check_plan(p: &Plan) -> Result<(), Box<dyn Error>> {
    let fastest = p.candidates.iter().map(|c| c.time_s).fold(f64::INFINITY, f64::min);
    check(p.time_s == fastest && p.chosen_candidate().is_some(), "the chosen strategy is the fastest candidate")?;
    check(p.time_s >= p.lower_bound_s * (1.0 - 1e-9), "its predicted time is not below the lower bound")?;
    check(p.schedule_request().is_ok(), "it turns into an r2ccl-algo schedule request")?;
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let topo = Topology::uniform(NODES, NICS, NIC_MBPS)?;
    let allreduce = Collective::AllReduce { op: ReduceOp::Sum };
    println!(
        "AllReduce of {} MiB per rank, {NODES} nodes x {NICS} NICs x {} Gb/s, one rank per node",
        BYTES >> 20,
        NIC_MBPS / 1000
    );

    let healthy_view = HealthView::uniform(NODES, NICS, NIC_MBPS);
    let healthy = plan(&topo, &healthy_view, allreduce, BYTES)?;
    show("healthy", &healthy);
    check_plan(&healthy)?;
    check(healthy.time_s <= healthy.t_nf_s * (1.0 + 1e-9), "healthy: no slower than the fault-free time")?;

    let failed_nic = NicId::new(2, 1);
    let mut view = HealthView::uniform(NODES, NICS, NIC_MBPS);
    view.set_failed(failed_nic)?;
    let degraded = plan(&topo, &view, allreduce, BYTES)?;
    println!();
    show(&format!("{failed_nic} failed"), &degraded);
    check_plan(&degraded)?;
    check(degraded.candidate(CandidateKind::Ring).is_none(), "the plain ring is not offered with a failed NIC")?;
    let (node, rail) = (failed_nic.node.index(), failed_nic.rail.index());
    check(
        degraded.candidates.iter().all(|c| c.nic_bytes.tx(node, rail) == 0 && c.nic_bytes.rx(node, rail) == 0),
        "no candidate sends or receives a byte on the failed NIC",
    )?;
    check(degraded.time_s > healthy.time_s, "the failure makes the collective slower")?;
    check(degraded.lower_bound_s > healthy.lower_bound_s, "and raises the lower bound")?;
    let balance = degraded.candidate(CandidateKind::Balance).map_or(f64::INFINITY, |c| c.time_s);
    check(degraded.time_s <= balance, "the choice is at least as fast as Balance alone")?;
    check(plan(&topo, &view, allreduce, BYTES)? == degraded, "planning again gives the identical plan")?;
    println!(
        "chosen under the failure: {} at {:.3} x t_nf (lower bound {:.3} x t_nf)",
        degraded.chosen.name(),
        degraded.time_s / degraded.t_nf_s,
        degraded.lower_bound_s / degraded.t_nf_s
    );
    Ok(())
}
