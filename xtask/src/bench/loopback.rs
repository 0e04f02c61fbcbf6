//! Part 4, `loopback`: r2ccl against OpenMPI and Gloo on this host.

#[allow(clippy::wildcard_imports, reason = "a part of bench.rs, split by part: its helpers are the parent's")]
use super::*;

/// Compile a peer program unless the binary is newer than its source.
pub(super) fn build_peer(ctx: &Ctx, logs: &Path, src: &Path, exe: &Path, compiler: &str, flags: &[&str]) -> Result<()> {
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

pub(super) fn part_loopback(ctx: &Ctx) -> Result<PartResult> {
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
            Ok(PerfReport { rows, .. }) => {
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
