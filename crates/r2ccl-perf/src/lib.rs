//! r2ccl-perf: the benchmark users know from nccl-tests, for r2ccl.
//!
//! What it does: parses the nccl-tests flags ([`args`]), computes algorithm and bus
//! bandwidth with the nccl-tests factors and prints the same table and footer
//! ([`report`]), so existing dashboards and scripts read r2ccl results unchanged.
//!
//! What it does not do: it holds no communication code; the binary drives the `r2ccl`
//! facade.

pub mod args;
pub mod report;
