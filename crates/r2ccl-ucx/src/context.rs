//! One UCP context per NIC: configured through `ucp_config_modify` (never the process environment).

use crate::error::{Status, UcxError};
use r2ccl_ucx_sys as sys;
use std::ffi::CString;
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

/// TCP keepalive tuning for idle connections (`UCX_TCP_KEEPIDLE`, `UCX_TCP_KEEPINTVL`, `UCX_TCP_KEEPCNT`;
/// whole seconds, rounded up).
///
/// Measured on UCX 1.13 (TESTBED.md): 1 s / 1 s / 3 turns a dead idle peer into an endpoint error after
/// about 3.2 s. It does nothing while data is unacknowledged; that is what request deadlines are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepAlive {
    /// Idle time before the first probe.
    pub idle: Duration,
    /// Time between probes.
    pub interval: Duration,
    /// Unanswered probes before the connection is declared dead.
    pub count: u32,
}

impl Default for KeepAlive {
    fn default() -> Self {
        Self { idle: Duration::from_secs(1), interval: Duration::from_secs(1), count: 3 }
    }
}

/// How one NIC's context is set up. The library sets everything UCX needs here; users do not have to
/// export `UCX_*` variables (any they do export are read first and then overridden by these values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextConfig {
    /// The network interface this context may use (`UCX_NET_DEVICES`), e.g. `eth0`, `rail1`, `lo`.
    pub device: String,
    /// Transports (`UCX_TLS`). `tcp` for rails: with shared-memory transports allowed, processes of one
    /// host (even in different network namespaces) would bypass the NICs.
    pub transports: String,
    /// TCP keepalive of idle connections; `None` leaves UCX's defaults.
    pub keepalive: Option<KeepAlive>,
    /// Size of the TCP transport's receive segments (`UCX_TCP_RX_SEG_SIZE`), which also caps its
    /// active messages, the fragments of a rendezvous payload; `None` leaves UCX's 64 KiB.
    /// [`DEFAULT_RX_SEGMENT`] by default: on loopback, 4 ranks' 64 MiB AllReduce ran at 0.94-0.97
    /// GB/s bus bandwidth with 1 MiB segments against 0.69-0.71 with 64 KiB (fewer, larger
    /// receives and copies); 4 MiB and 16 MiB were no better.
    pub rx_segment: Option<usize>,
    /// Further `(key, value)` settings passed to `ucp_config_modify` verbatim (keys without `UCX_`).
    pub extra: Vec<(String, String)>,
    /// The id the endpoints of this context's worker present when they connect (the worker's
    /// client id, sent with each connection request); `None`: none. A listener that admits only
    /// known ids ([`crate::Worker::admit_only`]) refuses a connection without one.
    pub client_id: Option<u64>,
}

impl ContextConfig {
    /// TCP only, restricted to `device`, UCX's own keepalive defaults.
    ///
    /// Short TCP keepalive timers are not set: the library detects dead paths itself (progress
    /// deadlines, probes, heartbeats), and with `KEEPIDLE=1s KEEPINTVL=1s KEEPCNT=3` a silent
    /// black hole on one rail made UCX 1.13 stop reading the healthy rail's connections to the
    /// same peer once the dead connection timed out (3 of 6 namespace runs hung; 0 of 6 without).
    pub fn tcp(device: impl Into<String>) -> Self {
        Self {
            device: device.into(),
            transports: "tcp".into(),
            keepalive: None,
            rx_segment: Some(DEFAULT_RX_SEGMENT),
            extra: Vec::new(),
            client_id: None,
        }
    }

    /// Every `(key, value)` this config sets, in the order they are applied.
    pub fn settings(&self) -> Vec<(String, String)> {
        let mut out =
            vec![("TLS".to_owned(), self.transports.clone()), ("NET_DEVICES".to_owned(), self.device.clone())];
        if let Some(k) = self.keepalive {
            // TCP transport keys go out without their table prefix (`KEEPIDLE`, not `TCP_KEEPIDLE`:
            // UCX 1.13 accepts the prefixed form, warns "invalid configuration" and ignores it);
            // `Context::new` retries one that the UCX loaded refuses bare with its prefix (UCX 1.22
            // takes only `TCP_KEEPIDLE`). The kernel takes whole seconds, so round up.
            out.push(("KEEPIDLE".into(), format!("{}s", whole_seconds(k.idle))));
            out.push(("KEEPINTVL".into(), format!("{}s", whole_seconds(k.interval))));
            out.push(("KEEPCNT".into(), k.count.to_string()));
        }
        if let Some(b) = self.rx_segment {
            out.push(("RX_SEG_SIZE".into(), b.to_string()));
        }
        // No TCP RMA lane: on point-to-point endpoints UCX 1.13 would send rendezvous payloads as TCP
        // PUT zcopy, which made the fault-free 16 MiB AllReduce on the 4 x 2 testbed 8% slower (1189-1200
        // ms against 1065 ms with PUT off, `cargo xtask bench --part strategies`, 2026-12-04); without it
        // they go as active messages of `rx_segment` bytes.
        out.push(("PUT_ENABLE".into(), "n".into()));
        // UCP's protocol selection of UCX 1.13 (its default there; 1.22's is the newer one): over TCP
        // on loopback, 4 ranks x 2 NICs, the 64 MiB AllReduce ran at 0.37-0.40 GB/s bus bandwidth on
        // UCX 1.22 with the newer selection and 0.61 with this one (1.13: 0.54; 2026-12-06).
        out.push(("PROTO_ENABLE".into(), "n".into()));
        out.extend(self.extra.iter().cloned());
        out
    }
}

