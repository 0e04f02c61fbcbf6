//! Session-logic throughput: chunks per second the session bookkeeping (posting, completions,
//! delivery record, migration) processes through the in-memory fabric, with and without faults.
#![allow(clippy::print_stdout, reason = "a benchmark prints its figures")]
#![allow(clippy::unwrap_used, reason = "a benchmark fails loudly on any error")]
#![allow(clippy::disallowed_methods, reason = "a benchmark measures wall time; the library itself stays clock-free")]

use r2ccl_core::NicId;
use r2ccl_transport::harness::{Harness, HarnessConfig};
use r2ccl_transport::{chunk_count, CommId, FabricConfig, FaultAction, SessionConfig, TransferKey};
use std::time::{Duration, Instant};

struct Run {
    chunks: u64,
    wall: Duration,
    sim: Duration,
    migrations: usize,
}

fn run(chunk: u32, len: usize, nics: u16, fault: bool) -> Run {
    let fabric = FabricConfig {
        nodes: 2,
        nics_per_node: nics,
        nic_bytes_per_sec: 12_500_000_000,
        latency: Duration::from_micros(2),
        jitter: Duration::from_nanos(500),
        ..FabricConfig::default()
    };
    let cfg = HarnessConfig {
        session: SessionConfig { chunk_size: chunk, window: 16, recv_depth: 16, ..SessionConfig::default() },
        ..HarnessConfig::default()
    };
    let mut h = Harness::new(fabric, cfg).unwrap();
    h.open_comm(CommId(1));
    if fault {
        h.fabric_mut().schedule(Duration::from_micros(100), FaultAction::NicDown(NicId::new(0, 0)));
    }
    let data = vec![0xa5; len];
    let start = Instant::now();
    h.start_transfer(TransferKey::new(1, 0, 0, 0, 1), data.clone(), None).unwrap();
    h.start_transfer(TransferKey::new(1, 0, 0, 1, 0), data, None).unwrap();
    h.run(Duration::from_secs(10)).unwrap();
    let wall = start.elapsed();
    h.verify().unwrap();
    Run { chunks: 2 * u64::from(chunk_count(len as u64, chunk)), wall, sim: h.now(), migrations: h.records().len() }
}

fn main() {
    println!("r2ccl-transport session bookkeeping through the in-memory fabric (2 ranks, both directions)");
    println!(
        "{:>8} {:>6} {:>5} {:>6} {:>9} {:>10} {:>12} {:>10}",
        "chunk", "MiB", "NICs", "fault", "chunks", "wall ms", "chunks/s", "migrations"
    );
    let mut base = 0.0;
    for &(chunk, mib, nics, fault) in &[
        (4096u32, 64usize, 1u16, false),
        (4096, 64, 4, false),
        (4096, 64, 4, true),
        (65536, 256, 4, false),
        (65536, 256, 8, true),
    ] {
        let best = (0..3).map(|_| run(chunk, mib << 20, nics, fault)).min_by_key(|r| r.wall).unwrap();
        let rate = best.chunks as f64 / best.wall.as_secs_f64();
        if base == 0.0 {
            base = rate;
        }
        println!(
            "{:>8} {:>6} {:>5} {:>6} {:>9} {:>10.1} {:>12.0} {:>10}   (x{:.2} of first row; simulated {:?})",
            chunk,
            mib,
            nics,
            fault,
            best.chunks,
            best.wall.as_secs_f64() * 1e3,
            rate,
            best.migrations,
            rate / base,
            best.sim
        );
    }
}
