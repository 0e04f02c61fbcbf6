//! r2ccl-perf: nccl-tests-style collective benchmark for r2ccl, and its `launch` mode that
//! starts N local ranks (optionally with an injected NIC failure).
#![allow(clippy::print_stdout, clippy::print_stderr, reason = "a command-line tool reports on the terminal")]

use anyhow::{anyhow, bail, Context, Result};
use r2ccl::{CollReport, CommBuf, CommBuilder, Communicator, P2p};
use r2ccl_algo::Collective;
use r2ccl_core::kernels::{finalize_avg_bytes, reduce_bytes};
use r2ccl_core::{DType, Rank, ReduceOp};
use r2ccl_perf::args::{Coll, PerfArgs};
use r2ccl_perf::report::{self, Measure, Report, Row};
use std::process::{Command, ExitCode};

#[cfg(feature = "cuda")]
#[path = "gpu_cuda.rs"]
mod gpu;
#[cfg(not(feature = "cuda"))]
#[path = "gpu_none.rs"]
mod gpu;
use gpu::{DeviceBufs, DeviceCheck, Gpu};
mod gpu_check;

/// The descriptor of the rendezvous listener `launch` hands rank 0.
const ROOT_FD_ENV: &str = "R2PERF_ROOT_FD";
use std::time::{Duration, Instant};

const USAGE: &str = "usage:
  r2ccl-perf <collective> [flags]                 one rank, started by a launcher (mpirun, srun, torchrun, R2CCL_*)
  r2ccl-perf launch -n N [--nics K] [--fail SPEC] <collective> [flags] [--duration S]
                                                  start N ranks on this host over loopback (K NICs each)
  r2ccl-perf gpu-check [-n N] [-e MAXBYTES]       every collective on host and GPU buffers, and a NIC failure
                                                  under a GPU AllReduce: one table (a build with --features cuda)
collectives: all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv
flags (as nccl-tests): -b MIN -e MAX -f FACTOR -i STEP -n ITERS -w WARMUP -c CHECK -o OP -d TYPE -r ROOT
                       -R 1 (buffers registered with the communicator, read and written in place; not sendrecv)
                       --device cuda (buffers on the GPU of local rank modulo the GPU count; a build with --features cuda)
                       -N CYCLES (0 = timeline: run until --duration, print bus bandwidth every second) -T TIMEOUT --json FILE
--fail SPEC is an R2CCL_FAULT spec, e.g. 'rank=1,nic=0,after_ms=1500,kind=down'
drills: --kill-rank R:N (rank R exits before its N-th collective), --skew-rank R (rank R passes a different count)";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let result = match argv.first().map(String::as_str) {
        Some("launch") => launch(&argv[1..]),
        Some("gpu-check") => gpu_check::run(&argv[1..]),
        Some("-h" | "--help") | None => {
            println!("{USAGE}");
            Ok(true)
        }
        Some(_) => rank_main(&argv),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("r2ccl-perf: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Our flags beyond nccl-tests': `--duration S` (timeline length) and two fault drills used
/// by the tests: `--kill-rank R:N` (rank R exits abruptly before its N-th collective) and
/// `--skew-rank R` (rank R passes one element more, a mismatched argument).
#[derive(Default)]
struct Extra {
    duration: Option<f64>,
    kill: Option<(u32, u64)>,
    skew: Option<u32>,
}

fn split_extra(argv: &[String]) -> Result<(Vec<String>, Extra)> {
    let mut out = Vec::new();
    let mut x = Extra::default();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--duration" => {
                let v = it.next().ok_or_else(|| anyhow!("--duration needs seconds"))?;
                x.duration = Some(v.parse::<f64>().map_err(|_| anyhow!("--duration: bad seconds `{v}`"))?);
            }
            "--kill-rank" => {
                let v = it.next().ok_or_else(|| anyhow!("--kill-rank needs RANK:N"))?;
                let (r, n) = v.split_once(':').ok_or_else(|| anyhow!("--kill-rank: expected RANK:N, got `{v}`"))?;
                x.kill = Some((r.parse().context("--kill-rank RANK")?, n.parse().context("--kill-rank N")?));
            }
            "--skew-rank" => {
                let v = it.next().ok_or_else(|| anyhow!("--skew-rank needs a rank"))?;
                x.skew = Some(v.parse().context("--skew-rank")?);
            }
            _ => out.push(a.clone()),
        }
    }
    Ok((out, x))
}

