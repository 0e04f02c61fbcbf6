//! The health-view switch (`switch.rs`) against a reference model: ranks that start collectives
//! at their own pace, messages delivered in any order, at most one lost, local views that change
//! at any instant. Every collective is planned with the same view on every rank, every rank
//! finishes, and the last view every rank holds is the merge of the last local views.

use std::time::Duration;

use proptest::prelude::*;
use r2ccl_core::{HealthView, NicId};

use crate::switch::{Input, Phase, Switch, SwitchMsg, LEADER, TRANSITIONS};

const RETRY: Duration = Duration::from_millis(50);
const NODES: usize = 3;

/// One thing that happens in a run.
#[derive(Clone, Debug)]
enum Step {
    /// A rank starts its next collective, if it may.
    Start(u32),
    /// The message at this index (modulo the number in flight) arrives.
    Deliver(usize),
    /// The message at this index is lost (at most once per run).
    Lose(usize),
    /// A rank's local view: NIC 0 of each node failed or not (bit i for node i).
    Change(u32, u8),
    /// Time passes by the retry interval.
    Tick,
}

fn step(world: u32) -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0..world).prop_map(Step::Start),
        6 => any::<usize>().prop_map(Step::Deliver),
        1 => any::<usize>().prop_map(Step::Lose),
        1 => (0..world, 0u8..8).prop_map(|(r, m)| Step::Change(r, m)),
        1 => Just(Step::Tick),
    ]
}

/// The local view with NIC 0 of node i failed where bit i of `mask` is set.
fn view_of(mask: u8) -> HealthView {
    let mut v = HealthView::uniform(NODES, 2, 1000);
    for node in 0..NODES {
        if mask & (1 << node) != 0 {
            let _ = v.set_failed(NicId::new(node as u32, 0));
        }
    }
    v
}

/// A transition seen in a run must be one of the declared ones.
fn check(before: Phase, input: Input, after: Phase) {
    assert!(
        TRANSITIONS.iter().any(|&(b, i, a, _)| (b, i, a) == (before, input, after)),
        "undeclared transition {before:?} --{input:?}--> {after:?}"
    );
}

struct Net {
    ranks: Vec<Switch>,
    flight: Vec<(u32, u32, SwitchMsg)>,
    now: Duration,
    /// Per rank, per collective started, the failed NICs it planned with.
    planned: Vec<Vec<Vec<NicId>>>,
    masks: Vec<u8>,
    lost: bool,
}

impl Net {
    fn new(world: u32) -> Self {
        Self {
            ranks: (0..world).map(|r| Switch::new(r, world, view_of(0), RETRY)).collect(),
            flight: Vec::new(),
            now: Duration::ZERO,
            planned: vec![Vec::new(); world as usize],
            masks: vec![0; world as usize],
            lost: false,
        }
    }

    fn collect(&mut self) {
        for (i, s) in self.ranks.iter_mut().enumerate() {
            while let Some((to, msg)) = s.poll_transmit() {
                assert_ne!(to, i as u32, "a rank never sends to itself");
                self.flight.push((i as u32, to, msg));
            }
        }
    }

    /// Rank `r` starts its next collective if it may (and has fewer than `max`).
    fn start(&mut self, r: u32, max: usize) -> bool {
        let s = &mut self.ranks[r as usize];
        let done = &mut self.planned[r as usize];
        if !s.may_start() || done.len() >= max {
            return false;
        }
        let before = s.phase();
        s.start(done.len() as u64 + 1);
        done.push(s.agreed().failed_nics());
        check(before, Input::Start, s.phase());
        true
    }

    fn apply(&mut self, st: &Step, max: usize) {
        match *st {
            Step::Start(r) => {
                self.start(r, max);
            }
            Step::Deliver(i) if !self.flight.is_empty() => {
                let (from, to, msg) = self.flight.remove(i % self.flight.len());
                let input = match msg {
                    SwitchMsg::Join { .. } => Input::Join,
                    SwitchMsg::Freeze { .. } => Input::Freeze,
                    SwitchMsg::Decide { .. } => Input::Decide,
                };
                let s = &mut self.ranks[to as usize];
                let before = s.phase();
                let r = s.handle_msg(self.now, from, msg);
                assert_eq!(r, Ok(()), "a message of the protocol is refused");
                check(before, input, s.phase());
            }
            Step::Lose(i) if !self.flight.is_empty() && !self.lost => {
                self.flight.remove(i % self.flight.len());
                self.lost = true;
            }
            Step::Change(r, mask) => {
                self.masks[r as usize] = mask;
                let s = &mut self.ranks[r as usize];
                let before = s.phase();
                s.handle_local(self.now, view_of(mask));
                check(before, Input::Local, s.phase());
            }
            Step::Tick => {
                self.now += RETRY;
                for s in &mut self.ranks {
                    let before = s.phase();
                    s.handle_timeout(self.now);
                    check(before, Input::Timeout, s.phase());
                }
            }
            _ => {}
        }
        self.collect();
    }

