//! Part 2, `strategies`: one NIC down, each strategy against the lower bound and the prediction.

#[allow(clippy::wildcard_imports, reason = "a part of bench.rs, split by part: its helpers are the parent's")]
use super::*;

/// The library's planner for 4 x 2 with node 1 NIC 0 failed ([`crate::predict`]): (lower bound
/// s, t_nf s, strategy -> predicted s, chosen).
pub(super) fn plan(ctx: &Ctx, bytes: u64) -> Result<(f64, f64, Value, String)> {
    let spec = &ctx.spec;
    let nic = u16::try_from(FAULT_NIC)?;
    let p = crate::predict::allreduce(spec.nodes, spec.nics, 1, ctx.nic_line_gbps(), &[(FAULT_NODE, nic)], bytes)?;
    let times: serde_json::Map<String, Value> = p.times.iter().map(|(n, t)| (n.clone(), json!(t))).collect();
    Ok((p.lower_bound, p.t_nf, Value::Object(times), p.chosen))
}

pub(super) fn part_strategies(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::Strategies;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let spec = ctx.spec.clone();
    let (default_size, dur, t_fault): (&str, f64, f64) = if ctx.quick { ("2M", 5.5, 2.5) } else { ("64M", 30.0, 8.0) };
    let size = ctx.strategies_size.as_deref().unwrap_or(default_size);
    let bytes = testbed_size(size);
    let factor = busbw_factor("all_reduce", spec.nodes);
    let (lb, tnf, predictions, chosen) = plan(ctx, bytes)?;
    // Larger sizes: at least 3 fault-free collectives before the fault and 12 with it after.
    let t_fault = t_fault.max(3.0 * tnf);
    let dur = dur.max(t_fault + 12.0 * 1.3 * lb);
    let bed = Bed::up(&spec)?;
    let one = bytes as f64 * factor / (ctx.node_line_gbs() * 1e9);
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    let mut table = String::from(
        "| strategy | ran as | fault-free time (ms) | time, NIC down (ms) | lower bound (ms) | predicted (ms) | time / lower bound | time / predicted | windows |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for &strategy in STRATEGIES.iter().filter(|s| ctx.strategies.is_empty() || ctx.strategies.iter().any(|c| c == *s)) {
        let json_path = logs.join(format!("{strategy}.json"));
        let _ = std::fs::remove_file(&json_path);
        let job = Job {
            name: strategy.to_owned(),
            // -R 1: buffers registered with the communicator (as a GPU job's device buffers), so a
            // collective's time holds the schedule alone, not 2 copies of the buffer through the
            // library's workspace (at 64 MiB about 100 ms of the 5.7 s with one NIC down).
            args: [
                "all_reduce",
                "-b",
                size,
                "-e",
                size,
                "-R",
                "1",
                "-N",
                "0",
                "--duration",
                &dur.to_string(),
                "--json",
            ]
            .iter()
            .map(ToString::to_string)
            .chain([json_path.display().to_string()])
            .collect(),
            env: vec![("R2CCL_POLICY__STRATEGY".into(), strategy.into())],
            faults: vec![Step { at_s: t_fault, node: FAULT_NODE, nic: FAULT_NIC, fault: Fault::Down }],
            deadline: Duration::from_secs_f64(dur + 45.0 + 40.0 * one),
        };
        println!("bench: strategies: {strategy} ({size}, {dur} s, NIC {FAULT_NODE}/{FAULT_NIC} down at {t_fault} s)");
        let out = run_job(ctx, &spec, &job, &logs);
        if let Err(e) = testbed::fault(&spec, FAULT_NODE, FAULT_NIC, &Fault::Up) {
            res.problems.push(format!("{strategy}: bringing the NIC back up: {e:#}"));
        }
        let out = out?;
        res.problems.extend(out.problems.iter().cloned());
        let samples = timeline_samples(&out.rank0_out, &read(&json_path));
        let t_applied = out.applied.first().map_or(t_fault, |a| a.0);
        // The first window holds the connection warm-up: not a fault-free figure.
        let before: Vec<f64> =
            samples.iter().skip(1).filter(|s| s.at < t_applied && !s.failover).map(|s| s.busbw).collect();
        let first_after = samples.iter().position(|s| s.at >= t_applied);
        let steady: Vec<&Sample> = first_after
            .map(|i| samples[i + 1..].iter().filter(|s| !s.failover && s.busbw > 0.0).collect())
            .unwrap_or_default();
        let to_time = |busbw: f64| bytes as f64 * factor / (busbw * 1e9);
        let t_before = median(&before).map(to_time);
        let t_down = median(&steady.iter().map(|s| s.busbw).collect::<Vec<_>>()).map(to_time);
        let ran_as = mode(&steady.iter().map(|s| s.strategy.clone()).collect::<Vec<_>>());
        if t_down.is_none() && out.problems.is_empty() {
            res.problems.push(format!(
                "{strategy}: no steady window after the fault in {dur} s ({} windows in all); logs {}",
                samples.len(),
                logs.display()
            ));
        }
        if strategy != "auto" && ran_as.as_deref().is_some_and(|r| r != strategy) {
            res.problems.push(format!(
                "{strategy}: forced, but the ranks report strategy {}",
                ran_as.as_deref().unwrap_or("?")
            ));
        }
        let key =
            ran_as.clone().unwrap_or_else(|| if strategy == "auto" { chosen.clone() } else { strategy.to_owned() });
        let predicted = predictions[key.as_str()].as_f64();
        let over_lb = t_down.map(|t| t / lb);
        let over_pred = t_down.zip(predicted).map(|(t, p)| t / p);
        let _ = writeln!(
            table,
            "| {strategy} | {} | {} | {} | {:.1} | {} | {} | {} | {} |",
            ran_as.as_deref().unwrap_or("-"),
            opt(t_before.map(|t| t * 1e3), 1),
            opt(t_down.map(|t| t * 1e3), 1),
            lb * 1e3,
            opt(predicted.map(|t| t * 1e3), 1),
            opt(over_lb, 3),
            opt(over_pred, 3),
            steady.len()
        );
        if strategy == "auto" {
            res.targets.push(Target {
                value: over_lb,
                detail: format!("auto (ran as {}) at {size}", ran_as.as_deref().unwrap_or("?")),
                ..unmeasured(part, "").remove(0)
            });
            res.targets.push(Target {
                value: over_pred.map(|r| (r - 1.0).abs()),
                detail: format!(
                    "auto (ran as {}) time / prediction = {}",
                    ran_as.as_deref().unwrap_or("?"),
                    opt(over_pred, 3)
                ),
                ..unmeasured(part, "").remove(1)
            });
            // How much the failure slowed this run down, against the least any schedule could:
            // separates the schedule from the testbed's fault-free efficiency at this size.
            let slowdown = t_down.zip(t_before).map(|(d, b)| d / b);
            res.targets.push(Target {
                value: slowdown.map(|s| s / (lb / tnf)),
                detail: format!(
                    "time / fault-free time {} against lower bound / t_nf {:.3}; fault-free time / t_nf {}",
                    opt(slowdown, 3),
                    lb / tnf,
                    opt(t_before.map(|b| b / tnf), 3)
                ),
                ..unmeasured(part, "").remove(2)
            });
        }
        bars.push((
            match &ran_as {
                Some(r) if r != strategy => format!("{strategy} (ran {r})"),
                _ => strategy.to_owned(),
            },
            vec![t_down.unwrap_or(0.0) * 1e3, predicted.unwrap_or(0.0) * 1e3, lb * 1e3],
        ));
        rows.push(json!({"strategy": strategy, "ran_as": ran_as, "time_fault_free_s": num(t_before),
            "time_nic_down_s": num(t_down), "lower_bound_s": lb, "predicted_s": num(predicted),
            "over_lower_bound": num(over_lb), "over_predicted": num(over_pred), "steady_windows": steady.len(),
            "samples": samples.iter().map(|s| json!([s.at, s.busbw, s.strategy, s.failover])).collect::<Vec<_>>(),
            "faults_applied": out.applied, "exits": out.ends.iter().map(|e| e.describe()).collect::<Vec<_>>()}));
    }
    drop(bed);
    res.md = format!(
        "AllReduce {size} per rank, {} nodes x {} NICs at {}, node {FAULT_NODE} NIC {FAULT_NIC} taken down (`ip link set down`) {t_fault} s into a {dur} s timeline run; time = median of the per-second windows after the fault window (failover windows excluded). Lower bound and predictions: the library's planner (`Planner::model_plan`, as `r2ccl-plan --fail {FAULT_NODE}:{FAULT_NIC} --nic-gbps {:.4} --communicator` prints them; payload line rate; the communicator's topology: {} us per message, rail-only); its fault-free time t_nf = {:.1} ms, its choice: {chosen}.\n\n{table}",
        spec.nodes,
        spec.nics,
        spec.rate.as_deref().unwrap_or("-"),
        ctx.nic_line_gbps(),
        library_alpha_us(),
        tnf * 1e3
    );
    res.plot(ctx, "strategies.png", |p| {
        plot_bars(
            p,
            &format!("AllReduce {size}, one NIC down (node {FAULT_NODE}): time vs prediction vs lower bound"),
            "time (ms)",
            &["measured", "predicted", "lower bound"],
            &bars,
        )
    });
    res.json = json!({"bytes": bytes, "duration_s": dur, "fault_at_s": t_fault, "lower_bound_s": lb, "t_nf_s": tnf,
        "plan_chosen": chosen, "plan_predictions_s": predictions, "nic_gbps": ctx.nic_line_gbps(), "runs": rows});
    Ok(res)
}
