//! The lane migration machine (`migrate::TRANSITIONS`): its table and Graphviz rendering
//! against checked-in snapshots, and a sender/receiver pair against a hand-written reference
//! model of the FAILOVER_REQ / ACK exchange (epochs, boundary, stale and duplicate handling,
//! resends, the no-path deadline), with a message bag that loses, duplicates and reorders.
//! Run with `UPDATE_SNAPSHOTS=1` to rewrite the snapshots after an intended change.
#![allow(clippy::unwrap_used, reason = "test code: a panic is a test failure")]

use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use r2ccl_core::{NicId, Rank};
use r2ccl_transport::migrate::{
    render_dot, render_table, LaneState, MigrateAck, MigrateConfig, MigrateOutput, MigrateReq, Migrations, Receiver,
    ReqOutcome,
};
use r2ccl_transport::{LaneId, MigrationRequest, MoveReason, PathFault, PathId, TransferKey};
use std::path::Path;
use std::time::Duration;

fn check(rel: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; run with UPDATE_SNAPSHOTS=1 to create it", path.display()));
    assert!(
        expected == actual,
        "{} is out of date; run `UPDATE_SNAPSHOTS=1 cargo test -p r2ccl-transport --test migrate_machine`.\n--- generated ---\n{actual}",
        path.display()
    );
}

#[test]
fn transition_table_matches_snapshot() {
    check("tests/snapshots/migrate-transitions.txt", &render_table());
}

#[test]
fn graphviz_rendering_matches_checked_in_file() {
    let dot = render_dot();
    assert!(dot.starts_with("// generated") && dot.trim_end().ends_with('}'));
    check("../../docs/migrate-transitions.dot", &dot);
}

// ------------------------------------------------------------------ model test

const RETRY: Duration = Duration::from_millis(50);
const NO_PATH: Duration = Duration::from_millis(300);
const LANES: usize = 2;
const LANE_LEN: u32 = 100;

fn key() -> TransferKey {
    TransferKey::new(1, 0, 0, 0, 1)
}

fn lane(i: usize) -> LaneId {
    LaneId { transfer: key(), lane: i as u16 }
}

fn path(rail: u16) -> PathId {
    PathId::new(NicId::new(0, rail), Rank(1), NicId::new(1, rail))
}

