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
//! - `memory`: PSS and peak RSS per rank of a 64 MiB and a 256 MiB AllReduce on loopback, r2ccl
//!   beside OpenMPI and Gloo (`bench/memory.rs`).
//!
//! All but `loopback` and `memory` need root (network namespaces, prefix `r2b`, distinct from e2e's `r2e` and the
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

mod memory;

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
/// The per-message latency the communicator's planner assumes, us (`LOOPBACK_ALPHA_S`).
pub(crate) const LIBRARY_ALPHA_US: &str = "20";
/// The r2ccl curve of the `loopback` part that its ratios and targets use.
const LOOPBACK_TARGET_CURVE: &str = "r2ccl -R 1 in place";
/// The forced strategies of the `strategies` part (`auto` = the library's own choice).
const STRATEGIES: [&str; 5] = ["auto", "single_backup", "balance", "r2ccl_allreduce", "four_stage"];

/// One benchmark part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Loopback,
    FaultFree,
    Strategies,
    Pause,
    Timeline,
    Memory,
}

impl Part {
    const ALL: [Part; 6] =
        [Part::FaultFree, Part::Strategies, Part::Pause, Part::Loopback, Part::Timeline, Part::Memory];

    const fn name(self) -> &'static str {
        match self {
            Part::Loopback => "loopback",
            Part::FaultFree => "faultfree",
            Part::Strategies => "strategies",
            Part::Pause => "pause",
            Part::Timeline => "timeline",
            Part::Memory => "memory",
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
        }
    }

    const fn needs_root(self) -> bool {
        !matches!(self, Part::Loopback | Part::Memory)
    }
}

pub(crate) const USAGE: &str =
    "usage: cargo xtask bench [--quick] [--part P[,P...]]... [--rate RATE] [--reps N] [--loopback-nics K]
       cargo xtask bench --micro      the criterion-style micro benchmarks (cargo bench --workspace)
parts: faultfree strategies pause loopback timeline memory (default: all); all but loopback and memory need root
--quick            CI-sized smoke (small sizes, short runs; under 2 minutes with a healthy library)
--rate RATE        tbf rate per NIC of the testbed parts (default 100mbit; kbit/mbit/gbit)
--nics K           NICs per node of the 4-node testbed (default 2; 2..=8)
--reps N           repetitions per fault kind in the pause part (default 2 quick, 10 full)
--loopback-nics K  NICs (lo) per r2ccl rank in the loopback part (default 1, like the peers' one TCP path)
--strategies-size SIZE  AllReduce size per rank in the strategies part (default 64M, large as in the targets; 2M with --quick)
--strategies S[,S...]   run only these strategies there (auto single_backup balance r2ccl_allreduce four_stage)
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
// Child processes with deadlines.

/// How a child ended.
#[derive(Clone, Copy, Debug)]
enum End {
    Exited(ExitStatus),
    /// Still running at the deadline; its process group was killed.
    Killed,
}

impl End {
    fn ok(self) -> bool {
        matches!(self, End::Exited(s) if s.success())
    }
    fn describe(self) -> String {
        match self {
            End::Exited(s) => s.code().map_or_else(|| s.to_string(), |c| c.to_string()),
            End::Killed => "hang".into(),
        }
    }
}

/// A child in its own process group, stdout and stderr in files; killed (group) when dropped.
struct Proc {
    name: String,
    child: Child,
    out: PathBuf,
    err: PathBuf,
    end: Option<End>,
}

impl Proc {
    fn spawn(mut cmd: Command, name: &str, logs: &Path) -> Result<Proc> {
        let out = logs.join(format!("{name}.out"));
        let err = logs.join(format!("{name}.err"));
        cmd.stdin(Stdio::null())
            .stdout(File::create(&out).with_context(|| format!("creating {}", out.display()))?)
            .stderr(File::create(&err).with_context(|| format!("creating {}", err.display()))?)
            .process_group(0);
        let child = cmd.spawn().with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(Proc { name: name.to_owned(), child, out, err, end: None })
    }

    /// Record the exit if it happened; true once ended.
    fn poll(&mut self) -> bool {
        if self.end.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.end = Some(End::Exited(s));
            }
        }
        self.end.is_some()
    }

    /// Kill the whole process group (launchers such as mpirun leave children otherwise).
    fn kill(&mut self) {
        if !self.poll() {
            let pgid = format!("-{}", self.child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &pgid]).output();
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.end = Some(End::Killed);
        }
    }

    fn stdout(&self) -> String {
        read(&self.out)
    }

    fn stderr(&self) -> String {
        read(&self.err)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Wait for every process until `deadline`; those still running then are killed and marked hung.
fn wait_all(procs: &mut [Proc], deadline: Instant) {
    loop {
        let mut all = true;
        for p in procs.iter_mut() {
            all &= p.poll();
        }
        if all {
            return;
        }
        if Instant::now() >= deadline {
            for p in procs.iter_mut() {
                p.kill();
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run one command to its end or its deadline; Ok(stdout) if it exited 0, else an error naming
/// the command, the way it ended and the last stderr line.
fn run_to_end(cmd: Command, name: &str, logs: &Path, limit: Duration) -> Result<String> {
    let mut p = Proc::spawn(cmd, name, logs)?;
    wait_all(std::slice::from_mut(&mut p), Instant::now() + limit);
    match p.end {
        Some(e) if e.ok() => Ok(p.stdout()),
        Some(End::Killed) | None => {
            bail!("{name}: still running after {} s (killed); logs {}", limit.as_secs(), logs.display())
        }
        Some(e) => bail!("{name}: exited with {}{}; logs {}", e.describe(), last_line(&p.stderr()), logs.display()),
    }
}

fn read(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// The last non-empty line of a log, for an error message.
fn last_line(text: &str) -> String {
    text.lines().rev().find(|l| !l.trim().is_empty()).map(|l| format!(" (stderr: {})", l.trim())).unwrap_or_default()
}

fn have(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

/// 16 random bytes from the kernel as 32 hex digits (the job secret).
fn secret() -> Result<String> {
    let mut b = [0u8; 16];
    File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).context("reading /dev/urandom")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// `cmd` with every inherited `R2CCL_*` variable but the logging ones removed.
fn clean_env(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("R2CCL_") && k != "R2CCL_DEBUG" && k != "R2CCL_DEBUG_SUBSYS" {
            cmd.env_remove(k);
        }
    }
}

fn load_avg() -> String {
    read(Path::new("/proc/loadavg")).split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

// ---------------------------------------------------------------------------------------------
// Context, testbed guard and rank jobs.

/// What every part needs.
struct Ctx {
    out: PathBuf,
    perf: PathBuf,
    plan: PathBuf,
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
// Parsing what the programs print.

/// One window of r2ccl-perf's `-N 0` timeline.
#[derive(Clone, Debug, PartialEq)]
struct Sample {
    at: f64,
    busbw: f64,
    strategy: String,
    failover: bool,
}

/// The timeline rows of rank 0's stdout: `  AT  BUSBW  STRATEGY [failover]`.
fn parse_timeline(stdout: &str) -> Vec<Sample> {
    stdout
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (at, busbw) = (f.first()?.parse().ok()?, f.get(1)?.parse().ok()?);
            Some(Sample {
                at,
                busbw,
                strategy: f.get(2).map_or_else(String::new, |s| (*s).to_owned()),
                failover: f.get(3) == Some(&"failover"),
            })
        })
        .collect()
}

/// The timeline windows at full precision from r2ccl-perf's `--json` (`{"timeline": [[AT, BUSBW,
/// EVENT], ...]}`), with the strategy of each window from stdout (the JSON lacks it); stdout alone
/// (3 decimals of GB/s) when the JSON is missing or malformed.
fn timeline_samples(stdout: &str, json_text: &str) -> Vec<Sample> {
    let text = parse_timeline(stdout);
    let Ok(v) = serde_json::from_str::<Value>(json_text) else { return text };
    let Some(rows) = v["timeline"].as_array() else { return text };
    let precise: Option<Vec<Sample>> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            Some(Sample {
                at: r.get(0)?.as_f64()?,
                busbw: r.get(1)?.as_f64()?,
                failover: r.get(2)?.as_bool()?,
                strategy: text.get(i).map_or_else(String::new, |s| s.strategy.clone()),
            })
        })
        .collect();
    precise.unwrap_or(text)
}

/// One event line of rank 0 (`# event MS ms TEXT` or `#   event MS ms TEXT`).
#[derive(Clone, Debug, PartialEq)]
struct Event {
    at_ms: u64,
    text: String,
}

fn parse_events(stdout: &str) -> Vec<Event> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix('#')?.trim_start().strip_prefix("event")?;
            let (ms, text) = rest.trim_start().split_once(" ms")?;
            Some(Event { at_ms: ms.trim().parse().ok()?, text: text.trim().to_owned() })
        })
        .collect()
}

/// A failover (not a fail-back) event: (pause in ms, the path it left).
fn failover_pause(text: &str) -> Option<(f64, String)> {
    if !text.starts_with("failover ") {
        return None;
    }
    let (_, after) = text.split_once(": ")?;
    let (from, _) = after.split_once(" -> ")?;
    let (_, p) = text.rsplit_once("pause ")?;
    let mut f = p.split_whitespace();
    let ms: f64 = f.next()?.parse().ok()?;
    (f.next() == Some("ms")).then(|| (ms, from.trim().to_owned()))
}

/// A failover line of a rank's log (`R2CCL_DEBUG=INFO R2CCL_DEBUG_SUBSYS=NET`):
/// `2026-12-02T15:53:56.399174Z  INFO r2ccl::net: failover ... pause 8.1 ms rank=0`.
#[derive(Clone, Debug, PartialEq)]
struct LoggedFailover {
    /// Unix seconds of the log line (when the migration was done).
    at: f64,
    pause_ms: f64,
    from: String,
}

fn log_failovers(log: &str) -> Vec<LoggedFailover> {
    log.lines()
        .filter_map(|l| {
            let at = parse_utc(l.split_whitespace().next()?)?;
            let i = l.find(" failover ")?;
            let (pause_ms, from) = failover_pause(&l[i + 1..])?;
            Some(LoggedFailover { at, pause_ms, from })
        })
        .collect()
}

/// `YYYY-MM-DDTHH:MM:SS[.frac]Z` (what tracing prints) as Unix seconds.
fn parse_utc(ts: &str) -> Option<f64> {
    let ts = ts.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let [y, m, day] = d[..] else { return None };
    let mut t = time.split(':');
    let (h, mi, sec): (f64, f64, f64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + mi * 60.0 + sec)
}

/// One `R2B peer=... size=... time_us=... busbw=... wrong=...` line of a peer program.
#[derive(Clone, Debug, PartialEq)]
struct PeerRow {
    size: u64,
    time_us: f64,
    busbw: f64,
    wrong: u64,
}

fn parse_peer(stdout: &str) -> Vec<PeerRow> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("R2B ")?;
            let kv =
                |key: &str| rest.split_whitespace().find_map(|f| f.strip_prefix(key).and_then(|v| v.strip_prefix('=')));
            Some(PeerRow {
                size: kv("size")?.parse().ok()?,
                time_us: kv("time_us")?.parse().ok()?,
                busbw: kv("busbw")?.parse().ok()?,
                wrong: kv("wrong")?.parse().ok()?,
            })
        })
        .collect()
}

