//! Two network namespaces with two (and then four) veth NICs each, joined by per-rail bridges
//! (tbf-shaped): a NIC taken down, a silent black hole (bridge port disabled in the switch namespace)
//! and a flap, each in the middle of a 64 MiB transfer from rank 0 to rank 1. The transfer completes bit-exact and the measured
//! pause (fault to data flowing on the backup NIC) is printed. Needs root: otherwise prints SKIPPED.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]
#![allow(clippy::print_stdout, clippy::print_stderr, reason = "a harness-less test reports on the terminal")]

mod common;

use common::testbed::{is_root, Testbed};
use common::{rank_main, run_cluster, run_tests, unix_ns, Injector, Outcome, Scenario, ROLE_VAR};
use std::sync::Arc;
use std::time::Duration;

/// NIC rate of the testbed, Mbit/s.
const RATE_MBPS: u64 = 800;
/// Bytes of the transfer.
const BYTES: u64 = 64 << 20;

/// When to inject the fault after GO: 40% of the transfer's time at line rate over `nics` NICs
/// (134 ms with 2 NICs, 67 ms with 4), so that it lands while every lane still has chunks to
/// send whatever this machine's speed. `R2T_INJECT_MS` overrides it (for sweeps: a black hole
/// after a lane's last send completed locally is the case a detector must also catch).
fn inject_after(nics: u32) -> Duration {
    if let Ok(ms) = std::env::var("R2T_INJECT_MS") {
        return Duration::from_millis(ms.parse().expect("R2T_INJECT_MS is milliseconds"));
    }
    Duration::from_micros(BYTES * 8 * 4 / 10 / (RATE_MBPS * u64::from(nics)))
}
const STALL_MS: u64 = 100;

fn scenario(tb: &Testbed) -> Scenario {
    Scenario {
        ranks: 2,
        devices: tb.devices(),
        bytes: BYTES as usize,
        pattern: "one".into(),
        chunk: 256 << 10,
        window: 8,
        stall_ms: STALL_MS,
        fault: String::new(),
        weights: Vec::new(),
        repeat: 1,
        inflight: 1,
        report_after_ms: 0,
        endpoint_ids: false,
    }
}

fn run(tb: &Arc<Testbed>, inject: Injector) -> Outcome {
    let sc = scenario(tb);
    let o = run_cluster(vec![tb.cmd(0), tb.cmd(1)], &sc, Some(inject), Duration::from_secs(40));
    o.assert_exact();
    o
}

fn check(name: &str, o: &Outcome, limit: Duration) {
    let f = *o.injected.first().expect("the fault was injected");
    let pause = o.pause_after(f).expect("data flowed on a backup NIC after the fault");
    eprintln!(
        "  {name}: 64 MiB bit-exact in {:?} (receiver done after {} ms, fault at +{} ms); pause from fault to data on the backup NIC {:.1} ms; migrations {}, \
         replayed chunks {}",
        o.elapsed,
        o.results[1].num("ms"),
        f.saturating_sub(o.go_ns) / 1_000_000,
        pause.as_secs_f64() * 1e3,
        o.migrations(),
        o.results.iter().map(|r| r.num("replayed")).sum::<u64>()
    );
    assert!(o.migrations() >= 1, "{name}: the lane on the failed NIC moved");
    assert!(pause < limit, "{name}: pause {pause:?} over {limit:?}");
}

fn with_nics(nics: u32, f: impl FnOnce(&Arc<Testbed>)) {
    if !is_root() {
        println!("SKIPPED: network namespace tests need root (run as root; CI does)");
        return;
    }
    let tb = Arc::new(Testbed::up("t", 2, nics, Some(&format!("{RATE_MBPS}mbit"))));
    f(&tb);
}

/// What to do to NIC `nic` of node 0 in the middle of the transfer.
#[derive(Clone, Copy)]
enum Kind {
    Down,
    BlackHole,
    Flap,
}

/// Run the 64 MiB transfer on a testbed with `nics` NICs per node, apply `kind` to NIC `nic`
/// of node 0 mid-way, and check it finished bit-exact with a migration and a bounded pause.
fn fault_mid_transfer(name: &str, nics: u32, nic: u32, kind: Kind) {
    with_nics(nics, |tb| {
        let t = tb.clone();
        let o = run(
            tb,
            Box::new(move |_| {
                std::thread::sleep(inject_after(nics));
                let at = unix_ns();
                match kind {
                    Kind::Down => t.link(0, nic, false),
                    Kind::BlackHole => t.blackhole(0, nic, true),
                    Kind::Flap => {
                        for _ in 0..3 {
                            t.link(0, nic, false);
                            std::thread::sleep(Duration::from_millis(100));
                            t.link(0, nic, true);
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
                vec![at]
            }),
        );
        check(name, &o, Duration::from_secs(2));
    });
}

fn nic_down_mid_transfer() {
    fault_mid_transfer("NIC down", 2, 0, Kind::Down);
}

fn silent_black_hole_mid_transfer() {
    fault_mid_transfer("black hole", 2, 0, Kind::BlackHole);
}

fn flap_mid_transfer() {
    fault_mid_transfer("flap", 2, 0, Kind::Flap);
}

/// The three faults on one NIC of a node with four: down, silent black hole, flap.
fn four_nics_down_black_hole_and_flap() {
    fault_mid_transfer("4 NICs, NIC down", 4, 2, Kind::Down);
    fault_mid_transfer("4 NICs, black hole", 4, 2, Kind::BlackHole);
    fault_mid_transfer("4 NICs, flap", 4, 2, Kind::Flap);
}

fn main() {
    if std::env::var(ROLE_VAR).is_ok() {
        rank_main();
        return;
    }
    run_tests(
        "netns",
        &[
            ("nic_down_mid_transfer", nic_down_mid_transfer),
            ("silent_black_hole_mid_transfer", silent_black_hole_mid_transfer),
            ("flap_mid_transfer", flap_mid_transfer),
            ("four_nics_down_black_hole_and_flap", four_nics_down_black_hole_and_flap),
        ],
    );
}
