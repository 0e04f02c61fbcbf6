//! A real Prometheus server scrapes a process that records r2ccl metrics, and its HTTP
//! API must then list every r2ccl series. Needs the Debian `prometheus` package, which
//! `cargo xtask setup` installs; without it the test fails under CI and says SKIPPED
//! loudly elsewhere.
#![allow(clippy::unwrap_used, clippy::print_stderr, reason = "test code: a panic or a note is the report")]

use r2ccl::metrics;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
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

#[test]
fn prometheus_scrapes_every_r2ccl_series() {
    let Some(prom) =
        ["/usr/bin/prometheus", "/usr/local/bin/prometheus"].into_iter().find(|p| std::path::Path::new(p).exists())
    else {
        assert!(
            std::env::var_os("CI").is_none(),
            "prometheus is not installed under CI: `cargo xtask setup` must install it"
        );
        eprintln!("SKIPPED prometheus_scrapes_every_r2ccl_series: no prometheus binary (run `cargo xtask setup`)");
        return;
    };
    let (bound, handle) = metrics::install_prometheus("127.0.0.1:0".parse().unwrap()).unwrap();
    let ifaces = ["eth0".to_owned(), "eth1".to_owned()];
    let comm = metrics::CommMetrics::new(0x1234, "gpu07", &ifaces);
    comm.nic_up(0, true);
    comm.nic_up(1, false);
    comm.nic_bytes(0, true, 4096);
    comm.nic_capacity(0, 100_000, 50_000);
    comm.failover("path_failure", "local_nic", 0.012, 1 << 20);
    comm.verdict("local_nic", "local_evidence");
    comm.collective("allreduce", "balance", 0.5, 1 << 20, 1.5);
    comm.epoch(2, true);
    comm.oob_messages("agree", 3);
    metrics::count_rejected("bootstrap", 1);
    metrics::count_malformed("oob", 1);
    metrics::set_build_info("1.22.0", "1.22.0");
    metrics::count_error("timeout");
    let own = http_get(&bound.to_string(), "/metrics").unwrap();
    for name in metrics::ALL {
        assert!(own.contains(name), "exporter renders {name}:\n{own}");
    }
    let rendered = handle.render();
    assert!(
        rendered.contains("r2ccl_nic_up{comm=\"0000000000001234\",host=\"gpu07\",iface=\"eth1\",rail=\"1\"} 0"),
        "{rendered}"
    );

    let dir = std::env::temp_dir().join(format!("r2ccl-prom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: r2ccl\n    static_configs:\n      - targets: ['{bound}']\n"),
    )
    .unwrap();
    let web = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(prom)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={web}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut names = String::new();
    let mut seen_all = false;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        names = http_get(&web, "/api/v1/label/__name__/values").unwrap_or_default();
        let nic_up = http_get(&web, "/api/v1/query?query=r2ccl_nic_up").unwrap_or_default();
        if metrics::ALL.iter().all(|n| names.contains(n)) && nic_up.contains("eth1") {
            seen_all = true;
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(seen_all, "Prometheus did not list every r2ccl series within 45 s; it listed: {names}");
}
