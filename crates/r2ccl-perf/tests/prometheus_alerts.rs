//! A real Prometheus server scrapes a running two-rank r2ccl-perf job (the exporter that
//! `R2CCL_METRICS_ADDR` turns on) and evaluates the shipped alert rules
//! (`configs/prometheus/r2ccl-rules.yml`, with their `for:` durations set to 0 s so the test waits
//! seconds, not minutes) while node 1's NIC 0 black-holes for 4 s (a silent fault: a failover and
//! a detector verdict; it is a link to the detector on two nodes, so the NIC stays up) and later
//! goes down for 8 s and comes back: `R2cclNicDown` must fire for node 1's NIC and then resolve, no
//! other alert may fire, and every query of the
//! shipped Grafana dashboard (`configs/grafana/r2ccl.json`, `$comm` = `.*`) must return series
//! from the job. Needs the Debian `prometheus` package (`cargo xtask setup`); without it the test
//! fails under CI and says SKIPPED loudly elsewhere.
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

fn workspace_file(rel: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("reading {rel}: {e}"))
}

/// `%`-encode a PromQL expression for a query string.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The alerts Prometheus holds now: (name, state, host label).
fn alerts(web: &str) -> Vec<(String, String, String)> {
    let Some(body) = http_get(web, "/api/v1/alerts") else { return Vec::new() };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else { return Vec::new() };
    let list = v["data"]["alerts"].as_array().cloned().unwrap_or_default();
    list.iter()
        .map(|a| {
            let l = &a["labels"];
            let s = |k: &str| l[k].as_str().unwrap_or("").to_owned();
            (s("alertname"), a["state"].as_str().unwrap_or("").to_owned(), s("host"))
        })
        .collect()
}

/// How many series `expr` returns now (None: the query failed).
fn series(web: &str, expr: &str) -> Option<usize> {
    let body = http_get(web, &format!("/api/v1/query?query={}", encode(expr)))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    (v["status"] == "success").then(|| v["data"]["result"].as_array().map_or(0, Vec::len))
}

#[test]
fn shipped_alerts_fire_and_resolve_and_dashboard_queries_answer() {
    let Some(prom) =
        ["/usr/bin/prometheus", "/usr/local/bin/prometheus"].into_iter().find(|p| std::path::Path::new(p).exists())
    else {
        assert!(std::env::var_os("CI").is_none(), "prometheus is missing under CI: `cargo xtask setup` installs it");
        eprintln!("******** SKIPPED shipped_alerts_fire_and_resolve_and_dashboard_queries_answer: no prometheus binary ********");
        return;
    };
    // Every `for:` of the shipped rules at 0 s: the rules themselves are evaluated unchanged.
    let rules: String = workspace_file("configs/prometheus/r2ccl-rules.yml")
        .lines()
        .map(|l| match l.split_once("for:") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}for: 0s\n"),
            _ => format!("{l}\n"),
        })
        .collect();
    let dashboard: serde_json::Value = serde_json::from_str(&workspace_file("configs/grafana/r2ccl.json")).unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(exprs.len() >= 6, "the dashboard has its panels' queries: {exprs:?}");
    // One exporter per rank: each exports its own node's NICs only.
    let exporters = [format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port())];
    let root = format!("127.0.0.1:{}", free_port());
    let mut kids = Kill(Vec::new());
    for (rank, exporter) in exporters.iter().enumerate() {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_r2ccl-perf"));
        cmd.args(["all_reduce", "-b", "1M", "-e", "1M", "-N", "0", "--duration", "30"])
            .env("R2CCL_RANK", rank.to_string())
            .env("R2CCL_WORLD_SIZE", "2")
            .env("R2CCL_ROOT", &root)
            .env("R2CCL_SECRET", "00112233445566778899aabbccddeeff")
            .env("R2CCL_NODE", format!("node{rank}"))
            .env("R2CCL_NICS", "lo,lo")
            .env("R2CCL_DEBUG", "ERROR")
            .env("R2CCL_FAULT", "rank=1,nic=0,after_ms=2000,for_ms=4000,kind=blackhole; rank=1,nic=0,after_ms=9000,for_ms=8000,kind=down")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd.env("R2CCL_METRICS_ADDR", exporter);
        kids.0.push(cmd.spawn().unwrap());
    }
    let dir = std::env::temp_dir().join(format!("r2ccl-prom-rank-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("rules.yml"), rules).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{}']\nscrape_configs:\n  - job_name: r2ccl\n    static_configs:\n      - targets: ['{}', '{}']\n",
            dir.join("rules.yml").display(),
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
    // Fires for node 1's NIC while it is down, then resolves once it is back.
    let deadline = Instant::now() + Duration::from_secs(90);
    let (mut fired, mut resolved, mut others) = (false, false, Vec::new());
    // The most series each dashboard query returned at any one time while the job ran.
    let mut answered: Vec<(String, usize)> = exprs.iter().map(|e| (e.clone(), 0)).collect();
    while Instant::now() < deadline && !(fired && resolved && answered.iter().all(|(_, n)| *n > 0)) {
        std::thread::sleep(Duration::from_millis(500));
        let now = alerts(&web);
        let down = now.iter().any(|(name, state, host)| name == "R2cclNicDown" && state == "firing" && host == "node1");
        others.extend(now.iter().filter(|(name, ..)| name != "R2cclNicDown").cloned());
        if down {
            fired = true;
        } else if fired && !now.iter().any(|(name, ..)| name == "R2cclNicDown") {
            resolved = true;
        }
        for (e, most) in &mut answered {
            *most = (*most).max(series(&web, &e.replace("$comm", ".*")).unwrap_or(0));
        }
    }
    drop(kids);
    // What Prometheus said (the last lines), for a failure that is Prometheus's own.
    let log = std::fs::read_to_string(&prom_log).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(fired, "R2cclNicDown never fired for node1 within 90 s; Prometheus log ends: {tail:?}");
    assert!(resolved, "R2cclNicDown fired but did not resolve after the NIC came back; log ends: {tail:?}");
    assert!(others.is_empty(), "no other alert fires in a job whose only fault is one NIC flap: {others:?}");
    let empty: Vec<_> = answered.iter().filter(|(_, n)| *n == 0).map(|(e, _)| e).collect();
    assert!(empty.is_empty(), "every dashboard query returns series from the job; these did not: {empty:?}");
}

/// Every `expr` of the dashboard's panel targets.
fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            if let (Some(serde_json::Value::String(e)), true) = (m.get("expr"), m.contains_key("refId")) {
                out.push(e.clone());
            }
            m.values().for_each(|x| collect_exprs(x, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_exprs(x, out)),
        _ => {}
    }
}
