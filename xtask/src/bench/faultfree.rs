//! Part 1, `faultfree`: bus bandwidth versus size on the testbed, and the rail probe.

#[allow(clippy::wildcard_imports, reason = "a part of bench.rs, split by part: its helpers are the parent's")]
use super::*;

/// Bandwidth each shaped rail carries with every rail busy at once: one blocking TCP stream per
/// node and rail towards the next node (this binary's `bench --probe-sink` / `--probe-source`
/// inside the namespaces; blocking sockets, so the probe does not compete for the CPU by
/// polling), GB/s of payload per stream.
pub(super) fn probe_rails(ctx: &Ctx, spec: &Spec, logs: &Path) -> Result<Vec<f64>> {
    let me = std::env::current_exe().context("finding the xtask binary for the rail probe")?;
    let secs = if ctx.quick { "1.5" } else { "3" };
    let pairs: Vec<(u32, u32)> = (0..spec.nics).flat_map(|r| (0..spec.nodes).map(move |i| (i, r))).collect();
    let mut sinks = Vec::new();
    for (k, &(i, _)) in pairs.iter().enumerate() {
        let to = (i + 1) % spec.nodes;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &spec.node_ns(to)]).arg(&me).args([
            "bench",
            "--probe-sink",
            &(13_400 + k).to_string(),
        ]);
        sinks.push(Proc::spawn(c, &format!("probe.sink{k}"), logs)?);
    }
    let mut sources = Vec::new();
    for (k, &(i, r)) in pairs.iter().enumerate() {
        let to = (i + 1) % spec.nodes;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &spec.node_ns(i)]).arg(&me).args(["bench", "--probe-source"]);
        c.args([&Spec::rail_addr(to, r), &(13_400 + k).to_string(), secs]);
        sources.push(Proc::spawn(c, &format!("probe.source{k}"), logs)?);
    }
    wait_all(&mut sources, Instant::now() + Duration::from_secs(30));
    wait_all(&mut sinks, Instant::now() + Duration::from_secs(10));
    let mut rates = Vec::new();
    for s in &sinks {
        let out = s.stdout();
        let gbs = out
            .lines()
            .find_map(|l| l.trim().strip_prefix("R2B probe gbs="))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok());
        match gbs {
            Some(g) if s.end.is_some_and(End::ok) => rates.push(g),
            _ => bail!(
                "{} ended {} without a result{}",
                s.name,
                s.end.map_or_else(|| "?".into(), End::describe),
                last_line(&s.stderr())
            ),
        }
    }
    Ok(rates)
}

/// `bench --probe-sink PORT`: accept one TCP stream, count its bytes to EOF, print the goodput.
pub(super) fn probe_sink(port: &str) -> Result<()> {
    let listener = std::net::TcpListener::bind(("0.0.0.0", port.parse::<u16>().context("--probe-sink PORT")?))?;
    let (mut conn, _) = listener.accept()?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let mut first: Option<Instant> = None;
    loop {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        first.get_or_insert_with(Instant::now);
        total += n as u64;
    }
    let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    if secs <= 0.0 {
        bail!("probe sink: no data received");
    }
    println!("R2B probe gbs={} bytes={total} secs={secs:.3}", total as f64 / secs / 1e9);
    Ok(())
}

