//! Judging a run: what the ranks printed against what the scenario expects.

#[allow(clippy::wildcard_imports, reason = "a part of e2e.rs: its helpers are the parent's")]
use super::*;

/// What the policy predicts for `sc`'s failed NICs: t_nf over its chosen strategy's time (the
/// library's planner, [`crate::predict`], at the scenario's payload line rate).
pub(super) fn predicted_ratio(sc: &Scenario) -> Result<f64> {
    let failed = sc.failed_nics.as_deref().unwrap_or_default();
    let bytes = largest_size(&sc.args).context("no -e SIZE")?;
    let gbps = match sc.spec.rate.as_deref() {
        Some(r) => crate::bench::payload_line_gbps(r)?,
        None => 100.0,
    };
    let failed: Vec<(u32, u16)> = failed
        .iter()
        .filter_map(|n| nic_name(n))
        .map(|(node, nic)| Ok((node, u16::try_from(nic)?)))
        .collect::<Result<_>>()?;
    let p = crate::predict::allreduce(sc.spec.nodes, sc.spec.nics, sc.ranks_per_node, gbps, &failed, bytes)?;
    let t = p.time_of(&p.chosen).context("the planner gave no time for its choice")?;
    if !(t > 0.0 && p.t_nf > 0.0) {
        bail!("planner: times t_nf {}, {} {t}", p.t_nf, p.chosen);
    }
    Ok(p.t_nf / t)
}

/// The sum over every rank's `# rank R: failovers F fail-backs B wrong values W` line of the
/// number after `what` (`"failovers"`, `"wrong values"`); `None` if no rank printed one.
pub(super) fn rank_sum(outs: &[String], what: &str) -> Option<u64> {
    let mut seen = false;
    let mut sum = 0;
    for line in outs.iter().flat_map(|o| o.lines()) {
        let Some((_, rest)) = line.strip_prefix("# rank ").and_then(|l| l.split_once(": failovers ")) else {
            continue;
        };
        let rest = format!("failovers {rest}");
        let (_, after) = rest.split_once(&format!("{what} "))?;
        sum += after.split_whitespace().next()?.parse::<u64>().ok()?;
        seen = true;
    }
    seen.then_some(sum)
}

/// Failovers over every rank.
pub(super) fn failovers_in(outs: &[String]) -> Option<u64> {
    rank_sum(outs, "failovers")
}

/// The failed NICs of rank 0's last `health epochN: failed NICs [...]` event (sorted; empty if
/// it printed none).
pub(super) fn last_failed_nics(rank0_out: &str) -> Vec<String> {
    let mut last = Vec::new();
    for line in rank0_out.lines().filter(|l| l.starts_with("#   event")) {
        if let Some((_, list)) = line.split_once(": failed NICs [") {
            let list = list.split(']').next().unwrap_or("");
            last = list.split(',').map(|s| s.trim().trim_matches('"').to_owned()).filter(|s| !s.is_empty()).collect();
        }
    }
    last.sort();
    last
}

/// `(before, during, after)` from r2ccl-perf's `# bus bandwidth before the failure B GB/s, during D
/// GB/s, after A GB/s` line.
pub(super) fn bandwidth_phases(out: &str) -> Option<(f64, f64, f64)> {
    let line = out.lines().find_map(|l| l.strip_prefix("# bus bandwidth before the failure "))?;
    let mut nums = line.split_whitespace().filter_map(|w| w.trim_end_matches(',').parse::<f64>().ok());
    Some((nums.next()?, nums.next()?, nums.next()?))
}

