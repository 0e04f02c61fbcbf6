//! The per-rank detector: path health machines, localization rounds and recovery, driven by
//! `handle_*` inputs and drained with `poll_*`.

use crate::config::{ConfigError, DetectConfig};
use crate::health::{step, FailureCause, IllegalTransition, PathEvent, PathState, StateKind, SuspicionCause};
use crate::ids::{ConnId, PathId, PathPair, ProbeId};
use crate::output::{Command, DetectEvent};
use crate::triangulate::{localize, Observation, Observations, Verdict};
use crate::wire::{OobMessage, WireError};
use r2ccl_core::{NicId, NodeId, Rank};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// A rank of the cluster and the node it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Member {
    /// The rank.
    pub rank: Rank,
    /// Its node.
    pub node: NodeId,
}

/// What a driver-run probe reported (a probe without a report times out inside the detector).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    /// The probe was answered.
    Answered,
    /// The local NIC failed the probe at once.
    LocalError,
    /// The layer below saw the probe's bytes go unacknowledged for the stall time (the
    /// kernel's TCP state of the path): the timeout, known before the probe's deadline.
    Unacknowledged,
}

/// Why the detector refused an input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DetectError {
    /// The configuration is invalid.
    #[error("invalid detector configuration: {0}")]
    Config(#[from] ConfigError),
    /// This rank is not in the member list.
    #[error("{0} is not in the member list")]
    UnknownMember(Rank),
    /// The connection was never added.
    #[error("connection {0} is not known to this detector")]
    UnknownConn(ConnId),
    /// The connection was added twice.
    #[error("connection {0} is already registered")]
    DuplicateConn(ConnId),
    /// This rank is not exactly one end of the connection.
    #[error("{me} is not exactly one end of connection {conn}")]
    NotAnEnd {
        /// The connection.
        conn: ConnId,
        /// This rank.
        me: Rank,
    },
    /// The path's NIC is not on the node of the rank that must own it.
    #[error("path {path} of connection {conn}: NIC {nic} is not on {expected}")]
    WrongNode {
        /// The connection.
        conn: ConnId,
        /// The path.
        path: PathPair,
        /// The misplaced NIC.
        nic: NicId,
        /// The node it should be on.
        expected: NodeId,
    },
    /// A NIC that is not on this rank's node.
    #[error("NIC {nic} is not on this detector's node {node}")]
    ForeignNic {
        /// The NIC.
        nic: NicId,
        /// This rank's node.
        node: NodeId,
    },
    /// A path that no connection uses.
    #[error("path {0} is not known to this detector")]
    UnknownPath(PathId),
    /// An OOB frame that does not decode.
    #[error("OOB frame from {from}: {source}")]
    Wire {
        /// The sender.
        from: Rank,
        /// The decoding error.
        source: WireError,
    },
    /// An internal transition the table forbids (a bug in this crate).
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
}

/// An OOB message resent until its answer comes (the probe requests of localization rounds,
/// keyed by request id).
#[derive(Clone, Copy, Debug)]
struct Retx {
    to: Rank,
    msg: OobMessage,
    ask: bool,
    next_at: Duration,
    interval: Duration,
    left: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Ba,
    AuxA,
    AuxB,
}

#[derive(Clone, Copy, Debug)]
enum ProbeOwner {
    Localize(PathId),
    Reprobe(PathId),
    Serve { rank: Rank, id: u64 },
}

#[derive(Clone, Copy, Debug)]
struct ProbeEntry {
    owner: ProbeOwner,
    deadline: Duration,
}

#[derive(Clone, Debug)]
struct Localization {
    ab: Option<Observation>,
    ba: Option<Observation>,
    aux: Option<(Option<Observation>, Option<Observation>)>,
    deadline: Duration,
    probe: Option<ProbeId>,
    requests: Vec<u64>,
}

#[derive(Clone, Debug)]
struct PathEntry {
    state: PathState,
    progress_deadline: Option<Duration>,
    last_alive: Duration,
    next_heartbeat: Duration,
    reprobe_at: Option<Duration>,
    loc: Option<Localization>,
    holddown_until: Duration,
    flaps: u32,
    recovered_at: Option<Duration>,
}

