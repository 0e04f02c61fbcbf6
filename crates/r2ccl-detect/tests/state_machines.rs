//! proptest-state-machine tests: the path health machine against a hand-written reference,
//! and a sender/receiver pair of detectors against an abstract model of the bilateral
//! FAILOVER_REQ / ACK / HINT protocol (epochs, boundary, stale and duplicate handling,
//! retransmission), with a message bag that loses, duplicates and reorders.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use r2ccl_core::{NicId, NodeId, Rank};
use r2ccl_detect::health::{step, FailureCause, PathEvent, SuspicionCause};
use r2ccl_detect::{
    Command, ConnId, DetectConfig, Detector, Member, MigrationReason, OobMessage, PathId, PathPair, PathState, Verdict,
};
use std::time::Duration;

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
            Just(FailureCause::PeerNotice),
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

// ------------------------------------------------------------------ bilateral protocol

const CONN: ConnId = ConnId::new(0, 1, 0);
const PATHS: usize = 3;
const RETRY: Duration = Duration::from_millis(20);
const HINT: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Msg {
    Req { epoch: u64, done: u64, index: usize },
    Ack { epoch: u64, applied: u64 },
    Hint { epoch: u64, seen: u64 },
}

#[derive(Clone, Debug, Default)]
struct ProtoRef {
    now: Duration,
    s_epoch: u64,
    s_current: usize,
    s_failed: [bool; PATHS],
    s_done: u64,
    hint_seen: u64,
    pending: Option<Msg>,
    req_next: Duration,
    r_epoch: u64,
    r_current: usize,
    r_failed: [bool; PATHS],
    r_held: u64,
    applied: Option<(u64, u64)>,
    hint: Option<Msg>,
    hint_next: Duration,
    bag: Vec<Msg>,
    s_migrations: Vec<(u64, u64, usize)>,
    r_migrations: Vec<(u64, u64, usize)>,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    SenderFails,
    ReceiverFails,
    Deliver(usize),
    Drop(usize),
    Duplicate(usize),
    Tick(u64),
    Arrive(u64),
    Complete(u64),
}

impl ProtoRef {
    fn start_failover(&mut self) {
        let Some(index) = (0..PATHS).find(|&i| i != self.s_current && !self.s_failed[i]) else { return };
        self.s_epoch = (self.s_epoch + 1).max(self.hint_seen);
        let done = match self.pending {
            Some(Msg::Req { done, .. }) => done.min(self.s_done),
            _ => self.s_done,
        };
        let req = Msg::Req { epoch: self.s_epoch, done, index };
        self.pending = Some(req);
        self.bag.push(req);
        self.req_next = self.now + RETRY;
    }

    fn sender_path_fails(&mut self, i: usize) {
        if self.s_failed[i] {
            return;
        }
        self.s_failed[i] = true;
        let target = match self.pending {
            Some(Msg::Req { index, .. }) => Some(index),
            _ => None,
        };
        if i == self.s_current || target == Some(i) {
            self.start_failover();
        }
    }

    fn receiver_path_fails(&mut self, i: usize) {
        if self.r_failed[i] {
            return;
        }
        self.r_failed[i] = true;
        if i != self.r_current || matches!(self.hint, Some(Msg::Hint { epoch, .. }) if epoch > self.r_epoch) {
            return;
        }
        let h = Msg::Hint { epoch: self.r_epoch + 1, seen: self.r_held };
        self.hint = Some(h);
        self.bag.push(h);
        self.hint_next = self.now + HINT;
    }

    fn deliver(&mut self, m: Msg) {
        match m {
            Msg::Req { epoch, done, index } => {
                if let Some((e, v)) = self.applied.filter(|(e, _)| *e == epoch) {
                    self.bag.push(Msg::Ack { epoch: e, applied: v });
                } else if epoch > self.r_epoch {
                    let v = done.min(self.r_held);
                    let old = self.r_current;
                    self.r_epoch = epoch;
                    self.applied = Some((epoch, v));
                    self.r_current = index;
                    self.r_held = v;
                    if matches!(self.hint, Some(Msg::Hint { epoch: h, .. }) if h <= epoch) {
                        self.hint = None;
                    }
                    self.r_migrations.push((epoch, v, index));
                    self.bag.push(Msg::Ack { epoch, applied: v });
                    self.receiver_path_fails(old);
                }
            }
            Msg::Ack { epoch, applied } => {
                if let Some(Msg::Req { epoch: e, index, .. }) = self.pending {
                    if e == epoch {
                        self.pending = None;
                        self.s_current = index;
                        self.s_done = applied;
                        self.s_migrations.push((epoch, applied, index));
                    }
                }
            }
            Msg::Hint { epoch, .. } => {
                if let Some(req @ Msg::Req { epoch: e, .. }) = self.pending {
                    if epoch <= e {
                        self.bag.push(req);
                        self.req_next = self.now + RETRY;
                        return;
                    }
                }
                if epoch <= self.s_epoch {
                    return;
                }
                self.hint_seen = self.hint_seen.max(epoch);
                self.sender_path_fails(self.s_current);
                if self.pending.is_none() && self.s_epoch < epoch {
                    self.start_failover();
                }
            }
        }
    }
}

