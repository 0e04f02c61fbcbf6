//! Snapshot tests: the transition table (text) and its Graphviz rendering are generated
//! from `health::TRANSITIONS` and must match the checked-in files. Run with
//! `UPDATE_SNAPSHOTS=1` to rewrite them after an intended change.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use r2ccl_detect::health::{render_dot, render_table};
use std::path::Path;

fn check(rel: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; run with UPDATE_SNAPSHOTS=1 to create it", path.display()));
    assert!(
        expected == actual,
        "{} is out of date; run `UPDATE_SNAPSHOTS=1 cargo test -p r2ccl-detect --test snapshots`.\n--- generated ---\n{actual}",
        path.display()
    );
}

#[test]
fn transition_table_matches_snapshot() {
    check("tests/snapshots/transitions.txt", &render_table());
}

#[test]
fn graphviz_rendering_matches_checked_in_file() {
    let dot = render_dot();
    assert!(dot.starts_with("// generated") && dot.trim_end().ends_with('}'));
    check("../../docs/detect-transitions.dot", &dot);
}