/// The failure detector of one rank. See the crate docs for the driving loop.
#[derive(Clone, Debug)]
pub struct Detector {
    cfg: DetectConfig,
    me: Rank,
    node: NodeId,
    members: Vec<Member>,
    paths: BTreeMap<PathId, PathEntry>,
    /// Each connection's one watched path, in this rank's view.
    conns: BTreeMap<ConnId, PathId>,
    probes: BTreeMap<ProbeId, ProbeEntry>,
    requests: BTreeMap<u64, (PathId, Slot)>,
    served: BTreeMap<(Rank, u64), (Option<Observation>, Duration)>,
    /// Per rank, how many of its `served` requests are open (no outcome yet) and in all.
    served_by: BTreeMap<Rank, (usize, usize)>,
    retx: BTreeMap<u64, Retx>,
    next_id: u64,
    commands: VecDeque<Command>,
    events: VecDeque<DetectEvent>,
}

/// How long answered probe requests are remembered, to answer duplicates from.
const REMEMBER: Duration = Duration::from_secs(10);
/// The most probe requests of one rank served at a time; more are rejected. A rank asks a helper
/// two per path it localizes, and every rank asks the same helper (the first member on neither
/// end's node): one NIC lost under an AlltoAll of 512 nodes asks it about 1,000 at once.
pub const MAX_OPEN_REQUESTS: usize = 1024;
/// The most probe requests of one rank remembered (for 10 s); more are rejected.
pub const MAX_REMEMBERED_REQUESTS: usize = 16 * 1024;

