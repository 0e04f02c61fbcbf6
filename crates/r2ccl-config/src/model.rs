//! The typed configuration: one struct per section, defaults, and range validation.

use crate::ConfigError;
use serde::{Deserialize, Serialize};

/// The whole configuration. Defaults need no file and no environment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Logging (`[log]`).
    pub log: LogConfig,
    /// Bootstrap and out-of-band channel (`[bootstrap]`).
    pub bootstrap: BootstrapConfig,
    /// Data transport (`[transport]`).
    pub transport: TransportConfig,
    /// Failure detection and recovery (`[detect]`).
    pub detect: DetectConfig,
    /// Planning (`[policy]`).
    pub policy: PolicyConfig,
    /// Topology sources (`[topo]`).
    pub topo: TopoConfig,
    /// Metrics export (`[metrics]`).
    pub metrics: MetricsConfig,
    /// `R2CCL_*` variables of the environment this version does not know (another version's, or
    /// a typo), each with why; ignored. Not a key: the communicator logs each at WARN.
    #[serde(skip)]
    pub ignored_env: Vec<String>,
}

/// `[log]`: what is logged and where (as `NCCL_DEBUG*`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `ERROR`, `WARN`, `INFO`, `DEBUG` or `TRACE` (`R2CCL_DEBUG`).
    pub level: String,
    /// Comma-separated subsystems, `ALL`, or `^A,B` for all but A and B (`R2CCL_DEBUG_SUBSYS`).
    pub subsys: String,
    /// Log file path with `%h` (host) and `%p` (pid); empty for stderr (`R2CCL_DEBUG_FILE`).
    pub file: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { level: "WARN".into(), subsys: "ALL".into(), file: String::new() }
    }
}

/// `[bootstrap]`: rendezvous, OOB control channel and peer liveness.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BootstrapConfig {
    /// Interface for bootstrap and OOB traffic; empty picks a non-data interface (`R2CCL_OOB_IFACE`).
    pub oob_iface: String,
    /// Node identity; empty uses the host name (`R2CCL_NODE`).
    pub node: String,
    /// Deadline for rendezvous and connection setup, ms.
    pub connect_timeout_ms: u64,
    /// A peer silent on the OOB channel for this long is declared dead, ms.
    pub peer_timeout_ms: u64,
}

impl Default for BootstrapConfig {
    fn default() -> Self {
        Self { oob_iface: String::new(), node: String::new(), connect_timeout_ms: 30_000, peer_timeout_ms: 10_000 }
    }
}

/// `[transport]`: data NICs and chunking.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransportConfig {
    /// Data NIC interface names; empty discovers them (`R2CCL_NICS=if0,if1`).
    pub nics: Vec<String>,
    /// Chunk size: the unit of transfer, striping and replay, bytes.
    pub chunk_bytes: u64,
    /// Chunks in flight per path.
    pub max_inflight_chunks: u32,
    /// Rate of every data NIC for the planner, Mbit/s; 0 reads each NIC's speed from sysfs
    /// (100000 where the driver reports none). Set it where the driver's figure is not the
    /// real rate (shaped or virtual links).
    pub nic_speed_mbps: u64,
    /// Receive segment of UCX's TCP transport, bytes (`UCX_TCP_RX_SEG_SIZE`): the largest
    /// active message, so a rendezvous payload arrives in pieces of this size.
    pub tcp_rx_segment_bytes: u64,
    /// Page-locked host memory a communicator stages device buffers through, bytes (four
    /// slots; a device collective runs in segments of a quarter of this). Must be equal on
    /// every rank: the segments are collectives of their own.
    pub device_staging_bytes: u64,
    /// Bytes of each of the two registered slots a large collective on caller memory (blocking
    /// or not) runs through in segments (a call larger than both slots is cut); 0: calls run
    /// whole.
    /// Must be equal on every rank: the segments are collectives of their own.
    pub host_segment_bytes: u64,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            nics: Vec::new(),
            chunk_bytes: 1 << 20,
            max_inflight_chunks: 8,
            nic_speed_mbps: 0,
            tcp_rx_segment_bytes: 1 << 20,
            device_staging_bytes: 32 << 20,
            host_segment_bytes: 16 << 20,
        }
    }
}

