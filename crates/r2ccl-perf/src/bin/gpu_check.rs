//! `r2ccl-perf gpu-check`: the one command a GPU machine runs (through `cargo xtask gpu-check`,
//! or the packed `gpu-check.sh` where there is no toolchain). It launches local ranks over
//! loopback for every collective with host buffers and with GPU buffers, then a NIC failure
//! during an AllReduce on each, and prints one table: exact or not, GPU bus bandwidth against
//! the same run's host bus bandwidth, and the failover pauses.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const COLLECTIVES: [&str; 7] =
    ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"];

/// One size of one collective on one kind of buffer: (bytes, bus bandwidth GB/s, wrong values).
type Sized = Vec<(u64, f64, u64)>;

/// Run `exe launch ...` with `args` and read the JSON it wrote.
fn launch(exe: &Path, dir: &Path, name: &str, args: &[&str]) -> Result<serde_json::Value> {
    let json = dir.join(format!("{name}.json"));
    let _ = std::fs::remove_file(&json);
    let out = Command::new(exe)
        .arg("launch")
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .with_context(|| format!("start {}", exe.display()))?;
    std::fs::write(dir.join(format!("{name}.log")), [&out.stdout[..], &out.stderr[..]].concat())?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let why = err.lines().find(|l| l.contains("error")).or_else(|| err.lines().last()).unwrap_or("no output");
        bail!("{name}: {}: {why}", out.status);
    }
    let text = std::fs::read_to_string(&json).with_context(|| format!("{name}: no JSON report"))?;
    Ok(serde_json::from_str(&text)?)
}

fn sized(report: &serde_json::Value) -> Sized {
    let rows = report["rows"].as_array().cloned().unwrap_or_default();
    rows.iter()
        .map(|r| {
            let wrong = r["out_of_place"]["wrong"].as_u64().unwrap_or(u64::MAX)
                + r["in_place"]["wrong"].as_u64().unwrap_or(u64::MAX / 2);
            (r["bytes"].as_u64().unwrap_or(0), r["out_of_place"]["busbw"].as_f64().unwrap_or(0.0), wrong)
        })
        .collect()
}

