//! What a finished call reports besides its data: [`CollReport`], [`Schedule`], [`CommEvent`].

/// How a call was scheduled: the planner's [`r2ccl_policy::Choice`] (its strategy, a fallback
/// for layouts the cost model does not cover, or a point-to-point group).
pub use r2ccl_policy::Choice as Schedule;

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
