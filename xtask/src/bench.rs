//! `cargo xtask bench`: the issue-7 benchmarks, written to `target/bench/report.{json,md}` and PNG plots.
//!
//! Parts (each selectable with `--part NAME`, all by default; `--quick` is a CI-sized smoke):
//! - `faultfree`: bus bandwidth versus size for every collective on the namespaces testbed
//!   (4 nodes x 2 NICs, tbf-shaped), against the line rate; plus a probe of what the shaped rails
//!   carry with all of them busy (plain blocking TCP streams started by this binary through the
//!   internal `bench --probe-sink PORT` / `bench --probe-source ADDR PORT SECS`): can this machine
//!   saturate the rate at all right now?
//! - `strategies`: one NIC down on one node (X = 0.5): AllReduce time of the strategy the library
//!   picks (`auto`), single backup (hot repair only), Balance, R2CCL-AllReduce and four-stage
//!   (forced through `R2CCL_POLICY__STRATEGY`), each against `r2ccl-plan`'s lower bound and prediction.
//! - `pause`: the failover pause (what the ranks print: `failover ... pause X ms`) for each fault
//!   kind (down, flap, black hole, egress drop), repeated; p50/p99.
//! - `timeline`: per-second bus bandwidth across a NIC failure and its recovery.
//! - `loopback`: no shaping, 4 ranks on this host, float32 AllReduce size sweep, r2ccl beside
//!   OpenMPI (`bench/peers/mpi_allreduce.c`) and Gloo (`bench/peers/gloo_allreduce.cc`), which are
//!   compiled here into `target/bench/`.
//! - `scale`: 8 B and 4 KiB AllReduce latency at 4, 16 and 32 ranks on this host, r2ccl beside
//!   OpenMPI and Gloo, with r2ccl's init time and OOB messages per collective (`bench/scale.rs`).
//! - `memory`: PSS and peak RSS per rank of a 64 MiB and a 256 MiB AllReduce on loopback, r2ccl
//!   beside OpenMPI and Gloo (`bench/memory.rs`).
//!
//! All but `loopback`, `scale` and `memory` need root (network namespaces, prefix `r2b`, distinct from e2e's `r2e` and the
//! interactive `r2t`); without it they are reported SKIPPED. Every child runs in its own process group
//! with a deadline; a child still running then is killed and reported as a hang. Failed runs are
//! reported in the report and make the command exit non-zero; missed performance targets do not.
//! Logs of every run stay in `target/bench/logs/<part>/`.
//!
//! Line rate: the tbf rate counts whole Ethernet frames, so the most TCP payload a shaped NIC can
//! carry is `rate x 8948/9014` (MSS 8948 with timestamps in a 9014-byte frame at the rails' MTU
//! 9000, `testbed::RAIL_MTU`). That
//! payload line rate (x NICs per node) is what the bus bandwidth targets and the planner's
//! predictions use; the report also gives the ratio to the nominal rate.

use crate::testbed::{self, Fault, Spec};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::cell::Cell;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod faultfree;
mod loopback;
mod memory;
mod parse;
mod pause;
mod plot;
mod procs;
mod scale;
mod strategies;
mod timeline;
pub(crate) use faultfree::testbed_size;
use faultfree::*;
use loopback::*;
use parse::*;
use pause::*;
use plot::*;
use procs::*;
use strategies::*;
use timeline::*;

/// Name prefix of the benchmark testbed.
const PREFIX: &str = "r2b";
/// First rendezvous port of rank 0 on its management address (one more per job).
const PORT_BASE: u16 = 29_511;
/// Default tbf rate per NIC. Measured here (2 cores, shared) when the rails ran at MTU 1500: 8
/// concurrent blocking TCP streams (every rail of 4 x 2 busy, as in a ring) carried 0.93 of the
/// payload line rate at 100mbit, but only 0.69 at 200mbit and 0.16 at 1gbit (the veth/bridge/tbf
/// path was CPU-bound near 150-200 MB/s in all); at MTU 9000 the probe reaches 0.998 at 100mbit.
/// The `faultfree` part re-measures it every run.
const DEFAULT_RATE: &str = "100mbit";
/// Most TCP payload per byte of a tbf-shaped link: the MSS (MTU less 40 bytes of IP and TCP
/// headers and 12 of timestamps) in an Ethernet frame (MTU plus 14).
const PAYLOAD_EFFICIENCY: f64 = (testbed::RAIL_MTU - 52) as f64 / (testbed::RAIL_MTU + 14) as f64;
/// The faulted NIC of the fault parts: node 1, rail 0 (`node1/nic0` in the ranks' event texts).
const FAULT_NODE: u32 = 1;
/// See [`FAULT_NODE`].
const FAULT_NIC: u32 = 0;
/// The per-message latency the communicator's planner assumes, us (what `r2ccl-plan --communicator` uses).
pub(crate) fn library_alpha_us() -> String {
    format!("{}", r2ccl_policy::COMMUNICATOR_ALPHA_S * 1e6)
}
/// The r2ccl curve of the `loopback` part that its ratios and targets use.
const LOOPBACK_TARGET_CURVE: &str = "r2ccl -R 1 in place";
/// The forced strategies of the `strategies` part (`auto` = the library's own choice).
const STRATEGIES: [&str; 6] =
    ["auto", "single_backup", "balance", "r2ccl_allreduce", "four_stage", "four_stage_direct"];

