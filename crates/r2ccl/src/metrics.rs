//! Metrics: every name and label r2ccl records, in one place, and the Prometheus exporter.
//!
//! Recording goes through the `metrics` facade, so nothing is exported unless the
//! process installs a recorder. [`install_prometheus`] does that when
//! `R2CCL_METRICS_ADDR` (config key `metrics.addr`) is set: it renders with
//! `metrics-exporter-prometheus` and serves `GET /metrics` from a small std HTTP thread
//! (no async runtime). Names and labels are documented in `docs/metrics.md`.

use metrics::Label;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use r2ccl_core::subsys;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Most bytes of a request (line and headers) the exporter reads.
const MAX_REQUEST: usize = 8 << 10;
/// How long one request may take to arrive, whole, and its answer to leave.
const REQUEST_DEADLINE: Duration = Duration::from_secs(2);

/// `r2ccl_nic_up{comm,host,iface,rail}`: 1 while one of this node's NICs carries traffic, 0
/// while failed (each rank exports its own node's NICs only: series grow with the node, not the
/// job).
pub const NIC_UP: &str = "r2ccl_nic_up";
/// `r2ccl_nic_bytes_total{comm,host,iface,rail,direction}`: payload bytes through a NIC (`tx` or
/// `rx`).
pub const NIC_BYTES: &str = "r2ccl_nic_bytes_total";
/// `r2ccl_nic_capacity_bytes_per_second{comm,host,iface,rail,capacity}`: a NIC's `nominal` and
/// `usable` bandwidth in the agreed health view (usable 0: failed).
pub const NIC_CAPACITY: &str = "r2ccl_nic_capacity_bytes_per_second";
/// `r2ccl_failovers_total{comm,cause,verdict}`: path migrations.
pub const FAILOVERS: &str = "r2ccl_failovers_total";
/// `r2ccl_detection_to_repair_seconds{comm}`: from the first failure signal to data flowing on
/// the backup.
pub const DETECT_TO_REPAIR: &str = "r2ccl_detection_to_repair_seconds";
/// `r2ccl_replayed_bytes_total{comm}`: bytes sent again after a migration.
pub const REPLAYED_BYTES: &str = "r2ccl_replayed_bytes_total";
/// `r2ccl_detector_verdicts_total{comm,verdict,method}`: paths the failure detector localized.
pub const DETECTOR_VERDICTS: &str = "r2ccl_detector_verdicts_total";
/// `r2ccl_collective_duration_seconds{comm,collective,strategy}`: wall time of a collective call.
pub const COLLECTIVE_DURATION: &str = "r2ccl_collective_duration_seconds";
/// `r2ccl_collective_bytes_total{comm,collective}`: the calls' sizes as nccl-tests counts them
/// (the larger of the rank's input and output).
pub const COLLECTIVE_BYTES: &str = "r2ccl_collective_bytes_total";
/// `r2ccl_collective_bus_bytes_total{comm,collective}`: the sizes times nccl-tests' bus factor
/// (AllReduce 2(n-1)/n, ...): over the duration's sum, the bus bandwidth.
pub const COLLECTIVE_BUS_BYTES: &str = "r2ccl_collective_bus_bytes_total";
/// `r2ccl_oob_messages_total{comm,channel}`: messages this rank sent on the OOB control plane.
pub const OOB_MESSAGES: &str = "r2ccl_oob_messages_total";
/// `r2ccl_health_epoch{comm}`: the agreed health epoch.
pub const HEALTH_EPOCH: &str = "r2ccl_health_epoch";
/// `r2ccl_replans_total{comm}`: plans derived again after a health change.
pub const REPLANS: &str = "r2ccl_replans_total";
/// `r2ccl_rejected_connections_total{listener}`: connections dropped for not proving the secret.
pub const REJECTED_CONNECTIONS: &str = "r2ccl_rejected_connections_total";
/// `r2ccl_malformed_messages_total{source}`: malformed or unexpected messages from peers, dropped.
pub const MALFORMED_MESSAGES: &str = "r2ccl_malformed_messages_total";
/// `r2ccl_build_info{version,ucx_built,ucx_loaded}`: 1; the r2ccl version, the UCX version it was
/// built against and the one loaded.
pub const BUILD_INFO: &str = "r2ccl_build_info";

