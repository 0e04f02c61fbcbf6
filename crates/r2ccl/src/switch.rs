//! When every rank switches to a new health view, sans-IO (MECHANISMS.md section 4): a
//! fault-free collective exchanges nothing; a change of any rank's local view starts one round,
//! coordinated by rank 0, after which every rank plans with the merged view from the same
//! collective on.
//!
//! A round: the rank whose view changed sends [`SwitchMsg::Join`] to the leader with its view and
//! `next`, the first collective it has not started, and starts no collective from then on. The
//! leader opens the round at the first Join (or at its own change), joins itself and sends
//! [`SwitchMsg::Freeze`] to every other rank; each answers with its own Join and stops likewise.
//! With every Join in, the leader merges the views ([`Agreement`]) and sends
//! [`SwitchMsg::Decide`] with `at`, the largest `next`. No rank has started collective `at`
//! (each stopped before its own `next`, at most `at`), so every rank runs its collectives before
//! `at` on the old view and `at` onward on the new one: the switch point is the same everywhere,
//! whatever the order messages arrive in. A round costs at most 3 (world - 1) messages.
//!
//! Lost messages are recovered: a rank that waits for a decision repeats its Join after the retry
//! interval, the leader repeats Freeze to the ranks it has not heard from, and a Join for a
//! round already decided is answered with that decision again. Nothing here decides how long is
//! too long: the driver bounds a frozen rank's wait with its collective deadline.
//!
//! Not done here: choosing the leader (rank 0, which every collective needs anyway), or surviving
//! its loss (the communicator fails with the peer-lost error, as for any rank).
//!
//! ```
//! use std::time::Duration;
//! use r2ccl::switch::{Switch, SwitchMsg};
//! use r2ccl_core::{HealthView, NicId};
//!
//! let view = HealthView::uniform(2, 2, 1000);
//! let mut ranks: Vec<Switch> = (0..2).map(|r| Switch::new(r, 2, view.clone(), Duration::from_millis(100))).collect();
//! // Rank 1 sees node 1's NIC 0 go down while it is about to start collective 5.
//! for s in &mut ranks {
//!     for seq in 1..5 {
//!         assert!(s.may_start());
//!         s.start(seq);
//!     }
//! }
//! let mut down = view.clone();
//! down.set_failed(NicId::new(1, 0)).unwrap();
//! ranks[1].handle_local(Duration::ZERO, down);
//! assert!(!ranks[1].may_start());
//! // Deliver messages until none is left (Join, Freeze, Join, Decide).
//! let mut flight = Vec::new();
//! loop {
//!     for (i, s) in ranks.iter_mut().enumerate() {
//!         while let Some((to, msg)) = s.poll_transmit() {
//!             flight.push((i as u32, to, msg));
//!         }
//!     }
//!     let Some((from, to, msg)) = flight.pop() else { break };
//!     ranks[to as usize].handle_msg(Duration::ZERO, from, msg).unwrap();
//! }
//! for s in &mut ranks {
//!     assert!(s.may_start());
//!     let adopted = s.start(5).expect("both switch at collective 5");
//!     assert_eq!(adopted.failed_nics(), vec![NicId::new(1, 0)]);
//! }
//! ```

use std::collections::VecDeque;
use std::time::Duration;

use r2ccl_core::HealthView;

use crate::agree::{AgreeError, Agreement};

/// The leader of every round.
pub const LEADER: u32 = 0;

/// One message of the switch protocol (carried on the OOB `Agree` channel).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwitchMsg {
    /// To the leader: the sender's local view for round `round`, and the first collective it has
    /// not started (it starts none until the round is decided).
    Join {
        /// The round.
        round: u64,
        /// The sender's first collective not started.
        next: u64,
        /// The sender's local view.
        view: HealthView,
    },
    /// From the leader: round `round` is open; answer with a Join.
    Freeze {
        /// The round.
        round: u64,
    },
    /// From the leader: from collective `at` on, plan with `view`.
    Decide {
        /// The round.
        round: u64,
        /// The first collective planned with `view`.
        at: u64,
        /// The merged view.
        view: HealthView,
    },
}

