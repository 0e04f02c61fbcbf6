//! The per-path health state machine: states, events, the transition table, and its
//! text and Graphviz renderings.
//!
//! The machine is table-driven: [`step`] looks the (state, event, guard) up in
//! [`TRANSITIONS`], so the rendered table is exactly what runs. A pair missing from the
//! table is an illegal transition and returns an error.

use crate::triangulate::Verdict;
use std::fmt;

/// The health of one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathState {
    /// Carrying traffic; deadlines armed.
    Healthy,
    /// A deadline was missed; a localization round is running, the path is not declared yet.
    Suspect,
    /// Declared failed (the driver stops using it); waiting (hold-down, then probe interval)
    /// for the next re-probe.
    Failed,
    /// A re-probe is outstanding; `good` consecutive good probes so far.
    Probing {
        /// Consecutive good probes before this one.
        good: u32,
    },
    /// `good` consecutive good probes (fewer than needed); waiting for the next re-probe.
    Recovering {
        /// Consecutive good probes so far.
        good: u32,
    },
}

/// The state without its data: a row key of the transition table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateKind {
    /// See [`PathState::Healthy`].
    Healthy,
    /// See [`PathState::Suspect`].
    Suspect,
    /// See [`PathState::Failed`].
    Failed,
    /// See [`PathState::Probing`].
    Probing,
    /// See [`PathState::Recovering`].
    Recovering,
}

impl StateKind {
    /// Every state kind, in table order.
    pub const ALL: [StateKind; 5] =
        [StateKind::Healthy, StateKind::Suspect, StateKind::Failed, StateKind::Probing, StateKind::Recovering];
}

impl PathState {
    /// The state's kind.
    pub const fn kind(&self) -> StateKind {
        match self {
            PathState::Healthy => StateKind::Healthy,
            PathState::Suspect => StateKind::Suspect,
            PathState::Failed => StateKind::Failed,
            PathState::Probing { .. } => StateKind::Probing,
            PathState::Recovering { .. } => StateKind::Recovering,
        }
    }

    /// Whether the path may carry traffic (healthy or only suspect).
    pub const fn is_usable(&self) -> bool {
        matches!(self, PathState::Healthy | PathState::Suspect)
    }

    /// Whether the path is declared failed (failed, probing or recovering).
    pub const fn is_failed(&self) -> bool {
        !self.is_usable()
    }
}

/// What made a path fail without a probe round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureCause {
    /// An immediate error completion on a local data endpoint.
    LocalError,
    /// A remote timeout or endpoint error reported by the transport.
    RemoteError,
    /// The kernel reported the local NIC's link down.
    LinkDown,
    /// Localization of another path blamed a NIC this path uses.
    NicBlamed,
}

/// Which deadline a suspect path missed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SuspicionCause {
    /// Outstanding data with no completion for expected time + margin.
    ProgressDeadline,
    /// An idle path without heartbeat or traffic for the heartbeat timeout.
    HeartbeatDeadline,
}

/// An input of the path health machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathEvent {
    /// A signal that needs no confirmation.
    HardFailure(FailureCause),
    /// A missed deadline.
    Suspicion(SuspicionCause),
    /// A completion, received data or heartbeat on the path.
    Progress,
    /// A localization round ended with this verdict.
    Localized(Verdict),
    /// The re-probe timer of a failed path fired.
    ReprobeDue,
    /// The outstanding re-probe was answered.
    ProbeOk,
    /// The outstanding re-probe failed or timed out.
    ProbeFailed,
    /// The kernel reported the local NIC's link up.
    LinkUp,
}

/// The event without its data: a column key of the transition table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// See [`PathEvent::HardFailure`].
    HardFailure,
    /// See [`PathEvent::Suspicion`].
    Suspicion,
    /// See [`PathEvent::Progress`].
    Progress,
    /// See [`PathEvent::Localized`].
    Localized,
    /// See [`PathEvent::ReprobeDue`].
    ReprobeDue,
    /// See [`PathEvent::ProbeOk`].
    ProbeOk,
    /// See [`PathEvent::ProbeFailed`].
    ProbeFailed,
    /// See [`PathEvent::LinkUp`].
    LinkUp,
}

impl EventKind {
    /// Every event kind, in table order.
    pub const ALL: [EventKind; 8] = [
        EventKind::HardFailure,
        EventKind::Suspicion,
        EventKind::Progress,
        EventKind::Localized,
        EventKind::ReprobeDue,
        EventKind::ProbeOk,
        EventKind::ProbeFailed,
        EventKind::LinkUp,
    ];
}

impl PathEvent {
    /// The event's kind.
    pub const fn kind(&self) -> EventKind {
        match self {
            PathEvent::HardFailure(_) => EventKind::HardFailure,
            PathEvent::Suspicion(_) => EventKind::Suspicion,
            PathEvent::Progress => EventKind::Progress,
            PathEvent::Localized(_) => EventKind::Localized,
            PathEvent::ReprobeDue => EventKind::ReprobeDue,
            PathEvent::ProbeOk => EventKind::ProbeOk,
            PathEvent::ProbeFailed => EventKind::ProbeFailed,
            PathEvent::LinkUp => EventKind::LinkUp,
        }
    }
}

