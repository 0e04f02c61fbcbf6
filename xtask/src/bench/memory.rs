//! The `memory` part of `cargo xtask bench`: physical memory per rank of a 64 MiB and a 256 MiB
//! float32 AllReduce, 4 ranks on loopback, r2ccl (the caller's buffers, and `-R 1` buffers
//! registered with the communicator) beside OpenMPI and Gloo in the same run.
//!
//! Each program runs alone; every 100 ms the part reads `/proc/PID/smaps_rollup` (PSS, and its
//! memory-file part) and `/proc/PID/status` (`VmHWM`, the peak RSS so far) of every rank. A rank
//! is a process of the program's name in the process group the part started. Reported per
//! program: the largest PSS of any rank, its memory-file part, the largest peak RSS (the last
//! sample before each rank exited), the buffers the program itself holds, and PSS less those
//! buffers (the library's memory, with the process's own code and heap). The bus bandwidth of
//! the same runs sits beside, so a memory saving that costs bandwidth shows.

use super::{build_peer, clean_env, have, opt, parse_peer, read, sig, unmeasured, Ctx, Part, PartResult, Proc, Target};
use anyhow::Result;
use serde_json::json;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The sizes measured (bytes per rank).
const SIZES: [u64; 2] = [64 << 20, 256 << 20];
/// The most library memory per rank the 256 MiB target allows, MiB.
const LIBRARY_LIMIT_MIB: f64 = 64.0;

/// What the samples of one program's ranks showed, KiB.
#[derive(Clone, Copy, Debug, Default)]
struct Mem {
    pss: u64,
    pss_shmem: u64,
    peak_rss: u64,
    ranks: usize,
}

/// One program's run at one size.
struct Row {
    program: &'static str,
    size: u64,
    mem: Mem,
    /// Bytes of buffers the program holds, as multiples of the size.
    buffers: f64,
    /// What the buffers are.
    buffers_what: &'static str,
    busbw: Option<f64>,
}

impl Row {
    fn library_mib(&self) -> f64 {
        self.mem.pss as f64 / 1024.0 - self.buffers * self.size as f64 / f64::from(1u32 << 20)
    }
}

/// A `key: N kB` field of a `/proc` file.
fn field_kib(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.trim().strip_suffix("kB")?.trim().parse().ok())
}

/// The processes named `comm` that `leader` started: its children, and the members of its
/// process group (`leader` itself when `itself`). mpirun puts each rank in a group of its own.
fn ranks(leader: u32, comm: &str, itself: bool) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| itself || pid != leader)
        .filter(|&pid| {
            let stat = read(Path::new(&format!("/proc/{pid}/stat")));
            // "pid (comm) state ppid pgrp ...": the name may hold spaces, so split at the last ')'.
            let Some((head, tail)) = stat.rsplit_once(')') else { return false };
            let name = head.split_once('(').map_or("", |(_, n)| n);
            let mut f = tail.split_whitespace().skip(1).map(|f| f.parse::<u32>().ok());
            let (ppid, pgrp) = (f.next().flatten(), f.next().flatten());
            name == comm && (ppid == Some(leader) || pgrp == Some(leader))
        })
        .collect()
}

