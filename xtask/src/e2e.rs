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

mod chaos;
mod judge;
mod run;
mod scenario;
use chaos::*;
use judge::*;
use run::*;
use scenario::*;

/// Prefix of the e2e testbed (distinct from the interactive `r2t`).
const PREFIX: &str = "r2e";
/// Rendezvous port of rank 0 on its management address.
const PORT: u16 = 29_411;

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
    let (mut passed, mut failed, mut skipped) = (0u32, 0u32, 0u32);
    let mut tally = ChaosTally::default();
    let mut flaky: Vec<String> = Vec::new();
    for sc in &scenarios {
        let logs = root.join("target/e2e").join(&sc.name);
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
        let predicted = match sc.degraded.filter(|_| !loopback).map(|_| predicted_ratio(sc)).transpose() {
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