/// A condition on a transition beyond its state and event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Guard {
    /// No condition.
    Always,
    /// The verdict is transient.
    Transient,
    /// The verdict names a failed NIC or link.
    Failure,
    /// This good probe is the N-th consecutive one.
    LastGoodProbe,
    /// More good probes are needed after this one.
    MoreProbesNeeded,
}

impl Guard {
    fn holds(self, state: &PathState, event: &PathEvent, good_needed: u32) -> bool {
        let good = match state {
            PathState::Probing { good } | PathState::Recovering { good } => *good,
            _ => 0,
        };
        match self {
            Guard::Always => true,
            Guard::Transient => matches!(event, PathEvent::Localized(Verdict::Transient)),
            Guard::Failure => matches!(event, PathEvent::Localized(v) if *v != Verdict::Transient),
            Guard::LastGoodProbe => good.saturating_add(1) >= good_needed,
            Guard::MoreProbesNeeded => good.saturating_add(1) < good_needed,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Guard::Always => "",
            Guard::Transient => "verdict = transient",
            Guard::Failure => "verdict = NIC or link",
            Guard::LastGoodProbe => "good + 1 = N",
            Guard::MoreProbesNeeded => "good + 1 < N",
        }
    }
}

/// One row of the transition table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransitionRule {
    /// The state the rule applies in.
    pub from: StateKind,
    /// The event it reacts to.
    pub event: EventKind,
    /// The extra condition.
    pub guard: Guard,
    /// The next state.
    pub to: StateKind,
    /// What the detector does on this transition.
    pub action: &'static str,
}

const fn rule(from: StateKind, event: EventKind, guard: Guard, to: StateKind, action: &'static str) -> TransitionRule {
    TransitionRule { from, event, guard, to, action }
}

use EventKind as E;
use StateKind as S;

/// The transition table of the path health machine. Pairs not listed are illegal.
pub const TRANSITIONS: &[TransitionRule] = &[
    rule(S::Healthy, E::HardFailure, Guard::Always, S::Failed, "localize (declare failed), start hold-down"),
    rule(S::Healthy, E::Suspicion, Guard::Always, S::Suspect, "start localization round"),
    rule(S::Healthy, E::Progress, Guard::Always, S::Healthy, "re-arm deadlines"),
    rule(S::Healthy, E::LinkUp, Guard::Always, S::Healthy, "none"),
    rule(S::Suspect, E::HardFailure, Guard::Always, S::Failed, "start hold-down; the running round declares"),
    rule(S::Suspect, E::Suspicion, Guard::Always, S::Suspect, "none (round already running)"),
    rule(S::Suspect, E::Progress, Guard::Always, S::Healthy, "cancel localization"),
    rule(S::Suspect, E::Localized, Guard::Transient, S::Healthy, "report transient, keep watching"),
    rule(S::Suspect, E::Localized, Guard::Failure, S::Failed, "declare failed, start hold-down"),
    rule(S::Suspect, E::LinkUp, Guard::Always, S::Suspect, "none"),
    rule(S::Failed, E::HardFailure, Guard::Always, S::Failed, "none (already failed)"),
    rule(S::Failed, E::Progress, Guard::Always, S::Failed, "ignore late completions"),
    rule(S::Failed, E::Localized, Guard::Always, S::Failed, "declare failed with verdict"),
    rule(S::Failed, E::ReprobeDue, Guard::Always, S::Probing, "start probe"),
    rule(S::Failed, E::LinkUp, Guard::Always, S::Failed, "re-probe now if hold-down is over"),
    rule(S::Probing, E::HardFailure, Guard::Always, S::Failed, "reset good probes"),
    rule(S::Probing, E::Progress, Guard::Always, S::Probing, "ignore"),
    rule(S::Probing, E::Localized, Guard::Always, S::Probing, "declare failed with verdict"),
    rule(S::Probing, E::ProbeOk, Guard::LastGoodProbe, S::Healthy, "declare recovered"),
    rule(S::Probing, E::ProbeOk, Guard::MoreProbesNeeded, S::Recovering, "count good probe"),
    rule(S::Probing, E::ProbeFailed, Guard::Always, S::Failed, "reset good probes"),
    rule(S::Probing, E::LinkUp, Guard::Always, S::Probing, "none"),
    rule(S::Recovering, E::HardFailure, Guard::Always, S::Failed, "reset good probes"),
    rule(S::Recovering, E::Progress, Guard::Always, S::Recovering, "ignore"),
    rule(S::Recovering, E::Localized, Guard::Always, S::Recovering, "declare failed with verdict"),
    rule(S::Recovering, E::ReprobeDue, Guard::Always, S::Probing, "start probe"),
    rule(S::Recovering, E::LinkUp, Guard::Always, S::Recovering, "none"),
];

