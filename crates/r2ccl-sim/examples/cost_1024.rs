//! Where the wall time of the bench's 1024-GPU AllReduce goes (docs/reproduction.md, "Cost"): 128 x 8 GPUs and
//! NICs of 400 Gb/s, 256 MiB, NIC 2 of node 3 down from the start and NIC 5 of node 70 going down at 2 ms.
//! Without arguments it times the schedule (plan, build, conversion) and the simulation of each bench strategy;
//! `planner` does so for the planner's choice alone. `algo` times r2ccl-algo's build of the planner's schedule
//! alone (every rank, no conversion). `chunks K...` runs the planner's schedule with K pipeline chunks instead of
//! its own, with both failures and with the known one only, to measure what coalescing chunks would change.
//! `merged` times the planner's choice with merged rail parts (`convert::MergeRails`, an approximation) and then
//! exactly, and prints the approximation's error: makespan and every rank's finish time against the exact run
//! (`merged alone`: the merged run only; `merged known`: with the known failure only). `floor` measures what any
//! exact event-driven run of the planner's DAG must at least do, with none of the engine's work: every task taken
//! once from a binary heap in time order (durations without sharing, queues or failures) and every edge walked
//! once (with the queue a binary heap, then a radix heap); and the same walk in FIFO order, with no time order. Run with `cargo run --release -p r2ccl-sim
//! --example cost_1024 [planner | merged [alone] [known] | algo | floor | chunks K...]`.
#![allow(clippy::print_stdout, reason = "an example that prints its measurements")]
#![allow(clippy::disallowed_methods, reason = "it measures wall-clock time")]

use r2ccl_core::Rank;
use r2ccl_sim::collective::{build_allreduce, AllReduceJob, Scheme};
use r2ccl_sim::convert::{
    append_allreduce, append_allreduce_with, append_schedules, plan_allreduce, Choice, MergeRails,
};
use r2ccl_sim::engine::{simulate, Dag, Op};
use r2ccl_sim::workload::plan_health;
use r2ccl_sim::{EngineConfig, Fabric, FabricSpec, Failure, RepairMode, SimError};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Instant;

fn main() -> Result<(), SimError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fab = Fabric::new(FabricSpec::new(128, 8, 8, 400.0))?;
    let job = AllReduceJob { nodes: (0..128).collect(), bytes: 256.0 * 1048576.0, intra: true, chunks: 1 };
    let fails = [Failure::known_down(3, 2), Failure::down_at(70, 5, 0.002)];
    match args.first().map(String::as_str) {
        Some("algo") => algo_build(&fab, &job, &fails),
        Some("chunks") => {
            let ks: Vec<u32> = args[1..].iter().filter_map(|a| a.parse().ok()).collect();
            chunks(&fab, &job, &fails, &ks)
        }
        Some("planner") => phases(&fab, &job, &fails, &[Scheme::Planner]),
        Some("floor") => floor(&fab, &job, &fails),
        Some("merged") => {
            let known = args.iter().any(|a| a == "known");
            let fails = if known { &fails[..1] } else { &fails[..] };
            merged(&fab, &job, fails, args.iter().any(|a| a == "alone"))
        }
        _ => phases(
            &fab,
            &job,
            &fails,
            &[Scheme::Balance, Scheme::HotRepair, Scheme::Recursive, Scheme::Planner, Scheme::AlgoBalance],
        ),
    }
}

fn phases(fab: &Fabric, job: &AllReduceJob, fails: &[Failure], strategies: &[Scheme]) -> Result<(), SimError> {
    let h = plan_health(fab, fails);
    for &s in strategies {
        let t = Instant::now();
        let mut dag = Dag::new();
        match s.schedule_choice() {
            Some(choice) => {
                append_allreduce(&mut dag, fab, &h, job, choice, None)?;
            }
            None => {
                build_allreduce(&mut dag, fab, &h, s, job, None);
            }
        }
        let built = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let cfg = EngineConfig::with_repair(s.repair_mode());
        let r = simulate(fab, &dag, fails, &cfg)?;
        println!(
            "{:<12} schedule {built:.3} s, simulation {:.3} s: {} tasks, {} flows, {} events, makespan {:.17e} s",
            s.name(),
            t.elapsed().as_secs_f64(),
            dag.len(),
            r.flows,
            r.events,
            r.makespan
        );
    }
    Ok(())
}

