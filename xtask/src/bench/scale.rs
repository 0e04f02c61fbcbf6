//! The `scale` part of `cargo xtask bench`: small-message AllReduce latency as the world grows on
//! this host (4, 16 and 32 ranks, one `lo` NIC each), r2ccl beside OpenMPI and Gloo in the same
//! run, with r2ccl's init time and the OOB messages rank 0 sends per fault-free collective
//! (counted by the library, `Communicator::oob_messages_sent`; `r2ccl-perf --json` reports both).
//! `docs/control-plane.md` models the same counts at 1,024 and 16,384 ranks.
//!
//! Every program runs alone, its ranks oversubscribing the host's cores from 16 ranks on, so
//! the figures at 16 and 32 ranks measure each library's behaviour when ranks share cores as
//! much as its control plane.

use super::{
    build_peer, clean_env, have, opt, parse_peer, parse_perf_json, read, run_to_end, unmeasured, wait_all, Cmp, Ctx,
    End, Part, PartResult, PeerRow, Proc,
};
use anyhow::Result;
use serde_json::json;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The sizes measured (bytes per rank): 8 B and 4 KiB.
const SMALL: u64 = 8;
const MEDIUM: u64 = 4096;

/// One program at one world size.
#[derive(Clone, Debug, Default)]
struct Run {
    rows: Vec<PeerRow>,
    /// r2ccl only: rank 0's init time (ms) and OOB messages per timed call at 8 B.
    init_ms: Option<f64>,
    oob_per_call: Option<f64>,
}

impl Run {
    fn time_at(&self, size: u64) -> Option<f64> {
        self.rows.iter().find(|r| r.size == size).map(|r| r.time_us)
    }
}

/// r2ccl's rows (out of place), init time and OOB messages per call at 8 B from `r2ccl-perf --json`.
fn parse_r2ccl(text: &str) -> Result<Run> {
    let r = parse_perf_json(text)?;
    let oob = r.rows.iter().find(|x| x.bytes == SMALL).map(|x| x.oob_per_call);
    let rows = r.rows.iter().map(|x| PeerRow { size: x.bytes, time_us: x.time_us, busbw: x.busbw, wrong: x.wrong });
    Ok(Run { rows: rows.collect(), init_ms: r.init_ms, oob_per_call: oob })
}

