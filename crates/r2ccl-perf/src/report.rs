//! The nccl-tests table: columns, bandwidth arithmetic, footer, and the JSON report.

use crate::args::Coll;
use r2ccl_core::{DType, ReduceOp};
use serde::Serialize;
use std::fmt::Write;

/// One timed variant (out-of-place or in-place) of one size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Measure {
    /// Average time per iteration, microseconds.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s (size / time).
    pub algbw: f64,
    /// Bus bandwidth, GB/s (algbw x the nccl-tests factor).
    pub busbw: f64,
    /// Elements that differ from the expected result.
    pub wrong: u64,
}

impl Measure {
    /// A measurement of `bytes` moved in `seconds` per iteration by `coll` on `nranks` ranks.
    pub fn new(coll: Coll, nranks: u32, bytes: u64, seconds: f64, wrong: u64) -> Self {
        let algbw = if seconds > 0.0 { bytes as f64 / seconds / 1e9 } else { 0.0 };
        Self { time_us: seconds * 1e6, algbw, busbw: algbw * coll.busbw_factor(nranks), wrong }
    }
}

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Size in bytes, as nccl-tests counts it for this collective.
    pub bytes: u64,
    /// Elements.
    pub count: u64,
    /// Data type.
    pub dtype: DType,
    /// Reduce op, for reducing collectives.
    pub op: Option<ReduceOp>,
    /// Root, for rooted collectives.
    pub root: Option<u32>,
    /// Out-of-place result.
    pub out_of_place: Measure,
    /// In-place result.
    pub in_place: Measure,
    /// Whether results were checked (`-c 1`); the `#wrong` columns say `N/A` otherwise.
    pub checked: bool,
    /// OOB control-plane messages rank 0 sent per timed out-of-place call (every channel but
    /// the heartbeat, which is timed, not per call), from `Communicator::oob_messages_sent`.
    pub oob_per_call: f64,
}

/// Column header lines.
pub fn header() -> String {
    let mut s = String::new();
    let _ = writeln!(s, "#{:>74}{:>34}", "out-of-place", "in-place");
    let _ = writeln!(
        s,
        "#{:>11} {:>12} {:>9} {:>6} {:>6} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7} {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    let _ = writeln!(
        s,
        "#{:>11} {:>12} {:>9} {:>6} {:>6} {:>8} {:>7} {:>7} {:>6} {:>8} {:>7} {:>7} {:>6}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
    s
}

/// One formatted row.
pub fn format_row(r: &Row) -> String {
    let op = r.op.map_or("none", ReduceOp::name);
    let root = r.root.map_or_else(|| "-1".to_owned(), |x| x.to_string());
    let wrong = |m: &Measure| if r.checked { m.wrong.to_string() } else { "N/A".to_owned() };
    let m = |m: &Measure| format!("{:>8.1} {:>7.2} {:>7.2} {:>6}", m.time_us, m.algbw, m.busbw, wrong(m));
    format!(
        " {:>11} {:>12} {:>9} {:>6} {:>6} {} {}",
        r.bytes,
        r.count,
        r.dtype.name(),
        op,
        root,
        m(&r.out_of_place),
        m(&r.in_place)
    )
}

/// Total wrong elements over every row.
pub fn wrong_total(rows: &[Row]) -> u64 {
    rows.iter().map(|r| r.out_of_place.wrong + r.in_place.wrong).sum()
}

/// Average bus bandwidth over every measurement (out-of-place and in-place), GB/s.
pub fn avg_busbw(rows: &[Row]) -> f64 {
    if rows.is_empty() {
        return 0.0;
    }
    rows.iter().map(|r| r.out_of_place.busbw + r.in_place.busbw).sum::<f64>() / (2 * rows.len()) as f64
}

/// The footer lines nccl-tests users grep for.
pub fn footer(rows: &[Row]) -> String {
    let wrong = wrong_total(rows);
    format!(
        "# Out of bounds values : {wrong} {}\n# Avg bus bandwidth    : {:.4} \n#\n",
        if wrong == 0 { "OK" } else { "FAILED" },
        avg_busbw(rows)
    )
}

/// The whole run, for `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The collective.
    pub collective: Coll,
    /// Number of ranks.
    pub nranks: u32,
    /// Every row.
    pub rows: Vec<Row>,
    /// Total wrong elements.
    pub wrong: u64,
    /// Average bus bandwidth, GB/s.
    pub avg_busbw: f64,
    /// Free-form events (failovers, strategy changes) seen during the run.
    pub events: Vec<String>,
    /// Milliseconds rank 0 spent in `init` (bootstrap, OOB mesh, UCX, engine: until every rank
    /// had joined), 0 where not measured.
    pub init_ms: f64,
}

impl Report {
    /// A report over `rows`.
    pub fn new(collective: Coll, nranks: u32, rows: Vec<Row>, events: Vec<String>) -> Self {
        Self { collective, nranks, wrong: wrong_total(&rows), avg_busbw: avg_busbw(&rows), rows, events, init_ms: 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(wrong: u64) -> Row {
        let m = Measure::new(Coll::AllReduce, 4, 1 << 20, 1e-3, wrong);
        Row {
            bytes: 1 << 20,
            count: 1 << 18,
            dtype: DType::F32,
            op: Some(ReduceOp::Sum),
            root: None,
            out_of_place: m,
            in_place: m,
            checked: true,
            oob_per_call: 0.0,
        }
    }

    #[test]
    fn bandwidth_arithmetic_matches_nccl_tests() {
        let m = Measure::new(Coll::AllReduce, 4, 1_000_000_000, 1.0, 0);
        assert!((m.algbw - 1.0).abs() < 1e-12 && (m.busbw - 1.5).abs() < 1e-12);
        assert!((m.time_us - 1e6).abs() < 1e-6);
    }

    #[test]
    fn table_and_footer() {
        let line = format_row(&row(0));
        assert!(line.contains("1048576") && line.contains("262144") && line.contains("float") && line.contains("sum"));
        assert!(line.contains("  -1 "), "{line}");
        assert!(header().contains("#wrong"));
        let unchecked = format_row(&Row { checked: false, ..row(0) });
        assert!(unchecked.trim_end().ends_with("N/A") && unchecked.matches("N/A").count() == 2, "{unchecked}");
        assert!(footer(&[row(0)]).contains("# Out of bounds values : 0 OK"));
        assert!(footer(&[row(0), row(3)]).contains("# Out of bounds values : 6 FAILED"));
        assert!(footer(&[row(0)]).contains("# Avg bus bandwidth    : 1.5729"), "{}", footer(&[row(0)]));
        let json = serde_json::to_string(&Report::new(Coll::AllReduce, 4, vec![row(0)], vec![])).unwrap();
        assert!(json.contains("\"collective\":\"all_reduce\"") && json.contains("\"avg_busbw\""));
    }
}