fn merged(fab: &Fabric, job: &AllReduceJob, fails: &[Failure], alone: bool) -> Result<(), SimError> {
    let h = plan_health(fab, fails);
    let merge = MergeRails::around(fab, fails);
    let cfg = EngineConfig::with_repair(Scheme::Planner.repair_mode());
    let mut runs = Vec::new();
    let modes = [("merged", Some(&merge)), ("exact", None)];
    for (name, m) in modes.into_iter().take(if alone { 1 } else { 2 }) {
        let t = Instant::now();
        let mut dag = Dag::new();
        let (_, conv) = append_allreduce_with(&mut dag, fab, &h, job, Choice::Planner, None, m)?;
        let built = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let r = simulate(fab, &dag, fails, &cfg)?;
        let sim = t.elapsed().as_secs_f64();
        println!(
            "planner {name:<6} schedule {built:.3} s, simulation {sim:.3} s, total {:.3} s: {} tasks, {} flows, {} \
             events, makespan {:.17e} s",
            built + sim,
            dag.len(),
            r.flows,
            r.events,
            r.makespan
        );
        let ends: Vec<f64> =
            conv.rank_end.iter().map(|&t| r.finish.get(t as usize).copied().unwrap_or(f64::NAN)).collect();
        runs.push((r.makespan, ends));
    }
    if let [(m, me), (e, ee)] = runs.as_slice() {
        // Each rank's finish time against the exact one, relative to that and to the exact makespan.
        let (mut rel, mut of_makespan, mut worst) = (0.0f64, 0.0f64, 0usize);
        for (i, (a, b)) in me.iter().zip(ee).enumerate() {
            if (a / b - 1.0).abs() > rel {
                (rel, worst) = ((a / b - 1.0).abs(), i);
            }
            of_makespan = of_makespan.max((a - b).abs() / e);
        }
        println!(
            "merged rail parts against exact: makespan {:+.3e} relative ({:.6} ms against {:.6} ms); ranks' finish \
             times within {of_makespan:.3e} of the makespan, {rel:.3e} relative (rank {worst}: {:.6} ms against \
             {:.6} ms)",
            m / e - 1.0,
            m * 1e3,
            e * 1e3,
            me[worst] * 1e3,
            ee[worst] * 1e3
        );
    }
    Ok(())
}

