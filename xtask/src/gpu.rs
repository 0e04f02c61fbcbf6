//! `cargo xtask gpu-check`: build `r2ccl-perf` with CUDA support, pack it with the UCX
//! libraries and transport modules it loads into `gpu-pack/` (git-ignored, no static archives,
//! well under the GPU runner's 64 MiB), and run the packed `gpu-check.sh` there: every
//! collective on host and GPU buffers and NIC faults under GPU AllReduces, one table.
//!
//! `--pack` stops after packing: the GPU runner has no network and maybe no toolchain, so the
//! folder travels with the working tree (`carry: ["gpu-pack"]`) and the one command there is
//! `bash gpu-pack/gpu-check.sh`. `cargo xtask e2e --gpu` runs the same scenarios.

use crate::{cmd, target_dir};
use anyhow::{bail, Context, Result};
use std::path::Path;

/// The pack's folder, relative to the workspace root.
pub(crate) const PACK: &str = "gpu-pack";
/// The runner's limit on what travels with the working tree.
const PACK_LIMIT: u64 = 64 << 20;
/// UCX libraries the binary links (by soname) and transport modules UCX loads (the CUDA ones
/// included, for a runner whose UCX handles device memory; TCP lives in libuct itself).
const UCX_LIBS: [&str; 5] = ["libucp.so.0", "libucs.so.0", "libuct.so.0", "libucm.so.0", "libucs_signal.so.0"];
const UCX_MODULES: [&str; 3] = ["libuct_cma.so.0", "libuct_cuda.so.0", "libucm_cuda.so.0"];

const SCRIPT: &str = r##"#!/usr/bin/env bash
# r2ccl gpu-check: one command for a GPU machine without network or toolchain. Runs the
# r2ccl-perf packed beside it with the UCX libraries and modules packed beside it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$here/lib/ucx"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/# GPU: /'
else
  echo "# nvidia-smi not found"
fi
status=0
timeout 240 "$here/bin/r2ccl-perf" gpu-check "$@" || status=$?
# The torch backend on CUDA tensors: 2 ranks of python/_worker.py's `cuda` case, with the
# packed extension, in the first Python that has torch with CUDA (R2CCL_PYTHON to choose).
py=""
for c in "${R2CCL_PYTHON:-}" python3 python; do
  if [ -n "$c" ] && "$c" -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then py="$c"; break; fi
done
if [ -z "$py" ]; then
  echo "# torch backend on CUDA tensors: SKIPPED (no Python with torch and CUDA; set R2CCL_PYTHON)"
else
  tmp="$(mktemp -d)"
  for r in 0 1; do
    R2CCL_NODE="node$r" R2CCL_NICS=lo,lo PYTHONPATH="$here/python" \
      timeout 50 "$py" "$here/python/_worker.py" cuda "$r" 2 "$tmp/store" > "$tmp/rank$r.log" 2>&1 &
  done
  wait
  if grep -q "^OK cuda" "$tmp/rank0.log" && grep -q "^OK cuda" "$tmp/rank1.log"; then
    echo "# torch backend on CUDA tensors: exact ($(grep '^OK cuda' "$tmp/rank0.log"))"
  else
    echo "# torch backend on CUDA tensors: FAILED"; tail -n 15 "$tmp"/rank*.log; status=1
  fi
fi
exit "$status"
"##;

/// `cargo xtask gpu-check [--pack] [-- ARGS]`.
pub(crate) fn main(args: &[String]) -> Result<()> {
    let pack_only = args.iter().any(|a| a == "--pack");
    let rest: Vec<&str> = args.iter().skip_while(|a| *a != "--").skip(1).map(String::as_str).collect();
    cmd("cargo", &["build", "--release", "--quiet", "-p", "r2ccl-perf", "--features", "cuda"])?;
    // The Python extension as maturin builds it (abi3, with CUDA), for the torch check.
    cmd("cargo", &["build", "--release", "--quiet", "-p", "r2ccl-python", "--features", "extension-module,cuda"])?;
    let root = crate::workspace_root();
    let size = pack(&root)?;
    println!(
        "xtask: packed {PACK}/ ({:.1} MiB): bin/r2ccl-perf, lib/ (UCX), gpu-check.sh",
        size as f64 / (1 << 20) as f64
    );
    if pack_only {
        println!("xtask: on the GPU runner: bash {PACK}/gpu-check.sh   (carry: [\"{PACK}\"])");
        return Ok(());
    }
    let script = root.join(PACK).join("gpu-check.sh");
    cmd("bash", &[&[script.to_str().context("a non-UTF-8 path")?][..], &rest].concat())
}

/// Build `gpu-pack/` from the release binary and the UCX tree; its size in bytes.
fn pack(root: &Path) -> Result<u64> {
    let ucx = std::env::var("R2CCL_UCX_DIR").map_or_else(|_| root.join(crate::setup::UCX_DIR), Into::into);
    let ucx_lib = ucx.join("lib");
    if !ucx_lib.join(UCX_LIBS[0]).exists() {
        bail!("no UCX libraries in {} (run `cargo xtask setup`)", ucx_lib.display());
    }
    let dir = root.join(PACK);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin"))?;
    std::fs::create_dir_all(dir.join("lib/ucx"))?;
    let copy = |from: &Path, to: &Path| -> Result<()> {
        // `copy` follows symlinks: the pack holds plain files only.
        std::fs::copy(from, to).with_context(|| format!("copy {}", from.display()))?;
        Ok(())
    };
    let exe = dir.join("bin/r2ccl-perf");
    copy(&target_dir().join("release/r2ccl-perf"), &exe)?;
    // The release profile keeps line tables (debug = 1) for profiles; the runner needs none.
    cmd("strip", &["--strip-debug", exe.to_str().context("a non-UTF-8 path")?])?;
    for lib in UCX_LIBS {
        copy(&ucx_lib.join(lib), &dir.join("lib").join(lib))?;
    }
    for module in UCX_MODULES {
        let from = ucx_lib.join("ucx").join(module);
        if from.exists() {
            // UCX looks modules up with and without the ABI suffix, depending on the version.
            copy(&from, &dir.join("lib/ucx").join(module))?;
            copy(&from, &dir.join("lib/ucx").join(module.trim_end_matches(".0")))?;
        }
    }
    // The `r2ccl` Python package: its modules, the stripped extension, and the torch worker.
    let py = dir.join("python/r2ccl");
    std::fs::create_dir_all(&py)?;
    for entry in std::fs::read_dir(root.join("python/r2ccl"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "py" || e == "pyi") {
            copy(&path, &py.join(path.file_name().context("a file name")?))?;
        }
    }
    let ext = py.join("_r2ccl.abi3.so");
    copy(&target_dir().join("release/lib_r2ccl.so"), &ext)?;
    cmd("strip", &["--strip-debug", ext.to_str().context("a non-UTF-8 path")?])?;
    copy(&root.join("python/tests/_worker.py"), &dir.join("python/_worker.py"))?;
    std::fs::write(dir.join("gpu-check.sh"), SCRIPT)?;
    let size = dir_size(&dir)?;
    if size > PACK_LIMIT {
        bail!("{PACK}/ holds {size} bytes, over the GPU runner's {PACK_LIMIT}");
    }
    Ok(size)
}

/// Bytes of the plain files under `dir`.
fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() { dir_size(&entry.path())? } else { meta.len() };
    }
    Ok(total)
}