/// Sample the ranks of `groups` (process group, rank name, whether the leader is a rank) until
/// every process of `procs` has ended or `limit` has passed.
fn sample(procs: &mut [Proc], groups: &[(u32, &str, bool)], limit: Duration) -> Mem {
    let deadline = Instant::now() + limit;
    let mut seen: std::collections::HashMap<u32, (u64, u64, u64)> = std::collections::HashMap::new();
    loop {
        for &(pgid, comm, leader) in groups {
            for pid in ranks(pgid, comm, leader) {
                let rollup = read(Path::new(&format!("/proc/{pid}/smaps_rollup")));
                let status = read(Path::new(&format!("/proc/{pid}/status")));
                let e = seen.entry(pid).or_default();
                if let Some(pss) = field_kib(&rollup, "Pss:") {
                    if pss > e.0 {
                        e.0 = pss;
                        e.1 = field_kib(&rollup, "Pss_Shmem:").unwrap_or(0);
                    }
                }
                if let Some(hwm) = field_kib(&status, "VmHWM:") {
                    e.2 = e.2.max(hwm);
                }
            }
        }
        let mut all = true;
        for p in procs.iter_mut() {
            all &= p.poll();
        }
        if all || Instant::now() >= deadline {
            for p in procs.iter_mut() {
                p.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let top = seen.values().max_by_key(|v| v.0).copied().unwrap_or_default();
    Mem { pss: top.0, pss_shmem: top.1, peak_rss: seen.values().map(|v| v.2).max().unwrap_or(0), ranks: seen.len() }
}

pub(super) fn part_memory(ctx: &Ctx) -> Result<PartResult> {
    let part = Part::Memory;
    let mut res = PartResult::new(part);
    let logs = ctx.logs(part)?;
    let limit = Duration::from_secs(240);
    let mut rows: Vec<Row> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let iters = |size: u64| if size > 64 << 20 { "4" } else { "10" };
    let duration = |size: u64| if size > 64 << 20 { "8" } else { "5" };
    // The peers, as the loopback part builds them.
    let root = crate::workspace_root();
    let mpi_exe = ctx.out.join("mpi_allreduce");
    if have("mpicc") {
        let src = root.join("bench/peers/mpi_allreduce.c");
        if let Err(e) = build_peer(ctx, &logs, &src, &mpi_exe, "mpicc", &[]) {
            res.problems.push(format!("building the OpenMPI peer: {e:#}"));
        }
    }
    let gloo_exe = ctx.out.join("gloo_allreduce");
    if have("g++") && Path::new("/usr/include/gloo/allreduce_ring_chunked.h").exists() {
        let src = root.join("bench/peers/gloo_allreduce.cc");
        if let Err(e) = build_peer(ctx, &logs, &src, &gloo_exe, "g++", &["-std=c++17", "-lgloo", "-lpthread"]) {
            res.problems.push(format!("building the Gloo peer: {e:#}"));
        }
    }
    for size in SIZES {
        let s = format!("{}M", size >> 20);
        let sweep = ["-b", &s, "-e", &s, "-n", iters(size), "-w", "1"];
        // r2ccl: caller buffers, then registered, out of place (the timeline mode: its only
        // buffers are the case's), no result check (its expected result would be one more).
        // Also the caller's buffers run whole (`transport.host_segment_bytes = 0`): what the
        // segments save, and what they cost in bandwidth, side by side.
        for (program, registered) in [("r2ccl", false), ("r2ccl whole", false), ("r2ccl -R 1", true)] {
            let mut cmd = Command::new(&ctx.perf);
            cmd.args(["launch", "-n", "4", "--nics", "2", "all_reduce", "-b", &s, "-e", &s, "-c", "0"]).args([
                "-N",
                "0",
                "--duration",
                duration(size),
            ]);
            if registered {
                cmd.args(["-R", "1"]);
            }
            clean_env(&mut cmd);
            if program.ends_with("whole") {
                cmd.env("R2CCL_TRANSPORT__HOST_SEGMENT_BYTES", "0");
            }
            println!("bench: memory: {program} {s}");
            let mut p = [Proc::spawn(cmd, &format!("{}-{s}", program.replace(' ', "")), &logs)?];
            let pgid = p[0].child.id();
            let mem = sample(&mut p, &[(pgid, "r2ccl-perf", false)], limit);
            check_end(&mut res, program, &p);
            let busbw = p[0].stdout().lines().find_map(|l| {
                l.strip_prefix("# Avg bus bandwidth")?.trim_start().strip_prefix(':')?.trim().parse::<f64>().ok()
            });
            let (buffers, what) = if registered {
                (3.0, "two registered buffers, and r2ccl-perf's copy of the input")
            } else {
                (2.0, "input and output")
            };
            rows.push(Row { program, size, mem, buffers, buffers_what: what, busbw });
        }
        // OpenMPI over TCP on loopback, out of place.
        if have("mpirun") && mpi_exe.exists() {
            let mut cmd = Command::new("mpirun");
            cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
                .args(["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"])
                .arg(&mpi_exe)
                .args(sweep);
            println!("bench: memory: OpenMPI {s}");
            let mut p = [Proc::spawn(cmd, &format!("openmpi-{s}"), &logs)?];
            let pgid = p[0].child.id();
            let mem = sample(&mut p, &[(pgid, "mpi_allreduce", false)], limit);
            check_end(&mut res, "OpenMPI", &p);
            let busbw = parse_peer(&p[0].stdout()).first().map(|r| r.busbw);
            rows.push(Row { program: "OpenMPI", size, mem, buffers: 2.0, buffers_what: "send and receive", busbw });
        } else if size == SIZES[0] {
            notes.push("OpenMPI SKIPPED: mpicc or mpirun missing (Debian openmpi-bin libopenmpi-dev)".into());
        }
        // Gloo's chunked ring, in place on one buffer.
        if gloo_exe.exists() {
            let store = ctx.out.join("gloo-store-memory");
            let _ = std::fs::remove_dir_all(&store);
            std::fs::create_dir_all(&store)?;
            let prefix = format!("r2bm{}", super::unix_now());
            println!("bench: memory: Gloo {s}");
            let mut procs = Vec::new();
            for r in 0..4 {
                let mut cmd = Command::new(&gloo_exe);
                cmd.args(sweep).args(["-t", "200"]);
                cmd.env("RANK", r.to_string()).env("SIZE", "4").env("STORE", &store).env("PREFIX", &prefix);
                procs.push(Proc::spawn(cmd, &format!("gloo-{s}.rank{r}"), &logs)?);
            }
            let groups: Vec<(u32, &str, bool)> = procs.iter().map(|p| (p.child.id(), "gloo_allreduce", true)).collect();
            let mem = sample(&mut procs, &groups, limit);
            check_end(&mut res, "Gloo", &procs);
            let busbw = parse_peer(&procs[0].stdout()).first().map(|r| r.busbw);
            rows.push(Row { program: "Gloo", size, mem, buffers: 1.0, buffers_what: "one buffer (in place)", busbw });
        } else if size == SIZES[0] {
            notes.push("Gloo SKIPPED: g++ or /usr/include/gloo missing (Debian g++ libgloo-dev)".into());
        }
    }
    for r in &rows {
        if r.mem.ranks < 4 {
            res.problems.push(format!("{} at {} MiB: sampled {} ranks, not 4", r.program, r.size >> 20, r.mem.ranks));
        }
    }

    let mut table = String::from(
        "| program | size | PSS per rank (MiB) | of it memory files | peak RSS (MiB) | buffers the program holds | PSS - buffers (MiB) | busbw (GB/s) |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        let _ = writeln!(
            table,
            "| {} | {} MiB | {:.0} | {:.0} | {:.0} | {:.0} MiB: {} | {:.0} | {} |",
            r.program,
            r.size >> 20,
            r.mem.pss as f64 / 1024.0,
            r.mem.pss_shmem as f64 / 1024.0,
            r.mem.peak_rss as f64 / 1024.0,
            r.buffers * (r.size >> 20) as f64,
            r.buffers_what,
            r.library_mib(),
            r.busbw.map_or_else(|| "-".into(), sig),
        );
    }
    let at = |program: &str| rows.iter().find(|r| r.program == program && r.size == SIZES[1]);
    let mut t: Vec<Target> = unmeasured(part, "");
    for (target, program) in t.iter_mut().zip(["r2ccl", "r2ccl -R 1"]) {
        if let Some(r) = at(program) {
            target.value = Some(r.library_mib());
            target.detail = format!(
                "PSS {:.0} MiB per rank less {:.0} MiB of buffers; Gloo {} MiB, OpenMPI {} MiB the same way",
                r.mem.pss as f64 / 1024.0,
                r.buffers * (r.size >> 20) as f64,
                opt(at("Gloo").map(Row::library_mib), 0),
                opt(at("OpenMPI").map(Row::library_mib), 0),
            );
        }
    }
    res.targets = t;
    res.md = format!(
        "4 ranks on this host, float32 sum AllReduce, each program alone, sampled every 100 ms: PSS from `/proc/PID/smaps_rollup` (the largest of any rank; memory files are the library's registered regions), peak RSS from `VmHWM` (RSS counts a memory file once per mapping, so r2ccl's regions twice: docs/memory.md). r2ccl: `r2ccl-perf launch -n 4 --nics 2 all_reduce -b S -e S -c 0 -N 0 --duration D` (out of place, back to back for D s; no result check), `r2ccl whole` the same with `R2CCL_TRANSPORT__HOST_SEGMENT_BYTES=0` (no segments: a workspace as large as the output), and with `-R 1` on registered buffers; OpenMPI: `mpirun --mca pml ob1 --mca btl tcp,self` (out of place); Gloo: AllreduceRingChunked (in place). `PSS - buffers` is the library's memory with the process's code, heap and UCX; the target is at most {LIBRARY_LIMIT_MIB} MiB at 256 MiB.\n\n{}{table}",
        notes.iter().map(|n| format!("- **{n}**\n")).collect::<String>()
    );
    res.json = json!({
        "rows": rows.iter().map(|r| json!({
            "program": r.program, "bytes": r.size, "pss_kib": r.mem.pss, "pss_shmem_kib": r.mem.pss_shmem,
            "peak_rss_kib": r.mem.peak_rss, "ranks": r.mem.ranks, "buffers_bytes": r.buffers * r.size as f64,
            "library_mib": r.library_mib(), "busbw": r.busbw,
        })).collect::<Vec<_>>(),
    });
    Ok(res)
}

/// Note a program that did not exit cleanly.
fn check_end(res: &mut PartResult, program: &str, procs: &[Proc]) {
    for p in procs {
        match p.end {
            Some(e) if e.ok() => {}
            Some(e) => res.problems.push(format!("{program}: {} ended {}", p.name, e.describe())),
            None => res.problems.push(format!("{program}: {} did not end", p.name)),
        }
    }
}

/// The targets of this part.
pub(super) fn targets(t: impl Fn(&'static str, &'static str, f64, super::Cmp) -> Target) -> Vec<Target> {
    vec![
        t(
            "memory_256m_library_mib",
            "256 MiB AllReduce, caller buffers: PSS per rank - buffers (MiB)",
            LIBRARY_LIMIT_MIB,
            super::Cmp::AtMost,
        ),
        t(
            "memory_256m_registered_library_mib",
            "256 MiB AllReduce, registered buffers: PSS per rank - buffers (MiB)",
            LIBRARY_LIMIT_MIB,
            super::Cmp::AtMost,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_fields_are_read_in_kib() {
        let text = "Rss:              123 kB\nPss:               99 kB\nPss_Shmem:         7 kB\n";
        assert_eq!(field_kib(text, "Pss:"), Some(99));
        assert_eq!(field_kib(text, "Pss_Shmem:"), Some(7));
        assert_eq!(field_kib(text, "VmHWM:"), None);
    }

    #[test]
    fn this_process_is_found_in_its_group() {
        let me = std::process::id();
        let stat = read(Path::new("/proc/self/stat"));
        let (head, tail) = stat.rsplit_once(')').unwrap_or_default();
        let comm = head.split_once('(').map_or("", |(_, n)| n);
        let pgrp: u32 = tail.split_whitespace().nth(2).and_then(|f| f.parse().ok()).unwrap_or(0);
        assert!(ranks(pgrp, comm, true).contains(&me), "pid {me} comm {comm} pgrp {pgrp}");
    }
}
