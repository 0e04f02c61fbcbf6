//! Where the planner's exact schedules differ from their predictions and from the formula schedules
//! (docs/reproduction.md, "What the planner's schedules show" and "Inference"): the 2.7B bucket on 2 x 8 GPUs
//! (`2p7b`), the 70B decode AllReduce of 1 MiB over TP = 16 (`decode`) and the 1024-GPU bench AllReduce
//! (`1024`, about 2 minutes). For each case it prints every candidate's prediction, the simulated time of the
//! schedules, and where their time goes: per transfer class (NVLink, NIC) the bytes and the last finish, and the
//! links with the most bytes / capacity. Run with
//! `cargo run --release -p r2ccl-sim --example planner_gaps [2p7b|decode|1024]`.
#![allow(clippy::print_stdout, reason = "an example that prints its measurements")]

use r2ccl_policy::CandidateKind as P;
use r2ccl_sim::collective::{AllReduceJob, Scheme};
use r2ccl_sim::convert::{append_allreduce, append_schedules, plan_allreduce, Choice};
use r2ccl_sim::workload::{allreduce_run, plan_health};
use r2ccl_sim::SimError;
use r2ccl_sim::{simulate, Dag, Endpoint, EngineConfig, Fabric, FabricSpec, Failure, FailureKind, Op, RepairMode};

fn ms(x: f64) -> f64 {
    x * 1e3
}

fn spec(nodes: u32, nvlink_gbps: f64, nic_latency_us: f64) -> FabricSpec {
    let mut s = FabricSpec::new(nodes, 8, 8, 400.0);
    s.nvlink_gbps = nvlink_gbps;
    s.nic_latency_us = nic_latency_us;
    s.nvlink_latency_us = nic_latency_us / 2.0;
    s
}

/// Name of link `l` (NVLink and NIC links only).
fn link_name(fab: &Fabric, l: usize) -> String {
    let s = fab.spec();
    for n in 0..s.nodes {
        for g in 0..s.gpus_per_node {
            let e = Endpoint::new(n, g);
            if fab.nvl_out(e) as usize == l {
                return format!("node {n} GPU {g} NVLink out");
            }
            if fab.nvl_in(e) as usize == l {
                return format!("node {n} GPU {g} NVLink in");
            }
        }
        for k in 0..s.nics_per_node {
            if fab.nic_up(n, k) as usize == l {
                return format!("node {n} NIC {k} up");
            }
            if fab.nic_down(n, k) as usize == l {
                return format!("node {n} NIC {k} down");
            }
        }
    }
    format!("link {l}")
}

/// Simulate `choice` for `job` under `fails`; print the plan and where the time goes. Returns the makespan.
fn show(fab: &Fabric, job: &AllReduceJob, fails: &[Failure], choice: Choice, label: &str) -> Result<f64, SimError> {
    let h = plan_health(fab, fails);
    let mut dag = Dag::new();
    let (p, conv) = append_allreduce(&mut dag, fab, &h, job, choice, None)?;
    let r = simulate(fab, &dag, fails, &EngineConfig::with_repair(RepairMode::Spread))?;
    let pred = p.plan.candidate(p.strategy).map_or(f64::NAN, |c| c.time_s);
    println!(
        "{label}: runs {:?}, chunks {}, {:?}; predicted {:.4} ms, simulated {:.4} ms ({} transfers)",
        p.strategy,
        p.request.chunks,
        p.request.algorithm,
        ms(pred),
        ms(r.makespan),
        conv.transfers,
    );
    let caps = fab.capacities();
    let mut link_bytes = vec![0.0; caps.len()];
    let mut path = Vec::new();
    let (mut nvl, mut nic) = ((0.0, 0usize, 0.0f64), (0.0, 0usize, 0.0f64));
    for (i, op) in dag.ops().enumerate() {
        let fin = r.finish.get(i).copied().unwrap_or(f64::NAN);
        let (cls, bytes) = match op {
            Op::Transfer { src, dst, bytes, .. } => {
                fab.path(src, dst, 0, 0, &mut path);
                (&mut nvl, bytes)
            }
            Op::Pinned { src, dst, bytes, src_rail, dst_rail, .. } => {
                fab.path(src, dst, src_rail, dst_rail, &mut path);
                (&mut nic, bytes)
            }
            Op::Delay(_) => continue,
        };
        for &l in &path {
            link_bytes[l as usize] += bytes;
        }
        *cls = (cls.0 + bytes, cls.1 + 1, cls.2.max(fin));
    }
    println!(
        "  NVLink messages: {} ({:.1} MB), last ends {:.4} ms; NIC parts: {} ({:.1} MB), last ends {:.4} ms",
        nvl.1,
        nvl.0 / 1e6,
        ms(nvl.2),
        nic.1,
        nic.0 / 1e6,
        ms(nic.2)
    );
    let mut busy: Vec<(f64, usize)> =
        link_bytes.iter().enumerate().filter(|(l, _)| caps[*l] > 0.0).map(|(l, &b)| (b / caps[l], l)).collect();
    busy.sort_by(|a, b| b.0.total_cmp(&a.0));
    for &(t, l) in busy.iter().take(2) {
        println!("  busiest: {:<26} {:.4} ms of bytes / capacity", link_name(fab, l), ms(t));
    }
    Ok(r.makespan)
}

