//! A deterministic test driver: sessions of every rank over one [`MemFabric`], with an instant
//! control plane standing in for `r2ccl-detect` and the OOB channel; migrations run the real
//! protocol ([`crate::migrate`]) with its messages delivered at once.
//!
//! Each [`Harness::step`] drives every session at the current simulated time, then plays the
//! control plane: path failures are told to the peer (bilateral awareness), local link changes
//! are broadcast, paths whose sends made no progress for `stall_timeout` are marked down, down
//! paths are probed every `probe_interval` and marked up when a probe answers, lanes that need
//! a migration go through the sender's [`Migrations`] and the receiver's [`Receiver`] (boundary
//! `min(sender_done, receiver held)`, the first usable path of their backup chain; a lane with no
//! usable path waits in the machine), and lanes offered a better path are moved back (fail-back). Every
//! migration is recorded with a check that the receiver really holds the bytes below the
//! boundary. The clock then jumps to the next thing that can happen.

use crate::migrate::{MigrateConfig, MigrateOutput, Migrations, Receiver, ReqOutcome};
use crate::{
    Buffer, FabricConfig, LaneId, MemFabric, MemHandle, MoveReason, PathFault, PathId, Session, SessionConfig,
    SessionError, SessionEvent, Topology, TopologyError, TransferKey, Transport, TransportError,
};
use r2ccl_core::Rank;
use std::collections::BTreeMap;
use std::time::Duration;

/// Timing of the stand-in control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HarnessConfig {
    /// Session tunables (the same on every rank).
    pub session: SessionConfig,
    /// A path with outstanding sends and no completion for this long is marked down.
    pub stall_timeout: Duration,
    /// How often a down path is probed.
    pub probe_interval: Duration,
    /// How long a probe may stay unanswered before another is sent.
    pub probe_timeout: Duration,
    /// The longest clock jump when nothing is scheduled.
    pub max_step: Duration,
    /// NUMA groups per node for the backup chains.
    pub numa_groups: u16,
}

impl Default for HarnessConfig {
    fn default() -> Self {
        Self {
            session: SessionConfig::default(),
            stall_timeout: Duration::from_millis(20),
            probe_interval: Duration::from_millis(10),
            probe_timeout: Duration::from_millis(5),
            max_step: Duration::from_millis(1),
            numa_groups: 1,
        }
    }
}

/// Why the harness stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HarnessError {
    /// A session refused a call the control plane made (an invariant was violated).
    #[error("session of {rank}: {source}")]
    Session {
        /// The rank.
        rank: Rank,
        /// The refusal.
        source: SessionError,
    },
    /// The fabric refused a call.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The migration machine was fed an event its table does not allow.
    #[error(transparent)]
    Migrate(#[from] crate::migrate::IllegalMigration),
    /// The topology could not be built.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The transfers did not finish in time.
    #[error("transfers unfinished at {now:?}: {unfinished} left, {pending} migrations waiting for a path")]
    Stuck {
        /// Simulated time.
        now: Duration,
        /// Transfers not yet received.
        unfinished: usize,
        /// Migrations without a usable path.
        pending: usize,
    },
    /// A transfer's destination differs from its source after completion.
    #[error("transfer {key} arrived corrupted: first difference at byte {at}")]
    Corrupt {
        /// The transfer.
        key: TransferKey,
        /// First differing byte.
        at: usize,
    },
}

/// One migration the control plane carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrationRecord {
    /// When.
    pub at: Duration,
    /// The lane.
    pub lane: LaneId,
    /// From which path.
    pub from: PathId,
    /// To which path.
    pub to: PathId,
    /// Why.
    pub reason: MoveReason,
    /// The sender's completed prefix.
    pub sender_done: u32,
    /// What the receiver held.
    pub held: u32,
    /// The agreed boundary.
    pub boundary: u32,
    /// Whether the receiver's bytes below the boundary equal the source.
    pub prefix_exact: bool,
}

#[derive(Debug)]
struct Xfer {
    data: Vec<u8>,
    dst: MemHandle,
    received: bool,
}

