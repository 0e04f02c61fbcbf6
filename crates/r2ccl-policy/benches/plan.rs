//! Planning latency on the recovery path: 1024 nodes x 8 NICs with 10 failed NICs
//! (target: under 10 ms per plan), plus the exact re-ranking at 10 nodes.
#![allow(clippy::print_stdout, reason = "benchmarks print their figures")]
#![allow(clippy::disallowed_methods, reason = "benchmarks time with Instant::now; the library itself stays clock-free")]
#![allow(clippy::unwrap_used, reason = "benchmark setup with fixed, valid inputs")]

use r2ccl_core::{HealthView, NicId, ReduceOp};
use r2ccl_policy::{plan, rerank_exact, Collective, Topology};
use std::time::{Duration, Instant};

fn time<F: FnMut()>(iters: u32, mut f: F) -> (Duration, Duration) {
    let mut best = Duration::MAX;
    let start = Instant::now();
    for _ in 0..iters {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed());
    }
    (start.elapsed() / iters, best)
}

fn main() {
    let (n, k) = (1024usize, 8usize);
    let topo = Topology::uniform(n, k, 400_000).unwrap();
    let mut view = HealthView::uniform(n, k, 400_000);
    // 10 failures: spread over nodes and rails, two on the same node.
    for (i, (node, rail)) in
        [(3, 0), (97, 1), (98, 2), (200, 3), (311, 4), (311, 5), (512, 6), (640, 7), (777, 0), (1000, 3)]
            .into_iter()
            .enumerate()
    {
        let _ = i;
        view.set_failed(NicId::new(node, rail)).unwrap();
    }
    let target = Duration::from_millis(10);
    for bytes in [64u64 << 10, 1 << 30] {
        let p = plan(&topo, &view, Collective::AllReduce { op: ReduceOp::Sum }, bytes).unwrap();
        let (mean, best) = time(20, || {
            std::hint::black_box(plan(&topo, &view, Collective::AllReduce { op: ReduceOp::Sum }, bytes).unwrap());
        });
        println!(
            "plan AllReduce {bytes} B, 1024 nodes x 8 NICs, 10 failures: mean {:.3} ms, best {:.3} ms \
             ({:.2}x of the 10 ms target); chosen {} at {:.3}x t_nf, bound {:.3}x",
            mean.as_secs_f64() * 1e3,
            best.as_secs_f64() * 1e3,
            mean.as_secs_f64() / target.as_secs_f64(),
            p.chosen.name(),
            p.time_s / p.t_nf_s,
            p.lower_bound_s / p.t_nf_s
        );
    }
    // Exact re-ranking at the largest size it is used for, all nodes distinct.
    let topo10 = Topology::uniform(10, 4, 100_000).unwrap();
    let mut v10 = HealthView::uniform(10, 4, 100_000);
    for i in 0..10u32 {
        v10.set_failed(NicId::new(i, (i % 4) as u16)).unwrap();
        if i % 3 == 0 {
            v10.set_failed(NicId::new(i, ((i + 1) % 4) as u16)).unwrap();
        }
    }
    let (mean, best) = time(5, || {
        std::hint::black_box(rerank_exact(&topo10, &v10).unwrap());
    });
    println!(
        "exact re-ranking, 10 nodes x 4 NICs, 13 failures: mean {:.3} ms, best {:.3} ms",
        mean.as_secs_f64() * 1e3,
        best.as_secs_f64() * 1e3
    );
}
