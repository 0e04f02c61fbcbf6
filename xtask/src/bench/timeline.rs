//! Part 5, `timeline`: bus bandwidth across a NIC failure and its recovery.

#[allow(clippy::wildcard_imports, reason = "a part of bench.rs, split by part: its helpers are the parent's")]
use super::*;

pub(super) fn part_timeline(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::Timeline;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let spec = ctx.spec.clone();
    let (size, dur, t_down, t_up) = if ctx.quick { ("4M", 6.0, 2.0, 4.0) } else { ("4M", 20.0, 5.0, 12.0) };
    let bed = Bed::up(&spec)?;
    let one = testbed_size(size) as f64 * 1.5 / (ctx.node_line_gbs() * 1e9);
    let json_path = logs.join("timeline.json");
    let _ = std::fs::remove_file(&json_path);
    let job = Job {
        name: "timeline".into(),
        args: ["all_reduce", "-b", size, "-e", size, "-N", "0", "--duration", &dur.to_string(), "--json"]
            .iter()
            .map(ToString::to_string)
            .chain([json_path.display().to_string()])
            .collect(),
        env: Vec::new(),
        faults: vec![
            Step { at_s: t_down, node: FAULT_NODE, nic: FAULT_NIC, fault: Fault::Down },
            Step { at_s: t_up, node: FAULT_NODE, nic: FAULT_NIC, fault: Fault::Up },
        ],
        deadline: Duration::from_secs_f64(dur + 45.0 + 20.0 * one),
    };
    println!("bench: timeline: {size}, {dur} s, NIC down at {t_down} s, up at {t_up} s");
    let out = run_job(ctx, &spec, &job, &logs)?;
    drop(bed);
    res.problems.extend(out.problems.iter().cloned());
    let samples = timeline_samples(&out.rank0_out, &read(&json_path));
    let events = parse_events(&out.rank0_out);
    let down_at = out.applied.first().map_or(t_down, |a| a.0);
    let up_at = out.applied.get(1).map_or(t_up, |a| a.0);
    let avg = |f: &dyn Fn(&Sample) -> bool| mean(&samples.iter().filter(|s| f(s)).map(|s| s.busbw).collect::<Vec<_>>());
    let before = avg(&|s| s.at < down_at);
    let during = avg(&|s| s.at > down_at + 1.0 && s.at < up_at);
    let after = avg(&|s| s.at > up_at + 1.0);
    if samples.is_empty() {
        res.problems.push(format!("timeline: rank 0 printed no timeline windows; logs {}", logs.display()));
    }
    let mut md = format!(
        "AllReduce {size}, {dur} s, node {FAULT_NODE} NIC {FAULT_NIC} down at {down_at:.2} s and up at {up_at:.2} s (harness clock from rank 0's timeline start). Mean busbw before {} GB/s, while down (from 1 s after) {} GB/s, after recovery (from 1 s after) {} GB/s; line rate {:.4} GB/s.\n\n| t (s) | busbw (GB/s) | strategy | failover |\n|---|---|---|---|\n",
        opt(before, 4),
        opt(during, 4),
        opt(after, 4),
        ctx.node_line_gbs()
    );
    for s in &samples {
        let _ =
            writeln!(md, "| {:.1} | {:.4} | {} | {} |", s.at, s.busbw, s.strategy, if s.failover { "yes" } else { "" });
    }
    let moves: Vec<&Event> =
        events.iter().filter(|e| e.text.starts_with("failover") || e.text.starts_with("fail-back")).collect();
    let _ = writeln!(md, "\nrank 0 events: {} in all, {} failover/fail-back", events.len(), moves.len());
    let series = vec![("AllReduce busbw".to_owned(), samples.iter().map(|s| (s.at, s.busbw)).collect::<Vec<_>>())];
    let vl = vec![("NIC down".to_owned(), down_at), ("NIC up".to_owned(), up_at)];
    let hl = vec![("payload line rate".to_owned(), ctx.node_line_gbs())];
    let marks: Vec<(f64, f64)> = samples.iter().filter(|s| s.failover).map(|s| (s.at, s.busbw)).collect();
    res.plot(ctx, "timeline.png", |p| {
        plot_lines(
            p,
            &format!("AllReduce {size}: bus bandwidth across a NIC failure and recovery"),
            "time (s)",
            "bus bandwidth (GB/s)",
            &series,
            &hl,
            &vl,
            &marks,
            false,
        )
    });
    res.md = md;
    res.json = json!({"bytes": testbed_size(size), "duration_s": dur, "down_at_s": down_at, "up_at_s": up_at,
        "busbw_before": num(before), "busbw_during": num(during), "busbw_after": num(after),
        "samples": samples.iter().map(|s| json!({"at": s.at, "busbw": s.busbw, "strategy": s.strategy, "failover": s.failover})).collect::<Vec<_>>(),
        "events": events.iter().map(|e| json!({"at_ms": e.at_ms, "text": e.text})).collect::<Vec<_>>(),
        "exits": out.ends.iter().map(|e| e.describe()).collect::<Vec<_>>()});
    Ok(res)
}
