//! What a finished call reports besides its data: [`CollReport`], [`Schedule`], [`CommEvent`].

use r2ccl_policy::Strategy;
use std::fmt;

/// How a call was scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Schedule {
    /// The planner's strategy (r2ccl-policy), chosen from the agreed health view, or the one
    /// `policy.strategy` forces when it applies.
    Planned(Strategy),
    /// A layout the planner does not model (ranks not numbered node by node, or uneven nodes):
    /// a latency-optimal tree for messages under 64 KiB.
    FallbackTree,
    /// A layout the planner does not model: a ring whose NIC shares follow bandwidth.
    FallbackBalance,
    /// A grouped point-to-point step, sends split over the NICs by bandwidth.
    Group,
}

impl Schedule {
    /// The snake_case name used in logs, metrics and r2ccl-perf's output.
    pub const fn name(self) -> &'static str {
        match self {
            Schedule::Planned(s) => s.name(),
            Schedule::FallbackTree => "tree",
            Schedule::FallbackBalance => "balance",
            Schedule::Group => "group",
        }
    }
}

impl From<r2ccl_policy::Choice> for Schedule {
    fn from(c: r2ccl_policy::Choice) -> Self {
        match c {
            r2ccl_policy::Choice::Planned(s) => Schedule::Planned(s),
            r2ccl_policy::Choice::FallbackTree => Schedule::FallbackTree,
            r2ccl_policy::Choice::FallbackBalance => Schedule::FallbackBalance,
            r2ccl_policy::Choice::Group => Schedule::Group,
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a finished collective reports besides its data.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct CollReport {
    /// Collective sequence number (1 for the communicator's first call).
    pub seq: u64,
    /// How it was scheduled.
    pub strategy: Schedule,
    /// Health epoch the plan used.
    pub epoch: u64,
    /// Wall time inside the progress thread.
    pub seconds: f64,
}

/// A failover or health event, rendered for logs and tools.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CommEvent {
    /// Milliseconds since the communicator started.
    pub at_ms: u64,
    /// One line describing it.
    pub text: String,
}