/// One benchmark part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Loopback,
    FaultFree,
    Strategies,
    Pause,
    Timeline,
    Memory,
    Scale,
}

impl Part {
    const ALL: [Part; 7] =
        [Part::FaultFree, Part::Strategies, Part::Pause, Part::Loopback, Part::Timeline, Part::Memory, Part::Scale];

    const fn name(self) -> &'static str {
        match self {
            Part::Loopback => "loopback",
            Part::FaultFree => "faultfree",
            Part::Strategies => "strategies",
            Part::Pause => "pause",
            Part::Timeline => "timeline",
            Part::Memory => "memory",
            Part::Scale => "scale",
        }
    }

    const fn title(self) -> &'static str {
        match self {
            Part::FaultFree => "1. Fault-free bus bandwidth vs size (4 nodes x 2 NICs, shaped)",
            Part::Strategies => "2. One NIC down on one node (X = 0.5): strategies vs lower bound and prediction",
            Part::Pause => "3. Failover pause per fault kind",
            Part::Loopback => "4. Loopback, 4 ranks, float32 AllReduce: r2ccl vs OpenMPI vs Gloo",
            Part::Timeline => "5. Bus bandwidth across a NIC failure and its recovery",
            Part::Memory => "6. Memory per rank, 4 ranks, AllReduce of 64 and 256 MiB: r2ccl vs OpenMPI vs Gloo",
            Part::Scale => {
                "7. Small-message latency at 4 to 32 ranks, init time and OOB messages: r2ccl vs OpenMPI vs Gloo"
            }
        }
    }

    const fn needs_root(self) -> bool {
        !matches!(self, Part::Loopback | Part::Memory | Part::Scale)
    }
}

pub(crate) const USAGE: &str =
    "usage: cargo xtask bench [--quick] [--part P[,P...]]... [--rate RATE] [--reps N] [--loopback-nics K]
       cargo xtask bench --micro      the criterion-style micro benchmarks (cargo bench --workspace)
parts: faultfree strategies pause loopback timeline memory scale (default: all); all but loopback, memory and scale need root
--quick            CI-sized smoke (small sizes, short runs; under 2 minutes with a healthy library)
--rate RATE        tbf rate per NIC of the testbed parts (default 100mbit; kbit/mbit/gbit)
--nics K           NICs per node of the 4-node testbed (default 2; 2..=8)
--reps N           repetitions per fault kind in the pause part (default 2 quick, 10 full)
--loopback-nics K  NICs (lo) per r2ccl rank in the loopback part (default 1, like the peers' one TCP path)
--strategies-size SIZE  AllReduce size per rank in the strategies part (default 64M, large as in the targets; 2M with --quick)
--strategies S[,S...]   run only these strategies there (auto single_backup balance r2ccl_allreduce four_stage
                        four_stage_direct)
--rank-env KEY=VALUE    set KEY in every testbed rank's environment (repeatable; after the bench's own)
writes target/bench/report.json, report.md, *.png; logs in target/bench/logs/";

/// Command-line options.
#[derive(Clone, Debug)]
struct Opts {
    parts: Vec<Part>,
    quick: bool,
    rate: String,
    reps: Option<u32>,
    loopback_nics: u32,
    strategies_size: Option<String>,
    strategies: Vec<String>,
    /// `--rank-env`: extra variables for every testbed rank.
    rank_env: Vec<(String, String)>,
    /// `--nics`: NICs per node of the testbed parts.
    nics: u32,
    micro: bool,
}

