//! `cargo xtask python`: the Python package end to end, in the project's own virtual
//! environment (`.venv/`, never the system Python).
//!
//! It creates `.venv` (once), installs torch, numpy and pytest into it (once), then
//! `pip install ./python` (the wheel build users run), checks that `import r2ccl.torch`
//! registers the backend, runs `python/tests` (the API on numpy buffers and the
//! torch.distributed suite), the DDP example (fault-free and with a NIC failure: identical
//! losses) and the same example under `torchrun`. `--bench` runs `python/bench/torch_bench.py`
//! instead of the tests (r2ccl against torch's gloo backend).

use crate::{cmd, cmd_env, succeeds, workspace_root};
use anyhow::{bail, Result};
use std::path::PathBuf;

/// The torch CI installs: PyPI's, which carries its CUDA libraries and runs on CPU here.
const TORCH: &str = "torch==2.15.*";

fn venv_python() -> PathBuf {
    workspace_root().join(".venv/bin/python")
}

/// `.venv` with torch, numpy and pytest, and the r2ccl package built from `python/`.
fn prepare() -> Result<String> {
    let py = venv_python();
    let pys = py.to_string_lossy().into_owned();
    if !py.is_file() {
        cmd("python3", &["-m", "venv", ".venv"])?;
    }
    if succeeds(&pys, &["-c", "import torch, numpy, pytest"]) {
        println!("python: torch, numpy and pytest present in .venv");
    } else {
        cmd(&pys, &["-m", "pip", "install", "--quiet", "--disable-pip-version-check", TORCH, "numpy", "pytest"])?;
    }
    // The build users run: a wheel of python/ built by maturin (release), installed with its
    // dependencies (the libucx-cu13 wheel the module loads UCX from).
    cmd(&pys, &["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "./python"])?;
    cmd(
        &pys,
        &[
            "-c",
            "import r2ccl.torch, torch.distributed as d; assert 'r2ccl' in d.Backend.backend_list; \
             print('python: import r2ccl.torch registered backend r2ccl; r2ccl', r2ccl.torch.r2ccl.__version__)",
        ],
    )?;
    Ok(pys)
}

pub(crate) fn main(args: &[String]) -> Result<()> {
    let mut bench = false;
    for a in args {
        match a.as_str() {
            "--bench" => bench = true,
            other => bail!("python: unknown argument `{other}` (usage: cargo xtask python [--bench])"),
        }
    }
    let py = prepare()?;
    if bench {
        return cmd(&py, &["python/bench/torch_bench.py"]);
    }
    // From the repository root, so that `import r2ccl` is the installed package.
    cmd(&py, &["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "python/tests"])?;
    cmd(&py, &["python/examples/ddp_train.py"])?;
    let torchrun = workspace_root().join(".venv/bin/torchrun");
    cmd_env(
        &torchrun.to_string_lossy(),
        &["--standalone", "--nproc-per-node", "4", "python/examples/ddp_train.py"],
        &[("R2CCL_NICS", "lo,lo"), ("OMP_NUM_THREADS", "1")],
    )
}
