//! Benchmarks of the UCX backend in network namespaces (root only; prints SKIPPED otherwise), rank
//! processes re-executed from this binary and driven by r2ccl-transport's `Session`:
//! - point-to-point over 1, 2 and 4 NICs shaped with tbf (1gbit each): aggregate / sum of NIC rates;
//! - one unshaped NIC, a stream of 4 MiB messages out of one buffer into one buffer (as perftest does it),
//!   against `ucx_perftest -t tag_bw -s 4194304` (package `ucx-utils`) on the same namespaces in the same
//!   run, plus one 2 GiB transfer for reference;
//! - pause from a NIC going down (and from a silent black hole) to data flowing on the backup: p50/p99.
#![allow(clippy::unwrap_used, reason = "a benchmark fails loudly on any error")]
#![allow(clippy::print_stdout, clippy::print_stderr, reason = "a benchmark prints its figures")]

#[path = "../tests/common/mod.rs"]
mod common;

use common::testbed::{is_root, Testbed};
use common::{rank_main, run_cluster, unix_ns, Outcome, Scenario, ROLE_VAR};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const MIB: f64 = 1024.0 * 1024.0;
const STALL_MS: u64 = 100;

fn scenario(tb: &Testbed, bytes: usize, chunk: u32, window: u32) -> Scenario {
    Scenario {
        ranks: 2,
        devices: tb.devices(),
        bytes,
        pattern: "one".into(),
        chunk,
        window,
        stall_ms: STALL_MS,
        fault: String::new(),
        weights: Vec::new(),
        repeat: 1,
        inflight: 1,
        report_after_ms: 0,
        endpoint_ids: false,
    }
}

/// Receiver's time from GO to the last byte, as MiB/s.
fn rate(o: &Outcome, bytes: usize) -> f64 {
    let ms = o.results[1].num("ms").max(1) as f64;
    bytes as f64 / MIB / (ms / 1e3)
}

fn shaped_aggregate() {
    println!("== point-to-point over K NICs, tbf 1gbit each (sum of rates = K x 119.2 MiB/s)");
    for k in [1u32, 2, 4] {
        let tb = Testbed::up("b", 2, k, Some("1gbit"));
        let bytes = 40usize << 20 << (k / 2);
        let sc = scenario(&tb, bytes, 256 << 10, 16);
        let o = run_cluster(vec![tb.cmd(0), tb.cmd(1)], &sc, None, Duration::from_secs(60));
        o.assert_exact();
        let agg = rate(&o, bytes);
        let sum = f64::from(k) * 1e9 / 8.0 / MIB;
        println!(
            "  {k} NIC(s): {bytes_mib} MiB in {} ms: {agg:.1} MiB/s, ratio to sum of NIC rates {:.3}",
            o.results[1].num("ms"),
            agg / sum,
            bytes_mib = bytes >> 20
        );
    }
}

/// The `ucx_perftest` of the UCX this crate was built against (a UCX tree's `bin/`, as the
/// wheel's), else the one on `PATH` (Debian's `ucx-utils`).
fn perftest_exe() -> String {
    let tree = std::path::Path::new(r2ccl_ucx_sys::BUILT_UCX_LIBDIR).join("../bin/ucx_perftest");
    if !r2ccl_ucx_sys::BUILT_UCX_LIBDIR.is_empty() && tree.is_file() {
        tree.display().to_string()
    } else {
        "ucx_perftest".into()
    }
}

