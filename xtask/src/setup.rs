//! `cargo xtask setup`: install the system packages and cargo tools the project needs.

use crate::{cmd, succeeds};
use anyhow::{bail, Result};
use std::path::Path;
use std::process::Command;

/// Debian packages the build and tests need, with why.
pub(crate) const PACKAGES: &[(&str, &str)] = &[
    ("pkg-config", "finds system libraries for -sys crates"),
    ("libucx-dev", "UCX, the production transport (r2ccl-ucx)"),
    ("libhwloc-dev", "hwloc topology discovery (r2ccl-topo)"),
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

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

pub(crate) fn run() -> Result<()> {
    let debian_like = Path::new("/etc/debian_version").exists() && succeeds("dpkg-query", &["--version"]);
    if !debian_like {
        let names: Vec<&str> = PACKAGES.iter().map(|(p, _)| *p).collect();
        bail!(
            "setup: this is not a Debian-like system (no /etc/debian_version or dpkg); install these \
             packages (or your distribution's equivalents) by hand: {}",
            names.join(" ")
        );
    }
    let missing: Vec<&str> = PACKAGES.iter().map(|(p, _)| *p).filter(|p| !is_installed(p)).collect();
    if missing.is_empty() {
        println!("setup: system packages present ({})", PACKAGES.len());
    } else if !is_root() {
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
        let status = Command::new("apt-get").args(&args).env("DEBIAN_FRONTEND", "noninteractive").status()?;
        if !status.success() {
            bail!("setup: apt-get install {} failed with {status}", missing.join(" "));
        }
    }
    for component in ["clippy", "rustfmt"] {
        let probe = if component == "clippy" { ["clippy", "--version"] } else { ["fmt", "--version"] };
        if !succeeds("cargo", &probe) {
            cmd("rustup", &["component", "add", component])?;
        }
    }
    if succeeds("cargo", &["deny", "--version"]) {
        println!("setup: cargo-deny present");
    } else {
        println!("setup: installing cargo-deny (a few minutes on 2 cores)");
        cmd("cargo", &["install", "cargo-deny", "--locked", "--no-default-features"])?;
    }
    Ok(())
}
