//! `cargo xtask testbed up|down|status|check|fault`: a multi-NIC cluster made of network namespaces.
//!
//! Layout (TESTBED.md): every node is a namespace `<prefix>-n<i>`; NIC `r` of node `i` is a
//! veth `rail<r>` whose peer `n<i>r<r>` sits on bridge `br<r>` (the rail switch) in the
//! switch namespace `<prefix>-sw`; a separate management network (`mgmt0` on bridge `brm`)
//! carries bootstrap and OOB traffic. Addresses come from 198.18.0.0/15 only: rail `r` is
//! 198.18.r.0/24, management is 198.19.0.0/24, node `i` is host `i + 1`. NIC speed is shaped
//! with tbf in both directions (node egress and switch-port egress). Everything carries the
//! prefix, so `down` also cleans up after a crashed run.

use anyhow::{bail, Context, Result};
use std::process::Command;

/// Name prefix of everything the testbed makes.
pub(crate) const PREFIX: &str = "r2t";
/// MTU of every rail NIC and switch port (the management network keeps 1500). Jumbo frames, as
/// data centre fabrics run: at 1500 the per-packet cost of the veth/bridge/tbf path saturates a
/// 2-core machine near 150-200 MB/s in all, and TCP payload fills at most 1448/1514 of a rate.
pub(crate) const RAIL_MTU: u32 = 9000;

/// Shape of a testbed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Spec {
    /// Name prefix (namespaces are `<prefix>-n<i>` and `<prefix>-sw`).
    pub prefix: String,
    /// Number of nodes.
    pub nodes: u32,
    /// NICs (rails) per node.
    pub nics: u32,
    /// tbf rate per NIC and direction (e.g. `1gbit`), or `None` for unshaped.
    pub rate: Option<String>,
}

impl Default for Spec {
    fn default() -> Self {
        Self { prefix: PREFIX.into(), nodes: 4, nics: 2, rate: Some("1gbit".into()) }
    }
}

impl Spec {
    /// Namespace of node `i`.
    pub(crate) fn node_ns(&self, i: u32) -> String {
        format!("{}-n{i}", self.prefix)
    }
    /// The switch namespace.
    pub(crate) fn switch_ns(&self) -> String {
        format!("{}-sw", self.prefix)
    }
    /// Address of node `i` on rail `r`.
    pub(crate) fn rail_addr(i: u32, r: u32) -> String {
        format!("198.18.{r}.{}", i + 1)
    }
    /// Management (bootstrap/OOB) address of node `i`.
    pub(crate) fn mgmt_addr(i: u32) -> String {
        format!("198.19.0.{}", i + 1)
    }
    /// Switch-side port of node `i`'s NIC `r`.
    pub(crate) fn port(i: u32, r: u32) -> String {
        format!("n{i}r{r}")
    }
}

fn run(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0]).args(&args[1..]).output().with_context(|| format!("cannot run {}", args[0]))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip_in(ns: &str, args: &[&str]) -> Result<String> {
    let mut v = vec!["ip", "-n", ns];
    v.extend_from_slice(args);
    run(&v)
}

fn in_ns(ns: &str, args: &[&str]) -> Result<String> {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    run(&v)
}

