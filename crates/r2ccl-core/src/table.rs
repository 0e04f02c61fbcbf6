//! Declared transition tables rendered for people: the sans-IO state machines (r2ccl-detect's
//! path health, r2ccl-transport's lane migration) keep their rules in a `TRANSITIONS` array and
//! render it through these two functions, so that what their snapshot tests pin and what
//! `docs/*.dot` draws is exactly what runs.

use std::fmt::Write as _;

/// One rule of a table, as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The state it applies in.
    pub from: String,
    /// The event it reacts to.
    pub event: String,
    /// Its extra condition, if any.
    pub guard: Option<String>,
    /// The next state.
    pub to: String,
    /// The values of the table's extra columns (what is done), in order.
    pub notes: Vec<String>,
}

/// The table as aligned text: a `title` line, one line per rule under the headers `from event
/// guard to` and `extra` (each column as wide as its widest cell; "-" for no guard), then the
/// pairs of `states` and `events` no rule covers, which the machine refuses with `illegal`.
pub fn render_text(
    title: &str,
    extra: &[&str],
    rules: &[Rule],
    states: &[String],
    events: &[String],
    illegal: &str,
) -> String {
    let mut rows: Vec<Vec<String>> =
        vec![["from", "event", "guard", "to"].iter().chain(extra).map(|s| (*s).to_owned()).collect()];
    for r in rules {
        let mut row =
            vec![r.from.clone(), r.event.clone(), r.guard.clone().unwrap_or_else(|| "-".into()), r.to.clone()];
        row.extend(r.notes.iter().cloned());
        rows.push(row);
    }
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> =
        (0..columns).map(|c| rows.iter().filter_map(|r| r.get(c)).map(String::len).max().unwrap_or(0)).collect();
    let mut out = format!("{title}\n");
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| if c + 1 == row.len() { cell.clone() } else { format!("{cell:<w$}", w = width[c]) })
            .collect();
        let _ = writeln!(out, "{}", cells.join(" "));
    }
    let _ = writeln!(out, "\n# illegal (returns {illegal})");
    let w = states.iter().map(String::len).max().unwrap_or(0);
    for s in states {
        let missing: Vec<&str> = events
            .iter()
            .filter(|e| !rules.iter().any(|r| &r.from == s && &r.event == *e))
            .map(String::as_str)
            .collect();
        let _ = writeln!(out, "{s:<w$} {}", if missing.is_empty() { "-".to_owned() } else { missing.join(", ") });
    }
    out
}

/// The table as a Graphviz digraph named `graph`, its first line saying it was generated from
/// `source`; self-loops are left out to keep it readable (they are in [`render_text`]).
pub fn render_dot(source: &str, graph: &str, rules: &[Rule], states: &[String]) -> String {
    let mut out = format!(
        "// generated from {source}; do not edit\ndigraph {graph} {{\n  rankdir=LR;\n  node [shape=box, style=rounded];\n"
    );
    for s in states {
        let _ = writeln!(out, "  {s};");
    }
    for r in rules.iter().filter(|r| r.from != r.to) {
        let label = match &r.guard {
            Some(g) => format!("{} [{g}]", r.event),
            None => r.event.clone(),
        };
        let _ = writeln!(out, "  {} -> {} [label=\"{label}\"];", r.from, r.to);
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(from: &str, event: &str, guard: Option<&str>, to: &str) -> Rule {
        Rule {
            from: from.into(),
            event: event.into(),
            guard: guard.map(Into::into),
            to: to.into(),
            notes: vec!["x".into()],
        }
    }

    #[test]
    fn text_aligns_columns_and_lists_uncovered_pairs() {
        let rules =
            [rule("A", "Go", None, "Bee"), rule("Bee", "Go", Some("ok"), "A"), rule("Bee", "Stop", None, "Bee")];
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let text = render_text("# t", &["action"], &rules, &names(&["A", "Bee"]), &names(&["Go", "Stop"]), "E");
        assert_eq!(
            text,
            "# t\nfrom event guard to  action\nA    Go    -     Bee x\nBee  Go    ok    A   x\nBee  Stop  -     Bee x\n\n\
             # illegal (returns E)\nA   Stop\nBee -\n"
        );
        let dot = render_dot("here", "g", &rules, &names(&["A", "Bee"]));
        assert_eq!(
            dot,
            "// generated from here; do not edit\ndigraph g {\n  rankdir=LR;\n  node [shape=box, style=rounded];\n  A;\n  Bee;\n  \
             A -> Bee [label=\"Go\"];\n  Bee -> A [label=\"Go [ok]\"];\n}\n"
        );
    }
}