/// The problems with an outcome (empty: the scenario passed).
/// `predicted`: the policy's t_nf / t for `sc.failed_nics` (needed by `sc.degraded`).
pub(super) fn judge(sc: &Scenario, o: &Outcome, predicted: Option<f64>) -> Vec<String> {
    let mut bad = o.fault_errors.clone();
    let hung: Vec<String> =
        o.ends.iter().enumerate().filter(|(_, e)| matches!(e, End::Hung)).map(|(r, _)| r.to_string()).collect();
    if !hung.is_empty() {
        bad.push(format!(
            "HANG: rank(s) {} still running at the {} s deadline (killed; thread stacks in rank<R>.stacks)",
            hung.join(","),
            sc.deadline.as_secs()
        ));
    }
    let exited = o.ends.iter().enumerate().filter_map(|(r, e)| match e {
        End::Exited(s) => Some((r, s)),
        End::Hung => None,
    });
    match sc.expect {
        Expect::Success => {
            for (r, s) in exited.filter(|(_, s)| !s.success()) {
                bad.push(format!("rank {r} exited with {s}{}", last_error(&o.errs[r])));
            }
            if !o.rank0_out.contains("# Out of bounds values : 0 OK") {
                bad.push("rank 0 did not print `# Out of bounds values : 0 OK`".into());
            }
            if let Some(want) = sc.expect_recovery {
                match bandwidth_phases(&o.rank0_out) {
                    Some((before, _, after)) if before > 0.0 && after >= want * before => {}
                    Some((before, _, after)) => bad.push(format!(
                        "bus bandwidth after the last failover {after:.3} GB/s is under {want} x the {before:.3} GB/s \
                         before the first (no fail-back?)"
                    )),
                    None => bad.push("rank 0 printed no `# bus bandwidth before the failure` line".into()),
                }
            }
            if let Some(want) = sc.failovers {
                match failovers_in(&o.outs) {
                    Some(n) if want.contains(n) => {}
                    Some(n) => bad.push(format!("{n} failovers over every rank, expected {want}")),
                    None => bad.push("no rank printed its `# rank R: failovers` line".into()),
                }
            }
            if let Some(want) = &sc.failed_nics {
                let got = last_failed_nics(&o.rank0_out);
                if &got != want {
                    bad.push(format!("rank 0's last agreed health view has failed NICs {got:?}, expected {want:?}"));
                }
            }
            if let Some(frac) = sc.degraded {
                match (bandwidth_phases(&o.rank0_out), predicted) {
                    (Some((before, _, after)), Some(p)) if before > 0.0 && after / before >= frac * p => {}
                    (Some((before, _, after)), Some(p)) => bad.push(format!(
                        "bus bandwidth after the last failover {after:.3} GB/s is {:.3} of the {before:.3} GB/s before \
                         the first, under {frac} x the policy's predicted {p:.3}",
                        after / before.max(1e-12)
                    )),
                    (None, _) => bad.push("rank 0 printed no `# bus bandwidth before the failure` line".into()),
                    (_, None) => bad.push("no prediction for `degraded`".into()),
                }
            }
        }
        Expect::Failure => {
            for (r, s) in exited {
                if s.success() {
                    bad.push(format!("rank {r} exited 0 but the job was expected to fail"));
                } else if s.code().is_none() {
                    // A signal (SIGSEGV, SIGABRT) is a crash, not the clean error the job owes its caller.
                    bad.push(format!("rank {r} was killed by a signal ({s}){}", last_error(&o.errs[r])));
                }
            }
            if let Some(text) = &sc.expect_error {
                let faulted: Vec<u32> = sc.faults.iter().map(|s| s.node).collect();
                for r in (0..sc.world()).filter(|&r| !faulted.contains(&sc.node_of(r))) {
                    if !o.errs[r as usize].contains(text.as_str()) {
                        bad.push(format!(
                            "survivor rank {r}: stderr lacks `{text}`{}",
                            last_error(&o.errs[r as usize])
                        ));
                    }
                }
            }
        }
    }
    bad
}

/// The last non-empty stderr line, for a failure message.
pub(super) fn last_error(err: &str) -> String {
    err.lines().rev().find(|l| !l.trim().is_empty()).map(|l| format!(" (stderr: {})", l.trim())).unwrap_or_default()
}

pub(super) fn describe(ends: &[End]) -> String {
    ends.iter()
        .map(|e| match e {
            End::Exited(s) => s.code().map_or_else(|| s.to_string(), |c| c.to_string()),
            End::Hung => "hang".into(),
        })
        .collect::<Vec<_>>()
        .join(",")
}
