//! `r2ccl-plan`: print the planner's predictions for one AllReduce under a failure set.
//!
//! ```text
//! r2ccl-plan --nodes N --nics K [--ranks-per-node R] [--fail NODE:NIC,...] [--nic-gbps G]
//!            [--alpha-us A] [--communicator] --bytes SIZE [--json]
//! ```
//! `--communicator` plans on the topology a communicator plans on
//! ([`r2ccl_policy::communicator_topology`]: its per-message latency, a rail-only fabric), so the
//! predictions are of the plan it runs (nodes without a usable rail in common planned with their
//! failed NICs, as it does); `--alpha-us` still overrides the latency.
//! SIZE is a byte count with an optional suffix. As in nccl-tests, K, M and G are binary
//! (K = 1024); KiB, MiB and GiB mean the same; B or no suffix means bytes.
//! Bad input prints one line `r2ccl-plan: error: ...` on stderr and exits with status 2.
#![allow(clippy::print_stdout, clippy::print_stderr, reason = "command-line tool: its output is the point")]

use anyhow::{anyhow, bail, Context, Result};
use r2ccl_core::{DType, HealthView, NicId, ReduceOp};
use r2ccl_policy::{communicator_topology, plan, plan_bridging_splits, CandidateKind, Collective, Plan, Topology};
use serde_json::{json, Map, Value};

const USAGE: &str = "usage: r2ccl-plan --nodes N --nics K [--ranks-per-node R] [--fail NODE:NIC,...] \
[--nic-gbps G] [--alpha-us A] [--communicator] --bytes SIZE [--json]   (SIZE: bytes with K/M/G or KiB/MiB/GiB, K = 1024)";

struct Args {
    nodes: usize,
    nics: usize,
    ranks_per_node: u32,
    fail: Vec<(u32, u16)>,
    nic_gbps: f64,
    alpha_us: Option<f64>,
    communicator: bool,
    bytes: u64,
    json: bool,
}

/// Parse a size such as `1GiB`, `64K`, `1000`.
fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suf) = t.split_at(split);
    if num.is_empty() {
        bail!("size {s:?} does not start with a number");
    }
    let v: u64 = num.parse().with_context(|| format!("size {s:?} is not a valid number"))?;
    let mult: u64 = match suf.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        _ => bail!("size {s:?} has unknown suffix {suf:?} (use K, M, G, KiB, MiB or GiB; K = 1024)"),
    };
    v.checked_mul(mult).ok_or_else(|| anyhow!("size {s:?} is too large"))
}

fn parse_fail(s: &str) -> Result<Vec<(u32, u16)>> {
    let mut out = Vec::new();
    for item in s.split(',').filter(|x| !x.is_empty()) {
        let (a, b) = item.split_once(':').ok_or_else(|| anyhow!("--fail entry {item:?} is not NODE:NIC"))?;
        let node = a.trim().parse().with_context(|| format!("--fail entry {item:?}: node {a:?} is not a number"))?;
        let nic = b.trim().parse().with_context(|| format!("--fail entry {item:?}: NIC {b:?} is not a number"))?;
        out.push((node, nic));
    }
    Ok(out)
}

fn parse_args(argv: &[String]) -> Result<Args> {
    let mut nodes = None;
    let mut nics = None;
    let mut a = Args {
        nodes: 0,
        nics: 0,
        ranks_per_node: 1,
        fail: Vec::new(),
        nic_gbps: 400.0,
        alpha_us: None,
        communicator: false,
        bytes: 0,
        json: false,
    };
    let mut bytes = None;
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut val = |name: &str| it.next().cloned().ok_or_else(|| anyhow!("{name} needs a value"));
        match flag.as_str() {
            "--nodes" => nodes = Some(val("--nodes")?.parse::<usize>().context("--nodes must be a whole number")?),
            "--nics" => nics = Some(val("--nics")?.parse::<usize>().context("--nics must be a whole number")?),
            "--ranks-per-node" => {
                a.ranks_per_node =
                    val("--ranks-per-node")?.parse().context("--ranks-per-node must be a whole number")?;
            }
            "--fail" => a.fail.extend(parse_fail(&val("--fail")?)?),
            "--nic-gbps" => a.nic_gbps = val("--nic-gbps")?.parse().context("--nic-gbps must be a number")?,
            "--alpha-us" => a.alpha_us = Some(val("--alpha-us")?.parse().context("--alpha-us must be a number")?),
            "--bytes" => bytes = Some(parse_size(&val("--bytes")?)?),
            "--json" => a.json = true,
            "--communicator" => a.communicator = true,
            "-h" | "--help" => bail!("{USAGE}"),
            other => bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    a.nodes = nodes.ok_or_else(|| anyhow!("--nodes is required"))?;
    a.nics = nics.ok_or_else(|| anyhow!("--nics is required"))?;
    a.bytes = bytes.ok_or_else(|| anyhow!("--bytes is required"))?;
    if a.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if a.nics == 0 {
        bail!("--nics must be at least 1");
    }
    if !(a.nic_gbps.is_finite() && a.nic_gbps > 0.0) {
        bail!("--nic-gbps must be a positive number, got {}", a.nic_gbps);
    }
    if a.nodes > 1 << 20 || a.nics > 64 {
        bail!("at most 1048576 nodes and 64 NICs per node");
    }
    Ok(a)
}

fn build(a: &Args) -> Result<Plan> {
    let mbps = (a.nic_gbps * 1000.0).round() as u64;
    let mut topo = if a.communicator {
        communicator_topology(
            Topology::uniform(a.nodes, a.nics, mbps.max(1))?.with_ranks_per_node(a.ranks_per_node)?,
            true,
        )?
    } else {
        Topology::uniform(a.nodes, a.nics, mbps.max(1))?.with_ranks_per_node(a.ranks_per_node)?
    };
    if let Some(us) = a.alpha_us {
        topo = topo.with_alpha(us * 1e-6)?;
    }
    let mut view = HealthView::uniform(a.nodes, a.nics, mbps.max(1));
    for &(node, nic) in &a.fail {
        if node as usize >= a.nodes {
            bail!("--fail {node}:{nic}: node {node} is out of range (nodes are 0..{})", a.nodes);
        }
        if usize::from(nic) >= a.nics {
            bail!("--fail {node}:{nic}: NIC {nic} is out of range (NICs are 0..{})", a.nics);
        }
        view.set_failed(NicId::new(node, nic))?;
    }
    let allreduce = Collective::AllReduce { op: ReduceOp::Sum };
    if a.communicator {
        // As the communicator does: nodes without a usable rail in common are planned with
        // their failed NICs, which its engine steers around at run time.
        return Ok(plan_bridging_splits(&topo, &view, allreduce, DType::U8, a.bytes)?.0);
    }
    Ok(plan(&topo, &view, allreduce, a.bytes)?)
}

fn fmt_time(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.4} s")
    } else if s >= 1e-3 {
        format!("{:.4} ms", s * 1e3)
    } else {
        format!("{:.3} us", s * 1e6)
    }
}