fn launch(argv: &[String]) -> Result<bool> {
    let mut n = 4u32;
    let mut nics = 2usize;
    let mut fail: Option<String> = None;
    // Launch options come before the collective name; everything from it on goes to the ranks.
    let mut it = argv.iter();
    let mut rest = Vec::new();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-n" | "--ranks" => n = it.next().context("-n needs a number")?.parse().context("-n: not a number")?,
            "--nics" => nics = it.next().context("--nics needs a number")?.parse().context("--nics: not a number")?,
            "--fail" => fail = Some(it.next().context("--fail needs a spec")?.clone()),
            _ => {
                rest.push(a.clone());
                rest.extend(it.by_ref().cloned());
            }
        }
    }
    if rest.is_empty() {
        bail!("launch: name a collective after the launch options\n{USAGE}");
    }
    if n == 0 || n > 64 || nics == 0 || nics > 8 {
        bail!("launch: -n must be 1..=64 and --nics 1..=8");
    }
    // The rendezvous listener is bound here and handed to rank 0 open (ROOT_FD_ENV), never
    // released and bound again: another process could take the port in between.
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let root_fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
    let secret = r2ccl::bootstrap::Secret::generate()?.to_hex();
    let exe = std::env::current_exe()?;
    let nic_list = vec!["lo"; nics].join(",");
    let mut children = Vec::new();
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(&rest)
            .env("R2CCL_RANK", r.to_string())
            .env("R2CCL_WORLD_SIZE", n.to_string())
            .env("R2CCL_ROOT", format!("127.0.0.1:{port}"))
            .env("R2CCL_SECRET", &secret)
            .env("R2CCL_NICS", &nic_list)
            .env("R2CCL_NODE", format!("node{r}"))
            // Ranks leave one after another; UCX would log every refused reconnect to a rank that left.
            .env("UCX_LOG_LEVEL", std::env::var("UCX_LOG_LEVEL").unwrap_or_else(|_| "fatal".into()))
            .env_remove("R2CCL_UNIQUE_ID");
        if let Some(f) = &fail {
            cmd.env("R2CCL_FAULT", f);
        }
        if r != 0 {
            cmd.stdout(std::process::Stdio::null());
        } else {
            cmd.env(ROOT_FD_ENV, root_fd.to_string());
            // SAFETY: between fork and exec, only fcntl (async-signal-safe) on a descriptor this
            // process owns: rank 0 inherits the listener instead of it being closed at exec.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    let flags = libc::fcntl(root_fd, libc::F_GETFD);
                    if flags < 0 || libc::fcntl(root_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        children.push(cmd.spawn().with_context(|| format!("starting rank {r}"))?);
    }
    // Rank 0 holds it now.
    drop(listener);
    let mut ok = true;
    for (r, mut c) in children.into_iter().enumerate() {
        let status = c.wait()?;
        if !status.success() {
            eprintln!("r2ccl-perf: rank {r} exited with {status}");
            ok = false;
        }
    }
    Ok(ok)
}

/// Element `i` of rank `r`'s input: small integers, so every reduction order gives the same
/// floating-point result; `Prod` uses 1 and 2 so products stay exact.
fn fill(dtype: DType, op: ReduceOp, rank: u32, seed: u64, elems: u64) -> Vec<u8> {
    fill_at(dtype, op, rank, seed, 0..elems)
}

/// Elements `range` of rank `r`'s input (see [`fill`]): a rank's expected output is built from
/// the other ranks' inputs one block at a time, never all of them at once.
fn fill_at(dtype: DType, op: ReduceOp, rank: u32, seed: u64, range: std::ops::Range<u64>) -> Vec<u8> {
    let mut out = Vec::with_capacity((range.end - range.start) as usize * dtype.size());
    for i in range {
        let v = if op == ReduceOp::Prod {
            1 + (i + u64::from(rank) + seed).is_multiple_of(7) as i64
        } else {
            ((i.wrapping_mul(7) + u64::from(rank) * 13 + seed) % 17) as i64
        };
        match dtype {
            DType::I8 => out.push(v as i8 as u8),
            DType::U8 => out.push(v as u8),
            DType::I32 => out.extend((v as i32).to_le_bytes()),
            DType::U32 => out.extend((v as u32).to_le_bytes()),
            DType::I64 => out.extend(v.to_le_bytes()),
            DType::U64 => out.extend((v as u64).to_le_bytes()),
            DType::F16 => out.extend(half::f16::from_f32(v as f32).to_le_bytes()),
            DType::Bf16 => out.extend(half::bf16::from_f32(v as f32).to_le_bytes()),
            DType::F32 => out.extend((v as f32).to_le_bytes()),
            DType::F64 => out.extend((v as f64).to_le_bytes()),
        }
    }
    out
}

struct Case {
    /// sendrecv (nccl-tests' pattern: every rank sends to the next and receives from the
    /// previous, in one group); `coll` is unused then.
    ring_p2p: bool,
    coll: Collective,
    count: u64,
    bytes: u64,
    input: Vec<u8>,
    out_len: usize,
    expected: Option<Vec<u8>>,
}