/// One row of r2ccl-perf's `--json` report (out-of-place and in-place).
#[derive(Clone, Debug, PartialEq)]
struct PerfRow {
    bytes: u64,
    time_us: f64,
    busbw: f64,
    time_in_place_us: f64,
    busbw_in_place: f64,
    wrong: u64,
}

fn parse_perf_json(text: &str) -> Result<(Vec<PerfRow>, Vec<String>)> {
    let v: Value = serde_json::from_str(text).context("r2ccl-perf --json output is not JSON")?;
    let rows = v["rows"].as_array().context("r2ccl-perf --json output has no `rows`")?;
    let f = |x: &Value| x.as_f64().unwrap_or(f64::NAN);
    let out = rows
        .iter()
        .map(|r| PerfRow {
            bytes: r["bytes"].as_u64().unwrap_or(0),
            time_us: f(&r["out_of_place"]["time_us"]),
            busbw: f(&r["out_of_place"]["busbw"]),
            time_in_place_us: f(&r["in_place"]["time_us"]),
            busbw_in_place: f(&r["in_place"]["busbw"]),
            wrong: r["out_of_place"]["wrong"].as_u64().unwrap_or(0) + r["in_place"]["wrong"].as_u64().unwrap_or(0),
        })
        .collect();
    let events = v["events"].as_array().map(|e| e.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect());
    Ok((out, events.unwrap_or_default()))
}

/// Nearest-rank percentile of `v` (`p` in 0..=1); None when empty.
fn percentile(v: &[f64], p: f64) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let rank = (p * s.len() as f64).ceil().max(1.0) as usize;
    Some(s[rank.min(s.len()) - 1])
}

fn median(v: &[f64]) -> Option<f64> {
    percentile(v, 0.5)
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// The most common string, ties to the first seen.
fn mode(v: &[String]) -> Option<String> {
    let mut best: Option<(&String, usize)> = None;
    for s in v {
        let n = v.iter().filter(|x| *x == s).count();
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((s, n));
        }
    }
    best.map(|(s, _)| s.clone())
}

fn human_bytes(b: f64) -> String {
    let b = b.round() as u64;
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{}G", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}K", b >> 10)
    } else {
        format!("{b}")
    }
}

/// Four significant digits (small bus bandwidths stay readable).
fn sig(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 12) as usize;
    format!("{v:.digits$}")
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.filter(|x| x.is_finite()).map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

fn num(v: Option<f64>) -> Value {
    v.filter(|x| x.is_finite()).map_or(Value::Null, |x| json!(x))
}

/// nccl-tests' bus bandwidth factor for a collective on `n` ranks.
fn busbw_factor(coll: &str, n: u32) -> f64 {
    let n = f64::from(n);
    match coll {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "alltoall" => (n - 1.0) / n,
        _ => 1.0,
    }
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
// Part 1: fault-free bus bandwidth versus size.

/// Bandwidth each shaped rail carries with every rail busy at once: one blocking TCP stream per
/// node and rail towards the next node (this binary's `bench --probe-sink` / `--probe-source`
/// inside the namespaces; blocking sockets, so the probe does not compete for the CPU by
/// polling), GB/s of payload per stream.
fn probe_rails(ctx: &Ctx, spec: &Spec, logs: &Path) -> Result<Vec<f64>> {
    let me = std::env::current_exe().context("finding the xtask binary for the rail probe")?;
    let secs = if ctx.quick { "1.5" } else { "3" };
    let pairs: Vec<(u32, u32)> = (0..spec.nics).flat_map(|r| (0..spec.nodes).map(move |i| (i, r))).collect();
    let mut sinks = Vec::new();
    for (k, &(i, _)) in pairs.iter().enumerate() {
        let to = (i + 1) % spec.nodes;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &spec.node_ns(to)]).arg(&me).args([
            "bench",
            "--probe-sink",
            &(13_400 + k).to_string(),
        ]);
        sinks.push(Proc::spawn(c, &format!("probe.sink{k}"), logs)?);
    }
    let mut sources = Vec::new();
    for (k, &(i, r)) in pairs.iter().enumerate() {
        let to = (i + 1) % spec.nodes;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &spec.node_ns(i)]).arg(&me).args(["bench", "--probe-source"]);
        c.args([&Spec::rail_addr(to, r), &(13_400 + k).to_string(), secs]);
        sources.push(Proc::spawn(c, &format!("probe.source{k}"), logs)?);
    }
    wait_all(&mut sources, Instant::now() + Duration::from_secs(30));
    wait_all(&mut sinks, Instant::now() + Duration::from_secs(10));
    let mut rates = Vec::new();
    for s in &sinks {
        let out = s.stdout();
        let gbs = out
            .lines()
            .find_map(|l| l.trim().strip_prefix("R2B probe gbs="))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok());
        match gbs {
            Some(g) if s.end.is_some_and(End::ok) => rates.push(g),
            _ => bail!(
                "{} ended {} without a result{}",
                s.name,
                s.end.map_or_else(|| "?".into(), End::describe),
                last_line(&s.stderr())
            ),
        }
    }
    Ok(rates)
}

/// `bench --probe-sink PORT`: accept one TCP stream, count its bytes to EOF, print the goodput.
fn probe_sink(port: &str) -> Result<()> {
    let listener = std::net::TcpListener::bind(("0.0.0.0", port.parse::<u16>().context("--probe-sink PORT")?))?;
    let (mut conn, _) = listener.accept()?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let mut first: Option<Instant> = None;
    loop {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        first.get_or_insert_with(Instant::now);
        total += n as u64;
    }
    let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
    if secs <= 0.0 {
        bail!("probe sink: no data received");
    }
    println!("R2B probe gbs={} bytes={total} secs={secs:.3}", total as f64 / secs / 1e9);
    Ok(())
}

