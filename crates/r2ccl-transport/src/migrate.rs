//! The lane migration protocol (MECHANISMS.md 2.2 and 3): the one state machine that moves a
//! quiesced lane to a new path, with both ends agreeing on its replay boundary.
//!
//! It is the spec's sender-authoritative, epoch-numbered FAILOVER_REQ / FAILOVER_ACK exchange,
//! keyed by lane (the unit the [`Session`](crate::Session) migrates):
//! - the sender's [`Migrations`] runs one table-driven machine per lane ([`TRANSITIONS`]; a pair
//!   missing from the table is an [`IllegalMigration`]): a lane the session stopped
//!   ([`SessionEvent::MigrationNeeded`](crate::SessionEvent::MigrationNeeded)) gets a new epoch
//!   and a [`MigrateReq`] naming the new path and the sender's completed prefix, resent until
//!   the [`MigrateAck`] of that epoch comes; stale acknowledgements are ignored; a lane with no
//!   usable path waits for one until the no-path deadline, then is reported as
//!   [`MigrateOutput::NoPathLeft`];
//! - the receiver's [`Receiver`] answers a request with the boundary min(sender_done, what it
//!   holds), applies each epoch once, re-acknowledges a duplicate with the same boundary and
//!   ignores a stale one.
//!
//! The receiver-initiated half of the spec (FAILOVER_HINT) is the control plane's path-down
//! notice: the receiver tells the sender that a path failed, and the sender's session stops the
//! lanes on it. The OOB channel is reliable and ordered per peer, so the notice is sent once.
//!
//! Sans-IO: time comes in as `now`; path choices come in from the caller (the session's
//! backup chain), messages leave through [`Migrations::poll_transmit`] and decisions through
//! [`Migrations::poll_output`].

use crate::ids::{LaneId, PathId, TransferKey};
use crate::session::MigrationRequest;
use r2ccl_core::{NicId, Rank};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

/// FAILOVER_REQ, sender to receiver: lane `lane` moves to the path (`local` -> `remote`, in the
/// sender's view) and replays from min(`sender_done`, what the receiver holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrateReq {
    /// The lane.
    pub lane: LaneId,
    /// The lane's first chunk.
    pub start: u32,
    /// One past the lane's last chunk.
    pub end: u32,
    /// The sender's completed prefix: every chunk in `start..sender_done` completed.
    pub sender_done: u32,
    /// The sender's new NIC.
    pub local: NicId,
    /// The receiver's new NIC.
    pub remote: NicId,
    /// The lane's migration epoch.
    pub epoch: u32,
}

impl MigrateReq {
    /// The new path as the receiver (the rank that got the request from `sender`) sees it.
    pub const fn receiver_path(&self, sender: Rank) -> PathId {
        PathId { local: self.remote, peer: sender, remote: self.local }
    }
}

/// FAILOVER_ACK, receiver to sender: replay lane `lane` from `boundary`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrateAck {
    /// The lane.
    pub lane: LaneId,
    /// First chunk to replay (never ahead of what the receiver holds).
    pub boundary: u32,
    /// The epoch of the request this answers.
    pub epoch: u32,
}

/// Where one lane's migration stands on the sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneState {
    /// Nothing pending (never stopped, or its last migration was applied).
    Idle,
    /// Stopped with no usable path; waiting for one.
    WaitingForPath {
        /// The session's request.
        req: MigrationRequest,
        /// When the lane stopped (the no-path deadline counts from here).
        stopped_at: Duration,
    },
    /// FAILOVER_REQ sent; waiting for its acknowledgement.
    Requested {
        /// The session's request.
        req: MigrationRequest,
        /// The new path.
        to: PathId,
        /// When the lane stopped.
        stopped_at: Duration,
        /// When the request was last sent.
        sent_at: Duration,
    },
}

/// The state without its data: a row key of the transition table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StateKind {
    /// See [`LaneState::Idle`].
    Idle,
    /// See [`LaneState::WaitingForPath`].
    WaitingForPath,
    /// See [`LaneState::Requested`].
    Requested,
}

impl StateKind {
    /// Every state kind, in table order.
    pub const ALL: [StateKind; 3] = [StateKind::Idle, StateKind::WaitingForPath, StateKind::Requested];
}

