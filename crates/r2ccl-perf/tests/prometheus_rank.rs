//! A real Prometheus server scrapes a running r2ccl-perf rank (the exporter that
//! `R2CCL_METRICS_ADDR` turns on) while a NIC failure is injected, and its HTTP API must then
//! hold the communicator's series: NIC state, bytes per NIC, collective durations, the health
//! epoch, and node 1's NIC 0 reported down after the injected fault (failover counters are
//! covered by `crates/r2ccl/tests/prometheus.rs`). Needs the Debian `prometheus` package
//! (`cargo xtask setup`); without it the test fails under CI and says SKIPPED loudly elsewhere.
#![allow(clippy::unwrap_used, clippy::print_stderr, reason = "test code: a panic or a note is the report")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, body)| body.to_owned())
}

/// A port outside the ephemeral range: one taken from it and released could be handed to another
/// test's connection before the child binds it.
fn free_port() -> u16 {
    r2ccl::bootstrap::free_port_outside_ephemeral_range(std::net::Ipv4Addr::LOCALHOST.into()).unwrap()
}

/// Kills the children when the test ends, also on a panic.
struct Kill(Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn prometheus_scrapes_a_running_rank() {
    let Some(prom) =
        ["/usr/bin/prometheus", "/usr/local/bin/prometheus"].into_iter().find(|p| std::path::Path::new(p).exists())
    else {
        assert!(std::env::var_os("CI").is_none(), "prometheus is missing under CI: `cargo xtask setup` installs it");
        eprintln!("******** SKIPPED prometheus_scrapes_a_running_rank: no prometheus binary ********");
        return;
    };
    // One exporter per rank: each exports its own node's NICs only.
    let exporters = [format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port())];
    let root = format!("127.0.0.1:{}", free_port());
    let mut kids = Kill(Vec::new());
    for (rank, exporter) in exporters.iter().enumerate() {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_r2ccl-perf"));
        cmd.args(["all_reduce", "-b", "1M", "-e", "1M", "-N", "0", "--duration", "20"])
            .env("R2CCL_RANK", rank.to_string())
            .env("R2CCL_WORLD_SIZE", "2")
            .env("R2CCL_ROOT", &root)
            .env("R2CCL_SECRET", "00112233445566778899aabbccddeeff")
            .env("R2CCL_NODE", format!("node{rank}"))
            .env("R2CCL_NICS", "lo,lo")
            .env("R2CCL_DEBUG", "ERROR")
            .env("R2CCL_FAULT", "rank=1,nic=0,after_ms=2000,kind=down")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd.env("R2CCL_METRICS_ADDR", exporter);
        kids.0.push(cmd.spawn().unwrap());
    }
    let dir = std::env::temp_dir().join(format!("r2ccl-prom-rank-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: r2ccl\n    static_configs:\n      - targets: ['{}', '{}']\n",
            exporters[0],
            exporters[1]
        ),
    )
    .unwrap();
    let web = format!("127.0.0.1:{}", free_port());
    let prom_log = dir.join("prometheus.log");
    kids.0.push(
        Command::new(prom)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&prom_log).unwrap())
            .spawn()
            .unwrap(),
    );
    let want =
        ["r2ccl_nic_up", "r2ccl_nic_bytes_total", "r2ccl_collective_duration_seconds_bucket", "r2ccl_health_epoch"];
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut names, mut down) = (String::new(), String::new());
    let mut ok = false;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        names = http_get(&web, "/api/v1/label/__name__/values").unwrap_or_default();
        // The injected fault took node 1's NIC 0 down: rank 1 reports it for its node.
        down = http_get(&web, "/api/v1/query?query=r2ccl_nic_up%3D%3D0").unwrap_or_default();
        if want.iter().all(|n| names.contains(n)) && down.contains("\"node1\"") {
            ok = true;
            break;
        }
    }
    drop(kids);
    // What Prometheus said (the last lines), for a failure that is Prometheus's own.
    let log = std::fs::read_to_string(&prom_log).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(8).collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        ok,
        "Prometheus did not see the rank's series within 60 s; names: {names}; nic_up==0: {down}; its log ends: {:?}",
        tail.into_iter().rev().collect::<Vec<_>>()
    );
}