impl Opts {
    fn parse(args: &[String]) -> Result<Opts> {
        let mut o = Opts {
            parts: Vec::new(),
            quick: false,
            rate: DEFAULT_RATE.into(),
            reps: None,
            loopback_nics: 1,
            strategies_size: None,
            strategies: Vec::new(),
            rank_env: Vec::new(),
            nics: 2,
            micro: false,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| it.next().cloned().with_context(|| format!("{name} needs a value\n{USAGE}"));
            match a.as_str() {
                "--quick" => o.quick = true,
                "--micro" => o.micro = true,
                "--part" => {
                    for name in value("--part")?.split(',').filter(|s| !s.is_empty()) {
                        let p = Part::ALL.into_iter().find(|p| p.name() == name).with_context(|| {
                            let all: Vec<&str> = Part::ALL.iter().map(|p| p.name()).collect();
                            format!("unknown part `{name}`; parts: {}", all.join(" "))
                        })?;
                        if !o.parts.contains(&p) {
                            o.parts.push(p);
                        }
                    }
                }
                "--rate" => {
                    let r = value("--rate")?;
                    rate_bps(&r)?;
                    o.rate = r;
                }
                "--nics" => {
                    let n: u32 = value("--nics")?.parse().context("--nics: not a number")?;
                    if !(2..=8).contains(&n) {
                        bail!("--nics must be 2..=8");
                    }
                    o.nics = n;
                }
                "--reps" => {
                    let n: u32 = value("--reps")?.parse().context("--reps: not a number")?;
                    if n == 0 || n > 1000 {
                        bail!("--reps must be 1..=1000");
                    }
                    o.reps = Some(n);
                }
                "--loopback-nics" => {
                    let k: u32 = value("--loopback-nics")?.parse().context("--loopback-nics: not a number")?;
                    if k == 0 || k > 8 {
                        bail!("--loopback-nics must be 1..=8");
                    }
                    o.loopback_nics = k;
                }
                "--strategies-size" => {
                    let v = value("--strategies-size")?;
                    if testbed_size(&v) == 0 {
                        bail!("--strategies-size `{v}`: expected a size such as 64M");
                    }
                    o.strategies_size = Some(v);
                }
                "--strategies" => {
                    for name in value("--strategies")?.split(',').filter(|s| !s.is_empty()) {
                        if !STRATEGIES.contains(&name) {
                            bail!("unknown strategy `{name}`; strategies: {}", STRATEGIES.join(" "));
                        }
                        o.strategies.push(name.to_owned());
                    }
                }
                "--rank-env" => {
                    let v = value("--rank-env")?;
                    let (k, val) = v
                        .split_once('=')
                        .filter(|(k, _)| !k.is_empty() && !k.contains(char::is_whitespace))
                        .with_context(|| format!("--rank-env `{v}`: expected KEY=VALUE"))?;
                    o.rank_env.push((k.to_owned(), val.to_owned()));
                }
                "-h" | "--help" => bail!("{USAGE}"),
                other => bail!("bench: unknown argument `{other}`\n{USAGE}"),
            }
        }
        if o.parts.is_empty() {
            o.parts = Part::ALL.to_vec();
        }
        Ok(o)
    }
}

/// The most TCP payload one shaped NIC carries at tc rate `rate`, in Gb/s (what the planner is
/// told: see the top of this file).
pub(crate) fn payload_line_gbps(rate: &str) -> Result<f64> {
    Ok(rate_bps(rate)? * PAYLOAD_EFFICIENCY / 1e9)
}

/// A tc rate (`1gbit`, `500mbit`, `100000kbit`, `64000bit`) in bits per second.
fn rate_bps(rate: &str) -> Result<f64> {
    let r = rate.trim().to_ascii_lowercase();
    let split = r.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(r.len());
    let (num, unit) = r.split_at(split);
    let v: f64 = num.parse().map_err(|_| anyhow!("rate `{rate}`: expected a number with kbit, mbit or gbit"))?;
    let mult = match unit {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        _ => bail!("rate `{rate}`: unit must be bit, kbit, mbit or gbit"),
    };
    if !(v.is_finite() && v > 0.0) {
        bail!("rate `{rate}` must be positive");
    }
    Ok(v * mult)
}

// ---------------------------------------------------------------------------------------------
// Context, testbed guard and rank jobs.

/// What every part needs.
struct Ctx {
    out: PathBuf,
    perf: PathBuf,
    quick: bool,
    spec: Spec,
    reps: u32,
    loopback_nics: u32,
    strategies_size: Option<String>,
    strategies: Vec<String>,
    /// `--rank-env`: extra variables for every testbed rank.
    rank_env: Vec<(String, String)>,
    next_port: Cell<u16>,
    /// Why plots cannot be drawn (no font), if so.
    no_plots: Option<String>,
}

impl Ctx {
    fn logs(&self, part: Part) -> Result<PathBuf> {
        let dir = self.out.join("logs").join(part.name());
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }

    fn port(&self) -> u16 {
        let p = self.next_port.get();
        self.next_port.set(if p >= PORT_BASE + 400 { PORT_BASE } else { p + 1 });
        p
    }

    fn rate_bps(&self) -> f64 {
        self.spec.rate.as_deref().and_then(|r| rate_bps(r).ok()).unwrap_or(f64::NAN)
    }

    /// Nominal line rate of one node (all its NICs), GB/s.
    fn node_nominal_gbs(&self) -> f64 {
        self.rate_bps() * f64::from(self.spec.nics) / 8e9
    }

    /// Payload line rate of one node, GB/s (see the module docs).
    fn node_line_gbs(&self) -> f64 {
        self.node_nominal_gbs() * PAYLOAD_EFFICIENCY
    }

    /// Payload line rate of one NIC, Gb/s (`r2ccl-plan --nic-gbps`).
    fn nic_line_gbps(&self) -> f64 {
        self.spec.rate.as_deref().and_then(|r| payload_line_gbps(r).ok()).unwrap_or(f64::NAN)
    }
}

/// The benchmark testbed; torn down when dropped.
struct Bed {
    spec: Spec,
}

