//! `cargo xtask e2e [--scenario NAME] [--seed S] [--loopback]`: end-to-end fault scenarios on the namespaces testbed.
//!
//! For every scenario in `tests/scenarios/*.toml` (or only `NAME`): build `r2ccl-perf` (release),
//! bring up a testbed with prefix `r2e` of the scenario's size, start one rank per node with
//! `ip netns exec r2e-n<i> r2ccl-perf ARGS` (bootstrap and OOB on the management network,
//! `R2CCL_ROOT=198.19.0.1:PORT`, data on `rail0..`), apply the fault timeline from here while
//! the ranks run, wait for every rank up to the deadline (a rank still running then is killed
//! and reported as a hang), tear the testbed down (also on error or panic) and check the
//! expectation. Logs of every rank stay in `target/e2e/<scenario>/rank<i>.{out,err}`.
//!
//! Scenario format: TOML read into a struct (serde; an unknown key is an error), every key but
//! `args` optional:
//!
//! ```toml
//! nodes = 4                      # nodes (namespaces), one rank each
//! nics = 2                       # data NICs per node (rail0..)
//! rate = "1gbit"                 # tbf shaping per NIC, or "none"
//! args = "all_reduce -b 8M -e 8M -N 0 --duration 6"   # r2ccl-perf arguments (split on spaces)
//! deadline_s = 20                # from launch; ranks still running then are a hang
//! expect = "success"             # success: every rank exits 0 and rank 0 prints
//!                                #   `# Out of bounds values : 0 OK`
//!                                # failure: every rank exits non-zero before the deadline,
//!                                #   with an exit code (a signal is a crash, not a clean error)
//! expect_error = "text"          # failure only: stderr of every survivor (a rank on a node
//!                                #   no fault touches) contains this text
//! expect_recovery = 0.8          # success only: the bus bandwidth after the last failover is at
//!                                #   least this fraction of the one before the first (fail-back)
//! failovers = "1.."              # success only: lane migrations off failed paths over every rank
//!                                #   (each rank's `# rank R: failovers F ...` line): "N", "MIN.." or
//!                                #   "MIN..MAX"; a NIC that goes down between two collectives is
//!                                #   planned around without one, a silent fault never is
//! failed_nics = ["node1/nic0"]   # success only: the failed NICs of the health view rank 0 last
//!                                #   agreed (its last `health epochN: failed NICs [...]` event;
//!                                #   none if it printed none), exactly: the verdicts' outcome
//! degraded = 0.7                 # success only, an AllReduce timeline with `failed_nics`: the bus
//!                                #   bandwidth after the last failover over the one before the
//!                                #   first is at least this fraction of what the policy predicts
//!                                #   for those failed NICs (`r2ccl-plan`: t_nf / its choice's time)
//! env = ["R2CCL_BOOTSTRAP__PEER_TIMEOUT_MS=2000"]   # optional: extra environment of every rank
//! ranks_per_node = 2             # optional (1 to 8, default 1): rank r runs on node r / 2
//! launcher = "mpirun"            # optional: start the ranks with OpenMPI's `mpirun -np NODES`
//!                                #   (each rank enters its node's namespace, takes its rank from
//!                                #   OMPI_COMM_WORLD_RANK); default "direct": one process per node
//! faults = ["2.0 1 0 down"]      # "AT_S NODE NIC KIND": AT_S seconds after rank 0's timeline
//!                                #   starts; KIND: down up blackhole restore drop undrop
//!                                #   remove (hot-unplug, no undo) rate=RATE
//! ```
//!
//! `--retries N` runs a failed scenario again up to N times and says so loudly (`RETRY`, `FLAKY`);
//! CI uses 1 as a net for timing-dependent failures; a hung rank's thread stacks are dumped with gdb.
//!
//! `--chaos N` runs N seeded random fault timelines instead (3 nodes x 3 NICs; rail 2 never
//! fails) and prints a summary of runs, faults, failovers, wrong values and hangs (both must be 0).
//! `--first I` starts at timeline `I` instead of 0 (timeline `i` of a seed is always the same).
//! `--storm` makes them fault storms: 4 nodes x 2 NICs for 12 s, a fault episode (a flap, a black
//! hole that heals, an egress drop that ends) every 0.25-0.6 s for 10 s, 0.2-0.8 s each, never on
//! every NIC of a node at once, so every node keeps a working NIC throughout; storm `i` runs
//! AllReduce, AllGather, ReduceScatter, AlltoAll or Broadcast (`i % 5`) at 8 MiB, 256 KiB or 4 KiB
//! (`(i / 5) % 3`); `--ranks-per-node R` runs R ranks on every node, `--nics K` (2-4) gives every
//! node K NICs, up to K - 1 of them under a fault at once, `--nodes N` (3-8) runs N nodes;
//! `--harsh` adds slow-NIC episodes (100 Mbit/s for a while) and NICs hot-unplugged for good (at
//! most K - 2 per node, so transient faults still come and go on two NICs).
//!
//! `--seed S` (S != 0) shifts every fault time by a pseudo-random offset in [-0.5, +0.5) s
//! (order kept), to shake out timing-dependent bugs; the seed is printed so a run repeats.
//! The namespace testbed needs root. Without it (or with `--loopback`) the command says so loudly
//! and runs the LOOPBACK FALLBACK: every rank on this host over `lo` (as many NICs as the scenario's
//! nodes have), the fault timeline injected in software (`R2CCL_FAULT`: down, black hole, slow;
//! an egress drop becomes a black hole, see [`software_faults`]), the same checks but the bandwidth
//! ones (`expect_recovery`, `degraded`), which an unshaped `lo` cannot judge. A scenario whose
//! faults have no software form is reported SKIPPED with the reason. Under CI (`CI` set) a
//! missing root is an error: CI runs the real testbed (and three scenarios on the fallback).

use crate::testbed::{self, Fault, Spec};
use anyhow::{anyhow, bail, Context, Result};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Prefix of the e2e testbed (distinct from the interactive `r2t`).
const PREFIX: &str = "r2e";
/// Rendezvous port of rank 0 on its management address.
const PORT: u16 = 29_411;

/// What a scenario expects of the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Every rank exits 0 and the results are correct.
    Success,
    /// Every rank exits non-zero before the deadline.
    Failure,
}

/// One fault of the timeline.
#[derive(Clone, Debug)]
struct Step {
    at_s: f64,
    node: u32,
    nic: u32,
    fault: Fault,
    text: String,
}

/// One parsed scenario file.
#[derive(Clone, Debug)]
struct Scenario {
    name: String,
    spec: Spec,
    args: Vec<String>,
    deadline: Duration,
    expect: Expect,
    expect_error: Option<String>,
    /// Bus bandwidth after the last failover, as a fraction of the one before the first, at least.
    expect_recovery: Option<f64>,
    /// Failovers over every rank, within these bounds.
    failovers: Option<CountRange>,
    /// The failed NICs of rank 0's last agreed health view, exactly (sorted).
    failed_nics: Option<Vec<String>>,
    /// After / before bus bandwidth at least this fraction of the policy's predicted t_nf / t.
    degraded: Option<f64>,
    faults: Vec<Step>,
    /// Extra `KEY=VALUE` environment of every rank (e.g. a shorter peer timeout).
    env: Vec<(String, String)>,
    /// How the ranks are started.
    launcher: Launcher,
    /// Ranks per node (1 by default): rank `r` runs on node `r / ranks_per_node`.
    ranks_per_node: u32,
}

impl Scenario {
    /// Ranks in the job.
    const fn world(&self) -> u32 {
        self.spec.nodes * self.ranks_per_node
    }

    /// The node rank `r` runs on.
    const fn node_of(&self, r: u32) -> u32 {
        r / self.ranks_per_node
    }
}

/// How a scenario starts its ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Launcher {
    /// One `ip netns exec` process per node, with `R2CCL_RANK` and `R2CCL_WORLD_SIZE`.
    Direct,
    /// One OpenMPI `mpirun -np NODES`; every rank finds its rank and world size in OpenMPI's
    /// environment and enters its node's namespace itself.
    Mpirun,
}

fn parse_fault(text: &str) -> Result<Step> {
    let f: Vec<&str> = text.split_whitespace().collect();
    let [at, node, nic, kind] = f[..] else {
        bail!("fault `{text}`: expected \"AT_S NODE NIC KIND\"");
    };
    let fault =
        Fault::parse(kind).with_context(|| format!("fault `{text}`: unknown kind `{kind}` ({})", Fault::KINDS))?;
    let at_s: f64 = at.parse().with_context(|| format!("fault `{text}`: AT_S `{at}` is not a number"))?;
    if !(0.0..=600.0).contains(&at_s) {
        bail!("fault `{text}`: AT_S must be 0..=600 seconds");
    }
    Ok(Step {
        at_s,
        node: node.parse().with_context(|| format!("fault `{text}`: NODE `{node}`"))?,
        nic: nic.parse().with_context(|| format!("fault `{text}`: NIC `{nic}`"))?,
        fault,
        text: format!("node {node} nic {nic} {kind}"),
    })
}

