//! A small namespace testbed for the UCX tests and benches, after `cargo xtask testbed`'s conventions:
//! node `i` is namespace `<prefix>-n<i>` with veth NICs `rail<r>` (198.18.r.(i+1)/24); their peers
//! `n<i>r<r>` sit on bridge `br<r>` in the switch namespace `<prefix>-sw`; optional tbf shaping on both
//! directions. Torn down on drop, always (and any leftover with the same prefix at setup).

use std::process::Command;

/// Whether this process runs as root (namespaces need it).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Run a command; panic with its stderr on failure.
pub fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
}

/// MTU of every rail (both veth ends; the bridges follow their ports). Jumbo frames, as data
/// centre fabrics run: at 1500 the per-packet cost of the veth/bridge/tbf path saturates this
/// 2-core machine near 150-200 MB/s in all (2 NICs at 1gbit reached 0.64 of their rates, 4 NICs
/// 0.48; at 9000: 0.97 and 0.96), and TCP payload can fill at most 1448/1514 of a shaped rate.
pub const MTU: &str = "9000";

/// A testbed of namespaces; deleted on drop.
pub struct Testbed {
    /// Name prefix.
    pub prefix: String,
    /// Nodes.
    pub nodes: u32,
    /// NICs per node.
    pub nics: u32,
}

impl Testbed {
    /// Build `nodes` x `nics`, shaped to `rate` (tbf, e.g. `1gbit`) when given.
    pub fn up(tag: &str, nodes: u32, nics: u32, rate: Option<&str>) -> Self {
        let prefix = format!("r2u{tag}{}", std::process::id() % 10000);
        let tb = Self { prefix, nodes, nics };
        tb.delete();
        let sw = tb.switch_ns();
        sh(&["ip", "netns", "add", &sw]);
        for r in 0..nics {
            let br = format!("br{r}");
            sh(&["ip", "-n", &sw, "link", "add", &br, "type", "bridge"]);
            sh(&["ip", "-n", &sw, "link", "set", &br, "up"]);
        }
        for i in 0..nodes {
            let ns = tb.node_ns(i);
            sh(&["ip", "netns", "add", &ns]);
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
            for r in 0..nics {
                let (nic, port) = (format!("rail{r}"), Self::port(i, r));
                sh(&["ip", "-n", &ns, "link", "add", &nic, "type", "veth", "peer", "name", &port, "netns", &sw]);
                sh(&["ip", "-n", &ns, "link", "set", &nic, "mtu", MTU]);
                sh(&["ip", "-n", &sw, "link", "set", &port, "mtu", MTU]);
                sh(&["ip", "-n", &ns, "addr", "add", &format!("198.18.{r}.{}/24", i + 1), "dev", &nic]);
                sh(&["ip", "-n", &ns, "link", "set", &nic, "up"]);
                sh(&["ip", "-n", &sw, "link", "set", &port, "master", &format!("br{r}")]);
                sh(&["ip", "-n", &sw, "link", "set", &port, "up"]);
                if let Some(rate) = rate {
                    for (n, d) in [(&ns, &nic), (&sw, &port)] {
                        sh(&[
                            "tc", "-n", n, "qdisc", "replace", "dev", d, "root", "tbf", "rate", rate, "burst", "64kb",
                            "latency", "50ms",
                        ]);
                    }
                }
            }
        }
        tb
    }

    /// Namespace of node `i`.
    pub fn node_ns(&self, i: u32) -> String {
        format!("{}-n{i}", self.prefix)
    }

    /// The switch namespace.
    pub fn switch_ns(&self) -> String {
        format!("{}-sw", self.prefix)
    }

    /// Switch port of node `i`'s NIC `r`.
    pub fn port(i: u32, r: u32) -> String {
        format!("n{i}r{r}")
    }

    /// The NIC names of a node.
    pub fn devices(&self) -> Vec<String> {
        (0..self.nics).map(|r| format!("rail{r}")).collect()
    }

    /// A command running this binary inside node `i`'s namespace.
    pub fn cmd(&self, i: u32) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.node_ns(i)]).arg(std::env::current_exe().unwrap());
        c
    }

    /// `ip link set rail<r> up|down` in node `i`.
    pub fn link(&self, i: u32, r: u32, up: bool) {
        sh(&["ip", "-n", &self.node_ns(i), "link", "set", &format!("rail{r}"), if up { "up" } else { "down" }]);
    }

    /// Black hole (state 0, disabled) or restore (state 3, forwarding) node `i`'s switch port on rail `r`.
    pub fn blackhole(&self, i: u32, r: u32, on: bool) {
        let port = Self::port(i, r);
        sh(&[
            "ip",
            "netns",
            "exec",
            &self.switch_ns(),
            "bridge",
            "link",
            "set",
            "dev",
            &port,
            "state",
            if on { "0" } else { "3" },
        ]);
    }

    fn delete(&self) {
        let out = Command::new("ip").args(["netns", "list"]).output().map(|o| o.stdout).unwrap_or_default();
        for line in String::from_utf8_lossy(&out).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if name.starts_with(&format!("{}-", self.prefix)) {
                let _ = Command::new("ip").args(["netns", "del", name]).status();
            }
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.delete();
    }
}
