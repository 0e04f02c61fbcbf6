//! Part 3, `pause`: the failover pause per fault kind.

#[allow(clippy::wildcard_imports, reason = "a part of bench.rs, split by part: its helpers are the parent's")]
use super::*;

pub(super) fn part_pause(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::Pause;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let spec = ctx.spec.clone();
    let (size, dur, t_f) = if ctx.quick { ("4M", 2.5, 1.2) } else { ("4M", 4.0, 1.5) };
    let kinds: &[&str] = if ctx.quick { &["down", "blackhole"] } else { &["down", "flap", "blackhole", "drop"] };
    let bed = Bed::up(&spec)?;
    let faulted = format!("node{FAULT_NODE}/nic{FAULT_NIC}");
    let mut per_kind = Vec::new();
    let mut dots = Vec::new();
    let mut resumed_dots = Vec::new();
    let mut table = String::from(
        "| fault kind | runs | runs with a failover | pauses | pause p50 (ms) | pause p99 (ms) | pause max (ms) | fault to resumed p50 (ms) | fault to resumed p99 (ms) | other failovers |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let one = testbed_size(size) as f64 * 1.5 / (ctx.node_line_gbs() * 1e9);
    for &kind in kinds {
        let (faults, undo) = match kind {
            "down" => (vec![(0.0, Fault::Down)], Fault::Up),
            "flap" => (vec![(0.0, Fault::Down), (0.3, Fault::Up)], Fault::Up),
            "blackhole" => (vec![(0.0, Fault::Blackhole)], Fault::Restore),
            _ => (vec![(0.0, Fault::Drop)], Fault::Undrop),
        };
        let mut pauses = Vec::new();
        let mut resumed = Vec::new();
        let mut with_failover = 0;
        let mut others = 0;
        let mut reps_json = Vec::new();
        for rep in 0..ctx.reps {
            let job = Job {
                name: format!("{kind}.{rep}"),
                args: ["all_reduce", "-b", size, "-e", size, "-N", "0", "--duration", &dur.to_string()]
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                // The failover notes (with their pause) of every rank, time-stamped, on stderr.
                env: vec![("R2CCL_DEBUG".into(), "INFO".into()), ("R2CCL_DEBUG_SUBSYS".into(), "NET".into())],
                faults: faults
                    .iter()
                    .map(|(dt, f)| Step { at_s: t_f + dt, node: FAULT_NODE, nic: FAULT_NIC, fault: f.clone() })
                    .collect(),
                deadline: Duration::from_secs_f64(dur + 40.0 + 20.0 * one),
            };
            println!("bench: pause: {kind} run {}/{}", rep + 1, ctx.reps);
            let out = run_job(ctx, &spec, &job, &logs);
            if let Err(e) = testbed::fault(&spec, FAULT_NODE, FAULT_NIC, &undo) {
                res.problems.push(format!("{kind}.{rep}: undoing the fault: {e:#}"));
            }
            let out = out?;
            res.problems.extend(out.problems.iter().cloned());
            let fault_at = out.applied_unix.first().copied();
            let mut mine = Vec::new();
            let mut firsts = Vec::new();
            for log in &out.errs {
                // One migration moves several steps of a lane at once: count it once.
                let mut seen: Vec<(i64, i64)> = Vec::new();
                let mut first: Option<f64> = None;
                for f in log_failovers(log) {
                    if !f.from.contains(&faulted) || fault_at.is_none_or(|t| f.at < t) {
                        others += 1;
                        continue;
                    }
                    let key = ((f.at * 1e3).round() as i64, (f.pause_ms * 10.0).round() as i64);
                    if !seen.contains(&key) {
                        seen.push(key);
                        mine.push(f.pause_ms);
                    }
                    first = Some(first.map_or(f.at, |x: f64| x.min(f.at)));
                }
                if let (Some(a), Some(t)) = (first, fault_at) {
                    firsts.push((a - t) * 1e3);
                }
            }
            with_failover += usize::from(!mine.is_empty());
            dots.extend(mine.iter().map(|&p| (kind.to_owned(), p)));
            resumed_dots.extend(firsts.iter().map(|&r| (kind.to_owned(), r)));
            pauses.extend(mine.iter().copied());
            resumed.extend(firsts.iter().copied());
            reps_json.push(json!({"rep": rep, "pauses_ms": mine, "fault_to_resumed_ms": firsts,
                "faults_applied": out.applied, "exits": out.ends.iter().map(|e| e.describe()).collect::<Vec<_>>(),
                "secs": out.secs}));
        }
        let (p50, p99, max) = (percentile(&pauses, 0.5), percentile(&pauses, 0.99), percentile(&pauses, 1.0));
        let (r50, r99) = (percentile(&resumed, 0.5), percentile(&resumed, 0.99));
        let _ = writeln!(
            table,
            "| {kind} | {} | {with_failover} | {} | {} | {} | {} | {} | {} | {others} |",
            ctx.reps,
            pauses.len(),
            opt(p50, 1),
            opt(p99, 1),
            opt(max, 1),
            opt(r50, 1),
            opt(r99, 1)
        );
        if kind == "down" {
            res.targets.push(Target {
                value: p50,
                detail: format!(
                    "{} migrations over {} runs (all ranks); from the fault to the first migration done, per rank: p50 {} ms",
                    pauses.len(),
                    ctx.reps,
                    opt(r50, 1)
                ),
                ..unmeasured(part, "").remove(0)
            });
        }
        per_kind.push(json!({"kind": kind, "runs": ctx.reps, "runs_with_failover": with_failover,
            "pauses_ms": pauses, "p50_ms": num(p50), "p99_ms": num(p99), "max_ms": num(max),
            "fault_to_resumed_ms": resumed, "fault_to_resumed_p50_ms": num(r50), "fault_to_resumed_p99_ms": num(r99),
            "other_failovers": others, "reps": reps_json}));
    }
    drop(bed);
    res.md = format!(
        "AllReduce {size} timeline runs of {dur} s, {} per kind; the fault hits node {FAULT_NODE} NIC {FAULT_NIC} {t_f} s in (flap: down, up 0.3 s later; blackhole: its switch port stops forwarding, carrier up; drop: the node's egress drops everything). **pause** = what the ranks print for each migration away from {faulted} (`failover ... pause X ms`: from the lane stopping to its replay on the new path; every rank's log, one per migration). **fault to resumed** = from the harness applying the fault (its clock just before the command) to a rank's first such migration being done (wall clocks of one host; includes detection), one per rank that migrated. `other failovers`: migrations off other paths, or before the fault.\n\n{table}",
        ctx.reps
    );
    res.plot(ctx, "pause.png", |p| {
        plot_dots(p, "Failover pause per fault kind (all ranks)", "pause (ms)", kinds, &dots)
    });
    // What users feel: from the fault to the first migration done, detection included.
    res.plot(ctx, "fault_to_resumed.png", |p| {
        plot_dots(
            p,
            "Fault to resumed per fault kind (one per rank that migrated)",
            "fault to resumed (ms)",
            kinds,
            &resumed_dots,
        )
    });
    res.json = json!({"bytes": testbed_size(size), "duration_s": dur, "fault_at_s": t_f, "kinds": per_kind});
    Ok(res)
}