/// `bench --probe-source ADDR PORT SECS`: send as fast as TCP allows for SECS seconds.
fn probe_source(addr: &str, port: &str, secs: &str) -> Result<()> {
    use std::io::Write as _;
    let port: u16 = port.parse().context("--probe-source PORT")?;
    let secs: f64 = secs.parse().context("--probe-source SECS")?;
    let give_up = Instant::now() + Duration::from_secs(5);
    let mut conn = loop {
        match std::net::TcpStream::connect((addr, port)) {
            Ok(c) => break c,
            Err(e) if Instant::now() >= give_up => return Err(e).context("probe source: connecting"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    conn.set_write_timeout(Some(Duration::from_secs(10)))?;
    let buf = vec![0x5au8; 1 << 20];
    let end = Instant::now() + Duration::from_secs_f64(secs);
    while Instant::now() < end {
        conn.write_all(&buf)?;
    }
    conn.shutdown(std::net::Shutdown::Write)?;
    Ok(())
}

fn part_faultfree(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::FaultFree;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let spec = ctx.spec.clone();
    let bed = Bed::up(&spec)?;
    let line = ctx.node_line_gbs();
    let nominal = ctx.node_nominal_gbs();
    let nic_line = line / f64::from(spec.nics);
    let probe = probe_rails(ctx, &spec, &logs);
    let (b, e, iters, warm) = if ctx.quick { ("1M", "4M", "1", "1") } else { ("64K", "64M", "3", "1") };
    let sizes_sum: f64 = {
        let (lo, hi) = (testbed_size(b), testbed_size(e));
        let mut s = lo;
        let mut acc = 0.0;
        while s <= hi {
            acc += s as f64;
            s *= 4;
        }
        acc
    };
    let n_runs: f64 = 2.0 * (iters.parse::<f64>().unwrap_or(5.0) + warm.parse::<f64>().unwrap_or(2.0));
    let mut runs = Vec::new();
    let mut series = Vec::new();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "| collective | size | time (us) | busbw (GB/s) | in-place busbw | / line rate | / nominal | wrong |\n|---|---|---|---|---|---|---|---|"
    );
    let mut ar_big: Vec<f64> = Vec::new();
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"] {
        let json_path = logs.join(format!("{coll}.json"));
        let _ = std::fs::remove_file(&json_path);
        let factor = busbw_factor(coll, spec.nodes).max(1.0);
        let est = sizes_sum * factor * n_runs / (line * 1e9);
        let job = Job {
            name: coll.to_owned(),
            args: [coll, "-b", b, "-e", e, "-f", "4", "-n", iters, "-w", warm, "--json"]
                .iter()
                .map(ToString::to_string)
                .chain([json_path.display().to_string()])
                .collect(),
            env: Vec::new(),
            faults: Vec::new(),
            deadline: Duration::from_secs_f64((30.0 + 20.0 * est).min(1200.0)),
        };
        println!("bench: faultfree: {coll} -b {b} -e {e} (deadline {} s)", job.deadline.as_secs());
        let out = run_job(ctx, &spec, &job, &logs)?;
        res.problems.extend(out.problems.iter().cloned());
        let parsed = parse_perf_json(&read(&json_path));
        let (rows, events) = match parsed {
            Ok(x) => x,
            Err(err) => {
                res.problems.push(format!("{coll}: no results ({err:#})"));
                (Vec::new(), Vec::new())
            }
        };
        let failovers = events.iter().filter(|e| e.contains("failover")).count();
        for r in &rows {
            let _ = writeln!(
                table,
                "| {coll} | {} | {:.1} | {:.4} | {:.4} | {:.3} | {:.3} | {} |",
                human_bytes(r.bytes as f64),
                r.time_us,
                r.busbw,
                r.busbw_in_place,
                r.busbw / line,
                r.busbw / nominal,
                r.wrong
            );
            if coll == "all_reduce" && r.bytes >= 64 << 20 {
                ar_big.push(r.busbw / line);
            }
        }
        series.push((coll.to_owned(), rows.iter().map(|r| (r.bytes as f64, r.busbw)).collect::<Vec<_>>()));
        runs.push(json!({
            "collective": coll,
            "exits": out.ends.iter().map(|e| e.describe()).collect::<Vec<_>>(),
            "secs": out.secs,
            "rows": rows.iter().map(|r| json!({"bytes": r.bytes, "time_us": r.time_us, "busbw": r.busbw,
                "busbw_in_place": r.busbw_in_place, "over_line_rate": r.busbw / line,
                "over_nominal": r.busbw / nominal, "wrong": r.wrong})).collect::<Vec<_>>(),
            "events": events,
            "failovers_without_fault": failovers,
        }));
        if failovers > 0 {
            res.md.push_str(&format!(
                "- note: {coll}: rank 0 saw {failovers} failover(s) with no fault injected (spurious detections)\n"
            ));
        }
    }
    drop(bed);
    let probe_json = match &probe {
        Ok(rates) => {
            let med = median(rates);
            let _ = writeln!(
                res.md,
                "- rail probe (one blocking TCP stream per rail, {} rails busy at once): per rail median {} GB/s, min {} GB/s = {} of the payload line rate per NIC ({:.4} GB/s)",
                rates.len(),
                opt(med, 4),
                opt(rates.iter().copied().reduce(f64::min), 4),
                opt(med.map(|m| m / nic_line), 3),
                nic_line
            );
            if med.is_some_and(|m| m < 0.9 * nic_line) {
                res.md.push_str("- **note: the rails do not reach the shaped rate even for plain TCP streams on this machine now (CPU contention?); busbw ratios are bounded by the machine, not only the library**\n");
            }
            json!({"per_rail_gbs": rates, "median_gbs": num(med), "over_line_rate_per_nic": num(med.map(|m| m / nic_line))})
        }
        Err(err) => {
            res.md.push_str(&format!("- rail probe failed: {err:#}\n"));
            json!({"error": format!("{err:#}")})
        }
    };
    let mut md = format!(
        "Testbed {} nodes x {} NICs, tbf {} per NIC: nominal {:.4} GB/s per node, payload line rate {:.4} GB/s per node (x {}/{}, MTU {}). Sizes {b}..{e} (x4), {iters} iters + {warm} warm-up, out-of-place busbw.\n\n",
        spec.nodes,
        spec.nics,
        spec.rate.as_deref().unwrap_or("unshaped"),
        nominal,
        line,
        testbed::RAIL_MTU - 52,
        testbed::RAIL_MTU + 14,
        testbed::RAIL_MTU
    );
    md.push_str(&res.md);
    md.push('\n');
    md.push_str(&table);
    res.md = md;
    let target_value = ar_big.iter().copied().reduce(f64::min);
    res.targets.push(Target {
        detail: if target_value.is_some() {
            "smallest ratio over the AllReduce sizes >= 64 MiB (out-of-place)".into()
        } else {
            format!("no AllReduce size >= 64 MiB measured (largest {e}{})", if ctx.quick { ", quick mode" } else { "" })
        },
        value: target_value,
        ..unmeasured(part, "").remove(0)
    });
    let hl = vec![("payload line rate".to_owned(), line), ("nominal rate".to_owned(), nominal)];
    res.plot(ctx, "faultfree_busbw.png", |p| {
        plot_lines(
            p,
            &format!(
                "Fault-free bus bandwidth, {} nodes x {} NICs @ {}",
                spec.nodes,
                spec.nics,
                ctx.spec.rate.as_deref().unwrap_or("-")
            ),
            "message size (bytes, log2)",
            "bus bandwidth (GB/s)",
            &series,
            &hl,
            &[],
            &[],
            true,
        )
    });
    res.json = json!({"line_rate_gbs": line, "nominal_gbs": nominal, "rate": spec.rate, "nodes": spec.nodes,
        "nics": spec.nics, "probe": probe_json, "runs": runs});
    Ok(res)
}

/// A size such as `256K` in bytes (the forms this file passes to r2ccl-perf).
pub(crate) fn testbed_size(s: &str) -> u64 {
    let (num, mult) = match s.chars().last() {
        Some('K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().unwrap_or(0) * mult
}

// ---------------------------------------------------------------------------------------------
// Part 2: strategies with one NIC down.

/// `r2ccl-plan` for 4 x 2 with node 1 NIC 0 failed: (lower bound s, t_nf s, strategy -> predicted s, chosen).
fn plan(ctx: &Ctx, logs: &Path, bytes: u64) -> Result<(f64, f64, Value, String)> {
    let spec = &ctx.spec;
    let mut cmd = Command::new(&ctx.plan);
    cmd.args(["--nodes", &spec.nodes.to_string(), "--nics", &spec.nics.to_string()])
        .args(["--fail", &format!("{FAULT_NODE}:{FAULT_NIC}"), "--nic-gbps", &format!("{:.6}", ctx.nic_line_gbps())])
        // The communicator plans with 20 us per message (`LOOPBACK_ALPHA_S` in r2ccl's comm.rs):
        // predict the plan it runs (the default 5 us picks twice its chunk count here).
        .args(["--alpha-us", LIBRARY_ALPHA_US])
        .args(["--bytes", &bytes.to_string(), "--json"]);
    let out = run_to_end(cmd, "r2ccl-plan", logs, Duration::from_secs(60))?;
    let v: Value = serde_json::from_str(out.trim()).context("r2ccl-plan --json output is not JSON")?;
    let lb = v["lower_bound"].as_f64().context("r2ccl-plan: no lower_bound")?;
    let tnf = v["t_nf"].as_f64().context("r2ccl-plan: no t_nf")?;
    let chosen = v["chosen"].as_str().unwrap_or("").to_owned();
    Ok((lb, tnf, v["strategies"].clone(), chosen))
}

fn part_strategies(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::Strategies;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let spec = ctx.spec.clone();
    let (default_size, dur, t_fault): (&str, f64, f64) = if ctx.quick { ("2M", 5.5, 2.5) } else { ("64M", 30.0, 8.0) };
    let size = ctx.strategies_size.as_deref().unwrap_or(default_size);
    let bytes = testbed_size(size);
    let factor = busbw_factor("all_reduce", spec.nodes);
    let (lb, tnf, predictions, chosen) = plan(ctx, &logs, bytes)?;
    // Larger sizes: at least 3 fault-free collectives before the fault and 12 with it after.
    let t_fault = t_fault.max(3.0 * tnf);
    let dur = dur.max(t_fault + 12.0 * 1.3 * lb);
    let bed = Bed::up(&spec)?;
    let one = bytes as f64 * factor / (ctx.node_line_gbs() * 1e9);
    let mut rows = Vec::new();
    let mut bars = Vec::new();
    let mut table = String::from(
        "| strategy | ran as | fault-free time (ms) | time, NIC down (ms) | lower bound (ms) | predicted (ms) | time / lower bound | time / predicted | windows |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for &strategy in STRATEGIES.iter().filter(|s| ctx.strategies.is_empty() || ctx.strategies.iter().any(|c| c == *s)) {
        let json_path = logs.join(format!("{strategy}.json"));
        let _ = std::fs::remove_file(&json_path);
        let job = Job {
            name: strategy.to_owned(),
            // -R 1: buffers registered with the communicator (as a GPU job's device buffers), so a
            // collective's time holds the schedule alone, not 2 copies of the buffer through the
            // library's workspace (at 64 MiB about 100 ms of the 5.7 s with one NIC down).
            args: [
                "all_reduce",
                "-b",
                size,
                "-e",
                size,
                "-R",
                "1",
                "-N",
                "0",
                "--duration",
                &dur.to_string(),
                "--json",
            ]
            .iter()
            .map(ToString::to_string)
            .chain([json_path.display().to_string()])
            .collect(),
            env: vec![("R2CCL_POLICY__STRATEGY".into(), strategy.into())],
            faults: vec![Step { at_s: t_fault, node: FAULT_NODE, nic: FAULT_NIC, fault: Fault::Down }],
            deadline: Duration::from_secs_f64(dur + 45.0 + 40.0 * one),
        };
        println!("bench: strategies: {strategy} ({size}, {dur} s, NIC {FAULT_NODE}/{FAULT_NIC} down at {t_fault} s)");
        let out = run_job(ctx, &spec, &job, &logs);
        if let Err(e) = testbed::fault(&spec, FAULT_NODE, FAULT_NIC, &Fault::Up) {
            res.problems.push(format!("{strategy}: bringing the NIC back up: {e:#}"));
        }
        let out = out?;
        res.problems.extend(out.problems.iter().cloned());
        let samples = timeline_samples(&out.rank0_out, &read(&json_path));
        let t_applied = out.applied.first().map_or(t_fault, |a| a.0);
        // The first window holds the connection warm-up: not a fault-free figure.
        let before: Vec<f64> =
            samples.iter().skip(1).filter(|s| s.at < t_applied && !s.failover).map(|s| s.busbw).collect();
        let first_after = samples.iter().position(|s| s.at >= t_applied);
        let steady: Vec<&Sample> = first_after
            .map(|i| samples[i + 1..].iter().filter(|s| !s.failover && s.busbw > 0.0).collect())
            .unwrap_or_default();
        let to_time = |busbw: f64| bytes as f64 * factor / (busbw * 1e9);
        let t_before = median(&before).map(to_time);
        let t_down = median(&steady.iter().map(|s| s.busbw).collect::<Vec<_>>()).map(to_time);
        let ran_as = mode(&steady.iter().map(|s| s.strategy.clone()).collect::<Vec<_>>());
        if t_down.is_none() && out.problems.is_empty() {
            res.problems.push(format!(
                "{strategy}: no steady window after the fault in {dur} s ({} windows in all); logs {}",
                samples.len(),
                logs.display()
            ));
        }
        if strategy != "auto" && ran_as.as_deref().is_some_and(|r| r != strategy) {
            res.problems.push(format!(
                "{strategy}: forced, but the ranks report strategy {}",
                ran_as.as_deref().unwrap_or("?")
            ));
        }
        let key =
            ran_as.clone().unwrap_or_else(|| if strategy == "auto" { chosen.clone() } else { strategy.to_owned() });
        let predicted = predictions[key.as_str()].as_f64();
        let over_lb = t_down.map(|t| t / lb);
        let over_pred = t_down.zip(predicted).map(|(t, p)| t / p);
        let _ = writeln!(
            table,
            "| {strategy} | {} | {} | {} | {:.1} | {} | {} | {} | {} |",
            ran_as.as_deref().unwrap_or("-"),
            opt(t_before.map(|t| t * 1e3), 1),
            opt(t_down.map(|t| t * 1e3), 1),
            lb * 1e3,
            opt(predicted.map(|t| t * 1e3), 1),
            opt(over_lb, 3),
            opt(over_pred, 3),
            steady.len()
        );
        if strategy == "auto" {
            res.targets.push(Target {
                value: over_lb,
                detail: format!("auto (ran as {}) at {size}", ran_as.as_deref().unwrap_or("?")),
                ..unmeasured(part, "").remove(0)
            });
            res.targets.push(Target {
                value: over_pred.map(|r| (r - 1.0).abs()),
                detail: format!(
                    "auto (ran as {}) time / prediction = {}",
                    ran_as.as_deref().unwrap_or("?"),
                    opt(over_pred, 3)
                ),
                ..unmeasured(part, "").remove(1)
            });
            // How much the failure slowed this run down, against the least any schedule could:
            // separates the schedule from the testbed's fault-free efficiency at this size.
            let slowdown = t_down.zip(t_before).map(|(d, b)| d / b);
            res.targets.push(Target {
                value: slowdown.map(|s| s / (lb / tnf)),
                detail: format!(
                    "time / fault-free time {} against lower bound / t_nf {:.3}; fault-free time / t_nf {}",
                    opt(slowdown, 3),
                    lb / tnf,
                    opt(t_before.map(|b| b / tnf), 3)
                ),
                ..unmeasured(part, "").remove(2)
            });
        }
        bars.push((
            match &ran_as {
                Some(r) if r != strategy => format!("{strategy} (ran {r})"),
                _ => strategy.to_owned(),
            },
            vec![t_down.unwrap_or(0.0) * 1e3, predicted.unwrap_or(0.0) * 1e3, lb * 1e3],
        ));
        rows.push(json!({"strategy": strategy, "ran_as": ran_as, "time_fault_free_s": num(t_before),
            "time_nic_down_s": num(t_down), "lower_bound_s": lb, "predicted_s": num(predicted),
            "over_lower_bound": num(over_lb), "over_predicted": num(over_pred), "steady_windows": steady.len(),
            "samples": samples.iter().map(|s| json!([s.at, s.busbw, s.strategy, s.failover])).collect::<Vec<_>>(),
            "faults_applied": out.applied, "exits": out.ends.iter().map(|e| e.describe()).collect::<Vec<_>>()}));
    }
    drop(bed);
    res.md = format!(
        "AllReduce {size} per rank, {} nodes x {} NICs at {}, node {FAULT_NODE} NIC {FAULT_NIC} taken down (`ip link set down`) {t_fault} s into a {dur} s timeline run; time = median of the per-second windows after the fault window (failover windows excluded). Lower bound and predictions: `r2ccl-plan --fail {FAULT_NODE}:{FAULT_NIC} --nic-gbps {:.4} --alpha-us {LIBRARY_ALPHA_US}` (payload line rate, the communicator's per-message latency); its fault-free time t_nf = {:.1} ms, its choice: {chosen}.\n\n{table}",
        spec.nodes,
        spec.nics,
        spec.rate.as_deref().unwrap_or("-"),
        ctx.nic_line_gbps(),
        tnf * 1e3
    );
    res.plot(ctx, "strategies.png", |p| {
        plot_bars(
            p,
            &format!("AllReduce {size}, one NIC down (node {FAULT_NODE}): time vs prediction vs lower bound"),
            "time (ms)",
            &["measured", "predicted", "lower bound"],
            &bars,
        )
    });
    res.json = json!({"bytes": bytes, "duration_s": dur, "fault_at_s": t_fault, "lower_bound_s": lb, "t_nf_s": tnf,
        "plan_chosen": chosen, "plan_predictions_s": predictions, "nic_gbps": ctx.nic_line_gbps(), "runs": rows});
    Ok(res)
}

// ---------------------------------------------------------------------------------------------
// Part 3: failover pause per fault kind.

fn part_pause(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::Pause;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let spec = ctx.spec.clone();
    let (size, dur, t_f) = if ctx.quick { ("4M", 2.5, 1.2) } else { ("4M", 4.0, 1.5) };
    let kinds: &[&str] = if ctx.quick { &["down", "blackhole"] } else { &["down", "flap", "blackhole", "drop"] };
    let bed = Bed::up(&spec)?;
    let faulted = format!("node{FAULT_NODE}/nic{FAULT_NIC}");
    let mut per_kind = Vec::new();
    let mut dots = Vec::new();
    let mut resumed_dots = Vec::new();
    let mut table = String::from(
        "| fault kind | runs | runs with a failover | pauses | pause p50 (ms) | pause p99 (ms) | pause max (ms) | fault to resumed p50 (ms) | fault to resumed p99 (ms) | other failovers |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let one = testbed_size(size) as f64 * 1.5 / (ctx.node_line_gbs() * 1e9);
    for &kind in kinds {
        let (faults, undo) = match kind {
            "down" => (vec![(0.0, Fault::Down)], Fault::Up),
            "flap" => (vec![(0.0, Fault::Down), (0.3, Fault::Up)], Fault::Up),
            "blackhole" => (vec![(0.0, Fault::Blackhole)], Fault::Restore),
            _ => (vec![(0.0, Fault::Drop)], Fault::Undrop),
        };
        let mut pauses = Vec::new();
        let mut resumed = Vec::new();
        let mut with_failover = 0;
        let mut others = 0;
        let mut reps_json = Vec::new();
        for rep in 0..ctx.reps {
            let job = Job {
                name: format!("{kind}.{rep}"),
                args: ["all_reduce", "-b", size, "-e", size, "-N", "0", "--duration", &dur.to_string()]
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                // The failover notes (with their pause) of every rank, time-stamped, on stderr.
                env: vec![("R2CCL_DEBUG".into(), "INFO".into()), ("R2CCL_DEBUG_SUBSYS".into(), "NET".into())],
                faults: faults
                    .iter()
                    .map(|(dt, f)| Step { at_s: t_f + dt, node: FAULT_NODE, nic: FAULT_NIC, fault: f.clone() })
                    .collect(),
                deadline: Duration::from_secs_f64(dur + 40.0 + 20.0 * one),
            };
            println!("bench: pause: {kind} run {}/{}", rep + 1, ctx.reps);
            let out = run_job(ctx, &spec, &job, &logs);
            if let Err(e) = testbed::fault(&spec, FAULT_NODE, FAULT_NIC, &undo) {
                res.problems.push(format!("{kind}.{rep}: undoing the fault: {e:#}"));
            }
            let out = out?;
            res.problems.extend(out.problems.iter().cloned());
            let fault_at = out.applied_unix.first().copied();
            let mut mine = Vec::new();
            let mut firsts = Vec::new();
            for log in &out.errs {
                // One migration moves several steps of a lane at once: count it once.
                let mut seen: Vec<(i64, i64)> = Vec::new();
                let mut first: Option<f64> = None;
                for f in log_failovers(log) {
                    if !f.from.contains(&faulted) || fault_at.is_none_or(|t| f.at < t) {
                        others += 1;
                        continue;
                    }
                    let key = ((f.at * 1e3).round() as i64, (f.pause_ms * 10.0).round() as i64);
                    if !seen.contains(&key) {
                        seen.push(key);
                        mine.push(f.pause_ms);
                    }
                    first = Some(first.map_or(f.at, |x: f64| x.min(f.at)));
                }
                if let (Some(a), Some(t)) = (first, fault_at) {
                    firsts.push((a - t) * 1e3);
                }
            }
            with_failover += usize::from(!mine.is_empty());
            dots.extend(mine.iter().map(|&p| (kind.to_owned(), p)));
            resumed_dots.extend(firsts.iter().map(|&r| (kind.to_owned(), r)));
            pauses.extend(mine.iter().copied());
            resumed.extend(firsts.iter().copied());
            reps_json.push(json!({"rep": rep, "pauses_ms": mine, "fault_to_resumed_ms": firsts,
                "faults_applied": out.applied, "exits": out.ends.iter().map(|e| e.describe()).collect::<Vec<_>>(),
                "secs": out.secs}));
        }
        let (p50, p99, max) = (percentile(&pauses, 0.5), percentile(&pauses, 0.99), percentile(&pauses, 1.0));
        let (r50, r99) = (percentile(&resumed, 0.5), percentile(&resumed, 0.99));
        let _ = writeln!(
            table,
            "| {kind} | {} | {with_failover} | {} | {} | {} | {} | {} | {} | {others} |",
            ctx.reps,
            pauses.len(),
            opt(p50, 1),
            opt(p99, 1),
            opt(max, 1),
            opt(r50, 1),
            opt(r99, 1)
        );
        if kind == "down" {
            res.targets.push(Target {
                value: p50,
                detail: format!(
                    "{} migrations over {} runs (all ranks); from the fault to the first migration done, per rank: p50 {} ms",
                    pauses.len(),
                    ctx.reps,
                    opt(r50, 1)
                ),
                ..unmeasured(part, "").remove(0)
            });
        }
        per_kind.push(json!({"kind": kind, "runs": ctx.reps, "runs_with_failover": with_failover,
            "pauses_ms": pauses, "p50_ms": num(p50), "p99_ms": num(p99), "max_ms": num(max),
            "fault_to_resumed_ms": resumed, "fault_to_resumed_p50_ms": num(r50), "fault_to_resumed_p99_ms": num(r99),
            "other_failovers": others, "reps": reps_json}));
    }
    drop(bed);
    res.md = format!(
        "AllReduce {size} timeline runs of {dur} s, {} per kind; the fault hits node {FAULT_NODE} NIC {FAULT_NIC} {t_f} s in (flap: down, up 0.3 s later; blackhole: its switch port stops forwarding, carrier up; drop: the node's egress drops everything). **pause** = what the ranks print for each migration away from {faulted} (`failover ... pause X ms`: from the lane stopping to its replay on the new path; every rank's log, one per migration). **fault to resumed** = from the harness applying the fault (its clock just before the command) to a rank's first such migration being done (wall clocks of one host; includes detection), one per rank that migrated. `other failovers`: migrations off other paths, or before the fault.\n\n{table}",
        ctx.reps
    );
    res.plot(ctx, "pause.png", |p| {
        plot_dots(p, "Failover pause per fault kind (all ranks)", "pause (ms)", kinds, &dots)
    });
    // What users feel: from the fault to the first migration done, detection included.
    res.plot(ctx, "fault_to_resumed.png", |p| {
        plot_dots(
            p,
            "Fault to resumed per fault kind (one per rank that migrated)",
            "fault to resumed (ms)",
            kinds,
            &resumed_dots,
        )
    });
    res.json = json!({"bytes": testbed_size(size), "duration_s": dur, "fault_at_s": t_f, "kinds": per_kind});
    Ok(res)
}

// ---------------------------------------------------------------------------------------------
// Part 5: timeline across a failure and its recovery.

fn part_timeline(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::Timeline;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let spec = ctx.spec.clone();
    let (size, dur, t_down, t_up) = if ctx.quick { ("4M", 6.0, 2.0, 4.0) } else { ("4M", 20.0, 5.0, 12.0) };
    let bed = Bed::up(&spec)?;
    let one = testbed_size(size) as f64 * 1.5 / (ctx.node_line_gbs() * 1e9);
    let json_path = logs.join("timeline.json");
    let _ = std::fs::remove_file(&json_path);
    let job = Job {
        name: "timeline".into(),
        args: ["all_reduce", "-b", size, "-e", size, "-N", "0", "--duration", &dur.to_string(), "--json"]
            .iter()
            .map(ToString::to_string)
            .chain([json_path.display().to_string()])
            .collect(),
        env: Vec::new(),
        faults: vec![
            Step { at_s: t_down, node: FAULT_NODE, nic: FAULT_NIC, fault: Fault::Down },
            Step { at_s: t_up, node: FAULT_NODE, nic: FAULT_NIC, fault: Fault::Up },
        ],
        deadline: Duration::from_secs_f64(dur + 45.0 + 20.0 * one),
    };
    println!("bench: timeline: {size}, {dur} s, NIC down at {t_down} s, up at {t_up} s");
    let out = run_job(ctx, &spec, &job, &logs)?;
    drop(bed);
    res.problems.extend(out.problems.iter().cloned());
    let samples = timeline_samples(&out.rank0_out, &read(&json_path));
    let events = parse_events(&out.rank0_out);
    let down_at = out.applied.first().map_or(t_down, |a| a.0);
    let up_at = out.applied.get(1).map_or(t_up, |a| a.0);
    let avg = |f: &dyn Fn(&Sample) -> bool| mean(&samples.iter().filter(|s| f(s)).map(|s| s.busbw).collect::<Vec<_>>());
    let before = avg(&|s| s.at < down_at);
    let during = avg(&|s| s.at > down_at + 1.0 && s.at < up_at);
    let after = avg(&|s| s.at > up_at + 1.0);
    if samples.is_empty() {
        res.problems.push(format!("timeline: rank 0 printed no timeline windows; logs {}", logs.display()));
    }
    let mut md = format!(
        "AllReduce {size}, {dur} s, node {FAULT_NODE} NIC {FAULT_NIC} down at {down_at:.2} s and up at {up_at:.2} s (harness clock from rank 0's timeline start). Mean busbw before {} GB/s, while down (from 1 s after) {} GB/s, after recovery (from 1 s after) {} GB/s; line rate {:.4} GB/s.\n\n| t (s) | busbw (GB/s) | strategy | failover |\n|---|---|---|---|\n",
        opt(before, 4),
        opt(during, 4),
        opt(after, 4),
        ctx.node_line_gbs()
    );
    for s in &samples {
        let _ =
            writeln!(md, "| {:.1} | {:.4} | {} | {} |", s.at, s.busbw, s.strategy, if s.failover { "yes" } else { "" });
    }
    let moves: Vec<&Event> =
        events.iter().filter(|e| e.text.starts_with("failover") || e.text.starts_with("fail-back")).collect();
    let _ = writeln!(md, "\nrank 0 events: {} in all, {} failover/fail-back", events.len(), moves.len());
    let series = vec![("AllReduce busbw".to_owned(), samples.iter().map(|s| (s.at, s.busbw)).collect::<Vec<_>>())];
    let vl = vec![("NIC down".to_owned(), down_at), ("NIC up".to_owned(), up_at)];
    let hl = vec![("payload line rate".to_owned(), ctx.node_line_gbs())];
    let marks: Vec<(f64, f64)> = samples.iter().filter(|s| s.failover).map(|s| (s.at, s.busbw)).collect();
    res.plot(ctx, "timeline.png", |p| {
        plot_lines(
            p,
            &format!("AllReduce {size}: bus bandwidth across a NIC failure and recovery"),
            "time (s)",
            "bus bandwidth (GB/s)",
            &series,
            &hl,
            &vl,
            &marks,
            false,
        )
    });
    res.md = md;
    res.json = json!({"bytes": testbed_size(size), "duration_s": dur, "down_at_s": down_at, "up_at_s": up_at,
        "busbw_before": num(before), "busbw_during": num(during), "busbw_after": num(after),
        "samples": samples.iter().map(|s| json!({"at": s.at, "busbw": s.busbw, "strategy": s.strategy, "failover": s.failover})).collect::<Vec<_>>(),
        "events": events.iter().map(|e| json!({"at_ms": e.at_ms, "text": e.text})).collect::<Vec<_>>(),
        "exits": out.ends.iter().map(|e| e.describe()).collect::<Vec<_>>()});
    Ok(res)
}

// ---------------------------------------------------------------------------------------------
// Part 4: loopback against OpenMPI and Gloo.

/// Compile a peer program unless the binary is newer than its source.
fn build_peer(ctx: &Ctx, logs: &Path, src: &Path, exe: &Path, compiler: &str, flags: &[&str]) -> Result<()> {
    let newer = |a: &Path, b: &Path| -> bool {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        matches!((m(a), m(b)), (Some(x), Some(y)) if x > y)
    };
    if newer(exe, src) {
        return Ok(());
    }
    let mut cmd = Command::new(compiler);
    cmd.args(["-O2", "-Wall", "-o"]).arg(exe).arg(src).args(flags);
    println!("bench: loopback: compiling {}", src.display());
    let _ = ctx;
    run_to_end(cmd, &format!("build.{compiler}"), logs, Duration::from_secs(300)).map(drop)
}

fn part_loopback(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::Loopback;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let root = crate::workspace_root();
    let (b, e, f, iters, warm) = if ctx.quick { ("1K", "64M", "16", "3", "1") } else { ("4", "64M", "4", "10", "3") };
    let small = if ctx.quick { 1024 } else { 4 };
    let sizes: Vec<u64> = {
        let (lo, hi, fac) = (testbed_size(b), testbed_size(e), testbed_size(f));
        let mut v = vec![lo];
        while let Some(&l) = v.last() {
            if l * fac > hi {
                break;
            }
            v.push(l * fac);
        }
        v
    };
    let n_iter: f64 = iters.parse::<f64>().unwrap_or(10.0) + warm.parse::<f64>().unwrap_or(3.0);
    // Deadline: bootstrap plus the whole sweep at 20 MB/s busbw, doubled for in-place.
    let limit =
        Duration::from_secs_f64((40.0 + sizes.iter().sum::<u64>() as f64 * 1.5 * n_iter * 2.0 / 20e6).min(1500.0));
    let sweep: Vec<String> =
        ["-b", b, "-e", e, "-f", f, "-n", iters, "-w", warm].iter().map(ToString::to_string).collect();
    let mut curves: Vec<(String, Vec<PeerRow>)> = Vec::new();
    let mut notes = Vec::new();

    // r2ccl: the caller's buffers (copied into the library's registered workspace and out), and
    // buffers registered with the communicator (`-R 1`, read and written in place), whose
    // in-place run is the figure the targets compare (Gloo runs in place too).
    let nics = ctx.loopback_nics;
    for (tag, registered) in [("r2ccl", false), ("r2ccl-registered", true)] {
        let json_path = logs.join(format!("{tag}.json"));
        let _ = std::fs::remove_file(&json_path);
        let mut cmd = Command::new(&ctx.perf);
        cmd.args(["launch", "-n", "4", "--nics", &nics.to_string(), "all_reduce"]).args(&sweep);
        if registered {
            cmd.args(["-R", "1"]);
        }
        cmd.arg("--json").arg(&json_path);
        clean_env(&mut cmd);
        println!(
            "bench: loopback: r2ccl-perf launch -n 4 --nics {nics} all_reduce {}{}",
            sweep.join(" "),
            if registered { " -R 1" } else { "" }
        );
        if let Err(err) = run_to_end(cmd, tag, &logs, limit) {
            res.problems.push(format!("{tag}: {err:#}"));
        }
        match parse_perf_json(&read(&json_path)) {
            Ok((rows, _)) => {
                let oop =
                    rows.iter().map(|r| PeerRow { size: r.bytes, time_us: r.time_us, busbw: r.busbw, wrong: r.wrong });
                if registered {
                    curves.push((format!("r2ccl -R 1 out of place ({nics} NIC)"), oop.collect()));
                    let inp = rows.iter().map(|r| PeerRow {
                        size: r.bytes,
                        time_us: r.time_in_place_us,
                        busbw: r.busbw_in_place,
                        wrong: r.wrong,
                    });
                    curves.push((format!("{LOOPBACK_TARGET_CURVE} ({nics} NIC)"), inp.collect()));
                } else {
                    curves.push((format!("r2ccl out of place ({nics} NIC)"), oop.collect()));
                }
            }
            Err(err) => res.problems.push(format!("{tag}: no results: {err:#}")),
        }
    }

    // OpenMPI, default algorithm and ring, over TCP on loopback.
    let mpi_src = root.join("bench/peers/mpi_allreduce.c");
    let mpi_exe = ctx.out.join("mpi_allreduce");
    if !(have("mpicc") && have("mpirun")) {
        notes.push(
            "OpenMPI SKIPPED: mpicc/mpirun missing (Debian openmpi-bin libopenmpi-dev; cargo xtask setup)".to_owned(),
        );
    } else if let Err(err) = build_peer(ctx, &logs, &mpi_src, &mpi_exe, "mpicc", &[]) {
        res.problems.push(format!("building the OpenMPI peer: {err:#}"));
    } else {
        for (name, extra) in [
            ("OpenMPI", vec![]),
            (
                "OpenMPI ring",
                vec!["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4"],
            ),
        ] {
            let mut cmd = Command::new("mpirun");
            cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
                .args(["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"])
                .args(&extra)
                .arg(&mpi_exe)
                .args(&sweep);
            println!("bench: loopback: {name}");
            let tag = name.replace(' ', "_").to_lowercase();
            match run_to_end(cmd, &tag, &logs, limit) {
                Ok(out) => curves.push((name.to_owned(), parse_peer(&out))),
                Err(err) => {
                    res.problems.push(format!("{name}: {err:#}"));
                    curves.push((name.to_owned(), parse_peer(&read(&logs.join(format!("{tag}.out"))))));
                }
            }
        }
    }

    // Gloo chunked ring over its TCP transport, file-store rendezvous.
    let gloo_src = root.join("bench/peers/gloo_allreduce.cc");
    let gloo_exe = ctx.out.join("gloo_allreduce");
    if !(have("g++") && Path::new("/usr/include/gloo/allreduce_ring_chunked.h").exists()) {
        notes.push(
            "Gloo SKIPPED: g++ or /usr/include/gloo missing (Debian g++ libgloo-dev; cargo xtask setup)".to_owned(),
        );
    } else if let Err(err) = build_peer(ctx, &logs, &gloo_src, &gloo_exe, "g++", &["-std=c++17", "-lgloo", "-lpthread"])
    {
        res.problems.push(format!("building the Gloo peer: {err:#}"));
    } else {
        let store = ctx.out.join("gloo-store");
        let _ = std::fs::remove_dir_all(&store);
        std::fs::create_dir_all(&store)?;
        let prefix = format!("r2b{}", SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis()));
        let timeout_s = limit.as_secs().to_string();
        let mut procs = Vec::new();
        println!("bench: loopback: Gloo");
        for r in 0..4 {
            let mut cmd = Command::new(&gloo_exe);
            cmd.args(&sweep).args(["-t", &timeout_s]);
            cmd.env("RANK", r.to_string()).env("SIZE", "4").env("STORE", &store).env("PREFIX", &prefix);
            procs.push(Proc::spawn(cmd, &format!("gloo.rank{r}"), &logs)?);
        }
        wait_all(&mut procs, Instant::now() + limit);
        for p in &procs {
            match p.end {
                Some(e) if e.ok() => {}
                Some(End::Killed) | None => {
                    res.problems.push(format!("Gloo: {} hung (killed at the deadline)", p.name))
                }
                Some(e) => {
                    res.problems.push(format!("Gloo: {} exited {}{}", p.name, e.describe(), last_line(&p.stderr())))
                }
            }
        }
        curves.push(("Gloo ring_chunked".to_owned(), parse_peer(&procs[0].stdout())));
    }
    for (name, rows) in &curves {
        let wrong: u64 = rows.iter().map(|r| r.wrong).sum();
        if wrong > 0 {
            res.problems.push(format!("{name}: {wrong} wrong elements"));
        }
        if rows.len() < sizes.len() {
            res.problems.push(format!("{name}: {} of {} sizes measured", rows.len(), sizes.len()));
        }
    }

    // Table and targets.
    let at = |rows: &[PeerRow], size: u64| rows.iter().find(|r| r.size == size).cloned();
    let r2 =
        curves.iter().find(|(n, _)| n.starts_with(LOOPBACK_TARGET_CURVE)).map(|(_, r)| r.clone()).unwrap_or_default();
    let peers: Vec<&(String, Vec<PeerRow>)> = curves.iter().filter(|(n, _)| !n.starts_with("r2ccl")).collect();
    let mut table = String::from("| size |");
    for (n, _) in &curves {
        let _ = write!(table, " {n}: busbw (GB/s) / time (us) |");
    }
    table.push_str(" r2ccl / best peer (busbw) | r2ccl / best peer (time) |\n|---|");
    for _ in 0..curves.len() + 2 {
        table.push_str("---|");
    }
    table.push('\n');
    let best_peer = |size: u64| -> (Option<f64>, Option<f64>) {
        let rows: Vec<PeerRow> = peers.iter().filter_map(|(_, r)| at(r, size)).collect();
        (rows.iter().map(|r| r.busbw).reduce(f64::max), rows.iter().map(|r| r.time_us).reduce(f64::min))
    };
    for &s in &sizes {
        let _ = write!(table, "| {} |", human_bytes(s as f64));
        for (_, rows) in &curves {
            let cell = at(rows, s).map_or_else(|| "-".into(), |r| format!("{} / {:.1}", sig(r.busbw), r.time_us));
            let _ = write!(table, " {cell} |");
        }
        let mine = at(&r2, s);
        let (bb, bt) = best_peer(s);
        let _ = writeln!(
            table,
            " {} | {} |",
            opt(mine.as_ref().zip(bb).map(|(m, b)| m.busbw / b), 3),
            opt(mine.as_ref().zip(bt).map(|(m, t)| m.time_us / t), 3)
        );
    }
    let big = 64 << 20;
    let (bb, _) = best_peer(big);
    let (_, bt_small) = best_peer(small);
    let big_ratio = at(&r2, big).zip(bb).map(|(m, b)| m.busbw / b);
    let small_ratio = at(&r2, small).zip(bt_small).map(|(m, t)| m.time_us / t);
    let mut t = unmeasured(part, "");
    t[0].value = big_ratio;
    t[0].detail = format!(
        "r2ccl -R 1 in place {} GB/s vs best peer {} GB/s at 64 MiB",
        opt(at(&r2, big).map(|r| r.busbw), 4),
        opt(bb, 4)
    );
    t[1].value = small_ratio;
    t[1].detail = format!(
        "at {} B: r2ccl -R 1 in place {} us vs best peer {} us (lower is better)",
        small,
        opt(at(&r2, small).map(|r| r.time_us), 1),
        opt(bt_small, 1)
    );
    res.targets = t;
    res.md = format!(
        "4 ranks on this host, no shaping, float32 sum, sizes {b}..{e} (x{f}), {iters} iters + {warm} warm-up; r2ccl: `r2ccl-perf launch -n 4 --nics {}` (UCX TCP on lo) on the caller's buffers (out of place: copied into the library's registered workspace and back) and with `-R 1` on buffers registered with the communicator (read and written in place, out of place and in place); the ratio columns and targets use `-R 1` in place (Gloo runs in place on its own buffer, OpenMPI out of place); OpenMPI: `mpirun --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo` (default algorithm, and ring = coll_tuned algorithm 4); Gloo: AllreduceRingChunked, TCP on 127.0.0.1, file store. Time is the slowest rank's average.\n\n{}{table}",
        ctx.loopback_nics,
        notes.iter().map(|n| format!("- **{n}**\n")).collect::<String>()
    );
    let series: Vec<(String, Vec<(f64, f64)>)> =
        curves.iter().map(|(n, rows)| (n.clone(), rows.iter().map(|r| (r.size as f64, r.busbw)).collect())).collect();
    res.plot(ctx, "loopback.png", |p| {
        plot_lines(
            p,
            "Loopback AllReduce, 4 ranks: r2ccl vs OpenMPI vs Gloo",
            "message size (bytes, log2)",
            "bus bandwidth (GB/s)",
            &series,
            &[],
            &[],
            &[],
            true,
        )
    });
    res.json = json!({
        "sizes": sizes, "loopback_nics": ctx.loopback_nics, "notes": notes,
        "curves": curves.iter().map(|(n, rows)| json!({"name": n, "rows": rows.iter().map(|r| json!({"bytes": r.size,
            "time_us": r.time_us, "busbw": r.busbw, "wrong": r.wrong})).collect::<Vec<_>>()})).collect::<Vec<_>>(),
    });
    Ok(res)
}

// ---------------------------------------------------------------------------------------------
// Plots (plotters, bitmap backend, ab_glyph text with a TTF found on this machine).

/// Register a TTF font for plotters' text; Err(why) if none is found.
fn register_font() -> std::result::Result<(), String> {
    let candidates = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
    ];
    let path = candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| "no TTF font found (install Debian fonts-dejavu-core; cargo xtask setup does)".to_owned())?;
    let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, leaked)
        .map_err(|_| format!("{} is not a usable TTF font", path.display()))
}