impl Bed {
    fn up(spec: &Spec) -> Result<Bed> {
        testbed::up(spec).with_context(|| format!("bringing up testbed `{}`", spec.prefix))?;
        Ok(Bed { spec: spec.clone() })
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        if let Err(e) = testbed::down(&self.spec.prefix) {
            eprintln!("bench: teardown of testbed `{}` failed: {e:#}", self.spec.prefix);
        }
    }
}

/// One fault of a job's timeline, seconds after rank 0's timeline (or table) starts.
#[derive(Clone, Debug)]
struct Step {
    at_s: f64,
    node: u32,
    nic: u32,
    fault: Fault,
}

/// One r2ccl-perf job on the testbed: one rank per node.
struct Job {
    name: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    faults: Vec<Step>,
    deadline: Duration,
}

/// What a job produced.
struct JobOut {
    ends: Vec<End>,
    rank0_out: String,
    /// Faults as applied: (seconds after t0, text).
    applied: Vec<(f64, String)>,
    /// When each fault was applied (the clock just before its command), Unix seconds, to compare with
    /// the ranks' log timestamps.
    applied_unix: Vec<f64>,
    /// Every rank's stderr (its log).
    errs: Vec<String>,
    /// Problems: non-zero exits, hangs, wrong results, faults that could not be applied.
    problems: Vec<String>,
    secs: f64,
}

/// Start one rank per node in its namespace, apply the fault timeline from the moment rank 0
/// prints its timeline or table header, wait to the deadline, judge.
fn run_job(ctx: &Ctx, spec: &Spec, job: &Job, logs: &Path) -> Result<JobOut> {
    let secret = secret()?;
    let nics: Vec<String> = (0..spec.nics).map(|r| format!("rail{r}")).collect();
    let root = format!("{}:{}", Spec::mgmt_addr(0), ctx.port());
    let start = Instant::now();
    let deadline = start + job.deadline;
    let mut procs = Vec::new();
    for i in 0..spec.nodes {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &spec.node_ns(i)]).arg(&ctx.perf).args(&job.args);
        clean_env(&mut cmd);
        cmd.env("R2CCL_RANK", i.to_string())
            .env("R2CCL_WORLD_SIZE", spec.nodes.to_string())
            .env("R2CCL_ROOT", &root)
            .env("R2CCL_SECRET", &secret)
            .env("R2CCL_NICS", nics.join(","))
            .env("R2CCL_NODE", format!("node{i}"))
            .env("R2CCL_OOB_IFACE", "mgmt0")
            .env("UCX_LOG_LEVEL", std::env::var("UCX_LOG_LEVEL").unwrap_or_else(|_| "fatal".into()));
        // veth reports 10000 Mbit/s whatever tbf lets through: tell the planner the shaped rate.
        if let Some(bps) = spec.rate.as_deref().and_then(|r| rate_bps(r).ok()) {
            cmd.env("R2CCL_TRANSPORT__NIC_SPEED_MBPS", ((bps / 1e6).round() as u64).max(1).to_string());
        }
        for (k, v) in job.env.iter().chain(&ctx.rank_env) {
            cmd.env(k, v);
        }
        procs.push(Proc::spawn(cmd, &format!("{}.rank{i}", job.name), logs)?);
    }
    // t0: rank 0's timeline header (`time(s)`) or table header (`#wrong`), or a rank ending.
    let out0 = procs[0].out.clone();
    loop {
        let text = read(&out0);
        if text.contains("time(s)") || text.contains("#wrong") || Instant::now() >= deadline {
            break;
        }
        if procs.iter_mut().any(Proc::poll) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let t0 = Instant::now();
    let mut problems = Vec::new();
    let mut applied = Vec::new();
    let mut applied_unix = Vec::new();
    for step in &job.faults {
        let at = t0 + Duration::from_secs_f64(step.at_s);
        let text = format!("node {} nic {} {}", step.node, step.nic, step.fault.name());
        if at > deadline {
            problems.push(format!("fault `{text}` at {:.2} s falls after the deadline", step.at_s));
            continue;
        }
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        // The wall clock just before the fault's command: the command takes milliseconds and a
        // NIC going down is acted on in under one, so a time taken after it let failovers look
        // earlier than their fault (and left them out of the pause part's figures).
        let before = unix_now_f64();
        match testbed::fault(spec, step.node, step.nic, &step.fault) {
            Ok(()) => {
                applied.push((t0.elapsed().as_secs_f64(), text));
                applied_unix.push(before);
            }
            Err(e) => problems.push(format!("fault `{text}`: {e:#}")),
        }
    }
    wait_all(&mut procs, deadline);
    let ends: Vec<End> = procs.iter().map(|p| p.end.unwrap_or(End::Killed)).collect();
    let hung: Vec<String> =
        ends.iter().enumerate().filter(|(_, e)| matches!(e, End::Killed)).map(|(r, _)| r.to_string()).collect();
    if !hung.is_empty() {
        problems.push(format!(
            "HANG: rank(s) {} still running at the {} s deadline (killed)",
            hung.join(","),
            job.deadline.as_secs()
        ));
    }
    for (r, p) in procs.iter().enumerate() {
        if let End::Exited(s) = ends[r] {
            if !s.success() {
                problems.push(format!("rank {r} exited with {}{}", End::Exited(s).describe(), last_line(&p.stderr())));
            }
        }
    }
    let rank0_out = procs[0].stdout();
    if !rank0_out.contains("# Out of bounds values : 0 OK") {
        problems.push("rank 0 did not print `# Out of bounds values : 0 OK` (wrong results or no end)".into());
    }
    let problems = problems.into_iter().map(|p| format!("{}: {p} (logs {})", job.name, logs.display())).collect();
    let errs = procs.iter().map(Proc::stderr).collect();
    Ok(JobOut { ends, rank0_out, applied, applied_unix, errs, problems, secs: start.elapsed().as_secs_f64() })
}