/// Makespan of the planner's schedule for `job` under `fails`, with its chunk count replaced by `chunks`.
fn with_chunks(fab: &Fabric, job: &AllReduceJob, fails: &[Failure], chunks: Option<u32>) -> Result<f64, SimError> {
    let mut p = plan_allreduce(fab, &plan_health(fab, fails), job, Choice::Planner)?;
    if let Some(k) = chunks {
        p.request.chunks = k;
    }
    let af = r2ccl_policy::schedule_fabric(&p.topology, &p.view).map_err(|e| SimError::Convert(e.to_string()))?;
    let layout = af.layout().clone();
    let mut dag = Dag::new();
    let req = &p.request;
    append_schedules(&mut dag, fab, &layout, &job.nodes, |r| r2ccl_algo::build_rank_schedule(&af, req, r), None)?;
    Ok(simulate(fab, &dag, fails, &EngineConfig::with_repair(RepairMode::Spread))?.makespan)
}

fn candidates(fab: &Fabric, job: &AllReduceJob, fails: &[Failure]) -> Result<(), SimError> {
    let p = plan_allreduce(fab, &plan_health(fab, fails), job, Choice::Planner)?;
    for c in &p.plan.candidates {
        println!("  candidate {:?}: predicted {:.4} ms, chunks {:?}", c.strategy, ms(c.time_s), c.params.chunks);
    }
    Ok(())
}

fn gpt_2p7b(e: &EngineConfig) -> Result<(), SimError> {
    let fab = Fabric::new(spec(2, 3600.0, 2.0))?;
    // One of the 4 buckets of 2.7e9 fp32 gradients (the scenario's job).
    let job = AllReduceJob { nodes: vec![0, 1], bytes: 2.7e9, intra: true, chunks: 8 };
    let fails = [Failure::known_down(0, 3)];
    candidates(&fab, &job, &[])?;
    show(&fab, &job, &[], Choice::Planner, "healthy")?;
    candidates(&fab, &job, &fails)?;
    show(&fab, &job, &fails, Choice::Planner, "NIC 3 of node 0 failed")?;
    // Failed NICs of node 0: each failed rail's ring crosses NVLink to the other GPUs (PXN) and loads the live
    // NICs beside their own rails.
    for rails in [vec![], vec![3], vec![1], vec![7], vec![3, 5], vec![3, 5, 6], vec![3, 5, 6, 7], vec![0], vec![0, 3]] {
        let f: Vec<Failure> = rails.iter().map(|&r| Failure::known_down(0, r)).collect();
        let live = 8 - rails.len();
        let t = allreduce_run(&fab, Scheme::Planner, &job, &f, e)?.makespan;
        println!(
            "  failed NICs {rails:?} of node 0: NICs {:.2} ms at line rate; simulated {:.3} ms",
            ms(job.bytes / (live as f64 * fab.spec().nic_bytes_per_s())),
            ms(t)
        );
    }
    for (nvl, lat) in [(3600.0, 2.0), (3600.0, 0.0), (36000.0, 0.0)] {
        let fab = Fabric::new(spec(2, nvl, lat))?;
        for k in [None, Some(1), Some(8), Some(16), Some(64), Some(256)] {
            let h = with_chunks(&fab, &job, &[], k)?;
            let f0 = with_chunks(&fab, &job, &[Failure::known_down(0, 3)], k)?;
            let f1 = with_chunks(&fab, &job, &[Failure::known_down(1, 3)], k)?;
            println!(
                "  NVLink {nvl} Gb/s, NIC latency {lat} us, chunks {k:?}: healthy {:.3} ms, NIC 3 of node 0 failed \
                 {:.3} ms ({:+.2}%), of node 1 {:.3} ms",
                ms(h),
                ms(f0),
                (f0 / h - 1.0) * 100.0,
                ms(f1)
            );
        }
    }
    Ok(())
}