/// `gpu-check [-n RANKS] [-e MAXBYTES]`.
pub fn run(argv: &[String]) -> Result<bool> {
    let mut ranks = "2".to_owned();
    let mut max = "64M".to_owned();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-n" => ranks = it.next().context("-n needs a number")?.clone(),
            "-e" => max = it.next().context("-e needs a size")?.clone(),
            other => bail!("gpu-check: unknown argument `{other}` (gpu-check [-n RANKS] [-e MAXBYTES])"),
        }
    }
    let exe = std::env::current_exe()?;
    let dir = std::env::temp_dir().join(format!("r2ccl-gpu-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let started = Instant::now();
    println!("# r2ccl gpu-check: {ranks} ranks on this host, 2 NICs each on loopback; logs in {}", dir.display());
    let mut all_ok = true;
    let mut ratios_16m = Vec::new();
    println!(
        "#\n# {:<15} {:>10} {:>7} {:>7} {:>12} {:>12} {:>7}",
        "collective", "bytes", "host", "gpu", "host busbw", "gpu busbw", "gpu/host"
    );
    for coll in COLLECTIVES {
        let mut got = Vec::new();
        for device in ["host", "cuda"] {
            let args = [
                "-n", &ranks, "--nics", "2", coll, "-b", "1M", "-e", &max, "-f", "4", "-n", "5", "-w", "2", "-c", "1",
                "--device", device,
            ];
            match launch(&exe, &dir, &format!("{coll}-{device}"), &args) {
                Ok(r) => got.push(sized(&r)),
                Err(e) => {
                    println!("# {coll} on {device}: FAILED: {e:#}");
                    all_ok = false;
                    got.push(Vec::new());
                }
            }
        }
        let (host, gpu) = (&got[0], &got[1]);
        for (i, &(bytes, hbw, hwrong)) in host.iter().enumerate() {
            let exact = |w: u64| if w == 0 { "exact" } else { "WRONG" };
            let (gbw, gstatus) = gpu.get(i).map_or((0.0, "failed"), |g| (g.1, exact(g.2)));
            let ratio = if hbw > 0.0 { gbw / hbw } else { 0.0 };
            println!("  {coll:<15} {bytes:>10} {:>7} {gstatus:>7} {hbw:>12.3} {gbw:>12.3} {ratio:>7.2}", exact(hwrong));
            all_ok &= hwrong == 0 && gstatus == "exact";
            if coll == "all_reduce" && bytes >= 16 << 20 {
                ratios_16m.push(ratio);
            }
        }
    }
    println!("#\n# NIC faults 2 s into a 6 s timeline of 16 MiB AllReduces (software faults on loopback):");
    println!(
        "# {:<6} {:<10} {:>7} {:>8} {:>10} {:>10} {:>10}",
        "device", "fault", "result", "replans", "failovers", "median ms", "pause ms"
    );
    let mut pauses = Vec::new();
    let scenarios = [
        ("host", "down", "rank=1,nic=0,after_ms=2000,kind=down"),
        ("cuda", "down", "rank=1,nic=0,after_ms=2000,kind=down"),
        ("cuda", "flap", "rank=1,nic=0,after_ms=2000,for_ms=1000,kind=down"),
        ("cuda", "blackhole", "rank=*,nic=0,after_ms=2000,kind=blackhole"),
    ];
    for (device, fault, spec) in scenarios {
        let args = [
            "-n",
            &ranks,
            "--nics",
            "2",
            "--fail",
            spec,
            "all_reduce",
            "-b",
            "16M",
            "-e",
            "16M",
            "-N",
            "0",
            "--duration",
            "6",
            "--device",
            device,
        ];
        match launch(&exe, &dir, &format!("{fault}-{device}"), &args) {
            Ok(r) => {
                let wrong = r["wrong"].as_u64().unwrap_or(u64::MAX);
                // Re-plans on a new health view (the NIC failure agreed), and migrations of
                // traffic that was in flight on it (none when it failed between transfers).
                let count = |what: &str| {
                    r["events"]
                        .as_array()
                        .map_or(0, |e| e.iter().filter(|x| x.as_str().is_some_and(|s| s.contains(what))).count())
                };
                let (replans, failovers) = (count("re-planning"), count("failover"));
                let (median, pause) = (r["median_ms"].as_f64().unwrap_or(0.0), r["pause_ms"].as_f64().unwrap_or(0.0));
                println!(
                    "  {device:<6} {fault:<10} {:>7} {replans:>8} {failovers:>10} {median:>10.2} {pause:>10.2}",
                    if wrong == 0 { "exact" } else { "WRONG" }
                );
                all_ok &= wrong == 0 && replans > 0;
                if fault == "down" {
                    pauses.push(pause);
                }
            }
            Err(e) => {
                println!("  {device:<6} {fault:<10} FAILED: {e:#}");
                all_ok = false;
            }
        }
    }
    let min_ratio = ratios_16m.iter().copied().fold(f64::INFINITY, f64::min);
    println!("#");
    if ratios_16m.is_empty() {
        println!("# target GPU/host AllReduce busbw >= 0.9 at >= 16 MiB: not measured");
    } else {
        println!(
            "# target GPU/host AllReduce busbw >= 0.9 at >= 16 MiB: {min_ratio:.2} ({})",
            if min_ratio >= 0.9 { "met" } else { "MISSED" }
        );
    }
    if let [host, gpu] = pauses[..] {
        println!(
            "# target GPU failover pause within the host's: {gpu:.2} ms vs {host:.2} ms ({})",
            if gpu <= host * 1.5 + 5.0 { "met" } else { "MISSED" }
        );
    }
    println!(
        "# every result exact and every run finished: {} ({:.0} s)",
        if all_ok { "yes" } else { "NO" },
        started.elapsed().as_secs_f64()
    );
    Ok(all_ok)
}