/// `r2ccl_errors_total{kind}`: errors handed to callers, by [`crate::CommError::kind`].
pub const ERRORS: &str = "r2ccl_errors_total";

/// Every metric name, for documentation checks.
pub const ALL: &[&str] = &[
    NIC_UP,
    NIC_BYTES,
    NIC_CAPACITY,
    FAILOVERS,
    DETECT_TO_REPAIR,
    REPLAYED_BYTES,
    DETECTOR_VERDICTS,
    COLLECTIVE_DURATION,
    COLLECTIVE_BYTES,
    COLLECTIVE_BUS_BYTES,
    OOB_MESSAGES,
    HEALTH_EPOCH,
    REPLANS,
    REJECTED_CONNECTIONS,
    MALFORMED_MESSAGES,
    BUILD_INFO,
    ERRORS,
];

/// Count an error handed to a caller.
pub fn count_error(kind: &'static str) {
    metrics::counter!(ERRORS, "kind" => kind).increment(1);
}

/// Install the Prometheus exporter the configuration asks for (`metrics.addr`), once per
/// process, unless the process has a metrics recorder already (its own, or a host binary's such
/// as `r2ccl-perf`). With several ranks per host, each listens on the configured port plus its
/// local rank when the launcher gives one (`LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`,
/// `SLURM_LOCALID`, `MPI_LOCALRANKID`). A port that cannot be bound is a warning, not a failed
/// communicator: metrics are not worth a job.
pub fn install_from_config(cfg: &r2ccl_config::MetricsConfig) {
    static TRIED: std::sync::Once = std::sync::Once::new();
    if cfg.addr.is_empty() {
        return;
    }
    TRIED.call_once(|| {
        let Ok(mut addr) = cfg.addr.parse::<SocketAddr>() else {
            tracing::warn!(target: subsys::METRICS, addr = %cfg.addr, "metrics.addr is not ip:port; no exporter");
            return;
        };
        let local = ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"]
            .iter()
            .find_map(|v| std::env::var(v).ok()?.trim().parse::<u16>().ok());
        if let (Some(l), true) = (local, addr.port() != 0) {
            addr.set_port(addr.port().saturating_add(l));
        }
        match install_prometheus(addr) {
            Ok(_) => {}
            Err(MetricsError::AlreadyInstalled) => {
                tracing::debug!(target: subsys::METRICS, "a metrics recorder is installed already; metrics.addr not used");
            }
            Err(e) => tracing::warn!(target: subsys::METRICS, error = %e, "no Prometheus exporter"),
        }
    });
}

/// Record the build: this crate's version and the UCX versions built against and loaded.
pub fn set_build_info(ucx_built: &str, ucx_loaded: &str) {
    metrics::gauge!(
        BUILD_INFO,
        "version" => env!("CARGO_PKG_VERSION"),
        "ucx_built" => ucx_built.to_owned(),
        "ucx_loaded" => ucx_loaded.to_owned()
    )
    .set(1.0);
}

/// One communicator's series: the labels they carry (`comm`: the communicator's id as 16 hex
/// digits, the same on every rank of it; `host` and `iface`: this rank's node and its NICs) and the
/// calls that record them. Split communicators record apart instead of overwriting each other.
#[derive(Clone, Debug)]
pub struct CommMetrics {
    comm: String,
    host: String,
    ifaces: Vec<String>,
}

impl CommMetrics {
    /// The series of communicator `comm` on node `host`, whose NIC on rail `r` is `ifaces[r]`.
    /// Process-wide counters start at zero here, so rates and alerts see them before any
    /// error.
    pub fn new(comm: u64, host: &str, ifaces: &[String]) -> Self {
        for kind in crate::CommError::KINDS {
            metrics::counter!(ERRORS, "kind" => *kind).increment(0);
        }
        Self { comm: format!("{comm:016x}"), host: host.to_owned(), ifaces: ifaces.to_vec() }
    }

