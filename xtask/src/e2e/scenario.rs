//! Scenario files: the format read into `Scenario` (serde + toml) and its checks.

#[allow(clippy::wildcard_imports, reason = "a part of e2e.rs: its helpers are the parent's")]
use super::*;

/// What a scenario expects of the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Expect {
    /// Every rank exits 0 and the results are correct.
    Success,
    /// Every rank exits non-zero before the deadline.
    Failure,
}

/// One fault of the timeline.
#[derive(Clone, Debug)]
pub(super) struct Step {
    pub(super) at_s: f64,
    pub(super) node: u32,
    pub(super) nic: u32,
    pub(super) fault: Fault,
    pub(super) text: String,
}

/// One parsed scenario file.
#[derive(Clone, Debug)]
pub(super) struct Scenario {
    pub(super) name: String,
    pub(super) spec: Spec,
    pub(super) args: Vec<String>,
    pub(super) deadline: Duration,
    pub(super) expect: Expect,
    pub(super) expect_error: Option<String>,
    /// Bus bandwidth after the last failover, as a fraction of the one before the first, at least.
    pub(super) expect_recovery: Option<f64>,
    /// Failovers over every rank, within these bounds.
    pub(super) failovers: Option<CountRange>,
    /// The failed NICs of rank 0's last agreed health view, exactly (sorted).
    pub(super) failed_nics: Option<Vec<String>>,
    /// After / before bus bandwidth at least this fraction of the policy's predicted t_nf / t.
    pub(super) degraded: Option<f64>,
    pub(super) faults: Vec<Step>,
    /// Extra `KEY=VALUE` environment of every rank (e.g. a shorter peer timeout).
    pub(super) env: Vec<(String, String)>,
    /// How the ranks are started.
    pub(super) launcher: Launcher,
    /// Ranks per node (1 by default): rank `r` runs on node `r / ranks_per_node`.
    pub(super) ranks_per_node: u32,
}

impl Scenario {
    /// Ranks in the job.
    pub(super) const fn world(&self) -> u32 {
        self.spec.nodes * self.ranks_per_node
    }

    /// The node rank `r` runs on.
    pub(super) const fn node_of(&self, r: u32) -> u32 {
        r / self.ranks_per_node
    }
}

/// How a scenario starts its ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Launcher {
    /// One `ip netns exec` process per node, with `R2CCL_RANK` and `R2CCL_WORLD_SIZE`.
    Direct,
    /// One OpenMPI `mpirun -np NODES`; every rank finds its rank and world size in OpenMPI's
    /// environment and enters its node's namespace itself.
    Mpirun,
}

pub(super) fn parse_fault(text: &str) -> Result<Step> {
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
pub(super) struct ScenarioFile {
    pub(super) nodes: Option<u32>,
    pub(super) nics: Option<u32>,
    pub(super) ranks_per_node: Option<u32>,
    pub(super) rate: Option<String>,
    #[serde(default)]
    pub(super) args: String,
    pub(super) deadline_s: Option<u64>,
    pub(super) expect: Option<String>,
    pub(super) expect_error: Option<String>,
    pub(super) expect_recovery: Option<f64>,
    pub(super) failovers: Option<String>,
    pub(super) failed_nics: Option<Vec<String>>,
    pub(super) degraded: Option<f64>,
    pub(super) launcher: Option<String>,
    #[serde(default)]
    pub(super) env: Vec<String>,
    #[serde(default)]
    pub(super) faults: Vec<String>,
}

/// A fraction in (0, 1] named `key` in scenario `name`.
pub(super) fn fraction(name: &str, key: &str, v: Option<f64>) -> Result<Option<f64>> {
    match v {
        Some(f) if !(f > 0.0 && f <= 1.0) => bail!("{name}.toml: `{key}` must be a number in (0, 1], got {f}"),
        v => Ok(v),
    }
}

/// Parse one scenario file's text.
pub(super) fn parse(name: &str, text: &str) -> Result<Scenario> {
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
pub(super) struct CountRange {
    pub(super) min: u64,
    pub(super) max: Option<u64>,
}

impl CountRange {
    pub(super) fn parse(s: &str) -> Option<Self> {
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

    pub(super) fn contains(self, n: u64) -> bool {
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
pub(super) fn nic_name(s: &str) -> Option<(u32, u32)> {
    let (node, nic) = s.split_once('/')?;
    Some((node.strip_prefix("node")?.parse().ok()?, nic.strip_prefix("nic")?.parse().ok()?))
}

/// The `-e SIZE` of r2ccl-perf arguments, in bytes.
pub(super) fn largest_size(args: &[String]) -> Option<u64> {
    let i = args.iter().position(|a| a == "-e")?;
    let v = args.get(i + 1)?;
    let n = crate::bench::testbed_size(v);
    (n > 0).then_some(n)
}

/// Every scenario in `dir`, sorted by name.
pub(super) fn load_all(dir: &Path) -> Result<Vec<Scenario>> {
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
