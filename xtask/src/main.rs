//! xtask: the project's automation, run as `cargo xtask <command>`.
//!
//! Commands: `setup` (install system packages and tools), `ci` (everything CI checks),
//! `codegen` (regenerate the UCX bindings), `testbed` (namespaces multi-NIC cluster),
//! `tidy` (repository conventions), `bench` (all benchmarks), `python` (the Python package), `demo` (the main job),
//! `crates` (packaging and crate checks), `e2e`, `fuzz`, `gpu-check`. Kept lean: std, anyhow and the config loader; `bench` adds serde_json
//! and plotters (bitmap PNGs, pure-Rust text).
#![allow(clippy::print_stdout, clippy::print_stderr, reason = "a command-line tool reports on the terminal")]

mod bench;
mod ci;
mod codegen;
mod crates;
mod e2e;
mod fuzz;
mod gpu;
mod predict;
mod python;
mod setup;
mod testbed;
mod tidy;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  setup   install the Debian packages and cargo tools the project needs (idempotent; needs root)
  ci      setup, then fmt check, clippy -D warnings, build, tests, per-crate builds, tidy, rules, e2e, python,
          fuzz, crates, cargo deny
  tidy    check repository conventions (also runs as a test)
  crates  cargo package of every publishable crate, no native library under the light crates
          (core, algo, detect, policy, topo with default features), the MSRV build, advisories
  testbed up|down|status|check|fault   multi-NIC cluster from network namespaces (root)
          up [--nodes N] [--nics K] [--rate 1gbit|none] [--prefix P]
  e2e [--scenario NAME] [--seed S] [--retries N] [--loopback]
          fault scenarios (tests/scenarios) on the testbed with real ranks (root; --loopback: on lo, no root)
          [--chaos N [--first I]]: N seeded random fault schedules; [--storm [--nodes 3..8] [--nics 2..4]
          [--ranks-per-node G] [--harsh]]: a fault storm; --gpu: the GPU scenarios (as gpu-check)
  codegen regenerate crates/r2ccl-ucx-sys/src/bindings.rs with bindgen (needs libclang-dev)
  bench [--quick] [--part P,...] [--rate R] [--reps N] [--loopback-nics K]
          the issue-7 benchmarks: faultfree, strategies, pause, timeline (root: namespaces testbed r2b)
          and loopback (r2ccl vs OpenMPI vs Gloo); writes target/bench/report.{json,md} and PNG plots
  bench --micro   the micro benchmarks (cargo bench --workspace)
  fuzz [--seconds N] [--save] [TARGET...]  the cargo-fuzz targets in fuzz/ (nightly), N s each
  gpu-check [--pack] [-- -n RANKS -e MAXBYTES]  build r2ccl-perf with CUDA, pack it with UCX into gpu-pack/ and
          run gpu-pack/gpu-check.sh (a GPU machine): every collective on host and GPU buffers, NIC faults
          under GPU AllReduces, one table; --pack: pack only (for a runner without toolchain)
  help    this text; `cargo xtask COMMAND --help` prints one command's
  python [--bench]  the Python package in .venv: pip install ./python, its tests (numpy API,
          torch.distributed backend), the DDP example with a NIC failure, torchrun; --bench: r2ccl vs gloo
  demo    the main job: 4 ranks x 2 NICs on loopback, AllReduce timeline with a NIC failure injected
          mid-run (R2CCL_FAULT); prints bus bandwidth before/during/after, failovers and the strategy";