impl Detector {
    /// A detector for rank `me` in a cluster of `members` (every rank with its node).
    ///
    /// Errors: an invalid configuration ([`DetectConfig::validate`]) or a `me` that is not
    /// in `members`.
    ///
    /// ```rust
    /// use r2ccl_core::{NodeId, Rank};
    /// use r2ccl_detect::{DetectConfig, DetectError, Detector, Member};
    ///
    /// let members = [Member { rank: Rank(0), node: NodeId(0) }, Member { rank: Rank(1), node: NodeId(1) }];
    /// let det = Detector::new(DetectConfig::default(), Rank(1), &members)?;
    /// assert_eq!(det.rank(), Rank(1));
    /// assert_eq!(det.poll_timeout(), None); // no connection yet, so no timer
    ///
    /// let stranger = Detector::new(DetectConfig::default(), Rank(7), &members);
    /// assert_eq!(stranger.err(), Some(DetectError::UnknownMember(Rank(7))));
    /// let bad = DetectConfig { good_probes: 0, ..DetectConfig::default() };
    /// assert!(matches!(Detector::new(bad, Rank(0), &members), Err(DetectError::Config(_))));
    /// # Ok::<(), DetectError>(())
    /// ```
    pub fn new(cfg: DetectConfig, me: Rank, members: &[Member]) -> Result<Self, DetectError> {
        cfg.validate()?;
        let mut members = members.to_vec();
        members.sort();
        members.dedup();
        let node = members.iter().find(|m| m.rank == me).map(|m| m.node).ok_or(DetectError::UnknownMember(me))?;
        Ok(Self {
            cfg,
            me,
            node,
            members,
            paths: BTreeMap::new(),
            conns: BTreeMap::new(),
            probes: BTreeMap::new(),
            requests: BTreeMap::new(),
            served: BTreeMap::new(),
            served_by: BTreeMap::new(),
            retx: BTreeMap::new(),
            next_id: 1,
            commands: VecDeque::new(),
            events: VecDeque::new(),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &DetectConfig {
        &self.cfg
    }

    /// This detector's rank.
    pub fn rank(&self) -> Rank {
        self.me
    }

    fn node_of(&self, rank: Rank) -> Result<NodeId, DetectError> {
        self.members.iter().find(|m| m.rank == rank).map(|m| m.node).ok_or(DetectError::UnknownMember(rank))
    }

    /// Watch connection `conn` (this rank is one end of it) on `path`: the signals about
    /// `conn` (errors, transfers, progress) apply to that path. Several connections between
    /// the same two ranks over the same NIC pair share one path and its health.
    ///
    /// Errors: this rank is not exactly one end of `conn`, `conn` is already watched, a rank
    /// of `conn` is not a member, or a NIC of `path` is not on its end's node.
    pub fn add_connection(&mut self, now: Duration, conn: ConnId, path: PathPair) -> Result<(), DetectError> {
        let pid = match (conn.src == self.me, conn.dst == self.me) {
            (true, false) => PathId { local: path.src_nic, peer: conn.dst, remote: path.dst_nic },
            (false, true) => PathId { local: path.dst_nic, peer: conn.src, remote: path.src_nic },
            _ => return Err(DetectError::NotAnEnd { conn, me: self.me }),
        };
        if self.conns.contains_key(&conn) {
            return Err(DetectError::DuplicateConn(conn));
        }
        let (src_node, dst_node) = (self.node_of(conn.src)?, self.node_of(conn.dst)?);
        for (nic, expected) in [(path.src_nic, src_node), (path.dst_nic, dst_node)] {
            if nic.node != expected {
                return Err(DetectError::WrongNode { conn, path, nic, expected });
            }
        }
        self.paths.entry(pid).or_insert(PathEntry {
            state: PathState::Healthy,
            progress_deadline: None,
            last_alive: now,
            next_heartbeat: now,
            reprobe_at: None,
            loc: None,
            holddown_until: now,
            flaps: 0,
            recovered_at: None,
        });
        self.conns.insert(conn, pid);
        Ok(())
    }

    /// The health of `path`, if known.
    pub fn path_state(&self, path: &PathId) -> Option<PathState> {
        self.paths.get(path).map(|p| p.state)
    }

    /// Every path this detector tracks, with its state.
    pub fn paths(&self) -> impl Iterator<Item = (&PathId, PathState)> + '_ {
        self.paths.iter().map(|(k, v)| (k, v.state))
    }

    /// The next command for the driver.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The next event for logs and metrics.
    pub fn poll_event(&mut self) -> Option<DetectEvent> {
        self.events.pop_front()
    }

    fn conn_pid(&self, conn: ConnId) -> Result<PathId, DetectError> {
        self.conns.get(&conn).copied().ok_or(DetectError::UnknownConn(conn))
    }

    // ---------------------------------------------------------------- inputs

    /// An immediate error completion on a local data endpoint of `conn`'s path.
    pub fn handle_local_error(&mut self, now: Duration, conn: ConnId) -> Result<(), DetectError> {
        let pid = self.conn_pid(conn)?;
        self.fail_hard(now, pid, FailureCause::LocalError, Some(Observation::LocalError))
    }

    /// A remote timeout or endpoint error on `conn`'s path.
    pub fn handle_remote_error(&mut self, now: Duration, conn: ConnId) -> Result<(), DetectError> {
        let pid = self.conn_pid(conn)?;
        self.fail_hard(now, pid, FailureCause::RemoteError, None)
    }

    /// The kernel reported `nic` (a NIC of this node) down.
    pub fn handle_link_down(&mut self, now: Duration, nic: NicId) -> Result<(), DetectError> {
        self.check_local(nic)?;
        let pids: Vec<PathId> = self.paths.keys().filter(|p| p.local == nic).copied().collect();
        for pid in pids {
            self.fail_hard(now, pid, FailureCause::LinkDown, Some(Observation::LocalError))?;
        }
        Ok(())
    }

    /// The kernel reported `nic` (a NIC of this node) up again.
    pub fn handle_link_up(&mut self, now: Duration, nic: NicId) -> Result<(), DetectError> {
        self.check_local(nic)?;
        let pids: Vec<PathId> = self.paths.keys().filter(|p| p.local == nic).copied().collect();
        for pid in pids {
            self.drive(now, pid, PathEvent::LinkUp)?;
            if let Some(e) = self.paths.get_mut(&pid) {
                if e.state == PathState::Failed && now >= e.holddown_until {
                    e.reprobe_at = Some(now);
                }
            }
        }
        Ok(())
    }

    fn check_local(&self, nic: NicId) -> Result<(), DetectError> {
        if nic.node == self.node {
            Ok(())
        } else {
            Err(DetectError::ForeignNic { nic, node: self.node })
        }
    }

    /// Data was posted on `conn` (or a receive is expected) that should complete within
    /// `expected`; the progress deadline becomes at least `now + expected + progress_margin`.
    pub fn handle_transfer(&mut self, now: Duration, conn: ConnId, expected: Duration) -> Result<(), DetectError> {
        let pid = self.conn_pid(conn)?;
        let margin = self.cfg.progress_margin;
        let e = self.paths.get_mut(&pid).ok_or(DetectError::UnknownPath(pid))?;
        let d = now + expected + margin;
        e.progress_deadline = Some(e.progress_deadline.map_or(d, |old| old.max(d)));
        Ok(())
    }

    /// Progress on `conn` (a send completed, data arrived): its path is alive, and what is
    /// still outstanding should take `remaining` (`None`: nothing outstanding, the path is
    /// idle and gets heartbeats).
    pub fn handle_progress(
        &mut self,
        now: Duration,
        conn: ConnId,
        remaining: Option<Duration>,
    ) -> Result<(), DetectError> {
        let pid = self.conn_pid(conn)?;
        let margin = self.cfg.progress_margin;
        let e = self.paths.get_mut(&pid).ok_or(DetectError::UnknownPath(pid))?;
        e.last_alive = now;
        e.progress_deadline = remaining.map(|r| now + r + margin);
        self.drive(now, pid, PathEvent::Progress)
    }

    /// A heartbeat arrived over `path` (this rank's view of it).
    pub fn handle_heartbeat(&mut self, now: Duration, path: PathId) -> Result<(), DetectError> {
        let e = self.paths.get_mut(&path).ok_or(DetectError::UnknownPath(path))?;
        e.last_alive = now;
        Ok(())
    }

    /// The driver's report of a probe started with [`Command::StartProbe`]. Reports of
    /// probes that already timed out are ignored.
    pub fn handle_probe_result(
        &mut self,
        now: Duration,
        probe: ProbeId,
        result: ProbeResult,
    ) -> Result<(), DetectError> {
        let obs = match result {
            ProbeResult::Answered => Observation::Ok,
            ProbeResult::LocalError => Observation::LocalError,
            ProbeResult::Unacknowledged => Observation::Timeout,
        };
        self.probe_done(now, probe, obs)
    }

    /// An OOB frame from `from`.
    pub fn handle_oob(&mut self, now: Duration, from: Rank, bytes: &[u8]) -> Result<(), DetectError> {
        let msg = OobMessage::decode(bytes).map_err(|source| DetectError::Wire { from, source })?;
        self.handle_message(now, from, msg)
    }

    /// A decoded OOB message from `from`.
    pub fn handle_message(&mut self, now: Duration, from: Rank, msg: OobMessage) -> Result<(), DetectError> {
        match msg {
            OobMessage::ProbeRequest { id, from: nic, to } => {
                self.on_probe_request(now, from, msg, id, nic, to);
                Ok(())
            }
            OobMessage::ProbeReport { id, outcome } => self.on_probe_report(now, from, msg, id, outcome),
        }
    }

    /// The earliest time at which [`Detector::handle_timeout`] has work to do.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let hb_timeout = self.cfg.heartbeat_timeout();
        let retx = self.retx.values().map(|r| r.next_at);
        let probes = self.probes.values().map(|p| p.deadline);
        let locs = self.paths.values().filter_map(|p| p.loc.as_ref().map(|l| l.deadline));
        let paths = self.paths.values().flat_map(|p| {
            let mut t = [None, None, None];
            match p.state {
                PathState::Healthy => match p.progress_deadline {
                    Some(d) => t[0] = Some(d),
                    None => {
                        t[0] = Some(p.last_alive + hb_timeout);
                        t[1] = Some(p.next_heartbeat);
                    }
                },
                PathState::Failed | PathState::Recovering { .. } => t[2] = p.reprobe_at,
                PathState::Suspect | PathState::Probing { .. } => {}
            }
            t.into_iter().flatten()
        });
        retx.chain(probes).chain(locs).chain(paths).min()
    }

    /// Run every timer that is due at `now`.
    pub fn handle_timeout(&mut self, now: Duration) -> Result<(), DetectError> {
        // Retransmissions.
        let due: Vec<u64> = self.retx.iter().filter(|(_, r)| r.next_at <= now).map(|(k, _)| *k).collect();
        for key in due {
            let Some(r) = self.retx.get_mut(&key) else { continue };
            if r.left == 0 {
                let (to, msg) = (r.to, r.msg);
                self.retx.remove(&key);
                self.events.push_back(DetectEvent::OobGaveUp { at: now, to, msg });
                continue;
            }
            r.left -= 1;
            r.next_at = now + r.interval;
            let (to, msg, ask) = (r.to, r.msg, r.ask);
            self.send(to, msg, ask);
        }
        // Probe timeouts.
        let due: Vec<ProbeId> = self.probes.iter().filter(|(_, p)| p.deadline <= now).map(|(k, _)| *k).collect();
        for probe in due {
            self.probe_done(now, probe, Observation::Timeout)?;
        }
        // Localization deadlines.
        let due: Vec<PathId> = self
            .paths
            .iter()
            .filter(|(_, p)| p.loc.as_ref().is_some_and(|l| l.deadline <= now))
            .map(|(k, _)| *k)
            .collect();
        for pid in due {
            self.finish_localization(now, pid)?;
        }
        // Path timers.
        let hb_timeout = self.cfg.heartbeat_timeout();
        let pids: Vec<PathId> = self.paths.keys().copied().collect();
        for pid in pids {
            let Some(p) = self.paths.get(&pid) else { continue };
            match p.state {
                PathState::Healthy => match p.progress_deadline {
                    Some(d) if d <= now => {
                        self.drive(now, pid, PathEvent::Suspicion(SuspicionCause::ProgressDeadline))?;
                    }
                    Some(_) => {}
                    None => {
                        if p.last_alive + hb_timeout <= now {
                            self.drive(now, pid, PathEvent::Suspicion(SuspicionCause::HeartbeatDeadline))?;
                        } else if p.next_heartbeat <= now {
                            let interval = self.cfg.heartbeat_interval;
                            if let Some(p) = self.paths.get_mut(&pid) {
                                p.next_heartbeat = now + interval;
                            }
                            self.commands.push_back(Command::SendHeartbeat { path: pid });
                        }
                    }
                },
                PathState::Failed | PathState::Recovering { .. } => {
                    if p.reprobe_at.is_some_and(|t| t <= now) {
                        self.drive(now, pid, PathEvent::ReprobeDue)?;
                    }
                }
                PathState::Suspect | PathState::Probing { .. } => {}
            }
        }
        let counts = &mut self.served_by;
        self.served.retain(|(rank, _), (outcome, at)| {
            let keep = *at + REMEMBER > now;
            if let (false, Some(c)) = (keep, counts.get_mut(rank)) {
                c.1 = c.1.saturating_sub(1);
                if outcome.is_none() {
                    c.0 = c.0.saturating_sub(1);
                }
            }
            keep
        });
        counts.retain(|_, c| c.1 > 0);
        Ok(())
    }

    // ---------------------------------------------------------------- path machine

    fn drive(&mut self, now: Duration, pid: PathId, event: PathEvent) -> Result<(), DetectError> {
        let good_needed = self.cfg.good_probes;
        let e = self.paths.get_mut(&pid).ok_or(DetectError::UnknownPath(pid))?;
        let old = e.state;
        let new = step(old, &event, good_needed)?;
        e.state = new;
        if old.kind() == new.kind() {
            return Ok(());
        }
        self.events.push_back(DetectEvent::PathTransition {
            at: now,
            path: pid,
            from: old.kind(),
            to: new.kind(),
            event: event.kind(),
        });
        match (old.kind(), new.kind()) {
            (StateKind::Healthy, StateKind::Suspect) => self.start_localization(now, pid, None),
            (StateKind::Suspect, StateKind::Healthy) => {
                self.cancel_localization(pid);
                let margin = self.cfg.progress_margin;
                if let Some(e) = self.paths.get_mut(&pid) {
                    if e.progress_deadline.is_some_and(|d| d <= now) {
                        e.progress_deadline = Some(now + margin);
                    }
                    e.last_alive = e.last_alive.max(now);
                }
                Ok(())
            }
            (StateKind::Healthy | StateKind::Suspect, StateKind::Failed) => self.on_failed(now, pid),
            (StateKind::Probing | StateKind::Recovering, StateKind::Failed) => {
                let interval = self.cfg.probe_interval;
                if let Some(e) = self.paths.get_mut(&pid) {
                    e.reprobe_at = Some(now + interval);
                }
                self.probes.retain(|_, p| !matches!(p.owner, ProbeOwner::Reprobe(x) if x == pid));
                Ok(())
            }
            (_, StateKind::Probing) => {
                let probe = self.new_probe(now, ProbeOwner::Reprobe(pid));
                if let Some(e) = self.paths.get_mut(&pid) {
                    e.reprobe_at = None;
                }
                self.commands.push_back(Command::StartProbe { probe, from: pid.local, to: pid.remote });
                Ok(())
            }
            (StateKind::Probing, StateKind::Recovering) => {
                let interval = self.cfg.probe_interval;
                if let Some(e) = self.paths.get_mut(&pid) {
                    e.reprobe_at = Some(now + interval);
                }
                Ok(())
            }
            (StateKind::Probing, StateKind::Healthy) => {
                self.on_recovered(now, pid);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn fail_hard(
        &mut self,
        now: Duration,
        pid: PathId,
        cause: FailureCause,
        seed_ab: Option<Observation>,
    ) -> Result<(), DetectError> {
        let was_usable = self.paths.get(&pid).ok_or(DetectError::UnknownPath(pid))?.state.is_usable();
        self.drive(now, pid, PathEvent::HardFailure(cause))?;
        if !was_usable {
            return Ok(());
        }
        let running = self.paths.get(&pid).is_some_and(|e| e.loc.is_some());
        if running {
            if let (Some(seed), Some(loc)) = (seed_ab, self.paths.get_mut(&pid).and_then(|e| e.loc.as_mut())) {
                loc.ab = Some(seed);
            }
            self.check_localization(now, pid)
        } else {
            self.start_localization(now, pid, seed_ab)
        }
    }

    fn on_failed(&mut self, now: Duration, pid: PathId) -> Result<(), DetectError> {
        let window = self.cfg.flap_window;
        let e = self.paths.get_mut(&pid).ok_or(DetectError::UnknownPath(pid))?;
        e.flaps = match e.recovered_at {
            Some(t) if now.saturating_sub(t) <= window => e.flaps.saturating_add(1),
            _ => 0,
        };
        let flaps = e.flaps;
        let holddown = self.cfg.holddown(flaps);
        e.holddown_until = now + holddown;
        e.reprobe_at = Some(now + holddown);
        e.progress_deadline = None;
        self.events.push_back(DetectEvent::HeldDown { at: now, path: pid, holddown, flaps });
        Ok(())
    }

    fn on_recovered(&mut self, now: Duration, pid: PathId) {
        if let Some(e) = self.paths.get_mut(&pid) {
            e.recovered_at = Some(now);
            e.reprobe_at = None;
            e.last_alive = now;
            e.next_heartbeat = now;
            e.progress_deadline = None;
        }
        self.cancel_localization(pid);
        self.commands.push_back(Command::DeclareRecovered { path: pid });
    }

    // ---------------------------------------------------------------- OOB sends

    /// Send `msg` to `to` once (`ask`: as a request to probe).
    fn send(&mut self, to: Rank, msg: OobMessage, ask: bool) {
        self.commands.push_back(if ask { Command::AskProbe { to, msg } } else { Command::SendOob { to, msg } });
    }

    /// Send `msg` to `to` and resend it every `interval` (at most `oob_max_retries` times)
    /// until the answer to request `id` removes it from `retx`.
    fn send_reliable(&mut self, now: Duration, id: u64, to: Rank, msg: OobMessage, ask: bool, interval: Duration) {
        self.send(to, msg, ask);
        let left = self.cfg.oob_max_retries;
        self.retx.insert(id, Retx { to, msg, ask, next_at: now + interval, interval, left });
    }

    // ---------------------------------------------------------------- localization

    fn new_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn new_probe(&mut self, now: Duration, owner: ProbeOwner) -> ProbeId {
        let probe = ProbeId(self.new_id());
        self.probes.insert(probe, ProbeEntry { owner, deadline: now + self.cfg.probe_timeout });
        probe
    }

    /// The helper that probes both ends of a path to `remote`: a member on neither end's node,
    /// picked by the pair of nodes, so that the paths of one lost NIC (every peer's, under an
    /// AlltoAll) spread their requests over the helpers instead of all asking the first member.
    fn aux_for(&self, remote: NicId) -> Option<Member> {
        let helpers: Vec<&Member> =
            self.members.iter().filter(|m| m.node != self.node && m.node != remote.node).collect();
        let pair = u64::from(self.node.0).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(remote.node.0);
        let at = usize::try_from(pair % helpers.len().max(1) as u64).unwrap_or(0);
        helpers.get(at).map(|m| **m)
    }

    fn start_localization(
        &mut self,
        now: Duration,
        pid: PathId,
        seed_ab: Option<Observation>,
    ) -> Result<(), DetectError> {
        let mut loc = Localization {
            ab: seed_ab,
            ba: None,
            aux: None,
            deadline: now + self.cfg.localize_timeout,
            probe: None,
            requests: Vec::new(),
        };
        if seed_ab != Some(Observation::LocalError) {
            if seed_ab.is_none() {
                let probe = self.new_probe(now, ProbeOwner::Localize(pid));
                loc.probe = Some(probe);
                self.commands.push_back(Command::StartProbe { probe, from: pid.local, to: pid.remote });
            }
            let mut asks = vec![(pid.peer, pid.remote, pid.local, Slot::Ba)];
            if let Some(aux) = self.aux_for(pid.remote) {
                loc.aux = Some((None, None));
                asks.push((aux.rank, NicId { node: aux.node, rail: pid.local.rail }, pid.local, Slot::AuxA));
                asks.push((aux.rank, NicId { node: aux.node, rail: pid.remote.rail }, pid.remote, Slot::AuxB));
            }
            for (rank, from, to, slot) in asks {
                let id = self.new_id();
                self.requests.insert(id, (pid, slot));
                loc.requests.push(id);
                let msg = OobMessage::ProbeRequest { id, from, to };
                self.send_reliable(now, id, rank, msg, true, self.cfg.oob_retry);
            }
        }
        if let Some(e) = self.paths.get_mut(&pid) {
            e.loc = Some(loc);
        }
        self.check_localization(now, pid)
    }

    fn cancel_localization(&mut self, pid: PathId) {
        let Some(loc) = self.paths.get_mut(&pid).and_then(|e| e.loc.take()) else { return };
        if let Some(p) = loc.probe {
            self.probes.remove(&p);
        }
        for id in loc.requests {
            self.requests.remove(&id);
            self.retx.remove(&id);
        }
    }

    fn check_localization(&mut self, now: Duration, pid: PathId) -> Result<(), DetectError> {
        let Some(loc) = self.paths.get(&pid).and_then(|e| e.loc.as_ref()) else { return Ok(()) };
        let decisive = loc.ab == Some(Observation::LocalError) || loc.ba == Some(Observation::LocalError);
        let complete = loc.ab.is_some() && loc.ba.is_some() && loc.aux.is_none_or(|(x, y)| x.is_some() && y.is_some());
        if decisive || complete {
            self.finish_localization(now, pid)?;
        }
        Ok(())
    }

    fn finish_localization(&mut self, now: Duration, pid: PathId) -> Result<(), DetectError> {
        let Some(loc) = self.paths.get(&pid).and_then(|e| e.loc.clone()) else { return Ok(()) };
        self.cancel_localization(pid);
        let unknown = |o: Option<Observation>| o.unwrap_or(Observation::Unknown);
        let observations = Observations {
            ab: unknown(loc.ab),
            ba: unknown(loc.ba),
            aux: loc.aux.map(|(x, y)| (unknown(x), unknown(y))),
        };
        let (verdict, method) = localize(pid.local, pid.remote, &observations);
        self.events.push_back(DetectEvent::Localized { at: now, path: pid, verdict, method, observations });
        if verdict != Verdict::Transient {
            self.commands.push_back(Command::DeclareFailed { path: pid, verdict, method });
        }
        self.drive(now, pid, PathEvent::Localized(verdict))?;
        // A blamed NIC fails every other usable path through it, with the same verdict.
        let blamed: Vec<PathId> = self
            .paths
            .iter()
            .filter(|(p, e)| {
                **p != pid
                    && e.state.is_usable()
                    && match verdict {
                        Verdict::LocalNic(n) => p.local == n,
                        Verdict::RemoteNic(n) => p.remote == n,
                        Verdict::Link { .. } | Verdict::Transient => false,
                    }
            })
            .map(|(p, _)| *p)
            .collect();
        for other in blamed {
            self.cancel_localization(other);
            self.commands.push_back(Command::DeclareFailed { path: other, verdict, method });
            self.drive(now, other, PathEvent::HardFailure(FailureCause::NicBlamed))?;
        }
        Ok(())
    }

    fn probe_done(&mut self, now: Duration, probe: ProbeId, obs: Observation) -> Result<(), DetectError> {
        let Some(entry) = self.probes.remove(&probe) else { return Ok(()) };
        match entry.owner {
            ProbeOwner::Localize(pid) => {
                if let Some(loc) = self.paths.get_mut(&pid).and_then(|e| e.loc.as_mut()) {
                    if loc.probe == Some(probe) {
                        loc.ab = Some(obs);
                    }
                }
                self.check_localization(now, pid)
            }
            ProbeOwner::Reprobe(pid) => {
                let probing = self.paths.get(&pid).is_some_and(|e| matches!(e.state, PathState::Probing { .. }));
                if !probing {
                    return Ok(());
                }
                let ev = if obs == Observation::Ok { PathEvent::ProbeOk } else { PathEvent::ProbeFailed };
                self.drive(now, pid, ev)
            }
            ProbeOwner::Serve { rank, id } => {
                if let Some(s) = self.served.get_mut(&(rank, id)) {
                    if s.0.is_none() {
                        if let Some(c) = self.served_by.get_mut(&rank) {
                            c.0 = c.0.saturating_sub(1);
                        }
                    }
                    s.0 = Some(obs);
                }
                self.send(rank, OobMessage::ProbeReport { id, outcome: obs }, false);
                Ok(())
            }
        }
    }

    fn on_probe_request(&mut self, now: Duration, from: Rank, msg: OobMessage, id: u64, nic: NicId, to: NicId) {
        if nic.node != self.node {
            self.events.push_back(DetectEvent::Rejected {
                at: now,
                from,
                msg,
                why: "probe source NIC not on this node",
            });
            return;
        }
        if !self.served.contains_key(&(from, id)) {
            // A rank asks for two probes per localization it runs, each answered within the probe
            // timeout: more than the bounds is a rank this one will not be flooded by.
            let (open, all) = self.served_by.get(&from).copied().unwrap_or((0, 0));
            if open >= MAX_OPEN_REQUESTS || all >= MAX_REMEMBERED_REQUESTS {
                let why = "too many probe requests from one rank";
                self.events.push_back(DetectEvent::Rejected { at: now, from, msg, why });
                return;
            }
        }
        match self.served.get(&(from, id)) {
            Some((Some(outcome), _)) => {
                let outcome = *outcome;
                self.send(from, OobMessage::ProbeReport { id, outcome }, false);
            }
            Some((None, _)) => {}
            None => {
                self.served.insert((from, id), (None, now));
                let c = self.served_by.entry(from).or_default();
                *c = (c.0 + 1, c.1 + 1);
                let probe = self.new_probe(now, ProbeOwner::Serve { rank: from, id });
                self.commands.push_back(Command::StartProbe { probe, from: nic, to });
            }
        }
    }

    fn on_probe_report(
        &mut self,
        now: Duration,
        from: Rank,
        msg: OobMessage,
        id: u64,
        outcome: Observation,
    ) -> Result<(), DetectError> {
        let Some((pid, slot)) = self.requests.remove(&id) else {
            self.events.push_back(DetectEvent::StaleIgnored { at: now, from, msg });
            return Ok(());
        };
        self.retx.remove(&id);
        if let Some(loc) = self.paths.get_mut(&pid).and_then(|e| e.loc.as_mut()) {
            // An auxiliary node whose own NIC fails cannot tell anything about a or b.
            let aux_obs = if outcome == Observation::LocalError { Observation::Unknown } else { outcome };
            match (slot, loc.aux.as_mut()) {
                (Slot::Ba, _) => loc.ba = Some(outcome),
                (Slot::AuxA, Some(aux)) => aux.0 = Some(aux_obs),
                (Slot::AuxB, Some(aux)) => aux.1 = Some(aux_obs),
                (_, None) => {}
            }
        }
        self.check_localization(now, pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helpers_of_one_nodes_paths_are_spread_over_the_other_nodes() {
        // 64 nodes: node 0's paths to the 63 others, as when one of its NICs is lost under an
        // AlltoAll. Each helper is on neither end's node, and no helper gets more than a few.
        let members: Vec<Member> = (0..64).map(|r| Member { rank: Rank(r), node: NodeId(r) }).collect();
        let det = Detector::new(DetectConfig::default(), Rank(0), &members).unwrap_or_else(|e| panic!("{e}"));
        let mut asked = BTreeMap::<Rank, usize>::new();
        for remote in 1..64 {
            let aux = det.aux_for(NicId::new(remote, 0)).unwrap_or_else(|| panic!("a helper for node {remote}"));
            assert!(aux.node != NodeId(0) && aux.node != NodeId(remote), "{aux:?} for node {remote}");
            *asked.entry(aux.rank).or_default() += 1;
        }
        let most = asked.values().max().copied().unwrap_or(0);
        assert!(asked.len() >= 32 && most <= 4, "helpers asked: {asked:?}");
        // Three nodes: the one left is the helper.
        let det = Detector::new(DetectConfig::default(), Rank(0), &members[..3]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(det.aux_for(NicId::new(1, 0)).map(|m| m.rank), Some(Rank(2)));
    }
}