/// Namespaces whose name starts with `<prefix>-`.
pub(crate) fn namespaces(prefix: &str) -> Vec<String> {
    let list = run(&["ip", "netns", "list"]).unwrap_or_default();
    let mut names: Vec<String> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

fn shape(ns: &str, dev: &str, rate: &Option<String>) -> Result<()> {
    if let Some(rate) = rate {
        let mut v = vec!["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate];
        v.extend_from_slice(&["burst", "64kb", "latency", "50ms"]);
        run(&v)?;
    }
    Ok(())
}

/// Bring the testbed up (tearing down any previous one with the same prefix first).
pub(crate) fn up(spec: &Spec) -> Result<()> {
    if !crate::is_root() {
        bail!("testbed: needs root (network namespaces); run as root, or use the loopback fallback");
    }
    if spec.nodes == 0 || spec.nodes > 250 || spec.nics == 0 || spec.nics > 16 {
        bail!("testbed: nodes must be 1..=250 and nics 1..=16 (got {} x {})", spec.nodes, spec.nics);
    }
    down(&spec.prefix)?;
    let sw = spec.switch_ns();
    run(&["ip", "netns", "add", &sw])?;
    ip_in(&sw, &["link", "set", "lo", "up"])?;
    for bridge in (0..spec.nics).map(|r| format!("br{r}")).chain(["brm".to_owned()]) {
        ip_in(&sw, &["link", "add", &bridge, "type", "bridge"])?;
        ip_in(&sw, &["link", "set", &bridge, "up"])?;
    }
    for i in 0..spec.nodes {
        let ns = spec.node_ns(i);
        run(&["ip", "netns", "add", &ns])?;
        ip_in(&ns, &["link", "set", "lo", "up"])?;
        let mut links: Vec<(String, String, String, String)> = (0..spec.nics)
            .map(|r| (format!("rail{r}"), Spec::port(i, r), format!("br{r}"), Spec::rail_addr(i, r)))
            .collect();
        links.push(("mgmt0".into(), format!("n{i}m"), "brm".into(), Spec::mgmt_addr(i)));
        for (nic, port, bridge, addr) in &links {
            ip_in(&ns, &["link", "add", nic, "type", "veth", "peer", "name", port, "netns", &sw])?;
            ip_in(&ns, &["addr", "add", &format!("{addr}/24"), "dev", nic])?;
            if nic != "mgmt0" {
                let mtu = RAIL_MTU.to_string();
                ip_in(&ns, &["link", "set", nic, "mtu", &mtu])?;
                ip_in(&sw, &["link", "set", port, "mtu", &mtu])?;
            }
            ip_in(&ns, &["link", "set", nic, "up"])?;
            ip_in(&sw, &["link", "set", port, "master", bridge])?;
            ip_in(&sw, &["link", "set", port, "up"])?;
            if nic != "mgmt0" {
                shape(&ns, nic, &spec.rate)?;
                shape(&sw, port, &spec.rate)?;
            }
        }
    }
    Ok(())
}

/// Delete every namespace with the prefix (and with it every veth, bridge and qdisc). Idempotent.
/// Exclusive use of a testbed prefix by one xtask process: `/run/r2ccl-testbed-<prefix>.lock`
/// holds its pid. A second `bench` or `e2e` would tear down the first one's namespaces (both
/// start with `down` to clean up after crashes), so it stops with a clear error instead. A lock
/// whose pid is gone (a crashed run) is taken over. Released on drop.
pub(crate) struct PrefixLock {
    path: std::path::PathBuf,
}

impl PrefixLock {
    /// Take the lock of `prefix`, or say which process holds it.
    pub(crate) fn take(prefix: &str) -> Result<Self> {
        let dir = if std::path::Path::new("/run").is_dir() { "/run" } else { "/tmp" };
        let path = std::path::PathBuf::from(format!("{dir}/r2ccl-testbed-{prefix}.lock"));
        for _ in 0..2 {
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    use std::io::Write as _;
                    f.write_all(std::process::id().to_string().as_bytes())
                        .with_context(|| format!("writing {}", path.display()))?;
                    return Ok(Self { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let holder = std::fs::read_to_string(&path).unwrap_or_default();
                    let pid = holder.trim();
                    if !pid.is_empty() && std::path::Path::new(&format!("/proc/{pid}")).exists() {
                        bail!(
                            "testbed `{prefix}` is in use by process {pid} (another `cargo xtask bench` or `e2e`); \
                             wait for it, or kill it and run `cargo xtask testbed down --prefix {prefix}` (lock {})",
                            path.display()
                        );
                    }
                    // A crashed run's lock: take it over.
                    let _ = std::fs::remove_file(&path);
                }
                Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
            }
        }
        bail!("testbed `{prefix}`: could not take {} (another run raced for it)", path.display())
    }
}

impl Drop for PrefixLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub(crate) fn down(prefix: &str) -> Result<()> {
    for ns in namespaces(prefix) {
        run(&["ip", "netns", "del", &ns])?;
    }
    Ok(())
}

/// One line per namespace with its links' state.
pub(crate) fn status(prefix: &str) -> Result<String> {
    let mut out = String::new();
    let nss = namespaces(prefix);
    if nss.is_empty() {
        return Ok(format!("testbed `{prefix}`: down\n"));
    }
    for ns in nss {
        let links = ip_in(&ns, &["-br", "link"])?;
        let summary: Vec<String> = links
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let name = f.next()?.split('@').next()?.to_owned();
                let state = f.next()?.to_owned();
                (name != "lo").then(|| format!("{name}:{state}"))
            })
            .collect();
        out.push_str(&format!("{ns}: {}\n", summary.join(" ")));
    }
    Ok(out)
}