fn main() {
    if let Err(e) = run() {
        eprintln!("xtask: error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    load_built_ucx();
    // `cargo xtask CMD --help` (or -h) prints the command's usage and runs nothing.
    if let Some(cmd) = args.first().filter(|_| args.iter().skip(1).any(|a| a == "-h" || a == "--help")) {
        println!("{}", command_help(cmd).with_context(|| format!("unknown command `{cmd}`\n{USAGE}"))?);
        return Ok(());
    }
    match args.first().map(String::as_str) {
        Some("setup") => setup::run(),
        Some("ci") => ci::run(&root),
        Some("tidy") => {
            let problems = tidy::check(&root);
            if problems.is_empty() {
                println!("tidy: ok");
                Ok(())
            } else {
                for p in &problems {
                    eprintln!("tidy: {p}");
                }
                bail!("tidy found {} problem(s)", problems.len())
            }
        }
        Some("crates") => crates::run(&root),
        Some("codegen") => codegen::run(&root),
        Some("testbed") => testbed::main(&args[1..]),
        Some("e2e") => e2e::main(&args[1..]),
        Some("bench") => bench::main(&args[1..]),
        Some("fuzz") => fuzz::main(&args[1..]),
        Some("gpu-check") => gpu::main(&args[1..]),
        Some("python") => python::main(&args[1..]),
        Some("demo") => demo(&args[1..]),
        Some("-h" | "--help" | "help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n{USAGE}"),
    }
}

/// The usage of one command: its lines of [`USAGE`] (its own, longer usage for `bench`).
fn command_help(cmd: &str) -> Option<String> {
    if cmd == "bench" {
        return Some(bench::USAGE.to_owned());
    }
    let mut out = Vec::new();
    let mut inside = false;
    for line in USAGE.lines() {
        let starts = line.strip_prefix("  ").is_some_and(|l| !l.starts_with(' '));
        if starts {
            inside = line.split_whitespace().next() == Some(cmd);
        }
        if inside {
            out.push(line.trim_start().to_owned());
        }
    }
    (!out.is_empty()).then(|| format!("usage: cargo xtask {}", out.join("\n  ")))
}

/// The main job: build r2ccl-perf (release) and run its failure demo.
fn demo(extra: &[String]) -> Result<()> {
    // On a fresh machine UCX comes first; nothing the demo does not use.
    setup::run_for_demo()?;
    cmd("cargo", &["build", "--release", "--quiet", "-p", "r2ccl-perf"])?;
    let exe = target_dir().join("release/r2ccl-perf");
    let mut args: Vec<String> = [
        "launch",
        "-n",
        "4",
        "--nics",
        "2",
        "--fail",
        "rank=1,nic=0,after_ms=3000,kind=down",
        "all_reduce",
        "-b",
        "16M",
        "-e",
        "16M",
        "-N",
        "0",
        "--duration",
        "8",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    args.extend(extra.iter().cloned());
    println!("$ r2ccl-perf {}", args.join(" "));
    let status = Command::new(&exe)
        .args(&args)
        .env("R2CCL_DEBUG", "ERROR")
        .status()
        .with_context(|| format!("starting {}", exe.display()))?;
    if !status.success() {
        bail!("the demo failed ({status}); see the lines above");
    }
    Ok(())
}

/// The workspace root: the parent of this crate's manifest directory.
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Put the UCX the workspace builds against (`R2CCL_UCX_DIR`, which `.cargo/config.toml` sets to
/// the wheel in `.ucx/`) first in `LD_LIBRARY_PATH` for every command started from here: cargo
/// builds the search path of the binaries it runs from the real environment, not from its `[env]`
/// table. An empty `R2CCL_UCX_DIR` (the system's UCX) leaves it alone.
pub(crate) fn load_built_ucx() {
    let Some(dir) = std::env::var_os("R2CCL_UCX_DIR").filter(|d| !d.is_empty()) else { return };
    let lib = workspace_root().join(dir).join("lib");
    if !lib.join("pkgconfig/ucx.pc").is_file() {
        return;
    }
    let mut paths = vec![lib.clone()];
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        paths.extend(std::env::split_paths(&old).filter(|p| !p.as_os_str().is_empty() && *p != lib));
    }
    if let Ok(joined) = std::env::join_paths(paths) {
        // xtask starts no thread of its own before this (at start, and in setup).
        std::env::set_var("LD_LIBRARY_PATH", joined);
    }
}

/// Where cargo puts what it builds: `CARGO_TARGET_DIR` (relative to the workspace root when
/// relative), else `target/`.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(d) => workspace_root().join(d),
        None => workspace_root().join("target"),
    }
}

/// Print a report line for the user.
fn say(text: &str) {
    println!("{}", text.trim_end());
}

/// Run a command, echoing it, and fail if it fails.
fn cmd(program: &str, args: &[&str]) -> Result<()> {
    println!("$ {program} {}", args.join(" "));
    let status = Command::new(program).args(args).status().with_context(|| format!("starting `{program}`"))?;
    if !status.success() {
        bail!("`{program} {}` failed with {status}", args.join(" "));
    }
    Ok(())
}

/// As [`cmd`], with extra environment variables.
fn cmd_env(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("$ {} {program} {}", shown.join(" "), args.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .with_context(|| format!("starting `{program}`"))?;
    if !status.success() {
        bail!("`{} {program} {}` failed with {status}", shown.join(" "), args.join(" "));
    }
    Ok(())
}

/// Whether a command runs and exits 0 (output discarded).
/// Whether this process runs as root (`id -u` is 0).
pub(crate) fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).output().map(|o| o.status.success()).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_answers_help() {
        for cmd in [
            "setup",
            "ci",
            "tidy",
            "crates",
            "testbed",
            "e2e",
            "codegen",
            "bench",
            "fuzz",
            "gpu-check",
            "python",
            "demo",
            "help",
        ] {
            let help = command_help(cmd).unwrap_or_else(|| panic!("no help for `{cmd}`"));
            assert!(help.contains(cmd), "{cmd}: {help}");
        }
        assert!(command_help("nosuch").is_none());
    }
}