/// The TCP receive segment [`ContextConfig::tcp`] sets: 1 MiB.
pub const DEFAULT_RX_SEGMENT: usize = 1 << 20;

/// `d` in whole seconds, rounded up, at least 1.
fn whole_seconds(d: Duration) -> u64 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.max(1)
}

/// The keys [`ContextConfig::settings`] sets that belong to UCX's TCP transport table: UCX 1.13
/// takes them bare through `ucp_config_modify`, UCX 1.22 only with this prefix.
const TCP_TABLE_KEYS: [&str; 5] = ["KEEPIDLE", "KEEPINTVL", "KEEPCNT", "RX_SEG_SIZE", "PUT_ENABLE"];
/// The TCP transport table's prefix.
const TCP_TABLE_PREFIX: &str = "TCP_";

/// The UCX library loaded in this process, as `ucp_get_version` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct UcxVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Release number.
    pub release: u32,
}

impl UcxVersion {
    /// The version of the UCX library this process loaded.
    pub fn loaded() -> Self {
        let (mut major, mut minor, mut release) = (0, 0, 0);
        // SAFETY: ucp_get_version only writes the three integers it is given.
        unsafe { sys::ucp_get_version(&mut major, &mut minor, &mut release) };
        Self { major, minor, release }
    }

    /// The version r2ccl-ucx-sys was built against (its `ucx.pc`), if it parses.
    pub fn built() -> Option<Self> {
        let mut parts = sys::BUILT_UCX_VERSION.split('.').map(str::parse::<u32>);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(Ok(major)), Some(Ok(minor)), release) => {
                Some(Self { major, minor, release: release.and_then(Result::ok).unwrap_or(0) })
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for UcxVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.release)
    }
}

/// Opt-in to run with a UCX other than the one built against (another minor version).
pub const ALLOW_MISMATCH_ENV: &str = "R2CCL_UCX_ALLOW_MISMATCH";

/// Say once per process which UCX is loaded; refuse one whose major.minor differs from the one
/// built against (a binary that found another UCX by accident), unless [`ALLOW_MISMATCH_ENV`] is
/// `1`, which turns it into a warning.
fn check_version() -> Result<(), UcxError> {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let loaded = UcxVersion::loaded();
    let dir = sys::BUILT_UCX_LIBDIR;
    let mismatch = UcxVersion::built().filter(|b| (b.major, b.minor) != (loaded.major, loaded.minor));
    let allowed = std::env::var(ALLOW_MISMATCH_ENV).is_ok_and(|v| v == "1");
    if let (Some(b), false) = (mismatch, allowed) {
        return Err(UcxError::VersionMismatch { loaded: loaded.to_string(), built: b.to_string(), libdir: dir.into() });
    }
    ONCE.call_once(|| match mismatch {
        Some(b) => tracing::warn!(
            target: r2ccl_core::subsys::INIT,
            %loaded,
            built = %b,
            built_libdir = dir,
            "running with a UCX other than the one r2ccl was built against ({ALLOW_MISMATCH_ENV}=1)"
        ),
        None => tracing::info!(target: r2ccl_core::subsys::INIT, %loaded, built = sys::BUILT_UCX_VERSION, built_libdir = dir, "UCX"),
    });
    Ok(())
}

/// Frees a `ucp_config_t` on every path out of [`Context::new`].
struct ConfigGuard(*mut sys::ucp_config_t);

impl Drop for ConfigGuard {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful ucp_config_read and is released exactly once.
        unsafe { sys::ucp_config_release(self.0) }
    }
}

fn c_string(key: &str, value: &str) -> Result<CString, UcxError> {
    CString::new(value).map_err(|_| UcxError::InvalidConfig {
        key: key.to_owned(),
        value: value.to_owned(),
        why: "contains a NUL byte",
    })
}

/// A UCP context (`ucp_context_h`) restricted to one NIC, with the TAG feature.
///
/// Shared (`Arc`) by the NIC's worker and by every memory region mapped in it, so it is cleaned up last.
#[derive(Debug)]
pub struct Context {
    handle: sys::ucp_context_h,
    config: ContextConfig,
}

