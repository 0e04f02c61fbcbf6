//! r2ccl-log: logging setup for binaries, in the shape NCCL users know.
//!
//! What it does: parses a level (`R2CCL_DEBUG=WARN|INFO|DEBUG|TRACE`, like `NCCL_DEBUG`),
//! a subsystem list (`R2CCL_DEBUG_SUBSYS=INIT,NET` or `^DETECT` or `ALL`, like
//! `NCCL_DEBUG_SUBSYS`) and a file (`R2CCL_DEBUG_FILE`, `%h` = host, `%p` = pid) into a
//! [`LogSpec`], and [`init`] installs a `tracing` subscriber from it. Warnings and
//! errors are always shown; the level applies to the selected subsystems.
//!
//! Lines start with a timestamp and NCCL's `host:pid:tid` prefix. The communicator calls
//! [`init_unless_set`] when `R2CCL_DEBUG` or `R2CCL_DEBUG_FILE` is set, so the variables
//! work in any application; a subscriber the application installed first always wins.
//!
//! What it does not do: libraries never call [`init`]; they only emit events under the
//! targets of `r2ccl_core::subsys`. Reading the environment is the job of
//! `r2ccl-config`, which hands the three strings here.

mod format;

use std::fs::File;
use std::path::PathBuf;
use std::sync::Mutex;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// Why a log specification was rejected or could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Unknown level name.
    #[error("unknown log level {0:?}; allowed: ERROR, WARN, INFO, DEBUG, TRACE")]
    Level(String),
    /// Unknown subsystem name.
    #[error("unknown log subsystem {0:?}; allowed: ALL, ^NAME,... or a list of {names}", names = subsys_names())]
    Subsys(String),
    /// The log file could not be opened.
    #[error("cannot open log file {path:?}: {detail}")]
    File {
        /// The expanded path.
        path: String,
        /// The OS error.
        detail: String,
    },
    /// A global subscriber was already installed.
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled,
}

impl LogError {
    /// What values are allowed, for configuration error messages.
    pub fn allowed(&self) -> &'static str {
        match self {
            LogError::Level(_) => "ERROR, WARN, INFO, DEBUG, TRACE",
            LogError::Subsys(_) => {
                "ALL, ^NAME[,NAME...] or NAME[,NAME...] with NAME in INIT COLL P2P NET DETECT TOPO PLAN BOOTSTRAP ENV METRICS SIM"
            }
            LogError::File { .. } => "a writable path; %h is the host name, %p the pid",
            LogError::AlreadyInstalled => "one init per process",
        }
    }
}

fn subsys_names() -> String {
    r2ccl_core::subsys::ALL.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(" ")
}

/// A parsed logging specification.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogSpec {
    /// Level applied to the selected subsystems.
    pub level: Level,
    /// Tracing targets of the selected subsystems.
    pub targets: Vec<&'static str>,
    /// Log file pattern (`%h`, `%p` not yet expanded); `None` for stderr.
    pub file: Option<String>,
}

impl LogSpec {
    /// Parse the three user-facing strings; see the crate docs for the syntax.
    pub fn parse(level: &str, subsys: &str, file: &str) -> Result<Self, LogError> {
        let level = match level.trim().to_ascii_uppercase().as_str() {
            "ERROR" => Level::ERROR,
            "WARN" | "" => Level::WARN,
            "INFO" | "VERSION" => Level::INFO,
            "DEBUG" => Level::DEBUG,
            "TRACE" => Level::TRACE,
            _ => return Err(LogError::Level(level.to_owned())),
        };
        let s = subsys.trim();
        let (negate, list) = match s.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let mut named = Vec::new();
        let mut all = false;
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name.eq_ignore_ascii_case("ALL") {
                all = true;
                continue;
            }
            named.push(r2ccl_core::subsys::target_of(name).ok_or_else(|| LogError::Subsys(name.to_owned()))?);
        }
        let everything = r2ccl_core::subsys::ALL.iter().map(|(_, t)| *t);
        let targets = if negate {
            everything.filter(|t| !named.contains(t)).collect()
        } else if all || list.trim().is_empty() {
            everything.collect()
        } else {
            named
        };
        let file = if file.trim().is_empty() { None } else { Some(file.to_owned()) };
        Ok(Self { level, targets, file })
    }

    /// The filter: WARN and above everywhere, `level` for the selected subsystems.
    pub fn filter(&self) -> Targets {
        let mut t = Targets::new().with_default(Level::WARN);
        for target in &self.targets {
            t = t.with_target(*target, self.level);
        }
        t
    }
}

