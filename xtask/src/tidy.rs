//! `cargo xtask tidy`: repository conventions, checked on every CI run and as a test.
//!
//! - every `.rs` file starts with a `//!` line saying what it is for;
//! - library code prints nothing (`println!` and friends only in binaries, benches, tests);
//! - every crate is in the codemap of `docs/ARCHITECTURE.md`, uses the workspace lints,
//!   and has a `#` comment on the line above each dependency saying why it exists;
//! - the dependency graph in `docs/ARCHITECTURE.md` is the one the manifests declare, and
//!   neither it nor the README carries dates (history lives in commit messages);
//! - every `R2CCL_*` variable named in product code (not tests) is documented in `docs/configuration.md`,
//!   and every metric name (string constants in `metrics.rs` files) in `docs/metrics.md`;
//! - every runtime config in `configs/` loads and validates; every topology preset in
//!   `configs/topo/` is loaded by r2ccl-topo's tests.

use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// Manifest directories of every workspace member.
fn member_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("Cargo.toml").exists()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs.push(root.join("xtask"));
    dirs.push(root.join("tests"));
    dirs
}

fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_package = l == "[package]";
        } else if in_package {
            if let Some(v) = l.strip_prefix("name") {
                return Some(v.trim_start().trim_start_matches('=').trim().trim_matches('"').to_owned());
            }
        }
    }
    None
}

/// Package names of every workspace member.
pub(crate) fn member_crates(root: &Path) -> Vec<String> {
    member_dirs(root)
        .iter()
        .filter_map(|d| fs::read_to_string(d.join("Cargo.toml")).ok())
        .filter_map(|m| package_name(&m))
        .collect()
}

/// The names under `[dependencies]` (normal dependencies only) of `manifest`.
fn normal_deps(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = l == "[dependencies]";
        } else if in_deps && !l.starts_with('#') && l.contains('=') {
            out.push(l.split('=').next().unwrap_or(l).trim().to_owned());
        }
    }
    out
}

/// The graph `docs/ARCHITECTURE.md` draws: lines `crate -> dep, dep,` (continued on indented
/// lines that name only crates) or `crate -> (none)`, for the crates in `known`.
fn drawn_graph(arch: &str, known: &[String]) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut out: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    let mut current: Option<String> = None;
    for line in arch.lines() {
        let l = line.trim();
        let names = |s: &str| -> Vec<String> {
            s.split(',').map(|d| d.trim().to_owned()).filter(|d| known.contains(d)).collect()
        };
        if let Some((lhs, rhs)) = l.split_once("->") {
            let lhs = lhs.trim();
            if known.iter().any(|k| k == lhs) && (rhs.trim() == "(none)" || !names(rhs).is_empty()) {
                out.insert(lhs.to_owned(), names(rhs));
                current = Some(lhs.to_owned()).filter(|_| rhs.trim_end().ends_with(','));
                continue;
            }
        }
        match &current {
            Some(c)
                if !l.is_empty()
                    && l.split(',').all(|d| d.trim().is_empty() || known.contains(&d.trim().to_owned())) =>
            {
                let more = names(l);
                out.entry(c.clone()).or_default().extend(more);
                if !l.ends_with(',') {
                    current = None;
                }
            }
            _ => current = None,
        }
    }
    out
}

/// Whether `text` holds an ISO date (`2026-12-06`).
fn has_date(text: &str) -> Option<String> {
    let b = text.as_bytes();
    (0..b.len().saturating_sub(9)).find_map(|i| {
        let w = &b[i..i + 10];
        let digits = |r: std::ops::Range<usize>| w[r].iter().all(u8::is_ascii_digit);
        let boundary = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        (boundary
            && w[0] == b'2'
            && w[1] == b'0'
            && digits(0..4)
            && w[4] == b'-'
            && digits(5..7)
            && w[7] == b'-'
            && digits(8..10))
        .then(|| String::from_utf8_lossy(w).into_owned())
    })
}