/// Build this rank's input and expected output for one size, with nccl-tests' size rules.
fn case(c: Coll, dtype: DType, op: ReduceOp, args: &PerfArgs, (rank, world): (u32, u32), bytes: u64) -> Result<Case> {
    let (root, check) = (args.root, args.check);
    let es = dtype.size() as u64;
    let p = u64::from(world);
    let (coll, count) = match c {
        Coll::AllReduce => (Collective::AllReduce { op }, bytes / es),
        Coll::AllGather => (Collective::AllGather, bytes / es / p),
        Coll::ReduceScatter => (Collective::ReduceScatter { op }, bytes / es / p),
        Coll::Broadcast => (Collective::Broadcast { root: Rank(root) }, bytes / es),
        Coll::Reduce => (Collective::Reduce { op, root: Rank(root) }, bytes / es),
        Coll::AllToAll => (Collective::AlltoAll, bytes / es / p),
        Coll::SendRecv => (Collective::SendRecv { src: Rank(0), dst: Rank(0) }, bytes / es),
    };
    let (in_elems, out_elems) = match c {
        Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => (count, count),
        Coll::AllGather => (count, count * p),
        Coll::ReduceScatter => (count * p, count),
        Coll::AllToAll => (count * p, count * p),
    };
    let input = fill(dtype, op, rank, 0, in_elems);
    // Block `b` (of `count` elements) of rank `r`'s input.
    let block = |r: u32, b: u64| fill_at(dtype, op, r, 0, b * count..(b + 1) * count);
    let reduce_all = |b: u64| -> Result<Vec<u8>> {
        let mut acc = block(0, b);
        for r in 1..world {
            reduce_bytes(dtype, op, &mut acc, &block(r, b))?;
        }
        if op == ReduceOp::Avg {
            finalize_avg_bytes(dtype, &mut acc, world)?;
        }
        Ok(acc)
    };
    let me = u64::from(rank);
    let expected = if !check {
        None
    } else {
        match c {
            Coll::AllReduce => Some(reduce_all(0)?),
            Coll::Reduce => (rank == root).then(|| reduce_all(0)).transpose()?,
            Coll::ReduceScatter => Some(reduce_all(me)?),
            Coll::AllGather => Some((0..world).flat_map(|r| block(r, 0)).collect()),
            Coll::Broadcast => Some(block(root, 0)),
            Coll::AllToAll => Some((0..world).flat_map(|r| block(r, me)).collect()),
            Coll::SendRecv => Some(block((rank + world - 1) % world, 0)),
        }
    };
    Ok(Case { ring_p2p: c == Coll::SendRecv, coll, count, bytes, input, out_len: (out_elems * es) as usize, expected })
}

fn wrong(dtype: DType, got: &[u8], want: &Option<Vec<u8>>) -> u64 {
    let Some(want) = want else { return 0 };
    if got.len() != want.len() {
        return (want.len() / dtype.size()) as u64;
    }
    got.chunks(dtype.size()).zip(want.chunks(dtype.size())).filter(|(a, b)| a != b).count() as u64
}

/// Byte offset of the first element of `got` that differs from `want`.
fn first_wrong(dtype: DType, got: &[u8], want: &Option<Vec<u8>>) -> Option<usize> {
    let want = want.as_ref()?;
    got.chunks(dtype.size()).zip(want.chunks(dtype.size())).position(|(a, b)| a != b).map(|i| i * dtype.size())
}

/// What a wrong AllReduce result (f32 sum) looks like, for finding the bug that wrote it: the range
/// of wrong elements, the first one's value against the expected one, and whether the whole range is
/// a sum of the ranks' inputs with multiplicities 0-2 (a contribution missing or counted twice) or
/// the expected result at another offset (a payload that landed in the wrong place).
fn diagnose_wrong(c: &Case, args: &PerfArgs, world: u32, got: &[u8]) -> String {
    let Some(want) = c.expected.as_ref() else { return String::new() };
    let as_f32 =
        |b: &[u8]| -> Vec<f32> { b.chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect() };
    let (g, w) = (as_f32(got), as_f32(want));
    let bad: Vec<usize> = (0..g.len().min(w.len())).filter(|&i| g[i].to_bits() != w[i].to_bits()).collect();
    let (Some(&first), Some(&last)) = (bad.first(), bad.last()) else { return String::new() };
    let mut s = format!(
        "wrong elements at byte offsets {}..{} ({} of {} in that range); first: got {} want {}",
        first * 4,
        (last + 1) * 4,
        bad.len(),
        last + 1 - first,
        g[first],
        w[first]
    );
    if !matches!(c.coll, Collective::AllReduce { op: ReduceOp::Sum }) || args.dtypes[0] != DType::F32 || world > 10 {
        return s;
    }
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| as_f32(&fill(DType::F32, ReduceOp::Sum, r, 0, c.count))).collect();
    // Contributions with multiplicity 0, 1 or 2 per rank (3^world combinations).
    let combos = 3usize.pow(world);
    let sample: Vec<usize> = bad.iter().copied().step_by((bad.len() / 64).max(1)).collect();
    let mult = |mut k: usize| -> Vec<u32> {
        (0..world)
            .map(|_| {
                let m = (k % 3) as u32;
                k /= 3;
                m
            })
            .collect()
    };
    let sum_at = |m: &[u32], i: usize| -> f32 { m.iter().zip(&inputs).map(|(&m, inp)| m as f32 * inp[i]).sum::<f32>() };
    let found = (0..combos)
        .map(mult)
        .find(|m| sample.iter().all(|&i| sum_at(m, i) == g[i]) && bad.iter().all(|&i| sum_at(m, i) == g[i]));
    match found {
        Some(m) => s.push_str(&format!("; every wrong element = sum of rank inputs with multiplicities {m:?}")),
        None => s.push_str("; not a sum of rank inputs with multiplicities 0-2"),
    }
    // The expected result at another offset: a payload written to the wrong place.
    let n = (last + 1 - first).min(64);
    let shift = (0..w.len().saturating_sub(n))
        .find(|&o| o != first && (0..n).all(|k| w[o + k].to_bits() == g[first + k].to_bits()));
    if let Some(o) = shift {
        s.push_str(&format!("; the wrong range starts like the expected result at byte offset {}", o * 4));
    }
    if g[first..=last].iter().all(|&x| x == 0.0) {
        s.push_str("; all zero (never written)");
    }
    s
}