/// Expand `%h` (host name) and `%p` (process id) in a log file pattern.
pub fn expand_file_pattern(pattern: &str, host: &str, pid: u32) -> PathBuf {
    PathBuf::from(pattern.replace("%h", host).replace("%p", &pid.to_string()))
}

/// This machine's host name (from the kernel), or `unknown`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// Install the global subscriber for a binary. Call once, early in `main`.
pub fn init(spec: &LogSpec) -> Result<(), LogError> {
    let filter = spec.filter();
    let result = match &spec.file {
        Some(pattern) => {
            let path = expand_file_pattern(pattern, &host_name(), std::process::id());
            let file = File::options()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| LogError::File { path: path.display().to_string(), detail: e.to_string() })?;
            let layer = tracing_subscriber::fmt::layer()
                .event_format(format::Prefixed::new())
                .with_ansi(false)
                .with_writer(Mutex::new(file));
            tracing_subscriber::registry().with(layer.with_filter(filter)).try_init()
        }
        None => {
            let layer =
                tracing_subscriber::fmt::layer().event_format(format::Prefixed::new()).with_writer(std::io::stderr);
            tracing_subscriber::registry().with(layer.with_filter(filter)).try_init()
        }
    };
    result.map_err(|_| LogError::AlreadyInstalled)
}

/// For libraries: install the subscriber of `spec` unless the process has one already (its
/// own, or one installed earlier); whether this call installed it. So `R2CCL_DEBUG` works in
/// any application, as `NCCL_DEBUG` does, and an application's own subscriber always wins.
pub fn init_unless_set(spec: &LogSpec) -> Result<bool, LogError> {
    static ONCE: Mutex<bool> = Mutex::new(false);
    let mut tried = ONCE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if *tried || tracing::dispatcher::has_been_set() {
        return Ok(false);
    }
    *tried = true;
    match init(spec) {
        Ok(()) => Ok(true),
        Err(LogError::AlreadyInstalled) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use r2ccl_core::subsys;

    #[test]
    fn parses_nccl_style_specs() {
        let s = LogSpec::parse("info", "INIT,net", "").unwrap();
        assert_eq!(s.level, Level::INFO);
        assert_eq!(s.targets, vec![subsys::INIT, subsys::NET]);
        assert_eq!(s.file, None);
        let s = LogSpec::parse("TRACE", "^DETECT", "/tmp/r2ccl.%h.%p.log").unwrap();
        assert!(!s.targets.contains(&subsys::DETECT));
        assert_eq!(s.targets.len(), subsys::ALL.len() - 1);
        assert_eq!(LogSpec::parse("WARN", "ALL", "").unwrap().targets.len(), subsys::ALL.len());
        assert!(matches!(LogSpec::parse("LOUD", "ALL", ""), Err(LogError::Level(l)) if l == "LOUD"));
        assert!(matches!(LogSpec::parse("INFO", "INIT,NOPE", ""), Err(LogError::Subsys(n)) if n == "NOPE"));
    }

    #[test]
    fn file_pattern_expands_host_and_pid() {
        assert_eq!(expand_file_pattern("/tmp/x.%h.%p", "nodeA", 42), PathBuf::from("/tmp/x.nodeA.42"));
    }

    #[test]
    fn init_writes_selected_subsystems_to_the_file() {
        let dir = std::env::temp_dir().join(format!("r2ccl-log-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pattern = dir.join("log.%p.txt").display().to_string();
        let spec = LogSpec::parse("DEBUG", "NET", &pattern).unwrap();
        init(&spec).unwrap();
        tracing::debug!(target: subsys::NET, "visible-net-debug");
        tracing::debug!(target: subsys::DETECT, "hidden-detect-debug");
        tracing::warn!(target: subsys::DETECT, "visible-detect-warn");
        let text = std::fs::read_to_string(expand_file_pattern(&pattern, &host_name(), std::process::id())).unwrap();
        assert!(text.contains("visible-net-debug"), "{text}");
        assert!(text.contains("visible-detect-warn"), "{text}");
        assert!(!text.contains("hidden-detect-debug"), "{text}");
        assert!(matches!(init(&spec), Err(LogError::AlreadyInstalled)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