    /// The `comm` label's value.
    pub fn comm(&self) -> &str {
        &self.comm
    }

    fn nic_labels(&self, rail: u16) -> Vec<Label> {
        let iface = self.ifaces.get(usize::from(rail)).map_or("?", String::as_str);
        vec![
            Label::new("comm", self.comm.clone()),
            Label::new("host", self.host.clone()),
            Label::new("iface", iface.to_owned()),
            Label::new("rail", rail.to_string()),
        ]
    }

    fn comm_label(&self) -> Label {
        Label::new("comm", self.comm.clone())
    }

    /// Record the state of this node's NIC on `rail`.
    pub fn nic_up(&self, rail: u16, up: bool) {
        metrics::gauge!(NIC_UP, self.nic_labels(rail)).set(if up { 1.0 } else { 0.0 });
    }

    /// Count payload bytes through this node's NIC on `rail`; `tx` is true for sent bytes.
    pub fn nic_bytes(&self, rail: u16, tx: bool, bytes: u64) {
        let mut labels = self.nic_labels(rail);
        labels.push(Label::new("direction", if tx { "tx" } else { "rx" }));
        metrics::counter!(NIC_BYTES, labels).increment(bytes);
    }

    /// Record the nominal and usable bandwidth (Mbit/s) of this node's NIC on `rail`.
    pub fn nic_capacity(&self, rail: u16, nominal_mbps: u64, usable_mbps: u64) {
        for (kind, mbps) in [("nominal", nominal_mbps), ("usable", usable_mbps)] {
            let mut labels = self.nic_labels(rail);
            labels.push(Label::new("capacity", kind));
            metrics::gauge!(NIC_CAPACITY, labels).set(mbps as f64 * 1e6 / 8.0);
        }
    }

    /// Count a failover with its cause (`path_failure`, `failback`) and verdict, its pause and
    /// the bytes it sends again.
    pub fn failover(&self, cause: &'static str, verdict: &'static str, detect_to_repair_s: f64, replayed: u64) {
        metrics::counter!(
            FAILOVERS,
            vec![self.comm_label(), Label::new("cause", cause), Label::new("verdict", verdict)]
        )
        .increment(1);
        metrics::histogram!(DETECT_TO_REPAIR, vec![self.comm_label()]).record(detect_to_repair_s);
        metrics::counter!(REPLAYED_BYTES, vec![self.comm_label()]).increment(replayed);
    }

    /// Count a path the failure detector localized, with its verdict and how it found it.
    pub fn verdict(&self, verdict: &'static str, method: &'static str) {
        let labels = vec![self.comm_label(), Label::new("verdict", verdict), Label::new("method", method)];
        metrics::counter!(DETECTOR_VERDICTS, labels).increment(1);
    }

    /// Record a finished collective: its name, strategy, wall time, size (nccl-tests' size) and
    /// bus factor.
    pub fn collective(&self, collective: &'static str, strategy: &'static str, seconds: f64, bytes: u64, bus: f64) {
        let c = || vec![self.comm_label(), Label::new("collective", collective)];
        let mut timed = c();
        timed.push(Label::new("strategy", strategy));
        metrics::histogram!(COLLECTIVE_DURATION, timed).record(seconds);
        metrics::counter!(COLLECTIVE_BYTES, c()).increment(bytes);
        metrics::counter!(COLLECTIVE_BUS_BYTES, c()).increment((bytes as f64 * bus) as u64);
    }

    /// Count `n` OOB messages sent on `channel`.
    pub fn oob_messages(&self, channel: &'static str, n: u64) {
        metrics::counter!(OOB_MESSAGES, vec![self.comm_label(), Label::new("channel", channel)]).increment(n);
    }

    /// Record the agreed health epoch, and count the re-plan it caused when `replanned`.
    pub fn epoch(&self, epoch: u64, replanned: bool) {
        metrics::gauge!(HEALTH_EPOCH, vec![self.comm_label()]).set(epoch as f64);
        let replans = metrics::counter!(REPLANS, vec![self.comm_label()]);
        if replanned {
            replans.increment(1);
        }
    }
}