// SAFETY: the context is created with `mt_workers_shared = 1`, so UCX serializes context-level calls
// (ucp_mem_map/unmap, worker creation) internally; the handle itself is an opaque pointer.
unsafe impl Send for Context {}
// SAFETY: as above; no method takes `&mut self` state that is not protected by UCX's context lock.
unsafe impl Sync for Context {}

impl Context {
    /// Create a context as `config` says.
    pub fn new(config: ContextConfig) -> Result<Arc<Self>, UcxError> {
        if config.device.is_empty() {
            return Err(UcxError::InvalidConfig {
                key: "NET_DEVICES".into(),
                value: String::new(),
                why: "a context must be restricted to one NIC",
            });
        }
        let mut raw_config: *mut sys::ucp_config_t = ptr::null_mut();
        // SAFETY: null prefix and file mean "UCX_ prefix, no file"; raw_config is a valid out pointer.
        let status = Status(unsafe { sys::ucp_config_read(ptr::null(), ptr::null(), &mut raw_config) });
        status.check("ucp_config_read")?;
        let guard = ConfigGuard(raw_config);
        check_version()?;
        for (key, value) in config.settings() {
            let v = c_string(&key, &value)?;
            let modify = |key: &str| -> Result<Status, UcxError> {
                let k = c_string(key, key)?;
                // SAFETY: guard.0 is a live config; k and v are NUL-terminated and outlive the call.
                Ok(Status(unsafe { sys::ucp_config_modify(guard.0, k.as_ptr(), v.as_ptr()) }))
            };
            let mut status = modify(&key)?;
            if status.0 == sys::UCS_ERR_INVALID_PARAM && TCP_TABLE_KEYS.contains(&key.as_str()) {
                status = modify(&format!("{TCP_TABLE_PREFIX}{key}"))?;
            }
            if !status.is_ok() {
                return Err(UcxError::Status {
                    op: "ucp_config_modify",
                    status,
                    message: format!("{} (setting {key}={value})", status.message()),
                });
            }
        }
        // SAFETY: ucp_params_t is a plain C struct; all-zero is its documented "no fields" state.
        let mut params: sys::ucp_params_t = unsafe { std::mem::zeroed() };
        params.field_mask = u64::from(sys::UCP_PARAM_FIELD_FEATURES | sys::UCP_PARAM_FIELD_MT_WORKERS_SHARED);
        // WAKEUP: an idle progress thread sleeps on the workers' event fds instead of spinning.
        params.features = u64::from(sys::UCP_FEATURE_TAG | sys::UCP_FEATURE_WAKEUP);
        params.mt_workers_shared = 1;
        let mut handle: sys::ucp_context_h = ptr::null_mut();
        // SAFETY: params and the config are valid for the call; handle is a valid out pointer.
        let status = Status(unsafe { sys::ucp_init(&params, guard.0, &mut handle) });
        drop(guard);
        if !status.is_ok() {
            return Err(UcxError::Status {
                op: "ucp_init",
                status,
                message: format!("{} (device {}, transports {})", status.message(), config.device, config.transports),
            });
        }
        tracing::debug!(target: r2ccl_core::subsys::NET, device = %config.device, "UCP context created");
        Ok(Arc::new(Self { handle, config }))
    }

    /// The configuration this context was created with.
    pub fn config(&self) -> &ContextConfig {
        &self.config
    }

    /// The NIC this context is restricted to.
    pub fn device(&self) -> &str {
        &self.config.device
    }

    pub(crate) fn raw(&self) -> sys::ucp_context_h {
        self.handle
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: workers and memory maps hold an Arc to this context, so none is left when it drops;
        // the handle came from a successful ucp_init and is cleaned up once.
        unsafe { sys::ucp_cleanup(self.handle) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_restrict_to_one_tcp_device_and_round_keepalive_up_to_whole_seconds() {
        let mut c = ContextConfig::tcp("rail1");
        c.keepalive = Some(KeepAlive { idle: Duration::from_millis(1500), interval: Duration::ZERO, count: 5 });
        c.extra.push(("RNDV_THRESH".into(), "64k".into()));
        let s = c.settings();
        let expect: Vec<(String, String)> = [
            ("TLS", "tcp"),
            ("NET_DEVICES", "rail1"),
            ("KEEPIDLE", "2s"),
            ("KEEPINTVL", "1s"),
            ("KEEPCNT", "5"),
            ("RX_SEG_SIZE", "1048576"),
            ("PUT_ENABLE", "n"),
            ("PROTO_ENABLE", "n"),
            ("RNDV_THRESH", "64k"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        assert_eq!(s, expect);
        c.keepalive = None;
        c.rx_segment = None;
        assert_eq!(c.settings().len(), 5);
    }
}