pub(super) fn part_scale(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::Scale;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let root = crate::workspace_root();
    let worlds: &[u32] = if ctx.quick { &[4, 8] } else { &[4, 16, 32] };
    let (iters, warm) = if ctx.quick { ("20", "5") } else { ("200", "20") };
    let sweep: Vec<String> =
        ["-b", "8", "-e", "4K", "-f", "512", "-n", iters, "-w", warm].iter().map(ToString::to_string).collect();
    let limit = Duration::from_secs(if ctx.quick { 120 } else { 300 });
    let mut notes = Vec::new();

    let mpi_exe = ctx.out.join("mpi_allreduce");
    let mpi = have("mpicc") && have("mpirun");
    if !mpi {
        notes.push("OpenMPI SKIPPED: mpicc/mpirun missing (Debian openmpi-bin libopenmpi-dev)".to_owned());
    } else if let Err(e) = build_peer(ctx, &logs, &root.join("bench/peers/mpi_allreduce.c"), &mpi_exe, "mpicc", &[]) {
        res.problems.push(format!("building the OpenMPI peer: {e:#}"));
    }
    let gloo_exe = ctx.out.join("gloo_allreduce");
    let gloo = have("g++") && Path::new("/usr/include/gloo/allreduce_ring_chunked.h").exists();
    if !gloo {
        notes.push("Gloo SKIPPED: g++ or /usr/include/gloo missing (Debian g++ libgloo-dev)".to_owned());
    } else if let Err(e) = build_peer(
        ctx,
        &logs,
        &root.join("bench/peers/gloo_allreduce.cc"),
        &gloo_exe,
        "g++",
        &["-std=c++17", "-lgloo", "-lpthread"],
    ) {
        res.problems.push(format!("building the Gloo peer: {e:#}"));
    }

    // (world, r2ccl, OpenMPI, Gloo)
    let mut runs: Vec<(u32, Run, Option<Run>, Option<Run>)> = Vec::new();
    for &n in worlds {
        let ns = n.to_string();
        // r2ccl: the caller's buffers, out of place (what a torch or MPI-style caller does).
        let json_path = logs.join(format!("r2ccl-{n}.json"));
        let _ = std::fs::remove_file(&json_path);
        let mut cmd = Command::new(&ctx.perf);
        cmd.args(["launch", "-n", &ns, "--nics", "1", "all_reduce"]).args(&sweep).args(["-c", "1", "--json"]);
        cmd.arg(&json_path);
        clean_env(&mut cmd);
        println!("bench: scale: r2ccl-perf launch -n {n} --nics 1 all_reduce {} -c 1", sweep.join(" "));
        if let Err(e) = run_to_end(cmd, &format!("r2ccl-{n}"), &logs, limit) {
            res.problems.push(format!("r2ccl at {n} ranks: {e:#}"));
        }
        let r2 = parse_r2ccl(&read(&json_path)).unwrap_or_else(|e| {
            res.problems.push(format!("r2ccl at {n} ranks: no results: {e:#}"));
            Run::default()
        });

        let mpi_run = (mpi && mpi_exe.exists()).then(|| {
            let mut cmd = Command::new("mpirun");
            cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", &ns])
                .args(["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"])
                // Ranks that share cores must yield while they wait, as r2ccl's and Gloo's do.
                .args(["--mca", "mpi_yield_when_idle", "1"])
                .arg(&mpi_exe)
                .args(&sweep);
            println!("bench: scale: OpenMPI at {n} ranks");
            let tag = format!("openmpi-{n}");
            let out = run_to_end(cmd, &tag, &logs, limit).unwrap_or_else(|e| {
                res.problems.push(format!("OpenMPI at {n} ranks: {e:#}"));
                read(&logs.join(format!("{tag}.out")))
            });
            Run { rows: parse_peer(&out), ..Run::default() }
        });

        let gloo_run = if gloo && gloo_exe.exists() {
            let store = ctx.out.join(format!("gloo-store-scale-{n}"));
            let _ = std::fs::remove_dir_all(&store);
            std::fs::create_dir_all(&store)?;
            let prefix = format!("r2s{}", SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis()));
            println!("bench: scale: Gloo at {n} ranks");
            let mut procs = Vec::new();
            for r in 0..n {
                let mut cmd = Command::new(&gloo_exe);
                cmd.args(&sweep).args(["-t", &limit.as_secs().to_string()]);
                cmd.env("RANK", r.to_string()).env("SIZE", &ns).env("STORE", &store).env("PREFIX", &prefix);
                procs.push(Proc::spawn(cmd, &format!("gloo-{n}.rank{r}"), &logs)?);
            }
            wait_all(&mut procs, Instant::now() + limit);
            for p in &procs {
                match p.end {
                    Some(e) if e.ok() => {}
                    Some(End::Killed) | None => res.problems.push(format!("Gloo at {n} ranks: {} hung", p.name)),
                    Some(e) => res.problems.push(format!("Gloo at {n} ranks: {} exited {}", p.name, e.describe())),
                }
            }
            Some(Run { rows: parse_peer(&procs[0].stdout()), ..Run::default() })
        } else {
            None
        };
        for (name, run) in [("r2ccl", Some(&r2)), ("OpenMPI", mpi_run.as_ref()), ("Gloo", gloo_run.as_ref())] {
            let wrong: u64 = run.map_or(0, |r| r.rows.iter().map(|x| x.wrong).sum());
            if wrong > 0 {
                res.problems.push(format!("{name} at {n} ranks: {wrong} wrong elements"));
            }
        }
        runs.push((n, r2, mpi_run, gloo_run));
    }

    // Table and targets.
    let best = |m: &Option<Run>, g: &Option<Run>, size: u64| -> Option<f64> {
        [m, g].into_iter().flatten().filter_map(|r| r.time_at(size)).filter(|t| t.is_finite()).reduce(f64::min)
    };
    let mut table = String::from(
        "| ranks | r2ccl 8 B (us) | OpenMPI 8 B | Gloo 8 B | r2ccl / best (8 B) | r2ccl 4 KiB (us) | OpenMPI 4 KiB | Gloo 4 KiB | r2ccl / best (4 KiB) | r2ccl init (ms) | r2ccl OOB messages per collective (rank 0) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut ratio8 = Vec::new();
    for (n, r2, m, g) in &runs {
        let cell = |r: &Option<Run>, s| opt(r.as_ref().and_then(|x| x.time_at(s)), 1);
        let ratio = |s| r2.time_at(s).zip(best(m, g, s)).map(|(a, b)| a / b);
        ratio8.push((*n, ratio(SMALL), r2.time_at(SMALL), best(m, g, SMALL)));
        let _ = writeln!(
            table,
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            opt(r2.time_at(SMALL), 1),
            cell(m, SMALL),
            cell(g, SMALL),
            opt(ratio(SMALL), 2),
            opt(r2.time_at(MEDIUM), 1),
            cell(m, MEDIUM),
            cell(g, MEDIUM),
            opt(ratio(MEDIUM), 2),
            opt(r2.init_ms, 0),
            opt(r2.oob_per_call, 2),
        );
    }
    let mut t = unmeasured(part, "");
    for (target, world) in t.iter_mut().zip([worlds[0], *worlds.last().unwrap_or(&4)]) {
        if let Some((n, ratio, mine, theirs)) = ratio8.iter().find(|x| x.0 == world) {
            target.value = *ratio;
            target.detail =
                format!("{n} ranks: r2ccl {} us vs best peer {} us (lower is better)", opt(*mine, 1), opt(*theirs, 1));
        }
    }
    if let Some(target) = t.get_mut(2) {
        let oob: Vec<String> =
            runs.iter().map(|(n, r2, _, _)| format!("{n} ranks: {}", opt(r2.oob_per_call, 2))).collect();
        target.value = runs.first().and_then(|(_, r2, _, _)| r2.oob_per_call);
        target.detail = oob.join(", ");
    }
    res.targets = t;
    res.md = format!(
        "float32 sum AllReduce, 8 B and 4 KiB, {iters} iters + {warm} warm-up, every rank on this host ({} cores: oversubscribed from 16 ranks on); r2ccl: `r2ccl-perf launch -n N --nics 1 all_reduce -b 8 -e 4K -f 512 -c 1` (the caller's buffers, out of place); OpenMPI: `mpirun --oversubscribe --mca pml ob1 --mca btl tcp,self --mca mpi_yield_when_idle 1` (out of place); Gloo: AllreduceRingChunked, TCP on 127.0.0.1 (in place). Time is the slowest rank's average. Init: rank 0's `init` until every rank joined. OOB messages: every channel but the timed heartbeat, per timed 8 B call.\n\n{}{table}",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        notes.iter().map(|n| format!("- **{n}**\n")).collect::<String>()
    );
    res.json = json!({
        "worlds": worlds,
        "notes": notes,
        "runs": runs.iter().map(|(n, r2, m, g)| json!({
            "ranks": n,
            "r2ccl": {"time_us_8": r2.time_at(SMALL), "time_us_4k": r2.time_at(MEDIUM), "init_ms": r2.init_ms, "oob_per_call": r2.oob_per_call},
            "openmpi": m.as_ref().map(|r| json!({"time_us_8": r.time_at(SMALL), "time_us_4k": r.time_at(MEDIUM)})),
            "gloo": g.as_ref().map(|r| json!({"time_us_8": r.time_at(SMALL), "time_us_4k": r.time_at(MEDIUM)})),
        })).collect::<Vec<_>>(),
    });
    Ok(res)
}

/// The part's targets (`Cmp` decides how each is judged).
pub(super) fn targets(t: impl Fn(&'static str, &'static str, f64, Cmp) -> super::Target) -> Vec<super::Target> {
    vec![
        t("scale_8b_latency_ratio_4", "8 B AllReduce, 4 ranks: r2ccl time / best of OpenMPI, Gloo", 1.0, Cmp::AtMost),
        t(
            "scale_8b_latency_ratio_max",
            "8 B AllReduce, the most ranks measured (32): r2ccl time / best of OpenMPI, Gloo",
            1.5,
            Cmp::AtMost,
        ),
        t(
            "scale_oob_per_collective",
            "OOB messages rank 0 sends per fault-free 8 B AllReduce (4 ranks)",
            0.0,
            Cmp::Info,
        ),
    ]
}
