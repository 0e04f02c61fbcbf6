//! `cargo xtask fuzz`: build the cargo-fuzz targets in `fuzz/` with the nightly toolchain and
//! libFuzzer's coverage instrumentation (what `cargo fuzz build` does, without installing it),
//! then run each for a bounded time on its corpus.
//!
//! Corpora live in `fuzz/corpus/<target>/` (kept in the repository); a run reads them and writes
//! what it finds to `target/fuzz/<target>/` (not kept; `--save` merges it back, minimized). A
//! crash is saved under `target/fuzz/artifacts/<target>/` and fails the run: turn it into a
//! regression test (the input under the crate's tests) before fixing it.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

const USAGE: &str = "usage: cargo xtask fuzz [--seconds N] [--save] [--stable] [TARGET...]
  builds fuzz/ with nightly + libFuzzer instrumentation, runs every target (or those named) for N
  seconds each (default 20) on fuzz/corpus/TARGET; --save merges new inputs into fuzz/corpus;
  --stable (or no nightly installed) builds with the stable toolchain and RUSTC_BOOTSTRAP=1";

/// libFuzzer's instrumentation, as cargo-fuzz passes it (plus AddressSanitizer for the unsafe code).
const RUSTFLAGS: &str = "-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks \
    -Zsanitizer=address";

/// The targets: `fuzz/Cargo.toml`'s `[[bin]]` names.
fn targets(root: &Path) -> Result<Vec<String>> {
    let toml = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).context("reading fuzz/Cargo.toml")?;
    Ok(toml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("name = \"")?.strip_suffix('"').map(str::to_owned))
        .filter(|n| n != "r2ccl-fuzz")
        .collect())
}

/// The toolchain's host triple (`rustc -vV`).
fn host_triple(toolchain: &str) -> Result<String> {
    let out = Command::new("rustc").args([toolchain, "-vV"]).output().context("running rustc -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .context("rustc -vV names no host")
}

pub(crate) fn main(args: &[String]) -> Result<()> {
    let root = crate::workspace_root();
    let mut seconds = 20u32;
    let mut save = false;
    let mut stable = false;
    let mut chosen = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => seconds = it.next().and_then(|v| v.parse().ok()).context(USAGE)?,
            "--save" => save = true,
            "--stable" => stable = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            t if !t.starts_with('-') => chosen.push(t.to_owned()),
            other => bail!("unknown option {other}\n{USAGE}"),
        }
    }
    let all = targets(&root)?;
    if let Some(bad) = chosen.iter().find(|t| !all.contains(t)) {
        bail!("no fuzz target {bad}; the targets are {}", all.join(" "));
    }
    let run: Vec<String> = if chosen.is_empty() { all } else { chosen };
    let target_dir = root.join("target/fuzz/build");
    let start = Instant::now();
    // The -Z flags need nightly; where there is none (a machine with one toolchain), the stable
    // compiler takes them with RUSTC_BOOTSTRAP=1, loudly.
    let nightly = !stable && Command::new("rustc").args(["+nightly", "-V"]).output().is_ok_and(|o| o.status.success());
    let toolchain = if nightly { "+nightly" } else { "+stable" };
    if !nightly {
        println!("******** fuzz: building with the stable toolchain and RUSTC_BOOTSTRAP=1 (no nightly, or --stable)");
    }
    // An explicit --target keeps RUSTFLAGS off build scripts and proc macros (as cargo-fuzz does).
    let triple = host_triple(toolchain)?;
    println!(
        "$ RUSTFLAGS=... cargo {toolchain} build --release --manifest-path fuzz/Cargo.toml --bins --target {triple}"
    );
    let mut build = Command::new("cargo");
    build
        .args([toolchain, "build", "--release", "--manifest-path", "fuzz/Cargo.toml", "--bins", "--target", &triple])
        .env("RUSTFLAGS", RUSTFLAGS)
        .env("CARGO_TARGET_DIR", target_dir.join(&toolchain[1..]));
    if !nightly {
        build.env("RUSTC_BOOTSTRAP", "1");
    }
    let status = build.status().context("running cargo")?;
    if !status.success() {
        bail!("building the fuzz targets failed ({status})");
    }
    println!("fuzz: built in {:.0} s", start.elapsed().as_secs_f64());
    let mut report = Vec::new();
    for t in &run {
        let exe = target_dir.join(&toolchain[1..]).join(&triple).join("release").join(t);
        let corpus = root.join("fuzz/corpus").join(t);
        let work = root.join("target/fuzz").join(t);
        let artifacts = root.join("target/fuzz/artifacts").join(t);
        for d in [&corpus, &work, &artifacts] {
            std::fs::create_dir_all(d)?;
        }
        let t0 = Instant::now();
        let out = Command::new(&exe)
            .arg(&work)
            .arg(&corpus)
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .args(["-rss_limit_mb=2048", "-max_len=65536", "-timeout=10", "-print_final_stats=1"])
            .env("ASAN_OPTIONS", "detect_leaks=0")
            .output()
            .with_context(|| format!("running {}", exe.display()))?;
        let text = String::from_utf8_lossy(&out.stderr);
        let runs = text
            .lines()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .map_or("?".into(), |v| v.trim().to_owned());
        let files = |d: &Path| std::fs::read_dir(d).map_or(0, |r| r.count());
        println!(
            "fuzz: {t}: {} in {:.0} s, {runs} runs, corpus {} in the repository + {} new",
            if out.status.success() { "ok" } else { "FAILED" },
            t0.elapsed().as_secs_f64(),
            files(&corpus),
            files(&work)
        );
        if !out.status.success() {
            eprintln!(
                "{}",
                text.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
            );
            report.push(t.clone());
        }
        if save && out.status.success() {
            let status = Command::new(&exe).arg("-merge=1").arg(&corpus).arg(&work).output()?.status;
            if !status.success() {
                bail!("merging the corpus of {t} failed");
            }
        }
    }
    if !report.is_empty() {
        bail!("fuzz targets failed: {} (inputs under target/fuzz/artifacts/)", report.join(" "));
    }
    println!("fuzz: {} target(s) ran {seconds} s each, nothing found", run.len());
    Ok(())
}