// ---------------------------------------------------------------------------------------------
// Targets and part results.

/// How a target compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    AtLeast,
    AtMost,
    /// Reported, no threshold.
    Info,
}

/// One target ratio of the issue.
#[derive(Clone, Debug)]
struct Target {
    id: &'static str,
    what: &'static str,
    value: Option<f64>,
    limit: f64,
    cmp: Cmp,
    detail: String,
}

impl Target {
    fn status(&self) -> &'static str {
        match (self.value.filter(|v| v.is_finite()), self.cmp) {
            (None, _) => "NOT MEASURED",
            (Some(_), Cmp::Info) => "INFO",
            (Some(v), Cmp::AtLeast) => {
                if v >= self.limit {
                    "MET"
                } else {
                    "MISSED"
                }
            }
            (Some(v), Cmp::AtMost) => {
                if v <= self.limit {
                    "MET"
                } else {
                    "MISSED"
                }
            }
        }
    }

    fn want(&self) -> String {
        match self.cmp {
            Cmp::AtLeast => format!(">= {}", self.limit),
            Cmp::AtMost => format!("<= {}", self.limit),
            Cmp::Info => "(report)".into(),
        }
    }

    fn json(&self) -> Value {
        json!({"id": self.id, "what": self.what, "value": num(self.value), "limit": self.limit,
               "comparison": self.want(), "status": self.status(), "detail": self.detail})
    }
}

/// The targets of a part, unmeasured (`why`).
fn unmeasured(part: Part, why: &str) -> Vec<Target> {
    let t = |id, what, limit, cmp| Target { id, what, value: None, limit, cmp, detail: why.to_owned() };
    match part {
        Part::FaultFree => vec![t(
            "faultfree_allreduce_busbw_over_line_rate",
            "fault-free AllReduce busbw at >= 64 MiB / line rate",
            0.95,
            Cmp::AtLeast,
        )],
        Part::Strategies => vec![
            t("nic_down_time_over_lower_bound", "one NIC down, AllReduce time / lower bound", 1.05, Cmp::AtMost),
            t("nic_down_prediction_error", "one NIC down, |time / policy prediction - 1|", 0.05, Cmp::AtMost),
            t(
                "nic_down_slowdown_over_bound_slowdown",
                "one NIC down, (time / same run's fault-free time) / (lower bound / t_nf)",
                0.0,
                Cmp::Info,
            ),
        ],
        Part::Loopback => vec![
            t("loopback_64m_busbw_over_best_peer", "loopback 64 MiB busbw / best of OpenMPI, Gloo", 1.0, Cmp::AtLeast),
            t("loopback_small_latency_ratio", "loopback small-message time / best peer's", 0.0, Cmp::Info),
        ],
        Part::Pause => vec![t("nic_down_pause_p50_ms", "pause after a NIC goes down, p50 (ms)", 50.0, Cmp::AtMost)],
        Part::Timeline => vec![],
        Part::Memory => memory::targets(t),
        Part::Scale => scale::targets(t),
    }
}

/// The outcome of one part.
struct PartResult {
    part: Part,
    /// ok | problems | failed | skipped
    status: &'static str,
    json: Value,
    md: String,
    targets: Vec<Target>,
    problems: Vec<String>,
    plots: Vec<String>,
    secs: f64,
}

impl PartResult {
    fn new(part: Part) -> Self {
        PartResult {
            part,
            status: "ok",
            json: json!({}),
            md: String::new(),
            targets: Vec::new(),
            problems: Vec::new(),
            plots: Vec::new(),
            secs: 0.0,
        }
    }

