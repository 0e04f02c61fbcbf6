//! What idle communicators cost: two ranks as threads of this process (one NIC each on
//! loopback) run one AllReduce, then sit idle; the process's CPU time over 4 s of idleness is
//! printed as a share of one core, then the same with 15 more communicators per rank from
//! `split` (32 in all), with how long the splits took and the resident memory and threads they
//! added. Run: `cargo run --release -p r2ccl --example idle_cpu`.
#![allow(clippy::print_stdout, reason = "an example prints what it shows")]

use r2ccl::{CommError, Communicator, Rank, ReduceOp, Root, UniqueId};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const IDLE: Duration = Duration::from_secs(4);
const SPLITS: usize = 15;

/// User plus system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes one struct we own.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// A number field of `/proc/self/status` (`VmRSS:` in KiB, `Threads:`); 0 when unreadable.
fn status_field(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let value = text.lines().find_map(|l| l.strip_prefix(key)).unwrap_or("");
    value.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Share of one core the process used while idle for [`IDLE`].
fn idle_share() -> f64 {
    let (c0, t0) = (cpu_time(), Instant::now());
    std::thread::sleep(IDLE);
    (cpu_time() - c0).as_secs_f64() / t0.elapsed().as_secs_f64()
}

fn rank(r: u32, id: UniqueId, root: Option<Root>, sync: &Barrier) -> Result<(), CommError> {
    let comm = Communicator::builder(Rank(r), 2, id).node(format!("n{r}")).nics(["lo"]).root(root).init()?;
    let mut v = vec![1.0f32; 1024];
    comm.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
    sync.wait(); // both ranks idle
    sync.wait(); // measured by rank 0's thread
    let mut more = Vec::new();
    for i in 0..SPLITS {
        let c = comm.split(Some(0), r).map_err(|e| CommError::Invalid(format!("split {i}: {e}")))?;
        let c = c.ok_or_else(|| CommError::Invalid("split gave no communicator".into()))?;
        c.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        more.push(c);
    }
    sync.wait(); // all idle again
    sync.wait(); // measured
    for c in more {
        c.finalize()?;
    }
    comm.finalize()
}

fn main() -> Result<(), CommError> {
    let root = Root::create([127, 0, 0, 1].into())?;
    let id = root.unique_id()?;
    let sync = Arc::new(Barrier::new(3));
    let threads: Vec<_> = [(0, Some(root)), (1, None)]
        .into_iter()
        .map(|(r, root)| {
            let (id, sync) = (id.clone(), sync.clone());
            std::thread::spawn(move || rank(r, id, root, &sync))
        })
        .collect();
    sync.wait();
    let two = idle_share();
    println!("2 idle communicators: {:.2}% of a core in all ({:.2}% each)", two * 100.0, two * 50.0);
    let (rss0, threads0) = (status_field("VmRSS:"), status_field("Threads:"));
    sync.wait();
    let t_split = Instant::now();
    sync.wait();
    let split_time = t_split.elapsed();
    let n = 2 * (SPLITS + 1);
    let many = idle_share();
    println!("{n} idle communicators: {:.2}% of a core in all ({:.3}% each)", many * 100.0, many * 100.0 / n as f64);
    let added = (many - two).max(0.0);
    println!(
        "the {} from split: {:.2}% of a core in all ({:.3}% each)",
        n - 2,
        added * 100.0,
        added * 100.0 / (n - 2) as f64
    );
    let (rss1, threads1) = (status_field("VmRSS:"), status_field("Threads:"));
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / (n - 2) as f64;
    println!(
        "{} more communicators from split in {:.0} ms ({:.1} ms each, both ranks at once): resident memory {} -> {} MiB \
         ({:.1} MiB each), threads {threads0} -> {threads1} ({:.1} each)",
        n - 2,
        split_time.as_secs_f64() * 1e3,
        split_time.as_secs_f64() * 1e3 / SPLITS as f64,
        rss0 / 1024,
        rss1 / 1024,
        per(rss0, rss1) / 1024.0,
        per(threads0, threads1),
    );
    sync.wait();
    for t in threads {
        t.join().map_err(|_| CommError::Invalid("a rank panicked".into()))??;
    }
    Ok(())
}
