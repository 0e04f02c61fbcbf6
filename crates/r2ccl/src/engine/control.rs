//! Driving the engine: transport events, stall and evidence checks, the detector's commands and
//! verdicts, lead-rank blame, and carrying the lane migration protocol (`r2ccl_transport::migrate`).

use super::*;

impl Engine {
    /// Make progress: drive the transport, react to its events, run timers (stall
    /// detection, probes, migration resends) and start steps that became ready.
    pub fn drive<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) -> Result<(), EngineError> {
        self.session.drive(now, t);
        self.process_session_events(now, t)?;
        // Progress deadline: a stalled path is first probed (a slow peer answers, a black hole
        // does not); only an unanswered probe declares it failed.
        let activity = self.session.path_activity();
        // A path whose sends make no progress at all for much longer, although its probes are
        // answered, has lost something (the peer gave the path up without telling us, say): it
        // is declared failed all the same, so that its lanes replay elsewhere instead of waiting
        // forever.
        let hard = self.hard_stall_limit();
        let lost: Vec<PathId> = activity.iter().filter(|a| now >= a.since + hard).map(|a| a.path).collect();
        let stalled: Vec<PathId> = activity
            .into_iter()
            .chain(self.session.awaiting_receipt())
            .filter(|a| now >= a.since + self.cfg.stall_timeout)
            .map(|a| a.path)
            .filter(|p| !self.suspects.contains_key(p) && self.quiet.get(p).is_none_or(|&q| now >= q))
            .collect();
        for p in lost {
            tracing::warn!(target: subsys::DETECT, rank = %self.rank, path = %p, limit = ?hard, "sends made no progress although probes were answered: path declared failed");
            if self.suspects.remove(&p).is_some() {
                self.abandoned_probes.insert(p);
            }
            self.quiet.remove(&p);
            self.declare_stalled(now, t, p);
        }
        for p in stalled {
            if self.session.is_path_down(p) {
                continue;
            }
            // The kernel may already know: bytes in flight and no acknowledgement for the stall
            // time is a dead path, whatever the peer's process is doing (its kernel would ACK).
            if t.path_evidence(now, p, self.cfg.stall_timeout) == PathEvidence::Silent {
                self.declare_silent(now, t, p);
                continue;
            }
            match self.session.probe(now, t, p) {
                Ok(_) => {
                    tracing::debug!(target: subsys::DETECT, rank = %self.rank, path = %p, "no progress: probing");
                    self.suspects.insert(p, now + self.cfg.probe_timeout);
                }
                Err(_) => self.declare_stalled(now, t, p),
            }
        }
        // While a suspect's probe or a localization probe is out, the kernel's evidence is read
        // every EVIDENCE_INTERVAL: a black hole is then declared (or the localization probe
        // counted as unanswered) as soon as its silence shows, not at the probe's timeout.
        if self.evidence_due(now) {
            self.evidence_at = now + EVIDENCE_INTERVAL;
            let suspects: Vec<PathId> = self.suspects.keys().copied().collect();
            for p in suspects {
                if t.path_evidence(now, p, self.cfg.stall_timeout) == PathEvidence::Silent {
                    self.suspects.remove(&p);
                    self.abandoned_probes.insert(p);
                    self.declare_silent(now, t, p);
                }
            }
            let quiet = self.cfg.stall_timeout;
            let probes: Vec<(RequestId, ProbeId, PathId)> = self
                .detect_reqs
                .iter()
                .filter_map(|(&r, &(w, at))| match w {
                    DetectProbe::Probe(probe, path) if now >= at + quiet => Some((r, probe, path)),
                    _ => None,
                })
                .collect();
            for (req, probe, path) in probes {
                if t.path_evidence(now, path, quiet) == PathEvidence::Silent {
                    tracing::debug!(target: subsys::DETECT, rank = %self.rank, %path, "probe unacknowledged by the peer's kernel: counted as unanswered");
                    self.detect_reqs.remove(&req);
                    let _ = t.cancel(now, req);
                    self.detector.handle_probe_result(now, probe, ProbeResult::Unacknowledged)?;
                }
            }
        }
        let expired: Vec<PathId> = self.suspects.iter().filter(|(_, &d)| now >= d).map(|(&p, _)| p).collect();
        for p in expired {
            self.suspects.remove(&p);
            self.declare_stalled(now, t, p);
        }
        if self.detector.poll_timeout().is_some_and(|d| d <= now) {
            self.detector.handle_timeout(now)?;
        }
        self.run_detector(now, t)?;
        // Probes the detector gave up on (it counts them as timeouts) leave the transport too.
        let limit = self.detector.config().probe_timeout + self.detector.config().heartbeat_timeout();
        let stale: Vec<RequestId> =
            self.detect_reqs.iter().filter(|(_, (_, at))| now >= *at + limit).map(|(r, _)| *r).collect();
        for req in stale {
            self.detect_reqs.remove(&req);
            let _ = t.cancel(now, req);
        }
        let down = self.session.down_paths();
        self.probes.retain(|p, _| down.contains(p));
        for p in down {
            // A path the detector declared failed comes back through its hold-down and
            // consecutive good probes (run_detector), not on the first answer.
            if self.session.is_nic_down(p.local)
                || self.session.is_nic_down(p.remote)
                || self.detector.path_state(&to_detect(p)).is_some_and(|s| !s.is_usable())
            {
                self.probes.remove(&p);
                continue;
            }
            let due = self.probes.get(&p).is_none_or(|&at| now >= at);
            if due {
                self.probes.insert(p, now + self.cfg.probe_interval);
                // A probe that cannot be posted is retried at the next interval.
                let _ = self.session.probe(now, t, p);
            }
        }
        // A lane waiting for a path between nodes that cannot reach each other any more fails now;
        // otherwise the migration machine looks for a path again, resends, or gives up.
        let waiting: Vec<MigrationRequest> = self
            .migrations
            .pending()
            .filter_map(|(_, st)| match st {
                LaneState::WaitingForPath { req, .. } => Some(req),
                _ => None,
            })
            .collect();
        for req in waiting {
            let (a, b) = (req.from.local.node, req.from.remote.node);
            reachable(self.session.topology(), &self.gone_nics(), false, a, b)?;
        }
        let session = &self.session;
        self.migrations.handle_timeout(now, |req| session.choose_path(req.lane))?;
        // Between collectives too: a peer's early chunk implies receipts for lingering sends.
        self.release_implied(now)?;
        self.send_owed_receipts(now, false);
        if let Some(x) = &mut self.exec {
            let deferred = std::mem::take(&mut x.deferred);
            x.ready.extend(deferred);
        }
        self.process_session_events(now, t)?;
        self.advance(now, t)
    }

    /// Have the detector watch the same-rail paths to `peer` (one connection per rail, each on
    /// its one path: the detector judges health only, and lanes move between paths through the
    /// lane migration protocol, `r2ccl_transport::migrate`).
    pub(super) fn watch_peer(&mut self, now: Duration, peer: Rank) {
        if peer == self.rank || !self.watched.insert(peer) {
            return;
        }
        let topo = self.session.topology();
        let (Some(me), Some(them)) = (topo.node_of(self.rank), topo.node_of(peer)) else { return };
        let theirs = topo.nics_of(them);
        for nic in topo.nics_of(me) {
            let Some(&remote) = theirs.iter().find(|n| n.rail == nic.rail) else { continue };
            let conn = ConnId::new(self.rank.0, peer.0, u32::from(nic.rail.0));
            if let Err(e) = self.detector.add_connection(now, conn, PathPair { src_nic: nic, dst_nic: remote }) {
                tracing::debug!(target: subsys::DETECT, rank = %self.rank, %peer, %e, "path not watched");
            }
        }
    }

    /// Tell the detector about a path failure this rank saw itself (a stall confirmed by an
    /// unanswered probe, an endpoint error). Link-state failures arrive as `LocalNic`; failures
    /// a peer reported are that peer's detector's to localize.
    pub(super) fn detect_failure(&mut self, now: Duration, path: PathId, fault: PathFault) {
        if !matches!(fault, PathFault::Timeout | PathFault::Endpoint) {
            return;
        }
        // Only watched same-rail paths, and only once: the detector already localizes a failed one.
        if !self.detector.path_state(&to_detect(path)).is_some_and(|s| s.is_usable()) {
            return;
        }
        let conn = ConnId::new(self.rank.0, path.peer.0, u32::from(path.local.rail.0));
        if let Err(e) = self.detector.handle_remote_error(now, conn) {
            tracing::debug!(target: subsys::DETECT, rank = %self.rank, %path, %e, "failure not fed to the detector");
        }
    }

    /// A rank on `node` other than this one (the other end of a probe to one of its NICs).
    pub(super) fn rank_on(&self, node: NodeId) -> Option<Rank> {
        let topo = self.session.topology();
        (0..self.world).map(Rank).find(|&r| r != self.rank && topo.node_of(r) == Some(node))
    }

    /// Carry out the detector's commands and log its events.
    pub(super) fn run_detector<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T) -> Result<(), EngineError> {
        while let Some(cmd) = self.detector.poll_command() {
            match cmd {
                DetectCommand::SendOob { to, msg } | DetectCommand::AskProbe { to, msg } => {
                    if to != self.rank {
                        let mut frame = vec![FRAME_DETECT];
                        frame.extend(msg.encode());
                        self.outbox.push_back((to, frame));
                    }
                }
                DetectCommand::StartProbe { probe, from, to } => {
                    let Some(peer) = self.rank_on(to.node) else { continue };
                    let path = PathId { local: from, peer, remote: to };
                    match self.session.probe(now, t, path) {
                        Ok(req) => {
                            self.detect_reqs.insert(req, (DetectProbe::Probe(probe, path), now));
                        }
                        Err(_) if self.session.is_nic_down(from) => {
                            self.detector.handle_probe_result(now, probe, ProbeResult::LocalError)?;
                        }
                        // Not posted: the detector counts it as a timeout.
                        Err(_) => {}
                    }
                }
                DetectCommand::SendHeartbeat { path } => {
                    let beat = DetectProbe::Heartbeat(path);
                    if self.detect_reqs.values().all(|(w, _)| *w != beat) {
                        if let Ok(req) = self.session.probe(now, t, from_detect(path)) {
                            self.detect_reqs.insert(req, (beat, now));
                        }
                    }
                }
                DetectCommand::DeclareFailed { path, verdict, method } => {
                    self.on_verdict(now, t, from_detect(path), verdict, method)?;
                }
                DetectCommand::DeclareRecovered { path } => self.on_detector_recovered(now, t, from_detect(path))?,
            }
        }
        while let Some(ev) = self.detector.poll_event() {
            match ev {
                DetectEvent::Localized { path, verdict, method, observations, .. } => {
                    tracing::info!(target: subsys::DETECT, rank = %self.rank, %path, %verdict, ?method, ?observations, "path failure localized");
                }
                DetectEvent::HeldDown { path, holddown, flaps, .. } if flaps > 0 => {
                    tracing::info!(target: subsys::DETECT, rank = %self.rank, %path, ?holddown, flaps, "flapping path held down");
                }
                DetectEvent::Rejected { from, why, .. } => {
                    self.events.push_back(EngineEvent::BadInput { from, what: why.to_owned() });
                }
                other => tracing::trace!(target: subsys::DETECT, rank = %self.rank, event = ?other, "detector"),
            }
        }
        Ok(())
    }

    /// The detector declared `path` failed and blamed `verdict`: the path goes down (if the
    /// stall check had not taken it down already), and a blamed NIC is reported to the lead rank
    /// of its node, which takes it down on every rank.
    pub(super) fn on_verdict<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        path: PathId,
        verdict: Verdict,
        method: Method,
    ) -> Result<(), EngineError> {
        self.verdicts.insert(path, verdict);
        self.events.push_back(EngineEvent::Localized { path, verdict, method, at: now });
        if !self.session.is_path_down(path) {
            self.session.handle_path_down(now, t, path, PathFault::Timeout);
        }
        let (Verdict::LocalNic(nic) | Verdict::RemoteNic(nic)) = verdict else { return Ok(()) };
        self.report_blame(now, t, nic, true)
    }

    /// The lead rank of `node`: the lowest rank on it. It alone announces verdicts on its NICs.
    pub(super) fn lead_of(&self, node: NodeId) -> Option<Rank> {
        let topo = self.session.topology();
        (0..self.world).map(Rank).find(|&r| topo.node_of(r) == Some(node))
    }

    /// Tell the lead rank of `nic`'s node that a verdict blames `nic` (`failed`) or that a path
    /// through it answers again; the lead handles its own reports directly.
    pub(super) fn report_blame<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        nic: NicId,
        failed: bool,
    ) -> Result<(), EngineError> {
        match self.lead_of(nic.node) {
            Some(lead) if lead == self.rank => self.on_blame(now, t, nic, failed),
            Some(lead) => {
                self.send_ctrl(lead, Ctrl::Blame { nic, failed });
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// As the lead rank of `nic`'s node: a verdict blames `nic` (`failed`) or a path through it
    /// answers again. A blamed NIC goes down on every rank (the NicState broadcast) unless it is
    /// the node's last usable one: when every NIC of a node looks dead, the host (busy, or its
    /// process gone) is the likelier culprit, and peer loss is the OOB mesh's to report. A NIC
    /// comes back only if a blame took it down, never one whose link is down.
    pub(super) fn on_blame<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        nic: NicId,
        failed: bool,
    ) -> Result<(), EngineError> {
        if failed {
            if self.down_nics.contains(&nic) {
                return Ok(());
            }
            let others = self.session.topology().nics_of(nic.node);
            if !others.iter().any(|&x| x != nic && !self.down_nics.contains(&x)) {
                tracing::warn!(target: subsys::DETECT, rank = %self.rank, %nic, "verdict blames the last usable NIC of its node: kept (paths fail one by one)");
                return Ok(());
            }
            tracing::warn!(target: subsys::DETECT, rank = %self.rank, %nic, "NIC blamed by localization: taken out on every rank");
            self.blamed.insert(nic);
            self.note_nic(nic, false);
            self.session.handle_nic_down(now, t, nic);
            self.events.push_back(EngineEvent::NicBlamed { nic, up: false });
            for r in 0..self.world {
                self.send_ctrl(Rank(r), Ctrl::NicState { nic, state: NicStatus::Blamed });
            }
            self.check_peers()
        } else {
            if !self.blamed.remove(&nic) {
                return Ok(());
            }
            tracing::info!(target: subsys::DETECT, rank = %self.rank, %nic, "blamed NIC answers again");
            self.put_back(now, nic);
            Ok(())
        }
    }

    /// As the lead rank of `nic`'s node: a NIC a verdict took out carries traffic again, on every
    /// rank (the NicState broadcast). Its paths start afresh.
    pub(super) fn put_back(&mut self, now: Duration, nic: NicId) {
        self.blamed.remove(&nic);
        self.note_nic(nic, true);
        self.forget_path_failures(nic);
        self.session.handle_nic_up(now, nic);
        self.events.push_back(EngineEvent::NicBlamed { nic, up: true });
        for r in 0..self.world {
            self.send_ctrl(Rank(r), Ctrl::NicState { nic, state: NicStatus::Up });
        }
    }

    /// The detector saw enough good probes on `path` after its hold-down: the lead ranks of
    /// its NICs' nodes hear of it (a NIC a verdict took down comes back), and the path carries
    /// traffic again.
    pub(super) fn on_detector_recovered<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        path: PathId,
    ) -> Result<(), EngineError> {
        self.verdicts.remove(&path);
        for nic in [path.local, path.remote] {
            if self.down_nics.contains(&nic) {
                self.report_blame(now, t, nic, false)?;
            }
        }
        if self.session.is_path_down(path)
            && !self.session.is_nic_down(path.local)
            && !self.session.is_nic_down(path.remote)
        {
            self.probes.remove(&path);
            self.notified.remove(&path);
            self.session.handle_path_up(now, path);
            self.send_ctrl(path.peer, Ctrl::PathUp { local: path.local, remote: path.remote });
            self.events.push_back(EngineEvent::PathRecovered { path });
        }
        Ok(())
    }

    pub(super) fn check_reachable(&self, a: NodeId, b: NodeId) -> Result<(), EngineError> {
        reachable(self.session.topology(), &self.down_nics, self.cfg.rail_only, a, b)
    }

    /// Whether the kernel's evidence is to be read now: a suspect's probe or a localization
    /// probe older than the stall time is out, and EVIDENCE_INTERVAL has passed.
    pub(super) fn evidence_due(&self, now: Duration) -> bool {
        now >= self.evidence_at && self.evidence_deadline().is_some_and(|d| now >= d)
    }

    /// When the kernel's evidence is next worth reading (see [`Engine::evidence_due`]).
    pub(super) fn evidence_deadline(&self) -> Option<Duration> {
        let quiet = self.cfg.stall_timeout;
        let probe = self
            .detect_reqs
            .values()
            .filter_map(|&(w, at)| matches!(w, DetectProbe::Probe(..)).then_some(at + quiet))
            .min();
        let suspect = (!self.suspects.is_empty()).then_some(Duration::ZERO);
        [probe, suspect].into_iter().flatten().min().map(|d| d.max(self.evidence_at))
    }

    pub(super) fn declare_silent<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, p: PathId) {
        tracing::warn!(target: subsys::DETECT, rank = %self.rank, path = %p, quiet = ?self.cfg.stall_timeout, "no progress and no TCP acknowledgement of the bytes in flight: path declared failed");
        self.silent_declared += 1;
        self.session.handle_path_down(now, t, p, PathFault::Timeout);
    }

    /// Paths declared failed on the kernel's evidence ([`Transport::path_evidence`]) so far.
    #[cfg(test)]
    pub const fn silent_declared(&self) -> u64 {
        self.silent_declared
    }

    pub(super) fn declare_stalled<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, p: PathId) {
        tracing::warn!(target: subsys::DETECT, rank = %self.rank, path = %p, "no progress and no probe answer: path declared failed");
        self.session.handle_path_down(now, t, p, PathFault::Timeout);
    }

    /// How long a path's sends may make no progress while its probes are answered.
    pub(super) fn hard_stall_limit(&self) -> Duration {
        (self.cfg.stall_timeout * 20).max(Duration::from_secs(2))
    }

    /// The next time [`Engine::drive`] has timer work (stall deadlines, probes, resends).
    pub fn poll_timeout(&self) -> Option<Duration> {
        let activity = self.session.path_activity();
        let hard = activity.iter().map(|a| a.since + self.hard_stall_limit()).min();
        let stall = activity
            .into_iter()
            .chain(self.session.awaiting_receipt())
            // As `drive` filters them: a suspect waits for its probe, a quiet path until then.
            .filter(|a| !self.suspects.contains_key(&a.path))
            .map(|a| {
                let due = a.since + self.cfg.stall_timeout;
                self.quiet.get(&a.path).map_or(due, |&q| due.max(q))
            })
            .min();
        let probe = self.probes.values().chain(self.suspects.values()).copied().min();
        let evidence = self.evidence_deadline();
        // Migration resends and no-path deadlines; just past the no-path deadline of the
        // longest-waiting send.
        let retry = self.migrations.poll_timeout();
        let give_up = self
            .exec
            .iter()
            .flat_map(|x| x.deferred_since.values().copied())
            .min()
            .map(|since| since + self.cfg.no_path_timeout + Duration::from_millis(1));
        [stall, probe, evidence, retry, give_up, hard, self.detector.poll_timeout(), self.receipt_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The session stopped `req.lane` at `stopped_at`: the migration machine takes it, with the
    /// session's choice of a new path.
    pub(super) fn begin_migration(
        &mut self,
        now: Duration,
        req: MigrationRequest,
        stopped_at: Duration,
    ) -> Result<(), EngineError> {
        let path = self.session.choose_path(req.lane);
        self.migrations.handle_stopped(now, req, stopped_at, path)?;
        Ok(())
    }

    /// Send the migration machine's requests and carry out its decisions: an agreed boundary
    /// moves the lane (a new path that failed meanwhile starts the next epoch), a lane that
    /// found no path in time fails the collective. Whether a lane moved.
    pub(super) fn run_migrations(&mut self, now: Duration) -> Result<bool, EngineError> {
        let mut moved = false;
        loop {
            if let Some((to, req)) = self.migrations.poll_transmit() {
                self.send_ctrl(to, Ctrl::MigrateReq(req));
                continue;
            }
            let Some(out) = self.migrations.poll_output() else { return Ok(moved) };
            match out {
                MigrateOutput::Apply { req, to, boundary, stopped_at } => {
                    let id = req.lane;
                    match self.session.handle_migrate(now, id, to, boundary) {
                        Ok(()) => {
                            moved = true;
                            let failback = matches!(req.reason, r2ccl_transport::MoveReason::Failback);
                            let replayed = req.sender_done.saturating_sub(boundary);
                            tracing::info!(
                                target: subsys::NET, rank = %self.rank, lane = %id, from = %req.from, %to,
                                boundary, replayed, failback, "lane migrated"
                            );
                            self.events.push_back(EngineEvent::Migrated {
                                lane: id,
                                from: req.from,
                                to,
                                boundary,
                                replayed,
                                failback,
                                stopped_at,
                                at: now,
                            });
                        }
                        Err(SessionError::PathDown(_)) => self.begin_migration(now, req, stopped_at)?,
                        Err(SessionError::UnknownLane(_) | SessionError::LaneNotQuiesced(_)) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                MigrateOutput::NoPathLeft { req, waited } => {
                    let (a, b) = (req.from.local.node, req.from.remote.node);
                    self.check_reachable(a, b)?;
                    return Err(EngineError::NoPathLeft {
                        what: format!("lane {}", req.lane),
                        peer: req.lane.transfer.dst.0,
                        waited_ms: waited.as_millis() as u64,
                    });
                }
            }
        }
    }

    pub(super) fn process_session_events<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
    ) -> Result<(), EngineError> {
        loop {
            self.process_session_events_once(now, t)?;
            // A migration applied here may have started the lane on its new path.
            if !self.run_migrations(now)? {
                return Ok(());
            }
        }
    }

    fn process_session_events_once<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
    ) -> Result<(), EngineError> {
        while let Some(ev) = self.session.poll_event() {
            match ev {
                SessionEvent::SendComplete(_) => {}
                SessionEvent::RecvComplete(key) => self.on_recv_complete(now, key),
                SessionEvent::PathFailed { path, fault } => {
                    self.detect_failure(now, path, fault);
                    self.events.push_back(EngineEvent::PathFailed { path, fault, at: now });
                    if fault != PathFault::Reported && self.notified.insert(path) {
                        self.send_ctrl(path.peer, Ctrl::PathDown { local: path.local, remote: path.remote });
                    }
                }
                SessionEvent::LocalNic { nic, up } => {
                    let fed = if up {
                        self.detector.handle_link_up(now, nic)
                    } else {
                        self.detector.handle_link_down(now, nic)
                    };
                    if let Err(e) = fed {
                        tracing::debug!(target: subsys::DETECT, rank = %self.rank, %nic, %e, "link state not fed to the detector");
                    }
                    // Its link state rules from now on: a later probe answer must not bring back a
                    // NIC whose link went down while a verdict held it out.
                    if up {
                        self.forget_path_failures(nic);
                    } else {
                        self.blamed.remove(&nic);
                        self.put_back_last_resort(now, nic);
                    }
                    self.events.push_back(EngineEvent::NicState { nic, up, local: true });
                    self.note_nic(nic, up);
                    let state = if up { NicStatus::Up } else { NicStatus::LinkDown };
                    for r in 0..self.world {
                        self.send_ctrl(Rank(r), Ctrl::NicState { nic, state });
                    }
                    // Every local NIC down: a running collective that involves another node can
                    // never finish (even one that only waits to receive), so fail it now.
                    if !up {
                        self.check_peers()?;
                    }
                }
                SessionEvent::MigrationNeeded(req) => {
                    // Only a send still waiting for its receipt: an acknowledged one needs no path.
                    let key = req.lane.transfer;
                    if self.is_lingering(&key) {
                        self.linger.migrated += 1;
                        self.begin_migration(now, req, now)?;
                    } else if self.exec.as_ref().is_some_and(|x| x.unacked.contains(&key)) {
                        self.begin_migration(now, req, now)?;
                    }
                }
                SessionEvent::BetterPath { lane, .. } => match self.session.handle_move(now, t, lane) {
                    Ok(()) | Err(SessionError::LaneNotActive(_) | SessionError::UnknownLane(_)) => {}
                    Err(e) => return Err(e.into()),
                },
                SessionEvent::ProbeDone { path, ok, req } if self.detect_reqs.contains_key(&req) => {
                    let Some((what, _)) = self.detect_reqs.remove(&req) else { continue };
                    let fed = match what {
                        DetectProbe::Probe(probe, _) if ok => {
                            self.detector.handle_probe_result(now, probe, ProbeResult::Answered)
                        }
                        // Only a dead local NIC is a local error; anything else is left to the
                        // detector's probe timeout.
                        DetectProbe::Probe(probe, _) if self.session.is_nic_down(path.local) => {
                            self.detector.handle_probe_result(now, probe, ProbeResult::LocalError)
                        }
                        DetectProbe::Heartbeat(p) if ok => self.detector.handle_heartbeat(now, p),
                        DetectProbe::Probe(..) | DetectProbe::Heartbeat(_) => Ok(()),
                    };
                    if let Err(e) = fed {
                        tracing::debug!(target: subsys::DETECT, rank = %self.rank, %path, %e, "probe result not fed to the detector");
                    }
                }
                SessionEvent::ProbeDone { path, ok, .. } if self.suspects.contains_key(&path) => {
                    self.suspects.remove(&path);
                    if ok {
                        self.quiet.insert(path, now + self.cfg.stall_timeout);
                    } else {
                        self.declare_stalled(now, t, path);
                    }
                }
                SessionEvent::ProbeDone { path, .. } if self.abandoned_probes.remove(&path) => {}
                SessionEvent::ProbeDone { path, ok, .. } => {
                    if ok && self.session.is_path_down(path) {
                        self.probes.remove(&path);
                        self.notified.remove(&path);
                        self.session.handle_path_up(now, path);
                        self.send_ctrl(path.peer, Ctrl::PathUp { local: path.local, remote: path.remote });
                        self.events.push_back(EngineEvent::PathRecovered { path });
                    }
                }
                SessionEvent::BadChunk { path, problem: r2ccl_transport::ChunkProblem::Unexpected(id) } => {
                    // Early and no room to keep it: ask the sender to replay its lane later.
                    tracing::debug!(target: subsys::NET, rank = %self.rank, %path, chunk = id.index, "early chunk dropped; asking for a replay");
                    self.send_ctrl(id.transfer.src, Ctrl::Nack { key: id.transfer, index: id.index });
                }
                SessionEvent::BadChunk {
                    problem: r2ccl_transport::ChunkProblem::ArgsDiffer { seq, from, theirs, mine },
                    ..
                } => {
                    tracing::debug!(target: subsys::NET, rank = %self.rank, seq, %from, theirs, mine, "a peer's arguments differ");
                    self.events.push_back(EngineEvent::ArgsDiffer { seq, from });
                }
                SessionEvent::BadChunk { path, problem } => {
                    tracing::debug!(target: subsys::NET, rank = %self.rank, %path, ?problem, "refused a chunk");
                    self.events.push_back(EngineEvent::BadInput { from: path.peer, what: format!("{problem:?}") });
                }
            }
        }
        Ok(())
    }

    /// Treat `nic` as down from now on without announcing it (every rank already knows: a NIC
    /// that could not be opened at start).
    pub fn mark_nic_down<T: Transport + ?Sized>(&mut self, now: Duration, t: &mut T, nic: NicId) {
        self.down_nics.insert(nic);
        self.session.handle_nic_down(now, t, nic);
    }

    /// `nic` is back: its paths start afresh, so that a later failure of one of them is reported
    /// to the peer again (`notified`) and its stall state is new.
    pub(super) fn forget_path_failures(&mut self, nic: NicId) {
        let through = |p: &PathId| p.local == nic || p.remote == nic;
        self.notified.retain(|p| !through(p));
        self.probes.retain(|p, _| !through(p));
        self.suspects.retain(|p, _| !through(p));
        self.quiet.retain(|p, _| !through(p));
    }

    /// The link of `nic` (of this rank's node) just went down: if that leaves the node only NICs
    /// a verdict took out (their links are up), its lead puts them back, so the node keeps a way
    /// to carry traffic (a verdict never takes a node's last NIC, whichever comes first). Their
    /// paths are tried again; the stall check and the detector judge them afresh.
    pub(super) fn put_back_last_resort(&mut self, now: Duration, nic: NicId) {
        if self.lead_of(nic.node) != Some(self.rank) {
            return;
        }
        let nics = self.session.topology().nics_of(nic.node);
        let others: Vec<NicId> = nics.iter().copied().filter(|&x| x != nic).collect();
        if others.iter().any(|x| !self.down_nics.contains(x)) {
            return;
        }
        let blamed: Vec<NicId> = others.into_iter().filter(|x| self.blamed.contains(x)).collect();
        for x in blamed {
            tracing::warn!(target: subsys::DETECT, rank = %self.rank, nic = %x, down = %nic, "the node's other NIC went down: a blamed NIC is put back as its last");
            self.put_back(now, x);
        }
    }

    pub(super) fn note_nic(&mut self, nic: NicId, up: bool) {
        let changed = if up { self.down_nics.remove(&nic) } else { self.down_nics.insert(nic) };
        self.health_changed |= changed;
    }

    /// Every chunk of `key` landed (reducing receives reduced each chunk as it came).
    pub(super) fn on_recv_complete(&mut self, now: Duration, key: TransferKey) {
        let Some(x) = &self.exec else { return };
        let Some(&i) = x.by_recv.get(&key) else { return };
        let len = match x.sched.steps()[i].kind {
            StepKind::Recv { dst, .. } => dst.len,
            _ => u64::MAX,
        };
        self.session.release_recv(key);
        self.migrate_rx.release(key);
        self.owe_receipt(now, key, len);
        self.complete_step(i);
    }

    /// A control message from `from` (the OOB `Detect` channel).
    pub fn handle_ctrl<T: Transport + ?Sized>(
        &mut self,
        now: Duration,
        t: &mut T,
        from: Rank,
        bytes: &[u8],
    ) -> Result<(), EngineError> {
        let body = match bytes.split_first() {
            Some((&FRAME_CTRL, body)) => body,
            Some((&FRAME_DETECT, body)) => {
                if let Err(e) = self.detector.handle_oob(now, from, body) {
                    self.events.push_back(EngineEvent::BadInput { from, what: e.to_string() });
                }
                self.run_detector(now, t)?;
                self.process_session_events(now, t)?;
                return self.advance(now, t);
            }
            Some((&kind, _)) => {
                let what = format!("control frame of unknown kind {kind:#04x}");
                self.events.push_back(EngineEvent::BadInput { from, what });
                return Ok(());
            }
            None => {
                self.events.push_back(EngineEvent::BadInput { from, what: "empty control frame".into() });
                return Ok(());
            }
        };
        let msg = match Ctrl::decode(body) {
            Ok(m) => m,
            Err(e) => {
                self.events.push_back(EngineEvent::BadInput { from, what: e.to_string() });
                return Ok(());
            }
        };
        if let Some(what) = self.misaddressed(from, &msg) {
            self.events.push_back(EngineEvent::BadInput { from, what });
            return Ok(());
        }
        match msg {
            Ctrl::PathDown { local, remote } => {
                let path = Ctrl::mirrored(local, remote, from);
                self.notified.insert(path);
                self.session.handle_path_down(now, t, path, PathFault::Reported);
            }
            Ctrl::PathUp { local, remote } => {
                let path = Ctrl::mirrored(local, remote, from);
                self.notified.remove(&path);
                self.probes.remove(&path);
                self.session.handle_path_up(now, path);
            }
            Ctrl::NicState { nic, state } => {
                let up = state.is_up();
                if state == NicStatus::Blamed {
                    self.blamed.insert(nic);
                } else {
                    self.blamed.remove(&nic);
                }
                self.events.push_back(EngineEvent::NicState { nic, up, local: false });
                self.note_nic(nic, up);
                if up {
                    self.forget_path_failures(nic);
                    self.session.handle_nic_up(now, nic);
                } else {
                    self.session.handle_nic_down(now, t, nic);
                    self.check_peers()?;
                }
            }
            Ctrl::MigrateReq(req) => {
                let key = req.lane.transfer;
                if key.dst != self.rank || key.src != from {
                    self.events
                        .push_back(EngineEvent::BadInput { from, what: format!("misrouted migration of {key}") });
                    return Ok(());
                }
                let held = match self.session.held(key, req.start, req.end) {
                    Ok(h) => Some(h),
                    Err(SessionError::UnknownTransfer(_)) => None,
                    Err(e) => {
                        self.events.push_back(EngineEvent::BadInput { from, what: e.to_string() });
                        return Ok(());
                    }
                };
                match self.migrate_rx.handle_req(&req, held) {
                    ReqOutcome::Apply(ack) => {
                        let path = req.receiver_path(from);
                        if let Err(e) =
                            self.session.handle_peer_migrate(now, key, req.start, req.end, path, ack.boundary)
                        {
                            tracing::warn!(target: subsys::NET, rank = %self.rank, %key, %e, "peer migration refused");
                        }
                        self.send_ctrl(from, Ctrl::MigrateAck(ack));
                        // A receive already whole (the sender's lane lingered past its
                        // collective, linger.rs) keeps no epoch here: a repeat is applied again,
                        // harmlessly (nothing is missing), and nothing accumulates.
                        if held.is_some_and(|h| h >= req.end) && !self.session.receiving(key) {
                            self.migrate_rx.release(key);
                        }
                    }
                    ReqOutcome::AckOnly(ack) => self.send_ctrl(from, Ctrl::MigrateAck(ack)),
                    ReqOutcome::Stale => {}
                }
            }
            Ctrl::MigrateAck(ack) => {
                if !self.migrations.handle_ack(now, from, ack)? {
                    let what =
                        format!("migration acknowledgement of {} from a rank that does not receive it", ack.lane);
                    self.events.push_back(EngineEvent::BadInput { from, what });
                    return Ok(());
                }
            }
            Ctrl::Blame { nic, failed } => {
                if self.lead_of(nic.node) == Some(self.rank) {
                    self.on_blame(now, t, nic, failed)?;
                } else {
                    self.events.push_back(EngineEvent::BadInput {
                        from,
                        what: format!("verdict on {nic} sent to a rank that does not lead its node"),
                    });
                }
            }
            Ctrl::Nack { key, index } => {
                let pending = self.exec.as_ref().is_some_and(|x| x.unacked.contains(&key)) || self.is_lingering(&key);
                if key.src == self.rank && pending {
                    let lane = self.session.lanes(key).into_iter().find(|l| l.start <= index && index < l.end);
                    if let Some(l) = lane.filter(|l| !l.quiesced) {
                        match self.session.handle_move(now, t, l.id) {
                            Ok(()) | Err(SessionError::LaneNotActive(_) | SessionError::UnknownLane(_)) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
            }
            Ctrl::RecvDone { key } => {
                if key.src != self.rank {
                    return Ok(());
                }
                let known = self.on_receipt(now, key)?;
                // Not a send this rank waits for: one not started yet (kept), or one an implied
                // receipt released already, whose explicit receipt came late (dropped).
                let (current, ahead) = match (&self.exec, self.begun) {
                    (Some(x), _) => (x.seq, key.seq >= x.seq),
                    (None, Some(b)) => (b, key.seq > b),
                    (None, None) => (0, true),
                };
                if !known && ahead {
                    // Kept for a send not started yet: of a collective at most RECEIPTS_AHEAD
                    // ahead, and at most MAX_EARLY_RECEIPTS in all (a peer cannot grow them).
                    if key.seq > current.saturating_add(RECEIPTS_AHEAD)
                        || self.early_receipts.len() >= MAX_EARLY_RECEIPTS
                    {
                        let what = format!("receipt of {key}, a send this rank is far from starting (at #{current})");
                        self.events.push_back(EngineEvent::BadInput { from, what });
                    } else {
                        self.early_receipts.insert(key);
                    }
                }
            }
        }
        self.process_session_events(now, t)?;
        self.advance(now, t)
    }

    /// Why a control message from `from` names something it cannot speak for: a path that is
    /// not between `from`'s node and this rank's, a NIC state not of `from`'s node, a NIC the
    /// topology does not have, or a transfer `from` does not receive. `None` when it is well addressed. Such messages change nothing
    /// (a peer cannot fail a path of another pair, nor grow this rank's state with made-up ids).
    fn misaddressed(&self, from: Rank, msg: &Ctrl) -> Option<String> {
        let topo = self.session.topology();
        let nic_ok = |nic: NicId, rank: Rank| topo.has_nic(nic) && topo.node_of(rank) == Some(nic.node);
        match *msg {
            Ctrl::PathDown { local, remote } | Ctrl::PathUp { local, remote } => (!(nic_ok(local, from)
                && nic_ok(remote, self.rank)))
            .then(|| format!("path {local}=>{remote}, not between rank {} and this rank", from.0)),
            // A rank announces the state of its own node's NICs (the lead's verdicts included).
            Ctrl::NicState { nic, .. } => {
                (!nic_ok(nic, from)).then(|| format!("state of {nic}, not a NIC of rank {}'s node", from.0))
            }
            Ctrl::Blame { nic, .. } => {
                (!topo.has_nic(nic)).then(|| format!("verdict on {nic}, a NIC the topology does not have"))
            }
            Ctrl::Nack { key, .. } | Ctrl::RecvDone { key } => (key.dst != from || key.comm != CommId(self.cfg.comm))
                .then(|| format!("acknowledgement of {key} from rank {}, which does not receive it", from.0)),
            Ctrl::MigrateReq(_) | Ctrl::MigrateAck(_) => None,
        }
    }
}