    fn plot(&mut self, ctx: &Ctx, file: &str, draw: impl FnOnce(&Path) -> Result<()>) {
        if let Some(why) = &ctx.no_plots {
            self.problems.push(format!("plot {file} not drawn: {why}"));
            return;
        }
        let path = ctx.out.join(file);
        match draw(&path) {
            Ok(()) => self.plots.push(file.to_owned()),
            Err(e) => self.problems.push(format!("plot {file}: {e:#}")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Driver and report.

fn run_part(ctx: &Ctx, part: Part, root: bool) -> PartResult {
    let start = Instant::now();
    let mut res = if part.needs_root() && !root {
        println!("******** bench part {} SKIPPED (not root): it needs network namespaces ********", part.name());
        let mut r = PartResult::new(part);
        r.status = "skipped";
        r.md = "**SKIPPED: not root (the namespaces testbed needs root).**\n".into();
        r.targets = unmeasured(part, "part skipped: not root");
        r
    } else {
        println!("bench: part {} ...", part.name());
        let out = match part {
            Part::FaultFree => part_faultfree(ctx),
            Part::Strategies => part_strategies(ctx),
            Part::Pause => part_pause(ctx),
            Part::Timeline => part_timeline(ctx),
            Part::Loopback => part_loopback(ctx),
            Part::Memory => memory::part_memory(ctx),
            Part::Scale => scale::part_scale(ctx),
        };
        match out {
            Ok(mut r) => {
                if !r.problems.is_empty() {
                    r.status = "problems";
                }
                // Targets a part could not reach keep their place in the report.
                for t in unmeasured(part, "not measured") {
                    if !r.targets.iter().any(|x| x.id == t.id) {
                        r.targets.push(t);
                    }
                }
                r
            }
            Err(e) => {
                let mut r = PartResult::new(part);
                r.status = "failed";
                r.md = format!("**FAILED: {e:#}**\n");
                r.problems.push(format!("{e:#}"));
                r.targets = unmeasured(part, &format!("part failed: {e:#}"));
                r
            }
        }
    };
    res.secs = start.elapsed().as_secs_f64();
    println!("bench: part {} {} in {:.1} s", part.name(), res.status, res.secs);
    res
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn unix_now_f64() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// `cargo xtask bench [...]`.
pub(crate) fn main(args: &[String]) -> Result<()> {
    match args {
        [a, port] if a == "--probe-sink" => return probe_sink(port),
        [a, addr, port, secs] if a == "--probe-source" => return probe_source(addr, port, secs),
        _ => {}
    }
    let opts = Opts::parse(args)?;
    if opts.micro {
        return crate::cmd("cargo", &["bench", "--workspace"]);
    }
    let started = Instant::now();
    let load_start = load_avg();
    let root_dir = crate::workspace_root();
    let out = root_dir.join("target/bench");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let root = crate::is_root();
    // Another bench would tear this one's testbed down (and its logs share target/bench).
    let _lock = if root { Some(testbed::PrefixLock::take(PREFIX)?) } else { None };
    let _ = std::fs::remove_dir_all(out.join("logs"));
    if opts.parts.iter().any(|p| root || !p.needs_root()) {
        crate::cmd("cargo", &["build", "--release", "-q", "-p", "r2ccl-perf", "--bin", "r2ccl-perf"])?;
    }
    let ctx = Ctx {
        perf: crate::target_dir().join("release/r2ccl-perf"),
        out: out.clone(),
        quick: opts.quick,
        spec: Spec { prefix: PREFIX.into(), nodes: 4, nics: opts.nics, rate: Some(opts.rate.clone()) },
        reps: opts.reps.unwrap_or(if opts.quick { 2 } else { 10 }),
        loopback_nics: opts.loopback_nics,
        strategies_size: opts.strategies_size.clone(),
        strategies: opts.strategies.clone(),
        rank_env: opts.rank_env.clone(),
        next_port: Cell::new(PORT_BASE),
        no_plots: register_font().err(),
    };
    if root {
        // A crashed earlier run may have left its namespaces behind.
        testbed::down(PREFIX)?;
    }
    let results: Vec<PartResult> = opts.parts.iter().map(|&p| run_part(&ctx, p, root)).collect();
    let secs = started.elapsed().as_secs_f64();
    let targets: Vec<&Target> = results.iter().flat_map(|r| r.targets.iter()).collect();
    let problems: Vec<String> =
        results.iter().flat_map(|r| r.problems.iter().map(move |p| format!("{}: {p}", r.part.name()))).collect();
    let mode = if opts.quick { "quick" } else { "full" };
    let report = json!({
        "command": format!("cargo xtask bench {}", args.join(" ")).trim_end().to_owned(),
        "mode": mode,
        "unix_time": unix_now(),
        "duration_s": secs,
        "root": root,
        "machine": {"cores": std::thread::available_parallelism().map_or(0, |n| n.get()), "load_avg_start": load_start, "load_avg_end": load_avg()},
        "testbed": {"prefix": PREFIX, "nodes": ctx.spec.nodes, "nics": ctx.spec.nics, "rate": ctx.spec.rate,
            "nominal_gbs_per_node": ctx.node_nominal_gbs(), "line_rate_gbs_per_node": ctx.node_line_gbs(),
            "payload_efficiency": PAYLOAD_EFFICIENCY},
        "targets": targets.iter().map(|t| t.json()).collect::<Vec<_>>(),
        "parts": results.iter().map(|r| (r.part.name().to_owned(), json!({"status": r.status, "secs": r.secs,
            "problems": r.problems, "plots": r.plots, "data": r.json}))).collect::<serde_json::Map<_, _>>(),
        "problems": problems,
    });
    std::fs::write(out.join("report.json"), serde_json::to_string_pretty(&report)?)?;

    let mut md = format!(
        "# r2ccl benchmark report ({mode})\n\n`{}` — {:.0} s on {} cores, load average {} at the start, {} at the end; {}.\n\n",
        report["command"].as_str().unwrap_or(""),
        secs,
        report["machine"]["cores"],
        load_start,
        load_avg(),
        if root { "root" } else { "not root: testbed parts SKIPPED" }
    );
    md.push_str("## Targets\n\n| target | value | wanted | status | detail |\n|---|---|---|---|---|\n");
    for t in &targets {
        let _ = writeln!(md, "| {} | {} | {} | **{}** | {} |", t.what, opt(t.value, 3), t.want(), t.status(), t.detail);
    }
    md.push_str("\n## Parts\n\n| part | status | time (s) | plots |\n|---|---|---|---|\n");
    for r in &results {
        let _ = writeln!(md, "| {} | {} | {:.1} | {} |", r.part.name(), r.status, r.secs, r.plots.join(" "));
    }
    for r in &results {
        let _ = write!(md, "\n## {}\n\n{}\n", r.part.title(), r.md);
        for p in &r.plots {
            let _ = writeln!(md, "![{p}]({p})");
        }
    }
    md.push_str("\n## Problems\n\n");
    if problems.is_empty() {
        md.push_str("none\n");
    }
    for p in &problems {
        let _ = writeln!(md, "- {p}");
    }
    std::fs::write(out.join("report.md"), &md)?;

    println!("\nbench: targets");
    for t in &targets {
        println!("  {:<13} {:<60} {:>10} (want {}) {}", t.status(), t.what, opt(t.value, 3), t.want(), t.detail);
    }
    println!(
        "bench: {} part(s) in {secs:.0} s; report {}, {}",
        results.len(),
        out.join("report.md").display(),
        out.join("report.json").display()
    );
    if !problems.is_empty() {
        for p in &problems {
            println!("  PROBLEM {p}");
        }
        bail!("bench: {} problem(s) (failed, hung or wrong runs); see target/bench/report.md", problems.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_plots_tick_small_values_with_decimals() {
        assert_eq!(tick_decimals(2.875), 1, "ticks 0.5 apart print as 0.0, 0.5, 1.0");
        assert_eq!(tick_decimals(0.3), 2);
        assert_eq!(tick_decimals(300.0), 0);
        assert_eq!(tick_decimals(0.0), 0);
        // Drawn when the font is there (the Debian fonts-dejavu-core package), for a look.
        if register_font().is_ok() {
            let dots: Vec<(String, f64)> =
                [("down", 0.4), ("down", 1.2), ("flap", 0.8), ("blackhole", 2.5), ("drop", 1.9)]
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), *v))
                    .collect();
            let path = std::env::temp_dir().join("r2ccl-dots-test.png");
            plot_dots(&path, "pause", "pause (ms)", &["down", "flap", "blackhole", "drop"], &dots).unwrap();
            assert!(std::fs::metadata(&path).unwrap().len() > 1000);
        }
    }

    #[test]
    fn parses_rank0_timeline_and_events() {
        let out = "#  time(s)   busbw(GB/s)  strategy   events\n\
                   #   event    1315 ms  failover comm1/seq1/step0 rank0->rank2 lane0: node0/nic0=>node1/nic0@rank1 -> node0/nic1=>node1/nic1@rank1, replay from chunk 0 (0 chunks again), verdict remote_nic, pause 18.4 ms\n\
                   #   event    1348 ms  fail-back comm1/seq1/step0 rank0->rank2 lane0: a -> b, replay from chunk 0 (0 chunks again), verdict recovered, pause 28.2 ms\n\
                   \x20      1.0         0.180  ring       \n\
                   \x20      2.0         0.120  four_stage failover\n\
                   # event   22165 ms  path node0/nic0=>node1/nic0@rank1 failed (Timeout)\n";
        let s = parse_timeline(out);
        assert_eq!(s.len(), 2);
        let precise = timeline_samples(
            out,
            r#"{"timeline": [[1.04, 0.18012, false], [2.01, 0.1234, true]], "events": [], "wrong": 0}"#,
        );
        assert_eq!(precise[1], Sample { at: 2.01, busbw: 0.1234, strategy: "four_stage".into(), failover: true });
        assert_eq!(timeline_samples(out, "not json"), s);
        assert_eq!(s[1], Sample { at: 2.0, busbw: 0.12, strategy: "four_stage".into(), failover: true });
        assert!(!s[0].failover);
        let e = parse_events(out);
        assert_eq!(e.len(), 3);
        assert_eq!(e[2].at_ms, 22165);
        assert_eq!(failover_pause(&e[0].text), Some((18.4, "node0/nic0=>node1/nic0@rank1".into())));
        assert_eq!(failover_pause(&e[1].text), None, "fail-backs are not failover pauses");
        assert_eq!(failover_pause(&e[2].text), None);
    }

    #[test]
    fn parses_rank_logs() {
        let log = "2026-12-02T15:53:56.399174Z  INFO r2ccl::net: failover comm1/seq31/step0 rank0->rank1 lane0: node0/nic0=>node1/nic0@rank1 -> node0/nic1=>node1/nic1@rank1, replay from chunk 0 (1 chunks again), verdict remote_nic, pause 8.1 ms rank=0\n\
                   2026-12-02T15:53:56.400000Z  INFO r2ccl::net: fail-back comm1/seq31/step0 rank0->rank1 lane0: a -> b, verdict recovered, pause 3.0 ms rank=0\n\
                   2026-12-02T15:53:56.397501Z  WARN r2ccl::net: path down rank=rank1\n";
        let f = log_failovers(log);
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].pause_ms, f[0].from.as_str()), (8.1, "node0/nic0=>node1/nic0@rank1"));
        // 2026-12-02 is day 20_789 since 1970-01-01.
        assert!((f[0].at - (20_789.0 * 86_400.0 + 15.0 * 3600.0 + 53.0 * 60.0 + 56.399_174)).abs() < 1e-6);
        assert_eq!(parse_utc("1970-01-01T00:00:01.5Z"), Some(1.5));
        assert_eq!(parse_utc("2000-03-01T00:00:00Z"), Some(951_868_800.0));
        assert_eq!(parse_utc("garbage"), None);
    }

    #[test]
    fn parses_peer_lines_and_perf_json() {
        let out = "noise\nR2B peer=mpi size=1024 count=256 iters=5 time_us=60.5 algbw=0.01 busbw=0.02 wrong=0\nR2B peer=gloo size=x\n";
        assert_eq!(parse_peer(out), vec![PeerRow { size: 1024, time_us: 60.5, busbw: 0.02, wrong: 0 }]);
        let j = r#"{"collective":"all_reduce","nranks":4,"rows":[{"bytes":1024,"count":256,"dtype":"float","op":"sum","root":null,
            "out_of_place":{"time_us":10.0,"algbw":0.1,"busbw":0.15,"wrong":0},"in_place":{"time_us":11.0,"algbw":0.09,"busbw":0.14,"wrong":2},
            "oob_per_call":3.0}],"wrong":2,"avg_busbw":0.145,"events":["12 ms failover x"],"init_ms":16.5}"#;
        let r = parse_perf_json(j).unwrap();
        let want = PerfRow {
            bytes: 1024,
            time_us: 10.0,
            busbw: 0.15,
            time_in_place_us: 11.0,
            busbw_in_place: 0.14,
            wrong: 2,
            oob_per_call: 3.0,
        };
        assert_eq!(r.rows, vec![want]);
        assert_eq!(r.events, vec!["12 ms failover x".to_owned()]);
        assert_eq!(r.init_ms, Some(16.5));
        assert!(parse_perf_json("{}").is_err());
    }

    #[test]
    fn statistics_rates_and_targets() {
        let v = [5.0, 1.0, 4.0, 2.0, 3.0];
        assert_eq!(percentile(&v, 0.5), Some(3.0));
        assert_eq!(percentile(&v, 0.99), Some(5.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(mode(&["a".into(), "b".into(), "b".into()]), Some("b".into()));
        assert!((rate_bps("1gbit").unwrap() - 1e9).abs() < 1.0);
        assert!((rate_bps("500mbit").unwrap() - 5e8).abs() < 1.0);
        assert!(rate_bps("1gbps").is_err() && rate_bps("x").is_err());
        assert_eq!((testbed_size("256K"), testbed_size("64M"), testbed_size("4")), (256 << 10, 64 << 20, 4));
        assert_eq!(human_bytes(1024.0 * 1024.0 * 64.0), "64M");
        assert_eq!(
            (sig(0.12345), sig(0.0000123456), sig(12.5)),
            ("0.1235".into(), "0.00001235".into(), "12.50".into())
        );
        let mut t = unmeasured(Part::Pause, "x").remove(0);
        assert_eq!(t.status(), "NOT MEASURED");
        t.value = Some(49.0);
        assert_eq!(t.status(), "MET");
        t.value = Some(51.0);
        assert_eq!(t.status(), "MISSED");
        assert!((busbw_factor("all_reduce", 4) - 1.5).abs() < 1e-12);
        let o = Opts::parse(&["--quick".into(), "--part".into(), "loopback,pause".into()]).unwrap();
        assert!(o.quick && o.parts == vec![Part::Loopback, Part::Pause]);
        assert!(Opts::parse(&["--part".into(), "nope".into()]).is_err());
    }

    /// A child past its deadline is killed with its process group and reported as hung.
    #[test]
    fn deadline_kills_the_group() {
        let dir = std::env::temp_dir().join(format!("r2b-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & sleep 30"]);
        let t = Instant::now();
        let err = run_to_end(cmd, "sleeper", &dir, Duration::from_millis(300)).unwrap_err();
        assert!(err.to_string().contains("killed"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5));
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo hi"]);
        assert_eq!(run_to_end(ok, "echo", &dir, Duration::from_secs(10)).unwrap().trim(), "hi");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