/// Where a rank stands in the protocol: the row key of [`TRANSITIONS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// No round joined: collectives start freely.
    Steady,
    /// A rank other than the leader joined a round and waits for its decision.
    Joined,
    /// The leader collects the Joins of an open round.
    Leading,
}

/// What a rank is given: the column key of [`TRANSITIONS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Input {
    /// [`Switch::handle_local`].
    Local,
    /// [`SwitchMsg::Freeze`] through [`Switch::handle_msg`].
    Freeze,
    /// [`SwitchMsg::Join`] through [`Switch::handle_msg`].
    Join,
    /// [`SwitchMsg::Decide`] through [`Switch::handle_msg`].
    Decide,
    /// [`Switch::handle_timeout`].
    Timeout,
    /// [`Switch::start`].
    Start,
}

/// Every transition the protocol makes, with why; any other is a bug (the reference-model tests
/// check each one they see against this table).
pub const TRANSITIONS: &[(Phase, Input, Phase, &str)] = {
    use Input as I;
    use Phase as P;
    &[
        (
            P::Steady,
            I::Local,
            P::Steady,
            "the view is the one last contributed (or a round of one rank decided at once)",
        ),
        (P::Steady, I::Local, P::Joined, "the view changed: Join to the leader, stop starting collectives"),
        (P::Steady, I::Local, P::Leading, "the leader's view changed: open a round, Freeze to every rank"),
        (P::Steady, I::Freeze, P::Steady, "a repeat for a round already decided"),
        (P::Steady, I::Freeze, P::Joined, "the leader opened a round: Join, stop starting collectives"),
        (
            P::Steady,
            I::Join,
            P::Steady,
            "a repeat of a decided round's Join (its decision is sent again), or a round of two decided at once",
        ),
        (P::Steady, I::Join, P::Leading, "the first Join of a round: open it, Freeze to every rank"),
        (P::Steady, I::Decide, P::Steady, "a repeat of a decision already taken"),
        (P::Steady, I::Timeout, P::Steady, "nothing unanswered"),
        (P::Steady, I::Start, P::Steady, "adopt the decided view if it takes effect at this collective"),
        (P::Joined, I::Local, P::Joined, "kept for the next round"),
        (P::Joined, I::Freeze, P::Joined, "already joined"),
        (
            P::Joined,
            I::Decide,
            P::Steady,
            "the decision: collectives start again, the view takes effect at its switch point",
        ),
        (
            P::Joined,
            I::Decide,
            P::Joined,
            "the decision, and the view changed meanwhile (or the next round is open): Join again",
        ),
        (P::Joined, I::Timeout, P::Joined, "repeat the Join"),
        (P::Leading, I::Local, P::Leading, "kept for the next round"),
        (
            P::Leading,
            I::Join,
            P::Leading,
            "a Join, and others still missing (or the view changed meanwhile: the next round opens)",
        ),
        (
            P::Leading,
            I::Join,
            P::Steady,
            "the last Join: Decide to every rank at the largest first-not-started collective",
        ),
        (P::Leading, I::Timeout, P::Leading, "repeat Freeze to the ranks not heard from"),
    ]
};

/// The round the leader is collecting.
#[derive(Clone, Debug)]
struct Collect {
    round: u64,
    merge: Agreement,
    at: u64,
    /// When Freeze was last sent to the ranks not heard from.
    asked_at: Duration,
}

/// One rank's side of the protocol.
#[derive(Clone, Debug)]
pub struct Switch {
    rank: u32,
    world: u32,
    retry: Duration,
    /// The view in force for the collectives started so far.
    agreed: HealthView,
    /// Decisions not in force yet: (first collective, view), in round order.
    pending: VecDeque<(u64, HealthView)>,
    /// The last round this rank knows decided.
    round: u64,
    /// The last collective started.
    started: u64,
    /// This rank's current local view, and the one it last contributed.
    local: HealthView,
    sent: HealthView,
    /// The round joined and not decided yet, with when the Join was last sent.
    joined: Option<(u64, Duration)>,
    /// The highest round the leader asked this rank to join.
    freeze_asked: u64,
    /// At the leader: the open round, and the last decision (repeated to a rank that lost it).
    collect: Option<Collect>,
    last_decided: Option<(u64, u64, HealthView)>,
    outbox: VecDeque<(u32, SwitchMsg)>,
    /// Messages sent so far.
    sent_msgs: u64,
}