fn rank_main(argv: &[String]) -> Result<bool> {
    let coll: Coll = argv[0].parse().map_err(|e| anyhow!("{e}\n{USAGE}"))?;
    let (flags, extra) = split_extra(&argv[1..])?;
    let args = PerfArgs::parse(&flags).map_err(|e| anyhow!("{e}"))?;
    let cfg = r2ccl_config::load()?;
    let spec = r2ccl_log::LogSpec::parse(&cfg.log.level, &cfg.log.subsys, &cfg.log.file)?;
    r2ccl_log::init(&spec)?;
    if !cfg.metrics.addr.is_empty() {
        r2ccl::metrics::install_prometheus(cfg.metrics.addr.parse()?)?;
    }
    let launch = r2ccl::bootstrap::LaunchInfo::from_process_env()?;
    let (rank, world) = (launch.rank, launch.world_size);
    if args.root >= world {
        bail!("-r {}: root must be below the world size {world}", args.root);
    }
    // `launch` hands rank 0 the listener it bound (ROOT_FD_ENV), so that no other process can
    // take the port between its bind and ours.
    let inherited = std::env::var(ROOT_FD_ENV).ok().filter(|_| rank == 0).and_then(|v| v.parse::<i32>().ok());
    let root = inherited.map(|fd| {
        // SAFETY: `launch` passed this descriptor open, without close-on-exec, to this process
        // only, and nothing else here owns it.
        let l = unsafe { <std::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        r2ccl::Root::from_listener(l, launch.secret.clone())
    });
    // R2CCL_FAULT drives the e2e scenarios' software faults.
    let mut builder = CommBuilder::from_env(cfg)?.fault_injection_from_env(true);
    if root.is_some() {
        builder = builder.root(root);
    }
    let init_started = Instant::now();
    let comm = builder.init()?;
    let init_ms = init_started.elapsed().as_secs_f64() * 1e3;
    let timeout = if args.timeout_s == 0 { Duration::from_secs(120) } else { Duration::from_secs(args.timeout_s) };
    let main = rank == 0;
    let gpu = match args.device {
        r2ccl_perf::args::Device::Host => None,
        r2ccl_perf::args::Device::Cuda if args.registered => bail!("-R 1 and --device cuda: pick one"),
        r2ccl_perf::args::Device::Cuda => Some(Gpu::open(local_rank(rank))?),
    };
    if main {
        println!(
            "# r2ccl-perf {}: nranks {world} minBytes {} maxBytes {} step: {}({}) warmup iters: {} iters: {} validation: {}",
            coll.name(),
            args.min_bytes,
            args.max_bytes,
            if args.step_factor >= 2 { args.step_factor } else { args.step_bytes },
            if args.step_factor >= 2 { "factor" } else { "bytes" },
            args.warmup,
            args.iters,
            u8::from(args.check)
        );
        println!("#\n# Using ranks on nodes {:?}", comm.nodes().iter().map(|n| n.0).collect::<Vec<_>>());
        match &gpu {
            Some(g) => println!(
                "# Buffers on cuda:{} ({}), staged through host memory; results checked {}\n#",
                g.ordinal,
                g.name(),
                if g.checks_on_device() { "by a kernel on the collective's stream" } else { "on the host" }
            ),
            None => println!("# Buffers in host memory\n#"),
        }
    }
    if args.cycles == 0 {
        return timeline(&comm, coll, &args, extra.duration.unwrap_or(10.0), timeout, gpu.as_ref());
    }
    if main {
        print!("{}", report::header());
    }
    let ops: Vec<ReduceOp> = if coll.has_op() { args.ops.clone() } else { vec![ReduceOp::Sum] };
    let mut rows = Vec::new();
    let mut calls = 0u64;
    for _cycle in 0..args.cycles {
        for &dtype in &args.dtypes {
            for &op in &ops {
                for bytes in args.sizes() {
                    let skewed = extra.skew == Some(rank);
                    let c = case(
                        coll,
                        dtype,
                        op,
                        &args,
                        (rank, world),
                        bytes + if skewed { world as u64 * dtype.size() as u64 } else { 0 },
                    )?;
                    // (seconds per call, wrong values) out of place, then in place.
                    let mut raw = Vec::new();
                    let mut oob_per_call = 0.0;
                    for in_place in [false, true] {
                        let out_init = if in_place { in_place_init(&c, rank) } else { vec![0u8; c.out_len] };
                        // In place: the receive buffer starts as the send buffer and is passed as both.
                        let mut last = out_init.clone();
                        // -R 1: the same buffers, registered with the communicator.
                        let mut reg = if args.registered && !c.ring_p2p {
                            Some(Registered::new(&comm, &c, in_place, &out_init)?)
                        } else {
                            None
                        };
                        // --device cuda: the same buffers on the GPU.
                        let mut dev = match &gpu {
                            Some(g) => Some((g, DeviceBufs::new(g, &c.input, &out_init, in_place)?)),
                            None => None,
                        };
                        // One run from the initial buffer (every warm-up run, and the checked one).
                        let fresh_run = |reg: &mut Option<Registered<'_>>,
                                         dev: &mut Option<(&Gpu, DeviceBufs)>,
                                         last: &mut Vec<u8>|
                         -> Result<()> {
                            match (reg, dev) {
                                (Some(r), _) => {
                                    r.output[..out_init.len()].copy_from_slice(&out_init);
                                    r.run(&comm, &c, dtype).map(drop)
                                }
                                (None, Some((g, d))) => {
                                    d.reset(g, &out_init)?;
                                    run_device(g, d, &comm, &c, dtype).map(drop)
                                }
                                (None, None) => {
                                    last.copy_from_slice(&out_init);
                                    run_once(&comm, &c, dtype, in_place, last)
                                }
                            }
                        };
                        for _ in 0..args.warmup {
                            drill(&extra, rank, &mut calls);
                            fresh_run(&mut reg, &mut dev, &mut last)?;
                        }
                        // As nccl-tests: the timed collectives run back to back (in place, each
                        // on the previous one's result); in place, one more run from the reset
                        // buffer, untimed, gives the result that is checked. A reset between
                        // timed runs would take the CPU from the other ranks' collectives.
                        let mut spent = Duration::ZERO;
                        let oob_before = oob_total(&comm);
                        for _ in 0..args.iters {
                            drill(&extra, rank, &mut calls);
                            let t = Instant::now();
                            match (&mut reg, &mut dev) {
                                (Some(r), _) => {
                                    r.run(&comm, &c, dtype)?;
                                }
                                (None, Some((g, d))) => {
                                    run_device(g, d, &comm, &c, dtype)?;
                                }
                                (None, None) => run_once(&comm, &c, dtype, in_place, &mut last)?,
                            }
                            spent += t.elapsed();
                        }
                        if !in_place && args.iters > 0 {
                            oob_per_call = (oob_total(&comm) - oob_before) as f64 / f64::from(args.iters);
                        }
                        if in_place {
                            drill(&extra, rank, &mut calls);
                            fresh_run(&mut reg, &mut dev, &mut last)?;
                        }
                        if let Some(r) = &reg {
                            let n = last.len();
                            last.copy_from_slice(&r.output[..n]);
                        }
                        // --device cuda: one more run from the initial buffer, checked by a kernel on
                        // the same stream right after it (no host sync in between); on the host
                        // when the kernel is unavailable.
                        let mut device_wrong = None;
                        if let Some((g, d)) = &mut dev {
                            if let Some(want) = &c.expected {
                                d.reset(g, &out_init)?;
                                let offset = if in_place { in_place_offset(&c, rank) } else { 0 };
                                let mut check = DeviceCheck::new(g, want)?;
                                let coll = (!c.ring_p2p).then_some(c.coll);
                                device_wrong = d.run_checked(g, &comm, coll, dtype, c.count, (offset, &mut check))?;
                            }
                            if device_wrong.is_none() {
                                last = d.read(g)?;
                            }
                        }
                        let secs = spent.as_secs_f64() / f64::from(args.iters);
                        let result = if in_place { in_place_result(&c, rank, &last) } else { &last[..] };
                        let bad = device_wrong.unwrap_or_else(|| wrong(dtype, result, &c.expected));
                        raw.push((secs, bad));
                    }
                    // As nccl-tests: times combined over the ranks as -a says, #wrong summed.
                    let (secs, wrong) = combine_ranks(&comm, args.average, &raw)?;
                    let measures: Vec<Measure> =
                        secs.iter().zip(wrong).map(|(&t, w)| Measure::new(coll, world, c.bytes, t, w)).collect();
                    let row = Row {
                        bytes: c.bytes,
                        count: c.bytes / dtype.size() as u64,
                        dtype,
                        op: coll.has_op().then_some(op),
                        root: coll.has_root().then_some(args.root),
                        out_of_place: measures[0],
                        in_place: measures[1],
                        checked: args.check,
                        oob_per_call,
                    };
                    if main {
                        println!("{}", report::format_row(&row));
                    }
                    rows.push(row);
                }
            }
        }
    }
    let events: Vec<String> =
        comm.take_events().into_iter().map(|e| format!("{:>7} ms  {}", e.at_ms, e.text)).collect();
    let ok = report::wrong_total(&rows) == 0;
    if main {
        print!("{}", report::footer(&rows));
        for e in &events {
            println!("# event {e}");
        }
        if let Some(path) = &args.json {
            let report = Report { init_ms, ..Report::new(coll, world, rows, events) };
            std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        }
    } else if !ok {
        eprintln!("r2ccl-perf: rank {rank}: {} wrong elements", report::wrong_total(&rows));
    }
    Ok(ok)
}

/// OOB messages this rank has sent, every channel but the (timed) heartbeat.
fn oob_total(comm: &Communicator) -> u64 {
    comm.oob_messages_sent().into_iter().filter(|(c, _)| *c != "heartbeat").map(|(_, n)| n).sum()
}

/// Every rank's (seconds, wrong values) of one row, combined as nccl-tests' `-a` says (0 this
/// rank's, which rank 0 prints; 1 the average; 2 the minimum; 3 the maximum), wrong values
/// summed over the ranks: two small AllReduces after the timed runs.
fn combine_ranks(comm: &Communicator, average: u8, raw: &[(f64, u64)]) -> Result<(Vec<f64>, Vec<u64>)> {
    let n = raw.len();
    let op = match average {
        2 => ReduceOp::Min,
        3 => ReduceOp::Max,
        _ => ReduceOp::Sum,
    };
    let secs: Vec<u8> = raw.iter().flat_map(|r| r.0.to_le_bytes()).collect();
    let mut all = vec![0u8; secs.len()];
    comm.run(Collective::AllReduce { op }, DType::F64, n as u64, &secs, &mut all)?;
    let wrong: Vec<u8> = raw.iter().flat_map(|r| r.1.to_le_bytes()).collect();
    let mut sum = vec![0u8; wrong.len()];
    comm.run(Collective::AllReduce { op: ReduceOp::Sum }, DType::U64, n as u64, &wrong, &mut sum)?;
    let f64s =
        |b: &[u8]| b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect::<Vec<_>>();
    let secs = match average {
        0 => raw.iter().map(|r| r.0).collect(),
        1 => f64s(&all).into_iter().map(|t| t / f64::from(comm.world())).collect(),
        _ => f64s(&all),
    };
    let wrong = sum.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    Ok((secs, wrong))
}

/// One collective on the GPU's buffers, waited for until its stream has run past it.
fn run_device(
    g: &Gpu,
    d: &mut DeviceBufs,
    comm: &Communicator,
    c: &Case,
    dtype: DType,
) -> Result<r2ccl::device::DeviceReport> {
    if c.ring_p2p {
        d.ring_sendrecv(g, comm, dtype)
    } else {
        d.run(g, comm, c.coll, dtype, c.count)
    }
}

/// This rank's index on its host, as the launcher gives it (`launch` runs every rank on one).
fn local_rank(rank: u32) -> usize {
    ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
        .unwrap_or(rank as usize)
}

/// One blocking collective; in place, the output buffer is also the input.
/// One collective; in place, `out` is the single buffer NCCL's in-place convention uses.
/// The buffers of one case under `-R 1`, registered with the communicator: the input (none in
/// place) and the output (in place: the one buffer, holding the larger of the two).
struct Registered<'c> {
    input: Option<CommBuf<'c>>,
    output: CommBuf<'c>,
}