/// A scenario file as written (TOML; every key but `args` optional, unknown keys refused).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    nodes: Option<u32>,
    nics: Option<u32>,
    ranks_per_node: Option<u32>,
    rate: Option<String>,
    #[serde(default)]
    args: String,
    deadline_s: Option<u64>,
    expect: Option<String>,
    expect_error: Option<String>,
    expect_recovery: Option<f64>,
    failovers: Option<String>,
    failed_nics: Option<Vec<String>>,
    degraded: Option<f64>,
    launcher: Option<String>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    faults: Vec<String>,
}

/// A fraction in (0, 1] named `key` in scenario `name`.
fn fraction(name: &str, key: &str, v: Option<f64>) -> Result<Option<f64>> {
    match v {
        Some(f) if !(f > 0.0 && f <= 1.0) => bail!("{name}.toml: `{key}` must be a number in (0, 1], got {f}"),
        v => Ok(v),
    }
}

/// Parse one scenario file's text.
fn parse(name: &str, text: &str) -> Result<Scenario> {
    let f: ScenarioFile = toml::from_str(text).map_err(|e| anyhow!("{name}.toml: {e}"))?;
    let at = || format!("{name}.toml");
    let mut sc = Scenario {
        name: name.to_owned(),
        spec: Spec { prefix: PREFIX.into(), ..Spec::default() },
        args: f.args.split_whitespace().map(str::to_owned).collect(),
        deadline: Duration::from_secs(f.deadline_s.unwrap_or(20)),
        expect: match f.expect.as_deref() {
            None | Some("success") => Expect::Success,
            Some("failure") => Expect::Failure,
            Some(other) => bail!("{}: expect must be \"success\" or \"failure\", got `{other}`", at()),
        },
        expect_error: f.expect_error,
        expect_recovery: fraction(name, "expect_recovery", f.expect_recovery)?,
        failovers: None,
        failed_nics: None,
        degraded: fraction(name, "degraded", f.degraded)?,
        env: Vec::new(),
        launcher: match f.launcher.as_deref() {
            None | Some("direct") => Launcher::Direct,
            Some("mpirun") => Launcher::Mpirun,
            Some(other) => bail!("{}: launcher must be \"direct\" or \"mpirun\", got `{other}`", at()),
        },
        faults: f.faults.iter().map(|s| parse_fault(s)).collect::<Result<_>>().with_context(at)?,
        ranks_per_node: match f.ranks_per_node.unwrap_or(1) {
            n @ 1..=8 => n,
            n => bail!("{}: `ranks_per_node` must be 1 to 8, got {n}", at()),
        },
    };
    if let Some(n) = f.nodes {
        sc.spec.nodes = n;
    }
    if let Some(n) = f.nics {
        sc.spec.nics = n;
    }
    if let Some(r) = f.rate {
        sc.spec.rate = (r != "none").then_some(r);
    }
    if let Some(v) = f.failovers {
        sc.failovers =
            Some(CountRange::parse(&v).with_context(|| {
                format!("{}: `failovers` must be \"N\", \"MIN..\" or \"MIN..MAX\", got `{v}`", at())
            })?);
    }
    if let Some(mut items) = f.failed_nics {
        if let Some(bad) = items.iter().find(|i| nic_name(i).is_none()) {
            bail!("{}: failed_nics: `{bad}` is not a NIC name such as \"node1/nic0\"", at());
        }
        items.sort();
        sc.failed_nics = Some(items);
    }
    for item in f.env {
        let (k, v) = item.split_once('=').with_context(|| format!("{}: `{item}` is not KEY=VALUE", at()))?;
        sc.env.push((k.to_owned(), v.to_owned()));
    }
    if sc.args.is_empty() {
        bail!("{name}.toml: `args` (the r2ccl-perf arguments) is required");
    }
    if sc.spec.nodes < 2 {
        bail!("{name}.toml: needs at least 2 nodes");
    }
    if let Some(s) = sc.faults.iter().find(|s| s.node >= sc.spec.nodes || s.nic >= sc.spec.nics) {
        bail!("{name}.toml: fault `{}` names a node or NIC outside {} x {}", s.text, sc.spec.nodes, sc.spec.nics);
    }
    if sc.ranks_per_node > 1 && sc.launcher == Launcher::Mpirun {
        bail!("{name}.toml: the mpirun launcher runs one rank per node (ranks_per_node must be 1)");
    }
    if sc.expect_error.is_some() && sc.expect == Expect::Success {
        bail!("{name}.toml: expect_error only goes with expect = \"failure\"");
    }
    if sc.expect == Expect::Failure
        && (sc.failovers.is_some() || sc.failed_nics.is_some() || sc.degraded.is_some() || sc.expect_recovery.is_some())
    {
        bail!("{name}.toml: expect_recovery, failovers, failed_nics and degraded only go with expect = \"success\"");
    }
    if let Some(nics) = &sc.failed_nics {
        if let Some(bad) =
            nics.iter().find(|n| nic_name(n).is_none_or(|(node, nic)| node >= sc.spec.nodes || nic >= sc.spec.nics))
        {
            bail!("{name}.toml: failed_nics names `{bad}`, outside {} x {}", sc.spec.nodes, sc.spec.nics);
        }
    }
    if sc.degraded.is_some() {
        if sc.failed_nics.as_ref().is_none_or(Vec::is_empty) {
            bail!("{name}.toml: degraded needs a non-empty failed_nics (the NICs the prediction plans around)");
        }
        if sc.args.first().map(String::as_str) != Some("all_reduce") || !sc.args.windows(2).any(|w| w == ["-N", "0"]) {
            bail!("{name}.toml: degraded needs an AllReduce timeline (`all_reduce ... -N 0`): the policy predicts AllReduce");
        }
        if largest_size(&sc.args).is_none() {
            bail!("{name}.toml: degraded needs the size in args (`-e SIZE`)");
        }
    }
    Ok(sc)
}

/// Inclusive bounds on a count: `"N"`, `"MIN.."` or `"MIN..MAX"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CountRange {
    min: u64,
    max: Option<u64>,
}

impl CountRange {
    fn parse(s: &str) -> Option<Self> {
        let r = match s.split_once("..") {
            None => {
                let n = s.trim().parse().ok()?;
                Self { min: n, max: Some(n) }
            }
            Some((lo, hi)) => Self {
                min: lo.trim().parse().ok()?,
                max: if hi.trim().is_empty() { None } else { Some(hi.trim().parse().ok()?) },
            },
        };
        r.max.is_none_or(|m| m >= r.min).then_some(r)
    }

    fn contains(self, n: u64) -> bool {
        n >= self.min && self.max.is_none_or(|m| n <= m)
    }
}

impl std::fmt::Display for CountRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.max {
            Some(m) if m == self.min => write!(f, "{m}"),
            Some(m) => write!(f, "{}..{m}", self.min),
            None => write!(f, "{}..", self.min),
        }
    }
}

/// `(node, nic)` of a NIC name such as `node1/nic0`.
fn nic_name(s: &str) -> Option<(u32, u32)> {
    let (node, nic) = s.split_once('/')?;
    Some((node.strip_prefix("node")?.parse().ok()?, nic.strip_prefix("nic")?.parse().ok()?))
}

/// The `-e SIZE` of r2ccl-perf arguments, in bytes.
fn largest_size(args: &[String]) -> Option<u64> {
    let i = args.iter().position(|a| a == "-e")?;
    let v = args.get(i + 1)?;
    let n = crate::bench::testbed_size(v);
    (n > 0).then_some(n)
}

/// What the policy predicts for `sc`'s failed NICs: t_nf over its chosen strategy's time
/// (`r2ccl-plan --json` at the scenario's payload line rate and the communicator's alpha).
fn predicted_ratio(sc: &Scenario, plan: &Path) -> Result<f64> {
    let failed = sc.failed_nics.as_deref().unwrap_or_default();
    let bytes = largest_size(&sc.args).context("no -e SIZE")?;
    let gbps = match sc.spec.rate.as_deref() {
        Some(r) => crate::bench::payload_line_gbps(r)?,
        None => 100.0,
    };
    let mut cmd = Command::new(plan);
    cmd.args(["--nodes", &sc.spec.nodes.to_string(), "--nics", &sc.spec.nics.to_string()])
        .args(["--ranks-per-node", &sc.ranks_per_node.to_string()])
        .args(["--nic-gbps", &format!("{gbps:.6}"), "--alpha-us", crate::bench::LIBRARY_ALPHA_US])
        .args(["--bytes", &bytes.to_string(), "--json"]);
    if !failed.is_empty() {
        let spec: Vec<String> =
            failed.iter().filter_map(|n| nic_name(n)).map(|(node, nic)| format!("{node}:{nic}")).collect();
        cmd.args(["--fail", &spec.join(",")]);
    }
    let out = cmd.output().context("running r2ccl-plan")?;
    if !out.status.success() {
        bail!("r2ccl-plan failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("r2ccl-plan --json output is not JSON")?;
    let tnf = v["t_nf"].as_f64().context("r2ccl-plan: no t_nf")?;
    let chosen = v["chosen"].as_str().context("r2ccl-plan: no chosen strategy")?;
    let t = v["strategies"][chosen].as_f64().context("r2ccl-plan: no time for its choice")?;
    if !(t > 0.0 && tnf > 0.0) {
        bail!("r2ccl-plan: times t_nf {tnf}, {chosen} {t}");
    }
    Ok(tnf / t)
}

/// The sum over every rank's `# rank R: failovers F fail-backs B wrong values W` line of the
/// number after `what` (`"failovers"`, `"wrong values"`); `None` if no rank printed one.
fn rank_sum(outs: &[String], what: &str) -> Option<u64> {
    let mut seen = false;
    let mut sum = 0;
    for line in outs.iter().flat_map(|o| o.lines()) {
        let Some((_, rest)) = line.strip_prefix("# rank ").and_then(|l| l.split_once(": failovers ")) else {
            continue;
        };
        let rest = format!("failovers {rest}");
        let (_, after) = rest.split_once(&format!("{what} "))?;
        sum += after.split_whitespace().next()?.parse::<u64>().ok()?;
        seen = true;
    }
    seen.then_some(sum)
}

/// Failovers over every rank.
fn failovers_in(outs: &[String]) -> Option<u64> {
    rank_sum(outs, "failovers")
}

/// The failed NICs of rank 0's last `health epochN: failed NICs [...]` event (sorted; empty if
/// it printed none).
fn last_failed_nics(rank0_out: &str) -> Vec<String> {
    let mut last = Vec::new();
    for line in rank0_out.lines().filter(|l| l.starts_with("#   event")) {
        if let Some((_, list)) = line.split_once(": failed NICs [") {
            let list = list.split(']').next().unwrap_or("");
            last = list.split(',').map(|s| s.trim().trim_matches('"').to_owned()).filter(|s| !s.is_empty()).collect();
        }
    }
    last.sort();
    last
}

/// Every scenario in `dir`, sorted by name.
fn load_all(dir: &Path) -> Result<Vec<Scenario>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| {
            let name = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            let text = std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
            parse(&name, &text)
        })
        .collect()
}

