//! Benchmark: building one rank's ring AllReduce schedule for 1024 ranks (target < 1 ms
//! and < 1 MiB), plus a few other builders for scale.
#![allow(clippy::print_stdout, reason = "benchmark output")]
#![allow(clippy::unwrap_used, reason = "benchmark setup")]
#![allow(clippy::disallowed_methods, reason = "benchmarks may read the clock; the library may not")]

use r2ccl_algo::{build_rank_schedule, Collective, Fabric, Layout, ScheduleRequest, Strategy};
use r2ccl_core::{DType, HealthView, NicId, Rank, ReduceOp};
use std::time::Instant;

fn bench(name: &str, fabric: &Fabric, req: &ScheduleRequest, rank: Rank, iters: u32) {
    let mut mem = 0;
    let mut steps = 0;
    // Warm up.
    for _ in 0..3 {
        let s = build_rank_schedule(fabric, req, rank).unwrap();
        mem = s.memory_bytes();
        steps = s.steps().len();
    }
    let t0 = Instant::now();
    for _ in 0..iters {
        std::hint::black_box(build_rank_schedule(fabric, req, rank).unwrap());
    }
    let per = t0.elapsed().as_secs_f64() / f64::from(iters);
    println!(
        "{name}: {:.3} ms per rank schedule ({:.2}x the 1 ms target), {} steps, {:.1} KiB ({:.3}x the 1 MiB target)",
        per * 1e3,
        per / 1e-3,
        steps,
        mem as f64 / 1024.0,
        mem as f64 / (1024.0 * 1024.0)
    );
}

fn main() {
    let ranks = 1024;
    let layout = Layout::uniform(128, 8, 8).unwrap();
    let mut view = HealthView::uniform(128, 8, 400_000);
    view.set_failed(NicId::new(3, 2)).unwrap();
    let fabric = Fabric::new(layout, view).unwrap();
    let ar = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::Bf16, 1 << 28);
    bench(&format!("ring allreduce, {ranks} ranks, balance, rank 0"), &fabric, &ar, Rank(0), 200);
    bench(&format!("ring allreduce, {ranks} ranks, balance, rank 27 (degraded node)"), &fabric, &ar, Rank(27), 200);
    let fs = ar.clone().with_strategy(Strategy::FourStage);
    bench(&format!("four-stage allreduce, {ranks} ranks, leader rank 24"), &fabric, &fs, Rank(24), 50);
    let rs = ScheduleRequest::new(Collective::ReduceScatter { op: ReduceOp::Sum }, DType::F32, 1 << 16);
    bench(&format!("ring reducescatter, {ranks} ranks"), &fabric, &rs, Rank(5), 200);
}
