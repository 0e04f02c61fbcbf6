//! CI checks of the crates as others pick them: packaging, system libraries under the light
//! crates, the declared minimum Rust version, and security advisories.

use crate::cmd;
use anyhow::{bail, Context as _, Result};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// Crates meant to be picked alone into other systems: with default features they must link no
/// system library (UCX, hwloc, udev, ...).
pub(crate) const LIGHT: &[&str] = &["r2ccl-core", "r2ccl-algo", "r2ccl-detect", "r2ccl-policy", "r2ccl-topo"];

fn stdout_of(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| format!("starting `{program}`"))?;
    if !out.status.success() {
        bail!("`{program} {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The packages that declare a native library (`links`), with every feature of the workspace on.
fn linking_packages() -> Result<BTreeSet<String>> {
    let meta = stdout_of("cargo", &["metadata", "--all-features", "--format-version", "1"])?;
    let v: serde_json::Value = serde_json::from_str(&meta).context("parsing `cargo metadata`")?;
    let packages = v["packages"].as_array().context("`cargo metadata` lists no packages")?;
    Ok(packages
        .iter()
        .filter(|p| p["links"].is_string())
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect())
}

/// Each of [`LIGHT`], built alone with its default features, pulls in no package that links a
/// native library.
pub(crate) fn light_crates_link_nothing() -> Result<()> {
    let linking = linking_packages()?;
    println!("crates: packages that link a native library (any feature): {linking:?}");
    for krate in LIGHT {
        let tree = stdout_of("cargo", &["tree", "-p", krate, "-e", "normal,build", "--prefix", "none", "-f", "{p}"])?;
        let names: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
        let bad: Vec<&&str> = names.iter().filter(|n| linking.contains(**n)).collect();
        if !bad.is_empty() {
            bail!("{krate} with default features pulls in {bad:?}, which link native libraries");
        }
        println!("crates: {krate}: {} packages, none links a native library", names.len());
    }
    Ok(())
}

/// The workspace's `rust-version`.
pub(crate) fn msrv(root: &Path) -> Result<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).context("reading Cargo.toml")?;
    manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("rust-version = \"")?.strip_suffix('"').map(str::to_owned))
        .context("Cargo.toml declares no rust-version")
}

/// Every crate type-checks, tests and examples included, with the declared minimum Rust.
pub(crate) fn check_msrv(root: &Path) -> Result<()> {
    let v = msrv(root)?;
    let toolchain = if v.matches('.').count() == 1 { format!("{v}.0") } else { v };
    cmd("rustup", &["toolchain", "install", &toolchain, "--profile", "minimal", "--no-self-update"])?;
    cmd("cargo", &[&format!("+{toolchain}"), "check", "--workspace", "--all-targets", "--quiet"])
}

/// `cargo deny check advisories` when the advisory database can be fetched; a loud note when it
/// cannot (it lives on github.com, which CI machines may not reach).
pub(crate) fn advisories() -> Result<()> {
    let out = Command::new("cargo").args(["deny", "check", "advisories"]).output().context("starting cargo deny")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        println!("crates: advisories ok");
        return Ok(());
    }
    if text.contains("failed to fetch advisory database") {
        println!(
            "******** SKIPPED cargo deny check advisories: the RustSec database (github.com) cannot be fetched from this machine ********"
        );
        return Ok(());
    }
    bail!("cargo deny check advisories failed:\n{text}")
}

/// `cargo xtask crates`: every check above.
pub(crate) fn run(root: &Path) -> Result<()> {
    // Each publishable crate is packed (manifest, file list, version requirements between them).
    // Not verified: cargo's verification unpacks each packed crate into a local registry once
    // per version and builds it once, so a later change under the same version would be checked
    // against the first sources; the per-crate step of CI builds the same sources alone instead.
    let unpublished = ["--exclude", "r2ccl-python", "--exclude", "r2ccl-tests", "--exclude", "xtask"];
    cmd("cargo", &[&["package", "--workspace", "--no-verify", "--allow-dirty", "--quiet"][..], &unpublished].concat())?;
    println!("crates: cargo package ok");
    light_crates_link_nothing()?;
    // docs.rs has no UCX: the bindings crate documents without finding or linking it.
    crate::cmd_env(
        "cargo",
        &["doc", "-p", "r2ccl-ucx-sys", "--no-deps", "--quiet"],
        &[
            ("DOCS_RS", "1"),
            ("PKG_CONFIG_LIBDIR", "/nonexistent"),
            ("PKG_CONFIG_PATH", ""),
            ("R2CCL_UCX_DIR", ""),
            ("CARGO_TARGET_DIR", "target/docs-rs"),
        ],
    )?;
    println!("crates: r2ccl-ucx-sys documents without UCX (DOCS_RS)");
    check_msrv(root)?;
    println!("crates: the workspace checks with Rust {}", msrv(root)?);
    advisories()
}