/// splitmix64: a tiny deterministic generator for the seeded fault jitter.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fault times shifted by the seed (seed 0: unchanged); never before 0.1 s nor before the previous fault.
fn jittered(steps: &[Step], seed: u64) -> Vec<Step> {
    let mut state = seed;
    let mut prev = 0.0f64;
    steps
        .iter()
        .map(|s| {
            let mut s = s.clone();
            if seed != 0 {
                let u = (splitmix(&mut state) >> 11) as f64 / (1u64 << 53) as f64;
                s.at_s = (s.at_s + u - 0.5).max(0.1).max(prev);
            }
            prev = s.at_s;
            s
        })
        .collect()
}

/// 16 random bytes from the kernel as 32 hex digits (the job secret).
fn secret() -> Result<String> {
    let mut b = [0u8; 16];
    File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).context("reading /dev/urandom")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Kills leftover ranks and tears the testbed down (if any) when dropped (normal end, error or panic).
struct Guard {
    prefix: Option<String>,
    children: Vec<Child>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        for c in &mut self.children {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if let Some(prefix) = &self.prefix {
            if let Err(e) = testbed::down(prefix) {
                eprintln!("e2e: teardown of testbed `{prefix}` failed: {e:#}");
            }
        }
    }
}

/// How one rank ended.
#[derive(Clone, Copy, Debug)]
enum End {
    Exited(ExitStatus),
    Hung,
}

/// What one scenario run produced.
struct Outcome {
    ends: Vec<End>,
    rank0_out: String,
    /// Every rank's stdout (rank 0's too).
    outs: Vec<String>,
    errs: Vec<String>,
    fault_errors: Vec<String>,
    applied: Vec<String>,
}