impl ReferenceStateMachine for ProtoRef {
    type State = ProtoRef;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Self::State> {
        Just(ProtoRef::default()).boxed()
    }

    fn transitions(_: &Self::State) -> BoxedStrategy<Self::Transition> {
        prop_oneof![
            1 => Just(Step::SenderFails),
            1 => Just(Step::ReceiverFails),
            5 => (0usize..64).prop_map(Step::Deliver),
            1 => (0usize..64).prop_map(Step::Drop),
            1 => (0usize..64).prop_map(Step::Duplicate),
            2 => (1u64..700).prop_map(Step::Tick),
            2 => (1u64..5).prop_map(Step::Arrive),
            2 => (1u64..5).prop_map(Step::Complete),
        ]
        .boxed()
    }

    fn preconditions(state: &Self::State, t: &Self::Transition) -> bool {
        !matches!(t, Step::Deliver(_) | Step::Drop(_) | Step::Duplicate(_)) || !state.bag.is_empty()
    }

    fn apply(mut s: Self::State, t: &Self::Transition) -> Self::State {
        match *t {
            Step::SenderFails => s.sender_path_fails(s.s_current),
            Step::ReceiverFails => s.receiver_path_fails(s.r_current),
            Step::Deliver(i) => {
                let m = s.bag.remove(i % s.bag.len());
                s.deliver(m);
            }
            Step::Drop(i) => {
                let len = s.bag.len();
                s.bag.remove(i % len);
            }
            Step::Duplicate(i) => {
                let m = s.bag[i % s.bag.len()];
                s.bag.push(m);
            }
            Step::Tick(ms) => {
                s.now += Duration::from_millis(ms);
                if let Some(req) = s.pending.filter(|_| s.req_next <= s.now) {
                    s.bag.push(req);
                    s.req_next = s.now + RETRY;
                }
                if let Some(h) = s.hint.filter(|_| s.hint_next <= s.now) {
                    s.bag.push(h);
                    s.hint_next = s.now + HINT;
                }
            }
            Step::Arrive(k) => s.r_held += k,
            Step::Complete(k) => s.s_done += k,
        }
        s
    }
}

struct Pair {
    now: Duration,
    s: Detector,
    r: Detector,
    bag: Vec<Msg>,
    s_done: u64,
    r_held: u64,
    s_migrations: Vec<(u64, u64, usize)>,
    r_migrations: Vec<(u64, u64, usize)>,
}

fn chain() -> Vec<PathPair> {
    (0..PATHS as u16).map(|r| PathPair { src_nic: NicId::new(0, r), dst_nic: NicId::new(1, r) }).collect()
}

impl Pair {
    /// Move protocol messages into the bag (everything else, probes and hot repairs, is
    /// dropped: the protocol must not depend on them) and record migrations.
    fn drain(&mut self) {
        for (is_sender, det) in [(true, &mut self.s), (false, &mut self.r)] {
            while det.poll_event().is_some() {}
            while let Some(cmd) = det.poll_command() {
                match cmd {
                    Command::SendOob { msg, .. } => match msg {
                        OobMessage::FailoverReq { epoch, sender_done, index, reason, .. } => {
                            assert_eq!(reason, MigrationReason::Failover);
                            self.bag.push(Msg::Req { epoch: epoch.0, done: sender_done, index: usize::from(index) });
                        }
                        OobMessage::FailoverAck { epoch, applied, .. } => {
                            self.bag.push(Msg::Ack { epoch: epoch.0, applied })
                        }
                        OobMessage::FailoverHint { epoch_hint, receiver_seen, .. } => {
                            self.bag.push(Msg::Hint { epoch: epoch_hint.0, seen: receiver_seen })
                        }
                        _ => {}
                    },
                    Command::MigratePath { epoch, boundary, index, .. } => {
                        let m = (epoch.0, boundary, index);
                        if is_sender {
                            self.s_migrations.push(m);
                            self.s_done = boundary;
                        } else {
                            self.r_migrations.push(m);
                            self.r_held = boundary;
                        }
                    }
                    Command::FailBack { .. } => panic!("no path can recover in this test"),
                    _ => {}
                }
            }
        }
    }

    fn deliver(&mut self, m: Msg) {
        let pair = chain();
        let msg = match m {
            Msg::Req { epoch, done, index } => OobMessage::FailoverReq {
                conn: CONN,
                epoch: r2ccl_detect::FailoverEpoch(epoch),
                sender_done: done,
                reason: MigrationReason::Failover,
                index: index as u16,
                path: pair[index],
            },
            Msg::Ack { epoch, applied } => {
                OobMessage::FailoverAck { conn: CONN, epoch: r2ccl_detect::FailoverEpoch(epoch), applied }
            }
            Msg::Hint { epoch, seen } => OobMessage::FailoverHint {
                conn: CONN,
                epoch_hint: r2ccl_detect::FailoverEpoch(epoch),
                receiver_seen: seen,
            },
        };
        let bytes = msg.encode();
        match m {
            Msg::Req { .. } => self.r.handle_oob(self.now, Rank(0), &bytes).unwrap(),
            Msg::Ack { .. } | Msg::Hint { .. } => self.s.handle_oob(self.now, Rank(1), &bytes).unwrap(),
        }
    }
}