impl<'c> Registered<'c> {
    fn new(comm: &'c Communicator, c: &Case, in_place: bool, out_init: &[u8]) -> Result<Self> {
        let mut output = comm.alloc::<u8>(out_init.len())?;
        output.copy_from_slice(out_init);
        let input = if in_place {
            None
        } else {
            let mut input = comm.alloc::<u8>(c.input.len())?;
            input.copy_from_slice(&c.input);
            Some(input)
        };
        Ok(Self { input, output })
    }

    fn run(&mut self, comm: &Communicator, c: &Case, dtype: DType) -> Result<CollReport> {
        Ok(match &self.input {
            Some(input) => comm.run_registered(c.coll, dtype, c.count, input, &mut self.output)?,
            None => comm.run_registered_in_place(c.coll, dtype, c.count, &mut self.output)?,
        })
    }
}

fn run_once(comm: &Communicator, c: &Case, dtype: DType, in_place: bool, out: &mut [u8]) -> Result<()> {
    if c.ring_p2p {
        // In place, the send buffer is the receive buffer: send what it holds before the call.
        let owned = in_place.then(|| out.to_vec());
        ring_sendrecv(comm, dtype, owned.as_deref().unwrap_or(&c.input), out)?;
    } else if in_place {
        comm.run_in_place(c.coll, dtype, c.count, out)?;
    } else {
        comm.run(c.coll, dtype, c.count, &c.input, out)?;
    }
    Ok(())
}