/// Sessions of all ranks over one fabric, with an instant control plane.
#[derive(Debug)]
pub struct Harness {
    fabric: MemFabric,
    sessions: Vec<Session>,
    cfg: HarnessConfig,
    now: Duration,
    /// The migration protocol per rank: sender side, receiver side.
    migrations: Vec<Migrations>,
    receivers: Vec<Receiver>,
    /// What each receiver held when it applied (lane, epoch), and whether its prefix was exact.
    agreed: BTreeMap<(LaneId, u32), (u32, bool)>,
    probes: BTreeMap<(Rank, PathId), Duration>,
    xfers: BTreeMap<TransferKey, Xfer>,
    records: Vec<MigrationRecord>,
    bad_chunks: usize,
    paused: BTreeMap<Rank, (Duration, Duration)>,
}

/// The key every harness session tags chunk headers with (the harness has no job secret).
pub const HARNESS_KEY: crate::HeaderKey = crate::HeaderKey::from_bytes([0x5a; 32]);

fn serr(rank: Rank) -> impl FnOnce(SessionError) -> HarnessError {
    move |source| HarnessError::Session { rank, source }
}

impl Harness {
    /// A fabric of `fabric` shape with one session per rank; backup chains from
    /// [`Topology::uniform`] with `cfg.numa_groups` groups.
    pub fn new(fabric: FabricConfig, cfg: HarnessConfig) -> Result<Self, HarnessError> {
        let topo = Topology::uniform(fabric.nodes, fabric.ranks_per_node, fabric.nics_per_node, cfg.numa_groups)?;
        let sessions = (0..fabric.nodes * fabric.ranks_per_node)
            .map(|r| Session::new(Rank(r), cfg.session, topo.clone(), &HARNESS_KEY).map_err(serr(Rank(r))))
            .collect::<Result<Vec<_>, _>>()?;
        // Messages are delivered at once, so nothing is resent; a lane waits for a path as long
        // as the run lasts (`run`'s limit reports it as stuck).
        let migrate = MigrateConfig { retry: cfg.probe_interval, no_path_timeout: Duration::from_secs(86_400) };
        Ok(Self {
            fabric: MemFabric::new(fabric),
            migrations: sessions.iter().map(|_| Migrations::new(migrate)).collect(),
            receivers: sessions.iter().map(|_| Receiver::new()).collect(),
            agreed: BTreeMap::new(),
            sessions,
            cfg,
            now: Duration::ZERO,
            probes: BTreeMap::new(),
            xfers: BTreeMap::new(),
            records: Vec::new(),
            bad_chunks: 0,
            paused: BTreeMap::new(),
        })
    }

    /// The simulated time.
    pub const fn now(&self) -> Duration {
        self.now
    }

    /// The fabric (to schedule faults or inject messages).
    pub fn fabric_mut(&mut self) -> &mut MemFabric {
        &mut self.fabric
    }

    /// The fabric.
    pub const fn fabric(&self) -> &MemFabric {
        &self.fabric
    }

    /// The session of `rank`.
    pub fn session(&self, rank: Rank) -> Option<&Session> {
        self.sessions.get(rank.index())
    }

    /// Every session.
    pub fn sessions(&self) -> &[Session] {
        &self.sessions
    }

    /// The migrations carried out so far.
    pub fn records(&self) -> &[MigrationRecord] {
        &self.records
    }

    /// How many refused chunks the sessions reported.
    pub const fn bad_chunks(&self) -> usize {
        self.bad_chunks
    }

    /// Does not drive `rank`'s session from `from` until `until` (a descheduled process): its
    /// arrived chunks wait in the NIC's inbox meanwhile.
    pub fn pause(&mut self, rank: Rank, from: Duration, until: Duration) {
        self.paused.insert(rank, (from, until));
    }

    /// Opens communicator `comm` on every session.
    pub fn open_comm(&mut self, comm: crate::CommId) {
        for s in &mut self.sessions {
            s.open_comm(comm);
        }
    }

