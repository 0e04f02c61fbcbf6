//! Multi-process runs of r2ccl-perf over UCX on loopback: every collective and data type,
//! software-injected NIC failures (down and black hole) at seeded random points, strangers on
//! every listening port, and bounded errors.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn perf(args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let start = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_r2ccl-perf"));
    cmd.args(args).env("R2CCL_DEBUG", "ERROR");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (out, start.elapsed())
}

fn text(o: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn every_collective_is_exact_on_four_ranks() {
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"] {
        let (o, _) = perf(
            &[
                "launch", "-n", "4", "--nics", "2", coll, "-b", "4K", "-e", "256K", "-f", "8", "-n", "2", "-w", "1",
                "-r", "1",
            ],
            &[],
        );
        let t = text(&o);
        assert!(o.status.success(), "{coll}: {t}");
        assert!(t.contains("# Out of bounds values : 0 OK"), "{coll}: {t}");
        // A fault-free job says nothing alarming, not even while its ranks leave one by one.
        assert!(!t.contains(" WARN ") && !t.contains(" ERROR "), "{coll}: warnings in a fault-free run: {t}");
    }
}

/// A small deterministic generator for fault points (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

#[test]
fn every_collective_and_dtype_survives_a_nic_failure_at_a_random_point() {
    // `TEST_SEED` picks other points; the seed is printed so a failure can be replayed.
    let seed: u64 = std::env::var("TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(2026);
    eprintln!("fault points from seed {seed} (set TEST_SEED to change)");
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let dtypes = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16"];
    let collectives = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"];
    for (i, coll) in collectives.iter().enumerate() {
        let dtype = dtypes[(i * 3 + rng.below(3) as usize) % dtypes.len()];
        let kind = ["down", "blackhole"][rng.below(2) as usize];
        // Each rank moves a few MiB per iteration: the fault lands in the first few iterations.
        let (rank, nic) = (rng.below(4), rng.below(2));
        let fault = format!("rank={rank},nic={nic},after_bytes={}K,kind={kind}", 256 + rng.below(6 * 1024));
        let args = [
            "launch", "-n", "4", "--nics", "2", "--fail", &fault, coll, "-b", "2M", "-e", "2M", "-n", "5", "-w", "1",
            "-d", dtype, "-r", "2",
        ];
        // WARN: every rank's fault and path-down lines reach the output (the check below).
        let (o, took) = perf(&args, &[("R2CCL_DEBUG", "WARN")]);
        let t = text(&o);
        eprintln!("{coll} {dtype} with {fault}: exit {:?} in {took:.1?}", o.status.code());
        assert!(o.status.success(), "{coll} {dtype} {fault} (seed {seed}): {t}");
        assert!(t.contains("# Out of bounds values : 0 OK"), "{coll} {dtype} {fault} (seed {seed}): {t}");
        // The fault fired and the job acted on it: rank 0 heard that the NIC went down (its
        // link, or a verdict blaming it) or saw one of its own paths fail, or a rank (every
        // rank logs to this output) took a path through that NIC down. A black hole between
        // two other ranks can be migrated around and the run end before a verdict reaches
        // rank 0, so rank 0's view alone is not enough.
        assert!(t.contains("R2CCL_FAULT fired"), "{coll} {dtype} {fault} (seed {seed}): the fault never fired: {t}");
        let nic_name = format!("node{rank}/nic{nic}");
        let seen = t.contains(&format!("NIC {nic_name} down"))
            || t.contains(" failed (")
            || t.lines().any(|l| l.contains("path down") && l.contains(&nic_name));
        assert!(seen, "{coll} {dtype} {fault} (seed {seed}): no failure reported: {t}");
    }
}

#[test]
fn every_dtype_and_op_is_exact() {
    let (o, _) = perf(
        &[
            "launch",
            "-n",
            "3",
            "--nics",
            "1",
            "all_reduce",
            "-b",
            "3K",
            "-e",
            "3K",
            "-n",
            "1",
            "-w",
            "0",
            "-d",
            "all",
            "-o",
            "all",
        ],
        &[],
    );
    let t = text(&o);
    assert!(o.status.success() && t.contains("# Out of bounds values : 0 OK"), "{t}");
    assert_eq!(t.lines().filter(|l| l.trim_start().starts_with("3072")).count(), 50, "10 types x 5 ops: {t}");
}

#[test]
fn nic_failure_mid_run_is_repaired_and_exact() {
    let (o, _) = perf(
        &[
            "launch",
            "-n",
            "4",
            "--nics",
            "2",
            "--fail",
            "rank=1,nic=0,after_bytes=8M,kind=down",
            "all_reduce",
            "-b",
            "4M",
            "-e",
            "4M",
            "-n",
            "6",
            "-w",
            "1",
        ],
        &[],
    );
    exact_across_node1_nic0_down(&o);
}

/// The timeline mode on registered buffers (`-R 1 -N 0`, what the testbed's strategies bench
/// runs): exact across a NIC failure. The check reads the registered output, zeroed before every
/// collective, so a run that left it unwritten would count wrong values.
#[test]
fn timeline_on_registered_buffers_is_exact_across_a_nic_failure() {
    let (o, _) = perf(
        &[
            "launch",
            "-n",
            "3",
            "--nics",
            "2",
            "--fail",
            "rank=1,nic=0,after_bytes=8M,kind=down",
            "all_reduce",
            "-b",
            "2M",
            "-e",
            "2M",
            "-R",
            "1",
            "-N",
            "0",
            "--duration",
            "3",
        ],
        &[],
    );
    exact_across_node1_nic0_down(&o);
}

/// The run succeeded with every value right, and rank 0 reported node 1's NIC 0 down.
fn exact_across_node1_nic0_down(o: &Output) {
    let t = text(o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
    assert!(t.contains("NIC node1/nic0 down"), "the failure is detected and reported to rank 0: {t}");
}

#[test]
fn bad_arguments_are_one_line_errors() {
    let (o, _) = perf(&["all_reduce", "-x", "1"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("unknown flag `-x`"));
    let (o, _) =
        perf(&["launch", "-n", "2", "all_reduce", "-n", "1", "-w", "0"], &[("R2CCL_FAULT", "nic=zero,kind=down")]);
    assert!(!o.status.success());
    assert!(text(&o).contains("R2CCL_FAULT"), "{}", text(&o));
}

#[test]
fn a_rank_without_peers_times_out_cleanly() {
    let (o, took) = perf(
        &["all_reduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"],
        &[
            ("R2CCL_RANK", "1"),
            ("R2CCL_WORLD_SIZE", "2"),
            ("R2CCL_ROOT", "127.0.0.1:9"),
            ("R2CCL_SECRET", "000102030405060708090a0b0c0d0e0f"),
            ("R2CCL_BOOTSTRAP__CONNECT_TIMEOUT_MS", "1500"),
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("bootstrap"), "{}", text(&o));
    assert!(took < Duration::from_secs(15), "bounded: {took:?}");
}

#[test]
fn a_killed_rank_gives_survivors_a_clean_bounded_error() {
    let (o, took) = perf(
        &[
            "launch",
            "-n",
            "3",
            "--nics",
            "1",
            "all_reduce",
            "-b",
            "64K",
            "-e",
            "64K",
            "-n",
            "200",
            "-w",
            "0",
            "--kill-rank",
            "2:5",
        ],
        &[],
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.matches("rank 2 is lost").count() >= 2, "both survivors name the lost rank: {t}");
    assert!(took < Duration::from_secs(30), "bounded: {took:?}");
}

#[test]
fn mismatched_counts_give_every_rank_an_error_naming_them() {
    let (o, took) = perf(
        &[
            "launch",
            "-n",
            "3",
            "--nics",
            "1",
            "all_reduce",
            "-b",
            "4K",
            "-e",
            "4K",
            "-n",
            "3",
            "-w",
            "0",
            "--skew-rank",
            "1",
        ],
        &[],
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.matches("collective arguments differ").count() >= 3, "every rank reports the mismatch: {t}");
    assert!(t.contains("count=1024") && t.contains("count=1027"), "the message names both counts: {t}");
    assert!(took < Duration::from_secs(30), "bounded: {took:?}");
}

#[test]
fn topo_dump_file_holds_the_cluster_view() {
    let path = std::env::temp_dir().join(format!("r2ccl-topo-dump-{}.toml", std::process::id()));
    let p = path.display().to_string();
    let (o, _) = perf(
        &["launch", "-n", "3", "--nics", "2", "all_reduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"],
        &[("R2CCL_TOPO_DUMP_FILE", &p)],
    );
    assert!(o.status.success(), "{}", text(&o));
    let dump = std::fs::read_to_string(&path).unwrap();
    assert!(dump.contains("node0") && dump.contains("node2") && dump.contains("lo.1"), "{dump}");
    std::fs::remove_file(&path).unwrap();
}

/// Whether `mpirun` is installed; without it `test` says SKIPPED loudly (and fails under CI).
#[allow(clippy::print_stderr, reason = "the SKIPPED line is the report")]
fn have_mpirun(test: &str) -> bool {
    let found = Command::new("sh").args(["-c", "command -v mpirun"]).output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "mpirun is missing under CI: `cargo xtask setup` installs openmpi-bin"
        );
        eprintln!("******** SKIPPED {test}: no mpirun (apt-get install openmpi-bin) ********");
    }
    found
}

#[test]
fn runs_under_openmpi_mpirun() {
    // Ranks get their rank and size from OpenMPI (OMPI_COMM_WORLD_*), the job secret from its
    // job id, and rank 0's rendezvous address from R2CCL_ROOT.
    if !have_mpirun("runs_under_openmpi_mpirun") {
        return;
    }
    let port = r2ccl::bootstrap::free_port_outside_ephemeral_range(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    let root = format!("R2CCL_ROOT=127.0.0.1:{port}");
    let start = Instant::now();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "3", "-x", &root])
        .args(["-x", "R2CCL_NICS=lo,lo", "-x", "R2CCL_DEBUG=ERROR"])
        .arg(env!("CARGO_BIN_EXE_r2ccl-perf"))
        .args(["all_reduce", "-b", "64K", "-e", "256K", "-f", "4", "-n", "2", "-w", "1"])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "mpirun failed after {:?}:\n{t}", start.elapsed());
    assert!(t.contains("nranks 3"), "{t}");
    assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
}