    /// No more changes or losses: deliver, start and let time pass until every rank has started
    /// `max` collectives, nothing is in flight and no round is open.
    fn settle(&mut self, max: usize) {
        for _ in 0..10_000 {
            let world = self.ranks.len() as u32;
            let mut moved = false;
            while !self.flight.is_empty() {
                self.apply(&Step::Deliver(0), max);
                moved = true;
            }
            for r in 0..world {
                while self.start(r, max) {
                    moved = true;
                }
            }
            let done = self.planned.iter().all(|p| p.len() >= max) && self.ranks.iter().all(Switch::may_start);
            if done && self.flight.is_empty() {
                return;
            }
            if !moved {
                self.apply(&Step::Tick, max);
            }
        }
        panic!("the ranks never settled: {:?}", self.ranks.iter().map(Switch::waiting_for).collect::<Vec<_>>());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_rank_switches_at_the_same_collective(
        world in 1u32..6,
        steps in proptest::collection::vec(step(5), 0..300),
    ) {
        let mut net = Net::new(world);
        let steps: Vec<Step> = steps
            .into_iter()
            .filter(|s| !matches!(*s, Step::Start(r) | Step::Change(r, _) if r >= world))
            .collect();
        for st in &steps {
            net.apply(st, 60);
        }
        net.settle(60);
        // Every collective was planned with one view on every rank.
        for seq in 0..60 {
            let views: Vec<&Vec<NicId>> = net.planned.iter().map(|p| &p[seq]).collect();
            prop_assert!(views.windows(2).all(|w| w[0] == w[1]), "collective #{}: {:?}", seq + 1, views);
        }
        // Decisions still pending take effect; then every rank holds the merge of the last local
        // views (the union of their failures: NIC 1 of every node stays up).
        net.settle(120);
        let union = net.masks.iter().fold(0, |a, m| a | m);
        for s in &net.ranks {
            prop_assert_eq!(s.agreed().failed_nics(), view_of(union).failed_nics());
        }
        // Without a loss, a round costs at most 3 (world - 1) messages, and only changes start one.
        let sent: u64 = net.ranks.iter().map(Switch::messages_sent).sum();
        let rounds = net.ranks[LEADER as usize].rounds_decided();
        if !net.lost && !steps.iter().any(|s| matches!(s, Step::Tick)) {
            prop_assert!(sent <= 3 * u64::from(world - 1) * rounds, "{} messages in {} rounds", sent, rounds);
        }
        if !steps.iter().any(|s| matches!(s, Step::Change(..))) {
            prop_assert_eq!(sent, 0, "fault-free collectives send nothing");
        }
    }
}

/// The exact messages of one round: rank 2 of 3 sees a NIC go down before its collective 4,
/// while rank 1 has already started collective 5 (so the switch is at 6 for everyone).
#[test]
fn one_change_makes_one_round_of_six_messages_and_one_switch_point() {
    let mut net = Net::new(3);
    for (r, n) in [(0, 4), (1, 5), (2, 3)] {
        for _ in 0..n {
            assert!(net.start(r, 100));
        }
    }
    net.apply(&Step::Change(2, 0b010), 100);
    assert!(!net.ranks[2].may_start());
    let mut log = Vec::new();
    while !net.flight.is_empty() {
        let (from, to, msg) = net.flight[0].clone();
        let kind = match msg {
            SwitchMsg::Join { next, .. } => format!("join(next {next})"),
            SwitchMsg::Freeze { .. } => "freeze".to_owned(),
            SwitchMsg::Decide { at, .. } => format!("decide(at {at})"),
        };
        log.push(format!("{from}->{to} {kind}"));
        net.apply(&Step::Deliver(0), 100);
    }
    assert_eq!(
        log,
        [
            "2->0 join(next 4)",
            "0->1 freeze",
            "0->2 freeze",
            "1->0 join(next 6)",
            "0->1 decide(at 6)",
            "0->2 decide(at 6)",
        ]
    );
    for r in 0..3 {
        assert!(net.ranks[r].may_start());
        while net.planned[r].len() < 7 {
            net.start(r as u32, 7);
        }
        let failed: Vec<bool> = net.planned[r].iter().map(|f| !f.is_empty()).collect();
        assert_eq!(failed, [false, false, false, false, false, true, true], "rank {r}");
    }
    // Nothing more is sent while nothing changes.
    net.settle(50);
    assert!(net.flight.is_empty());
    assert_eq!(net.ranks.iter().map(Switch::messages_sent).sum::<u64>(), 6);
}

/// A lost decision is recovered by the rank's repeated Join; strangers and stale rounds are
/// refused or ignored without effect.
#[test]
fn a_lost_decision_is_repeated_and_bad_messages_change_nothing() {
    let mut net = Net::new(2);
    net.apply(&Step::Change(1, 0b001), 10);
    net.apply(&Step::Deliver(0), 10); // join -> leader, which decides at once (freeze goes too)
    assert_eq!(net.flight.len(), 2, "freeze and decide to rank 1: {:?}", net.flight);
    net.flight.clear(); // both lost
    assert!(!net.ranks[1].may_start());
    net.apply(&Step::Tick, 10);
    net.settle(3);
    assert_eq!(net.planned[1][0], vec![NicId::new(0, 0)]);
    assert_eq!(net.planned[0][0], vec![NicId::new(0, 0)]);
    let s = &mut net.ranks[1];
    assert!(s.handle_msg(Duration::ZERO, 7, SwitchMsg::Freeze { round: 9 }).is_err(), "a stranger");
    assert!(s.handle_msg(Duration::ZERO, 1, SwitchMsg::Freeze { round: 9 }).is_err(), "itself");
    let join = SwitchMsg::Join { round: 1, next: 1, view: view_of(0) };
    assert!(s.handle_msg(Duration::ZERO, 0, join).is_err(), "a join sent to a rank that does not lead");
    let stale = SwitchMsg::Decide { round: 1, at: 1, view: view_of(0b111) };
    assert_eq!(s.handle_msg(Duration::ZERO, 0, stale), Ok(()));
    assert!(s.may_start() && s.poll_transmit().is_none());
    assert_eq!(s.start(4), None, "a stale decision is not adopted");
}