/// `[detect]`: detection, localization and recovery timing (mirrors `r2ccl_detect::DetectConfig`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DetectConfig {
    /// Margin over a transfer's expected time before its path is suspected, ms.
    pub progress_margin_ms: u64,
    /// Heartbeat period on idle paths, ms.
    pub heartbeat_interval_ms: u64,
    /// Missed heartbeats before an idle path is suspected.
    pub heartbeat_misses: u32,
    /// Probe timeout (one probe round), ms.
    pub probe_timeout_ms: u64,
    /// How long localization waits for the probe reports of all three points, ms.
    pub localize_timeout_ms: u64,
    /// Resend period of unacknowledged OOB protocol messages, ms.
    pub oob_retry_ms: u64,
    /// Resends of one OOB message before its peer is reported unreachable.
    pub oob_max_retries: u32,
    /// Re-probe period of failed components, ms.
    pub probe_interval_ms: u64,
    /// Consecutive good probes before a component is healthy again.
    pub good_probes: u32,
    /// First hold-down of a flapping component, ms (doubles per flap).
    pub holddown_base_ms: u64,
    /// Longest hold-down, ms.
    pub holddown_max_ms: u64,
    /// Window over which failures count as flaps, ms.
    pub flap_window_ms: u64,
    /// How long a transfer may wait for a usable path (every path to its peer failed, e.g. a
    /// silent black hole on the last common rail) before its collective fails, ms.
    pub no_path_timeout_ms: u64,
}

impl Default for DetectConfig {
    fn default() -> Self {
        Self {
            progress_margin_ms: 20,
            heartbeat_interval_ms: 250,
            heartbeat_misses: 4,
            probe_timeout_ms: 10,
            localize_timeout_ms: 50,
            oob_retry_ms: 20,
            oob_max_retries: 50,
            probe_interval_ms: 100,
            good_probes: 3,
            holddown_base_ms: 200,
            holddown_max_ms: 5_000,
            flap_window_ms: 10_000,
            no_path_timeout_ms: 8_000,
        }
    }
}

/// `[policy]`: strategy choice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// `auto` (the cost model chooses) or a forced strategy: `ring`, `single_backup`,
    /// `balance`, `r2ccl_allreduce`, `recursive`, `four_stage`.
    pub strategy: String,
    /// Allow the planner to reorder nodes in rings after failures.
    pub rerank: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self { strategy: "auto".into(), rerank: true }
    }
}

/// Strategy names accepted by `policy.strategy`.
pub(crate) const STRATEGIES: &[&str] =
    &["auto", "ring", "single_backup", "balance", "r2ccl_allreduce", "recursive", "four_stage", "four_stage_direct"];

/// `[topo]`: topology description files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopoConfig {
    /// Static topology TOML that overrides discovery; empty for none (`R2CCL_TOPO_FILE`).
    pub file: String,
    /// Where a communicator writes the merged cluster view at init; empty for nowhere (`R2CCL_TOPO_DUMP_FILE`).
    pub dump_file: String,
}

/// `[metrics]`: Prometheus export.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` for the Prometheus exporter; empty disables it (`R2CCL_METRICS_ADDR`).
    pub addr: String,
}

fn range<T: PartialOrd + std::fmt::Display>(key: &str, v: T, lo: T, hi: T, unit: &str) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError::OutOfRange {
            key: key.into(),
            value: v.to_string(),
            allowed: format!("{lo}..={hi}{unit}"),
        });
    }
    Ok(())
}

impl Config {
    /// The defaults with every list non-empty, so that walking its serialized form finds
    /// every key (empty lists vanish when serialized into `config` values).
    pub(crate) fn key_probe() -> Self {
        let mut c = Self::default();
        c.transport.nics.push(String::new());
        c
    }