/// A fault on one NIC of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Link down (the node sees NO-CARRIER).
    Down,
    /// Link up again.
    Up,
    /// Silent black hole with carrier up: the switch port stops forwarding.
    Blackhole,
    /// Undo a black hole.
    Restore,
    /// 100% loss at the node's egress (`pfifo limit 0`).
    Drop,
    /// Undo `Drop` (re-applies the shaping rate, if any).
    Undrop,
    /// Change the NIC speed in both directions.
    Rate(String),
    /// Hot-unplug: the NIC's netdevice disappears (`ip link del`, which takes the switch port with it),
    /// as on a driver reset or a PCIe surprise removal. It has no undo; `testbed down` cleans up.
    Remove,
}

impl Fault {
    /// The fault kinds a timeline may name, for error messages.
    pub(crate) const KINDS: &'static str = "down up blackhole restore drop undrop remove rate=RATE";

    /// Parse a fault kind as timelines and `testbed fault` write it.
    pub(crate) fn parse(kind: &str) -> Option<Self> {
        Some(match kind {
            "down" => Self::Down,
            "up" => Self::Up,
            "blackhole" => Self::Blackhole,
            "restore" => Self::Restore,
            "drop" => Self::Drop,
            "undrop" => Self::Undrop,
            "remove" => Self::Remove,
            k => Self::Rate(k.strip_prefix("rate=").filter(|r| !r.is_empty())?.to_owned()),
        })
    }

    /// The kind as [`Fault::parse`] reads it.
    pub(crate) fn name(&self) -> String {
        match self {
            Self::Down => "down".into(),
            Self::Up => "up".into(),
            Self::Blackhole => "blackhole".into(),
            Self::Restore => "restore".into(),
            Self::Drop => "drop".into(),
            Self::Undrop => "undrop".into(),
            Self::Remove => "remove".into(),
            Self::Rate(r) => format!("rate={r}"),
        }
    }
}

/// Apply `fault` to NIC `nic` of node `node`.
pub(crate) fn fault(spec: &Spec, node: u32, nic: u32, fault: &Fault) -> Result<()> {
    let ns = spec.node_ns(node);
    let sw = spec.switch_ns();
    let dev = format!("rail{nic}");
    let port = Spec::port(node, nic);
    match fault {
        Fault::Down => ip_in(&ns, &["link", "set", &dev, "down"]).map(drop),
        Fault::Up => ip_in(&ns, &["link", "set", &dev, "up"]).map(drop),
        Fault::Blackhole => {
            run(&["ip", "netns", "exec", &sw, "bridge", "link", "set", "dev", &port, "state", "0"]).map(drop)
        }
        Fault::Restore => {
            run(&["ip", "netns", "exec", &sw, "bridge", "link", "set", "dev", &port, "state", "3"]).map(drop)
        }
        Fault::Drop => {
            run(&["tc", "-n", &ns, "qdisc", "replace", "dev", &dev, "root", "pfifo", "limit", "0"]).map(drop)
        }
        Fault::Undrop => {
            run(&["tc", "-n", &ns, "qdisc", "del", "dev", &dev, "root"])?;
            shape(&ns, &dev, &spec.rate)
        }
        Fault::Rate(rate) => {
            let r = Some(rate.clone());
            shape(&ns, &dev, &r)?;
            shape(&sw, &port, &r)
        }
        Fault::Remove => ip_in(&ns, &["link", "del", &dev]).map(drop),
    }
}

/// Whether TCP from `from_ns` reaches `addr` (a refused connection counts as reachable),
/// decided within `timeout_s` seconds.
pub(crate) fn reachable(from_ns: &str, addr: &str, timeout_s: u32) -> bool {
    let script = format!("exec 3<>/dev/tcp/{addr}/9");
    let t = timeout_s.to_string();
    match in_ns(from_ns, &["timeout", &t, "bash", "-c", &script]) {
        Ok(_) => true,
        Err(e) => e.to_string().contains("refused"),
    }
}

