//! `cargo xtask ci`: every check CI runs, in order, stopping at the first failure.

use crate::{cmd, cmd_env, crates, setup, tidy};
use anyhow::{bail, Result};
use std::path::Path;
use std::time::Instant;

fn step(name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    println!("\n=== ci: {name}");
    let t = Instant::now();
    f()?;
    println!("=== ci: {name}: ok ({:.1} s)", t.elapsed().as_secs_f64());
    Ok(())
}

pub(crate) fn run(root: &Path) -> Result<()> {
    let t = Instant::now();
    step("setup", setup::run)?;
    step("fmt", || cmd("cargo", &["fmt", "--all", "--", "--check"]))?;
    step("clippy, every feature", || {
        cmd("cargo", &["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"])
    })?;
    step("build", || cmd("cargo", &["build", "--workspace", "--all-targets"]))?;
    step("docs: cargo doc --workspace --no-deps, warnings denied", || {
        cmd_env("cargo", &["doc", "--workspace", "--no-deps", "--quiet"], &[("RUSTDOCFLAGS", "-D warnings")])
    })?;
    step("cuda feature: tests without a driver (the mock device and the named no-driver error)", || {
        cmd(
            "cargo",
            &[
                &["test", "-p", "r2ccl", "--features", "cuda"][..],
                &["--lib", "--test", "device_cuda", "--test", "device_mock"],
            ]
            .concat(),
        )
    })?;
    step("test", || cmd("cargo", &["test", "--workspace"]))?;
    step("test r2ccl-topo with hwloc (a non-default feature)", || {
        cmd("cargo", &["test", "-p", "r2ccl-topo", "--features", "hwloc"])
    })?;
    step("examples", || {
        // Each shows a crate used alone and checks what it prints; a wrong result exits non-zero.
        for (krate, example) in [
            ("r2ccl", "allreduce_threads"),
            ("r2ccl-detect", "detect_alone"),
            ("r2ccl-policy", "plan_failure"),
            ("r2ccl-topo", "discover_dump"),
        ] {
            cmd("cargo", &["run", "--quiet", "-p", krate, "--example", example])?;
        }
        Ok(())
    })?;
    step("each crate alone with default features", || {
        for krate in tidy::member_crates(root) {
            cmd("cargo", &["check", "--quiet", "-p", &krate])?;
        }
        Ok(())
    })?;
    step("tidy", || {
        let problems = tidy::check(root);
        for p in &problems {
            println!("tidy: {p}");
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("tidy found {} problem(s)", problems.len())
        }
    })?;
    step("alert rules: promtool check rules, promtool test rules (configs/prometheus)", || {
        let dir = root.join("configs/prometheus");
        let d = dir.to_string_lossy();
        cmd("promtool", &["check", "rules", &format!("{d}/r2ccl-rules.yml")])?;
        // Rule tests name their rule files relative to the test file's directory.
        cmd("sh", &["-c", &format!("cd '{d}' && promtool test rules r2ccl-rules.test.yml")])
    })?;
    step("e2e smoke on the namespace testbed", || {
        // Every scenario in tests/scenarios, then a short chaos batch with a fixed seed (the
        // seed fixes the fault timelines; the timing of the ranks still varies run to run).
        // One loud retry per scenario as a net for timing-dependent failures on a loaded 2-core
        // runner; RETRY/FLAKY lines say when it happened (the rare `all-nics-down` hang it was
        // added for is fixed: a collective a departed peer never joins now fails at once).
        cmd("cargo", &["xtask", "e2e", "--retries", "1"])?;
        cmd("cargo", &["xtask", "e2e", "--chaos", "3", "--seed", "2026"])?;
        // Two fault storms (4 x 2, about 40 faults in 10 s each): the timelines that found the
        // stale-payload, stale-lane and split-planning bugs of 2026-12-05.
        cmd("cargo", &["xtask", "e2e", "--chaos", "2", "--storm", "--seed", "2026"])?;
        // And one of small collectives (4 KiB AllGather: thousands of plans and agreements under
        // faults) on 4 x 3 NICs with two of a node's NICs faulted at once at times.
        cmd("cargo", &["xtask", "e2e", "--chaos", "1", "--first", "11", "--storm", "--nics", "3", "--seed", "2026"])?;
        // And a harsh one: 8 MiB ReduceScatter on 4 x 3 NICs with a NIC hot-unplugged for good
        // at 3.3 s, slow-NIC episodes, black holes and egress drops around it.
        cmd(
            "cargo",
            &["xtask", "e2e", "--chaos", "1", "--first", "2", "--storm", "--harsh", "--nics", "3", "--seed", "2026"],
        )?;
        // The fallback of machines without root, kept from rotting: every rank over `lo`, the
        // faults injected in software (a NIC down, a black hole, a slow NIC).
        for sc in ["nic-down", "blackhole", "slow-nic"] {
            cmd("cargo", &["xtask", "e2e", "--loopback", "--scenario", sc])?;
        }
        Ok(())
    })?;
    step(
        "python: pip install ./python in .venv, numpy and torch.distributed tests, DDP through a NIC failure, torchrun",
        || cmd("cargo", &["xtask", "python"]),
    )?;
    step("UCX 1.13 smoke (Debian's libucx-dev, target/ucx-1.13)", || {
        // Sites with an old system UCX stay supported: build against it (R2CCL_UCX_DIR empty means
        // pkg-config's UCX), load it (LD_LIBRARY_PATH empty), and run the UCX loopback session
        // tests and one e2e scenario on it.
        // RUSTFLAGS set (even empty) replaces .cargo/config.toml's, so these binaries carry no
        // run path to .ucx/ either.
        let env = [
            ("R2CCL_UCX_DIR", ""),
            ("LD_LIBRARY_PATH", ""),
            ("RUSTFLAGS", ""),
            ("CARGO_TARGET_DIR", "target/ucx-1.13"),
        ];
        cmd_env("cargo", &["test", "-p", "r2ccl-ucx", "--test", "session_loopback"], &env)?;
        cmd_env("cargo", &["xtask", "e2e", "--retries", "1", "--scenario", "nic-down"], &env)
    })?;
    step("fuzz: every target in fuzz/ for 20 s (nightly + libFuzzer, AddressSanitizer)", || {
        cmd("cargo", &["xtask", "fuzz", "--seconds", "20"])
    })?;
    step("cargo deny licenses, bans, sources", || cmd("cargo", &["deny", "check", "licenses", "bans", "sources"]))?;
    step("crates: cargo package, no native library under the light crates, the MSRV build, advisories", || {
        crates::run(root)
    })?;
    println!("\nci: all checks passed in {:.0} s", t.elapsed().as_secs_f64());
    Ok(())
}
