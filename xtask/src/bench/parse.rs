//! Parsing what the programs print, and the statistics and number formats of the report.

#[allow(clippy::wildcard_imports, reason = "a part of bench.rs, split by part: its helpers are the parent's")]
use super::*;

/// One window of r2ccl-perf's `-N 0` timeline.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Sample {
    pub(super) at: f64,
    pub(super) busbw: f64,
    pub(super) strategy: String,
    pub(super) failover: bool,
}

/// The timeline rows of rank 0's stdout: `  AT  BUSBW  STRATEGY [failover]`.
pub(super) fn parse_timeline(stdout: &str) -> Vec<Sample> {
    stdout
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (at, busbw) = (f.first()?.parse().ok()?, f.get(1)?.parse().ok()?);
            Some(Sample {
                at,
                busbw,
                strategy: f.get(2).map_or_else(String::new, |s| (*s).to_owned()),
                failover: f.get(3) == Some(&"failover"),
            })
        })
        .collect()
}

/// The timeline windows at full precision from r2ccl-perf's `--json` (`{"timeline": [[AT, BUSBW,
/// EVENT], ...]}`), with the strategy of each window from stdout (the JSON lacks it); stdout alone
/// (3 decimals of GB/s) when the JSON is missing or malformed.
pub(super) fn timeline_samples(stdout: &str, json_text: &str) -> Vec<Sample> {
    let text = parse_timeline(stdout);
    let Ok(v) = serde_json::from_str::<Value>(json_text) else { return text };
    let Some(rows) = v["timeline"].as_array() else { return text };
    let precise: Option<Vec<Sample>> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            Some(Sample {
                at: r.get(0)?.as_f64()?,
                busbw: r.get(1)?.as_f64()?,
                failover: r.get(2)?.as_bool()?,
                strategy: text.get(i).map_or_else(String::new, |s| s.strategy.clone()),
            })
        })
        .collect();
    precise.unwrap_or(text)
}

/// One event line of rank 0 (`# event MS ms TEXT` or `#   event MS ms TEXT`).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Event {
    pub(super) at_ms: u64,
    pub(super) text: String,
}

pub(super) fn parse_events(stdout: &str) -> Vec<Event> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix('#')?.trim_start().strip_prefix("event")?;
            let (ms, text) = rest.trim_start().split_once(" ms")?;
            Some(Event { at_ms: ms.trim().parse().ok()?, text: text.trim().to_owned() })
        })
        .collect()
}

/// A failover (not a fail-back) event: (pause in ms, the path it left).
pub(super) fn failover_pause(text: &str) -> Option<(f64, String)> {
    if !text.starts_with("failover ") {
        return None;
    }
    let (_, after) = text.split_once(": ")?;
    let (from, _) = after.split_once(" -> ")?;
    let (_, p) = text.rsplit_once("pause ")?;
    let mut f = p.split_whitespace();
    let ms: f64 = f.next()?.parse().ok()?;
    (f.next() == Some("ms")).then(|| (ms, from.trim().to_owned()))
}

/// A failover line of a rank's log (`R2CCL_DEBUG=INFO R2CCL_DEBUG_SUBSYS=NET`):
/// `2026-12-02T15:53:56.399174Z  INFO r2ccl::net: failover ... pause 8.1 ms rank=0`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct LoggedFailover {
    /// Unix seconds of the log line (when the migration was done).
    pub(super) at: f64,
    pub(super) pause_ms: f64,
    pub(super) from: String,
}

pub(super) fn log_failovers(log: &str) -> Vec<LoggedFailover> {
    log.lines()
        .filter_map(|l| {
            let at = parse_utc(l.split_whitespace().next()?)?;
            let i = l.find(" failover ")?;
            let (pause_ms, from) = failover_pause(&l[i + 1..])?;
            Some(LoggedFailover { at, pause_ms, from })
        })
        .collect()
}

/// `YYYY-MM-DDTHH:MM:SS[.frac]Z` (what tracing prints) as Unix seconds.
pub(super) fn parse_utc(ts: &str) -> Option<f64> {
    let ts = ts.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let [y, m, day] = d[..] else { return None };
    let mut t = time.split(':');
    let (h, mi, sec): (f64, f64, f64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + mi * 60.0 + sec)
}

