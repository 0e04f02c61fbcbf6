//! proptest-state-machine test: the path health machine (`health::step` over
//! `health::TRANSITIONS`) against a hand-written reference, including which pairs are illegal.
//! (Lane migration, the FAILOVER_REQ / ACK protocol, has its own model test in
//! r2ccl-transport's `tests/migrate_machine.rs`.)
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use r2ccl_core::NicId;
use r2ccl_detect::health::{step, FailureCause, PathEvent, SuspicionCause};
use r2ccl_detect::{PathState, Verdict};

// ------------------------------------------------------------------ path health machine

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RefHealth {
    Healthy,
    Suspect,
    Failed,
    Probing(u32),
    Recovering(u32),
}

#[derive(Clone, Debug)]
struct HealthRef {
    n: u32,
    state: RefHealth,
}

/// The reference: the transition table written out as a plain match, independently of
/// `health::TRANSITIONS`. `None` = illegal.
fn reference_step(s: RefHealth, e: &PathEvent, n: u32) -> Option<RefHealth> {
    use PathEvent as E;
    use RefHealth as R;
    Some(match (s, e) {
        (R::Healthy, E::HardFailure(_)) => R::Failed,
        (R::Healthy, E::Suspicion(_)) => R::Suspect,
        (R::Healthy, E::Progress | E::LinkUp) => R::Healthy,
        (R::Suspect, E::HardFailure(_)) => R::Failed,
        (R::Suspect, E::Suspicion(_) | E::LinkUp) => R::Suspect,
        (R::Suspect, E::Progress) => R::Healthy,
        (R::Suspect, E::Localized(Verdict::Transient)) => R::Healthy,
        (R::Suspect, E::Localized(_)) => R::Failed,
        (R::Failed, E::HardFailure(_) | E::Progress | E::Localized(_) | E::LinkUp) => R::Failed,
        (R::Failed, E::ReprobeDue) => R::Probing(0),
        (R::Probing(_), E::HardFailure(_) | E::ProbeFailed) => R::Failed,
        (R::Probing(g), E::Progress | E::Localized(_) | E::LinkUp) => R::Probing(g),
        (R::Probing(g), E::ProbeOk) if g + 1 >= n => R::Healthy,
        (R::Probing(g), E::ProbeOk) => R::Recovering(g + 1),
        (R::Recovering(_), E::HardFailure(_)) => R::Failed,
        (R::Recovering(g), E::Progress | E::Localized(_) | E::LinkUp) => R::Recovering(g),
        (R::Recovering(g), E::ReprobeDue) => R::Probing(g),
        _ => return None,
    })
}

fn to_ref(s: PathState) -> RefHealth {
    match s {
        PathState::Healthy => RefHealth::Healthy,
        PathState::Suspect => RefHealth::Suspect,
        PathState::Failed => RefHealth::Failed,
        PathState::Probing { good } => RefHealth::Probing(good),
        PathState::Recovering { good } => RefHealth::Recovering(good),
    }
}

fn path_event() -> BoxedStrategy<PathEvent> {
    let nic = NicId::new(0, 0);
    let other = NicId::new(1, 0);
    prop_oneof![
        prop_oneof![
            Just(FailureCause::LocalError),
            Just(FailureCause::RemoteError),
            Just(FailureCause::LinkDown),
            Just(FailureCause::NicBlamed)
        ]
        .prop_map(PathEvent::HardFailure),
        prop_oneof![Just(SuspicionCause::ProgressDeadline), Just(SuspicionCause::HeartbeatDeadline)]
            .prop_map(PathEvent::Suspicion),
        Just(PathEvent::Progress),
        prop_oneof![
            Just(Verdict::Transient),
            Just(Verdict::LocalNic(nic)),
            Just(Verdict::RemoteNic(other)),
            Just(Verdict::Link { local: nic, remote: other })
        ]
        .prop_map(PathEvent::Localized),
        Just(PathEvent::ReprobeDue),
        Just(PathEvent::ProbeOk),
        Just(PathEvent::ProbeOk),
        Just(PathEvent::ProbeFailed),
        Just(PathEvent::LinkUp),
    ]
    .boxed()
}

impl ReferenceStateMachine for HealthRef {
    type State = HealthRef;
    type Transition = PathEvent;

    fn init_state() -> BoxedStrategy<Self::State> {
        (1u32..5).prop_map(|n| HealthRef { n, state: RefHealth::Healthy }).boxed()
    }

    fn transitions(_: &Self::State) -> BoxedStrategy<Self::Transition> {
        path_event()
    }

    fn apply(mut state: Self::State, t: &Self::Transition) -> Self::State {
        if let Some(next) = reference_step(state.state, t, state.n) {
            state.state = next;
        }
        state
    }
}

struct HealthTest;

impl StateMachineTest for HealthTest {
    type SystemUnderTest = (PathState, u32);
    type Reference = HealthRef;

    fn init_test(r: &HealthRef) -> Self::SystemUnderTest {
        (PathState::Healthy, r.n)
    }

    fn apply((state, n): Self::SystemUnderTest, r: &HealthRef, t: PathEvent) -> Self::SystemUnderTest {
        let before = to_ref(state);
        match step(state, &t, n) {
            Ok(next) => {
                assert!(reference_step(before, &t, n).is_some(), "{before:?} + {t:?} should be illegal");
                assert_eq!(to_ref(next), r.state);
                (next, n)
            }
            Err(e) => {
                assert_eq!(reference_step(before, &t, n), None, "{before:?} + {t:?} should be legal");
                assert_eq!(e.state, state);
                assert_eq!(to_ref(state), r.state);
                (state, n)
            }
        }
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn path_health_follows_the_reference(sequential 1..60 => HealthTest);
}