/// nccl-tests' sendrecv step: send `data` to the next rank and receive from the previous one,
/// both in flight at once (one group).
fn ring_sendrecv(comm: &Communicator, dtype: DType, data: &[u8], out: &mut [u8]) -> Result<CollReport> {
    let (rank, world) = (comm.rank().0, comm.world());
    let mut ops = [
        P2p::Send { peer: Rank((rank + 1) % world), data },
        P2p::Recv { peer: Rank((rank + world - 1) % world), buf: out },
    ];
    Ok(comm.group_bytes(dtype, &mut ops)?)
}

/// The in-place buffer before a run: the input, placed where NCCL's convention reads it
/// (AllGather: this rank's block of the output-sized buffer).
fn in_place_init(c: &Case, rank: u32) -> Vec<u8> {
    let (i, o) = (c.input.len(), c.out_len);
    if i < o {
        let mut b = vec![0u8; o];
        b[rank as usize * i..][..i].copy_from_slice(&c.input);
        b
    } else {
        c.input.clone()
    }
}

/// Where the result lies in the in-place buffer (ReduceScatter: this rank's block).
fn in_place_result<'a>(c: &Case, rank: u32, buf: &'a [u8]) -> &'a [u8] {
    &buf[in_place_offset(c, rank)..][..c.out_len.min(buf.len())]
}