impl LaneState {
    /// The state's kind.
    pub const fn kind(&self) -> StateKind {
        match self {
            LaneState::Idle => StateKind::Idle,
            LaneState::WaitingForPath { .. } => StateKind::WaitingForPath,
            LaneState::Requested { .. } => StateKind::Requested,
        }
    }
}

/// An input of the lane machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneEvent {
    /// The session stopped the lane (its path failed, or a better one is usable); `path` is the
    /// path the caller chose for it, if any is usable.
    Stopped {
        /// The session's request.
        req: MigrationRequest,
        /// When it stopped.
        stopped_at: Duration,
        /// The chosen path.
        path: Option<PathId>,
    },
    /// A timer: a waiting lane looks for a path again, a requested one resends.
    Tick {
        /// A usable path, if any.
        path: Option<PathId>,
        /// Whether the no-path deadline has passed.
        expired: bool,
    },
    /// The receiver's acknowledgement.
    Ack(MigrateAck),
    /// The whole transfer was received: nothing of it needs a path any more.
    Released,
}

/// The event without its data: a column key of the transition table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    /// See [`LaneEvent::Stopped`].
    Stopped,
    /// See [`LaneEvent::Tick`].
    Tick,
    /// See [`LaneEvent::Ack`].
    Ack,
    /// See [`LaneEvent::Released`].
    Released,
}

impl EventKind {
    /// Every event kind, in table order.
    pub const ALL: [EventKind; 4] = [EventKind::Stopped, EventKind::Tick, EventKind::Ack, EventKind::Released];
}

impl LaneEvent {
    /// The event's kind.
    pub const fn kind(&self) -> EventKind {
        match self {
            LaneEvent::Stopped { .. } => EventKind::Stopped,
            LaneEvent::Tick { .. } => EventKind::Tick,
            LaneEvent::Ack(_) => EventKind::Ack,
            LaneEvent::Released => EventKind::Released,
        }
    }
}

/// A condition on a transition beyond its state and event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Guard {
    /// No condition.
    Always,
    /// A usable path was chosen.
    PathFree,
    /// No usable path, and (for a tick) the deadline has not passed.
    NoPath,
    /// No usable path and the no-path deadline has passed.
    Expired,
    /// The acknowledgement answers the lane's current epoch.
    CurrentEpoch,
    /// The acknowledgement answers an older epoch.
    StaleEpoch,
}

impl Guard {
    fn holds(self, epoch: u32, event: &LaneEvent) -> bool {
        let (path, expired) = match *event {
            LaneEvent::Stopped { path, .. } => (path, false),
            LaneEvent::Tick { path, expired } => (path, expired),
            _ => (None, false),
        };
        match self {
            Guard::Always => true,
            Guard::PathFree => path.is_some(),
            Guard::NoPath => path.is_none() && !expired,
            Guard::Expired => path.is_none() && expired,
            Guard::CurrentEpoch => matches!(event, LaneEvent::Ack(a) if a.epoch == epoch),
            Guard::StaleEpoch => matches!(event, LaneEvent::Ack(a) if a.epoch != epoch),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Guard::Always => "-",
            Guard::PathFree => "path usable",
            Guard::NoPath => "no path, in time",
            Guard::Expired => "no path, deadline past",
            Guard::CurrentEpoch => "epoch = current",
            Guard::StaleEpoch => "epoch != current",
        }
    }
}

/// What [`Migrations`] does on a transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Nothing.
    Ignore,
    /// Next epoch; send FAILOVER_REQ for the chosen path.
    Request,
    /// Resend the outstanding FAILOVER_REQ (same epoch).
    Resend,
    /// Keep waiting for a usable path.
    Wait,
    /// Report [`MigrateOutput::Apply`]: replay from the acknowledged boundary on the new path.
    Apply,
    /// Report [`MigrateOutput::NoPathLeft`].
    GiveUp,
    /// Forget the lane.
    Forget,
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
    /// What is done.
    pub action: Action,
    /// The action in words.
    pub says: &'static str,
}

const fn rule(
    from: StateKind,
    event: EventKind,
    guard: Guard,
    to: StateKind,
    action: Action,
    says: &'static str,
) -> TransitionRule {
    TransitionRule { from, event, guard, to, action, says }
}

use EventKind as E;
use StateKind as S;