    /// Starts transfer `key` of `data` (weights per NIC of the sender; `None`: equal).
    pub fn start_transfer(
        &mut self,
        key: TransferKey,
        data: Vec<u8>,
        weights: Option<&[u32]>,
    ) -> Result<(), HarnessError> {
        let now = self.now;
        let len = data.len() as u64;
        let src = {
            let mut port = self.fabric.port(key.src)?;
            let h = port.register(data.len())?;
            port.region_mut(h)?.copy_from_slice(&data);
            h
        };
        let dst = {
            let mut port = self.fabric.port(key.dst)?;
            let h = port.register(data.len())?;
            let s = self.sessions.get_mut(key.dst.index()).ok_or(TransportError::UnknownRank(key.dst))?;
            s.expect_recv(now, &mut port, key, Buffer { region: h, offset: 0, len }).map_err(serr(key.dst))?;
            h
        };
        let port = self.fabric.port(key.src)?;
        let s = self.sessions.get_mut(key.src.index()).ok_or(TransportError::UnknownRank(key.src))?;
        let equal = vec![1; port.local_nics().len()];
        s.start_send(now, &port, key, Buffer { region: src, offset: 0, len }, weights.unwrap_or(&equal))
            .map_err(serr(key.src))?;
        self.xfers.insert(key, Xfer { data, dst, received: false });
        Ok(())
    }

    /// Transfers not yet received completely.
    pub fn unfinished(&self) -> usize {
        self.xfers.values().filter(|x| !x.received).count()
    }

    /// Runs until every transfer is received or the simulated clock passes `limit`.
    pub fn run(&mut self, limit: Duration) -> Result<(), HarnessError> {
        while self.unfinished() > 0 {
            if self.now > limit {
                return Err(HarnessError::Stuck {
                    now: self.now,
                    unfinished: self.unfinished(),
                    pending: self.migrations.iter().map(|m| m.pending().count()).sum(),
                });
            }
            self.step()?;
        }
        Ok(())
    }

    /// Runs until the simulated clock reaches `until`.
    pub fn run_until(&mut self, until: Duration) -> Result<(), HarnessError> {
        while self.now < until {
            self.step()?;
        }
        Ok(())
    }

    /// Checks every received transfer bit for bit against its source.
    pub fn verify(&self) -> Result<(), HarnessError> {
        for (&key, x) in &self.xfers {
            let port_rank = key.dst;
            let got = self.region(port_rank, x.dst)?;
            if let Some(at) = got.iter().zip(&x.data).position(|(a, b)| a != b) {
                return Err(HarnessError::Corrupt { key, at });
            }
        }
        Ok(())
    }

    fn region(&self, rank: Rank, h: MemHandle) -> Result<&[u8], HarnessError> {
        // A port needs `&mut`; read the region through a shared helper instead.
        self.fabric.region(rank, h).map_err(HarnessError::from)
    }

    /// One round: drive every session, play the control plane, advance the clock.
    pub fn step(&mut self) -> Result<(), HarnessError> {
        let now = self.now;
        self.drive_all(now)?;
        self.control(now)?;
        self.drive_all(now)?;
        self.control(now)?;
        let mut next = now + self.cfg.max_step;
        if let Some(t) = self.fabric.next_event_time() {
            next = next.min(t);
        }
        for s in &self.sessions {
            for a in s.path_activity() {
                next = next.min(a.since + self.cfg.stall_timeout);
            }
        }
        self.fabric.advance(now);
        self.now = next.max(now + Duration::from_nanos(1));
        Ok(())
    }

    fn drive_all(&mut self, now: Duration) -> Result<(), HarnessError> {
        for (r, s) in self.sessions.iter_mut().enumerate() {
            let rank = Rank(u32::try_from(r).unwrap_or(u32::MAX));
            if self.paused.get(&rank).is_some_and(|&(from, until)| from <= now && now < until) {
                continue;
            }
            let mut port = self.fabric.port(rank)?;
            s.drive(now, &mut port);
        }
        Ok(())
    }