/// `bench --probe-source ADDR PORT SECS`: send as fast as TCP allows for SECS seconds.
pub(super) fn probe_source(addr: &str, port: &str, secs: &str) -> Result<()> {
    use std::io::Write as _;
    let port: u16 = port.parse().context("--probe-source PORT")?;
    let secs: f64 = secs.parse().context("--probe-source SECS")?;
    let give_up = Instant::now() + Duration::from_secs(5);
    let mut conn = loop {
        match std::net::TcpStream::connect((addr, port)) {
            Ok(c) => break c,
            Err(e) if Instant::now() >= give_up => return Err(e).context("probe source: connecting"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    conn.set_write_timeout(Some(Duration::from_secs(10)))?;
    let buf = vec![0x5au8; 1 << 20];
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        conn.write_all(&buf)?;
    }
    conn.shutdown(std::net::Shutdown::Write)?;
    Ok(())
}

pub(super) fn part_faultfree(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::FaultFree;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let spec = ctx.spec.clone();
    let bed = Bed::up(&spec)?;
    let line = ctx.node_line_gbs();
    let nominal = ctx.node_nominal_gbs();
    let nic_line = line / f64::from(spec.nics);
    let probe = probe_rails(ctx, &spec, &logs);
    let (b, e, iters, warm) = if ctx.quick { ("1M", "4M", "1", "1") } else { ("64K", "64M", "3", "1") };
    let sizes_sum: f64 = {
        let (lo, hi) = (testbed_size(b), testbed_size(e));
        let mut s = lo;
        let mut acc = 0.0;
        while s <= hi {
            acc += s as f64;
            s *= 4;
        }
        acc
    };
    let n_runs: f64 = 2.0 * (iters.parse::<f64>().unwrap_or(5.0) + warm.parse::<f64>().unwrap_or(2.0));
    let mut runs = Vec::new();
    let mut series = Vec::new();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "| collective | size | time (us) | busbw (GB/s) | in-place busbw | / line rate | / nominal | wrong |\n|---|---|---|---|---|---|---|---|"
    );
    let mut ar_big: Vec<f64> = Vec::new();
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"] {
        let json_path = logs.join(format!("{coll}.json"));
        let _ = std::fs::remove_file(&json_path);
        let factor = busbw_factor(coll, spec.nodes).max(1.0);
        let est = sizes_sum * factor * n_runs / (line * 1e9);
        let job = Job {
            name: coll.to_owned(),
            args: [coll, "-b", b, "-e", e, "-f", "4", "-n", iters, "-w", warm, "--json"]
                .iter()
                .map(ToString::to_string)
                .chain([json_path.display().to_string()])
                .collect(),
            env: Vec::new(),
            faults: Vec::new(),
            deadline: Duration::from_secs_f64((30.0 + 20.0 * est).min(1200.0)),
        };
        println!("bench: faultfree: {coll} -b {b} -e {e} (deadline {} s)", job.deadline.as_secs());
        let out = run_job(ctx, &spec, &job, &logs)?;
        res.problems.extend(out.problems.iter().cloned());
        let parsed = parse_perf_json(&read(&json_path));
        let PerfReport { rows, events, .. } = parsed.unwrap_or_else(|err| {
            res.problems.push(format!("{coll}: no results ({err:#})"));
            PerfReport::default()
        });
        let failovers = events.iter().filter(|e| e.contains("failover")).count();
        for r in &rows {
            let _ = writeln!(
                table,
                "| {coll} | {} | {:.1} | {:.4} | {:.4} | {:.3} | {:.3} | {} |",
                human_bytes(r.bytes as f64),
                r.time_us,
                r.busbw,
                r.busbw_in_place,
                r.busbw / line,
                r.busbw / nominal,
                r.wrong
            );
            if coll == "all_reduce" && r.bytes >= 64 << 20 {
                ar_big.push(r.busbw / line);
            }
        }
        series.push((coll.to_owned(), rows.iter().map(|r| (r.bytes as f64, r.busbw)).collect::<Vec<_>>()));
        runs.push(json!({
            "collective": coll,
            "exits": out.ends.iter().map(|e| e.describe()).collect::<Vec<_>>(),
            "secs": out.secs,
            "rows": rows.iter().map(|r| json!({"bytes": r.bytes, "time_us": r.time_us, "busbw": r.busbw,
                "busbw_in_place": r.busbw_in_place, "over_line_rate": r.busbw / line,
                "over_nominal": r.busbw / nominal, "wrong": r.wrong})).collect::<Vec<_>>(),
            "events": events,
            "failovers_without_fault": failovers,
        }));
        if failovers > 0 {
            res.md.push_str(&format!(
                "- note: {coll}: rank 0 saw {failovers} failover(s) with no fault injected (spurious detections)\n"
            ));
        }
    }
    drop(bed);
    let probe_json = match &probe {
        Ok(rates) => {
            let med = median(rates);
            let _ = writeln!(
                res.md,
                "- rail probe (one blocking TCP stream per rail, {} rails busy at once): per rail median {} GB/s, min {} GB/s = {} of the payload line rate per NIC ({:.4} GB/s)",
                rates.len(),
                opt(med, 4),
                opt(rates.iter().copied().reduce(f64::min), 4),
                opt(med.map(|m| m / nic_line), 3),
                nic_line
            );
            if med.is_some_and(|m| m < 0.9 * nic_line) {
                res.md.push_str("- **note: the rails do not reach the shaped rate even for plain TCP streams on this machine now (CPU contention?); busbw ratios are bounded by the machine, not only the library**\n");
            }
            json!({"per_rail_gbs": rates, "median_gbs": num(med), "over_line_rate_per_nic": num(med.map(|m| m / nic_line))})
        }
        Err(err) => {
            res.md.push_str(&format!("- rail probe failed: {err:#}\n"));
            json!({"error": format!("{err:#}")})
        }
    };
    let mut md = format!(
        "Testbed {} nodes x {} NICs, tbf {} per NIC: nominal {:.4} GB/s per node, payload line rate {:.4} GB/s per node (x {}/{}, MTU {}). Sizes {b}..{e} (x4), {iters} iters + {warm} warm-up, out-of-place busbw.\n\n",
        spec.nodes,
        spec.nics,
        spec.rate.as_deref().unwrap_or("unshaped"),
        nominal,
        line,
        testbed::RAIL_MTU - 52,
        testbed::RAIL_MTU + 14,
        testbed::RAIL_MTU
    );
    md.push_str(&res.md);
    md.push('\n');
    md.push_str(&table);
    res.md = md;
    let target_value = ar_big.iter().copied().reduce(f64::min);
    res.targets.push(Target {
        detail: if target_value.is_some() {
            "smallest ratio over the AllReduce sizes >= 64 MiB (out-of-place)".into()
        } else {
            format!("no AllReduce size >= 64 MiB measured (largest {e}{})", if ctx.quick { ", quick mode" } else { "" })
        },
        value: target_value,
        ..unmeasured(part, "").remove(0)
    });
    let hl = vec![("payload line rate".to_owned(), line), ("nominal rate".to_owned(), nominal)];
    res.plot(ctx, "faultfree_busbw.png", |p| {
        plot_lines(
            p,
            &format!(
                "Fault-free bus bandwidth, {} nodes x {} NICs @ {}",
                spec.nodes,
                spec.nics,
                ctx.spec.rate.as_deref().unwrap_or("-")
            ),
            "message size (bytes, log2)",
            "bus bandwidth (GB/s)",
            &series,
            &hl,
            &[],
            &[],
            true,
        )
    });
    res.json = json!({"line_rate_gbs": line, "nominal_gbs": nominal, "rate": spec.rate, "nodes": spec.nodes,
        "nics": spec.nics, "probe": probe_json, "runs": runs});
    Ok(res)
}

/// A size such as `256K` in bytes (the forms this file passes to r2ccl-perf).
pub(crate) fn testbed_size(s: &str) -> u64 {
    let (num, mult) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().unwrap_or(0) * mult
}