/// One `R2B peer=... size=... time_us=... busbw=... wrong=...` line of a peer program.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct PeerRow {
    pub(super) size: u64,
    pub(super) time_us: f64,
    pub(super) busbw: f64,
    pub(super) wrong: u64,
}

pub(super) fn parse_peer(stdout: &str) -> Vec<PeerRow> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("R2B ")?;
            let kv =
                |key: &str| rest.split_whitespace().find_map(|f| f.strip_prefix(key).and_then(|v| v.strip_prefix('=')));
            Some(PeerRow {
                size: kv("size")?.parse().ok()?,
                time_us: kv("time_us")?.parse().ok()?,
                busbw: kv("busbw")?.parse().ok()?,
                wrong: kv("wrong")?.parse().ok()?,
            })
        })
        .collect()
}

/// One row of r2ccl-perf's `--json` report (out-of-place and in-place).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct PerfRow {
    pub(super) bytes: u64,
    pub(super) time_us: f64,
    pub(super) busbw: f64,
    pub(super) time_in_place_us: f64,
    pub(super) busbw_in_place: f64,
    pub(super) wrong: u64,
    /// OOB messages rank 0 sent per timed out-of-place call (NaN from an older r2ccl-perf).
    pub(super) oob_per_call: f64,
}

/// r2ccl-perf's `--json` report: its rows, its events, and rank 0's init time (ms).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct PerfReport {
    pub(super) rows: Vec<PerfRow>,
    pub(super) events: Vec<String>,
    pub(super) init_ms: Option<f64>,
}

pub(super) fn parse_perf_json(text: &str) -> Result<PerfReport> {
    let v: Value = serde_json::from_str(text).context("r2ccl-perf --json output is not JSON")?;
    let rows = v["rows"].as_array().context("r2ccl-perf --json output has no `rows`")?;
    let f = |x: &Value| x.as_f64().unwrap_or(f64::NAN);
    let out = rows
        .iter()
        .map(|r| PerfRow {
            bytes: r["bytes"].as_u64().unwrap_or(0),
            time_us: f(&r["out_of_place"]["time_us"]),
            busbw: f(&r["out_of_place"]["busbw"]),
            time_in_place_us: f(&r["in_place"]["time_us"]),
            busbw_in_place: f(&r["in_place"]["busbw"]),
            wrong: r["out_of_place"]["wrong"].as_u64().unwrap_or(0) + r["in_place"]["wrong"].as_u64().unwrap_or(0),
            oob_per_call: f(&r["oob_per_call"]),
        })
        .collect();
    let events = v["events"].as_array().map(|e| e.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect());
    Ok(PerfReport { rows: out, events: events.unwrap_or_default(), init_ms: v["init_ms"].as_f64() })
}

/// Nearest-rank percentile of `v` (`p` in 0..=1); None when empty.
pub(super) fn percentile(v: &[f64], p: f64) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let rank = (p * s.len() as f64).ceil().max(1.0) as usize;
    Some(s[rank.min(s.len()) - 1])
}

pub(super) fn median(v: &[f64]) -> Option<f64> {
    percentile(v, 0.5)
}

pub(super) fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The most common string, ties to the first seen.
pub(super) fn mode(v: &[String]) -> Option<String> {
    let mut best: Option<(&String, usize)> = None;
    for s in v {
        let n = v.iter().filter(|x| *x == s).count();
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((s, n));
        }
    }
    best.map(|(s, _)| s.clone())
}

pub(super) fn human_bytes(b: f64) -> String {
    let b = b.round() as u64;
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{}G", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}K", b >> 10)
    } else {
        format!("{b}")
    }
}

/// Four significant digits (small bus bandwidths stay readable).
pub(super) fn sig(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    format!("{v:.digits$}")
}

pub(super) fn opt(v: Option<f64>, digits: usize) -> String {
    v.filter(|x| x.is_finite()).map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

pub(super) fn num(v: Option<f64>) -> Value {
    v.filter(|x| x.is_finite()).map_or(Value::Null, |x| json!(x))
}

/// nccl-tests' bus bandwidth factor for a collective on `n` ranks.
pub(super) fn busbw_factor(coll: &str, n: u32) -> f64 {
    let n = f64::from(n);
    match coll {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "alltoall" => (n - 1.0) / n,
        _ => 1.0,
    }
}