#[test]
fn runs_under_openmpi_mpirun_without_a_root_address() {
    // No -x R2CCL_ROOT and no secret: rank 0 publishes its unique id (with a random secret)
    // through PMIx and every rank reads it; nothing is derived from public job facts.
    if !have_mpirun("runs_under_openmpi_mpirun_without_a_root_address") {
        return;
    }
    let start = Instant::now();
    let out = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "3"])
        .args(["-x", "R2CCL_NICS=lo,lo", "-x", "R2CCL_DEBUG=WARN"])
        .env_remove("R2CCL_ROOT")
        .env_remove("R2CCL_SECRET")
        .env_remove("R2CCL_UNIQUE_ID")
        .env_remove("MASTER_ADDR")
        .arg(env!("CARGO_BIN_EXE_r2ccl-perf"))
        .args(["all_reduce", "-b", "64K", "-e", "256K", "-f", "4", "-n", "2", "-w", "1"])
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "mpirun failed after {:?}:\n{t}", start.elapsed());
    assert!(t.contains("nranks 3"), "{t}");
    assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
    assert!(!t.contains("derived from the job id"), "the secret came through PMIx, not from the job id:\n{t}");
}

#[test]
fn a_nic_missing_at_start_is_planned_around() {
    // Rank 1's second NIC cannot be opened (it does not exist): the job starts anyway, every
    // rank plans without node 1's NIC 1 from the first collective on, and results are exact.
    let port = r2ccl::bootstrap::free_port_outside_ephemeral_range(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    let root = format!("127.0.0.1:{port}");
    let start = Instant::now();
    let kids: Vec<_> = (0..3)
        .map(|rank| {
            Command::new(env!("CARGO_BIN_EXE_r2ccl-perf"))
                .args(["all_reduce", "-b", "64K", "-e", "1M", "-f", "4", "-n", "2", "-w", "1"])
                .env("R2CCL_RANK", rank.to_string())
                .env("R2CCL_WORLD_SIZE", "3")
                .env("R2CCL_ROOT", &root)
                .env("R2CCL_SECRET", "00112233445566778899aabbccddeeff")
                .env("R2CCL_NODE", format!("node{rank}"))
                .env("R2CCL_NICS", if rank == 1 { "lo,r2cclnosuchnic0" } else { "lo,lo" })
                .env("R2CCL_DEBUG", "WARN")
                .env("UCX_LOG_LEVEL", "fatal")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = kids.into_iter().map(|k| k.wait_with_output().unwrap()).collect();
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank} failed after {:?}:\n{}", start.elapsed(), text(o));
        assert!(
            text(o).contains("NICs unusable since the start") && text(o).contains("node1/nic1"),
            "rank {rank} does not report node1/nic1 as unusable:\n{}",
            text(o)
        );
    }
    assert!(text(&outs[0]).contains("# Out of bounds values : 0 OK"), "{}", text(&outs[0]));
}

/// Direct children of process `pid` (from `/proc/*/stat`).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (comm) state ppid ...`: the command may hold spaces, so read after the last ')'.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// TCP listening addresses of the processes `pids` (from `ss -ltnpH`), as connectable addresses.
fn listening(pids: &[u32]) -> Vec<String> {
    let out = Command::new("ss").args(["-ltnpH"]).output().expect("ss (iproute2) lists listening sockets");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut addrs = Vec::new();
    for line in text.lines() {
        if !pids.iter().any(|p| line.contains(&format!("pid={p},"))) {
            continue;
        }
        let Some(local) = line.split_whitespace().nth(3) else { continue };
        let Some((host, port)) = local.rsplit_once(':') else { continue };
        let host = match host {
            "*" | "0.0.0.0" => "127.0.0.1".to_owned(),
            "[::]" => "[::1]".to_owned(),
            h => h.split('%').next().unwrap_or(h).to_owned(),
        };
        addrs.push(format!("{host}:{port}"));
    }
    addrs
}

/// On every address, one stranger sends garbage and leaves, another connects and says nothing
/// (its connection is returned, to keep open).
fn knock(addrs: &[String]) -> Vec<std::net::TcpStream> {
    use std::io::Write as _;
    let mut silent = Vec::new();
    for addr in addrs {
        if let Ok(mut s) = std::net::TcpStream::connect(addr) {
            let garbage: Vec<u8> = (0..512u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
            let _ = s.write_all(&garbage);
        }
        if let Ok(s) = std::net::TcpStream::connect(addr) {
            silent.push(s);
        }
    }
    silent
}

#[test]
fn strangers_on_every_listening_port_are_dropped_and_the_job_stays_exact() {
    let child = Command::new(env!("CARGO_BIN_EXE_r2ccl-perf"))
        .args(["launch", "-n", "3", "--nics", "2", "all_reduce", "-b", "1M", "-e", "1M", "-N", "0", "--duration", "4"])
        .env("R2CCL_DEBUG", "ERROR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let ranks = children(child.id());
    let addrs = listening(&ranks);
    // Every rank listens at least for the OOB mesh and for UCX's TCP connections.
    assert!(ranks.len() == 3 && addrs.len() >= 2 * ranks.len(), "ranks {ranks:?} listen on {addrs:?}");
    let silent = knock(&addrs);
    eprintln!("strangers knocked on {} ports of ranks {ranks:?}: {addrs:?}", addrs.len());
    let o = child.wait_with_output().unwrap();
    drop(silent);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
}

/// The average bus bandwidth a timeline run (`-N 0`) printed.
fn timeline_busbw(t: &str) -> f64 {
    t.lines()
        .find_map(|l| l.strip_prefix("# Avg bus bandwidth    : "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no average bus bandwidth in:\n{t}"))
}

/// Issue 29's attack on a whole job: while 3 ranks x 2 NICs run a checked AllReduce timeline, a
/// stranger who speaks UCX but lacks the secret connects to every listening port of the ranks
/// (found as a port scan would; it does not know which port is whose) and sends forged chunk
/// headers for the current and future collectives, split headers and guessed payloads, oversized
/// messages under every data tag and forged probe replies, claiming to be every rank; others send
/// garbage or stay silent on every port. The ranks' data listeners reject the stranger's UCX
/// connections (they carry no endpoint id of the communicator's); every value stays
/// exact, no rank fails over or fails back, at most a few idle paths fail (printed loudly when any
/// does; see the comment below), and the bandwidth stays within reach of a control run's (the
/// stranger shares the 2 cores). What a stranger let in would meet (forged headers refused,
/// unmatched messages swept) is tested in r2ccl-ucx's `session_loopback`, listeners open to all.
#[test]
fn a_stranger_speaking_ucx_on_every_port_changes_no_result_and_causes_no_failover() {
    let args = ["launch", "-n", "3", "--nics", "2", "all_reduce", "-b", "1M", "-e", "1M", "-d", "int32"];
    let timeline = ["-N", "0", "--duration", "4"];
    // Generous detection margins in both runs: the other launch tests share the 2 cores, and a
    // descheduled rank must not pass for a dead path. What the stranger could do to a path (a
    // failed request, a forged probe reply) does not wait for these margins.
    let patient = [
        ("R2CCL_DETECT__PROGRESS_MARGIN_MS", "1000"),
        ("R2CCL_DETECT__HEARTBEAT_MISSES", "20"),
        ("R2CCL_DETECT__PROBE_TIMEOUT_MS", "500"),
        ("R2CCL_DETECT__LOCALIZE_TIMEOUT_MS", "1000"),
    ];
    let (control, _) = perf(&[&args[..], &timeline[..]].concat(), &patient);
    let ct = text(&control);
    assert!(control.status.success() && ct.contains("# Out of bounds values : 0 OK"), "control run:\n{ct}");
    // Every rank logs its path failures and failovers (NET, INFO) on the shared stderr.
    let child = Command::new(env!("CARGO_BIN_EXE_r2ccl-perf"))
        .args(args)
        .args(timeline)
        .env("R2CCL_DEBUG", "INFO")
        .env("R2CCL_DEBUG_SUBSYS", "NET")
        .envs(patient)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Until every rank listens on its OOB port and its two UCX ports (the job is up).
    let (mut ranks, mut addrs) = (Vec::new(), Vec::new());
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until && !(ranks.len() == 3 && addrs.len() >= 9) {
        std::thread::sleep(Duration::from_millis(100));
        ranks = children(child.id());
        addrs = listening(&ranks);
    }
    assert!(ranks.len() == 3 && addrs.len() >= 9, "ranks {ranks:?} listen on {addrs:?}");
    let sockaddrs: Vec<std::net::SocketAddr> = addrs.iter().filter_map(|a| a.parse().ok()).collect();
    let stranger = std::thread::spawn(move || {
        r2ccl_ucx::stranger::attack_addrs(&sockaddrs, 3, 2, 1 << 20, Duration::from_millis(2300))
    });
    let silent = knock(&addrs);
    let sent = stranger.join().unwrap().expect("the stranger opens UCX on lo");
    let o = child.wait_with_output().unwrap();
    drop(silent);
    let t = text(&o);
    let (before, after) = (timeline_busbw(&ct), timeline_busbw(&t));
    eprintln!(
        "stranger on {} ports of ranks {ranks:?}: {sent:?}; busbw {after:.3} GB/s against {before:.3} without it",
        addrs.len()
    );
    assert!(o.status.success(), "{t}");
    assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
    assert!(sent.endpoints >= 6, "the stranger reached every UCX listener: {sent:?}");
    // Whether the stranger's connection requests reach a listener before it gives up depends on
    // how fast its own worker runs here (the rejection itself is tested in r2ccl-ucx's loopback
    // and session_loopback tests): reported, not asserted.
    let rejected = t.lines().filter(|l| l.contains("without this job's endpoint id rejected")).count();
    eprintln!("rejection warnings from the ranks' data listeners: {rejected}");
    assert!(t.contains("# rank 0: failovers 0 fail-backs 0 wrong values 0"), "{t}");
    assert!(t.contains("no failover"), "{t}");
    let faults: Vec<&str> = t
        .lines()
        .filter(|l| l.contains("failover comm") || (l.contains("path node") && l.contains(" failed")))
        .collect();
    let warnings: Vec<&str> = t.lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).take(30).collect();
    // No failover and no failed path anywhere: the ranks' listeners admit only this job's
    // endpoint ids, so the stranger's UCX connections are turned away at once. (One CI run on
    // 2026-12-06, before endpoint ids, saw rank 0's two idle paths to rank 1 fail at once with
    // endpoint errors, no wrong value; docs/security.md.)
    assert!(faults.is_empty(), "the stranger failed paths: {faults:#?}\nwarnings: {warnings:#?}");
    // Not a timing target: the stranger's flood costs CPU on a 2-core machine; a stalled job
    // (the forged probe replies of old) would fall far below this.
    assert!(after > 0.25 * before, "bus bandwidth {after:.3} under attack against {before:.3} without");
}

/// A job that ends normally prints no warning: ranks that finish first close their endpoints once
/// every rank has said goodbye, and the others expect it (issue 36: a 16-rank job used to end with
/// a burst of "UCX endpoint error ... Connection reset by remote peer" lines); an `R2CCL_*`
/// variable of another version is named in one warning per rank and otherwise ignored.
#[test]
fn a_clean_exit_prints_no_warnings_and_unknown_variables_are_ignored() {
    let args = ["launch", "-n", "8", "--nics", "1", "all_reduce", "-b", "8", "-e", "8"];
    let (o, _) = perf(&args, &[("R2CCL_DEBUG", "WARN")]);
    let t = text(&o);
    assert!(o.status.success() && t.contains("# Out of bounds values : 0 OK"), "{t}");
    let warnings: Vec<&str> = t.lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).collect();
    assert!(warnings.is_empty(), "{warnings:#?}");
    let (o, _) = perf(&args, &[("R2CCL_DEBUG", "WARN"), ("R2CCL_SOME_FUTURE_KNOB", "1")]);
    let t = text(&o);
    assert!(o.status.success() && t.contains("# Out of bounds values : 0 OK"), "{t}");
    let ignored = t.lines().filter(|l| l.contains("ignored environment variable R2CCL_SOME_FUTURE_KNOB")).count();
    assert_eq!(ignored, 8, "{t}");
    assert_eq!(t.lines().filter(|l| l.contains(" WARN ")).count(), 8, "{t}");
}
