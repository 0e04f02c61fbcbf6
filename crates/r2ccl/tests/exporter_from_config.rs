//! A communicator installs the Prometheus exporter `metrics.addr` asks for (once per process,
//! without the host program calling `install_prometheus`), and errors handed to callers are
//! counted by kind (`r2ccl_errors_total`).
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

mod common;

use r2ccl::{CommError, ReduceOp};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn scrape(addr: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn a_communicator_serves_the_metrics_its_config_names_and_counts_errors_by_kind() {
    let port = r2ccl::bootstrap::free_port_outside_ephemeral_range(std::net::Ipv4Addr::LOCALHOST.into()).unwrap();
    let addr = format!("127.0.0.1:{port}");
    let mut config = common::config(5_000);
    config.metrics.addr = addr.clone();
    let threads = common::spawn_ranks_with(2, config, |me, comm| {
        let mut x = vec![me as f32 + 1.0; 1024];
        comm.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        assert!(x.iter().all(|&v| v == 3.0), "rank {me}: {}", x[0]);
        // Mismatched counts: every rank gets a named error, and the exporter counts it.
        let mut y = vec![1f32; 16 + me as usize];
        let err = comm.all_reduce_in_place(&mut y, ReduceOp::Sum).unwrap_err();
        assert!(matches!(err, CommError::Mismatch { .. }), "rank {me}: {err:?}");
    });
    for t in threads {
        t.join().unwrap();
    }
    let text = scrape(&addr);
    assert!(text.contains("r2ccl_build_info"), "{text}");
    assert!(text.contains("r2ccl_collective_duration_seconds"), "{text}");
    assert!(text.contains("r2ccl_errors_total{kind=\"mismatch\"} 2"), "{text}");
}