fn perftest_bw(tb: &Testbed, iters: u32) -> Option<f64> {
    let exe = perftest_exe();
    // A tree's ucx_perftest finds its own libraries only through the library path.
    let mut lib_path = r2ccl_ucx_sys::BUILT_UCX_LIBDIR.to_owned();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        lib_path = format!("{lib_path}:{}", old.to_string_lossy());
    }
    let env = [("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "rail0"), ("LD_LIBRARY_PATH", lib_path.as_str())];
    let mut server = Command::new("ip");
    server.args(["netns", "exec", &tb.node_ns(1), &exe, "-t", "tag_bw", "-s", "4194304", "-n"]);
    server
        .arg(iters.to_string())
        .args(["-p", "13377"])
        .envs(env)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut srv = server.spawn().ok()?;
    std::thread::sleep(Duration::from_millis(500));
    let out = Command::new("ip")
        .args(["netns", "exec", &tb.node_ns(0), &exe, "198.18.0.2", "-t", "tag_bw", "-s", "4194304", "-n"])
        .arg(iters.to_string())
        .args(["-p", "13377"])
        .envs(env)
        .output()
        .ok()?;
    let _ = srv.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    let fin = text.lines().find(|l| l.trim_start().starts_with("Final:"))?;
    fin.split_whitespace().nth(6).and_then(|v| v.parse().ok())
}

fn unshaped_vs_perftest() {
    println!(
        "== one unshaped NIC, 4 MiB messages: r2ccl-ucx session vs {} -t tag_bw (same namespaces; UCX built {})",
        perftest_exe(),
        r2ccl_ucx_sys::BUILT_UCX_VERSION
    );
    let tb = Testbed::up("p", 2, 1, None);
    // 2 GiB: 0.7 s at perftest's rate, so that the ramp-up and the millisecond clock weigh little.
    let bytes = std::env::var("R2B_PERF_MIB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(2048) << 20;
    let rounds: usize = std::env::var("R2B_PERF_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    const MSG: usize = 4 << 20;
    // perftest sends one 4 MiB buffer over and over into one receive buffer, both in cache, and
    // does not limit its outstanding sends. The like-for-like cases stream 4 MiB transfers the
    // same way (one source and one destination region, 16 transfers in flight), whole or in
    // 1 MiB chunks. The last case, for reference, is one transfer of the whole 2 GiB: every byte
    // comes from and goes to fresh memory, so it is bound by memory bandwidth as much as by the
    // transport.
    let cases: [(&str, u32, u32, u32); 3] = [
        ("4 MiB messages, 4 MiB chunks, 16 in flight", MSG as u32, 16, 16),
        ("4 MiB messages, 1 MiB chunks, 16 in flight", 1 << 20, 16, 16),
        ("one 2 GiB transfer, 4 MiB chunks, window 8 (memory-bound, for reference)", MSG as u32, 8, 0),
    ];
    // Two processes busy-polling on two cores move 2-3.8 GB/s here, and a run moves by up to 20%
    // from the next: so the runs alternate (perftest, then each case, per round, 5 rounds) and
    // the ratio is of the medians.
    let mut perf: Vec<f64> = Vec::new();
    let mut ours: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        // 1024 x 4 MiB: over a second at perftest's rate; 128 was too short to be steady.
        perf.extend(perftest_bw(&tb, 1024));
        for (i, &(_, chunk, window, inflight)) in cases.iter().enumerate() {
            let mut sc = scenario(&tb, bytes, chunk, window);
            if inflight > 0 {
                sc.bytes = MSG;
                sc.repeat = u32::try_from(bytes / MSG).unwrap();
                sc.inflight = inflight;
            }
            let o = run_cluster(vec![tb.cmd(0), tb.cmd(1)], &sc, None, Duration::from_secs(60));
            o.assert_exact();
            ours[i].push(rate(&o, bytes));
        }
    }
    let p50 = if perf.is_empty() { None } else { Some(percentile(&mut perf.clone(), 0.5)) };
    let list = |v: &[f64]| v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(", ");
    if !perf.is_empty() {
        println!("  ucx_perftest, {rounds} runs: {} MB/s", list(&perf));
    }
    for (i, &(what, ..)) in cases.iter().enumerate() {
        let mine = percentile(&mut ours[i].clone(), 0.5);
        match p50 {
            Some(p) => println!(
                "  r2ccl-ucx ({what}), {rounds} runs: {} MiB/s; median {mine:.1} MiB/s against perftest's {p:.1} MB/s: ratio {:.3}",
                list(&ours[i]),
                mine / p
            ),
            None => println!(
                "  r2ccl-ucx ({what}) median {mine:.1} MiB/s; ucx_perftest SKIPPED (install Debian package ucx-utils)"
            ),
        }
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn pauses(kind: &str, runs: usize) {
    let tb = Arc::new(Testbed::up("f", 2, 2, Some("1gbit")));
    let mut ms = Vec::new();
    for _ in 0..runs {
        let sc = scenario(&tb, 64 << 20, 256 << 10, 8);
        let t = tb.clone();
        let blackhole = kind == "black hole";
        let o = run_cluster(
            vec![tb.cmd(0), tb.cmd(1)],
            &sc,
            Some(Box::new(move |_| {
                std::thread::sleep(Duration::from_millis(150));
                let at = unix_ns();
                if blackhole {
                    t.blackhole(0, 0, true);
                } else {
                    t.link(0, 0, false);
                }
                vec![at]
            })),
            Duration::from_secs(60),
        );
        o.assert_exact();
        if let Some(p) = o.pause_after(o.injected[0]) {
            ms.push(p.as_secs_f64() * 1e3);
        }
        if blackhole {
            tb.blackhole(0, 0, false);
        } else {
            tb.link(0, 0, true);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let (p50, p99) = (percentile(&mut ms, 0.5), percentile(&mut ms, 0.99));
    let target = if kind == "black hole" { (STALL_MS + 50) as f64 } else { 50.0 };
    println!(
        "  {kind}: {} runs, pause to data on the backup p50 {p50:.1} ms, p99 {p99:.1} ms (target p50 <= {target} ms{}): ratio p50/target {:.2}",
        ms.len(),
        if kind == "black hole" { " = stall deadline + 50" } else { ", p99 <= 200 ms" },
        p50 / target
    );
}

fn main() {
    if std::env::var(ROLE_VAR).is_ok() {
        rank_main();
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if !is_root() {
        println!("SKIPPED: the UCX rail benchmarks need root (network namespaces)");
        return;
    }
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let want = |part: &str| only.is_empty() || only.iter().any(|o| part.contains(o.as_str()));
    if want("shaped") {
        shaped_aggregate();
    }
    if want("perftest") {
        unshaped_vs_perftest();
    }
    if want("pause") {
        println!("== failover pause (2 NICs at 1gbit, 64 MiB transfer, fault 150 ms in)");
        pauses("NIC down", 10);
        pauses("black hole", 5);
    }
}