fn algo_build(fab: &Fabric, job: &AllReduceJob, fails: &[Failure]) -> Result<(), SimError> {
    let p = plan_allreduce(fab, &plan_health(fab, fails), job, Choice::Planner)?;
    let af = r2ccl_policy::schedule_fabric(&p.topology, &p.view).map_err(|e| SimError::Convert(e.to_string()))?;
    let t = Instant::now();
    let (mut steps, mut parts) = (0usize, 0usize);
    for r in 0..af.layout().ranks() as u32 {
        let s =
            r2ccl_algo::build_rank_schedule(&af, &p.request, Rank(r)).map_err(|e| SimError::Convert(e.to_string()))?;
        steps += s.steps().len();
        for st in s.steps() {
            if let r2ccl_algo::StepKind::Send { split, .. } = st.kind {
                parts += s.split(split).map_or(1, |sp| sp.parts.len());
            }
        }
    }
    println!(
        "r2ccl-algo builds the planner's {:?} schedule (K = {}) for every rank in {:.3} s: {steps} steps, {parts} \
         transfer parts",
        p.strategy,
        p.request.chunks,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn chunks(fab: &Fabric, job: &AllReduceJob, fails: &[Failure], ks: &[u32]) -> Result<(), SimError> {
    let p = plan_allreduce(fab, &plan_health(fab, fails), job, Choice::Planner)?;
    let af = r2ccl_policy::schedule_fabric(&p.topology, &p.view).map_err(|e| SimError::Convert(e.to_string()))?;
    let layout = af.layout().clone();
    println!("the planner runs {:?} with K = {}", p.strategy, p.request.chunks);
    for &k in ks {
        for fl in [fails, &fails[..1]] {
            let mut req = p.request.clone();
            req.chunks = k.max(1);
            let t = Instant::now();
            let mut dag = Dag::new();
            let build = |r| r2ccl_algo::build_rank_schedule(&af, &req, r);
            let c = append_schedules(&mut dag, fab, &layout, &job.nodes, build, None)?;
            let built = t.elapsed().as_secs_f64();
            let t = Instant::now();
            let r = simulate(fab, &dag, fl, &EngineConfig::with_repair(RepairMode::Spread))?;
            println!(
                "K = {k:>3}, {} failure(s): schedule {built:.3} s, simulation {:.3} s, {} transfers, makespan {:.6} ms",
                fl.len(),
                t.elapsed().as_secs_f64(),
                c.transfers,
                r.makespan * 1e3
            );
        }
    }
    Ok(())
}

/// The floor of an exact event-driven run of the planner's DAG (see the file's doc).
fn floor(fab: &Fabric, job: &AllReduceJob, fails: &[Failure]) -> Result<(), SimError> {
    let h = plan_health(fab, fails);
    let t = Instant::now();
    let mut dag = Dag::new();
    append_allreduce(&mut dag, fab, &h, job, Choice::Planner, None)?;
    let built = t.elapsed().as_secs_f64();
    // Untimed: successor lists (CSR), dependency counts and each task's duration alone on its path.
    let n = dag.len();
    let mut start = vec![0u32; n + 1];
    let mut deps = vec![0u32; n];
    for &(a, b) in dag.edges() {
        start[a as usize + 1] += 1;
        deps[b as usize] += 1;
    }
    for i in 0..n {
        start[i + 1] += start[i];
    }
    let mut at = start.clone();
    let mut succ = vec![0u32; dag.edges().len()];
    for &(a, b) in dag.edges() {
        succ[at[a as usize] as usize] = b;
        at[a as usize] += 1;
    }
    let caps = fab.capacities();
    let mut path = Vec::new();
    let dur: Vec<f64> = dag
        .ops()
        .map(|op| match op {
            Op::Delay(d) => d.max(0.0),
            Op::Transfer { src, dst, bytes, .. } | Op::Pinned { src, dst, bytes, .. } => {
                let (rs, rd) = match op {
                    Op::Pinned { src_rail, dst_rail, .. } => (src_rail, dst_rail),
                    _ => (0, 0),
                };
                fab.path(src, dst, rs, rd, &mut path);
                let c = path.iter().map(|&l| caps[l as usize]).fold(f64::INFINITY, f64::min);
                fab.path_latency(src, dst) + if c.is_finite() && c > 0.0 { bytes / c } else { 0.0 }
            }
        })
        .collect();
    // Times are non-negative, so their bit patterns order like the times.
    let mut left = deps.clone();
    let t = Instant::now();
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> =
        (0..n as u32).filter(|&i| left[i as usize] == 0).map(|i| Reverse((dur[i as usize].to_bits(), i))).collect();
    let mut end = 0.0f64;
    while let Some(Reverse((bits, task))) = heap.pop() {
        let now = f64::from_bits(bits);
        end = end.max(now);
        for &s in &succ[start[task as usize] as usize..start[task as usize + 1] as usize] {
            let l = &mut left[s as usize];
            *l -= 1;
            if *l == 0 {
                heap.push(Reverse(((now + dur[s as usize]).to_bits(), s)));
            }
        }
    }
    let timed = t.elapsed().as_secs_f64();
    let mut left = deps.clone();
    let t = Instant::now();
    let mut rh = RadixHeap::default();
    for i in 0..n as u32 {
        if left[i as usize] == 0 {
            rh.push(dur[i as usize].to_bits(), i);
        }
    }
    let mut end2 = 0.0f64;
    while let Some((bits, task)) = rh.pop() {
        let now = f64::from_bits(bits);
        end2 = end2.max(now);
        for &s in &succ[start[task as usize] as usize..start[task as usize + 1] as usize] {
            let l = &mut left[s as usize];
            *l -= 1;
            if *l == 0 {
                rh.push((now + dur[s as usize]).to_bits(), s);
            }
        }
    }
    let radix = t.elapsed().as_secs_f64();
    let mut left = deps;
    let t = Instant::now();
    let mut fifo: VecDeque<u32> = (0..n as u32).filter(|&i| left[i as usize] == 0).collect();
    let mut walked = 0usize;
    while let Some(task) = fifo.pop_front() {
        walked += 1;
        for &s in &succ[start[task as usize] as usize..start[task as usize + 1] as usize] {
            let l = &mut left[s as usize];
            *l -= 1;
            if *l == 0 {
                fifo.push_back(s);
            }
        }
    }
    let walk = t.elapsed().as_secs_f64();
    println!(
        "floor of the planner's case: schedule {built:.3} s; {n} tasks and {} edges taken in time order from a binary \
         heap {timed:.3} s, from a radix heap {radix:.3} s (makespan without sharing {:.6} ms, {:.6} ms); the same \
         walk in FIFO order {walk:.3} s ({walked} tasks); schedule + pass {:.3} s (binary heap), {:.3} s (radix heap)",
        dag.edges().len(),
        end * 1e3,
        end2 * 1e3,
        built + timed,
        built + radix
    );
    Ok(())
}

/// A monotone priority queue on `u64` keys (a radix heap): keys pushed are never below the last key popped,
/// which holds for event times. Bucket `i > 0` holds keys whose highest bit that differs from the last popped
/// key is bit `i - 1`; bucket 0 holds keys equal to it.
struct RadixHeap {
    last: u64,
    buckets: Vec<Vec<(u64, u32)>>,
    len: usize,
}

impl Default for RadixHeap {
    fn default() -> Self {
        Self { last: 0, buckets: vec![Vec::new(); 65], len: 0 }
    }
}

impl RadixHeap {
    fn bucket(&self, k: u64) -> usize {
        (64 - (k ^ self.last).leading_zeros()) as usize
    }
    fn push(&mut self, k: u64, v: u32) {
        let b = self.bucket(k);
        self.buckets[b].push((k, v));
        self.len += 1;
    }
    fn pop(&mut self) -> Option<(u64, u32)> {
        if self.len == 0 {
            return None;
        }
        if self.buckets[0].is_empty() {
            let i = (1..65).find(|&i| !self.buckets[i].is_empty())?;
            let b = std::mem::take(&mut self.buckets[i]);
            self.last = b.iter().map(|e| e.0).min()?;
            for e in &b {
                let j = self.bucket(e.0);
                self.buckets[j].push(*e);
            }
            let mut b = b;
            b.clear();
            self.buckets[i] = b;
        }
        self.len -= 1;
        self.buckets[0].pop()
    }
}