    fn control(&mut self, now: Duration) -> Result<(), HarnessError> {
        // Events, until every session is quiet (forwarding is idempotent, so this ends).
        loop {
            let mut any = false;
            for r in 0..self.sessions.len() {
                while let Some(ev) = self.sessions[r].poll_event() {
                    any = true;
                    self.on_event(now, Rank(u32::try_from(r).unwrap_or(u32::MAX)), ev)?;
                }
            }
            if !any {
                break;
            }
        }
        // Stall detection.
        for r in 0..self.sessions.len() {
            let rank = Rank(u32::try_from(r).unwrap_or(u32::MAX));
            let stalled: Vec<PathId> = self.sessions[r]
                .path_activity()
                .into_iter()
                .filter(|a| now >= a.since + self.cfg.stall_timeout)
                .map(|a| a.path)
                .collect();
            for p in stalled {
                let mut port = self.fabric.port(rank)?;
                self.sessions[r].handle_path_down(now, &mut port, p, PathFault::Timeout);
            }
        }
        // Re-probing of down paths.
        for r in 0..self.sessions.len() {
            let rank = Rank(u32::try_from(r).unwrap_or(u32::MAX));
            for p in self.sessions[r].down_paths() {
                if self.sessions[r].is_nic_down(p.local) {
                    continue;
                }
                let due = self.probes.get(&(rank, p)).is_none_or(|&t| now >= t);
                if due {
                    let mut port = self.fabric.port(rank)?;
                    self.sessions[r].probe(now, &mut port, p).map_err(serr(rank))?;
                    self.probes.insert((rank, p), now + self.cfg.probe_interval.max(self.cfg.probe_timeout));
                }
            }
        }
        // Migrations waiting for a path, then the protocol's messages.
        for r in 0..self.sessions.len() {
            let session = &self.sessions[r];
            self.migrations[r].handle_timeout(now, |req| session.choose_path(req.lane))?;
        }
        self.pump(now)
    }

    fn on_event(&mut self, now: Duration, rank: Rank, ev: SessionEvent) -> Result<(), HarnessError> {
        match ev {
            SessionEvent::SendComplete(_) => {}
            SessionEvent::RecvComplete(key) => {
                if let Some(x) = self.xfers.get_mut(&key) {
                    x.received = true;
                }
                if let Some(m) = self.migrations.get_mut(key.src.index()) {
                    m.handle_released(now, key)?;
                }
                if let Some(r) = self.receivers.get_mut(key.dst.index()) {
                    r.release(key);
                }
                if let Some(s) = self.sessions.get_mut(key.src.index()) {
                    s.release_send(key);
                }
                if let Some(s) = self.sessions.get_mut(key.dst.index()) {
                    s.release_recv(key);
                }
            }
            SessionEvent::PathFailed { path, .. } => {
                let peer = path.peer;
                let mut port = self.fabric.port(peer)?;
                if let Some(s) = self.sessions.get_mut(peer.index()) {
                    s.handle_path_down(now, &mut port, path.mirror(rank), PathFault::Reported);
                }
            }
            SessionEvent::LocalNic { nic, up } => {
                for r in 0..self.sessions.len() {
                    let other = Rank(u32::try_from(r).unwrap_or(u32::MAX));
                    if other == rank {
                        continue;
                    }
                    if up {
                        self.sessions[r].handle_nic_up(now, nic);
                    } else {
                        let mut port = self.fabric.port(other)?;
                        self.sessions[r].handle_nic_down(now, &mut port, nic);
                    }
                }
            }
            // The machine takes the lane now; its messages go once the events are handled (the end
            // of `control`), so a migration that stops a lane again waits for the next round.
            SessionEvent::MigrationNeeded(req) => {
                let path = self.sessions[rank.index()].choose_path(req.lane);
                self.migrations[rank.index()].handle_stopped(now, req, now, path)?;
            }
            SessionEvent::BetterPath { lane, .. } => {
                let mut port = self.fabric.port(rank)?;
                match self.sessions[rank.index()].handle_move(now, &mut port, lane) {
                    Ok(()) | Err(SessionError::LaneNotActive(_) | SessionError::UnknownLane(_)) => {}
                    Err(e) => return Err(serr(rank)(e)),
                }
            }
            SessionEvent::ProbeDone { path, ok, .. } => {
                self.probes.remove(&(rank, path));
                if ok {
                    self.sessions[rank.index()].handle_path_up(now, path);
                    if let Some(s) = self.sessions.get_mut(path.peer.index()) {
                        s.handle_path_up(now, path.mirror(rank));
                    }
                }
            }
            SessionEvent::BadChunk { .. } => self.bad_chunks += 1,
        }
        Ok(())
    }

