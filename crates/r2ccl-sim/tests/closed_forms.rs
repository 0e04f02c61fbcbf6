//! Single collectives against the closed forms of MECHANISMS.md sections 5 and 7 (within 1%).
#![allow(clippy::unwrap_used, reason = "tests")]

use r2ccl_sim::closed;
use r2ccl_sim::collective::{build_allreduce, healthy, AllReduceJob, PlanHealth, Scheme};
use r2ccl_sim::{simulate, Dag, EngineConfig, Fabric, FabricSpec, Failure, FailureKind};

const D: f64 = 1024.0 * 1024.0 * 1024.0;

fn fabric(n: u32, k: u32) -> Fabric {
    // One rank per node, K NICs of 100 Gb/s, tiny latency: the bandwidth limit.
    let mut s = FabricSpec::new(n, 1, k, 100.0);
    s.nic_latency_us = 0.01;
    Fabric::new(s).unwrap()
}

fn run(f: &Fabric, strategy: Scheme, failures: &[Failure], chunks: u32) -> f64 {
    let mut h: PlanHealth = healthy(f);
    for x in failures {
        h[x.node as usize][x.rail as usize] = x.remaining();
    }
    let mut dag = Dag::new();
    let job = AllReduceJob { nodes: (0..f.spec().nodes).collect(), bytes: D, intra: false, chunks };
    build_allreduce(&mut dag, f, &h, strategy, &job, None);
    let r = simulate(f, &dag, failures, &EngineConfig::with_repair(strategy.repair_mode())).unwrap();
    assert!(!r.stalled);
    r.makespan
}

fn close(got: f64, want: f64, what: &str) {
    let err = (got / want - 1.0).abs();
    assert!(err < 0.01, "{what}: simulated {got:.6} s vs closed form {want:.6} s ({:.3}% off)", err * 100.0);
}

#[test]
fn fault_free_ring() {
    for n in [2, 4, 8] {
        let f = fabric(n, 4);
        let b = f.spec().node_bytes_per_s();
        close(run(&f, Scheme::Balance, &[], 1), closed::t_nf(n as usize, D, b), "ring");
    }
}

#[test]
fn balance_is_one_over_one_minus_x() {
    for (n, k, lost) in [(4u32, 4u32, 1u32), (4, 8, 1), (6, 4, 2)] {
        let f = fabric(n, k);
        let b = f.spec().node_bytes_per_s();
        let fails: Vec<Failure> = (0..lost).map(|r| Failure::known_down(1, r)).collect();
        let x = f64::from(lost) / f64::from(k);
        close(
            run(&f, Scheme::Balance, &fails, 1),
            closed::t_nf(n as usize, D, b) * closed::balance_ratio(x),
            "balance",
        );
    }
}

#[test]
fn hot_repair_doubles() {
    let f = fabric(4, 4);
    let b = f.spec().node_bytes_per_s();
    close(run(&f, Scheme::HotRepair, &[Failure::known_down(2, 1)], 1), 2.0 * closed::t_nf(4, D, b), "hot repair");
}

#[test]
fn r2ccl_allreduce_with_k_chunks() {
    for (n, k_nics, lost, chunks) in [(4u32, 4u32, 1u32, 4u32), (4, 4, 1, 16), (6, 4, 1, 8), (4, 2, 1, 4)] {
        let f = fabric(n, k_nics);
        let b = f.spec().node_bytes_per_s();
        let fails: Vec<Failure> = (0..lost).map(|r| Failure::known_down(0, r)).collect();
        let x = f64::from(lost) / f64::from(k_nics);
        let (_, _, _, t) = closed::r2ccl_allreduce(n as usize, D, b, x, chunks);
        close(run(&f, Scheme::R2cclAllReduce, &fails, chunks), t, "r2ccl-allreduce");
    }
}

#[test]
fn four_stage_reaches_the_lower_bound() {
    // Section 7's bound is per participant: one NIC per node, the straggler's NIC degraded to beta.
    for (n, beta) in [(4u32, 0.75), (4, 0.5), (8, 0.875), (8, 0.5), (6, 0.3)] {
        let f = fabric(n, 1);
        let b = f.spec().node_bytes_per_s();
        let fails =
            [Failure { node: 0, rail: 0, kind: FailureKind::Degraded { fraction: beta }, at_s: -1.0, until_s: None }];
        close(run(&f, Scheme::FourStage, &fails, 256), closed::lower_bound(n as usize, D, b, beta), "four-stage");
    }
}