struct ProtoTest;

impl StateMachineTest for ProtoTest {
    type SystemUnderTest = Pair;
    type Reference = ProtoRef;

    fn init_test(_: &ProtoRef) -> Pair {
        // Deadlines far away: only the protocol's own timers (REQ and HINT resends) run.
        let cfg = DetectConfig {
            heartbeat_interval: Duration::from_secs(100_000),
            oob_max_retries: 100_000,
            ..DetectConfig::default()
        };
        let members = [Member { rank: Rank(0), node: NodeId(0) }, Member { rank: Rank(1), node: NodeId(1) }];
        let mut s = Detector::new(cfg.clone(), Rank(0), &members).unwrap();
        let mut r = Detector::new(cfg, Rank(1), &members).unwrap();
        s.add_connection(Duration::ZERO, CONN, chain()).unwrap();
        r.add_connection(Duration::ZERO, CONN, chain()).unwrap();
        let mut p = Pair {
            now: Duration::ZERO,
            s,
            r,
            bag: Vec::new(),
            s_done: 0,
            r_held: 0,
            s_migrations: Vec::new(),
            r_migrations: Vec::new(),
        };
        p.s.handle_timeout(Duration::ZERO).unwrap();
        p.r.handle_timeout(Duration::ZERO).unwrap();
        p.drain();
        p
    }

    fn apply(mut p: Pair, _: &ProtoRef, t: Step) -> Pair {
        let now = p.now;
        match t {
            Step::SenderFails => p.s.handle_local_error(now, CONN).unwrap(),
            Step::ReceiverFails => p.r.handle_local_error(now, CONN).unwrap(),
            Step::Deliver(i) => {
                let m = p.bag.remove(i % p.bag.len());
                p.deliver(m);
            }
            Step::Drop(i) => {
                let len = p.bag.len();
                p.bag.remove(i % len);
            }
            Step::Duplicate(i) => {
                let m = p.bag[i % p.bag.len()];
                p.bag.push(m);
            }
            Step::Tick(ms) => {
                p.now += Duration::from_millis(ms);
                let now = p.now;
                while p.s.poll_timeout().is_some_and(|d| d <= now) {
                    p.s.handle_timeout(now).unwrap();
                }
                p.drain();
                while p.r.poll_timeout().is_some_and(|d| d <= now) {
                    p.r.handle_timeout(now).unwrap();
                }
            }
            Step::Arrive(k) => {
                p.r_held += k;
                p.r.handle_progress(now, CONN, p.r_held, None).unwrap();
            }
            Step::Complete(k) => {
                // Local send completions can run ahead of what the receiver holds (data
                // lost in flight on the failing path): the boundary's min() matters.
                p.s_done += k;
                p.s.handle_progress(now, CONN, p.s_done, None).unwrap();
            }
        }
        p.drain();
        p
    }

    fn check_invariants(p: &Pair, r: &ProtoRef) {
        assert_eq!(p.bag, r.bag, "messages in flight");
        assert_eq!(p.s_migrations, r.s_migrations, "sender migrations");
        assert_eq!(p.r_migrations, r.r_migrations, "receiver migrations");
        assert_eq!(p.s.epoch(&CONN).unwrap().0, r.s_epoch);
        assert_eq!(p.r.epoch(&CONN).unwrap().0, r.r_epoch);
        assert_eq!(p.s.current_path(&CONN).unwrap().0, r.s_current);
        assert_eq!(p.r.current_path(&CONN).unwrap().0, r.r_current);
        let side = |d: &Detector, local_node: u32, i: usize| {
            let (l, rem) = if local_node == 0 { (0, 1) } else { (1, 0) };
            let pid = PathId { local: NicId::new(l, i as u16), peer: Rank(rem), remote: NicId::new(rem, i as u16) };
            d.path_state(&pid).unwrap().is_failed()
        };
        for i in 0..PATHS {
            assert_eq!(side(&p.s, 0, i), r.s_failed[i], "sender path {i}");
            assert_eq!(side(&p.r, 1, i), r.r_failed[i], "receiver path {i}");
        }
        // The protocol's safety properties, on top of agreeing with the model: the receiver
        // never applies an epoch the sender did not start, every epoch both ends applied
        // has one boundary, and epochs only grow.
        assert!(r.r_epoch <= r.s_epoch);
        for m in &p.s_migrations {
            assert!(p.r_migrations.contains(m), "sender applied {m:?} that the receiver never did");
        }
        assert!(p.r_migrations.windows(2).all(|w| w[0].0 < w[1].0));
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn path_health_follows_the_reference(sequential 1..60 => HealthTest);

    #[test]
    fn failover_protocol_follows_the_reference(sequential 1..60 => ProtoTest);
}
