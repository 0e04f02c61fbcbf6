//! `cargo xtask setup`: install the system packages and cargo tools the project needs.

use crate::{cmd, succeeds};
use anyhow::{bail, Context as _, Result};
use std::path::Path;
use std::process::Command;

/// The UCX the project builds and runs against by default: UCX 1.22 from PyPI's `libucx-cu13`
/// wheel (TCP, shared memory, CUDA transports; no RDMA), unpacked into [`UCX_DIR`], where
/// `.cargo/config.toml` points the build (`R2CCL_UCX_DIR`) and the binaries (`LD_LIBRARY_PATH`).
pub(crate) const UCX_WHEEL: &str = "libucx-cu13==1.22.0";
/// Where the wheel's `libucx/` tree goes, relative to the workspace root.
pub(crate) const UCX_DIR: &str = ".ucx/libucx";

/// The Debian packages the demo needs (the rest of [`PACKAGES`] serves the tests and benchmarks):
/// the first this many entries.
const DEMO_PACKAGES: usize = 2;

/// Debian packages the build and tests need, with why; the demo's come first.
pub(crate) const PACKAGES: &[(&str, &str)] = &[
    ("pkg-config", "finds UCX (the wheel's ucx.pc or the system's) for r2ccl-ucx-sys"),
    ("libucx-dev", "the system UCX, the build's fallback when the UCX 1.22 wheel cannot be fetched"),
    ("libhwloc-dev", "hwloc topology discovery (r2ccl-topo's `hwloc` feature, tested in CI)"),
    ("libudev-dev", "needed by hwloc's PCI discovery through hwlocality"),
    ("iproute2", "network namespaces, veth and tc for the multi-NIC testbed"),
    ("prometheus", "a real Prometheus server scrapes a rank in the metrics test"),
    ("ucx-utils", "ucx_perftest, the baseline of the transport benchmark"),
    ("openmpi-bin", "mpirun, the OpenMPI peer of `cargo xtask bench --part loopback`"),
    ("libopenmpi-dev", "mpicc and MPI headers to build bench/peers/mpi_allreduce.c"),
    ("libgloo-dev", "Gloo, the other loopback peer (bench/peers/gloo_allreduce.cc)"),
    ("g++", "builds the Gloo peer"),
    ("fonts-dejavu-core", "a TTF font for the text of the benchmark plots (plotters ab_glyph)"),
    ("gdb", "e2e dumps every thread's stack of a hung rank before killing it"),
];

fn is_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// `cargo xtask setup`: everything the tests and benchmarks need.
pub(crate) fn run() -> Result<()> {
    install(PACKAGES, true)
}

/// What the demo needs only: UCX (the wheel, the system's as fallback) and pkg-config; no MPI,
/// Gloo, Prometheus or cargo tools.
pub(crate) fn run_for_demo() -> Result<()> {
    install(&PACKAGES[..DEMO_PACKAGES], false)
}

fn install(packages: &[(&str, &str)], tools: bool) -> Result<()> {
    let debian_like = Path::new("/etc/debian_version").exists() && succeeds("dpkg-query", &["--version"]);
    if !debian_like {
        let names: Vec<&str> = packages.iter().map(|(p, _)| *p).collect();
        bail!(
            "setup: this is not a Debian-like system (no /etc/debian_version or dpkg); install these \
             packages (or your distribution's equivalents) by hand: {}",
            names.join(" ")
        );
    }
    let missing: Vec<&str> = packages.iter().map(|(p, _)| *p).filter(|p| !is_installed(p)).collect();
    if missing.is_empty() {
        println!("setup: system packages present ({})", packages.len());
    } else if !crate::is_root() {
        bail!(
            "setup: missing Debian packages {}; run `cargo xtask setup` as root, or: sudo apt-get install -y {}",
            missing.join(", "),
            missing.join(" ")
        );
    } else {
        println!("setup: installing {}", missing.join(" "));
        cmd("apt-get", &["update", "-qq"])?;
        let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
        args.extend(&missing);
        let status = Command::new("apt-get")
            .args(&args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .context("starting `apt-get`")?;
        if !status.success() {
            bail!("setup: apt-get install {} failed with {status}", missing.join(" "));
        }
    }
    for component in ["clippy", "rustfmt"].into_iter().filter(|_| tools) {
        let probe = if component == "clippy" { ["clippy", "--version"] } else { ["fmt", "--version"] };
        if !succeeds("cargo", &probe) {
            cmd("rustup", &["component", "add", component])?;
        }
    }
    if let Err(e) = install_ucx_wheel(&crate::workspace_root()) {
        // Nothing half unpacked may stay where LD_LIBRARY_PATH points.
        let _ = std::fs::remove_dir_all(crate::workspace_root().join(".ucx"));
        // The build falls back to the system's UCX (Debian's libucx-dev, installed above) when
        // .ucx/ is missing: say so loudly rather than stop.
        println!(
            "******** setup: UCX 1.22 wheel NOT installed ({e:#}); builds and tests use the system UCX (pkg-config) ********"
        );
    }
    // A fresh clone had no .ucx/ when this process started: load what setup just unpacked.
    crate::load_built_ucx();
    if !tools {
        return Ok(());
    }
    if succeeds("cargo", &["deny", "--version"]) {
        println!("setup: cargo-deny present");
    } else {
        println!("setup: installing cargo-deny (a few minutes on 2 cores)");
        cmd("cargo", &["install", "cargo-deny", "--locked", "--no-default-features"])?;
    }
    Ok(())
}

/// Download the UCX wheel with pip (no install into any Python environment) and unpack its
/// `libucx/` tree into [`UCX_DIR`]; nothing to do when it is there already.
fn install_ucx_wheel(root: &Path) -> Result<()> {
    let dir = root.join(UCX_DIR);
    if dir.join("lib/pkgconfig/ucx.pc").is_file() {
        println!("setup: UCX wheel present ({})", dir.display());
        return Ok(());
    }
    println!("setup: downloading {UCX_WHEEL} into {}", dir.display());
    let download = root.join("target/ucx-wheel");
    std::fs::create_dir_all(&download).with_context(|| format!("creating {}", download.display()))?;
    let d = download.to_string_lossy().into_owned();
    cmd("python3", &["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", &d, UCX_WHEEL])?;
    let wheel = std::fs::read_dir(&download)
        .with_context(|| format!("reading {}", download.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("libucx_cu13-1.22.0")))
        .with_context(|| format!("pip left no libucx_cu13-1.22.0 wheel in {}", download.display()))?;
    let parent = dir.parent().context("UCX_DIR has a parent")?;
    let _ = std::fs::remove_dir_all(parent);
    cmd("python3", &["-m", "zipfile", "-e", &wheel.to_string_lossy(), &parent.to_string_lossy()])?;
    // Zip archives keep no modes: the tools (ucx_info, ucx_perftest) must be executable.
    for entry in std::fs::read_dir(dir.join("bin")).with_context(|| format!("reading {}/bin", dir.display()))? {
        let path = entry?.path();
        cmd("chmod", &["+x", &path.to_string_lossy()])?;
    }
    if !dir.join("lib/pkgconfig/ucx.pc").is_file() {
        bail!("setup: the wheel unpacked into {} holds no lib/pkgconfig/ucx.pc", parent.display());
    }
    Ok(())
}