fn ratio(t: f64, nf: f64) -> Option<f64> {
    (nf > 0.0).then(|| t / nf)
}

fn print_json(a: &Args, p: &Plan) -> Result<()> {
    let mut strategies = Map::new();
    let mut ratios = Map::new();
    for c in &p.candidates {
        strategies.insert(c.strategy.name().to_owned(), json!(c.time_s));
        if let Some(r) = ratio(c.time_s, p.t_nf_s) {
            ratios.insert(c.strategy.name().to_owned(), json!(r));
        }
    }
    let params = p.chosen_candidate().map(|c| serde_json::to_value(&c.params)).transpose()?;
    let v = json!({
        "t_nf": p.t_nf_s,
        "lower_bound": p.lower_bound_s,
        "strategies": Value::Object(strategies),
        "chosen": p.chosen.name(),
        "ratios": Value::Object(ratios),
        "lower_bound_ratio": ratio(p.lower_bound_s, p.t_nf_s),
        "chosen_params": params,
        "ring_order": p.ring_order.iter().map(|n| n.0).collect::<Vec<_>>(),
        "bytes": a.bytes,
        "nodes": a.nodes,
        "nics": a.nics,
    });
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}

fn print_text(a: &Args, p: &Plan) {
    let fails: Vec<String> = a.fail.iter().map(|(n, r)| format!("{n}:{r}")).collect();
    println!(
        "AllReduce of {} bytes per rank on {} nodes x {} NICs at {} Gb/s, {} rank(s)/node; failed NICs: {}",
        a.bytes,
        a.nodes,
        a.nics,
        a.nic_gbps,
        a.ranks_per_node,
        if fails.is_empty() { "none".to_owned() } else { fails.join(",") }
    );
    let order: Vec<String> = p.ring_order.iter().map(|n| n.0.to_string()).collect();
    println!(
        "ring order: {} (bottleneck {} Gb/s, {} cross-rail hops)",
        order.join(" "),
        p.ring_score.bottleneck_mbps as f64 / 1000.0,
        p.ring_score.cross_rail_hops
    );
    let r = |t: f64| ratio(t, p.t_nf_s).map_or("-".to_owned(), |x| format!("{x:.3}"));
    println!("{:<20} {:>14} {:>10}", "strategy", "time", "x t_nf");
    println!("{:<20} {:>14} {:>10}", "fault-free (t_nf)", fmt_time(p.t_nf_s), r(p.t_nf_s));
    for s in CandidateKind::ALL {
        match p.candidate(s) {
            Some(c) => println!("{:<20} {:>14} {:>10}", s.name(), fmt_time(c.time_s), r(c.time_s)),
            None => println!("{:<20} {:>14} {:>10}", s.name(), "n/a", ""),
        }
    }
    println!("{:<20} {:>14} {:>10}", "lower bound", fmt_time(p.lower_bound_s), r(p.lower_bound_s));
    let params = p.chosen_candidate().map(|c| &c.params);
    let mut extra = Vec::new();
    if let Some(pp) = params {
        if let Some(y) = pp.tail_fraction {
            extra.push(format!("Y={y:.4}"));
        }
        if let Some(k) = pp.chunks {
            extra.push(format!("K={k}"));
        }
        if let Some(f) = pp.ring_fraction {
            extra.push(format!("f={f:.4}"));
        }
        if pp.rails {
            extra.push("rail-parallel".into());
        }
    }
    println!("chosen: {} {}", p.chosen.name(), extra.join(" "));
}

fn run(argv: &[String]) -> Result<()> {
    let a = parse_args(argv)?;
    let p = build(&a)?;
    if a.json {
        print_json(&a, &p)
    } else {
        print_text(&a, &p);
        Ok(())
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&argv) {
        let msg = format!("{e:#}").replace('\n', " ");
        eprintln!("r2ccl-plan: error: {msg}");
        std::process::exit(2);
    }
}