/// An event that the table does not allow in the current state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal path transition: event {event:?} in state {state:?}")]
pub struct IllegalTransition {
    /// The state the machine was in (unchanged).
    pub state: PathState,
    /// The refused event.
    pub event: PathEvent,
}

/// Apply `event` to `state`; `good_needed` is the hysteresis N. Returns the next state, or
/// an error (and no change) when the table has no rule for the pair.
pub fn step(state: PathState, event: &PathEvent, good_needed: u32) -> Result<PathState, IllegalTransition> {
    let found = TRANSITIONS
        .iter()
        .find(|r| r.from == state.kind() && r.event == event.kind() && r.guard.holds(&state, event, good_needed));
    let Some(r) = found else {
        return Err(IllegalTransition { state, event: *event });
    };
    let good = match state {
        PathState::Probing { good } | PathState::Recovering { good } => good,
        _ => 0,
    };
    Ok(match r.to {
        StateKind::Healthy => PathState::Healthy,
        StateKind::Suspect => PathState::Suspect,
        StateKind::Failed => PathState::Failed,
        StateKind::Probing => PathState::Probing { good },
        StateKind::Recovering => match state {
            PathState::Probing { good } => PathState::Recovering { good: good.saturating_add(1) },
            _ => PathState::Recovering { good },
        },
    })
}

impl fmt::Display for StateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            StateKind::Healthy => "Healthy",
            StateKind::Suspect => "Suspect",
            StateKind::Failed => "Failed",
            StateKind::Probing => "Probing",
            StateKind::Recovering => "Recovering",
        })
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            EventKind::HardFailure => "HardFailure",
            EventKind::Suspicion => "Suspicion",
            EventKind::Progress => "Progress",
            EventKind::Localized => "Localized",
            EventKind::ReprobeDue => "ReprobeDue",
            EventKind::ProbeOk => "ProbeOk",
            EventKind::ProbeFailed => "ProbeFailed",
            EventKind::LinkUp => "LinkUp",
        })
    }
}

fn rules() -> Vec<r2ccl_core::table::Rule> {
    TRANSITIONS
        .iter()
        .map(|r| r2ccl_core::table::Rule {
            from: r.from.to_string(),
            event: r.event.to_string(),
            guard: (r.guard != Guard::Always).then(|| r.guard.label().to_owned()),
            to: r.to.to_string(),
            notes: vec![r.action.to_owned()],
        })
        .collect()
}

fn state_names() -> Vec<String> {
    StateKind::ALL.iter().map(ToString::to_string).collect()
}

/// The transition table as aligned text: one line per rule, then the illegal pairs.
pub fn render_table() -> String {
    let events: Vec<String> = EventKind::ALL.iter().map(ToString::to_string).collect();
    let title = "# r2ccl-detect path health transitions (generated from health::TRANSITIONS)";
    r2ccl_core::table::render_text(title, &["action"], &rules(), &state_names(), &events, "IllegalTransition")
}

/// The transition table as a Graphviz digraph (self-loops left out to keep it readable;
/// they are in [`render_table`]).
pub fn render_dot() -> String {
    let source = "r2ccl_detect::health::TRANSITIONS by tests/snapshots.rs";
    r2ccl_core::table::render_dot(source, "path_health", &rules(), &state_names())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_no_ambiguous_rows() {
        for (i, a) in TRANSITIONS.iter().enumerate() {
            for b in &TRANSITIONS[i + 1..] {
                let same = a.from == b.from && a.event == b.event;
                assert!(
                    !same || (a.guard != Guard::Always && b.guard != Guard::Always && a.guard != b.guard),
                    "{a:?} / {b:?}"
                );
            }
        }
    }

    #[test]
    fn recovery_needs_n_good_probes() {
        let mut s = PathState::Failed;
        for _ in 0..2 {
            s = step(s, &PathEvent::ReprobeDue, 3).unwrap();
            s = step(s, &PathEvent::ProbeOk, 3).unwrap();
        }
        assert_eq!(s, PathState::Recovering { good: 2 });
        s = step(s, &PathEvent::ReprobeDue, 3).unwrap();
        assert_eq!(step(s, &PathEvent::ProbeOk, 3), Ok(PathState::Healthy));
        assert_eq!(step(s, &PathEvent::ProbeFailed, 3), Ok(PathState::Failed));
    }

    #[test]
    fn illegal_pairs_are_errors() {
        let e = step(PathState::Healthy, &PathEvent::ProbeOk, 3).unwrap_err();
        assert_eq!(e.state, PathState::Healthy);
        assert!(step(PathState::Failed, &PathEvent::Suspicion(SuspicionCause::ProgressDeadline), 3).is_err());
        assert!(step(PathState::Healthy, &PathEvent::Localized(Verdict::Transient), 3).is_err());
    }
}
