//! The metrics endpoint under strangers: a slow-drip client, a silent one and an oversized request
//! each hold it for at most the request deadline (2 s), and a scrape afterwards is answered.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on any error")]

use r2ccl::metrics;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn scrape(addr: std::net::SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn strangers_hold_the_metrics_endpoint_for_the_deadline_at_most() {
    let (addr, _handle) = metrics::install_prometheus("127.0.0.1:0".parse().unwrap()).unwrap();
    metrics::CommMetrics::new(7, "gpu07", &["eth0".to_owned()]).nic_up(0, true);
    assert!(scrape(addr).contains("r2ccl_nic_up"));

    // Silent, then slow-drip: each is dropped at the deadline, and the scrape behind them waits
    // for no more than the two deadlines.
    let silent = TcpStream::connect(addr).unwrap();
    let drip = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        for b in b"GET /metrics HTTP/1.0\r\n".iter().cycle().take(40) {
            if s.write_all(&[*b]).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    });
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let body = scrape(addr);
    let waited = t.elapsed();
    assert!(body.contains("r2ccl_nic_up"), "{body}");
    assert!(waited < Duration::from_millis(5500), "the scrape waited {waited:?} behind a silent and a slow client");
    assert!(drip.join().unwrap(), "the slow-drip client was cut off");
    drop(silent);

    // An oversized request is cut off, not read to the end.
    let mut big = TcpStream::connect(addr).unwrap();
    big.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let header = format!("GET /metrics HTTP/1.0\r\nX-Junk: {}\r\n", "a".repeat(4096));
    let mut cut = false;
    for _ in 0..64 {
        if big.write_all(header.as_bytes()).is_err() {
            cut = true;
            break;
        }
    }
    let mut rest = Vec::new();
    let _ = big.set_read_timeout(Some(Duration::from_secs(5)));
    let answered = big.read_to_end(&mut rest).map(|n| n > 0).unwrap_or(false);
    assert!(cut || !answered, "a 256 KiB request was answered: {}", String::from_utf8_lossy(&rest));
    assert!(scrape(addr).contains("r2ccl_nic_up"));
}