/// The transition table of the lane machine. Pairs not listed are illegal.
pub const TRANSITIONS: &[TransitionRule] = &[
    rule(S::Idle, E::Stopped, Guard::PathFree, S::Requested, Action::Request, "next epoch, send REQ"),
    rule(S::Idle, E::Stopped, Guard::NoPath, S::WaitingForPath, Action::Wait, "wait for a usable path"),
    rule(S::Idle, E::Ack, Guard::Always, S::Idle, Action::Ignore, "late or duplicate ACK: ignore"),
    rule(S::Idle, E::Released, Guard::Always, S::Idle, Action::Forget, "forget the lane"),
    rule(S::WaitingForPath, E::Stopped, Guard::PathFree, S::Requested, Action::Request, "next epoch, send REQ"),
    rule(S::WaitingForPath, E::Stopped, Guard::NoPath, S::WaitingForPath, Action::Wait, "keep the first stop time"),
    rule(S::WaitingForPath, E::Tick, Guard::PathFree, S::Requested, Action::Request, "next epoch, send REQ"),
    rule(S::WaitingForPath, E::Tick, Guard::NoPath, S::WaitingForPath, Action::Wait, "keep waiting"),
    rule(S::WaitingForPath, E::Tick, Guard::Expired, S::Idle, Action::GiveUp, "report no path left"),
    rule(S::WaitingForPath, E::Ack, Guard::Always, S::WaitingForPath, Action::Ignore, "stale ACK: ignore"),
    rule(S::WaitingForPath, E::Released, Guard::Always, S::Idle, Action::Forget, "forget the lane"),
    rule(S::Requested, E::Stopped, Guard::PathFree, S::Requested, Action::Request, "next epoch, send REQ"),
    rule(S::Requested, E::Stopped, Guard::NoPath, S::WaitingForPath, Action::Wait, "drop the REQ, wait"),
    rule(S::Requested, E::Tick, Guard::Always, S::Requested, Action::Resend, "no ACK in the retry time: resend"),
    rule(S::Requested, E::Ack, Guard::CurrentEpoch, S::Idle, Action::Apply, "replay from the boundary"),
    rule(S::Requested, E::Ack, Guard::StaleEpoch, S::Requested, Action::Ignore, "stale ACK: ignore"),
    rule(S::Requested, E::Released, Guard::Always, S::Idle, Action::Forget, "forget the lane"),
];

/// An event that the table does not allow in the current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal lane migration transition: event {event:?} in state {state:?}")]
pub struct IllegalMigration {
    /// The state the lane was in (unchanged).
    pub state: StateKind,
    /// The refused event.
    pub event: EventKind,
}

/// The rule for `event` in `state` at lane epoch `epoch`.
pub fn rule_for(state: StateKind, epoch: u32, event: &LaneEvent) -> Result<&'static TransitionRule, IllegalMigration> {
    TRANSITIONS
        .iter()
        .find(|r| r.from == state && r.event == event.kind() && r.guard.holds(epoch, event))
        .ok_or(IllegalMigration { state, event: event.kind() })
}

/// Something the sender's machine decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrateOutput {
    /// Both ends agreed: move the lane to `to` and replay from `boundary`
    /// ([`Session::handle_migrate`](crate::Session::handle_migrate)).
    Apply {
        /// The session's request.
        req: MigrationRequest,
        /// The new path.
        to: PathId,
        /// The acknowledged boundary.
        boundary: u32,
        /// When the lane stopped.
        stopped_at: Duration,
    },
    /// No usable path appeared within the no-path deadline.
    NoPathLeft {
        /// The session's request.
        req: MigrationRequest,
        /// How long it waited.
        waited: Duration,
    },
}

/// The sender's timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrateConfig {
    /// An unacknowledged FAILOVER_REQ is resent after this long.
    pub retry: Duration,
    /// A lane with no usable path for this long is reported as [`MigrateOutput::NoPathLeft`].
    pub no_path_timeout: Duration,
}

#[derive(Clone, Copy, Debug)]
struct Lane {
    state: LaneState,
    epoch: u32,
}

/// The sender's side: one lane machine per lane that has stopped, with its epoch.
#[derive(Debug)]
pub struct Migrations {
    cfg: MigrateConfig,
    lanes: BTreeMap<LaneId, Lane>,
    transmit: VecDeque<(Rank, MigrateReq)>,
    outputs: VecDeque<MigrateOutput>,
}