    /// Delivers the migration protocol's messages at once and carries out its decisions, until
    /// no rank has anything left to send or apply.
    fn pump(&mut self, now: Duration) -> Result<(), HarnessError> {
        loop {
            let mut busy = false;
            for r in 0..self.sessions.len() {
                let rank = Rank(u32::try_from(r).unwrap_or(u32::MAX));
                while let Some((dst, req)) = self.migrations[r].poll_transmit() {
                    busy = true;
                    let key = req.lane.transfer;
                    let held = match self.sessions[dst.index()].held(key, req.start, req.end) {
                        Ok(h) => Some(h),
                        Err(SessionError::UnknownTransfer(_)) => None,
                        Err(e) => return Err(serr(dst)(e)),
                    };
                    let ack = match self.receivers[dst.index()].handle_req(&req, held) {
                        ReqOutcome::Apply(ack) => {
                            let prefix_exact = self.prefix_exact(key, req.start, ack.boundary)?;
                            self.sessions[dst.index()]
                                .handle_peer_migrate(
                                    now,
                                    key,
                                    req.start,
                                    req.end,
                                    req.receiver_path(rank),
                                    ack.boundary,
                                )
                                .map_err(serr(dst))?;
                            self.agreed.insert((req.lane, req.epoch), (held.unwrap_or(req.start), prefix_exact));
                            ack
                        }
                        ReqOutcome::AckOnly(ack) => ack,
                        ReqOutcome::Stale => continue,
                    };
                    self.migrations[r].handle_ack(now, dst, ack)?;
                }
                while let Some(out) = self.migrations[r].poll_output() {
                    busy = true;
                    let MigrateOutput::Apply { req, to, boundary, stopped_at } = out else { continue };
                    match self.sessions[r].handle_migrate(now, req.lane, to, boundary) {
                        Ok(()) => {
                            let epoch = self.migrations[r].epoch(req.lane);
                            let (held, prefix_exact) =
                                self.agreed.remove(&(req.lane, epoch)).unwrap_or((boundary, true));
                            self.records.push(MigrationRecord {
                                at: now,
                                lane: req.lane,
                                from: req.from,
                                to,
                                reason: req.reason,
                                sender_done: req.sender_done,
                                held,
                                boundary,
                                prefix_exact,
                            });
                        }
                        Err(SessionError::PathDown(_)) => {
                            let path = self.sessions[r].choose_path(req.lane);
                            self.migrations[r].handle_stopped(now, req, stopped_at, path)?;
                        }
                        Err(e) => return Err(serr(rank)(e)),
                    }
                }
            }
            if !busy {
                return Ok(());
            }
        }
    }

    fn prefix_exact(&self, key: TransferKey, start: u32, boundary: u32) -> Result<bool, HarnessError> {
        let Some(x) = self.xfers.get(&key) else { return Ok(true) };
        let nics = self
            .sessions
            .first()
            .and_then(|s| s.topology().node_of(key.src).map(|n| s.topology().nics_of(n).len()))
            .unwrap_or(1);
        let cs = crate::session::transfer_chunk_size(self.cfg.session.chunk_size, x.data.len() as u64, nics) as usize;
        let a = (start as usize * cs).min(x.data.len());
        let b = (boundary as usize * cs).min(x.data.len());
        let got = self.region(key.dst, x.dst)?;
        Ok(got.get(a..b) == x.data.get(a..b))
    }
}
