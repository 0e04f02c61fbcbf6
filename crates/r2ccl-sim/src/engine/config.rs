//! What a run is given besides its DAG: the failures (when, which NIC, what kind) and the
//! engine's configuration (repair, sharing, detection delays, chunk size).

#[allow(clippy::wildcard_imports, reason = "the engine split by concern: its types are the parent's")]
use super::*;

/// How a transfer whose assigned rails are all known-failed is routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepairMode {
    /// No resilience: the transfer keeps its failed path and stalls (fail-stop CCL).
    None,
    /// Hot repair with one backup NIC: the next healthy rail (same rail on both ends).
    SingleBackup,
    /// Balance: spread over every rail usable on both ends, weighted by bandwidth.
    Spread,
}

/// What goes wrong with one NIC.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum FailureKind {
    /// Link down with an error completion: detected after `detect_error_s`.
    Down,
    /// Silent black hole: packets vanish, detected after the stall timeout.
    BlackHole,
    /// Degraded speed: the NIC keeps `fraction` of its line rate.
    Degraded {
        /// Remaining fraction of the line rate, in (0, 1).
        fraction: f64,
    },
}

/// The kinds as written in scenario files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindName {
    Down,
    BlackHole,
    Degraded,
}

/// A failure as written in a scenario file (flat, unknown keys rejected).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FailureToml {
    node: u32,
    rail: u32,
    kind: KindName,
    #[serde(default)]
    fraction: Option<f64>,
    at_s: f64,
    #[serde(default)]
    until_s: Option<f64>,
}

impl TryFrom<FailureToml> for Failure {
    type Error = String;
    fn try_from(t: FailureToml) -> Result<Self, String> {
        let kind = match (t.kind, t.fraction) {
            (KindName::Down, None) => FailureKind::Down,
            (KindName::BlackHole, None) => FailureKind::BlackHole,
            (KindName::Degraded, Some(fraction)) => FailureKind::Degraded { fraction },
            (KindName::Degraded, None) => return Err("failure kind `degraded` needs `fraction`".into()),
            (k, Some(_)) => return Err(format!("`fraction` is only for kind `degraded`, not {k:?}")),
        };
        Ok(Failure { node: t.node, rail: t.rail, kind, at_s: t.at_s, until_s: t.until_s })
    }
}

impl From<Failure> for FailureToml {
    fn from(f: Failure) -> Self {
        let (kind, fraction) = match f.kind {
            FailureKind::Down => (KindName::Down, None),
            FailureKind::BlackHole => (KindName::BlackHole, None),
            FailureKind::Degraded { fraction } => (KindName::Degraded, Some(fraction)),
        };
        Self { node: f.node, rail: f.rail, kind, fraction, at_s: f.at_s, until_s: f.until_s }
    }
}

/// One failure of NIC `rail` on `node` between `at_s` and `until_s`.
///
/// In scenario files: `{ node, rail, kind = "down" | "black_hole" | "degraded", fraction (degraded only),
/// at_s, until_s (optional) }`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "FailureToml", into = "FailureToml")]
pub struct Failure {
    /// Node index.
    pub node: u32,
    /// Rail (NIC index) on that node.
    pub rail: u32,
    /// What happens.
    pub kind: FailureKind,
    /// Start, seconds from the start of the run (negative: already failed and known at the start).
    pub at_s: f64,
    /// End (NIC back), if it comes back.
    pub until_s: Option<f64>,
}

impl Failure {
    /// A NIC that is down (and known) before the run starts.
    pub fn known_down(node: u32, rail: u32) -> Self {
        Self { node, rail, kind: FailureKind::Down, at_s: -1.0e6, until_s: None }
    }

    /// A NIC that goes down at `at_s` for good.
    pub fn down_at(node: u32, rail: u32, at_s: f64) -> Self {
        Self { node, rail, kind: FailureKind::Down, at_s, until_s: None }
    }

