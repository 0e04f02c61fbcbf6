//! Running a scenario: the testbed guard, the ranks (direct, mpirun or loopback), their
//! deadlines and hang evidence.

#[allow(clippy::wildcard_imports, reason = "a part of e2e.rs: its helpers are the parent's")]
use super::*;

/// splitmix64: a tiny deterministic generator for the seeded fault jitter.
pub(super) fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fault times shifted by the seed (seed 0: unchanged); never before 0.1 s nor before the previous fault.
pub(super) fn jittered(steps: &[Step], seed: u64) -> Vec<Step> {
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
pub(super) fn secret() -> Result<String> {
    let mut b = [0u8; 16];
    File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).context("reading /dev/urandom")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Kills leftover ranks and tears the testbed down (if any) when dropped (normal end, error or panic).
pub(super) struct Guard {
    pub(super) prefix: Option<String>,
    pub(super) children: Vec<Child>,
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
pub(super) enum End {
    Exited(ExitStatus),
    Hung,
}

/// What one scenario run produced.
pub(super) struct Outcome {
    pub(super) ends: Vec<End>,
    pub(super) rank0_out: String,
    /// Every rank's stdout (rank 0's too).
    pub(super) outs: Vec<String>,
    pub(super) errs: Vec<String>,
    pub(super) fault_errors: Vec<String>,
    pub(super) applied: Vec<String>,
}

pub(super) fn read(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

pub(super) fn execute(sc: &Scenario, exe: &Path, logs: &Path, seed: u64) -> Result<Outcome> {
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
pub(super) fn wait_ranks(
    children: &mut [Child],
    deadline: Instant,
    logs: &Path,
    on_deadline: impl FnOnce(),
) -> Result<Vec<End>> {
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
pub(super) fn software_faults(sc: &Scenario) -> std::result::Result<Vec<String>, String> {
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
pub(super) fn low_free_port() -> Result<u16> {
    let start = std::process::id().wrapping_mul(7919) % 20_000;
    (0..20_000u32)
        .map(|i| 10_000 + ((start + i) % 20_000) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .context("no free loopback port in 10000-29999")
}

/// The loopback fallback of [`execute`]: every rank on this host over `lo` (as many NICs as the
/// scenario's nodes have), the faults injected in software (`R2CCL_FAULT`, [`software_faults`]).
pub(super) fn execute_loopback(sc: &Scenario, exe: &Path, logs: &Path, faults: &[String]) -> Result<Outcome> {
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

/// Starts every rank of `sc` with one `mpirun -np NODES` (OpenMPI). Each rank runs a small shell
/// wrapper that enters namespace `<prefix>-n$OMPI_COMM_WORLD_RANK`, names its node after its
/// rank, and records its pid and exit status in `logs/rank<R>.{pid,rc}` (its output goes to
/// `rank<R>.{out,err}` as with the direct launcher). The rank and world size come from
/// OpenMPI's environment (`OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`), as in a real job.
pub(super) fn launch_mpirun(
    sc: &Scenario,
    exe: &Path,
    logs: &Path,
    root: &str,
    secret: &str,
    nics: &[String],
) -> Result<Child> {
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
pub(super) fn dump_stacks(pid: u32, path: &Path) {
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
pub(super) fn print_hang_evidence(name: &str, logs: &Path) {
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