impl Switch {
    /// Rank `rank` of `world`, with the view every rank starts from (the same everywhere) and
    /// the interval after which an unanswered message is repeated.
    pub fn new(rank: u32, world: u32, initial: HealthView, retry: Duration) -> Self {
        Self {
            rank,
            world,
            retry,
            agreed: initial.clone(),
            pending: VecDeque::new(),
            round: 0,
            started: 0,
            local: initial.clone(),
            sent: initial,
            joined: None,
            freeze_asked: 0,
            collect: None,
            last_decided: None,
            outbox: VecDeque::new(),
            sent_msgs: 0,
        }
    }

    /// Where this rank stands.
    pub const fn phase(&self) -> Phase {
        match self.joined {
            None => Phase::Steady,
            Some(_) if self.rank == LEADER => Phase::Leading,
            Some(_) => Phase::Joined,
        }
    }

    /// Whether the next collective may start now (false while a round this rank joined is open).
    pub const fn may_start(&self) -> bool {
        self.joined.is_none()
    }

    /// The round this rank waits for, and the ranks the leader has not heard from (at the
    /// leader; empty elsewhere).
    pub fn waiting_for(&self) -> Option<(u64, Vec<u32>)> {
        let (round, _) = self.joined?;
        let missing = self.collect.as_ref().map(|c| c.merge.missing()).unwrap_or_default();
        Some((round, missing))
    }

    /// The view in force for the collectives started so far.
    pub const fn agreed(&self) -> &HealthView {
        &self.agreed
    }

    /// Rounds this rank knows decided.
    pub const fn rounds_decided(&self) -> u64 {
        self.round
    }

    /// Messages this rank has sent so far.
    pub const fn messages_sent(&self) -> u64 {
        self.sent_msgs
    }

    /// Collective `seq` starts (only when [`Self::may_start`]; `seq` is one more than the last).
    /// Returns the view it adopts from this collective on, if a decision takes effect here.
    pub fn start(&mut self, seq: u64) -> Option<HealthView> {
        debug_assert!(self.may_start(), "a collective started during an open round");
        self.started = seq;
        let mut adopted = None;
        while self.pending.front().is_some_and(|(at, _)| *at <= seq) {
            adopted = self.pending.pop_front().map(|(_, v)| v);
        }
        if let Some(v) = &adopted {
            self.agreed = v.clone();
        }
        adopted
    }

    /// This rank's local view now; a view other than the one last contributed starts a round
    /// (or waits for the open one to be decided).
    pub fn handle_local(&mut self, now: Duration, view: HealthView) {
        self.local = view;
        self.maybe_join(now);
    }