/// Count rejected connections on a listener (`bootstrap`, `oob`, `data`).
pub fn count_rejected(listener: &'static str, n: u64) {
    metrics::counter!(REJECTED_CONNECTIONS, "listener" => listener).increment(n);
}

/// Count malformed messages from a source (`oob`, `chunk_header`, ...).
pub fn count_malformed(source: &'static str, n: u64) {
    metrics::counter!(MALFORMED_MESSAGES, "source" => source).increment(n);
}

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be bound.
    #[error("metrics.addr {addr}: cannot listen: {source}")]
    Bind {
        /// The configured address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another recorder is already installed in this process.
    #[error("a metrics recorder is already installed in this process")]
    AlreadyInstalled,
}

/// Install the Prometheus recorder and serve `/metrics` on `addr` from a background
/// thread. Returns the bound address (useful with port 0) and the render handle.
pub fn install_prometheus(addr: SocketAddr) -> Result<(SocketAddr, PrometheusHandle), MetricsError> {
    let listener = TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(|source| MetricsError::Bind { addr, source })?;
    let recorder = PrometheusBuilder::new()
        .set_buckets(&[1e-4, 1e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0])
        .map_err(|_| MetricsError::AlreadyInstalled)?
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).map_err(|_| MetricsError::AlreadyInstalled)?;
    let served = handle.clone();
    std::thread::Builder::new()
        .name("r2ccl-metrics".into())
        .spawn(move || serve(&listener, &served))
        .map_err(|source| MetricsError::Bind { addr, source })?;
    tracing::info!(target: subsys::METRICS, %bound, "Prometheus exporter listening");
    Ok((bound, handle))
}

/// The request line of a request that arrived whole (up to the blank line) within
/// [`REQUEST_DEADLINE`] and [`MAX_REQUEST`] bytes; `None` for anything slower, longer or broken
/// (a slow-drip client holds the exporter for the deadline at most).
fn read_request(stream: &mut TcpStream) -> Option<String> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut buf: Vec<u8> = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        match request_line(&buf) {
            Request::Complete(line) => return Some(line),
            Request::TooLong => return None,
            Request::Partial => {}
        }
        let left = deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())?;
        stream.set_read_timeout(Some(left)).ok()?;
        let n = stream.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// What the bytes of a request received so far amount to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// Not yet the blank line that ends the headers.
    Partial,
    /// A whole request: its first line.
    Complete(String),
    /// More than [`MAX_REQUEST`] bytes: dropped.
    TooLong,
}

/// Parse the bytes received so far (sans-IO, so it can be fuzzed). Never panics.
pub(crate) fn request_line(buf: &[u8]) -> Request {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").or_else(|| buf.windows(2).position(|w| w == b"\n\n"));
    match end {
        Some(at) if at <= MAX_REQUEST => {
            let text = String::from_utf8_lossy(&buf[..at]);
            Request::Complete(text.lines().next().unwrap_or("").to_owned())
        }
        Some(_) => Request::TooLong,
        None if buf.len() > MAX_REQUEST => Request::TooLong,
        None => Request::Partial,
    }
}

fn serve(listener: &TcpListener, handle: &PrometheusHandle) {
    let mut backoff = Duration::from_millis(10);
    for stream in listener.incoming() {
        let mut stream = match stream {
            Ok(s) => {
                backoff = Duration::from_millis(10);
                s
            }
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin.
                tracing::debug!(target: subsys::METRICS, error = %e, "accept failed");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let Some(first) = read_request(&mut stream) else { continue };
        let _ = stream.set_write_timeout(Some(REQUEST_DEADLINE));
        let (status, body) = if first.starts_with("GET /metrics") || first.starts_with("GET / ") {
            ("200 OK", handle.render())
        } else {
            ("404 Not Found", String::from("try /metrics\n"))
        };
        let reply = format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        // A scraper that went away is not our problem; the next scrape gets a fresh answer.
        let _ = stream.write_all(reply.as_bytes());
        handle.run_upkeep();
    }
}