impl Migrations {
    /// No lane pending.
    pub const fn new(cfg: MigrateConfig) -> Self {
        Self { cfg, lanes: BTreeMap::new(), transmit: VecDeque::new(), outputs: VecDeque::new() }
    }

    /// The session stopped `req.lane` at `stopped_at`; `path` is the caller's choice of a new
    /// path for it (`Session::choose_path`), if any is usable.
    pub fn handle_stopped(
        &mut self,
        now: Duration,
        req: MigrationRequest,
        stopped_at: Duration,
        path: Option<PathId>,
    ) -> Result<(), IllegalMigration> {
        self.step(now, req.lane, LaneEvent::Stopped { req, stopped_at, path })
    }

    /// The receiver's acknowledgement, from rank `from`. One from another rank than the lane's
    /// receiver is refused (`false`) and changes nothing.
    pub fn handle_ack(&mut self, now: Duration, from: Rank, ack: MigrateAck) -> Result<bool, IllegalMigration> {
        if ack.lane.transfer.dst != from {
            return Ok(false);
        }
        if !self.lanes.contains_key(&ack.lane) {
            return Ok(true);
        }
        self.step(now, ack.lane, LaneEvent::Ack(ack))?;
        Ok(true)
    }

    /// Every lane of `key` is done with (its receiver holds it all).
    pub fn handle_released(&mut self, now: Duration, key: TransferKey) -> Result<(), IllegalMigration> {
        let lanes: Vec<LaneId> = self.lanes.range(lane_range(key)).map(|(l, _)| *l).collect();
        for lane in lanes {
            self.step(now, lane, LaneEvent::Released)?;
        }
        Ok(())
    }

    /// Run the timers: a waiting lane looks for a path again (`choose`) or gives up past the
    /// no-path deadline; a request unanswered for the retry time is resent.
    pub fn handle_timeout(
        &mut self,
        now: Duration,
        mut choose: impl FnMut(&MigrationRequest) -> Option<PathId>,
    ) -> Result<(), IllegalMigration> {
        let due: Vec<(LaneId, LaneEvent)> = self
            .lanes
            .iter()
            .filter_map(|(&id, l)| match l.state {
                LaneState::Idle => None,
                LaneState::WaitingForPath { req, stopped_at } => {
                    let expired = now.saturating_sub(stopped_at) > self.cfg.no_path_timeout;
                    Some((id, LaneEvent::Tick { path: choose(&req), expired }))
                }
                LaneState::Requested { sent_at, .. } if now >= sent_at + self.cfg.retry => {
                    Some((id, LaneEvent::Tick { path: None, expired: false }))
                }
                LaneState::Requested { .. } => None,
            })
            .collect();
        for (lane, ev) in due {
            self.step(now, lane, ev)?;
        }
        Ok(())
    }