    /// Repeat what is unanswered after the retry interval.
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.rank == LEADER {
            let ask: Vec<u32> = match &mut self.collect {
                Some(c) if now.saturating_sub(c.asked_at) >= self.retry => {
                    c.asked_at = now;
                    c.merge.missing()
                }
                _ => Vec::new(),
            };
            if let Some(round) = self.collect.as_ref().map(|c| c.round) {
                for to in ask {
                    self.send(to, SwitchMsg::Freeze { round });
                }
            }
        } else if let Some((round, at)) = self.joined {
            if now.saturating_sub(at) >= self.retry {
                self.joined = Some((round, now));
                let msg = SwitchMsg::Join { round, next: self.started + 1, view: self.sent.clone() };
                self.send(LEADER, msg);
            }
        }
    }

    /// When [`Switch::handle_timeout`] next has something to repeat (`None`: nothing is
    /// unanswered), so that an idle driver can sleep until then.
    pub fn poll_timeout(&self) -> Option<Duration> {
        if self.rank == LEADER {
            self.collect.as_ref().map(|c| c.asked_at + self.retry)
        } else {
            self.joined.map(|(_, at)| at + self.retry)
        }
    }

    /// A message from rank `from`. Messages of rounds already over are ignored (a Join of the
    /// last decided round is answered with its decision again).
    pub fn handle_msg(&mut self, now: Duration, from: u32, msg: SwitchMsg) -> Result<(), AgreeError> {
        if from >= self.world || from == self.rank {
            return Err(AgreeError::UnknownRank(from));
        }
        match msg {
            SwitchMsg::Join { round, next, view } if self.rank == LEADER => self.on_join(now, from, round, next, &view),
            SwitchMsg::Freeze { round } if from == LEADER => {
                self.freeze_asked = self.freeze_asked.max(round);
                self.maybe_join(now);
                Ok(())
            }
            SwitchMsg::Decide { round, at, view } if from == LEADER => {
                if self.joined.is_some_and(|(r, _)| r == round) {
                    self.decided(now, round, at, view);
                }
                Ok(())
            }
            _ => Err(AgreeError::Malformed { from, why: "a switch message this rank does not take" }),
        }
    }

    /// The next message to send: (destination rank, message).
    pub fn poll_transmit(&mut self) -> Option<(u32, SwitchMsg)> {
        self.outbox.pop_front()
    }

    fn send(&mut self, to: u32, msg: SwitchMsg) {
        self.sent_msgs += 1;
        self.outbox.push_back((to, msg));
    }

    /// Join the next round if this rank's view changed or the leader asked, and none is open here.
    fn maybe_join(&mut self, now: Duration) {
        let round = self.round + 1;
        if self.joined.is_some() || (same_health(&self.local, &self.sent) && self.freeze_asked < round) {
            return;
        }
        self.sent = self.local.clone();
        self.joined = Some((round, now));
        let next = self.started + 1;
        if self.rank == LEADER {
            self.open(now, round, next);
        } else {
            self.send(LEADER, SwitchMsg::Join { round, next, view: self.sent.clone() });
        }
    }

    /// At the leader: open `round` with its own view and ask every other rank.
    fn open(&mut self, now: Duration, round: u64, next: u64) {
        let merge = Agreement::new(round, LEADER, self.world, self.sent.clone());
        self.collect = Some(Collect { round, merge, at: next, asked_at: now });
        for to in (0..self.world).filter(|&r| r != LEADER) {
            self.send(to, SwitchMsg::Freeze { round });
        }
        self.maybe_decide(now);
    }

    fn on_join(
        &mut self,
        now: Duration,
        from: u32,
        round: u64,
        next: u64,
        view: &HealthView,
    ) -> Result<(), AgreeError> {
        if let Some((r, at, v)) = &self.last_decided {
            if *r == round {
                // That rank lost the decision: repeat it.
                let msg = SwitchMsg::Decide { round, at: *at, view: v.clone() };
                self.send(from, msg);
                return Ok(());
            }
        }
        if round <= self.round {
            // A repeat of an older round's Join: that round is over.
            return Ok(());
        }
        if round > self.round + 1 {
            return Err(AgreeError::Malformed { from, why: "a join for a round that is not open" });
        }
        if self.collect.is_none() {
            // This rank's own view goes in as it stands now.
            self.sent = self.local.clone();
            self.joined = Some((round, now));
            self.open(now, round, self.started + 1);
        }
        if let Some(c) = &mut self.collect {
            if c.merge.handle_view(from, round, view)? {
                c.at = c.at.max(next);
            }
        }
        self.maybe_decide(now);
        Ok(())
    }

    fn maybe_decide(&mut self, now: Duration) {
        let Some(c) = self.collect.take_if(|c| c.merge.is_complete()) else { return };
        let Some(view) = c.merge.result() else { return };
        for to in (0..self.world).filter(|&r| r != LEADER) {
            self.send(to, SwitchMsg::Decide { round: c.round, at: c.at, view: view.clone() });
        }
        self.last_decided = Some((c.round, c.at, view.clone()));
        self.decided(now, c.round, c.at, view);
    }

    fn decided(&mut self, now: Duration, round: u64, at: u64, view: HealthView) {
        self.round = round;
        self.joined = None;
        self.pending.push_back((at, view));
        // A change seen while the round was open, or a later round the leader already asked for.
        self.maybe_join(now);
    }
}

/// Whether two views say the same of every NIC (their epochs aside).
fn same_health(a: &HealthView, b: &HealthView) -> bool {
    a.nodes() == b.nodes()
}