fn start(i: usize) -> u32 {
    i as u32 * LANE_LEN
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Msg {
    Req { lane: usize, epoch: u32, done: u32 },
    Ack { lane: usize, epoch: u32, boundary: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Idle,
    Waiting { stopped_at: Duration, done: u32 },
    Requested { stopped_at: Duration, sent_at: Duration, done: u32 },
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Stop { lane: usize, free: bool },
    Tick { ms: u64, free: bool },
    Deliver(usize),
    Drop(usize),
    Duplicate(usize),
    Complete { lane: usize, k: u32 },
    Arrive { lane: usize, k: u32 },
    Release,
}

/// The reference: the protocol written out as plain per-lane logic, independently of the table.
#[derive(Clone, Debug, Default)]
struct Model {
    now: Duration,
    released: bool,
    kind: Vec<(Kind, u32)>,
    s_done: Vec<u32>,
    r_held: Vec<u32>,
    r_applied: Vec<Option<(u32, u32)>>,
    bag: Vec<Msg>,
    s_log: Vec<(usize, u32, u32)>,
    r_log: Vec<(usize, u32, u32)>,
    gave_up: Vec<usize>,
}

impl Model {
    fn new() -> Self {
        Model {
            kind: vec![(Kind::Idle, 0); LANES],
            s_done: (0..LANES).map(start).collect(),
            r_held: (0..LANES).map(start).collect(),
            r_applied: vec![None; LANES],
            ..Model::default()
        }
    }

    fn request(&mut self, l: usize, stopped_at: Duration, done: u32) {
        let epoch = self.kind[l].1 + 1;
        self.kind[l] = (Kind::Requested { stopped_at, sent_at: self.now, done }, epoch);
        self.bag.push(Msg::Req { lane: l, epoch, done });
    }

    fn deliver(&mut self, m: Msg) {
        match m {
            Msg::Req { lane: l, epoch, done } => {
                if self.released {
                    self.bag.push(Msg::Ack { lane: l, epoch, boundary: start(l) });
                    return;
                }
                match self.r_applied[l] {
                    Some((e, _)) if epoch < e => {}
                    Some((e, b)) if epoch == e => self.bag.push(Msg::Ack { lane: l, epoch, boundary: b }),
                    _ => {
                        let boundary = done.min(self.r_held[l]).max(start(l));
                        self.r_applied[l] = Some((epoch, boundary));
                        self.r_log.push((l, epoch, boundary));
                        self.bag.push(Msg::Ack { lane: l, epoch, boundary });
                    }
                }
            }
            Msg::Ack { lane: l, epoch, boundary } => {
                if let (Kind::Requested { .. }, e) = self.kind[l] {
                    if e == epoch {
                        self.kind[l] = (Kind::Idle, e);
                        self.s_log.push((l, epoch, boundary));
                        self.s_done[l] = boundary;
                    }
                }
            }
        }
    }
}

impl ReferenceStateMachine for Model {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Self::State> {
        Just(Model::new()).boxed()
    }

    fn transitions(_: &Self::State) -> BoxedStrategy<Self::Transition> {
        prop_oneof![
            2 => (0..LANES, any::<bool>()).prop_map(|(lane, free)| Step::Stop { lane, free }),
            2 => (1u64..200, any::<bool>()).prop_map(|(ms, free)| Step::Tick { ms, free }),
            5 => (0usize..64).prop_map(Step::Deliver),
            1 => (0usize..64).prop_map(Step::Drop),
            1 => (0usize..64).prop_map(Step::Duplicate),
            2 => (0..LANES, 1u32..30).prop_map(|(lane, k)| Step::Complete { lane, k }),
            2 => (0..LANES, 1u32..30).prop_map(|(lane, k)| Step::Arrive { lane, k }),
            1 => Just(Step::Release),
        ]
        .boxed()
    }

    fn preconditions(s: &Self::State, t: &Self::Transition) -> bool {
        match t {
            Step::Deliver(_) | Step::Drop(_) | Step::Duplicate(_) => !s.bag.is_empty(),
            Step::Stop { .. } | Step::Complete { .. } | Step::Arrive { .. } | Step::Release => !s.released,
            Step::Tick { .. } => true,
        }
    }

    fn apply(mut s: Self::State, t: &Self::Transition) -> Self::State {
        match *t {
            Step::Stop { lane: l, free } => {
                let done = s.s_done[l];
                let first = match s.kind[l].0 {
                    Kind::Idle => s.now,
                    Kind::Waiting { stopped_at, .. } | Kind::Requested { stopped_at, .. } => stopped_at,
                };
                if free {
                    s.request(l, first, done);
                } else {
                    s.kind[l].0 = Kind::Waiting { stopped_at: first, done };
                }
            }
            Step::Tick { ms, free } => {
                s.now += Duration::from_millis(ms);
                for l in 0..LANES {
                    match s.kind[l].0 {
                        Kind::Idle => {}
                        Kind::Waiting { stopped_at, done } => {
                            if free {
                                s.request(l, stopped_at, done);
                            } else if s.now - stopped_at > NO_PATH {
                                s.kind[l].0 = Kind::Idle;
                                s.gave_up.push(l);
                            }
                        }
                        Kind::Requested { stopped_at, sent_at, done } => {
                            if s.now >= sent_at + RETRY {
                                let epoch = s.kind[l].1;
                                s.kind[l].0 = Kind::Requested { stopped_at, sent_at: s.now, done };
                                s.bag.push(Msg::Req { lane: l, epoch, done });
                            }
                        }
                    }
                }
            }
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
            // Local send completions can run ahead of what the receiver holds (data lost in
            // flight on the failing path): the boundary's min() matters.
            Step::Complete { lane: l, k } => s.s_done[l] = (s.s_done[l] + k).min(start(l) + LANE_LEN),
            Step::Arrive { lane: l, k } => s.r_held[l] = (s.r_held[l] + k).min(start(l) + LANE_LEN),
            Step::Release => {
                s.released = true;
                s.kind = vec![(Kind::Idle, 0); LANES];
                s.r_applied = vec![None; LANES];
            }
        }
        s
    }
}

struct Pair {
    now: Duration,
    released: bool,
    s: Migrations,
    r: Receiver,
    bag: Vec<Msg>,
    s_done: Vec<u32>,
    r_held: Vec<u32>,
    s_log: Vec<(usize, u32, u32)>,
    r_log: Vec<(usize, u32, u32)>,
    gave_up: Vec<usize>,
}

impl Pair {
    fn drain(&mut self) {
        while let Some((to, req)) = self.s.poll_transmit() {
            assert_eq!(to, Rank(1));
            assert_eq!((req.local, req.remote), (NicId::new(0, 1), NicId::new(1, 1)), "the chosen path");
            self.bag.push(Msg::Req { lane: usize::from(req.lane.lane), epoch: req.epoch, done: req.sender_done });
        }
        while let Some(out) = self.s.poll_output() {
            match out {
                MigrateOutput::Apply { req, to, boundary, .. } => {
                    let l = usize::from(req.lane.lane);
                    assert_eq!(to, path(1));
                    assert!(boundary <= req.sender_done && boundary >= req.start, "{boundary} outside {req:?}");
                    self.s_log.push((l, self.s.epoch(req.lane), boundary));
                    self.s_done[l] = boundary;
                }
                MigrateOutput::NoPathLeft { req, waited } => {
                    assert!(waited > NO_PATH);
                    self.gave_up.push(usize::from(req.lane.lane));
                }
            }
        }
    }

    fn deliver(&mut self, m: Msg) {
        match m {
            Msg::Req { lane: l, epoch, done } => {
                let req = MigrateReq {
                    lane: lane(l),
                    start: start(l),
                    end: start(l) + LANE_LEN,
                    sender_done: done,
                    local: NicId::new(0, 1),
                    remote: NicId::new(1, 1),
                    epoch,
                };
                let held = (!self.released).then_some(self.r_held[l]);
                match self.r.handle_req(&req, held) {
                    ReqOutcome::Apply(a) => {
                        assert!(a.boundary <= self.r_held[l], "never ahead of what the receiver holds");
                        self.r_log.push((l, a.epoch, a.boundary));
                        self.bag.push(Msg::Ack { lane: l, epoch: a.epoch, boundary: a.boundary });
                    }
                    ReqOutcome::AckOnly(a) => self.bag.push(Msg::Ack { lane: l, epoch: a.epoch, boundary: a.boundary }),
                    ReqOutcome::Stale => {}
                }
            }
            Msg::Ack { lane: l, epoch, boundary } => {
                let ack = MigrateAck { lane: lane(l), boundary, epoch };
                // An acknowledgement from a rank other than the receiver changes nothing.
                assert!(!self.s.handle_ack(self.now, Rank(2), ack).unwrap());
                assert!(self.s.handle_ack(self.now, Rank(1), ack).unwrap());
            }
        }
    }
}

struct MachineTest;

impl StateMachineTest for MachineTest {
    type SystemUnderTest = Pair;
    type Reference = Model;

    fn init_test(_: &Model) -> Pair {
        Pair {
            now: Duration::ZERO,
            released: false,
            s: Migrations::new(MigrateConfig { retry: RETRY, no_path_timeout: NO_PATH }),
            r: Receiver::new(),
            bag: Vec::new(),
            s_done: (0..LANES).map(start).collect(),
            r_held: (0..LANES).map(start).collect(),
            s_log: Vec::new(),
            r_log: Vec::new(),
            gave_up: Vec::new(),
        }
    }

    fn apply(mut p: Pair, _: &Model, t: Step) -> Pair {
        let now = p.now;
        match t {
            Step::Stop { lane: l, free } => {
                let req = MigrationRequest {
                    lane: lane(l),
                    from: path(0),
                    start: start(l),
                    end: start(l) + LANE_LEN,
                    sender_done: p.s_done[l],
                    reason: MoveReason::Failure(PathFault::Timeout),
                };
                p.s.handle_stopped(now, req, now, free.then(|| path(1))).unwrap();
            }
            Step::Tick { ms, free } => {
                p.now += Duration::from_millis(ms);
                p.s.handle_timeout(p.now, |_| free.then(|| path(1))).unwrap();
            }
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
            Step::Complete { lane: l, k } => p.s_done[l] = (p.s_done[l] + k).min(start(l) + LANE_LEN),
            Step::Arrive { lane: l, k } => p.r_held[l] = (p.r_held[l] + k).min(start(l) + LANE_LEN),
            Step::Release => {
                p.released = true;
                p.s.handle_released(now, key()).unwrap();
                p.r.release(key());
            }
        }
        p.drain();
        p
    }

    fn check_invariants(p: &Pair, r: &Model) {
        assert_eq!(p.bag, r.bag, "messages in flight");
        assert_eq!(p.s_log, r.s_log, "sender migrations");
        assert_eq!(p.r_log, r.r_log, "receiver migrations");
        assert_eq!(p.gave_up, r.gave_up, "lanes given up");
        for l in 0..LANES {
            let (kind, epoch) = r.kind[l];
            let state = p.s.state(lane(l));
            let same = match (kind, state) {
                (Kind::Idle, LaneState::Idle) => true,
                (Kind::Waiting { stopped_at, done }, LaneState::WaitingForPath { req, stopped_at: s }) => {
                    s == stopped_at && req.sender_done == done
                }
                (
                    Kind::Requested { stopped_at, sent_at, done },
                    LaneState::Requested { req, stopped_at: s, sent_at: t, .. },
                ) => s == stopped_at && t == sent_at && req.sender_done == done,
                _ => false,
            };
            assert!(same, "lane {l}: {state:?} against the model's {kind:?}");
            assert_eq!(p.s.epoch(lane(l)), epoch, "lane {l} epoch");
        }
        // The protocol's safety properties, on top of agreeing with the model: the sender
        // applies only what the receiver applied, once per epoch, with epochs growing.
        for m in &p.s_log {
            assert!(p.r_log.contains(m), "sender applied {m:?} that the receiver never did");
        }
        for l in 0..LANES {
            let epochs: Vec<u32> = p.s_log.iter().filter(|m| m.0 == l).map(|m| m.1).collect();
            assert!(epochs.windows(2).all(|w| w[0] < w[1]) || p.released, "lane {l}: {epochs:?}");
        }
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn lane_migration_follows_the_reference(sequential 1..80 => MachineTest);
}