const PALETTE: [plotters::style::RGBColor; 8] = [
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(255, 127, 14),
    plotters::style::RGBColor(44, 160, 44),
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(148, 103, 189),
    plotters::style::RGBColor(140, 86, 75),
    plotters::style::RGBColor(227, 119, 194),
    plotters::style::RGBColor(127, 127, 127),
];

fn perr<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("{e}")
}

/// Lines (x, y) per series; `log_x` plots log2(x) with byte labels. Horizontal reference lines
/// (`hlines`) are dashed black/grey, vertical ones (`vlines`) dashed red; `marks` are red triangles.
#[allow(clippy::too_many_arguments, reason = "one plotting call with all its parts spelled out")]
fn plot_lines(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
    hlines: &[(String, f64)],
    vlines: &[(String, f64)],
    marks: &[(f64, f64)],
    log_x: bool,
) -> Result<()> {
    use plotters::prelude::*;
    let tx = |x: f64| if log_x { x.max(1.0).log2() } else { x };
    let xs: Vec<f64> =
        series.iter().flat_map(|(_, v)| v.iter().map(|p| tx(p.0))).chain(vlines.iter().map(|v| v.1)).collect();
    let ys: Vec<f64> =
        series.iter().flat_map(|(_, v)| v.iter().map(|p| p.1)).chain(hlines.iter().map(|h| h.1)).collect();
    let lo = xs.iter().copied().reduce(f64::min).map(|m| if log_x { m } else { m.min(0.0) });
    let (x0, x1) = match (lo, xs.iter().copied().reduce(f64::max)) {
        (Some(a), Some(b)) if b > a => (a, b),
        (Some(a), _) => (a - 1.0, a + 1.0),
        _ => (0.0, 1.0),
    };
    let y1 = ys.iter().copied().filter(|y| y.is_finite()).fold(0.0f64, f64::max).max(1e-6) * 1.12;
    let root = BitMapBackend::new(path, (1100, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, 0.0..y1)
        .map_err(perr)?;
    // Log axes: labels only at whole powers of two.
    let fmt_x = |v: &f64| {
        if !log_x {
            format!("{v:.1}")
        } else if (v - v.round()).abs() < 0.02 {
            human_bytes(2f64.powf(v.round()))
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&fmt_x)
        .y_label_formatter(&|v| format!("{v:.3}"))
        .draw()
        .map_err(perr)?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let pts: Vec<(f64, f64)> = pts.iter().map(|p| (tx(p.0), p.1)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(perr)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(perr)?;
    }
    for (i, (name, y)) in hlines.iter().enumerate() {
        let color = if i == 0 { BLACK } else { PALETTE[7] };
        chart
            .draw_series(DashedLineSeries::new(vec![(x0, *y), (x1, *y)], 8, 5, color.stroke_width(1)))
            .map_err(perr)?
            .label(format!("{name} ({y:.3})"))
            .legend(move |(x, yy)| PathElement::new(vec![(x, yy), (x + 20, yy)], color));
    }
    if !marks.is_empty() {
        chart
            .draw_series(marks.iter().map(|&(x, y)| TriangleMarker::new((tx(x), y), 8, RED.filled())))
            .map_err(perr)?
            .label("window with a failover")
            .legend(|(x, y)| TriangleMarker::new((x + 10, y), 6, RED.filled()));
    }
    for (name, x) in vlines {
        chart.draw_series(DashedLineSeries::new(vec![(*x, 0.0), (*x, y1)], 3, 4, RED.stroke_width(2))).map_err(perr)?;
        chart
            .draw_series(std::iter::once(Text::new(
                name.clone(),
                (*x, y1 * 0.97),
                ("sans-serif", 15).into_font().color(&RED),
            )))
            .map_err(perr)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(perr)?;
    root.present().map_err(perr)?;
    Ok(())
}

/// Grouped bars: per group, one bar per series name.
fn plot_bars(path: &Path, title: &str, y_desc: &str, names: &[&str], groups: &[(String, Vec<f64>)]) -> Result<()> {
    use plotters::prelude::*;
    let per = names.len() + 1;
    let n = groups.len() * per;
    let y1 = groups.iter().flat_map(|g| g.1.iter().copied()).filter(|y| y.is_finite()).fold(0.0f64, f64::max).max(1e-6)
        * 1.15;
    let decimals = tick_decimals(y1);
    let root = BitMapBackend::new(path, (1100, 650)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((0..n.max(2) - 1).into_segmented(), 0.0..y1)
        .map_err(perr)?;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) if i % per == names.len() / 2 => {
            groups.get(i / per).map_or(String::new(), |g| g.0.clone())
        }
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n)
        .x_label_formatter(&label)
        .y_desc(y_desc)
        .y_label_formatter(&|v| format!("{v:.decimals$}"))
        .draw()
        .map_err(perr)?;
    for (k, name) in names.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        chart
            .draw_series(groups.iter().enumerate().map(|(g, (_, vals))| {
                let i = g * per + k;
                let v = vals.get(k).copied().filter(|v| v.is_finite()).unwrap_or(0.0);
                let mut bar =
                    Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), v)], color.filled());
                bar.set_margin(0, 0, 3, 3);
                bar
            }))
            .map_err(perr)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(perr)?;
    root.present().map_err(perr)?;
    Ok(())
}