    /// Check every value's range and syntax; the first problem is returned.
    pub fn validate(&self) -> Result<(), ConfigError> {
        r2ccl_log::LogSpec::parse(&self.log.level, &self.log.subsys, &self.log.file).map_err(|e| {
            let (key, value) = match &e {
                r2ccl_log::LogError::Level(v) => ("log.level", v.clone()),
                r2ccl_log::LogError::Subsys(v) => ("log.subsys", v.clone()),
                _ => ("log.file", self.log.file.clone()),
            };
            ConfigError::OutOfRange { key: key.into(), value: format!("{value:?}"), allowed: e.allowed().into() }
        })?;
        let b = &self.bootstrap;
        range("bootstrap.connect_timeout_ms", b.connect_timeout_ms, 100, 3_600_000, " ms")?;
        range("bootstrap.peer_timeout_ms", b.peer_timeout_ms, 100, 600_000, " ms")?;
        let t = &self.transport;
        range("transport.chunk_bytes", t.chunk_bytes, 4096, 1 << 30, " bytes")?;
        if !t.chunk_bytes.is_power_of_two() {
            return Err(ConfigError::OutOfRange {
                key: "transport.chunk_bytes".into(),
                value: t.chunk_bytes.to_string(),
                allowed: "a power of two".into(),
            });
        }
        range("transport.max_inflight_chunks", t.max_inflight_chunks, 1, 1024, "")?;
        range("transport.tcp_rx_segment_bytes", t.tcp_rx_segment_bytes, 8192, 1 << 26, " bytes")?;
        range("transport.device_staging_bytes", t.device_staging_bytes, 1 << 16, 1 << 32, " bytes")?;
        if t.host_segment_bytes != 0 {
            range(
                "transport.host_segment_bytes",
                t.host_segment_bytes,
                1 << 16,
                1 << 32,
                " bytes (or 0: no segments)",
            )?;
        }
        if t.nic_speed_mbps != 0 {
            range("transport.nic_speed_mbps", t.nic_speed_mbps, 1, 100_000_000, " Mbit/s (or 0: from sysfs)")?;
        }
        for (i, nic) in t.nics.iter().enumerate() {
            if nic.is_empty() || nic.len() > 15 || nic.contains(['/', ' ', ':']) {
                return Err(ConfigError::OutOfRange {
                    key: format!("transport.nics[{i}]"),
                    value: format!("{nic:?}"),
                    allowed: "a Linux interface name (1-15 characters, no '/', ':' or space)".into(),
                });
            }
        }
        let d = &self.detect;
        range("detect.progress_margin_ms", d.progress_margin_ms, 1, 60_000, " ms")?;
        range("detect.heartbeat_interval_ms", d.heartbeat_interval_ms, 1, 60_000, " ms")?;
        range("detect.heartbeat_misses", d.heartbeat_misses, 1, 100, "")?;
        range("detect.probe_timeout_ms", d.probe_timeout_ms, 1, 60_000, " ms")?;
        range("detect.localize_timeout_ms", d.localize_timeout_ms, d.probe_timeout_ms, 600_000, " ms")?;
        range("detect.oob_retry_ms", d.oob_retry_ms, 1, 60_000, " ms")?;
        range("detect.oob_max_retries", d.oob_max_retries, 1, 10_000, "")?;
        range("detect.probe_interval_ms", d.probe_interval_ms, 1, 3_600_000, " ms")?;
        range("detect.good_probes", d.good_probes, 1, 1000, "")?;
        range("detect.holddown_base_ms", d.holddown_base_ms, 1, 3_600_000, " ms")?;
        range("detect.holddown_max_ms", d.holddown_max_ms, d.holddown_base_ms, 86_400_000, " ms")?;
        range("detect.flap_window_ms", d.flap_window_ms, 1, 86_400_000, " ms")?;
        range("detect.no_path_timeout_ms", d.no_path_timeout_ms, 1, 3_600_000, " ms")?;
        if !STRATEGIES.contains(&self.policy.strategy.as_str()) {
            return Err(ConfigError::OutOfRange {
                key: "policy.strategy".into(),
                value: format!("{:?}", self.policy.strategy),
                allowed: STRATEGIES.join(", "),
            });
        }
        if !self.metrics.addr.is_empty() && self.metrics.addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::OutOfRange {
                key: "metrics.addr".into(),
                value: format!("{:?}", self.metrics.addr),
                allowed: "empty, or ip:port such as 127.0.0.1:9400".into(),
            });
        }
        Ok(())
    }
}