/// Dependency lines in `manifest` that have no `#` comment on the line above.
fn uncommented_deps(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_deps = false;
    let mut prev = "";
    for line in manifest.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_deps = l.trim_matches(['[', ']']).ends_with("dependencies");
        } else if in_deps && !l.is_empty() && !l.starts_with('#') && l.contains('=') && !prev.starts_with('#') {
            out.push(l.split('=').next().unwrap_or(l).trim().to_owned());
        }
        if !l.is_empty() {
            prev = l;
        }
    }
    out
}

fn env_vars_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("R2CCL_") {
        let start = i + pos;
        let preceded_by_ident = start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start + "R2CCL_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_uppercase() || bytes[end].is_ascii_digit() || bytes[end] == b'_')
        {
            end += 1;
        }
        let name = text[start..end].trim_end_matches('_');
        if !preceded_by_ident && name.len() > "R2CCL".len() && !name.contains("__") {
            out.push(name.to_owned());
        }
        i = end;
    }
    out
}

/// Run every check; each problem is one line naming the file.
/// Lines a source file may have: small enough to read in one sitting.
const LINE_BUDGET: usize = 1000;

/// Files over [`LINE_BUDGET`] and why each still is; the list only shrinks (a file back under
/// the budget must leave it). Empty: every file is within the budget.
const LONG_FILES: &[(&str, &str)] = &[];