fn read(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

fn execute(sc: &Scenario, exe: &Path, logs: &Path, seed: u64) -> Result<Outcome> {
    let spec = &sc.spec;
    let mut guard = Guard { prefix: Some(spec.prefix.clone()), children: Vec::new() };
    testbed::up(spec).with_context(|| format!("bringing the testbed up for `{}`", sc.name))?;
    let secret = secret()?;
    let nics: Vec<String> = (0..spec.nics).map(|r| format!("rail{r}")).collect();
    let root = format!("{}:{PORT}", Spec::mgmt_addr(0));
    let launched = Instant::now();
    if sc.launcher == Launcher::Mpirun {
        guard.children.push(launch_mpirun(sc, exe, logs, &root, &secret, &nics)?);
    }
    for i in (0..sc.world()).filter(|_| sc.launcher == Launcher::Direct) {
        let node = sc.node_of(i);
        let out = File::create(logs.join(format!("rank{i}.out")))?;
        let err = File::create(logs.join(format!("rank{i}.err")))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &spec.node_ns(node)]).arg(exe).args(&sc.args);
        // Inherited R2CCL_* variables would change the job (or be rejected as unknown); keep only logging.
        for (k, _) in std::env::vars() {
            if k.starts_with("R2CCL_") && k != "R2CCL_DEBUG" && k != "R2CCL_DEBUG_SUBSYS" {
                cmd.env_remove(k);
            }
        }
        cmd.env("R2CCL_RANK", i.to_string())
            .env("R2CCL_WORLD_SIZE", sc.world().to_string())
            .env("R2CCL_ROOT", &root)
            .env("R2CCL_SECRET", &secret)
            .env("R2CCL_NICS", nics.join(","))
            .env("R2CCL_NODE", format!("node{node}"))
            .env("R2CCL_OOB_IFACE", "mgmt0")
            .env("UCX_LOG_LEVEL", std::env::var("UCX_LOG_LEVEL").unwrap_or_else(|_| "fatal".into()))
            .envs(sc.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        guard.children.push(cmd.spawn().with_context(|| format!("starting rank {i} in {}", spec.node_ns(node)))?);
    }
    let deadline = launched + sc.deadline;
    // Fault times count from the start of rank 0's timeline (after bootstrap), or from now if
    // there is no timeline or a rank already ended.
    let out0 = logs.join("rank0.out");
    while Instant::now() < deadline && !read(&out0).contains("time(s)") && !read(&out0).contains("# Out of bounds") {
        if guard.children.iter_mut().any(|c| !matches!(c.try_wait(), Ok(None))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let t0 = Instant::now();
    let mut fault_errors = Vec::new();
    let mut applied = Vec::new();
    for step in jittered(&sc.faults, seed) {
        let at = t0 + Duration::from_secs_f64(step.at_s);
        if at > deadline {
            fault_errors.push(format!("fault `{}` at {:.2} s falls after the deadline", step.text, step.at_s));
            continue;
        }
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
        match testbed::fault(spec, step.node, step.nic, &step.fault) {
            Ok(()) => applied.push(format!("{:.2}s {}", t0.elapsed().as_secs_f64(), step.text)),
            Err(e) => fault_errors.push(format!("fault `{}`: {e:#}", step.text)),
        }
    }
    let mut ends = wait_ranks(&mut guard.children, deadline, logs, || {
        if sc.launcher == Launcher::Mpirun {
            // Evidence first, then the ranks, then mpirun (which then exits).
            for i in 0..spec.nodes {
                let pid = read(&logs.join(format!("rank{i}.pid"))).trim().parse::<u32>().ok();
                if let (Some(pid), false) = (pid, logs.join(format!("rank{i}.rc")).exists()) {
                    dump_stacks(pid, &logs.join(format!("rank{i}.stacks")));
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                }
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    })?;
    drop(guard);
    if sc.launcher == Launcher::Mpirun {
        // One process launched them all: each rank's own exit status is in its `.rc` file.
        ends = (0..spec.nodes)
            .map(|i| {
                read(&logs.join(format!("rank{i}.rc")))
                    .trim()
                    .parse::<i32>()
                    .map_or(End::Hung, |code| End::Exited(std::os::unix::process::ExitStatusExt::from_raw(code << 8)))
            })
            .collect();
    }
    let errs = (0..sc.world()).map(|i| read(&logs.join(format!("rank{i}.err")))).collect();
    let outs = (0..sc.world()).map(|i| read(&logs.join(format!("rank{i}.out")))).collect();
    Ok(Outcome { ends, rank0_out: read(&out0), outs, errs, fault_errors, applied })
}

/// Waits for every child up to `deadline`. Those still running then have their thread stacks
/// written to `rank<i>.stacks` and are killed (`Hung`), after `on_deadline` (the mpirun launcher's
/// own evidence and kills).
fn wait_ranks(children: &mut [Child], deadline: Instant, logs: &Path, on_deadline: impl FnOnce()) -> Result<Vec<End>> {
    let mut ends: Vec<Option<End>> = vec![None; children.len()];
    loop {
        for (c, end) in children.iter_mut().zip(ends.iter_mut()) {
            if end.is_none() {
                if let Some(status) = c.try_wait()? {
                    *end = Some(End::Exited(status));
                }
            }
        }
        if ends.iter().all(Option::is_some) {
            break;
        }
        if Instant::now() >= deadline {
            on_deadline();
            for (i, (c, end)) in children.iter_mut().zip(ends.iter_mut()).enumerate() {
                if end.is_none() {
                    dump_stacks(c.id(), &logs.join(format!("rank{i}.stacks")));
                    let _ = c.kill();
                    let _ = c.wait();
                    *end = Some(End::Hung);
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(ends.into_iter().map(|e| e.unwrap_or(End::Hung)).collect())
}

/// `sc`'s fault timeline as `R2CCL_FAULT` specs for the loopback fallback (one per rank of the
/// faulted node), or why it cannot be one. A fault and the step that undoes it (down/up,
/// blackhole/restore, drop/undrop, a rate and the scenario's rate) become one spec with `for_ms`;
/// a NIC removed for good is a NIC down for good; an egress drop becomes a black hole of the NIC
/// (software faults have no one-way kind); a lower rate becomes `slow:F`. Times count from the
/// ranks' connection instead of rank 0's timeline (close: both follow the bootstrap).
fn software_faults(sc: &Scenario) -> std::result::Result<Vec<String>, String> {
    let base = match sc.spec.rate.as_deref().map(crate::bench::payload_line_gbps) {
        Some(Ok(b)) => Some(b),
        Some(Err(e)) => return Err(format!("rate: {e:#}")),
        None => None,
    };
    // (node, nic) -> (start s, kind) of the fault in effect.
    let mut open: std::collections::BTreeMap<(u32, u32), (f64, String)> = std::collections::BTreeMap::new();
    let mut done: Vec<(u32, u32, f64, String, Option<f64>)> = Vec::new();
    for step in &sc.faults {
        let key = (step.node, step.nic);
        let begin = |kind: String, open: &mut std::collections::BTreeMap<(u32, u32), (f64, String)>| {
            if open.contains_key(&key) {
                return Err(format!("`{}` starts while another fault holds that NIC", step.text));
            }
            open.insert(key, (step.at_s, kind));
            Ok(())
        };
        match &step.fault {
            Fault::Down | Fault::Remove => begin("down".into(), &mut open)?,
            Fault::Blackhole | Fault::Drop => begin("blackhole".into(), &mut open)?,
            Fault::Rate(r) => {
                let base = base.ok_or("a rate change on an unshaped scenario")?;
                let f = crate::bench::payload_line_gbps(r).map_err(|e| format!("{e:#}"))? / base;
                if f >= 0.999 {
                    let (at, kind) = open.remove(&key).ok_or(format!("`{}` undoes no fault", step.text))?;
                    done.push((key.0, key.1, at, kind, Some(step.at_s - at)));
                } else {
                    begin(format!("slow:{f:.4}"), &mut open)?;
                }
            }
            Fault::Up | Fault::Restore | Fault::Undrop => {
                let (at, kind) = open.remove(&key).ok_or(format!("`{}` undoes no fault", step.text))?;
                done.push((key.0, key.1, at, kind, Some(step.at_s - at)));
            }
        }
    }
    done.extend(open.into_iter().map(|((node, nic), (at, kind))| (node, nic, at, kind, None)));
    let mut specs = Vec::new();
    for (node, nic, at, kind, dur) in done {
        for r in (0..sc.world()).filter(|&r| sc.node_of(r) == node) {
            let mut spec = format!("rank={r},nic={nic},after_ms={},kind={kind}", (at * 1000.0).round() as u64);
            if let Some(d) = dur {
                spec.push_str(&format!(",for_ms={}", (d * 1000.0).round().max(1.0) as u64));
            }
            specs.push(spec);
        }
    }
    Ok(specs)
}

/// A free loopback port below the kernel's default ephemeral range (32768-60999), for rank 0 to
/// bind after we release it: a port from that range could be handed to another connection of the
/// host in between (`r2ccl::bootstrap::free_port_outside_ephemeral_range` for the library's users).
fn low_free_port() -> Result<u16> {
    let start = std::process::id().wrapping_mul(7919) % 20_000;
    (0..20_000u32)
        .map(|i| 10_000 + ((start + i) % 20_000) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .context("no free loopback port in 10000-29999")
}

/// The loopback fallback of [`execute`]: every rank on this host over `lo` (as many NICs as the
/// scenario's nodes have), the faults injected in software (`R2CCL_FAULT`, [`software_faults`]).
fn execute_loopback(sc: &Scenario, exe: &Path, logs: &Path, faults: &[String]) -> Result<Outcome> {
    let port = low_free_port()?;
    let secret = secret()?;
    let nics = vec!["lo"; sc.spec.nics as usize].join(",");
    let mut guard = Guard { prefix: None, children: Vec::new() };
    let launched = Instant::now();
    for i in 0..sc.world() {
        let mut cmd = Command::new(exe);
        cmd.args(&sc.args);
        for (k, _) in std::env::vars() {
            if k.starts_with("R2CCL_") && k != "R2CCL_DEBUG" && k != "R2CCL_DEBUG_SUBSYS" {
                cmd.env_remove(k);
            }
        }
        cmd.env("R2CCL_RANK", i.to_string())
            .env("R2CCL_WORLD_SIZE", sc.world().to_string())
            .env("R2CCL_ROOT", format!("127.0.0.1:{port}"))
            .env("R2CCL_SECRET", &secret)
            .env("R2CCL_NICS", &nics)
            .env("R2CCL_NODE", format!("node{}", sc.node_of(i)))
            .env("UCX_LOG_LEVEL", std::env::var("UCX_LOG_LEVEL").unwrap_or_else(|_| "fatal".into()))
            .envs(sc.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(File::create(logs.join(format!("rank{i}.out")))?)
            .stderr(File::create(logs.join(format!("rank{i}.err")))?);
        if !faults.is_empty() {
            cmd.env("R2CCL_FAULT", faults.join("; "));
        }
        guard.children.push(cmd.spawn().with_context(|| format!("starting rank {i}"))?);
    }
    let ends = wait_ranks(&mut guard.children, launched + sc.deadline, logs, || {})?;
    drop(guard);
    let errs = (0..sc.world()).map(|i| read(&logs.join(format!("rank{i}.err")))).collect();
    let outs: Vec<String> = (0..sc.world()).map(|i| read(&logs.join(format!("rank{i}.out")))).collect();
    Ok(Outcome { ends, rank0_out: outs[0].clone(), outs, errs, fault_errors: Vec::new(), applied: faults.to_vec() })
}

/// `(before, during, after)` from r2ccl-perf's `# bus bandwidth before the failure B GB/s, during D
/// GB/s, after A GB/s` line.
fn bandwidth_phases(out: &str) -> Option<(f64, f64, f64)> {
    let line = out.lines().find_map(|l| l.strip_prefix("# bus bandwidth before the failure "))?;
    let mut nums = line.split_whitespace().filter_map(|w| w.trim_end_matches(',').parse::<f64>().ok());
    Some((nums.next()?, nums.next()?, nums.next()?))
}

/// Starts every rank of `sc` with one `mpirun -np NODES` (OpenMPI). Each rank runs a small shell
/// wrapper that enters namespace `<prefix>-n$OMPI_COMM_WORLD_RANK`, names its node after its
/// rank, and records its pid and exit status in `logs/rank<R>.{pid,rc}` (its output goes to
/// `rank<R>.{out,err}` as with the direct launcher). The rank and world size come from
/// OpenMPI's environment (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`), as in a real job.
fn launch_mpirun(sc: &Scenario, exe: &Path, logs: &Path, root: &str, secret: &str, nics: &[String]) -> Result<Child> {
    let spec = &sc.spec;
    let args = sc.args.join(" ");
    let (exe, logs) = (exe.display(), logs.display());
    let prefix = format!("{}-n", spec.prefix);
    let script = format!(
        "R=$OMPI_COMM_WORLD_RANK; ip netns exec {prefix}$R env R2CCL_NODE=node$R {exe} {args} \
         >{logs}/rank$R.out 2>{logs}/rank$R.err & echo $! >{logs}/rank$R.pid; wait $!; echo $? >{logs}/rank$R.rc"
    );
    let mut env: Vec<(String, String)> = vec![
        ("R2CCL_ROOT".into(), root.to_owned()),
        ("R2CCL_SECRET".into(), secret.to_owned()),
        ("R2CCL_NICS".into(), nics.join(",")),
        ("R2CCL_OOB_IFACE".into(), "mgmt0".into()),
        ("UCX_LOG_LEVEL".into(), std::env::var("UCX_LOG_LEVEL").unwrap_or_else(|_| "fatal".into())),
    ];
    env.extend(sc.env.iter().cloned());
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", &spec.nodes.to_string()]);
    for (k, _) in &env {
        cmd.args(["-x", k]);
    }
    cmd.args(["sh", "-c", &script]);
    // The rank's identity must come from OpenMPI, not from an inherited R2CCL_* variable.
    for (k, _) in std::env::vars() {
        if k.starts_with("R2CCL_") && k != "R2CCL_DEBUG" && k != "R2CCL_DEBUG_SUBSYS" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env).stdin(Stdio::null());
    cmd.stdout(File::create(format!("{logs}/mpirun.out"))?).stderr(File::create(format!("{logs}/mpirun.err"))?);
    cmd.spawn().context("starting mpirun (apt-get install openmpi-bin, or `cargo xtask setup`)")
}

/// Writes every thread's stack of a hung rank to `path` with gdb (best effort: a missing gdb or
/// a gdb that does not answer within 30 s is noted in the file), so a rare hang leaves evidence.
fn dump_stacks(pid: u32, path: &Path) {
    let out = Command::new("timeout")
        .args(["30", "gdb", "-p", &pid.to_string(), "-batch", "-nx", "-ex", "thread apply all bt"])
        .stdin(Stdio::null())
        .output();
    let text = match out {
        Ok(o) => format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        Err(e) => format!("could not run gdb: {e}"),
    };
    if let Err(e) = std::fs::write(path, text) {
        eprintln!("e2e: writing {}: {e}", path.display());
    }
}

/// Prints the thread stacks and the last log lines of every rank that hung (CI logs are all a
/// rare hang leaves behind).
fn print_hang_evidence(name: &str, logs: &Path) {
    let Ok(dir) = std::fs::read_dir(logs) else { return };
    let mut stacks: Vec<PathBuf> =
        dir.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "stacks")).collect();
    stacks.sort();
    for path in stacks {
        let rank = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        println!("  {name}: {rank} hung; its thread stacks:");
        let text = read(&path);
        for line in text.lines().filter(|l| l.starts_with("Thread ") || l.starts_with('#')).take(200) {
            println!("    {line}");
        }
        let err = read(&path.with_extension("err"));
        let lines: Vec<&str> = err.lines().collect();
        println!("  {name}: last lines of {rank}.err:");
        for line in &lines[lines.len().saturating_sub(15)..] {
            println!("    {line}");
        }
    }
}

/// The problems with an outcome (empty: the scenario passed).
/// `predicted`: the policy's t_nf / t for `sc.failed_nics` (needed by `sc.degraded`).
fn judge(sc: &Scenario, o: &Outcome, predicted: Option<f64>) -> Vec<String> {
    let mut bad = o.fault_errors.clone();
    let hung: Vec<String> =
        o.ends.iter().enumerate().filter(|(_, e)| matches!(e, End::Hung)).map(|(r, _)| r.to_string()).collect();
    if !hung.is_empty() {
        bad.push(format!(
            "HANG: rank(s) {} still running at the {} s deadline (killed; thread stacks in rank<R>.stacks)",
            hung.join(","),
            sc.deadline.as_secs()
        ));
    }
    let exited = o.ends.iter().enumerate().filter_map(|(r, e)| match e {
        End::Exited(s) => Some((r, s)),
        End::Hung => None,
    });
    match sc.expect {
        Expect::Success => {
            for (r, s) in exited.filter(|(_, s)| !s.success()) {
                bad.push(format!("rank {r} exited with {s}{}", last_error(&o.errs[r])));
            }
            if !o.rank0_out.contains("# Out of bounds values : 0 OK") {
                bad.push("rank 0 did not print `# Out of bounds values : 0 OK`".into());
            }
            if let Some(want) = sc.expect_recovery {
                match bandwidth_phases(&o.rank0_out) {
                    Some((before, _, after)) if before > 0.0 && after >= want * before => {}
                    Some((before, _, after)) => bad.push(format!(
                        "bus bandwidth after the last failover {after:.3} GB/s is under {want} x the {before:.3} GB/s \
                         before the first (no fail-back?)"
                    )),
                    None => bad.push("rank 0 printed no `# bus bandwidth before the failure` line".into()),
                }
            }
            if let Some(want) = sc.failovers {
                match failovers_in(&o.outs) {
                    Some(n) if want.contains(n) => {}
                    Some(n) => bad.push(format!("{n} failovers over every rank, expected {want}")),
                    None => bad.push("no rank printed its `# rank R: failovers` line".into()),
                }
            }
            if let Some(want) = &sc.failed_nics {
                let got = last_failed_nics(&o.rank0_out);
                if &got != want {
                    bad.push(format!("rank 0's last agreed health view has failed NICs {got:?}, expected {want:?}"));
                }
            }
            if let Some(frac) = sc.degraded {
                match (bandwidth_phases(&o.rank0_out), predicted) {
                    (Some((before, _, after)), Some(p)) if before > 0.0 && after / before >= frac * p => {}
                    (Some((before, _, after)), Some(p)) => bad.push(format!(
                        "bus bandwidth after the last failover {after:.3} GB/s is {:.3} of the {before:.3} GB/s before \
                         the first, under {frac} x the policy's predicted {p:.3}",
                        after / before.max(1e-12)
                    )),
                    (None, _) => bad.push("rank 0 printed no `# bus bandwidth before the failure` line".into()),
                    (_, None) => bad.push("no prediction for `degraded`".into()),
                }
            }
        }
        Expect::Failure => {
            for (r, s) in exited {
                if s.success() {
                    bad.push(format!("rank {r} exited 0 but the job was expected to fail"));
                } else if s.code().is_none() {
                    // A signal (SIGSEGV, SIGABRT) is a crash, not the clean error the job owes its caller.
                    bad.push(format!("rank {r} was killed by a signal ({s}){}", last_error(&o.errs[r])));
                }
            }
            if let Some(text) = &sc.expect_error {
                let faulted: Vec<u32> = sc.faults.iter().map(|s| s.node).collect();
                for r in (0..sc.world()).filter(|&r| !faulted.contains(&sc.node_of(r))) {
                    if !o.errs[r as usize].contains(text.as_str()) {
                        bad.push(format!(
                            "survivor rank {r}: stderr lacks `{text}`{}",
                            last_error(&o.errs[r as usize])
                        ));
                    }
                }
            }
        }
    }
    bad
}

/// The last non-empty stderr line, for a failure message.
fn last_error(err: &str) -> String {
    err.lines().rev().find(|l| !l.trim().is_empty()).map(|l| format!(" (stderr: {})", l.trim())).unwrap_or_default()
}

fn describe(ends: &[End]) -> String {
    ends.iter()
        .map(|e| match e {
            End::Exited(s) => s.code().map_or_else(|| s.to_string(), |c| c.to_string()),
            End::Hung => "hang".into(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `cargo xtask e2e [--scenario NAME] [--seed S]`.
pub(crate) fn main(args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "--gpu") {
        // Multi-process GPU scenarios (every collective; NIC down, flap and black hole as
        // software faults on loopback): the packed gpu-check, built and run here.
        let rest: Vec<String> = args.iter().filter(|a| *a != "--gpu").cloned().collect();
        if !rest.is_empty() {
            bail!("e2e --gpu takes no other option (it runs `cargo xtask gpu-check`), got {rest:?}");
        }
        return crate::gpu::main(&[]);
    }
    let mut only: Option<String> = None;
    let mut seed = 0u64;
    let mut chaos = 0u32;
    let mut storm = false;
    let mut shape = StormShape::default();
    let mut first = 0u32;
    let mut retries = 0u32;
    let mut loopback = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--scenario" => only = Some(it.next().context("--scenario needs a name")?.clone()),
            "--seed" => seed = it.next().context("--seed needs a number")?.parse().context("--seed: not a number")?,
            "--retries" => {
                retries = it.next().context("--retries needs a count")?.parse().context("--retries: not a number")?;
            }
            "--chaos" => {
                chaos = it.next().context("--chaos needs a count")?.parse().context("--chaos: not a number")?
            }
            "--storm" => storm = true,
            "--ranks-per-node" => {
                shape.ranks_per_node = it
                    .next()
                    .context("--ranks-per-node needs a count")?
                    .parse()
                    .context("--ranks-per-node: not a number")?;
            }
            "--first" => {
                first = it.next().context("--first needs an index")?.parse().context("--first: not a number")?;
            }
            "--nics" => {
                shape.nics = it.next().context("--nics needs a count")?.parse().context("--nics: not a number")?;
                if !(2..=4).contains(&shape.nics) {
                    bail!("e2e: --nics must be 2, 3 or 4 (NICs per node of a storm), not {}", shape.nics);
                }
            }
            "--harsh" => shape.harsh = true,
            "--loopback" => loopback = true,
            "--nodes" => {
                shape.nodes = it.next().context("--nodes needs a count")?.parse().context("--nodes: not a number")?;
                if !(3..=8).contains(&shape.nodes) {
                    bail!("e2e: --nodes must be 3 to 8 (nodes of a storm), not {}", shape.nodes);
                }
            }
            other => bail!(
                "e2e: unknown argument `{other}`; usage: cargo xtask e2e [--scenario NAME] [--seed S] [--chaos N [--first I] [--storm [--ranks-per-node R] [--nics K] [--nodes N] [--harsh]]] [--retries N] [--loopback]"
            ),
        }
    }
    if storm && chaos == 0 {
        bail!("e2e: --storm needs --chaos N (how many storms)");
    }
    let root = crate::workspace_root();
    let mut scenarios = if chaos > 0 {
        if seed == 0 {
            seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs()) | 1;
        }
        let how = if storm { format!(" --storm{}", shape.flags()) } else { String::new() };
        let from = if first > 0 { format!(" --first {first}") } else { String::new() };
        println!(
            "e2e: chaos: {chaos} random fault timelines, seed {seed} (repeat with --chaos {chaos}{from}{how} --seed {seed})"
        );
        (first..first.saturating_add(chaos))
            .map(|i| {
                let (name, text) = if storm { storm_scenario(seed, i, shape) } else { chaos_scenario(seed, i) };
                parse(&name, &text).inspect(|sc| {
                    println!(
                        "e2e: {name}: {}",
                        sc.faults.iter().map(|f| format!("{:.2}s {}", f.at_s, f.text)).collect::<Vec<_>>().join("; ")
                    );
                })
            })
            .collect::<Result<Vec<_>>>()?
    } else {
        load_all(&root.join("tests/scenarios"))?
    };
    if let Some(name) = &only {
        let names: Vec<String> = scenarios.iter().map(|s| s.name.clone()).collect();
        scenarios.retain(|s| &s.name == name);
        if scenarios.is_empty() {
            bail!("e2e: no scenario `{name}`; there are: {}", names.join(" "));
        }
    }
    if !crate::is_root() {
        if std::env::var_os("CI").is_some() {
            bail!("e2e: needs root (network namespaces), and CI is set: run CI as root");
        }
        loopback = true;
        println!("******** e2e: not root, so no network namespaces: LOOPBACK FALLBACK ********");
    }
    if loopback {
        println!(
            "******** e2e LOOPBACK: every rank on this host over `lo`, faults injected in software (R2CCL_FAULT), \
             bandwidth checks (expect_recovery, degraded) SKIPPED; the namespace testbed needs root ********"
        );
    }
    let _lock = if loopback { None } else { Some(testbed::PrefixLock::take(PREFIX)?) };
    crate::cmd("cargo", &["build", "--release", "-q", "-p", "r2ccl-perf"])?;
    let exe = crate::target_dir().join("release/r2ccl-perf");
    let plan = crate::target_dir().join("release/r2ccl-plan");
    if scenarios.iter().any(|s| s.degraded.is_some()) {
        crate::cmd("cargo", &["build", "--release", "-q", "-p", "r2ccl-policy", "--bin", "r2ccl-plan"])?;
    }
    let (mut passed, mut failed, mut skipped) = (0u32, 0u32, 0u32);
    let mut tally = ChaosTally::default();
    let mut flaky: Vec<String> = Vec::new();
    for sc in &scenarios {
        let logs = root.join("target/e2e").join(&sc.name);
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let predicted = match sc.degraded.filter(|_| !loopback).map(|_| predicted_ratio(sc, &plan)).transpose() {
            Ok(p) => p,
            Err(e) => bail!("e2e: {}: predicting `degraded`: {e:#}", sc.name),
        };
        // The loopback fallback: software faults, and no bandwidth checks (lo is not shaped).
        let soft = if loopback {
            match software_faults(sc) {
                Ok(f) => Some(f),
                Err(why) => {
                    println!("e2e: SKIPPED {} on loopback: {why}", sc.name);
                    skipped += 1;
                    continue;
                }
            }
        } else {
            None
        };
        // What the outcome is judged against.
        let view = if loopback {
            if sc.degraded.is_some() || sc.expect_recovery.is_some() {
                println!("e2e: {}: bandwidth checks SKIPPED on loopback (expect_recovery, degraded)", sc.name);
            }
            Scenario { degraded: None, expect_recovery: None, ..sc.clone() }
        } else {
            sc.clone()
        };
        let run = |logs: &Path| match &soft {
            Some(f) => execute_loopback(sc, &exe, logs, f),
            None => execute(sc, &exe, logs, if chaos > 0 { 0 } else { seed }),
        };
        let mut start = Instant::now();
        let mut result = run(&logs);
        let mut problems = match &result {
            Ok(o) => judge(&view, o, predicted),
            Err(e) => vec![format!("{e:#}")],
        };
        for attempt in 1..=retries {
            if problems.is_empty() {
                break;
            }
            // Loud on purpose: a pass on a retry is a flake to fix, not a pass to forget. The
            // first attempt's logs are kept next to the retry's.
            println!(
                "e2e: RETRY {} (attempt {} of {}): first attempt failed: {}",
                sc.name,
                attempt + 1,
                retries + 1,
                problems.join("; ")
            );
            flaky.push(sc.name.clone());
            print_hang_evidence(&sc.name, &logs);
            let kept = logs.with_extension(format!("attempt{attempt}"));
            let _ = std::fs::remove_dir_all(&kept);
            let _ = std::fs::rename(&logs, &kept);
            std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
            start = Instant::now();
            result = run(&logs);
            problems = match &result {
                Ok(o) => judge(&view, o, predicted),
                Err(e) => vec![format!("{e:#}")],
            };
        }
        let secs = start.elapsed().as_secs_f64();
        let shape = match sc.ranks_per_node {
            1 => format!("{}x{}", sc.spec.nodes, sc.spec.nics),
            r => format!("{}x{}x{r}", sc.spec.nodes, sc.spec.nics),
        };
        if let Ok(o) = &result {
            for line in o
                .rank0_out
                .lines()
                .filter(|l| l.starts_with("#   event") || l.starts_with("# event") || l.starts_with("# bus bandwidth"))
            {
                println!("  {}: {}", sc.name, line.trim_start_matches('#').trim());
            }
            if let (Some(p), Some((before, _, after))) = (predicted, bandwidth_phases(&o.rank0_out)) {
                println!(
                    "  {}: bus bandwidth after / before {:.3}, the policy's predicted t_nf / t {p:.3}",
                    sc.name,
                    after / before.max(1e-12)
                );
            }
            if let Some(n) = failovers_in(&o.outs) {
                println!("  {}: {n} failovers over every rank", sc.name);
            }
        }
        if let Ok(o) = &result {
            tally.add(o);
        }
        let exits = result.as_ref().map(|o| describe(&o.ends)).unwrap_or_default();
        let faults = result.as_ref().map(|o| o.applied.join("; ")).unwrap_or_default();
        let want = match sc.expect {
            Expect::Success => "success",
            Expect::Failure => "failure",
        };
        if problems.is_empty() {
            passed += 1;
            println!("e2e: PASS {} ({shape}, expect {want}) {secs:.1} s; exits [{exits}]; faults [{faults}]", sc.name);
        } else {
            failed += 1;
            println!(
                "e2e: FAIL {} ({shape}, expect {want}) {secs:.1} s; exits [{exits}]; faults [{faults}]; logs {}",
                sc.name,
                logs.display()
            );
            for p in &problems {
                println!("  {}: {p}", sc.name);
            }
            print_hang_evidence(&sc.name, &logs);
        }
    }
    println!(
        "e2e: {passed} passed, {failed} failed{}{}",
        if skipped > 0 { format!(", {skipped} SKIPPED (no software form of their faults)") } else { String::new() },
        if seed != 0 { format!(" (seed {seed})") } else { String::new() }
    );
    if loopback {
        println!(
            "e2e: that was the LOOPBACK fallback (software faults, no bandwidth checks), not the namespace testbed"
        );
    }
    if !flaky.is_empty() {
        println!("e2e: FLAKY (passed only on a retry or failed twice): {}", flaky.join(" "));
    }
    if chaos > 0 {
        println!(
            "e2e: chaos summary: runs {}, faults {}, failovers {}, wrong values {}, hangs {} (seed {seed})",
            tally.runs, tally.faults, tally.failovers, tally.wrong, tally.hangs
        );
        if tally.wrong > 0 || tally.hangs > 0 {
            bail!("e2e: chaos found {} wrong values and {} hangs", tally.wrong, tally.hangs);
        }
    }
    if failed > 0 {
        bail!("e2e: {failed} scenario(s) failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every checked-in scenario parses, and the parser rejects what it does not understand.
    #[test]
    fn scenarios_parse() {
        let all = load_all(&crate::workspace_root().join("tests/scenarios")).expect("scenarios parse");
        let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        for want in ["all-nics-down", "all-nics-removed", "blackhole", "flap", "nic-down", "nic-remove"] {
            assert!(names.contains(&want), "scenario {want} exists");
        }
        let flap = all.iter().find(|s| s.name == "flap").expect("flap");
        assert_eq!((flap.spec.nodes, flap.spec.nics, flap.faults.len()), (2, 2, 2));
        assert_eq!(flap.faults[1].fault, Fault::Up);
        let removed = all.iter().find(|s| s.name == "nic-remove").expect("nic-remove");
        assert_eq!(removed.faults[0].fault, Fault::Remove);
        for kind in ["down", "up", "blackhole", "restore", "drop", "undrop", "remove", "rate=10mbit"] {
            assert_eq!(Fault::parse(kind).map(|f| f.name()).as_deref(), Some(kind));
        }
        assert_eq!(Fault::parse("rate="), None);
        assert_eq!(Fault::parse("unplug"), None);
        assert!(parse("x", "nodes = 2\nargs = \"a\"\nfaults = [\"1 0 0 unplug\"]")
            .is_err_and(|e| format!("{e:#}").contains("unknown kind `unplug`")));
        assert!(parse("x", "nodes = 2\nbogus = 1\nargs = \"a\"").is_err());
        assert!(parse("x", "nodes = 2\nargs = \"a\"\nfaults = [\"1 5 0 down\"]").is_err());
        assert!(parse("x", "nodes = 2 # two\nargs = \"a # b\"").is_ok_and(|s| s.args == ["a", "#", "b"]));
        assert_eq!(flap.expect_recovery, Some(0.8));
        let rpn = all.iter().find(|s| s.name == "ranks-per-node").expect("ranks-per-node");
        assert_eq!((rpn.world(), rpn.node_of(5)), (8, 2));
        assert!(parse("x", "nodes = 2\nargs = \"a\"\nranks_per_node = 0").is_err());
        assert!(parse("x", "nodes = 2\nargs = \"a\"\nranks_per_node = 9").is_err());
        assert!(parse("x", "nodes = 2\nargs = \"a\"\nranks_per_node = 2\nlauncher = \"mpirun\"")
            .is_err_and(|e| format!("{e:#}").contains("one rank per node")));
        assert!(parse("x", "nodes = 2\nargs = \"a\"\nexpect_recovery = 1.5").is_err());
        assert!(parse("x", "nodes = 2\nargs = \"a\"\nexpect_recovery = \"0.5\"").is_err());
    }

    /// The failover, health-view and prediction expectations parse, and bad ones are refused with
    /// the key named.
    #[test]
    fn outcome_expectations_parse_and_bad_ones_are_refused() {
        let base = "nodes = 4\nnics = 2\nargs = \"all_reduce -b 8M -e 8M -N 0 --duration 6\"\n";
        let sc = parse(
            "x",
            &format!("{base}failovers = \"1..\"\nfailed_nics = [\"node3/nic1\", \"node1/nic0\"]\ndegraded = 0.7"),
        )
        .unwrap();
        assert_eq!(sc.failovers, Some(CountRange { min: 1, max: None }));
        assert_eq!(sc.failed_nics, Some(vec!["node1/nic0".to_owned(), "node3/nic1".to_owned()]));
        assert_eq!(sc.degraded, Some(0.7));
        assert_eq!(CountRange::parse("3"), Some(CountRange { min: 3, max: Some(3) }));
        assert_eq!(CountRange::parse("2..40"), Some(CountRange { min: 2, max: Some(40) }));
        assert!(CountRange::parse("5..2").is_none() && CountRange::parse("x..").is_none());
        assert!(CountRange { min: 2, max: Some(40) }.contains(40) && !CountRange { min: 2, max: None }.contains(1));
        for (bad, says) in [
            ("failovers = \"many\"", "failovers"),
            ("failed_nics = [\"eth0\"]", "failed_nics"),
            ("failed_nics = [\"node9/nic0\"]", "outside"),
            ("degraded = 0.7", "failed_nics"),
            ("degraded = 1.5", "degraded"),
            ("expect = \"failure\"\nfailovers = \"1..\"", "success"),
        ] {
            let e = parse("x", &format!("{base}{bad}")).unwrap_err().to_string();
            assert!(e.contains(says), "`{bad}`: {e}");
        }
        let gather =
            "nodes = 4\nargs = \"all_gather -b 8M -e 8M -N 0\"\nfailed_nics = [\"node1/nic0\"]\ndegraded = 0.5";
        assert!(parse("x", gather).unwrap_err().to_string().contains("AllReduce"));
    }

    /// The loopback fallback's software faults: a fault and the step that undoes it become one spec
    /// per rank of the node, with `for_ms`; what has no software form is refused with the reason.
    #[test]
    fn fault_timelines_become_software_fault_specs() {
        let text = "nodes = 3\nnics = 2\nranks_per_node = 2\nrate = \"1gbit\"\nargs = \"all_reduce -b 8M -e 8M -N 0\"\n\
                    faults = [\"1.5 0 1 down\", \"2.0 2 0 drop\", \"3.0 0 1 up\", \"3.5 1 0 rate=100mbit\", \"4.0 1 0 rate=1gbit\"]";
        let sc = parse("x", text).unwrap();
        assert_eq!(
            software_faults(&sc).unwrap(),
            [
                "rank=0,nic=1,after_ms=1500,kind=down,for_ms=1500",
                "rank=1,nic=1,after_ms=1500,kind=down,for_ms=1500",
                "rank=2,nic=0,after_ms=3500,kind=slow:0.1000,for_ms=500",
                "rank=3,nic=0,after_ms=3500,kind=slow:0.1000,for_ms=500",
                "rank=4,nic=0,after_ms=2000,kind=blackhole",
                "rank=5,nic=0,after_ms=2000,kind=blackhole",
            ]
        );
        let undo_nothing = "nodes = 2\nargs = \"all_reduce\"\nfaults = [\"1.0 1 0 up\"]";
        assert!(software_faults(&parse("x", undo_nothing).unwrap()).unwrap_err().contains("undoes no fault"));
        let overlap = "nodes = 2\nargs = \"all_reduce\"\nfaults = [\"1.0 1 0 down\", \"1.5 1 0 blackhole\"]";
        assert!(software_faults(&parse("x", overlap).unwrap()).unwrap_err().contains("another fault"));
    }

    /// Failovers are summed over every rank's migrations line; the last health view wins.
    #[test]
    fn failovers_and_the_last_health_view_come_out_of_the_ranks_output() {
        let outs = vec![
            "x\n# rank 0: failovers 3 fail-backs 1 wrong values 0\n".to_owned(),
            "# rank 1: failovers 0 fail-backs 0 wrong values 5\n".to_owned(),
            "# rank 2: failovers 4 fail-backs 0 wrong values 0\n".to_owned(),
        ];
        assert_eq!(failovers_in(&outs), Some(7));
        assert_eq!(rank_sum(&outs, "fail-backs"), Some(1));
        assert_eq!(rank_sum(&outs, "wrong values"), Some(5));
        assert_eq!(failovers_in(&["nothing".to_owned()]), None);
        let rank0 = "#   event    2189 ms  health epoch1: failed NICs [\"node1/nic0\"]; re-planning\n\
                     #   event    3000 ms  health epoch2: failed NICs [\"node3/nic1\", \"node1/nic0\"]; re-planning\n";
        assert_eq!(last_failed_nics(rank0), vec!["node1/nic0".to_owned(), "node3/nic1".to_owned()]);
        let back = format!("{rank0}#   event    4000 ms  health epoch3: failed NICs []; re-planning\n");
        assert!(last_failed_nics(&back).is_empty());
        assert!(last_failed_nics("no events").is_empty());
    }

    /// The before/during/after bus bandwidths come out of r2ccl-perf's summary line.
    #[test]
    fn bandwidth_phases_parse() {
        let out = "#  time(s)\n# bus bandwidth before the failure 0.187 GB/s, during 0.085 GB/s, after 0.188 GB/s (strategy x)\n";
        assert_eq!(bandwidth_phases(out), Some((0.187, 0.085, 0.188)));
        assert_eq!(bandwidth_phases("# bus bandwidth 0.2 GB/s, no failover"), None);
    }

    /// A storm parses, and every node has at most one NIC under a fault at any time (so each keeps
    /// a working NIC), each episode ending with the fault that undoes it.
    #[test]
    fn storms_leave_every_node_a_working_nic() {
        let (mut removed, mut slowed) = (0, 0);
        for i in 0..20 {
            let (rpn, nics, nodes, harsh) = (1 + i % 2, 2 + i % 3, 3 + i % 6, i % 4 == 3);
            let (name, text) = storm_scenario(7, i, StormShape { ranks_per_node: rpn, nics, nodes, harsh });
            let sc = parse(&name, &text).expect("a storm parses");
            assert_eq!((sc.spec.nodes, sc.spec.nics, sc.ranks_per_node), (nodes, nics, rpn));
            removed += sc.faults.iter().filter(|f| f.fault == Fault::Remove).count();
            // NICs lost for good never leave two nodes without a rail in common.
            let kept =
                |n: u32, r: u32| !sc.faults.iter().any(|f| f.fault == Fault::Remove && f.node == n && f.nic == r);
            for (a, b) in (0..nodes).flat_map(|a| (a + 1..nodes).map(move |b| (a, b))) {
                assert!(
                    (0..nics).any(|r| kept(a, r) && kept(b, r)),
                    "{name}: nodes {a} and {b} share no rail for good"
                );
            }
            slowed += sc.faults.iter().filter(|f| matches!(&f.fault, Fault::Rate(r) if r == "100mbit")).count();
            assert!(sc.faults.len() >= 20, "{name}: {} faults", sc.faults.len());
            for node in 0..nodes {
                // The faults under way on this node's NICs, in time order.
                let mut on: Vec<(u32, Fault)> = Vec::new();
                for f in sc.faults.iter().filter(|f| f.node == node) {
                    let undo = match &f.fault {
                        Fault::Down => Fault::Up,
                        Fault::Blackhole => Fault::Restore,
                        Fault::Drop => Fault::Undrop,
                        Fault::Rate(r) if r == "100mbit" && harsh => Fault::Rate("1gbit".into()),
                        // Lost for good: never undone, never faulted again.
                        Fault::Remove if harsh => Fault::Remove,
                        Fault::Up | Fault::Restore | Fault::Undrop | Fault::Rate(_) => {
                            let at = on.iter().position(|o| o.0 == f.nic);
                            let Some(at) = at else { panic!("{name}: node {node} NIC {} healed unhurt", f.nic) };
                            assert_eq!(on.remove(at).1, f.fault, "{name}: the fault that undoes it");
                            continue;
                        }
                        other => panic!("{name}: unexpected {other:?}"),
                    };
                    assert!(on.iter().all(|o| o.0 != f.nic), "{name}: two faults at once on one NIC");
                    on.push((f.nic, undo));
                    assert!((on.len() as u32) < nics, "{name}: node {node} lost every NIC");
                }
                assert!(on.iter().all(|o| o.1 == Fault::Remove), "{name}: node {node} ends with a fault: {on:?}");
                assert!(on.len() + 2 <= nics as usize || on.is_empty(), "{name}: node {node} lost {on:?} for good");
            }
        }
        assert!(removed > 0 && slowed > 0, "harsh storms lose NICs ({removed}) and slow them ({slowed})");
        let d = StormShape::default();
        assert_eq!(storm_scenario(7, 3, d), storm_scenario(7, 3, d), "seeded");
    }

    /// Seeded jitter moves faults by less than half a second and keeps their order.
    #[test]
    fn jitter_keeps_order() {
        let sc = parse("x", "nodes = 2\nargs = \"a\"\nfaults = [\"1.5 0 1 down\", \"3.0 0 1 up\"]").expect("parses");
        for seed in 1..200 {
            let j = jittered(&sc.faults, seed);
            assert!(j[0].at_s <= j[1].at_s);
            assert!(j.iter().zip(&sc.faults).all(|(a, b)| (a.at_s - b.at_s).abs() <= 0.5 + 1e-9 || a.at_s == 0.1));
        }
        assert_eq!(jittered(&sc.faults, 0)[0].at_s, 1.5);
    }
}

/// Totals over chaos runs.
#[derive(Default)]
struct ChaosTally {
    runs: u32,
    faults: usize,
    failovers: usize,
    wrong: u64,
    hangs: u32,
}

impl ChaosTally {
    fn add(&mut self, o: &Outcome) {
        self.runs += 1;
        self.faults += o.applied.len();
        // Over every rank where they printed their counts (timelines), else rank 0's.
        self.failovers += failovers_in(&o.outs).map_or_else(
            || o.rank0_out.lines().filter(|l| l.contains("event") && l.contains("failover")).count(),
            |n| n as usize,
        );
        match rank_sum(&o.outs, "wrong values") {
            Some(n) => self.wrong += n,
            None => {
                for l in o.rank0_out.lines() {
                    if let Some(rest) = l.strip_prefix("# Out of bounds values :") {
                        self.wrong += rest.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
                    }
                }
            }
        }
        self.hangs += o.ends.iter().filter(|e| matches!(e, End::Hung)).count() as u32;
    }
}

/// A pseudo-random generator for chaos timelines (xorshift64*; a seed repeats a run).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Chaos run `i` of `seed`: 3 nodes x 3 NICs at 1gbit, 1 to 3 random faults on rails 0 and 1
/// between 1.5 and 4.5 s (NIC down, flap, black hole with or without restore, egress drop,
/// slow NIC). Rail 2 never fails, so every pair of nodes keeps a common rail and the job must
/// finish with every value exact.
/// The generator of chaos timeline `i` of `seed`.
fn chaos_rng(seed: u64, i: u32) -> Rng {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ u64::from(i).wrapping_add(1).wrapping_mul(0xD1B5_4A32_D192_ED03)
        | 1);
    for _ in 0..4 {
        rng.next();
    }
    rng
}

/// The collectives fault storms run, storm `i` running `STORM_COLLECTIVES[i % 5]`.
const STORM_COLLECTIVES: [&str; 5] = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast"];

/// The message sizes fault storms run, storm `i` running `STORM_SIZES[(i / 5) % 3]`: large
/// messages (pipelined, striped), medium ones and small ones (thousands of collectives, so faults
/// land on plan and agreement boundaries far more often).
const STORM_SIZES: [&str; 3] = ["8M", "256K", "4K"];

/// The shape of a fault storm's testbed (`--nodes`, `--nics`, `--ranks-per-node`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StormShape {
    ranks_per_node: u32,
    nics: u32,
    nodes: u32,
    /// `--harsh`: slow-NIC episodes too, and NICs lost for good.
    harsh: bool,
}

impl Default for StormShape {
    fn default() -> Self {
        Self { ranks_per_node: 1, nics: 2, nodes: 4, harsh: false }
    }
}

impl StormShape {
    /// The command-line flags that give this shape (none for the default).
    fn flags(self) -> String {
        let d = Self::default();
        let mut f = String::new();
        if self.ranks_per_node != d.ranks_per_node {
            f += &format!(" --ranks-per-node {}", self.ranks_per_node);
        }
        if self.nics != d.nics {
            f += &format!(" --nics {}", self.nics);
        }
        if self.nodes != d.nodes {
            f += &format!(" --nodes {}", self.nodes);
        }
        if self.harsh {
            f += " --harsh";
        }
        f
    }
}

/// Fault storm `i` of `seed` (`--chaos N --storm`): `nodes` (4) nodes x `nics` (2) NICs, 12 s of collectives
/// (storm `i` runs `STORM_COLLECTIVES[i % 5]` at `STORM_SIZES[(i / 5) % 3]`); from 1.5 s to
/// 11.5 s a fault episode starts every 0.25-0.6 s on a random healthy NIC of a random node that
/// has fewer than `nics - 1` NICs under a fault: a flap (down, up), a black hole that heals, or an
/// egress drop that ends, each 0.2-0.8 s long. Every node keeps a working NIC throughout.
fn storm_scenario(seed: u64, i: u32, shape: StormShape) -> (String, String) {
    let StormShape { ranks_per_node, nics, nodes, .. } = shape;
    let mut rng = chaos_rng(seed, i);
    let mut busy_until = vec![vec![0.0f64; nics as usize]; nodes as usize];
    let mut lost = vec![0u32; nodes as usize];
    let mut gone = vec![vec![false; nics as usize]; nodes as usize];
    let mut faults: Vec<(f64, String)> = Vec::new();
    let mut at = 1.5;
    while at < 11.5 {
        let node = rng.below(u64::from(nodes)) as usize;
        let free: Vec<usize> = (0..nics as usize).filter(|&n| busy_until[node][n] < at).collect();
        if free.len() > 1 {
            let nic = free[rng.below(free.len() as u64) as usize];
            let end = at + 0.2 + rng.below(600) as f64 / 1000.0;
            let kind = if shape.harsh { rng.below(5) } else { rng.below(3) };
            // A harsh storm loses at most `nics - 2` NICs of a node for good (hot-unplugged), so
            // that transient faults still come and go on two, and never one that would leave two
            // nodes without a rail in common for good: on a rail-only fabric nothing could carry
            // their transfers then (no relay through a third node: a bounded error, by design).
            let keeps = |m: usize, r: usize| !(gone[m][r] || (m == node && r == nic));
            let may_lose = lost[node] + 2 < nics
                && (0..nodes as usize).all(|m| m == node || (0..nics as usize).any(|r| keeps(node, r) && keeps(m, r)));
            let (on, off) = match kind {
                0 => ("down", Some("up")),
                1 => ("blackhole", Some("restore")),
                2 => ("drop", Some("undrop")),
                3 => ("rate=100mbit", Some("rate=1gbit")),
                _ if may_lose => ("remove", None),
                _ => ("down", Some("up")),
            };
            faults.push((at, format!("{at:.2} {node} {nic} {on}")));
            match off {
                Some(off) => {
                    faults.push((end, format!("{end:.2} {node} {nic} {off}")));
                    // A short gap after the episode: the next one on this NIC starts on a healed NIC.
                    busy_until[node][nic] = end + 0.05;
                }
                None => {
                    lost[node] += 1;
                    gone[node][nic] = true;
                    busy_until[node][nic] = f64::INFINITY;
                }
            }
        }
        at += 0.25 + rng.below(350) as f64 / 1000.0;
    }
    faults.sort_by(|a, b| a.0.total_cmp(&b.0));
    let list: Vec<String> = faults.into_iter().map(|(_, f)| format!("\"{f}\"")).collect();
    let name = format!("storm-{seed}-{i}");
    let size = STORM_SIZES[(i as usize / STORM_COLLECTIVES.len()) % STORM_SIZES.len()];
    let text = format!(
        "nodes = {nodes}\nnics = {nics}\nranks_per_node = {ranks_per_node}\nrate = \"1gbit\"\nargs = \"{} -b {size} -e {size} -N 0 --duration 12\"\ndeadline_s = 45\nexpect = \"success\"\nfaults = [{}]\n",
        STORM_COLLECTIVES[i as usize % STORM_COLLECTIVES.len()],
        list.join(", ")
    );
    (name, text)
}

fn chaos_scenario(seed: u64, i: u32) -> (String, String) {
    let mut rng = chaos_rng(seed, i);
    let mut faults: Vec<(f64, String)> = Vec::new();
    let mut used: Vec<(u64, u64)> = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let (node, nic) = (rng.below(3), rng.below(2));
        if used.contains(&(node, nic)) {
            continue;
        }
        used.push((node, nic));
        let at = 1.5 + rng.below(3000) as f64 / 1000.0;
        let heal = at + 0.3 + rng.below(1500) as f64 / 1000.0;
        let pair: &[(f64, &str)] = match rng.below(6) {
            0 => &[(at, "down")],
            1 => &[(at, "down"), (heal, "up")],
            2 => &[(at, "blackhole")],
            3 => &[(at, "blackhole"), (heal, "restore")],
            4 => &[(at, "drop")],
            _ => &[(at, "rate=100mbit")],
        };
        for (t, kind) in pair {
            faults.push((*t, format!("{t:.2} {node} {nic} {kind}")));
        }
    }
    faults.sort_by(|a, b| a.0.total_cmp(&b.0));
    let list: Vec<String> = faults.into_iter().map(|(_, f)| format!("\"{f}\"")).collect();
    let name = format!("chaos-{seed}-{i}");
    let text = format!(
        "nodes = 3\nnics = 3\nrate = \"1gbit\"\nargs = \"all_reduce -b 8M -e 8M -N 0 --duration 7\"\ndeadline_s = 30\nexpect = \"success\"\nfaults = [{}]\n",
        list.join(", ")
    );
    (name, text)
}