/// One column of dots per category.
fn plot_dots(path: &Path, title: &str, y_desc: &str, cats: &[&str], dots: &[(String, f64)]) -> Result<()> {
    use plotters::prelude::*;
    let top = dots.iter().map(|d| d.1).filter(|y| y.is_finite()).fold(0.0f64, f64::max);
    let y1 = if top > 0.0 { top * 1.15 } else { 1.0 };
    // Enough decimals that neighbouring ticks never print the same number (0.2, 0.4, ... not 0, 0).
    let decimals = tick_decimals(y1);
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d((0..cats.len().max(2) - 1).into_segmented(), 0.0..y1)
        .map_err(perr)?;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) => cats.get(*i).map_or(String::new(), |c| (*c).to_owned()),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(cats.len())
        .x_label_formatter(&label)
        .y_desc(y_desc)
        .y_label_formatter(&|v| format!("{v:.decimals$}"))
        .draw()
        .map_err(perr)?;
    for (k, cat) in cats.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        chart
            .draw_series(
                dots.iter()
                    .filter(|d| d.0 == *cat)
                    .map(|d| Circle::new((SegmentValue::CenterOf(k), d.1), 5, color.filled())),
            )
            .map_err(perr)?;
    }
    root.present().map_err(perr)?;
    Ok(())
}

/// Decimals for the ticks of an axis from 0 to `top` (about ten ticks): one more than the tick
/// step's order of magnitude needs.
fn tick_decimals(top: f64) -> usize {
    let step = top / 10.0;
    if !step.is_finite() || step <= 0.0 || step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
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
        crate::cmd("cargo", &["build", "--release", "-q", "-p", "r2ccl-policy", "--bin", "r2ccl-plan"])?;
    }
    let ctx = Ctx {
        perf: crate::target_dir().join("release/r2ccl-perf"),
        plan: crate::target_dir().join("release/r2ccl-plan"),
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
            "out_of_place":{"time_us":10.0,"algbw":0.1,"busbw":0.15,"wrong":0},"in_place":{"time_us":11.0,"algbw":0.09,"busbw":0.14,"wrong":2}}],
            "wrong":2,"avg_busbw":0.145,"events":["12 ms failover x"]}"#;
        let (rows, ev) = parse_perf_json(j).unwrap();
        let want =
            PerfRow { bytes: 1024, time_us: 10.0, busbw: 0.15, time_in_place_us: 11.0, busbw_in_place: 0.14, wrong: 2 };
        assert_eq!(rows, vec![want]);
        assert_eq!(ev, vec!["12 ms failover x".to_owned()]);
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
