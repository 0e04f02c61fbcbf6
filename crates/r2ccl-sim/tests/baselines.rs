//! Every tokens table of `reproduce` measures its losses against the planner's own fault-free
//! iteration: no row, faulty or not, runs faster than the "no failure" row, and the planner's
//! faulty row loses what its own fault-free run does not have.

use r2ccl_sim::reproduce::{gpt3_13b, gpt3_2p7b, Table};

fn tokens(t: &Table) -> Vec<(String, f64)> {
    t.rows.iter().filter_map(|r| Some((r.first()?.clone(), r.get(1)?.parse::<f64>().ok()?))).collect()
}

#[test]
fn no_row_beats_the_planners_fault_free_baseline() {
    for table in [gpt3_2p7b().unwrap(), gpt3_13b().unwrap()] {
        let rows = tokens(&table);
        let (label, base) = rows.first().cloned().unwrap();
        assert_eq!(label, "no failure", "{}", table.title);
        for (label, tok) in &rows {
            assert!(*tok <= base + 0.5, "{}: {label} runs {tok} tokens/s, above the baseline {base}", table.title);
        }
        // Every loss cell is a loss or nothing (the baseline is the fastest fault-free run).
        for r in table.rows.iter().skip(1) {
            let cell = &r[3];
            assert!(cell.starts_with('-') || cell == "+0.00%", "{}: {r:?}", table.title);
        }
    }
}