/// `cargo xtask testbed <up|down|status|fault> [options]`.
pub(crate) fn main(args: &[String]) -> Result<()> {
    let mut spec = Spec::default();
    let mut rest: Vec<&str> = Vec::new();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().cloned().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--nodes" => spec.nodes = value("--nodes")?.parse().context("--nodes: not a number")?,
            "--nics" => spec.nics = value("--nics")?.parse().context("--nics: not a number")?,
            "--rate" => {
                let v = value("--rate")?;
                spec.rate = if v == "none" { None } else { Some(v) };
            }
            "--prefix" => spec.prefix = value("--prefix")?,
            other => rest.push(other),
        }
    }
    match args.first().map(String::as_str) {
        Some("up") => {
            up(&spec)?;
            crate::say(&format!(
                "testbed up: {} nodes x {} NICs (rate {}), namespaces {}-n0..{}-n{}, switch {}\n{}",
                spec.nodes,
                spec.nics,
                spec.rate.as_deref().unwrap_or("unshaped"),
                spec.prefix,
                spec.prefix,
                spec.nodes - 1,
                spec.switch_ns(),
                status(&spec.prefix)?
            ));
            Ok(())
        }
        Some("down") => {
            down(&spec.prefix)?;
            crate::say("testbed down");
            Ok(())
        }
        Some("status") => {
            crate::say(&status(&spec.prefix)?);
            Ok(())
        }
        Some("check") => {
            let mut bad = Vec::new();
            for a in 0..spec.nodes {
                for b in (0..spec.nodes).filter(|&b| b != a) {
                    let targets = (0..spec.nics).map(|r| (format!("rail{r}"), Spec::rail_addr(b, r)));
                    for (what, addr) in targets.chain([("mgmt".to_owned(), Spec::mgmt_addr(b))]) {
                        if !reachable(&spec.node_ns(a), &addr, 2) {
                            bad.push(format!("node{a} -> node{b} {what} ({addr})"));
                        }
                    }
                }
            }
            if bad.is_empty() {
                crate::say(&format!("testbed check: all {} nodes reach each other on every rail", spec.nodes));
                Ok(())
            } else {
                bail!("testbed check: unreachable: {}", bad.join(", "))
            }
        }
        Some("fault") => {
            let [node, nic, kind] = rest[..] else {
                bail!("usage: testbed fault NODE NIC KIND ({})", Fault::KINDS);
            };
            let f = Fault::parse(kind).with_context(|| format!("unknown fault `{kind}`; allowed: {}", Fault::KINDS))?;
            fault(&spec, node.parse().context("NODE")?, nic.parse().context("NIC")?, &f)
        }
        _ => bail!(
            "usage: cargo xtask testbed up [--nodes N] [--nics K] [--rate 1gbit|none] [--prefix P] | down | status | \
             check | fault NODE NIC KIND"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a real 3-node x 2-NIC testbed and checks reachability and each fault kind.
    /// Needs root; CI runs as root, so there it always runs for real.
    #[test]
    fn testbed_smoke() {
        if !crate::is_root() {
            eprintln!("SKIPPED testbed_smoke: not root; network namespaces need root (CI runs it as root)");
            return;
        }
        let spec = Spec {
            prefix: format!("r2ts{}", std::process::id() % 10_000),
            nodes: 3,
            nics: 2,
            rate: Some("1gbit".into()),
        };
        up(&spec).unwrap();
        let n0 = spec.node_ns(0);
        let result = std::panic::catch_unwind(|| {
            assert_eq!(namespaces(&spec.prefix).len(), 4);
            assert!(reachable(&n0, &Spec::rail_addr(1, 0), 2), "rail0 0->1");
            assert!(reachable(&n0, &Spec::rail_addr(2, 1), 2), "rail1 0->2");
            assert!(reachable(&n0, &Spec::mgmt_addr(2), 2), "mgmt 0->2");
            assert!(!reachable(&n0, &Spec::rail_addr(1, 1).replace("198.18.1", "198.18.9"), 1), "no route off-rail");
            fault(&spec, 1, 0, &Fault::Down).unwrap();
            assert!(!reachable(&n0, &Spec::rail_addr(1, 0), 1), "rail0 of node 1 down");
            assert!(reachable(&n0, &Spec::rail_addr(1, 1), 2), "rail1 of node 1 still up");
            fault(&spec, 1, 0, &Fault::Up).unwrap();
            fault(&spec, 2, 1, &Fault::Blackhole).unwrap();
            assert!(!reachable(&n0, &Spec::rail_addr(2, 1), 1), "black hole on node 2 rail1");
            assert!(status(&spec.prefix).unwrap().contains("rail1:UP"), "carrier stays up in a black hole");
            fault(&spec, 2, 1, &Fault::Restore).unwrap();
            fault(&spec, 0, 0, &Fault::Drop).unwrap();
            assert!(!reachable(&n0, &Spec::rail_addr(2, 0), 1), "egress drop on node 0 rail0");
            fault(&spec, 0, 0, &Fault::Undrop).unwrap();
            assert!(reachable(&n0, &Spec::rail_addr(1, 0), 3), "rail0 back after up");
            assert!(reachable(&n0, &Spec::rail_addr(2, 1), 3), "black hole restored");
            assert!(reachable(&n0, &Spec::rail_addr(2, 0), 3), "egress drop removed");
        });
        down(&spec.prefix).unwrap();
        down(&spec.prefix).unwrap();
        assert!(namespaces(&spec.prefix).is_empty(), "teardown is complete and idempotent");
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    }
}