pub(crate) fn check(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    for dir in member_dirs(root) {
        rust_files(&dir, &mut files);
    }
    rust_files(&root.join("fuzz"), &mut files);

    for (f, _) in LONG_FILES {
        if !root.join(f).is_file() {
            problems.push(format!("tidy's LONG_FILES names {f}, which does not exist: remove it"));
        }
    }
    let config_doc = fs::read_to_string(root.join("docs/configuration.md")).unwrap_or_default();
    if config_doc.is_empty() {
        problems.push("docs/configuration.md is missing".into());
    }
    let mut undocumented: Vec<String> = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap_or_default();
        let r = rel(root, f);
        if !text.trim_start_matches('\u{feff}').starts_with("//!") {
            problems.push(format!("{r}: does not start with a `//!` line saying what the file is for"));
        }
        let lines = text.lines().count();
        let allowed = LONG_FILES.iter().any(|(f, _)| *f == r);
        if lines > LINE_BUDGET && !allowed {
            problems.push(format!("{r}: {lines} lines, over the budget of {LINE_BUDGET}: split it at its seams"));
        }
        if lines <= LINE_BUDGET && allowed {
            problems.push(format!("{r}: {lines} lines, within the budget: remove it from tidy's LONG_FILES"));
        }
        let is_library =
            r.starts_with("crates/") && r.contains("/src/") && !r.contains("/src/bin/") && !r.ends_with("/src/main.rs");
        if is_library {
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or("");
                if line.trim_start().starts_with("#[cfg(test)]") {
                    break;
                }
                if ["println!(", "print!(", "eprintln!(", "eprint!(", "dbg!("].iter().any(|m| code.contains(m)) {
                    problems.push(format!("{r}:{}: library code must not print; emit a tracing event", n + 1));
                }
            }
        }
        // Test code may name made-up variables (typos on purpose); product code may not.
        let product_code = text.split("#[cfg(test)]").next().unwrap_or("");
        let vars = if r.contains("/tests/") { Vec::new() } else { env_vars_in(product_code) };
        for var in vars {
            if !config_doc.contains(&var) && !undocumented.contains(&var) {
                problems.push(format!("{r}: environment variable {var} is not documented in docs/configuration.md"));
                undocumented.push(var);
            }
        }
    }

    // Metric names are string constants in files called metrics.rs; each must be in docs/metrics.md.
    let metrics_doc = fs::read_to_string(root.join("docs/metrics.md")).unwrap_or_default();
    for f in files.iter().filter(|f| f.file_name().is_some_and(|n| n == "metrics.rs")) {
        let text = fs::read_to_string(f).unwrap_or_default();
        for name in text.split('"').skip(1).step_by(2).filter(|s| s.starts_with("r2ccl_")) {
            if !metrics_doc.contains(&format!("`{name}`")) {
                problems.push(format!("{}: metric {name} is not documented in docs/metrics.md", rel(root, f)));
            }
        }
    }

    let arch = fs::read_to_string(root.join("docs/ARCHITECTURE.md")).unwrap_or_default();
    for doc in ["README.md", "docs/ARCHITECTURE.md"] {
        if let Some(date) = has_date(&fs::read_to_string(root.join(doc)).unwrap_or_default()) {
            problems.push(format!("{doc}: carries a date ({date}); history belongs in commit messages"));
        }
    }
    let members = member_crates(root);
    let drawn = drawn_graph(&arch, &members);
    for dir in member_dirs(root) {
        let manifest = fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
        let Some(name) = package_name(&manifest) else { continue };
        let mut declared: Vec<String> = normal_deps(&manifest).into_iter().filter(|d| members.contains(d)).collect();
        declared.sort();
        match drawn.get(&name) {
            None => problems.push(format!("docs/ARCHITECTURE.md: the dependency graph has no line for `{name}`")),
            Some(d) => {
                let mut d = d.clone();
                d.sort();
                if d != declared {
                    problems.push(format!(
                        "docs/ARCHITECTURE.md: the dependency graph says `{name}` -> {d:?}; its Cargo.toml says {declared:?}"
                    ));
                }
            }
        }
    }
    for dir in member_dirs(root) {
        let manifest_path = dir.join("Cargo.toml");
        let manifest = fs::read_to_string(&manifest_path).unwrap_or_default();
        let r = rel(root, &manifest_path);
        let Some(name) = package_name(&manifest) else {
            problems.push(format!("{r}: no [package] name"));
            continue;
        };
        if !arch.contains(&format!("`{name}`")) {
            problems.push(format!("{r}: crate `{name}` is not in the codemap of docs/ARCHITECTURE.md"));
        }
        if !manifest.contains("[lints]\nworkspace = true") {
            problems.push(format!("{r}: missing `[lints] workspace = true`"));
        }
        for dep in uncommented_deps(&manifest) {
            problems.push(format!("{r}: dependency `{dep}` has no `#` comment above it saying why it exists"));
        }
    }
    let root_manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    let internal: Vec<&str> = root_manifest
        .lines()
        .filter(|l| l.contains("path = \"crates/"))
        .filter_map(|l| l.split('=').next().map(str::trim))
        .collect();
    for dep in uncommented_deps(&root_manifest) {
        if !internal.contains(&dep.as_str()) {
            problems.push(format!("Cargo.toml: workspace dependency `{dep}` has no `#` comment above it"));
        }
    }

    let mut configs: Vec<PathBuf> = fs::read_dir(root.join("configs"))
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    configs.sort();
    for path in configs.iter().filter(|p| p.extension().is_some_and(|e| e == "toml")) {
        let r = rel(root, path);
        match fs::read_to_string(path) {
            Ok(text) => {
                if let Err(e) = r2ccl_config::load_str(&text, &r) {
                    problems.push(format!("{r}: {e}"));
                }
            }
            Err(e) => problems.push(format!("{r}: {e}")),
        }
    }
    let topo_dir = root.join("configs/topo");
    if topo_dir.is_dir() {
        let mut topo_sources = Vec::new();
        rust_files(&root.join("crates/r2ccl-topo"), &mut topo_sources);
        let topo_text: String = topo_sources.iter().filter_map(|p| fs::read_to_string(p).ok()).collect();
        for entry in fs::read_dir(&topo_dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".toml") && !topo_text.contains(&name) {
                problems.push(format!("configs/topo/{name}: not loaded by any r2ccl-topo test or preset table"));
            }
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_is_tidy() {
        let problems = check(&crate::workspace_root());
        assert!(problems.is_empty(), "tidy problems:\n{}", problems.join("\n"));
    }

    #[test]
    fn finds_env_vars_and_uncommented_deps() {
        assert_eq!(env_vars_in("x R2CCL_DEBUG_FILE, R2CCL_DETECT__X R2CCL_ MY_R2CCL_Y"), vec!["R2CCL_DEBUG_FILE"]);
        let m = "[dependencies]\n# why\na = 1\nb = 2\n\n[dev-dependencies]\n# why c\nc = 1\n";
        assert_eq!(uncommented_deps(m), vec!["b"]);
    }
}