fn decode(e: &EngineConfig) -> Result<(), SimError> {
    let fab = Fabric::new(spec(2, 3600.0, 2.0))?;
    // 64 sequences x hidden 8192 x 2 bytes.
    let job = AllReduceJob { nodes: vec![0, 1], bytes: 64.0 * 8192.0 * 2.0, intra: true, chunks: 1 };
    let half = Failure { kind: FailureKind::Degraded { fraction: 0.5 }, ..Failure::known_down(1, 0) };
    for (label, fails) in [
        ("healthy", vec![]),
        ("NIC 0 of node 1 down", vec![Failure::known_down(1, 0)]),
        ("NIC 0 of node 1 at 50%", vec![half]),
    ] {
        candidates(&fab, &job, &fails)?;
        show(&fab, &job, &fails, Choice::Planner, label)?;
        for c in [P::Balance, P::SingleBackup] {
            show(&fab, &job, &fails, Choice::Candidate(c), &format!("  {label}, {c:?}"))?;
        }
        let t = allreduce_run(&fab, Scheme::Balance, &job, &fails, e)?.makespan;
        println!("  {label}, formula Balance: {:.4} ms", ms(t));
    }
    Ok(())
}

fn gpus_1024(e: &EngineConfig) -> Result<(), SimError> {
    let job = AllReduceJob { nodes: (0..128).collect(), bytes: 256.0 * 1048576.0, intra: true, chunks: 1 };
    let known = [Failure::known_down(3, 2)];
    let both = [Failure::known_down(3, 2), Failure::down_at(70, 5, 0.002)];
    // Without latency only the plan is printed: Balance and four-stage at K = 1024 take minutes to simulate.
    for (nvl, lat) in [(3600.0, 2.0), (3600.0, 0.0)] {
        let fab = Fabric::new(spec(128, nvl, lat))?;
        println!("NVLink {nvl} Gb/s, NIC latency {lat} us:");
        candidates(&fab, &job, &known)?;
        // The hierarchical wrapper's chains as r2ccl-policy charges them: 2 (G - 1 + K - 1) (alpha + D / K / B_nvl).
        for k in [1.0, 2.0, 16.0] {
            let chain = 2.0 * (7.0 + k - 1.0) * (2.0 * lat * 1e-6 + job.bytes / k / (nvl * 1e9 / 8.0));
            println!("  intra-node chains at K = {k}: {:.4} ms", ms(chain));
        }
        if lat > 0.0 {
            show(&fab, &job, &known, Choice::Planner, "  one failure known")?;
            show(&fab, &job, &known, Choice::Candidate(P::Balance), "  one failure known, algo Balance")?;
            show(&fab, &job, &both, Choice::Planner, "  known + in flight")?;
            show(&fab, &job, &both, Choice::Candidate(P::Balance), "  known + in flight, algo Balance")?;
            for s in [Scheme::Balance, Scheme::FourStage] {
                for (l, f) in [("known", &known[..]), ("known + in flight", &both[..])] {
                    let t = allreduce_run(&fab, s, &job, f, e)?.makespan;
                    println!("  formula {}, {l}: {:.4} ms", s.name(), ms(t));
                }
            }
        }
    }
    Ok(())
}

fn main() -> Result<(), SimError> {
    let which = std::env::args().nth(1).unwrap_or_else(|| "2p7b".into());
    let e = EngineConfig::with_repair(RepairMode::Spread);
    match which.as_str() {
        "2p7b" => gpt_2p7b(&e),
        "decode" => decode(&e),
        _ => gpus_1024(&e),
    }
}