    /// Remaining capacity fraction while failed.
    pub fn remaining(&self) -> f64 {
        match self.kind {
            FailureKind::Down | FailureKind::BlackHole => 0.0,
            FailureKind::Degraded { fraction } => fraction,
        }
    }

    /// Check the failure against the fabric shape, naming what is wrong.
    pub fn validate(&self, fabric: &Fabric, index: usize) -> Result<(), SimError> {
        let s = fabric.spec();
        if self.node >= s.nodes {
            return Err(SimError::NoSuchComponent {
                index,
                what: format!("node {} (the fabric has {} nodes)", self.node, s.nodes),
            });
        }
        if self.rail >= s.nics_per_node {
            return Err(SimError::NoSuchComponent {
                index,
                what: format!("NIC rail {} on node {} (nodes have {} NICs)", self.rail, self.node, s.nics_per_node),
            });
        }
        if let FailureKind::Degraded { fraction } = self.kind {
            if !(fraction > 0.0 && fraction < 1.0) {
                return Err(SimError::BadFailure { index, why: format!("degraded fraction {fraction} not in (0, 1)") });
            }
        }
        if !self.at_s.is_finite() {
            return Err(SimError::BadFailure { index, why: format!("at_s {} is not finite", self.at_s) });
        }
        if let Some(u) = self.until_s {
            if !(u.is_finite() && u > self.at_s) {
                return Err(SimError::BadFailure {
                    index,
                    why: format!("until_s {u} is not after at_s {}", self.at_s),
                });
            }
        }
        Ok(())
    }
}

/// How concurrent flows share the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sharing {
    /// Weighted max-min fairness on every link (progressive filling): what a NIC does between queue pairs.
    #[default]
    MaxMin,
    /// The port model of `r2ccl_algo::simulate`, for cross-checking: every NIC uplink and downlink is a port that
    /// serves one flow at a time, a flow starts only when the ports on its path are idle (waiting flows are
    /// served in the order they started, skipping those whose ports are busy) and then runs to the end at its
    /// path's bottleneck capacity; NVLink and spine links are not shared. Queues of the DAG are not needed (a
    /// port keeps the order) and are ignored.
    Ports,
}

/// Engine settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// How transfers on known-failed rails are moved.
    pub repair: RepairMode,
    /// How concurrent flows share links.
    #[serde(default)]
    pub sharing: Sharing,
    /// Detection delay of a link-down with an error completion, seconds.
    #[serde(default = "d_err")]
    pub detect_error_s: f64,
    /// Detection delay of a silent black hole (the stall timeout), seconds.
    #[serde(default = "d_bh")]
    pub detect_blackhole_s: f64,
    /// Delay before a degraded NIC's measured bandwidth is used for weighting, seconds.
    #[serde(default = "d_deg")]
    pub detect_degraded_s: f64,
    /// Delay before a recovered NIC is trusted again (probes with hysteresis), seconds.
    #[serde(default = "d_rec")]
    pub recover_detect_s: f64,
    /// Chunk size of the replay boundary, bytes: a migrated flow resends its partially sent chunk.
    #[serde(default = "d_chunk")]
    pub replay_chunk_bytes: f64,
}

fn d_err() -> f64 {
    0.005
}
fn d_bh() -> f64 {
    0.05
}
fn d_deg() -> f64 {
    0.1
}
fn d_rec() -> f64 {
    1.0
}
fn d_chunk() -> f64 {
    4.0 * 1024.0 * 1024.0
}

impl EngineConfig {
    /// Defaults with the given repair mode.
    pub fn with_repair(repair: RepairMode) -> Self {
        Self {
            repair,
            sharing: Sharing::MaxMin,
            detect_error_s: d_err(),
            detect_blackhole_s: d_bh(),
            detect_degraded_s: d_deg(),
            recover_detect_s: d_rec(),
            replay_chunk_bytes: d_chunk(),
        }
    }
}
