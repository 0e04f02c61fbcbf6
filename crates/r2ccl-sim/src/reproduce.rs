//! `reproduce`: regenerate every table of docs/reproduction.md from the bundled scenarios and the closed forms.
//!
//! Pure computation: the scenarios are compiled in (`include_str!`), tables come back as data; the binary
//! prints and times them.

use crate::closed;
use crate::collective::{healthy, AllReduceJob, Scheme};
use crate::engine::{EngineConfig, Failure, FailureKind, RepairMode, Sharing};
use crate::error::SimError;
use crate::fabric::{Fabric, FabricSpec};
use crate::scenario::{Report, Scenario};
use crate::workload::allreduce_run;
use serde::{Deserialize, Serialize};

/// The bundled scenario files (name, TOML text).
pub const SCENARIOS: [(&str, &str); 5] = [
    ("gpt3_2p7b_dp", include_str!("../scenarios/gpt3_2p7b_dp.toml")),
    ("gpt3_13b_tp_pp", include_str!("../scenarios/gpt3_13b_tp_pp.toml")),
    ("dp_512gpu", include_str!("../scenarios/dp_512gpu.toml")),
    ("gpt3_175b_1024gpu", include_str!("../scenarios/gpt3_175b_1024gpu.toml")),
    ("decode_tp16", include_str!("../scenarios/decode_tp16.toml")),
];

/// A printable table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// Title.
    pub title: String,
    /// Column names.
    pub header: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// Markdown rendering.
    pub fn markdown(&self) -> String {
        let mut s =
            format!("### {}\n\n| {} |\n|{}\n", self.title, self.header.join(" | "), "---|".repeat(self.header.len()));
        for r in &self.rows {
            s.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        s
    }
}

fn scenario(name: &str) -> Result<Scenario, SimError> {
    let text = SCENARIOS
        .iter()
        .find(|s| s.0 == name)
        .map(|s| s.1)
        .ok_or_else(|| SimError::Parse(format!("no bundled scenario {name}")))?;
    Scenario::from_toml(text)
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{x:+.2}%")
    } else {
        "hang".into()
    }
}

fn row_of(r: &Report, s: Scheme) -> Option<&crate::scenario::StrategyReport> {
    r.rows.iter().find(|x| x.strategy == s)
}

