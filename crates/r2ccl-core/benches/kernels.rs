//! Benchmark: f32 and bf16 sum kernels against `copy_from_slice` on 64 MiB buffers.
//!
//! Effective bandwidth counts bytes read plus written: a reduction reads two buffers
//! and writes one (3 x 64 MiB), a copy reads one and writes one (2 x 64 MiB). Both are
//! measured in the same run (best of several repetitions) and the ratio is printed.
//! Target: f32 sum at least 0.8 of memcpy.
#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use half::bf16;
use r2ccl_core::kernels::reduce;
use r2ccl_core::ReduceOp;
use std::hint::black_box;
use std::time::{Duration, Instant};

const BYTES: usize = 64 << 20;

fn best_of(reps: usize, mut f: impl FnMut()) -> Duration {
    f(); // warm up: touch the pages
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e9
}

fn main() {
    let reps = std::env::var("R2CCL_BENCH_REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let n32 = BYTES / 4;
    let src32: Vec<f32> = (0..n32).map(|i| (i % 1024) as f32 * 0.5).collect();
    let mut dst32: Vec<f32> = vec![1.0; n32];
    let n16 = BYTES / 2;
    let src16: Vec<bf16> = (0..n16).map(|i| bf16::from_f32((i % 64) as f32)).collect();
    let mut dst16: Vec<bf16> = vec![bf16::from_f32(1.0); n16];
    let mut copy_dst: Vec<u8> = vec![0; BYTES];
    let copy_src: Vec<u8> = vec![7; BYTES];

    let t_copy = best_of(reps, || {
        copy_dst.copy_from_slice(black_box(&copy_src));
        black_box(&mut copy_dst);
    });
    let t_f32 = best_of(reps, || {
        let _ = reduce(ReduceOp::Sum, black_box(&mut dst32[..]), black_box(&src32[..]));
    });
    let t_bf16 = best_of(reps, || {
        let _ = reduce(ReduceOp::Sum, black_box(&mut dst16[..]), black_box(&src16[..]));
    });

    let bw_copy = gbps(2 * BYTES, t_copy);
    let bw_f32 = gbps(3 * BYTES, t_f32);
    let bw_bf16 = gbps(3 * BYTES, t_bf16);
    println!("# r2ccl-core reduction kernels, 64 MiB buffers, best of {reps}");
    println!("{:<22} {:>10} {:>12} {:>14}", "kernel", "time(ms)", "eff GB/s", "ratio-memcpy");
    println!("{:<22} {:>10.2} {:>12.2} {:>14.3}", "memcpy (copy_from_slice)", t_copy.as_secs_f64() * 1e3, bw_copy, 1.0);
    println!("{:<22} {:>10.2} {:>12.2} {:>14.3}", "f32 sum", t_f32.as_secs_f64() * 1e3, bw_f32, bw_f32 / bw_copy);
    println!("{:<22} {:>10.2} {:>12.2} {:>14.3}", "bf16 sum", t_bf16.as_secs_f64() * 1e3, bw_bf16, bw_bf16 / bw_copy);
    let ok = bw_f32 / bw_copy >= 0.8;
    println!("# f32 sum / memcpy = {:.3} (target >= 0.8): {}", bw_f32 / bw_copy, if ok { "MET" } else { "MISSED" });
}