/// The byte offset of the result in the in-place buffer.
fn in_place_offset(c: &Case, rank: u32) -> usize {
    let (i, o) = (c.input.len(), c.out_len);
    if o < i {
        rank as usize * o
    } else {
        0
    }
}

/// Fault drill: exit abruptly (no destructors, no goodbye) before the N-th collective.
fn drill(extra: &Extra, rank: u32, calls: &mut u64) {
    *calls += 1;
    if extra.kill == Some((rank, *calls)) {
        eprintln!("r2ccl-perf: rank {rank}: --kill-rank drill, exiting abruptly");
        std::process::exit(9);
    }
}

/// `-N 0`: repeat the largest size, print bus bandwidth every second with the events of
/// that second, until `duration` seconds passed (rank 0 decides and tells the others).
fn timeline(
    comm: &Communicator,
    coll: Coll,
    args: &PerfArgs,
    duration: f64,
    timeout: Duration,
    gpu: Option<&Gpu>,
) -> Result<bool> {
    let (rank, world) = (comm.rank().0, comm.world());
    let dtype = args.dtypes[0];
    let op = args.ops[0];
    let c = case(coll, dtype, op, args, (rank, world), args.max_bytes)?;
    let main = rank == 0;
    let start = Instant::now();
    let mut window = (Instant::now(), 0u32, 0.0f64);
    let mut samples: Vec<(f64, f64, bool)> = Vec::new();
    let mut wrong_total = 0;
    let mut strategy = "";
    let mut event_in_window = false;
    let mut events_all = Vec::new();
    if main {
        println!("#  time(s)   busbw(GB/s)  strategy   events");
    }
    let mut out = vec![0u8; c.out_len];
    let mut stop = false;
    // -R 1: buffers registered with the communicator, read and written in place (out of place
    // here), so the timed span holds no copy into or out of the library's workspace.
    let mut reg = if args.registered && !c.ring_p2p { Some(Registered::new(comm, &c, false, &out)?) } else { None };
    // --device cuda: the buffers on the GPU, each collective timed until its stream has run past it.
    let mut dev = match gpu {
        Some(g) => Some((g, DeviceBufs::new(g, &c.input, &out, false)?)),
        None => None,
    };
    // Every collective's time: the longest against the median is the failover pause.
    let mut times: Vec<f64> = Vec::new();
    while !stop {
        // Rank 0 decides when to stop; everyone follows. The flag travels in a 4-byte AllReduce
        // (max), which no rank leaves before every rank has entered it: it doubles as the barrier
        // that starts the timed span, so one rank's result check (or any other work between two
        // collectives) never counts in another rank's collective time.
        let stop_flag = u32::from(main && start.elapsed().as_secs_f64() >= duration);
        let mut flag = [0u8; 4];
        comm.run(Collective::AllReduce { op: ReduceOp::Max }, DType::U32, 1, &stop_flag.to_le_bytes(), &mut flag)?;
        stop = u32::from_le_bytes(flag) == 1;
        // A stale result must not pass the check.
        match (reg.as_mut(), dev.as_mut()) {
            (Some(r), _) => r.output.fill(0),
            (None, Some((g, d))) => d.reset(g, &vec![0u8; c.out_len])?,
            (None, None) => out.fill(0),
        }
        let t = Instant::now();
        let rep = if let Some((g, d)) = dev.as_mut() {
            let r = run_device(g, d, comm, &c, dtype)?;
            (r.seq, r.strategy.map_or("none", |s| s.name()))
        } else if c.ring_p2p {
            let r = ring_sendrecv(comm, dtype, &c.input, &mut out)?;
            (r.seq, r.strategy.name())
        } else if let Some(r) = reg.as_mut() {
            let r = r.run(comm, &c, dtype)?;
            (r.seq, r.strategy.name())
        } else {
            // Blocking, as the size sweep: large calls run in bounded segments (segmented.rs).
            let r = comm.run_within(c.coll, dtype, c.count, &c.input, &mut out, timeout)?;
            (r.seq, r.strategy.name())
        };
        let secs = t.elapsed().as_secs_f64();
        times.push(secs);
        if let Some((g, d)) = &dev {
            out = d.read(g)?;
        }
        let got: &[u8] = match reg.as_ref() {
            Some(r) => &r.output[..c.out_len],
            None => &out,
        };
        let bad = wrong(dtype, got, &c.expected);
        if bad > 0 {
            // Which collective and where: the first step to finding what wrote over it.
            let first = first_wrong(dtype, got, &c.expected).unwrap_or(0);
            eprintln!(
                "r2ccl-perf: rank {rank}: collective #{} ({:?}) has {bad} wrong values, the first at byte offset {first} (strategy {}): {}",
                rep.0,
                coll,
                rep.1,
                diagnose_wrong(&c, args, world, got)
            );
        }
        wrong_total += bad;
        strategy = rep.1;
        window.1 += 1;
        window.2 += secs;
        let evs = comm.take_events();
        if main {
            for e in &evs {
                println!("#   event {:>7} ms  {}", e.at_ms, e.text);
            }
        }
        event_in_window |= !evs.is_empty();
        events_all.extend(evs);
        if window.0.elapsed() >= Duration::from_secs(1) || stop {
            let busbw = Measure::new(coll, world, c.bytes, window.2 / f64::from(window.1.max(1)), 0).busbw;
            let at = start.elapsed().as_secs_f64();
            if main {
                println!("{at:>10.1} {busbw:>13.3}  {strategy:<10} {}", if event_in_window { "failover" } else { "" });
            }
            samples.push((at, busbw, event_in_window));
            window = (Instant::now(), 0, 0.0);
            event_in_window = false;
        }
    }
    if main {
        let first_event = samples.iter().position(|s| s.2);
        let avg = |s: &[(f64, f64, bool)]| {
            if s.is_empty() {
                0.0
            } else {
                s.iter().map(|x| x.1).sum::<f64>() / s.len() as f64
            }
        };
        match first_event {
            Some(i) => {
                let last_event = samples.iter().rposition(|s| s.2).unwrap_or(i);
                println!(
                    "# bus bandwidth before the failure {:.3} GB/s, during {:.3} GB/s, after {:.3} GB/s (strategy {strategy})",
                    avg(&samples[..i]),
                    avg(&samples[i..=last_event]),
                    avg(&samples[last_event + 1..])
                );
            }
            None => println!("# bus bandwidth {:.3} GB/s, no failover (strategy {strategy})", avg(&samples)),
        }
        let mut sorted = times.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
        let longest = sorted.last().copied().unwrap_or(0.0);
        println!(
            "# longest collective {:.2} ms, median {:.2} ms: pause {:.2} ms",
            longest * 1e3,
            median * 1e3,
            (longest - median) * 1e3
        );
        println!("# Out of bounds values : {wrong_total} {}", if wrong_total == 0 { "OK" } else { "FAILED" });
        println!("# Avg bus bandwidth    : {:.4} \n#", avg(&samples));
        if let Some(path) = &args.json {
            let ev: Vec<String> = events_all.iter().map(|e| format!("{} ms {}", e.at_ms, e.text)).collect();
            std::fs::write(
                path,
                serde_json::to_string_pretty(&serde_json::json!({
                    "timeline": samples,
                    "events": ev,
                    "wrong": wrong_total,
                    "median_ms": median * 1e3,
                    "pause_ms": (longest - median) * 1e3,
                }))?,
            )?;
        }
    }
    // Every rank: its own migrations (rank 0's are also among the events above) and wrong values,
    // for harnesses that count them over the job (`cargo xtask e2e`'s `failovers`, its chaos tally).
    let count = |what: &str| events_all.iter().filter(|e| e.text.starts_with(what)).count();
    println!(
        "# rank {rank}: failovers {} fail-backs {} wrong values {wrong_total}",
        count("failover "),
        count("fail-back ")
    );
    Ok(wrong_total == 0)
}