/// Section 7 worked values: simulated single collectives against the closed forms.
pub fn closed_form_table(chunks: u32) -> Result<Table, SimError> {
    let d = 1024.0 * 1024.0 * 1024.0;
    let mut rows = Vec::new();
    for (n, x) in [(4u32, 0.25), (4, 0.5), (8, 0.125), (8, 0.5)] {
        let k = 8u32;
        let lost = (x * f64::from(k)).round() as u32;
        let mut spec = FabricSpec::new(n, 1, k, 100.0);
        spec.nic_latency_us = 0.01;
        let fab = Fabric::new(spec)?;
        let b = fab.spec().node_bytes_per_s();
        let nf = closed::t_nf(n as usize, d, b);
        let job = AllReduceJob { nodes: (0..n).collect(), bytes: d, intra: false, chunks };
        let fails: Vec<Failure> = (0..lost).map(|r| Failure::known_down(1, r)).collect();
        let e = EngineConfig::with_repair(RepairMode::Spread);
        let bal = allreduce_run(&fab, Scheme::Balance, &job, &fails, &e)?.makespan / nf;
        let r2 = allreduce_run(&fab, Scheme::R2cclAllReduce, &job, &fails, &e)?.makespan / nf;
        let rec = allreduce_run(&fab, Scheme::Recursive, &job, &fails, &e)?.makespan / nf;
        let (_, _, _, r2k) = closed::r2ccl_allreduce(n as usize, d, b, x, chunks);
        // Lower bound: one NIC per node, the straggler's degraded to beta = 1 - X.
        let mut s1 = FabricSpec::new(n, 1, 1, 800.0);
        s1.nic_latency_us = 0.01;
        let f1 = Fabric::new(s1)?;
        let deg = [Failure {
            node: 0,
            rail: 0,
            kind: FailureKind::Degraded { fraction: 1.0 - x },
            at_s: -1.0,
            until_s: None,
        }];
        let job64 = AllReduceJob { chunks: 64, ..job.clone() };
        let fs = allreduce_run(&f1, Scheme::FourStage, &job64, &deg, &e)?.makespan / nf;
        let lb = closed::lower_bound(n as usize, d, b, 1.0 - x) / nf;
        rows.push(vec![
            n.to_string(),
            format!("{x}"),
            format!("{bal:.3} / {:.3}", closed::balance_ratio(x)),
            format!("{r2:.3} / {:.3} (inf: {:.3})", r2k / nf, closed::r2ccl_ratio_limit(n as usize, x)),
            format!("{fs:.3} / {lb:.3}"),
            format!("{rec:.3}"),
        ]);
    }
    Ok(Table {
        title: format!("Single AllReduce, T / T_nf: simulated / closed form (1 GiB, K = {chunks} chunks)"),
        header: [
            "n",
            "X",
            "Balance",
            "R2CCL-AllReduce (K)",
            "four-stage (1 NIC, beta, K=64) / lower bound",
            "recursive",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    })
}

/// What [`run_exact`] measured.
struct Exact {
    /// Makespan, seconds.
    makespan: f64,
    /// Finish time of each rank's last step, seconds.
    rank_finish: Vec<f64>,
    /// Bytes sent per NIC, `[node * nics + rail]`.
    nic_tx: Vec<u64>,
    /// Bytes received per NIC, same indexing.
    nic_rx: Vec<u64>,
}

/// One exact r2ccl-algo AllReduce request on all nodes of `fab` (one rank per node) with `fails` known, under
/// `sharing`.
fn run_exact(
    fab: &Fabric,
    fails: &[Failure],
    req: &r2ccl_algo::ScheduleRequest,
    sharing: Sharing,
) -> Result<Exact, SimError> {
    let s = fab.spec();
    let h = crate::workload::plan_health(fab, fails);
    let nodes: Vec<u32> = (0..s.nodes).collect();
    let topo = crate::convert::topology(fab, nodes.len(), 1)?;
    let view = crate::convert::health_view(fab, &nodes, &h);
    let af = r2ccl_policy::schedule_fabric(&topo, &view).map_err(|e| SimError::Convert(e.to_string()))?;
    let layout = af.layout().clone();
    let mut dag = crate::engine::Dag::new();
    let build = |r| r2ccl_algo::build_rank_schedule(&af, req, r);
    let c = crate::convert::append_schedules(&mut dag, fab, &layout, &nodes, build, None)?;
    let cfg = EngineConfig { sharing, ..EngineConfig::with_repair(RepairMode::Spread) };
    let r = crate::engine::simulate(fab, &dag, fails, &cfg)?;
    let rank_finish = c.rank_end.iter().map(|&t| r.finish.get(t as usize).copied().unwrap_or(f64::NAN)).collect();
    Ok(Exact { makespan: r.makespan, rank_finish, nic_tx: c.nic_tx, nic_rx: c.nic_rx })
}

/// Section 5 and 7 closed forms against the exact r2ccl-algo schedules (1 GiB, one rank per node), under the
/// default max-min sharing and under r2ccl-algo's port model ([`Sharing::Ports`]).
pub fn exact_closed_form_table() -> Result<Table, SimError> {
    use r2ccl_algo::{Collective as AlgoCollective, R2cclParams, ScheduleRequest, Strategy as AlgoStrategy};
    use r2ccl_core::{DType, NodeId, ReduceOp};
    let count: u64 = 1 << 28;
    let d = (count * 4) as f64;
    let req = |st: AlgoStrategy, chunks: u32| {
        ScheduleRequest::new(AlgoCollective::AllReduce { op: ReduceOp::Sum }, DType::F32, count)
            .with_strategy(st)
            .with_chunks(chunks)
    };
    let mut rows = Vec::new();
    for (n, x) in [(4u32, 0.25), (4, 0.5), (8, 0.125), (8, 0.5)] {
        let k = 8u32;
        let lost = (x * f64::from(k)).round() as u32;
        let mut spec = FabricSpec::new(n, 1, k, 100.0);
        spec.nic_latency_us = 0.0;
        spec.nvlink_latency_us = 0.0;
        let fab = Fabric::new(spec)?;
        let b = fab.spec().node_bytes_per_s();
        let nf = closed::t_nf(n as usize, d, b);
        let fails: Vec<Failure> = (0..lost).map(|r| Failure::known_down(1, r)).collect();
        let bal = run_exact(&fab, &fails, &req(AlgoStrategy::Balance, 1), Sharing::MaxMin)?.makespan;
        let r2 = R2cclParams { degraded: NodeId(1), tail_fraction: x, pipeline_chunks: 16 };
        let r2req = req(AlgoStrategy::R2cclAllReduce(r2), 1);
        let mm = run_exact(&fab, &fails, &r2req, Sharing::MaxMin)?.rank_finish;
        let ports = run_exact(&fab, &fails, &r2req, Sharing::Ports)?.rank_finish;
        let (_, _, _, r2k) = closed::r2ccl_allreduce(n as usize, d, b, x, 16);
        let at = |v: &[f64]| v.get(1).copied().unwrap_or(f64::NAN) / nf;
        // Four-stage: one NIC per node, node 0's degraded to beta = 1 - X.
        let mut s1 = FabricSpec::new(n, 1, 1, 800.0);
        s1.nic_latency_us = 0.0;
        s1.nvlink_latency_us = 0.0;
        let f1 = Fabric::new(s1)?;
        let deg = [Failure {
            node: 0,
            rail: 0,
            kind: FailureKind::Degraded { fraction: 1.0 - x },
            at_s: -1.0,
            until_s: None,
        }];
        let fsreq = req(AlgoStrategy::FourStage, 64);
        let fs = run_exact(&f1, &deg, &fsreq, Sharing::MaxMin)?;
        let (fs_mm, tx, rx) = (fs.makespan, fs.nic_tx, fs.nic_rx);
        let fs_ports = run_exact(&f1, &deg, &fsreq, Sharing::Ports)?.makespan;
        let nic = f1.spec().nic_bytes_per_s();
        let fluid = (0..n as usize)
            .map(|i| {
                let bw = if i == 0 { nic * (1.0 - x) } else { nic };
                tx[i].max(rx[i]) as f64 / bw
            })
            .fold(0.0, f64::max);
        let lb = closed::lower_bound(n as usize, d, b, 1.0 - x);
        rows.push(vec![
            n.to_string(),
            format!("{x}"),
            format!("{:.3} / {:.3}", bal / nf, closed::balance_ratio(x)),
            format!("{:.3} / {:.3} / {:.3}", at(&mm), at(&ports), r2k / nf),
            format!("{:.3} / {:.3} / {:.3}", fluid / lb, fs_mm / lb, fs_ports / lb),
        ]);
    }
    Ok(Table {
        title: "Exact r2ccl-algo schedules against the closed forms (1 GiB, one rank per node)".into(),
        header: [
            "n",
            "X",
            "Balance T/T_nf / 1/(1-X)",
            "R2CCL-AllReduce K=16, degraded node T/T_nf: max-min / ports / formula",
            "four-stage K=64 (1 NIC, beta) / lower bound: bytes / max-min / ports",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    })
}

/// The data-parallel GPT-3 2.7B table of section 8.
pub fn gpt3_2p7b() -> Result<Table, SimError> {
    let mut sc = scenario("gpt3_2p7b_dp")?;
    let one = sc.run()?;
    sc.failures.push(Failure { node: 1, rail: 5, kind: FailureKind::Down, at_s: 0.0, until_s: None });
    sc.strategies = vec![Scheme::Balance, Scheme::Recursive];
    let two = sc.run()?;
    let mut rows = Vec::new();
    let base = push_scheduled_rows(&mut sc, &mut rows, 1)?;
    rows.insert(0, vec!["no failure".into(), format!("{base:.0}"), "314,618".into(), "-".into(), "-".into()]);
    let paper = [
        (Scheme::AdapCc, "AdapCC-like", "289,565", "-8.0%"),
        (Scheme::HotRepair, "hot repair only", "300,151", "-4.6%"),
        (Scheme::Balance, "Balance", "310,516", "-1.3%"),
        (Scheme::R2cclAllReduce, "R2CCL-AllReduce", "312,394", "-0.71%"),
        (Scheme::Recursive, "recursive (ours)", "-", "-"),
        (Scheme::FourStage, "four-stage (ours)", "-", "-"),
    ];
    for (s, label, ptok, ploss) in paper {
        if let Some(r) = row_of(&one, s) {
            rows.push(vec![
                label.into(),
                format!("{:.0}", r.tokens_per_s),
                ptok.into(),
                loss(r.tokens_per_s, base),
                ploss.into(),
            ]);
        }
    }
    for (s, label, ptok, ploss) in [
        (Scheme::Balance, "two failures (Balance)", "310,756", "-1.2%"),
        (Scheme::Recursive, "two failures (recursive)", "-", "-"),
    ] {
        if let Some(r) = row_of(&two, s) {
            rows.push(vec![
                label.into(),
                format!("{:.0}", r.tokens_per_s),
                ptok.into(),
                loss(r.tokens_per_s, base),
                ploss.into(),
            ]);
        }
    }
    Ok(Table {
        title: "GPT-3 2.7B data-parallel, 2 x 8 H100, one NIC failed: tokens/s and loss".into(),
        header: ["strategy", "ours tok/s", "paper tok/s", "ours loss", "paper loss"].map(String::from).to_vec(),
        rows,
    })
}

/// Rows of the r2ccl-algo schedules (planner's choice and algo Balance) for the scenario's first `failures`
/// failures; the scenario's strategies and failures are restored afterwards. Returns the planner's fault-free
/// tokens per second: every table's baseline, against which each row's loss is given.
fn push_scheduled_rows(sc: &mut Scenario, rows: &mut Vec<Vec<String>>, failures: usize) -> Result<f64, SimError> {
    let (strategies, all_failures) = (sc.strategies.clone(), sc.failures.clone());
    sc.strategies = vec![Scheme::Planner, Scheme::AlgoBalance];
    sc.failures.truncate(failures);
    let r = sc.run();
    sc.strategies = strategies;
    sc.failures = all_failures;
    let r = r?;
    let base = row_of(&r, Scheme::Planner).map_or(f64::NAN, sc_tokens);
    for (s, label) in [
        (Scheme::Planner, "planner's choice (r2ccl-algo schedule)"),
        (Scheme::AlgoBalance, "Balance (r2ccl-algo schedule)"),
    ] {
        if let Some(x) = row_of(&r, s) {
            rows.push(vec![
                label.into(),
                format!("{:.0}", x.tokens_per_s),
                "-".into(),
                loss(x.tokens_per_s, base),
                "-".into(),
            ]);
        }
    }
    Ok(base)
}

fn sc_tokens(r: &crate::scenario::StrategyReport) -> f64 {
    r.healthy_tokens_per_s
}

/// A row's throughput against the planner's fault-free `base`, as a signed percentage (a loss is negative).
fn loss(tokens_per_s: f64, base: f64) -> String {
    pct((tokens_per_s / base - 1.0) * 100.0)
}

/// A row's iteration time against the planner's fault-free iteration in `r` (its `Planner` row), as a signed
/// percentage; the row's own fault-free time when the report has no planner row.
fn over_planner(r: &Report, x: &crate::scenario::StrategyReport) -> String {
    let base = row_of(r, Scheme::Planner).map_or(x.healthy_seconds, |p| p.healthy_seconds);
    pct((x.seconds / base - 1.0) * 100.0)
}

/// 13B tensor + pipeline parallel (section 8).
pub fn gpt3_13b() -> Result<Table, SimError> {
    let mut sc = scenario("gpt3_13b_tp_pp")?;
    let one = sc.run()?;
    sc.failures.push(Failure { node: 1, rail: 5, kind: FailureKind::Down, at_s: 0.0, until_s: None });
    sc.strategies = vec![Scheme::Balance];
    let two = sc.run()?;
    let mut rows = Vec::new();
    let base = push_scheduled_rows(&mut sc, &mut rows, 1)?;
    rows.insert(0, vec!["no failure".into(), format!("{base:.0}"), "8,340".into(), "-".into(), "-".into()]);
    for (s, label, ptok, ploss) in [
        (Scheme::HotRepair, "hot repair only", "8,233", "-1.3%"),
        (Scheme::Balance, "Balance", "8,309", "-0.37%"),
        (Scheme::R2cclAllReduce, "R2CCL-AllReduce", "-", "-"),
        (Scheme::Recursive, "recursive (ours)", "-", "-"),
        (Scheme::FourStage, "four-stage (ours)", "-", "-"),
    ] {
        if let Some(r) = row_of(&one, s) {
            rows.push(vec![
                label.into(),
                format!("{:.0}", r.tokens_per_s),
                ptok.into(),
                loss(r.tokens_per_s, base),
                ploss.into(),
            ]);
        }
    }
    if let Some(r) = row_of(&two, Scheme::Balance) {
        rows.push(vec![
            "two failures (Balance)".into(),
            format!("{:.0}", r.tokens_per_s),
            "8,257".into(),
            loss(r.tokens_per_s, base),
            "-1.0%".into(),
        ]);
    }
    Ok(Table {
        title: "GPT-3 13B TP=8 x PP=2, 2 x 8 H100, one NIC failed: tokens/s and loss".into(),
        header: ["strategy", "ours tok/s", "paper tok/s", "ours loss", "paper loss"].map(String::from).to_vec(),
        rows,
    })
}

/// Failure counts of the 512-GPU table that run the formula four-stage schedule in `reproduce`. Its cross-rail
/// parts join the rails into one max-min component of hundreds of flows, and its simulation costs about 4.5 s
/// per straggler (docs/reproduction.md), so the other counts run only with `reproduce --extended`
/// ([`FOUR_STAGE_FAILURES_512_EXTENDED`]). The planner's column runs r2ccl-algo's four-stage schedule at ten
/// failures (about 21 s).
pub const FOUR_STAGE_FAILURES_512: [u32; 1] = [1];

/// Failure counts of the 512-GPU table that run the formula four-stage schedule in `reproduce --extended`.
pub const FOUR_STAGE_FAILURES_512_EXTENDED: [u32; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

/// 512 GPUs with 1..=`max` concurrent NIC failures on distinct nodes: hot repair, Balance, recursive and the
/// planner's choice at every count, the formula four-stage schedule at the counts in `four_stage_at`.
pub fn scale_512(max: u32, four_stage_at: &[u32]) -> Result<Table, SimError> {
    let mut sc = scenario("dp_512gpu")?;
    let nodes = sc.fabric.nodes;
    let k = sc.fabric.nics_per_node;
    let mut every_count = sc.strategies.clone();
    every_count.push(Scheme::Planner);
    let mut rows = Vec::new();
    for f in 1..=max {
        sc.strategies.clone_from(&every_count);
        if four_stage_at.contains(&f) {
            sc.strategies.push(Scheme::FourStage);
        }
        // Spread failures over the ring, on varied rails.
        sc.failures = (0..f)
            .map(|i| Failure {
                node: (i * 7 + 5) % nodes,
                rail: (i * 3 + 2) % k,
                kind: FailureKind::Down,
                at_s: 0.0,
                until_s: None,
            })
            .collect();
        let r = sc.run()?;
        let mut row = vec![f.to_string()];
        for s in [Scheme::HotRepair, Scheme::Balance, Scheme::Recursive, Scheme::FourStage, Scheme::Planner] {
            row.push(row_of(&r, s).map_or("-".into(), |x| over_planner(&r, x)));
        }
        let paper = match f {
            1 => "1.5%",
            10 => "4.3%",
            _ => "",
        };
        row.push(paper.into());
        rows.push(row);
    }
    Ok(Table {
        title: "512 GPUs (64 x 8), 1..10 concurrent NIC failures: iteration-time overhead".into(),
        header: [
            "failures",
            "hot repair",
            "Balance",
            "recursive (K = 8)",
            "four-stage",
            "planner (r2ccl-algo schedule)",
            "paper (recursive)",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    })
}

/// 175B on 1024 GPUs: failure-induced time against the AdapCC-like baseline and crash-and-restart.
pub fn scale_1024() -> Result<Table, SimError> {
    let sc = scenario("gpt3_175b_1024gpu")?;
    let r = sc.run()?;
    let adapcc = row_of(&r, Scheme::AdapCc).map_or(f64::NAN, |x| x.failure_induced_s);
    let mut rows = Vec::new();
    for x in &r.rows {
        let ratio = adapcc / x.failure_induced_s;
        let ratio = if ratio < 1.0 { format!("{ratio:.2}x") } else { format!("{ratio:.1}x") };
        rows.push(vec![
            x.strategy.name().into(),
            format!("{:.3}", x.healthy_seconds),
            if x.seconds.is_finite() { over_planner(&r, x) } else { pct(x.overhead_pct) },
            format!("{:.1}", x.failure_induced_s),
            ratio,
        ]);
    }
    Ok(Table {
        title: format!(
            "GPT-3 175B on 1024 GPUs, one NIC failure out for {} min: failure-induced time (paper: ~54x less than AdapCC)",
            sc.recovery.window_min
        ),
        header: ["strategy", "healthy iter s", "degraded overhead", "failure-induced s", "AdapCC / this"].map(String::from).to_vec(),
        rows,
    })
}

/// LLM decode with single NIC failures.
pub fn inference() -> Result<Table, SimError> {
    let mut sc = scenario("decode_tp16")?;
    sc.strategies.push(Scheme::Planner);
    let mut rows = Vec::new();
    for (label, kind) in [
        ("down", FailureKind::Down),
        ("black hole", FailureKind::BlackHole),
        ("degraded to 50%", FailureKind::Degraded { fraction: 0.5 }),
    ] {
        sc.failures = vec![Failure { node: 1, rail: 0, kind, at_s: 0.0, until_s: None }];
        let r = sc.run()?;
        let mut row = vec![
            label.to_string(),
            format!(
                "{:.3} ms",
                row_of(&r, Scheme::Planner).or(r.rows.first()).map_or(0.0, |x| x.healthy_seconds) * 1e3
            ),
        ];
        for s in [
            Scheme::HotRepair,
            Scheme::Balance,
            Scheme::R2cclAllReduce,
            Scheme::Recursive,
            Scheme::FourStage,
            Scheme::Planner,
        ] {
            row.push(row_of(&r, s).map_or("-".into(), |x| over_planner(&r, x)));
        }
        rows.push(row);
    }
    Ok(Table {
        title: "70B decode, TP=16 over 2 x 8 H100: time-per-token overhead of one NIC failure (paper: < 3%)".into(),
        header: [
            "failure",
            "healthy TPOT",
            "hot repair",
            "Balance",
            "R2CCL-AllReduce",
            "recursive",
            "four-stage",
            "planner (r2ccl-algo schedule)",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    })
}

/// Every table, in docs/reproduction.md order.
pub fn all_tables() -> Result<Vec<Table>, SimError> {
    Ok(vec![
        closed_form_table(16)?,
        exact_closed_form_table()?,
        gpt3_2p7b()?,
        gpt3_13b()?,
        scale_512(10, &FOUR_STAGE_FAILURES_512)?,
        scale_1024()?,
        inference()?,
    ])
}

/// The healthy plan view (re-exported for tools).
pub fn healthy_view(fabric: &Fabric) -> Vec<Vec<f64>> {
    healthy(fabric)
}