    /// When [`Migrations::handle_timeout`] has work: the earliest resend, or just past the
    /// earliest no-path deadline. (A waiting lane also finds a path whenever the caller runs
    /// the timers after a path came back.)
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.lanes
            .values()
            .filter_map(|l| match l.state {
                LaneState::Idle => None,
                LaneState::WaitingForPath { stopped_at, .. } => {
                    Some(stopped_at + self.cfg.no_path_timeout + Duration::from_millis(1))
                }
                LaneState::Requested { sent_at, .. } => Some(sent_at + self.cfg.retry),
            })
            .min()
    }

    /// The next request to send, with its receiver.
    pub fn poll_transmit(&mut self) -> Option<(Rank, MigrateReq)> {
        self.transmit.pop_front()
    }

    /// The next decision.
    pub fn poll_output(&mut self) -> Option<MigrateOutput> {
        self.outputs.pop_front()
    }

    /// `lane`'s state (Idle for a lane never stopped).
    pub fn state(&self, lane: LaneId) -> LaneState {
        self.lanes.get(&lane).map_or(LaneState::Idle, |l| l.state)
    }

    /// `lane`'s epoch: how many requests it started (0 for a lane never requested).
    pub fn epoch(&self, lane: LaneId) -> u32 {
        self.lanes.get(&lane).map_or(0, |l| l.epoch)
    }

    /// Lanes not idle: waiting for a path or for an acknowledgement.
    pub fn pending(&self) -> impl Iterator<Item = (LaneId, LaneState)> + '_ {
        self.lanes.iter().filter(|(_, l)| l.state != LaneState::Idle).map(|(&id, l)| (id, l.state))
    }

    /// Forget every lane (a new collective; nothing of the old one is migrated any more).
    pub fn clear(&mut self) {
        self.lanes.clear();
        self.transmit.clear();
        self.outputs.clear();
    }

    fn step(&mut self, now: Duration, id: LaneId, event: LaneEvent) -> Result<(), IllegalMigration> {
        let lane = self.lanes.get(&id).copied().unwrap_or(Lane { state: LaneState::Idle, epoch: 0 });
        let r = rule_for(lane.state.kind(), lane.epoch, &event)?;
        let (req, stopped_at) = match (lane.state, event) {
            (_, LaneEvent::Stopped { req, stopped_at, .. }) => {
                // A lane stopped again while it waited keeps its first stop time.
                let first = match lane.state {
                    LaneState::WaitingForPath { stopped_at: s, .. } | LaneState::Requested { stopped_at: s, .. } => {
                        s.min(stopped_at)
                    }
                    LaneState::Idle => stopped_at,
                };
                (Some(req), first)
            }
            (LaneState::WaitingForPath { req, stopped_at } | LaneState::Requested { req, stopped_at, .. }, _) => {
                (Some(req), stopped_at)
            }
            (LaneState::Idle, _) => (None, now),
        };
        let path = match event {
            LaneEvent::Stopped { path, .. } | LaneEvent::Tick { path, .. } => path,
            _ => None,
        };
        let mut next = Lane { state: LaneState::Idle, epoch: lane.epoch };
        match (r.action, req) {
            (Action::Ignore, _) => next.state = lane.state,
            (Action::Request, Some(req)) => {
                let Some(to) = path else { return Err(IllegalMigration { state: r.from, event: r.event }) };
                next.epoch = lane.epoch.saturating_add(1);
                next.state = LaneState::Requested { req, to, stopped_at, sent_at: now };
                self.transmit.push_back((id.transfer.dst, request(req, to, next.epoch)));
            }
            (Action::Resend, Some(req)) => {
                if let LaneState::Requested { to, stopped_at, .. } = lane.state {
                    next.state = LaneState::Requested { req, to, stopped_at, sent_at: now };
                    self.transmit.push_back((id.transfer.dst, request(req, to, lane.epoch)));
                }
            }
            (Action::Wait, Some(req)) => next.state = LaneState::WaitingForPath { req, stopped_at },
            (Action::Apply, Some(req)) => {
                if let (LaneState::Requested { to, stopped_at, .. }, LaneEvent::Ack(a)) = (lane.state, event) {
                    self.outputs.push_back(MigrateOutput::Apply { req, to, boundary: a.boundary, stopped_at });
                }
            }
            (Action::GiveUp, Some(req)) => {
                self.outputs.push_back(MigrateOutput::NoPathLeft { req, waited: now.saturating_sub(stopped_at) });
            }
            (Action::Forget, _) => {
                self.lanes.remove(&id);
                return Ok(());
            }
            (_, None) => return Err(IllegalMigration { state: r.from, event: r.event }),
        }
        debug_assert_eq!(next.state.kind(), r.to, "{r:?}");
        self.lanes.insert(id, next);
        Ok(())
    }
}

fn lane_range(key: TransferKey) -> std::ops::RangeInclusive<LaneId> {
    LaneId { transfer: key, lane: 0 }..=LaneId { transfer: key, lane: u16::MAX }
}

const fn request(req: MigrationRequest, to: PathId, epoch: u32) -> MigrateReq {
    MigrateReq {
        lane: req.lane,
        start: req.start,
        end: req.end,
        sender_done: req.sender_done,
        local: to.local,
        remote: to.remote,
        epoch,
    }
}

/// What the receiver does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReqOutcome {
    /// A new epoch: move the lane to the request's path from `boundary`
    /// ([`Session::handle_peer_migrate`](crate::Session::handle_peer_migrate)) and send the ACK.
    Apply(MigrateAck),
    /// Only send the ACK: a duplicate of the current epoch (same boundary as before), or a
    /// transfer this rank does not hold (nothing to move; replay from the lane's start).
    AckOnly(MigrateAck),
    /// An epoch older than one already applied: ignored.
    Stale,
}

/// The receiver's side: the last applied epoch and boundary per lane.
#[derive(Debug, Default)]
pub struct Receiver {
    applied: BTreeMap<LaneId, (u32, u32)>,
}

impl Receiver {
    /// Nothing applied.
    pub fn new() -> Self {
        Self::default()
    }

    /// A request for a lane of which this rank holds the prefix `start..held` (`None`: the
    /// transfer is not posted here, or already finished).
    pub fn handle_req(&mut self, req: &MigrateReq, held: Option<u32>) -> ReqOutcome {
        let ack = |boundary| MigrateAck { lane: req.lane, boundary, epoch: req.epoch };
        match self.applied.get(&req.lane) {
            Some(&(epoch, _)) if req.epoch < epoch => return ReqOutcome::Stale,
            Some(&(epoch, boundary)) if req.epoch == epoch => return ReqOutcome::AckOnly(ack(boundary)),
            _ => {}
        }
        let Some(held) = held else { return ReqOutcome::AckOnly(ack(req.start)) };
        let boundary = req.sender_done.min(held).max(req.start);
        self.applied.insert(req.lane, (req.epoch, boundary));
        ReqOutcome::Apply(ack(boundary))
    }

    /// Every lane of `key` arrived; forget them.
    pub fn release(&mut self, key: TransferKey) {
        let lanes: Vec<LaneId> = self.applied.range(lane_range(key)).map(|(l, _)| *l).collect();
        for l in lanes {
            self.applied.remove(&l);
        }
    }

    /// Forget every lane.
    pub fn clear(&mut self) {
        self.applied.clear();
    }
}

impl fmt::Display for StateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            StateKind::Idle => "Idle",
            StateKind::WaitingForPath => "WaitingForPath",
            StateKind::Requested => "Requested",
        })
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            EventKind::Stopped => "Stopped",
            EventKind::Tick => "Tick",
            EventKind::Ack => "Ack",
            EventKind::Released => "Released",
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
            notes: vec![format!("{:?}", r.action), r.says.to_owned()],
        })
        .collect()
}

fn state_names() -> Vec<String> {
    StateKind::ALL.iter().map(ToString::to_string).collect()
}

/// The transition table as aligned text: one line per rule, then the illegal pairs.
pub fn render_table() -> String {
    let events: Vec<String> = EventKind::ALL.iter().map(ToString::to_string).collect();
    let title = "# r2ccl-transport lane migration transitions (generated from migrate::TRANSITIONS)";
    r2ccl_core::table::render_text(title, &["action", "says"], &rules(), &state_names(), &events, "IllegalMigration")
}

/// The transition table as a Graphviz digraph (self-loops left out; they are in [`render_table`]).
pub fn render_dot() -> String {
    let source = "r2ccl_transport::migrate::TRANSITIONS by tests/migrate_machine.rs";
    r2ccl_core::table::render_dot(source, "lane_migration", &rules(), &state_names())
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
    fn every_guard_combination_has_exactly_one_rule() {
        let path = Some(PathId::new(NicId::new(0, 1), Rank(1), NicId::new(1, 1)));
        let key = TransferKey::new(1, 0, 0, 0, 1);
        let lane = LaneId { transfer: key, lane: 0 };
        let req = MigrationRequest {
            lane,
            from: PathId::new(NicId::new(0, 0), Rank(1), NicId::new(1, 0)),
            start: 0,
            end: 4,
            sender_done: 2,
            reason: crate::MoveReason::Failback,
        };
        let events = [
            LaneEvent::Stopped { req, stopped_at: Duration::ZERO, path },
            LaneEvent::Stopped { req, stopped_at: Duration::ZERO, path: None },
            LaneEvent::Tick { path, expired: false },
            LaneEvent::Tick { path: None, expired: false },
            LaneEvent::Tick { path: None, expired: true },
            LaneEvent::Ack(MigrateAck { lane, boundary: 1, epoch: 3 }),
            LaneEvent::Ack(MigrateAck { lane, boundary: 1, epoch: 2 }),
            LaneEvent::Released,
        ];
        for s in StateKind::ALL {
            for e in &events {
                let n =
                    TRANSITIONS.iter().filter(|r| r.from == s && r.event == e.kind() && r.guard.holds(3, e)).count();
                let illegal = s == StateKind::Idle && e.kind() == EventKind::Tick;
                assert_eq!(n, usize::from(!illegal), "{s} + {e:?}");
            }
        }
    }
}
